//! The client-driven (CD) Nessie protocol: Appendix A of the reference, one file per operation.
//!
//! - [`get`]: A.1.2 (forward pass with filter bits, local/cache/remote DTEs and previous
//!   versions; reverse pass on a miss),
//! - [`write`]: A.1.3 PUT and A.1.5 DELETE (candidate search, local DTE, CAS, duplicate
//!   clearing, reverse pass, set valid, recycling),
//! - [`migrate`]: A.1.4 (recursive, with every abort and clean-up path),
//! - `abandoned`: completing writes whose writer crashed or gave up (past their deadline),
//!   so that no key stays wedged.
//!
//! A [`CdClient`] is one client worker: it owns one fabric endpoint, one DTE cache and one
//! writer tag, and runs one operation at a time (blocking), like the paper's client workers.

mod abandoned;
mod access;
pub mod evict;
pub mod get;
mod guarded;
pub mod migrate;
pub mod prefetch;
mod scan;
#[cfg(test)]
pub(crate) mod testkit;
pub mod write;

use std::sync::Arc;

use nessie_fabric::{Endpoint, NodeId};
use nessie_store::cache::{CacheStats, DteCache};
use nessie_store::classtable::{ClassAllocError, ClassTable};
use nessie_store::dte::WriterTag;
use nessie_store::Ite;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::config::{ProtocolConfig, TABLE_FULL_MIN_WAIT_NS, TABLE_FULL_WAIT_PERIODS};
use crate::error::Error;
use crate::fence::Fence;
#[cfg(any(test, feature = "testing"))]
use crate::hooks::Hook;
use crate::hooks::HookPoint;
use access::ValueAt;

pub use crate::view::ClusterView;

/// Why one attempt of an operation stopped early.
#[derive(Debug)]
pub(crate) enum Abort {
    /// A concurrent operation interfered; retry after a back-off.
    Concurrent(&'static str),
    /// The attempt outlived the expiry period; retry.
    Timeout,
    /// No data table has room for the entry right now.
    TableFull(ClassAllocError),
    /// A migration found no destination for its source (internal: try another source).
    NoDestination,
    /// Give up with this error.
    Fatal(Error),
}

impl From<nessie_fabric::FabricError> for Abort {
    fn from(e: nessie_fabric::FabricError) -> Self {
        Abort::Fatal(e.into())
    }
}

pub(crate) type Attempt<T> = Result<T, Abort>;

/// Counters of one client worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClientStats {
    pub gets: u64,
    pub puts: u64,
    pub deletes: u64,
    /// Attempts that aborted because of a concurrent operation.
    pub concurrent_aborts: u64,
    /// Attempts that aborted on their timer.
    pub timeouts: u64,
    /// Retries performed by the retry wrapper.
    pub retries: u64,
    /// Successful migrations (each level counts).
    pub migrations: u64,
    /// Successful migrations below the top level (recursive ones).
    pub recursive_migrations: u64,
    /// GETs answered from a previous version.
    pub previous_version_hits: u64,
    /// DTEs marked for recycling.
    pub recycled: u64,
    /// DTEs that could not be released after an operation gave up (see `write.rs`).
    pub leaked: u64,
    /// Abandoned writes (another client's past their deadline, or our own when giving up)
    /// this client completed by rolling them forward (see `abandoned.rs`).
    pub rolled_forward: u64,
    /// Waits because no data table had room for a write's DTE.
    pub table_full_waits: u64,
    /// Items this client evicted (`evict.rs`).
    pub evictions: u64,
    /// Pages this client chose to drain for another size class (`evict.rs`, the page mover).
    pub pages_moved: u64,
    /// Access words GETs wrote (`ProtocolConfig::eviction` LRU or LFU).
    pub access_writes: u64,
    /// Another writer's in-progress entry of the key a PUT's Step 4 cleared: that write is
    /// ordered just before this one if it commits, and what it wrote is not among what this
    /// PUT reports it replaced (`Self::replaced_len`).
    pub cleared_in_progress: u64,
}

