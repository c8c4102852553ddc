//! Clusters: how nodes, their memory and their clients are put together.
//!
//! [`local::LocalCluster`] runs every node inside one process on the in-process fabric (tests,
//! demos, property and stress tests). Multi-process clusters on UCX build on the same pieces.

pub mod local;

pub use local::LocalCluster;
