//! Pilaf mode under the concurrency stress of the other modes (`stress_sd_hy.rs`): in-process
//! clusters with delay injection, every history checked for linearizability, plus smoke tests
//! of the mode and the mutation that skips the checksums.
//!
//! Each stress run: 4 client threads on 3 nodes, 2 server threads per node, hot keys, small
//! hash tables (so that keys sit in every candidate and inserts move keys), 100,000
//! operations: about a second each on two cores. The race runs reuse freed extents at once, as the paper does, with
//! servers that write extents tail first and yield in between, so that GETs meet extents
//! rewritten under them; only the CRC64 in each entry then stands between them and bytes
//! nobody wrote.

mod common;
use common::{cfg, delay, geometry, spec};

use std::sync::Mutex;

use nessie_baselines::pilaf::{PilafClientStats, PilafTesting, StoreStats};
use nessie_baselines::sd::RpcConfig;
use nessie_cluster::LocalCluster;
use nessie_deploy::{Mode, ModeClient};
use nessie_fabric::{Endpoint, Locality, OpKind};
use nessie_protocols::{Error, KvClient, ProtocolConfig};
use nessie_store::Geometry;
use nessie_testkit::assertions::{assert_clean_run, assert_violation};
use nessie_testkit::stress::{self, StressOutcome, StressSpec};

const THREADS_NODES: [u16; 4] = [0, 1, 2, 0];
const PILAF: Mode = Mode::Pilaf { server_threads: 2 };
/// Operations per client thread of a stress run.
const OPS_PER_THREAD: u64 = 25_000;
/// Operations a stress run must complete.
const MIN_OPS: u64 = 4 * OPS_PER_THREAD;
/// The reuse delay of the runs that are not about immediate reuse: short, or hot keys
/// rewritten 100,000 times a second hold the small regions in quarantine.
const REUSE_DELAY_NS: u64 = 2_000_000;

/// Stress runs take turns: each one keeps every core of a small machine busy on its own.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn rpc() -> RpcConfig {
    RpcConfig {
        max_clients_per_node: 4,
        idle_backoff_ns: Some(0),
        extent_reuse_delay_ns: Some(REUSE_DELAY_NS),
        ..RpcConfig::default()
    }
}

/// Freed extents reused at once (the paper's behaviour), servers writing extents tail first.
fn racy_rpc() -> RpcConfig {
    RpcConfig {
        extent_reuse_delay_ns: Some(0),
        pilaf: PilafTesting {
            tail_first_extent_writes: true,
        },
        ..rpc()
    }
}

/// 96 entries per node for about 70 keys each at most: every candidate used, moves needed.
fn small_table() -> Geometry {
    Geometry {
        ites_per_node: 96,
        ..geometry()
    }
}

fn pilaf_cluster(g: Geometry, cfg: ProtocolConfig, seed: u64, rpc: RpcConfig) -> LocalCluster {
    LocalCluster::with_rpc(g, cfg, delay(seed), PILAF, rpc).unwrap()
}

fn small_spec(seed: u64) -> StressSpec {
    StressSpec {
        ops_per_thread: OPS_PER_THREAD,
        keys: 200,
        ..spec(seed)
    }
}

fn store_totals(c: &LocalCluster) -> StoreStats {
    let mut t = StoreStats::default();
    for n in 0..3 {
        let s = c.pilaf_store_stats(n).unwrap();
        t.moves += s.moves;
        t.chains += s.chains;
        t.index_full += s.index_full;
        t.alloc.reused += s.alloc.reused;
        t.puts += s.puts;
        t.deletes += s.deletes;
        t.region_full += s.region_full;
    }
    t
}

