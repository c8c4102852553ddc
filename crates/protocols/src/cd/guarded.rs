//! Conditional ("guarded") writes: a PUT or DELETE that takes effect only if the key is absent,
//! present, or at a given version, the version being the ITE word of the key's entry. It is
//! what memcached's `add`/`replace`/`cas` and every read-modify-write (`incr`, `append`,
//! Redis `SET NX`, `GETDEL`) need, done with the same one-sided steps as PUT (`write.rs`).
//! The argument is in `docs/protocol.md`, "Guarded writes"; in short:
//!
//! 1. **Look.** A forward pass over *all* the key's candidates. Any invalid entry of the key
//!    (a write in progress, a MIGRATE's copy) ends the attempt: its write may still take
//!    effect, before or after ours, so the key's state is not known (an abandoned one is
//!    completed first). The key's state is its first valid entry, or absent. The candidate is
//!    that entry's, else the first empty one.
//! 2. **Evaluate.** If the condition fails, the look was a read: a reverse pass confirms it and
//!    the write answers `Unmet` having changed nothing.
//! 3. **Write** (PUT Step 3): our invalid entry, marked guarded and recording the word it
//!    replaces, is CASed into the candidate over the word the look saw.
//! 4. **Confirm** (instead of PUT Step 4): every later candidate must still hold the word the
//!    look saw. Hidden valid duplicates of the key are cleared as PUT does, but another
//!    writer's invalid entry is never cleared: a plain PUT clears it and is ordered after it,
//!    which a conditional write cannot be, since the condition was evaluated without it.
//! 5. **Reverse pass, commit** (PUT Steps 5, 6).
//!
//! An attempt that aborts after Step 3 *withdraws*: it CASes the replaced word back (the
//! replaced entry was only staged, never recycled), so no conditional write is ever left half
//! done for others to roll forward. One that cannot (its node is cut off) is marked given up,
//! and whoever completes a guarded entry puts its previous version back (`abandoned.rs`).

use nessie_store::index::KeyHashes;
use nessie_store::limits::MAX_HASH_FUNCTIONS;
use nessie_store::Ite;

use super::access::Want;
use super::write::{Candidate, Pass, WriteState};
use super::{Abort, Attempt, CdClient};
use crate::config::MAX_MIGRATIONS_PER_ATTEMPT;
use crate::error::Error;
use crate::hooks::HookPoint;
use crate::{Cond, CondOutcome, Version};
use nessie_fabric::Endpoint;

/// What the look (step 1) found.
struct Look {
    /// Every candidate's word as the look read it.
    words: [Ite; MAX_HASH_FUNCTIONS as usize],
    /// Where to write: the key's first valid entry, else the first empty candidate.
    cand: Option<Candidate>,
    /// The key's first valid entry (`None`: none).
    current: Option<Ite>,
    /// That entry's item has expired: the key is absent, though the entry is still in the
    /// index (the write replaces it, as it would any current entry).
    expired: bool,
    /// Candidates (a bit each) holding valid entries of the key after the first: hidden
    /// duplicates, which Step 4 clears.
    hidden: u32,
}

impl<E: Endpoint> CdClient<E> {
    /// Store `value` under `key` if `cond` holds, atomically (see the module comment).
    pub fn put_if(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        self.check_key(key)?;
        self.check_value(value)?;
        self.stats.puts += 1;
        self.write_if(key, Some(&[value]), cond)
    }

    /// Remove `key` if `cond` holds, atomically. Removing an absent key under
    /// [`Cond::Absent`] is a no-op that counts as stored.
    pub fn delete_if(&mut self, key: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        self.check_key(key)?;
        self.stats.deletes += 1;
        self.write_if(key, None, cond)
    }

    fn write_if(
        &mut self,
        key: &[u8],
        value: Option<&[&[u8]]>,
        cond: Cond,
    ) -> Result<CondOutcome, Error> {
        self.clear_evicted();
        let mut st = WriteState::guarded();
        match self.with_retry(|c| c.write_if_once(key, value, cond, &mut st)) {
            Ok(o) => Ok(o),
            // Giving up withdraws what is left (a guarded entry is completed by putting its
            // previous version back), so a conditional write that fails took no effect,
            // unless its commit was issued: then it succeeds if its entry left the index or
            // is valid there, and is `Indeterminate` if it cannot be read.
            Err(e) => self
                .give_up(key, value.is_none(), &mut st, e)
                .map(|()| CondOutcome::Stored),
        }
    }

