//! Whole sweeps through a synthetic runner: results, summary and figures written, failures
//! recorded, results reloaded and re-rendered, the summary table.

mod common;
use common::{assert_png, cleanup, fake_result, short_base, test_dir};

use std::fs;

use nessie_bench::result::BenchResult;
use nessie_report::preset::*;
use nessie_report::sweep::*;
use nessie_report::{render, summary_table, RenderError};

/// The figures each preset draws.
const EXPECTED_PLOTS: [(Preset, &[&str]); 9] = [
    (Preset::Contention, &["contention.png"]),
    (
        Preset::Values,
        &["values-goodput.png", "values-relative.png"],
    ),
    (Preset::Energy, &["energy.png"]),
    (Preset::Optimizations, &["optimizations.png"]),
    (Preset::Quick, &["quick.png"]),
    (Preset::PaperValues, &["paper-values.png"]),
    (Preset::PaperZipf, &["paper-zipf.png"]),
    (Preset::PaperOptimizations, &["paper-optimizations.png"]),
    (Preset::PaperContention, &["paper-contention.png"]),
];

/// The simulator's presets also write their table: a header, a rule, a row per run.
fn assert_table(preset: Preset, dir: &std::path::Path, runs: usize) {
    let table = fs::read_to_string(dir.join("table.md"));
    if !preset.is_sim() {
        assert!(table.is_err(), "{preset} wrote a table");
        return;
    }
    let table = table.unwrap();
    assert_eq!(table.lines().count(), runs + 2, "{table}");
    let x = if preset == Preset::PaperContention {
        "| background |"
    } else {
        "| value |"
    };
    assert!(table.starts_with(x), "{table}");
}

#[test]
fn run_preset_writes_results_summary_and_plots() {
    for (preset, plots) in EXPECTED_PLOTS {
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
            serde_json::from_str(&fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
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
        assert_table(preset, &dir, specs.len());
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
        matches!(err, SweepError::AllFailed { total: 4, .. }),
        "{err:?}"
    );
    let err = err.to_string();
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
    assert!(matches!(err, SweepError::NotADirectory(_)), "{err:?}");
    let err = err.to_string();
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
    assert!(matches!(err, SweepError::CreateDir { .. }), "{err:?}");
    let err = err.to_string();
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
    let mut original: Vec<BenchResult> = outcome.results.iter().map(|(_, r)| r.clone()).collect();
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
    assert!(matches!(err, RenderError::NoRuns { .. }), "{err:?}");
    let err = err.to_string();
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
        lines[2].contains("----") && lines[2].contains("zipf:0.99") && lines[2].contains("16 KiB")
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
