//! What the front ends share to serve a connection: where its store client comes from
//! ([`Backend`], one client leased per batch of requests with [`BatchClient`]), the counters
//! `stats` and `INFO` report ([`Counters`]), the most replies a session holds ([`FLUSH_AT`]),
//! and the clock expiry times are read on.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

pub use nessie_inflight::{Op, Outcome};
use nessie_protocols::KvClient;

/// Replies a session holds before it stops serving, until they are written (a multi-key get
/// of large values, or a client pipelining requests and not reading, would otherwise make it
/// hold all of theirs): a multi-key read stops between two keys and goes on from the next.
pub const FLUSH_AT: usize = 1 << 20;

/// Most operations of a pipelined batch queued to run together (`redis::serve`'s and
/// `memcached::serve`'s `batch`).
pub const MAX_QUEUED: usize = 64;

/// Most bytes of values a queue's GETs may answer with, at the largest value each: a session
/// holds at most this beyond [`FLUSH_AT`] (8 GETs with the default 1 MiB item limit, 64 with
/// values up to 128 KiB).
pub const QUEUED_REPLY_MAX: usize = 8 << 20;

/// Most GETs (keys) one queue holds with values up to `max_value` bytes: at least one.
pub fn queued_gets_max(max_value: usize) -> usize {
    (QUEUED_REPLY_MAX / max_value.max(1)).clamp(1, MAX_QUEUED)
}

/// A store client lent by a [`Backend`]: it goes back when the lease is dropped (unwinding
/// included).
pub trait Lease {
    /// The client.
    fn client(&mut self) -> &mut dyn KvClient;
}

/// A client behind a lock is leased for as long as the lock is held.
impl<C: KvClient> Lease for std::sync::MutexGuard<'_, C> {
    fn client(&mut self) -> &mut dyn KvClient {
        &mut **self
    }
}

/// Where a connection gets its store client.
pub trait Backend: Send + Sync {
    /// A client of the store, waiting for one to be free.
    fn lease(&self) -> Box<dyn Lease + '_>;

    /// Operations [`Backend::run_concurrently`] runs at once on this thread: 0 if it runs
    /// none (the default), and pipelined batches are served one command at a time.
    fn concurrency(&self) -> usize {
        0
    }

    /// Run `ops` (taken out of it) with up to [`Backend::concurrency`] in flight, operations on
    /// one key in the order given, pushing each result to `done` in `ops`' order. `false`, and
    /// `ops` untouched, if it cannot now (the caller runs them on its leased client).
    fn run_concurrently(
        &self,
        ops: &mut Vec<Op>,
        done: &mut Vec<Result<Outcome, nessie_protocols::Error>>,
    ) -> bool {
        let _ = (ops, done);
        false
    }
}

/// A connection's client for one batch of requests (everything served from one read): leased
/// from the [`Backend`] at the batch's first store operation, and given back by
/// [`BatchClient::end`] when the batch ends, so that a pipeline of N commands takes the pool's
/// lock once, not N times. A batch that needs no store (`PING`, `version`) leases nothing.
pub struct BatchClient<'a> {
    backend: &'a dyn Backend,
    lease: Option<Box<dyn Lease + 'a>>,
}

impl<'a> BatchClient<'a> {
    pub fn new(backend: &'a dyn Backend) -> Self {
        Self {
            backend,
            lease: None,
        }
    }

    /// Run `f` with this batch's client (leased now if it is the batch's first use).
    pub fn with<T>(&mut self, f: impl FnOnce(&mut dyn KvClient) -> T) -> T {
        let backend = self.backend;
        f(self.lease.get_or_insert_with(|| backend.lease()).client())
    }

    /// The batch is served: give the client back.
    pub fn end(&mut self) {
        self.lease = None;
    }

    /// Operations the backend runs at once for [`BatchClient::run_all`] (0: one at a time).
    pub fn concurrency(&self) -> usize {
        self.backend.concurrency()
    }

    /// Run `ops` (emptied) and push their results to `done` in order: concurrently if the
    /// backend can, else one after the other on this batch's client.
    pub fn run_all(
        &mut self,
        ops: &mut Vec<Op>,
        done: &mut Vec<Result<Outcome, nessie_protocols::Error>>,
    ) {
        let before = done.len();
        // The client goes back while the batch runs on others: other connections may use it.
        self.lease = None;
        if self.backend.run_concurrently(ops, done) {
            assert!(ops.is_empty(), "a concurrent run takes every operation");
            return;
        }
        assert_eq!(
            done.len(),
            before,
            "a refused concurrent run answers nothing"
        );
        self.with(|c| done.extend(ops.iter().map(|op| op.run(c))));
        ops.clear();
    }
}

/// What the store behind a front end says about itself, for `stats` and `INFO`: node-wide
/// figures the front end does not count itself.
pub trait StoreGauges: Send + Sync + std::fmt::Debug {
    /// Items the node's writers have evicted (memcached `evictions`, Redis `evicted_keys`).
    fn evictions(&self) -> u64;
    /// Pages the node's writers drained for another size class (memcached `slabs_moved`).
    fn pages_moved(&self) -> u64 {
        0
    }
    /// The eviction policy, by Redis's name (`maxmemory-policy`).
    fn eviction_policy(&self) -> &'static str;
    /// Entries sampled per victim (`maxmemory-samples`; Redis's default 5 unless told).
    fn eviction_samples(&self) -> u8 {
        5
    }
    /// Whether GETs keep access words under the policy, so that the reclaimer can tell
    /// expired items never read (`expired_unfetched`).
    fn tracks_access(&self) -> bool;
    /// The node's tables now.
    fn figures(&self) -> StoreFigures;
}

