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
//! local DTE with no previous version, as in the paper: a GET meeting the copy retries. (A copy
//! whose previous version was the source let a GET return a value a DELETE had removed: the
//! DELETE can commit while a copy that lost its source is still in the key's last candidate,
//! which its reverse pass does not re-read; see the test
//! `a_failed_migrate_copy_does_not_resurrect_a_deleted_value`.) Step 6 CASes the copy into the destination; Step 7 CASes the source to empty — if
//! that fails, the copy is taken out of the destination again (and recycled if we managed to).
//! Step 8 sets the copy valid and Step 9 recycles the source's DTE.
//!
//! The paper always takes the first candidate as the source; when that source has no
//! destination off the path we try the next candidate rather than fail the PUT.

use nessie_fabric::{Endpoint, RemoteAddr};
use nessie_store::dte::{DteLayout, KEY_OFF};
use nessie_store::index::{Index, KeyHashes, Slot};
use nessie_store::{Ite, DATA_REGION};

use super::abandoned::Marked;
use super::access::{Want, Words};
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

        // Step 7: empty the source, leaving a moved word that names the copy.
        self.empty_source(&d, src, &moved, dst, copy)?;
        self.hook(HookPoint::MigrateAfterSrcCas);

        // Steps 8 and 9.
        if let Err(e) = self.set_valid(copy) {
            // The source is gone: the copy is the key's only entry, and must become valid.
            if !self.settle_copy(dst, copy, Settle::SetValid, moved.source) {
                return Err(e);
            }
        }
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
        let moved_key = self.view.dte.key(&self.buf, &f.meta).to_vec();
        let source = Self::source_candidate(index, &moved_key, src);
        Ok(Some(Moved {
            ite: src_ite,
            value: self.value_of(&f),
            key: moved_key,
            filter: index.ite.filter(src_ite),
            source,
            words: Words::of(&f.meta),
        }))
    }

    /// Which of `key`'s candidates `src` is: what a MIGRATE's copy records of its source.
    fn source_candidate(index: &Index, key: &[u8], src: Slot) -> u8 {
        let mut h = index.hashes(key);
        let c = (0..index.n).find(|&i| h.slot(index, i) == src);
        c.expect("a MIGRATE's source is one of its key's candidates") as u8
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

    /// Steps 5 and 6: an invalid local copy of the moved entry with no previous version (5),
    /// CASed into the (empty) destination (6). Returns the copy's ITE.
    ///
    /// No previous version: while the copy is invalid, the source's value is the key's latest
    /// only as long as the source still holds it, and a copy that loses its source (Step 7)
    /// stays in the index until we take it out again, possibly after a DELETE of the key
    /// committed. The copy records which of the key's candidates its source is, for whoever
    /// completes it should we die ([`Self::settle_moved`], `abandoned.rs`).
    fn publish_copy(&mut self, d: &Deadline, dst: Slot, moved: &Moved) -> Attempt<Ite> {
        let prev = if mutated!(self.cfg, migrate_copy_keeps_source) {
            moved.ite
        } else {
            Ite::EMPTY
        };
        let (copy, idx, _) = self.write_new_dte(
            moved.filter,
            prev,
            &moved.key,
            Some(&[&moved.value]),
            Some(moved.source),
            false,
            Some(moved.words),
        )?;
        // The destination's empty word as it is now (a recursive MIGRATE may have emptied
        // it, leaving a moved word whose copy must be settled before the word goes).
        let empty = match self.empty_destination(d, dst) {
            Ok(w) => w,
            Err(e) => {
                self.release_unpublished(idx);
                return Err(e);
            }
        };
        let installed = match self.cas_ite(dst, empty, copy) {
            Ok(r) => r,
            Err(e @ Abort::Fatal(Error::Fenced { .. })) => {
                // Refused before it was issued.
                self.release_unpublished(idx);
                return Err(e);
            }
            Err(e) if mutated!(self.cfg, migrate_walks_away) => return Err(e),
            Err(e) => {
                // The CAS may have taken place: take the copy out if it is there. If it
                // is not, it may still have been seen and taken out by another: the
                // entry is neither released nor recycled (a leak of one entry).
                let maybe = self.view.index.ite.successor(empty, copy);
                self.settle_copy(dst, maybe, Settle::TakeOut, moved.source);
                return Err(e);
            }
        };
        let Some(copy) = installed else {
            self.release_unpublished(idx);
            return Err(Abort::Concurrent("migrate destination changed"));
        };
        self.hook(HookPoint::MigrateAfterDstCas);
        Ok(copy)
    }

    /// The destination's word, which must still be empty, with the copy any moved word there
    /// names settled.
    fn empty_destination(&mut self, d: &Deadline, dst: Slot) -> Attempt<Ite> {
        self.check(d)?;
        let (empty, _) = self.read_ite(dst)?;
        self.check(d)?;
        if !empty.is_empty() {
            return Err(Abort::Concurrent("migrate destination changed"));
        }
        self.settle_moved(d, dst, empty)?;
        Ok(empty)
    }

    /// Before a moved word is filled (by a PUT's new entry or a MIGRATE's copy), the copy it
    /// names must be settled: while that copy is invalid in the index it is its key's only
    /// entry (its source was emptied), and whoever completes it tells that from the moved word
    /// (`abandoned.rs`). A copy still in one of its key's candidates, invalid, is completed if
    /// its migrator is gone, or waited for (`Concurrent`) while it lives. One READ of the copy's
    /// header when it is settled, the usual case.
    pub(crate) fn settle_moved(&mut self, d: &Deadline, slot: Slot, word: Ite) -> Attempt<()> {
        let l = self.view.index.ite;
        if !l.is_moved(word) || mutated!(self.cfg, fill_over_unsettled_copy) {
            return Ok(());
        }
        let named = l.moved_entry(word);
        let loc = self.dte_location(named);
        let n = self.meta_len(loc);
        self.buf.resize(n, 0);
        if loc.node == self.ep.node() {
            self.ep
                .local_read(DATA_REGION, loc.off, &mut self.buf[..n])?;
        } else {
            let at = RemoteAddr::new(loc.node, DATA_REGION, loc.off);
            self.ep.read(at, &mut self.buf[..n])?;
        }
        self.check(d)?;
        // A copy named by a moved word was whole before the word was written, and stays so
        // while it is in the index: bytes that do not decode are a later entry's.
        let meta = match self.view.dte.meta(&self.buf) {
            Ok(m) if !m.valid && m.recycle.is_none() && m.source.is_some() => m,
            _ => return Ok(()),
        };
        let key_end = KEY_OFF as usize + meta.key_len as usize;
        if key_end > n {
            return Ok(());
        }
        let key = self.buf[KEY_OFF as usize..key_end].to_vec();
        let index = self.view.index.clone();
        let mut h = index.hashes(&key);
        let source = meta.source.unwrap_or(0) as usize;
        if source >= index.n || h.slot(&index, source) != slot {
            return Ok(()); // not the copy of a MIGRATE from this slot
        }
        for i in 0..index.n {
            let (ite, _) = self.read_ite(h.slot(&index, i))?;
            self.check(d)?;
            if !l.names(word, ite) {
                continue;
            }
            if self.is_abandoned(&meta) {
                self.complete_write(&key, ite, true)?;
            }
            return Err(Abort::Concurrent(
                "the copy a moved word names is not settled",
            ));
        }
        Ok(())
    }

    /// Step 7: empty the source (`moved.ite` in `src`) to a moved word naming the copy; on
    /// failure take the copy back out of the destination (and recycle it if we managed to).
    fn empty_source(
        &mut self,
        d: &Deadline,
        src: Slot,
        moved: &Moved,
        dst: Slot,
        copy: Ite,
    ) -> Attempt<()> {
        let l = self.view.index.ite;
        let emptied_to = if mutated!(self.cfg, migrate_empties_plainly) {
            Ite::EMPTY
        } else {
            l.moved(copy)
        };
        let emptied = match self.check(d) {
            Ok(()) => match self.cas_ite(src, moved.ite, emptied_to) {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => Err(Abort::Concurrent("migrate source changed")),
                Err(e) if mutated!(self.cfg, migrate_walks_away) => return Err(e),
                // Refused before it was issued: the source is as it was.
                Err(e @ Abort::Fatal(Error::Fenced { .. })) => Err(e),
                Err(e) => match self.source_emptied(src, copy) {
                    Some(true) => return Ok(()),
                    Some(false) => Err(e),
                    None => {
                        // Whoever completes the copy reads the source, and can tell.
                        let kind = DteLayout::source_bits(Some(moved.source));
                        if self.mark_given_up(copy, kind) != Marked::Set {
                            tracing::warn!(?copy, ?src, ?dst, "a MIGRATE cannot tell whether it emptied its source, nor give its copy up");
                        }
                        return Err(e);
                    }
                },
            },
            Err(e) => Err(e),
        };
        // Not emptied: take the copy out again.
        match self.cas_ite(dst, copy, Ite::EMPTY) {
            Ok(Some(_)) => self.recycle(copy),
            Ok(None) => {}
            Err(_) => {
                self.settle_copy(dst, copy, Settle::TakeOut, moved.source);
            }
        }
        emptied
    }

    /// After a source CAS whose answer was lost: whether it took place, read from the source
    /// (with back-off, while the fabric fails): our moved word there says it did; any other
    /// word that it did not, since our moved word is filled again only once our copy is
    /// settled, which nobody does while we live (`settle_moved`). `None`: the source could not
    /// be read.
    fn source_emptied(&mut self, src: Slot, copy: Ite) -> Option<bool> {
        let mut seen = None;
        self.retry_own(|c| match c.read_ite(src) {
            Ok((w, _)) => {
                seen = Some(c.view.index.ite.names(w, copy));
                true
            }
            Err(_) => false,
        });
        seen
    }

    /// A MIGRATE that failed after publishing its copy must not walk away from it while it
    /// lives: an invalid entry whose writer lives blocks every write of the moved key, and
    /// every read that meets it (it has no previous version), since only entries whose writer
    /// gave up or died are completed by others (`abandoned.rs`). So it retries what is left,
    /// with back-off, for as long as a writer keeps at its leftovers (`CdClient::retry_own`: a
    /// fence that refused a step lifts once membership is read again); if that fails, it marks
    /// the copy given up, and whoever meets it then completes it as its source says: rolls it
    /// forward if the source was emptied (to our moved word), takes it out if not.
    /// Whether it settled it (a copy marked given up is not: the MIGRATE failed).
    fn settle_copy(&mut self, dst: Slot, copy: Ite, what: Settle, source: u8) -> bool {
        let settled = self.retry_own(|c| match what {
            Settle::SetValid => c.set_valid(copy).is_ok(),
            Settle::TakeOut => match c.cas_ite(dst, copy, Ite::EMPTY) {
                Ok(Some(_)) => {
                    c.recycle(copy);
                    true
                }
                Ok(None) => true, // no longer ours to take out
                Err(_) => false,
            },
        });
        if settled {
            return true;
        }
        // Given up, the copy is completed by whoever meets it, as its source says: rolled
        // forward if we emptied it, taken out if not.
        if self.mark_given_up(copy, DteLayout::source_bits(Some(source))) == Marked::Set {
            return false;
        }
        tracing::warn!(
            ?copy,
            ?dst,
            ?what,
            "a failed MIGRATE could not settle its copy; it stays invalid in the index"
        );
        false
    }
}

