//! Client members (`docs/design/client-members.md`, steps 1 and 2): a process that is not a
//! node runs the client-driven protocol with an id past the nodes', no memory of its own, an
//! allocator that claims only the nodes' pages and a membership view of its own. In process
//! here ([`LocalCluster::member_client`]); the same rules a node's writers follow must hold
//! for it: what it acknowledges survives a node's crash, an entry it leaves is completed only
//! once it is declared failed, and once fenced it writes nothing more.

#[allow(dead_code)] // each test binary uses its own part
mod common;

use std::sync::mpsc::channel;
use std::thread;
use std::time::Duration;

use common::{cfg, crash, geometry, key, value, Model};
use nessie_cluster::LocalCluster;
use nessie_fabric::NodeId;
use nessie_protocols::{Error, HookPoint};

/// The client member's id: past the 3 nodes, and not a multiple of 3 (its first host is 1).
const CLIENT: NodeId = 7;
const KEYS: u64 = 120;

fn past_grace(c: &LocalCluster) {
    let cfg = c.config();
    thread::sleep(Duration::from_nanos(
        2 * cfg.expiry_ns + cfg.clock_margin_ns + 5_000_000,
    ));
}

/// Every key of `model` reads as acknowledged through a worker of each node and the client.
fn all_agree(c: &LocalCluster, model: &Model, what: &str) {
    let mut readers: Vec<_> = (0..3).map(|n| c.client(n).unwrap()).collect();
    readers.push(c.member_client(CLIENT).unwrap());
    for (i, want) in model {
        for (r, reader) in readers.iter_mut().enumerate() {
            let got = reader.get(&key(*i)).unwrap();
            assert_eq!(&got, want, "{what}: key {i} through reader {r}");
        }
    }
}

/// With one copy and with two: the client's writes land on the nodes' pages only, and read
/// back alike through every node and the client; its deletes too.
#[test]
fn a_client_member_writes_into_the_nodes_memory_and_reads_like_a_node() {
    for replicas in [1, 2] {
        let c = LocalCluster::replicated(geometry(3), cfg(), None, replicas).unwrap();
        assert!(c.member_client(1).is_err(), "a node's id is not a client's");
        let mut w = c.member_client(CLIENT).unwrap();
        let mut model = Model::new();
        for i in 0..KEYS {
            if i % 7 == 3 {
                w.delete(&key(i)).unwrap();
                model.insert(i, None);
            } else {
                w.put(&key(i), &value(i, 1)).unwrap();
                model.insert(i, Some(value(i, 1)));
            }
        }
        all_agree(&c, &model, &format!("R={replicas}"));
        let t = c.member_table(CLIENT).unwrap();
        let usage = t.usage();
        let pages: u64 = usage.iter().map(|u| u.pages).sum();
        let remote: u64 = usage.iter().map(|u| u.remote_pages).sum();
        assert!(pages > 0, "the client claimed pages");
        assert_eq!(
            pages, remote,
            "R={replicas}: every page it holds is a node's"
        );
        // A node's writer overwrites what the client wrote, and the client sees it.
        let mut n0 = c.client(0).unwrap();
        n0.put(&key(0), b"by node 0").unwrap();
        assert_eq!(w.get(&key(0)).unwrap().as_deref(), Some(&b"by node 0"[..]));
    }
}

