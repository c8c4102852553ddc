//! How the protocol touches memory: ITEs always through the fabric (even on the own node, since
//! fabric CAS is atomic only against other fabric operations), DTEs directly when local, from
//! the cache when possible, otherwise with one or two fabric READs.
//!
//! An ITE names its DTE's node (DTI), size class and slot, so a reader knows where the entry
//! is and how large it is without reading anything else. A writer's DTE goes into its own
//! node's memory when the class has room there, else into a page it holds on another node.

use nessie_fabric::{Batch, Endpoint, FabricError, NodeId, OpId, RemoteAddr, MAX_BATCH_OPS};
use nessie_store::access::Access;
use nessie_store::classtable::{ClassAllocError, Purpose, Slot as DteSlot};
use nessie_store::dte::{DteLayout, DteMeta, Head, ACCESS_OFF, HEADER_OFF, KEY_OFF, RECYCLE_OFF};
use nessie_store::index::Slot;
use nessie_store::{Ite, DATA_REGION};

use super::{Abort, Attempt, CdClient, Deadline};
use crate::error::Error;
use crate::hooks::HookPoint;

/// Where a DTE's bytes came from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    Local,
    Cache,
    Remote,
}

/// Bytes from a local DTE's start whose cache lines are prefetched before its header is read,
/// when its value may follow (the copy loop prefetches further ahead once it runs).
const LOCAL_PREFETCH_BYTES: u64 = 1024;
/// A value part at least this long is written into a local entry straight from the caller's
/// buffer (`write_parts_direct`), not copied into the entry's encoding first: for a 16 KiB
/// value that copy cost as much as the streamed write itself.
pub(crate) const DIRECT_PART_MIN: usize = 4096;

/// How much of a DTE to fetch.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// Header and key only (PUT, DELETE: values are never needed).
    Key,
    /// The value too, if the entry is valid and holds the key asked for (GET).
    ValueIfMatch,
    /// The value too, if the entry is valid, whatever its key (MIGRATE copies it).
    ValueIfValid,
    /// The value too, if the entry holds the key, valid or not (completing an abandoned
    /// write copies it).
    ValueIfKey,
}

/// Where the DTE an ITE refers to lives, and its size.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct DteLoc {
    pub node: NodeId,
    pub off: u64,
    /// Bytes of the entry (its class's entry size).
    pub size: u64,
}

/// Where a fetched value's bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ValueAt {
    /// In the read buffer, behind the entry's header and key (one READ of the whole entry, or
    /// a cache hit).
    Buf(std::ops::Range<usize>),
    /// Alone in the value buffer from `vbase` on, this many bytes (a READ of the value only,
    /// which lands where the caller of `get_into` wants it).
    Alone(usize),
}

/// Nanoseconds per millisecond: the access clock counts ms.
pub(crate) const NS_PER_MS: u64 = 1_000_000;

/// The expiry and access words a new entry starts with: a fresh write's own (its expiry, and
/// an access clock of now), or those of the entry a MIGRATE or a completion copies (the
/// copy is the same item: it keeps its expiry and its use).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Words {
    pub expires: u64,
    pub access: Access,
}

impl Words {
    pub(crate) fn of(meta: &DteMeta) -> Self {
        Self {
            expires: meta.expires,
            access: meta.access,
        }
    }
}

/// A DTE fetched into the client's read buffer (header and key) and, when its value was read
/// on its own, the value buffer.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Fetched {
    pub meta: DteMeta,
    /// The DTE holds the key that was asked for.
    pub key_matches: bool,
    /// The value bytes were read too.
    pub value_loaded: bool,
    /// ... into the value buffer, not behind the header.
    pub value_alone: bool,
    #[allow(dead_code)]
    pub source: Source,
}

impl<E: Endpoint> CdClient<E> {
    /// READ the ITE in `slot`. Returns it with the (monotonic) time the read was issued, the
    /// conservative "retrieval time" for expiry arithmetic (the ITE held this value at some
    /// instant after it).
    pub(crate) fn read_ite(&mut self, slot: Slot) -> Attempt<(Ite, u64)> {
        let t = self.ep.mono_ns();
        self.read_ite_after(slot, t)
    }

