//! [`UcxEndpoint`]: one worker thread's handle onto the UCX fabric.

use std::os::raw::c_int;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use nessie_fabric::memory::{direct_read, direct_write, AccessError, WordMemory};
use nessie_fabric::{
    Batch, BatchOp, Endpoint, FabricError, Locality, NodeId, OpKind, Post, PostResult, PostToken,
    RegionId, RemoteAddr, StatsCell, ALIGN, MAX_BATCH_OPS, MAX_POSTED,
};

use crate::config::Transport;
use crate::ffi;
use crate::node::{NodeInfo, NodeShared};
use crate::sys::{ConnectedWorker, Worker};

struct Peer {
    /// (base address in the peer's process, length) per region.
    regions: Vec<(u64, u64)>,
    /// Why this peer is unreachable (cleared only when its restarted process is connected).
    dead: Option<String>,
    /// The generation of the peer's entry in the node's `PeerTable` this connection is for.
    generation: u64,
    /// How to connect to it again (`None`: its restarted process is not known yet).
    info: Option<NodeInfo>,
    /// The renewal count (`UcxNode::renew_peer`) last acted on.
    renewed: u64,
}

/// One worker thread's endpoint: its own ucp worker (thread mode SINGLE), a ucp endpoint to
/// every node's worker (its own node included) and the unpacked rkeys of every region.
/// Operations post one nbx call and busy-poll this worker until it completes.
pub struct UcxEndpoint {
    peers: Vec<Peer>,
    /// The `PeerTable` epoch last looked at.
    peers_epoch: u64,
    stats: Arc<StatsCell>,
    timeout_ns: u64,
    /// Operations on this node's own memory bypass UCX (`UcxConfig::direct_loopback`).
    direct_loopback: bool,
    /// Operations on peers' memory mapped into this process bypass UCX
    /// (`UcxConfig::direct_peers`).
    direct_peers: bool,
    /// Operations posted and not yet reported (`Post`), each boxed: the shim holds its address.
    posted: Vec<Posted>,
    /// Results of posted operations settled outside a poll (their peer failed or was
    /// reconnected meanwhile), reported by the next poll.
    settled: Vec<(PostToken, PostResult)>,
    /// Since when polls of posted operations found nothing (`Post::posted_idle`).
    idle_since: Option<u64>,
    /// Peer connections failed or replaced so far: a batch wave that saw this change while it
    /// gathered operations derives their endpoints and rkeys again (the old ones are freed).
    conn_changes: u64,
    // Drop order: UCX objects (rkeys, endpoints, worker) before the shared node state that
    // holds the context.
    conn: ConnectedWorker,
    shared: Arc<NodeShared>,
}

// A batch's operations fit in one call of the shim.
const _: () = assert!(MAX_BATCH_OPS <= ffi::NSH_BATCH_MAX);

/// A posted operation in flight (`Post::post`).
struct Posted {
    p: Box<ffi::NshPosted>,
    token: PostToken,
    node: NodeId,
    kind: OpKind,
    /// When it is forced to end: its endpoint is force-closed then (which completes it with
    /// an error), and a request that survives that by another timeout aborts the process, as
    /// a blocking wait does (UCX would write into memory that is no longer the caller's).
    deadline_ns: u64,
    forced: bool,
}

// SAFETY: the pointers name this endpoint's own UCX objects (endpoint, rkey, request) and the
// poster's buffer; they move with the endpoint, whose worker is used by one thread at a time
// (thread mode SINGLE), as every other UCX object the endpoint holds.
unsafe impl Send for Posted {}

fn op_name(kind: OpKind) -> &'static str {
    match kind {
        OpKind::Read => "READ",
        OpKind::Write => "WRITE",
        OpKind::Cas => "CAS",
    }
}

fn is_fatal_local(status: c_int) -> bool {
    // Errors that say something about this call or this process, not about the peer.
    const UNSUPPORTED: c_int = -22;
    const INVALID_PARAM: c_int = -5;
    const NO_MEMORY: c_int = -4;
    const NOT_IMPLEMENTED: c_int = -8;
    matches!(
        status,
        UNSUPPORTED | INVALID_PARAM | NO_MEMORY | NOT_IMPLEMENTED
    )
}

/// The shim's `block_after_ns` for `config.wait_spin` (0: poll throughout; a zero wait spin
/// is 1 ns, so that it still blocks).
fn block_after_ns(config: &crate::UcxConfig) -> u64 {
    config
        .wait_spin
        .map_or(0, |d| (d.as_nanos().min(u64::MAX as u128) as u64).max(1))
}

