//! Running a sweep: every run of a preset through a caller-supplied runner, each result saved
//! as `<stem>.json`, then `summary.json`, `summary.txt` (and `table.md` for the simulator's
//! presets) and the preset's figures.
//!
//! The runner is a parameter (`FnMut(&BenchParams) -> Result<BenchResult, RunError>`), so the
//! sweep is testable without a cluster; the CLI passes the real single-run runner.

use std::fs;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use nessie_bench::result::{BenchParams, BenchResult};

use crate::figures::render;
use crate::preset::{Preset, RunSpec};
use crate::summary::summary_table;

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

/// Why a sweep produced nothing usable (a failed run alone is recorded, not an error).
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("sweep {preset}: no runs to do")]
    NoRuns { preset: Preset },
    #[error("output directory {} exists and is not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error("cannot create output directory {}: {err}", dir.display())]
    CreateDir { dir: PathBuf, err: io::Error },
    #[error("output directory {} is not writable: {err}", dir.display())]
    NotWritable { dir: PathBuf, err: io::Error },
    /// `summary.json` could not be written.
    #[error("sweep {preset}: {err}")]
    Summary { preset: Preset, err: JsonFileError },
    /// Every run failed; `summary.json` at `summary` holds their errors.
    #[error(
        "sweep {preset}: all {total} runs failed (first: {first}); errors are in {}",
        summary.display()
    )]
    AllFailed {
        preset: Preset,
        total: usize,
        /// `stem: error` of the first failed run.
        first: String,
        summary: PathBuf,
    },
}

/// Why a JSON file (a run's result or `summary.json`) could not be written.
#[derive(Debug, thiserror::Error)]
pub enum JsonFileError {
    #[error("encoding {}: {err}", path.display())]
    Encode {
        path: PathBuf,
        err: serde_json::Error,
    },
    #[error("writing {}: {err}", path.display())]
    Write { path: PathBuf, err: io::Error },
}

/// The single-run benchmark: parameters in, result (or the runner's error) out. A failed run's
/// error is recorded by its message in `summary.json` and the sweep goes on.
pub type Runner<'a> = dyn FnMut(&BenchParams) -> Result<BenchResult, RunError> + 'a;
/// Why one run failed, whatever the runner's own error type.
pub type RunError = Box<dyn std::error::Error + Send + Sync>;
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
) -> Result<SweepOutcome, SweepError> {
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
) -> Result<SweepOutcome, SweepError> {
    if specs.is_empty() {
        return Err(SweepError::NoRuns { preset });
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
        runs.push(run_one(spec, out_dir, runner, &mut outcome));
    }
    finish(base, runs, outcome)
}

/// Runs one spec, saves its result and records it (or its failure) in `outcome`; returns its
/// entry of `summary.json`.
fn run_one(
    spec: RunSpec,
    out_dir: &Path,
    runner: &mut Runner<'_>,
    outcome: &mut SweepOutcome,
) -> SummaryRun {
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
        Err(panic) => Err(format!("the runner panicked: {}", panic_message(&panic)).into()),
    };
    let saved = match &result {
        Ok(result) => write_json(&path, result)
            .map_err(|e| format!("the run succeeded but its result was not saved: {e}")),
        Err(error) => {
            // A result left by an earlier sweep under this name would now be misleading.
            if path.exists() {
                let _ = fs::remove_file(&path);
            }
            Err(error.to_string())
        }
    };
    match saved {
        Ok(()) => {
            entry.file = Some(file_name(&path));
            outcome.files.push(path);
        }
        Err(error) => {
            entry.error = Some(error.clone());
            outcome.failures.push(RunFailure {
                stem: spec.stem.clone(),
                params: spec.params.clone(),
                error,
            });
        }
    }
    if let Ok(result) = result {
        outcome.results.push((spec, result));
    }
    entry
}

/// Writes `summary.json`, `summary.txt` and the figures once every run is done.
fn finish(
    base: &BenchParams,
    runs: Vec<SummaryRun>,
    mut outcome: SweepOutcome,
) -> Result<SweepOutcome, SweepError> {
    let (preset, out_dir) = (outcome.preset, outcome.out_dir.clone());
    let total = runs.len();
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
    write_summary(preset, &summary_path, &summary)?;
    outcome.files.push(summary_path.clone());

    if results.is_empty() {
        let first = outcome
            .failures
            .first()
            .map(|f| format!("{}: {}", f.stem, f.error))
            .unwrap_or_default();
        return Err(SweepError::AllFailed {
            preset,
            total,
            first,
            summary: summary_path,
        });
    }

    let table_path = out_dir.join("summary.txt");
    match fs::write(&table_path, summary_table(&results)) {
        Ok(()) => outcome.files.push(table_path),
        Err(e) => tracing::warn!("writing {}: {e}", table_path.display()),
    }

    if preset.is_sim() {
        let path = out_dir.join("table.md");
        match fs::write(&path, crate::paper::paper_table(preset, &results)) {
            Ok(()) => outcome.files.push(path),
            Err(e) => tracing::warn!("writing {}: {e}", path.display()),
        }
    }

    let rendered = match catch_unwind(AssertUnwindSafe(|| render(preset, &results, &out_dir))) {
        Ok(rendered) => rendered.map_err(|e| e.to_string()),
        Err(panic) => Err(format!("drawing panicked: {}", panic_message(&panic))),
    };
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
    write_summary(preset, &summary_path, &summary)?;
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
fn prepare_out_dir(out_dir: &Path) -> Result<(), SweepError> {
    let dir = || out_dir.to_path_buf();
    if out_dir.exists() && !out_dir.is_dir() {
        return Err(SweepError::NotADirectory(dir()));
    }
    fs::create_dir_all(out_dir).map_err(|err| SweepError::CreateDir { dir: dir(), err })?;
    let probe = out_dir.join(format!(".nessie-sweep-write-test-{}", std::process::id()));
    fs::write(&probe, b"ok").map_err(|err| SweepError::NotWritable { dir: dir(), err })?;
    let _ = fs::remove_file(&probe);
    Ok(())
}

/// Writes `summary.json`; a sweep without it has failed.
fn write_summary(preset: Preset, path: &Path, summary: &Summary) -> Result<(), SweepError> {
    write_json(path, summary).map_err(|err| SweepError::Summary { preset, err })
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), JsonFileError> {
    let path_buf = || path.to_path_buf();
    let mut text = serde_json::to_string_pretty(value).map_err(|err| JsonFileError::Encode {
        path: path_buf(),
        err,
    })?;
    text.push('\n');
    fs::write(path, text).map_err(|err| JsonFileError::Write {
        path: path_buf(),
        err,
    })
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
