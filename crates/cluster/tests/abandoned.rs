//! Abandoned writes, driven through exact interleavings with hooks: writers that give up
//! complete their own leftovers, and those that cannot even do that (every read stalls past
//! the expiry) mark them given up, to be completed by whoever meets them next, reader or
//! writer, so that no key stays wedged.
//!
//! A writer W is run on its own thread; its hook parks or stalls it at chosen protocol points
//! while the test thread completes other operations, then lets it go on. Each scenario runs
//! with every optimisation on, with each one switched off in turn, and with all of them off.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread;
use std::time::Duration;

use nessie_cluster::LocalCluster;
use nessie_cluster::LocalEndpoint;
use nessie_fabric::Endpoint;
use nessie_protocols::cd::CdClient;
use nessie_protocols::hooks::Hook;
use nessie_protocols::{HookPoint, Optimizations, ProtocolConfig, RetryPolicy};
use nessie_store::Geometry;

/// A small index, so that keys can be made to share candidates.
fn geometry() -> Geometry {
    Geometry {
        nodes: 3,
        ites_per_node: 16,
        dtes_per_node: 64,
        key_max: 16,
        value_max: 32,
        hash_functions: 3,
        filter_bits: 7,
    }
}

fn cfg(o: Optimizations, attempts: u32) -> ProtocolConfig {
    ProtocolConfig {
        expiry_ns: 20_000_000,
        clock_margin_ns: 0,
        optimizations: o,
        retry: RetryPolicy {
            max_attempts: attempts,
            ..RetryPolicy::default()
        },
        ..ProtocolConfig::default()
    }
}

/// All on, each one off, all off.
fn optimisation_sets() -> Vec<(&'static str, Optimizations)> {
    let all = Optimizations::default();
    vec![
        ("all on", all),
        (
            "no filter bits",
            Optimizations {
                filter_bits: false,
                ..all
            },
        ),
        (
            "no cache",
            Optimizations {
                cache: false,
                ..all
            },
        ),
        (
            "no previous versions",
            Optimizations {
                previous_versions: false,
                ..all
            },
        ),
        (
            "no multi-read",
            Optimizations {
                multi_read: false,
                ..all
            },
        ),
        ("all off", Optimizations::NONE),
    ]
}

/// Two keys whose first candidates coincide: `x` sits in that slot, so `k` goes to its second.
fn colliding_keys(c: &LocalCluster) -> (Vec<u8>, Vec<u8>) {
    let index = &c.view().index;
    let k = b"K".to_vec();
    let kc = index.hashes(&k).all(index);
    for i in 0..100_000u32 {
        let x = format!("x{i}").into_bytes();
        let xc = index.hashes(&x).all(index);
        if xc[0] == kc[0] && !xc[1..].contains(&kc[1]) && kc[0] != kc[1] {
            return (k, x);
        }
    }
    panic!("no colliding key found");
}

/// Parks the writer at the first `AfterCandidateCas` until released, and stalls it past the
/// expiry period before the reverse pass of every attempt after the first.
fn park_then_stall(expiry_ns: u64) -> (Hook, Receiver<()>, Sender<()>) {
    let (parked_tx, parked_rx) = channel();
    let (go_tx, go_rx) = channel::<()>();
    let mut cas = 0;
    let mut reverse = 0;
    let hook = Box::new(move |p| match p {
        HookPoint::AfterCandidateCas => {
            cas += 1;
            if cas == 1 {
                parked_tx.send(()).unwrap();
                go_rx.recv().unwrap();
            }
        }
        HookPoint::BeforeReversePass => {
            reverse += 1;
            if reverse > 1 {
                thread::sleep(Duration::from_nanos(expiry_ns + 2_000_000));
            }
        }
        _ => {}
    });
    (hook, parked_rx, go_tx)
}

