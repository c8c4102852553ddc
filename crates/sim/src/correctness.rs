//! Correctness mode: the client-driven protocol on a simulated cluster with faults injected
//! ([`crate::faults`]), every operation recorded with its virtual invocation and response
//! times, and the history checked for linearizability (`nessie-check`). A run is a function of
//! its seed: a failing seed replays exactly (`nessie sim check --start-seed S --seeds 1`).

use std::borrow::Cow;

use nessie_bench::driver::{drive, Done, Observer};
use nessie_bench::workload::{KeyGen, Planned, Workload, WorkloadError};
use nessie_check::History;
use nessie_check::{Event, Limits, Op, Outcome, Report};
use nessie_fabric::{Endpoint, NodeId};
use nessie_protocols::cd::{CdClient, ClientStats};
use nessie_protocols::{Error, Fence, HookPoint, ProtocolConfig};
use nessie_store::Geometry;
use nessie_testkit::guarded::{self, GuardedSpec};
use nessie_testkit::stress::{history_entry, key_bytes, put_id, value_bytes, CORRUPT_VALUE};
use rand::SeedableRng;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use crate::bench::{MAX_OPS_PER_THREAD, MAX_THREADS};
use crate::cluster::SimCluster;
use nessie_fabric_sim::faults::FaultTotals;
use nessie_fabric_sim::{
    NodeCrashed, RunSummary, Sim, SimEndpoint, SimFaults, SimParams, SimThread,
};

/// Smallest value a run writes: values carry their 8-byte id, so every read is identified.
pub const MIN_VALUE_LEN: usize = 8;
/// Most keys a run may use (the checker's work grows with the history, not the keys; this
/// only bounds the preload).
pub const MAX_KEYS: u64 = 1 << 24;

/// One correctness run: the cluster, its load and its faults.
#[derive(Clone, Debug)]
pub struct CheckSpec {
    /// The cluster (`geometry.nodes` nodes).
    pub geometry: Geometry,
    pub cfg: ProtocolConfig,
    pub hw: SimParams,
    pub faults: SimFaults,
    /// Client threads on each node.
    pub threads_per_node: u16,
    pub ops_per_thread: u64,
    /// Keys 0..keys; the first `hot_keys` of them get `hot_fraction` of the operations.
    pub keys: u64,
    pub hot_keys: u64,
    pub hot_fraction: f64,
    pub get_fraction: f64,
    pub delete_fraction: f64,
    /// Value sizes, uniform in this range (at least [`MIN_VALUE_LEN`]).
    pub value_size: (usize, usize),
    /// Keys 0..preload_keys written (one writer per node) before the clients start; these
    /// writes are in the history too.
    pub preload_keys: u64,
    /// The operations: plain GETs, PUTs and DELETEs, or those mixed with conditional writes.
    pub mix: Mix,
    /// A node that crashes during the workload (`Mix::Plain` only).
    pub crash: Option<Crash>,
}

/// A node crash ([`CheckSpec::crash`]). The first time one of `node`'s client threads reaches
/// the protocol's hook point `at` at or after `after_ns` of virtual time, the node crashes
/// there ([`Sim::crash_node`]): that thread stops at once, its node's other threads when they
/// next try to issue an operation, and none of them acts again. The survivors' membership
/// declares the node failed at that moment (`Fence::set_gone`), so they complete its
/// abandoned entries once their deadlines have passed by the margin and an expiry period, as
/// for any writer known dead (`docs/protocol.md`). Its memory stays reachable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crash {
    pub node: NodeId,
    pub at: HookPoint,
    pub after_ns: u64,
}

/// What kills a client at its node's crash point: installed by the caller as (part of) the
/// client's protocol hook, since hooks exist only in builds with the protocol's `testing`
/// feature ([`run_with`]).
pub type CrashHook = Box<dyn FnMut(HookPoint) + Send>;

/// What [`run_with`] calls on each workload client before the run: its number, the client, and
/// the crash hook the caller must install on it, if its node is to crash.
pub type Prepare<'a> = dyn FnMut(usize, &mut CdClient<SimEndpoint>, Option<CrashHook>) + 'a;

