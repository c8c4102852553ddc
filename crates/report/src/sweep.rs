//! `nessie bench sweep`: named presets that expand into a matrix of benchmark runs mirroring the
//! paper's evaluation (§4.6), run them one after another through a caller-supplied runner, and
//! write each result as JSON, a `summary.json`, a text table and the preset's PNG figures.
//!
//! The runner is a parameter (`FnMut(&BenchParams) -> Result<BenchResult, String>`), so the
//! sweep is testable without a cluster; the CLI passes the real single-run runner.
//!
//! Presets (laptop scale; every run takes its duration, warm-up, cluster shape, transport, key
//! size, seed and — outside `optimizations` — optimisation switches from the base parameters):
//!
//! | preset          | runs | what varies                                                      |
//! |-----------------|------|------------------------------------------------------------------|
//! | `contention`    | 15   | background CPU hogs 0..=4 × cd/sd/hy; 16 KiB, 90 % GET, uniform  |
//! | `values`        | 66   | value size 256 B..128 KiB × 50/90/99 % GET × cd/sd/hy (uniform), and × cd/sd at Zipf 0.99, 90 % GET |
//! | `energy`        | 12   | offered load 5..100 % of the mode's maximum × cd/sd; 16 KiB, 90 % GET |
//! | `optimizations` | 10   | cd, Zipf 0.99, 16 KiB, 50/99 % GET: basic → +filter bits → +cache → +previous versions → +multi-read |
//! | `quick`         | 4    | cd/sd × 0/1 background process; 4 KiB, 90 % GET; runs capped at 3 s + 1 s warm-up |
//!
//! Which run belongs to which line of which figure is derived from its parameters alone
//! ([`classify`]), so figures can be redrawn from JSON files ([`load_results`] + [`render`]).

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::plot::{self, BarChart, BarGroup, LineFigure, LinePanel, Series, XFormat, XScale};
use nessie_bench::result::{BenchParams, BenchResult};

/// Value sizes of the `values` preset (bytes).
pub const VALUE_SIZES: [u32; 6] = [256, 1024, 4096, 16384, 65536, 131072];
/// GET ratios of the `values` preset's uniform runs.
pub const VALUES_GET_RATIOS: [f64; 3] = [0.5, 0.9, 0.99];
/// Offered loads of the `energy` preset, as fractions of the closed-loop maximum; `None` is the
/// closed loop itself (plotted as 100 %).
pub const ENERGY_LOADS: [Option<f64>; 6] =
    [Some(0.05), Some(0.2), Some(0.4), Some(0.6), Some(0.8), None];
/// GET ratios of the `optimizations` preset.
pub const OPTIMIZATION_GET_RATIOS: [f64; 2] = [0.5, 0.99];
/// The largest number of background CPU hogs of the `contention` preset by default.
pub const DEFAULT_MAX_BACKGROUND: u16 = 4;
/// Value size of the `contention`, `energy` and `optimizations` presets.
pub const MEDIUM_VALUE: u32 = 16 * 1024;
/// Value size of the `quick` preset.
pub const QUICK_VALUE: u32 = 4 * 1024;
/// Longest measured window and warm-up of a `quick` run, seconds.
pub const QUICK_MAX_DURATION: f64 = 3.0;
pub const QUICK_MAX_WARMUP: f64 = 1.0;
/// The skewed key distribution of the presets (the paper's Zipf parameter).
pub const ZIPF: &str = "zipf:0.99";

const MODES_ALL: [&str; 3] = ["cd", "sd", "hy"];
const MODES_CD_SD: [&str; 2] = ["cd", "sd"];

/// The optimisation configurations of the `optimizations` preset, cumulative, in order:
/// (label, stem part, filter bits, cache, previous versions, multi-read).
pub const OPTIMIZATION_STEPS: [(&str, &str, [bool; 4]); 5] = [
    ("basic", "basic", [false, false, false, false]),
    ("+filter bits", "filter", [true, false, false, false]),
    ("+cache", "cache", [true, true, false, false]),
    ("+previous versions", "prev", [true, true, true, false]),
    ("+multi-read", "multiread", [true, true, true, true]),
];

/// The sweeps `nessie bench sweep` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Preset {
    Contention,
    Values,
    Energy,
    Optimizations,
    Quick,
}

