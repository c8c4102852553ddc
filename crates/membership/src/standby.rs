//! Standby nodes (issue 42, `nessie join`): nodes `cluster.toml` lists but the cluster starts
//! without, which join it later, while it serves.
//!
//! The node count fixes where things are at home (a node's tables and their copies on the
//! next R − 1 nodes, its share of the index partitions), so a cluster that may grow to N nodes
//! is configured with N and starts with some of them standing by (`[cluster] standby`). Epoch 1
//! ([`first_epoch`]) records them `failed` since time 0 and listed in `standby`, and puts
//! everything they would hold on the nodes that start:
//!
//! - **Index.** Every index partition at home on a standby node gets a chain of R index slots
//!   on starting nodes, spread round-robin (the balancer evens the spread out later). The
//!   slots are fresh, so every entry is empty, which is what the partition holds.
//! - **Tables.** Every copy a standby node would hold of another's tables moves to a spare
//!   mirror slot of a starting node that holds no copy of that partition (the re-replication
//!   of `CopyMap::replace`), except copy 0 of the standby node's own tables, which waits at
//!   home for it. A moved copy is full from epoch 1, with nothing to fill, as every mirror at
//!   home is at start: nothing has been written to any copy of any table. Every node is
//!   fenced until it has read epoch 1 (`Policy::fenced_before_epoch_1`), so it decides no CAS
//!   (`Replicated::decide` checks the fence): it claims no page and changes no index entry,
//!   and without a claimed page it allocates no data entry to write; its reclaimer writes only
//!   while the fence lets it; a standby node never ran. So every copy of every table, the
//!   fresh spare slots among them, is all zeros when epoch 1 is read, and moving a copy then
//!   is free. (A move any later is a copy that fills, as after a failure, and pauses its
//!   partition when it becomes full.)
//!
//! Invariants (tested below):
//! - **SB1.** Every partition of a starting node's tables has R copies on starting nodes.
//! - **SB2.** Every index partition at home on a standby node has a chain of R distinct
//!   starting nodes; no slot is used twice.
//! - **SB3.** A standby node holds nothing but copy 0 of its own tables.
//! - **SB4.** Every moved copy is full (nothing to fill: nothing is written before epoch 1),
//!   and a standby partition's copies but copy 0 are on starting nodes, so the standby node,
//!   when it joins, fills its copy 0 from them as a restarted node does (all but the data
//!   region, which no claimed page uses: SB5).
//! - **SB5.** Nothing writes a standby node's tables while it stands by (until it is up: while
//!   it joins too): its own workers do not write, nobody claims a page of it
//!   (`ClassTable::hosts_guarded`, by `Fence::never_up`), and its index partitions are in
//!   index slots. So a node that restarts holding one of their copies fills it from nothing,
//!   all zeros (`Replicated::catch_up`), though no full copy is left to fill from; and the
//!   standby node itself, joining, fills its own copy 0's page words and skips its data
//!   region when none is claimed (its process has written none of its regions either).
//! - **SB6.** Epoch 1's moves are recorded `at_start`: no operation pauses after them as after
//!   a copy that became full (they never had another role).
//!
//! Then a standby node that registers joins at once (it has been failed since time 0, longer
//! than any hold time), catches up copy 0 of its tables (no page claimed: not its data), and is up, leaving the `standby` list
//! only then (until it is up nobody writes its tables: SB5); the balancer gives it its share
//! of index partitions once its join settle time has passed. While it stands by it is kept out of
//! everything a failed node would still be part of: nobody places new entries on its pages
//! (its tables have a copy fewer), its copy 0 is not moved to a spare slot, and it does not
//! count as under-replicated.

use nessie_protocols::replica::{CopyMap, ReplicaSet};

use crate::{Configuration, CopyMove, IndexChain, NodeState, Registrations, SlotCopy};

