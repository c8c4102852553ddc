//! Clusters: how nodes, their memory and their clients are put together.
//!
//! - [`local::LocalCluster`]: every node inside one process on the in-process fabric (tests,
//!   demos, property and stress tests).
//! - [`config`]: the cluster configuration file shared by node processes.
//! - [`bootstrap`]: the authenticated rendezvous through which node processes exchange their
//!   fabric addresses and keys.
//! - [`admin`]: the local admin socket through which short-lived CLI processes ask a node to
//!   run operations.
//! - [`route`]: which node a CLI operation on a key goes to, with fallback to the others.

pub mod admin;
pub mod bootstrap;
pub mod config;
pub mod local;
pub mod node;
pub mod process;
pub mod route;
pub mod rundir;

pub use local::LocalCluster;
