//! One benchmark run on a real local cluster: start the node processes (`nessie up` machinery)
//! in the requested mode, start the background CPU hogs, preload, optionally calibrate the
//! closed-loop maximum for an open-loop run, run the agents in every node for a common window,
//! merge their reports into a [`BenchResult`], and tear everything down.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nessie_cluster::admin::{AdminClient, AdminError, Request, Response};
use nessie_cluster::config::{ClusterConfig, ConfigError, Transport};
use nessie_cluster::process::{self, ProcessError, UpOptions};
use nessie_protocols::Optimizations;
use nessie_store::{limits, Geometry};

use crate::agent::{
    decode_hist, AgentReport, AgentRequest, AgentSpec, HistogramError, PerOpFabric, SizeExcess,
    MAX_AGENT_THREADS, MIN_KEY_SIZE,
};
use crate::result::*;
pub use crate::sizing::sizing;
use crate::workload::{KeyDist, WorkloadError, Ycsb};

/// Most background CPU hogs a run may start.
pub const MAX_BACKGROUND: u16 = 64;
/// Expiry period of benchmark clusters: short, so that PUT-heavy runs recycle entries soon.
const BENCH_EXPIRY_MS: u64 = 200;
/// Earliest kill, seconds into the measured window: five timeline windows to measure the
/// throughput before it by.
pub const MIN_KILL_AT_S: f64 = 0.5;
/// Closed-loop calibration length for open-loop runs.
const CALIBRATION_S: f64 = 2.0;

/// How to run: which binary serves as node (it must install the benchmark agent), and where.
#[derive(Clone, Debug)]
pub struct RunnerOptions {
    pub binary: PathBuf,
    /// Cluster directory (default: a fresh temporary one, removed afterwards).
    pub dir: Option<PathBuf>,
    /// Idle server threads (sd, hy, pilaf): "spin" or "yield".
    pub server_poll: String,
    /// pilaf: extent reuse delay in milliseconds (default: the expiry period).
    pub pilaf_reuse_delay_ms: Option<u64>,
    /// Benchmark this running cluster (its directory) instead of starting one; it is left
    /// running. Its mode and node count must match the parameters.
    pub cluster: Option<PathBuf>,
    /// `[cluster] progress_spin_us` of the cluster started.
    pub progress_spin_us: u64,
    /// `[cluster] direct_loopback` of the cluster started.
    pub direct_loopback: bool,
    /// `[cluster] direct_peers` of the cluster started.
    pub direct_peers: bool,
    /// `[cluster] wait_spin_us` of the cluster started.
    pub wait_spin_us: Option<u64>,
    /// A node to kill (and perhaps restart) during the measured window.
    pub fault: Option<FaultPlan>,
    /// Nodes to leave during the measured window (`--scale-to`).
    pub scale: Option<crate::scale::ScalePlan>,
}

