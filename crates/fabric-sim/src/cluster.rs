//! A Nessie cluster on the simulated fabric: every node's tables and allocator, client workers
//! each on its own simulated thread, and for SD/HY/Pilaf the server threads, each polling on a
//! core of its own. The protocol code is the production code, unchanged.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use nessie_fabric::NodeId;
use nessie_protocols::cd::{CdClient, ClusterView};
use nessie_protocols::pilaf::{PilafExecutor, PilafStore};
use nessie_protocols::sd::{self, RpcConfig, RpcShared, Server, ServerLoop, SlotPool};
use nessie_protocols::{ClientParts, Error, Mode, ModeClient, ProtocolConfig, RpcLease};
use nessie_store::classtable::ClassTable;
use nessie_store::Geometry;

use crate::{Sim, SimEndpoint, SimFaults, SimParams, SimThread};

/// Client workers a node may have (their ids are 16 bits).
pub const MAX_WORKERS_PER_NODE: usize = u16::MAX as usize;

/// SD/HY/Pilaf: the request slots and the server threads, until they are started.
struct Rpc {
    shared: Arc<RpcShared>,
    pools: Vec<Arc<SlotPool>>,
    servers: Vec<(ServerLoop, SimThread)>,
}

pub struct SimCluster {
    sim: Sim,
    view: Arc<ClusterView>,
    tables: Vec<Arc<ClassTable>>,
    cfg: ProtocolConfig,
    mode: Mode,
    workers: Vec<usize>,
    rpc: Option<Rpc>,
}

fn config(e: impl std::fmt::Display) -> Error {
    Error::Config(e.to_string())
}

impl SimCluster {
    /// A client-driven cluster of `geometry.nodes` nodes on hardware `params`, scheduled
    /// with `seed`.
    pub fn new(
        params: SimParams,
        seed: u64,
        geometry: Geometry,
        cfg: ProtocolConfig,
    ) -> Result<Self, Error> {
        Self::with_mode(params, seed, geometry, cfg, Mode::Cd, RpcConfig::default())
    }

    /// A cluster running `mode`; `rpc` sizes SD/HY's request slots and their servers' idling.
    pub fn with_mode(
        params: SimParams,
        seed: u64,
        geometry: Geometry,
        cfg: ProtocolConfig,
        mode: Mode,
        rpc: RpcConfig,
    ) -> Result<Self, Error> {
        let none = SimFaults::NONE;
        Self::build(params, none, seed, geometry, cfg, mode, rpc)
    }

    /// A client-driven cluster with `faults` injected (correctness mode, `crate::faults`).
    pub fn with_faults(
        params: SimParams,
        faults: SimFaults,
        seed: u64,
        geometry: Geometry,
        cfg: ProtocolConfig,
    ) -> Result<Self, Error> {
        let rpc = RpcConfig::default();
        Self::build(params, faults, seed, geometry, cfg, Mode::Cd, rpc)
    }

    fn build(
        params: SimParams,
        faults: SimFaults,
        seed: u64,
        geometry: Geometry,
        cfg: ProtocolConfig,
        mode: Mode,
        rpc: RpcConfig,
    ) -> Result<Self, Error> {
        cfg.validate()?;
        mode.validate()?;
        let view = Arc::new(match mode {
            Mode::Cd => ClusterView::new(geometry)?,
            Mode::Sd { .. } | Mode::Hy { .. } | Mode::Pilaf { .. } => sd::coupled_view(geometry)?,
        });
        let g = &view.geometry;
        let shared = match mode {
            Mode::Cd => None,
            _ => Some(sd::rpc_shared(g, &rpc)?),
        };
        let regions = sd::node_regions(g.table_regions(), shared.as_deref(), mode, &rpc, g, &cfg)?;
        let regions = vec![regions; g.nodes as usize];
        let sim = Sim::with_faults(params, faults, seed, &regions).map_err(config)?;
        let tables = (0..g.nodes)
            .map(|n| Arc::new(view.class_table(n as NodeId, cfg.clock_margin_ns)))
            .collect();
        let mut c = Self {
            workers: vec![0; g.nodes as usize],
            sim,
            view,
            tables,
            cfg,
            mode,
            rpc: None,
        };
        if let Some(shared) = shared {
            c.add_servers(shared, &rpc)?;
        }
        Ok(c)
    }

    /// Each node's server threads, each on a polling core (started by [`Self::run`]): SD's
    /// server with the client-driven protocol as executor, or with the node's Pilaf store.
    fn add_servers(&mut self, shared: Arc<RpcShared>, rpc: &RpcConfig) -> Result<(), Error> {
        let threads = self.mode.server_threads();
        let server_cfg = self.mode.server_config(&self.cfg);
        let mut servers = Vec::new();
        for node in 0..self.view.geometry.nodes as NodeId {
            let store = match self.mode {
                Mode::Pilaf { .. } => Some(PilafStore::new(
                    node,
                    rpc.pilaf_params(&self.view.geometry, &self.cfg)?,
                )?),
                _ => None,
            };
            for t in 0..threads {
                let ep = self.sim.polling_endpoint(node).map_err(config)?;
                let (io, thread) = (ep.sibling(), ep.thread());
                let (shared, opts) = (shared.clone(), rpc.server_options());
                let server = match &store {
                    Some(store) => {
                        let exec = PilafExecutor::new(ep, store.clone())?;
                        Server::new(exec, io, shared, t, threads, opts)?.into_loop()
                    }
                    None => {
                        let worker = self.worker_id(node)?;
                        let table = self.table(node)?;
                        let cfg = server_cfg.clone();
                        let exec = CdClient::new(ep, self.view.clone(), table, worker, cfg)?;
                        Server::new(exec, io, shared, t, threads, opts)?.into_loop()
                    }
                };
                servers.push((server, thread));
            }
        }
        let pools = (0..self.view.geometry.nodes)
            .map(|_| SlotPool::new(shared.layout.max_clients_per_node))
            .collect();
        self.rpc = Some(Rpc {
            shared,
            pools,
            servers,
        });
        Ok(())
    }