impl UcxEndpoint {
    /// Region `region` of this endpoint's own node.
    fn own_region(&self, region: RegionId) -> Result<&WordMemory, FabricError> {
        let node = self.shared.node;
        self.shared
            .regions
            .get(region as usize)
            .map(|r| &r.mem)
            .ok_or(FabricError::UnknownRegion { node, region })
    }

    /// An operation of `kind` on `len` bytes at `addr` performed straight on memory by `op`,
    /// when it is to bypass UCX (`None`: it goes through UCX): this node's own memory
    /// (counted as a loopback operation), or a peer's that its transport maps into this
    /// process (a remote one).
    fn direct<T>(
        &mut self,
        kind: OpKind,
        addr: RemoteAddr,
        len: usize,
        op: impl FnOnce(&WordMemory) -> Result<T, AccessError>,
    ) -> Option<Result<T, FabricError>> {
        if addr.node != self.shared.node {
            return self.direct_peer(kind, addr, len, op);
        }
        if !self.direct_loopback {
            return None;
        }
        Some(self.own_region(addr.region).and_then(|mem| {
            let v = op(mem).map_err(|e| e.at(addr, len, mem))?;
            self.stats.record(kind, Locality::Loopback, len as u64);
            Ok(v)
        }))
    }

    /// [`Self::direct`] on a peer's memory mapped into this process (shm). It is checked as an
    /// operation through UCX is: a restarted peer is reconnected first, a dead one refused, and
    /// the worker is progressed every few operations so that keepalive still fails the
    /// endpoint of a peer that died (its segment stays mapped, so without that its orphaned
    /// memory would be read and written for ever). `None` for a peer without mapped memory
    /// or already known to be unreachable: the UCX path serves or reports it.
    fn direct_peer<T>(
        &mut self,
        kind: OpKind,
        addr: RemoteAddr,
        len: usize,
        op: impl FnOnce(&WordMemory) -> Result<T, AccessError>,
    ) -> Option<Result<T, FabricError>> {
        if !self.direct_peers {
            return None;
        }
        let n = addr.node as usize;
        self.refresh_peers();
        self.renew_if_asked(n);
        if self.peers.get(n)?.dead.is_some() {
            return None;
        }
        let status = self.conn.check_direct(n);
        if status != ffi::UCS_OK {
            return Some(Err(self.fail(addr.node, status, op_name(kind))));
        }
        let mem = self.conn.split(n).1?.direct(addr.region as usize)?;
        Some(match op(mem) {
            Ok(v) => {
                self.stats.record(kind, Locality::Remote, len as u64);
                Ok(v)
            }
            Err(e) => Err(e.at(addr, len, mem)),
        })
    }

    /// Map peer `n`'s regions into this process for [`Self::direct_peer`], if asked for.
    fn map_peer(&mut self, n: usize) {
        if self.direct_peers && self.peers[n].dead.is_none() {
            let regions = self.peers[n].regions.clone();
            self.conn.map_direct(n, &regions);
        }
    }

    pub(crate) fn connect(
        shared: Arc<NodeShared>,
        stats: Arc<StatsCell>,
        cluster: &[NodeInfo],
    ) -> Result<Self, FabricError> {
        let me = shared.node as usize;
        if cluster.len() > NodeId::MAX as usize {
            return Err(FabricError::Transport(format!(
                "{} nodes exceed the maximum",
                cluster.len()
            )));
        }
        match cluster.get(me) {
            Some(i) if i.worker_address == shared.info.worker_address => {}
            Some(_) => {
                return Err(FabricError::Transport(format!(
                    "cluster entry {me} is not this node's NodeInfo (worker address differs)"
                )))
            }
            None => {
                return Err(FabricError::UnknownNode {
                    node: shared.node,
                    nodes: cluster.len(),
                })
            }
        }
        let timeout_ns = shared.config.op_timeout.as_nanos().min(u64::MAX as u128) as u64;
        // Peers restarted since `cluster` was fetched count as changed: they are reconnected
        // before the first operation.
        let peers_epoch = 0;
        let worker = Worker::new(&shared.ctx).map_err(|e| FabricError::Transport(e.to_string()))?;
        let mut conn = ConnectedWorker::new(worker, timeout_ns, block_after_ns(&shared.config));
        let mut peers = Vec::with_capacity(cluster.len());
        for info in cluster {
            let rkeys: Vec<&[u8]> = info.regions.iter().map(|r| r.rkey.as_slice()).collect();
            let dead = if info.is_unknown() {
                conn.skip();
                Some("its process is not known (it was down when this node started)".into())
            } else {
                conn.connect(&info.worker_address, &rkeys)
                    .err()
                    .map(|e| e.to_string())
            };
            peers.push(Peer {
                regions: info.regions.iter().map(|r| (r.base, r.len)).collect(),
                dead,
                generation: 0,
                info: (!info.is_unknown()).then(|| info.clone()),
                renewed: shared.peers.renewals_of(peers.len()),
            });
        }
        let direct_loopback =
            shared.config.direct_loopback && shared.config.transport.cpu_atomics();
        // Only where every peer's atomics are CPU atomics on the same memory: over shm (sm
        // transports map peers' segments; `ucx_info -d`: their atomics are the CPU's).
        let direct_peers = shared.config.direct_peers && shared.config.transport == Transport::Shm;
        let mut ep = Self {
            peers,
            peers_epoch,
            stats,
            timeout_ns,
            direct_loopback,
            direct_peers,
            posted: Vec::new(),
            settled: Vec::new(),
            idle_since: None,
            conn_changes: 0,
            conn,
            shared,
        };
        for n in 0..ep.peers.len() {
            ep.wire_up(n);
            if n != me {
                ep.map_peer(n);
            }
        }
        ep.refresh_peers();
        Ok(ep)
    }

