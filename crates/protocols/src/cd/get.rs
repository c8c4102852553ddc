//! GET (Appendix A.1.2).
//!
//! Forward pass over the key's candidates (Step 2): skip empty ITEs (2.1) and ITEs whose filter
//! bits differ (2.2); otherwise fetch the DTE locally, from the cache or remotely (2.3). A valid
//! DTE with the key is the answer (2.4). An invalid one belongs to an in-progress write: its
//! previous-version ITE leads to the value that write is replacing, which is still intact
//! because it is only marked for recycling after the write completes (2.5). If no candidate
//! holds the key, the reverse pass (Step 3) re-reads candidates N-1..1: a concurrent MIGRATE
//! could have moved the key behind us, and any change to an ITE shows up as a different word
//! (DTEs are never reused within an expiry period, which bounds the whole attempt).

use nessie_fabric::Endpoint;
use nessie_store::limits::MAX_HASH_FUNCTIONS;
use nessie_store::Ite;

use super::access::Want;
use super::{Abort, Attempt, CdClient};
use crate::hooks::HookPoint;

impl<E: Endpoint> CdClient<E> {
    /// One attempt of GET.
    pub(crate) fn get_once(&mut self, key: &[u8]) -> Attempt<Option<Vec<u8>>> {
        let d = self.deadline(); // Step 0
        let index = self.view.index.clone();
        let mut h = index.hashes(key); // Step 1 (lazily)
        let n = index.n;
        let mut seen = [Ite::EMPTY; MAX_HASH_FUNCTIONS as usize];
        let mut slots = [0u64; MAX_HASH_FUNCTIONS as usize];

        for i in 0..n {
            self.check(&d)?;
            slots[i] = h.slot(&index, i);
            let (ite, t) = self.read_ite(slots[i])?;
            self.hook(HookPoint::GetForwardPass);
            self.check(&d)?;
            seen[i] = ite;
            if ite.is_empty() || !self.filter_matches(ite, h.filter()) {
                continue; // 2.1, 2.2
            }
            let f = self.fetch(ite, t, &d, key, Want::ValueIfMatch)?; // 2.3
            self.hook(HookPoint::GetAfterDteRead);
            if !f.key_matches {
                continue;
            }
            if f.meta.valid || mutated!(self.cfg, skip_valid_check) {
                return Ok(Some(self.value_of(&f))); // 2.4
            }
            // 2.5: an in-progress write replaced `prev`; that DTE is still intact.
            if !self.cfg.optimizations.previous_versions || f.meta.prev == 0 {
                return Err(Abort::Concurrent("GET met an in-progress write"));
            }
            let prev = Ite(f.meta.prev);
            let p = self.fetch(prev, t, &d, key, Want::ValueIfMatch)?;
            if p.key_matches && p.meta.valid {
                self.stats.previous_version_hits += 1;
                return Ok(Some(self.value_of(&p)));
            }
            return Err(Abort::Concurrent(
                "GET met an in-progress write without a usable previous version",
            ));
        }

        // Step 3: the reverse pass, skipping the last candidate.
        if !mutated!(self.cfg, skip_get_reverse_pass) {
            self.reverse_pass(&d, &slots[..n], &seen[..n])?;
        }
        Ok(None)
    }
}
