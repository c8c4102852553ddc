//! Per-result metrics and the text table of a sweep's results (`summary.txt`).

use nessie_bench::result::{BenchParams, BenchResult};

use crate::plot;

/// Bytes per MiB (goodput is reported in MiB/s).
pub const MIB: f64 = 1024.0 * 1024.0;

/// Goodput in MiB/s.
pub fn goodput_mib(r: &BenchResult) -> f64 {
    r.goodput_bytes_per_sec / MIB
}

/// CPU time of the node processes per successful operation, seconds (`None` without
/// operations), without what open-loop clients spent waiting for arrivals: that is the load
/// generator's cost, and every mode's clients pay it alike.
pub fn cpu_seconds_per_op(r: &BenchResult) -> Option<f64> {
    (r.ops.all > 0).then(|| (r.cpu_seconds.total - r.cpu_seconds.pacing) / r.ops.all as f64)
}

/// Average number of busy cores over the measured window.
pub fn busy_cores(r: &BenchResult) -> Option<f64> {
    (r.params.duration > 0.0).then(|| r.cpu_seconds.total / r.params.duration)
}

/// The optimisation switches as `FCPM` letters (`-` = off); they apply to cd only.
fn switches(p: &BenchParams) -> String {
    if p.mode != "cd" {
        return "n/a".into();
    }
    [
        (p.filter_bits, 'F'),
        (p.cache, 'C'),
        (p.previous_versions, 'P'),
        (p.multi_read, 'M'),
    ]
    .iter()
    .map(|&(on, c)| if on { c } else { '-' })
    .collect()
}

/// Column headers of [`summary_table`].
const HEADER: [&str; 15] = [
    "mode",
    "value",
    "GET%",
    "dist",
    "bg",
    "load",
    "opts",
    "ops/s",
    "MiB/s",
    "GET p50",
    "GET p99",
    "PUT p50",
    "PUT p99",
    "cpu us/op",
    "errors",
];

/// Columns of words (left-aligned); the numbers are right-aligned.
const TEXT_COLUMNS: [usize; 5] = [0, 1, 3, 5, 6];

/// A readable fixed-width table of results, one row each: mode, key parameters (value size,
/// GET %, distribution, background processes, offered load, cd's optimisations F=filter bits
/// C=cache P=previous versions M=multi-read), ops/s, goodput MiB/s, GET and PUT p50/p99 latency µs,
/// CPU µs per operation and failed operations.
pub fn summary_table(results: &[BenchResult]) -> String {
    let rows: Vec<Vec<String>> = results.iter().map(summary_row).collect();
    let widths = column_widths(&rows);
    let header: Vec<String> = HEADER.iter().map(|h| h.to_string()).collect();
    let mut out = table_line(&header, &widths);
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    out.push('\n');
    for row in &rows {
        out.push_str(&table_line(row, &widths));
        out.push('\n');
    }
    out
}

/// The cells of one result's row, in [`HEADER`] order.
fn summary_row(r: &BenchResult) -> Vec<String> {
    let lat = |ops: u64, v: f64| {
        if ops > 0 {
            format!("{v:.1}")
        } else {
            "-".into()
        }
    };
    let p = &r.params;
    vec![
        r.mode.clone(),
        match p.value_size_min {
            Some(lo) => format!(
                "{}..{}",
                plot::format_bytes(f64::from(lo)),
                plot::format_bytes(f64::from(p.value_size))
            ),
            None => plot::format_bytes(f64::from(p.value_size)),
        },
        plot::format_number(p.get_ratio * 100.0),
        p.dist.clone(),
        p.background.to_string(),
        p.target_load.map_or("max".into(), |l| {
            format!("{}%", plot::format_number(l * 100.0))
        }),
        switches(p),
        format!("{:.0}", r.ops_per_sec),
        format!("{:.1}", goodput_mib(r)),
        lat(r.ops.get, r.latency_us.get.p50),
        lat(r.ops.get, r.latency_us.get.p99),
        lat(r.ops.put, r.latency_us.put.p50),
        lat(r.ops.put, r.latency_us.put.p99),
        cpu_seconds_per_op(r).map_or("-".into(), |s| format!("{:.1}", s * 1e6)),
        r.errors.to_string(),
    ]
}

/// Width of each column: its widest cell or header, in characters.
fn column_widths(rows: &[Vec<String>]) -> Vec<usize> {
    let mut widths: Vec<usize> = HEADER.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    widths
}

/// One line of the table: the cells padded to `widths`, two spaces apart, no trailing blanks.
fn table_line(cells: &[String], widths: &[usize]) -> String {
    let parts: Vec<String> = cells
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if TEXT_COLUMNS.contains(&i) {
                format!("{c:<w$}", w = widths[i])
            } else {
                format!("{c:>w$}", w = widths[i])
            }
        })
        .collect();
    parts.join("  ").trim_end().to_string()
}
