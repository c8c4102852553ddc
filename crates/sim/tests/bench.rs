//! `nessie sim`'s run: the benchmark workload on a simulated cluster.

use nessie_bench::result::{BenchParams, BenchResult};
use nessie_fabric_sim::SimParams;
use nessie_sim::bench::{SimBenchError, SimBenchResult};
use nessie_store::Geometry;

/// One simulation at a time in this process. The scheduler takes a simulated thread that the
/// kernel reports asleep for three of its polls (600 µs) in a wait of its own as blocked on a
/// lock outside the simulation, and runs another: a wait on a lock of another test's
/// simulation (the memory allocator's, say), under load, would change the schedule, and the
/// same seed would no longer give the same result.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`nessie_sim::bench::run`], alone in this process.
fn run(
    p: &BenchParams,
    keys: u64,
    g: Geometry,
    ops: u64,
    hw: SimParams,
) -> Result<SimBenchResult, SimBenchError> {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    nessie_sim::bench::run(p, keys, g, ops, hw)
}

const KEYS: u64 = 300;
const OPS: u64 = 300;

fn params(value_size: u32, get_ratio: f64) -> BenchParams {
    BenchParams {
        nodes: 3,
        client_threads: 2,
        key_size: 32,
        value_size,
        get_ratio,
        keys: Some(KEYS),
        seed: 5,
        ..BenchParams::default()
    }
}

fn geometry(value_max: u32) -> Geometry {
    Geometry {
        nodes: 3,
        ites_per_node: 512,
        dtes_per_node: 1024,
        key_max: 32,
        value_max,
        ..Geometry::default()
    }
}

fn sim(value_size: u32, get_ratio: f64) -> SimBenchResult {
    let p = params(value_size, get_ratio);
    run(&p, KEYS, geometry(value_size), OPS, SimParams::default()).unwrap()
}

/// The window ends when the first of `threads` threads has done its `ops`: it counts those,
/// and what the others completed by then (fewer, none more than `ops`).
fn assert_in_window(b: &BenchResult, threads: u64, ops: u64) {
    let counted = b.ops.all + b.errors;
    assert!(
        counted > ops && counted <= threads * ops,
        "{counted} operations counted"
    );
}

#[test]
fn a_small_mixed_run_reports_like_bench_and_is_deterministic() {
    let r = sim(64, 0.9);
    let b = &r.bench;
    assert_in_window(b, 6, OPS);
    assert!(b.ops.get > b.ops.put && b.ops.put > 0);
    assert!(r.simulated_seconds > 0.0 && r.simulated_seconds < r.simulated_total_seconds);
    assert!((b.ops_per_sec - b.ops.all as f64 / r.simulated_seconds).abs() < 1e-6 * b.ops_per_sec);
    // A GET is at least one small READ round trip (about 2 µs), and nowhere near a millisecond.
    let get = b.latency_us.get;
    assert!(get.p50 >= 1.9 && get.p99 < 1_000.0, "{get:?}");
    assert!(b.fabric.get.ops_mean >= 1.0 && b.fabric.put.ops_mean > b.fabric.get.ops_mean);
    assert_eq!(b.params.transport, "sim");
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["simulated_seconds"].as_f64().unwrap() > 0.0);
    let as_bench: BenchResult = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(as_bench.ops, b.ops, "readable as a `nessie bench` result");
    let again = serde_json::to_value(sim(64, 0.9)).unwrap();
    assert_eq!(json, again, "same seed, same result");
}

#[test]
fn large_gets_are_bounded_by_the_links() {
    let r = sim(16_384, 1.0);
    let p = SimParams::default();
    // Every GET moves its value over some node's 10 Gb/s egress link: 3 nodes, 3.75 GB/s.
    let links = 3.0 * p.link_mbps as f64 * 1e6 / 8.0;
    let goodput = r.bench.goodput_bytes_per_sec;
    assert!(
        goodput < links,
        "{goodput} B/s through {links} B/s of links"
    );
    assert!(
        goodput > links / 10.0,
        "6 clients keep the links busy: {goodput} B/s"
    );
}

