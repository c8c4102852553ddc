//! The simulated fabric: nodes' memory (the in-process backend's [`WordMemory`]), the
//! resource model ([`crate::net`]) and the scheduler ([`crate::sched`]), and the endpoint that
//! times every operation in virtual time.
//!
//! When an operation takes effect: a remote or looped-back READ, WRITE or CAS reads or changes
//! memory at the virtual instant the responder's NIC has finished processing its request; a
//! direct access at the instant its copy ends. The effect is applied by the issuing thread,
//! dispatched at exactly that instant, so every effect is totally ordered by (virtual time,
//! tie-break) and lies strictly between the operation's call and its return.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use nessie_fabric::memory::{AccessError, WordMemory};
use nessie_fabric::{
    Endpoint, FabricError, FabricStats, Locality, NodeId, OpKind, RegionId, RemoteAddr, StatsCell,
    ALIGN,
};

use crate::faults::{FaultCounts, FaultStream, FaultTotals, FaultsError, Loss, SimFaults};
use crate::net::{Net, NoCoreLeft, WireBytes};
use crate::params::{headers, ParamsError, SimParams, MAX_NODES};
use crate::sched::{RunSummary, Sched, Slot, ThreadNo};
use crate::slices::Slices;
use crate::watch::{Watches, IDLE_POLL_MAX_NS};

/// The wall clock of every simulated node at virtual time 0 (2024-01-01T00:00:00Z), so that
/// expiry timestamps look like real ones; nodes' clocks agree exactly.
pub const SIM_EPOCH_NS: u64 = 1_704_067_200_000_000_000;

/// The tick of the simulated coarse clocks ([`nessie_fabric::Endpoint::mono_coarse_ns`]): they
/// read virtual time rounded down to it, so that checked runs exercise timers started early
/// (with the checks' 5 ms expiry, 100 µs is under the 1/32 of it a timer may start early by).
pub const SIM_COARSE_TICK_NS: u64 = 100_000;

