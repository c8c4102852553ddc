//! Prometheus metrics of a node process (`nessie up --metrics-port BASE`: node K serves the
//! text exposition format at `http://BIND:BASE+K/metrics`). Two sources:
//!
//! - the operations of the node's own clients (its front ends and its admin socket): every
//!   call through a `nessie_serve::metered::Metered` client counts by kind and result and
//!   times into a histogram;
//! - a snapshot taken at each scrape ([`NodeCollector`]): fabric operations and bytes by kind
//!   and locality, index and data table fill, front-end connections, and the epoch and
//!   membership this node last read from etcd.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nessie_fabric::{Locality, OpKind};
use nessie_frontend::serve::Counters;
use nessie_serve::metered::OpMetrics;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::node::NodeContext;

/// Longest request head a scrape may send (request line and headers).
const MAX_REQUEST_BYTES: u64 = 8 * 1024;
/// How long a scraper may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the accept loop looks at its stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: &'static str,
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
        let help = "Bytes of the data table entries this node's writers hold (memcached bytes)";
        single(enc, "data_entry_bytes", help, g(f.entry_bytes))?;
        let help = "Bytes of this node's data table claimed by a size class (Redis used_memory)";
        single(
            enc,
            "data_bytes_claimed",
            help,
            g(f.pages_claimed * f.page_bytes),
        )?;
        let help = "Bytes of this node's data table (memcached limit_maxbytes, Redis maxmemory)";
        single(enc, "data_bytes_limit", help, g(f.pages * f.page_bytes))?;
        single(
            enc,
            "data_pages",
            "Data table pages of this node",
            g(f.pages),
        )?;
        let help = "Data table pages of this node claimed by a size class";
        single(enc, "data_pages_claimed", help, g(f.pages_claimed))?;
        let help = "Items this node's writers evicted to make room ([cache] eviction)";
        let n = self.node.table().evictions();
        single(enc, "evictions", help, ConstCounter::new(n))?;
        let help = "Pages this node's writers drained for another size class (the page mover)";
        let n = self.node.table().counters().pages_drained;
        single(enc, "pages_moved", help, ConstCounter::new(n))?;
        let policy = self.node.protocol_config().eviction;
        let l = PolicyLabel {
            policy: policy.name(),
        };
        let help = "The eviction policy, as a label (Redis maxmemory_policy)";
        family(enc, "eviction_policy", help, &[(l, ConstGauge::new(1i64))])?;
        // Every client-driven node runs a reclaimer of expired items (front end or not).
        if let Some(t) = self.node.expiry_totals() {
            let help = "Expired items this node's reclaimer deleted (Redis expired_keys)";
            let n = t.deleted.load(Ordering::Relaxed);
            single(enc, "expired_reclaimed", help, ConstCounter::new(n))?;
        }
        // Every front end of a node counts the reclaimer's unfetched deletions: one will do.
        if let Some((_, c)) = self.frontends.first() {
            if policy.tracks_access() {
                let help = "Of them, never read since written (memcached expired_unfetched)";
                let n = c.expired_unfetched.load(Ordering::Relaxed);
                single(enc, "expired_unfetched", help, ConstCounter::new(n))?;
            }
        }
        Ok(())
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
    ops.register(&mut r);
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
                let mut shedder = nessie_serve::accept::Shedder::new("metrics");
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