#[test]
fn unknown_modes_are_refused() {
    let p = BenchParams {
        mode: "xx".into(),
        ..params(64, 0.5)
    };
    let e = run(&p, KEYS, geometry(64), OPS, SimParams::default()).unwrap_err();
    assert!(matches!(e, SimBenchError::Mode(_)), "{e}");
}

/// Operations per client thread of the SD and HY runs (their servers poll: many hand-offs).
const SERVED_OPS: u64 = 150;

/// A run of `mode` with one server thread per node.
fn served(mode: &str) -> SimBenchResult {
    let p = BenchParams {
        mode: mode.into(),
        server_threads: 1,
        ..params(64, 0.5)
    };
    run(&p, KEYS, geometry(64), SERVED_OPS, SimParams::default()).unwrap()
}

#[test]
fn sd_hy_and_pilaf_run_with_polling_servers() {
    let cd = sim(64, 0.5);
    for mode in ["sd", "hy", "pilaf"] {
        let r = served(mode);
        let b = &r.bench;
        assert_in_window(b, 6, SERVED_OPS);
        assert_eq!(b.errors, 0, "{mode}");
        // A PUT is a request to the owner's server and its response: fewer fabric operations
        // than CD's PUT, but a server's turn in between.
        assert!(
            b.fabric.put.ops_mean < cd.bench.fabric.put.ops_mean,
            "{mode}"
        );
        assert!(
            b.latency_us.put.p50 >= 2.0,
            "{mode}: {:?}",
            b.latency_us.put
        );
        let again = serde_json::to_value(served(mode)).unwrap();
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            again,
            "{mode}: same seed, same result"
        );
    }
}

/// `fabric.total_bytes` of a simulated run counts the measured window's bytes on the wire:
/// a GET brings its value over a link unless the value is on the reader's node, a cd PUT
/// writes its value into its own node's memory and sends only index traffic.
#[test]
fn bytes_sent_are_the_windows_bytes_on_the_wire() {
    let gets = sim(16_384, 1.0);
    let b = &gets.bench;
    let whole_run: u64 = gets.wire_bytes.iter().map(|w| w.tx).sum();
    assert!(b.fabric.total_bytes < whole_run, "the preload is left out");
    // Uniform keys over 3 nodes: about 2/3 of the values are elsewhere.
    let per_get = b.fabric.total_bytes as f64 / b.ops.get as f64;
    assert!(
        per_get > 0.5 * 16_384.0 && per_get < 1.2 * 16_384.0,
        "{per_get}"
    );
    let puts = sim(16_384, 0.0);
    let per_put = puts.bench.fabric.total_bytes as f64 / puts.bench.ops.put as f64;
    assert!(per_put > 0.0 && per_put < 2_048.0, "{per_put}");
}

/// The sizing of a simulated run leaves room for every PUT it makes.
#[test]
fn sizing_leaves_room_for_the_runs_puts() {
    let p = params(16_384, 0.5);
    let (keys, short) = nessie_sim::bench::sizing(&p, 10);
    let (_, long) = nessie_sim::bench::sizing(&p, 10_000);
    assert_eq!(keys, KEYS);
    // 2 threads × 10,000 ops × 50 % PUTs, at least, more than the short run.
    assert!(long.dtes_per_node >= short.dtes_per_node + 2 * 10_000 / 2);
}

/// A thread whose preload fails still arrives at the barrier: the run ends with the error
/// instead of the other threads waiting for it forever.
#[test]
fn a_failed_preload_is_an_error_not_a_hang() {
    let p = params(1024, 0.5);
    let tiny = Geometry {
        dtes_per_node: 16,
        ..geometry(1024)
    };
    let e = run(&p, KEYS, tiny, OPS, SimParams::default()).unwrap_err();
    assert!(matches!(e, SimBenchError::Preload { .. }), "{e}");
}

