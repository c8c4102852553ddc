//! Nessie's client-driven protocol and what it stands on: [`cd`] is the protocol of the paper
//! (GET, PUT, DELETE and MIGRATE done entirely with one-sided fabric operations), [`replica`]
//! keeps R copies of every node's tables, [`fence`] is a node's view of membership, [`config`]
//! its knobs and [`view`] what a cluster's clients share. The paper's baselines (SD, HY,
//! Pilaf) live in `nessie-baselines`; `nessie-deploy` assembles a cluster of either.
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
pub mod large;
pub mod replica;
pub mod view;

#[cfg(any(test, feature = "testing"))]
pub use config::Mutations;
pub use config::{ConfigError, Eviction, Optimizations, ProtocolConfig, RetryPolicy};
pub use error::Error;
pub use fence::{CutOver, Fence, MovedCopy, NodeRole};
pub use hooks::HookPoint;
pub use replica::{CatchUp, ReplicaSet, Replicated};
pub use view::ClusterView;

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

/// The error of an operation a mode's client does not offer (conditional writes, versioned
/// reads, scans: only the client-driven protocol has them).
pub fn unsupported(what: &str) -> Error {
    Error::Unsupported(format!(
        "{what} needs conditional writes, which only the client-driven (cd) mode offers"
    ))
}

/// What a pass of reclaiming expired items over a window of the index did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Keys seen in the window.
    pub keys: u64,
    /// Of them, expired.
    pub expired: u64,
    /// Of those, deleted by this pass (the rest were rewritten or deleted by others first).
    pub deleted: u64,
    /// Of the deleted, never read since written: no GET marked their access word fetched
    /// (known only under the policies that keep access words, [`Eviction::tracks_access`];
    /// under the others no GET marks one and every deleted item counts).
    pub unfetched: u64,
}

/// One key a reclaiming scan read ([`KvClient::reclaim_expired_in_noting`]).
#[derive(Copy, Clone, Debug)]
pub struct ScanNote<'a> {
    pub key: &'a [u8],
    /// Its entry had expired (the scan deletes it next).
    pub expired: bool,
    /// A GET marked its access word fetched (under the policies that keep access words).
    pub fetched: bool,
}

