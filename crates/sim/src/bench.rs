//! `nessie sim`: the benchmark's closed-loop workload on a simulated cluster, reported as
//! `nessie bench` reports (the same [`BenchResult`]) plus the simulated time.
//!
//! Each client thread preloads its share of the keys, waits at a virtual-time barrier for the
//! others, then performs its operations; the measured window runs from the barrier to the
//! moment the first thread has done all of its operations, in virtual time, and counts the
//! operations every thread completed in it. (Ending it with the last thread would measure the
//! slowest thread's pace alone: under CPU contention, a thread sliced out near the end keeps
//! the window open while the others sit idle.) Latencies are virtual, so throughput and
//! latency are the model's, not this machine's. SD and HY servers poll on cores of their own
//! until the last client is done; their aborts and retries (counted on the servers) are not
//! in the result.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use hdrhistogram::Histogram;
use nessie_baselines::sd::RpcConfig;
use nessie_bench::driver::{drive, Done, Observer};
use nessie_bench::result::{
    new_hist, BenchParams, BenchResult, CpuSeconds, FabricPerOp, FabricSummary, LatencySummary,
    PerKind,
};
use nessie_bench::workload::{
    key_bytes, spread_value_size, KeyDist, KeyGen, OpKind, Planned, Workload, WorkloadError, Ycsb,
};
use nessie_deploy::{Mode, ModeClient};
use nessie_fabric::{Endpoint, StatsSnapshot};
use nessie_protocols::{Error, KvClient, Optimizations, ProtocolConfig};
use nessie_store::Geometry;
use rand::SeedableRng;

use crate::cluster::SimCluster;
use nessie_fabric_sim::{SimEndpoint, SimParams, SimThread, WireBytes};

/// Most operations one simulated client thread may be asked for.
pub const MAX_OPS_PER_THREAD: u64 = 100_000_000;
/// Most simulated client threads (each is an OS thread).
pub const MAX_THREADS: usize = 1024;
/// How often a thread waiting at the barrier looks again, in virtual time: first after
/// 1 µs, then at doubling intervals up to 100 µs (a thread may start its operations up to
/// that late; under CPU contention the preload's stragglers take tens of milliseconds, and
/// polling them every microsecond would be millions of hand-offs).
const BARRIER_POLL_NS: u64 = 1_000;
const BARRIER_POLL_MAX_NS: u64 = 100_000;

/// Each client thread's cache holds this fraction of the keys (the paper: 0.5 %).
pub const CACHE_KEY_FRACTION: f64 = 0.005;
/// Room for PUTs per node, in multiples of a node's average share of the run's PUTs: with
/// skewed keys, the nodes holding hot keys take more (sd, hy and pilaf write where the key
/// lives). A run is far shorter than the expiry period, so no entry is reused within it.
const PUT_ROOM_FACTOR: u64 = 3;
/// Room for PUTs beyond that, per node.
const PUT_ROOM_EXTRA: u64 = 1024;

/// Keys and table sizes for `p` run with `ops_per_thread` operations per client thread: the
/// benchmark's sizing ([`nessie_bench::sizing::sizing`]) plus room for every entry the run's
/// PUTs write.
pub fn sizing(p: &BenchParams, ops_per_thread: u64) -> (u64, Geometry) {
    use nessie_bench::sizing::{sizing_with_headroom, SIM_HEADROOM_MAX_ENTRIES};
    let (keys, mut g) = sizing_with_headroom(p, SIM_HEADROOM_MAX_ENTRIES);
    let put_share = if p.workload.is_some() {
        1.0
    } else {
        1.0 - p.get_ratio
    };
    // Every slot of a pipeline (`--inflight`) does `ops_per_thread` operations.
    let puts_per_node = (ops_per_thread as f64
        * f64::from(p.client_threads)
        * f64::from(p.inflight.max(1))
        * put_share)
        .ceil() as u64;
    g.dtes_per_node += puts_per_node * PUT_ROOM_FACTOR + PUT_ROOM_EXTRA;
    (keys, g)
}

