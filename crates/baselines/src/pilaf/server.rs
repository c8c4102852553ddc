//! The Pilaf server side: one [`PilafStore`] per node holds the allocator and carries out PUT
//! and DELETE in the node's own memory; [`PilafExecutor`] plugs it into the server threads of
//! the server-driven baseline (`sd::Server`), which poll the request slots and answer.
//!
//! Writes are ordered so that a client READing at any moment finds each key at one or two
//! places, never zero, and never an entry whose extent is not complete:
//! - a PUT writes the new extent first, then the entry that points to it (an update
//!   overwrites the key's entry in place), then frees the old extent;
//! - a cuckoo insert moves entries from the *last* key of the chain backwards: the last
//!   key is copied into the empty slot first (now at two places), then the one before it over
//!   the last key's old slot, and so on; the new key's entry goes last into the slot freed at
//!   the head of the chain. The table's move sequence word is odd while a chain is carried
//!   out, so that a client that found a key nowhere can tell whether keys moved under it;
//! - a DELETE zeroes the entry, then frees the extent.
//!
//! Server threads of a node share one store behind a lock: Pilaf's server is the only writer of
//! its memory and executes writes one at a time. After its writes and before the response is
//! sent, a memory fence makes them visible (the response is a fabric WRITE after it).

use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex};

use nessie_fabric::{Endpoint, NodeId};

use super::alloc::{AllocError, AllocStats, ExtentAlloc};
use super::layout::{
    self, candidates, crc64, decode_extent, encode_extent, entry_offset, key_hash, Entry, Slot,
    ENTRY_BYTES, EXTENT_REGION, MOVE_SEQ_OFFSET, TABLE_REGION, WAYS,
};
use super::PilafParams;
use crate::sd::server::Execute;
use crate::sd::slots::{OpCode, Reply};
use nessie_protocols::cd::ClientStats;
use nessie_protocols::Error;

/// Longest chain of cuckoo moves one insert may make.
pub const MAX_CUCKOO_PATH: usize = 16;
/// Most entries one insert's search for a free slot may look at.
pub const MAX_CUCKOO_SEARCH: usize = 1024;

/// Counters of a store (all its server threads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub puts: u64,
    pub updates: u64,
    pub deletes: u64,
    /// Entries moved by cuckoo inserts.
    pub moves: u64,
    /// Inserts that needed at least one move.
    pub chains: u64,
    /// Inserts refused because no free slot was within reach.
    pub index_full: u64,
    /// PUTs refused because the extent region had no block.
    pub region_full: u64,
    /// PUTs that waited for a freed block's reuse delay to pass.
    pub region_waits: u64,
    pub alloc: AllocStats,
}

struct State {
    alloc: ExtentAlloc,
    move_seq: u64,
    stats: StoreStats,
    buf: Vec<u8>,
}

/// One node's Pilaf table and extents (their server-side state; the memory is the node's
/// [`TABLE_REGION`] and [`EXTENT_REGION`]).
pub struct PilafStore {
    node: NodeId,
    params: PilafParams,
    state: Mutex<State>,
}

impl PilafStore {
    pub fn new(node: NodeId, params: PilafParams) -> Result<Arc<Self>, Error> {
        let alloc = ExtentAlloc::new(
            params.extent_bytes,
            params.max_extent(),
            params.reuse_delay_ns,
        )
        .ok_or_else(|| Error::Config("extent sizes need too many size classes".into()))?;
        Ok(Arc::new(Self {
            node,
            params,
            state: Mutex::new(State {
                alloc,
                move_seq: 0,
                stats: StoreStats::default(),
                buf: Vec::new(),
            }),
        }))
    }

