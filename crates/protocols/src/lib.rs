//! Nessie's protocols. [`cd`] is the client-driven protocol of the paper (GET, PUT, DELETE and
//! MIGRATE done entirely with one-sided fabric operations). The paper's two baselines live
//! beside it and share the store's layout and hashing (see `docs/baselines.md`):
//! [`sd`] (NessieSD, server-driven, HERD-like) and [`hy`] (NessieHY, client-driven GET and
//! server-driven PUT/DELETE, FaRM-KV-like), both over the partially coupled index, and
//! [`pilaf`] (Pilaf, ATC 2013: client-driven GETs verified by CRC64, server-driven writes into
//! its own checksummed hash table). [`Mode`] selects one per cluster.
//!
//! Every protocol is generic over `nessie_fabric::Endpoint` and never learns which fabric it
//! runs on.

/// `mutated!(cfg, name)`: whether the test-only mutation `name` is on in `cfg` (a
/// `ProtocolConfig` or an `sd` server's options). Without the `testing` feature there are no
/// mutations and it is the constant `false`, so production code carries no trace of them.
#[cfg(any(test, feature = "testing"))]
macro_rules! mutated {
    ($cfg:expr, $name:ident) => {
        $cfg.mutations.$name
    };
}
#[cfg(not(any(test, feature = "testing")))]
macro_rules! mutated {
    ($cfg:expr, $name:ident) => {{
        let _ = &$cfg;
        false
    }};
}

pub mod cd;
pub mod config;
pub mod error;
pub mod fence;
pub mod hooks;
pub mod hy;
pub mod pilaf;
pub mod replica;
pub mod sd;

#[cfg(any(test, feature = "testing"))]
pub use config::Mutations;
pub use config::{ConfigError, Optimizations, ProtocolConfig, RetryPolicy};
pub use error::Error;
pub use fence::{Fence, MovedCopy, NodeRole};
pub use hooks::HookPoint;
pub use replica::{CatchUp, ReplicaSet, Replicated};

/// A key's version: an opaque word, never 0, that changes with every write of the key (in the
/// CD protocol, the ITE word of the key's entry, `docs/layout.md`). A client reads it with
/// [`KvClient::get_versioned`] and makes a write conditional on it ([`Cond::Version`]).
pub type Version = u64;

/// The condition a conditional write ([`KvClient::put_if`], [`KvClient::delete_if`]) takes
/// effect under, evaluated atomically with the write (`docs/protocol.md`, guarded writes).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Cond {
    /// The key is absent (memcached `add`, Redis `SET NX`).
    Absent,
    /// The key is present, whatever its value (memcached `replace`, Redis `SET XX`).
    Present,
    /// The key is present at exactly this version (memcached `cas`, and every
    /// read-modify-write: `incr`, `append`, `touch`, `GETDEL`, `EXPIRE`).
    Version(Version),
}

impl Cond {
    /// Whether a key whose current version is `current` (`None`: absent) meets the condition.
    pub fn holds(self, current: Option<Version>) -> bool {
        match (self, current) {
            (Cond::Absent, c) => c.is_none(),
            (Cond::Present, c) => c.is_some(),
            (Cond::Version(v), c) => c == Some(v),
        }
    }
}

/// What a conditional write did.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CondOutcome {
    /// The condition held and the write took effect.
    Stored,
    /// The condition did not hold; nothing changed. `current`: the key's version when the
    /// condition was evaluated (`None`: absent).
    Unmet { current: Option<Version> },
}

/// The error of a conditional operation in a mode without it.
fn unsupported(what: &str) -> Error {
    Error::Unsupported(format!(
        "{what} needs conditional writes, which only the client-driven (cd) mode offers"
    ))
}

