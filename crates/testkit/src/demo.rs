//! The demo workload: an in-process cluster, client threads running a GET/PUT mix, latency
//! percentiles, fabric counters and (optionally) a linearizability check of the whole history.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use nessie_bench::driver::{drive, Done, Observer};
use nessie_bench::workload::{KeyDist, KeyGen, OpKind, Planned, Workload, WorkloadError};
use nessie_check::{History, Invocation, Limits, Op, Outcome, Recorder};
use nessie_cluster::LocalCluster;
use nessie_fabric::NodeId;
use nessie_protocols::{Error, ProtocolConfig};
use nessie_store::Geometry;
use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::stress::{history_entry, key_bytes, put_id, value_bytes};

#[derive(Clone, Debug)]
pub struct DemoSpec {
    pub nodes: u32,
    pub threads: usize,
    pub keys: u64,
    pub value_size: usize,
    pub get_ratio: f64,
    pub dist: KeyDist,
    pub duration: Duration,
    pub seed: u64,
    pub check: bool,
}

pub struct DemoResult {
    pub ops: u64,
    pub gets: u64,
    pub puts: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub get_latency: Histogram<u64>,
    pub put_latency: Histogram<u64>,
    pub fabric: nessie_fabric::StatsSnapshot,
    pub check: Option<nessie_check::Report>,
    pub migrations: u64,
    pub previous_version_hits: u64,
    pub cache_hits: u64,
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("threads = {0} is not in 1..={MAX_DEMO_THREADS}")]
    Threads(usize),
    #[error("get ratio {0} is not in [0, 1]")]
    GetRatio(f64),
    #[error("value size must be at least 8 bytes (values carry an id)")]
    ValueTooSmall,
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("building the in-process cluster: {0}")]
    Cluster(#[source] nessie_protocols::Error),
    #[error("preload: {0}")]
    Preload(#[source] nessie_protocols::Error),
    #[error("a client thread panicked")]
    Panicked,
}

/// Most client threads the demo runs.
pub const MAX_DEMO_THREADS: usize = 256;

/// Values written by the preload carry ids with this bit set, apart from the run's.
const PRELOAD_ID: u64 = 1 << 62;

fn validate(spec: &DemoSpec) -> Result<(), DemoError> {
    if spec.threads == 0 || spec.threads > MAX_DEMO_THREADS {
        return Err(DemoError::Threads(spec.threads));
    }
    if !(0.0..=1.0).contains(&spec.get_ratio) {
        return Err(DemoError::GetRatio(spec.get_ratio));
    }
    if spec.value_size < 8 {
        return Err(DemoError::ValueTooSmall);
    }
    Ok(())
}

/// Index at load factor 0.4, data table with room for every key twice over plus churn.
fn cluster(spec: &DemoSpec) -> Result<LocalCluster, DemoError> {
    let per_node_keys = spec.keys.div_ceil(spec.nodes as u64).max(1);
    let geometry = Geometry {
        nodes: spec.nodes,
        ites_per_node: (per_node_keys as f64 / 0.4).ceil() as u64 + 8,
        dtes_per_node: (spec.keys * 2 + 4096).min(nessie_store::limits::MAX_DTES_PER_NODE),
        key_max: 16,
        value_max: spec.value_size as u32,
        ..Geometry::default()
    };
    let cfg = ProtocolConfig {
        cache_entries: ((spec.keys as f64 * 0.005) as usize).max(16),
        ..ProtocolConfig::default()
    };
    LocalCluster::new(geometry, cfg, None).map_err(DemoError::Cluster)
}

/// PUT every key once, spread over the nodes' clients so each data table holds some; the
/// writes are recorded, since the checked history starts here.
fn preload(cluster: &LocalCluster, spec: &DemoSpec, history: &History) -> Result<(), DemoError> {
    let mut clients: Vec<_> = (0..spec.nodes)
        .map(|n| cluster.client(n as NodeId))
        .collect::<Result<_, _>>()
        .map_err(DemoError::Cluster)?;
    let mut rec = history.recorder(u32::MAX);
    for k in 0..spec.keys {
        let id = PRELOAD_ID | k;
        let inv = rec.invoke();
        clients[(k % spec.nodes as u64) as usize]
            .put(&key_bytes(k), &value_bytes(id, spec.value_size))
            .map_err(DemoError::Preload)?;
        rec.complete(inv, k, Op::Put(id), Outcome::Ok(None));
    }
    Ok(())
}

/// One demo client thread's side of the workload loop: runs until `end`, keeps latency
/// histograms and counts, and records the history when the demo checks it.
struct DemoThread {
    thread: u32,
    rec: Recorder,
    check: bool,
    end: Instant,
    gets: u64,
    puts: u64,
    errors: u64,
    get_latency: Histogram<u64>,
    put_latency: Histogram<u64>,
}

impl<C> Observer<C> for DemoThread {
    type Token = (Instant, Invocation);

    fn proceed(&mut self, _: &C, _seq: u64) -> bool {
        Instant::now() < self.end
    }

    fn key(&self, k: u64) -> Vec<u8> {
        key_bytes(k)
    }

    fn value(&self, op: &Planned) -> Cow<'_, [u8]> {
        Cow::Owned(value_bytes(put_id(self.thread, op.seq), op.value_len))
    }

    fn invoke(&mut self, _: &C, _: &Planned) -> (Instant, Invocation) {
        (Instant::now(), self.rec.invoke())
    }

    fn complete(&mut self, _: &C, op: &Planned, token: Self::Token, r: Result<Done<'_>, Error>) {
        let (t0, inv) = token;
        let latency = t0.elapsed().as_nanos() as u64;
        match (&r, op.kind) {
            (Err(_), _) => self.errors += 1,
            (Ok(_), OpKind::Get) => self.gets += 1,
            (Ok(_), _) => self.puts += 1,
        }
        if op.kind == OpKind::Get {
            self.get_latency.saturating_record(latency);
        } else {
            self.put_latency.saturating_record(latency);
        }
        if self.check {
            let (kind, outcome) = history_entry(op, self.thread, &r);
            self.rec.complete(inv, op.key, kind, outcome);
        }
    }
}

