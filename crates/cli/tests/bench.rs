//! `nessie bench` end to end on a real local cluster (short runs): the JSON result has every
//! field later tools read, with plausible values, in each mode.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_nessie");

fn bench(mode: &str, extra: &[&str]) -> serde_json::Value {
    let out = std::env::temp_dir().join(format!(
        "nessie-bench-test-{mode}-{}.json",
        std::process::id()
    ));
    let o = Command::new(BIN)
        .args([
            "bench",
            "--mode",
            mode,
            "--duration",
            "1",
            "--warmup",
            "0.2",
            "--keys",
            "2000",
            "--value-size",
            "1024",
        ])
        .args(["--json", out.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "nessie bench --mode {mode} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    std::fs::remove_file(&out).unwrap();
    v
}

fn check(v: &serde_json::Value, mode: &str) {
    assert_eq!(v["mode"], mode);
    for f in [
        "value_size",
        "get_ratio",
        "duration",
        "client_threads",
        "server_threads",
        "dist",
        "background",
        "load_factor",
        "seed",
    ] {
        assert!(!v["params"][f].is_null(), "params.{f} missing");
    }
    let all = v["ops"]["all"].as_u64().unwrap();
    assert!(all > 100, "{mode}: only {all} operations");
    assert_eq!(
        all,
        v["ops"]["get"].as_u64().unwrap() + v["ops"]["put"].as_u64().unwrap()
    );
    let ops_per_sec = v["ops_per_sec"].as_f64().unwrap();
    assert!(
        (ops_per_sec - all as f64).abs() < 1.0,
        "1 s window: ops/s equals ops"
    );
    assert!((v["goodput_bytes_per_sec"].as_f64().unwrap() - ops_per_sec * 1024.0).abs() < 1024.0);
    for k in ["get", "put", "all"] {
        let l = &v["latency_us"][k];
        let (p50, p99, p999) = (
            l["p50"].as_f64().unwrap(),
            l["p99"].as_f64().unwrap(),
            l["p999"].as_f64().unwrap(),
        );
        assert!(
            p50 > 0.0 && p50 <= p99 && p99 <= p999,
            "{mode} {k} latency {l}"
        );
        assert!(l["mean"].as_f64().unwrap() > 0.0);
        let f = &v["fabric"][k];
        assert!(
            f["ops_mean"].as_f64().unwrap() > 0.0,
            "{mode}: {k} operations use the fabric"
        );
        assert!(
            f["bytes_mean"].is_number() && f["ops_hist"].is_object() && f["bytes_hist"].is_object()
        );
    }
    assert!(v["fabric"]["total_ops"].as_u64().unwrap() > 0);
    assert!(
        v["fabric"]["total_bytes"].as_u64().unwrap() > 0 && v["fabric"]["local_bytes"].is_u64()
    );
    assert!(v["aborts"].is_u64() && v["retries"].is_u64());
    let cpu = &v["cpu_seconds"];
    assert!(
        cpu["client"].as_f64().unwrap() > 0.0,
        "{mode}: client threads burned CPU"
    );
    assert!(
        cpu["total"].as_f64().unwrap()
            >= cpu["client"].as_f64().unwrap() + cpu["server"].as_f64().unwrap()
    );
    assert!(cpu["progress"].is_number());
}

#[test]
fn bench_cd_sd_hy_produce_complete_results() {
    let cd = bench("cd", &[]);
    check(&cd, "cd");
    assert_eq!(
        cd["cpu_seconds"]["server"].as_f64().unwrap(),
        0.0,
        "cd has no server threads"
    );
    let sd = bench("sd", &["--server-threads", "1"]);
    check(&sd, "sd");
    assert!(
        sd["cpu_seconds"]["server"].as_f64().unwrap() > 0.0,
        "sd servers poll"
    );
    let hy = bench("hy", &["--server-threads", "1", "--get-ratio", "0.5"]);
    check(&hy, "hy");
}

#[test]
fn bench_pilaf_produces_complete_results() {
    let p = bench("pilaf", &["--server-threads", "1", "--get-ratio", "0.9"]);
    check(&p, "pilaf");
    assert!(
        p["cpu_seconds"]["server"].as_f64().unwrap() > 0.0,
        "pilaf servers poll"
    );
    assert!(p["ops"]["get"].as_u64().unwrap() > 0 && p["ops"]["put"].as_u64().unwrap() > 0);
}

#[test]
fn open_loop_and_background_load() {
    let v = bench(
        "cd",
        &[
            "--target-load",
            "0.2",
            "--background",
            "1",
            "--client-threads",
            "1",
        ],
    );
    check(&v, "cd");
    let offered = v["offered_ops_per_sec"].as_f64().unwrap();
    let got = v["ops_per_sec"].as_f64().unwrap();
    assert!(
        got < offered * 1.3 && got > offered * 0.5,
        "open loop at {offered:.0} ops/s delivered {got:.0}"
    );
    assert_eq!(v["params"]["background"], 1);
    // The waits for arrivals are measured (on a sample) and told apart from the store's CPU.
    let cpu = &v["cpu_seconds"];
    let (pacing, total) = (
        cpu["pacing"].as_f64().unwrap(),
        cpu["total"].as_f64().unwrap(),
    );
    assert!(
        pacing > 0.0 && pacing < total,
        "pacing {pacing} of {total} s"
    );
}

/// The cost of replication is measured the same way: R copies, their own etcd; and a
/// server-driven mode refuses copies.
#[test]
fn replicated_runs_report_their_copies() {
    let v = bench("cd", &["--replicas", "2", "--get-ratio", "0.5"]);
    check(&v, "cd");
    assert_eq!(v["params"]["replicas"], 2);
    let o = Command::new(BIN)
        .args([
            "bench",
            "--mode",
            "sd",
            "--replicas",
            "2",
            "--duration",
            "0.5",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("replicas") && err.contains("mode cd"), "{err}");
}

#[test]
fn bad_parameters_are_refused_before_starting_anything() {
    let o = Command::new(BIN)
        .args(["bench", "--mode", "xx"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--mode"));
    let o = Command::new(BIN)
        .args(["bench", "--get-ratio", "2"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("--get-ratio"));
}

/// The `quick` preset end to end (shortened): every run's JSON, the summary and the plot.
#[test]
fn quick_sweep_writes_results_and_plot() {
    let out = std::env::temp_dir().join(format!("nessie-sweep-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let o = Command::new(BIN)
        .args([
            "bench",
            "sweep",
            "--preset",
            "quick",
            "--duration",
            "1",
            "--warmup",
            "0.2",
            "--keys",
            "2000",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "sweep failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    for stem in [
        "quick-cd-bg0",
        "quick-cd-bg1",
        "quick-sd-bg0",
        "quick-sd-bg1",
    ] {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join(format!("{stem}.json"))).unwrap())
                .unwrap();
        assert!(v["ops"]["all"].as_u64().unwrap() > 0, "{stem}");
    }
    let png = std::fs::read(out.join("quick.png")).unwrap();
    assert!(png.len() > 10_000 && png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert!(summary.is_object());
    std::fs::remove_dir_all(&out).unwrap();
}

/// YCSB core workloads end to end: each runs with YCSB's mix (C reads only, D inserts new
/// keys, F's writes are read-modify-writes), and the JSON records what ran: the workload, its
/// read fraction and its distribution, not the flags' defaults.
#[test]
fn ycsb_workloads_run_and_record_their_mix() {
    for (w, reads, dist) in [
        ("ycsb-c", 1.0, "zipf:0.99"),
        ("ycsb-d", 0.95, "latest"),
        ("ycsb-f", 0.5, "zipf:0.99"),
    ] {
        let v = bench("cd", &["--workload", w, "--nodes", "2"]);
        let p = &v["params"];
        assert_eq!(p["workload"], w);
        assert_eq!(p["dist"], dist, "{w}");
        assert_eq!(p["get_ratio"].as_f64(), Some(reads), "{w}");
        assert_eq!(v["errors"].as_u64(), Some(0), "{w}: {v}");
        let (gets, puts) = (
            v["ops"]["get"].as_u64().unwrap(),
            v["ops"]["put"].as_u64().unwrap(),
        );
        assert!(gets > 100, "{w}: {gets} reads");
        let share = gets as f64 / (gets + puts) as f64;
        assert!(
            (share - reads).abs() < 0.05,
            "{w}: {share} of operations read"
        );
    }
}
