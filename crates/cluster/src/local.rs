//! An in-process cluster: N nodes' index and data tables on a [`InProcFabric`], and client workers
//! on any node.
//!
//! The cluster runs one protocol ([`Mode`]):
//! - `Mode::Cd` (Nessie): regions 0 (index), 1 (data) and 2 (page table) per node, decoupled
//!   index, no threads.
//! - `Mode::Sd` / `Mode::Hy` (the baselines): the coupled index, plus per node a request region
//!   and a response region (`nessie_baselines::sd::{REQUEST_REGION, RESPONSE_REGION}`), and
//!   `server_threads` server threads per node, started here and stopped and joined when the
//!   cluster is dropped (or by [`LocalCluster::stop_servers`]).
//! - `Mode::Pilaf`: SD's request and response regions and server threads, whose executor is
//!   each node's Pilaf store (`nessie_baselines::pilaf`), in two more regions (the hash table
//!   and the extents); regions 0..2 are one word each (unused).
//!
//! The regions, view and shared state come from the cluster's [`Plan`], as in the node process
//! and the simulator; this module only runs the threads and keeps the per-node state.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use nessie_baselines::hy::HyClient;
use nessie_baselines::pilaf::{PilafClient, PilafStore, StoreStats};
use nessie_baselines::sd::{
    self, RpcConfig, RpcShared, SdClient, ServerStats, ServerStatsSnapshot, SlotPool,
};
use nessie_deploy::{Mode, ModeClient, NodeServer, Plan};
use nessie_fabric::inproc::{DelayInjection, InProcEndpoint, InProcFabric};
use nessie_fabric::NodeId;
use nessie_protocols::cd::{CdClient, ClusterView};
use nessie_protocols::fence::IndexCopy;
use nessie_protocols::replica::{CopyMap, HandOver, Move};
use nessie_protocols::{
    CatchUp, Error, Fence, KvClient, MovedCopy, NodeRole, ProtocolConfig, ReplicaSet, Replicated,
};
use nessie_store::classtable::ClassTable;
use nessie_store::{Geometry, IndexPartitions, PartitionId, INDEX_REGION};

/// Client workers each node may create over its lifetime (they are numbered with 16 bits).
pub const MAX_WORKERS_PER_NODE: u32 = u16::MAX as u32;

/// The server side of an SD/HY cluster.
struct Rpc {
    shared: Arc<RpcShared>,
    /// Free client slots, per node.
    pools: Vec<Arc<SlotPool>>,
    stop: Arc<AtomicBool>,
    /// (node, thread, counters).
    stats: Vec<(NodeId, Arc<ServerStats>)>,
    threads: Vec<JoinHandle<()>>,
    /// Pilaf mode: each node's store.
    pilaf: Vec<Arc<PilafStore>>,
}

/// A server thread's node, counters and loop.
type ServerLoop = (NodeId, Arc<ServerStats>, sd::ServerLoop);

pub struct LocalCluster {
    fabric: Arc<InProcFabric>,
    /// The mode, view, protocol configuration and shared request slots.
    plan: Plan,
    /// Each node's allocator (a restarted node gets a new one, [`Self::restart_node`]).
    tables: Vec<RwLock<Arc<ClassTable>>>,
    next_worker: Vec<AtomicU32>,
    rpc: Option<Rpc>,
    /// Each node's reclaimer (`crate::reclaimer`), as in node processes, with its stop flag.
    reclaimers: Mutex<Vec<Option<Reclaimer>>>,
    /// Each node's membership view, given to its client-driven workers ([`Self::fail_node`]).
    fences: Vec<Arc<Fence>>,
    /// Where the copies of each node's tables are (one copy unless [`Self::replicated`]).
    set: Arc<ReplicaSet>,
    /// Client members by id ([`Self::member_client`]): processes that are not nodes.
    members: Mutex<std::collections::BTreeMap<NodeId, Arc<ClientMember>>>,
}

/// A client member of a [`LocalCluster`] (`docs/design/client-members.md`): an id past the
/// nodes', no memory of its own, an allocator that claims only the nodes' pages, and a
/// membership view of its own, as a `nessie` client library in an application process has.
struct ClientMember {
    table: Arc<ClassTable>,
    fence: Arc<Fence>,
    next_worker: AtomicU32,
}

/// A node's reclaimer thread and its stop flag.
type Reclaimer = (Arc<AtomicBool>, JoinHandle<()>);

/// The endpoint of every worker of a [`LocalCluster`]: the in-process fabric, replicated as
/// the cluster is.
pub type LocalEndpoint = Replicated<InProcEndpoint>;

/// The client of one slot of a [`LocalCluster::pipeline_with`]: a client-driven worker over its
/// slot's endpoint, replicated as the cluster is.
pub type LocalSlotClient = CdClient<Replicated<nessie_inflight::PipelineEndpoint<InProcEndpoint>>>;

