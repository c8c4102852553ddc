//! Prefetch: the remote DTEs of several keys read in overlapping batches (their candidates'
//! ITEs, then the entries those name), so that the GETs that follow find each in a small
//! per-client prefetch cache instead of reading it one round trip after another. A large
//! item's chunks are read so (`large.rs`): their READs are in flight together.
//!
//! A prefetch is a hint. It changes nothing anyone else sees, and the GET that follows does
//! every step of its own (ITE reads, filter and key checks, previous versions, the reverse
//! pass); only its DTE READ is replaced by a copy, under the DTE cache's rule
//! (`nessie_store::cache`): a valid entry read through ITE word `i`, read at `t`, is a faithful
//! copy of what `i` names until `t + expiry` (the entry cannot be reused sooner after `i`
//! stopped naming it, and a valid entry's bytes do not change). Invariants:
//! - **PF1.** A copy is kept only if its READ completed before `t + expiry` (one timer check
//!   after the batch, as `fetch` checks after its READ), and `t` is the time the ITE batch was
//!   issued, never later.
//! - **PF2.** Only valid entries that hold the key asked for are kept, as in the DTE cache (the
//!   valid flag is the one field that changes).
//! - **PF3.** Copies live for one prefetch only: the next prefetch drops them, so the cache
//!   never holds more than [`MAX_PREFETCH_KEYS`] entries.
//!
//! It runs only with the cache optimisation on, and only where the fabric overlaps a batch's
//! READs of data tables and says extra READs are cheap (`Endpoint::overlaps_batches`: RDMA
//! verbs, as for a GET's batched candidate reads). Not over shm, where a READ is a CPU copy
//! with nothing to overlap; not over tcp, where the target's CPU serves every READ: there a
//! 200,000-byte GET through the Redis front end ran at 0.48x with it, paying for the ITE
//! READs it adds (`docs/large-values.md`, "Reading chunks ahead").

use nessie_fabric::{Batch, Endpoint, OpId, RemoteAddr, MAX_BATCH_OPS};
use nessie_store::dte::DteLayout;
use nessie_store::{Ite, DATA_REGION};

use super::CdClient;
use crate::hooks::HookPoint;

/// Most keys one prefetch reads ahead (more are ignored): a large item's chunks are read in
/// windows of this many. 16 entries of the largest class (16 KiB by default) is 256 KiB.
pub const MAX_PREFETCH_KEYS: usize = 16;

impl<E: Endpoint> CdClient<E> {
    /// Whether [`Self::prefetch`] reads anything on this client.
    pub(crate) fn prefetches(&self) -> bool {
        self.prefetched.enabled()
    }

    /// Read ahead the remote DTEs of `keys` (at most [`MAX_PREFETCH_KEYS`]), for the GETs of
    /// those keys that follow. Failures and anything unexpected just leave a key unread.
    pub fn prefetch(&mut self, keys: &[&[u8]]) {
        self.prefetched.clear(); // PF3
        if !self.prefetches() || keys.is_empty() {
            return;
        }
        let keys = &keys[..keys.len().min(MAX_PREFETCH_KEYS)];
        let index = self.view.index.clone();
        let n = index.n;
        // 1. Every candidate ITE of every key, as many keys per batch as fit.
        let mut ites = vec![Ite::EMPTY; keys.len() * n];
        let mut filters = vec![0u64; keys.len()];
        let mut read_ns = vec![0u64; keys.len()];
        let per_batch = (MAX_BATCH_OPS / n).max(1);
        for (b, group) in keys.chunks(per_batch).enumerate() {
            let first = b * per_batch;
            let mut words = [[0u8; 8]; MAX_BATCH_OPS];
            let mut slots = Vec::with_capacity(group.len() * n);
            for (k, key) in group.iter().enumerate() {
                let mut h = index.hashes(key);
                for i in 0..n {
                    slots.push(h.slot(&index, i));
                }
                filters[first + k] = h.filter();
            }
            let t = self.ep.mono_ns(); // PF1: before the READs are issued
            let mut batch = Batch::new();
            for (&s, w) in slots.iter().zip(words.iter_mut()) {
                batch.read(index.addr(s), w);
            }
            self.ep.run_batch(&mut batch);
            let mut ok = [false; MAX_BATCH_OPS];
            for (j, o) in ok[..slots.len()].iter_mut().enumerate() {
                *o = batch.result(OpId(j)).is_ok();
            }
            drop(batch);
            for (j, w) in words[..slots.len()].iter().enumerate() {
                if ok[j] {
                    ites[first * n + j] = Ite(u64::from_le_bytes(*w));
                }
            }
            for r in &mut read_ns[first..first + group.len()] {
                *r = t;
            }
        }
        // 2. Per key, the entry of its first non-empty candidate whose filter bits match and
        // whose entry is on another node: the one its GET will most likely read.
        let mut wanted: Vec<(usize, Ite, RemoteAddr, Vec<u8>)> = Vec::with_capacity(keys.len());
        for (k, _) in keys.iter().enumerate() {
            let pick = ites[k * n..(k + 1) * n]
                .iter()
                .copied()
                .find(|&ite| !ite.is_empty() && self.filter_matches(ite, filters[k]));
            let Some(ite) = pick else { continue };
            let loc = self.dte_location(ite);
            if loc.node == self.ep.node() {
                continue;
            }
            let addr = RemoteAddr::new(loc.node, DATA_REGION, loc.off);
            wanted.push((k, ite, addr, vec![0u8; loc.size as usize]));
        }
        self.hook(HookPoint::PrefetchBeforeEntryReads);
        for group in wanted.chunks_mut(MAX_BATCH_OPS) {
            let len = group.len();
            let mut batch = Batch::new();
            for (_, _, addr, buf) in group.iter_mut() {
                batch.read(*addr, buf);
            }
            self.ep.run_batch(&mut batch);
            let mut ok = [false; MAX_BATCH_OPS];
            for (j, o) in ok[..len].iter_mut().enumerate() {
                *o = batch.result(OpId(j)).is_ok();
            }
            drop(batch);
            let now = self.ep.mono_ns();
            for ((k, ite, _, bytes), &ok) in group.iter().zip(&ok[..len]) {
                let t = read_ns[*k];
                // PF1: past the deadline the entry may have been reused under us.
                let in_time = now.saturating_sub(t) < self.cfg.expiry_ns
                    || mutated!(self.cfg, prefetch_past_deadline);
                if ok && in_time {
                    self.keep_prefetched(keys[*k], *ite, bytes, t);
                }
            }
        }
    }

