//! Batches: several READs, WRITEs and CASes handed to an endpoint at once, so that a backend
//! that can keep them in flight together (UCX) pays one round trip for all of them instead of
//! one per operation.
//!
//! A [`Batch`] is built on the caller's stack — [`Batch::read`], [`Batch::write`] and
//! [`Batch::cas`] post an operation and return its [`OpId`] — then run with
//! [`Endpoint::run_batch`](crate::Endpoint::run_batch), which returns once every operation
//! has completed or failed. Each operation then has its own result ([`Batch::result`]).
//!
//! Semantics, for every backend:
//! - **Every operation is attempted**, whatever happened to the others; an error (an address
//!   out of bounds, an unreachable node) is reported for the operation it belongs to only.
//! - **Overlapping operations take effect in batch order.** Two operations *conflict* when
//!   they touch overlapping bytes of the same region of the same node and at least one of them
//!   changes memory (a WRITE or a CAS); a later one of such a pair sees the earlier one's
//!   effect, as if the batch had run one operation after another. Operations that do not
//!   conflict may be in flight together and take effect in any order.
//! - Completion is as for single operations: when `run_batch` returns, every WRITE and CAS
//!   that succeeded has taken effect at its target and every READ's buffer is filled.
//!
//! The default `run_batch` runs the operations one after another with the blocking calls,
//! which meets all of that trivially; see `docs/fabric.md` for which backends do better.

use crate::{FabricError, OpKind, RemoteAddr};

/// Most operations one [`Batch`] holds. Bounded so that a batch lives on the stack (no
/// allocation on a GET's path) and a backend can keep per-operation state in fixed arrays.
/// A key's candidates number at most `MAX_HASH_FUNCTIONS` (8); twice that leaves room.
pub const MAX_BATCH_OPS: usize = 16;

