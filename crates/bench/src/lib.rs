//! Benchmarking Nessie across node processes: the single-run harness ([`runner`]) and its
//! result ([`result`]), the load agent each node runs for it ([`agent`]), and workload
//! generation shared with the demo and stress harness ([`workload`]). Sweeps and plots live
//! in `nessie-report`; the stress harness and demo in `nessie-testkit`.

pub mod agent;
pub mod result;
pub mod runner;
pub mod workload;
