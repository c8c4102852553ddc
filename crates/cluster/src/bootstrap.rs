//! Bootstrap: the rendezvous through which node processes exchange what one-sided access needs
//! (fabric worker address, region keys and sizes — an opaque blob from the fabric backend) and
//! check that they belong to the same cluster. It carries no data-path traffic.
//!
//! Each node serves its [`NodeInfo`] on its bootstrap address (TCP). A fetch is one connection:
//!
//! ```text
//! client -> server   MAGIC, claimed node id (u16), client nonce (32 B)
//! server -> client   server node id (u16), server nonce (32 B), HMAC(secret, "srv"|cn|sn|server id)
//! client -> server   HMAC(secret, "cli"|sn|cn|claimed id)
//! server -> client   status 0 + NodeInfo (JSON) | status 1 + error text
//! ```
//! Both sides prove knowledge of the cluster secret (HMAC-SHA256, constant-time comparison)
//! before the server reveals its keys, and nonces from both sides prevent replay. Every message
//! is length-prefixed and bounded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use nessie_store::Geometry;
use sha2::Sha256;

use crate::config::ClusterConfig;

const MAGIC: &[u8; 13] = b"NESSIE-BOOT-1";
/// Largest bootstrap message.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Socket timeout for one bootstrap exchange.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between connection attempts to a peer that is not up yet.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

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
    #[error("bootstrap protocol error with {addr}: {detail}")]
    Protocol { addr: SocketAddr, detail: String },
    #[error("cannot listen on {addr}: {err} (is another node with this id already running?)")]
    Bind {
        addr: SocketAddr,
        err: std::io::Error,
    },
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

fn send(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<()> {
    s.write_all(&(msg.len() as u32).to_le_bytes())?;
    s.write_all(msg)
}

fn recv(s: &mut TcpStream) -> Result<Vec<u8>, String> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)
        .map_err(|e| format!("reading length: {e}"))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE_BYTES {
        return Err(format!(
            "message of {len} bytes exceeds {MAX_MESSAGE_BYTES}"
        ));
    }
    let mut buf = vec![0u8; len];
    s.read_exact(&mut buf)
        .map_err(|e| format!("reading message: {e}"))?;
    Ok(buf)
}

/// Serves this node's [`NodeInfo`] until dropped.
pub struct BootstrapServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BootstrapServer {
    pub fn start(
        addr: SocketAddr,
        secret: Vec<u8>,
        info: NodeInfo,
    ) -> Result<Self, BootstrapError> {
        let listener = TcpListener::bind(addr).map_err(|err| BootstrapError::Bind { addr, err })?;
        let addr = listener
            .local_addr()
            .map_err(|err| BootstrapError::Bind { addr, err })?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let info = serde_json::to_vec(&info).expect("NodeInfo serialises");
        let thread = std::thread::Builder::new()
            .name("nessie-bootstrap".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(mut s) = conn else { continue };
                    let peer = s.peer_addr().ok();
                    if let Err(e) = serve_one(&mut s, &secret, &info) {
                        tracing::warn!(?peer, "bootstrap request rejected: {e}");
                    }
                }
            })
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

fn serve_one(s: &mut TcpStream, secret: &[u8], info_json: &[u8]) -> Result<(), String> {
    s.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let hello = recv(s)?;
    if hello.len() != MAGIC.len() + 2 + 32 || &hello[..MAGIC.len()] != MAGIC {
        let _ = send(s, b"\x01not a nessie bootstrap request");
        return Err("bad hello".into());
    }
    let claimed = &hello[MAGIC.len()..MAGIC.len() + 2];
    let client_nonce = &hello[MAGIC.len() + 2..];
    let server_nonce: [u8; 32] = rand::random();
    let my_id = serde_json::from_slice::<NodeInfo>(info_json)
        .map(|i| i.node)
        .unwrap_or(u16::MAX)
        .to_le_bytes();
    let proof = mac(secret, &[b"srv", client_nonce, &server_nonce, &my_id]);
    let mut msg = my_id.to_vec();
    msg.extend_from_slice(&server_nonce);
    msg.extend_from_slice(&proof);
    send(s, &msg).map_err(|e| e.to_string())?;
    let client_proof = recv(s)?;
    if !verify(
        secret,
        &[b"cli", &server_nonce, client_nonce, claimed],
        &client_proof,
    ) {
        let _ = send(s, b"\x01authentication failed: wrong cluster secret");
        return Err("client failed authentication".into());
    }
    let mut reply = vec![0u8];
    reply.extend_from_slice(info_json);
    send(s, &reply).map_err(|e| e.to_string())
}

/// Fetch node `node`'s info from `addr`, retrying until `deadline` while it is not up.
pub fn fetch(
    addr: SocketAddr,
    secret: &[u8],
    my_id: u16,
    node: u16,
    deadline: Instant,
) -> Result<NodeInfo, BootstrapError> {
    let start = Instant::now();
    loop {
        let connect_timeout = deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_secs(1));
        let attempt = if connect_timeout.is_zero() {
            Err("deadline passed".to_string())
        } else {
            TcpStream::connect_timeout(&addr, connect_timeout).map_err(|e| e.to_string())
        };
        match attempt {
            Ok(mut s) => return exchange(&mut s, addr, secret, my_id, node),
            Err(last_error) => {
                if Instant::now() + RETRY_PAUSE >= deadline {
                    return Err(BootstrapError::Unreachable {
                        node,
                        addr,
                        waited_ms: start.elapsed().as_millis() as u64,
                        last_error,
                    });
                }
                std::thread::sleep(RETRY_PAUSE);
            }
        }
    }
}

