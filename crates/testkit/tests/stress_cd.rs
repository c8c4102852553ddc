//! Concurrency stress of the client-driven protocol on the in-process fabric, with delay
//! injection widening race windows and every history checked for linearizability.
//!
//! Each run: 4 client threads on 3 nodes, hot keys, at least 100,000 operations.

mod common;
use common::{cfg, delay, geometry, small_index, spec, variants, OPS_PER_THREAD};

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nessie_cluster::{LocalCluster, LocalEndpoint};
use nessie_fabric::inproc::InProcFabric;
use nessie_fabric::interpose::{Interposed, Interposer, Op};
use nessie_fabric::NodeId;
use nessie_protocols::cd::{CdClient, ClientStats};
use nessie_protocols::hooks::Hook;
use nessie_protocols::{Eviction, HookPoint, Mutations, Optimizations, ProtocolConfig};
use nessie_store::classtable::ClassTable;
use nessie_store::{pages, Geometry};
use nessie_testkit::assertions::{assert_clean, assert_clean_run, assert_violation};
use nessie_testkit::stress::{self, StressOutcome, StressSpec};

const THREADS_NODES: [u16; 4] = [0, 1, 2, 0];

fn clients(c: &LocalCluster, cfg: &ProtocolConfig) -> Vec<CdClient<LocalEndpoint>> {
    THREADS_NODES
        .iter()
        .map(|&n| c.client_with(n, cfg.clone()).unwrap())
        .collect()
}

fn total(cs: &[CdClient<LocalEndpoint>]) -> ClientStats {
    let mut t = ClientStats::default();
    for c in cs {
        t += c.stats();
    }
    t
}

fn run(
    c: &LocalCluster,
    cfg: &ProtocolConfig,
    spec: &StressSpec,
) -> (StressOutcome, ClientStats, Vec<CdClient<LocalEndpoint>>) {
    let (out, cs) = stress::run(clients(c, cfg), spec);
    let st = total(&cs);
    eprintln!("{out}\n{st:?}\nfabric: {}", c.fabric().stats().total(None));
    (out, st, cs)
}

#[test]
fn hot_keys_concurrent_puts_and_gets_use_previous_versions() {
    let c = LocalCluster::new(geometry(), cfg(), delay(1)).unwrap();
    let (out, st, _) = run(&c, &cfg(), &spec(1));
    assert_clean(&out);
    assert!(
        st.concurrent_aborts > 0,
        "hot keys must produce write conflicts: {st:?}"
    );
    assert!(
        st.previous_version_hits > 0,
        "GETs during PUTs must use previous versions: {st:?}"
    );
}

#[test]
fn deletes_race_with_puts_and_gets() {
    let c = LocalCluster::new(geometry(), cfg(), delay(2)).unwrap();
    let s = StressSpec {
        keys: 16,
        hot_keys: 2,
        delete_fraction: 0.25,
        get_fraction: 0.45,
        ..spec(2)
    };
    let (out, st, _) = run(&c, &cfg(), &s);
    assert_clean(&out);
    assert!(st.concurrent_aborts > 0, "{st:?}");
}

/// A small index filled beyond 85%: inserting keys needs migrations, some of them recursive,
/// racing with GETs, PUTs and DELETEs on the keys being moved.
fn high_load_setup(seed: u64) -> (LocalCluster, ProtocolConfig, StressSpec) {
    let g = Geometry {
        ites_per_node: 128,
        ..geometry()
    };
    let cfg = ProtocolConfig {
        max_migrate_depth: 12,
        ..cfg()
    };
    let c = LocalCluster::new(g, cfg.clone(), delay(seed)).unwrap();
    let s = StressSpec {
        keys: 450,
        hot_keys: 8,
        hot_fraction: 0.3,
        get_fraction: 0.5,
        delete_fraction: 0.04,
        preload_keys: 384,
        ..spec(seed)
    };
    (c, cfg, s)
}

/// The high-load run, with two clients whose forward passes are slowed (a pause after each
/// ITE read) so that MIGRATEs often move a key into a candidate a GET has already passed.
fn high_load_run(seed: u64, mutations: Mutations) -> (LocalCluster, StressOutcome, ClientStats) {
    high_load_run_batched(seed, mutations, false)
}

/// [`high_load_run`]; with `batched`, the fabric says batches overlap (as UCX over verbs), so
/// the clients without a hook read each GET's candidate ITEs in one batch.
fn high_load_run_batched(
    seed: u64,
    mutations: Mutations,
    batched: bool,
) -> (LocalCluster, StressOutcome, ClientStats) {
    let (c, cfg, s) = high_load_setup(seed);
    c.fabric().set_batches_overlap(batched);
    let cfg = ProtocolConfig { mutations, ..cfg };
    let mut cs = clients(&c, &cfg);
    for i in [0, 2] {
        cs[i].set_hook(Some(Box::new(|p| {
            if p == HookPoint::GetForwardPass {
                std::thread::sleep(Duration::from_micros(100));
            }
        })));
    }
    let s = StressSpec {
        get_fraction: 0.5,
        delete_fraction: 0.1,
        hot_keys: 0,
        ..s
    };
    let (out, cs) = stress::run(cs, &s);
    let st = total(&cs);
    eprintln!("{out}\n{st:?}");
    (c, out, st)
}

#[test]
fn migrations_at_high_load_factor() {
    let (c, out, st) = high_load_run(3, Mutations::default());
    assert_clean(&out);
    let occupancy = c.index_occupancy().unwrap() as f64 / c.view().geometry.total_ites() as f64;
    assert!(occupancy >= 0.85, "load factor {occupancy:.3} below 0.85");
    assert!(st.migrations > 1_000, "{st:?}");
    assert!(st.recursive_migrations > 100, "{st:?}");
}

/// A tiny data table with a short expiry: entries are recycled constantly, and writers wait for
/// released entries to expire.
fn recycling_setup(seed: u64, cfg_base: ProtocolConfig) -> (LocalCluster, ProtocolConfig) {
    recycling_setup_in(seed, geometry(), cfg_base)
}

fn recycling_setup_in(
    seed: u64,
    g: Geometry,
    cfg_base: ProtocolConfig,
) -> (LocalCluster, ProtocolConfig) {
    common::recycling(seed, g, cfg_base)
}

/// Operations per thread in each variant of a scenario (4 threads; 7 variants).
const VARIANT_OPS_PER_THREAD: u64 = 6_000;

/// A hook that stalls its client 2 ms past the expiry period on every `every`-th arrival at
/// one of `points`.
fn stall_every(every: u64, points: &'static [HookPoint], expiry_ns: u64) -> Hook {
    let mut n = 0u64;
    Box::new(move |p| {
        if points.contains(&p) {
            n += 1;
            if n.is_multiple_of(every) {
                std::thread::sleep(Duration::from_nanos(expiry_ns + 2_000_000));
            }
        }
    })
}

/// One client stalls past the expiry period now and then, after reading an ITE or right after
/// publishing its DTE, while the others keep writing and recycling: the stalled operation must
/// abort with a timeout (and be retried), never return stale or recycled data.
fn stalled_run(seed: u64, g: Geometry, o: Optimizations, ops: u64) -> (StressOutcome, ClientStats) {
    stalled_run_batched(seed, g, o, ops, false)
}

