//! The client side of server-driven operations: a [`Channel`] writes a request into the
//! client's request slot on the key's owner node and polls the client's response slot (in its
//! own memory) until the response carrying the request's sequence number arrives.
//! [`SdClient`] sends every operation this way; `HyClient` sends PUT and DELETE.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nessie_fabric::{Endpoint, NodeId, RemoteAddr};

use super::slots::{OpCode, Reply, SlotLayout, MAX_SEQ, REQUEST_REGION, RESPONSE_REGION};
use nessie_protocols::cd::ClusterView;
use nessie_protocols::Error;
use nessie_store::index::Placement;

/// Polls that spin (with a CPU pause hint) before a waiting client starts yielding its core.
const SPIN_POLLS: u64 = 64;
/// Polls between two checks of the clock and of the servers' liveness.
const CHECK_EVERY: u64 = 32;

/// What the clients and servers of one cluster share: the slot layout, how long a client waits
/// for a response, and whether the servers are running.
#[derive(Debug)]
pub struct RpcShared {
    pub layout: SlotLayout,
    /// A client gives up on a response after this long (`Error::Unreachable`).
    pub response_timeout_ns: u64,
    running: AtomicBool,
}

impl RpcShared {
    pub fn new(layout: SlotLayout, response_timeout_ns: u64) -> Self {
        Self {
            layout,
            response_timeout_ns,
            running: AtomicBool::new(true),
        }
    }

    /// False once the servers have been told to stop: waiting clients give up at once.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// Mark the servers stopped (the cluster does this when it shuts them down).
    pub fn set_stopped(&self) {
        self.running.store(false, Ordering::Release);
    }
}

/// A client's identity in the slot tables: its local number on its node, and the next
/// sequence number it will use. Slots handed out by a [`SlotPool`] go back to it when the
/// client is dropped (with the sequence number, so a later client of the same slot never
/// repeats one), unless a request is still unanswered.
#[derive(Debug)]
pub struct ClientSlot {
    pub local: u16,
    next_seq: u64,
    pool: Option<Arc<SlotPool>>,
}

impl ClientSlot {
    /// A slot assigned by other means (e.g. fixed per process); `next_seq` ≥ 1 must exceed
    /// every sequence number used in this slot before.
    pub fn fixed(local: u16, next_seq: u64) -> Self {
        Self {
            local,
            next_seq: next_seq.max(1),
            pool: None,
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            if let Ok(mut free) = pool.free.lock() {
                free.push((self.local, self.next_seq));
            }
        }
    }
}

/// The free client slots of one node.
#[derive(Debug)]
pub struct SlotPool {
    free: Mutex<Vec<(u16, u64)>>,
}

impl SlotPool {
    pub fn new(slots: u16) -> Arc<Self> {
        Arc::new(Self {
            free: Mutex::new((0..slots).rev().map(|l| (l, 1)).collect()),
        })
    }

    /// Take a free slot; `None` if all are in use.
    pub fn take(self: &Arc<Self>) -> Option<ClientSlot> {
        let (local, next_seq) = self.free.lock().unwrap().pop()?;
        Some(ClientSlot {
            local,
            next_seq,
            pool: Some(self.clone()),
        })
    }

    /// Slots currently free.
    pub fn available(&self) -> usize {
        self.free.lock().unwrap().len()
    }
}

/// Counters of a client's server-driven requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RpcStats {
    /// Requests sent (each answered or timed out).
    pub requests: u64,
    /// Requests to the client's own node (written and answered without the fabric).
    pub local_requests: u64,
    /// Polls of the response slot that found nothing new.
    pub empty_polls: u64,
    /// Responses that did not arrive within the response timeout.
    pub timeouts: u64,
    /// Times the response's control word was seen before the rest of it had landed.
    pub landing: u64,
}

impl RpcStats {
    pub fn add(&mut self, o: &RpcStats) {
        add_counters!(self, o: requests, local_requests, empty_polls, timeouts, landing);
    }
}

/// One client worker's request/response channel to every node's servers.
#[derive(Debug)]
pub(crate) struct Channel {
    shared: Arc<RpcShared>,
    node: NodeId,
    slot: ClientSlot,
    /// Per server node: a request whose response has not arrived (it timed out). The request
    /// slot on that node must not be overwritten before the server has consumed it, so the
    /// next request to that node first waits for this response.
    pending: Vec<Option<u64>>,
    buf: Vec<u8>,
    pub(crate) stats: RpcStats,
}