/// Why a simulation cannot be set up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    #[error("node count {0} is not in 1..={MAX_NODES}")]
    Nodes(usize),
    #[error(transparent)]
    Params(#[from] ParamsError),
    #[error(transparent)]
    Core(#[from] NoCoreLeft),
    #[error(transparent)]
    Faults(#[from] FaultsError),
}

struct Shared {
    p: SimParams,
    memory: Vec<Vec<WordMemory>>,
    net: Mutex<Net>,
    sched: Sched,
    stats: FabricStats,
    /// Idle pollers waiting for a write.
    watches: Watches,
    /// The node of every simulated thread, by thread number.
    thread_nodes: Mutex<Vec<NodeId>>,
    /// Time slices of threads on cores shared with background processes (set by the first
    /// run, once every thread exists).
    slices: std::sync::OnceLock<Slices>,
    faults: SimFaults,
    fault_counts: FaultCounts,
    seed: u64,
    /// Endpoints made so far: each one's fault stream is numbered by its rank.
    endpoints: AtomicU64,
    /// Endpoints made from now on get no faults ([`Sim::end_faults`]).
    faults_ended: std::sync::atomic::AtomicBool,
    /// Nodes that crashed ([`Sim::crash_node`]), a bit each.
    crashed: AtomicU64,
}

/// The panic payload that ends a simulated thread whose node crashed ([`Sim::crash_node`]):
/// raised, without the panic hook's message, when the thread next issues an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCrashed {
    pub node: NodeId,
}

impl Shared {
    /// The fault stream of a new endpoint, if faults are on.
    fn fault_stream(&self, pauses: bool) -> Option<Box<FaultStream>> {
        let stream = self.endpoints.fetch_add(1, Ordering::Relaxed);
        let on = self.faults.any() && !self.faults_ended.load(Ordering::Relaxed);
        let f = on.then(|| self.faults.clone())?;
        Some(Box::new(FaultStream::new(f, self.seed, stream, pauses)))
    }

    fn is_crashed(&self, node: NodeId) -> bool {
        node < 64 && self.crashed.load(Ordering::SeqCst) & (1 << node) != 0
    }

    fn net(&self) -> MutexGuard<'_, Net> {
        self.net.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The earliest time at or after `t` at which `thread` has its core.
    fn on_cpu(&self, thread: ThreadNo, t: u64) -> u64 {
        self.slices.get().map_or(t, |s| s.next_on(thread, t))
    }

    /// A write of `len` bytes at `addr` took effect at `t`: wake the idle pollers waiting
    /// for one there, each once it has its core.
    fn written(&self, addr: RemoteAddr, len: usize, t: u64) {
        let bytes = addr.offset..addr.offset + len as u64;
        self.watches
            .written(&self.sched, addr, bytes, |thread| self.on_cpu(thread, t));
    }

    /// The region `addr` names, with the access checked before any virtual time passes.
    fn checked(&self, addr: RemoteAddr, len: usize) -> Result<&WordMemory, FabricError> {
        let node = self
            .memory
            .get(addr.node as usize)
            .ok_or(FabricError::UnknownNode {
                node: addr.node,
                nodes: self.memory.len(),
            })?;
        let mem = node
            .get(addr.region as usize)
            .ok_or(FabricError::UnknownRegion {
                node: addr.node,
                region: addr.region,
            })?;
        if !addr.offset.is_multiple_of(ALIGN) || !(len as u64).is_multiple_of(ALIGN) {
            return Err(AccessError::Misaligned.at(addr, len, mem));
        }
        if addr.offset.saturating_add(len as u64) > mem.len_bytes() {
            return Err(AccessError::OutOfBounds.at(addr, len, mem));
        }
        Ok(mem)
    }
}

/// A simulated cluster: create endpoints (one per simulated thread), spawn the threads that
/// use them, then [`Sim::run`]. Clones are handles onto the same cluster.
#[derive(Clone)]
pub struct Sim {
    shared: Arc<Shared>,
}

/// A simulated thread's handle for [`Sim::spawn`] and [`Sim::clock`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimThread(ThreadNo);

impl Sim {
    /// `regions[n]` lists the sizes in bytes of node `n`'s regions (region id = position).
    pub fn new(params: SimParams, seed: u64, regions: &[Vec<u64>]) -> Result<Self, SimError> {
        Self::with_faults(params, SimFaults::NONE, seed, regions)
    }

    /// [`Sim::new`] with `faults` injected, drawn from `seed` ([`crate::faults`]).
    pub fn with_faults(
        params: SimParams,
        faults: SimFaults,
        seed: u64,
        regions: &[Vec<u64>],
    ) -> Result<Self, SimError> {
        params.validate()?;
        faults.validate()?;
        if regions.is_empty() || regions.len() > MAX_NODES {
            return Err(SimError::Nodes(regions.len()));
        }
        let memory = regions
            .iter()
            .map(|sizes| sizes.iter().map(|&b| WordMemory::zeroed(b)).collect())
            .collect();
        let shared = Arc::new(Shared {
            net: Mutex::new(Net::new(&params, regions.len())),
            p: params,
            memory,
            sched: Sched::new(seed),
            stats: FabricStats::default(),
            watches: Watches::default(),
            thread_nodes: Mutex::new(Vec::new()),
            slices: std::sync::OnceLock::new(),
            faults,
            fault_counts: FaultCounts::default(),
            seed,
            endpoints: AtomicU64::new(0),
            faults_ended: std::sync::atomic::AtomicBool::new(false),
            crashed: AtomicU64::new(0),
        });
        // The network's and the watches' locks live in `Shared`, which the Arc never moves.
        shared.sched.own(&*shared);
        Ok(Self { shared })
    }

    pub fn node_count(&self) -> usize {
        self.shared.memory.len()
    }

    pub fn params(&self) -> &SimParams {
        &self.shared.p
    }

    /// A new simulated thread on `node` and its endpoint. Use the endpoint only in the closure
    /// given to [`Sim::spawn`] for [`SimEndpoint::thread`].
    pub fn endpoint(&self, node: NodeId) -> SimEndpoint {
        assert!((node as usize) < self.node_count(), "no node {node}");
        let (thread, slot) = {
            // Numbered in registration order: the list's index is the thread's number.
            let mut nodes = self
                .shared
                .thread_nodes
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let (thread, slot) = self.shared.sched.register(self.shared.p.start_jitter_ns);
            assert_eq!(thread, nodes.len(), "threads are registered in order");
            nodes.push(node);
            (thread, slot)
        };
        SimEndpoint {
            shared: self.shared.clone(),
            node,
            thread,
            slot,
            stats: self.shared.stats.register(node),
            own_core: false,
            lane: None,
            faults: self.shared.fault_stream(true),
        }
    }

    /// The slots of one client thread on `node` that keeps `slots` operations in flight (a
    /// pipeline, `nessie_inflight`): a simulated thread and endpoint per slot, so that their
    /// fabric operations overlap in virtual time, all on one [`Lane`] of CPU, so that their CPU
    /// work runs one piece at a time, as coroutines' does on their one OS thread.
    pub fn pipeline(&self, node: NodeId, slots: usize) -> Vec<SimEndpoint> {
        assert!(
            (1..=MAX_LANE_SLOTS).contains(&slots),
            "a pipeline has 1..={MAX_LANE_SLOTS} slots, not {slots}"
        );
        let lane = Arc::new(Lane {
            reserved: AtomicU64::new(0),
            busy: AtomicU64::new(0),
        });
        let mut eps = Vec::with_capacity(slots);
        for _ in 0..slots {
            eps.push(SimEndpoint {
                lane: Some(lane.clone()),
                ..self.endpoint(node)
            });
        }
        eps
    }

    /// Take one core of `node` for a thread that polls without pause (an SD/HY server).
    pub fn take_polling_core(&self, node: NodeId) -> Result<(), SimError> {
        Ok(self.shared.net().take_core(node)?)
    }

    /// A new simulated thread on `node` that polls without pause, on a core of its own taken
    /// from the node's ([`Sim::take_polling_core`]): its CPU work never waits for a core, and
    /// the node's other threads have one core fewer.
    pub fn polling_endpoint(&self, node: NodeId) -> Result<SimEndpoint, SimError> {
        self.take_polling_core(node)?;
        Ok(SimEndpoint {
            own_core: true,
            faults: self.shared.fault_stream(false),
            ..self.endpoint(node)
        })
    }

    /// Start `thread` (an OS thread running `f`); it runs when the scheduler dispatches it,
    /// during [`Sim::run`]. Join the handle after the run.
    pub fn spawn<T: Send + 'static>(
        &self,
        thread: SimThread,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let shared = self.shared.clone();
        shared.sched.spawned(thread.0);
        std::thread::Builder::new()
            .name(format!("sim-{}", thread.0))
            .spawn(move || {
                let slot = shared.sched.slot(thread.0);
                shared.sched.enter(thread.0, &slot);
                // Leave the scheduler even if `f` panics, or the run would wait forever.
                struct Exit(Arc<Shared>, ThreadNo);
                impl Drop for Exit {
                    fn drop(&mut self) {
                        self.0.sched.exit(self.1);
                    }
                }
                let _exit = Exit(shared, thread.0);
                f()
            })
            .expect("cannot start a simulated thread")
    }

    /// Run every spawned thread to its end in virtual time.
    pub fn run(&self) -> RunSummary {
        let sh = &self.shared;
        sh.slices.get_or_init(|| {
            let nodes = sh.thread_nodes.lock().unwrap_or_else(|p| p.into_inner());
            Slices::new(&sh.p, sh.seed, &nodes)
        });
        sh.sched.run()
    }

    /// Crash `node` now: its threads issue nothing more. Each unwinds with [`NodeCrashed`]
    /// when it next tries to (after any injected wait before the operation: a thread paused
    /// at the crash never wakes to act). Its memory stays readable and writable by the other
    /// nodes, as in the in-process tests of dead writers (its NIC answers for its memory).
    pub fn crash_node(&self, node: NodeId) {
        assert!(
            (node as usize) < self.node_count() && node < 64,
            "no node {node}"
        );
        self.shared.crashed.fetch_or(1 << node, Ordering::SeqCst);
    }

    /// Whether `node` crashed.
    pub fn is_crashed(&self, node: NodeId) -> bool {
        self.shared.is_crashed(node)
    }

    /// Every endpoint's counters.
    pub fn stats(&self) -> &FabricStats {
        &self.shared.stats
    }

    /// Endpoints made from now on get no faults (those made before keep theirs): for a
    /// check after the faulty part of a run.
    pub fn end_faults(&self) {
        self.shared.faults_ended.store(true, Ordering::Relaxed);
    }

    /// The faults injected so far.
    pub fn fault_totals(&self) -> FaultTotals {
        self.shared.fault_counts.totals()
    }

    /// Bytes `node`'s NIC port sent and received on the wire, headers included.
    pub fn wire_bytes(&self, node: NodeId) -> WireBytes {
        self.shared.net().wire_bytes(node)
    }

    /// Virtual time now (between runs: when the last one ended).
    pub fn now_ns(&self) -> u64 {
        self.shared.sched.now()
    }

    /// A reader of `thread`'s virtual time, for code around its operations (history
    /// recorders, latency timers) that cannot reach its endpoint.
    pub fn clock(&self, thread: SimThread) -> SimClock {
        SimClock {
            shared: self.shared.clone(),
            slot: self.shared.sched.slot(thread.0),
        }
    }

    /// Direct access to a node's memory outside the simulation (setup and inspection).
    pub fn memory(&self, node: NodeId, region: RegionId) -> &WordMemory {
        &self.shared.memory[node as usize][region as usize]
    }
}

