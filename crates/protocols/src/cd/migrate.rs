//! MIGRATE (Appendix A.1.4): free one of a key's candidate ITEs by moving the entry in it to
//! one of that entry's own alternative candidates, recursively up to a configured depth.
//!
//! Step 2 reads the source: empty (freed concurrently) or now holding the migrating key means
//! there is nothing to do; an invalid DTE means a write is in progress (abort). Step 4 picks the
//! first alternative candidate of the moved key that is not on the migration path (the
//! migrating key's own candidates and every source so far, so chains never cycle). We prefer
//! an alternative that is already empty and recurse into the first one only when all are
//! occupied; the paper always takes the first alternative, but PUT fills candidates in order,
//! so an entry sitting in its second candidate usually finds its first one still occupied and
//! chains grow long even at a load factor of 0.4. A recursive MIGRATE empties the chosen
//! destination when needed. Step 5 copies the entry into a new, invalid
//! local DTE whose previous version is the source ITE (so GETs meeting the copy still find the
//! value). Step 6 CASes the copy into the destination; Step 7 CASes the source to empty — if
//! that fails, the copy is taken out of the destination again (and recycled if we managed to).
//! Step 8 sets the copy valid and Step 9 recycles the source's DTE.
//!
//! The paper always takes the first candidate as the source; when that source has no
//! destination off the path we try the next candidate rather than fail the PUT.

use nessie_fabric::Endpoint;
use nessie_store::index::{Index, KeyHashes, Slot};
use nessie_store::Ite;

use super::access::Want;
use super::{Abort, Attempt, CdClient, Deadline};
use crate::error::Error;
use crate::hooks::HookPoint;

impl<E: Endpoint> CdClient<E> {
    /// Make room among `key`'s candidates (PUT Step 2.4).
    pub(crate) fn migrate_for(&mut self, key: &[u8], h: &mut KeyHashes<'_>) -> Attempt<()> {
        let index = self.view.index.clone();
        let candidates = h.all(&index);
        for &src in &candidates {
            let mut path = candidates.clone();
            match self.migrate(src, key, &mut path, 0) {
                Err(Abort::NoDestination) => continue,
                r => return r,
            }
        }
        Err(Abort::Fatal(Error::IndexFull {
            depth: self.cfg.max_migrate_depth,
        }))
    }

    /// Empty `src` (one of the candidates of `key`) by moving its entry elsewhere.
    fn migrate(&mut self, src: Slot, key: &[u8], path: &mut Vec<Slot>, depth: u8) -> Attempt<()> {
        if depth > self.cfg.max_migrate_depth {
            return Err(Abort::Fatal(Error::IndexFull {
                depth: self.cfg.max_migrate_depth,
            }));
        }
        let d = self.deadline(); // Step 0
        let index = self.view.index.clone();

        // Step 2: read the source.
        let Some(moved) = self.read_source(&d, &index, src, key)? else {
            return Ok(()); // 2.1, 2.3: nothing left to move
        };

        // Steps 3 and 4: the destination, off the migration path.
        path.push(src);
        let dst = self.destination(&d, &index, &moved.key, path, depth)?;

        // Steps 5 and 6: publish an invalid copy in the destination.
        let copy = self.publish_copy(&d, dst, &moved)?;

        // Step 7: empty the source.
        self.empty_source(&d, src, moved.ite, dst, copy)?;

        // Steps 8 and 9.
        self.set_valid(copy)?;
        self.stats.migrations += 1;
        if depth > 0 {
            self.stats.recursive_migrations += 1;
        }
        self.recycle(moved.ite);
        Ok(())
    }

