//! A scan of the whole index: every key with a valid entry, read one-sidedly from every
//! node's index and data tables. Not part of the paper's protocol and not atomic: a key
//! written or deleted during the scan may or may not be listed. It is what an administrative
//! "flush everything" (memcached `flush_all`, Redis `FLUSHALL`) and a key count (`DBSIZE`)
//! are built on; a hash store has no order to scan in, so nothing serves range reads.

use nessie_fabric::{Endpoint, RemoteAddr};
use nessie_store::dte::DteMeta;
use nessie_store::{Ite, DATA_REGION};

use super::{Abort, CdClient};
use crate::error::Error;

/// Most keys one scan returns: a bound on the memory it takes (16 M keys of up to a few
/// hundred bytes).
pub const MAX_SCAN_KEYS: usize = 1 << 24;

impl<E: Endpoint> CdClient<E> {
    /// Every key whose entry is valid when the scan reads it, each once per entry (a key
    /// being rewritten may appear twice), in index order.
    pub fn scan_keys(&mut self) -> Result<Vec<Vec<u8>>, Error> {
        self.scan_keys_in(0..self.view.geometry.total_ites())
    }

    /// [`Self::scan_keys`] of index slots `slots` only (a window of `0..total_ites()`): what
    /// background work that walks the index a window at a time reads (the front ends'
    /// reclaiming of expired items).
    pub fn scan_keys_in(&mut self, slots: std::ops::Range<u64>) -> Result<Vec<Vec<u8>>, Error> {
        let mut keys = Vec::new();
        self.scan_window(slots, |_, _, key| {
            keys.push(key.to_vec());
            if keys.len() >= MAX_SCAN_KEYS {
                return Err(Error::Unsupported(format!(
                    "the scan stopped at {MAX_SCAN_KEYS} keys"
                )));
            }
            Ok(())
        })?;
        Ok(keys)
    }

    /// Delete the expired items of index slots `slots` (a window of `0..total_ites()`): each
    /// entry's expiry word is read with its header and key, never its value, and each expired
    /// item is deleted by the protocol's DELETE conditional on the ITE word read, its version
    /// (`Cond::Version`): a key rewritten meanwhile keeps its new value, and the reclaiming is
    /// linearizable and replicated as any DELETE is.
    pub fn reclaim_expired_in(
        &mut self,
        slots: std::ops::Range<u64>,
    ) -> Result<crate::Reclaimed, Error> {
        self.reclaim_expired_noting(slots, &mut |_| {})
    }

