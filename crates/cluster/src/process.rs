//! Local clusters of node processes: `nessie up` starts N node processes on this machine in the
//! background (configuration, logs, pid files and admin sockets in one directory), `nessie
//! status` asks each for its state, `nessie down` stops them and cleans up.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nessie_store::Geometry;

use crate::admin::{AdminClient, Request, Response};
use crate::config::{ClusterConfig, Transport};

/// Most nodes `nessie up` starts on one machine.
pub const MAX_LOCAL_NODES: u16 = 64;
pub const CONFIG_FILE: &str = "cluster.toml";

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("I/O on {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("a cluster is already running in {dir} (nodes {running:?}); stop it with `nessie down --dir {dir}`")]
    AlreadyRunning { dir: PathBuf, running: Vec<u16> },
    #[error("no cluster in {0} (no {CONFIG_FILE}); start one with `nessie up`")]
    NoCluster(PathBuf),
    #[error("node {node} failed to start: {reason}\n--- last lines of {log} ---\n{tail}")]
    StartFailed {
        node: u16,
        reason: String,
        log: PathBuf,
        tail: String,
    },
    #[error("{0}")]
    Invalid(String),
}

/// Where a cluster lives when no `--dir` is given: `$NESSIE_DIR`, else a per-user directory.
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("NESSIE_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("nessie"),
        None => std::env::temp_dir().join(format!("nessie-{uid}")),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ProcessError + '_ {
    move |err| ProcessError::Io {
        path: path.to_path_buf(),
        err,
    }
}

pub fn config_path(dir: &Path) -> PathBuf {
    dir.join(CONFIG_FILE)
}

fn pid_path(dir: &Path, id: u16) -> PathBuf {
    dir.join(format!("node-{id}.pid"))
}

pub fn log_path(dir: &Path, id: u16) -> PathBuf {
    dir.join(format!("node-{id}.log"))
}

/// The pid of node `id` if that process is alive and really is that node (not a reused pid).
pub fn live_pid(dir: &Path, id: u16) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pid_path(dir, id))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let cfg = config_path(dir);
    let is_ours = args.iter().any(|a| *a == b"node")
        && args
            .iter()
            .any(|a| Path::new(std::str::from_utf8(a).unwrap_or("")) == cfg);
    is_ours.then_some(pid)
}

#[derive(Clone, Debug)]
pub struct UpOptions {
    pub nodes: u16,
    pub transport: Transport,
    pub geometry: Geometry,
    pub workers: u16,
    /// Protocol expiry period.
    pub expiry_ms: Option<u64>,
    /// Clock-skew margin; by default 10 ms or half the expiry period, whichever is smaller.
    pub clock_margin_ms: Option<u64>,
    /// The `nessie` binary to run nodes with.
    pub binary: PathBuf,
    /// Extra arguments for every `nessie node` (e.g. delay injection in tests).
    pub node_args: Vec<String>,
    /// How long to wait for every node to become ready.
    pub ready_timeout: Duration,
    /// cd | sd | hy
    pub mode: String,
    /// Server threads per node (sd, hy).
    pub server_threads: u16,
    /// Client workers per node in sd/hy (request slots reserved on every node).
    pub max_clients_per_node: u16,
    /// Idle server threads: "spin" or "yield".
    pub server_poll: String,
    /// Huge pages for every node's tables.
    pub huge_pages: nessie_fabric_ucx::HugePages,
}

impl UpOptions {
    /// `nodes` local cd-mode nodes run with `binary`, every other setting at its default.
    pub fn new(binary: PathBuf, nodes: u16, transport: Transport, geometry: Geometry) -> Self {
        Self {
            nodes,
            transport,
            geometry,
            workers: 1,
            expiry_ms: None,
            clock_margin_ms: None,
            binary,
            node_args: vec![],
            ready_timeout: Duration::from_secs(60),
            mode: "cd".into(),
            server_threads: 1,
            max_clients_per_node: 4,
            server_poll: "yield".into(),
            huge_pages: nessie_fabric_ucx::HugePages::Try,
        }
    }
}

/// Attempts `up` makes when a node finds its bootstrap port taken between our probe and its bind.
const MAX_PORT_ATTEMPTS: u32 = 5;

/// The kernel's ephemeral port range (where UCX's TCP listeners and outgoing connections land).
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|x| x.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32768, 60999))
}

