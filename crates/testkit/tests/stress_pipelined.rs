//! The stress, stall, mutation and crash runs of the client-driven protocol with many
//! operations in flight per thread: each client thread drives a pipeline (`nessie_inflight`)
//! whose slots interleave step by step in a seeded order, on the in-process fabric with delay
//! injection, and the whole history (each operation from its submission to its completion)
//! is checked for linearizability.

mod common;
use common::{cfg, delay, geometry, spec, variants};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nessie_check::Limits;
use nessie_cluster::LocalCluster;
use nessie_fabric::inproc::InProcEndpoint;
use nessie_fabric::NodeId;
use nessie_inflight::{Pipeline, PipelineOptions};
use nessie_protocols::{
    Eviction, HookPoint, Mutations, Optimizations, ProtocolConfig, RetryPolicy,
};
use nessie_store::Geometry;
use nessie_testkit::assertions::{assert_clean_run, assert_violation};
use nessie_testkit::stress::{self, key_bytes, StressOutcome, StressSpec};

/// The node of each client thread.
const THREADS_NODES: [NodeId; 4] = [0, 1, 2, 0];
/// Operations in flight per thread.
const SLOTS: usize = 4;
/// Operations per thread in each run.
const OPS_PER_THREAD: u64 = 4_000;

/// Slots that give way after every fabric step, resumed in an order drawn from `seed`: the
/// operations of a thread interleave step by step, as the race tests need.
fn interleaved(seed: u64) -> PipelineOptions {
    PipelineOptions {
        interleave: true,
        shuffle_seed: Some(seed),
        ..PipelineOptions::new(SLOTS)
    }
}

/// A hook for slot `slot` of thread `thread`, or none.
type HookFor = Arc<dyn Fn(usize, usize) -> Option<nessie_protocols::hooks::Hook> + Send + Sync>;

/// One pipeline per thread of [`THREADS_NODES`] on `c`, running `cfg`, with `hooks`.
fn pipelines(
    c: &Arc<LocalCluster>,
    cfg: &ProtocolConfig,
    seed: u64,
    hooks: HookFor,
) -> Vec<impl FnOnce() -> Pipeline<InProcEndpoint> + Send + 'static> {
    THREADS_NODES
        .iter()
        .enumerate()
        .map(|(t, &node)| {
            let (c, cfg, hooks) = (c.clone(), cfg.clone(), hooks.clone());
            move || {
                let opts = interleaved(seed * 100 + t as u64);
                c.pipeline_with(node, cfg, opts, |s, client| {
                    if let Some(h) = hooks(t, s) {
                        client.set_hook(Some(h));
                    }
                })
                .expect("a pipeline")
            }
        })
        .collect()
}

fn no_hooks() -> HookFor {
    Arc::new(|_, _| None)
}

/// A recycling cluster: a data table of 96 entries per node and a 5 ms expiry period, so
/// that entries are reused all through the run.
fn recycling(seed: u64, g: Geometry, base: ProtocolConfig) -> (Arc<LocalCluster>, ProtocolConfig) {
    let (c, cfg) = common::recycling(seed, g, base);
    (Arc::new(c), cfg)
}

/// The workload: 40 keys, 60% of the operations on 2 hot ones.
fn small_spec(seed: u64, get_fraction: f64) -> StressSpec {
    StressSpec {
        keys: 40,
        get_fraction,
        ops_per_thread: OPS_PER_THREAD,
        ..spec(seed)
    }
}

/// A hook that stalls its thread (every slot of its pipeline with it) for `ns` on every
/// `every`-th arrival at one of `points`, counting the stalls in `stalls`.
fn stall_every(
    every: u64,
    points: &'static [HookPoint],
    ns: u64,
    stalls: Arc<AtomicU64>,
) -> nessie_protocols::hooks::Hook {
    let mut n = 0u64;
    Box::new(move |p| {
        if points.contains(&p) {
            n += 1;
            if n.is_multiple_of(every) {
                stalls.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_nanos(ns));
            }
        }
    })
}

/// Steps after which an operation's stall outlives the expiry period.
const STALL_POINTS: &[HookPoint] = &[
    HookPoint::AfterIteRead,
    HookPoint::AfterCandidateCas,
    HookPoint::GetAfterDteRead,
];

