//! A client worker of whichever protocol a cluster runs, assembled in one place.

use nessie_baselines::hy::HyClient;
use nessie_baselines::pilaf::PilafClient;
use nessie_baselines::sd::{ClientSlot, RpcShared, SdClient};
use nessie_protocols::cd::{CdClient, ClientStats};
use nessie_protocols::{
    unsupported, ClusterView, Cond, CondOutcome, Error, KvClient, ProtocolConfig, Version,
};

use crate::Mode;

/// A client worker of whichever protocol a cluster runs.
pub enum ModeClient<E: nessie_fabric::Endpoint> {
    Cd(CdClient<E>),
    Sd(SdClient<E>),
    Hy(HyClient<E>),
    Pilaf(PilafClient<E>),
}

/// What every client worker is built from, whatever the mode.
pub struct ClientParts<E> {
    /// An endpoint on the client's node.
    pub ep: E,
    pub view: std::sync::Arc<ClusterView>,
    /// The data table allocator of `ep`'s node (CD and HY workers write their DTEs with it).
    pub table: std::sync::Arc<nessie_store::classtable::ClassTable>,
    pub cfg: ProtocolConfig,
}

/// The request channel of a server-driven client (SD, HY): the node's shared RPC state and the
/// request slot leased for this client.
pub struct RpcLease {
    pub shared: std::sync::Arc<RpcShared>,
    pub slot: ClientSlot,
}

impl<E: nessie_fabric::Endpoint> ModeClient<E> {
    /// A client worker of `mode`: the one place each mode's client is assembled. `worker`
    /// hands out a worker id and is called only by the modes whose workers write DTEs (CD,
    /// HY); SD and HY need `rpc`.
    pub fn new(
        mode: Mode,
        parts: ClientParts<E>,
        worker: impl FnOnce() -> Result<u16, Error>,
        rpc: Option<RpcLease>,
    ) -> Result<Self, Error> {
        let ClientParts {
            ep,
            view,
            table,
            cfg,
        } = parts;
        let rpc = rpc.ok_or_else(|| {
            Error::Config(format!("{} clients need a request channel", mode.name()))
        });
        Ok(match mode {
            Mode::Cd => ModeClient::Cd(CdClient::new(ep, view, table, worker()?, cfg)?),
            Mode::Sd { .. } => {
                let r = rpc?;
                ModeClient::Sd(SdClient::new(ep, view, r.shared, r.slot)?)
            }
            Mode::Hy { .. } => {
                let r = rpc?;
                let w = worker()?;
                ModeClient::Hy(HyClient::new(ep, view, table, w, &cfg, r.shared, r.slot)?)
            }
            Mode::Pilaf { .. } => {
                let r = rpc?;
                ModeClient::Pilaf(PilafClient::new(ep, view, &cfg, r.shared, r.slot)?)
            }
        })
    }

    /// This client's fabric counters (its endpoint's).
    pub fn fabric_stats(&self) -> nessie_fabric::StatsSnapshot {
        match self {
            ModeClient::Cd(c) => c.endpoint().stats().snapshot(),
            ModeClient::Sd(c) => c.endpoint().stats().snapshot(),
            ModeClient::Hy(c) => c.endpoint().stats().snapshot(),
            ModeClient::Pilaf(c) => c.endpoint().stats().snapshot(),
        }
    }

    /// Attempts this client aborted (concurrent operation or timeout) and retries it made; the
    /// server-driven halves abort and retry on the servers, which count them there.
    pub fn aborts_retries(&self) -> (u64, u64) {
        let f = |s: ClientStats| (s.concurrent_aborts + s.timeouts, s.retries);
        match self {
            ModeClient::Cd(c) => KvClient::aborts_retries(c),
            ModeClient::Sd(_) => (0, 0),
            ModeClient::Hy(c) => f(c.stats().get),
            // Aborted: GET passes that failed a checksum; retried: those and the confirming
            // passes that met moving keys.
            ModeClient::Pilaf(c) => {
                let s = c.stats();
                (s.checksum_retries(), s.checksum_retries() + s.move_retries)
            }
        }
    }
}

