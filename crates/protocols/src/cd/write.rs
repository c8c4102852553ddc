//! PUT (Appendix A.1.3) and DELETE (A.1.5), which share every step but the last.
//!
//! Step 2 finds a candidate ITE: the first that is empty, or refers to a valid DTE holding the
//! key, or to our own invalid DTE left by an aborted attempt (we take its slot and carry its
//! previous-version pointer forward). An invalid DTE of someone else means a write is in
//! progress: abort (this is what lets the earliest writer finish). No candidate: MIGRATE one
//! (2.4) and start over. Step 3 writes the new, invalid DTE into the local data table and CASes
//! it into the candidate (3.1); the replaced DTE is staged for recycling (3.2). Step 4 clears
//! duplicates of the key in later candidates; Step 5 is the reverse pass; Step 6 sets the DTE
//! valid (PUT) or empties the candidate again (DELETE); Step 7 marks staged DTEs for recycling.
//!
//! Deviation, documented in docs/protocol.md: a DELETE that finds no candidate (every ITE holds
//! another key) does not migrate; it verifies with a GET-style reverse pass that the key is
//! absent and returns.

use nessie_fabric::Endpoint;
use nessie_store::index::Slot;
use nessie_store::limits::MAX_HASH_FUNCTIONS;
use nessie_store::Ite;

use super::access::Want;
use super::{Abort, Attempt, CdClient};
use crate::config::MAX_MIGRATIONS_PER_ATTEMPT;
use crate::error::Error;
use crate::hooks::HookPoint;

/// What a write carries from one attempt to the next.
#[derive(Default, Debug)]
pub(crate) struct WriteState {
    /// ITEs removed from the index whose DTEs are marked for recycling once the write
    /// completes (Step 3.2: kept across attempts, so nothing leaks however many it takes).
    rec: Vec<Ite>,
    /// Our invalid DTEs swapped into the index by an attempt and not validated or removed yet.
    published: Vec<(Slot, Ite)>,
}

impl<E: Endpoint> CdClient<E> {
    /// PUT (`Some(value)`) or DELETE (`None`) with retries.
    pub(crate) fn write(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), Error> {
        let mut st = WriteState::default();
        let r = self.with_retry(|c| c.write_once(key, value, &mut st));
        if r.is_err() {
            self.abandon(&mut st);
        }
        r
    }

    /// The write gave up. Staged DTEs may be recycled only if none of our invalid DTEs is still
    /// in the index: such an entry's previous-version pointer leads to a staged DTE that
    /// concurrent GETs may still read. Otherwise they stay allocated (counted as leaked).
    fn abandon(&mut self, st: &mut WriteState) {
        let mut still_published = 0u64;
        for (slot, ite) in std::mem::take(&mut st.published) {
            match self.read_ite(slot) {
                Ok((cur, _)) if cur != ite => {}
                _ => still_published += 1,
            }
        }
        let rec = std::mem::take(&mut st.rec);
        if still_published == 0 {
            for ite in rec {
                self.recycle(ite);
            }
        } else {
            self.stats.leaked += rec.len() as u64 + still_published;
            tracing::warn!(
                still_published,
                staged = rec.len(),
                "abandoned write left an invalid DTE in the index"
            );
        }
    }

