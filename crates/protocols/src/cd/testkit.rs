//! A client-driven cluster on the in-process fabric for this crate's unit tests. The full one,
//! `nessie_cluster::LocalCluster`, depends on this crate; this is its CD core: per node an
//! index, a data table and a page table region on one `InProcFabric`, and a `ClassTable`
//! allocator.

use std::cell::Cell;
use std::sync::Arc;

use nessie_fabric::inproc::{InProcEndpoint, InProcFabric};
use nessie_fabric::interpose::{Interposed, Interposer, Op};
use nessie_fabric::{Endpoint, FabricError, NodeId};
use nessie_store::classtable::ClassTable;
use nessie_store::index::Slot;
use nessie_store::{Geometry, Ite};

use super::{CdClient, ClusterView};
use crate::config::ProtocolConfig;

/// Nodes of the test clusters.
pub(crate) const NODES: u32 = 3;
/// Largest key and value of the test geometry.
pub(crate) const KEY_MAX: u32 = 16;
pub(crate) const VALUE_MAX: u32 = 64;
/// Expiry period of the test clusters: short, so writes that recycle do not wait long.
const EXPIRY_NS: u64 = 2_000_000;

/// A small geometry: 3 nodes of 64 ITEs and 256 DTEs, 3 hash functions.
pub(crate) fn small_geometry() -> Geometry {
    Geometry {
        nodes: NODES,
        ites_per_node: 64,
        dtes_per_node: 256,
        key_max: KEY_MAX,
        value_max: VALUE_MAX,
        hash_functions: 3,
        filter_bits: 7,
    }
}

/// Default protocol configuration with a short expiry and no clock margin.
pub(crate) fn fast_cfg() -> ProtocolConfig {
    ProtocolConfig {
        expiry_ns: EXPIRY_NS,
        clock_margin_ns: 0,
        ..ProtocolConfig::default()
    }
}

pub(crate) struct InProcCluster {
    pub fabric: Arc<InProcFabric>,
    pub view: Arc<ClusterView>,
    tables: Vec<Arc<ClassTable>>,
    cfg: ProtocolConfig,
    next_worker: Cell<u16>,
}

impl InProcCluster {
    pub fn new(geometry: Geometry, cfg: ProtocolConfig) -> Self {
        let view = Arc::new(ClusterView::new(geometry).unwrap());
        let g = &view.geometry;
        let regions = vec![g.table_regions(); g.nodes as usize];
        let fabric = InProcFabric::new(&regions, None).unwrap();
        let tables = (0..g.nodes)
            .map(|n| Arc::new(view.class_table(n as NodeId, cfg.clock_margin_ns)))
            .collect();
        Self {
            fabric,
            view,
            tables,
            cfg,
            next_worker: Cell::new(0),
        }
    }

    /// The default test cluster: [`small_geometry`] and [`fast_cfg`].
    pub fn small() -> Self {
        Self::new(small_geometry(), fast_cfg())
    }

    /// A new client worker on `node` (worker ids are unique across the cluster).
    pub fn client(&self, node: NodeId) -> CdClient<InProcEndpoint> {
        self.client_with(node, self.cfg.clone())
    }

    pub fn client_with(&self, node: NodeId, cfg: ProtocolConfig) -> CdClient<InProcEndpoint> {
        let worker = self.next_worker.get();
        self.next_worker.set(worker + 1);
        let ep = self.fabric.endpoint(node);
        let table = self.tables[node as usize].clone();
        CdClient::new(ep, self.view.clone(), table, worker, cfg).unwrap()
    }

    /// Node `node`'s data table allocator.
    pub fn table(&self, node: NodeId) -> &ClassTable {
        &self.tables[node as usize]
    }

    /// Fabric operations issued so far, by every endpoint.
    pub fn fabric_ops(&self) -> u64 {
        self.fabric.stats().total(None).total_ops()
    }

    /// The index entry in `slot`, read through a fresh endpoint.
    pub fn ite(&self, slot: Slot) -> Ite {
        let mut ep = self.fabric.endpoint(0);
        Ite(ep.read_u64(self.view.index.addr(slot)).unwrap())
    }

    /// Number of occupied ITEs in the whole index.
    pub fn occupancy(&self) -> u64 {
        (0..self.view.geometry.total_ites())
            .filter(|&s| !self.ite(s).is_empty())
            .count() as u64
    }

    /// `key`'s candidate slots, in order.
    pub fn candidates(&self, key: &[u8]) -> Vec<Slot> {
        self.view.index.hashes(key).all(&self.view.index)
    }
}

