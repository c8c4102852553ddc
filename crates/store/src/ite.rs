//! Index table entry (ITE): one 64-bit word, updated only by fabric CAS.
//!
//! ```text
//!  63   62 ..... 63-q   62-q .......... d+t+f  d+t+f-1 .. d+t   d+t-1 .. d   d-1 .. 0
//! +----+--------------+-----------------------+----------------+-------------+-----------+
//! | P  |   sequence   | unused (zero) | F | M |  filter bits   |     DTI     | DTE index |
//! +----+--------------+---------------+---+---+----------------+-------------+-----------+
//! ```
//! - `P` (present) is the paper's *empty bit*, stored inverted so that zeroed memory is an
//!   empty index table: an ITE is empty iff its present bit is 0.
//! - `sequence` (q = the spare bits, at most [`MAX_SEQ_BITS`]): every CAS of the word installs
//!   the sequence number after the one it replaced (`IteLayout::successor`), so a word never
//!   comes back, not even an empty one, until the sequence wraps. Values alone (pointers to
//!   fresh DTEs) already do not recur within an expiry period, but *empty* recurred at once: a
//!   CAS that expected empty could succeed after the slot had been filled and emptied again,
//!   and a replicated CAS (SNAPSHOT, issue 11) needs every written value distinct.
//! - `M` (moved): set only in an *empty* word that a MIGRATE's Step 7 left in its source. The
//!   filter, DTI and DTE index fields then name the MIGRATE's copy, so that whoever completes
//!   a copy its migrator abandoned can tell whether the source was emptied (roll the copy
//!   forward) or not (take it out), and whoever fills the slot settles that copy first
//!   (`docs/protocol.md`, MIGRATE). Every reader treats a moved word as empty.
//! - `F` (fence, layout version 4): set only while an index partition moves from one chain
//!   of copies to another (the per-ITE handover, `protocols/src/replica/handover.rs`). In the
//!   old chain a word with F is *fenced*: the word it replaced, with the sequence moved on,
//!   which nobody commits from any more. In the new chain it is *pending*: F alone, what the
//!   new copies hold until the word is handed over. The replication layer never hands a word
//!   with F to the protocol, so `is_well_formed` refuses it.
//! - `filter bits` (f, default 7): the low bits of the key's filter hash; a mismatch proves the
//!   DTE cannot hold the key, saving a DTE read.
//! - `DTI` (t = 12 bits, `geometry::DTI_BITS`): data table identifier (= node id, one data
//!   table per node), as wide for one node as for 4096, so that nodes can join.
//! - `DTE index` (d bits): the entry's size class and slot in that data table
//!   ([`crate::classes::DteField`]).
//!
//! The widths are derived from the cluster geometry (see `Geometry::validate`). The paper's
//! watermark bit is not carried: our fabrics report completion, nobody polls memory for it.
//! Because a (DTI, DTE index) pair is not reused until an expiry period after it was released,
//! equal ITE words read at two times within one operation mean "unchanged" (no ABA).

/// Bit widths of the ITE fields.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IteLayout {
    pub dte_bits: u8,
    pub dti_bits: u8,
    pub filter_bits: u8,
    /// Width of the sequence number: the bits the other fields leave, at most
    /// [`MAX_SEQ_BITS`] (0 in the widest geometries: then words recur as in the paper).
    pub seq_bits: u8,
}

/// Most bits the sequence number takes: 16 M changes of one ITE before a word recurs.
pub const MAX_SEQ_BITS: u8 = 24;

/// The present flag (inverse of the paper's empty bit).
pub const PRESENT: u64 = 1 << 63;

// The present flag is the word's top bit, and the sequence number leaves room for an entry
// (a change to either is a change of `crate::LAYOUT_VERSION`).
const _: () = assert!(PRESENT == 1 << 63 && MAX_SEQ_BITS < 63);

/// An index table entry as read from or written to memory.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ite(pub u64);

impl Ite {
    pub const EMPTY: Ite = Ite(0);

    #[inline]
    pub fn is_empty(self) -> bool {
        self.0 & PRESENT == 0
    }
}

