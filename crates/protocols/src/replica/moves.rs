//! Re-replication's plan: where the copies of a node gone for good move to.
//!
//! Copy j of partition p lives at home on node (p + j) mod N, in mirror slot j
//! ([`ReplicaSet::holder`]). When a node is gone for good, each copy it held moves to a spare
//! mirror slot ([`ReplicaSet::spare_slots`]) of a node that is up and holds no copy of that
//! partition, the least loaded first; the copy keeps its place in the chain, so every rule of
//! replication applies to it as to a copy that never moved. Membership applies a plan by
//! recording the moves in every node's fence ([`crate::fence::Fence::move_copy`]): receiving
//! first, full once the new holder has filled it (`Replicated::catch_up`).

use nessie_fabric::NodeId;

use super::ReplicaSet;
use crate::fence::Fence;

/// Where one copy is: its node and the mirror slot it fills there.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Placement {
    pub node: NodeId,
    pub slot: u8,
}

/// One copy moving: copy `j` of `partition` goes to `to`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub partition: NodeId,
    pub j: u8,
    pub to: Placement,
}

/// Where every partition's copies are, in chain order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyMap {
    places: Vec<Vec<Placement>>,
}

impl CopyMap {
    /// Every copy at home.
    pub fn home(set: &ReplicaSet) -> Self {
        let places = (0..set.nodes())
            .map(|p| {
                (0..set.replicas())
                    .map(|j| Placement {
                        node: set.holder(p, j),
                        slot: j,
                    })
                    .collect()
            })
            .collect();
        Self { places }
    }

    /// The map as `fence` has it: home, with the moves it recorded.
    pub fn of(set: &ReplicaSet, fence: &Fence) -> Self {
        let mut map = Self::home(set);
        for (p, copies) in map.places.iter_mut().enumerate() {
            for (j, place) in copies.iter_mut().enumerate() {
                if let Some(m) = fence.moved_copy(p as NodeId, j as u8) {
                    *place = Placement {
                        node: m.node,
                        slot: m.slot,
                    };
                }
            }
        }
        map
    }

    /// Where copy `j` of `partition` is.
    pub fn place(&self, partition: NodeId, j: u8) -> Placement {
        self.places[partition as usize][j as usize]
    }

    /// Record that copy `j` of `partition` is at `at`.
    pub fn set_place(&mut self, partition: NodeId, j: u8, at: Placement) {
        self.places[partition as usize][j as usize] = at;
    }

    /// The copies `node` holds, as (partition, chain position).
    pub fn held_by(&self, node: NodeId) -> Vec<(NodeId, u8)> {
        let mut held = Vec::new();
        for (p, copies) in self.places.iter().enumerate() {
            for (j, place) in copies.iter().enumerate() {
                if place.node == node {
                    held.push((p as NodeId, j as u8));
                }
            }
        }
        held
    }

    /// Where the copies `gone` holds go: for each, a free spare slot on a node `usable` says
    /// may take copies that holds no copy of that partition yet, the node holding fewest
    /// copies first (ties: the lowest id). Copies no node can take are returned apart: the
    /// cluster stays under-replicated in them.
    pub fn replace(
        &self,
        set: &ReplicaSet,
        gone: NodeId,
        usable: impl Fn(NodeId) -> bool,
    ) -> (Vec<Move>, Vec<(NodeId, u8)>) {
        self.replace_where(set, gone, usable, |_, _| true)
    }