    /// PF2: keep `bytes`, the entry `ite` names read through it at `t`, if it is valid and
    /// holds `key` with lengths that fit it; only the header, key and value are kept.
    fn keep_prefetched(&mut self, key: &[u8], ite: Ite, bytes: &[u8], t: u64) {
        let layout = self.view.dte;
        let Ok(meta) = layout.meta(bytes) else { return };
        let value_off = DteLayout::value_offset(meta.key_len) as usize;
        let end = value_off + layout.value_read_len(meta.value_len) as usize;
        if !meta.valid || end > bytes.len() || layout.key(bytes, &meta) != key {
            return;
        }
        self.prefetched
            .insert(ite.0, &[&bytes[..end]], t, self.cfg.expiry_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{fast_cfg, small_geometry, InProcCluster};
    use super::MAX_PREFETCH_KEYS;
    use crate::config::Mutations;
    use crate::hooks::HookPoint;

    fn keys(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("pf-{i}").into_bytes()).collect()
    }

    /// GETs after a prefetch read what GETs without one read, and take the remote entries
    /// from the prefetch cache (no DTE READ of their own).
    #[test]
    fn gets_after_a_prefetch_read_the_same_without_reading_entries_again() {
        let c = InProcCluster::small();
        c.fabric.set_batches_overlap(true);
        let ks = keys(MAX_PREFETCH_KEYS + 4);
        let mut w = c.client(0);
        for (i, k) in ks.iter().enumerate() {
            w.put(k, &[i as u8; 40]).unwrap();
        }
        let mut r = c.client(1);
        assert!(r.prefetches());
        let refs: Vec<&[u8]> = ks.iter().map(|k| k.as_slice()).collect();
        r.prefetch(&refs);
        let before = r.prefetched.stats();
        for (i, k) in ks.iter().enumerate() {
            assert_eq!(r.get(k).unwrap(), Some(vec![i as u8; 40]), "key {i}");
        }
        let after = r.prefetched.stats();
        assert!(
            after.hits - before.hits >= 4,
            "most of the first {MAX_PREFETCH_KEYS} keys' entries (written on node 0) came from the prefetch: {after:?}"
        );
        // Where batches do not overlap, nothing is read ahead.
        let d = InProcCluster::small();
        assert!(!d.client(1).prefetches());
        // An absent key, and a prefetch of nothing, change nothing.
        r.prefetch(&[b"nobody"]);
        assert_eq!(r.get(b"nobody").unwrap(), None);
        r.prefetch(&[]);
        assert_eq!(
            r.prefetched.stats().len,
            0,
            "PF3: the last prefetch's copies dropped"
        );
    }

    /// A key overwritten between its prefetch and its GET reads the new value: the GET reads
    /// the ITE again, whose word names another entry.
    #[test]
    fn a_key_overwritten_after_its_prefetch_reads_the_new_value() {
        let c = InProcCluster::small();
        c.fabric.set_batches_overlap(true);
        let mut w = c.client(0);
        w.put(b"k", b"old").unwrap();
        let mut r = c.client(1);
        r.prefetch(&[b"k"]);
        assert_eq!(r.prefetched.stats().len, 1, "the old entry read ahead");
        w.put(b"k", b"new").unwrap();
        assert_eq!(r.get(b"k").unwrap().as_deref(), Some(&b"new"[..]));
    }

    /// PF1: a prefetch whose entry READs end past the expiry period after its ITE READs keeps
    /// nothing: the entry may have been recycled and reused under it. (A wrong answer needs
    /// the ITE word to recur, which sequence bits prevent here; the control mutation is
    /// caught by what the prefetch kept.)
    #[test]
    fn a_prefetch_past_the_expiry_period_keeps_nothing() {
        for mutated in [false, true] {
            let mut cfg = fast_cfg();
            cfg.expiry_ns = 5_000_000;
            if mutated {
                cfg.mutations = Mutations {
                    prefetch_past_deadline: true,
                    ..Mutations::default()
                };
            }
            let c = InProcCluster::new(small_geometry(), cfg);
            c.fabric.set_batches_overlap(true);
            let mut w = c.client(0);
            w.put(b"k", b"value").unwrap();
            let mut r = c.client(1);
            r.set_hook(Some(Box::new(|p| {
                if p == HookPoint::PrefetchBeforeEntryReads {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            })));
            r.prefetch(&[b"k"]);
            let kept = r.prefetched.stats().len;
            assert_eq!(kept > 0, mutated, "mutated {mutated}: {kept} kept");
        }
    }
}