/// What every protocol's client offers: the key-value API. Workloads, stress tests and
/// benchmarks drive clients through it, whatever the protocol and fabric.
pub trait KvClient: Send {
    /// Read `key`; `Ok(None)` if absent.
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error>;
    /// Read `key` into `out` (its contents replaced, its allocation reused); false if absent.
    fn get_into(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        out.clear();
        Ok(match self.get(key)? {
            Some(v) => {
                out.extend_from_slice(&v);
                true
            }
            None => false,
        })
    }
    /// Read `key` into `out` from `at` on: `out[..at]` is kept and `out` ends with the value
    /// (bytes from `at` on are overwritten; `at` at most `out.len()`); false if absent, `out`
    /// then `at` long. A front end reads a value straight into its reply buffer with it.
    fn get_into_at(&mut self, key: &[u8], out: &mut Vec<u8>, at: usize) -> Result<bool, Error> {
        assert!(
            at <= out.len(),
            "get_into_at: {at} is past the buffer's end"
        );
        out.truncate(at);
        Ok(match self.get(key)? {
            Some(v) => {
                out.extend_from_slice(&v);
                true
            }
            None => false,
        })
    }
    /// Store `value` under `key`.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error>;
    /// Store the concatenation of `parts` under `key`. The client-driven store writes the parts
    /// into the entry as they are; other clients assemble them first.
    fn put_parts(&mut self, key: &[u8], parts: &[&[u8]]) -> Result<(), Error> {
        self.put(key, &parts.concat())
    }
    /// Remove `key` (no-op if absent).
    fn delete(&mut self, key: &[u8]) -> Result<(), Error>;
    /// Read `key` into `out` (its contents replaced) with its version; `None` if absent.
    fn get_versioned(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Version>, Error> {
        let _ = (key, out);
        Err(unsupported("a versioned read"))
    }
    /// Store `value` under `key` if `cond` holds, atomically.
    fn put_if(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        let _ = (key, value, cond);
        Err(unsupported("a conditional write"))
    }
    /// Remove `key` if `cond` holds, atomically.
    fn delete_if(&mut self, key: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        let _ = (key, cond);
        Err(unsupported("a conditional delete"))
    }
    /// Every key in the store, by a scan of the whole index (not atomic: keys written or
    /// deleted meanwhile may or may not be listed).
    fn scan_keys(&mut self) -> Result<Vec<Vec<u8>>, Error> {
        Err(unsupported("a scan of every key"))
    }
}

impl<T: KvClient + ?Sized> KvClient for Box<T> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        (**self).get(key)
    }
    fn get_into(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        (**self).get_into(key, out)
    }
    fn get_into_at(&mut self, key: &[u8], out: &mut Vec<u8>, at: usize) -> Result<bool, Error> {
        (**self).get_into_at(key, out, at)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        (**self).put(key, value)
    }
    fn put_parts(&mut self, key: &[u8], parts: &[&[u8]]) -> Result<(), Error> {
        (**self).put_parts(key, parts)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        (**self).delete(key)
    }
    fn get_versioned(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Version>, Error> {
        (**self).get_versioned(key, out)
    }
    fn put_if(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        (**self).put_if(key, value, cond)
    }
    fn delete_if(&mut self, key: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        (**self).delete_if(key, cond)
    }
    fn scan_keys(&mut self) -> Result<Vec<Vec<u8>>, Error> {
        (**self).scan_keys()
    }
}

/// Which protocol a cluster runs (fixed per cluster: SD and HY need the coupled index and the
/// request/response regions).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Nessie: client-driven, decoupled index.
    #[default]
    Cd,
    /// NessieSD: server-driven, coupled index, `server_threads` polling threads per node.
    Sd { server_threads: u16 },
    /// NessieHY: client-driven GET, server-driven PUT/DELETE, coupled index.
    Hy { server_threads: u16 },
    /// Pilaf: client-driven GET verified by CRC64, server-driven PUT/DELETE into the owner's
    /// own hash table and extents (`pilaf`).
    Pilaf { server_threads: u16 },
}

impl Mode {
    /// Where a key's index entries live in this mode.
    pub fn placement(&self) -> nessie_store::index::Placement {
        match self {
            Mode::Cd => nessie_store::index::Placement::Decoupled,
            // Pilaf uses the coupled index's owner hash to route keys to nodes.
            Mode::Sd { .. } | Mode::Hy { .. } | Mode::Pilaf { .. } => {
                nessie_store::index::Placement::Coupled
            }
        }
    }

    /// Server threads per node (0 for CD).
    pub fn server_threads(&self) -> u16 {
        match *self {
            Mode::Cd => 0,
            Mode::Sd { server_threads }
            | Mode::Hy { server_threads }
            | Mode::Pilaf { server_threads } => server_threads,
        }
    }