/// What a correctness run's clients do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mix {
    /// GETs, PUTs and DELETEs (`get_fraction`, `delete_fraction`), values sized in
    /// `value_size`.
    #[default]
    Plain,
    /// The conditional-write stress's mix (`nessie_testkit::guarded`): plain operations with
    /// add, replace, and writes and deletes on a version read just before; values of
    /// `value_size.0` bytes (`get_fraction` and `delete_fraction` do not apply).
    Conditional,
}

/// Why a correctness run cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("{0}")]
    Spec(String),
    #[error(transparent)]
    Protocol(#[from] Error),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
}

impl CheckSpec {
    /// The client threads of the run.
    pub fn threads(&self) -> usize {
        self.geometry.nodes as usize * self.threads_per_node as usize
    }

    pub fn validate(&self) -> Result<(), CheckError> {
        let bad = |m: String| Err(CheckError::Spec(m));
        let threads = self.threads();
        if self.threads_per_node == 0 || threads > MAX_THREADS {
            return bad(format!(
                "{threads} client threads ({} per node) is not in 1..={MAX_THREADS}",
                self.threads_per_node
            ));
        }
        if !(1..=MAX_OPS_PER_THREAD).contains(&self.ops_per_thread) {
            return bad(format!(
                "{} operations per thread is not in 1..={MAX_OPS_PER_THREAD}",
                self.ops_per_thread
            ));
        }
        if !(1..=MAX_KEYS).contains(&self.keys) || self.preload_keys > self.keys {
            return bad(format!(
                "{} keys ({} preloaded): keys must be in 1..={MAX_KEYS}, the preload at most that",
                self.keys, self.preload_keys
            ));
        }
        let (lo, hi) = self.value_size;
        let max = self.geometry.value_max as usize;
        if lo < MIN_VALUE_LEN || lo > hi || hi > max {
            return bad(format!(
                "value sizes {lo}..={hi} are not an ordered range within {MIN_VALUE_LEN}..={max}"
            ));
        }
        let key_len = key_bytes(self.keys - 1).len();
        if key_len > self.geometry.key_max as usize {
            return bad(format!(
                "keys of {key_len} bytes exceed key_max = {}",
                self.geometry.key_max
            ));
        }
        self.workload()?;
        if let Some(c) = &self.crash {
            if c.node as u32 >= self.geometry.nodes || self.geometry.nodes < 2 {
                return bad(format!(
                    "a crash of node {} needs it and another node in a cluster of {}",
                    c.node, self.geometry.nodes
                ));
            }
            if self.mix != Mix::Plain {
                return bad("a node crash runs with the plain mix only".into());
            }
        }
        self.faults
            .validate()
            .map_err(|e| CheckError::Spec(e.to_string()))?;
        self.hw
            .validate()
            .map_err(|e| CheckError::Spec(e.to_string()))?;
        Ok(self.cfg.validate().map_err(Error::from)?)
    }

    fn workload(&self) -> Result<Workload, WorkloadError> {
        let keys = KeyGen::hot(self.keys, self.hot_keys, self.hot_fraction)?;
        Workload::new(
            keys,
            self.get_fraction,
            self.delete_fraction,
            self.value_size,
        )
    }
}

/// What a correctness run did and what the checker found.
pub struct CheckRun {
    pub seed: u64,
    /// The workload's run (the preload's is not included).
    pub summary: RunSummary,
    /// Every operation, preload included, in invocation order.
    pub events: Vec<Event>,
    pub report: Report,
    /// GETs that returned bytes nobody wrote.
    pub corrupt: u64,
    /// Keys no write could change after the workload ([`MAX_FINAL_ATTEMPTS`] PUTs failed,
    /// none for want of room): a key left wedged (by a copy nobody settles, say) is lost to
    /// its users even when every operation the history holds was linearizable.
    pub wedged: Vec<u64>,
    /// The workload clients' counters, summed.
    pub stats: ClientStats,
    pub faults: FaultTotals,
    /// Nodes that crashed ([`CheckSpec::crash`]).
    pub crashed: Vec<NodeId>,
}

