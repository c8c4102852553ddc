//! The simulator's presets (`nessie sim sweep`): the paper's cluster experiments (§4.6), run
//! on the simulated network, and the table of average latencies and bytes sent that the paper
//! reports beside its figures.
//!
//! | preset                | runs | what varies                                                   |
//! |-----------------------|------|---------------------------------------------------------------|
//! | `paper-values`        | 21   | value size 2..128 KiB × cd/sd/hy; 50 % GET, uniform keys        |
//! | `paper-zipf`          | 21   | the same with Zipf 0.99 keys                                  |
//! | `paper-optimizations` | 20   | cd, Zipf 0.99, 50 % GET, 2/8/32/128 KiB: basic → +filter bits → +cache → +previous versions → +multi-read |
//! | `paper-contention`    | 15   | background processes per node 0/2/4/8/12 × cd/sd/hy; 16 KiB, 50 % GET, uniform |
//!
//! The setup is the paper's: 15 nodes, 12 workers per node (for sd and hy split between client
//! and server threads as the paper tuned them, [`paper_server_threads`]), 128-byte keys, index
//! load factor 0.4; the hash functions (3) and filter bits (7) are the geometry's defaults.
//! Node count, key size and load factor come from the base parameters, which `nessie sim
//! sweep` sets to the paper's values.

use nessie_bench::result::{BenchParams, BenchResult};

use crate::plot;
use crate::preset::{PlotPoint, Preset, RunSpec, OPTIMIZATION_STEPS, ZIPF};

/// Value sizes of `paper-values` and `paper-zipf` (bytes): 2 KiB to 128 KiB.
pub const PAPER_VALUE_SIZES: [u32; 7] = [2048, 4096, 8192, 16384, 32768, 65536, 131072];
/// Value sizes of `paper-optimizations` (a subset, to keep its 5 configurations affordable).
pub const PAPER_OPTIMIZATION_SIZES: [u32; 4] = [2048, 8192, 32768, 131072];
/// Background CPU-bound processes per node in `paper-contention`.
pub const PAPER_BACKGROUND: [u16; 5] = [0, 2, 4, 8, 12];
/// Value size of `paper-contention`.
pub const PAPER_CONTENTION_VALUE: u32 = 16 * 1024;
/// Fraction of GETs in every paper preset.
pub const PAPER_GET_RATIO: f64 = 0.5;
/// The paper's cluster: nodes, cores per node (two 6-core Xeon E5-2620 v2, hyperthreading
/// off) and worker threads per node (one per core).
pub const PAPER_NODES: u16 = 15;
pub const PAPER_CORES: u32 = 12;
pub const PAPER_WORKERS: u16 = 12;
/// The protocols the paper compares.
pub const PAPER_MODES: [&str; 3] = ["cd", "sd", "hy"];

/// Server threads per node the paper found best (§4.6; the rest of the 12 workers are
/// clients). NessieSD: 3 below 1 KiB values, else 2. NessieHY: at 50 % GET, 3 up to 32 KiB,
/// else 2; at higher GET ratios 1. cd has none.
pub fn paper_server_threads(mode: &str, value_size: u32, get_ratio: f64) -> u16 {
    match mode {
        "sd" if value_size < 1024 => 3,
        "sd" => 2,
        "hy" if get_ratio > 0.5 + 1e-9 => 1,
        "hy" if value_size <= 32 * 1024 => 3,
        "hy" => 2,
        _ => 0,
    }
}

/// `paper-values` / `paper-zipf`: every size × every mode, with `dist`.
pub(crate) fn values_runs(preset: Preset, base: &BenchParams, dist: &str) -> Vec<RunSpec> {
    let mut specs = Vec::new();
    for mode in PAPER_MODES {
        for size in PAPER_VALUE_SIZES {
            let p = paper_params(base, mode, size, dist);
            let stem = format!("{}-{mode}-{}", preset.name(), size_stem(size));
            specs.push(crate::preset::spec(preset, p, stem));
        }
    }
    specs
}

/// `paper-optimizations`: cd with its optimisations switched on one by one, at each size.
pub(crate) fn optimization_runs(base: &BenchParams) -> Vec<RunSpec> {
    let mut specs = Vec::new();
    for (_, part, [f, c, pv, m]) in OPTIMIZATION_STEPS {
        for size in PAPER_OPTIMIZATION_SIZES {
            let mut p = paper_params(base, "cd", size, ZIPF);
            (p.filter_bits, p.cache, p.previous_versions, p.multi_read) = (f, c, pv, m);
            let stem = format!("paper-optimizations-{part}-{}", size_stem(size));
            specs.push(crate::preset::spec(Preset::PaperOptimizations, p, stem));
        }
    }
    specs
}

/// `paper-contention`: every mode with 0..=12 background processes per node.
pub(crate) fn contention_runs(base: &BenchParams) -> Vec<RunSpec> {
    let mut specs = Vec::new();
    for mode in PAPER_MODES {
        for bg in PAPER_BACKGROUND {
            let mut p = paper_params(base, mode, PAPER_CONTENTION_VALUE, "uniform");
            p.background = bg;
            let stem = format!("paper-contention-{mode}-bg{bg}");
            specs.push(crate::preset::spec(Preset::PaperContention, p, stem));
        }
    }
    specs
}

