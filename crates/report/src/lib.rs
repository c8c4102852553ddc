//! Benchmark sweeps and their figures: named presets that expand into matrices of runs
//! ([`preset`]), running them and saving their results ([`sweep`]), the text summary
//! ([`summary`]), one figure builder per preset ([`figures`]) over results grouped per point
//! ([`group`]), the PNG drawing primitives ([`plot`]), and the simulator's presets and their
//! table ([`paper`]).

pub mod figures;
mod group;
pub mod paper;
pub mod plot;
pub mod preset;
pub mod summary;
pub mod sweep;
pub mod timeline_plot;

pub use figures::{render, RenderError};
pub use preset::{classify, PlotPoint, Preset, RunSpec, UnknownPreset};
pub use summary::summary_table;
pub use sweep::{load_results, run_preset, run_specs, RunError, SweepError, SweepOutcome};
