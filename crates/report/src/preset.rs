//! Named sweep presets mirroring the paper's evaluation (§4.6): each expands into a matrix of
//! benchmark runs ([`Preset::runs`]), and [`classify`] tells where a run is plotted from its
//! parameters alone, so figures can be redrawn from JSON results.
//!
//! Presets (laptop scale; every run takes its duration, warm-up, cluster shape, transport, key
//! size, seed and — outside `optimizations` — optimisation switches from the base parameters):
//!
//!
//! | preset          | runs | what varies                                                      |
//! |-----------------|------|------------------------------------------------------------------|
//! | `contention`    | 15   | background CPU hogs 0..=4 × cd/sd/hy; 16 KiB, 90 % GET, uniform  |
//! | `values`        | 66   | value size 256 B..128 KiB × 50/90/99 % GET × cd/sd/hy (uniform), and × cd/sd at Zipf 0.99, 90 % GET |
//! | `energy`        | 12   | offered load 5..100 % of the mode's maximum × cd/sd; 16 KiB, 90 % GET |
//! | `optimizations` | 10   | cd, Zipf 0.99, 16 KiB, 50/99 % GET: basic → +filter bits → +cache → +previous versions → +multi-read |
//! | `quick`         | 4    | cd/sd × 0/1 background process; 4 KiB, 90 % GET; runs capped at 3 s + 1 s warm-up |

use std::fmt;
use std::str::FromStr;

use nessie_bench::result::BenchParams;

use crate::{paper, plot};

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

pub(crate) const MODES_ALL: [&str; 4] = ["cd", "sd", "hy", "pilaf"];
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
    /// The simulator's (`nessie sim sweep`, [`crate::paper`]).
    PaperValues,
    PaperZipf,
    PaperOptimizations,
    PaperContention,
}

impl Preset {
    pub const ALL: [Preset; 5] = [
        Preset::Contention,
        Preset::Values,
        Preset::Energy,
        Preset::Optimizations,
        Preset::Quick,
    ];
    /// The presets of `nessie sim sweep`, run on the simulator.
    pub const SIM: [Preset; 4] = [
        Preset::PaperValues,
        Preset::PaperZipf,
        Preset::PaperOptimizations,
        Preset::PaperContention,
    ];

    /// Whether the preset runs on the simulator (`nessie sim sweep`) rather than on a local
    /// cluster (`nessie bench sweep`).
    pub fn is_sim(self) -> bool {
        Preset::SIM.contains(&self)
    }

    pub fn name(self) -> &'static str {
        match self {
            Preset::Contention => "contention",
            Preset::Values => "values",
            Preset::Energy => "energy",
            Preset::Optimizations => "optimizations",
            Preset::Quick => "quick",
            Preset::PaperValues => "paper-values",
            Preset::PaperZipf => "paper-zipf",
            Preset::PaperOptimizations => "paper-optimizations",
            Preset::PaperContention => "paper-contention",
        }
    }

    /// One line for `--help` and listings.
    pub fn description(self) -> &'static str {
        match self {
            Preset::Contention => {
                "goodput vs background CPU-hog processes 0..=4 (16 KiB, 90% GET, uniform; cd/sd/hy/pilaf)"
            }
            Preset::Values => {
                "goodput vs value size 256 B..128 KiB at 50/90/99% GET (cd/sd/hy/pilaf) and Zipf 0.99 (cd/sd)"
            }
            Preset::Energy => "CPU time per operation vs offered load 5..100% (16 KiB, 90% GET; cd/sd)",
            Preset::Optimizations => {
                "goodput as cd's optimisations are switched on one by one (Zipf 0.99, 16 KiB, 50/99% GET)"
            }
            Preset::Quick => "one-minute smoke sweep: cd/sd with 0 and 1 background process (4 KiB)",
            Preset::PaperValues => {
                "the paper's cluster: latency, goodput and bytes sent vs value size 2..128 KiB (50% GET, uniform; cd/sd/hy)"
            }
            Preset::PaperZipf => {
                "the paper's cluster: latency, goodput and bytes sent vs value size 2..128 KiB (50% GET, Zipf 0.99; cd/sd/hy)"
            }
            Preset::PaperOptimizations => {
                "the paper's cluster: cd's optimisations on one by one, 2..128 KiB (50% GET, Zipf 0.99)"
            }
            Preset::PaperContention => {
                "the paper's cluster: goodput and latency vs background processes per node 0..12 (16 KiB, 50% GET; cd/sd/hy)"
            }
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
        match self {
            Preset::Contention => contention_runs(base, max_background),
            Preset::Values => values_runs(base),
            Preset::Energy => energy_runs(base),
            Preset::Optimizations => optimization_runs(base),
            Preset::Quick => quick_runs(base),
            Preset::PaperValues => paper::values_runs(*self, base, "uniform"),
            Preset::PaperZipf => paper::values_runs(*self, base, ZIPF),
            Preset::PaperOptimizations => paper::optimization_runs(base),
            Preset::PaperContention => paper::contention_runs(base),
        }
    }
}

/// Every mode with 0..=`max_background` CPU hogs; 16 KiB, 90 % GET, uniform.
fn contention_runs(base: &BenchParams, max_background: u16) -> Vec<RunSpec> {
    let mut specs = Vec::new();
    for mode in MODES_ALL {
        for bg in 0..=max_background {
            let mut p = fixed(base, mode, MEDIUM_VALUE, 0.9, "uniform");
            p.background = bg;
            specs.push(spec(
                Preset::Contention,
                p,
                format!("contention-{mode}-bg{bg}"),
            ));
        }
    }
    specs
}