    /// [`Self::replace`] for only the copies `which(partition, j)` picks of those `gone` holds.
    pub fn replace_where(
        &self,
        set: &ReplicaSet,
        gone: NodeId,
        usable: impl Fn(NodeId) -> bool,
        which: impl Fn(NodeId, u8) -> bool,
    ) -> (Vec<Move>, Vec<(NodeId, u8)>) {
        let mut map = self.clone();
        let (mut moves, mut stuck) = (Vec::new(), Vec::new());
        for (p, j) in self.held_by(gone).into_iter().filter(|&(p, j)| which(p, j)) {
            let taken = |m: &CopyMap, n: NodeId| {
                set.spare_slots().find(|&s| {
                    !m.places
                        .iter()
                        .flatten()
                        .any(|c| c.node == n && c.slot == s)
                })
            };
            let target = (0..set.nodes())
                .filter(|&n| n != gone && usable(n))
                .filter(|&n| map.places[p as usize].iter().all(|c| c.node != n))
                .filter_map(|n| taken(&map, n).map(|slot| Placement { node: n, slot }))
                .min_by_key(|t| (map.held_by(t.node).len(), t.node));
            match target {
                Some(to) => {
                    map.places[p as usize][j as usize] = to;
                    moves.push(Move {
                        partition: p,
                        j,
                        to,
                    });
                }
                None => stuck.push((p, j)),
            }
        }
        (moves, stuck)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProtocolConfig;
    use nessie_store::IteLayout;
    use proptest::prelude::*;

    fn set(replicas: u8, nodes: u16, spare: u8) -> ReplicaSet {
        let ite = IteLayout::new(20, 4, 7).unwrap();
        ReplicaSet::new(replicas, nodes, ite, &ProtocolConfig::default())
            .unwrap()
            .with_spare_copies(spare)
            .unwrap()
    }

    #[test]
    fn a_gone_node_s_copies_go_to_spare_slots_of_nodes_without_that_partition() {
        let s = set(2, 4, 1);
        let map = CopyMap::home(&s);
        assert_eq!(map.held_by(1), vec![(0, 1), (1, 0)]);
        let (moves, stuck) = map.replace(&s, 1, |_| true);
        assert!(stuck.is_empty());
        // Partition 0 is on 0 and 1: its copy goes to 2 (as few copies as 3, lower id).
        // Partition 1 is on 1 and 2: its copy goes to 0 (as few copies as 3, lower id).
        let to = |node, slot| Placement { node, slot };
        assert_eq!(
            moves,
            vec![
                Move {
                    partition: 0,
                    j: 1,
                    to: to(2, 2)
                },
                Move {
                    partition: 1,
                    j: 0,
                    to: to(0, 2)
                },
            ]
        );
    }

    #[test]
    fn without_a_spare_slot_or_a_usable_node_a_copy_stays_put() {
        let s = set(2, 3, 0);
        let (moves, stuck) = CopyMap::home(&s).replace(&s, 0, |_| true);
        assert!(moves.is_empty());
        assert_eq!(stuck, vec![(0, 0), (2, 1)]);
        let s = set(2, 3, 2);
        // Node 2 cannot take copies: partition 0 (on 0 and 1) has nowhere else to go.
        let (moves, stuck) = CopyMap::home(&s).replace(&s, 0, |n| n != 2);
        assert_eq!(stuck, vec![(0, 0)]);
        assert_eq!(moves.len(), 1);
        assert_eq!(moves[0].to.node, 1);
    }

    #[test]
    fn the_fence_s_moves_are_the_map_s() {
        let s = set(3, 5, 2);
        let f = Fence::unfenced();
        let (moves, _) = CopyMap::home(&s).replace(&s, 4, |_| true);
        for m in &moves {
            let at = crate::fence::MovedCopy {
                node: m.to.node,
                slot: m.to.slot,
                receiving: true,
            };
            f.move_copy(m.partition, m.j, Some(at));
        }
        let map = CopyMap::of(&s, &f);
        assert!(map.held_by(4).is_empty());
        for m in &moves {
            assert_eq!(map.place(m.partition, m.j), m.to);
        }
    }

    proptest! {
        /// Whatever fails, in whatever order: no partition ever has two copies on one node, no
        /// slot holds two copies, and a copy is stuck only if no node could take it.
        #[test]
        fn moves_keep_copies_apart(
            nodes in 3u16..9,
            replicas in 2u8..=3,
            spare in 0u8..4,
            order in proptest::collection::vec(0u16..9, 1..4),
        ) {
            prop_assume!(replicas as u16 <= nodes);
            let s = set(replicas, nodes, spare);
            let mut map = CopyMap::home(&s);
            let mut gone = std::collections::BTreeSet::new();
            for g in order.into_iter().map(|g| g % nodes) {
                if !gone.insert(g) || gone.len() as u16 >= nodes {
                    continue;
                }
                let (moves, stuck) = map.replace(&s, g, |n| !gone.contains(&n));
                for m in moves {
                    prop_assert!(!gone.contains(&m.to.node));
                    map.places[m.partition as usize][m.j as usize] = m.to;
                }
                for (p, _) in stuck {
                    let free = (0..nodes).filter(|n| !gone.contains(n)).any(|n| {
                        map.places[p as usize].iter().all(|c| c.node != n)
                            && s.spare_slots().any(|sl| {
                                !map.places.iter().flatten().any(|c| c.node == n && c.slot == sl)
                            })
                    });
                    prop_assert!(!free, "partition {p} was stuck with room left");
                }
                for copies in &map.places {
                    let live: Vec<_> = copies.iter().filter(|c| !gone.contains(&c.node)).collect();
                    let nodes_of: std::collections::BTreeSet<_> = live.iter().map(|c| c.node).collect();
                    prop_assert_eq!(nodes_of.len(), live.len(), "two copies on one node");
                }
                let all: Vec<_> = map.places.iter().flatten().filter(|c| !gone.contains(&c.node)).collect();
                let slots: std::collections::BTreeSet<_> = all.iter().map(|c| (c.node, c.slot)).collect();
                prop_assert_eq!(slots.len(), all.len(), "two copies in one slot");
            }
        }
    }
}