impl CheckRun {
    /// Linearizable, and no read returned bytes nobody wrote.
    pub fn passed(&self) -> bool {
        self.report.is_ok() && self.corrupt == 0 && self.wedged.is_empty()
    }

    /// A hash of the history (FNV-1a over every event): equal for equal runs.
    pub fn history_digest(&self) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for e in &self.events {
            for b in format!("{e:?}").bytes() {
                h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    }
}

/// Records every operation of one client thread with its virtual invocation and response
/// times (an [`Observer`] of the workload loop), for the checker.
pub struct Recording {
    thread: u32,
    ops: u64,
    /// Another endpoint of the client's thread: its clock.
    timer: SimEndpoint,
    /// The history, in the thread's order.
    pub events: Vec<Event>,
    /// GETs that returned a value no PUT wrote.
    pub corrupt: u64,
    /// The operation invoked and not yet completed, with its invocation time.
    pending: Option<(Planned, u64)>,
}

impl Recording {
    /// The recorder of client `thread`, which does `ops` operations; `timer` is another
    /// endpoint of its simulated thread.
    pub fn new(thread: u32, ops: u64, timer: SimEndpoint) -> Self {
        Self {
            thread,
            ops,
            timer,
            events: Vec::new(),
            corrupt: 0,
            pending: None,
        }
    }

    /// The client's node crashed: the operation in progress never returns, so it is recorded
    /// as failed (it may take effect, as any failed operation may).
    pub fn crashed(&mut self, node: NodeId) {
        if let Some((op, invoke_ns)) = self.pending.take() {
            let reason = "its node crashed".to_string();
            self.record(&op, invoke_ns, &Err(Error::Unreachable { node, reason }));
        }
    }

    /// Record `op`, invoked at `invoke_ns`, answered `r` now; returns its outcome.
    fn record(&mut self, op: &Planned, invoke_ns: u64, r: &Result<Done<'_>, Error>) -> Outcome {
        let (kind, outcome) = history_entry(op, self.thread, r);
        self.events.push(Event {
            client: self.thread,
            key: op.key,
            op: kind,
            outcome: outcome.clone(),
            invoke_ns,
            response_ns: self.timer.mono_ns(),
        });
        outcome
    }
}

impl<C> Observer<C> for Recording {
    type Token = u64;

    fn proceed(&mut self, _: &C, seq: u64) -> bool {
        seq < self.ops
    }

    fn key(&self, k: u64) -> Vec<u8> {
        key_bytes(k)
    }

    fn value(&self, op: &Planned) -> Cow<'_, [u8]> {
        Cow::Owned(value_bytes(put_id(self.thread, op.seq), op.value_len))
    }

    fn invoke(&mut self, _: &C, op: &Planned) -> u64 {
        let t = self.timer.mono_ns();
        self.pending = Some((*op, t));
        t
    }

    fn complete(&mut self, _: &C, op: &Planned, invoke_ns: u64, r: Result<Done<'_>, Error>) {
        self.pending = None;
        let outcome = self.record(op, invoke_ns, &r);
        self.corrupt += (outcome == Outcome::Ok(Some(CORRUPT_VALUE))) as u64;
    }
}

/// A client and its clock, ready to run.
type Client = ((CdClient<SimEndpoint>, SimEndpoint), SimThread);

/// Run `spec` with `seed` and check its history. `prepare(i, client)` is called on each
/// workload client before the run (tests install protocol hooks there). A spec with a
/// [`Crash`] needs [`run_with`].
pub fn run(
    spec: &CheckSpec,
    seed: u64,
    prepare: &mut dyn FnMut(usize, &mut CdClient<SimEndpoint>),
) -> Result<CheckRun, CheckError> {
    if spec.crash.is_some() {
        return Err(CheckError::Spec(
            "a node crash needs the protocol's hooks: use correctness::run_with".into(),
        ));
    }
    run_with(spec, seed, &mut |i, c, _| prepare(i, c))
}

