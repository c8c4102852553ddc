//! The fill test's loader against an in-process Nessie cluster and a real memcached.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nessie_bench::fill::{fill, FillSpec, RoundRobin};
use nessie_bench::memcached::MemcachedConn;
use nessie_cluster::LocalCluster;
use nessie_protocols::ProtocolConfig;
use nessie_store::classtable::RESERVE_PAGES;

fn spec() -> FillSpec {
    FillSpec {
        key_size: 32,
        value_sizes: (64, 4096),
        max_items: u64::MAX,
    }
}

#[test]
fn nessie_fills_every_node_until_its_tables_are_full() {
    let g = nessie_store::Geometry::for_memory(2, 4 << 20, 32, 4096, 0.5).unwrap();
    let classes = g.classes().unwrap();
    let data_bytes = g.data_table_bytes() * 2;
    let value_bytes = (g.data_pages_per_node() - RESERVE_PAGES) * classes.page_bytes() * 2;
    let c = LocalCluster::new(g, ProtocolConfig::default(), None).unwrap();
    let clients = (0..2).map(|n| c.client(n).unwrap()).collect();
    let out = fill(&mut RoundRobin::new(clients), &spec()).unwrap();
    let why = out
        .refusal
        .clone()
        .expect("the fill ends when the cluster is full");
    assert!(why.contains("full"), "{why}");
    // Size classes: each item takes the entry of its class, and the fill ends when the pages
    // values may use are nearly all taken (each class's last page may be part-used).
    let used: u64 = (0..out.items)
        .map(|i| {
            let v = nessie_bench::fill::spread_value_size(i, 64, 4096);
            classes.entry_size(classes.class_for(32, v).unwrap())
        })
        .sum();
    assert!(
        used <= data_bytes,
        "{used} bytes of entries in {data_bytes}"
    );
    assert!(
        used * 10 >= value_bytes * 8,
        "{} items took only {used} of {value_bytes} bytes",
        out.items
    );
    let mut reader = c.client(1).unwrap();
    let first = reader.get(&nessie_bench::fill::key_bytes(0, 32)).unwrap();
    assert_eq!(
        first.map(|v| v.len() as u32),
        Some(nessie_bench::fill::spread_value_size(0, 64, 4096))
    );
}

/// A memcached on a free loopback port, killed on drop.
struct Memcached {
    child: Child,
    addr: String,
}

impl Memcached {
    fn start(megabytes: u32) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = Command::new("memcached");
        // SAFETY: geteuid only reads this process's credentials.
        if unsafe { libc::geteuid() } == 0 {
            cmd.args(["-u", "root"]); // memcached refuses to run as root without naming a user
        }
        let child = cmd
            .args([
                "-m",
                &megabytes.to_string(),
                "-M",
                "-U",
                "0",
                "-l",
                "127.0.0.1",
            ])
            .args(["-p", &port.to_string(), "-t", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("memcached must be installed (scripts/setup.sh installs it)");
        let addr = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "memcached did not start on {addr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, addr }
    }
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn memcached_fills_until_it_runs_out_of_memory() {
    let m = Memcached::start(8);
    let mut conn = MemcachedConn::connect(&m.addr, Duration::from_secs(10)).unwrap();
    let out = fill(&mut conn, &spec()).unwrap();
    let why = out.refusal.clone().expect("memcached -M refuses when full");
    assert!(why.contains("out of memory"), "{why}");
    assert!(out.items > 100, "{} items", out.items);
    // What was stored is there, byte for byte.
    let key = nessie_bench::fill::key_bytes(1, 32);
    let v = conn.get(&key).unwrap().expect("item 1 is stored");
    assert_eq!(
        v.len() as u32,
        nessie_bench::fill::spread_value_size(1, 64, 4096)
    );
    assert!(v.iter().all(|&b| b == 0x6d));
    assert_eq!(conn.get(b"absent-key").unwrap(), None);
    assert!(
        conn.set(b"bad key", b"x").is_err(),
        "keys with spaces are refused before sending"
    );
}