/// What a MIGRATE that failed after publishing its copy still has to do ([`CdClient::settle_copy`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Settle {
    /// It emptied the source: set the copy valid.
    SetValid,
    /// It did not: take the copy out of the destination.
    TakeOut,
}

/// The entry a MIGRATE moves, as read from its source (Step 2).
struct Moved {
    /// The source ITE, emptied by Step 7 and recycled once the move is done.
    ite: Ite,
    key: Vec<u8>,
    value: Vec<u8>,
    /// The source ITE's filter bits, which the copy keeps (they derive from the key).
    filter: u64,
    /// Which of the key's candidates the source is.
    source: u8,
    /// The source's expiry and access words, which the copy keeps.
    words: Words,
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{
        fast_cfg, key, key_first_in, key_with_distinct_candidates, small_geometry, FailNext,
        InProcCluster, NODES, SEARCH,
    };
    use super::super::CdClient;
    use crate::config::{Mutations, ProtocolConfig};
    use crate::error::Error;
    use crate::fence::Fence;
    use crate::hooks::HookPoint;
    use nessie_fabric::inproc::InProcEndpoint;
    use std::sync::Arc;

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

    /// A MIGRATE whose copy lands in the last candidate of the moved key after a DELETE of that
    /// key has read it (Step 4) and before the DELETE commits must not let a GET find the
    /// deleted value through the copy. The DELETE's reverse pass skips the last candidate, so
    /// it commits with the copy still in the index; the copy's MIGRATE then fails to empty the
    /// source and takes the copy out again. Until it does, the copy is an invalid DTE of the
    /// key: readers must treat it as a write in progress (retry), not follow a previous
    /// version to the value the DELETE removed. (Found by `many_seeds_small_index_no_crash`
    /// with replication, which widens the window between the two CASes of a MIGRATE.)
    #[test]
    fn a_failed_migrate_copy_does_not_resurrect_a_deleted_value() {
        let got = delete_racing_a_failed_migrate(Mutations::default());
        assert!(
            !matches!(got, Ok(Some(_))),
            "the DELETE completed before the GET began: {got:?}"
        );
    }