impl std::ops::AddAssign for ClientStats {
    fn add_assign(&mut self, o: Self) {
        let ClientStats {
            gets,
            puts,
            deletes,
            concurrent_aborts,
            timeouts,
            retries,
            migrations,
            recursive_migrations,
            previous_version_hits,
            recycled,
            leaked,
            rolled_forward,
            table_full_waits,
            evictions,
            pages_moved,
            access_writes,
            cleared_in_progress,
        } = o;
        self.gets += gets;
        self.puts += puts;
        self.deletes += deletes;
        self.concurrent_aborts += concurrent_aborts;
        self.timeouts += timeouts;
        self.retries += retries;
        self.migrations += migrations;
        self.recursive_migrations += recursive_migrations;
        self.previous_version_hits += previous_version_hits;
        self.recycled += recycled;
        self.leaked += leaked;
        self.rolled_forward += rolled_forward;
        self.table_full_waits += table_full_waits;
        self.evictions += evictions;
        self.pages_moved += pages_moved;
        self.cleared_in_progress += cleared_in_progress;
        self.access_writes += access_writes;
    }
}

/// The operation timer (Step 0 of every operation): an attempt must finish within one expiry
/// period of its start, because that is how long the DTEs it saw are guaranteed not to be reused.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Deadline {
    start_ns: u64,
    limit_ns: u64,
    ignore: bool,
}

/// The valid entry the last plain PUT replaced (`CdClient::read_replaced`).
#[derive(Copy, Clone, Debug)]
pub(crate) struct Replaced {
    /// Its ITE word.
    ite: Ite,
    /// Its value's length, from the header the PUT read.
    value_len: u32,
    /// When the PUT's successful attempt began: the entry was marked for recycling after, so
    /// it cannot be reused before this plus an expiry period.
    since_ns: u64,
}

/// One client worker of the client-driven protocol.
pub struct CdClient<E: Endpoint> {
    ep: E,
    view: Arc<ClusterView>,
    table: Arc<ClassTable>,
    cfg: ProtocolConfig,
    tag: WriterTag,
    cache: DteCache,
    /// The entries the last [`Self::prefetch`] read (`prefetch.rs`; disabled where the DTE
    /// cache would be).
    prefetched: DteCache,
    rng: SmallRng,
    #[cfg(any(test, feature = "testing"))]
    hook: Option<Hook>,
    stats: ClientStats,
    /// Membership: whether this node may act, and whose writers are gone.
    fence: Arc<Fence>,
    /// Scratch buffer for DTE reads: headers and keys, and whole entries read at once.
    buf: Vec<u8>,
    /// Scratch buffer a value read on its own lands in, from `vbase` on; during `get_into`,
    /// the caller's.
    vbuf: Vec<u8>,
    /// Where in `vbuf` a value read on its own starts (0 but during `get_into_at`).
    vbase: usize,
    /// Scratch buffer for DTE writes.
    wbuf: Vec<u8>,
    /// A plain write's state, kept empty between writes so that its buffers are reused.
    spare_write_state: write::WriteState,
    /// Whether operation timers start on the coarse clock: the expiry period is at least
    /// [`COARSE_START_MIN_LAGS`] of its normal lag, so starting early costs little of it.
    coarse_start: bool,
    /// The last attempt timed out: the next timer starts on the precise clock, so that a
    /// coarse clock far behind (ticks held up) cannot time out every attempt.
    timed_out: bool,
    /// An eviction is running (its DELETEs must not evict in turn: `evict.rs`).
    evicting: bool,
    /// Scratch buffer for the values an eviction reads with their versions.
    evict_buf: Vec<u8>,
    /// Keys the last write evicted (`KvClient::evicted`: histories record them as DELETEs).
    evicted: Vec<Vec<u8>>,
    /// Keys whose eviction by the last write may or may not have taken effect.
    evicted_unsure: Vec<Vec<u8>>,
    /// The expiry the PUT in progress gives its entry (ns since the Unix epoch; 0 = never):
    /// set by [`Self::put_parts_expiring`] and [`Self::put_if_expiring`] for their call only.
    write_expires: u64,
    /// Reads find expired items as they are, not absent: what an eviction or a reclaim needs
    /// to delete one conditionally on its version.
    see_expired: bool,
    /// The valid entry the last plain PUT replaced, if it did.
    replaced: Option<Replaced>,
}

/// How many coarse-clock lags (ticks) an expiry period must span before operation timers start
/// on the coarse clock: 32 ticks of 4 ms is 128 ms, of which a timer loses at most 3%.
pub const COARSE_START_MIN_LAGS: u64 = 32;