    /// Finish wireup with peer `n` now (flush waits for it), while both sides progress: the
    /// peer's node worker is driven by its progress thread, ours by this call. An idle endpoint
    /// does not progress its worker, and UCX 1.13 aborts (assertion) when a worker is destroyed
    /// with a wireup reply still pending towards such a worker.
    fn wire_up(&mut self, n: usize) {
        if self.peers[n].dead.is_some() {
            return;
        }
        let status = {
            let (worker, peer) = self.conn.split(n);
            let p = peer.expect("connected peer");
            // SAFETY: valid worker and endpoint.
            unsafe { ffi::nsh_ep_flush(worker.raw(), p.ep(), self.timeout_ns) }
        };
        if status != ffi::UCS_OK {
            let _ = self.fail(n as NodeId, status, "connecting");
        }
    }

    /// Reconnect to every peer whose process was restarted since we last looked
    /// (`UcxNode::set_peer`): one atomic load when nothing changed.
    fn refresh_peers(&mut self) {
        let epoch = self.shared.peers.epoch.load(Ordering::SeqCst);
        if epoch == self.peers_epoch {
            return;
        }
        let table: Vec<(u64, Option<NodeInfo>)> = self.shared.peers.infos.lock().unwrap().clone();
        self.peers_epoch = epoch;
        for (n, (generation, info)) in table.into_iter().enumerate() {
            if n >= self.peers.len() || generation == self.peers[n].generation {
                continue;
            }
            self.peers[n].generation = generation;
            self.peers[n].info = info;
            self.connect_again(n);
        }
    }

    /// Replace the connection to peer `n` with a new one made from its known info.
    fn connect_again(&mut self, n: usize) {
        self.settle_posted_to(n as NodeId, "the connection was replaced");
        self.conn_changes += 1;
        let Some(info) = self.peers[n].info.take() else {
            self.conn.disconnect(n);
            self.peers[n].dead = Some("its restarted process is not known yet".into());
            return;
        };
        let rkeys: Vec<&[u8]> = info.regions.iter().map(|r| r.rkey.as_slice()).collect();
        self.peers[n].regions = info.regions.iter().map(|r| (r.base, r.len)).collect();
        self.peers[n].dead = self
            .conn
            .reconnect(n, &info.worker_address, &rkeys)
            .err()
            .map(|e| e.to_string());
        self.peers[n].info = Some(info);
        self.wire_up(n);
        if n != self.shared.node as usize {
            self.map_peer(n);
        }
    }

    /// Peer `n`'s connection broke earlier; if it was renewed since (`UcxNode::renew_peer`),
    /// connect again. Only on the way to an operation to `n`, so an endpoint that never talks
    /// to a peer that is still unresponsive never waits on it.
    fn renew_if_asked(&mut self, n: usize) {
        let Some(p) = self.peers.get(n) else { return };
        if p.dead.is_none() || p.info.is_none() {
            return;
        }
        let renewals = self.shared.peers.renewals_of(n);
        if renewals == p.renewed {
            return;
        }
        self.peers[n].renewed = renewals;
        self.connect_again(n);
    }

    /// Whether `node` is known to be unreachable from this endpoint (an earlier operation
    /// failed or timed out, or UCX reported the peer dead).
    pub fn is_unreachable(&self, node: NodeId) -> bool {
        self.peers
            .get(node as usize)
            .is_some_and(|p| p.dead.is_some())
    }