    /// The control: with the copy naming its source as previous version, the GET returns the
    /// deleted value.
    #[test]
    fn a_migrate_copy_naming_its_source_resurrects_a_deleted_value() {
        let got = delete_racing_a_failed_migrate(Mutations {
            migrate_copy_keeps_source: true,
            ..Mutations::default()
        });
        assert_eq!(got, Ok(Some(b"deleted".to_vec())));
    }

    /// K with value "deleted" in its first candidate k0, a filler in k1, k2 free; X, whose
    /// first candidate is k0 and whose other candidates are taken (not k2). Returns (K, X).
    fn place_for_the_race(c: &InProcCluster) -> (Vec<u8>, Vec<u8>) {
        assert!(c.client(0).config().optimizations.previous_versions);
        let k = key_with_distinct_candidates(c);
        let kc = c.candidates(&k);
        let x = (0..SEARCH)
            .map(|i| key(b'x', i))
            .find(|x| {
                let xc = c.candidates(x);
                xc[0] == kc[0] && !xc.contains(&kc[2]) && xc[1] != xc[2] && xc[1] != xc[0]
            })
            .unwrap();
        let mut setup = c.client(0);
        setup.put(&k, b"deleted").unwrap(); // into k0
        let mut taken = vec![k.clone(), x.clone()];
        for slot in [kc[1]].into_iter().chain(c.candidates(&x)) {
            if c.ite(slot).is_empty() {
                let f = key_first_in(c, slot, &taken);
                setup.put(&f, b"filler").unwrap();
                taken.push(f);
            }
        }
        assert!(c.ite(kc[2]).is_empty(), "K's last candidate is free");
        (k, x)
    }

