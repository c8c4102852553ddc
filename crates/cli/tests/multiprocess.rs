//! Multi-process clusters: real `nessie node` processes exchanging one-sided operations over UCX
//! (shared memory, and TCP on loopback). Every test stops its cluster, even when it fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nessie_cluster::node::AdminKvClient;
use nessie_cluster::process;
use nessie_testkit::stress::{self, StressSpec};

mod common;
use common::{Cluster, BIN};

/// An admin-socket client of node `node` of `c`.
fn client(c: &Cluster, node: u16) -> AdminKvClient {
    let cfg = nessie_cluster::config::ClusterConfig::load(&process::config_path(&c.dir)).unwrap();
    AdminKvClient::connect(
        &cfg.admin_path(node, &c.dir).unwrap(),
        Duration::from_secs(60),
    )
    .unwrap()
}

fn pids(dir: &Path) -> Vec<i32> {
    (0..3).filter_map(|id| process::live_pid(dir, id)).collect()
}

#[test]
fn cli_put_get_del_across_a_shm_cluster() {
    let c = Cluster::up("cli", 3, "shm", &[]);
    assert_eq!(pids(&c.dir).len(), 3);
    let ok = |o: std::process::Output| {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o.stdout
    };
    ok(c.nessie(&["put", "greeting", "hello", "--node", "0"]));
    assert_eq!(ok(c.nessie(&["get", "greeting", "--node", "2"])), b"hello");
    let file = c.dir.join("value.bin");
    let big: Vec<u8> = (0..16384u32).map(|i| (i * 7) as u8).collect();
    std::fs::write(&file, &big).unwrap();
    ok(c.nessie(&["put", "big", &format!("@{}", file.display()), "--node", "1"]));
    let out = c.dir.join("out.bin");
    ok(c.nessie(&["get", "big", "-o", out.to_str().unwrap()]));
    assert_eq!(std::fs::read(&out).unwrap(), big);
    ok(c.nessie(&["del", "greeting", "--node", "1"]));
    let miss = c.nessie(&["get", "greeting"]);
    assert_eq!(
        miss.status.code(),
        Some(1),
        "not found has its own exit code"
    );
    // Longer than one entry: stored in chunks, up to the item limit (1 MiB by default).
    ok(c.nessie(&["put", "k", &"x".repeat(16385)]));
    assert_eq!(ok(c.nessie(&["get", "k"])), "x".repeat(16385).as_bytes());
    let over = c.dir.join("over.bin");
    std::fs::write(&over, vec![b'o'; (1 << 20) + 1]).unwrap();
    let too_big = c.nessie(&["put", "k", &format!("@{}", over.display())]);
    assert_eq!(too_big.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&too_big.stderr).contains("item_max of 1048576 bytes"));
    ok(c.nessie(&["del", "k"]));
    let status = c.nessie(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&ok(status)).unwrap();
    let present: u64 = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["index"]["present"].as_u64().unwrap())
        .sum();
    // `big` (16,384 bytes and the kind byte, one more than an entry holds): its manifest and
    // two chunks. The deleted `k` took its chunks with it.
    assert_eq!(present, 3, "only `big` is left in the index");
    let again = Command::new(BIN)
        .args(["up", "--nodes", "3", "--dir"])
        .arg(&c.dir)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&again.stderr).contains("already running"));
    let dir = c.dir.clone();
    drop(c);
    assert!(pids(&dir).is_empty(), "nessie down stopped every node");
}

/// One scenario of the core concurrency suite, run against three node processes: 4 client
/// threads (two per node on node 0) drive the nodes' client workers through their admin
/// sockets; every operation is recorded and the history checked.
struct Scenario {
    name: &'static str,
    up_args: Vec<String>,
    spec: StressSpec,
    /// Error kinds the scenario may produce (e.g. a full index at a high load factor).
    allowed_errors: &'static [&'static str],
    /// Data table entries the nodes must have reclaimed (recycled and reused) by the end.
    min_reclaimed: u64,
}

fn base_spec(ops_per_thread: u64, seed: u64) -> StressSpec {
    StressSpec {
        ops_per_thread,
        keys: 200,
        hot_keys: 2,
        hot_fraction: 0.6,
        get_fraction: 0.5,
        delete_fraction: 0.05,
        // Every item in one entry (63 bytes and the layer's kind byte): these runs are about
        // recycling small tables; the fault runs (`faults.rs`) cover large items.
        value_size: (8, 63),
        sizes_by_key: false,
        seed,
        time_limit: Duration::from_secs(300),
        preload_keys: 0,
        until: None,
        ttl: None,
        size_shift: None,
    }
}

