//! `nessie sim`: the benchmark's workload on a simulated cluster (`nessie-fabric-sim`), in
//! virtual time. Prints and writes the same result as `nessie bench`, plus the simulated time.

use std::path::PathBuf;
use std::process::ExitCode;

use nessie_bench::result::{parse_value_size, BenchParams};
use nessie_fabric_sim::SimParams;
use nessie_sim::bench::SimBenchError;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SimArgs {
    #[command(subcommand)]
    pub sub: Option<SimSub>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Subcommand)]
pub enum SimSub {
    /// Run one of the paper's cluster experiments on the simulator: JSON per run, table.md,
    /// summary and PNG figures in --out (docs/sim.md).
    Sweep(crate::sim_sweep::SimSweepArgs),
    /// Correctness mode: CD runs with injected faults, each history checked (docs/sim.md).
    Check(Box<crate::sim_check::SimCheckArgs>),
}

/// One simulated run.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Protocol: cd (Nessie), sd (server-driven), hy (hybrid), pilaf (Pilaf).
    #[arg(long, default_value = "cd")]
    pub mode: String,
    /// Server threads per node (sd, hy, pilaf); each polls on a core of its own.
    #[arg(long, default_value_t = 1)]
    pub server_threads: u16,
    /// Simulated nodes.
    #[arg(long, default_value_t = 3)]
    pub nodes: u16,
    /// Client threads per node.
    #[arg(long, visible_alias = "threads", value_name = "N", default_value_t = 2)]
    pub client_threads: u16,
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
    /// Keys (all preloaded) [default: as `nessie bench`].
    #[arg(long)]
    pub keys: Option<u64>,
    /// Index load factor.
    #[arg(long, default_value_t = 0.4)]
    pub load_factor: f64,
    /// Operations per client thread (per slot with --inflight), after the preload; the
    /// measured window ends when the first has done them, and counts what every thread
    /// completed by then.
    #[arg(long, default_value_t = 10_000)]
    pub ops: u64,
    /// Operations each client thread keeps in flight: its slots overlap their fabric
    /// operations and share its CPU, one piece of work at a time (docs/sim.md, "Operations in
    /// flight"). 1: one at a time.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub inflight: u16,
    /// CPU-bound background processes per node, sharing its cores in time slices.
    #[arg(long, default_value_t = 0)]
    pub background: u16,
    /// Seed of the workload and the scheduler: equal seeds give equal results.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Cores per simulated node [default: the model's].
    #[arg(long)]
    pub cores_per_node: Option<u32>,
    /// Link bandwidth of each NIC in Mb/s [default: the model's, 10 GbE].
    #[arg(long)]
    pub link_mbps: Option<u64>,
    /// Write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The model's hardware with the command line's overrides.
pub(crate) fn hardware(
    cores_per_node: Option<u32>,
    link_mbps: Option<u64>,
) -> Result<SimParams, nessie_fabric_sim::params::ParamsError> {
    let defaults = SimParams::default();
    let hw = SimParams {
        cores_per_node: cores_per_node.unwrap_or(defaults.cores_per_node),
        link_mbps: link_mbps.unwrap_or(defaults.link_mbps),
        ..defaults
    };
    hw.validate()?;
    Ok(hw)
}

/// Why `nessie sim` failed.
#[derive(Debug, thiserror::Error)]
enum SimCmdError {
    #[error(transparent)]
    Sim(#[from] SimBenchError),
    #[error(transparent)]
    Params(#[from] nessie_fabric_sim::params::ParamsError),
    #[error("--load-factor must be in (0, 1), not {0}")]
    LoadFactor(f64),
    #[error("{}: {source}", path.display())]
    WriteJson {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub fn run(a: SimArgs) -> ExitCode {
    match a.sub {
        Some(SimSub::Sweep(s)) => return crate::sim_sweep::run(s),
        Some(SimSub::Check(c)) => return crate::sim_check::run(*c),
        None => {}
    }
    match simulate(a.run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nessie: error: {e}");
            ExitCode::from(2)
        }
    }
}

fn simulate(a: RunArgs) -> Result<(), SimCmdError> {
    if !(a.load_factor > 0.0 && a.load_factor < 1.0) {
        return Err(SimCmdError::LoadFactor(a.load_factor));
    }
    let p = BenchParams {
        mode: a.mode.clone(),
        nodes: a.nodes,
        client_threads: a.client_threads,
        server_threads: a.server_threads,
        transport: "sim".into(),
        key_size: a.key_size,
        value_size: a.value_size.1,
        value_size_min: a.value_size.0,
        get_ratio: a.get_ratio,
        dist: a.dist.clone(),
        keys: a.keys,
        load_factor: a.load_factor,
        seed: a.seed,
        background: a.background,
        inflight: a.inflight,
        ..BenchParams::default()
    };
    let hw = hardware(a.cores_per_node, a.link_mbps)?;
    let (keys, geometry) = nessie_sim::bench::sizing(&p, a.ops);
    let t = std::time::Instant::now();
    let r = nessie_sim::bench::run(&p, keys, geometry, a.ops, hw)?;
    crate::bench_cmd::print_result(&r.bench);
    println!(
        "  simulated    {:>12.6} s measured, {:.6} s with the preload",
        r.simulated_seconds, r.simulated_total_seconds
    );
    eprintln!("(simulation took {:.1} s)", t.elapsed().as_secs_f64());
    if let Some(path) = &a.json {
        let json = serde_json::to_string_pretty(&r).expect("serialises");
        std::fs::write(path, json).map_err(|source| SimCmdError::WriteJson {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}
