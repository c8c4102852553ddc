//! PUT (Appendix A.1.3) and DELETE (A.1.5), which share every step but the last.
//!
//! Step 2 finds a candidate ITE: the first that is empty, or refers to a valid DTE holding the
//! key, or to our own invalid DTE left by an aborted attempt (we take its slot and carry its
//! previous-version pointer forward). An invalid DTE of someone else means a write is in
//! progress: abort (this is what lets the earliest writer finish), unless that write is
//! abandoned (its writer gave up on it, or its node failed): then complete it first
//! (`abandoned.rs`). No candidate: MIGRATE one
//! (2.4) and start over. Step 3 writes the new, invalid DTE (own node first) and CASes
//! it into the candidate (3.1); the replaced DTE is staged for recycling (3.2). Step 4 clears
//! duplicates of the key in later candidates; Step 5 is the reverse pass; Step 6 sets the DTE
//! valid (PUT) or empties the candidate again (DELETE); Step 7 marks staged DTEs for recycling.
//!
//! Deviation, documented in docs/protocol.md: a DELETE that finds no candidate (every ITE holds
//! another key) does not migrate; it verifies with a GET-style reverse pass that the key is
//! absent and returns.

use nessie_fabric::Endpoint;
use nessie_store::index::{Index, KeyHashes, Slot};
use nessie_store::limits::MAX_HASH_FUNCTIONS;
use nessie_store::Ite;

use super::access::Want;
use super::{Abort, Attempt, CdClient, Deadline};
use crate::config::MAX_MIGRATIONS_PER_ATTEMPT;
use crate::error::Error;
use crate::hooks::HookPoint;

/// What a write carries from one attempt to the next.
#[derive(Default, Debug)]
pub(crate) struct WriteState {
    /// ITEs removed from the index whose DTEs are marked for recycling once the write
    /// completes (Step 3.2: kept across attempts, so nothing leaks however many it takes).
    rec: Vec<Ite>,
    /// Our invalid DTEs swapped into the index by an attempt and not taken out again by us.
    published: Vec<Published>,
    /// A conditional write's (`guarded.rs`): its entries carry the guarded header bit.
    pub(crate) guarded: bool,
    /// Our entry whose commit (Step 6: set valid, or a tombstone's CAS to empty) was issued
    /// and failed without saying whether it landed. Found gone from the index when the write
    /// gives up, it took effect: our commit took it out, or another write cleared it after
    /// our Step 4, which orders ours just before that write.
    pub(crate) committing: Option<Ite>,
    /// The first valid entry of the key this write took out of the index, in any attempt, and
    /// its value length: the one its candidate CAS replaced (Step 3), or a valid duplicate
    /// Step 4 cleared (the key's entry sat behind an empty candidate). Staged, so recycled
    /// only when the write ends (`CdClient::read_replaced`).
    valid_replaced: Option<(Ite, u32)>,
}

/// One of our invalid DTEs in the index.
#[derive(Copy, Clone, Debug)]
struct Published {
    ite: Ite,
    /// The previous-version pointer written into the DTE (`EMPTY` with previous versions off):
    /// what readers may follow while it is in the index.
    prev_written: Ite,
    /// The key's latest committed entry at the moment this DTE replaced it: the valid entry
    /// its CAS replaced, or the one inherited from our own leftover it replaced, or (when it
    /// went into an empty candidate) the valid entry of the key that the same attempt's Step 4
    /// then cleared from a later candidate. A later attempt that replaces this leftover
    /// writes it as its DTE's previous version, so readers keep finding the committed value.
    target: Ite,
}

/// One attempt's walk over the key's candidates: its timer (Step 0), the slot of each
/// candidate read so far and the ITE it is known to hold (as read in Steps 2 and 4, or as our
/// own CAS left it in Steps 3 and 4): what the reverse pass (Step 5) must find again.
pub(crate) struct Pass<'i> {
    pub(crate) d: Deadline,
    pub(crate) index: &'i Index,
    pub(crate) slots: [Slot; MAX_HASH_FUNCTIONS as usize],
    pub(crate) seen: [Ite; MAX_HASH_FUNCTIONS as usize],
    /// The latest clock reading of the pass: a time at or before the next READ's issue, which
    /// spares that READ a clock read of its own.
    pub(crate) clock_ns: u64,
}

impl<'i> Pass<'i> {
    pub(crate) fn new(d: Deadline, index: &'i Index) -> Self {
        Self {
            clock_ns: d.start_ns,
            d,
            index,
            slots: [0; MAX_HASH_FUNCTIONS as usize],
            seen: [Ite::EMPTY; MAX_HASH_FUNCTIONS as usize],
        }
    }
}

/// The candidate ITE Step 2 chose.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Candidate {
    /// Position (0-based) among the key's candidates.
    pub(crate) pos: usize,
    /// The new DTE's previous version and its restore target: the valid DTE of the key the
    /// candidate holds, the target inherited from our own leftover there, or `EMPTY`.
    pub(crate) prev: Ite,
    /// The candidate holds a valid DTE of the key (else it is empty or our own leftover).
    pub(crate) replaced_valid: bool,
    /// The value length of that valid DTE (0 if none).
    pub(crate) replaced_len: u32,
}