/// Every value size at every GET ratio for every mode (uniform), then cd and sd at Zipf 0.99.
fn values_runs(base: &BenchParams) -> Vec<RunSpec> {
    let mut specs = Vec::new();
    for mode in MODES_ALL {
        for get in VALUES_GET_RATIOS {
            for size in VALUE_SIZES {
                let p = fixed(base, mode, size, get, "uniform");
                let stem = format!("values-{mode}-get{}-{}", pct(get), size_stem(size));
                specs.push(spec(Preset::Values, p, stem));
            }
        }
    }
    for mode in MODES_CD_SD {
        for size in VALUE_SIZES {
            let p = fixed(base, mode, size, 0.9, ZIPF);
            let stem = format!("values-zipf-{mode}-get90-{}", size_stem(size));
            specs.push(spec(Preset::Values, p, stem));
        }
    }
    specs
}

/// cd and sd at each offered load, the closed loop last.
fn energy_runs(base: &BenchParams) -> Vec<RunSpec> {
    let mut specs = Vec::new();
    for mode in MODES_CD_SD {
        for load in ENERGY_LOADS {
            let mut p = fixed(base, mode, MEDIUM_VALUE, 0.9, "uniform");
            p.target_load = load;
            let stem = format!("energy-{mode}-load{}", pct(load.unwrap_or(1.0)));
            specs.push(spec(Preset::Energy, p, stem));
        }
    }
    specs
}

/// cd with its optimisations switched on one by one, at each GET ratio.
fn optimization_runs(base: &BenchParams) -> Vec<RunSpec> {
    let mut specs = Vec::new();
    for get in OPTIMIZATION_GET_RATIOS {
        for (_, part, [f, c, pv, m]) in OPTIMIZATION_STEPS {
            let mut p = fixed(base, "cd", MEDIUM_VALUE, get, ZIPF);
            (p.filter_bits, p.cache, p.previous_versions, p.multi_read) = (f, c, pv, m);
            let stem = format!("optimizations-get{}-{part}", pct(get));
            specs.push(spec(Preset::Optimizations, p, stem));
        }
    }
    specs
}

/// cd and sd with 0 and 1 background process, each run capped in length.
fn quick_runs(base: &BenchParams) -> Vec<RunSpec> {
    let mut specs = Vec::new();
    for mode in MODES_CD_SD {
        for bg in 0..=1 {
            let mut p = fixed(base, mode, QUICK_VALUE, 0.9, "uniform");
            p.background = bg;
            p.duration = p.duration.min(QUICK_MAX_DURATION);
            p.warmup = p.warmup.min(QUICK_MAX_WARMUP);
            specs.push(spec(Preset::Quick, p, format!("quick-{mode}-bg{bg}")));
        }
    }
    specs
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A preset name that is none of [`Preset::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown sweep preset `{name}` (expected one of: {})", preset_names())]
pub struct UnknownPreset {
    pub name: String,
}

fn preset_names() -> String {
    let names: Vec<&str> = Preset::ALL
        .iter()
        .chain(&Preset::SIM)
        .map(|p| p.name())
        .collect();
    names.join(", ")
}

impl FromStr for Preset {
    type Err = UnknownPreset;
    fn from_str(s: &str) -> Result<Self, UnknownPreset> {
        let wanted = s.trim().to_ascii_lowercase();
        Preset::ALL
            .into_iter()
            .chain(Preset::SIM)
            .find(|p| p.name() == wanted)
            .ok_or_else(|| UnknownPreset { name: s.into() })
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

pub(crate) fn spec(preset: Preset, params: BenchParams, stem: String) -> RunSpec {
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
    match preset {
        Preset::Contention => classify_background(MEDIUM_VALUE, p),
        Preset::Quick => classify_background(QUICK_VALUE, p),
        Preset::Values => classify_values(p),
        Preset::Energy => classify_energy(p),
        Preset::Optimizations => classify_optimizations(p),
        Preset::PaperValues
        | Preset::PaperZipf
        | Preset::PaperOptimizations
        | Preset::PaperContention => paper::classify(preset, p),
    }
}

/// `contention` and `quick`: x is the number of background processes, a line per mode.
fn classify_background(value_size: u32, p: &BenchParams) -> Option<PlotPoint> {
    let ok = p.value_size == value_size
        && close(p.get_ratio, 0.9)
        && is_uniform(&p.dist)
        && p.target_load.is_none();
    ok.then(|| PlotPoint {
        group: String::new(),
        series: p.mode.clone(),
        x: f64::from(p.background),
        x_label: match p.background {
            1 => "1 background process".into(),
            n => format!("{n} background processes"),
        },
    })
}

/// `values`: x is the value size, a panel per workload (uniform at each GET ratio, or Zipf).
fn classify_values(p: &BenchParams) -> Option<PlotPoint> {
    if p.target_load.is_some() || p.background != 0 {
        return None;
    }
    let group = if is_uniform(&p.dist) && VALUES_GET_RATIOS.iter().any(|&g| close(g, p.get_ratio)) {
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

/// `energy`: x is the offered load in % of the maximum (the closed loop is 100 %).
fn classify_energy(p: &BenchParams) -> Option<PlotPoint> {
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

/// `optimizations`: a bar per step of [`OPTIMIZATION_STEPS`], a group per GET ratio.
fn classify_optimizations(p: &BenchParams) -> Option<PlotPoint> {
    let ok = p.mode == "cd"
        && p.value_size == MEDIUM_VALUE
        && OPTIMIZATION_GET_RATIOS
            .iter()
            .any(|&g| close(g, p.get_ratio))
        && is_preset_zipf(&p.dist)
        && p.background == 0
        && p.target_load.is_none();
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
