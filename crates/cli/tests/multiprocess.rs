//! Multi-process clusters: real `nessie node` processes exchanging one-sided operations over UCX
//! (shared memory, and TCP on loopback). Every test stops its cluster, even when it fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nessie_bench::stress::{self, StressSpec};
use nessie_cluster::node::AdminKvClient;
use nessie_cluster::process;

const BIN: &str = env!("CARGO_BIN_EXE_nessie");

/// A local cluster started with `nessie up`; `nessie down` on drop.
struct Cluster {
    dir: PathBuf,
}

impl Cluster {
    fn up(name: &str, transport: &str, extra: &[&str]) -> Cluster {
        let dir = std::env::temp_dir().join(format!("nessie-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = Cluster { dir };
        let out = Command::new(BIN)
            .args(["up", "--nodes", "3", "--transport", transport, "--dir"])
            .arg(&c.dir)
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "nessie up failed: {}", String::from_utf8_lossy(&out.stderr));
        c
    }

    fn nessie(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN).args(args).arg("--dir").arg(&self.dir).output().unwrap()
    }

    fn client(&self, node: u16) -> AdminKvClient {
        let cfg = nessie_cluster::config::ClusterConfig::load(&process::config_path(&self.dir)).unwrap();
        AdminKvClient::connect(&cfg.admin_path(node, &self.dir).unwrap(), Duration::from_secs(60)).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(BIN).arg("down").arg("--dir").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn pids(dir: &Path) -> Vec<i32> {
    (0..3).filter_map(|id| process::live_pid(dir, id)).collect()
}

#[test]
fn cli_put_get_del_across_a_shm_cluster() {
    let c = Cluster::up("cli", "shm", &[]);
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
    assert_eq!(miss.status.code(), Some(1), "not found has its own exit code");
    let too_big = c.nessie(&["put", "k", &"x".repeat(16385)]);
    assert_eq!(too_big.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&too_big.stderr).contains("value_max"));
    let status = c.nessie(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&ok(status)).unwrap();
    let present: u64 = v.as_array().unwrap().iter().map(|n| n["index"]["present"].as_u64().unwrap()).sum();
    assert_eq!(present, 1, "only `big` is left in the index");
    let again = Command::new(BIN).args(["up", "--nodes", "3", "--dir"]).arg(&c.dir).output().unwrap();
    assert!(String::from_utf8_lossy(&again.stderr).contains("already running"));
    let dir = c.dir.clone();
    drop(c);
    assert!(pids(&dir).is_empty(), "nessie down stopped every node");
}

fn stress_over(transport: &str, ops_per_thread: u64, seed: u64) {
    let c = Cluster::up(
        &format!("stress-{transport}"),
        transport,
        &["--workers", "2", "--value-max", "64", "--key-max", "16", "--ites-per-node", "1024", "--dtes-per-node", "4096",
          "--expiry-ms", "200", &format!("--node-arg=--inject-delay={seed},0.02,20000")],
    );
    let clients: Vec<AdminKvClient> = [0, 1, 2, 0].iter().map(|&n| c.client(n)).collect();
    let spec = StressSpec {
        ops_per_thread,
        keys: 200,
        hot_keys: 2,
        hot_fraction: 0.6,
        get_fraction: 0.5,
        delete_fraction: 0.05,
        value_size: (8, 64),
        seed,
        time_limit: Duration::from_secs(300),
        preload_keys: 0,
    };
    let (out, _) = stress::run(clients, &spec);
    eprintln!("{transport}: {out}");
    assert!(!out.truncated, "time limit reached");
    assert_eq!(out.ops, 4 * ops_per_thread);
    assert_eq!(out.corrupt_reads, 0);
    assert!(out.errors.is_empty(), "errors: {:?}", out.errors);
    assert!(out.report.is_ok(), "history not linearizable:\n{}", out.report);
}

/// The concurrency checker against three node processes over shared memory: 4 client
/// threads, 100,000 operations, hot keys, deletes, delays injected inside the nodes.
#[test]
fn linearizable_across_processes_over_shm() {
    stress_over("shm", 25_000, 11);
}

/// The same, smaller, over TCP (operations emulated by the targets' progress threads).
#[test]
fn linearizable_across_processes_over_tcp() {
    stress_over("tcp", 5_000, 12);
}
