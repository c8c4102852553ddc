//! Errors returned to users of the client API.

use nessie_fabric::{FabricError, NodeId};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum Error {
    #[error("key is empty")]
    EmptyKey,
    #[error("key of {len} bytes exceeds the cluster's key_max of {max} bytes")]
    KeyTooLarge { len: usize, max: u32 },
    #[error("value of {len} bytes exceeds the cluster's value_max of {max} bytes")]
    ValueTooLarge { len: usize, max: u32 },
    /// An item longer than the cluster's item limit (`[cache] item_max`, issue 41): items
    /// longer than one entry are stored in chunks (`crate::large`) up to it.
    #[error("item of {len} bytes exceeds the cluster's item_max of {max} bytes")]
    ItemTooLarge { len: u64, max: u64 },
    /// A user's key in the space the store keeps for the chunks of large items.
    #[error("keys beginning with the bytes {prefix} are reserved for the chunks of large items")]
    KeyReserved { prefix: String },
    #[error("index full: no free slot for the key within {depth} levels of migration; enlarge the index tables or delete data")]
    IndexFull { depth: u8 },
    #[error("data tables full: no room for an entry of {entry_size} bytes written by node {node} ({awaiting_expiry} released entries not yet expired; each node keeps its last free pages for deletes)")]
    DataTableFull {
        node: NodeId,
        entry_size: u64,
        awaiting_expiry: u64,
    },
    #[error("operation timed out: it ran longer than the expiry period of {expiry_ms} ms")]
    Timeout { expiry_ms: u64 },
    #[error("gave up after {attempts} attempts aborted by concurrent operations on the same key")]
    Contended { attempts: u32 },
    #[error("node {node} is unreachable: {reason}")]
    Unreachable { node: NodeId, reason: String },
    /// This node's membership lease (or its view of the configuration) has lapsed or will
    /// before the operation could end, or it is not `up`: it may have been declared failed, and
    /// its writes are then others' to complete. With copies, a stale view stops reads too.
    #[error("node {node} is fenced: its membership lease or its view of the configuration has lapsed, or it is not up (it may have been declared failed), so it makes no writes (and, with copies, no reads) until it hears from etcd again")]
    Fenced { node: NodeId },
    #[error("fabric error: {0}")]
    Fabric(FabricError),
    /// A conditional write whose commit was issued and whose outcome could not be learnt
    /// (the copy deciding its CAS failed, and its entry could not be read since): it may or
    /// may not have taken effect. Any other error of a conditional write means it did not.
    #[error("the conditional write may or may not have taken effect: {0}")]
    Indeterminate(String),
    #[error("corrupt data table entry: {0}")]
    Corrupt(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    /// An error reported by a node that performed the operation on our behalf.
    #[error("{0}")]
    Node(String),
    /// The cluster's mode does not offer the operation (conditional writes are the CD
    /// protocol's).
    #[error("{0}")]
    Unsupported(String),
}

impl From<FabricError> for Error {
    fn from(e: FabricError) -> Self {
        match e {
            FabricError::Unreachable { node, reason } => Error::Unreachable { node, reason },
            FabricError::Fenced { node } => Error::Fenced { node },
            e => Error::Fabric(e),
        }
    }
}

impl Error {
    /// Whether retrying later may succeed without any change to the cluster.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. } | Error::Contended { .. } | Error::DataTableFull { .. }
        )
    }
}
