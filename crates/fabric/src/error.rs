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
    /// A replicated compare-and-swap took place at the copy that decides it, but that copy's
    /// node failed before every other copy had it: whether it survives is unknown.
    #[error("the outcome of a compare-and-swap is unknown: node {node}, which decided it, failed")]
    Indeterminate { node: NodeId },
    /// This node may not change replicated memory: its membership lease or its view of the
    /// configuration may have lapsed, or it is not `up`.
    #[error("node {node} is fenced: it may not change replicated memory")]
    Fenced { node: NodeId },
    /// No live node holds a copy of this memory.
    #[error("every copy of node {node}'s memory is on a failed node")]
    NoCopy { node: NodeId },
}

/// Why an in-process fabric or a delay injection cannot be set up as configured.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("node count {count} is not in 1..={max}")]
    NodeCount { count: usize, max: NodeId },
    #[error("delay probability {0} is not in [0, 1]")]
    DelayProbability(f64),
    #[error("max injected delay {0} ns exceeds 1 s")]
    DelayTooLong(u64),
}