    /// Whether operations on `node`'s memory go straight to it, mapped into this process
    /// (`UcxConfig::direct_peers`), rather than through UCX.
    pub fn maps_memory_of(&mut self, node: NodeId) -> bool {
        self.direct_peers
            && node != self.shared.node
            && self
                .peers
                .get(node as usize)
                .is_some_and(|p| p.dead.is_none())
            && self
                .conn
                .split(node as usize)
                .1
                .is_some_and(|p| p.direct(0).is_some())
    }

    /// Drive this endpoint's worker once (normally only done inside operations). An idle
    /// endpoint can call this to let keepalive notice dead peers.
    pub fn progress(&mut self) {
        self.conn.worker().progress();
    }

    /// UCX's description of the connection to `node` (lanes, transports, devices), for
    /// diagnostics; `None` if there is no live connection.
    pub fn describe_connection(&mut self, node: NodeId) -> Option<String> {
        self.conn.split(node as usize).1.map(|p| p.describe())
    }

    fn locality(&self, node: NodeId) -> Locality {
        if node == self.shared.node {
            Locality::Loopback
        } else {
            Locality::Remote
        }
    }

    /// Validate an access (same checks and order as the in-process backend) and return the
    /// remote virtual address.
    fn target(&self, addr: RemoteAddr, len: usize) -> Result<u64, FabricError> {
        let node = addr.node;
        let p = self
            .peers
            .get(node as usize)
            .ok_or(FabricError::UnknownNode {
                node,
                nodes: self.peers.len(),
            })?;
        if let Some(reason) = &p.dead {
            return Err(FabricError::Unreachable {
                node,
                reason: reason.clone(),
            });
        }
        let &(base, size) =
            p.regions
                .get(addr.region as usize)
                .ok_or(FabricError::UnknownRegion {
                    node,
                    region: addr.region,
                })?;
        if !addr.offset.is_multiple_of(ALIGN) || !(len as u64).is_multiple_of(ALIGN) {
            return Err(FabricError::Misaligned {
                offset: addr.offset,
                len: len as u64,
                align: ALIGN,
            });
        }
        let oob = || FabricError::OutOfBounds {
            node,
            region: addr.region,
            offset: addr.offset,
            len: len as u64,
            size,
        };
        let end = addr.offset.checked_add(len as u64).ok_or_else(oob)?;
        if end > size {
            return Err(oob());
        }
        Ok(base + addr.offset)
    }

    /// Turn a non-OK status of an operation to `node` into an error (marking the peer dead
    /// unless the error is local).
    fn fail(&mut self, node: NodeId, status: c_int, op: &str) -> FabricError {
        let msg = ffi::status_string(status);
        if !is_fatal_local(status) {
            self.settle_posted_to(node, &msg);
            self.conn_changes += 1;
        }
        if is_fatal_local(status) {
            return FabricError::Transport(format!("{op} to node {node}: {msg}"));
        }
        let reason = if status == ffi::UCS_ERR_TIMED_OUT {
            format!(
                "{op} did not complete within {:?} ({msg})",
                self.shared.config.op_timeout
            )
        } else {
            format!("{op} failed: {msg}")
        };
        self.peers[node as usize].dead = Some(reason.clone());
        self.conn.fail_peer(node as usize, status);
        FabricError::Unreachable { node, reason }
    }

    fn run(
        &mut self,
        kind: OpKind,
        addr: RemoteAddr,
        len: usize,
        f: impl FnOnce(&mut Worker, *mut ffi::NshEp, *mut ffi::UcpRkey, u64, u64) -> c_int,
    ) -> Result<(), FabricError> {
        self.refresh_peers();
        self.renew_if_asked(addr.node as usize);
        let raddr = self.target(addr, len)?;
        let timeout = self.timeout_ns;
        let status = {
            let (worker, peer) = self.conn.split(addr.node as usize);
            match peer {
                None => ffi::UCS_ERR_NOT_CONNECTED,
                Some(p) if p.status() != ffi::UCS_OK => p.status(),
                Some(_) if len == 0 => ffi::UCS_OK,
                Some(p) => f(worker, p.ep(), p.rkey(addr.region as usize), raddr, timeout),
            }
        };
        if status != ffi::UCS_OK {
            return Err(self.fail(addr.node, status, op_name(kind)));
        }
        self.stats
            .record(kind, self.locality(addr.node), len as u64);
        Ok(())
    }
}

