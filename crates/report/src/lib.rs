//! Benchmark sweeps and their figures: named presets that expand into matrices of runs, the
//! JSON results and summary they leave behind ([`sweep`]), and the PNG drawing primitives
//! ([`plot`]).

pub mod plot;
pub mod sweep;
