//! In-process fabric: every node's regions live in this process; READ/WRITE/CAS are atomic
//! memory accesses (see [`crate::memory`] for the ordering argument).
//!
//! Tests use it for single- and multi-threaded runs. [`DelayInjection`] adds seeded random
//! yields and sleeps before and after every operation, which widens the windows between
//! protocol steps so that races the protocol must survive actually happen.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub use crate::delay::DelayInjection;
use crate::delay::Injector;
use crate::memory::{direct_read, direct_write, AccessError, WordMemory};
use crate::stats::{FabricStats, Locality, OpKind, StatsCell};
use crate::{Batch, ConfigError, Endpoint, FabricError, NodeId, RegionId, RemoteAddr};

/// Member ids (nodes and clients) lie below this: the store's `limits::MAX_NODES`, because a
/// page word names its claimer in 12 bits and the fence keeps a slot per id.
const ID_LIMIT: usize = 1 << 12;

struct InProcNode {
    regions: Vec<WordMemory>,
    alive: AtomicBool,
    /// Killed, but its memory stays reachable to endpoints that have not noticed the death
    /// yet (shared memory: a dead process's segment stays mapped), see
    /// [`InProcFabric::kill_node_keeping_memory`].
    kept: AtomicBool,
    /// When it was killed with its memory kept (monotonic ns), and within how long after that
    /// every endpoint notices.
    killed_at_ns: AtomicU64,
    notice_within_ns: AtomicU64,
    /// Restarts so far: endpoints made before the last one belong to a dead process.
    incarnation: AtomicU64,
}

/// N nodes in one process.
pub struct InProcFabric {
    nodes: Vec<InProcNode>,
    stats: FabricStats,
    delay: Option<DelayInjection>,
    endpoints_made: AtomicU64,
    /// Whether each client member (an id past the nodes, with no memory of its own) lives:
    /// [`InProcFabric::client_endpoint`] adds one, [`InProcFabric::kill_client`] ends it.
    clients: std::sync::Mutex<std::collections::HashMap<NodeId, Arc<AtomicBool>>>,
    /// Added to the wall clock of every endpoint (tests step it to mimic NTP or a VM resume).
    wall_clock_step_ns: std::sync::atomic::AtomicI64,
    /// While not 0, what every coarse monotonic clock reads: tests hold the clock ticks up
    /// with it.
    coarse_frozen_at: AtomicU64,
    /// What endpoints answer to `Endpoint::overlaps_batches` (tests turn it on to drive
    /// callers' batched paths; the batches themselves still run op by op).
    batches_overlap: AtomicBool,
}

impl InProcFabric {
    /// `regions[n]` lists the sizes in bytes of node `n`'s regions (region id = position).
    pub fn new(
        regions: &[Vec<u64>],
        delay: Option<DelayInjection>,
    ) -> Result<Arc<Self>, ConfigError> {
        if regions.is_empty() || regions.len() > NodeId::MAX as usize {
            return Err(ConfigError::NodeCount {
                count: regions.len(),
                max: NodeId::MAX,
            });
        }
        if let Some(d) = &delay {
            d.validate()?;
        }
        let nodes = regions
            .iter()
            .map(|sizes| InProcNode {
                regions: sizes.iter().map(|&b| WordMemory::zeroed(b)).collect(),
                alive: AtomicBool::new(true),
                kept: AtomicBool::new(false),
                killed_at_ns: AtomicU64::new(0),
                notice_within_ns: AtomicU64::new(0),
                incarnation: AtomicU64::new(0),
            })
            .collect();
        Ok(Arc::new(Self {
            nodes,
            stats: FabricStats::default(),
            delay,
            endpoints_made: AtomicU64::new(0),
            clients: Default::default(),
            wall_clock_step_ns: std::sync::atomic::AtomicI64::new(0),
            coarse_frozen_at: AtomicU64::new(0),
            batches_overlap: AtomicBool::new(false),
        }))
    }

