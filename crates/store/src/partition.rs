//! Index partitions: the units the index is placed, copied and (issue 42) moved in.
//!
//! The index's slot space is fixed when a cluster is created: `nodes × ites_per_node` slots,
//! slot s at entry s mod `ites_per_node` of the index table of its *home* node
//! s / `ites_per_node` ([`crate::index::Index::addr`]). Keys hash onto slots, so the slot
//! space, and with it this split, never changes while the cluster lives: nodes that join later
//! hold partitions, they add none.
//!
//! Each home table splits into `per_node` partitions of consecutive entries, `ites` each, or
//! `ites` + 1 for the first `rem` = `ites_per_node` mod `per_node` of them (the remainder
//! spread one entry apiece). Partition q is the (q mod per_node)-th of home node q / per_node:
//!
//! ```text
//!  slot space:  | node 0's table              | node 1's table              | ...
//!  partitions:  | q0 | q1 | ... | q(per_node-1) | q(per_node) | ...          |
//! ```
//!
//! Invariants (tested below; `IndexPartitions::of_slot` and `slots` are inverse):
//! - **IP1**: the partitions tile the slot space in order: every slot lies in exactly one.
//! - **IP2**: a partition lies inside one home table, so it is one contiguous byte range of
//!   one region (a copy of it is one range too).
//! - **IP3**: the split is derived from `nodes` and `ites_per_node` alone, so every node of a
//!   cluster derives the same one from the geometry it must share (its fingerprint).
//! - **IP4**: at most [`MAX_PARTITIONS`] partitions of at least [`MIN_PARTITION_ITES`]
//!   entries each (fewer only when a whole home table is smaller).

use std::ops::Range;

use nessie_fabric::NodeId;

use crate::index::Slot;

/// Partitions aimed at across the cluster: enough to balance 100+ nodes within ±10% (about
/// 40 per node at 100 nodes), few enough that a map of them stays small.
pub const TARGET_PARTITIONS: u64 = 4_096;
/// Most partitions (Redis Cluster's 16384 hash slots): partition ids fit a `u16` with room.
pub const MAX_PARTITIONS: u64 = 16_384;
/// Fewest entries a partition is cut to: smaller ones would cost a map entry and a move each
/// for less than a page of index.
pub const MIN_PARTITION_ITES: u64 = 64;

const _: () = assert!(TARGET_PARTITIONS <= MAX_PARTITIONS && MAX_PARTITIONS <= 1 << 16);

/// A partition's number, 0 .. [`IndexPartitions::count`].
pub type PartitionId = u16;

/// How a cluster's index splits into partitions (see the module comment).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IndexPartitions {
    nodes: u32,
    ites_per_node: u64,
    /// Entries per partition (the first `rem` of each home table hold one more).
    ites: u64,
    /// Partitions of each home table that hold `ites` + 1 entries.
    rem: u64,
    /// Partitions per home table.
    per_node: u32,
}

impl IndexPartitions {
    /// The split of `nodes` home tables of `ites_per_node` entries each (IP3: nothing else).
    pub fn new(nodes: u32, ites_per_node: u64) -> Self {
        assert!(
            nodes >= 1 && ites_per_node >= 1,
            "an empty index has no partitions"
        );
        let want = (TARGET_PARTITIONS / nodes as u64)
            .min(ites_per_node / MIN_PARTITION_ITES)
            .max(1);
        let p = Self {
            nodes,
            ites_per_node,
            ites: ites_per_node / want,
            rem: ites_per_node % want,
            per_node: want as u32,
        };
        // IP4.
        assert!(p.count() as u64 <= MAX_PARTITIONS.max(nodes as u64));
        assert!(p.ites >= MIN_PARTITION_ITES.min(ites_per_node));
        p
    }

    /// Partitions in all.
    pub fn count(&self) -> u32 {
        self.nodes * self.per_node
    }

    /// Partitions per home table.
    pub fn per_node(&self) -> u32 {
        self.per_node
    }

    /// Entries of a partition (some hold one more: [`Self::len`]).
    pub fn ites(&self) -> u64 {
        self.ites
    }

    /// Entries of the longest partition.
    pub fn max_len(&self) -> u64 {
        self.ites + (self.rem > 0) as u64
    }

    /// First entry of the `k`-th partition of a home table.
    fn start(&self, k: u64) -> u64 {
        k * self.ites + k.min(self.rem)
    }

    /// Entries of partition `q`.
    pub fn len(&self, q: PartitionId) -> u64 {
        let r = self.slots(q);
        r.end - r.start
    }

    /// The partition slot `s` lies in, and its entry there.
    #[inline]
    pub fn of_slot(&self, s: Slot) -> (PartitionId, u64) {
        debug_assert!(s < self.nodes as u64 * self.ites_per_node);
        let (home, e) = (s / self.ites_per_node, s % self.ites_per_node);
        // The first `rem` partitions hold `ites` + 1 entries.
        let long = self.rem * (self.ites + 1);
        let k = match e < long {
            true => e / (self.ites + 1),
            false => self.rem + (e - long) / self.ites,
        };
        let q = home * self.per_node as u64 + k;
        (q as PartitionId, e - self.start(k))
    }

