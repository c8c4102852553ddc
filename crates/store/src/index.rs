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
//!
//! Two placements ([`Placement`]):
//! - **Decoupled** (Nessie): candidates range over the whole cluster's slots, as above.
//! - **Coupled** (the NessieSD / NessieHY baselines, "partially coupled" in the paper): every key
//!   has an *owner* node, `xxh3_64_with_seed(key, OWNER_SEED) % nodes` (a hash independent of the
//!   candidate hashes), and all N candidates are slots of the owner's index table: candidate `i`
//!   is `owner × ites_per_node + reduce_local(xxh3_64_with_seed(key, SEEDS[i]))`, re-hashed like
//!   the decoupled ones so they stay distinct. The key's DTEs are written by the owner's server
//!   threads into the owner's data table, so ITEs only ever refer to DTEs on their own node.

use nessie_fabric::{NodeId, RemoteAddr};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::geometry::{Geometry, GeometryError, GeometryProblem};
use crate::ite::IteLayout;
use crate::limits::MAX_HASH_FUNCTIONS;
use crate::partition::{IndexPartitions, PartitionId};
use crate::INDEX_REGION;

/// Seeds of the candidate hashes: unrelated 64-bit words (splitmix64 outputs), never seeds a
/// few bits apart. xxh3 mixes a short key's bytes with `constant + seed` before its avalanche,
/// so seeds that differ in their low bits let keys that differ there (`k26`, `k27`) hash alike
/// under different seeds: neighbours shared two of three candidates, and cuckoo moves found
/// no destination off the path at 7 % load (layout version 4; test
/// `similar_short_keys_get_independent_candidates`).
const SEEDS: [u64; MAX_HASH_FUNCTIONS as usize] = [
    0xe2bb_6892_1590_1d67,
    0x3110_5443_388c_c03d,
    0xbbba_5ae6_be06_89f6,
    0xabcd_224a_35e4_7264,
    0x9236_b21a_c6f1_a472,
    0xddf6_25bb_130e_2094,
    0x592e_41ad_f2c1_2802,
    0x9886_46b5_1f89_c890,
];
const FILTER_SEED: u64 = 0xb06b_01bb_80ef_384a;
/// Seed of the owner hash of the coupled placement (independent of `SEEDS` and `FILTER_SEED`).
const OWNER_SEED: u64 = 0xfda4_cc3e_927f_c9ba;
const REHASH_STEP: u64 = 0x9e37_79b9_7f4a_7c15;
/// Re-hash attempts before giving up on a distinct candidate (validation guarantees at least
/// 2N slots, so this bound is never the limiting factor in practice).
const MAX_REHASH: u64 = 64;

/// Global slot number of an ITE.
pub type Slot = u64;

/// Where a key's candidate ITEs may lie.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Anywhere in the cluster (Nessie: index and data decoupled).
    #[default]
    Decoupled,
    /// All in the index table of the key's owner node (NessieSD / NessieHY: partially coupled).
    Coupled,
}

/// Hash parameters of a cluster.
#[derive(Clone, Debug)]
pub struct Index {
    pub ites_per_node: u64,
    pub total: u64,
    pub n: usize,
    pub ite: IteLayout,
    pub placement: Placement,
    /// How the slots split into partitions (`partition.rs`; the addresses below are each
    /// partition's home, IP2).
    pub partitions: IndexPartitions,
}

impl Index {
    /// The decoupled index (Nessie).
    pub fn new(g: &Geometry, ite: IteLayout) -> Self {
        Self {
            ites_per_node: g.ites_per_node,
            total: g.total_ites(),
            n: g.hash_functions as usize,
            ite,
            placement: Placement::Decoupled,
            partitions: IndexPartitions::new(g.nodes, g.ites_per_node),
        }
    }

    /// The coupled index of the SD/HY baselines: a key's N candidates all lie in its owner's
    /// index table. Each node's table must hold at least 2N entries (N distinct candidates
    /// with room to migrate), the per-node analogue of the decoupled total-size check.
    pub fn new_coupled(g: &Geometry, ite: IteLayout) -> Result<Self, GeometryError> {
        if g.ites_per_node < 2 * g.hash_functions as u64 {
            return Err(GeometryProblem::CoupledIndexTooSmall {
                ites_per_node: g.ites_per_node,
                hash_functions: g.hash_functions,
                needed: 2 * g.hash_functions as u64,
            }
            .into());
        }
        Ok(Self {
            placement: Placement::Coupled,
            ..Self::new(g, ite)
        })
    }

    /// An index with the given placement.
    pub fn with_placement(
        g: &Geometry,
        ite: IteLayout,
        placement: Placement,
    ) -> Result<Self, GeometryError> {
        match placement {
            Placement::Decoupled => Ok(Self::new(g, ite)),
            Placement::Coupled => Self::new_coupled(g, ite),
        }
    }

