//! Preset matrices: what runs each preset expands into, and how runs are classified back.

mod common;
use common::short_base;

use nessie_bench::result::BenchParams;
use nessie_report::preset::*;

#[test]
fn preset_names_parse_and_print() {
    for p in Preset::ALL {
        assert_eq!(p.name().parse::<Preset>().unwrap(), p);
        assert_eq!(p.to_string(), p.name());
        assert!(!p.description().is_empty());
    }
    assert_eq!(" Values ".parse::<Preset>().unwrap(), Preset::Values);
    let err = "contentions".parse::<Preset>().unwrap_err();
    assert_eq!(err.name, "contentions");
    let err = err.to_string();
    assert!(
        err.contains("contention, values, energy, optimizations, quick"),
        "{err}"
    );
}

#[test]
fn contention_matrix() {
    let base = short_base();
    let runs = Preset::Contention.runs(&base);
    assert_eq!(runs.len(), 4 * 5);
    for mode in ["cd", "sd", "hy", "pilaf"] {
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
        12
    );
    assert_eq!(
        Preset::Contention.runs_with_max_background(&base, 0).len(),
        4
    );
}

#[test]
fn values_matrix() {
    let runs = Preset::Values.runs(&short_base());
    assert_eq!(runs.len(), 6 * 3 * 4 + 6 * 2);
    let uniform: Vec<&RunSpec> = runs.iter().filter(|r| r.params.dist == "uniform").collect();
    assert_eq!(uniform.len(), 72);
    for mode in ["cd", "sd", "hy", "pilaf"] {
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
    for preset in Preset::ALL.into_iter().chain(Preset::SIM) {
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

/// CPU per operation counts the store's work, not the open-loop clients' waits for arrivals.
#[test]
fn cpu_per_op_leaves_out_the_open_loop_wait() {
    let mut p = short_base();
    p.target_load = Some(0.2);
    let mut r = common::fake_result(&p);
    let whole = nessie_report::summary::cpu_seconds_per_op(&r).unwrap();
    r.cpu_seconds.pacing = r.cpu_seconds.total / 4.0;
    let store = nessie_report::summary::cpu_seconds_per_op(&r).unwrap();
    assert!((store - whole * 0.75).abs() < 1e-12, "{store} vs {whole}");
}

/// The simulator's presets: the paper's sizes, modes, worker split and switches; bench and
/// sim presets are told apart.
#[test]
fn paper_matrices() {
    use nessie_report::paper::*;
    let base = BenchParams {
        client_threads: PAPER_WORKERS,
        ..BenchParams::default()
    };
    for preset in Preset::SIM {
        assert!(preset.is_sim());
        assert_eq!(preset.name().parse::<Preset>().unwrap(), preset);
    }
    assert!(Preset::ALL.iter().all(|p| !p.is_sim()));
    for (preset, dist) in [(Preset::PaperValues, "uniform"), (Preset::PaperZipf, ZIPF)] {
        let runs = preset.runs(&base);
        assert_eq!(runs.len(), PAPER_MODES.len() * PAPER_VALUE_SIZES.len());
        for r in &runs {
            let p = &r.params;
            assert_eq!((p.dist.as_str(), p.get_ratio), (dist, PAPER_GET_RATIO));
            assert!(PAPER_VALUE_SIZES.contains(&p.value_size));
            assert!(p.filter_bits && p.cache && p.previous_versions && p.multi_read);
            let servers = paper_server_threads(&p.mode, p.value_size, p.get_ratio);
            if p.mode == "cd" {
                assert_eq!(p.client_threads, PAPER_WORKERS);
            } else {
                assert_eq!(
                    p.client_threads + p.server_threads,
                    PAPER_WORKERS,
                    "{}",
                    r.stem
                );
                assert_eq!(p.server_threads, servers);
            }
        }
        // The other distribution is not a run of this preset.
        let mut other = runs[0].params.clone();
        other.dist = if dist == "uniform" {
            ZIPF.into()
        } else {
            "uniform".into()
        };
        assert!(classify(preset, &other).is_none());
    }
    // The paper's tuning (§4.6).
    assert_eq!(paper_server_threads("sd", 512, 0.5), 3);
    assert_eq!(paper_server_threads("sd", 2048, 0.5), 2);
    assert_eq!(paper_server_threads("hy", 32768, 0.5), 3);
    assert_eq!(paper_server_threads("hy", 65536, 0.5), 2);
    assert_eq!(paper_server_threads("hy", 65536, 0.9), 1);
    let opt = Preset::PaperOptimizations.runs(&base);
    assert_eq!(
        opt.len(),
        OPTIMIZATION_STEPS.len() * PAPER_OPTIMIZATION_SIZES.len()
    );
    assert!(opt
        .iter()
        .all(|r| r.params.mode == "cd" && r.params.dist == ZIPF));
    let basic = opt.iter().filter(|r| r.series == "basic").count();
    assert_eq!(basic, PAPER_OPTIMIZATION_SIZES.len());
    let contention = Preset::PaperContention.runs(&base);
    assert_eq!(contention.len(), PAPER_MODES.len() * PAPER_BACKGROUND.len());
    for r in &contention {
        assert_eq!(r.params.value_size, PAPER_CONTENTION_VALUE);
        assert_eq!(r.x, f64::from(r.params.background));
        // A contention run is no run of paper-values, and background load is no value run.
        assert!(classify(Preset::PaperValues, &r.params).is_none() || r.params.background == 0);
    }
}
