//! Workloads and harnesses that drive Nessie clients: the concurrency stress harness with
//! history checking ([`stress`]), workload generation ([`workload`]) and the demo ([`demo`]).

pub mod agent;
pub mod demo;
pub mod plot;
pub mod result;
pub mod runner;
pub mod stress;
pub mod sweep;
pub mod workload;