/// Why a simulated benchmark cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SimBenchError {
    #[error("--mode {0} is not cd, sd, hy or pilaf")]
    Mode(String),
    #[error("{0}")]
    Param(String),
    #[error(transparent)]
    Protocol(#[from] Error),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("preloading key {key}: {source}")]
    Preload { key: u64, source: Error },
}

/// A simulated run's result: `nessie bench`'s fields, then the simulation's.
#[derive(Debug, serde::Serialize)]
pub struct SimBenchResult {
    #[serde(flatten)]
    pub bench: BenchResult,
    /// Virtual time of the measured window, seconds (also `params.duration`).
    pub simulated_seconds: f64,
    /// Virtual time of the whole run, preload included, seconds.
    pub simulated_total_seconds: f64,
    pub ops_per_thread: u64,
    /// The simulated hardware.
    pub hardware: SimParams,
    /// Each node's NIC traffic on the wire over the whole run, headers included.
    pub wire_bytes: Vec<WireBytes>,
    /// Scheduler hand-offs (the simulation's own cost).
    pub dispatches: u64,
}

/// Fabric work per operation of one kind.
#[derive(Clone, Debug, Default)]
struct PerOp {
    ops: u64,
    bytes: u64,
    ops_hist: BTreeMap<u64, u64>,
    bytes_hist: BTreeMap<u64, u64>,
}

impl PerOp {
    fn record(&mut self, ops: u64, bytes: u64) {
        self.ops += ops;
        self.bytes += bytes;
        *self.ops_hist.entry(ops).or_default() += 1;
        let bucket = if bytes == 0 {
            0
        } else {
            bytes.next_power_of_two()
        };
        *self.bytes_hist.entry(bucket).or_default() += 1;
    }

    fn merge(&mut self, o: &PerOp) {
        self.ops += o.ops;
        self.bytes += o.bytes;
        for (k, v) in &o.ops_hist {
            *self.ops_hist.entry(*k).or_default() += v;
        }
        for (k, v) in &o.bytes_hist {
            *self.bytes_hist.entry(*k).or_default() += v;
        }
    }

    fn summary(&self, n: u64) -> FabricPerOp {
        FabricPerOp {
            ops_mean: self.ops as f64 / n.max(1) as f64,
            bytes_mean: self.bytes as f64 / n.max(1) as f64,
            ops_hist: self.ops_hist.clone(),
            bytes_hist: self.bytes_hist.clone(),
        }
    }
}

/// One thread's measured part.
struct Measured {
    /// Another endpoint of the thread: its virtual clock.
    timer: Option<SimEndpoint>,
    ops: u64,
    key_size: u32,
    value: Vec<u8>,
    gets: u64,
    puts: u64,
    errors: u64,
    get_hist: Histogram<u64>,
    put_hist: Histogram<u64>,
    fabric: PerKind<PerOp>,
    /// Window start and end (virtual ns), fabric counters and client counters over it.
    window: (u64, u64),
    window_fabric: StatsSnapshot,
    aborts: u64,
    retries: u64,
    /// When the first thread finished its operations (virtual ns; `u64::MAX` until then):
    /// the window's end, shared by all threads.
    window_end: Arc<AtomicU64>,
    /// The client's fabric and abort counters at its last operation in the window.
    last_fabric: StatsSnapshot,
    last_aborts: (u64, u64),
}

impl Observer<Client> for Measured {
    type Token = (u64, StatsSnapshot);

    fn proceed(&mut self, _: &Client, seq: u64) -> bool {
        seq < self.ops && self.now() < self.window_end.load(Ordering::SeqCst)
    }

    fn key(&self, k: u64) -> Vec<u8> {
        key_bytes(k, self.key_size)
    }

