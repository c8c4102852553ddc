//! Server threads of SD and HY (HERD-style): each polls the request slots it is responsible
//! for in its own node's memory, executes new requests locally, and WRITEs the response into
//! the client's response slot (directly when the client is on the same node).
//!
//! Execution is the client-driven protocol run *on the owner node* with the coupled index: the
//! server thread holds a [`CdClient`] of its own node whose view places every candidate ITE of
//! the key in this node's index table, so ITE accesses are loopback fabric operations and every
//! DTE access (and allocation) is local. Several server threads per node are safe because the
//! CD protocol is linearizable among any number of concurrent workers.
//!
//! Work is split statically, as in HERD: the request slot of client `(node c, local l)` is
//! served by thread `(c + l) % threads` of every node, so each slot has exactly one reader and
//! the response slot of each (client, node) pair has exactly one writer.
//!
//! The loop is written against [`Endpoint`] only, so any fabric backend can run it. It spins
//! on local memory (that is SD's cost: a polling core per server thread) unless an idle
//! back-off is configured, and stops when its stop flag is set.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use nessie_fabric::{Endpoint, NodeId, RemoteAddr};
use nessie_store::index::Placement;

use super::client::RpcShared;
use super::slots::{OpCode, Reply, SlotError, SlotLayout, REQUEST_REGION, RESPONSE_REGION};
#[cfg(any(test, feature = "testing"))]
use super::RpcMutations;
use nessie_protocols::cd::{CdClient, ClientStats};
use nessie_protocols::Error;

/// How a server thread behaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerOptions {
    /// After a sweep over its slots finds no request: `None` = poll again at once (pure
    /// spinning, as HERD/NessieSD do); `Some(0)` = yield the core first; `Some(ns)` = sleep
    /// `ns` (through the endpoint, so it is virtual time in a simulator). For tests on
    /// machines with fewer cores than threads.
    pub idle_backoff_ns: Option<u64>,
    /// Test-only protocol breakages.
    #[cfg(any(test, feature = "testing"))]
    pub mutations: RpcMutations,
}

/// Live counters of one server thread (single writer: the thread; readable from anywhere).
#[derive(Debug, Default)]
pub struct ServerStats {
    requests: AtomicU64,
    gets: AtomicU64,
    puts: AtomicU64,
    deletes: AtomicU64,
    errors: AtomicU64,
    malformed: AtomicU64,
    landing: AtomicU64,
    sweeps: AtomicU64,
    idle_sweeps: AtomicU64,
    busy_ns: AtomicU64,
    idle_ns: AtomicU64,
    /// Mirror of the executing CdClient's counters, one per [`MIRRORED`] field.
    exec: [AtomicU64; MIRRORED.len()],
}

/// The executing CdClient's counters a server mirrors. Its gets, puts and deletes are the
/// server's own.
const MIRRORED: [fn(&mut ClientStats) -> &mut u64; 10] = [
    |s| &mut s.concurrent_aborts,
    |s| &mut s.timeouts,
    |s| &mut s.retries,
    |s| &mut s.migrations,
    |s| &mut s.recursive_migrations,
    |s| &mut s.previous_version_hits,
    |s| &mut s.recycled,
    |s| &mut s.leaked,
    |s| &mut s.rolled_forward,
    |s| &mut s.table_full_waits,
];

fn bump(a: &AtomicU64, by: u64) {
    a.store(a.load(Relaxed) + by, Relaxed);
}

/// A snapshot of server counters (one thread's, or summed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStatsSnapshot {
    /// Requests executed and answered.
    pub requests: u64,
    pub gets: u64,
    pub puts: u64,
    pub deletes: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Requests that could not be decoded (answered with `Error::Corrupt`).
    pub malformed: u64,
    /// Times a new request's control word was seen before the rest of it had landed.
    pub landing: u64,
    /// Passes over the thread's request slots.
    pub sweeps: u64,
    /// Sweeps that found no request.
    pub idle_sweeps: u64,
    /// Time spent in sweeps that served at least one request.
    pub busy_ns: u64,
    /// Time spent in sweeps that found nothing (including idle back-off).
    pub idle_ns: u64,
    /// The executing client-driven workers' counters (aborts, retries, migrations, ...).
    pub exec: ClientStats,
}

