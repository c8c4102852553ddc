//! Tests of index partitions moved on their own (issue 42): one partition's copy goes to an
//! index slot of another node, is filled there while writers go on, and then takes its place
//! in the chain, while the other partitions of the same home table stay where they were; and
//! (`handover` below) a partition migrating to a new chain entry by entry.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nessie_fabric::inproc::{InProcEndpoint, InProcFabric};
use nessie_fabric::interpose::{Interposed, Interposer, Op};
use nessie_fabric::{Endpoint, FabricError, NodeId, RemoteAddr};
use nessie_store::{IndexPartitions, Ite, IteLayout, INDEX_REGION};

use super::{mirror_region, ReplicaSet, Replicated};
use crate::config::{Mutations, ProtocolConfig};
use crate::fence::{Fence, IndexCopy};

/// Index entries per node: four partitions of 64.
const ITES: u64 = 256;
/// Table sizes (index, data, page table) of the rig's nodes.
const TABLES: [u64; 3] = [ITES * 8, 64, 8];

fn layout() -> IteLayout {
    IteLayout::new(20, 4, 7).unwrap()
}

struct Rig {
    fabric: Arc<InProcFabric>,
    set: Arc<ReplicaSet>,
    fence: Arc<Fence>,
    parts: IndexPartitions,
}

/// Three nodes, two copies, two index slots each. Operations are assumed to end within the
/// expiry period (the protocol's timing assumption): 20 ms, which a loaded test machine keeps.
fn rig(mutations: Mutations) -> Rig {
    rig_with(mutations, layout())
}

/// [`rig`] with the ITE layout `ite`.
fn rig_with(mutations: Mutations, ite: IteLayout) -> Rig {
    let cfg = ProtocolConfig {
        expiry_ns: 20_000_000,
        clock_margin_ns: 0,
        mutations,
        ..ProtocolConfig::default()
    };
    let parts = IndexPartitions::new(3, ITES);
    assert_eq!((parts.per_node(), parts.ites()), (4, 64));
    let set = ReplicaSet::new(2, 3, ite, &cfg)
        .unwrap()
        .with_index_slots(parts, 2)
        .unwrap();
    let regions = vec![set.region_sizes(&TABLES); 3];
    assert_eq!(regions[0].len(), set.index_slot_region() as usize + 1);
    Rig {
        fabric: InProcFabric::new(&regions, None).unwrap(),
        set: Arc::new(set),
        fence: Arc::new(Fence::unfenced()),
        parts,
    }
}

impl Rig {
    fn ep(&self, node: NodeId) -> Replicated<InProcEndpoint> {
        Replicated::new(
            self.fabric.endpoint(node),
            self.set.clone(),
            self.fence.clone(),
        )
    }

    /// The raw word at `at`.
    fn raw(&self, at: RemoteAddr) -> u64 {
        self.fabric.endpoint(at.node).read_u64(at).unwrap()
    }

    /// Where copy 1 of home entry `e` of node 0 is at home: node 1's mirror 1.
    fn home_copy_1(&self, e: u64) -> RemoteAddr {
        RemoteAddr::new(1, mirror_region(INDEX_REGION, 1), e * 8)
    }

    /// Where home entry `e` of node 0 is in index slot `k` of `node`, for partition `q`.
    fn in_slot(&self, node: NodeId, k: u16, e: u64) -> RemoteAddr {
        let q = self.parts.of_home_offset(0, e * 8).0;
        let rel = e * 8 - self.parts.home_offset(q);
        RemoteAddr::new(
            node,
            self.set.index_slot_region(),
            k as u64 * self.set.index_slot_bytes() + rel,
        )
    }

    /// Move copy `j` of partition `q` to index slot `k` of `node`.
    fn move_to(&self, q: u16, j: u8, node: NodeId, k: u16, receiving: bool) {
        let at = IndexCopy {
            node,
            slot: k,
            receiving,
        };
        self.fence.move_index_copy(q, j, at);
    }