impl Preset {
    pub const ALL: [Preset; 5] = [
        Preset::Contention,
        Preset::Values,
        Preset::Energy,
        Preset::Optimizations,
        Preset::Quick,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Contention => "contention",
            Preset::Values => "values",
            Preset::Energy => "energy",
            Preset::Optimizations => "optimizations",
            Preset::Quick => "quick",
        }
    }

    /// One line for `--help` and listings.
    pub fn description(self) -> &'static str {
        match self {
            Preset::Contention => {
                "goodput vs background CPU-hog processes 0..=4 (16 KiB, 90% GET, uniform; cd/sd/hy)"
            }
            Preset::Values => {
                "goodput vs value size 256 B..128 KiB at 50/90/99% GET (cd/sd/hy) and Zipf 0.99 (cd/sd)"
            }
            Preset::Energy => "CPU time per operation vs offered load 5..100% (16 KiB, 90% GET; cd/sd)",
            Preset::Optimizations => {
                "goodput as cd's optimisations are switched on one by one (Zipf 0.99, 16 KiB, 50/99% GET)"
            }
            Preset::Quick => "one-minute smoke sweep: cd/sd with 0 and 1 background process (4 KiB)",
        }
    }

    /// The preset's runs at the default scale (see the module docs).
    pub fn runs(&self, base: &BenchParams) -> Vec<RunSpec> {
        self.runs_with_max_background(base, DEFAULT_MAX_BACKGROUND)
    }

    /// The preset's runs, with `contention` going up to `max_background` background processes
    /// (other presets ignore it).
    pub fn runs_with_max_background(
        &self,
        base: &BenchParams,
        max_background: u16,
    ) -> Vec<RunSpec> {
        let mut specs = Vec::new();
        match self {
            Preset::Contention => {
                for mode in MODES_ALL {
                    for bg in 0..=max_background {
                        let mut p = fixed(base, mode, MEDIUM_VALUE, 0.9, "uniform");
                        p.background = bg;
                        specs.push(spec(*self, p, format!("contention-{mode}-bg{bg}")));
                    }
                }
            }
            Preset::Values => {
                for mode in MODES_ALL {
                    for get in VALUES_GET_RATIOS {
                        for size in VALUE_SIZES {
                            let p = fixed(base, mode, size, get, "uniform");
                            let stem = format!("values-{mode}-get{}-{}", pct(get), size_stem(size));
                            specs.push(spec(*self, p, stem));
                        }
                    }
                }
                for mode in MODES_CD_SD {
                    for size in VALUE_SIZES {
                        let p = fixed(base, mode, size, 0.9, ZIPF);
                        let stem = format!("values-zipf-{mode}-get90-{}", size_stem(size));
                        specs.push(spec(*self, p, stem));
                    }
                }
            }
            Preset::Energy => {
                for mode in MODES_CD_SD {
                    for load in ENERGY_LOADS {
                        let mut p = fixed(base, mode, MEDIUM_VALUE, 0.9, "uniform");
                        p.target_load = load;
                        let stem = format!("energy-{mode}-load{}", pct(load.unwrap_or(1.0)));
                        specs.push(spec(*self, p, stem));
                    }
                }
            }
            Preset::Optimizations => {
                for get in OPTIMIZATION_GET_RATIOS {
                    for (_, part, [f, c, pv, m]) in OPTIMIZATION_STEPS {
                        let mut p = fixed(base, "cd", MEDIUM_VALUE, get, ZIPF);
                        (p.filter_bits, p.cache, p.previous_versions, p.multi_read) = (f, c, pv, m);
                        specs.push(spec(
                            *self,
                            p,
                            format!("optimizations-get{}-{part}", pct(get)),
                        ));
                    }
                }
            }
            Preset::Quick => {
                for mode in MODES_CD_SD {
                    for bg in 0..=1 {
                        let mut p = fixed(base, mode, QUICK_VALUE, 0.9, "uniform");
                        p.background = bg;
                        p.duration = p.duration.min(QUICK_MAX_DURATION);
                        p.warmup = p.warmup.min(QUICK_MAX_WARMUP);
                        specs.push(spec(*self, p, format!("quick-{mode}-bg{bg}")));
                    }
                }
            }
        }
        specs
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let wanted = s.trim().to_ascii_lowercase();
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == wanted)
            .ok_or_else(|| {
                let names: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown sweep preset `{s}` (expected one of: {})",
                    names.join(", ")
                )
            })
    }
}

/// The base parameters with the dimensions every preset fixes.
fn fixed(
    base: &BenchParams,
    mode: &str,
    value_size: u32,
    get_ratio: f64,
    dist: &str,
) -> BenchParams {
    BenchParams {
        mode: mode.into(),
        value_size,
        get_ratio,
        dist: dist.into(),
        background: 0,
        target_load: None,
        ..base.clone()
    }
}

fn spec(preset: Preset, params: BenchParams, stem: String) -> RunSpec {
    let point = classify(preset, &params)
        .unwrap_or_else(|| panic!("preset {preset} built a run it does not classify: {stem}"));
    RunSpec {
        stem,
        group: point.group,
        series: point.series,
        x: point.x,
        x_label: point.x_label,
        params,
    }
}

/// A fraction as a whole percentage: 0.99 → 99.
fn pct(fraction: f64) -> u32 {
    (fraction * 100.0).round() as u32
}

fn size_stem(size: u32) -> String {
    if size >= 1024 && size.is_multiple_of(1024) {
        format!("{}k", size / 1024)
    } else {
        format!("{size}b")
    }
}

/// One run of a sweep: its parameters, the file stem of its result (`<stem>.json`), and where
/// it is plotted (figure group, line, x value).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunSpec {
    pub stem: String,
    /// Panel or bar group the run belongs to (e.g. `uniform, 90% GET`); empty when the preset
    /// has a single one.
    pub group: String,
    /// Line (or bar colour) the run belongs to, e.g. `cd` or `+cache`.
    pub series: String,
    /// Position on the x axis (background processes, bytes, % of max load, step index).
    pub x: f64,
    /// Human-readable x value, e.g. `16 KiB`.
    pub x_label: String,
    pub params: BenchParams,
}

/// Where a result is plotted within a preset's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct PlotPoint {
    pub group: String,
    pub series: String,
    pub x: f64,
    pub x_label: String,
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// The Zipf parameter of a `zipf:THETA` distribution.
fn zipf_theta(dist: &str) -> Option<f64> {
    dist.trim()
        .strip_prefix("zipf:")
        .and_then(|t| t.trim().parse().ok())
}

fn is_uniform(dist: &str) -> bool {
    dist.trim() == "uniform"
}

fn is_preset_zipf(dist: &str) -> bool {
    zipf_theta(dist).is_some_and(|t| close(t, 0.99))
}