/// [`stalled_run`]; with `batched`, GETs of the clients without a hook read their candidate
/// ITEs in one batch.
fn stalled_run_batched(
    seed: u64,
    g: Geometry,
    o: Optimizations,
    ops: u64,
    batched: bool,
) -> (StressOutcome, ClientStats) {
    let (c, cfg) = recycling_setup_in(seed, g, cfg());
    c.fabric().set_batches_overlap(batched);
    let cfg = ProtocolConfig {
        optimizations: o,
        ..cfg
    };
    let mut cs = clients(&c, &cfg);
    let expiry = cfg.expiry_ns;
    const POINTS: &[HookPoint] = &[
        HookPoint::AfterIteRead,
        HookPoint::AfterCandidateCas,
        HookPoint::GetAfterDteRead,
    ];
    cs[1].set_hook(Some(stall_every(997, POINTS, expiry)));
    let s = StressSpec {
        keys: 40,
        get_fraction: 0.5,
        ops_per_thread: ops,
        ..spec(seed)
    };
    let (out, cs) = stress::run(cs, &s);
    eprintln!("{out}\n{:?}", cs[1].stats());
    (out, cs[1].stats())
}

#[test]
fn stalled_operations_outlive_the_expiry_period_and_abort() {
    let (out, st) = stalled_run(5, geometry(), Optimizations::default(), OPS_PER_THREAD);
    assert_clean(&out);
    assert!(
        st.timeouts > 10,
        "the stalled client must have timed out: {st:?}"
    );
}

#[test]
fn stalled_operations_with_small_indexes_and_each_optimisation_off() {
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        eprintln!("--- {name}");
        let (out, st) = stalled_run(50 + i as u64, g, o, VARIANT_OPS_PER_THREAD);
        assert_clean_run(name, &out, 4 * VARIANT_OPS_PER_THREAD);
        assert!(
            st.timeouts > 0,
            "{name}: the stalled client never timed out: {st:?}"
        );
    }
}

/// Writes that give up half-way: every client now and then stalls past the expiry period on
/// three attempts in a row (right after its candidate CAS, or before its reverse pass), with
/// only three attempts allowed, so the write gives up with its invalid DTE in the index, past
/// its deadline: the writer completes it, unless another client met it first and did.
/// Linearizable throughout, nothing leaks from the tiny data table, and no key is left
/// wedged: afterwards every key can be written and read back at once.
fn abandoned_writes_run(
    seed: u64,
    g: Geometry,
    o: Optimizations,
    mutations: Mutations,
    ops: u64,
) -> (StressOutcome, ClientStats, LocalCluster) {
    let (c, base) = recycling_setup_in(seed, g, cfg());
    let cfg = ProtocolConfig {
        retry: nessie_protocols::RetryPolicy {
            max_attempts: 3,
            ..base.retry
        },
        optimizations: o,
        mutations,
        ..base
    };
    let mut cs = clients(&c, &cfg);
    for (i, client) in cs.iter_mut().enumerate() {
        client.set_hook(Some(abandon_bursts(i, cfg.expiry_ns)));
    }
    let s = StressSpec {
        keys: 40,
        get_fraction: 0.4,
        ops_per_thread: ops,
        ..spec(seed)
    };
    let (out, cs) = stress::run(cs, &s);
    let st = total(&cs);
    eprintln!("{out}\n{st:?}");
    (out, st, c)
}

/// The hook of client `i` in the abandoned-writes scenarios: now and then three stalls past
/// the expiry period in a row, right after the candidate CAS or before the reverse pass.
fn abandon_bursts(i: usize, expiry_ns: u64) -> Hook {
    let (mut n, mut burst) = (i as u64 * 37, 0u32);
    Box::new(move |p| {
        let point = match p {
            HookPoint::AfterCandidateCas => 0,
            HookPoint::BeforeReversePass => 1,
            _ => return,
        };
        n += 1;
        if burst == 0 && n % 151 == 0 {
            burst = 3;
        }
        if burst > 0 && (n / 151) % 2 == point {
            burst -= 1;
            std::thread::sleep(Duration::from_nanos(expiry_ns + 1_000_000));
        }
    })
}

/// No key is wedged by a leftover: a client with a handful of attempts writes every key.
fn assert_no_key_wedged(name: &str, c: &LocalCluster, o: Optimizations) {
    let cfg = ProtocolConfig {
        retry: nessie_protocols::RetryPolicy {
            max_attempts: 20,
            ..cfg().retry
        },
        optimizations: o,
        ..recycling_setup(11, cfg()).1
    };
    // A writer on each node: a wedged key refuses them all (its entry aborts every writer),
    // whereas a writer whose node holds no free entry of this tiny table (DataTableFull: the
    // others' held pages are theirs) is a capacity limit, and another node's writer goes on.
    let mut writers: Vec<_> = [1, 0, 2]
        .into_iter()
        .map(|n| c.client_with(n, cfg.clone()).unwrap())
        .collect();
    for k in 0..40u64 {
        let key = stress::key_bytes(k);
        let mut full = Vec::new();
        let mut wrote = None;
        for (i, w) in writers.iter_mut().enumerate() {
            match w.put(&key, b"after") {
                Ok(()) => {
                    wrote = Some(i);
                    break;
                }
                Err(e @ nessie_protocols::Error::DataTableFull { .. }) => full.push(e.to_string()),
                Err(e) => panic!("{name}: key {k} is wedged: {e}"),
            }
        }
        let i = wrote.unwrap_or_else(|| {
            panic!("{name}: key {k}: every node's writer is out of room: {full:?}")
        });
        assert_eq!(
            writers[i].get(&key).unwrap().as_deref(),
            Some(&b"after"[..]),
            "{name}"
        );
    }
}

#[test]
fn abandoned_writes_are_completed() {
    let all = Optimizations::default();
    let (out, st, c) =
        abandoned_writes_run(11, geometry(), all, Mutations::default(), OPS_PER_THREAD);
    assert_clean(&out);
    assert!(st.rolled_forward > 20, "{st:?}");
    assert_eq!(st.leaked, 0, "{st:?}");
    assert_no_key_wedged("large index", &c, all);
}

#[test]
fn abandoned_writes_with_small_indexes_and_each_optimisation_off() {
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        eprintln!("--- {name}");
        let (out, st, c) = abandoned_writes_run(
            60 + i as u64,
            g,
            o,
            Mutations::default(),
            VARIANT_OPS_PER_THREAD,
        );
        assert_clean_run(name, &out, 4 * VARIANT_OPS_PER_THREAD);
        assert!(st.rolled_forward > 0, "{name}: {st:?}");
        assert_eq!(st.leaked, 0, "{name}: {st:?}");
        assert_no_key_wedged(name, &c, o);
    }
}

#[test]
fn mutation_completing_abandoned_writes_to_empty_is_caught() {
    let (out, st, _) = abandoned_writes_run(
        12,
        geometry(),
        Optimizations::default(),
        Mutations {
            complete_to_empty: true,
            ..Mutations::default()
        },
        OPS_PER_THREAD,
    );
    assert!(st.rolled_forward > 0, "{st:?}");
    assert_violation(&out, "completing abandoned writes to empty");
}

// Mutation tests: each breaks one protocol rule; the same stress run must then report a
// violation. This is what shows the checker (and the stress runs above) have teeth.

/// Readers that ignore their timer and stall between a DTE's header and its value read the
/// value of whatever write reused the entry meanwhile.
#[test]
fn mutation_ignoring_the_operation_timer_is_caught() {
    let (c, cfg) = recycling_setup(
        10,
        ProtocolConfig {
            mutations: Mutations {
                ignore_op_timer: true,
                ..Mutations::default()
            },
            ..cfg()
        },
    );
    let mut cs = clients(&c, &cfg);
    let expiry = cfg.expiry_ns;
    for client in cs.iter_mut().take(2) {
        client.set_hook(Some(stall_every(53, &[HookPoint::BeforeValueRead], expiry)));
    }
    let s = StressSpec {
        keys: 40,
        get_fraction: 0.6,
        ops_per_thread: VARIANT_OPS_PER_THREAD,
        ..spec(10)
    };
    let (out, _) = stress::run(cs, &s);
    eprintln!("{out}");
    assert_violation(&out, "ignoring the operation timer");
}