/// A simulated thread's virtual clock ([`Sim::clock`]); read it on that thread.
#[derive(Clone)]
pub struct SimClock {
    shared: Arc<Shared>,
    slot: Arc<Slot>,
}

impl SimClock {
    /// The thread's virtual time, ns (what its endpoint's `mono_ns` says).
    pub fn now_ns(&self) -> u64 {
        self.slot.clock().max(self.shared.sched.now())
    }
}

/// Most slots one [`Lane`] serves (`Sim::pipeline`): a bound on the simulated threads one
/// lane makes (a real pipeline has at most 64, `nessie_inflight::MAX_SLOTS`).
pub const MAX_LANE_SLOTS: usize = 256;

/// The CPU of one client thread whose slots are simulated threads ([`Sim::pipeline`]).
///
/// **LN1.** A lane runs one piece of CPU work at a time: a slot takes the lane's next turn when
/// it asks (after the turns already taken), waits in virtual time for it and for the previous
/// piece to end, then books a core of the node at that instant, as any thread does (so every
/// booking of a core is still made at the virtual time it is asked for). The slots' fabric
/// operations, between those pieces, overlap freely. This is a pipeline's thread: its coroutines give way to each other only at
/// fabric operations, one at a time on its core. Switches between coroutines cost nothing here
/// (tens of ns on real hardware), and a slot's operation completes when its response arrives,
/// though a real coroutine notices only at its thread's next poll. Background processes' time
/// slices are not modelled for lanes: the benchmark refuses `--background` with `--inflight`.
struct Lane {
    /// The end of the last turn a slot has taken (its piece may not have started yet).
    reserved: AtomicU64,
    /// When the last piece that started on the lane ends.
    busy: AtomicU64,
}

