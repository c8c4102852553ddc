//! The benchmark agent: runs inside every node process (as its admin-socket extension) so that
//! the load comes from client workers that are part of the cluster, as in the paper (every node
//! is a client). The harness ([`crate::runner`]) asks each node to preload its share of the
//! keys, then to run the workload in a common time window, and merges what they report.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use nessie_cluster::admin::Response;
use nessie_cluster::node::{NodeClient, NodeContext, NodeError, NodeExtension, NodePipeline};
use nessie_fabric::{FabricError, StatsSnapshot};
use nessie_protocols::{Error, KvClient, Optimizations, ProtocolConfig};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp};
use std::borrow::Cow;

use crate::driver::{drive, drive_pipelined, Done, Observer};
pub use crate::workload::key_bytes;
use crate::workload::{
    spread_value_size, KeyDist, KeyGen, OpKind, Planned, Workload, WorkloadError, Ycsb,
};

pub use crate::result::{decode_hist, encode_hist, new_hist, HistogramError, MAX_LATENCY_NS};
/// Most client threads one agent runs.
pub const MAX_AGENT_THREADS: u16 = 64;

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct AgentSpec {
    pub threads: u16,
    pub nodes: u16,
    pub keys: u64,
    pub key_size: u32,
    /// The largest value; with `value_size_min`, sizes are uniform in between.
    pub value_size: u32,
    #[serde(default)]
    pub value_size_min: Option<u32>,
    pub get_ratio: f64,
    pub dist: String,
    /// A YCSB core workload (`ycsb-a` ...), which sets the mix and the distribution.
    #[serde(default)]
    pub workload: Option<String>,
    pub seed: u64,
    pub optimizations: Optimizations,
    /// Pin client threads to cores round robin.
    pub pin: bool,
    /// Operations each client thread keeps in flight (1: the blocking client).
    #[serde(default = "one_in_flight")]
    pub inflight: u16,
}

fn one_in_flight() -> u16 {
    1
}

pub use crate::result::MAX_INFLIGHT;

/// What a client thread's counters come from: its client, or its pipeline of clients.
pub trait Counted {
    /// The fabric counters of the client's endpoint.
    fn fabric_stats(&self) -> StatsSnapshot;
    /// Aborted attempts and retries so far (0, 0 where not counted).
    fn aborts_retries(&self) -> (u64, u64);
}

impl Counted for NodeClient {
    fn fabric_stats(&self) -> StatsSnapshot {
        NodeClient::fabric_stats(self)
    }
    fn aborts_retries(&self) -> (u64, u64) {
        NodeClient::aborts_retries(self)
    }
}

/// A pipeline's counters are its shared endpoint's. Each operation's own fabric work, aborts
/// and retries come with its completion (`Observer::completed_in_flight`): its clients live
/// inside its coroutines, out of reach.
impl Counted for NodePipeline {
    fn fabric_stats(&self) -> StatsSnapshot {
        self.with_endpoint(|e| nessie_fabric::Endpoint::stats(e).snapshot())
    }
    fn aborts_retries(&self) -> (u64, u64) {
        (0, 0)
    }
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum AgentRequest {
    /// PUT every key `k` with `k % nodes == node`.
    Preload(AgentSpec),
    /// Run from `start_unix_ns`: `warmup_s` unmeasured, then `duration_s` measured.
    Run {
        spec: AgentSpec,
        start_unix_ns: u64,
        warmup_s: f64,
        duration_s: f64,
        rate_per_thread: Option<f64>,
    },
}

/// Fabric work per operation, summed over one node's clients.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct PerOpFabric {
    pub ops_sum: u64,
    pub bytes_sum: u64,
    pub ops_hist: BTreeMap<u64, u64>,
    pub bytes_hist: BTreeMap<u64, u64>,
}

impl PerOpFabric {
    fn record(&mut self, ops: u64, bytes: u64) {
        self.ops_sum += ops;
        self.bytes_sum += bytes;
        *self.ops_hist.entry(ops).or_default() += 1;
        *self
            .bytes_hist
            .entry(if bytes == 0 {
                0
            } else {
                bytes.next_power_of_two()
            })
            .or_default() += 1;
    }