impl LocalCluster {
    /// A client-driven (Nessie) cluster: allocate every node's tables. `delay` injects random
    /// delays around fabric operations.
    pub fn new(
        geometry: Geometry,
        cfg: ProtocolConfig,
        delay: Option<DelayInjection>,
    ) -> Result<Self, Error> {
        Self::with_rpc(geometry, cfg, delay, Mode::Cd, RpcConfig::default())
    }

    /// A cluster running `mode`, with the default [`RpcConfig`] for SD/HY (16 clients per node,
    /// spinning server threads).
    pub fn with_mode(
        geometry: Geometry,
        cfg: ProtocolConfig,
        delay: Option<DelayInjection>,
        mode: Mode,
    ) -> Result<Self, Error> {
        Self::with_rpc(geometry, cfg, delay, mode, RpcConfig::default())
    }

    /// A cluster running `mode`; `rpc` sizes the request/response slots and tunes the server
    /// threads (ignored for `Mode::Cd`).
    pub fn with_rpc(
        geometry: Geometry,
        cfg: ProtocolConfig,
        delay: Option<DelayInjection>,
        mode: Mode,
        rpc: RpcConfig,
    ) -> Result<Self, Error> {
        Self::build(geometry, cfg, delay, mode, rpc, (1, 0, 0))
    }

    /// A client-driven cluster keeping `replicas` copies of every node's index, data and page
    /// tables (`nessie_protocols::replica`).
    pub fn replicated(
        geometry: Geometry,
        cfg: ProtocolConfig,
        delay: Option<DelayInjection>,
        replicas: u8,
    ) -> Result<Self, Error> {
        Self::replicated_with_spares(geometry, cfg, delay, replicas, 0)
    }

    /// [`Self::replicated`], every node keeping `spare` mirror slots free for the copies of a
    /// node gone for good ([`Self::replace_node`]).
    pub fn replicated_with_spares(
        geometry: Geometry,
        cfg: ProtocolConfig,
        delay: Option<DelayInjection>,
        replicas: u8,
        spare: u8,
    ) -> Result<Self, Error> {
        Self::build(
            geometry,
            cfg,
            delay,
            Mode::Cd,
            RpcConfig::default(),
            (replicas, spare, 0),
        )
    }

    /// [`Self::replicated`], every node keeping `index_slots` index slots, each room for a
    /// copy of one index partition, for partitions migrating to it ([`Self::migrate_partition`]).
    pub fn replicated_with_index_slots(
        geometry: Geometry,
        cfg: ProtocolConfig,
        delay: Option<DelayInjection>,
        replicas: u8,
        index_slots: u16,
    ) -> Result<Self, Error> {
        Self::build(
            geometry,
            cfg,
            delay,
            Mode::Cd,
            RpcConfig::default(),
            (replicas, 0, index_slots),
        )
    }

    fn build(
        geometry: Geometry,
        cfg: ProtocolConfig,
        delay: Option<DelayInjection>,
        mode: Mode,
        rpc: RpcConfig,
        (replicas, spare, index_slots): (u8, u8, u16),
    ) -> Result<Self, Error> {
        if replicas != 1 && mode != Mode::Cd {
            return Err(Error::Config(format!(
                "replication is for the client-driven protocol; {} keeps one copy",
                mode.name()
            )));
        }
        let plan = Plan::new(mode, geometry, cfg, rpc)?;
        let (g, ite) = (plan.geometry(), plan.view.index.ite);
        let set = match replicas {
            1 => ReplicaSet::single(g.nodes as NodeId, ite).with_spare_copies(spare)?,
            r => ReplicaSet::new(r, g.nodes as NodeId, ite, &plan.cfg)?.with_spare_copies(spare)?,
        };
        let parts = IndexPartitions::new(g.nodes, g.ites_per_node);
        let set = Arc::new(set.with_index_slots(parts, index_slots)?);
        let regions = vec![plan.node_regions(&set)?; g.nodes as usize];
        let fabric =
            InProcFabric::new(&regions, delay).map_err(|e| Error::Config(e.to_string()))?;
        let tables = (0..g.nodes)
            .map(|n| RwLock::new(Arc::new(plan.class_table(n as NodeId))))
            .collect();
        let next_worker = (0..g.nodes).map(|_| AtomicU32::new(0)).collect();
        let fences = (0..g.nodes).map(|_| Arc::new(Fence::unfenced())).collect();
        let mut c = Self {
            fabric,
            set,
            plan,
            tables,
            next_worker,
            rpc: None,
            reclaimers: Mutex::new(Vec::new()),
            fences,
            members: Mutex::new(Default::default()),
        };
        // Pilaf's servers manage their own extents: no data tables to reclaim.
        for n in 0..c.plan.geometry().nodes {
            let r = match mode {
                Mode::Pilaf { .. } => None,
                _ => Some(c.start_reclaimer(n as NodeId)?),
            };
            c.reclaimers.lock().unwrap().push(r);
        }
        c.start_servers()?;
        Ok(c)
    }

