//! Addresses in the fabric.

/// Node identifier: index into the cluster's node list.
pub type NodeId = u16;
/// Region identifier within a node (by convention 0 = index table, 1 = data table).
pub type RegionId = u16;

/// Alignment, in bytes, of every offset and length passed to the fabric.
pub const ALIGN: u64 = 8;

/// A location in some node's registered memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RemoteAddr {
    pub node: NodeId,
    pub region: RegionId,
    pub offset: u64,
}

impl RemoteAddr {
    pub const fn new(node: NodeId, region: RegionId, offset: u64) -> Self {
        Self {
            node,
            region,
            offset,
        }
    }

    pub const fn add(self, bytes: u64) -> Self {
        Self {
            offset: self.offset + bytes,
            ..self
        }
    }
}

impl std::fmt::Display for RemoteAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "node {} region {} +{:#x}",
            self.node, self.region, self.offset
        )
    }
}
