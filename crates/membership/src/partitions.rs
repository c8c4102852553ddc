//! The partition map and its planner (issue 42, step 1): where the copies of every partition
//! live, and which copies move when nodes join, leave or fail.
//!
//! The key space's index is split into `partitions` partitions (many more than nodes, so that
//! a node joining or leaving moves a small share of each node's copies and the work spreads).
//! Each partition has a **chain** of up to R distinct nodes; the first is its primary. The map
//! carries an epoch; membership publishes it in etcd and every node adopts a newer one.
//!
//! Invariants of every map (checked by [`PartitionMap::validate`]):
//! - **PM1**: a chain holds distinct nodes, each below [`MAX_NODE_ID`] + 1.
//! - **PM2**: a chain holds between 1 and R nodes.
//!
//! Invariants of every plan ([`PartitionMap::plan`]) and the map it makes ([`PartitionMap::apply`]):
//! - **PM3**: a copy that stays keeps its place in its chain's order; a new copy joins at the
//!   tail. So the primary is always a copy that was already there, filled, unless the whole
//!   chain is new; a new copy is filled before it may lead.
//! - **PM4**: the map covers only the members given: each chain holds min(R, members) of them
//!   (a partition short of that is listed in [`Plan::short`]).
//! - **PM5**: every member holds between [`balance_bounds`]'s `lo` and `hi` copies: within
//!   ±[`BALANCE_TOLERANCE_PCT`]% of the mean.
//! - **PM6**: nothing moves that need not: a plan of a balanced map over the same members is
//!   empty, a departed node's copies move once each, and the balancing moves are at most the
//!   copies by which members lie outside the bounds once those are placed (each takes one
//!   from a member above the bound or gives one to a member below it). After a pure join,
//!   every move goes from an old member to a new one (tested on 3 → 5).
//!
//! The planner is deterministic: every monitor that plans from the same map and members
//! proposes the same successor (they race by compare-and-put in etcd all the same).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use nessie_fabric::NodeId;

/// Fewest partitions a map may have.
pub const MIN_PARTITIONS: u32 = 1;
/// Most partitions: 16384, Redis Cluster's hash slots. A map of that many chains of 3 copies
/// is about 200 KB of JSON, well within etcd's 1.5 MiB request limit.
pub const MAX_PARTITIONS: u32 = 16_384;
/// Default partitions: enough to balance 100+ nodes within the tolerance (about 80 copies
/// per node at R = 2 and 100 nodes).
pub const DEFAULT_PARTITIONS: u32 = 4_096;
/// Highest node id (ids are bounded independently of the node count: 4096 nodes, 12 DTI bits).
pub const MAX_NODE_ID: NodeId = 4_095;
/// A balanced map holds every member's copies within this many percent of the mean.
pub const BALANCE_TOLERANCE_PCT: u64 = 10;
/// Most copies of a partition.
pub const MAX_CHAIN: u8 = nessie_protocols::replica::MAX_REPLICAS;

/// What is wrong with a map or a request to plan one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("partitions = {0} is not in {MIN_PARTITIONS}..={MAX_PARTITIONS}")]
    Partitions(u32),
    #[error("replicas = {0} is not in 1..={MAX_CHAIN}")]
    Replicas(u8),
    #[error("{replicas} copies need at least {replicas} nodes; {nodes} given")]
    TooFewNodes { replicas: u8, nodes: usize },
    #[error("node id {0} is above {MAX_NODE_ID}")]
    NodeId(NodeId),
    #[error("node {0} is listed twice")]
    DuplicateNode(NodeId),
    #[error("partition {partition}: {why}")]
    Chain { partition: u32, why: String },
    #[error("a map needs at least one member to hold its copies")]
    NoMembers,
    #[error("the plan was made from epoch {plan}, not this map's epoch {map}")]
    StalePlan { plan: u64, map: u64 },
}