/// One operation of a [`Batch`], with the caller's buffer.
#[derive(Debug)]
pub enum BatchOp<'a> {
    /// READ `buf.len()` bytes at `addr` into `buf`.
    Read { addr: RemoteAddr, buf: &'a mut [u8] },
    /// WRITE `buf` at `addr`.
    Write { addr: RemoteAddr, buf: &'a [u8] },
    /// 64-bit compare-and-swap at `addr`; its result is the value found there.
    Cas {
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    },
}

impl BatchOp<'_> {
    pub fn addr(&self) -> RemoteAddr {
        match *self {
            BatchOp::Read { addr, .. }
            | BatchOp::Write { addr, .. }
            | BatchOp::Cas { addr, .. } => addr,
        }
    }

    pub fn kind(&self) -> OpKind {
        match self {
            BatchOp::Read { .. } => OpKind::Read,
            BatchOp::Write { .. } => OpKind::Write,
            BatchOp::Cas { .. } => OpKind::Cas,
        }
    }

    /// Bytes the operation touches at its target.
    pub fn len(&self) -> usize {
        match self {
            BatchOp::Read { buf, .. } => buf.len(),
            BatchOp::Write { buf, .. } => buf.len(),
            BatchOp::Cas { .. } => 8,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `self` and `other` must take effect in batch order: they touch overlapping
    /// bytes of one region of one node, and at least one of them changes memory.
    pub fn conflicts_with(&self, other: &BatchOp<'_>) -> bool {
        let (a, b) = (self.addr(), other.addr());
        if a.node != b.node || a.region != b.region {
            return false;
        }
        if self.kind() == OpKind::Read && other.kind() == OpKind::Read {
            return false;
        }
        let end = |at: u64, len: usize| at.saturating_add(len as u64);
        // Empty operations touch nothing.
        !self.is_empty()
            && !other.is_empty()
            && a.offset < end(b.offset, other.len())
            && b.offset < end(a.offset, self.len())
    }

    /// Run this operation with the blocking calls of `ep`: its result as a batch reports it
    /// (the value found for a CAS, 0 otherwise).
    pub fn run_blocking<E: crate::Endpoint + ?Sized>(
        &mut self,
        ep: &mut E,
    ) -> Result<u64, FabricError> {
        match self {
            BatchOp::Read { addr, buf } => ep.read(*addr, buf).map(|()| 0),
            BatchOp::Write { addr, buf } => ep.write(*addr, buf).map(|()| 0),
            BatchOp::Cas {
                addr,
                expected,
                desired,
            } => ep.compare_and_swap(*addr, *expected, *desired),
        }
    }
}

/// Which operation of a [`Batch`]: its position, in the order operations were added.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub usize);

/// Up to [`MAX_BATCH_OPS`] operations run together by
/// [`Endpoint::run_batch`](crate::Endpoint::run_batch) (module comment).
#[derive(Debug)]
pub struct Batch<'a> {
    ops: [Option<BatchOp<'a>>; MAX_BATCH_OPS],
    results: [Option<Result<u64, FabricError>>; MAX_BATCH_OPS],
    len: usize,
}

impl Default for Batch<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> Batch<'a> {
    pub const fn new() -> Self {
        Self {
            ops: [const { None }; MAX_BATCH_OPS],
            results: [const { None }; MAX_BATCH_OPS],
            len: 0,
        }
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether another operation fits.
    pub fn is_full(&self) -> bool {
        self.len == MAX_BATCH_OPS
    }

    /// Add `op`. Panics when the batch already holds [`MAX_BATCH_OPS`] operations: callers
    /// size their batches by a bound they know (a key's candidates), so more is a bug.
    pub fn push(&mut self, op: BatchOp<'a>) -> OpId {
        assert!(
            self.len < MAX_BATCH_OPS,
            "a batch holds at most {MAX_BATCH_OPS} operations"
        );
        let id = OpId(self.len);
        self.ops[self.len] = Some(op);
        self.results[self.len] = None;
        self.len += 1;
        id
    }

    /// Post a READ of `buf.len()` bytes at `addr` into `buf`.
    pub fn read(&mut self, addr: RemoteAddr, buf: &'a mut [u8]) -> OpId {
        self.push(BatchOp::Read { addr, buf })
    }

    /// Post a WRITE of `buf` at `addr`.
    pub fn write(&mut self, addr: RemoteAddr, buf: &'a [u8]) -> OpId {
        self.push(BatchOp::Write { addr, buf })
    }

    /// Post a compare-and-swap at `addr` (its result: the value found there).
    pub fn cas(&mut self, addr: RemoteAddr, expected: u64, desired: u64) -> OpId {
        self.push(BatchOp::Cas {
            addr,
            expected,
            desired,
        })
    }

    /// The operations, in batch order, for a backend to run.
    pub fn ops(&self) -> impl Iterator<Item = &BatchOp<'a>> {
        self.ops[..self.len]
            .iter()
            .map(|o| o.as_ref().expect("posted"))
    }

    /// Operation `i`, mutably (its buffer is filled by a READ).
    pub fn op_mut(&mut self, i: usize) -> &mut BatchOp<'a> {
        assert!(i < self.len, "operation {i} of a batch of {}", self.len);
        self.ops[i].as_mut().expect("posted")
    }

    /// Operations `range`, mutably, in batch order (a backend posting a wave of them).
    pub fn ops_mut(
        &mut self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = &mut BatchOp<'a>> {
        assert!(
            range.end <= self.len,
            "operations {range:?} of a batch of {}",
            self.len
        );
        self.ops[range]
            .iter_mut()
            .map(|o| o.as_mut().expect("posted"))
    }

    /// Record operation `i`'s outcome (backends only). Each operation completes once.
    pub fn complete(&mut self, i: usize, r: Result<u64, FabricError>) {
        assert!(i < self.len, "operation {i} of a batch of {}", self.len);
        assert!(self.results[i].is_none(), "operation {i} completed twice");
        self.results[i] = Some(r);
    }

    /// Whether every operation has completed (or failed).
    pub fn is_complete(&self) -> bool {
        self.results[..self.len].iter().all(Option::is_some)
    }

    /// The outcome of operation `id`: the value found for a CAS, 0 for a READ or a WRITE.
    /// Panics if the batch has not been run.
    pub fn result(&self, id: OpId) -> Result<u64, FabricError> {
        assert!(
            id.0 < self.len,
            "operation {} of a batch of {}",
            id.0,
            self.len
        );
        self.results[id.0]
            .clone()
            .expect("the batch has been run (Endpoint::run_batch)")
    }

    /// The first error of the batch, in batch order.
    pub fn first_error(&self) -> Option<FabricError> {
        self.results[..self.len]
            .iter()
            .find_map(|r| r.as_ref().expect("the batch has been run").clone().err())
    }

    /// Run every operation not yet completed, one after another in batch order, with the
    /// blocking calls of `ep`: the default [`Endpoint::run_batch`](crate::Endpoint::run_batch).
    pub fn run_sequentially<E: crate::Endpoint + ?Sized>(&mut self, ep: &mut E) {
        for i in 0..self.len {
            if self.results[i].is_none() {
                let r = self.op_mut(i).run_blocking(ep);
                self.results[i] = Some(r);
            }
        }
    }

    /// The batch split into *waves*: maximal runs of consecutive operations none of which
    /// conflicts with an earlier one of its run ([`BatchOp::conflicts_with`]). A backend that
    /// runs each wave's operations at once, and a wave only after the one before it completed,
    /// keeps overlapping operations in batch order.
    pub fn waves(&self) -> Vec<std::ops::Range<usize>> {
        let mut waves = Vec::new();
        let mut start = 0;
        while start < self.len {
            let end = self.wave_end(start);
            waves.push(start..end);
            start = end;
        }
        waves
    }

    /// The end of the wave that starts at `start` (see [`Self::waves`]), without allocating;
    /// past `start` whenever `start` is an operation's index.
    pub fn wave_end(&self, start: usize) -> usize {
        let mut end = start;
        while end < self.len {
            let op = self.ops[end].as_ref().expect("posted");
            let conflict = self.ops[start..end]
                .iter()
                .any(|o| o.as_ref().expect("posted").conflicts_with(op));
            if conflict {
                break;
            }
            end += 1;
        }
        end
    }
}