    /// Step the wall clock every endpoint of this fabric sees by `delta_ns` (negative: back),
    /// as NTP or a VM resume would. The monotonic clock is unaffected.
    pub fn step_wall_clock(&self, delta_ns: i64) {
        self.wall_clock_step_ns
            .fetch_add(delta_ns, Ordering::Relaxed);
    }

    /// Stop (`true`) or restart every endpoint's coarse clock, as when clock ticks are held
    /// up (a descheduled VM): coarse readings then lag the precise ones by any amount.
    pub fn freeze_coarse_clocks(&self, frozen: bool) {
        let at = match frozen {
            true => crate::monotonic_coarse_ns().max(1),
            false => 0,
        };
        self.coarse_frozen_at.store(at, Ordering::Relaxed);
    }

    /// Make every endpoint claim (`true`) that it overlaps batches
    /// (`Endpoint::overlaps_batches`), as a UCX endpoint over a network does, so that callers
    /// take the paths they take there (batching READs they may not need). The batches still run
    /// one operation after another: results are the same, only the claim changes.
    pub fn set_batches_overlap(&self, on: bool) {
        self.batches_overlap.store(on, Ordering::Relaxed);
    }

    /// A new endpoint (one per worker thread) on `node`.
    pub fn endpoint(self: &Arc<Self>, node: NodeId) -> InProcEndpoint {
        assert!((node as usize) < self.nodes.len(), "no node {node}");
        let n = self.endpoints_made.fetch_add(1, Ordering::Relaxed);
        InProcEndpoint {
            fabric: self.clone(),
            node,
            incarnation: self.nodes[node as usize].incarnation.load(Ordering::SeqCst),
            client: None,
            stats: self.stats.register(node),
            injector: self.delay.clone().map(|d| Injector::new(d, n)),
            number: n,
        }
    }

    /// An endpoint of client member `id`: a process that is not a node (no memory, never a
    /// host of anything) and reaches every node's memory, as a `nessie` client library
    /// would (`docs/design/client-members.md`). Its id lies past the nodes' and below
    /// `MAX_NODES`, as the page word and the fence require. Endpoints of one id share its
    /// life: [`Self::kill_client`] ends them all, for good (a client comes back under a new id).
    pub fn client_endpoint(self: &Arc<Self>, id: NodeId) -> InProcEndpoint {
        assert!(
            (id as usize) >= self.nodes.len() && (id as usize) < ID_LIMIT,
            "client id {id} must lie in [{}, {ID_LIMIT})",
            self.nodes.len(),
        );
        let life = self
            .clients
            .lock()
            .unwrap()
            .entry(id)
            .or_insert_with(|| Arc::new(AtomicBool::new(true)))
            .clone();
        let n = self.endpoints_made.fetch_add(1, Ordering::Relaxed);
        InProcEndpoint {
            fabric: self.clone(),
            node: id,
            incarnation: 0,
            client: Some(life),
            stats: self.stats.register(id),
            injector: self.delay.clone().map(|d| Injector::new(d, n)),
            number: n,
        }
    }

    /// Crash client member `id`: its endpoints issue nothing more (an operation under way
    /// may have taken effect without its caller learning so, as for a node).
    pub fn kill_client(&self, id: NodeId) {
        if let Some(life) = self.clients.lock().unwrap().get(&id) {
            life.store(false, Ordering::SeqCst);
        }
    }

    /// Crash `node`: every operation on its memory fails, and so does every operation its own
    /// workers issue (a crashed process issues nothing).
    pub fn kill_node(&self, node: NodeId) {
        let n = &self.nodes[node as usize];
        n.alive.store(false, Ordering::SeqCst);
        n.kept.store(false, Ordering::SeqCst);
    }

