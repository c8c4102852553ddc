//! A preset's PNG figures, one builder per preset, drawn from results alone (see
//! [`classify`]) so they can be redrawn from saved JSON.

use std::fs;
use std::path::{Path, PathBuf};

use nessie_bench::result::BenchResult;

use crate::group::{describe_setup, group_results, mean, series_of, Grouped};
use crate::paper::wire_bytes_per_op;
use crate::plot::{
    self, BarChart, BarGroup, LineFigure, LinePanel, PlotError, Series, XFormat, XScale,
};
use crate::preset::{classify, Preset, MEDIUM_VALUE, OPTIMIZATION_STEPS, QUICK_VALUE};
use crate::summary::{busy_cores, cpu_seconds_per_op, goodput_mib};

/// Pixel size of one panel of a two-panel-wide line figure.
const PANEL_SIZE: (u32, u32) = (760, 520);
/// Pixel size of one panel of the three-panel energy figure.
const ENERGY_PANEL_SIZE: (u32, u32) = (620, 500);
/// Pixel size of the optimizations bar chart.
const BAR_CHART_SIZE: (u32, u32) = (1100, 560);

/// Why a preset's figures could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// None of the results is a run of the preset (see [`classify`]).
    #[error("none of the {results} results is a run of the {preset} preset")]
    NoRuns { preset: Preset, results: usize },
    #[error("cannot create {}: {err}", dir.display())]
    CreateDir { dir: PathBuf, err: std::io::Error },
    #[error(transparent)]
    Plot(#[from] PlotError),
}

/// Goodput in MiB/s, as a metric of [`series_of`] and [`mean`].
fn goodput(r: &BenchResult) -> Option<f64> {
    Some(goodput_mib(r))
}

/// Draws `preset`'s figures from `results` into `out_dir` (created if needed) and returns the
/// PNG files written. Results that are not runs of the preset (see [`classify`]) are ignored;
/// it is an error when none is.
///
/// * contention / quick: `<preset>.png` — goodput (MiB/s) and goodput relative to no
///   background load (%) vs the number of background CPU hogs, a line per mode.
/// * values: `values-goodput.png` — goodput vs value size (log x), one panel per GET ratio
///   (uniform) plus one for Zipf 0.99; `values-relative.png` — goodput of cd relative to sd
///   (and to hy) vs value size, a line per workload, with a dashed line at 1.
/// * energy: `energy.png` — CPU µs per operation (log y), average busy cores and achieved
///   throughput vs offered load (% of the mode's maximum), a line per mode.
/// * optimizations: `optimizations.png` — bars of goodput per configuration (basic →
///   +multi-read), one group per GET ratio.
pub fn render(
    preset: Preset,
    results: &[BenchResult],
    out_dir: &Path,
) -> Result<Vec<PathBuf>, RenderError> {
    let mine: Vec<&BenchResult> = results
        .iter()
        .filter(|r| classify(preset, &r.params).is_some())
        .collect();
    if mine.is_empty() {
        return Err(RenderError::NoRuns {
            preset,
            results: results.len(),
        });
    }
    fs::create_dir_all(out_dir).map_err(|err| RenderError::CreateDir {
        dir: out_dir.to_path_buf(),
        err,
    })?;
    let grouped = group_results(preset, results);
    let setup = describe_setup(&mine);
    match preset {
        Preset::Contention | Preset::Quick => {
            Ok(vec![contention(preset, &grouped, &setup, out_dir)?])
        }
        Preset::Values => Ok(vec![
            values_goodput(&grouped, &setup, out_dir)?,
            values_relative(&grouped, &setup, out_dir)?,
        ]),
        Preset::Energy => Ok(vec![energy(&grouped, &setup, out_dir)?]),
        Preset::Optimizations => Ok(vec![optimizations(&grouped, &setup, out_dir)?]),
        Preset::PaperValues | Preset::PaperZipf | Preset::PaperOptimizations => {
            Ok(vec![paper(preset, &grouped, &setup, out_dir)?])
        }
        Preset::PaperContention => Ok(vec![paper_contention(&grouped, &setup, out_dir)?]),
    }
}

