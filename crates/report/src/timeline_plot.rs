//! One run's timeline as a figure (`nessie bench --plot F.png`), in the style of Rocksteady's
//! migration timelines (SOSP 2017, Figure 3.2): throughput and GET latency per 100 ms window
//! over the measured window, with the moments a fault or a scaling happened marked as
//! vertical lines.

use std::path::Path;

use nessie_bench::result::BenchResult;

use crate::plot::{line_figure, LineFigure, LinePanel, PlotError, Series, XFormat};

/// Size of one panel in pixels.
const PANEL: (u32, u32) = (1000, 330);

/// The moments to mark: (label, seconds into the measured window).
fn events(r: &BenchResult) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    if let Some(s) = &r.scaling {
        let (what, each) = match s.to > s.from {
            true => ("join", "up"),
            false => ("leave", "stopped"),
        };
        out.push((format!("{what} starts"), s.started_s));
        let first_new = s.from.min(s.to);
        for (i, &t) in s.steps_s.iter().enumerate() {
            let node = match s.to > s.from {
                true => first_new + i as u16,
                false => s.from - 1 - i as u16,
            };
            out.push((format!("node {node} {each}"), t));
        }
        out.push(("balanced".to_string(), s.finished_s));
    }
    if let Some(f) = &r.fault {
        out.push((format!("node {} killed", f.node), f.killed_at_s));
        if let Some(t) = f.restarted_at_s {
            out.push((format!("node {} restarted", f.node), t));
        }
    }
    out
}

/// A vertical line at `x` from `lo` to `hi`, named `name`.
fn marker(name: &str, x: f64, (lo, hi): (f64, f64)) -> Series {
    Series {
        name: format!("{name} ({x:.1} s)"),
        points: vec![(x, lo), (x, hi)],
    }
}

/// Render `r`'s timeline to `path` (PNG): operations per second, and GET p50 and p99.9 on a
/// logarithmic axis, per window; marked: when a scaling started, each node joined or left,
/// and it ended, or when a node was killed and restarted.
pub fn timeline_figure(path: &Path, r: &BenchResult) -> Result<(), PlotError> {
    let t = &r.timeline;
    let w_s = t.window_ms / 1e3;
    let mid = |i: usize| (i as f64 + 0.5) * w_s;
    let ops: Vec<(f64, f64)> = t
        .ops
        .iter()
        .enumerate()
        .map(|(i, &n)| (mid(i), n as f64 / w_s))
        .collect();
    let lat = |v: &[f64]| -> Vec<(f64, f64)> {
        v.iter()
            .enumerate()
            .filter(|(_, &us)| us > 0.0)
            .map(|(i, &us)| (mid(i), us))
            .collect()
    };
    let top = ops.iter().map(|p| p.1).fold(1.0, f64::max);
    let (p50, p999) = (lat(&t.get_p50_us), lat(&t.get_p999_us));
    let lat_lo = p50
        .iter()
        .map(|p| p.1)
        .fold(f64::INFINITY, f64::min)
        .max(0.1);
    let lat_hi = p999.iter().map(|p| p.1).fold(1.0, f64::max);
    let mut thr = LinePanel::new(
        "throughput",
        "seconds into the measured window",
        "operations/s",
    );
    thr.x_format = XFormat::Number;
    thr.series.push(Series {
        name: "ops/s (100 ms windows)".into(),
        points: ops,
    });
    let mut get = LinePanel::new("GET latency", "seconds into the measured window", "µs");
    get.y_log = true;
    get.series.push(Series {
        name: "p50".into(),
        points: p50,
    });
    get.series.push(Series {
        name: "p99.9".into(),
        points: p999,
    });
    for (name, x) in events(r) {
        thr.series.push(marker(&name, x, (0.0, top)));
        get.series.push(marker(&name, x, (lat_lo, lat_hi)));
    }
    let p = &r.params;
    let what = match (&r.scaling, &r.fault) {
        (Some(s), _) => format!("scaling {} to {} nodes", s.from, s.to),
        (None, Some(f)) => format!("node {} killed", f.node),
        (None, None) => format!("{} nodes", p.nodes),
    };
    let figure = LineFigure {
        title: format!("{} over {}: {what}", p.mode, p.transport),
        subtitle: format!(
            "{} copies, {} B values, {:.0}% GET, {} client thread(s) per node, {} ms windows",
            p.replicas,
            p.value_size,
            p.get_ratio * 100.0,
            p.client_threads,
            t.window_ms
        ),
        panels: vec![thr, get],
        columns: 1,
        panel_size: PANEL,
    };
    line_figure(path, &figure)
}
