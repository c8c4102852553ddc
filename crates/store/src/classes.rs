//! Size classes of DTEs. A node's data table is carved into pages of
//! `page_bytes`; each page, while in use, serves one class and holds `page_bytes / entry_size`
//! entries of that class. Classes grow geometrically (×[`CLASS_GROWTH`], like memcached's slab
//! classes) from [`MIN_CLASS_PAYLOAD`] bytes of key and value up to `key_max + value_max`, so a
//! write wastes at most about a fifth of its entry to rounding instead of `value_max − len`.
//!
//! An entry is addressed by (class, slot): slot `s` of class `c` lives in the `s / per_page(c)`-th
//! page at entry `s % per_page(c)`. A reader that knows the class (it is in the ITE) computes the
//! byte offset without reading any table, so a GET stays one READ of exactly one entry.
//!
//! ```text
//! entry of class c: | 32 B metadata | key, padded to 8 | value, padded to 8 | (slack) |
//!                   |<------------------- entry_size(c) ------------------------------>|
//! ```

use crate::dte::KEY_OFF;

/// Each class's payload (key + value) is about this much larger than the previous one's.
pub const CLASS_GROWTH: f64 = 1.25;
/// Payload bytes (key + value) of the smallest class.
pub const MIN_CLASS_PAYLOAD: u64 = 64;
/// Most classes a geometry may have (6 bits in an ITE).
pub const MAX_CLASSES: usize = 64;
/// Smallest page.
pub const MIN_PAGE_BYTES: u64 = 4096;
/// A page holds at least this many entries of the largest class, so the tail a page cannot
/// use (less than one entry) costs at most 1/8 of it.
pub const LARGEST_PER_PAGE: u64 = 8;

fn pad8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

/// Why a set of classes cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassError {
    #[error(
        "{0} size classes exceed the limit of {MAX_CLASSES}: value_max is the largest value one \
         entry holds, not the longest item; keep it small (16 KiB by default) and, in the \
         client-driven mode, raise item_max (`nessie up --item-max`, [cache] item_max, up to \
         512 MiB) to store longer items in chunks"
    )]
    TooMany(usize),
}

/// The entry sizes of a cluster's classes and the page they are carved from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeClasses {
    /// Entry sizes (metadata included), ascending, multiples of 8.
    sizes: Vec<u64>,
    page_bytes: u64,
}

impl SizeClasses {
    /// Classes for keys up to `key_max` and values up to `value_max` bytes.
    pub fn new(key_max: u32, value_max: u32) -> Result<Self, ClassError> {
        let largest = pad8(key_max as u64) + pad8(value_max as u64);
        let mut payloads = vec![MIN_CLASS_PAYLOAD.min(largest)];
        while *payloads.last().unwrap() < largest {
            let prev = *payloads.last().unwrap();
            let next = pad8((prev as f64 * CLASS_GROWTH) as u64).max(prev + 8);
            payloads.push(next.min(largest));
        }
        if payloads.len() > MAX_CLASSES {
            return Err(ClassError::TooMany(payloads.len()));
        }
        let sizes: Vec<u64> = payloads.iter().map(|p| KEY_OFF + p).collect();
        let page_bytes = (sizes.last().unwrap() * LARGEST_PER_PAGE)
            .next_power_of_two()
            .max(MIN_PAGE_BYTES);
        Ok(Self { sizes, page_bytes })
    }

    /// Number of classes.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    pub fn page_bytes(&self) -> u64 {
        self.page_bytes
    }

    /// Bytes of one entry of class `c`.
    pub fn entry_size(&self, c: u8) -> u64 {
        self.sizes[c as usize]
    }

    /// Entries of class `c` in one page.
    pub fn per_page(&self, c: u8) -> u64 {
        self.page_bytes / self.entry_size(c)
    }

    /// The smallest class whose entries hold a key of `key_len` and a value of `value_len`
    /// bytes, or `None` if even the largest does not.
    pub fn class_for(&self, key_len: u32, value_len: u32) -> Option<u8> {
        let need = KEY_OFF + pad8(key_len as u64) + pad8(value_len as u64);
        let c = self.sizes.partition_point(|&s| s < need);
        (c < self.sizes.len()).then_some(c as u8)
    }

    /// Byte offset, within the data table, of slot `slot` of class `c`.
    pub fn offset(&self, c: u8, slot: u64) -> u64 {
        let per_page = self.per_page(c);
        (slot / per_page) * self.page_bytes + (slot % per_page) * self.entry_size(c)
    }

    /// The slot number of entry `i` of page `page` when that page serves class `c`.
    pub fn slot(&self, c: u8, page: u64, i: u64) -> u64 {
        debug_assert!(i < self.per_page(c));
        page * self.per_page(c) + i
    }

    /// Bits an ITE needs to number every slot of any class in a table of `pages` pages.
    pub fn slot_bits(&self, pages: u64) -> u8 {
        let most = pages.max(1) * self.per_page(0);
        (64 - (most.max(2) - 1).leading_zeros()) as u8
    }

    /// Bits an ITE needs for the class number.
    pub fn class_bits(&self) -> u8 {
        (64 - (self.sizes.len().max(2) as u64 - 1).leading_zeros()) as u8
    }
}

/// How an ITE's DTE field names an entry: its class above `slot_bits` bits of slot number.
/// With the DTI beside it, a reader knows the entry's node, offset and size from the ITE alone.
///
/// ```text
/// DTE field:  | class (class_bits) | slot (slot_bits) |
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DteField {
    pub class_bits: u8,
    pub slot_bits: u8,
}