/// Where every partition's copies are, in chain order (primary first), at one epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMap {
    pub epoch: u64,
    /// Copies wanted of each partition (R).
    pub replicas: u8,
    /// Chain of partition p at index p.
    pub chains: Vec<Vec<NodeId>>,
}

/// Why a copy moves.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reason {
    /// Its node is no longer a member (failed for good, or leaving): re-replication, or drain.
    Replace,
    /// Its node holds more than its share: rebalancing (after a join, say).
    Balance,
}

/// One copy moving: partition `partition`'s copy on `from` is re-created on `to`, at the
/// chain's tail (PM3). `from` may be dead (its copy is rebuilt from the others) or alive
/// (its copy is the source); `None` adds a copy to a chain that was short.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    pub partition: u32,
    pub from: Option<NodeId>,
    pub to: NodeId,
    pub reason: Reason,
}

/// What a plan changes: the moves, in order, and the partitions left with fewer copies than
/// wanted because there are too few members.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The epoch of the map it was made from: it applies to that map only.
    pub base_epoch: u64,
    pub moves: Vec<Move>,
    /// (partition, node): copies on nodes that are no longer members, removed with no
    /// replacement because too few members remain.
    pub dropped: Vec<(u32, NodeId)>,
    /// (partition, copies it keeps) for chains that could not be made whole.
    pub short: Vec<(u32, usize)>,
    /// Copies whose only holder left: lost (a chain of one that failed). A member that fills
    /// such a chain starts empty.
    pub lost: Vec<u32>,
}

/// The copies each of `members` nodes may hold when `total` copies are spread over them:
/// (lo, hi), within ±[`BALANCE_TOLERANCE_PCT`]% of the mean, rounded outwards.
pub fn balance_bounds(total: u64, members: usize) -> (u64, u64) {
    let n = members.max(1) as u64;
    let lo = total * (100 - BALANCE_TOLERANCE_PCT) / (100 * n);
    let hi = (total * (100 + BALANCE_TOLERANCE_PCT)).div_ceil(100 * n);
    (lo, hi)
}

