//! What a cluster of each mode is made of, assembled in one place. The in-process cluster
//! (`nessie_cluster::LocalCluster`), the node process (`nessie_cluster::node`) and the
//! simulator (`nessie_sim::SimCluster`) all build their clusters from a [`Plan`]: they differ
//! only in the fabric they hand it (in-process memory, UCX, virtual time) and in how they run
//! the threads it gives them.
//!
//! - [`mode`]: [`Mode`], which protocol a cluster runs;
//! - [`plan`]: [`Plan`], the regions, the view and the shared request slots of a cluster, and
//!   its server loops and client workers;
//! - [`client`]: [`ModeClient`], a client worker of whichever mode.
//!
//! Future capabilities hook in here: erasure-coded stripes and elastic partitions change what
//! a plan lays out per node, not how each backend runs it.

pub mod client;
pub mod mode;
pub mod plan;

pub use client::{ClientParts, ModeClient, RpcLease};
pub use mode::Mode;
pub use plan::{NodeServer, Plan};
