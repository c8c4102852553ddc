//! The interleavings review 39 forced on replication, each driven deterministically with an
//! interposer in front of one endpoint, each with the mutation that brings the old behaviour
//! back as its control. Numbered as in `docs/protocol.md` ("Found by review and fixed").

use std::sync::Arc;
use std::time::Duration;

use nessie_fabric::inproc::{InProcEndpoint, InProcFabric};
use nessie_fabric::interpose::{Interposed, Interposer, Op};
use nessie_fabric::{Endpoint, FabricError, NodeId, RegionId, RemoteAddr};
use nessie_store::{Ite, IteLayout, DATA_REGION, INDEX_REGION, PAGE_REGION};

use super::{mirror_region, ReplicaSet, Replicated};
use crate::config::{Mutations, ProtocolConfig};
use crate::fence::{Fence, MovedCopy, NodeRole};

/// Index, data and page table bytes of every node.
const TABLES: [u64; 3] = [64, 64, 8];
/// The expiry period of the rigs: the settle time, and an operation's length.
const EXPIRY: Duration = Duration::from_millis(5);
/// Partition 0's first index entry.
const ENTRY: RemoteAddr = RemoteAddr::new(0, INDEX_REGION, 0);

fn layout() -> IteLayout {
    IteLayout::new(20, 4, 7).unwrap()
}

struct Rig {
    fabric: Arc<InProcFabric>,
    set: Arc<ReplicaSet>,
    fence: Arc<Fence>,
    ite: IteLayout,
}

/// Three nodes, `replicas` copies of each partition, `spare` spare slots each.
fn rig(replicas: u8, spare: u8, ite: IteLayout, mutations: Mutations) -> Rig {
    rig_expiring(replicas, spare, ite, mutations, EXPIRY)
}

/// [`rig`] with another expiry period.
fn rig_expiring(
    replicas: u8,
    spare: u8,
    ite: IteLayout,
    mutations: Mutations,
    expiry: Duration,
) -> Rig {
    rig_of(3, replicas, spare, ite, mutations, expiry)
}

