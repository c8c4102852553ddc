//! `nessie bench`: one benchmark run on a local multi-process cluster (and `nessie bench sweep`
//! for the presets that reproduce the paper's figures).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nessie_bench::result::{parse_value_size, BenchParams, BenchResult};
use nessie_bench::runner::{self, BenchError, RunnerOptions};
use nessie_bench::workload::Ycsb;

/// Why `nessie bench` failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchCmdError {
    #[error("--server-poll {0:?} is not spin or yield")]
    ServerPoll(String),
    #[error("cannot find the nessie binary: {0}")]
    CurrentExe(#[source] std::io::Error),
    #[error(transparent)]
    Bench(#[from] BenchError),
    #[error("drawing the timeline: {0}")]
    Plot(#[from] nessie_report::plot::PlotError),
    #[error("--plot {}: its directory does not exist", .0.display())]
    PlotDir(PathBuf),
    #[error("{}: {source}", path.display())]
    WriteJson {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Preset(#[from] nessie_report::UnknownPreset),
    #[error("preset {0} runs on the simulator: `nessie sim sweep --preset {0} --out DIR`")]
    SimPreset(nessie_report::Preset),
    #[error(transparent)]
    Sweep(#[from] nessie_report::SweepError),
    #[error("{failed} of {total} runs failed (see summary.json)")]
    RunsFailed { failed: usize, total: usize },
    #[error(transparent)]
    Fill(#[from] crate::fill_cmd::FillCmdError),
}

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub sweep: Option<BenchSub>,
    #[command(flatten)]
    pub p: ParamArgs,
    /// Benchmark the running cluster in this directory (from `nessie up`) instead of starting
    /// one; it keeps running afterwards. Its mode and node count must match --mode and --nodes.
    /// Preloading overwrites keys named key-NNNN….
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// SIGKILL node K during the measured window (at --kill-at), to measure the stall a
    /// failure causes: the result's timeline (100 ms windows) and its `fault` say how long
    /// nothing completed and when throughput came back. Meaningful with --replicas 2 or 3.
    #[arg(long, value_name = "K")]
    pub kill_node: Option<u16>,
    /// Seconds into the measured window at which --kill-node's node is killed [default: a
    /// third of --duration].
    #[arg(long, value_name = "S", requires = "kill_node")]
    pub kill_at: Option<f64>,
    /// Seconds into the measured window at which the killed node is started again (it rejoins
    /// and catches up, as `nessie node` does).
    #[arg(long, value_name = "S", requires = "kill_node")]
    pub restart_at: Option<f64>,
    /// Scale the cluster to N nodes during the measured window (at --scale-at): below
    /// --nodes, nodes N and up leave as `nessie leave` drains them; above, the cluster starts
    /// with the extra nodes standing by and they join as `nessie join` adds them (clients run
    /// on the starting nodes). The result's `scaling` says how long it took, what moved, and
    /// the GET p99.9 and stalls of the timeline around it. Needs --replicas 2 or 3.
    #[arg(long, value_name = "N", conflicts_with = "kill_node")]
    pub scale_to: Option<u16>,
    /// Seconds into the measured window at which --scale-to starts [default: a third of
    /// --duration].
    #[arg(long, value_name = "S", requires = "scale_to")]
    pub scale_at: Option<f64>,
    /// Draw the run's timeline to this PNG: throughput and GET p50/p99.9 per 100 ms window,
    /// with a scaling's or a kill's moments marked.
    #[arg(long, value_name = "PNG")]
    pub plot: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
pub enum BenchSub {
    /// Run a preset matrix, write every JSON result and render the PNG plots.
    Sweep(Box<SweepArgs>),
    /// Count the items a memory budget holds: write distinct keys until the store refuses.
    Fill(FillArgs),
}

#[derive(clap::Args)]
pub struct FillArgs {
    /// Nodes of the (in-process) Nessie cluster.
    #[arg(long, default_value_t = 2)]
    pub nodes: u32,
    /// Memory for one node's index, data and page tables: bytes, or with K/M/G = KiB/MiB/GiB, powers of 1024.
    #[arg(long, default_value = "128MiB", value_name = crate::byte_size::VALUE_NAME, value_parser = crate::byte_size::byte_size::<u64>)]
    pub memory_per_node: u64,
    /// Key size: bytes, or with K/M/G = KiB/MiB/GiB, powers of 1024.
    #[arg(long, default_value = "32", value_name = crate::byte_size::VALUE_NAME, value_parser = crate::byte_size::byte_size::<u32>)]
    pub key_size: u32,
    /// Value size (bytes, or with K/M/G = KiB/MiB/GiB, powers of 1024), or MIN..MAX: sizes spread evenly over the range.
    #[arg(long, default_value = "64..4096", value_name = "BYTES|MIN..MAX", value_parser = parse_value_size)]
    pub value_size: (Option<u32>, u32),
    /// Index load factor when the data tables are full.
    #[arg(long, default_value_t = 0.5)]
    pub load_factor: f64,
    /// Fill the memcached at HOST:PORT instead (start it with -M, so that it refuses rather
    /// than evicts, and -m for its memory).
    #[arg(long)]
    pub memcached: Option<String>,
    /// Write the outcome as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct SweepArgs {
    /// Preset: contention, values, energy, optimizations or quick.
    #[arg(long)]
    pub preset: String,
    /// Directory for the JSON results and plots.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub p: ParamArgs,
}

#[derive(clap::Args, Clone)]
pub struct ParamArgs {
    /// Protocol: cd (Nessie), sd (server-driven), hy (hybrid), pilaf (Pilaf, ATC 2013).
    #[arg(long, default_value = "cd")]
    pub mode: String,
    /// Node processes.
    #[arg(long, default_value_t = 3)]
    pub nodes: u16,
    /// Client worker threads per node.
    #[arg(long, default_value_t = 1)]
    pub client_threads: u16,
    /// Server worker threads per node (sd, hy, pilaf).
    #[arg(long, default_value_t = 1)]
    pub server_threads: u16,
    /// Transport: shm or tcp.
    #[arg(long, default_value = "shm")]
    pub transport: String,
    /// Key size: bytes, or with K/M/G = KiB/MiB/GiB, powers of 1024.
    #[arg(long, default_value = "128", value_name = crate::byte_size::VALUE_NAME, value_parser = crate::byte_size::byte_size::<u32>)]
    pub key_size: u32,
    /// Value size (bytes, or with K/M/G = KiB/MiB/GiB, powers of 1024), or MIN..MAX for sizes uniform in that range.
    #[arg(long, default_value = "16384", value_name = "BYTES|MIN..MAX", value_parser = parse_value_size)]
    pub value_size: (Option<u32>, u32),
    /// Fraction of GETs (the rest are PUTs).
    #[arg(long, default_value_t = 0.9)]
    pub get_ratio: f64,
    /// Key distribution: uniform or zipf:THETA.
    #[arg(long, default_value = "uniform")]
    pub dist: String,
    /// A YCSB core workload, with YCSB's parameters (Zipf 0.99; "latest" for D): ycsb-a
    /// (50% reads, 50% updates), ycsb-b (95/5), ycsb-c (reads), ycsb-d (95% reads of recent
    /// keys, 5% inserts), ycsb-f (50% reads, 50% read-modify-writes; cd only). E is made of
    /// scans, which a hash store does not have. Sets the mix and the distribution.
    #[arg(long, conflicts_with_all = ["get_ratio", "dist"])]
    pub workload: Option<String>,
    /// Keys (all preloaded) [default: 128 MiB of values, 1,000..200,000 keys].
    #[arg(long)]
    pub keys: Option<u64>,
    /// Index load factor.
    #[arg(long, default_value_t = 0.4)]
    pub load_factor: f64,
    /// Measured seconds.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Warm-up seconds before the measured window.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Background CPU-hog processes during the run.
    #[arg(long, default_value_t = 0)]
    pub background: u16,
    /// Open loop (Poisson arrivals) at this fraction of the measured maximum throughput.
    #[arg(long)]
    pub target_load: Option<f64>,
    /// Pin client threads to cores.
    #[arg(long)]
    pub pin: bool,
    /// Operations each client thread keeps in flight (closed loop only; 1 to 64): the
    /// non-blocking client, one coroutine per operation over the thread's endpoint.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub inflight: u16,
    #[command(flatten)]
    pub optimizations: crate::optim_args::OptimizationArgs,
    /// Seed of the workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Idle server threads (sd, hy): spin (the paper's dedicated cores) or yield (shared cores).
    #[arg(long, default_value = "yield")]
    pub server_poll: String,
    #[command(flatten)]
    pub fabric: crate::fabric_tuning::FabricTuningArgs,
    /// Milliseconds a freed extent (pilaf) waits before reuse [default: the expiry period];
    /// 0 reuses at once, as the paper does (only the CRC then catches a reader of a reused extent).
    #[arg(long)]
    pub pilaf_reuse_delay_ms: Option<u64>,
    /// Copies of every node's tables (cd; 1 to 3): the cost of replication. More than one
    /// starts a local etcd for membership, which replication needs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    pub replicas: u8,
    /// Eviction policy of the cluster (cd; Redis's names, as `nessie up --eviction`): under
    /// allkeys-lru/lfu and volatile-lru/lfu GETs keep the entries' access words.
    #[arg(long, value_name = "POLICY", default_value = "noeviction")]
    pub eviction: nessie_protocols::Eviction,
    /// Write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl ParamArgs {
    pub fn params(&self) -> BenchParams {
        let o = self.optimizations.optimizations();
        // A YCSB workload sets both: the result records what ran.
        let (get_ratio, dist) = match self.workload.as_deref().map(str::parse::<Ycsb>) {
            Some(Ok(w)) => (w.mix().0, w.dist().to_string()),
            _ => (self.get_ratio, self.dist.clone()),
        };
        BenchParams {
            mode: self.mode.clone(),
            nodes: self.nodes,
            client_threads: self.client_threads,
            server_threads: self.server_threads,
            transport: self.transport.clone(),
            key_size: self.key_size,
            value_size: self.value_size.1,
            value_size_min: self.value_size.0,
            get_ratio,
            dist,
            keys: self.keys,
            load_factor: self.load_factor,
            duration: self.duration,
            warmup: self.warmup,
            background: self.background,
            target_load: self.target_load,
            pin: self.pin,
            filter_bits: o.filter_bits,
            cache: o.cache,
            previous_versions: o.previous_versions,
            multi_read: o.multi_read,
            seed: self.seed,
            replicas: self.replicas,
            workload: self.workload.clone(),
            eviction: self.eviction.name().to_string(),
            inflight: self.inflight,
        }
    }
}

pub fn runner_options(p: &ParamArgs) -> Result<RunnerOptions, BenchCmdError> {
    if !matches!(p.server_poll.as_str(), "spin" | "yield") {
        return Err(BenchCmdError::ServerPoll(p.server_poll.clone()));
    }
    Ok(RunnerOptions {
        binary: std::env::current_exe().map_err(BenchCmdError::CurrentExe)?,
        dir: None,
        server_poll: p.server_poll.clone(),
        pilaf_reuse_delay_ms: p.pilaf_reuse_delay_ms,
        cluster: None,
        progress_spin_us: p.fabric.progress_spin_us,
        direct_loopback: !p.fabric.no_direct_loopback,
        direct_peers: !p.fabric.no_direct_peers,
        wait_spin_us: p.fabric.wait_spin_us,
        fault: None,
        scale: None,
    })
}

/// A bar over a sweep's runs, on a terminal.
pub(crate) fn sweep_bar(total: usize) -> indicatif::ProgressBar {
    let pb = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::new(total as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    pb.set_style(
        indicatif::ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap(),
    );
    pb
}

/// A spinner line on a terminal: the phase and elapsed time.
pub fn progress_bar(label: &str) -> indicatif::ProgressBar {
    let pb = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::new_spinner()
    } else {
        indicatif::ProgressBar::hidden()
    };
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {prefix} {msg}")
            .unwrap(),
    );
    pb.set_prefix(label.to_string());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

pub fn print_result(r: &BenchResult) {
    let p = &r.params;
    let mix = match &p.workload {
        // PUT latencies below are its updates, inserts and read-modify-writes.
        Some(w) => match w.parse::<Ycsb>() {
            Ok(y) => format!("{w} ({}, {})", y.describe(), p.dist),
            Err(_) => w.clone(),
        },
        None => format!("{:.0}% GET, {}", p.get_ratio * 100.0, p.dist),
    };
    println!(
        "{} | {} nodes x {} client threads{}{} | {} | {} B values, {} | {} keys | {} background",
        r.mode,
        p.nodes,
        p.client_threads,
        match p.inflight {
            0 | 1 => String::new(),
            n => format!(" x {n} in flight"),
        },
        if r.mode == "cd" {
            String::new()
        } else {
            format!(" + {} server threads", p.server_threads)
        },
        p.transport,
        p.value_size_label(),
        mix,
        p.keys.unwrap_or(0),
        p.background
    );
    let kinds: Vec<String> = r
        .error_kinds
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!(
        "  throughput   {:>12.0} ops/s   goodput {:>9.1} MiB/s   errors {}{}",
        r.ops_per_sec,
        r.goodput_bytes_per_sec / (1 << 20) as f64,
        r.errors,
        if kinds.is_empty() {
            String::new()
        } else {
            format!(" ({})", kinds.join(", "))
        }
    );
    if let Some(o) = r.offered_ops_per_sec {
        println!("  offered      {o:>12.0} ops/s (open loop)");
    }
    for (name, l, n) in [
        ("GET", &r.latency_us.get, r.ops.get),
        ("PUT", &r.latency_us.put, r.ops.put),
    ] {
        if n > 0 {
            println!("  {name} latency  mean {:>8.1}  p50 {:>8.1}  p99 {:>8.1}  p99.9 {:>8.1} µs  ({n} ops)", l.mean, l.p50, l.p99, l.p999);
        }
    }
    // The simulator counts the bytes its NICs sent, headers included.
    let sent = if r.params.transport == "sim" {
        "on the wire"
    } else {
        "remote"
    };
    println!(
        "  fabric/op    GET {:.2} ops {:.0} B   PUT {:.2} ops {:.0} B   (window: {} fabric ops, {} B {sent}, {} B local)",
        r.fabric.get.ops_mean, r.fabric.get.bytes_mean, r.fabric.put.ops_mean, r.fabric.put.bytes_mean,
        r.fabric.total_ops, r.fabric.total_bytes, r.fabric.local_bytes
    );
    print_cpu(r);
    print_timeline(r);
    if r.mode == "pilaf" {
        // Pilaf's client counts GET passes that failed a checksum as aborts (`ModeClient::aborts_retries`).
        println!(
            "  checksum retries {} ({:.5} per GET)  retried GET passes {}",
            r.aborts,
            r.aborts as f64 / r.ops.get.max(1) as f64,
            r.retries
        );
    } else {
        println!("  aborts {}  retries {}", r.aborts, r.retries);
    }
}

/// The timeline and fault lines of [`print_result`].
fn print_timeline(r: &BenchResult) {
    let t = &r.timeline;
    if t.is_empty() {
        return;
    }
    let mut sorted = t.ops.clone();
    sorted.sort_unstable();
    println!(
        "  timeline     {} windows of {:.0} ms: ops/window min {} median {} max {}; longest stall {:.0} ms (no operation completed)",
        t.ops.len(),
        t.window_ms,
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1],
        t.longest_stall(0) as f64 * t.window_ms
    );
    if let Some(f) = &r.fault {
        println!(
            "  fault        node {} SIGKILLed at {:.1} s{}: {}; longest stall {:.0} ms",
            f.node,
            f.killed_at_s,
            f.restarted_at_s
                .map(|s| format!(", restarted at {s:.1} s"))
                .unwrap_or_default(),
            match (f.degraded_from_s, f.recovered_at_s) {
                (None, _) => "throughput never fell below half its median".to_string(),
                (Some(from), Some(to)) => format!(
                    "below half the median ({:.0} ops/window) for {:.0} ms between {from:.1} s and {to:.1} s",
                    f.ops_per_window_before, f.degraded_ms
                ),
                (Some(from), None) => format!(
                    "below half the median ({:.0} ops/window) from {from:.1} s to the end of the run",
                    f.ops_per_window_before
                ),
            },
            f.stall_ms
        );
    }
}

/// The CPU lines of [`print_result`]: by thread role, and for an open loop the clients' waits.
fn print_cpu(r: &BenchResult) {
    let c = &r.cpu_seconds;
    println!(
        "  CPU          client {:.2} s  server {:.2} s  progress {:.2} s  total {:.2} s  = {:.2} µs/op, {:.2} busy cores",
        c.client, c.server, c.progress, c.total,
        c.total * 1e6 / r.ops.all.max(1) as f64,
        c.total / r.params.duration
    );
    if r.offered_ops_per_sec.is_some() {
        println!(
            "  CPU          of which waiting for arrivals (open loop) {:.2} s; the store's {:.2} µs/op",
            c.pacing,
            (c.total - c.pacing) * 1e6 / r.ops.all.max(1) as f64
        );
    }
}

pub fn run(a: BenchArgs) -> Result<(), BenchCmdError> {
    match a.sweep {
        Some(BenchSub::Sweep(s)) => return sweep(*s),
        Some(BenchSub::Fill(f)) => return Ok(crate::fill_cmd::run(f)?),
        None => {}
    }
    let p = a.p.params();
    let mut opts = runner_options(&a.p)?;
    opts.cluster = a.cluster.clone();
    opts.fault = a.kill_node.map(|node| runner::FaultPlan {
        node,
        kill_at_s: a.kill_at.unwrap_or(p.duration / 3.0),
        restart_at_s: a.restart_at,
    });
    opts.scale = a.scale_to.map(|to| nessie_bench::scale::ScalePlan {
        to,
        at_s: a.scale_at.unwrap_or(p.duration / 3.0),
    });
    // Refused before the run, not after it.
    if let Some(plot) = &a.plot {
        let dir = plot.parent().filter(|d| !d.as_os_str().is_empty());
        if dir.is_some_and(|d| !d.is_dir()) {
            return Err(BenchCmdError::PlotDir(plot.clone()));
        }
    }
    let pb = progress_bar("bench");
    let t = Instant::now();
    let r = runner::run(&p, &opts, &mut |phase| pb.set_message(phase.to_string()));
    pb.finish_and_clear();
    let r = r?;
    print_result(&r);
    eprintln!("(run took {:.1} s)", t.elapsed().as_secs_f64());
    if let Some(path) = &a.p.json {
        std::fs::write(path, serde_json::to_string_pretty(&r).expect("serialises")).map_err(
            |source| BenchCmdError::WriteJson {
                path: path.clone(),
                source,
            },
        )?;
    }
    if let Some(path) = &a.plot {
        nessie_report::timeline_plot::timeline_figure(path, &r)?;
        eprintln!("timeline drawn to {}", path.display());
    }
    Ok(())
}

fn sweep(s: SweepArgs) -> Result<(), BenchCmdError> {
    use nessie_report::{run_preset, summary_table, Preset, RunError, RunSpec};
    let preset: Preset = s.preset.parse()?;
    if preset.is_sim() {
        return Err(BenchCmdError::SimPreset(preset));
    }
    let base = s.p.params();
    let opts = runner_options(&s.p)?;
    let specs = preset.runs(&base);
    let total = specs.len();
    println!(
        "sweep {preset}: {total} runs, results in {}",
        s.out.display()
    );
    let pb = sweep_bar(total);
    let pb2 = pb.clone();
    // A failed run is recorded (as text, in summary.json) and the sweep goes on.
    let mut runner = move |p: &BenchParams| -> Result<BenchResult, RunError> {
        let label = format!(
            "{} {} B {:.0}% GET bg={}",
            p.mode,
            p.value_size_label(),
            p.get_ratio * 100.0,
            p.background
        );
        runner::run(p, &opts, &mut |phase| {
            pb2.set_message(format!("{label}: {phase}"))
        })
        .map_err(RunError::from)
    };
    let mut progress = |i: usize, _n: usize, spec: &RunSpec| {
        pb.set_position(i.saturating_sub(1) as u64);
        pb.set_message(spec.stem.clone());
        if pb.is_hidden() {
            eprintln!("[{i}/{total}] {}", spec.stem);
        }
    };
    let out = run_preset(preset, &base, &s.out, &mut runner, &mut progress);
    pb.finish_and_clear();
    let out = out?;
    let results: Vec<BenchResult> = out.results.iter().map(|(_, r)| r.clone()).collect();
    println!("{}", summary_table(&results));
    for f in &out.failures {
        eprintln!("failed: {f:?}");
    }
    println!("plots:");
    for p in &out.plots {
        println!("  {}", p.display());
    }
    if let Some(e) = &out.plot_error {
        eprintln!("plotting failed: {e}");
    }
    println!(
        "{} results, {} failures; all JSON in {}",
        results.len(),
        out.failures.len(),
        s.out.display()
    );
    if out.failures.is_empty() {
        Ok(())
    } else {
        Err(BenchCmdError::RunsFailed {
            failed: out.failures.len(),
            total,
        })
    }
}

/// Spin forever: a background CPU hog for contention experiments.
pub fn burn() -> ! {
    let mut x = 0u64;
    loop {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}
