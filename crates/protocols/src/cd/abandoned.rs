//! Abandoned writes: an invalid DTE whose writer gave up on it is completed by whoever meets
//! it, so that a write that gives up does not wedge its key.
//!
//! A write that runs out of attempts first completes its own leftovers (`finish_own`, for up to
//! [`FINISH_OWN_PERIODS`] expiry periods): the forward pass up to its entry, Step 4 and the
//! reverse pass, then it sets the entry valid in place, as its attempt would have (a tombstone
//! is swapped for an empty ITE). If another entry of the key comes first, that write's Step 4
//! would clear ours: we clear it ourselves, and our write did not take effect. Only if that
//! fails too (a stalled node, a dead one) does it mark each entry it leaves *given up* (a CAS
//! on the header word: only its writer sets the bit, after which it never acts on the entry).
//!
//! A MIGRATE's copy is completed as its source says (the copy records which of its key's
//! candidates that is): a moved word there naming the copy means its migrator emptied the
//! source, and the copy, the key's only entry, is rolled forward; any other word means it did
//! not (a moved word is filled again only once its copy is settled, `migrate.rs`), and the
//! copy is taken out: the source, or whatever write replaced it, holds the key.
//!
//! Anyone who meets a given-up entry (a PUT or DELETE in Step 2, a GET with no previous
//! version to answer with, a MIGRATE whose source it is) completes it before going on
//! (`complete_write`): the forward pass up to the entry (a valid entry of the key before it
//! hides it, and it is left for the next write of the key, whose Step 4 clears it; a given-up
//! one before it is completed first), Step 4 and Step 5 on the writer's behalf, then Step 6: a
//! tombstone is CASed to empty, any other entry to a valid copy of its key and value written
//! by the helper, who recycles the entry its CAS took out. Helpers racing on one entry are
//! arbitrated by that CAS. The write took effect at it: the writer's operation returned an
//! error, and a failed write may take effect at any time after its invocation.
//!
//! Why only entries their writer gave up on, not every entry past its write deadline: a writer
//! that is slow but alive retries, and a retry after a helper made its value visible would
//! apply the write a second time, after other writes (a history the checker rejects: the first
//! version of this change did that, and the TCP multi-process run caught it). Entries of
//! writers that *die* need the membership to say so, and fencing for writers that were only
//! paused (issue 11); until then they wedge their key as in the paper.
//!
//! The previous version a given-up entry points to (readers may follow the pointer until the
//! entry is completed) is handed over with it: whoever takes the entry out of the index, by
//! completing it or clearing it as a duplicate, recycles both. The entries of a writer whose
//! node failed are completed too, but what that writer had staged is lost with it.

use nessie_fabric::{Endpoint, RemoteAddr};
use nessie_store::dte::{DteMeta, GIVEN_UP, GUARDED, HEADER_OFF, TOMBSTONE};
use nessie_store::{Ite, DATA_REGION};
use rand::Rng;

use super::access::{Want, Words};
use super::write::{Pass, WriteState};
use super::{Abort, Attempt, CdClient};
use crate::error::Error;

/// How long, in expiry periods, a writer that gives up keeps trying to complete its own
/// leftover entry. Another write in progress before it in the key's candidates blocks it until
/// that write ends or is abandoned (its deadline, the margin and an expiry period later), so a
/// few periods are enough whatever happens.
pub const FINISH_OWN_PERIODS: u64 = 4;

/// How many times a writer issues the CAS that marks its entry given up when it gets no
/// answer (the request or the answer lost).
pub const MARK_GIVEN_UP_TRIES: u32 = 3;

/// What [`CdClient::mark_given_up`] did.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Marked {
    /// The entry is marked given up.
    Set,
    /// It is not: the CAS was refused before it was issued, or the entry is no longer ours
    /// (taken out and reused, or valid).
    NotOurs,
    /// No CAS got an answer (or one was refused after one that got none): it may be marked.
    Unknown,
}

