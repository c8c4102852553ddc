//! `nessie bench fill`: how many items a memory budget holds, in Nessie or in memcached, with
//! one loader (`nessie_bench::fill`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use nessie_bench::fill::{fill, FillError, FillOutcome, FillSpec, RoundRobin};
use nessie_bench::memcached::{MemcachedConn, MemcachedError};
use nessie_cluster::LocalCluster;
use nessie_protocols::ProtocolConfig;

use crate::bench_cmd::FillArgs;

/// Why `nessie bench fill` failed.
#[derive(Debug, thiserror::Error)]
pub enum FillCmdError {
    #[error("--nodes {0} is not in 1..=64")]
    Nodes(u32),
    #[error("{0}")]
    Geometry(#[from] nessie_store::GeometryError),
    #[error("building the in-process cluster: {0}")]
    Cluster(#[source] nessie_protocols::Error),
    #[error(transparent)]
    Memcached(#[from] MemcachedError),
    #[error(transparent)]
    Fill(#[from] FillError),
    #[error("{}: {source}", path.display())]
    WriteJson {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The outcome with what was filled, as `--json` writes it.
#[derive(serde::Serialize)]
struct Report<'a> {
    store: &'a str,
    nodes: Option<u32>,
    memory_per_node: Option<u64>,
    key_size: u32,
    value_size_min: u32,
    value_size_max: u32,
    #[serde(flatten)]
    outcome: &'a FillOutcome,
    seconds: f64,
}

pub fn run(a: FillArgs) -> Result<(), FillCmdError> {
    let (lo, hi) = (a.value_size.0.unwrap_or(a.value_size.1), a.value_size.1);
    let spec = FillSpec {
        key_size: a.key_size,
        value_sizes: (lo, hi),
        max_items: u64::MAX,
    };
    let t = Instant::now();
    let (store, out) = match &a.memcached {
        Some(addr) => {
            let mut conn = MemcachedConn::connect(addr, Duration::from_secs(30))?;
            (format!("memcached at {addr}"), fill(&mut conn, &spec)?)
        }
        None => ("nessie".to_string(), fill_nessie(&a, &spec)?),
    };
    let seconds = t.elapsed().as_secs_f64();
    print(&a, &store, &out, seconds);
    if let Some(path) = &a.json {
        let nessie = a.memcached.is_none();
        let report = Report {
            store: if nessie { "nessie" } else { "memcached" },
            nodes: nessie.then_some(a.nodes),
            memory_per_node: nessie.then_some(a.memory_per_node),
            key_size: a.key_size,
            value_size_min: lo,
            value_size_max: hi,
            outcome: &out,
            seconds,
        };
        let json = serde_json::to_string_pretty(&report).expect("serialises");
        std::fs::write(path, json).map_err(|source| FillCmdError::WriteJson {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Fill an in-process cluster sized by the budget, writing through every node in turn.
fn fill_nessie(a: &FillArgs, spec: &FillSpec) -> Result<FillOutcome, FillCmdError> {
    if a.nodes == 0 || a.nodes > 64 {
        return Err(FillCmdError::Nodes(a.nodes));
    }
    let g = nessie_store::Geometry::for_memory(
        a.nodes,
        a.memory_per_node,
        spec.key_size,
        spec.value_sizes.1,
        a.load_factor,
    )?;
    let c = LocalCluster::new(g, ProtocolConfig::default(), None).map_err(FillCmdError::Cluster)?;
    let clients = (0..a.nodes)
        .map(|n| c.client(n as u16))
        .collect::<Result<Vec<_>, _>>()
        .map_err(FillCmdError::Cluster)?;
    Ok(fill(&mut RoundRobin::new(clients), spec)?)
}

fn print(a: &FillArgs, store: &str, out: &FillOutcome, seconds: f64) {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "fill: {store} | keys {} B, values {}..{} B",
        a.key_size,
        a.value_size.0.unwrap_or(a.value_size.1),
        a.value_size.1
    );
    if a.memcached.is_none() {
        let budget = a.memory_per_node * u64::from(a.nodes);
        println!(
            "  budget         {} nodes x {:.1} MiB = {:.1} MiB (index and data tables)",
            a.nodes,
            mib(a.memory_per_node),
            mib(budget)
        );
        println!(
            "  items stored   {:>10}   keys {:.1} MiB + values {:.1} MiB = {:.0}% of the budget",
            out.items,
            mib(out.key_bytes),
            mib(out.value_bytes),
            100.0 * (out.key_bytes + out.value_bytes) as f64 / budget.max(1) as f64
        );
    } else {
        println!(
            "  items stored   {:>10}   keys {:.1} MiB + values {:.1} MiB",
            out.items,
            mib(out.key_bytes),
            mib(out.value_bytes)
        );
    }
    match &out.refusal {
        Some(why) => println!("  ended by       {why}"),
        None => println!("  ended by       the item limit"),
    }
    eprintln!("(fill took {seconds:.1} s)");
}
