//! Concurrency stress of client-driven replication: 3 nodes, R = 2 or 3, two client threads
//! per node, delay injection, and node 1 crashing in the middle of the run; then node 1
//! restarting, or (4 nodes) its copies moving to the others, while the run goes on; or every
//! index partition migrating twice by the per-ITE handover, with and without a kill. The whole history
//! (the crashed node's clients included: their operations in flight end in errors) must be
//! linearizable, and afterwards every key must read the same through every survivor (nothing
//! wedged, no copy behind).
//!
//! Each scenario runs with a large and a small index (keys in every candidate) and with each
//! optimisation switched off. The replication mutations (only the index replicated, no helping)
//! are caught by deterministic tests: `crates/cluster/tests/replication.rs` and the unit tests
//! of `nessie_protocols::replica`; a random crash rarely lands in their windows.

#[allow(dead_code)]
mod common;
use common::{delay, geometry};

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nessie_cluster::LocalCluster;
use nessie_fabric::inproc::DelayInjection;
use nessie_fabric::NodeId;
use nessie_protocols::cd::ClientStats;
use nessie_protocols::fence::IndexCopy;
use nessie_protocols::{Mutations, Optimizations, ProtocolConfig, RetryPolicy};
use nessie_store::Geometry;
use nessie_testkit::assertions::{assert_clean_run, assert_no_errors_but_rare_index_full};
use nessie_testkit::stress::{self, key_bytes, StressOutcome, StressSpec};

const THREADS_NODES: [NodeId; 6] = [0, 1, 2, 0, 1, 2];
const CRASHED: NodeId = 1;
/// Node 1 crashes once the run has issued this many fabric operations (about a fifth of it).
const CRASH_AFTER_FABRIC_OPS: u64 = 30_000;

fn cfg(o: Optimizations) -> ProtocolConfig {
    ProtocolConfig {
        // Short, so that the crashed node's writes in flight are soon completed by others.
        expiry_ns: 20_000_000,
        clock_margin_ns: 1_000_000,
        cache_entries: 64,
        optimizations: o,
        retry: RetryPolicy {
            max_attempts: 200,
            ..RetryPolicy::default()
        },
        ..ProtocolConfig::default()
    }
}

fn spec(seed: u64) -> StressSpec {
    StressSpec {
        ops_per_thread: 4_000,
        keys: 40,
        hot_keys: 2,
        hot_fraction: 0.5,
        get_fraction: 0.5,
        delete_fraction: 0.1,
        value_size: (8, 48),
        sizes_by_key: false,
        seed,
        time_limit: Duration::from_secs(120),
        preload_keys: 40,
        until: None,
        ttl: None,
        size_shift: None,
    }
}

fn variants() -> Vec<(&'static str, Geometry, Optimizations)> {
    let all = Optimizations::default();
    let small = Geometry {
        ites_per_node: 24,
        ..geometry()
    };
    let off = |f: fn(&mut Optimizations)| {
        let mut o = all;
        f(&mut o);
        o
    };
    vec![
        ("large index", geometry(), all),
        ("small index", small.clone(), all),
        (
            "small index, no filter bits",
            small.clone(),
            off(|o| o.filter_bits = false),
        ),
        (
            "small index, no cache",
            small.clone(),
            off(|o| o.cache = false),
        ),
        (
            "small index, no previous versions",
            small.clone(),
            off(|o| o.previous_versions = false),
        ),
        (
            "small index, no multi-read",
            small.clone(),
            off(|o| o.multi_read = false),
        ),
        ("small index, all off", small, Optimizations::NONE),
    ]
}

/// How node 1 dies.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Crash {
    /// Its memory unreachable to all at once, every node told of the failure at once.
    Plain,
    /// As a process over shared memory: its memory stays reachable to each endpoint until
    /// that endpoint notices (`InProcFabric::kill_node_keeping_memory`), and each node learns
    /// of the failure at its own time, reading the old primary meanwhile
    /// (`LocalCluster::fail_node_staggered`).
    MemoryKept,
}

/// One run: the workload on every node, node 1 crashing `crash_after` into it.
fn crash_mid_run(name: &str, g: Geometry, o: Optimizations, replicas: u8, seed: u64) {
    crash_mid_run_with(name, g, o, |_, _| {}, replicas, seed, Crash::Plain);
}