/// [`run`], handing each client of a crashing node its [`CrashHook`], which `prepare` must
/// install (a build without hooks cannot run a crash).
pub fn run_with(
    spec: &CheckSpec,
    seed: u64,
    prepare: &mut Prepare<'_>,
) -> Result<CheckRun, CheckError> {
    spec.validate()?;
    let (hw, f, g) = (spec.hw.clone(), spec.faults.clone(), spec.geometry.clone());
    let mut c = SimCluster::with_faults(hw, f, seed, g, spec.cfg.clone())?;
    let mut events = preload(&mut c, spec)?;
    let nodes = spec.geometry.nodes as usize;
    // The survivors' view of membership.
    let fence = Arc::new(Fence::unfenced());
    let mut clients: Vec<Client> = Vec::with_capacity(spec.threads());
    for i in 0..spec.threads() {
        let node = (i % nodes) as NodeId;
        let (mut client, thread) = c.client(node)?;
        let timer = client.endpoint().sibling();
        let crash = match spec.crash {
            Some(k) if k.node == node => Some(crash_hook(
                c.sim().clone(),
                fence.clone(),
                timer.sibling(),
                k,
            )),
            _ => {
                client.set_fence(fence.clone());
                None
            }
        };
        prepare(i, &mut client, crash);
        clients.push(((client, timer), thread));
    }
    let ran = match spec.mix {
        Mix::Plain => run_plain(&mut c, spec, seed, clients)?,
        Mix::Conditional => run_conditional(&mut c, spec, seed, clients),
    };
    let (summary, stats, corrupt) = (ran.summary, ran.stats, ran.corrupt);
    events.extend(ran.events);
    // Totals of the faulty part; the check after it runs without faults.
    let faults = c.sim().fault_totals();
    c.sim().end_faults();
    let crashed = (0..nodes as NodeId)
        .filter(|&n| c.sim().is_crashed(n))
        .collect();
    let (last, wedged) = final_writes(&mut c, spec, &fence)?;
    events.extend(last);
    events.sort_by_key(|e| (e.invoke_ns, e.client, e.response_ns));
    let report = nessie_check::check(&events, |_| None, &Limits::default());
    Ok(CheckRun {
        seed,
        summary,
        events,
        report,
        corrupt,
        wedged,
        stats,
        faults,
        crashed,
    })
}

/// The hook that crashes `k.node` when its client reaches `k.at` at or after `k.after_ns`
/// (`timer`: another endpoint of that client's thread, for the time).
fn crash_hook(sim: Sim, fence: Arc<Fence>, timer: SimEndpoint, k: Crash) -> CrashHook {
    Box::new(move |p| {
        if p == k.at && timer.mono_ns() >= k.after_ns {
            fence.set_gone(k.node, true);
            sim.crash_node(k.node);
            resume_unwind(Box::new(NodeCrashed { node: k.node }));
        }
    })
}

/// What the workload's clients did: their events, reads of bytes nobody wrote, counters.
struct Ran {
    summary: RunSummary,
    events: Vec<Event>,
    corrupt: u64,
    stats: ClientStats,
}

/// The plain workload (`Mix::Plain`) on `clients`.
fn run_plain(
    c: &mut SimCluster,
    spec: &CheckSpec,
    seed: u64,
    clients: Vec<Client>,
) -> Result<Ran, CheckError> {
    let threads = clients.len() as u64;
    let (ops, workload) = (spec.ops_per_thread, spec.workload()?);
    let (sim, nodes) = (c.sim().clone(), spec.geometry.nodes as usize);
    let (summary, done) = c.run(clients, move |i, (mut client, timer)| {
        let mut rec = Recording::new(i as u32, ops, timer);
        let mut w = workload.for_thread(i as u64, threads);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ (i as u64) << 32);
        let ran = catch_unwind(AssertUnwindSafe(|| {
            drive(&mut client, &mut w, &mut rng, &mut rec)
        }));
        if let Err(p) = ran {
            // Whatever a thread of a crashed node was doing ends with it (a sibling may even
            // find the allocator lock poisoned by the thread that died holding it).
            let node = (i % nodes) as NodeId;
            if !p.is::<NodeCrashed>() && !sim.is_crashed(node) {
                resume_unwind(p);
            }
            rec.crashed(node);
        }
        (rec, client.stats())
    });
    let mut ran = Ran {
        summary,
        events: Vec::new(),
        corrupt: 0,
        stats: ClientStats::default(),
    };
    for (rec, st) in done {
        ran.stats += st;
        ran.corrupt += rec.corrupt;
        ran.events.extend(rec.events);
    }
    Ok(ran)
}