impl std::fmt::Debug for Ite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            write!(f, "Ite(empty)")
        } else {
            write!(f, "Ite({:#018x})", self.0)
        }
    }
}

fn mask(bits: u8) -> u64 {
    if bits == 0 {
        0
    } else {
        u64::MAX >> (64 - bits as u32)
    }
}

/// Why a set of ITE field widths is not a layout.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IteLayoutError {
    #[error(
        "ITE needs {used} bits (DTE index {dte_bits} + DTI {dti_bits} + filter {filter_bits} + present 1 + moved 1 + fence 1) but has 64: use fewer filter bits, nodes or DTEs per node"
    )]
    TooWide {
        used: u32,
        dte_bits: u8,
        dti_bits: u8,
        filter_bits: u8,
    },
    #[error("DTE index and DTI fields need at least one bit each")]
    EmptyField,
}

impl IteLayout {
    pub fn new(dte_bits: u8, dti_bits: u8, filter_bits: u8) -> Result<Self, IteLayoutError> {
        let used = dte_bits as u32 + dti_bits as u32 + filter_bits as u32 + 3;
        if used > 64 {
            return Err(IteLayoutError::TooWide {
                used,
                dte_bits,
                dti_bits,
                filter_bits,
            });
        }
        if dte_bits == 0 || dti_bits == 0 {
            return Err(IteLayoutError::EmptyField);
        }
        Ok(Self {
            dte_bits,
            dti_bits,
            filter_bits,
            seq_bits: (64 - used).min(MAX_SEQ_BITS as u32) as u8,
        })
    }

    /// Bits of the fields that name an entry (filter, DTI, DTE index).
    #[inline]
    fn entry_mask(&self) -> u64 {
        mask(self.dte_bits + self.dti_bits + self.filter_bits)
    }

    /// The moved bit (`M` above), just above the filter bits.
    #[inline]
    fn moved_bit(&self) -> u64 {
        1 << (self.dte_bits + self.dti_bits + self.filter_bits)
    }

    /// The fence bit (`F` above), just above the moved bit.
    #[inline]
    fn fence_bit(&self) -> u64 {
        self.moved_bit() << 1
    }

    /// Whether `ite` has the fence bit: fenced in a partition's old chain, pending in its new.
    #[inline]
    pub fn is_fence_marked(&self, ite: Ite) -> bool {
        ite.0 & self.fence_bit() != 0
    }

    /// What every copy of a partition's new chain holds before its word is handed over.
    #[inline]
    pub fn pending(&self) -> Ite {
        Ite(self.fence_bit())
    }

    /// The word that fences `w` in the old chain: `w` with the fence bit and the next
    /// sequence number (a new word of the ITE's history, carried like any CAS). Never
    /// [`Self::pending`] (replication orders pending before every word): the plain empty word
    /// whose sequence wraps to 0 would fence to it, so it fences to [`Self::wrap_fence`]
    /// instead, a word no other fences to ([`Self::handed_over`] inverts every fence).
    #[inline]
    pub fn fenced(&self, w: Ite) -> Ite {
        debug_assert!(!self.is_fence_marked(w));
        let f = self.successor(w, Ite(w.0 | self.fence_bit()));
        match f == self.pending() {
            true => self.wrap_fence(),
            false => f,
        }
    }

    /// The fence of the plain empty word at the last sequence number: F with every entry
    /// field bit set, at sequence 0. No other word fences to it (a plain empty word has no
    /// entry bits; any other word with them has P or M set, which its fence keeps).
    #[inline]
    fn wrap_fence(&self) -> Ite {
        Ite(self.fence_bit() | self.entry_mask())
    }

    /// The word the new chain takes in place of pending when `fenced` is handed over: the word
    /// it fenced, unchanged (its fields, and the sequence number before the fence), so that
    /// the handover is invisible to the protocol: a CAS expecting the word, from a read made
    /// before the fence, succeeds in the new chain exactly when the entry has not changed
    /// since.
    #[inline]
    pub fn handed_over(&self, fenced: Ite) -> Ite {
        debug_assert!(self.is_fence_marked(fenced));
        let field = mask(self.seq_bits) << self.seq_shift();
        if fenced == self.wrap_fence() {
            return Ite(field);
        }
        let seq = self.seq(fenced).wrapping_sub(1) & mask(self.seq_bits);
        Ite(fenced.0 & !self.fence_bit() & !field | seq << self.seq_shift())
    }