/// Each series as a percentage of its own value at x = 0 (empty without a positive baseline).
fn relative_to_zero(absolute: &[Series]) -> Vec<Series> {
    absolute
        .iter()
        .map(|s| {
            let baseline = s.points.iter().find(|p| p.0 == 0.0).map(|p| p.1);
            Series {
                name: s.name.clone(),
                points: match baseline {
                    Some(b) if b > 0.0 => {
                        s.points.iter().map(|&(x, y)| (x, 100.0 * y / b)).collect()
                    }
                    _ => Vec::new(),
                },
            }
        })
        .collect()
}

/// `contention.png` / `quick.png`: goodput and goodput relative to no background load.
fn contention(
    preset: Preset,
    grouped: &Grouped<'_>,
    setup: &str,
    out_dir: &Path,
) -> Result<PathBuf, PlotError> {
    let size = if preset == Preset::Quick {
        QUICK_VALUE
    } else {
        MEDIUM_VALUE
    };
    let absolute = series_of(&grouped[""], &goodput);
    let mut p1 = LinePanel::new("Goodput", "background CPU-hog processes", "goodput (MiB/s)");
    p1.x_format = XFormat::Integer;
    p1.series = absolute;
    let mut p2 = LinePanel::new(
        "Goodput relative to no contention",
        "background CPU-hog processes",
        "% of goodput at 0",
    );
    p2.x_format = XFormat::Integer;
    p2.series = relative_to_zero(&p1.series);
    p2.reference_y = Some(100.0);
    let title = match preset {
        Preset::Quick => "Nessie quick sweep: goodput under CPU contention".to_string(),
        _ => "Nessie contention sweep: goodput under CPU contention".to_string(),
    };
    let path = out_dir.join(format!("{}.png", preset.name()));
    plot::line_figure(
        &path,
        &LineFigure {
            title,
            subtitle: format!(
                "{} values, 90% GET, uniform keys, closed loop · {setup}",
                plot::format_bytes(f64::from(size))
            ),
            panels: vec![p1, p2],
            columns: 2,
            panel_size: PANEL_SIZE,
        },
    )?;
    Ok(path)
}

/// `values-goodput.png`: goodput vs value size, a panel per workload.
fn values_goodput(
    grouped: &Grouped<'_>,
    setup: &str,
    out_dir: &Path,
) -> Result<PathBuf, PlotError> {
    let mut panels = Vec::new();
    for (name, group) in grouped {
        let mut panel = LinePanel::new(name.clone(), "value size", "goodput (MiB/s)");
        panel.x_scale = XScale::Log2;
        panel.x_format = XFormat::Bytes;
        panel.series = series_of(group, &goodput);
        panels.push(panel);
    }
    // Uniform panels by GET ratio, then Zipf.
    panels.sort_by_key(|p| (p.title.starts_with("Zipf"), p.title.clone()));
    let path = out_dir.join("values-goodput.png");
    plot::line_figure(
        &path,
        &LineFigure {
            title: "Nessie values sweep: goodput vs value size".into(),
            subtitle: format!("closed loop, no background load · {setup}"),
            columns: if panels.len() > 1 { 2 } else { 1 },
            panels,
            panel_size: PANEL_SIZE,
        },
    )?;
    Ok(path)
}