/// A GET misses a key only if a MIGRATE moves it into a candidate the GET has already passed:
/// the same high-load run as above must fail once GETs skip their reverse pass.
#[test]
fn mutation_skipping_the_reverse_pass_is_caught() {
    let (_, out, st) = high_load_run(
        6,
        Mutations {
            skip_get_reverse_pass: true,
            ..Mutations::default()
        },
    );
    assert!(st.migrations > 0);
    assert_violation(&out, "skipping the GET reverse pass");
}

/// GETs that read their candidate ITEs in one batch (`InProcFabric::set_batches_overlap`, as
/// UCX over verbs) and then check them in the protocol's order: the high-load run, with
/// MIGRATEs moving keys between candidates under the passes, is linearizable, and so is the
/// stalled run over small indexes and with each optimisation off.
#[test]
fn batched_candidate_reads_at_high_load_and_in_every_variant() {
    let (c, out, st) = high_load_run_batched(13, Mutations::default(), true);
    assert_clean(&out);
    assert!(st.migrations > 0, "{st:?}");
    let t = c.fabric().stats().total(None);
    assert!(t.total_ops() > 0);
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        eprintln!("--- batched, {name}");
        let (out, _) = stalled_run_batched(70 + i as u64, g, o, VARIANT_OPS_PER_THREAD, true);
        assert_clean_run(name, &out, 4 * VARIANT_OPS_PER_THREAD);
    }
}

/// Readers that pause between a DTE's header and its value, well within their timer, in a tiny
/// recycling table: the entries they read cannot have been reused meanwhile.
fn paused_readers_run(mutations: Mutations) -> StressOutcome {
    let base = ProtocolConfig { mutations, ..cfg() };
    let (c, cfg) = recycling_setup(7, base);
    let mut cs = clients(&c, &cfg);
    let pause = cfg.expiry_ns / 4;
    for client in cs.iter_mut().take(2) {
        let mut n = 0u64;
        client.set_hook(Some(Box::new(move |p| {
            if p == HookPoint::BeforeValueRead {
                n += 1;
                if n.is_multiple_of(7) {
                    std::thread::sleep(Duration::from_nanos(pause));
                }
            }
        })));
    }
    let s = StressSpec {
        keys: 40,
        get_fraction: 0.6,
        ops_per_thread: VARIANT_OPS_PER_THREAD,
        ..spec(7)
    };
    let (out, _) = stress::run(cs, &s);
    eprintln!("{out}");
    out
}

#[test]
fn readers_pausing_mid_entry_read_nothing_reused() {
    let out = paused_readers_run(Mutations::default());
    assert_clean_run("paused readers", &out, 4 * VARIANT_OPS_PER_THREAD);
}

/// Entries reused at once, not an expiry period after they were released: the paused readers
/// above read the value of whatever write reused the entry meanwhile. (Before ITEs carried
/// sequence numbers, the same run without pauses was caught through ABA on ITE words alone: a
/// reused entry put back in the same slot looked unchanged to a reverse pass.)
#[test]
fn mutation_recycling_without_expiry_is_caught() {
    let out = paused_readers_run(Mutations {
        recycle_without_expiry: true,
        ..Mutations::default()
    });
    assert_violation(&out, "reusing DTEs without expiry");
}

#[test]
fn mutation_ignoring_the_valid_flag_is_caught() {
    let base = ProtocolConfig {
        mutations: Mutations {
            skip_valid_check: true,
            ..Mutations::default()
        },
        ..cfg()
    };
    let c = LocalCluster::new(geometry(), base.clone(), delay(8)).unwrap();
    let s = StressSpec {
        keys: 16,
        delete_fraction: 0.2,
        ..spec(8)
    };
    let (out, _, _) = run(&c, &base, &s);
    assert_violation(&out, "returning invalid DTEs");
}

// Size classes under load: values of every size, data tables of a few pages, classes running
// full, entries placed in pages claimed on other nodes, and pages released by one class and
// claimed again by another while operations that saw the old entries may still be running.

/// Largest value of the mixed-size runs: with 12-byte keys, values of 8..=512 bytes span all
/// 10 classes of the geometry (entries of 96 to 560 bytes, 8 KiB pages).
const MIXED_VALUE_MAX: u32 = 512;

/// Nodes of the mixed-size runs' four threads: three writers share node 0, whose pages run
/// out first; node 2 has no client, so every page of it in use was claimed from elsewhere.
const MIXED_NODES: [u16; 4] = [0, 0, 0, 1];

/// `base` with values up to [`MIXED_VALUE_MAX`] and data tables of `pages` pages per node
/// (the delete reserve included).
fn mixed_geometry(base: Geometry, pages: u64) -> Geometry {
    let g = Geometry {
        value_max: MIXED_VALUE_MAX,
        ..base
    };
    let classes = g.classes().unwrap();
    let per_page = classes.per_page((classes.len() - 1) as u8);
    let g = Geometry {
        dtes_per_node: (pages - nessie_store::classtable::RESERVE_PAGES) * per_page,
        ..g
    };
    assert_eq!(g.data_pages_per_node(), pages);
    g
}

/// What a [`PageWatch`] saw of the page tables and allocators while a run went on.
#[derive(Debug, Default)]
struct PagesSeen {
    samples: u64,
    /// Most pages on other nodes that the allocators held at once.
    max_remote_pages: u64,
    /// Every class each claimed page was seen serving, by (host, page).
    classes: BTreeMap<(NodeId, u64), BTreeSet<u8>>,
    /// Pages seen claimed by a node other than their host.
    foreign_claims: BTreeSet<(NodeId, u64)>,
    /// After the run: pages released and claimed again (generation ≥ 2), and the largest
    /// generation.
    reclaimed_pages: usize,
    max_generation: u64,
    /// After the run: entries reclaimed by scans, all nodes.
    reclaimed_entries: u64,
}

impl PagesSeen {
    /// Pages seen serving more than one class over the run.
    fn shared_between_classes(&self) -> usize {
        self.classes.values().filter(|c| c.len() > 1).count()
    }
}

/// Samples every node's page table and allocator usage from its own thread until stopped.
struct PageWatch {
    stop: Arc<AtomicBool>,
    handle: std::thread::JoinHandle<PagesSeen>,
    fabric: Arc<InProcFabric>,
    tables: Vec<Arc<ClassTable>>,
    pages: u64,
}

