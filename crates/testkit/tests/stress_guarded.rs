//! Concurrency stress of conditional writes (add, replace, read-modify-write and delete on a
//! version) mixed with plain GETs, PUTs and DELETEs on hot keys, on the in-process fabric with
//! delay injection and stalls past the expiry period, every history checked for
//! linearizability with conditional writes in the checker's model. Each control mutation of
//! the conditional write must be caught.

mod common;
use common::{cfg, delay, geometry, small_index, variants};

use std::time::Duration;

use nessie_cluster::LocalCluster;
use nessie_protocols::hooks::Hook;
use nessie_protocols::{HookPoint, Mutations, Optimizations, ProtocolConfig};
use nessie_store::Geometry;
use nessie_testkit::assertions::{
    assert_clean_run, assert_no_errors_but_rare_index_full, assert_violation,
};
use nessie_testkit::guarded::{run_guarded, GuardedSpec};
use nessie_testkit::stress::StressOutcome;

/// Nodes of the four client threads.
const THREADS_NODES: [u16; 4] = [0, 1, 2, 0];
/// Expiry period: short, so that the stalled client's attempts time out and withdraw.
const EXPIRY_NS: u64 = 20_000_000;

fn spec(seed: u64, ops_per_thread: u64) -> GuardedSpec {
    GuardedSpec {
        ops_per_thread,
        keys: 40,
        hot_keys: 2,
        hot_fraction: 0.7,
        value_len: 16,
        seed,
        time_limit: Duration::from_secs(120),
    }
}

/// One client stalls past the expiry period on every `every`-th arrival between a conditional
/// write's look and its commit: its attempt times out and withdraws its entry.
fn stall_guarded_writes(every: u64) -> Hook {
    let mut n = 0u64;
    Box::new(move |p| {
        if matches!(
            p,
            HookPoint::GuardedAfterLook
                | HookPoint::AfterCandidateCas
                | HookPoint::BeforeReversePass
        ) {
            n += 1;
            if n.is_multiple_of(every) {
                std::thread::sleep(Duration::from_nanos(EXPIRY_NS + 2_000_000));
            }
        }
    })
}

fn run(
    seed: u64,
    g: Geometry,
    optimizations: Optimizations,
    mutations: Mutations,
    ops: u64,
) -> StressOutcome {
    let cfg = ProtocolConfig {
        expiry_ns: EXPIRY_NS,
        optimizations,
        mutations,
        ..cfg()
    };
    let c = LocalCluster::new(g, cfg.clone(), delay(seed)).unwrap();
    let mut clients: Vec<_> = THREADS_NODES
        .iter()
        .map(|&n| c.client_with(n, cfg.clone()).unwrap())
        .collect();
    clients[1].set_hook(Some(stall_guarded_writes(499)));
    let (out, cs) = run_guarded(clients, &spec(seed, ops));
    let mut st = nessie_protocols::cd::ClientStats::default();
    for c in &cs {
        st += c.stats();
    }
    eprintln!("{out}\n{st:?}");
    out
}

#[test]
fn conditional_writes_stay_linearizable() {
    let out = run(
        1,
        geometry(),
        Optimizations::default(),
        Mutations::default(),
        15_000,
    );
    assert_clean_run("", &out, 60_000);
    assert_eq!(out.failed_writes_read, 0, "a failed write was read");
}

#[test]
fn conditional_writes_with_small_indexes_and_each_optimisation_off() {
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        eprintln!("--- {name}");
        let out = run(10 + i as u64, g, o, Mutations::default(), 4_000);
        assert_clean_run(name, &out, 16_000);
        assert_eq!(out.failed_writes_read, 0, "{name}: a failed write was read");
    }
}

/// A control mutation must make some run of a few seeds not linearizable.
fn caught(name: &str, mutations: Mutations) {
    for seed in 100..104 {
        let out = run(
            seed,
            small_index(),
            Optimizations::default(),
            mutations,
            6_000,
        );
        if out.report.violations().count() > 0 {
            assert_violation(&out, name);
            return;
        }
    }
    panic!("{name} went unnoticed in four runs");
}

#[test]
fn mutation_judging_the_state_from_step_2_is_caught() {
    caught(
        "guard_looks_to_candidate",
        Mutations {
            guard_looks_to_candidate: true,
            ..Mutations::default()
        },
    );
}

#[test]
fn mutation_clearing_a_write_in_progress_is_caught() {
    caught(
        "guard_passes_writes",
        Mutations {
            guard_passes_writes: true,
            ..Mutations::default()
        },
    );
}

/// With two copies of every partition (R = 2), without failures: conditional writes go
/// through the same replicated CASes and writes as plain ones.
#[test]
fn conditional_writes_with_copies_stay_linearizable() {
    let seed = 7;
    let cfg = ProtocolConfig {
        expiry_ns: EXPIRY_NS,
        ..cfg()
    };
    let c = LocalCluster::replicated(small_index(), cfg, delay(seed), 2).unwrap();
    let clients: Vec<_> = THREADS_NODES
        .iter()
        .map(|&n| c.client(n).unwrap())
        .collect();
    let (out, _) = run_guarded(clients, &spec(seed, 4_000));
    eprintln!("R = 2: {out}");
    assert_clean_run("R = 2", &out, 16_000);
    assert_no_errors_but_rare_index_full("R = 2", &out);
    assert_eq!(out.failed_writes_read, 0);
}
