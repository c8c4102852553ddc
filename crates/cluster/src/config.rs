//! The cluster configuration file (`cluster.toml`): what every node and client of one cluster
//! must agree on, plus where each node listens. Every field is validated on load with an error
//! that names it.
//!
//! ```toml
//! [cluster]
//! name = "demo"
//! secret = "5f1c…"            # hex, at least 32 bytes; authenticates joiners
//! transport = "shm"           # shm | tcp | auto (UCX's choice: verbs on RDMA hardware)
//!
//! [geometry]                  # fixed at creation: the memory format
//! nodes = 3
//! ites_per_node = 65536       # or, instead of these two,
//! dtes_per_node = 16384       # memory_per_node = "128MiB" (index and data table per node)
//! key_max = 128
//! value_max = 16384
//! hash_functions = 3
//! filter_bits = 7
//!
//! [protocol]
//! expiry_ms = 1000
//!
//! [[node]]
//! id = 0
//! bootstrap = "127.0.0.1:7400"
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use nessie_protocols::{Optimizations, ProtocolConfig, RetryPolicy};
use nessie_store::{Geometry, GeometryError};

/// Fewest bytes in a cluster secret.
pub const MIN_SECRET_BYTES: usize = 32;
/// Most client workers one node process may run.
pub const MAX_WORKERS_PER_NODE: u16 = 256;
/// Largest configuration file we read.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Shared memory between processes of one host.
    Shm,
    /// TCP (between hosts, or loopback).
    Tcp,
    /// Let UCX choose (RDMA verbs where available).
    Auto,
}

