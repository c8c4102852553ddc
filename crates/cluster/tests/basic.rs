//! Single-threaded behaviour of the client-driven protocol on an in-process cluster.

use std::collections::HashMap;

use nessie_cluster::LocalCluster;
use nessie_protocols::{Error, Optimizations, ProtocolConfig};
use nessie_store::classtable::{owner_share, RESERVE_PAGES};
use nessie_store::Geometry;
use proptest::prelude::*;

fn small_geometry() -> Geometry {
    Geometry {
        nodes: 3,
        ites_per_node: 64,
        dtes_per_node: 256,
        key_max: 16,
        value_max: 64,
        hash_functions: 3,
        filter_bits: 7,
    }
}

fn fast_cfg() -> ProtocolConfig {
    ProtocolConfig {
        expiry_ns: 2_000_000,
        clock_margin_ns: 0,
        ..ProtocolConfig::default()
    }
}

#[test]
fn put_get_delete_across_nodes() {
    let c = LocalCluster::new(small_geometry(), fast_cfg(), None).unwrap();
    let mut a = c.client(0).unwrap();
    let mut b = c.client(2).unwrap();
    assert_eq!(a.get(b"k").unwrap(), None);
    a.put(b"k", b"v1").unwrap();
    assert_eq!(
        b.get(b"k").unwrap().as_deref(),
        Some(&b"v1"[..]),
        "remote reader sees the write"
    );
    b.put(b"k", b"v2").unwrap();
    assert_eq!(a.get(b"k").unwrap().as_deref(), Some(&b"v2"[..]));
    a.delete(b"k").unwrap();
    assert_eq!(b.get(b"k").unwrap(), None);
    b.delete(b"k").unwrap(); // deleting an absent key is fine
    a.put(b"empty", b"").unwrap();
    assert_eq!(
        b.get(b"empty").unwrap().as_deref(),
        Some(&b""[..]),
        "empty value is not absence"
    );
}

#[test]
fn invalid_sizes_are_rejected_before_touching_memory() {
    let c = LocalCluster::new(small_geometry(), fast_cfg(), None).unwrap();
    let mut a = c.client(0).unwrap();
    let before = c.fabric().stats().total(None);
    assert_eq!(
        a.put(&[1u8; 17], b"v"),
        Err(Error::KeyTooLarge { len: 17, max: 16 })
    );
    assert_eq!(
        a.put(b"k", &[0u8; 65]),
        Err(Error::ValueTooLarge { len: 65, max: 64 })
    );
    assert_eq!(a.get(b""), Err(Error::EmptyKey));
    assert_eq!(
        a.delete(&[0u8; 100]),
        Err(Error::KeyTooLarge { len: 100, max: 16 })
    );
    assert_eq!(
        c.fabric().stats().total(None),
        before,
        "no fabric operation was issued"
    );
    assert!(Error::KeyTooLarge { len: 17, max: 16 }
        .to_string()
        .contains("key_max of 16"));
    // Keys and values exactly at the limits work.
    a.put(&[7u8; 16], &[9u8; 64]).unwrap();
    assert_eq!(a.get(&[7u8; 16]).unwrap().unwrap(), vec![9u8; 64]);
}

#[test]
fn bad_configuration_is_reported() {
    let mut g = small_geometry();
    g.hash_functions = 1;
    let e = LocalCluster::new(g, fast_cfg(), None).err().unwrap();
    assert!(e.to_string().contains("hash_functions"), "{e}");
    let cfg = ProtocolConfig {
        clock_margin_ns: 5_000_000,
        ..fast_cfg()
    };
    assert!(LocalCluster::new(small_geometry(), cfg, None)
        .err()
        .unwrap()
        .to_string()
        .contains("clock margin"));
    let c = LocalCluster::new(small_geometry(), fast_cfg(), None).unwrap();
    assert!(c.client(3).err().unwrap().to_string().contains("no node 3"));
}

