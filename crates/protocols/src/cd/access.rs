//! How the protocol touches memory: ITEs always through the fabric (even on the own node, since
//! fabric CAS is atomic only against other fabric operations), DTEs directly when local, from
//! the cache when possible, otherwise with one or two fabric READs.

use nessie_fabric::{Endpoint, NodeId, RemoteAddr};
use nessie_store::datatable::Purpose;
use nessie_store::dte::{DteLayout, DteMeta, HEADER_OFF, RECYCLE_OFF};
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

/// How much of a DTE to fetch.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// Header and key only (PUT, DELETE: values are never needed).
    Key,
    /// The value too, if the entry is valid and holds the key asked for (GET).
    ValueIfMatch,
    /// The value too, if the entry is valid, whatever its key (MIGRATE copies it).
    ValueIfValid,
}

/// A DTE fetched into the client's read buffer.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Fetched {
    pub meta: DteMeta,
    /// The DTE holds the key that was asked for.
    pub key_matches: bool,
    /// The value bytes are in the buffer too.
    pub value_loaded: bool,
    #[allow(dead_code)]
    pub source: Source,
}

impl<E: Endpoint> CdClient<E> {
    /// READ the ITE in `slot`. Returns it with the (monotonic) time the read was issued, the
    /// conservative "retrieval time" for expiry arithmetic (the ITE held this value at some
    /// instant after it).
    pub(crate) fn read_ite(&mut self, slot: Slot) -> Attempt<(Ite, u64)> {
        let addr = self.view.index.addr(slot);
        let t = self.ep.mono_ns();
        let v = Ite(self.ep.read_u64(addr)?);
        debug_assert!(
            self.view.index.ite.is_well_formed(v),
            "malformed ITE {v:?} at {addr}"
        );
        self.hook(HookPoint::AfterIteRead);
        Ok((v, t))
    }

    /// CAS the ITE in `slot` from `expected` to `desired`; true if it took place.
    pub(crate) fn cas_ite(&mut self, slot: Slot, expected: Ite, desired: Ite) -> Attempt<bool> {
        let addr = self.view.index.addr(slot);
        Ok(self.ep.compare_and_swap(addr, expected.0, desired.0)? == expected.0)
    }

    /// Node and byte offset of the DTE an ITE refers to.
    pub(crate) fn dte_location(&self, ite: Ite) -> (NodeId, u64) {
        let l = &self.view.index.ite;
        (l.dti(ite) as NodeId, self.view.dte.offset(l.dte(ite)))
    }

    /// Fetch the DTE `ite` refers to into `self.buf`: header and key always, the value as
    /// `want` says. `ite_read_ns` is when `ite` was read (cache deadlines derive from it).
    /// Every read is followed by a timer check before its bytes are trusted: past the deadline
    /// the entry may have been recycled.
    pub(crate) fn fetch(
        &mut self,
        ite: Ite,
        ite_read_ns: u64,
        d: &Deadline,
        key: &[u8],
        want: Want,
    ) -> Attempt<Fetched> {
        let (node, off) = self.dte_location(ite);
        if node == self.ep.node() {
            return self.fetch_local(node, off, d, key, want);
        }
        if self.cache.enabled() {
            if let Some(f) = self.fetch_cached(ite, ite_read_ns, key)? {
                return Ok(f);
            }
        }
        self.fetch_remote(ite, ite_read_ns, (node, off), d, key, want)
    }

    /// Whether `want` asks for the value of a DTE with header `m` (`key_matches`: it holds the
    /// key asked for).
    fn wants_value(&self, want: Want, m: &DteMeta, key_matches: bool) -> bool {
        let valid = m.valid || mutated!(self.cfg, skip_valid_check);
        match want {
            Want::Key => false,
            Want::ValueIfMatch => key_matches && valid,
            Want::ValueIfValid => valid,
        }
    }

    /// Decode the header in `self.buf`, and whether the DTE holds `key`.
    fn decode_matching(&self, key: &[u8]) -> Attempt<(DteMeta, bool)> {
        let meta = self.decode()?;
        let key_matches = self.view.dte.key(&self.buf, &meta) == key;
        Ok((meta, key_matches))
    }

    /// A DTE in the own node's data table, read directly from memory.
    fn fetch_local(
        &mut self,
        node: NodeId,
        off: u64,
        d: &Deadline,
        key: &[u8],
        want: Want,
    ) -> Attempt<Fetched> {
        let meta_len = self.view.dte.meta_size as usize;
        self.buf.resize(meta_len, 0);
        self.ep
            .local_read(DATA_REGION, off, &mut self.buf[..meta_len])?;
        self.check(d)?;
        let (meta, key_matches) = self.decode_matching(key)?;
        let value_loaded = self.wants_value(want, &meta, key_matches);
        if value_loaded {
            self.load_value(node, off, &meta, true)?;
            self.check(d)?;
        }
        Ok(Fetched {
            meta,
            key_matches,
            value_loaded,
            source: Source::Local,
        })
    }

    /// A remote DTE from the cache, if it holds a live copy (only valid entries are cached,
    /// value included).
    fn fetch_cached(&mut self, ite: Ite, ite_read_ns: u64, key: &[u8]) -> Attempt<Option<Fetched>> {
        let now = self.ep.mono_ns();
        let expiry = self.cfg.expiry_ns;
        let Some(bytes) = self.cache.get(ite.0, now, ite_read_ns, expiry) else {
            return Ok(None);
        };
        self.buf.clear();
        self.buf.extend_from_slice(bytes);
        let (meta, key_matches) = self.decode_matching(key)?;
        Ok(Some(Fetched {
            meta,
            key_matches,
            value_loaded: true,
            source: Source::Cache,
        }))
    }