    /// One attempt of PUT/DELETE.
    pub(crate) fn write_once(
        &mut self,
        key: &[u8],
        value: Option<&[u8]>,
        st: &mut WriteState,
    ) -> Attempt<()> {
        let index = self.view.index.clone();
        let n = index.n;
        let mut h = index.hashes(key); // Step 1 (lazily)
        let mut migrations = 0;
        'attempt: loop {
            let d = self.deadline(); // Step 0
            let mut seen = [Ite::EMPTY; MAX_HASH_FUNCTIONS as usize];
            let mut slots = [0u64; MAX_HASH_FUNCTIONS as usize];

            // Step 2: find the candidate.
            let mut cnd = None;
            let mut prev = Ite::EMPTY;
            for i in 0..n {
                self.check(&d)?;
                slots[i] = h.slot(&index, i);
                let (ite, t) = self.read_ite(slots[i])?;
                self.check(&d)?;
                seen[i] = ite;
                if ite.is_empty() {
                    cnd = Some(i); // 2.1
                    break;
                }
                if !self.filter_matches(ite, h.filter()) {
                    continue; // 2.2
                }
                let f = self.fetch(ite, t, &d, key, Want::Key)?; // 2.3
                if !f.key_matches {
                    continue;
                }
                if f.meta.valid {
                    cnd = Some(i);
                    prev = ite;
                } else if f.meta.writer == self.tag {
                    // Our own leftover from an aborted attempt: reuse its slot, keep its
                    // previous version (the value it was replacing, still staged in `rec`).
                    cnd = Some(i);
                    prev = Ite(f.meta.prev);
                } else {
                    return Err(Abort::Concurrent(
                        "write met another in-progress write on the key",
                    ));
                }
                break;
            }

            let Some(c) = cnd else {
                if value.is_none() {
                    // DELETE of a key that none of its candidates holds.
                    self.reverse_pass(&d, &slots, &seen)?;
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
                continue 'attempt;
            };

            // Step 3: a new, invalid DTE in local memory, then CAS it into the candidate.
            let (new, idx) = self.write_new_dte(h.filter(), prev, key, value.unwrap_or(&[]))?;
            if let Err(e) = self.check(&d) {
                self.table.release_unpublished(idx);
                return Err(e);
            }
            if !self.cas_ite(slots[c], seen[c], new)? {
                self.table.release_unpublished(idx); // never visible: reusable at once
                return Err(Abort::Concurrent("candidate ITE changed before the CAS"));
            }
            st.published.push((slots[c], new));
            self.hook(HookPoint::AfterCandidateCas);
            if !seen[c].is_empty() {
                st.rec.push(seen[c]); // 3.2
            }
            seen[c] = new;

            // Step 4: clear duplicates of the key in the remaining candidates.
            for i in c + 1..n {
                self.check(&d)?;
                slots[i] = h.slot(&index, i);
                let (ite, t) = self.read_ite(slots[i])?;
                self.check(&d)?;
                seen[i] = ite;
                if ite.is_empty() || !self.filter_matches(ite, h.filter()) {
                    continue; // 4.1, 4.2
                }
                if !self.fetch(ite, t, &d, key, Want::Key)?.key_matches {
                    continue; // 4.3
                }
                if !self.cas_ite(slots[i], ite, Ite::EMPTY)? {
                    return Err(Abort::Concurrent(
                        "duplicate ITE changed before it was cleared",
                    ));
                }
                st.rec.push(ite); // 4.4
                seen[i] = Ite::EMPTY;
            }

            // Step 5: the reverse pass.
            self.hook(HookPoint::BeforeReversePass);
            if !self.cfg.mutations.skip_put_reverse_pass {
                self.reverse_pass(&d, &slots, &seen)?;
            }

            // Step 6: commit.
            match value {
                Some(_) => {
                    self.hook(HookPoint::BeforeSetValid);
                    self.set_valid(new)?;
                }
                None => {
                    // DELETE: its DTE is never valid; take it out of the index again. If the CAS
                    // fails, whoever changed the ITE owns the DTE's recycling.
                    if self.cas_ite(slots[c], new, Ite::EMPTY)? {
                        st.rec.push(new);
                    }
                }
            }
            st.published.clear();

            // Step 7: recycle what this write replaced.
            for ite in std::mem::take(&mut st.rec) {
                self.recycle(ite);
            }
            return Ok(());
        }
    }

    /// Re-read candidates N-1..1 (skipping the last one examined) and abort on any change.
    pub(crate) fn reverse_pass(
        &mut self,
        d: &super::Deadline,
        slots: &[Slot],
        seen: &[Ite],
    ) -> Attempt<()> {
        let n = self.view.index.n;
        for i in (0..n - 1).rev() {
            self.check(d)?;
            let (ite, _) = self.read_ite(slots[i])?;
            if ite != seen[i] {
                return Err(Abort::Concurrent("reverse pass saw a changed ITE"));
            }
        }
        // The last re-read must also have happened within the expiry period.
        self.check(d)
    }
}