impl std::str::FromStr for Transport {
    type Err = InvalidConfig;
    fn from_str(s: &str) -> Result<Self, InvalidConfig> {
        match s {
            "shm" => Ok(Transport::Shm),
            "tcp" => Ok(Transport::Tcp),
            "auto" => Ok(Transport::Auto),
            _ => Err(InvalidConfig::Transport(s.to_string())),
        }
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    pub name: String,
    /// Hex-encoded shared secret.
    pub secret: String,
    pub transport: Transport,
    /// How long a node waits for its peers at start-up.
    #[serde(default = "default_bootstrap_timeout_ms")]
    pub bootstrap_timeout_ms: u64,
    /// Network devices UCX may use (`UCX_NET_DEVICES` syntax, e.g. `"lo"`, `"eth0"`,
    /// `"mlx5_0:1"`); unset lets UCX use all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_devices: Option<String>,
    /// Upper bound on one fabric operation: past it the peer is declared unreachable.
    #[serde(default = "default_op_timeout_ms")]
    pub op_timeout_ms: u64,
    /// Protocol: cd (Nessie), sd (NessieSD, server-driven), hy (NessieHY, hybrid) or pilaf
    /// (Pilaf: client GETs verified by CRC64, server-driven writes).
    #[serde(default = "default_mode")]
    pub mode: String,
    /// Server threads per node (sd, hy and pilaf).
    #[serde(default = "default_server_threads")]
    pub server_threads: u16,
    /// Client workers (admin pool and benchmark threads) each node may run at once in sd and
    /// hy mode: every node reserves a request slot for each.
    #[serde(default = "default_max_clients")]
    pub max_clients_per_node: u16,
    /// What an idle server thread does between polls of its request slots (sd, hy): "spin"
    /// (busy-poll without pause, the paper's servers on dedicated cores) or "yield" (keep
    /// polling but give the core to any runnable thread first; for shared or small machines).
    #[serde(default = "default_server_poll")]
    pub server_poll: String,
    /// Huge pages for the node's index and data tables: "off", "try" (use reserved huge pages
    /// when there are enough) or "require" (refuse to start without them).
    #[serde(default)]
    pub huge_pages: nessie_fabric_ucx::HugePages,
    /// Copies of every node's index, data and page tables, on consecutive nodes (cd only; 1 to 3).
    /// With more than one, a node that fails loses nothing: see `nessie_protocols::replica`.
    #[serde(default = "default_replicas")]
    pub replicas: u8,
    /// Mirror slots every node keeps free, each the size of one node's tables, for the copies
    /// of a node gone for good (re-replication, after `membership.replace_after_s`). 0: a
    /// failed node's copies come back only when it restarts. Unset: 1 with replication and
    /// a node beyond the copies, else 0 ([`ClusterConfig::spare_copies`]). A slot costs
    /// address space, not memory, until a copy moves into it (`nessie_fabric_ucx::alloc_prio`),
    /// except on hugetlb pages (reserved when mapped) and RDMA (registration pins it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spare_copies: Option<u8>,
    /// Index slots every node keeps, each room for a copy of one index partition, for
    /// partitions migrating to it (`nessie migrate`; `nessie_protocols::replica`, the per-ITE
    /// handover; the balancer). Unset: with replication, 2 × `replicas` × the partitions of
    /// one node's index, else 0 ([`ClusterConfig::index_slots`]).
    /// Like a spare slot, a slot costs address space until a copy moves into it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_slots: Option<u16>,
    /// Nodes (ids of `[[node]]` entries) the cluster starts without: each joins later, while
    /// the cluster serves (`nessie join`; `nessie_membership::standby`). Epoch 1 places what
    /// they would hold on the others: their index partitions in index slots, the copies they
    /// would hold of others' tables in spare slots. Needs membership and replication.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub standby: Vec<u16>,
    /// pilaf: how long a freed extent waits before reuse, in milliseconds (default: the expiry
    /// period; 0 = at once, as in the paper, leaving readers of a reused extent to the CRC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pilaf_reuse_delay_ms: Option<u64>,
    /// Microseconds each node's progress thread keeps polling after the last event before it
    /// sleeps (0: sleep at once; an idle node then uses no CPU). Over tcp every operation a
    /// peer sends needs this thread, and a sleeping one costs a wake-up
    /// (`UcxConfig::progress_spin`). At most [`MAX_PROGRESS_SPIN_US`]. Peers need not agree.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub progress_spin_us: u64,
    /// Operations on a node's own memory (its ITEs) go straight to memory on shm and tcp
    /// (`UcxConfig::direct_loopback`); `false` sends them through UCX. Peers need not agree.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub direct_loopback: bool,
    /// Operations on other nodes' memory go straight to it over shm, where UCX maps it into
    /// each process (`UcxConfig::direct_peers`); `false` sends them through UCX. Peers need
    /// not agree.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub direct_peers: bool,
    /// Microseconds a client worker polls for an operation's answer before it sleeps until the
    /// answer arrives (unset: the transport's default, `Transport::default_wait_spin`: 10 on
    /// tcp; shm polls throughout). At most [`MAX_WAIT_SPIN_US`], which polls throughout.
    /// Peers need not agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_spin_us: Option<u64>,
    /// Protected mode (`crate::exposure`): a node refuses to listen, or to reach etcd, on an
    /// address that is neither loopback, private nor link-local, since nothing after
    /// bootstrap is authenticated or encrypted. `false` (`nessie up --no-protected-mode`)
    /// when another boundary guards the cluster. Peers need not agree.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub protected_mode: bool,
}

/// Longest `progress_spin_us` accepted (a spinning progress thread holds a core that long
/// after every event).
pub const MAX_PROGRESS_SPIN_US: u64 = 10_000;
/// Default index slots per node, in shares (`replicas` × partitions per node; see
/// [`ClusterConfig::index_slots`]).
pub const INDEX_SLOTS_PER_SHARE: u32 = 2;
/// Largest `wait_spin_us` (longer than any operation may take: polls throughout).
pub const MAX_WAIT_SPIN_US: u64 = 600_000_000;

fn yes() -> bool {
    true
}

fn is_true(v: &bool) -> bool {
    *v
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// The spare slots a configuration without `cluster.spare_copies` gets: one when a failed
/// node's copies have somewhere to go.
pub fn default_spare_copies(replicas: u8, nodes: u32) -> u8 {
    (replicas >= 2 && nodes > replicas as u32) as u8
}

fn default_replicas() -> u8 {
    1
}

fn default_server_poll() -> String {
    "yield".into()
}

fn default_mode() -> String {
    "cd".into()
}

fn default_server_threads() -> u16 {
    1
}

fn default_max_clients() -> u16 {
    32
}

fn default_op_timeout_ms() -> u64 {
    5_000
}

fn default_bootstrap_timeout_ms() -> u64 {
    30_000
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProtocolSection {
    pub expiry_ms: u64,
    pub clock_margin_ms: u64,
    pub max_migrate_depth: u8,
    /// DTEs in each client worker's cache.
    pub cache_entries: usize,
    pub optimizations: Optimizations,
    /// Largest DTE a GET reads whole even with multi-read on (0: always split).
    pub whole_read_max: u64,
    pub retry: RetryPolicy,
}

impl Default for ProtocolSection {
    fn default() -> Self {
        let d = ProtocolConfig::default();
        Self {
            expiry_ms: d.expiry_ns / 1_000_000,
            clock_margin_ms: d.clock_margin_ns / 1_000_000,
            max_migrate_depth: d.max_migrate_depth,
            cache_entries: d.cache_entries,
            optimizations: d.optimizations,
            whole_read_max: d.whole_read_max,
            retry: d.retry,
        }
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    pub id: u16,
    /// Address of the node's bootstrap (rendezvous) service.
    pub bootstrap: SocketAddr,
    /// Unix socket for local administration (CLI); default `<config dir>/node-<id>.sock`.
    #[serde(default)]
    pub admin: Option<PathBuf>,
    /// Client workers in the node process.
    #[serde(default = "default_workers")]
    pub workers: u16,
}

fn default_workers() -> u16 {
    2
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    pub cluster: ClusterSection,
    #[serde(deserialize_with = "geometry_section")]
    pub geometry: Geometry,
    #[serde(default)]
    pub protocol: ProtocolSection,
    /// Membership through etcd; absent: nodes register nowhere and no failure is detected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub membership: Option<MembershipSection>,
    /// Protocol front ends each node serves; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontends: Option<FrontendsSection>,
    /// What the store does when full.
    #[serde(default)]
    pub cache: CacheSection,
    pub node: Vec<NodeEntry>,
}

/// `[cache]`: what the store does when it is full (issue 41).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheSection {
    /// Eviction policy, by Redis's `maxmemory-policy` names: `noeviction` (refuse writes when
    /// full, the default), `allkeys-lru`, `allkeys-lfu`, `allkeys-random`, `volatile-lru`,
    /// `volatile-lfu`, `volatile-random` or `volatile-ttl`.
    pub eviction: String,
    /// Entries sampled per victim, 1 to 64 (Redis's `maxmemory-samples`, default 5): more
    /// choose victims closer to the policy's ideal for more READs per eviction.
    pub eviction_samples: u8,
    /// The longest item the client-driven store takes, in bytes (memcached's `-I`, default
    /// 1 MiB; at most 512 MiB, Redis's string limit). Items longer than one entry
    /// (`[geometry] value_max`) are stored in chunks behind a manifest
    /// (`nessie_protocols::large`). The other modes keep items to `value_max`.
    pub item_max: u64,
    /// How old, in ms, the chunks of a large item no manifest names must be before the
    /// reclaimer deletes them (default 60000; 1000 to a day). With membership it must exceed
    /// the lease TTL: a writer paused longer is fenced and publishes nothing.
    pub orphan_grace_ms: u64,
    /// Whether each node reclaims expired items in the background (client-driven mode;
    /// default true). `nessie bench` turns it off: its workload writes no expiring item, and
    /// its figures count every fabric operation and CPU second of the nodes.
    pub expiry_reclaim: bool,
}

impl Default for CacheSection {
    fn default() -> Self {
        Self {
            eviction: nessie_protocols::Eviction::NoEviction.name().to_string(),
            eviction_samples: nessie_protocols::config::DEFAULT_EVICTION_SAMPLES,
            item_max: nessie_protocols::large::DEFAULT_ITEM_MAX,
            orphan_grace_ms: nessie_protocols::large::ORPHAN_GRACE_MS,
            expiry_reclaim: true,
        }
    }
}

/// `[frontends]`: the protocols applications speak, served by every node process (issue 12).
/// Node K listens on the base port + K.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontendsSection {
    /// memcached text protocol: node K listens on `memcached_port + K`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memcached_port: Option<u16>,
    /// The Redis protocol (RESP2, RESP3): node K listens on `resp_port + K`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resp_port: Option<u16>,
    /// The Redis front end's password (its default user's, as `requirepass`): clients must
    /// `AUTH` first. This file is created readable by its owner only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resp_password: Option<Secret>,
    /// Prometheus metrics (`/metrics`, text exposition): node K listens on
    /// `metrics_port + K`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_port: Option<u16>,
    /// The address the front ends listen on (loopback unless you say otherwise).
    #[serde(default = "default_bind")]
    pub bind: String,
    /// Most client connections one node's front end serves at once; more are refused with an
    /// error reply, as memcached does.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// Event loops (threads) per protocol per node, each serving many connections and running
    /// their operations: one, as Redis has, unless the machine has cores to spare.
    #[serde(default = "default_frontend_threads")]
    pub threads: u16,
    /// Operations each event loop runs at once for a pipelined batch's plain GETs and SETs
    /// (client-driven mode; `nessie_inflight`): 1 runs every command on its own.
    #[serde(default = "default_frontend_inflight")]
    pub inflight: u16,
}

/// Default `[frontends] threads`.
pub const DEFAULT_FRONTEND_THREADS: u16 = 1;
/// Most `[frontends] threads`.
pub const MAX_FRONTEND_THREADS: u16 = nessie_serve::frontends::MAX_LOOPS;

fn default_frontend_threads() -> u16 {
    DEFAULT_FRONTEND_THREADS
}

/// Default `[frontends] inflight`: one command at a time. On a 2-core machine, whose loopback
/// fabric leaves no latency to hide, 16 in flight ran pipelined 100-byte SETs at 0.78x and
/// GETs at 0.82x over shm, 0.97x and 0.95x over tcp (`scripts/frontend-inflight.sh`,
/// `docs/bench.md`): worth it only where a fabric operation waits far longer than it works,
/// and where clients do not rely on the order of a connection's commands on different keys.
pub const DEFAULT_FRONTEND_INFLIGHT: u16 = 1;
/// Most `[frontends] inflight`: a pipeline's most slots.
pub const MAX_FRONTEND_INFLIGHT: u16 = nessie_inflight::MAX_SLOTS as u16;

fn default_frontend_inflight() -> u16 {
    DEFAULT_FRONTEND_INFLIGHT
}

/// A password: written to `cluster.toml` as it is, never printed (`Debug` hides it).
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// Longest front-end password.
pub const MAX_PASSWORD_LEN: usize = 512;

/// Most connections anybody may let one node's front end serve.
pub const MAX_FRONTEND_CONNECTIONS: u32 = 65_536;

fn default_bind() -> String {
    "127.0.0.1".into()
}

/// Default `[frontends] max_connections`.
pub const DEFAULT_FRONTEND_CONNECTIONS: u32 = 1024;

fn default_max_connections() -> u32 {
    DEFAULT_FRONTEND_CONNECTIONS
}

impl FrontendsSection {
    /// Node `id`'s memcached address, if it serves memcached.
    pub fn memcached_addr(&self, id: u16) -> Option<std::net::SocketAddr> {
        self.addr(self.memcached_port?, id)
    }

    /// Node `id`'s metrics address, if it serves metrics.
    pub fn metrics_addr(&self, id: u16) -> Option<std::net::SocketAddr> {
        self.addr(self.metrics_port?, id)
    }

    /// Node `id`'s Redis-protocol address, if it serves it.
    pub fn resp_addr(&self, id: u16) -> Option<std::net::SocketAddr> {
        self.addr(self.resp_port?, id)
    }

    fn addr(&self, base: u16, id: u16) -> Option<std::net::SocketAddr> {
        let ip: std::net::IpAddr = self.bind.parse().ok()?;
        Some(std::net::SocketAddr::new(ip, base.checked_add(id)?))
    }
}

/// `[membership]`: the etcd that holds the cluster's configuration and the nodes' leases.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MembershipSection {
    /// etcd client URL, `http://HOST:PORT`, or `https://HOST:PORT` for TLS.
    pub etcd: String,
    /// A node whose lease has not been refreshed for this long is declared failed.
    #[serde(default = "default_lease_ttl_s")]
    pub lease_ttl_s: u64,
    /// How long a node must have been failed before its copies move to spare slots on other
    /// nodes (`cluster.spare_copies`): long enough that a node restarted quickly rejoins
    /// instead. At least three lease TTLs.
    #[serde(default = "default_replace_after_s")]
    pub replace_after_s: u64,
    /// Whether the cluster moves index partitions by itself (the balancer, `rejoin.rs`): the
    /// copies of a node failed for `replace_after_s` are re-created on the survivors, and a
    /// node that holds fewer than its share (back after that, say) is given some. Default
    /// true; with false, only `nessie migrate` moves partitions.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub rebalance: bool,
    /// The etcd user every node and tool authenticates as, when etcd's auth is enabled; with
    /// `etcd_password` (`nessie up --etcd-user U --etcd-password-file F`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_user: Option<String>,
    /// That user's password, kept here as the cluster secret is (`cluster.toml` is created
    /// mode 0600); sent to etcd in clear over `http://`, encrypted over `https://`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_password: Option<Secret>,
    /// PEM CA certificates that signed etcd's server certificate (an `https://` etcd; without
    /// it, the public roots). An absolute path, read by every node and tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_ca: Option<std::path::PathBuf>,
    /// PEM client certificate presented to etcd (`--client-cert-auth`), with `etcd_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_cert: Option<std::path::PathBuf>,
    /// PEM private key of `etcd_cert`, mode 0600 (a key others can read is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_key: Option<std::path::PathBuf>,
}

impl MembershipSection {
    /// The TLS files this section names.
    pub fn tls(&self) -> nessie_membership::tls::TlsFiles {
        nessie_membership::tls::TlsFiles {
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
        }
    }

