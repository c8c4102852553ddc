//! The per-ITE handover (issue 42): an index partition moves from its chain of copies C to a
//! new chain C′ one entry at a time, by CAS, while every operation goes on. No pause: the
//! entry's own word says which chain holds it (`docs/protocol.md`, "The per-ITE handover").
//!
//! Before the move, every copy of C′ (each in an index slot) holds *pending* for every entry
//! (`IteLayout::pending`, F alone; [`Replicated::write_pending`]), and then the fence learns
//! that the partition migrates ([`crate::fence::Fence::start_migration`]). From then on, an
//! operation of a node that knows goes to C′ (`Part::Target`), and whoever meets a pending
//! word there **hands the entry over** ([`Replicated::hand_over`]):
//! 1. read the entry's word w at C; unless it is fenced already, CAS it at C from w to
//!    fenced(w) (F, the sequence moved on), again with the word found if that CAS fails;
//! 2. CAS C′ from pending to w itself (`IteLayout::handed_over` of the fenced word). A CAS
//!    that finds something else there lost to another hander, which did the same.
//!
//! The word comes over unchanged, so the handover is invisible to the protocol: a CAS that
//! expects w, from a read made before the fence, succeeds in C′ exactly when the entry has
//! not changed since, as if the partition had never moved. (A first version moved the
//! sequence on by two; the CAS then failed on an unchanged entry, and the protocol, taking the
//! failure for a concurrent write, linearized a DELETE before it and returned without deleting:
//! a stress run on CI found the key read back after an acknowledged DELETE.)
//!
//! Both are replicated CASes of their chains (decided at the decider, carried to every copy),
//! so each survives R − 1 failures as any commit does. The fencing CAS is the entry's
//! linearization point: before it, C holds the live word and C′ pending, which nobody commits
//! from; after it, C holds a fenced word, which nobody commits from either: an operation of a
//! node that has not heard of the move (it goes to C) finds its CAS failing on the fenced
//! word, or reads a fenced word, and waits until its view moves on
//! ([`Replicated::wait_moved_on`]), then goes to C′. The protocol above never sees a word with
//! F: reads hand over or wait before they return, and a CAS that finds F is made again at C′
//! once the entry is handed over (where it succeeds if the entry did not change).
//!
//! A background puller ([`Replicated::hand_over_partition`]) hands over every entry in order,
//! rate-limited; entries clients ask for are handed over first, by the clients. Once no word
//! is pending, the migration ends (`Fence::finish_migration`): C′ is the partition's chain.

use nessie_fabric::{Endpoint, FabricError, RemoteAddr};
use nessie_store::{Ite, PartitionId, INDEX_REGION};

use super::{Part, Replicated, RETRY_PAUSE_NS};
use crate::fence::IndexCopy;

/// Most rounds of fencing one entry at its old chain: each lost round lost to a writer there
/// (a node that had not heard of the move yet) or to another hander.
const MAX_FENCE_ROUNDS: u32 = 10_000;
/// Entries a puller reads and hands over per step.
const PULL_ENTRIES: u64 = 512;

/// What handing over a partition did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HandOver {
    /// Entries of the partition.
    pub entries: u64,
    /// Entries this puller installed in the new chain (clients handed over others, and some
    /// this puller met pending were installed by another hander meanwhile).
    pub handed: u64,
    /// How long it took, in nanoseconds.
    pub ns: u64,
}

impl<E: Endpoint> Replicated<E> {
    /// Whether `w` has the fence bit: pending at a migration's target, fenced at its source.
    fn marked(&self, w: u64) -> bool {
        self.set.ite.is_fence_marked(Ite(w))
    }