/// `nessie bench --kill-node K --kill-at S [--restart-at S2]`: SIGKILL node K at S seconds
/// into the measured window, and start it again at S2; the timeline shows the stall.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct FaultPlan {
    pub node: u16,
    pub kill_at_s: f64,
    pub restart_at_s: Option<f64>,
}

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("--mode {0:?} is not one of cd, sd, hy, pilaf")]
    Mode(String),
    #[error("--{flag} {value} is not in {range}")]
    OutOfRange {
        flag: &'static str,
        value: String,
        range: String,
    },
    #[error("YCSB F's read-modify-writes need conditional writes, which --mode {0} does not have (use --mode cd)")]
    Conditional(String),
    #[error("--duration {duration} / --warmup {warmup} out of range")]
    Window { duration: f64, warmup: f64 },
    #[error("--background {0} exceeds {MAX_BACKGROUND}")]
    Background(u16),
    #[error("--keys must be positive")]
    NoKeys,
    #[error("--inflight {0} runs closed loop only: it cannot be used with --target-load")]
    InflightOpenLoop(u16),
    #[error("--eviction: {0}")]
    Eviction(String),
    #[error("--transport: {0}")]
    Transport(#[from] nessie_cluster::config::InvalidConfig),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("the cluster in {dir}: {mismatch}")]
    Attach { dir: PathBuf, mismatch: Mismatch },
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("node {node}: {source}")]
    Admin {
        node: u16,
        #[source]
        source: AdminError,
    },
    /// The agent's own error, as the node sent it back.
    #[error("{0}")]
    Agent(String),
    #[error("node {node}: unexpected reply {reply}")]
    UnexpectedReply { node: u16, reply: String },
    #[error("bad agent report: {0}")]
    BadReport(#[from] serde_json::Error),
    #[error(transparent)]
    Histogram(#[from] HistogramError),
    #[error("starting a background process: {0}")]
    Hog(#[source] std::io::Error),
    #[error("an agent request thread panicked")]
    Panicked,
    #[error("--kill-node: {0}")]
    Fault(String),
    #[error(transparent)]
    Scale(#[from] crate::scale::ScaleError),
    #[error("killing node {node}: {err}")]
    Kill {
        node: u16,
        #[source]
        err: std::io::Error,
    },
}

/// How a running cluster does not fit a run's parameters.
#[derive(Debug, thiserror::Error)]
pub enum Mismatch {
    #[error("node {0} is not answering")]
    NodeDown(u16),
    #[error("it runs mode {has}, not --mode {want}")]
    Mode { has: String, want: String },
    #[error("it has {has} nodes, not --nodes {want}")]
    Nodes { has: usize, want: u16 },
    #[error("{keys} keys do not fit its {ites} index entries; use --keys")]
    Keys { keys: u64, ites: u64 },
    #[error("--key-size / --value-size: {0}")]
    Sizes(#[from] SizeExcess),
}

/// `Ok` if `lo <= value <= hi`, else the error naming the flag.
fn in_range<T: PartialOrd + std::fmt::Display>(
    flag: &'static str,
    value: T,
    lo: T,
    hi: T,
) -> Result<(), BenchError> {
    if lo <= value && value <= hi {
        return Ok(());
    }
    Err(BenchError::OutOfRange {
        flag,
        value: value.to_string(),
        range: format!("{lo}..={hi}"),
    })
}

fn validate(p: &BenchParams) -> Result<Mode3, BenchError> {
    let mode = match p.mode.as_str() {
        "cd" => Mode3::Cd,
        "sd" => Mode3::Sd,
        "hy" => Mode3::Hy,
        "pilaf" => Mode3::Pilaf,
        m => return Err(BenchError::Mode(m.into())),
    };
    in_range("nodes", p.nodes, 1, process::MAX_LOCAL_NODES)?;
    in_range("client-threads", p.client_threads, 1, MAX_AGENT_THREADS)?;
    if mode != Mode3::Cd {
        in_range("server-threads", p.server_threads, 1, 64)?;
    }
    p.transport.parse::<Transport>()?;
    in_range(
        "key-size",
        p.key_size,
        MIN_KEY_SIZE as u32,
        limits::MAX_KEY_SIZE,
    )?;
    in_range("value-size", p.value_size, 1, limits::MAX_VALUE_SIZE)?;
    if let Some(lo) = p.value_size_min {
        in_range("value-size", lo, 1, p.value_size)?;
    }
    if !(0.0..=1.0).contains(&p.get_ratio) {
        return Err(BenchError::OutOfRange {
            flag: "get-ratio",
            value: p.get_ratio.to_string(),
            range: "[0, 1]".into(),
        });
    }
    // A YCSB workload's distribution is its own ("latest" for D).
    if p.workload.is_none() {
        p.dist.parse::<KeyDist>()?;
    }
    if let Some(w) = &p.workload {
        let w: Ycsb = w.parse()?;
        if w.needs_conditional_writes() && p.mode != "cd" {
            return Err(BenchError::Conditional(p.mode.clone()));
        }
    }
    if !(p.load_factor > 0.0 && p.load_factor <= 0.95) {
        return Err(BenchError::OutOfRange {
            flag: "load-factor",
            value: p.load_factor.to_string(),
            range: "(0, 0.95]".into(),
        });
    }
    if !(p.duration > 0.0 && p.duration <= 3600.0 && (0.0..=600.0).contains(&p.warmup)) {
        return Err(BenchError::Window {
            duration: p.duration,
            warmup: p.warmup,
        });
    }
    if p.background > MAX_BACKGROUND {
        return Err(BenchError::Background(p.background));
    }
    if let Some(f) = p.target_load {
        if !(f > 0.0 && f <= 1.0) {
            return Err(BenchError::OutOfRange {
                flag: "target-load",
                value: f.to_string(),
                range: "(0, 1]".into(),
            });
        }
    }
    if p.keys == Some(0) {
        return Err(BenchError::NoKeys);
    }
    in_range("inflight", p.inflight, 1, crate::agent::MAX_INFLIGHT)?;
    if p.inflight > 1 && p.target_load.is_some() {
        return Err(BenchError::InflightOpenLoop(p.inflight));
    }
    Ok(mode)
}

/// A fault plan that fits the run: a node of the cluster, times inside the measured window,
/// and a cluster the run starts (it does not kill the nodes of someone else's).
fn validate_fault(p: &BenchParams, opts: &RunnerOptions) -> Result<(), BenchError> {
    let Some(f) = opts.fault else {
        return Ok(());
    };
    let bad = |why: String| Err(BenchError::Fault(why));
    if opts.cluster.is_some() {
        return bad("a run kills only nodes it started itself, not those of --cluster".into());
    }
    if f.node >= p.nodes {
        return bad(format!("node {} is not one of 0..{}", f.node, p.nodes));
    }
    if p.nodes < 2 {
        return bad("one node killed leaves no client to measure: use --nodes 2 or more".into());
    }
    if !(MIN_KILL_AT_S..p.duration).contains(&f.kill_at_s) {
        return bad(format!(
            "--kill-at {} is not within the measured window [{MIN_KILL_AT_S}, {}) (the \
             throughput before the kill is what the stall is measured against)",
            f.kill_at_s, p.duration
        ));
    }
    if let Some(r) = f.restart_at_s {
        if !(f.kill_at_s < r && r < p.duration) {
            return bad(format!(
                "--restart-at {r} is not between --kill-at {} and the window's end {}",
                f.kill_at_s, p.duration
            ));
        }
    }
    Ok(())
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Mode3 {
    Cd,
    Sd,
    Hy,
    Pilaf,
}

/// Background CPU hogs, stopped on drop.
struct Hogs(Vec<Child>);

impl Hogs {
    fn start(binary: &PathBuf, n: u16) -> Result<Self, BenchError> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(
                Command::new(binary)
                    .arg("burn")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(BenchError::Hog)?,
            );
        }
        Ok(Self(v))
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The cluster, stopped (and its temporary directory removed) on drop.
struct RunningCluster {
    dir: PathBuf,
    temp: bool,
    /// Started by this run (stopped on drop), or someone else's (left running).
    owned: bool,
    cfg: ClusterConfig,
}

impl Drop for RunningCluster {
    fn drop(&mut self) {
        if self.owned {
            let _ = process::down(&self.dir);
        }
        if self.temp {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Attach to a running cluster, checking that it can run these parameters.
fn attach(dir: &std::path::Path, p: &BenchParams, keys: u64) -> Result<RunningCluster, BenchError> {
    let (cfg, nodes) = process::status(dir)?;
    fits(&cfg, &nodes, p, keys).map_err(|mismatch| BenchError::Attach {
        dir: dir.to_path_buf(),
        mismatch,
    })?;
    Ok(RunningCluster {
        dir: dir.to_path_buf(),
        temp: false,
        owned: false,
        cfg,
    })
}

/// Whether a running cluster can run these parameters.
fn fits(
    cfg: &ClusterConfig,
    nodes: &[process::NodeStatus],
    p: &BenchParams,
    keys: u64,
) -> Result<(), Mismatch> {
    if let Some(n) = nodes.iter().find(|n| n.report.is_err()) {
        return Err(Mismatch::NodeDown(n.id));
    }
    if cfg.cluster.mode != p.mode {
        return Err(Mismatch::Mode {
            has: cfg.cluster.mode.clone(),
            want: p.mode.clone(),
        });
    }
    if cfg.node.len() != p.nodes as usize {
        return Err(Mismatch::Nodes {
            has: cfg.node.len(),
            want: p.nodes,
        });
    }
    let g = &cfg.geometry;
    SizeExcess::check(p.key_size, p.value_size, g)?;
    if keys as f64 > g.total_ites() as f64 * 0.9 {
        return Err(Mismatch::Keys {
            keys,
            ites: g.total_ites(),
        });
    }
    Ok(())
}

fn ask_all(
    c: &RunningCluster,
    req: &AgentRequest,
    timeout: Duration,
) -> Result<Vec<serde_json::Value>, BenchError> {
    ask_each(c, req, timeout)?
        .into_iter()
        .map(|(_, r)| r)
        .collect()
}

/// One node's answer to an agent request.
type Answer = (u16, Result<serde_json::Value, BenchError>);

/// Every node's answer, by node.
fn ask_each(
    c: &RunningCluster,
    req: &AgentRequest,
    timeout: Duration,
) -> Result<Vec<Answer>, BenchError> {
    let body = serde_json::to_vec(req).expect("serialises");
    // Standby nodes run no agent (a run scaling out starts them while it runs).
    let handles: Vec<_> = c
        .cfg
        .node
        .iter()
        .filter(|n| !c.cfg.cluster.standby.contains(&n.id))
        .map(|n| {
            let path = c.cfg.admin_path(n.id, &c.dir)?;
            let (body, node) = (body.clone(), n.id);
            Ok((
                node,
                std::thread::spawn(move || ask(node, &path, body, timeout)),
            ))
        })
        .collect::<Result<Vec<_>, BenchError>>()?;
    handles
        .into_iter()
        .map(|(node, h)| Ok((node, h.join().map_err(|_| BenchError::Panicked)?)))
        .collect()
}

/// Send one extension request to `node`'s agent and read its JSON answer.
fn ask(
    node: u16,
    path: &std::path::Path,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<serde_json::Value, BenchError> {
    let admin = |source| BenchError::Admin { node, source };
    let mut a = AdminClient::connect(path, timeout).map_err(admin)?;
    match a.call(&Request::Extension(body)).map_err(admin)? {
        Response::Status(s) => Ok(serde_json::from_str(&s)?),
        Response::Error(e) => Err(BenchError::Agent(e)),
        r => Err(BenchError::UnexpectedReply {
            node,
            reply: format!("{r:?}"),
        }),
    }
}

fn per_op(f: &PerOpFabric, n: u64) -> FabricPerOp {
    FabricPerOp {
        ops_mean: f.ops_sum as f64 / n.max(1) as f64,
        bytes_mean: f.bytes_sum as f64 / n.max(1) as f64,
        ops_hist: f.ops_hist.clone(),
        bytes_hist: f.bytes_hist.clone(),
    }
}

fn run_window(
    c: &RunningCluster,
    spec: &AgentSpec,
    warmup: f64,
    duration: f64,
    rate: Option<f64>,
    fault: Option<(FaultPlan, &PathBuf)>,
    scale: Option<(crate::scale::ScalePlan, &PathBuf)>,
) -> Result<(Vec<AgentReport>, Option<crate::scale::Scaled>), BenchError> {
    let start = nessie_fabric::wall_clock_ns() + 300_000_000;
    let req = AgentRequest::Run {
        spec: spec.clone(),
        start_unix_ns: start,
        warmup_s: warmup,
        duration_s: duration,
        rate_per_thread: rate,
    };
    let timeout = Duration::from_secs_f64(warmup + duration + 120.0);
    let window_start = start + (warmup * 1e9) as u64;
    let injector = fault.map(|(f, binary)| {
        let (dir, binary) = (c.dir.clone(), binary.clone());
        std::thread::spawn(move || inject(&dir, &binary, f, window_start))
    });
    let from = (c.cfg.node.len() - c.cfg.cluster.standby.len()) as u16;
    let scaler = scale.map(|(s, binary)| {
        let (dir, cfg, binary) = (c.dir.clone(), c.cfg.clone(), binary.clone());
        std::thread::spawn(move || match s.to < from {
            true => crate::scale::scale_in(&dir, &cfg, s, window_start, duration),
            false => crate::scale::scale_out(&dir, &cfg, &binary, s, window_start, duration),
        })
    });
    let answers = ask_each(c, &req, timeout)?;
    let mut restarted = match injector {
        Some(h) => Some(h.join().map_err(|_| BenchError::Panicked)??),
        None => None,
    };
    let scaled = match scaler {
        Some(h) => Some(h.join().map_err(|_| BenchError::Panicked)??),
        None => None,
    };
    // Nodes that left stopped before the run ended: their agents' answers are errors.
    let left = |n: u16| scale.is_some_and(|(s, _)| n >= s.to);
    let killed = fault.map(|(f, _)| f.node);
    if let Some(Restarted(Some(child))) = &mut restarted {
        if let Ok(Some(status)) = child.try_wait() {
            let node = killed.unwrap_or(0);
            return Err(BenchError::Kill {
                node,
                err: std::io::Error::other(format!(
                    "started again, it exited ({status}) before the run ended: see {}",
                    process::log_path(&c.dir, node).display()
                )),
            });
        }
    }
    answers
        .into_iter()
        // The killed node's agent died with it: its answer is an error, and it has no report.
        .filter(|(node, r)| !((Some(*node) == killed || left(*node)) && r.is_err()))
        .map(|(_, r)| Ok(serde_json::from_value(r?)?))
        .collect::<Result<Vec<_>, BenchError>>()
        .map(|reps| (reps, scaled))
}

/// A node started again by a fault plan: stopped (if `down` has not) and reaped on drop.
struct Restarted(Option<Child>);

impl Drop for Restarted {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Carry out `f`: SIGKILL its node at `kill_at_s` into the window, start it again (with the
/// cluster's configuration, logging to its log) at `restart_at_s`.
fn inject(
    dir: &std::path::Path,
    binary: &std::path::Path,
    f: FaultPlan,
    window_start: u64,
) -> Result<Restarted, BenchError> {
    let kill = |err| BenchError::Kill { node: f.node, err };
    crate::agent::sleep_until_unix(window_start + (f.kill_at_s * 1e9) as u64);
    let pid = process::live_pid(dir, f.node).ok_or_else(|| {
        kill(std::io::Error::other(
            "it is not running (no locked pid file)",
        ))
    })?;
    // SAFETY: kill takes plain integers; the pid is a node of this run that holds its lock.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        return Err(kill(std::io::Error::last_os_error()));
    }
    let Some(at) = f.restart_at_s else {
        return Ok(Restarted(None));
    };
    crate::agent::sleep_until_unix(window_start + (at * 1e9) as u64);
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(process::log_path(dir, f.node))
        .map_err(kill)?;
    let child = Command::new(binary)
        .arg("node")
        .arg("--config")
        .arg(process::config_path(dir))
        .args(["--id", &f.node.to_string()])
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(kill)?)
        .stderr(log)
        .spawn()
        .map_err(kill)?;
    Ok(Restarted(Some(child)))
}

/// Run one benchmark. `progress` is told the phase.
pub fn run(
    p: &BenchParams,
    opts: &RunnerOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchResult, BenchError> {
    let mode = validate(p)?;
    validate_fault(p, opts)?;
    if let Some(s) = &opts.scale {
        if opts.fault.is_some() {
            return Err(BenchError::Fault(
                "a run either kills a node or scales, not both".into(),
            ));
        }
        crate::scale::validate(s, p.nodes, p.replicas, p.duration, opts.cluster.is_none())?;
    }
    let (keys, geometry) = sizing(p);
    let (dir, temp) = match &opts.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!(
                "nessie-bench-{}-{}",
                std::process::id(),
                nessie_fabric::wall_clock_ns() % 1_000_000
            )),
            true,
        ),
    };
    let cluster = match &opts.cluster {
        Some(existing) => {
            progress("attaching to the running cluster");
            attach(existing, p, keys)?
        }
        None => match start(p, mode, geometry, dir.clone(), temp, opts, progress) {
            Ok(c) => c,
            Err(e) => {
                if temp {
                    let _ = std::fs::remove_dir_all(&dir); // what `up` left (its etcd's log)
                }
                return Err(e);
            }
        },
    };
    bench_on(&cluster, p, keys, opts, progress)
}

fn start(
    p: &BenchParams,
    mode: Mode3,
    geometry: Geometry,
    dir: PathBuf,
    temp: bool,
    opts: &RunnerOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<RunningCluster, BenchError> {
    progress("starting the cluster");
    let up = UpOptions {
        nodes: p.nodes,
        // Scaling out: the nodes that join stand by from the start.
        standby: opts.scale.map_or(0, |s| s.to.saturating_sub(p.nodes)),
        transport: p.transport.parse()?,
        geometry,
        workers: 1,
        expiry_ms: Some(BENCH_EXPIRY_MS),
        clock_margin_ms: Some(0),
        binary: opts.binary.clone(),
        node_args: vec![],
        ready_timeout: Duration::from_secs(120),
        mode: p.mode.clone(),
        server_threads: if mode == Mode3::Cd {
            1
        } else {
            p.server_threads
        },
        max_clients_per_node: p.client_threads + 8,
        server_poll: opts.server_poll.clone(),
        huge_pages: Default::default(),
        // Membership is off the data path; a run needs no etcd and starts faster without,
        // unless it replicates (copies need failures declared).
        etcd: if p.replicas > 1 {
            process::EtcdChoice::Local
        } else {
            process::EtcdChoice::Off
        },
        lease_ttl_s: nessie_membership::DEFAULT_LEASE_TTL_S,
        replicas: p.replicas,
        // Scaling in: a spare slot on the nodes that stay for every table copy that leaves
        // (each leaving node holds R of them, spread over the others). Out: for every copy a
        // standby node would hold, placed on the starting nodes until it joins.
        spare_copies: opts.scale.map(|s| {
            let (moving, onto) = match s.to < p.nodes {
                true => (p.nodes - s.to, s.to),
                false => (s.to - p.nodes, p.nodes),
            };
            (moving * p.replicas as u16)
                .div_ceil(onto)
                .clamp(1, nessie_protocols::replica::MAX_SPARE_COPIES as u16) as u8
        }),
        pilaf_reuse_delay_ms: opts.pilaf_reuse_delay_ms,
        // Scaling in: the next node leaves once the tables of the one before have moved, so
        // they move as early as allowed.
        replace_after_s: match opts.scale {
            Some(_) => {
                nessie_membership::REPLACE_AFTER_TTLS * nessie_membership::DEFAULT_LEASE_TTL_S
            }
            None => nessie_membership::DEFAULT_REPLACE_AFTER_S,
        },
        rebalance: true,
        etcd_user: None,
        etcd_password: None,
        etcd_tls: Default::default(),
        frontends: None,
        progress_spin_us: opts.progress_spin_us,
        direct_loopback: opts.direct_loopback,
        direct_peers: opts.direct_peers,
        wait_spin_us: opts.wait_spin_us,
        protected_mode: true,
        // The agents' clients take theirs from the spec; the nodes' own (admin) the same.
        optimizations: optimizations(p),
        eviction: p.eviction.parse().map_err(BenchError::Eviction)?,
        eviction_samples: nessie_protocols::config::DEFAULT_EVICTION_SAMPLES,
        item_max: nessie_protocols::large::DEFAULT_ITEM_MAX,
        orphan_grace_ms: nessie_protocols::large::ORPHAN_GRACE_MS,
        // The workload writes no expiring item; a reclaimer's scans would only add fabric
        // operations and CPU to the nodes' figures.
        expiry_reclaim: false,
    };
    let cfg = process::up(&dir, &up)?;
    Ok(RunningCluster {
        dir,
        temp,
        owned: true,
        cfg,
    })
}

fn agent_spec(p: &BenchParams, keys: u64) -> AgentSpec {
    AgentSpec {
        threads: p.client_threads,
        nodes: p.nodes,
        keys,
        key_size: p.key_size,
        value_size: p.value_size,
        value_size_min: p.value_size_min,
        get_ratio: p.get_ratio,
        dist: p.dist.clone(),
        workload: p.workload.clone(),
        seed: p.seed,
        optimizations: optimizations(p),
        pin: p.pin,
        inflight: p.inflight,
    }
}

fn optimizations(p: &BenchParams) -> Optimizations {
    Optimizations {
        filter_bits: p.filter_bits,
        cache: p.cache,
        previous_versions: p.previous_versions,
        multi_read: p.multi_read,
    }
}

/// For an open-loop run, the arrival rate per client thread and the total offered load: the
/// target fraction of the closed-loop maximum, measured first.
fn calibrate(
    cluster: &RunningCluster,
    spec: &AgentSpec,
    p: &BenchParams,
    progress: &mut dyn FnMut(&str),
) -> Result<(Option<f64>, Option<f64>), BenchError> {
    let Some(f) = p.target_load else {
        return Ok((None, None));
    };
    progress("calibrating the maximum throughput");
    let (reps, _) = run_window(cluster, spec, 0.5, CALIBRATION_S, None, None, None)?;
    let max: f64 = reps
        .iter()
        .map(|r| (r.gets + r.puts) as f64 / r.window_s)
        .sum();
    let total = f * max;
    let threads = p.nodes as f64 * p.client_threads as f64;
    Ok((Some(total / threads), Some(total)))
}

fn bench_on(
    cluster: &RunningCluster,
    p: &BenchParams,
    keys: u64,
    opts: &RunnerOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchResult, BenchError> {
    let spec = agent_spec(p, keys);
    progress("preloading");
    let preload = AgentRequest::Preload(spec.clone());
    ask_all(cluster, &preload, Duration::from_secs(600))?;
    let _hogs = Hogs::start(&opts.binary, p.background)?;
    let (rate, offered) = calibrate(cluster, &spec, p, progress)?;
    progress("running");
    let fault = opts.fault.map(|f| (f, &opts.binary));
    let (reps, scaled) = run_window(
        cluster,
        &spec,
        p.warmup,
        p.duration,
        rate,
        fault,
        opts.scale.map(|s| (s, &opts.binary)),
    )?;
    let mut r = merge_reports(p, keys, offered, &reps)?;
    r.fault = opts
        .fault
        .map(|f| r.timeline.fault(f.node, f.kill_at_s, f.restart_at_s));
    r.scaling = opts
        .scale
        .zip(scaled)
        .map(|(s, d)| crate::scale::ScalingReport::new(p.nodes, s.to, &d, &r.timeline));
    progress("finishing");
    Ok(r)
}

/// The run's result from every node's agent report.
fn merge_reports(
    p: &BenchParams,
    keys: u64,
    offered: Option<f64>,
    reps: &[AgentReport],
) -> Result<BenchResult, BenchError> {
    let (mut gh, mut ph) = (crate::agent::new_hist(), crate::agent::new_hist());
    let (mut fg, mut fp) = (PerOpFabric::default(), PerOpFabric::default());
    let mut cells: Option<crate::timeline::Cells> = None;
    let mut r = BenchResult {
        mode: p.mode.clone(),
        params: BenchParams {
            keys: Some(keys),
            ..p.clone()
        },
        ops: PerKind::default(),
        ops_per_sec: 0.0,
        goodput_bytes_per_sec: 0.0,
        latency_us: PerKind::default(),
        fabric: FabricSummary::default(),
        aborts: 0,
        retries: 0,
        cpu_seconds: CpuSeconds::default(),
        errors: 0,
        offered_ops_per_sec: offered,
        timeline: Default::default(),
        error_kinds: Default::default(),
        fault: None,
        scaling: None,
    };
    for rep in reps {
        r.ops.get += rep.gets;
        r.ops.put += rep.puts;
        r.errors += rep.errors;
        for (k, n) in &rep.error_kinds {
            *r.error_kinds.entry(k.clone()).or_default() += n;
        }
        r.aborts += rep.aborts;
        r.retries += rep.retries;
        gh.add(decode_hist(&rep.get_hist)?)
            .map_err(HistogramError::from)?;
        ph.add(decode_hist(&rep.put_hist)?)
            .map_err(HistogramError::from)?;
        fg.merge(&rep.fabric_get);
        fp.merge(&rep.fabric_put);
        if !rep.timeline.ops.is_empty() {
            let c = crate::timeline::Cells::from_report(&rep.timeline)?;
            match &mut cells {
                Some(all) => all.merge(&c)?,
                None => cells = Some(c),
            }
        }
        r.fabric.total_ops += rep.window_fabric_ops;
        r.fabric.total_bytes += rep.window_remote_bytes;
        r.fabric.local_bytes += rep.window_local_bytes;
        r.cpu_seconds.client += rep.cpu.client;
        r.cpu_seconds.server += rep.cpu.server;
        r.cpu_seconds.progress += rep.cpu.progress;
        r.cpu_seconds.pacing += rep.cpu.pacing;
        r.cpu_seconds.total += rep.cpu.client + rep.cpu.server + rep.cpu.progress + rep.cpu.other;
    }
    r.ops.all = r.ops.get + r.ops.put;
    r.ops_per_sec = r.ops.all as f64 / p.duration;
    r.goodput_bytes_per_sec = r.ops_per_sec * p.mean_value_size();
    let mut all = gh.clone();
    all.add(&ph).map_err(HistogramError::from)?;
    r.latency_us = PerKind {
        get: LatencySummary::of(&gh),
        put: LatencySummary::of(&ph),
        all: LatencySummary::of(&all),
    };
    let mut fa = fg.clone();
    fa.merge(&fp);
    r.fabric.get = per_op(&fg, r.ops.get);
    r.fabric.put = per_op(&fp, r.ops.put);
    r.fabric.all = per_op(&fa, r.ops.all);
    r.timeline = cells.map(|c| c.timeline()).unwrap_or_default();
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_parameters_are_named() {
        type Case = (Box<dyn Fn(&mut BenchParams)>, &'static str);
        let cases: Vec<Case> = vec![
            (Box::new(|p| p.mode = "xx".into()), "--mode"),
            (Box::new(|p| p.nodes = 0), "--nodes"),
            (Box::new(|p| p.client_threads = 0), "--client-threads"),
            (
                Box::new(|p| {
                    p.mode = "sd".into();
                    p.server_threads = 0
                }),
                "--server-threads",
            ),
            (Box::new(|p| p.transport = "ib".into()), "transport"),
            (Box::new(|p| p.key_size = 4), "--key-size"),
            (Box::new(|p| p.value_size = 0), "--value-size"),
            (Box::new(|p| p.get_ratio = 1.5), "--get-ratio"),
            (Box::new(|p| p.dist = "pareto".into()), "distribution"),
            (Box::new(|p| p.load_factor = 0.0), "--load-factor"),
            (Box::new(|p| p.duration = 0.0), "--duration"),
            (Box::new(|p| p.background = 1000), "--background"),
            (Box::new(|p| p.target_load = Some(2.0)), "--target-load"),
            (Box::new(|p| p.keys = Some(0)), "--keys"),
            (Box::new(|p| p.workload = Some("ycsb-e".into())), "scans"),
            (Box::new(|p| p.workload = Some("ycsb-z".into())), "ycsb-a"),
            (
                Box::new(|p| {
                    p.mode = "sd".into();
                    p.workload = Some("ycsb-f".into())
                }),
                "conditional writes",
            ),
        ];
        for (f, needle) in cases {
            let mut p = BenchParams::default();
            f(&mut p);
            let e = validate(&p).unwrap_err();
            assert!(
                e.to_string().contains(needle),
                "{e:?} should mention {needle}"
            );
        }
        assert!(validate(&BenchParams::default()).is_ok());
    }

    #[test]
    fn sizing_follows_load_factor() {
        let p = BenchParams {
            keys: Some(30_000),
            nodes: 3,
            load_factor: 0.4,
            ..BenchParams::default()
        };
        let (keys, g) = sizing(&p);
        assert_eq!(keys, 30_000);
        let lf = keys as f64 / g.total_ites() as f64;
        assert!(lf < 0.4 && lf > 0.3, "load factor {lf}");
        assert!(g.dtes_per_node >= 10_000);
        let (_, big) = sizing(&BenchParams {
            keys: Some(3_000),
            value_size: 128 << 10,
            ..BenchParams::default()
        });
        assert!(
            big.data_table_bytes() < 400 << 20,
            "spare entries sized by bytes: {}",
            big.data_table_bytes()
        );
        g.validate().unwrap();
        let (k, _) = sizing(&BenchParams {
            keys: None,
            value_size: 16384,
            ..BenchParams::default()
        });
        assert_eq!(k, 8192, "128 MiB of 16 KiB values");
        // Small values: room for 200 ms of over a million PUTs a second per node, in at most
        // 128 MiB of spare entries; the simulator keeps its own bound.
        let small = BenchParams {
            keys: Some(10_000),
            nodes: 2,
            value_size: 100,
            ..BenchParams::default()
        };
        let spare = |g: &nessie_store::Geometry| g.dtes_per_node - (5_000.0 * 1.3) as u64;
        let (_, g) = sizing(&small);
        assert_eq!(spare(&g), crate::sizing::HEADROOM_MAX_ENTRIES);
        let entry = nessie_store::DteLayout::new(small.key_size, 100).entry_size;
        assert!(spare(&g) * entry <= 128 << 20);
        let (_, sim) = crate::sizing::sizing_with_headroom(&small, 8192);
        assert_eq!(spare(&sim), 8192);
    }
}