/// What completing an abandoned entry did.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Completion {
    /// The write took effect: its value (or, for a DELETE, the empty ITE) is in the index.
    RolledForward,
    /// The entry was a duplicate behind a valid entry of the key: it was cleared, the write
    /// did not take effect.
    Cleared,
    /// The entry was no longer in the index (or no longer abandoned): nothing to do.
    Gone,
    /// A conditional write's entry: the entry it replaced is back in its place.
    PutBack,
    /// Our own entry, valid in the index: our Step 6 landed though it reported an error.
    Landed,
}

/// What a write that gives up learnt of its own entries ([`CdClient::finish_own`]).
pub(crate) struct Finished {
    /// One of its entries took effect: rolled forward by us, or its commit landed.
    pub(crate) took_effect: bool,
    /// Its commit was issued, the entry could not be looked at since: the write may have
    /// taken effect or not.
    pub(crate) unsure: bool,
    /// The previous versions handed over with the entries marked given up.
    pub(crate) handed: Vec<Ite>,
}

/// How Step 6 completes an abandoned entry.
enum Step6 {
    /// A DELETE's tombstone: swap it for an empty ITE.
    Empty,
    /// Our own entry: set it valid in place, as our attempt would have (only CASes can race
    /// with it: a helper replacing it with a copy of the same value).
    InPlace,
    /// Another writer's entry: swap it for a valid copy of this value.
    Copy(Vec<u8>, Words),
}

impl<E: Endpoint> CdClient<E> {
    /// Whether an entry with header `m`, written by another client, is abandoned: invalid, and
    /// its writer gave up on it, or its writer's node failed (`Fence`) and its write deadline
    /// has passed by the clock margin and one more expiry period (the dead writer's last step
    /// came after its last timer check, before its deadline).
    pub(crate) fn is_abandoned(&self, m: &DteMeta) -> bool {
        if m.valid || m.recycle.is_some() {
            return false;
        }
        if m.given_up {
            return true;
        }
        let grace = self.cfg.clock_margin_ns.saturating_add(self.cfg.expiry_ns);
        m.write_deadline != 0
            && self.writer_gone(m.writer.node(), m.write_deadline)
            && self.ep.now_ns() > m.write_deadline.saturating_add(grace)
    }

    /// Complete the abandoned write whose entry `w` holds `key`. `theirs`: `w` is another
    /// client's, and must be abandoned (re-checked here, on a fresh read); our own leftovers
    /// are completed as they are, since we are their writer.
    pub(crate) fn complete_write(
        &mut self,
        key: &[u8],
        w: Ite,
        theirs: bool,
    ) -> Attempt<Completion> {
        self.check_fence()?;
        let index = self.view.index.clone();
        let mut h = index.hashes(key);
        let mut p = Pass::new(self.deadline(), &index);
        let Some((c, earlier_valid)) = self.find_abandoned(&mut p, key, &mut h, w, theirs)? else {
            return Ok(Completion::Gone);
        };
        if earlier_valid && theirs {
            // Invisible behind the key's valid entry, and the next write of the key clears
            // it (Step 4). Its writer may be a MIGRATE that has yet to empty that entry (its
            // source): clearing the copy here could lose the key.
            return Ok(Completion::Gone);
        }
        let t = self.ep.mono_ns();
        let f = self.fetch(w, t, &p.d, key, Want::ValueIfKey)?;
        if !theirs && f.key_matches && f.meta.valid && !mutated!(self.cfg, forget_unsure_commit) {
            return Ok(Completion::Landed);
        }
        if !f.key_matches || f.meta.valid || (theirs && !self.is_abandoned(&f.meta)) {
            return Ok(Completion::Gone);
        }
        if earlier_valid {
            // Our own entry, hidden behind another of the key: our write did not take effect.
            self.check(&p.d)?;
            if self.cas_ite(p.slots[c], w, Ite::EMPTY)?.is_none() {
                return Err(Abort::Concurrent(
                    "our leftover changed before it was cleared",
                ));
            }
            self.recycle(w);
            return Ok(Completion::Cleared);
        }
        if f.meta.guarded {
            // A conditional write's: its condition was its writer's to evaluate, so it never
            // takes effect on anyone else's behalf. Its previous version goes back.
            return self.put_back(&p, c, w, Ite(f.meta.prev));
        }
        if let (true, Some(source)) = (theirs, f.meta.source) {
            if !self.source_emptied_for(&mut h, source, w)? {
                return self.take_out_copy(&p, c, w);
            }
        }
        let how = match (f.meta.tombstone, theirs) {
            (true, _) => Step6::Empty,
            (false, false) => Step6::InPlace,
            (false, true) => Step6::Copy(self.value_of(&f), Words::of(&f.meta)),
        };
        // Steps 4 and 5, on the writer's behalf.
        let mut st = WriteState::default();
        self.clear_duplicates(&mut p, key, &mut h, c, w, &mut st)?;
        self.reverse_pass(&p.d, &p.slots, &p.seen)?;
        let r = self.finish_step6(&p, c, w, h.filter(), key, how);
        for ite in st.take_staged() {
            self.recycle(ite); // duplicates we cleared are ours to recycle, whatever happened
        }
        r?;
        if theirs && f.meta.given_up && f.meta.prev != 0 {
            // Its writer handed the previous version over with the entry.
            self.recycle(Ite(f.meta.prev));
        }
        self.stats.rolled_forward += 1;
        Ok(Completion::RolledForward)
    }

