//! Node processes refuse to form a cluster with a node whose wall clock is off by more than
//! `clock_margin_ms` (skewed with the test-only `NESSIE_TEST_CLOCK_SKEW_MS`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nessie_cluster::bootstrap::clock::TEST_SKEW_ENV;
use nessie_cluster::config::{ClusterConfig, Transport};

const BIN: &str = env!("CARGO_BIN_EXE_nessie");
/// How long a node may take to notice the skew and exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Kills the node processes and removes the directory, even when the test fails.
struct Nodes {
    dir: PathBuf,
    children: Vec<Child>,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Stderr of a node that exited by itself, with an error, within [`EXIT_TIMEOUT`].
fn exited_stderr(c: &mut Child) -> String {
    let until = Instant::now() + EXIT_TIMEOUT;
    let status = loop {
        if let Some(s) = c.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "node still running");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err).unwrap();
    err
}

#[test]
fn a_node_with_a_skewed_clock_is_refused() {
    let dir = std::env::temp_dir().join(format!("nessie-test-skew-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut nodes = Nodes {
        dir: dir.clone(),
        children: vec![],
    };
    let mut cfg = ClusterConfig::local("skew", 2, Transport::Shm, 0, Default::default());
    let ports = nessie_cluster::process::free_ports(2).unwrap();
    for (n, p) in cfg.node.iter_mut().zip(ports) {
        n.bootstrap.set_port(p);
    }
    cfg.cluster.bootstrap_timeout_ms = 10_000;
    cfg.protocol.clock_margin_ms = 10;
    let path = dir.join("cluster.toml");
    cfg.save(&path).unwrap();
    for (id, skew) in [("0", None), ("1", Some("2000"))] {
        let mut cmd = Command::new(BIN);
        cmd.args(["node", "--config"])
            .arg(&path)
            .args(["--id", id])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(ms) = skew {
            cmd.env(TEST_SKEW_ENV, ms);
        }
        nodes.children.push(cmd.spawn().unwrap());
    }
    // Whichever node notices first exits; the other may then find it gone instead.
    let e0 = exited_stderr(&mut nodes.children[0]);
    let e1 = exited_stderr(&mut nodes.children[1]);
    let margin = "more than protocol.clock_margin_ms = 10";
    assert!(
        (e0.contains("clock of node 1") && e0.contains(margin))
            || (e1.contains("clock of node 0") && e1.contains(margin)),
        "{e0}\n{e1}"
    );
    assert!(!e0.contains("panicked") && !e1.contains("panicked"));
}
