//! Routing a short-lived client's key operations (the `nessie` CLI) to the node processes.
//!
//! A PUT writes the value into the data table of the node whose client performs it, so sending
//! every operation through one node would fill that node's table and leave the others empty.
//! Instead each key has a **home node**:
//!
//! ```text
//! home(key) = xxh3_64_with_seed(key bytes, ROUTE_SEED) % nodes
//! ```
//!
//! (node ids are `0..nodes`, as `cluster.toml` requires). The hash is fixed so that every CLI
//! version sends a key to the same node. The home node is tried first, then the following ids in
//! turn (`home+1`, `home+2`, … modulo `nodes`). A node is skipped when its admin socket refuses
//! the connection, when it is busy (its reply to a PING is an error, e.g. too many admin
//! connections) or when it does not answer the PING within [`PROBE_TIMEOUT`] (a stopped or
//! wedged process). The whole call is bounded by the cluster's `op_timeout_ms` plus
//! [`REPLY_GRACE`]: a node bounds each fabric operation by `op_timeout_ms`, so the grace lets its
//! own, more precise error (e.g. "node 0 is unreachable") arrive before the caller gives up.
//!
//! Only the PING is retried on another node: once the operation itself has been sent, a failure
//! is reported (naming the node and why) rather than repeated elsewhere, since the first node may
//! still carry it out.

use std::path::Path;
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::admin::{decode_error, AdminClient, AdminError, Request, Response};
use crate::config::ClusterConfig;

/// Seed of the home-node hash. Part of the CLI's contract: changing it moves every key's home.
pub const ROUTE_SEED: u64 = 0x6e65_7373_6965_c11e;
/// How long a node has to answer the PING that checks it is alive and not busy.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Time allowed beyond `op_timeout_ms` for a node's reply (see the module documentation).
pub const REPLY_GRACE: Duration = Duration::from_secs(1);

/// The home node of `key` in a cluster of `nodes` nodes (ids `0..nodes`).
pub fn home_node(key: &[u8], nodes: u16) -> u16 {
    assert!(nodes > 0, "a cluster has at least one node");
    (xxh3_64_with_seed(key, ROUTE_SEED) % nodes as u64) as u16
}

/// The nodes to try for `key`, in order: the home node, then the following ids, wrapping.
pub fn candidates(key: &[u8], nodes: u16) -> Vec<u16> {
    let home = home_node(key, nodes);
    (0..nodes).map(|i| (home + i) % nodes).collect()
}

/// Why a routed operation failed. Every variant names the node(s) involved.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The operation reached `node`, which reported this error.
    #[error("{err} (reported by node {node})")]
    Op {
        node: u16,
        err: nessie_protocols::Error,
    },
    /// The operation was sent to `node` but no reply came in time.
    #[error(
        "node {node} did not reply within {waited:?} (op_timeout_ms = {op_timeout_ms}): {reason}"
    )]
    NoReply {
        node: u16,
        waited: Duration,
        op_timeout_ms: u64,
        reason: String,
    },
    /// No node could take the operation; one reason per node tried.
    #[error("no node could take the operation: {}", .0.join("; "))]
    NoNode(Vec<String>),
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Where and how to send operations.
pub struct Router<'a> {
    pub cfg: &'a ClusterConfig,
    /// The directory that relative admin socket paths are resolved against.
    pub dir: &'a Path,
    /// Send everything to this node, with no fallback (`nessie --node K`).
    pub forced: Option<u16>,
}