impl DteField {
    /// The field for `classes` over data tables of `pages` pages.
    pub fn new(classes: &SizeClasses, pages: u64) -> Self {
        Self {
            class_bits: classes.class_bits(),
            slot_bits: classes.slot_bits(pages),
        }
    }

    /// Total width of the field.
    pub fn bits(&self) -> u8 {
        self.class_bits + self.slot_bits
    }

    #[inline]
    pub fn encode(&self, class: u8, slot: u64) -> u64 {
        debug_assert!(
            slot < 1 << self.slot_bits,
            "slot {slot} wider than {} bits",
            self.slot_bits
        );
        debug_assert!((class as u64) < 1 << self.class_bits);
        (class as u64) << self.slot_bits | slot
    }

    /// (class, slot) of a field.
    #[inline]
    pub fn decode(&self, field: u64) -> (u8, u64) {
        (
            (field >> self.slot_bits) as u8,
            field & ((1 << self.slot_bits) - 1),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_grow_geometrically_up_to_the_largest_entry() {
        let c = SizeClasses::new(128, 16384).unwrap();
        assert_eq!(c.entry_size(0), KEY_OFF + MIN_CLASS_PAYLOAD);
        let last = (c.len() - 1) as u8;
        assert_eq!(c.entry_size(last), KEY_OFF + 128 + 16384);
        for i in 1..c.len() as u8 {
            let (a, b) = (c.entry_size(i - 1) - KEY_OFF, c.entry_size(i) - KEY_OFF);
            assert_eq!(b % 8, 0);
            assert!(b > a, "classes ascend");
            assert!(b as f64 <= a as f64 * CLASS_GROWTH + 8.0, "{a} -> {b}");
        }
        assert!(c.len() <= MAX_CLASSES);
        assert_eq!(c.page_bytes(), 256 << 10);
        assert!(c.per_page(last) >= LARGEST_PER_PAGE);
    }

    #[test]
    fn a_write_takes_the_smallest_class_that_fits() {
        let c = SizeClasses::new(64, 4096).unwrap();
        assert_eq!(c.class_for(10, 0), Some(0));
        assert_eq!(
            c.class_for(8, 56),
            Some(0),
            "64 bytes of payload fit class 0"
        );
        assert_eq!(c.class_for(8, 57), Some(1));
        for (k, v) in [(1, 1), (20, 100), (20, 1000), (64, 4096), (33, 2049)] {
            let cls = c.class_for(k, v).unwrap();
            let need = KEY_OFF + pad8(k as u64) + pad8(v as u64);
            assert!(c.entry_size(cls) >= need);
            assert!(cls == 0 || c.entry_size(cls - 1) < need, "not the smallest");
        }
        assert_eq!(c.class_for(64, 4097), None);
        assert_eq!(c.class_for(72, 4096), None);
    }

    #[test]
    fn slots_map_to_disjoint_entries_inside_their_pages() {
        let c = SizeClasses::new(128, 100_000).unwrap();
        for cls in [0u8, 5, (c.len() - 1) as u8] {
            let size = c.entry_size(cls);
            let per_page = c.per_page(cls);
            assert!(per_page >= 1);
            for page in [0u64, 3] {
                for i in [0, per_page / 2, per_page - 1] {
                    let s = c.slot(cls, page, i);
                    let off = c.offset(cls, s);
                    assert_eq!(off, page * c.page_bytes() + i * size);
                    assert!(
                        off + size <= (page + 1) * c.page_bytes(),
                        "entry spills its page"
                    );
                }
            }
        }
    }

    #[test]
    fn pages_hold_several_entries_of_the_largest_class() {
        let c = SizeClasses::new(128, 4 << 20).unwrap();
        let last = (c.len() - 1) as u8;
        assert!(c.page_bytes().is_power_of_two());
        assert!(c.per_page(last) >= LARGEST_PER_PAGE);
        let tail = c.page_bytes() - c.per_page(last) * c.entry_size(last);
        assert!(
            tail * LARGEST_PER_PAGE <= c.page_bytes(),
            "{tail} bytes unused"
        );
        let tiny = SizeClasses::new(8, 8).unwrap();
        assert_eq!(tiny.page_bytes(), MIN_PAGE_BYTES);
        assert!(c.class_bits() <= 6);
    }

    #[test]
    fn dte_fields_round_trip_at_their_limits() {
        let c = SizeClasses::new(128, 16384).unwrap();
        let f = DteField::new(&c, 1000);
        let last = (c.len() - 1) as u8;
        let most = 1000 * c.per_page(0) - 1;
        assert!(most < 1 << f.slot_bits);
        for (class, slot) in [(0u8, 0u64), (last, most), (3, 12345)] {
            assert_eq!(f.decode(f.encode(class, slot)), (class, slot));
        }
        assert!(f.encode(last, most) < 1 << f.bits());
    }

    #[test]
    fn tiny_entries_have_one_class() {
        let c = SizeClasses::new(8, 8).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c.class_for(8, 8), Some(0));
    }

    #[test]
    fn the_largest_geometry_fits_the_class_limit() {
        // The largest keys and values the limits allow need 63 classes.
        let c =
            SizeClasses::new(crate::limits::MAX_KEY_SIZE, crate::limits::MAX_VALUE_SIZE).unwrap();
        assert_eq!(c.len(), 63);
        assert_eq!(c.class_bits(), 6);
        assert!(c.slot_bits(1 << 20) >= 20);
    }
}