/// K sits in its second candidate because X holds the first. W's first attempt swaps K's
/// second candidate to its invalid DTE and is parked. X is deleted; P2 completes `p2_op` on K
/// in the first candidate, and its Step 4 clears W's DTE. W's reverse pass aborts; its second
/// attempt replaces what P2 left in the first candidate and times out; W gives up, completes
/// its leftover (its write takes effect after P2's) and succeeds. (When W undid instead, it
/// restored an older value here: a lost update.) Returns what K reads afterwards.
fn run_interleaving(
    o: Optimizations,
    p2_op: impl FnOnce(&mut CdClient<LocalEndpoint>, &[u8]),
) -> Option<Vec<u8>> {
    let c = LocalCluster::new(geometry(), cfg(o, 50), None).unwrap();
    let (k, x) = colliding_keys(&c);
    let mut p = c.client(1).unwrap();
    p.put(&x, b"x").unwrap();
    p.put(&k, b"old").unwrap();
    let index = &c.view().index;
    let kc = index.hashes(&k).all(index);
    let ite = |s| c.fabric().endpoint(0).read_u64(index.addr(s)).unwrap();
    assert_ne!(ite(kc[1]), 0, "K must sit in its second candidate");

    let expiry = c.config().expiry_ns;
    let mut w = c.client_with(0, cfg(o, 2)).unwrap();
    let (hook, parked, go) = park_then_stall(expiry);
    w.set_hook(Some(hook));
    let wk = k.clone();
    let writer = thread::spawn(move || {
        let r = w.put(&wk, b"w");
        (r, w.stats())
    });
    parked.recv().unwrap();
    p.delete(&x).unwrap();
    p2_op(&mut p, &k);
    go.send(()).unwrap();
    let (r, st) = writer.join().unwrap();
    assert!(
        r.is_ok(),
        "W completes its leftover when it gives up: {r:?}"
    );
    assert_eq!(st.timeouts, 1, "W's second attempt timed out: {st:?}");
    assert_eq!(
        st.rolled_forward, 1,
        "W's second DTE is rolled forward: {st:?}"
    );
    assert_eq!(st.leaked, 0, "{st:?}");
    let mut r = c.client_with(2, cfg(o, 50)).unwrap();
    let v = r.get(&k).unwrap();
    // The key is not wedged either: it can be written at once.
    r.put(&k, b"after").unwrap();
    assert_eq!(p.get(&k).unwrap().as_deref(), Some(&b"after"[..]));
    v
}

#[test]
fn a_write_that_gives_up_after_a_concurrent_put_takes_effect_after_it() {
    for (name, o) in optimisation_sets() {
        let v = run_interleaving(o, |p, k| p.put(k, b"p2").unwrap());
        assert_eq!(
            v.as_deref(),
            Some(&b"w"[..]),
            "{name}: W succeeded after put(K, p2) completed, yet K reads {:?}",
            v.as_deref().map(String::from_utf8_lossy)
        );
    }
}

#[test]
fn a_write_that_gives_up_after_a_concurrent_delete_takes_effect_after_it() {
    for (name, o) in optimisation_sets() {
        let v = run_interleaving(o, |p, k| p.delete(k).unwrap());
        assert_eq!(
            v.as_deref(),
            Some(&b"w"[..]),
            "{name}: W succeeded after delete(K) completed, yet K reads {:?}",
            v.as_deref().map(String::from_utf8_lossy)
        );
    }
}

/// A write whose every attempt stalls past the expiry period gives up and completes its
/// leftover, with each optimisation off in turn (with previous versions off the DTE's
/// previous-version pointer is empty, which rolling forward does not need).
#[test]
fn writes_that_give_up_complete_their_leftovers_with_each_optimisation_off() {
    for (name, o) in optimisation_sets() {
        for attempts in [1, 2] {
            abandon_and_check(name, o, attempts);
        }
    }
}

fn abandon_and_check(name: &str, o: Optimizations, attempts: u32) {
    {
        let c = LocalCluster::new(geometry(), cfg(o, 50), None).unwrap();
        let mut a = c.client_with(1, cfg(o, 50)).unwrap();
        a.put(b"k", b"old").unwrap();
        let mut w = c.client_with(0, cfg(o, attempts)).unwrap();
        let expiry = c.config().expiry_ns;
        w.set_hook(Some(Box::new(move |p| {
            if p == HookPoint::BeforeReversePass {
                thread::sleep(Duration::from_nanos(expiry + 2_000_000));
            }
        })));
        w.put(b"k", b"w")
            .unwrap_or_else(|e| panic!("{name}: put: {e}"));
        let mut b = c.client_with(2, cfg(o, 5)).unwrap();
        assert_eq!(b.get(b"k").unwrap().as_deref(), Some(&b"w"[..]), "{name}");
        w.delete(b"k")
            .unwrap_or_else(|e| panic!("{name}: delete: {e}"));
        assert_eq!(b.get(b"k").unwrap(), None, "{name}");
        w.put(b"new", b"w")
            .unwrap_or_else(|e| panic!("{name}: put new: {e}"));
        let st = w.stats();
        assert_eq!((st.rolled_forward, st.leaked), (3, 0), "{name}: {st:?}");
        assert_eq!(b.get(b"new").unwrap().as_deref(), Some(&b"w"[..]), "{name}");
        b.put(b"k", b"b")
            .unwrap_or_else(|e| panic!("{name}: key wedged: {e}"));
        b.put(b"new", b"b")
            .unwrap_or_else(|e| panic!("{name}: key wedged: {e}"));
        assert_eq!(a.get(b"k").unwrap().as_deref(), Some(&b"b"[..]), "{name}");
    }
}