/// A client that crashes right after its candidate CAS leaves an invalid entry tagged with
/// its id. However old, the entry is not completed while the client counts as alive (time
/// alone does not prove a writer dead); once it is declared failed, the next reader completes
/// it and the key is writable again.
#[test]
fn a_crashed_clients_insert_is_completed_once_it_is_declared_failed() {
    let c = LocalCluster::new(geometry(3), cfg(), None).unwrap();
    let mut w = c.member_client(CLIENT).unwrap();
    w.set_hook(Some(Box::new(|p| {
        if p == HookPoint::AfterCandidateCas {
            panic!("the client crashes after its CAS (simulated)");
        }
    })));
    let crashed = thread::spawn(move || {
        let _ = w.put(b"n", b"crashed");
    })
    .join();
    assert!(crashed.is_err(), "the client must have crashed");
    past_grace(&c);
    let mut r = c.client(2).unwrap();
    assert!(
        matches!(r.get(b"n"), Err(Error::Contended { .. })),
        "an entry of a live client is not completed"
    );
    c.fail_client(CLIENT);
    let mut r = c.client(2).unwrap();
    assert_eq!(r.get(b"n").unwrap().as_deref(), Some(&b"crashed"[..]));
    assert_eq!(r.stats().rolled_forward, 1, "{:?}", r.stats());
    r.put(b"n", b"after").unwrap();
    assert_eq!(
        c.client(0).unwrap().get(b"n").unwrap().as_deref(),
        Some(&b"after"[..])
    );
}

/// A client paused right after its candidate CAS while its lease lapsed (declared failed, its
/// entry completed by a node's writer, which then writes its own value) is fenced when it
/// resumes: its value is not applied a second time over the later one, and it starts no write.
#[test]
fn a_paused_client_is_fenced_and_writes_nothing_more() {
    let c = LocalCluster::new(geometry(3), cfg(), None).unwrap();
    let mut b = c.client(1).unwrap();
    b.put(b"k", b"old").unwrap();
    let mut w = c.member_client(CLIENT).unwrap();
    let (parked_tx, parked_rx) = channel();
    let (go_tx, go_rx) = channel::<()>();
    let mut first = true;
    w.set_hook(Some(Box::new(move |p| {
        if p == HookPoint::AfterCandidateCas && std::mem::take(&mut first) {
            parked_tx.send(()).unwrap();
            go_rx.recv().unwrap();
        }
    })));
    let writer = thread::spawn(move || (w.put(b"k", b"paused"), w));
    parked_rx.recv().unwrap();
    c.fence_client(CLIENT);
    past_grace(&c);
    b.put(b"k", b"later").unwrap();
    assert_eq!(b.stats().rolled_forward, 1, "{:?}", b.stats());
    go_tx.send(()).unwrap();
    let (r, mut w) = writer.join().unwrap();
    assert!(
        matches!(r, Err(Error::Fenced { node: CLIENT })),
        "{r:?} {:?}",
        w.stats()
    );
    assert!(matches!(w.put(b"x", b"y"), Err(Error::Fenced { .. })));
    assert_eq!(b.get(b"k").unwrap().as_deref(), Some(&b"later"[..]));
    assert_eq!(
        b.get(b"x").unwrap(),
        None,
        "the fenced client wrote nothing"
    );
}

/// With two copies, what the client acknowledged survives the crash of a node holding pages
/// it wrote into, and the client goes on writing on the survivors.
#[test]
fn a_clients_acknowledged_writes_survive_a_node_crash() {
    let c = LocalCluster::replicated(geometry(3), cfg(), None, 2).unwrap();
    let mut w = c.member_client(CLIENT).unwrap();
    let mut model = Model::new();
    for i in 0..KEYS {
        w.put(&key(i), &value(i, 1)).unwrap();
        model.insert(i, Some(value(i, 1)));
    }
    // Node 1 is the client's first host: it holds the client's first pages.
    crash(&c, 1);
    let mut readers = [c.client(0).unwrap(), c.client(2).unwrap(), w];
    for (i, want) in &model {
        for (r, reader) in readers.iter_mut().enumerate() {
            assert_eq!(&reader.get(&key(*i)).unwrap(), want, "key {i}, reader {r}");
        }
    }
    let w = readers.last_mut().unwrap();
    for i in 0..KEYS / 2 {
        w.put(&key(i), &value(i, 2)).unwrap();
        model.insert(i, Some(value(i, 2)));
    }
    for (i, want) in &model {
        let got = c.client(2).unwrap().get(&key(*i)).unwrap();
        assert_eq!(&got, want, "after the crash: key {i}");
    }
}