/// Where a run with these parameters is plotted in `preset`'s figures, or `None` when it is not
/// one of the preset's runs (its fixed dimensions differ). Used both to label the runs a preset
/// builds and to pick a preset's runs out of loaded results.
pub fn classify(preset: Preset, p: &BenchParams) -> Option<PlotPoint> {
    let closed = p.target_load.is_none();
    match preset {
        Preset::Contention | Preset::Quick => {
            let size = if preset == Preset::Quick {
                QUICK_VALUE
            } else {
                MEDIUM_VALUE
            };
            (p.value_size == size && close(p.get_ratio, 0.9) && is_uniform(&p.dist) && closed).then(
                || PlotPoint {
                    group: String::new(),
                    series: p.mode.clone(),
                    x: f64::from(p.background),
                    x_label: match p.background {
                        1 => "1 background process".into(),
                        n => format!("{n} background processes"),
                    },
                },
            )
        }
        Preset::Values => {
            if !closed || p.background != 0 {
                return None;
            }
            let group = if is_uniform(&p.dist)
                && VALUES_GET_RATIOS.iter().any(|&g| close(g, p.get_ratio))
            {
                format!("uniform, {}% GET", pct(p.get_ratio))
            } else if is_preset_zipf(&p.dist) && close(p.get_ratio, 0.9) {
                "Zipf 0.99, 90% GET".to_string()
            } else {
                return None;
            };
            Some(PlotPoint {
                group,
                series: p.mode.clone(),
                x: f64::from(p.value_size),
                x_label: plot::format_bytes(f64::from(p.value_size)),
            })
        }
        Preset::Energy => {
            let ok = p.value_size == MEDIUM_VALUE
                && close(p.get_ratio, 0.9)
                && is_uniform(&p.dist)
                && p.background == 0;
            ok.then(|| {
                let load = p.target_load.unwrap_or(1.0) * 100.0;
                PlotPoint {
                    group: String::new(),
                    series: p.mode.clone(),
                    x: load,
                    x_label: match p.target_load {
                        Some(_) => format!("{}% load", plot::format_number(load)),
                        None => "max load (closed loop)".into(),
                    },
                }
            })
        }
        Preset::Optimizations => {
            let ok = p.mode == "cd"
                && p.value_size == MEDIUM_VALUE
                && OPTIMIZATION_GET_RATIOS
                    .iter()
                    .any(|&g| close(g, p.get_ratio))
                && is_preset_zipf(&p.dist)
                && p.background == 0
                && closed;
            if !ok {
                return None;
            }
            let switches = [p.filter_bits, p.cache, p.previous_versions, p.multi_read];
            let step = OPTIMIZATION_STEPS.iter().position(|s| s.2 == switches)?;
            Some(PlotPoint {
                group: format!("{}% GET", pct(p.get_ratio)),
                series: OPTIMIZATION_STEPS[step].0.to_string(),
                x: step as f64,
                x_label: OPTIMIZATION_STEPS[step].0.to_string(),
            })
        }
    }
}

/// A run that did not produce (or could not save) a result.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunFailure {
    pub stem: String,
    pub params: BenchParams,
    pub error: String,
}

/// One entry of `summary.json`'s `runs`: the spec and what became of it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SummaryRun {
    pub stem: String,
    pub group: String,
    pub series: String,
    pub x: f64,
    pub x_label: String,
    /// `<stem>.json` when the result was saved.
    pub file: Option<String>,
    pub error: Option<String>,
}

/// The content of `<out_dir>/summary.json`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub preset: String,
    pub base: BenchParams,
    /// Every run of the sweep, in order.
    pub runs: Vec<SummaryRun>,
    /// Every result obtained, in run order.
    pub results: Vec<BenchResult>,
    pub failures: Vec<RunFailure>,
    /// PNG files (names within the output directory).
    pub plots: Vec<String>,
    pub plot_error: Option<String>,
}

/// What a sweep did.
#[derive(Clone, Debug)]
pub struct SweepOutcome {
    pub preset: Preset,
    pub out_dir: PathBuf,
    /// The runs that produced a result, in run order.
    pub results: Vec<(RunSpec, BenchResult)>,
    /// Runs that failed (the runner's error) or whose result could not be saved.
    pub failures: Vec<RunFailure>,
    /// Every file written: per-run JSON, `summary.json`, `summary.txt` and the PNG figures.
    pub files: Vec<PathBuf>,
    /// The PNG figures (also in `files`).
    pub plots: Vec<PathBuf>,
    /// Why the figures could not be drawn, if they could not.
    pub plot_error: Option<String>,
}

/// The single-run benchmark: parameters in, result (or a readable error) out.
pub type Runner<'a> = dyn FnMut(&BenchParams) -> Result<BenchResult, String> + 'a;
/// Called before each run with its 1-based index, the number of runs and the run.
pub type Progress<'a> = dyn FnMut(usize, usize, &RunSpec) + 'a;

/// Runs every run of `preset` (built from `base`) through `runner` and writes the results and
/// figures into `out_dir`; see [`run_specs`].
pub fn run_preset(
    preset: Preset,
    base: &BenchParams,
    out_dir: &Path,
    runner: &mut Runner<'_>,
    progress: &mut Progress<'_>,
) -> Result<SweepOutcome, String> {
    run_specs(preset, preset.runs(base), base, out_dir, runner, progress)
}