    /// Let the pause after a copy became full pass.
    fn settle(&self) {
        std::thread::sleep(std::time::Duration::from_nanos(
            2 * self.set.join_settle_ns(),
        ));
    }
}

/// The word a CAS from `prev` to an entry naming DTE `dte` installs.
fn word(prev: u64, dte: u64) -> u64 {
    let l = layout();
    l.successor(Ite(prev), l.encode(1, 0, dte)).0
}

/// CAS entry `e`, which only this writer changes, from `last` to `w`; returns what the CAS
/// found. A CAS whose outcome is unknown (`Indeterminate`: its decider stopped deciding while
/// it carried the word, as when a copy after it became full) is settled by reading the entry,
/// which must hold one of the two.
fn cas_own(ep: &mut Replicated<InProcEndpoint>, e: u64, last: u64, w: u64) -> u64 {
    match ep.compare_and_swap(entry(e), last, w) {
        Ok(found) => found,
        Err(FabricError::Indeterminate { .. }) => {
            let mut b = [0u8; 8];
            ep.read(entry(e), &mut b).unwrap();
            let now = u64::from_le_bytes(b);
            assert!(now == w || now == last, "entry {e} holds neither word");
            if now == w {
                last
            } else {
                cas_own(ep, e, last, w)
            }
        }
        Err(err) => panic!("CAS of entry {e}: {err}"),
    }
}

/// Home entry `e` of node 0, as the protocol addresses it.
fn entry(e: u64) -> RemoteAddr {
    RemoteAddr::new(0, INDEX_REGION, e * 8)
}

/// Partition 1 (home node 0: copies on node 0's table and node 1's mirror) migrates to
/// node 2's slot 0 and node 1's slot 1.
const TO: [IndexCopy; 2] = [
    IndexCopy {
        node: 2,
        slot: 0,
        receiving: false,
    },
    IndexCopy {
        node: 1,
        slot: 1,
        receiving: false,
    },
];

/// Entries of node 0's partitions 0 and 1 (entries 0..64 and 64..128), written before a move.
const IN_Q0: u64 = 5;
const IN_Q1: u64 = 70;

/// Partition 1's copy 1 moves to node 2's index slot 1, is filled, and becomes full: from
/// then on its CASes are decided there and the old place (node 1's mirror) no longer gets
/// them, while partition 0, on the same home table, stays on node 1. What copy 1's places
/// hold for an entry of partition 1 after a CAS made once the move is full.
fn move_and_cas(mutations: Mutations) -> (Rig, u64, u64, u64) {
    let r = rig(mutations);
    let mut ep = r.ep(0);
    let (w0, w1) = (word(0, 3), word(0, 4));
    assert_eq!(ep.compare_and_swap(entry(IN_Q0), 0, w0).unwrap(), 0);
    assert_eq!(ep.compare_and_swap(entry(IN_Q1), 0, w1).unwrap(), 0);

    r.move_to(1, 1, 2, 1, true);
    let done = r.ep(2).catch_up(&TABLES, 0).unwrap();
    assert_eq!(
        done.copies, 1,
        "only partition 1's copy is node 2's to fill"
    );
    // One pass over the partition, then the words it changed again: not the home table.
    let part_bytes = r.parts.len(1) * 8;
    assert!((part_bytes..2 * part_bytes).contains(&done.bytes_read));
    assert_eq!(
        r.raw(r.in_slot(2, 1, IN_Q1)),
        w1,
        "the catch-up filled the slot"
    );
    r.move_to(1, 1, 2, 1, false);
    r.settle();

    let w1b = word(w1, 9);
    assert_eq!(ep.compare_and_swap(entry(IN_Q1), w1, w1b).unwrap(), w1);
    let w0b = word(w0, 8);
    assert_eq!(ep.compare_and_swap(entry(IN_Q0), w0, w0b).unwrap(), w0);
    assert_eq!(r.raw(r.home_copy_1(IN_Q0)), w0b, "partition 0 did not move");
    let (slot, old) = (r.raw(r.in_slot(2, 1, IN_Q1)), r.raw(r.home_copy_1(IN_Q1)));
    (r, w1b, slot, old)
}