/// One simulated thread's endpoint.
pub struct SimEndpoint {
    shared: Arc<Shared>,
    node: NodeId,
    thread: ThreadNo,
    slot: Arc<Slot>,
    stats: Arc<StatsCell>,
    /// A polling thread's: CPU work runs on its own core.
    own_core: bool,
    /// A pipeline slot's: the CPU it shares with the pipeline's other slots (LN1).
    lane: Option<Arc<Lane>>,
    /// Faults to inject, if any (a polling thread's never pause).
    faults: Option<Box<FaultStream>>,
}

/// What an operation puts on the wire each way, and the responder NIC's extra work.
struct Shape {
    req: u64,
    req_header: u64,
    resp: u64,
    resp_header: u64,
    responder_ns: u64,
    /// Extra requester-NIC time (an injected stall).
    requester_ns: u64,
}

impl Shape {
    fn of(p: &SimParams, kind: OpKind, len: u64) -> Self {
        match kind {
            OpKind::Read => Shape {
                req: 0,
                req_header: headers::RETH,
                resp: len,
                resp_header: headers::AETH,
                responder_ns: 0,
                requester_ns: 0,
            },
            OpKind::Write => Shape {
                req: len,
                req_header: headers::RETH,
                resp: 0,
                resp_header: headers::AETH,
                responder_ns: 0,
                requester_ns: 0,
            },
            OpKind::Cas => Shape {
                req: 0,
                req_header: headers::ATOMIC_ETH,
                resp: 0,
                resp_header: headers::ATOMIC_ACK,
                responder_ns: p.nic_atomic_ns,
                requester_ns: 0,
            },
        }
    }
}