/// The conditional-write mix (`Mix::Conditional`) on `clients`, each thread's events timed by
/// its virtual clock.
fn run_conditional(c: &mut SimCluster, spec: &CheckSpec, seed: u64, clients: Vec<Client>) -> Ran {
    let g = GuardedSpec {
        ops_per_thread: spec.ops_per_thread,
        keys: spec.keys,
        hot_keys: spec.hot_keys,
        hot_fraction: spec.hot_fraction,
        value_len: spec.value_size.0,
        seed,
        // Virtual time: the run ends when the operations do.
        time_limit: Duration::MAX,
    };
    let history = History::new();
    let shared = history.clone();
    let (summary, done) = c.run(clients, move |i, (client, timer)| {
        let rec = history.recorder_with_clock(i as u32, Box::new(move || timer.mono_ns()));
        let mut w = guarded::Worker::new(i as u32, client, rec, &g);
        while w.ops < g.ops_per_thread {
            w.step();
        }
        w.flush();
        (w.corrupt, w.client.stats())
    });
    let mut ran = Ran {
        summary,
        events: shared.into_events(),
        corrupt: 0,
        stats: ClientStats::default(),
    };
    for (corrupt, st) in done {
        ran.stats += st;
        ran.corrupt += corrupt;
    }
    ran
}

/// Most PUTs of one key after the workload (without faults) before it counts as wedged, each
/// attempt itself retrying contention.
pub const MAX_FINAL_ATTEMPTS: u32 = 8;
/// Expiry periods the final writers wait first.
const FINAL_SETTLE_EXPIRIES: u64 = 3;

/// After the workload, on clients without faults: every key written once more (one writer per
/// node, client numbers after the preload's), then read back, all recorded; keys that no PUT
/// could change are returned as wedged.
fn final_writes(
    c: &mut SimCluster,
    spec: &CheckSpec,
    fence: &Arc<Fence>,
) -> Result<(Vec<Event>, Vec<u64>), CheckError> {
    let first = spec.threads() as u32 + spec.geometry.nodes;
    // On the nodes that did not crash, knowing which did.
    let alive: Vec<NodeId> = (0..spec.geometry.nodes as NodeId)
        .filter(|&n| !c.sim().is_crashed(n))
        .collect();
    let nodes = alive.len() as u64;
    let mut writers = node_writers(c, &alive)?;
    for ((w, _), _) in &mut writers {
        w.set_fence(fence.clone());
    }
    let (keys, len) = (spec.keys, spec.value_size.0);
    // Writes the workload left behind are everyone's to complete once they expire.
    let settle_ns = FINAL_SETTLE_EXPIRIES * spec.cfg.expiry_ns;
    let (_, out) = c.run(
        writers,
        move |n, (mut w, mut timer): (CdClient<_>, SimEndpoint)| {
            timer.sleep_ns(settle_ns);
            let mut f = FinalWriter {
                client: first + n as u32,
                seq: 0,
                len,
                timer,
                events: Vec::new(),
                wedged: Vec::new(),
            };
            for key in (n as u64..keys).step_by(nodes as usize) {
                f.write_back(&mut w, key);
            }
            (f.events, f.wedged)
        },
    );
    let (mut events, mut wedged) = (Vec::new(), Vec::new());
    for (e, w) in out {
        events.extend(e);
        wedged.extend(w);
    }
    wedged.sort_unstable();
    Ok((events, wedged))
}