/// [`rig_expiring`] with `nodes` nodes.
fn rig_of(
    nodes: u16,
    replicas: u8,
    spare: u8,
    ite: IteLayout,
    mutations: Mutations,
    expiry: Duration,
) -> Rig {
    let cfg = ProtocolConfig {
        expiry_ns: expiry.as_nanos() as u64,
        clock_margin_ns: 0,
        mutations,
        ..ProtocolConfig::default()
    };
    let set = ReplicaSet::new(replicas, nodes, ite, &cfg)
        .unwrap()
        .with_spare_copies(spare)
        .unwrap()
        .with_unreachable_wait(20_000_000);
    let regions = vec![set.region_sizes(&TABLES); nodes as usize];
    Rig {
        fabric: InProcFabric::new(&regions, None).unwrap(),
        set: Arc::new(set),
        fence: Arc::new(Fence::unfenced()),
        ite,
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

    fn hooked<I: Interposer>(
        &self,
        node: NodeId,
        hook: I,
    ) -> Replicated<Interposed<InProcEndpoint, I>> {
        let inner = Interposed::new(self.fabric.endpoint(node), hook);
        Replicated::new(inner, self.set.clone(), self.fence.clone())
    }

    /// The word at `offset` of `region` in mirror slot `slot` of `node`, read raw.
    fn word(&self, node: NodeId, slot: u8, region: RegionId, offset: u64) -> u64 {
        let at = RemoteAddr::new(node, mirror_region(region, slot), offset);
        self.fabric.endpoint(node).read_u64(at).unwrap()
    }

    /// The index word a CAS from `prev` to an entry naming DTE `dte` installs.
    fn next(&self, prev: u64, dte: u64) -> u64 {
        self.ite.successor(Ite(prev), self.ite.encode(1, 0, dte)).0
    }

    /// Change partition 0's first entry through `ep` (helping as it goes) until the change
    /// takes place: an acknowledged write.
    fn change<E: Endpoint>(&self, ep: &mut E, dte: u64) -> u64 {
        for _ in 0..10 {
            let seen = ep.read_u64(ENTRY).unwrap();
            let w = self.next(seen, dte);
            if ep.compare_and_swap(ENTRY, seen, w).unwrap() == seen {
                return w;
            }
        }
        panic!("partition 0's first entry is wedged");
    }
}

/// Runs `run` once, in front of the first operation `when` picks.
struct Trigger {
    when: Box<dyn FnMut(Op) -> bool + Send>,
    run: Option<Box<dyn FnOnce() + Send>>,
}

impl Trigger {
    fn new(
        when: impl FnMut(Op) -> bool + Send + 'static,
        run: impl FnOnce() + Send + 'static,
    ) -> Self {
        Self {
            when: Box::new(when),
            run: Some(Box::new(run)),
        }
    }
}

impl Interposer for Trigger {
    fn before(&mut self, op: Op) -> Result<(), FabricError> {
        if self.run.is_some() && (self.when)(op) {
            (self.run.take().unwrap())();
        }
        Ok(())
    }
}

/// The first operation after the first CAS that reads from `node`.
fn first_read_after_a_cas(node: NodeId) -> impl FnMut(Op) -> bool + Send {
    let mut cas_seen = false;
    move |op| match op {
        Op::Cas(_) => {
            cas_seen = true;
            false
        }
        Op::Read(a) => cas_seen && a.node == node,
        _ => false,
    }
}

/// A hook that holds an operation: in front of the first one `when` picks, it says so
/// (`held`) and waits to be let go (`go`).
struct Hold {
    trigger: Trigger,
    held: std::sync::mpsc::Receiver<()>,
    go: std::sync::mpsc::Sender<()>,
}

fn hold(when: impl FnMut(Op) -> bool + Send + 'static) -> Hold {
    let (held_tx, held) = std::sync::mpsc::channel();
    let (go, wait_go) = std::sync::mpsc::channel::<()>();
    let trigger = Trigger::new(when, move || {
        held_tx.send(()).unwrap();
        wait_go.recv().unwrap();
    });
    Hold { trigger, held, go }
}

/// The first plain write to `node`.
fn a_write_to(node: NodeId) -> impl FnMut(Op) -> bool + Send {
    move |op| matches!(op, Op::Write(a) if a.node == node)
}

fn settle() {
    std::thread::sleep(4 * EXPIRY);
}

/// 1. A helper that lost at the decider (to w1, which its writer never carried on) is held
///    just before it reads the primary, while others help w1 along and make half a sequence
///    and one more acknowledged changes. What the primary and the decider then hold, and
///    whether a CAS can still take place.
fn a_helper_held_across_a_wrap(mutations: Mutations) -> (u64, u64, bool) {
    // Eight sequence bits: half a sequence is 128 changes.
    let ite = IteLayout::new(20, 4, 29).unwrap();
    assert_eq!(ite.seq_bits, 8);
    let r = Arc::new(rig(2, 0, ite, mutations));
    let decider = RemoteAddr::new(1, mirror_region(INDEX_REGION, 1), 0);
    let w1 = r.next(0, 1);
    assert_eq!(
        r.fabric
            .endpoint(1)
            .compare_and_swap(decider, 0, w1)
            .unwrap(),
        0
    );
    let changes = (1u64 << (ite.seq_bits - 1)) + 1;
    let others = r.clone();
    let hook = Trigger::new(first_read_after_a_cas(0), move || {
        let mut ep = others.ep(2);
        for k in 0..changes {
            others.change(&mut ep, 2 + k % 64);
        }
    });
    let mut helper = r.hooked(2, hook);
    let lost = helper.compare_and_swap(ENTRY, 0, r.next(0, 99)).unwrap();
    assert_eq!(lost, w1, "the helper lost to w1");
    let (primary, at_decider) = (r.word(0, 0, INDEX_REGION, 0), r.word(1, 1, INDEX_REGION, 0));
    let mut ep = r.ep(0);
    let seen = ep.read_u64(ENTRY).unwrap();
    let free = (0..3).any(|_| {
        let seen2 = ep.read_u64(ENTRY).unwrap();
        ep.compare_and_swap(ENTRY, seen2, r.next(seen2, 7)).unwrap() == seen2
    });
    assert_eq!(seen, primary);
    (primary, at_decider, free)
}

#[test]
fn r1_a_helper_held_across_a_sequence_wrap_never_moves_the_primary_back() {
    let (primary, decider, free) = a_helper_held_across_a_wrap(Mutations::default());
    assert_eq!(primary, decider, "the primary is level with the decider");
    assert!(free, "the entry takes changes");
    let old = Mutations {
        advance_by_sequence: true,
        ..Mutations::default()
    };
    let (primary, decider, free) = a_helper_held_across_a_wrap(old);
    assert_ne!(primary, decider, "the control: the primary was moved back");
    assert!(!free, "the control: the entry is wedged");
}

/// 3. A CAS that chose its copies (partition 0, whose copy 0's node failed long ago: only the
///    copy on node 1) before copy 0 moved to node 2's spare slot and the copier there ran to
///    the end. Returns the word the CAS installed and what the moved copy holds.
fn a_cas_across_a_move(mutations: Mutations) -> (u64, u64) {
    let r = rig(2, 1, layout(), mutations);
    r.fence.set_gone(0, true);
    settle();
    let fence = r.fence.clone();
    let mut copier = r.ep(2);
    let hook = Trigger::new(
        |op| matches!(op, Op::Cas(_)),
        move || {
            let to = MovedCopy {
                node: 2,
                slot: 2,
                receiving: true,
            };
            fence.move_copy(0, 0, Some(to));
            let filled = copier.catch_up(&TABLES, 0).unwrap();
            assert_eq!(filled.copies, 1);
        },
    );
    let mut writer = r.hooked(1, hook);
    let word = r.next(0, 5);
    assert_eq!(writer.compare_and_swap(ENTRY, 0, word).unwrap(), 0);
    (word, r.word(2, 2, INDEX_REGION, 0))
}

#[test]
fn r3_a_cas_reaches_a_copy_placed_while_it_was_under_way() {
    let (word, moved) = a_cas_across_a_move(Mutations::default());
    assert_eq!(moved, word);
    let old = Mutations {
        no_late_copy_cas: true,
        ..Mutations::default()
    };
    let (word, moved) = a_cas_across_a_move(old);
    assert_ne!(moved, word, "the control: the moved copy lacks the CAS");
}

/// Refuses every operation on one node, as a network partition between two nodes that
/// membership does not see.
struct CutOff(NodeId);

impl Interposer for CutOff {
    fn before(&mut self, op: Op) -> Result<(), FabricError> {
        if op.addr().node == self.0 {
            return Err(FabricError::Unreachable {
                node: self.0,
                reason: "cut off".into(),
            });
        }
        Ok(())
    }
}

/// 4. A CAS whose writer cannot reach the receiving copy (node 0 rejoining). Returns whether
///    the CAS was acknowledged, and whether the receiving copy holds its word.
fn a_cas_that_cannot_reach_the_receiving_copy(mutations: Mutations) -> (bool, bool) {
    let r = rig(2, 0, layout(), mutations);
    r.fence.set_role(0, NodeRole::Receiving);
    let mut writer = r.hooked(2, CutOff(0));
    let word = r.next(0, 3);
    let acked = writer.compare_and_swap(ENTRY, 0, word) == Ok(0);
    (acked, r.word(0, 0, INDEX_REGION, 0) == word)
}

#[test]
fn r4_a_cas_is_not_acknowledged_before_it_reaches_the_receiving_copy() {
    assert_eq!(
        a_cas_that_cannot_reach_the_receiving_copy(Mutations::default()),
        (false, false),
        "the writer waits for the copy, then fails (its write is indeterminate)"
    );
    let old = Mutations {
        receiving_cas_best_effort: true,
        ..Mutations::default()
    };
    assert_eq!(
        a_cas_that_cannot_reach_the_receiving_copy(old),
        (true, false),
        "the control: acknowledged, and the copy misses it"
    );
}

/// 6. R = 3, node 0 rejoining. A writer decides w at the decider (node 2) and dies before it
///    carries w on; node 0's copier runs; node 2 crashes and copy 1 decides; node 0 comes up.
///    Returns what node 0 then serves, what copy 1 holds, and whether the entry takes changes.
fn a_decider_dies_after_the_copier(mutations: Mutations) -> (u64, u64, bool) {
    let r = rig(3, 0, layout(), mutations);
    r.fence.set_role(0, NodeRole::Receiving);
    let w = r.next(0, 4);
    let at_decider = RemoteAddr::new(2, mirror_region(INDEX_REGION, 2), 0);
    assert_eq!(
        r.fabric
            .endpoint(2)
            .compare_and_swap(at_decider, 0, w)
            .unwrap(),
        0
    );
    r.ep(0).catch_up(&TABLES, 0).unwrap();
    r.fabric.kill_node(2);
    r.fence.set_gone(2, true);
    settle();
    r.fence.set_role(0, NodeRole::Full);
    let mut ep = r.ep(1);
    let served = ep.read_u64(ENTRY).unwrap();
    let copy1 = r.word(1, 1, INDEX_REGION, 0);
    let free = (0..3).any(|_| {
        let seen = ep.read_u64(ENTRY).unwrap();
        ep.compare_and_swap(ENTRY, seen, r.next(seen, 8)).unwrap() == seen
    });
    (served, copy1, free)
}

#[test]
fn r6_catching_up_never_takes_a_word_that_dies_with_its_decider() {
    let (served, copy1, free) = a_decider_dies_after_the_copier(Mutations::default());
    assert_eq!(served, copy1, "the rejoined primary serves what survived");
    assert_eq!(
        served, 0,
        "w was never acknowledged and died with its decider"
    );
    assert!(free);
    let old = Mutations {
        catch_up_from_decider: true,
        ..Mutations::default()
    };
    let (served, copy1, free) = a_decider_dies_after_the_copier(old);
    assert_ne!(
        served, copy1,
        "the control: the rejoined primary serves the dead word"
    );
    assert!(!free, "the control: the entry is wedged");
}

/// 7. A plain write reaches copy 1 (node 1); node 1 crashes, restarts and fills its copies
///    from node 0 before the write reaches node 0. What node 1's copy holds afterwards.
fn a_write_across_a_restart(mutations: Mutations) -> [u8; 8] {
    let r = Arc::new(rig(2, 0, layout(), mutations));
    let at = RemoteAddr::new(0, DATA_REGION, 16);
    let restart = r.clone();
    let mut writes = 0;
    let second_write = move |op| {
        writes += matches!(op, Op::Write(_)) as u32;
        writes == 2
    };
    let hook = Trigger::new(second_write, move || {
        let r = restart;
        r.fabric.kill_node(1);
        r.fence.set_gone(1, true);
        r.fabric.revive_node(1);
        r.fence.set_incarnation(1, 42);
        r.fence.set_role(1, NodeRole::Receiving);
        let filled = r.ep(1).catch_up(&TABLES, 0).unwrap();
        assert!(filled.copies >= 1);
        r.fence.set_role(1, NodeRole::Full);
    });
    let mut writer = r.hooked(2, hook);
    writer.write(at, &[7u8; 8]).unwrap();
    r.word(1, 1, DATA_REGION, 16).to_le_bytes()
}

#[test]
fn r7_a_copy_restarted_in_place_is_written_again() {
    assert_eq!(a_write_across_a_restart(Mutations::default()), [7u8; 8]);
    let old = Mutations {
        late_copy_by_place: true,
        ..Mutations::default()
    };
    assert_eq!(
        a_write_across_a_restart(old),
        [0u8; 8],
        "the control: the restarted copy lacks the write"
    );
}

/// 2. Node 1, partition 1's primary, is declared failed while its memory still answers, and
///    node 0 overwrites w1 with w2 once the failure settled. Node 2 has not heard: its view
///    went stale, and its read is refused. Then its wall clock steps back 10 s. What the same
///    read gives then.
fn a_read_after_a_backward_wall_clock_step(mutations: Mutations) -> Result<u64, FabricError> {
    let on_wall = mutations.fence_on_wall_clock;
    let r = rig(2, 0, layout(), mutations);
    let knows = Arc::new(Fence::unfenced());
    let entry = RemoteAddr::new(1, INDEX_REGION, 0);
    let mut writer = Replicated::new(r.fabric.endpoint(0), r.set.clone(), knows.clone());
    let w1 = r.next(0, 1);
    assert_eq!(writer.compare_and_swap(entry, 0, w1).unwrap(), 0);
    knows.set_gone(1, true);
    settle();
    let w2 = r.next(w1, 2);
    assert_eq!(writer.compare_and_swap(entry, w1, w2).unwrap(), w1);
    assert_eq!(
        r.word(1, 0, INDEX_REGION, 0),
        w1,
        "the failed copy keeps w1"
    );
    // Node 2's view, read before the failure, went stale a read settle time ago.
    let stale_since = match on_wall {
        true => nessie_fabric::wall_clock_ns(),
        false => nessie_fabric::monotonic_ns(),
    };
    r.fence
        .set_view_until(stale_since - r.set.read_settle_ns() - 1);
    let mut reader = r.ep(2);
    assert!(matches!(
        reader.read_u64(entry),
        Err(FabricError::Fenced { node: 2 })
    ));
    r.fabric.step_wall_clock(-10_000_000_000);
    reader.read_u64(entry)
}

#[test]
fn r2_a_backward_wall_clock_step_does_not_make_a_stale_view_fresh() {
    assert!(matches!(
        a_read_after_a_backward_wall_clock_step(Mutations::default()),
        Err(FabricError::Fenced { node: 2 })
    ));
    let old = Mutations {
        fence_on_wall_clock: true,
        ..Mutations::default()
    };
    let r = rig(2, 0, layout(), Mutations::default());
    let w1 = r.next(0, 1);
    assert_eq!(
        a_read_after_a_backward_wall_clock_step(old),
        Ok(w1),
        "the control: the overwritten w1, served from the failed copy"
    );
}

/// 5. R = 2, node 0 came back and is up again. A writer whose fence has not heard yet decides
///    w2 at copy 1 (the decider while node 0 receives) and is held before it carries w2 on; a
///    reader that has not heard either reads w2 at copy 1. Then a node whose fence never saw
///    node 0 change role (a process started meanwhile) reads partition 0: at copy 0, its
///    primary now. `configured`: its fence was told what the configuration says
///    (`Fence::set_full_since`), as `membership::apply` does. What that read returns.
fn a_read_by_a_fence_that_missed_the_rejoin(configured: bool) -> (u64, u64) {
    let expiry = Duration::from_millis(100);
    let cfg = ProtocolConfig {
        expiry_ns: expiry.as_nanos() as u64,
        clock_margin_ns: 0,
        ..ProtocolConfig::default()
    };
    let set = Arc::new(ReplicaSet::new(2, 3, layout(), &cfg).unwrap());
    let fabric = InProcFabric::new(&vec![set.region_sizes(&TABLES); 3], None).unwrap();
    let ite = layout();
    let w1 = ite.successor(Ite(0), ite.encode(1, 0, 1)).0;
    let w2 = ite.successor(Ite(w1), ite.encode(1, 0, 2)).0;
    for (node, slot) in [(0, 0), (1, 1)] {
        let at = RemoteAddr::new(node, mirror_region(INDEX_REGION, slot), 0);
        fabric.endpoint(node).write(at, &w1.to_le_bytes()).unwrap();
    }
    let old = Arc::new(Fence::unfenced());
    old.set_role(0, NodeRole::Receiving);
    let Hold {
        trigger,
        held: wait_held,
        go,
    } = hold(first_read_after_a_cas(0));
    let inner = Interposed::new(fabric.endpoint(1), trigger);
    let mut writer = Replicated::new(inner, set.clone(), old.clone());
    let mut old_reader = Replicated::new(fabric.endpoint(1), set.clone(), old);
    let fresh = Arc::new(Fence::unfenced());
    if configured {
        fresh.set_full_since(0, 0);
    }
    let mut new_reader = Replicated::new(fabric.endpoint(2), set.clone(), fresh);
    std::thread::scope(|s| {
        let w = s.spawn(move || writer.compare_and_swap(ENTRY, w1, w2).unwrap());
        wait_held.recv().unwrap();
        let first = old_reader.read_u64(ENTRY).unwrap();
        let release = s.spawn(move || {
            std::thread::sleep(expiry / 2);
            go.send(()).unwrap();
        });
        let then = new_reader.read_u64(ENTRY).unwrap();
        release.join().unwrap();
        assert_eq!(w.join().unwrap(), w1);
        (first, then)
    })
}

#[test]
fn r5_a_node_whose_fence_missed_a_rejoin_still_waits_out_the_join_pause() {
    let w = |prev, dte| layout().successor(Ite(prev), layout().encode(1, 0, dte)).0;
    let (w1, w2) = (w(0, 1), w(w(0, 1), 2));
    assert_eq!(a_read_by_a_fence_that_missed_the_rejoin(true), (w2, w2));
    assert_eq!(
        a_read_by_a_fence_that_missed_the_rejoin(false),
        (w2, w1),
        "the control: new, then old"
    );
}

/// A node that has never been up (standby, joining) fills its own tables without reading their
/// data region when no page of them is claimed: every copy of them is all zeros (SB5), its own
/// too. Read, it would fault in every page of the region and of the copy read from. A claimed
/// page word (SB5 broken) makes it read the data region after all.
#[test]
fn a_never_up_node_s_own_data_region_is_not_read() {
    let r = rig(2, 0, layout(), Mutations::default());
    // Node 1 joins for the first time: never up, receiving; its own tables (copy 0 of
    // partition 1) are its only copy held here... and copy 1 of partition 0.
    r.fence.set_never_up(1, true);
    r.fence.set_role(1, NodeRole::Receiving);
    let word = RemoteAddr::new(0, DATA_REGION, 8);
    r.fabric
        .endpoint(0)
        .write(word, &7u64.to_le_bytes())
        .unwrap();
    let done = r.ep(1).catch_up(&TABLES, 0).unwrap();
    assert_eq!(done.copies, 2, "its own tables and partition 0's copy 1");
    // Partition 0's copy was read whole (its page, data and index regions, and the one word
    // that differed again in a second pass); of its own, all but the data region.
    let one_copy: u64 = TABLES.iter().sum();
    let data = TABLES[DATA_REGION as usize];
    assert_eq!(done.bytes_read, one_copy + 8 + (one_copy - data));
    assert_eq!(
        r.word(1, 1, DATA_REGION, 8),
        7,
        "partition 0's copy is filled"
    );

    // The control: a node that has been up fills both.
    let c = rig(2, 0, layout(), Mutations::default());
    c.fence.set_role(1, NodeRole::Receiving);
    assert_eq!(
        c.ep(1).catch_up(&TABLES, 0).unwrap().bytes_read,
        2 * one_copy
    );

    // SB5 broken (a page of node 1 claimed, an entry on it, at its other copy: node 2's slot
    // 1): the claimed page word makes the never-up node fill its data region too.
    let broken = rig(2, 0, layout(), Mutations::default());
    broken.fence.set_never_up(1, true);
    broken.fence.set_role(1, NodeRole::Receiving);
    let mut ep = broken.fabric.endpoint(2);
    ep.write(
        RemoteAddr::new(2, mirror_region(PAGE_REGION, 1), 0),
        &1u64.to_le_bytes(),
    )
    .unwrap();
    ep.write(
        RemoteAddr::new(2, mirror_region(DATA_REGION, 1), 8),
        &9u64.to_le_bytes(),
    )
    .unwrap();
    broken.ep(1).catch_up(&TABLES, 0).unwrap();
    assert_eq!(
        broken.word(1, 0, DATA_REGION, 8),
        9,
        "its own copy is filled"
    );
}

/// A standby node (never up: `Fence::set_never_up`) whose tables' only other copy is on a node
/// that restarts: the restarted node fills that copy from nothing (all zeros: nobody has
/// written the tables of a node that never ran) instead of failing its whole catch-up for want
/// of a full copy (found by review: the restarted node stayed joining for good). A node gone
/// after having been up gives no such leave: its copy's catch-up fails.
#[test]
fn a_standby_node_s_only_other_copy_is_filled_from_nothing() {
    let r = rig(2, 0, layout(), Mutations::default());
    // Partition 2: copy 0 on node 2 (standby), copy 1 on node 0, which restarts and finds
    // stale words in that slot (memory reused).
    r.fence.set_never_up(2, true);
    r.fence.set_gone(2, true);
    r.fence.set_role(0, NodeRole::Receiving);
    let stale = RemoteAddr::new(0, mirror_region(DATA_REGION, 1), 8);
    r.fabric.endpoint(0).write(stale, &[0xab; 16]).unwrap();
    let done = r.ep(0).catch_up(&TABLES, 0).unwrap();
    assert_eq!(done.copies, 2, "its own tables and partition 2's copy 1");
    assert_eq!(r.word(0, 1, DATA_REGION, 8), 0);
    assert_eq!(r.word(0, 1, DATA_REGION, 16), 0);

    // Mutation: the skip a never-up node's own tables take (all zeros: SB5) taken for every
    // never-up partition leaves the reused slot's stale words.
    let mutated = Mutations {
        skip_every_never_up_copy: true,
        ..Mutations::default()
    };
    let m = rig(2, 0, layout(), mutated);
    m.fence.set_never_up(2, true);
    m.fence.set_gone(2, true);
    m.fence.set_role(0, NodeRole::Receiving);
    m.fabric.endpoint(0).write(stale, &[0xab; 16]).unwrap();
    m.ep(0).catch_up(&TABLES, 0).unwrap();
    assert_ne!(m.word(0, 1, DATA_REGION, 8), 0, "the mutation is caught");

    let gone = rig(2, 0, layout(), Mutations::default());
    gone.fence.set_gone(2, true);
    gone.fence.set_role(0, NodeRole::Receiving);
    assert!(matches!(
        gone.ep(0).catch_up(&TABLES, 0),
        Err(FabricError::NoCopy { node: 2 })
    ));
}

/// 8 (rule 10a). R = 2, node 0 gone for good, copy 0 of its tables moved to node 2's spare
/// slot. A writer whose fence still has the moved copy receiving writes a data word: copy 1
/// first, and is held before the moved copy (written last). A reader with the same fence reads
/// the new word at copy 1; then a reader whose fence has just made the moved copy full reads
/// the word. What the two reads return.
fn a_data_read_as_a_moved_copy_becomes_full(mutations: Mutations) -> (u64, u64) {
    const WORD: RemoteAddr = RemoteAddr::new(0, DATA_REGION, 8);
    // Long enough that the new reader reads well inside the join settle time however slow
    // the machine (nothing here waits it out).
    let r = rig_expiring(2, 1, layout(), mutations, Duration::from_secs(2));
    let at = |receiving| MovedCopy {
        node: 2,
        slot: 2,
        receiving,
    };
    let old = Arc::new(Fence::unfenced());
    old.set_gone(0, true);
    old.move_copy(0, 0, Some(at(true)));
    let new = Arc::new(Fence::unfenced());
    new.set_gone(0, true);
    // Full from now, seen receiving before: it settles for the join settle time (over two
    // seconds here), with reads in the old roles meanwhile.
    new.move_copy(0, 0, Some(at(true)));
    new.move_copy(0, 0, Some(at(false)));
    let (v1, v2) = (0x1111_u64, 0x2222_u64);
    for (node, slot) in [(1, 1), (2, 2)] {
        let a = RemoteAddr::new(node, mirror_region(DATA_REGION, slot), WORD.offset);
        r.fabric.endpoint(node).write(a, &v1.to_le_bytes()).unwrap();
    }
    let Hold {
        trigger,
        held: wait_held,
        go,
    } = hold(a_write_to(2));
    let inner = Interposed::new(r.fabric.endpoint(1), trigger);
    let mut writer = Replicated::new(inner, r.set.clone(), old.clone());
    let mut old_reader = Replicated::new(r.fabric.endpoint(1), r.set.clone(), old);
    let mut new_reader = Replicated::new(r.fabric.endpoint(2), r.set.clone(), new);
    std::thread::scope(|s| {
        let w = s.spawn(move || writer.write(WORD, &v2.to_le_bytes()).unwrap());
        wait_held.recv().unwrap();
        let first = old_reader.read_u64(WORD).unwrap();
        let t = std::time::Instant::now();
        let then = new_reader.read_u64(WORD).unwrap();
        assert!(
            (t.elapsed().as_nanos() as u64) < r.set.join_settle_ns(),
            "a data read does not wait out a moved copy's settle time"
        );
        go.send(()).unwrap();
        w.join().unwrap();
        (first, then)
    })
}

#[test]
fn r8_a_data_read_keeps_the_old_roles_while_a_moved_copy_settles() {
    let (v2, v1) = (0x2222, 0x1111);
    assert_eq!(
        a_data_read_as_a_moved_copy_becomes_full(Mutations::default()),
        (v2, v2),
        "the new reader reads copy 1, as the old roles do, and does not wait"
    );
    let old = Mutations {
        read_settling_moved_copy: true,
        ..Mutations::default()
    };
    assert_eq!(
        a_data_read_as_a_moved_copy_becomes_full(old),
        (v2, v1),
        "the control: new, then old"
    );
}

/// 9 (rule 10a). R = 2, node 0 gone for good, copy 0 of its tables moved to node 2's spare
/// slot and just made full: its new primary. A writer whose fence has that writes a data word
/// (copy 1 first, as the decider) and is held before copy 0; a reader whose fence learnt of the
/// change at the same time reads the word, and again once its reads have left the old roles.
/// What the two reads return.
///
/// `reader_late`: how long after the writer's fence the reader's learns of the change (at most
/// a settle time, as membership bounds it; `expiry`: the rig's expiry period).
fn a_data_write_as_a_moved_primary_settles(
    mutations: Mutations,
    expiry: Duration,
    reader_late: Duration,
) -> (u64, u64) {
    const WORD: RemoteAddr = RemoteAddr::new(0, DATA_REGION, 16);
    let r = rig_expiring(2, 1, layout(), mutations, expiry);
    let full = || {
        let f = Arc::new(Fence::unfenced());
        f.set_gone(0, true);
        full_after_receiving(&f, 0, 0, (2, 2));
        f
    };
    let writer = full();
    std::thread::sleep(reader_late);
    let reader = Replicated::new(r.fabric.endpoint(1), r.set.clone(), full());
    reads_around_a_held_write(&r, WORD, &[(1, 1), (2, 2)], (1, writer, 2), reader)
}

/// Rule 10a's write races: `word` holds 0x1111 on the `full` copies (node, mirror slot); a
/// writer on `node` whose fence is `writer` writes 0x2222, held before its write to node
/// `held_at`. Meanwhile `reader` reads the word, and again a join settle time later. What the
/// two reads return.
fn reads_around_a_held_write(
    r: &Rig,
    word: RemoteAddr,
    full: &[(NodeId, u8)],
    (node, writer, held_at): (NodeId, Arc<Fence>, NodeId),
    mut reader: Replicated<InProcEndpoint>,
) -> (u64, u64) {
    let (v1, v2) = (0x1111_u64, 0x2222_u64);
    for &(n, slot) in full {
        let a = RemoteAddr::new(n, mirror_region(DATA_REGION, slot), word.offset);
        r.fabric.endpoint(n).write(a, &v1.to_le_bytes()).unwrap();
    }
    let Hold {
        trigger,
        held: wait_held,
        go,
    } = hold(a_write_to(held_at));
    let inner = Interposed::new(r.fabric.endpoint(node), trigger);
    let mut writer = Replicated::new(inner, r.set.clone(), writer);
    std::thread::scope(|s| {
        let w = s.spawn(move || writer.write(word, &v2.to_le_bytes()).unwrap());
        wait_held.recv().unwrap();
        let first = reader.read_u64(word).unwrap();
        std::thread::sleep(Duration::from_nanos(r.set.join_settle_ns()));
        let then = reader.read_u64(word).unwrap();
        go.send(()).unwrap();
        w.join().unwrap();
        (first, then)
    })
}

#[test]
fn r9_a_data_write_waits_while_a_moved_copy_becomes_the_primary() {
    let (v1, v2) = (0x1111, 0x2222);
    let run = |m, late| a_data_write_as_a_moved_primary_settles(m, EXPIRY_9, late);
    assert_eq!(
        run(Mutations::default(), Duration::ZERO),
        (v1, v1),
        "the writer waits until no reader is left in the old roles"
    );
    let old = Mutations {
        moved_writes_never_wait: true,
        ..Mutations::default()
    };
    assert_eq!(
        run(old, Duration::ZERO),
        (v2, v1),
        "the control: new, then old"
    );
}

/// Rig 9's expiry period: long enough that a read meant to fall inside a reader's old-role
/// window does (half a second of slack) on a loaded machine.
const EXPIRY_9: Duration = Duration::from_millis(500);

/// Rule 10a's second join settle time: a reader whose fence learns of the change a settle time
/// after the writer's reads in the old roles until a join settle time after that; a writer
/// that waited only one join settle time from its own learning writes meanwhile.
#[test]
fn r9_a_data_write_waits_for_a_reader_that_learnt_a_settle_time_later() {
    let (v1, v2) = (0x1111, 0x2222);
    // The settle time: the expiry period (the rigs have no clock margin).
    let run = |m| a_data_write_as_a_moved_primary_settles(m, EXPIRY_9, EXPIRY_9);
    assert_eq!(run(Mutations::default()), (v1, v1));
    let once = Mutations {
        moved_change_waits_once: true,
        ..Mutations::default()
    };
    assert_eq!(run(once), (v2, v1), "the control: new, then old");
}

/// Rule 10a with R = 3 (four nodes): copy 1 of node 0's tables moved from node 1 (gone for
/// good) to node 3's spare slot and just made full. The writer's fence still has node 0 up, so
/// the moved copy is behind the primary, but with a full copy after it (copy 2, node 2). The
/// writer writes a data word (copy 2 first) and is held before the moved copy; a reader whose
/// fence has node 0 failed too reads the word (in the old roles: past the moved copy, to copy
/// 2), and again once its reads have left the old roles (the moved copy). What the two reads
/// return.
fn a_data_write_behind_the_primary_with_a_full_copy_after(mutations: Mutations) -> (u64, u64) {
    const WORD: RemoteAddr = RemoteAddr::new(0, DATA_REGION, 48);
    let r = rig_of(4, 3, 1, layout(), mutations, EXPIRY_9);
    let moved = |primary_gone: bool| {
        let f = Arc::new(Fence::unfenced());
        f.set_gone(1, true);
        f.set_gone(0, primary_gone);
        full_after_receiving(&f, 0, 1, (3, 3));
        f
    };
    let reader = Replicated::new(r.fabric.endpoint(2), r.set.clone(), moved(true));
    // The full copies: node 0's at home, node 2's (copy 2), node 3's spare slot (moved copy 1).
    let full = [(0, 0), (2, 2), (3, 3)];
    reads_around_a_held_write(&r, WORD, &full, (2, moved(false), 3), reader)
}

#[test]
fn r9_with_three_copies_a_write_behind_the_primary_waits_if_a_full_copy_follows() {
    let (v1, v2) = (0x1111, 0x2222);
    assert_eq!(
        a_data_write_behind_the_primary_with_a_full_copy_after(Mutations::default()),
        (v1, v1),
        "the writer waits until no reader is left in the old roles"
    );
    let old = Mutations {
        moved_write_ignores_copy_after: true,
        ..Mutations::default()
    };
    assert_eq!(
        a_data_write_behind_the_primary_with_a_full_copy_after(old),
        (v2, v1),
        "the control: new (copy 2), then old (the moved copy)"
    );
}

/// Rule 10a's writes that need not wait while a moved copy settles: a plain write behind the
/// primary (copy 1 of node 0's tables moved, copy 0 at home stays the primary), and a recycle
/// mark (`write_unordered`) where the moved copy is the new primary. Both return well inside
/// the join settle time, and reach every copy.
#[test]
fn r10_writes_that_change_no_reader_s_copy_do_not_wait_for_a_moved_copy() {
    let r = rig_expiring(2, 1, layout(), Mutations::default(), Duration::from_secs(2));
    let moved = |j: u8, gone: bool| {
        let f = Arc::new(Fence::unfenced());
        f.set_gone(0, gone);
        let at = MovedCopy {
            node: 2,
            slot: 2,
            receiving: false,
        };
        f.move_copy(0, j, Some(at));
        f
    };
    let quick = |what: &str, t: std::time::Instant| {
        assert!(
            (t.elapsed().as_nanos() as u64) < r.set.join_settle_ns(),
            "{what} waited for the moved copy"
        );
    };
    // Copy 1 moved: copy 0 (node 0, at home) is still the primary.
    let behind = RemoteAddr::new(0, DATA_REGION, 24);
    let mut w = Replicated::new(r.fabric.endpoint(1), r.set.clone(), moved(1, false));
    let t = std::time::Instant::now();
    w.write(behind, &7u64.to_le_bytes()).unwrap();
    quick("a plain write behind the primary", t);
    assert_eq!(r.word(0, 0, DATA_REGION, 24), 7);
    assert_eq!(r.word(2, 2, DATA_REGION, 24), 7);
    // Copy 0 moved (node 0 gone): the moved copy is the new primary.
    let mark = RemoteAddr::new(0, DATA_REGION, 32);
    let mut w = Replicated::new(r.fabric.endpoint(1), r.set.clone(), moved(0, true));
    let t = std::time::Instant::now();
    w.write_unordered(mark, &9u64.to_le_bytes()).unwrap();
    quick("an unordered write", t);
    assert_eq!(r.word(1, 1, DATA_REGION, 32), 9);
    assert_eq!(r.word(2, 2, DATA_REGION, 32), 9);
}

/// 11 (rule 10a). R = 2, copy 0 of node 0's tables moved to node 2 and made full; a node that
/// learns of it late (the configuration says an hour ago, it learns now) reads a data word
/// while a writer that has not heard yet has written copy 1 and is held before the moved copy
/// (which it writes last, as receiving). What the read returns within 200 ms, if anything, and
/// what it returns once the writer is let go.
fn a_late_learner_reads_a_moved_copy(mutations: Mutations) -> (Option<u64>, u64) {
    const WORD: RemoteAddr = RemoteAddr::new(0, DATA_REGION, 40);
    let r = rig_expiring(2, 1, layout(), mutations, EXPIRY_9);
    let (v1, v2) = (0x1111_u64, 0x2222_u64);
    for (node, slot) in [(1, 1), (2, 2)] {
        let a = RemoteAddr::new(node, mirror_region(DATA_REGION, slot), WORD.offset);
        r.fabric.endpoint(node).write(a, &v1.to_le_bytes()).unwrap();
    }
    let at = |receiving| MovedCopy {
        node: 2,
        slot: 2,
        receiving,
    };
    let old = Arc::new(Fence::unfenced());
    old.set_gone(0, true);
    old.move_copy(0, 0, Some(at(true)));
    let late = Arc::new(Fence::unfenced());
    late.set_gone(0, true);
    late.move_copy(0, 0, Some(at(false)));
    late.set_moved_full_since(0, 0, 3_600 * 1_000_000_000, 1);
    let Hold {
        trigger,
        held: wait_held,
        go,
    } = hold(a_write_to(2));
    let inner = Interposed::new(r.fabric.endpoint(1), trigger);
    let mut writer = Replicated::new(inner, r.set.clone(), old);
    let mut reader = Replicated::new(r.fabric.endpoint(1), r.set.clone(), late);
    std::thread::scope(|s| {
        let w = s.spawn(move || writer.write(WORD, &v2.to_le_bytes()).unwrap());
        wait_held.recv().unwrap();
        let (read_tx, read_rx) = std::sync::mpsc::channel();
        let rd = s.spawn(move || read_tx.send(reader.read_u64(WORD).unwrap()).unwrap());
        let early = read_rx.recv_timeout(Duration::from_millis(200)).ok();
        go.send(()).unwrap();
        w.join().unwrap();
        let last = early.unwrap_or_else(|| read_rx.recv().unwrap());
        rd.join().unwrap();
        (early, last)
    })
}

#[test]
fn r11_a_node_that_learns_late_waits_rather_than_read_either_copy() {
    let (v1, v2) = (0x1111, 0x2222);
    assert_eq!(
        a_late_learner_reads_a_moved_copy(Mutations::default()),
        (None, v2),
        "the late reader waits until it has known for the join settle time"
    );
    let early = Mutations {
        new_roles_from_configuration_time: true,
        ..Mutations::default()
    };
    assert_eq!(
        a_late_learner_reads_a_moved_copy(early),
        (Some(v1), v1),
        "the control: the moved copy read before the writer reached it"
    );
}

/// 12 (found by the fault test over TCP, 2026-11-30). A CAS decided at node 1's copy of
/// partition 0 (its last, the decider), its carrier on node 1 held just before it reads the
/// primary: node 1 is paused past its lease, declared failed, and node 2 makes two changes at
/// the primary once the settle time has passed. Then the carrier resumes, with a fence that has
/// not heard yet (the monitor learns after the pause). What the carrier's CAS returned and
/// what the primary holds, against the last change node 2 made.
fn a_carrier_resumed_past_its_lease(mutations: Mutations) -> (Result<u64, FabricError>, u64, u64) {
    let r = Arc::new(rig(2, 0, layout(), mutations));
    let paused = Arc::new(Fence::unfenced());
    let Hold {
        trigger,
        held: wait_held,
        go,
    } = hold(first_read_after_a_cas(0));
    let inner = Interposed::new(r.fabric.endpoint(1), trigger);
    let mut carrier = Replicated::new(inner, r.set.clone(), paused.clone());
    let w = r.next(0, 1);
    std::thread::scope(|s| {
        let c = s.spawn(move || carrier.compare_and_swap(ENTRY, 0, w));
        wait_held.recv().unwrap();
        assert_eq!(r.word(1, 1, INDEX_REGION, 0), w, "decided at node 1");
        // The pause outlasts node 1's lease; the others declare it failed and, a settle time
        // later, decide at the primary.
        paused.set_lease_until(r.fabric.endpoint(1).mono_ns());
        r.fence.set_gone(1, true);
        settle();
        let mut ep = r.ep(2);
        r.change(&mut ep, 2);
        let last = r.change(&mut ep, 3);
        go.send(()).unwrap();
        let carried = c.join().unwrap();
        (carried, r.word(0, 0, INDEX_REGION, 0), last)
    })
}

#[test]
fn r12_a_carrier_resumed_past_its_lease_never_moves_the_primary_back() {
    let (carried, primary, last) = a_carrier_resumed_past_its_lease(Mutations::default());
    assert_eq!(
        primary, last,
        "the primary keeps node 2's acknowledged changes"
    );
    assert!(
        matches!(carried, Err(FabricError::Indeterminate { node: 1 })),
        "decided, not carried: the carrier cannot tell whether it survives: {carried:?}"
    );
    let old = Mutations {
        carrier_ignores_lease: true,
        ..Mutations::default()
    };
    let (carried, primary, last) = a_carrier_resumed_past_its_lease(old);
    assert_ne!(primary, last, "the control: the primary was moved back");
    assert!(
        carried.is_ok(),
        "the control: the stale write acknowledged over two later ones: {carried:?}"
    );
}

/// 12, the other side: the lease lapses under the carrier (`lapsed_ago` before it is let go)
/// and is renewed 200 ms after. What the carrier's CAS returned, and what the primary holds
/// then (the word decided is `r.next(0, 1)`).
fn a_carrier_whose_lease_is_renewed(lapsed_ago: Duration) -> (Result<u64, FabricError>, u64) {
    // A settle time of 2 s: the renewal, 200 ms after the carrier is let go, comes well after
    // its lease check and well before it gives up, however loaded the machine.
    let r = rig_expiring(2, 0, layout(), Mutations::default(), Duration::from_secs(2));
    let lapsing = Arc::new(Fence::unfenced());
    let Hold {
        trigger,
        held: wait_held,
        go,
    } = hold(first_read_after_a_cas(0));
    let inner = Interposed::new(r.fabric.endpoint(1), trigger);
    let mut carrier = Replicated::new(inner, r.set.clone(), lapsing.clone());
    let w = r.next(0, 1);
    std::thread::scope(|s| {
        let c = s.spawn(move || carrier.compare_and_swap(ENTRY, 0, w));
        wait_held.recv().unwrap();
        // The monotonic clock may have started less than `lapsed_ago` ago (and a lease of 0
        // means not up at all).
        let ago = lapsed_ago.as_nanos() as u64;
        while r.fabric.endpoint(1).mono_ns() <= ago {
            std::thread::sleep(Duration::from_millis(10));
        }
        lapsing.set_lease_until(r.fabric.endpoint(1).mono_ns() - ago);
        go.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(
            r.word(0, 0, INDEX_REGION, 0),
            0,
            "not carried past the lease"
        );
        lapsing.set_lease_until(u64::MAX);
        (c.join().unwrap(), r.word(0, 0, INDEX_REGION, 0))
    })
}

/// A lease renewed within a settle time of its lapse (the node was not declared failed: a
/// pause shorter than its lease in etcd): the carrier waits for the renewal, looks again and
/// carries its word, acknowledged, onto the primary. (Refused at once, the CAS would be
/// reported `Indeterminate` while its word lives on at the decider, to be helped onto the
/// primary later: callers that settle such a CAS by reading the primary would be misled.)
/// One renewed later may be a rejoin's, whose catch-up may have replaced the word: the carry
/// is `Indeterminate`, and nothing is carried.
#[test]
fn r12_a_carrier_whose_lease_is_renewed_carries_its_word() {
    let w = layout().successor(Ite(0), layout().encode(1, 0, 1)).0;
    let (carried, primary) = a_carrier_whose_lease_is_renewed(Duration::ZERO);
    assert_eq!(carried.unwrap(), 0, "acknowledged once renewed");
    assert_eq!(primary, w);
    let (carried, primary) = a_carrier_whose_lease_is_renewed(Duration::from_secs(3));
    assert!(
        matches!(carried, Err(FabricError::Indeterminate { node: 1 })),
        "renewed more than a settle time after the lapse: {carried:?}"
    );
    assert_eq!(primary, 0);
}

/// Interleaving 13: a plain write of a node past its lease (paused, perhaps declared failed,
/// its pages adopted and its entries reused by the others: a late header, value or mark
/// would land on someone else's entry). Partition 0's data copies are on nodes 0 and 1, the
/// writer on node 2. What the write returned, and what copies 0 and 1 hold after it.
fn a_write_past_the_lease(
    mutations: Mutations,
    settle: Duration,
    lapse: Lapse,
) -> (Result<(), FabricError>, [u64; 2]) {
    const W: u64 = 0x5eed_0000_0000_0013;
    let at = RemoteAddr::new(0, DATA_REGION, 24);
    let r = rig_expiring(2, 0, layout(), mutations, settle);
    let fence = Arc::new(Fence::unfenced());
    let now = r.fabric.endpoint(2).mono_ns();
    let during = matches!(lapse, Lapse::AfterFirstCopy | Lapse::AfterLostAnswer);
    // Membership's lease: a minute, or lapsed now.
    fence.set_lease_until(now + if during { 60_000_000_000 } else { 0 });
    // Copies are written last first: copy 1's write comes first.
    let at_first_write = LapseAtFirstWrite {
        fence: fence.clone(),
        clock: r.fabric.clone(),
        armed: during,
        lose: lapse == Lapse::AfterLostAnswer,
    };
    let mut writer = Replicated::new(
        Interposed::new(r.fabric.endpoint(2), at_first_write),
        r.set.clone(),
        fence.clone(),
    );
    let written = std::thread::scope(|s| {
        if lapse == Lapse::RenewedSoon {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(200));
                fence.set_lease_until(u64::MAX);
            });
        }
        writer.write(at, &W.to_le_bytes())
    });
    let copies = [r.word(0, 0, DATA_REGION, 24), r.word(1, 1, DATA_REGION, 24)];
    (written, copies.map(|w| (w == W) as u64 * W))
}

