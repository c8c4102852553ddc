//! The timing model and the scheduler, on plain fabric operations.

use std::sync::{Arc, Mutex};

use nessie_fabric::{Endpoint, FabricError, Locality, OpKind, RemoteAddr};
use nessie_fabric_sim::params::headers;
use nessie_fabric_sim::{RunSummary, Sim, SimParams, SIM_EPOCH_NS};
use rand::{Rng, SeedableRng};

const KIB64: usize = 64 * 1024;

/// Default parameters, every thread starting at time 0.
fn params() -> SimParams {
    SimParams {
        start_jitter_ns: 0,
        ..SimParams::default()
    }
}

fn two_nodes(p: SimParams, seed: u64) -> Sim {
    Sim::new(p, seed, &[vec![1 << 20], vec![1 << 20]]).unwrap()
}

/// Virtual time one thread on node 0 takes for `f`.
fn timed(sim: &Sim, f: impl FnOnce(&mut nessie_fabric_sim::SimEndpoint) + Send + 'static) -> u64 {
    let mut ep = sim.endpoint(0);
    let h = sim.spawn(ep.thread(), move || {
        let t0 = ep.mono_ns();
        f(&mut ep);
        ep.mono_ns() - t0
    });
    sim.run();
    h.join().unwrap()
}

/// A READ of `len` bytes from an idle remote node: post, requester NIC, request on the wire,
/// latency, responder NIC, response on the wire, latency.
fn idle_read_ns(p: &SimParams, len: u64) -> u64 {
    let request = SimParams::transfer_ns(p.wire_bytes(0, headers::RETH), p.link_mbps);
    let response = SimParams::transfer_ns(p.wire_bytes(len, headers::AETH), p.link_mbps);
    p.cpu_op_ns + 2 * p.nic_op_ns + request + response + 2 * p.one_way_latency_ns
}

#[test]
fn a_64k_read_costs_latency_plus_transfer_plus_nic_time() {
    let p = params();
    let sim = two_nodes(p.clone(), 1);
    let took = timed(&sim, |ep| {
        let mut buf = vec![0u8; KIB64];
        ep.read(RemoteAddr::new(1, 0, 0), &mut buf).unwrap();
    });
    assert_eq!(took, idle_read_ns(&p, KIB64 as u64));
    // The payload's time on a 10 Gb/s link dominates: 65,536 × 8 / 10^10 s = 52.4 µs; the
    // 64 packets' headers add 8%, the round trip and NIC time 3.5%.
    let payload_ns = KIB64 as u64 * 8 / 10;
    assert!(took > payload_ns + 2 * p.one_way_latency_ns && took < payload_ns * 115 / 100);
    let s = sim.stats().total(Some(0));
    assert_eq!(s.ops(OpKind::Read, Locality::Remote), 1);
    assert_eq!(s.bytes(OpKind::Read, Locality::Remote), KIB64 as u64);
    let wire = sim.wire_bytes(1).tx;
    assert_eq!(wire, p.wire_bytes(KIB64 as u64, headers::AETH));
    assert_eq!(wire, 65_536 + 4 + 64 * 82, "64 packets of 1 KiB");
}

#[test]
fn two_concurrent_reads_through_one_nic_take_twice_as_long() {
    let p = params();
    let sim = two_nodes(p.clone(), 1);
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let mut ep = sim.endpoint(0);
            sim.spawn(ep.thread(), move || {
                let mut buf = vec![0u8; KIB64];
                ep.read(RemoteAddr::new(1, 0, 0), &mut buf).unwrap();
                ep.mono_ns()
            })
        })
        .collect();
    let run = sim.run();
    let mut done: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    done.sort();
    let one = idle_read_ns(&p, KIB64 as u64);
    let response = SimParams::transfer_ns(p.wire_bytes(KIB64 as u64, headers::AETH), p.link_mbps);
    assert!(
        done[0] < one + p.nic_op_ns * 3,
        "the first is barely delayed: {done:?}"
    );
    assert!(
        done[1] >= done[0] + response,
        "the second response waits for the first on node 1's link: {done:?}"
    );
    let ratio = done[1] as f64 / one as f64;
    assert!((1.9..2.1).contains(&ratio), "about twice as long: {ratio}");
    assert_eq!(run.end_ns, done[1]);
}

