//! Single-process tests of the UCX backend: one node whose endpoints reach it through loopback
//! (UCX between two workers of the same process), plus API edge cases.

use std::time::{Duration, Instant};

use nessie_fabric::inproc::InProcFabric;
use nessie_fabric::{Endpoint, FabricError, Locality, OpKind, RemoteAddr};
use nessie_fabric_ucx::{bench_op, BenchOp, RegionSource, Transport, UcxConfig, UcxNode};

/// These tests are about UCX, so a node's operations on itself go through UCX's loopback
/// (`direct_loopback` off), and on other nodes through UCX too (`direct_peers` off), unless a
/// test says otherwise.
fn config(t: Transport) -> UcxConfig {
    let mut c = direct_config(t);
    c.direct_loopback = false;
    c.direct_peers = false;
    c
}

/// The default: operations on the endpoint's own node go straight to memory (shm and tcp).
fn direct_config(t: Transport) -> UcxConfig {
    let mut c = UcxConfig::new(t);
    if t == Transport::Tcp {
        c.net_devices = Some("lo".into());
    }
    c.op_timeout = Duration::from_secs(2);
    c
}

/// One thread per entry of `nodes`, each CAS-incrementing the word at `a` `n` times through an
/// endpoint of that node, all at once; returns their endpoints.
fn increment_at_once(
    nodes: &[std::sync::Arc<UcxNode>],
    cluster: &[nessie_fabric_ucx::NodeInfo],
    a: RemoteAddr,
    n: u64,
) -> Vec<nessie_fabric_ucx::UcxEndpoint> {
    let threads: Vec<_> = nodes
        .iter()
        .map(|node| {
            let (node, cluster) = (node.clone(), cluster.to_vec());
            std::thread::spawn(move || {
                let mut ep = node.endpoint(&cluster).unwrap();
                increment(&mut ep, a, n);
                ep
            })
        })
        .collect();
    threads.into_iter().map(|h| h.join().unwrap()).collect()
}

/// CAS-increment the word at `a` `n` times, retrying lost races.
fn increment(ep: &mut impl Endpoint, a: RemoteAddr, n: u64) {
    for _ in 0..n {
        let mut cur = ep.read_u64(a).unwrap();
        loop {
            match ep.compare_and_swap(a, cur, cur + 1).unwrap() {
                v if v == cur => break,
                v => cur = v,
            }
        }
    }
}

fn loopback(t: Transport) {
    let node = UcxNode::new(0, &[4096, 1 << 20], &config(t)).unwrap();
    assert_eq!(node.info().regions.len(), 2);
    assert_eq!(node.info().regions[0].len, 4096);
    let mut a = node.endpoint(&[node.info().clone()]).unwrap();
    let mut b = node.endpoint(&[node.info().clone()]).unwrap();
    assert_eq!((a.node(), a.node_count()), (0, 1));
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 7) as u8).collect();
    a.write(RemoteAddr::new(0, 1, 0), &data).unwrap();
    let mut back = vec![0u8; data.len()];
    b.read(RemoteAddr::new(0, 1, 0), &mut back).unwrap();
    assert!(back == data);
    b.local_read(1, 0, &mut back).unwrap();
    assert!(back == data);
    // Fresh memory is zeroed.
    let mut z = [1u8; 64];
    b.local_read(0, 4096 - 64, &mut z).unwrap();
    assert_eq!(z, [0u8; 64]);
    let w = RemoteAddr::new(0, 0, 0);
    assert_eq!(a.compare_and_swap(w, 0, 3).unwrap(), 0);
    assert_eq!(b.compare_and_swap(w, 0, 4).unwrap(), 3);
    node.region(0)
        .unwrap()
        .write(8, &9u64.to_le_bytes())
        .unwrap();
    assert_eq!(
        b.read_u64(RemoteAddr::new(0, 0, 8)).unwrap(),
        9,
        "direct writes are seen by the fabric"
    );
    // Zero-length operations are valid no-ops.
    a.read(RemoteAddr::new(0, 0, 4096), &mut []).unwrap();
    let sa = a.stats().snapshot();
    assert_eq!(sa.ops(OpKind::Write, Locality::Loopback), 1);
    assert_eq!(sa.bytes(OpKind::Write, Locality::Loopback), 1 << 20);
    assert_eq!(sa.ops(OpKind::Cas, Locality::Loopback), 1);
    assert_eq!(sa.ops(OpKind::Read, Locality::Loopback), 1);
    assert_eq!(sa.remote_ops(), 0);
    assert_eq!(node.stats().total(None).total_ops(), 3 + 5);
}

#[test]
fn shm_loopback_ops() {
    loopback(Transport::Shm);
}