    /// [`Self::reclaim_expired_in`], telling `note` of every key the window holds (a layer
    /// above, `crate::large`, finds its chunks so without a second scan).
    pub fn reclaim_expired_noting(
        &mut self,
        slots: std::ops::Range<u64>,
        note: &mut dyn FnMut(&crate::ScanNote),
    ) -> Result<crate::Reclaimed, Error> {
        let mut r = crate::Reclaimed::default();
        let mut expired = Vec::new();
        let now = self.ep.now_ns();
        self.scan_window(slots, |ite, meta, key| {
            r.keys += 1;
            let is_expired = meta.expired_at(now);
            note(&crate::ScanNote {
                key,
                expired: is_expired,
                fetched: meta.access.fetched(),
            });
            if is_expired {
                expired.push((key.to_vec(), ite.0, meta.access.fetched()));
            }
            Ok(())
        })?;
        r.expired = expired.len() as u64;
        self.see_expired = true;
        // Its DELETEs never evict (as an eviction's own DELETE does not): giving back an
        // expired item's memory must not take a live one's. Without room for a DELETE's
        // marker the window fails, and the next sweep tries again.
        // (What an earlier operation evicted is not this reclaim's: forgotten first, as
        // every operation does, since its DELETEs below do not clear the lists.)
        self.clear_evicted();
        let evicting = std::mem::replace(&mut self.evicting, true);
        let mut result = Ok(());
        for (key, version, fetched) in expired {
            // On the version read expired: a key rewritten since is not this item any more.
            let cond = if mutated!(self.cfg, reclaim_unconditionally) {
                crate::Cond::Present
            } else {
                crate::Cond::Version(version)
            };
            match self.delete_if(&key, cond) {
                Ok(crate::CondOutcome::Stored) => {
                    r.deleted += 1;
                    r.unfetched += u64::from(!fetched);
                }
                Ok(crate::CondOutcome::Unmet { .. }) => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.see_expired = false;
        self.evicting = evicting;
        result.map(|()| r)
    }

    /// Read index slots `slots` (a window of `0..total_ites()`) and the fixed part and key of
    /// each entry they name, and give `f` each valid, unreleased item's ITE, header and key.
    /// An entry recycled under the scan decodes as garbage or as another key: giving it is
    /// harmless (the scan is not atomic anyway, and a DELETE conditional on the ITE read
    /// finds it unmet); one with a bad length is skipped.
    fn scan_window(
        &mut self,
        slots: std::ops::Range<u64>,
        mut f: impl FnMut(Ite, &DteMeta, &[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let total = self.view.geometry.total_ites();
        if slots.start > slots.end || slots.end > total {
            return Err(Error::Config(format!(
                "index slots {}..{} are not within the index's 0..{total}",
                slots.start, slots.end
            )));
        }
        self.check_fence().map_err(|a| self.scan_error(a))?;
        let mut buf = Vec::new();
        for slot in slots {
            let (ite, _) = self.read_ite(slot).map_err(|a| self.scan_error(a))?;
            if ite.is_empty() {
                continue;
            }
            let loc = self.dte_location(ite);
            buf.resize(self.meta_len(loc), 0);
            if loc.node == self.ep.node() {
                self.ep.local_read(DATA_REGION, loc.off, &mut buf)?;
            } else {
                self.ep
                    .read(RemoteAddr::new(loc.node, DATA_REGION, loc.off), &mut buf)?;
            }
            let Ok(meta) = self.view.dte.meta(&buf) else {
                continue;
            };
            if meta.valid && meta.recycle.is_none() && !meta.tombstone {
                f(ite, &meta, self.view.dte.key(&buf, &meta))?;
            }
        }
        Ok(())
    }

    fn scan_error(&mut self, a: Abort) -> Error {
        self.abort_to_error(a)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::InProcCluster;

    #[test]
    fn a_scan_lists_every_key_once() {
        let c = InProcCluster::small();
        let mut w = c.client(0);
        for i in 0..30u8 {
            let mut other = c.client(u16::from(i % 3));
            other.put(&[b'k', i], &[i; 9]).unwrap();
        }
        w.delete(&[b'k', 7]).unwrap();
        w.put(&[b'k', 8], b"again").unwrap();
        let mut keys = c.client(2).scan_keys().unwrap();
        keys.sort();
        let want: Vec<Vec<u8>> = (0..30u8)
            .filter(|&i| i != 7)
            .map(|i| vec![b'k', i])
            .collect();
        assert_eq!(keys, want);
        // Windows of the index list the same keys, each in its window.
        let total = c.view.geometry.total_ites();
        let mut windowed = Vec::new();
        for from in (0..total).step_by(37) {
            windowed.extend(w.scan_keys_in(from..(from + 37).min(total)).unwrap());
        }
        windowed.sort();
        assert_eq!(windowed, keys);
        let e = w.scan_keys_in(0..total + 1).unwrap_err().to_string();
        assert!(e.contains("not within the index"), "{e}");
        for k in keys {
            w.delete(&k).unwrap();
        }
        assert!(w.scan_keys().unwrap().is_empty());
    }
    /// An item expiring reads as absent from its expiry on, from every node; a conditional
    /// write finds it absent too and replaces it; the reclaim deletes it (and only it), by
    /// its entry's expiry word, conditionally on its version. The mutation (GETs ignore the
    /// expiry) is caught.
    #[test]
    fn expired_items_read_absent_and_are_reclaimed() {
        use crate::config::{Mutations, ProtocolConfig};
        use crate::{Cond, CondOutcome};
        for mutate in [false, true] {
            let cfg = ProtocolConfig {
                mutations: Mutations {
                    ignore_expiry: mutate,
                    ..Mutations::default()
                },
                ..super::super::testkit::fast_cfg()
            };
            let c = InProcCluster::new(super::super::testkit::small_geometry(), cfg);
            let (mut w, mut r) = (c.client(0), c.client(1));
            let soon = nessie_fabric::wall_clock_ns() + 30_000_000;
            let later = soon + 3_600_000_000_000;
            w.put_parts_expiring(b"short", &[b"a", b"b"], soon).unwrap();
            w.put_parts_expiring(b"long", &[b"v"], later).unwrap();
            w.put(b"never", b"v").unwrap();
            w.put_parts_expiring(b"cond", &[b"v"], soon).unwrap();
            assert_eq!(r.get(b"short").unwrap().as_deref(), Some(&b"ab"[..]));
            std::thread::sleep(std::time::Duration::from_millis(40));
            let got = r.get(b"short").unwrap();
            if mutate {
                assert_eq!(got.as_deref(), Some(&b"ab"[..]), "the mutation reads it");
                continue;
            }
            assert_eq!(got, None, "expired: absent");
            let mut buf = Vec::new();
            assert_eq!(r.get_versioned(b"short", &mut buf).unwrap(), None);
            assert!(r.get(b"long").unwrap().is_some() && r.get(b"never").unwrap().is_some());
            // A conditional write judges it absent, and its value replaces the expired one.
            assert_eq!(
                r.put_if(b"cond", b"new", Cond::Present).unwrap(),
                CondOutcome::Unmet { current: None }
            );
            assert_eq!(
                r.put_if(b"cond", b"new", Cond::Absent).unwrap(),
                CondOutcome::Stored
            );
            assert_eq!(w.get(b"cond").unwrap().as_deref(), Some(&b"new"[..]));
            // The reclaim, a window at a time, deletes the one expired item.
            let total = c.view.geometry.total_ites();
            let mut done = crate::Reclaimed::default();
            for from in (0..total).step_by(50) {
                done += w.reclaim_expired_in(from..(from + 50).min(total)).unwrap();
            }
            assert_eq!((done.keys, done.expired, done.deleted), (4, 1, 1));
            let mut keys = w.scan_keys().unwrap();
            keys.sort();
            assert_eq!(
                keys,
                vec![b"cond".to_vec(), b"long".to_vec(), b"never".to_vec()]
            );
            let again = w.reclaim_expired_in(0..total).unwrap();
            assert_eq!((again.keys, again.expired, again.deleted), (3, 0, 0));
        }
    }

    /// Under a policy that keeps access words, the reclaim tells the expired items no GET read
    /// (memcached's `expired_unfetched`) from those read.
    #[test]
    fn a_reclaim_counts_the_expired_items_never_read() {
        use crate::config::ProtocolConfig;
        use crate::Eviction;
        let cfg = ProtocolConfig {
            eviction: Eviction::AllkeysLru,
            ..super::super::testkit::fast_cfg()
        };
        let c = InProcCluster::new(super::super::testkit::small_geometry(), cfg);
        let (mut w, mut r) = (c.client(0), c.client(1));
        let soon = nessie_fabric::wall_clock_ns() + 30_000_000;
        for k in [&b"read"[..], b"unread1", b"unread2"] {
            w.put_parts_expiring(k, &[b"v"], soon).unwrap();
        }
        // Read at once, well within the access interval: the first touch still marks it.
        assert!(r.get(b"read").unwrap().is_some());
        assert!(r.stats().access_writes >= 1);
        std::thread::sleep(std::time::Duration::from_millis(40));
        let total = c.view.geometry.total_ites();
        let done = w.reclaim_expired_in(0..total).unwrap();
        assert_eq!((done.deleted, done.unfetched), (3, 2), "{done:?}");
    }

    /// A key rewritten between the reclaim's read of its expired entry and its DELETE keeps
    /// its new value: the DELETE is conditional on the version read. The mutation (a DELETE
    /// of whatever is there) loses it.
    #[test]
    fn a_reclaim_spares_a_key_rewritten_since_it_read_it_expired() {
        for mutate in [false, true] {
            reclaim_races_a_rewrite(mutate);
        }
    }

    fn reclaim_races_a_rewrite(mutate: bool) {
        use crate::config::{Mutations, ProtocolConfig};
        use crate::hooks::HookPoint;
        use std::sync::{Arc, Mutex};
        let cfg = ProtocolConfig {
            mutations: Mutations {
                reclaim_unconditionally: mutate,
                ..Mutations::default()
            },
            ..super::super::testkit::fast_cfg()
        };
        let c = InProcCluster::new(super::super::testkit::small_geometry(), cfg);
        let mut w = c.client(0);
        let soon = nessie_fabric::wall_clock_ns() + 10_000_000;
        w.put_parts_expiring(b"k", &[b"old"], soon).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let other = Arc::new(Mutex::new(c.client(1)));
        let o = other.clone();
        let mut fired = false;
        w.set_hook(Some(Box::new(move |p| {
            if p == HookPoint::GuardedAfterLook && !fired {
                fired = true;
                o.lock().unwrap().put(b"k", b"new").unwrap();
            }
        })));
        let total = c.view.geometry.total_ites();
        let r = w.reclaim_expired_in(0..total).unwrap();
        w.set_hook(None);
        let now = other.lock().unwrap().get(b"k").unwrap();
        if mutate {
            assert_eq!((r.expired, r.deleted), (1, 1), "the mutation deletes");
            assert_eq!(now, None, "the mutation loses the rewritten value");
        } else {
            assert_eq!((r.expired, r.deleted), (1, 0));
            assert_eq!(now.as_deref(), Some(&b"new"[..]));
        }
    }
}
