//! An in-process cluster: N nodes' index and data tables on a [`MemFabric`], and client workers
//! on any node.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use nessie_fabric::mem::{DelayInjection, MemEndpoint, MemFabric};
use nessie_fabric::NodeId;
use nessie_protocols::cd::{CdClient, ClusterView};
use nessie_protocols::{Error, ProtocolConfig};
use nessie_store::datatable::DataTable;
use nessie_store::{Geometry, DATA_REGION, INDEX_REGION};

/// Client workers each node may create over its lifetime (they are numbered with 16 bits).
pub const MAX_WORKERS_PER_NODE: u32 = u16::MAX as u32;

pub struct LocalCluster {
    fabric: Arc<MemFabric>,
    view: Arc<ClusterView>,
    tables: Vec<Arc<DataTable>>,
    cfg: ProtocolConfig,
    next_worker: Vec<AtomicU32>,
}

impl LocalCluster {
    /// Allocate every node's tables. `delay` injects random delays around fabric operations.
    pub fn new(geometry: Geometry, cfg: ProtocolConfig, delay: Option<DelayInjection>) -> Result<Self, Error> {
        cfg.validate().map_err(Error::Config)?;
        let view = Arc::new(ClusterView::new(geometry)?);
        let g = &view.geometry;
        let mut regions = vec![Vec::new(); g.nodes as usize];
        for r in regions.iter_mut() {
            r.resize(2, 0);
            r[INDEX_REGION as usize] = g.index_table_bytes();
            r[DATA_REGION as usize] = g.data_table_bytes();
        }
        let fabric = MemFabric::new(&regions, delay).map_err(Error::Config)?;
        let tables = (0..g.nodes)
            .map(|n| Arc::new(DataTable::new(n, view.dte, g.dtes_per_node, cfg.clock_margin_ns)))
            .collect();
        let next_worker = (0..g.nodes).map(|_| AtomicU32::new(0)).collect();
        Ok(Self { fabric, view, tables, cfg, next_worker })
    }

    /// A new client worker on `node` with the cluster's protocol configuration.
    pub fn client(&self, node: NodeId) -> Result<CdClient<MemEndpoint>, Error> {
        self.client_with(node, self.cfg.clone())
    }

    /// A new client worker on `node` with its own protocol configuration (tests use this to
    /// give one client a mutation or a different optimisation set).
    pub fn client_with(&self, node: NodeId, cfg: ProtocolConfig) -> Result<CdClient<MemEndpoint>, Error> {
        let table = self
            .tables
            .get(node as usize)
            .ok_or_else(|| Error::Config(format!("no node {node} in a cluster of {}", self.tables.len())))?;
        let worker = self.next_worker[node as usize].fetch_add(1, Ordering::Relaxed);
        if worker >= MAX_WORKERS_PER_NODE {
            return Err(Error::Config(format!("node {node} has run out of worker ids ({MAX_WORKERS_PER_NODE})")));
        }
        CdClient::new(self.fabric.endpoint(node), self.view.clone(), table.clone(), worker as u16, cfg)
    }

    pub fn fabric(&self) -> &Arc<MemFabric> {
        &self.fabric
    }

    pub fn view(&self) -> &Arc<ClusterView> {
        &self.view
    }

    pub fn table(&self, node: NodeId) -> &Arc<DataTable> {
        &self.tables[node as usize]
    }

    pub fn config(&self) -> &ProtocolConfig {
        &self.cfg
    }

    /// Count present ITEs across all index tables (reads memory through a fresh endpoint).
    pub fn index_occupancy(&self) -> Result<u64, Error> {
        use nessie_fabric::{Endpoint, RemoteAddr};
        let mut ep = self.fabric.endpoint(0);
        let g = &self.view.geometry;
        let mut used = 0;
        for n in 0..g.nodes {
            for i in 0..g.ites_per_node {
                if ep.read_u64(RemoteAddr::new(n as NodeId, INDEX_REGION, i * 8))? != 0 {
                    used += 1;
                }
            }
        }
        Ok(used)
    }
}
