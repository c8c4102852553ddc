//! Concurrency stress harness: client threads hammer a key space (with hot keys), every
//! operation is recorded with its invocation and response time, and the history is checked for
//! linearizability key by key. Works with any [`KvClient`] (any protocol, any fabric).
//!
//! Every written value is unique: its first 8 bytes are a value id (thread << 40 | sequence)
//! and the rest is filler derived from the id, so a torn or mixed-up value is detected on read
//! and reported as a read of a value nobody wrote.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nessie_bench::driver::{drive, drive_pipelined, Done, Observer};
use nessie_bench::workload::{KeyGen, OpKind, Planned, Workload};
use nessie_check::{
    Event, History, Invocation, KeyId, Limits, Op, Outcome, Recorder, Report, ValueId,
};
use nessie_fabric::Post;
use nessie_inflight::Pipeline;
use nessie_protocols::{Error, KvClient};
use rand::rngs::SmallRng;
use rand::SeedableRng;

/// Value id recorded for a read that returned bytes no writer produced.
pub const CORRUPT_VALUE: ValueId = u64::MAX;

#[derive(Clone, Debug)]
pub struct StressSpec {
    /// Operations each client thread performs (upper bound; see `time_limit`).
    pub ops_per_thread: u64,
    /// Keys in the key space.
    pub keys: u64,
    /// The first `hot_keys` keys receive `hot_fraction` of the operations.
    pub hot_keys: u64,
    pub hot_fraction: f64,
    /// Operation mix; the rest are PUTs.
    pub get_fraction: f64,
    pub delete_fraction: f64,
    /// Value sizes are drawn uniformly from this range (at least 8 bytes).
    pub value_size: (usize, usize),
    /// Every key keeps one size, spread over `value_size` by key, instead of a size drawn per
    /// PUT (`Workload::with_sizes_by_key`).
    pub sizes_by_key: bool,
    pub seed: u64,
    /// Hard bound on the run's duration: threads stop early when it is reached.
    pub time_limit: Duration,
    /// Keys written once by thread 0 before the measured run (e.g. to fill the index).
    pub preload_keys: u64,
    /// Threads go on past `ops_per_thread` until this is set (by a test's nemesis once its
    /// faults are done, so that a loaded machine cannot end the run before them), up to
    /// [`MAX_OPS_FACTOR`] times as many operations and the time limit.
    pub until: Option<Arc<AtomicBool>>,
    /// Every `n`th PUT of a thread writes an item that expires this long after it is written
    /// (`KvClient::put_parts_expiring`); the history holds each expiry ([`Op::Expire`]).
    pub ttl: Option<(u64, Duration)>,
    /// `Some((n, range))`: each thread's values switch between `value_size` and `range`
    /// every `n` operations (`value_size` first; drawn uniformly in either): a workload whose
    /// value size keeps changing, for the page mover.
    pub size_shift: Option<(u64, (usize, usize))>,
}

/// How far an expiry's place in the history may be from its true one: the error of mapping
/// the store's clock (the wall clock) onto the history's, read one after the other.
pub const EXPIRY_SLACK: Duration = Duration::from_micros(50);

/// Most operations a thread performs while waiting for [`StressSpec::until`], in multiples
/// of `ops_per_thread`: the histories of failed writes grow the checker's work fast (a run
/// six times as long, mostly failures of clients on crashed nodes, once took 15 GB).
pub const MAX_OPS_FACTOR: u64 = 2;
/// Pause before each operation past `ops_per_thread` while waiting for [`StressSpec::until`]:
/// the waiting keeps some load on, not the full rate.
pub const UNTIL_PAUSE: Duration = Duration::from_millis(1);

impl Default for StressSpec {
    fn default() -> Self {
        Self {
            ops_per_thread: 10_000,
            keys: 1_000,
            hot_keys: 4,
            hot_fraction: 0.5,
            get_fraction: 0.5,
            delete_fraction: 0.1,
            value_size: (8, 64),
            sizes_by_key: false,
            seed: 1,
            time_limit: Duration::from_secs(60),
            preload_keys: 0,
            until: None,
            ttl: None,
            size_shift: None,
        }
    }
}