/// A finished demo thread: its counters and the client's protocol statistics.
struct ThreadResult {
    obs: DemoThread,
    migrations: u64,
    previous_version_hits: u64,
    cache_hits: u64,
}

fn spawn_threads(
    cluster: &LocalCluster,
    spec: &DemoSpec,
    history: &History,
    end: Instant,
) -> Result<Vec<std::thread::JoinHandle<ThreadResult>>, DemoError> {
    let keygen = KeyGen::new(&spec.dist, spec.keys)?;
    let workload = Arc::new(Workload::new(
        keygen,
        spec.get_ratio,
        0.0,
        (spec.value_size, spec.value_size),
    )?);
    (0..spec.threads)
        .map(|t| {
            let mut client = cluster
                .client((t % spec.nodes as usize) as NodeId)
                .map_err(DemoError::Cluster)?;
            let mut obs = DemoThread {
                thread: t as u32,
                rec: history.recorder(t as u32),
                check: spec.check,
                end,
                gets: 0,
                puts: 0,
                errors: 0,
                get_latency: nessie_bench::result::new_hist(),
                put_latency: nessie_bench::result::new_hist(),
            };
            let mut workload = workload.for_thread(t as u64, spec.threads as u64);
            let seed = spec.seed.wrapping_add(t as u64);
            Ok(std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(seed);
                drive(&mut client, &mut workload, &mut rng, &mut obs);
                let st = client.stats();
                ThreadResult {
                    obs,
                    migrations: st.migrations,
                    previous_version_hits: st.previous_version_hits,
                    cache_hits: client.cache_stats().hits,
                }
            }))
        })
        .collect()
}

pub fn run(spec: &DemoSpec) -> Result<DemoResult, DemoError> {
    validate(spec)?;
    let cluster = cluster(spec)?;
    let history = History::new();
    preload(&cluster, spec, &history)?;

    let before = cluster.fabric().stats().total(None);
    let start = Instant::now();
    let handles = spawn_threads(&cluster, spec, &history, start + spec.duration)?;
    let mut res = DemoResult {
        ops: 0,
        gets: 0,
        puts: 0,
        errors: 0,
        elapsed: Duration::ZERO,
        get_latency: nessie_bench::result::new_hist(),
        put_latency: nessie_bench::result::new_hist(),
        fabric: Default::default(),
        check: None,
        migrations: 0,
        previous_version_hits: 0,
        cache_hits: 0,
    };
    for h in handles {
        let t = h.join().map_err(|_| DemoError::Panicked)?;
        res.gets += t.obs.gets;
        res.puts += t.obs.puts;
        res.errors += t.obs.errors;
        // Both histograms share new_hist's bounds, so adding cannot fail.
        res.get_latency.add(&t.obs.get_latency).unwrap();
        res.put_latency.add(&t.obs.put_latency).unwrap();
        res.migrations += t.migrations;
        res.previous_version_hits += t.previous_version_hits;
        res.cache_hits += t.cache_hits;
    }
    res.elapsed = start.elapsed();
    res.ops = res.gets + res.puts;
    res.fabric = cluster.fabric().stats().total(None).saturating_sub(&before);
    if spec.check {
        res.check = Some(nessie_check::check(
            &history.into_events(),
            |_| None,
            &Limits::default(),
        ));
    }
    Ok(res)
}