impl SimEndpoint {
    /// This endpoint's simulated thread, for [`Sim::spawn`].
    pub fn thread(&self) -> SimThread {
        SimThread(self.thread)
    }

    /// Another endpoint of the same simulated thread (its own counters), for code that uses
    /// two endpoints on one thread (an SD server's executor and its request I/O, a benchmark
    /// thread's clock beside its client).
    pub fn sibling(&self) -> SimEndpoint {
        SimEndpoint {
            shared: self.shared.clone(),
            node: self.node,
            thread: self.thread,
            slot: self.slot.clone(),
            stats: self.shared.stats.register(self.node),
            own_core: self.own_core,
            lane: self.lane.clone(),
            faults: self.shared.fault_stream(!self.own_core),
        }
    }

    /// CPU work of `cost` ns starting now; returns when it is done.
    fn cpu(&self, cost: u64) -> u64 {
        if self.own_core {
            return self.time() + cost;
        }
        let Some(lane) = &self.lane else {
            return self.shared.net().cpu(self.node, self.time(), cost);
        };
        // LN1: take the lane's next turn now (slots are served in the order they ask, each
        // waking once), wait for it, and for an earlier piece that waited for a core longer
        // than reserved; then book a core at that instant. One simulated thread runs at a
        // time, so the loads and stores do not race.
        let turn = self.time().max(lane.reserved.load(Ordering::SeqCst));
        lane.reserved.store(turn + cost, Ordering::SeqCst);
        let mut at = turn;
        loop {
            if at > self.time() {
                self.shared.sched.wait_until(self.thread, &self.slot, at);
            }
            at = lane.busy.load(Ordering::SeqCst);
            if at <= self.time() {
                break;
            }
        }
        let done = self.shared.net().cpu(self.node, self.time(), cost);
        lane.busy.store(done, Ordering::SeqCst);
        lane.reserved.fetch_max(done, Ordering::SeqCst);
        done
    }

    /// The thread's virtual time: its last dispatch, or now if it has since been blocked on
    /// a lock (the scheduler went on without it).
    pub fn time(&self) -> u64 {
        self.slot.clock().max(self.shared.sched.now())
    }

    /// First step of every operation: see [`crate::sched::Sched::checkin`].
    fn checkin(&self) {
        self.shared.sched.checkin(self.thread, &self.slot);
    }

    /// Wait until virtual time `t`, and then until the thread has its core (background
    /// processes may hold it: [`crate::slices`]).
    fn at(&self, t: u64) -> u64 {
        let t = self.shared.on_cpu(self.thread, t);
        self.shared.sched.wait_until(self.thread, &self.slot, t)
    }

    /// An injected fault's wait (`draw` gives its length; none without faults).
    fn fault(&mut self, draw: fn(&mut FaultStream, &FaultCounts) -> u64) {
        if let Some(f) = self.faults.as_mut() {
            let ns = draw(f, &self.shared.fault_counts);
            if ns > 0 {
                self.at(self.time().saturating_add(ns));
            }
        }
    }

    /// A thread whose node crashed issues nothing: it unwinds with [`NodeCrashed`] (with
    /// `resume_unwind`, so no panic message is printed).
    fn die_if_crashed(&self) {
        if self.shared.is_crashed(self.node) {
            std::panic::resume_unwind(Box::new(NodeCrashed { node: self.node }));
        }
    }

    /// Injected NIC stalls at the requester's and the responder's engines.
    fn nic_stalls(&mut self, shape: &mut Shape) {
        if let Some(f) = self.faults.as_mut() {
            shape.requester_ns = f.nic_stall(&self.shared.fault_counts);
            shape.responder_ns += f.nic_stall(&self.shared.fault_counts);
        }
    }