/// What a stress run produced.
pub struct StressOutcome {
    pub report: Report,
    /// Operations performed (all threads, excluding preload).
    pub ops: u64,
    /// Successful operations.
    pub ok_ops: u64,
    /// Errors by kind (`Debug` of the error's variant name).
    pub errors: BTreeMap<String, u64>,
    /// Reads that returned bytes no writer wrote.
    pub corrupt_reads: u64,
    /// Reads that returned the value of a PUT that failed. The checker allows it (a failed
    /// write may have taken effect), but a protocol whose failed writes never commit, like
    /// the client-driven one, must have none.
    pub failed_writes_read: u64,
    pub elapsed: Duration,
    /// True if the time limit cut the run short.
    pub truncated: bool,
    /// Keys the writes evicted (`KvClient::evicted`), each in the history as a DELETE.
    pub evictions: u64,
    /// Evictions that may or may not have taken effect (`KvClient::evicted_unsure`), each in
    /// the history as a failed DELETE.
    pub evictions_unsure: u64,
    /// PUTs of items with an expiry ([`StressSpec::ttl`]), each expiry in the history.
    pub expiries: u64,
    /// The longest time in which no operation of any client completed successfully: how long
    /// the store stalled (while nodes failed, say).
    pub longest_stall: Duration,
}

/// The threads' counts, summed.
#[derive(Default)]
struct Tally {
    ops: u64,
    ok: u64,
    corrupt: u64,
    errors: BTreeMap<String, u64>,
    truncated: bool,
    evictions: u64,
    evictions_unsure: u64,
    expiries: u64,
}

impl Tally {
    /// Add one finished thread (dropping it flushes its part of the history).
    fn add(&mut self, ops: u64, t: StressThread) {
        self.ops += ops;
        self.ok += t.ok;
        self.corrupt += t.corrupt;
        self.truncated |= t.truncated;
        self.evictions += t.evictions;
        self.evictions_unsure += t.evictions_unsure;
        self.expiries += t.expiries;
        for (kind, n) in t.errors {
            *self.errors.entry(kind).or_default() += n;
        }
    }
}

impl std::fmt::Display for StressOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} ops ({} ok) in {:.2?}{}; errors {:?}; corrupt reads {}; failed writes read {}; \
             evictions {} ({} unsure); longest stall {:.2?}",
            self.ops,
            self.ok_ops,
            self.elapsed,
            if self.truncated {
                " (time limit reached)"
            } else {
                ""
            },
            self.errors,
            self.corrupt_reads,
            self.failed_writes_read,
            self.evictions,
            self.evictions_unsure,
            self.longest_stall
        )?;
        write!(f, "{}", self.report)
    }
}

pub fn key_bytes(k: KeyId) -> Vec<u8> {
    format!("key-{k:08}").into_bytes()
}

/// The key id of [`key_bytes`]'s bytes.
pub fn key_id(bytes: &[u8]) -> Option<KeyId> {
    std::str::from_utf8(bytes.strip_prefix(b"key-")?)
        .ok()?
        .parse()
        .ok()
}

/// The bytes of value `id`, `len` bytes long (len ≥ 8).
pub fn value_bytes(id: ValueId, len: usize) -> Vec<u8> {
    let mut v = id.to_le_bytes().to_vec();
    v.extend(
        (8..len.max(8)).map(|i| (id.wrapping_mul(31).wrapping_add(i as u64 * 131) >> 3) as u8),
    );
    v
}

/// The id of a value written by [`value_bytes`], or [`CORRUPT_VALUE`].
pub fn value_id(bytes: &[u8]) -> ValueId {
    if bytes.len() < 8 {
        return CORRUPT_VALUE;
    }
    let id = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    if id == CORRUPT_VALUE || value_bytes(id, bytes.len()) != bytes {
        return CORRUPT_VALUE;
    }
    id
}

fn error_kind(e: &Error) -> String {
    let s = format!("{e:?}");
    s.split([' ', '{', '(']).next().unwrap_or("?").to_string()
}

/// The id thread `thread` gives the value of its operation `seq`: unique across the run.
pub fn put_id(thread: u32, seq: u64) -> ValueId {
    (thread as u64) << 40 | seq
}