    /// Step 2: read the source ITE and its DTE. `None` when there is nothing to move: the
    /// source was freed concurrently (2.1) or now holds the migrating key itself (2.3).
    fn read_source(
        &mut self,
        d: &Deadline,
        index: &Index,
        src: Slot,
        key: &[u8],
    ) -> Attempt<Option<Moved>> {
        let (src_ite, t) = self.read_ite(src)?;
        self.check(d)?;
        if src_ite.is_empty() {
            return Ok(None); // 2.1: freed concurrently
        }
        let f = self.fetch(src_ite, t, d, key, Want::ValueIfValid)?;
        if f.key_matches {
            return Ok(None); // 2.3: the key itself landed here concurrently
        }
        if !f.meta.valid {
            if self.is_abandoned(&f.meta) {
                // Its writer gave up on it: finish its write, then migrate what it left.
                let moved_key = self.view.dte.key(&self.buf, &f.meta).to_vec();
                self.complete_write(&moved_key, src_ite, true)?;
            }
            return Err(Abort::Concurrent("migrate source is being written")); // 2.4
        }
        Ok(Some(Moved {
            ite: src_ite,
            key: self.view.dte.key(&self.buf, &f.meta).to_vec(),
            value: self.value_of(&f),
            filter: index.ite.filter(src_ite),
        }))
    }

    /// Steps 3 and 4: the destination among the moved key's candidates off the migration
    /// `path`: the first empty alternative if there is one, else the first alternative
    /// (emptied by a recursive MIGRATE).
    fn destination(
        &mut self,
        d: &Deadline,
        index: &Index,
        moved_key: &[u8],
        path: &mut Vec<Slot>,
        depth: u8,
    ) -> Attempt<Slot> {
        let mut hs = index.hashes(moved_key);
        let alternatives: Vec<Slot> = (0..index.n)
            .map(|i| hs.slot(index, i))
            .filter(|s| !path.contains(s))
            .collect();
        if alternatives.is_empty() {
            return Err(Abort::NoDestination);
        }
        let mut dst = None;
        for &alt in &alternatives {
            self.check(d)?;
            let (ite, _) = self.read_ite(alt)?;
            if ite.is_empty() {
                dst = Some(alt);
                break;
            }
        }
        self.check(d)?;
        match dst {
            Some(s) => Ok(s),
            None => {
                let s = alternatives[0];
                self.migrate(s, moved_key, path, depth + 1)?; // 4.2
                Ok(s)
            }
        }
    }

    /// Steps 5 and 6: an invalid local copy of the moved entry whose previous version is the
    /// source (5), CASed into the (empty) destination (6). Returns the copy's ITE.
    fn publish_copy(&mut self, d: &Deadline, dst: Slot, moved: &Moved) -> Attempt<Ite> {
        let (copy, idx, _) =
            self.write_new_dte(moved.filter, moved.ite, &moved.key, Some(&moved.value))?;
        if let Err(e) = self.check(d) {
            self.release_unpublished(idx);
            return Err(e);
        }
        // The destination's empty word as it is now (a recursive MIGRATE may have emptied it).
        let (empty, _) = self.read_ite(dst)?;
        if let Err(e) = self.check(d) {
            self.release_unpublished(idx);
            return Err(e);
        }
        let installed = match empty.is_empty() {
            true => self.cas_ite(dst, empty, copy)?,
            false => None,
        };
        let Some(copy) = installed else {
            self.release_unpublished(idx);
            return Err(Abort::Concurrent("migrate destination changed"));
        };
        self.hook(HookPoint::MigrateAfterDstCas);
        Ok(copy)
    }

    /// Step 7: empty the source (`src_ite` in `src`); on failure take the copy back out of the
    /// destination (and recycle it if we managed to).
    fn empty_source(
        &mut self,
        d: &Deadline,
        src: Slot,
        src_ite: Ite,
        dst: Slot,
        copy: Ite,
    ) -> Attempt<()> {
        let emptied = match self.check(d) {
            Ok(()) if self.cas_ite(src, src_ite, Ite::EMPTY)?.is_some() => Ok(()),
            Ok(()) => Err(Abort::Concurrent("migrate source changed")),
            Err(e) => Err(e),
        };
        if let Err(e) = emptied {
            if self.cas_ite(dst, copy, Ite::EMPTY)?.is_some() {
                self.recycle(copy);
            }
            return Err(e);
        }
        Ok(())
    }
}