/// A deterministic, well-spread tie-break between nodes for one partition (splitmix64), so
/// that the nodes backing a given node's partitions are spread over the cluster and a failed
/// node's copies are rebuilt by many, not by one neighbour.
fn spread(partition: u32, node: NodeId) -> u64 {
    let mut z = ((partition as u64) << 16 | node as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn check_members(members: &[NodeId]) -> Result<BTreeSet<NodeId>, PlanError> {
    let mut set = BTreeSet::new();
    for &n in members {
        if n > MAX_NODE_ID {
            return Err(PlanError::NodeId(n));
        }
        if !set.insert(n) {
            return Err(PlanError::DuplicateNode(n));
        }
    }
    Ok(set)
}

/// Copies per member, members with none included.
struct Loads {
    held: BTreeMap<NodeId, BTreeSet<u32>>,
}

impl Loads {
    fn of(chains: &[Vec<NodeId>], members: &BTreeSet<NodeId>) -> Loads {
        let mut held: BTreeMap<NodeId, BTreeSet<u32>> =
            members.iter().map(|&n| (n, BTreeSet::new())).collect();
        for (p, chain) in chains.iter().enumerate() {
            for n in chain {
                if let Some(h) = held.get_mut(n) {
                    h.insert(p as u32);
                }
            }
        }
        Loads { held }
    }

    fn load(&self, n: NodeId) -> u64 {
        self.held[&n].len() as u64
    }

    /// The least loaded member not in `chain` (ties by `spread`).
    fn receiver(&self, partition: u32, chain: &[NodeId]) -> Option<NodeId> {
        self.held
            .iter()
            .filter(|(n, _)| !chain.contains(n))
            .min_by_key(|(&n, h)| (h.len(), spread(partition, n)))
            .map(|(&n, _)| n)
    }
}

impl PartitionMap {
    /// Epoch 1: `partitions` chains of min(`replicas`, nodes) copies over `nodes`, every node
    /// holding as many copies as any other, give or take one.
    pub fn initial(nodes: &[NodeId], partitions: u32, replicas: u8) -> Result<Self, PlanError> {
        if !(MIN_PARTITIONS..=MAX_PARTITIONS).contains(&partitions) {
            return Err(PlanError::Partitions(partitions));
        }
        if replicas == 0 || replicas > MAX_CHAIN {
            return Err(PlanError::Replicas(replicas));
        }
        let members = check_members(nodes)?;
        if members.len() < replicas as usize {
            return Err(PlanError::TooFewNodes {
                replicas,
                nodes: members.len(),
            });
        }
        let mut chains: Vec<Vec<NodeId>> = vec![Vec::new(); partitions as usize];
        let mut loads = Loads::of(&chains, &members);
        for (p, chain) in chains.iter_mut().enumerate() {
            for _ in 0..replicas {
                let n = loads.receiver(p as u32, chain).expect("enough members");
                chain.push(n);
                loads.held.get_mut(&n).expect("a member").insert(p as u32);
            }
        }
        let map = PartitionMap {
            epoch: 1,
            replicas,
            chains,
        };
        map.validate()?;
        Ok(map)
    }

    /// PM1 and PM2, and the limits.
    pub fn validate(&self) -> Result<(), PlanError> {
        let parts = self.chains.len() as u64;
        if !(MIN_PARTITIONS as u64..=MAX_PARTITIONS as u64).contains(&parts) {
            return Err(PlanError::Partitions(parts.min(u32::MAX as u64) as u32));
        }
        if self.replicas == 0 || self.replicas > MAX_CHAIN {
            return Err(PlanError::Replicas(self.replicas));
        }
        for (p, chain) in self.chains.iter().enumerate() {
            let bad = |why: String| PlanError::Chain {
                partition: p as u32,
                why,
            };
            if chain.is_empty() || chain.len() > self.replicas as usize {
                return Err(bad(format!(
                    "{} copies, not 1..={}",
                    chain.len(),
                    self.replicas
                )));
            }
            check_members(chain).map_err(|e| bad(e.to_string()))?;
        }
        Ok(())
    }

    /// Partitions in the map.
    pub fn partitions(&self) -> u32 {
        self.chains.len() as u32
    }

    /// Copies each node holds (only nodes holding some).
    pub fn loads(&self) -> BTreeMap<NodeId, u64> {
        let mut out = BTreeMap::new();
        for n in self.chains.iter().flatten() {
            *out.entry(*n).or_insert(0) += 1;
        }
        out
    }

    /// Primaries each node holds (only nodes holding some).
    pub fn primaries(&self) -> BTreeMap<NodeId, u64> {
        let mut out = BTreeMap::new();
        for chain in &self.chains {
            *out.entry(chain[0]).or_insert(0) += 1;
        }
        out
    }

    /// Partitions with fewer than R copies.
    pub fn under_replicated(&self) -> usize {
        let r = self.replicas as usize;
        self.chains.iter().filter(|c| c.len() < r).count()
    }

    /// The moves that make this map cover exactly `members` (nodes that are up and staying),
    /// whole where they are enough (PM4) and balanced (PM5), moving as little as it can (PM6).
    /// First each copy on a node that is not a member is re-created on the least loaded
    /// member without a copy of that partition; then copies move from the most loaded
    /// member to the least loaded, while anyone is outside the bounds.
    pub fn plan(&self, members: &[NodeId]) -> Result<Plan, PlanError> {
        self.validate()?;
        let members = check_members(members)?;
        if members.is_empty() {
            return Err(PlanError::NoMembers);
        }
        let mut plan = Plan {
            base_epoch: self.epoch,
            ..Plan::default()
        };
        let want = (self.replicas as usize).min(members.len());
        let mut chains = self.chains.clone();
        let mut loads = Loads::of(&chains, &members);
        // Replace: copies on nodes that are not members; then copies a chain lacks.
        for (p, chain) in chains.iter_mut().enumerate() {
            let gone: Vec<NodeId> = chain
                .iter()
                .copied()
                .filter(|n| !members.contains(n))
                .collect();
            if gone.len() == chain.len() {
                plan.lost.push(p as u32);
            }
            for from in gone {
                chain.retain(|&n| n != from);
                if chain.len() >= want {
                    plan.dropped.push((p as u32, from));
                    continue;
                }
                let to = loads.receiver(p as u32, chain).expect("members remain");
                chain.push(to);
                loads.held.get_mut(&to).expect("a member").insert(p as u32);
                plan.moves.push(Move {
                    partition: p as u32,
                    from: Some(from),
                    to,
                    reason: Reason::Replace,
                });
            }
            while chain.len() < want {
                // A chain short since an earlier plan (too few members then): fill it.
                let to = loads.receiver(p as u32, chain).expect("members remain");
                chain.push(to);
                loads.held.get_mut(&to).expect("a member").insert(p as u32);
                plan.moves.push(Move {
                    partition: p as u32,
                    from: None,
                    to,
                    reason: Reason::Replace,
                });
            }
            if chain.len() < self.replicas as usize {
                plan.short.push((p as u32, chain.len()));
            }
        }
        // Balance: one copy at a time from the most to the least loaded member.
        let total: u64 = chains.iter().map(|c| c.len() as u64).sum();
        let (lo, hi) = balance_bounds(total, members.len());
        loop {
            // Among equally loaded nodes, a donor that has not gained in this plan and a
            // receiver that has not given: fewer nodes both gain and lose.
            let gained: BTreeSet<NodeId> = plan.moves.iter().map(|m| m.to).collect();
            let gave: BTreeSet<NodeId> = plan.moves.iter().filter_map(|m| m.from).collect();
            let donor =
                |&(n, h): &(&NodeId, &BTreeSet<u32>)| (h.len(), !gained.contains(n), spread(0, *n));
            let receiver =
                |&(n, h): &(&NodeId, &BTreeSet<u32>)| (h.len(), gave.contains(n), spread(0, *n));
            let (&most, _) = loads.held.iter().max_by_key(donor).expect("members");
            let (&least, _) = loads.held.iter().min_by_key(receiver).expect("members");
            let (max, min) = (loads.load(most), loads.load(least));
            if (max <= hi && min >= lo) || max < min + 2 {
                break;
            }
            // The donor holds more copies than the receiver, so some partition it holds
            // lacks the receiver; take the one whose primary is the donor last, so that
            // primaries stay put where they can.
            let candidates = loads.held[&most]
                .iter()
                .copied()
                .filter(|&p| !chains[p as usize].contains(&least));
            let p = candidates
                .min_by_key(|&p| (chains[p as usize][0] == most, spread(p, least)))
                .expect("a donor has a partition the receiver lacks");
            let chain = &mut chains[p as usize];
            chain.retain(|&n| n != most);
            chain.push(least);
            loads.held.get_mut(&most).expect("a member").remove(&p);
            loads.held.get_mut(&least).expect("a member").insert(p);
            plan.moves.push(Move {
                partition: p,
                from: Some(most),
                to: least,
                reason: Reason::Balance,
            });
        }
        Ok(plan)
    }

    /// The map after `plan` (made from this map), at the next epoch.
    pub fn apply(&self, plan: &Plan) -> Result<PartitionMap, PlanError> {
        if plan.base_epoch != self.epoch {
            return Err(PlanError::StalePlan {
                plan: plan.base_epoch,
                map: self.epoch,
            });
        }
        let mut next = self.clone();
        next.epoch += 1;
        for &(p, n) in &plan.dropped {
            next.chains[p as usize].retain(|&m| m != n);
        }
        for m in &plan.moves {
            let chain = &mut next.chains[m.partition as usize];
            if let Some(from) = m.from {
                chain.retain(|&n| n != from);
            }
            debug_assert!(!chain.contains(&m.to), "PM1: {m:?} into {chain:?}");
            chain.push(m.to);
        }
        next.validate()?;
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids(n: u16) -> Vec<NodeId> {
        (0..n).collect()
    }

    /// PM5 over `members`.
    fn assert_balanced(map: &PartitionMap, members: &[NodeId]) {
        let loads = map.loads();
        let total: u64 = loads.values().sum();
        let (lo, hi) = balance_bounds(total, members.len());
        for n in members {
            let l = loads.get(n).copied().unwrap_or(0);
            assert!(
                (lo..=hi).contains(&l),
                "node {n} holds {l} copies, outside {lo}..={hi}: {loads:?}"
            );
        }
        for n in loads.keys() {
            assert!(members.contains(n), "node {n} is not a member: {loads:?}");
        }
    }

    #[test]
    fn the_initial_map_is_whole_and_even() {
        let map = PartitionMap::initial(&ids(3), DEFAULT_PARTITIONS, 2).unwrap();
        assert_eq!(map.epoch, 1);
        assert_eq!(map.under_replicated(), 0);
        let loads: Vec<u64> = map.loads().values().copied().collect();
        assert_eq!(loads.iter().sum::<u64>(), 2 * DEFAULT_PARTITIONS as u64);
        assert!(
            loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1,
            "{loads:?}"
        );
        // Primaries spread too, and a node's partitions are backed by every other node.
        let prim: Vec<u64> = map.primaries().values().copied().collect();
        assert!(prim.iter().all(|&p| p > 1_000), "{prim:?}");
        let map = PartitionMap::initial(&ids(10), 4_096, 3).unwrap();
        let partners: BTreeSet<NodeId> = map
            .chains
            .iter()
            .filter(|c| c[0] == 0)
            .flat_map(|c| c[1..].iter().copied())
            .collect();
        assert_eq!(
            partners.len(),
            9,
            "node 0's partitions are backed by {partners:?}"
        );
    }

    #[test]
    fn bad_requests_are_named() {
        let e = |r: Result<PartitionMap, PlanError>| r.unwrap_err().to_string();
        assert!(e(PartitionMap::initial(&ids(3), 0, 2)).contains("partitions = 0"));
        assert!(e(PartitionMap::initial(&ids(3), MAX_PARTITIONS + 1, 2)).contains("partitions"));
        assert!(e(PartitionMap::initial(&ids(3), 64, 4)).contains("replicas = 4"));
        assert!(e(PartitionMap::initial(&ids(1), 64, 2)).contains("at least 2 nodes; 1 given"));
        assert!(e(PartitionMap::initial(&[1, 1], 64, 1)).contains("node 1 is listed twice"));
        assert!(e(PartitionMap::initial(&[4_096], 64, 1)).contains("node id 4096"));
        let ok = PartitionMap::initial(&ids(3), 8, 2).unwrap();
        assert_eq!(ok.plan(&[]), Err(PlanError::NoMembers));
        let plan = ok.plan(&ids(4)).unwrap();
        let next = ok.apply(&plan).unwrap();
        assert!(matches!(
            next.apply(&plan),
            Err(PlanError::StalePlan { plan: 1, map: 2 })
        ));
        let mut map = PartitionMap::initial(&ids(3), 8, 2).unwrap();
        map.chains[5] = vec![2, 2];
        assert!(map
            .validate()
            .unwrap_err()
            .to_string()
            .contains("partition 5"));
        map.chains[5] = vec![0, 1, 2];
        assert!(map.validate().unwrap_err().to_string().contains("3 copies"));
    }

    #[test]
    fn a_scale_out_from_3_to_5_moves_what_the_newcomers_need_and_no_more() {
        let map = PartitionMap::initial(&ids(3), DEFAULT_PARTITIONS, 2).unwrap();
        let plan = map.plan(&ids(5)).unwrap();
        let next = map.apply(&plan).unwrap();
        assert_balanced(&next, &ids(5));
        let loads = next.loads();
        // Every move lands on a newcomer and none leaves one.
        assert!(
            plan.moves
                .iter()
                .all(|m| m.to >= 3 && m.from.is_some_and(|f| f < 3)),
            "{plan:?}"
        );
        assert_eq!(plan.moves.len() as u64, loads[&3] + loads[&4]);
        let (lo, _) = balance_bounds(2 * DEFAULT_PARTITIONS as u64, 5);
        assert_eq!(
            loads[&3], lo,
            "a newcomer is filled to the lower bound only"
        );
        assert!(plan.short.is_empty() && plan.lost.is_empty());
        // Moving primaries last: the old nodes keep their primaries where they can.
        assert!(
            next.primaries().keys().all(|&n| n < 3),
            "{:?}",
            next.primaries()
        );
        assert!(
            next.plan(&ids(5)).unwrap().moves.is_empty(),
            "PM6: balanced is stable"
        );
    }

    #[test]
    fn a_failed_node_s_copies_are_rebuilt_on_every_survivor() {
        let map = PartitionMap::initial(&ids(4), DEFAULT_PARTITIONS, 2).unwrap();
        let plan = map.plan(&[0, 2, 3]).unwrap();
        let next = map.apply(&plan).unwrap();
        assert_balanced(&next, &[0, 2, 3]);
        assert_eq!(next.under_replicated(), 0);
        let held_by_1 = map.loads()[&1];
        assert_eq!(plan.moves.len() as u64, held_by_1, "one move per lost copy");
        let receivers: BTreeSet<NodeId> = plan.moves.iter().map(|m| m.to).collect();
        assert_eq!(receivers, BTreeSet::from([0, 2, 3]));
        // PM3: the survivor of each chain node 1 led now leads it.
        for (p, chain) in map.chains.iter().enumerate() {
            if chain[0] == 1 {
                assert_eq!(next.chains[p], vec![chain[1], next.chains[p][1]]);
            }
        }
    }

    #[test]
    fn too_few_members_leave_partitions_short_and_a_join_makes_them_whole() {
        let map = PartitionMap::initial(&ids(3), 64, 3).unwrap();
        let plan = map.plan(&[0, 1]).unwrap();
        assert_eq!(plan.short.len(), 64);
        let two = map.apply(&plan).unwrap();
        assert_eq!(two.under_replicated(), 64);
        let plan = two.plan(&[0, 1, 5]).unwrap();
        let three = two.apply(&plan).unwrap();
        assert_eq!(three.under_replicated(), 0);
        assert_balanced(&three, &[0, 1, 5]);
        // One copy and its node gone: lost, reported.
        let one = PartitionMap::initial(&ids(2), 8, 1).unwrap();
        let plan = one.plan(&[0]).unwrap();
        assert_eq!(plan.lost.len() as u64, one.loads()[&1]);
    }

    #[test]
    fn a_hundred_nodes_balance_and_a_join_moves_about_a_newcomer_s_share() {
        let map = PartitionMap::initial(&ids(100), MAX_PARTITIONS, 3).unwrap();
        assert_balanced(&map, &ids(100));
        let plan = map.plan(&ids(101)).unwrap();
        let next = map.apply(&plan).unwrap();
        assert_balanced(&next, &ids(101));
        // 3 × 16384 / 101 ≈ 487 copies are the newcomer's share; it gets at least 90%.
        let share = 3 * MAX_PARTITIONS as u64 / 101;
        let moved = plan.moves.len() as u64;
        assert!(
            moved >= share * 9 / 10 && moved <= share,
            "{moved} moves, share {share}"
        );
        let leave = next.plan(&(1..101).collect::<Vec<_>>()).unwrap();
        assert_eq!(
            leave.moves.len() as u64,
            next.loads()[&0],
            "a drain moves node 0's copies only"
        );
    }

    /// One membership change: `joins` new nodes (or departed ones coming back, by
    /// `rejoin`), and the departures picked by `leaves`, all in one plan.
    #[derive(Clone, Debug)]
    struct Step {
        joins: usize,
        rejoin: bool,
        leaves: Vec<usize>,
    }

    fn step() -> impl Strategy<Value = Step> {
        (
            0usize..3,
            any::<bool>(),
            proptest::collection::vec(0usize..64, 0..3),
        )
            .prop_map(|(joins, rejoin, leaves)| Step {
                joins,
                rejoin,
                leaves,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        /// PM1–PM6 through any sequence of joins, departures and returns, several in one
        /// plan (a departure is a failure or a drain: the planner does not tell them apart).
        #[test]
        fn every_plan_keeps_the_invariants(
            nodes in 1u16..12,
            partitions in 1u32..300,
            replicas in 1u8..=3,
            steps in proptest::collection::vec(step(), 1..12),
        ) {
            prop_assume!(replicas as u16 <= nodes);
            let mut map = PartitionMap::initial(&ids(nodes), partitions, replicas).unwrap();
            let mut members: Vec<NodeId> = ids(nodes);
            let (mut next_id, mut departed) = (nodes, Vec::<NodeId>::new());
            for st in steps {
                for k in st.leaves {
                    if members.len() > 1 {
                        departed.push(members.remove(k % members.len()));
                    }
                }
                for _ in 0..st.joins {
                    match departed.pop().filter(|_| st.rejoin) {
                        Some(back) => members.push(back),
                        None => { members.push(next_id); next_id += 1; }
                    }
                }
                let plan = map.plan(&members).unwrap();
                let next = map.apply(&plan).unwrap();
                next.validate().unwrap(); // PM1, PM2
                prop_assert_eq!(next.epoch, map.epoch + 1);
                let want = (replicas as usize).min(members.len());
                for (p, chain) in next.chains.iter().enumerate() {
                    // PM4
                    prop_assert_eq!(chain.len(), want, "partition {} {:?}", p, chain);
                    // PM3: the copies that stayed, in their old order, then the new ones.
                    let stayed: Vec<NodeId> = map.chains[p].iter().copied()
                        .filter(|n| chain.contains(n)).collect();
                    prop_assert_eq!(&chain[..stayed.len()], &stayed[..]);
                }
                assert_balanced(&next, &members); // PM5
                // PM6: one move per departed copy, then balancing bounded by what lies
                // outside the bounds once those are placed.
                let replace: Vec<&Move> = plan.moves.iter()
                    .filter(|m| m.reason == Reason::Replace).collect();
                let departed_copies: usize = map.chains.iter().flatten()
                    .filter(|n| !members.contains(n)).count();
                prop_assert!(replace.iter().filter(|m| m.from.is_some()).count() <= departed_copies);
                let placed = map.apply(&Plan {
                    base_epoch: map.epoch,
                    moves: replace.iter().map(|m| **m).collect(),
                    dropped: plan.dropped.clone(),
                    ..Plan::default()
                }).unwrap();
                let loads = placed.loads();
                let total: u64 = loads.values().sum();
                let (lo, hi) = balance_bounds(total, members.len());
                let outside: u64 = members.iter().map(|n| {
                    let l = loads.get(n).copied().unwrap_or(0);
                    l.saturating_sub(hi) + lo.saturating_sub(l)
                }).sum();
                let balancing = plan.moves.len() - replace.len();
                prop_assert!(balancing as u64 <= outside, "{} balancing moves, {} outside", balancing, outside);
                prop_assert!(next.plan(&members).unwrap().moves.is_empty());
                let json = serde_json::to_string(&next).unwrap();
                prop_assert_eq!(serde_json::from_str::<PartitionMap>(&json).unwrap(), next.clone());
                map = next;
            }
        }
    }
}