impl UcxEndpoint {
    /// Operation `op` of a batch performed straight on memory, when it bypasses UCX
    /// ([`Self::direct`]); `None`: it goes through UCX.
    fn direct_batch_op(&mut self, op: &mut BatchOp<'_>) -> Option<Result<u64, FabricError>> {
        let (kind, len) = (op.kind(), op.len());
        match op {
            BatchOp::Read { addr, buf } => {
                let at = addr.offset;
                self.direct(kind, *addr, len, |m| m.read(at, buf).map(|()| 0))
            }
            BatchOp::Write { addr, buf } => {
                let at = addr.offset;
                self.direct(kind, *addr, len, |m| m.write(at, buf).map(|()| 0))
            }
            BatchOp::Cas {
                addr,
                expected,
                desired,
            } => {
                let (at, e, d) = (addr.offset, *expected, *desired);
                self.direct(kind, *addr, len, |m| m.compare_and_swap(at, e, d))
            }
        }
    }

    /// Operation `op` as the shim posts it through UCX, after the checks every operation
    /// gets; `Err`: it is over already (refused, or empty), with this result.
    fn ucx_op(
        &mut self,
        op: &mut BatchOp<'_>,
    ) -> Result<ffi::NshBatchOp, Result<u64, FabricError>> {
        let (kind, addr, len) = (op.kind(), op.addr(), op.len());
        self.renew_if_asked(addr.node as usize);
        let raddr = self.target(addr, len).map_err(Err)?;
        let (ep, rkey) = match self.conn.split(addr.node as usize).1 {
            None => (Err(ffi::UCS_ERR_NOT_CONNECTED), std::ptr::null_mut()),
            Some(p) if p.status() != ffi::UCS_OK => (Err(p.status()), std::ptr::null_mut()),
            Some(p) => (Ok(p.ep()), p.rkey(addr.region as usize)),
        };
        let ep = match ep {
            Err(status) => return Err(Err(self.fail(addr.node, status, op_name(kind)))),
            Ok(_) if len == 0 => {
                self.stats.record(kind, self.locality(addr.node), 0);
                return Err(Ok(0));
            }
            Ok(ep) => ep,
        };
        let mut p = ffi::NshBatchOp {
            ep,
            rkey,
            raddr,
            len,
            ..ffi::NshBatchOp::EMPTY
        };
        match op {
            BatchOp::Read { buf, .. } => {
                p.kind = ffi::NSH_OP_READ;
                p.buf = buf.as_mut_ptr().cast();
            }
            BatchOp::Write { buf, .. } => {
                p.kind = ffi::NSH_OP_WRITE;
                p.buf = buf.as_ptr() as *mut _;
            }
            BatchOp::Cas {
                expected, desired, ..
            } => {
                p.kind = ffi::NSH_OP_CAS;
                p.expected = *expected;
                p.result = *desired;
            }
        }
        Ok(p)
    }

    /// One wave of a batch (`Batch::wave_end`: no two of its operations conflict): the
    /// operations that bypass UCX are performed here, the others posted together with one
    /// `nsh_batch` call (one progress loop until all complete). Each operation gets its own
    /// result; a failure marks its peer unreachable as a single operation's does.
    fn run_wave(&mut self, batch: &mut Batch<'_>, wave: std::ops::Range<usize>) {
        assert!(
            wave.len() <= MAX_BATCH_OPS,
            "a wave of {} operations",
            wave.len()
        );
        self.refresh_peers();
        let mut changes = self.conn_changes;
        let mut posted = [ffi::NshBatchOp::EMPTY; MAX_BATCH_OPS];
        let mut which = [0usize; MAX_BATCH_OPS];
        let mut n = 0;
        for i in wave {
            let op = batch.op_mut(i);
            if let Some(r) = self.direct_batch_op(op) {
                batch.complete(i, r);
                continue;
            }
            let p = match self.ucx_op(op) {
                Ok(p) => p,
                Err(r) => {
                    batch.complete(i, r);
                    continue;
                }
            };
            posted[n] = p;
            which[n] = i;
            n += 1;
        }
        // A later operation of the wave may have failed or replaced a peer's connection
        // (`fail`, `connect_again` from a direct operation's refresh): the endpoints and rkeys
        // gathered before it may be freed. Derive them again until nothing changes (a failed
        // peer is dead, so this ends).
        while self.conn_changes != changes {
            changes = self.conn_changes;
            let mut m = 0;
            for k in 0..n {
                let i = which[k];
                match self.ucx_op(batch.op_mut(i)) {
                    Ok(p) => {
                        posted[m] = p;
                        which[m] = i;
                        m += 1;
                    }
                    Err(r) => batch.complete(i, r),
                }
            }
            n = m;
        }
        if n == 0 {
            return;
        }
        let worker = self.conn.worker().raw();
        // SAFETY: every posted operation's endpoint and rkey are live (held by `self.conn`,
        // not changed until the call returns) and its buffer is the batch's, valid for `len`
        // bytes and not otherwise accessed until the call returns; the shim does not return
        // while UCX may still touch a buffer (a deadline force-closes the endpoints).
        let status = unsafe { ffi::nsh_batch(worker, posted.as_mut_ptr(), n, self.timeout_ns) };
        assert_eq!(status, ffi::UCS_OK, "nsh_batch refused {n} operations");
        for (p, &i) in posted[..n].iter().zip(&which[..n]) {
            let op = batch.op_mut(i);
            let (kind, addr, len) = (op.kind(), op.addr(), op.len());
            let r = if p.status == ffi::UCS_OK {
                self.stats
                    .record(kind, self.locality(addr.node), len as u64);
                Ok(if kind == OpKind::Cas { p.result } else { 0 })
            } else {
                Err(self.fail(addr.node, p.status, op_name(kind)))
            };
            batch.complete(i, r);
        }
    }
}