/// One slot of thread 1 stalls past the expiry period now and then (after reading an ITE,
/// right after publishing its DTE, or between a DTE's header and its value), while the other
/// slots and threads keep writing and recycling. Returns the outcome and the stalls.
fn stalled_run(seed: u64, g: Geometry, o: Optimizations) -> (StressOutcome, u64) {
    let base = ProtocolConfig {
        optimizations: o,
        ..cfg()
    };
    let (c, cfg) = recycling(seed, g, base);
    let stalls = Arc::new(AtomicU64::new(0));
    let (s2, stall_ns) = (stalls.clone(), cfg.expiry_ns + 2_000_000);
    let hooks: HookFor = Arc::new(move |t, s| {
        (t == 1 && s == 0).then(|| stall_every(97, STALL_POINTS, stall_ns, s2.clone()))
    });
    let out = stress::run_pipelined(
        pipelines(&c, &cfg, seed, hooks),
        &small_spec(seed, 0.5),
        &Limits::default(),
    );
    let stalls = stalls.load(Ordering::Relaxed);
    eprintln!("{out}\nstalls: {stalls}");
    (out, stalls)
}

/// Stalls past the expiry period through pipelines, over a large and a small index, and with
/// each optimisation off in turn: every history linearizable, every run exercised (stalls
/// happened, most operations succeeded).
#[test]
fn pipelines_stalling_past_the_expiry_in_every_variant_stay_linearizable() {
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        eprintln!("--- pipelined, {name}");
        let (out, stalls) = stalled_run(300 + i as u64, g, o);
        assert_clean_run(name, &out, THREADS_NODES.len() as u64 * OPS_PER_THREAD);
        assert!(stalls > 0, "{name}: no slot stalled");
    }
}

/// Readers in pipelines that pause between a DTE's header and its value, well within their
/// timer, in a tiny recycling table: with `mutations`, through pipelines.
fn paused_readers_run(seed: u64, mutations: Mutations, stall_past_expiry: bool) -> StressOutcome {
    let base = ProtocolConfig { mutations, ..cfg() };
    let (c, cfg) = recycling(seed, geometry(), base);
    let stalls = Arc::new(AtomicU64::new(0));
    let (s2, expiry) = (stalls.clone(), cfg.expiry_ns);
    let (every, ns) = match stall_past_expiry {
        true => (19, expiry + 2_000_000),
        false => (7, expiry / 4),
    };
    // Two slots of each of the first two threads.
    let hooks: HookFor = Arc::new(move |t, s| {
        (t < 2 && s < 2).then(|| stall_every(every, &[HookPoint::BeforeValueRead], ns, s2.clone()))
    });
    let out = stress::run_pipelined(
        pipelines(&c, &cfg, seed, hooks),
        &small_spec(seed, 0.6),
        &Limits::default(),
    );
    eprintln!("{out}\nstalls: {}", stalls.load(Ordering::Relaxed));
    assert!(stalls.load(Ordering::Relaxed) > 0, "no reader paused");
    out
}

#[test]
fn pipelined_readers_pausing_mid_entry_read_nothing_reused() {
    let out = paused_readers_run(310, Mutations::default(), false);
    assert_clean_run(
        "pipelined paused readers",
        &out,
        THREADS_NODES.len() as u64 * OPS_PER_THREAD,
    );
}

// The protocol's mutations, caught through pipelines: the runs above have teeth with
// operations in flight too. A run catches each in 9 seeds of 10 here (it needs a reader's
// pause to meet a writer reusing the entry): each test runs up to three seeds and asserts the
// violation of the first that finds one, so a miss would take three in a row.

/// The first of `seeds` whose run with `mutations` reports a violation, or the last run.
fn caught(seeds: std::ops::Range<u64>, mutations: Mutations, past_expiry: bool) -> StressOutcome {
    let mut out = None;
    for seed in seeds {
        let o = paused_readers_run(seed, mutations, past_expiry);
        if !o.report.is_ok() {
            eprintln!("caught with seed {seed}");
            return o;
        }
        eprintln!("not caught with seed {seed}");
        out = Some(o);
    }
    out.expect("at least one seed")
}

#[test]
fn mutation_recycling_without_expiry_is_caught_through_pipelines() {
    let out = caught(
        311..314,
        Mutations {
            recycle_without_expiry: true,
            ..Mutations::default()
        },
        false,
    );
    assert_violation(&out, "reusing DTEs without expiry, through pipelines");
}

#[test]
fn mutation_ignoring_the_operation_timer_is_caught_through_pipelines() {
    let out = caught(
        312..315,
        Mutations {
            ignore_op_timer: true,
            ..Mutations::default()
        },
        true,
    );
    assert_violation(&out, "ignoring the operation timer, through pipelines");
}

/// The crashed node of [`a_node_crashing_under_pipelines_keeps_the_history_linearizable`].
const CRASHED: NodeId = 1;

