//! Client-driven replication (`nessie_protocols::replica`) in one process: every copy holds
//! what the primary holds, a crashed node loses no acknowledged write, and writes go on
//! through the survivors.
//!
//! A crash is `InProcFabric::kill_node` (the node's memory becomes unreachable and its own
//! workers issue nothing), then `LocalCluster::fail_node` (membership declares it failed).

use std::time::{Duration, Instant};

#[allow(dead_code)]
mod common;
use common::{cfg, crash, geometry, key, value, write_round, Model};

use nessie_cluster::LocalCluster;
use nessie_fabric::{Endpoint, NodeId, RemoteAddr};
use nessie_protocols::replica::mirror_region;
use nessie_protocols::{Error, Mutations, ProtocolConfig};
use nessie_store::{Geometry, DATA_REGION, INDEX_REGION, PAGE_REGION};

/// Every key reads its modelled value through a client on each node in `readers`.
fn assert_reads(c: &LocalCluster, readers: &[NodeId], model: &Model, when: &str) {
    for &n in readers {
        let mut r = c.client(n).unwrap();
        let mut wrong = Vec::new();
        for (&i, want) in model {
            match r.get(&key(i)) {
                Ok(got) if got.as_ref() == want.as_ref() => {}
                other => wrong.push((
                    i,
                    other.map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned())),
                )),
            }
        }
        assert!(
            wrong.is_empty(),
            "{when}: through node {n}, {} of {} keys read wrong, e.g. {:?}",
            wrong.len(),
            model.len(),
            &wrong[..wrong.len().min(5)]
        );
    }
}

/// Whole-region bytes of copy `j` of `partition`'s `region`, read from the node holding it.
fn copy_bytes(c: &LocalCluster, partition: NodeId, region: u16, j: u8) -> Vec<u8> {
    let g = &c.view().geometry;
    let len = match region {
        INDEX_REGION => g.index_table_bytes(),
        PAGE_REGION => g.page_table_bytes(),
        _ => g.data_table_bytes(),
    };
    let holder = ((partition as u32 + j as u32) % g.nodes) as NodeId;
    let mut ep = c.fabric().endpoint(holder);
    let mut buf = vec![0u8; len as usize];
    ep.read(
        RemoteAddr::new(holder, mirror_region(region, j), 0),
        &mut buf,
    )
    .unwrap();
    buf
}

#[test]
fn replication_settings_are_checked() {
    let err = |nodes, r| {
        LocalCluster::replicated(geometry(nodes), cfg(), None, r)
            .err()
            .map(|e: Error| e.to_string())
            .unwrap_or_default()
    };
    assert!(
        err(3, 0).contains("replicas = 0 is not in 1..=3"),
        "{}",
        err(3, 0)
    );
    assert!(err(4, 4).contains("replicas = 4 is not in 1..=3"));
    assert!(
        err(2, 3).contains("needs at least 3 nodes"),
        "{}",
        err(2, 3)
    );
    let ok = LocalCluster::replicated(geometry(3), cfg(), None, 3).unwrap();
    assert_eq!(ok.replicas(), 3);
}

#[test]
fn every_copy_holds_what_the_primary_holds() {
    for r in [2u8, 3] {
        let c = LocalCluster::replicated(geometry(3), cfg(), None, r).unwrap();
        let mut model = Model::new();
        write_round(&c, &[0, 1, 2], 300, 1, 0, &mut model);
        write_round(&c, &[2, 0, 1], 300, 2, 4, &mut model);
        assert_reads(&c, &[0, 1, 2], &model, "before any failure");
        for p in 0..3 {
            for region in [INDEX_REGION, DATA_REGION, PAGE_REGION] {
                let primary = copy_bytes(&c, p, region, 0);
                assert!(primary.iter().any(|&b| b != 0), "partition {p} is in use");
                for j in 1..r {
                    assert!(
                        copy_bytes(&c, p, region, j) == primary,
                        "R = {r}: copy {j} of node {p}'s region {region} differs from the primary"
                    );
                }
            }
        }
    }
}

#[test]
fn a_crashed_node_loses_no_acknowledged_write_and_writes_go_on() {
    let c = LocalCluster::replicated(geometry(3), cfg(), None, 2).unwrap();
    let mut model = Model::new();
    write_round(&c, &[0, 1, 2], 400, 1, 0, &mut model);
    write_round(&c, &[1, 2, 0], 400, 2, 5, &mut model);
    crash(&c, 1);
    assert_reads(&c, &[0, 2], &model, "after node 1 crashed");
    // Writes go on: the survivors take over node 1's slots and its entries' copies.
    write_round(&c, &[0, 2], 400, 3, 3, &mut model);
    assert_reads(&c, &[0, 2], &model, "after writing through the survivors");
}