    pub fn stats(&self) -> StoreStats {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        StoreStats {
            alloc: s.alloc.stats(),
            ..s.stats
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Execute `op` in this node's memory through `ep` (an endpoint of this node).
    pub fn execute<E: Endpoint>(&self, ep: &mut E, op: OpCode, key: &[u8], value: &[u8]) -> Reply {
        self.execute_counted(ep, op, key, value).0
    }

    /// [`Self::execute`], and how many entries it moved.
    fn execute_counted<E: Endpoint>(
        &self,
        ep: &mut E,
        op: OpCode,
        key: &[u8],
        value: &[u8],
    ) -> (Reply, u64) {
        let mut st = self.lock();
        let moves = st.stats.moves;
        let mut w = Writer {
            ep,
            st: &mut st,
            params: &self.params,
            node: self.node,
        };
        let r = match op {
            OpCode::Get => w.get(key),
            OpCode::Put => w.put(key, value).map(|()| None),
            OpCode::Delete => w.delete(key).map(|()| None),
        };
        // Everything written is visible before the caller sends the response.
        fence(Ordering::SeqCst);
        let moved = st.stats.moves - moves;
        (r, moved)
    }
}

/// One operation's access to the store, under its lock.
struct Writer<'a, E> {
    ep: &'a mut E,
    st: &'a mut State,
    params: &'a PilafParams,
    node: NodeId,
}

impl<E: Endpoint> Writer<'_, E> {
    fn read_entry(&mut self, i: u64) -> Result<Slot, Error> {
        let mut b = [0u8; ENTRY_BYTES as usize];
        self.ep.local_read(TABLE_REGION, entry_offset(i), &mut b)?;
        match Entry::decode(&b, true) {
            // Only this store writes the table, under the lock: its own reads are never torn.
            Slot::Torn => Err(Error::Corrupt(format!("pilaf entry {i} fails its CRC"))),
            s => Ok(s),
        }
    }

    fn write_entry(&mut self, i: u64, e: Option<&Entry>) -> Result<(), Error> {
        let bytes = e.map_or([0u8; ENTRY_BYTES as usize], Entry::encode);
        Ok(self.ep.local_write(TABLE_REGION, entry_offset(i), &bytes)?)
    }

    fn write_move_seq(&mut self) -> Result<(), Error> {
        self.st.move_seq += 1;
        let w = self.st.move_seq.to_le_bytes();
        Ok(self.ep.local_write(TABLE_REGION, MOVE_SEQ_OFFSET, &w)?)
    }

    /// Whether `e` is the entry of `key` (its extent holds that key).
    fn holds(&mut self, e: &Entry, key: &[u8]) -> Result<bool, Error> {
        self.st.buf.resize(e.size as usize, 0);
        self.ep
            .local_read(EXTENT_REGION, e.offset, &mut self.st.buf)?;
        let x = decode_extent(&self.st.buf).map_err(|b| Error::Corrupt(b.to_string()))?;
        Ok(x.key == key)
    }

    /// The slot and entry of `key`, if present; the candidates and their contents.
    #[allow(clippy::type_complexity)]
    fn find(&mut self, key: &[u8]) -> Result<(Option<(u64, Entry)>, [(u64, Slot); WAYS]), Error> {
        let h = key_hash(key);
        let cands = candidates(h, self.params.entries);
        let mut slots = [(0, Slot::Empty); WAYS];
        let mut found = None;
        for (n, &c) in cands.iter().enumerate() {
            slots[n] = (c, self.read_entry(c)?);
            if let (None, Slot::Used(e)) = (found, slots[n].1) {
                if e.key_hash == h && self.holds(&e, key)? {
                    found = Some((c, e));
                }
            }
        }
        Ok((found, slots))
    }

    fn get(&mut self, key: &[u8]) -> Reply {
        let Some((_, e)) = self.find(key)?.0 else {
            return Ok(None);
        };
        self.st.buf.resize(e.size as usize, 0);
        self.ep
            .local_read(EXTENT_REGION, e.offset, &mut self.st.buf)?;
        let x = decode_extent(&self.st.buf).map_err(|b| Error::Corrupt(b.to_string()))?;
        Ok(Some(x.value.to_vec()))
    }

