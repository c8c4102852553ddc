//! LRU cache of remote DTEs keyed by the ITE that referred to them.
//!
//! An ITE names a unique (data table, entry) pair, and that entry cannot be reused until an
//! expiry period after the ITE stopped referring to it. So a DTE read through ITE `i` at time
//! `t` is a faithful copy of whatever `i` refers to until `t + expiry`: entries carry that
//! deadline, are treated as misses (and evicted) once it has passed, and a hit through an ITE
//! read at time `t'` extends it to `t' + expiry`. Only valid entries are cached (the valid flag
//! is the one field that changes). Caches are per client worker: no locks on the hot path.

use lru::LruCache;
use std::num::NonZeroUsize;

struct Entry {
    expires_ns: u64,
    bytes: Box<[u8]>,
}

pub struct DteCache {
    lru: Option<LruCache<u64, Entry>>,
    hits: u64,
    misses: u64,
    expired: u64,
}

/// Cache effectiveness counters.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub expired: u64,
    pub len: usize,
}

impl DteCache {
    /// A cache of at most `entries` DTEs (0 disables caching).
    pub fn new(entries: usize) -> Self {
        Self {
            lru: NonZeroUsize::new(entries).map(LruCache::new),
            hits: 0,
            misses: 0,
            expired: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.lru.is_some()
    }

    /// Look up the DTE referred to by `ite`, read at `ite_read_ns`. On a hit the entry's
    /// deadline becomes `ite_read_ns + expiry_ns`.
    pub fn get(
        &mut self,
        ite: u64,
        now_ns: u64,
        ite_read_ns: u64,
        expiry_ns: u64,
    ) -> Option<&[u8]> {
        let lru = self.lru.as_mut()?;
        let live = match lru.peek(&ite) {
            None => {
                self.misses += 1;
                return None;
            }
            Some(e) => now_ns < e.expires_ns,
        };
        if !live {
            lru.pop(&ite);
            self.expired += 1;
            self.misses += 1;
            return None;
        }
        self.hits += 1;
        let e = lru.get_mut(&ite).expect("present");
        e.expires_ns = e.expires_ns.max(ite_read_ns + expiry_ns);
        Some(&e.bytes)
    }

    /// Remember a valid DTE read through `ite` at `ite_read_ns`: the concatenation of `parts`
    /// (an entry whose value was read apart from its header comes in two).
    pub fn insert(&mut self, ite: u64, parts: &[&[u8]], ite_read_ns: u64, expiry_ns: u64) {
        if let Some(lru) = self.lru.as_mut() {
            lru.put(
                ite,
                Entry {
                    expires_ns: ite_read_ns + expiry_ns,
                    bytes: parts.concat().into_boxed_slice(),
                },
            );
        }
    }

    /// Forget every entry (the counters stay).
    pub fn clear(&mut self) {
        if let Some(lru) = self.lru.as_mut() {
            lru.clear();
        }
    }

    /// Overwrite bytes `off..` of the cached copy of `ite`'s DTE, if any, with `bytes`: the
    /// access word a GET just wrote (the one field besides the valid flag that changes).
    pub fn patch(&mut self, ite: u64, off: usize, bytes: &[u8]) {
        if let Some(e) = self.lru.as_mut().and_then(|l| l.peek_mut(&ite)) {
            if let Some(dst) = e.bytes.get_mut(off..off + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
        }
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits,
            misses: self.misses,
            expired: self.expired,
            len: self.lru.as_ref().map_or(0, |l| l.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hit_extends_and_expiry_evicts() {
        let mut c = DteCache::new(2);
        c.insert(1, &[b"on", b"e"], 100, 50); // valid until 150
        assert_eq!(c.get(1, 120, 140, 50), Some(&b"one"[..])); // extended to 190
        assert_eq!(
            c.get(1, 180, 180, 50),
            Some(&b"one"[..]),
            "extension took effect"
        );
        assert_eq!(c.get(1, 231, 231, 50), None, "expired at 230");
        assert_eq!(c.stats().expired, 1);
        assert_eq!(c.stats().len, 0, "expired entry was evicted");
    }

    #[test]
    fn lru_capacity_and_disabled() {
        let mut c = DteCache::new(2);
        c.insert(1, &[b"a"], 0, 1000);
        c.insert(2, &[b"b"], 0, 1000);
        c.get(1, 1, 1, 1000);
        c.insert(3, &[b"c"], 0, 1000);
        assert!(
            c.get(2, 1, 1, 1000).is_none(),
            "least recently used was evicted"
        );
        assert!(c.get(1, 1, 1, 1000).is_some());
        let mut off = DteCache::new(0);
        off.insert(1, &[b"a"], 0, 1000);
        assert!(!off.enabled() && off.get(1, 0, 0, 1000).is_none());
    }
}
