//! Clusters: how nodes, their memory and their clients are put together.
//!
//! - [`local::LocalCluster`]: every node inside one process on the in-process fabric (tests,
//!   demos, property and stress tests).
//!
//! Built with or without UCX:
//!
//! - [`admin`]: the local admin socket through which short-lived CLI processes ask a node to
//!   run operations.
//! - [`rundir`]: a cluster directory's files.
//!
//! With the default `ucx` feature, node processes over UCX as well:
//!
//! - `config`: the cluster configuration file shared by node processes.
//! - `bootstrap`: the authenticated rendezvous through which node processes exchange their
//!   fabric addresses and keys.
//! - `node`, `process`: a node process, and starting and stopping them.
//! - `route`: which node a CLI operation on a key goes to, with fallback to the others.
//! - `metrics`: a node's Prometheus metrics (its clients' operations, a snapshot of the node).
//! - `frontstore`: the store behind a node's front ends: its client pool, and a pipeline per
//!   event loop that runs a pipelined batch's GETs and SETs concurrently.
//!
//! Membership (epochs in etcd, the monitor, the etcd client) is `nessie_membership`; the
//! local etcd that `nessie up` starts is `process::etcd_server`. What a node serves its
//! clients with (the front ends on their event loops, the client pool, the per-operation
//! counters) is `nessie_serve`.
//!
//! [`reclaimer`]: the thread per node that gives back the pages of writers gone idle.
//!
//! `rejoin`: the thread per node process that fills a restarted node's copies while it is
//! `joining`, then says it is ready.

pub mod admin;
#[cfg(feature = "ucx")]
pub mod bootstrap;
#[cfg(feature = "ucx")]
pub mod config;
#[cfg(feature = "ucx")]
pub mod exposure;
#[cfg(feature = "ucx")]
pub mod frontstore;
pub mod local;
#[cfg(feature = "ucx")]
pub mod metrics;
#[cfg(feature = "ucx")]
pub mod node;
#[cfg(feature = "ucx")]
pub mod process;
pub mod reclaimer;
#[cfg(feature = "ucx")]
pub mod rejoin;
#[cfg(feature = "ucx")]
pub mod route;
pub mod rundir;

pub use local::{LocalCluster, LocalEndpoint, LocalSlotClient};
