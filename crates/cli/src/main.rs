//! `nessie`: the command-line tool.

mod bench_cmd;
mod byte_size;
mod fabric_bench;
mod fabric_tuning;
mod fill_cmd;
mod optim_args;
mod sim_check;
mod sim_cmd;
mod sim_sweep;

use std::io::{self, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use nessie_bench::workload::KeyDist;
use nessie_cluster::admin::{Request, Response};
use nessie_cluster::config::{ClusterConfig, Transport};
use nessie_cluster::{process, route};
use nessie_testkit::demo::{self, DemoSpec};

#[derive(Parser)]
#[command(
    name = "nessie",
    version,
    about = "Nessie: a client-driven, in-memory distributed key-value store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of the largest variant (the benchmark's flags) is no cost.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Start a local cluster of node processes in the background (shared memory or TCP).
    Up(UpArgs),
    /// Stop the local cluster and clean up its processes and sockets.
    Down(DirArg),
    /// Show each node's state: process, table fill, fabric counters.
    Status(StatusArgs),
    /// Store a value: `nessie put KEY VALUE`, `KEY @FILE`, `KEY --value-file FILE` or `KEY --stdin`
    /// (`@@…` stores a value that starts with `@`).
    Put(PutArgs),
    /// Read a value (to stdout, or -o FILE). Exit code 1 if the key is absent.
    Get(GetArgs),
    /// Delete a key.
    Del(KeyArgs),
    /// Move one index partition to a new chain of copies while the cluster serves (the
    /// per-ITE handover: no pause); with --wait, until it is over.
    Migrate(MigrateArgs),
    /// Drain a node out of the cluster while it serves: the copies of its tables move to spare
    /// slots of other nodes and its index partitions to other nodes (the balancer); then it
    /// stops. With --cancel, a leaving node stays after all (and is given partitions again),
    /// unless its read cut-over (named just before it stops) has been.
    Leave(LeaveArgs),
    /// Start the next standby node (`nessie up --standby N`) and add it to the running cluster;
    /// prints its id once it is up. The balancer then gives it its share of index partitions.
    Join(JoinArgs),
    /// Run one node process (what `nessie up` starts; use it directly across real hosts).
    Node(NodeArgs),
    /// Latency of one-sided READ/WRITE/CAS between two processes over UCX (optionally beside ucx_perftest).
    FabricBench(fabric_bench::FabricBenchArgs),
    #[command(hide = true)]
    FabricBenchTarget(fabric_bench::TargetArgs),
    /// Benchmark a local multi-process cluster (cd, sd, hy or pilaf) and report throughput, latency,
    /// fabric work and CPU time; `nessie bench sweep` runs the paper's experiment presets.
    Bench(bench_cmd::BenchArgs),
    /// Spin a CPU core forever (background load for contention experiments).
    #[command(hide = true)]
    Burn,
    /// Run the benchmark's workload on a simulated cluster in virtual time (docs/sim.md).
    Sim(sim_cmd::SimArgs),
    /// Run a demo workload on an in-process cluster and print throughput, latencies and fabric
    /// counters (optionally checking the whole history for linearizability).
    Demo(DemoArgs),
}