/// [`crash_mid_run`], with `tweak` changing the configuration and the workload first; returns
/// the outcome and the counters of the survivors' clients.
fn crash_mid_run_with(
    name: &str,
    g: Geometry,
    o: Optimizations,
    tweak: impl FnOnce(&mut ProtocolConfig, &mut StressSpec),
    replicas: u8,
    seed: u64,
    crash: Crash,
) -> (StressOutcome, ClientStats) {
    let mut cfg = cfg(o);
    let mut s = spec(seed);
    tweak(&mut cfg, &mut s);
    if crash == Crash::MemoryKept {
        // A longer read settle time: more operations meet the views and endpoints that
        // disagree about the dead node.
        cfg.expiry_ns = 100_000_000;
    }
    // The memory-kept crash races readers and writers across a few milliseconds: longer
    // delays make its windows (a word decided at one copy, not yet at the other) wider.
    let delay = match crash {
        Crash::Plain => delay(seed),
        Crash::MemoryKept => longer_delays(seed, 0.05, 200_000),
    };
    let c = LocalCluster::replicated(g, cfg.clone(), delay, replicas).unwrap();
    let clients: Vec<_> = THREADS_NODES
        .iter()
        .map(|&n| c.client(n).unwrap())
        .collect();
    let fabric_ops = || c.fabric().stats().total(None).total_ops();
    let crash_at = fabric_ops() + CRASH_AFTER_FABRIC_OPS;
    let finished = AtomicBool::new(false);
    let (out, cs, crashed) = std::thread::scope(|scope| {
        let crasher = scope.spawn(|| {
            while fabric_ops() < crash_at {
                if finished.load(Ordering::SeqCst) {
                    return false;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            crash_node(&c, crash, seed);
            true
        });
        let (out, cs) = stress::run(clients, &s);
        finished.store(true, Ordering::SeqCst);
        (out, cs, crasher.join().unwrap())
    });
    assert!(
        crashed,
        "{name}: the run ended before node {CRASHED} crashed"
    );
    assert!(
        !out.errors.is_empty(),
        "{name}: node {CRASHED}'s clients should have failed after the crash"
    );
    let mut survivors = ClientStats::default();
    for (cl, &n) in cs.iter().zip(&THREADS_NODES) {
        if n != CRASHED {
            survivors += cl.stats();
        }
    }
    eprintln!(
        "{name}, R = {replicas}: {out}\nsurvivors: {survivors:?}\nfabric ops: {}",
        fabric_ops() - crash_at + CRASH_AFTER_FABRIC_OPS
    );
    assert_clean_run(name, &out, 6 * s.ops_per_thread / 2);
    assert_eq!(out.corrupt_reads, 0);
    survivors_agree(name, &c, s.keys);
    (out, survivors)
}

/// Crash node [`CRASHED`] as `crash` says, and declare it failed.
fn crash_node(c: &LocalCluster, crash: Crash, seed: u64) {
    match crash {
        Crash::Plain => {
            c.fabric().kill_node(CRASHED);
            c.fail_node(CRASHED);
        }
        Crash::MemoryKept => {
            // Endpoints notice the death over the time others may still read.
            let notice_within = c.replica_set().read_settle_ns();
            c.fabric().kill_node_keeping_memory(CRASHED, notice_within);
            c.fail_node_staggered(CRASHED, seed);
        }
    }
}

/// Nothing wedged and no copy behind: every key reads, and reads alike, through each
/// survivor, and can still be written.
fn survivors_agree(name: &str, c: &LocalCluster, keys: u64) {
    survivors_agree_on(name, c, keys, [0, 2])
}

fn survivors_agree_on(name: &str, c: &LocalCluster, keys: u64, survivors: [NodeId; 2]) {
    let mut readers: Vec<_> = survivors.iter().map(|&n| c.client(n).unwrap()).collect();
    for k in 0..keys {
        let key = key_bytes(k);
        let a = readers[0].get(&key);
        let b = readers[1].get(&key);
        assert!(
            matches!((&a, &b), (Ok(x), Ok(y)) if x == y),
            "{name}: key {k} reads {a:?} through node 0 and {b:?} through node 2"
        );
    }
    for k in 0..keys {
        readers[k as usize % 2]
            .put(&key_bytes(k), b"after the crash")
            .unwrap_or_else(|e| panic!("{name}: key {k} cannot be written after the crash: {e}"));
    }
}

/// Client members (`LocalCluster::member_client`): processes that are not nodes, with ids
/// past the nodes'. Member 9 crashes mid-run, after node 1.
const MEMBERS: [NodeId; 3] = [7, 9, 9];
const CRASHED_MEMBER: NodeId = 9;

/// Client members write beside the nodes' workers (R = 2) into the nodes' pages only; node 1
/// crashes, then member 9 crashes and is declared failed, its writes in flight left to the
/// others to complete. The whole history must be linearizable, and afterwards every key
/// reads alike through the surviving nodes and member 7, and can still be written.
fn client_members_mid_run(name: &str, g: Geometry, o: Optimizations, seed: u64) {
    let s = spec(seed);
    let c = LocalCluster::replicated(g, cfg(o), delay(seed), 2).unwrap();
    let clients: Vec<_> = [0, 1, 2]
        .iter()
        .map(|&n| c.client(n).unwrap())
        .chain(MEMBERS.iter().map(|&m| c.member_client(m).unwrap()))
        .collect();
    let fabric_ops = || c.fabric().stats().total(None).total_ops();
    let crash_at = fabric_ops() + CRASH_AFTER_FABRIC_OPS;
    let finished = AtomicBool::new(false);
    let (out, crashed) = std::thread::scope(|scope| {
        let crasher = scope.spawn(|| {
            for (at, what) in [(crash_at, "node"), (crash_at * 2, "member")] {
                while fabric_ops() < at {
                    if finished.load(Ordering::SeqCst) {
                        return false;
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                match what {
                    "node" => crash_node(&c, Crash::Plain, seed),
                    _ => c.fail_client(CRASHED_MEMBER),
                }
            }
            true
        });
        let (out, _) = stress::run(clients, &s);
        finished.store(true, Ordering::SeqCst);
        (out, crasher.join().unwrap())
    });
    assert!(crashed, "{name}: the run ended before both crashes");
    eprintln!("{name}, client members: {out}");
    assert_clean_run(name, &out, 6 * s.ops_per_thread / 3);
    survivors_agree(name, &c, s.keys);
    let mut member = c.member_client(MEMBERS[0]).unwrap();
    let mut node = c.client(0).unwrap();
    for k in 0..s.keys {
        let key = key_bytes(k);
        assert_eq!(
            member.get(&key).unwrap(),
            node.get(&key).unwrap(),
            "{name}: key {k} through member {} and node 0",
            MEMBERS[0]
        );
    }
}

#[test]
fn client_members_and_a_node_crashing_mid_run() {
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        client_members_mid_run(name, g, o, 700 + i as u64);
    }
}

#[test]
fn a_node_crashing_mid_run_two_copies() {
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        crash_mid_run(name, g, o, 2, 100 + i as u64);
    }
}

#[test]
fn a_node_crashing_mid_run_three_copies() {
    for (i, (name, g, o)) in variants().into_iter().take(2).enumerate() {
        crash_mid_run(name, g, o, 3, 200 + i as u64);
    }
}

/// Node 1 dies as a process over shared memory does: its memory outlives it for endpoints
/// that have not noticed, and the others learn of the failure one by one, so for a while some
/// read the old primary and some the next copy, and some writers reach the old primary and
/// some do not (`docs/protocol.md`, Replication, rule 7).
#[test]
fn a_node_crashing_mid_run_with_its_memory_kept() {
    for (i, (name, g, o)) in variants().into_iter().take(3).enumerate() {
        for r in [2, 3] {
            let seed = 600 + 10 * i as u64 + r as u64;
            crash_mid_run_with(name, g.clone(), o, |_, _| {}, r, seed, Crash::MemoryKept);
        }
    }
}

/// A hunt for the memory-kept crash, R = 2, small index, cache off, `$COUNT` seeds (default
/// 100) from `$BASE` (default 30000); `MUT=read` or `MUT=write` runs it with the rule 7
/// mutations (`read_next_copy_at_once`, `skip_unreached_copy_at_once`); `GEOM=tiny` gives it
/// tiny data tables (entries written to other nodes' pages, the dead node's included).
/// `BASE=30000 COUNT=100 cargo test --release -p nessie-testkit --test stress_replicated
/// many_seeds_memory_kept -- --ignored --nocapture`.
#[test]
#[ignore]
fn many_seeds_memory_kept() {
    let (mut small, o) = small_index_no_cache();
    if std::env::var("GEOM").as_deref() == Ok("tiny") {
        // Tiny data tables too: entries are placed on other nodes, the dead one's included.
        small.dtes_per_node = 48;
    }
    let env = |k: &str, d: u64| std::env::var(k).map_or(d, |v| v.parse().expect("a number"));
    let (base, count) = (env("BASE", 30_000), env("COUNT", 100));
    let mutations = match std::env::var("MUT").as_deref() {
        Ok("read") => Mutations {
            read_next_copy_at_once: true,
            ..Mutations::default()
        },
        Ok("write") => Mutations {
            skip_unreached_copy_at_once: true,
            ..Mutations::default()
        },
        _ => Mutations::default(),
    };
    for seed in base..base + count {
        eprintln!("seed {seed}");
        crash_mid_run_with(
            "memory kept",
            small.clone(),
            o,
            |c, _| c.mutations = mutations,
            2,
            seed,
            Crash::MemoryKept,
        );
    }
}

/// Tiny data tables: writers claim pages on other nodes (through the replicated page tables)
/// and release them as entries expire, while node 1 crashes.
#[test]
fn a_node_crashing_while_pages_are_claimed_and_released() {
    let g = Geometry {
        dtes_per_node: 48,
        ..geometry()
    };
    for (i, o) in [Optimizations::default(), Optimizations::NONE]
        .into_iter()
        .enumerate()
    {
        crash_mid_run("tiny data tables", g.clone(), o, 2, 400 + i as u64);
    }
}

/// Writers evicting (allkeys-random) from tiny data tables, on five times the keys they hold,
/// when node 1 crashes: every eviction is a DELETE in the history, which stays linearizable,
/// and the survivors agree on every key (evicted ones read absent through both).
#[test]
fn a_node_crashing_while_writers_evict() {
    let g = Geometry {
        dtes_per_node: 24,
        ..geometry()
    };
    for (i, o) in [Optimizations::default(), Optimizations::NONE]
        .into_iter()
        .enumerate()
    {
        let (out, _) = crash_mid_run_with(
            "evicting",
            g.clone(),
            o,
            |c, s| {
                c.eviction = nessie_protocols::Eviction::AllkeysRandom;
                s.keys = 200;
                s.preload_keys = 0;
                s.delete_fraction = 0.0;
                s.value_size = (40, 48);
            },
            2,
            700 + i as u64,
            Crash::Plain,
        );
        assert!(out.evictions > 0, "nothing was evicted: {out}");
    }
}

/// The page mover through a crash (`cd/evict.rs`): values switch between 8..32 and 256..512
/// bytes every 600 operations of each thread, on more keys than the data tables hold, under
/// allkeys-lru with R = 2, so that pages of one size are drained for the other all through the
/// run; node 1 crashes in the middle. The history, with every eviction a DELETE, stays
/// linearizable, the survivors agree on every key, and the survivors' writers moved pages.
#[test]
fn a_node_crashing_while_pages_move_between_size_classes() {
    let g = Geometry {
        value_max: 512,
        dtes_per_node: 64,
        ..geometry()
    };
    for (i, o) in [Optimizations::default(), Optimizations::NONE]
        .into_iter()
        .enumerate()
    {
        let (out, survivors) = crash_mid_run_with(
            "pages moving",
            g.clone(),
            o,
            |c, s| {
                c.eviction = nessie_protocols::Eviction::AllkeysLru;
                c.move_check_ns = c.expiry_ns / 20;
                s.keys = 1_200;
                s.preload_keys = 0;
                s.delete_fraction = 0.0;
                s.value_size = (8, 32);
                s.size_shift = Some((600, (256, 512)));
            },
            2,
            720 + i as u64,
            Crash::Plain,
        );
        assert!(out.evictions > 0, "nothing was evicted: {out}");
        assert!(survivors.pages_moved > 0, "no page moved: {survivors:?}");
    }
}

/// The hunts' setting: a small index (keys in every candidate, migrations) and the cache off.
fn small_index_no_cache() -> (Geometry, Optimizations) {
    let small = Geometry {
        ites_per_node: 24,
        ..geometry()
    };
    let o = Optimizations {
        cache: false,
        ..Optimizations::default()
    };
    (small, o)
}

/// A hunt over many seeds: the crash scenario with a small index and the cache off, R = 2,
/// 150 seeds from `$BASE` (default 9000). Before the MIGRATE-copy fix (`docs/protocol.md`,
/// Known limitations) about one run in 160 in a debug build failed. Not part of the suite:
/// `BASE=9000 cargo test -p nessie-testkit --test stress_replicated -- --ignored --nocapture`.
#[test]
#[ignore]
fn many_seeds_small_index_no_cache() {
    let (small, o) = small_index_no_cache();
    let base: u64 = std::env::var("BASE").map_or(9000, |b| b.parse().expect("BASE is a number"));
    for seed in base..base + 150 {
        crash_mid_run("many seeds", small.clone(), o, 2, seed);
    }
}

/// Runs without a crash, small index, R = 2 and 3: the history is linearizable, and once the
/// run is over the copies of every partition agree word for word (every CAS reached every
/// copy, every plain write too).
#[test]
fn without_failures_the_copies_agree() {
    for (i, (name, g, o)) in variants().into_iter().skip(1).take(2).enumerate() {
        for r in [2, 3] {
            crash_free_run(name, &g, o, r, 500 + 10 * i as u64 + r as u64);
        }
    }
}

/// How the cluster gets node 1's copies back after it crashed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Recovery {
    /// Node 1 restarts with empty memory and catches up (`LocalCluster::restart_node`).
    Restart,
    /// Node 1 is gone for good: its copies move to spare slots on the others, which fill them
    /// (`LocalCluster::replace_node`). Needs a fourth node, one without a copy of each moved
    /// partition.
    Replace,
    /// As `Replace`, then node 1 restarts and comes back without copies, reading its own
    /// partition from the others' copies. Its clients in the run die with its first
    /// incarnation, so the run checks the others' operations across its return; the final
    /// reads through node 1 check its own, and `crates/cli/tests/faults.rs` (the replacement
    /// run) checks clients on the returned node inside a whole history.
    ReplaceAndReturn,
}

/// Re-replication under load: node 1 crashes in the middle of a concurrent run, and its copies
/// are filled again (`recovery`: on node 1 restarted, or on other nodes) while the others keep
/// writing; then (`second_crash`) node 2 crashes too: node 2 held the only other copy of node
/// 1's partition and of its own, so without the catch-up the run would lose keys. The whole
/// history must be linearizable and every key read alike through two survivors. Without the
/// second crash, the refilled copies must equal the other copies of their partitions at the
/// end.
fn crash_recover_crash(
    name: &str,
    g: Geometry,
    o: Optimizations,
    recovery: Recovery,
    second_crash: bool,
    seed: u64,
) {
    let spare = (recovery != Recovery::Restart) as u8;
    let (delay, gap) = recovery_pace(recovery, seed);
    let mut pc = cfg(o);
    // For the hunt (`many_seeds_rejoin`): the write-path rule that closes late writes off.
    pc.mutations.no_late_copy_writes = std::env::var("MUT").as_deref() == Ok("no_late_copy_writes");
    let mut c = LocalCluster::replicated_with_spares(g.clone(), pc, delay, 2, spare).unwrap();
    let (clients, s) = long_run(&c, seed);
    let (out, caught) = run_with_crasher(&c, clients, &s, |wait_ops| {
        if !wait_ops(CRASH_AFTER_FABRIC_OPS) {
            return None;
        }
        c.fabric().kill_node(1);
        c.fail_node(1);
        let caught = recover(&c, recovery);
        let crashed_again = second_crash && wait_ops(gap);
        if crashed_again {
            c.fabric().kill_node(2);
            c.fail_node(2);
            wait_ops(gap); // some operations after the second crash too
        }
        Some((caught, crashed_again))
    });
    let (caught, crashed_again) =
        caught.unwrap_or_else(|| panic!("{name}: the run ended before node 1 crashed"));
    assert_eq!(
        crashed_again, second_crash,
        "{name}: the run ended before node 2 crashed"
    );
    assert!(caught.words_changed > 0, "{name}: {caught:?}");
    eprintln!("{name}, {recovery:?}, seed {seed}: {out}\ncatch-up: {caught:?}");
    assert_clean_run(name, &out, 2 * s.ops_per_thread);
    assert_eq!(out.corrupt_reads, 0);
    assert_eq!(
        c.stop_reclaimers(),
        0,
        "{name}: a reclaimer's invariant broke"
    );
    agree_after_recovery(name, &c, &g, recovery, second_crash, s.keys);
}

/// A client on every node of [`THREADS_NODES`], and a workload three times the crash
/// scenario's: what happens beside it (settle waits, catch-ups, a second crash, migrations)
/// must come well before it ends, on a loaded machine too.
fn long_run(
    c: &LocalCluster,
    seed: u64,
) -> (
    Vec<nessie_protocols::cd::CdClient<nessie_cluster::local::LocalEndpoint>>,
    StressSpec,
) {
    let clients = THREADS_NODES
        .iter()
        .map(|&n| c.client(n).unwrap())
        .collect();
    let s = StressSpec {
        ops_per_thread: 3 * spec(seed).ops_per_thread,
        ..spec(seed)
    };
    (clients, s)
}

/// A checked stress run of `clients` on `c` beside `crasher`, which gets a way to wait until
/// the fabric has done N more operations (false if the run ended first). The threads go on
/// until the crasher is done (`StressSpec::until`): on a loaded machine a recovery once
/// outlasted the run.
fn run_with_crasher<T: Send>(
    c: &LocalCluster,
    clients: Vec<nessie_protocols::cd::CdClient<nessie_cluster::local::LocalEndpoint>>,
    spec: &StressSpec,
    crasher: impl FnOnce(&dyn Fn(u64) -> bool) -> Option<T> + Send,
) -> (stress::StressOutcome, Option<T>) {
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let s = StressSpec {
        until: Some(done.clone()),
        ..spec.clone()
    };
    let fabric_ops = || c.fabric().stats().total(None).total_ops();
    let finished = AtomicBool::new(false);
    let wait_ops = |n: u64| {
        let until = fabric_ops() + n;
        while fabric_ops() < until {
            if finished.load(Ordering::SeqCst) {
                return false;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        true
    };
    std::thread::scope(|scope| {
        let crasher = scope.spawn(|| {
            let r = crasher(&wait_ops);
            done.store(true, Ordering::SeqCst);
            r
        });
        // Two crashes leave tens of thousands of failed writes, each of which may or may not
        // have taken effect: a hot key's search once ran out of the default budget in CI
        // (UNKNOWN, not a violation), so these runs get ten times as much.
        let limits = nessie_check::Limits::with_max_states(RECOVERY_CHECK_STATES);
        let (out, _) = stress::run_checked(clients, &s, &limits);
        finished.store(true, Ordering::SeqCst);
        (out, crasher.join().unwrap())
    })
}

/// The linearizability checker's per-key state budget for the recovery runs.
const RECOVERY_CHECK_STATES: u64 = 20_000_000;

/// Delay injection with `probability` and `max_delay_ns`.
fn longer_delays(seed: u64, probability: f64, max_delay_ns: u64) -> Option<DelayInjection> {
    Some(DelayInjection {
        seed,
        probability,
        max_delay_ns,
    })
}

/// The delays of a recovery run, and how many fabric operations after the recovery the second
/// crash comes. Two recoveries in a row take twice the time: longer delays stretch the run to
/// cover them, and the second crash comes sooner after them, without more operations (longer
/// runs make the histories of hot keys too long for the checker's budget: four times the
/// crash scenario's run did, once in 70 seeds).
fn recovery_pace(recovery: Recovery, seed: u64) -> (Option<DelayInjection>, u64) {
    match recovery {
        Recovery::ReplaceAndReturn => (
            longer_delays(seed, 0.1, 100_000),
            CRASH_AFTER_FABRIC_OPS / 10,
        ),
        _ => (delay(seed), CRASH_AFTER_FABRIC_OPS),
    }
}

/// Get node 1's copies back after it crashed, as `recovery` says; what catching up did.
fn recover(c: &LocalCluster, recovery: Recovery) -> nessie_protocols::CatchUp {
    match recovery {
        Recovery::Restart => c.restart_node(1).expect("node 1 rejoins"),
        Recovery::Replace => c.replace_node(1).expect("node 1's copies move"),
        Recovery::ReplaceAndReturn => {
            let caught = c.replace_node(1).expect("node 1's copies move");
            let back = c.restart_node(1).expect("node 1 comes back");
            assert_eq!(back.copies, 0, "node 1 came back with copies: {back:?}");
            caught
        }
    }
}

/// After the run: the refilled copies equal the others (without a second crash), and every
/// key reads alike through two nodes that lived (or came back).
fn agree_after_recovery(
    name: &str,
    c: &LocalCluster,
    g: &Geometry,
    recovery: Recovery,
    second_crash: bool,
    keys: u64,
) {
    // Node 1's partition and node 0's (whose backup it held) were refilled.
    let refilled = Some(&[0, 1][..]);
    match (recovery, second_crash) {
        (Recovery::Restart, true) => survivors_agree_on(name, c, keys, [0, 1]),
        (Recovery::Restart, false) => {
            copies_agree_where(name, c, g, 2, refilled);
            survivors_agree_on(name, c, keys, [1, 2]);
        }
        (Recovery::Replace, true) => survivors_agree_on(name, c, keys, [0, 3]),
        (Recovery::ReplaceAndReturn, true) => survivors_agree_on(name, c, keys, [0, 1]),
        (Recovery::Replace | Recovery::ReplaceAndReturn, false) => {
            copies_agree_where(name, c, g, 2, refilled);
            survivors_agree_on(name, c, keys, [2, 3]);
        }
    }
}

fn crash_restart_crash(name: &str, g: Geometry, o: Optimizations, second_crash: bool, seed: u64) {
    crash_recover_crash(name, g, o, Recovery::Restart, second_crash, seed)
}

/// Four nodes, so that every copy of node 1 has a node to move to.
fn four_nodes(g: Geometry) -> Geometry {
    Geometry { nodes: 4, ..g }
}

fn crash_replace_crash(name: &str, g: Geometry, o: Optimizations, second_crash: bool, seed: u64) {
    crash_recover_crash(
        name,
        four_nodes(g),
        o,
        Recovery::Replace,
        second_crash,
        seed,
    )
}

#[test]
fn a_replaced_node_comes_back_under_load_and_a_second_crash_loses_nothing() {
    for (i, (name, g, o)) in variants().into_iter().take(2).enumerate() {
        let r = Recovery::ReplaceAndReturn;
        crash_recover_crash(name, four_nodes(g), o, r, true, 740 + i as u64);
    }
}

#[test]
fn a_crashed_node_is_replaced_under_load_and_a_second_crash_loses_nothing() {
    for (i, (name, g, o)) in variants().into_iter().take(3).enumerate() {
        crash_replace_crash(name, g, o, true, 720 + i as u64);
    }
}

#[test]
fn after_a_move_under_load_the_moved_copies_equal_the_others() {
    for (i, (name, g, o)) in variants().into_iter().take(2).enumerate() {
        crash_replace_crash(name, g, o, false, 730 + i as u64);
    }
}

#[test]
fn a_crashed_node_rejoins_under_load_and_a_second_crash_loses_nothing() {
    for (i, (name, g, o)) in variants().into_iter().take(3).enumerate() {
        crash_restart_crash(name, g, o, true, 700 + i as u64);
    }
}

#[test]
fn after_a_rejoin_under_load_the_rejoined_copies_equal_the_others() {
    for (i, (name, g, o)) in variants().into_iter().take(2).enumerate() {
        crash_restart_crash(name, g, o, false, 710 + i as u64);
    }
}

/// The comparison of copies catches copies that miss writes: with DTEs written to the primary
/// alone, the data tables differ.
#[test]
#[should_panic(expected = "region 1")]
fn copies_that_miss_writes_are_caught() {
    let m = Mutations {
        replicate_index_only: true,
        ..Mutations::default()
    };
    crash_free_run_with(
        "index only",
        &geometry(),
        Optimizations::default(),
        m,
        2,
        600,
    );
}

/// The crash-free hunt, `$R` copies (default 2), `$COUNT` seeds from `$BASE`, small index and
/// no cache. It found the MIGRATE-copy violation (`docs/protocol.md`, Known limitations) after
/// 175 seeds in a release build; 2,000 seeds pass since the fix:
/// `R=2 BASE=40000 COUNT=500 cargo test --release -p nessie-testkit --test stress_replicated
/// many_seeds_small_index_no_crash -- --ignored`.
#[test]
#[ignore]
fn many_seeds_small_index_no_crash() {
    let (mut small, o) = small_index_no_cache();
    if std::env::var("GEOM").as_deref() == Ok("tiny") {
        // Tiny data tables too: entries are placed on other nodes, the dead one's included.
        small.dtes_per_node = 48;
    }
    let env = |k: &str, d: u64| std::env::var(k).map_or(d, |b| b.parse().expect("a number"));
    let (base, count, r) = (env("BASE", 9000), env("COUNT", 150), env("R", 2) as u8);
    for seed in base..base + count {
        crash_free_run("many seeds, no crash", &small, o, r, seed);
    }
}

fn crash_free_run(name: &str, g: &Geometry, o: Optimizations, r: u8, seed: u64) {
    crash_free_run_with(name, g, o, Mutations::default(), r, seed)
}

fn crash_free_run_with(
    name: &str,
    g: &Geometry,
    o: Optimizations,
    mutations: Mutations,
    r: u8,
    seed: u64,
) {
    let cfg = ProtocolConfig {
        mutations,
        ..cfg(o)
    };
    let mut c = LocalCluster::replicated(g.clone(), cfg, delay(seed), r).unwrap();
    let clients: Vec<_> = THREADS_NODES
        .iter()
        .map(|&n| c.client(n).unwrap())
        .collect();
    let (out, _) = stress::run(clients, &spec(seed));
    eprintln!("{name}, R = {r}, seed {seed}: {out}");
    // They clear recycle words: nothing may change memory while we compare.
    assert_eq!(
        c.stop_reclaimers(),
        0,
        "{name}: a reclaimer's invariant broke"
    );
    copies_agree(name, &c, g, r);
    assert_clean_run(name, &out, 6 * spec(seed).ops_per_thread / 2);
    assert_no_errors_but_rare_index_full(name, &out);
}

/// After a run without failures every CAS has reached every copy: each partition's copies hold
/// the same index and data tables, word for word.
fn copies_agree(name: &str, c: &LocalCluster, g: &Geometry, r: u8) {
    copies_agree_where(name, c, g, r, None)
}

/// [`copies_agree`] for `partitions` only (all with `None`), wherever their copies are now. A writer
/// that crashes between the copies of a write, or between deciding a CAS and carrying it to
/// the primary, leaves copies that differ for good in words nobody refers to (an entry it
/// never published, the recycle word of an entry it had replaced) or that the next CAS on the
/// word brings level; so after a crash only the copies filled since are compared.
fn copies_agree_where(
    name: &str,
    c: &LocalCluster,
    g: &Geometry,
    r: u8,
    partitions: Option<&[NodeId]>,
) {
    use nessie_fabric::{Endpoint, RemoteAddr};
    use nessie_protocols::replica::mirror_region;
    let regions = g.table_regions();
    let mut ep = c.fabric().endpoint(0);
    let map = c.copy_map();
    let mut compared = 0u64;
    for p in 0..g.nodes as u16 {
        if partitions.is_some_and(|only| !only.contains(&p)) {
            continue;
        }
        for region in [nessie_store::INDEX_REGION, nessie_store::DATA_REGION] {
            let bytes = regions[region as usize];
            let at = |j: u8| {
                let place = map.place(p, j);
                RemoteAddr::new(place.node, mirror_region(region, place.slot), 0)
            };
            let mut primary = vec![0u8; bytes as usize];
            ep.read(at(0), &mut primary).unwrap();
            for j in 1..r {
                let mut copy = vec![0u8; bytes as usize];
                ep.read(at(j), &mut copy).unwrap();
                if let Some(w) = (0..primary.len() / 8)
                    .find(|&w| primary[w * 8..w * 8 + 8] != copy[w * 8..w * 8 + 8])
                {
                    let word =
                        |b: &[u8]| u64::from_le_bytes(b[w * 8..w * 8 + 8].try_into().unwrap());
                    let whose = match region {
                        nessie_store::DATA_REGION => referring_ite(c, p, w as u64 * 8),
                        _ => String::new(),
                    };
                    panic!(
                        "{name}: partition {p}, region {region}, word {w}: primary {:#x}, copy {j} {:#x} differs{whose}",
                        word(&primary),
                        word(&copy)
                    );
                }
                compared += bytes;
            }
        }
    }
    assert!(compared > 0, "{name}: nothing compared");
}

/// Which entry of node `p`'s data table holds byte `off`, as the index refers to it now: the
/// ITE slot whose word names an entry spanning `off`, or that none does (a free or abandoned
/// entry, which nobody reads).
fn referring_ite(c: &LocalCluster, p: NodeId, off: u64) -> String {
    use nessie_fabric::Endpoint;
    let view = c.view();
    let mut ep = c.endpoint(0);
    for slot in 0..view.geometry.total_ites() {
        let Ok(word) = ep.read_u64(view.index.addr(slot)) else {
            continue;
        };
        let ite = nessie_store::Ite(word);
        if ite.is_empty() || view.index.ite.dti(ite) != p as u32 {
            continue;
        }
        let (class, entry) = view.field.decode(view.index.ite.dte(ite));
        let start = view.classes.offset(class, entry);
        if (start..start + view.classes.entry_size(class)).contains(&off) {
            return format!(
                " (in the entry at byte {start}, class {class}, word {} of it, that ITE slot {slot} refers to)",
                (off - start) / 8
            );
        }
    }
    format!(" (in no entry the index refers to: byte {off} of the data table)")
}

/// The rejoin scenario (crash, restart under load, second crash) over `$COUNT` seeds from
/// `$BASE`, small index and no cache; with `RECOVERY=replace`, the re-replication scenario
/// (crash, copies moved to other nodes under load, second crash), with `RECOVERY=return` the
/// same with node 1 restarted after the move. Not part of the suite:
/// `BASE=50000 COUNT=200 cargo test --release -p nessie-testkit --test stress_replicated
/// many_seeds_rejoin -- --ignored`.
#[test]
#[ignore]
fn many_seeds_rejoin() {
    let (mut small, o) = small_index_no_cache();
    if std::env::var("GEOM").as_deref() == Ok("tiny") {
        // Tiny data tables too: entries are placed on other nodes, the dead one's included.
        small.dtes_per_node = 48;
    }
    let env = |k: &str, d: u64| std::env::var(k).map_or(d, |b| b.parse().expect("a number"));
    let (base, count) = (env("BASE", 50000), env("COUNT", 100));
    let recovery = match std::env::var("RECOVERY").as_deref() {
        Ok("replace") => Recovery::Replace,
        Ok("return") => Recovery::ReplaceAndReturn,
        _ => Recovery::Restart,
    };
    let g = match recovery {
        Recovery::Restart => small,
        _ => four_nodes(small),
    };
    for seed in base..base + count {
        // The return scenario is checked after the second crash only.
        let second = seed % 2 == 0 || recovery == Recovery::ReplaceAndReturn;
        crash_recover_crash("many seeds", g.clone(), o, recovery, second, seed);
    }
}

/// Index slots per node in the migration runs: room for two rounds of every partition on
/// the two nodes left after a kill.
const MIGRATION_SLOTS: u16 = 100;

/// Index partitions migrate under load (the per-ITE handover, issue 42): while the workload
/// runs on every node, every partition migrates to a chain of index slots on the two nodes
/// after its home, and then, from there, to slots on its home and the node after it (slots to
/// slots); every node's view learns of each migration 2 ms after the one before (lagging
/// views meet fenced words and wait). With `kill`, node 2 dies half way through the first
/// round, in the middle of a migration; the later chains leave it out. The whole history
/// must be linearizable, and every key read alike through two nodes that lived.
fn migrate_under_load(name: &str, g: Geometry, o: Optimizations, kill: bool, seed: u64) {
    let (c, out, ops, keys) = migration_run(name, g, cfg(o), kill, seed);
    assert_clean_run(name, &out, ops / 2);
    assert_eq!(out.corrupt_reads, 0);
    survivors_agree_on(name, &c, keys, [0, 1]);
}

/// The run of [`migrate_under_load`]: the cluster, the outcome, the operations the run was
/// meant to make, and the keys.
fn migration_run(
    name: &str,
    g: Geometry,
    pc: ProtocolConfig,
    kill: bool,
    seed: u64,
) -> (LocalCluster, StressOutcome, u64, u64) {
    let c =
        LocalCluster::replicated_with_index_slots(g, pc, delay(seed), 2, MIGRATION_SLOTS).unwrap();
    let parts = c.replica_set().index_partitions().unwrap();
    let nodes = c.replica_set().nodes();
    let (clients, s) = long_run(&c, seed);
    let (out, moved) = run_with_crasher(&c, clients, &s, |wait_ops| {
        if !wait_ops(5_000) {
            return None;
        }
        let mut next_slot = vec![0u16; nodes as usize];
        let mut dead = None;
        let mut moved = 0u32;
        for round in 0..2u16 {
            for q in 0..parts.count() as u16 {
                let h = parts.home(q);
                let mut chain: Vec<NodeId> = (0..nodes)
                    .map(|k| (h + k + 1 - round) % nodes)
                    .filter(|&n| Some(n) != dead)
                    .take(2)
                    .collect();
                chain.dedup();
                let to: Vec<IndexCopy> = chain
                    .iter()
                    .map(|&n| {
                        let slot = next_slot[n as usize];
                        next_slot[n as usize] += 1;
                        IndexCopy {
                            node: n,
                            slot,
                            receiving: false,
                        }
                    })
                    .collect();
                let halfway = kill && round == 0 && q == parts.count() as u16 / 2;
                std::thread::scope(|k| {
                    if halfway {
                        k.spawn(|| {
                            std::thread::sleep(Duration::from_millis(3));
                            c.fabric().kill_node(2);
                            c.fail_node(2);
                        });
                    }
                    c.migrate_partition(q, &to, Duration::from_millis(2), 0)
                        .unwrap_or_else(|e| panic!("{name}: partition {q} to {to:?}: {e}"));
                });
                if halfway {
                    dead = Some(2);
                }
                moved += 1;
                if !wait_ops(500) {
                    return Some(moved);
                }
            }
        }
        Some(moved)
    });
    let moved = moved.unwrap_or_else(|| panic!("{name}: the run ended before any migration"));
    eprintln!("{name}, seed {seed}: {moved} migrations\n{out}");
    assert_eq!(moved, 2 * parts.count(), "{name}: the run ended mid-way");
    let ops = match kill {
        false => 6 * s.ops_per_thread,
        true => 4 * s.ops_per_thread,
    };
    (c, out, ops, s.keys)
}

#[test]
fn index_partitions_migrate_under_load_and_the_history_stays_linearizable() {
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        migrate_under_load(name, g, o, false, 800 + i as u64);
    }
}

/// The mutation `handover_without_fence` (the new chain takes an entry's word without the old
/// chain's being fenced): nodes whose views lag commit in the old chain, and the history shows
/// it (6 of 40 keys not linearizable in the run that found it).
#[test]
fn a_handover_without_its_fence_is_caught_by_the_history() {
    let (name, g, o) = variants().remove(0);
    let mut pc = cfg(o);
    pc.mutations.handover_without_fence = true;
    let (_, out, _, _) = migration_run(name, g, pc, false, 800);
    nessie_testkit::assertions::assert_violation(&out, "handover_without_fence");
}

/// A hunt: the migration runs over the small-index variants with 30 seeds from `$BASE`
/// (default 9500). Not part of the suite: `BASE=9500 cargo test -p nessie-testkit --test
/// stress_replicated many_seeds_migrations -- --ignored --nocapture`.
#[test]
#[ignore]
fn many_seeds_migrations() {
    let base: u64 = std::env::var("BASE").map_or(9500, |b| b.parse().expect("BASE is a number"));
    for seed in base..base + 30 {
        for (name, g, o) in variants().into_iter().skip(1) {
            migrate_under_load(name, g, o, false, seed);
        }
    }
}

#[test]
fn a_node_killed_mid_migration_loses_nothing() {
    for (i, (name, g, o)) in variants().into_iter().take(2).enumerate() {
        migrate_under_load(name, g, o, true, 810 + i as u64);
    }
}
