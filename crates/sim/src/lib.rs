//! Nessie's clusters on the simulated fabric (`nessie-fabric-sim`): the harness behind
//! `nessie sim`. The protocol code is the production code, unchanged; the cluster is assembled
//! by `nessie_deploy::Plan` like every other.
//!
//! - [`cluster`]: [`SimCluster`], every node's tables, client workers each on a simulated
//!   thread, and the SD/HY/Pilaf server threads each on a polling core;
//! - [`bench`]: a benchmark run in virtual time (`nessie sim`);
//! - [`correctness`]: CD under the simulator's injected faults, its history checked for
//!   linearizability (`nessie sim check`).

pub mod bench;
pub mod cluster;
pub mod correctness;

pub use cluster::SimCluster;