    /// A block for an extent of `size` bytes. With none free but one of its class waiting out
    /// its reuse delay, wait for that one (at most the delay; the node's writes wait with it,
    /// as a server out of memory would make them), then try once more.
    fn alloc(&mut self, size: u64) -> Result<u64, AllocError> {
        let now = self.ep.mono_ns();
        match self.st.alloc.alloc(size, now) {
            Err(AllocError::Full { .. }) => {
                let Some(due) = self.st.alloc.next_due(size) else {
                    return self.st.alloc.alloc(size, now);
                };
                self.st.stats.region_waits += 1;
                let wait = due.saturating_sub(now).min(self.params.reuse_delay_ns);
                self.ep.sleep_ns(wait);
                let now = self.ep.mono_ns();
                self.st.alloc.alloc(size, now)
            }
            r => r,
        }
    }

    /// Allocate and write the extent of `key` and `value`: the entry that will point to it.
    fn write_extent(&mut self, key: &[u8], value: &[u8]) -> Result<Entry, Error> {
        let size = layout::extent_size(key.len(), value.len());
        let offset = self.alloc(size).map_err(|e| match e {
            AllocError::Full {
                block,
                awaiting_reuse,
                ..
            } => {
                self.st.stats.region_full += 1;
                Error::DataTableFull {
                    node: self.node,
                    entry_size: block,
                    awaiting_expiry: awaiting_reuse,
                }
            }
            e => Error::Config(e.to_string()),
        })?;
        let mut buf = std::mem::take(&mut self.st.buf);
        encode_extent(&mut buf, key, value);
        let r = self.store_extent(offset, &buf);
        let entry = Entry {
            key_hash: key_hash(key),
            offset,
            size,
            extent_crc: crc64(&buf),
        };
        self.st.buf = buf;
        r.map(|()| entry)
    }

    fn store_extent(&mut self, offset: u64, bytes: &[u8]) -> Result<(), Error> {
        #[cfg(any(test, feature = "testing"))]
        if self.params.testing.tail_first_extent_writes && bytes.len() > 8 {
            // Adversarial but allowed (a WRITE's words land in no set order): the tail first,
            // a yield, then the head, so that a reader of a reused block meets a torn extent.
            let half = bytes.len() / 16 * 8;
            self.ep
                .local_write(EXTENT_REGION, offset + half as u64, &bytes[half..])?;
            std::thread::yield_now();
            return Ok(self.ep.local_write(EXTENT_REGION, offset, &bytes[..half])?);
        }
        Ok(self.ep.local_write(EXTENT_REGION, offset, bytes)?)
    }

    fn free_extent(&mut self, e: &Entry) {
        let now = self.ep.mono_ns();
        self.st.alloc.free(e.offset, e.size, now);
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let (found, slots) = self.find(key)?;
        self.st.stats.puts += 1;
        if let Some((i, old)) = found {
            let e = self.write_extent(key, value)?;
            self.write_entry(i, Some(&e))?;
            self.free_extent(&old);
            self.st.stats.updates += 1;
            return Ok(());
        }
        if let Some(&(i, _)) = slots.iter().find(|s| s.1 == Slot::Empty) {
            let e = self.write_extent(key, value)?;
            return self.write_entry(i, Some(&e));
        }
        let Some(path) = self.cuckoo_path(&slots)? else {
            self.st.stats.index_full += 1;
            return Err(Error::IndexFull {
                depth: MAX_CUCKOO_PATH as u8,
            });
        };
        // The extent first: a full region must leave the table untouched.
        let e = self.write_extent(key, value)?;
        self.move_chain(&path)?;
        self.write_entry(path[0], Some(&e))?;
        self.write_move_seq()
    }