#[derive(clap::Args)]
struct DirArg {
    /// Cluster directory (config, logs, pid files, admin sockets) [default: $NESSIE_DIR, else
    /// $XDG_RUNTIME_DIR/nessie, else /tmp/nessie-UID].
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl DirArg {
    /// The cluster directory, absolute. Symlinks are not resolved: `up` refuses a directory
    /// that is a symlink rather than following it somewhere else.
    fn dir(&self) -> PathBuf {
        let d = self
            .dir
            .clone()
            .unwrap_or_else(nessie_cluster::process::default_dir);
        std::path::absolute(&d).unwrap_or(d)
    }
}

#[derive(clap::Args)]
struct UpArgs {
    #[command(flatten)]
    dir: DirArg,
    /// Node processes to start.
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// More nodes that cluster.toml lists but `up` does not start: each joins later, while the
    /// cluster serves (`nessie join`), up to --nodes + --standby. Needs --replicas 2 or 3 and
    /// spare slots for the copies they would hold (--spare-copies).
    #[arg(long, default_value_t = 0, value_name = "N")]
    standby: u16,
    /// Transport between the processes: shm (shared memory), tcp (loopback), auto (UCX's choice).
    #[arg(long, default_value = "shm")]
    transport: Transport,
    /// Largest key: bytes, or with K/M/G = KiB/MiB/GiB, powers of 1024.
    #[arg(long, default_value = "128", value_name = byte_size::VALUE_NAME, value_parser = byte_size::byte_size::<u32>)]
    key_max: u32,
    /// Largest value one data table entry holds (the largest size class): bytes, or with
    /// K/M/G = KiB/MiB/GiB, powers of 1024. Longer items (up to --item-max) are stored in
    /// chunks of this size.
    #[arg(long, default_value = "16384", value_name = byte_size::VALUE_NAME, value_parser = byte_size::byte_size::<u32>)]
    value_max: u32,
    /// Longest item (memcached's -I; at most 512M, Redis's limit). Items longer than
    /// --value-max are stored as chunks behind a manifest. Mode cd (the others keep items to
    /// --value-max). Written to [cache] item_max. A --value-max above it, with no
    /// --item-max, is taken as the item limit [default: 1M].
    #[arg(long, value_name = byte_size::VALUE_NAME, value_parser = byte_size::byte_size::<u64>)]
    item_max: Option<u64>,
    /// How old, in ms, the chunks of a large item that no manifest names (a writer died, or a
    /// small write or plain delete replaced it) must be before the reclaimer deletes them;
    /// above the lease TTL. Default: 60000, or twice the lease TTL if that is longer. Written
    /// to [cache] orphan_grace_ms.
    #[arg(long, value_name = "MS")]
    orphan_grace_ms: Option<u64>,
    /// Index table entries per node, instead of a --memory-per-node budget [default with
    /// --dtes-per-node: 65536].
    #[arg(long)]
    ites_per_node: Option<u64>,
    /// Data table room per node, in entries of the largest size class (values of --value-max
    /// bytes); smaller values fit more. Instead of a --memory-per-node budget [default with
    /// --ites-per-node: 16384].
    #[arg(long)]
    dtes_per_node: Option<u64>,
    /// Memory for one node's index, data and page tables (bytes, or with K/M/G = KiB/MiB/GiB,
    /// powers of 1024), as memcached's -m: sizes them from one budget, the index for items of
    /// up to 512 B at load factor 0.5, and says what each size class gets. With --replicas R
    /// a node holds R such sets of tables.
    #[arg(long, value_name = byte_size::VALUE_NAME, value_parser = byte_size::byte_size::<u64>, conflicts_with_all = ["ites_per_node", "dtes_per_node"], default_value = "64M")]
    memory_per_node: u64,
    /// Client threads (workers) per node process, shared by its front ends and admin socket.
    #[arg(long, visible_alias = "workers", value_name = "N", default_value_t = 2)]
    client_threads: u16,
    /// Expiry period in milliseconds [default: 1000].
    #[arg(long)]
    expiry_ms: Option<u64>,
    /// Allowance for clock skew between nodes, in milliseconds [default: 10, at most half the expiry].
    #[arg(long)]
    clock_margin_ms: Option<u64>,
    /// Seconds to wait for the nodes to become ready.
    #[arg(long, default_value_t = 60)]
    ready_timeout: u64,
    /// Protocol: cd (Nessie, client-driven), sd (server-driven baseline), hy (hybrid baseline),
    /// pilaf (Pilaf, ATC 2013: client GETs verified by CRC64, server-driven writes).
    #[arg(long, default_value = "cd")]
    mode: String,
    /// Server threads per node (sd, hy and pilaf).
    #[arg(long, default_value_t = 1)]
    server_threads: u16,
    /// Idle server threads: spin (dedicated cores) or yield (shared cores).
    #[arg(long, default_value = "yield")]
    server_poll: String,
    #[command(flatten)]
    fabric: fabric_tuning::FabricTuningArgs,
    /// Huge pages for the nodes' tables: off, try (when enough are reserved in vm.nr_hugepages), require.
    #[arg(long, default_value = "try")]
    huge_pages: nessie_fabric_ucx::HugePages,
    /// etcd client URL (http://HOST:PORT, or https:// for TLS) of an existing etcd for membership, instead of the
    /// single-member etcd on loopback that `up` starts by default (and `down` stops).
    #[arg(long, value_name = "URL", conflicts_with = "no_etcd")]
    etcd: Option<String>,
    /// The user to authenticate to the --etcd as, when its auth is enabled (`etcdctl auth
    /// enable`); with --etcd-password-file. Written to [membership] etcd_user
    #[arg(
        long,
        value_name = "USER",
        requires = "etcd",
        requires = "etcd_password_file"
    )]
    etcd_user: Option<String>,
    /// The etcd user's password, read from the first line of FILE (not from the command line,
    /// where other users could see it). Written to [membership] etcd_password in cluster.toml
    /// (mode 0600); sent to etcd in clear over http:// (encrypted over https://)
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    etcd_password_file: Option<PathBuf>,
    /// PEM CA certificates that signed the --etcd's server certificate (an https:// etcd;
    /// without it, the public roots). Written to [membership] etcd_ca
    #[arg(long, value_name = "FILE", requires = "etcd")]
    etcd_ca: Option<PathBuf>,
    /// PEM client certificate to present to the --etcd (its --client-cert-auth); with
    /// --etcd-key and --etcd-ca. Written to [membership] etcd_cert
    #[arg(long, value_name = "FILE", requires = "etcd_key", requires = "etcd_ca")]
    etcd_cert: Option<PathBuf>,
    /// PEM private key of --etcd-cert, readable by its owner only (mode 0600). Written to
    /// [membership] etcd_key
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// Run without membership: no etcd, no failure detection.
    #[arg(long)]
    no_etcd: bool,
    /// Seconds without a lease refresh after which a node is declared failed (etcd raises
    /// values below its own minimum, 3 s by default).
    #[arg(long, default_value_t = nessie_membership::DEFAULT_LEASE_TTL_S)]
    lease_ttl: u64,
    /// Copies of every node's index, data and page tables, on consecutive nodes (1 to 3): with 2, any
    /// one node may fail without losing data. Needs membership (not --no-etcd) and --mode cd.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    replicas: u8,
    /// Spare slots per node, each as large as one node's tables, that the copies of a node
    /// failed for longer than --replace-after move to, so that R copies exist again without it
    /// (needs --replicas 2 or 3, and a node without a copy of each moved partition). A slot
    /// takes memory only once a copy moves into it, except on hugetlb pages and RDMA [default:
    /// 1 with --replicas 2 or 3 and more nodes than copies, else 0]
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=nessie_protocols::replica::MAX_SPARE_COPIES as i64))]
    spare_copies: Option<u8>,
    /// Milliseconds a freed extent (pilaf) waits before reuse [default: the expiry period]; 0
    /// reuses at once, as the paper does.
    #[arg(long)]
    pilaf_reuse_delay_ms: Option<u64>,
    /// Seconds a node must have been failed before its copies move to other nodes (at least
    /// three lease TTLs: a node restarted sooner rejoins instead).
    #[arg(long, value_name = "SECONDS", default_value_t = nessie_membership::DEFAULT_REPLACE_AFTER_S)]
    replace_after: u64,
    /// Do not move index partitions automatically (re-creating a failed node's copies after
    /// --replace-after, balancing a node that came back); only `nessie migrate` moves them.
    #[arg(long)]
    no_rebalance: bool,
    /// Serve the memcached text protocol: node K listens on BASE + K (every classic command,
    /// cas, incr and flush_all included; see docs/frontends.md).
    #[arg(long, value_name = "BASE")]
    memcached_port: Option<u16>,
    /// Serve the Redis protocol (RESP2/RESP3): node K listens on BASE + K (strings, counters,
    /// expiry, conditional SET, the key-space and connection commands; see docs/frontends.md).
    #[arg(long, value_name = "BASE")]
    resp_port: Option<u16>,
    /// Serve Prometheus metrics: node K answers http://BIND:BASE+K/metrics (operations by kind
    /// and result, latency histograms, fabric operations and bytes, table fill, front-end
    /// connections, membership).
    #[arg(long, value_name = "BASE")]
    metrics_port: Option<u16>,
    /// The Redis front end's password, read from the first line of FILE (not from the command
    /// line, where other users could see it): clients must AUTH with it first.
    #[arg(long, value_name = "FILE", requires = "resp_port")]
    resp_password_file: Option<PathBuf>,
    /// The address the front ends listen on. Protected mode refuses one that is neither
    /// loopback, private nor link-local (0.0.0.0 too): see --no-protected-mode.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    bind: String,
    /// Let the nodes listen on public addresses (a --bind that is neither loopback, private
    /// nor link-local). Nothing after bootstrap is authenticated or encrypted: use it only
    /// behind another boundary (a firewall, a VPN). Written to [cluster] protected_mode.
    #[arg(long)]
    no_protected_mode: bool,
    /// What a full store does, by Redis's maxmemory-policy names: noeviction refuses writes
    /// (as Redis's default; memcached -M); allkeys-lru, allkeys-lfu and allkeys-random evict
    /// the least recently read, least frequently read or a random item of a sample of those in
    /// the writer's way (allkeys-lru is closest to memcached's default); volatile-lru,
    /// volatile-lfu, volatile-random and volatile-ttl evict only items with an expiry
    /// (volatile-ttl: the soonest to expire). Mode cd. Written to [cache] eviction.
    #[arg(long, value_name = "POLICY", default_value = "noeviction")]
    eviction: nessie_protocols::Eviction,
    /// Entries an eviction samples per victim, 1 to 64 (Redis's maxmemory-samples): more
    /// choose victims closer to true LRU or LFU, for more READs per eviction. Written to
    /// [cache] eviction_samples.
    #[arg(long, value_name = "N",
          default_value_t = nessie_protocols::config::DEFAULT_EVICTION_SAMPLES,
          value_parser = clap::value_parser!(u8).range(1..=nessie_protocols::config::MAX_EVICTION_SAMPLES as i64))]
    eviction_samples: u8,
    /// Event loops (threads) per front end per node, each serving many connections (one, as
    /// Redis has, suits a machine with few cores).
    #[arg(long, value_name = "N", default_value_t = nessie_cluster::config::DEFAULT_FRONTEND_THREADS)]
    frontend_threads: u16,
    /// Operations each front-end event loop runs at once for a pipelined batch's plain GETs
    /// and SETs (client-driven mode); 1 runs every command on its own. More helps where
    /// fabric operations wait long (a real network) and CPU is spare, not over shm.
    #[arg(long, value_name = "N", default_value_t = nessie_cluster::config::DEFAULT_FRONTEND_INFLIGHT,
          value_parser = clap::value_parser!(u16).range(1..=nessie_cluster::config::MAX_FRONTEND_INFLIGHT as i64))]
    frontend_inflight: u16,
    /// Extra argument for every node process (repeatable; for tests, e.g. --node-arg=--inject-delay=1,0.02,20000).
    #[arg(long = "node-arg", hide = true)]
    node_args: Vec<String>,
    #[command(flatten)]
    optimizations: optim_args::OptimizationArgs,
}

#[derive(clap::Args)]
struct StatusArgs {
    #[command(flatten)]
    dir: DirArg,
    /// Print the raw JSON reports.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct KeyArgs {
    #[command(flatten)]
    dir: DirArg,
    /// Node whose client performs the operation, with no fallback [default: the key's home node
    /// (xxh3 hash of the key modulo the node count), then the next ones if it is down or busy].
    #[arg(long)]
    node: Option<u16>,
    /// The key (any UTF-8 text up to the cluster's key_max bytes).
    key: String,
}

#[derive(clap::Args)]
#[command(
    group = clap::ArgGroup::new("source").required(true).args(["value", "value_file", "stdin"]),
    override_usage = "nessie put [OPTIONS] KEY <VALUE | --value-file FILE | --stdin>"
)]
struct PutArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// The value. `@FILE` reads it from FILE and `@-` from stdin; `@@…` is the literal value
    /// `@…` (one leading `@` removed).
    value: Option<String>,
    /// Read the value from FILE (any bytes; nothing in its name is special).
    #[arg(long, value_name = "FILE")]
    value_file: Option<PathBuf>,
    /// Read the value from standard input.
    #[arg(long)]
    stdin: bool,
}

