//! The baselines under the same concurrency stress as the client-driven protocol
//! (`stress_cd.rs`): NessieSD (server-driven) and NessieHY (client-driven GET, server-driven
//! PUT/DELETE) on in-process clusters with delay injection, every history checked for
//! linearizability. Plus smoke tests of the request/response path and a mutation test showing
//! that a broken server is caught.
//!
//! Each stress run: 4 client threads on 3 nodes, 2 server threads per node, hot keys, at least
//! 100,000 operations. The hot-key runs use spinning server threads (the paper's configuration);
//! the others let idle server threads yield their core (`idle_backoff_ns: Some(0)`) or sleep,
//! which also covers those paths. Waiting clients yield after a short spin, so even 10 threads
//! on 2 cores make progress.

mod common;
use common::{cfg, delay, geometry, spec};

use std::sync::Mutex;
use std::time::Duration;

use nessie_baselines::sd::{RpcConfig, RpcMutations, RpcStats, ServerStatsSnapshot};
use nessie_cluster::LocalCluster;
use nessie_cluster::LocalEndpoint;
use nessie_deploy::{Mode, ModeClient};
use nessie_fabric::{Endpoint, Locality, OpKind};
use nessie_protocols::{Error, KvClient, ProtocolConfig};
use nessie_store::Geometry;
use nessie_testkit::assertions::assert_clean;
use nessie_testkit::stress::{self, StressOutcome, StressSpec};

const THREADS_NODES: [u16; 4] = [0, 1, 2, 0];
const SD: Mode = Mode::Sd { server_threads: 2 };
const HY: Mode = Mode::Hy { server_threads: 2 };

/// Stress runs take turns: each one keeps every core of a small machine busy on its own.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn rpc() -> RpcConfig {
    RpcConfig {
        max_clients_per_node: 4,
        idle_backoff_ns: Some(0),
        ..RpcConfig::default()
    }
}

fn cluster(
    mode: Mode,
    g: Geometry,
    cfg: ProtocolConfig,
    seed: u64,
    rpc: RpcConfig,
) -> LocalCluster {
    LocalCluster::with_rpc(g, cfg, delay(seed), mode, rpc).unwrap()
}

/// Client-side counters summed over a run's clients.
#[derive(Debug, Default)]
struct ClientTotals {
    rpc: RpcStats,
    /// HY: the client-driven GETs' aborts, retries and timeouts.
    get_aborts: u64,
    get_retries: u64,
    get_timeouts: u64,
}

fn totals(cs: &[ModeClient<LocalEndpoint>]) -> ClientTotals {
    let mut t = ClientTotals::default();
    for c in cs {
        match c {
            ModeClient::Sd(c) => t.rpc.add(&c.stats().rpc),
            ModeClient::Hy(c) => {
                let s = c.stats();
                t.rpc.add(&s.rpc);
                t.get_aborts += s.get.concurrent_aborts;
                t.get_retries += s.get.retries;
                t.get_timeouts += s.get.timeouts;
            }
            ModeClient::Cd(_) => panic!("CD client in an SD/HY run"),
            ModeClient::Pilaf(_) => panic!("Pilaf client in an SD/HY run"),
        }
    }
    t
}

fn run(c: &LocalCluster, spec: &StressSpec) -> (StressOutcome, ClientTotals, ServerStatsSnapshot) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cs: Vec<_> = THREADS_NODES
        .iter()
        .map(|&n| c.mode_client(n).unwrap())
        .collect();
    let (out, cs) = stress::run(cs, spec);
    let t = totals(&cs);
    let s = c.server_stats(None);
    eprintln!(
        "{} {out}\nclients: {t:?}\nservers: {s:?}\nfabric: {}",
        c.mode().name(),
        c.fabric().stats().total(None)
    );
    (out, t, s)
}

// ---- smoke tests of the request/response path ----

fn small(mode: Mode) -> LocalCluster {
    let g = Geometry {
        ites_per_node: 64,
        dtes_per_node: 256,
        key_max: 16,
        value_max: 64,
        ..geometry()
    };
    let cfg = ProtocolConfig {
        expiry_ns: 50_000_000,
        clock_margin_ns: 0,
        ..ProtocolConfig::default()
    };
    LocalCluster::with_rpc(g, cfg, None, mode, rpc()).unwrap()
}

/// A key owned by `node`.
fn key_owned_by(c: &LocalCluster, node: u16) -> Vec<u8> {
    (0..)
        .map(|i| format!("k{i}").into_bytes())
        .find(|k| c.view().index.owner(k) == Some(node))
        .unwrap()
}