    /// Crash `node` as a process whose memory others map (shared memory): its own workers
    /// issue nothing, but its memory stays readable and writable through every endpoint that
    /// has not yet noticed the death. Each endpoint notices on its own, at a time drawn from
    /// its number within `notice_within_ns` of the kill, as a transport's keep-alive would;
    /// from then on its operations there fail. So writers may fail to reach memory that
    /// readers still read. [`Self::kill_node`] makes it unreachable to all.
    pub fn kill_node_keeping_memory(&self, node: NodeId, notice_within_ns: u64) {
        let n = &self.nodes[node as usize];
        n.killed_at_ns
            .store(crate::monotonic_ns(), Ordering::SeqCst);
        n.notice_within_ns
            .store(notice_within_ns.max(1), Ordering::SeqCst);
        n.kept.store(true, Ordering::SeqCst);
        n.alive.store(false, Ordering::SeqCst);
    }

    /// Restart a crashed `node`: its memory comes back zeroed, as a new process's would.
    /// Endpoints made from now on work; those of its earlier incarnation stay dead.
    pub fn revive_node(&self, node: NodeId) {
        let n = &self.nodes[node as usize];
        assert!(
            !n.alive.load(Ordering::SeqCst),
            "node {node} is running; kill it first"
        );
        for r in &n.regions {
            let zeros = vec![0u8; 1 << 16];
            let mut off = 0;
            while off < r.len_bytes() {
                let len = (zeros.len() as u64).min(r.len_bytes() - off) as usize;
                r.write(off, &zeros[..len]).expect("in bounds");
                off += len as u64;
            }
        }
        n.incarnation.fetch_add(1, Ordering::SeqCst);
        n.kept.store(false, Ordering::SeqCst);
        n.alive.store(true, Ordering::SeqCst);
    }

    pub fn stats(&self) -> &FabricStats {
        &self.stats
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn region(&self, node: NodeId, region: RegionId) -> Result<&WordMemory, FabricError> {
        let n = self
            .nodes
            .get(node as usize)
            .ok_or(FabricError::UnknownNode {
                node,
                nodes: self.nodes.len(),
            })?;
        if !n.alive.load(Ordering::SeqCst) && !n.kept.load(Ordering::SeqCst) {
            return Err(FabricError::Unreachable {
                node,
                reason: "node was killed".into(),
            });
        }
        n.regions
            .get(region as usize)
            .ok_or(FabricError::UnknownRegion { node, region })
    }
}

/// One worker's endpoint on a [`InProcFabric`].
pub struct InProcEndpoint {
    fabric: Arc<InProcFabric>,
    node: NodeId,
    /// Its node's incarnation when it was made.
    incarnation: u64,
    /// A client member's life ([`InProcFabric::client_endpoint`]); `None` for a node's.
    client: Option<Arc<AtomicBool>>,
    stats: Arc<StatsCell>,
    injector: Option<Injector>,
    /// Which endpoint of the fabric this is (it draws when it notices a death).
    number: u64,
}

impl InProcEndpoint {
    /// Start an operation: a crashed node's workers issue nothing.
    fn begin(&mut self) -> Result<(), FabricError> {
        if let Some(life) = &self.client {
            if !life.load(Ordering::SeqCst) {
                return Err(FabricError::Unreachable {
                    node: self.node,
                    reason: "this client was killed".into(),
                });
            }
            self.maybe_delay();
            return Ok(());
        }
        let n = &self.fabric.nodes[self.node as usize];
        if !n.alive.load(Ordering::SeqCst)
            || n.incarnation.load(Ordering::SeqCst) != self.incarnation
        {
            return Err(FabricError::Unreachable {
                node: self.node,
                reason: "this worker's own node was killed".into(),
            });
        }
        self.maybe_delay();
        Ok(())
    }

