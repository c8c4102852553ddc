//! The command line's shared conventions: every byte-size flag takes K/M/G (KiB/MiB/GiB,
//! powers of 1024) and refuses a bad size naming the flag and the problem; client threads are
//! `--client-threads` everywhere, the old names (`--threads`, `--workers`) kept as aliases.

mod common;

use std::process::{Command, Output};

use common::{stderr, Cluster, BIN};

fn nessie(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// `args` are refused by the argument parser (exit code 2) with `needle` in the message.
fn refused(args: &[&str], needle: &str) {
    let out = nessie(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?} accepted: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: {err:?} should mention {needle:?}"
    );
}

#[test]
fn a_bad_size_names_the_flag_and_the_problem() {
    refused(
        &["up", "--value-max", "12Q"],
        "invalid value '12Q' for '--value-max <BYTES>': 12Q: unknown unit \"Q\"",
    );
    refused(&["up", "--key-max", ""], "'--key-max <BYTES>': empty");
    refused(&["up", "--memory-per-node=-64M"], "-64M: negative");
    refused(
        &["up", "--value-max", "4G"],
        "4G: too large (at most 4294967295 bytes)",
    );
    refused(
        &["bench", "fill", "--memory-per-node", "99999999999G"],
        "99999999999G: too large",
    );
    refused(&["sim", "--value-size", "1K..2X"], "2X: unknown unit \"X\"");
    refused(&["demo", "--value-size", "MiB"], "MiB: not a byte count");
    refused(&["fabric-bench", "--working-set", "1T"], "1T: unknown unit");
}

/// One simulated run's JSON result.
fn sim(args: &[&str], name: &str) -> serde_json::Value {
    let json =
        std::env::temp_dir().join(format!("nessie-flags-{name}-{}.json", std::process::id()));
    let out = Command::new(BIN)
        .args(["sim", "--nodes", "2", "--ops", "20", "--keys", "50"])
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let r = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    r
}

#[test]
fn sim_takes_client_threads_its_old_name_and_sizes_with_units() {
    let new = sim(
        &["--client-threads", "3", "--value-size", "2K..4KiB"],
        "new",
    );
    let old = sim(&["--threads", "3", "--value-size", "2048..4096"], "old");
    assert_eq!(new["params"]["client_threads"], 3);
    assert_eq!(new["params"]["value_size_min"], 2048);
    assert_eq!(new["params"]["value_size"], 4096);
    // The simulator is deterministic: equal settings, equal runs.
    assert_eq!(new["params"], old["params"]);
    assert_eq!(new["ops"], old["ops"]);
    let help = stderr(&nessie(&["sim", "--threads"]));
    assert!(help.contains("--client-threads"), "{help}");
}

#[test]
fn up_takes_sizes_with_units_and_workers_as_client_threads() {
    let c = Cluster::up(
        "flags",
        1,
        "shm",
        &[
            "--no-etcd",
            "--value-max",
            "1K",
            "--key-max",
            "64B",
            "--item-max",
            "3K",
            "--workers",
            "1",
        ],
    );
    let cfg = std::fs::read_to_string(c.dir.join("cluster.toml")).unwrap();
    assert!(cfg.contains("value_max = 1024"), "{cfg}");
    assert!(cfg.contains("key_max = 64"), "{cfg}");
    assert!(cfg.contains("workers = 1"), "{cfg}");
    assert!(cfg.contains("item_max = 3072"), "{cfg}");
    // Items longer than an entry are stored in chunks, up to --item-max.
    let fits = "v".repeat(3072);
    let out = c.nessie(&["put", "k", &fits]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = c.nessie(&["get", "k"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), fits);
    let over = "v".repeat(3073);
    let out = c.nessie(&["put", "k", &over]);
    assert!(
        stderr(&out).contains("item_max of 3072 bytes"),
        "{}",
        stderr(&out)
    );
}