impl Drop for Channel {
    fn drop(&mut self) {
        if self.pending.iter().any(Option::is_some) {
            // A server may still consume and answer the old request: never hand the slot out again.
            self.slot.pool = None;
        }
    }
}

impl Channel {
    pub(crate) fn new(
        shared: Arc<RpcShared>,
        node: NodeId,
        node_count: usize,
        slot: ClientSlot,
    ) -> Result<Self, Error> {
        let l = &shared.layout;
        if node_count != l.nodes as usize || node as u32 >= l.nodes {
            return Err(Error::Config(format!(
                "client on node {node} of a {node_count}-node fabric, but the slots are laid out for {} nodes",
                l.nodes
            )));
        }
        if slot.local >= l.max_clients_per_node {
            return Err(Error::Config(format!(
                "client slot {} is outside the {} slots per node",
                slot.local, l.max_clients_per_node
            )));
        }
        Ok(Self {
            pending: vec![None; l.nodes as usize],
            shared,
            node,
            slot,
            buf: Vec::new(),
            stats: RpcStats::default(),
        })
    }

    pub(crate) fn local(&self) -> u16 {
        self.slot.local
    }

    /// Send `op` on `key` (and `value`) to `owner`'s servers and wait for the reply. Sizes
    /// must have been validated by the caller.
    pub(crate) fn call<E: Endpoint>(
        &mut self,
        ep: &mut E,
        owner: NodeId,
        op: OpCode,
        key: &[u8],
        value: &[u8],
    ) -> Reply {
        if !self.shared.is_running() {
            return Err(stopped(owner));
        }
        if let Some(old) = self.pending[owner as usize] {
            // Our previous request to this node timed out: its slot is free only once answered
            // (the late reply itself is of no use any more: that operation was reported failed).
            let _late = self.wait(ep, owner, old)?;
            self.pending[owner as usize] = None;
        }
        let seq = self.slot.next_seq;
        if seq > MAX_SEQ {
            return Err(Error::Config(format!(
                "client slot {} has used up its sequence numbers",
                self.slot.local
            )));
        }
        self.slot.next_seq += 1;
        let l = self.shared.layout;
        let at = l.encode_request(&mut self.buf, seq, op, key, value);
        let off = l.request_offset(l.client_index(self.node, self.slot.local)) + at;
        if owner == self.node {
            ep.local_write(REQUEST_REGION, off, &self.buf)?;
            self.stats.local_requests += 1;
        } else {
            ep.write(RemoteAddr::new(owner, REQUEST_REGION, off), &self.buf)?;
        }
        self.stats.requests += 1;
        self.pending[owner as usize] = Some(seq);
        let r = self.wait(ep, owner, seq)?;
        self.pending[owner as usize] = None;
        r
    }

    /// Poll the response slot of `owner` until it holds the response to `seq`. The outer error
    /// is the wait's (timeout, servers stopped, fabric); the inner result is the operation's.
    fn wait<E: Endpoint>(&mut self, ep: &mut E, owner: NodeId, seq: u64) -> Result<Reply, Error> {
        let l = self.shared.layout;
        let base = l.response_offset(self.slot.local, owner);
        let mut w = [0u8; 8];
        let start = ep.mono_ns();
        let mut polls = 0u64;
        loop {
            ep.local_read(RESPONSE_REGION, base + l.response_ctrl_offset(), &mut w)?;
            let (s, status) = SlotLayout::parse_response_ctrl(u64::from_le_bytes(w));
            if s == seq {
                // Read the rest after the control word; accept it only if its checksum matches
                // (otherwise the server's WRITE is still landing: keep polling).
                let mut tail = [0u8; 40];
                ep.local_read(RESPONSE_REGION, base + l.response_tail_offset(), &mut tail)?;
                let len = l
                    .response_payload_len(&tail)
                    .map_err(|e| Error::Corrupt(e.to_string()))?;
                let (off, padded) = l.response_payload(len);
                self.buf.resize(padded, 0);
                ep.local_read(RESPONSE_REGION, base + off, &mut self.buf[..padded])?;
                if SlotLayout::response_complete(seq, &self.buf[..padded], &tail) {
                    self.stats.empty_polls += polls;
                    return Ok(SlotLayout::decode_reply(
                        status,
                        &tail,
                        &self.buf[..len],
                        owner,
                    ));
                }
                self.stats.landing += 1;
            }
            polls += 1;
            if polls < SPIN_POLLS || ep.virtual_time() {
                let slot = base..base + l.response_slot;
                ep.idle_poll(RESPONSE_REGION, std::slice::from_ref(&slot));
            } else {
                std::thread::yield_now();
            }
            if polls.is_multiple_of(CHECK_EVERY) {
                if !self.shared.is_running() {
                    self.stats.empty_polls += polls;
                    return Err(stopped(owner));
                }
                let waited = ep.mono_ns().saturating_sub(start);
                if waited >= self.shared.response_timeout_ns {
                    self.stats.empty_polls += polls;
                    self.stats.timeouts += 1;
                    return Err(Error::Unreachable {
                        node: owner,
                        reason: format!(
                            "no response from its servers within {} ms",
                            waited / 1_000_000
                        ),
                    });
                }
            }
        }
    }
}

