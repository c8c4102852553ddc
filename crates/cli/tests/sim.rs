//! `nessie sim sweep`: a small paper preset end to end, and its input validation.

use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_nessie");

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nessie-sim-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn sweep(dir: &PathBuf, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["sim", "sweep", "--out"])
        .arg(dir)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_small_paper_sweep_writes_results_table_and_figure() {
    let dir = out_dir("sweep");
    let small = [
        "--preset",
        "paper-values",
        "--nodes",
        "2",
        "--workers",
        "3",
        "--keys-per-node",
        "20",
        "--ops",
        "5",
        // `=`: a value starting with `-` would read as a flag.
        "--only=-2k",
    ];
    let out = sweep(&dir, &small);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // One run per mode at 2 KiB: cd, sd, hy.
    let table = std::fs::read_to_string(dir.join("table.md")).unwrap();
    assert_eq!(table.lines().count(), 2 + 3, "{table}");
    for mode in ["cd", "sd", "hy"] {
        let json = dir.join(format!("paper-values-{mode}-2k.json"));
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(r["params"]["transport"], "sim");
        // The window ends when the first of the 2 nodes' client threads has done its 5
        // operations: those, and what the others completed by then.
        let counted = r["ops"]["all"].as_u64().unwrap() + r["errors"].as_u64().unwrap();
        let planned = 2 * 5 * r["params"]["client_threads"].as_u64().unwrap();
        assert!(
            counted >= 5 && counted <= planned,
            "{mode}: {counted} of {planned}"
        );
        assert!(
            r["fabric"]["total_bytes"].as_u64().unwrap() > 0,
            "{mode}: bytes sent"
        );
        assert!(table.contains(&format!("| 2 KiB | {mode} |")), "{table}");
    }
    let png = std::fs::read(dir.join("paper-values.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG"));
    // Same seed, same results: the sweep is deterministic.
    let again_dir = out_dir("sweep-again");
    assert!(sweep(&again_dir, &small).status.success());
    let a = std::fs::read_to_string(dir.join("paper-values-sd-2k.json")).unwrap();
    let b = std::fs::read_to_string(again_dir.join("paper-values-sd-2k.json")).unwrap();
    assert_eq!(a, b);
    // --redraw rebuilds the table and the figure from the saved results alone.
    std::fs::remove_file(dir.join("table.md")).unwrap();
    std::fs::remove_file(dir.join("paper-values.png")).unwrap();
    let redrawn = sweep(&dir, &["--preset", "paper-values", "--redraw"]);
    assert!(
        redrawn.status.success(),
        "{}",
        String::from_utf8_lossy(&redrawn.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("table.md")).unwrap(),
        table
    );
    assert!(dir.join("paper-values.png").exists());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&again_dir);
}

#[test]
fn sim_sweep_refuses_bad_input_and_runs_nothing() {
    let cases: [(&[&str], &str); 6] = [
        (&["--preset", "paper-zipf", "--redraw"], "no results"),
        (&["--preset", "values"], "runs on a local cluster"),
        (&["--preset", "paper-nope"], "unknown sweep preset"),
        (
            &["--preset", "paper-zipf", "--keys-per-node", "0"],
            "--keys-per-node",
        ),
        (&["--preset", "paper-zipf", "--workers", "1"], "--workers"),
        (
            &["--preset", "paper-zipf", "--only", "no-such-run"],
            "no run of paper-zipf",
        ),
    ];
    for (args, needle) in cases {
        let dir = out_dir("bad");
        let out = sweep(&dir, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!dir.exists(), "{args:?}: wrote {}", dir.display());
    }
    // And `nessie bench sweep` sends the simulator's presets to `nessie sim sweep`.
    let out = Command::new(BIN)
        .args([
            "bench",
            "sweep",
            "--preset",
            "paper-values",
            "--out",
            "/nonexistent",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nessie sim sweep"));
}

#[test]
fn nessie_sim_inflight_runs_pipelined_slots_and_records_it() {
    let dir = out_dir("inflight");
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    let run = |extra: &[&str]| {
        Command::new(BIN)
            .args([
                "sim",
                "--nodes",
                "2",
                "--client-threads",
                "1",
                "--keys",
                "200",
            ])
            .args(["--value-size", "1024", "--get-ratio", "1", "--ops", "200"])
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&["--inflight", "4", "--json", json.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("x 4 in flight"), "{stdout}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["params"]["inflight"], 4);
    assert_eq!(r["errors"], 0);
    for bad in ["0", "65"] {
        let out = run(&["--inflight", bad]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--inflight"), "{bad}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
