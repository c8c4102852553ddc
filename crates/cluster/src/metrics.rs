//! Prometheus metrics of a node process (`nessie up --metrics-port BASE`: node K serves the
//! text exposition format at `http://BIND:BASE+K/metrics`). Two sources:
//!
//! - the operations of the node's own clients (its front ends and its admin socket): every
//!   call through a [`Metered`] client counts by kind and result and times into a histogram;
//! - a snapshot taken at each scrape ([`NodeCollector`]): fabric operations and bytes by kind
//!   and locality, index and data table fill, front-end connections, and the epoch and
//!   membership this node last read from etcd.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nessie_fabric::{Locality, OpKind};
use nessie_frontend::serve::Counters;
use nessie_protocols::{Cond, CondOutcome, Error, KvClient, Version};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::node::NodeContext;

/// Longest request head a scrape may send (request line and headers).
const MAX_REQUEST_BYTES: u64 = 8 * 1024;
/// How long a scraper may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the accept loop looks at its stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(100);
/// Latency buckets: 1 µs doubling to about 0.5 s (20 buckets).
const LATENCY_BUCKETS: (f64, f64, u16) = (1e-6, 2.0, 20);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    kind: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// The operation kinds and results counted (every pair is created up front, so that each
/// operation only bumps a counter it already holds: no lookup, no lock).
const KINDS: [&str; 6] = ["get", "put", "delete", "put_if", "delete_if", "scan"];
const RESULTS: [&str; 7] = [
    "ok",
    "miss",
    "unmet",
    "refused",
    "full",
    "unsupported",
    "error",
];

/// An operation kind: its index in `KINDS`.
#[derive(Copy, Clone)]
enum Kind {
    Get,
    Put,
    Delete,
    PutIf,
    DeleteIf,
    Scan,
}

/// An operation result: its index in `RESULTS`.
#[derive(Copy, Clone)]
enum Res {
    Ok,
    Miss,
    Unmet,
    Refused,
    Full,
    Unsupported,
    Error,
}

/// Operations of a node's clients, by kind and result, with their latencies.
#[derive(Debug)]
pub struct OpMetrics {
    ops: Family<OpLabels, Counter>,
    latency: Family<KindLabel, Histogram>,
    /// `ops` and `latency`'s members, by index in `KINDS` and `RESULTS`.
    counters: Vec<Vec<Counter>>,
    histograms: Vec<Histogram>,
}

fn latency_histogram() -> Histogram {
    let (start, factor, n) = LATENCY_BUCKETS;
    Histogram::new(exponential_buckets(start, factor, n))
}

impl Default for OpMetrics {
    fn default() -> Self {
        let ops: Family<OpLabels, Counter> = Family::default();
        let latency: Family<KindLabel, Histogram> = Family::new_with_constructor(latency_histogram);
        let counters = KINDS
            .iter()
            .map(|&kind| {
                RESULTS
                    .iter()
                    .map(|&result| ops.get_or_create(&OpLabels { kind, result }).clone())
                    .collect()
            })
            .collect();
        let histograms = KINDS
            .iter()
            .map(|&kind| latency.get_or_create(&KindLabel { kind }).clone())
            .collect();
        Self {
            ops,
            latency,
            counters,
            histograms,
        }
    }
}

impl OpMetrics {
    fn record(&self, kind: Kind, result: Res, started: Instant) {
        self.counters[kind as usize][result as usize].inc();
        self.histograms[kind as usize].observe(started.elapsed().as_secs_f64());
    }
}

/// What an error counts as.
fn error_result(e: &Error) -> Res {
    match e {
        Error::EmptyKey | Error::KeyTooLarge { .. } | Error::ValueTooLarge { .. } => Res::Refused,
        Error::DataTableFull { .. } | Error::IndexFull { .. } => Res::Full,
        Error::Unsupported(_) => Res::Unsupported,
        _ => Res::Error,
    }
}

fn cond_result(r: &Result<CondOutcome, Error>) -> Res {
    match r {
        Ok(CondOutcome::Stored) => Res::Ok,
        Ok(CondOutcome::Unmet { .. }) => Res::Unmet,
        Err(e) => error_result(e),
    }
}

/// A client whose every operation is counted and timed in an [`OpMetrics`].
pub struct Metered<C> {
    pub inner: C,
    pub metrics: Arc<OpMetrics>,
}