#[test]
fn a_partition_moved_on_its_own_decides_in_its_slot_and_nowhere_else() {
    let (r, w, slot, old) = move_and_cas(Mutations::default());
    assert_eq!(slot, w, "the moved copy got the CAS");
    assert_ne!(old, w, "the old place is out of the chain");
    // The primary (node 0) fails: reads of partition 1 go to the slot, and so do CASes.
    r.fabric.kill_node(0);
    r.fence.set_gone(0, true);
    r.settle();
    let mut ep = r.ep(1);
    let mut b = [0u8; 8];
    ep.read(entry(IN_Q1), &mut b).unwrap();
    assert_eq!(u64::from_le_bytes(b), w);
    let w2 = word(w, 12);
    assert_eq!(ep.compare_and_swap(entry(IN_Q1), w, w2).unwrap(), w);
    assert_eq!(r.raw(r.in_slot(2, 1, IN_Q1)), w2);
}

/// The mutation sends index entries to their home tables' copies as if nothing had moved:
/// the CAS lands on the old place, and the slot keeps the catch-up's word.
#[test]
fn ignoring_the_move_is_caught() {
    let m = Mutations {
        index_moves_ignored: true,
        ..Mutations::default()
    };
    let (_, w, slot, old) = move_and_cas(m);
    assert_ne!(slot, w);
    assert_eq!(old, w);
}

/// A read spanning partitions whose copies are in different places gets each partition's
/// words from its own copies.
#[test]
fn a_read_across_partitions_reads_each_from_its_copies() {
    let r = rig(Mutations::default());
    let mut ep = r.ep(1);
    let mut want = vec![0u64; ITES as usize];
    for e in (0..ITES).step_by(9) {
        let w = word(0, e + 1);
        assert_eq!(ep.compare_and_swap(entry(e), 0, w).unwrap(), 0);
        want[e as usize] = w;
    }
    // Copy 0 of partitions 1 and 2 move to node 2 and are filled; then node 0 is gone, so
    // that partitions 0 and 3 read from node 1 and 1 and 2 from node 2's slots.
    r.move_to(1, 0, 2, 0, true);
    r.move_to(2, 0, 2, 1, true);
    assert_eq!(r.ep(2).catch_up(&TABLES, 0).unwrap().copies, 2);
    r.move_to(1, 0, 2, 0, false);
    r.move_to(2, 0, 2, 1, false);
    // Scribble over node 0's own copies of partitions 1 and 2: no read may see these.
    let mut raw0 = r.fabric.endpoint(0);
    for e in 64..192 {
        raw0.write(
            RemoteAddr::new(0, INDEX_REGION, e * 8),
            &u64::MAX.to_le_bytes(),
        )
        .unwrap();
    }
    r.settle();
    let mut buf = vec![0u8; (ITES * 8) as usize];
    ep.read(entry(0), &mut buf).unwrap();
    let got: Vec<u64> = buf
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, want);
    // Node 0's own index, read locally, goes by the copies too.
    let mut own = r.ep(0);
    own.local_read(INDEX_REGION, 0, &mut buf).unwrap();
    let got: Vec<u64> = buf
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(got, want);
}

/// Moves partition 1's copy 1 to node 2's slot 0 (receiving) just before the first CAS it
/// sees: as if the CAS chose its copies before the move and decided after it.
struct MoveBeforeCas {
    fence: Arc<Fence>,
    moved: AtomicBool,
}

impl Interposer for MoveBeforeCas {
    fn before(&mut self, op: Op) -> Result<(), FabricError> {
        if matches!(op, Op::Cas(_)) && !self.moved.swap(true, Ordering::SeqCst) {
            let at = IndexCopy {
                node: 2,
                slot: 0,
                receiving: true,
            };
            self.fence.move_index_copy(1, 1, at);
        }
        Ok(())
    }
}

