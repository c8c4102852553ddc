//! Benchmarking Nessie: workload generation ([`workload`]) and the one workload loop
//! ([`driver`]) that the agent, the demo and the stress harness all run, and the benchmark
//! result ([`result`]); the fill test's loader ([`fill`]) and the memcached connection it also
//! loads memcached through ([`memcached`]). With the default `ucx` feature, also
//! the single-run harness that drives node processes (`runner`) and the load agent each node
//! runs for it (`agent`). Sweeps and plots live in `nessie-report`; the stress harness and demo
//! in `nessie-testkit`.

#[cfg(feature = "ucx")]
pub mod agent;
pub mod driver;
pub mod fill;
pub mod memcached;
pub mod result;
#[cfg(feature = "ucx")]
pub mod runner;
pub mod scale;
pub mod sizing;
pub mod timeline;
pub mod workload;