impl PageWatch {
    fn start(c: &LocalCluster) -> Self {
        let g = &c.view().geometry;
        let pages = g.data_pages_per_node();
        let tables: Vec<Arc<ClassTable>> =
            (0..g.nodes).map(|n| c.table(n as NodeId).clone()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let (fabric, t, s) = (c.fabric().clone(), tables.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            let mut ep = fabric.endpoint(0);
            let mut seen = PagesSeen::default();
            while !s.load(Ordering::Relaxed) {
                seen.samples += 1;
                let remote: u64 = t
                    .iter()
                    .flat_map(|t| t.usage())
                    .map(|u| u.remote_pages)
                    .sum();
                seen.max_remote_pages = seen.max_remote_pages.max(remote);
                for host in 0..t.len() as NodeId {
                    let words = pages::read_table(&mut ep, host, pages).unwrap();
                    for (p, w) in words.iter().enumerate().filter(|(_, w)| w.is_claimed()) {
                        let key = (host, p as u64);
                        seen.classes.entry(key).or_default().insert(w.class());
                        if w.claimer() != host {
                            seen.foreign_claims.insert(key);
                        }
                    }
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            seen
        });
        Self {
            stop,
            handle,
            fabric: c.fabric().clone(),
            tables,
            pages,
        }
    }

    fn finish(self) -> PagesSeen {
        self.stop.store(true, Ordering::Relaxed);
        let mut seen = self.handle.join().expect("page watch panicked");
        let mut ep = self.fabric.endpoint(0);
        for host in 0..self.tables.len() as NodeId {
            for w in pages::read_table(&mut ep, host, self.pages).unwrap() {
                seen.reclaimed_pages += (w.generation() >= 2) as usize;
                seen.max_generation = seen.max_generation.max(w.generation());
            }
        }
        seen.reclaimed_entries = self
            .tables
            .iter()
            .map(|t| t.counters().reclaimed_total)
            .sum();
        seen
    }
}

/// The cluster and configuration of a mixed-size run: `pages` pages per node, expiry of
/// `expiry_ms`, the given optimisations.
fn mixed_setup(
    seed: u64,
    g: Geometry,
    pages: u64,
    o: Optimizations,
    expiry_ms: u64,
) -> (LocalCluster, ProtocolConfig) {
    let cfg = ProtocolConfig {
        expiry_ns: expiry_ms * 1_000_000,
        clock_margin_ns: 0,
        optimizations: o,
        whole_read_max: nessie_protocols::config::WHOLE_READ_MAX,
        ..cfg()
    };
    let g = mixed_geometry(g, pages);
    (LocalCluster::new(g, cfg.clone(), delay(seed)).unwrap(), cfg)
}

/// Mixed sizes on `keys` keys, a few hot.
fn mixed_spec(seed: u64, keys: u64, ops: u64) -> StressSpec {
    StressSpec {
        keys,
        hot_keys: 4,
        hot_fraction: 0.3,
        get_fraction: 0.4,
        delete_fraction: 0.05,
        value_size: (8, MIXED_VALUE_MAX as usize),
        sizes_by_key: false,
        ops_per_thread: ops,
        ..spec(seed)
    }
}

/// Run the mixed-size workload with one client per entry of [`MIXED_NODES`] (`hooks` installed
/// on the first ones), watching the page tables.
fn mixed_run(
    c: &LocalCluster,
    cfg: &ProtocolConfig,
    s: &StressSpec,
    hooks: Vec<Hook>,
) -> (StressOutcome, ClientStats, PagesSeen) {
    let mut cs: Vec<_> = MIXED_NODES
        .iter()
        .map(|&n| c.client_with(n, cfg.clone()).unwrap())
        .collect();
    for (client, h) in cs.iter_mut().zip(hooks) {
        client.set_hook(Some(h));
    }
    let watch = PageWatch::start(c);
    let (out, cs) = stress::run(cs, s);
    let seen = watch.finish();
    let st = total(&cs);
    eprintln!("{out}\n{st:?}\n{seen:?}");
    for n in 0..c.view().geometry.nodes as NodeId {
        eprintln!(
            "node {n}: {:?}\n  {:?}",
            c.table(n).counters(),
            c.table(n).usage()
        );
    }
    (out, st, seen)
}

/// Errors a mixed-size run may end operations with: retries exhausted by contention or by
/// timeouts, or no room for the entry's class on any node (and a rare `IndexFull`, counted
/// apart).
const MIXED_ERRORS: [&str; 3] = ["Contended", "DataTableFull", "Timeout"];

/// A mixed-size run was linearizable, only ever failed for want of room or by retrying too
/// long, never let a failed write's value be read, and really exercised the allocator: a class
/// ran full (writers waited for released entries to expire), entries were placed on other
/// nodes (also on node 2, which has no client), recycled entries were reclaimed, and pages
/// went back to the pool and were claimed again, some by another class.
fn assert_mixed_clean(
    name: &str,
    out: &StressOutcome,
    st: &ClientStats,
    seen: &PagesSeen,
    min_ops: u64,
) {
    assert_clean_run(name, out, min_ops);
    for kind in out.errors.keys() {
        assert!(
            MIXED_ERRORS.contains(&kind.as_str()) || kind == "IndexFull",
            "{name}: unexpected errors {:?}",
            out.errors
        );
    }
    // A small index may refuse a rare PUT (a bounded MIGRATE walk below capacity; one in
    // 16,000 on a loaded CI run, 2026-12-02), never more than the base runs allow.
    let index_full = out.errors.get("IndexFull").copied().unwrap_or(0);
    assert!(
        index_full * nessie_testkit::assertions::MAX_INDEX_FULL_PER <= out.ops,
        "{name}: {index_full} PUTs found the index full: {out}"
    );
    assert!(
        out.ok_ops * 4 >= out.ops * 3,
        "{name}: too few operations succeeded for the history to mean much: {out}"
    );
    assert_eq!(
        out.failed_writes_read, 0,
        "{name}: a failed PUT's value was read"
    );
    assert!(st.table_full_waits > 0, "{name}: no class ran full: {st:?}");
    assert!(
        seen.max_remote_pages > 0,
        "{name}: no entry was placed on another node: {seen:?}"
    );
    assert!(
        seen.foreign_claims.iter().any(|&(host, _)| host == 2),
        "{name}: no page of the client-less node was claimed: {seen:?}"
    );
    assert!(
        seen.reclaimed_entries > 0,
        "{name}: no recycled entry was reclaimed"
    );
    assert!(
        seen.reclaimed_pages > 0,
        "{name}: no page was released and claimed again: {seen:?}"
    );
    assert!(
        seen.shared_between_classes() > 0,
        "{name}: no page served two classes: {seen:?}"
    );
}

/// Pages per node of the mixed-size runs: 5 for values and the delete reserve, fewer than the
/// 10 classes node 0's three writers alone need a page for.
const MIXED_PAGES: u64 = 6;

/// Expiry of the mixed-size runs: released entries come back after 3 ms.
const MIXED_EXPIRY_MS: u64 = 3;

#[test]
fn mixed_sizes_fill_classes_and_place_remotely() {
    let all = Optimizations::default();
    let (c, cfg) = mixed_setup(20, geometry(), MIXED_PAGES, all, MIXED_EXPIRY_MS);
    let s = mixed_spec(20, 48, OPS_PER_THREAD);
    let (out, st, seen) = mixed_run(&c, &cfg, &s, vec![]);
    assert_mixed_clean("", &out, &st, &seen, nessie_testkit::assertions::MIN_OPS);
}

/// Operations per thread in each variant of the mixed-size scenarios (4 threads; 7 variants).
const MIXED_VARIANT_OPS_PER_THREAD: u64 = 4_000;

#[test]
fn mixed_sizes_with_small_indexes_and_each_optimisation_off() {
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        eprintln!("--- {name}");
        let seed = 70 + i as u64;
        let (c, cfg) = mixed_setup(seed, g, MIXED_PAGES, o, MIXED_EXPIRY_MS);
        let s = mixed_spec(seed, 40, MIXED_VARIANT_OPS_PER_THREAD);
        let (out, st, seen) = mixed_run(&c, &cfg, &s, vec![]);
        assert_mixed_clean(name, &out, &st, &seen, 4 * MIXED_VARIANT_OPS_PER_THREAD);
    }
}

/// How often stalls saw the pages move: counted by [`stall_watching_pages`].
#[derive(Debug, Default)]
struct StallCounts {
    stalls: AtomicU64,
    /// Stalls during which some page went back to the pool and was claimed again.
    page_reclaimed: AtomicU64,
    /// Stalls during which some page was claimed again for another class.
    page_changed_class: AtomicU64,
}

/// Like [`stall_every`] but three expiry periods long, long enough for entries recycled at its
/// start to be reclaimed and their pages released and claimed again; reads every page table
/// before and after each stall, counting in `counts` the stalls during which that happened.
fn stall_watching_pages(
    every: u64,
    points: &'static [HookPoint],
    expiry_ns: u64,
    c: &LocalCluster,
    counts: Arc<StallCounts>,
) -> Hook {
    let (nodes, pages) = (
        c.view().geometry.nodes,
        c.view().geometry.data_pages_per_node(),
    );
    let mut ep = c.fabric().endpoint(0);
    let mut snapshot = move || -> Vec<pages::PageWord> {
        (0..nodes as NodeId)
            .flat_map(|host| pages::read_table(&mut ep, host, pages).unwrap())
            .collect()
    };
    let mut n = 0u64;
    Box::new(move |p| {
        if !points.contains(&p) {
            return;
        }
        n += 1;
        if !n.is_multiple_of(every) {
            return;
        }
        let before = snapshot();
        std::thread::sleep(Duration::from_nanos(3 * expiry_ns));
        let after = snapshot();
        let mut reclaimed = false;
        let mut changed_class = false;
        for (b, a) in before.iter().zip(&after) {
            // Held before and after, and claimed again in between (each claim moves the
            // generation on by one).
            if b.is_claimed() && a.is_claimed() && a.generation() > b.generation() {
                reclaimed = true;
                changed_class |= a.class() != b.class();
            }
        }
        counts.stalls.fetch_add(1, Ordering::Relaxed);
        counts
            .page_reclaimed
            .fetch_add(reclaimed as u64, Ordering::Relaxed);
        counts
            .page_changed_class
            .fetch_add(changed_class as u64, Ordering::Relaxed);
    })
}

/// Stalls around DTE writes: after the new DTE is published, before it is set valid, before
/// the reverse pass; and around DTE reads: after an ITE read, before a value read, after a
/// GET's DTE read.
const DTE_STALL_POINTS: &[HookPoint] = &[
    HookPoint::AfterIteRead,
    HookPoint::AfterCandidateCas,
    HookPoint::BeforeReversePass,
    HookPoint::BeforeSetValid,
    HookPoint::BeforeValueRead,
    HookPoint::GetAfterDteRead,
];

/// How often the two stalling clients stall: every so many arrivals at a stall point.
const STALL_EVERY: [u64; 2] = [211, 199];

/// Two clients (one on each writing node) stall past the expiry period now and then, in the
/// middle of writing or reading a DTE, while the others keep filling classes, placing entries
/// on other nodes and recycling: pages are released and claimed again by other classes under
/// the stalled operations, which must time out and retry, never return or commit stale data.
#[test]
fn stalls_around_dte_writes_while_pages_move_between_classes() {
    let seed = 21;
    let all = Optimizations::default();
    let (c, cfg) = mixed_setup(seed, small_index(), MIXED_PAGES, all, MIXED_EXPIRY_MS);
    let counts = Arc::new(StallCounts::default());
    let hooks = vec![
        stall_watching_pages(
            STALL_EVERY[0],
            DTE_STALL_POINTS,
            cfg.expiry_ns,
            &c,
            counts.clone(),
        ),
        // Clients 1 and 2 share node 0 with client 0; client 3 is node 1's.
        Box::new(|_| {}),
        Box::new(|_| {}),
        stall_watching_pages(
            STALL_EVERY[1],
            DTE_STALL_POINTS,
            cfg.expiry_ns,
            &c,
            counts.clone(),
        ),
    ];
    let ops = 10_000;
    let (out, st, seen) = mixed_run(&c, &cfg, &mixed_spec(seed, 40, ops), hooks);
    eprintln!("{counts:?}");
    assert_mixed_clean("", &out, &st, &seen, 4 * ops);
    assert!(st.timeouts > 0, "no stalled operation timed out: {st:?}");
    let stalls = counts.stalls.load(Ordering::Relaxed);
    assert!(stalls >= 50, "only {stalls} stalls");
    assert!(
        counts.page_changed_class.load(Ordering::Relaxed) >= 10,
        "pages seldom moved to another class during a stall: {counts:?}"
    );
}

/// The abandoned-writes scenario with mixed sizes: writes that give up half-way are completed
/// while their DTEs (and the copies that complete them) sit in pages of other nodes and other
/// classes come and go; nothing leaks and no key is left wedged.
#[test]
fn abandoned_writes_with_mixed_sizes_are_completed_across_nodes() {
    let seed = 22;
    let all = Optimizations::default();
    // The 5 ms expiry of the other abandoned-writes runs.
    let (c, base) = mixed_setup(seed, small_index(), MIXED_PAGES, all, 5);
    let cfg = ProtocolConfig {
        retry: nessie_protocols::RetryPolicy {
            max_attempts: 3,
            ..base.retry
        },
        ..base
    };
    let hooks = (0..MIXED_NODES.len())
        .map(|i| abandon_bursts(i, cfg.expiry_ns))
        .collect();
    let ops = 8_000;
    let (out, st, seen) = mixed_run(&c, &cfg, &mixed_spec(seed, 40, ops), hooks);
    assert_mixed_clean("", &out, &st, &seen, 4 * ops);
    assert!(st.rolled_forward > 0, "{st:?}");
    assert_eq!(st.leaked, 0, "{st:?}");
    assert_no_key_wedged_in_full_tables(&c, &cfg, 40);
}

/// No key is wedged by a leftover, in tables that may be full: once every released entry has
/// expired and been reclaimed (a stand-in for the background reclaimer nothing runs yet, see
/// `pages_of_an_idle_node_are_given_back_once_their_entries_expire`), a new worker with a
/// handful of attempts writes every key and reads it back, or finds no room for its entry. A
/// write fails for want of room only after its candidate search succeeded, which a leftover
/// of another writer makes abort.
fn assert_no_key_wedged_in_full_tables(c: &LocalCluster, base: &ProtocolConfig, keys: u64) {
    std::thread::sleep(Duration::from_nanos(2 * base.expiry_ns));
    for n in 0..c.view().geometry.nodes as NodeId {
        c.table(n).reclaim(&mut c.fabric().endpoint(n)).unwrap();
    }
    let cfg = ProtocolConfig {
        retry: nessie_protocols::RetryPolicy {
            max_attempts: 20,
            ..base.retry
        },
        ..base.clone()
    };
    let mut w = c.client_with(1, cfg).unwrap();
    let mut no_room = 0;
    for k in 0..keys {
        let key = stress::key_bytes(k);
        match w.put(&key, b"after") {
            Ok(()) => assert_eq!(w.get(&key).unwrap().as_deref(), Some(&b"after"[..])),
            Err(nessie_protocols::Error::DataTableFull { .. }) => no_room += 1,
            Err(e) => panic!("key {k} is wedged: {e}"),
        }
    }
    assert!(
        no_room < keys / 2,
        "{no_room} of {keys} writes found no room"
    );
}

// Bugs found by the mixed-size runs, each reduced to a small deterministic scenario: each test
// failed before its fix and says what the fix achieves.

/// Pages held by a node whose clients have stopped writing come back once every entry in them
/// has been recycled and has expired: the node's reclaimer (`nessie_cluster::reclaimer`) scans
/// them although no allocation of its own does. (Without it, writers elsewhere failed with
/// `DataTableFull`, nothing awaiting expiry, while a third of the cluster's memory was
/// reclaimable.)
///
/// Three pages per node, one kept for deletes and one for the node's own writers. Node 1 fills
/// its two value pages with large values, then goes idle; node 0 deletes all of them and writes
/// four pages' worth of large values: its own two, the one of node 2 it may claim, and one of
/// node 1's, which only node 1's reclaimer can give back.
#[test]
fn pages_of_an_idle_node_are_given_back_once_their_entries_expire() {
    let (c, cfg) = mixed_setup(30, geometry(), 3, Optimizations::default(), 5);
    let big = vec![7u8; MIXED_VALUE_MAX as usize];
    let classes = &c.view().classes;
    let per_page = classes.per_page((classes.len() - 1) as u8);
    let mut idle = c.client_with(1, cfg.clone()).unwrap();
    for k in 0..2 * per_page {
        idle.put(&stress::key_bytes(k), &big).unwrap();
    }
    let held = c.table(1).usage().iter().map(|u| u.pages).sum::<u64>();
    assert_eq!(held, 2, "node 1 holds its own two value pages");
    let mut w = c.client_with(0, cfg.clone()).unwrap();
    for k in 0..2 * per_page {
        w.delete(&stress::key_bytes(k)).unwrap();
    }
    // The entries expire, then node 1's reclaimer (every 10 ms at this expiry) finds them.
    std::thread::sleep(Duration::from_millis(60));
    for k in 0..4 * per_page {
        let key = stress::key_bytes(1_000 + k);
        w.put(&key, &big).unwrap_or_else(|e| {
            panic!(
                "write {k} of {}: {e}\nnode 1 still holds {:?}",
                4 * per_page,
                c.table(1).usage()
            )
        });
    }
    let on_node_1 = c
        .table(0)
        .usage()
        .iter()
        .map(|u| u.remote_pages)
        .sum::<u64>();
    assert_eq!(on_node_1, 2, "node 0 writes into pages of nodes 1 and 2");
    assert!(c.table(1).counters().reclaimed_total >= 2 * per_page);
}

/// The delete reserve keeps room for deletes. Values may not claim a node's last free page; a
/// DELETE that finds no other room claims it as a reserve page, whose entries only deletes
/// take. (It used to become an ordinary page of the smallest class, small values used up its
/// entries, and every later DELETE failed with `DataTableFull`: the store could not be
/// emptied.)
///
/// One node of two pages: one page of large values, then one DELETE (its marker takes the
/// reserve page) and small values until the small class is full.
#[test]
fn deletes_find_room_after_values_have_filled_every_page() {
    let one_node = Geometry {
        nodes: 1,
        ..geometry()
    };
    let (c, cfg) = mixed_setup(31, one_node, 2, Optimizations::default(), 2);
    let big = vec![7u8; MIXED_VALUE_MAX as usize];
    let classes = &c.view().classes;
    let per_page = classes.per_page((classes.len() - 1) as u8);
    let mut w = c.client_with(0, cfg.clone()).unwrap();
    for k in 0..per_page {
        w.put(&stress::key_bytes(k), &big).unwrap();
    }
    let e = w.put(&stress::key_bytes(per_page), &big).unwrap_err();
    assert!(
        matches!(e, nessie_protocols::Error::DataTableFull { .. }),
        "{e}"
    );
    w.delete(&stress::key_bytes(0)).unwrap();
    // Small values until their class is full (their writers wait for expired entries first).
    let mut small = 0;
    while w
        .put(&stress::key_bytes(1_000 + small), b"small value")
        .is_ok()
    {
        small += 1;
        assert!(small < 1_000, "the small class never filled up");
    }
    eprintln!("{small} small values; {:?}", c.table(0).usage());
    std::thread::sleep(Duration::from_nanos(2 * cfg.expiry_ns));
    w.delete(&stress::key_bytes(1))
        .expect("a delete must find room for its marker");
}

/// What an endpoint that sleeps before its next read of a data table once `armed` is set runs
/// in front of its operations.
struct StallNextDataRead {
    armed: Arc<AtomicBool>,
    stall: Duration,
}

impl Interposer for StallNextDataRead {
    fn before(&mut self, op: Op) -> Result<(), nessie_fabric::FabricError> {
        let read = matches!(op, Op::Read(_) | Op::LocalRead(_));
        if read
            && op.addr().region == nessie_store::DATA_REGION
            && self.armed.swap(false, Ordering::SeqCst)
        {
            std::thread::sleep(self.stall);
        }
        Ok(())
    }
}

/// A writer that gives up and whose completion of its own leftover outlives the expiry period
/// (a slow READ of the DTE it copies, a preempted thread) tries again
/// (`FINISH_OWN_ATTEMPTS`), rather than leave the entry for others: the write takes effect and
/// succeeds, and nothing leaks. (When writers undid instead of completing, an undo that timed
/// out once left the entry behind and wedged the key: the mixed-size abandoned-writes run
/// leaked 4 to 12 entries per run at a 3 ms expiry on a loaded machine.)
///
/// A PUT with one attempt stalls past the expiry right after its candidate CAS (so it gives
/// up), then its completion's read of the DTE is stalled past the expiry too.
#[test]
fn a_completion_of_its_own_leftover_that_times_out_is_retried() {
    let (c, base) = recycling_setup(32, cfg());
    let cfg = ProtocolConfig {
        retry: nessie_protocols::RetryPolicy {
            max_attempts: 1,
            ..base.retry
        },
        ..base
    };
    let stall = Duration::from_nanos(cfg.expiry_ns + 2_000_000);
    let key = stress::key_bytes(1);
    let mut other = c.client_with(1, base.clone()).unwrap();
    other.put(&key, b"before").unwrap();

    let armed = Arc::new(AtomicBool::new(false));
    let ep = Interposed::new(
        c.fabric().endpoint(0),
        StallNextDataRead {
            armed: armed.clone(),
            stall,
        },
    );
    // A worker number LocalCluster never hands out.
    let mut w = CdClient::new(ep, c.view().clone(), c.table(0).clone(), 60_000, cfg).unwrap();
    let mut phase = 0;
    w.set_hook(Some(Box::new(move |p| match (phase, p) {
        (0, HookPoint::AfterCandidateCas) => {
            std::thread::sleep(stall);
            phase = 1;
        }
        // The completion's read of the candidate, just before it reads the DTE.
        (1, HookPoint::AfterIteRead) => {
            armed.store(true, Ordering::SeqCst);
            phase = 2;
        }
        _ => {}
    })));
    w.put(&key, b"completed").unwrap();
    assert_eq!(
        other.get(&key).unwrap().as_deref(),
        Some(&b"completed"[..]),
        "the write took effect"
    );
    let st = w.stats();
    assert_eq!(st.rolled_forward, 1, "{st:?}");
    assert!(
        st.timeouts >= 2,
        "the attempt and a completion timed out: {st:?}"
    );
    other
        .put(&key, b"after")
        .unwrap_or_else(|e| panic!("the key is wedged: {e}; abandoned writer {st:?}"));
    assert_eq!(st.leaked, 0, "{st:?}");
}

/// An eviction run: mixed sizes on three times the keys the data tables hold, allkeys-random,
/// readers paused mid-entry now and then and evictions paused between their sampling and
/// their DELETE. Every eviction is in the history as a DELETE within its write's interval.
fn eviction_run(seed: u64, g: Geometry, o: Optimizations, ops: u64) -> StressOutcome {
    eviction_run_with(seed, g, o, ops, Evicting::default())
}

/// How an eviction run evicts, expires and pauses.
#[derive(Clone)]
struct Evicting {
    policy: Eviction,
    /// Every `n`th PUT writes an item expiring after the duration ([`StressSpec::ttl`]).
    ttl: Option<(u64, Duration)>,
    /// Pauses `sixteenths` sixteenths of the expiry period long, at every `every`-th hook.
    sixteenths: u64,
    every: u64,
    mutations: Mutations,
    /// Keys of the run, and its values' sizes.
    keys: u64,
    value_size: (usize, usize),
    /// [`StressSpec::size_shift`].
    size_shift: Option<(u64, (usize, usize))>,
}

impl Default for Evicting {
    fn default() -> Self {
        Self {
            policy: Eviction::AllkeysRandom,
            ttl: None,
            sixteenths: 4,
            every: 5,
            mutations: Mutations::default(),
            keys: 600,
            value_size: (8, MIXED_VALUE_MAX as usize),
            size_shift: None,
        }
    }
}

/// [`eviction_run`] as `e` says.
fn eviction_run_with(
    seed: u64,
    g: Geometry,
    o: Optimizations,
    ops: u64,
    e: Evicting,
) -> StressOutcome {
    eviction_run_counted(seed, g, o, ops, e).0
}

/// [`eviction_run_with`], with the clients' counters.
fn eviction_run_counted(
    seed: u64,
    g: Geometry,
    o: Optimizations,
    ops: u64,
    e: Evicting,
) -> (StressOutcome, ClientStats) {
    let (sixteenths, every) = (e.sixteenths, e.every);
    let (c, cfg) = mixed_setup(seed, g, MIXED_PAGES, o, MIXED_EXPIRY_MS);
    let cfg = ProtocolConfig {
        eviction: e.policy,
        mutations: e.mutations,
        // The page mover checks as often, relative to the 3 ms expiry period, as by default
        // to the default's 1 s: pages move within these short runs.
        move_check_ns: cfg.expiry_ns / 20,
        ..cfg
    };
    let pause = cfg.expiry_ns * sixteenths / 16;
    let mut cs = clients(&c, &cfg);
    for (i, client) in cs.iter_mut().enumerate() {
        let mut n = 0u64;
        client.set_hook(Some(Box::new(move |p| {
            let wide = match p {
                HookPoint::BeforeValueRead => i < 2,
                HookPoint::EvictBeforeDelete => true,
                _ => false,
            };
            if wide {
                n += 1;
                if n.is_multiple_of(every) {
                    std::thread::sleep(Duration::from_nanos(pause));
                }
            }
        })));
    }
    let s = StressSpec {
        get_fraction: 0.5,
        delete_fraction: 0.0,
        hot_keys: 8,
        ttl: e.ttl,
        size_shift: e.size_shift,
        value_size: e.value_size,
        ..mixed_spec(seed, e.keys, ops)
    };
    let (out, cs) = stress::run(cs, &s);
    let st = total(&cs);
    eprintln!(
        "{out}\n{}: evictions recorded: {}, expiries {}\n{st:?}",
        e.policy, out.evictions, out.expiries,
    );
    (out, st)
}

/// Writers make room by evicting; the history, with the evictions as DELETEs, is
/// linearizable, no value is corrupt, and nothing is refused for want of room.
#[test]
fn evictions_make_room_and_the_history_stays_linearizable() {
    let out = eviction_run(90, geometry(), Optimizations::default(), OPS_PER_THREAD / 4);
    assert_clean_run("eviction", &out, OPS_PER_THREAD);
    assert!(out.evictions > 0, "nothing was evicted: {out}");
    assert!(
        !out.errors.contains_key("DataTableFull") && !out.errors.contains_key("IndexFull"),
        "refused for want of room: {out}"
    );
}

#[test]
fn evictions_with_small_indexes_and_each_optimisation_off() {
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        eprintln!("--- {name}");
        let out = eviction_run(100 + i as u64, g, o, MIXED_VARIANT_OPS_PER_THREAD / 2);
        assert_clean_run(name, &out, 2 * MIXED_VARIANT_OPS_PER_THREAD);
        assert!(out.evictions > 0, "{name}: nothing was evicted: {out}");
    }
}