    /// READ the ITE in `slot`, issued at or after the monotonic time `t` (an earlier time
    /// already taken spares a clock read: it only makes expiry arithmetic more conservative).
    pub(crate) fn read_ite_after(&mut self, slot: Slot, t: u64) -> Attempt<(Ite, u64)> {
        Ok((self.read_ite_word(slot)?, t))
    }

    /// READ the ITE in `slot`, for a caller that needs no retrieval time (a re-read compared
    /// with an earlier one).
    pub(crate) fn read_ite_word(&mut self, slot: Slot) -> Attempt<Ite> {
        let addr = self.view.index.addr(slot);
        let v = Ite(self.ep.read_u64(addr)?);
        debug_assert!(
            self.view.index.ite.is_well_formed(v),
            "malformed ITE {v:?} at {addr}"
        );
        self.hook(HookPoint::AfterIteRead);
        Ok(v)
    }

    /// Whether a GET's forward pass may read its candidates' ITEs in one batch
    /// ([`Self::read_ites_batched`]) rather than one after another: only where a batch's READs
    /// are in flight together (`Endpoint::overlaps_batches`: over a network, not over shared
    /// memory, in process or in the simulator), so that the batch saves round trips (it may
    /// read candidates the pass would not have reached). Never with a test hook installed:
    /// hooks stop the pass between two ITE READs, an interleaving a batch does not have.
    pub(crate) fn batches_ite_reads(&self) -> bool {
        #[cfg(any(test, feature = "testing"))]
        if self.hook.is_some() {
            return false;
        }
        self.ep.overlaps_batches(nessie_store::INDEX_REGION)
    }

    /// READ the ITEs in `slots` in one batch into `out`, each with its own outcome as
    /// [`Self::read_ite_word`] would have returned it (an error counts only if the pass
    /// reaches that candidate). Nothing is read (`out` stays empty) when every candidate is
    /// on one node: a batch saves nothing there.
    pub(crate) fn read_ites_batched(
        &mut self,
        slots: &[Slot],
        out: &mut [Option<Result<Ite, FabricError>>],
    ) {
        const MAX: usize = nessie_store::limits::MAX_HASH_FUNCTIONS as usize;
        assert!(slots.len() <= out.len() && slots.len() <= MAX.min(MAX_BATCH_OPS));
        let index = &self.view.index;
        let Some(&first) = slots.first() else { return };
        if slots
            .iter()
            .all(|&s| index.addr(s).node == index.addr(first).node)
        {
            return;
        }
        let mut words = [[0u8; 8]; MAX];
        let mut results: [Option<Result<u64, FabricError>>; MAX] = [const { None }; MAX];
        let mut batch = Batch::new();
        for (&slot, w) in slots.iter().zip(words.iter_mut()) {
            batch.read(index.addr(slot), w);
        }
        self.ep.run_batch(&mut batch);
        for (i, r) in results[..slots.len()].iter_mut().enumerate() {
            *r = Some(batch.result(OpId(i)));
        }
        for (i, r) in results[..slots.len()].iter_mut().enumerate() {
            out[i] = r.take().map(|r| {
                r.map(|_| {
                    let v = Ite(u64::from_le_bytes(words[i]));
                    debug_assert!(
                        self.view.index.ite.is_well_formed(v),
                        "malformed ITE {v:?} at {}",
                        self.view.index.addr(slots[i])
                    );
                    v
                })
            });
        }
    }