fn basic_ops(mode: Mode) {
    let c = small(mode);
    let mut a = c.kv_client(0).unwrap();
    let mut b = c.kv_client(2).unwrap();
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
    a.put(&[7u8; 16], &[9u8; 64]).unwrap();
    assert_eq!(
        b.get(&[7u8; 16]).unwrap().unwrap(),
        vec![9u8; 64],
        "limits are inclusive"
    );
    // Many keys, so that every node owns some and both server threads of each are used.
    for i in 0..60u32 {
        a.put(format!("key{i}").as_bytes(), &i.to_le_bytes())
            .unwrap();
    }
    for i in 0..60u32 {
        assert_eq!(
            b.get(format!("key{i}").as_bytes()).unwrap().unwrap(),
            i.to_le_bytes()
        );
    }
    // The DTEs of a key are in its owner's data table: every ITE refers to its own node.
    let idx = &c.view().index;
    let mut ep = c.fabric().endpoint(0);
    for s in 0..idx.total {
        let addr = idx.addr(s);
        let ite = nessie_store::Ite(ep.read_u64(addr).unwrap());
        if !ite.is_empty() {
            assert_eq!(
                idx.ite.dti(ite),
                addr.node as u32,
                "ITE {s} refers to another node's DTE"
            );
        }
    }
}

#[test]
fn sd_basic_operations_across_nodes() {
    basic_ops(SD);
}

#[test]
fn hy_basic_operations_across_nodes() {
    basic_ops(HY);
}

fn invalid_sizes(mode: Mode) {
    let c = small(mode);
    let mut a = c.mode_client(0).unwrap();
    let stats = |a: &ModeClient<LocalEndpoint>| match a {
        ModeClient::Sd(c) => c.endpoint().stats().snapshot(),
        ModeClient::Hy(c) => c.endpoint().stats().snapshot(),
        ModeClient::Cd(c) => c.endpoint().stats().snapshot(),
        ModeClient::Pilaf(c) => c.endpoint().stats().snapshot(),
    };
    let before = stats(&a);
    let served = c.server_stats(None).requests;
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
        a.get(&[0u8; 17]),
        Err(Error::KeyTooLarge { len: 17, max: 16 })
    );
    assert_eq!(
        a.delete(&[0u8; 100]),
        Err(Error::KeyTooLarge { len: 100, max: 16 })
    );
    assert_eq!(a.delete(b""), Err(Error::EmptyKey));
    assert_eq!(stats(&a), before, "no memory was touched");
    assert_eq!(c.server_stats(None).requests, served, "no request was sent");
}

#[test]
fn sd_invalid_sizes_are_rejected_before_touching_memory() {
    invalid_sizes(SD);
}

#[test]
fn hy_invalid_sizes_are_rejected_before_touching_memory() {
    invalid_sizes(HY);
}

#[test]
fn sd_same_node_requests_bypass_the_fabric() {
    let c = small(SD);
    let mut a = c.sd_client(1).unwrap();
    let local = key_owned_by(&c, 1);
    let remote = key_owned_by(&c, 2);
    let remote_ops = |c: &LocalCluster| c.fabric().stats().total(None).remote_ops();
    let before = remote_ops(&c);
    a.put(&local, b"here").unwrap();
    assert_eq!(a.get(&local).unwrap().as_deref(), Some(&b"here"[..]));
    a.delete(&local).unwrap();
    assert_eq!(
        remote_ops(&c),
        before,
        "a request to the own node crossed the fabric"
    );
    let s = a.endpoint().stats().snapshot();
    assert_eq!(
        s.ops(OpKind::Write, Locality::Direct),
        3,
        "requests are written directly"
    );
    assert_eq!(a.stats().rpc.local_requests, 3);
    a.put(&remote, b"there").unwrap();
    let s = a.endpoint().stats().snapshot();
    assert_eq!(
        s.ops(OpKind::Write, Locality::Remote),
        1,
        "one WRITE per remote request"
    );
    assert_eq!(s.remote_ops(), 1, "the response is polled in local memory");
    // The server answered with one WRITE into node 1's memory; its execution was local.
    let n2 = c.fabric().stats().total(Some(2));
    assert_eq!(n2.ops(OpKind::Write, Locality::Remote), 1);
    assert_eq!(
        n2.ops(OpKind::Read, Locality::Remote) + n2.ops(OpKind::Cas, Locality::Remote),
        0
    );
    assert!(
        n2.ops(OpKind::Cas, Locality::Loopback) >= 1,
        "ITEs are changed by (loopback) CAS"
    );
    assert_eq!(a.stats().rpc.requests, 4);
    let st = c.server_stats(Some(2));
    assert_eq!((st.requests, st.puts, st.gets), (1, 1, 0));
}

