//! Data table entry (DTE) format. An entry is as large as its size class
//! ([`crate::classes`]); all fields are 8-byte aligned so that every fabric access is
//! word-sized. The value follows the entry's own key, so the entry ends where its value does
//! and the smallest class that holds both can be used.
//!
//! ```text
//! offset  size        field
//! 0       8           header:   bit 0 = valid flag; bit 1 = tombstone (a DELETE's entry, never
//!                               valid); bit 2 = given up (its writer will not act on it again);
//!                               bit 3 = a MIGRATE's copy, bits 8..15 = which of its key's
//!                               candidates the MIGRATE's source is; bit 4 = guarded (a
//!                               conditional write's: never rolled forward by others, its
//!                               previous version is put back instead);
//!                               bits 32..63 = writer tag (node << 16 | worker)
//! 8       8           recycle:  bit 63 = recycle flag; bits 0..62 = with the flag, the expiry
//!                               timestamp (ns since the Unix epoch) after which the entry may be
//!                               reused; without it, the time by which the write that created the
//!                               entry ends (its attempt's deadline; 0 = not recorded)
//! 16      8           previous version: the ITE this entry's writer replaced (0 = none)
//! 24      8           lengths:  key length (bits 0..31), value length (bits 32..63)
//! 32      8           expires:  when the item expires, ns since the Unix epoch (0 = never);
//!                               a GET past it finds the key absent (layout version 2)
//! 40      8           access:   last access (ms) and LFU counter, kept by GETs for eviction
//!                               ([`crate::access`]; layout version 2)
//! 48      key_len↑8   key bytes (zero padded)
//! 48+K    value_len↑8 value bytes (zero padded), K = key_len↑8
//! …       (unused up to entry_size = 48 + key_max↑8 + value_max↑8)
//! ```
//! The recycle flag and the expiry share one word so that marking an entry is a single aligned
//! 8-byte write: no reader can see the flag without its timestamp, whatever order a transport
//! copies the bytes of a larger write in (UCX over shm and TCP uses memcpy). Timestamps fit in
//! 63 bits until the year 2262.
//! The header, metadata and any key fit in the first `meta_size` bytes, which can be read
//! without knowing the key's length (they may include the start of the value). Apart from
//! the valid flag (0 → 1, by the writer, once), the recycle words (set once by whoever
//! released the entry's last ITE) and the access word (a hint GETs rewrite), an entry is
//! immutable while any ITE refers to it.
//!
//! The given-up bit lets anyone who meets an invalid entry tell a write still in progress from
//! one its writer gave up on: such an entry may be completed on the writer's behalf
//! (`docs/protocol.md`, deviation 6). The tombstone bit says how: a DELETE's entry is completed
//! by emptying its ITE, any other by installing a valid copy. The write deadline records when
//! the writer's attempt ends, for recovery from writers that die (issue 11).

use crate::access::Access;

pub const HEADER_OFF: u64 = 0;
pub const RECYCLE_OFF: u64 = 8;
pub const PREV_OFF: u64 = 16;
pub const LENS_OFF: u64 = 24;
pub const EXPIRES_OFF: u64 = 32;
pub const ACCESS_OFF: u64 = 40;
pub const KEY_OFF: u64 = 48;

const VALID: u64 = 1;
/// Header bit of a DELETE's entry.
pub const TOMBSTONE: u64 = 1 << 1;
/// Header bit its writer sets (by CAS) on an invalid entry it gave up on.
pub const GIVEN_UP: u64 = 1 << 2;
const RECYCLE: u64 = 1 << 63;
/// Header bit of a MIGRATE's copy (its source candidate in [`SOURCE_SHIFT`]..).
const MIGRATED: u64 = 1 << 3;
const SOURCE_SHIFT: u32 = 8;
/// Header bit of a conditional write's entry: whoever completes it for its writer puts its
/// previous version back (its condition was evaluated by its writer alone).
pub const GUARDED: u64 = 1 << 4;