/// Two copies of every table; node 1 crashes a fifth into the run while every thread keeps
/// four operations in flight, and is declared failed. The history (the crashed node's
/// pipeline's operations failing from then on, the survivors' going on) is linearizable: no
/// acknowledged write is lost or undone. Afterwards every key reads alike through both
/// survivors and can be written.
#[test]
fn a_node_crashing_under_pipelines_keeps_the_history_linearizable() {
    let seed = 320;
    let cfg = ProtocolConfig {
        // Short, so that the crashed node's writes in flight are soon completed by others.
        expiry_ns: 20_000_000,
        retry: RetryPolicy {
            max_attempts: 200,
            ..RetryPolicy::default()
        },
        ..cfg()
    };
    let c = Arc::new(LocalCluster::replicated(geometry(), cfg.clone(), delay(seed), 2).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let s = StressSpec {
        preload_keys: 40,
        until: Some(done.clone()),
        ..small_spec(seed, 0.5)
    };
    let fabric_ops = {
        let c = c.clone();
        move || c.fabric().stats().total(None).total_ops()
    };
    let crash_at = fabric_ops() + 30_000;
    // Set when the run has ended: the crasher gives up waiting (false: it never crashed).
    let finished = Arc::new(AtomicBool::new(false));
    let crasher = {
        let (c, done, finished) = (c.clone(), done.clone(), finished.clone());
        std::thread::spawn(move || {
            let wait_for = |ops: u64| {
                while fabric_ops() < ops {
                    if finished.load(Ordering::SeqCst) {
                        return false;
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                true
            };
            if !wait_for(crash_at) {
                return false;
            }
            c.fabric().kill_node(CRASHED);
            c.fail_node(CRASHED);
            // Let the survivors run on after the crash before the run may end.
            wait_for(fabric_ops() + 30_000);
            done.store(true, Ordering::SeqCst);
            true
        })
    };
    let out = stress::run_pipelined(
        pipelines(&c, &cfg, seed, no_hooks()),
        &s,
        &Limits::with_max_states(20_000_000),
    );
    finished.store(true, Ordering::SeqCst);
    assert!(
        crasher.join().unwrap(),
        "the run ended before node {CRASHED} crashed"
    );
    eprintln!("{out}");
    assert!(
        !out.errors.is_empty(),
        "node {CRASHED}'s pipeline should have failed after the crash"
    );
    assert_clean_run(
        "a crash under pipelines",
        &out,
        THREADS_NODES.len() as u64 * OPS_PER_THREAD / 2,
    );
    let mut readers = [c.client(0).unwrap(), c.client(2).unwrap()];
    for k in 0..s.keys {
        let key = key_bytes(k);
        let (a, b) = (readers[0].get(&key), readers[1].get(&key));
        assert!(
            matches!((&a, &b), (Ok(x), Ok(y)) if x == y),
            "key {k} reads {a:?} through node 0 and {b:?} through node 2"
        );
        readers[k as usize % 2]
            .put(&key, b"after the crash")
            .unwrap_or_else(|e| panic!("key {k} cannot be written after the crash: {e}"));
    }
}

/// Writers in pipelines evicting from tiny data tables (allkeys-lru), a third of their items
/// expiring 4 ms after they are written, readers paused mid-entry: each operation's evictions
/// (handed over with its completion) are DELETEs within its interval and each expiry an event
/// at its instant, and the history is linearizable; both really happened.
#[test]
fn pipelines_evicting_and_expiring_keep_the_history_linearizable() {
    let seed = 330;
    let base = ProtocolConfig {
        eviction: Eviction::AllkeysLru,
        ..cfg()
    };
    let (c, cfg) = recycling(seed, geometry(), base);
    let stalls = Arc::new(AtomicU64::new(0));
    let (s2, pause) = (stalls.clone(), cfg.expiry_ns / 4);
    let hooks: HookFor = Arc::new(move |t, s| {
        (t < 2 && s == 0).then(|| stall_every(7, &[HookPoint::BeforeValueRead], pause, s2.clone()))
    });
    let s = StressSpec {
        keys: 400,
        delete_fraction: 0.0,
        ttl: Some((3, Duration::from_millis(4))),
        ..small_spec(seed, 0.5)
    };
    let out = stress::run_pipelined(pipelines(&c, &cfg, seed, hooks), &s, &Limits::default());
    eprintln!(
        "{out}\nevictions {}, expiries {}",
        out.evictions, out.expiries
    );
    assert_clean_run(
        "pipelined evictions and expiries",
        &out,
        THREADS_NODES.len() as u64 * OPS_PER_THREAD,
    );
    assert!(out.evictions > 0, "nothing was evicted: {out}");
    assert!(out.expiries > 0, "no item expired: {out}");
}
