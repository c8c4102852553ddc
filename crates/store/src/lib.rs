//! Nessie's storage structures, each in its own module:
//! - [`geometry`]: cluster-wide sizes fixed at creation (and the limits they are checked against),
//! - [`ite`]: the 64-bit index table entry,
//! - [`dte`]: the data table entry format,
//! - [`access`]: the DTE's access word (access clock and LFU counter, for eviction),
//! - [`index`]: the N-way cuckoo hash over all nodes' index tables,
//! - [`partition`]: how the index splits into partitions, the units it is placed and moved in,
//! - [`cache`]: the LRU cache of remote DTEs keyed by ITE,
//! - [`classes`]: size classes, pages, and how an ITE names an entry of a class,
//! - [`pages`]: page words, claimed by CAS (placement across nodes),
//! - [`classtable`]: a node's allocator of class entries, and expiry-based recycling.
//!
//! Memory formats are documented next to the code that writes them, and with bit diagrams in
//! `docs/layout.md`.

pub mod access;
pub mod cache;
pub mod classes;
pub mod classtable;
pub mod dte;
pub mod geometry;
pub mod index;
pub mod ite;
pub mod limits;
pub mod pages;
pub mod partition;

pub use dte::DteLayout;
pub use geometry::{Geometry, GeometryError, GeometryProblem};
pub use ite::{Ite, IteLayout, IteLayoutError};
pub use pages::PAGE_REGION;
pub use partition::{IndexPartitions, PartitionId};

/// The version of the remote-memory layout every node of a cluster shares: the ITE and DTE
/// formats, size classes and pages, page words and region order (`docs/layout.md`). Nodes
/// whose versions differ refuse each other at bootstrap (it is part of the configuration's
/// fingerprint). Bump it with any change a reader on another node would misread.
pub const LAYOUT_VERSION: u32 = 5;

/// Region holding a node's index table.
pub const INDEX_REGION: nessie_fabric::RegionId = 0;
/// Region holding a node's data table.
pub const DATA_REGION: nessie_fabric::RegionId = 1;