    fn value(&self, op: &Planned) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.value[..op.value_len])
    }

    fn invoke(&mut self, c: &Client, _: &Planned) -> Self::Token {
        (self.now(), c.fabric_stats())
    }

    fn complete(
        &mut self,
        c: &Client,
        op: &Planned,
        (t0, before): Self::Token,
        r: Result<Done<'_>, Error>,
    ) {
        let now = self.now();
        if now > self.window_end.load(Ordering::SeqCst) {
            // Completed after the window closed: not counted.
            return;
        }
        let latency = now.saturating_sub(t0).max(1);
        let after = c.fabric_stats();
        let d = after.saturating_sub(&before);
        self.window.1 = now;
        self.last_fabric = after;
        self.last_aborts = c.aborts_retries();
        let (fops, fbytes) = (d.fabric_ops(), d.remote_bytes());
        match (r, op.kind) {
            (Err(_), _) => self.errors += 1,
            (Ok(_), OpKind::Get) => {
                self.gets += 1;
                self.get_hist.saturating_record(latency);
                self.fabric.get.record(fops, fbytes);
            }
            (Ok(_), _) => {
                self.puts += 1;
                self.put_hist.saturating_record(latency);
                self.fabric.put.record(fops, fbytes);
            }
        }
    }
}

/// A simulated benchmark client and, for its clock and sleeps, another endpoint of its thread.
type Client = ModeClient<SimEndpoint>;

fn mode(p: &BenchParams) -> Result<Mode, SimBenchError> {
    let server_threads = p.server_threads;
    match p.mode.as_str() {
        "cd" => Ok(Mode::Cd),
        "sd" => Ok(Mode::Sd { server_threads }),
        "hy" => Ok(Mode::Hy { server_threads }),
        "pilaf" => Ok(Mode::Pilaf { server_threads }),
        m => Err(SimBenchError::Mode(m.into())),
    }
}

fn check(p: &BenchParams, ops_per_thread: u64) -> Result<(), SimBenchError> {
    mode(p)?;
    let bad = |m: String| Err(SimBenchError::Param(m));
    let max_inflight = nessie_bench::result::MAX_INFLIGHT;
    if !(1..=max_inflight).contains(&p.inflight) {
        return bad(format!(
            "--inflight must be in 1..={max_inflight}, not {}",
            p.inflight
        ));
    }
    if p.inflight > 1 && p.background > 0 {
        return bad(
            "--background with --inflight is not modelled: a pipeline's slots would each take \
             time slices of their own (docs/sim.md)"
                .into(),
        );
    }
    let threads = p.nodes as usize * p.client_threads as usize * p.inflight as usize;
    if p.nodes == 0 || p.client_threads == 0 || threads > MAX_THREADS {
        return bad(format!(
            "--nodes x --client-threads x --inflight must be in 1..={MAX_THREADS}, not {threads}"
        ));
    }
    if !(1..=MAX_OPS_PER_THREAD).contains(&ops_per_thread) {
        return bad(format!("--ops must be in 1..={MAX_OPS_PER_THREAD}"));
    }
    if p.replicas != 1 {
        return bad("the simulator keeps one copy (--replicas 1)".into());
    }
    if p.keys == Some(0) {
        return bad("--keys must be positive".into());
    }
    Ok(())
}

/// The workload every thread draws from (as the benchmark agent builds it).
fn workload(p: &BenchParams, keys: u64) -> Result<Workload, SimBenchError> {
    let (lo, hi) = p.value_sizes();
    let sizes = (lo as usize, hi as usize);
    Ok(match &p.workload {
        Some(w) => Workload::ycsb(w.parse::<Ycsb>()?, keys, sizes)?,
        None => {
            let dist: KeyDist = p.dist.parse()?;
            Workload::new(KeyGen::new(&dist, keys)?, p.get_ratio, 0.0, sizes)?
        }
    })
}

/// The protocol's settings for `p`: its optimisation switches, and caches of 0.5% of the keys.
fn protocol_config(p: &BenchParams, keys: u64) -> ProtocolConfig {
    ProtocolConfig {
        optimizations: Optimizations {
            filter_bits: p.filter_bits,
            cache: p.cache,
            previous_versions: p.previous_versions,
            multi_read: p.multi_read,
        },
        cache_entries: ((keys as f64 * CACHE_KEY_FRACTION).ceil() as usize).max(1),
        ..ProtocolConfig::default()
    }
}