    /// READ of index entries: each run of entries with the same copies from its chain, never
    /// returning a word with F (see the module comment).
    pub(super) fn read_index(
        &mut self,
        addr: RemoteAddr,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        let end = addr.offset + buf.len() as u64;
        let mut at = addr.offset;
        let mut rounds = 0;
        while at < end {
            let a = RemoteAddr { offset: at, ..addr };
            let until = self.same_copies_until(a, end);
            let run = &mut buf[(at - addr.offset) as usize..(until - addr.offset) as usize];
            match self.read_index_run(a, run)? {
                true => at = until,
                false => {
                    rounds += 1;
                    if rounds >= MAX_FENCE_ROUNDS {
                        return Err(FabricError::Transport(format!(
                            "index entries at {a} stayed pending or fenced through {MAX_FENCE_ROUNDS} handovers"
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// One try at reading a run of entries `addr .. + buf.len()` that had the same copies:
    /// `false` if it must be read again (the entries were handed over, or a move began since
    /// the run was cut and it may span partitions whose copies differ now).
    fn read_index_run(&mut self, addr: RemoteAddr, buf: &mut [u8]) -> Result<bool, FabricError> {
        let part = self.part(addr);
        let end = addr.offset + buf.len() as u64;
        if self.same_copies_until(addr, end) < end {
            return Ok(false);
        }
        self.read_primary_in(part, addr, buf)?;
        if self.set.index_slots.is_none() {
            // No partition can move: no word has F.
            return Ok(true);
        }
        let marked: Vec<u64> = (0..buf.len() / 8)
            .filter(|w| {
                let b = &buf[w * 8..w * 8 + 8];
                self.marked(u64::from_le_bytes(b.try_into().unwrap()))
            })
            .map(|w| addr.offset + w as u64 * 8)
            .collect();
        let Some(&first) = marked.first() else {
            return Ok(true);
        };
        match part {
            Part::Target(q) => {
                for offset in marked {
                    self.hand_over(q, RemoteAddr { offset, ..addr })?;
                }
            }
            _ => self.wait_moved_on(
                RemoteAddr {
                    offset: first,
                    ..addr
                },
                part,
            )?,
        }
        Ok(false)
    }

    /// CAS of an index entry at its chain (see the module comment).
    pub(super) fn cas_index(
        &mut self,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        debug_assert!(!self.marked(expected) && !self.marked(desired));
        for _ in 0..MAX_FENCE_ROUNDS {
            let part = self.part(addr);
            let found = self.cas_ordered(part, addr, expected, desired)?;
            if !self.marked(found) {
                return Ok(found);
            }
            match part {
                Part::Target(q) => {
                    self.hand_over(q, addr)?;
                }
                _ => self.wait_moved_on(addr, part)?,
            }
        }
        Err(FabricError::Transport(format!(
            "index entry {addr} stayed pending or fenced through {MAX_FENCE_ROUNDS} handovers"
        )))
    }

    /// Hand index entry `addr` of partition `q` over from its chain to the chain it migrates
    /// to, unless that was done (see the module comment). Whether this call installed it.
    pub fn hand_over(&mut self, q: PartitionId, addr: RemoteAddr) -> Result<bool, FabricError> {
        let l = self.set.ite;
        if !self.fence.migrating(q) {
            // Ended since we met the pending word: the caller looks again (see
            // `Fence::finish_migration` for why no pending word is left by then).
            return Ok(false);
        }
        let (from, to) = (Part::Index(q), Part::Target(q));
        let mut w = self.read_word(from, addr)?;
        if mutated!(self.set, handover_without_fence) {
            // As if the old chain's word could be copied over without fencing it first.
            if self.marked(w) {
                return Ok(false);
            }
            let found = self.cas_ordered(to, addr, l.pending().0, w)?;
            return Ok(found == l.pending().0);
        }
        // 1. Fence the entry at the old chain's decider.
        let mut rounds = 0;
        let fenced = loop {
            if self.marked(w) {
                break w;
            }
            let f = l.fenced(Ite(w)).0;
            let found = self.cas_ordered(from, addr, w, f)?;
            if found == w {
                break f;
            }
            w = found;
            rounds += 1;
            if rounds >= MAX_FENCE_ROUNDS {
                return Err(FabricError::Transport(format!(
                    "index entry {addr} of partition {q} kept changing while it was fenced"
                )));
            }
        };
        // 2. The fence must be on the old chain's primary before the new chain takes a word
        // (a node that has not heard reads there): a fence found at the decider may not have
        // been carried yet by the hander that made it. A CAS from what the primary holds
        // loses to the fence at the decider and carries it (a loser helps the word it found).
        let mut on_primary = false;
        for _ in 0..MAX_FENCE_ROUNDS {
            let p = self.read_word(from, addr)?;
            if self.marked(p) {
                on_primary = true;
                break;
            }
            let _ = self.cas_ordered(from, addr, p, l.fenced(Ite(p)).0)?;
        }
        if !on_primary {
            return Err(FabricError::Transport(format!(
                "the fence of index entry {addr} of partition {q} did not reach its primary"
            )));
        }
        // 3. Install at the new chain.
        let live = l.handed_over(Ite(fenced)).0;
        let found = self.cas_ordered(to, addr, l.pending().0, live)?;
        Ok(found == l.pending().0)
    }

    /// The word at `addr` in `part`'s chain, read from its primary.
    fn read_word(&mut self, part: Part, addr: RemoteAddr) -> Result<u64, FabricError> {
        let mut b = [0u8; 8];
        self.read_primary_in(part, addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// A word at `part` (the chain this node's view names) is fenced: the entry moved to
    /// another chain, which our view does not know yet. Wait until it does (membership tells
    /// every node within its view's freshness, or the node stops), then the caller retries.
    fn wait_moved_on(&mut self, addr: RemoteAddr, part: Part) -> Result<(), FabricError> {
        let start = self.inner.mono_ns();
        loop {
            if self.part(addr) != part {
                return Ok(());
            }
            self.wait_fresh_view()?;
            if self.inner.mono_ns().saturating_sub(start) > self.set.unreachable_wait_ns {
                return Err(FabricError::Transport(format!(
                    "index entry {addr} was handed over to another chain, and this node's view \
                     still does not name it"
                )));
            }
            self.inner.sleep_ns(RETRY_PAUSE_NS);
        }
    }

    /// Write pending into every entry of partition `q` at each copy of the chain `to` (index
    /// slots), before the partition is said to migrate there.
    pub fn write_pending(&mut self, q: PartitionId, to: &[IndexCopy]) -> Result<(), FabricError> {
        let (p, slots) = self.set.index_slots.expect("a migration needs index slots");
        if to.len() != self.set.replicas as usize {
            return Err(FabricError::Transport(format!(
                "a chain of {} copies for partitions of {}",
                to.len(),
                self.set.replicas
            )));
        }
        if let Some(c) = to.iter().find(|c| c.slot >= slots) {
            return Err(FabricError::Transport(format!(
                "index slot {} of node {} does not exist (each node has {slots})",
                c.slot, c.node
            )));
        }
        let words = vec![self.set.ite.pending().0.to_le_bytes(); p.len(q) as usize];
        let bytes: Vec<u8> = words.concat();
        for c in to {
            let at = RemoteAddr::new(
                c.node,
                self.set.index_slot_region(),
                c.slot as u64 * self.set.index_slot_bytes(),
            );
            // Only while this node's lease holds, checked before each copy's write as every
            // plain write is (rule 6): one paused past it has had its reservation dropped, and
            // the slot may hold another migration's entries by now (review of f82f64e).
            if !mutated!(self.set, writer_ignores_lease) {
                self.check_fence()?;
            }
            self.inner.write(at, &bytes)?;
        }
        Ok(())
    }

    /// Hand over every entry of partition `q` still pending at its target chain, in order, a
    /// batch at a time, reading at most `bytes_per_s` (0: no limit). The caller ends the
    /// migration once this returns.
    pub fn hand_over_partition(
        &mut self,
        q: PartitionId,
        bytes_per_s: u64,
    ) -> Result<HandOver, FabricError> {
        let (p, _) = self.set.index_slots.expect("a migration needs index slots");
        if !self.fence.migrating(q) {
            return Err(FabricError::Transport(format!(
                "partition {q} is not migrating (in this node's view)"
            )));
        }
        let start = self.inner.mono_ns();
        let (home, first, len) = (p.home(q), p.home_offset(q), p.len(q));
        let mut done = HandOver {
            entries: len,
            ..HandOver::default()
        };
        let mut buf = vec![0u8; (PULL_ENTRIES * 8) as usize];
        let mut e = 0;
        while e < len {
            let n = PULL_ENTRIES.min(len - e);
            let at = RemoteAddr::new(home, INDEX_REGION, first + e * 8);
            let b = &mut buf[..(n * 8) as usize];
            self.read_primary_in(Part::Target(q), at, b)?;
            for w in 0..n {
                let word = u64::from_le_bytes(b[(w * 8) as usize..][..8].try_into().unwrap());
                if self.marked(word) {
                    let a = RemoteAddr {
                        offset: at.offset + w * 8,
                        ..at
                    };
                    done.handed += self.hand_over(q, a)? as u64;
                    // Whoever installed it, the entry is no longer pending at the primary.
                    let now = self.read_word(Part::Target(q), a)?;
                    if self.marked(now) {
                        return Err(FabricError::Transport(format!(
                            "index entry {a} of partition {q} is still pending after its handover"
                        )));
                    }
                }
            }
            e += n;
            self.pace(bytes_per_s, start, e * 8);
        }
        done.ns = self.inner.mono_ns().saturating_sub(start);
        Ok(done)
    }
}