    fn table(&self, node: NodeId) -> Result<Arc<ClassTable>, Error> {
        self.tables
            .get(node as usize)
            .cloned()
            .ok_or_else(|| Error::Config(format!("no node {node}")))
    }

    fn worker_id(&mut self, node: NodeId) -> Result<u16, Error> {
        let w = &mut self.workers[node as usize];
        if *w >= MAX_WORKERS_PER_NODE {
            return Err(Error::Config(format!("node {node} has no worker id left")));
        }
        *w += 1;
        Ok((*w - 1) as u16)
    }

    /// A new client-driven worker on `node` with its own configuration, and the simulated
    /// thread it must run on ([`Self::run`]). CD clusters only.
    pub fn client_with(
        &mut self,
        node: NodeId,
        cfg: ProtocolConfig,
    ) -> Result<(CdClient<SimEndpoint>, SimThread), Error> {
        if self.mode != Mode::Cd {
            return Err(Error::Config(format!(
                "this cluster runs {}",
                self.mode.name()
            )));
        }
        let table = self.table(node)?;
        let worker = self.worker_id(node)?;
        let ep = self.sim.endpoint(node);
        let thread = ep.thread();
        let client = CdClient::new(ep, self.view.clone(), table, worker, cfg)?;
        Ok((client, thread))
    }

    /// [`Self::client_with`] the cluster's configuration.
    pub fn client(&mut self, node: NodeId) -> Result<(CdClient<SimEndpoint>, SimThread), Error> {
        self.client_with(node, self.cfg.clone())
    }

    /// A new worker of the cluster's mode on `node`, its thread, and another endpoint of that
    /// thread (for its clock and sleeps).
    pub fn mode_client(
        &mut self,
        node: NodeId,
    ) -> Result<(ModeClient<SimEndpoint>, SimThread, SimEndpoint), Error> {
        let table = self.table(node)?;
        let rpc = match &self.rpc {
            None => None,
            Some(r) => Some(RpcLease {
                shared: r.shared.clone(),
                slot: r.pools[node as usize]
                    .take()
                    .ok_or_else(|| Error::Config(format!("node {node} has no free client slot")))?,
            }),
        };
        let ep = self.sim.endpoint(node);
        let (thread, timer) = (ep.thread(), ep.sibling());
        let parts = ClientParts {
            ep,
            view: self.view.clone(),
            table,
            cfg: self.cfg.clone(),
        };
        let client = ModeClient::new(self.mode, parts, || self.worker_id(node), rpc)?;
        Ok((client, thread, timer))
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

    pub fn mode(&self) -> Mode {
        self.mode
    }
}

/// Tells waiting SD/HY clients that the servers are gone, however a server thread ends.
struct StopOnDrop(Arc<RpcShared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.set_stopped();
    }
}

impl SimCluster {
    /// Run `body(i, client)` for each client on its simulated thread, all to their end in
    /// virtual time, with the server threads (SD/HY/Pilaf) polling until the last client is done;
    /// returns the run and each body's result, in client order. A panic in a body is raised
    /// here once the others have finished. Servers run in the first call only.
    pub fn run<C, T, F>(
        &mut self,
        clients: Vec<(C, SimThread)>,
        body: F,
    ) -> (crate::RunSummary, Vec<T>)
    where
        C: Send + 'static,
        T: Send + 'static,
        F: Fn(usize, C) -> T + Send + Sync + 'static,
    {
        let stop = Arc::new(AtomicBool::new(clients.is_empty()));
        let left = Arc::new(AtomicUsize::new(clients.len()));
        let servers: Vec<_> = match self.rpc.as_mut() {
            Some(r) => std::mem::take(&mut r.servers)
                .into_iter()
                .map(|(mut s, thread)| {
                    let (stop, guard) = (stop.clone(), StopOnDrop(r.shared.clone()));
                    self.sim.spawn(thread, move || {
                        let _guard = guard;
                        s(&stop);
                    })
                })
                .collect(),
            None => Vec::new(),
        };
        let body = Arc::new(body);
        let handles: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(i, (client, thread))| {
                let (body, stop, left) = (body.clone(), stop.clone(), left.clone());
                self.sim.spawn(thread, move || {
                    let r = body(i, client);
                    if left.fetch_sub(1, Ordering::SeqCst) == 1 {
                        stop.store(true, Ordering::SeqCst);
                    }
                    r
                })
            })
            .collect();
        let summary = self.sim.run();
        for s in servers {
            s.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        }
        let results = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        (summary, results)
    }
}