    pub fn merge(&mut self, o: &PerOpFabric) {
        self.ops_sum += o.ops_sum;
        self.bytes_sum += o.bytes_sum;
        for (k, v) in &o.ops_hist {
            *self.ops_hist.entry(*k).or_default() += v;
        }
        for (k, v) in &o.bytes_hist {
            *self.bytes_hist.entry(*k).or_default() += v;
        }
    }
}

/// CPU seconds of a node process's threads in the measured window, by thread role: client
/// threads measure their own window; server, progress and other threads are long-lived and are
/// read from /proc at the window's start and end.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct CpuByRole {
    pub client: f64,
    pub server: f64,
    pub progress: f64,
    pub other: f64,
    /// Of `client`: what open-loop client threads spent waiting for their next arrival (the
    /// load generator's sleep, wake-up and final spin, not the store's work).
    #[serde(default)]
    pub pacing: f64,
}

#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct AgentReport {
    pub node: u16,
    pub gets: u64,
    pub puts: u64,
    pub errors: u64,
    /// Failed operations by kind of error ([`error_kind`]).
    #[serde(default)]
    pub error_kinds: BTreeMap<String, u64>,
    /// Latency histograms (ns), hdrhistogram V2 format, hex.
    pub get_hist: String,
    pub put_hist: String,
    pub fabric_get: PerOpFabric,
    pub fabric_put: PerOpFabric,
    /// Fabric operations (remote + loopback) of the whole node in the window.
    pub window_fabric_ops: u64,
    pub window_remote_bytes: u64,
    pub window_local_bytes: u64,
    pub aborts: u64,
    pub retries: u64,
    pub cpu: CpuByRole,
    /// Operations attempted in the window (open loop: arrivals).
    pub offered: u64,
    pub window_s: f64,
    /// Operations and GET latency by 100 ms window.
    #[serde(default)]
    pub timeline: crate::timeline::TimelineReport,
}

fn unix_ns() -> u64 {
    nessie_fabric::wall_clock_ns()
}

/// Wait until wall-clock time `t`: sleep through most of the gap (so an open-loop client's
/// idle time is not counted as the store's CPU time), spin only for the last few microseconds.
pub(crate) fn sleep_until_unix(t: u64) {
    const SPIN_NS: u64 = 10_000;
    let now = unix_ns();
    if t <= now {
        return;
    }
    let gap = t - now;
    if gap > SPIN_NS {
        std::thread::sleep(Duration::from_nanos(gap - SPIN_NS));
    }
    while unix_ns() < t {
        std::hint::spin_loop();
    }
}

/// Let this thread's sleeps end within ~1 µs of their deadline (Linux default slack: 50 µs).
fn tighten_timer_slack() {
    // SAFETY: prctl with PR_SET_TIMERSLACK takes a plain integer argument.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong);
    }
}

/// CPU seconds of one thread: the scheduler's exact on-CPU time from `schedstat` (ns), or
/// (utime + stime) from `stat` in clock ticks (10 ms granularity) where schedstat is missing.
fn task_cpu_seconds(task: &std::path::Path, tick: f64) -> Option<f64> {
    if let Ok(ss) = std::fs::read_to_string(task.join("schedstat")) {
        if let Some(ns) = ss
            .split_whitespace()
            .next()
            .and_then(|x| x.parse::<f64>().ok())
        {
            return Some(ns / 1e9);
        }
    }
    let stat = std::fs::read_to_string(task.join("stat")).ok()?;
    // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / tick)
}

/// CPU seconds of every thread of this process, by role (thread name).
fn thread_cpu() -> CpuByRole {
    // SAFETY: sysconf only reads a configuration value; it takes no pointer.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut c = CpuByRole::default();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return c;
    };
    for e in dir.flatten() {
        let p = e.path();
        let Ok(comm) = std::fs::read_to_string(p.join("comm")) else {
            continue;
        };
        let Some(secs) = task_cpu_seconds(&p, tick) else {
            continue;
        };
        let comm = comm.trim();
        if comm.starts_with("nessie-bench") {
            c.client += secs;
        } else if comm.starts_with("nessie-server") {
            c.server += secs;
        } else if comm.starts_with("ucx-progress") {
            c.progress += secs;
        } else {
            c.other += secs;
        }
    }
    c
}