    /// The interleaving of the two tests above: K in k0 (its first candidate), a filler in k1,
    /// k2 free; a PUT of X, whose first candidate is k0 and whose others are taken, migrates
    /// K towards k2 (M); a DELETE of K (D) runs between M's read of the source and its copy,
    /// and commits while M waits after publishing the copy. Returns one GET attempt of K made
    /// then; afterwards (M done) K must read as absent.
    fn delete_racing_a_failed_migrate(mutations: Mutations) -> Result<Option<Vec<u8>>, Error> {
        use std::sync::mpsc::channel;

        let cfg = ProtocolConfig {
            expiry_ns: 5_000_000_000,
            mutations,
            ..fast_cfg()
        };
        let c = InProcCluster::new(small_geometry(), cfg);
        let (k, x) = place_for_the_race(&c);

        let (m_read_src, wait_m_read_src) = channel();
        let (d_read_all, wait_d_read_all) = channel();
        let (m_copied, wait_m_copied) = channel();
        let (d_done, wait_d_done) = channel();
        let (get_done, wait_get_done) = channel::<()>();

        // M: PUT X reads its three candidates, then its MIGRATE reads the source k0 (the 4th
        // ITE read); it waits there for D's Step 4, and after publishing its copy for the GET.
        let mut m = c.client(1);
        let mut reads = 0;
        m.set_hook(Some(Box::new(move |p| match p {
            HookPoint::AfterIteRead => {
                reads += 1;
                if reads == 4 {
                    m_read_src.send(()).unwrap();
                    wait_d_read_all.recv().unwrap();
                }
            }
            HookPoint::MigrateAfterDstCas => {
                m_copied.send(()).unwrap();
                let _ = wait_get_done.recv();
            }
            _ => {}
        })));
        // D: DELETE K once M has read the source; before its reverse pass it waits for the copy.
        let mut d = c.client(2);
        d.set_hook(Some(Box::new(move |p| {
            if p == HookPoint::BeforeReversePass {
                d_read_all.send(()).unwrap();
                wait_m_copied.recv().unwrap();
            }
        })));
        let mut g = c.client(0);
        let (got, m) = std::thread::scope(|s| {
            let mt = s.spawn(|| {
                m.put(&x, b"x").unwrap();
                m
            });
            let k = &k;
            s.spawn(move || {
                wait_m_read_src.recv().unwrap();
                d.delete(k).unwrap();
                d_done.send(d.stats()).unwrap();
            });
            let ds = wait_d_done.recv().unwrap();
            assert_eq!(ds.retries, 0, "the DELETE committed at its first attempt");
            let got = g.try_get(k);
            get_done.send(()).unwrap();
            (got, mt.join().unwrap())
        });
        let ms = m.stats();
        let msg = format!("the MIGRATE lost its source to the DELETE, then X took k0: {ms:?}");
        assert_eq!((ms.concurrent_aborts, ms.migrations), (1, 0), "{msg}");
        assert_eq!(g.get(&k), Ok(None), "once the MIGRATE is done, K is absent");
        got
    }