#[test]
fn hy_gets_are_client_driven_and_writes_server_driven() {
    let c = small(HY);
    let mut a = c.hy_client(0).unwrap();
    let remote = key_owned_by(&c, 1);
    a.put(&remote, b"v").unwrap();
    let before = a.endpoint().stats().snapshot();
    assert_eq!(a.get(&remote).unwrap().as_deref(), Some(&b"v"[..]));
    let d = a.endpoint().stats().snapshot().saturating_sub(&before);
    assert_eq!(
        d.ops(OpKind::Write, Locality::Remote),
        0,
        "a GET sends no request"
    );
    assert!(
        d.ops(OpKind::Read, Locality::Remote) >= 2,
        "ITE and DTE READs on the owner: {d:?}"
    );
    let st = c.server_stats(None);
    assert_eq!((st.requests, st.puts, st.gets), (1, 1, 0));
    a.delete(&remote).unwrap();
    assert_eq!(a.get(&remote).unwrap(), None);
    let s = a.stats();
    assert_eq!(
        (s.get.gets, s.puts, s.deletes, s.rpc.requests),
        (2, 1, 1, 2)
    );
    assert_eq!(c.server_stats(None).deletes, 1);
    // With every optimisation off, a GET reads the whole DTE (no multi-read), and no cache.
    assert_eq!(
        c.hy_client(1).unwrap().get_worker().config().optimizations,
        nessie_protocols::Optimizations::NONE
    );
}

#[test]
fn clients_of_the_wrong_mode_or_too_many_are_refused() {
    let c = small(SD);
    assert!(c
        .hy_client(0)
        .err()
        .unwrap()
        .to_string()
        .contains("HY cluster"));
    assert!(c
        .sd_client(3)
        .err()
        .unwrap()
        .to_string()
        .contains("no node 3"));
    let held: Vec<_> = (0..4).map(|_| c.sd_client(0).unwrap()).collect();
    let e = c.sd_client(0).err().unwrap().to_string();
    assert!(e.contains("no free client slot"), "{e}");
    drop(held);
    // Slots come back with their sequence numbers: a new client in an old slot works.
    let mut again = c.sd_client(0).unwrap();
    again.put(b"x", b"y").unwrap();
    let mut again2 = c.sd_client(0).unwrap();
    assert_eq!(again2.get(b"x").unwrap().as_deref(), Some(&b"y"[..]));
    let cd = LocalCluster::new(geometry(), cfg(), None).unwrap();
    assert!(cd
        .sd_client(0)
        .err()
        .unwrap()
        .to_string()
        .contains("SD cluster"));
    assert!(matches!(cd.mode_client(0).unwrap(), ModeClient::Cd(_)));
    // Coupled placement needs 2N index entries per node.
    let g = Geometry {
        ites_per_node: 5,
        ..geometry()
    };
    let e = LocalCluster::with_mode(g, cfg(), None, SD)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("ites_per_node = 5"), "{e}");
    let e = LocalCluster::with_mode(geometry(), cfg(), None, Mode::Sd { server_threads: 0 })
        .err()
        .unwrap();
    assert!(e.to_string().contains("server_threads"), "{e}");
}

#[test]
fn server_threads_stop_and_waiting_clients_give_up() {
    let mut c = small(SD);
    let mut a = c.sd_client(0).unwrap();
    a.put(b"k", b"v").unwrap();
    assert_eq!(c.running_server_threads(), 6);
    let idle = c.server_stats(None);
    assert!(idle.idle_sweeps > 0 && idle.idle_ns > 0, "{idle:?}");
    c.stop_servers();
    assert_eq!(c.running_server_threads(), 0, "server threads are joined");
    assert!(matches!(a.get(b"k"), Err(Error::Unreachable { .. })));
    c.stop_servers(); // idempotent
    drop(c); // and dropping after an explicit stop is fine
             // Dropping a running cluster joins its threads too (checked through the stop flag: a
             // client of a dropped cluster fails at once instead of waiting for a response).
    let c = small(HY);
    let mut h = c.hy_client(1).unwrap();
    h.put(b"k", b"v").unwrap();
    drop(c);
    let t = std::time::Instant::now();
    assert!(matches!(h.put(b"k", b"w"), Err(Error::Unreachable { .. })));
    // Behaviour, not speed: it must not wait out the 30 s response timeout.
    assert!(t.elapsed() < Duration::from_secs(10));
}

// ---- stress ----

fn hot_keys(mode: Mode, seed: u64) {
    let spinning = RpcConfig {
        idle_backoff_ns: None,
        ..rpc()
    };
    let c = cluster(mode, geometry(), cfg(), seed, spinning);
    let (out, t, s) = run(&c, &spec(seed));
    assert_clean(&out);
    assert!(
        s.exec.concurrent_aborts + t.get_aborts > 0,
        "hot keys must produce conflicts: {s:?} {t:?}"
    );
    assert!(
        t.rpc.local_requests > 0,
        "same-node requests must occur: {t:?}"
    );
    assert_eq!(s.errors, 0, "{s:?}");
}