/// A write that took another writer's in-progress DTE out of the index (its Step 4 clears a
/// duplicate) and then gives up completes its own entry; the other writer, resumed, finds its
/// entry gone and writes again. K's first candidate is held by X; W2 publishes its DTE in K's
/// second candidate and is parked; X is deleted; W publishes in the first candidate, clears
/// W2's DTE, then times out once and gives up.
#[test]
fn a_write_that_removed_another_in_progress_write_completes_instead_of_wedging_the_key() {
    for (name, o) in optimisation_sets() {
        let c = LocalCluster::new(geometry(), cfg(o, 50), None).unwrap();
        let (k, x) = colliding_keys(&c);
        let mut p = c.client(1).unwrap();
        p.put(&x, b"x").unwrap();

        let mut w2 = c.client_with(2, cfg(o, 20)).unwrap();
        let (parked_tx, parked_rx) = channel();
        let (go_tx, go_rx) = channel::<()>();
        let mut cas = 0;
        w2.set_hook(Some(Box::new(move |pt| {
            if pt == HookPoint::AfterCandidateCas {
                cas += 1;
                if cas == 1 {
                    parked_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                }
            }
        })));
        let wk = k.clone();
        let other = thread::spawn(move || w2.put(&wk, b"w2"));
        parked_rx.recv().unwrap();
        p.delete(&x).unwrap();

        let expiry = c.config().expiry_ns;
        let mut w = c.client_with(0, cfg(o, 1)).unwrap();
        let mut stalls = 1;
        w.set_hook(Some(Box::new(move |pt| {
            if pt == HookPoint::BeforeReversePass && stalls > 0 {
                stalls -= 1;
                thread::sleep(Duration::from_nanos(expiry + 2_000_000));
            }
        })));
        let r = w.put(&k, b"w");
        let st = w.stats();
        go_tx.send(()).unwrap();
        let r2 = other.join().unwrap();
        assert!(r.is_ok(), "{name}: W failed: {r:?} {st:?}");
        assert_eq!((st.rolled_forward, st.leaked), (1, 0), "{name}: {st:?}");
        let mut q = c.client_with(1, cfg(o, 20)).unwrap();
        let v = q.get(&k).unwrap();
        match r2 {
            Ok(()) => assert!(
                v.as_deref() == Some(b"w2") || v.as_deref() == Some(b"w"),
                "{name}: {v:?}"
            ),
            Err(e) => panic!("{name}: W2 failed: {e}"),
        }
        q.put(&k, b"after")
            .unwrap_or_else(|e| panic!("{name}: key wedged: {e}"));
    }
}

/// How many ITEs of the whole cluster are not empty.
fn occupancy(c: &LocalCluster) -> usize {
    let index = &c.view().index;
    let g = &c.view().geometry;
    let mut ep = c.fabric().endpoint(0);
    (0..g.nodes as u64 * g.ites_per_node)
        .filter(|&s| !nessie_store::Ite(ep.read_u64(index.addr(s)).unwrap()).is_empty())
        .count()
}

/// Run `op` on W (a client of node 0, one attempt per operation) so that it gives up and
/// cannot complete its leftover either: it stalls past the expiry right after its candidate
/// CAS, then on every ITE read. It marks its entry given up and fails.
fn give_up_entirely(
    c: &LocalCluster,
    o: Optimizations,
    op: impl FnOnce(&mut CdClient<LocalEndpoint>) -> Result<(), nessie_protocols::Error>,
) {
    let mut w = c.client_with(0, cfg(o, 1)).unwrap();
    let stall = Duration::from_nanos(c.config().expiry_ns + 2_000_000);
    let mut published = false;
    w.set_hook(Some(Box::new(move |p| match p {
        HookPoint::AfterCandidateCas => {
            published = true;
            thread::sleep(stall);
        }
        HookPoint::AfterIteRead if published => thread::sleep(stall),
        _ => {}
    })));
    let r = op(&mut w);
    assert!(r.is_err(), "W must fail: {r:?}");
    let st = w.stats();
    assert_eq!(st.rolled_forward, 0, "{st:?}");
    assert_eq!(
        st.leaked, 0,
        "what it staged is recycled or handed over: {st:?}"
    );
}