    /// Whether the source (candidate `source` of the key `h` hashes) of the abandoned MIGRATE
    /// copy `w` was emptied: it holds the moved word naming `w`. If not, the source, or the
    /// write that replaced it, is the key's, and the copy must not be rolled forward.
    fn source_emptied_for(
        &mut self,
        h: &mut nessie_store::index::KeyHashes<'_>,
        source: u8,
        w: Ite,
    ) -> Attempt<bool> {
        let index = self.view.index.clone();
        let (word, _) = self.read_ite(h.slot(&index, source as usize))?;
        Ok(index.ite.names(word, w) || mutated!(self.cfg, complete_ignores_source))
    }

    /// Put `prev` back in candidate `c` in place of the abandoned guarded entry `w` that
    /// replaced it (its writer staged `prev`, or handed it over with `w`: it is intact).
    fn put_back(&mut self, p: &Pass<'_>, c: usize, w: Ite, prev: Ite) -> Attempt<Completion> {
        self.check(&p.d)?;
        if self.cas_ite(p.slots[c], w, prev)?.is_none() {
            return Err(Abort::Concurrent(
                "an abandoned conditional write changed before it was withdrawn",
            ));
        }
        self.recycle(w);
        Ok(Completion::PutBack)
    }

    /// Take the abandoned MIGRATE copy `w` (in candidate `c`) out: its move did not happen.
    fn take_out_copy(&mut self, p: &Pass<'_>, c: usize, w: Ite) -> Attempt<Completion> {
        self.check(&p.d)?;
        if self.cas_ite(p.slots[c], w, Ite::EMPTY)?.is_none() {
            return Err(Abort::Concurrent(
                "an abandoned MIGRATE copy changed before it was taken out",
            ));
        }
        self.recycle(w);
        Ok(Completion::Cleared)
    }

