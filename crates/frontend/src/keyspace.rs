//! The commands about every key: memcached `flush_all`, Redis `FLUSHALL`, `FLUSHDB` and
//! `DBSIZE`. The store has no key list; they run on its scan of the whole index
//! (`KvClient::scan_keys`), which is not atomic: a key written while a flush runs may survive
//! it or not, as with memcached, whose flush also races with concurrent sets.

use nessie_protocols::Error;

use crate::item;
use crate::mc_serve::{run_with, Backend};

/// Delete every key in the store. Returns how many were deleted.
pub fn flush(backend: &dyn Backend) -> Result<u64, Error> {
    run_with(backend, |c| {
        let keys = c.scan_keys()?;
        for k in &keys {
            c.delete(k)?;
        }
        Ok(keys.len() as u64)
    })
}

/// How many live (unexpired) items the store holds: the scan's keys, each read back.
pub fn count(backend: &dyn Backend, now_ms: u64) -> Result<u64, Error> {
    run_with(backend, |c| {
        let mut n = 0;
        let mut buf = Vec::new();
        for k in c.scan_keys()? {
            if c.get_into(&k, &mut buf)? && item::decode(&buf, now_ms).is_some() {
                n += 1;
            }
        }
        Ok(n)
    })
}
