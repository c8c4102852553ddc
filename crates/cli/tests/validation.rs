//! `nessie up` refuses geometry and protocol settings that make no sense, naming the setting,
//! and starts nothing.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_nessie");

fn up_fails(name: &str, args: &[&str], needle: &str) {
    let dir = std::env::temp_dir().join(format!("nessie-validate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(BIN)
        .args(["up", "--nodes", "2", "--transport", "shm", "--dir"])
        .arg(&dir)
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Neither a node nor the local etcd (its log is the first thing it leaves).
    let started = ["node-0.pid", "node-1.pid", "etcd.log", "etcd.pid"]
        .iter()
        .any(|f| dir.join(f).exists());
    // Stop anything a wrongly accepted setting started before asserting.
    let _ = Command::new(BIN)
        .arg("down")
        .arg("--dir")
        .arg(&dir)
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{name}: accepted; stderr: {err}"
    );
    assert!(
        err.contains(needle),
        "{name}: {err:?} should mention {needle:?}"
    );
    assert!(!started, "{name}: nodes or an etcd were started");
}

/// A configuration that needs membership but cannot work is refused before the local etcd
/// starts (it used to start, and `nessie bench` left its log behind in a temporary directory).
#[test]
fn up_rejects_copies_in_a_server_driven_mode_before_starting_etcd() {
    up_fails(
        "sd-copies",
        &["--replicas", "2", "--mode", "sd"],
        "needs mode cd",
    );
}

#[test]
fn up_rejects_a_zero_value_max() {
    up_fails(
        "value-max",
        &["--value-max", "0"],
        "value_max = 0 is not in 1..=",
    );
}

#[test]
fn up_rejects_a_clock_margin_over_half_the_expiry() {
    up_fails(
        "clock-margin",
        &["--expiry-ms", "1000", "--clock-margin-ms", "600"],
        "clock margin 600 ms exceeds half the expiry period (1000 ms)",
    );
}

#[test]
fn up_rejects_a_memory_budget_too_small_for_one_entry() {
    up_fails(
        "memory-small",
        &["--memory-per-node", "4K"],
        "cannot hold the smallest data table",
    );
}

#[test]
fn up_rejects_a_memory_budget_beside_explicit_table_sizes() {
    up_fails(
        "memory-conflict",
        &["--memory-per-node", "64MiB", "--dtes-per-node", "100"],
        "cannot be used with",
    );
}