fn pin_to(core: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn fabric_cost(before: &StatsSnapshot, after: &StatsSnapshot) -> (u64, u64) {
    let d = after.saturating_sub(before);
    (d.fabric_ops(), d.remote_bytes())
}

/// The extension a node process installs.
pub struct BenchAgent;

impl NodeExtension for BenchAgent {
    fn handle(&self, node: &Arc<NodeContext>, body: &[u8]) -> Response {
        let req: AgentRequest = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return Response::Error(format!("bad benchmark request: {e}")),
        };
        let r = match req {
            AgentRequest::Preload(spec) => {
                preload(node, &spec).map(|n| serde_json::json!({ "preloaded": n }))
            }
            AgentRequest::Run {
                spec,
                start_unix_ns,
                warmup_s,
                duration_s,
                rate_per_thread,
            } => run(
                node,
                &spec,
                start_unix_ns,
                warmup_s,
                duration_s,
                rate_per_thread,
            )
            .map(|r| serde_json::to_value(r).expect("serialises")),
        };
        match r {
            Ok(v) => Response::Status(v.to_string()),
            Err(e) => Response::Error(format!("node {}: {e}", node.id)),
        }
    }
}

/// Why an agent could not preload or run.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("threads = {0} is not in 1..={MAX_AGENT_THREADS}")]
    Threads(u16),
    #[error(transparent)]
    Sizes(#[from] SizeExcess),
    #[error("keys need at least {MIN_KEY_SIZE} bytes; key_max is {0}")]
    KeyMaxTooSmall(u32),
    #[error("duration {duration_s} s / warm-up {warmup_s} s out of range")]
    Window { duration_s: f64, warmup_s: f64 },
    #[error("bad arrival rate {0}")]
    Rate(f64),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("creating a client: {0}")]
    Client(#[from] NodeError),
    #[error("starting a client thread: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("inflight = {0} is not in 1..={MAX_INFLIGHT}")]
    Inflight(u16),
    #[error("operations in flight (inflight = {0}) run closed loop only: drop the target load")]
    InflightOpenLoop(u16),
    #[error("creating a pipeline of clients: {0}")]
    Pipeline(String),
    #[error("preloading key {key}: {source}")]
    Preload {
        key: u64,
        #[source]
        source: nessie_protocols::Error,
    },
    #[error("a {0} thread panicked")]
    Panicked(&'static str),
    #[error(transparent)]
    Histogram(#[from] HistogramError),
}

/// Key and value sizes beyond what a cluster's geometry holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("key size {key} / value size {value} exceed the cluster's key_max {key_max} / value_max {value_max}")]
pub struct SizeExcess {
    pub key: u32,
    pub value: u32,
    pub key_max: u32,
    pub value_max: u32,
}

impl SizeExcess {
    /// `Err` if keys of `key` bytes or values of `value` bytes do not fit `g`.
    pub fn check(key: u32, value: u32, g: &nessie_store::Geometry) -> Result<(), SizeExcess> {
        if key <= g.key_max && value <= g.value_max {
            return Ok(());
        }
        Err(SizeExcess {
            key,
            value,
            key_max: g.key_max,
            value_max: g.value_max,
        })
    }
}

/// The shortest key [`key_bytes`] makes: `key-` and 16 digits.
pub const MIN_KEY_SIZE: usize = 20;

fn check(spec: &AgentSpec, node: &NodeContext) -> Result<(), AgentError> {
    if spec.threads == 0 || spec.threads > MAX_AGENT_THREADS {
        return Err(AgentError::Threads(spec.threads));
    }
    if spec.inflight == 0 || spec.inflight > MAX_INFLIGHT {
        return Err(AgentError::Inflight(spec.inflight));
    }
    let g = node.geometry();
    SizeExcess::check(spec.key_size, spec.value_size, g)?;
    if key_bytes(0, spec.key_size).len() > g.key_max as usize {
        return Err(AgentError::KeyMaxTooSmall(g.key_max));
    }
    Ok(())
}

fn client_cfg(node: &NodeContext, o: Optimizations) -> ProtocolConfig {
    ProtocolConfig {
        optimizations: o,
        ..node.protocol_config()
    }
}

fn preload(node: &Arc<NodeContext>, spec: &AgentSpec) -> Result<u64, AgentError> {
    check(spec, node)?;
    let mine: Vec<u64> = (node.id as u64..spec.keys)
        .step_by(spec.nodes.max(1) as usize)
        .collect();
    let chunks: Vec<Vec<u64>> = mine
        .chunks(mine.len().div_ceil(spec.threads as usize).max(1))
        .map(|c| c.to_vec())
        .collect();
    let value = vec![0x5au8; spec.value_size as usize];
    let (lo, hi) = (
        spec.value_size_min.unwrap_or(spec.value_size),
        spec.value_size,
    );
    let handles: Vec<_> = chunks
        .into_iter()
        .map(|keys| {
            let mut c = node.client(&client_cfg(node, spec.optimizations))?;
            let (value, ks) = (value.clone(), spec.key_size);
            std::thread::Builder::new()
                .name("nessie-bench-pre".into())
                .spawn(move || -> Result<u64, AgentError> {
                    for &key in &keys {
                        let len = spread_value_size(key, lo, hi) as usize;
                        c.put(&key_bytes(key, ks), &value[..len])
                            .map_err(|source| AgentError::Preload { key, source })?;
                    }
                    Ok(keys.len() as u64)
                })
                .map_err(AgentError::Spawn)
        })
        .collect::<Result<_, AgentError>>()?;
    let mut n = 0;
    for h in handles {
        n += h.join().map_err(|_| AgentError::Panicked("preload"))??;
    }
    Ok(n)
}

/// CPU seconds the calling thread has used (exact, from the kernel's per-thread clock).
fn own_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

struct ThreadOut {
    /// CPU seconds this client thread used in the measured window (measured by the thread
    /// itself: it may have exited before the agent's end-of-window snapshot of /proc).
    cpu: f64,
    /// Of `cpu`: waiting for arrivals (open loop).
    pacing: f64,
    gets: u64,
    puts: u64,
    errors: u64,
    error_kinds: BTreeMap<String, u64>,
    offered: u64,
    gh: Histogram<u64>,
    ph: Histogram<u64>,
    fg: PerOpFabric,
    fp: PerOpFabric,
    aborts: u64,
    retries: u64,
    cells: crate::timeline::Cells,
}

/// One client thread's side of the workload loop. Closed loop by default; with an arrival rate,
/// open loop: operations arrive as a Poisson process and latency counts from the arrival, so
/// queueing behind a slow operation is part of it. Only operations that arrive in the window
/// `[window_start, window_end)` (wall-clock ns) are measured; the first arrival past it stops.
struct AgentThread {
    key_size: u32,
    value: Vec<u8>,
    /// Inter-arrival times (s) and the generator that draws them.
    arrivals: Option<(Exp<f64>, SmallRng)>,
    next_arrival: f64,
    window_start: u64,
    window_end: u64,
    /// Start of the current operation: its arrival (open loop) or issue time (closed loop).
    t0: u64,
    in_window: bool,
    /// Aborts, retries and CPU seconds at the window's start.
    at_window: (u64, u64, f64),
    /// Arrival waits in the window so far (one in [`PACING_SAMPLE`] is measured).
    waits: u64,
    /// CPU seconds a measured wait counts that are the measurement's own ([`clock_read_cost`]),
    /// taken on the thread's first measured wait.
    clock_cost: Option<f64>,
    /// The fabric work of the operation completing, when it came with it
    /// (`completed_in_flight`).
    op_fabric: Option<(u64, u64)>,
    /// The aborts and retries of the operation completing, when it came with them (a
    /// pipeline's; a client's are read over the window in [`Self::finish`]).
    op_attempts: (u64, u64),
    out: ThreadOut,
}

/// One arrival wait in this many has its CPU measured (and counted this many times). A read
/// of the thread's CPU clock is a system call, about 0.55 µs on our VM: reading it around every
/// wait added two to every operation, a cost of the measurement that fell partly on the store's
/// side. Arrivals are random, so every 16th wait is as good a sample as any.
const PACING_SAMPLE: u64 = 16;

/// What a measured wait counts that is the measurement's own: the CPU between the sample
/// points of two back-to-back reads of the thread's CPU clock (the median of 63), so that a
/// sample scaled by [`PACING_SAMPLE`] does not multiply it too.
fn clock_read_cost() -> f64 {
    let mut d: Vec<f64> = (0..63)
        .map(|_| {
            let a = own_cpu_seconds();
            own_cpu_seconds() - a
        })
        .collect();
    d.sort_by(f64::total_cmp);
    d[d.len() / 2]
}

impl AgentThread {
    fn new(spec: &AgentSpec, start: u64, window: (u64, u64), rate: Option<f64>, seed: u64) -> Self {
        Self {
            key_size: spec.key_size,
            value: vec![0xa5u8; spec.value_size as usize],
            arrivals: rate.map(|r| {
                let exp = Exp::new(r).expect("the rate was checked positive");
                (exp, SmallRng::seed_from_u64(seed ^ 0xA5A5_A5A5))
            }),
            next_arrival: start as f64,
            window_start: window.0,
            window_end: window.1,
            t0: 0,
            in_window: false,
            at_window: (0, 0, 0.0),
            waits: 0,
            clock_cost: None,
            op_fabric: None,
            op_attempts: (0, 0),
            out: ThreadOut {
                cpu: 0.0,
                pacing: 0.0,
                gets: 0,
                puts: 0,
                errors: 0,
                error_kinds: BTreeMap::new(),
                offered: 0,
                gh: new_hist(),
                ph: new_hist(),
                fg: PerOpFabric::default(),
                fp: PerOpFabric::default(),
                aborts: 0,
                retries: 0,
                cells: crate::timeline::Cells::new(window.0, window.1),
            },
        }
    }

    /// The thread's totals, with aborts, retries and CPU taken over the window.
    fn finish(mut self, client: &impl Counted) -> ThreadOut {
        if self.in_window {
            let (a1, r1) = client.aborts_retries();
            let (a0, r0, cpu0) = self.at_window;
            // Added to what the operations completed in flight in the window brought.
            self.out.aborts += a1 - a0;
            self.out.retries += r1 - r0;
            self.out.cpu = own_cpu_seconds() - cpu0;
        }
        self.out
    }
}

impl<C: Counted> Observer<C> for AgentThread {
    /// The counters at the start, and the start (arrival or issue time).
    type Token = (StatsSnapshot, u64);

    fn proceed(&mut self, client: &C, _seq: u64) -> bool {
        self.t0 = match &mut self.arrivals {
            Some((exp, rng)) => {
                self.next_arrival += exp.sample(rng) * 1e9;
                // The wait is the load generator's cost: measured on a sample of the waits
                // ([`PACING_SAMPLE`]), to be told apart from the store's.
                let sampled = self.in_window && self.waits.is_multiple_of(PACING_SAMPLE);
                self.waits += u64::from(self.in_window);
                if sampled && self.clock_cost.is_none() {
                    self.clock_cost = Some(clock_read_cost());
                }
                let before = sampled.then(own_cpu_seconds);
                sleep_until_unix(self.next_arrival as u64);
                if let Some(b) = before {
                    let waited = own_cpu_seconds() - b - self.clock_cost.unwrap_or(0.0);
                    self.out.pacing += waited.max(0.0) * PACING_SAMPLE as f64;
                }
                self.next_arrival as u64
            }
            None => unix_ns(),
        };
        if self.t0 >= self.window_end {
            return false;
        }
        if self.t0 >= self.window_start && !self.in_window {
            self.in_window = true;
            let (a0, r0) = client.aborts_retries();
            self.at_window = (a0, r0, own_cpu_seconds());
        }
        true
    }

    fn key(&self, k: u64) -> Vec<u8> {
        key_bytes(k, self.key_size)
    }

    fn key_into(&self, k: u64, out: &mut Vec<u8>) {
        crate::workload::key_into(k, self.key_size, out)
    }

    fn value(&self, op: &Planned) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.value[..op.value_len])
    }

    fn invoke(&mut self, client: &C, _: &Planned) -> (StatsSnapshot, u64) {
        let before = client.fabric_stats();
        if self.arrivals.is_none() {
            // Closed loop: the operation starts now, after the benchmark's own bookkeeping (the
            // key's formatting, the counters' snapshot). Open loop: at its arrival, whatever
            // delayed it.
            self.t0 = unix_ns();
        }
        (before, self.t0)
    }

    fn completed_in_flight(&mut self, done: &nessie_inflight::Completion) {
        self.op_fabric = Some((done.fabric.fabric_ops(), done.fabric.remote_bytes()));
        self.op_attempts = (done.aborts, done.retries);
    }

    fn complete(
        &mut self,
        c: &C,
        op: &Planned,
        (before, t0): (StatsSnapshot, u64),
        r: Result<Done<'_>, Error>,
    ) {
        let op_fabric = self.op_fabric.take();
        let (aborts, retries) = std::mem::take(&mut self.op_attempts);
        let now = unix_ns();
        let latency = now.saturating_sub(t0).max(1);
        if t0 < self.window_start {
            return; // warm-up
        }
        let o = &mut self.out;
        (o.aborts, o.retries) = (o.aborts + aborts, o.retries + retries);
        o.offered += 1;
        let (fops, fbytes) = op_fabric.unwrap_or_else(|| fabric_cost(&before, &c.fabric_stats()));
        match (r, op.kind) {
            (Err(e), _) => {
                o.errors += 1;
                *o.error_kinds.entry(error_kind(&e).into()).or_default() += 1;
                o.cells.failed(now);
            }
            (Ok(_), OpKind::Get) => {
                o.gets += 1;
                o.gh.saturating_record(latency);
                o.fg.record(fops, fbytes);
                o.cells.completed(now, Some(latency));
            }
            (Ok(_), _) => {
                o.puts += 1;
                o.ph.saturating_record(latency);
                o.fp.record(fops, fbytes);
                o.cells.completed(now, None);
            }
        }
    }
}