#[test]
fn tcp_loopback_ops() {
    loopback(Transport::Tcp);
}

#[test]
fn auto_transport_works_here() {
    loopback(Transport::Auto);
}

#[test]
fn shm_loopback_needs_no_progress_thread_but_tcp_does() {
    for t in [Transport::Shm, Transport::Tcp] {
        let mut cfg = config(t);
        cfg.op_timeout = Duration::from_millis(500);
        let node = UcxNode::new(0, &[4096], &cfg).unwrap();
        let mut ep = node.endpoint(&[node.info().clone()]).unwrap();
        node.pause_progress();
        node.pause_progress(); // idempotent
        let r = ep.compare_and_swap(RemoteAddr::new(0, 0, 0), 0, 1);
        match t {
            Transport::Shm => assert_eq!(r.unwrap(), 0),
            _ => assert!(
                matches!(r, Err(FabricError::Unreachable { node: 0, .. })),
                "{r:?}"
            ),
        }
        node.resume_progress();
        node.resume_progress();
        let mut ep2 = node.endpoint(&[node.info().clone()]).unwrap();
        let v = ep2.read_u64(RemoteAddr::new(0, 0, 0)).unwrap();
        match t {
            Transport::Shm => assert_eq!(v, 1),
            // The timed-out CAS was already on its way: the target may still execute it once it
            // progresses again. Unreachable does not mean "did not happen".
            _ => assert!(v <= 1, "{v}"),
        }
    }
}

#[test]
fn dropping_a_paused_node_does_not_hang_and_endpoints_may_outlive_it() {
    let node = UcxNode::new(0, &[4096], &config(Transport::Shm)).unwrap();
    let mut ep = node.endpoint(&[node.info().clone()]).unwrap();
    ep.write(RemoteAddr::new(0, 0, 0), &[5u8; 8]).unwrap();
    node.pause_progress();
    let t = Instant::now();
    drop(node);
    assert!(t.elapsed() < Duration::from_secs(2));
    // The regions live as long as an endpoint does.
    let mut b = [0u8; 8];
    ep.local_read(0, 0, &mut b).unwrap();
    assert_eq!(b, [5u8; 8]);
    drop(ep);
}

#[test]
fn caller_provided_memory_is_registered_and_shared() {
    for t in [Transport::Shm, Transport::Tcp] {
        let mut backing = vec![0u64; 512];
        backing[3] = 77;
        let src = [
            RegionSource::Provided {
                ptr: backing.as_mut_ptr() as *mut u8,
                len: 4096,
            },
            RegionSource::Allocate(64),
        ];
        // SAFETY: `backing` outlives the node and its endpoint (dropped at the end of the
        // iteration) and is not touched by this test while they live.
        let node = unsafe { UcxNode::with_regions(0, &src, &config(t)) }.unwrap();
        assert_eq!(node.info().regions[0].base, backing.as_ptr() as u64);
        let mut ep = node.endpoint(&[node.info().clone()]).unwrap();
        assert_eq!(ep.read_u64(RemoteAddr::new(0, 0, 24)).unwrap(), 77);
        assert_eq!(
            ep.compare_and_swap(RemoteAddr::new(0, 0, 24), 77, 78)
                .unwrap(),
            77
        );
        ep.write(RemoteAddr::new(0, 0, 4088), &[1u8; 8]).unwrap();
        assert_eq!(node.region(0).unwrap().len_bytes(), 4096);
        drop(ep);
        drop(node);
        assert_eq!(backing[3], 78);
        assert_eq!(backing[511], u64::from_le_bytes([1u8; 8]));
    }
    // Over shm, provided memory is not a shared-memory segment: UCX serves it in software
    // through the target's worker, so it needs the progress thread (unlike allocated regions).
    let mut backing = vec![0u64; 64];
    let mut cfg = config(Transport::Shm);
    cfg.op_timeout = Duration::from_millis(300);
    let src = [RegionSource::Provided {
        ptr: backing.as_mut_ptr() as *mut u8,
        len: 512,
    }];
    // SAFETY: as above.
    let node = unsafe { UcxNode::with_regions(0, &src, &cfg) }.unwrap();
    let mut ep = node.endpoint(&[node.info().clone()]).unwrap();
    assert_eq!(ep.read_u64(RemoteAddr::new(0, 0, 0)).unwrap(), 0);
    node.pause_progress();
    assert!(matches!(
        ep.read_u64(RemoteAddr::new(0, 0, 0)),
        Err(FabricError::Unreachable { .. })
    ));
    node.resume_progress();
    drop(ep);
    drop(node);
    drop(backing);

    // Misaligned provided memory is rejected.
    let mut v = vec![0u64; 4];
    let p = unsafe { (v.as_mut_ptr() as *mut u8).add(4) };
    let r = unsafe {
        UcxNode::with_regions(
            0,
            &[RegionSource::Provided { ptr: p, len: 16 }],
            &config(Transport::Shm),
        )
    };
    assert!(matches!(r, Err(FabricError::Misaligned { .. })));
}

