//! Large values: items longer than one data table entry, as a layer over any [`KvClient`]
//! with conditional writes (issue 41, step 5; `docs/large-values.md`).
//!
//! A store entry holds at most the cluster's `value_max` bytes (the largest size class). An
//! item longer than that is cut into *chunks*, each stored under its own reserved key, and the
//! item's key holds a small *manifest* naming them. Every stored value ends with a kind byte:
//!
//! ```text
//! inline item:  | value                                        | 0 |
//! manifest:     | "NLv1" | total u64 | chunk_data u32 | count u32 | written_ms u64 | nonce u64 | 1 |
//! chunk:        | chunk_data bytes of the value (the last one: the rest)           | 2 |
//! chunk key:    | ff fe | written_ms u64 | nonce u64 | index u32 | count u32 | owner key |
//! ```
//!
//! Integers are big-endian. The manifest's `written_ms` and `nonce` (random) name its chunks,
//! which no other manifest ever names. Invariants:
//!
//! - **L1** every chunk is written before the manifest naming it is published, by the one
//!   write of the item's key (a conditional write, `Cond`), so a reader that finds a manifest
//!   finds its chunks whole unless they were deleted since.
//! - **L2** chunks are immutable and named once: a chunk key read present holds the bytes its
//!   writer put there. A reader needs no lock: what it reads of a manifest's chunks is that
//!   manifest's value, and a chunk missing means the manifest was replaced, deleted, expired,
//!   or lost a chunk (evicted), which the reader tells apart by reading the key again.
//! - **L3** a manifest no longer in the index has garbage chunks: whoever replaces or deletes
//!   a manifest it read deletes its chunks (last chunk first, chunk 0 last), and the node's
//!   reclaimer deletes the rest (a small write over a large item, a plain DELETE, a writer
//!   that died): a chunk 0 whose owner key names another manifest, older than
//!   [`ORPHAN_GRACE_MS`], is an orphan, and its item's chunks are deleted.
//!
//! A GET of a large item is one read of the manifest and one GET per chunk; a PUT is one PUT
//! per chunk, a read of the key's old value, and the conditional write of the manifest.
//! Chunks are ordinary items to the store: replicated, expired (with their item's expiry),
//! evicted and recycled as any.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::{Cond, CondOutcome, Error, KvClient, Reclaimed, Version};

/// Kind byte of a value stored whole.
pub const KIND_INLINE: u8 = 0;
/// Kind byte of a manifest.
pub const KIND_MANIFEST: u8 = 1;
/// Kind byte of a chunk.
pub const KIND_CHUNK: u8 = 2;
/// Bytes every stored value carries besides the item's own (the kind byte).
pub const KIND_LEN: usize = 1;
/// Every chunk key starts with these bytes; users' keys may not (`Error::KeyReserved`).
pub const RESERVED_PREFIX: &[u8; 2] = b"\xff\xfe";
/// A chunk key's bytes before its owner's key.
pub const CHUNK_KEY_OVERHEAD: usize = 2 + 8 + 8 + 4 + 4;
/// Chunks a GET reads ahead at a time (`KvClient::prefetch`): at most the CD client's
/// `MAX_PREFETCH_KEYS`.
pub const PREFETCH_WINDOW: usize = crate::cd::prefetch::MAX_PREFETCH_KEYS;
const MAGIC: &[u8; 4] = b"NLv1";
/// A manifest's bytes before its kind byte.
pub const MANIFEST_LEN: usize = 4 + 8 + 4 + 4 + 8 + 8;
/// The largest item any cluster allows (Redis's 512 MB string limit).
pub const ITEM_MAX_LIMIT: u64 = 512 << 20;
/// The default item limit (memcached's `-I` default).
pub const DEFAULT_ITEM_MAX: u64 = 1 << 20;
/// A chunk 0 this old whose owner names another manifest is an orphan (L3). Clocks of the
/// cluster's nodes must agree to well within it, and no writer may pause longer than it
/// between its deadline check and its publish. It is also how long the chunks of an item
/// deleted by a plain DELETE (or a flush) hold their memory, at least.
pub const ORPHAN_GRACE_MS: u64 = 60 * 1000;
/// Shortest grace period a cluster may set (`[cache] orphan_grace_ms`).
pub const MIN_ORPHAN_GRACE_MS: u64 = 1000;
/// Longest grace period (a day).
pub const MAX_ORPHAN_GRACE_MS: u64 = 24 * 3600 * 1000;
/// A large PUT whose chunks took longer than its grace period over this to write gives up
/// before publishing, so that its chunks cannot be taken for orphans (half the grace is left
/// for clock skew and the publish itself).
pub const WRITE_DEADLINE_DIVISOR: u64 = 2;
/// The deadline at the default grace period.
pub const WRITE_DEADLINE_MS: u64 = ORPHAN_GRACE_MS / WRITE_DEADLINE_DIVISOR;
/// Conditional publishes a large PUT tries against concurrent writers of its key before it
/// publishes unconditionally (the replaced value's chunks are then the reclaimer's).
pub const MAX_PUBLISH_ATTEMPTS: u32 = 8;
/// Reads of a large item restarted because its manifest changed under them.
pub const MAX_READ_ATTEMPTS: u32 = 16;
/// Owner keys one reclaimer window reads to find orphans: bounds the background work at
/// this many small GETs per window (`nessie_serve::expire`: a window every 100 ms).
pub const ORPHAN_CHECKS_PER_WINDOW: usize = 64;

/// A manifest: where a large item's chunks are.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The item's length.
    pub total: u64,
    /// Bytes of the item per chunk (the last holds the rest).
    pub chunk_data: u32,
    pub count: u32,
    /// When the writer started (Unix ms), and its random nonce: together they name the chunks.
    pub written_ms: u64,
    pub nonce: u64,
}

impl Manifest {
    fn new(total: u64, chunk_data: u32, written_ms: u64, nonce: u64) -> Self {
        assert!(chunk_data > 0 && total > 0);
        let count = total.div_ceil(chunk_data as u64);
        assert!(count <= u32::MAX as u64);
        Self {
            total,
            chunk_data,
            count: count as u32,
            written_ms,
            nonce,
        }
    }

    /// The manifest's stored form, kind byte included.
    pub fn encode(&self) -> [u8; MANIFEST_LEN + KIND_LEN] {
        let mut b = [0u8; MANIFEST_LEN + KIND_LEN];
        b[..4].copy_from_slice(MAGIC);
        b[4..12].copy_from_slice(&self.total.to_be_bytes());
        b[12..16].copy_from_slice(&self.chunk_data.to_be_bytes());
        b[16..20].copy_from_slice(&self.count.to_be_bytes());
        b[20..28].copy_from_slice(&self.written_ms.to_be_bytes());
        b[28..36].copy_from_slice(&self.nonce.to_be_bytes());
        b[MANIFEST_LEN] = KIND_MANIFEST;
        b
    }

    /// A manifest read back (without its kind byte), checked: the data crossed a boundary.
    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() != MANIFEST_LEN || &b[..4] != MAGIC {
            return Err(format!("a manifest of {} bytes without its magic", b.len()));
        }
        let (u64_at, u32_at) = (|i| be_u64(b, i), |i| be_u32(b, i));
        let m = Self {
            total: u64_at(4),
            chunk_data: u32_at(12),
            count: u32_at(16),
            written_ms: u64_at(20),
            nonce: u64_at(28),
        };
        if m.total == 0 || m.total > ITEM_MAX_LIMIT || m.chunk_data == 0 {
            return Err(format!(
                "a manifest of a {}-byte item in chunks of {}",
                m.total, m.chunk_data
            ));
        }
        if m.total.div_ceil(m.chunk_data as u64) != m.count as u64 {
            return Err(format!(
                "a manifest of {} chunks for {} bytes in chunks of {}",
                m.count, m.total, m.chunk_data
            ));
        }
        Ok(m)
    }

    /// Bytes of the item chunk `i` holds.
    pub fn chunk_len(&self, i: u32) -> usize {
        debug_assert!(i < self.count);
        let start = i as u64 * self.chunk_data as u64;
        (self.total - start).min(self.chunk_data as u64) as usize
    }

    /// The key of chunk `i` of `owner`'s item.
    pub fn chunk_key(&self, owner: &[u8], i: u32) -> Vec<u8> {
        let mut k = Vec::with_capacity(CHUNK_KEY_OVERHEAD + owner.len());
        k.extend_from_slice(RESERVED_PREFIX);
        k.extend_from_slice(&self.written_ms.to_be_bytes());
        k.extend_from_slice(&self.nonce.to_be_bytes());
        k.extend_from_slice(&i.to_be_bytes());
        k.extend_from_slice(&self.count.to_be_bytes());
        k.extend_from_slice(owner);
        k
    }
}