/// A failed operation's kind of error, as the result counts it.
pub fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::Unreachable { .. } => "unreachable",
        Error::Fenced { .. } => "fenced",
        Error::Timeout { .. } => "timeout",
        Error::Contended { .. } => "contended",
        Error::Indeterminate(_) => "indeterminate",
        Error::Fabric(f) => match f {
            FabricError::Unreachable { .. } => "unreachable",
            FabricError::Indeterminate { .. } => "indeterminate",
            FabricError::Fenced { .. } => "fenced",
            FabricError::NoCopy { .. } => "no_copy",
            FabricError::Transport(_) => "transport",
            _ => "fabric",
        },
        Error::DataTableFull { .. } => "data_table_full",
        Error::IndexFull { .. } => "index_full",
        _ => "other",
    }
}

/// The measured window, in wall-clock ns, after checking the run's parameters.
fn window(
    start: u64,
    warmup_s: f64,
    duration_s: f64,
    rate: Option<f64>,
) -> Result<(u64, u64), AgentError> {
    if !(duration_s > 0.0 && duration_s <= 3600.0 && (0.0..=3600.0).contains(&warmup_s)) {
        return Err(AgentError::Window {
            duration_s,
            warmup_s,
        });
    }
    if let Some(r) = rate {
        if !(r > 0.0 && r.is_finite()) {
            return Err(AgentError::Rate(r));
        }
    }
    let window_start = start + (warmup_s * 1e9) as u64;
    Ok((window_start, window_start + (duration_s * 1e9) as u64))
}

