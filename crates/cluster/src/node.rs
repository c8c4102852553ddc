//! A node process (`nessie node --config FILE --id K`): registers its index and data tables with
//! UCX, publishes its fabric info through the bootstrap service, fetches every peer's, runs its
//! client workers (every node is also a client: it writes DTEs into its own data table) and
//! serves the admin socket until SIGTERM or SIGINT.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use nessie_fabric::delay::Delayed;
use nessie_fabric::mem::DelayInjection;
use nessie_fabric::Endpoint;
use nessie_fabric_ucx::{UcxConfig, UcxNode};
use nessie_protocols::cd::{CdClient, ClusterView};
use nessie_protocols::KvClient;
use nessie_store::datatable::DataTable;
use nessie_store::{DATA_REGION, INDEX_REGION};

use crate::admin::{AdminServer, ClientPool, Handler, Request, Response};
use crate::bootstrap::{self, BootstrapServer, NodeInfo};
use crate::config::{ClusterConfig, Transport};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Bootstrap(#[from] bootstrap::BootstrapError),
    #[error("fabric: {0}")]
    Fabric(#[from] nessie_fabric::FabricError),
    #[error("{0}")]
    Other(String),
}

/// Options that are not part of the shared configuration.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    /// Inject random delays around every fabric operation of this node's clients (tests).
    pub delay: Option<DelayInjection>,
}

pub fn ucx_config(cfg: &ClusterConfig) -> UcxConfig {
    let transport = match cfg.cluster.transport {
        Transport::Shm => nessie_fabric_ucx::Transport::Shm,
        Transport::Tcp => nessie_fabric_ucx::Transport::Tcp,
        Transport::Auto => nessie_fabric_ucx::Transport::Auto,
    };
    UcxConfig {
        net_devices: cfg.cluster.net_devices.clone(),
        op_timeout: std::time::Duration::from_millis(cfg.cluster.op_timeout_ms),
        ..UcxConfig::new(transport)
    }
}

struct NodeHandler {
    id: u16,
    started: Instant,
    cfg: ClusterConfig,
    pool: ClientPool,
    ucx: Arc<UcxNode>,
    table: Arc<DataTable>,
}

impl NodeHandler {
    fn status(&self) -> serde_json::Value {
        let u = self.table.usage();
        let index = self.ucx.region(INDEX_REGION).expect("index region");
        let mut present = 0u64;
        let mut w = [0u8; 8];
        for i in 0..self.cfg.geometry.ites_per_node {
            // A status snapshot: a plain read of our own memory is good enough here.
            if index.read(i * 8, &mut w).is_ok() && w != [0; 8] {
                present += 1;
            }
        }
        let s = self.ucx.stats().total(Some(self.id));
        use nessie_fabric::{Locality, OpKind};
        let mut fabric = serde_json::Map::new();
        for loc in Locality::ALL {
            for kind in OpKind::ALL {
                let name = format!("{}_{}", format!("{loc:?}").to_lowercase(), format!("{kind:?}").to_lowercase());
                fabric.insert(format!("{name}_ops"), s.ops(kind, loc).into());
                fabric.insert(format!("{name}_bytes"), s.bytes(kind, loc).into());
            }
        }
        serde_json::json!({
            "node": self.id,
            "pid": std::process::id(),
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "transport": format!("{:?}", self.cfg.cluster.transport).to_lowercase(),
            "workers": self.cfg.node_entry(self.id).map(|n| n.workers).unwrap_or(0),
            "index": { "entries": self.cfg.geometry.ites_per_node, "present": present },
            "data_table": {
                "capacity": u.capacity, "allocated": u.allocated(), "free": u.free,
                "never_used": u.never_used, "reclaimed_total": u.reclaimed_total, "scans": u.scans,
            },
            "fabric": fabric,
        })
    }
}

impl Handler for NodeHandler {
    fn handle(&self, req: Request) -> Response {
        match req {
            Request::Ping => Response::Ok,
            Request::Status => Response::Status(self.status().to_string()),
            r => self.pool.serve(r),
        }
    }
}