/// The big-endian word at `b[i..i + 8]` (the caller checked the length).
fn be_u64(b: &[u8], i: usize) -> u64 {
    u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// The big-endian word at `b[i..i + 4]`.
fn be_u32(b: &[u8], i: usize) -> u32 {
    u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

/// A chunk key taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkKey<'a> {
    pub written_ms: u64,
    pub nonce: u64,
    pub index: u32,
    pub count: u32,
    pub owner: &'a [u8],
}

impl<'a> ChunkKey<'a> {
    /// `key` as a chunk key, if it is one.
    pub fn parse(key: &'a [u8]) -> Option<Self> {
        if key.len() <= CHUNK_KEY_OVERHEAD || !key.starts_with(RESERVED_PREFIX) {
            return None;
        }
        let (u64_at, u32_at) = (|i| be_u64(key, i), |i| be_u32(key, i));
        let c = Self {
            written_ms: u64_at(2),
            nonce: u64_at(10),
            index: u32_at(18),
            count: u32_at(22),
            owner: &key[CHUNK_KEY_OVERHEAD..],
        };
        (c.index < c.count).then_some(c)
    }

    /// Whether `m` is the manifest naming this chunk.
    pub fn named_by(&self, m: &Manifest) -> bool {
        m.written_ms == self.written_ms && m.nonce == self.nonce && m.count == self.count
    }
}

/// Whether `key` is in the reserved space of chunk keys.
pub fn is_reserved(key: &[u8]) -> bool {
    key.starts_with(RESERVED_PREFIX)
}

/// The limits of a large-value layer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LargeLimits {
    /// The store's `key_max`: a large item's key has at most this less
    /// [`CHUNK_KEY_OVERHEAD`] bytes.
    pub key_max: u32,
    /// The store's `value_max`: values up to this less [`KIND_LEN`] are stored whole.
    pub entry_max: u32,
    /// The longest item accepted.
    pub item_max: u64,
    /// How old an orphan's chunk 0 must be before the reclaimer takes it ([`ORPHAN_GRACE_MS`]
    /// unless set with [`Self::with_grace_ms`]).
    pub grace_ms: u64,
}

impl LargeLimits {
    /// Checked limits: the chunk size follows from `entry_max`, and `item_max` is at most
    /// [`ITEM_MAX_LIMIT`].
    pub fn new(key_max: u32, entry_max: u32, item_max: u64) -> Result<Self, Error> {
        if (entry_max as usize) < MANIFEST_LEN + KIND_LEN {
            return Err(Error::Config(format!(
                "value_max of {entry_max} bytes cannot hold a large item's manifest ({} bytes)",
                MANIFEST_LEN + KIND_LEN
            )));
        }
        if item_max > ITEM_MAX_LIMIT {
            return Err(Error::Config(format!(
                "item_max of {item_max} bytes exceeds the limit of {ITEM_MAX_LIMIT} (512 MiB)"
            )));
        }
        if item_max + (KIND_LEN as u64) < entry_max as u64 {
            return Err(Error::Config(format!(
                "item_max of {item_max} bytes is below value_max ({entry_max} bytes) less {KIND_LEN}"
            )));
        }
        Ok(Self {
            key_max,
            entry_max,
            item_max,
            grace_ms: ORPHAN_GRACE_MS,
        })
    }

    /// These limits with a grace period of `grace_ms`, within
    /// [`MIN_ORPHAN_GRACE_MS`]..=[`MAX_ORPHAN_GRACE_MS`].
    pub fn with_grace_ms(self, grace_ms: u64) -> Result<Self, Error> {
        if !(MIN_ORPHAN_GRACE_MS..=MAX_ORPHAN_GRACE_MS).contains(&grace_ms) {
            return Err(Error::Config(format!(
                "orphan_grace_ms of {grace_ms} is not in {MIN_ORPHAN_GRACE_MS}..={MAX_ORPHAN_GRACE_MS}"
            )));
        }
        Ok(Self { grace_ms, ..self })
    }

    /// How long a large PUT may take over its chunks before it gives up unpublished.
    pub fn write_deadline_ms(&self) -> u64 {
        self.grace_ms / WRITE_DEADLINE_DIVISOR
    }

    /// The longest item stored whole.
    pub fn inline_max(&self) -> usize {
        self.entry_max as usize - KIND_LEN
    }

    /// Bytes of an item per chunk.
    pub fn chunk_data(&self) -> u32 {
        self.entry_max - KIND_LEN as u32
    }
}

/// What a large-value layer has done, for tests and `status`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct LargeCounters {
    /// Large items published.
    pub published: u64,
    /// Chunks written.
    pub chunks_written: u64,
    /// Chunks deleted because their manifest was replaced or deleted by this client.
    pub chunks_collected: u64,
    /// Items found with a chunk missing under a current manifest (evicted chunks), deleted.
    pub broken: u64,
    /// Orphaned items whose chunks the reclaimer deleted.
    pub orphans: u64,
    /// Large items a plain PUT of the same key replaced (a small item, or a manifest published
    /// without a condition), their chunks collected at once.
    pub shrunk: u64,
    /// Values of a manifest's length a plain PUT replaced that could not be read in time (or
    /// at all): whatever chunks they named are the reclaimer's.
    pub overwritten_unread: u64,
}

/// Where a test widens a race (`Chunked::hook`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LargeHook {
    /// A PUT wrote its chunks and has not published its manifest.
    ChunksWritten,
    /// A GET read a manifest and has not read its chunks.
    ManifestRead,
    /// A PUT read the key's version and has not published its manifest conditionally on it
    /// (each attempt).
    BeforePublish,
}

/// Test-only mutations: each breaks one rule above, and a test must catch it.
#[cfg(any(test, feature = "testing"))]
#[derive(Copy, Clone, Debug, Default)]
pub struct LargeMutations {
    /// A GET that finds a chunk missing answers "absent" without reading the key again (L2).
    pub trust_missing_chunk: bool,
    /// The reclaimer takes any chunk 0 whose owner names another manifest for an orphan,
    /// however young: a PUT still writing its chunks loses them (L1, L3).
    pub sweep_without_grace: bool,
    /// A large PUT publishes without reading the old value: the chunks it replaces are left
    /// to the reclaimer (L3's prompt half).
    pub publish_blind: bool,
    /// The store's evictions are read once, after the layer's last operation of the store,
    /// not after each: what a large PUT's chunk writes evicted goes unreported.
    pub harvest_at_end_only: bool,
    /// A plain PUT over a large item (a small one, or a manifest published without a
    /// condition) leaves its chunks to the reclaimer's grace period, as before the store said
    /// what a PUT replaced.
    pub keep_shrunk_chunks: bool,
}

/// A [`KvClient`] that stores items longer than one entry as chunks behind a manifest.
pub struct Chunked<C> {
    inner: C,
    limits: LargeLimits,
    clock: Box<dyn Fn() -> u64 + Send>,
    /// The last versioned read: key, version, and its manifest if it was one. A conditional
    /// write or delete at that version that takes effect collects that manifest's chunks.
    last_read: Option<(Vec<u8>, Version, Option<Manifest>)>,
    scratch: Vec<u8>,
    evicted: Vec<Vec<u8>>,
    evicted_unsure: Vec<Vec<u8>>,
    sweep_turn: usize,
    counters: LargeCounters,
    #[cfg(any(test, feature = "testing"))]
    pub mutations: LargeMutations,
    #[cfg(any(test, feature = "testing"))]
    #[allow(clippy::type_complexity)]
    pub hook: Option<Box<dyn FnMut(LargeHook) + Send>>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn corrupt(key: &[u8], what: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!(
        "the value of key {:?}: {what}",
        String::from_utf8_lossy(&key[..key.len().min(64)])
    ))
}

/// The byte range `range` of the concatenation of `parts`, as slices of them.
fn slice_parts<'a>(parts: &[&'a [u8]], range: std::ops::Range<usize>, out: &mut Vec<&'a [u8]>) {
    out.clear();
    let mut at = 0;
    for p in parts {
        let (start, end) = (at, at + p.len());
        at = end;
        if end <= range.start || p.is_empty() {
            continue;
        }
        if start >= range.end {
            break;
        }
        let lo = range.start.saturating_sub(start);
        let hi = (range.end - start).min(p.len());
        out.push(&p[lo..hi]);
    }
}

/// How a read of a key's stored value ended.
enum Resolved {
    /// The item is in `out`: stored whole, or assembled from the manifest's chunks.
    Value(Option<Manifest>),
    /// A chunk of this manifest was missing.
    Missing(Manifest),
}

/// What a look at a manifest whose chunk was missing found.
enum Recheck {
    Absent,
    Again,
}

impl<C: KvClient> Chunked<C> {
    pub fn new(inner: C, limits: LargeLimits) -> Self {
        Self {
            inner,
            limits,
            clock: Box::new(unix_ms),
            last_read: None,
            scratch: Vec::new(),
            evicted: Vec::new(),
            evicted_unsure: Vec::new(),
            sweep_turn: 0,
            counters: LargeCounters::default(),
            #[cfg(any(test, feature = "testing"))]
            mutations: LargeMutations::default(),
            #[cfg(any(test, feature = "testing"))]
            hook: None,
        }
    }

    /// The layer reading time (Unix ms) from `clock` (tests move time on).
    pub fn with_clock(mut self, clock: impl Fn() -> u64 + Send + 'static) -> Self {
        self.clock = Box::new(clock);
        self
    }

    pub fn inner(&mut self) -> &mut C {
        &mut self.inner
    }

    pub fn limits(&self) -> LargeLimits {
        self.limits
    }

    pub fn counters(&self) -> LargeCounters {
        self.counters
    }