/// One writer of [`final_writes`]: what it recorded, and the keys it found wedged.
struct FinalWriter {
    client: u32,
    seq: u64,
    len: usize,
    timer: SimEndpoint,
    events: Vec<Event>,
    wedged: Vec<u64>,
}

impl FinalWriter {
    fn record(&mut self, key: u64, op: Op, outcome: Outcome, invoke_ns: u64) {
        self.events.push(Event {
            client: self.client,
            key,
            op,
            outcome,
            invoke_ns,
            response_ns: self.timer.mono_ns(),
        });
    }

    /// GET `key` and record what it answers.
    fn read(&mut self, w: &mut CdClient<SimEndpoint>, key: u64) {
        let t = self.timer.mono_ns();
        let mut got = Vec::new();
        let outcome = match w.get_into(&key_bytes(key), &mut got) {
            Ok(true) => Outcome::Ok(Some(nessie_testkit::stress::value_id(&got))),
            Ok(false) => Outcome::Ok(None),
            Err(_) => Outcome::Failed,
        };
        self.record(key, Op::Get, outcome, t);
    }

    /// GET `key` (a value the workload lost shows here, before a write replaces it), PUT it
    /// (up to [`MAX_FINAL_ATTEMPTS`] times), then GET it back.
    fn write_back(&mut self, w: &mut CdClient<SimEndpoint>, key: u64) {
        self.read(w, key);
        for _ in 0..MAX_FINAL_ATTEMPTS {
            let id = put_id(self.client, self.seq);
            self.seq += 1;
            let t = self.timer.mono_ns();
            let r = w.put(&key_bytes(key), &value_bytes(id, self.len));
            let outcome = if r.is_ok() {
                Outcome::Ok(None)
            } else {
                Outcome::Failed
            };
            self.record(key, Op::Put(id), outcome, t);
            match r {
                Ok(()) => return self.read(w, key),
                // A full table refuses a new key: not a wedge.
                Err(Error::IndexFull { .. } | Error::DataTableFull { .. }) => return,
                Err(_) => {}
            }
        }
        self.wedged.push(key);
    }
}

/// One client on each of `nodes`, with its clock: the preload's and the final writes' writers.
fn node_writers(c: &mut SimCluster, nodes: &[NodeId]) -> Result<Vec<Client>, CheckError> {
    nodes
        .iter()
        .map(|&n| {
            let (client, thread) = c.client(n)?;
            let timer = client.endpoint().sibling();
            Ok(((client, timer), thread))
        })
        .collect()
}

/// Write keys `0..spec.preload_keys`, one writer per node (client numbers after the
/// workload's), recording each write.
fn preload(c: &mut SimCluster, spec: &CheckSpec) -> Result<Vec<Event>, CheckError> {
    if spec.preload_keys == 0 {
        return Ok(Vec::new());
    }
    let nodes = spec.geometry.nodes as u64;
    let first = spec.threads() as u32;
    let all: Vec<NodeId> = (0..nodes as NodeId).collect();
    let writers = node_writers(c, &all)?;
    let (keys, len) = (spec.preload_keys, spec.value_size.0);
    let (_, events) = c.run(
        writers,
        move |n, (mut w, timer): (CdClient<_>, SimEndpoint)| {
            let client = first + n as u32;
            let mut events = Vec::new();
            for (seq, key) in (n as u64..keys).step_by(nodes as usize).enumerate() {
                let id = put_id(client, seq as u64);
                let invoke_ns = timer.mono_ns();
                let r = w.put(&key_bytes(key), &value_bytes(id, len));
                events.push(Event {
                    client,
                    key,
                    op: Op::Put(id),
                    outcome: if r.is_ok() {
                        Outcome::Ok(None)
                    } else {
                        Outcome::Failed
                    },
                    invoke_ns,
                    response_ns: timer.mono_ns(),
                });
            }
            events
        },
    );
    Ok(events.into_iter().flatten().collect())
}