    /// CAS the ITE in `slot` from `expected` to `desired`, with the sequence number after
    /// `expected`'s (`IteLayout::successor`). The word installed, if the CAS took place.
    pub(crate) fn cas_ite(
        &mut self,
        slot: Slot,
        expected: Ite,
        desired: Ite,
    ) -> Attempt<Option<Ite>> {
        let addr = self.view.index.addr(slot);
        let layout = &self.view.index.ite;
        let installed = layout.successor(expected, desired);
        // An ITE crosses to shared memory here: it must decode within the cluster's layout,
        // and a present one must name a DTE slot that exists (a bad word would send every
        // reader of the key to someone else's memory).
        assert!(
            layout.is_well_formed(expected) && layout.is_well_formed(installed),
            "malformed ITE before a CAS at {addr}: {expected:?} -> {installed:?}"
        );
        assert!(
            installed.is_empty() || self.view.names_a_dte(installed),
            "ITE {installed:?} names no DTE, before a CAS at {addr}"
        );
        let was = self.ep.compare_and_swap(addr, expected.0, installed.0)?;
        Ok((was == expected.0).then_some(installed))
    }

    /// Node, byte offset and size of the DTE an ITE refers to.
    pub(crate) fn dte_location(&self, ite: Ite) -> DteLoc {
        let l = &self.view.index.ite;
        let (class, slot) = self.view.field.decode(l.dte(ite));
        let classes = &self.view.classes;
        debug_assert!(
            (class as usize) < classes.len(),
            "ITE {ite:?} names class {class}"
        );
        DteLoc {
            node: l.dti(ite) as NodeId,
            off: classes.offset(class, slot),
            size: classes.entry_size(class),
        }
    }

    /// Bytes of a DTE at `loc` that hold its header and any key it can hold.
    pub(crate) fn meta_len(&self, loc: DteLoc) -> usize {
        self.view.dte.meta_size.min(loc.size) as usize
    }

    /// Fetch the DTE `ite` refers to into `self.buf`: header and key always, the value as
    /// `want` says. `ite_read_ns` is when `ite` was read (cache deadlines derive from it).
    /// A timer check follows the reads before their bytes are trusted: past the deadline the
    /// entry may have been recycled. The header may steer the value's READ before that check
    /// (the READ stays inside the entry), so one check after it covers both.
    pub(crate) fn fetch(
        &mut self,
        ite: Ite,
        ite_read_ns: u64,
        d: &Deadline,
        key: &[u8],
        want: Want,
    ) -> Attempt<Fetched> {
        let loc = self.dte_location(ite);
        if loc.node == self.ep.node() {
            return self.fetch_local(loc, d, key, want);
        }
        if self.cache.enabled() {
            if let Some(f) = self.fetch_cached(ite, ite_read_ns, key, false)? {
                return Ok(f);
            }
        }
        if self.prefetches() {
            if let Some(f) = self.fetch_cached(ite, ite_read_ns, key, true)? {
                return Ok(f);
            }
        }
        self.fetch_remote(ite, ite_read_ns, loc, d, key, want)
    }

    /// Whether `want` asks for the value of a DTE with header `m` (`key_matches`: it holds the
    /// key asked for).
    fn wants_value(&self, want: Want, m: &DteMeta, key_matches: bool) -> bool {
        let valid = m.valid || mutated!(self.cfg, skip_valid_check);
        match want {
            Want::Key => false,
            Want::ValueIfMatch => key_matches && valid,
            Want::ValueIfValid => valid,
            Want::ValueIfKey => key_matches,
        }
    }

    /// Decode the header in `self.buf` of an entry of `size` bytes, and whether the DTE holds
    /// `key`. Lengths that do not fit the entry are corruption: the caller checked its timer,
    /// so the bytes are an entry this ITE referred to.
    fn decode_matching(&self, key: &[u8], size: u64) -> Attempt<(DteMeta, bool)> {
        let meta = self.decode()?;
        let end =
            DteLayout::value_offset(meta.key_len) + self.view.dte.value_read_len(meta.value_len);
        if end > size || KEY_OFF as usize + meta.key_len as usize > self.buf.len() {
            return Err(Abort::Fatal(Error::Corrupt(format!(
                "DTE lengths (key {}, value {}) exceed its {size}-byte entry",
                meta.key_len, meta.value_len
            ))));
        }
        let key_matches = self.view.dte.key(&self.buf, &meta) == key;
        Ok((meta, key_matches))
    }