    /// K in its second candidate k1 with k0 free, and X, whose first candidate is k1 and whose
    /// others (not k0) are taken: a PUT of X moves K to k0, before its source. Returns (K, X).
    fn place_copy_before_source(c: &InProcCluster) -> (Vec<u8>, Vec<u8>) {
        let k = key_with_distinct_candidates(c);
        let kc = c.candidates(&k);
        let mut setup = c.client(0);
        let mut taken = vec![k.clone()];
        let blocker = key_first_in(c, kc[0], &taken);
        setup.put(&blocker, b"blocker").unwrap();
        setup.put(&k, b"before").unwrap();
        setup.delete(&blocker).unwrap();
        assert!(c.ite(kc[0]).is_empty() && !c.ite(kc[1]).is_empty());
        let x = (0..SEARCH)
            .map(|i| key(b'x', i))
            .find(|x| {
                let xc = c.candidates(x);
                xc[0] == kc[1] && !xc.contains(&kc[0]) && xc[1] != xc[2] && xc[1] != xc[0]
            })
            .unwrap();
        taken.push(x.clone());
        for slot in c.candidates(&x) {
            if c.ite(slot).is_empty() {
                let f = key_first_in(c, slot, &taken);
                setup.put(&f, b"filler").unwrap();
                taken.push(f);
            }
        }
        assert!(c.ite(kc[0]).is_empty(), "K's first candidate is free");
        (k, x)
    }

    /// The PUT of X, then a PUT and a GET of K through another client.
    type Outcome = (
        Result<(), Error>,
        Result<(), Error>,
        Result<Option<Vec<u8>>, Error>,
    );

    /// K before its MIGRATE (`place_copy_before_source`): a PUT of X by a client whose
    /// operations fail as `fail` says once its MIGRATE of K has published its copy in k0. Returns the PUT's result, then what a PUT and a GET of K through another
    /// client give afterwards.
    fn migrate_failing_after_its_copy(
        mutations: Mutations,
        fail: impl Fn(&FailNext) + Send + 'static,
    ) -> Outcome {
        let mut once = Some(fail);
        migrate_with_failures(mutations, move |p, switch| {
            if p == HookPoint::MigrateAfterDstCas {
                if let Some(f) = once.take() {
                    f(switch);
                }
            }
        })
    }