/// The semantics above, checked on `ep` (panics on a violation): every backend's tests run
/// this. It uses the first 256 bytes of region `region` on every node of `nodes` (at least
/// two, each region at least 256 bytes and exactly `size` bytes long) and leaves them changed.
pub fn check_semantics<E: crate::Endpoint + ?Sized>(
    ep: &mut E,
    nodes: &[crate::NodeId],
    region: crate::RegionId,
    size: u64,
) {
    assert!(
        nodes.len() >= 2 && size >= 256,
        "the check needs two nodes of 256 bytes"
    );
    let at = |n: usize, off: u64| RemoteAddr::new(nodes[n % nodes.len()], region, off);
    let ops_before = ep.stats().snapshot().total_ops();
    let mut ops = 0;

    // An empty batch runs.
    let mut b = Batch::new();
    ep.run_batch(&mut b);
    assert!(b.is_complete());

    // Words on several nodes, written in one batch and read back in another.
    let words: Vec<[u8; 8]> = (0..8u64).map(|i| (0xB00 + i).to_le_bytes()).collect();
    let mut b = Batch::new();
    let ids: Vec<OpId> = (0..8)
        .map(|i| b.write(at(i, 8 * i as u64), &words[i]))
        .collect();
    ep.run_batch(&mut b);
    for id in ids {
        assert_eq!(b.result(id), Ok(0), "WRITE {id:?}");
    }
    ops += 8;
    let mut back = [[0u8; 8]; 8];
    let mut b = Batch::new();
    let ids: Vec<OpId> = back
        .iter_mut()
        .enumerate()
        .map(|(i, w)| b.read(at(i, 8 * i as u64), w))
        .collect();
    ep.run_batch(&mut b);
    for id in ids {
        assert_eq!(b.result(id), Ok(0), "READ {id:?}");
    }
    assert_eq!(back.to_vec(), words, "each READ has its own word");
    ops += 8;

    // Overlapping operations take effect in batch order: a WRITE then a READ of the same word
    // (and a longer READ over it), a CAS that expects what the WRITE put there, a READ after
    // it, and a second WRITE the last READ must see. Run out of order, every one differs.
    let w = at(0, 128);
    let (mut r1, mut r2, mut r3, mut r4) = ([0u8; 8], [0u8; 16], [0u8; 8], [0u8; 8]);
    let mut b = Batch::new();
    b.write(w, &[0x11; 8]);
    let read1 = b.read(w, &mut r1);
    let read2 = b.read(at(0, 120), &mut r2);
    let cas = b.cas(w, u64::from_le_bytes([0x11; 8]), 0x22);
    let read3 = b.read(w, &mut r3);
    b.write(w, &[0x33; 8]);
    let read4 = b.read(w, &mut r4);
    assert!(
        b.waves().len() >= 5,
        "the overlapping operations split the batch"
    );
    ep.run_batch(&mut b);
    assert_eq!(b.result(read1), Ok(0));
    assert_eq!(b.result(read2), Ok(0));
    assert_eq!(
        b.result(cas),
        Ok(u64::from_le_bytes([0x11; 8])),
        "the CAS saw the WRITE"
    );
    assert_eq!(b.result(read3), Ok(0));
    assert_eq!(b.result(read4), Ok(0));
    assert_eq!(r1, [0x11; 8], "the READ after the WRITE saw it");
    assert_eq!(r2[8..], [0x11; 8], "so did the longer READ over it");
    assert_eq!(
        u64::from_le_bytes(r3),
        0x22,
        "the READ after the CAS saw it"
    );
    assert_eq!(r4, [0x33; 8], "the READ after the second WRITE saw it");
    ops += 7;

    // An error in the middle is that operation's only: the others take place.
    let (mut before, mut after) = ([0u8; 8], [0u8; 8]);
    let mut oob = [0u8; 8];
    let mut b = Batch::new();
    let first = b.read(at(1, 8), &mut before);
    let bad = b.read(at(1, size), &mut oob);
    let misaligned = b.cas(at(0, 4), 0, 1);
    let written = b.write(at(1, 136), &[0x44; 8]);
    let last = b.read(at(0, 0), &mut after);
    ep.run_batch(&mut b);
    assert_eq!(b.result(first), Ok(0));
    assert!(
        matches!(b.result(bad), Err(FabricError::OutOfBounds { offset, .. }) if offset == size),
        "{:?}",
        b.result(bad)
    );
    assert!(
        matches!(b.result(misaligned), Err(FabricError::Misaligned { .. })),
        "{:?}",
        b.result(misaligned)
    );
    assert_eq!(b.result(written), Ok(0));
    assert_eq!(b.result(last), Ok(0));
    assert!(b.first_error().is_some());
    assert_eq!(before, words[1], "the READ before the error");
    assert_eq!(after, words[0], "the READ after it");
    let mut check = [0u8; 8];
    ep.read(at(1, 136), &mut check).unwrap();
    assert_eq!(check, [0x44; 8], "the WRITE after it");
    ops += 3 + 1;

    // A full batch of READs, then one of CASes, on distinct words across the nodes.
    let word = |i: usize| at(i, 160 + 8 * (i / nodes.len()) as u64);
    let mut found = [[0u8; 8]; MAX_BATCH_OPS];
    let mut b = Batch::new();
    for (i, f) in found.iter_mut().enumerate() {
        b.read(word(i), f);
    }
    assert!(b.is_full());
    ep.run_batch(&mut b);
    assert_eq!(b.first_error(), None);
    let found = found.map(u64::from_le_bytes);
    let mut b = Batch::new();
    let ids: Vec<OpId> = (0..MAX_BATCH_OPS)
        .map(|i| b.cas(word(i), found[i], found[i] + 1 + i as u64))
        .collect();
    ep.run_batch(&mut b);
    for (i, id) in ids.into_iter().enumerate() {
        assert_eq!(b.result(id), Ok(found[i]), "CAS {id:?} found its word");
    }
    ops += 2 * MAX_BATCH_OPS as u64;
    assert_eq!(
        ep.stats().snapshot().total_ops() - ops_before,
        ops,
        "every operation that took place is counted once, failed ones not"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(offset: u64) -> RemoteAddr {
        RemoteAddr::new(1, 0, offset)
    }

    #[test]
    fn conflicts_need_overlap_and_a_change() {
        let (mut b1, mut b2) = ([0u8; 16], [0u8; 8]);
        let r = BatchOp::Read {
            addr: a(0),
            buf: &mut b1,
        };
        let r2 = BatchOp::Read {
            addr: a(8),
            buf: &mut b2,
        };
        assert!(!r.conflicts_with(&r2), "two READs never conflict");
        let w = BatchOp::Write {
            addr: a(8),
            buf: &[1; 8],
        };
        assert!(r.conflicts_with(&w) && w.conflicts_with(&r));
        assert!(!w.conflicts_with(&BatchOp::Cas {
            addr: a(16),
            expected: 0,
            desired: 1
        }));
        assert!(w.conflicts_with(&BatchOp::Cas {
            addr: a(8),
            expected: 0,
            desired: 1
        }));
        let elsewhere = BatchOp::Cas {
            addr: RemoteAddr::new(2, 0, 8),
            expected: 0,
            desired: 1,
        };
        assert!(!w.conflicts_with(&elsewhere), "another node");
        let other_region = BatchOp::Cas {
            addr: RemoteAddr::new(1, 1, 8),
            expected: 0,
            desired: 1,
        };
        assert!(!w.conflicts_with(&other_region), "another region");
    }

    #[test]
    fn waves_break_only_at_conflicts() {
        let (mut x, mut y, mut z) = ([0u8; 8], [0u8; 8], [0u8; 8]);
        let mut b = Batch::new();
        b.read(a(0), &mut x);
        b.read(a(8), &mut y);
        b.write(a(16), &[1; 8]);
        b.read(a(16), &mut z); // conflicts with the WRITE
        b.cas(a(0), 0, 1); // conflicts with the first READ, not with the one before it
        b.cas(RemoteAddr::new(0, 0, 0), 0, 1);
        assert_eq!(b.waves(), vec![0..3, 3..6]);
        assert_eq!(b.wave_end(0), 3);
        assert_eq!(b.wave_end(3), 6);
        assert_eq!(Batch::new().waves(), Vec::<std::ops::Range<usize>>::new());
    }

    #[test]
    #[should_panic(expected = "at most")]
    fn a_batch_over_the_limit_is_a_bug() {
        let mut b = Batch::new();
        for i in 0..=MAX_BATCH_OPS {
            b.cas(a(8 * i as u64), 0, 1);
        }
    }

    #[test]
    #[should_panic(expected = "has been run")]
    fn results_only_after_the_run() {
        let mut b = Batch::new();
        let id = b.cas(a(0), 0, 1);
        let _ = b.result(id);
    }
}