// The header's flag bits are distinct, below the migrate source's byte, and clear of the
// writer tag (the upper 32 bits); the recycle word's flag is its top bit. A change to any of
// these is a change of `crate::LAYOUT_VERSION`.
const _: () = {
    let flags = [VALID, TOMBSTONE, GIVEN_UP, MIGRATED, GUARDED];
    let mut all = 0u64;
    let mut i = 0;
    while i < flags.len() {
        assert!(flags[i].count_ones() == 1 && all & flags[i] == 0);
        all |= flags[i];
        i += 1;
    }
    assert!(all < 1 << SOURCE_SHIFT && SOURCE_SHIFT + 8 <= 32);
    assert!(RECYCLE == 1 << 63);
    // Every word of the fixed part is 8-aligned, in order, and the key follows them.
    assert!(HEADER_OFF < RECYCLE_OFF && RECYCLE_OFF < PREV_OFF && PREV_OFF < LENS_OFF);
    assert!(LENS_OFF + 8 == EXPIRES_OFF && EXPIRES_OFF + 8 == ACCESS_OFF);
    assert!(ACCESS_OFF + 8 == KEY_OFF && KEY_OFF.is_multiple_of(8));
};

fn pad8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

/// Who wrote an entry: identifies the client worker, so that a retried operation can recognise
/// (and reuse the slot of) its own invalid entry left by an aborted attempt.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct WriterTag(pub u32);

impl WriterTag {
    pub fn new(node: u16, worker: u16) -> Self {
        Self((node as u32) << 16 | worker as u32)
    }

    /// The node of the writer.
    pub fn node(self) -> u16 {
        (self.0 >> 16) as u16
    }
}

/// What a new entry's header and recycle word say.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub writer: WriterTag,
    /// The ITE the write replaced (0 = none).
    pub prev: u64,
    /// Valid from the start: a copy that completes another writer's entry.
    pub valid: bool,
    /// A DELETE's entry.
    pub tombstone: bool,
    /// When the write ends (ns since the Unix epoch; 0 = not recorded).
    pub write_deadline: u64,
    /// A MIGRATE's copy: which of the key's candidates (0-based) its source is.
    pub source: Option<u8>,
    /// A conditional write's entry (its previous version is what it replaced, always).
    pub guarded: bool,
    /// When the item expires (ns since the Unix epoch; 0 = never).
    pub expires: u64,
    /// The access word it starts with ([`crate::access::Access`]).
    pub access: Access,
}

/// Sizes and offsets of DTEs for one cluster.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DteLayout {
    pub key_max: u32,
    pub value_max: u32,
    /// Bytes of header, metadata and the longest key: a read of this many bytes holds any
    /// entry's key.
    pub meta_size: u64,
    /// Size of a whole entry.
    pub entry_size: u64,
}

/// The fixed-size part of a DTE, decoded.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DteMeta {
    pub valid: bool,
    /// A DELETE's entry: never valid; its write completes by emptying the ITE.
    pub tombstone: bool,
    /// Its writer gave up on it (and never acts on it again): anyone may complete it.
    pub given_up: bool,
    /// A MIGRATE's copy, while invalid: which of the key's candidates its source is.
    pub source: Option<u8>,
    /// A conditional write's entry: completed by putting `prev` back, never rolled forward.
    pub guarded: bool,
    pub writer: WriterTag,
    /// The recycle flag's expiry timestamp, if the flag is set.
    pub recycle: Option<u64>,
    /// Without the recycle flag: when the write that created the entry ends (0: unknown).
    pub write_deadline: u64,
    pub prev: u64,
    pub key_len: u32,
    pub value_len: u32,
    /// When the item expires (ns since the Unix epoch; 0 = never).
    pub expires: u64,
    /// Its access word as read (a hint: see [`crate::access`]).
    pub access: Access,
}

impl DteMeta {
    /// Whether the item has expired at `now_ns`.
    #[inline]
    pub fn expired_at(&self, now_ns: u64) -> bool {
        self.expires != 0 && self.expires <= now_ns
    }
}