    fn run_hook(&mut self, at: LargeHook) {
        #[cfg(any(test, feature = "testing"))]
        if let Some(h) = self.hook.as_mut() {
            h(at);
        }
        let _ = at;
    }

    /// The start of every operation: the keys the last one evicted are forgotten.
    fn begin(&mut self, key: &[u8]) -> Result<(), Error> {
        self.evicted.clear();
        self.evicted_unsure.clear();
        if is_reserved(key) {
            return Err(Error::KeyReserved {
                prefix: "\\xff\\xfe".into(),
            });
        }
        Ok(())
    }

    /// The end of every operation.
    fn end<T>(&mut self, r: Result<T, Error>) -> Result<T, Error> {
        if mutated!(self, harvest_at_end_only) {
            let user = |k: &&Vec<u8>| !is_reserved(k);
            self.evicted
                .extend(self.inner.evicted().iter().filter(user).cloned());
        }
        r
    }

    /// One operation of the store under the layer, and what it evicted: each of the layer's
    /// operations is many of the store's, and the store reports its last one's evictions
    /// only. Chunks are left out: an evicted chunk is found by the GET of its item, which
    /// then reports the item.
    fn io<T>(&mut self, f: impl FnOnce(&mut C) -> T) -> T {
        let r = f(&mut self.inner);

        if mutated!(self, harvest_at_end_only) {
            return r;
        }
        // Nearly always nothing was evicted: two length reads.
        if self.inner.evicted().is_empty() && self.inner.evicted_unsure().is_empty() {
            return r;
        }
        let user = |k: &&Vec<u8>| !is_reserved(k);
        self.evicted
            .extend(self.inner.evicted().iter().filter(user).cloned());
        self.evicted_unsure
            .extend(self.inner.evicted_unsure().iter().filter(user).cloned());
        r
    }

    /// Finish a read whose stored value is `out[at..]`: strip its kind byte, or assemble the
    /// item its manifest names, or, with a `head` below its length, its chunks up to the one
    /// that holds byte `head - 1` (at least `head` bytes then, not all of them).
    fn resolve(
        &mut self,
        key: &[u8],
        out: &mut Vec<u8>,
        at: usize,
        head: usize,
    ) -> Result<Resolved, Error> {
        let Some(&kind) = out[at..].last() else {
            return Err(corrupt(key, "an empty stored value (no kind byte)"));
        };
        match kind {
            KIND_INLINE => {
                out.pop();
                Ok(Resolved::Value(None))
            }
            KIND_MANIFEST => {
                let m = Manifest::decode(&out[at..out.len() - 1]).map_err(|e| corrupt(key, e))?;
                out.truncate(at);
                self.run_hook(LargeHook::ManifestRead);
                // The chunks that hold the first `head` bytes (all of them for a whole read).
                let count = match head.div_ceil(m.chunk_data.max(1) as usize) {
                    n if n < m.count as usize => n.max(1) as u32,
                    _ => m.count,
                };
                out.reserve(m.total.min(head as u64) as usize);
                let mut names: Vec<Vec<u8>> = Vec::new();
                for i in 0..count {
                    let w = i as usize % PREFETCH_WINDOW;
                    if w == 0 {
                        // The window's chunks read ahead together (`cd/prefetch.rs`); each
                        // GET below still does all its own steps.
                        let end = count.min(i + PREFETCH_WINDOW as u32);
                        names.clear();
                        names.extend((i..end).map(|j| m.chunk_key(key, j)));
                        if names.len() > 1 {
                            let refs: Vec<&[u8]> = names.iter().map(|n| n.as_slice()).collect();
                            self.inner.prefetch(&refs);
                        }
                    }
                    let pos = out.len();
                    let len = m.chunk_len(i);
                    if !self.io(|c| c.get_into_at(&names[w], out, pos))? {
                        out.truncate(at);
                        return Ok(Resolved::Missing(m));
                    }
                    // A chunk read back: its length and kind must be the manifest's.
                    if out.len() != pos + len + KIND_LEN || out[pos + len] != KIND_CHUNK {
                        let got = out.len() - pos;
                        out.truncate(at);
                        return Err(corrupt(
                            key,
                            format!(
                                "chunk {i} of {} holds {got} bytes, not {}",
                                m.count,
                                len + 1
                            ),
                        ));
                    }
                    out.truncate(pos + len);
                }
                debug_assert!(
                    out.len() - at == m.total as usize
                        || (count < m.count && out.len() - at >= head)
                );
                Ok(Resolved::Value(Some(m)))
            }
            k => Err(corrupt(
                key,
                format!("kind byte {k}: not written through the large-value layer"),
            )),
        }
    }

    /// A chunk of `m`, the manifest of `key`, was missing: read the key again. Another
    /// manifest or none: the read starts again or finds the key absent. The same manifest:
    /// a chunk was lost (evicted) under it, and the item is deleted, conditionally on that
    /// version, as an eviction.
    fn recheck(&mut self, key: &[u8], m: &Manifest) -> Result<Recheck, Error> {
        if mutated!(self, trust_missing_chunk) {
            return Ok(Recheck::Absent);
        }
        let mut buf = std::mem::take(&mut self.scratch);
        let r = self.recheck_into(key, m, &mut buf);
        self.scratch = buf;
        r
    }

    fn recheck_into(
        &mut self,
        key: &[u8],
        m: &Manifest,
        buf: &mut Vec<u8>,
    ) -> Result<Recheck, Error> {
        let Some(v) = self.io(|c| c.get_versioned(key, buf))? else {
            return Ok(Recheck::Absent);
        };
        if manifest_of(buf) != Some(*m) {
            return Ok(Recheck::Again);
        }
        match self.io(|c| c.delete_if(key, Cond::Version(v)))? {
            CondOutcome::Stored => {
                tracing::warn!(
                    key = %String::from_utf8_lossy(key),
                    "a large item lost a chunk (evicted or reclaimed) and was deleted"
                );
                self.counters.broken += 1;
                self.collect(key, m);
                self.evicted.push(key.to_vec());
                Ok(Recheck::Absent)
            }
            CondOutcome::Unmet { .. } => Ok(Recheck::Again),
        }
    }

    /// Delete `m`'s chunks, last first (chunk 0 last: while it stands, the reclaimer can
    /// still find the rest). Failures leave them to the reclaimer.
    fn collect(&mut self, owner: &[u8], m: &Manifest) {
        for i in (0..m.count).rev() {
            if let Err(e) = self.io(|c| c.delete(&m.chunk_key(owner, i))) {
                tracing::debug!(error = %e, "chunks left to the reclaimer");
                return;
            }
            self.counters.chunks_collected += 1;
        }
    }