/// Writers stalled in the middle of an eviction for two expiry periods (as a paused process
/// would be), between reading the victim's version and deleting it, and readers stalled as long
/// mid-entry: the stalled DELETE is still judged on the version sampled, and the history stays
/// linearizable.
#[test]
fn evictions_stalled_past_the_expiry_period() {
    let out = eviction_run_with(
        96,
        geometry(),
        Optimizations::default(),
        MIXED_VARIANT_OPS_PER_THREAD,
        Evicting {
            sixteenths: 32,
            every: 40,
            ..Evicting::default()
        },
    );
    assert_clean_run("stalled evictions", &out, 4 * MIXED_VARIANT_OPS_PER_THREAD);
    assert!(out.evictions > 0, "nothing was evicted: {out}");
}

/// The page mover (`cd/evict.rs`): each thread writes values of 8..32 bytes for the first
/// third of its operations, of 256..512 for the second and small ones again for the last, on
/// twice the keys the data tables hold, so the small classes hold the pages when the large
/// ones need them, and then the other way round. With evictions paused
/// before their DELETE and readers paused mid-entry, pages are drained while clients read and
/// rewrite the items on them: the history, with every eviction as a DELETE, stays
/// linearizable, nothing is refused for want of room, and pages did move. Also on small
/// indexes with each optimisation off, history-checked; there the index (72 entries) fills
/// long before the data tables, and pages move seldom if at all. (The mutation `no_page_mover`
/// is caught in `cd/evict.rs`, where the old size keeps its pages.)
#[test]
fn a_size_shift_moves_pages_and_the_history_stays_linearizable() {
    let ops = MIXED_VARIANT_OPS_PER_THREAD / 2;
    let mut runs = vec![(
        "all optimisations".to_string(),
        geometry(),
        Optimizations::default(),
    )];
    runs.extend(
        variants()
            .into_iter()
            .map(|(n, g, o)| (n.to_string(), g, o)),
    );
    for (i, (name, g, o)) in runs.into_iter().enumerate() {
        eprintln!("--- {name}");
        let e = Evicting {
            policy: Eviction::AllkeysLru,
            keys: 1_200,
            value_size: (8, 32),
            size_shift: Some((ops / 3, (256, MIXED_VALUE_MAX as usize))),
            ..Evicting::default()
        };
        let (out, st) = eviction_run_counted(180 + i as u64, g.clone(), o, ops, e);
        assert_clean_run(&name, &out, 4 * ops);
        if g.ites_per_node == geometry().ites_per_node {
            assert!(st.pages_moved > 0, "{name}: no page moved: {st:?}");
            assert!(
                !out.errors.contains_key("DataTableFull"),
                "{name}: refused for want of room: {out}"
            );
        }
    }
}