fn up_args(ites: u64, dtes: u64, expiry_ms: u64, delay: &str) -> Vec<String> {
    let mut v: Vec<String> = ["--workers", "2", "--value-max", "64", "--key-max", "16"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.extend([
        "--ites-per-node".into(),
        ites.to_string(),
        "--dtes-per-node".into(),
        dtes.to_string(),
    ]);
    v.extend([
        "--expiry-ms".into(),
        expiry_ms.to_string(),
        format!("--node-arg=--inject-delay={delay}"),
    ]);
    v
}

fn run_scenario(transport: &str, sc: Scenario) {
    let args: Vec<&str> = sc.up_args.iter().map(|s| s.as_str()).collect();
    let c = Cluster::up(&format!("{}-{transport}", sc.name), 3, transport, &args);
    let clients: Vec<AdminKvClient> = [0, 1, 2, 0].iter().map(|&n| client(&c, n)).collect();
    let (out, _) = stress::run(clients, &sc.spec);
    eprintln!("{} over {transport}: {out}", sc.name);
    assert!(!out.truncated, "time limit reached");
    assert_eq!(out.ops, 4 * sc.spec.ops_per_thread);
    assert_eq!(out.corrupt_reads, 0);
    let unexpected: Vec<_> = out
        .errors
        .keys()
        .filter(|k| !sc.allowed_errors.iter().any(|a| k.contains(a)))
        .collect();
    assert!(unexpected.is_empty(), "errors: {:?}", out.errors);
    assert!(
        out.report.is_ok(),
        "history not linearizable:\n{}",
        out.report
    );
    let status: serde_json::Value =
        serde_json::from_slice(&c.nessie(&["status", "--json"]).stdout).unwrap();
    let reclaimed: u64 = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["data_table"]["reclaimed_total"].as_u64().unwrap())
        .sum();
    assert!(
        reclaimed >= sc.min_reclaimed,
        "only {reclaimed} entries reclaimed"
    );
}

fn hot_keys(ops: u64, seed: u64) -> Scenario {
    Scenario {
        name: "hot",
        up_args: up_args(1024, 4096, 200, &format!("{seed},0.02,20000")),
        spec: base_spec(ops, seed),
        allowed_errors: &[],
        min_reclaimed: 0,
    }
}

fn deletes(ops: u64, seed: u64) -> Scenario {
    let spec = StressSpec {
        keys: 16,
        delete_fraction: 0.25,
        get_fraction: 0.45,
        ..base_spec(ops, seed)
    };
    Scenario {
        name: "del",
        up_args: up_args(1024, 4096, 200, &format!("{seed},0.02,20000")),
        spec,
        allowed_errors: &[],
        min_reclaimed: 0,
    }
}

/// 384 index entries for up to 450 keys: the index stays above 85% full, inserts migrate.
fn high_load(ops: u64, seed: u64) -> Scenario {
    let spec = StressSpec {
        keys: 450,
        hot_keys: 0,
        get_fraction: 0.5,
        delete_fraction: 0.1,
        preload_keys: 450,
        ..base_spec(ops, seed)
    };
    Scenario {
        name: "load",
        up_args: up_args(128, 4096, 200, &format!("{seed},0.02,20000")),
        spec,
        allowed_errors: &["IndexFull"],
        min_reclaimed: 0,
    }
}

/// 96 data table entries per node and a short expiry: entries are recycled constantly.
/// `expiry_ms` must leave room for a whole operation: over TCP every fabric op is a round trip
/// through the target's progress thread, and on a loaded 2-core machine a 5 ms expiry made a
/// few operations time out on every one of their attempts.
fn recycling(ops: u64, seed: u64, expiry_ms: u64) -> Scenario {
    let spec = StressSpec {
        keys: 40,
        get_fraction: 0.4,
        ..base_spec(ops, seed)
    };
    Scenario {
        name: "recycle",
        up_args: up_args(1024, 96, expiry_ms, &format!("{seed},0.02,20000")),
        spec,
        allowed_errors: &[],
        // 4 × ops operations, ~60% of them writes, through 3 × 96 entries.
        min_reclaimed: ops,
    }
}

/// Rare injected stalls of up to 12 ms against a 5 ms expiry: stalled operations must time out
/// and be retried inside the nodes, never return stale data.
fn stalls(ops: u64, seed: u64) -> Scenario {
    let spec = StressSpec {
        keys: 40,
        get_fraction: 0.5,
        ..base_spec(ops, seed)
    };
    Scenario {
        name: "stall",
        up_args: up_args(1024, 96, 5, &format!("{seed},0.0005,12000000")),
        spec,
        allowed_errors: &[],
        min_reclaimed: 0,
    }
}

#[test]
fn shm_hot_keys_across_processes() {
    run_scenario("shm", hot_keys(25_000, 11));
}

#[test]
fn shm_deletes_across_processes() {
    run_scenario("shm", deletes(25_000, 12));
}

#[test]
fn shm_high_load_factor_migrations_across_processes() {
    run_scenario("shm", high_load(25_000, 13));
}

