use crate::{NodeId, RegionId};

/// Failure of a single fabric operation. The protocol treats every one of these as fatal for
/// the current operation (no retry hides a dead node).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum FabricError {
    #[error("node {node} is unreachable: {reason}")]
    Unreachable { node: NodeId, reason: String },
    #[error("no node {node} in a fabric of {nodes} nodes")]
    UnknownNode { node: NodeId, nodes: usize },
    #[error("node {node} has no region {region}")]
    UnknownRegion { node: NodeId, region: RegionId },
    #[error("access of {len} bytes at offset {offset} is outside region {region} of node {node} ({size} bytes)")]
    OutOfBounds {
        node: NodeId,
        region: RegionId,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("offset {offset} or length {len} is not a multiple of {align}")]
    Misaligned { offset: u64, len: u64, align: u64 },
    #[error("fabric transport error: {0}")]
    Transport(String),
}