/// What the caller must do with an entry a write just took out of the index.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Removed {
    /// Keep it until the write completes, then recycle it (Step 7).
    Stage,
    /// It is the invalid DTE of one of our own earlier attempts: recycle it at once (no
    /// previous-version pointer leads to it, a new attempt inherits its target instead).
    /// Staging it would let a write that retries many times hold one entry per attempt and
    /// so exhaust a small data table. Carries the leftover's restore target.
    RecycleNow(Ite),
}

impl WriteState {
    /// The state of a conditional write.
    pub(crate) fn guarded() -> Self {
        Self {
            guarded: true,
            ..Self::default()
        }
    }

    /// Stage `ite`, just taken out of the index, for recycling when the write ends.
    pub(crate) fn stage(&mut self, ite: Ite) {
        self.rec.push(ite);
    }

    /// Forget our entry `ours`, taken out of the index again, and hand `restored`, put back
    /// in its place, back to the index (it leaves the staging list).
    pub(crate) fn withdrawn(&mut self, ours: Ite, restored: Ite) {
        self.published.retain(|p| p.ite != ours);
        self.hand_over(restored);
    }

    /// Record that this write removed `ite` from the index. `our_tag`: the DTE carries this
    /// client's writer tag (an ITE word alone can recur once its entry has been recycled and
    /// reused by another worker of the node).
    fn removed(&mut self, ite: Ite, valid: bool, our_tag: bool) -> Removed {
        if !valid && our_tag {
            // Later records describe the DTE as it is now (its word may have been reused).
            if let Some(i) = self.published.iter().rposition(|p| p.ite == ite) {
                return Removed::RecycleNow(self.published.remove(i).target);
            }
        }
        self.rec.push(ite);
        Removed::Stage
    }

    /// The entries staged for recycling, handed over (to be recycled now).
    pub(crate) fn take_staged(&mut self) -> Vec<Ite> {
        std::mem::take(&mut self.rec)
    }

    /// Our published entries, latest first, one per ITE word, each with the previous version
    /// written into it.
    pub(crate) fn published_latest_first(&self) -> Vec<(Ite, Ite)> {
        let mut out: Vec<(Ite, Ite)> = Vec::new();
        for p in self.published.iter().rev() {
            if !out.iter().any(|&(i, _)| i == p.ite) {
                out.push((p.ite, p.prev_written));
            }
        }
        out
    }

    /// Hand `ite` over to whoever completes a DTE of ours that points to it: it leaves the
    /// staging list.
    pub(crate) fn hand_over(&mut self, ite: Ite) {
        self.rec.retain(|&i| i != ite);
    }

    /// The restore target of our own leftover `ite`, if this write published it.
    fn target_of(&self, ite: Ite) -> Option<Ite> {
        self.published
            .iter()
            .rev()
            .find(|p| p.ite == ite)
            .map(|p| p.target)
    }

    /// Set the restore target of the DTE this attempt just published, if it has none yet
    /// (it went into an empty candidate and Step 4 found the key's entry further on).
    fn found_target(&mut self, ours: Ite, target: Ite) {
        if let Some(p) = self.published.iter_mut().rev().find(|p| p.ite == ours) {
            if p.target.is_empty() {
                p.target = target;
            }
        }
    }
}

impl<E: Endpoint> CdClient<E> {
    /// PUT (`Some(value)`) or DELETE (`None`) with retries.
    pub(crate) fn write(&mut self, key: &[u8], value: Option<&[&[u8]]>) -> Result<(), Error> {
        // The last write's buffers, empty: a write allocated two vectors before (2% of a
        // node serving pipelined 100-byte SETs went to malloc and free).
        let mut st = std::mem::take(&mut self.spare_write_state);
        self.replaced = None;
        st.valid_replaced = None;
        let r = match self.with_retry(|c| c.write_once(key, value, &mut st)) {
            Ok(()) => Ok(()),
            Err(e) => {
                // What an earlier attempt replaced is recycled (or handed over) from here on.
                let since_ns = self.ep.mono_ns();
                let r = self.give_up(key, value.is_none(), &mut st, e);
                if r.is_ok() {
                    // Our leftover was rolled forward: the write took effect after all.
                    self.replaced =
                        st.valid_replaced
                            .take()
                            .map(|(ite, value_len)| super::Replaced {
                                ite,
                                value_len,
                                since_ns,
                            });
                }
                r
            }
        };
        // A write ends with nothing staged or published: Step 7 or giving up disposed of it.
        debug_assert!(st.rec.is_empty() && st.published.is_empty(), "{st:?}");
        st.rec.clear();
        st.published.clear();
        self.spare_write_state = st;
        r
    }