    /// Carry out the moves along `path` (slot 0 is the new key's candidate, the last slot is
    /// empty) from the last backwards, each entry copied before its old slot is overwritten.
    /// Leaves the move sequence odd; the caller fills `path[0]` and makes it even.
    fn move_chain(&mut self, path: &[u64]) -> Result<(), Error> {
        self.write_move_seq()?;
        for k in (0..path.len() - 1).rev() {
            let Slot::Used(e) = self.read_entry(path[k])? else {
                return Err(Error::Corrupt("cuckoo path through an empty entry".into()));
            };
            self.write_entry(path[k + 1], Some(&e))?;
        }
        self.st.stats.moves += path.len() as u64 - 1;
        self.st.stats.chains += 1;
        Ok(())
    }

    /// A shortest chain of moves (breadth first) from one of the full candidates `slots` to an
    /// empty entry: the slots from the candidate to the empty one. `None` if there is none
    /// within [`MAX_CUCKOO_PATH`] moves and [`MAX_CUCKOO_SEARCH`] entries.
    fn cuckoo_path(&mut self, slots: &[(u64, Slot); WAYS]) -> Result<Option<Vec<u64>>, Error> {
        // (slot, index of the node it was reached from, moves so far)
        let mut nodes: Vec<(u64, usize, usize)> =
            slots.iter().map(|s| (s.0, usize::MAX, 0)).collect();
        let mut next = 0;
        while next < nodes.len() && nodes.len() < MAX_CUCKOO_SEARCH {
            let (slot, _, depth) = nodes[next];
            let Slot::Used(e) = self.read_entry(slot)? else {
                return Err(Error::Corrupt("cuckoo search met an empty entry".into()));
            };
            if depth < MAX_CUCKOO_PATH {
                for alt in candidates(e.key_hash, self.params.entries) {
                    if nodes.iter().any(|n| n.0 == alt) {
                        continue;
                    }
                    nodes.push((alt, next, depth + 1));
                    if self.read_entry(alt)? == Slot::Empty {
                        let mut path = vec![alt];
                        let mut at = next;
                        while at != usize::MAX {
                            path.push(nodes[at].0);
                            at = nodes[at].1;
                        }
                        path.reverse();
                        return Ok(Some(path));
                    }
                }
            }
            next += 1;
        }
        Ok(None)
    }

    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        let (found, _) = self.find(key)?;
        self.st.stats.deletes += 1;
        if let Some((i, old)) = found {
            self.write_entry(i, None)?;
            self.free_extent(&old);
        }
        Ok(())
    }
}

/// A server thread's executor in Pilaf mode: the node's shared store and this thread's
/// endpoint. Its counters are the thread's own operations.
pub struct PilafExecutor<E: Endpoint> {
    ep: E,
    store: Arc<PilafStore>,
    stats: ClientStats,
}

impl<E: Endpoint> PilafExecutor<E> {
    pub fn new(ep: E, store: Arc<PilafStore>) -> Result<Self, Error> {
        if ep.node() != store.node {
            return Err(Error::Config(format!(
                "pilaf executor on node {} for the store of node {}",
                ep.node(),
                store.node
            )));
        }
        Ok(Self {
            ep,
            store,
            stats: ClientStats::default(),
        })
    }

    pub fn store(&self) -> &Arc<PilafStore> {
        &self.store
    }
}

impl<E: Endpoint> Execute for PilafExecutor<E> {
    fn node(&self) -> NodeId {
        self.ep.node()
    }

    fn execute(&mut self, op: OpCode, key: &[u8], value: &[u8]) -> Reply {
        let (r, moved) = self.store.execute_counted(&mut self.ep, op, key, value);
        // Moves counted as migrations: the server-side counterpart of CD's MIGRATE.
        self.stats.migrations += moved;
        match op {
            OpCode::Get => self.stats.gets += 1,
            OpCode::Put => self.stats.puts += 1,
            OpCode::Delete => self.stats.deletes += 1,
        }
        r
    }

    fn exec_stats(&self) -> ClientStats {
        self.stats
    }
}