/// What the moved copy holds after a CAS that chose partition 1's copies just before its
/// copy 1 moved to a slot.
fn cas_across_a_move(mutations: Mutations) -> (u64, u64) {
    let r = rig(mutations);
    // Something must have moved before, so that entries resolve by partition at all.
    r.move_to(3, 1, 2, 1, false);
    let hook = MoveBeforeCas {
        fence: r.fence.clone(),
        moved: AtomicBool::new(false),
    };
    let inner = Interposed::new(r.fabric.endpoint(1), hook);
    let mut ep = Replicated::new(inner, r.set.clone(), r.fence.clone());
    let w = word(0, 7);
    assert_eq!(ep.compare_and_swap(entry(IN_Q1), 0, w).unwrap(), 0);
    (w, r.raw(r.in_slot(2, 0, IN_Q1)))
}

/// Rule 17 for index partitions: a copy placed in a slot while a CAS was under way gets the
/// CAS before it returns.
#[test]
fn a_cas_that_chose_its_copies_before_a_partition_moved_reaches_the_slot() {
    let (w, slot) = cas_across_a_move(Mutations::default());
    assert_eq!(slot, w);
    let without = Mutations {
        no_late_copy_cas: true,
        ..Mutations::default()
    };
    let (w, slot) = cas_across_a_move(without);
    assert_ne!(slot, w, "the control");
}

/// Writers keep CASing the entries of a partition while its copy is filled in a slot; once
/// the slot is full, both copies hold the same words, the last each writer installed.
#[test]
fn a_slot_filled_under_writers_ends_equal_to_the_primary() {
    for _ in 0..5 {
        let r = Arc::new(rig(Mutations::default()));
        let stop = Arc::new(AtomicBool::new(false));
        r.move_to(1, 1, 2, 0, true);
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let (r, stop) = (r.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut ep = r.ep(t as NodeId);
                    let mut last = vec![0u64; 64];
                    let mut n = 0u64;
                    while !stop.load(Ordering::SeqCst) || n < 200 {
                        // Writer t owns the entries 64 + t, 66 + t, ... of partition 1.
                        let e = 64 + t + 2 * (n % 32);
                        let i = (e - 64) as usize;
                        let w = word(last[i], n % 1000 + 1);
                        let was = cas_own(&mut ep, e, last[i], w);
                        assert_eq!(was, last[i], "entry {e} changed under its only writer");
                        last[i] = w;
                        n += 1;
                    }
                    last
                })
            })
            .collect();
        let done = r.ep(2).catch_up(&TABLES, 0).unwrap();
        assert_eq!(done.copies, 1);
        stop.store(true, Ordering::SeqCst);
        let mut last = vec![0u64; 64];
        for (t, h) in writers.into_iter().enumerate() {
            for (i, w) in h.join().unwrap().into_iter().enumerate() {
                if i % 2 == t {
                    last[i] = w;
                }
            }
        }
        for (i, w) in last.iter().enumerate() {
            let e = 64 + i as u64;
            assert_eq!(r.raw(entry(e)), *w, "primary, entry {e}");
            assert_eq!(r.raw(r.in_slot(2, 0, e)), *w, "slot, entry {e}");
        }
    }
}