    /// A plain PUT of `key` took effect (a small item, or a manifest published without a
    /// condition after contention): if what it replaced has a manifest's length, it is read
    /// (the store keeps it intact for an expiry period after the PUT began), and if it was a
    /// manifest its chunks are garbage (L3), collected now rather than by the reclaimer after
    /// the grace period. A value of another length costs nothing more; anything that fails
    /// leaves the chunks to the reclaimer.
    fn collect_overwritten(&mut self, key: &[u8]) {
        let manifest_len = (MANIFEST_LEN + KIND_LEN) as u32;
        if mutated!(self, keep_shrunk_chunks) || self.inner.replaced_len() != Some(manifest_len) {
            return;
        }
        let mut buf = std::mem::take(&mut self.scratch);
        let m = match self.inner.read_replaced(key, &mut buf) {
            Ok(true) => manifest_of(&buf),
            Ok(false) => {
                self.counters.overwritten_unread += 1;
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "a replaced item left to the reclaimer");
                self.counters.overwritten_unread += 1;
                None
            }
        };
        self.scratch = buf;
        if let Some(m) = m {
            self.counters.shrunk += 1;
            self.collect(key, &m);
        }
    }

    /// A conditional write or delete of `key` under `cond` took effect: if `cond` named the
    /// version last read and that was a manifest, its chunks are garbage (L3).
    fn collect_replaced(&mut self, key: &[u8], cond: Cond) {
        let Cond::Version(v) = cond else { return };
        if let Some((k, lv, Some(m))) = self.last_read.take() {
            if k == key && lv == v {
                self.collect(key, &m);
            }
        }
    }

    fn check_len(&self, key: &[u8], total: usize) -> Result<bool, Error> {
        if total as u64 > self.limits.item_max {
            return Err(Error::ItemTooLarge {
                len: total as u64,
                max: self.limits.item_max,
            });
        }
        let large = total > self.limits.inline_max();
        let key_room = (self.limits.key_max as usize).saturating_sub(CHUNK_KEY_OVERHEAD);
        if large && key.len() > key_room {
            return Err(Error::Config(format!(
                "a key of {} bytes is too long for an item of {total} bytes: an item longer \
                 than {} bytes (value_max less 1) is stored in chunks, whose keys take {} bytes \
                 more, so its key may have at most {key_room} bytes (key_max {})",
                key.len(),
                self.limits.inline_max(),
                CHUNK_KEY_OVERHEAD,
                self.limits.key_max
            )));
        }
        Ok(large)
    }

    /// Write the chunks of `parts` (L1), each expiring at `expires_ns`. On an error, the
    /// chunks written are deleted.
    fn write_chunks(
        &mut self,
        key: &[u8],
        parts: &[&[u8]],
        total: usize,
        expires_ns: u64,
    ) -> Result<Manifest, Error> {
        let m = Manifest::new(
            total as u64,
            self.limits.chunk_data(),
            (self.clock)(),
            rand::random::<u64>(),
        );
        let mut slices = Vec::with_capacity(parts.len() + 1);
        let kind = [KIND_CHUNK];
        for i in 0..m.count {
            let start = i as usize * m.chunk_data as usize;
            slice_parts(parts, start..start + m.chunk_len(i), &mut slices);
            slices.push(&kind);
            let ck = m.chunk_key(key, i);
            let r = self.io(|c| c.put_parts_expiring(&ck, &slices, expires_ns));
            if let Err(e) = r {
                let written = Manifest {
                    count: m.count,
                    ..m
                };
                for j in (0..=i).rev() {
                    let _ = self.io(|c| c.delete(&written.chunk_key(key, j)));
                }
                return Err(e);
            }
            self.counters.chunks_written += 1;
        }
        self.run_hook(LargeHook::ChunksWritten);
        let took = (self.clock)().saturating_sub(m.written_ms);
        let deadline = self.limits.write_deadline_ms();
        if took > deadline {
            self.collect(key, &m);
            return Err(Error::Timeout {
                expiry_ms: deadline,
            });
        }
        Ok(m)
    }

    /// Publish `m` as `key`'s value under `cond` (L1). Unmet or failed for sure: its chunks
    /// are deleted. Indeterminate: they are left to the reclaimer, which keeps them if the
    /// manifest landed.
    fn publish_if(
        &mut self,
        key: &[u8],
        m: &Manifest,
        cond: Cond,
        expires_ns: u64,
    ) -> Result<CondOutcome, Error> {
        match self.io(|c| c.put_if_expiring(key, &m.encode(), cond, expires_ns)) {
            Ok(CondOutcome::Stored) => {
                self.counters.published += 1;
                self.collect_replaced(key, cond);
                Ok(CondOutcome::Stored)
            }
            Ok(unmet) => {
                self.collect(key, m);
                Ok(unmet)
            }
            Err(e @ Error::Indeterminate(_)) => Err(e),
            Err(e) => {
                self.collect(key, m);
                Err(e)
            }
        }
    }

    /// An unconditional PUT of a large item: the chunks, then the manifest, conditional on
    /// the version read just before so that the chunks it replaces are known and collected.
    fn put_large(
        &mut self,
        key: &[u8],
        parts: &[&[u8]],
        total: usize,
        e: u64,
    ) -> Result<(), Error> {
        let m = self.write_chunks(key, parts, total, e)?;
        let blind = mutated!(self, publish_blind);
        let mut buf = std::mem::take(&mut self.scratch);
        let mut result = None;
        for _ in 0..MAX_PUBLISH_ATTEMPTS {
            if blind {
                break;
            }
            let old = match self.io(|c| c.get_versioned(key, &mut buf)) {
                Ok(v) => v,
                Err(Error::Unsupported(_)) => break,
                Err(err) => {
                    self.collect(key, &m);
                    result = Some(Err(err));
                    break;
                }
            };
            let cond = match old {
                Some(v) => {
                    self.last_read = Some((key.to_vec(), v, manifest_of(&buf)));
                    Cond::Version(v)
                }
                None => Cond::Absent,
            };
            self.run_hook(LargeHook::BeforePublish);
            match self.io(|c| c.put_if_expiring(key, &m.encode(), cond, e)) {
                Ok(CondOutcome::Stored) => {
                    self.counters.published += 1;
                    self.collect_replaced(key, cond);
                    result = Some(Ok(()));
                    break;
                }
                Ok(CondOutcome::Unmet { .. }) => continue,
                Err(Error::Unsupported(_)) => break,
                Err(err @ Error::Indeterminate(_)) => {
                    result = Some(Err(err));
                    break;
                }
                Err(err) => {
                    self.collect(key, &m);
                    result = Some(Err(err));
                    break;
                }
            }
        }
        self.scratch = buf;
        if let Some(r) = result {
            return r;
        }
        // Contended (or no conditional writes): publish over whatever is there now, and
        // collect what that was as a small PUT does.
        match self.io(|c| c.put_parts_expiring(key, &[&m.encode()], e)) {
            Ok(()) => {
                self.counters.published += 1;
                if !blind {
                    self.collect_overwritten(key);
                }
                Ok(())
            }
            Err(err) => {
                if !matches!(err, Error::Indeterminate(_)) {
                    self.collect(key, &m);
                }
                Err(err)
            }
        }
    }

    fn get_at(&mut self, key: &[u8], out: &mut Vec<u8>, at: usize) -> Result<bool, Error> {
        for _ in 0..MAX_READ_ATTEMPTS {
            if !self.io(|c| c.get_into_at(key, out, at))? {
                return Ok(false);
            }
            match self.resolve(key, out, at, usize::MAX)? {
                Resolved::Value(_) => return Ok(true),
                Resolved::Missing(m) => match self.recheck(key, &m)? {
                    Recheck::Absent => return Ok(false),
                    Recheck::Again => continue,
                },
            }
        }
        out.truncate(at);
        Err(Error::Contended {
            attempts: MAX_READ_ATTEMPTS,
        })
    }

    /// A versioned read of `key`: all of its value, or, with a `head` below its length, at
    /// least its first `head` bytes (`KvClient::get_versioned_head`).
    fn get_versioned_inner(
        &mut self,
        key: &[u8],
        out: &mut Vec<u8>,
        head: usize,
    ) -> Result<Option<Version>, Error> {
        for _ in 0..MAX_READ_ATTEMPTS {
            let Some(v) = self.io(|c| c.get_versioned(key, out))? else {
                self.last_read = None;
                return Ok(None);
            };
            match self.resolve(key, out, 0, head)? {
                Resolved::Value(m) => {
                    self.last_read = Some((key.to_vec(), v, m));
                    return Ok(Some(v));
                }
                Resolved::Missing(m) => match self.recheck(key, &m)? {
                    Recheck::Absent => {
                        out.clear();
                        self.last_read = None;
                        return Ok(None);
                    }
                    Recheck::Again => continue,
                },
            }
        }
        out.clear();
        Err(Error::Contended {
            attempts: MAX_READ_ATTEMPTS,
        })
    }

    fn put_if_inner(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: Cond,
        e: u64,
    ) -> Result<CondOutcome, Error> {
        if self.check_len(key, value.len())? {
            let m = self.write_chunks(key, &[value], value.len(), e)?;
            return self.publish_if(key, &m, cond, e);
        }
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        buf.extend_from_slice(value);
        buf.push(KIND_INLINE);
        let r = self.io(|c| c.put_if_expiring(key, &buf, cond, e));
        self.scratch = buf;
        if let Ok(CondOutcome::Stored) = r {
            self.collect_replaced(key, cond);
        }
        r
    }

    /// A DELETE that reads the key's stored value first (a manifest, not its chunks), so that
    /// a large item's chunks are collected at once (L3): the delete is conditional on the
    /// version read, tried again if the key changed meanwhile, and plain after
    /// [`MAX_PUBLISH_ATTEMPTS`] (the reclaimer then collects what it removed).
    fn delete_read_first(&mut self, key: &[u8]) -> Result<(), Error> {
        let mut buf = std::mem::take(&mut self.scratch);
        let mut r = None;
        for _ in 0..MAX_PUBLISH_ATTEMPTS {
            // The stored value as it is: a manifest's chunks need not be read to be deleted.
            let v = match self.io(|c| c.get_versioned(key, &mut buf)) {
                Ok(Some(v)) => v,
                Ok(None) => {
                    r = Some(Ok(()));
                    break;
                }
                Err(Error::Unsupported(_)) => break,
                Err(e) => {
                    r = Some(Err(e));
                    break;
                }
            };
            let m = manifest_of(&buf);
            match self.io(|c| c.delete_if(key, Cond::Version(v))) {
                Ok(CondOutcome::Stored) => {
                    if let Some(m) = m {
                        self.collect(key, &m);
                    }
                    r = Some(Ok(()));
                    break;
                }
                Ok(CondOutcome::Unmet { .. }) => continue,
                Err(Error::Unsupported(_)) => break,
                Err(e) => {
                    r = Some(Err(e));
                    break;
                }
            }
        }
        self.scratch = buf;
        match r {
            Some(r) => r,
            None => {
                // Contended: a plain delete, which collects what it took out as a plain PUT
                // does.
                let r = self.io(|c| c.delete(key));
                if r.is_ok() {
                    self.collect_overwritten(key);
                }
                r
            }
        }
    }

    /// Look for orphans among the chunk-0 keys a reclaimer window held (L3): at most
    /// [`ORPHAN_CHECKS_PER_WINDOW`], from a turn that moves on each window.
    fn sweep(&mut self, firsts: &[Vec<u8>]) -> Result<u64, Error> {
        let now = (self.clock)();
        let no_grace = mutated!(self, sweep_without_grace);
        let n = firsts.len();
        let mut found = 0;
        let mut buf = std::mem::take(&mut self.scratch);
        let mut result = Ok(());
        for j in 0..n.min(ORPHAN_CHECKS_PER_WINDOW) {
            let key = &firsts[(self.sweep_turn + j) % n];
            let Some(c) = ChunkKey::parse(key) else {
                continue;
            };
            if !no_grace && now < c.written_ms.saturating_add(self.limits.grace_ms) {
                continue;
            }
            let owner_has_it = match self.io(|s| s.get_versioned(c.owner, &mut buf)) {
                Ok(Some(_)) => manifest_of(&buf).is_some_and(|m| c.named_by(&m)),
                Ok(None) => false,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            if owner_has_it {
                continue;
            }
            let m = Manifest {
                total: 0,
                chunk_data: 0,
                count: c.count,
                written_ms: c.written_ms,
                nonce: c.nonce,
            };
            self.collect(c.owner, &m);
            self.counters.orphans += 1;
            found += 1;
        }
        self.sweep_turn = self.sweep_turn.wrapping_add(ORPHAN_CHECKS_PER_WINDOW);
        self.scratch = buf;
        result.map(|()| found)
    }
}

