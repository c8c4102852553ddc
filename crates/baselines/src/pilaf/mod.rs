//! Pilaf (Mitchell, Geng, Li, USENIX ATC 2013) as a fourth mode: GETs are client-driven over
//! one-sided READs, PUTs and DELETEs are executed by the owner node's server threads, and
//! clients detect read-write races with CRC64 checksums instead of protocol steps.
//!
//! - [`layout`]: the hash-table entries and extents, with their checksums,
//! - [`alloc`]: the server-side extent allocator,
//! - [`server`]: PUT and DELETE on the owner (cuckoo inserts, moves from the last key back),
//! - [`client`]: [`PilafClient`]: GET by READs with verification, PUT/DELETE as requests.
//!
//! Keys go to nodes by the owner hash of the coupled index (the same as SD and HY, so the
//! request path is SD's unchanged), and within a node to 3 candidate entries. PUT and DELETE
//! travel through SD's request/response slots (`crate::sd`) to SD's server threads, whose
//! executor is a [`server::PilafExecutor`] instead of a client-driven worker. See
//! `docs/baselines.md` for how this differs from the paper.

pub mod alloc;
pub mod client;
pub mod layout;
pub mod server;

pub use client::{PilafClient, PilafClientStats};
pub use layout::{EXTENT_REGION, TABLE_REGION};
pub use server::{PilafExecutor, PilafStore, StoreStats};

use nessie_store::Geometry;

use nessie_protocols::Error;

/// Test-only server behaviour that is allowed but adversarial (not a breakage).
#[cfg(any(test, feature = "testing"))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PilafTesting {
    /// Write each extent tail first, yield, then its head (the fabric does not order the words
    /// of a write): readers of a reused block see torn extents far more often.
    pub tail_first_extent_writes: bool,
}

/// Sizes and timing of one node's Pilaf store, the same on every node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PilafParams {
    /// Hash-table entries per node.
    pub entries: u64,
    /// Bytes of the extent region per node.
    pub extent_bytes: u64,
    pub key_max: u32,
    pub value_max: u32,
    /// How long a freed extent waits before it may be reused (0: at once, as in the paper).
    pub reuse_delay_ns: u64,
    #[cfg(any(test, feature = "testing"))]
    pub testing: PilafTesting,
}

impl PilafParams {
    /// The store of `geometry`: as many entries as it has index entries per node, and as many
    /// extent bytes as its data table has (the same memory budget as the other modes).
    pub fn new(geometry: &Geometry, reuse_delay_ns: u64) -> Result<Self, Error> {
        let p = Self {
            entries: geometry.ites_per_node,
            extent_bytes: geometry.data_table_bytes(),
            key_max: geometry.key_max,
            value_max: geometry.value_max,
            reuse_delay_ns,
            #[cfg(any(test, feature = "testing"))]
            testing: PilafTesting::default(),
        };
        p.validate()?;
        Ok(p)
    }

    pub fn validate(&self) -> Result<(), Error> {
        if !(layout::WAYS as u64..=layout::MAX_ENTRIES).contains(&self.entries) {
            return Err(Error::Config(format!(
                "pilaf needs {} to {} hash-table entries per node (ites_per_node), not {}",
                layout::WAYS,
                layout::MAX_ENTRIES,
                self.entries
            )));
        }
        if self.extent_bytes > layout::MAX_EXTENT_BYTES {
            return Err(Error::Config(format!(
                "pilaf extent region of {} bytes exceeds {} bytes",
                self.extent_bytes,
                layout::MAX_EXTENT_BYTES
            )));
        }
        Ok(())
    }

    /// The largest extent: the largest key and value.
    pub fn max_extent(&self) -> u64 {
        layout::extent_size(self.key_max as usize, self.value_max as usize)
    }

    /// Bytes of the table region.
    pub fn table_bytes(&self) -> u64 {
        layout::table_bytes(self.entries)
    }
}

/// Sizes of every region of a Pilaf node, by region id: regions 0..2 (the client-driven
/// tables, unused) one word each, SD's request and response slots, then the table and the
/// extents.
pub fn region_sizes(params: &PilafParams, rpc: &crate::sd::SlotLayout) -> Vec<u64> {
    let mut r = vec![8u64; EXTENT_REGION as usize + 1];
    r[crate::sd::REQUEST_REGION as usize] = rpc.request_region_bytes();
    r[crate::sd::RESPONSE_REGION as usize] = rpc.response_region_bytes();
    r[TABLE_REGION as usize] = params.table_bytes();
    r[EXTENT_REGION as usize] = params.extent_bytes.max(8);
    r
}

#[cfg(test)]
mod tests;