#[test]
fn cas_loopback_and_direct_access_costs() {
    let p = params();
    let cas = timed(&two_nodes(p.clone(), 1), |ep| {
        assert_eq!(
            ep.compare_and_swap(RemoteAddr::new(1, 0, 8), 0, 5).unwrap(),
            0
        );
    });
    let request = SimParams::transfer_ns(p.wire_bytes(0, headers::ATOMIC_ETH), p.link_mbps);
    let response = SimParams::transfer_ns(p.wire_bytes(0, headers::ATOMIC_ACK), p.link_mbps);
    assert_eq!(
        cas,
        p.cpu_op_ns
            + 2 * p.nic_op_ns
            + p.nic_atomic_ns
            + request
            + response
            + 2 * p.one_way_latency_ns
    );
    let looped = timed(&two_nodes(p.clone(), 1), |ep| {
        let mut b = [0u8; 64];
        ep.read(RemoteAddr::new(0, 0, 0), &mut b).unwrap();
    });
    let pcie = SimParams::transfer_ns(64, p.pcie_mbps);
    assert_eq!(
        looped,
        p.cpu_op_ns + 2 * p.nic_op_ns + 2 * p.loopback_latency_ns + pcie
    );
    let direct = timed(&two_nodes(p.clone(), 1), |ep| {
        ep.local_write(0, 0, &[1u8; 4096]).unwrap();
    });
    assert_eq!(direct, p.local_op_ns + p.copy_ns(4096));
    assert_eq!(p.copy_ns(4096), 410, "4 KiB at 10 GB/s");
}

#[test]
fn clocks_and_sleep_are_virtual() {
    let sim = two_nodes(params(), 1);
    let mut ep = sim.endpoint(1);
    let h = sim.spawn(ep.thread(), move || {
        let (wall, mono) = (ep.now_ns(), ep.mono_ns());
        ep.sleep_ns(3_600_000_000_000); // an hour, in no real time
        (wall, mono, ep.now_ns() - wall, ep.mono_ns() - mono)
    });
    let start = std::time::Instant::now();
    let run = sim.run();
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(
        h.join().unwrap(),
        (SIM_EPOCH_NS, 0, 3_600_000_000_000, 3_600_000_000_000)
    );
    assert_eq!(run.end_ns, 3_600_000_000_000);
}

#[test]
fn bad_accesses_fail_before_any_time_passes() {
    let sim = two_nodes(params(), 1);
    let took = timed(&sim, |ep| {
        let mut b = [0u8; 8];
        assert!(matches!(
            ep.read(RemoteAddr::new(2, 0, 0), &mut b),
            Err(FabricError::UnknownNode { node: 2, .. })
        ));
        assert!(matches!(
            ep.read(RemoteAddr::new(1, 3, 0), &mut b),
            Err(FabricError::UnknownRegion { region: 3, .. })
        ));
        assert!(matches!(
            ep.write(RemoteAddr::new(1, 0, 4), &b),
            Err(FabricError::Misaligned { .. })
        ));
        assert!(matches!(
            ep.local_read(0, 1 << 20, &mut b),
            Err(FabricError::OutOfBounds { .. })
        ));
    });
    assert_eq!(took, 0);
    assert_eq!(sim.stats().total(None).total_ops(), 0);
}

/// Threads on three nodes increment shared counters with READ + CAS loops and log what they
/// saw; returns the run, the final counters and every thread's log.
fn cas_workload(seed: u64, p: SimParams) -> (RunSummary, Vec<u64>, Vec<Vec<u64>>) {
    const COUNTERS: u64 = 4;
    const INCREMENTS: usize = 200;
    let sim = Sim::new(p, seed, &[vec![64], vec![64], vec![64]]).unwrap();
    let handles: Vec<_> = (0..6u64)
        .map(|t| {
            let mut ep = sim.endpoint((t % 3) as u16);
            sim.spawn(ep.thread(), move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
                let mut log = Vec::new();
                for _ in 0..INCREMENTS {
                    let at =
                        RemoteAddr::new(rng.gen_range(0..3), 0, 8 * rng.gen_range(0..COUNTERS));
                    let mut cur = ep.read_u64(at).unwrap();
                    loop {
                        let seen = ep.compare_and_swap(at, cur, cur + 1).unwrap();
                        log.push(seen);
                        if seen == cur {
                            break;
                        }
                        cur = seen;
                    }
                }
                log
            })
        })
        .collect();
    let run = sim.run();
    let logs = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut counters = Vec::new();
    for n in 0..3 {
        let mut b = [0u8; 8 * COUNTERS as usize];
        sim.memory(n, 0).read(0, &mut b).unwrap();
        counters.extend(
            b.chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap())),
        );
    }
    (run, counters, logs)
}