    /// One attempt of a conditional write.
    fn write_if_once(
        &mut self,
        key: &[u8],
        value: Option<&[&[u8]]>,
        cond: Cond,
        st: &mut WriteState,
    ) -> Attempt<CondOutcome> {
        self.check_fence()?;
        let index = self.view.index.clone();
        let mut h = index.hashes(key);
        let mut migrations = 0;
        let (mut p, look, cand) = loop {
            let mut p = Pass::new(self.deadline(), &index);
            let look = self.look(&mut p, key, &mut h)?;
            self.hook(HookPoint::GuardedAfterLook);
            // The key's state: an expired item is absent.
            let current = look.current.filter(|_| !look.expired).map(|i| i.0);
            let met = cond.holds(current);
            if !met || (value.is_none() && current.is_none()) {
                // Nothing to write: the look was a read, which the reverse pass confirms.
                self.reverse_pass(&p.d, &p.slots, &p.seen)?;
                for ite in st.take_staged() {
                    self.recycle(ite); // what earlier attempts cleared
                }
                return Ok(if met {
                    CondOutcome::Stored
                } else {
                    CondOutcome::Unmet { current }
                });
            }
            if let Some(cand) = look.cand {
                break (p, look, cand);
            }
            // Every candidate holds another key: make room (PUT 2.4) and look again.
            if migrations >= MAX_MIGRATIONS_PER_ATTEMPT {
                return Err(Abort::Fatal(Error::IndexFull {
                    depth: self.cfg.max_migrate_depth,
                }));
            }
            self.migrate_for(key, &mut h)?;
            migrations += 1;
        };
        let new = self.publish_new_dte(&mut p, key, value, h.filter(), cand, st, true)?;
        match self.confirm_and_commit(&mut p, &mut h, &look, cand, value, new, st) {
            Ok(()) => {
                for ite in st.take_staged() {
                    self.recycle(ite); // Step 7
                }
                Ok(CondOutcome::Stored)
            }
            Err(e @ (Abort::Concurrent(_) | Abort::Timeout)) => {
                self.withdraw(&p, cand, new, st)?;
                Err(e)
            }
            Err(e) => Err(e), // left to giving up, which withdraws it
        }
    }

    /// Step 1: read every candidate of the key (see the module comment).
    fn look(&mut self, p: &mut Pass<'_>, key: &[u8], h: &mut KeyHashes<'_>) -> Attempt<Look> {
        let mut first_empty = None;
        let mut first_valid: Option<(usize, Ite)> = None;
        let mut expired = false;
        let mut hidden = 0u32;
        for i in 0..p.index.n {
            let (ite, t) = self.read_candidate(p, h, i)?;
            if ite.is_empty() {
                first_empty = first_empty.or(Some(i));
                continue;
            }
            if !self.filter_matches(ite, h.filter()) {
                continue;
            }
            let f = self.fetch(ite, t, &p.d, key, Want::Key)?;
            if !f.key_matches {
                continue;
            }
            if !f.meta.valid && !mutated!(self.cfg, guard_passes_writes) {
                let theirs = f.meta.writer != self.tag || f.meta.given_up;
                if !theirs || self.is_abandoned(&f.meta) {
                    self.complete_write(key, ite, theirs)?;
                    return Err(Abort::Concurrent("a conditional write completed a write"));
                }
                return Err(Abort::Concurrent(
                    "a conditional write met a write of the key in progress",
                ));
            }
            // The mutations: a write in progress cleared as a plain PUT's Step 4 clears it; the
            // state judged from PUT Step 2's view (up to the first empty candidate).
            let past_step2 = first_empty.is_some() && mutated!(self.cfg, guard_looks_to_candidate);
            if !f.meta.valid || past_step2 {
                hidden |= 1 << i;
            } else if first_valid.is_none() {
                first_valid = Some((i, ite));
                expired = self.expired(f.meta.expires, &p.d);
            } else {
                hidden |= 1 << i;
            }
        }
        let cand = match (first_valid, first_empty) {
            (Some((pos, ite)), _) => Some(Candidate {
                pos,
                prev: ite,
                replaced_valid: true,
                replaced_len: 0,
            }),
            (None, Some(pos)) => Some(Candidate {
                pos,
                prev: Ite::EMPTY,
                replaced_valid: false,
                replaced_len: 0,
            }),
            (None, None) => None,
        };
        Ok(Look {
            words: p.seen,
            cand,
            current: first_valid.map(|(_, i)| i),
            expired,
            hidden,
        })
    }

