//! Nessie's storage structures, each in its own module:
//! - [`geometry`]: cluster-wide sizes fixed at creation (and the limits they are checked against),
//! - [`ite`]: the 64-bit index table entry,
//! - [`dte`]: the data table entry format,
//! - [`index`]: the N-way cuckoo hash over all nodes' index tables,
//! - [`datatable`]: allocation and expiry-based recycling of a node's DTEs,
//! - [`cache`]: the LRU cache of remote DTEs keyed by ITE,
//! - [`classes`]: size classes and pages (groundwork for variable-size DTEs),
//! - [`pages`]: page words, claimed by CAS (groundwork for placement across nodes).
//!
//! Memory formats are documented next to the code that writes them, and with bit diagrams in
//! `docs/layout.md`.

pub mod cache;
pub mod classes;
pub mod classtable;
pub mod datatable;
pub mod dte;
pub mod geometry;
pub mod index;
pub mod ite;
pub mod limits;
pub mod pages;

pub use dte::DteLayout;
pub use geometry::{Geometry, GeometryError, GeometryProblem};
pub use ite::{Ite, IteLayout, IteLayoutError};

/// Region holding a node's index table.
pub const INDEX_REGION: nessie_fabric::RegionId = 0;
/// Region holding a node's data table.
pub const DATA_REGION: nessie_fabric::RegionId = 1;