    /// A PUT of X (`place_copy_before_source`) by a client on node 1 whose hook may make its
    /// next operations fail (`FailNext`); then a PUT and a GET of K through another client.
    fn migrate_with_failures(
        mutations: Mutations,
        mut hook: impl FnMut(HookPoint, &FailNext) + Send + 'static,
    ) -> Outcome {
        let cfg = ProtocolConfig {
            mutations,
            retry: crate::config::RetryPolicy {
                max_attempts: 50,
                ..crate::config::RetryPolicy::default()
            },
            ..fast_cfg()
        };
        let c = InProcCluster::new(small_geometry(), cfg);
        let (k, x) = place_copy_before_source(&c);
        let (mut m, switch) = c.failing_client(1);
        m.set_hook(Some(Box::new(move |p| hook(p, &switch))));
        let put_x = m.put(&x, b"x");
        let mut other = c.client(2);
        let put_k = other.put(&k, b"after");
        (put_x, put_k, other.get(&k))
    }

    /// The fence refuses the MIGRATE's CAS on its source (Step 7): the source is as it was,
    /// so the MIGRATE takes its copy back out, and K stays writable.
    #[test]
    fn a_migrate_refused_at_its_source_takes_its_copy_out() {
        let (put_x, put_k, get_k) = migrate_failing_after_its_copy(Mutations::default(), |f| {
            f.cas.store(1, std::sync::atomic::Ordering::SeqCst)
        });
        assert!(matches!(put_x, Err(Error::Fenced { .. })), "{put_x:?}");
        assert_eq!(put_k, Ok(()), "K is not wedged by a copy left behind");
        assert_eq!(get_k, Ok(Some(b"after".to_vec())));
    }

    /// The control: a MIGRATE that walks away from its copy wedges every write of K.
    #[test]
    fn a_migrate_that_walks_away_from_its_copy_wedges_the_key() {
        let mutations = Mutations {
            migrate_walks_away: true,
            ..Mutations::default()
        };
        let (put_x, put_k, get_k) = migrate_failing_after_its_copy(mutations, |f| {
            f.cas.store(1, std::sync::atomic::Ordering::SeqCst)
        });
        assert!(matches!(put_x, Err(Error::Fenced { .. })), "{put_x:?}");
        assert!(matches!(put_k, Err(Error::Contended { .. })), "{put_k:?}");
        assert!(matches!(get_k, Err(Error::Contended { .. })), "{get_k:?}");
    }

    /// Setting the copy valid fails once (Step 8), after the source was emptied: the MIGRATE
    /// tries again, and the move completes.
    #[test]
    fn a_migrate_whose_valid_flag_fails_sets_it_again() {
        let (put_x, put_k, get_k) = migrate_failing_after_its_copy(Mutations::default(), |f| {
            f.writes.store(1, std::sync::atomic::Ordering::SeqCst)
        });
        assert_eq!(put_x, Ok(()), "the move completed and X took its place");
        assert_eq!(put_k, Ok(()));
        assert_eq!(get_k, Ok(Some(b"after".to_vec())));
    }

    /// The CAS that publishes the copy (Step 6) takes place but its answer is lost: the
    /// MIGRATE cannot tell, takes the copy out if it is there (it is), and K stays usable.
    #[test]
    fn a_migrate_whose_copy_cas_answer_is_lost_takes_the_copy_out() {
        let (put_x, put_k, get_k) = migrate_losing_its_copy_cas(Mutations::default());
        assert!(matches!(put_x, Err(Error::Unreachable { .. })), "{put_x:?}");
        assert_eq!(put_k, Ok(()), "K is not wedged by a copy left behind");
        assert_eq!(get_k, Ok(Some(b"after".to_vec())));
    }

    /// The control: walking away leaves the copy, invalid, before its source: K is wedged.
    #[test]
    fn a_migrate_that_walks_away_after_a_lost_answer_wedges_the_key() {
        let (_, put_k, get_k) = migrate_losing_its_copy_cas(Mutations {
            migrate_walks_away: true,
            ..Mutations::default()
        });
        assert!(matches!(put_k, Err(Error::Contended { .. })), "{put_k:?}");
        assert!(matches!(get_k, Err(Error::Contended { .. })), "{get_k:?}");
    }

