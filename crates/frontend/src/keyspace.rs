//! The commands about every key: memcached `flush_all`, Redis `FLUSHALL`, `FLUSHDB` and
//! `DBSIZE`. The store has no key list; they run on its scan of the whole index
//! (`KvClient::scan_keys`), which is not atomic: a key written while a flush runs may survive
//! it or not, as with memcached, whose flush also races with concurrent sets.

use nessie_protocols::{Error, KvClient};

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