/// The panel of cd's goodput relative to `other`'s, a line per workload.
fn relative_panel(grouped: &Grouped<'_>, other: &str) -> LinePanel {
    let mut panel = LinePanel::new(
        format!("cd goodput / {other} goodput"),
        "value size",
        format!("relative goodput cd/{other}"),
    );
    panel.x_scale = XScale::Log2;
    panel.x_format = XFormat::Bytes;
    panel.reference_y = Some(1.0);
    let mut names: Vec<&String> = grouped.keys().collect();
    names.sort_by_key(|n| (n.starts_with("Zipf"), n.to_string()));
    for name in names {
        let group = &grouped[name];
        let (Some(cd), Some(base)) = (group.get("cd"), group.get(other)) else {
            continue;
        };
        let points = cd
            .iter()
            .filter_map(|(x, runs)| {
                let a = mean(runs, &goodput)?;
                let b = mean(base.get(x)?, &goodput)?;
                (b > 0.0).then_some((x.0, a / b))
            })
            .collect();
        panel.series.push(Series {
            name: name.clone(),
            points,
        });
    }
    panel
}

/// `values-relative.png`: cd's goodput relative to sd's (always drawn), hy's and pilaf's (when
/// run).
fn values_relative(
    grouped: &Grouped<'_>,
    setup: &str,
    out_dir: &Path,
) -> Result<PathBuf, PlotError> {
    let panels: Vec<LinePanel> = ["sd", "hy", "pilaf"]
        .into_iter()
        .map(|other| (other, relative_panel(grouped, other)))
        .filter(|(other, panel)| !panel.series.is_empty() || *other == "sd")
        .map(|(_, panel)| panel)
        .collect();
    let path = out_dir.join("values-relative.png");
    plot::line_figure(
        &path,
        &LineFigure {
            title: "Nessie values sweep: client-driven goodput relative to the baselines".into(),
            subtitle: format!("above 1: cd is faster · {setup}"),
            columns: panels.len(),
            panels,
            panel_size: PANEL_SIZE,
        },
    )?;
    Ok(path)
}

/// `energy.png`: CPU per operation, busy cores and achieved throughput vs offered load.
fn energy(grouped: &Grouped<'_>, setup: &str, out_dir: &Path) -> Result<PathBuf, PlotError> {
    let group = &grouped[""];
    let load = "offered load (% of max)";
    let mut cpu = LinePanel::new("CPU time per operation", load, "CPU µs per operation");
    cpu.x_format = XFormat::Percent;
    cpu.y_log = true;
    cpu.series = series_of(group, &|r| cpu_seconds_per_op(r).map(|s| s * 1e6));
    let mut cores = LinePanel::new("Average busy cores", load, "busy cores (CPU s / s)");
    cores.x_format = XFormat::Percent;
    cores.series = series_of(group, &busy_cores);
    let mut tput = LinePanel::new("Achieved throughput", load, "operations per second");
    tput.x_format = XFormat::Percent;
    tput.series = series_of(group, &|r| Some(r.ops_per_sec));
    let path = out_dir.join("energy.png");
    plot::line_figure(
        &path,
        &LineFigure {
            title: "Nessie energy sweep: CPU cost vs offered load".into(),
            subtitle: format!(
                "16 KiB values, 90% GET, uniform keys, open loop (Poisson), 100% = closed loop · {setup}"
            ),
            panels: vec![cpu, cores, tput],
            columns: 3,
            panel_size: ENERGY_PANEL_SIZE,
        },
    )?;
    Ok(path)
}

/// `<preset>.png` of a simulator preset: goodput, average GET and PUT latency, and bytes sent
/// on the wire per operation, each vs value size, a line per mode (or optimisation step).
fn paper(
    preset: Preset,
    grouped: &Grouped<'_>,
    setup: &str,
    out_dir: &Path,
) -> Result<PathBuf, PlotError> {
    let group = &grouped[""];
    let panel = |title: &str, y: &str, metric: &dyn Fn(&BenchResult) -> Option<f64>| {
        let mut p = LinePanel::new(title, "value size", y);
        p.x_scale = XScale::Log2;
        p.x_format = XFormat::Bytes;
        p.series = series_of(group, metric);
        p
    };
    let panels = vec![
        panel("Goodput", "goodput (MiB/s)", &goodput),
        panel("Average GET latency", "µs", &|r| {
            (r.ops.get > 0).then_some(r.latency_us.get.mean)
        }),
        panel("Average PUT latency", "µs", &|r| {
            (r.ops.put > 0).then_some(r.latency_us.put.mean)
        }),
        panel("Bytes sent per operation", "KiB on the wire per op", &|r| {
            wire_bytes_per_op(r).map(|b| b / 1024.0)
        }),
    ];
    let keys = if preset == Preset::PaperValues {
        "uniform keys"
    } else {
        "Zipf 0.99 keys"
    };
    let path = out_dir.join(format!("{}.png", preset.name()));
    plot::line_figure(
        &path,
        &LineFigure {
            title: format!("Nessie on the simulated cluster: {}", preset.name()),
            subtitle: format!("50% GET, {keys}, closed loop · {setup}"),
            panels,
            columns: 2,
            panel_size: PANEL_SIZE,
        },
    )?;
    Ok(path)
}

