//! Bootstrap: the rendezvous through which node processes exchange what one-sided access needs
//! (fabric worker address, region keys and sizes — an opaque blob from the fabric backend),
//! check that they belong to the same cluster, and check that their wall clocks agree to within
//! `clock_margin` ([`clock`]). It carries no data-path traffic.
//!
//! Each node serves its [`NodeInfo`] on its bootstrap address (TCP). A fetch is one connection:
//!
//! ```text
//! client -> server   MAGIC, claimed node id (u16), client nonce (32 B)
//! server -> client   server node id (u16), server nonce (32 B), HMAC(secret, "srv"|cn|sn|server id)
//! client -> server   HMAC(secret, "cli"|sn|cn|claimed id)
//! server -> client   status 0, server wall clock (i64 ns), clock id (u8 length + bytes),
//!                    NodeInfo (JSON) | status 1 + error text
//! ```
//! Both sides prove knowledge of the cluster secret (HMAC-SHA256, constant-time comparison)
//! before the server reveals its keys, and nonces from both sides prevent replay. Every message
//! is length-prefixed and bounded.
//!
//! The server serves connections concurrently (at most [`MAX_CONNECTIONS`]), each within
//! [`EXCHANGE_TIMEOUT`] in all, so a silent or slow client cannot hold up the others. A client
//! retries with back-off until its deadline (`bootstrap_timeout_ms`) on anything but a definite
//! answer (authenticated, or a wrong secret / wrong node).

pub mod clock;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use nessie_store::Geometry;
use sha2::Sha256;

use crate::config::ClusterConfig;
pub use clock::{Clock, ClockSample};

/// Protocol version 2: the reply carries the server's wall clock.
const MAGIC: &[u8; 13] = b"NESSIE-BOOT-2";
const NONCE_BYTES: usize = 32;
const TAG_BYTES: usize = 32;
const HELLO_BYTES: usize = MAGIC.len() + 2 + NONCE_BYTES;
const CHALLENGE_BYTES: usize = 2 + NONCE_BYTES + TAG_BYTES;
/// Largest bootstrap message (the reply with the node info; requests are far smaller).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Upper bound on one whole exchange (one connection), on either side.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections a server serves at once; further ones are closed at once (their clients retry).
pub const MAX_CONNECTIONS: usize = 64;
/// Upper bound on one connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// First and longest pause between a client's attempts (doubling in between).
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// Pause after a failed `accept` (e.g. out of file descriptors) before the next.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);

/// What a node publishes to its peers.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeInfo {
    pub node: u16,
    /// `ClusterConfig::fingerprint` of the node's configuration.
    pub config_fingerprint: u64,
    pub geometry: Geometry,
    /// Backend-specific addressing information (hex).
    pub fabric: String,
    pub pid: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(
        "node {node} ({addr}) did not answer within {waited_ms} ms (last error: {last_error})"
    )]
    Unreachable {
        node: u16,
        addr: SocketAddr,
        waited_ms: u64,
        last_error: String,
    },
    #[error("authentication with node {node} ({addr}) failed: {detail}")]
    Auth {
        node: u16,
        addr: SocketAddr,
        detail: String,
    },
    #[error("node {node} does not match this node's configuration: {detail}")]
    Mismatch { node: u16, detail: String },
    #[error("bootstrap protocol error with {addr}: {err}")]
    Protocol {
        addr: SocketAddr,
        #[source]
        err: ExchangeError,
    },
    /// The peer's first answer is not a challenge: likely not a nessie node at all.
    #[error(
        "bootstrap protocol error with {addr}: {err}: is port {} in use by another program rather than a nessie node?",
        addr.port()
    )]
    NotNessie {
        addr: SocketAddr,
        #[source]
        err: ExchangeError,
    },
    #[error("cannot listen on {addr}: {detail}")]
    Bind { addr: SocketAddr, detail: String },
    #[error(
        "the clock of node {node} ({addr}) is {offset_ms:+.3} ms off this node's (± {uncertainty_ms:.3} ms), \
         more than protocol.clock_margin_ms = {margin_ms}: synchronise the clocks (NTP, PTP) or raise clock_margin_ms"
    )]
    ClockSkew {
        node: u16,
        addr: SocketAddr,
        offset_ms: f64,
        uncertainty_ms: f64,
        margin_ms: f64,
    },
    #[error(transparent)]
    Clock(#[from] clock::SkewError),
}