impl<C: KvClient> Metered<C> {
    fn timed<T>(
        &mut self,
        kind: Kind,
        result: impl Fn(&Result<T, Error>) -> Res,
        op: impl FnOnce(&mut C) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let started = Instant::now();
        let r = op(&mut self.inner);
        self.metrics.record(kind, result(&r), started);
        r
    }
}

fn found<T>(r: &Result<Option<T>, Error>) -> Res {
    match r {
        Ok(Some(_)) => Res::Ok,
        Ok(None) => Res::Miss,
        Err(e) => error_result(e),
    }
}

fn done<T>(r: &Result<T, Error>) -> Res {
    r.as_ref().map_or_else(error_result, |_| Res::Ok)
}

impl<C: KvClient> KvClient for Metered<C> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.timed(Kind::Get, found, |c| c.get(key))
    }
    fn get_into(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        let r = |r: &Result<bool, Error>| match r {
            Ok(true) => Res::Ok,
            Ok(false) => Res::Miss,
            Err(e) => error_result(e),
        };
        self.timed(Kind::Get, r, |c| c.get_into(key, out))
    }
    fn get_into_at(&mut self, key: &[u8], out: &mut Vec<u8>, at: usize) -> Result<bool, Error> {
        let r = |r: &Result<bool, Error>| match r {
            Ok(true) => Res::Ok,
            Ok(false) => Res::Miss,
            Err(e) => error_result(e),
        };
        self.timed(Kind::Get, r, |c| c.get_into_at(key, out, at))
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.timed(Kind::Put, done, |c| c.put(key, value))
    }
    fn put_parts(&mut self, key: &[u8], parts: &[&[u8]]) -> Result<(), Error> {
        self.timed(Kind::Put, done, |c| c.put_parts(key, parts))
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        self.timed(Kind::Delete, done, |c| c.delete(key))
    }
    fn get_versioned(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Version>, Error> {
        self.timed(Kind::Get, found, |c| c.get_versioned(key, out))
    }
    fn put_if(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        self.timed(Kind::PutIf, cond_result, |c| c.put_if(key, value, cond))
    }
    fn delete_if(&mut self, key: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        self.timed(Kind::DeleteIf, cond_result, |c| c.delete_if(key, cond))
    }
    fn scan_keys(&mut self) -> Result<Vec<Vec<u8>>, Error> {
        self.timed(Kind::Scan, done, |c| c.scan_keys())
    }
}