/// Run `p`'s workload, `ops_per_thread` operations per client thread after preloading `keys`
/// keys, on a simulated cluster of `geometry` with hardware `hw`.
pub fn run(
    p: &BenchParams,
    keys: u64,
    geometry: Geometry,
    ops_per_thread: u64,
    hw: SimParams,
) -> Result<SimBenchResult, SimBenchError> {
    check(p, ops_per_thread)?;
    let (mut cluster, clients, hw) = build(p, keys, geometry, hw)?;
    let threads = clients.len();
    let workload = workload(p, keys)?;
    let arrived = Arc::new(AtomicUsize::new(0));
    let preload_tx = Arc::new(AtomicU64::new(0));
    let window_end = Arc::new(AtomicU64::new(u64::MAX));
    let window_tx = Arc::new(AtomicU64::new(u64::MAX));
    let tx_at_end = window_tx.clone();
    let (p2, seed, sim) = (p.clone(), p.seed, cluster.sim().clone());
    let tx_at_start = preload_tx.clone();
    let (summary, outs) = cluster.run(clients, move |i, (mut client, mut timer)| {
        // Arrive at the barrier even if the preload fails or panics, or the others would
        // wait forever.
        let mut arrival = Arrival {
            arrived: &arrived,
            done: false,
        };
        let loaded = preload(&mut client, &p2, keys, i, threads);
        if barrier(&mut timer, &mut arrival, threads) {
            // Everyone else waits: what the wire carried so far was the preload's.
            tx_at_start.store(wire_sent(&sim), Ordering::SeqCst);
        }
        loaded?;
        let mut w = workload.for_thread(i as u64, threads as u64);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(
            seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let m = measure(
            &mut client,
            timer,
            &mut w,
            &mut rng,
            &p2,
            ops_per_thread,
            window_end.clone(),
        );
        if m.finished() {
            // The first to finish closes the window; what the wire carried so far is its.
            let end = m.now();
            if window_end.fetch_min(end, Ordering::SeqCst) > end {
                tx_at_end.store(wire_sent(&sim), Ordering::SeqCst);
            }
        }
        Ok(m)
    });
    let outs = outs
        .into_iter()
        .collect::<Result<Vec<_>, SimBenchError>>()?;
    let wire = (0..p.nodes).map(|n| cluster.sim().wire_bytes(n)).collect();
    let sent = window_tx
        .load(Ordering::SeqCst)
        .min(wire_sent(cluster.sim()))
        .saturating_sub(preload_tx.load(Ordering::SeqCst));
    let mut r = merge(p, keys, ops_per_thread, hw, &outs, summary, wire);
    // Bytes sent are what went on the simulated wire: every NIC's egress in the window,
    // headers and acknowledgements included.
    r.bench.fabric.total_bytes = sent;
    Ok(r)
}

/// The simulated cluster of `p` (with its background processes) and its client threads.
#[allow(clippy::type_complexity)]
fn build(
    p: &BenchParams,
    keys: u64,
    geometry: Geometry,
    hw: SimParams,
) -> Result<
    (
        SimCluster,
        Vec<((Client, SimEndpoint), SimThread)>,
        SimParams,
    ),
    SimBenchError,
> {
    // Background processes are the run's (`--background`), on every node.
    let hw = SimParams {
        background_per_node: u32::from(p.background),
        ..hw
    };
    hw.validate()
        .map_err(|e| SimBenchError::Param(e.to_string()))?;
    // Each slot of a pipeline is a client of its own (as `nessie bench --inflight`'s are).
    let slots = p.inflight.max(1);
    let rpc = RpcConfig {
        max_clients_per_node: p.client_threads * slots,
        ..RpcConfig::default()
    };
    let cfg = protocol_config(p, keys);
    let mut cluster = SimCluster::with_mode(hw.clone(), p.seed, geometry, cfg, mode(p)?, rpc)?;
    let threads = p.nodes as usize * p.client_threads as usize;
    let mut clients = Vec::with_capacity(threads * slots as usize);
    for i in 0..threads {
        let node = (i % p.nodes as usize) as u16;
        match slots {
            1 => clients.push(cluster.mode_client(node)?),
            n => clients.extend(cluster.mode_pipeline(node, n as usize)?),
        }
    }
    let clients = clients
        .into_iter()
        .map(|(c, thread, timer)| ((c, timer), thread))
        .collect();
    Ok((cluster, clients, hw))
}

/// Bytes every NIC has sent so far, headers included.
fn wire_sent(sim: &nessie_fabric_sim::Sim) -> u64 {
    (0..sim.node_count())
        .map(|n| sim.wire_bytes(n as u16).tx)
        .sum()
}

/// Thread `i` of `threads` writes keys `i, i + threads, ...`, as the benchmark preloads.
fn preload(
    c: &mut Client,
    p: &BenchParams,
    keys: u64,
    i: usize,
    threads: usize,
) -> Result<(), SimBenchError> {
    let (lo, hi) = p.value_sizes();
    let value = vec![0x5au8; hi as usize];
    for key in (i as u64..keys).step_by(threads) {
        let len = spread_value_size(key, lo, hi) as usize;
        c.put(&key_bytes(key, p.key_size), &value[..len])
            .map_err(|source| SimBenchError::Preload { key, source })?;
    }
    Ok(())
}

/// A thread's arrival at the barrier, counted when it leaves the thread's code whatever way it
/// leaves (a panic included) if it has not arrived by then.
struct Arrival<'a> {
    arrived: &'a AtomicUsize,
    done: bool,
}