fn run(c: &LocalCluster, spec: &StressSpec) -> (StressOutcome, PilafClientStats, StoreStats) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cs: Vec<_> = THREADS_NODES
        .iter()
        .map(|&n| c.mode_client(n).unwrap())
        .collect();
    let (out, cs) = stress::run(cs, spec);
    let mut t = PilafClientStats::default();
    for cl in &cs {
        let ModeClient::Pilaf(p) = cl else {
            panic!("not a Pilaf client")
        };
        let s = p.stats();
        t.gets += s.gets;
        t.entry_crc_retries += s.entry_crc_retries;
        t.extent_crc_retries += s.extent_crc_retries;
        t.move_retries += s.move_retries;
        t.gave_up += s.gave_up;
        t.entry_reads += s.entry_reads;
        t.extent_reads += s.extent_reads;
        t.rpc.add(&s.rpc);
    }
    let st = store_totals(c);
    eprintln!(
        "pilaf {out}\nclients: {t:?}\nstores: {st:?}\nservers: {:?}",
        c.server_stats(None)
    );
    (out, t, st)
}

// ---- smoke tests ----

fn small() -> LocalCluster {
    let g = Geometry {
        ites_per_node: 64,
        dtes_per_node: 256,
        key_max: 16,
        value_max: 64,
        ..geometry()
    };
    LocalCluster::with_rpc(g, cfg(), None, PILAF, rpc()).unwrap()
}

#[test]
fn pilaf_basic_operations_across_nodes() {
    let c = small();
    let mut a = c.kv_client(0).unwrap();
    let mut b = c.kv_client(2).unwrap();
    assert_eq!(a.get(b"k").unwrap(), None);
    a.put(b"k", b"v1").unwrap();
    assert_eq!(b.get(b"k").unwrap().as_deref(), Some(&b"v1"[..]));
    b.put(b"k", b"v2").unwrap();
    assert_eq!(a.get(b"k").unwrap().as_deref(), Some(&b"v2"[..]));
    a.delete(b"k").unwrap();
    assert_eq!(b.get(b"k").unwrap(), None);
    b.delete(b"k").unwrap(); // deleting an absent key is fine
    a.put(b"empty", b"").unwrap();
    assert_eq!(b.get(b"empty").unwrap().as_deref(), Some(&b""[..]));
    a.put(&[7u8; 16], &[9u8; 64]).unwrap();
    assert_eq!(b.get(&[7u8; 16]).unwrap().unwrap(), vec![9u8; 64]);
    for i in 0..60u32 {
        a.put(format!("key{i}").as_bytes(), &i.to_le_bytes())
            .unwrap();
    }
    for i in 0..60u32 {
        let v = b.get(format!("key{i}").as_bytes()).unwrap().unwrap();
        assert_eq!(v, i.to_le_bytes());
    }
    assert_eq!(a.put(b"", b"v"), Err(Error::EmptyKey));
    assert_eq!(
        a.put(b"k", &[0u8; 65]),
        Err(Error::ValueTooLarge { len: 65, max: 64 })
    );
    assert!(a
        .put_if(b"k", b"v", nessie_protocols::Cond::Absent)
        .is_err());
    // Only servers wrote, and only GETs read remotely: no CAS anywhere in Pilaf mode.
    let f = c.fabric().stats().total(None);
    assert_eq!(
        f.ops(OpKind::Cas, Locality::Remote) + f.ops(OpKind::Cas, Locality::Loopback),
        0
    );
    let e = c.client(0).err().unwrap().to_string();
    assert!(e.contains("no client-driven tables"), "{e}");
}

#[test]
fn pilaf_gets_read_and_writes_are_requests() {
    let c = small();
    let mut a = c.pilaf_client(0).unwrap();
    let key = (0..)
        .map(|i| format!("k{i}").into_bytes())
        .find(|k| c.view().index.owner(k) == Some(1))
        .unwrap();
    a.put(&key, b"v").unwrap();
    let before = a.endpoint().stats().snapshot();
    assert_eq!(a.get(&key).unwrap().as_deref(), Some(&b"v"[..]));
    let d = a.endpoint().stats().snapshot().saturating_sub(&before);
    assert_eq!(
        d.ops(OpKind::Write, Locality::Remote),
        0,
        "a GET sends no request"
    );
    assert!(
        d.ops(OpKind::Read, Locality::Remote) >= 2,
        "entry and extent: {d:?}"
    );
    let st = c.server_stats(Some(1));
    assert_eq!((st.requests, st.puts, st.gets), (1, 1, 0));
    assert!(c
        .hy_client(0)
        .err()
        .unwrap()
        .to_string()
        .contains("HY cluster"));
}