#[test]
fn three_copies_survive_two_crashes() {
    let c = LocalCluster::replicated(geometry(4), cfg(), None, 3).unwrap();
    let mut model = Model::new();
    write_round(&c, &[0, 1, 2, 3], 400, 1, 7, &mut model);
    crash(&c, 2);
    assert_reads(&c, &[0, 1, 3], &model, "after node 2 crashed");
    write_round(&c, &[3, 1, 0], 400, 2, 6, &mut model);
    crash(&c, 0);
    assert_reads(&c, &[1, 3], &model, "after nodes 2 and 0 crashed");
    write_round(&c, &[1, 3], 400, 3, 5, &mut model);
    assert_reads(&c, &[1, 3], &model, "after writing through the last two");
}

/// Write 300 keys through every node, crash node 1, and count the keys node 0 no longer
/// reads right.
fn lost_to_a_crash(c: &LocalCluster) -> usize {
    let mut model = Model::new();
    write_round(c, &[0, 1, 2], 300, 1, 0, &mut model);
    crash(c, 1);
    let mut r = c.client(0).unwrap();
    model
        .iter()
        .filter(|(&i, want)| r.get(&key(i)).ok().as_ref() != Some(*want))
        .count()
}

/// The control: with one copy, the same crash makes keys unreadable (so the tests above can
/// fail).
#[test]
fn one_copy_loses_keys_to_a_crash() {
    let c = LocalCluster::replicated(geometry(3), cfg(), None, 1).unwrap();
    assert!(
        lost_to_a_crash(&c) > 0,
        "one copy and a crashed node, yet every key read back"
    );
}

/// A crashed node that membership has not yet declared failed: operations touching it wait for
/// the declaration, then use the other copies.
/// The mutation: with only the index replicated (DTEs written to their primary copy alone),
/// the crash test must find lost values.
#[test]
fn replicating_the_index_alone_is_caught() {
    let cfg = ProtocolConfig {
        mutations: Mutations {
            replicate_index_only: true,
            ..Mutations::default()
        },
        ..cfg()
    };
    let c = LocalCluster::replicated(geometry(3), cfg, None, 2).unwrap();
    assert!(
        lost_to_a_crash(&c) > 0,
        "the DTEs on node 1 had no other copy, yet every key read back"
    );
}

#[test]
fn operations_wait_for_the_failure_to_be_declared() {
    let c = LocalCluster::replicated(geometry(3), cfg(), None, 2).unwrap();
    let mut model = Model::new();
    write_round(&c, &[0, 1, 2], 200, 1, 0, &mut model);
    c.fabric().kill_node(1);
    let declared_after = Duration::from_millis(300);
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(declared_after);
            c.fail_node(1);
        });
        assert_reads(&c, &[0], &model, "while node 1's failure is being declared");
    });
    assert!(
        started.elapsed() >= declared_after,
        "some key needed node 1, so reading had to wait for the declaration"
    );
    write_round(&c, &[2], 200, 2, 3, &mut model);
    assert_reads(&c, &[0, 2], &model, "after the declaration");
}

/// PUT distinct keys with `value_max`-byte values through nodes 0 and 2 until the data tables
/// are full; how many went in.
fn fill_until_full(c: &LocalCluster) -> u64 {
    let vmax = c.view().geometry.value_max as usize;
    let mut writers = [c.client(0).unwrap(), c.client(2).unwrap()];
    for i in 0.. {
        match writers[(i % 2) as usize].put(&key(i), &vec![7u8; vmax]) {
            Ok(()) => {}
            Err(Error::DataTableFull { .. }) => return i,
            Err(e) => panic!("key {i}: {e}"),
        }
    }
    unreachable!()
}

/// Page tables are replicated too: after a crash the survivors go on claiming pages of the
/// failed node's data table (in its copies), so nearly all the memory stays usable.
#[test]
fn a_crashed_nodes_memory_stays_usable_through_its_copies() {
    let g = Geometry {
        ites_per_node: 1024,
        dtes_per_node: 96,
        ..geometry(3)
    };
    let whole = fill_until_full(&LocalCluster::replicated(g.clone(), cfg(), None, 2).unwrap());
    let c = LocalCluster::replicated(g, cfg(), None, 2).unwrap();
    crash(&c, 1);
    let after = fill_until_full(&c);
    eprintln!("{whole} entries fit the whole cluster, {after} after node 1 crashed");
    assert!(
        after * 10 >= whole * 9,
        "only {after} of {whole} entries fit once node 1 crashed: its memory was lost"
    );
}

