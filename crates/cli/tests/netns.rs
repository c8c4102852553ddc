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

/// One namespace with a public-looking interface (`pub0`, 203.0.113.7, documentation space:
/// neither loopback nor private) and a private one (`priv0`, 10.77.0.1); removed on drop.
struct ExposureBed {
    ns: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl ExposureBed {
    fn new() -> ExposureBed {
        let tag = format!("pm{}", std::process::id() % 100_000);
        let dir = std::env::temp_dir().join(format!("nessie-netns-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let bed = ExposureBed {
            ns: format!("nx{tag}"),
            dir,
            child: None,
        };
        ip(&["netns", "add", &bed.ns]);
        ip(&["-n", &bed.ns, "link", "set", "lo", "up"]);
        for (dev, addr) in [("pub0", "203.0.113.7/24"), ("priv0", "10.77.0.1/24")] {
            let peer = format!("{dev}p");
            ip(&[
                "-n", &bed.ns, "link", "add", dev, "type", "veth", "peer", "name", &peer,
            ]);
            ip(&["-n", &bed.ns, "addr", "add", addr, "dev", dev]);
            ip(&["-n", &bed.ns, "link", "set", dev, "up"]);
            ip(&["-n", &bed.ns, "link", "set", &peer, "up"]);
        }
        bed
    }

    /// A one-node tcp cluster bootstrapping on `bootstrap`, its Redis front end on `bind`.
    fn config(
        &self,
        bootstrap: &str,
        net_devices: Option<&str>,
        bind: &str,
        protected: bool,
    ) -> PathBuf {
        let mut cfg = ClusterConfig::local(
            "exposure",
            1,
            Transport::Tcp,
            7400,
            Geometry {
                ites_per_node: 4096,
                dtes_per_node: 1024,
                key_max: 32,
                value_max: 256,
                ..Geometry::default()
            },
        );
        cfg.node[0].bootstrap = bootstrap.parse().unwrap();
        cfg.cluster.net_devices = net_devices.map(str::to_string);
        cfg.cluster.protected_mode = protected;
        cfg.frontends = Some(nessie_cluster::config::FrontendsSection {
            memcached_port: None,
            resp_port: Some(16_379),
            resp_password: None,
            metrics_port: None,
            bind: bind.into(),
            max_connections: 16,
            threads: 1,
            inflight: 1,
        });
        cfg.validate().unwrap();
        let p = self.dir.join("cluster.toml");
        cfg.save(&p).unwrap();
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("node-0.log")).unwrap_or_default()
    }

    /// Start node 0 in the namespace; wait until it is ready or has exited (its exit status).
    fn start(&mut self, cfg: &PathBuf) -> Option<std::process::ExitStatus> {
        self.stop();
        let log = std::fs::File::create(self.dir.join("node-0.log")).unwrap();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns, BIN, "node", "--config"])
            .arg(cfg)
            .args(["--id", "0"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            if self.log().contains("ready (") {
                self.child = Some(child);
                return None;
            }
            assert!(
                Instant::now() < deadline,
                "node 0 neither started nor exited:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the Redis front end at `addr` answers PING with, asked from inside the namespace.
    fn ping(&self, addr: &str) -> String {
        let script =
            format!("exec 3<>/dev/tcp/{addr}/16379 && printf 'PING\\r\\n' >&3 && head -c 7 <&3");
        let out = Command::new("ip")
            .args([
                "netns", "exec", &self.ns, "timeout", "5", "bash", "-c", &script,
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ExposureBed {
    fn drop(&mut self) {
        self.stop();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Protected mode (TB1): a node refuses, before it listens on anything, a bootstrap address,
/// a fabric interface or a front-end address outside the private network, naming which; it
/// serves on private ones; `protected_mode = false` lets it serve on a public one.
#[test]
fn protected_mode_refuses_public_addresses_in_a_namespace() {
    let mut bed = ExposureBed::new();
    let refusals = [
        (
            ("203.0.113.7:7400", Some("priv0"), "10.77.0.1", true),
            "would expose its bootstrap server on 203.0.113.7",
        ),
        (
            ("10.77.0.1:7400", None, "10.77.0.1", true),
            "would expose its fabric (UCX over interface pub0) on 203.0.113.7",
        ),
        (
            ("10.77.0.1:7400", Some("priv0"), "0.0.0.0", true),
            "would expose its Redis front end on 0.0.0.0",
        ),
        (
            ("10.77.0.1:7400", Some("priv0"), "203.0.113.7", true),
            "would expose its Redis front end on 203.0.113.7",
        ),
    ];
    for ((bootstrap, devices, bind, protected), why) in refusals {
        let cfg = bed.config(bootstrap, devices, bind, protected);
        let status = bed.start(&cfg);
        let log = bed.log();
        assert!(
            status.is_some_and(|s| !s.success()),
            "the node started despite {why}:\n{log}"
        );
        assert!(log.contains(why), "expected {why:?} in:\n{log}");
        assert!(!log.contains("ready ("), "{log}");
    }

    let cfg = bed.config("10.77.0.1:7400", Some("priv0"), "10.77.0.1", true);
    assert_eq!(
        bed.start(&cfg),
        None,
        "refused on private addresses:\n{}",
        bed.log()
    );
    assert_eq!(bed.ping("10.77.0.1"), "+PONG\r\n", "{}", bed.log());

    let cfg = bed.config("10.77.0.1:7400", Some("priv0"), "203.0.113.7", false);
    assert_eq!(
        bed.start(&cfg),
        None,
        "protected_mode = false refused:\n{}",
        bed.log()
    );
    assert_eq!(bed.ping("203.0.113.7"), "+PONG\r\n", "{}", bed.log());
}
