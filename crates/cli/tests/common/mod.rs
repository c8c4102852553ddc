//! What the process tests share: the binary, and a local cluster started with `nessie up` that
//! is stopped (`nessie down`) and removed on drop, even when the test fails.
#![allow(dead_code)] // each test binary uses its own part

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use nessie_cluster::process;

pub const BIN: &str = env!("CARGO_BIN_EXE_nessie");

/// A cluster directory under the system temp dir, unique to this test process.
pub struct Cluster {
    pub dir: PathBuf,
}

impl Cluster {
    /// Reserve the directory `nessie-test-NAME-PID` (empty) without starting anything.
    pub fn at(name: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("nessie-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Cluster { dir }
    }

    /// `nessie up --nodes N --transport T --dir DIR EXTRA…`; panics with its stderr on failure.
    pub fn up(name: &str, nodes: u16, transport: &str, extra: &[&str]) -> Cluster {
        Self::up_with_env(name, nodes, transport, extra, &[])
    }

    /// [`Cluster::up`] with `env` set for `up` and the node processes it starts.
    pub fn up_with_env(
        name: &str,
        nodes: u16,
        transport: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Cluster {
        let c = Cluster::at(name);
        let out = Command::new(BIN)
            .envs(env.iter().copied())
            .args([
                "up",
                "--nodes",
                &nodes.to_string(),
                "--transport",
                transport,
            ])
            .arg("--dir")
            .arg(&c.dir)
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "nessie up failed: {}", stderr(&out));
        c
    }

    /// Run `nessie ARGS --dir DIR`.
    pub fn nessie(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .unwrap()
    }
}

/// Lines of each log kept when a test fails (after repeats are folded).
const LOG_TAIL_LINES: usize = 40;

impl Cluster {
    /// Print which node processes are alive and the last lines of every log in the cluster
    /// directory: all a failed run on CI leaves to read. CI keeps only part of a failure's
    /// output, so the logs of node processes that are gone come first, etcd's last, and a
    /// line that repeats the one before it but for its timestamp is folded into a count.
    pub fn dump_logs(&self) {
        let alive: Vec<String> = (0..process::MAX_LOCAL_NODES)
            .filter_map(|id| process::live_pid(&self.dir, id).map(|pid| format!("{id}:{pid}")))
            .collect();
        eprintln!("live nodes (id:pid): {alive:?}");
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut logs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .collect();
        // Sort key: dead nodes' logs, then the other nodes', then the rest (etcd).
        let rank = |p: &PathBuf| {
            let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            let id = name
                .rsplit('-')
                .next()
                .and_then(|n| n.parse::<u16>().ok())
                .filter(|_| name.starts_with("node-") || name.starts_with("restarted-"));
            match id {
                Some(id) if process::live_pid(&self.dir, id).is_none() => 0,
                Some(_) => 1,
                None => 2,
            }
        };
        logs.sort_by_key(|p| (rank(p), p.clone()));
        for p in logs {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let folded = fold_repeats(&text);
            let tail = &folded[folded.len().saturating_sub(LOG_TAIL_LINES)..];
            eprintln!(
                "---- {} (last {} lines, repeats folded) ----",
                p.display(),
                tail.len()
            );
            for l in tail {
                eprintln!("{l}");
            }
        }
    }
}

/// The last `n` lines of node `id`'s log in `dir`, repeats folded ([`fold_repeats`]).
pub fn log_tail(dir: &std::path::Path, id: u16, n: usize) -> String {
    let text = std::fs::read_to_string(dir.join(format!("node-{id}.log"))).unwrap_or_default();
    let folded = fold_repeats(&text);
    folded[folded.len().saturating_sub(n)..].join("\n")
}

/// `text`'s lines, each run of lines that differ only in a leading timestamp (the first
/// whitespace-separated word) kept once, followed by how many more there were.
pub fn fold_repeats(text: &str) -> Vec<String> {
    let body = |l: &str| l.split_once(' ').map_or(l, |(_, rest)| rest).to_string();
    let mut out: Vec<String> = Vec::new();
    let (mut last, mut repeats) = (None::<String>, 0usize);
    for l in text.lines() {
        let b = body(l);
        if last.as_deref() == Some(b.as_str()) {
            repeats += 1;
            continue;
        }
        if repeats > 0 {
            out.push(format!("  [... the line above {repeats} more times]"));
        }
        repeats = 0;
        out.push(l.to_string());
        last = Some(b);
    }
    if repeats > 0 {
        out.push(format!("  [... the line above {repeats} more times]"));
    }
    out
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        for id in 0..process::MAX_LOCAL_NODES {
            if let Some(pid) = process::live_pid(&self.dir, id) {
                // A stopped node would act on `down`'s SIGTERM only once resumed.
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
        }
        let _ = self.nessie(&["down"]);
        if std::env::var_os("NESSIE_TEST_KEEP").is_some() {
            eprintln!("NESSIE_TEST_KEEP: kept {}", self.dir.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `nessie get --node NODE KEY`: `Some(value)`, `None` if not found; panics on any other
/// failure.
pub fn get(c: &Cluster, node: u16, key: &str) -> Option<String> {
    let out = c.nessie(&["get", "--node", &node.to_string(), key]);
    match out.status.code() {
        Some(0) => Some(String::from_utf8(out.stdout).unwrap()),
        Some(1) if stderr(&out).contains("not found") => None,
        _ => panic!("get {key} through node {node}: {}", stderr(&out)),
    }
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `nessie node --config … --id ID`, as an operator restarts a node; killed on drop.
pub struct Restarted(pub Child);

impl Drop for Restarted {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start node `id` of `c` again, by hand, logging to `restarted-ID.log` in its directory.
pub fn restart(c: &Cluster, id: u16) -> Restarted {
    let log = std::fs::File::create(c.dir.join(format!("restarted-{id}.log"))).unwrap();
    Restarted(
        Command::new(BIN)
            .args(["node", "--id", &id.to_string(), "--config"])
            .arg(process::config_path(&c.dir))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// A base port with `n` free loopback ports from it (node K listens on base + K), never one
/// this process handed out before: the ports are free when checked but not held, so two
/// ranges drawn at once (by one test for several front ends, or by tests running side by
/// side) could otherwise overlap, and a node would fail to bind ("Address already in use").
pub fn free_port_range(n: u16) -> u16 {
    static HANDED: std::sync::Mutex<Vec<std::ops::Range<u16>>> = std::sync::Mutex::new(Vec::new());
    let mut handed = HANDED.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..200 {
        // Below 10000: neither bind(0) (the ephemeral range, 32768.. by default; a host whose
        // range starts lower is not one these tests run on) nor the bootstrap and etcd ports
        // `nessie up` draws (`process::free_ports`, 10000..) land here, so a node's own ports
        // cannot take a range handed out for its front ends.
        let base: u16 = 2_000 + rand_u16() % 7_900;
        let range = base..base + n;
        if handed
            .iter()
            .any(|r| r.start < range.end && range.start < r.end)
        {
            continue;
        }
        let held: Vec<_> = range
            .clone()
            .map_while(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
            .collect();
        if held.len() == n as usize {
            handed.push(range);
            return base;
        }
    }
    panic!("no {n} consecutive free loopback ports");
}

fn rand_u16() -> u16 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    (t.subsec_nanos() ^ std::process::id().wrapping_mul(2_654_435_761)) as u16
}

/// A reference server (memcached, redis-server) started by a test, stopped when dropped, also
/// when the test fails.
pub struct Peer(std::process::Child);

impl Peer {
    /// A `redis-server` on a free loopback port, without persistence: it and its port.
    pub fn redis_server() -> (Peer, u16) {
        let port = free_port_range(1);
        let mut rs = Command::new("redis-server");
        rs.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--logfile", "/dev/null"]);
        (
            Peer::start(&mut rs, port, "redis-server (Debian redis-server)"),
            port,
        )
    }

    /// A `memcached` on a free loopback port (TCP only, its output discarded: `verbosity`
    /// makes it log every command): it and its port.
    pub fn memcached() -> (Peer, u16) {
        let port = free_port_range(1);
        let mut mc = Command::new("memcached");
        mc.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"]);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            mc.args(["-u", "root"]);
        }
        mc.stdout(Stdio::null()).stderr(Stdio::null());
        (
            Peer::start(&mut mc, port, "memcached (Debian memcached)"),
            port,
        )
    }

    /// Start `cmd` and wait until it accepts connections on loopback `port`.
    pub fn start(cmd: &mut Command, port: u16, what: &str) -> Peer {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{what} runs (scripts/setup.sh installs it): {e}"));
        let peer = Peer(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "{what} did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        peer
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The nodes of `nessie status --json` (its `nodes` array), or what is wrong with the output.
pub fn status_nodes(out: &Output) -> Result<Vec<serde_json::Value>, String> {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("status --json: {e}: {}", stderr(out)))?;
    v["nodes"]
        .as_array()
        .cloned()
        .ok_or_else(|| format!("status --json has no nodes: {v}"))
}