impl<E: Endpoint> CdClient<E> {
    /// A client worker on `ep`'s node. `table` must be that node's allocator and `worker` must
    /// be unique among the node's live client workers (it tags the DTEs this worker writes).
    pub fn new(
        ep: E,
        view: Arc<ClusterView>,
        table: Arc<ClassTable>,
        worker: u16,
        cfg: ProtocolConfig,
    ) -> Result<Self, Error> {
        cfg.validate()?;
        if table.node() != ep.node() {
            return Err(Error::Config(format!(
                "client on node {} was given the data table allocator of node {}",
                ep.node(),
                table.node()
            )));
        }
        if *table.classes() != *view.classes {
            return Err(Error::Config(
                "the data table allocator's size classes differ from the cluster's".into(),
            ));
        }
        if ep.node_count() != view.geometry.nodes as usize {
            return Err(Error::Config(format!(
                "fabric has {} nodes but the geometry says {}",
                ep.node_count(),
                view.geometry.nodes
            )));
        }
        // Over shared memory a cache hit copies as much as the READ it saves (and every miss
        // pays a copy into the cache): 16 KiB GETs ran 1.32x faster without it.
        let caches = cfg.optimizations.cache && !ep.reads_are_local_copies();
        let cache = DteCache::new(if caches { cfg.cache_entries } else { 0 });
        // Only where a batch's READs overlap and extra READs are cheap (RDMA verbs): over tcp,
        // where the target's CPU serves each READ, a 200,000-byte GET through the Redis front
        // end ran at 0.48x with it (`docs/large-values.md`, "Reading chunks ahead").
        let prefetches = caches && ep.overlaps_batches(nessie_store::DATA_REGION);
        let prefetched = DteCache::new(if prefetches {
            prefetch::MAX_PREFETCH_KEYS
        } else {
            0
        });
        let tag = WriterTag::new(ep.node(), worker);
        let seed = (ep.node() as u64) << 32 | worker as u64 | ep.now_ns() << 1;
        let coarse_start = cfg.expiry_ns / COARSE_START_MIN_LAGS >= ep.coarse_lag_ns();
        Ok(Self {
            ep,
            view,
            table,
            cfg,
            tag,
            cache,
            prefetched,
            rng: SmallRng::seed_from_u64(seed),
            #[cfg(any(test, feature = "testing"))]
            hook: None,
            stats: ClientStats::default(),
            fence: Arc::new(Fence::unfenced()),
            buf: Vec::new(),
            vbuf: Vec::new(),
            vbase: 0,
            wbuf: Vec::new(),
            spare_write_state: write::WriteState::default(),
            coarse_start,
            timed_out: false,
            evicting: false,
            evict_buf: Vec::new(),
            evicted: Vec::new(),
            evicted_unsure: Vec::new(),
            replaced: None,
            write_expires: 0,
            see_expired: false,
        })
    }