    /// Steps 4 to 6 of a conditional write whose entry `new` is in the candidate `cand`.
    #[allow(clippy::too_many_arguments)]
    fn confirm_and_commit(
        &mut self,
        p: &mut Pass<'_>,
        h: &mut KeyHashes<'_>,
        look: &Look,
        cand: Candidate,
        value: Option<&[&[u8]]>,
        new: Ite,
        st: &mut WriteState,
    ) -> Attempt<()> {
        self.confirm(p, h, look, cand.pos, st)?;
        self.hook(HookPoint::BeforeReversePass);
        self.reverse_pass(&p.d, &p.slots, &p.seen)?;
        self.commit(value, p.slots[cand.pos], new, st)
    }

    /// Step 4: every candidate after `c` still holds what the look saw; hidden valid
    /// duplicates of the key are cleared (and staged), as PUT Step 4 clears them.
    fn confirm(
        &mut self,
        p: &mut Pass<'_>,
        h: &mut KeyHashes<'_>,
        look: &Look,
        c: usize,
        st: &mut WriteState,
    ) -> Attempt<()> {
        for i in c + 1..p.index.n {
            let (ite, _) = self.read_candidate(p, h, i)?;
            if ite != look.words[i] {
                return Err(Abort::Concurrent(
                    "a later candidate changed under a conditional write",
                ));
            }
            if look.hidden & (1 << i) == 0 {
                continue;
            }
            let Some(cleared) = self.cas_ite(p.slots[i], ite, Ite::EMPTY)? else {
                return Err(Abort::Concurrent(
                    "a hidden duplicate changed before it was cleared",
                ));
            };
            st.stage(ite);
            p.seen[i] = cleared;
        }
        Ok(())
    }

    /// Take our entry `new` out of the candidate again, putting back the word it replaced
    /// (the replaced entry was only staged, so it is intact). If the word changed, whoever
    /// changed it took our entry out and recycles it.
    fn withdraw(
        &mut self,
        p: &Pass<'_>,
        cand: Candidate,
        new: Ite,
        st: &mut WriteState,
    ) -> Attempt<()> {
        let restore = if cand.replaced_valid {
            cand.prev
        } else {
            Ite::EMPTY
        };
        let restored = match self.cas_ite(p.slots[cand.pos], new, restore) {
            Ok(r) => r,
            // Refused before it was issued: nothing changed.
            Err(e @ Abort::Fatal(Error::Fenced { .. })) => return Err(e),
            Err(e) => {
                // The CAS may have taken place (its request or answer lost): the replaced
                // entry may be back in the index, so this write must not recycle it (at
                // worst it leaks). Our entry stays published: giving up takes it out if it
                // is still there, and leaves it alone if not.
                st.hand_over(cand.prev);
                return Err(e);
            }
        };
        match restored {
            Some(_) => {
                st.withdrawn(new, cand.prev);
                self.recycle(new);
            }
            None => st.withdrawn(new, Ite::EMPTY),
        }
        Ok(())
    }