#[test]
fn endpoint_rejects_a_cluster_list_without_this_node() {
    let a = UcxNode::new(0, &[64], &config(Transport::Shm)).unwrap();
    let b = UcxNode::new(1, &[64], &config(Transport::Shm)).unwrap();
    assert!(matches!(
        a.endpoint(&[]),
        Err(FabricError::UnknownNode { node: 0, nodes: 0 })
    ));
    assert!(matches!(
        b.endpoint(&[b.info().clone()]),
        Err(FabricError::UnknownNode { node: 1, nodes: 1 })
    ));
    let e = a
        .endpoint(&[b.info().clone(), a.info().clone()])
        .err()
        .unwrap();
    assert!(e.to_string().contains("not this node"), "{e}");
    // Two nodes in one process (separate contexts) reach each other.
    let cluster = [a.info().clone(), b.info().clone()];
    let mut ea = a.endpoint(&cluster).unwrap();
    let mut eb = b.endpoint(&cluster).unwrap();
    ea.write(RemoteAddr::new(1, 0, 8), &42u64.to_le_bytes())
        .unwrap();
    assert_eq!(eb.read_u64(RemoteAddr::new(1, 0, 8)).unwrap(), 42);
    assert_eq!(
        ea.stats().snapshot().ops(OpKind::Write, Locality::Remote),
        1
    );
    assert_eq!(
        eb.stats().snapshot().ops(OpKind::Read, Locality::Loopback),
        1
    );
}

#[test]
fn a_peer_on_another_transport_is_unreachable_not_a_crash() {
    let a = UcxNode::new(0, &[64], &config(Transport::Shm)).unwrap();
    let b = UcxNode::new(1, &[64], &config(Transport::Tcp)).unwrap();
    let mut ep = a.endpoint(&[a.info().clone(), b.info().clone()]).unwrap();
    assert!(ep.is_unreachable(1));
    let e = ep.read_u64(RemoteAddr::new(1, 0, 0)).unwrap_err();
    assert!(matches!(e, FabricError::Unreachable { node: 1, .. }), "{e}");
    assert_eq!(
        ep.read_u64(RemoteAddr::new(0, 0, 0)).unwrap(),
        0,
        "the endpoint still works for others"
    );
}

#[test]
fn bench_op_works_on_any_endpoint() {
    let f = InProcFabric::new(&[vec![1 << 16]], None).unwrap();
    let mut ep = f.endpoint(0);
    let s = bench_op(&mut ep, RemoteAddr::new(0, 0, 0), BenchOp::Cas, 8, 1000).unwrap();
    assert_eq!((s.iterations, s.size), (1000, 8));
    assert_eq!(
        ep.read_u64(RemoteAddr::new(0, 0, 0)).unwrap(),
        1100,
        "warm-up + measured CASes all succeed"
    );
    assert!(s.min_ns <= s.p50_ns && s.p50_ns <= s.p99_ns && s.p99_ns <= s.max_ns);
    let node = UcxNode::new(0, &[1 << 16], &config(Transport::Shm)).unwrap();
    let mut uep = node.endpoint(&[node.info().clone()]).unwrap();
    for op in [BenchOp::Read, BenchOp::Write] {
        let s = bench_op(&mut uep, RemoteAddr::new(0, 0, 0), op, 4096, 500).unwrap();
        assert_eq!(s.size, 4096);
        assert!(s.ops_per_sec > 0.0);
    }
    assert!(bench_op(
        &mut uep,
        RemoteAddr::new(0, 0, 8),
        BenchOp::Read,
        1 << 16,
        10
    )
    .is_err());
}