/// The node filling a partition's slot dies mid-move, with writers going on: the partition
/// stays available on its other copy, the copy is placed again on another node and filled
/// there, and then serves every writer's last word alone once the first copy's node fails too.
#[test]
fn a_filler_killed_mid_move_loses_nothing() {
    let r = Arc::new(rig(Mutations::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (r, stop) = (r.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut ep = r.ep(0);
            let mut last = vec![0u64; 64];
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let i = (n % 64) as usize;
                let w = word(last[i], n % 1000 + 1);
                let was = cas_own(&mut ep, 64 + i as u64, last[i], w);
                assert_eq!(
                    was,
                    last[i],
                    "entry {} changed under its only writer",
                    64 + i
                );
                last[i] = w;
                n += 1;
            }
            (last, n)
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(5));
    r.move_to(1, 1, 2, 0, true);
    std::thread::sleep(std::time::Duration::from_millis(5));
    // Node 2 dies before its slot was full.
    r.fabric.kill_node(2);
    r.fence.set_gone(2, true);
    std::thread::sleep(std::time::Duration::from_millis(20));
    // Placed again, on node 1's slot 0, and filled there while the writer goes on, once
    // every operation that chose its copies before writes it too (as membership waits).
    r.move_to(1, 1, 1, 0, true);
    r.settle();
    let done = r.ep(1).catch_up(&TABLES, 0).unwrap();
    assert_eq!(done.copies, 1);
    r.move_to(1, 1, 1, 0, false);
    r.settle();
    stop.store(true, Ordering::SeqCst);
    let (last, n) = writer.join().unwrap();
    assert!(n > 64, "the writer kept going: {n} CASes");
    // Node 0, the primary, fails: node 1's slot alone holds every last word.
    r.fabric.kill_node(0);
    r.fence.set_gone(0, true);
    r.settle();
    let mut ep = r.ep(1);
    for (i, w) in last.iter().enumerate() {
        let e = 64 + i as u64;
        assert_eq!(r.raw(r.in_slot(1, 0, e)), *w, "slot, entry {e}");
        let mut b = [0u8; 8];
        ep.read(entry(e), &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), *w, "read, entry {e}");
    }
}

mod handover {
    //! The per-ITE handover (`replica/handover.rs`): a partition migrates to a chain of index
    //! slots entry by entry under writers, and a node that has not heard cannot commit in the
    //! old chain.

    use super::*;
    use crate::replica::HandOver;
    use std::time::Duration;

    /// A node past its lease writes no slot pending: its reservation went with its lease,
    /// and the slots may be another migration's by now. Control `writer_ignores_lease`.
    #[test]
    fn a_node_past_its_lease_writes_nothing_pending() {
        let pending = |m: Mutations| {
            let r = rig(m);
            r.fence.set_lease_until(r.fabric.endpoint(2).mono_ns());
            let written = r.ep(2).write_pending(1, &TO);
            let pending = r.set.ite.pending().0;
            let slots = (0..TO.len()).filter(|&j| r.raw(target(&r, j, 64)) == pending);
            (written, slots.count())
        };
        let (written, slots) = pending(Mutations::default());
        assert!(
            matches!(written, Err(FabricError::Fenced { node: 2 })),
            "{written:?}"
        );
        assert_eq!(slots, 0, "no slot written");
        let (written, slots) = pending(Mutations {
            writer_ignores_lease: true,
            ..Mutations::default()
        });
        assert!(written.is_ok(), "the control: {written:?}");
        assert_eq!(slots, TO.len(), "the control: every slot written");
    }

    fn start(r: &Rig, fence: &Fence) {
        r.ep(2).write_pending(1, &TO).unwrap();
        fence.start_migration(1, &TO);
    }

    /// Where copy `j` of the target chain holds home entry `e` of node 0.
    fn target(r: &Rig, j: usize, e: u64) -> RemoteAddr {
        r.in_slot(TO[j].node, TO[j].slot, e)
    }