impl<E: nessie_fabric::Endpoint> KvClient for ModeClient<E> {
    fn aborts_retries(&self) -> (u64, u64) {
        ModeClient::aborts_retries(self)
    }
    fn prefetch(&mut self, keys: &[&[u8]]) {
        if let ModeClient::Cd(c) = self {
            c.prefetch(keys)
        }
    }
    fn replaced_len(&self) -> Option<u32> {
        match self {
            ModeClient::Cd(c) => c.replaced_len(),
            _ => None,
        }
    }
    fn read_replaced(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        match self {
            ModeClient::Cd(c) => c.read_replaced(key, out),
            _ => Ok(false),
        }
    }
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        match self {
            ModeClient::Cd(c) => c.get(key),
            ModeClient::Sd(c) => c.get(key),
            ModeClient::Hy(c) => c.get(key),
            ModeClient::Pilaf(c) => c.get(key),
        }
    }
    fn get_into(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        match self {
            ModeClient::Cd(c) => c.get_into(key, out),
            ModeClient::Sd(c) => KvClient::get_into(c, key, out),
            ModeClient::Hy(c) => KvClient::get_into(c, key, out),
            ModeClient::Pilaf(c) => KvClient::get_into(c, key, out),
        }
    }
    fn get_into_at(&mut self, key: &[u8], out: &mut Vec<u8>, at: usize) -> Result<bool, Error> {
        match self {
            ModeClient::Cd(c) => c.get_into_at(key, out, at),
            ModeClient::Sd(c) => KvClient::get_into_at(c, key, out, at),
            ModeClient::Hy(c) => KvClient::get_into_at(c, key, out, at),
            ModeClient::Pilaf(c) => KvClient::get_into_at(c, key, out, at),
        }
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        match self {
            ModeClient::Cd(c) => c.put(key, value),
            ModeClient::Sd(c) => c.put(key, value),
            ModeClient::Hy(c) => c.put(key, value),
            ModeClient::Pilaf(c) => c.put(key, value),
        }
    }
    fn put_parts(&mut self, key: &[u8], parts: &[&[u8]]) -> Result<(), Error> {
        match self {
            ModeClient::Cd(c) => c.put_parts(key, parts),
            other => other.put(key, &parts.concat()),
        }
    }
    fn put_parts_expiring(&mut self, key: &[u8], parts: &[&[u8]], at: u64) -> Result<(), Error> {
        match self {
            ModeClient::Cd(c) => c.put_parts_expiring(key, parts, at),
            other => other.put(key, &parts.concat()),
        }
    }
    fn put_if_expiring(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: Cond,
        at: u64,
    ) -> Result<CondOutcome, Error> {
        match self {
            ModeClient::Cd(c) => c.put_if_expiring(key, value, cond, at),
            _ => Err(unsupported("a conditional write")),
        }
    }
    fn reclaim_expired_in(
        &mut self,
        slots: std::ops::Range<u64>,
    ) -> Result<Option<nessie_protocols::Reclaimed>, Error> {
        match self {
            ModeClient::Cd(c) => c.reclaim_expired_in(slots).map(Some),
            _ => Ok(None),
        }
    }
    fn reclaim_expired_in_noting(
        &mut self,
        slots: std::ops::Range<u64>,
        note: &mut dyn FnMut(&nessie_protocols::ScanNote),
    ) -> Result<Option<nessie_protocols::Reclaimed>, Error> {
        match self {
            ModeClient::Cd(c) => c.reclaim_expired_noting(slots, note).map(Some),
            _ => Ok(None),
        }
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        match self {
            ModeClient::Cd(c) => c.delete(key),
            ModeClient::Sd(c) => c.delete(key),
            ModeClient::Hy(c) => c.delete(key),
            ModeClient::Pilaf(c) => c.delete(key),
        }
    }
    fn get_versioned(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Version>, Error> {
        match self {
            ModeClient::Cd(c) => c.get_versioned(key, out),
            _ => Err(unsupported("a versioned read")),
        }
    }
    fn put_if(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        match self {
            ModeClient::Cd(c) => c.put_if(key, value, cond),
            _ => Err(unsupported("a conditional write")),
        }
    }
    fn delete_if(&mut self, key: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        match self {
            ModeClient::Cd(c) => c.delete_if(key, cond),
            _ => Err(unsupported("a conditional delete")),
        }
    }
    fn scan_keys(&mut self) -> Result<Vec<Vec<u8>>, Error> {
        match self {
            ModeClient::Cd(c) => c.scan_keys(),
            _ => Err(unsupported("a scan of every key")),
        }
    }
    fn scan_keys_in(&mut self, slots: std::ops::Range<u64>) -> Result<Vec<Vec<u8>>, Error> {
        match self {
            ModeClient::Cd(c) => c.scan_keys_in(slots),
            _ => Err(unsupported("a scan of index slots")),
        }
    }
    fn evicted(&self) -> &[Vec<u8>] {
        match self {
            ModeClient::Cd(c) => c.evicted(),
            _ => &[],
        }
    }
    fn evicted_unsure(&self) -> &[Vec<u8>] {
        match self {
            ModeClient::Cd(c) => c.evicted_unsure(),
            _ => &[],
        }
    }
}
