//! A client-driven cluster on the in-process fabric for this crate's unit tests. The full one,
//! `nessie_cluster::LocalCluster`, depends on this crate; this is its CD core: per node an
//! index, a data table and a page table region on one `InProcFabric`, and a `ClassTable`
//! allocator.

use std::cell::Cell;
use std::sync::Arc;

use nessie_fabric::inproc::{InProcEndpoint, InProcFabric};
use nessie_fabric::{Endpoint, NodeId};
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

/// How many of an endpoint's next operations fail, by kind (shared with the test driving it).
#[derive(Default)]
pub(crate) struct FailNext {
    /// CASes refused (not issued).
    pub cas: std::sync::atomic::AtomicU32,
    /// CASes that take place but whose answer is lost (the caller cannot tell).
    pub cas_lost: std::sync::atomic::AtomicU32,
    /// Writes, local or remote, refused.
    pub writes: std::sync::atomic::AtomicU32,
}

/// An endpoint whose next operations fail, as [`FailNext`] says: refused as if its node were
/// fenced for a moment (its view of membership stale), or with their answer lost.
pub(crate) struct Failing<E> {
    inner: E,
    fail: Arc<FailNext>,
}

impl<E: Endpoint> Failing<E> {
    fn take(&self, n: &std::sync::atomic::AtomicU32) -> Result<(), nessie_fabric::FabricError> {
        use std::sync::atomic::Ordering::SeqCst;
        match n.fetch_update(SeqCst, SeqCst, |v| v.checked_sub(1)) {
            Ok(_) => Err(nessie_fabric::FabricError::Fenced {
                node: self.inner.node(),
            }),
            Err(_) => Ok(()),
        }
    }
}

impl<E: Endpoint> Endpoint for Failing<E> {
    fn node(&self) -> NodeId {
        self.inner.node()
    }
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn read(
        &mut self,
        addr: nessie_fabric::RemoteAddr,
        buf: &mut [u8],
    ) -> Result<(), nessie_fabric::FabricError> {
        self.inner.read(addr, buf)
    }
    fn write(
        &mut self,
        addr: nessie_fabric::RemoteAddr,
        buf: &[u8],
    ) -> Result<(), nessie_fabric::FabricError> {
        self.take(&self.fail.writes)?;
        self.inner.write(addr, buf)
    }
    fn compare_and_swap(
        &mut self,
        addr: nessie_fabric::RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, nessie_fabric::FabricError> {
        self.take(&self.fail.cas)?;
        let was = self.inner.compare_and_swap(addr, expected, desired)?;
        self.take(&self.fail.cas_lost)
            .map_err(|_| nessie_fabric::FabricError::Unreachable {
                node: addr.node,
                reason: "the answer was lost".into(),
            })?;
        Ok(was)
    }
    fn local_read(
        &mut self,
        region: nessie_fabric::RegionId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), nessie_fabric::FabricError> {
        self.inner.local_read(region, offset, buf)
    }
    fn local_write(
        &mut self,
        region: nessie_fabric::RegionId,
        offset: u64,
        buf: &[u8],
    ) -> Result<(), nessie_fabric::FabricError> {
        self.take(&self.fail.writes)?;
        self.inner.local_write(region, offset, buf)
    }
    fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }
    fn mono_ns(&self) -> u64 {
        self.inner.mono_ns()
    }
    fn sleep_ns(&mut self, ns: u64) {
        self.inner.sleep_ns(ns)
    }
    fn stats(&self) -> &nessie_fabric::StatsCell {
        self.inner.stats()
    }
}

impl InProcCluster {
    /// A client on `node` whose next operations fail as `FailNext` (returned) says.
    pub fn failing_client(
        &self,
        node: NodeId,
    ) -> (CdClient<Failing<InProcEndpoint>>, Arc<FailNext>) {
        let worker = self.next_worker.get();
        self.next_worker.set(worker + 1);
        let fail = Arc::new(FailNext::default());
        let ep = Failing {
            inner: self.fabric.endpoint(node),
            fail: fail.clone(),
        };
        let table = self.tables[node as usize].clone();
        let c = CdClient::new(ep, self.view.clone(), table, worker, self.cfg.clone()).unwrap();
        (c, fail)
    }
}
