//! `nessie fabric-bench`: latency of single one-sided operations between two processes over
//! UCX, optionally side by side with `ucx_perftest` on the same transport and size.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use nessie_fabric::{Endpoint, RemoteAddr};
use nessie_fabric_ucx::{
    bench_copy, bench_local_over, bench_op_over, BenchOp, Transport, UcxConfig, UcxNode,
};

/// Most bytes one measured operation may move.
pub const MAX_BENCH_SIZE: u64 = 64 << 20;
/// Largest working set (`--working-set`).
pub const MAX_WORKING_SET: u64 = 4 << 30;

#[derive(clap::Args)]
pub struct FabricBenchArgs {
    /// Transport: shm or tcp (loopback).
    #[arg(long, default_value = "shm")]
    transport: String,
    /// Operation: read, write or cas.
    #[arg(long, default_value = "read")]
    op: BenchOp,
    /// Bytes per operation, a multiple of 8 (bytes, or with K/M/G = KiB/MiB/GiB, powers of 1024; cas is always 8).
    #[arg(long, default_value = "8", value_name = crate::byte_size::VALUE_NAME, value_parser = crate::byte_size::byte_size::<u64>)]
    size: u64,
    /// Measured operations.
    #[arg(long, default_value_t = 100_000)]
    iters: u64,
    /// Spread READs and WRITEs over this many bytes of the target (bytes, or with K/M/G = KiB/MiB/GiB, powers of 1024), so
    /// that each one is cold, and measure a plain local copy from a working set of the same
    /// size beside them: the limit a READ is held against [default: --size].
    #[arg(long, value_name = crate::byte_size::VALUE_NAME, value_parser = crate::byte_size::byte_size::<u64>)]
    working_set: Option<u64>,
    /// Measure the process's own memory instead (`local_read`/`local_write`, no second
    /// process, no UCX): the path of a GET whose entry is in its own node. READ and WRITE only.
    #[arg(long, conflicts_with = "perftest")]
    local: bool,
    /// Measure fabric operations (READ, WRITE or CAS) from one process to its own node: the
    /// path of a CD client's own-node ITEs and of every ITE an SD/HY server touches. Run
    /// twice, straight to memory (the default on shm and tcp) and through UCX's loopback.
    #[arg(long, conflicts_with_all = ["perftest", "local"])]
    loopback: bool,
    /// Also run ucx_perftest with the same transport, operation and size, in this run.
    #[arg(long)]
    perftest: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// The hidden target process: registers one region, prints its fabric info, serves until stdin
/// closes.
#[derive(clap::Args)]
pub struct TargetArgs {
    #[arg(long)]
    transport: String,
    #[arg(long)]
    size: u64,
}

/// Why `nessie fabric-bench` (or its target process) failed.
#[derive(Debug, thiserror::Error)]
pub enum FabricBenchError {
    #[error("--size {0} must be a positive multiple of 8 up to {MAX_BENCH_SIZE}")]
    Size(u64),
    #[error("--iters {0} is not in 1..=100000000")]
    Iters(u64),
    #[error("--working-set {0} must be a multiple of 8 from --size up to {MAX_WORKING_SET}")]
    WorkingSet(u64),
    #[error("--local measures read and write; a CAS always goes through the fabric")]
    LocalCas,
    #[error("--perftest supports shm and tcp, not {0}")]
    PerftestTransport(String),
    #[error(transparent)]
    Transport(#[from] nessie_fabric_ucx::ParseError),
    /// The UCX node, endpoint or measured operations.
    #[error(transparent)]
    Fabric(#[from] nessie_fabric::FabricError),
    /// Picking a free port for ucx_perftest.
    #[error(transparent)]
    Port(#[from] nessie_cluster::process::ProcessError),
    /// This process's own I/O (its path, stdout, the target's output).
    #[error("{0}")]
    Io(io::Error),
    #[error("{0}")]
    Encode(serde_json::Error),
    #[error("starting the target process: {0}")]
    StartTarget(io::Error),
    #[error("the target process printed no fabric info ({0:?})")]
    NoTargetInfo(String),
    #[error("ucx_perftest not found (apt-get install ucx-utils): {0}")]
    PerftestMissing(io::Error),
    #[error("{0}")]
    PerftestRun(io::Error),
    #[error("ucx_perftest printed no result:\n{stdout}{stderr}")]
    PerftestNoResult { stdout: String, stderr: String },
    #[error("unexpected ucx_perftest line {0:?}")]
    PerftestLine(String),
}

fn ucx_config(transport: &str) -> Result<UcxConfig, FabricBenchError> {
    let t: Transport = transport.parse()?;
    let mut c = UcxConfig::new(t);
    if t == Transport::Tcp {
        c.net_devices = Some("lo".into());
    }
    Ok(c)
}

pub fn target(a: TargetArgs) -> Result<(), FabricBenchError> {
    let node = UcxNode::new(1, &[a.size.max(8)], &ucx_config(&a.transport)?)?;
    let info = serde_json::to_vec(node.info()).map_err(FabricBenchError::Encode)?;
    println!("{}", hex::encode(info));
    std::io::stdout().flush().map_err(FabricBenchError::Io)?;
    // Serve (the progress thread does the work) until the parent closes our stdin.
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    Ok(())
}

struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

pub struct Outcome {
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    pub ops_per_sec: f64,
}

impl From<nessie_fabric_ucx::LatencyStats> for Outcome {
    fn from(s: nessie_fabric_ucx::LatencyStats) -> Self {
        Outcome {
            p50_us: s.p50_ns as f64 / 1e3,
            p99_us: s.p99_ns as f64 / 1e3,
            mean_us: s.mean_ns / 1e3,
            ops_per_sec: s.ops_per_sec,
        }
    }
}

/// Operations from this process to a target process's memory: over shm straight to it, mapped
/// into this process (`direct`, the default of a node), or through UCX.
fn ours(
    a: &FabricBenchArgs,
    size: u64,
    span: u64,
    direct: bool,
) -> Result<Outcome, FabricBenchError> {
    let exe = std::env::current_exe().map_err(FabricBenchError::Io)?;
    let mut child = Child(
        Command::new(exe)
            .args([
                "fabric-bench-target",
                "--transport",
                &a.transport,
                "--size",
                &span.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(FabricBenchError::StartTarget)?,
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .map_err(FabricBenchError::Io)?;
    let target: nessie_fabric_ucx::NodeInfo = hex::decode(line.trim())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| FabricBenchError::NoTargetInfo(line.clone()))?;
    let mut config = ucx_config(&a.transport)?;
    config.direct_peers = direct;
    let me = UcxNode::new(0, &[8], &config)?;
    let mut ep = me.endpoint(&[me.info().clone(), target])?;
    let addr = RemoteAddr::new(1, 0, 0);
    // Warm-up, then the measured run.
    bench_op_over(
        &mut ep,
        addr,
        a.op,
        size as usize,
        span,
        (a.iters / 10).max(100),
    )?;
    Ok(bench_op_over(&mut ep, addr, a.op, size as usize, span, a.iters)?.into())
}

/// `--local`: one process measuring its own region, every page written first.
fn ours_local(a: &FabricBenchArgs, size: u64, span: u64) -> Result<Outcome, FabricBenchError> {
    let me = UcxNode::new(0, &[span], &ucx_config(&a.transport)?)?;
    let mut ep = me.endpoint(&[me.info().clone()])?;
    let page = vec![0x5a_u8; 4096.min(span) as usize];
    for off in (0..span).step_by(page.len()) {
        let n = page.len().min((span - off) as usize);
        ep.local_write(0, off, &page[..n])?;
    }
    let iters = (a.iters / 10).max(100);
    bench_local_over(&mut ep, 0, a.op, size as usize, span, iters)?; // warm-up
    Ok(bench_local_over(&mut ep, 0, a.op, size as usize, span, a.iters)?.into())
}

/// `--loopback`: fabric operations on the process's own node, direct or through UCX.
fn ours_loopback(
    a: &FabricBenchArgs,
    size: u64,
    span: u64,
    direct: bool,
) -> Result<Outcome, FabricBenchError> {
    let mut config = ucx_config(&a.transport)?;
    config.direct_loopback = direct;
    let me = UcxNode::new(0, &[span], &config)?;
    let mut ep = me.endpoint(&[me.info().clone()])?;
    let addr = RemoteAddr::new(0, 0, 0);
    let iters = (a.iters / 10).max(100);
    bench_op_over(&mut ep, addr, a.op, size as usize, span, iters)?; // warm-up
    Ok(bench_op_over(&mut ep, addr, a.op, size as usize, span, a.iters)?.into())
}

/// Run ucx_perftest (server + client) and parse its `Final:` line.
fn perftest(a: &FabricBenchArgs, size: u64) -> Result<Outcome, FabricBenchError> {
    let (tls, dev) = match a.transport.as_str() {
        "shm" => ("posix,self", None),
        "tcp" => ("tcp,self", Some("lo")),
        t => return Err(FabricBenchError::PerftestTransport(t.into())),
    };
    let test = match a.op {
        BenchOp::Read => "ucp_get",
        BenchOp::Write => "ucp_put_lat",
        BenchOp::Cas => "ucp_cswap",
    };
    let port = nessie_cluster::process::free_ports(1)?[0];
    let mk = |args: &[&str]| {
        let mut c = Command::new("ucx_perftest");
        c.env("UCX_TLS", tls).args(args).stdin(Stdio::null());
        if let Some(d) = dev {
            c.env("UCX_NET_DEVICES", d);
        }
        c
    };
    let mut server = mk(&["-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(FabricBenchError::PerftestMissing)?;
    std::thread::sleep(Duration::from_millis(300));
    let out = mk(&[
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-t",
        test,
        "-s",
        &size.to_string(),
        "-n",
        &a.iters.to_string(),
        "-O",
        "1",
    ])
    .output()
    .map_err(FabricBenchError::PerftestRun);
    let _ = server.kill();
    let _ = server.wait();
    let out = out?;
    let text = String::from_utf8_lossy(&out.stdout);
    let fin = text
        .lines()
        .find(|l| l.starts_with("Final:"))
        .ok_or_else(|| FabricBenchError::PerftestNoResult {
            stdout: text.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })?;
    let f: Vec<f64> = fin
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if f.len() < 8 {
        return Err(FabricBenchError::PerftestLine(fin.into()));
    }
    Ok(Outcome {
        p50_us: f[1],
        p99_us: f64::NAN,
        mean_us: f[2],
        ops_per_sec: f[7],
    })
}

pub fn run(a: FabricBenchArgs) -> Result<(), FabricBenchError> {
    let size = if a.op == BenchOp::Cas { 8 } else { a.size };
    if size == 0 || size % 8 != 0 || size > MAX_BENCH_SIZE {
        return Err(FabricBenchError::Size(size));
    }
    if a.iters == 0 || a.iters > 100_000_000 {
        return Err(FabricBenchError::Iters(a.iters));
    }
    let span = a.working_set.unwrap_or(size);
    if span < size || !span.is_multiple_of(8) || span > MAX_WORKING_SET {
        return Err(FabricBenchError::WorkingSet(span));
    }
    if a.local && a.op == BenchOp::Cas {
        return Err(FabricBenchError::LocalCas);
    }
    // Over shm operations on another process's memory go straight to it by default, as a
    // node's do (`direct_peers`): measured both ways, as loopback is.
    let peers_direct =
        !a.local && !a.loopback && ucx_config(&a.transport)?.transport == Transport::Shm;
    let r = Measured {
        ours: match (a.local, a.loopback) {
            (true, _) => ours_local(&a, size, span)?,
            (_, true) => ours_loopback(&a, size, span, true)?,
            _ => ours(&a, size, span, true)?,
        },
        through_ucx: match (a.loopback, peers_direct) {
            (true, _) => Some(ours_loopback(&a, size, span, false)?),
            (_, true) => Some(ours(&a, size, span, false)?),
            _ => None,
        },
        // The limit: a local copy from a working set as large, when one is asked for.
        limit: a
            .working_set
            .map(|ws| Outcome::from(bench_copy(size as usize, ws, a.iters))),
        perftest: if a.perftest {
            Some(perftest(&a, size)?)
        } else {
            None
        },
        size,
        span,
    };
    if a.json {
        println!("{}", r.json(&a));
    } else {
        r.print(&a);
    }
    Ok(())
}

/// One invocation's figures.
struct Measured {
    ours: Outcome,
    /// `--loopback`, or another process over shm: the same operations through UCX (`ours`
    /// went straight to memory).
    through_ucx: Option<Outcome>,
    limit: Option<Outcome>,
    perftest: Option<Outcome>,
    size: u64,
    span: u64,
}

impl Measured {
    /// The figures of operations through UCX, which ucx_perftest is compared with.
    fn ucx_path(&self) -> &Outcome {
        self.through_ucx.as_ref().unwrap_or(&self.ours)
    }

    fn json(&self, a: &FabricBenchArgs) -> serde_json::Value {
        let o = &self.ours;
        let mut v = serde_json::json!({
            "transport": if a.local { "local" } else { a.transport.as_str() }, "op": op_name(a.op), "size": self.size, "iters": a.iters,
            "nessie": {"p50_us": o.p50_us, "p99_us": o.p99_us, "mean_us": o.mean_us, "ops_per_sec": o.ops_per_sec},
        });
        if let Some(u) = &self.through_ucx {
            v["loopback"] = a.loopback.into();
            v["through_ucx"] = serde_json::json!({"p50_us": u.p50_us, "p99_us": u.p99_us, "mean_us": u.mean_us, "ops_per_sec": u.ops_per_sec});
            v["p50_ratio_to_ucx"] = (o.p50_us / u.p50_us).into();
        }
        if let Some(p) = &self.perftest {
            v["ucx_perftest"] = serde_json::json!({"p50_us": p.p50_us, "mean_us": p.mean_us, "ops_per_sec": p.ops_per_sec});
            v["p50_ratio"] = (self.ucx_path().p50_us / p.p50_us).into();
        }
        if let Some(l) = &self.limit {
            v["working_set"] = self.span.into();
            v["local_copy"] =
                serde_json::json!({"p50_us": l.p50_us, "p99_us": l.p99_us, "mean_us": l.mean_us});
            v["p50_ratio_to_copy"] = (o.p50_us / l.p50_us).into();
        }
        v
    }

    fn print(&self, a: &FabricBenchArgs) {
        let o = &self.ours;
        let spread = match a.working_set {
            Some(ws) => format!(", spread over {ws} B"),
            None => String::new(),
        };
        let (transport, whose) = match (a.local, a.loopback) {
            (true, _) => ("local", "of the process's own memory"),
            (_, true) => (a.transport.as_str(), "from a process to its own node"),
            _ => (a.transport.as_str(), "between two processes"),
        };
        println!(
            "{transport} {} of {} B {whose}, {} operations{spread}:",
            op_name(a.op),
            self.size,
            a.iters
        );
        let label = if self.through_ucx.is_some() {
            "direct"
        } else {
            "nessie"
        };
        println!(
            "  {label:<12}  p50 {:>9.3} µs  p99 {:>9.3} µs  mean {:>9.3} µs  {:>12.0} ops/s",
            o.p50_us, o.p99_us, o.mean_us, o.ops_per_sec
        );
        if let Some(u) = &self.through_ucx {
            println!(
                "  through UCX   p50 {:>9.3} µs  p99 {:>9.3} µs  mean {:>9.3} µs  {:>12.0} ops/s",
                u.p50_us, u.p99_us, u.mean_us, u.ops_per_sec
            );
            println!(
                "  p50 ratio (direct / through UCX): {:.2}",
                o.p50_us / u.p50_us
            );
        }
        if let Some(p) = &self.perftest {
            println!(
                "  ucx_perftest  p50 {:>9.3} µs                  mean {:>9.3} µs  {:>12.0} ops/s",
                p.p50_us, p.mean_us, p.ops_per_sec
            );
            let whose = if self.through_ucx.is_some() {
                "through UCX"
            } else {
                "nessie"
            };
            println!(
                "  p50 ratio ({whose} / ucx_perftest): {:.2}",
                self.ucx_path().p50_us / p.p50_us
            );
        }
        if let Some(l) = &self.limit {
            println!(
                "  local copy    p50 {:>9.3} µs  p99 {:>9.3} µs  mean {:>9.3} µs  (the limit)",
                l.p50_us, l.p99_us, l.mean_us
            );
            println!(
                "  p50 ratio (nessie / local copy): {:.2}",
                o.p50_us / l.p50_us
            );
        }
    }
}

fn op_name(op: BenchOp) -> String {
    format!("{op:?}").to_lowercase()
}
