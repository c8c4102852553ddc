//! A scan of the whole index: every key with a valid entry, read one-sidedly from every
//! node's index and data tables. Not part of the paper's protocol and not atomic: a key
//! written or deleted during the scan may or may not be listed. It is what an administrative
//! "flush everything" (memcached `flush_all`, Redis `FLUSHALL`) and a key count (`DBSIZE`)
//! are built on; a hash store has no order to scan in, so nothing serves range reads.

use nessie_fabric::{Endpoint, RemoteAddr};
use nessie_store::DATA_REGION;

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
        let total = self.view.geometry.total_ites();
        if slots.start > slots.end || slots.end > total {
            return Err(Error::Config(format!(
                "index slots {}..{} are not within the index's 0..{total}",
                slots.start, slots.end
            )));
        }
        self.check_fence().map_err(|a| self.scan_error(a))?;
        let mut keys = Vec::new();
        let mut buf = Vec::new();
        for slot in slots {
            let (ite, _) = self.read_ite(slot).map_err(|a| self.scan_error(a))?;
            if ite.is_empty() {
                continue;
            }
            let loc = self.dte_location(ite);
            buf.resize(self.meta_len(loc), 0);
            let at = RemoteAddr::new(loc.node, DATA_REGION, loc.off);
            if loc.node == self.ep.node() {
                self.ep.local_read(DATA_REGION, loc.off, &mut buf)?;
            } else {
                self.ep.read(at, &mut buf)?;
            }
            // An entry recycled under us decodes as garbage or as another key: listing it is
            // harmless (the scan is not atomic anyway); a bad length is skipped.
            let Ok(meta) = self.view.dte.meta(&buf) else {
                continue;
            };
            if meta.valid && meta.recycle.is_none() {
                keys.push(self.view.dte.key(&buf, &meta).to_vec());
                if keys.len() >= MAX_SCAN_KEYS {
                    return Err(Error::Unsupported(format!(
                        "the scan stopped at {MAX_SCAN_KEYS} keys"
                    )));
                }
            }
        }
        Ok(keys)
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
}