#[derive(clap::Args)]
struct MigrateArgs {
    #[command(flatten)]
    dir: DirArg,
    /// The index partition to move (0 up to `index_partitions` of `nessie status --json`).
    #[arg(long)]
    partition: u16,
    /// The nodes of the new chain, primary first, comma separated: as many distinct nodes as
    /// the cluster keeps copies (`--replicas`).
    #[arg(long, value_delimiter = ',', required = true)]
    to: Vec<u16>,
    /// Wait until the migration is over, printing its progress.
    #[arg(long)]
    wait: bool,
    /// With --wait, give up after this many seconds.
    #[arg(long, default_value_t = 120, value_name = "SECONDS", requires = "wait")]
    timeout: u64,
}

#[derive(clap::Args)]
struct LeaveArgs {
    #[command(flatten)]
    dir: DirArg,
    /// The node to drain.
    #[arg(long)]
    node: u16,
    /// The node stays after all: it is no longer leaving.
    #[arg(long, conflicts_with = "keep_running")]
    cancel: bool,
    /// Do not stop the node once it has drained.
    #[arg(long)]
    keep_running: bool,
    /// Give up waiting after this many seconds (the node stays leaving; `--cancel` undoes).
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    timeout: u64,
}

#[derive(clap::Args)]
struct JoinArgs {
    #[command(flatten)]
    dir: DirArg,
    /// Give up waiting after this many seconds (the node keeps running and may still join).
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    timeout: u64,
    /// Print only the new node's id on stdout (progress goes to stderr either way).
    #[arg(long)]
    quiet: bool,
    /// Start this many standby nodes at once; they join side by side (a scale-out by several
    /// nodes then waits one join, not one per node).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    count: u16,
}

#[derive(clap::Args)]
struct GetArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// Write the value to FILE instead of stdout.
    #[arg(short = 'o', long)]
    output: Option<PathBuf>,
}

#[derive(clap::Args)]
struct NodeArgs {
    /// The cluster configuration file.
    #[arg(long)]
    config: PathBuf,
    /// This node's id.
    #[arg(long)]
    id: u16,
    /// Inject random delays around fabric operations: SEED,PROBABILITY,MAX_NS (tests only).
    #[arg(long, hide = true)]
    inject_delay: Option<String>,
    /// Mutation (tests only): the front ends' batches break same-key order.
    #[arg(long, hide = true)]
    mutation_unordered_batches: bool,
}

#[derive(clap::Args)]
struct DemoArgs {
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    nodes: u32,
    /// Client threads in all (spread over the nodes).
    #[arg(long, visible_alias = "threads", value_name = "N", default_value_t = 4)]
    client_threads: usize,
    /// Keys in the key space (all preloaded).
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Value size: bytes, or with K/M/G = KiB/MiB/GiB, powers of 1024.
    #[arg(long, default_value = "1024", value_name = byte_size::VALUE_NAME, value_parser = byte_size::byte_size::<usize>)]
    value_size: usize,
    /// Fraction of GETs (the rest are PUTs).
    #[arg(long, default_value_t = 0.9)]
    get_ratio: f64,
    /// Key distribution: uniform or zipf:THETA.
    #[arg(long, default_value = "zipf:0.99")]
    dist: KeyDist,
    /// Seconds to run.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Record every operation and check the history for linearizability.
    #[arg(long)]
    check: bool,
}