/// Why bytes read from a data table do not decode as a DTE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DteError {
    #[error("DTE lengths out of range: key {key_len} (max {key_max}), value {value_len} (max {value_max})")]
    BadLengths {
        key_len: u32,
        value_len: u32,
        key_max: u32,
        value_max: u32,
    },
    #[error("DTE buffer of {got} bytes is shorter than the {need} bytes needed")]
    Short { got: usize, need: usize },
}

fn word(buf: &[u8], off: u64) -> u64 {
    u64::from_le_bytes(buf[off as usize..off as usize + 8].try_into().unwrap())
}

impl DteLayout {
    pub fn new(key_max: u32, value_max: u32) -> Self {
        let meta_size = KEY_OFF + pad8(key_max as u64);
        Self {
            key_max,
            value_max,
            meta_size,
            entry_size: meta_size + pad8(value_max as u64),
        }
    }

    /// Offset of the value of an entry whose key is `key_len` bytes long.
    #[inline]
    pub fn value_offset(key_len: u32) -> u64 {
        KEY_OFF + pad8(key_len as u64)
    }

    /// Byte offset of entry `index` within the data table region.
    #[inline]
    pub fn offset(&self, index: u64) -> u64 {
        index * self.entry_size
    }

    /// Bytes needed to read a value of `len` bytes (rounded to the fabric's word size).
    #[inline]
    pub fn value_read_len(&self, len: u32) -> u64 {
        pad8(len as u64)
    }

    /// Write a fresh, *invalid* entry into `buf` (`value_offset(key.len()) + pad8(value.len())`
    /// bytes). Returns the number of bytes to store. The recycle word is zero.
    pub fn encode(
        &self,
        buf: &mut Vec<u8>,
        writer: WriterTag,
        prev: u64,
        key: &[u8],
        value: &[u8],
    ) -> usize {
        let head = Head {
            writer,
            prev,
            valid: false,
            tombstone: false,
            write_deadline: 0,
            source: None,
            guarded: false,
            expires: 0,
            access: Access(0),
        };
        self.encode_with(buf, head, key, value)
    }

    /// Write a fresh entry with the header and recycle word `head` describes into `buf`.
    /// Returns the number of bytes to store.
    pub fn encode_with(&self, buf: &mut Vec<u8>, head: Head, key: &[u8], value: &[u8]) -> usize {
        self.encode_parts(buf, head, key, &[value])
    }

    /// [`DteLayout::encode_with`] of a value given as the concatenation of `parts` (a front
    /// end's item header and data), without assembling it first. Only the padding is
    /// zero-filled: the bytes of a large value are written once.
    pub fn encode_parts(
        &self,
        buf: &mut Vec<u8>,
        head: Head,
        key: &[u8],
        parts: &[&[u8]],
    ) -> usize {
        let value_len: usize = parts.iter().map(|p| p.len()).sum();
        let value_off = self.encode_head(buf, head, key, value_len);
        let len = value_off + pad8(value_len as u64) as usize;
        buf.reserve(len - value_off);
        for p in parts {
            buf.extend_from_slice(p);
        }
        buf.resize(len, 0);
        len
    }

