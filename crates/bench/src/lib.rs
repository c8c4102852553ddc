//! Workloads and harnesses that drive Nessie clients: the concurrency stress harness with
//! history checking ([`stress`]), workload generation ([`workload`]) and the demo ([`demo`]).
//! With the default `ucx` feature, also the benchmark agent inside node processes (`agent`)
//! and the harness that drives it (`runner`).

#[cfg(feature = "ucx")]
pub mod agent;
pub mod demo;
pub mod plot;
pub mod result;
#[cfg(feature = "ucx")]
pub mod runner;
pub mod stress;
pub mod sweep;
pub mod workload;