#[test]
fn config_maps_to_ucp_options() {
    let mut c = UcxConfig::new(Transport::Shm);
    c.ucx_options.push(("UCX_RNDV_THRESH".into(), "inf".into()));
    let o = c.ucp_options();
    assert!(o.contains(&("TLS".into(), "sm,self".into())));
    assert!(o.contains(&("MM_ERROR_HANDLING".into(), "y".into())));
    assert!(o.contains(&("KEEPALIVE_INTERVAL".into(), "1000000us".into())));
    assert_eq!(
        o.last().unwrap(),
        &("RNDV_THRESH".to_string(), "inf".to_string())
    );
    let mut t = UcxConfig::new(Transport::Tcp);
    t.net_devices = Some("lo".into());
    let o = t.ucp_options();
    assert!(o.contains(&("TLS".into(), "tcp,self".into())));
    assert!(o.contains(&("NET_DEVICES".into(), "lo".into())));
    assert!(!o.iter().any(|(k, _)| k == "MM_ERROR_HANDLING"));
    assert!(UcxConfig::new(Transport::Auto)
        .ucp_options()
        .iter()
        .all(|(k, _)| k != "TLS"));
    assert_eq!("SHM".parse::<Transport>().unwrap(), Transport::Shm);
    assert!("ib".parse::<Transport>().is_err());
    // A bad UCX option is reported, not ignored.
    let mut bad = UcxConfig::new(Transport::Shm);
    bad.ucx_options
        .push(("KEEPALIVE_INTERVAL".into(), "soon".into()));
    let e = UcxNode::new(0, &[64], &bad).err().unwrap();
    assert!(e.to_string().contains("KEEPALIVE_INTERVAL"), "{e}");
    let (maj, min, _) = nessie_fabric_ucx::ucx_version();
    assert!(maj >= 1 && (maj > 1 || min >= 12));
}

#[test]
fn endpoints_on_several_threads_share_one_node() {
    for t in [Transport::Shm, Transport::Tcp] {
        let node = std::sync::Arc::new(UcxNode::new(0, &[4096], &config(t)).unwrap());
        let per_thread = if t == Transport::Shm { 20_000 } else { 1_000 };
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let node = node.clone();
                std::thread::spawn(move || {
                    // Created on the thread that uses it (concurrently with the others).
                    let mut ep = node.endpoint(&[node.info().clone()]).unwrap();
                    increment(&mut ep, RemoteAddr::new(0, 0, 8), per_thread);
                    ep
                })
            })
            .collect();
        // Endpoints are Send: they come back to this thread and are dropped here.
        let eps: Vec<_> = threads.into_iter().map(|h| h.join().unwrap()).collect();
        let mut b = [0u8; 8];
        node.region(0).unwrap().read(8, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), 3 * per_thread, "{t}");
        assert_eq!(
            node.stats()
                .total(Some(0))
                .ops(OpKind::Read, Locality::Loopback),
            3 * per_thread
        );
        drop(eps);
    }
}

/// A node's own threads use CPU atomics on its memory (`direct_loopback`) while another node's
/// endpoint reaches the same words through UCX: both kinds of CAS must be atomic with each
/// other, or increments are lost. Over tcp the remote ones are UCX's software atomics, run by
/// the target's progress thread.
#[test]
fn direct_loopback_operations_are_atomic_with_remote_ones() {
    for t in [Transport::Shm, Transport::Tcp] {
        let a = std::sync::Arc::new(UcxNode::new(0, &[4096], &direct_config(t)).unwrap());
        let b = std::sync::Arc::new(UcxNode::new(1, &[64], &direct_config(t)).unwrap());
        let cluster = vec![a.info().clone(), b.info().clone()];
        let n = if t == Transport::Shm { 20_000 } else { 2_000 };
        let word = RemoteAddr::new(0, 0, 16);
        let eps = increment_at_once(
            &[a.clone(), b.clone(), a.clone(), b.clone()],
            &cluster,
            word,
            n,
        );
        let mut w = [0u8; 8];
        a.region(0).unwrap().read(16, &mut w).unwrap();
        assert_eq!(u64::from_le_bytes(w), 4 * n, "{t}");
        // Node 0's operations on itself are counted as loopback, node 1's as remote.
        let s0 = eps[0].stats().snapshot();
        assert!(s0.ops(OpKind::Cas, Locality::Loopback) >= n, "{t}");
        assert_eq!(s0.remote_ops(), 0, "{t}");
        assert!(eps[1].stats().snapshot().ops(OpKind::Cas, Locality::Remote) >= n);
        drop(eps);
    }
}