fn spawn_clients(
    node: &Arc<NodeContext>,
    spec: &AgentSpec,
    start: u64,
    window: (u64, u64),
    rate: Option<f64>,
) -> Result<Vec<std::thread::JoinHandle<ThreadOut>>, AgentError> {
    let sizes = (
        spec.value_size_min.unwrap_or(spec.value_size) as usize,
        spec.value_size as usize,
    );
    let workload = match &spec.workload {
        Some(w) => Workload::ycsb(w.parse::<Ycsb>()?, spec.keys, sizes)?,
        None => {
            let dist: KeyDist = spec.dist.parse()?;
            Workload::new(KeyGen::new(&dist, spec.keys)?, spec.get_ratio, 0.0, sizes)?
        }
    };
    let stride = u64::from(spec.nodes) * u64::from(spec.threads);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..spec.threads)
        .map(|t| {
            let seed =
                spec.seed ^ ((node.id as u64) << 32 | t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut obs = AgentThread::new(spec, start, window, rate, seed);
            let slot = u64::from(node.id) * u64::from(spec.threads) + u64::from(t);
            let (mut workload, pin) = (workload.for_thread(slot, stride), spec.pin);
            let cfg = client_cfg(node, spec.optimizations);
            let name = format!("nessie-bench-{t}");
            let prepare = move || {
                if pin {
                    pin_to(t as usize % cores);
                }
                tighten_timer_slack();
            };
            if spec.inflight > 1 {
                // A pipeline is built on its own thread (not `Send`); an error making it ends
                // the thread with a result that says so.
                let (node, slots) = (node.clone(), spec.inflight as usize);
                let (made_tx, made_rx) = std::sync::mpsc::channel();
                let h = std::thread::Builder::new()
                    .name(name)
                    .spawn(move || {
                        prepare();
                        let mut p = match node.pipeline(&cfg, slots) {
                            Ok(p) => {
                                let _ = made_tx.send(Ok(()));
                                p
                            }
                            Err(e) => {
                                let _ = made_tx.send(Err(e));
                                return obs.out;
                            }
                        };
                        sleep_until_unix(start);
                        let mut rng = SmallRng::seed_from_u64(seed);
                        drive_pipelined(&mut p, &mut workload, &mut rng, &mut obs);
                        obs.finish(&p)
                    })
                    .map_err(AgentError::Spawn)?;
                made_rx
                    .recv()
                    .map_err(|_| AgentError::Pipeline("its thread ended early".into()))?
                    .map_err(|e| AgentError::Pipeline(e.to_string()))?;
                return Ok(h);
            }
            let mut c = node.client(&cfg)?;
            std::thread::Builder::new()
                .name(name)
                .spawn(move || {
                    prepare();
                    sleep_until_unix(start);
                    let mut rng = SmallRng::seed_from_u64(seed);
                    drive(&mut c, &mut workload, &mut rng, &mut obs);
                    obs.finish(&c)
                })
                .map_err(AgentError::Spawn)
        })
        .collect()
}