/// The entry a MIGRATE moves, as read from its source (Step 2).
struct Moved {
    /// The source ITE: the copy's previous version, recycled once the move is done.
    ite: Ite,
    key: Vec<u8>,
    value: Vec<u8>,
    /// The source ITE's filter bits, which the copy keeps (they derive from the key).
    filter: u64,
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{fast_cfg, small_geometry, InProcCluster, NODES};
    use crate::config::ProtocolConfig;
    use nessie_store::index::Slot;

    /// Keys tried when looking for a key with particular candidates.
    const SEARCH: u32 = 100_000;

    fn key(prefix: u8, i: u32) -> Vec<u8> {
        let mut k = vec![prefix];
        k.extend_from_slice(&i.to_le_bytes());
        k
    }

    /// A key whose candidates are distinct slots.
    fn key_with_distinct_candidates(c: &InProcCluster) -> Vec<u8> {
        (0..SEARCH)
            .map(|i| key(b'k', i))
            .find(|k| {
                let mut s = c.candidates(k);
                s.sort_unstable();
                s.windows(2).all(|w| w[0] != w[1])
            })
            .unwrap()
    }

    /// A key, not in `taken`, whose first candidate is `slot` (so an empty-index PUT puts it
    /// there).
    fn key_first_in(c: &InProcCluster, slot: Slot, taken: &[Vec<u8>]) -> Vec<u8> {
        (0..SEARCH)
            .map(|i| key(b'f', i))
            .find(|k| c.candidates(k)[0] == slot && !taken.contains(k))
            .unwrap()
    }

    /// Every candidate of a key is taken by another key: its PUT must migrate one of them,
    /// and every key still reads back afterwards.
    #[test]
    fn put_migrates_when_every_candidate_is_taken() {
        let c = InProcCluster::small();
        let target = key_with_distinct_candidates(&c);
        let mut fillers = Vec::new();
        let mut a = c.client(0);
        for slot in c.candidates(&target) {
            let f = key_first_in(&c, slot, &fillers);
            a.put(&f, &f).unwrap();
            assert!(!c.ite(slot).is_empty(), "filler took candidate {slot}");
            fillers.push(f);
        }
        assert_eq!(a.stats().migrations, 0, "the fillers found free candidates");

        let mut b = c.client(NODES as u16 - 1);
        b.put(&target, b"target").unwrap();
        assert!(b.stats().migrations > 0, "{:?}", b.stats());
        assert_eq!(b.get(&target).unwrap().as_deref(), Some(&b"target"[..]));
        for f in &fillers {
            assert_eq!(
                a.get(f).unwrap().as_deref(),
                Some(&f[..]),
                "moved key reads back"
            );
        }
        assert_eq!(
            c.occupancy(),
            fillers.len() as u64 + 1,
            "a move, not a copy"
        );
    }

    /// Filling most of a small index needs many migrations, some recursive, and loses
    /// nothing.
    #[test]
    fn high_load_factor_keeps_every_key() {
        const LOAD_PERCENT: u64 = 80;
        const DEPTH: u8 = 12;
        let cfg = ProtocolConfig {
            max_migrate_depth: DEPTH,
            ..fast_cfg()
        };
        let c = InProcCluster::new(small_geometry(), cfg);
        let keys = c.view.geometry.total_ites() * LOAD_PERCENT / 100;
        let mut w = c.client(1);
        for i in 0..keys as u32 {
            w.put(&key(b'h', i), &i.to_le_bytes()).unwrap();
        }
        let st = w.stats();
        assert!(st.migrations > 0, "{st:?}");
        assert!(st.recursive_migrations > 0, "{st:?}");
        assert_eq!(
            st.recycled, st.migrations,
            "each move recycles its source DTE"
        );
        assert_eq!(c.occupancy(), keys);
        let mut r = c.client(0);
        for i in 0..keys as u32 {
            assert_eq!(
                r.get(&key(b'h', i)).unwrap(),
                Some(i.to_le_bytes().to_vec())
            );
        }
    }
}
