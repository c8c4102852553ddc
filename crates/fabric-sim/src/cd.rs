//! A client-driven (Nessie) cluster on the simulated fabric: every node's index, data and
//! page tables, its allocator, and client workers, each on its own simulated thread. The
//! protocol code is the production code, unchanged.

use std::sync::Arc;

use nessie_fabric::NodeId;
use nessie_protocols::cd::{CdClient, ClusterView};
use nessie_protocols::{Error, ProtocolConfig};
use nessie_store::classtable::ClassTable;
use nessie_store::Geometry;

use crate::{Sim, SimEndpoint, SimParams, SimThread};

/// Client workers a node may have (their ids are 16 bits).
pub const MAX_WORKERS_PER_NODE: usize = u16::MAX as usize;

pub struct SimCdCluster {
    sim: Sim,
    view: Arc<ClusterView>,
    tables: Vec<Arc<ClassTable>>,
    cfg: ProtocolConfig,
    workers: Vec<usize>,
}

impl SimCdCluster {
    /// A cluster of `geometry.nodes` nodes on hardware `params`, scheduled with `seed`.
    pub fn new(
        params: SimParams,
        seed: u64,
        geometry: Geometry,
        cfg: ProtocolConfig,
    ) -> Result<Self, Error> {
        cfg.validate()?;
        let view = Arc::new(ClusterView::new(geometry)?);
        let g = &view.geometry;
        let regions = vec![g.table_regions(); g.nodes as usize];
        let sim = Sim::new(params, seed, &regions).map_err(|e| Error::Config(e.to_string()))?;
        let tables = (0..g.nodes)
            .map(|n| Arc::new(view.class_table(n as NodeId, cfg.clock_margin_ns)))
            .collect();
        Ok(Self {
            workers: vec![0; g.nodes as usize],
            sim,
            view,
            tables,
            cfg,
        })
    }

    /// A new client worker on `node` with its own configuration, and the simulated thread
    /// it must run on ([`Sim::spawn`]).
    pub fn client_with(
        &mut self,
        node: NodeId,
        cfg: ProtocolConfig,
    ) -> Result<(CdClient<SimEndpoint>, SimThread), Error> {
        let table = self
            .tables
            .get(node as usize)
            .ok_or_else(|| Error::Config(format!("no node {node}")))?
            .clone();
        let worker = self.workers[node as usize];
        if worker >= MAX_WORKERS_PER_NODE {
            return Err(Error::Config(format!("node {node} has no worker id left")));
        }
        self.workers[node as usize] += 1;
        let ep = self.sim.endpoint(node);
        let thread = ep.thread();
        let client = CdClient::new(ep, self.view.clone(), table, worker as u16, cfg)?;
        Ok((client, thread))
    }

    /// [`Self::client_with`] the cluster's configuration.
    pub fn client(&mut self, node: NodeId) -> Result<(CdClient<SimEndpoint>, SimThread), Error> {
        self.client_with(node, self.cfg.clone())
    }

    pub fn sim(&self) -> &Sim {
        &self.sim
    }

    pub fn view(&self) -> &Arc<ClusterView> {
        &self.view
    }

    pub fn config(&self) -> &ProtocolConfig {
        &self.cfg
    }
}

impl SimCdCluster {
    /// Run `body(i, client)` for each client on its simulated thread, all to their end in
    /// virtual time; returns the run and each body's result, in client order. A panic in a
    /// body is raised here once the others have finished.
    pub fn run<C, T, F>(&self, clients: Vec<(C, SimThread)>, body: F) -> (crate::RunSummary, Vec<T>)
    where
        C: Send + 'static,
        T: Send + 'static,
        F: Fn(usize, C) -> T + Send + Sync + 'static,
    {
        let body = Arc::new(body);
        let handles: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(i, (client, thread))| {
                let body = body.clone();
                self.sim.spawn(thread, move || body(i, client))
            })
            .collect();
        let summary = self.sim.run();
        let results = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        (summary, results)
    }
}
