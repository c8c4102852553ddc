//! `nessie`: the command-line tool.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use nessie_bench::demo::{self, DemoSpec};
use nessie_bench::workload::KeyDist;

#[derive(Parser)]
#[command(name = "nessie", version, about = "Nessie: a client-driven, in-memory distributed key-value store")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a demo workload on an in-process cluster and print throughput, latencies and fabric
    /// counters (optionally checking the whole history for linearizability).
    Demo(DemoArgs),
}

#[derive(clap::Args)]
struct DemoArgs {
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    nodes: u32,
    /// Client worker threads (spread over the nodes).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Keys in the key space (all preloaded).
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 1024)]
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

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Demo(a) => run_demo(a),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nessie: error: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_demo(a: DemoArgs) -> Result<ExitCode, String> {
    if !(a.duration > 0.0 && a.duration <= 3600.0) {
        return Err(format!("--duration {} is not in (0, 3600] seconds", a.duration));
    }
    let spec = DemoSpec {
        nodes: a.nodes,
        threads: a.threads,
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
    println!("  operations     {:>12}  ({} GET, {} PUT, {} errors)", r.ops, r.gets, r.puts, r.errors);
    println!("  throughput     {:>12.0} ops/s", r.ops as f64 / secs);
    println!("  goodput        {:>12.1} MiB/s", r.ops as f64 * spec.value_size as f64 / secs / (1 << 20) as f64);
    for (name, h) in [("GET", &r.get_latency), ("PUT", &r.put_latency)] {
        if h.len() > 0 {
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