/// When the writer's lease lapses in [`a_write_past_the_lease`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Lapse {
    /// Before the write, never renewed.
    Before,
    /// Between the two copies' writes, never renewed.
    AfterFirstCopy,
    /// Before the write, renewed 200 ms later.
    RenewedSoon,
    /// As `AfterFirstCopy`, and that first write's answer is lost (it landed).
    AfterLostAnswer,
}

/// Lapses the writer's lease at its first write to node 1, once it landed, and (`lose`)
/// loses its answer.
struct LapseAtFirstWrite {
    fence: Arc<Fence>,
    clock: Arc<InProcFabric>,
    armed: bool,
    lose: bool,
}

impl Interposer for LapseAtFirstWrite {
    fn before(&mut self, _: Op) -> Result<(), FabricError> {
        Ok(())
    }

    fn after_write(&mut self, a: RemoteAddr) -> Result<(), FabricError> {
        if !self.armed || a.node != 1 {
            return Ok(());
        }
        self.armed = false;
        self.fence.set_lease_until(self.clock.endpoint(2).mono_ns());
        match self.lose {
            true => Err(FabricError::Unreachable {
                node: 1,
                reason: "the answer was lost".into(),
            }),
            false => Ok(()),
        }
    }
}

#[test]
fn r13_a_write_past_the_lease_reaches_no_copy() {
    let (written, copies) = a_write_past_the_lease(Mutations::default(), EXPIRY, Lapse::Before);
    assert!(
        matches!(written, Err(FabricError::Fenced { node: 2 })),
        "refused: {written:?}"
    );
    assert_eq!(copies, [0, 0], "no copy written");
    let old = Mutations {
        writer_ignores_lease: true,
        ..Mutations::default()
    };
    let (written, copies) = a_write_past_the_lease(old, EXPIRY, Lapse::Before);
    assert!(written.is_ok(), "the control: {written:?}");
    assert!(
        copies.iter().all(|&w| w != 0),
        "the control: both copies written past the lease: {copies:?}"
    );
}

