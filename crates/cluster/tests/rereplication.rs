//! Re-replication onto other nodes in one process (`LocalCluster::replace_node`): the copies a
//! node gone for good held move to spare slots on the others, are filled there while writers
//! write, and a second crash then loses nothing.
//!
//! A crash is `InProcFabric::kill_node` then `LocalCluster::fail_node`, as in `replication.rs`.

#[allow(dead_code)]
mod common;
use common::{cfg, crash, geometry, key, value, write_round, Model};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nessie_cluster::LocalCluster;
use nessie_fabric::{Endpoint, NodeId, RemoteAddr};
use nessie_protocols::replica::{mirror_region, Placement};
use nessie_protocols::{Error, Mutations, ProtocolConfig};
use nessie_store::{DATA_REGION, INDEX_REGION, PAGE_REGION};

fn cfg_with(mutations: Mutations) -> ProtocolConfig {
    ProtocolConfig { mutations, ..cfg() }
}

fn cluster(nodes: u32, spare: u8, mutations: Mutations) -> LocalCluster {
    LocalCluster::replicated_with_spares(geometry(nodes), cfg_with(mutations), None, 2, spare)
        .unwrap()
}

/// How many keys read other than modelled through a client on each node of `readers`.
fn wrong_reads(c: &LocalCluster, readers: &[NodeId], model: &Model) -> usize {
    let mut wrong = 0;
    for &n in readers {
        let mut r = c.client(n).unwrap();
        wrong += model
            .iter()
            .filter(
                |(&i, want)| !matches!(r.get(&key(i)), Ok(got) if got.as_ref() == want.as_ref()),
            )
            .count();
    }
    wrong
}

/// Whole-region bytes of `partition`'s `region` in the copy at `at`.
fn copy_bytes(c: &LocalCluster, at: Placement, region: u16) -> Vec<u8> {
    let g = &c.view().geometry;
    let len = match region {
        INDEX_REGION => g.index_table_bytes(),
        PAGE_REGION => g.page_table_bytes(),
        _ => g.data_table_bytes(),
    };
    let mut ep = c.fabric().endpoint(at.node);
    let mut buf = vec![0u8; len as usize];
    ep.read(
        RemoteAddr::new(at.node, mirror_region(region, at.slot), 0),
        &mut buf,
    )
    .unwrap();
    buf
}

/// Whether every copy of a partition on a node other than `gone` holds the same bytes in every
/// region, for every partition.
/// Whether every live copy of every partition holds the same bytes. Stops the reclaimers
/// first: a reclaimer's scan clears recycle words in every copy, one after the other, and a
/// comparison that read a copy in between would see them differ (it did, once, under load).
fn copies_agree(c: &mut LocalCluster, gone: &[NodeId]) -> bool {
    assert_eq!(c.stop_reclaimers(), 0, "a reclaimer panicked");
    let map = c.copy_map();
    let set = c.replica_set();
    (0..set.nodes()).all(|p| {
        let live: Vec<Placement> = (0..set.replicas())
            .map(|j| map.place(p, j))
            .filter(|at| !gone.contains(&at.node))
            .collect();
        [INDEX_REGION, DATA_REGION, PAGE_REGION]
            .iter()
            .all(|&region| {
                let first = copy_bytes(c, live[0], region);
                live[1..]
                    .iter()
                    .all(|&at| copy_bytes(c, at, region) == first)
            })
    })
}

/// Node 1 of four crashes and is replaced: its two copies (its own partition's primary and
/// node 0's backup) move to spare slots on other nodes, which fill them. Then node 2, which
/// held the only other copy of partition 1, crashes too, and nothing is lost.
#[test]
fn a_replaced_node_s_copies_move_and_a_second_crash_loses_nothing() {
    let mut c = cluster(4, 1, Mutations::default());
    let mut model = Model::new();
    write_round(&c, &[0, 1, 2, 3], 400, 1, 0, &mut model);
    crash(&c, 1);
    write_round(&c, &[0, 2, 3], 400, 2, 5, &mut model);
    let caught = c.replace_node(1).unwrap();
    assert_eq!(caught.copies, 2, "{caught:?}");
    assert!(caught.words_changed > 0, "{caught:?}");
    let map = c.copy_map();
    assert!(
        map.held_by(1).is_empty(),
        "node 1 still holds copies: {map:?}"
    );
    let spare = c.replica_set().spare_slots().start;
    for (p, j) in [(1, 0), (0, 1)] {
        let at = map.place(p, j);
        assert!(
            at.node != 1 && at.slot == spare,
            "copy {j} of {p} at {at:?}"
        );
    }
    assert!(
        copies_agree(&mut c, &[1]),
        "a moved copy differs from the other copy"
    );
    assert_eq!(wrong_reads(&c, &[0, 2, 3], &model), 0, "after the move");
    write_round(&c, &[0, 2, 3], 400, 3, 7, &mut model);
    crash(&c, 2);
    assert_eq!(
        wrong_reads(&c, &[0, 3], &model),
        0,
        "after node 2 crashed too"
    );
    write_round(&c, &[0, 3], 400, 4, 3, &mut model);
    assert_eq!(
        wrong_reads(&c, &[0, 3], &model),
        0,
        "after writing through the last two"
    );
}