impl std::ops::AddAssign for Reclaimed {
    fn add_assign(&mut self, o: Self) {
        self.keys += o.keys;
        self.expired += o.expired;
        self.deleted += o.deleted;
        self.unfetched += o.unfetched;
    }
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
    /// [`Self::put_parts`] of an item that expires at `expires_ns` (ns since the Unix epoch;
    /// 0 = never): the client-driven store keeps the expiry in the entry, finds the key absent
    /// from then on, and reclaims the entry ([`Self::reclaim_expired_in`]). The others store
    /// the value alone (a front end's item header then carries the expiry).
    fn put_parts_expiring(
        &mut self,
        key: &[u8],
        parts: &[&[u8]],
        expires_ns: u64,
    ) -> Result<(), Error> {
        let _ = expires_ns;
        self.put_parts(key, parts)
    }
    /// Remove `key` (no-op if absent).
    fn delete(&mut self, key: &[u8]) -> Result<(), Error>;
    /// Read `key` into `out` (its contents replaced) with its version; `None` if absent.
    fn get_versioned(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Version>, Error> {
        let _ = (key, out);
        Err(unsupported("a versioned read"))
    }
    /// [`Self::get_versioned`] for a caller that needs only the first `head` bytes of the
    /// value (a front end's DELETE: the item's header): `out` holds at least those (all of
    /// the value if it is shorter), perhaps more, not necessarily all. The large-value layer
    /// then reads only the chunks that hold them.
    fn get_versioned_head(
        &mut self,
        key: &[u8],
        out: &mut Vec<u8>,
        head: usize,
    ) -> Result<Option<Version>, Error> {
        let _ = head;
        self.get_versioned(key, out)
    }
    /// Store `value` under `key` if `cond` holds, atomically.
    fn put_if(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        let _ = (key, value, cond);
        Err(unsupported("a conditional write"))
    }
    /// [`Self::put_if`] of an item that expires at `expires_ns` (as [`Self::put_parts_expiring`]).
    fn put_if_expiring(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: Cond,
        expires_ns: u64,
    ) -> Result<CondOutcome, Error> {
        let _ = expires_ns;
        self.put_if(key, value, cond)
    }
    /// Delete the expired items (by the store's own expiry) among the keys of index slots
    /// `slots`, each conditionally on the version read expired. `Ok(None)`: the store keeps no
    /// expiry of its own.
    fn reclaim_expired_in(
        &mut self,
        slots: std::ops::Range<u64>,
    ) -> Result<Option<Reclaimed>, Error> {
        let _ = slots;
        Ok(None)
    }
    /// [`Self::reclaim_expired_in`], telling `note` of every key the window holds as the scan
    /// reads it (the large-value layer, [`large`], finds its orphaned chunks so). A store that
    /// cannot tell notes nothing.
    fn reclaim_expired_in_noting(
        &mut self,
        slots: std::ops::Range<u64>,
        note: &mut dyn FnMut(&ScanNote),
    ) -> Result<Option<Reclaimed>, Error> {
        let _ = note;
        self.reclaim_expired_in(slots)
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
    /// The keys with a valid entry in index slots `slots`, a window of the whole index
    /// (`0..Geometry::total_ites()`), by the same scan as [`Self::scan_keys`]: background work
    /// walks the index a window at a time.
    fn scan_keys_in(&mut self, slots: std::ops::Range<u64>) -> Result<Vec<Vec<u8>>, Error> {
        let _ = slots;
        Err(unsupported("a scan of index slots"))
    }
    /// The keys this client's last operation evicted to make room (`ProtocolConfig::eviction`):
    /// each was deleted, conditionally on the version sampled, during that operation. A
    /// history records them as DELETEs within the operation's interval. A GET may evict too:
    /// completing an abandoned write takes an entry for the copy of its value.
    fn evicted(&self) -> &[Vec<u8>] {
        &[]
    }
    /// Attempts this client aborted (a concurrent operation, a timeout) and retries it made,
    /// so far; `(0, 0)` where not counted. A pipeline reports each operation's share
    /// (`nessie_inflight::Completion`), its clients being out of reach inside its coroutines.
    fn aborts_retries(&self) -> (u64, u64) {
        (0, 0)
    }
    /// The keys whose eviction during this client's last operation may or may not have taken
    /// effect (`Error::Indeterminate`): a history records them as failed DELETEs within the
    /// write's interval.
    fn evicted_unsure(&self) -> &[Vec<u8>] {
        &[]
    }
    /// A hint: the GETs that follow read `keys` (the CD client reads their entries ahead in
    /// overlapping batches, `cd/prefetch.rs`). It changes nothing any GET answers.
    fn prefetch(&mut self, _keys: &[&[u8]]) {}
    /// The value length of what this client's last plain PUT replaced, when it knows (the CD
    /// client: `CdClient::replaced_len`).
    fn replaced_len(&self) -> Option<u32> {
        None
    }
    /// Read what this client's last plain PUT of `key` replaced, while it is certainly intact
    /// (`CdClient::read_replaced`); false when that cannot be done.
    fn read_replaced(&mut self, _key: &[u8], _out: &mut Vec<u8>) -> Result<bool, Error> {
        Ok(false)
    }
}

/// Attempts of a read-modify-write before it counts as failed: each lost its conditional write
/// to another write of the key.
pub const MAX_RMW_ATTEMPTS: u32 = 16;

/// Read `key` with its version, then write `value` back under that version (YCSB's
/// read-modify-write, atomic here), reading again if another write came between. `got` holds
/// the value read.
pub fn read_modify_write<C: KvClient + ?Sized>(
    client: &mut C,
    key: &[u8],
    value: &[u8],
    got: &mut Vec<u8>,
) -> Result<(), Error> {
    for _ in 0..MAX_RMW_ATTEMPTS {
        let cond = match client.get_versioned(key, got)? {
            Some(v) => Cond::Version(v),
            None => Cond::Absent,
        };
        if client.put_if(key, value, cond)? == CondOutcome::Stored {
            return Ok(());
        }
    }
    Err(Error::Contended {
        attempts: MAX_RMW_ATTEMPTS,
    })
}

impl<T: KvClient + ?Sized> KvClient for Box<T> {
    fn prefetch(&mut self, keys: &[&[u8]]) {
        (**self).prefetch(keys)
    }
    fn aborts_retries(&self) -> (u64, u64) {
        (**self).aborts_retries()
    }
    fn replaced_len(&self) -> Option<u32> {
        (**self).replaced_len()
    }
    fn read_replaced(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        (**self).read_replaced(key, out)
    }
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
    fn put_parts_expiring(&mut self, key: &[u8], parts: &[&[u8]], at: u64) -> Result<(), Error> {
        (**self).put_parts_expiring(key, parts, at)
    }
    fn put_if_expiring(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: Cond,
        at: u64,
    ) -> Result<CondOutcome, Error> {
        (**self).put_if_expiring(key, value, cond, at)
    }
    fn reclaim_expired_in(
        &mut self,
        slots: std::ops::Range<u64>,
    ) -> Result<Option<Reclaimed>, Error> {
        (**self).reclaim_expired_in(slots)
    }
    fn reclaim_expired_in_noting(
        &mut self,
        slots: std::ops::Range<u64>,
        note: &mut dyn FnMut(&ScanNote),
    ) -> Result<Option<Reclaimed>, Error> {
        (**self).reclaim_expired_in_noting(slots, note)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        (**self).delete(key)
    }
    fn get_versioned(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Version>, Error> {
        (**self).get_versioned(key, out)
    }
    fn get_versioned_head(
        &mut self,
        key: &[u8],
        out: &mut Vec<u8>,
        head: usize,
    ) -> Result<Option<Version>, Error> {
        (**self).get_versioned_head(key, out, head)
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
    fn scan_keys_in(&mut self, slots: std::ops::Range<u64>) -> Result<Vec<Vec<u8>>, Error> {
        (**self).scan_keys_in(slots)
    }
    fn evicted(&self) -> &[Vec<u8>] {
        (**self).evicted()
    }
    fn evicted_unsure(&self) -> &[Vec<u8>] {
        (**self).evicted_unsure()
    }
}

impl<E: nessie_fabric::Endpoint> KvClient for cd::CdClient<E> {
    fn prefetch(&mut self, keys: &[&[u8]]) {
        cd::CdClient::prefetch(self, keys)
    }
    fn replaced_len(&self) -> Option<u32> {
        cd::CdClient::replaced_len(self)
    }
    fn read_replaced(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        cd::CdClient::read_replaced(self, key, out)
    }
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
    fn put_parts_expiring(&mut self, key: &[u8], parts: &[&[u8]], at: u64) -> Result<(), Error> {
        cd::CdClient::put_parts_expiring(self, key, parts, at)
    }
    fn put_if_expiring(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: Cond,
        at: u64,
    ) -> Result<CondOutcome, Error> {
        cd::CdClient::put_if_expiring(self, key, value, cond, at)
    }
    fn reclaim_expired_in(
        &mut self,
        slots: std::ops::Range<u64>,
    ) -> Result<Option<Reclaimed>, Error> {
        cd::CdClient::reclaim_expired_in(self, slots).map(Some)
    }
    fn reclaim_expired_in_noting(
        &mut self,
        slots: std::ops::Range<u64>,
        note: &mut dyn FnMut(&ScanNote),
    ) -> Result<Option<Reclaimed>, Error> {
        cd::CdClient::reclaim_expired_noting(self, slots, note).map(Some)
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
    fn scan_keys_in(&mut self, slots: std::ops::Range<u64>) -> Result<Vec<Vec<u8>>, Error> {
        cd::CdClient::scan_keys_in(self, slots)
    }
    fn evicted(&self) -> &[Vec<u8>] {
        cd::CdClient::evicted(self)
    }
    fn evicted_unsure(&self) -> &[Vec<u8>] {
        cd::CdClient::evicted_unsure(self)
    }
    fn aborts_retries(&self) -> (u64, u64) {
        let s = self.stats();
        (s.concurrent_aborts + s.timeouts, s.retries)
    }
}
