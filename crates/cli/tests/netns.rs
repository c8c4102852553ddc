//! Three "hosts": node processes in three network namespaces joined by veth pairs to a bridge
//! (in a fourth namespace), all created by this test, talking UCX over TCP. Then one node is
//! killed: operations touching it fail with "unreachable" within a bounded time, the others keep
//! working, and nothing returns a wrong value. Needs root and iproute2 (CI has both); the
//! namespaces and processes are removed even when the test fails.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nessie_cluster::config::{ClusterConfig, Transport};
use nessie_cluster::node::AdminKvClient;
use nessie_protocols::KvClient;
use nessie_store::Geometry;

const BIN: &str = env!("CARGO_BIN_EXE_nessie");
const OP_TIMEOUT_MS: u64 = 2_000;

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("iproute2 `ip` is needed (apt-get install iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {} (this test needs root)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespaces, the node processes and their directory; all removed on drop.
struct Testbed {
    tag: String,
    nodes: Vec<String>,
    switch: String,
    children: Vec<Option<Child>>,
    dir: PathBuf,
}

impl Testbed {
    fn new() -> Testbed {
        let tag = format!("{}", std::process::id() % 100_000);
        let dir = std::env::temp_dir().join(format!("nessie-netns-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut t = Testbed {
            switch: format!("nsw{tag}"),
            nodes: vec![],
            children: vec![],
            dir,
            tag,
        };
        ip(&["netns", "add", &t.switch]);
        ip(&["-n", &t.switch, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &t.switch, "link", "set", "br0", "up"]);
        for k in 0..3 {
            let ns = format!("nn{k}x{}", t.tag);
            ip(&["netns", "add", &ns]);
            t.nodes.push(ns.clone());
            // Create the pair inside the switch namespace, then move one end to the node.
            let (a, b) = (format!("h{k}"), format!("s{k}"));
            ip(&[
                "-n", &t.switch, "link", "add", &a, "type", "veth", "peer", "name", &b,
            ]);
            ip(&["-n", &t.switch, "link", "set", &a, "netns", &ns]);
            ip(&["-n", &ns, "link", "set", &a, "name", "nveth"]);
            ip(&["-n", &t.switch, "link", "set", &b, "master", "br0"]);
            ip(&["-n", &t.switch, "link", "set", &b, "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", t.addr(k)),
                "dev",
                "nveth",
            ]);
            ip(&["-n", &ns, "link", "set", "nveth", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        t
    }

    fn addr(&self, k: usize) -> String {
        format!("10.213.77.{}", k + 1)
    }

    fn config(&self) -> PathBuf {
        let mut cfg = ClusterConfig::local(
            "netns",
            3,
            Transport::Tcp,
            7400,
            Geometry {
                ites_per_node: 4096,
                dtes_per_node: 4096,
                key_max: 32,
                value_max: 256,
                ..Geometry::default()
            },
        );
        for (k, n) in cfg.node.iter_mut().enumerate() {
            n.bootstrap = SocketAddr::new(self.addr(k).parse().unwrap(), 7400);
        }
        cfg.cluster.net_devices = Some("nveth".into());
        cfg.cluster.op_timeout_ms = OP_TIMEOUT_MS;
        cfg.cluster.bootstrap_timeout_ms = 30_000;
        cfg.validate().unwrap();
        let p = self.dir.join("cluster.toml");
        cfg.save(&p).unwrap();
        p
    }

    fn start(&mut self, cfg: &PathBuf) {
        for k in 0..3 {
            let log = std::fs::File::create(self.dir.join(format!("node-{k}.log"))).unwrap();
            let child = Command::new("ip")
                .args(["netns", "exec", &self.nodes[k], BIN, "node", "--config"])
                .arg(cfg)
                .args(["--id", &k.to_string()])
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            self.children.push(Some(child));
        }
    }

    fn client(&self, cfg: &ClusterConfig, k: u16) -> AdminKvClient {
        AdminKvClient::connect(
            &cfg.admin_path(k, &self.dir).unwrap(),
            Duration::from_secs(30),
        )
        .unwrap()
    }

    fn wait_ready(&mut self, cfg: &ClusterConfig) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for k in 0..3u16 {
            loop {
                let path = cfg.admin_path(k, &self.dir).unwrap();
                if AdminKvClient::connect(&path, Duration::from_secs(5)).is_ok() {
                    break;
                }
                let exited = self.children[k as usize]
                    .as_mut()
                    .unwrap()
                    .try_wait()
                    .unwrap();
                assert!(
                    exited.is_none() && Instant::now() < deadline,
                    "node {k} did not start:\n{}",
                    self.log(k)
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn log(&self, k: u16) -> String {
        std::fs::read_to_string(self.dir.join(format!("node-{k}.log"))).unwrap_or_default()
    }

    fn kill(&mut self, k: usize) {
        if let Some(mut c) = self.children[k].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for k in 0..self.children.len() {
            self.kill(k);
        }
        for ns in self.nodes.iter().chain(std::iter::once(&self.switch)) {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn three_hosts_over_tcp_and_a_node_failure() {
    let mut tb = Testbed::new();
    let cfg_path = tb.config();
    let cfg = ClusterConfig::load(&cfg_path).unwrap();
    tb.start(&cfg_path);
    tb.wait_ready(&cfg);

    let mut clients: Vec<AdminKvClient> = (0..3).map(|k| tb.client(&cfg, k)).collect();
    let value = |i: u32| format!("value-{i}-{}", "x".repeat((i % 200) as usize)).into_bytes();
    for i in 0..60u32 {
        clients[(i % 3) as usize]
            .put(format!("key-{i}").as_bytes(), &value(i))
            .unwrap();
    }
    for i in 0..60u32 {
        let got = clients[((i + 1) % 3) as usize]
            .get(format!("key-{i}").as_bytes())
            .unwrap();
        assert_eq!(got, Some(value(i)), "key-{i} read across hosts");
    }

    tb.kill(2);
    let (mut ok, mut unreachable) = (0, 0);
    for i in 0..60u32 {
        let t = Instant::now();
        let r = clients[0].get(format!("key-{i}").as_bytes());
        let took = t.elapsed();
        assert!(
            took < Duration::from_millis(OP_TIMEOUT_MS + 3_000),
            "key-{i}: took {took:?}"
        );
        match r {
            Ok(v) => {
                assert_eq!(
                    v,
                    Some(value(i)),
                    "key-{i}: a wrong answer after node 2 died"
                );
                ok += 1;
            }
            Err(e) => {
                assert!(
                    e.to_string().contains("unreachable"),
                    "key-{i}: unexpected error {e}"
                );
                unreachable += 1;
            }
        }
    }
    assert!(ok > 0, "keys living on nodes 0 and 1 must stay readable");
    assert!(
        unreachable > 0,
        "keys touching node 2 must report it unreachable"
    );

    let mut written = vec![];
    for i in 100..130u32 {
        let key = format!("key-{i}");
        match clients[0].put(key.as_bytes(), &value(i)) {
            Ok(()) => written.push(i),
            Err(e) => assert!(e.to_string().contains("unreachable"), "put {key}: {e}"),
        }
    }
    assert!(!written.is_empty(), "writes avoiding node 2 succeed");
    for i in written {
        match clients[1].get(format!("key-{i}").as_bytes()) {
            Ok(v) => assert_eq!(v, Some(value(i))),
            Err(e) => assert!(e.to_string().contains("unreachable"), "{e}"),
        }
    }
    for k in 0..2 {
        assert!(
            tb.children[k]
                .as_mut()
                .unwrap()
                .try_wait()
                .unwrap()
                .is_none(),
            "node {k} survived:\n{}",
            tb.log(k as u16)
        );
    }
    eprintln!("after killing node 2: {ok} reads ok, {unreachable} unreachable");
}
