//! Concurrency stress of the client-driven protocol on the in-process fabric, with delay
//! injection widening race windows and every history checked for linearizability.
//!
//! Each run: 4 client threads on 3 nodes, hot keys, at least 100,000 operations.

mod common;
use common::{cfg, delay, geometry, spec, OPS_PER_THREAD};

use std::time::Duration;

use nessie_cluster::LocalCluster;
use nessie_fabric::inproc::InProcEndpoint;
use nessie_protocols::cd::{CdClient, ClientStats};
use nessie_protocols::hooks::Hook;
use nessie_protocols::{HookPoint, Mutations, Optimizations, ProtocolConfig};
use nessie_store::Geometry;
use nessie_testkit::assertions::{assert_clean, assert_clean_run, assert_violation};
use nessie_testkit::stress::{self, StressOutcome, StressSpec};

const THREADS_NODES: [u16; 4] = [0, 1, 2, 0];

fn clients(c: &LocalCluster, cfg: &ProtocolConfig) -> Vec<CdClient<InProcEndpoint>> {
    THREADS_NODES
        .iter()
        .map(|&n| c.client_with(n, cfg.clone()).unwrap())
        .collect()
}

fn total(cs: &[CdClient<InProcEndpoint>]) -> ClientStats {
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
) -> (StressOutcome, ClientStats, Vec<CdClient<InProcEndpoint>>) {
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
    let (c, cfg, s) = high_load_setup(seed);
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
    let g = Geometry {
        dtes_per_node: 96,
        ..g
    };
    let cfg = ProtocolConfig {
        expiry_ns: 5_000_000,
        clock_margin_ns: 0,
        ..cfg_base
    };
    (LocalCluster::new(g, cfg.clone(), delay(seed)).unwrap(), cfg)
}

/// A small index: the 40 keys of the stall and abandon scenarios in 72 slots, so that keys sit
/// in every candidate, not just the first (the large index of the other runs puts nearly every
/// key in its first candidate, where two lost-update bugs could not be reached).
fn small_index() -> Geometry {
    Geometry {
        ites_per_node: 24,
        ..geometry()
    }
}

/// The race scenarios below run over each of these: every optimisation on with a large and a
/// small index, then on the small index with each optimisation off in turn, and all off.
fn variants() -> Vec<(&'static str, Geometry, Optimizations)> {
    let all = Optimizations::default();
    let mut v = vec![
        ("large index", geometry(), all),
        ("small index", small_index(), all),
    ];
    type Switch = (&'static str, fn(&mut Optimizations));
    let off: [Switch; 5] = [
        ("small index, no filter bits", |o| o.filter_bits = false),
        ("small index, no cache", |o| o.cache = false),
        ("small index, no previous versions", |o| {
            o.previous_versions = false
        }),
        ("small index, no multi-read", |o| o.multi_read = false),
        ("small index, all off", |o| *o = Optimizations::NONE),
    ];
    for (name, f) in off {
        let mut o = all;
        f(&mut o);
        v.push((name, small_index(), o));
    }
    v
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
    let (c, cfg) = recycling_setup_in(seed, g, cfg());
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
/// only three attempts allowed, so the write is abandoned with its invalid DTE in the index and
/// must be undone. Linearizable throughout, nothing leaks from the tiny data table, and no
/// key is left wedged: afterwards every key can be written and read back at once.
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
    let expiry = cfg.expiry_ns;
    for (i, client) in cs.iter_mut().enumerate() {
        let (mut n, mut burst) = (i as u64 * 37, 0u32);
        client.set_hook(Some(Box::new(move |p| {
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
                std::thread::sleep(Duration::from_nanos(expiry + 1_000_000));
            }
        })));
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
    let mut w = c.client_with(1, cfg).unwrap();
    for k in 0..40u64 {
        let key = stress::key_bytes(k);
        w.put(&key, b"after")
            .unwrap_or_else(|e| panic!("{name}: key {k} is wedged: {e}"));
        assert_eq!(
            w.get(&key).unwrap().as_deref(),
            Some(&b"after"[..]),
            "{name}"
        );
    }
}

#[test]
fn abandoned_writes_are_undone() {
    let all = Optimizations::default();
    let (out, st, c) =
        abandoned_writes_run(11, geometry(), all, Mutations::default(), OPS_PER_THREAD);
    assert_clean(&out);
    assert!(st.undone > 20, "{st:?}");
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
        assert!(st.undone > 0, "{name}: {st:?}");
        assert_eq!(st.leaked, 0, "{name}: {st:?}");
        assert_no_key_wedged(name, &c, o);
    }
}

#[test]
fn mutation_undoing_to_empty_is_caught() {
    let (out, st, _) = abandoned_writes_run(
        12,
        geometry(),
        Optimizations::default(),
        Mutations {
            undo_to_empty: true,
            ..Mutations::default()
        },
        OPS_PER_THREAD,
    );
    assert!(st.undone > 0, "{st:?}");
    assert_violation(&out, "undoing abandoned writes to empty");
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

#[test]
fn mutation_recycling_without_expiry_is_caught() {
    let base = ProtocolConfig {
        mutations: Mutations {
            recycle_without_expiry: true,
            ..Mutations::default()
        },
        ..cfg()
    };
    let (c, cfg) = recycling_setup(7, base);
    let s = StressSpec {
        keys: 40,
        get_fraction: 0.6,
        ..spec(7)
    };
    let (out, _, _) = run(&c, &cfg, &s);
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