#[test]
fn shm_recycling_across_processes() {
    run_scenario("shm", recycling(25_000, 14, 5));
}

#[test]
fn shm_stalls_past_expiry_across_processes() {
    run_scenario("shm", stalls(10_000, 15));
}

/// Smaller runs over TCP (operations emulated by the targets' progress threads).
#[test]
fn tcp_hot_keys_across_processes() {
    run_scenario("tcp", hot_keys(5_000, 21));
}

#[test]
fn tcp_recycling_across_processes() {
    run_scenario("tcp", recycling(5_000, 22, 25));
}

/// Node processes whose configurations disagree refuse to form a cluster, naming the problem.
#[test]
fn mismatched_peers_are_refused() {
    use nessie_cluster::config::{ClusterConfig, Transport};
    let dir = std::env::temp_dir().join(format!("nessie-test-mismatch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ports = nessie_cluster::process::free_ports(2).unwrap();
    let mut a = ClusterConfig::local("m", 2, Transport::Shm, 0, nessie_store::Geometry::default());
    for (n, p) in a.node.iter_mut().zip(&ports) {
        n.bootstrap.set_port(*p);
    }
    a.cluster.bootstrap_timeout_ms = 5_000;
    let run_pair = |cfg0: &ClusterConfig, cfg1: &ClusterConfig| -> (String, String) {
        let (p0, p1) = (dir.join("a.toml"), dir.join("b.toml"));
        cfg0.save(&p0).unwrap();
        cfg1.save(&p1).unwrap();
        let spawn = |p: &PathBuf, id: &str| {
            Command::new(BIN)
                .args(["node", "--config"])
                .arg(p)
                .args(["--id", id])
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (c0, c1) = (spawn(&p0, "0"), spawn(&p1, "1"));
        let (o0, o1) = (
            c0.wait_with_output().unwrap(),
            c1.wait_with_output().unwrap(),
        );
        assert!(!o0.status.success() || !o1.status.success());
        (
            String::from_utf8_lossy(&o0.stderr).into_owned(),
            String::from_utf8_lossy(&o1.stderr).into_owned(),
        )
    };
    let mut b = a.clone();
    b.geometry.value_max *= 2;
    let (e0, e1) = run_pair(&a, &b);
    // Whichever node notices first exits; the other then finds it gone.
    let both = format!("{e0}\n{e1}");
    assert!(
        both.contains("does not match") && both.contains("value_max = "),
        "{both}"
    );
    let mut b = a.clone();
    b.cluster.secret = "ab".repeat(32);
    let (e0, e1) = run_pair(&a, &b);
    assert!(
        e0.contains("authentication with node 1") || e1.contains("authentication with node 0"),
        "{e0}\n{e1}"
    );
    assert!(!e0.contains("panicked") && !e1.contains("panicked"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The baselines' node processes (server threads polling request slots over UCX) pass the
/// same history check.
#[test]
fn shm_sd_across_processes() {
    let mut sc = hot_keys(5_000, 31);
    sc.name = "sd";
    sc.up_args
        .extend(["--mode", "sd", "--server-threads", "1"].map(String::from));
    run_scenario("shm", sc);
}

#[test]
fn shm_hy_across_processes() {
    let mut sc = deletes(5_000, 32);
    sc.name = "hy";
    sc.up_args
        .extend(["--mode", "hy", "--server-threads", "2"].map(String::from));
    run_scenario("shm", sc);
}

/// Pilaf's node processes: GETs READ entries and extents of other processes over UCX and
/// verify their CRC64s, writes go to the owner's server threads.
#[test]
fn shm_pilaf_across_processes() {
    let mut sc = deletes(5_000, 33);
    sc.name = "pilaf";
    sc.up_args
        .extend(["--mode", "pilaf", "--server-threads", "2"].map(String::from));
    run_scenario("shm", sc);
}

/// A node whose bootstrap port is taken by another process at start-up makes `up` retry the
/// whole cluster on fresh ports instead of failing (the CI flake this guards against: a port
/// probed free was bound by someone else before the node bound it).
#[test]
fn up_retries_when_a_bootstrap_port_is_taken() {
    use nessie_cluster::config::Transport;
    let dir = std::env::temp_dir().join(format!("nessie-test-portclash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = squatter.local_addr().unwrap().port();
    let opts = process::UpOptions::new(
        BIN.into(),
        2,
        Transport::Shm,
        nessie_store::Geometry::default(),
    );
    let mut attempts = Vec::new();
    let r = process::up_with_ports(&dir, &opts, |n| {
        let mut p = process::free_ports(n)?;
        if attempts.is_empty() {
            p[1] = taken;
        }
        attempts.push(p.clone());
        Ok(p)
    });
    let _ = process::down(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = r.expect("up should have retried on fresh ports");
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert!(cfg.node.iter().all(|n| n.bootstrap.port() != taken));
    drop(squatter);
}