/// 13, a lease that lapses between two copies' writes, or after a try whose answer was lost
/// (it landed): one copy has the bytes, the other not, and the writer cannot call that
/// refused (`commit` treats it as issued and gives up).
#[test]
fn r13_a_write_cut_by_the_lease_is_indeterminate() {
    for lapse in [Lapse::AfterFirstCopy, Lapse::AfterLostAnswer] {
        let (written, copies) = a_write_past_the_lease(Mutations::default(), EXPIRY, lapse);
        assert!(
            matches!(written, Err(FabricError::Indeterminate { .. })),
            "{lapse:?}: half written: {written:?}"
        );
        assert_eq!(copies[0], 0, "{lapse:?}: the primary was not written");
        assert_ne!(copies[1], 0, "{lapse:?}: copy 1 was, before the lapse");
    }
}

/// 13, a lease renewed within a settle time of its lapse (a pause shorter than the lease in
/// etcd: nobody declared the node failed): the write waits for the renewal, then lands.
#[test]
fn r13_a_write_whose_lease_is_renewed_lands() {
    let (written, copies) = a_write_past_the_lease(
        Mutations::default(),
        Duration::from_secs(2),
        Lapse::RenewedSoon,
    );
    assert!(written.is_ok(), "{written:?}");
    assert!(copies.iter().all(|&w| w != 0), "both copies: {copies:?}");
}