    /// Whether `node` is reachable from this endpoint: a node killed with its memory kept is,
    /// until this endpoint notices the death.
    fn reach(&mut self, node: NodeId) -> Result<(), FabricError> {
        let Some(n) = self.fabric.nodes.get(node as usize) else {
            return Ok(()); // `region` names the problem
        };
        if !n.kept.load(Ordering::SeqCst) {
            return Ok(());
        }
        // splitmix64 of (endpoint, node): each endpoint notices each death at its own time.
        let mut z = (self.number << 16 | node as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let within = n.notice_within_ns.load(Ordering::SeqCst);
        let notices_at = n.killed_at_ns.load(Ordering::SeqCst) + z % within;
        if crate::monotonic_ns() < notices_at {
            return Ok(());
        }
        Err(FabricError::Unreachable {
            node,
            reason: "its process died (noticed)".into(),
        })
    }

    fn maybe_delay(&mut self) {
        if let Some(i) = self.injector.as_mut() {
            i.delay();
        }
    }

    fn locality(&self, node: NodeId) -> Locality {
        if node == self.node {
            Locality::Loopback
        } else {
            Locality::Remote
        }
    }

    /// Run one fabric operation with delay injection around it.
    fn op<T>(
        &mut self,
        kind: OpKind,
        addr: RemoteAddr,
        len: usize,
        f: impl FnOnce(&WordMemory) -> Result<T, AccessError>,
    ) -> Result<T, FabricError> {
        self.begin()?;
        self.reach(addr.node)?;
        let mem = self.fabric.region(addr.node, addr.region)?;
        let r = f(mem).map_err(|e| e.at(addr, len, mem))?;
        self.stats
            .record(kind, self.locality(addr.node), len as u64);
        // A crash right after the operation: it took effect, but its worker never learns so.
        self.begin()?;
        Ok(r)
    }
}

/// Operations finish at once: nothing to overlap in one process's memory.
impl crate::Post for InProcEndpoint {}

impl Endpoint for InProcEndpoint {
    fn node(&self) -> NodeId {
        self.node
    }

    fn node_count(&self) -> usize {
        self.fabric.nodes.len()
    }

    fn read(&mut self, addr: RemoteAddr, buf: &mut [u8]) -> Result<(), FabricError> {
        let len = buf.len();
        self.op(OpKind::Read, addr, len, |m| m.read(addr.offset, buf))
    }

    fn write(&mut self, addr: RemoteAddr, buf: &[u8]) -> Result<(), FabricError> {
        self.op(OpKind::Write, addr, buf.len(), |m| {
            m.write(addr.offset, buf)
        })
    }

    fn compare_and_swap(
        &mut self,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        self.op(OpKind::Cas, addr, 8, |m| {
            m.compare_and_swap(addr.offset, expected, desired)
        })
    }

    /// In process every operation has completed when its call returns, so nothing is gained
    /// by keeping several in flight: the batch runs op by op, in batch order (which also keeps
    /// overlapping operations in order), each with the same checks, counters, crash points
    /// and delay injection as a single operation.
    fn run_batch(&mut self, batch: &mut Batch<'_>) {
        batch.run_sequentially(self)
    }

    fn overlaps_batches(&self, _region: RegionId) -> bool {
        self.fabric.batches_overlap.load(Ordering::Relaxed)
    }

    fn local_read(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        self.begin()?;
        let mem = self.fabric.region(self.node, region)?;
        direct_read(
            mem,
            RemoteAddr::new(self.node, region, offset),
            buf,
            &self.stats,
        )
    }

    fn local_prefetch(&self, region: RegionId, offset: u64, len: u64) {
        if let Ok(mem) = self.fabric.region(self.node, region) {
            mem.prefetch(offset, len)
        }
    }

    fn local_write(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &[u8],
    ) -> Result<(), FabricError> {
        self.begin()?;
        let mem = self.fabric.region(self.node, region)?;
        direct_write(
            mem,
            RemoteAddr::new(self.node, region, offset),
            buf,
            &self.stats,
        )
    }

    fn now_ns(&self) -> u64 {
        let step = self.fabric.wall_clock_step_ns.load(Ordering::Relaxed);
        crate::wall_clock_ns().saturating_add_signed(step)
    }

    fn mono_coarse_ns(&self) -> u64 {
        match self.fabric.coarse_frozen_at.load(Ordering::Relaxed) {
            0 => crate::monotonic_coarse_ns(),
            frozen => frozen,
        }
    }