/// How a finished operation goes into the history: its operation and outcome. A GET's value is
/// identified by [`value_id`], so bytes nobody wrote show up as [`CORRUPT_VALUE`].
pub fn history_entry(op: &Planned, thread: u32, r: &Result<Done, Error>) -> (Op, Outcome) {
    let kind = match op.kind {
        OpKind::Get => Op::Get,
        OpKind::Put | OpKind::Insert => Op::Put(put_id(thread, op.seq)),
        OpKind::Delete => Op::Delete,
        OpKind::ReadModifyWrite => unreachable!("the stress mixes have no read-modify-write"),
    };
    let outcome = match r {
        Ok(Done::Got(v)) => Outcome::Ok(v.map(value_id)),
        Ok(_) => Outcome::Ok(None),
        Err(_) => Outcome::Failed,
    };
    (kind, outcome)
}

/// Reads in `events` that returned the value of a failed PUT or conditional PUT (values are
/// unique per run).
pub fn failed_writes_read(events: &[Event]) -> u64 {
    let failed: HashSet<ValueId> = events
        .iter()
        .filter_map(|e| match (&e.op, &e.outcome) {
            (Op::Put(v) | Op::PutIf(v, _), Outcome::Failed) => Some(*v),
            _ => None,
        })
        .collect();
    events
        .iter()
        .filter(|e| {
            matches!((&e.op, &e.outcome), (Op::Get, Outcome::Ok(Some(v))) if failed.contains(v))
        })
        .count() as u64
}

/// The longest time between two successful completions in `events` (any client's): how long
/// the store served nobody. Expiries, which are no calls, do not count.
pub fn longest_stall(events: &[Event]) -> Duration {
    let mut done: Vec<u64> = events
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Ok(_)) && !matches!(e.op, Op::Expire(_)))
        .map(|e| e.response_ns)
        .collect();
    done.sort_unstable();
    let gap = done.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    Duration::from_nanos(gap)
}

/// One stress thread's side of the workload loop: records every operation in the history and
/// counts outcomes; stops after `ops_per_thread` operations or at the deadline.
struct StressThread {
    thread: u32,
    rec: Recorder,
    ops_per_thread: u64,
    until: Option<Arc<AtomicBool>>,
    deadline: Instant,
    ok: u64,
    corrupt: u64,
    errors: BTreeMap<String, u64>,
    truncated: bool,
    evictions: u64,
    evictions_unsure: u64,
    ttl: Option<(u64, Duration)>,
    /// The expiry of each PUT in progress (by its sequence number), by the history's clock.
    expiring: HashMap<u64, u64>,
    /// Expiries recorded.
    expiries: u64,
    size_shift: Option<(u64, (usize, usize))>,
}

impl StressThread {
    fn new(thread: u32, rec: Recorder, spec: &StressSpec, deadline: Instant) -> Self {
        Self {
            thread,
            rec,
            ops_per_thread: spec.ops_per_thread,
            until: spec.until.clone(),
            deadline,
            ok: 0,
            corrupt: 0,
            errors: BTreeMap::new(),
            truncated: false,
            evictions: 0,
            evictions_unsure: 0,
            ttl: spec.ttl,
            expiring: HashMap::new(),
            expiries: 0,
            size_shift: spec.size_shift,
        }
    }
}

impl StressThread {
    fn go_on(&mut self, seq: u64) -> bool {
        if seq >= self.ops_per_thread {
            let waiting = self
                .until
                .as_ref()
                .is_some_and(|u| !u.load(std::sync::atomic::Ordering::SeqCst));
            if !waiting || seq >= MAX_OPS_FACTOR * self.ops_per_thread {
                return false;
            }
            std::thread::sleep(UNTIL_PAUSE);
        }
        // Reading the clock every operation would dominate in-process runs.
        if seq.is_multiple_of(64) && Instant::now() >= self.deadline {
            self.truncated = true;
            return false;
        }
        true
    }