/// Items of every third PUT expire 4 ms after they are written: the history holds each expiry
/// (`Op::Expire`), so a GET after it that still finds the value is a violation.
const TTL: Option<(u64, Duration)> = Some((3, Duration::from_millis(4)));

/// The expiries of a run under `policy`: a `volatile-*` policy evicts only items with an
/// expiry, and with too few of them refuses writes as noeviction does (waiting for room
/// first), so there every PUT's item expires.
fn ttl_for(policy: Eviction) -> Option<(u64, Duration)> {
    match policy.volatile() {
        true => Some((1, Duration::from_millis(4))),
        false => TTL,
    }
}

/// Every eviction policy, with expiring items, readers paused mid-entry and evictions paused
/// before their DELETE: the history, with evictions as DELETEs and expiries at their
/// instants, is linearizable, and nothing is refused for want of room (a volatile policy
/// finds items with an expiry: every item has one in its runs).
#[test]
fn every_eviction_policy_with_expiring_items() {
    for (i, policy) in Eviction::ALL.into_iter().skip(1).enumerate() {
        let e = Evicting {
            policy,
            ttl: ttl_for(policy),
            ..Evicting::default()
        };
        let ops = MIXED_VARIANT_OPS_PER_THREAD / 2;
        let out = eviction_run_with(140 + i as u64, geometry(), Optimizations::default(), ops, e);
        let name = policy.name();
        assert_clean_run(name, &out, 4 * ops);
        assert!(out.evictions > 0, "{name}: nothing was evicted: {out}");
        assert!(out.expiries > 0, "{name}: no item expired: {out}");
        assert!(
            !out.errors.contains_key("DataTableFull") && !out.errors.contains_key("IndexFull"),
            "{name}: refused for want of room: {out}"
        );
    }
}

