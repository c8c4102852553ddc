//! `--json` output is only JSON on stdout: UCX's own log lines (which UCX writes to stdout by
//! default) must go to stderr, and no command sets UCX options this UCX version rejects.

use std::process::{Command, Output};

mod common;
use common::{Cluster, BIN};

/// What UCX's log lines contain (`… ucp_worker.c:2146 UCX  WARN  invalid configurations: …`).
const UCX_LOG_MARK: &str = "UCX ";

fn run(args: &[&str]) -> Output {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "nessie {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Stdout must be exactly one JSON document with no UCX log line around it.
fn stdout_json(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains(UCX_LOG_MARK), "UCX log on stdout:\n{text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{text}"))
}

fn no_invalid_ucx_options(out: &Output) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("invalid configuration"),
        "UCX rejected options:\n{err}"
    );
}

#[test]
fn fabric_bench_json_is_only_json_on_stdout() {
    for transport in ["shm", "tcp"] {
        let out = run(&[
            "fabric-bench",
            "--transport",
            transport,
            "--op",
            "read",
            "--size",
            "8",
            "--iters",
            "200",
            "--json",
        ]);
        let v = stdout_json(&out);
        assert_eq!(v["transport"], transport, "{v}");
        assert_eq!(v["iters"], 200, "{v}");
        no_invalid_ucx_options(&out);
    }
}

/// `--local` measures the process's own memory, beside the local copy of `--working-set`; a
/// CAS has no local path and is refused by name.
#[test]
fn fabric_bench_local_reads_own_memory_and_refuses_cas() {
    let out = run(&[
        "fabric-bench",
        "--local",
        "--size",
        "256",
        "--working-set",
        "64K",
        "--iters",
        "200",
        "--json",
    ]);
    let v = stdout_json(&out);
    assert_eq!(v["transport"], "local", "{v}");
    assert!(v["nessie"]["p50_us"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["local_copy"]["p50_us"].as_f64().unwrap() > 0.0, "{v}");
    let out = Command::new(BIN)
        .args(["fabric-bench", "--local", "--op", "cas", "--iters", "100"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--local measures read and write"), "{err}");
}

/// `--loopback` measures operations on the process's own node both straight to memory and
/// through UCX, in one run, and refuses `--local` beside it.
#[test]
fn fabric_bench_loopback_measures_both_paths() {
    for transport in ["shm", "tcp"] {
        let out = run(&[
            "fabric-bench",
            "--loopback",
            "--transport",
            transport,
            "--op",
            "cas",
            "--iters",
            "200",
            "--json",
        ]);
        let v = stdout_json(&out);
        assert_eq!(
            (v["loopback"].as_bool(), v["op"].as_str()),
            (Some(true), Some("cas"))
        );
        assert!(v["nessie"]["p50_us"].as_f64().unwrap() > 0.0, "{v}");
        assert!(v["through_ucx"]["p50_us"].as_f64().unwrap() > 0.0, "{v}");
        assert!(v["p50_ratio_to_ucx"].as_f64().unwrap() > 0.0, "{v}");
    }
    let out = Command::new(BIN)
        .args(["fabric-bench", "--loopback", "--local", "--iters", "100"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--local") && err.contains("--loopback"),
        "{err}"
    );
}

/// A UCX warning (here: about an unknown `UCX_` environment variable) reaches stderr, not stdout.
#[test]
fn ucx_warnings_go_to_stderr() {
    let out = Command::new(BIN)
        .args(["fabric-bench", "--iters", "100", "--json"])
        .env("UCX_NESSIE_TEST_UNKNOWN", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    stdout_json(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("UCX_NESSIE_TEST_UNKNOWN"), "stderr:\n{err}");
}

#[test]
fn status_json_is_only_json_on_stdout() {
    let c = Cluster::at("json");
    let d = c.dir.to_str().unwrap();
    // `--huge-pages off` sets a UCX option the default leaves alone.
    run(&[
        "up",
        "--nodes",
        "2",
        "--transport",
        "shm",
        "--huge-pages",
        "off",
        "--dir",
        d,
    ]);
    let v = stdout_json(&run(&["status", "--json", "--dir", d]));
    assert_eq!(v["format"], 2, "{v}");
    let nodes = v["nodes"].as_array().expect("an array of nodes");
    assert_eq!(nodes.len(), 2, "{v}");
    assert!(nodes.iter().all(|n| n.get("error").is_none()), "{v}");
    // The nodes' own logs (stdout and stderr of each node) show no rejected UCX option.
    for id in 0..2 {
        let log = std::fs::read_to_string(c.dir.join(format!("node-{id}.log"))).unwrap();
        assert!(
            !log.contains("invalid configuration"),
            "node {id} log:\n{log}"
        );
    }
}