/// The base parameters with one run's mode, size and distribution, the workers split as the
/// paper split them, and every cd optimisation on.
fn paper_params(base: &BenchParams, mode: &str, value_size: u32, dist: &str) -> BenchParams {
    // The base's client threads are the workers per node; sd and hy give some to servers.
    let workers = base.client_threads;
    let (clients, servers) = match paper_server_threads(mode, value_size, PAPER_GET_RATIO) {
        0 => (workers, base.server_threads),
        s => (workers.saturating_sub(s).max(1), s),
    };
    BenchParams {
        mode: mode.into(),
        client_threads: clients,
        server_threads: servers,
        value_size,
        value_size_min: None,
        get_ratio: PAPER_GET_RATIO,
        dist: dist.into(),
        background: 0,
        target_load: None,
        filter_bits: true,
        cache: true,
        previous_versions: true,
        multi_read: true,
        ..base.clone()
    }
}

fn size_stem(size: u32) -> String {
    format!("{}k", size / 1024)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// Where a run is plotted in a paper preset's figures (see [`crate::preset::classify`]).
pub(crate) fn classify(preset: Preset, p: &BenchParams) -> Option<PlotPoint> {
    let common = close(p.get_ratio, PAPER_GET_RATIO)
        && p.target_load.is_none()
        && p.value_size_min.is_none();
    if !common {
        return None;
    }
    if preset == Preset::PaperContention {
        return classify_contention(p);
    }
    if p.background != 0 {
        return None;
    }
    let zipf = p.dist.trim() == ZIPF;
    let all_on = p.filter_bits && p.cache && p.previous_versions && p.multi_read;
    let series = match preset {
        Preset::PaperValues if p.dist.trim() == "uniform" => p.mode.clone(),
        Preset::PaperZipf if zipf => p.mode.clone(),
        Preset::PaperOptimizations if zipf && p.mode == "cd" => {
            let switches = [p.filter_bits, p.cache, p.previous_versions, p.multi_read];
            let step = OPTIMIZATION_STEPS.iter().position(|s| s.2 == switches)?;
            OPTIMIZATION_STEPS[step].0.to_string()
        }
        _ => return None,
    };
    if preset != Preset::PaperOptimizations && (p.mode == "cd" && !all_on) {
        return None;
    }
    Some(PlotPoint {
        group: String::new(),
        series,
        x: f64::from(p.value_size),
        x_label: plot::format_bytes(f64::from(p.value_size)),
    })
}

/// `paper-contention`: x is the number of background processes per node, a line per mode.
fn classify_contention(p: &BenchParams) -> Option<PlotPoint> {
    let ok = p.value_size == PAPER_CONTENTION_VALUE
        && p.dist.trim() == "uniform"
        && PAPER_MODES.contains(&p.mode.as_str())
        && p.filter_bits
        && p.cache
        && p.previous_versions
        && p.multi_read;
    ok.then(|| PlotPoint {
        group: String::new(),
        series: p.mode.clone(),
        x: f64::from(p.background),
        x_label: format!("{} background", p.background),
    })
}

/// Bytes sent per operation: in a simulated result `fabric.total_bytes` counts the bytes put
/// on the wire in the measured window, headers and acknowledgements included.
pub fn wire_bytes_per_op(r: &BenchResult) -> Option<f64> {
    (r.ops.all > 0).then(|| r.fabric.total_bytes as f64 / r.ops.all as f64)
}

/// The table of a paper preset (`table.md`): per value size (or background load), for each
/// series (mode, or optimisation step), the average GET, PUT and overall latency in µs, the
/// bytes sent in the measured window (MB, 10^6) and per operation (KB), and the client's
/// fabric operations per GET and per PUT (an SD or HY request and its response count as the
/// client's one WRITE; the server's own work is not in it).
pub fn paper_table(preset: Preset, results: &[BenchResult]) -> String {
    let mut rows: Vec<(f64, usize, String, &BenchResult)> = results
        .iter()
        .filter_map(|r| {
            let point = classify(preset, &r.params)?;
            Some((point.x, series_rank(&point.series), point.series, r))
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let label = if preset == Preset::PaperOptimizations {
        "configuration"
    } else {
        "mode"
    };
    let (x_name, x_text): (&str, fn(f64) -> String) = if preset == Preset::PaperContention {
        ("background", |x| format!("{x:.0}"))
    } else {
        ("value", plot::format_bytes)
    };
    let mut out = format!(
        "| {x_name} | {label} | GET avg µs | PUT avg µs | all avg µs | ops | sent MB | sent KB/op | fabric ops/GET | fabric ops/PUT |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for (x, _, series, r) in rows {
        let lat = |ops: u64, v: f64| {
            if ops > 0 {
                format!("{v:.1}")
            } else {
                "-".into()
            }
        };
        out.push_str(&format!(
            "| {} | {series} | {} | {} | {} | {} | {:.1} | {} | {} | {} |\n",
            x_text(x),
            lat(r.ops.get, r.latency_us.get.mean),
            lat(r.ops.put, r.latency_us.put.mean),
            lat(r.ops.all, r.latency_us.all.mean),
            r.ops.all,
            r.fabric.total_bytes as f64 / 1e6,
            wire_bytes_per_op(r).map_or("-".into(), |b| format!("{:.2}", b / 1e3)),
            per_op(r.ops.get, r.fabric.get.ops_mean),
            per_op(r.ops.put, r.fabric.put.ops_mean),
        ));
    }
    out
}

/// A per-operation mean, or `-` without operations.
fn per_op(ops: u64, mean: f64) -> String {
    if ops > 0 {
        format!("{mean:.2}")
    } else {
        "-".into()
    }
}

/// Order of series in tables: the paper's modes, then the optimisation steps in order.
fn series_rank(series: &str) -> usize {
    PAPER_MODES
        .iter()
        .position(|m| *m == series)
        .or_else(|| {
            OPTIMIZATION_STEPS
                .iter()
                .position(|s| s.0 == series)
                .map(|i| PAPER_MODES.len() + i)
        })
        .unwrap_or(usize::MAX)
}