impl Router<'_> {
    /// Send `req` for `key` to the first node that takes it. Returns the node and its reply
    /// (never `Response::Error`: that becomes [`RouteError::Op`]).
    pub fn call(&self, key: &[u8], req: &Request) -> Result<(u16, Response), RouteError> {
        let op_timeout_ms = self.cfg.cluster.op_timeout_ms;
        let deadline = Instant::now() + Duration::from_millis(op_timeout_ms) + REPLY_GRACE;
        let (mut client, node) = match self.forced {
            Some(id) => (self.connect(id)?, id),
            None => self.first_usable(key, deadline)?,
        };
        let started = Instant::now();
        let reply = set_timeout(&mut client, deadline).and_then(|()| client.call(req));
        match reply {
            Ok(Response::Error(e)) => Err(RouteError::Op {
                node,
                err: decode_error(&e),
            }),
            Ok(r) => Ok((node, r)),
            Err(e) => Err(RouteError::NoReply {
                node,
                waited: started.elapsed(),
                op_timeout_ms,
                reason: describe(&e),
            }),
        }
    }

    fn connect(&self, id: u16) -> Result<AdminClient, RouteError> {
        let path = self
            .cfg
            .admin_path(id, self.dir)
            .map_err(|e| RouteError::Config(e.to_string()))?;
        // The timeout is set per call; this one only bounds a (blocking) connect's first use.
        AdminClient::connect(&path, PROBE_TIMEOUT)
            .map_err(|e| RouteError::NoNode(vec![format!("node {id}: {}", describe(&e))]))
    }

    /// Connect to the first of `key`'s candidates that answers a PING in time and is not busy.
    fn first_usable(
        &self,
        key: &[u8],
        deadline: Instant,
    ) -> Result<(AdminClient, u16), RouteError> {
        let mut skipped = Vec::new();
        for id in candidates(key, self.cfg.node.len() as u16) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                skipped.push(format!("node {id}: not tried, op_timeout_ms reached"));
                break;
            }
            match self
                .connect(id)
                .and_then(|c| probe(c, left.min(PROBE_TIMEOUT), id))
            {
                Ok(c) => {
                    for why in &skipped {
                        tracing::info!("skipped {why}");
                    }
                    return Ok((c, id));
                }
                Err(RouteError::NoNode(why)) => skipped.extend(why),
                Err(e) => return Err(e),
            }
        }
        Err(RouteError::NoNode(skipped))
    }
}

/// PING a node: it is usable if it answers OK within `timeout`.
fn probe(mut c: AdminClient, timeout: Duration, id: u16) -> Result<AdminClient, RouteError> {
    let skip = |why: String| RouteError::NoNode(vec![format!("node {id}: {why}")]);
    c.set_timeout(timeout).map_err(|e| skip(e.to_string()))?;
    match c.call(&Request::Ping) {
        Ok(Response::Ok) => Ok(c),
        Ok(Response::Error(e)) => Err(skip(e)),
        Ok(r) => Err(skip(format!("unexpected reply to PING: {r:?}"))),
        Err(e) if is_timeout(&e) => Err(skip(format!("no reply to PING within {timeout:?}"))),
        Err(e) => Err(skip(describe(&e))),
    }
}

fn set_timeout(c: &mut AdminClient, deadline: Instant) -> Result<(), AdminError> {
    // A zero timeout means "none" to the socket; keep at least a millisecond.
    let left = deadline.saturating_duration_since(Instant::now());
    Ok(c.set_timeout(left.max(Duration::from_millis(1)))?)
}

fn is_timeout(e: &AdminError) -> bool {
    matches!(e, AdminError::Io(io)
        if matches!(io.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

/// An admin socket error in words, timeouts said plainly (not as "Resource temporarily
/// unavailable").
fn describe(e: &AdminError) -> String {
    if is_timeout(e) {
        "no reply (the node may be stopped, wedged or overloaded)".into()
    } else {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_node_is_stable_and_spreads_keys() {
        // Pinned: the home of a key is part of the CLI's documented behaviour.
        let homes: Vec<u16> = [&b"greeting"[..], b"a", b"b", b"key-0"]
            .iter()
            .map(|k| home_node(k, 3))
            .collect();
        assert_eq!(homes, vec![0, 2, 0, 0]);
        assert_eq!(home_node(b"greeting", 64), 12);
        let mut per_node = [0u32; 3];
        for i in 0..300 {
            per_node[home_node(format!("key-{i}").as_bytes(), 3) as usize] += 1;
        }
        assert!(per_node.iter().all(|&n| n > 60), "{per_node:?}");
        assert_eq!(home_node(b"anything", 1), 0);
    }

    #[test]
    fn candidates_start_at_home_and_cover_every_node_once() {
        for key in [&b"a"[..], b"b", b"c", b"dd"] {
            let c = candidates(key, 5);
            assert_eq!(c[0], home_node(key, 5));
            let mut sorted = c.clone();
            sorted.sort();
            assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
        }
    }
}