    /// The protocol configuration the server threads execute with: the mode's, with the
    /// server's non-sleeping retries ([`RetryPolicy::SERVER`]).
    pub fn server_config(&self, cfg: &ProtocolConfig) -> ProtocolConfig {
        let mode_cfg = match self {
            Mode::Hy { .. } => hy::hy_config(cfg),
            // Every DTE a server touches is local, so a cache would never be consulted.
            _ => ProtocolConfig {
                cache_entries: 0,
                ..cfg.clone()
            },
        };
        ProtocolConfig {
            retry: RetryPolicy::SERVER,
            ..mode_cfg
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Mode::Cd => "cd",
            Mode::Sd { .. } => "sd",
            Mode::Hy { .. } => "hy",
            Mode::Pilaf { .. } => "pilaf",
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let t = self.server_threads();
        if *self != Mode::Cd && !(1..=sd::MAX_SERVER_THREADS).contains(&t) {
            return Err(ConfigError::ServerThreads(t));
        }
        Ok(())
    }
}

/// A client worker of whichever protocol a cluster runs.
pub enum ModeClient<E: nessie_fabric::Endpoint> {
    Cd(cd::CdClient<E>),
    Sd(sd::SdClient<E>),
    Hy(hy::HyClient<E>),
    Pilaf(pilaf::PilafClient<E>),
}

/// What every client worker is built from, whatever the mode.
pub struct ClientParts<E> {
    /// An endpoint on the client's node.
    pub ep: E,
    pub view: std::sync::Arc<cd::ClusterView>,
    /// The data table allocator of `ep`'s node (CD and HY workers write their DTEs with it).
    pub table: std::sync::Arc<nessie_store::classtable::ClassTable>,
    pub cfg: ProtocolConfig,
}

/// The request channel of a server-driven client (SD, HY): the node's shared RPC state and the
/// request slot leased for this client.
pub struct RpcLease {
    pub shared: std::sync::Arc<sd::RpcShared>,
    pub slot: sd::ClientSlot,
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
            Mode::Cd => ModeClient::Cd(cd::CdClient::new(ep, view, table, worker()?, cfg)?),
            Mode::Sd { .. } => {
                let r = rpc?;
                ModeClient::Sd(sd::SdClient::new(ep, view, r.shared, r.slot)?)
            }
            Mode::Hy { .. } => {
                let r = rpc?;
                let w = worker()?;
                ModeClient::Hy(hy::HyClient::new(
                    ep, view, table, w, &cfg, r.shared, r.slot,
                )?)
            }
            Mode::Pilaf { .. } => {
                let r = rpc?;
                ModeClient::Pilaf(pilaf::PilafClient::new(ep, view, &cfg, r.shared, r.slot)?)
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
        let f = |s: cd::ClientStats| (s.concurrent_aborts + s.timeouts, s.retries);
        match self {
            ModeClient::Cd(c) => f(c.stats()),
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
}

impl<E: nessie_fabric::Endpoint> KvClient for sd::SdClient<E> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        sd::SdClient::get(self, key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        sd::SdClient::put(self, key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        sd::SdClient::delete(self, key)
    }
}

impl<E: nessie_fabric::Endpoint> KvClient for hy::HyClient<E> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        hy::HyClient::get(self, key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        hy::HyClient::put(self, key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        hy::HyClient::delete(self, key)
    }
}

impl<E: nessie_fabric::Endpoint> KvClient for pilaf::PilafClient<E> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        pilaf::PilafClient::get(self, key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        pilaf::PilafClient::put(self, key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        pilaf::PilafClient::delete(self, key)
    }
}

impl<E: nessie_fabric::Endpoint> KvClient for cd::CdClient<E> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        cd::CdClient::get(self, key)
    }
    fn get_into(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        cd::CdClient::get_into(self, key, out)
    }
    fn get_into_at(&mut self, key: &[u8], out: &mut Vec<u8>, at: usize) -> Result<bool, Error> {
        cd::CdClient::get_into_at(self, key, out, at)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        cd::CdClient::put(self, key, value)
    }
    fn put_parts(&mut self, key: &[u8], parts: &[&[u8]]) -> Result<(), Error> {
        cd::CdClient::put_parts(self, key, parts)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        cd::CdClient::delete(self, key)
    }
    fn get_versioned(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Version>, Error> {
        cd::CdClient::get_versioned(self, key, out)
    }
    fn put_if(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        cd::CdClient::put_if(self, key, value, cond)
    }
    fn delete_if(&mut self, key: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        cd::CdClient::delete_if(self, key, cond)
    }
    fn scan_keys(&mut self) -> Result<Vec<Vec<u8>>, Error> {
        cd::CdClient::scan_keys(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Server threads never sleep long on a conflict (every slot they serve would wait), and
    /// keep at least the clients' patience; the rest of the configuration is the mode's.
    #[test]
    fn server_threads_retry_without_sleeping() {
        let cfg = ProtocolConfig::default();
        for mode in [
            Mode::Sd { server_threads: 2 },
            Mode::Hy { server_threads: 2 },
        ] {
            let s = mode.server_config(&cfg);
            assert!(s.retry.max_backoff_ns <= 10_000, "{mode:?}");
            let patience = |r: RetryPolicy| r.max_attempts as u64 * r.max_backoff_ns;
            assert!(patience(s.retry) >= patience(cfg.retry) / 10, "{mode:?}");
            assert_eq!((s.cache_entries, s.expiry_ns), (0, cfg.expiry_ns));
        }
        let hy = Mode::Hy { server_threads: 1 }.server_config(&cfg);
        assert_eq!(hy.optimizations, Optimizations::NONE);
    }
}