impl ServerStatsSnapshot {
    pub fn add(&mut self, o: &ServerStatsSnapshot) {
        add_counters!(self, o: requests, gets, puts, deletes, errors, malformed, landing,
            sweeps, idle_sweeps, busy_ns, idle_ns);
        self.exec += o.exec;
    }
}

impl ServerStats {
    pub fn snapshot(&self) -> ServerStatsSnapshot {
        let l = |a: &AtomicU64| a.load(Relaxed);
        let (gets, puts, deletes) = (l(&self.gets), l(&self.puts), l(&self.deletes));
        let mut exec = ClientStats {
            gets,
            puts,
            deletes,
            ..ClientStats::default()
        };
        for (a, field) in self.exec.iter().zip(MIRRORED) {
            *field(&mut exec) = l(a);
        }
        ServerStatsSnapshot {
            requests: l(&self.requests),
            gets,
            puts,
            deletes,
            errors: l(&self.errors),
            malformed: l(&self.malformed),
            landing: l(&self.landing),
            sweeps: l(&self.sweeps),
            idle_sweeps: l(&self.idle_sweeps),
            busy_ns: l(&self.busy_ns),
            idle_ns: l(&self.idle_ns),
            exec,
        }
    }

    fn mirror(&self, s: &ClientStats) {
        let mut s = *s;
        for (a, field) in self.exec.iter().zip(MIRRORED) {
            a.store(*field(&mut s), Relaxed);
        }
    }
}

/// One request slot this thread serves.
#[derive(Debug)]
struct Served {
    /// Offset of the slot in the request region.
    offset: u64,
    client_node: NodeId,
    client_local: u16,
    /// Sequence number of the last request served from the slot.
    last_seq: u64,
}

/// What executes the requests a server thread receives, on the server's node: the
/// client-driven protocol over the coupled index (SD, HY: a [`CdClient`]), or Pilaf's store
/// (`crate::pilaf::PilafExecutor`).
pub trait Execute: Send {
    /// The node it executes on.
    fn node(&self) -> NodeId;
    /// Refuse a configuration the server cannot run with.
    fn check(&self) -> Result<(), Error> {
        Ok(())
    }
    fn execute(&mut self, op: OpCode, key: &[u8], value: &[u8]) -> Reply;
    /// Its counters, mirrored into the server's.
    fn exec_stats(&self) -> ClientStats;
}

impl<E: Endpoint> Execute for CdClient<E> {
    fn node(&self) -> NodeId {
        CdClient::node(self)
    }

    fn check(&self) -> Result<(), Error> {
        if self.view().index.placement != Placement::Coupled {
            return Err(Error::Config(
                "server threads execute with the coupled index (see ClusterView::coupled)".into(),
            ));
        }
        Ok(())
    }

    fn execute(&mut self, op: OpCode, key: &[u8], value: &[u8]) -> Reply {
        match op {
            OpCode::Get => self.get(key),
            OpCode::Put => self.put(key, value).map(|()| None),
            OpCode::Delete => self.delete(key).map(|()| None),
        }
    }

    fn exec_stats(&self) -> ClientStats {
        self.stats()
    }
}

/// A server thread's loop, whatever its executor: runs until the stop flag is set.
pub type ServerLoop = Box<dyn FnMut(&AtomicBool) + Send>;