/// Merge the client threads' results into the node's report.
fn merge_threads(
    rep: &mut AgentReport,
    handles: Vec<std::thread::JoinHandle<ThreadOut>>,
    window: (u64, u64),
) -> Result<(), AgentError> {
    let (mut gh, mut ph) = (new_hist(), new_hist());
    let mut cells = crate::timeline::Cells::new(window.0, window.1);
    for h in handles {
        let o = h.join().map_err(|_| AgentError::Panicked("benchmark"))?;
        cells.merge(&o.cells)?;
        rep.gets += o.gets;
        rep.puts += o.puts;
        rep.errors += o.errors;
        for (k, n) in &o.error_kinds {
            *rep.error_kinds.entry(k.clone()).or_default() += n;
        }
        rep.offered += o.offered;
        rep.aborts += o.aborts;
        rep.retries += o.retries;
        rep.cpu.client += o.cpu;
        rep.cpu.pacing += o.pacing;
        gh.add(&o.gh).map_err(HistogramError::from)?;
        ph.add(&o.ph).map_err(HistogramError::from)?;
        rep.fabric_get.merge(&o.fg);
        rep.fabric_put.merge(&o.fp);
    }
    rep.get_hist = encode_hist(&gh);
    rep.put_hist = encode_hist(&ph);
    rep.timeline = cells.report();
    Ok(())
}

