//! `nessie sim check`: correctness mode. Runs the client-driven protocol on simulated clusters
//! with faults injected (delays, NIC stalls, client pauses past the expiry period), one run per
//! seed, checks every history for linearizability, and on a failure prints the seed and the
//! command that replays it exactly (`nessie_sim::correctness`, docs/sim.md).

use std::process::ExitCode;

use nessie_fabric_sim::{SimEndpoint, SimFaults, SimParams};
use nessie_protocols::cd::CdClient;
use nessie_protocols::{HookPoint, ProtocolConfig};
use nessie_sim::correctness::{self, CheckRun, CheckSpec, Mix};
use nessie_store::Geometry;

/// Most seeds one command runs.
pub const MAX_SEEDS: u64 = 1_000_000;
/// Largest value a run writes (the simulated geometry's `value_max`).
const VALUE_MAX: u32 = 48;
/// Longest key a run writes (`key-NNNNNNNN`, more digits for more keys).
const KEY_MAX: u32 = 16;
/// Length of every value of a `--conditional` run.
const CONDITIONAL_VALUE_LEN: usize = 16;

#[derive(clap::Args, Debug)]
pub struct SimCheckArgs {
    /// Seeds to run, one run each.
    #[arg(long, default_value_t = 10)]
    pub seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 1)]
    pub start_seed: u64,
    /// Simulated nodes.
    #[arg(long, default_value_t = 3)]
    pub nodes: u16,
    /// Client threads per node.
    #[arg(long, visible_alias = "threads", value_name = "N", default_value_t = 2)]
    pub client_threads: u16,
    /// Operations per client thread.
    #[arg(long, default_value_t = 1_000)]
    pub ops: u64,
    /// Keys; the first --hot-keys get --hot-fraction of the operations.
    #[arg(long, default_value_t = 40)]
    pub keys: u64,
    /// Hot keys: the first keys, which get --hot-fraction of the operations.
    #[arg(long, default_value_t = 2)]
    pub hot_keys: u64,
    /// Fraction of the operations on the --hot-keys.
    #[arg(long, default_value_t = 0.5)]
    pub hot_fraction: f64,
    /// Keys written before the clients start (in the history too).
    #[arg(long, default_value_t = 0)]
    pub preload: u64,
    /// Fraction of GETs.
    #[arg(long, default_value_t = 0.5)]
    pub get_ratio: f64,
    /// Fraction of DELETEs (the rest are PUTs of 8-48 bytes).
    #[arg(long, default_value_t = 0.1)]
    pub delete_ratio: f64,
    /// Mix conditional writes in: add, replace, and writes and deletes on a version read just
    /// before, besides GETs, PUTs and DELETEs, on values of 16 bytes (the mix is fixed:
    /// --get-ratio and --delete-ratio do not apply).
    #[arg(long, conflicts_with_all = ["get_ratio", "delete_ratio"])]
    pub conditional: bool,
    /// Index slots per node (24: 40 keys sit in every candidate, not only the first).
    #[arg(long, default_value_t = 1024)]
    pub index_slots: u64,
    /// Data entries per node (few: entries are recycled constantly).
    #[arg(long, default_value_t = 96)]
    pub data_entries: u64,
    /// Expiry period, ms of virtual time.
    #[arg(long, default_value_t = 5)]
    pub expiry_ms: u64,
    /// Probability of an extra delay before, and again after, each operation.
    #[arg(long, default_value_t = 0.05)]
    pub delay_prob: f64,
    /// Longest such delay, in ns of virtual time.
    #[arg(long, default_value_t = 20_000)]
    pub max_delay_ns: u64,
    /// Probability that a NIC engine stalls when a request reaches it.
    #[arg(long, default_value_t = 0.01)]
    pub nic_stall_prob: f64,
    /// Longest NIC stall, in ns of virtual time.
    #[arg(long, default_value_t = 50_000)]
    pub max_nic_stall_ns: u64,
    /// Probability that a client thread pauses before an operation.
    #[arg(long, default_value_t = 0.002)]
    pub pause_prob: f64,
    /// Shortest pause [default: the expiry period + 1 ms].
    #[arg(long)]
    pub min_pause_ns: Option<u64>,
    /// Longest pause [default: 3 expiry periods].
    #[arg(long)]
    pub max_pause_ns: Option<u64>,
    /// Probability that a client's remote operation is lost (half: the request, so it never
    /// takes effect; half: the answer, after it took effect); the client gives up after
    /// --loss-timeout-ns with an error.
    #[arg(long, default_value_t = 0.0)]
    pub loss_prob: f64,
    /// How long a client waits for a lost operation before it gives up, in ns of virtual time.
    #[arg(long, default_value_t = 200_000)]
    pub loss_timeout_ns: u64,
    /// Break the protocol on purpose, to see the checker catch it (builds with
    /// `--features mutations` only): skip_valid_check, ignore_op_timer, ...
    #[arg(long)]
    pub mutation: Option<String>,
    /// Pause client threads at a protocol hook point (builds with `--features mutations`,
    /// which compiles the hooks in): after-ite-read, get-forward-pass, before-value-read,
    /// get-after-dte-read, after-candidate-cas, before-reverse-pass, before-set-valid,
    /// migrate-after-dst-cas, migrate-after-src-cas, guarded-after-look.
    #[arg(long)]
    pub pause_at: Option<String>,
    /// Pause on every Nth arrival at --pause-at (pausing past the expiry at every arrival
    /// makes every attempt time out).
    #[arg(long, default_value_t = 50)]
    pub pause_every: u64,
    /// Length of a --pause-at pause [default: 3 expiry periods + 2 ms].
    #[arg(long)]
    pub pause_at_ns: Option<u64>,
    /// How many client threads (the first ones) pause at --pause-at [default: all].
    #[arg(long)]
    pub pause_clients: Option<usize>,
    /// Crash this node during the workload (builds with `--features mutations`): the first
    /// time one of its clients reaches --crash-at (at or after --crash-after-ns), all its
    /// clients stop for good; the others' membership declares it failed at once, and they
    /// complete what it left in the index. Its memory stays reachable. Plain mix only.
    #[arg(long, requires = "crash_at", conflicts_with = "conditional")]
    pub crash_node: Option<u16>,
    /// Where the node crashes: a hook point, named as for --pause-at.
    #[arg(long, requires = "crash_node")]
    pub crash_at: Option<String>,
    /// Virtual time (ns) from which an arrival at --crash-at crashes the node.
    #[arg(long, default_value_t = 0, requires = "crash_node")]
    pub crash_after_ns: u64,
    /// Print one JSON object on stdout (per-seed lines go to stderr).
    #[arg(long)]
    pub json: bool,
}

