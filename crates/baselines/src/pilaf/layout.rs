//! Pilaf's memory formats: the hash-table region (a header word and an array of fixed-size,
//! self-verifying entries) and the extent region (variable-size key-value strings). Both are
//! written only by the owner node's server threads and read by clients with one-sided READs.
//!
//! ```text
//! table region (TABLE_REGION)
//! 0                    8      move sequence: odd while the server is carrying out a chain of
//!                             cuckoo moves, moved on (+1) at the start and at the end of one
//! 8 .. TABLE_HEADER   -       reserved (zero)
//! TABLE_HEADER + i×40 40      entry i:
//!     +0   8   key hash   xxh3 of the key (the candidates and the tag derive from it)
//!     +8   8   extent     bit 63: in use; bits 0..39: byte offset of the extent
//!     +16  8   size       bytes of the extent (a multiple of 8)
//!     +24  8   extent CRC CRC64 of the extent's bytes
//!     +32  8   entry CRC  CRC64 of the four words above
//! An all-zero entry is empty (registered memory starts zeroed); any other entry is accepted
//! only if its entry CRC matches.
//!
//! extent (in EXTENT_REGION, at the entry's offset)
//!     +0   8   lengths: key length (bits 0..31), value length (bits 32..63)
//!     +8   K   key, zero padded to K = key_len↑8
//!     +8+K V   value, zero padded to V = value_len↑8
//! ```
//!
//! Every field is 8-byte aligned, so each entry and extent is a whole number of words, which is
//! what the fabric reads and writes. The fabric does not promise the order in which the words
//! of one WRITE land or of one READ are taken (`docs/fabric.md`): a READ that overlaps a write
//! of the same bytes may see a mix of both. The two CRCs are how a client detects that, with no
//! step on the server's side.

use crc::{Crc, Table, CRC_64_ECMA_182};
use nessie_fabric::RegionId;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Region of every node holding its Pilaf hash table (Pilaf mode only).
pub const TABLE_REGION: RegionId = 5;
/// Region of every node holding its Pilaf extents (Pilaf mode only).
pub const EXTENT_REGION: RegionId = 6;
/// Candidate entries per key (Pilaf's 3-way cuckoo hashing).
pub const WAYS: usize = 3;
/// Bytes of one hash-table entry (five words).
pub const ENTRY_BYTES: u64 = 40;
/// Bytes before the first entry of the table region: the move sequence word, then reserved.
pub const TABLE_HEADER: u64 = 64;
/// Offset of the move sequence word in the table region.
pub const MOVE_SEQ_OFFSET: u64 = 0;
/// Bytes of an extent's length word.
pub const EXTENT_HEADER: u64 = 8;
/// Most entries per node: offsets must fit the 40 offset bits of an entry's extent word, and
/// the table region stays within the same 1 TiB bound.
pub const MAX_ENTRIES: u64 = (1 << 40) / ENTRY_BYTES;
/// Largest extent region per node (offsets are 40 bits).
pub const MAX_EXTENT_BYTES: u64 = 1 << 40;
/// The in-use flag in an entry's extent word.
const IN_USE: u64 = 1 << 63;
/// Mask of the extent offset in an entry's extent word.
const OFFSET_MASK: u64 = (1 << 40) - 1;

/// Seeds of the key hash and of the candidates derived from it. Part of the format.
const KEY_SEED: u64 = 0x7069_6c61_665f_6b65;
const CANDIDATE_SEEDS: [u64; WAYS] = [
    0x7069_6c61_6600_0001,
    0x7069_6c61_6600_0002,
    0x7069_6c61_6600_0003,
];

/// The CRC64 of entries and extents (Pilaf's checksum width): CRC-64/ECMA-182, a standard
/// polynomial; it is part of the format. Slice-by-16 tables: a byte-at-a-time CRC of a 16 KiB
/// extent took about ten times as long as the READs of a GET.
static CRC64: Crc<u64, Table<16>> = Crc::<u64, Table<16>>::new(&CRC_64_ECMA_182);

/// CRC64 of `bytes`.
pub fn crc64(bytes: &[u8]) -> u64 {
    CRC64.checksum(bytes)
}

fn pad8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

fn word(buf: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
}

