//! Workloads and harnesses that drive Nessie clients: the concurrency stress harness with
//! history checking ([`stress`]), and (later) the benchmark harness.

pub mod stress;