/// allkeys-lru and volatile-ttl with expiring items, on small indexes and with each
/// optimisation off.
#[test]
fn lru_and_ttl_evictions_with_small_indexes_and_each_optimisation_off() {
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        for policy in [Eviction::AllkeysLru, Eviction::VolatileTtl] {
            eprintln!("--- {name}, {policy}");
            let e = Evicting {
                policy,
                ttl: ttl_for(policy),
                ..Evicting::default()
            };
            let ops = MIXED_VARIANT_OPS_PER_THREAD / 4;
            let out = eviction_run_with(160 + i as u64, g.clone(), o, ops, e);
            assert_clean_run(name, &out, 4 * ops);
            assert!(out.expiries > 0, "{name}, {policy}: no item expired: {out}");
        }
    }
}

/// The checker sees expiry: with GETs ignoring the store's expiry (the mutation), a read of
/// an item past its expiry is reported.
#[test]
fn mutation_ignoring_expiry_is_caught() {
    let e = Evicting {
        policy: Eviction::AllkeysLru,
        ttl: Some((2, Duration::from_millis(2))),
        mutations: Mutations {
            ignore_expiry: true,
            ..Mutations::default()
        },
        ..Evicting::default()
    };
    let ops = MIXED_VARIANT_OPS_PER_THREAD / 2;
    let out = eviction_run_with(170, geometry(), Optimizations::default(), ops, e);
    assert_violation(&out, "ignore_expiry");
}