    /// Read the value of `key`; `Ok(None)` if it is not in the store.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.get_ref(key)?.map(<[u8]>::to_vec))
    }

    /// Read the value of `key` into `out` (replacing its contents, reusing its allocation);
    /// false if `key` is not in the store.
    pub fn get_into(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        self.get_into_at(key, out, 0)
    }

    /// Read the value of `key` into `out` from `at` on (`out[..at]` kept, `out` ending with
    /// the value; bytes from `at` on overwritten): a front end reads a value straight into
    /// its reply, behind what it already holds. False if `key` is not in the store (`out` is
    /// then `at` long).
    pub fn get_into_at(&mut self, key: &[u8], out: &mut Vec<u8>, at: usize) -> Result<bool, Error> {
        assert!(
            at <= out.len(),
            "get_into_at: {at} is past the buffer's end"
        );
        self.check_key(key)?;
        self.stats.gets += 1;
        Ok(self.read_value_into(key, out, at)?.is_some())
    }

    /// GET with retries into `out` from `at`, the value READ straight into it when it is read
    /// on its own (a large value: no second copy); the version of what was read.
    fn read_value_into(
        &mut self,
        key: &[u8],
        out: &mut Vec<u8>,
        at: usize,
    ) -> Result<Option<Ite>, Error> {
        self.clear_evicted();
        // `out` stands in for the value buffer; its old contents are overwritten, not cleared,
        // so that a value as long as the last one needs no zero-filling.
        std::mem::swap(&mut self.vbuf, out);
        self.vbase = at;
        let r = self.with_retry(|c| c.get_once(key));
        self.vbase = 0;
        std::mem::swap(&mut self.vbuf, out);
        Ok(match r? {
            Some((ValueAt::Alone(len), ite)) => {
                out.truncate(at + len);
                Some(ite)
            }
            Some((v @ ValueAt::Buf(_), ite)) => {
                out.truncate(at);
                out.extend_from_slice(self.value_bytes(&v));
                Some(ite)
            }
            None => {
                out.truncate(at);
                None
            }
        })
    }

    /// Read the value of `key` without copying it: the bytes stay in the client's buffers
    /// until its next operation.
    pub fn get_ref(&mut self, key: &[u8]) -> Result<Option<&[u8]>, Error> {
        self.check_key(key)?;
        self.stats.gets += 1;
        self.clear_evicted();
        let at = self.with_retry(|c| c.get_once(key))?;
        Ok(at.map(|(at, _)| self.value_bytes(&at)))
    }

    /// Store `value` under `key`, replacing any previous value.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.put_parts(key, &[value])
    }

    /// Store the concatenation of `parts` under `key` (a front end's item header and data),
    /// written into the entry without being assembled first.
    pub fn put_parts(&mut self, key: &[u8], parts: &[&[u8]]) -> Result<(), Error> {
        self.check_key(key)?;
        let value_len = parts.iter().map(|p| p.len()).sum();
        self.check_value_len(value_len)?;
        self.stats.puts += 1;
        self.clear_evicted();
        if !self.evicts() {
            return self.write(key, Some(parts));
        }
        self.write_evicting(key, parts, value_len)
    }

    /// [`Self::put_parts`] of an item that expires at `expires_ns` (ns since the Unix epoch, by
    /// the endpoint's clock; 0 = never): from then on a GET finds the key absent, and the
    /// entry is reclaimed ([`Self::reclaim_expired_in`]) or evicted.
    pub fn put_parts_expiring(
        &mut self,
        key: &[u8],
        parts: &[&[u8]],
        expires_ns: u64,
    ) -> Result<(), Error> {
        self.write_expires = expires_ns;
        let r = self.put_parts(key, parts);
        self.write_expires = 0;
        r
    }

    /// [`Self::put_if`] of an item that expires at `expires_ns` (0 = never).
    pub fn put_if_expiring(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: crate::Cond,
        expires_ns: u64,
    ) -> Result<crate::CondOutcome, Error> {
        self.write_expires = expires_ns;
        let r = self.put_if(key, value, cond);
        self.write_expires = 0;
        r
    }

    /// Whether GETs keep access words: the eviction policy picks victims by them.
    #[inline]
    pub(crate) fn tracks_access(&self) -> bool {
        self.cfg.eviction.tracks_access()
    }

    /// Whether an item whose entry says `expires` has expired for the attempt timed by `d`
    /// (never for a read that must see expired items: [`CdClient::see_expired`]).
    ///
    /// Judged by the wall clock *at the attempt's start*, before the ITE that led to the entry
    /// was read: the item was then current, so if it had expired by then, the key was absent
    /// at a moment within the operation (from its expiry, or from its write if that came
    /// later). A clock read after the entry would judge a value another write may already
    /// have replaced (a stale read found "absent" while the key held a new value).
    #[inline]
    pub(crate) fn expired(&self, expires: u64, d: &Deadline) -> bool {
        expires != 0
            && !self.see_expired
            && !mutated!(self.cfg, ignore_expiry)
            && expires <= self.wall_at_start(d)
    }

    /// The wall clock (ns since the Unix epoch) at the start of the attempt `d` times, or
    /// earlier: now less the monotonic time since then (an attempt timed on the coarse clock
    /// started at most a tick later than it says).
    fn wall_at_start(&self, d: &Deadline) -> u64 {
        if mutated!(self.cfg, expiry_judged_late) {
            return self.ep.now_ns();
        }
        let since = self.ep.mono_ns().saturating_sub(d.start_ns);
        self.ep.now_ns().saturating_sub(since)
    }

    /// Remove `key` (a no-op if it is absent).
    pub fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        self.check_key(key)?;
        self.clear_evicted();
        self.stats.deletes += 1;
        self.write(key, None)
    }

    /// One attempt of GET, without retries (tests use it to observe aborts).
    pub fn try_get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.check_key(key)?;
        self.clear_evicted();
        match self.get_once(key) {
            Ok(at) => Ok(at.map(|(at, _)| self.value_bytes(&at).to_vec())),
            Err(a) => Err(self.abort_to_error(a)),
        }
    }

    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// The prefetch cache's counters (`prefetch.rs`): hits are entries GETs took from it.
    pub fn prefetch_stats(&self) -> CacheStats {
        self.prefetched.stats()
    }

    pub fn endpoint(&self) -> &E {
        &self.ep
    }

    pub fn endpoint_mut(&mut self) -> &mut E {
        &mut self.ep
    }

    pub fn node(&self) -> NodeId {
        self.ep.node()
    }

    pub fn config(&self) -> &ProtocolConfig {
        &self.cfg
    }

    pub fn view(&self) -> &Arc<ClusterView> {
        &self.view
    }

    /// Install a test hook called at every [`HookPoint`].
    #[cfg(any(test, feature = "testing"))]
    pub fn set_hook(&mut self, hook: Option<Hook>) {
        self.hook = hook;
    }

    fn check_value(&self, value: &[u8]) -> Result<(), Error> {
        self.check_value_len(value.len())
    }

    fn check_value_len(&self, len: usize) -> Result<(), Error> {
        if len > self.view.dte.value_max as usize {
            return Err(Error::ValueTooLarge {
                len,
                max: self.view.dte.value_max,
            });
        }
        Ok(())
    }

    fn check_key(&self, key: &[u8]) -> Result<(), Error> {
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        if key.len() > self.view.dte.key_max as usize {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max: self.view.dte.key_max,
            });
        }
        Ok(())
    }

    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn hook(&mut self, p: HookPoint) {
        if let Some(h) = self.hook.as_mut() {
            h(p);
        }
    }

    /// No hooks without the `testing` feature: the calls vanish.
    #[cfg(not(any(test, feature = "testing")))]
    #[inline(always)]
    pub(crate) fn hook(&mut self, _: HookPoint) {}

    /// Obey `fence` (the node's membership view) from now on.
    pub fn set_fence(&mut self, fence: Arc<Fence>) {
        self.fence = fence;
    }

    /// Whether this node may start an attempt that writes (it ends, within one expiry period,
    /// before the node's lease may lapse).
    pub(crate) fn check_fence(&self) -> Attempt<()> {
        // Without membership nothing is fenced: spare the write path a clock read.
        if self.fence.lease_until() == u64::MAX
            || self.fence.may_act(self.ep.mono_ns(), self.cfg.expiry_ns)
        {
            return Ok(());
        }
        Err(Abort::Fatal(Error::Fenced {
            node: self.ep.node(),
        }))
    }

    /// Whether the writer of an entry with `write_deadline` on `node` is gone (its node
    /// failed, or it belonged to an earlier incarnation of the node).
    pub(crate) fn writer_gone(&self, node: NodeId, write_deadline: u64) -> bool {
        // An entry whose attempt ended before its node's current incarnation joined was left
        // by an earlier one, which died (it was declared failed for a while before the node
        // could join again).
        self.fence.is_gone(node) || write_deadline < self.fence.incarnation(node)
    }

    /// Start the operation timer. It may start early (on the coarse clock): that only ends the
    /// attempt sooner, and every check after it reads the precise clock.
    pub(crate) fn deadline(&self) -> Deadline {
        let start_ns = match self.coarse_start && !self.timed_out {
            true => self.ep.mono_coarse_ns(),
            false => self.ep.mono_ns(),
        };
        Deadline {
            start_ns,
            limit_ns: self.cfg.expiry_ns,
            ignore: mutated!(self.cfg, ignore_op_timer),
        }
    }

    pub(crate) fn check(&self, d: &Deadline) -> Attempt<()> {
        self.check_at(d, self.ep.mono_ns())
    }

    /// `check` with the monotonic time `now` already read (the caller uses it again, as the
    /// issue time of the READ that follows).
    pub(crate) fn check_at(&self, d: &Deadline, now: u64) -> Attempt<()> {
        if !d.ignore && now.saturating_sub(d.start_ns) >= d.limit_ns {
            return Err(Abort::Timeout);
        }
        Ok(())
    }

    pub(crate) fn filter_matches(&self, ite: Ite, filter: u64) -> bool {
        !self.cfg.optimizations.filter_bits || self.view.index.ite.filter(ite) == filter
    }

    fn abort_to_error(&mut self, a: Abort) -> Error {
        match a {
            Abort::Concurrent(_) => {
                self.stats.concurrent_aborts += 1;
                Error::Contended { attempts: 1 }
            }
            Abort::Timeout => {
                self.stats.timeouts += 1;
                Error::Timeout {
                    expiry_ms: self.cfg.expiry_ns / 1_000_000,
                }
            }
            Abort::TableFull(e) => self.table_full_error(e),
            Abort::NoDestination => Error::IndexFull {
                depth: self.cfg.max_migrate_depth,
            },
            Abort::Fatal(e) => e,
        }
    }

    /// Run attempts until one succeeds, backing off exponentially with full jitter after
    /// concurrent-operation aborts and timeouts; waiting for expiry when the table is full.
    pub(crate) fn with_retry<T>(
        &mut self,
        mut attempt: impl FnMut(&mut Self) -> Attempt<T>,
    ) -> Result<T, Error> {
        let policy = self.cfg.retry;
        let mut backoff = policy.initial_backoff_ns.max(1);
        let mut attempts = 0u32;
        // Time spent waiting for room that no released entry of ours promised (see below).
        let mut unpromised_wait = 0u64;
        loop {
            attempts += 1;
            let last = attempts >= policy.max_attempts;
            let outcome = attempt(self);
            self.timed_out = matches!(outcome, Err(Abort::Timeout));
            let wait = match outcome {
                Ok(v) => return Ok(v),
                Err(Abort::Timeout) if last => {
                    self.stats.timeouts += 1;
                    return Err(Error::Timeout {
                        expiry_ms: self.cfg.expiry_ns / 1_000_000,
                    });
                }
                Err(Abort::Concurrent(_)) if last => {
                    self.stats.concurrent_aborts += 1;
                    return Err(Error::Contended { attempts });
                }
                Err(Abort::Concurrent(why)) => {
                    self.stats.concurrent_aborts += 1;
                    tracing::trace!(why, attempts, "concurrent operation; backing off");
                    self.rng.gen_range(0..=backoff)
                }
                Err(Abort::Timeout) => {
                    self.stats.timeouts += 1;
                    self.rng.gen_range(0..=backoff)
                }
                Err(Abort::TableFull(e)) if last => return Err(self.table_full_error(e)),
                Err(Abort::TableFull(e)) => self.room_wait(e, backoff, &mut unpromised_wait)?,
                Err(Abort::NoDestination) => {
                    return Err(Error::IndexFull {
                        depth: self.cfg.max_migrate_depth,
                    })
                }
                Err(Abort::Fatal(e)) => return Err(e),
            };
            self.stats.retries += 1;
            self.ep.sleep_ns(wait);
            backoff = (backoff * 2).min(policy.max_backoff_ns.max(1));
        }
    }
}