    fn migrate_losing_its_copy_cas(mutations: Mutations) -> Outcome {
        // X's three candidates, the MIGRATE's source, K's first alternative (free), then the
        // destination read again just before the CAS that publishes the copy (after the copy
        // was written, which may claim a page by CAS).
        let mut reads = 0;
        migrate_with_failures(mutations, move |p, switch| {
            if p == HookPoint::AfterIteRead {
                reads += 1;
                if reads == 6 {
                    switch
                        .cas_lost
                        .store(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    }

    /// What a client that knows node 1 failed reads of K (`place_copy_before_source`), after
    /// a PUT of X by a client on node 1 died in its MIGRATE of K at `die_at` (its thread
    /// unwinds there: nothing after it runs). `meanwhile` runs through another client between
    /// the MIGRATE's read of its source and its copy; `after`, through the client that knows,
    /// once the dead writer's deadlines have passed, before K is read.
    fn migrate_dying(
        mutations: Mutations,
        die_at: HookPoint,
        meanwhile: Meanwhile,
        after: impl FnOnce(&mut CdClient<InProcEndpoint>, &[u8]),
    ) -> Result<Option<Vec<u8>>, Error> {
        const EXPIRY_NS: u64 = 50_000_000;
        let cfg = ProtocolConfig {
            expiry_ns: EXPIRY_NS,
            mutations,
            ..fast_cfg()
        };
        let c = InProcCluster::new(small_geometry(), cfg);
        let (k, x) = place_copy_before_source(&c);
        let z = key_first_in(&c, c.candidates(&k)[0], &[k.clone(), x.clone()]);
        let mut other = c.client(2);
        let mut m = c.client(1);
        let mut reads = 0;
        let (k2, mut meanwhile) = (k.clone(), Some(meanwhile));
        m.set_hook(Some(Box::new(move |p| {
            if p == HookPoint::AfterIteRead {
                reads += 1;
                if reads == 4 {
                    // X's three candidates, then the MIGRATE's source.
                    if let Some(f) = meanwhile.take() {
                        f(&mut other, &k2, &z);
                    }
                }
            }
            if p == die_at {
                panic!("the migrator dies at {p:?}");
            }
        })));
        let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.put(&x, b"x")));
        let why = died.expect_err("the migrator reached its death");
        let why = why.downcast_ref::<String>().map(String::as_str);
        assert_eq!(why, Some(&*format!("the migrator dies at {die_at:?}")));
        let fence = Arc::new(Fence::unfenced());
        fence.set_gone(1, true);
        let mut g = c.client(0);
        g.set_fence(fence);
        std::thread::sleep(std::time::Duration::from_nanos(3 * EXPIRY_NS));
        after(&mut g, &x);
        g.get(&k)
    }

    /// What runs beside a MIGRATE of K, through another client: given K and a key Z whose
    /// first candidate is K's first (the MIGRATE's destination).
    type Meanwhile = Box<dyn FnOnce(&mut CdClient<InProcEndpoint>, &[u8], &[u8]) + Send>;

    /// A write of K that replaces the MIGRATE's source between its read and the copy: Z
    /// holds K's first candidate while K is written, so the write goes to K's source.
    fn write_replacing_the_source(value: Option<&'static [u8]>) -> Meanwhile {
        Box::new(move |w, k, z| {
            w.put(z, b"z").unwrap();
            match value {
                Some(v) => w.put(k, v).unwrap(),
                None => w.delete(k).unwrap(),
            }
            w.delete(z).unwrap(); // K's first candidate free again for the copy
        })
    }

    fn nothing() -> Meanwhile {
        Box::new(|_, _, _| {})
    }

    /// A MIGRATE that dies between publishing its copy (Step 6) and emptying its source
    /// (Step 7), while a PUT of the key replaced the source: whoever completes the copy finds
    /// the source not emptied (no moved word naming the copy) and takes the copy out, and the
    /// PUT's value stays.
    #[test]
    fn a_migrate_dying_before_emptying_its_source_is_taken_out_and_a_put_stays() {
        let got = migrate_dying(
            Mutations::default(),
            HookPoint::MigrateAfterDstCas,
            write_replacing_the_source(Some(b"after")),
            |_, _| {},
        );
        assert_eq!(got, Ok(Some(b"after".to_vec())));
    }

    /// The control: rolling the copy forward without reading its source clears the PUT's
    /// entry as a duplicate, and K reads the moved value: an acknowledged write lost.
    #[test]
    fn a_dead_migrate_copy_rolled_forward_blindly_loses_a_put() {
        let mutations = Mutations {
            complete_ignores_source: true,
            ..Mutations::default()
        };
        let got = migrate_dying(
            mutations,
            HookPoint::MigrateAfterDstCas,
            write_replacing_the_source(Some(b"after")),
            |_, _| {},
        );
        assert_eq!(got, Ok(Some(b"before".to_vec())));
    }

    /// The same with a DELETE of K in place of the PUT: K stays deleted; rolled forward
    /// blindly, the moved value comes back.
    #[test]
    fn a_migrate_dying_before_emptying_its_source_does_not_undo_a_delete() {
        let run = |mutations| {
            migrate_dying(
                mutations,
                HookPoint::MigrateAfterDstCas,
                write_replacing_the_source(None),
                |_, _| {},
            )
        };
        assert_eq!(run(Mutations::default()), Ok(None));
        let blind = Mutations {
            complete_ignores_source: true,
            ..Mutations::default()
        };
        assert_eq!(run(blind), Ok(Some(b"before".to_vec())), "the control");
    }

    /// A MIGRATE that dies after emptying its source (Step 7), before setting its copy valid:
    /// the copy is the key's only entry, and whoever completes it finds the moved word naming
    /// it and rolls it forward. Without the moved word (a plain empty source) the completer
    /// cannot tell, and the key is lost.
    #[test]
    fn a_migrate_dying_after_emptying_its_source_is_rolled_forward() {
        let run = |mutations| {
            migrate_dying(
                mutations,
                HookPoint::MigrateAfterSrcCas,
                nothing(),
                |_, _| {},
            )
        };
        assert_eq!(run(Mutations::default()), Ok(Some(b"before".to_vec())));
        let plain = Mutations {
            migrate_empties_plainly: true,
            ..Mutations::default()
        };
        assert_eq!(run(plain), Ok(None), "the control: K lost");
    }

    /// After that death, a PUT of X fills the moved word in X's first candidate (the source):
    /// it settles the copy first (rolls it forward), so K keeps its value. Filling the word
    /// over the unsettled copy leaves a completer nothing to tell from, and K is lost.
    #[test]
    fn a_moved_word_is_filled_only_once_its_copy_is_settled() {
        let run = |mutations| {
            migrate_dying(
                mutations,
                HookPoint::MigrateAfterSrcCas,
                nothing(),
                |g, x| {
                    g.put(x, b"x2").unwrap();
                    assert_eq!(g.get(x), Ok(Some(b"x2".to_vec())));
                },
            )
        };
        assert_eq!(run(Mutations::default()), Ok(Some(b"before".to_vec())));
        let over = Mutations {
            fill_over_unsettled_copy: true,
            ..Mutations::default()
        };
        assert_eq!(run(over), Ok(None), "the control: K lost");
    }

    /// The CAS that empties the source (Step 7) takes place but its answer is lost: the
    /// MIGRATE reads the source, finds its moved word there, and completes the move.
    #[test]
    fn a_migrate_whose_source_cas_answer_is_lost_finds_out_from_the_source() {
        let mut armed = false;
        let (put_x, put_k, get_k) = migrate_with_failures(Mutations::default(), move |p, f| {
            if p == HookPoint::MigrateAfterDstCas {
                armed = true;
                f.cas_lost.store(1, std::sync::atomic::Ordering::SeqCst);
            }
            if p == HookPoint::MigrateAfterSrcCas {
                assert!(armed);
            }
        });
        assert_eq!(put_x, Ok(()), "the move completed and X took its place");
        assert_eq!(put_k, Ok(()));
        assert_eq!(get_k, Ok(Some(b"after".to_vec())));
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