/// 14 (rule 10c). As rig 9: R = 2, node 0 gone for good, copy 0 of its tables moved to node
/// 2's spare slot and just made full, its new primary. Membership ends rule 10a's pauses early
/// in two steps: data reads take the new roles once every node said it applied the epoch
/// (`Fence::settle_moved_reads_by`), and changes stop waiting once every node said it reads in
/// the new roles (`Fence::settle_moved_writes_by`). The writer's fence has taken both steps if
/// `writes_settled`, else only the first; the reader's has taken the first if `reader_new`,
/// else none (it still reads in the old roles). What the two reads around the held write
/// return (`reads_around_a_held_write`), and how long a plain write of another word took.
fn a_data_write_after_every_node_said(
    mutations: Mutations,
    writes_settled: bool,
    reader_new: bool,
) -> ((u64, u64), Duration) {
    const WORD: RemoteAddr = RemoteAddr::new(0, DATA_REGION, 56);
    const OTHER: RemoteAddr = RemoteAddr::new(0, DATA_REGION, 8);
    let r = rig_expiring(2, 1, layout(), mutations, EXPIRY_9);
    let fence = |reads: bool, writes: bool| {
        let f = Arc::new(Fence::unfenced());
        f.set_gone(0, true);
        full_after_receiving(&f, 0, 0, (2, 2));
        let (change, now) = (f.moved_full_instance(0, 0), nessie_fabric::monotonic_ns());
        assert_ne!(change, 0, "a moved copy that became full");
        if reads {
            f.settle_moved_reads_by(0, 0, change, now);
        }
        if writes {
            f.settle_moved_writes_by(0, 0, change, now);
        }
        f
    };
    let mut w = Replicated::new(
        r.fabric.endpoint(1),
        r.set.clone(),
        fence(true, writes_settled),
    );
    let t = std::time::Instant::now();
    w.write(OTHER, &5u64.to_le_bytes()).unwrap();
    let took = t.elapsed();
    let reader = Replicated::new(
        r.fabric.endpoint(1),
        r.set.clone(),
        fence(reader_new, false),
    );
    let writer = fence(true, writes_settled);
    let reads = reads_around_a_held_write(&r, WORD, &[(1, 1), (2, 2)], (1, writer, 2), reader);
    (reads, took)
}