/// Direct operations need no progress thread, over tcp too, and are checked as UCX's are.
#[test]
fn direct_loopback_needs_no_progress_and_validates_accesses() {
    for t in [Transport::Shm, Transport::Tcp] {
        let node = UcxNode::new(0, &[4096], &direct_config(t)).unwrap();
        let mut ep = node.endpoint(&[node.info().clone()]).unwrap();
        node.pause_progress();
        let w = RemoteAddr::new(0, 0, 0);
        assert_eq!(ep.compare_and_swap(w, 0, 7).unwrap(), 0);
        ep.write(RemoteAddr::new(0, 0, 8), &[3u8; 16]).unwrap();
        let mut back = [0u8; 24];
        ep.read(w, &mut back).unwrap();
        assert_eq!(back[..8], 7u64.to_le_bytes());
        assert_eq!(back[8..], [3u8; 16]);
        assert!(matches!(
            ep.read(RemoteAddr::new(0, 0, 4), &mut [0u8; 8]),
            Err(FabricError::Misaligned { .. })
        ));
        assert!(matches!(
            ep.read(RemoteAddr::new(0, 0, 4096), &mut [0u8; 8]),
            Err(FabricError::OutOfBounds { .. })
        ));
        assert!(matches!(
            ep.compare_and_swap(RemoteAddr::new(0, 5, 0), 0, 1),
            Err(FabricError::UnknownRegion { region: 5, .. })
        ));
        node.resume_progress();
    }
    // Not on `auto`: a verbs NIC's atomics are not atomic with the CPU's.
    assert!(!Transport::Auto.cpu_atomics());
}

/// Over shm a node's threads reach other nodes' memory straight, mapped into the process
/// (`direct_peers`), while another node's endpoints reach the same words through UCX: the two
/// kinds of CAS must be atomic with each other, or increments are lost. Not over tcp, which
/// maps nothing.
#[test]
fn direct_peer_operations_are_atomic_with_ucx_ones() {
    let t = Transport::Shm;
    let a = std::sync::Arc::new(UcxNode::new(0, &[64], &direct_config(t)).unwrap());
    let b = std::sync::Arc::new(UcxNode::new(1, &[64], &config(t)).unwrap());
    let target = UcxNode::new(2, &[4096], &config(t)).unwrap();
    let cluster = vec![a.info().clone(), b.info().clone(), target.info().clone()];
    let n = 20_000;
    let word = RemoteAddr::new(2, 0, 24);
    let mut eps = increment_at_once(
        &[a.clone(), b.clone(), a.clone(), b.clone()],
        &cluster,
        word,
        n,
    );
    assert_eq!(eps[0].read_u64(word).unwrap(), 4 * n);
    assert!(eps[0].maps_memory_of(2) && eps[2].maps_memory_of(1));
    assert!(!eps[1].maps_memory_of(2) && !eps[3].maps_memory_of(0));
    // Both kinds count as remote operations.
    for ep in &eps {
        assert!(ep.stats().snapshot().ops(OpKind::Cas, Locality::Remote) >= n);
    }
    drop(eps);
    let tcp = UcxNode::new(0, &[64], &direct_config(Transport::Tcp)).unwrap();
    let peer = UcxNode::new(1, &[64], &direct_config(Transport::Tcp)).unwrap();
    let mut ep = tcp
        .endpoint(&[tcp.info().clone(), peer.info().clone()])
        .unwrap();
    assert!(!ep.maps_memory_of(1), "tcp maps no peer memory");
}