    /// Number of nodes the index spans.
    pub fn nodes(&self) -> u64 {
        self.total / self.ites_per_node
    }

    /// The node owning `key` under the coupled placement (its candidates and DTEs live there);
    /// `None` for the decoupled index, where keys have no owner.
    pub fn owner(&self, key: &[u8]) -> Option<NodeId> {
        match self.placement {
            Placement::Decoupled => None,
            Placement::Coupled => Some(self.owner_unchecked(key)),
        }
    }

    fn owner_unchecked(&self, key: &[u8]) -> NodeId {
        (xxh3_64_with_seed(key, OWNER_SEED) % self.nodes()) as NodeId
    }

    /// Start hashing `key`: filter bits (and, when coupled, the owner) now, candidates on demand.
    pub fn hashes<'k>(&self, key: &'k [u8]) -> KeyHashes<'k> {
        let (base, range) = match self.placement {
            Placement::Decoupled => (0, self.total),
            Placement::Coupled => (
                self.owner_unchecked(key) as u64 * self.ites_per_node,
                self.ites_per_node,
            ),
        };
        KeyHashes {
            key,
            filter: self.ite.filter_of(xxh3_64_with_seed(key, FILTER_SEED)),
            base,
            range,
            slots: [0; MAX_HASH_FUNCTIONS as usize],
            computed: 0,
        }
    }

    /// The partition slot `s` lies in, and its entry there.
    #[inline]
    pub fn partition_of(&self, s: Slot) -> (PartitionId, u64) {
        self.partitions.of_slot(s)
    }

    /// Where slot `s` lives: entry s mod `ites_per_node` of its home node's index table, which
    /// is also where its partition's home copy puts it (IP2, tested).
    #[inline]
    pub fn addr(&self, s: Slot) -> RemoteAddr {
        debug_assert!(s < self.total);
        RemoteAddr::new(
            (s / self.ites_per_node) as NodeId,
            INDEX_REGION,
            (s % self.ites_per_node) * 8,
        )
    }
}

/// Map a hash onto `0..range`. Lemire's multiply-shift: unbiased enough and cheaper than a modulo.
#[inline]
fn reduce(h: u64, range: u64) -> u64 {
    ((h as u128 * range as u128) >> 64) as u64
}