/// One server thread of a node.
pub struct Server<E: Endpoint, X: Execute = CdClient<E>> {
    /// Executes operations: by default the client-driven protocol on this node, coupled index.
    exec: X,
    /// Polls request slots and writes responses (kept apart from `exec` so the protocol's
    /// fabric counters are not drowned in polls).
    io: E,
    shared: Arc<RpcShared>,
    slots: Vec<Served>,
    /// The byte ranges of those slots, for idle polls.
    watched: Vec<std::ops::Range<u64>>,
    opts: ServerOptions,
    stats: Arc<ServerStats>,
    body: Vec<u8>,
    out: Vec<u8>,
}

impl<E: Endpoint, X: Execute> Server<E, X> {
    /// Server thread `thread` of `threads` on `exec`'s node. `io` must be another endpoint of
    /// the same node; a `CdClient` executor must use the coupled index.
    pub fn new(
        exec: X,
        io: E,
        shared: Arc<RpcShared>,
        thread: u16,
        threads: u16,
        opts: ServerOptions,
    ) -> Result<Self, Error> {
        exec.check()?;
        if io.node() != exec.node() {
            return Err(Error::Config(format!(
                "server I/O endpoint on node {} but executor on node {}",
                io.node(),
                exec.node()
            )));
        }
        if threads == 0 || thread >= threads {
            return Err(Error::Config(format!(
                "server thread {thread} of {threads}"
            )));
        }
        let l = shared.layout;
        if io.node_count() != l.nodes as usize {
            return Err(Error::Config(format!(
                "fabric has {} nodes, slots laid out for {}",
                io.node_count(),
                l.nodes
            )));
        }
        let slots = (0..l.clients())
            .filter_map(|i| {
                let (c, local) = l.client_of(i);
                ((c as u32 + local as u32) % threads as u32 == thread as u32).then_some(Served {
                    offset: l.request_offset(i),
                    client_node: c,
                    client_local: local,
                    last_seq: 0,
                })
            })
            .collect::<Vec<Served>>();
        let watched = slots
            .iter()
            .map(|s| s.offset..s.offset + l.request_slot)
            .collect();
        Ok(Self {
            exec,
            io,
            shared,
            slots,
            watched,
            opts,
            stats: Arc::default(),
            body: Vec::new(),
            out: Vec::new(),
        })
    }

    /// This thread's counters (shared; keep a clone to read them while the thread runs).
    pub fn stats(&self) -> Arc<ServerStats> {
        self.stats.clone()
    }

    pub fn node(&self) -> NodeId {
        self.io.node()
    }

    /// The executing worker (its counters, its endpoint's fabric counters).
    pub fn executor(&self) -> &X {
        &self.exec
    }

    /// The executing worker, mutably (e.g. to install a test hook).
    pub fn executor_mut(&mut self) -> &mut X {
        &mut self.exec
    }

    /// This server as a loop to run on its thread.
    pub fn into_loop(mut self) -> ServerLoop
    where
        E: 'static,
        X: 'static,
    {
        Box::new(move |stop| self.run(stop))
    }

