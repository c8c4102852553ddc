//! The hybrid baseline, NessieHY (FaRM-KV-like; reference section 4.5): GET is client-driven —
//! the client-driven GET of `nessie_protocols::cd`, run by the client over the *coupled* index with filter
//! bits, cache, previous versions and multi-read all off, as in the paper — while PUT and
//! DELETE are server-driven exactly as in NessieSD (`crate::sd`): requests to the key's owner,
//! executed there by server threads (which also run with those optimisations off).
//!
//! With the coupled index a key's ITEs and DTEs all live on its owner, so a remote GET costs
//! ITE READs plus whole-DTE READs on that one node; a GET of a key owned by the client's node
//! reads its DTEs directly from local memory.

use std::sync::Arc;

use nessie_fabric::{Endpoint, NodeId};
use nessie_store::classtable::ClassTable;

use crate::sd::client::{check_sizes, owner, require_coupled, Channel};
use crate::sd::slots::OpCode;
use crate::sd::{ClientSlot, RpcShared, RpcStats};
use nessie_protocols::cd::{CdClient, ClientStats, ClusterView};
use nessie_protocols::config::{Optimizations, ProtocolConfig};
use nessie_protocols::Error;

/// The protocol configuration HY runs with (client GETs and server threads alike): `cfg` with
/// every optimisation of the paper off.
pub fn hy_config(cfg: &ProtocolConfig) -> ProtocolConfig {
    ProtocolConfig {
        optimizations: Optimizations::NONE,
        cache_entries: 0,
        ..cfg.clone()
    }
}

/// Counters of one HY client worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HyClientStats {
    /// The client-driven GETs' counters (`gets`, aborts, retries, timeouts, ...).
    pub get: ClientStats,
    pub puts: u64,
    pub deletes: u64,
    /// The server-driven PUTs' and DELETEs' requests.
    pub rpc: RpcStats,
}

/// One client worker of the hybrid protocol.
pub struct HyClient<E: Endpoint> {
    /// Client-driven GETs; its endpoint also carries the write requests.
    cd: CdClient<E>,
    chan: Channel,
    puts: u64,
    deletes: u64,
}

impl<E: Endpoint> HyClient<E> {
    /// A client worker on `ep`'s node. `view` must use the coupled index; `table` is the node's
    /// data table and `worker` a worker id unique on the node (the GET worker never writes a
    /// DTE, but the client-driven worker is built the same way). `cfg`'s optimisations are
    /// switched off (see [`hy_config`]).
    pub fn new(
        ep: E,
        view: Arc<ClusterView>,
        table: Arc<ClassTable>,
        worker: u16,
        cfg: &ProtocolConfig,
        shared: Arc<RpcShared>,
        slot: ClientSlot,
    ) -> Result<Self, Error> {
        require_coupled(&view)?;
        let chan = Channel::new(shared, ep.node(), ep.node_count(), slot)?;
        let cd = CdClient::new(ep, view, table, worker, hy_config(cfg))?;
        Ok(Self {
            cd,
            chan,
            puts: 0,
            deletes: 0,
        })
    }

    /// Client-driven GET (forward pass over the owner's candidates, reverse pass on a miss).
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.cd.get(key)
    }

    /// Server-driven PUT.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        check_sizes(self.cd.view(), key, Some(value))?;
        self.puts += 1;
        let owner = owner(self.cd.view(), key);
        self.chan
            .call(self.cd.endpoint_mut(), owner, OpCode::Put, key, value)
            .map(|_| ())
    }

    /// Server-driven DELETE.
    pub fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        check_sizes(self.cd.view(), key, None)?;
        self.deletes += 1;
        let owner = owner(self.cd.view(), key);
        self.chan
            .call(self.cd.endpoint_mut(), owner, OpCode::Delete, key, &[])
            .map(|_| ())
    }

    pub fn stats(&self) -> HyClientStats {
        HyClientStats {
            get: self.cd.stats(),
            puts: self.puts,
            deletes: self.deletes,
            rpc: self.chan.stats,
        }
    }

    pub fn node(&self) -> NodeId {
        self.cd.node()
    }

    /// This client's slot number on its node.
    pub fn slot(&self) -> u16 {
        self.chan.local()
    }

    pub fn endpoint(&self) -> &E {
        self.cd.endpoint()
    }

    pub fn view(&self) -> &Arc<ClusterView> {
        self.cd.view()
    }

    /// The client-driven GET worker (e.g. to install a test hook).
    pub fn get_worker(&mut self) -> &mut CdClient<E> {
        &mut self.cd
    }
}
