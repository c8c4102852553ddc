//! Bootstrap under hostile or unlucky conditions, on loopback: unauthenticated connections
//! that stay silent, trickle, send junk or oversize frames must not stop a cluster from
//! forming; a peer that answers garbage at first is retried; a node whose clock is off by
//! more than `clock_margin` is refused.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use nessie_cluster::bootstrap::{self, BootstrapError, BootstrapServer, Clock, NodeInfo};
use nessie_cluster::config::{ClusterConfig, Transport};
use nessie_store::Geometry;

/// How long the test clusters may take to form.
const FORM_TIMEOUT_MS: u64 = 8_000;

fn cluster(nodes: u16, margin_ms: u64) -> ClusterConfig {
    let mut cfg = ClusterConfig::local("boot", nodes, Transport::Shm, 0, Geometry::default());
    let ports = nessie_cluster::process::free_ports(nodes).unwrap();
    for (n, p) in cfg.node.iter_mut().zip(ports) {
        n.bootstrap.set_port(p);
    }
    cfg.cluster.bootstrap_timeout_ms = FORM_TIMEOUT_MS;
    cfg.protocol.clock_margin_ms = margin_ms;
    cfg.validate().unwrap();
    cfg
}

fn own(cfg: &ClusterConfig, node: u16) -> NodeInfo {
    NodeInfo {
        node,
        config_fingerprint: cfg.fingerprint(),
        geometry: cfg.geometry.clone(),
        fabric: format!("{node:04x}"),
        pid: std::process::id(),
    }
}

fn addr(cfg: &ClusterConfig, node: u16) -> SocketAddr {
    cfg.node[node as usize].bootstrap
}

fn start(cfg: &ClusterConfig, node: u16, clock: Clock) -> BootstrapServer {
    BootstrapServer::start_with_clock(
        addr(cfg, node),
        cfg.secret_bytes().unwrap(),
        own(cfg, node),
        clock,
    )
    .unwrap()
}

/// Every node's `fetch_all`, run in parallel as the node processes would.
fn form(cfg: &ClusterConfig, clocks: &[Clock]) -> Vec<Result<Vec<NodeInfo>, BootstrapError>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..cfg.node.len() as u16)
            .map(|id| {
                let clock = &clocks[id as usize];
                s.spawn(move || bootstrap::fetch_all_with_clock(cfg, &own(cfg, id), clock))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Unauthenticated connections to `to`: silent ones, a trickling one, junk and oversize frames.
fn hostile_connections(to: SocketAddr) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(to).unwrap()); // silent
    }
    let mut trickle = TcpStream::connect(to).unwrap();
    trickle.write_all(&[60]).unwrap(); // one byte of a length, then nothing
    held.push(trickle);
    let mut oversize = TcpStream::connect(to).unwrap();
    oversize.write_all(&u32::MAX.to_le_bytes()).unwrap();
    held.push(oversize);
    let mut junk = TcpStream::connect(to).unwrap();
    junk.write_all(&40u32.to_le_bytes()).unwrap();
    junk.write_all(&[0xA5; 40]).unwrap();
    held.push(junk);
    held
}

#[test]
fn unauthenticated_connections_do_not_stop_a_cluster_forming() {
    let cfg = cluster(3, 10);
    let clocks = vec![Clock::system(); 3];
    let servers: Vec<_> = (0..3).map(|id| start(&cfg, id, Clock::system())).collect();
    let held: Vec<_> = (0..3)
        .flat_map(|id| hostile_connections(addr(&cfg, id)))
        .collect();
    let t = Instant::now();
    for (id, r) in form(&cfg, &clocks).into_iter().enumerate() {
        let infos = r.unwrap_or_else(|e| panic!("node {id}: {e}"));
        assert_eq!(infos.len(), 3);
        assert!(infos.iter().enumerate().all(|(i, n)| n.node as usize == i));
    }
    assert!(t.elapsed() < Duration::from_millis(FORM_TIMEOUT_MS));
    drop(held);
    drop(servers);
}

/// A peer's port first answers with garbage (say, a previous program still holds it), then
/// the real node takes it over: the fetch retries instead of failing on the first error.
#[test]
fn a_peer_that_answers_garbage_at_first_is_retried() {
    let cfg = cluster(2, 10);
    let squatter = TcpListener::bind(addr(&cfg, 1)).unwrap();
    let garbage = std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_millis(1_000);
        squatter.set_nonblocking(true).unwrap();
        while Instant::now() < until {
            match squatter.accept() {
                Ok((mut s, _)) => {
                    let _ = s.write_all(&3u32.to_le_bytes());
                    let _ = s.write_all(b"no!");
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    let s0 = start(&cfg, 0, Clock::system());
    let fetching = std::thread::spawn({
        let cfg = cfg.clone();
        move || bootstrap::fetch_all_with_clock(&cfg, &own(&cfg, 0), &Clock::system())
    });
    garbage.join().unwrap(); // the squatter's listener is closed now
    let s1 = start(&cfg, 1, Clock::system());
    let infos = fetching
        .join()
        .unwrap()
        .expect("node 0 should have retried");
    assert_eq!(infos[1], own(&cfg, 1));
    drop((s0, s1));
}

#[test]
fn a_node_whose_clock_is_off_is_refused() {
    let cfg = cluster(2, 10);
    // Clocks that are not this host's shared one are measured: 0 ms apart forms...
    let clocks = vec![Clock::skewed(0), Clock::skewed(0)];
    let servers: Vec<_> = (0..2)
        .map(|id| start(&cfg, id, clocks[id as usize].clone()))
        .collect();
    for r in form(&cfg, &clocks) {
        r.expect("clocks 0 ms apart");
    }
    drop(servers);
    // ... 500 ms apart is refused by both, naming the peer, the offset and the margin.
    let clocks = vec![Clock::skewed(0), Clock::skewed(500)];
    let servers: Vec<_> = (0..2)
        .map(|id| start(&cfg, id, clocks[id as usize].clone()))
        .collect();
    let r = form(&cfg, &clocks);
    let e0 = r[0].as_ref().unwrap_err().to_string();
    let e1 = r[1].as_ref().unwrap_err().to_string();
    for (e, peer, skew) in [(&e0, 1, 500.0), (&e1, 0, -500.0)] {
        assert!(e.contains(&format!("clock of node {peer}")), "{e}");
        assert!((offset_ms(e) - skew).abs() < 50.0, "{e}");
        assert!(e.contains("clock_margin_ms = 10"), "{e}");
    }
    drop(servers);
}

/// The offset a clock-skew error reports (`… is +499.988 ms off …`).
fn offset_ms(e: &str) -> f64 {
    let rest = &e[e.find(") is ").expect(e) + 5..];
    rest[..rest.find(" ms").expect(e)].parse().expect(e)
}

/// Nodes reading this host's own clock share it exactly, even with a zero margin.
#[test]
fn one_host_forms_with_a_zero_clock_margin() {
    let cfg = cluster(2, 0);
    let servers: Vec<_> = (0..2).map(|id| start(&cfg, id, Clock::system())).collect();
    for r in form(&cfg, &[Clock::system(), Clock::system()]) {
        r.expect("one host, one clock");
    }
    drop(servers);
}