/// Index slots a stress reclaimer reads per window.
const RECLAIM_WINDOW: u64 = 64;
/// Data pages per node of a reclaim run: room for every key's item (a full store refuses
/// PUTs, and each refused PUT is a write the checker must place or leave out).
const RECLAIM_PAGES: u64 = 4 * MIXED_PAGES;
/// The checker's budget per key in a reclaim run.
const RECLAIM_CHECK_STATES: u64 = 20_000_000;
/// A reclaim run's client pause ([`pace`]).
const RECLAIM_CLIENT_PAUSE: Duration = Duration::from_micros(500);
/// The stress reclaimer's pause after each sweep of the whole index.
const RECLAIM_SWEEP_PAUSE: Duration = Duration::from_millis(1);

/// A run with every other PUT's item expiring 4 ms after it is written, and an expiry
/// reclaimer (the node's background thread, `reclaim_expired_in`) sweeping the whole index
/// over and over beside the clients, pausing between reading an item expired and its DELETE
/// (`HookPoint::GuardedAfterLook`) long enough for writers to rewrite hot keys. Its
/// deletions are not in the history: deleting an item already expired changes nothing a
/// client can see. Returns the outcome and how many items the reclaimer deleted.
fn reclaim_run(
    seed: u64,
    g: Geometry,
    o: Optimizations,
    ops: u64,
    mutations: Mutations,
) -> (StressOutcome, u64) {
    let (c, cfg) = mixed_setup(seed, g, RECLAIM_PAGES, o, MIXED_EXPIRY_MS);
    let cfg = ProtocolConfig { mutations, ..cfg };
    let total_ites = c.view().geometry.total_ites();
    let mut reclaimer = c.client_with(0, cfg.clone()).unwrap();
    let mut n = 0u64;
    reclaimer.set_hook(Some(Box::new(move |p| {
        if p == HookPoint::GuardedAfterLook {
            n += 1;
            if n.is_multiple_of(2) {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    })));
    let s = StressSpec {
        get_fraction: 0.5,
        delete_fraction: 0.0,
        hot_keys: 8,
        ttl: Some((2, Duration::from_millis(4))),
        ..mixed_spec(seed, 600, ops)
    };
    let done = AtomicBool::new(false);
    let (out, deleted) = std::thread::scope(|sc| {
        let r = sc.spawn(|| {
            let mut deleted = 0u64;
            let mut start = 0;
            while !done.load(Ordering::Relaxed) {
                let end = (start + RECLAIM_WINDOW).min(total_ites);
                // A window that fails (no room for the DELETE's entry, a contended key) is
                // retried on the next sweep, as the node's reclaimer does.
                if let Ok(r) = reclaimer.reclaim_expired_in(start..end) {
                    deleted += r.deleted;
                }
                if end == total_ites {
                    // A breath between sweeps: the clients need the cores more.
                    std::thread::sleep(RECLAIM_SWEEP_PAUSE);
                    start = 0;
                } else {
                    start = end;
                }
            }
            deleted
        });
        // Stops the reclaimer however this ends: a panic here must fail the test, not
        // leave the scope waiting for the reclaimer forever.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let stop = Stop(&done);
        let mut cs = clients(&c, &cfg);
        for client in &mut cs {
            client.set_hook(Some(pace()));
        }
        // A small index refuses a quarter of the PUTs (IndexFull), and the checker must place
        // or leave out each refused write: a hot key's history needs a larger budget.
        let limits = nessie_check::Limits::with_max_states(RECLAIM_CHECK_STATES);
        let (out, _) = stress::run_checked(cs, &s, &limits);
        drop(stop);
        (out, r.join().unwrap())
    });
    eprintln!(
        "{out}\nreclaimer deleted {deleted}, expiries {}",
        out.expiries
    );
    (out, deleted)
}

/// A client of a reclaim run pauses every other time it has swapped its entry into the
/// index or is about to read a value: the run lasts long enough for items to expire and be
/// reclaimed under it, and the reclaimer meets writes in progress.
fn pace() -> Hook {
    let mut n = 0u64;
    Box::new(move |p| {
        if matches!(p, HookPoint::AfterCandidateCas | HookPoint::BeforeValueRead) {
            n += 1;
            if n.is_multiple_of(2) {
                std::thread::sleep(RECLAIM_CLIENT_PAUSE);
            }
        }
    })
}

/// The reclaimer deletes expired items while writers rewrite their keys: the history, with
/// each expiry at its instant, is linearizable (a key rewritten between the reclaimer's read
/// and its DELETE keeps its new value).
#[test]
fn expired_items_reclaimed_while_writers_rewrite_them() {
    let ops = MIXED_VARIANT_OPS_PER_THREAD;
    let (out, deleted) = reclaim_run(
        180,
        geometry(),
        Optimizations::default(),
        ops,
        Mutations::default(),
    );
    assert_clean_run("reclaim", &out, 4 * ops);
    assert!(out.errors.is_empty(), "every operation succeeds: {out}");
    assert!(deleted > 0, "the reclaimer deleted nothing: {out}");
    assert!(out.expiries > 0, "no item expired: {out}");
}

#[test]
fn expired_items_reclaimed_with_small_indexes_and_each_optimisation_off() {
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        eprintln!("--- {name}");
        let ops = MIXED_VARIANT_OPS_PER_THREAD / 8;
        let (out, deleted) = reclaim_run(190 + i as u64, g, o, ops, Mutations::default());
        assert_clean_run(name, &out, 4 * ops);
        assert!(deleted > 0, "{name}: the reclaimer deleted nothing: {out}");
    }
}

/// The checker sees a reclaimer that deletes whatever a key holds by the time of its DELETE
/// (the mutation): values written after the item it read expired vanish.
#[test]
fn mutation_reclaim_unconditionally_is_caught() {
    let m = Mutations {
        reclaim_unconditionally: true,
        ..Mutations::default()
    };
    let ops = MIXED_VARIANT_OPS_PER_THREAD / 2;
    // The race it loses is timing's: under a loaded CI run one seed once went clean (2026-12-02,
    // `reclaimer deleted 411`, no violation), so up to three seeds run, the first that catches
    // it ending the search; the last is held to a real violation.
    let caught = |out: &StressOutcome| out.report.violations().count() > 0 || out.corrupt_reads > 0;
    let mut out = None;
    for seed in 200..203 {
        let (o, _) = reclaim_run(seed, geometry(), Optimizations::default(), ops, m);
        let done = caught(&o);
        out = Some(o);
        if done {
            break;
        }
    }
    assert_violation(&out.expect("a run"), "reclaim_unconditionally");
}