#[test]
fn sd_hot_keys_concurrent_puts_gets_and_deletes() {
    hot_keys(SD, 11);
}

#[test]
fn hy_hot_keys_concurrent_puts_gets_and_deletes() {
    hot_keys(HY, 12);
}

fn deletes(mode: Mode, seed: u64) {
    let c = cluster(mode, geometry(), cfg(), seed, rpc());
    let s = StressSpec {
        keys: 16,
        hot_keys: 2,
        delete_fraction: 0.25,
        get_fraction: 0.45,
        ..spec(seed)
    };
    let (out, t, st) = run(&c, &s);
    assert_clean(&out);
    assert!(st.exec.concurrent_aborts + t.get_aborts > 0, "{st:?} {t:?}");
}

#[test]
fn sd_deletes_race_with_puts_and_gets() {
    deletes(SD, 13);
}

#[test]
fn hy_deletes_race_with_puts_and_gets() {
    deletes(HY, 14);
}

/// A tiny data table with a short expiry: entries are recycled constantly, and server threads
/// wait for released entries to expire.
fn recycling(mode: Mode, seed: u64) {
    let g = Geometry {
        dtes_per_node: 96,
        ..geometry()
    };
    let cfg = ProtocolConfig {
        expiry_ns: 5_000_000,
        clock_margin_ns: 0,
        ..cfg()
    };
    let c = cluster(mode, g, cfg, seed, rpc());
    let s = StressSpec {
        keys: 40,
        get_fraction: 0.4,
        ..spec(seed)
    };
    let (out, _, st) = run(&c, &s);
    assert_clean(&out);
    let reclaimed: u64 = (0..3).map(|n| c.table(n).counters().reclaimed_total).sum();
    assert!(
        reclaimed > 10_000,
        "entries must be reused many times over: {reclaimed}"
    );
    assert!(st.exec.table_full_waits > 0, "{st:?}");
    assert_eq!(st.exec.leaked, 0, "{st:?}");
}

#[test]
fn sd_recycling_with_a_tiny_data_table_and_short_expiry() {
    recycling(SD, 15);
}

#[test]
fn hy_recycling_with_a_tiny_data_table_and_short_expiry() {
    recycling(HY, 16);
}

/// A small index at a high load factor: PUTs need migrations, which stay inside the owner's
/// index table (coupled placement) and race with the other server threads.
#[test]
fn sd_migrations_within_the_owner_at_high_load_factor() {
    let g = Geometry {
        ites_per_node: 128,
        ..geometry()
    };
    let cfg = ProtocolConfig {
        max_migrate_depth: 12,
        ..cfg()
    };
    // Idle server threads sleep 20 µs between sweeps.
    let c = cluster(
        SD,
        g,
        cfg,
        17,
        RpcConfig {
            idle_backoff_ns: Some(20_000),
            ..rpc()
        },
    );
    let s = StressSpec {
        keys: 290,
        hot_keys: 0,
        get_fraction: 0.5,
        delete_fraction: 0.1,
        preload_keys: 270,
        ..spec(17)
    };
    let (out, _, st) = run(&c, &s);
    assert_clean(&out);
    // A node owning more than its share of keys can fill its 128 entries while the cluster's
    // load is lower (the coupled placement cannot spill over): rare IndexFull errors are the
    // protocol's correct answer then, and the only errors allowed.
    assert!(
        out.errors.keys().all(|k| k == "IndexFull"),
        "{:?}",
        out.errors
    );
    assert!(out.errors.values().sum::<u64>() < 100, "{:?}", out.errors);
    let occupancy = c.index_occupancy().unwrap() as f64 / c.view().geometry.total_ites() as f64;
    eprintln!("load factor {occupancy:.3}");
    assert!(occupancy >= 0.6, "load factor {occupancy:.3}");
    assert!(st.exec.migrations > 500, "{st:?}");
    assert!(st.exec.recursive_migrations > 50, "{st:?}");
}

// ---- mutation ----

/// Servers that acknowledge a PUT/DELETE before executing it let a client's later operation
/// (on another server thread) miss a write that has "completed": the checker must notice.
#[test]
fn mutation_replying_before_executing_is_caught() {
    let r = RpcConfig {
        mutations: RpcMutations {
            reply_before_execute: true,
        },
        ..rpc()
    };
    let c = cluster(SD, geometry(), cfg(), 18, r);
    let s = StressSpec {
        keys: 8,
        hot_keys: 2,
        get_fraction: 0.6,
        delete_fraction: 0.1,
        ..spec(18)
    };
    let (out, _, _) = run(&c, &s);
    assert!(
        !out.report.is_ok(),
        "replying before executing went unnoticed"
    );
}