/// An insert given up on (no previous version for readers to fall back on) would make every
/// GET of the key fail forever; the next reader completes it, and the value appears: the
/// failed write took effect.
#[test]
fn a_reader_completes_an_insert_given_up_on() {
    for (name, o) in optimisation_sets() {
        let c = LocalCluster::new(geometry(), cfg(o, 50), None).unwrap();
        give_up_entirely(&c, o, |w| w.put(b"n", b"given up"));
        let mut r = c.client_with(2, cfg(o, 50)).unwrap();
        assert_eq!(
            r.get(b"n").unwrap().as_deref(),
            Some(&b"given up"[..]),
            "{name}"
        );
        let st = r.stats();
        assert_eq!(
            st.rolled_forward, 1,
            "{name}: the reader completed it: {st:?}"
        );
        r.put(b"n", b"after")
            .unwrap_or_else(|e| panic!("{name}: key wedged: {e}"));
        assert_eq!(r.get(b"n").unwrap().as_deref(), Some(&b"after"[..]));
    }
}

/// An update given up on: readers keep answering with the previous version, and the next
/// writer of the key completes it before its own, which wins.
#[test]
fn a_writer_completes_an_update_given_up_on_before_its_own() {
    for (name, o) in optimisation_sets() {
        let c = LocalCluster::new(geometry(), cfg(o, 50), None).unwrap();
        let mut b = c.client_with(1, cfg(o, 50)).unwrap();
        b.put(b"k", b"old").unwrap();
        give_up_entirely(&c, o, |w| w.put(b"k", b"given up"));
        if o.previous_versions {
            let mut r = c.client_with(2, cfg(o, 50)).unwrap();
            assert_eq!(r.get(b"k").unwrap().as_deref(), Some(&b"old"[..]), "{name}");
            assert_eq!(r.stats().rolled_forward, 0, "{name}: readers need not help");
        }
        b.put(b"k", b"new")
            .unwrap_or_else(|e| panic!("{name}: key wedged: {e}"));
        assert_eq!(b.stats().rolled_forward, 1, "{name}: {:?}", b.stats());
        assert_eq!(b.get(b"k").unwrap().as_deref(), Some(&b"new"[..]), "{name}");
        assert_eq!(occupancy(&c), 1, "{name}: one ITE for the key");
    }
}

/// A DELETE given up on is completed by emptying its candidate: the next write of the key
/// finishes it, and the key is gone.
#[test]
fn a_delete_given_up_on_is_completed() {
    for (name, o) in optimisation_sets() {
        let c = LocalCluster::new(geometry(), cfg(o, 50), None).unwrap();
        let mut b = c.client_with(1, cfg(o, 50)).unwrap();
        b.put(b"k", b"old").unwrap();
        give_up_entirely(&c, o, |w| w.delete(b"k"));
        b.put(b"other", b"x").unwrap();
        b.delete(b"k")
            .unwrap_or_else(|e| panic!("{name}: key wedged: {e}"));
        assert_eq!(b.stats().rolled_forward, 1, "{name}: {:?}", b.stats());
        assert_eq!(b.get(b"k").unwrap(), None, "{name}");
        assert_eq!(occupancy(&c), 1, "{name}: only `other` is left");
    }
}

/// Run `op` on W (a client of node 0) on its own thread and crash it right after its
/// candidate CAS: the thread dies (a panic), leaving W's invalid DTE in the index with nobody
/// to finish it. Returns once the thread is gone.
fn crash_after_cas(
    c: &LocalCluster,
    o: Optimizations,
    op: impl FnOnce(&mut CdClient<LocalEndpoint>) + Send + 'static,
) {
    let mut w = c.client_with(0, cfg(o, 5)).unwrap();
    w.set_hook(Some(Box::new(|p| {
        if p == HookPoint::AfterCandidateCas {
            panic!("W crashes after its CAS (simulated)");
        }
    })));
    let crashed = thread::spawn(move || op(&mut w)).join();
    assert!(crashed.is_err(), "W must have crashed");
}

/// Wait until entries written now are past their deadline by the margin and an expiry period.
fn past_grace(c: &LocalCluster) {
    let cfg = c.config();
    thread::sleep(Duration::from_nanos(
        2 * cfg.expiry_ns + cfg.clock_margin_ns + 5_000_000,
    ));
}

