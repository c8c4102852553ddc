//! A cluster's plan: what every node of a cluster of some [`Mode`] registers and shares, and
//! how each of its server threads and client workers is made. Built once per cluster (or per
//! node process, from the cluster's configuration, which every node shares), the same way
//! whatever the fabric.
//!
//! Regions per node (`docs/layout.md`):
//! - CD: the client-driven tables (index, data, pages), sized for the copies the node holds
//!   ([`ReplicaSet::region_sizes`]);
//! - SD, HY: the same tables over the coupled index, then the request and response slots
//!   (`sd::REQUEST_REGION`, `sd::RESPONSE_REGION`);
//! - Pilaf: Pilaf's own hash table and extents after the slots (`pilaf::region_sizes`).

use std::sync::Arc;

use nessie_baselines::pilaf::{self, PilafExecutor, PilafStore};
use nessie_baselines::sd::{
    self, ClientSlot, RpcConfig, RpcShared, Server, ServerLoop, ServerStats, SlotPool,
};
use nessie_fabric::{Endpoint, NodeId};
use nessie_protocols::cd::CdClient;
use nessie_protocols::{ClusterView, Error, ProtocolConfig, ReplicaSet};
use nessie_store::classtable::ClassTable;
use nessie_store::index::Placement;
use nessie_store::Geometry;

use crate::{ClientParts, Mode, ModeClient, RpcLease};

/// What a cluster of one mode is made of. Every field is fixed for the cluster's life.
pub struct Plan {
    pub mode: Mode,
    /// The geometry and what is derived from it, shared by every client and server.
    pub view: Arc<ClusterView>,
    /// The protocol configuration clients run with (servers run with
    /// [`Mode::server_config`] of it).
    pub cfg: ProtocolConfig,
    /// SD/HY/Pilaf: how the request slots are sized and the servers idle.
    pub rpc_cfg: RpcConfig,
    /// SD/HY/Pilaf: the request/response slot layout and the state clients and servers of
    /// one process share; `None` in CD.
    pub rpc: Option<Arc<RpcShared>>,
}

/// One node's share of what its server threads execute with.
pub struct NodeServer<'a> {
    /// The node's data table allocator (a CD executor writes DTEs with it).
    pub table: Arc<ClassTable>,
    /// Pilaf: the node's store ([`Plan::pilaf_store`]).
    pub pilaf: Option<&'a Arc<PilafStore>>,
}

impl Plan {
    /// The plan of a `mode` cluster of `geometry`, validating every part of its configuration.
    pub fn new(
        mode: Mode,
        geometry: Geometry,
        cfg: ProtocolConfig,
        rpc_cfg: RpcConfig,
    ) -> Result<Self, Error> {
        cfg.validate()?;
        mode.validate()?;
        let view = Arc::new(match mode.placement() {
            Placement::Decoupled => ClusterView::new(geometry)?,
            Placement::Coupled => ClusterView::coupled(geometry)?,
        });
        let rpc = match mode {
            Mode::Cd => None,
            Mode::Sd { .. } | Mode::Hy { .. } | Mode::Pilaf { .. } => {
                Some(sd::rpc_shared(&view.geometry, &rpc_cfg)?)
            }
        };
        let plan = Self {
            mode,
            view,
            cfg,
            rpc_cfg,
            rpc,
        };
        debug_assert_eq!(plan.rpc.is_some(), plan.mode.server_threads() > 0);
        Ok(plan)
    }

    pub fn geometry(&self) -> &Geometry {
        &self.view.geometry
    }

    /// The regions every node registers, in order: the client-driven tables sized for the
    /// copies `set` places on a node, then the mode's own (see the module's documentation).
    pub fn node_regions(&self, set: &ReplicaSet) -> Result<Vec<u64>, Error> {
        let g = self.geometry();
        let mut regions = set.region_sizes(&g.table_regions());
        let Some(s) = &self.rpc else {
            return Ok(regions);
        };
        if set.replicas() != 1 {
            return Err(Error::Config(format!(
                "replication is for the client-driven protocol; {} keeps one copy",
                self.mode.name()
            )));
        }
        if let Mode::Pilaf { .. } = self.mode {
            let params = self.rpc_cfg.pilaf_params(g, &self.cfg)?;
            return Ok(pilaf::region_sizes(&params, &s.layout));
        }
        regions.resize(sd::RESPONSE_REGION as usize + 1, 0);
        regions[sd::REQUEST_REGION as usize] = s.layout.request_region_bytes();
        regions[sd::RESPONSE_REGION as usize] = s.layout.response_region_bytes();
        Ok(regions)
    }

    /// A new data table allocator for `node` (one per node incarnation, shared by its workers).
    pub fn class_table(&self, node: NodeId) -> ClassTable {
        self.view.class_table(node, self.cfg.clock_margin_ns)
    }

    /// Pilaf: a new store for `node`'s hash table and extents; `None` in other modes.
    pub fn pilaf_store(&self, node: NodeId) -> Result<Option<Arc<PilafStore>>, Error> {
        match self.mode {
            Mode::Pilaf { .. } => {
                let params = self.rpc_cfg.pilaf_params(self.geometry(), &self.cfg)?;
                Ok(Some(PilafStore::new(node, params)?))
            }
            _ => Ok(None),
        }
    }