impl UcxEndpoint {
    /// End every posted operation to `node` before its endpoint goes (failed, replaced): the
    /// endpoint is force-closed, which completes them with an error, and their results wait in
    /// `settled` for the next poll. The shim's requests then no longer name the endpoint.
    fn settle_posted_to(&mut self, node: NodeId, why: &str) {
        if !self.posted.iter().any(|p| p.node == node) {
            return;
        }
        let worker = self.conn.worker().raw();
        if let Some(p) = self.posted.iter().find(|p| p.node == node) {
            // SAFETY: the endpoint is live: it is destroyed only after this settles.
            unsafe {
                ffi::nsh_ep_fail(
                    worker,
                    p.p.op.ep,
                    ffi::UCS_ERR_NOT_CONNECTED,
                    self.timeout_ns,
                )
            };
        }
        let deadline = nessie_fabric::monotonic_ns() + self.timeout_ns;
        while self.posted.iter().any(|p| p.node == node) {
            self.conn.worker().progress();
            let mut i = 0;
            while i < self.posted.len() {
                if self.posted[i].node != node {
                    i += 1;
                    continue;
                }
                // SAFETY: boxed, live until it reports a final status.
                let st = unsafe { ffi::nsh_posted_test(&mut *self.posted[i].p) };
                if st == ffi::UCS_INPROGRESS {
                    i += 1;
                    continue;
                }
                let p = self.posted.swap_remove(i);
                let reason = format!("{} failed: {why}", op_name(p.kind));
                self.settled
                    .push((p.token, Err(FabricError::Unreachable { node, reason })));
            }
            if nessie_fabric::monotonic_ns() > deadline {
                eprintln!(
                    "nessie-fabric-ucx: a request survived a forced endpoint close; aborting \
                     rather than letting UCX write into memory no longer the caller's"
                );
                std::process::abort();
            }
        }
    }

    /// The result of posted operation `kind` to `node` that ended with `status`.
    fn posted_result(
        &mut self,
        kind: OpKind,
        node: NodeId,
        len: usize,
        status: c_int,
        found: u64,
    ) -> PostResult {
        if status != ffi::UCS_OK {
            return Err(self.fail(node, status, op_name(kind)));
        }
        self.stats.record(kind, self.locality(node), len as u64);
        Ok(if kind == OpKind::Cas { found } else { 0 })
    }
}

/// Posted operations still in flight are settled before the endpoint's UCX objects go: their
/// buffers are their posters', which may outlive the endpoint only by a moment (a pipeline
/// unwinding), and a request must not complete into them after.
impl Drop for UcxEndpoint {
    fn drop(&mut self) {
        while let Some(node) = self.posted.first().map(|p| p.node) {
            self.settle_posted_to(node, "the endpoint was dropped");
        }
    }
}

