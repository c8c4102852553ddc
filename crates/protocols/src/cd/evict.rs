//! Eviction (issue 41): with a policy other than `noeviction` (`ProtocolConfig::eviction`), a
//! writer that finds no room deletes items to make some, as a cache must. Client-driven, as
//! every other step: no server thread takes part.
//!
//! - **Data tables.** A value needs an entry of its size class. The writer picks victims among
//!   the entries of that class its own node allocated (`ClassTable::sample_in_use`), so the
//!   entries it frees come back to its own allocator, of the class it needs (memcached evicts
//!   within a slab class for the same reason). An evicted entry is reusable only an expiry
//!   period after its DELETE, like any released entry (a reader may still be reading it), so
//!   a writer also evicts *ahead*: while every page is claimed and its class has fewer entries
//!   at hand or awaiting expiry than the node's writers took in the last expiry period
//!   (`ClassTable::short_of_room`), each PUT evicts [`EVICT_AHEAD`] more.
//! - **Index.** A PUT whose key's candidate index entries all hold other keys, with no room to
//!   migrate them (`Error::IndexFull`), evicts one of those keys and tries again.
//!
//! - **Any operation.** A GET evicts too when it completes another writer's abandoned PUT (the
//!   copy of the value needs an entry). `evicted()` names what the caller's last operation
//!   evicted, whatever it was, and histories record each as a DELETE within it.
//!
//! A victim is deleted with the protocol's own DELETE, *conditional on the version sampled*
//! (`Cond::Version`): a key rewritten since keeps its new value, and an eviction is as
//! linearizable and as replicated as any client's DELETE. One that fails took no effect, but
//! for `Error::Indeterminate` (its commit's answer lost and its writer cut off, rule G4 in
//! `docs/protocol.md`): `evicted_unsure()` names those, failed DELETEs in a history. The sampling reads the entry's
//! header and key, then the key's current version, which must still name the sampled entry
//! (an entry holding a previous version is already on its way back).

use nessie_fabric::{Endpoint, RemoteAddr};
use nessie_store::classtable::{read_words, Slot as DteSlot};
use nessie_store::dte::{DteMeta, KEY_OFF};
use nessie_store::{Ite, DATA_REGION};

use super::access::NS_PER_MS;
use super::CdClient;
use crate::config::Eviction;
use crate::error::Error;
use crate::hooks::HookPoint;
use crate::{Cond, CondOutcome};

/// Victims a writer that found no room evicts before it waits for room.
pub const EVICT_ON_FULL: usize = 4;
/// Victims a PUT evicts while its class is short of room.
pub const EVICT_AHEAD: usize = 2;
/// Rounds of sampling one eviction may take (each sample may find nothing live).
pub const EVICT_ROUNDS: usize = 4;
/// Samples a `volatile-*` policy's victim may draw to find `eviction_samples` items with an
/// expiry among the others.
pub const VOLATILE_SAMPLE_ROUNDS: usize = 4;
/// Times a PUT that met a full index evicts one of its key's candidates and tries again.
pub const INDEX_EVICTION_RETRIES: u32 = 4;
/// Items a page-mover check samples per class. The oldest of 16 is close to the class's
/// oldest: with ages spread evenly, the oldest sampled is under half the oldest about 1
/// check in 65,000 (2^-16; with 5 samples, 1 in 32).
pub const MOVE_SAMPLES: usize = nessie_store::classtable::MAX_SAMPLE;
/// Classes a page-mover check weighs as donors (those holding the most pages).
pub const MOVE_DONORS: usize = 3;
/// How many times older a donor's oldest sampled item must be than the needy class's, after
/// the move ([`worth_moving`]), for a page to move: a margin against sampling noise.
pub const MOVE_AGE_RATIO: u64 = 2;
/// Entries of a draining page an eviction of `n` victims looks at, per victim.
pub const DRAIN_PER_VICTIM: usize = 16;
/// Expiry periods after a pass over a draining page before another pass looks again at the
/// entries still in use (items written during the pass, or whose eviction lost a race).
pub const DRAIN_REPASS_PERIODS: u64 = 2;
/// A class's headroom is at most this fraction of a node's pages (1/8), and all classes'
/// together this fraction of the pages the node's writers hold: headroom is memory not holding
/// items.
pub const HEADROOM_SHARE: u64 = 8;

/// Whether a page should move from a donor class whose oldest sampled item is `donor_age`
/// old, holding `donor_pages`, to a class whose oldest is `age` old, holding `pages`. A class's
/// oldest item is about as old as its pages hold writes: its age grows and shrinks with its
/// pages. So the move must leave the donor's items still [`MOVE_AGE_RATIO`] times older than
/// the needy class's, counting the page each loses or gains: `donor_age · (donor_pages − 1) /
/// donor_pages > ratio · age · (pages + 1) / pages`. Then the move back cannot be worth it
/// right after, and classes of a few pages each (where one page is a large share) do not pass
/// one back and forth. A class holding nothing gets a page from any donor with older items.
fn worth_moving(donor_age: u64, donor_pages: u64, age: u64, pages: u64) -> bool {
    if pages == 0 {
        return donor_age > age;
    }
    let (d, a) = (donor_age as u128, age as u128);
    let (dp, p) = (donor_pages as u128, pages as u128);
    d * dp.saturating_sub(1) * p > MOVE_AGE_RATIO as u128 * a * (p + 1) * dp
}

impl<E: Endpoint> CdClient<E> {
    /// The keys the last operation evicted to make room (a GET's too: completing an abandoned
    /// write takes an entry for the copy).
    pub fn evicted(&self) -> &[Vec<u8>] {
        &self.evicted
    }