/// Runs `specs` (normally `preset.runs(..)`, possibly filtered or rescaled) one after another.
///
/// Writes `<out_dir>/<stem>.json` (the pretty-printed [`BenchResult`]) per successful run,
/// `summary.json` ([`Summary`]), `summary.txt` ([`summary_table`]) and the preset's PNG
/// figures ([`render`]). A run that fails — the runner returns an error or panics — is
/// recorded in the outcome and in `summary.json`, any stale `<stem>.json` from an earlier sweep
/// is removed, and the sweep goes on. Returns `Err` only when `out_dir` is unusable, there is
/// nothing to run, `summary.json` cannot be written, or no run produced a result (after writing
/// `summary.json` with the errors).
pub fn run_specs(
    preset: Preset,
    specs: Vec<RunSpec>,
    base: &BenchParams,
    out_dir: &Path,
    runner: &mut Runner<'_>,
    progress: &mut Progress<'_>,
) -> Result<SweepOutcome, String> {
    if specs.is_empty() {
        return Err(format!("sweep {preset}: no runs to do"));
    }
    prepare_out_dir(out_dir)?;
    let total = specs.len();
    let mut outcome = SweepOutcome {
        preset,
        out_dir: out_dir.to_path_buf(),
        results: Vec::new(),
        failures: Vec::new(),
        files: Vec::new(),
        plots: Vec::new(),
        plot_error: None,
    };
    let mut runs = Vec::with_capacity(total);
    for (i, spec) in specs.into_iter().enumerate() {
        progress(i + 1, total, &spec);
        let path = out_dir.join(format!("{}.json", spec.stem));
        let mut entry = SummaryRun {
            stem: spec.stem.clone(),
            group: spec.group.clone(),
            series: spec.series.clone(),
            x: spec.x,
            x_label: spec.x_label.clone(),
            file: None,
            error: None,
        };
        let result = match catch_unwind(AssertUnwindSafe(|| runner(&spec.params))) {
            Ok(r) => r,
            Err(panic) => Err(format!("the runner panicked: {}", panic_message(&panic))),
        };
        match result {
            Ok(result) => {
                match write_json(&path, &result) {
                    Ok(()) => {
                        entry.file = Some(file_name(&path));
                        outcome.files.push(path);
                    }
                    Err(e) => {
                        let error = format!("the run succeeded but its result was not saved: {e}");
                        entry.error = Some(error.clone());
                        outcome.failures.push(RunFailure {
                            stem: spec.stem.clone(),
                            params: spec.params.clone(),
                            error,
                        });
                    }
                }
                outcome.results.push((spec, result));
            }
            Err(error) => {
                // A result left by an earlier sweep under this name would now be misleading.
                if path.exists() {
                    let _ = fs::remove_file(&path);
                }
                entry.error = Some(error.clone());
                outcome.failures.push(RunFailure {
                    stem: spec.stem.clone(),
                    params: spec.params.clone(),
                    error,
                });
            }
        }
        runs.push(entry);
    }

    let results: Vec<BenchResult> = outcome.results.iter().map(|(_, r)| r.clone()).collect();
    let mut summary = Summary {
        preset: preset.name().into(),
        base: base.clone(),
        runs,
        results: results.clone(),
        failures: outcome.failures.clone(),
        plots: Vec::new(),
        plot_error: None,
    };
    // Written before the figures so that the results are on disk whatever drawing does.
    let summary_path = out_dir.join("summary.json");
    write_json(&summary_path, &summary).map_err(|e| format!("sweep {preset}: {e}"))?;
    outcome.files.push(summary_path.clone());

    if results.is_empty() {
        let first = outcome
            .failures
            .first()
            .map(|f| format!("{}: {}", f.stem, f.error))
            .unwrap_or_default();
        return Err(format!(
            "sweep {preset}: all {total} runs failed (first: {first}); errors are in {}",
            summary_path.display()
        ));
    }

    let table_path = out_dir.join("summary.txt");
    match fs::write(&table_path, summary_table(&results)) {
        Ok(()) => outcome.files.push(table_path),
        Err(e) => tracing::warn!("writing {}: {e}", table_path.display()),
    }

    let rendered = catch_unwind(AssertUnwindSafe(|| render(preset, &results, out_dir)))
        .unwrap_or_else(|panic| Err(format!("drawing panicked: {}", panic_message(&panic))));
    match rendered {
        Ok(plots) => {
            summary.plots = plots.iter().map(|p| file_name(p)).collect();
            outcome.files.extend(plots.iter().cloned());
            outcome.plots = plots;
        }
        Err(e) => {
            summary.plot_error = Some(e.clone());
            outcome.plot_error = Some(e);
        }
    }
    write_json(&summary_path, &summary).map_err(|e| format!("sweep {preset}: {e}"))?;
    Ok(outcome)
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".into()
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Creates `out_dir` if needed and checks that files can be written in it.
fn prepare_out_dir(out_dir: &Path) -> Result<(), String> {
    if out_dir.exists() && !out_dir.is_dir() {
        return Err(format!(
            "output directory {} exists and is not a directory",
            out_dir.display()
        ));
    }
    fs::create_dir_all(out_dir)
        .map_err(|e| format!("cannot create output directory {}: {e}", out_dir.display()))?;
    let probe = out_dir.join(format!(".nessie-sweep-write-test-{}", std::process::id()));
    fs::write(&probe, b"ok").map_err(|e| {
        format!(
            "output directory {} is not writable: {e}",
            out_dir.display()
        )
    })?;
    let _ = fs::remove_file(&probe);
    Ok(())
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), String> {
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|e| format!("encoding {}: {e}", path.display()))?;
    text.push('\n');
    fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Every benchmark result in `dir`: each `*.json` file that parses as a [`BenchResult`], in file
/// name order (other JSON files are skipped). When there is none, the `results` of
/// `summary.json`, if that exists.
pub fn load_results(dir: &Path) -> Vec<BenchResult> {
    let mut files: Vec<PathBuf> = match fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "json") && p.is_file())
            .filter(|p| p.file_name().is_some_and(|n| n != "summary.json"))
            .collect(),
        Err(_) => return Vec::new(),
    };
    files.sort();
    let results: Vec<BenchResult> = files
        .iter()
        .filter_map(|p| fs::read_to_string(p).ok())
        .filter_map(|text| serde_json::from_str(&text).ok())
        .collect();
    if !results.is_empty() {
        return results;
    }
    fs::read_to_string(dir.join("summary.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<Summary>(&text).ok())
        .map(|s| s.results)
        .unwrap_or_default()
}

const MIB: f64 = 1024.0 * 1024.0;

fn goodput_mib(r: &BenchResult) -> f64 {
    r.goodput_bytes_per_sec / MIB
}

/// CPU time of the node processes per successful operation, seconds (`None` without operations).
pub fn cpu_seconds_per_op(r: &BenchResult) -> Option<f64> {
    (r.ops.all > 0).then(|| r.cpu_seconds.total / r.ops.all as f64)
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

/// A readable fixed-width table of results, one row each: mode, key parameters (value size,
/// GET %, distribution, background processes, offered load, cd's optimisations F=filter bits
/// C=cache P=previous versions M=multi-read), ops/s, goodput MiB/s, GET and PUT p50/p99 latency µs,
/// CPU µs per operation and failed operations.
pub fn summary_table(results: &[BenchResult]) -> String {
    let header = [
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
    let lat = |ops: u64, v: f64| {
        if ops > 0 {
            format!("{v:.1}")
        } else {
            "-".into()
        }
    };
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let p = &r.params;
            vec![
                r.mode.clone(),
                plot::format_bytes(f64::from(p.value_size)),
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
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let text_columns = [0, 1, 3, 5, 6];
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if text_columns.contains(&i) {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        parts.join("  ").trim_end().to_string()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    out.push('\n');
    for row in rows {
        out.push_str(&line(row));
        out.push('\n');
    }
    out
}

/// Results of a preset grouped for plotting: group → series → x → values (repeated runs of one
/// point are averaged).
type Grouped<'r> = BTreeMap<String, BTreeMap<String, BTreeMap<OrdF64, Vec<&'r BenchResult>>>>;

#[derive(Clone, Copy, Debug)]
struct OrdF64(f64);
impl PartialEq for OrdF64 {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

fn group_results(preset: Preset, results: &[BenchResult]) -> Grouped<'_> {
    let mut grouped: Grouped<'_> = BTreeMap::new();
    for r in results {
        if let Some(point) = classify(preset, &r.params) {
            grouped
                .entry(point.group)
                .or_default()
                .entry(point.series)
                .or_default()
                .entry(OrdF64(point.x))
                .or_default()
                .push(r);
        }
    }
    grouped
}

/// Mean of `metric` over the runs of one point (`None` when no run has the metric).
fn mean(runs: &[&BenchResult], metric: &dyn Fn(&BenchResult) -> Option<f64>) -> Option<f64> {
    let values: Vec<f64> = runs
        .iter()
        .filter_map(|r| metric(r))
        .filter(|v| v.is_finite())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Series of one group, ordered cd, sd, hy, then others.
fn series_of(
    group: &BTreeMap<String, BTreeMap<OrdF64, Vec<&BenchResult>>>,
    metric: &dyn Fn(&BenchResult) -> Option<f64>,
) -> Vec<Series> {
    let mut names: Vec<&String> = group.keys().collect();
    names.sort_by_key(|n| {
        (
            MODES_ALL
                .iter()
                .position(|m| m == n)
                .unwrap_or(MODES_ALL.len()),
            n.to_string(),
        )
    });
    names
        .into_iter()
        .map(|name| Series {
            name: name.clone(),
            points: group[name]
                .iter()
                .filter_map(|(x, runs)| mean(runs, metric).map(|y| (x.0, y)))
                .collect(),
        })
        .collect()
}

/// Parameter values shared by the results (or their range), for figure subtitles.
fn describe_setup(results: &[&BenchResult]) -> String {
    fn distinct<T: PartialEq + Clone>(values: impl Iterator<Item = T>) -> Vec<T> {
        let mut out: Vec<T> = Vec::new();
        for v in values {
            if !out.contains(&v) {
                out.push(v);
            }
        }
        out
    }
    fn one_or_mixed<T: fmt::Display + PartialEq + Clone>(values: Vec<T>) -> String {
        match values.as_slice() {
            [one] => one.to_string(),
            _ => values
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("/"),
        }
    }
    let nodes = one_or_mixed(distinct(results.iter().map(|r| r.params.nodes)));
    let clients = one_or_mixed(distinct(results.iter().map(|r| r.params.client_threads)));
    let servers = one_or_mixed(distinct(
        results
            .iter()
            .filter(|r| r.params.mode != "cd")
            .map(|r| r.params.server_threads),
    ));
    let transport = one_or_mixed(distinct(results.iter().map(|r| r.params.transport.clone())));
    let duration = one_or_mixed(distinct(
        results
            .iter()
            .map(|r| plot::format_number(r.params.duration)),
    ));
    let warmup = one_or_mixed(distinct(
        results.iter().map(|r| plot::format_number(r.params.warmup)),
    ));
    let mut s = format!("{nodes} nodes × {clients} client threads");
    if !servers.is_empty() {
        let noun = if servers == "1" { "thread" } else { "threads" };
        s.push_str(&format!(" (+{servers} server {noun} for sd/hy)"));
    }
    s.push_str(&format!(
        ", {transport}, {duration} s runs after {warmup} s warm-up"
    ));
    s
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
) -> Result<Vec<PathBuf>, String> {
    let mine: Vec<&BenchResult> = results
        .iter()
        .filter(|r| classify(preset, &r.params).is_some())
        .collect();
    if mine.is_empty() {
        return Err(format!(
            "none of the {} results is a run of the {preset} preset",
            results.len()
        ));
    }
    fs::create_dir_all(out_dir).map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    let grouped = group_results(preset, results);
    let setup = describe_setup(&mine);
    let mut written = Vec::new();
    let goodput = |r: &BenchResult| Some(goodput_mib(r));
    match preset {
        Preset::Contention | Preset::Quick => {
            let size = if preset == Preset::Quick {
                QUICK_VALUE
            } else {
                MEDIUM_VALUE
            };
            let group = &grouped[""];
            let absolute = series_of(group, &goodput);
            let relative: Vec<Series> = absolute
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
                .collect();
            let mut p1 =
                LinePanel::new("Goodput", "background CPU-hog processes", "goodput (MiB/s)");
            p1.x_format = XFormat::Integer;
            p1.series = absolute;
            let mut p2 = LinePanel::new(
                "Goodput relative to no contention",
                "background CPU-hog processes",
                "% of goodput at 0",
            );
            p2.x_format = XFormat::Integer;
            p2.series = relative;
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
                    panel_size: (760, 520),
                },
            )?;
            written.push(path);
        }
        Preset::Values => {
            let mut panels = Vec::new();
            for (name, group) in &grouped {
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
                    panel_size: (760, 520),
                },
            )?;
            written.push(path);

            let mut relative_panels = Vec::new();
            for other in ["sd", "hy"] {
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
                if !panel.series.is_empty() || other == "sd" {
                    relative_panels.push(panel);
                }
            }
            let path = out_dir.join("values-relative.png");
            plot::line_figure(
                &path,
                &LineFigure {
                    title: "Nessie values sweep: client-driven goodput relative to the baselines"
                        .into(),
                    subtitle: format!("above 1: cd is faster · {setup}"),
                    columns: relative_panels.len(),
                    panels: relative_panels,
                    panel_size: (760, 520),
                },
            )?;
            written.push(path);
        }
        Preset::Energy => {
            let group = &grouped[""];
            let mut cpu = LinePanel::new(
                "CPU time per operation",
                "offered load (% of max)",
                "CPU µs per operation",
            );
            cpu.x_format = XFormat::Percent;
            cpu.y_log = true;
            cpu.series = series_of(group, &|r| cpu_seconds_per_op(r).map(|s| s * 1e6));
            let mut cores = LinePanel::new(
                "Average busy cores",
                "offered load (% of max)",
                "busy cores (CPU s / s)",
            );
            cores.x_format = XFormat::Percent;
            cores.series = series_of(group, &busy_cores);
            let mut tput = LinePanel::new(
                "Achieved throughput",
                "offered load (% of max)",
                "operations per second",
            );
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
                    panel_size: (620, 500),
                },
            )?;
            written.push(path);
        }
        Preset::Optimizations => {
            let bar_names: Vec<String> =
                OPTIMIZATION_STEPS.iter().map(|s| s.0.to_string()).collect();
            let mut groups: Vec<(&String, _)> = grouped.iter().collect();
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
                                let runs: Vec<&BenchResult> =
                                    points.values().flatten().copied().collect();
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
                    title: "Nessie optimizations sweep: goodput as cd's optimizations are added one by one".into(),
                    subtitle: format!("Zipf 0.99 keys, 16 KiB values, closed loop · {setup}"),
                    y_label: "goodput (MiB/s)".into(),
                    bar_names,
                    groups,
                    size: (1100, 560),
                },
            )?;
            written.push(path);
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nessie_bench::result::{CpuSeconds, FabricSummary, LatencySummary, PerKind};

    fn test_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nessie-sweep-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn cleanup(dir: &Path) {
        if std::env::var_os("NESSIE_KEEP_TEST_OUTPUT").is_none() {
            let _ = fs::remove_dir_all(dir);
        }
    }

    /// A synthetic but plausible result: client-driven scales with value size and resists CPU
    /// contention, server-driven polls (CPU at any load) and suffers from background processes.
    fn fake_result(p: &BenchParams) -> BenchResult {
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
            _ => {
                (f64::from(p.nodes) * f64::from(p.server_threads) + ops_per_sec * 8e-6) * p.duration
            }
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
            },
            errors: 0,
            offered_ops_per_sec: p.target_load.map(|l| closed * l),
        }
    }

    fn short_base() -> BenchParams {
        BenchParams {
            duration: 2.0,
            warmup: 0.5,
            ..BenchParams::default()
        }
    }

    #[test]
    fn preset_names_parse_and_print() {
        for p in Preset::ALL {
            assert_eq!(p.name().parse::<Preset>().unwrap(), p);
            assert_eq!(p.to_string(), p.name());
            assert!(!p.description().is_empty());
        }
        assert_eq!(" Values ".parse::<Preset>().unwrap(), Preset::Values);
        let err = "contentions".parse::<Preset>().unwrap_err();
        assert!(
            err.contains("contention, values, energy, optimizations, quick"),
            "{err}"
        );
    }

    #[test]
    fn contention_matrix() {
        let base = short_base();
        let runs = Preset::Contention.runs(&base);
        assert_eq!(runs.len(), 3 * 5);
        for mode in ["cd", "sd", "hy"] {
            let bgs: Vec<u16> = runs
                .iter()
                .filter(|r| r.params.mode == mode)
                .map(|r| r.params.background)
                .collect();
            assert_eq!(bgs, vec![0, 1, 2, 3, 4]);
        }
        for r in &runs {
            assert_eq!(r.params.value_size, 16384);
            assert_eq!(r.params.get_ratio, 0.9);
            assert_eq!(r.params.dist, "uniform");
            assert_eq!(r.params.target_load, None);
            assert_eq!((r.params.duration, r.params.warmup), (2.0, 0.5));
            assert_eq!(r.series, r.params.mode);
            assert_eq!(r.x, f64::from(r.params.background));
        }
        assert_eq!(runs[2].stem, "contention-cd-bg2");
        assert_eq!(
            Preset::Contention.runs_with_max_background(&base, 2).len(),
            9
        );
        assert_eq!(
            Preset::Contention.runs_with_max_background(&base, 0).len(),
            3
        );
    }

    #[test]
    fn values_matrix() {
        let runs = Preset::Values.runs(&short_base());
        assert_eq!(runs.len(), 6 * 3 * 3 + 6 * 2);
        let uniform: Vec<&RunSpec> = runs.iter().filter(|r| r.params.dist == "uniform").collect();
        assert_eq!(uniform.len(), 54);
        for mode in ["cd", "sd", "hy"] {
            for get in [0.5, 0.9, 0.99] {
                let sizes: Vec<u32> = uniform
                    .iter()
                    .filter(|r| r.params.mode == mode && r.params.get_ratio == get)
                    .map(|r| r.params.value_size)
                    .collect();
                assert_eq!(
                    sizes,
                    vec![256, 1024, 4096, 16384, 65536, 131072],
                    "{mode} {get}"
                );
            }
        }
        let zipf: Vec<&RunSpec> = runs
            .iter()
            .filter(|r| r.params.dist == "zipf:0.99")
            .collect();
        assert_eq!(zipf.len(), 12);
        assert!(zipf
            .iter()
            .all(|r| r.params.get_ratio == 0.9 && r.params.mode != "hy"));
        assert!(runs
            .iter()
            .all(|r| r.params.background == 0 && r.params.target_load.is_none()));
        assert!(runs.iter().any(|r| r.stem == "values-hy-get99-256b"));
        assert!(runs.iter().any(|r| r.stem == "values-zipf-sd-get90-128k"));
        assert!(runs
            .iter()
            .any(|r| r.group == "uniform, 50% GET" && r.x == 65536.0 && r.x_label == "64 KiB"));
    }

    #[test]
    fn energy_matrix() {
        let runs = Preset::Energy.runs(&short_base());
        assert_eq!(runs.len(), 2 * 6);
        for mode in ["cd", "sd"] {
            let loads: Vec<Option<f64>> = runs
                .iter()
                .filter(|r| r.params.mode == mode)
                .map(|r| r.params.target_load)
                .collect();
            assert_eq!(
                loads,
                vec![Some(0.05), Some(0.2), Some(0.4), Some(0.6), Some(0.8), None]
            );
        }
        assert!(runs
            .iter()
            .all(|r| r.params.value_size == 16384 && r.params.get_ratio == 0.9));
        let xs: Vec<f64> = runs.iter().take(6).map(|r| r.x).collect();
        assert_eq!(xs, vec![5.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert_eq!(runs[5].stem, "energy-cd-load100");
    }

    #[test]
    fn optimizations_matrix() {
        // The switches come from the preset, whatever the base says.
        let base = BenchParams {
            filter_bits: false,
            multi_read: false,
            ..short_base()
        };
        let runs = Preset::Optimizations.runs(&base);
        assert_eq!(runs.len(), 2 * 5);
        for get in [0.5, 0.99] {
            let steps: Vec<[bool; 4]> = runs
                .iter()
                .filter(|r| r.params.get_ratio == get)
                .map(|r| {
                    [
                        r.params.filter_bits,
                        r.params.cache,
                        r.params.previous_versions,
                        r.params.multi_read,
                    ]
                })
                .collect();
            assert_eq!(
                steps,
                vec![
                    [false, false, false, false],
                    [true, false, false, false],
                    [true, true, false, false],
                    [true, true, true, false],
                    [true, true, true, true],
                ]
            );
        }
        assert!(runs.iter().all(|r| r.params.mode == "cd"
            && r.params.dist == "zipf:0.99"
            && r.params.value_size == 16384));
        assert_eq!(runs[0].stem, "optimizations-get50-basic");
        assert_eq!(runs[9].series, "+multi-read");
        assert_eq!(runs[9].group, "99% GET");
    }

    #[test]
    fn quick_matrix_is_short() {
        let base = BenchParams {
            duration: 30.0,
            warmup: 5.0,
            ..BenchParams::default()
        };
        let runs = Preset::Quick.runs(&base);
        let stems: Vec<&str> = runs.iter().map(|r| r.stem.as_str()).collect();
        assert_eq!(
            stems,
            vec![
                "quick-cd-bg0",
                "quick-cd-bg1",
                "quick-sd-bg0",
                "quick-sd-bg1"
            ]
        );
        let budget: f64 = runs
            .iter()
            .map(|r| r.params.duration + r.params.warmup)
            .sum();
        assert!(budget <= 16.0, "{budget}");
        // Shorter base durations are kept.
        assert!(Preset::Quick
            .runs(&short_base())
            .iter()
            .all(|r| r.params.duration == 2.0));
    }

    #[test]
    fn stems_unique_and_classification_consistent() {
        let base = BenchParams::default();
        for preset in Preset::ALL {
            let runs = preset.runs(&base);
            let mut stems: Vec<&str> = runs.iter().map(|r| r.stem.as_str()).collect();
            stems.sort();
            stems.dedup();
            assert_eq!(stems.len(), runs.len(), "{preset}: duplicate stems");
            let mut points: Vec<(String, String, u64)> = runs
                .iter()
                .map(|r| (r.group.clone(), r.series.clone(), r.x.to_bits()))
                .collect();
            points.sort();
            points.dedup();
            assert_eq!(
                points.len(),
                runs.len(),
                "{preset}: two runs plot at the same point"
            );
            for r in &runs {
                assert!(r.stem.starts_with(preset.name()), "{}", r.stem);
                let point = classify(preset, &r.params).unwrap();
                assert_eq!(
                    (point.group.as_str(), point.series.as_str(), point.x),
                    (r.group.as_str(), r.series.as_str(), r.x)
                );
            }
        }
    }

    fn assert_png(path: &Path) {
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

    #[test]
    fn run_preset_writes_results_summary_and_plots() {
        let expected_plots: [(Preset, &[&str]); 5] = [
            (Preset::Contention, &["contention.png"]),
            (
                Preset::Values,
                &["values-goodput.png", "values-relative.png"],
            ),
            (Preset::Energy, &["energy.png"]),
            (Preset::Optimizations, &["optimizations.png"]),
            (Preset::Quick, &["quick.png"]),
        ];
        for (preset, plots) in expected_plots {
            let dir = test_dir(&format!("all-{preset}"));
            let base = short_base();
            let mut seen = Vec::new();
            let mut calls = 0;
            let outcome = run_preset(
                preset,
                &base,
                &dir,
                &mut |p| {
                    calls += 1;
                    Ok(fake_result(p))
                },
                &mut |i, n, spec| seen.push((i, n, spec.stem.clone())),
            )
            .unwrap();
            let specs = preset.runs(&base);
            assert_eq!(calls, specs.len());
            assert_eq!(seen.len(), specs.len());
            assert_eq!(seen[0].0, 1);
            assert_eq!(seen.last().unwrap().0, specs.len());
            assert!(outcome.failures.is_empty());
            assert_eq!(outcome.plot_error, None);
            assert_eq!(outcome.results.len(), specs.len());
            for spec in &specs {
                let path = dir.join(format!("{}.json", spec.stem));
                let back: BenchResult =
                    serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
                assert_eq!(back.params, spec.params);
                assert!(outcome.files.contains(&path));
            }
            let summary: Summary =
                serde_json::from_str(&fs::read_to_string(dir.join("summary.json")).unwrap())
                    .unwrap();
            assert_eq!(summary.preset, preset.name());
            assert_eq!(summary.runs.len(), specs.len());
            assert_eq!(summary.results.len(), specs.len());
            assert_eq!(
                summary.plots,
                plots.iter().map(|p| p.to_string()).collect::<Vec<_>>()
            );
            assert!(
                fs::read_to_string(dir.join("summary.txt"))
                    .unwrap()
                    .lines()
                    .count()
                    == specs.len() + 2
            );
            for plot in plots {
                let path = dir.join(plot);
                assert!(outcome.plots.contains(&path));
                assert_png(&path);
            }
            cleanup(&dir);
        }
    }

    #[test]
    fn failing_runs_are_recorded_and_the_sweep_continues() {
        let dir = test_dir("failing");
        fs::create_dir_all(&dir).unwrap();
        // A stale result of an earlier sweep under a failing run's name goes away.
        fs::write(dir.join("quick-cd-bg1.json"), "{}").unwrap();
        let mut calls = 0;
        let outcome = run_preset(
            Preset::Quick,
            &short_base(),
            &dir,
            &mut |p| {
                calls += 1;
                match (p.mode.as_str(), p.background) {
                    ("cd", 1) => Err("cluster failed to start: node 2 exited".into()),
                    ("sd", 0) => panic!("runner bug"),
                    _ => Ok(fake_result(p)),
                }
            },
            &mut |_, _, _| {},
        )
        .unwrap();
        assert_eq!(calls, 4);
        assert_eq!(outcome.results.len(), 2);
        let failed: Vec<(&str, &str)> = outcome
            .failures
            .iter()
            .map(|f| (f.stem.as_str(), f.error.as_str()))
            .collect();
        assert_eq!(
            failed,
            vec![
                ("quick-cd-bg1", "cluster failed to start: node 2 exited"),
                ("quick-sd-bg0", "the runner panicked: runner bug"),
            ]
        );
        assert!(!dir.join("quick-cd-bg1.json").exists());
        assert!(dir.join("quick-sd-bg1.json").exists());
        let summary: Summary =
            serde_json::from_str(&fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
        assert_eq!(summary.failures.len(), 2);
        let errors: Vec<Option<&str>> = summary.runs.iter().map(|r| r.error.as_deref()).collect();
        assert_eq!(
            errors,
            vec![
                None,
                Some("cluster failed to start: node 2 exited"),
                Some("the runner panicked: runner bug"),
                None
            ]
        );
        assert_eq!(summary.runs[1].file, None);
        assert_eq!(summary.runs[0].file.as_deref(), Some("quick-cd-bg0.json"));
        assert_png(&dir.join("quick.png"));
        cleanup(&dir);
    }

    #[test]
    fn all_runs_failing_is_an_error_with_a_summary() {
        let dir = test_dir("allfail");
        let err = run_preset(
            Preset::Quick,
            &short_base(),
            &dir,
            &mut |_| Err("no cluster".into()),
            &mut |_, _, _| {},
        )
        .unwrap_err();
        assert!(
            err.contains("all 4 runs failed") && err.contains("no cluster"),
            "{err}"
        );
        let summary: Summary =
            serde_json::from_str(&fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
        assert_eq!(summary.failures.len(), 4);
        assert!(summary.results.is_empty());
        cleanup(&dir);
    }

    #[test]
    fn unusable_out_dir_is_a_clear_error() {
        let dir = test_dir("notadir");
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("plain-file");
        fs::write(&file, "x").unwrap();
        let mut called = false;
        let err = run_preset(
            Preset::Quick,
            &short_base(),
            &file,
            &mut |p| {
                called = true;
                Ok(fake_result(p))
            },
            &mut |_, _, _| {},
        )
        .unwrap_err();
        assert!(
            err.contains("not a directory") && err.contains("plain-file"),
            "{err}"
        );
        let err = run_preset(
            Preset::Quick,
            &short_base(),
            &file.join("sub"),
            &mut |p| Ok(fake_result(p)),
            &mut |_, _, _| {},
        )
        .unwrap_err();
        assert!(err.contains("cannot create output directory"), "{err}");
        assert!(
            !called,
            "no run may start before the output directory is known to be usable"
        );
        cleanup(&dir);
    }

    #[test]
    fn load_results_round_trips_and_re_renders() {
        let dir = test_dir("reload");
        let outcome = run_preset(
            Preset::Energy,
            &short_base(),
            &dir,
            &mut |p| Ok(fake_result(p)),
            &mut |_, _, _| {},
        )
        .unwrap();
        let mut loaded = load_results(&dir);
        let mut original: Vec<BenchResult> =
            outcome.results.iter().map(|(_, r)| r.clone()).collect();
        let key = |r: &BenchResult| (r.mode.clone(), r.params.target_load.map(f64::to_bits));
        loaded.sort_by_key(key);
        original.sort_by_key(key);
        assert_eq!(loaded, original);

        // Without per-run files the summary is used.
        let only_summary = test_dir("reload-summary");
        fs::create_dir_all(&only_summary).unwrap();
        fs::copy(dir.join("summary.json"), only_summary.join("summary.json")).unwrap();
        assert_eq!(load_results(&only_summary).len(), original.len());
        assert!(load_results(&dir.join("missing")).is_empty());

        let replot = dir.join("replot");
        let plots = render(Preset::Energy, &loaded, &replot).unwrap();
        assert_eq!(plots, vec![replot.join("energy.png")]);
        assert_png(&plots[0]);
        // Energy runs are uniform: none is a run of the (Zipf) optimizations preset.
        let err = render(Preset::Optimizations, &loaded, &replot).unwrap_err();
        assert!(err.contains("optimizations"), "{err}");
        cleanup(&dir);
        cleanup(&only_summary);
    }

    #[test]
    fn summary_table_lists_every_result() {
        let mut results: Vec<BenchResult> = Preset::Optimizations
            .runs(&short_base())
            .iter()
            .map(|s| fake_result(&s.params))
            .collect();
        results[0].params.get_ratio = 1.0;
        results[0].ops.put = 0;
        let table = summary_table(&results);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), results.len() + 2);
        for h in [
            "mode",
            "ops/s",
            "MiB/s",
            "GET p50",
            "GET p99",
            "PUT p50",
            "PUT p99",
            "cpu us/op",
        ] {
            assert!(lines[0].contains(h), "{h}");
        }
        assert!(lines[2].starts_with("cd"));
        assert!(
            lines[2].contains("----")
                && lines[2].contains("zipf:0.99")
                && lines[2].contains("16 KiB")
        );
        assert!(lines.last().unwrap().contains("FCPM"));
        // A run without PUTs shows no PUT latency.
        assert!(
            lines[2].split_whitespace().filter(|c| *c == "-").count() >= 2,
            "{}",
            lines[2]
        );
        assert!(summary_table(&[]).lines().count() == 2);
    }
}