    /// A remote DTE with one fabric READ (the whole entry when the value is wanted and the
    /// multi-read optimisation is off) or two (header and key, then the value if wanted).
    /// A valid entry read with its value goes into the cache.
    fn fetch_remote(
        &mut self,
        ite: Ite,
        ite_read_ns: u64,
        (node, off): (NodeId, u64),
        d: &Deadline,
        key: &[u8],
        want: Want,
    ) -> Attempt<Fetched> {
        let layout = self.view.dte;
        let meta_len = layout.meta_size as usize;
        let addr = RemoteAddr::new(node, DATA_REGION, off);
        let whole = want != Want::Key && !self.cfg.optimizations.multi_read;
        let first = if whole {
            layout.entry_size as usize
        } else {
            meta_len
        };
        self.buf.resize(first, 0);
        self.ep.read(addr, &mut self.buf[..first])?;
        self.check(d)?;
        let (meta, key_matches) = self.decode_matching(key)?;
        let mut value_loaded = whole;
        if !whole && self.wants_value(want, &meta, key_matches) {
            self.load_value(node, off, &meta, false)?;
            self.check(d)?;
            value_loaded = true;
        }
        if value_loaded && meta.valid {
            let end = DteLayout::value_offset(meta.key_len) as usize
                + layout.value_read_len(meta.value_len) as usize;
            self.cache
                .insert(ite.0, &self.buf[..end], ite_read_ns, self.cfg.expiry_ns);
        }
        Ok(Fetched {
            meta,
            key_matches,
            value_loaded,
            source: Source::Remote,
        })
    }

    fn decode(&self) -> Attempt<DteMeta> {
        self.view
            .dte
            .meta(&self.buf)
            .map_err(|e| Abort::Fatal(Error::Corrupt(e.to_string())))
    }

    /// Append the value of the DTE at (`node`, `off`) to the header already in `self.buf`.
    fn load_value(&mut self, node: NodeId, off: u64, meta: &DteMeta, local: bool) -> Attempt<()> {
        self.hook(HookPoint::BeforeValueRead);
        let value_off = DteLayout::value_offset(meta.key_len);
        let start = value_off as usize;
        let len = self.view.dte.value_read_len(meta.value_len) as usize;
        self.buf.resize(start + len, 0);
        if len == 0 {
            return Ok(());
        }
        if local {
            self.ep
                .local_read(DATA_REGION, off + value_off, &mut self.buf[start..])?;
        } else {
            self.ep.read(
                RemoteAddr::new(node, DATA_REGION, off + value_off),
                &mut self.buf[start..],
            )?;
        }
        Ok(())
    }

    /// The value of the DTE in the read buffer.
    pub(crate) fn value_of(&self, f: &Fetched) -> Vec<u8> {
        debug_assert!(f.value_loaded);
        let start = DteLayout::value_offset(f.meta.key_len) as usize;
        self.buf[start..start + f.meta.value_len as usize].to_vec()
    }

    /// Write a new, invalid DTE into the local data table (Step 3 / migrate Step 5) and return
    /// the ITE that will refer to it (`value` is `None` for a DELETE's marker, which may take
    /// an entry of the delete reserve), the entry's index and the previous-version pointer
    /// written into it (`EMPTY` with previous versions off). Fails with `TableFull` when no
    /// entry is free.
    pub(crate) fn write_new_dte(
        &mut self,
        filter: u64,
        prev: Ite,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Attempt<(Ite, u64, Ite)> {
        let purpose = if value.is_some() {
            Purpose::Value
        } else {
            Purpose::Delete
        };
        let idx = self
            .table
            .alloc_for(&mut self.ep, purpose)
            .map_err(|e| match e {
                nessie_store::datatable::AllocError::Fabric(f) => Abort::from(f),
                e => Abort::TableFull(e),
            })?;
        let layout = self.view.dte;
        let prev = if self.cfg.optimizations.previous_versions {
            prev
        } else {
            Ite::EMPTY
        };
        let n = layout.encode(&mut self.wbuf, self.tag, prev.0, key, value.unwrap_or(&[]));
        self.ep
            .local_write(DATA_REGION, layout.offset(idx), &self.wbuf[..n])?;
        let ite = self
            .view
            .index
            .ite
            .encode(filter, self.ep.node() as u32, idx);
        Ok((ite, idx, prev))
    }

    /// Flip the valid flag of our own DTE (PUT Step 6 / migrate Step 8).
    pub(crate) fn set_valid(&mut self, ite: Ite) -> Attempt<()> {
        let (node, off) = self.dte_location(ite);
        assert_eq!(
            node,
            self.ep.node(),
            "a client only validates DTEs in its own data table"
        );
        let h = self.view.dte.header(self.tag, true);
        self.ep
            .local_write(DATA_REGION, off + HEADER_OFF, &h.to_le_bytes())?;
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
        let word = nessie_store::DteLayout::recycle_word(expires).to_le_bytes();
        let (node, off) = self.dte_location(ite);
        let r = if node == self.ep.node() {
            self.ep.local_write(DATA_REGION, off + RECYCLE_OFF, &word)
        } else {
            self.ep
                .write(RemoteAddr::new(node, DATA_REGION, off + RECYCLE_OFF), &word)
        };
        match r {
            Ok(()) => self.stats.recycled += 1,
            Err(e) => {
                // The operation itself has completed; the entry is lost to its table until the
                // node is restarted. Count it rather than fail a successful operation.
                self.stats.leaked += 1;
                tracing::warn!(%e, ?ite, "could not mark a DTE for recycling");
            }
        }
    }
}
