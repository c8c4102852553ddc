//! Local clusters of node processes: `nessie up` starts N node processes on this machine in the
//! background (configuration, logs, pid files and admin sockets in one directory), `nessie
//! status` asks each for its state, `nessie down` stops them and cleans up; [`etcd_server`]:
//! the local etcd started and stopped with them.

pub mod etcd_server;

use std::fs::File;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nessie_membership::MembershipError;
use nessie_store::Geometry;

use crate::admin::{AdminClient, Request, Response};
use crate::config::{ClusterConfig, MembershipSection, Transport, ETCD_TIMEOUT};
use crate::rundir::{self, RunDir};

/// Most nodes `nessie up` starts on one machine.
pub const MAX_LOCAL_NODES: u16 = 64;
pub const CONFIG_FILE: &str = "cluster.toml";

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Exposed(#[from] crate::exposure::Exposed),
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
    #[error("--nodes {0} is not in 1..={MAX_LOCAL_NODES}")]
    NodeCount(u16),
    #[error("{ports} bootstrap ports for {nodes} nodes")]
    PortCount { ports: usize, nodes: u16 },
    #[error(transparent)]
    Dir(#[from] rundir::DirError),
    #[error(transparent)]
    Etcd(#[from] etcd_server::EtcdServerError),
    #[error("membership: {0}")]
    Membership(#[from] MembershipError),
}

/// Why `nessie status` has no report from a node.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Admin(#[from] crate::admin::AdminError),
    #[error("{0}")]
    BadReport(#[from] serde_json::Error),
    #[error("unexpected reply {0:?}")]
    UnexpectedReply(Response),
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

/// The pid of node `id` if it is running: the holder of its pid file's lock, else the process
/// listening on its admin socket in `dir`.
pub fn live_pid(dir: &Path, id: u16) -> Option<i32> {
    rundir::pid_file_holder(&pid_path(dir, id))
        .or_else(|| rundir::socket_listener_pid(&dir.join(format!("node-{id}.sock"))))
}

#[derive(Clone, Debug)]
pub struct UpOptions {
    pub nodes: u16,
    /// Nodes beyond `nodes` that `cluster.toml` lists but `up` does not start: each joins
    /// later (`nessie join`, [`join`]; `[cluster] standby`).
    pub standby: u16,
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
    /// cd | sd | hy | pilaf
    pub mode: String,
    /// Server threads per node (sd, hy).
    pub server_threads: u16,
    /// Client workers per node in sd/hy (request slots reserved on every node).
    pub max_clients_per_node: u16,
    /// Idle server threads: "spin" or "yield".
    pub server_poll: String,
    /// Huge pages for every node's tables.
    pub huge_pages: nessie_fabric_ucx::HugePages,
    /// Which etcd the nodes register in.
    pub etcd: EtcdChoice,
    /// Lease TTL of the nodes' registrations, in seconds.
    pub lease_ttl_s: u64,
    /// Copies of every node's index, data and page tables (1 to 3; more than 1 needs membership).
    pub replicas: u8,
    /// Spare mirror slots per node for the copies of a node gone for good (`cluster.spare_copies`;
    /// `None`: the default, [`crate::config::default_spare_copies`]).
    pub spare_copies: Option<u8>,
    /// pilaf: extent reuse delay in milliseconds (`cluster.pilaf_reuse_delay_ms`).
    pub pilaf_reuse_delay_ms: Option<u64>,
    /// The etcd user and password (`membership.etcd_user`, `etcd_password`) for an existing
    /// etcd with auth enabled.
    pub etcd_user: Option<String>,
    pub etcd_password: Option<crate::config::Secret>,
    /// TLS files for an existing `https://` etcd (`membership.etcd_ca`, `etcd_cert`, `etcd_key`).
    pub etcd_tls: nessie_membership::tls::TlsFiles,
    /// How long a node is failed before its copies move (`membership.replace_after_s`).
    pub replace_after_s: u64,
    /// Whether the cluster moves index partitions by itself (`membership.rebalance`).
    pub rebalance: bool,
    /// The protocol front ends every node serves (`[frontends]`).
    pub frontends: Option<crate::config::FrontendsSection>,
    /// `[cluster] progress_spin_us`.
    pub progress_spin_us: u64,
    /// `[cluster] direct_loopback`.
    pub direct_loopback: bool,
    /// `[cluster] direct_peers`.
    pub direct_peers: bool,
    /// `[cluster] wait_spin_us`.
    pub wait_spin_us: Option<u64>,
    /// `[cluster] protected_mode`.
    pub protected_mode: bool,
    /// The protocol's optimisations (`[protocol.optimizations]`).
    pub optimizations: nessie_protocols::Optimizations,
    /// What the store does when full (`[cache] eviction`).
    pub eviction: nessie_protocols::Eviction,
    /// Entries sampled per victim (`[cache] eviction_samples`).
    pub eviction_samples: u8,
    /// The longest item (`[cache] item_max`).
    pub item_max: u64,
    /// The grace of a large item's unnamed chunks (`[cache] orphan_grace_ms`).
    pub orphan_grace_ms: u64,
    /// Whether the nodes reclaim expired items in the background (`[cache] expiry_reclaim`).
    pub expiry_reclaim: bool,
}

/// Where a cluster's membership lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EtcdChoice {
    /// A single-member etcd on loopback, started with the cluster and stopped with it.
    Local,
    /// An etcd (cluster) that is already running, by client URL.
    Existing(String),
    /// No membership: nothing registers, failures go unnoticed.
    Off,
}

impl UpOptions {
    /// The nodes `cluster.toml` lists: those `up` starts and the standby ones.
    pub fn total_nodes(&self) -> u16 {
        self.nodes.saturating_add(self.standby)
    }

    /// `nodes` local cd-mode nodes run with `binary`, every other setting at its default.
    pub fn new(binary: PathBuf, nodes: u16, transport: Transport, geometry: Geometry) -> Self {
        Self {
            nodes,
            standby: 0,
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
            etcd: EtcdChoice::Local,
            lease_ttl_s: nessie_membership::DEFAULT_LEASE_TTL_S,
            replicas: 1,
            spare_copies: None,
            pilaf_reuse_delay_ms: None,
            replace_after_s: nessie_membership::DEFAULT_REPLACE_AFTER_S,
            rebalance: true,
            etcd_user: None,
            etcd_password: None,
            etcd_tls: Default::default(),
            frontends: None,
            progress_spin_us: 0,
            direct_loopback: true,
            direct_peers: true,
            wait_spin_us: None,
            protected_mode: true,
            optimizations: nessie_protocols::Optimizations::default(),
            eviction: nessie_protocols::Eviction::NoEviction,
            eviction_samples: nessie_protocols::config::DEFAULT_EVICTION_SAMPLES,
            item_max: nessie_protocols::large::DEFAULT_ITEM_MAX,
            orphan_grace_ms: nessie_protocols::large::ORPHAN_GRACE_MS,
            expiry_reclaim: true,
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

/// Where [`free_ports`] draws from: 10000 up to the ephemeral range, or above it when it
/// starts too low; (0, 0) when neither leaves room (then the OS picks, `bind(0)`).
fn draw_range() -> (u16, u16) {
    let (lo, hi) = ephemeral_range();
    if lo > 11_000 {
        (10_000, lo - 1)
    } else if hi < 64_000 {
        (hi + 1, u16::MAX)
    } else {
        (0, 0)
    }
}

/// `n` distinct loopback ports that are free right now. They are chosen at random *outside*
/// the ephemeral range, so the OS does not hand them to another process's `bind(0)` (UCX TCP
/// listeners, other clusters) in the window between this probe and the node's own bind.
pub fn free_ports(n: u16) -> Result<Vec<u16>, ProcessError> {
    let (a, b) = draw_range();
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

pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Start a local cluster in `dir`. If a node loses its bootstrap port to another process in
/// the moment between choosing it and binding it, the cluster is restarted on fresh ports.
pub fn up(dir: &Path, o: &UpOptions) -> Result<ClusterConfig, ProcessError> {
    let configured = configured_ports(o);
    up_with_ports(dir, o, |n| free_ports_avoiding(n, &configured))
}

/// The ports `o` asks the nodes' front ends and metrics to listen on: base + K for each node.
fn configured_ports(o: &UpOptions) -> Vec<u16> {
    let Some(f) = &o.frontends else {
        return Vec::new();
    };
    [f.memcached_port, f.resp_port, f.metrics_port]
        .into_iter()
        .flatten()
        .flat_map(|base| (0..o.total_nodes()).filter_map(move |k| base.checked_add(k)))
        .collect()
}

/// Draws of [`free_ports`] [`free_ports_avoiding`] makes before it gives up.
const MAX_PORT_DRAWS: u32 = 100;

/// [`free_ports`], none of them in `avoid`: a bootstrap or etcd port chosen by `up` must not be
/// one the configuration gives a front end, which binds it only later (a node then failed with
/// "Address already in use").
pub fn free_ports_avoiding(n: u16, avoid: &[u16]) -> Result<Vec<u16>, ProcessError> {
    for _ in 0..MAX_PORT_DRAWS {
        let ports = free_ports(n)?;
        if !ports.iter().any(|p| avoid.contains(p)) {
            return Ok(ports);
        }
    }
    Err(ProcessError::Io {
        path: "127.0.0.1".into(),
        err: std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("no {n} free loopback ports outside the front ends' {avoid:?}"),
        ),
    })
}

/// [`up`] with the bootstrap ports of each attempt chosen by `ports` (tests use it to force a
/// port clash on the first attempt).
pub fn up_with_ports(
    dir: &Path,
    o: &UpOptions,
    mut ports: impl FnMut(u16) -> Result<Vec<u16>, ProcessError>,
) -> Result<ClusterConfig, ProcessError> {
    if o.nodes == 0 || o.total_nodes() > MAX_LOCAL_NODES {
        return Err(ProcessError::NodeCount(o.total_nodes()));
    }
    // Held until we return: a concurrent `up` or `down` on this directory fails at once.
    let rd = RunDir::lock(dir, true)?;
    let running = running_nodes(dir);
    if !running.is_empty() {
        return Err(ProcessError::AlreadyRunning {
            dir: dir.into(),
            running: running.iter().filter_map(|n| n.id).collect(),
        });
    }
    // Refuse a configuration that cannot work before starting anything (an etcd among them).
    local_config(
        o,
        &placeholder_ports(o.total_nodes()),
        placeholder_membership(o),
    )?;
    let membership = start_membership(&rd, o)?;
    let mut attempt = 1;
    let r = loop {
        match up_once(&rd, o, ports(o.total_nodes())?, membership.clone()) {
            Err(ProcessError::StartFailed { ref tail, .. })
                if attempt < MAX_PORT_ATTEMPTS
                    && tail.contains("cannot listen on")
                    && tail.contains("in use") =>
            {
                attempt += 1;
            }
            r => break r,
        }
    };
    if r.is_err() && o.etcd == EtcdChoice::Local {
        etcd_server::stop(dir);
    }
    r
}

/// Distinct ports for checking a configuration before the real ones are chosen.
fn placeholder_ports(nodes: u16) -> Vec<u16> {
    (0..nodes).map(|i| 1 + i).collect()
}

/// The `[membership]` section `o` will have, with an etcd URL that only has to be well formed.
fn placeholder_membership(o: &UpOptions) -> Option<MembershipSection> {
    let etcd = match &o.etcd {
        EtcdChoice::Off => return None,
        EtcdChoice::Existing(url) => url.clone(),
        EtcdChoice::Local => "http://127.0.0.1:2379".into(),
    };
    Some(MembershipSection {
        etcd,
        lease_ttl_s: o.lease_ttl_s,
        replace_after_s: o.replace_after_s,
        rebalance: o.rebalance,
        etcd_user: o.etcd_user.clone(),
        etcd_password: o.etcd_password.clone(),
        etcd_ca: o.etcd_tls.ca.clone(),
        etcd_cert: o.etcd_tls.cert.clone(),
        etcd_key: o.etcd_tls.key.clone(),
    })
}

/// The `[membership]` section for `o`, starting the local etcd if that is the choice.
fn start_membership(rd: &RunDir, o: &UpOptions) -> Result<Option<MembershipSection>, ProcessError> {
    let etcd = match &o.etcd {
        EtcdChoice::Off => return Ok(None),
        EtcdChoice::Existing(url) => url.clone(),
        EtcdChoice::Local => {
            let ports = free_ports_avoiding(2, &configured_ports(o))?;
            let log = rd.create_file(etcd_server::LOG_FILE)?;
            etcd_server::start(rd.path(), log, ports[0], ports[1])?.client_url
        }
    };
    let m = MembershipSection {
        etcd,
        lease_ttl_s: o.lease_ttl_s,
        replace_after_s: o.replace_after_s,
        rebalance: o.rebalance,
        etcd_user: o.etcd_user.clone(),
        etcd_password: o.etcd_password.clone(),
        etcd_ca: o.etcd_tls.ca.clone(),
        etcd_cert: o.etcd_tls.cert.clone(),
        etcd_key: o.etcd_tls.key.clone(),
    };
    if let EtcdChoice::Existing(_) = &o.etcd {
        // An etcd that cannot be used (unreachable, or wanting credentials it is not given)
        // is refused now, with its reason, not after every node failed to register.
        m.client(ETCD_TIMEOUT)
            .and_then(|etcd| etcd.get("/nessie/"))
            .map_err(MembershipError::from)?;
    }
    Ok(Some(m))
}

/// Write epoch 1 of the membership configuration (every node up but the standby ones) once all
/// the others are ready.
fn initialise_membership(cfg: &ClusterConfig) -> Result<(), ProcessError> {
    let Some(m) = &cfg.membership else {
        return Ok(());
    };
    let etcd = m.client(ETCD_TIMEOUT).map_err(MembershipError::from)?;
    let ids: Vec<u16> = cfg.node.iter().map(|n| n.id).collect();
    let set = cfg
        .replica_set()
        .map_err(crate::config::ConfigError::from)?;
    nessie_membership::initialise(
        &etcd,
        &cfg.membership_keys(),
        &ids,
        &cfg.cluster.standby,
        &set,
    )?;
    Ok(())
}

/// The configuration `up` writes for `o` with bootstrap `ports`.
fn local_config(
    o: &UpOptions,
    ports: &[u16],
    membership: Option<MembershipSection>,
) -> Result<ClusterConfig, ProcessError> {
    let total = o.total_nodes();
    if ports.len() != total as usize {
        return Err(ProcessError::PortCount {
            ports: ports.len(),
            nodes: total,
        });
    }
    let mut cfg = ClusterConfig::local("local", total, o.transport, 0, o.geometry.clone());
    cfg.cluster.standby = (o.nodes..total).collect();
    for (n, p) in cfg.node.iter_mut().zip(ports) {
        n.bootstrap.set_port(*p);
        n.workers = o.workers;
    }
    if let Some(e) = o.expiry_ms {
        cfg.protocol.expiry_ms = e;
    }
    cfg.protocol.optimizations = o.optimizations;
    cfg.cluster.mode = o.mode.clone();
    cfg.cluster.server_threads = o.server_threads;
    cfg.cluster.max_clients_per_node = o.max_clients_per_node;
    cfg.cluster.server_poll = o.server_poll.clone();
    cfg.cluster.huge_pages = o.huge_pages;
    cfg.cluster.replicas = o.replicas;
    cfg.cluster.spare_copies = o.spare_copies;
    cfg.cluster.pilaf_reuse_delay_ms = o.pilaf_reuse_delay_ms;
    cfg.cluster.progress_spin_us = o.progress_spin_us;
    cfg.cluster.direct_loopback = o.direct_loopback;
    cfg.cluster.direct_peers = o.direct_peers;
    cfg.cluster.wait_spin_us = o.wait_spin_us;
    cfg.cluster.protected_mode = o.protected_mode;
    cfg.membership = membership;
    cfg.frontends = o.frontends.clone();
    cfg.cache.eviction = o.eviction.name().to_string();
    cfg.cache.eviction_samples = o.eviction_samples;
    cfg.cache.item_max = o.item_max;
    cfg.cache.orphan_grace_ms = o.orphan_grace_ms;
    cfg.cache.expiry_reclaim = o.expiry_reclaim;
    cfg.protocol.clock_margin_ms = o
        .clock_margin_ms
        .unwrap_or(cfg.protocol.clock_margin_ms.min(cfg.protocol.expiry_ms / 2));
    cfg.validate()?;
    // Every node runs on this host: refuse what a node would refuse, before starting any.
    for n in &cfg.node {
        crate::exposure::check(&cfg, n.id)?;
    }
    Ok(cfg)
}

/// Start node `id` of the cluster configured in `cpath`, detached, logging to `log`.
fn spawn_node(o: &UpOptions, cpath: &Path, id: u16, log: File) -> Result<Child, ProcessError> {
    spawn_node_with(&o.binary, &o.node_args, cpath, id, log)
}

/// [`spawn_node`] with the `nessie` binary and extra node arguments given.
fn spawn_node_with(
    binary: &Path,
    args: &[String],
    cpath: &Path,
    id: u16,
    log: File,
) -> Result<Child, ProcessError> {
    let err = log
        .try_clone()
        .map_err(io(&log_path(cpath.parent().unwrap_or(cpath), id)))?;
    let mut cmd = Command::new(binary);
    cmd.arg("node")
        .arg("--config")
        .arg(cpath)
        .arg("--id")
        .arg(id.to_string())
        .args(args);
    cmd.stdin(Stdio::null()).stdout(log).stderr(err);
    // Detach from the terminal's session so the node outlives `nessie up`.
    // SAFETY: the closure runs in the forked child before exec and only calls setsid, which is
    // async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn().map_err(io(binary))
}

fn up_once(
    rd: &RunDir,
    o: &UpOptions,
    ports: Vec<u16>,
    membership: Option<MembershipSection>,
) -> Result<ClusterConfig, ProcessError> {
    let dir = rd.path();
    let cfg = local_config(o, &ports, membership)?;
    cfg.validate()?;
    let cpath = config_path(dir);
    rundir::write_file(&cpath, cfg.to_toml().as_bytes())?;
    let mut children = Vec::new();
    for n in cfg
        .node
        .iter()
        .filter(|n| !cfg.cluster.standby.contains(&n.id))
    {
        let log = rd.create_file(&format!("node-{}.log", n.id));
        match log
            .map_err(ProcessError::from)
            .and_then(|l| spawn_node(o, &cpath, n.id, l))
        {
            Ok(child) => children.push((n.id, child)),
            Err(e) => {
                stop_children(dir, children);
                return Err(e);
            }
        }
    }
    match wait_ready(dir, &cfg, o.ready_timeout, &mut children)
        .and_then(|()| initialise_membership(&cfg))
        .and_then(|()| wait_epoch_1_read(dir, &cfg, o.ready_timeout, &mut children))
    {
        Ok(()) => Ok(cfg), // the children are detached; dropping the handles leaves them running
        Err(e) => {
            stop_children(dir, children);
            Err(e)
        }
    }
}

/// Wait until every node answers on its admin socket; a node that exits, or is not ready by
/// `timeout`, fails the start.
fn wait_ready(
    dir: &Path,
    cfg: &ClusterConfig,
    timeout: Duration,
    children: &mut [(u16, Child)],
) -> Result<(), ProcessError> {
    let answers = |id: u16| {
        let Ok(path) = cfg.admin_path(id, dir) else {
            return false;
        };
        matches!(
            AdminClient::connect(&path, Duration::from_secs(2))
                .and_then(|mut c| c.call(&Request::Ping)),
            Ok(Response::Ok)
        )
    };
    let late = format!("not ready after {timeout:?}");
    wait_started(dir, cfg, (timeout, &late), children, answers)
}

/// With standby nodes, every node is fenced until it has read epoch 1
/// (`nessie_membership::Policy::fenced_before_epoch_1`): wait until each started one says it
/// may write, so that `up` returns a cluster that serves.
fn wait_epoch_1_read(
    dir: &Path,
    cfg: &ClusterConfig,
    timeout: Duration,
    children: &mut [(u16, Child)],
) -> Result<(), ProcessError> {
    if cfg.cluster.standby.is_empty() {
        return Ok(());
    }
    let writes =
        |id: u16| node_report(cfg, dir, id).is_ok_and(|r| r["membership"]["may_write"] == true);
    let late = format!("still fenced {timeout:?} after epoch 1 was written");
    wait_started(dir, cfg, (timeout, &late), children, writes)
}

/// Wait until `done` holds of every node `up` started (all but the standby ones), asking
/// again every [`START_POLL`]; a node that exits, or of which it does not hold by the timeout
/// (`late`: what the error says), fails the start.
fn wait_started(
    dir: &Path,
    cfg: &ClusterConfig,
    (timeout, late): (Duration, &str),
    children: &mut [(u16, Child)],
    done: impl Fn(u16) -> bool,
) -> Result<(), ProcessError> {
    let failed = |id: u16, reason: String| ProcessError::StartFailed {
        node: id,
        reason,
        log: log_path(dir, id),
        tail: tail(&log_path(dir, id), 15),
    };
    let deadline = Instant::now() + timeout;
    let mut pending: Vec<u16> = cfg
        .node
        .iter()
        .map(|n| n.id)
        .filter(|id| !cfg.cluster.standby.contains(id))
        .collect();
    loop {
        for (id, child) in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(failed(*id, format!("exited with {status}")));
            }
        }
        pending.retain(|&id| !done(id));
        let Some(&first) = pending.first() else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            return Err(failed(first, late.to_string()));
        }
        std::thread::sleep(START_POLL);
    }
}

/// How often `up` asks the nodes it started whether they are ready.
const START_POLL: Duration = Duration::from_millis(50);

/// Stop the nodes `up` started (by their unreaped child handles, so no pid can have been
/// reused) and remove what they left in `dir`.
fn stop_children(dir: &Path, mut children: Vec<(u16, Child)>) {
    for (_, c) in &children {
        // SAFETY: the child is not reaped yet, so its pid is still ours.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    }
    let deadline = Instant::now() + STOP_GRACE;
    for (_, c) in children.iter_mut() {
        while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    let _ = stop_nodes(dir, |_| true);
}

/// How long `down` waits for a node to stop after SIGTERM before it sends SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// A running node found in a cluster directory.
pub struct RunningNode {
    /// Its id, when the pid file or socket name tells it.
    pub id: Option<u16>,
    pub pid: i32,
}

/// The node id in a file name `node-ID.EXT`.
fn node_id(name: &str, ext: &str) -> Option<u16> {
    name.strip_prefix("node-")?
        .strip_suffix(ext)?
        .strip_suffix('.')?
        .parse()
        .ok()
}

/// Every process that holds a node pid file in `dir` or listens on a socket there (and on the
/// admin sockets `cluster.toml` places elsewhere), one entry per pid.
pub fn running_nodes(dir: &Path) -> Vec<RunningNode> {
    let mut found: Vec<RunningNode> = Vec::new();
    let mut add = |id: Option<u16>, pid: Option<i32>| {
        if let Some(pid) = pid {
            match found.iter_mut().find(|n| n.pid == pid) {
                Some(n) => n.id = n.id.or(id),
                None => found.push(RunningNode { id, pid }),
            }
        }
    };
    let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(id) = node_id(&name, "pid") {
            add(Some(id), rundir::pid_file_holder(&e.path()));
        } else if e.file_type().is_ok_and(|t| t.is_socket()) {
            add(
                node_id(&name, "sock"),
                rundir::socket_listener_pid(&e.path()),
            );
        }
    }
    if let Ok(cfg) = ClusterConfig::load(&config_path(dir)) {
        for n in &cfg.node {
            if let Ok(p) = cfg.admin_path(n.id, dir) {
                add(Some(n.id), rundir::socket_listener_pid(&p));
            }
        }
    }
    found
}

/// Stop every node `dir` holds a pid file or socket of (SIGTERM, then SIGKILL after
/// [`STOP_GRACE`]) and remove pid files and sockets. Returns the nodes that were running.
pub fn down(dir: &Path) -> Result<Vec<u16>, ProcessError> {
    let _lock = RunDir::lock(dir, false).map_err(|e| match e {
        rundir::DirError::Open { ref err, .. } if err.kind() == std::io::ErrorKind::NotFound => {
            ProcessError::NoCluster(dir.into())
        }
        e => e.into(),
    })?;
    let stopped = stop_nodes(dir, |_| true)?;
    etcd_server::stop(dir);
    if stopped.is_empty() && !config_path(dir).exists() {
        return Err(ProcessError::NoCluster(dir.into()));
    }
    let mut ids: Vec<u16> = stopped.iter().filter_map(|n| n.id).collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Stop node `id` of the cluster in `dir` as [`down`] stops every node (`nessie leave`, once
/// it has drained). Returns whether it was running.
pub fn stop_node(dir: &Path, id: u16) -> Result<bool, ProcessError> {
    Ok(stop_node_seen(dir, id)? != Stopped::NotRunning)
}

/// What [`stop_node_seen`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// No process of the node ran here.
    NotRunning,
    /// Every process of the node that ran here was signalled and seen to exit (its pidfd).
    Exited,
    /// A process of it was signalled but not seen to exit (SIGKILL included), or not pinned.
    NotSeen,
}

/// [`stop_node`], saying whether this call saw the node's processes exit: what `nessie
/// leave` needs before it records the node stopped in membership (rule 14a).
pub fn stop_node_seen(dir: &Path, id: u16) -> Result<Stopped, ProcessError> {
    let _lock = RunDir::lock(dir, false)?;
    let (nodes, exited) = stop_nodes_seen(dir, |n| n == Some(id))?;
    Ok(match (nodes.is_empty(), exited) {
        (true, _) => Stopped::NotRunning,
        (false, true) => Stopped::Exited,
        (false, false) => Stopped::NotSeen,
    })
}

/// [`down`] (of the nodes `which` selects) without taking the directory lock (the caller
/// holds it).
fn stop_nodes(
    dir: &Path,
    which: impl Fn(Option<u16>) -> bool,
) -> Result<Vec<RunningNode>, ProcessError> {
    Ok(stop_nodes_seen(dir, which)?.0)
}

/// [`stop_nodes`], and whether every node process found was pinned by a pidfd, signalled and
/// seen to exit.
fn stop_nodes_seen(
    dir: &Path,
    which: impl Fn(Option<u16>) -> bool,
) -> Result<(Vec<RunningNode>, bool), ProcessError> {
    let nodes: Vec<RunningNode> = running_nodes(dir)
        .into_iter()
        .filter(|n| which(n.id))
        .collect();
    // A pidfd pins the process: once it exits, signals to the handle go nowhere rather than to
    // a process that reused the pid. Pids still found after the pidfds are open are the nodes'.
    let fds: Vec<_> = nodes
        .iter()
        .filter_map(|n| Some((n.pid, rundir::Pidfd::open(n.pid).ok()?)))
        .collect();
    // A process not pinned may have exited before the open (or not be ours to open).
    let mut all_seen = fds.len() == nodes.len();
    let still = running_nodes(dir);
    let handles: Vec<_> = fds
        .into_iter()
        .filter(|(pid, _)| still.iter().any(|m| m.pid == *pid))
        .map(|(_, fd)| fd)
        .collect();
    for fd in &handles {
        let _ = fd.signal(libc::SIGTERM);
    }
    let deadline = Instant::now() + STOP_GRACE;
    for fd in &handles {
        if !fd.wait_exit(deadline.saturating_duration_since(Instant::now())) {
            let _ = fd.signal(libc::SIGKILL);
            all_seen &= fd.wait_exit(Duration::from_secs(1));
        }
    }
    remove_leftovers(dir);
    Ok((nodes, all_seen))
}

/// Remove the pid files and sockets of nodes that are no longer running.
fn remove_leftovers(dir: &Path) {
    let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let is_sock = e.file_type().is_ok_and(|t| t.is_socket());
        if node_id(&name, "pid").is_some() && rundir::pid_file_holder(&e.path()).is_none()
            || is_sock && rundir::socket_listener_pid(&e.path()).is_none()
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
    if let Ok(cfg) = ClusterConfig::load(&config_path(dir)) {
        for n in &cfg.node {
            match cfg.admin_path(n.id, dir) {
                Ok(p)
                    if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_socket())
                        && rundir::socket_listener_pid(&p).is_none() =>
                {
                    let _ = std::fs::remove_file(p);
                }
                _ => {}
            }
        }
    }
}

/// What `nessie status` shows for one node.
#[derive(Debug)]
pub struct NodeStatus {
    pub id: u16,
    pub pid: Option<i32>,
    /// The node's status report (JSON), or why it could not be had.
    pub report: Result<serde_json::Value, StatusError>,
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
            NodeStatus {
                id: n.id,
                pid,
                report: node_report(&cfg, dir, n.id),
            }
        })
        .collect();
    Ok((cfg, nodes))
}

/// What etcd says of the cluster: `None` without membership; an error names why etcd could not
/// be read (the nodes then keep serving in the epoch they know).
pub fn membership_status(
    cfg: &ClusterConfig,
) -> Option<Result<nessie_membership::Snapshot, MembershipError>> {
    let m = cfg.membership.as_ref()?;
    Some(
        m.client(ETCD_TIMEOUT)
            .map_err(MembershipError::from)
            .and_then(|etcd| nessie_membership::snapshot(&etcd, &cfg.membership_keys())),
    )
}

/// Mark node `id` leaving (`nessie leave`: it drains) or, with `leaving` false, staying, in the
/// configuration in etcd. Returns the epoch that says so (the one in force if nothing changed).
pub fn set_leaving(cfg: &ClusterConfig, id: u16, leaving: bool) -> Result<u64, String> {
    let m = cfg
        .membership
        .as_ref()
        .ok_or("this cluster runs without membership (etcd): nodes cannot leave it")?;
    let etcd = m.client(ETCD_TIMEOUT).map_err(|e| e.to_string())?;
    let set = cfg.replica_set().map_err(|e| e.to_string())?;
    nessie_membership::change_config(&etcd, &cfg.membership_keys(), |c, _| {
        Ok(match c.set_leaving(id, leaving, &set)? {
            Some(next) => {
                let epoch = next.epoch;
                (next, epoch)
            }
            None => (c.clone(), c.epoch),
        })
    })
    .map_err(|e| e.to_string())
}

/// How often [`leave`] reads membership while the node drains.
const LEAVE_POLL: Duration = Duration::from_millis(100);

/// How long after its read cut-over (and the clock margin) a leaving node steps down: a read
/// checked just before the cut-over may still be under way.
const CUT_OVER_SLACK: Duration = Duration::from_millis(100);

/// Name leaving node `id`'s read cut-over (rule 7a of `docs/protocol.md`) and wait until it,
/// the clock margin and [`CUT_OVER_SLACK`] have passed: from then nobody reads its copies,
/// which it and every writer still keep up to date, so that its step-down makes no reader
/// wait (a failed primary's readers wait the read settle time before reading the next copy,
/// rule 7). The instant is two read settle times ahead: every node reads the configuration
/// several times per read settle time, so all learn of it a read settle time before it and
/// none waits. Named once per incarnation: a second `leave` after an interrupted one waits
/// for the first instant. While some table copy it holds has no other full copy on an up
/// node ([`nessie_membership::Configuration::may_stop`]: another node failed meanwhile), it
/// waits, before naming the cut-over and again before the step-down, until `deadline`.
fn cut_over(
    cfg: &ClusterConfig,
    set: &nessie_protocols::ReplicaSet,
    id: u16,
    deadline: Instant,
    progress: &mut dyn FnMut(&str),
) -> Result<(), String> {
    use nessie_membership::{MigrationError, StartMigrationError};
    let m = cfg
        .membership
        .as_ref()
        .ok_or("this cluster runs without membership (etcd): nodes cannot leave it")?;
    let etcd = m.client(ETCD_TIMEOUT).map_err(|e| e.to_string())?;
    let margin_ns = cfg.protocol.clock_margin_ms * 1_000_000;
    let lead_ns = 2 * (set.read_settle_ns() + margin_ns);
    let mut said = String::new();
    let mut waiting = |why: String, progress: &mut dyn FnMut(&str)| {
        if Instant::now() >= deadline {
            return Err(format!(
                "node {id} not stepped down: {why} (it stays leaving and keeps serving; once \
                 its read cut-over is named it can no longer stay: run `nessie leave --node \
                 {id}` again to finish)"
            ));
        }
        if why != said {
            progress(&format!("waiting to stop: {why}"));
            said = why;
        }
        std::thread::sleep(LEAVE_POLL);
        Ok(())
    };
    let at_ns = loop {
        let named = nessie_membership::change_config(&etcd, &cfg.membership_keys(), |c, now| {
            let at_ns = now + lead_ns;
            Ok(match c.name_cut_over(id, at_ns, set)? {
                Some(next) => (next, at_ns),
                None => (c.clone(), c.cut_over(id).expect("named")),
            })
        });
        match named {
            Ok(at) => break at,
            Err(StartMigrationError::Refused(e @ MigrationError::NotSettled { .. })) => {
                waiting(e.to_string(), progress)?
            }
            // Cancelled, or failed, meanwhile: nothing to wait for.
            Err(StartMigrationError::Refused(e)) => {
                return Err(format!("node {id} not stepped down: {e}"))
            }
            // etcd's answer lost or late (the change may have landed: a retry keeps the
            // instant it named), or the configuration changing under us: try again.
            Err(e) => waiting(format!("naming its read cut-over: {e}"), progress)?,
        }
    };
    let until = at_ns + margin_ns + CUT_OVER_SLACK.as_nanos() as u64;
    let wait = until.saturating_sub(nessie_fabric::wall_clock_ns());
    progress(&format!(
        "its copies stop being read in {:.1} s (read cut-over), then it steps down",
        wait as f64 / 1e9
    ));
    std::thread::sleep(Duration::from_nanos(wait));
    loop {
        let why = match membership_status(cfg).expect("membership is configured") {
            Err(e) => format!("etcd: {e}"),
            // The other copies full for a settle time (and the margin) by the configuration.
            Ok(s) => match s.config.map(|c| {
                let now = nessie_fabric::wall_clock_ns();
                c.may_stop(id, set, Some((now, set.settle_ns() + margin_ns)))
            }) {
                None => "no configuration".into(),
                Some(Ok(())) => return Ok(()),
                Some(Err(e)) => e.to_string(),
            },
        };
        waiting(why, progress)?;
    }
}

/// What [`leave`] did.
#[derive(Clone, Debug)]
pub struct Left {
    /// The epoch that marked the node leaving.
    pub epoch: u64,
    /// How long its index partitions took to move away.
    pub drained: Duration,
    /// Whether it was stopped (it was running and not `keep_running`).
    pub stopped: bool,
    /// Whether membership records that its process exited (`Member::stopped_ns`): its table
    /// copies then move to the others a join settle time after it failed, not
    /// `replace_after_s`. Why not, otherwise.
    pub marked_stopped: Result<(), String>,
}

/// `nessie leave`: mark node `id` leaving; wait (up to `timeout`) until the balancer has moved
/// every index partition copy it holds to the others and no migration runs, telling
/// `progress` what it holds on each change; then, unless `keep_running`, have it step down
/// from membership (the others declare it failed at once, not a lease TTL later) and stop
/// it. Once the others have declared it failed, it records that the process exited
/// (`Configuration::mark_stopped`): the copies of its tables then move to spare slots of the
/// others a join settle time after it failed, as a failed node's do after
/// `membership.replace_after_s` (which waits for a process that may come back; this one will
/// not). Where that cannot be recorded (the
/// process outlived its stop, etcd failed), they move after `replace_after_s`, and
/// [`Left::marked_stopped`] says why.
pub fn leave(
    cfg: &ClusterConfig,
    dir: &Path,
    id: u16,
    timeout: Duration,
    keep_running: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<Left, String> {
    let set = cfg.replica_set().map_err(|e| e.to_string())?;
    if set.replicas() < 2 {
        return Err(
            "with one copy a node's data lives only on it: it cannot leave without losing it"
                .into(),
        );
    }
    let m = cfg
        .membership
        .as_ref()
        .ok_or("this cluster runs without membership (etcd): nodes cannot leave it")?;
    if set.index_partitions().is_some() && !m.rebalance {
        return Err("the balancer is off ([membership] rebalance = false): nothing would move the node's index partitions".into());
    }
    let epoch = set_leaving(cfg, id, true)?;
    let start = Instant::now();
    let mut said = String::new();
    loop {
        let state = match membership_status(cfg).expect("membership is configured") {
            Err(e) => format!("etcd: {e}"),
            Ok(s) => {
                match s.config {
                    None => "no configuration yet".into(),
                    Some(c) if !c.leaving.contains(&id) => {
                        return Err(format!(
                            "node {id} is no longer leaving (nessie leave --cancel?)"
                        ))
                    }
                    Some(c) if c.index_drained(&set, id) => break,
                    Some(c) => {
                        let index = c
                            .index_map(&set)
                            .and_then(|m| m.loads().get(&id).copied())
                            .unwrap_or(0);
                        let migrating = c.index_chains.iter().filter(|ch| ch.migrating).count();
                        format!("holds {index} index partition copies; {migrating} partitions migrating")
                    }
                }
            }
        };
        if state != said {
            progress(&state);
            said = state;
        }
        if start.elapsed() >= timeout {
            return Err(format!(
                "node {id} still draining after {:.0} s (it stays leaving; nessie leave --cancel --node {id} undoes)",
                timeout.as_secs_f64()
            ));
        }
        std::thread::sleep(LEAVE_POLL);
    }
    let drained = start.elapsed();
    if keep_running {
        return Ok(Left {
            epoch,
            drained,
            stopped: false,
            marked_stopped: Err("it still runs".into()),
        });
    }
    cut_over(cfg, &set, id, start + timeout, progress)?;
    // The incarnation whose cut-over is named: the one stopped below.
    let incarnation = match membership_status(cfg).expect("membership is configured") {
        Ok(s) => s.config.and_then(|c| {
            c.nodes
                .iter()
                .find(|m| m.id == id && m.cut_over_ns != 0)
                .map(|m| m.incarnation)
        }),
        Err(_) => None,
    };
    // Step down first: its lease revoked, the others declare it failed at their next step.
    let stepped = cfg
        .admin_path(id, dir)
        .map_err(|e| e.to_string())
        .and_then(|p| AdminClient::connect(&p, Duration::from_secs(5)).map_err(|e| e.to_string()))
        .and_then(|mut c| c.call(&Request::StepDown).map_err(|e| e.to_string()));
    match stepped {
        Ok(Response::Ok) => {}
        Ok(r) => progress(&format!(
            "stepping down: unexpected reply {r:?}; stopping it all the same"
        )),
        Err(e) => progress(&format!("stepping down: {e}; stopping it all the same")),
    }
    let seen = stop_node_seen(dir, id).map_err(|e| e.to_string())?;
    let stopped = seen != Stopped::NotRunning;
    let marked_stopped = match (seen, incarnation) {
        (Stopped::NotRunning, _) => Err("no process of it ran here: its exit was not seen".into()),
        (Stopped::NotSeen, _) => Err("its process was not seen to exit".into()),
        (Stopped::Exited, None) => Err("its incarnation could not be read".into()),
        (Stopped::Exited, Some(inc)) => mark_stopped(cfg, id, inc),
    };
    Ok(Left {
        epoch,
        drained,
        stopped,
        marked_stopped,
    })
}

/// How long [`mark_stopped`] waits for the others to declare a stopped node failed: its lease
/// was revoked (or, had the step-down failed, lapses within a TTL).
fn failed_within(cfg: &ClusterConfig) -> Duration {
    let ttl = cfg.membership.as_ref().map_or(0, |m| m.lease_ttl_s);
    Duration::from_secs(2 * ttl + 1)
}

/// Record in membership that leaving node `id`'s incarnation `incarnation`, which this process
/// saw exit, has stopped (`Configuration::mark_stopped`), once the others have declared it
/// failed: it is gone for good a join settle time after it failed.
fn mark_stopped(cfg: &ClusterConfig, id: u16, incarnation: u64) -> Result<(), String> {
    use nessie_membership::{MigrationError, StartMigrationError};
    let m = cfg
        .membership
        .as_ref()
        .ok_or("this cluster runs without membership (etcd)")?;
    let etcd = m.client(ETCD_TIMEOUT).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + failed_within(cfg);
    loop {
        let marked = nessie_membership::change_config(&etcd, &cfg.membership_keys(), |c, now| {
            Ok(match c.mark_stopped(id, incarnation, now)? {
                Some(next) => (next, ()),
                None => (c.clone(), ()),
            })
        });
        match marked {
            Ok(()) => return Ok(()),
            // Refused for good: not the process stopped, or it never left.
            Err(StartMigrationError::Refused(e @ MigrationError::NotStopped { .. })) => {
                return Err(e.to_string())
            }
            // Not declared failed yet (the others' monitors step every part of a TTL), or
            // etcd slow or busy: try again until the deadline.
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("not recorded in {:?}: {e}", failed_within(cfg)))
            }
            Err(_) => {}
        }
        std::thread::sleep(LEAVE_POLL);
    }
}

/// How often [`join`] reads membership while the node joins.
const JOIN_POLL: Duration = Duration::from_millis(100);

/// What [`join`] did.
#[derive(Clone, Debug)]
pub struct Joined {
    /// The node that joined.
    pub id: u16,
    /// From its start until membership said it was up.
    pub took: Duration,
}

/// `nessie join`: start the lowest-numbered standby node of the cluster in `dir` (`[cluster]
/// standby`, still standing by in membership's configuration and not running) with `binary`,
/// detached, and wait (up to `timeout`) until membership says it is up, telling `progress`
/// its state on each change. The balancer then gives it its share of index partitions (`nessie
/// status` shows them arrive). A node that is not up by `timeout` keeps running.
pub fn join(
    dir: &Path,
    binary: &Path,
    timeout: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<Joined, String> {
    let mut joined = join_many(dir, binary, 1, timeout, progress)?;
    Ok(joined.pop().expect("one node joined"))
}

/// [`join`] for the `count` lowest-numbered standby nodes at once: all start together and
/// join side by side, and this returns once every one is up, in id order. Nothing is started
/// unless `count` standby nodes are left to start; if one fails to start, or exits, those
/// started keep running and may still join (the error names them).
pub fn join_many(
    dir: &Path,
    binary: &Path,
    count: u16,
    timeout: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Joined>, String> {
    if count == 0 {
        return Err("--count must be at least 1".into());
    }
    let cpath = config_path(dir);
    if !cpath.exists() {
        return Err(ProcessError::NoCluster(dir.into()).to_string());
    }
    let cfg = ClusterConfig::load(&cpath).map_err(|e| e.to_string())?;
    if cfg.cluster.standby.is_empty() {
        return Err(format!(
            "the cluster in {} has no standby node to start: start one with `nessie up --standby N` \
             (cluster.toml's [cluster] standby lists the nodes that join later)",
            dir.display()
        ));
    }
    let snapshot = match membership_status(&cfg) {
        Some(Ok(s)) => s,
        Some(Err(e)) => return Err(format!("cannot read membership: {e}")),
        None => {
            return Err("this cluster runs without membership (etcd): nodes cannot join it".into())
        }
    };
    let config = snapshot
        .config
        .ok_or("the cluster has no membership configuration yet (is it starting?)")?;
    let free: Vec<u16> = config
        .standby
        .iter()
        .copied()
        .filter(|&id| live_pid(dir, id).is_none())
        .collect();
    if free.is_empty() {
        return Err(match config.standby.is_empty() {
            true => format!(
                "every standby node has joined already ({:?}); the cluster cannot grow beyond the {} nodes cluster.toml lists",
                cfg.cluster.standby,
                cfg.node.len()
            ),
            false => format!(
                "standby nodes {:?} are starting already (`nessie status` shows them)",
                config.standby
            ),
        });
    }
    if free.len() < count as usize {
        return Err(format!(
            "{count} nodes asked to join, but only {} standby node(s) are left to start ({free:?})",
            free.len()
        ));
    }
    let mut children: Vec<(u16, std::process::Child, Option<Duration>)> = Vec::new();
    for &id in &free[..count as usize] {
        let child = {
            let rd = RunDir::lock(dir, false).map_err(|e| e.to_string())?;
            let log = rd
                .create_file(&format!("node-{id}.log"))
                .map_err(|e| e.to_string())?;
            let started: Vec<u16> = children.iter().map(|(id, ..)| *id).collect();
            spawn_node_with(binary, &[], &cpath, id, log).map_err(|e| match started.is_empty() {
                true => e.to_string(),
                false => format!("{e} (nodes {started:?} were started and keep running)"),
            })?
        };
        progress(&format!(
            "node {id} started (pid {}); log {}",
            child.id(),
            log_path(dir, id).display()
        ));
        children.push((id, child, None::<Duration>));
    }
    let start = Instant::now();
    let mut said = String::new();
    loop {
        for (id, child, _) in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "node {id} exited with {status}\n--- last lines of {} ---\n{}",
                    log_path(dir, *id).display(),
                    tail(&log_path(dir, *id), 15)
                ));
            }
        }
        let states: Vec<String> = match membership_status(&cfg).expect("membership is configured") {
            Err(e) => vec![format!("etcd: {e}")],
            Ok(s) => children
                .iter_mut()
                .map(|(id, _, up)| {
                    let state = match &s.config {
                        Some(c) if c.state(*id) == Some(nessie_membership::NodeState::Failed) => {
                            "registering".into()
                        }
                        Some(c) => match c.state(*id) {
                            Some(nessie_membership::NodeState::Up) => {
                                up.get_or_insert(start.elapsed());
                                "up".into()
                            }
                            Some(st) => st.as_str().to_string(),
                            None => format!("not a member of epoch {}", c.epoch),
                        },
                        None => "no configuration".into(),
                    };
                    match count {
                        1 => state,
                        _ => format!("node {id} {state}"),
                    }
                })
                .collect(),
        };
        if children.iter().all(|(_, _, up)| up.is_some()) {
            break;
        }
        let state = states.join(", ");
        if state != said {
            progress(&state);
            said = state;
        }
        if start.elapsed() >= timeout {
            let late: Vec<u16> = children
                .iter()
                .filter(|(_, _, up)| up.is_none())
                .map(|(id, ..)| *id)
                .collect();
            return Err(format!(
                "node(s) {late:?} not up after {:.0} s (they keep running and may still join; see their logs in {})",
                timeout.as_secs_f64(),
                dir.display()
            ));
        }
        std::thread::sleep(JOIN_POLL);
    }
    Ok(children
        .into_iter()
        .map(|(id, _, up)| Joined {
            id,
            took: up.expect("every one is up"),
        })
        .collect())
}