    /// The first part of [`DteLayout::encode_parts`]: the entry's metadata and key, padded to
    /// the value's offset, which it returns, for a value of `value_len` bytes that the caller
    /// writes after it (padded to a word with zeros).
    pub fn encode_head(
        &self,
        buf: &mut Vec<u8>,
        head: Head,
        key: &[u8],
        value_len: usize,
    ) -> usize {
        assert!(key.len() <= self.key_max as usize && value_len <= self.value_max as usize);
        assert!(
            head.write_deadline < RECYCLE,
            "write deadline {} does not fit in 63 bits",
            head.write_deadline
        );
        assert!(
            !(head.valid && head.tombstone),
            "a tombstone is never valid"
        );
        let value_off = Self::value_offset(key.len() as u32) as usize;
        let flags = if head.tombstone { TOMBSTONE } else { 0 }
            | if head.guarded { GUARDED } else { 0 }
            | Self::source_bits(head.source);
        // The words below go out in this order.
        const _: () = assert!(
            HEADER_OFF == 0
                && RECYCLE_OFF == 8
                && PREV_OFF == 16
                && LENS_OFF == 24
                && EXPIRES_OFF == 32
                && ACCESS_OFF == 40
                && KEY_OFF == 48
        );
        buf.clear();
        buf.reserve(value_off);
        for word in [
            self.header(head.writer, head.valid) | flags, // HEADER_OFF
            head.write_deadline,                          // RECYCLE_OFF
            head.prev,                                    // PREV_OFF
            key.len() as u64 | (value_len as u64) << 32,  // LENS_OFF
            head.expires,                                 // EXPIRES_OFF
            head.access.0,                                // ACCESS_OFF
        ] {
            buf.extend_from_slice(&word.to_le_bytes());
        }
        debug_assert_eq!(buf.len() as u64, KEY_OFF);
        buf.extend_from_slice(key);
        buf.resize(value_off, 0);
        value_off
    }

    /// The header word for `writer` with the given valid flag.
    #[inline]
    pub fn header(&self, writer: WriterTag, valid: bool) -> u64 {
        (writer.0 as u64) << 32 | if valid { VALID } else { 0 }
    }

    /// The header bits that mark a MIGRATE's copy whose source is the key's candidate
    /// `source` (none for any other entry).
    pub fn source_bits(source: Option<u8>) -> u64 {
        source.map_or(0, |c| MIGRATED | (c as u64) << SOURCE_SHIFT)
    }

    /// The recycle word marking an entry reusable after `expiry_ns`.
    pub fn recycle_word(expiry_ns: u64) -> u64 {
        assert!(
            expiry_ns < RECYCLE,
            "expiry timestamp {expiry_ns} does not fit in 63 bits"
        );
        RECYCLE | expiry_ns
    }

    /// The expiry timestamp of a recycle word whose flag is set.
    pub fn recycle_expiry(word: u64) -> Option<u64> {
        (word & RECYCLE != 0).then_some(word & !RECYCLE)
    }

    /// Decode the fixed-size part of an entry (needs at least `KEY_OFF` bytes).
    pub fn meta(&self, buf: &[u8]) -> Result<DteMeta, DteError> {
        if buf.len() < KEY_OFF as usize {
            return Err(DteError::Short {
                got: buf.len(),
                need: KEY_OFF as usize,
            });
        }
        let h = word(buf, HEADER_OFF);
        let lens = word(buf, LENS_OFF);
        let r = word(buf, RECYCLE_OFF);
        let m = DteMeta {
            valid: h & VALID != 0,
            tombstone: h & TOMBSTONE != 0,
            given_up: h & GIVEN_UP != 0,
            source: (h & MIGRATED != 0).then_some((h >> SOURCE_SHIFT) as u8),
            guarded: h & GUARDED != 0,
            writer: WriterTag((h >> 32) as u32),
            recycle: Self::recycle_expiry(r),
            write_deadline: if r & RECYCLE == 0 { r } else { 0 },
            prev: word(buf, PREV_OFF),
            key_len: lens as u32,
            value_len: (lens >> 32) as u32,
            expires: word(buf, EXPIRES_OFF),
            access: Access(word(buf, ACCESS_OFF)),
        };
        if m.key_len > self.key_max || m.value_len > self.value_max {
            return Err(DteError::BadLengths {
                key_len: m.key_len,
                value_len: m.value_len,
                key_max: self.key_max,
                value_max: self.value_max,
            });
        }
        Ok(m)
    }