    /// The empty word a MIGRATE leaves in its source (Step 7), naming its `copy`; a CAS
    /// gives it its sequence number.
    #[inline]
    pub fn moved(&self, copy: Ite) -> Ite {
        debug_assert!(!copy.is_empty());
        Ite(copy.0 & self.entry_mask() | self.moved_bit())
    }

    /// Whether `ite` is an empty word a MIGRATE left in its source.
    #[inline]
    pub fn is_moved(&self, ite: Ite) -> bool {
        ite.is_empty() && ite.0 & self.moved_bit() != 0
    }

    /// Whether the moved word `moved` names the entry `copy` refers to.
    #[inline]
    pub fn names(&self, moved: Ite, copy: Ite) -> bool {
        self.is_moved(moved) && !copy.is_empty() && (moved.0 ^ copy.0) & self.entry_mask() == 0
    }

    /// A present word (sequence 0) referring to the entry the moved word `moved` names: what
    /// locates that entry's DTE.
    #[inline]
    pub fn moved_entry(&self, moved: Ite) -> Ite {
        debug_assert!(self.is_moved(moved));
        Ite(PRESENT | moved.0 & self.entry_mask())
    }

    /// Where the sequence number starts.
    #[inline]
    fn seq_shift(&self) -> u32 {
        63 - self.seq_bits as u32
    }

    /// The sequence number of `ite`.
    #[inline]
    pub fn seq(&self, ite: Ite) -> u64 {
        (ite.0 >> self.seq_shift()) & mask(self.seq_bits)
    }

    /// What a CAS from `expected` to `desired` installs: `desired` with the sequence number
    /// after `expected`'s (wrapping).
    #[inline]
    pub fn successor(&self, expected: Ite, desired: Ite) -> Ite {
        let field = mask(self.seq_bits) << self.seq_shift();
        let seq = (self.seq(expected) + 1) & mask(self.seq_bits);
        Ite(desired.0 & !field | seq << self.seq_shift())
    }

    /// Keep only the bits of `hash` that fit the filter field.
    #[inline]
    pub fn filter_of(&self, hash: u64) -> u64 {
        hash & mask(self.filter_bits)
    }

    /// Encode a present ITE. Panics (invariant) if a field does not fit its width.
    #[inline]
    pub fn encode(&self, filter: u64, dti: u32, dte: u64) -> Ite {
        assert!(
            filter <= mask(self.filter_bits),
            "filter {filter:#x} wider than {} bits",
            self.filter_bits
        );
        assert!(
            dti as u64 <= mask(self.dti_bits),
            "DTI {dti} wider than {} bits",
            self.dti_bits
        );
        assert!(
            dte <= mask(self.dte_bits),
            "DTE index {dte} wider than {} bits",
            self.dte_bits
        );
        let d = self.dte_bits as u32;
        let t = self.dti_bits as u32;
        Ite(PRESENT | filter << (d + t) | (dti as u64) << d | dte)
    }

    #[inline]
    pub fn dte(&self, ite: Ite) -> u64 {
        debug_assert!(!ite.is_empty());
        ite.0 & mask(self.dte_bits)
    }

    #[inline]
    pub fn dti(&self, ite: Ite) -> u32 {
        debug_assert!(!ite.is_empty());
        ((ite.0 >> self.dte_bits) & mask(self.dti_bits)) as u32
    }

    #[inline]
    pub fn filter(&self, ite: Ite) -> u64 {
        (ite.0 >> (self.dte_bits + self.dti_bits)) & mask(self.filter_bits)
    }

