//! The index: N-way cuckoo hashing over the index tables of all nodes.
//!
//! The cluster's ITEs form one global array of `nodes × ites_per_node` slots; slot `s` lives on
//! node `s / ites_per_node` at entry `s % ites_per_node`. Candidate `i` of a key is
//! `reduce(xxh3_64_with_seed(key, SEEDS[i]))`, re-hashed with a derived seed in the rare case
//! it equals an earlier candidate, so the N candidates of a key are always distinct. Candidates
//! are computed lazily, in order, as an operation reaches them ("lazy hashing"). The filter
//! bits come from an independent hash (seed `FILTER_SEED`).
//!
//! These constants are part of the on-memory format: changing them changes where every key
//! lives, so they are fixed and versioned with the geometry fingerprint.

use nessie_fabric::{NodeId, RemoteAddr};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::geometry::Geometry;
use crate::ite::IteLayout;
use crate::limits::MAX_HASH_FUNCTIONS;
use crate::INDEX_REGION;

const SEEDS: [u64; MAX_HASH_FUNCTIONS as usize] = [
    0x6e65_7373_6965_0001,
    0x6e65_7373_6965_0002,
    0x6e65_7373_6965_0003,
    0x6e65_7373_6965_0004,
    0x6e65_7373_6965_0005,
    0x6e65_7373_6965_0006,
    0x6e65_7373_6965_0007,
    0x6e65_7373_6965_0008,
];
const FILTER_SEED: u64 = 0x6e65_7373_6965_f117;
const REHASH_STEP: u64 = 0x9e37_79b9_7f4a_7c15;
/// Re-hash attempts before giving up on a distinct candidate (validation guarantees at least
/// 2N slots, so this bound is never the limiting factor in practice).
const MAX_REHASH: u64 = 64;

/// Global slot number of an ITE.
pub type Slot = u64;

/// Hash parameters of a cluster.
#[derive(Clone, Debug)]
pub struct Index {
    pub ites_per_node: u64,
    pub total: u64,
    pub n: usize,
    pub ite: IteLayout,
}

impl Index {
    pub fn new(g: &Geometry, ite: IteLayout) -> Self {
        Self { ites_per_node: g.ites_per_node, total: g.total_ites(), n: g.hash_functions as usize, ite }
    }

    /// Start hashing `key`: filter bits now, candidates on demand.
    pub fn hashes<'k>(&self, key: &'k [u8]) -> KeyHashes<'k> {
        KeyHashes {
            key,
            filter: self.ite.filter_of(xxh3_64_with_seed(key, FILTER_SEED)),
            slots: [0; MAX_HASH_FUNCTIONS as usize],
            computed: 0,
        }
    }

    /// Where slot `s` lives.
    #[inline]
    pub fn addr(&self, s: Slot) -> RemoteAddr {
        debug_assert!(s < self.total);
        RemoteAddr::new((s / self.ites_per_node) as NodeId, INDEX_REGION, (s % self.ites_per_node) * 8)
    }

    #[inline]
    fn reduce(&self, h: u64) -> Slot {
        // Lemire's multiply-shift: unbiased enough and cheaper than a modulo.
        ((h as u128 * self.total as u128) >> 64) as u64
    }
}

/// The lazily computed candidates of one key.
#[derive(Clone, Debug)]
pub struct KeyHashes<'k> {
    key: &'k [u8],
    filter: u64,
    slots: [Slot; MAX_HASH_FUNCTIONS as usize],
    computed: usize,
}

impl KeyHashes<'_> {
    pub fn filter(&self) -> u64 {
        self.filter
    }

    /// Candidate `i` (0-based) of the key.
    pub fn slot(&mut self, idx: &Index, i: usize) -> Slot {
        assert!(i < idx.n, "candidate {i} of {}-way hashing", idx.n);
        while self.computed <= i {
            let c = self.computed;
            let mut attempt: u64 = 0;
            let s = loop {
                let seed = SEEDS[c] ^ attempt.wrapping_mul(REHASH_STEP);
                let s = idx.reduce(xxh3_64_with_seed(self.key, seed));
                if !self.slots[..c].contains(&s) {
                    break s;
                }
                attempt += 1;
                assert!(attempt < MAX_REHASH, "no distinct candidate after {MAX_REHASH} re-hashes");
            };
            self.slots[c] = s;
            self.computed += 1;
        }
        self.slots[i]
    }

    /// All N candidates.
    pub fn all(&mut self, idx: &Index) -> Vec<Slot> {
        (0..idx.n).map(|i| self.slot(idx, i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(nodes: u32, per_node: u64, n: u8) -> Index {
        let g = Geometry { nodes, ites_per_node: per_node, hash_functions: n, ..Geometry::default() };
        let (ite, _) = g.validate().unwrap();
        Index::new(&g, ite)
    }

    #[test]
    fn candidates_are_distinct_stable_and_in_range() {
        let idx = index(3, 4, 3); // 12 slots: collisions are frequent and must be re-hashed
        for k in 0..2000u32 {
            let key = k.to_le_bytes();
            let a = idx.hashes(&key).all(&idx);
            let mut sorted = a.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), 3, "candidates of {k} not distinct: {a:?}");
            assert!(a.iter().all(|&s| s < 12));
            assert_eq!(a, idx.hashes(&key).all(&idx), "hashing is deterministic");
        }
    }

    #[test]
    fn lazy_prefix_matches_full_computation() {
        let idx = index(5, 1000, 4);
        let mut h = idx.hashes(b"hello");
        let first = h.slot(&idx, 0);
        assert_eq!(h.computed, 1, "only what is needed is hashed");
        assert_eq!(first, idx.hashes(b"hello").all(&idx)[0]);
    }

    #[test]
    fn known_values_pin_the_format() {
        // Changing hash constants silently moves every key: this test makes that loud.
        let idx = index(3, 1 << 16, 3);
        let mut h = idx.hashes(b"nessie");
        let got = (h.all(&idx), h.filter());
        assert_eq!(got, (vec![184842, 181808, 49330], 110));
    }

    #[test]
    fn spread_over_nodes_is_roughly_uniform() {
        let idx = index(4, 1 << 12, 3);
        let mut per_node = [0u32; 4];
        for k in 0..40_000u32 {
            let s = idx.hashes(&k.to_le_bytes()).slot(&idx, 0);
            per_node[idx.addr(s).node as usize] += 1;
        }
        for c in per_node {
            assert!((9_000..11_000).contains(&c), "skewed: {per_node:?}");
        }
    }

    #[test]
    fn addr_mapping() {
        let idx = index(3, 100, 3);
        let a = idx.addr(250);
        assert_eq!((a.node, a.region, a.offset), (2, INDEX_REGION, 50 * 8));
    }
}