    /// A DTE in the own node's data table, read directly from memory.
    fn fetch_local(
        &mut self,
        loc: DteLoc,
        d: &Deadline,
        key: &[u8],
        want: Want,
    ) -> Attempt<Fetched> {
        let meta_len = self.meta_len(loc);
        if want != Want::Key && loc.size > meta_len as u64 {
            // The value's first lines load while the header's miss is served.
            let ahead = loc.size.min(LOCAL_PREFETCH_BYTES);
            self.ep.local_prefetch(DATA_REGION, loc.off, ahead);
        }
        self.buf.resize(meta_len, 0);
        self.ep
            .local_read(DATA_REGION, loc.off, &mut self.buf[..meta_len])?;
        let (meta, key_matches) = self.decode_checked(key, loc.size, d)?;
        let value_loaded = self.wants_value(want, &meta, key_matches);
        if value_loaded {
            self.load_value(loc, &meta, true)?;
        }
        // One check covers the header and the value read it steered.
        self.check(d)?;
        Ok(Fetched {
            meta,
            key_matches,
            value_loaded,
            value_alone: value_loaded,
            source: Source::Local,
        })
    }

    /// A remote DTE from the cache (or, `prefetched`, from the last prefetch's), if it holds
    /// a live copy (only valid entries are cached, value included).
    fn fetch_cached(
        &mut self,
        ite: Ite,
        ite_read_ns: u64,
        key: &[u8],
        prefetched: bool,
    ) -> Attempt<Option<Fetched>> {
        let now = self.ep.mono_ns();
        let expiry = self.cfg.expiry_ns;
        let cache = match prefetched {
            false => &mut self.cache,
            true => &mut self.prefetched,
        };
        let Some(bytes) = cache.get(ite.0, now, ite_read_ns, expiry) else {
            return Ok(None);
        };
        self.buf.clear();
        self.buf.extend_from_slice(bytes);
        let (meta, key_matches) = self.decode_matching(key, self.buf.len() as u64)?;
        Ok(Some(Fetched {
            meta,
            key_matches,
            value_loaded: true,
            value_alone: false,
            source: Source::Cache,
        }))
    }

    /// A remote DTE with one fabric READ (the whole entry when the value is wanted and the
    /// multi-read optimisation is off, or when the entry is at most `whole_read_max` bytes) or
    /// two (header and key, then the value if wanted). A valid entry read with
    /// its value goes into the cache.
    fn fetch_remote(
        &mut self,
        ite: Ite,
        ite_read_ns: u64,
        loc: DteLoc,
        d: &Deadline,
        key: &[u8],
        want: Want,
    ) -> Attempt<Fetched> {
        let layout = self.view.dte;
        let meta_len = self.meta_len(loc);
        let addr = RemoteAddr::new(loc.node, DATA_REGION, loc.off);
        let whole = want != Want::Key
            && (!self.cfg.optimizations.multi_read || loc.size <= self.cfg.whole_read_max);
        let first = if whole { loc.size as usize } else { meta_len };
        self.buf.resize(first, 0);
        self.ep.read(addr, &mut self.buf[..first])?;
        let (meta, key_matches) = self.decode_checked(key, loc.size, d)?;
        let alone = !whole && self.wants_value(want, &meta, key_matches);
        if alone {
            self.load_value(loc, &meta, false)?;
        }
        // One check covers the header and the value read it steered.
        self.check(d)?;
        let value_loaded = whole || alone;
        if value_loaded && meta.valid && self.cache.enabled() {
            let value_off = DteLayout::value_offset(meta.key_len) as usize;
            let read_len = layout.value_read_len(meta.value_len) as usize;
            let parts: [&[u8]; 2] = if alone {
                [
                    &self.buf[..value_off],
                    &self.vbuf[self.vbase..self.vbase + read_len],
                ]
            } else {
                [&self.buf[..value_off + read_len], &[]]
            };
            self.cache
                .insert(ite.0, &parts, ite_read_ns, self.cfg.expiry_ns);
        }
        Ok(Fetched {
            meta,
            key_matches,
            value_loaded,
            value_alone: alone,
            source: Source::Remote,
        })
    }