/// Natively: a posted operation is one nbx call (a WRITE's followed by a flush of its
/// endpoint once it completed locally), tested by later polls. Operations that bypass UCX (own
/// memory, mapped peers) finish at once, as in a batch.
impl Post for UcxEndpoint {
    unsafe fn post(&mut self, op: &mut BatchOp<'_>, token: PostToken) -> Option<PostResult> {
        assert!(
            self.posted.len() < MAX_POSTED,
            "more than {MAX_POSTED} operations posted"
        );
        self.refresh_peers();
        if let Some(r) = self.direct_batch_op(op) {
            return Some(r);
        }
        let (kind, node, len) = (op.kind(), op.addr().node, op.len());
        let op = match self.ucx_op(op) {
            Ok(op) => op,
            Err(r) => return Some(r),
        };
        let mut p = Box::new(ffi::NshPosted {
            op,
            q: ffi::NshPending {
                req: std::ptr::null_mut(),
                user_mem: std::ptr::null_mut(),
                ep: std::ptr::null_mut(),
                status: 0,
            },
            flushing: 0,
        });
        let worker = self.conn.worker().raw();
        // SAFETY: the endpoint and rkey are live (held by `self.conn`; an operation in flight
        // is settled before either goes, `settle_posted_to`); the buffer is the caller's until
        // the operation is reported (the contract of `Post::post`); `p` is boxed and kept.
        let st = unsafe { ffi::nsh_post(worker, &mut *p) };
        if st != ffi::UCS_INPROGRESS {
            return Some(self.posted_result(kind, node, len, st, p.op.result));
        }
        self.posted.push(Posted {
            p,
            token,
            node,
            kind,
            deadline_ns: nessie_fabric::monotonic_ns() + self.timeout_ns,
            forced: false,
        });
        None
    }

    fn poll_posted(&mut self, done: &mut dyn FnMut(PostToken, PostResult)) -> usize {
        let mut n = 0;
        for (t, r) in self.settled.drain(..) {
            done(t, r);
            n += 1;
        }
        if self.posted.is_empty() {
            return n;
        }
        self.conn.worker().progress();
        let mut now = None;
        let mut i = 0;
        while i < self.posted.len() {
            // SAFETY: boxed, live until it reports a final status.
            let st = unsafe { ffi::nsh_posted_test(&mut *self.posted[i].p) };
            if st == ffi::UCS_INPROGRESS {
                let t = *now.get_or_insert_with(nessie_fabric::monotonic_ns);
                let p = &mut self.posted[i];
                if t > p.deadline_ns && p.forced {
                    eprintln!(
                        "nessie-fabric-ucx: a request survived a forced endpoint close; \
                         aborting rather than letting UCX write into memory no longer the caller's"
                    );
                    std::process::abort();
                }
                if t > p.deadline_ns {
                    // Force-close its endpoint: it (and the endpoint's others) complete with an
                    // error, reported as a timeout below.
                    p.forced = true;
                    let worker = self.conn.worker().raw();
                    // SAFETY: the endpoint is live (module invariant above).
                    unsafe {
                        ffi::nsh_ep_fail(worker, p.p.op.ep, ffi::UCS_ERR_TIMED_OUT, self.timeout_ns)
                    };
                    // The close itself may take up to a timeout: the grace counts from its end.
                    p.deadline_ns = nessie_fabric::monotonic_ns() + self.timeout_ns;
                }
                i += 1;
                continue;
            }
            let p = self.posted.swap_remove(i);
            let st = match p.forced {
                true => ffi::UCS_ERR_TIMED_OUT,
                false => st,
            };
            let len = p.p.op.len;
            let r = self.posted_result(p.kind, p.node, len, st, p.p.op.result);
            done(p.token, r);
            n += 1;
        }
        for (t, r) in self.settled.drain(..) {
            done(t, r);
            n += 1;
        }
        if n > 0 {
            self.idle_since = None;
        }
        n
    }

    fn posted_in_flight(&self) -> usize {
        self.posted.len() + self.settled.len()
    }

    /// As a blocking wait does (`UcxConfig::wait_spin`): spin while the idle time is short,
    /// then sleep on the worker's event fd until an event (or a millisecond) — over tcp the
    /// answers need the peers' progress threads, which a spinning client would starve of CPU.
    fn posted_idle(&mut self) {
        let block_after = block_after_ns(&self.shared.config);
        if block_after == 0 || self.posted.is_empty() {
            return std::hint::spin_loop();
        }
        let now = nessie_fabric::monotonic_ns();
        let since = *self.idle_since.get_or_insert(now);
        if now - since < block_after {
            return std::hint::spin_loop();
        }
        let worker = self.conn.worker();
        let (Ok(fd), Ok(true)) = (worker.event_fd(), worker.arm()) else {
            return;
        };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the result only says whether it woke early.
        unsafe { libc::poll(&mut pfd, 1, 1) };
    }
}

impl Endpoint for UcxEndpoint {
    fn node(&self) -> NodeId {
        self.shared.node
    }

    fn node_count(&self) -> usize {
        self.peers.len()
    }

