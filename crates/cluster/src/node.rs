//! A node process (`nessie node --config FILE --id K`): registers its index and data tables with
//! UCX, publishes its fabric info through the bootstrap service, fetches every peer's, runs its
//! client workers (every node is also a client: it writes DTEs into its own data table) and
//! serves the admin socket until SIGTERM or SIGINT.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nessie_baselines::pilaf::PilafStore;
use nessie_baselines::sd::{ServerLoop, ServerStats, ServerStatsSnapshot, SlotPool};
use nessie_deploy::{Mode, ModeClient, NodeServer, Plan};
use nessie_fabric::delay::MaybeDelayed;
use nessie_fabric::inproc::DelayInjection;
use nessie_fabric::{Locality, OpKind};
use nessie_fabric_ucx::{UcxConfig, UcxEndpoint, UcxNode};
use nessie_membership::{ConfigHook, MembershipError, Monitor, NodeState, Policy, Replacing};
use nessie_protocols::{KvClient, ProtocolConfig};
use nessie_serve::pool::ClientPool;
use nessie_store::classtable::ClassTable;
use nessie_store::pages::PageWord;
use nessie_store::{DATA_REGION, INDEX_REGION, PAGE_REGION};

use crate::admin::{AdminServer, Handler, MigrateReply, MigrateRequest, Request, Response};
use crate::bootstrap::{self, BootstrapServer, NodeInfo};
use crate::config::{ClusterConfig, ConfigError, NodeEntry, Transport};
use crate::rundir::{PidFile, RunDir};
use nessie_protocols::{Fence, ReplicaSet, Replicated};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Bootstrap(#[from] bootstrap::BootstrapError),
    #[error("fabric: {0}")]
    Fabric(#[from] nessie_fabric::FabricError),
    #[error(transparent)]
    Dir(#[from] crate::rundir::DirError),
    /// A protocol error (e.g. a client refused by its constructor), kind kept.
    #[error(transparent)]
    Protocol(#[from] nessie_protocols::Error),
    #[error("node {node}: all {max} client slots are in use (cluster.max_clients_per_node)")]
    SlotsInUse { node: u16, max: u16 },
    #[error("node {node} published unreadable fabric info")]
    UnreadableFabricInfo { node: u16 },
    #[error("spawning {what}: {err}")]
    Spawn {
        what: &'static str,
        #[source]
        err: std::io::Error,
    },
    #[error("membership: {0}")]
    Membership(#[from] MembershipError),
    #[error("admin socket {path}: {err}")]
    AdminSocket {
        path: PathBuf,
        #[source]
        err: std::io::Error,
    },
    #[error(transparent)]
    Exposed(#[from] crate::exposure::Exposed),
    #[error("front end on {addr}: {err}")]
    Frontend {
        addr: std::net::SocketAddr,
        #[source]
        err: std::io::Error,
    },
}

/// Options that are not part of the shared configuration.
#[derive(Clone, Default)]
pub struct NodeOptions {
    /// Inject random delays around every fabric operation of this node's clients (tests).
    pub delay: Option<DelayInjection>,
    /// Serves EXTENSION admin requests (the benchmark agent).
    pub extension: Option<Arc<dyn NodeExtension>>,
    /// Mutation for tests: the front ends' pipelines let an operation start while another on
    /// its key runs (breaks same-key order, P1).
    pub mutation_unordered_batches: bool,
}

pub fn ucx_config(cfg: &ClusterConfig) -> UcxConfig {
    let transport = match cfg.cluster.transport {
        Transport::Shm => nessie_fabric_ucx::Transport::Shm,
        Transport::Tcp => nessie_fabric_ucx::Transport::Tcp,
        Transport::Auto => nessie_fabric_ucx::Transport::Auto,
    };
    let base = UcxConfig::new(transport);
    let wait_spin = match cfg.cluster.wait_spin_us {
        Some(us) => Some(std::time::Duration::from_micros(us)),
        None => base.wait_spin,
    };
    UcxConfig {
        wait_spin,
        net_devices: cfg.cluster.net_devices.clone(),
        op_timeout: std::time::Duration::from_millis(cfg.cluster.op_timeout_ms),
        huge_pages: cfg.cluster.huge_pages,
        progress_spin: std::time::Duration::from_micros(cfg.cluster.progress_spin_us),
        direct_loopback: cfg.cluster.direct_loopback,
        direct_peers: cfg.cluster.direct_peers,
        ..base
    }
}

/// Everything a node process has, for its own client workers and for extensions (the
/// benchmark agent) that need to create clients or read counters.
pub struct NodeContext {
    pub id: u16,
    pub cfg: ClusterConfig,
    pub mode: Mode,
    pub started: Instant,
    ucx: Arc<UcxNode>,
    fabric_infos: Vec<nessie_fabric_ucx::NodeInfo>,
    /// The cluster's plan: the view, the protocol configuration, the shared request slots.
    plan: Plan,
    table: Arc<ClassTable>,
    /// SD/HY/Pilaf: the request slots this node leases to its clients.
    slots: Option<Arc<SlotPool>>,
    next_worker: AtomicU32,
    next_stream: AtomicU64,
    delay: Option<DelayInjection>,
    servers: Vec<Arc<ServerStats>>,
    /// This node's etcd registration and membership monitor (`[membership]` configured).
    membership: Option<Monitor>,
    /// The membership view its client-driven workers obey (fed by `membership`).
    fence: Arc<Fence>,
    /// Where the copies of every node's tables are (`cluster.replicas`).
    replicas: Arc<ReplicaSet>,
    /// Pilaf mode: this node's store, which its server threads execute writes on.
    pilaf: Option<Arc<PilafStore>>,
    /// What the reclaimer of expired items has done (client-driven mode, once it runs).
    expiry: std::sync::OnceLock<Arc<nessie_serve::expire::Totals>>,
    /// Pages this node adopted from nodes failed for good (`crate::rejoin`).
    pub adopted_pages: AtomicU64,
    /// Bytes this node read filling copies moved to it (`crate::rejoin`, re-replication and
    /// leaving nodes), and index entries it installed handing partitions over: what moved in.
    pub moved_in_fill_bytes: AtomicU64,
    pub moved_in_handed_entries: AtomicU64,
    /// Starts of migrations running on this node (its balancer, or `nessie migrate` through
    /// its admin socket): while any runs, its reservations are not stale.
    starting: AtomicU32,
}

/// How old a reservation of this node that no start of it writes must be before its
/// balancer gives it up (`NodeContext::cancel_stale_reservations`): far longer than a start
/// (a batch of pending writes) takes.
pub const STALE_RESERVATION_NS: u64 = 60_000_000_000;

/// One start of migrations running, for [`NodeContext::starting`].
struct Starting<'a>(&'a AtomicU32);

impl<'a> Starting<'a> {
    fn new(n: &'a AtomicU32) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Self(n)
    }
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A client worker of a node process, in the cluster's protocol.
pub type NodeClient = ModeClient<NodeEndpoint>;

/// The endpoint of every worker of a node process: UCX, with delays injected if asked, and
/// replicated as the cluster is.
pub type NodeEndpoint = Replicated<MaybeDelayed<UcxEndpoint>>;

/// A pipeline of client workers of a node process (`NodeContext::pipeline`): its slots share
/// this endpoint, each replicated above it.
pub type NodePipeline = nessie_inflight::Pipeline<MaybeDelayed<UcxEndpoint>>;

/// The client of one slot of a [`NodePipeline`].
pub type SlotClient =
    ModeClient<Replicated<nessie_inflight::PipelineEndpoint<MaybeDelayed<UcxEndpoint>>>>;

impl NodeContext {
    pub(crate) fn endpoint(&self) -> Result<NodeEndpoint, NodeError> {
        let ep = self.ucx.endpoint(&self.fabric_infos)?;
        let ep = MaybeDelayed::new(
            ep,
            self.delay.clone(),
            self.next_stream.fetch_add(1, Ordering::Relaxed),
        );
        Ok(Replicated::new(
            ep,
            self.replicas.clone(),
            self.fence.clone(),
        ))
    }

    fn worker_id(&self) -> Result<u16, nessie_protocols::Error> {
        let w = self.next_worker.fetch_add(1, Ordering::Relaxed);
        u16::try_from(w).map_err(|_| {
            nessie_protocols::Error::Config(format!("node {} has run out of worker ids", self.id))
        })
    }

    /// A new client worker of the cluster's protocol with protocol configuration `pcfg`
    /// (e.g. with some optimisations switched off).
    pub fn client(&self, pcfg: &ProtocolConfig) -> Result<NodeClient, NodeError> {
        self.client_over(self.endpoint()?, pcfg)
    }

    /// A client worker of the cluster's protocol over `ep` (this node's endpoint, replicated
    /// as the cluster is): its request slot leased, its worker id taken, the fence set.
    fn client_over<E: nessie_fabric::Endpoint>(
        &self,
        ep: E,
        pcfg: &ProtocolConfig,
    ) -> Result<ModeClient<E>, NodeError> {
        let slot = match &self.slots {
            None => None,
            Some(pool) => Some(pool.take().ok_or(NodeError::SlotsInUse {
                node: self.id,
                max: self.cfg.cluster.max_clients_per_node,
            })?),
        };
        let (table, cfg) = (self.table.clone(), pcfg.clone());
        let mut client = self
            .plan
            .client(ep, table, cfg, || self.worker_id(), slot)?;
        if let ModeClient::Cd(c) = &mut client {
            c.set_fence(self.fence.clone());
        }
        Ok(client)
    }

    /// A pipeline of `slots` client workers of the cluster's protocol on this thread
    /// (`nessie_inflight`): each slot a client over its own replicated endpoint, all sharing
    /// one UCX worker, with `slots` operations in flight at once. Build it on the thread that
    /// uses it (it is not `Send`).
    pub fn pipeline(&self, pcfg: &ProtocolConfig, slots: usize) -> Result<NodePipeline, NodeError> {
        self.pipeline_of(pcfg, nessie_inflight::PipelineOptions::new(slots), |c| c)
    }

    /// [`Self::pipeline`], each slot's client wrapped by `wrap` (the front ends' large-value
    /// layer and metrics, as their pool's clients have).
    pub fn pipeline_of<C: KvClient + 'static>(
        &self,
        pcfg: &ProtocolConfig,
        opts: nessie_inflight::PipelineOptions,
        wrap: impl Fn(SlotClient) -> C,
    ) -> Result<NodePipeline, NodeError> {
        let base = MaybeDelayed::new(
            self.ucx.endpoint(&self.fabric_infos)?,
            self.delay.clone(),
            self.next_stream.fetch_add(1, Ordering::Relaxed),
        );
        let p = nessie_inflight::Pipeline::new(base, opts, |_, ep| {
            let ep = Replicated::new(ep, self.replicas.clone(), self.fence.clone());
            self.client_over(ep, pcfg).map(&wrap).map_err(|e| match e {
                NodeError::Protocol(e) => e,
                e => nessie_protocols::Error::Config(e.to_string()),
            })
        })?;
        Ok(p)
    }

    /// This node's allocator.
    pub fn table(&self) -> &Arc<ClassTable> {
        &self.table
    }

    /// The membership view its workers obey.
    pub fn fence(&self) -> &Arc<Fence> {
        &self.fence
    }

    /// Where the copies of every node's tables are.
    pub fn replica_set(&self) -> &ReplicaSet {
        &self.replicas
    }

    /// Start migrating an index partition as `body` (a JSON [`MigrateRequest`]) asks: reserve
    /// a free index slot on each node of the new chain (one epoch), write every entry of the
    /// slots pending, then start the migration (the next epoch). The chain's first node then
    /// hands the entries over (`rejoin.rs`). Errors name what is wrong.
    pub fn start_migration(&self, body: &[u8]) -> Result<MigrateReply, String> {
        let req: MigrateRequest = serde_json::from_slice(body)
            .map_err(|e| format!("malformed migration request: {e}"))?;
        let set = self.replica_set();
        let parts = set.index_partitions().ok_or_else(|| {
            "this cluster keeps no index slots ([cluster] index_slots = 0, or one copy)".to_string()
        })?;
        if req.partition as u32 >= parts.count() {
            return Err(format!(
                "partition {} is not in 0..{}",
                req.partition,
                parts.count()
            ));
        }
        let mut distinct = req.to.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if req.to.len() != set.replicas() as usize || distinct.len() != req.to.len() {
            return Err(format!(
                "a chain needs {} distinct nodes (the cluster keeps {} copies); {:?} given",
                set.replicas(),
                set.replicas(),
                req.to
            ));
        }
        let (epoch, mut started) = self.start_migrations(&[(req.partition, req.to.clone())])?;
        let (_, copies) = started.pop().ok_or_else(|| {
            format!(
                "partition {} could not start migrating (a node of its chain is no longer up)",
                req.partition
            )
        })?;
        Ok(MigrateReply { epoch, copies })
    }

    /// Start migrating each partition of `plan` to its chain of nodes (primary first), this
    /// node the starter: reserve slots for all in one epoch, write each reserved chain's slots
    /// pending, and start in one more epoch those whose writes succeeded (the others are given
    /// up). Partitions that cannot be reserved now are left out. Returns the epoch that
    /// started them and the chains of slots they migrate to.
    pub fn start_migrations(
        &self,
        plan: &[(u16, Vec<u16>)],
    ) -> Result<(u64, Vec<nessie_membership::Reserved>), String> {
        let m = self
            .membership()
            .ok_or("migrations go through membership (etcd); this cluster runs without")?;
        let set = self.replica_set();
        let _starting = Starting::new(&self.starting);
        let (reserved, at) = m
            .reserve_migrations(self.id, plan, set.index_slots(), set.join_settle_ns())
            .map_err(|e| e.to_string())?;
        self.start_reserved(m, reserved, at)
    }

    /// One look of the balancer (`rejoin.rs`): if this node is the lowest up one, reserve
    /// what the plan on the configuration in force moves and start it. `Ok(Err(why))`:
    /// nothing to move now. A node failed for `replace_after_ns` is gone for good.
    pub fn balance_once(
        &self,
        replace_after_ns: u64,
    ) -> Result<Result<(u64, Vec<nessie_membership::Reserved>), String>, String> {
        let m = self
            .membership()
            .ok_or("the balancer needs membership (etcd)")?;
        let _starting = Starting::new(&self.starting);
        // Nodes up again whose pause this node's fence ended early, every node having said
        // it knows them up (`Fence::settle_join_by`): not held any more. (A node's own fence
        // merely having passed the pause is not enough: others learnt later.)
        let settled = m.settled_comebacks();
        match m.reserve_balance(self.id, self.replica_set(), replace_after_ns, &settled) {
            Ok(Ok((reserved, at))) => self.start_reserved(m, reserved, at).map(Ok),
            Ok(Err(why)) => Ok(Err(why)),
            Err(nessie_membership::StartMigrationError::Refused(
                nessie_membership::MigrationError::NotBalancer(_),
            )) => Ok(Err("not the lowest up node".into())),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Give up this node's own reservations that no start of it is writing (leaked: a start
    /// whose confirm and cancel both failed, or whose reply etcd lost), once older than
    /// [`STALE_RESERVATION_NS`]. Only while none runs: a start that begins after the check
    /// reserves later than the cut, so its reservation is not among them.
    pub fn cancel_stale_reservations(&self) {
        let Some(m) = self.membership() else { return };
        if self.starting.load(Ordering::SeqCst) != 0 {
            return;
        }
        let Some(c) = m.view().config else { return };
        let cut = nessie_fabric::wall_clock_ns().saturating_sub(STALE_RESERVATION_NS);
        let mut stale: std::collections::BTreeMap<u64, Vec<nessie_membership::Reserved>> =
            Default::default();
        for ch in c.index_chains.iter() {
            if !ch.prepared && ch.starter == self.id && ch.since_ns < cut {
                stale
                    .entry(ch.since_ns)
                    .or_default()
                    .push((ch.partition, ch.copies.clone()));
            }
        }
        for (at, reserved) in stale {
            eprintln!(
                "nessie node {}: giving up {} reservations left since {at} (no start writes them)",
                self.id,
                reserved.len()
            );
            if let Err(e) = m.cancel_migrations(self.id, &reserved, at) {
                tracing::warn!(%e, "could not give up stale reservations");
            }
        }
    }

    /// Write the slots of `reserved` (made at `at`) pending and start the migrations whose
    /// writes succeeded; give up the others (and all, if the start fails).
    fn start_reserved(
        &self,
        m: &Monitor,
        reserved: Vec<nessie_membership::Reserved>,
        at: u64,
    ) -> Result<(u64, Vec<nessie_membership::Reserved>), String> {
        let mut ep = match self.endpoint() {
            Ok(ep) => ep,
            Err(e) => {
                let _ = m.cancel_migrations(self.id, &reserved, at);
                return Err(e.to_string());
            }
        };
        let (mut written, mut failed) = (Vec::new(), Vec::new());
        let mut why = None;
        for (q, copies) in reserved {
            // The reservation holds while this node is up: a node whose lease may lapse
            // before the writes end writes nothing (its reservations go with it, and the
            // slots to the next migration a settle time later).
            if !self.fence.may_act(
                nessie_fabric::monotonic_ns(),
                self.cfg.protocol_config().expiry_ns,
            ) {
                why.get_or_insert("this node may not act (its membership lease may lapse)".into());
                failed.push((q, copies));
                continue;
            }
            let fence_copies: Vec<_> = copies
                .iter()
                .map(|c| nessie_protocols::fence::IndexCopy {
                    node: c.node,
                    slot: c.slot,
                    receiving: false,
                })
                .collect();
            match ep.write_pending(q, &fence_copies) {
                Ok(()) => written.push((q, copies)),
                Err(e) => {
                    why.get_or_insert(format!(
                        "writing the new slots of partition {q} pending: {e}"
                    ));
                    failed.push((q, copies));
                }
            }
        }
        if !failed.is_empty() {
            if let Err(c) = m.cancel_migrations(self.id, &failed, at) {
                tracing::warn!(%c, "could not give up reservations; they go when this node fails");
            }
        }
        if written.is_empty() {
            return Err(why.unwrap_or_else(|| "nothing reserved".into()));
        }
        let (epoch, started) = match m.confirm_migrations(self.id, &written, at) {
            Ok(s) => s,
            Err(e) => {
                if let Err(c) = m.cancel_migrations(self.id, &written, at) {
                    tracing::warn!(%c, "could not give up reservations; this node's balancer gives them up later");
                }
                return Err(e.to_string());
            }
        };
        written.retain(|(q, _)| started.contains(q));
        for (q, copies) in &written {
            tracing::info!(
                node = self.id,
                partition = q,
                ?copies,
                epoch,
                "partition migrating"
            );
        }
        if written.len() <= 4 {
            for (q, copies) in &written {
                eprintln!(
                    "nessie node {}: partition {q} migrating to {copies:?} (epoch {epoch})",
                    self.id
                );
            }
        } else {
            eprintln!(
                "nessie node {}: {} partitions migrating (epoch {epoch})",
                self.id,
                written.len()
            );
        }
        Ok((epoch, written))
    }

    /// This node's membership monitor (`None` without `[membership]`).
    pub fn membership(&self) -> Option<&Monitor> {
        self.membership.as_ref()
    }

    /// The protocol configuration of the cluster.
    pub fn protocol_config(&self) -> ProtocolConfig {
        self.cfg.protocol_config()
    }

    /// Fabric counters of every endpoint of this node (clients, servers).
    pub fn fabric_stats(&self) -> nessie_fabric::StatsSnapshot {
        self.ucx.stats().total(Some(self.id))
    }

    /// Server-thread counters of this node (zero in cd mode).
    pub fn server_stats(&self) -> ServerStatsSnapshot {
        let mut t = ServerStatsSnapshot::default();
        for s in &self.servers {
            t.add(&s.snapshot());
        }
        t
    }

    pub fn geometry(&self) -> &nessie_store::Geometry {
        &self.cfg.geometry
    }

    /// Fill of the data tables: this node's own pages (claimed by any node), and the pages and
    /// entries of each size class its writers hold, here and on other nodes.
    fn data_table_status(&self) -> serde_json::Value {
        let pages = self.table.pages_per_node();
        let words = self.ucx.region(PAGE_REGION).expect("page table region");
        let mut claimed = 0u64;
        let mut w = [0u8; 8];
        for p in 0..pages {
            // A status snapshot: a plain read of our own memory is good enough here.
            if words.read(p * 8, &mut w).is_ok() && PageWord(u64::from_le_bytes(w)).is_claimed() {
                claimed += 1;
            }
        }
        let counters = self.table.counters();
        let usage = self.table.usage();
        let classes: Vec<serde_json::Value> = usage
            .iter()
            .enumerate()
            .filter(|(_, u)| u.pages > 0)
            .map(|(c, u)| {
                serde_json::json!({
                    "class": c, "entry_size": u.entry_size, "pages": u.pages,
                    "remote_pages": u.remote_pages, "in_use": u.in_use, "free": u.free,
                })
            })
            .collect();
        serde_json::json!({
            "pages": pages,
            "page_bytes": self.table.classes().page_bytes(),
            "pages_claimed": claimed,
            "allocated": usage.iter().map(|u| u.in_use).sum::<u64>(),
            "entry_bytes": usage.iter().map(|u| u.in_use * u.entry_size).sum::<u64>(),
            "reclaimed_total": counters.reclaimed_total,
            "scans": counters.scans,
            "room_scans": counters.room_scans,
            "evictions": self.table.evictions(),
            "pages_moved": counters.pages_drained,
            "adopted_pages": self.adopted_pages.load(Ordering::Relaxed),
            "expiry_reclaimer": self.expiry.get().map(|t| {
                let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
                serde_json::json!({
                    "sweeps": n(&t.sweeps), "share_slots": n(&t.share_slots), "expired": n(&t.expired),
                    "deleted": n(&t.deleted), "failed_cycles": n(&t.failed_cycles),
                })
            }),
            "classes": classes,
        })
    }

    /// Fill of this node's index and data tables (metrics).
    pub fn fill(&self) -> Fill {
        let d = self.data_table_status();
        let n = |k: &str| d[k].as_u64().unwrap_or(0);
        Fill {
            ites: self.cfg.geometry.ites_per_node,
            present: self.present_in(INDEX_REGION),
            allocated: n("allocated"),
            entry_bytes: n("entry_bytes"),
            pages: n("pages"),
            page_bytes: n("page_bytes"),
            pages_claimed: n("pages_claimed"),
        }
    }

    /// The epoch, fence and node states this node last read from etcd (`None` without
    /// membership).
    /// What this node's reclaimer of expired items has done (client-driven mode, once it
    /// runs).
    pub fn expiry_totals(&self) -> Option<&Arc<nessie_serve::expire::Totals>> {
        self.expiry.get()
    }

    pub fn membership_snapshot(&self) -> Option<MembershipSnapshot> {
        let m = self.membership.as_ref()?;
        let v = m.view();
        let mut nodes_by_state: Vec<(String, u64)> = Vec::new();
        for member in v.config.as_ref().map_or(&[][..], |c| &c.nodes[..]) {
            let state = member.state.as_str().to_string();
            match nodes_by_state.iter_mut().find(|(s, _)| *s == state) {
                Some((_, n)) => *n += 1,
                None => nodes_by_state.push((state, 1)),
            }
        }
        Some(MembershipSnapshot {
            epoch: v.config.as_ref().map_or(0, |c| c.epoch),
            may_write: m.may_write(),
            nodes_by_state,
        })
    }

    /// Present ITEs in one of the index tables this node holds (its own, or a copy of
    /// another node's).
    fn present_in(&self, region: nessie_fabric::RegionId) -> u64 {
        let index = self.ucx.region(region).expect("index region");
        let mut present = 0u64;
        let mut w = [0u8; 8];
        for i in 0..self.cfg.geometry.ites_per_node {
            // A status snapshot: a plain read of our own memory is good enough here.
            if index.read(i * 8, &mut w).is_ok()
                && !nessie_store::Ite(u64::from_le_bytes(w)).is_empty()
            {
                present += 1;
            }
        }
        present
    }

    fn status(&self) -> serde_json::Value {
        let data_table = self.data_table_status();
        let present = self.present_in(INDEX_REGION);
        // The copies held here, moved ones included, as the last configuration read says.
        let config = self.membership.as_ref().and_then(|m| m.view().config);
        let map = match &config {
            Some(c) => c.copy_map(&self.replicas),
            None => nessie_protocols::replica::CopyMap::home(&self.replicas),
        };
        let copies: Vec<_> = map
            .held_by(self.id)
            .into_iter()
            .map(|(partition, j)| {
                let slot = map.place(partition, j).slot;
                let receiving = config.as_ref().is_some_and(|c| {
                    c.moves
                        .iter()
                        .any(|m| (m.partition, m.copy) == (partition, j) && m.receiving)
                });
                serde_json::json!({
                    "partition": partition,
                    "copy": j,
                    "slot": slot,
                    "receiving": receiving,
                    "present": self.present_in(nessie_protocols::replica::mirror_region(INDEX_REGION, slot)),
                })
            })
            .collect();
        let s = self.fabric_stats();
        let mut fabric = serde_json::Map::new();
        for loc in Locality::ALL {
            for kind in OpKind::ALL {
                let name = format!(
                    "{}_{}",
                    format!("{loc:?}").to_lowercase(),
                    format!("{kind:?}").to_lowercase()
                );
                fabric.insert(format!("{name}_ops"), s.ops(kind, loc).into());
                fabric.insert(format!("{name}_bytes"), s.bytes(kind, loc).into());
            }
        }
        let sv = self.server_stats();
        serde_json::json!({
            "node": self.id,
            "pid": std::process::id(),
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "transport": format!("{:?}", self.cfg.cluster.transport).to_lowercase(),
            "mode": self.mode.name(),
            "server_threads": self.mode.server_threads(),
            "server_requests": sv.requests,
            "workers": self.cfg.node_entry(self.id).map(|n| n.workers).unwrap_or(0),
            "index": { "entries": self.cfg.geometry.ites_per_node, "present": present },
            "replicas": self.replicas.replicas(),
            "copies": copies,
            "moved_in": {
                "fill_bytes": self.moved_in_fill_bytes.load(Ordering::Relaxed),
                "handed_entries": self.moved_in_handed_entries.load(Ordering::Relaxed),
            },
            "data_table": data_table,
            "fabric": fabric,
            "huge_pages": self.cfg.cluster.huge_pages.to_string(),
            "pages": {
                "index": self.ucx.region_backing(INDEX_REGION),
                "data_table": self.ucx.region_backing(DATA_REGION),
            },
            "membership": self.membership_status(),
        })
    }

    /// The epoch and states this node last read from etcd, and whether etcd answers.
    fn membership_status(&self) -> serde_json::Value {
        let Some(m) = &self.membership else {
            return serde_json::Value::Null;
        };
        let v = m.view();
        serde_json::json!({
            "etcd": v.etcd_url,
            "etcd_error": v.etcd_error,
            "lease_ttl_s": v.lease_ttl_s,
            "epoch": v.config.as_ref().map(|c| c.epoch),
            "may_write": m.may_write(),
            "nodes": v.config.as_ref().map(|c| &c.nodes),
            "moves": v.config.as_ref().map(|c| &c.moves),
        })
    }
}

/// Register node `id` in the configured etcd and start its membership monitor, feeding `fence`.
fn start_membership(
    cfg: &ClusterConfig,
    id: u16,
    replicas: &ReplicaSet,
    fence: Arc<Fence>,
    on_config: ConfigHook,
) -> Result<Option<Monitor>, NodeError> {
    let Some(m) = &cfg.membership else {
        return Ok(None);
    };
    let etcd = m
        .client(crate::config::ETCD_TIMEOUT)
        .map_err(MembershipError::from)?;
    // A failed node joins again only once every node has learnt of the failure (within a
    // TTL) and its copies' deciding has moved on (the settle time after that).
    let hold_ns = (m.lease_ttl_s * 1_000_000_000).saturating_add(replicas.settle_ns());
    // Copies move only where there is room for them.
    let replacing = (!replicas.spare_slots().is_empty()).then(|| Replacing {
        after_ns: m.replace_after_s.saturating_mul(1_000_000_000),
        set: replicas.clone(),
    });
    Ok(Some(Monitor::start(
        etcd,
        cfg.membership_keys(),
        id,
        m.lease_ttl_s,
        Policy {
            hold_ns,
            clock_margin_ns: cfg.protocol_config().clock_margin_ns,
            replacing,
            migration_settle_ns: replicas.join_settle_ns(),
            migration_end_ns: replicas
                .op_ns()
                .saturating_add(cfg.protocol_config().clock_margin_ns),
            join_settle_ns: replicas.join_settle_ns(),
            op_ns: replicas.op_ns(),
            fenced_before_epoch_1: !cfg.cluster.standby.is_empty(),
        },
        fence,
        Some(on_config),
    )?))
}

/// How long a node waits for a restarted peer's bootstrap server to answer. The fetch runs in
/// the membership monitor's thread, which must keep its own lease alive meanwhile.
const PEER_FETCH_TIMEOUT: Duration = Duration::from_millis(500);
/// Least time between two fetches from a restarted peer that did not answer.
const PEER_FETCH_RETRY: Duration = Duration::from_secs(2);

/// Least time between two renewals of the connections to a peer membership says is up
/// (`UcxNode::renew_peer`): an endpoint whose connection to it broke (this node or the peer was
/// stopped past the operation timeout, a TCP connection reset) connects again at its next
/// operation to it, paying at most one operation timeout per period if the peer is still
/// unresponsive.
const PEER_RENEW_PERIOD: Duration = Duration::from_secs(2);

/// The membership hook of node `id`: whenever a peer's incarnation changes (it joined again
/// after a restart), fetch its new fabric info from its bootstrap server and have every
/// endpoint of this node reconnect to it, before the configuration that says so is applied.
/// If the peer does not answer, operations to it fail until it does (never through the old
/// connection, which on shared memory would reach the dead process's memory). Failed peers
/// are left alone: nobody reads or writes their memory. Peers that did not restart and are
/// not failed, and this node itself, get their broken connections renewed every
/// `PEER_RENEW_PERIOD`.
fn reconnect_restarted_peers(cfg: &ClusterConfig, id: u16, ucx: Arc<UcxNode>) -> ConfigHook {
    let cfg = cfg.clone();
    // Per node: the incarnation connected to, and when a fetch last failed.
    let seen = std::sync::Mutex::new(vec![(0u64, None::<Instant>); cfg.node.len()]);
    let renewed = std::sync::Mutex::new(Instant::now());
    Box::new(move |c: &nessie_membership::Configuration| {
        let mut seen = seen.lock().expect("peer incarnations lock");
        let renew = {
            let mut last = renewed.lock().expect("renewal clock lock");
            let due = last.elapsed() >= PEER_RENEW_PERIOD;
            if due {
                *last = Instant::now();
            }
            due
        };
        if renew {
            // Loopback operations go through the fabric too, and time out like any other
            // when this process was stopped.
            ucx.renew_peer(id);
        }
        for m in &c.nodes {
            let n = m.id as usize;
            if m.id == id || m.state == NodeState::Failed || n >= seen.len() {
                continue;
            }
            if seen[n].0 == m.joined_ns || m.joined_ns == 0 {
                // The process we are connected to (or the one started with the cluster).
                if renew {
                    ucx.renew_peer(m.id);
                }
                continue;
            }
            if seen[n].1.is_some_and(|t| t.elapsed() < PEER_FETCH_RETRY) {
                continue;
            }
            match fetch_peer(&cfg, id, m.id) {
                Ok(info) => {
                    tracing::info!(node = id, peer = m.id, "reconnecting to a restarted peer");
                    ucx.set_peer(m.id, Some(info));
                    seen[n] = (m.joined_ns, None);
                }
                Err(e) => {
                    tracing::warn!(node = id, peer = m.id, %e, "a restarted peer's fabric info is not available yet");
                    ucx.set_peer(m.id, None);
                    seen[n].1 = Some(Instant::now());
                }
            }
        }
    })
}

/// Fetch node `peer`'s fabric info from its bootstrap server (checking it runs our
/// configuration).
fn fetch_peer(
    cfg: &ClusterConfig,
    id: u16,
    peer: u16,
) -> Result<nessie_fabric_ucx::NodeInfo, String> {
    let entry = cfg.node_entry(peer).map_err(|e| e.to_string())?;
    let secret = cfg.secret_bytes().map_err(|e| e.to_string())?;
    let clock = bootstrap::clock::Clock::from_env().map_err(|e| e.to_string())?;
    let deadline = Instant::now() + PEER_FETCH_TIMEOUT;
    let got = bootstrap::fetch(entry.bootstrap, &secret, id, peer, &clock, deadline)
        .map_err(|e| e.to_string())?;
    if got.info.config_fingerprint != cfg.fingerprint() {
        return Err(format!("node {peer} runs another configuration"));
    }
    decode_fabric(&got.info).map_err(|e| e.to_string())
}

fn decode_fabric(i: &NodeInfo) -> Result<nessie_fabric_ucx::NodeInfo, NodeError> {
    hex::decode(&i.fabric)
        .ok()
        .and_then(|b| serde_json::from_slice::<nessie_fabric_ucx::NodeInfo>(&b).ok())
        .ok_or(NodeError::UnreadableFabricInfo { node: i.node })
}

/// Handles admin requests a node does not know itself (op EXTENSION), e.g. the benchmark agent.
pub trait NodeExtension: Send + Sync + 'static {
    fn handle(&self, node: &Arc<NodeContext>, body: &[u8]) -> Response;
}

struct NodeHandler {
    ctx: Arc<NodeContext>,
    pool: ClientPool,
    extension: Option<Arc<dyn NodeExtension>>,
}

impl Handler for NodeHandler {
    fn handle_evicting(&self, req: Request) -> (Response, crate::admin::Evictions) {
        let none = crate::admin::Evictions::new;
        match req {
            Request::Ping => (Response::Ok, none()),
            Request::Status => (Response::Status(self.ctx.status().to_string()), none()),
            Request::StepDown => match self.ctx.membership() {
                Some(m) => {
                    m.step_down();
                    eprintln!(
                        "nessie node {}: stepped down from membership (leaving); it no longer acts",
                        self.ctx.id
                    );
                    (Response::Ok, none())
                }
                None => (
                    Response::Error("this node runs without membership".into()),
                    none(),
                ),
            },
            Request::Migrate(body) => match self.ctx.start_migration(&body) {
                Ok(reply) => (
                    Response::Status(serde_json::to_string(&reply).expect("serialises")),
                    none(),
                ),
                Err(e) => (Response::Error(e), none()),
            },
            Request::Extension(body) => match &self.extension {
                Some(x) => (x.handle(&self.ctx, &body), none()),
                None => (
                    Response::Error("this node runs no extension".into()),
                    none(),
                ),
            },
            r => crate::admin::serve_pooled(&self.pool, r),
        }
    }
}

/// Block the signals we wait for, before any thread is spawned, so they reach `sigwait`.
fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-mask calls on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// How long an orderly shutdown may take after a stop signal before the node exits anyway
/// (a stop must take less than a second).
const SHUTDOWN_GRACE: Duration = Duration::from_millis(700);

/// Wait for a stop signal on a thread of its own, so a node stops whatever it is doing. A node
/// still starting (e.g. waiting for peers that will never come) exits at once; a serving node
/// gets the signal on the returned channel and [`SHUTDOWN_GRACE`] to shut down in order.
fn watch_signals(
    set: libc::sigset_t,
    id: u16,
    serving: Arc<AtomicBool>,
    pid_file: PathBuf,
) -> Result<mpsc::Receiver<libc::c_int>, NodeError> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("nessie-signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` was initialised by block_signals.
            while unsafe { libc::sigwait(&set, &mut sig) } != 0 {}
            eprintln!("nessie node {id}: stopping (signal {sig})");
            let code = if serving.load(Ordering::SeqCst) {
                let _ = tx.send(sig);
                std::thread::sleep(SHUTDOWN_GRACE);
                eprintln!("nessie node {id}: no orderly stop after {SHUTDOWN_GRACE:?}; exiting");
                1
            } else {
                0
            };
            // Our pid file is locked by us, so nobody else can have replaced it.
            let _ = std::fs::remove_file(&pid_file);
            // SAFETY: ends the process without running destructors that could block.
            unsafe { libc::_exit(code) }
        })
        .map_err(|err| NodeError::Spawn {
            what: "the signal thread",
            err,
        })?;
    Ok(rx)
}

/// Run node `id` of the cluster described by `config_path` until it is told to stop.
/// Fill of a node's tables, for its metrics.
pub struct Fill {
    /// Index entries of this node's index table.
    pub ites: u64,
    /// Of them, in use.
    pub present: u64,
    /// Data entries this node's writers hold (here and on other nodes).
    pub allocated: u64,
    /// Their bytes (whole entries, metadata and slack included).
    pub entry_bytes: u64,
    /// Pages of this node's data table.
    pub pages: u64,
    pub page_bytes: u64,
    /// Of the pages, claimed by a size class.
    pub pages_claimed: u64,
}

/// What a node last read of the membership, for its metrics.
pub struct MembershipSnapshot {
    pub epoch: u64,
    pub may_write: bool,
    pub nodes_by_state: Vec<(String, u64)>,
}

/// Step the system wall clock as this process reads it, when a test asks
/// (`bootstrap::clock::TEST_WALL_STEP_ENV`), and say so in the log.
fn step_wall_clock_for_tests(id: u16) -> Result<(), NodeError> {
    let step = bootstrap::clock::test_wall_step(id).map_err(bootstrap::BootstrapError::from)?;
    if let Some((after_ms, step_ms)) = step {
        std::thread::Builder::new()
            .name("test-wall-step".into())
            .spawn(move || {
                std::thread::sleep(Duration::from_millis(after_ms));
                nessie_fabric::step_system_clock_for_tests(step_ms.saturating_mul(1_000_000));
                eprintln!("nessie node {id}: test: system wall clock stepped by {step_ms} ms");
            })
            .map_err(|err| NodeError::Spawn {
                what: "the test wall-clock step",
                err,
            })?;
    }
    Ok(())
}

pub fn run_node(config_path: &Path, id: u16, opts: NodeOptions) -> Result<(), NodeError> {
    let signals = block_signals();
    // Every file and socket the node creates is its owner's only, from the moment it exists.
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(0o077) };
    let cfg = ClusterConfig::load(config_path)?;
    let entry = cfg.node_entry(id)?.clone();
    // Before anything listens or is registered (TB1).
    crate::exposure::check(&cfg, id)?;
    let base = config_path.parent().unwrap_or(Path::new("."));
    RunDir::open(base, false)?;
    let pid_path = base.join(format!("node-{id}.pid"));
    let _pid_file = PidFile::acquire(&pid_path, id)?;
    let serving = Arc::new(AtomicBool::new(false));
    let stop_signal = watch_signals(signals, id, serving.clone(), pid_path)?;
    let admin_path = cfg.admin_path(id, base)?;
    step_wall_clock_for_tests(id)?;

    // Serves our fabric info for as long as the node runs.
    let (mut ctx, _bootstrap) = join_cluster(cfg, &entry, opts.delay.clone())?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut server_threads = start_servers(&mut ctx, &stop)?;
    let hook = reconnect_restarted_peers(&ctx.cfg, id, ctx.ucx.clone());
    ctx.membership = start_membership(&ctx.cfg, id, &ctx.replicas, ctx.fence.clone(), hook)?;
    // After membership: the reclaimer takes the fence only if the node has membership (found
    // by review: started before, it never checked the fence).
    // Pilaf's servers manage their own extents: no data table to reclaim.
    if ctx.pilaf.is_none() {
        server_threads.push(start_reclaimer(&ctx, &stop)?);
    }
    let ctx = Arc::new(ctx);
    server_threads.extend(crate::rejoin::spawn(&ctx, &stop)?);
    // The front ends and the metrics listen before the admin socket answers, which is what
    // `up` waits for.
    let ops = Arc::new(nessie_serve::metered::OpMetrics::default());
    let (frontends, expire) = serve_frontends(&ctx, id, entry.workers, &ops, &opts)?;
    let metrics = serve_metrics(&ctx, id, &ops, &frontends)?;
    let admin = serve_admin(
        &ctx,
        entry.workers,
        &admin_path,
        opts.extension.clone(),
        &ops,
    )?;
    let also: String = frontends
        .iter()
        .map(|f| format!(", {} on {}", f.name(), f.addr()))
        .chain(
            metrics
                .iter()
                .map(|m| format!(", metrics on http://{}/metrics", m.addr())),
        )
        .collect();
    tracing::info!(node = id, admin = %admin_path.display(), "ready");
    eprintln!(
        "nessie node {id}: ready ({} mode, admin socket {}{also})",
        ctx.mode.name(),
        admin_path.display()
    );

    serving.store(true, Ordering::SeqCst);
    let _ = stop_signal.recv();
    drop(expire);
    drop(frontends);
    drop(metrics);
    drop(admin);
    stop.store(true, Ordering::SeqCst);
    for h in server_threads {
        let _ = h.join();
    }
    Ok(())
}

/// Register this node's regions with UCX, publish its fabric info and fetch every peer's: the
/// node's context, and the bootstrap server that keeps publishing the info.
fn join_cluster(
    cfg: ClusterConfig,
    entry: &NodeEntry,
    delay: Option<DelayInjection>,
) -> Result<(NodeContext, BootstrapServer), NodeError> {
    let id = entry.id;
    let mode = cfg.mode().map_err(ConfigError::from)?;
    let plan = Plan::new(
        mode,
        cfg.geometry.clone(),
        cfg.protocol_config(),
        cfg.rpc_config(),
    )?;
    let replicas = Arc::new(cfg.replica_set().map_err(ConfigError::from)?);
    let regions = plan.node_regions(&replicas)?;
    let ucx = Arc::new(UcxNode::new(id, &regions, &ucx_config(&cfg))?);
    let (bootstrap, fabric_infos) = exchange_fabric_info(&cfg, entry, &ucx)?;
    let fence = Arc::new(Fence::unfenced());
    let guard = {
        let fence = fence.clone();
        nessie_store::classtable::WriteGuard(Arc::new(move || {
            fence.role(id) == nessie_protocols::NodeRole::Full
                && fence.may_act(nessie_fabric::monotonic_ns(), 0)
        }))
    };
    // Pages of a node a claim would wait on only when no other node has room, a standby
    // node's never (`replica::host_use`).
    let hosts = {
        let (fence, set) = (fence.clone(), replicas.clone());
        nessie_store::classtable::HostGuard(Arc::new(move |n| {
            nessie_protocols::replica::host_use(&set, &fence, n, nessie_fabric::monotonic_ns())
        }))
    };
    let table = Arc::new(plan.class_table(id).guarded(guard).hosts_guarded(hosts));
    let slots = plan.slot_pool();
    let pilaf = plan.pilaf_store(id)?;
    let ctx = NodeContext {
        pilaf,
        expiry: std::sync::OnceLock::new(),
        adopted_pages: AtomicU64::new(0),
        moved_in_fill_bytes: AtomicU64::new(0),
        moved_in_handed_entries: AtomicU64::new(0),
        starting: AtomicU32::new(0),
        id,
        cfg,
        mode,
        started: Instant::now(),
        ucx,
        fabric_infos,
        plan,
        table,
        slots,
        next_worker: AtomicU32::new(0),
        next_stream: AtomicU64::new(0),
        delay,
        servers: Vec::new(),
        membership: None,
        fence,
        replicas,
    };
    Ok((ctx, bootstrap))
}

/// Publish `ucx`'s info on our bootstrap address and fetch every peer's (ours in its place).
fn exchange_fabric_info(
    cfg: &ClusterConfig,
    entry: &NodeEntry,
    ucx: &UcxNode,
) -> Result<(BootstrapServer, Vec<nessie_fabric_ucx::NodeInfo>), NodeError> {
    let own = NodeInfo {
        node: entry.id,
        config_fingerprint: cfg.fingerprint(),
        geometry: cfg.geometry.clone(),
        fabric: hex::encode(serde_json::to_vec(ucx.info()).expect("serialises")),
        pid: std::process::id(),
    };
    let server = BootstrapServer::start(entry.bootstrap, cfg.secret_bytes()?, own.clone())?;
    let down = failed_peers(cfg);
    tracing::info!(node = entry.id, addr = %entry.bootstrap, ?down, "waiting for peers");
    let clock = bootstrap::clock::Clock::from_env().map_err(bootstrap::BootstrapError::from)?;
    let infos = bootstrap::fetch_peers(cfg, &own, &clock, &down)?;
    let fabric_infos = infos
        .iter()
        .map(|i| match i {
            Some(i) => decode_fabric(i),
            // Unreachable until it comes back and membership says so (`reconnect_restarted_peers`).
            None => Ok(nessie_fabric_ucx::NodeInfo::unknown()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((server, fabric_infos))
}

/// The peers the cluster's membership says are failed now: a node started again while they
/// are down does not wait for them. None without membership, before epoch 1 (the cluster
/// is starting: every node must come), or if etcd cannot be read.
fn failed_peers(cfg: &ClusterConfig) -> Vec<u16> {
    let Some(m) = &cfg.membership else {
        return Vec::new();
    };
    let snapshot = m
        .client(crate::config::ETCD_TIMEOUT)
        .map_err(MembershipError::from)
        .and_then(|etcd| nessie_membership::snapshot(&etcd, &cfg.membership_keys()));
    match snapshot {
        // Before epoch 1 every node must come but the standby ones, which start later.
        Ok(s) => s.config.map_or(cfg.cluster.standby.clone(), |c| {
            c.nodes
                .iter()
                .filter(|m| m.state == NodeState::Failed)
                .map(|m| m.id)
                .collect()
        }),
        Err(e) => {
            tracing::warn!(%e, "cannot read membership: waiting for every peer but the standby ones");
            cfg.cluster.standby.clone()
        }
    }
}

/// Server threads (sd, hy): each polls its share of the request slots, executing requests with
/// the client-driven protocol on this node's tables, until `stop`. None in cd mode.
/// The node's reclaimer (see [`crate::reclaimer`]).
fn start_reclaimer(
    ctx: &NodeContext,
    stop: &Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, NodeError> {
    let expiry_ns = ctx.protocol_config().expiry_ns;
    let fence = ctx.membership.is_some().then(|| ctx.fence.clone());
    crate::reclaimer::spawn(
        ctx.table.clone(),
        ctx.endpoint()?,
        expiry_ns,
        fence,
        stop.clone(),
    )
    .map_err(|err| NodeError::Spawn {
        what: "the reclaimer thread",
        err,
    })
}

fn start_servers(
    ctx: &mut NodeContext,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<std::thread::JoinHandle<()>>, NodeError> {
    let mut servers: Vec<ServerLoop> = Vec::new();
    for t in 0..ctx.mode.server_threads() {
        let (exec, io) = (ctx.endpoint()?, ctx.endpoint()?);
        let part = NodeServer {
            table: ctx.table.clone(),
            pilaf: ctx.pilaf.as_ref(),
        };
        let (server, stats) = ctx.plan.server(t, exec, io, part, || ctx.worker_id())?;
        ctx.servers.push(stats);
        servers.push(server);
    }
    let mut handles = Vec::new();
    for (t, mut server) in servers.into_iter().enumerate() {
        let stop = stop.clone();
        let h = std::thread::Builder::new()
            .name(format!("nessie-server-{t}"))
            .spawn(move || server(&stop))
            .map_err(|err| NodeError::Spawn {
                what: "a server thread",
                err,
            })?;
        handles.push(h);
    }
    Ok(handles)
}

/// The node's `workers` client workers behind its admin socket at `path`.
fn serve_admin(
    ctx: &Arc<NodeContext>,
    workers: u16,
    path: &Path,
    extension: Option<Arc<dyn NodeExtension>>,
    ops: &Arc<nessie_serve::metered::OpMetrics>,
) -> Result<AdminServer, NodeError> {
    let clients = metered_clients(ctx, workers, ops)?;
    let handler = Arc::new(NodeHandler {
        ctx: ctx.clone(),
        pool: ClientPool::new(clients),
        extension,
    });
    AdminServer::start(path, handler).map_err(|err| NodeError::AdminSocket {
        path: path.to_path_buf(),
        err,
    })
}

/// A node's front ends, and the reclaimer of expired items (client-driven mode).
type Frontends = (
    Vec<nessie_serve::frontends::FrontEnd>,
    Option<nessie_serve::expire::ExpiryReclaimer>,
);

/// The front ends of node `id` that `[frontends]` asks for, sharing `workers` client workers
/// of their own, and (client-driven mode, unless `[cache] expiry_reclaim` is off) the
/// reclaimer of expired items over the node's share of the index: on the front ends'
/// clients, or on [`RECLAIMER_WORKERS`] of its own when the node serves none.
fn serve_frontends(
    ctx: &Arc<NodeContext>,
    id: u16,
    workers: u16,
    ops: &Arc<nessie_serve::metered::OpMetrics>,
    opts: &NodeOptions,
) -> Result<Frontends, NodeError> {
    use nessie_serve::expire::{ExpiryReclaimer, CYCLE, WINDOW_SLOTS};
    use nessie_serve::frontends::FrontEnd;
    let f = ctx.cfg.frontends.as_ref();
    let (mc, resp) = f.map_or((None, None), |f| (f.memcached_addr(id), f.resp_addr(id)));
    let serving = mc.is_some() || resp.is_some();
    // Only the client-driven store scans its index (the baselines answer Unsupported); it
    // reclaims expired items whether or not the node serves a front end (items are written
    // with an expiry through the admin socket and the library too).
    let reclaim = matches!(ctx.mode, Mode::Cd) && ctx.cfg.cache.expiry_reclaim;
    if !serving && !reclaim {
        return Ok((Vec::new(), None));
    }
    let clients = if serving { workers } else { RECLAIMER_WORKERS };
    let pool = Arc::new(ClientPool::new(metered_clients(ctx, clients, ops)?));
    let mut started = Vec::new();
    if let Some(f) = f.filter(|_| serving) {
        check_fd_limit(f, [mc, resp].iter().flatten().count() as u64);
        let store = Arc::new(front_store(
            ctx,
            f,
            &pool,
            ops,
            opts.mutation_unordered_batches,
        ));
        started = start_frontends(ctx, f, (mc, resp), store)?;
    }
    let expire = if reclaim {
        let counters = started.iter().map(FrontEnd::counters).collect();
        let r =
            ExpiryReclaimer::start_shared(pool, reclaim_share(ctx), WINDOW_SLOTS, CYCLE, counters)
                .map_err(|err| NodeError::Spawn {
                    what: "the reclaimer of expired items",
                    err,
                })?;
        // Set once, here: status reports what it has done.
        let _ = ctx.expiry.set(r.totals().clone());
        Some(r)
    } else {
        None
    };
    Ok((started, expire))
}

/// The store of node `ctx`'s front ends: `pool` for commands run one at a time and, in
/// client-driven mode with `[frontends] inflight` above 1, a pipeline of that many slots per
/// event loop for pipelined batches, its clients wrapped as the pool's are.
fn front_store(
    ctx: &Arc<NodeContext>,
    f: &crate::config::FrontendsSection,
    pool: &Arc<ClientPool>,
    ops: &Arc<nessie_serve::metered::OpMetrics>,
    mutation_unordered: bool,
) -> crate::frontstore::FrontStore {
    let inflight = f.inflight as usize;
    let opts = nessie_inflight::PipelineOptions {
        mutation_unordered_keys: mutation_unordered,
        ..nessie_inflight::PipelineOptions::new(inflight)
    };
    let make: Option<Box<crate::frontstore::MakePipeline>> =
        (matches!(ctx.mode, Mode::Cd) && inflight > 1).then(|| {
            let (ctx, ops) = (ctx.clone(), ops.clone());
            let large = ctx.cfg.large_limits().ok().flatten();
            let served = f.metrics_addr(ctx.id).is_some();
            Box::new(move || {
                let pcfg = ctx.protocol_config();
                ctx.pipeline_of(&pcfg, opts.clone(), |c| {
                    served_client(c, large, served, &ops)
                })
                .map_err(|e| e.to_string())
            }) as Box<crate::frontstore::MakePipeline>
        });
    crate::frontstore::FrontStore::new(pool.clone(), make, inflight)
}

/// Client workers of the expiry reclaimer of a node that serves no front end.
const RECLAIMER_WORKERS: u16 = 1;

/// The index slots node `ctx.id`'s reclaimer sweeps: its own, and with replication those of
/// the failed nodes it is heir to (`Configuration::inherited_by`), asked again at every
/// sweep, so that a dead node's expired items are reclaimed while it is gone (with one copy
/// its index is unreachable). Two nodes that briefly both sweep a share (their views of a
/// change differ) delete nothing twice: each DELETE is conditional on the version read
/// expired.
fn reclaim_share(ctx: &Arc<NodeContext>) -> nessie_serve::expire::Share {
    let ctx = ctx.clone();
    let per_node = ctx.geometry().ites_per_node;
    let slots = move |n: u16| n as u64 * per_node..(n as u64 + 1) * per_node;
    let replicated = ctx.replica_set().replicas() >= 2;
    Box::new(move || {
        let heir_to = ctx
            .membership()
            .filter(|_| replicated)
            .and_then(|m| m.view().config)
            .map_or_else(Vec::new, |c| c.inherited_by(ctx.id));
        std::iter::once(ctx.id).chain(heir_to).map(slots).collect()
    })
}

/// The front ends at `addrs` (memcached, RESP) on the clients of `pool`, with the node's
/// figures as their store gauges.
fn start_frontends(
    ctx: &Arc<NodeContext>,
    f: &crate::config::FrontendsSection,
    (mc, resp): (Option<std::net::SocketAddr>, Option<std::net::SocketAddr>),
    store: Arc<crate::frontstore::FrontStore>,
) -> Result<Vec<nessie_serve::frontends::FrontEnd>, NodeError> {
    use nessie_serve::frontends::FrontEnd;
    let g = ctx.geometry();
    let item_max = ctx.cfg.item_max();
    let mut started = Vec::new();
    if let Some(addr) = mc {
        let fe = FrontEnd::memcached(
            addr,
            store.clone(),
            g,
            item_max,
            f.max_connections,
            f.threads,
        );
        started.push(fe.map_err(|err| NodeError::Frontend { addr, err })?);
    }
    if let Some(addr) = resp {
        let password = f.resp_password.as_ref().map(|p| p.0.clone());
        let fe = FrontEnd::resp(
            addr,
            store.clone(),
            g,
            item_max,
            f.max_connections,
            f.threads,
            password,
        );
        started.push(fe.map_err(|err| NodeError::Frontend { addr, err })?);
    }
    let gauges: Arc<dyn nessie_frontend::serve::StoreGauges> = Arc::new(NodeGauges {
        node: Arc::downgrade(ctx),
        policy: ctx.cfg.protocol_config().eviction,
        samples: ctx.cfg.protocol_config().eviction_samples,
    });
    for fe in &started {
        // Set once, on a fresh front end: it cannot have been set before.
        let _ = fe.counters().store.set(gauges.clone());
    }
    Ok(started)
}

/// The node's figures its front ends report (`stats`, `INFO`): read from its allocator and
/// its own index table at each request (a local pass over the index: `stats` is not a hot
/// command).
#[derive(Debug)]
struct NodeGauges {
    /// Weak: the front ends' counters, which hold these gauges, must not keep the node alive.
    node: std::sync::Weak<NodeContext>,
    policy: nessie_protocols::Eviction,
    samples: u8,
}

impl nessie_frontend::serve::StoreGauges for NodeGauges {
    fn eviction_samples(&self) -> u8 {
        self.samples
    }
    fn evictions(&self) -> u64 {
        self.node.upgrade().map_or(0, |n| n.table.evictions())
    }
    fn pages_moved(&self) -> u64 {
        self.node
            .upgrade()
            .map_or(0, |n| n.table.counters().pages_drained)
    }
    fn eviction_policy(&self) -> &'static str {
        self.policy.name()
    }
    fn tracks_access(&self) -> bool {
        self.policy.tracks_access()
    }
    fn figures(&self) -> nessie_frontend::serve::StoreFigures {
        let Some(n) = self.node.upgrade() else {
            return nessie_frontend::serve::StoreFigures::default();
        };
        let f = n.fill();
        nessie_frontend::serve::StoreFigures {
            items: f.present,
            bytes: f.entry_bytes,
            used_bytes: f.pages_claimed * f.page_bytes,
            limit_bytes: f.pages * f.page_bytes,
        }
    }
}

/// Descriptors a node holds besides its front-end connections (fabric, etcd, admin, files),
/// with room to spare.
const FDS_BESIDES_CONNECTIONS: u64 = 256;

/// Raise the open-file limit for `listeners` front ends of `max_connections` each, and say so
/// if it still falls short: connections beyond it are refused (`accept`), not served.
fn check_fd_limit(f: &crate::config::FrontendsSection, listeners: u64) {
    let want = listeners * f.max_connections as u64 + FDS_BESIDES_CONNECTIONS;
    match nessie_serve::accept::raise_fd_limit() {
        Some(have) if have < want => tracing::warn!(
            open_files = have,
            needed = want,
            "the open-file limit is below what [frontends] max_connections needs: connections \
             past it are refused (raise the hard limit, `ulimit -Hn`, or lower max_connections)"
        ),
        _ => {}
    }
}

/// `workers` client workers of the node, each counted in `ops` when the node serves metrics
/// (nobody could read them otherwise, and timing every operation costs two clock reads).
fn metered_clients(
    ctx: &Arc<NodeContext>,
    workers: u16,
    ops: &Arc<nessie_serve::metered::OpMetrics>,
) -> Result<Vec<Box<dyn KvClient>>, NodeError> {
    let pcfg = ctx.protocol_config();
    let served = ctx
        .cfg
        .frontends
        .as_ref()
        .and_then(|f| f.metrics_addr(ctx.id))
        .is_some();
    // Items longer than one entry go through the large-value layer (client-driven mode).
    let large = ctx.cfg.large_limits().ok().flatten();
    let mut clients: Vec<Box<dyn KvClient>> = Vec::new();
    for _ in 0..workers {
        clients.push(served_client(ctx.client(&pcfg)?, large, served, ops));
    }
    Ok(clients)
}

/// A client of a node's front ends and admin socket: items longer than one entry through the
/// large-value layer (client-driven mode), every call metered if the node serves metrics.
fn served_client<C: KvClient + 'static>(
    node: C,
    large: Option<nessie_protocols::large::LargeLimits>,
    served: bool,
    ops: &Arc<nessie_serve::metered::OpMetrics>,
) -> Box<dyn KvClient> {
    // Metered outside the layer: a large item's GET is one operation, chunks and all.
    let inner: Box<dyn KvClient> = match large {
        Some(l) => Box::new(nessie_protocols::large::Chunked::new(node, l)),
        None => Box::new(node),
    };
    match served {
        true => Box::new(nessie_serve::metered::Metered {
            inner,
            metrics: ops.clone(),
        }),
        false => inner,
    }
}

/// Node `id`'s metrics listener, if `[frontends] metrics_port` asks for one.
fn serve_metrics(
    ctx: &Arc<NodeContext>,
    id: u16,
    ops: &Arc<nessie_serve::metered::OpMetrics>,
    frontends: &[nessie_serve::frontends::FrontEnd],
) -> Result<Option<crate::metrics::MetricsServer>, NodeError> {
    let Some(addr) = ctx.cfg.frontends.as_ref().and_then(|f| f.metrics_addr(id)) else {
        return Ok(None);
    };
    let collector = crate::metrics::NodeCollector {
        node: ctx.clone(),
        frontends: frontends.iter().map(|f| (f.name(), f.counters())).collect(),
    };
    let registry = crate::metrics::registry(ops, collector);
    crate::metrics::MetricsServer::start(addr, registry)
        .map(Some)
        .map_err(|err| NodeError::Frontend { addr, err })
}

/// A `KvClient` that forwards operations to a node's admin socket (the CLI and multi-process
/// tests use it). Errors reported by the node come back as `Error::Node`.
pub struct AdminKvClient {
    conn: crate::admin::AdminClient,
    /// The keys the last operation evicted, sure and unsure (the node's EVICTED reply).
    evicted: Vec<Vec<u8>>,
    evicted_unsure: Vec<Vec<u8>>,
    reported: crate::admin::Evictions,
}

impl AdminKvClient {
    pub fn connect(
        path: &Path,
        timeout: std::time::Duration,
    ) -> Result<Self, crate::admin::AdminError> {
        Ok(Self {
            conn: crate::admin::AdminClient::connect(path, timeout)?,
            evicted: Vec::new(),
            evicted_unsure: Vec::new(),
            reported: Vec::new(),
        })
    }

    fn call(&mut self, req: Request) -> Result<Response, nessie_protocols::Error> {
        self.reported.clear();
        let r = self
            .conn
            .call_reporting(&req, &mut self.reported)
            .map_err(|e| nessie_protocols::Error::Node(e.to_string()));
        self.evicted.clear();
        self.evicted_unsure.clear();
        for (key, sure) in self.reported.drain(..) {
            match sure {
                true => self.evicted.push(key),
                false => self.evicted_unsure.push(key),
            }
        }
        r
    }
}

impl KvClient for AdminKvClient {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, nessie_protocols::Error> {
        match self.call(Request::Get(key.to_vec()))? {
            Response::Value(v) => Ok(Some(v)),
            Response::NotFound => Ok(None),
            Response::Error(e) => Err(crate::admin::decode_error(&e)),
            r => Err(nessie_protocols::Error::Node(format!(
                "unexpected reply {r:?}"
            ))),
        }
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), nessie_protocols::Error> {
        match self.call(Request::Put(key.to_vec(), value.to_vec()))? {
            Response::Ok => Ok(()),
            Response::Error(e) => Err(crate::admin::decode_error(&e)),
            r => Err(nessie_protocols::Error::Node(format!(
                "unexpected reply {r:?}"
            ))),
        }
    }
    fn put_parts_expiring(
        &mut self,
        key: &[u8],
        parts: &[&[u8]],
        expires_ns: u64,
    ) -> Result<(), nessie_protocols::Error> {
        match self.call(Request::PutExpiring(
            key.to_vec(),
            parts.concat(),
            expires_ns,
        ))? {
            Response::Ok => Ok(()),
            Response::Error(e) => Err(crate::admin::decode_error(&e)),
            r => Err(nessie_protocols::Error::Node(format!(
                "unexpected reply {r:?}"
            ))),
        }
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), nessie_protocols::Error> {
        match self.call(Request::Delete(key.to_vec()))? {
            Response::Ok => Ok(()),
            Response::Error(e) => Err(crate::admin::decode_error(&e)),
            r => Err(nessie_protocols::Error::Node(format!(
                "unexpected reply {r:?}"
            ))),
        }
    }
    fn evicted(&self) -> &[Vec<u8>] {
        &self.evicted
    }
    fn evicted_unsure(&self) -> &[Vec<u8>] {
        &self.evicted_unsure
    }
}