/// The lazily computed candidates of one key.
#[derive(Clone, Debug)]
pub struct KeyHashes<'k> {
    key: &'k [u8],
    filter: u64,
    /// First slot and number of slots candidates are drawn from (the whole cluster when
    /// decoupled, the owner's table when coupled).
    base: Slot,
    range: u64,
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
                let s = self.base + reduce(xxh3_64_with_seed(self.key, seed), self.range);
                if !self.slots[..c].contains(&s) {
                    break s;
                }
                attempt += 1;
                assert!(
                    attempt < MAX_REHASH,
                    "no distinct candidate after {MAX_REHASH} re-hashes"
                );
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
        let g = Geometry {
            nodes,
            ites_per_node: per_node,
            hash_functions: n,
            ..Geometry::default()
        };
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

    /// Keys that differ in a byte or two (`k26`, `k27`, `user:1041`) get independent
    /// candidates: no more pairs sharing two of their three candidates than random sets
    /// would. With seeds one bit apart, xxh3's short-input paths (the seed is added to a
    /// constant and XORed with the key's bytes) gave neighbours two shared candidates, and a
    /// cuckoo index of 1,536 slots refused a PUT at 7 % load: the moved key's alternatives
    /// were all on the migration path.
    #[test]
    fn similar_short_keys_get_independent_candidates() {
        let idx = index(3, 512, 3);
        let families: [&dyn Fn(u32) -> Vec<u8>; 4] = [
            &|i| format!("k{i}").into_bytes(),
            &|i| format!("user:{i}").into_bytes(),
            &|i| format!("item-{i:08}").into_bytes(),
            &|i| i.to_le_bytes().to_vec(),
        ];
        const KEYS: u32 = 1000;
        for (f, family) in families.iter().enumerate() {
            let sets: Vec<Vec<Slot>> = (0..KEYS)
                .map(|i| idx.hashes(&family(i)).all(&idx))
                .collect();
            let mut sharing_two = 0;
            for a in 0..sets.len() {
                for b in a + 1..sets.len() {
                    let shared = sets[a].iter().filter(|s| sets[b].contains(s)).count();
                    sharing_two += (shared >= 2) as u32;
                }
            }
            // Random sets: P(share >= 2) ~ 3 * 3 * 2 / 1536^2 per pair (choose the two shared
            // slots of each set and their pairing), about 3.8 expected among 499,500 pairs.
            assert!(
                sharing_two <= 16,
                "family {f}: {sharing_two} pairs of keys share two candidates (random: ~4)"
            );
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
        assert_eq!(got, (vec![144279, 102611, 164872], 122)); // layout version 5
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

    #[test]
    fn a_slot_s_address_is_where_its_partition_s_home_copy_holds_it() {
        for (nodes, per_node) in [(3, 100), (2, 1000), (5, 1 << 12), (1, 64)] {
            let idx = index(nodes, per_node, 3);
            for s in (0..idx.total).step_by(7).chain([idx.total - 1]) {
                let (q, e) = idx.partition_of(s);
                let want = RemoteAddr::new(
                    idx.partitions.home(q),
                    INDEX_REGION,
                    idx.partitions.home_offset(q) + e * 8,
                );
                assert_eq!(idx.addr(s), want, "slot {s} of {nodes} x {per_node}");
            }
        }
    }

    fn coupled(nodes: u32, per_node: u64, n: u8) -> Index {
        let g = Geometry {
            nodes,
            ites_per_node: per_node,
            hash_functions: n,
            ..Geometry::default()
        };
        let (ite, _) = g.validate().unwrap();
        Index::new_coupled(&g, ite).unwrap()
    }

    #[test]
    fn decoupled_index_has_no_owner() {
        let idx = index(3, 1 << 16, 3);
        assert_eq!(idx.placement, Placement::Decoupled);
        assert_eq!(idx.owner(b"nessie"), None);
    }

    #[test]
    fn coupled_candidates_are_distinct_and_all_on_the_owner() {
        // 6 slots per node for 3 candidates: collisions are frequent and must be re-hashed.
        let idx = coupled(3, 6, 3);
        let mut owners = [0u32; 3];
        for k in 0..3000u32 {
            let key = k.to_le_bytes();
            let owner = idx.owner(&key).unwrap();
            owners[owner as usize] += 1;
            let a = idx.hashes(&key).all(&idx);
            let mut sorted = a.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), 3, "candidates of {k} not distinct: {a:?}");
            for &s in &a {
                assert!(s < idx.total);
                let addr = idx.addr(s);
                assert_eq!(
                    addr.node, owner,
                    "candidate {s} of key {k} is not on its owner {owner}"
                );
                assert!(addr.offset < 6 * 8);
            }
            assert_eq!(a, idx.hashes(&key).all(&idx), "hashing is deterministic");
        }
        assert!(owners.iter().all(|&c| c > 800), "owners skewed: {owners:?}");
    }

    #[test]
    fn coupled_spread_within_the_owner_and_over_owners_is_roughly_uniform() {
        let idx = coupled(4, 1 << 12, 3);
        let mut per_node = [0u32; 4];
        let mut per_half = [0u32; 2];
        for k in 0..40_000u32 {
            let key = k.to_le_bytes();
            let s = idx.hashes(&key).slot(&idx, 0);
            let a = idx.addr(s);
            per_node[a.node as usize] += 1;
            per_half[(a.offset / 8 >= (1 << 11)) as usize] += 1;
        }
        for c in per_node {
            assert!((9_000..11_000).contains(&c), "owners skewed: {per_node:?}");
        }
        assert!(
            (19_000..21_000).contains(&per_half[0]),
            "slots within a node skewed: {per_half:?}"
        );
    }

    #[test]
    fn owner_is_independent_of_the_decoupled_first_candidate() {
        // If the owner hash reused a candidate seed, the owner would equal the node of the
        // decoupled first candidate far more often than 1 in `nodes`.
        let dec = index(4, 1 << 12, 3);
        let cpl = coupled(4, 1 << 12, 3);
        let same = (0..20_000u32)
            .filter(|k| {
                let key = k.to_le_bytes();
                dec.addr(dec.hashes(&key).slot(&dec, 0)).node == cpl.owner(&key).unwrap()
            })
            .count();
        assert!(
            (4_000..6_000).contains(&same),
            "owner correlates with candidate 0: {same} of 20000"
        );
    }

    #[test]
    fn coupled_known_values_pin_the_format() {
        let idx = coupled(3, 1 << 16, 3);
        let mut h = idx.hashes(b"nessie");
        let got = (idx.owner(b"nessie").unwrap(), h.all(&idx), h.filter());
        assert_eq!(got, (2, vec![179165, 165275, 186029], 122)); // layout version 5
    }

    #[test]
    fn coupled_needs_two_n_slots_per_node() {
        let g = Geometry {
            nodes: 4,
            ites_per_node: 5,
            hash_functions: 3,
            ..Geometry::default()
        };
        let (ite, _) = g.validate().unwrap(); // fine decoupled: 20 slots in total
        let e = Index::new_coupled(&g, ite).unwrap_err().to_string();
        assert!(e.contains("ites_per_node = 5"), "{e}");
        assert!(Index::with_placement(&g, ite, Placement::Decoupled).is_ok());
        let g = Geometry {
            ites_per_node: 6,
            ..g
        };
        assert!(Index::with_placement(&g, g.validate().unwrap().0, Placement::Coupled).is_ok());
    }
}