    /// A client of this etcd with the per-request `timeout`, authenticated as `etcd_user`
    /// when one is set.
    pub fn client(
        &self,
        timeout: std::time::Duration,
    ) -> Result<nessie_membership::etcd::Etcd, nessie_membership::etcd::EtcdError> {
        self.client_without_tls(timeout)?.with_tls(&self.tls())
    }

    /// [`MembershipSection::client`] before its TLS files are read: what validating a
    /// configuration checks, so that commands that never reach etcd do not read them.
    fn client_without_tls(
        &self,
        timeout: std::time::Duration,
    ) -> Result<nessie_membership::etcd::Etcd, nessie_membership::etcd::EtcdError> {
        let etcd = nessie_membership::etcd::Etcd::with_timeout(&self.etcd, timeout)?;
        match (&self.etcd_user, &self.etcd_password) {
            (Some(user), Some(password)) => etcd.with_credentials(user, &password.0),
            (None, None) => Ok(etcd),
            (Some(_), None) => Err(nessie_membership::etcd::EtcdError::Auth {
                url: self.etcd.clone(),
                who: "this client".into(),
                why: "membership.etcd_user is set without membership.etcd_password".into(),
            }),
            (None, Some(_)) => Err(nessie_membership::etcd::EtcdError::Auth {
                url: self.etcd.clone(),
                who: "this client".into(),
                why: "membership.etcd_password is set without membership.etcd_user".into(),
            }),
        }
    }
}

/// The per-request timeout of the membership's etcd clients.
pub const ETCD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

fn default_lease_ttl_s() -> u64 {
    nessie_membership::DEFAULT_LEASE_TTL_S
}

fn default_replace_after_s() -> u64 {
    nessie_membership::DEFAULT_REPLACE_AFTER_S
}

/// Index load factor a `memory_per_node` budget is sized for, when the data table is full.
pub const MEMORY_LOAD_FACTOR: f64 = 0.5;

/// The `[geometry]` section as written: table sizes as entry counts, or one memory budget per
/// node (`memory_per_node`: bytes, or a string such as "128MiB") that
/// [`Geometry::for_memory`] turns into entry counts. The file `nessie up` writes holds counts.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct GeometrySection {
    nodes: u32,
    ites_per_node: Option<u64>,
    dtes_per_node: Option<u64>,
    memory_per_node: Option<ByteCount>,
    key_max: u32,
    value_max: u32,
    hash_functions: u8,
    filter_bits: u8,
}

#[derive(serde::Deserialize)]
#[serde(untagged)]
enum ByteCount {
    Bytes(u64),
    Text(String),
}