/// Whether every copy held by `node` equals the same region of the partition's first copy on
/// another node (its primary), in every region. Stops the reclaimers first: a reclaimer's scan clears recycle words in every copy, one after the other, and a comparison
/// that read a copy in between would see them differ (it did, once, in CI).
fn copies_on_equal_primaries(c: &mut LocalCluster, node: NodeId, r: u8) -> bool {
    assert_eq!(c.stop_reclaimers(), 0, "a reclaimer panicked");
    let n = c.view().geometry.nodes as NodeId;
    (0..n).all(|p| {
        (0..r).filter(|&j| (p + j as NodeId) % n == node).all(|j| {
            let primary = (0..r).find(|&k| (p + k as NodeId) % n != node).unwrap();
            [INDEX_REGION, DATA_REGION, PAGE_REGION]
                .iter()
                .all(|&region| copy_bytes(c, p, region, j) == copy_bytes(c, p, region, primary))
        })
    })
}

/// Re-replication by rejoining: node 1 crashes, the others write on, node 1 restarts with
/// empty memory, receives its copies (catch-up) and becomes a full member. Its copies then
/// equal the primaries, its own workers write, and a second crash (node 2, which held the
/// only other copy of node 1's and node 2's partitions) loses nothing.
#[test]
fn a_restarted_node_catches_up_and_a_second_crash_loses_nothing() {
    let mut c = LocalCluster::replicated(geometry(3), cfg(), None, 2).unwrap();
    let mut model = Model::new();
    write_round(&c, &[0, 1, 2], 400, 1, 0, &mut model);
    crash(&c, 1);
    write_round(&c, &[0, 2], 400, 2, 5, &mut model);
    let caught = c.restart_node(1).unwrap();
    assert_eq!(
        caught.copies, 2,
        "node 1 holds copy 0 of its own partition and copy 1 of node 0's"
    );
    assert!(caught.words_changed > 0, "{caught:?}");
    assert!(
        copies_on_equal_primaries(&mut c, 1, 2),
        "after the catch-up, a copy on node 1 differs from its primary"
    );
    assert_reads(&c, &[0, 1, 2], &model, "after node 1 rejoined");
    write_round(&c, &[1, 0], 400, 3, 7, &mut model);
    crash(&c, 2);
    assert_reads(&c, &[0, 1], &model, "after node 2 crashed too");
    write_round(&c, &[0, 1], 400, 4, 3, &mut model);
    assert_reads(&c, &[0, 1], &model, "after writing through the last two");
}

/// The control: without the restart, the second crash loses keys (both copies of node 1's
/// partition are gone).
#[test]
fn without_the_rejoin_a_second_crash_loses_keys() {
    let c = LocalCluster::replicated(geometry(3), cfg(), None, 2).unwrap();
    let mut model = Model::new();
    write_round(&c, &[0, 1, 2], 400, 1, 0, &mut model);
    crash(&c, 1);
    write_round(&c, &[0, 2], 400, 2, 5, &mut model);
    crash(&c, 2);
    let mut r = c.client(0).unwrap();
    let unreadable = model.keys().filter(|&&i| r.get(&key(i)).is_err()).count();
    assert!(
        unreadable > 0,
        "every key still read after both copies of a partition went"
    );
}

/// A node restarted before its failure was declared is refused.
#[test]
fn a_node_must_be_declared_failed_before_it_restarts() {
    let c = LocalCluster::replicated(geometry(3), cfg(), None, 2).unwrap();
    c.fabric().kill_node(1);
    let e = c.restart_node(1).unwrap_err().to_string();
    assert!(e.contains("was not declared failed"), "{e}");
}

/// How fast [`rejoin_under_constant_writes`] copies: a pass over node 1's copies (about 270
/// KB) takes about 30 ms.
const CATCH_UP_BYTES_PER_S: u64 = 10_000_000;