    /// The forward pass of a completion, up to `w`: its candidate position and whether an
    /// entry of the key that hides it comes before it: a valid one, or, for our own `w`
    /// (`!theirs`), any other (that write's Step 4 will clear ours anyway). `None`: `w` is in
    /// none of the key's candidates.
    fn find_abandoned(
        &mut self,
        p: &mut Pass<'_>,
        key: &[u8],
        h: &mut nessie_store::index::KeyHashes<'_>,
        w: Ite,
        theirs: bool,
    ) -> Attempt<Option<(usize, bool)>> {
        let mut earlier_valid = false;
        for i in 0..p.index.n {
            let (ite, t) = self.read_candidate(p, h, i)?;
            if ite == w {
                return Ok(Some((i, earlier_valid)));
            }
            if ite.is_empty() || !self.filter_matches(ite, h.filter()) {
                continue;
            }
            let f = self.fetch(ite, t, &p.d, key, Want::Key)?;
            match (f.key_matches, f.meta.valid) {
                (true, true) => earlier_valid = true,
                (true, false) if !theirs => earlier_valid = true,
                (true, false) if self.is_abandoned(&f.meta) => {
                    // Abandoned too: complete the earlier one first (the recursion only ever
                    // goes to earlier candidates, so it ends).
                    self.complete_write(key, ite, true)?;
                    return Err(Abort::Concurrent("completed an earlier abandoned write"));
                }
                (true, false) => {
                    return Err(Abort::Concurrent(
                        "another write of the key is in progress before the abandoned one",
                    ))
                }
                _ => {}
            }
        }
        Ok(None)
    }

    /// Step 6 on the writer's behalf, for the entry `w` in candidate `c`, as `how` says.
    /// Whoever takes `w` out of the index recycles it.
    fn finish_step6(
        &mut self,
        p: &Pass<'_>,
        c: usize,
        w: Ite,
        filter: u64,
        key: &[u8],
        how: Step6,
    ) -> Attempt<()> {
        let how = if mutated!(self.cfg, complete_to_empty) {
            Step6::Empty
        } else {
            how
        };
        let (desired, copy_slot) = match how {
            Step6::InPlace => {
                self.check(&p.d)?;
                return self.set_valid(w);
            }
            Step6::Empty => (Ite::EMPTY, None),
            Step6::Copy(value, words) => {
                let (copy, slot) = self.write_valid_copy(filter, key, &value, words)?;
                (copy, Some(slot))
            }
        };
        let swapped = match self.check(&p.d) {
            Ok(()) => self.cas_ite(p.slots[c], w, desired),
            Err(e) => Err(e),
        };
        let (r, never_visible) = match swapped {
            Ok(Some(_)) => {
                self.recycle(w);
                return Ok(());
            }
            Ok(None) => (
                Err(Abort::Concurrent(
                    "abandoned entry changed before its completion",
                )),
                true,
            ),
            // Not issued: the timer ran out, or the fence refused it.
            Err(e @ (Abort::Timeout | Abort::Fatal(Error::Fenced { .. }))) => (Err(e), true),
            // The CAS may have taken place (its request or answer lost): our copy may be in
            // the index, so it is neither released nor recycled (a leak of one entry), and
            // neither is `w`, which another may still take out.
            Err(e) => (Err(e), false),
        };
        if let (Some(slot), true) = (copy_slot, never_visible) {
            self.release_unpublished(slot); // never visible: reusable at once
        }
        r
    }

    /// A write that gives up completes the entries of its own still in the index, so that it
    /// leaves nothing behind, and marks those it could not complete given up, for others to
    /// complete. Returns whether the write took effect (one of its entries was rolled forward
    /// by us) and the previous versions handed over with the entries marked given up.
    pub(crate) fn finish_own(
        &mut self,
        key: &[u8],
        tombstone: bool,
        st: &mut WriteState,
    ) -> Finished {
        let mut took_effect = false;
        let mut unsure = false;
        let mut handed = Vec::new();
        for (ite, prev) in st.published_latest_first() {
            match self.finish_own_one(key, ite) {
                Ok(Completion::RolledForward | Completion::Landed) => took_effect = true,
                Ok(Completion::PutBack) => st.hand_over(prev), // in the index again
                // Our commit was issued and the entry has left the index (`committing`).
                Ok(Completion::Gone) if st.committing == Some(ite) => took_effect = true,
                Ok(_) => {}
                Err(_) => {
                    if st.committing == Some(ite) {
                        // Our commit may have landed and we cannot tell: neither may the
                        // caller of a conditional write (`Error::Indeterminate`).
                        unsure = true;
                    }
                    let kind = if tombstone { TOMBSTONE } else { 0 }
                        | if st.guarded { GUARDED } else { 0 };
                    // Possibly given up is given up: whoever completes the entry may put
                    // back or recycle `prev`, so we must not recycle it (at worst it leaks).
                    let marked = self.mark_given_up(ite, kind) != Marked::NotOurs;
                    if marked && !prev.is_empty() {
                        handed.push(prev);
                    }
                }
            }
        }
        st.committing = None;
        Finished {
            took_effect,
            unsure: unsure && !took_effect,
            handed,
        }
    }

