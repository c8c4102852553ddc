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
    let started = dir.join("node-0.pid").exists() || dir.join("node-1.pid").exists();
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
    assert!(!started, "{name}: nodes were started");
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