#[test]
fn r14_changes_wait_until_every_node_reads_a_moved_copy_in_the_new_roles() {
    let (v1, v2) = (0x1111, 0x2222);
    let join_settle = Duration::from_nanos(
        rig_expiring(2, 1, layout(), Mutations::default(), EXPIRY_9)
            .set
            .join_settle_ns(),
    );
    // Only reads settled on the writer's node, a reader still in the old roles: the write
    // waits out rule 10a's time.
    let (reads, took) = a_data_write_after_every_node_said(Mutations::default(), false, false);
    assert_eq!(reads, (v1, v1), "the writer waits for the old-role reader");
    assert!(took >= 2 * join_settle, "waited {took:?}");
    let early = Mutations {
        moved_writes_end_with_reads: true,
        ..Mutations::default()
    };
    let (reads, _) = a_data_write_after_every_node_said(early, false, false);
    assert_eq!(reads, (v2, v1), "the control: new, then old");
    // Both steps taken: the write goes at once, and a reader in the new roles reads the
    // moved copy, which the write reaches last, so the old value until it does.
    let (reads, took) = a_data_write_after_every_node_said(Mutations::default(), true, true);
    assert_eq!(reads, (v1, v1));
    assert!(took < join_settle, "waited {took:?} once every node said");
}

