//! Index table entry (ITE): one 64-bit word, updated only by fabric CAS.
//!
//! ```text
//!  63   62 ........................... d+t+f  d+t+f-1 .. d+t   d+t-1 .. d   d-1 .. 0
//! +----+--------------------------------+----------------+-------------+-----------+
//! | P  |          unused (zero)         |  filter bits   |     DTI     | DTE index |
//! +----+--------------------------------+----------------+-------------+-----------+
//! ```
//! - `P` (present) is the paper's *empty bit*, stored inverted so that zeroed memory is an
//!   empty index table: an ITE is empty iff the whole word is 0.
//! - `filter bits` (f, default 7): the low bits of the key's filter hash; a mismatch proves the
//!   DTE cannot hold the key, saving a DTE read.
//! - `DTI` (t bits): data table identifier (= node id, one data table per node).
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
}

/// The present flag (inverse of the paper's empty bit).
pub const PRESENT: u64 = 1 << 63;

/// An index table entry as read from or written to memory.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ite(pub u64);

impl Ite {
    pub const EMPTY: Ite = Ite(0);

    #[inline]
    pub fn is_empty(self) -> bool {
        self.0 == 0
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
        "ITE needs {used} bits (DTE index {dte_bits} + DTI {dti_bits} + filter {filter_bits} + present 1) but has 64"
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
        let used = dte_bits as u32 + dti_bits as u32 + filter_bits as u32 + 1;
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
        })
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

    /// Does `ite` decode within this layout (present bit set, unused bits zero)?
    pub fn is_well_formed(&self, ite: Ite) -> bool {
        if ite.is_empty() {
            return true;
        }
        let used = (self.dte_bits + self.dti_bits + self.filter_bits) as u32;
        ite.0 & PRESENT != 0 && (ite.0 & !PRESENT) >> used == 0
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
        assert!(!l.is_well_formed(Ite(PRESENT | 1 << 40)));
        assert!(
            !l.is_well_formed(Ite(5)),
            "non-zero word without present bit"
        );
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
            .contains("73 bits"));
        assert!(IteLayout::new(0, 1, 0).is_err());
    }

    #[test]
    fn zero_filter_bits() {
        let l = IteLayout::new(10, 3, 0).unwrap();
        assert_eq!(l.filter_of(u64::MAX), 0);
        let i = l.encode(0, 5, 1000);
        assert_eq!((l.filter(i), l.dti(i), l.dte(i)), (0, 5, 1000));
    }

    proptest! {
        #[test]
        fn roundtrip(d in 1u8..40, t in 1u8..12, f in 0u8..12, a: u64, b: u32, c: u64) {
            let l = IteLayout::new(d, t, f).unwrap();
            let (filter, dti, dte) = (l.filter_of(a), b & (mask(t) as u32), c & mask(d));
            let i = l.encode(filter, dti, dte);
            prop_assert!(!i.is_empty());
            prop_assert!(l.is_well_formed(i));
            prop_assert_eq!((l.filter(i), l.dti(i), l.dte(i)), (filter, dti, dte));
        }
    }
}