impl<E: Endpoint> CdClient<E> {
    /// How long to wait before the next attempt after no node had room (`e`): until the
    /// earliest of our released entries expires (at most one expiry period), or, with none of
    /// ours, a back-off of up to `backoff`, for up to `TABLE_FULL_WAIT_PERIODS` (at least
    /// `TABLE_FULL_MIN_WAIT_NS`) in all
    /// (`unpromised_wait` adds them up: other writers' pages come back as their entries
    /// expire); then the refusal.
    fn room_wait(
        &mut self,
        e: ClassAllocError,
        backoff: u64,
        unpromised_wait: &mut u64,
    ) -> Result<u64, Error> {
        let ClassAllocError::Full { next_ready_ns, .. } = e else {
            return Err(self.table_full_error(e));
        };
        self.stats.table_full_waits += 1;
        if let ClassAllocError::Full { class, .. } = e {
            self.evict_on_full(class);
        }
        if self.evicts() && self.table.drain_in_progress() {
            // A page is being drained for some class (the page mover): come back soon to
            // evict more of it rather than wait an expiry period per batch. Bounded: each
            // attempt takes entries of the page's pass, and the attempts are counted.
            return Ok(self.rng.gen_range(1..=backoff));
        }
        match next_ready_ns {
            Some(ready) => Ok(ready
                .saturating_sub(self.ep.now_ns())
                .clamp(1, self.cfg.expiry_ns)),
            None if *unpromised_wait
                < self
                    .cfg
                    .expiry_ns
                    .saturating_mul(TABLE_FULL_WAIT_PERIODS)
                    .max(TABLE_FULL_MIN_WAIT_NS) =>
            {
                let w = self.rng.gen_range(1..=backoff);
                *unpromised_wait += w;
                Ok(w)
            }
            None => Err(self.table_full_error(e)),
        }
    }

    fn table_full_error(&self, e: ClassAllocError) -> Error {
        match e {
            ClassAllocError::Full {
                entry_size,
                awaiting_expiry,
                ..
            } => Error::DataTableFull {
                node: self.ep.node(),
                entry_size,
                awaiting_expiry,
            },
            ClassAllocError::Fabric(f) => f.into(),
        }
    }
}