    /// Poll until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) {
        let mut last = self.io.mono_ns();
        while !stop.load(std::sync::atomic::Ordering::Acquire) {
            let served = self.sweep();
            let now = self.io.mono_ns();
            let spent = now.saturating_sub(last);
            last = now;
            bump(&self.stats.sweeps, 1);
            if served > 0 {
                bump(&self.stats.busy_ns, spent);
                continue;
            }
            bump(&self.stats.idle_ns, spent);
            bump(&self.stats.idle_sweeps, 1);
            match self.opts.idle_backoff_ns {
                None => self.io.idle_poll(REQUEST_REGION, &self.watched),
                Some(0) => std::thread::yield_now(),
                Some(ns) => self.io.sleep_ns(ns),
            }
        }
    }

    /// One pass over this thread's request slots, serving every new request; returns how many
    /// were served.
    pub fn sweep(&mut self) -> usize {
        let mut served = 0;
        for i in 0..self.slots.len() {
            match self.serve_slot(i) {
                Ok(true) => served += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(node = self.io.node(), %e, "server could not serve a request slot")
                }
            }
        }
        served
    }

    fn serve_slot(&mut self, i: usize) -> Result<bool, Error> {
        let l = self.shared.layout;
        let base = self.slots[i].offset;
        let mut w = [0u8; 8];
        self.io
            .local_read(REQUEST_REGION, base + l.request_ctrl_offset(), &mut w)?;
        let Some((seq, op)) = SlotLayout::parse_request_ctrl(u64::from_le_bytes(w)) else {
            return Ok(false);
        };
        if seq == self.slots[i].last_seq {
            return Ok(false);
        }
        // A new control word; the rest of the request is read after it and accepted only if
        // its checksum matches (otherwise the client's WRITE is still landing: next sweep).
        let reply = match self.read_request(base, seq, op) {
            Ok(None) => {
                bump(&self.stats.landing, 1);
                return Ok(false);
            }
            Ok(Some((op, k, v))) => {
                self.slots[i].last_seq = seq;
                if mutated!(self.opts, reply_before_execute) && op != OpCode::Get {
                    // Broken on purpose: acknowledge the write before it has happened.
                    self.respond(i, seq, &Ok(None))?;
                    let _ = self.execute(op, k, v);
                    return Ok(true);
                }
                self.execute(op, k, v)
            }
            Err(m) => {
                self.slots[i].last_seq = seq;
                bump(&self.stats.malformed, 1);
                Err(Error::Corrupt(m.to_string()))
            }
        };
        self.respond(i, seq, &reply)?;
        Ok(true)
    }

    /// Read lengths, checksum and body of request `seq` at `base` (body into `self.body`).
    /// `Ok(None)` if it has not fully landed yet.
    fn read_request(
        &mut self,
        base: u64,
        seq: u64,
        op: u8,
    ) -> Result<Option<(OpCode, usize, usize)>, SlotError> {
        let l = self.shared.layout;
        let op = OpCode::from_u8(op).ok_or(SlotError::UnknownOp(op))?;
        let mut meta = [0u8; 16];
        self.io
            .local_read(REQUEST_REGION, base + l.request_meta_offset(), &mut meta)?;
        let (k, v) = l.parse_request_lens(&meta)?;
        let (off, len) = l.request_body(k, v);
        self.body.resize(len, 0);
        self.io
            .local_read(REQUEST_REGION, base + off, &mut self.body)?;
        if !SlotLayout::request_complete(seq, &self.body, &meta) {
            return Ok(None);
        }
        Ok(Some((op, k, v)))
    }

    /// Run the operation in `self.body` with the executor on this node.
    fn execute(&mut self, op: OpCode, k: usize, v: usize) -> Reply {
        let (key, value) = SlotLayout::split_body(&self.body, k, v);
        bump(
            match op {
                OpCode::Get => &self.stats.gets,
                OpCode::Put => &self.stats.puts,
                OpCode::Delete => &self.stats.deletes,
            },
            1,
        );
        let r = self.exec.execute(op, key, value);
        self.stats.mirror(&self.exec.exec_stats());
        r
    }

    /// WRITE the reply into the response slot of the client of slot `i`.
    fn respond(&mut self, i: usize, seq: u64, reply: &Reply) -> Result<(), Error> {
        let l = self.shared.layout;
        let s = &self.slots[i];
        let at = l.encode_response(&mut self.out, seq, reply);
        let off = l.response_offset(s.client_local, self.io.node()) + at;
        if s.client_node == self.io.node() {
            self.io.local_write(RESPONSE_REGION, off, &self.out)?;
        } else {
            self.io.write(
                RemoteAddr::new(s.client_node, RESPONSE_REGION, off),
                &self.out,
            )?;
        }
        bump(&self.stats.requests, 1);
        if reply.is_err() {
            bump(&self.stats.errors, 1);
        }
        Ok(())
    }
}