    /// Read `key` into `out` with its version (the ITE word of the entry whose value it is);
    /// `None` if absent.
    pub fn get_versioned(
        &mut self,
        key: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Option<Version>, Error> {
        self.check_key(key)?;
        self.stats.gets += 1;
        // The version of a value read from a previous version is that entry's word.
        Ok(self.read_value_into(key, out, 0)?.map(|ite| ite.0))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{
        fast_cfg, key_first_in, key_with_distinct_candidates, small_geometry, InProcCluster,
    };
    use crate::config::{Mutations, Optimizations, ProtocolConfig};
    use crate::fence::Fence;
    use crate::hooks::HookPoint;
    use crate::{Cond, CondOutcome, Error};
    use std::sync::Arc;

    use CondOutcome::{Stored, Unmet};

    #[test]
    fn conditions_are_judged_on_the_current_version() {
        for optimizations in [Optimizations::default(), Optimizations::NONE] {
            let cfg = ProtocolConfig {
                optimizations,
                ..fast_cfg()
            };
            let c = InProcCluster::new(small_geometry(), cfg);
            let (mut a, mut b) = (c.client(0), c.client(1));
            let mut out = Vec::new();
            let absent = Ok(Unmet { current: None });
            assert_eq!(a.put_if(b"k", b"1", Cond::Present), absent);
            assert_eq!(a.delete_if(b"k", Cond::Present), absent);
            assert_eq!(a.delete_if(b"k", Cond::Absent), Ok(Stored), "a no-op");
            assert_eq!(a.put_if(b"k", b"1", Cond::Absent), Ok(Stored));
            let v1 = b.get_versioned(b"k", &mut out).unwrap().unwrap();
            assert_eq!(out, b"1");
            let at_v1 = Ok(Unmet { current: Some(v1) });
            assert_eq!(b.put_if(b"k", b"2", Cond::Absent), at_v1);
            assert_eq!(b.put_if(b"k", b"2", Cond::Version(v1)), Ok(Stored));
            let v2 = a.get_versioned(b"k", &mut out).unwrap().unwrap();
            assert_eq!((out.as_slice(), v2 != v1), (&b"2"[..], true));
            let at_v2 = Ok(Unmet { current: Some(v2) });
            assert_eq!(a.put_if(b"k", b"3", Cond::Version(v1)), at_v2);
            assert_eq!(a.put_if(b"k", b"3", Cond::Present), Ok(Stored));
            a.put(b"k", b"4").unwrap(); // a plain write changes the version too
            let v4 = b.get_versioned(b"k", &mut out).unwrap().unwrap();
            assert_eq!(out, b"4");
            assert!(matches!(
                b.delete_if(b"k", Cond::Version(v2)),
                Ok(Unmet { .. })
            ));
            assert_eq!(b.delete_if(b"k", Cond::Version(v4)), Ok(Stored));
            assert_eq!(a.get_versioned(b"k", &mut out), Ok(None));
            assert_eq!(a.get(b"k"), Ok(None));
        }
    }

    #[test]
    fn bad_input_is_refused_before_anything_is_written() {
        let c = InProcCluster::small();
        let mut a = c.client(0);
        let long = vec![b'v'; super::super::testkit::VALUE_MAX as usize + 1];
        assert!(matches!(
            a.put_if(b"k", &long, Cond::Absent),
            Err(crate::Error::ValueTooLarge { .. })
        ));
        assert_eq!(
            a.put_if(b"", b"v", Cond::Absent),
            Err(crate::Error::EmptyKey)
        );
        assert_eq!(c.occupancy(), 0);
    }

    /// A cluster with `mutations`, a key K with distinct candidates, and a key X whose first
    /// candidate is K's first.
    fn race_cluster(mutations: Mutations) -> (InProcCluster, Vec<u8>, Vec<u8>) {
        // A long expiry: the races are staged with hooks that wait for each other, which on a
        // loaded machine outlasted a 2 ms timer now and then and raced differently (1 run in
        // 5 under two busy loops). Nothing here waits for an expiry.
        let cfg = ProtocolConfig {
            mutations,
            expiry_ns: 1_000_000_000,
            ..fast_cfg()
        };
        let c = InProcCluster::new(small_geometry(), cfg);
        let k = key_with_distinct_candidates(&c);
        let x = key_first_in(&c, c.candidates(&k)[0], std::slice::from_ref(&k));
        (c, k, x)
    }

    /// K's valid entry in its second candidate, the first empty (a key that held it was
    /// deleted). Returns what `put_if(K, Absent)` answers and what K reads afterwards.
    fn add_over_a_later_entry(mutations: Mutations) -> (CondOutcome, Option<Vec<u8>>) {
        let (c, k, x) = race_cluster(mutations);
        let mut w = c.client(0);
        w.put(&x, b"x").unwrap();
        w.put(&k, b"old").unwrap(); // into K's second candidate
        w.delete(&x).unwrap();
        assert!(c.ite(c.candidates(&k)[0]).is_empty());
        let mut g = c.client(1);
        let got = g.put_if(&k, b"new", Cond::Absent).unwrap();
        (got, g.get(&k).unwrap())
    }

    #[test]
    fn the_state_is_judged_from_every_candidate() {
        let (got, value) = add_over_a_later_entry(Mutations::default());
        assert!(matches!(got, Unmet { current: Some(_) }), "{got:?}");
        assert_eq!(value.as_deref(), Some(&b"old"[..]));
        // Control: judged from PUT Step 2's view, the add misses the entry and succeeds.
        let (got, value) = add_over_a_later_entry(Mutations {
            guard_looks_to_candidate: true,
            ..Mutations::default()
        });
        assert_eq!((got, value.as_deref()), (Stored, Some(&b"new"[..])));
    }

    /// A plain PUT W of K (value "w") holds its entry in K's second candidate, past its
    /// reverse pass, while the first candidate is freed; a conditional add of K ("a") then
    /// runs, and W sets its entry valid once the add has read every candidate (in its
    /// second attempt, or before its reverse pass). Returns what the add answered, whether
    /// W succeeded, and what K reads afterwards.
    fn add_beside_a_write_in_progress(mutations: Mutations) -> (CondOutcome, bool, Vec<u8>) {
        use std::sync::mpsc::channel;
        let (c, k, x) = race_cluster(mutations);
        let mut setup = c.client(0);
        setup.put(&x, b"x").unwrap();
        let (paused, wait_paused) = channel();
        let (go, wait_go) = channel::<()>();
        let (done, wait_done) = channel();
        let mut w = c.client(1);
        w.set_hook(Some(Box::new(move |p| {
            if p == HookPoint::BeforeSetValid {
                paused.send(()).unwrap();
                wait_go.recv().unwrap();
            }
        })));
        let mut g = c.client(2);
        let mut reads = 0;
        let mut release = Some((go, wait_done));
        let w_ok = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w_ok2 = w_ok.clone();
        g.set_hook(Some(Box::new(move |p| {
            reads += (p == HookPoint::AfterIteRead) as u32;
            if reads >= 3 || p == HookPoint::BeforeReversePass {
                if let Some((go, wait_done)) = release.take() {
                    go.send(()).unwrap();
                    let ok = wait_done.recv().unwrap();
                    w_ok2.store(ok, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })));
        std::thread::scope(|s| {
            let k = &k;
            s.spawn(move || {
                let r = w.put(k, b"w");
                done.send(r.is_ok()).unwrap();
            });
            wait_paused.recv().unwrap();
            setup.delete(&x).unwrap(); // K's first candidate is free
            let got = g.put_if(k, b"a", Cond::Absent).unwrap();
            let value = setup.get(k).unwrap().unwrap();
            (got, w_ok.load(std::sync::atomic::Ordering::SeqCst), value)
        })
    }

    #[test]
    fn a_conditional_write_waits_for_a_write_in_progress() {
        let (got, w_ok, value) = add_beside_a_write_in_progress(Mutations::default());
        assert!(w_ok, "W returned success before the add did");
        assert!(matches!(got, Unmet { current: Some(_) }), "{got:?}");
        assert_eq!(value, b"w", "the add found W's value");
        // Control: passing over W's entry and clearing it, the add succeeds although W, which
        // returned first, wrote the key: W's write is lost.
        let (got, w_ok, value) = add_beside_a_write_in_progress(Mutations {
            guard_passes_writes: true,
            ..Mutations::default()
        });
        assert_eq!((got, w_ok, value.as_slice()), (Stored, true, &b"a"[..]));
    }

    /// A conditional write gives up and cannot take its entry out (its CAS refused), so it
    /// marks the entry given up, and that CAS takes place but its answer is lost. Whoever
    /// completes the entry puts the replaced version back, so the writer must not recycle that
    /// version. Before, it did: once it expired, new writes on its node reused its DTE, and
    /// the key, put back to it, read as absent.
    #[test]
    fn a_given_up_mark_whose_answer_is_lost_hands_the_version_over() {
        use std::sync::atomic::Ordering::SeqCst;
        let c = InProcCluster::new(small_geometry(), fast_cfg());
        let (mut setup, v) = old_k(&c);
        let mut out = Vec::new();
        let (mut a, fail) = c.failing_client(0);
        let f = fail.clone();
        a.set_hook(Some(Box::new(move |p| {
            if p == HookPoint::BeforeSetValid {
                f.writes.store(1, SeqCst); // its commit
                f.cas.store(1, SeqCst); // giving up: putting the old version back
                f.cas_lost.store(1, SeqCst); // and marking the entry given up
            }
        })));
        assert!(a.put_if(b"k", b"new", Cond::Version(v)).is_err());
        let left = (fail.writes.load(SeqCst), fail.cas.load(SeqCst));
        assert_eq!((left, fail.cas_lost.load(SeqCst)), ((0, 0), 0));
        // Past the expiry period, new entries on node 0 reuse whatever it recycled.
        std::thread::sleep(std::time::Duration::from_millis(10));
        c.reclaim(0);
        for i in 0..32u8 {
            setup.put(&[b'o', i], b"abc").unwrap();
        }
        let mut g = c.client(2);
        assert_eq!(g.get(b"k").unwrap().as_deref(), Some(&b"old"[..]));
        // A write of the key completes the given-up entry (the put-back word is a new version).
        assert!(matches!(g.delete_if(b"k", Cond::Absent), Ok(Unmet { .. })));
        let back = g.get_versioned(b"k", &mut out).unwrap().unwrap();
        assert_eq!(out, b"old", "the version put back");
        assert_eq!(g.put_if(b"k", b"after", Cond::Version(back)), Ok(Stored));
        for i in 0..32u8 {
            assert_eq!(g.get(&[b'o', i]).unwrap().as_deref(), Some(&b"abc"[..]));
        }
    }

    /// A client of `c`'s node 0, having written "old" under `k`, and that value's version.
    fn old_k(
        c: &InProcCluster,
    ) -> (
        super::super::CdClient<impl nessie_fabric::Endpoint>,
        crate::Version,
    ) {
        let mut setup = c.client(0);
        setup.put(b"k", b"old").unwrap();
        let v = setup.get_versioned(b"k", &mut Vec::new()).unwrap().unwrap();
        (setup, v)
    }

    /// How a conditional write's commit (Step 6) goes wrong in
    /// [`a_conditional_write_whose_commit_answer_is_lost_says_what_happened`].
    #[derive(Copy, Clone, Debug)]
    enum Commit {
        /// Refused before it was issued: the write took no effect.
        Refused,
        /// It lands, its answer is lost (the copy that decided the CAS failed, say).
        Lost,
        /// It lands, its answer is lost, and the writer can read nothing since.
        LostAndBlind,
    }

    /// A conditional DELETE and a conditional PUT whose commit goes as `how` says: the write
    /// returns what happened to the key. With its commit lost it took effect (its tombstone is
    /// gone from the index, or its entry valid there): it says `Stored`, or, unable to look,
    /// `Indeterminate`, never a plain failure. Before, it reported a failure though the key
    /// was gone: an eviction (a conditional DELETE) so failed went unrecorded, and a history
    /// of a node crashing while writers evicted showed keys vanish. The mutation
    /// `forget_unsure_commit` brings that back.
    fn conditional_write_with_commit(
        delete: bool,
        how: Commit,
        mutations: Mutations,
    ) -> (Result<CondOutcome, Error>, Option<Vec<u8>>) {
        use std::sync::atomic::Ordering::SeqCst;
        let cfg = ProtocolConfig {
            mutations,
            ..fast_cfg()
        };
        let c = InProcCluster::new(small_geometry(), cfg);
        let (_, v) = old_k(&c);
        let (mut a, fail) = c.failing_client(1); // its entries on node 1, the key's elsewhere
        let f = fail.clone();
        let at = if delete {
            HookPoint::BeforeDeleteCommit
        } else {
            HookPoint::BeforeSetValid
        };
        a.set_hook(Some(Box::new(move |p| {
            if p != at {
                return;
            }
            let lost = if delete {
                &f.index_cas_lost
            } else {
                &f.writes_lost
            };
            match how {
                Commit::Refused if delete => f.cas.store(1, SeqCst),
                Commit::Refused => f.writes.store(1, SeqCst),
                Commit::Lost => lost.store(1, SeqCst),
                Commit::LostAndBlind => {
                    lost.store(1, SeqCst);
                    f.reads.store(u32::MAX, SeqCst);
                }
            }
        })));
        let r = if delete {
            a.delete_if(b"k", Cond::Version(v))
        } else {
            a.put_if(b"k", b"new", Cond::Version(v))
        };
        fail.reads.store(0, SeqCst);
        // Past any leftover's abandonment: the reader completes what the writer left.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let fence = Arc::new(Fence::unfenced());
        fence.set_gone(1, true);
        let mut g = c.client(2);
        g.set_fence(fence);
        (r, g.get(b"k").unwrap())
    }

    #[test]
    fn a_conditional_write_whose_commit_answer_is_lost_says_what_happened() {
        let none = Mutations::default();
        for delete in [true, false] {
            let written = if delete { None } else { Some(b"new".to_vec()) };
            let old = Some(b"old".to_vec());
            let (r, now) = conditional_write_with_commit(delete, Commit::Refused, none);
            assert!(
                r.as_ref()
                    .is_err_and(|e| !matches!(e, Error::Indeterminate(_))),
                "delete {delete}: {r:?}"
            );
            assert_eq!(now, old, "delete {delete}: a refused commit took no effect");
            let (r, now) = conditional_write_with_commit(delete, Commit::Lost, none);
            assert_eq!((r, &now), (Ok(Stored), &written), "delete {delete}");
            let (r, now) = conditional_write_with_commit(delete, Commit::LostAndBlind, none);
            assert!(
                matches!(r, Err(Error::Indeterminate(_))),
                "delete {delete}: {r:?}"
            );
            assert_eq!(now, written, "delete {delete}: the lost commit landed");
            // The control: a plain failure, though the write took effect.
            let forget = Mutations {
                forget_unsure_commit: true,
                ..none
            };
            let (r, now) = conditional_write_with_commit(delete, Commit::Lost, forget);
            assert!(
                r.as_ref()
                    .is_err_and(|e| !matches!(e, Error::Indeterminate(_))),
                "delete {delete}: {r:?}"
            );
            assert_eq!(now, written, "delete {delete}");
        }
    }

    /// A conditional write whose writer dies before setting its entry valid: once its node is
    /// declared failed, whoever meets the entry puts back what it replaced.
    #[test]
    fn a_dead_conditional_writers_entry_is_put_back() {
        const EXPIRY_NS: u64 = 50_000_000;
        for optimizations in [Optimizations::default(), Optimizations::NONE] {
            let cfg = ProtocolConfig {
                expiry_ns: EXPIRY_NS,
                optimizations,
                ..fast_cfg()
            };
            let c = InProcCluster::new(small_geometry(), cfg);
            let (_, v) = old_k(&c);
            let mut out = Vec::new();
            let mut dying = c.client(1);
            dying.set_hook(Some(Box::new(|p| {
                if p == HookPoint::BeforeSetValid {
                    panic!("the conditional writer dies");
                }
            })));
            let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                dying.put_if(b"k", b"new", Cond::Version(v))
            }));
            assert!(died.is_err());
            let fence = Arc::new(Fence::unfenced());
            fence.set_gone(1, true);
            let mut g = c.client(2);
            g.set_fence(fence);
            std::thread::sleep(std::time::Duration::from_nanos(3 * EXPIRY_NS));
            assert_eq!(g.get(b"k").unwrap().as_deref(), Some(&b"old"[..]));
            // A plain write of another key meets nothing; a delete of K completes the entry.
            g.delete(b"other").unwrap();
            assert!(matches!(g.delete_if(b"k", Cond::Absent), Ok(Unmet { .. })));
            let back = g.get_versioned(b"k", &mut out).unwrap().unwrap();
            assert_eq!(out, b"old");
            assert_eq!(g.put_if(b"k", b"after", Cond::Version(back)), Ok(Stored));
            assert_eq!(g.get(b"k").unwrap().as_deref(), Some(&b"after"[..]));
            assert_eq!(
                g.stats().rolled_forward,
                0,
                "a guarded entry is never rolled forward"
            );
        }
    }
}