fn exchange(
    s: &mut TcpStream,
    addr: SocketAddr,
    secret: &[u8],
    my_id: u16,
    node: u16,
) -> Result<NodeInfo, BootstrapError> {
    let proto = |detail: String| BootstrapError::Protocol { addr, detail };
    let auth = |detail: &str| BootstrapError::Auth {
        node,
        addr,
        detail: detail.into(),
    };
    s.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| proto(e.to_string()))?;
    s.set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| proto(e.to_string()))?;
    let client_nonce: [u8; 32] = rand::random();
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&my_id.to_le_bytes());
    hello.extend_from_slice(&client_nonce);
    send(s, &hello).map_err(|e| proto(e.to_string()))?;
    let ch = recv(s).map_err(proto)?;
    if ch.len() != 2 + 32 + 32 {
        return Err(proto(format!("challenge of {} bytes", ch.len())));
    }
    let (server_id, server_nonce, proof) = (&ch[..2], &ch[2..34], &ch[34..]);
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
    send(
        s,
        &mac(
            secret,
            &[b"cli", server_nonce, &client_nonce, &my_id.to_le_bytes()],
        ),
    )
    .map_err(|e| proto(e.to_string()))?;
    let reply = recv(s).map_err(proto)?;
    match reply.split_first() {
        Some((0, json)) => {
            serde_json::from_slice(json).map_err(|e| proto(format!("bad node info: {e}")))
        }
        Some((_, text)) => Err(auth(&String::from_utf8_lossy(text))),
        None => Err(proto("empty reply".into())),
    }
}

/// Fetch every peer's info (in parallel) and check they all run this configuration.
/// `own` is this node's info; it is returned in its place.
pub fn fetch_all(cfg: &ClusterConfig, own: &NodeInfo) -> Result<Vec<NodeInfo>, BootstrapError> {
    let secret = cfg.secret_bytes().map_err(|e| BootstrapError::Mismatch {
        node: own.node,
        detail: e.to_string(),
    })?;
    let deadline = Instant::now() + Duration::from_millis(cfg.cluster.bootstrap_timeout_ms);
    let handles: Vec<_> = cfg
        .node
        .iter()
        .filter(|n| n.id != own.node)
        .map(|n| {
            let (addr, id, secret, me) = (n.bootstrap, n.id, secret.clone(), own.node);
            std::thread::spawn(move || fetch(addr, &secret, me, id, deadline))
        })
        .collect();
    let mut infos = vec![None; cfg.node.len()];
    infos[own.node as usize] = Some(own.clone());
    for h in handles {
        let info = h.join().expect("bootstrap fetch thread")?;
        check_peer(own, &info)?;
        let slot = info.node as usize;
        infos[slot] = Some(info);
    }
    Ok(infos
        .into_iter()
        .map(|i| i.expect("every node fetched"))
        .collect())
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
            detail: "its configuration (cluster name, transport, protocol expiry/margin or node list) differs from ours".into(),
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

    #[test]
    fn fetch_with_the_right_secret() {
        let srv =
            BootstrapServer::start("127.0.0.1:0".parse().unwrap(), vec![7; 32], info(1)).unwrap();
        let got = fetch(srv.addr(), &[7; 32], 0, 1, soon()).unwrap();
        assert_eq!(got, info(1));
    }

    #[test]
    fn wrong_secret_gets_no_keys() {
        let srv =
            BootstrapServer::start("127.0.0.1:0".parse().unwrap(), vec![7; 32], info(1)).unwrap();
        let e = fetch(srv.addr(), &[8; 32], 0, 1, soon()).unwrap_err();
        assert!(matches!(e, BootstrapError::Auth { node: 1, .. }), "{e}");
        assert!(
            e.to_string().contains("does not know the cluster secret"),
            "{e}"
        );
    }

    #[test]
    fn wrong_node_at_address_is_a_mismatch() {
        let srv =
            BootstrapServer::start("127.0.0.1:0".parse().unwrap(), vec![7; 32], info(2)).unwrap();
        let e = fetch(srv.addr(), &[7; 32], 0, 1, soon()).unwrap_err();
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
        let srv =
            BootstrapServer::start("127.0.0.1:0".parse().unwrap(), vec![7; 32], info(1)).unwrap();
        let mut s = TcpStream::connect(srv.addr()).unwrap();
        s.write_all(&5u32.to_le_bytes()).unwrap();
        s.write_all(b"hello").unwrap();
        let reply = recv(&mut s).unwrap();
        assert_eq!(reply[0], 1);
        let mut s = TcpStream::connect(srv.addr()).unwrap();
        s.write_all(&u32::MAX.to_le_bytes()).unwrap(); // absurd length
        drop(s);
        assert_eq!(fetch(srv.addr(), &[7; 32], 0, 1, soon()).unwrap(), info(1));
    }

    #[test]
    fn duplicate_node_cannot_bind() {
        let a =
            BootstrapServer::start("127.0.0.1:0".parse().unwrap(), vec![7; 32], info(1)).unwrap();
        let e = BootstrapServer::start(a.addr(), vec![7; 32], info(1))
            .err()
            .unwrap();
        assert!(e.to_string().contains("already running"), "{e}");
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