impl Arrival<'_> {
    /// Count the arrival (once); true for the last thread to arrive.
    fn arrive(&mut self, threads: usize) -> bool {
        if self.done {
            return false;
        }
        self.done = true;
        self.arrived.fetch_add(1, Ordering::SeqCst) + 1 == threads
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.arrived.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Wait, in virtual time, until every thread has arrived; true for the last to arrive.
fn barrier(timer: &mut SimEndpoint, arrival: &mut Arrival<'_>, threads: usize) -> bool {
    let last = arrival.arrive(threads);
    let arrived = arrival.arrived;
    let mut poll = BARRIER_POLL_NS;
    while arrived.load(Ordering::SeqCst) < threads {
        timer.sleep_ns(poll);
        poll = (poll * 2).min(BARRIER_POLL_MAX_NS);
    }
    last
}

impl Measured {
    fn new(
        ops: u64,
        p: &BenchParams,
        start_ns: u64,
        fabric: StatsSnapshot,
        window_end: Arc<AtomicU64>,
    ) -> Self {
        Measured {
            timer: None,
            ops,
            key_size: p.key_size,
            value: vec![0xa5u8; p.value_size as usize],
            gets: 0,
            puts: 0,
            errors: 0,
            get_hist: new_hist(),
            put_hist: new_hist(),
            fabric: PerKind::default(),
            window: (start_ns, start_ns),
            last_fabric: fabric,
            window_fabric: fabric,
            aborts: 0,
            retries: 0,
            window_end,
            last_aborts: (0, 0),
        }
    }

    /// Whether the thread did all its operations (within the window, which it then closed).
    fn finished(&self) -> bool {
        self.gets + self.puts + self.errors == self.ops
    }

    fn now(&self) -> u64 {
        self.timer.as_ref().map_or(0, |t| t.mono_ns())
    }

    /// Add another thread's measurement (the window spans both).
    fn absorb(&mut self, o: &Measured) {
        self.get_hist.add(&o.get_hist).expect("same bounds");
        self.put_hist.add(&o.put_hist).expect("same bounds");
        self.fabric.get.merge(&o.fabric.get);
        self.fabric.put.merge(&o.fabric.put);
        self.window = (self.window.0.min(o.window.0), self.window.1.max(o.window.1));
        self.window_fabric += o.window_fabric;
        (self.gets, self.puts, self.errors) = (
            self.gets + o.gets,
            self.puts + o.puts,
            self.errors + o.errors,
        );
        (self.aborts, self.retries) = (self.aborts + o.aborts, self.retries + o.retries);
    }
}

fn measure(
    c: &mut Client,
    timer: SimEndpoint,
    w: &mut Workload,
    rng: &mut rand::rngs::SmallRng,
    p: &BenchParams,
    ops: u64,
    window_end: Arc<AtomicU64>,
) -> Measured {
    let mut m = Measured::new(ops, p, timer.mono_ns(), c.fabric_stats(), window_end);
    m.timer = Some(timer);
    let before = c.aborts_retries();
    m.last_aborts = before;
    drive(c, w, rng, &mut m);
    // Counters up to the thread's last operation in the window.
    let after = m.last_aborts;
    m.window_fabric = m.last_fabric.saturating_sub(&m.window_fabric);
    (m.aborts, m.retries) = (after.0 - before.0, after.1 - before.1);
    m
}

/// Every thread's measurement in one, over the run's window.
fn merged(p: &BenchParams, outs: &[Measured]) -> Measured {
    let end = outs[0].window_end.load(Ordering::SeqCst);
    let mut m = Measured::new(0, p, u64::MAX, StatsSnapshot::default(), Arc::default());
    m.window = (u64::MAX, 0);
    for o in outs {
        m.absorb(o);
    }
    // The window closed when the first thread finished (no thread finished: the last one's
    // last operation).
    if end != u64::MAX {
        m.window.1 = end;
    }
    m
}

fn merge(
    p: &BenchParams,
    keys: u64,
    ops_per_thread: u64,
    hw: SimParams,
    outs: &[Measured],
    summary: nessie_fabric_sim::RunSummary,
    wire_bytes: Vec<WireBytes>,
) -> SimBenchResult {
    let m = merged(p, outs);
    let ops = PerKind {
        get: m.gets,
        put: m.puts,
        all: m.gets + m.puts,
    };
    let window_s = m.window.1.saturating_sub(m.window.0) as f64 / 1e9;
    let mut all = m.get_hist.clone();
    all.add(&m.put_hist).expect("same bounds");
    let mut fabric_all = m.fabric.get.clone();
    fabric_all.merge(&m.fabric.put);
    let ops_per_sec = ops.all as f64 / window_s.max(f64::MIN_POSITIVE);
    let params = BenchParams {
        keys: Some(keys),
        transport: "sim".into(),
        duration: window_s,
        warmup: 0.0,
        ..p.clone()
    };
    let bench = BenchResult {
        mode: p.mode.clone(),
        ops_per_sec,
        goodput_bytes_per_sec: ops_per_sec * p.mean_value_size(),
        latency_us: PerKind {
            get: LatencySummary::of(&m.get_hist),
            put: LatencySummary::of(&m.put_hist),
            all: LatencySummary::of(&all),
        },
        fabric: FabricSummary {
            get: m.fabric.get.summary(ops.get),
            put: m.fabric.put.summary(ops.put),
            all: fabric_all.summary(ops.all),
            total_ops: m.window_fabric.fabric_ops(),
            // Replaced by the bytes on the simulated wire (`run`).
            total_bytes: m.window_fabric.remote_bytes(),
            local_bytes: m.window_fabric.local_bytes(),
        },
        ops,
        aborts: m.aborts,
        retries: m.retries,
        // Simulated threads burn no measured CPU; their modelled CPU time is in the latencies.
        cpu_seconds: CpuSeconds::default(),
        errors: m.errors,
        offered_ops_per_sec: None,
        timeline: Default::default(),
        error_kinds: Default::default(),
        fault: None,
        scaling: None,
        params,
    };
    SimBenchResult {
        bench,
        simulated_seconds: window_s,
        simulated_total_seconds: summary.end_ns as f64 / 1e9,
        ops_per_thread,
        hardware: hw,
        wire_bytes,
        dispatches: summary.dispatches,
    }
}