/// Why a command failed (printed as `nessie: error: …`, exit code 2).
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("--duration {0} is not in (0, 3600] seconds")]
    DemoDuration(f64),
    #[error("{0}")]
    Usage(String),
    #[error("--inject-delay {0:?}: expected SEED,PROBABILITY,MAX_NS")]
    InjectDelay(String),
    #[error("cannot find the nessie binary: {0}")]
    CurrentExe(io::Error),
    #[error("no cluster in {} (start one with `nessie up`, or pass --dir)", .0.display())]
    NoCluster(PathBuf),
    #[error("the key is empty")]
    EmptyKey,
    #[error("key of {len} bytes exceeds the cluster's key_max of {max} bytes")]
    KeyTooLong { len: usize, max: u32 },
    #[error("value of {len} bytes exceeds the cluster's item_max of {max} bytes")]
    ValueTooLong { len: usize, max: u64 },
    /// A value source (file or stdin) longer than the item limit.
    #[error("{what} holds more than the cluster's item_max of {max} bytes")]
    InputTooLong { what: String, max: u64 },
    #[error("reading {what}: {err}")]
    Read { what: String, err: io::Error },
    /// A file named on the command line could not be opened, written or resolved.
    #[error("{}: {err}", path.display())]
    File { path: PathBuf, err: io::Error },
    /// Writing the value of `nessie get` to stdout.
    #[error("{0}")]
    Stdout(io::Error),
    #[error("unexpected reply {0:?}")]
    UnexpectedReply(Response),
    /// Starting, stopping or inspecting the node processes.
    #[error(transparent)]
    Process(#[from] nessie_cluster::process::ProcessError),
    /// The cluster's configuration file.
    #[error(transparent)]
    Config(#[from] nessie_cluster::config::ConfigError),
    /// Reaching the key's node.
    #[error(transparent)]
    Route(#[from] nessie_cluster::route::RouteError),
    /// Running a node process.
    #[error(transparent)]
    Node(#[from] nessie_cluster::node::NodeError),
    /// The delay injection settings.
    #[error(transparent)]
    Delay(#[from] nessie_fabric::ConfigError),
    /// Sizes that make no cluster (`--memory-per-node`).
    #[error(transparent)]
    Geometry(#[from] nessie_store::GeometryError),
    #[error(transparent)]
    Demo(#[from] nessie_testkit::demo::DemoError),
    #[error(transparent)]
    Bench(#[from] bench_cmd::BenchCmdError),
    #[error(transparent)]
    FabricBench(#[from] fabric_bench::FabricBenchError),
}

fn file(path: &Path) -> impl FnOnce(io::Error) -> CliError + '_ {
    move |err| CliError::File {
        path: path.to_path_buf(),
        err,
    }
}

fn main() -> ExitCode {
    // Warnings and errors by default (a node's go to its log file); `RUST_LOG` says otherwise.
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse().command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nessie: error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(command: Command) -> Result<ExitCode, CliError> {
    match command {
        Command::Demo(a) => run_demo(a),
        Command::Up(a) => run_up(a),
        Command::Down(a) => run_down(a),
        Command::Status(a) => run_status(a),
        Command::Put(a) => run_put(a),
        Command::Get(a) => run_get(a),
        Command::Del(a) => run_del(a),
        Command::Migrate(a) => run_migrate(a),
        Command::Leave(a) => run_leave(a),
        Command::Join(a) => run_join(a),
        Command::Node(a) => run_node(a),
        Command::FabricBench(a) => {
            fabric_bench::run(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::FabricBenchTarget(a) => {
            fabric_bench::target(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(a) => {
            bench_cmd::run(a)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Burn => bench_cmd::burn(),
        Command::Sim(a) => Ok(sim_cmd::run(a)),
    }
}

fn run_demo(a: DemoArgs) -> Result<ExitCode, CliError> {
    if !(a.duration > 0.0 && a.duration <= 3600.0) {
        return Err(CliError::DemoDuration(a.duration));
    }
    let spec = DemoSpec {
        nodes: a.nodes,
        threads: a.client_threads,
        keys: a.keys,
        value_size: a.value_size,
        get_ratio: a.get_ratio,
        dist: a.dist,
        duration: Duration::from_secs_f64(a.duration),
        seed: a.seed,
        check: a.check,
    };
    println!(
        "nessie demo: {} nodes (in-process fabric), {} client threads, {} keys, {} B values, {:.0}% GET, {:?}, {:.1} s",
        spec.nodes, spec.threads, spec.keys, spec.value_size, spec.get_ratio * 100.0, spec.dist, a.duration
    );
    let r = demo::run(&spec)?;
    let secs = r.elapsed.as_secs_f64();
    println!();
    println!(
        "  operations     {:>12}  ({} GET, {} PUT, {} errors)",
        r.ops, r.gets, r.puts, r.errors
    );
    println!("  throughput     {:>12.0} ops/s", r.ops as f64 / secs);
    println!(
        "  goodput        {:>12.1} MiB/s",
        r.ops as f64 * spec.value_size as f64 / secs / (1 << 20) as f64
    );
    for (name, h) in [("GET", &r.get_latency), ("PUT", &r.put_latency)] {
        if !h.is_empty() {
            println!(
                "  {name} latency    p50 {:>8.1} µs   p99 {:>8.1} µs   p99.9 {:>8.1} µs",
                h.value_at_quantile(0.5) as f64 / 1e3,
                h.value_at_quantile(0.99) as f64 / 1e3,
                h.value_at_quantile(0.999) as f64 / 1e3
            );
        }
    }
    println!(
        "  protocol       {} migrations, {} previous-version reads, {} cache hits",
        r.migrations, r.previous_version_hits, r.cache_hits
    );
    let f = &r.fabric;
    println!(
        "  fabric/op      {:.2} remote ops, {:.0} remote bytes, {:.0} local bytes",
        f.remote_ops() as f64 / r.ops.max(1) as f64,
        f.remote_bytes() as f64 / r.ops.max(1) as f64,
        f.local_bytes() as f64 / r.ops.max(1) as f64
    );
    println!("\nfabric counters (measured window):\n{f}");
    if let Some(report) = &r.check {
        println!("{report}");
        if !report.is_ok() {
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Pages per size class a node should have before mixed sizes use its memory well.
const PAGES_PER_CLASS_HINT: u64 = 8;

/// What a memory budget buys, on stderr (stdout stays the cluster's summary): the tables, and
/// how many entries of a few size classes one node's data table holds.
fn print_budget(bytes: u64, g: &nessie_store::Geometry) -> Result<(), CliError> {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let classes = g.classes()?;
    let pages = g.data_pages_per_node();
    eprintln!(
        "memory per node {:.1} MiB: {} index entries ({:.1} MiB), {pages} data pages of {} KiB \
         ({:.1} MiB, {} kept for deletes) and their page table, for keys up to {} B and values \
         up to {} B",
        mib(bytes),
        g.ites_per_node,
        mib(g.index_table_bytes()),
        classes.page_bytes() >> 10,
        mib(g.data_table_bytes()),
        nessie_store::classtable::RESERVE_PAGES,
        g.key_max,
        g.value_max
    );
    let value_pages = pages - nessie_store::classtable::RESERVE_PAGES;
    let last = classes.len() - 1;
    let shown = (0..classes.len()).filter(|c| c % 4 == 0 || *c == last);
    eprintln!("  one node holds, if every entry were of one class (key + value bytes up to):");
    for c in shown {
        let c = c as u8;
        let size = classes.entry_size(c);
        eprintln!(
            "    {:>8} B: {:>10} entries",
            size - nessie_store::dte::KEY_OFF,
            value_pages * classes.per_page(c)
        );
    }
    eprintln!("  and any mix of them: pages move between classes as the data changes");
    // Each writer node keeps a part-used page per class it writes: a budget of few pages per
    // class loses much of itself to them.
    let enough = PAGES_PER_CLASS_HINT * classes.len() as u64;
    if value_pages < enough {
        eprintln!(
            "  warning: {value_pages} pages per node for {} size classes; with mixed value sizes \
             part-used pages of every class on every writer node take much of the budget \
             (give at least {:.0} MiB per node, or a smaller --value-max)",
            classes.len(),
            (enough * classes.page_bytes()) as f64 / (1 << 20) as f64
        );
    }
    eprintln!(
        "  the index holds about {} keys (load factor {}): with mostly small values it fills \
         before the data tables",
        (g.ites_per_node as f64 * nessie_cluster::config::MEMORY_LOAD_FACTOR) as u64,
        nessie_cluster::config::MEMORY_LOAD_FACTOR
    );
    Ok(())
}

/// Index entries per node when only --dtes-per-node is given (the sizes before budgets).
const EXPLICIT_ITES_DEFAULT: u64 = 1 << 16;
/// Data entries per node when only --ites-per-node is given.
const EXPLICIT_DTES_DEFAULT: u64 = 1 << 14;

/// The tables `up` gives each node: as `--ites-per-node`/`--dtes-per-node` say if either is
/// given, else sized for `--memory-per-node` (64 MiB unless told, as memcached's `-m 64`).
/// Either way it says on stderr what they hold.
fn up_geometry(a: &UpArgs) -> Result<nessie_store::Geometry, CliError> {
    let g = if a.ites_per_node.is_some() || a.dtes_per_node.is_some() {
        let g = nessie_store::Geometry {
            nodes: a.nodes as u32,
            ites_per_node: a.ites_per_node.unwrap_or(EXPLICIT_ITES_DEFAULT),
            dtes_per_node: a.dtes_per_node.unwrap_or(EXPLICIT_DTES_DEFAULT),
            key_max: a.key_max,
            value_max: a.value_max,
            ..nessie_store::Geometry::default()
        };
        // An invalid geometry is refused later with its own error; say nothing of it here.
        if g.validate().is_ok() {
            print_budget(g.node_table_bytes(), &g)?;
        }
        g
    } else {
        let g = nessie_store::Geometry::for_memory(
            a.nodes as u32,
            a.memory_per_node,
            a.key_max,
            a.value_max,
            nessie_cluster::config::MEMORY_LOAD_FACTOR,
        )?;
        print_budget(a.memory_per_node, &g)?;
        g
    };
    let bytes = g.node_table_bytes();
    let mib = |sets: u64| (sets * bytes) as f64 / (1 << 20) as f64;
    if a.replicas > 1 {
        eprintln!(
            "  with {} copies, each node holds {} such sets of tables: {:.1} MiB",
            a.replicas,
            a.replicas,
            mib(a.replicas as u64)
        );
    }
    let spare = a.spare_copies.unwrap_or_else(|| {
        nessie_cluster::config::default_spare_copies(a.replicas, a.nodes as u32)
    });
    if a.replicas > 1 && spare > 0 {
        eprintln!(
            "  and {spare} spare {} for the copies of a node gone for good: {:.1} MiB more, \
             taken only as a copy moves in (the tables take memory as they fill; hugetlb \
             pages and RDMA take it at start)",
            if spare == 1 { "slot" } else { "slots" },
            mib(spare as u64)
        );
    }
    Ok(g)
}

/// `--value-max` above the item limit, with no `--item-max`, asks for items that long (as
/// `redis-server` and memcached's `-I` mean a value limit): they are stored in chunks of one
/// entry of the default size, as `--item-max` would. One entry that large is no unit of
/// memory (a page holds at least 8 of the largest class, and sizes classes up to it).
fn long_values_as_items(mut a: UpArgs) -> Result<UpArgs, CliError> {
    let limit = a
        .item_max
        .unwrap_or(nessie_protocols::large::DEFAULT_ITEM_MAX);
    // Only the client-driven mode stores items in chunks: the baselines keep items to
    // --value-max, which stays as given there.
    if u64::from(a.value_max) <= limit || a.mode != "cd" {
        return Ok(a);
    }
    if a.item_max.is_some() {
        return Err(CliError::Usage(format!(
            "--value-max {} is more than --item-max {limit}: --value-max is the largest value \
             one entry holds, --item-max the longest item (stored in chunks of --value-max)",
            a.value_max
        )));
    }
    eprintln!(
        "--value-max {} is taken as the longest item (--item-max {}): items are stored in \
         chunks of one entry of {DEFAULT_VALUE_MAX} bytes (and --dtes-per-node, if given, \
         counts entries of that size)",
        a.value_max, a.value_max
    );
    a.item_max = Some(u64::from(a.value_max));
    a.value_max = DEFAULT_VALUE_MAX;
    Ok(a)
}

/// `--value-max`'s default: the largest value one entry holds.
const DEFAULT_VALUE_MAX: u32 = 16384;

fn run_up(a: UpArgs) -> Result<ExitCode, CliError> {
    let a = long_values_as_items(a)?;
    let dir = a.dir.dir();
    let geometry = up_geometry(&a)?;
    let binary = std::env::current_exe().map_err(CliError::CurrentExe)?;
    // Each node's front ends share a pool of `workers` clients of their own.
    let frontends = up_frontends(&a)?;
    let opts = process::UpOptions {
        nodes: a.nodes,
        standby: a.standby,
        transport: a.transport,
        geometry,
        workers: a.client_threads,
        expiry_ms: a.expiry_ms,
        clock_margin_ms: a.clock_margin_ms,
        binary,
        node_args: a.node_args,
        ready_timeout: Duration::from_secs(a.ready_timeout),
        mode: a.mode,
        server_threads: a.server_threads,
        max_clients_per_node: a.client_threads * (1 + frontends.is_some() as u16) + 16,
        server_poll: a.server_poll,
        huge_pages: a.huge_pages,
        etcd: match (a.etcd, a.no_etcd) {
            (_, true) => process::EtcdChoice::Off,
            (Some(url), false) => process::EtcdChoice::Existing(url),
            (None, false) => process::EtcdChoice::Local,
        },
        lease_ttl_s: a.lease_ttl,
        etcd_user: a.etcd_user.clone(),
        etcd_password: a
            .etcd_password_file
            .as_deref()
            .map(read_password)
            .transpose()?,
        etcd_tls: nessie_membership::tls::TlsFiles {
            ca: absolute("--etcd-ca", &a.etcd_ca)?,
            cert: absolute("--etcd-cert", &a.etcd_cert)?,
            key: absolute("--etcd-key", &a.etcd_key)?,
        },
        replicas: a.replicas,
        spare_copies: a.spare_copies,
        pilaf_reuse_delay_ms: a.pilaf_reuse_delay_ms,
        replace_after_s: a.replace_after,
        rebalance: !a.no_rebalance,
        frontends,
        progress_spin_us: a.fabric.progress_spin_us,
        direct_loopback: !a.fabric.no_direct_loopback,
        direct_peers: !a.fabric.no_direct_peers,
        wait_spin_us: a.fabric.wait_spin_us,
        protected_mode: !a.no_protected_mode,
        optimizations: a.optimizations.optimizations(),
        eviction: a.eviction,
        eviction_samples: a.eviction_samples,
        item_max: a
            .item_max
            .unwrap_or(nessie_protocols::large::DEFAULT_ITEM_MAX),
        expiry_reclaim: true,
        orphan_grace_ms: a.orphan_grace_ms.unwrap_or(
            nessie_protocols::large::ORPHAN_GRACE_MS.max(a.lease_ttl.saturating_mul(2000)),
        ),
    };
    let cfg = process::up(&dir, &opts)?;
    print_up(&dir, &cfg, &opts.etcd);
    Ok(ExitCode::SUCCESS)
}

/// What `up` started: nodes, copies, membership.
/// `[frontends]` as `up`'s front-end flags ask (`None` if none is served).
fn up_frontends(a: &UpArgs) -> Result<Option<nessie_cluster::config::FrontendsSection>, CliError> {
    let mut frontends = frontends_of([a.memcached_port, a.resp_port, a.metrics_port], &a.bind);
    if let Some(f) = frontends.as_mut() {
        f.threads = a.frontend_threads;
        f.inflight = a.frontend_inflight;
        if let Some(path) = &a.resp_password_file {
            f.resp_password = Some(read_password(path)?);
        }
    }
    Ok(frontends)
}

/// The first line of `path`, without its line ending: a front-end password.
fn read_password(path: &std::path::Path) -> Result<nessie_cluster::config::Secret, CliError> {
    let text = std::fs::read_to_string(path).map_err(|err| CliError::File {
        path: path.to_path_buf(),
        err,
    })?;
    let line = text.lines().next().unwrap_or("").to_string();
    Ok(nessie_cluster::config::Secret(line))
}

/// The file `flag` names, if any, made absolute (without following links): cluster.toml is
/// read by nodes and tools started in other directories. A file that does not exist is
/// refused, naming the flag.
fn absolute(flag: &str, path: &Option<PathBuf>) -> Result<Option<PathBuf>, CliError> {
    let Some(path) = path else {
        return Ok(None);
    };
    let bad = |why: String| CliError::Usage(format!("{flag} {}: {why}", path.display()));
    std::fs::metadata(path).map_err(|e| bad(e.to_string()))?;
    let abs = std::path::absolute(path).map_err(|e| bad(e.to_string()))?;
    if abs.to_str().is_none() {
        return Err(bad("not UTF-8 (cluster.toml is text)".into()));
    }
    Ok(Some(abs))
}

/// `[frontends]` as `up --memcached-port --resp-port --metrics-port --bind` ask.
fn frontends_of(
    [memcached_port, resp_port, metrics_port]: [Option<u16>; 3],
    bind: &str,
) -> Option<nessie_cluster::config::FrontendsSection> {
    (memcached_port.is_some() || resp_port.is_some() || metrics_port.is_some()).then(|| {
        nessie_cluster::config::FrontendsSection {
            memcached_port,
            resp_port,
            metrics_port,
            resp_password: None,
            threads: nessie_cluster::config::DEFAULT_FRONTEND_THREADS,
            inflight: nessie_cluster::config::DEFAULT_FRONTEND_INFLIGHT,
            bind: bind.to_string(),
            max_connections: nessie_cluster::config::DEFAULT_FRONTEND_CONNECTIONS,
        }
    })
}

fn print_up(
    dir: &std::path::Path,
    cfg: &nessie_cluster::config::ClusterConfig,
    etcd: &process::EtcdChoice,
) {
    let r = cfg.cluster.replicas;
    println!(
        "cluster up: {} nodes over {:?}, {r} {} of each node's tables, in {} (config {})",
        cfg.node.len() - cfg.cluster.standby.len(),
        cfg.cluster.transport,
        if r == 1 { "copy" } else { "copies" },
        dir.display(),
        process::config_path(dir).display()
    );
    if !cfg.cluster.standby.is_empty() {
        println!(
            "standby: nodes {:?} are not started; `nessie join` starts one and adds it to the cluster",
            cfg.cluster.standby
        );
    }
    if let Some(m) = &cfg.membership {
        println!(
            "membership: etcd {} ({}), lease TTL {} s, epoch 1",
            m.etcd,
            match etcd {
                process::EtcdChoice::Local => "local, stopped by `nessie down`",
                _ => "existing",
            },
            m.lease_ttl_s
        );
        let spare = cfg.spare_copies();
        if spare > 0 {
            println!(
                "re-replication: {spare} spare {} per node; a node failed for {} s has its copies moved to the others",
                if spare == 1 { "slot" } else { "slots" },
                m.replace_after_s
            );
        }
    }
    if let Some(f) = &cfg.frontends {
        for (what, port) in [
            ("memcached", f.memcached_port),
            ("redis", f.resp_port),
            ("metrics (http, /metrics)", f.metrics_port),
        ] {
            if let Some(port) = port {
                println!(
                    "{what}: node K on {}:{port}+K (node 0 at {}:{port})",
                    f.bind, f.bind
                );
            }
        }
    }
}

fn run_down(a: DirArg) -> Result<ExitCode, CliError> {
    let dir = a.dir();
    let stopped = process::down(&dir)?;
    println!(
        "stopped {} node(s) {:?} in {}",
        stopped.len(),
        stopped,
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn run_status(a: StatusArgs) -> Result<ExitCode, CliError> {
    let dir = a.dir.dir();
    let (cfg, nodes) = process::status(&dir)?;
    let membership = process::membership_status(&cfg);
    let snapshot = membership.as_ref().and_then(|m| m.as_ref().ok());
    // The state of a node: etcd's word when it can be had, else whether it answered.
    // Standing by: not started yet (a standby node that joins is `joining`).
    let standby = |id: u16| {
        snapshot.and_then(|s| s.config.as_ref()).is_some_and(|c| {
            c.standby.contains(&id) && c.state(id) == Some(nessie_membership::NodeState::Failed)
        })
    };
    let state_of = |n: &process::NodeStatus| -> String {
        if standby(n.id) {
            return "standby".into();
        }
        match snapshot
            .and_then(|s| s.config.as_ref())
            .and_then(|c| c.state(n.id))
        {
            Some(s) => s.as_str().to_string(),
            None if n.report.is_ok() => "up".into(),
            None => "down".into(),
        }
    };
    let config = snapshot.and_then(|s| s.config.as_ref());
    let map = copy_map(&cfg, config);
    let partitions = replication(&cfg, map.as_ref(), config, &nodes, &state_of);
    // Copies of partitions (a node's tables) each node holds, and whether any moved copy is
    // still being filled.
    let held: Vec<u64> = (0..nodes.len() as u16)
        .map(|n| map.as_ref().map_or(0, |m| m.held_by(n).len() as u64))
        .collect();
    // Index partitions migrating to new chains (`nessie migrate`).
    let migrating = config.map_or(0, |c| {
        c.index_chains
            .iter()
            .filter(|ch| ch.migrating && ch.prepared)
            .count()
    });
    let rebalancing = config.is_some_and(|c| c.moves.iter().any(|m| m.receiving)) || migrating > 0;
    let index_partitions = cfg.replica_set().ok().and_then(|s| s.index_partitions());
    // Where every index partition's copies are (a migrating one at its target), and those
    // with a copy on a node that is not up: the balancer re-creates them once that node has
    // been failed for `replace_after_s` (`nessie_membership::balance`).
    let index_map = config
        .zip(cfg.replica_set().ok())
        .and_then(|(c, s)| c.index_map(&s));
    let index_copies: Vec<u64> = (0..nodes.len() as u16)
        .map(|n| {
            index_map
                .as_ref()
                .map_or(0, |m| m.loads().get(&n).copied().unwrap_or(0))
        })
        .collect();
    let index_partitions_short = config.zip(index_map.as_ref()).map_or(0, |(c, m)| {
        m.chains
            .iter()
            .filter(|ch| {
                ch.len() < m.replicas as usize
                    || ch
                        .iter()
                        .any(|&n| c.state(n) != Some(nessie_membership::NodeState::Up))
            })
            .count()
    });
    if a.json {
        let epoch = snapshot.and_then(|s| s.config.as_ref()).map(|c| c.epoch);
        let etcd_error = match &membership {
            Some(Err(e)) => Some(e.to_string()),
            _ => None,
        };
        let nodes_json: Vec<_> = nodes
            .iter()
            .map(|n| {
                let mut v = match &n.report {
                    Ok(v) => v.clone(),
                    Err(e) => serde_json::json!({"node": n.id, "error": e.to_string()}),
                };
                v["state"] = state_of(n).into();
                v["epoch"] = epoch.into();
                let p = &partitions[n.id as usize];
                v["replicas"] = cfg.cluster.replicas.into();
                v["live_copies"] = p.live_copies.into();
                v["under_replicated"] = p.under_replicated().into();
                v["partitions"] = held[n.id as usize].into();
                v["index_copies"] = index_copies[n.id as usize].into();
                v["leaving"] = config.is_some_and(|c| c.leaving.contains(&n.id)).into();
                v["rebalancing"] = rebalancing.into();
                if let Some(e) = &etcd_error {
                    v["etcd_error"] = e.clone().into();
                }
                v
            })
            .collect();
        let mut top = serde_json::json!({
            "format": STATUS_FORMAT,
            "dir": dir.to_string_lossy(),
            "epoch": epoch,
            "replicas": cfg.cluster.replicas,
            "under_replicated": cluster_under_replicated(&partitions),
            "rebalancing": rebalancing,
            "index_partitions": index_partitions.map(|p| p.count()),
            "migrating": migrating,
            "index_partitions_short": index_partitions_short,
            "nodes": nodes_json,
        });
        if let Some(e) = &etcd_error {
            top["etcd_error"] = e.clone().into();
        }
        println!("{top}");
    } else {
        println!(
            "cluster in {}: {} nodes, transport {:?}",
            dir.display(),
            cfg.node.len(),
            cfg.cluster.transport
        );
        print_membership(&cfg, membership.as_ref(), &nodes);
        print_replication(cfg.cluster.replicas, &partitions);
        if cfg.cluster.replicas > 1 {
            let held: Vec<String> = held
                .iter()
                .enumerate()
                .map(|(n, h)| format!("node {n}: {h}"))
                .collect();
            println!(
                "partition copies held: {}{}",
                held.join(", "),
                if rebalancing {
                    "; rebalancing (moved copies being filled, or index partitions migrating)"
                } else {
                    ""
                }
            );
            if index_map.is_some() {
                let copies: Vec<String> = index_copies
                    .iter()
                    .enumerate()
                    .map(|(n, h)| format!("node {n}: {h}"))
                    .collect();
                println!(
                    "index partition copies held: {}; {migrating} migrating, {index_partitions_short} with a copy on a node that is not up",
                    copies.join(", ")
                );
            }
        }
        print_node_table(&nodes, state_of);
        print_class_fill(&nodes);
    }
    // A standby node is not started yet: nothing is wrong.
    let all_up = nodes.iter().all(|n| n.report.is_ok() || standby(n.id));
    Ok(if all_up {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

/// Version of `nessie status --json`'s shape: 2 is an object with the cluster's `epoch`,
/// `under_replicated` and `rebalancing` and its `nodes` (1 was the array of nodes alone).
const STATUS_FORMAT: u32 = 2;

/// Index entries of the whole cluster with fewer copies than wanted: `None` when some
/// partition has no copy that answers (its entries cannot be counted).
fn cluster_under_replicated(partitions: &[Partition]) -> Option<u64> {
    partitions.iter().map(Partition::under_replicated).sum()
}

/// How many copies of one node's tables (its partition) are on nodes that are up, and how
/// many entries its index holds (read from any of those copies).
struct Partition {
    replicas: u8,
    live_copies: u8,
    present: Option<u64>,
    /// The tables of a standby node, which nobody writes until it joins.
    standby: bool,
}

impl Partition {
    /// Entries with fewer than `replicas` copies (`None`: no copy answered).
    fn under_replicated(&self) -> Option<u64> {
        if self.live_copies >= self.replicas || self.standby {
            return Some(0);
        }
        self.present
    }
}

/// Whether copy `j` of partition `p` moved and its new holder is still filling it.
fn receiving(config: Option<&nessie_membership::Configuration>, p: u16, j: u8) -> bool {
    config.is_some_and(|c| {
        c.moves
            .iter()
            .any(|m| (m.partition, m.copy) == (p, j) && m.receiving)
    })
}

/// Where the copies are: at home, or where the configuration moved them (`None`: the
/// configuration's replication is invalid).
fn copy_map(
    cfg: &nessie_cluster::config::ClusterConfig,
    config: Option<&nessie_membership::Configuration>,
) -> Option<nessie_protocols::replica::CopyMap> {
    cfg.replica_set().ok().map(|set| match config {
        Some(c) => c.copy_map(&set),
        None => nessie_protocols::replica::CopyMap::home(&set),
    })
}

fn replication(
    cfg: &nessie_cluster::config::ClusterConfig,
    map: Option<&nessie_protocols::replica::CopyMap>,
    config: Option<&nessie_membership::Configuration>,
    nodes: &[process::NodeStatus],
    state_of: &impl Fn(&process::NodeStatus) -> String,
) -> Vec<Partition> {
    let n = nodes.len() as u16;
    let r = cfg.cluster.replicas;
    (0..n)
        .map(|p| {
            let mut live = 0;
            let mut present = None;
            for j in 0..r {
                let at = map.map_or((p + j as u16) % n, |m| m.place(p, j).node);
                let Some(holder) = nodes.get(at as usize) else {
                    continue;
                };
                if state_of(holder) != "up" || receiving(config, p, j) {
                    continue;
                }
                let Ok(report) = &holder.report else { continue };
                live += 1;
                present = present.or_else(|| {
                    report["copies"].as_array()?.iter().find_map(|c| {
                        (c["partition"] == p && c["copy"] == j).then(|| c["present"].as_u64())?
                    })
                });
            }
            Partition {
                replicas: r,
                live_copies: live,
                present,
                standby: config.is_some_and(|c| c.standby.contains(&p)),
            }
        })
        .collect()
}

/// The replication line of `nessie status`.
fn print_replication(replicas: u8, partitions: &[Partition]) {
    let short: Vec<String> = partitions
        .iter()
        .enumerate()
        .filter(|(_, p)| p.live_copies < replicas && !p.standby)
        .map(|(i, p)| match p.under_replicated() {
            Some(e) => format!(
                "node {i}'s tables: {} of {replicas} copies, {e} entries",
                p.live_copies
            ),
            None => format!("node {i}'s tables: no copy answers"),
        })
        .collect();
    if short.is_empty() {
        println!("replication: {replicas} copies of every node's tables");
    } else {
        let total = match cluster_under_replicated(partitions) {
            Some(e) => format!("{e} entries in all"),
            None => "entries not all counted".into(),
        };
        println!(
            "replication: {replicas} copies wanted; under-replicated ({total}): {}",
            short.join("; ")
        );
    }
}

/// The membership line of `nessie status`: epoch and etcd, or why etcd could not be read.
fn print_membership(
    cfg: &nessie_cluster::config::ClusterConfig,
    membership: Option<&Result<nessie_membership::Snapshot, nessie_membership::MembershipError>>,
    nodes: &[process::NodeStatus],
) {
    let Some(m) = membership else {
        println!("membership: off (no etcd; failures are not detected)");
        return;
    };
    let url = cfg.membership.as_ref().map_or("", |m| m.etcd.as_str());
    match m {
        Ok(s) => match &s.config {
            Some(c) => {
                println!("membership: epoch {} (etcd {url})", c.epoch);
                if !c.moves.is_empty() {
                    let moves: Vec<String> = c
                        .moves
                        .iter()
                        .map(|m| {
                            format!(
                                "node {}'s tables copy {} on node {} (spare slot {}){}",
                                m.partition,
                                m.copy,
                                m.node,
                                m.slot,
                                if m.receiving { ", being filled" } else { "" }
                            )
                        })
                        .collect();
                    println!("moved copies: {}", moves.join("; "));
                }
            }
            None => println!("membership: no configuration in etcd {url} yet"),
        },
        Err(e) => {
            let known: Vec<String> = nodes
                .iter()
                .filter_map(|n| {
                    let epoch = n.report.as_ref().ok()?["membership"]["epoch"].as_u64()?;
                    Some(format!("node {}: epoch {epoch}", n.id))
                })
                .collect();
            println!(
                "membership: {e}; the nodes keep serving reads in the epoch they know ({}), but membership cannot change, and each node stops writing within a lease TTL (its peers could declare it failed)",
                if known.is_empty() { "none known".to_string() } else { known.join(", ") }
            );
        }
    }
}

/// One line per node: process, state, index and data fill, fabric counters.
fn print_node_table(
    nodes: &[process::NodeStatus],
    state_of: impl Fn(&process::NodeStatus) -> String,
) {
    println!(
        "{:>4} {:>8} {:>8} {:>16} {:>18} {:>12} {:>14} {:>12}",
        "node",
        "pid",
        "state",
        "index used",
        "data pages used",
        "remote ops",
        "remote bytes",
        "local ops"
    );
    for n in nodes {
        let pid = n.pid.map_or("-".to_string(), |p| p.to_string());
        let state = state_of(n);
        match &n.report {
            Ok(v) => {
                let f = &v["fabric"];
                let sum = |prefix: &str, what: &str| -> u64 {
                    ["read", "write", "cas"]
                        .iter()
                        .map(|k| f[format!("{prefix}_{k}_{what}")].as_u64().unwrap_or(0))
                        .sum()
                };
                let local = sum("loopback", "ops") + sum("direct", "ops");
                println!(
                    "{:>4} {:>8} {:>8} {:>16} {:>18} {:>12} {:>14} {:>12}",
                    n.id,
                    pid,
                    state,
                    format!("{}/{}", v["index"]["present"], v["index"]["entries"]),
                    format!(
                        "{}/{}",
                        v["data_table"]["pages_claimed"], v["data_table"]["pages"]
                    ),
                    sum("remote", "ops"),
                    sum("remote", "bytes"),
                    local
                );
            }
            Err(e) => println!("{:>4} {:>8} {:>8}  {e}", n.id, pid, state),
        }
    }
}

/// Each node's writers' fill per size class (pages held here and on other nodes, entries).
fn print_class_fill(nodes: &[process::NodeStatus]) {
    let mut header = false;
    for n in nodes {
        let Ok(v) = &n.report else { continue };
        let Some(classes) = v["data_table"]["classes"].as_array() else {
            continue;
        };
        for c in classes {
            if !header {
                println!(
                    "\n{:>4} {:>5} {:>10} {:>7} {:>13} {:>10} {:>10}",
                    "node", "class", "entry (B)", "pages", "on others", "in use", "free"
                );
                header = true;
            }
            let f = |k: &str| c[k].as_u64().unwrap_or(0);
            println!(
                "{:>4} {:>5} {:>10} {:>7} {:>13} {:>10} {:>10}",
                n.id,
                f("class"),
                f("entry_size"),
                f("pages"),
                f("remote_pages"),
                f("in_use"),
                f("free")
            );
        }
    }
}

/// Load the cluster's configuration and check the key against it.
fn load(k: &KeyArgs) -> Result<(PathBuf, ClusterConfig), CliError> {
    let dir = k.dir.dir();
    let cpath = process::config_path(&dir);
    if !cpath.exists() {
        return Err(CliError::NoCluster(dir));
    }
    let cfg = ClusterConfig::load(&cpath)?;
    if let Some(n) = k.node {
        cfg.node_entry(n)?;
    }
    check_key(&cfg, &k.key)?;
    Ok((dir, cfg))
}

/// Run `req` on the key's home node, or the next usable one (see `nessie_cluster::route`).
fn call(k: &KeyArgs, dir: &Path, cfg: &ClusterConfig, req: Request) -> Result<Response, CliError> {
    let router = route::Router {
        cfg,
        dir,
        forced: k.node,
    };
    let (node, reply) = router.call(k.key.as_bytes(), &req)?;
    tracing::debug!("served by node {node}");
    Ok(reply)
}

fn check_key(cfg: &ClusterConfig, key: &str) -> Result<(), CliError> {
    if key.is_empty() {
        return Err(CliError::EmptyKey);
    }
    if key.len() > cfg.geometry.key_max as usize {
        return Err(CliError::KeyTooLong {
            len: key.len(),
            max: cfg.geometry.key_max,
        });
    }
    Ok(())
}

/// Read at most `max` bytes from `r` (one more is read to detect a larger input); `what` names
/// the source in errors.
fn read_bounded(r: impl Read, max: u64, what: &str) -> Result<Vec<u8>, CliError> {
    let mut v = Vec::new();
    r.take(max + 1)
        .read_to_end(&mut v)
        .map_err(|err| CliError::Read {
            what: what.into(),
            err,
        })?;
    if v.len() as u64 > max {
        return Err(CliError::InputTooLong {
            what: what.into(),
            max,
        });
    }
    Ok(v)
}

fn read_value_file(path: &Path, max: u64) -> Result<Vec<u8>, CliError> {
    let f = std::fs::File::open(path).map_err(file(path))?;
    read_bounded(f, max, &path.display().to_string())
}

/// The value of `nessie put`, from its argument, `--value-file` or `--stdin`.
fn put_value(a: &PutArgs, max: u64) -> Result<Vec<u8>, CliError> {
    if let Some(path) = &a.value_file {
        return read_value_file(path, max);
    }
    if a.stdin {
        return read_bounded(std::io::stdin().lock(), max, "stdin");
    }
    let value = a.value.as_deref().expect("clap requires one value source");
    let value = match value.strip_prefix('@') {
        None => value.as_bytes().to_vec(),
        Some(literal) if literal.starts_with('@') => literal.as_bytes().to_vec(),
        Some("-") => read_bounded(std::io::stdin().lock(), max, "stdin")?,
        Some(file) => read_value_file(Path::new(file), max)?,
    };
    if value.len() as u64 > max {
        return Err(CliError::ValueTooLong {
            len: value.len(),
            max,
        });
    }
    Ok(value)
}

fn run_put(a: PutArgs) -> Result<ExitCode, CliError> {
    let (dir, cfg) = load(&a.key)?;
    let value = put_value(&a, cfg.item_max())?;
    let req = Request::Put(a.key.key.clone().into_bytes(), value);
    call(&a.key, &dir, &cfg, req)?;
    Ok(ExitCode::SUCCESS)
}

fn run_get(a: GetArgs) -> Result<ExitCode, CliError> {
    let (dir, cfg) = load(&a.key)?;
    let req = Request::Get(a.key.key.clone().into_bytes());
    match call(&a.key, &dir, &cfg, req)? {
        Response::Value(v) => {
            match &a.output {
                Some(path) => std::fs::write(path, &v).map_err(file(path))?,
                None => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&v).map_err(CliError::Stdout)?;
                    if out.is_terminal() {
                        out.write_all(b"\n").map_err(CliError::Stdout)?;
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Response::NotFound => {
            eprintln!("nessie: {:?} not found", a.key.key);
            Ok(ExitCode::from(1))
        }
        r => Err(CliError::UnexpectedReply(r)),
    }
}

fn run_del(a: KeyArgs) -> Result<ExitCode, CliError> {
    let (dir, cfg) = load(&a)?;
    call(&a, &dir, &cfg, Request::Delete(a.key.clone().into_bytes()))?;
    Ok(ExitCode::SUCCESS)
}

/// How long a node may take to start a migration (reserve the slots in etcd, write them
/// pending, start it in etcd).
const MIGRATE_START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

fn run_migrate(a: MigrateArgs) -> Result<ExitCode, CliError> {
    let dir = a.dir.dir();
    let cpath = process::config_path(&dir);
    if !cpath.exists() {
        return Err(CliError::NoCluster(dir));
    }
    let cfg = ClusterConfig::load(&cpath)?;
    for &n in &a.to {
        cfg.node_entry(n)?;
    }
    let body = serde_json::to_vec(&nessie_cluster::admin::MigrateRequest {
        partition: a.partition,
        to: a.to.clone(),
    })
    .expect("serialises");
    // Any node that is up may start it; the new chain's first node is asked first (the one
    // that hands the entries over), then the others.
    let others = cfg.node.iter().map(|n| n.id).filter(|n| !a.to.contains(n));
    let mut unreachable = Vec::new();
    let mut reply = None;
    for id in a.to.iter().copied().chain(others) {
        let path = cfg.admin_path(id, &dir)?;
        let mut conn =
            match nessie_cluster::admin::AdminClient::connect(&path, MIGRATE_START_TIMEOUT) {
                Ok(c) => c,
                Err(e) => {
                    unreachable.push(format!("node {id}: {e}"));
                    continue;
                }
            };
        let r = conn
            .call(&Request::Migrate(body.clone()))
            .map_err(|e| CliError::Usage(format!("node {id}: {e}")))?;
        reply = Some(match r {
            Response::Status(s) => serde_json::from_str::<nessie_cluster::admin::MigrateReply>(&s)
                .map_err(|e| CliError::Usage(format!("node {id}: unreadable reply: {e}")))?,
            Response::Error(e) => {
                return Err(CliError::Usage(format!(
                    "node {id} refused to migrate partition {}: {e}",
                    a.partition
                )))
            }
            r => return Err(CliError::UnexpectedReply(r)),
        });
        break;
    }
    let Some(reply) = reply else {
        return Err(CliError::Usage(format!(
            "no node answered: {}",
            unreachable.join("; ")
        )));
    };
    let chain: Vec<String> = reply
        .copies
        .iter()
        .map(|c| format!("node {} slot {}", c.node, c.slot))
        .collect();
    println!(
        "partition {} migrating to {} (epoch {})",
        a.partition,
        chain.join(", "),
        reply.epoch
    );
    if !a.wait {
        return Ok(ExitCode::SUCCESS);
    }
    let start = std::time::Instant::now();
    let mut said = String::new();
    loop {
        let snap = process::membership_status(&cfg)
            .ok_or_else(|| CliError::Usage("this cluster runs without membership".into()))?;
        let state = match snap {
            Err(e) => format!("etcd: {e}"),
            Ok(s) => {
                let chain = s.config.as_ref().and_then(|c| {
                    c.index_chains
                        .iter()
                        .find(|ch| ch.partition == a.partition && ch.copies == reply.copies)
                });
                match chain {
                    None => {
                        return Err(CliError::Usage(format!(
                            "the migration of partition {} is no longer in the configuration (replaced, or its reservation dropped)",
                            a.partition
                        )))
                    }
                    Some(ch) if !ch.migrating => {
                        println!(
                            "partition {} migrated in {:.1} s",
                            a.partition,
                            start.elapsed().as_secs_f64()
                        );
                        return Ok(ExitCode::SUCCESS);
                    }
                    Some(ch) if ch.handed_ns != 0 => "handed over; settling".to_string(),
                    Some(_) => "handing over".to_string(),
                }
            }
        };
        if state != said {
            eprintln!("partition {}: {state}", a.partition);
            said = state;
        }
        if start.elapsed().as_secs() >= a.timeout {
            return Err(CliError::Usage(format!(
                "partition {} still migrating after {} s",
                a.partition, a.timeout
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

fn run_join(a: JoinArgs) -> Result<ExitCode, CliError> {
    let dir = a.dir.dir();
    let binary = std::env::current_exe().map_err(CliError::CurrentExe)?;
    let joined = process::join_many(
        &dir,
        &binary,
        a.count,
        std::time::Duration::from_secs(a.timeout),
        &mut |s| eprintln!("join: {s}"),
    )
    .map_err(CliError::Usage)?;
    for j in &joined {
        if a.quiet {
            println!("{}", j.id);
        } else {
            println!(
                "node {} joined: up {:.1} s after it started; the balancer now moves index partitions to it (`nessie status`)",
                j.id,
                j.took.as_secs_f64()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_leave(a: LeaveArgs) -> Result<ExitCode, CliError> {
    let dir = a.dir.dir();
    let cpath = process::config_path(&dir);
    if !cpath.exists() {
        return Err(CliError::NoCluster(dir));
    }
    let cfg = ClusterConfig::load(&cpath)?;
    cfg.node_entry(a.node)?;
    if a.cancel {
        let epoch = process::set_leaving(&cfg, a.node, false).map_err(CliError::Usage)?;
        println!("node {} stays (epoch {epoch})", a.node);
        return Ok(ExitCode::SUCCESS);
    }
    if cfg.spare_copies() == 0 {
        eprintln!(
            "warning: the cluster keeps no spare slots: node {}'s table copies stay one short once it stops",
            a.node
        );
    }
    let left = process::leave(
        &cfg,
        &dir,
        a.node,
        std::time::Duration::from_secs(a.timeout),
        a.keep_running,
        &mut |s| eprintln!("node {}: {s}", a.node),
    )
    .map_err(CliError::Usage)?;
    println!(
        "node {} leaving (epoch {}): its index partitions moved to the others in {:.1} s",
        a.node,
        left.epoch,
        left.drained.as_secs_f64()
    );
    let after = cfg.membership.as_ref().map_or(0, |m| m.replace_after_s);
    if a.keep_running {
        println!("node {} still runs; stop it to finish leaving", a.node);
    } else {
        let how = if left.stopped {
            "stepped down and stopped"
        } else {
            "was not running"
        };
        match &left.marked_stopped {
            Ok(()) => println!(
                "node {} {how}; the copies of its tables move to spare slots of the others now",
                a.node
            ),
            Err(why) => println!(
                "node {} {how}; membership could not record its stop ({why}): the copies of its tables move to spare slots of the others {after} s after it is declared failed",
                a.node
            ),
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn run_node(a: NodeArgs) -> Result<ExitCode, CliError> {
    let delay = match &a.inject_delay {
        None => None,
        Some(s) => {
            let p: Vec<&str> = s.split(',').collect();
            let bad = || CliError::InjectDelay(s.clone());
            if p.len() != 3 {
                return Err(bad());
            }
            let d = nessie_fabric::inproc::DelayInjection {
                seed: p[0].parse().map_err(|_| bad())?,
                probability: p[1].parse().map_err(|_| bad())?,
                max_delay_ns: p[2].parse().map_err(|_| bad())?,
            };
            d.validate()?;
            Some(d)
        }
    };
    let config = std::fs::canonicalize(&a.config).map_err(file(&a.config))?;
    nessie_cluster::node::run_node(
        &config,
        a.id,
        nessie_cluster::node::NodeOptions {
            delay,
            extension: Some(std::sync::Arc::new(nessie_bench::agent::BenchAgent)),
            mutation_unordered_batches: a.mutation_unordered_batches,
        },
    )?;
    Ok(ExitCode::SUCCESS)
}
