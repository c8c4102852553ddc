//! Fixtures shared by the report tests: scratch directories, a plausible synthetic benchmark
//! result (so sweeps run without a cluster) and a check of the PNG files drawn.

#![allow(dead_code)] // each test binary uses its own part

use std::fs;
use std::path::{Path, PathBuf};

use nessie_bench::result::{
    BenchParams, BenchResult, CpuSeconds, FabricSummary, LatencySummary, PerKind,
};

pub fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nessie-sweep-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

pub fn cleanup(dir: &Path) {
    if std::env::var_os("NESSIE_KEEP_TEST_OUTPUT").is_none() {
        let _ = fs::remove_dir_all(dir);
    }
}

/// A synthetic but plausible result: client-driven scales with value size and resists CPU
/// contention, server-driven polls (CPU at any load) and suffers from background processes.
pub fn fake_result(p: &BenchParams) -> BenchResult {
    let size = f64::from(p.value_size);
    let wire = 200e6; // bytes/s
    let per_op_overhead = match p.mode.as_str() {
        "cd" => 4096.0,
        "sd" => 1500.0,
        _ => 2500.0,
    };
    let mut max_ops = wire / (size + per_op_overhead);
    if p.mode == "cd" && size > 8192.0 {
        max_ops *= 1.4;
    }
    let contention = match p.mode.as_str() {
        "cd" => 1.0 / (1.0 + 0.15 * f64::from(p.background)),
        _ => 1.0 / (1.0 + 0.9 * f64::from(p.background)),
    };
    let opt_gain = 1.0
        + 0.05
            * [p.filter_bits, p.cache, p.previous_versions, p.multi_read]
                .iter()
                .filter(|b| **b)
                .count() as f64;
    let skew = if p.dist.starts_with("zipf") && p.mode == "cd" {
        1.1 * opt_gain
    } else {
        1.0
    };
    let put_penalty = 1.0 - 0.3 * (1.0 - p.get_ratio);
    let closed = max_ops * contention * skew * put_penalty;
    let ops_per_sec = p.target_load.map_or(closed, |l| closed * l);
    let ops_all = (ops_per_sec * p.duration) as u64;
    let get = (ops_all as f64 * p.get_ratio) as u64;
    let cpu_total = match p.mode.as_str() {
        "cd" => ops_per_sec * p.duration * 12e-6,
        _ => (f64::from(p.nodes) * f64::from(p.server_threads) + ops_per_sec * 8e-6) * p.duration,
    };
    let lat = |base: f64| LatencySummary {
        mean: base * 1.1,
        p50: base,
        p99: base * 4.0,
        p999: base * 9.0,
    };
    BenchResult {
        mode: p.mode.clone(),
        params: p.clone(),
        ops: PerKind {
            get,
            put: ops_all - get,
            all: ops_all,
        },
        ops_per_sec,
        goodput_bytes_per_sec: ops_per_sec * size,
        latency_us: PerKind {
            get: lat(10.0 + size / 2000.0),
            put: lat(25.0 + size / 1500.0),
            all: lat(12.0),
        },
        fabric: FabricSummary::default(),
        aborts: 3,
        retries: 5,
        cpu_seconds: CpuSeconds {
            client: cpu_total * 0.7,
            server: cpu_total * 0.3,
            progress: 0.0,
            total: cpu_total,
            pacing: 0.0,
        },
        errors: 0,
        offered_ops_per_sec: p.target_load.map(|l| closed * l),
        timeline: Default::default(),
        error_kinds: Default::default(),
        fault: None,
        scaling: None,
    }
}

pub fn short_base() -> BenchParams {
    BenchParams {
        duration: 2.0,
        warmup: 0.5,
        ..BenchParams::default()
    }
}

pub fn assert_png(path: &Path) {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.len() > 10_000,
        "{} is only {} bytes",
        path.display(),
        bytes.len()
    );
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{} is not a PNG",
        path.display()
    );
}