    /// The value length of the valid entry the last plain PUT replaced, if it replaced one
    /// (not after a DELETE, a conditional write, a GET, or a PUT of an absent key).
    pub fn replaced_len(&self) -> Option<u32> {
        self.replaced.map(|r| r.value_len)
    }

    /// Read into `out` the value the last plain PUT of `key` replaced: true if it was read
    /// while certainly intact, within an expiry period of the start of that PUT's successful
    /// attempt (the entry was marked for recycling after it, and cannot be reused sooner); false
    /// if there is none or it is too late. The large-value layer learns so that a large item
    /// overwritten by a small one leaves chunks to collect (`large.rs`).
    pub fn read_replaced(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        let Some(r) = self.replaced else {
            return Ok(false);
        };
        let d = super::Deadline {
            start_ns: r.since_ns,
            limit_ns: self.cfg.expiry_ns,
            ignore: false,
        };
        match self.fetch(r.ite, r.since_ns, &d, key, Want::ValueIfKey) {
            Ok(f) if f.key_matches && f.value_loaded => {
                let at = Self::value_at(&f);
                out.clear();
                out.extend_from_slice(self.value_bytes(&at));
                Ok(true)
            }
            Ok(_) | Err(Abort::Timeout) => Ok(false),
            Err(a) => Err(self.abort_to_error(a)),
        }
    }

    /// The write's attempts ran out. An invalid DTE of ours left in the index would block every
    /// later write of the key, so first we complete our leftovers ourselves (`abandoned.rs`);
    /// any we cannot are marked given up, for others to complete, and with each goes the
    /// previous version it points to (readers may follow it until then): its completer
    /// recycles both. If one was rolled forward, the write took effect and succeeds. The other
    /// staged entries are ours to recycle now.
    pub(crate) fn give_up(
        &mut self,
        key: &[u8],
        value_is_none: bool,
        st: &mut WriteState,
        e: Error,
    ) -> Result<(), Error> {
        let super::abandoned::Finished {
            took_effect,
            unsure,
            handed,
        } = self.finish_own(key, value_is_none, st);
        st.published.clear();
        for prev in &handed {
            st.hand_over(*prev);
        }
        for ite in st.take_staged() {
            self.recycle(ite);
        }
        if !handed.is_empty() {
            tracing::warn!(
                left = handed.len(),
                "a write gave up and left invalid DTEs in the index for others to complete"
            );
        }
        if took_effect && handed.is_empty() {
            return Ok(());
        }
        if unsure && st.guarded {
            // A conditional write that fails otherwise took no effect (rule G3).
            return Err(Error::Indeterminate(e.to_string()));
        }
        Err(e)
    }

    /// One attempt of PUT/DELETE.
    pub(crate) fn write_once(
        &mut self,
        key: &[u8],
        value: Option<&[&[u8]]>,
        st: &mut WriteState,
    ) -> Attempt<()> {
        self.check_fence()?;
        let index = self.view.index.clone();
        let mut h = index.hashes(key); // Step 1 (lazily)
        let mut migrations = 0;
        let (mut p, cand) = 'attempt: loop {
            let mut p = Pass::new(self.deadline(), &index); // Step 0

            // Step 2: find the candidate.
            if let Some(cand) = self.find_candidate(&mut p, key, &mut h, st)? {
                break 'attempt (p, cand);
            }
            if value.is_none() {
                // DELETE of a key that none of its candidates holds.
                self.reverse_pass(&p.d, &p.slots, &p.seen)?;
                // An earlier attempt's tombstone is out of the index (Step 2 would have taken
                // it back): another write cleared it, ordering ours before it, and recycles
                // it. What that attempt took out is ours to recycle (Step 7).
                st.published.clear();
                for i in 0..st.rec.len() {
                    self.recycle(st.rec[i]);
                }
                st.rec.clear();
                return Ok(());
            }
            // 2.4: every candidate holds another key.
            if migrations >= MAX_MIGRATIONS_PER_ATTEMPT {
                return Err(Abort::Fatal(Error::IndexFull {
                    depth: self.cfg.max_migrate_depth,
                }));
            }
            self.migrate_for(key, &mut h)?;
            migrations += 1;
        };

        // Step 3: a new, invalid DTE (in local memory when there is room), then CAS it into the
        // candidate.
        let new = self.publish_new_dte(&mut p, key, value, h.filter(), cand, st, false)?;
        if cand.replaced_valid && st.valid_replaced.is_none() {
            st.valid_replaced = Some((cand.prev, cand.replaced_len));
        }

        // Step 4: clear duplicates of the key in the remaining candidates.
        self.clear_duplicates(&mut p, key, &mut h, cand.pos, new, st)?;

        // Step 5: the reverse pass.
        self.hook(HookPoint::BeforeReversePass);
        if !mutated!(self.cfg, skip_put_reverse_pass) {
            self.reverse_pass(&p.d, &p.slots, &p.seen)?;
        }

        // Step 6: commit.
        self.commit(value, p.slots[cand.pos], new, st)?;

