//! Rule 10c of `docs/protocol.md`: the pauses after a moved copy of a node's tables becomes
//! full (rule 10a) end when every node says what it knows, in two steps, instead of after
//! their fixed times (a join settle time for reads in the old roles, twice that and an
//! operation for changes).
//!
//! 1. **Reads take the new roles** an operation's time after this monitor saw every node
//!    that may act say its fence applied the epoch the copy became full in
//!    (`Registrations::all_learnt`, rule 10b): every write made in the old roles has then
//!    reached the copy (it was written last, as receiving).
//! 2. **Changes stop waiting** an operation's time after this monitor saw every node that may
//!    act say it reads the copy in the new roles (`Registrations::all_read_new`): every read
//!    in the old roles has then ended, so no reader returns a word older than one another
//!    returned from the moved copy.
//!
//! A node says it reads in the new roles ("reads_new" in its registration) as an epoch E: in
//! the configuration of epoch E, which its fence applied, no moved copy that is full is read
//! in the old roles here ([`reads_new_epoch`]). A waiter takes that word for a copy it saw
//! full from epoch W only if W ≤ E ≤ its own epoch and the copy is still the same change in
//! its own configuration (a change is named by `CopyMove::full_since_ns`, which a later
//! change of the same copy never repeats): the copy was then full as the same change in
//! epoch E too. A node that does not say it leaves the wait at its old time.

use nessie_protocols::Fence;

use crate::{balance, Configuration, CopyMove, Registrations};

/// A copy of a node's tables: (partition, place in its chain).
pub(crate) type TablesCopy = (u16, u8);

/// A moved copy that became full, as a monitor follows it until both its pauses end here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MoveSeen {
    partition: u16,
    copy: u8,
    node: u16,
    slot: u8,
    /// Names the change (`CopyMove::full_since_ns`).
    full_since_ns: u64,
    /// The first epoch this monitor saw it full in.
    epoch: u64,
    /// This fence's name for the change (`Fence::moved_full_instance`).
    instance: u64,
    /// Reads take the new roles here (step 1 done).
    reads_settled: bool,
    /// Changes stop waiting here (step 2 done).
    writes_settled: bool,
}

impl MoveSeen {
    fn of(&self, m: &CopyMove) -> bool {
        (
            self.partition,
            self.copy,
            self.node,
            self.slot,
            self.full_since_ns,
        ) == (m.partition, m.copy, m.node, m.slot, m.full_since_ns)
    }
}

/// The moved copies of `c` that pause after becoming full: full, not placed at start, with a
/// time the configuration records.
fn settling(c: &Configuration) -> impl Iterator<Item = &CopyMove> {
    c.moves
        .iter()
        .filter(|m| !m.receiving && !m.at_start && m.full_since_ns != 0)
}

/// The epoch this node may say it reads in the new roles for ("reads_new"): `c`'s, which its
/// fence applied, if no full moved copy of `c` is read in the old roles here at monotonic
/// time `now_ns` (join settle time `join_settle_ns`); else none.
pub(crate) fn reads_new_epoch(
    c: &Configuration,
    fence: &Fence,
    now_ns: u64,
    join_settle_ns: u64,
) -> Option<u64> {
    settling(c)
        .all(|m| !fence.moved_reads_old(m.partition, m.copy, now_ns, join_settle_ns))
        .then_some(c.epoch)
}