    fn read(&mut self, addr: RemoteAddr, buf: &mut [u8]) -> Result<(), FabricError> {
        let len = buf.len();
        if let Some(r) = self.direct(OpKind::Read, addr, len, |m| m.read(addr.offset, buf)) {
            return r;
        }
        let ptr = buf.as_mut_ptr();
        self.run(OpKind::Read, addr, len, |w, ep, rkey, raddr, t| {
            // SAFETY: buf is valid for len bytes until the call returns; the shim does not
            // return while UCX may still write into it.
            unsafe { ffi::nsh_get(w.raw(), ep, ptr as *mut _, len, raddr, rkey, t) }
        })
    }

    fn write(&mut self, addr: RemoteAddr, buf: &[u8]) -> Result<(), FabricError> {
        let len = buf.len();
        if let Some(r) = self.direct(OpKind::Write, addr, len, |m| m.write(addr.offset, buf)) {
            return r;
        }
        let ptr = buf.as_ptr();
        self.run(OpKind::Write, addr, len, |w, ep, rkey, raddr, t| {
            // SAFETY: as for read; the put is flushed (remotely complete) before returning.
            unsafe { ffi::nsh_put(w.raw(), ep, ptr as *const _, len, raddr, rkey, t) }
        })
    }

    fn compare_and_swap(
        &mut self,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        let cas = |m: &WordMemory| m.compare_and_swap(addr.offset, expected, desired);
        if let Some(r) = self.direct(OpKind::Cas, addr, 8, cas) {
            return r;
        }
        let mut old = 0u64;
        let out = &mut old as *mut u64;
        self.run(OpKind::Cas, addr, 8, |w, ep, rkey, raddr, t| {
            // SAFETY: out is valid until the call returns.
            unsafe { ffi::nsh_cswap64(w.raw(), ep, expected, desired, raddr, rkey, t, out) }
        })?;
        Ok(old)
    }

    /// Natively: the batch runs in waves of operations that do not conflict (overlapping
    /// ones stay in batch order, `Batch::wave_end`); a wave's operations through UCX are all
    /// posted (`ucp_get_nbx`, `ucp_put_nbx`, `ucp_atomic_op_nbx`) before one progress loop
    /// waits for them together, so they share round trips. Operations that bypass UCX (own
    /// memory, mapped peers) are performed when their turn comes in the wave.
    fn run_batch(&mut self, batch: &mut Batch<'_>) {
        let mut start = 0;
        while start < batch.len() {
            let end = batch.wave_end(start);
            self.run_wave(batch, start..end);
            start = end;
        }
        debug_assert!(batch.is_complete());
    }

    /// Whether callers should batch READs they may not need (a GET's candidates). Only with
    /// `Transport::Auto`, i.e. RDMA verbs where the host has them: there the NIC serves a
    /// READ without the target's CPU, so the extra READs are nearly free and the batch saves
    /// a round trip whenever the pass would have gone past the first candidate. Not over tcp:
    /// each READ is emulated by the target's progress thread, and measured on a shared
    /// 2-core host (docs/fabric.md, "Batches") the extra READs (3.4 fabric operations per
    /// GET against 1.8) cost more than the round trips saved (GET throughput down by a
    /// quarter). Not over shm, where a READ is a CPU copy with nothing to overlap.
    /// `run_batch` itself is native on every transport.
    fn overlaps_batches(&self, _region: RegionId) -> bool {
        self.shared.config.transport == crate::Transport::Auto
    }

    fn local_read(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        let addr = RemoteAddr::new(self.shared.node, region, offset);
        direct_read(self.own_region(region)?, addr, buf, &self.stats)
    }

    fn local_prefetch(&self, region: RegionId, offset: u64, len: u64) {
        if let Ok(mem) = self.own_region(region) {
            mem.prefetch(offset, len)
        }
    }

    fn local_write(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &[u8],
    ) -> Result<(), FabricError> {
        let addr = RemoteAddr::new(self.shared.node, region, offset);
        direct_write(self.own_region(region)?, addr, buf, &self.stats)
    }

    fn now_ns(&self) -> u64 {
        nessie_fabric::wall_clock_ns()
    }

    fn mono_coarse_ns(&self) -> u64 {
        nessie_fabric::monotonic_coarse_ns()
    }

    fn coarse_lag_ns(&self) -> u64 {
        nessie_fabric::coarse_clock_lag_ns()
    }

    fn reads_are_local_copies(&self) -> bool {
        self.shared.config.transport == crate::Transport::Shm
    }

    fn sleep_ns(&mut self, ns: u64) {
        nessie_fabric::precise_sleep_ns(ns)
    }

    fn stats(&self) -> &StatsCell {
        &self.stats
    }
}