/// Restart node 1 while writers on nodes 0 and 2 write without pause; afterwards, with the
/// writers stopped, every copy on node 1 equals its primary. Returns whether it did (`Err`:
/// the catch-up itself failed).
fn rejoin_under_constant_writes(mutations: Mutations) -> Result<bool, Error> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let cfg = ProtocolConfig { mutations, ..cfg() };
    let mut c = LocalCluster::replicated(geometry(3), cfg, None, 2).unwrap();
    let mut model = Model::new();
    write_round(&c, &[0, 1, 2], 300, 1, 0, &mut model);
    crash(&c, 1);
    let stop = AtomicBool::new(false);
    let puts = AtomicU64::new(0);
    let caught = std::thread::scope(|s| {
        for n in [0, 2] {
            let (c, stop, puts) = (&c, &stop, &puts);
            s.spawn(move || {
                let mut w = c.client(n).unwrap();
                let mut round = 10;
                while !stop.load(Ordering::SeqCst) {
                    for i in 0..300 {
                        w.put(&key(i), &value(i, round)).unwrap();
                        puts.fetch_add(1, Ordering::SeqCst);
                    }
                    round += 1;
                }
            });
        }
        // The writers stop as soon as node 1 is full again: later writes would overwrite
        // (and so hide) what its copies missed.
        // Paced, so that every pass overlaps many writes.
        let before = puts.load(Ordering::SeqCst);
        let r = c.restart_node_paced(1, CATCH_UP_BYTES_PER_S);
        stop.store(true, Ordering::SeqCst);
        r.map(|r| (r, puts.load(Ordering::SeqCst) - before))
    })?;
    let (caught, during) = caught;
    assert!(caught.words_changed > 0, "{caught:?}");
    assert!(
        during >= 100,
        "only {during} PUTs during the catch-up: {caught:?}"
    );
    eprintln!("{during} PUTs during the catch-up: {caught:?}");
    Ok(copies_on_equal_primaries(&mut c, 1, 2))
}

#[test]
fn a_rejoin_under_constant_writes_leaves_every_copy_equal() {
    assert_eq!(rejoin_under_constant_writes(Mutations::default()), Ok(true));
}

/// The mutation: writers skip the copies of the node catching up. The copies end up behind
/// their primaries, or before that the allocator's own invariants trip over a page table copy
/// that missed claims ("page ... was taken from us").
#[test]
fn a_rejoin_whose_copies_miss_writes_is_caught() {
    let m = Mutations {
        rejoin_skips_receiving: true,
        ..Mutations::default()
    };
    let r = std::panic::catch_unwind(|| rejoin_under_constant_writes(m));
    eprintln!("with the mutation: {r:?}");
    assert!(
        !matches!(r, Ok(Ok(true))),
        "copies that missed writes went unnoticed"
    );
}

/// A restarted node adopts the pages its earlier incarnation claimed (`ClassTable::adopt`):
/// once the keys written into them are deleted and their entries expire, its reclaimer gives
/// the pages back and the whole cluster's memory is usable again. Without adoption those pages
/// would stay claimed by nobody alive, for good.
#[test]
fn a_restarted_node_adopts_its_earlier_pages_and_gives_them_back() {
    let g = Geometry {
        ites_per_node: 1024,
        dtes_per_node: 96,
        ..geometry(3)
    };
    let whole = fill_until_full(&LocalCluster::replicated(g.clone(), cfg(), None, 2).unwrap());
    let c = LocalCluster::replicated(g, cfg(), None, 2).unwrap();
    let mut w = c.client(1).unwrap();
    let vmax = c.view().geometry.value_max as usize;
    for i in 0..60 {
        w.put(&key(100_000 + i), &vec![1u8; vmax]).unwrap();
    }
    let held: u64 = c.table(1).usage().iter().map(|u| u.pages).sum();
    assert!(held > 0, "node 1's writers claimed pages");
    crash(&c, 1);
    c.restart_node(1).unwrap();
    let adopted: u64 = c.table(1).usage().iter().map(|u| u.pages).sum();
    assert_eq!(
        adopted, held,
        "the restarted node holds its earlier incarnation's pages"
    );
    let mut d = c.client(0).unwrap();
    for i in 0..60 {
        d.delete(&key(100_000 + i)).unwrap();
    }
    // The deletes' own entries (tombstones) are recycled as they complete; wait out the expiry
    // and let node 1 scan.
    std::thread::sleep(Duration::from_nanos(3 * cfg().expiry_ns));
    c.table(1).reclaim(&mut c.endpoint(1)).unwrap();
    let left: u64 = c.table(1).usage().iter().map(|u| u.pages).sum();
    assert_eq!(
        left, 0,
        "node 1 gave every adopted page back once it was empty"
    );
    let after = fill_until_full(&c);
    eprintln!("{whole} entries fit the whole cluster, {after} after node 1's restart");
    assert!(
        after * 10 >= whole * 9,
        "only {after} of {whole} entries fit after the restart: pages were lost"
    );
}