/// Keys tried when looking for a key with particular candidates.
pub(crate) const SEARCH: u32 = 100_000;

pub(crate) fn key(prefix: u8, i: u32) -> Vec<u8> {
    let mut k = vec![prefix];
    k.extend_from_slice(&i.to_le_bytes());
    k
}

/// A key whose candidates are distinct slots.
pub(crate) fn key_with_distinct_candidates(c: &InProcCluster) -> Vec<u8> {
    (0..SEARCH)
        .map(|i| key(b'k', i))
        .find(|k| {
            let mut s = c.candidates(k);
            s.sort_unstable();
            s.windows(2).all(|w| w[0] != w[1])
        })
        .unwrap()
}

/// A key, not in `taken`, whose first candidate is `slot` (so an empty-index PUT puts it
/// there).
pub(crate) fn key_first_in(c: &InProcCluster, slot: Slot, taken: &[Vec<u8>]) -> Vec<u8> {
    (0..SEARCH)
        .map(|i| key(b'f', i))
        .find(|k| c.candidates(k)[0] == slot && !taken.contains(k))
        .unwrap()
}

/// How many of an endpoint's next operations fail, by kind (shared with the test driving it).
#[derive(Default)]
pub(crate) struct FailNext {
    /// CASes refused (not issued).
    pub cas: std::sync::atomic::AtomicU32,
    /// CASes that take place but whose answer is lost (the caller cannot tell).
    pub cas_lost: std::sync::atomic::AtomicU32,
    /// The same, counting only CASes on index entries (not page claims, say).
    pub index_cas_lost: std::sync::atomic::AtomicU32,
    /// Writes, local or remote, refused.
    pub writes: std::sync::atomic::AtomicU32,
    /// Writes that take place but whose answer is lost.
    pub writes_lost: std::sync::atomic::AtomicU32,
    /// Reads, local or remote, refused.
    pub reads: std::sync::atomic::AtomicU32,
}

/// What makes a client's next operations fail, as [`FailNext`] says: refused as if its node
/// were fenced for a moment (its view of membership stale), or with their answer lost.
pub(crate) struct Failing(Arc<FailNext>);

/// Take one from `n` if it is above zero.
fn take(n: &std::sync::atomic::AtomicU32) -> bool {
    use std::sync::atomic::Ordering::SeqCst;
    n.fetch_update(SeqCst, SeqCst, |v| v.checked_sub(1)).is_ok()
}

impl Interposer for Failing {
    fn before(&mut self, op: Op) -> Result<(), FabricError> {
        let n = match op {
            Op::Cas(_) => &self.0.cas,
            Op::Write(_) | Op::LocalWrite(_) => &self.0.writes,
            Op::Read(_) | Op::LocalRead(_) => &self.0.reads,
        };
        match take(n) {
            true => Err(FabricError::Fenced {
                node: op.addr().node,
            }),
            false => Ok(()),
        }
    }

    fn after_cas(&mut self, addr: nessie_fabric::RemoteAddr) -> Result<(), FabricError> {
        let index = addr.region == nessie_store::INDEX_REGION && take(&self.0.index_cas_lost);
        match index || take(&self.0.cas_lost) {
            true => Err(FabricError::Unreachable {
                node: addr.node,
                reason: "the answer was lost".into(),
            }),
            false => Ok(()),
        }
    }

    fn after_write(&mut self, addr: nessie_fabric::RemoteAddr) -> Result<(), FabricError> {
        match take(&self.0.writes_lost) {
            true => Err(FabricError::Unreachable {
                node: addr.node,
                reason: "the answer was lost".into(),
            }),
            false => Ok(()),
        }
    }
}

impl InProcCluster {
    /// Put `node`'s expired recycled entries back in reach of its writers now (what a scan
    /// for room does). Returns how many.
    pub fn reclaim(&self, node: NodeId) -> u64 {
        let mut ep = self.fabric.endpoint(node);
        self.tables[node as usize].reclaim(&mut ep).unwrap()
    }

    /// A client on `node` whose next operations fail as `FailNext` (returned) says.
    pub fn failing_client(
        &self,
        node: NodeId,
    ) -> (CdClient<Interposed<InProcEndpoint, Failing>>, Arc<FailNext>) {
        let worker = self.next_worker.get();
        self.next_worker.set(worker + 1);
        let fail = Arc::new(FailNext::default());
        let ep = Interposed::new(self.fabric.endpoint(node), Failing(fail.clone()));
        let table = self.tables[node as usize].clone();
        let c = CdClient::new(ep, self.view.clone(), table, worker, self.cfg.clone()).unwrap();
        (c, fail)
    }
}