/// Operations straight on a peer's mapped memory need no progress at the target and are
/// checked as UCX's are: misaligned, out of bounds, unknown regions and nodes.
#[test]
fn direct_peer_operations_need_no_progress_and_validate_accesses() {
    let t = Transport::Shm;
    let a = UcxNode::new(0, &[64], &direct_config(t)).unwrap();
    let b = UcxNode::new(1, &[4096, 256], &direct_config(t)).unwrap();
    let mut ep = a.endpoint(&[a.info().clone(), b.info().clone()]).unwrap();
    assert!(ep.maps_memory_of(1));
    b.pause_progress();
    let w = RemoteAddr::new(1, 0, 0);
    assert_eq!(ep.compare_and_swap(w, 0, 7).unwrap(), 0);
    assert_eq!(
        ep.compare_and_swap(w, 0, 9).unwrap(),
        7,
        "a failed CAS leaves the word"
    );
    ep.write(RemoteAddr::new(1, 0, 8), &[3u8; 16]).unwrap();
    ep.write(RemoteAddr::new(1, 1, 248), &[5u8; 8]).unwrap();
    let mut back = [0u8; 24];
    ep.read(w, &mut back).unwrap();
    assert_eq!(back[..8], 7u64.to_le_bytes());
    assert_eq!(back[8..], [3u8; 16]);
    // The target sees them in its own memory.
    let mut own = [0u8; 8];
    b.region(1).unwrap().read(248, &mut own).unwrap();
    assert_eq!(own, [5u8; 8]);
    assert!(matches!(
        ep.read(RemoteAddr::new(1, 0, 4), &mut [0u8; 8]),
        Err(FabricError::Misaligned { .. })
    ));
    assert!(matches!(
        ep.write(RemoteAddr::new(1, 0, 0), &[0u8; 12]),
        Err(FabricError::Misaligned { len: 12, .. })
    ));
    assert!(matches!(
        ep.read(RemoteAddr::new(1, 0, 4088), &mut [0u8; 16]),
        Err(FabricError::OutOfBounds {
            node: 1,
            region: 0,
            size: 4096,
            ..
        })
    ));
    assert!(matches!(
        ep.compare_and_swap(RemoteAddr::new(1, 1, 256), 0, 1),
        Err(FabricError::OutOfBounds {
            node: 1,
            region: 1,
            size: 256,
            ..
        })
    ));
    assert!(matches!(
        ep.read(RemoteAddr::new(1, 0, u64::MAX - 7), &mut [0u8; 8]),
        Err(FabricError::OutOfBounds { .. })
    ));
    assert!(matches!(
        ep.compare_and_swap(RemoteAddr::new(1, 5, 0), 0, 1),
        Err(FabricError::UnknownRegion { node: 1, region: 5 })
    ));
    assert!(matches!(
        ep.read(RemoteAddr::new(4, 0, 0), &mut [0u8; 8]),
        Err(FabricError::UnknownNode { node: 4, nodes: 2 })
    ));
    // Errors were not counted; the 5 operations that worked were, as remote.
    let s = ep.stats().snapshot();
    assert_eq!(s.remote_ops(), 5);
    b.resume_progress();
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Over tcp a waiting worker sleeps on its event fd after `wait_spin` (the default), and wakes
/// for the answer: operations to another node complete, and one whose target's progress thread
/// is stopped still fails at its deadline, having slept rather than polled through it.
#[test]
fn tcp_waits_sleep_until_the_answer_or_the_deadline() {
    assert_eq!(
        UcxConfig::new(Transport::Tcp).wait_spin,
        Some(nessie_fabric_ucx::TCP_WAIT_SPIN)
    );
    assert_eq!(UcxConfig::new(Transport::Shm).wait_spin, None);
    for spin in [Duration::ZERO, nessie_fabric_ucx::TCP_WAIT_SPIN] {
        let mut cfg = direct_config(Transport::Tcp);
        cfg.wait_spin = Some(spin);
        cfg.op_timeout = Duration::from_millis(400);
        let a = UcxNode::new(0, &[64], &cfg).unwrap();
        let b = UcxNode::new(1, &[4096], &cfg).unwrap();
        let cluster = [a.info().clone(), b.info().clone()];
        let mut ep = a.endpoint(&cluster).unwrap();
        let w = RemoteAddr::new(1, 0, 8);
        increment(&mut ep, w, 200);
        assert_eq!(ep.read_u64(w).unwrap(), 200, "{spin:?}");
        let data = vec![7u8; 4096];
        ep.write(RemoteAddr::new(1, 0, 0), &data).unwrap();
        let mut back = vec![0u8; 4096];
        ep.read(RemoteAddr::new(1, 0, 0), &mut back).unwrap();
        assert!(back == data);

        b.pause_progress();
        let (t, cpu) = (Instant::now(), thread_cpu_ns());
        let r = ep.read_u64(w);
        let (waited, spent) = (t.elapsed(), thread_cpu_ns() - cpu);
        assert!(
            matches!(r, Err(FabricError::Unreachable { node: 1, .. })),
            "{r:?}"
        );
        assert!(waited >= Duration::from_millis(400), "{waited:?}");
        // Polling would have spent the whole 400 ms on the CPU.
        assert!(
            spent < waited.as_nanos() as u64 / 4,
            "{spin:?}: {spent} ns of CPU in a {waited:?} wait"
        );
        b.resume_progress();
    }
}

struct PassAll;
impl nessie_fabric::interpose::Interposer for PassAll {
    fn before(&mut self, _: nessie_fabric::interpose::Op) -> Result<(), FabricError> {
        Ok(())
    }
}

/// Over shm a READ of another node is a copy this process makes (clients then leave their
/// DTE cache off); over tcp it is not. Every endpoint wrapper passes the answer on.
#[test]
fn shm_reads_are_local_copies_through_every_wrapper() {
    use nessie_fabric::delay::{DelayInjection, Delayed, MaybeDelayed};
    use nessie_fabric::interpose::Interposed;
    for (t, copies) in [(Transport::Shm, true), (Transport::Tcp, false)] {
        let node = UcxNode::new(0, &[64], &config(t)).unwrap();
        let ep = node.endpoint(&[node.info().clone()]).unwrap();
        assert_eq!(ep.reads_are_local_copies(), copies, "{t}");
        let delays = DelayInjection {
            seed: 1,
            probability: 0.0,
            max_delay_ns: 0,
        };
        let ep = MaybeDelayed::new(Delayed::new(ep, delays.clone(), 0), None, 0);
        let ep = MaybeDelayed::new(Interposed::new(ep, PassAll), Some(delays), 1);
        assert_eq!(ep.reads_are_local_copies(), copies, "{t} wrapped");
    }
}

/// Batches meet their semantics (`nessie_fabric::batch::check_semantics`: every operation
/// attempted, an error reported for its operation only, overlapping operations in batch order)
/// over shm and tcp, with every operation through UCX (`ucp_*_nbx` posted together) and with
/// the default direct paths (own memory, mapped peers), on a batch that mixes two nodes.
#[test]
fn batches_meet_their_semantics_over_shm_and_tcp() {
    for t in [Transport::Shm, Transport::Tcp] {
        for (cfg, how) in [(config(t), "through UCX"), (direct_config(t), "direct")] {
            let a = UcxNode::new(0, &[256, 64], &cfg).unwrap();
            let b = UcxNode::new(1, &[256, 64], &cfg).unwrap();
            let cluster = [a.info().clone(), b.info().clone()];
            let mut ep = a.endpoint(&cluster).unwrap();
            nessie_fabric::batch::check_semantics(&mut ep, &[0, 1], 0, 256);
            nessie_fabric::batch::check_semantics(&mut ep, &[1, 0], 0, 256);
            // What another endpoint reads afterwards: the batches' effects are complete.
            let mut other = b.endpoint(&cluster).unwrap();
            assert_eq!(
                other.read_u64(RemoteAddr::new(0, 0, 128)).unwrap(),
                u64::from_le_bytes([0x33; 8]),
                "{t} {how}"
            );
            assert!(
                !ep.overlaps_batches(0),
                "{t} {how}: speculative READs do not pay over shm or tcp"
            );
        }
    }
}

/// An operation of a batch to a peer that is gone fails alone (that peer is unreachable),
/// the others complete.
#[test]
fn a_batch_survives_an_unreachable_peer() {
    let a = UcxNode::new(0, &[64], &config(Transport::Shm)).unwrap();
    let b = UcxNode::new(1, &[64], &config(Transport::Tcp)).unwrap();
    let mut ep = a.endpoint(&[a.info().clone(), b.info().clone()]).unwrap();
    let mut x = [0u8; 8];
    let mut batch = nessie_fabric::Batch::new();
    let w = batch.write(RemoteAddr::new(0, 0, 8), &[5; 8]);
    let gone = batch.read(RemoteAddr::new(1, 0, 0), &mut x);
    let c = batch.cas(RemoteAddr::new(0, 0, 16), 0, 9);
    ep.run_batch(&mut batch);
    assert_eq!(batch.result(w), Ok(0));
    assert!(matches!(
        batch.result(gone),
        Err(FabricError::Unreachable { node: 1, .. })
    ));
    assert_eq!(batch.result(c), Ok(0));
    assert_eq!(ep.read_u64(RemoteAddr::new(0, 0, 16)).unwrap(), 9);
}

/// Wait for posted operations of `ep` until `want` tokens are reported; their results by token.
fn poll_until(
    ep: &mut impl nessie_fabric::Post,
    want: usize,
) -> std::collections::BTreeMap<u64, Result<u64, FabricError>> {
    let mut got = std::collections::BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < want {
        ep.poll_posted(&mut |t, r| {
            assert!(got.insert(t, r).is_none(), "token {t} reported twice");
        });
        assert!(
            Instant::now() < deadline,
            "posted operations never completed: {got:?}"
        );
    }
    got
}

/// Posted operations through UCX (`Post`): many in flight at once on one endpoint, each
/// reported once with its own result — READs filled, WRITEs remotely complete (another
/// endpoint reads them), a CAS's value found — over shm and tcp, through UCX and direct.
#[test]
fn posted_operations_complete_in_flight_together_over_shm_and_tcp() {
    use nessie_fabric::{BatchOp, Post};
    for t in [Transport::Shm, Transport::Tcp] {
        for (cfg, how) in [(config(t), "through UCX"), (direct_config(t), "direct")] {
            let a = UcxNode::new(0, &[1024], &cfg).unwrap();
            let b = UcxNode::new(1, &[1024], &cfg).unwrap();
            let cluster = [a.info().clone(), b.info().clone()];
            let mut ep = a.endpoint(&cluster).unwrap();
            let mut other = b.endpoint(&cluster).unwrap();
            // 32 WRITEs of 8 words to both nodes, all posted before any is waited for.
            let data: Vec<[u8; 8]> = (0..32u64).map(|i| (i * 3 + 1).to_le_bytes()).collect();
            let mut in_flight = 0;
            for (i, d) in data.iter().enumerate() {
                let addr = RemoteAddr::new((i % 2) as u16, 0, 8 * i as u64);
                // SAFETY: `data` outlives every poll below.
                match unsafe { ep.post(&mut BatchOp::Write { addr, buf: d }, i as u64) } {
                    Some(r) => assert_eq!(r, Ok(0), "{t} {how}"),
                    None => in_flight += 1,
                }
            }
            assert_eq!(ep.posted_in_flight(), in_flight, "{t} {how}");
            let got = poll_until(&mut ep, in_flight);
            assert!(got.values().all(|r| *r == Ok(0)), "{t} {how}: {got:?}");
            assert_eq!(ep.posted_in_flight(), 0);
            for (i, d) in data.iter().enumerate() {
                let addr = RemoteAddr::new((i % 2) as u16, 0, 8 * i as u64);
                assert_eq!(
                    other.read_u64(addr).unwrap(),
                    u64::from_le_bytes(*d),
                    "{t} {how} word {i}"
                );
            }
            // READs and CASes in flight together.
            let mut bufs = [[0u8; 8]; 16];
            let mut done = std::collections::BTreeMap::new();
            let mut posted = 0;
            for (i, buf) in bufs.iter_mut().enumerate() {
                let addr = RemoteAddr::new((i % 2) as u16, 0, 8 * i as u64);
                // SAFETY: `bufs` is not touched until every READ is reported.
                match unsafe { ep.post(&mut BatchOp::Read { addr, buf }, i as u64) } {
                    Some(r) => {
                        done.insert(i as u64, r);
                    }
                    None => posted += 1,
                }
            }
            for i in 16..32u64 {
                let addr = RemoteAddr::new((i % 2) as u16, 0, 8 * i);
                let cas = BatchOp::Cas {
                    addr,
                    expected: i * 3 + 1,
                    desired: 1000 + i,
                };
                match unsafe { ep.post(&mut { cas }, i) } {
                    Some(r) => {
                        done.insert(i, r);
                    }
                    None => posted += 1,
                }
            }
            done.extend(poll_until(&mut ep, posted));
            for i in 0..16 {
                assert_eq!(done[&i], Ok(0), "{t} {how}");
                assert_eq!(bufs[i as usize], data[i as usize], "{t} {how} READ {i}");
            }
            for i in 16..32u64 {
                assert_eq!(
                    done[&i],
                    Ok(i * 3 + 1),
                    "{t} {how} CAS {i} finds the old value"
                );
                let addr = RemoteAddr::new((i % 2) as u16, 0, 8 * i);
                assert_eq!(other.read_u64(addr).unwrap(), 1000 + i, "{t} {how}");
            }
        }
    }
}

/// A posted operation to a peer that is gone is reported failed (unreachable); the others
/// complete; a bad address is refused at once.
#[test]
fn posted_operations_survive_an_unreachable_peer() {
    use nessie_fabric::{BatchOp, Post};
    let a = UcxNode::new(0, &[64], &config(Transport::Shm)).unwrap();
    let b = UcxNode::new(1, &[64], &config(Transport::Tcp)).unwrap();
    let mut ep = a.endpoint(&[a.info().clone(), b.info().clone()]).unwrap();
    let mut x = [0u8; 8];
    let mut results = std::collections::BTreeMap::new();
    let mut posted = 0;
    let mut gone = BatchOp::Read {
        addr: RemoteAddr::new(1, 0, 0),
        buf: &mut x,
    };
    let mut w = BatchOp::Write {
        addr: RemoteAddr::new(0, 0, 8),
        buf: &[5; 8],
    };
    let mut oob = BatchOp::Cas {
        addr: RemoteAddr::new(0, 0, 64),
        expected: 0,
        desired: 1,
    };
    for (t, op) in [(1u64, &mut gone), (2, &mut w), (3, &mut oob)] {
        // SAFETY: every buffer outlives the polls below.
        match unsafe { ep.post(op, t) } {
            Some(r) => {
                results.insert(t, r);
            }
            None => posted += 1,
        }
    }
    results.extend(poll_until(&mut ep, posted));
    assert!(
        matches!(results[&1], Err(FabricError::Unreachable { node: 1, .. })),
        "{results:?}"
    );
    assert_eq!(results[&2], Ok(0));
    assert!(
        matches!(results[&3], Err(FabricError::OutOfBounds { .. })),
        "{results:?}"
    );
    assert_eq!(
        ep.read_u64(RemoteAddr::new(0, 0, 8)).unwrap(),
        u64::from_le_bytes([5; 8])
    );
}