/// Node `id`'s status report, asked over its admin socket.
fn node_report(cfg: &ClusterConfig, dir: &Path, id: u16) -> Result<serde_json::Value, StatusError> {
    let path = cfg.admin_path(id, dir)?;
    let mut conn = AdminClient::connect(&path, Duration::from_secs(5))?;
    match conn.call(&Request::Status)? {
        Response::Status(s) => Ok(serde_json::from_str(&s)?),
        r => Err(StatusError::UnexpectedReply(r)),
    }
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

    #[test]
    fn ports_up_draws_avoid_those_the_front_ends_are_given() {
        let mut o = UpOptions::new(
            PathBuf::from("nessie"),
            3,
            Transport::Shm,
            Geometry::default(),
        );
        assert!(configured_ports(&o).is_empty());
        o.frontends = Some(crate::config::FrontendsSection {
            memcached_port: Some(10_000),
            resp_port: None,
            metrics_port: Some(u16::MAX - 1),
            resp_password: None,
            bind: "127.0.0.1".into(),
            max_connections: 1,
            threads: 1,
            inflight: 1,
        });
        // Node K listens on base + K; a base near the top keeps only the ports that exist.
        assert_eq!(
            configured_ports(&o),
            vec![10_000, 10_001, 10_002, u16::MAX - 1, u16::MAX]
        );
        // Avoiding every odd port makes about half the draws redraw; no avoided one comes back.
        let (a, b) = draw_range();
        if b <= a {
            eprintln!("no range to draw from on this host (the OS picks the ports): skipped");
            return;
        }
        let avoid: Vec<u16> = (a..=b).filter(|p| p % 2 == 1).collect();
        for _ in 0..20 {
            for p in free_ports_avoiding(1, &avoid).unwrap() {
                assert!(!avoid.contains(&p), "{p} was to be avoided");
            }
        }
    }
}