    /// SD/HY/Pilaf: a node's pool of request slots to lease to its clients.
    pub fn slot_pool(&self) -> Option<Arc<SlotPool>> {
        let s = self.rpc.as_ref()?;
        Some(SlotPool::new(s.layout.max_clients_per_node))
    }

    /// Server thread `thread` of a node: SD's server loop executing with the client-driven
    /// protocol on the node's tables (SD, HY) or with the node's Pilaf store. `exec` and `io`
    /// are two endpoints of the node; `worker` hands out a worker id and is called only for a
    /// client-driven executor. Returns the loop to run on its thread and its counters.
    pub fn server<E: Endpoint + 'static>(
        &self,
        thread: u16,
        exec: E,
        io: E,
        node: NodeServer<'_>,
        worker: impl FnOnce() -> Result<u16, Error>,
    ) -> Result<(ServerLoop, Arc<ServerStats>), Error> {
        let Some(shared) = &self.rpc else {
            return Err(Error::Config(format!(
                "{} runs no server threads",
                self.mode.name()
            )));
        };
        let threads = self.mode.server_threads();
        assert!(thread < threads, "server thread {thread} of {threads}");
        let opts = self.rpc_cfg.server_options();
        let shared = shared.clone();
        match node.pilaf {
            Some(store) => {
                let exec = PilafExecutor::new(exec, store.clone())?;
                let s = Server::new(exec, io, shared, thread, threads, opts)?;
                let stats = s.stats();
                Ok((s.into_loop(), stats))
            }
            None => {
                let cfg = self.mode.server_config(&self.cfg);
                let exec = CdClient::new(exec, self.view.clone(), node.table, worker()?, cfg)?;
                let s = Server::new(exec, io, shared, thread, threads, opts)?;
                let stats = s.stats();
                Ok((s.into_loop(), stats))
            }
        }
    }

    /// A client worker of the cluster's mode on `ep`'s node, running `cfg`. `slot` is the
    /// request slot leased for it (SD/HY/Pilaf, from the node's [`Self::slot_pool`]);
    /// `worker` hands out a worker id (CD and HY workers write DTEs).
    pub fn client<E: Endpoint>(
        &self,
        ep: E,
        table: Arc<ClassTable>,
        cfg: ProtocolConfig,
        worker: impl FnOnce() -> Result<u16, Error>,
        slot: Option<ClientSlot>,
    ) -> Result<ModeClient<E>, Error> {
        self.client_of(self.mode, ep, table, cfg, worker, slot)
    }

    /// [`Self::client`] of another mode over the same cluster: a client-driven worker over an
    /// SD/HY cluster's coupled index inspects what the servers wrote.
    pub fn client_of<E: Endpoint>(
        &self,
        mode: Mode,
        ep: E,
        table: Arc<ClassTable>,
        cfg: ProtocolConfig,
        worker: impl FnOnce() -> Result<u16, Error>,
        slot: Option<ClientSlot>,
    ) -> Result<ModeClient<E>, Error> {
        let rpc = match (&self.rpc, slot) {
            (Some(shared), Some(slot)) => Some(RpcLease {
                shared: shared.clone(),
                slot,
            }),
            _ => None,
        };
        let parts = ClientParts {
            ep,
            view: self.view.clone(),
            table,
            cfg,
        };
        ModeClient::new(mode, parts, worker, rpc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry() -> Geometry {
        Geometry {
            nodes: 2,
            ites_per_node: 1 << 10,
            dtes_per_node: 64,
            key_max: 16,
            value_max: 32,
            ..Geometry::default()
        }
    }

    #[test]
    fn every_mode_lays_out_its_regions() {
        let g = geometry();
        let cfg = ProtocolConfig::default();
        let rpc = RpcConfig::default();
        let single = |p: &Plan| ReplicaSet::single(2, p.view.index.ite);
        let cd = Plan::new(Mode::Cd, g.clone(), cfg.clone(), rpc).unwrap();
        assert!(cd.rpc.is_none() && cd.slot_pool().is_none());
        assert_eq!(cd.node_regions(&single(&cd)).unwrap(), g.table_regions());
        let sd = Plan::new(Mode::Sd { server_threads: 1 }, g.clone(), cfg.clone(), rpc).unwrap();
        let r = sd.node_regions(&single(&sd)).unwrap();
        assert_eq!(r.len(), sd::RESPONSE_REGION as usize + 1);
        assert!(r[sd::REQUEST_REGION as usize] > 0 && r[sd::RESPONSE_REGION as usize] > 0);
        let p = Plan::new(Mode::Pilaf { server_threads: 1 }, g, cfg, rpc).unwrap();
        assert!(p.pilaf_store(0).unwrap().is_some());
        assert!(sd.pilaf_store(0).unwrap().is_none());
    }

    #[test]
    fn a_bad_mode_or_a_replicated_baseline_is_refused() {
        let (g, cfg, rpc) = (geometry(), ProtocolConfig::default(), RpcConfig::default());
        let bad = Plan::new(Mode::Hy { server_threads: 0 }, g.clone(), cfg.clone(), rpc);
        assert!(bad.is_err());
        let sd = Plan::new(Mode::Sd { server_threads: 1 }, g, cfg.clone(), rpc).unwrap();
        let set = ReplicaSet::new(2, 2, sd.view.index.ite, &cfg).unwrap();
        let e = sd.node_regions(&set).unwrap_err().to_string();
        assert!(e.contains("keeps one copy"), "{e}");
    }
}
