//! What a front end stores as a key's value: the client's flags and the expiry time in a fixed
//! header before the client's data, so that both survive in Nessie, which stores bytes only.
//!
//! ```text
//! offset  size  field
//! 0       4     magic "NIt1" (a value written by another path, e.g. `nessie put`, has none)
//! 4       4     client flags (u32 LE; memcached's `flags`)
//! 8       8     expires at (u64 LE, milliseconds since the Unix epoch; 0 = never)
//! 16      …     the client's data
//! ```
//! An expired item reads as absent. A value without the magic is served as it is, with flags 0
//! and no expiry, so keys written through the CLI or the library read back through a front end.

/// Bytes of the header before the client's data.
pub const HEADER_LEN: usize = 16;
const MAGIC: &[u8; 4] = b"NIt1";

/// memcached's rule for exptime: up to 30 days it is relative to now, beyond an absolute Unix
/// time.
pub const RELATIVE_EXPTIME_MAX: i64 = 60 * 60 * 24 * 30;

/// When an item stored at `now_ms` (Unix milliseconds) with memcached's `exptime` (seconds)
/// expires, in Unix milliseconds: `None` if it is expired already (a negative exptime, or an
/// absolute time in the past), `Some(0)` if never.
pub fn expires_at(exptime: i64, now_ms: u64) -> Option<u64> {
    let at = match exptime {
        0 => return Some(0),
        e if e < 0 => return None,
        e if e <= RELATIVE_EXPTIME_MAX => now_ms.saturating_add(e as u64 * 1000),
        e => (e as u64).saturating_mul(1000),
    };
    (at > now_ms).then_some(at)
}

/// The header of an item with `flags`, expiring at `expires` (Unix ms; 0 = never): stored
/// before its data, as `put_parts(key, &[&header(..), data])` does without copying the data.
pub fn header(flags: u32, expires: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(MAGIC);
    h[4..8].copy_from_slice(&flags.to_le_bytes());
    h[8..].copy_from_slice(&expires.to_le_bytes());
    h
}

/// The stored form of `data` with `flags`, expiring at `expires` (Unix ms; 0 = never).
pub fn encode(out: &mut Vec<u8>, flags: u32, expires: u64, data: &[u8]) {
    encode_parts(out, flags, expires, &[data]);
}

/// [`encode`] of the concatenation of `parts` (`append` and `prepend` build their data so).
pub fn encode_parts(out: &mut Vec<u8>, flags: u32, expires: u64, parts: &[&[u8]]) {
    out.clear();
    out.reserve(HEADER_LEN + parts.iter().map(|p| p.len()).sum::<usize>());
    out.extend_from_slice(&header(flags, expires));
    for p in parts {
        out.extend_from_slice(p);
    }
}

/// The store's expiry (ns since the Unix epoch, `KvClient::put_parts_expiring`) of an item
/// expiring at `expires_ms` (Unix ms; 0 = never).
pub fn store_expiry(expires_ms: u64) -> u64 {
    expires_ms.saturating_mul(1_000_000)
}

/// The expiry (Unix ms; 0 = never) in the header of a stored item: what a write of it gives
/// the store. 0 for a value without a header.
pub fn expiry_of(stored: &[u8]) -> u64 {
    decode(stored, 0).map_or(0, |it| it.expires)
}

/// A stored item as read back.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Item<'a> {
    pub flags: u32,
    /// Unix milliseconds; 0 = never.
    pub expires: u64,
    pub data: &'a [u8],
}

/// Decode a stored value read at `now_ms` (Unix milliseconds): `None` if the item has expired.
pub fn decode(stored: &[u8], now_ms: u64) -> Option<Item<'_>> {
    decode_at(stored, || now_ms)
}

/// `decode`, reading the clock (`now_ms`) only for an item that has an expiry: most have
/// none, and a clock read per GET is a measurable share of a pipelined GET.
pub fn decode_at(stored: &[u8], now_ms: impl FnOnce() -> u64) -> Option<Item<'_>> {
    let Some(rest) = stored.strip_prefix(MAGIC.as_slice()) else {
        return Some(Item {
            flags: 0,
            expires: 0,
            data: stored,
        });
    };
    if rest.len() < HEADER_LEN - MAGIC.len() {
        // Too short for a header: somebody else's bytes that happen to start like one.
        return Some(Item {
            flags: 0,
            expires: 0,
            data: stored,
        });
    }
    let flags = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes"));
    let expires = u64::from_le_bytes(rest[4..12].try_into().expect("8 bytes"));
    if expires != 0 && expires <= now_ms() {
        return None;
    }
    Some(Item {
        flags,
        expires,
        data: &rest[12..],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW_S: u64 = 1_800_000_000;
    const NOW: u64 = NOW_S * 1000 + 123;

    #[test]
    fn exptime_follows_memcached() {
        assert_eq!(expires_at(0, NOW), Some(0), "never");
        assert_eq!(expires_at(-1, NOW), None, "negative: expired at once");
        assert_eq!(expires_at(10, NOW), Some(NOW + 10_000), "relative");
        assert_eq!(
            expires_at(RELATIVE_EXPTIME_MAX, NOW),
            Some(NOW + RELATIVE_EXPTIME_MAX as u64 * 1000)
        );
        let absolute = NOW_S as i64 + 100;
        assert_eq!(
            expires_at(absolute, NOW),
            Some((NOW_S + 100) * 1000),
            "absolute"
        );
        assert_eq!(
            expires_at(NOW_S as i64, NOW),
            None,
            "absolute, this second: past"
        );
        assert_eq!(
            expires_at(RELATIVE_EXPTIME_MAX + 1, NOW),
            None,
            "absolute, past"
        );
    }

    #[test]
    fn expired_items_read_as_absent_and_foreign_values_as_they_are() {
        let mut v = Vec::new();
        encode(&mut v, 7, NOW + 5, b"data");
        let it = decode(&v, NOW).unwrap();
        assert_eq!((it.flags, it.expires, it.data), (7, NOW + 5, &b"data"[..]));
        assert_eq!(decode(&v, NOW + 5), None, "expired at its time");
        encode(&mut v, 1, 0, b"");
        assert_eq!(decode(&v, u64::MAX).unwrap().data, b"", "never expires");
        assert_eq!(decode(b"plain", NOW).unwrap().data, b"plain");
        assert_eq!(decode(b"NIt1short", NOW).unwrap().data, b"NIt1short");
    }

    proptest! {
        #[test]
        fn round_trip(flags: u32, expires in 0u64..u64::MAX, data: Vec<u8>) {
            let mut v = Vec::new();
            encode(&mut v, flags, expires, &data);
            prop_assert_eq!(v.len(), HEADER_LEN + data.len());
            let now = expires.saturating_sub(1);
            let it = decode(&v, now).unwrap();
            prop_assert_eq!((it.flags, it.expires, it.data), (flags, expires, &data[..]));
        }
    }
}