    /// Writers CAS their own entries of partition 1 on and on (each checks every CAS found
    /// what it installed last: an entry changed under its only writer is a lost write) while
    /// the partition migrates, the puller on node 2 handing over what clients have not. Kills
    /// `kill` (if any) once the puller is half way. Returns the rig, every entry's last word
    /// and what the puller did.
    fn migrate_under_writers(kill: Option<NodeId>) -> (Arc<Rig>, Vec<u64>, HandOver) {
        let r = Arc::new(rig(Mutations::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let writer_nodes: Vec<NodeId> = [0, 1, 2]
            .into_iter()
            .filter(|n| Some(*n) != kill && *n != 2)
            .collect();
        let writers: Vec<_> = writer_nodes
            .iter()
            .enumerate()
            .map(|(t, &node)| {
                let (r, stop) = (r.clone(), stop.clone());
                let k = writer_nodes.len() as u64;
                std::thread::spawn(move || {
                    let mut ep = r.ep(node);
                    let mut last = vec![0u64; 64];
                    let mut n = 0u64;
                    while !stop.load(Ordering::SeqCst) || n < 100 {
                        let i = (t as u64 + k * (n % (64 / k))) as usize;
                        let w = word(last[i], n % 1000 + 1);
                        let was = cas_own(&mut ep, 64 + i as u64, last[i], w);
                        // The handover is invisible: the word comes over unchanged.
                        assert_eq!(was, last[i], "entry {} changed under its writer", 64 + i);
                        last[i] = w;
                        n += 1;
                    }
                    (t, last)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(5));
        start(&r, &r.fence);
        let mut puller = r.ep(2);
        if let Some(k) = kill {
            // Half the entries, then the kill, then the rest.
            for e in 64..96 {
                let mut b = [0u8; 8];
                puller.read(entry(e), &mut b).unwrap();
            }
            r.fabric.kill_node(k);
            r.fence.set_gone(k, true);
        }
        let done = puller.hand_over_partition(1, 0).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        stop.store(true, Ordering::SeqCst);
        let mut last = vec![0u64; 64];
        let k = writer_nodes.len();
        for h in writers {
            let (t, l) = h.join().unwrap();
            for (i, w) in l.into_iter().enumerate() {
                if i % k == t {
                    last[i] = w;
                }
            }
        }
        (r, last, done)
    }

    fn check_migrated(r: &Rig, last: &[u64], dead: Option<NodeId>) {
        let l = layout();
        r.fence.finish_migration(1, &TO);
        assert!(!r.fence.migrating(1));
        for (i, last) in last.iter().enumerate() {
            let e = 64 + i as u64;
            // The writer's last word (a handover brings it over unchanged).
            let w = last;
            for (j, c) in TO.iter().enumerate() {
                if Some(c.node) != dead {
                    assert_eq!(r.raw(target(r, j, e)), *w, "target copy {j}, entry {e}");
                }
            }
            if dead != Some(0) {
                let old = Ite(r.raw(entry(e)));
                assert!(
                    l.is_fence_marked(old),
                    "entry {e} not fenced in the old chain"
                );
            }
            for n in [1, 2] {
                let mut b = [0u8; 8];
                r.ep(n).read(entry(e), &mut b).unwrap();
                assert_eq!(
                    u64::from_le_bytes(b),
                    *w,
                    "read through node {n}, entry {e}"
                );
            }
        }
        // The other partitions of node 0's table stayed where they were.
        if dead != Some(0) {
            assert!(!l.is_fence_marked(Ite(r.raw(entry(IN_Q0)))));
        }
    }

    #[test]
    fn a_partition_migrates_entry_by_entry_under_writers_and_loses_nothing() {
        for _ in 0..3 {
            let (r, last, done) = migrate_under_writers(None);
            assert_eq!(done.entries, 64);
            check_migrated(&r, &last, None);
            // The new chain decides alone: a CAS after the end lands in both slots.
            let mut ep = r.ep(1);
            let mut b = [0u8; 8];
            ep.read(entry(67), &mut b).unwrap();
            let now = u64::from_le_bytes(b);
            let w = word(now, 999);
            assert_eq!(ep.compare_and_swap(entry(67), now, w).unwrap(), now);
            assert_eq!(r.raw(target(&r, 0, 67)), w);
            assert_eq!(r.raw(target(&r, 1, 67)), w);
        }
    }

    /// The source's primary (node 0) dies half way: the old chain's other copy fences, the
    /// migration ends, nothing is lost.
    #[test]
    fn the_source_s_primary_killed_mid_migration_loses_nothing() {
        let (r, last, _) = migrate_under_writers(Some(0));
        check_migrated(&r, &last, Some(0));
    }

    /// The handover is invisible to a CAS: one expecting the word read before the entry was
    /// handed over succeeds after it (the protocol would take a failure for a concurrent write
    /// and, for a DELETE, linearize itself before it and return without deleting: the CI run
    /// that found it read a key back after an acknowledged DELETE).
    #[test]
    fn a_cas_from_a_read_before_the_handover_succeeds_after_it() {
        let r = rig(Mutations::default());
        let mut ep = r.ep(1);
        let w0 = word(0, 5);
        assert_eq!(ep.compare_and_swap(entry(IN_Q1), 0, w0).unwrap(), 0);
        let mut b = [0u8; 8];
        ep.read(entry(IN_Q1), &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), w0);
        start(&r, &r.fence);
        // Another node hands the entry over.
        r.ep(2).hand_over(1, entry(IN_Q1)).unwrap();
        assert!(layout().is_fence_marked(Ite(r.raw(entry(IN_Q1)))));
        let w1 = word(w0, 6);
        assert_eq!(ep.compare_and_swap(entry(IN_Q1), w0, w1).unwrap(), w0);
        assert_eq!(r.raw(target(&r, 0, IN_Q1)), w1);
        assert_eq!(r.raw(target(&r, 1, IN_Q1)), w1);
    }

    /// A node whose view does not name the move reads entry `e` before it is handed over,
    /// and CASes it after. Returns the word it read, what its CAS found, the word it
    /// installed, what a node that knows reads afterwards, and what the old chain's primary
    /// holds right after the CAS.
    fn stale_cas(mutations: Mutations) -> (u64, u64, u64, u64, u64) {
        let r = rig(mutations);
        let e = IN_Q1;
        let w0 = word(0, 5);
        assert_eq!(r.ep(1).compare_and_swap(entry(e), 0, w0).unwrap(), 0);
        // Node 0 keeps an older view: its own fence, which learns of the move 20 ms late.
        let stale_fence = Arc::new(Fence::unfenced());
        let mut stale = Replicated::new(r.fabric.endpoint(0), r.set.clone(), stale_fence.clone());
        let mut b = [0u8; 8];
        stale.read(entry(e), &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), w0);
        start(&r, &r.fence);
        // A node that knows meets the entry and hands it over.
        r.ep(1).read(entry(e), &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), w0, "the word comes over unchanged");
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            stale_fence.start_migration(1, &TO);
        });
        let w1 = word(w0, 6);
        let found = stale.compare_and_swap(entry(e), w0, w1).unwrap();
        let old = r.raw(entry(e));
        late.join().unwrap();
        r.ep(1).read(entry(e), &mut b).unwrap();
        (w0, found, w1, u64::from_le_bytes(b), old)
    }