/// With background processes taking time slices, a client thread sliced out near the end must
/// not hold the window open: it ends when the first thread is done, so adding background
/// processes never raises throughput, and the window is far shorter than the run's tail.
#[test]
fn under_cpu_contention_the_window_ends_with_the_first_finisher() {
    let hw = SimParams {
        cores_per_node: 2,
        ..SimParams::default()
    };
    let at = |background: u16| {
        let p = BenchParams {
            background,
            ..params(64, 0.5)
        };
        run(&p, KEYS, geometry(64), OPS, hw.clone()).unwrap()
    };
    let (quiet, busy, busier) = (at(0), at(2), at(6));
    for r in [&quiet, &busy, &busier] {
        assert_in_window(&r.bench, 6, OPS);
    }
    let rate = |r: &SimBenchResult| r.bench.ops_per_sec;
    assert!(
        rate(&quiet) > rate(&busy) && rate(&busy) > rate(&busier),
        "{} {} {} ops/s",
        rate(&quiet),
        rate(&busy),
        rate(&busier)
    );
    // Sliced threads leave operations undone when the window closes.
    assert!(busier.bench.ops.all + busier.bench.errors < 6 * OPS);
}

/// A GET-only run of 1 KiB values, one client thread per node keeping `inflight` operations
/// in flight, on hardware `hw`.
fn pipelined(mode: &str, inflight: u16, hw: SimParams) -> SimBenchResult {
    let p = BenchParams {
        mode: mode.into(),
        server_threads: 1,
        client_threads: 1,
        inflight,
        ..params(1024, 1.0)
    };
    run(&p, KEYS, geometry(1024), OPS, hw).unwrap()
}

#[test]
fn operations_in_flight_overlap_their_round_trips_and_share_their_threads_cpu() {
    let hw = SimParams::default();
    let one = pipelined("cd", 1, hw.clone());
    let eight = pipelined("cd", 8, hw.clone());
    assert_eq!(eight.bench.params.inflight, 8, "the result records it");
    assert_eq!(
        serde_json::to_value(&eight).unwrap(),
        serde_json::to_value(pipelined("cd", 8, hw.clone())).unwrap(),
        "same seed, same result"
    );

    assert_eq!(one.bench.errors + eight.bench.errors, 0);
    // Each slot does OPS operations: eight slots on each of three threads.
    assert_in_window(&eight.bench, 3 * 8, OPS);
    // A GET of 1 KiB is mostly round trips: eight in flight overlap them.
    let gain = eight.bench.ops_per_sec / one.bench.ops_per_sec;
    assert!(gain >= 3.0, "8 in flight: {gain:.2}x the throughput of 1");
    // When the CPU is the bottleneck (each fabric operation's post costs 20 µs of it), the
    // slots wait for their thread's CPU one after the other (LN1): little gain.
    let cpu_bound = SimParams {
        cpu_op_ns: 20_000,
        ..hw
    };
    let one = pipelined("cd", 1, cpu_bound.clone());
    let eight = pipelined("cd", 8, cpu_bound);
    let gain = eight.bench.ops_per_sec / one.bench.ops_per_sec;
    assert!(
        gain < 1.3,
        "CPU-bound, 8 in flight: {gain:.2}x the throughput of 1"
    );
}

#[test]
fn sd_runs_with_operations_in_flight_each_slot_a_client_of_its_own() {
    // Each slot leases a request slot of its node's server: four per thread.
    let r = pipelined("sd", 4, SimParams::default());
    assert_eq!(r.bench.errors, 0);
    assert_in_window(&r.bench, 3 * 4, OPS);
}

#[test]
fn background_processes_with_operations_in_flight_are_refused() {
    let p = BenchParams {
        inflight: 4,
        background: 1,
        ..params(64, 0.5)
    };
    let e = run(&p, KEYS, geometry(64), OPS, SimParams::default()).unwrap_err();
    assert!(
        matches!(&e, SimBenchError::Param(m) if m.contains("--background with --inflight")),
        "{e}"
    );
}

#[test]
fn inflight_out_of_range_is_refused_by_name() {
    for inflight in [0, nessie_bench::result::MAX_INFLIGHT + 1] {
        let p = BenchParams {
            inflight,
            ..params(64, 0.5)
        };
        let e = run(&p, KEYS, geometry(64), OPS, SimParams::default()).unwrap_err();
        assert!(
            matches!(&e, SimBenchError::Param(m) if m.contains("--inflight")),
            "{e}"
        );
    }
}
