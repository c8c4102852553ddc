//! The unchanged protocols on the simulated fabric: histories of concurrent mixed workloads
//! are linearizable (CD, and SD and HY with their polling servers), and a known protocol
//! mutation is caught.

use nessie_baselines::sd::RpcConfig;
use nessie_bench::driver::drive;
use nessie_bench::workload::{KeyGen, Workload};
use nessie_check::{Event, Limits, Report};
use nessie_deploy::Mode;
use nessie_fabric_sim::{RunSummary, SimParams};
use nessie_protocols::{Mutations, ProtocolConfig};
use nessie_sim::cluster::SimCluster;
use nessie_sim::correctness::Recording;
use nessie_store::Geometry;
use rand::SeedableRng;

const NODES: u16 = 3;
const THREADS_PER_NODE: u16 = 2;
const OPS_PER_THREAD: u64 = 600;

/// A cluster and its load: `threads` client threads per node, `ops` operations each.
#[derive(Clone, Copy)]
struct Setup {
    nodes: u16,
    threads: u16,
    ops: u64,
    hw: fn() -> SimParams,
    mode: Mode,
}

const BASE: Setup = Setup {
    nodes: NODES,
    threads: THREADS_PER_NODE,
    ops: OPS_PER_THREAD,
    hw: SimParams::default,
    mode: Mode::Cd,
};

fn geometry(nodes: u16) -> Geometry {
    Geometry {
        nodes: nodes as u32,
        ites_per_node: 1024,
        dtes_per_node: 4096,
        key_max: 16,
        value_max: 48,
        hash_functions: 3,
        filter_bits: 7,
    }
}

fn cfg(mutations: Mutations) -> ProtocolConfig {
    ProtocolConfig {
        expiry_ns: 20_000_000,
        clock_margin_ns: 1_000_000,
        cache_entries: 64,
        mutations,
        ..ProtocolConfig::default()
    }
}

struct Outcome {
    run: RunSummary,
    events: Vec<Event>,
    corrupt: u64,
    report: Report,
}

/// Two client threads per node on 64 keys, half the operations on 4 hot keys: 50% GETs, 10%
/// DELETEs, 40% PUTs of 8-48 bytes.
fn run(seed: u64, mutations: Mutations) -> Outcome {
    run_on(BASE, seed, mutations)
}

fn run_on(s: Setup, seed: u64, mutations: Mutations) -> Outcome {
    let rpc = RpcConfig {
        max_clients_per_node: s.threads,
        ..RpcConfig::default()
    };
    let (hw, g) = ((s.hw)(), geometry(s.nodes));
    let mut c = SimCluster::with_mode(hw, seed, g, cfg(mutations), s.mode, rpc).unwrap();
    let clients: Vec<_> = (0..s.nodes * s.threads)
        .map(|i| {
            let (client, thread, timer) = c.mode_client(i % s.nodes).unwrap();
            ((client, timer), thread)
        })
        .collect();
    let threads = clients.len() as u64;
    let workload = Workload::new(KeyGen::hot(64, 4, 0.5).unwrap(), 0.5, 0.1, (8, 48)).unwrap();
    let (run, recordings) = c.run(clients, move |i, (mut client, timer)| {
        let mut rec = Recording::new(i as u32, s.ops, timer);
        let mut w = workload.for_thread(i as u64, threads);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ (i as u64) << 32);
        drive(&mut client, &mut w, &mut rng, &mut rec);
        rec
    });
    let corrupt = recordings.iter().map(|r| r.corrupt).sum();
    let mut events: Vec<Event> = recordings.into_iter().flat_map(|r| r.events).collect();
    events.sort_by_key(|e| (e.invoke_ns, e.client, e.response_ns));
    let report = nessie_check::check(&events, |_| None, &Limits::default());
    Outcome {
        run,
        events,
        corrupt,
        report,
    }
}

#[test]
fn concurrent_mixed_workload_is_linearizable_in_virtual_time() {
    let out = run(1, Mutations::default());
    let ops = (NODES * THREADS_PER_NODE) as u64 * OPS_PER_THREAD;
    assert_eq!(out.events.len() as u64, ops);
    assert_eq!(out.corrupt, 0, "reads returned bytes nobody wrote");
    assert!(out.report.is_ok(), "not linearizable:\n{}", out.report);
    let ok = out
        .events
        .iter()
        .filter(|e| e.outcome != nessie_check::Outcome::Failed)
        .count() as u64;
    assert!(
        ok * 10 >= ops * 9,
        "only {ok} of {ops} operations succeeded"
    );
    // Operations overlapped: the run is far shorter than the operations laid end to end.
    let busy: u64 = out.events.iter().map(|e| e.response_ns - e.invoke_ns).sum();
    assert!(
        out.run.end_ns * 3 < busy,
        "{} ns for {busy} ns of operations",
        out.run.end_ns
    );
    eprintln!(
        "{ops} ops in {} µs virtual, {} dispatches, {} blocked on the allocator",
        out.run.end_ns / 1000,
        out.run.dispatches,
        out.run.blocks
    );
}

#[test]
fn same_seed_same_history() {
    let a = run(2, Mutations::default());
    let b = run(2, Mutations::default());
    assert_eq!(a.run, b.run);
    assert_eq!(a.events, b.events);
}

#[test]
fn mutation_ignoring_the_valid_flag_is_caught() {
    let out = run(
        3,
        Mutations {
            skip_valid_check: true,
            ..Mutations::default()
        },
    );
    let violations = out.report.violations().count();
    assert!(
        violations > 0 || out.corrupt > 0,
        "GETs returning invalid DTEs went unnoticed\n{}",
        out.report
    );
    eprintln!("{violations} keys violated, {} corrupt reads", out.corrupt);
}

/// One core per node: a node's client threads share it.
fn one_core() -> SimParams {
    SimParams {
        cores_per_node: 1,
        ..SimParams::default()
    }
}

#[test]
fn a_larger_cluster_with_threads_sharing_a_core_is_linearizable() {
    let s = Setup {
        nodes: 8,
        threads: 3,
        ops: 200,
        hw: one_core,
        mode: Mode::Cd,
    };
    let out = run_on(s, 4, Mutations::default());
    assert_eq!(out.events.len(), 8 * 3 * 200);
    assert_eq!(out.corrupt, 0, "reads returned bytes nobody wrote");
    assert!(out.report.is_ok(), "not linearizable:\n{}", out.report);
}

#[test]
fn sd_hy_and_pilaf_with_polling_servers_are_linearizable() {
    for mode in [
        Mode::Sd { server_threads: 1 },
        Mode::Hy { server_threads: 1 },
        Mode::Pilaf { server_threads: 1 },
    ] {
        let s = Setup {
            ops: 250,
            mode,
            ..BASE
        };
        let out = run_on(s, 6, Mutations::default());
        let name = mode.name();
        assert_eq!(out.events.len(), 6 * 250, "{name}");
        assert_eq!(out.corrupt, 0, "{name}: reads returned bytes nobody wrote");
        assert!(
            out.report.is_ok(),
            "{name} not linearizable:\n{}",
            out.report
        );
    }
}