    /// The partition the byte at `offset` of `home`'s index table lies in, and its entry there.
    pub fn of_home_offset(&self, home: NodeId, offset: u64) -> (PartitionId, u64) {
        self.of_slot(home as u64 * self.ites_per_node + offset / 8)
    }

    /// The slots of partition `q`, in order.
    pub fn slots(&self, q: PartitionId) -> Range<Slot> {
        assert!(
            (q as u32) < self.count(),
            "partition {q} of {}",
            self.count()
        );
        let home = q as u64 / self.per_node as u64;
        let k = q as u64 % self.per_node as u64;
        let (first, end) = (self.start(k), self.start(k + 1));
        home * self.ites_per_node + first..home * self.ites_per_node + end
    }

    /// The node whose index table holds partition `q` at home (IP2: all of it).
    pub fn home(&self, q: PartitionId) -> NodeId {
        (q as u32 / self.per_node) as NodeId
    }

    /// Byte offset of partition `q`'s first entry in its home node's index table.
    pub fn home_offset(&self, q: PartitionId) -> u64 {
        self.start(q as u64 % self.per_node as u64) * 8
    }

    /// The partitions whose home is `node`.
    pub fn of_home(&self, node: NodeId) -> Range<PartitionId> {
        let first = node as u32 * self.per_node;
        first as PartitionId..(first + self.per_node) as PartitionId
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_tables_are_one_partition_and_large_ones_aim_at_the_target() {
        let p = IndexPartitions::new(4, 100);
        assert_eq!((p.per_node(), p.ites(), p.count()), (1, 100, 4));
        let p = IndexPartitions::new(4, 1 << 20);
        assert_eq!(p.count() as u64, TARGET_PARTITIONS);
        assert_eq!(p.ites(), (1 << 20) / 1024);
        // 130 entries: two partitions, of 65 each.
        let p = IndexPartitions::new(3, 130);
        assert_eq!((p.per_node(), p.ites()), (2, 65));
        // 150 entries: two of 75; 191: the remainder on the first.
        let p = IndexPartitions::new(1, 150);
        assert_eq!((p.len(0), p.len(1)), (75, 75));
        let p = IndexPartitions::new(1, 191);
        assert_eq!((p.len(0), p.len(1)), (96, 95));
        // 4096 nodes: one partition each, whatever the table.
        assert_eq!(IndexPartitions::new(4096, 1 << 20).per_node(), 1);
    }

    #[test]
    fn the_remainder_is_spread_one_entry_apiece() {
        // 1000 entries over at most 15 partitions of >= 64: 10 of 67, then 5 of 66.
        let p = IndexPartitions::new(2, 1000);
        assert_eq!(p.per_node(), 15);
        assert_eq!((p.len(0), p.len(9), p.len(10), p.len(14)), (67, 67, 66, 66));
        assert_eq!(p.of_slot(669), (9, 66));
        assert_eq!(p.of_slot(670), (10, 0));
        assert_eq!(p.of_slot(999), (14, 65));
        assert_eq!(p.slots(14).end, 1000);
        assert_eq!(p.slots(15).start, 1000);
        assert_eq!(p.home(15), 1);
        assert_eq!(p.max_len(), 67);
        // Where the target count binds, no partition grows by more than one entry.
        for (nodes, ites) in [(1, 413_695), (4, 103_400)] {
            let p = IndexPartitions::new(nodes, ites);
            assert_eq!(p.max_len(), p.ites() + 1, "{nodes} x {ites}");
        }
    }

    proptest! {
        /// IP1, IP2, IP4, and the split agreeing with `Index::addr`'s home placement.
        #[test]
        fn partitions_tile_the_slot_space(nodes in 1u32..40, ites in 1u64..500_000) {
            let p = IndexPartitions::new(nodes, ites);
            prop_assert!(p.count() as u64 <= MAX_PARTITIONS);
            let mut next = 0;
            for q in 0..p.count() as PartitionId {
                let r = p.slots(q);
                prop_assert_eq!(r.start, next, "partition {} does not follow the last", q);
                prop_assert!(!r.is_empty());
                prop_assert!(p.len(q) >= MIN_PARTITION_ITES.min(ites));
                prop_assert!(p.len(q) == p.ites() || p.len(q) == p.ites() + 1);
                prop_assert!(p.len(q) <= p.max_len());
                // IP2: inside its home table.
                prop_assert_eq!(r.start / ites, p.home(q) as u64);
                prop_assert_eq!((r.end - 1) / ites, p.home(q) as u64);
                prop_assert_eq!(p.home_offset(q), (r.start % ites) * 8);
                prop_assert!(p.of_home(p.home(q)).contains(&q));
                for s in [r.start, r.start + (r.end - r.start) / 2, r.end - 1] {
                    prop_assert_eq!(p.of_slot(s), (q, s - r.start));
                    prop_assert_eq!(p.of_home_offset(p.home(q), (s % ites) * 8), (q, s - r.start));
                }
                next = r.end;
            }
            prop_assert_eq!(next, nodes as u64 * ites);
        }
    }
}