#[test]
fn cas_increments_are_atomic_and_runs_are_deterministic() {
    let p = SimParams {
        cores_per_node: 1, // two threads per node share one core
        ..SimParams::default()
    };
    let (run, counters, logs) = cas_workload(7, p.clone());
    assert_eq!(counters.iter().sum::<u64>(), 6 * 200, "no lost increment");
    let retries = logs.iter().map(Vec::len).sum::<usize>() - 6 * 200;
    assert!(retries > 0, "hot counters make CASes fail");
    let again = cas_workload(7, p.clone());
    assert_eq!(
        (run, &counters, &logs),
        (again.0, &again.1, &again.2),
        "same seed, same run"
    );
    let others: Vec<_> = (8..11).map(|s| cas_workload(s, p.clone())).collect();
    assert!(
        others.iter().any(|o| o.0.trace != run.trace && o.2 != logs),
        "other seeds interleave differently"
    );
}

/// Three threads on node 0 take a real Mutex around a READ and a WRITE, as a node's
/// allocator is held across fabric operations; returns the run and when each critical
/// section began.
fn locked_increments(seed: u64) -> (RunSummary, Vec<u64>) {
    let sim = two_nodes(params(), seed);
    let lock = Arc::new(Mutex::new(0u64));
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let mut ep = sim.endpoint(0);
            let lock = lock.clone();
            sim.spawn(ep.thread(), move || {
                let mut entered = Vec::new();
                for _ in 0..20 {
                    let mut g = lock.lock().unwrap();
                    entered.push(ep.mono_ns());
                    let v = ep.read_u64(RemoteAddr::new(1, 0, 0)).unwrap();
                    ep.write(RemoteAddr::new(1, 0, 0), &(v + 1).to_le_bytes())
                        .unwrap();
                    *g += 1;
                    drop(g);
                    ep.sleep_ns(100);
                }
                entered
            })
        })
        .collect();
    let run = sim.run();
    let entered = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    assert_eq!(*lock.lock().unwrap(), 60);
    let mut b = [0u8; 8];
    sim.memory(1, 0).read(0, &mut b).unwrap();
    assert_eq!(
        u64::from_le_bytes(b),
        60,
        "the lock made each read-write atomic"
    );
    (run, entered)
}

#[test]
fn a_thread_blocked_on_a_lock_held_across_an_operation_waits_in_virtual_time() {
    let (run, entered) = locked_increments(3);
    assert!(run.blocks > 0, "threads must have blocked on the lock");
    let mut all = entered.clone();
    all.sort();
    // Critical sections never overlap in virtual time: one READ + WRITE round trip apart.
    let min_gap = all.windows(2).map(|w| w[1] - w[0]).min().unwrap();
    assert!(min_gap >= 2 * params().one_way_latency_ns, "gap {min_gap}");
    assert!(run.end_ns >= 60 * min_gap);
    let again = locked_increments(3);
    assert_eq!(again.1, entered, "same seed, same virtual times");
    assert_eq!(again.0.trace, run.trace, "same seed, same dispatches");
}

/// Virtual time four threads on node 0 take for 100 direct 4 KiB writes each, on a node with
/// `cores` cores of which `polling` are taken by polling threads.
fn four_copiers(cores: u32, polling: u32) -> u64 {
    let p = SimParams {
        cores_per_node: cores,
        ..params()
    };
    let sim = two_nodes(p, 1);
    for _ in 0..polling {
        sim.take_polling_core(0).unwrap();
    }
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let mut ep = sim.endpoint(0);
            sim.spawn(ep.thread(), move || {
                for _ in 0..100 {
                    ep.local_write(0, t * 4096, &[7u8; 4096]).unwrap();
                }
            })
        })
        .collect();
    let run = sim.run();
    handles.into_iter().for_each(|h| h.join().unwrap());
    run.end_ns
}

#[test]
fn threads_share_their_nodes_cores() {
    let p = params();
    let one_write = p.local_op_ns + p.copy_ns(4096);
    assert_eq!(four_copiers(4, 0), 100 * one_write, "a core each");
    assert_eq!(
        four_copiers(1, 0),
        400 * one_write,
        "one core for four threads"
    );
    assert_eq!(
        four_copiers(4, 2),
        200 * one_write,
        "two cores left by polling threads"
    );
    let sim = two_nodes(
        SimParams {
            cores_per_node: 1,
            ..p
        },
        1,
    );
    assert!(sim.take_polling_core(0).is_err(), "a node keeps a core");
}

#[test]
fn a_panicking_thread_ends_and_the_others_run_on() {
    let sim = two_nodes(params(), 1);
    let mut a = sim.endpoint(0);
    let mut b = sim.endpoint(1);
    let failing = sim.spawn(a.thread(), move || {
        a.write(RemoteAddr::new(1, 0, 0), &[1u8; 8]).unwrap();
        panic!("a protocol thread fails");
    });
    let other = sim.spawn(b.thread(), move || {
        (0..10)
            .map(|_| b.read_u64(RemoteAddr::new(0, 0, 0)).unwrap())
            .count()
    });
    sim.run();
    assert!(failing.join().is_err());
    assert_eq!(other.join().unwrap(), 10);
}