/// Why `nessie sim check` cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SimCheckError {
    #[error("--seeds {0} is not in 1..={MAX_SEEDS}")]
    Seeds(u64),
    #[error("--start-seed {start} + --seeds {seeds} overflows")]
    SeedRange { start: u64, seeds: u64 },
    #[error("--expiry-ms {0} is not in 1..=3600000")]
    Expiry(u64),
    #[error("--mutation {0:?} is not a CD mutation; known: {known}", known = MUTATIONS.join(", "))]
    UnknownMutation(String),
    #[cfg(not(feature = "mutations"))]
    #[error("{0} needs a nessie built with `cargo build -p nessie-cli --features mutations`")]
    NoMutations(&'static str),
    #[error("{0:?} is not a hook point; known: {known}", known = hook_names())]
    UnknownHook(String),
    #[error("--pause-every must be at least 1, --pause-at-ns at most {max} and --pause-clients at least 1", max = nessie_fabric_sim::faults::MAX_PAUSE_NS)]
    PauseAt,
    #[error(transparent)]
    Check(#[from] correctness::CheckError),
}

/// The mutations of `nessie_protocols::Mutations` that apply to unreplicated CD.
pub const MUTATIONS: &[&str] = &[
    "skip_get_reverse_pass",
    "skip_put_reverse_pass",
    "recycle_without_expiry",
    "ignore_op_timer",
    "skip_valid_check",
    "complete_to_empty",
    "migrate_copy_keeps_source",
    "migrate_walks_away",
    "migrate_empties_plainly",
    "complete_ignores_source",
    "fill_over_unsettled_copy",
    "guard_looks_to_candidate",
    "guard_passes_writes",
];

pub fn run(a: SimCheckArgs) -> ExitCode {
    match check(&a) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("nessie: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Run every seed; whether all passed.
fn check(a: &SimCheckArgs) -> Result<bool, SimCheckError> {
    let spec = spec(a)?;
    spec.validate()?;
    let pause = pause_at(a, spec.cfg.expiry_ns)?;
    let mut runs = Vec::new();
    let mut failed = Vec::new();
    for seed in a.start_seed..a.start_seed + a.seeds {
        let r =
            correctness::run_with(&spec, seed, &mut |i, c, crash| install(&pause, i, c, crash))?;
        let line = seed_line(&r);
        if a.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
        if !r.passed() {
            if !a.json {
                print!("{}", r.report);
                println!("replay: {}", replay_command(a, seed));
            }
            failed.push(seed);
        }
        runs.push(seed_json(&r));
    }
    if a.json {
        let replay: Vec<String> = failed.iter().map(|&s| replay_command(a, s)).collect();
        let out = serde_json::json!({ "runs": runs, "failed": failed, "replay": replay });
        println!("{out}");
    } else if failed.is_empty() {
        println!("all {} seeds linearizable", a.seeds);
    } else {
        println!("{} of {} seeds failed: {failed:?}", failed.len(), a.seeds);
    }
    Ok(failed.is_empty())
}

fn spec(a: &SimCheckArgs) -> Result<CheckSpec, SimCheckError> {
    if !(1..=MAX_SEEDS).contains(&a.seeds) {
        return Err(SimCheckError::Seeds(a.seeds));
    }
    if a.start_seed.checked_add(a.seeds).is_none() {
        return Err(SimCheckError::SeedRange {
            start: a.start_seed,
            seeds: a.seeds,
        });
    }
    let expiry_ns = match a.expiry_ms.checked_mul(1_000_000) {
        Some(ns) if a.expiry_ms > 0 => ns,
        _ => return Err(SimCheckError::Expiry(a.expiry_ms)),
    };
    let geometry = Geometry {
        nodes: a.nodes as u32,
        ites_per_node: a.index_slots,
        dtes_per_node: a.data_entries,
        key_max: KEY_MAX,
        value_max: VALUE_MAX,
        hash_functions: 3,
        filter_bits: 7,
    };
    let cfg = ProtocolConfig {
        expiry_ns,
        clock_margin_ns: 0,
        cache_entries: 64,
        whole_read_max: 0,
        ..ProtocolConfig::default()
    };
    let faults = SimFaults {
        delay_probability: a.delay_prob,
        max_delay_ns: a.max_delay_ns,
        nic_stall_probability: a.nic_stall_prob,
        max_nic_stall_ns: a.max_nic_stall_ns,
        pause_probability: a.pause_prob,
        min_pause_ns: a.min_pause_ns.unwrap_or(expiry_ns + 1_000_000),
        max_pause_ns: a.max_pause_ns.unwrap_or(3 * expiry_ns),
        loss_probability: a.loss_prob,
        loss_timeout_ns: a.loss_timeout_ns,
    };
    Ok(CheckSpec {
        geometry,
        cfg: mutate(cfg, a.mutation.as_deref())?,
        hw: SimParams::default(),
        faults,
        threads_per_node: a.client_threads,
        ops_per_thread: a.ops,
        keys: a.keys,
        hot_keys: a.hot_keys,
        hot_fraction: a.hot_fraction,
        get_fraction: a.get_ratio,
        delete_fraction: a.delete_ratio,
        value_size: if a.conditional {
            (CONDITIONAL_VALUE_LEN, CONDITIONAL_VALUE_LEN)
        } else {
            (correctness::MIN_VALUE_LEN, VALUE_MAX as usize)
        },
        preload_keys: a.preload,
        mix: if a.conditional {
            Mix::Conditional
        } else {
            Mix::Plain
        },
        crash: crash(a)?,
    })
}

/// `--crash-node`, `--crash-at` and `--crash-after-ns`.
fn crash(a: &SimCheckArgs) -> Result<Option<correctness::Crash>, SimCheckError> {
    let (Some(node), Some(name)) = (a.crash_node, &a.crash_at) else {
        return Ok(None);
    };
    let at = hook_point(name)?;
    #[cfg(not(feature = "mutations"))]
    {
        let _ = (node, at); // validated all the same, so the error names the real problem first
        Err(SimCheckError::NoMutations("--crash-node"))
    }
    #[cfg(feature = "mutations")]
    Ok(Some(correctness::Crash {
        node,
        at,
        after_ns: a.crash_after_ns,
    }))
}

/// The hook point named `name` (`--pause-at`, `--crash-at`).
fn hook_point(name: &str) -> Result<HookPoint, SimCheckError> {
    HOOK_POINTS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, p)| *p)
        .ok_or_else(|| SimCheckError::UnknownHook(name.into()))
}

/// `cfg` with the named mutation applied.
#[cfg(feature = "mutations")]
fn mutate(mut cfg: ProtocolConfig, name: Option<&str>) -> Result<ProtocolConfig, SimCheckError> {
    let Some(name) = name else { return Ok(cfg) };
    let m = &mut cfg.mutations;
    let flag = match name {
        "skip_get_reverse_pass" => &mut m.skip_get_reverse_pass,
        "skip_put_reverse_pass" => &mut m.skip_put_reverse_pass,
        "recycle_without_expiry" => &mut m.recycle_without_expiry,
        "ignore_op_timer" => &mut m.ignore_op_timer,
        "skip_valid_check" => &mut m.skip_valid_check,
        "complete_to_empty" => &mut m.complete_to_empty,
        "migrate_copy_keeps_source" => &mut m.migrate_copy_keeps_source,
        "migrate_walks_away" => &mut m.migrate_walks_away,
        "migrate_empties_plainly" => &mut m.migrate_empties_plainly,
        "complete_ignores_source" => &mut m.complete_ignores_source,
        "fill_over_unsettled_copy" => &mut m.fill_over_unsettled_copy,
        "guard_looks_to_candidate" => &mut m.guard_looks_to_candidate,
        "guard_passes_writes" => &mut m.guard_passes_writes,
        other => return Err(SimCheckError::UnknownMutation(other.into())),
    };
    *flag = true;
    Ok(cfg)
}

/// Without the `mutations` feature the protocol has none to apply.
#[cfg(not(feature = "mutations"))]
fn mutate(cfg: ProtocolConfig, name: Option<&str>) -> Result<ProtocolConfig, SimCheckError> {
    match name {
        None => Ok(cfg),
        Some(n) if !MUTATIONS.contains(&n) => Err(SimCheckError::UnknownMutation(n.into())),
        Some(_) => Err(SimCheckError::NoMutations("--mutation")),
    }
}

/// The protocol's hook points, by their `--pause-at` names.
const HOOK_POINTS: &[(&str, HookPoint)] = &[
    ("after-ite-read", HookPoint::AfterIteRead),
    ("get-forward-pass", HookPoint::GetForwardPass),
    ("before-value-read", HookPoint::BeforeValueRead),
    ("get-after-dte-read", HookPoint::GetAfterDteRead),
    ("after-candidate-cas", HookPoint::AfterCandidateCas),
    ("before-reverse-pass", HookPoint::BeforeReversePass),
    ("before-set-valid", HookPoint::BeforeSetValid),
    ("migrate-after-dst-cas", HookPoint::MigrateAfterDstCas),
    ("migrate-after-src-cas", HookPoint::MigrateAfterSrcCas),
    ("guarded-after-look", HookPoint::GuardedAfterLook),
    ("evict-before-delete", HookPoint::EvictBeforeDelete),
];

fn hook_names() -> String {
    let names: Vec<&str> = HOOK_POINTS.iter().map(|(n, _)| *n).collect();
    names.join(", ")
}

/// `--pause-at`: clients `0..clients` pause `ns` on every `every`-th arrival at `point`.
/// Only the `mutations` feature has hooks to install it with.
#[cfg_attr(not(feature = "mutations"), allow(dead_code))]
struct PauseAt {
    point: HookPoint,
    every: u64,
    ns: u64,
    clients: usize,
}

fn pause_at(a: &SimCheckArgs, expiry_ns: u64) -> Result<Option<PauseAt>, SimCheckError> {
    let Some(name) = &a.pause_at else {
        return Ok(None);
    };
    let point = hook_point(name)?;
    let ns = a.pause_at_ns.unwrap_or(3 * expiry_ns + 2_000_000);
    let clients = a.pause_clients.unwrap_or(usize::MAX);
    if a.pause_every == 0 || ns > nessie_fabric_sim::faults::MAX_PAUSE_NS || clients == 0 {
        return Err(SimCheckError::PauseAt);
    }
    #[cfg(not(feature = "mutations"))]
    {
        let _ = point; // validated all the same, so the error names the real problem first
        Err(SimCheckError::NoMutations("--pause-at"))
    }
    #[cfg(feature = "mutations")]
    Ok(Some(PauseAt {
        point,
        every: a.pause_every,
        ns,
        clients,
    }))
}

/// Install client `i`'s hook: `--pause-at`'s, which sleeps on a sibling endpoint of the
/// client's own simulated thread, in virtual time, then the crash hook of its node, if any.
#[cfg(feature = "mutations")]
fn install(
    pause: &Option<PauseAt>,
    i: usize,
    client: &mut CdClient<SimEndpoint>,
    mut crash: Option<correctness::CrashHook>,
) {
    use nessie_fabric::Endpoint;
    let pause = pause.as_ref().filter(|p| i < p.clients);
    if pause.is_none() && crash.is_none() {
        return;
    }
    let (point, every, ns) = pause.map_or((None, 1, 0), |p| (Some(p.point), p.every, p.ns));
    let mut ep = client.endpoint().sibling();
    let mut n = 0u64;
    client.set_hook(Some(Box::new(move |at| {
        if Some(at) == point {
            n += 1;
            if n.is_multiple_of(every) {
                ep.sleep_ns(ns);
            }
        }
        if let Some(c) = crash.as_mut() {
            c(at);
        }
    })));
}

/// Without the `mutations` feature there are no hooks (`pause_at` and `crash` refused the
/// flags).
#[cfg(not(feature = "mutations"))]
fn install(
    _: &Option<PauseAt>,
    _: usize,
    _: &mut CdClient<SimEndpoint>,
    _: Option<correctness::CrashHook>,
) {
}

fn seed_line(r: &CheckRun) -> String {
    let f = &r.faults;
    let verdict = if r.passed() {
        "linearizable".to_string()
    } else if r.report.is_ok() && r.corrupt == 0 {
        format!("WEDGED: no PUT could change keys {:?}", r.wedged)
    } else if r.report.violations().count() == 0 && r.corrupt == 0 {
        // Not refuted, not confirmed: the checker's search ran out of budget on some key.
        format!(
            "UNDECIDED: {} keys beyond the checker's search budget, {} keys wedged",
            r.report.unknown().count(),
            r.wedged.len()
        )
    } else {
        format!(
            "NOT LINEARIZABLE: {} keys violated, {} corrupt reads, {} keys wedged",
            r.report.violations().count(),
            r.corrupt,
            r.wedged.len()
        )
    };
    let crashed = match r.crashed.as_slice() {
        [] => String::new(),
        nodes => format!(", nodes {nodes:?} crashed"),
    };
    format!(
        "seed {}: {verdict}; {} ops, {} timed out, {} rolled forward, {} migrations; \
         faults: {} delays, {} NIC stalls, {} pauses, {} lost{crashed}; {:.3} ms virtual; \
         history {:016x}",
        r.seed,
        r.events.len(),
        r.stats.timeouts,
        r.stats.rolled_forward,
        r.stats.migrations,
        f.delays,
        f.nic_stalls,
        f.pauses,
        f.lost_requests + f.lost_answers,
        r.summary.end_ns as f64 / 1e6,
        r.history_digest()
    )
}

fn seed_json(r: &CheckRun) -> serde_json::Value {
    serde_json::json!({
        "seed": r.seed,
        "linearizable": r.report.is_ok(),
        "passed": r.passed(),
        "ops": r.events.len(),
        "violated_keys": r.report.violations().count(),
        "unknown_keys": r.report.unknown().count(),
        "corrupt_reads": r.corrupt,
        "wedged_keys": r.wedged,
        "timeouts": r.stats.timeouts,
        "rolled_forward": r.stats.rolled_forward,
        "migrations": r.stats.migrations,
        "faults": r.faults,
        "crashed_nodes": r.crashed,
        "virtual_ns": r.summary.end_ns,
        "dispatches": r.summary.dispatches,
        "history_digest": format!("{:016x}", r.history_digest()),
    })
}

/// The command that runs `seed` alone with every other setting of `a`.
fn replay_command(a: &SimCheckArgs, seed: u64) -> String {
    let mut c = format!(
        "nessie sim check --start-seed {seed} --seeds 1 --nodes {} --client-threads {} --ops {} \
         --keys {} --hot-keys {} --hot-fraction {} --preload {} {} \
         --index-slots {} --data-entries {} --expiry-ms {} --delay-prob {} \
         --max-delay-ns {} --nic-stall-prob {} --max-nic-stall-ns {} --pause-prob {} \
         --loss-prob {} --loss-timeout-ns {}",
        a.nodes,
        a.client_threads,
        a.ops,
        a.keys,
        a.hot_keys,
        a.hot_fraction,
        a.preload,
        if a.conditional {
            "--conditional".to_string()
        } else {
            format!(
                "--get-ratio {} --delete-ratio {}",
                a.get_ratio, a.delete_ratio
            )
        },
        a.index_slots,
        a.data_entries,
        a.expiry_ms,
        a.delay_prob,
        a.max_delay_ns,
        a.nic_stall_prob,
        a.max_nic_stall_ns,
        a.pause_prob,
        a.loss_prob,
        a.loss_timeout_ns
    );
    for (flag, v) in [
        ("--min-pause-ns", a.min_pause_ns),
        ("--max-pause-ns", a.max_pause_ns),
    ] {
        if let Some(v) = v {
            c += &format!(" {flag} {v}");
        }
    }
    if let Some(m) = &a.mutation {
        c += &format!(" --mutation {m}");
    }
    if let (Some(n), Some(at)) = (a.crash_node, &a.crash_at) {
        c += &format!(" --crash-node {n} --crash-at {at}");
        if a.crash_after_ns > 0 {
            c += &format!(" --crash-after-ns {}", a.crash_after_ns);
        }
    }
    if let Some(p) = &a.pause_at {
        c += &format!(" --pause-at {p} --pause-every {}", a.pause_every);
        if let Some(ns) = a.pause_at_ns {
            c += &format!(" --pause-at-ns {ns}");
        }
        if let Some(n) = a.pause_clients {
            c += &format!(" --pause-clients {n}");
        }
    }
    c
}