    fn coarse_lag_ns(&self) -> u64 {
        crate::coarse_clock_lag_ns()
    }

    fn sleep_ns(&mut self, ns: u64) {
        crate::precise_sleep_ns(ns)
    }

    fn stats(&self) -> &StatsCell {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fabric(delay: Option<DelayInjection>) -> Arc<InProcFabric> {
        InProcFabric::new(&[vec![64, 128], vec![64, 128]], delay).unwrap()
    }

    #[test]
    fn read_write_cas_across_nodes_with_counters() {
        let f = fabric(None);
        let mut a = f.endpoint(0);
        let mut b = f.endpoint(1);
        let addr = RemoteAddr::new(1, 1, 16);
        a.write(addr, &[1u8; 16]).unwrap();
        let mut buf = [0u8; 16];
        b.local_read(1, 16, &mut buf).unwrap();
        assert_eq!(buf, [1u8; 16]);
        assert_eq!(
            a.compare_and_swap(RemoteAddr::new(0, 0, 8), 0, 5).unwrap(),
            0
        );
        assert_eq!(b.read_u64(RemoteAddr::new(0, 0, 8)).unwrap(), 5);
        let sa = a.stats().snapshot();
        assert_eq!(sa.ops(OpKind::Write, Locality::Remote), 1);
        assert_eq!(sa.bytes(OpKind::Write, Locality::Remote), 16);
        assert_eq!(sa.ops(OpKind::Cas, Locality::Loopback), 1);
        let sb = b.stats().snapshot();
        assert_eq!(sb.ops(OpKind::Read, Locality::Direct), 1);
        assert_eq!(sb.ops(OpKind::Read, Locality::Remote), 1);
        assert_eq!(f.stats().total(Some(0)).total_ops(), 2);
        assert_eq!(f.stats().total(None).total_ops(), 4);
    }

    #[test]
    fn errors_name_the_problem() {
        let f = fabric(None);
        let mut a = f.endpoint(0);
        let mut buf = [0u8; 8];
        assert!(matches!(
            a.read(RemoteAddr::new(5, 0, 0), &mut buf),
            Err(FabricError::UnknownNode { node: 5, .. })
        ));
        assert!(matches!(
            a.read(RemoteAddr::new(1, 9, 0), &mut buf),
            Err(FabricError::UnknownRegion { region: 9, .. })
        ));
        assert!(matches!(
            a.read(RemoteAddr::new(1, 0, 64), &mut buf),
            Err(FabricError::OutOfBounds { .. })
        ));
        assert!(matches!(
            a.read(RemoteAddr::new(1, 0, 4), &mut buf),
            Err(FabricError::Misaligned { .. })
        ));
        f.kill_node(1);
        let e = a.read(RemoteAddr::new(1, 0, 0), &mut buf).unwrap_err();
        assert!(matches!(e, FabricError::Unreachable { node: 1, .. }));
        assert!(e.to_string().contains("node 1 is unreachable"));
        assert!(
            a.read(RemoteAddr::new(0, 0, 0), &mut buf).is_ok(),
            "other nodes keep working"
        );
    }

    #[test]
    fn concurrent_cas_increments_are_atomic_under_delay_injection() {
        let f = fabric(Some(DelayInjection {
            seed: 7,
            probability: 0.3,
            max_delay_ns: 2_000,
        }));
        let addr = RemoteAddr::new(1, 0, 0);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let mut ep = f.endpoint((t % 2) as NodeId);
                std::thread::spawn(move || {
                    for _ in 0..2_000 {
                        let mut cur = ep.read_u64(addr).unwrap();
                        loop {
                            let seen = ep.compare_and_swap(addr, cur, cur + 1).unwrap();
                            if seen == cur {
                                break;
                            }
                            cur = seen;
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(f.endpoint(0).read_u64(addr).unwrap(), 8_000);
    }

    #[test]
    fn invalid_delay_config_is_rejected() {
        let bad = DelayInjection {
            seed: 0,
            probability: 1.5,
            max_delay_ns: 0,
        };
        assert!(InProcFabric::new(&[vec![8]], Some(bad))
            .err()
            .unwrap()
            .to_string()
            .contains("probability"));
    }

    /// A process killed with its memory kept: its own workers fail at once; every other
    /// endpoint reads and writes its memory until it notices the death, each at its own time,
    /// and then fails there for good.
    #[test]
    fn memory_kept_after_a_kill_until_each_endpoint_notices() {
        let f = fabric(None);
        let at = RemoteAddr::new(1, 0, 8);
        let mut own = f.endpoint(1);
        let mut others: Vec<_> = (0..6).map(|_| f.endpoint(0)).collect();
        own.write(at, &7u64.to_le_bytes()).unwrap();
        let within = std::time::Duration::from_millis(40);
        let t0 = std::time::Instant::now();
        f.kill_node_keeping_memory(1, within.as_nanos() as u64);
        assert!(matches!(
            own.read_u64(at),
            Err(FabricError::Unreachable { node: 1, .. })
        ));
        let mut noticed_after = vec![None; others.len()];
        while noticed_after.iter().any(Option::is_none) {
            assert!(t0.elapsed() < 2 * within, "an endpoint never noticed");
            for (ep, noticed) in others.iter_mut().zip(&mut noticed_after) {
                match (ep.read_u64(at), *noticed) {
                    (Ok(v), None) => assert_eq!(v, 7, "the memory is what the process left"),
                    (Err(_), None) => *noticed = Some(t0.elapsed()),
                    (r, Some(_)) => assert!(r.is_err(), "noticed for good"),
                }
            }
        }
        let (first, last) = (noticed_after.iter().min(), noticed_after.iter().max());
        assert!(
            last.unwrap().unwrap() > first.unwrap().unwrap() + within / 10,
            "endpoints notice at different times: {noticed_after:?}"
        );
        let mut late = f.endpoint(0);
        f.kill_node(1);
        assert!(late.read_u64(at).is_err(), "a plain kill reaches everyone");
        f.revive_node(1);
        assert_eq!(
            others[0].read_u64(at).unwrap(),
            0,
            "a new process, fresh memory"
        );
    }

    /// The batch semantics (`batch::check_semantics`) hold in process, plain, with delays
    /// injected, and through the `Delayed` and `Interposed` wrappers.
    #[test]
    fn batches_meet_their_semantics() {
        use crate::batch::check_semantics;
        use crate::delay::Delayed;
        use crate::interpose::{Interposed, Interposer, Op};
        let regions = [vec![256], vec![256], vec![256]];
        let f = InProcFabric::new(&regions, None).unwrap();
        check_semantics(&mut f.endpoint(0), &[0, 1, 2], 0, 256);
        let delays = DelayInjection {
            seed: 3,
            probability: 0.5,
            max_delay_ns: 10_000,
        };
        let f = InProcFabric::new(&regions, Some(delays.clone())).unwrap();
        check_semantics(&mut f.endpoint(1), &[2, 0], 0, 256);
        let f = InProcFabric::new(&regions, None).unwrap();
        let mut d = Delayed::new(f.endpoint(0), delays, 7);
        check_semantics(&mut d, &[1, 2], 0, 256);
        struct Pass;
        impl Interposer for Pass {
            fn before(&mut self, _: Op) -> Result<(), FabricError> {
                Ok(())
            }
        }
        let f = InProcFabric::new(&regions, None).unwrap();
        check_semantics(
            &mut Interposed::new(f.endpoint(2), Pass),
            &[0, 1, 2],
            0,
            256,
        );
    }

    /// Batches are claimed to overlap only when asked (tests drive callers' batched paths so).
    #[test]
    fn batches_overlap_only_when_asked() {
        let f = fabric(None);
        let ep = f.endpoint(0);
        assert!(!ep.overlaps_batches(0));
        f.set_batches_overlap(true);
        assert!(ep.overlaps_batches(0));
    }
}
