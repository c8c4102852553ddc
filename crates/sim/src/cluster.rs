//! A Nessie cluster on the simulated fabric: every node's tables and allocator, client workers
//! each on its own simulated thread, and for SD/HY/Pilaf the server threads, each polling on a
//! core of its own. The protocol code is the production code, unchanged, assembled by
//! [`Plan`] as in every other backend.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use nessie_baselines::sd::{RpcConfig, RpcShared, ServerLoop, SlotPool};
use nessie_deploy::{Mode, ModeClient, NodeServer, Plan};
use nessie_fabric::NodeId;
use nessie_fabric_sim::{RunSummary, Sim, SimEndpoint, SimFaults, SimParams, SimThread};
use nessie_protocols::cd::{CdClient, ClusterView};
use nessie_protocols::{Error, ProtocolConfig, ReplicaSet};
use nessie_store::classtable::ClassTable;
use nessie_store::Geometry;

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
    plan: Plan,
    tables: Vec<Arc<ClassTable>>,
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

    /// A client-driven cluster with `faults` injected (correctness mode, `nessie_fabric_sim::faults`).
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
        let plan = Plan::new(mode, geometry, cfg, rpc)?;
        let g = plan.geometry();
        let single = ReplicaSet::single(g.nodes as NodeId, plan.view.index.ite);
        let regions = vec![plan.node_regions(&single)?; g.nodes as usize];
        let sim = Sim::with_faults(params, faults, seed, &regions).map_err(config)?;
        let tables = (0..g.nodes)
            .map(|n| Arc::new(plan.class_table(n as NodeId)))
            .collect();
        let mut c = Self {
            workers: vec![0; g.nodes as usize],
            sim,
            plan,
            tables,
            rpc: None,
        };
        c.add_servers()?;
        Ok(c)
    }

    /// Each node's server threads, each on a polling core (started by [`Self::run`]); none in
    /// CD.
    fn add_servers(&mut self) -> Result<(), Error> {
        let Some(shared) = self.plan.rpc.clone() else {
            return Ok(());
        };
        let mut servers = Vec::new();
        let mut pools = Vec::new();
        for node in 0..self.plan.geometry().nodes as NodeId {
            let store = self.plan.pilaf_store(node)?;
            for t in 0..self.plan.mode.server_threads() {
                let ep = self.sim.polling_endpoint(node).map_err(config)?;
                let (io, thread) = (ep.sibling(), ep.thread());
                let part = NodeServer {
                    table: self.table(node)?,
                    pilaf: store.as_ref(),
                };
                let workers = &mut self.workers;
                let worker = || next_worker(workers, node);
                let (server, _) = self.plan.server(t, ep, io, part, worker)?;
                servers.push((server, thread));
            }
            pools.push(
                self.plan
                    .slot_pool()
                    .expect("a plan with servers has slots"),
            );
        }
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

    /// A client-driven worker on `node` running `cfg`, and the simulated thread it must run
    /// on ([`Self::run`]). CD clusters only.
    pub fn client_with(
        &mut self,
        node: NodeId,
        cfg: ProtocolConfig,
    ) -> Result<(CdClient<SimEndpoint>, SimThread), Error> {
        if self.plan.mode != Mode::Cd {
            return Err(Error::Config(format!(
                "this cluster runs {}",
                self.plan.mode.name()
            )));
        }
        let table = self.table(node)?;
        let ep = self.sim.endpoint(node);
        let thread = ep.thread();
        let workers = &mut self.workers;
        match self
            .plan
            .client(ep, table, cfg, || next_worker(workers, node), None)?
        {
            ModeClient::Cd(c) => Ok((c, thread)),
            _ => unreachable!("a CD plan makes CD clients"),
        }
    }

    /// [`Self::client_with`] the cluster's configuration.
    pub fn client(&mut self, node: NodeId) -> Result<(CdClient<SimEndpoint>, SimThread), Error> {
        self.client_with(node, self.plan.cfg.clone())
    }

    /// A new worker of the cluster's mode on `node`, its thread, and another endpoint of that
    /// thread (for its clock and sleeps).
    pub fn mode_client(
        &mut self,
        node: NodeId,
    ) -> Result<(ModeClient<SimEndpoint>, SimThread, SimEndpoint), Error> {
        let ep = self.sim.endpoint(node);
        self.mode_client_on(node, ep)
    }

    /// The slots of one client thread on `node` keeping `slots` operations in flight: a worker
    /// of the cluster's mode per slot, each on a simulated thread of its own, all sharing the
    /// thread's CPU ([`Sim::pipeline`]), with their threads and clocks as [`Self::mode_client`].
    #[allow(clippy::type_complexity)]
    pub fn mode_pipeline(
        &mut self,
        node: NodeId,
        slots: usize,
    ) -> Result<Vec<(ModeClient<SimEndpoint>, SimThread, SimEndpoint)>, Error> {
        let eps = self.sim.pipeline(node, slots);
        eps.into_iter()
            .map(|ep| self.mode_client_on(node, ep))
            .collect()
    }

    fn mode_client_on(
        &mut self,
        node: NodeId,
        ep: SimEndpoint,
    ) -> Result<(ModeClient<SimEndpoint>, SimThread, SimEndpoint), Error> {
        let table = self.table(node)?;
        let slot =
            match &self.rpc {
                None => None,
                Some(r) => Some(r.pools[node as usize].take().ok_or_else(|| {
                    Error::Config(format!("node {node} has no free client slot"))
                })?),
            };
        let (thread, timer) = (ep.thread(), ep.sibling());
        let (workers, cfg) = (&mut self.workers, self.plan.cfg.clone());
        let client = self
            .plan
            .client(ep, table, cfg, || next_worker(workers, node), slot)?;
        Ok((client, thread, timer))
    }

    pub fn sim(&self) -> &Sim {
        &self.sim
    }

    pub fn view(&self) -> &Arc<ClusterView> {
        &self.plan.view
    }

    pub fn config(&self) -> &ProtocolConfig {
        &self.plan.cfg
    }

    pub fn mode(&self) -> Mode {
        self.plan.mode
    }
}

/// The next worker id of `node` (ids are 16 bits, never reused).
fn next_worker(workers: &mut [usize], node: NodeId) -> Result<u16, Error> {
    let w = workers
        .get_mut(node as usize)
        .ok_or_else(|| Error::Config(format!("no node {node}")))?;
    if *w >= MAX_WORKERS_PER_NODE {
        return Err(Error::Config(format!("node {node} has no worker id left")));
    }
    *w += 1;
    Ok((*w - 1) as u16)
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
    pub fn run<C, T, F>(&mut self, clients: Vec<(C, SimThread)>, body: F) -> (RunSummary, Vec<T>)
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