fn run(
    node: &Arc<NodeContext>,
    spec: &AgentSpec,
    start: u64,
    warmup_s: f64,
    duration_s: f64,
    rate: Option<f64>,
) -> Result<AgentReport, AgentError> {
    check(spec, node)?;
    if rate.is_some() && spec.inflight > 1 {
        return Err(AgentError::InflightOpenLoop(spec.inflight));
    }
    let (window_start, window_end) = window(start, warmup_s, duration_s, rate)?;
    let handles = spawn_clients(node, spec, start, (window_start, window_end), rate)?;

    // Window-wide counters: CPU by thread role and the node's fabric totals.
    sleep_until_unix(window_start);
    let (cpu0, fab0, srv0) = (thread_cpu(), node.fabric_stats(), node.server_stats());
    sleep_until_unix(window_end);
    let (cpu1, fab1, srv1) = (thread_cpu(), node.fabric_stats(), node.server_stats());

    let mut rep = AgentReport {
        node: node.id,
        window_s: duration_s,
        ..AgentReport::default()
    };
    merge_threads(&mut rep, handles, (window_start, window_end))?;
    let d = fab1.saturating_sub(&fab0);
    rep.window_fabric_ops = d.fabric_ops();
    rep.window_remote_bytes = d.remote_bytes();
    rep.window_local_bytes = d.local_bytes();
    let sx = (srv1.exec.concurrent_aborts + srv1.exec.timeouts)
        .saturating_sub(srv0.exec.concurrent_aborts + srv0.exec.timeouts);
    rep.aborts += sx;
    rep.retries += srv1.exec.retries.saturating_sub(srv0.exec.retries);
    // Client threads measured themselves (above); the long-lived threads come from /proc.
    rep.cpu = CpuByRole {
        client: rep.cpu.client,
        pacing: rep.cpu.pacing,
        server: (cpu1.server - cpu0.server).max(0.0),
        progress: (cpu1.progress - cpu0.progress).max(0.0),
        other: (cpu1.other - cpu0.other).max(0.0),
    };
    // Give the OS a moment to account the last ticks before the harness tears things down.
    std::thread::sleep(Duration::from_millis(1));
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_round_trip_through_hex() {
        let mut h = new_hist();
        for v in [1_000u64, 2_000, 50_000, 7_000_000] {
            h.record(v).unwrap();
        }
        let back = decode_hist(&encode_hist(&h)).unwrap();
        assert_eq!(back.len(), 4);
        assert_eq!(back.value_at_quantile(1.0), h.value_at_quantile(1.0));
        assert!(decode_hist("zz").is_err());
    }

    #[test]
    fn per_op_fabric_histograms() {
        let mut f = PerOpFabric::default();
        f.record(3, 100);
        f.record(3, 0);
        f.record(5, 16_400);
        assert_eq!(f.ops_hist, BTreeMap::from([(3, 2), (5, 1)]));
        assert_eq!(
            f.bytes_hist,
            BTreeMap::from([(0, 1), (128, 1), (32_768, 1)])
        );
        let mut g = PerOpFabric::default();
        g.merge(&f);
        g.merge(&f);
        assert_eq!((g.ops_sum, g.bytes_sum), (22, 33_000));
    }

    #[test]
    fn keys_have_the_requested_size_and_are_distinct() {
        assert_eq!(key_bytes(7, 128).len(), 128);
        assert_ne!(key_bytes(7, 128), key_bytes(8, 128));
        assert_eq!(
            key_bytes(7, 8).len(),
            20,
            "never shorter than the numbered prefix"
        );
    }

    #[test]
    fn thread_cpu_sees_this_process() {
        let t0 = thread_cpu();
        // Burn 200 ms of CPU (well above the 10 ms accounting tick).
        let until = std::time::Instant::now() + Duration::from_millis(200);
        let mut x = 0u64;
        while std::time::Instant::now() < until {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let t1 = thread_cpu();
        assert!(
            t1.other + t1.client + t1.server + t1.progress
                > t0.other + t0.client + t0.server + t0.progress
        );
    }
}