    /// Does `ite` decode within this layout (unused bits zero, the fence bit among them; an
    /// empty word holds nothing but its sequence number, or is a moved word; a present one has
    /// no moved bit)?
    pub fn is_well_formed(&self, ite: Ite) -> bool {
        let body = ite.0 & !PRESENT & !(mask(self.seq_bits) << self.seq_shift());
        let moved = body & self.moved_bit() != 0;
        if body & !self.moved_bit() & !self.entry_mask() != 0 {
            return false; // unused bits set
        }
        match (ite.is_empty(), moved) {
            (true, false) => body == 0,
            (true, true) => true,
            (false, moved) => !moved,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn boundaries() {
        let l = IteLayout::new(14, 2, 7).unwrap();
        let max = l.encode(127, 3, (1 << 14) - 1);
        assert_eq!(
            (l.filter(max), l.dti(max), l.dte(max)),
            (127, 3, (1 << 14) - 1)
        );
        let zero = l.encode(0, 0, 0);
        assert!(
            !zero.is_empty(),
            "entry 0 of table 0 with filter 0 is still present"
        );
        assert!(l.is_well_formed(zero) && l.is_well_formed(max) && l.is_well_formed(Ite::EMPTY));
        assert!(!l.is_well_formed(Ite(PRESENT | 1 << 30)));
        assert!(
            !l.is_well_formed(Ite(5)),
            "an empty word holds only its sequence number"
        );
    }

    #[test]
    fn every_cas_moves_the_sequence_on_so_no_word_recurs() {
        let l = IteLayout::new(14, 2, 7).unwrap();
        assert_eq!(l.seq_bits, MAX_SEQ_BITS, "24 spare bits and more");
        let a = l.encode(5, 1, 77);
        let filled = l.successor(Ite::EMPTY, a);
        assert_eq!((l.seq(filled), l.dte(filled), l.filter(filled)), (1, 77, 5));
        let emptied = l.successor(filled, Ite::EMPTY);
        assert!(emptied.is_empty() && l.is_well_formed(emptied));
        assert_ne!(emptied, Ite::EMPTY, "empty again, but not the same word");
        assert_eq!(l.seq(emptied), 2);
        let refilled = l.successor(emptied, a);
        assert_ne!(
            refilled, filled,
            "the same entry again, but not the same word"
        );
        // The sequence wraps after 2^seq_bits changes.
        let last = Ite(PRESENT | ((1u64 << MAX_SEQ_BITS) - 1) << (63 - MAX_SEQ_BITS as u32));
        assert_eq!(l.seq(l.successor(last, a)), 0);
        // The widest layout has no room for one: words recur as in the paper.
        let wide = IteLayout::new(40, 12, 9).unwrap();
        assert_eq!(wide.seq_bits, 0);
        assert_eq!(wide.successor(Ite::EMPTY, Ite::EMPTY), Ite::EMPTY);
    }

    #[test]
    #[should_panic(expected = "wider than")]
    fn overwide_field_is_an_invariant_violation() {
        IteLayout::new(4, 1, 2).unwrap().encode(0, 0, 16);
    }

    #[test]
    fn layout_that_does_not_fit_is_rejected() {
        assert!(IteLayout::new(40, 16, 16)
            .unwrap_err()
            .to_string()
            .contains("75 bits"));
        assert!(
            IteLayout::new(40, 12, 10).is_err(),
            "62 bits of fields leave none for the fence bit"
        );
        assert!(IteLayout::new(0, 1, 0).is_err());
    }

    #[test]
    fn zero_filter_bits() {
        let l = IteLayout::new(10, 3, 0).unwrap();
        assert_eq!(l.filter_of(u64::MAX), 0);
        let i = l.encode(0, 5, 1000);
        assert_eq!((l.filter(i), l.dti(i), l.dte(i)), (0, 5, 1000));
    }

    #[test]
    fn a_moved_word_is_empty_and_names_its_copy() {
        let l = IteLayout::new(14, 2, 7).unwrap();
        let copy = l.successor(Ite(PRESENT | 5 << 40), l.encode(127, 3, 77));
        let src = l.encode(9, 1, 12);
        let moved = l.successor(src, l.moved(copy));
        assert!(moved.is_empty() && l.is_moved(moved) && l.is_well_formed(moved));
        assert_eq!(l.seq(moved), l.seq(src) + 1, "a CAS like any other");
        assert!(l.names(moved, copy), "whatever the copy's sequence number");
        assert!(!l.names(moved, l.encode(127, 3, 76)) && !l.names(moved, src));
        let e = l.moved_entry(moved);
        assert_eq!((l.filter(e), l.dti(e), l.dte(e)), (127, 3, 77));
        // A plain empty word is not moved; a present word never has the bit.
        let emptied = l.successor(src, Ite::EMPTY);
        assert!(!l.is_moved(emptied) && !l.names(emptied, copy));
        assert!(
            !l.is_well_formed(Ite(copy.0 | 1 << 23)),
            "moved bit in a present word"
        );
        assert!(!l.is_moved(copy));
        // Entry 0 of table 0 with filter 0 still makes a moved word that is not plain empty.
        let zero = l.moved(l.encode(0, 0, 0));
        assert!(l.is_moved(zero) && zero != Ite::EMPTY);
    }

    #[test]
    fn a_handed_over_word_is_the_word_fenced() {
        let l = IteLayout::new(14, 2, 7).unwrap();
        for w in [
            l.successor(Ite(PRESENT | 5 << 40), l.encode(127, 3, 77)),
            l.successor(Ite::EMPTY, Ite::EMPTY),
            l.successor(l.encode(9, 1, 12), l.moved(l.encode(1, 2, 3))),
        ] {
            let f = l.fenced(w);
            assert!(l.is_fence_marked(f) && !l.is_well_formed(f));
            assert_eq!(l.seq(f), l.seq(w) + 1);
            assert_eq!(l.handed_over(f), w, "the word itself comes back");
        }
        let p = l.pending();
        assert!(p.is_empty() && l.is_fence_marked(p) && !l.is_well_formed(p));
        assert!(!l.is_fence_marked(Ite::EMPTY));
        // The empty word whose sequence wraps to 0 would fence to pending: it does not.
        let last_empty = Ite(((1u64 << l.seq_bits) - 1) << (63 - l.seq_bits as u32));
        assert!(last_empty.is_empty() && l.is_well_formed(last_empty));
        let f = l.fenced(last_empty);
        assert!(l.is_fence_marked(f) && f != p);
        assert_ne!(
            f,
            l.fenced(Ite::EMPTY),
            "the two empty words around the wrap"
        );
        assert_eq!(l.handed_over(f), last_empty, "the word itself comes back");
        assert_eq!(l.handed_over(l.fenced(Ite::EMPTY)), Ite::EMPTY);
    }

    proptest! {
        #[test]
        fn roundtrip(d in 1u8..40, t in 1u8..12, f in 0u8..11, a: u64, b: u32, c: u64) {
            let l = IteLayout::new(d, t, f).unwrap();
            let (filter, dti, dte) = (l.filter_of(a), b & (mask(t) as u32), c & mask(d));
            let i = l.encode(filter, dti, dte);
            prop_assert!(!i.is_empty());
            prop_assert!(l.is_well_formed(i));
            prop_assert_eq!((l.filter(i), l.dti(i), l.dte(i)), (filter, dti, dte));
            let j = l.successor(i, i);
            prop_assert!(l.is_well_formed(j) && !j.is_empty());
            prop_assert_eq!((l.filter(j), l.dti(j), l.dte(j)), (filter, dti, dte));
            prop_assert_eq!(l.seq(j), (l.seq(i) + 1) & mask(l.seq_bits));
            let m = l.successor(j, l.moved(j));
            prop_assert!(m.is_empty() && l.is_moved(m) && l.is_well_formed(m) && l.names(m, i));
            let e = l.moved_entry(m);
            prop_assert_eq!((l.filter(e), l.dti(e), l.dte(e)), (filter, dti, dte));
            // No live word has the fence bit; a handed-over one is the word fenced.
            prop_assert!(!l.is_fence_marked(j) && !l.is_fence_marked(m));
            prop_assert_eq!(l.handed_over(l.fenced(j)), j);
            prop_assert_eq!(l.handed_over(l.fenced(m)), m);
            // Empty words at any sequence number too (the wrap's included), and no fence is
            // pending.
            let e = Ite((a & mask(l.seq_bits)) << (63 - l.seq_bits as u32));
            prop_assert!(e.is_empty() && l.is_well_formed(e));
            prop_assert_eq!(l.handed_over(l.fenced(e)), e);
            prop_assert_ne!(l.fenced(e), l.pending());
        }
    }
}