/// What went wrong within one connection, on either side, before it is attributed to a peer.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("no {what} in time (each exchange has {} ms at most)", EXCHANGE_TIMEOUT.as_millis())]
    TimedOut { what: &'static str },
    #[error("connection closed before the {what}")]
    Closed { what: &'static str },
    #[error("{what}: {err}")]
    Io {
        what: &'static str,
        #[source]
        err: std::io::Error,
    },
    #[error("{what} of {len} bytes exceeds {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("bad hello")]
    BadHello,
    #[error("a challenge of {0} bytes")]
    ChallengeSize(usize),
    #[error("client failed authentication")]
    ClientAuth,
    #[error("empty reply")]
    EmptyReply,
    #[error("truncated reply")]
    TruncatedReply,
    #[error("bad clock id of {0} bytes")]
    BadClockId(usize),
    #[error("bad node info: {0}")]
    BadInfo(#[source] serde_json::Error),
}

impl ExchangeError {
    /// A failed read or write of `what`, named by how it failed.
    fn io(err: std::io::Error, what: &'static str) -> Self {
        match err.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => ExchangeError::TimedOut { what },
            ErrorKind::UnexpectedEof => ExchangeError::Closed { what },
            _ => ExchangeError::Io { what, err },
        }
    }
}

impl BootstrapError {
    /// Whether a fetch should stop retrying: the peer answered, and the answer is final.
    fn is_final(&self) -> bool {
        matches!(
            self,
            BootstrapError::Auth { .. } | BootstrapError::Mismatch { .. }
        )
    }
}

/// Why binding `addr` failed, in words that name the port (and say when another program has it).
fn bind_error(addr: SocketAddr, err: std::io::Error) -> BootstrapError {
    let detail = match err.kind() {
        ErrorKind::AddrInUse => format!(
            "port {} is in use by another program (or by another node with this id)",
            addr.port()
        ),
        ErrorKind::AddrNotAvailable => format!("{} is not an address of this host", addr.ip()),
        ErrorKind::PermissionDenied => format!("no permission to listen on port {}", addr.port()),
        _ => err.to_string(),
    };
    BootstrapError::Bind { addr, detail }
}

type HmacSha256 = Hmac<Sha256>;

fn mac(secret: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn verify(secret: &[u8], parts: &[&[u8]], tag: &[u8]) -> bool {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m.verify_slice(tag).is_ok()
}

fn send(s: &mut TcpStream, msg: &[u8], deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ErrorKind::TimedOut.into());
    }
    s.set_write_timeout(Some(left))?;
    let mut frame = (msg.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(msg);
    s.write_all(&frame)
}

/// `read_exact` that gives up at `deadline` however slowly the bytes trickle in.
fn read_full(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One length-prefixed message of at most `max` bytes, by `deadline`.
fn recv(
    s: &mut TcpStream,
    max: usize,
    deadline: Instant,
    what: &'static str,
) -> Result<Vec<u8>, ExchangeError> {
    let mut len = [0u8; 4];
    read_full(s, &mut len, deadline).map_err(|e| ExchangeError::io(e, what))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(ExchangeError::TooLong { what, len, max });
    }
    let mut buf = vec![0u8; len];
    read_full(s, &mut buf, deadline).map_err(|e| ExchangeError::io(e, what))?;
    Ok(buf)
}

/// What a server hands every connection.
struct Served {
    secret: Vec<u8>,
    info_json: Vec<u8>,
    node: u16,
    clock: Clock,
}

/// Serves this node's [`NodeInfo`] until dropped.
pub struct BootstrapServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BootstrapServer {
    /// Serve on `addr` with this host's clock ([`Clock::from_env`]).
    pub fn start(
        addr: SocketAddr,
        secret: Vec<u8>,
        info: NodeInfo,
    ) -> Result<Self, BootstrapError> {
        let clock = Clock::from_env()?;
        Self::start_with_clock(addr, secret, info, clock)
    }

    /// Serve on `addr`, reporting `clock` to peers (tests give a skewed one).
    pub fn start_with_clock(
        addr: SocketAddr,
        secret: Vec<u8>,
        info: NodeInfo,
        clock: Clock,
    ) -> Result<Self, BootstrapError> {
        let listener = TcpListener::bind(addr).map_err(|e| bind_error(addr, e))?;
        let addr = listener.local_addr().map_err(|e| bind_error(addr, e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(Served {
            secret,
            info_json: serde_json::to_vec(&info).expect("NodeInfo serialises"),
            node: info.node,
            clock,
        });
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("nessie-bootstrap".into())
            .spawn(move || accept_loop(listener, &stop2, served))
            .expect("spawn bootstrap thread");
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

impl Drop for BootstrapServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Counts a connection as served until dropped.
struct Active(Arc<AtomicUsize>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts connections and serves each on its own thread, at most [`MAX_CONNECTIONS`] at once.
fn accept_loop(listener: TcpListener, stop: &AtomicBool, served: Arc<Served>) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let mut s = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("bootstrap accept failed: {e}");
                std::thread::sleep(ACCEPT_ERROR_PAUSE);
                continue;
            }
        };
        let peer = s.peer_addr().ok();
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(
                ?peer,
                "bootstrap: {MAX_CONNECTIONS} connections already open; closing this one"
            );
            continue;
        }
        let guard = Active(active.clone());
        let served = served.clone();
        let spawned = std::thread::Builder::new()
            .name("nessie-bootstrap-conn".into())
            .spawn(move || {
                let _guard = guard;
                if let Err(e) = serve_one(&mut s, &served) {
                    tracing::warn!(?peer, "bootstrap request rejected: {e}");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(?peer, "bootstrap: cannot spawn a connection thread: {e}");
        }
    }
}

fn serve_one(s: &mut TcpStream, srv: &Served) -> Result<(), ExchangeError> {
    let deadline = Instant::now() + EXCHANGE_TIMEOUT;
    let hello = recv(s, HELLO_BYTES, deadline, "hello")?;
    if hello.len() != HELLO_BYTES || &hello[..MAGIC.len()] != MAGIC {
        let _ = send(s, b"\x01not a nessie bootstrap request", deadline);
        return Err(ExchangeError::BadHello);
    }
    let claimed = &hello[MAGIC.len()..MAGIC.len() + 2];
    let client_nonce = &hello[MAGIC.len() + 2..];
    let server_nonce: [u8; NONCE_BYTES] = rand::random();
    let my_id = srv.node.to_le_bytes();
    let proof = mac(&srv.secret, &[b"srv", client_nonce, &server_nonce, &my_id]);
    let mut msg = my_id.to_vec();
    msg.extend_from_slice(&server_nonce);
    msg.extend_from_slice(&proof);
    send(s, &msg, deadline).map_err(|e| ExchangeError::io(e, "challenge"))?;
    let client_proof = recv(s, TAG_BYTES, deadline, "client proof")?;
    if !verify(
        &srv.secret,
        &[b"cli", &server_nonce, client_nonce, claimed],
        &client_proof,
    ) {
        let _ = send(
            s,
            b"\x01authentication failed: wrong cluster secret",
            deadline,
        );
        return Err(ExchangeError::ClientAuth);
    }
    let clock_id = srv.clock.id().unwrap_or("").as_bytes();
    let mut reply = vec![0u8];
    reply.extend_from_slice(&srv.clock.now_ns().to_le_bytes());
    reply.push(clock_id.len() as u8);
    reply.extend_from_slice(clock_id);
    reply.extend_from_slice(&srv.info_json);
    send(s, &reply, deadline).map_err(|e| ExchangeError::io(e, "reply"))
}

/// A peer's info and a measurement of its clock against ours.
#[derive(Clone, Debug, PartialEq)]
pub struct Fetched {
    pub info: NodeInfo,
    pub clock: ClockSample,
}

/// Fetch node `node`'s info from `addr`, retrying with back-off until `deadline` while it is
/// not up or does not answer properly. Our clock is `clock`.
pub fn fetch(
    addr: SocketAddr,
    secret: &[u8],
    my_id: u16,
    node: u16,
    clock: &Clock,
    deadline: Instant,
) -> Result<Fetched, BootstrapError> {
    let start = Instant::now();
    let mut pause = RETRY_MIN;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = if left.is_zero() {
            Err("deadline passed".to_string())
        } else {
            TcpStream::connect_timeout(&addr, left.min(CONNECT_TIMEOUT))
                .map_err(|e| e.to_string())
                .and_then(|mut s| {
                    let until = deadline.min(Instant::now() + EXCHANGE_TIMEOUT);
                    match exchange(&mut s, addr, secret, my_id, node, clock, until) {
                        Err(e) if !e.is_final() => Err(e.to_string()),
                        r => Ok(r),
                    }
                })
        };
        match attempt {
            Ok(r) => return r,
            Err(last_error) => {
                if Instant::now() + pause >= deadline {
                    return Err(BootstrapError::Unreachable {
                        node,
                        addr,
                        waited_ms: start.elapsed().as_millis() as u64,
                        last_error,
                    });
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(RETRY_MAX);
            }
        }
    }
}

/// The server's challenge: (server id, server nonce, proof). Anything else is not a nessie node.
fn read_challenge(
    s: &mut TcpStream,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<Vec<u8>, BootstrapError> {
    let not_nessie = |err| BootstrapError::NotNessie { addr, err };
    let ch = recv(s, MAX_MESSAGE_BYTES, deadline, "challenge").map_err(not_nessie)?;
    if ch.len() != CHALLENGE_BYTES {
        return Err(not_nessie(ExchangeError::ChallengeSize(ch.len())));
    }
    Ok(ch)
}

fn exchange(
    s: &mut TcpStream,
    addr: SocketAddr,
    secret: &[u8],
    my_id: u16,
    node: u16,
    clock: &Clock,
    deadline: Instant,
) -> Result<Fetched, BootstrapError> {
    let proto = |err| BootstrapError::Protocol { addr, err };
    let auth = |detail: &str| BootstrapError::Auth {
        node,
        addr,
        detail: detail.into(),
    };
    let client_nonce: [u8; NONCE_BYTES] = rand::random();
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&my_id.to_le_bytes());
    hello.extend_from_slice(&client_nonce);
    send(s, &hello, deadline).map_err(|e| proto(ExchangeError::io(e, "hello")))?;
    let ch = read_challenge(s, addr, deadline)?;
    let (server_id, server_nonce, proof) =
        (&ch[..2], &ch[2..2 + NONCE_BYTES], &ch[2 + NONCE_BYTES..]);
    if !verify(
        secret,
        &[b"srv", &client_nonce, server_nonce, server_id],
        proof,
    ) {
        return Err(auth("the server does not know the cluster secret"));
    }
    let got_id = u16::from_le_bytes([server_id[0], server_id[1]]);
    if got_id != node {
        return Err(BootstrapError::Mismatch {
            node,
            detail: format!("{addr} is node {got_id}, expected node {node}"),
        });
    }
    let my_proof = mac(
        secret,
        &[b"cli", server_nonce, &client_nonce, &my_id.to_le_bytes()],
    );
    let t0 = clock.now_ns();
    send(s, &my_proof, deadline).map_err(|e| proto(ExchangeError::io(e, "proof")))?;
    let reply = recv(s, MAX_MESSAGE_BYTES, deadline, "reply").map_err(proto)?;
    let t1 = clock.now_ns();
    match reply.split_first() {
        Some((0, rest)) => parse_reply(rest, clock, t0, t1).map_err(proto),
        Some((_, text)) => Err(auth(&String::from_utf8_lossy(text))),
        None => Err(proto(ExchangeError::EmptyReply)),
    }
}

/// The body of a successful reply: server clock, clock id, node info.
fn parse_reply(rest: &[u8], clock: &Clock, t0: i64, t1: i64) -> Result<Fetched, ExchangeError> {
    let (time, rest) = rest
        .split_first_chunk::<8>()
        .ok_or(ExchangeError::TruncatedReply)?;
    let (&id_len, rest) = rest.split_first().ok_or(ExchangeError::TruncatedReply)?;
    let id_len = id_len as usize;
    if id_len > clock::MAX_CLOCK_ID_BYTES || rest.len() < id_len {
        return Err(ExchangeError::BadClockId(id_len));
    }
    let (peer_clock, json) = rest.split_at(id_len);
    let same_clock = clock.id().is_some_and(|ours| ours.as_bytes() == peer_clock);
    let info = serde_json::from_slice(json).map_err(ExchangeError::BadInfo)?;
    Ok(Fetched {
        info,
        clock: ClockSample::measure(t0, i64::from_le_bytes(*time), t1, same_clock),
    })
}

/// Fetch every peer's info (in parallel) and check they all run this configuration with a
/// clock within `clock_margin` of ours. `own` is this node's info; it is returned in its place.
/// Our clock is this host's ([`Clock::from_env`]).
pub fn fetch_all(cfg: &ClusterConfig, own: &NodeInfo) -> Result<Vec<NodeInfo>, BootstrapError> {
    let clock = Clock::from_env()?;
    fetch_all_with_clock(cfg, own, &clock)
}

/// [`fetch_all`] measuring peers against `clock` (tests give a skewed one). Fails on the first
/// peer that answers wrongly, without waiting for the others.
pub fn fetch_all_with_clock(
    cfg: &ClusterConfig,
    own: &NodeInfo,
    clock: &Clock,
) -> Result<Vec<NodeInfo>, BootstrapError> {
    Ok(fetch_peers(cfg, own, clock, &[])?
        .into_iter()
        .map(|i| i.expect("every node fetched"))
        .collect())
}

/// [`fetch_all_with_clock`] without asking the peers in `skip` (membership says they are
/// down: a node restarting while another is failed must not wait for it): their places are
/// `None`.
pub fn fetch_peers(
    cfg: &ClusterConfig,
    own: &NodeInfo,
    clock: &Clock,
    skip: &[u16],
) -> Result<Vec<Option<NodeInfo>>, BootstrapError> {
    let secret = cfg.secret_bytes().map_err(|e| BootstrapError::Mismatch {
        node: own.node,
        detail: e.to_string(),
    })?;
    let margin_ns = cfg.protocol_config().clock_margin_ns;
    let deadline = Instant::now() + Duration::from_millis(cfg.cluster.bootstrap_timeout_ms);
    let (tx, rx) = std::sync::mpsc::channel();
    let peers: Vec<_> = cfg
        .node
        .iter()
        .filter(|n| n.id != own.node && !skip.contains(&n.id))
        .collect();
    for n in &peers {
        let (addr, id, me) = (n.bootstrap, n.id, own.node);
        let (secret, clock, tx) = (secret.clone(), clock.clone(), tx.clone());
        // Detached: on an early error the node exits; the others end by the deadline.
        std::thread::spawn(move || {
            let _ = tx.send((addr, fetch(addr, &secret, me, id, &clock, deadline)));
        });
    }
    let mut infos = vec![None; cfg.node.len()];
    infos[own.node as usize] = Some(own.clone());
    for _ in &peers {
        let (addr, got) = rx.recv().expect("every fetch thread reports");
        let got = got?;
        check_peer(own, &got.info)?;
        check_clock(got.info.node, addr, &got.clock, margin_ns)?;
        let slot = got.info.node as usize;
        infos[slot] = Some(got.info);
    }
    Ok(infos)
}

/// A peer's clock must be shown to be within `margin_ns` of ours.
fn check_clock(
    node: u16,
    addr: SocketAddr,
    sample: &ClockSample,
    margin_ns: u64,
) -> Result<(), BootstrapError> {
    if sample.within(margin_ns) {
        return Ok(());
    }
    let ms = |ns: f64| ns / 1e6;
    Err(BootstrapError::ClockSkew {
        node,
        addr,
        offset_ms: ms(sample.offset_ns as f64),
        uncertainty_ms: ms(sample.uncertainty_ns as f64),
        margin_ms: ms(margin_ns as f64),
    })
}

/// A peer must run the same configuration (geometry, shared protocol parameters, node list).
pub fn check_peer(own: &NodeInfo, peer: &NodeInfo) -> Result<(), BootstrapError> {
    if peer.geometry != own.geometry {
        let (a, b) = (&peer.geometry, &own.geometry);
        let mut diffs = Vec::new();
        let mut field = |name: &str, x: u64, y: u64| {
            if x != y {
                diffs.push(format!("{name} = {x} there, {y} here"));
            }
        };
        field("nodes", a.nodes as u64, b.nodes as u64);
        field("ites_per_node", a.ites_per_node, b.ites_per_node);
        field("dtes_per_node", a.dtes_per_node, b.dtes_per_node);
        field("key_max", a.key_max as u64, b.key_max as u64);
        field("value_max", a.value_max as u64, b.value_max as u64);
        field(
            "hash_functions",
            a.hash_functions as u64,
            b.hash_functions as u64,
        );
        field("filter_bits", a.filter_bits as u64, b.filter_bits as u64);
        return Err(BootstrapError::Mismatch {
            node: peer.node,
            detail: format!("geometry differs: {}", diffs.join(", ")),
        });
    }
    if peer.config_fingerprint != own.config_fingerprint {
        return Err(BootstrapError::Mismatch {
            node: peer.node,
            detail: format!("its configuration (cluster name, transport, protocol expiry/margin or node list) or its memory layout version (ours: {}) differs from ours", nessie_store::LAYOUT_VERSION),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(node: u16) -> NodeInfo {
        NodeInfo {
            node,
            config_fingerprint: 42,
            geometry: Geometry::default(),
            fabric: "beef".into(),
            pid: 1,
        }
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    fn serve(node: u16) -> BootstrapServer {
        BootstrapServer::start("127.0.0.1:0".parse().unwrap(), vec![7; 32], info(node)).unwrap()
    }

    fn get(
        addr: SocketAddr,
        secret: &[u8],
        node: u16,
        deadline: Instant,
    ) -> Result<NodeInfo, BootstrapError> {
        fetch(addr, secret, 0, node, &Clock::system(), deadline).map(|f| f.info)
    }

    #[test]
    fn fetch_with_the_right_secret() {
        let srv = serve(1);
        let got = fetch(srv.addr(), &[7; 32], 0, 1, &Clock::system(), soon()).unwrap();
        assert_eq!(got.info, info(1));
        assert!(got.clock.same_clock, "one host, one clock: {:?}", got.clock);
    }

    #[test]
    fn wrong_secret_gets_no_keys() {
        let srv = serve(1);
        let t = Instant::now();
        let e = get(srv.addr(), &[8; 32], 1, soon()).unwrap_err();
        assert!(matches!(e, BootstrapError::Auth { node: 1, .. }), "{e}");
        assert!(
            e.to_string().contains("does not know the cluster secret"),
            "{e}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "a wrong secret is final"
        );
    }

    #[test]
    fn wrong_node_at_address_is_a_mismatch() {
        let srv = serve(2);
        let e = get(srv.addr(), &[7; 32], 1, soon()).unwrap_err();
        assert!(e.to_string().contains("is node 2, expected node 1"), "{e}");
    }

    #[test]
    fn unreachable_peer_times_out_naming_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l); // nothing listens there now
        let t = Instant::now();
        let e = fetch(
            addr,
            &[7; 32],
            0,
            3,
            &Clock::system(),
            Instant::now() + Duration::from_millis(500),
        )
        .unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(3));
        assert!(
            matches!(e, BootstrapError::Unreachable { node: 3, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("node 3"));
    }

    #[test]
    fn junk_is_rejected_and_the_server_keeps_serving() {
        let srv = serve(1);
        let far = soon();
        let mut s = TcpStream::connect(srv.addr()).unwrap();
        s.write_all(&5u32.to_le_bytes()).unwrap();
        s.write_all(b"hello").unwrap();
        let reply = recv(&mut s, MAX_MESSAGE_BYTES, far, "reply").unwrap();
        assert_eq!(reply[0], 1);
        let mut s = TcpStream::connect(srv.addr()).unwrap();
        s.write_all(&u32::MAX.to_le_bytes()).unwrap(); // absurd length
        drop(s);
        assert_eq!(get(srv.addr(), &[7; 32], 1, soon()).unwrap(), info(1));
    }

    #[test]
    fn duplicate_node_cannot_bind() {
        let a = serve(1);
        let e = BootstrapServer::start(a.addr(), vec![7; 32], info(1))
            .err()
            .unwrap();
        assert!(e.to_string().contains("another node with this id"), "{e}");
    }

    /// A port held by another program: binding it names the port; a peer fetching from it
    /// (the program accepts but never speaks the protocol) names the port too, instead of
    /// reporting "Resource temporarily unavailable (os error 11)".
    #[test]
    fn a_port_held_by_another_program_is_named() {
        let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = squatter.local_addr().unwrap();
        let port = addr.port().to_string();
        let e = BootstrapServer::start(addr, vec![7; 32], info(1))
            .err()
            .unwrap()
            .to_string();
        // `up` (process.rs) restarts the cluster on fresh ports when a node's log says this.
        assert!(
            e.contains("cannot listen on") && e.contains("in use"),
            "{e}"
        );
        assert!(
            e.contains(&format!("port {port} is in use by another program")),
            "{e}"
        );
        let e = get(
            addr,
            &[7; 32],
            1,
            Instant::now() + Duration::from_millis(1500),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(&format!("port {port} in use by another program")),
            "{e}"
        );
        assert!(!e.contains("os error 11"), "{e}");
        drop(squatter);
    }

    #[test]
    fn mismatched_geometry_is_named() {
        let mut other = info(1);
        other.geometry.value_max += 8;
        let e = check_peer(&info(0), &other).unwrap_err().to_string();
        assert!(
            e.contains("node 1") && e.contains("value_max = 1032 there, 1024 here"),
            "{e}"
        );
        let mut other = info(1);
        other.config_fingerprint = 7;
        assert!(check_peer(&info(0), &other)
            .unwrap_err()
            .to_string()
            .contains("configuration"));
    }
}