    /// `decode_matching` on a header read before the timer was checked again. Its lengths
    /// may only steer a value READ, which stays inside the entry (`decode_matching` bounds
    /// them), until the caller's check after that READ; lengths that do not fit are corruption
    /// only if the timer had not expired (past it, the entry may have been recycled).
    fn decode_checked(&self, key: &[u8], size: u64, d: &Deadline) -> Attempt<(DteMeta, bool)> {
        self.decode_matching(key, size).or_else(|e| {
            self.check(d)?;
            Err(e)
        })
    }

    fn decode(&self) -> Attempt<DteMeta> {
        self.view
            .dte
            .meta(&self.buf)
            .map_err(|e| Abort::Fatal(Error::Corrupt(e.to_string())))
    }

    /// Read the value of the DTE at `loc`, whose header is in `self.buf`, into the value
    /// buffer. Only growth of that buffer is zero-filled: values of one size, the common case,
    /// are read over the last one (during `get_into` it is the caller's buffer).
    fn load_value(&mut self, loc: DteLoc, meta: &DteMeta, local: bool) -> Attempt<()> {
        self.hook(HookPoint::BeforeValueRead);
        let value_off = DteLayout::value_offset(meta.key_len);
        let len = self.view.dte.value_read_len(meta.value_len) as usize;
        debug_assert!(
            value_off as usize + len <= loc.size as usize,
            "checked by decode_matching"
        );
        let base = self.vbase;
        self.vbuf.resize(base + len, 0);
        if len == 0 {
            return Ok(());
        }
        let dst = &mut self.vbuf[base..];
        if local {
            self.ep.local_read(DATA_REGION, loc.off + value_off, dst)?;
        } else {
            self.ep.read(
                RemoteAddr::new(loc.node, DATA_REGION, loc.off + value_off),
                dst,
            )?;
        }
        Ok(())
    }

    /// Where the value of the DTE `f` is.
    pub(crate) fn value_at(f: &Fetched) -> ValueAt {
        debug_assert!(f.value_loaded);
        let len = f.meta.value_len as usize;
        if f.value_alone {
            return ValueAt::Alone(len);
        }
        let start = DteLayout::value_offset(f.meta.key_len) as usize;
        ValueAt::Buf(start..start + len)
    }

    /// The bytes of a value fetched to `at`.
    pub(crate) fn value_bytes(&self, at: &ValueAt) -> &[u8] {
        match at {
            ValueAt::Buf(r) => &self.buf[r.clone()],
            ValueAt::Alone(len) => &self.vbuf[self.vbase..self.vbase + *len],
        }
    }

    /// Keep the access word of the entry `ite` names, which a GET answers with (`f`, fetched
    /// under deadline `d`): rewritten at most once per `ACCESS_INTERVAL_MS`, or when the LFU
    /// counter moves (`nessie_store::access`). One 8-byte WRITE, made only while the deadline
    /// holds: past it the entry may have been reused, and the word would land on another's
    /// bytes. The word is a hint, so a failed WRITE is not the GET's failure.
    pub(crate) fn touch(&mut self, ite: Ite, f: &Fetched, d: &Deadline) {
        let now_ms = self.ep.now_ns() / NS_PER_MS;
        let coin = rand::Rng::gen::<u64>(&mut self.rng);
        let Some(new) = f.meta.access.touched(now_ms, self.cfg.eviction.lfu(), coin) else {
            return;
        };
        if self.check(d).is_err() {
            return;
        }
        let loc = self.dte_location(ite);
        let off = loc.off + ACCESS_OFF;
        let word = new.0.to_le_bytes();
        // Unordered: a hint for eviction, which a reader may see late on one copy (rule 10a).
        let r = self
            .ep
            .write_unordered(RemoteAddr::new(loc.node, DATA_REGION, off), &word);
        match r {
            Ok(()) => {
                self.stats.access_writes += 1;
                // A cached copy reads the word it was given, or every hit would write again.
                self.cache.patch(ite.0, ACCESS_OFF as usize, &word);
            }
            Err(e) => tracing::debug!(%e, "access word not written"),
        }
    }