/// The snapshot metrics of one node, taken at each scrape.
pub struct NodeCollector {
    pub node: Arc<NodeContext>,
    /// Each front end's protocol name and counters.
    pub frontends: Vec<(&'static str, Arc<Counters>)>,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCollector").finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FabricLabels {
    kind: String,
    locality: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabel {
    protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

/// Encode one metric without labels, with its help text.
fn single<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: M,
) -> Result<(), std::fmt::Error> {
    metric.encode(enc.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// Encode one metric (`values`: its label sets and values) with its help text.
fn family<L: EncodeLabelSet, M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(L, M)],
) -> Result<(), std::fmt::Error> {
    let Some((_, first)) = values.first() else {
        return Ok(());
    };
    let mut m = enc.encode_descriptor(name, help, None, first.metric_type())?;
    for (labels, v) in values {
        v.encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

impl NodeCollector {
    fn fabric(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.node.fabric_stats();
        let (mut ops, mut bytes) = (Vec::new(), Vec::new());
        for loc in Locality::ALL {
            for kind in OpKind::ALL {
                let l = FabricLabels {
                    kind: format!("{kind:?}").to_lowercase(),
                    locality: format!("{loc:?}").to_lowercase(),
                };
                ops.push((l.clone(), ConstCounter::new(s.ops(kind, loc))));
                bytes.push((l, ConstCounter::new(s.bytes(kind, loc))));
            }
        }
        let help = "Fabric operations of this node's endpoints, by kind and locality";
        family(enc, "fabric_operations", help, &ops)?;
        let help = "Bytes moved by this node's fabric operations, by kind and locality";
        family(enc, "fabric_bytes", help, &bytes)
    }

    fn tables(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let f = self.node.fill();
        let g = |n: u64| ConstGauge::new(n as i64);
        single(
            enc,
            "index_entries",
            "Index table entries of this node",
            g(f.ites),
        )?;
        let help = "Index table entries of this node that are in use";
        single(enc, "index_present", help, g(f.present))?;
        let help = "Data table entries this node's writers hold (here and on other nodes)";
        single(enc, "data_entries_allocated", help, g(f.allocated))?;
        single(
            enc,
            "data_pages",
            "Data table pages of this node",
            g(f.pages),
        )?;
        let help = "Data table pages of this node claimed by a size class";
        single(enc, "data_pages_claimed", help, g(f.pages_claimed))
    }

    fn frontends(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (mut open, mut total) = (Vec::new(), Vec::new());
        for (protocol, c) in &self.frontends {
            let l = ProtocolLabel { protocol };
            let n = c.curr_connections.load(Ordering::Relaxed);
            open.push((l.clone(), ConstGauge::new(n as i64)));
            let n = c.total_connections.load(Ordering::Relaxed);
            total.push((l, ConstCounter::new(n)));
        }
        let help = "Open front-end client connections, by protocol";
        family(enc, "frontend_connections", help, &open)?;
        let help = "Front-end client connections accepted, by protocol";
        family(enc, "frontend_connections_accepted", help, &total)
    }

    fn membership(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(m) = self.node.membership_snapshot() else {
            return Ok(());
        };
        let help = "Epoch of the cluster configuration this node last read from etcd";
        single(
            enc,
            "membership_epoch",
            help,
            ConstGauge::new(m.epoch as i64),
        )?;
        let help = "Whether this node's lease and view let it write (1) or it is fenced (0)";
        single(
            enc,
            "membership_may_write",
            help,
            ConstGauge::new(m.may_write as i64),
        )?;
        let states: Vec<_> = m
            .nodes_by_state
            .into_iter()
            .map(|(state, n)| (StateLabel { state }, ConstGauge::new(n as i64)))
            .collect();
        let help = "Nodes of the cluster by state, as this node last read it";
        family(enc, "membership_nodes", help, &states)
    }
}

impl Collector for NodeCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.fabric(&mut enc)?;
        self.tables(&mut enc)?;
        self.frontends(&mut enc)?;
        self.membership(&mut enc)
    }
}

/// The registry of one node: its operations and its snapshot collector.
pub fn registry(ops: &Arc<OpMetrics>, collector: NodeCollector) -> Registry {
    let mut r = Registry::with_prefix("nessie");
    let help = "Operations of this node's clients (front ends, admin socket), by kind and result";
    r.register("operations", help, ops.ops.clone());
    let help = "Latency of this node's client operations, by kind";
    r.register_with_unit(
        "operation_duration",
        help,
        prometheus_client::registry::Unit::Seconds,
        ops.latency.clone(),
    );
    r.register_collector(Box::new(collector));
    r
}

/// Serves `/metrics` on a listener; stops accepting when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    pub fn start(addr: SocketAddr, registry: Registry) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("nessie-metrics".into())
            .spawn(move || {
                let mut shedder = crate::accept::Shedder::new("metrics");
                while !flag.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((s, _)) => {
                            if let Err(e) = answer(s, &registry) {
                                tracing::debug!(%e, "a metrics scrape failed");
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(ACCEPT_POLL)
                        }
                        // Out of descriptors: the scrape is closed unanswered.
                        Err(e) => shedder.failed(&e, || listener.accept(), drop),
                    }
                }
            })?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answer one HTTP request: `GET /metrics` gets the exposition, anything else 404 or 405.
fn answer(mut s: TcpStream, registry: &Registry) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut head = String::new();
    let mut r = BufReader::new((&s).take(MAX_REQUEST_BYTES));
    r.read_line(&mut head)?;
    // The headers are read and ignored (up to the limit), so the client sees its whole
    // request consumed before the answer.
    let mut line = String::new();
    while r.read_line(&mut line)? > 2 {
        line.clear();
    }
    let mut words = head.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, body, kind) = match (method, path.split('?').next()) {
        ("GET", Some("/metrics")) => {
            let mut body = String::new();
            prometheus_client::encoding::text::encode(&mut body, registry)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            (
                "200 OK",
                body,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
        }
        ("GET", _) => ("404 Not Found", "try /metrics\n".into(), "text/plain"),
        _ => ("405 Method Not Allowed", "GET only\n".into(), "text/plain"),
    };
    write!(
        s,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}