/// `n` distinct loopback ports that are free right now. They are chosen at random *outside*
/// the ephemeral range, so the OS does not hand them to another process's `bind(0)` (UCX TCP
/// listeners, other clusters) in the window between this probe and the node's own bind.
pub fn free_ports(n: u16) -> Result<Vec<u16>, ProcessError> {
    let (lo, hi) = ephemeral_range();
    let (a, b) = if lo > 11_000 {
        (10_000, lo - 1)
    } else if hi < 64_000 {
        (hi + 1, u16::MAX)
    } else {
        (0, 0)
    };
    let mut rng = rand::thread_rng();
    let mut held = Vec::new();
    let mut tries = 0u32;
    while held.len() < n as usize && b > a && tries < 1000 {
        tries += 1;
        let port = rand::Rng::gen_range(&mut rng, a..=b);
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
        }
    }
    while held.len() < n as usize {
        held.push(
            std::net::TcpListener::bind("127.0.0.1:0").map_err(|err| ProcessError::Io {
                path: "127.0.0.1:0".into(),
                err,
            })?,
        );
    }
    // All listeners were held at once, so the ports are distinct; dropping releases them for the nodes.
    Ok(held
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect())
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Start a local cluster in `dir`. If a node loses its bootstrap port to another process in
/// the moment between choosing it and binding it, the cluster is restarted on fresh ports.
pub fn up(dir: &Path, o: &UpOptions) -> Result<ClusterConfig, ProcessError> {
    up_with_ports(dir, o, free_ports)
}

/// [`up`] with the bootstrap ports of each attempt chosen by `ports` (tests use it to force a
/// port clash on the first attempt).
pub fn up_with_ports(
    dir: &Path,
    o: &UpOptions,
    mut ports: impl FnMut(u16) -> Result<Vec<u16>, ProcessError>,
) -> Result<ClusterConfig, ProcessError> {
    let mut attempt = 1;
    loop {
        match up_once(dir, o, ports(o.nodes)?) {
            Err(ProcessError::StartFailed { ref tail, .. })
                if attempt < MAX_PORT_ATTEMPTS
                    && tail.contains("cannot listen on")
                    && tail.contains("in use") =>
            {
                attempt += 1;
            }
            r => return r,
        }
    }
}