    /// The value of the DTE `f`, copied.
    pub(crate) fn value_of(&self, f: &Fetched) -> Vec<u8> {
        self.value_bytes(&Self::value_at(f)).to_vec()
    }

    /// Write a new, invalid DTE of the smallest class that holds it (Step 3 / migrate Step 5)
    /// and return the ITE that will refer to it (`value` is `None` for a DELETE's tombstone,
    /// which may take the delete reserve), the entry and the previous-version pointer written
    /// into it (`EMPTY` with previous versions off). The entry records this attempt's write
    /// deadline (for recovery from writers that die). It is in the writer's own memory when its
    /// class has room there, else in a page the node holds on another node; the WRITE is
    /// remotely complete before this returns, so the CAS that publishes it comes after. Fails
    /// with `TableFull` when no node has room.
    /// `source`: a MIGRATE's copy, whose source is this candidate of the key. `guarded`: a
    /// conditional write's, which records what it replaced whatever the optimisations (it is
    /// what a completer puts back). `words`: a copy's expiry and access words, those of the
    /// entry it copies (`None`: a fresh write's, its expiry and an access clock of now).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn write_new_dte(
        &mut self,
        filter: u64,
        prev: Ite,
        key: &[u8],
        value: Option<&[&[u8]]>,
        source: Option<u8>,
        guarded: bool,
        words: Option<Words>,
    ) -> Attempt<(Ite, DteSlot, Ite)> {
        let prev = if self.cfg.optimizations.previous_versions || guarded {
            prev
        } else {
            Ite::EMPTY
        };
        let now = self.ep.now_ns();
        let words = words.unwrap_or(Words {
            // A DELETE's tombstone is no item: nothing to expire.
            expires: if value.is_some() {
                self.write_expires
            } else {
                0
            },
            access: Access::new(now / NS_PER_MS),
        });
        let head = Head {
            writer: self.tag,
            prev: prev.0,
            valid: false,
            tombstone: value.is_none(),
            // Our attempt ends within one expiry period of its start, before this.
            write_deadline: now + self.cfg.expiry_ns,
            source,
            guarded,
            expires: words.expires,
            access: words.access,
        };
        let (ite, slot) = self.write_dte(filter, head, key, value)?;
        Ok((ite, slot, prev))
    }

    /// Allocate and write a valid copy of `key` and `value`: what completes another writer's
    /// abandoned entry.
    pub(crate) fn write_valid_copy(
        &mut self,
        filter: u64,
        key: &[u8],
        value: &[u8],
        words: Words,
    ) -> Attempt<(Ite, DteSlot)> {
        let head = Head {
            writer: self.tag,
            prev: 0,
            valid: true,
            tombstone: false,
            write_deadline: 0,
            source: None,
            guarded: false,
            expires: words.expires,
            access: words.access,
        };
        self.write_dte(filter, head, key, Some(&[value]))
    }

    fn write_dte(
        &mut self,
        filter: u64,
        head: Head,
        key: &[u8],
        value: Option<&[&[u8]]>,
    ) -> Attempt<(Ite, DteSlot)> {
        let (purpose, parts) = match value {
            Some(v) => (Purpose::Value, v),
            None => (Purpose::Delete, &[][..]),
        };
        let value_len: usize = parts.iter().map(|p| p.len()).sum();
        let class = self
            .view
            .classes
            .class_for(key.len() as u32, value_len as u32)
            .expect("sizes were checked against key_max and value_max");
        let slot = self
            .table
            .alloc_for(&mut self.ep, class, purpose)
            .map_err(|e| match e {
                ClassAllocError::Fabric(f) => Abort::from(f),
                e => Abort::TableFull(e),
            })?;
        // The slot's class may be larger than `class` when that one is full everywhere.
        let at = self.table.addr(slot);
        debug_assert!(slot.class >= class);
        let local = slot.host == self.ep.node();
        let written = if local && parts.iter().any(|p| p.len() >= DIRECT_PART_MIN) {
            let n = self
                .view
                .dte
                .encode_head(&mut self.wbuf, head, key, value_len);
            self.assert_dte_head(&head, key, value_len);
            self.write_parts_direct(at.offset, n, parts)
        } else {
            let n = self.view.dte.encode_parts(&mut self.wbuf, head, key, parts);
            self.assert_dte_head(&head, key, value_len);
            assert!(
                n as u64 <= self.view.classes.entry_size(slot.class),
                "a {n}-byte DTE in a class {} slot",
                slot.class
            );
            if local {
                self.ep.local_write(DATA_REGION, at.offset, &self.wbuf[..n])
            } else {
                self.ep.write(at, &self.wbuf[..n])
            }
        };
        if let Err(e) = written {
            self.table.release_unpublished(&mut self.ep, slot);
            return Err(e.into());
        }
        let field = self.view.field.encode(slot.class, slot.slot);
        let ite = self.view.index.ite.encode(filter, slot.host as u32, field);
        Ok((ite, slot))
    }

    /// The DTE header just encoded into `wbuf`, checked before it crosses to memory: it decodes
    /// within the layout's limits to what was meant (writer, lengths, previous version, flags).
    /// A few words, beside a WRITE.
    fn assert_dte_head(&self, head: &Head, key: &[u8], value_len: usize) {
        let m =
            self.view.dte.meta(&self.wbuf).unwrap_or_else(|e| {
                panic!("a DTE header that does not decode before its WRITE: {e}")
            });
        assert!(
            (m.writer, m.prev, m.valid, m.tombstone, m.guarded)
                == (
                    head.writer,
                    head.prev,
                    head.valid,
                    head.tombstone,
                    head.guarded
                )
                && (m.key_len as usize, m.value_len as usize) == (key.len(), value_len)
                && self.view.dte.key(&self.wbuf, &m) == key,
            "the DTE header encoded is not the one meant: {m:?} for {head:?}"
        );
    }

    /// Write a local entry at `offset` whose first `head` bytes are in `wbuf` (metadata and
    /// key, `DteLayout::encode_head`) and whose value is the concatenation of `parts`: the
    /// whole words of each part of [`DIRECT_PART_MIN`] bytes or more straight from it, the
    /// bytes around them through `wbuf`, the last word padded with zeros. One WRITE per stretch
    /// instead of one: each is a plain store (nothing reads the entry before its CAS), and the
    /// value is not copied twice.
    fn write_parts_direct(
        &mut self,
        offset: u64,
        head: usize,
        parts: &[&[u8]],
    ) -> Result<(), nessie_fabric::FabricError> {
        let mut off = offset; // where `wbuf` goes
        debug_assert_eq!(self.wbuf.len(), head);
        for &p in parts {
            if p.len() < DIRECT_PART_MIN {
                self.wbuf.extend_from_slice(p);
                continue;
            }
            // Complete `wbuf`'s last word from the part, write it, then the part's whole words.
            let fill = (8 - self.wbuf.len() % 8) % 8;
            self.wbuf.extend_from_slice(&p[..fill]);
            self.ep.local_write(DATA_REGION, off, &self.wbuf)?;
            off += self.wbuf.len() as u64;
            let body = (p.len() - fill) / 8 * 8;
            self.ep
                .local_write(DATA_REGION, off, &p[fill..fill + body])?;
            off += body as u64;
            self.wbuf.clear();
            self.wbuf.extend_from_slice(&p[fill + body..]);
        }
        self.wbuf.resize(self.wbuf.len().next_multiple_of(8), 0);
        if self.wbuf.is_empty() {
            return Ok(());
        }
        self.ep.local_write(DATA_REGION, off, &self.wbuf)
    }

    /// Give back an entry no ITE ever referred to.
    pub(crate) fn release_unpublished(&mut self, slot: DteSlot) {
        self.table.release_unpublished(&mut self.ep, slot);
    }

    /// Flip the valid flag of a DTE this worker wrote (PUT Step 6 / migrate Step 8), in its own
    /// node's memory or in a page it holds on another node.
    pub(crate) fn set_valid(&mut self, ite: Ite) -> Attempt<()> {
        let loc = self.dte_location(ite);
        let h = self.view.dte.header(self.tag, true).to_le_bytes();
        if loc.node == self.ep.node() {
            self.ep.local_write(DATA_REGION, loc.off + HEADER_OFF, &h)?;
        } else {
            self.ep.write(
                RemoteAddr::new(loc.node, DATA_REGION, loc.off + HEADER_OFF),
                &h,
            )?;
        }
        Ok(())
    }

    /// Mark the DTE an ITE referred to for recycling (PUT Step 7 / migrate Step 9): one word
    /// holding the recycle flag and the expiry timestamp. Only the operation whose CAS removed
    /// `ite` from the index calls this, so each DTE is marked exactly once.
    pub(crate) fn recycle(&mut self, ite: Ite) {
        let now = self.ep.now_ns();
        let expires = if mutated!(self.cfg, recycle_without_expiry) {
            0
        } else {
            now + self.cfg.expiry_ns
        };
        let raw = nessie_store::DteLayout::recycle_word(expires);
        let word = raw.to_le_bytes();
        let loc = self.dte_location(ite);
        // Unordered: only reclaimers read the mark, and one that does not see it yet
        // reclaims the entry later; so a PUT that replaced a value in the tables of a node
        // gone for good does not wait while their moved copy settles (rule 10a).
        let at = RemoteAddr::new(loc.node, DATA_REGION, loc.off + RECYCLE_OFF);
        let r = self.ep.write_unordered(at, &word);
        match r {
            Ok(()) => {
                self.stats.recycled += 1;
                // An entry of our own allocator comes back to it without a scan.
                if let Some(slot) = self.names(ite) {
                    self.table.note_recycled(&mut self.ep, slot, raw);
                }
            }
            Err(e) => {
                // The operation itself has completed; the entry is lost to its table until the
                // node is restarted. Count it rather than fail a successful operation.
                self.stats.leaked += 1;
                tracing::warn!(%e, ?ite, "could not mark a DTE for recycling");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The assertions where an ITE crosses to shared memory have teeth: a word that does not
    //! decode, or that names no DTE, is refused before the CAS, and memory is left as it was.

    use super::super::testkit::InProcCluster;
    use nessie_store::Ite;

    fn refused(ite: impl Fn(&InProcCluster) -> Ite) -> String {
        let c = InProcCluster::small();
        let slot = c.candidates(b"k")[0];
        let bad = ite(&c);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut w = c.client(0);
            let _ = w.cas_ite(slot, Ite::EMPTY, bad);
        }));
        assert_eq!(c.ite(slot), Ite::EMPTY, "the refused CAS changed memory");
        let p = r.expect_err("a bad ITE was CASed");
        p.downcast_ref::<String>().cloned().unwrap_or_default()
    }

    #[test]
    fn an_ite_naming_a_slot_past_the_data_table_is_refused_before_its_cas() {
        let why = refused(|c| {
            let v = &c.view;
            let last = v.classes.len() as u8 - 1;
            let past = v.data_table_bytes / v.classes.entry_size(last) + 1;
            v.index.ite.encode(0, 0, v.field.encode(last, past))
        });
        assert!(why.contains("names no DTE"), "{why}");
    }

    #[test]
    fn an_ite_naming_no_node_of_the_cluster_is_refused_before_its_cas() {
        let why = refused(|c| {
            let v = &c.view;
            v.index
                .ite
                .encode(0, v.geometry.nodes, v.field.encode(0, 0))
        });
        assert!(why.contains("names no DTE"), "{why}");
    }

    #[test]
    fn a_malformed_ite_is_refused_before_its_cas() {
        // A present word with the moved bit set decodes in no layout.
        let why = refused(|c| {
            let l = &c.view.index.ite;
            let present = l.encode(0, 0, 0);
            Ite(present.0 | l.moved(present).0)
        });
        assert!(why.contains("malformed ITE"), "{why}");
    }
}