/// An idle poller waits for the next write to the bytes it polls: it resumes at the instant a
/// remote WRITE or a direct write there takes effect, ignores writes to other bytes, regions
/// and nodes, and without any write looks again after `IDLE_POLL_MAX_NS`.
#[test]
fn idle_pollers_resume_when_their_bytes_are_written() {
    use nessie_fabric_sim::watch::IDLE_POLL_MAX_NS;
    let p = params();
    let regions = [vec![4096, 4096], vec![4096, 4096]];
    let sim = Sim::new(p.clone(), 3, &regions).unwrap();
    let mut poller = sim.endpoint(1);
    let waits = sim.spawn(poller.thread(), move || {
        let mut resumed = Vec::new();
        for _ in 0..3 {
            poller.idle_poll(1, std::slice::from_ref(&(0..16)));
            resumed.push(poller.mono_ns());
        }
        resumed
    });
    let mut writer = sim.endpoint(0);
    let wrote = sim.spawn(writer.thread(), move || {
        // Other node, other region, other bytes: the poller sleeps on.
        writer.write(RemoteAddr::new(0, 1, 0), &[1; 8]).unwrap();
        writer.write(RemoteAddr::new(1, 0, 0), &[1; 8]).unwrap();
        writer.write(RemoteAddr::new(1, 1, 16), &[1; 8]).unwrap();
        let before = writer.mono_ns();
        writer.write(RemoteAddr::new(1, 1, 0), &[1; 8]).unwrap();
        (before, writer.mono_ns())
    });
    let mut local = sim.endpoint(1);
    let local_wrote = sim.spawn(local.thread(), move || {
        local.sleep_ns(3 * IDLE_POLL_MAX_NS / 2);
        local.local_write(1, 8, &[2; 8]).unwrap();
        local.mono_ns()
    });
    sim.run();
    let resumed = waits.join().unwrap();
    let (before, after) = wrote.join().unwrap();
    // The WRITE took effect at the responder NIC, before its ACK came back.
    assert!(
        resumed[0] > before && resumed[0] < after,
        "{resumed:?} {before} {after}"
    );
    // Nothing more until the direct write at 1.5 × the longest wait...
    let direct = local_wrote.join().unwrap();
    assert_eq!(resumed[1], resumed[0] + IDLE_POLL_MAX_NS, "{resumed:?}");
    assert_eq!(resumed[2], direct, "{resumed:?}");
}

/// Virtual time the `slots` slots of one pipeline on node 0 (a 4-core node) take, each doing
/// 100 direct 4 KiB writes (CPU work only), and, in a second run, each doing 100 remote
/// 64-byte READs (mostly latency).
fn pipeline_slots(slots: usize) -> (u64, u64) {
    let p = SimParams {
        cores_per_node: 4,
        ..params()
    };
    let run = |remote: bool| {
        let sim = two_nodes(p.clone(), 1);
        let handles: Vec<_> = sim
            .pipeline(0, slots)
            .into_iter()
            .enumerate()
            .map(|(t, mut ep)| {
                sim.spawn(ep.thread(), move || {
                    let mut buf = [0u8; 64];
                    for _ in 0..100 {
                        match remote {
                            false => ep.local_write(0, t as u64 * 4096, &[7u8; 4096]).unwrap(),
                            true => ep.read(RemoteAddr::new(1, 0, 0), &mut buf).unwrap(),
                        }
                    }
                })
            })
            .collect();
        let r = sim.run();
        handles.into_iter().for_each(|h| h.join().unwrap());
        r.end_ns
    };
    (run(false), run(true))
}

#[test]
fn a_pipelines_slots_share_one_cpu_and_overlap_their_fabric_operations() {
    let p = params();
    let one_write = p.local_op_ns + p.copy_ns(4096);
    let (cpu1, wire1) = pipeline_slots(1);
    let (cpu4, wire4) = pipeline_slots(4);
    assert_eq!(cpu1, 100 * one_write);
    // LN1: four slots' CPU work runs one piece at a time though the node has four cores (four
    // plain threads take 100 writes' time: `threads_share_their_nodes_cores`).
    assert_eq!(cpu4, 400 * one_write, "the slots' CPU work is serialised");
    // Their READs overlap: four slots do four times the READs in about the time one slot does
    // its (each READ is mostly latency; only the post's CPU work is serialised).
    assert!(
        wire4 < wire1 * 11 / 10,
        "four slots' READs overlap: {wire4} ns against {wire1} ns for one slot"
    );
    assert!(wire4 >= wire1, "{wire4} < {wire1}");
}