/// The manifest `stored` holds (kind byte included), if it is a well-formed one.
fn manifest_of(stored: &[u8]) -> Option<Manifest> {
    match stored.split_last() {
        Some((&KIND_MANIFEST, body)) => Manifest::decode(body).ok(),
        _ => None,
    }
}

impl<C: KvClient> KvClient for Chunked<C> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let mut out = Vec::new();
        Ok(self.get_into(key, &mut out)?.then_some(out))
    }
    fn get_into(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        out.clear();
        self.get_into_at(key, out, 0)
    }
    fn get_into_at(&mut self, key: &[u8], out: &mut Vec<u8>, at: usize) -> Result<bool, Error> {
        self.begin(key)?;
        let r = self.get_at(key, out, at);
        self.end(r)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.put_parts_expiring(key, &[value], 0)
    }
    fn put_parts(&mut self, key: &[u8], parts: &[&[u8]]) -> Result<(), Error> {
        self.put_parts_expiring(key, parts, 0)
    }
    fn put_parts_expiring(&mut self, key: &[u8], parts: &[&[u8]], e: u64) -> Result<(), Error> {
        self.begin(key)?;
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let r = match self.check_len(key, total) {
            Err(err) => Err(err),
            Ok(true) => self.put_large(key, parts, total, e),
            Ok(false) => {
                // A small write reads nothing first; the store says what it replaced, and a
                // large item's chunks are collected then (L3).
                const ON_STACK: usize = 8;
                let kind: &[u8] = &[KIND_INLINE];
                let r = if parts.len() < ON_STACK {
                    let mut all: [&[u8]; ON_STACK] = [&[]; ON_STACK];
                    all[..parts.len()].copy_from_slice(parts);
                    all[parts.len()] = kind;
                    self.io(|c| c.put_parts_expiring(key, &all[..=parts.len()], e))
                } else {
                    let mut all = parts.to_vec();
                    all.push(kind);
                    self.io(|c| c.put_parts_expiring(key, &all, e))
                };
                if r.is_ok() {
                    self.collect_overwritten(key);
                }
                r
            }
        };
        self.end(r)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        self.begin(key)?;
        let r = self.delete_read_first(key);
        self.end(r)
    }
    fn get_versioned(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Version>, Error> {
        self.begin(key)?;
        let r = self.get_versioned_inner(key, out, usize::MAX);
        self.end(r)
    }
    fn get_versioned_head(
        &mut self,
        key: &[u8],
        out: &mut Vec<u8>,
        head: usize,
    ) -> Result<Option<Version>, Error> {
        self.begin(key)?;
        let r = self.get_versioned_inner(key, out, head);
        self.end(r)
    }
    fn put_if(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        self.put_if_expiring(key, value, cond, 0)
    }
    fn put_if_expiring(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: Cond,
        e: u64,
    ) -> Result<CondOutcome, Error> {
        self.begin(key)?;
        let r = self.put_if_inner(key, value, cond, e);
        self.end(r)
    }
    fn delete_if(&mut self, key: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        self.begin(key)?;
        let r = self.io(|c| c.delete_if(key, cond));
        if let Ok(CondOutcome::Stored) = r {
            self.collect_replaced(key, cond);
        }
        self.end(r)
    }
    fn reclaim_expired_in(
        &mut self,
        slots: std::ops::Range<u64>,
    ) -> Result<Option<Reclaimed>, Error> {
        self.evicted.clear();
        self.evicted_unsure.clear();
        let mut firsts = Vec::new();
        let (mut chunks, mut expired_chunks, mut unfetched_chunks) = (0, 0, 0);
        let r = self.io(|c| {
            c.reclaim_expired_in_noting(slots, &mut |n| {
                let Some(c) = ChunkKey::parse(n.key) else {
                    return;
                };
                chunks += 1;
                if n.expired {
                    expired_chunks += 1;
                    unfetched_chunks += u64::from(!n.fetched);
                } else if c.index == 0 {
                    firsts.push(n.key.to_vec());
                }
            })
        })?;
        let Some(mut r) = r else { return Ok(None) };
        // The counts are of items: chunks are not (expired chunks are all deleted: nobody
        // writes a chunk key twice).
        r.keys = r.keys.saturating_sub(chunks);
        r.expired = r.expired.saturating_sub(expired_chunks);
        r.deleted = r.deleted.saturating_sub(expired_chunks);
        r.unfetched = r.unfetched.saturating_sub(unfetched_chunks);
        let swept = self.sweep(&firsts);
        self.end(swept.map(|_| Some(r)))
    }
    fn scan_keys(&mut self) -> Result<Vec<Vec<u8>>, Error> {
        let mut keys = self.inner.scan_keys()?;
        keys.retain(|k| !is_reserved(k));
        Ok(keys)
    }
    fn scan_keys_in(&mut self, slots: std::ops::Range<u64>) -> Result<Vec<Vec<u8>>, Error> {
        let mut keys = self.inner.scan_keys_in(slots)?;
        keys.retain(|k| !is_reserved(k));
        Ok(keys)
    }
    fn evicted(&self) -> &[Vec<u8>] {
        &self.evicted
    }
    fn evicted_unsure(&self) -> &[Vec<u8>] {
        &self.evicted_unsure
    }
    fn aborts_retries(&self) -> (u64, u64) {
        self.inner.aborts_retries()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use nessie_fabric::inproc::InProcEndpoint;
    use nessie_store::Geometry;

    use super::*;
    use crate::cd::testkit::{fast_cfg, InProcCluster};
    use crate::cd::CdClient;
    use crate::{Optimizations, ProtocolConfig};

    /// Entries of 256 bytes: items up to 255 bytes are stored whole, longer ones in chunks
    /// of 255.
    const ENTRY_MAX: u32 = 256;
    const CHUNK: usize = ENTRY_MAX as usize - 1;
    const ITEM_MAX: u64 = 8 * 1024;
    const T0: u64 = 1_800_000_000_000;

    type Client = Chunked<CdClient<InProcEndpoint>>;

    struct Setup {
        cluster: InProcCluster,
        clock: Arc<AtomicU64>,
    }

    impl Setup {
        fn new() -> Self {
            Self::variant(&VARIANTS[0])
        }

        fn variant(v: &Variant) -> Self {
            Self::variant_expiring(v, fast_cfg().expiry_ns)
        }

        /// [`Self::variant`] with an expiry period of `expiry_ns`.
        fn variant_expiring(v: &Variant, expiry_ns: u64) -> Self {
            let g = Geometry {
                nodes: 3,
                ites_per_node: v.ites_per_node,
                dtes_per_node: 1024,
                key_max: 48,
                value_max: ENTRY_MAX,
                hash_functions: 3,
                filter_bits: 7,
            };
            let cfg = ProtocolConfig {
                optimizations: v.optimizations,
                expiry_ns,
                ..fast_cfg()
            };
            let cluster = InProcCluster::new(g, cfg);
            // Batches overlap, as over RDMA: GETs batch their candidates' READs and the layer
            // reads chunks ahead (`cd/prefetch.rs`).
            cluster.fabric.set_batches_overlap(true);
            Self {
                cluster,
                clock: Arc::new(AtomicU64::new(T0)),
            }
        }

        fn client(&self, node: u16) -> Client {
            let clock = self.clock.clone();
            let limits = LargeLimits::new(48, ENTRY_MAX, ITEM_MAX).unwrap();
            Chunked::new(self.cluster.client(node), limits)
                .with_clock(move || clock.load(Ordering::Relaxed))
        }

        fn advance(&self, ms: u64) {
            self.clock.fetch_add(ms, Ordering::Relaxed);
        }

        /// Every chunk key in the store, by a scan under the layer.
        fn chunk_keys(&self) -> Vec<Vec<u8>> {
            let mut raw = self.cluster.client(0);
            let mut keys = raw.scan_keys().unwrap();
            keys.retain(|k| is_reserved(k));
            keys.sort();
            keys
        }

        /// One reclaimer pass over the whole index.
        fn sweep(&self, c: &mut Client) -> Reclaimed {
            let total = self.cluster.view.geometry.total_ites();
            c.reclaim_expired_in(0..total).unwrap().unwrap()
        }
    }

    /// A cluster the race tests run on: a large index, then a small one (8 slots a node: a
    /// key's candidates hold others', and writes migrate), with every optimisation, each off
    /// in turn, and none.
    struct Variant {
        name: &'static str,
        ites_per_node: u64,
        optimizations: Optimizations,
    }

    const ALL: Optimizations = Optimizations {
        filter_bits: true,
        cache: true,
        previous_versions: true,
        multi_read: true,
    };

    const VARIANTS: [Variant; 7] = [
        Variant {
            name: "large index",
            ites_per_node: 512,
            optimizations: ALL,
        },
        Variant {
            name: "small index",
            ites_per_node: 8,
            optimizations: ALL,
        },
        Variant {
            name: "small index, no filter bits",
            ites_per_node: 8,
            optimizations: Optimizations {
                filter_bits: false,
                ..ALL
            },
        },
        Variant {
            name: "small index, no cache",
            ites_per_node: 8,
            optimizations: Optimizations {
                cache: false,
                ..ALL
            },
        },
        Variant {
            name: "small index, no previous versions",
            ites_per_node: 8,
            optimizations: Optimizations {
                previous_versions: false,
                ..ALL
            },
        },
        Variant {
            name: "small index, no multi-read",
            ites_per_node: 8,
            optimizations: Optimizations {
                multi_read: false,
                ..ALL
            },
        },
        Variant {
            name: "small index, none",
            ites_per_node: 8,
            optimizations: Optimizations::NONE,
        },
    ];

    /// A value whose bytes say which value and which offset they are: a mix of two is seen.
    fn value(tag: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| tag.wrapping_mul(31) ^ (i as u8) ^ ((i >> 8) as u8))
            .collect()
    }

    #[test]
    fn items_of_every_length_around_the_chunk_size_read_back_whole() {
        let s = Setup::new();
        let mut c = s.client(0);
        let mut r = s.client(2);
        let lens = [
            0,
            1,
            CHUNK - 1,
            CHUNK,
            CHUNK + 1,
            2 * CHUNK - 1,
            2 * CHUNK,
            2 * CHUNK + 1,
            5000,
            ITEM_MAX as usize,
        ];
        for (i, &len) in lens.iter().enumerate() {
            let key = format!("k{i}");
            let v = value(i as u8, len);
            c.put(key.as_bytes(), &v).unwrap();
            assert_eq!(r.get(key.as_bytes()).unwrap(), Some(v.clone()), "len {len}");
            // Read in place behind what a reply already holds.
            let mut out = b"HEAD".to_vec();
            assert!(r.get_into_at(key.as_bytes(), &mut out, 4).unwrap());
            assert_eq!(&out[..4], b"HEAD");
            assert_eq!(&out[4..], &v[..]);
        }
        // The chunks on other nodes were read ahead, a window at a time, and the GETs took
        // them from there (32 chunks of the largest item, twice over).
        let hits = r.inner().prefetch_stats().hits;
        assert!(hits >= 20, "{hits} chunks from the prefetch");
        // Parts that straddle chunk boundaries are stored as their concatenation.
        let v = value(9, 3 * CHUNK + 7);
        let parts: Vec<&[u8]> = vec![&v[..10], &v[10..CHUNK + 3], &[], &v[CHUNK + 3..]];
        c.put_parts(b"parts", &parts).unwrap();
        assert_eq!(r.get(b"parts").unwrap(), Some(v));
        // The layer's own chunks, never a user's keys: every key the scan lists is a user's.
        let mut keys = r.scan_keys().unwrap();
        keys.sort();
        assert_eq!(keys.len(), lens.len() + 1);
        assert!(keys.iter().all(|k| !is_reserved(k)));
        let chunks: usize = lens
            .iter()
            .map(|&l| if l > CHUNK { l.div_ceil(CHUNK) } else { 0 })
            .sum();
        assert_eq!(s.chunk_keys().len(), chunks + 4);
    }

    /// A head read (a front end's DELETE) reads the manifest and the chunks that hold the
    /// head, not the others; its version is the item's, and a delete at that version collects
    /// every chunk. A value shorter than the head comes whole.
    #[test]
    fn a_head_read_stops_at_the_chunks_it_needs_and_its_delete_collects_them_all() {
        let s = Setup::new();
        let mut c = s.client(0);
        let v = value(7, 5 * CHUNK + 3);
        c.put(b"k", &v).unwrap();
        c.put(b"small", b"tiny").unwrap();
        let mut r = s.client(1);
        let reads = |r: &mut Client| r.inner().stats().gets;
        let mut out = Vec::new();
        for (head, chunks) in [(1, 1), (10, 1), (CHUNK, 1), (CHUNK + 1, 2), (v.len(), 6)] {
            let before = reads(&mut r);
            let ver = r.get_versioned_head(b"k", &mut out, head).unwrap();
            assert_eq!(reads(&mut r) - before, 1 + chunks, "head {head}");
            assert!(out.len() >= head && v.starts_with(&out), "head {head}");
            assert_eq!(out.len() == v.len(), chunks == 6, "head {head}");
            let mut all = Vec::new();
            assert_eq!(r.get_versioned(b"k", &mut all).unwrap(), ver);
            assert_eq!(all, v);
        }
        let ver = r.get_versioned_head(b"small", &mut out, 10).unwrap();
        assert!(ver.is_some());
        assert_eq!(out, b"tiny");
        let ver = r.get_versioned_head(b"k", &mut out, 10).unwrap().unwrap();
        assert_eq!(
            r.delete_if(b"k", Cond::Version(ver)).unwrap(),
            CondOutcome::Stored
        );
        assert_eq!(r.get(b"k").unwrap(), None);
        assert!(s.chunk_keys().is_empty(), "{:?}", s.chunk_keys());
    }

    #[test]
    fn bad_requests_are_refused_with_what_is_wrong() {
        let s = Setup::new();
        let mut c = s.client(0);
        let e = c.put(b"big", &vec![0; ITEM_MAX as usize + 1]).unwrap_err();
        assert_eq!(
            e,
            Error::ItemTooLarge {
                len: ITEM_MAX + 1,
                max: ITEM_MAX
            }
        );
        let mut reserved = RESERVED_PREFIX.to_vec();
        reserved.extend_from_slice(b"x");
        for e in [
            c.put(&reserved, b"v").unwrap_err(),
            c.get(&reserved).unwrap_err(),
            c.delete(&reserved).unwrap_err(),
        ] {
            assert!(matches!(e, Error::KeyReserved { .. }), "{e}");
        }
        // A key too long to name chunks: refused for a large item, fine for a small one.
        let long = [b'l'; 30];
        let e = c.put(&long, &value(1, CHUNK + 1)).unwrap_err();
        assert!(e.to_string().contains("at most 22 bytes"), "{e}");
        c.put(&long, &value(1, CHUNK)).unwrap();
        assert!(
            s.chunk_keys().is_empty(),
            "nothing left of the refused writes"
        );
        // Limits that cannot work.
        assert!(LargeLimits::new(48, 16, ITEM_MAX).is_err());
        assert!(LargeLimits::new(48, 256, ITEM_MAX_LIMIT + 1).is_err());
        assert!(LargeLimits::new(48, 256, 100).is_err());
        // A value not written through the layer is reported, not misread.
        let mut raw = s.cluster.client(1);
        raw.put(b"foreign", b"abc").unwrap();
        let e = c.get(b"foreign").unwrap_err();
        assert!(e.to_string().contains("kind byte 99"), "{e}");
    }

    /// L3, prompt half: a large PUT over a large item collects the old chunks at once; the
    /// mutation that publishes without reading the old value leaves them behind.
    #[test]
    fn a_large_overwrite_collects_the_chunks_it_replaces() {
        for blind in [false, true] {
            let s = Setup::new();
            let mut c = s.client(0);
            c.mutations.publish_blind = blind;
            c.put(b"k", &value(1, 4 * CHUNK)).unwrap();
            c.put(b"k", &value(2, 2 * CHUNK)).unwrap();
            assert_eq!(c.get(b"k").unwrap(), Some(value(2, 2 * CHUNK)));
            let left = s.chunk_keys().len();
            if blind {
                assert_eq!(left, 6, "the mutation leaves the old chunks");
            } else {
                assert_eq!(left, 2, "only the new item's chunks");
            }
        }
    }

    /// L3, reclaimer half: chunks a small write or a plain DELETE left behind are deleted by
    /// the reclaimer once older than the grace period, never before; live items keep theirs.
    #[test]
    fn orphaned_chunks_are_reclaimed_after_the_grace_period() {
        let s = Setup::new();
        let mut c = s.client(0);
        // Orphans as a small PUT left them before it learnt what it replaced (as one still
        // does when that read fails, or comes too late).
        c.mutations.keep_shrunk_chunks = true;
        c.put(b"small-over", &value(1, 3 * CHUNK)).unwrap();
        c.put(b"deleted", &value(2, 2 * CHUNK)).unwrap();
        c.put(b"live", &value(3, 2 * CHUNK)).unwrap();
        c.put(b"small-over", b"tiny").unwrap();
        c.delete(b"deleted").unwrap();
        assert_eq!(
            s.chunk_keys().len(),
            5,
            "a DELETE reads first and collects at once"
        );
        let r = s.sweep(&mut c);
        assert_eq!(r.keys, 2, "items only: small-over and live ({r:?})");
        assert_eq!(
            s.chunk_keys().len(),
            5,
            "within the grace period, nothing is taken"
        );
        s.advance(ORPHAN_GRACE_MS + 1);
        s.sweep(&mut c);
        assert_eq!(c.counters().orphans, 1);
        assert_eq!(s.chunk_keys().len(), 2, "the live item's chunks stay");
        assert_eq!(c.get(b"live").unwrap(), Some(value(3, 2 * CHUNK)));
        assert_eq!(c.get(b"small-over").unwrap(), Some(b"tiny".to_vec()));
    }

    /// L3 for small overwrites: a small PUT over a large item collects its chunks at once,
    /// through a client on the writer's node or another's; the control mutation leaves them.
    /// A small value of a manifest's length is read and left alone.
    #[test]
    fn a_small_overwrite_collects_the_chunks_it_replaces() {
        for v in &VARIANTS {
            for (keep, node) in [(false, 0), (false, 1), (true, 0)] {
                let s = Setup::variant(v);
                let mut w = s.client(0);
                w.put(b"k", &value(1, 3 * CHUNK)).unwrap();
                assert_eq!(s.chunk_keys().len(), 3);
                let mut c = s.client(node);
                c.mutations.keep_shrunk_chunks = keep;
                c.put(b"k", b"tiny").unwrap();
                assert_eq!(c.get(b"k").unwrap(), Some(b"tiny".to_vec()));
                let (left, shrunk) = (s.chunk_keys().len(), c.counters().shrunk);
                match keep {
                    true => assert_eq!((left, shrunk), (3, 0), "{}: the mutation", v.name),
                    false => assert_eq!((left, shrunk), (0, 1), "{}: node {node}", v.name),
                }
            }
            let s = Setup::variant(v);
            let mut c = s.client(0);
            let look_alike = value(4, MANIFEST_LEN);
            c.put(b"k", &look_alike).unwrap();
            c.put(b"k", b"x").unwrap();
            assert_eq!(c.counters().shrunk, 0, "{}", v.name);
            assert_eq!(c.get(b"k").unwrap(), Some(b"x".to_vec()));
        }
    }

    /// A large PUT that loses every conditional publish to another writer publishes without
    /// a condition, and collects the item it replaced as a small PUT does; the control
    /// mutation leaves that item's chunks.
    #[test]
    fn a_contended_large_put_collects_what_it_overwrote() {
        for keep in [false, true] {
            let s = Setup::new();
            let mut w = s.client(1);
            w.put(b"k", &value(1, 2 * CHUNK)).unwrap();
            let other = Arc::new(Mutex::new(w));
            let hook_other = other.clone();
            let mut c = s.client(0);
            c.mutations.keep_shrunk_chunks = keep;
            let mut n = 0u8;
            c.hook = Some(Box::new(move |at| {
                if at == LargeHook::BeforePublish {
                    n += 1;
                    let v = value(10 + n, 2 * CHUNK);
                    hook_other.lock().unwrap().put(b"k", &v).unwrap();
                }
            }));
            let mine = value(3, 3 * CHUNK);
            c.put(b"k", &mine).unwrap();
            c.hook = None;
            assert_eq!(c.get(b"k").unwrap(), Some(mine), "keep {keep}");
            let left = s.chunk_keys().len();
            match keep {
                true => assert_eq!(left, 3 + 2, "the mutation leaves the last other's"),
                false => {
                    assert_eq!(left, 3, "only the live item's chunks");
                    assert_eq!(c.counters().shrunk, 1);
                }
            }
        }
    }

    /// L3 without failures: after overwrites of every size by three clients on a few keys
    /// (large over large, small over large, large over small, deletes, contended or not), the
    /// chunks left are those of the live items' manifests: nothing waits for the reclaimer,
    /// but for one race. A plain PUT's Step 4 that clears another writer's in-progress publish
    /// of the key cannot tell whether that publish will commit (then its chunks are garbage)
    /// or retry with the same chunks, so it leaves them to the reclaimer: at most 3 chunks
    /// per such clear (`ClientStats::cleared_in_progress`). Over every variant (a small index
    /// puts keys behind empty candidates, where Step 4 clears the entry a PUT replaces).
    /// Found leaking a few chunks in 800 operations before the store reported what Step 4,
    /// a contended publish and a contended delete replaced.
    #[test]
    fn no_chunk_outlives_its_item_when_nothing_fails() {
        for v in &VARIANTS {
            let (left, live, cleared) = chunks_after_random_writes(v, false);
            assert!(
                left >= live && left - live <= 3 * cleared as usize,
                "{}: {left} chunks for {live} live, {cleared} in-progress publishes cleared",
                v.name
            );
        }
        // The control: plain PUTs that leave what they replaced to the reclaimer.
        let (left, live, cleared) = chunks_after_random_writes(&VARIANTS[0], true);
        assert!(
            left > live + 3 * cleared as usize,
            "keep_shrunk_chunks left {left} for {live} live, {cleared} cleared"
        );
    }

    /// The chunks in the index, those the live items' manifests name, and the in-progress
    /// entries Step 4s cleared, after random writes by three clients.
    fn chunks_after_random_writes(v: &Variant, keep_shrunk_chunks: bool) -> (usize, usize, u64) {
        let cleared = AtomicU64::new(0);
        use std::sync::atomic::Ordering::Relaxed;
        let unread = AtomicU64::new(0);
        use rand::{Rng, SeedableRng};
        // An expiry period long enough that a PUT reads what it replaced in time (with the
        // test clusters' 2 ms, three threads on two cores miss it now and then, and leave
        // those chunks to the reclaimer, as designed: `unread` counts them).
        let s = Setup::variant_expiring(v, 500_000_000);
        let keys: Vec<Vec<u8>> = (0..4).map(|i| format!("key-{i}").into_bytes()).collect();
        std::thread::scope(|sc| {
            for t in 0..3u16 {
                let mut c = s.client(t);
                c.mutations.keep_shrunk_chunks = keep_shrunk_chunks;
                let (keys, unread, cleared) = (&keys, &unread, &cleared);
                sc.spawn(move || {
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64);
                    for i in 0..400 {
                        let k = &keys[rng.gen_range(0..keys.len())];
                        let r = if rng.gen_range(0..10) == 0 {
                            c.delete(k)
                        } else {
                            let len = rng.gen_range(0..3 * CHUNK);
                            c.put(k, &value(i as u8, len))
                        };
                        // A small index may have no room for a key and its chunks: refused,
                        // with what the write had written taken back.
                        match r {
                            Ok(()) | Err(Error::IndexFull { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                    unread.fetch_add(c.counters().overwritten_unread, Relaxed);
                    cleared.fetch_add(c.inner().stats().cleared_in_progress, Relaxed);
                });
            }
        });
        let mut c = s.client(2);
        let mut live = 0;
        let mut raw = Vec::new();
        for k in &keys {
            if let Some(_v) = c.inner().get_versioned(k, &mut raw).unwrap() {
                if let Some(m) = manifest_of(&raw) {
                    live += m.count as usize;
                }
            }
        }
        // A replaced manifest read too late leaves its chunks to the reclaimer (by design);
        // with this expiry period it would take a thread stalled for half a second.
        assert_eq!(unread.load(Relaxed), 0, "{}: read too late", v.name);
        (s.chunk_keys().len(), live, cleared.load(Relaxed))
    }

    /// The race of L2: a GET reads a manifest, and before it reads the chunks the item is
    /// replaced and the old chunks collected (by a conditional overwrite, large or small, or
    /// by a plain small PUT, which learns what it replaced from the store). The GET reads the
    /// key again and returns the new value: never a mix, never "absent" for a key that was
    /// always present. The mutation that trusts the missing chunk answers "absent", and is
    /// caught.
    #[test]
    fn a_get_whose_chunks_are_collected_under_it_reads_the_new_value() {
        let cases = [
            (false, 3 * CHUNK, false),
            (false, 10, false),
            (false, 10, true),
            (true, 3 * CHUNK, false),
        ];
        for (v, (mutated, next_len, plain)) in VARIANTS.iter().flat_map(|v| cases.map(|c| (v, c))) {
            let s = Setup::variant(v);
            let mut w = s.client(1);
            w.put(b"k", &value(1, 2 * CHUNK + 5)).unwrap();
            let mut r = s.client(0);
            r.mutations.trust_missing_chunk = mutated;
            let writer = Arc::new(Mutex::new(Some(w)));
            let hook_writer = writer.clone();
            let new = value(2, next_len);
            let hook_new = new.clone();
            let name = v.name;
            r.hook = Some(Box::new(move |at| {
                if at != LargeHook::ManifestRead {
                    return;
                }
                if let Some(mut w) = hook_writer.lock().unwrap().take() {
                    if plain {
                        let shrunk = w.counters().shrunk;
                        w.put(b"k", &hook_new).unwrap();
                        assert_eq!(w.counters().shrunk, shrunk + 1, "{name}: collected");
                        return;
                    }
                    // A conditional overwrite, so that the old chunks are collected at once; as
                    // every read-modify-write, tried again when the version moved (a version
                    // is the ITE word, which a completion or a migration changes too).
                    let mut buf = Vec::new();
                    let stored = (0..16).any(|_| {
                        let ver = w.get_versioned(b"k", &mut buf).unwrap().unwrap();
                        let got = w.put_if(b"k", &hook_new, Cond::Version(ver)).unwrap();
                        got == CondOutcome::Stored
                    });
                    assert!(stored, "{name}: the overwrite never took effect");
                }
            }));
            let got = r.get(b"k").unwrap();
            assert!(writer.lock().unwrap().is_none(), "the race ran");
            if mutated {
                assert_eq!(
                    got, None,
                    "{}: the mutation reads a present key as absent",
                    v.name
                );
            } else {
                assert_eq!(got, Some(new), "{}: the new value, whole", v.name);
            }
        }
    }

    /// The race of L1 and the grace period: a PUT has written its chunks and not yet
    /// published them when the reclaimer passes. The chunks are young, and stay; without
    /// the grace (the mutation) they are taken, and the published item is lost.
    #[test]
    fn a_put_still_publishing_keeps_its_chunks_through_a_reclaimer_pass() {
        for (v, mutated) in VARIANTS.iter().flat_map(|v| [(v, false), (v, true)]) {
            let s = Setup::variant(v);
            let mut w = s.client(1);
            let sweeper = Arc::new(Mutex::new(s.client(2)));
            sweeper.lock().unwrap().mutations.sweep_without_grace = mutated;
            let total = s.cluster.view.geometry.total_ites();
            let hook_sweeper = sweeper.clone();
            w.hook = Some(Box::new(move |at| {
                if at == LargeHook::ChunksWritten {
                    hook_sweeper
                        .lock()
                        .unwrap()
                        .reclaim_expired_in(0..total)
                        .unwrap();
                }
            }));
            let item = value(5, 3 * CHUNK);
            w.put(b"k", &item).unwrap();
            let got = s.client(0).get(b"k").unwrap();
            let orphans = sweeper.lock().unwrap().counters().orphans;
            if mutated {
                assert_eq!(orphans, 1, "{}", v.name);
                assert_eq!(got, None, "{}: the mutation loses the item", v.name);
            } else {
                assert_eq!(orphans, 0, "{}", v.name);
                assert_eq!(got, Some(item), "{}", v.name);
            }
        }
    }

    /// A chunk lost under a current manifest (evicted): the item reads absent, is deleted
    /// conditionally on that manifest, its other chunks are collected, and the GET reports
    /// the eviction.
    #[test]
    fn an_item_that_lost_a_chunk_is_deleted_and_reported_evicted() {
        let s = Setup::new();
        let mut c = s.client(0);
        c.put(b"k", &value(1, 3 * CHUNK)).unwrap();
        let chunks = s.chunk_keys();
        assert_eq!(chunks.len(), 3);
        s.cluster.client(2).delete(&chunks[1]).unwrap();
        assert_eq!(c.get(b"k").unwrap(), None);
        assert_eq!(c.evicted(), [b"k".to_vec()]);
        assert_eq!(c.counters().broken, 1);
        assert!(s.chunk_keys().is_empty(), "the rest collected");
        assert_eq!(c.inner().get(b"k").unwrap(), None, "the manifest deleted");
        // The next operation starts with no evictions.
        c.put(b"j", b"v").unwrap();
        assert!(c.evicted().is_empty());
    }

    /// In a full store that evicts, every key that reads absent was reported evicted by the
    /// operation that evicted it, even when that was one of a large PUT's chunk writes; the
    /// mutation that reads the store's evictions only after its last operation is caught.
    #[test]
    fn every_eviction_under_a_large_put_is_reported() {
        for mutated in [false, true] {
            let mut g = Setup::new();
            let geometry = Geometry {
                dtes_per_node: 24,
                ..g.cluster.view.geometry.clone()
            };
            let cfg = ProtocolConfig {
                eviction: crate::Eviction::AllkeysRandom,
                ..fast_cfg()
            };
            g.cluster = InProcCluster::new(geometry, cfg);
            let mut c = g.client(0);
            c.mutations.harvest_at_end_only = mutated;
            let mut live = std::collections::BTreeSet::new();
            let mut evictions = 0;
            for i in 0..300u32 {
                let key = format!("k{}", i % 40);
                let len = if i % 3 == 0 { 40 } else { 2 * CHUNK + 9 };
                match c.put(key.as_bytes(), &value(i as u8, len)) {
                    Ok(()) => {
                        live.insert(key.clone());
                    }
                    Err(e) => panic!("{e}"),
                }
                for k in c.evicted() {
                    evictions += 1;
                    live.remove(&String::from_utf8(k.clone()).unwrap());
                }
                g.cluster.reclaim(0);
            }
            // The mutation reports fewer (that is what it breaks): 14 to 41 in 12 runs, where
            // the layer reported 88 to 128. A CI run once failed this bound on the mutated run.
            assert!(mutated || evictions > 20, "the store evicted: {evictions}");
            // A GET that finds a chunk evicted deletes the item and reports it itself (and the
            // tombstone of that delete may evict others, reported with it).
            let mut unreported = Vec::new();
            let mut gone = std::collections::BTreeSet::new();
            for k in &live {
                let absent = c.get(k.as_bytes()).unwrap().is_none();
                gone.extend(
                    c.evicted()
                        .iter()
                        .map(|e| String::from_utf8(e.clone()).unwrap()),
                );
                if absent && !gone.contains(k) {
                    unreported.push(k.clone());
                }
            }
            if mutated {
                assert!(!unreported.is_empty(), "the mutation loses evictions");
            } else {
                assert!(
                    unreported.is_empty(),
                    "absent, never reported: {unreported:?}"
                );
            }
        }
    }

    /// Conditional writes and deletes of large items: versions are the manifest's, and a
    /// write or delete at the version read collects the chunks it replaced.
    #[test]
    fn conditional_writes_of_large_items_collect_what_they_replace() {
        let s = Setup::new();
        let mut c = s.client(0);
        let big = value(1, 2 * CHUNK + 1);
        assert_eq!(
            c.put_if(b"k", &big, Cond::Absent).unwrap(),
            CondOutcome::Stored
        );
        assert!(matches!(
            c.put_if(b"k", &big, Cond::Absent).unwrap(),
            CondOutcome::Unmet { current: Some(_) }
        ));
        assert_eq!(
            s.chunk_keys().len(),
            3,
            "the refused write's chunks are gone"
        );
        let mut buf = Vec::new();
        let v = c.get_versioned(b"k", &mut buf).unwrap().unwrap();
        assert_eq!(buf, big);
        let bigger = value(2, 4 * CHUNK);
        assert_eq!(
            c.put_if(b"k", &bigger, Cond::Version(v)).unwrap(),
            CondOutcome::Stored
        );
        assert_eq!(s.chunk_keys().len(), 4);
        // A stale version: unmet, nothing written.
        assert!(matches!(
            c.put_if(b"k", b"x", Cond::Version(v)).unwrap(),
            CondOutcome::Unmet { .. }
        ));
        let v2 = c.get_versioned(b"k", &mut buf).unwrap().unwrap();
        assert_eq!(buf, bigger);
        assert_eq!(
            c.delete_if(b"k", Cond::Version(v2)).unwrap(),
            CondOutcome::Stored
        );
        assert!(s.chunk_keys().is_empty());
        assert_eq!(c.get(b"k").unwrap(), None);
    }

    /// A large item expires whole: it reads absent after its expiry time, and the reclaimer
    /// deletes its manifest and its chunks, counting one item.
    #[test]
    fn an_expired_large_item_is_reclaimed_as_one_item() {
        let s = Setup::new();
        let mut c = s.client(0);
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let past = now_ns - 1_000_000_000;
        c.put_parts_expiring(b"gone", &[&value(1, 3 * CHUNK)], past)
            .unwrap();
        c.put_parts_expiring(b"kept", &[&value(2, 2 * CHUNK)], now_ns + 3_600_000_000_000)
            .unwrap();
        assert_eq!(c.get(b"gone").unwrap(), None);
        let r = s.sweep(&mut c);
        assert_eq!((r.keys, r.expired, r.deleted), (2, 1, 1), "{r:?}");
        assert_eq!(s.chunk_keys().len(), 2);
        assert_eq!(c.get(b"kept").unwrap(), Some(value(2, 2 * CHUNK)));
    }

    #[test]
    fn manifests_and_chunk_keys_round_trip_and_bad_ones_are_refused() {
        let m = Manifest::new(1000, 255, T0, 42);
        assert_eq!(m.count, 4);
        assert_eq!(m.chunk_len(3), 1000 - 3 * 255);
        let b = m.encode();
        assert_eq!(Manifest::decode(&b[..MANIFEST_LEN]), Ok(m));
        assert_eq!(manifest_of(&b), Some(m));
        let mut bad = b;
        bad[19] ^= 1; // the chunk count
        assert!(Manifest::decode(&bad[..MANIFEST_LEN]).is_err());
        assert!(Manifest::decode(&b[..MANIFEST_LEN - 1]).is_err());
        let k = m.chunk_key(b"owner", 3);
        let c = ChunkKey::parse(&k).unwrap();
        assert_eq!((c.index, c.count, c.owner), (3, 4, &b"owner"[..]));
        assert!(c.named_by(&m));
        assert!(!c.named_by(&Manifest::new(1000, 255, T0, 43)));
        assert_eq!(ChunkKey::parse(b"plain"), None);
    }
}