    /// The keys whose eviction by the last operation may or may not have taken effect: its
    /// DELETE failed with [`Error::Indeterminate`] (every other failed eviction took none).
    pub fn evicted_unsure(&self) -> &[Vec<u8>] {
        &self.evicted_unsure
    }

    /// An operation of the caller's starts (not one an eviction makes: its version read, its
    /// DELETE): what the last one evicted is forgotten. Every operation may evict, a GET too:
    /// completing another writer's abandoned entry takes an entry for the copy.
    pub(crate) fn clear_evicted(&mut self) {
        if !self.evicting {
            self.evicted.clear();
            self.evicted_unsure.clear();
        }
    }

    /// Whether this client evicts (a policy is set, and it is not already evicting: the
    /// DELETE an eviction makes must not evict in turn).
    pub(crate) fn evicts(&self) -> bool {
        self.cfg.eviction != Eviction::NoEviction && !self.evicting
    }

    /// A PUT with eviction on: a full index makes it evict one of its key's candidates and
    /// try again (up to [`INDEX_EVICTION_RETRIES`] times; once more after finding none to
    /// evict); a PUT that succeeds evicts ahead if its class is short of room.
    pub(crate) fn write_evicting(
        &mut self,
        key: &[u8],
        parts: &[&[u8]],
        value_len: usize,
    ) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            match self.write(key, Some(parts)) {
                Err(Error::IndexFull { .. }) if tries < INDEX_EVICTION_RETRIES => {
                    tries += 1;
                    if !self.evict_for_index(key)? {
                        tries = INDEX_EVICTION_RETRIES; // nothing to evict: one last try
                    }
                }
                Err(e) => return Err(e),
                Ok(()) => break,
            }
        }
        let class = self
            .view
            .classes
            .class_for(key.len() as u32, value_len as u32)
            .expect("sizes were checked");
        self.evict_ahead(class);
        Ok(())
    }

    /// After a successful PUT of an entry of `class`: evict ahead if the class is short of
    /// room. Errors are logged, not returned: the PUT took effect.
    fn evict_ahead(&mut self, class: u8) {
        let pages = (self.view.geometry.data_pages_per_node() / HEADROOM_SHARE).max(1);
        let max = self.view.classes.per_page(class) * pages;
        let now = self.ep.now_ns();
        if self
            .table
            .short_of_room(class, now, self.cfg.expiry_ns, max, HEADROOM_SHARE)
        {
            if let Err(e) = self.evict_class(class, EVICT_AHEAD) {
                tracing::debug!(%e, class, "eviction ahead failed");
            }
        }
    }

    /// A write found no entry of `class` anywhere: evict some before waiting for room.
    pub(crate) fn evict_on_full(&mut self, class: u8) {
        if !self.evicts() {
            return;
        }
        if let Err(e) = self.evict_class(class, EVICT_ON_FULL) {
            tracing::debug!(%e, class, "eviction failed");
        }
    }

    /// Evict up to `n` items whose entries are of `class` and were allocated by this node.
    /// Returns how many were evicted.
    pub(crate) fn evict_class(&mut self, class: u8, n: usize) -> Result<usize, Error> {
        self.evicting = true;
        self.see_expired = true;
        let r = self.evict_class_inner(class, n);
        self.see_expired = false;
        self.evicting = false;
        r
    }

    /// Entries of `class` first; with none of them held here, of the next larger classes (a
    /// full class borrows a larger entry at hand), then of smaller ones (their pages go back
    /// to the pool once empty).
    fn evict_class_inner(&mut self, class: u8, n: usize) -> Result<usize, Error> {
        let classes = self.view.classes.len() as u8;
        let order = (class..classes).chain((0..class).rev());
        // A drain that fails (a page on a node that cannot be reached) must not stop the
        // eviction the writer needs: its own class's victims are still its to take.
        let mut evicted = self.move_pages(class, n).unwrap_or_else(|e| {
            tracing::debug!(%e, class, "draining a page failed");
            0
        });
        if evicted >= n {
            return Ok(evicted);
        }
        for c in order {
            evicted += self.evict_of(c, n - evicted)?;
            if evicted == n {
                break;
            }
        }
        Ok(evicted)
    }

    /// The page mover: a class that has to evict holds too few pages if another class's
    /// items are much older than its own. Then a page of that class is drained for it (every
    /// item on it evicted; memcached's `slab_automove` moves pages by the same measure).
    /// Without it, memory stayed with the first size a workload wrote: the pages of a class go
    /// back to the pool only once every entry on them is gone, and a class's writers evict
    /// within it, so a new size got room only as whole pages of the old one happened to empty
    /// (`docs/frontends.md`, "Moving pages between size classes"). Returns the items evicted.
    fn move_pages(&mut self, class: u8, n: usize) -> Result<usize, Error> {
        if mutated!(self.cfg, no_page_mover) {
            return Ok(0);
        }
        let now_ns = self.ep.now_ns();
        if self.table.move_check_due(now_ns, self.cfg.move_check_ns) {
            self.consider_move(class, now_ns)?;
        }
        let Some((for_class, batch)) = self.table.drain_batch(
            now_ns,
            n.saturating_mul(DRAIN_PER_VICTIM),
            self.cfg.expiry_ns.saturating_mul(DRAIN_REPASS_PERIODS),
        ) else {
            return Ok(0);
        };
        let mut evicted = 0;
        for slot in batch {
            let Some((meta, key)) = self.read_entry_head(slot)? else {
                continue; // free, or being reused: nothing to evict
            };
            // Any item, whatever its rank: the page must empty. A volatile policy's exception
            // stands: an item without an expiry stays (the page waits for it, or the drain is
            // called off after `DRAIN_PASSES` passes).
            if self.rank(&meta, now_ns).is_some() && self.evict_entry(slot, &key)? {
                evicted += 1;
            }
        }
        // Room for the class the page is drained for; a writer of another class that helped
        // drain it still evicts its own victims.
        Ok(if for_class == class { evicted } else { 0 })
    }

    /// Choose whether to drain a page for `class`: its oldest sampled item against the
    /// oldest of each class that could give a page ([`MOVE_DONORS`] of them, those holding
    /// the most pages). The donor whose items are oldest gives one if they are older enough
    /// ([`worth_moving`]; a class holding nothing counts as holding only new items), and
    /// [`MOVE_VOTES`](nessie_store::classtable::MOVE_VOTES) checks in a row have found so (one
    /// for a class holding nothing). Age is the time since an item was last written, or read under
    /// an LRU or LFU policy, expired or not: counting an expired item as the oldest of all made
    /// any class with one in its sample a donor, and a workload with short TTLs moved pages
    /// back and forth a few times a second.
    fn consider_move(&mut self, class: u8, now_ns: u64) -> Result<(), Error> {
        let donors = self.table.donor_classes(class, MOVE_DONORS);
        if donors.is_empty() {
            return Ok(());
        }
        let pages = self.table.class_pages()[class as usize];
        let own = match self.oldest_age(class, now_ns)? {
            Some(age) => age,
            // Holding nothing, it holds only new items; holding pages with no item found on
            // them, its entries are in flight (awaiting expiry), and come back without a move.
            None if pages == 0 => 0,
            None => return Ok(()),
        };
        let mut best: Option<(u64, u8, u64)> = None;
        for (d, d_pages) in donors {
            if let Some(age) = self.oldest_age(d, now_ns)? {
                if best.is_none_or(|(a, _, _)| age > a) {
                    best = Some((age, d, d_pages));
                }
            }
        }
        let worth = best.filter(|&(age, _, d_pages)| worth_moving(age, d_pages, own, pages));
        let Some((age, donor, d_pages)) = worth else {
            self.table.vote_move(class, None);
            return Ok(());
        };
        // A class holding no page at all gets one at once: nothing about it is noise, and its
        // writers are waiting (a vote per check made the first 2,000-byte SETs after a
        // store full of 300-byte ones give up: `scripts/size-shift.sh`).
        let voted = self.table.vote_move(class, Some(donor)) || pages == 0;
        if voted && self.table.start_draining(donor, class) {
            self.stats.pages_moved += 1;
            tracing::debug!(
                class,
                donor,
                own_ms = own,
                donor_ms = age,
                pages,
                d_pages,
                "draining a page"
            );
        }
        Ok(())
    }

    /// The age in ms of the oldest of [`MOVE_SAMPLES`] items of `class` sampled at random;
    /// `None` if the sample holds no item that could be evicted.
    fn oldest_age(&mut self, class: u8, now_ns: u64) -> Result<Option<u64>, Error> {
        let seed = rand::Rng::gen::<u64>(&mut self.rng);
        let sample = self.table.sample_in_use(class, MOVE_SAMPLES, seed);
        let now_ms = now_ns / NS_PER_MS;
        let mut oldest = None;
        for slot in sample {
            let Some((meta, _)) = self.read_entry_head(slot)? else {
                continue;
            };
            if self.rank(&meta, now_ns).is_none() {
                continue;
            }
            oldest = oldest.max(Some(now_ms.saturating_sub(meta.access.last_ms())));
        }
        Ok(oldest)
    }

    /// Evict up to `n` items whose entries are of `class` and were allocated here: per victim,
    /// `ProtocolConfig::eviction_samples` entries sampled, ranked by the policy ([`Self::rank`]), and the
    /// first of them still current deleted.
    fn evict_of(&mut self, class: u8, n: usize) -> Result<usize, Error> {
        let samples = self.cfg.eviction_samples as usize;
        let mut evicted = 0;
        let mut ranked = Vec::with_capacity(samples);
        for _ in 0..n * EVICT_ROUNDS {
            if evicted == n {
                break;
            }
            let seed = rand::Rng::gen::<u64>(&mut self.rng);
            let sample = self.table.sample_in_use(class, samples, seed);
            if sample.is_empty() {
                break; // nothing of this class to evict
            }
            let now_ns = self.ep.now_ns();
            ranked.clear();
            self.rank_sample(sample, now_ns, &mut ranked)?;
            // A volatile policy ranks items with an expiry only: a sample short of them is
            // topped up (Redis samples its table of keys with an expiry).
            for _ in 1..VOLATILE_SAMPLE_ROUNDS {
                if !self.cfg.eviction.volatile() || ranked.len() >= samples {
                    break;
                }
                let seed = rand::Rng::gen::<u64>(&mut self.rng);
                let more = self.table.sample_in_use(class, samples, seed);
                self.rank_sample(more, now_ns, &mut ranked)?;
            }
            // Stable: ties (every one under a random policy) keep the sample's random order.
            ranked.sort_by_key(|(rank, _, _)| *rank);
            for (_, slot, key) in ranked.drain(..) {
                if self.evict_entry(slot, &key)? {
                    evicted += 1;
                    break;
                }
            }
        }
        Ok(evicted)
    }

    /// Read the sampled entries' heads and add the candidates among them, ranked, to `ranked`
    /// (each entry once).
    fn rank_sample(
        &mut self,
        sample: Vec<DteSlot>,
        now_ns: u64,
        ranked: &mut Vec<(u64, DteSlot, Vec<u8>)>,
    ) -> Result<(), Error> {
        for slot in sample {
            if ranked.iter().any(|(_, s, _)| *s == slot) {
                continue;
            }
            if let Some((meta, key)) = self.read_entry_head(slot)? {
                if let Some(rank) = self.rank(&meta, now_ns) {
                    ranked.push((rank, slot, key));
                }
            }
        }
        Ok(())
    }

    /// Where an item whose entry's head is `meta` stands as a victim at `now_ns`, lowest
    /// first; `None` if it is no candidate (being written, a DELETE's marker, released, or
    /// without an expiry under a `volatile-*` policy). An expired item goes first whatever
    /// the policy: it is absent already and only holds memory.
    fn rank(&self, meta: &DteMeta, now_ns: u64) -> Option<u64> {
        if !meta.valid || meta.tombstone || meta.recycle.is_some() {
            return None;
        }
        if meta.expired_at(now_ns) {
            return Some(0);
        }
        let policy = self.cfg.eviction;
        if policy.volatile() && meta.expires == 0 {
            return None;
        }
        let now_ms = now_ns / NS_PER_MS;
        Some(match policy {
            _ if mutated!(self.cfg, evict_ignoring_rank) => 1,
            Eviction::AllkeysLru | Eviction::VolatileLru => 1 + meta.access.last_ms(),
            // The decayed counter first, then the older access among equals.
            Eviction::AllkeysLfu | Eviction::VolatileLfu => {
                1 + ((meta.access.lfu_at(now_ms) as u64) << 48 | meta.access.last_ms())
            }
            Eviction::VolatileTtl => meta.expires,
            Eviction::AllkeysRandom | Eviction::VolatileRandom | Eviction::NoEviction => 1,
        })
    }

    /// Evict `key`, whose current value the sampled entry in `slot` should be, if it still is.
    fn evict_entry(&mut self, slot: DteSlot, key: &[u8]) -> Result<bool, Error> {
        let Some(version) = self.version_of(key)? else {
            return Ok(false);
        };
        if self.names(Ite(version)) != Some(slot) {
            return Ok(false); // the key has moved on: this entry holds a previous version
        }
        // Its DELETE's recycling lists the entry to come back to our allocator once it has
        // expired, without a scan (`ClassTable::note_recycled`).
        self.delete_victim(key, version)
    }

    /// The key's current version, expired or not (an eviction deletes expired items too).
    fn version_of(&mut self, key: &[u8]) -> Result<Option<u64>, Error> {
        let mut buf = std::mem::take(&mut self.evict_buf);
        let version = self.get_versioned(key, &mut buf);
        self.evict_buf = buf;
        version
    }

    /// A PUT of `key` found its candidates full of other keys: evict one of them, the first
    /// by the policy's rank that is still current. Returns whether one was evicted.
    pub(crate) fn evict_for_index(&mut self, key: &[u8]) -> Result<bool, Error> {
        self.evicting = true;
        self.see_expired = true;
        let r = self.evict_for_index_inner(key);
        self.see_expired = false;
        self.evicting = false;
        r
    }

    fn evict_for_index_inner(&mut self, key: &[u8]) -> Result<bool, Error> {
        let index = self.view.index.clone();
        let candidates = index.hashes(key).all(&index);
        let start = rand::Rng::gen_range(&mut self.rng, 0..candidates.len());
        let now_ns = self.ep.now_ns();
        let mut ranked = Vec::with_capacity(candidates.len());
        for i in 0..candidates.len() {
            let c = candidates[(start + i) % candidates.len()];
            let ite = self
                .read_ite_word(c)
                .map_err(|_| Error::Contended { attempts: 1 })?;
            let Some(slot) = self.names(ite) else {
                continue;
            };
            let Some((meta, victim)) = self.read_entry_head(slot)? else {
                continue;
            };
            if victim == key {
                continue;
            }
            if let Some(rank) = self.rank(&meta, now_ns) {
                ranked.push((rank, ite, victim));
            }
        }
        ranked.sort_by_key(|(rank, _, _)| *rank);
        for (_, ite, victim) in ranked {
            if self.version_of(&victim)? != Some(ite.0) {
                continue; // not the victim's current entry (a duplicate, or rewritten)
            }
            if self.delete_victim(&victim, ite.0)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// DELETE `key` if it is still at `version`; count it if it was.
    fn delete_victim(&mut self, key: &[u8], version: u64) -> Result<bool, Error> {
        self.hook(HookPoint::EvictBeforeDelete);
        let cond = if mutated!(self.cfg, evict_unconditionally) {
            Cond::Present
        } else {
            Cond::Version(version)
        };
        let outcome = self.delete_if(key, cond).inspect_err(|e| {
            if matches!(e, Error::Indeterminate(_)) {
                self.evicted_unsure.push(key.to_vec());
            }
        })?;
        if outcome != CondOutcome::Stored {
            return Ok(false);
        }
        self.stats.evictions += 1;
        self.table.count_eviction();
        self.evicted.push(key.to_vec());
        Ok(true)
    }

    /// The data table entry a present ITE names (`None` for an empty word).
    pub(crate) fn names(&self, ite: Ite) -> Option<DteSlot> {
        if ite.is_empty() {
            return None;
        }
        let ite_layout = &self.view.index.ite;
        let (class, slot) = self.view.field.decode(ite_layout.dte(ite));
        Some(DteSlot {
            host: ite_layout.dti(ite) as nessie_fabric::NodeId,
            class,
            slot,
        })
    }

    /// READ an entry's header and key. `None` if the bytes do not decode as an entry (free,
    /// or torn by a concurrent reuse: the caller skips it).
    fn read_entry_head(&mut self, slot: DteSlot) -> Result<Option<(DteMeta, Vec<u8>)>, Error> {
        let n = (KEY_OFF + self.view.dte.key_max as u64) as usize;
        let mut b = vec![0u8; n];
        let at = RemoteAddr::new(
            slot.host,
            DATA_REGION,
            self.view.classes.offset(slot.class, slot.slot),
        );
        read_words(&mut self.ep, at, &mut b)?;
        let Ok(meta) = self.view.dte.meta(&b) else {
            return Ok(None);
        };
        let key = self.view.dte.key(&b, &meta).to_vec();
        Ok(Some((meta, key)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{fast_cfg, small_geometry, InProcCluster};
    use super::*;
    use crate::config::{Mutations, ProtocolConfig};
    use std::sync::{Arc, Mutex};

    fn cfg(eviction: Eviction) -> ProtocolConfig {
        ProtocolConfig {
            eviction,
            ..fast_cfg()
        }
    }

    /// [`cfg`] with operations given 20 ms, not 2: the tests of which victims a policy picks
    /// count hot victims, and a victim's DELETE that misses its deadline (a thread descheduled
    /// for 2 ms on a loaded machine) makes the eviction take the next ranked, hotter one.
    fn patient(eviction: Eviction) -> ProtocolConfig {
        ProtocolConfig {
            expiry_ns: 20_000_000,
            ..cfg(eviction)
        }
    }

    /// Many more keys than the store holds: with allkeys-random every PUT succeeds and every
    /// key reads back as its value or absent; with noeviction the store refuses.
    #[test]
    fn a_full_store_evicts_instead_of_refusing() {
        let keys = 3_000u32;
        for eviction in [Eviction::AllkeysRandom, Eviction::NoEviction] {
            let c = InProcCluster::new(small_geometry(), cfg(eviction));
            let mut a = c.client(0);
            let mut refused = None;
            for i in 0..keys {
                let v = format!("value-{i}");
                if let Err(e) = a.put(format!("k{i}").as_bytes(), v.as_bytes()) {
                    refused = Some((i, e));
                    break;
                }
            }
            match eviction {
                Eviction::NoEviction => {
                    let (i, e) = refused.expect("noeviction refuses once full");
                    assert!(
                        matches!(e, Error::IndexFull { .. } | Error::DataTableFull { .. }),
                        "{i}: {e}"
                    );
                    assert_eq!(a.stats().evictions, 0);
                }
                _ => {
                    assert!(refused.is_none(), "{refused:?}");
                    assert!(a.stats().evictions > 0);
                    let mut present = 0;
                    for i in 0..keys {
                        if let Some(v) = a.get(format!("k{i}").as_bytes()).unwrap() {
                            assert_eq!(v, format!("value-{i}").as_bytes());
                            present += 1;
                        }
                    }
                    assert!(present > 0 && present < keys, "{present} of {keys} present");
                }
            }
        }
    }

    /// A key rewritten between an eviction's sampling and its DELETE keeps its new value: the
    /// DELETE is conditional on the version sampled. The mutation (an unconditional delete)
    /// loses it.
    #[test]
    fn an_eviction_spares_a_key_rewritten_since_it_was_sampled() {
        for mutate in [false, true] {
            let cfg = ProtocolConfig {
                mutations: Mutations {
                    evict_unconditionally: mutate,
                    ..Mutations::default()
                },
                ..cfg(Eviction::AllkeysRandom)
            };
            let c = InProcCluster::new(small_geometry(), cfg);
            let mut a = c.client(0);
            a.put(b"victim", b"old").unwrap();
            let class = c.view.classes.class_for(b"victim".len() as u32, 3).unwrap();
            // Node 1's writer rewrites the key in the window: its entry is in node 1's table,
            // which node 0's eviction does not sample.
            let b = Arc::new(Mutex::new(c.client(1)));
            let b2 = b.clone();
            let mut fired = false;
            a.set_hook(Some(Box::new(move |p| {
                if p == HookPoint::EvictBeforeDelete && !fired {
                    fired = true;
                    b2.lock().unwrap().put(b"victim", b"new").unwrap();
                }
            })));
            let evicted = a.evict_class(class, 1).unwrap();
            a.set_hook(None);
            let now = b.lock().unwrap().get(b"victim").unwrap();
            if mutate {
                assert_eq!(now, None, "the mutation deletes the rewritten key");
                assert_eq!(evicted, 1);
            } else {
                assert_eq!(now.as_deref(), Some(&b"new"[..]), "the new value survives");
                assert_eq!(evicted, 0, "nothing else of the class to evict");
            }
        }
    }

    /// Data tables full long before the index: writers evict entries of their class, and a
    /// steady stream of PUTs goes on with no refusal.
    #[test]
    fn full_data_tables_evict_entries_of_the_class() {
        let g = nessie_store::Geometry {
            ites_per_node: 4096,
            dtes_per_node: 16,
            ..small_geometry()
        };
        let c = InProcCluster::new(g, cfg(Eviction::AllkeysRandom));
        let (mut a, mut b) = (c.client(0), c.client(2));
        let v = [7u8; 60];
        for i in 0..2_000 {
            let w = if i % 2 == 0 { &mut a } else { &mut b };
            w.put(format!("d{i}").as_bytes(), &v).unwrap();
        }
        let evicted = a.stats().evictions + b.stats().evictions;
        assert!(evicted > 0, "no eviction");
        assert!(c.occupancy() < 2_000, "{} keys held", c.occupancy());
        for i in 0..2_000 {
            if let Some(got) = a.get(format!("d{i}").as_bytes()).unwrap() {
                assert_eq!(got, v);
            }
        }
    }

    /// A GET that completes another writer's abandoned PUT takes an entry for the copy of its
    /// value, and in a full store evicts for it: `evicted()` names what the GET evicted (a
    /// history records them within the GET), and a GET that evicts nothing names nothing (the
    /// last operation's evictions are not its own). Before, only writes were asked, and keys a GET
    /// evicted vanished from the histories of a node crashing while writers evicted.
    #[test]
    fn a_get_that_evicts_to_complete_an_abandoned_write_says_so() {
        use crate::fence::Fence;
        use crate::hooks::HookPoint;
        const EXPIRY_NS: u64 = 40_000_000;
        let g = nessie_store::Geometry {
            ites_per_node: 4096,
            dtes_per_node: 16,
            ..small_geometry()
        };
        let c = InProcCluster::new(g, fast_cfg());
        let v = [7u8; 60];
        let mut dying = c.client(1);
        dying.set_hook(Some(Box::new(|p| {
            if p == HookPoint::BeforeSetValid {
                panic!("the writer dies");
            }
        })));
        let died =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dying.put(b"abandoned", &v)));
        assert!(died.is_err());
        let fence = Arc::new(Fence::unfenced());
        fence.set_gone(1, true);
        // Filled to the last entry without eviction: nothing free, nothing awaiting expiry.
        let mut filler = c.client(2);
        filler.set_fence(fence.clone());
        let mut i = 0;
        while filler.put(format!("d{i}").as_bytes(), &v).is_ok() {
            i += 1;
            assert!(i < 10_000, "never full");
        }
        let evicting = ProtocolConfig {
            expiry_ns: EXPIRY_NS,
            ..cfg(Eviction::AllkeysRandom)
        };
        let mut a = c.client_with(2, evicting);
        a.set_fence(fence);
        // Past the abandoned entry's grace (its deadline, the margin and an expiry period).
        std::thread::sleep(std::time::Duration::from_nanos(2 * EXPIRY_NS));
        let before = a.stats().evictions;
        assert_eq!(a.get(b"abandoned").unwrap().as_deref(), Some(&v[..]));
        let by_get = a.evicted().to_vec();
        assert_eq!(by_get.len() as u64, a.stats().evictions - before);
        assert!(!by_get.is_empty(), "the GET's copy needed room");
        for k in &by_get {
            assert_ne!(k.as_slice(), b"abandoned");
            assert_eq!(a.get(k).unwrap(), None, "{:?} was evicted", k);
        }
        assert!(a.evicted().is_empty(), "a GET that evicted nothing");
    }

    /// A full index: the PUT evicts one of its key's candidates (keys of one-byte values fill
    /// the index long before the data tables).
    #[test]
    fn a_full_index_evicts_a_candidate() {
        let c = InProcCluster::new(small_geometry(), cfg(Eviction::AllkeysRandom));
        let mut a = c.client(1);
        let total = c.view.geometry.total_ites();
        for i in 0..total * 2 {
            a.put(format!("i{i}").as_bytes(), b"v").unwrap();
        }
        assert!(a.stats().evictions > 0);
        assert!(c.occupancy() <= total);
    }
    /// The item (all of class `class`) a one-item eviction by `a` takes: the key of the
    /// one that is gone.
    fn evict_one(a: &mut CdClient<impl Endpoint>, class: u8) -> usize {
        a.evict_class(class, 1).unwrap()
    }

    /// Evict `victims` items of `class`, one call per victim. A call may find none: its
    /// [`EVICT_ROUNDS`] samples can all be entries already evicted and awaiting expiry (with
    /// one sample per victim and 40 of 300 gone, 1 call in about 3,000), so calls that find
    /// none are retried, up to as many again as there are victims.
    fn evict_victims(a: &mut CdClient<impl Endpoint>, class: u8, victims: usize) {
        let (mut evicted, mut calls) = (0, 0);
        while evicted < victims {
            calls += 1;
            assert!(
                calls <= 2 * victims,
                "{evicted} of {victims} evicted in {calls} calls"
            );
            evicted += evict_one(a, class);
        }
        assert_eq!(evicted, victims, "one call evicts at most one");
    }

    /// Room for a few hundred keys of one class.
    fn roomy() -> nessie_store::Geometry {
        nessie_store::Geometry {
            ites_per_node: 512,
            dtes_per_node: 512,
            ..small_geometry()
        }
    }

    /// Keys `k0..k{n}` of one class, written by node 0; then, past the access interval, the
    /// first half read (hot). Returns the client and the class.
    fn hot_and_cold(c: &InProcCluster, n: u32, reads: u32) -> (CdClient<impl Endpoint>, u8) {
        let mut a = c.client(0);
        for i in 0..n {
            a.put(format!("k{i:03}").as_bytes(), b"value").unwrap();
        }
        let class = c.view.classes.class_for(4, 5).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(
            nessie_store::access::ACCESS_INTERVAL_MS + 10,
        ));
        for _ in 0..reads {
            for i in 0..n / 2 {
                assert!(a.get(format!("k{i:03}").as_bytes()).unwrap().is_some());
            }
        }
        (a, class)
    }

    /// How many of the first `n / 2` keys (the hot ones) are gone.
    fn hot_gone(a: &mut CdClient<impl Endpoint>, n: u32) -> u32 {
        (0..n / 2)
            .filter(|i| a.get(format!("k{i:03}").as_bytes()).unwrap().is_none())
            .count() as u32
    }

    proptest::proptest! {
        /// A move worth making is never undone by the next check: with ages scaled by the
        /// pages each class holds after it (exactly, here), the move back is not worth it.
        #[test]
        fn a_page_moved_is_not_worth_moving_back(
            k_donor in 0u64..1_000_000, k in 0u64..1_000_000,
            donor_pages in 2u64..64, pages in 1u64..64,
        ) {
            let (d, a) = (k_donor * donor_pages * pages, k * donor_pages * pages);
            if worth_moving(d, donor_pages, a, pages) {
                let d_after = d / donor_pages * (donor_pages - 1);
                let a_after = a / pages * (pages + 1);
                proptest::prop_assert!(!worth_moving(a_after, pages + 1, d_after, donor_pages - 1));
            }
        }
    }

    #[test]
    fn moves_need_older_items_after_the_move() {
        assert!(
            worth_moving(1, 2, 0, 0),
            "a class holding nothing takes from older ones"
        );
        assert!(!worth_moving(0, 2, 0, 0));
        // Ten pages each: the donor's items must be about 2 × 1.1 / 0.9 = 2.44 times older.
        assert!(!worth_moving(240, 10, 100, 10));
        assert!(worth_moving(250, 10, 100, 10));
        // One page against two: 2 × 2 / 0.5 = 8 times older.
        assert!(!worth_moving(790, 2, 100, 1));
        assert!(worth_moving(810, 2, 100, 1));
    }

    /// A store filled with one value size, then written with a larger one: the page mover
    /// drains pages of the old size for the new (its items are all older), and every large
    /// PUT succeeds with the large size soon holding most of the memory (a check every 2 ms:
    /// a page moves at most once per `MOVE_VOTES` checks). The mutation (no
    /// page mover) leaves the memory with the old size: the large size gets a page or two
    /// as whole pages happen to empty.
    #[test]
    fn a_new_value_size_gets_the_pages_of_an_old_one() {
        let g = nessie_store::Geometry {
            ites_per_node: 4096,
            dtes_per_node: 64,
            value_max: 1024,
            ..small_geometry()
        };
        for mutate in [false, true] {
            let cfg = ProtocolConfig {
                mutations: Mutations {
                    no_page_mover: mutate,
                    ..Mutations::default()
                },
                move_check_ns: 2_000_000,
                ..patient(Eviction::AllkeysLru)
            };
            let c = InProcCluster::new(g.clone(), cfg);
            let mut a = c.client(0);
            let small = c.view.classes.class_for(8, 16).unwrap();
            let large = c.view.classes.class_for(8, 1000).unwrap();
            let pages = c.view.geometry.data_pages_per_node() * g.nodes as u64;
            let small_per_page = c.view.classes.per_page(small);
            for i in 0..3 * pages * small_per_page {
                a.put(format!("s{i:07}").as_bytes(), &[1u8; 16]).unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            let large_per_page = c.view.classes.per_page(large);
            let mut refused = 0;
            // Three times the memory in large values, and on for half a second: a move takes a
            // few checks in a row (`MOVE_VOTES`), at most one per check interval. With the page
            // mover, on until the large size holds twice the small one's pages, for at most
            // `MOVED_WITHIN` (a loaded machine runs fewer checks in half a second: one CI run
            // had moved 9 pages of the 10 needed).
            const MOVED_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);
            let started = std::time::Instant::now();
            let moved_enough = || {
                let u = c.table(0).usage();
                u[large as usize].pages >= 2 * u[small as usize].pages
            };
            let mut i = 0;
            while i < 3 * pages * large_per_page
                || started.elapsed().as_millis() < 500
                || (!mutate && !moved_enough() && started.elapsed() < MOVED_WITHIN)
            {
                if let Err(e) = a.put(format!("l{i:07}").as_bytes(), &[2u8; 1000]) {
                    assert!(matches!(e, Error::DataTableFull { .. }), "{e}");
                    refused += 1;
                }
                i += 1;
            }
            let usage = c.table(0).usage();
            let (s, l) = (usage[small as usize], usage[large as usize]);
            eprintln!(
                "no page mover: {mutate}; {i} large PUTs in {:?}; small {s:?}; large {l:?}; {:?}",
                started.elapsed(),
                a.stats()
            );
            assert_eq!(refused, 0, "no large PUT is refused");
            if mutate {
                assert_eq!(a.stats().pages_moved, 0);
                assert!(l.pages < s.pages, "the small size kept its pages");
            } else {
                assert!(a.stats().pages_moved > 0);
                assert!(l.pages >= 2 * s.pages, "the pages moved to the large size");
                for j in 1..=large_per_page {
                    let k = format!("l{:07}", i - j);
                    let got = a.get(k.as_bytes()).unwrap();
                    assert!(got.is_none_or(|v| v == [2u8; 1000]), "{k}");
                }
            }
        }
    }

    /// allkeys-lru evicts the items not read since they were written, and keeps those read
    /// (5 samples per victim: a hot victim needs all 5 hot, 1 in 32). allkeys-lfu does the
    /// same by the counters the reads raised. The mutation (every sample ranked alike, as
    /// allkeys-random) evicts hot and cold alike, and the test catches it.
    #[test]
    fn lru_and_lfu_evict_what_was_not_read() {
        // Few victims of many: the hot share of the sample stays near a half, and an honest
        // run takes a hot victim 1 time in 32 (expected 0.6 of 20).
        let (n, victims) = (300u32, 20usize);
        for (policy, reads) in [(Eviction::AllkeysLru, 1), (Eviction::AllkeysLfu, 8)] {
            for mutate in [false, true] {
                let cfg = ProtocolConfig {
                    mutations: Mutations {
                        evict_ignoring_rank: mutate,
                        ..Mutations::default()
                    },
                    ..patient(policy)
                };
                let c = InProcCluster::new(roomy(), cfg);
                let (mut a, class) = hot_and_cold(&c, n, reads);
                assert!(
                    a.stats().access_writes > 0,
                    "{policy}: no access word written"
                );
                evict_victims(&mut a, class, victims);
                let hot = hot_gone(&mut a, n);
                if mutate {
                    assert!(
                        hot >= 5,
                        "{policy} mutated: only {hot} of {victims} victims hot"
                    );
                } else {
                    assert!(hot <= 4, "{policy}: {hot} of {victims} victims were hot");
                }
            }
        }
    }

    /// `eviction_samples` is how many entries a victim is chosen from: with one, allkeys-lru
    /// takes whatever it draws (hot or cold alike, about half hot); with 16, a hot victim
    /// needs 16 hot draws (at most 1 in 6,000 as the cold ones go), so at most one of 40
    /// victims is hot (two: about 1 run in 50,000).
    #[test]
    fn more_samples_choose_better_victims() {
        let (n, victims) = (300u32, 40usize);
        let mut hot = Vec::new();
        for samples in [1u8, 16] {
            let cfg = ProtocolConfig {
                eviction_samples: samples,
                ..patient(Eviction::AllkeysLru)
            };
            let c = InProcCluster::new(roomy(), cfg);
            let (mut a, class) = hot_and_cold(&c, n, 1);
            evict_victims(&mut a, class, victims);
            hot.push(hot_gone(&mut a, n));
        }
        // One sample: the victims' hot count is binomial(40, 1/2), at least 8 but 1 in 10^5.
        assert!(
            hot[0] >= 8,
            "one sample: only {} of {victims} victims hot",
            hot[0]
        );
        assert!(
            hot[1] <= 1,
            "16 samples: {} of {victims} victims hot",
            hot[1]
        );
        let bad = ProtocolConfig {
            eviction_samples: 0,
            ..cfg(Eviction::AllkeysLru)
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("eviction samples 0"), "{e}");
    }

    /// With tracking off (a policy that does not rank by access), GETs write nothing.
    #[test]
    fn gets_write_access_words_only_for_lru_and_lfu() {
        for policy in Eviction::ALL {
            let c = InProcCluster::new(small_geometry(), cfg(policy));
            let (a, _) = hot_and_cold(&c, 20, 1);
            assert_eq!(
                a.stats().access_writes > 0,
                policy.tracks_access(),
                "{policy}: {} access writes",
                a.stats().access_writes
            );
        }
    }

    /// volatile-ttl evicts the item that expires soonest; every volatile policy leaves items
    /// without an expiry alone, and with none to evict refuses the write as noeviction does.
    #[test]
    fn volatile_policies_evict_only_items_with_an_expiry() {
        let far = nessie_fabric::wall_clock_ns() + 3_600_000_000_000;
        for policy in [
            Eviction::VolatileTtl,
            Eviction::VolatileLru,
            Eviction::VolatileLfu,
            Eviction::VolatileRandom,
        ] {
            let c = InProcCluster::new(roomy(), patient(policy));
            let mut a = c.client(0);
            let class = c.view.classes.class_for(4, 5).unwrap();
            for i in 0..240u64 {
                let key = format!("k{i:03}");
                if i % 2 == 0 {
                    a.put(key.as_bytes(), b"value").unwrap(); // no expiry
                } else {
                    // Later keys expire later.
                    let at = far + i * 1_000_000_000;
                    a.put_parts_expiring(key.as_bytes(), &[b"value"], at)
                        .unwrap();
                }
            }
            evict_victims(&mut a, class, 10);
            for i in (0..240).step_by(2) {
                let key = format!("k{i:03}");
                assert!(
                    a.get(key.as_bytes()).unwrap().is_some(),
                    "{policy} evicted {key}"
                );
            }
            if policy == Eviction::VolatileTtl {
                // Of the 120 with an expiry, the 10 gone are the soonest of their samples of
                // 5: one of the later half only when all 5 are (1 in 32).
                let gone: Vec<u64> = (1..240u64)
                    .step_by(2)
                    .filter(|i| a.get(format!("k{i:03}").as_bytes()).unwrap().is_none())
                    .collect();
                assert_eq!(gone.len(), 10);
                let late = gone.iter().filter(|&&i| i > 120).count();
                assert!(late <= 3, "volatile-ttl evicted late expiries: {gone:?}");
            }
            // Only items without an expiry left: nothing to evict.
            for i in (1..240u64).step_by(2) {
                a.delete(format!("k{i:03}").as_bytes()).unwrap();
            }
            assert_eq!(a.evict_class(class, 1).unwrap(), 0, "{policy}");
        }
    }

    /// An expired item is evicted first whatever the policy: it is absent already.
    #[test]
    fn an_expired_item_goes_first() {
        let c = InProcCluster::new(small_geometry(), cfg(Eviction::AllkeysLru));
        let mut a = c.client(0);
        let class = c.view.classes.class_for(4, 5).unwrap();
        let past = nessie_fabric::wall_clock_ns() + 20_000_000;
        for i in 0..5u32 {
            a.put(format!("k{i:03}").as_bytes(), b"value").unwrap();
        }
        a.put_parts_expiring(b"k005", &[b"value"], past).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        // 6 items of the class: the sample of 5 holds the expired one 5 times in 6; over
        // three victims it is taken (at most one can go, so the run ends with it gone).
        for _ in 0..3 {
            evict_one(&mut a, class);
        }
        let mut reader = c.client(1);
        assert_eq!(reader.get(b"k005").unwrap(), None);
        assert_eq!(
            c.occupancy(),
            3,
            "three evicted, the expired one among them"
        );
    }
}