fn up_once(dir: &Path, o: &UpOptions, ports: Vec<u16>) -> Result<ClusterConfig, ProcessError> {
    if o.nodes == 0 || o.nodes > MAX_LOCAL_NODES {
        return Err(ProcessError::Invalid(format!(
            "--nodes {} is not in 1..={MAX_LOCAL_NODES}",
            o.nodes
        )));
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    if config_path(dir).exists() {
        let old = ClusterConfig::load(&config_path(dir)).ok();
        let running: Vec<u16> = old.map_or(vec![], |c| {
            c.node
                .iter()
                .map(|n| n.id)
                .filter(|&id| live_pid(dir, id).is_some())
                .collect()
        });
        if !running.is_empty() {
            return Err(ProcessError::AlreadyRunning {
                dir: dir.into(),
                running,
            });
        }
    }
    if ports.len() != o.nodes as usize {
        return Err(ProcessError::Invalid(format!(
            "{} bootstrap ports for {} nodes",
            ports.len(),
            o.nodes
        )));
    }
    let mut cfg = ClusterConfig::local("local", o.nodes, o.transport, 0, o.geometry.clone());
    for (n, p) in cfg.node.iter_mut().zip(&ports) {
        n.bootstrap.set_port(*p);
        n.workers = o.workers;
    }
    if let Some(e) = o.expiry_ms {
        cfg.protocol.expiry_ms = e;
    }
    cfg.cluster.mode = o.mode.clone();
    cfg.cluster.server_threads = o.server_threads;
    cfg.cluster.max_clients_per_node = o.max_clients_per_node;
    cfg.cluster.server_poll = o.server_poll.clone();
    cfg.cluster.huge_pages = o.huge_pages;
    cfg.protocol.clock_margin_ms = o
        .clock_margin_ms
        .unwrap_or(cfg.protocol.clock_margin_ms.min(cfg.protocol.expiry_ms / 2));
    cfg.validate()?;
    let cpath = config_path(dir);
    cfg.save(&cpath)?;
    std::fs::set_permissions(&cpath, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io(&cpath))?;

    let mut children = Vec::new();
    for n in &cfg.node {
        let log = log_path(dir, n.id);
        let out = std::fs::File::create(&log).map_err(io(&log))?;
        let err = out.try_clone().map_err(io(&log))?;
        let mut cmd = Command::new(&o.binary);
        cmd.arg("node")
            .arg("--config")
            .arg(&cpath)
            .arg("--id")
            .arg(n.id.to_string())
            .args(&o.node_args);
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        // Detach from the terminal's session so the node outlives `nessie up`.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(io(&o.binary))?;
        std::fs::write(pid_path(dir, n.id), child.id().to_string())
            .map_err(io(&pid_path(dir, n.id)))?;
        children.push((n.id, child));
    }

    // Wait until every node answers on its admin socket.
    let deadline = Instant::now() + o.ready_timeout;
    let mut pending: Vec<u16> = cfg.node.iter().map(|n| n.id).collect();
    while !pending.is_empty() {
        for (id, child) in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                let _ = down(dir);
                return Err(ProcessError::StartFailed {
                    node: *id,
                    reason: format!("exited with {status}"),
                    log: log_path(dir, *id),
                    tail: tail(&log_path(dir, *id), 15),
                });
            }
        }
        pending.retain(|&id| {
            let Ok(path) = cfg.admin_path(id, dir) else {
                return true;
            };
            !matches!(
                AdminClient::connect(&path, Duration::from_secs(2))
                    .and_then(|mut c| c.call(&Request::Ping)),
                Ok(Response::Ok)
            )
        });
        if pending.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            let id = pending[0];
            let _ = down(dir);
            return Err(ProcessError::StartFailed {
                node: id,
                reason: format!("not ready after {:?}", o.ready_timeout),
                log: log_path(dir, id),
                tail: tail(&log_path(dir, id), 15),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The children are detached; dropping the handles does not kill them.
    Ok(cfg)
}

/// Stop every node of the cluster in `dir` (SIGTERM, then SIGKILL after a grace period) and
/// remove pid files and sockets. Returns the nodes that were running.
pub fn down(dir: &Path) -> Result<Vec<u16>, ProcessError> {
    let cpath = config_path(dir);
    if !cpath.exists() {
        return Err(ProcessError::NoCluster(dir.into()));
    }
    let cfg = ClusterConfig::load(&cpath)?;
    let mut stopped = Vec::new();
    for n in &cfg.node {
        if let Some(pid) = live_pid(dir, n.id) {
            // SAFETY: signalling a process we verified is our node.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            stopped.push((n.id, pid));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for &(id, pid) in &stopped {
        while live_pid(dir, id).is_some() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if live_pid(dir, id).is_some() {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    for n in &cfg.node {
        let _ = std::fs::remove_file(pid_path(dir, n.id));
        if let Ok(p) = cfg.admin_path(n.id, dir) {
            let _ = std::fs::remove_file(p);
        }
    }
    Ok(stopped.into_iter().map(|(id, _)| id).collect())
}

/// What `nessie status` shows for one node.
#[derive(Debug)]
pub struct NodeStatus {
    pub id: u16,
    pub pid: Option<i32>,
    /// The node's status report (JSON), or why it could not be had.
    pub report: Result<serde_json::Value, String>,
}

pub fn status(dir: &Path) -> Result<(ClusterConfig, Vec<NodeStatus>), ProcessError> {
    let cpath = config_path(dir);
    if !cpath.exists() {
        return Err(ProcessError::NoCluster(dir.into()));
    }
    let cfg = ClusterConfig::load(&cpath)?;
    let nodes = cfg
        .node
        .iter()
        .map(|n| {
            let pid = live_pid(dir, n.id);
            let report = cfg
                .admin_path(n.id, dir)
                .map_err(|e| e.to_string())
                .and_then(|p| {
                    AdminClient::connect(&p, Duration::from_secs(5)).map_err(|e| e.to_string())
                })
                .and_then(|mut c| c.call(&Request::Status).map_err(|e| e.to_string()))
                .and_then(|r| match r {
                    Response::Status(s) => serde_json::from_str(&s).map_err(|e| e.to_string()),
                    r => Err(format!("unexpected reply {r:?}")),
                });
            NodeStatus {
                id: n.id,
                pid,
                report,
            }
        })
        .collect();
    Ok((cfg, nodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let (lo, hi) = ephemeral_range();
        let ports = free_ports(8).unwrap();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 8, "{ports:?}");
        for p in ports {
            if lo > 11_000 || hi < 64_000 {
                assert!(
                    !(lo..=hi).contains(&p),
                    "{p} is in the ephemeral range {lo}..={hi}"
                );
            }
            std::net::TcpListener::bind(("127.0.0.1", p)).unwrap();
        }
    }
}