/// The control: the same crashes without the move lose keys.
#[test]
fn without_the_move_the_second_crash_loses_keys() {
    let c = cluster(4, 1, Mutations::default());
    let mut model = Model::new();
    write_round(&c, &[0, 1, 2, 3], 400, 1, 0, &mut model);
    crash(&c, 1);
    write_round(&c, &[0, 2, 3], 400, 2, 5, &mut model);
    crash(&c, 2);
    let mut r = c.client(0).unwrap();
    let unreadable = model.keys().filter(|&&i| r.get(&key(i)).is_err()).count();
    assert!(
        unreadable > 0,
        "every key still read after both copies of partition 1 went"
    );
}

/// How fast [`replace_under_constant_writes`] copies: slow enough that writes overlap it.
const CATCH_UP_BYTES_PER_S: u64 = 10_000_000;

/// Replace node 1 while writers on nodes 0, 2 and 3 write without pause; afterwards, with the
/// writers stopped, every copy agrees. Returns whether they did.
fn replace_under_constant_writes(mutations: Mutations) -> Result<bool, Error> {
    let mut c = cluster(4, 1, mutations);
    let mut model = Model::new();
    write_round(&c, &[0, 1, 2, 3], 300, 1, 0, &mut model);
    crash(&c, 1);
    let stop = AtomicBool::new(false);
    let puts = AtomicU64::new(0);
    let (caught, during) = std::thread::scope(|s| {
        for n in [0, 2, 3] {
            let (c, stop, puts) = (&c, &stop, &puts);
            s.spawn(move || {
                let mut w = c.client(n).unwrap();
                let mut round = 10;
                while !stop.load(Ordering::SeqCst) {
                    for i in (n as u64..300).step_by(3) {
                        w.put(&key(i), &value(i, round)).unwrap();
                        puts.fetch_add(1, Ordering::SeqCst);
                    }
                    round += 1;
                }
            });
        }
        let before = puts.load(Ordering::SeqCst);
        let r = c.replace_node_paced(1, CATCH_UP_BYTES_PER_S);
        stop.store(true, Ordering::SeqCst);
        r.map(|r| (r, puts.load(Ordering::SeqCst) - before))
    })?;
    eprintln!("{during} PUTs during the move: {caught:?}");
    assert!(during >= 100, "only {during} PUTs during the move");
    Ok(copies_agree(&mut c, &[1]))
}

#[test]
fn a_move_under_constant_writes_leaves_every_copy_equal() {
    assert_eq!(
        replace_under_constant_writes(Mutations::default()),
        Ok(true)
    );
}

/// The mutation: writers skip receiving copies, the moved ones included. The moved copies end
/// up behind, or the allocator's own invariants trip first.
#[test]
fn a_move_whose_copies_miss_writes_is_caught() {
    let m = Mutations {
        rejoin_skips_receiving: true,
        ..Mutations::default()
    };
    let r = std::panic::catch_unwind(|| replace_under_constant_writes(m));
    eprintln!("with the mutation: {r:?}");
    assert!(
        !matches!(r, Ok(Ok(true))),
        "moved copies that missed writes went unnoticed"
    );
}

/// With no spare slot anywhere, nothing moves and the error says why; nor before the node is
/// declared failed, nor without replication.
#[test]
fn moves_are_refused_clearly() {
    let c = cluster(3, 0, Mutations::default());
    crash(&c, 1);
    let e = c.replace_node(1).unwrap_err().to_string();
    assert!(e.contains("nowhere to go"), "{e}");
    assert!(
        c.copy_map().held_by(1).len() == 2,
        "a refused move moved something"
    );
    let c = cluster(3, 1, Mutations::default());
    let e = c.replace_node(1).unwrap_err().to_string();
    assert!(e.contains("was not declared failed"), "{e}");
    let e = LocalCluster::replicated_with_spares(
        geometry(3),
        cfg_with(Mutations::default()),
        None,
        1,
        1,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("needs replication"), "{e}");
}

/// A replaced node started again comes back holding none of its old copies (they stay where
/// they moved) and serves through the others' copies; its spare slot then takes a copy of the
/// next node replaced, and a further crash loses nothing.
#[test]
fn a_replaced_node_comes_back_without_copies_and_takes_later_ones() {
    // Two spare slots each: node 2, replaced second, holds three copies by then.
    let mut c = cluster(4, 2, Mutations::default());
    let mut model = Model::new();
    write_round(&c, &[0, 1, 2, 3], 400, 1, 0, &mut model);
    crash(&c, 1);
    c.replace_node(1).unwrap();
    let caught = c.restart_node(1).unwrap();
    assert_eq!(caught.copies, 0, "{caught:?}");
    assert!(c.copy_map().held_by(1).is_empty());
    assert_eq!(
        wrong_reads(&c, &[0, 1, 2, 3], &model),
        0,
        "after node 1 came back"
    );
    write_round(&c, &[1, 0, 2, 3], 400, 2, 6, &mut model);
    assert_eq!(
        wrong_reads(&c, &[0, 1, 2, 3], &model),
        0,
        "after writing through node 1"
    );
    // Node 2 goes: node 1, holding no copy, takes one of its copies first.
    crash(&c, 2);
    c.replace_node(2).unwrap();
    let on_1 = c.copy_map().held_by(1);
    assert!(
        !on_1.is_empty(),
        "no copy moved to node 1: {:?}",
        c.copy_map()
    );
    assert!(copies_agree(&mut c, &[2]), "a moved copy differs");
    write_round(&c, &[0, 1, 3], 400, 3, 4, &mut model);
    // Then node 3 goes too: every partition still has a copy on node 0 or node 1.
    crash(&c, 3);
    assert_eq!(wrong_reads(&c, &[0, 1], &model), 0, "after three crashes");
}