/// The hash a key is known by in the table.
pub fn key_hash(key: &[u8]) -> u64 {
    xxh3_64_with_seed(key, KEY_SEED)
}

/// The `WAYS` distinct candidate entries of a key with hash `h` in a table of `entries`
/// (≥ `WAYS`) entries. Derived from the hash alone, so the server can find where an entry may
/// move to without reading its key.
pub fn candidates(h: u64, entries: u64) -> [u64; WAYS] {
    debug_assert!(entries >= WAYS as u64);
    let mut out = [u64::MAX; WAYS];
    for i in 0..WAYS {
        let mut seed = CANDIDATE_SEEDS[i];
        loop {
            let c = xxh3_64_with_seed(&h.to_le_bytes(), seed) % entries;
            if !out[..i].contains(&c) {
                out[i] = c;
                break;
            }
            seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        }
    }
    out
}

/// Offset of entry `i` in the table region.
pub fn entry_offset(i: u64) -> u64 {
    TABLE_HEADER + i * ENTRY_BYTES
}

/// Bytes of the table region for `entries` entries.
pub fn table_bytes(entries: u64) -> u64 {
    TABLE_HEADER + entries * ENTRY_BYTES
}

/// A hash-table entry that is in use: a key's pointer to its extent.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key_hash: u64,
    /// Byte offset of the extent in the extent region.
    pub offset: u64,
    /// Bytes of the extent.
    pub size: u64,
    /// CRC64 of the extent's bytes.
    pub extent_crc: u64,
}

/// What reading an entry found.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Slot {
    Empty,
    Used(Entry),
    /// The entry CRC did not match: the READ overlapped a write of the entry.
    Torn,
}