    /// The key of an entry whose first `value_offset(meta.key_len)` bytes are in `buf`.
    pub fn key<'a>(&self, buf: &'a [u8], meta: &DteMeta) -> &'a [u8] {
        &buf[KEY_OFF as usize..KEY_OFF as usize + meta.key_len as usize]
    }

    /// The value of an entry whose bytes up to the end of the value are in `buf`.
    pub fn value<'a>(&self, buf: &'a [u8], meta: &DteMeta) -> Result<&'a [u8], DteError> {
        let start = Self::value_offset(meta.key_len) as usize;
        let end = start + meta.value_len as usize;
        buf.get(start..end).ok_or(DteError::Short {
            got: buf.len(),
            need: end,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_sizes() {
        let l = DteLayout::new(128, 1024);
        assert_eq!(l.meta_size, 48 + 128);
        assert_eq!(l.entry_size, 48 + 128 + 1024);
        let odd = DteLayout::new(5, 3);
        assert_eq!(odd.meta_size, 56);
        assert_eq!(DteLayout::value_offset(5), 56);
        assert_eq!(DteLayout::value_offset(0), 48);
        assert_eq!(odd.entry_size, 64);
        assert_eq!(odd.offset(3), 192);
        let empty_values = DteLayout::new(8, 0);
        assert_eq!(empty_values.entry_size, 56);
    }

    /// The expiry and access words (layout version 2) go where the layout says and decode.
    #[test]
    fn expiry_and_access_words_round_trip() {
        let l = DteLayout::new(16, 16);
        let head = Head {
            writer: WriterTag::new(1, 1),
            prev: 0,
            valid: true,
            tombstone: false,
            write_deadline: 0,
            source: None,
            guarded: false,
            expires: 1_800_000_000_000_000_000,
            access: Access::new(1_800_000_000_000),
        };
        let mut buf = Vec::new();
        l.encode_with(&mut buf, head, b"key", b"v");
        assert_eq!(word(&buf, EXPIRES_OFF), head.expires);
        assert_eq!(word(&buf, ACCESS_OFF), head.access.0);
        let m = l.meta(&buf).unwrap();
        assert_eq!((m.expires, m.access), (head.expires, head.access));
        assert!(!m.expired_at(head.expires - 1) && m.expired_at(head.expires));
        let never = DteMeta { expires: 0, ..m };
        assert!(!never.expired_at(u64::MAX), "0 is never");
    }

    /// A value in parts encodes as the whole would, and a buffer's old bytes never show
    /// through the padding.
    #[test]
    fn parts_encode_as_their_concatenation_with_clean_padding() {
        let l = DteLayout::new(16, 64);
        let head = Head {
            writer: WriterTag::new(2, 5),
            prev: 0x77,
            valid: false,
            tombstone: false,
            write_deadline: 123,
            source: Some(1),
            guarded: true,
            expires: 9,
            access: Access(3),
        };
        for (key, parts) in [
            (&b"abc"[..], vec![&b"0123456789abcdef"[..], &b"xyz"[..]]),
            (&b""[..], vec![&b""[..]]),
            (&b"k"[..], vec![&[7u8; 40][..], &[][..], &[8u8; 24][..]]),
        ] {
            let whole: Vec<u8> = parts.concat();
            let mut expected = vec![0u8; 200];
            let n = l.encode_with(&mut expected, head, key, &whole);
            let mut got = vec![0xFFu8; 200];
            assert_eq!(l.encode_parts(&mut got, head, key, &parts), n);
            assert_eq!(got, expected, "key {key:?}");
            let m = l.meta(&got).unwrap();
            assert_eq!(l.key(&got, &m), key);
            assert_eq!(l.value(&got, &m).unwrap(), &whole[..]);
            let pad = DteLayout::value_offset(key.len() as u32) as usize;
            assert!(got[KEY_OFF as usize + key.len()..pad]
                .iter()
                .all(|&b| b == 0));
            assert!(got[pad + whole.len()..].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn encode_decode_at_the_size_limits() {
        let l = DteLayout::new(16, 32);
        let mut buf = Vec::new();
        let n = l.encode(
            &mut buf,
            WriterTag::new(7, 3),
            0xdead,
            &[9u8; 16],
            &[1u8; 32],
        );
        assert_eq!(n as u64, l.entry_size);
        let m = l.meta(&buf).unwrap();
        assert!(!m.valid && m.recycle.is_none());
        assert_eq!(m.writer, WriterTag::new(7, 3));
        assert_eq!((m.prev, m.key_len, m.value_len), (0xdead, 16, 32));
        assert_eq!(l.key(&buf, &m), &[9u8; 16]);
        assert_eq!(l.value(&buf, &m).unwrap(), &[1u8; 32]);
        // Empty key and value.
        l.encode(&mut buf, WriterTag::new(0, 0), 0, b"", b"");
        let m = l.meta(&buf).unwrap();
        assert_eq!((m.key_len, m.value_len), (0, 0));
        assert_eq!(buf.len() as u64, KEY_OFF, "an empty key takes no room");
        // A short key: the value follows it, and the entry ends early.
        let n = l.encode(&mut buf, WriterTag::new(0, 0), 0, b"k", &[5u8; 9]);
        assert_eq!(n, 48 + 8 + 16);
        let m = l.meta(&buf).unwrap();
        assert_eq!(l.value(&buf, &m).unwrap(), &[5u8; 9]);
    }

    #[test]
    fn header_and_recycle_words() {
        let l = DteLayout::new(8, 8);
        let mut buf = Vec::new();
        l.encode(&mut buf, WriterTag::new(1, 2), 0, b"k", b"v");
        buf[..8].copy_from_slice(&l.header(WriterTag::new(1, 2), true).to_le_bytes());
        buf[8..16].copy_from_slice(&DteLayout::recycle_word(12345).to_le_bytes());
        let m = l.meta(&buf).unwrap();
        assert!(m.valid);
        assert_eq!(m.recycle, Some(12345));
        assert_eq!(m.writer, WriterTag::new(1, 2));
        assert_eq!(
            DteLayout::recycle_expiry(DteLayout::recycle_word(0)),
            Some(0),
            "expiry 0 is still flagged"
        );
        assert_eq!(DteLayout::recycle_expiry(12345), None, "no flag, no expiry");
    }

    #[test]
    fn the_guarded_bit_round_trips_with_the_replaced_word() {
        let l = DteLayout::new(16, 32);
        let mut buf = Vec::new();
        let head = Head {
            writer: WriterTag::new(1, 2),
            prev: 0x77,
            valid: false,
            tombstone: true,
            write_deadline: 5,
            source: None,
            guarded: true,
            expires: 0,
            access: Access(0),
        };
        l.encode_with(&mut buf, head, b"key", b"");
        let m = l.meta(&buf).unwrap();
        assert!(m.guarded && m.tombstone && !m.valid && m.prev == 0x77);
        assert_eq!(
            u64::from_le_bytes(buf[..8].try_into().unwrap()),
            l.header(head.writer, false) | TOMBSTONE | GUARDED
        );
    }

    #[test]
    fn tombstones_copies_and_write_deadlines_round_trip() {
        let l = DteLayout::new(16, 32);
        let mut buf = Vec::new();
        let head = Head {
            writer: WriterTag::new(2, 5),
            prev: 0x77,
            valid: false,
            tombstone: true,
            write_deadline: 1_700_000_000_123_456_789,
            source: None,
            guarded: false,
            expires: 0,
            access: Access(0),
        };
        l.encode_with(&mut buf, head, b"key", b"");
        let m = l.meta(&buf).unwrap();
        assert!(m.tombstone && !m.valid && !m.given_up && m.recycle.is_none());
        assert!(!m.guarded);
        let h = u64::from_le_bytes(buf[..8].try_into().unwrap());
        buf[..8].copy_from_slice(&(h | GIVEN_UP).to_le_bytes());
        let m = l.meta(&buf).unwrap();
        assert!(m.given_up && m.tombstone && !m.valid);
        assert_eq!(
            (m.write_deadline, m.prev, m.writer),
            (head.write_deadline, 0x77, head.writer)
        );
        // Marking it for recycling replaces the deadline with the expiry.
        buf[8..16].copy_from_slice(&DteLayout::recycle_word(42).to_le_bytes());
        let m = l.meta(&buf).unwrap();
        assert_eq!((m.recycle, m.write_deadline), (Some(42), 0));
        let copy = Head {
            valid: true,
            tombstone: false,
            ..head
        };
        l.encode_with(&mut buf, copy, b"key", b"value");
        let m = l.meta(&buf).unwrap();
        assert!(m.valid && !m.tombstone);
        assert_eq!(l.value(&buf, &m).unwrap(), b"value");
        // The plain encoder: invalid, no tombstone, no deadline.
        l.encode(&mut buf, head.writer, 0, b"k", b"v");
        let m = l.meta(&buf).unwrap();
        assert!(!m.valid && !m.tombstone && m.write_deadline == 0 && m.source.is_none());
        // A MIGRATE's copy says where its source is; setting it valid (a new header) or
        // giving it up (one more bit) keeps or drops that with the rest of the header.
        let migrated = Head {
            source: Some(7),
            ..copy
        };
        l.encode_with(
            &mut buf,
            Head {
                valid: false,
                ..migrated
            },
            b"key",
            b"value",
        );
        let m = l.meta(&buf).unwrap();
        assert_eq!((m.source, m.valid, m.writer), (Some(7), false, head.writer));
        let h = u64::from_le_bytes(buf[..8].try_into().unwrap());
        assert_eq!(
            h,
            l.header(head.writer, false) | DteLayout::source_bits(Some(7))
        );
        buf[..8].copy_from_slice(&(h | GIVEN_UP).to_le_bytes());
        assert_eq!(l.meta(&buf).unwrap().source, Some(7));
        assert_eq!(DteLayout::source_bits(None), 0);
    }

    #[test]
    fn corrupt_lengths_are_reported() {
        let l = DteLayout::new(8, 8);
        let mut buf = vec![0u8; l.entry_size as usize];
        buf[24..32].copy_from_slice(&(9u64).to_le_bytes());
        assert!(matches!(
            l.meta(&buf),
            Err(DteError::BadLengths { key_len: 9, .. })
        ));
        assert!(matches!(l.meta(&buf[..16]), Err(DteError::Short { .. })));
        let m = DteMeta {
            valid: true,
            tombstone: false,
            given_up: false,
            source: None,
            guarded: false,
            writer: WriterTag(0),
            recycle: None,
            write_deadline: 0,
            prev: 0,
            key_len: 0,
            value_len: 8,
            expires: 0,
            access: Access(0),
        };
        assert!(
            l.value(&buf[..KEY_OFF as usize], &m).is_err(),
            "value beyond the buffer"
        );
    }

    proptest! {
        #[test]
        fn roundtrip(kmax in 1u32..300, vmax in 0u32..5000, key in proptest::collection::vec(any::<u8>(), 0..300),
                     value in proptest::collection::vec(any::<u8>(), 0..5000), prev: u64, node: u16, worker: u16) {
            let l = DteLayout::new(kmax, vmax);
            let key = &key[..key.len().min(kmax as usize)];
            let value = &value[..value.len().min(vmax as usize)];
            let mut buf = Vec::new();
            let n = l.encode(&mut buf, WriterTag::new(node, worker), prev, key, value);
            prop_assert_eq!(n % 8, 0);
            prop_assert!(n as u64 <= l.entry_size);
            let m = l.meta(&buf).unwrap();
            prop_assert_eq!(l.key(&buf, &m), key);
            prop_assert_eq!(l.value(&buf, &m).unwrap(), value);
            prop_assert_eq!(m.prev, prev);
            prop_assert_eq!(m.writer, WriterTag::new(node, worker));
        }
    }
}