/// Follow the moved copies of `c` that became full, and end their pauses on `fence` as every
/// node says it may (module comment). `at`: (wall ns, how long a failed node may still act,
/// monotonic ns); `op_ns`: an operation's time. Returns what it ended: (copies whose reads
/// took the new roles, copies whose changes stopped waiting).
pub(crate) fn settle_moves(
    c: &Configuration,
    registrations: &Registrations,
    fence: &Fence,
    seen: &mut Vec<MoveSeen>,
    (now_ns, failed_ns, mono_ns): (u64, u64, u64),
    op_ns: u64,
) -> (Vec<TablesCopy>, Vec<TablesCopy>) {
    seen.retain(|s| {
        settling(c).any(|m| s.of(m)) && fence.moved_full_instance(s.partition, s.copy) == s.instance
    });
    for m in settling(c) {
        let instance = fence.moved_full_instance(m.partition, m.copy);
        if instance != 0 && !seen.iter().any(|s| s.of(m)) {
            seen.push(MoveSeen {
                partition: m.partition,
                copy: m.copy,
                node: m.node,
                slot: m.slot,
                full_since_ns: m.full_since_ns,
                epoch: c.epoch,
                instance,
                reads_settled: false,
                writes_settled: false,
            });
        }
    }
    let end = mono_ns.saturating_add(op_ns);
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    for s in seen.iter_mut() {
        if !s.reads_settled && registrations.all_learnt(c, s.epoch, (now_ns, failed_ns)) {
            s.reads_settled = true;
            fence.settle_moved_reads_by(s.partition, s.copy, s.instance, end);
            reads.push((s.partition, s.copy));
            // Step 2 in a later round: nobody says "reads_new" for it before reading so.
            continue;
        }
        let said = match balance::mutation::reads_new_from_seen() {
            true => registrations.all_learnt(c, s.epoch, (now_ns, failed_ns)),
            false => registrations.all_read_new(c, s.epoch, (now_ns, failed_ns)),
        };
        if s.reads_settled && !s.writes_settled && said {
            s.writes_settled = true;
            fence.settle_moved_writes_by(s.partition, s.copy, s.instance, end);
            writes.push((s.partition, s.copy));
        }
    }
    (reads, writes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeState;
    use nessie_protocols::MovedCopy;

    const E: u64 = 7;
    const NOW: u64 = 1_000_000;
    const OP: u64 = 1_000;

    fn config(epoch: u64, full_since_ns: u64) -> Configuration {
        let all = Registrations {
            present: vec![0, 1, 2],
            incarnations: vec![(0, 10), (1, 11), (2, 12)],
            ..Registrations::default()
        };
        let mut c = Configuration::initial(0..3, &all);
        c.epoch = epoch;
        // Node 0 failed long ago (before `NOW`, by more than a failed node may act).
        c.nodes[0].state = NodeState::Failed;
        c.nodes[0].since_ns = 1;
        c.moves = vec![CopyMove {
            partition: 0,
            copy: 0,
            node: 2,
            slot: 2,
            receiving: false,
            at_start: false,
            full_since_ns,
        }];
        c
    }

    fn said(seen: &[(u16, u64)], reads_new: &[(u16, u64)]) -> Registrations {
        Registrations {
            present: vec![1, 2],
            incarnations: vec![(1, 11), (2, 12)],
            seen: seen.to_vec(),
            reads_new: reads_new.to_vec(),
            ..Registrations::default()
        }
    }

    /// A fence that saw the copy of `config` filled (receiving, then full).
    fn full_fence() -> Fence {
        let f = Fence::unfenced();
        for receiving in [true, false] {
            let at = MovedCopy {
                node: 2,
                slot: 2,
                receiving,
            };
            f.move_copy(0, 0, Some(at));
        }
        f
    }

    /// Step 1 on every node's "seen", step 2 only on every node's "reads_new" (with the
    /// mutation `READS_NEW_FROM_SEEN`, "seen" taken for it, caught); a word of another epoch
    /// range or another change is not taken.
    #[test]
    fn a_moved_copy_s_pauses_end_in_two_steps_each_on_every_node_s_word() {
        for mutated in [false, true] {
            balance::mutation::READS_NEW_FROM_SEEN.with(|m| m.set(mutated));
            let c = config(E, 500);
            let f = full_fence();
            let mut seen = Vec::new();
            let at = (NOW, 100, nessie_fabric::monotonic_ns());
            let settle =
                |r: &Registrations, seen: &mut Vec<MoveSeen>| settle_moves(&c, r, &f, seen, at, OP);
            // Node 2 has not said it applied E: nothing ends.
            let r = said(&[(1, E)], &[]);
            assert_eq!(settle(&r, &mut seen), (vec![], vec![]));
            let t = at.2 + OP;
            assert!(!f.moved_reads_settled(0, 0, t));
            // Both said: reads take the new roles an operation's time from now.
            let r = said(&[(1, E), (2, E + 1)], &[]);
            assert_eq!(settle(&r, &mut seen), (vec![(0, 0)], vec![]));
            assert!(!f.moved_reads_settled(0, 0, t - 1) && f.moved_reads_settled(0, 0, t));
            // Changes wait until both say they read in the new roles.
            let (_, writes) = settle(&r, &mut seen);
            assert_eq!(writes.is_empty(), !mutated, "mutated: {mutated}");
            if mutated {
                assert!(f.moved_writes_settled(0, 0, t), "the mutation, caught");
                continue;
            }
            let ahead = said(&[(1, E), (2, E)], &[(1, E), (2, E + 1)]);
            assert_eq!(
                settle(&ahead, &mut seen).1,
                vec![],
                "a word of a later epoch"
            );
            let r = said(&[(1, E), (2, E)], &[(1, E), (2, E)]);
            assert_eq!(settle(&r, &mut seen).1, vec![(0, 0)]);
            assert!(f.moved_writes_settled(0, 0, t));
            // The copy becomes full again (another change): followed anew.
            let c2 = config(E + 2, 900);
            f.move_copy(
                0,
                0,
                Some(MovedCopy {
                    node: 1,
                    slot: 2,
                    receiving: false,
                }),
            );
            let mut c2 = c2;
            c2.moves[0].node = 1;
            let r = said(&[(1, E + 2), (2, E + 2)], &[(1, E + 1), (2, E + 2)]);
            let (reads, writes) = settle_moves(&c2, &r, &f, &mut seen, at, OP);
            assert_eq!((reads, writes), (vec![(0, 0)], vec![]));
            assert!(!f.moved_writes_settled(0, 0, t));
            let (_, writes) = settle_moves(&c2, &r, &f, &mut seen, at, OP);
            assert_eq!(
                writes,
                vec![],
                "node 1 read in the new roles only as of epoch E + 1"
            );
        }
        balance::mutation::READS_NEW_FROM_SEEN.with(|m| m.set(false));
    }

    /// Every registered process must say it, member or not: a standby node's process reads
    /// with its own fence too.
    #[test]
    fn every_registered_process_must_say_it_reads_in_the_new_roles() {
        let c = config(E, 500);
        let at = (NOW, 100);
        let r = said(&[(1, E), (2, E)], &[(1, E), (2, E)]);
        assert!(r.all_read_new(&c, E, at));
        let standby = Registrations {
            present: vec![1, 2, 5],
            ..r.clone()
        };
        assert!(
            !standby.all_read_new(&c, E, at),
            "process 5 has not said it"
        );
        let said_too = Registrations {
            reads_new: vec![(1, E), (2, E), (5, E)],
            ..standby
        };
        assert!(said_too.all_read_new(&c, E, at));
    }

    /// A node says it reads in the new roles once no full moved copy is read in the old roles
    /// here: after step 1, or the join settle time.
    #[test]
    fn a_node_says_it_reads_in_the_new_roles_once_it_does() {
        let c = config(E, 500);
        let f = full_fence();
        let now = nessie_fabric::monotonic_ns();
        assert_eq!(reads_new_epoch(&c, &f, now, 10_000_000_000), None);
        assert_eq!(
            reads_new_epoch(&c, &f, now + 10_000_000_000, 10_000_000_000),
            Some(E)
        );
        let change = f.moved_full_instance(0, 0);
        f.settle_moved_reads_by(0, 0, change, now + 5);
        assert_eq!(reads_new_epoch(&c, &f, now + 4, 10_000_000_000), None);
        assert_eq!(reads_new_epoch(&c, &f, now + 5, 10_000_000_000), Some(E));
    }
}