        // Step 7: recycle what this write replaced (keeping the buffer for the next write).
        for i in 0..st.rec.len() {
            self.recycle(st.rec[i]);
        }
        st.rec.clear();
        // Marked for recycling just now, after this attempt began: intact until an expiry
        // period after its start (`Self::read_replaced`).
        self.replaced = st
            .valid_replaced
            .take()
            .map(|(ite, value_len)| super::Replaced {
                ite,
                value_len,
                since_ns: p.d.start_ns,
            });
        Ok(())
    }

    /// Step 2: read the key's candidates in order until one can take the new DTE: the first
    /// that is empty (2.1), or whose DTE holds the key (2.2, 2.3) and is valid or our own
    /// leftover; another writer's invalid DTE of the key aborts. `None`: every candidate holds
    /// another key (2.4).
    fn find_candidate(
        &mut self,
        p: &mut Pass<'_>,
        key: &[u8],
        h: &mut KeyHashes<'_>,
        st: &WriteState,
    ) -> Attempt<Option<Candidate>> {
        for i in 0..p.index.n {
            let (ite, t) = self.read_candidate_unchecked(p, h, i)?;
            if ite.is_empty() {
                return Ok(Some(Candidate {
                    pos: i,
                    prev: Ite::EMPTY,
                    replaced_valid: false,
                    replaced_len: 0,
                })); // 2.1
            }
            if !self.filter_matches(ite, h.filter()) {
                continue; // 2.2
            }
            let f = self.fetch(ite, t, &p.d, key, Want::Key)?; // 2.3
            if !f.key_matches {
                continue;
            }
            if f.meta.valid {
                return Ok(Some(Candidate {
                    pos: i,
                    prev: ite,
                    replaced_valid: true,
                    replaced_len: f.meta.value_len,
                }));
            }
            if self.is_abandoned(&f.meta) {
                // Given up on (even by us, in an earlier operation) or its node failed:
                // completing it also disposes of the previous version it points to.
                self.complete_write(key, ite, true)?;
                return Err(Abort::Concurrent("completed an abandoned write of the key"));
            }
            if f.meta.writer == self.tag {
                // Our own leftover from an aborted attempt: reuse its slot and inherit its
                // restore target (the value it was replacing, still staged in `rec`).
                return Ok(Some(Candidate {
                    pos: i,
                    prev: st.target_of(ite).unwrap_or(Ite(f.meta.prev)),
                    replaced_valid: false,
                    replaced_len: 0,
                }));
            }
            return Err(Abort::Concurrent(
                "write met another in-progress write on the key",
            ));
        }
        Ok(None)
    }

    /// Step 3: write the new, invalid DTE (own node first, see `write_new_dte`) and CAS it into the
    /// candidate (3.1); stage the DTE it replaced for recycling (3.2). Returns the new ITE.
    /// `guarded`: a conditional write's entry (`guarded.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn publish_new_dte(
        &mut self,
        p: &mut Pass<'_>,
        key: &[u8],
        value: Option<&[&[u8]]>,
        filter: u64,
        cand: Candidate,
        st: &mut WriteState,
        guarded: bool,
    ) -> Attempt<Ite> {
        let c = cand.pos;
        // A moved word goes only once the MIGRATE copy it names is settled.
        self.settle_moved(&p.d, p.slots[c], p.seen[c])?;
        let (new, idx, prev_written) =
            self.write_new_dte(filter, cand.prev, key, value, None, guarded, None)?;
        if let Err(e) = self.check(&p.d) {
            self.release_unpublished(idx);
            return Err(e);
        }
        let new = match self.cas_ite(p.slots[c], p.seen[c], new) {
            Ok(Some(installed)) => installed,
            Ok(None) => {
                self.release_unpublished(idx); // never visible: reusable at once
                return Err(Abort::Concurrent("candidate ITE changed before the CAS"));
            }
            // Refused before it was issued: the candidate is as it was.
            Err(e @ Abort::Fatal(Error::Fenced { .. })) => return Err(e),
            Err(e) => {
                // The CAS may have taken place: the copy that decided it failed
                // (`Indeterminate`), or the request or its answer was lost (`Unreachable`,
                // a transport error). Treat the entry as published, so that giving up
                // completes or clears it (never release it): an entry left in the index,
                // invalid and not given up, would block every write of the key for good.
                st.published.push(Published {
                    ite: self.view.index.ite.successor(p.seen[c], new),
                    prev_written,
                    target: cand.prev,
                });
                return Err(e);
            }
        };
        st.published.push(Published {
            ite: new,
            prev_written,
            target: cand.prev,
        });
        self.hook(HookPoint::AfterCandidateCas);
        // Step 2 only picks an invalid candidate if it is our own leftover.
        if !p.seen[c].is_empty()
            && st.removed(p.seen[c], cand.replaced_valid, !cand.replaced_valid) != Removed::Stage
        {
            self.recycle(p.seen[c]); // 3.2
        }
        p.seen[c] = new;
        Ok(new)
    }

    /// Step 4: clear duplicates of the key in the candidates after the one at `c`, which now
    /// holds our DTE `new` (4.1-4.4).
    pub(crate) fn clear_duplicates(
        &mut self,
        p: &mut Pass<'_>,
        key: &[u8],
        h: &mut KeyHashes<'_>,
        c: usize,
        new: Ite,
        st: &mut WriteState,
    ) -> Attempt<()> {
        for i in c + 1..p.index.n {
            let (ite, t) = self.read_candidate_unchecked(p, h, i)?;
            if ite.is_empty() || !self.filter_matches(ite, h.filter()) {
                continue; // 4.1, 4.2
            }
            let f = self.fetch(ite, t, &p.d, key, Want::Key)?;
            if !f.key_matches {
                continue; // 4.3
            }
            // The timer bounds a CAS on a word read earlier (no ABA), and a cache hit checked
            // nothing since the unchecked READ of `ite`. Rare: a duplicate to clear.
            self.check(&p.d)?;
            let Some(cleared) = self.cas_ite(p.slots[i], ite, Ite::EMPTY)? else {
                return Err(Abort::Concurrent(
                    "duplicate ITE changed before it was cleared",
                ));
            };
            if f.meta.given_up && f.meta.prev != 0 && !f.meta.valid {
                st.rec.push(Ite(f.meta.prev)); // its writer handed it to whoever removes it
            }
            if !f.meta.valid && f.meta.writer != self.tag {
                self.stats.cleared_in_progress += 1;
            }
            match st.removed(ite, f.meta.valid, f.meta.writer == self.tag) {
                Removed::RecycleNow(target) => {
                    self.recycle(ite); // 4.4
                    st.found_target(new, target);
                }
                Removed::Stage if f.meta.valid => {
                    st.found_target(new, ite);
                    st.valid_replaced.get_or_insert((ite, f.meta.value_len));
                }
                Removed::Stage => {}
            }
            p.seen[i] = cleared;
        }
        Ok(())
    }

    /// Step 6: set the new DTE valid (PUT), or take it out of its candidate in `slot` again
    /// (DELETE). Nothing of ours is left in the index afterwards.
    pub(crate) fn commit(
        &mut self,
        value: Option<&[&[u8]]>,
        slot: Slot,
        new: Ite,
        st: &mut WriteState,
    ) -> Attempt<()> {
        let r = match value {
            Some(_) => {
                self.hook(HookPoint::BeforeSetValid);
                self.set_valid(new)
            }
            // DELETE: its DTE is never valid; take it out of the index again. If the CAS
            // fails, whoever changed the ITE owns the DTE's recycling.
            None => {
                self.hook(HookPoint::BeforeDeleteCommit);
                self.cas_ite(slot, new, Ite::EMPTY).map(|swapped| {
                    if swapped.is_some() && st.removed(new, false, true) != Removed::Stage {
                        self.recycle(new);
                    }
                })
            }
        };
        match r {
            Ok(()) => {}
            // Refused before it was issued, or not issued: our entry is as it was.
            Err(e @ (Abort::Timeout | Abort::Fatal(Error::Fenced { .. }))) => return Err(e),
            // Issued, and it may have landed (`Indeterminate`: the copy that decided the CAS
            // failed; or the request or its answer was lost): giving up finds out.
            Err(e) => {
                if !mutated!(self.cfg, forget_unsure_commit) {
                    st.committing = Some(new);
                }
                return Err(e);
            }
        }
        st.published.clear();
        Ok(())
    }

    /// The read of candidate `i` of the pass: its ITE (recorded in `p.seen`) and a time before
    /// it was read (the pass's latest clock reading), followed by a timer check. No check
    /// before the READ: one past the deadline is harmless, as the check after it rejects what
    /// it read.
    pub(crate) fn read_candidate(
        &mut self,
        p: &mut Pass<'_>,
        h: &mut KeyHashes<'_>,
        i: usize,
    ) -> Attempt<(Ite, u64)> {
        let (ite, t) = self.read_candidate_unchecked(p, h, i)?;
        p.clock_ns = self.ep.mono_ns();
        self.check_at(&p.d, p.clock_ns)?;
        Ok((ite, t))
    }

    /// Step 2 and 4's read of candidate `i` of a plain write: [`Self::read_candidate`] without
    /// the timer check after it, which cost a clock read per candidate (a clock read is a
    /// sizeable share of a PUT's CPU here). The check it leaves out comes later, before
    /// anything is done with what was read, as a GET's candidates are checked: every path on
    /// from Steps 2 and 4 checks the timer after this READ before it acts on it or answers.
    /// A matching ITE's entry is fetched (`fetch` checks after its READ, unless the cache
    /// answers); a candidate to publish into is checked before the CAS (`publish_new_dte`,
    /// and `settle_moved` for a moved word); a duplicate is checked before the CAS that
    /// clears it; a key found nowhere and Step 4's skipped candidates are confirmed by the
    /// reverse pass, which checks after its re-reads; a full set of candidates leads to
    /// MIGRATE, which reads them again under its own timer. The ITE counts as read at the
    /// pass's last clock reading, earlier than it was: that only makes the expiry arithmetic
    /// of the entry it names more conservative.
    pub(crate) fn read_candidate_unchecked(
        &mut self,
        p: &mut Pass<'_>,
        h: &mut KeyHashes<'_>,
        i: usize,
    ) -> Attempt<(Ite, u64)> {
        p.slots[i] = h.slot(p.index, i);
        let (ite, t) = self.read_ite_after(p.slots[i], p.clock_ns)?;
        p.seen[i] = ite;
        Ok((ite, t))
    }

    /// Re-read candidates N-1..1 (skipping the last one examined) and abort on any change.
    pub(crate) fn reverse_pass(
        &mut self,
        d: &Deadline,
        slots: &[Slot],
        seen: &[Ite],
    ) -> Attempt<()> {
        let n = self.view.index.n;
        for i in (0..n - 1).rev() {
            let ite = self.read_ite_word(slots[i])?;
            if ite != seen[i] {
                return Err(Abort::Concurrent("reverse pass saw a changed ITE"));
            }
        }
        // Every re-read must have happened within the expiry period: the check after the last
        // bounds them all.
        self.check(d)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{
        fast_cfg, key_first_in, key_with_distinct_candidates, small_geometry, InProcCluster,
        KEY_MAX, VALUE_MAX,
    };
    use crate::error::Error;
    use nessie_store::Geometry;

    /// A DELETE whose tombstone another write clears between its attempts, and whose retry
    /// finds every candidate holding another key: it took effect (ordered before the write
    /// that cleared it) and ends with nothing staged or published, the entry it took out
    /// recycled. Before, that path returned with both lists full (the debug assertion in
    /// `write` fired in the replicated crash test, 1 run in 400) and leaked the entry.
    #[test]
    fn a_delete_retried_into_full_candidates_leaves_nothing_behind() {
        use crate::hooks::HookPoint;
        let c = InProcCluster::small();
        let k = key_with_distinct_candidates(&c);
        let cands = c.candidates(&k);
        let y = key_first_in(&c, cands[0], std::slice::from_ref(&k));
        let z = key_first_in(&c, cands[0], &[k.clone(), y.clone()]);
        let w = key_first_in(&c, cands[1], std::slice::from_ref(&k));
        let x = key_first_in(&c, cands[2], std::slice::from_ref(&k));
        let mut setup = c.client(0);
        setup.put(&y, b"y").unwrap(); // its first candidate: K's first
        setup.put(&k, b"old").unwrap(); // K's second
        setup.put(&x, b"x").unwrap(); // K's third
        assert!(!c.ite(cands[1]).is_empty(), "K in its second candidate");
        let mut b = c.client(1);
        let mut a = c.client(2);
        let mut once = true;
        let (kb, yb, zb, wb) = (k.clone(), y.clone(), z.clone(), w.clone());
        a.set_hook(Some(Box::new(move |p| {
            if p != HookPoint::BeforeReversePass || !std::mem::take(&mut once) {
                return;
            }
            // A's tombstone is in K's second candidate. B frees the first, writes K there
            // (its Step 4 clears A's tombstone), deletes it, and fills both again.
            b.delete(&yb).unwrap();
            b.put(&kb, b"b").unwrap();
            b.delete(&kb).unwrap();
            b.put(&zb, b"z").unwrap();
            b.put(&wb, b"w").unwrap();
        })));
        a.delete(&k).unwrap();
        assert_eq!(a.get(&k).unwrap(), None);
        assert!(a.stats().retries > 0, "the first attempt aborted");
        for (key, v) in [(&x, b"x"), (&z, b"z"), (&w, b"w")] {
            assert_eq!(a.get(key).unwrap().as_deref(), Some(&v[..]));
        }
    }

    #[test]
    fn put_overwrites_and_delete_removes() {
        let c = InProcCluster::small();
        let mut a = c.client(0);
        let mut b = c.client(2);
        a.put(b"k", b"v1").unwrap();
        b.put(b"k", b"v2").unwrap();
        assert_eq!(a.get(b"k").unwrap().as_deref(), Some(&b"v2"[..]));
        assert_eq!(
            c.occupancy(),
            1,
            "the overwrite took the key's own candidate"
        );
        a.delete(b"k").unwrap();
        assert_eq!(b.get(b"k").unwrap(), None);
        assert_eq!(c.occupancy(), 0, "DELETE empties the candidate");
        b.delete(b"k").unwrap(); // deleting an absent key is fine
        a.put(b"empty", b"").unwrap();
        assert_eq!(b.get(b"empty").unwrap().as_deref(), Some(&b""[..]));
        assert_eq!((a.stats().puts, a.stats().deletes), (2, 1));
        assert_eq!((b.stats().puts, b.stats().deletes), (1, 1));
    }

    /// Step 2 and 4 read candidates without a timer check after each READ: a PUT that stalls
    /// past the expiry period right after any of its candidate READs still times out before
    /// it publishes or commits on what it read, and its retry writes the value.
    #[test]
    fn a_put_stalled_after_a_candidate_read_times_out_before_acting_on_it() {
        use crate::hooks::HookPoint;
        use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
        use std::sync::Arc;
        let c = InProcCluster::small();
        let expiry = fast_cfg().expiry_ns;
        let key = super::super::testkit::key_with_distinct_candidates(&c);
        // The n-th ITE READ of the first attempt: 1 is Step 2's first candidate (a new key:
        // empty, published into next; an existing key: fetched next), 2 and 3 Step 4's.
        for (existing, nth) in [(false, 1), (true, 1), (true, 2), (true, 3)] {
            let mut w = c.client(0);
            if existing {
                w.put(&key, b"before").unwrap();
            } else {
                w.delete(&key).unwrap();
            }
            let reads = Arc::new(AtomicU32::new(0));
            let r = reads.clone();
            w.set_hook(Some(Box::new(move |p| {
                if p == HookPoint::AfterIteRead && r.fetch_add(1, SeqCst) + 1 == nth {
                    std::thread::sleep(std::time::Duration::from_nanos(expiry + 1_000_000));
                }
            })));
            let timeouts = w.stats().timeouts;
            w.put(&key, b"after").unwrap();
            // At least the stalled attempt (a loaded machine may stall a 2 ms attempt too).
            assert!(
                w.stats().timeouts > timeouts,
                "existing {existing}, stall after ITE READ {nth}: {:?}",
                w.stats()
            );
            assert_eq!(
                c.client(1).get(&key).unwrap().as_deref(),
                Some(&b"after"[..])
            );
        }
    }

    /// Operation timers start on the coarse clock when the expiry period spans enough of its
    /// ticks. When the ticks are held up, the attempt times out at its first check (starting
    /// early is safe: it only ends sooner) and the retry starts on the precise clock.
    #[test]
    fn a_coarse_clock_held_up_costs_one_attempt_and_no_more() {
        use crate::config::ProtocolConfig;
        use nessie_fabric::Endpoint;
        assert!(
            !InProcCluster::small().client(0).coarse_start,
            "a 2 ms expiry is too short for a timer that may start a tick early"
        );
        // The shortest expiry whose timers start on the coarse clock (128 ms at 250 Hz).
        let lag = InProcCluster::small().fabric.endpoint(0).coarse_lag_ns();
        let cfg = ProtocolConfig {
            expiry_ns: super::super::COARSE_START_MIN_LAGS * lag,
            ..fast_cfg()
        };
        let expiry = cfg.expiry_ns;
        let c = InProcCluster::new(small_geometry(), cfg);
        let mut w = c.client(0);
        assert!(w.coarse_start);
        w.put(b"k", b"v1").unwrap();
        assert_eq!(w.stats().timeouts, 0, "{:?}", w.stats());
        c.fabric.freeze_coarse_clocks(true);
        std::thread::sleep(std::time::Duration::from_nanos(expiry + 10_000_000));
        w.put(b"k", b"v2").unwrap();
        assert_eq!(w.stats().timeouts, 1, "{:?}", w.stats());
        assert_eq!(w.get(b"k").unwrap().as_deref(), Some(&b"v2"[..]));
        assert_eq!(w.stats().timeouts, 2, "the GET's first attempt too");
        w.delete(b"k").unwrap();
        assert_eq!(w.stats().timeouts, 3, "each operation starts coarse again");
        c.fabric.freeze_coarse_clocks(false);
        w.put(b"k", b"v4").unwrap();
        assert_eq!(w.get(b"k").unwrap().as_deref(), Some(&b"v4"[..]));
        assert_eq!(w.stats().timeouts, 3);
    }

    /// The CAS that publishes a PUT's entry takes place but its answer is lost: the attempt
    /// fails, unable to tell, and counts the entry as published, so giving up completes it
    /// (here the writer itself rolls it forward: the PUT took effect). Before, the entry stayed
    /// in the index, invalid and not given up, the PUT failed, and every later write of the
    /// key gave up as contended: the simulator's lost answers found it.
    #[test]
    fn a_put_whose_publishing_cas_answer_is_lost_leaves_the_key_writable() {
        use std::sync::atomic::Ordering::SeqCst;
        let c = InProcCluster::new(small_geometry(), fast_cfg());
        let (mut a, fail) = c.failing_client(0);
        // A new key: the PUT's first CAS on the index publishes its entry.
        fail.index_cas_lost.store(1, SeqCst);
        assert_eq!(a.put(b"k", b"lost"), Ok(()));
        assert_eq!(fail.index_cas_lost.load(SeqCst), 0, "an answer was lost");
        assert_eq!(a.stats().rolled_forward, 1, "{:?}", a.stats());
        let mut b = c.client(1);
        assert_eq!(b.get(b"k").unwrap().as_deref(), Some(&b"lost"[..]));
        b.put(b"k", b"after").unwrap();
        assert_eq!(b.get(b"k").unwrap().as_deref(), Some(&b"after"[..]));
        a.put(b"k", b"again").unwrap();
        assert_eq!(b.get(b"k").unwrap().as_deref(), Some(&b"again"[..]));
    }

    /// A helper completes another writer's given-up PUT with a valid copy, and the CAS that
    /// swaps the copy in takes place but its answer is lost. The copy may be in the index, so
    /// the helper must not give its DTE back for reuse. Before, it did: the helper's next
    /// write reused the DTE for another key, and the key read as absent (in the simulator, a
    /// MIGRATE then found an index word whose entry holds a key that does not hash there).
    #[test]
    fn a_completion_whose_cas_answer_is_lost_keeps_its_copy() {
        use crate::hooks::HookPoint;
        use std::sync::atomic::Ordering::SeqCst;
        let c = InProcCluster::new(small_geometry(), fast_cfg());
        // Writer A fails to set its entry valid, in its attempt and when it gives up: it
        // marks the entry given up.
        let (mut a, fail_a) = c.failing_client(0);
        let f = fail_a.clone();
        a.set_hook(Some(Box::new(move |p| {
            if p == HookPoint::BeforeSetValid {
                f.writes.store(2, SeqCst);
            }
        })));
        assert!(a.put(b"k", b"v1").is_err());
        assert_eq!(fail_a.writes.load(SeqCst), 0, "both writes were refused");
        // Helper B meets the given-up entry and loses the answer of its completing CAS.
        let (mut b, fail_b) = c.failing_client(1);
        fail_b.index_cas_lost.store(1, SeqCst);
        assert!(matches!(b.put(b"k", b"v2"), Err(Error::Unreachable { .. })));
        assert_eq!(fail_b.index_cas_lost.load(SeqCst), 0, "an answer was lost");
        // B writes other keys of the same size in its node's memory.
        for i in 0..4u8 {
            b.put(&[b'o', i], b"xy").unwrap();
        }
        let mut r = c.client(2);
        assert_eq!(
            r.get(b"k").unwrap().as_deref(),
            Some(&b"v1"[..]),
            "A's value, rolled forward by B's completion"
        );
        for i in 0..4u8 {
            assert_eq!(r.get(&[b'o', i]).unwrap().as_deref(), Some(&b"xy"[..]));
        }
    }

    #[test]
    fn a_write_lands_in_one_of_the_key_candidates() {
        let c = InProcCluster::small();
        let mut a = c.client(1);
        a.put(b"key", b"value").unwrap();
        let held: Vec<_> = c
            .candidates(b"key")
            .into_iter()
            .filter(|&s| !c.ite(s).is_empty())
            .collect();
        assert_eq!(held.len(), 1, "exactly one candidate holds the key");
        assert_eq!(c.occupancy(), 1, "and no other ITE was touched");
    }

    #[test]
    fn invalid_sizes_are_rejected_before_touching_memory() {
        let c = InProcCluster::small();
        let mut a = c.client(0);
        let (k, v) = (KEY_MAX as usize, VALUE_MAX as usize);
        let before = c.fabric_ops();
        assert_eq!(
            a.put(&vec![1; k + 1], b"v"),
            Err(Error::KeyTooLarge {
                len: k + 1,
                max: KEY_MAX
            })
        );
        assert_eq!(
            a.put(b"k", &vec![0; v + 1]),
            Err(Error::ValueTooLarge {
                len: v + 1,
                max: VALUE_MAX
            })
        );
        assert_eq!(a.put(b"", b"v"), Err(Error::EmptyKey));
        assert_eq!(a.delete(b""), Err(Error::EmptyKey));
        assert_eq!(c.fabric_ops(), before, "no fabric operation was issued");
        a.put(&vec![1; k], &vec![2; v]).unwrap();
        assert_eq!(
            a.get(&vec![1; k]).unwrap(),
            Some(vec![2; v]),
            "the limits fit"
        );
    }

    /// Overwrites far beyond the data table's capacity succeed: replaced DTEs are recycled
    /// and reused once they expire.
    #[test]
    fn overwrites_recycle_replaced_entries() {
        const DTES: u64 = 32;
        const OVERWRITES: u64 = 4 * DTES;
        let g = Geometry {
            dtes_per_node: DTES,
            ..small_geometry()
        };
        let c = InProcCluster::new(g, fast_cfg());
        let mut a = c.client(0);
        for i in 0..OVERWRITES {
            a.put(b"k", &i.to_le_bytes()).unwrap();
        }
        assert_eq!(
            a.get(b"k").unwrap(),
            Some((OVERWRITES - 1).to_le_bytes().to_vec())
        );
        let st = a.stats();
        assert!(st.recycled >= OVERWRITES - 1, "{st:?}");
        assert!(
            st.table_full_waits > 0,
            "the table filled up and was reused: {st:?}"
        );
        assert_eq!(st.leaked, 0);
        assert_eq!(c.occupancy(), 1);
    }
}