    /// The stale node's CAS meets the fence in the old chain, waits until its view names the
    /// new chain, and is made there, where the entry has not changed: it wins, and its word is
    /// what every node reads.
    #[test]
    fn a_node_that_has_not_heard_of_the_move_cannot_commit_in_the_old_chain() {
        let l = layout();
        let (w0, found, w1, now, old) = stale_cas(Mutations::default());
        assert!(l.is_fence_marked(Ite(old)), "the old chain holds the fence");
        assert_eq!(found, w0, "the CAS won, in the new chain");
        assert_eq!(now, w1, "and its word is the entry's");
        // The mutation hands over without fencing: the stale CAS wins in the old chain, and
        // the acknowledged word is nowhere a node that knows reads.
        let m = Mutations {
            handover_without_fence: true,
            ..Mutations::default()
        };
        let (w0, found, w1, now, old) = stale_cas(m);
        assert_eq!((found, old), (w0, w1), "the stale CAS won in the old chain");
        assert_ne!(now, w1, "and its word is lost");
    }
}

/// A node restarted while one of its partitions' copy 0 lives in a slot elsewhere fills its
/// mirror of that partition from the partition's own chain (the slot), not from the home
/// table that stopped being written when the copy moved: otherwise, full again as the
/// partition's decider, it would hold words older than acknowledged CASes.
#[test]
fn a_restarted_copy_is_filled_from_each_partition_s_own_chain() {
    let r = rig(Mutations::default());
    let mut ep = r.ep(0);
    let w = word(0, 3);
    assert_eq!(ep.compare_and_swap(entry(IN_Q1), 0, w).unwrap(), 0);
    // Copy 0 of partition 1 moves to node 2's slot 0, is filled, and is full.
    r.move_to(1, 0, 2, 0, true);
    r.settle();
    r.ep(2).catch_up(&TABLES, 0).unwrap();
    r.move_to(1, 0, 2, 0, false);
    r.settle();
    // A CAS after the move: in the slot and in node 1's mirror (copy 1), not at home.
    let w2 = word(w, 4);
    assert_eq!(ep.compare_and_swap(entry(IN_Q1), w, w2).unwrap(), w);
    assert_eq!(r.raw(r.in_slot(2, 0, IN_Q1)), w2);
    assert_eq!(r.raw(entry(IN_Q1)), w, "the home table is out of the chain");
    // Node 1 restarts with its memory scribbled over, and catches up.
    let mut raw1 = r.fabric.endpoint(1);
    let junk = vec![0xa5u8; (ITES * 8) as usize];
    raw1.write(r.home_copy_1(0), &junk).unwrap();
    r.fence.set_role(1, crate::fence::NodeRole::Receiving);
    r.settle();
    r.ep(1).catch_up(&TABLES, 0).unwrap();
    assert_eq!(r.raw(r.home_copy_1(IN_Q1)), w2, "filled from the slot");
    assert_eq!(
        r.raw(r.home_copy_1(IN_Q0)),
        0,
        "partition 0 from node 0's table"
    );
}

