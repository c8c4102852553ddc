//! A GET's reply built around the value, which is READ straight into the reply buffer rather
//! than into a scratch buffer and copied behind the reply's header.
//!
//! A stored item is its header ([`item::HEADER_LEN`] bytes: flags, expiry) then its data; a
//! reply is a header line (RESP's `$<len>\r\n`, memcached's `VALUE <key> <flags> <bytes>\r\n`),
//! the data and `\r\n`. So the item is read to start where its data lands right behind the
//! reply's header, whose length is guessed (as the last reply's): a header shorter than the
//! item's header puts the item's start before the end of the replies already buffered, and the
//! bytes it covers are kept aside and put back. The item's header is decoded before the
//! reply's is written over it. When the guess misses (a length with more or fewer digits,
//! other flags, a value without an item header, or too few bytes buffered to reach back over),
//! the data is moved into place within the buffer.

use nessie_protocols::{Error, KvClient};

use crate::item;

/// Digits of `n` in decimal.
pub fn decimal_len(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Write `n` in decimal into `dst`, exactly [`decimal_len`]`(n)` bytes.
pub fn write_decimal(dst: &mut [u8], mut n: u64) {
    assert_eq!(dst.len(), decimal_len(n), "room for the digits");
    for d in dst.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// A reply's header line for an item.
pub trait ReplyHead {
    /// Its length for an item with `flags` and `len` bytes of data.
    fn len(&self, flags: u32, len: usize) -> usize;
    /// Write it into `dst`, exactly [`Self::len`] bytes.
    fn write(&self, dst: &mut [u8], flags: u32, len: usize);
}

/// An item whose reply was appended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub flags: u32,
    /// The length of the reply's header line (the next guess).
    pub head_len: usize,
}

/// Append the reply to a GET of `key` to `out` (header line, data, `\r\n`), the header line
/// guessed `guess` bytes long; `None` (nothing appended) if the key is absent or its item
/// expired at `now` (Unix ms, read only for an item with an expiry).
pub fn reply_in_place(
    c: &mut dyn KvClient,
    key: &[u8],
    out: &mut Vec<u8>,
    guess: usize,
    now: impl FnOnce() -> u64,
    head: &impl ReplyHead,
) -> Result<Option<Placed>, Error> {
    let start = out.len();
    // Where the item starts for its data to land `guess` bytes after `start`.
    let at = if guess >= item::HEADER_LEN {
        start + (guess - item::HEADER_LEN)
    } else if start >= item::HEADER_LEN - guess {
        start - (item::HEADER_LEN - guess)
    } else {
        start // too little buffered to reach back over: the data will move
    };
    let kept_from = at.min(start);
    let mut kept = [0u8; item::HEADER_LEN];
    let kept = &mut kept[..start - kept_from];
    kept.copy_from_slice(&out[kept_from..start]);
    out.resize(out.len().max(at), 0); // room for a long header line, written below
    let put_back = |out: &mut Vec<u8>| {
        out.truncate(kept_from);
        out.extend_from_slice(kept);
    };
    let found = c.get_into_at(key, out, at);
    let (flags, off, len) =
        match found.map(|f| f.then(|| item::decode_at(&out[at..], now)).flatten()) {
            Ok(Some(it)) => {
                let off = it.data.as_ptr() as usize - out[at..].as_ptr() as usize;
                (it.flags, off, it.data.len())
            }
            Ok(None) => {
                put_back(out);
                return Ok(None);
            }
            Err(e) => {
                put_back(out);
                return Err(e);
            }
        };
    let h = head.len(flags, len);
    let (src, dst) = (at + off, start + h);
    if src != dst {
        out.resize(out.len().max(dst + len), 0);
        out.copy_within(src..src + len, dst);
        out.truncate(dst + len);
    }
    // The data now lies behind `start + h`: what was kept aside goes back before `start`.
    out[kept_from..start].copy_from_slice(kept);
    head.write(&mut out[start..dst], flags, len);
    out.extend_from_slice(b"\r\n");
    Ok(Some(Placed { flags, head_len: h }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memcached::proto::{encode_value, ValueHead};
    use crate::redis::resp::BulkHead;
    use crate::testing::MapClient;
    use proptest::prelude::*;

    const NOW: u64 = 1_800_000_000_000;

    /// How a key is stored in a case.
    #[derive(Copy, Clone, Debug)]
    enum Stored {
        Item,
        Expired,
        /// Bytes written by another path (no item header): served as they are, flags 0.
        Foreign,
        Absent,
    }

    fn stored() -> impl Strategy<Value = Stored> {
        prop_oneof![
            Just(Stored::Item),
            Just(Stored::Expired),
            Just(Stored::Foreign),
            Just(Stored::Absent)
        ]
    }

    /// A hit's flags and data.
    type Hit = (u32, Vec<u8>);

    /// Store `data` as `how` says, read it in place behind `prior` with `guess`, and return
    /// the buffer, what was placed, and what a hit must show.
    fn run(
        head: &impl ReplyHead,
        prior: &[u8],
        guess: usize,
        flags: u32,
        data: &[u8],
        how: Stored,
    ) -> (Vec<u8>, Option<Placed>, Option<Hit>) {
        let mut c = MapClient::default();
        let mut v = Vec::new();
        let want = match how {
            Stored::Item => {
                item::encode(&mut v, flags, NOW + 1, data);
                Some((flags, data.to_vec()))
            }
            Stored::Expired => {
                item::encode(&mut v, flags, NOW, data);
                None
            }
            Stored::Foreign => {
                v = [b"x".as_slice(), data].concat();
                Some((0, v.clone()))
            }
            Stored::Absent => None,
        };
        if !matches!(how, Stored::Absent) {
            c.put(b"k", &v).unwrap();
        }
        let mut out = prior.to_vec();
        let placed = reply_in_place(&mut c, b"k", &mut out, guess, || NOW, head).unwrap();
        (out, placed, want)
    }

    proptest! {
        /// A GET's value read in place makes the bulk reply of its data behind the replies
        /// already in the buffer, which stay as they were, whatever the guess: items, values
        /// without an item header, and, absent or expired, nothing.
        #[test]
        fn a_resp_reply_read_in_place_is_the_bulk_string_behind_what_was_there(
            prior in proptest::collection::vec(any::<u8>(), 0..40),
            guess in 0usize..40,
            flags: u32,
            data in proptest::collection::vec(any::<u8>(), 0..984),
            how in stored(),
        ) {
            let (out, placed, want) = run(&BulkHead, &prior, guess, flags, &data, how);
            let mut expect = prior.clone();
            if let Some((_, d)) = &want {
                expect.extend_from_slice(format!("${}\r\n", d.len()).as_bytes());
                expect.extend_from_slice(d);
                expect.extend_from_slice(b"\r\n");
            }
            prop_assert_eq!(out, expect);
            prop_assert_eq!(placed.is_some(), want.is_some());
            if let (Some(p), Some((_, d))) = (placed, &want) {
                prop_assert_eq!(p.head_len, format!("${}\r\n", d.len()).len());
            }
        }

        /// The same for memcached's `VALUE` line, whose length also depends on the flags read
        /// with the value.
        #[test]
        fn a_memcached_hit_read_in_place_is_its_value_line_and_data(
            prior in proptest::collection::vec(any::<u8>(), 0..40),
            guess in 0usize..60,
            flags in prop_oneof![Just(0u32), any::<u32>()],
            data in proptest::collection::vec(any::<u8>(), 0..984),
            how in stored(),
        ) {
            let (out, placed, want) = run(&ValueHead(b"k"), &prior, guess, flags, &data, how);
            let mut expect = prior.clone();
            if let Some((f, d)) = &want {
                encode_value(&mut expect, b"k", *f, d, None);
            }
            prop_assert_eq!(out, expect);
            prop_assert_eq!(placed.map(|p| p.flags), want.map(|w| w.0));
        }
    }

    #[test]
    fn decimals_are_written_in_full() {
        for n in [0, 7, 9, 10, 99, 100, 16384, u64::MAX] {
            let mut d = vec![0; decimal_len(n)];
            write_decimal(&mut d, n);
            assert_eq!(d, n.to_string().as_bytes());
        }
    }
}