    /// READ, WRITE or CAS through the NIC: post, request, effect, response (module comment).
    fn fabric_op<T>(
        &mut self,
        kind: OpKind,
        addr: RemoteAddr,
        len: usize,
        effect: impl FnOnce(&WordMemory) -> Result<T, AccessError>,
    ) -> Result<T, FabricError> {
        let shared = self.shared.clone();
        let p = &shared.p;
        let mem = shared.checked(addr, len)?;
        self.checkin();
        self.fault(FaultStream::before);
        self.die_if_crashed();
        let mut shape = Shape::of(p, kind, len as u64);
        self.nic_stalls(&mut shape);
        let posted = self.cpu(p.cpu_op_ns);
        let t = self.at(posted);
        let local = addr.node == self.node;
        let effective = if local {
            self.loopback_request(t, &shape)
        } else {
            self.remote_request(addr.node, t, &shape)
        };
        let loss = match self.faults.as_mut() {
            Some(f) if !local => f.loss(&shared.fault_counts),
            _ => Loss::None,
        };
        let t = self.at(effective);
        if loss == Loss::Request {
            return Err(self.lost(kind, addr, len, posted, t, loss));
        }
        let r = effect(mem).map_err(|e| e.at(addr, len, mem));
        if kind != OpKind::Read {
            shared.written(addr, len, t);
        }
        if loss == Loss::Answer {
            return Err(self.lost(kind, addr, len, posted, t, loss));
        }
        let done = if local {
            shared.net().pcie(self.node, t, shape.resp)
        } else {
            self.remote_response(addr.node, t, &shape)
        };
        self.at(done);
        self.fault(FaultStream::after);
        let locality = if local {
            Locality::Loopback
        } else {
            Locality::Remote
        };
        self.stats.record(kind, locality, len as u64);
        r
    }

    /// A remote operation posted at `posted` whose request or answer (`loss`) was lost: the
    /// requester hears nothing and gives up at its timeout (at least `t`), not knowing
    /// whether the operation took effect.
    fn lost(
        &mut self,
        kind: OpKind,
        addr: RemoteAddr,
        len: usize,
        posted: u64,
        t: u64,
        loss: Loss,
    ) -> FabricError {
        let timeout = self.faults.as_ref().map_or(0, |f| f.loss_timeout_ns());
        self.at(posted.saturating_add(timeout).max(t));
        self.fault(FaultStream::after);
        self.stats.record(kind, Locality::Remote, len as u64);
        FabricError::Unreachable {
            node: addr.node,
            reason: format!("simulated loss of the {loss:?}"),
        }
    }

    /// From posting to the responder NIC's end of processing (the effect's instant).
    fn remote_request(&self, to: NodeId, t: u64, s: &Shape) -> u64 {
        let p = &self.shared.p;
        let wire = p.wire_bytes(s.req, s.req_header);
        let arrival = {
            let mut net = self.shared.net();
            let processed = net.nic(self.node, t, p.nic_op_ns + s.requester_ns);
            net.transmit(self.node, processed, wire)
        };
        let t = self.at(arrival);
        let mut net = self.shared.net();
        let received = net.deliver(to, t, wire);
        net.nic(to, received, p.nic_op_ns + s.responder_ns)
    }

    /// From the effect to the response's arrival at the requester.
    fn remote_response(&self, from: NodeId, t: u64, s: &Shape) -> u64 {
        let wire = self.shared.p.wire_bytes(s.resp, s.resp_header);
        let arrival = self.shared.net().transmit(from, t, wire);
        let t = self.at(arrival);
        self.shared.net().deliver(self.node, t, wire)
    }

    /// A request the NIC loops back to its own host: PCIe instead of the wire.
    fn loopback_request(&self, t: u64, s: &Shape) -> u64 {
        let p = &self.shared.p;
        let arrival = {
            let mut net = self.shared.net();
            let processed = net.nic(self.node, t, p.nic_op_ns + s.requester_ns);
            net.pcie(self.node, processed, s.req)
        };
        let t = self.at(arrival);
        self.shared
            .net()
            .nic(self.node, t, p.nic_op_ns + s.responder_ns)
    }