impl Entry {
    /// The entry's bytes, checksum included.
    pub fn encode(&self) -> [u8; ENTRY_BYTES as usize] {
        debug_assert!(self.offset <= OFFSET_MASK && self.size.is_multiple_of(8));
        let words = [
            self.key_hash,
            IN_USE | self.offset,
            self.size,
            self.extent_crc,
        ];
        let mut out = [0u8; ENTRY_BYTES as usize];
        for (i, w) in words.iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        let crc = crc64(&out[..32]);
        out[32..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decode an entry READ from the table; `verify = false` skips the checksum (only the
    /// mutation test does that).
    pub fn decode(buf: &[u8], verify: bool) -> Slot {
        debug_assert_eq!(buf.len(), ENTRY_BYTES as usize);
        if buf.iter().all(|&b| b == 0) {
            return Slot::Empty;
        }
        if verify && crc64(&buf[..32]) != word(buf, 4) {
            return Slot::Torn;
        }
        let ext = word(buf, 1);
        if ext & IN_USE == 0 {
            // Only a torn entry (or a skipped check) can look like this.
            return if verify { Slot::Torn } else { Slot::Empty };
        }
        Slot::Used(Entry {
            key_hash: word(buf, 0),
            offset: ext & OFFSET_MASK,
            size: word(buf, 2),
            extent_crc: word(buf, 3),
        })
    }
}

/// The bytes of an extent holding `key` and `value` (appended to `out`, which is cleared).
pub fn encode_extent(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    out.clear();
    let lens = key.len() as u64 | (value.len() as u64) << 32;
    out.extend_from_slice(&lens.to_le_bytes());
    out.extend_from_slice(key);
    out.resize(pad8(out.len() as u64) as usize, 0);
    out.extend_from_slice(value);
    out.resize(pad8(out.len() as u64) as usize, 0);
}

/// Bytes of the extent of a key and value of these lengths.
pub fn extent_size(key_len: usize, value_len: usize) -> u64 {
    EXTENT_HEADER + pad8(key_len as u64) + pad8(value_len as u64)
}

/// An extent's key and value, borrowed from the bytes read.
#[derive(Debug, PartialEq, Eq)]
pub struct Extent<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// Why the bytes read for an extent are not one (possible only if a check was skipped, or a
/// node wrote garbage).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("extent of {size} bytes cannot hold a key of {key} and a value of {value} bytes")]
pub struct BadExtent {
    pub size: u64,
    pub key: u64,
    pub value: u64,
}

/// Decode an extent from `buf` (its bytes as read, `entry.size` long).
pub fn decode_extent(buf: &[u8]) -> Result<Extent<'_>, BadExtent> {
    let size = buf.len() as u64;
    let bad = |key, value| BadExtent { size, key, value };
    if size < EXTENT_HEADER {
        return Err(bad(0, 0));
    }
    let lens = word(buf, 0);
    let (k, v) = (lens & 0xffff_ffff, lens >> 32);
    if EXTENT_HEADER + pad8(k) + pad8(v) > size {
        return Err(bad(k, v));
    }
    let ks = EXTENT_HEADER as usize;
    let vs = ks + pad8(k) as usize;
    Ok(Extent {
        key: &buf[ks..ks + k as usize],
        value: &buf[vs..vs + v as usize],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry {
            key_hash: key_hash(b"k"),
            offset: 4096,
            size: 24,
            extent_crc: 0xdead_beef,
        }
    }

    #[test]
    fn entries_round_trip_and_zeroed_memory_is_empty() {
        let e = entry();
        assert_eq!(Entry::decode(&e.encode(), true), Slot::Used(e));
        assert_eq!(Entry::decode(&[0u8; 40], true), Slot::Empty);
        let largest = Entry {
            offset: MAX_EXTENT_BYTES - 8,
            ..e
        };
        assert_eq!(Entry::decode(&largest.encode(), true), Slot::Used(largest));
    }

    /// Every mix of the words of two entries (what a READ overlapping a write may return) is
    /// rejected by the entry CRC, and so is every mix of an entry with the empty entry.
    #[test]
    fn every_torn_mix_of_two_entries_is_rejected() {
        let a = entry().encode();
        let b = Entry {
            key_hash: key_hash(b"other"),
            offset: 64,
            size: 40,
            extent_crc: 7,
        }
        .encode();
        for old in [a, [0u8; 40]] {
            for mask in 1u32..31 {
                let mut mix = old;
                for w in 0..5 {
                    if mask & (1 << w) != 0 {
                        mix[w * 8..w * 8 + 8].copy_from_slice(&b[w * 8..w * 8 + 8]);
                    }
                }
                assert_eq!(Entry::decode(&mix, true), Slot::Torn, "mask {mask:05b}");
            }
        }
        // Without verification a torn mix passes as an entry: what the mutation test relies on.
        let mut mix = a;
        mix[8..16].copy_from_slice(&b[8..16]);
        assert!(matches!(Entry::decode(&mix, false), Slot::Used(_)));
    }

    #[test]
    fn extents_round_trip_padded_to_words() {
        let mut buf = Vec::new();
        for (k, v) in [
            (&b"k"[..], &b""[..]),
            (b"key-0001", b"value"),
            (b"kk", &[7u8; 33]),
        ] {
            encode_extent(&mut buf, k, v);
            assert_eq!(buf.len() as u64, extent_size(k.len(), v.len()));
            assert!(buf.len().is_multiple_of(8));
            let x = decode_extent(&buf).unwrap();
            assert_eq!((x.key, x.value), (k, v));
        }
        encode_extent(&mut buf, b"key", &[1u8; 20]);
        let e = decode_extent(&buf[..16]).unwrap_err();
        assert_eq!((e.key, e.value), (3, 20), "a truncated extent is refused");
        assert!(decode_extent(&buf[..4]).is_err());
    }

    #[test]
    fn candidates_are_distinct_and_in_range() {
        for entries in [3u64, 4, 7, 64, 1 << 20] {
            for i in 0..500u32 {
                let c = candidates(key_hash(&i.to_le_bytes()), entries);
                assert!(c.iter().all(|&x| x < entries), "{c:?}");
                assert!(c[0] != c[1] && c[1] != c[2] && c[0] != c[2], "{c:?}");
            }
        }
        // Pinned: the hashes are part of the format.
        assert_eq!(candidates(key_hash(b"pilaf"), 1024), PINNED);
    }

    const PINNED: [u64; WAYS] = [254, 617, 153];

    #[test]
    fn crc64_is_ecma_182() {
        // The check value of CRC-64/ECMA-182 ("123456789").
        assert_eq!(crc64(b"123456789"), 0x6c40_df5f_0b49_7347);
    }
}