    fn start_reclaimer(&self, node: NodeId) -> Result<Reclaimer, Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let ep = self.endpoint(node);
        let h = crate::reclaimer::spawn(
            self.table(node),
            ep,
            self.plan.cfg.expiry_ns,
            None,
            stop.clone(),
        )
        .map_err(|e| Error::Config(format!("cannot start a reclaimer thread: {e}")))?;
        Ok((stop, h))
    }

    /// Stop and join one reclaimer; whether it had panicked (an allocator invariant broke).
    fn stop_reclaimer((stop, h): Reclaimer) -> bool {
        stop.store(true, Ordering::Release);
        h.thread().unpark();
        let panicked = h.join().is_err();
        if panicked {
            tracing::error!("a reclaimer thread panicked");
        }
        panicked
    }

    /// The server threads' loops of every node, from the plan; each node's Pilaf store (Pilaf
    /// mode) is kept in `pilaf`.
    fn server_loops(&self, pilaf: &mut Vec<Arc<PilafStore>>) -> Result<Vec<ServerLoop>, Error> {
        let mut servers: Vec<ServerLoop> = Vec::new();
        for node in 0..self.plan.geometry().nodes as NodeId {
            let store = self.plan.pilaf_store(node)?;
            for t in 0..self.plan.mode.server_threads() {
                let part = NodeServer {
                    table: self.table(node),
                    pilaf: store.as_ref(),
                };
                let (exec, io) = (self.endpoint(node), self.endpoint(node));
                let (body, stats) = self
                    .plan
                    .server(t, exec, io, part, || self.worker_id(node))?;
                servers.push((node, stats, body));
            }
            pilaf.extend(store);
        }
        Ok(servers)
    }

    /// Start every node's server threads (none in CD).
    fn start_servers(&mut self) -> Result<(), Error> {
        let Some(shared) = self.plan.rpc.clone() else {
            return Ok(());
        };
        let threads = self.plan.mode.server_threads();
        let stop = Arc::new(AtomicBool::new(false));
        let mut pilaf = Vec::new();
        let servers = self.server_loops(&mut pilaf)?;
        let stats = servers.iter().map(|s| (s.0, s.1.clone())).collect();
        let mut handles = Vec::new();
        for (i, (node, _, mut body)) in servers.into_iter().enumerate() {
            let thread_stop = stop.clone();
            let shared = shared.clone();
            let name = format!(
                "nessie-{}-n{}-t{}",
                self.plan.mode.name(),
                node,
                i % threads as usize
            );
            let h = std::thread::Builder::new().name(name).spawn(move || {
                // Whatever way the loop ends, waiting clients must stop waiting.
                struct Stopped(Arc<RpcShared>);
                impl Drop for Stopped {
                    fn drop(&mut self) {
                        self.0.set_stopped();
                    }
                }
                let _guard = Stopped(shared);
                body(&thread_stop);
            });
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    stop.store(true, Ordering::Release);
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err(Error::Config(format!("cannot start server thread: {e}")));
                }
            }
        }
        let pools = (0..self.plan.geometry().nodes)
            .map(|_| {
                self.plan
                    .slot_pool()
                    .expect("a plan with servers has slots")
            })
            .collect();
        self.rpc = Some(Rpc {
            shared,
            pools,
            stop,
            stats,
            threads: handles,
            pilaf,
        });
        Ok(())
    }

    /// An endpoint of `node` onto the cluster's memory, replicated as the cluster is.
    pub fn endpoint(&self, node: NodeId) -> LocalEndpoint {
        Replicated::new(
            self.fabric.endpoint(node),
            self.set.clone(),
            self.fences[node as usize].clone(),
        )
    }

    /// Copies of each node's tables.
    pub fn replicas(&self) -> u8 {
        self.set.replicas()
    }

    fn worker_id(&self, node: NodeId) -> Result<u16, Error> {
        let counter = self.next_worker.get(node as usize).ok_or_else(|| {
            Error::Config(format!(
                "no node {node} in a cluster of {}",
                self.next_worker.len()
            ))
        })?;
        let worker = counter.fetch_add(1, Ordering::Relaxed);
        if worker >= MAX_WORKERS_PER_NODE {
            return Err(Error::Config(format!(
                "node {node} has run out of worker ids ({MAX_WORKERS_PER_NODE})"
            )));
        }
        Ok(worker as u16)
    }

    /// A new client-driven worker on `node` with the cluster's protocol configuration. In SD/HY
    /// clusters it runs the client-driven protocol over the cluster's coupled index (consistent
    /// with the servers; useful for inspection) — use [`Self::kv_client`] for the mode's client.
    pub fn client(&self, node: NodeId) -> Result<CdClient<LocalEndpoint>, Error> {
        self.client_with(node, self.plan.cfg.clone())
    }

    /// A new client-driven worker on `node` with its own protocol configuration (tests use
    /// this to give one client a mutation or a different optimisation set).
    pub fn client_with(
        &self,
        node: NodeId,
        cfg: ProtocolConfig,
    ) -> Result<CdClient<LocalEndpoint>, Error> {
        if let Mode::Pilaf { .. } = self.plan.mode {
            return Err(Error::Config(
                "a Pilaf cluster has no client-driven tables: use kv_client or pilaf_client".into(),
            ));
        }
        match self.new_client(node, Mode::Cd, cfg)? {
            ModeClient::Cd(mut c) => {
                c.set_fence(self.fences[node as usize].clone());
                Ok(c)
            }
            _ => unreachable!("Mode::Cd makes a CD client"),
        }
    }

    /// A pipeline of client-driven workers on `node` (`nessie_inflight`), one per slot of
    /// `opts`, each with protocol configuration `cfg`, its own worker id and the node's fence,
    /// as [`Self::client_with`]'s; `setup` sees each slot's client before it starts (a test's
    /// hook). Not `Send`: build it on the thread that drives it.
    pub fn pipeline_with(
        &self,
        node: NodeId,
        cfg: ProtocolConfig,
        opts: nessie_inflight::PipelineOptions,
        mut setup: impl FnMut(usize, &mut LocalSlotClient),
    ) -> Result<nessie_inflight::Pipeline<InProcEndpoint>, Error> {
        if self.plan.mode != Mode::Cd {
            return Err(Error::Config(format!(
                "pipelines of client-driven workers need a cd cluster; this one runs {}",
                self.plan.mode.name()
            )));
        }
        let table = self.checked_table(node)?;
        let fence = self.fences[node as usize].clone();
        nessie_inflight::Pipeline::new(self.fabric.endpoint(node), opts, |s, ep| {
            let ep = Replicated::new(ep, self.set.clone(), fence.clone());
            let worker = || self.worker_id(node);
            match self
                .plan
                .client_of(Mode::Cd, ep, table.clone(), cfg.clone(), worker, None)?
            {
                ModeClient::Cd(mut c) => {
                    c.set_fence(fence.clone());
                    setup(s, &mut c);
                    Ok(c)
                }
                _ => unreachable!("Mode::Cd makes a CD client"),
            }
        })
    }

    /// Declare `node` failed, as membership does when its lease lapses: its own workers are
    /// fenced (they start no write), and every other node's workers may complete the writes
    /// its workers left in flight, once those are past their deadline.
    pub fn fail_node(&self, node: NodeId) {
        self.fences[node as usize].set_lease_until(0);
        for f in self.all_fences() {
            f.set_gone(node, true);
        }
    }

    /// Every membership view: the nodes', then the client members'.
    fn all_fences(&self) -> Vec<Arc<Fence>> {
        let members = self.members.lock().unwrap();
        self.fences
            .iter()
            .cloned()
            .chain(members.values().map(|m| m.fence.clone()))
            .collect()
    }

    /// A new client-driven worker of client member `id` (made on first use): a process that
    /// is not a node (`docs/design/client-members.md`). Its id lies in `[nodes, 4096)`; it
    /// reaches every node's memory, claims only the nodes' pages (`ClassTable::remote_only`)
    /// and has a membership view of its own, which knows of failed nodes as the nodes' do.
    /// Its workers are tagged with its id, so an entry it leaves is completed by others only
    /// once it is declared failed ([`Self::fail_client`]). CD clusters only.
    pub fn member_client(&self, id: NodeId) -> Result<CdClient<LocalEndpoint>, Error> {
        self.member_client_with(id, self.plan.cfg.clone())
    }

    /// [`Self::member_client`] with its own protocol configuration.
    pub fn member_client_with(
        &self,
        id: NodeId,
        cfg: ProtocolConfig,
    ) -> Result<CdClient<LocalEndpoint>, Error> {
        if self.plan.mode != Mode::Cd {
            return Err(Error::Config(format!(
                "client members run the client-driven protocol; this cluster runs {}",
                self.plan.mode.name()
            )));
        }
        let nodes = self.plan.geometry().nodes;
        if (id as u32) < nodes || id as u32 >= nessie_store::limits::MAX_NODES {
            return Err(Error::Config(format!(
                "client id {id} is not in [{nodes}, {})",
                nessie_store::limits::MAX_NODES
            )));
        }
        let member = self
            .members
            .lock()
            .unwrap()
            .entry(id)
            .or_insert_with(|| {
                let fence = Arc::new(Fence::unfenced());
                // The client learns of the nodes failed so far as it joins.
                for n in 0..nodes as NodeId {
                    fence.set_gone(n, self.fences[0].is_gone(n));
                }
                Arc::new(ClientMember {
                    table: Arc::new(self.plan.class_table(id).remote_only()),
                    fence,
                    next_worker: AtomicU32::new(0),
                })
            })
            .clone();
        let ep = Replicated::new(
            self.fabric.client_endpoint(id),
            self.set.clone(),
            member.fence.clone(),
        );
        let worker = || {
            let w = member.next_worker.fetch_add(1, Ordering::Relaxed);
            u16::try_from(w)
                .map_err(|_| Error::Config(format!("client {id} has run out of worker ids")))
        };
        match self
            .plan
            .client_of(Mode::Cd, ep, member.table.clone(), cfg, worker, None)?
        {
            ModeClient::Cd(mut c) => {
                c.set_fence(member.fence.clone());
                Ok(c)
            }
            _ => unreachable!("Mode::Cd makes a CD client"),
        }
    }

    /// Crash client member `id` and declare it failed, as membership does when its lease
    /// lapses: its endpoints reach nothing more, its workers are fenced, and every other
    /// member may complete the writes it left in flight once past their deadline. A client
    /// never comes back under the same id.
    pub fn fail_client(&self, id: NodeId) {
        self.fabric.kill_client(id);
        self.fence_client(id);
    }

    /// Fence client member `id` without crashing it (its lease lapsed while it was paused) and
    /// declare it failed: the process lives on, but may change nothing.
    pub fn fence_client(&self, id: NodeId) {
        if let Some(m) = self.members.lock().unwrap().get(&id) {
            m.fence.set_lease_until(0);
        }
        for f in self.all_fences() {
            f.set_gone(id, true);
        }
    }

    /// Client member `id`'s allocator (made by [`Self::member_client`]).
    pub fn member_table(&self, id: NodeId) -> Option<Arc<ClassTable>> {
        self.members
            .lock()
            .unwrap()
            .get(&id)
            .map(|m| m.table.clone())
    }

    /// Declare `node` failed as membership does across processes, where each node learns of
    /// it at its own time: views read before the declaration stay fresh to read by for the
    /// read view (the read settle time less the clock margin; `Fence::may_read`), and each
    /// other node learns of the failure after a delay drawn from `seed`, at most half of it
    /// (so that advances from a dead decider's history still stop, at half the settle time
    /// after their node learnt, before anyone decides at the next copy), and reads a fresh
    /// view from then on. Returns once every node knows. Meant for
    /// `InProcFabric::kill_node_keeping_memory`, where nodes that have not heard still read
    /// the dead node's memory.
    pub fn fail_node_staggered(&self, node: NodeId, seed: u64) {
        use rand::{Rng, SeedableRng};
        let read_view = self
            .set
            .read_settle_ns()
            .saturating_sub(self.plan.cfg.clock_margin_ns);
        let t0 = std::time::Instant::now();
        let declared = nessie_fabric::monotonic_ns();
        // The dead node's own workers issue nothing: its view does not matter.
        for (i, f) in self.fences.iter().enumerate() {
            if i != node as usize {
                f.set_view_until(declared.saturating_add(read_view));
            }
        }
        self.fences[node as usize].set_lease_until(0);
        self.fences[node as usize].set_gone(node, true);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut learners: Vec<(u64, usize)> = (0..self.fences.len())
            .filter(|&i| i != node as usize)
            .map(|i| (rng.gen_range(0..=read_view / 2), i))
            .collect();
        learners.sort_unstable();
        for (delay, i) in learners {
            let due = std::time::Duration::from_nanos(delay);
            std::thread::sleep(due.saturating_sub(t0.elapsed()));
            self.fences[i].set_gone(node, true);
            self.fences[i].set_view_until(u64::MAX);
        }
    }

    /// Restart `node`, which crashed (`InProcFabric::kill_node`) and was declared failed
    /// ([`Self::fail_node`]), as a node process started again: its memory comes back zeroed,
    /// with a new allocator and reclaimer; it receives its copies (every node writes them from
    /// now on), fills them from the primaries (`Replicated::catch_up`), adopts the pages its
    /// earlier incarnation claimed (`ClassTable::adopt`) and becomes a full member again.
    /// Copies moved away while it was failed ([`Self::replace_node`]) stay where they are: it
    /// comes back holding only what is placed on it now. Returns what catching up did. Waits
    /// first until the failure is settled (`ReplicaSet::settle_ns`), as membership holds a
    /// failed node that long.
    pub fn restart_node(&self, node: NodeId) -> Result<CatchUp, Error> {
        self.restart_node_paced(node, 0)
    }

    /// [`Self::restart_node`], reading from the primaries at most `bytes_per_s` (0: no limit).
    pub fn restart_node_paced(&self, node: NodeId, bytes_per_s: u64) -> Result<CatchUp, Error> {
        self.wait_failure_settled(node)?;
        if let Some(r) = self.reclaimers.lock().unwrap()[node as usize].take() {
            // A crashed node's reclaimer: it may have failed on the dead memory, which says
            // nothing about the allocator.
            let _ = Self::stop_reclaimer(r);
        }
        self.fabric.revive_node(node);
        *self.tables[node as usize].write().unwrap() = Arc::new(
            self.plan
                .view
                .class_table(node, self.plan.cfg.clock_margin_ns),
        );
        let joined = nessie_fabric::Endpoint::now_ns(&self.fabric.endpoint(node));
        for f in &self.fences {
            f.set_incarnation(node, joined);
            f.set_role(node, NodeRole::Receiving);
        }
        // Operations that chose their copies before the change may still write without the
        // node's: let them end before the copier passes their words.
        std::thread::sleep(std::time::Duration::from_nanos(self.set.join_settle_ns()));
        let mut ep = self.endpoint(node);
        let caught = ep
            .catch_up(&self.plan.view.geometry.table_regions(), bytes_per_s)
            .map_err(Error::Fabric)?;
        self.table(node).adopt(&mut ep).map_err(Error::Fabric)?;
        for f in &self.fences {
            f.set_role(node, NodeRole::Full);
        }
        self.fences[node as usize].set_lease_until(u64::MAX);
        let r = self.start_reclaimer(node)?;
        self.reclaimers.lock().unwrap()[node as usize] = Some(r);
        Ok(caught)
    }

    /// Wait until `node`'s failure is settled (`ReplicaSet::settle_ns`), as membership holds a
    /// failed node that long before it may join again.
    fn wait_failure_settled(&self, node: NodeId) -> Result<(), Error> {
        let settle = self.set.settle_ns();
        let observer = &self.fences[(node as usize + 1) % self.fences.len()];
        loop {
            match observer.gone_for_ns(node, nessie_fabric::monotonic_ns()) {
                None => {
                    return Err(Error::Config(format!(
                        "node {node} was not declared failed: crash it and fail_node it first"
                    )))
                }
                Some(t) if t >= settle => return Ok(()),
                Some(t) => std::thread::sleep(std::time::Duration::from_nanos(settle - t)),
            }
        }
    }

    /// Re-replicate the copies of `node`, which crashed and was declared failed, as membership
    /// does once a node has been gone too long to come back (`docs/protocol.md`, "Re-replication
    /// onto other nodes"): each copy it held moves to a spare slot of a node that is up and
    /// holds no copy of that partition (`CopyMap::replace`). Every node learns of the move, the
    /// copy is receiving (written, not read or decided at) until its new holder has filled it
    /// from the partition's decider (`Replicated::catch_up`), then full, and the partition
    /// pauses for the join settle time as after a rejoin. Waits first until the failure is
    /// settled. Returns what catching up did (summed over the new holders); fails, moving
    /// nothing, if some copy has nowhere to go (no spare slot left on a node without a copy of
    /// that partition). The pages the node had claimed stay claimed: nobody adopts them.
    pub fn replace_node(&self, node: NodeId) -> Result<CatchUp, Error> {
        self.replace_node_paced(node, 0)
    }

    /// [`Self::replace_node`], reading from the deciders at most `bytes_per_s` (0: no limit).
    pub fn replace_node_paced(&self, node: NodeId, bytes_per_s: u64) -> Result<CatchUp, Error> {
        self.wait_failure_settled(node)?;
        let observer = &self.fences[(node as usize + 1) % self.fences.len()];
        let (moves, stuck) = CopyMap::of(&self.set, observer)
            .replace(&self.set, node, |n| observer.role(n) == NodeRole::Full);
        if let Some((p, j)) = stuck.first() {
            return Err(Error::Config(format!(
                "copy {j} of partition {p} has nowhere to go: no node that is up and holds no copy of it has a spare slot left ({} of {} copies stuck)",
                stuck.len(),
                stuck.len() + moves.len()
            )));
        }
        let at = |m: &Move, receiving| MovedCopy {
            node: m.to.node,
            slot: m.to.slot,
            receiving,
        };
        for f in &self.fences {
            for m in &moves {
                f.move_copy(m.partition, m.j, Some(at(m, true)));
            }
        }
        // Operations that chose their copies before the move may still write without the new
        // ones: let them end before the copier passes their words.
        std::thread::sleep(std::time::Duration::from_nanos(self.set.join_settle_ns()));
        let mut caught = CatchUp::default();
        let mut holders: Vec<NodeId> = moves.iter().map(|m| m.to.node).collect();
        holders.sort_unstable();
        holders.dedup();
        for n in holders {
            let c = self
                .endpoint(n)
                .catch_up(&self.plan.view.geometry.table_regions(), bytes_per_s)
                .map_err(Error::Fabric)?;
            caught += c;
        }
        for f in &self.fences {
            for m in &moves {
                f.move_copy(m.partition, m.j, Some(at(m, false)));
            }
        }
        Ok(caught)
    }

    /// Migrate index partition `q` to the chain `to` (copy j in index slot `to[j].slot` of
    /// node `to[j].node`) with the per-ITE handover (`nessie_protocols::replica`, `handover.rs`)
    /// while the cluster runs: write pending into the target slots, tell every node's fence,
    /// one after the other `stagger` apart (so that some nodes' views lag, as membership's
    /// would), hand over every entry from the first target node that lives (reading at most `bytes_per_s`,
    /// 0: no limit), then, an operation time later, end the migration on every fence.
    pub fn migrate_partition(
        &self,
        q: PartitionId,
        to: &[IndexCopy],
        stagger: std::time::Duration,
        bytes_per_s: u64,
    ) -> Result<HandOver, Error> {
        if self.set.index_slots() == 0 {
            return Err(Error::Config("this cluster keeps no index slots".into()));
        }
        let mut ep = self.endpoint(to[0].node);
        ep.write_pending(q, to).map_err(Error::Fabric)?;
        for f in &self.fences {
            f.start_migration(q, to);
            std::thread::sleep(stagger);
        }
        // The puller: the first target node, or, if it dies meanwhile, the next node that
        // can (whoever meets a pending word finishes it, so a puller that dies leaves nothing
        // half done).
        let pullers = to
            .iter()
            .map(|c| c.node)
            .chain(0..self.fences.len() as NodeId);
        let mut done = Err(Error::Config(format!(
            "no node could hand over partition {q}"
        )));
        for n in pullers {
            done = self
                .endpoint(n)
                .hand_over_partition(q, bytes_per_s)
                .map_err(Error::Fabric);
            if done.is_ok() {
                break;
            }
        }
        let done = done?;
        // A hander that met a pending word may still be on its way (see
        // `Fence::finish_migration`).
        std::thread::sleep(std::time::Duration::from_nanos(self.set.join_settle_ns()));
        for f in &self.fences {
            f.finish_migration(q, to);
        }
        Ok(done)
    }

    /// A new server-driven client worker on `node` (SD clusters only). Its request slot is
    /// returned to the node when it is dropped.
    pub fn sd_client(&self, node: NodeId) -> Result<SdClient<LocalEndpoint>, Error> {
        self.require_mode("SD", matches!(self.plan.mode, Mode::Sd { .. }))?;
        match self.mode_client(node)? {
            ModeClient::Sd(c) => Ok(c),
            _ => unreachable!("an SD cluster makes SD clients"),
        }
    }

    /// A new hybrid client worker on `node` (HY clusters only).
    pub fn hy_client(&self, node: NodeId) -> Result<HyClient<LocalEndpoint>, Error> {
        self.require_mode("HY", matches!(self.plan.mode, Mode::Hy { .. }))?;
        match self.mode_client(node)? {
            ModeClient::Hy(c) => Ok(c),
            _ => unreachable!("an HY cluster makes HY clients"),
        }
    }

    /// A new Pilaf client worker on `node` (Pilaf clusters only).
    pub fn pilaf_client(&self, node: NodeId) -> Result<PilafClient<LocalEndpoint>, Error> {
        self.require_mode("Pilaf", matches!(self.plan.mode, Mode::Pilaf { .. }))?;
        match self.mode_client(node)? {
            ModeClient::Pilaf(c) => Ok(c),
            _ => unreachable!("a Pilaf cluster makes Pilaf clients"),
        }
    }

    /// The counters of `node`'s Pilaf store (moves, allocator), `None` outside Pilaf mode.
    pub fn pilaf_store_stats(&self, node: NodeId) -> Option<StoreStats> {
        let s = self.rpc.as_ref()?.pilaf.get(node as usize)?;
        Some(s.stats())
    }

    /// A new client worker of the cluster's mode on `node`.
    pub fn mode_client(&self, node: NodeId) -> Result<ModeClient<LocalEndpoint>, Error> {
        self.new_client(node, self.plan.mode, self.plan.cfg.clone())
    }

    /// Every client worker of the cluster is made here, through [`ModeClient::new`].
    fn new_client(
        &self,
        node: NodeId,
        mode: Mode,
        cfg: ProtocolConfig,
    ) -> Result<ModeClient<LocalEndpoint>, Error> {
        let table = self.checked_table(node)?;
        let slot = match mode {
            Mode::Cd => None,
            Mode::Sd { .. } | Mode::Hy { .. } | Mode::Pilaf { .. } => {
                Some(self.rpc_slot(node, mode)?)
            }
        };
        let ep = self.endpoint(node);
        self.plan
            .client_of(mode, ep, table, cfg, || self.worker_id(node), slot)
    }

    fn require_mode(&self, want: &str, ok: bool) -> Result<(), Error> {
        if ok {
            return Ok(());
        }
        Err(Error::Config(format!(
            "{want} clients need an {want} cluster; this one runs {}",
            self.plan.mode.name()
        )))
    }

    fn checked_table(&self, node: NodeId) -> Result<Arc<ClassTable>, Error> {
        let t = self
            .tables
            .get(node as usize)
            .map(|t| t.read().unwrap().clone());
        t.ok_or_else(|| {
            Error::Config(format!(
                "no node {node} in a cluster of {}",
                self.tables.len()
            ))
        })
    }

    /// A request slot on `node` for a client of `mode` (SD/HY clusters only).
    fn rpc_slot(&self, node: NodeId, mode: Mode) -> Result<sd::ClientSlot, Error> {
        let rpc = self.rpc.as_ref().ok_or_else(|| {
            Error::Config(format!(
                "{} clients need an SD/HY cluster; this one runs {}",
                mode.name().to_uppercase(),
                self.plan.mode.name()
            ))
        })?;
        rpc.pools[node as usize].take().ok_or_else(|| {
            Error::Config(format!(
                "node {node} has no free client slot (max_clients_per_node = {})",
                rpc.shared.layout.max_clients_per_node
            ))
        })
    }

    /// A new client worker of the cluster's mode on `node`, behind the key-value API.
    pub fn kv_client(&self, node: NodeId) -> Result<Box<dyn KvClient>, Error> {
        Ok(match self.mode_client(node)? {
            ModeClient::Cd(c) => Box::new(c),
            ModeClient::Sd(c) => Box::new(c),
            ModeClient::Hy(c) => Box::new(c),
            ModeClient::Pilaf(c) => Box::new(c),
        })
    }

    pub fn mode(&self) -> Mode {
        self.plan.mode
    }

    /// Server counters summed over `node`'s server threads (all nodes if `None`); zero for CD.
    pub fn server_stats(&self, node: Option<NodeId>) -> ServerStatsSnapshot {
        let mut t = ServerStatsSnapshot::default();
        for (n, s) in self.rpc.iter().flat_map(|r| r.stats.iter()) {
            if node.is_none_or(|want| want == *n) {
                t.add(&s.snapshot());
            }
        }
        t
    }

    /// Slot layout and liveness shared by this cluster's SD/HY clients and servers.
    pub fn rpc_shared(&self) -> Option<&Arc<RpcShared>> {
        self.rpc.as_ref().map(|r| &r.shared)
    }

    /// Stop and join the server threads (idempotent; dropping the cluster does it too). Clients
    /// waiting for a response, and later requests, fail with `Error::Unreachable`.
    pub fn stop_servers(&mut self) {
        if let Some(rpc) = self.rpc.as_mut() {
            rpc.stop.store(true, Ordering::Release);
            rpc.shared.set_stopped();
            for h in rpc.threads.drain(..) {
                if h.join().is_err() {
                    tracing::error!("a server thread panicked");
                }
            }
        }
    }

    /// Stop and join the reclaimer threads (idempotent; dropping the cluster does it too), so
    /// that nothing changes memory once the clients are done: tests compare the copies then.
    /// Returns how many had panicked (tests assert none did).
    pub fn stop_reclaimers(&mut self) -> usize {
        let all: Vec<_> = self
            .reclaimers
            .lock()
            .unwrap()
            .drain(..)
            .flatten()
            .collect();
        all.into_iter()
            .map(Self::stop_reclaimer)
            .filter(|&p| p)
            .count()
    }

    /// Number of server threads still running.
    pub fn running_server_threads(&self) -> usize {
        self.rpc
            .as_ref()
            .map_or(0, |r| r.threads.iter().filter(|h| !h.is_finished()).count())
    }

    pub fn fabric(&self) -> &Arc<InProcFabric> {
        &self.fabric
    }

    pub fn view(&self) -> &Arc<ClusterView> {
        &self.plan.view
    }

    /// Where the copies of each node's tables are, and the replication timings.
    /// Where every partition's copies are now (moves included: [`Self::replace_node`]).
    pub fn copy_map(&self) -> CopyMap {
        CopyMap::of(&self.set, &self.fences[0])
    }

    pub fn replica_set(&self) -> &Arc<ReplicaSet> {
        &self.set
    }

    pub fn table(&self, node: NodeId) -> Arc<ClassTable> {
        self.tables[node as usize].read().unwrap().clone()
    }

    pub fn config(&self) -> &ProtocolConfig {
        &self.plan.cfg
    }

    /// Count present ITEs across all index tables (reads memory through a fresh endpoint).
    pub fn index_occupancy(&self) -> Result<u64, Error> {
        use nessie_fabric::{Endpoint, RemoteAddr};
        let mut ep = self.endpoint(0);
        let g = &self.plan.view.geometry;
        let mut used = 0;
        for n in 0..g.nodes {
            for i in 0..g.ites_per_node {
                let w = ep.read_u64(RemoteAddr::new(n as NodeId, INDEX_REGION, i * 8))?;
                if !nessie_store::Ite(w).is_empty() {
                    used += 1;
                }
            }
        }
        Ok(used)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop_servers();
        self.stop_reclaimers();
    }
}