/// A node's tables at one moment (`docs/frontends.md`, "Counters"). A cluster's items and
/// memory are the sums over its nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreFigures {
    /// Items whose index entry is in this node's index table (memcached `curr_items`); every
    /// item has one, on one node. Expired items not reclaimed yet count, as in memcached.
    pub items: u64,
    /// Bytes of the data entries this node's writers hold, wherever they are, old versions
    /// waiting out their expiry period included (memcached `bytes`).
    pub bytes: u64,
    /// Bytes of this node's data table claimed by a size class (Redis `used_memory`).
    pub used_bytes: u64,
    /// Bytes of this node's data table (memcached `limit_maxbytes`, Redis `maxmemory`).
    pub limit_bytes: u64,
}

/// Counters shared by a front end's connections (`stats`).
#[derive(Debug, Default)]
pub struct Counters {
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
    pub cmd_get: AtomicU64,
    pub cmd_set: AtomicU64,
    pub get_hits: AtomicU64,
    pub get_misses: AtomicU64,
    pub delete_hits: AtomicU64,
    pub delete_misses: AtomicU64,
    /// Expired items deleted in the background by the node's reclaimer (memcached `stats`
    /// `reclaimed`, Redis `INFO stats` `expired_keys`).
    pub reclaimed: AtomicU64,
    /// Of them, never read since written (memcached `expired_unfetched`; counted under the
    /// policies that keep access words only, [`StoreGauges::tracks_access`]).
    pub expired_unfetched: AtomicU64,
    /// When the front end started (Unix seconds).
    pub started: AtomicU64,
    /// The store's own figures, set once by the node that serves the front end (unset: a
    /// store that evicts nothing, as in tests).
    pub store: std::sync::OnceLock<Arc<dyn StoreGauges>>,
}

impl Counters {
    /// Items the store's writers evicted (0 without a store's gauges).
    pub fn evictions(&self) -> u64 {
        self.store.get().map_or(0, |s| s.evictions())
    }

    /// Pages the store's writers drained for another size class (0 without gauges).
    pub fn pages_moved(&self) -> u64 {
        self.store.get().map_or(0, |s| s.pages_moved())
    }

    /// The store's tables now (zeros without a store's gauges).
    pub fn figures(&self) -> StoreFigures {
        self.store
            .get()
            .map_or_else(StoreFigures::default, |s| s.figures())
    }

    /// Whether the store's policy keeps access words (not without a store's gauges).
    pub fn tracks_access(&self) -> bool {
        self.store.get().is_some_and(|s| s.tracks_access())
    }

    /// Entries the store's evictions sample per victim (5 without a store's gauges).
    pub fn eviction_samples(&self) -> u8 {
        self.store.get().map_or(5, |s| s.eviction_samples())
    }

    /// The store's eviction policy (`noeviction` without a store's gauges).
    pub fn eviction_policy(&self) -> &'static str {
        self.store
            .get()
            .map_or("noeviction", |s| s.eviction_policy())
    }
}

/// Unix seconds now.
pub fn unix_now() -> u64 {
    unix_now_ms() / 1000
}

/// Unix milliseconds now.
pub fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::memcached::serve::{self as mc, Limits};
    use crate::redis::serve::{self as redis, RespLimits};
    use crate::testing::{CountingBackend, Pipe};

    /// The clients a connection leased to serve `input`, delivered `chunk` bytes per read,
    /// and its replies.
    fn leases(redis: bool, input: &[u8], chunk: usize) -> (usize, String) {
        let b = CountingBackend::default();
        let mut p = Pipe::new(input, chunk);
        let counters = Counters::default();
        if redis {
            let l = RespLimits {
                max_key: 32,
                max_value: 2000,
            };
            redis::serve(&mut p, &b, l, &counters, 1).unwrap();
        } else {
            let l = Limits {
                max_key: 250,
                max_data: 2000,
            };
            mc::serve(&mut p, &b, l, &counters).unwrap();
        }
        let out = String::from_utf8(p.output).unwrap();
        (b.leases.load(Ordering::Relaxed), out)
    }

    #[test]
    fn a_batch_of_requests_leases_one_client() {
        let mc = b"set a 0 0 1\r\nx\r\nget a\r\nget a b\r\ndelete a\r\nflush_all\r\n";
        let (n, out) = leases(false, mc, 1 << 16);
        assert_eq!(n, 1, "{out}");
        assert_eq!(
            out,
            "STORED\r\nVALUE a 0 1\r\nx\r\nEND\r\nVALUE a 0 1\r\nx\r\nEND\r\nDELETED\r\nOK\r\n"
        );
        // A read per byte: a batch per read that completes a request.
        let (n, _) = leases(false, b"get a\r\nget b\r\n", 1);
        assert_eq!(n, 2);
        // No store, no lease.
        let (n, _) = leases(false, b"version\r\nmn\r\n", 1 << 16);
        assert_eq!(n, 0);
        let resp = b"SET a x\r\nGET a\r\nDBSIZE\r\nFLUSHALL\r\nPING\r\n";
        let (n, out) = leases(true, resp, 1 << 16);
        assert_eq!(n, 1, "{out}");
        assert_eq!(out, "+OK\r\n$1\r\nx\r\n:1\r\n+OK\r\n+PONG\r\n");
        let (n, _) = leases(true, b"PING\r\nECHO e\r\n", 1 << 16);
        assert_eq!(n, 0);
    }
}