    fn value_of(&self, op: &Planned) -> Cow<'_, [u8]> {
        let len = match self.size_shift {
            // The planned size, spread over the new range (any length identifies a value).
            Some((n, (lo, hi))) if (op.seq / n) % 2 == 1 => lo + op.value_len % (hi - lo + 1),
            _ => op.value_len,
        };
        Cow::Owned(value_bytes(put_id(self.thread, op.seq), len))
    }

    fn expires_of(&mut self, op: &Planned) -> u64 {
        let Some((every, ttl)) = self.ttl else {
            return 0;
        };
        if !op.seq.is_multiple_of(every) {
            return 0;
        }
        let ttl = ttl.as_nanos() as u64;
        let wall = nessie_fabric::wall_clock_ns();
        self.expiring.insert(op.seq, self.rec.now_ns() + ttl);
        wall + ttl
    }

    /// Record operation `op`, invoked at `inv`, which returned `r` and evicted `evicted`
    /// (sure) and `unsure` keys.
    fn record(
        &mut self,
        op: &Planned,
        inv: Invocation,
        r: Result<Done<'_>, Error>,
        evicted: &[Vec<u8>],
        unsure: &[Vec<u8>],
    ) {
        let (kind, outcome) = history_entry(op, self.thread, &r);
        if outcome == Outcome::Ok(Some(CORRUPT_VALUE)) {
            self.corrupt += 1;
        }
        if let (Some(at), Op::Put(v)) = (self.expiring.remove(&op.seq), &kind) {
            // Failed or not: an expiry of a value the key never held changes nothing. A PUT
            // that took effect after its item's expiry time wrote an item absent from then
            // on: the expiry may come as late as the PUT's response.
            let slack = EXPIRY_SLACK.as_nanos() as u64;
            let end = (at + slack).max(self.rec.now_ns());
            let e = Op::Expire(*v);
            self.rec
                .record_at(op.key, e, Outcome::Ok(None), at - slack, end);
            self.expiries += 1;
        }
        self.rec.complete(inv, op.key, kind, outcome);
        // Keys the operation evicted (a GET's too: completing an abandoned write takes an
        // entry): DELETEs that took effect within its interval.
        for key in evicted {
            let k = key_id(key).expect("an evicted key is one of the run's");
            self.rec.complete(inv, k, Op::Delete, Outcome::Ok(None));
            self.evictions += 1;
        }
        // Evictions that may or may not have taken effect: failed DELETEs.
        for key in unsure {
            let k = key_id(key).expect("an evicted key is one of the run's");
            self.rec.complete(inv, k, Op::Delete, Outcome::Failed);
            self.evictions_unsure += 1;
        }
        match r {
            Ok(_) => self.ok += 1,
            Err(e) => *self.errors.entry(error_kind(&e)).or_default() += 1,
        }
    }
}

impl<C: KvClient> Observer<C> for StressThread {
    type Token = Invocation;

    fn proceed(&mut self, _: &C, seq: u64) -> bool {
        self.go_on(seq)
    }

    fn key(&self, k: u64) -> Vec<u8> {
        key_bytes(k)
    }

    fn value(&self, op: &Planned) -> Cow<'_, [u8]> {
        self.value_of(op)
    }

    fn invoke(&mut self, _: &C, _: &Planned) -> Invocation {
        self.rec.invoke()
    }

    fn expires(&mut self, op: &Planned) -> u64 {
        self.expires_of(op)
    }

    fn complete(&mut self, c: &C, op: &Planned, inv: Invocation, r: Result<Done<'_>, Error>) {
        self.record(op, inv, r, c.evicted(), c.evicted_unsure());
    }
}

/// The stress observer of a thread driving a pipeline ([`run_pipelined`]): a
/// [`StressThread`], told each operation's evictions by the driver.
struct PipelinedThread {
    inner: StressThread,
    evicted: Vec<Vec<u8>>,
    unsure: Vec<Vec<u8>>,
}

impl<E: Post + 'static> Observer<Pipeline<E>> for PipelinedThread {
    type Token = Invocation;

    fn proceed(&mut self, _: &Pipeline<E>, seq: u64) -> bool {
        self.inner.go_on(seq)
    }

    fn key(&self, k: u64) -> Vec<u8> {
        key_bytes(k)
    }

    fn value(&self, op: &Planned) -> Cow<'_, [u8]> {
        self.inner.value_of(op)
    }

    fn invoke(&mut self, _: &Pipeline<E>, _: &Planned) -> Invocation {
        self.inner.rec.invoke()
    }

    fn expires(&mut self, op: &Planned) -> u64 {
        self.inner.expires_of(op)
    }

    fn completed_in_flight(&mut self, done: &nessie_inflight::Completion) {
        self.evicted.clone_from(&done.evicted);
        self.unsure.clone_from(&done.evicted_unsure);
    }

    fn complete(
        &mut self,
        _: &Pipeline<E>,
        op: &Planned,
        inv: Invocation,
        r: Result<Done<'_>, Error>,
    ) {
        let (evicted, unsure) = (
            std::mem::take(&mut self.evicted),
            std::mem::take(&mut self.unsure),
        );
        self.inner.record(op, inv, r, &evicted, &unsure);
    }
}