/// Entries whose sequence numbers sit where the pending word (sequence 0) could be misordered:
/// just before the wrap (the handed-over word's sequence is 0) and around half the sequence.
/// Each migrates and lands on both new copies, readable and writable.
#[test]
fn entries_near_the_sequence_wrap_are_handed_over() {
    // Eight sequence bits.
    let ite = IteLayout::new(20, 4, 29).unwrap();
    assert_eq!(ite.seq_bits, 8);
    let r = rig_with(Mutations::default(), ite);
    let to = TO;
    let seq_word = |seq: u64, dte: u64| Ite(ite.encode(1, 0, dte).0 | seq << (63 - 8)).0;
    // Entries 64.. of node 0 (partition 1): written straight into both copies.
    let seqs = [125u64, 126, 127, 128, 253, 254, 255];
    let mut raw0 = r.fabric.endpoint(0);
    let mut raw1 = r.fabric.endpoint(1);
    for (i, &q) in seqs.iter().enumerate() {
        let e = 64 + i as u64;
        let w = seq_word(q, e).to_le_bytes();
        raw0.write(entry(e), &w).unwrap();
        raw1.write(r.home_copy_1(e), &w).unwrap();
    }
    r.ep(2).write_pending(1, &to).unwrap();
    r.fence.start_migration(1, &to);
    let mut ep = r.ep(1);
    for (i, &q) in seqs.iter().enumerate() {
        let e = 64 + i as u64;
        let mut b = [0u8; 8];
        ep.read(entry(e), &mut b).unwrap();
        let got = u64::from_le_bytes(b);
        let want = seq_word(q, e);
        assert_eq!(got, want, "entry at sequence {q}");
        for c in &to {
            assert_eq!(
                r.raw(r.in_slot(c.node, c.slot, e)),
                want,
                "copy on {}, sequence {q}",
                c.node
            );
        }
        let next = ite.successor(Ite(got), ite.encode(1, 0, e + 100)).0;
        assert_eq!(ep.compare_and_swap(entry(e), got, next).unwrap(), got);
        for c in &to {
            assert_eq!(r.raw(r.in_slot(c.node, c.slot, e)), next);
        }
    }
}