/// A crashed writer's insert wedges the key (no previous version to answer with) for as long
/// as its node counts as alive, however old the entry: time alone does not prove a writer
/// dead. Once membership declares the node failed, the next reader completes it.
#[test]
fn a_crashed_insert_is_completed_once_its_node_failed() {
    for (name, o) in optimisation_sets() {
        let c = LocalCluster::new(geometry(), cfg(o, 50), None).unwrap();
        crash_after_cas(&c, o, |w| {
            let _ = w.put(b"n", b"crashed");
        });
        past_grace(&c);
        let mut r = c.client_with(2, cfg(o, 5)).unwrap();
        assert!(
            matches!(r.get(b"n"), Err(nessie_protocols::Error::Contended { .. })),
            "{name}: an entry of a live node is not completed"
        );
        c.fail_node(0);
        let mut r = c.client_with(2, cfg(o, 50)).unwrap();
        assert_eq!(
            r.get(b"n").unwrap().as_deref(),
            Some(&b"crashed"[..]),
            "{name}"
        );
        assert_eq!(r.stats().rolled_forward, 1, "{name}: {:?}", r.stats());
        r.put(b"n", b"after")
            .unwrap_or_else(|e| panic!("{name}: key wedged: {e}"));
    }
}

/// A crashed writer's update and delete, completed by the next writer once the node failed.
#[test]
fn crashed_updates_and_deletes_are_completed_once_their_node_failed() {
    for (name, o) in optimisation_sets() {
        let c = LocalCluster::new(geometry(), cfg(o, 50), None).unwrap();
        let mut b = c.client_with(1, cfg(o, 50)).unwrap();
        b.put(b"u", b"old").unwrap();
        b.put(b"d", b"old").unwrap();
        crash_after_cas(&c, o, |w| {
            let _ = w.put(b"u", b"crashed");
        });
        crash_after_cas(&c, o, |w| {
            let _ = w.delete(b"d");
        });
        c.fail_node(0);
        past_grace(&c);
        b.put(b"u", b"new")
            .unwrap_or_else(|e| panic!("{name}: key wedged: {e}"));
        b.put(b"d", b"new")
            .unwrap_or_else(|e| panic!("{name}: key wedged: {e}"));
        assert_eq!(b.stats().rolled_forward, 2, "{name}: {:?}", b.stats());
        assert_eq!(b.get(b"u").unwrap().as_deref(), Some(&b"new"[..]), "{name}");
        assert_eq!(b.get(b"d").unwrap().as_deref(), Some(&b"new"[..]), "{name}");
        assert_eq!(occupancy(&c), 2, "{name}: one ITE per key");
    }
}

/// A writer of a failed node that was only paused (parked right after its CAS while its node
/// was declared failed and its entry completed by another node) is fenced when it resumes:
/// it writes nothing more, so its value is not applied a second time after the write that
/// followed the completion.
#[test]
fn a_paused_writer_of_a_failed_node_is_fenced_and_writes_nothing_more() {
    for (name, o) in optimisation_sets() {
        let c = LocalCluster::new(geometry(), cfg(o, 50), None).unwrap();
        let mut b = c.client_with(1, cfg(o, 50)).unwrap();
        b.put(b"k", b"old").unwrap();
        let mut w = c.client_with(0, cfg(o, 50)).unwrap();
        let (parked_tx, parked_rx) = channel();
        let (go_tx, go_rx) = channel::<()>();
        let mut first = true;
        w.set_hook(Some(Box::new(move |p| {
            if p == HookPoint::AfterCandidateCas && std::mem::take(&mut first) {
                parked_tx.send(()).unwrap();
                go_rx.recv().unwrap();
            }
        })));
        let writer = thread::spawn(move || (w.put(b"k", b"paused"), w.stats()));
        parked_rx.recv().unwrap();
        c.fail_node(0);
        past_grace(&c);
        // Completes W's entry (its value becomes visible), then writes its own.
        b.put(b"k", b"later").unwrap();
        assert_eq!(b.stats().rolled_forward, 1, "{name}: {:?}", b.stats());
        go_tx.send(()).unwrap();
        let (r, st) = writer.join().unwrap();
        assert!(
            matches!(r, Err(nessie_protocols::Error::Fenced { node: 0 })),
            "{name}: {r:?} {st:?}"
        );
        assert_eq!(
            b.get(b"k").unwrap().as_deref(),
            Some(&b"later"[..]),
            "{name}"
        );
        let mut fenced = c.client_with(0, cfg(o, 50)).unwrap();
        assert!(
            matches!(
                fenced.put(b"x", b"y"),
                Err(nessie_protocols::Error::Fenced { .. })
            ),
            "{name}"
        );
        assert_eq!(
            fenced.get(b"k").unwrap().as_deref(),
            Some(&b"later"[..]),
            "{name}: reads go on"
        );
    }
}