// ---- stress ----

#[test]
fn pilaf_hot_keys_with_moves_are_linearizable() {
    let c = pilaf_cluster(small_table(), cfg(), 31, rpc());
    let (out, t, st) = run(&c, &small_spec(31));
    assert_clean_run("hot keys", &out, MIN_OPS);
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert!(st.moves > 0, "small tables must move keys: {st:?}");
    assert!(t.rpc.local_requests > 0, "{t:?}");
}

#[test]
fn pilaf_deletes_and_inserts_at_a_high_load_factor() {
    let g = Geometry {
        ites_per_node: 64,
        ..geometry()
    };
    let c = pilaf_cluster(g, cfg(), 32, rpc());
    let s = StressSpec {
        keys: 160,
        hot_keys: 2,
        preload_keys: 150,
        delete_fraction: 0.25,
        get_fraction: 0.45,
        ..small_spec(32)
    };
    let (out, _, st) = run(&c, &s);
    assert_clean_run("deletes", &out, MIN_OPS);
    // A node owning more keys than its table takes refuses inserts: the only error allowed.
    assert!(
        out.errors.keys().all(|k| k == "IndexFull"),
        "{:?}",
        out.errors
    );
    assert!(st.moves > 100 && st.chains > 50, "{st:?}");
}

/// Extents reused at once and rewritten tail first under readers: GETs meet torn extents, and
/// the checksums send them back every time (counted), so the history stays linearizable.
#[test]
fn pilaf_checksums_catch_extents_reused_under_readers() {
    let (out, t, st) = racy_run(false);
    assert_clean_run("reuse at once", &out, MIN_OPS);
    assert!(out.errors.is_empty(), "{:?}", out.errors);
    assert!(st.alloc.reused > 1_000, "{st:?}");
    assert!(
        t.extent_crc_retries > 0,
        "no GET met a reused extent: {t:?}"
    );
}

/// The same run with verification skipped: the torn extents are returned.
#[test]
fn mutation_skipping_pilaf_checksums_is_caught() {
    let (out, _, _) = racy_run(true);
    assert_violation(&out, "skip_pilaf_checksums");
}

fn racy_run(skip_checksums: bool) -> (StressOutcome, PilafClientStats, StoreStats) {
    let mut cfg = cfg();
    cfg.mutations.skip_pilaf_checksums = skip_checksums;
    let c = pilaf_cluster(small_table(), cfg, 33, racy_rpc());
    let s = StressSpec {
        keys: 24,
        hot_keys: 4,
        hot_fraction: 0.8,
        get_fraction: 0.6,
        value_size: (40, 48),
        sizes_by_key: false,
        ..small_spec(33)
    };
    run(&c, &s)
}

/// Keys are 8..48-byte values over many size classes in a small extent region with a reuse
/// delay: blocks run out and come back, and nothing but `DataTableFull` may fail.
#[test]
fn pilaf_small_extent_region_with_a_reuse_delay() {
    let g = Geometry {
        dtes_per_node: 24,
        ..small_table()
    };
    let c = pilaf_cluster(g, cfg(), 34, rpc());
    let s = StressSpec {
        keys: 60,
        get_fraction: 0.4,
        ..small_spec(34)
    };
    let (out, _, st) = run(&c, &s);
    assert_clean_run("reuse delay", &out, MIN_OPS);
    assert!(
        out.errors.keys().all(|k| k == "DataTableFull"),
        "{:?}",
        out.errors
    );
    assert!(st.alloc.reused > 1_000, "{st:?}");
}