/// Record copy `j` of `partition` at `(node, slot)`, receiving, then full: a fence that saw
/// the copy filled, whose reads may take the old roles while it settles (rule 10c).
fn full_after_receiving(f: &Fence, partition: NodeId, j: u8, (node, slot): (NodeId, u8)) {
    for receiving in [true, false] {
        let at = MovedCopy {
            node,
            slot,
            receiving,
        };
        f.move_copy(partition, j, Some(at));
    }
}

/// 14, a process that learns of the moved copy already full (started after it was filled,
/// so nobody waited for its word) while the writer no longer waits: it may not read in the
/// old roles. It waits instead (rule 10a's `Between`), then reads the moved copy. What its two
/// reads return around the held write.
fn a_fresh_process_reads_after_changes_stopped_waiting(mutations: Mutations) -> (u64, u64) {
    const WORD: RemoteAddr = RemoteAddr::new(0, DATA_REGION, 48);
    let r = rig_expiring(2, 1, layout(), mutations, EXPIRY_9);
    let writer = Arc::new(Fence::unfenced());
    writer.set_gone(0, true);
    full_after_receiving(&writer, 0, 0, (2, 2));
    let (change, now) = (
        writer.moved_full_instance(0, 0),
        nessie_fabric::monotonic_ns(),
    );
    writer.settle_moved_reads_by(0, 0, change, now);
    writer.settle_moved_writes_by(0, 0, change, now);
    let fresh = Arc::new(Fence::unfenced());
    fresh.set_gone(0, true);
    let at = MovedCopy {
        node: 2,
        slot: 2,
        receiving: false,
    };
    fresh.move_copy(0, 0, Some(at));
    let reader = Replicated::new(r.fabric.endpoint(1), r.set.clone(), fresh);
    reads_around_a_held_write(&r, WORD, &[(1, 1), (2, 2)], (1, writer, 2), reader)
}

#[test]
fn r14_a_process_that_learns_of_a_moved_copy_full_never_reads_it_in_the_old_roles() {
    let (v1, v2) = (0x1111, 0x2222);
    let run = a_fresh_process_reads_after_changes_stopped_waiting;
    assert_eq!(run(Mutations::default()), (v1, v1));
    let old = Mutations {
        fresh_fence_reads_old: true,
        ..Mutations::default()
    };
    assert_eq!(run(old), (v2, v1), "the control: new, then old");
}