/// Why epoch 1 cannot place what the standby nodes would hold.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StandbyError {
    #[error("standby node {0} is not one of the cluster's nodes")]
    Unknown(u16),
    #[error("{replicas} copies need {replicas} nodes that start; {starting} would (standby: {standby:?})")]
    TooFewStarting {
        replicas: u8,
        starting: usize,
        standby: Vec<u16>,
    },
    #[error("standby nodes need index slots on the nodes that start (cluster.index_slots, and replication)")]
    NoIndexSlots,
    #[error(
        "copies the standby nodes would hold need {needed} spare slots on the nodes that start; {free} are free \
         (raise cluster.spare_copies, `nessie up --spare-copies`)"
    )]
    NoSpareSlot { needed: usize, free: usize },
    #[error("index partitions of the standby nodes need more index slots than node {node} has ({slots})")]
    NoIndexSlot { node: u16, slots: u16 },
}

/// Epoch 1 of a cluster of `ids` whose nodes `standby` start later (see the module): the
/// standby nodes failed since 0, their index partitions in chains of `set`'s index slots on the
/// others, and the copies they would hold in spare slots. `reg`: the registrations now.
pub fn first_epoch(
    ids: &[u16],
    standby: &[u16],
    reg: &Registrations,
    set: &ReplicaSet,
) -> Result<Configuration, StandbyError> {
    let mut c = Configuration::initial(ids.iter().copied(), reg);
    if standby.is_empty() {
        return Ok(c);
    }
    if let Some(&s) = standby.iter().find(|s| !ids.contains(s)) {
        return Err(StandbyError::Unknown(s));
    }
    let starting: Vec<u16> = ids
        .iter()
        .copied()
        .filter(|n| !standby.contains(n))
        .collect();
    if starting.len() < set.replicas() as usize {
        return Err(StandbyError::TooFewStarting {
            replicas: set.replicas(),
            starting: starting.len(),
            standby: standby.to_vec(),
        });
    }
    let Some(parts) = set.index_partitions().filter(|_| set.index_slots() > 0) else {
        return Err(StandbyError::NoIndexSlots);
    };
    for m in c.nodes.iter_mut().filter(|m| standby.contains(&m.id)) {
        m.state = NodeState::Failed;
        m.incarnation = 0;
    }
    let mut standby = standby.to_vec();
    standby.sort_unstable();
    standby.dedup();
    c.standby = standby.clone();

    // Tables: what a standby node would hold of others, and of the other standby nodes, moves.
    let mut map = CopyMap::home(set);
    let usable = |n: u16| starting.contains(&n);
    let mut needed = 0;
    let mut moves = Vec::new();
    for &k in &standby {
        let (placed, stuck) = map.replace_where(set, k, usable, |p, j| !(p == k && j == 0));
        needed += placed.len() + stuck.len();
        if !stuck.is_empty() {
            let free = starting.len() * set.spare_slots().len();
            return Err(StandbyError::NoSpareSlot { needed, free });
        }
        for m in placed {
            map.set_place(m.partition, m.j, m.to);
            moves.push(CopyMove {
                partition: m.partition,
                copy: m.j,
                node: m.to.node,
                slot: m.to.slot,
                // Full at once, as every home mirror is at start: nothing has been written
                // to any copy (SB4).
                receiving: false,
                at_start: true,
                full_since_ns: 0,
            });
        }
    }
    c.moves = moves;

    // Index: each standby node's partitions to R starting nodes, round-robin, in fresh slots
    // (nothing uses a slot in epoch 1 but these chains).
    let slots = set.index_slots();
    let r = set.replicas() as usize;
    let mut used = vec![0u16; starting.len()];
    let mut next = 0usize;
    for &k in &standby {
        for q in parts.of_home(k) {
            let mut copies = Vec::with_capacity(r);
            for i in 0..r {
                let at = (next + i) % starting.len();
                let node = starting[at];
                if used[at] >= slots {
                    return Err(StandbyError::NoIndexSlot { node, slots });
                }
                copies.push(SlotCopy {
                    node,
                    slot: used[at],
                });
                used[at] += 1;
            }
            c.index_chains.push(IndexChain {
                partition: q,
                copies,
                migrating: false,
                handed_ns: 0,
                since_ns: 0,
                prepared: true,
                starter: starting[0],
            });
            next += 1;
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;
    use nessie_protocols::ProtocolConfig;
    use nessie_store::{IndexPartitions, IteLayout};

    fn set(replicas: u8, nodes: u16, spare: u8, slots: u16) -> ReplicaSet {
        let ite = IteLayout::new(20, 4, 7).unwrap();
        ReplicaSet::new(replicas, nodes, ite, &ProtocolConfig::default())
            .unwrap()
            .with_spare_copies(spare)
            .unwrap()
            .with_index_slots(IndexPartitions::new(nodes as u32, 64), slots)
            .unwrap()
    }

    /// SB1 to SB4 on epoch 1 of `nodes` nodes, `standby` of them standing by.
    fn check(replicas: u8, nodes: u16, standby: &[u16], spare: u8) -> Configuration {
        let s = set(replicas, nodes, spare, 64);
        let ids: Vec<u16> = (0..nodes).collect();
        let c = first_epoch(&ids, standby, &Registrations::default(), &s).unwrap();
        let starting = |n: u16| !standby.contains(&n);
        let map = c.copy_map(&s);
        for p in 0..nodes {
            let holders: Vec<u16> = (0..replicas).map(|j| map.place(p, j).node).collect();
            let mut distinct = holders.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(
                distinct.len(),
                replicas as usize,
                "partition {p}: {holders:?}"
            );
            if starting(p) {
                assert!(
                    holders.iter().all(|&n| starting(n)),
                    "SB1: partition {p} on {holders:?}"
                );
            } else {
                assert_eq!(holders[0], p, "copy 0 of a standby partition waits at home");
                assert!(
                    holders[1..].iter().all(|&n| starting(n)),
                    "SB4: {p} on {holders:?}"
                );
            }
        }
        assert!(
            c.moves.iter().all(|m| !m.receiving && m.at_start),
            "SB4: {:?}",
            c.moves
        );
        for &k in standby {
            assert_eq!(
                map.held_by(k),
                vec![(k, 0)],
                "SB3: node {k} holds only its own copy 0"
            );
            let m = c.nodes.iter().find(|m| m.id == k).unwrap();
            assert_eq!(m.state, NodeState::Failed);
        }
        let parts = s.index_partitions().unwrap();
        let mut slots_used = Vec::new();
        for &k in standby {
            for q in parts.of_home(k) {
                let ch = c.index_chains.iter().find(|ch| ch.partition == q);
                let ch = ch.unwrap_or_else(|| panic!("SB2: index partition {q} has no chain"));
                assert!(ch.prepared && !ch.migrating);
                let mut nodes: Vec<u16> = ch.copies.iter().map(|c| c.node).collect();
                assert!(nodes.iter().all(|&n| starting(n)), "SB2: {q} on {nodes:?}");
                nodes.sort_unstable();
                nodes.dedup();
                assert_eq!(nodes.len(), replicas as usize, "SB2: {q}");
                slots_used.extend(ch.copies.iter().map(|c| (c.node, c.slot)));
            }
        }
        let n = slots_used.len();
        slots_used.sort_unstable();
        slots_used.dedup();
        assert_eq!(slots_used.len(), n, "SB2: a slot used twice");
        assert_eq!(c.standby, standby);
        c
    }

    #[test]
    fn epoch_1_places_what_standby_nodes_would_hold_on_the_others() {
        check(2, 5, &[3, 4], 1);
        check(2, 4, &[1], 1);
        check(3, 6, &[4, 5], 2);
        check(3, 7, &[1, 4], 2);
        let none = check(2, 3, &[], 1);
        assert!(none.moves.is_empty() && none.index_chains.is_empty());
    }

    #[test]
    fn epoch_1_refuses_what_it_cannot_place() {
        let s = set(2, 5, 1, 64);
        let ids: Vec<u16> = (0..5).collect();
        let r = Registrations::default();
        assert_eq!(
            first_epoch(&ids, &[7], &r, &s),
            Err(StandbyError::Unknown(7))
        );
        assert!(matches!(
            first_epoch(&ids, &[1, 2, 3, 4], &r, &s),
            Err(StandbyError::TooFewStarting { starting: 1, .. })
        ));
        // Four standby of six with two copies: eight copies for two spare slots.
        let s6 = set(2, 6, 1, 64);
        let ids6: Vec<u16> = (0..6).collect();
        assert!(matches!(
            first_epoch(&ids6, &[2, 3, 4, 5], &r, &s6),
            Err(StandbyError::NoSpareSlot { .. })
        ));
        let few_slots = set(2, 5, 1, 1);
        assert!(matches!(
            first_epoch(&ids, &[3, 4], &r, &few_slots),
            Err(StandbyError::NoIndexSlot { .. })
        ));
    }

    /// A standby node that registers joins at once, and leaves the list once it is up; until
    /// then its own copy 0 is never moved to a spare slot (a failed node's would be), and it
    /// cannot be made to leave.
    #[test]
    fn a_standby_node_keeps_its_copy_0_and_joins_when_it_registers() {
        let s = set(2, 5, 1, 64);
        let ids: Vec<u16> = (0..5).collect();
        let c = first_epoch(&ids, &[3, 4], &Registrations::default(), &s).unwrap();
        let policy = Policy {
            hold_ns: 1_000,
            replacing: Some(crate::Replacing {
                after_ns: 100,
                set: s.clone(),
            }),
            ..Policy::default()
        };
        let reg = |present: &[u16]| Registrations {
            present: present.to_vec(),
            ready: vec![0, 1, 2],
            ..Registrations::default()
        };
        // Nothing of the standby nodes moves, however long they have been failed.
        assert_eq!(c.successor(&reg(&[0, 1, 2]), 1_000_000, &policy), None);
        let next = c.clone();
        assert_eq!(next.copy_map(&s).held_by(3), vec![(3, 0)]);
        assert_eq!(next.copy_map(&s).held_by(4), vec![(4, 0)]);
        assert_eq!(next.standby, vec![3, 4]);
        assert_eq!(next.successor(&reg(&[0, 1, 2]), 2_000_000, &policy), None);
        let joined = next
            .successor(&reg(&[0, 1, 2, 3]), 3_000_000, &policy)
            .unwrap();
        assert_eq!(joined.state(3), Some(NodeState::Joining));
        assert_eq!(joined.copy_map(&s).held_by(3), vec![(3, 0)]);
        // Standby until it is up: nobody writes its tables meanwhile (SB5).
        assert_eq!(joined.standby, vec![3, 4]);
        assert!(matches!(
            joined.set_leaving(3, true, &s),
            Err(crate::MigrationError::Standby(3))
        ));
        let mut ready = reg(&[0, 1, 2, 3]);
        ready.ready.push(3);
        let up = joined.successor(&ready, 4_000_000, &policy).unwrap();
        assert_eq!(up.state(3), Some(NodeState::Up));
        assert_eq!(up.standby, vec![4]);
    }

    /// Epoch 1's moves pause nothing (they never had another role), a later move does; and a
    /// node may leave while others still stand by (copy 0 of a standby node's tables is not a
    /// copy that leaving could lose).
    #[test]
    fn epoch_1_moves_pause_nothing_and_standby_nodes_do_not_block_a_leave() {
        use nessie_protocols::replica::tables_settling;
        let s = set(2, 5, 1, 64);
        let ids: Vec<u16> = (0..5).collect();
        let c = first_epoch(&ids, &[3, 4], &Registrations::default(), &s).unwrap();
        let moved: Vec<u16> = c.moves.iter().map(|m| m.partition).collect();
        assert_eq!(moved, vec![2, 3]);
        let now = || nessie_fabric::monotonic_ns();
        let fence = nessie_protocols::Fence::unfenced();
        crate::apply(&c, (0, 1), &fence, nessie_fabric::wall_clock_ns(), 0);
        assert!(fence.never_up(3) && fence.never_up(4) && !fence.never_up(0));
        assert!(!moved.iter().any(|&p| tables_settling(&s, &fence, p, now())));
        // The same moves made later (a copy that became full) pause their partitions.
        let mut later = c.clone();
        later.moves.iter_mut().for_each(|m| m.at_start = false);
        let fence = nessie_protocols::Fence::unfenced();
        crate::apply(&later, (0, 1), &fence, nessie_fabric::wall_clock_ns(), 0);
        assert!(moved.iter().all(|&p| tables_settling(&s, &fence, p, now())));
        assert_eq!(c.may_leave(0, &s), Ok(()));
    }
}
