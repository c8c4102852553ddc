//! The commands about every key: memcached `flush_all`, Redis `FLUSHALL`, `FLUSHDB` and
//! `DBSIZE`. The store has no key list; they run on its scan of the whole index
//! (`KvClient::scan_keys`), which is not atomic: a key written while a flush runs may survive
//! it or not, as with memcached, whose flush also races with concurrent sets.

use nessie_protocols::{Cond, CondOutcome, Error, KvClient, Version};

use crate::item;

/// Delete every key in the store with client `c`. Returns how many were deleted.
pub fn flush(c: &mut dyn KvClient) -> Result<u64, Error> {
    let keys = c.scan_keys()?;
    for k in &keys {
        c.delete(k)?;
    }
    Ok(keys.len() as u64)
}

/// The live items of the store, counted (`DBSIZE`, `INFO keyspace`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Live (unexpired) items.
    pub keys: u64,
    /// Of them, those with an expiry time.
    pub expires: u64,
    /// The sum of their expiry times (Unix ms).
    expiry_sum: u128,
}

impl Census {
    /// The mean time to live of the items with an expiry, in ms at `now_ms` (0 if none).
    pub fn avg_ttl_ms(&self, now_ms: u64) -> u64 {
        match self.expires {
            0 => 0,
            n => (self.expiry_sum / n as u128).saturating_sub(now_ms as u128) as u64,
        }
    }
}

/// Count the live (unexpired) items the store holds, with client `c`: the scan's keys, each
/// read back.
pub fn census(c: &mut dyn KvClient, now_ms: u64) -> Result<Census, Error> {
    let mut n = Census::default();
    let mut buf = Vec::new();
    for k in c.scan_keys()? {
        if !c.get_into(&k, &mut buf)? {
            continue;
        }
        let Some(it) = item::decode(&buf, now_ms) else {
            continue;
        };
        n.keys += 1;
        if it.expires != 0 {
            n.expires += 1;
            n.expiry_sum += it.expires as u128;
        }
    }
    Ok(n)
}

/// What one window of [`reclaim_expired`] did.
pub use nessie_protocols::Reclaimed;

/// Delete the expired items among the keys of index slots `slots`, with client `c`, at
/// `now_ms` (Unix ms): an expired item already reads as absent, but holds its memory until it
/// is deleted. Each delete is the protocol's own, conditional on the version that was read
/// expired (`Cond::Version`), so a key rewritten meanwhile keeps its new value, and the
/// reclaiming is as linearizable (and as replicated) as any client's DELETE.
pub fn reclaim_expired(
    c: &mut dyn KvClient,
    slots: std::ops::Range<u64>,
    now_ms: u64,
) -> Result<Reclaimed, Error> {
    // The store's own expiry, where it keeps one: the entries say when they expire, and no
    // value is read. Every front-end write gives the store its item's expiry.
    if let Some(r) = c.reclaim_expired_in(slots.clone())? {
        return Ok(r);
    }
    let mut r = Reclaimed::default();
    let mut buf = Vec::new();
    for k in c.scan_keys_in(slots)? {
        r.keys += 1;
        let Some(version) = c.get_versioned(&k, &mut buf)? else {
            continue;
        };
        if item::decode(&buf, now_ms).is_some() {
            continue; // live, or not a front end's item
        }
        r.expired += 1;
        if reclaim_one(c, &k, version)? == CondOutcome::Stored {
            r.deleted += 1;
        }
    }
    Ok(r)
}

/// Delete `key` if it is still at `version`, the version read expired.
fn reclaim_one(c: &mut dyn KvClient, key: &[u8], version: Version) -> Result<CondOutcome, Error> {
    #[cfg(test)]
    if MUTATE_UNCONDITIONAL.with(|m| m.get()) {
        return c.delete_if(key, Cond::Present);
    }
    c.delete_if(key, Cond::Version(version))
}

#[cfg(test)]
thread_local! {
    /// The mutation: reclaiming deletes the key whatever its version now (as a plain DELETE
    /// would; written as a delete if present, so that the test's race runs before it).
    static MUTATE_UNCONDITIONAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{MapClient, RacingClient};

    const NOW: u64 = 1_800_000_000_000;

    fn stored(expires: u64, data: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        item::encode(&mut v, 0, expires, data);
        v
    }

    fn filled() -> MapClient {
        let mut m = MapClient::default();
        m.put(b"a-live", &stored(NOW + 60_000, b"1")).unwrap();
        m.put(b"b-expired", &stored(NOW - 1, b"2")).unwrap();
        m.put(b"c-never", &stored(0, b"3")).unwrap();
        m.put(b"d-plain", b"not an item").unwrap();
        m.put(b"e-expired", &stored(NOW, b"5")).unwrap();
        m
    }

    #[test]
    fn only_expired_items_are_deleted_a_window_at_a_time() {
        let mut m = filled();
        let mut total = Reclaimed::default();
        // Last window first: the map's "slots" are its keys' ranks, which a delete shifts.
        for from in [4, 2, 0] {
            total += reclaim_expired(&mut m, from..from + 2, NOW).unwrap();
        }
        assert_eq!(
            total,
            Reclaimed {
                keys: 5,
                expired: 2,
                deleted: 2,
                unfetched: 0,
            }
        );
        let mut left: Vec<_> = m.0.keys().cloned().collect();
        left.sort();
        assert_eq!(left, [&b"a-live"[..], b"c-never", b"d-plain"]);
    }

    /// The race: the key is rewritten with a live item between the reclaimer's read, which
    /// found it expired, and its delete. The conditional delete leaves the new value; the
    /// mutation (a plain DELETE) loses it.
    #[test]
    fn an_item_rewritten_after_it_was_read_expired_is_kept() {
        for mutated in [false, true] {
            MUTATE_UNCONDITIONAL.with(|m| m.set(mutated));
            let mut c = RacingClient::new(filled(), 1, |m| {
                m.put(b"b-expired", &stored(NOW + 60_000, b"new")).unwrap();
            });
            let r = reclaim_expired(&mut c, 1..2, NOW).unwrap();
            MUTATE_UNCONDITIONAL.with(|m| m.set(false));
            assert_eq!(c.races_run(), 1);
            let now = c.inner.get(b"b-expired").unwrap();
            if mutated {
                assert_eq!(now, None, "the mutation deletes the rewritten key");
                assert_eq!(r.deleted, 1);
            } else {
                assert_eq!(
                    now,
                    Some(stored(NOW + 60_000, b"new")),
                    "the new value stays"
                );
                assert_eq!((r.expired, r.deleted), (1, 0));
            }
        }
    }
}