    /// A direct access to this node's memory: a fixed cost and a copy on one of its cores;
    /// it takes effect (`effect`) when the copy ends.
    fn direct(
        &mut self,
        region: RegionId,
        offset: u64,
        len: usize,
        effect: impl FnOnce(&WordMemory, RemoteAddr, &StatsCell) -> Result<(), FabricError>,
    ) -> Result<(), FabricError> {
        let addr = RemoteAddr::new(self.node, region, offset);
        let shared = self.shared.clone();
        let mem = shared.checked(addr, len)?;
        self.checkin();
        self.fault(FaultStream::before);
        self.die_if_crashed();
        let cost = shared.p.local_op_ns + shared.p.copy_ns(len as u64);
        let done = self.cpu(cost);
        self.at(done);
        let r = effect(mem, addr, &self.stats);
        self.fault(FaultStream::after);
        r
    }
}

impl Endpoint for SimEndpoint {
    fn node(&self) -> NodeId {
        self.node
    }

    fn node_count(&self) -> usize {
        self.shared.memory.len()
    }

    fn read(&mut self, addr: RemoteAddr, buf: &mut [u8]) -> Result<(), FabricError> {
        let len = buf.len();
        self.fabric_op(OpKind::Read, addr, len, |m| m.read(addr.offset, buf))
    }

    fn write(&mut self, addr: RemoteAddr, buf: &[u8]) -> Result<(), FabricError> {
        self.fabric_op(OpKind::Write, addr, buf.len(), |m| {
            m.write(addr.offset, buf)
        })
    }

    fn compare_and_swap(
        &mut self,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        self.fabric_op(OpKind::Cas, addr, 8, |m| {
            m.compare_and_swap(addr.offset, expected, desired)
        })
    }

    /// Op by op, as the default runs batches. Overlapping a batch's operations in virtual
    /// time is not straightforward in this model: an operation advances its thread's clock
    /// step by step (`at` on the request's arrival, at its effect, on the response), letting
    /// other threads run in between, so posting several before any completes would need the
    /// NIC and wire model to carry one requester's operations as concurrent events.
    /// `overlaps_batches` stays `false`, so callers do not batch READs they may not need and
    /// simulated runs are what they were.
    fn run_batch(&mut self, batch: &mut nessie_fabric::Batch<'_>) {
        batch.run_sequentially(self)
    }

    fn local_read(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        self.direct(region, offset, buf.len(), |mem, addr, stats| {
            nessie_fabric::memory::direct_read(mem, addr, buf, stats)
        })
    }

    fn local_write(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &[u8],
    ) -> Result<(), FabricError> {
        let shared = self.shared.clone();
        self.direct(region, offset, buf.len(), |mem, addr, stats| {
            shared.written(addr, buf.len(), shared.sched.now());
            nessie_fabric::memory::direct_write(mem, addr, buf, stats)
        })
    }

    fn now_ns(&self) -> u64 {
        SIM_EPOCH_NS + self.time()
    }

    fn mono_ns(&self) -> u64 {
        self.time()
    }

    fn mono_coarse_ns(&self) -> u64 {
        let t = self.time();
        t - t % SIM_COARSE_TICK_NS
    }

    fn coarse_lag_ns(&self) -> u64 {
        SIM_COARSE_TICK_NS
    }

    fn sleep_ns(&mut self, ns: u64) {
        self.checkin();
        self.at(self.time().saturating_add(ns));
    }

    fn virtual_time(&self) -> bool {
        true
    }

    fn idle_poll(&mut self, region: RegionId, watched: &[std::ops::Range<u64>]) {
        self.checkin();
        let shared = self.shared.clone();
        let wait = shared.sched.next_wait(self.thread);
        shared
            .watches
            .add(self.node, region, watched, self.thread, wait);
        self.at(self.time().saturating_add(IDLE_POLL_MAX_NS));
        shared.watches.remove(self.thread);
    }

    fn stats(&self) -> &StatsCell {
        &self.stats
    }
}