/// With `$NESSIE_HISTORY_DIR` set, write each key the check rejected or could not decide,
/// its whole history in invocation order, to `key-<id>.txt` there: the report names one
/// conflict, the file holds what led to it.
fn dump_violations(events: &[Event], report: &nessie_check::Report) {
    let Some(dir) = std::env::var_os("NESSIE_HISTORY_DIR") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    for v in report.violations().chain(report.unknown()) {
        let mut mine: Vec<_> = events.iter().filter(|e| e.key == v.key).collect();
        mine.sort_by_key(|e| (e.invoke_ns, e.response_ns));
        let text: String = mine.iter().map(|e| format!("{e}\n")).collect();
        let path = dir.join(format!("key-{}.txt", v.key));
        match std::fs::write(&path, text) {
            Ok(()) => eprintln!("history of key {} in {}", v.key, path.display()),
            Err(e) => eprintln!("cannot write {}: {e}", path.display()),
        }
    }
}

/// Write keys `0..keys` once from `client`, recording the writes (they are part of the history).
fn preload<C: KvClient>(client: &mut C, rec: &mut Recorder, keys: u64, value_len: usize) {
    for k in 0..keys {
        let id = (1u64 << 62) | k;
        let inv = rec.invoke();
        let r = client.put(&key_bytes(k), &value_bytes(id, value_len));
        let outcome = if r.is_ok() {
            Outcome::Ok(None)
        } else {
            Outcome::Failed
        };
        rec.complete(inv, k, Op::Put(id), outcome);
    }
}

/// [`preload`] through a pipeline, one write at a time.
fn preload_pipelined<E: Post + 'static>(
    p: &mut Pipeline<E>,
    rec: &mut Recorder,
    keys: u64,
    value_len: usize,
) {
    for k in 0..keys {
        let id = (1u64 << 62) | k;
        let inv = rec.invoke();
        let done = p.run(nessie_inflight::Op::put(
            key_bytes(k),
            value_bytes(id, value_len),
        ));
        let outcome = match done.result {
            Ok(_) => Outcome::Ok(None),
            Err(_) => Outcome::Failed,
        };
        rec.complete(inv, k, Op::Put(id), outcome);
    }
}

/// Run `clients` (one thread each) against the spec, check the history, and hand the clients
/// back (their statistics are the caller's to inspect).
pub fn run<C: KvClient + 'static>(clients: Vec<C>, spec: &StressSpec) -> (StressOutcome, Vec<C>) {
    run_checked(clients, spec, &Limits::default())
}

/// [`run`], checking the history within `limits` (a larger search budget for histories with
/// many failed writes, each of which may or may not have taken effect).
pub fn run_checked<C: KvClient + 'static>(
    mut clients: Vec<C>,
    spec: &StressSpec,
    limits: &Limits,
) -> (StressOutcome, Vec<C>) {
    assert!(!clients.is_empty());
    let workload = workload_of(spec);
    let history = History::new();
    let preload_keys = spec.preload_keys.min(spec.keys);
    preload(
        &mut clients[0],
        &mut history.recorder(0),
        preload_keys,
        spec.value_size.0,
    );

    let start = Instant::now();
    let deadline = start + spec.time_limit;
    let threads_n = clients.len() as u64;
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(t, mut client)| {
            let mut obs = StressThread::new(t as u32, history.recorder(t as u32), spec, deadline);
            let mut workload = workload.for_thread(t as u64, threads_n);
            let seed = thread_seed(spec, t);
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed);
                let ops = drive(&mut client, &mut workload, &mut rng, &mut obs);
                (client, ops, obs)
            })
        })
        .collect();

    let mut tally = Tally::default();
    let clients = threads
        .into_iter()
        .map(|t| {
            let (client, ops, obs) = t.join().expect("stress thread panicked");
            tally.add(ops, obs);
            client
        })
        .collect();
    (finish(history, tally, start, limits), clients)
}