/// `paper-contention.png`: goodput, goodput relative to none, and average GET and PUT
/// latency vs background processes per node, a line per mode.
fn paper_contention(
    grouped: &Grouped<'_>,
    setup: &str,
    out_dir: &Path,
) -> Result<PathBuf, PlotError> {
    let group = &grouped[""];
    let x = "background processes per node";
    let panel = |title: &str, y: &str, metric: &dyn Fn(&BenchResult) -> Option<f64>| {
        let mut p = LinePanel::new(title, x, y);
        p.x_format = XFormat::Integer;
        p.series = series_of(group, metric);
        p
    };
    let absolute = panel("Goodput", "goodput (MiB/s)", &goodput);
    let mut relative = panel("Goodput relative to none", "% of goodput at 0", &goodput);
    relative.series = relative_to_zero(&absolute.series);
    relative.reference_y = Some(100.0);
    let panels = vec![
        absolute,
        relative,
        panel("Average GET latency", "µs", &|r| {
            (r.ops.get > 0).then_some(r.latency_us.get.mean)
        }),
        panel("Average PUT latency", "µs", &|r| {
            (r.ops.put > 0).then_some(r.latency_us.put.mean)
        }),
    ];
    let path = out_dir.join("paper-contention.png");
    plot::line_figure(
        &path,
        &LineFigure {
            title: "Nessie on the simulated cluster: paper-contention".into(),
            subtitle: format!(
                "16 KiB values, 50% GET, uniform keys, CPU-bound processes sharing the cores in CFS slices · {setup}"
            ),
            panels,
            columns: 2,
            panel_size: PANEL_SIZE,
        },
    )?;
    Ok(path)
}

/// `optimizations.png`: bars of goodput per configuration, a group per GET ratio.
fn optimizations(grouped: &Grouped<'_>, setup: &str, out_dir: &Path) -> Result<PathBuf, PlotError> {
    let bar_names: Vec<String> = OPTIMIZATION_STEPS.iter().map(|s| s.0.to_string()).collect();
    let mut groups: Vec<_> = grouped.iter().collect();
    groups.sort_by_key(|(name, _)| {
        name.trim_end_matches("% GET")
            .parse::<u32>()
            .unwrap_or(u32::MAX)
    });
    let groups = groups
        .into_iter()
        .map(|(name, series)| BarGroup {
            name: name.clone(),
            values: bar_names
                .iter()
                .map(|b| {
                    series.get(b).and_then(|points| {
                        let runs: Vec<&BenchResult> = points.values().flatten().copied().collect();
                        mean(&runs, &goodput)
                    })
                })
                .collect(),
        })
        .collect();
    let path = out_dir.join("optimizations.png");
    plot::bar_chart(
        &path,
        &BarChart {
            title: "Nessie optimizations sweep: goodput as cd's optimizations are added one by one"
                .into(),
            subtitle: format!("Zipf 0.99 keys, 16 KiB values, closed loop · {setup}"),
            y_label: "goodput (MiB/s)".into(),
            bar_names,
            groups,
            size: BAR_CHART_SIZE,
        },
    )?;
    Ok(path)
}