fn geometry_section<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Geometry, D::Error> {
    use serde::de::Error;
    let s = <GeometrySection as serde::Deserialize>::deserialize(d)?;
    let explicit = |ites_per_node, dtes_per_node| Geometry {
        nodes: s.nodes,
        ites_per_node,
        dtes_per_node,
        key_max: s.key_max,
        value_max: s.value_max,
        hash_functions: s.hash_functions,
        filter_bits: s.filter_bits,
    };
    match (&s.memory_per_node, s.ites_per_node, s.dtes_per_node) {
        (None, Some(i), Some(t)) => Ok(explicit(i, t)),
        (Some(m), None, None) => {
            let bytes = match m {
                ByteCount::Bytes(b) => *b,
                ByteCount::Text(t) => nessie_store::geometry::parse_bytes(t)
                    .map_err(|e| D::Error::custom(format!("memory_per_node: {e}")))?,
            };
            let g =
                Geometry::for_memory(s.nodes, bytes, s.key_max, s.value_max, MEMORY_LOAD_FACTOR)
                    .map_err(|e| D::Error::custom(format!("memory_per_node: {e}")))?;
            Ok(explicit(g.ites_per_node, g.dtes_per_node))
        }
        _ => Err(D::Error::custom(
            "[geometry] needs either memory_per_node or both ites_per_node and dtes_per_node",
        )),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{path}: {msg}")]
    Parse { path: PathBuf, msg: String },
    #[error("invalid configuration: {0}")]
    Invalid(#[from] InvalidConfig),
}

/// What is wrong with a configuration that parsed: each names the field.
#[derive(Debug, thiserror::Error)]
pub enum InvalidConfig {
    #[error("unknown transport {0:?}: use shm, tcp or auto")]
    Transport(String),
    #[error("[cache] eviction: {0}")]
    Eviction(String),
    #[error("[cache] item_max / orphan_grace_ms: {0}")]
    ItemMax(String),
    #[error("cluster.secret is not hex: {0}")]
    SecretNotHex(#[source] hex::FromHexError),
    #[error("cluster.secret has {0} bytes; at least {MIN_SECRET_BYTES} are required")]
    SecretTooShort(usize),
    #[error("cluster.bootstrap_timeout_ms = {0} is not in 1..=600000")]
    BootstrapTimeout(u64),
    #[error("cluster.op_timeout_ms = {0} is not in 10..=600000")]
    OpTimeout(u64),
    #[error("cluster.progress_spin_us = {0} is more than {MAX_PROGRESS_SPIN_US}")]
    ProgressSpin(u64),
    #[error("cluster.wait_spin_us = {0} is more than {MAX_WAIT_SPIN_US}")]
    WaitSpin(u64),
    #[error(transparent)]
    Geometry(#[from] GeometryError),
    #[error("cluster.server_poll = {0:?} is not spin or yield")]
    ServerPoll(String),
    #[error("cluster.mode = {0:?} is not one of cd, sd, hy, pilaf")]
    Mode(String),
    #[error("membership.etcd: {0}")]
    Etcd(String),
    /// A TLS setting of `[membership]`; the message names it.
    #[error("{0}")]
    EtcdTls(String),
    #[error("cluster.replicas: {0}")]
    Replicas(String),
    #[error("cluster.spare_copies: {0}")]
    SpareCopies(String),
    #[error("cluster.index_slots: {0}")]
    IndexSlots(String),
    #[error("cluster.standby: {0}")]
    Standby(String),
    #[error("frontends: {0}")]
    Frontends(String),
    #[error("membership.lease_ttl_s = {0} is not in {lo}..={hi}", lo = nessie_membership::MIN_LEASE_TTL_S, hi = nessie_membership::MAX_LEASE_TTL_S)]
    LeaseTtl(u64),
    #[error("membership.lease_ttl_s = {ttl_s} is too short for protocol.expiry_ms = {expiry_ms}: two thirds of the lease must outlast a write attempt (one expiry period); use a lease TTL above {min_s} s or a shorter expiry", min_s = 3 * expiry_ms / 2000)]
    LeaseTooShort { ttl_s: u64, expiry_ms: u64 },
    #[error("membership.replace_after_s = {after_s} is too short for lease_ttl_s = {ttl_s}: a failed node must have time to restart and rejoin before its copies move; use at least {min_s} s", min_s = nessie_membership::REPLACE_AFTER_TTLS * ttl_s)]
    ReplaceTooSoon { after_s: u64, ttl_s: u64 },
    /// The mode's or the server-driven machinery's settings in `[cluster]`.
    #[error("cluster: {0}")]
    Cluster(#[source] nessie_protocols::ConfigError),
    #[error("protocol: {0}")]
    Protocol(#[source] nessie_protocols::ConfigError),
    #[error("geometry.nodes = {nodes} but {listed} [[node]] entries are listed")]
    NodeCount { nodes: u32, listed: usize },
    #[error("node id {id} is out of range 0..{nodes}")]
    NodeId { id: u16, nodes: usize },
    #[error("node id {0} is listed twice")]
    DuplicateNode(u16),
    #[error("node {id}: workers = {workers} is not in 1..={MAX_WORKERS_PER_NODE}")]
    Workers { id: u16, workers: u16 },
    #[error("nodes {a} and {b} share the bootstrap address {addr}")]
    SharedBootstrap { a: u16, b: u16, addr: SocketAddr },
    #[error("no node {id} in the configuration (nodes 0..{nodes})")]
    NoSuchNode { id: u16, nodes: usize },
}

impl ClusterConfig {
    /// Read and validate a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let io = |err| ConfigError::Io {
            path: path.to_path_buf(),
            err,
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_CONFIG_BYTES {
            return Err(ConfigError::Parse {
                path: path.into(),
                msg: format!("{len} bytes exceeds {MAX_CONFIG_BYTES}"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        let cfg: ClusterConfig = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            msg: e.to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("configuration serialises")
    }

    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        std::fs::write(path, self.to_toml()).map_err(|err| ConfigError::Io {
            path: path.into(),
            err,
        })
    }

    /// Check every field; the error names the first one that is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_cluster()?;
        self.geometry.validate().map_err(InvalidConfig::from)?;
        self.validate_mode()?;
        self.eviction()?;
        self.protocol_config()
            .validate()
            .map_err(InvalidConfig::Protocol)?;
        self.validate_nodes()?;
        self.validate_membership()?;
        // After membership: the grace is checked against a valid lease.
        self.large_limits()?;
        self.validate_frontends()?;
        self.replica_set()?;
        self.validate_standby()?;
        Ok(())
    }

    /// `cluster.standby`: known, distinct ids, with membership and replication, and epoch 1
    /// able to place what they would hold (`nessie_membership::standby::first_epoch`, run dry).
    fn validate_standby(&self) -> Result<(), InvalidConfig> {
        let standby = &self.cluster.standby;
        if standby.is_empty() {
            return Ok(());
        }
        let bad = |why: String| InvalidConfig::Standby(why);
        for (i, id) in standby.iter().enumerate() {
            if !self.node.iter().any(|n| n.id == *id) {
                return Err(bad(format!("node {id} is not a [[node]] of this cluster")));
            }
            if standby[..i].contains(id) {
                return Err(bad(format!("node {id} is listed twice")));
            }
        }
        if self.membership.is_none() || self.cluster.replicas < 2 {
            return Err(bad(
                "standby nodes join through membership (etcd) and take copies: they need [membership] and \
                 replicas of 2 or 3"
                    .into(),
            ));
        }
        let set = self.replica_set()?;
        nessie_membership::standby::first_epoch(
            &self.node.iter().map(|n| n.id).collect::<Vec<_>>(),
            standby,
            &Default::default(),
            &set,
        )
        .map_err(|e| bad(e.to_string()))?;
        Ok(())
    }

    fn validate_frontends(&self) -> Result<(), InvalidConfig> {
        let Some(f) = &self.frontends else {
            return Ok(());
        };
        if f.bind.parse::<std::net::IpAddr>().is_err() {
            return Err(InvalidConfig::Frontends(format!(
                "bind = {:?} is not an IP address",
                f.bind
            )));
        }
        if let Some(Secret(p)) = &f.resp_password {
            if p.is_empty() || p.len() > MAX_PASSWORD_LEN || p.chars().any(char::is_control) {
                return Err(InvalidConfig::Frontends(format!(
                    "resp_password must be 1 to {MAX_PASSWORD_LEN} bytes without control characters"
                )));
            }
        }
        if !(1..=MAX_FRONTEND_THREADS).contains(&f.threads) {
            return Err(InvalidConfig::Frontends(format!(
                "threads = {} is not in 1..={MAX_FRONTEND_THREADS}",
                f.threads
            )));
        }
        if !(1..=MAX_FRONTEND_INFLIGHT).contains(&f.inflight) {
            return Err(InvalidConfig::Frontends(format!(
                "inflight = {} is not in 1..={MAX_FRONTEND_INFLIGHT}",
                f.inflight
            )));
        }
        if !(1..=MAX_FRONTEND_CONNECTIONS).contains(&f.max_connections) {
            return Err(InvalidConfig::Frontends(format!(
                "max_connections = {} is not in 1..={MAX_FRONTEND_CONNECTIONS}",
                f.max_connections
            )));
        }
        let n = self.geometry.nodes;
        let ranges: Vec<(&str, u16)> = [
            ("memcached_port", f.memcached_port),
            ("resp_port", f.resp_port),
            ("metrics_port", f.metrics_port),
        ]
        .into_iter()
        .filter_map(|(k, p)| p.map(|p| (k, p)))
        .collect();
        for &(key, base) in &ranges {
            let last = base as u32 + n - 1;
            if base == 0 || last > u16::MAX as u32 {
                return Err(InvalidConfig::Frontends(format!(
                    "{key} = {base}: ports {base}..={last} (one per node) must be in 1..=65535"
                )));
            }
        }
        for (i, &(ka, a)) in ranges.iter().enumerate() {
            for &(kb, b) in &ranges[i + 1..] {
                if (a as u32) < b as u32 + n && (b as u32) < a as u32 + n {
                    return Err(InvalidConfig::Frontends(format!(
                        "{ka} = {a} and {kb} = {b} overlap: each takes {n} ports (one per node)"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Spare mirror slots per node (`cluster.spare_copies`), by default one whenever a copy
    /// of a node gone for good has somewhere to go: with replication and more nodes than
    /// copies. So R copies come back after a failure without a flag.
    pub fn spare_copies(&self) -> u8 {
        self.cluster
            .spare_copies
            .unwrap_or_else(|| default_spare_copies(self.cluster.replicas, self.geometry.nodes))
    }

    /// Index slots per node (`cluster.index_slots`). By default, with replication (none
    /// without), room for twice a node's share of index partition copies: every copy moves
    /// whole (a copy that stays in a chain takes a new slot too, the old one retired for a
    /// settle time), and a node back empty after a failure, which holds its share in slots,
    /// must still take more when another node fails for good. `replicas` × partitions per
    /// node was measured too few for that (`cli/tests/migrate.rs`, the balancer's test: 8 of
    /// 8 slots taken on two of the three survivors, the plan stuck).
    pub fn index_slots(&self) -> u16 {
        self.cluster.index_slots.unwrap_or_else(|| {
            let g = &self.geometry;
            if self.cluster.replicas < 2 || g.nodes == 0 || g.ites_per_node == 0 {
                return 0;
            }
            let per_node = nessie_store::IndexPartitions::new(g.nodes, g.ites_per_node).per_node();
            (INDEX_SLOTS_PER_SHARE * self.cluster.replicas as u32 * per_node)
                .min(nessie_protocols::fence::MAX_INDEX_SLOTS as u32 - 1) as u16
        })
    }

    /// Where the copies of each node's tables are (`cluster.replicas`).
    pub fn replica_set(&self) -> Result<nessie_protocols::ReplicaSet, InvalidConfig> {
        let g = &self.geometry;
        let (ite, _) = g.validate()?;
        let r = self.cluster.replicas;
        let set = match r {
            1 => nessie_protocols::ReplicaSet::single(g.nodes as u16, ite),
            r => nessie_protocols::ReplicaSet::new(r, g.nodes as u16, ite, &self.protocol_config())
                .map_err(|e| InvalidConfig::Replicas(e.to_string()))?,
        };
        let set = set
            .with_spare_copies(self.spare_copies())
            .map_err(|e| InvalidConfig::SpareCopies(e.to_string()))?;
        let parts = nessie_store::IndexPartitions::new(g.nodes, g.ites_per_node);
        let set = set
            .with_index_slots(parts, self.index_slots())
            .map_err(|e| InvalidConfig::IndexSlots(e.to_string()))?;
        // A node's view of membership is fresh for a lease TTL (`nessie_membership::Monitor`): a copy
        // takes over deciding only once every node has learnt of the failure or stopped writing.
        let settle = self.membership.as_ref().map_or(0, |m| {
            (m.lease_ttl_s * 1_000_000_000)
                .saturating_add(self.protocol.clock_margin_ms * 1_000_000)
        });
        // Nodes that have not heard of a failure may read the failed primary for as long as
        // their view is fresh enough to read by (`nessie_membership::read_view_ns`).
        let read_settle = self.membership.as_ref().map(|m| {
            nessie_membership::read_view_ns(m.lease_ttl_s)
                .saturating_add(self.protocol.clock_margin_ms * 1_000_000)
        });
        let set = set.with_settle_at_least(settle);
        let set = match read_settle {
            Some(ns) => set.with_read_settle(ns),
            None => set,
        };
        if r > 1 && self.membership.is_none() {
            return Err(InvalidConfig::Replicas(format!(
                "{r} copies need [membership] (etcd), which declares failed nodes"
            )));
        }
        Ok(set)
    }

    /// The `[membership]` etcd URL and lease TTL.
    fn validate_membership(&self) -> Result<(), InvalidConfig> {
        use nessie_membership::{MAX_LEASE_TTL_S, MIN_LEASE_TTL_S};
        let Some(m) = &self.membership else {
            return Ok(());
        };
        m.client_without_tls(ETCD_TIMEOUT)
            .map_err(|e| InvalidConfig::Etcd(e.to_string()))?;
        // The files themselves are read when a client is made (`up` makes one at once).
        m.tls()
            .check_shape(&m.etcd)
            .map_err(|p| InvalidConfig::EtcdTls(p.to_string()))?;
        if !(MIN_LEASE_TTL_S..=MAX_LEASE_TTL_S).contains(&m.lease_ttl_s) {
            return Err(InvalidConfig::LeaseTtl(m.lease_ttl_s));
        }
        // The lease is refreshed every third of its TTL, and a write attempt (one expiry
        // period) must fit in what is left of it, or writers would be fenced between refreshes.
        if 2 * m.lease_ttl_s * 1000 <= 3 * self.protocol.expiry_ms {
            return Err(InvalidConfig::LeaseTooShort {
                ttl_s: m.lease_ttl_s,
                expiry_ms: self.protocol.expiry_ms,
            });
        }
        if m.replace_after_s < nessie_membership::REPLACE_AFTER_TTLS * m.lease_ttl_s {
            return Err(InvalidConfig::ReplaceTooSoon {
                after_s: m.replace_after_s,
                ttl_s: m.lease_ttl_s,
            });
        }
        Ok(())
    }

    /// Where this cluster's records live in its etcd.
    pub fn membership_keys(&self) -> nessie_membership::Keys {
        nessie_membership::Keys::new(&self.cluster.name, self.fingerprint())
    }

    /// The `[cluster]` secret and time limits.
    fn validate_cluster(&self) -> Result<(), InvalidConfig> {
        let secret = self.secret()?;
        if secret.len() < MIN_SECRET_BYTES {
            return Err(InvalidConfig::SecretTooShort(secret.len()));
        }
        let c = &self.cluster;
        if c.bootstrap_timeout_ms == 0 || c.bootstrap_timeout_ms > 600_000 {
            return Err(InvalidConfig::BootstrapTimeout(c.bootstrap_timeout_ms));
        }
        if c.op_timeout_ms < 10 || c.op_timeout_ms > 600_000 {
            return Err(InvalidConfig::OpTimeout(c.op_timeout_ms));
        }
        if c.progress_spin_us > MAX_PROGRESS_SPIN_US {
            return Err(InvalidConfig::ProgressSpin(c.progress_spin_us));
        }
        if let Some(us) = c.wait_spin_us.filter(|&us| us > MAX_WAIT_SPIN_US) {
            return Err(InvalidConfig::WaitSpin(us));
        }
        Ok(())
    }

    /// The protocol mode and, for the server-driven ones, their request machinery.
    fn validate_mode(&self) -> Result<(), InvalidConfig> {
        if !matches!(self.cluster.server_poll.as_str(), "spin" | "yield") {
            return Err(InvalidConfig::ServerPoll(self.cluster.server_poll.clone()));
        }
        let mode = self.mode()?;
        mode.validate().map_err(InvalidConfig::Cluster)?;
        if self.cluster.replicas != 1 && mode != nessie_deploy::Mode::Cd {
            return Err(InvalidConfig::Replicas(format!(
                "{} > 1 needs mode cd; the server-driven modes keep one copy",
                self.cluster.replicas
            )));
        }
        if mode != nessie_deploy::Mode::Cd {
            self.rpc_config()
                .validate()
                .map_err(InvalidConfig::Cluster)?;
        }
        Ok(())
    }

    /// The `[[node]]` list: one entry per node id, each with its own bootstrap address.
    fn validate_nodes(&self) -> Result<(), InvalidConfig> {
        if self.node.len() != self.geometry.nodes as usize {
            return Err(InvalidConfig::NodeCount {
                nodes: self.geometry.nodes,
                listed: self.node.len(),
            });
        }
        let mut seen = vec![false; self.node.len()];
        for n in &self.node {
            let Some(slot) = seen.get_mut(n.id as usize) else {
                return Err(InvalidConfig::NodeId {
                    id: n.id,
                    nodes: self.node.len(),
                });
            };
            if std::mem::replace(slot, true) {
                return Err(InvalidConfig::DuplicateNode(n.id));
            }
            if n.workers == 0 || n.workers > MAX_WORKERS_PER_NODE {
                return Err(InvalidConfig::Workers {
                    id: n.id,
                    workers: n.workers,
                });
            }
        }
        for (i, a) in self.node.iter().enumerate() {
            if let Some(b) = self.node[i + 1..]
                .iter()
                .find(|b| b.bootstrap == a.bootstrap)
            {
                return Err(InvalidConfig::SharedBootstrap {
                    a: a.id,
                    b: b.id,
                    addr: a.bootstrap,
                });
            }
        }
        Ok(())
    }

    pub fn secret_bytes(&self) -> Result<Vec<u8>, ConfigError> {
        Ok(self.secret()?)
    }

    fn secret(&self) -> Result<Vec<u8>, InvalidConfig> {
        hex::decode(self.cluster.secret.trim()).map_err(InvalidConfig::SecretNotHex)
    }

    pub fn node_entry(&self, id: u16) -> Result<&NodeEntry, ConfigError> {
        let entry = self.node.iter().find(|n| n.id == id);
        entry.ok_or_else(|| {
            ConfigError::from(InvalidConfig::NoSuchNode {
                id,
                nodes: self.node.len(),
            })
        })
    }

    /// The admin socket of node `id`, relative paths resolved against `base` (the config's dir).
    pub fn admin_path(&self, id: u16, base: &Path) -> Result<PathBuf, ConfigError> {
        let n = self.node_entry(id)?;
        Ok(match &n.admin {
            Some(p) if p.is_absolute() => p.clone(),
            Some(p) => base.join(p),
            None => base.join(format!("node-{id}.sock")),
        })
    }

    /// The protocol the cluster runs.
    pub fn mode(&self) -> Result<nessie_deploy::Mode, InvalidConfig> {
        let t = self.cluster.server_threads;
        match self.cluster.mode.as_str() {
            "cd" => Ok(nessie_deploy::Mode::Cd),
            "sd" => Ok(nessie_deploy::Mode::Sd { server_threads: t }),
            "hy" => Ok(nessie_deploy::Mode::Hy { server_threads: t }),
            "pilaf" => Ok(nessie_deploy::Mode::Pilaf { server_threads: t }),
            m => Err(InvalidConfig::Mode(m.to_string())),
        }
    }

    // The defaults fill the test-only `mutations` when the `testing` feature is on.
    #[allow(clippy::needless_update)]
    pub fn rpc_config(&self) -> nessie_baselines::sd::RpcConfig {
        nessie_baselines::sd::RpcConfig {
            max_clients_per_node: self.cluster.max_clients_per_node,
            idle_backoff_ns: if self.cluster.server_poll == "spin" {
                None
            } else {
                Some(0)
            },
            response_timeout_ns: self.cluster.op_timeout_ms.saturating_mul(1_000_000),
            extent_reuse_delay_ns: self
                .cluster
                .pilaf_reuse_delay_ms
                .map(|ms| ms.saturating_mul(1_000_000)),
            ..Default::default()
        }
    }

    // The defaults fill the test-only `mutations` when the `testing` feature is on.
    #[allow(clippy::needless_update)]
    pub fn protocol_config(&self) -> ProtocolConfig {
        let p = &self.protocol;
        ProtocolConfig {
            expiry_ns: p.expiry_ms.saturating_mul(1_000_000),
            clock_margin_ns: p.clock_margin_ms.saturating_mul(1_000_000),
            max_migrate_depth: p.max_migrate_depth,
            cache_entries: p.cache_entries,
            optimizations: p.optimizations,
            whole_read_max: p.whole_read_max,
            retry: p.retry,
            // Checked by `validate`; a config not validated evicts nothing.
            eviction: self.eviction().unwrap_or_default(),
            eviction_samples: self.cache.eviction_samples,
            ..ProtocolConfig::default()
        }
    }

    /// The limits of the large-value layer the node's front ends and admin socket store
    /// through (`[cache] item_max`); `None` outside the client-driven mode, whose items stay
    /// within `value_max`.
    pub fn large_limits(
        &self,
    ) -> Result<Option<nessie_protocols::large::LargeLimits>, InvalidConfig> {
        if self.cluster.mode != "cd" {
            return Ok(None);
        }
        let g = &self.geometry;
        let limits =
            nessie_protocols::large::LargeLimits::new(g.key_max, g.value_max, self.cache.item_max)
                .and_then(|l| l.with_grace_ms(self.cache.orphan_grace_ms))
                .map_err(|e| InvalidConfig::ItemMax(e.to_string()))?;
        if let Some(m) = &self.membership {
            if self.cache.orphan_grace_ms <= m.lease_ttl_s.saturating_mul(1000) {
                return Err(InvalidConfig::ItemMax(format!(
                    "orphan_grace_ms of {} must exceed membership.lease_ttl_s ({} s): a writer \
                     paused past its chunks' grace must be fenced before it can publish",
                    self.cache.orphan_grace_ms, m.lease_ttl_s
                )));
            }
        }
        Ok(Some(limits))
    }

    /// The longest value a node's front ends and admin socket take: `[cache] item_max` in the
    /// client-driven mode, `value_max` in the others.
    pub fn item_max(&self) -> u64 {
        match self.large_limits() {
            Ok(Some(l)) => l.item_max,
            _ => self.geometry.value_max as u64,
        }
    }

    /// The `[cache] eviction` policy. Only the client-driven mode evicts.
    pub fn eviction(&self) -> Result<nessie_protocols::Eviction, InvalidConfig> {
        let e: nessie_protocols::Eviction = self
            .cache
            .eviction
            .parse()
            .map_err(InvalidConfig::Eviction)?;
        if e != nessie_protocols::Eviction::NoEviction && self.cluster.mode != "cd" {
            return Err(InvalidConfig::Eviction(format!(
                "{e} needs the client-driven mode (cd), not {}",
                self.cluster.mode
            )));
        }
        Ok(e)
    }

    /// Digest of everything peers must agree on (geometry, cluster-wide protocol parameters,
    /// transport, node list).
    pub fn fingerprint(&self) -> u64 {
        let shared = (
            nessie_store::LAYOUT_VERSION,
            &self.cluster.name,
            (
                self.cluster.transport,
                &self.cluster.mode,
                self.cluster.max_clients_per_node,
                self.cluster.replicas,
                self.spare_copies(),
                self.index_slots(),
                &self.cluster.standby,
            ),
            self.geometry.fingerprint(),
            self.protocol.expiry_ms,
            self.protocol.clock_margin_ms,
            &self.cache.eviction,
            self.node
                .iter()
                .map(|n| (n.id, n.bootstrap.to_string()))
                .collect::<Vec<_>>(),
        );
        let s = serde_json::to_string(&shared).expect("serialises");
        xxhash_rust::xxh3::xxh3_64(s.as_bytes())
    }

    /// A configuration for `nodes` local nodes on loopback, bootstrap ports from `base_port`.
    pub fn local(
        name: &str,
        nodes: u16,
        transport: Transport,
        base_port: u16,
        geometry: Geometry,
    ) -> Self {
        let secret: [u8; MIN_SECRET_BYTES] = rand::random();
        Self {
            cluster: ClusterSection {
                name: name.into(),
                secret: hex::encode(secret),
                transport,
                bootstrap_timeout_ms: default_bootstrap_timeout_ms(),
                net_devices: (transport == Transport::Tcp).then(|| "lo".to_string()),
                op_timeout_ms: default_op_timeout_ms(),
                mode: default_mode(),
                server_threads: default_server_threads(),
                max_clients_per_node: default_max_clients(),
                server_poll: default_server_poll(),
                huge_pages: Default::default(),
                replicas: default_replicas(),
                spare_copies: None,
                index_slots: None,
                standby: Vec::new(),
                pilaf_reuse_delay_ms: None,
                progress_spin_us: 0,
                direct_loopback: true,
                direct_peers: true,
                wait_spin_us: None,
                protected_mode: true,
            },
            geometry: Geometry {
                nodes: nodes as u32,
                ..geometry
            },
            protocol: ProtocolSection::default(),
            membership: None,
            frontends: None,
            cache: CacheSection::default(),
            node: (0..nodes)
                .map(|id| NodeEntry {
                    id,
                    bootstrap: SocketAddr::from(([127, 0, 0, 1], base_port + id)),
                    admin: None,
                    workers: default_workers(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn membership(etcd: &str, lease_ttl_s: u64) -> MembershipSection {
        MembershipSection {
            etcd: etcd.into(),
            lease_ttl_s,
            replace_after_s: nessie_membership::REPLACE_AFTER_TTLS * lease_ttl_s,
            rebalance: true,
            etcd_user: None,
            etcd_password: None,
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
        }
    }

    fn cfg() -> ClusterConfig {
        ClusterConfig::local("t", 3, Transport::Shm, 7400, Geometry::default())
    }

    #[test]
    fn roundtrip_through_toml() {
        let c = cfg();
        c.validate().unwrap();
        let back: ClusterConfig = toml::from_str(&c.to_toml()).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.fingerprint(), c.fingerprint());
    }

    #[test]
    fn errors_name_the_field() {
        type Case = (Box<dyn Fn(&mut ClusterConfig)>, &'static str);
        let cases: Vec<Case> = vec![
            (
                Box::new(|c| c.cluster.secret = "abcd".into()),
                "at least 32",
            ),
            (Box::new(|c| c.cluster.secret = "zz".into()), "not hex"),
            (Box::new(|c| c.node[2].id = 0), "listed twice"),
            (Box::new(|c| c.node[2].id = 9), "out of range"),
            (Box::new(|c| c.node.pop().map(|_| ()).unwrap()), "3 but 2"),
            (
                Box::new(|c| c.node[1].bootstrap = c.node[0].bootstrap),
                "share the bootstrap address",
            ),
            (Box::new(|c| c.node[0].workers = 0), "workers"),
            (Box::new(|c| c.geometry.key_max = 0), "key_max"),
            (Box::new(|c| c.protocol.expiry_ms = 0), "expiry"),
            (
                Box::new(|c| c.cache.eviction_samples = 0),
                "eviction samples 0 is not in 1..=64",
            ),
            (
                Box::new(|c| c.cache.eviction = "lru".into()),
                "unknown eviction policy",
            ),
            (
                Box::new(|c| c.cache.item_max = (512 << 20) + 1),
                "[cache] item_max / orphan_grace_ms: invalid configuration: item_max of 536870913 bytes exceeds",
            ),
            (Box::new(|c| c.cache.item_max = 10), "is below value_max"),
            (
                Box::new(|c| c.cluster.progress_spin_us = MAX_PROGRESS_SPIN_US + 1),
                "progress_spin_us",
            ),
            (
                Box::new(|c| c.cluster.wait_spin_us = Some(MAX_WAIT_SPIN_US + 1)),
                "wait_spin_us",
            ),
            (
                Box::new(|c| c.cluster.mode = "xx".into()),
                "not one of cd, sd, hy",
            ),
            (
                Box::new(|c| {
                    c.cluster.mode = "sd".into();
                    c.cluster.server_threads = 0
                }),
                "server",
            ),
            (
                Box::new(|c| {
                    c.cluster.mode = "hy".into();
                    c.cluster.max_clients_per_node = 0
                }),
                "max_clients_per_node",
            ),
            (
                Box::new(|c| c.frontends = Some(frontends_with_inflight(0))),
                "inflight = 0 is not in 1..=64",
            ),
            (
                Box::new(|c| c.frontends = Some(frontends_with_inflight(65))),
                "inflight = 65 is not in 1..=64",
            ),
        ];
        for (f, needle) in cases {
            let mut c = cfg();
            f(&mut c);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{e:?} should mention {needle:?}");
        }
    }

    fn frontends_with_inflight(inflight: u16) -> FrontendsSection {
        FrontendsSection {
            memcached_port: Some(11_311),
            resp_port: None,
            resp_password: None,
            metrics_port: None,
            bind: "127.0.0.1".into(),
            max_connections: 16,
            threads: 1,
            inflight,
        }
    }

    #[test]
    fn unknown_fields_and_bad_files_are_rejected() {
        let dir = std::env::temp_dir().join(format!("nessie-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.toml");
        std::fs::write(
            &p,
            cfg()
                .to_toml()
                .replace("[geometry]", "[geometry]\nbogus = 1"),
        )
        .unwrap();
        assert!(ClusterConfig::load(&p)
            .unwrap_err()
            .to_string()
            .contains("bogus"));
        assert!(ClusterConfig::load(&dir.join("missing.toml"))
            .unwrap_err()
            .to_string()
            .contains("cannot read"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_memory_budget_stands_for_the_table_sizes() {
        let dir = std::env::temp_dir().join(format!("nessie-cfg-mem-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.toml");
        let base = cfg();
        let counts = format!(
            "ites_per_node = {}\ndtes_per_node = {}\n",
            base.geometry.ites_per_node, base.geometry.dtes_per_node
        );
        let text = base.to_toml();
        assert!(text.contains(&counts), "{text}");
        let load = |geometry: &str| {
            std::fs::write(&p, text.replace(&counts, geometry)).unwrap();
            ClusterConfig::load(&p)
        };
        let g = load("memory_per_node = \"64MiB\"\n").unwrap().geometry;
        let want = Geometry::for_memory(
            g.nodes,
            64 << 20,
            g.key_max,
            g.value_max,
            MEMORY_LOAD_FACTOR,
        )
        .unwrap();
        assert_eq!(
            (g.ites_per_node, g.dtes_per_node),
            (want.ites_per_node, want.dtes_per_node)
        );
        let g2 = load("memory_per_node = 67108864\n").unwrap().geometry;
        assert_eq!(g2, g, "bytes as a number mean the same");
        for (bad, needle) in [
            ("memory_per_node = \"64XB\"\n", "unit"),
            (
                "memory_per_node = \"1K\"\n",
                "cannot hold the smallest data table",
            ),
            (
                "memory_per_node = \"64MiB\"\ndtes_per_node = 5\n",
                "either memory_per_node",
            ),
            ("ites_per_node = 5\n", "either memory_per_node"),
        ] {
            let e = load(bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn membership_errors_name_the_field() {
        let cases = [
            (membership("localhost:2379", 3), 1_000, "membership.etcd"),
            (membership("ftp://e:2379", 3), 1_000, "membership.etcd"),
            (
                MembershipSection {
                    etcd_ca: Some("ca.pem".into()),
                    ..membership("https://e:2379", 3)
                },
                1_000,
                "membership.etcd_ca: ca.pem is not an absolute path",
            ),
            (
                MembershipSection {
                    etcd_ca: Some("/nonexistent/ca.pem".into()),
                    ..membership("http://e:2379", 3)
                },
                1_000,
                "not https://",
            ),
            (
                MembershipSection {
                    etcd_cert: Some("/c.pem".into()),
                    etcd_key: Some("/c.key".into()),
                    ..membership("https://e:2379", 3)
                },
                1_000,
                "membership.etcd_ca: a client certificate needs the CA",
            ),
            (
                membership("http://e:2379", 0),
                1_000,
                "membership.lease_ttl_s = 0",
            ),
            (
                membership("http://e:2379", 601),
                1_000,
                "membership.lease_ttl_s = 601",
            ),
            (
                membership("http://e:2379", 3),
                2_000,
                "too short for protocol.expiry_ms = 2000",
            ),
            (
                MembershipSection {
                    replace_after_s: 8,
                    ..membership("http://e:2379", 3)
                },
                1_000,
                "membership.replace_after_s = 8 is too short",
            ),
            (
                MembershipSection {
                    replace_after_s: 180,
                    ..membership("http://e:2379", 60)
                },
                1_000,
                "orphan_grace_ms of 60000 must exceed membership.lease_ttl_s (60 s)",
            ),
        ];
        for (m, expiry_ms, needle) in cases {
            let mut c = cfg();
            c.protocol.expiry_ms = expiry_ms;
            c.membership = Some(m);
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(needle), "{e:?} should mention {needle:?}");
        }
        let mut good = cfg();
        good.membership = Some(membership("http://127.0.0.1:2379/", 3));
        good.validate().unwrap();
        // TLS files are read when a client is made, not by every command that loads the
        // configuration: one moved away fails only what talks to etcd, naming it.
        let mut tls = cfg();
        tls.membership = Some(MembershipSection {
            etcd_ca: Some("/nonexistent/ca.pem".into()),
            ..membership("https://127.0.0.1:2379", 3)
        });
        tls.validate().unwrap();
        let e = tls
            .membership
            .as_ref()
            .unwrap()
            .client(ETCD_TIMEOUT)
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("membership.etcd_ca: /nonexistent/ca.pem"),
            "{e}"
        );
        let back: ClusterConfig = toml::from_str(&good.to_toml()).unwrap();
        assert_eq!(back.membership, good.membership, "[membership] round-trips");
    }

    #[test]
    fn fingerprint_covers_shared_fields() {
        let a = cfg();
        let mut b = a.clone();
        b.geometry.value_max *= 2;
        assert_ne!(a.fingerprint(), b.fingerprint());
        let mut c = a.clone();
        c.node[0].workers = 7; // per-node setting: not shared
        assert_eq!(a.fingerprint(), c.fingerprint());
        let mut d = a.clone();
        d.cluster.spare_copies = Some(1); // every node registers the spare slots
        assert_ne!(a.fingerprint(), d.fingerprint());
        // Fabric tuning is each node's own.
        let mut e = a.clone();
        (e.cluster.progress_spin_us, e.cluster.wait_spin_us) = (50, Some(0));
        e.cluster.direct_loopback = false;
        e.cluster.direct_peers = false;
        assert_eq!(a.fingerprint(), e.fingerprint());
    }

    /// Fabric tuning reaches the UCX configuration; unset keys keep the transport's defaults.
    #[test]
    fn fabric_tuning_reaches_ucx() {
        let mut c = ClusterConfig::local("t", 2, Transport::Tcp, 7400, Geometry::default());
        let u = crate::node::ucx_config(&c);
        assert_eq!(u.wait_spin, Some(nessie_fabric_ucx::TCP_WAIT_SPIN));
        assert!(u.direct_loopback && u.direct_peers && u.progress_spin.is_zero());
        let text = c.to_toml();
        assert!(!text.contains("wait_spin_us") && !text.contains("direct_"));
        (c.cluster.progress_spin_us, c.cluster.wait_spin_us) = (20, Some(0));
        c.cluster.direct_loopback = false;
        c.cluster.direct_peers = false;
        let back: ClusterConfig = toml::from_str(&c.to_toml()).unwrap();
        let u = crate::node::ucx_config(&back);
        assert_eq!(u.wait_spin, Some(std::time::Duration::ZERO));
        assert_eq!(u.progress_spin, std::time::Duration::from_micros(20));
        assert!(!u.direct_loopback && !u.direct_peers);
    }

    #[test]
    fn spare_copies_need_replication_and_have_a_limit() {
        let mut c = cfg();
        assert_eq!(c.spare_copies(), 0, "nothing to move without replication");
        c.cluster.spare_copies = Some(1);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("needs replication"), "{e}");
        c.cluster.replicas = 2;
        c.membership = Some(membership("http://127.0.0.1:2379/", 3));
        c.validate().unwrap();
        assert_eq!(c.replica_set().unwrap().spare_slots(), 2..3);
        c.cluster.spare_copies = Some(9);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("spare_copies = 9 exceeds"), "{e}");
        let back: ClusterConfig = toml::from_str(&c.to_toml()).unwrap();
        assert_eq!(back.cluster.spare_copies, Some(9), "[cluster] round-trips");
        // Unset: one slot with replication, where a moved copy has a node to go to.
        c.cluster.spare_copies = None;
        assert_eq!(c.spare_copies(), 1);
        assert_eq!(c.replica_set().unwrap().spare_slots(), 2..3);
        assert!(
            !c.to_toml().contains("spare_copies"),
            "the default is not written"
        );
        c.geometry.nodes = 2;
        assert_eq!(
            c.spare_copies(),
            0,
            "two nodes, two copies: nowhere to move one"
        );
        c.cluster.spare_copies = Some(0);
        c.geometry.nodes = 4;
        assert_eq!(c.spare_copies(), 0, "an explicit 0 holds");
    }
}
