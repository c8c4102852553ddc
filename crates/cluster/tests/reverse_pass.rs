//! The PUT reverse pass (Appendix A.1.3 Step 5), driven through an exact interleaving: while a
//! writer is between its candidate search and its CAS, the key's old entry is moved (as a
//! MIGRATE would) from a later candidate into an earlier one the writer has already passed.
//! Only the reverse pass notices; a writer that skips it leaves the old entry shadowing the new
//! value in an earlier candidate.

use std::sync::mpsc::channel;
use std::thread;

use nessie_cluster::LocalCluster;
use nessie_fabric::Endpoint;
use nessie_protocols::{HookPoint, Mutations, ProtocolConfig};
use nessie_store::index::Slot;
use nessie_store::{Geometry, Ite};

fn geometry() -> Geometry {
    Geometry {
        nodes: 3,
        ites_per_node: 32,
        dtes_per_node: 64,
        key_max: 16,
        value_max: 32,
        hash_functions: 3,
        filter_bits: 7,
    }
}

fn cfg(mutations: Mutations) -> ProtocolConfig {
    ProtocolConfig {
        expiry_ns: 1_000_000_000,
        clock_margin_ns: 0,
        mutations,
        ..ProtocolConfig::default()
    }
}

/// A key whose first candidate is `slot` and whose other candidates avoid `avoid`.
fn key_with_first(c: &LocalCluster, slot: Slot, avoid: &[Slot], prefix: &str) -> Vec<u8> {
    let index = &c.view().index;
    (0..1_000_000u32)
        .map(|i| format!("{prefix}{i}").into_bytes())
        .find(|k| {
            let s = index.hashes(k).all(index);
            s[0] == slot && s[1..].iter().all(|x| !avoid.contains(x))
        })
        .expect("a key with that first candidate")
}

/// Runs the interleaving; returns what K reads after the writer's PUT completed.
fn put_while_the_old_entry_moves_back(mutations: Mutations) -> Option<Vec<u8>> {
    let c = LocalCluster::new(geometry(), cfg(mutations), None).unwrap();
    let index = c.view().index.clone();
    let k = b"K".to_vec();
    let kc = index.hashes(&k).all(&index);
    assert!(kc[0] != kc[1] && kc[1] != kc[2] && kc[0] != kc[2]);
    let y = key_with_first(&c, kc[0], &kc, "y");
    let z = key_with_first(&c, kc[1], &kc, "z");

    // K's old value in its third candidate: Y holds the first, Z held the second.
    let mut p = c.client(1).unwrap();
    p.put(&y, b"y").unwrap();
    p.put(&z, b"z").unwrap();
    p.put(&k, b"old").unwrap();
    p.delete(&z).unwrap();
    let mut ep = c.fabric().endpoint(2);
    let old = ep.read_u64(index.addr(kc[2])).unwrap();
    assert!(!Ite(old).is_empty(), "K must sit in its third candidate");

    // The writer reads candidate 0 (Y) and candidate 1 (empty: its choice), then waits.
    let mut w = c.client_with(0, cfg(mutations)).unwrap();
    let (parked_tx, parked_rx) = channel();
    let (go_tx, go_rx) = channel::<()>();
    let mut reads = 0;
    w.set_hook(Some(Box::new(move |pt| {
        if pt == HookPoint::AfterIteRead {
            reads += 1;
            if reads == 2 {
                parked_tx.send(()).unwrap();
                go_rx.recv().unwrap();
            }
        }
    })));
    let writer = thread::spawn(move || w.put(b"K", b"new"));
    parked_rx.recv().unwrap();
    // Y goes; K's old entry moves from its third candidate to its first, as a MIGRATE
    // would move it (copy into the empty destination, then empty the source).
    p.delete(&y).unwrap();
    // Each CAS installs the next sequence number, as the protocol's own do.
    let empty = ep.read_u64(index.addr(kc[0])).unwrap();
    assert!(Ite(empty).is_empty());
    let moved = index.ite.successor(Ite(empty), Ite(old));
    assert_eq!(
        ep.compare_and_swap(index.addr(kc[0]), empty, moved.0)
            .unwrap(),
        empty
    );
    let emptied = index.ite.successor(Ite(old), Ite::EMPTY);
    assert_eq!(
        ep.compare_and_swap(index.addr(kc[2]), old, emptied.0)
            .unwrap(),
        old
    );
    go_tx.send(()).unwrap();
    writer.join().unwrap().unwrap();
    c.client(2).unwrap().get(&k).unwrap()
}

#[test]
fn put_reverse_pass_catches_an_entry_moved_behind_the_writer() {
    let v = put_while_the_old_entry_moves_back(Mutations::default());
    assert_eq!(v.as_deref(), Some(&b"new"[..]));
}

#[test]
fn mutation_skipping_the_put_reverse_pass_is_caught() {
    let v = put_while_the_old_entry_moves_back(Mutations {
        skip_put_reverse_pass: true,
        ..Mutations::default()
    });
    assert_eq!(
        v.as_deref(),
        Some(&b"old"[..]),
        "without the reverse pass the moved old entry shadows the completed PUT"
    );
}