/// Block the signals we wait for, before any thread is spawned, so they reach `sigwait`.
fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-mask calls on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Run node `id` of the cluster described by `config_path` until it is told to stop.
pub fn run_node(config_path: &Path, id: u16, opts: NodeOptions) -> Result<(), NodeError> {
    let signals = block_signals();
    let cfg = ClusterConfig::load(config_path)?;
    let entry = cfg.node_entry(id)?.clone();
    let base = config_path.parent().unwrap_or(Path::new("."));
    let admin_path = cfg.admin_path(id, base)?;
    let g = &cfg.geometry;
    let view = Arc::new(ClusterView::new(g.clone()).map_err(|e| NodeError::Other(e.to_string()))?);

    let mut regions = vec![0u64; 2];
    regions[INDEX_REGION as usize] = g.index_table_bytes();
    regions[DATA_REGION as usize] = g.data_table_bytes();
    let ucx = Arc::new(UcxNode::new(id, &regions, &ucx_config(&cfg))?);
    let own = NodeInfo {
        node: id,
        config_fingerprint: cfg.fingerprint(),
        geometry: g.clone(),
        fabric: hex::encode(serde_json::to_vec(ucx.info()).expect("serialises")),
        pid: std::process::id(),
    };
    let _bootstrap = BootstrapServer::start(entry.bootstrap, cfg.secret_bytes()?, own.clone())?;
    tracing::info!(node = id, addr = %entry.bootstrap, "waiting for peers");
    let infos = bootstrap::fetch_all(&cfg, &own)?;
    let fabric_infos = infos
        .iter()
        .map(|i| {
            hex::decode(&i.fabric)
                .ok()
                .and_then(|b| serde_json::from_slice::<nessie_fabric_ucx::NodeInfo>(&b).ok())
                .ok_or_else(|| NodeError::Other(format!("node {} published unreadable fabric info", i.node)))
        })
        .collect::<Result<Vec<_>, _>>()?;

    let pcfg = cfg.protocol_config();
    let table = Arc::new(DataTable::new(id as u32, view.dte, g.dtes_per_node, pcfg.clock_margin_ns));
    let mut clients: Vec<Box<dyn KvClient>> = Vec::new();
    for w in 0..entry.workers {
        let ep = ucx.endpoint(&fabric_infos)?;
        let c: Box<dyn KvClient> = match &opts.delay {
            Some(d) => Box::new(client(Delayed::new(ep, d.clone(), w as u64), &view, &table, w, &pcfg)?),
            None => Box::new(client(ep, &view, &table, w, &pcfg)?),
        };
        clients.push(c);
    }
    let handler = Arc::new(NodeHandler {
        id,
        started: Instant::now(),
        cfg: cfg.clone(),
        pool: ClientPool::new(clients),
        ucx: ucx.clone(),
        table,
    });
    let admin = AdminServer::start(&admin_path, handler)
        .map_err(|e| NodeError::Other(format!("admin socket {}: {e}", admin_path.display())))?;
    tracing::info!(node = id, admin = %admin_path.display(), "ready");
    eprintln!("nessie node {id}: ready (admin socket {})", admin_path.display());

    let mut sig: libc::c_int = 0;
    // SAFETY: `signals` was initialised by block_signals.
    unsafe { libc::sigwait(&signals, &mut sig) };
    eprintln!("nessie node {id}: stopping (signal {sig})");
    drop(admin);
    Ok(())
}

fn client<E: Endpoint + 'static>(
    ep: E,
    view: &Arc<ClusterView>,
    table: &Arc<DataTable>,
    worker: u16,
    cfg: &nessie_protocols::ProtocolConfig,
) -> Result<CdClient<E>, NodeError> {
    CdClient::new(ep, view.clone(), table.clone(), worker, cfg.clone()).map_err(|e| NodeError::Other(e.to_string()))
}

/// A `KvClient` that forwards operations to a node's admin socket (the CLI and multi-process
/// tests use it). Errors reported by the node come back as `Error::Node`.
pub struct AdminKvClient {
    conn: crate::admin::AdminClient,
}

impl AdminKvClient {
    pub fn connect(path: &Path, timeout: std::time::Duration) -> Result<Self, crate::admin::AdminError> {
        Ok(Self { conn: crate::admin::AdminClient::connect(path, timeout)? })
    }

    fn call(&mut self, req: Request) -> Result<Response, nessie_protocols::Error> {
        self.conn.call(&req).map_err(|e| nessie_protocols::Error::Node(e.to_string()))
    }
}

impl KvClient for AdminKvClient {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, nessie_protocols::Error> {
        match self.call(Request::Get(key.to_vec()))? {
            Response::Value(v) => Ok(Some(v)),
            Response::NotFound => Ok(None),
            Response::Error(e) => Err(crate::admin::decode_error(&e)),
            r => Err(nessie_protocols::Error::Node(format!("unexpected reply {r:?}"))),
        }
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), nessie_protocols::Error> {
        match self.call(Request::Put(key.to_vec(), value.to_vec()))? {
            Response::Ok => Ok(()),
            Response::Error(e) => Err(crate::admin::decode_error(&e)),
            r => Err(nessie_protocols::Error::Node(format!("unexpected reply {r:?}"))),
        }
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), nessie_protocols::Error> {
        match self.call(Request::Delete(key.to_vec()))? {
            Response::Ok => Ok(()),
            Response::Error(e) => Err(crate::admin::decode_error(&e)),
            r => Err(nessie_protocols::Error::Node(format!("unexpected reply {r:?}"))),
        }
    }
}