fn stopped(node: NodeId) -> Error {
    Error::Unreachable {
        node,
        reason: "its servers have stopped".into(),
    }
}

/// Check key and value sizes exactly as the client-driven protocol does, before any memory is
/// touched.
pub(crate) fn check_sizes(
    view: &ClusterView,
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if key.len() > view.dte.key_max as usize {
        return Err(Error::KeyTooLarge {
            len: key.len(),
            max: view.dte.key_max,
        });
    }
    if let Some(v) = value {
        if v.len() > view.dte.value_max as usize {
            return Err(Error::ValueTooLarge {
                len: v.len(),
                max: view.dte.value_max,
            });
        }
    }
    Ok(())
}

/// The owner of `key` under the view's (coupled) index.
pub(crate) fn owner(view: &ClusterView, key: &[u8]) -> NodeId {
    view.index
        .owner(key)
        .expect("SD/HY views use the coupled index")
}

pub(crate) fn require_coupled(view: &ClusterView) -> Result<(), Error> {
    if view.index.placement != Placement::Coupled {
        return Err(Error::Config(
            "SD and HY need the coupled index (see ClusterView::coupled)".into(),
        ));
    }
    Ok(())
}

/// Counters of one SD client worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SdClientStats {
    pub gets: u64,
    pub puts: u64,
    pub deletes: u64,
    pub rpc: RpcStats,
}

/// One client worker of the server-driven protocol (NessieSD): every operation is a request to
/// the key's owner node, executed there by a server thread.
pub struct SdClient<E: Endpoint> {
    pub(crate) ep: E,
    pub(crate) view: Arc<ClusterView>,
    chan: Channel,
    stats: SdClientStats,
}

impl<E: Endpoint> SdClient<E> {
    /// A client worker on `ep`'s node using request slot `slot` (unique among the node's live
    /// SD/HY clients). `view` must use the coupled index, like the servers'.
    pub fn new(
        ep: E,
        view: Arc<ClusterView>,
        shared: Arc<RpcShared>,
        slot: ClientSlot,
    ) -> Result<Self, Error> {
        require_coupled(&view)?;
        if shared.layout.key_max != view.dte.key_max
            || shared.layout.value_max != view.dte.value_max
        {
            return Err(Error::Config(
                "slot layout and geometry disagree on key/value sizes".into(),
            ));
        }
        let chan = Channel::new(shared, ep.node(), ep.node_count(), slot)?;
        Ok(Self {
            ep,
            view,
            chan,
            stats: SdClientStats::default(),
        })
    }

    /// Read the value of `key`; `Ok(None)` if it is not in the store.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        check_sizes(&self.view, key, None)?;
        self.stats.gets += 1;
        let owner = owner(&self.view, key);
        self.chan.call(&mut self.ep, owner, OpCode::Get, key, &[])
    }

    /// Store `value` under `key`.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        check_sizes(&self.view, key, Some(value))?;
        self.stats.puts += 1;
        let owner = owner(&self.view, key);
        self.chan
            .call(&mut self.ep, owner, OpCode::Put, key, value)
            .map(|_| ())
    }

    /// Remove `key` (a no-op if absent).
    pub fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        check_sizes(&self.view, key, None)?;
        self.stats.deletes += 1;
        let owner = owner(&self.view, key);
        self.chan
            .call(&mut self.ep, owner, OpCode::Delete, key, &[])
            .map(|_| ())
    }

    pub fn stats(&self) -> SdClientStats {
        SdClientStats {
            rpc: self.chan.stats,
            ..self.stats
        }
    }

    pub fn node(&self) -> NodeId {
        self.ep.node()
    }

    /// This client's slot number on its node.
    pub fn slot(&self) -> u16 {
        self.chan.local()
    }

    pub fn endpoint(&self) -> &E {
        &self.ep
    }

    pub fn view(&self) -> &Arc<ClusterView> {
        &self.view
    }
}