/// [`run_checked`] with many operations in flight per thread: each of `makers` builds, on a
/// thread of its own, the pipeline (`nessie_inflight`) that the thread drives
/// ([`drive_pipelined`]), keeping up to its slot count of the spec's operations in flight.
/// Operations on one key from one thread complete in submission order (the pipeline's P1);
/// on different keys they overlap, and each is recorded from its submission to its
/// completion. The first thread preloads, before any thread starts its operations.
pub fn run_pipelined<E, F>(makers: Vec<F>, spec: &StressSpec, limits: &Limits) -> StressOutcome
where
    E: Post + 'static,
    F: FnOnce() -> Pipeline<E> + Send + 'static,
{
    assert!(!makers.is_empty());
    let workload = workload_of(spec);
    let history = History::new();
    let preload_keys = spec.preload_keys.min(spec.keys);
    let threads_n = makers.len() as u64;
    // Every thread builds its pipeline, thread 0 preloads, then all start.
    let ready = Arc::new(std::sync::Barrier::new(makers.len()));
    let (value_len, time_limit) = (spec.value_size.0, spec.time_limit);
    // Until every pipeline is built and the preload done, then the run's start.
    let start = Arc::new(std::sync::Mutex::new(Instant::now()));
    let threads: Vec<_> = makers
        .into_iter()
        .enumerate()
        .map(|(t, make)| {
            let mut obs = PipelinedThread {
                // The deadline is set once the preload is done.
                inner: StressThread::new(
                    t as u32,
                    history.recorder(t as u32),
                    spec,
                    Instant::now(),
                ),
                evicted: Vec::new(),
                unsure: Vec::new(),
            };
            let mut workload = workload.for_thread(t as u64, threads_n);
            let (seed, ready, start) = (thread_seed(spec, t), ready.clone(), start.clone());
            std::thread::spawn(move || {
                // Arrive at the barrier even if building or preloading panics, or the other
                // threads would wait there for ever; the panic goes on after it.
                let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut pipeline = make();
                    if t == 0 {
                        let rec = &mut obs.inner.rec;
                        preload_pipelined(&mut pipeline, rec, preload_keys, value_len);
                    }
                    pipeline
                }));
                ready.wait();
                let mut pipeline = built.unwrap_or_else(|p| std::panic::resume_unwind(p));
                let now = Instant::now();
                if t == 0 {
                    *start.lock().unwrap() = now;
                }
                obs.inner.deadline = now + time_limit;
                let mut rng = SmallRng::seed_from_u64(seed);
                let ops = drive_pipelined(&mut pipeline, &mut workload, &mut rng, &mut obs);
                (ops, obs.inner)
            })
        })
        .collect();
    let mut tally = Tally::default();
    for t in threads {
        let (ops, obs) = t.join().expect("stress thread panicked");
        tally.add(ops, obs);
    }
    let start = *start.lock().unwrap();
    finish(history, tally, start, limits)
}

/// The spec's workload, checked.
fn workload_of(spec: &StressSpec) -> Arc<Workload> {
    assert!(spec.keys > 0 && spec.hot_keys <= spec.keys);
    assert!(spec.value_size.0 >= 8 && spec.value_size.0 <= spec.value_size.1);
    if let Some((n, (lo, hi))) = spec.size_shift {
        assert!(
            n > 0 && lo >= 8 && lo <= hi,
            "a size shift every {n} to {lo}..={hi}"
        );
    }
    let keys = KeyGen::hot(spec.keys, spec.hot_keys, spec.hot_fraction).expect("valid hot set");
    Arc::new(
        Workload::new(
            keys,
            spec.get_fraction,
            spec.delete_fraction,
            spec.value_size,
        )
        .map(|w| match spec.sizes_by_key {
            true => w.with_sizes_by_key(),
            false => w,
        })
        .expect("valid stress mix"),
    )
}

fn thread_seed(spec: &StressSpec, t: usize) -> u64 {
    spec.seed ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Check the history of a run that started at `start`, and sum it up with `tally`.
fn finish(history: History, tally: Tally, start: Instant, limits: &Limits) -> StressOutcome {
    let elapsed = start.elapsed();
    let events = history.into_events();
    let report = nessie_check::check(&events, |_| None, limits);
    if !report.is_ok() {
        dump_violations(&events, &report);
    }
    StressOutcome {
        report,
        ops: tally.ops,
        ok_ops: tally.ok,
        errors: tally.errors,
        corrupt_reads: tally.corrupt,
        failed_writes_read: failed_writes_read(&events),
        elapsed,
        truncated: tally.truncated,
        evictions: tally.evictions,
        evictions_unsure: tally.evictions_unsure,
        longest_stall: longest_stall(&events),
        expiries: tally.expiries,
    }
}