    /// Set the given-up bit of our invalid entry `ite` (one CAS on its header word, which
    /// fails harmlessly if the entry was taken out and reused meanwhile: the word then holds
    /// another writer's tag, or is valid). `kind`: the header's other bits (a tombstone, or a
    /// MIGRATE copy's source). A CAS that fails unable to tell (its request or answer lost) is
    /// issued again, up to [`MARK_GIVEN_UP_TRIES`] times: finding the bit already set then
    /// means the lost one took place.
    pub(crate) fn mark_given_up(&mut self, ite: Ite, kind: u64) -> Marked {
        let loc = self.dte_location(ite);
        let addr = RemoteAddr::new(loc.node, DATA_REGION, loc.off + HEADER_OFF);
        let ours = self.view.dte.header(self.tag, false) | kind;
        // Whether an earlier try went unanswered: it may have set the bit.
        let mut unanswered = false;
        for _ in 0..MARK_GIVEN_UP_TRIES {
            match self.ep.compare_and_swap(addr, ours, ours | GIVEN_UP) {
                Ok(was) if was == ours || was == ours | GIVEN_UP => return Marked::Set,
                Ok(_) => return Marked::NotOurs,
                Err(e @ nessie_fabric::FabricError::Fenced { .. }) => {
                    tracing::warn!(%e, ?ite, "could not mark an abandoned DTE given up");
                    // This try was refused before it was issued; an earlier one may have set
                    // the bit at its decider (a carrier refused past its lease: rule 6).
                    return match unanswered {
                        true => Marked::Unknown,
                        false => Marked::NotOurs,
                    };
                }
                Err(e) => {
                    unanswered = true;
                    tracing::warn!(%e, ?ite, "marking a DTE given up: no answer");
                }
            }
        }
        Marked::Unknown
    }

    /// [`Self::complete_write`] of our own entry, with the usual back-off between attempts,
    /// for at most [`FINISH_OWN_PERIODS`] expiry periods (plus the clock margin).
    fn finish_own_one(&mut self, key: &[u8], ite: Ite) -> Attempt<Completion> {
        let mut r = Err(Abort::Timeout);
        self.retry_own(|c| {
            r = c.complete_write(key, ite, false);
            c.timed_out = matches!(r, Err(Abort::Timeout));
            match &r {
                Ok(_) | Err(Abort::Fatal(_)) => true,
                Err(Abort::Timeout) => {
                    c.stats.timeouts += 1;
                    false
                }
                Err(_) => {
                    c.stats.concurrent_aborts += 1;
                    false
                }
            }
        });
        r
    }

    /// Try `step` until it says it is done, backing off with jitter between tries, for at
    /// most [`FINISH_OWN_PERIODS`] expiry periods (plus the clock margin): how long a writer
    /// keeps at what it left in the index. Whether `step` got done.
    pub(crate) fn retry_own(&mut self, mut step: impl FnMut(&mut Self) -> bool) -> bool {
        let mut backoff = self.cfg.retry.initial_backoff_ns.max(1);
        let until =
            self.ep.mono_ns() + FINISH_OWN_PERIODS * self.cfg.expiry_ns + self.cfg.clock_margin_ns;
        while self.ep.mono_ns() < until {
            if step(self) {
                return true;
            }
            self.ep.sleep_ns(self.rng.gen_range(0..=backoff));
            backoff = (backoff * 2).min(self.cfg.retry.max_backoff_ns.max(1));
        }
        false
    }
}