#[test]
fn full_index_gives_a_clear_error_and_loses_nothing() {
    let g = Geometry {
        nodes: 1,
        ites_per_node: 8,
        dtes_per_node: 64,
        ..small_geometry()
    };
    let c = LocalCluster::new(g, fast_cfg(), None).unwrap();
    let mut a = c.client(0).unwrap();
    let mut stored = Vec::new();
    let mut saw_full = false;
    for i in 0..20u32 {
        match a.put(&i.to_le_bytes(), &i.to_be_bytes()) {
            Ok(()) => stored.push(i),
            Err(Error::IndexFull { .. }) => saw_full = true,
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert!(saw_full, "20 keys cannot fit in 8 slots");
    assert!(
        a.stats().migrations > 0,
        "filling the index needed migrations: {:?}",
        a.stats()
    );
    assert!(
        stored.len() <= 8 && stored.len() >= 4,
        "stored {}",
        stored.len()
    );
    for i in &stored {
        assert_eq!(
            a.get(&i.to_le_bytes()).unwrap().unwrap(),
            i.to_be_bytes(),
            "key {i} survived migrations"
        );
    }
    assert_eq!(c.index_occupancy().unwrap(), stored.len() as u64);
}

/// Entries of the class of a 2-byte key and 1-byte value that one writer node can place: its
/// own pages but the delete reserve, and other nodes' pages but the reserve and the share left
/// to their own writers.
fn small_entry_capacity(c: &LocalCluster) -> u64 {
    let v = c.view();
    let per_page = v.classes.per_page(v.classes.class_for(2, 1).unwrap());
    let pages = v.geometry.data_pages_per_node();
    let own = pages - RESERVE_PAGES;
    let others = (v.geometry.nodes as u64 - 1) * (own - owner_share(pages));
    per_page * (own + others)
}

/// Key number `i` of the fill tests.
fn key(i: u64) -> [u8; 2] {
    (i as u16).to_be_bytes()
}

/// A writer whose own memory is full places its values on other nodes; only when every node's
/// memory is full does a write fail, with an error that says so, and nothing changes.
#[test]
fn full_data_tables_give_a_clear_error_only_when_every_node_is_full() {
    let g = Geometry {
        dtes_per_node: 100,
        ites_per_node: 1024,
        ..small_geometry()
    };
    // A long expiry: released entries are not reusable during the test.
    let cfg = ProtocolConfig {
        expiry_ns: 60_000_000_000,
        ..ProtocolConfig::default()
    };
    let cfg = ProtocolConfig {
        retry: nessie_protocols::RetryPolicy {
            max_attempts: 1,
            ..cfg.retry
        },
        ..cfg
    };
    let c = LocalCluster::new(g, cfg, None).unwrap();
    let capacity = small_entry_capacity(&c);
    assert!(
        capacity < 1000,
        "the test's index cannot hold {capacity} keys"
    );
    let mut a = c.client(1).unwrap();
    let mut stored = 0u64;
    let e = loop {
        match a.put(&key(stored), b"x") {
            Ok(()) => stored += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(stored, capacity, "every node's memory was used: {e}");
    let u = c.table(1).usage();
    let remote: u64 = u.iter().map(|u| u.remote_pages).sum();
    // Every other node's pages but its reserve and its owner's share.
    let pages = c.view().geometry.data_pages_per_node();
    let each = pages - RESERVE_PAGES - owner_share(pages);
    assert_eq!(remote, 2 * each, "{each} pages on each other node: {u:?}");
    assert!(
        matches!(
            e,
            Error::DataTableFull {
                node: 1,
                awaiting_expiry: 0,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("data tables full"), "{e}");
    a.put(&key(0), b"y").unwrap_err(); // overwrite also needs a new DTE
    assert_eq!(
        a.get(&key(0)).unwrap().as_deref(),
        Some(&b"x"[..]),
        "failed write changed nothing"
    );
    // Every value is readable from every node, wherever its entry lives.
    let mut b = c.client(2).unwrap();
    for k in 0..stored {
        assert_eq!(b.get(&key(k)).unwrap().as_deref(), Some(&b"x"[..]));
    }
    // Deletes still work: they may take the reserve.
    b.delete(&key(0)).unwrap();
    assert_eq!(a.get(&key(0)).unwrap(), None);
    // Node 2's own writers still have their share of its memory.
    b.put(b"own", b"z").unwrap();
}

#[test]
fn recycling_reuses_entries_after_expiry() {
    let g = Geometry {
        dtes_per_node: 8,
        ..small_geometry()
    };
    let c = LocalCluster::new(g, fast_cfg(), None).unwrap();
    let mut a = c.client(0).unwrap();
    for i in 0..200u32 {
        a.put(b"hot", &i.to_le_bytes()).unwrap();
        assert_eq!(a.get(b"hot").unwrap().unwrap(), i.to_le_bytes());
    }
    // The cluster's memory holds `capacity` such entries; every write beyond them reuses a
    // recycled one. (A writer whose page is full and whose released entries have not expired
    // yet takes a page of another node rather than wait.)
    let capacity = small_entry_capacity(&c);
    let u = c.table(0).counters();
    assert!(
        u.reclaimed_total >= 200 - capacity,
        "200 writes through {capacity} entries need recycling: {u:?}"
    );
    assert!(a.stats().recycled >= 199);
}

#[test]
fn stalled_get_times_out_instead_of_reading_a_recycled_entry() {
    use nessie_protocols::HookPoint;
    let c = LocalCluster::new(small_geometry(), fast_cfg(), None).unwrap();
    let mut w = c.client(0).unwrap();
    w.put(b"k", b"old").unwrap();
    let mut r = c.client(1).unwrap();
    let expiry = c.config().expiry_ns;
    r.set_hook(Some(Box::new(move |p| {
        if p == HookPoint::AfterIteRead {
            std::thread::sleep(std::time::Duration::from_nanos(expiry + 1_000_000));
        }
    })));
    assert!(matches!(r.try_get(b"k"), Err(Error::Timeout { .. })));
    r.set_hook(None);
    assert_eq!(r.get(b"k").unwrap().as_deref(), Some(&b"old"[..]));
}

/// A write that gives up after publishing its invalid DTE (here: every attempt stalls past the
/// expiry period before its reverse pass) first completes its own leftover (rolls it
/// forward), so the write takes effect and succeeds after all, nothing is left in the index to
/// block other writers, and no data table entry leaks. The same for a key that did not exist,
/// and for DELETE.
#[test]
fn a_write_that_gives_up_completes_its_leftover_and_the_key_stays_usable() {
    use nessie_protocols::{HookPoint, RetryPolicy};
    let c = LocalCluster::new(small_geometry(), fast_cfg(), None).unwrap();
    let few = |n| ProtocolConfig {
        retry: RetryPolicy {
            max_attempts: n,
            ..RetryPolicy::default()
        },
        ..fast_cfg()
    };
    let mut a = c.client(1).unwrap();
    let mut other = c.client_with(2, few(50)).unwrap();
    let mut w = c.client_with(0, few(3)).unwrap();
    let expiry = c.config().expiry_ns;
    w.set_hook(Some(Box::new(move |p| {
        if p == HookPoint::BeforeReversePass {
            std::thread::sleep(std::time::Duration::from_nanos(expiry + 1_000_000));
        }
    })));
    a.put(b"k", b"old").unwrap();
    w.put(b"k", b"rolled").unwrap();
    assert_eq!(other.get(b"k").unwrap().as_deref(), Some(&b"rolled"[..]));
    w.put(b"fresh", b"rolled").unwrap();
    assert_eq!(
        other.get(b"fresh").unwrap().as_deref(),
        Some(&b"rolled"[..])
    );
    w.delete(b"k").unwrap();
    assert_eq!(other.get(b"k").unwrap(), None);
    let st = w.stats();
    assert_eq!((st.rolled_forward, st.leaked), (3, 0), "{st:?}");
    // Nine attempts, nine DTEs: six replaced by the next attempt (recycled), two completed in
    // place, one (the delete's) taken out by its completion (recycled); and the two values the
    // writes replaced ("old", then "rolled"), recycled when they gave up: 9 in all, or more
    // when the machine is slow enough for a completion to time out once.
    assert!(st.recycled >= 9, "{st:?}");
    other.put(b"k", b"new").unwrap();
    other.put(b"fresh", b"new").unwrap();
    assert_eq!(a.get(b"k").unwrap().as_deref(), Some(&b"new"[..]));
    assert_eq!(a.get(b"fresh").unwrap().as_deref(), Some(&b"new"[..]));
    // The writer itself is fine afterwards.
    w.set_hook(None);
    w.put(b"k", b"w").unwrap();
    assert_eq!(a.get(b"k").unwrap().as_deref(), Some(&b"w"[..]));
}

/// A write that needs many attempts does not hold a data table entry per attempt: the invalid
/// DTE of each failed attempt is recycled as soon as the next attempt replaces it. Here 12
/// attempts of a largest-class value go through a writer that can place only 8 such entries
/// (one page of its own node; other nodes keep their last pages for their own writers):
/// holding them all until the write completes would fail with `DataTableFull` on the ninth.
#[test]
fn a_write_retrying_many_times_fits_a_tiny_data_table() {
    use nessie_protocols::HookPoint;
    let g = Geometry {
        dtes_per_node: 4,
        value_max: 4000,
        ..small_geometry()
    };
    let c = LocalCluster::new(g, fast_cfg(), None).unwrap();
    let v = c.view();
    let largest = (v.classes.len() - 1) as u8;
    let pages = v.geometry.data_pages_per_node();
    let room = v.classes.per_page(largest) * (pages - RESERVE_PAGES);
    assert!(room < 12, "{room} entries would hold every attempt");
    assert!(
        pages - RESERVE_PAGES <= owner_share(pages),
        "other nodes' pages are out of reach"
    );
    let (old, new) = (vec![1u8; 4000], vec![2u8; 4000]);
    c.client(1).unwrap().put(b"k", &old).unwrap();
    let mut w = c.client(0).unwrap();
    let expiry = c.config().expiry_ns;
    let mut stalls = 12;
    w.set_hook(Some(Box::new(move |p| {
        if p == HookPoint::BeforeReversePass && stalls > 0 {
            stalls -= 1;
            std::thread::sleep(std::time::Duration::from_nanos(expiry + 1_000_000));
        }
    })));
    w.put(b"k", &new).unwrap();
    let st = w.stats();
    assert_eq!(st.timeouts, 12, "{st:?}");
    assert!(st.recycled >= 12, "{st:?}");
    assert_eq!(c.client(2).unwrap().get(b"k").unwrap(), Some(new));
}

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u16),
    Get(u8),
    Delete(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..40, any::<u16>()).prop_map(|(k, v)| Op::Put(k, v)),
        4 => (0u8..40).prop_map(Op::Get),
        1 => (0u8..40).prop_map(Op::Delete),
    ]
}

fn opts() -> impl Strategy<Value = Optimizations> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(a, b, c, d)| {
        Optimizations {
            filter_bits: a,
            cache: b,
            previous_versions: c,
            multi_read: d,
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random single-threaded sequences against a HashMap model, through clients on different
    /// nodes, with a tiny index (migrations) and a tiny data table (recycling).
    #[test]
    fn matches_a_hashmap_model(ops in proptest::collection::vec((op(), 0u16..3), 1..300), o in opts()) {
        let g = Geometry { nodes: 3, ites_per_node: 20, dtes_per_node: 48, key_max: 8, value_max: 24, hash_functions: 3, filter_bits: 3 };
        let cfg = ProtocolConfig { optimizations: o, cache_entries: 8, ..fast_cfg() };
        let c = LocalCluster::new(g, cfg, None).unwrap();
        let mut clients: Vec<_> = (0..3).map(|n| c.client(n).unwrap()).collect();
        let mut model: HashMap<u8, Vec<u8>> = HashMap::new();
        for (op, node) in ops {
            let cl = &mut clients[node as usize];
            match op {
                Op::Put(k, v) => {
                    let value = format!("v{v}-{k}").into_bytes();
                    match cl.put(&[k, 0xAB], &value) {
                        Ok(()) => { model.insert(k, value); }
                        Err(Error::IndexFull { .. }) => {}
                        Err(e) => prop_assert!(false, "put failed: {e}"),
                    }
                }
                Op::Get(k) => prop_assert_eq!(cl.get(&[k, 0xAB]).unwrap(), model.get(&k).cloned(), "key {}", k),
                Op::Delete(k) => { cl.delete(&[k, 0xAB]).unwrap(); model.remove(&k); }
            }
        }
        for (k, v) in &model {
            let got = clients[0].get(&[*k, 0xAB]).unwrap();
            prop_assert_eq!(got.as_ref(), Some(v));
        }
        prop_assert_eq!(c.index_occupancy().unwrap(), model.len() as u64, "no stray ITEs");
    }
}

/// Regression: with the paper's "first alternative" destination rule, migration chains grew
/// past the depth limit at a load factor of 0.4 (PUT fills candidates in order, so an entry's
/// first alternative is usually occupied). Filling to 0.5 from clients on every node must
/// never report a full index.
#[test]
fn filling_to_half_load_factor_never_reports_a_full_index() {
    let g = Geometry {
        nodes: 3,
        ites_per_node: 8000,
        dtes_per_node: 12_000,
        key_max: 16,
        value_max: 32,
        ..Geometry::default()
    };
    let c = LocalCluster::new(g, ProtocolConfig::default(), None).unwrap();
    let mut cls: Vec<_> = (0..3).map(|n| c.client(n).unwrap()).collect();
    for k in 0..12_000u64 {
        let key = format!("key-{k:08}");
        cls[(k % 3) as usize]
            .put(key.as_bytes(), &k.to_le_bytes())
            .unwrap_or_else(|e| panic!("key {k}: {e}"));
    }
    let migrations: u64 = cls.iter().map(|c| c.stats().migrations).sum();
    let recursive: u64 = cls.iter().map(|c| c.stats().recursive_migrations).sum();
    assert!(
        migrations > 100,
        "load factor 0.5 needs migrations: {migrations}"
    );
    // Both alternatives occupied: ~0.5^2 of migrations recurse at this load factor (the old
    // rule recursed in over 40% of migrations even at 0.38).
    assert!(
        recursive * 3 < migrations,
        "chains should be short: {recursive} recursive of {migrations}"
    );
    for k in (0..12_000u64).step_by(7) {
        assert_eq!(
            cls[1]
                .get(format!("key-{k:08}").as_bytes())
                .unwrap()
                .unwrap(),
            k.to_le_bytes()
        );
    }
}

/// A backward step of the wall clock (NTP, VM resume) in the middle of an operation must not
/// let it outlive the expiry period: deadlines run on the monotonic clock.
#[test]
fn a_backward_wall_clock_step_does_not_extend_an_operation_past_expiry() {
    use nessie_protocols::HookPoint;
    let c = LocalCluster::new(small_geometry(), fast_cfg(), None).unwrap();
    c.client(0).unwrap().put(b"k", b"old").unwrap();
    let mut r = c.client(1).unwrap();
    let expiry = c.config().expiry_ns;
    let fabric = c.fabric().clone();
    let mut stepped = false;
    r.set_hook(Some(Box::new(move |p| {
        if p == HookPoint::AfterIteRead && !stepped {
            stepped = true;
            fabric.step_wall_clock(-10_000_000_000);
            std::thread::sleep(std::time::Duration::from_nanos(expiry + 1_000_000));
        }
    })));
    let r1 = r.try_get(b"k");
    assert!(matches!(r1, Err(Error::Timeout { .. })), "{r1:?}");
}

/// A cached remote DTE is used for at most one expiry period after its ITE was read, however
/// the wall clock moves: cache ages run on the monotonic clock.
#[test]
fn a_backward_wall_clock_step_does_not_keep_cache_entries_alive() {
    let c = LocalCluster::new(small_geometry(), fast_cfg(), None).unwrap();
    let mut w = c.client(0).unwrap();
    let mut r = c.client(1).unwrap();
    w.put(b"k", b"v").unwrap();
    // The DTE is in node 0's table, remote for r, so r caches it.
    assert_eq!(r.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(r.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    let hits = r.cache_stats().hits;
    assert!(
        hits >= 1,
        "a second read within the expiry period hits the cache"
    );
    c.fabric().step_wall_clock(-10_000_000_000);
    std::thread::sleep(std::time::Duration::from_nanos(
        c.config().expiry_ns + 1_000_000,
    ));
    assert_eq!(r.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    let s = r.cache_stats();
    assert_eq!(
        s.hits, hits,
        "entry older than the expiry period was used: {s:?}"
    );
    assert!(s.expired >= 1, "{s:?}");
}

/// A store whose data table is full can still be emptied: DELETE takes its marker from a small
/// reserve that PUTs may not use, and the deleted values' entries come back after the expiry
/// period, so new values fit again.
#[test]
fn a_full_data_table_can_be_emptied_and_refilled() {
    // A roomy index: no MIGRATE, whose recycled sources would free entries on their own.
    let g = Geometry {
        dtes_per_node: 100,
        ites_per_node: 1024,
        ..small_geometry()
    };
    let cfg = ProtocolConfig {
        expiry_ns: 20_000_000,
        clock_margin_ns: 0,
        ..ProtocolConfig::default()
    };
    let c = LocalCluster::new(g, cfg, None).unwrap();
    let mut a = c.client(1).unwrap();
    let mut keys = Vec::new();
    for i in 0..1000u64 {
        match a.put(&key(i), b"x") {
            Ok(()) => keys.push(i),
            Err(Error::DataTableFull { node: 1, .. }) => break,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!(
        keys.len() as u64,
        small_entry_capacity(&c),
        "all but the reserve hold values"
    );
    assert!(matches!(
        a.put(&key(2000), b"x"),
        Err(Error::DataTableFull { .. })
    ));
    assert_eq!(a.stats().migrations, 0);
    for &k in &keys {
        a.delete(&key(k))
            .unwrap_or_else(|e| panic!("delete of key {k} on a full table: {e}"));
        assert_eq!(a.get(&key(k)).unwrap(), None);
    }
    // After the expiry period every entry is reusable: the table fills up again.
    for &k in &keys {
        a.put(&key(k), b"y")
            .unwrap_or_else(|e| panic!("space did not come back for key {k}: {e}"));
    }
    for &k in &keys {
        assert_eq!(a.get(&key(k)).unwrap().as_deref(), Some(&b"y"[..]));
    }
}
