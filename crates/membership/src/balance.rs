//! The balancer's plan (issue 42, steps 2–4): which index partitions migrate, and to which
//! chains, so that every partition has R copies on nodes that are up and every up node holds
//! its share, with no manual step.
//!
//! The configuration says where every index partition's copies are: in the chain a migration
//! took it to (`index_chains`), or else in the mirror copies of its home node's region
//! (`moves`, re-replication into spare slots). [`Configuration::index_map`] turns that into a
//! [`PartitionMap`]; a partition that is migrating counts at its target already, so a plan
//! made while migrations run does not move the same copies twice. [`PartitionMap::plan`] then
//! re-creates the copies of nodes that are no longer members and balances the rest (PM3 to
//! PM6); every partition whose chain changes migrates there whole, by the per-ITE handover.
//!
//! Who is a member: the nodes that are up, and the *held* ones: joining (about to hold its
//! copies again), up again for less than its join settle time and a settle time (a partition
//! moved to it would wait out its join pause), or failed for less than `replace_after` (it may
//! come back holding them: moving them would be wasted). A held node keeps its copies but takes none (a partition the
//! plan would give it, or whose other copy it holds, waits), and while one is held nothing is
//! balanced: only the copies of nodes gone for good move, to chains of up nodes, so that a
//! node that keeps failing does not hold up re-creating all of another's copies.
//! The plan waits (returns nothing) while a moved mirror copy is still being filled (the copy
//! map is about to change), and without index slots (one copy, or `index_slots = 0`).
//!
//! A node failed for good is no member: its copies are re-created on the survivors, spread by
//! the planner. A node that comes back after that joins holding none of the copies that moved
//! and is given its share by the balance moves.

use nessie_protocols::replica::ReplicaSet;

use crate::partitions::{PartitionMap, PlanError, Reason};
use crate::{Configuration, MigrationError, NodeState};

/// Most migrations one plan starts: the configuration records each (about 100 bytes of JSON),
/// and every migration's start and end is a compare-and-put of it.
pub const MAX_MIGRATIONS_PER_PLAN: usize = 256;
/// Most migrations running at once (started by plans, not yet ended).
pub const MAX_MIGRATIONS_RUNNING: usize = 1_024;

/// What the balancer should do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Balance {
    /// Migrate each partition to the chain of nodes given (primary first).
    Migrate(Vec<(u16, Vec<u16>)>),
    /// Nothing to move: every partition has its copies on up nodes, balanced.
    Balanced,
    /// Not now, and why.
    Wait(String),
}

impl Configuration {
    /// The node that balances: the lowest-numbered one that is up.
    pub fn balancer(&self) -> Option<u16> {
        self.nodes
            .iter()
            .filter(|m| m.state == NodeState::Up)
            .map(|m| m.id)
            .min()
    }

    /// Where every index partition's copies are (or are going: a migrating partition is at
    /// its target), as a partition map of node chains at this epoch. `None` without index
    /// partitions.
    pub fn index_map(&self, set: &ReplicaSet) -> Option<PartitionMap> {
        let parts = set.index_partitions()?;
        let copies = self.copy_map(set);
        let chains = (0..parts.count())
            .map(|q| {
                let q = q as u16;
                // The newest record of the partition (a migration's target is pushed last).
                match self.index_chains.iter().rev().find(|c| c.partition == q) {
                    Some(c) => c.copies.iter().map(|s| s.node).collect(),
                    None => {
                        let home = parts.home(q);
                        (0..set.replicas())
                            .map(|j| copies.place(home, j).node)
                            .collect()
                    }
                }
            })
            .collect();
        Some(PartitionMap {
            epoch: self.epoch,
            replicas: set.replicas(),
            chains,
        })
    }

    /// The migrations that bring every index partition onto up nodes, balanced, at wall time
    /// `now_ns`; a node failed for `replace_after_ns` (or one seen to stop after leaving, for
    /// a join settle time: `Member::gone_for_good`) is gone for good (see the module
    /// comment). At most [`MAX_MIGRATIONS_PER_PLAN`], and no more than keep
    /// [`MAX_MIGRATIONS_RUNNING`] running.
    pub fn plan_balance(
        &self,
        set: &ReplicaSet,
        now_ns: u64,
        replace_after_ns: u64,
    ) -> Result<Balance, PlanError> {
        self.plan_balance_settled(set, now_ns, replace_after_ns, &[])
    }

    /// [`Self::plan_balance`], where the nodes of `settled` (node, `joined_ns`) that are up
    /// again in that join are not held: the caller's fence has seen their pause end (every
    /// node said it knows they are up, `Fence::settle_join_by`), so a partition moved to them
    /// waits for nothing. A node up in another join than the one named is held as ever.
    pub fn plan_balance_settled(
        &self,
        set: &ReplicaSet,
        now_ns: u64,
        replace_after_ns: u64,
        settled: &[(u16, u64)],
    ) -> Result<Balance, PlanError> {
        let Some(map) = self.index_map(set) else {
            return Ok(Balance::Wait("no index slots to migrate into".into()));
        };
        if self.moves.iter().any(|c| c.receiving) {
            return Ok(Balance::Wait("a moved copy is being filled".into()));
        }
        // Held: joining, or failed less than replace_after ago (it may come back with its
        // copies). A held node stays a member, keeping its copies, but takes none, and
        // nothing is balanced while one is held: only copies of nodes gone for good move, to
        // chains of up nodes. A leaving node's state holds nothing: its copies go whatever
        // it does.
        let held: Vec<u16> = self
            .nodes
            .iter()
            .filter(|m| !self.leaving.contains(&m.id))
            .filter(|m| match m.state {
                // Up again (joined, or rejoined): held for its join settle time and one more
                // settle time, so that no partition moved to it waits out its join pause (the
                // 2.5 s stall after each join of a scale-out).
                NodeState::Up => {
                    let hold = set.join_settle_ns().saturating_add(set.settle_ns());
                    m.joined_ns != 0
                        && now_ns < m.since_ns.saturating_add(hold)
                        && !settled.contains(&(m.id, m.joined_ns))
                }
                NodeState::Joining => true,
                NodeState::Failed => {
                    !m.gone_for_good(now_ns, replace_after_ns, set.join_settle_ns())
                }
            })
            .map(|m| m.id)
            .collect();
        let members: Vec<u16> = self
            .nodes
            .iter()
            .filter(|m| {
                m.state == NodeState::Up || held.contains(&m.id) || mutation::keeps_failed_nodes()
            })
            .filter(|m| !self.leaving.contains(&m.id) || mutation::leaving_stays_member())
            .map(|m| m.id)
            .collect();
        if members.is_empty() {
            return Ok(Balance::Wait("no node is up".into()));
        }
        let running = self.index_chains.iter().filter(|c| c.migrating).count();
        let room = MAX_MIGRATIONS_RUNNING
            .saturating_sub(running)
            .min(MAX_MIGRATIONS_PER_PLAN);
        if room == 0 {
            return Ok(Balance::Wait(format!("{running} migrations are running")));
        }
        let mut plan = map.plan(&members)?;
        // While a node is held, only copies of nodes gone for good move: the balancing moves,
        // which come after them in the plan and build on them, are left out.
        if !held.is_empty() {
            plan.moves.retain(|m| m.reason == Reason::Replace);
        }
        if plan.moves.is_empty() && plan.dropped.is_empty() {
            return Ok(if held.is_empty() {
                Balance::Balanced
            } else {
                Balance::Wait(format!("nothing balances while nodes {held:?} are held"))
            });
        }
        // A held node takes no copy.
        let up = |n: &u16| self.state(*n) == Some(NodeState::Up) && !held.contains(n);
        let next = map.apply(&plan)?;
        let mut out: Vec<(u16, Vec<u16>)> = Vec::new();
        let touched = plan
            .moves
            .iter()
            .map(|m| m.partition)
            .chain(plan.dropped.iter().map(|&(p, _)| p));
        for p in touched {
            let q = p as u16;
            // Every copy was on nodes gone for good: nothing is left to hand over from (a
            // migration would never end). It stays short, in `index_partitions_short`.
            if out.iter().any(|(o, _)| *o == q) || plan.lost.contains(&p) {
                continue;
            }
            // A partition migrating now moves again only once that migration ends.
            if self
                .index_chains
                .iter()
                .any(|c| c.partition == q && c.migrating)
            {
                continue;
            }
            let chain = next.chains[p as usize].clone();
            // A chain short of R (too few nodes up) cannot be a migration's target: every
            // copy of a chain is a slot on a distinct up node (a held node's copy stays where
            // it is until the node is up again or gone for good).
            if chain.len() == set.replicas() as usize
                && chain.iter().all(up)
                && chain != map.chains[p as usize]
            {
                out.push((q, chain));
            }
            if out.len() >= room {
                break;
            }
        }
        if out.is_empty() {
            return Ok(Balance::Wait(format!(
                "the partitions to move are migrating, lost ({}), held by nodes {held:?} (joining, or failed less than replace_after ago), or too few nodes are up",
                plan.lost.len()
            )));
        }
        Ok(Balance::Migrate(out))
    }
}

impl Configuration {
    /// The successor in which node `id` leaves (`leaving`: drains, see [`Configuration::leaving`])
    /// or, with `leaving` false, stays after all. Refused for a node that is not a member,
    /// unless [`Self::may_leave`], or when fewer than R nodes would stay up. `None`: nothing
    /// changes.
    pub fn set_leaving(
        &self,
        id: u16,
        leaving: bool,
        set: &ReplicaSet,
    ) -> Result<Option<Configuration>, MigrationError> {
        let replicas = set.replicas();
        if self.state(id).is_none() {
            return Err(MigrationError::UnknownNode(id));
        }
        if self.leaving.contains(&id) == leaving {
            return Ok(None);
        }
        if leaving && self.standby.contains(&id) {
            return Err(MigrationError::Standby(id));
        }
        if !leaving && self.cut_over(id).is_some() {
            return Err(MigrationError::CutOver(id));
        }
        let mut next = self.clone();
        next.epoch += 1;
        if leaving {
            self.may_leave(id, set)?;
            let staying = self
                .nodes
                .iter()
                .filter(|m| m.id != id && m.state == NodeState::Up)
                .filter(|m| !self.leaving.contains(&m.id))
                .count();
            if staying < replicas as usize {
                return Err(MigrationError::TooFewStaying {
                    node: id,
                    replicas,
                    staying,
                });
            }
            next.leaving.push(id);
            next.leaving.sort_unstable();
        } else {
            next.leaving.retain(|&n| n != id);
        }
        Ok(Some(next))
    }

    /// When leaving node `id`'s copies stop being read (wall ns; rule 7a), if that is named.
    pub fn cut_over(&self, id: u16) -> Option<u64> {
        let m = self.nodes.iter().find(|m| m.id == id)?;
        (m.cut_over_ns != 0).then_some(m.cut_over_ns)
    }

    /// The successor in which leaving node `id`'s copies stop being read from wall time
    /// `at_ns` (its read cut-over, rule 7a of `docs/protocol.md`): it has drained its index and
    /// is up, each partition it holds a copy of has another copy full on a node that is up
    /// ([`Self::may_stop`]), and no other node that is up has a cut-over named (one at a
    /// time: two could hold the two copies of a partition). `None`: it has one already (a
    /// second call keeps the first instant: readers may have acted on it).
    pub fn name_cut_over(
        &self,
        id: u16,
        at_ns: u64,
        set: &ReplicaSet,
    ) -> Result<Option<Configuration>, MigrationError> {
        if self.state(id).is_none() {
            return Err(MigrationError::UnknownNode(id));
        }
        if self.cut_over(id).is_some() {
            return Ok(None);
        }
        let not_yet = |why: String| MigrationError::NotSettled { node: id, why };
        if !self.leaving.contains(&id) {
            return Err(MigrationError::NotLeaving(id));
        }
        if self.state(id) != Some(NodeState::Up) {
            return Err(MigrationError::NotUp(id));
        }
        if !self.index_drained(set, id) {
            return Err(not_yet(
                "it still holds index partitions, or some migrate".into(),
            ));
        }
        if let Some(m) = self
            .nodes
            .iter()
            .find(|m| m.id != id && m.cut_over_ns != 0 && m.state == NodeState::Up)
        {
            return Err(not_yet(format!(
                "node {} is stopping too (its read cut-over is named)",
                m.id
            )));
        }
        self.may_stop(id, set, None)?;
        assert!(at_ns != 0, "a cut-over at time 0 would read as none");
        Ok(Some(self.next_with_member(id, |m| m.cut_over_ns = at_ns)))
    }

    /// The next epoch, with member `id` changed by `change`.
    fn next_with_member(&self, id: u16, change: impl FnOnce(&mut crate::Member)) -> Configuration {
        let mut next = self.clone();
        next.epoch += 1;
        change(
            next.nodes
                .iter_mut()
                .find(|m| m.id == id)
                .expect("a member"),
        );
        next
    }

    /// The successor that records leaving node `id`'s process, incarnation `incarnation`,
    /// as seen to exit at wall time `now_ns` (`Member::stopped_ns`), so that it is gone for
    /// good a join settle time after it failed: its table copies move and its pages are
    /// adopted without the `replace_after` wait, which is for a failed process that may come
    /// back. Only the caller that saw the process exit may say so (`nessie leave`, after the
    /// step-down and the stop), and only of a member failed with its read cut-over named,
    /// whose incarnation is the one named (a process that joined since is recorded under
    /// its own, and its join cleared any mark). `None`: marked already.
    pub fn mark_stopped(
        &self,
        id: u16,
        incarnation: u64,
        now_ns: u64,
    ) -> Result<Option<Configuration>, MigrationError> {
        let m = self
            .nodes
            .iter()
            .find(|m| m.id == id)
            .ok_or(MigrationError::UnknownNode(id))?;
        let not = |why: String| MigrationError::NotStopped { node: id, why };
        if m.incarnation != incarnation {
            return Err(not(format!(
                "the membership names incarnation {:#x}, not the stopped process's {incarnation:#x}: another process has registered since",
                m.incarnation
            )));
        }
        if m.stopped_ns != 0 {
            return Ok(None);
        }
        if m.cut_over_ns == 0 {
            return Err(not(
                "its read cut-over was never named (it did not leave)".into()
            ));
        }
        if m.state != NodeState::Failed {
            return Err(MigrationError::NotFailedYet(id));
        }
        assert!(now_ns != 0, "a stop at time 0 would read as none");
        Ok(Some(self.next_with_member(id, |m| m.stopped_ns = now_ns)))
    }

    /// Whether node `id` may start leaving now: every partition (a node's tables, and every
    /// index partition) has its copies on nodes that are up, none receiving. Once `id` has
    /// stopped, its partitions have one copy fewer until its table copies move and are filled
    /// (rule 14a of `docs/protocol.md`); a second node may leave only once they have, else some partition
    /// could lose both copies.
    pub fn may_leave(&self, id: u16, set: &ReplicaSet) -> Result<(), MigrationError> {
        let not_settled = |why: String| MigrationError::NotSettled { node: id, why };
        if let Some(c) = self.moves.iter().find(|c| c.receiving) {
            return Err(not_settled(format!(
                "node {}'s tables copy {} is being filled on node {}",
                c.partition, c.copy, c.node
            )));
        }
        let up = |n: u16| self.state(n) == Some(NodeState::Up);
        {
            let copies = self.copy_map(set);
            for p in 0..set.nodes() {
                for j in 0..set.replicas() {
                    let n = copies.place(p, j).node;
                    // Copy 0 of a standby node's tables waits for it at home: nothing to lose.
                    let waiting_at_home = self.standby.contains(&p) && n == p;
                    if !up(n) && !waiting_at_home {
                        return Err(not_settled(format!(
                            "node {p}'s tables copy {j} is on node {n}, which is not up"
                        )));
                    }
                }
            }
            if let Some(map) = self.index_map(set) {
                for (q, chain) in map.chains.iter().enumerate() {
                    if let Some(&n) = chain.iter().find(|&&n| !up(n)) {
                        return Err(not_settled(format!(
                            "index partition {q} has a copy on node {n}, which is not up"
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether leaving node `id` may stop (and have its read cut-over named) now: every copy
    /// of a node's tables it holds has another copy full on a node that is up, to be read
    /// instead. Narrower than [`Self::may_leave`]: a node away elsewhere holds it up only if
    /// it holds the other copy of something this one does.
    ///
    /// `full_for`: `Some((now_ns, at_least_ns))` also requires each such copy to have been
    /// full, by the configuration's times, for `at_least_ns` at wall time `now_ns`: past its
    /// cut-over, `id`'s copies are read again while no copy after them is full (rule 7a), by
    /// nodes whose view is older than the epoch that made one full, and writers that learn
    /// that `id` stopped do not wait for its readers.
    pub fn may_stop(
        &self,
        id: u16,
        set: &ReplicaSet,
        full_for: Option<(u64, u64)>,
    ) -> Result<(), MigrationError> {
        let up = |n: u16| self.state(n) == Some(NodeState::Up);
        let receiving = |p: u16, j: u8| {
            self.moves
                .iter()
                .any(|m| m.partition == p && m.copy == j && m.receiving)
        };
        // When copy j of partition p became full, by the configuration (0: from the start).
        let full_since = |p: u16, j: u8, n: u16| {
            let moved = self.moves.iter().find(|m| m.partition == p && m.copy == j);
            let node = self
                .nodes
                .iter()
                .find(|m| m.id == n)
                .map_or(0, |m| m.since_ns);
            moved.map_or(node, |m| m.full_since_ns.max(node))
        };
        let long_enough = |p: u16, j: u8, n: u16| match full_for {
            None => true,
            Some((now, least)) => now >= full_since(p, j, n).saturating_add(least),
        };
        let copies = self.copy_map(set);
        // A standby node's tables nobody has written: nothing to keep.
        for p in (0..set.nodes()).filter(|p| !self.standby.contains(p)) {
            let on = |j: u8| copies.place(p, j).node;
            let Some(held) = (0..set.replicas()).find(|&j| on(j) == id) else {
                continue;
            };
            let other = (0..set.replicas())
                .filter(|&j| j != held && on(j) != id)
                .any(|j| up(on(j)) && !receiving(p, j) && long_enough(p, j, on(j)));
            if !other {
                return Err(MigrationError::NotSettled {
                    node: id,
                    why: match full_for {
                        None => format!("no other copy of node {p}'s tables is full on a node that is up"),
                        Some(_) => format!("no other copy of node {p}'s tables has been full on a node that is up for a settle time"),
                    },
                });
            }
        }
        Ok(())
    }

    /// Whether node `id` has drained its index: no index partition has a copy on it, and no
    /// migration whose old chain may hold it is running: one of a partition some record of
    /// which (the old chain, or the target) names `id`, or whose home placement does (the old
    /// chain of a partition's first migration). Migrations among the other nodes (the
    /// balancer evening out those that stay) do not hold it up. The copies of its tables stay
    /// until it stops (see [`Configuration::leaving`]).
    pub fn index_drained(&self, set: &ReplicaSet, id: u16) -> bool {
        let Some(map) = self.index_map(set) else {
            return true;
        };
        if map.chains.iter().any(|ch| ch.contains(&id)) {
            return false;
        }
        let copies = self.copy_map(set);
        let involves = |q: u16| {
            self.index_chains
                .iter()
                .filter(|c| c.partition == q)
                .any(|c| c.copies.iter().any(|s| s.node == id))
                || set.index_partitions().is_some_and(|parts| {
                    let home = parts.home(q);
                    (0..set.replicas()).any(|j| copies.place(home, j).node == id)
                })
        };
        let any_migrating = mutation::drain_waits_for_every_migration();
        !self
            .index_chains
            .iter()
            .filter(|c| c.migrating)
            .any(|c| any_migrating || involves(c.partition))
    }
}

/// Deliberate bugs the tests must catch (on in this crate's tests only, one thread at a time).
pub(crate) mod mutation {
    #[cfg(test)]
    thread_local! {
        /// The balancer takes failed nodes for members: the copies of a node failed for good
        /// are never re-created.
        pub static KEEP_FAILED_NODES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// The balancer takes leaving nodes for members: a leaving node never drains.
        pub static LEAVING_STAYS_MEMBER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// `apply` leaves a migration the configuration no longer lists in the fence: a node
        /// that missed its end keeps sending operations to its (retired) chain.
        pub static KEEPS_MISSED_MIGRATIONS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// `Registrations::all_learnt` takes one node's word for every node's: a hander
        /// starts while a node that has not learnt of the migration still acts.
        pub static ACKS_FROM_ANY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// A new incarnation keeps its predecessor's `stopped_ns`: should it fail, it is
        /// taken for gone for good a join settle time later, its copies moved and its pages adopted while its
        /// process may still come back with them.
        pub static STOPPED_OUTLIVES_INCARNATION: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// A leaving node counts as drained only once no migration runs anywhere: the
        /// balancer's evening-out among the staying nodes holds up its stop.
        pub static DRAIN_WAITS_FOR_EVERY_MIGRATION: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// A monitor forgets a settled comeback once the node no longer counts as having come
        /// back, though the balancer holds it longer: the node is held again, nothing balances.
        pub static COMEBACK_FORGOTTEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// A moved copy's changes stop waiting once every node said it applied the epoch,
        /// like its reads, not once every node said it reads the copy in the new roles (rule
        /// 10c): a node still reading in the old roles returns a word older than one another
        /// returned from the moved copy.
        pub static READS_NEW_FROM_SEEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    pub fn reads_new_from_seen() -> bool {
        #[cfg(test)]
        return READS_NEW_FROM_SEEN.with(|m| m.get());
        #[cfg(not(test))]
        false
    }

    pub fn stopped_outlives_incarnation() -> bool {
        #[cfg(test)]
        return STOPPED_OUTLIVES_INCARNATION.with(|m| m.get());
        #[cfg(not(test))]
        false
    }

    pub fn drain_waits_for_every_migration() -> bool {
        #[cfg(test)]
        return DRAIN_WAITS_FOR_EVERY_MIGRATION.with(|m| m.get());
        #[cfg(not(test))]
        false
    }

    pub fn comeback_forgotten() -> bool {
        #[cfg(test)]
        return COMEBACK_FORGOTTEN.with(|m| m.get());
        #[cfg(not(test))]
        false
    }

    pub fn acks_from_any() -> bool {
        #[cfg(test)]
        return ACKS_FROM_ANY.with(|m| m.get());
        #[cfg(not(test))]
        false
    }

    pub fn keeps_missed_migrations() -> bool {
        #[cfg(test)]
        return KEEPS_MISSED_MIGRATIONS.with(|m| m.get());
        #[cfg(not(test))]
        false
    }

    pub fn keeps_failed_nodes() -> bool {
        #[cfg(test)]
        return KEEP_FAILED_NODES.with(|m| m.get());
        #[cfg(not(test))]
        false
    }

    pub fn leaving_stays_member() -> bool {
        #[cfg(test)]
        return LEAVING_STAYS_MEMBER.with(|m| m.get());
        #[cfg(not(test))]
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Member, Registrations, SlotCopy};

    const SETTLE: u64 = 1_000;
    const AFTER: u64 = 60_000;
    /// R × partitions per node: half the default, enough here.
    const SLOTS: u16 = 6;

    /// 4 nodes, 2 copies, 3 partitions per node (12 in all), the default index slots.
    fn set() -> ReplicaSet {
        let ite = nessie_store::IteLayout::new(20, 4, 7).unwrap();
        ReplicaSet::new(2, 4, ite, &nessie_protocols::ProtocolConfig::default())
            .unwrap()
            .with_index_slots(nessie_store::IndexPartitions::new(4, 3 * 64), SLOTS)
            .unwrap()
    }

    fn config(nodes: u16) -> Configuration {
        Configuration::initial(0..nodes, &Registrations::default())
    }

    fn fail(c: &mut Configuration, id: u16, at: u64) {
        let m: &mut Member = c.nodes.iter_mut().find(|m| m.id == id).unwrap();
        m.state = NodeState::Failed;
        m.since_ns = at;
    }

    /// Applies a plan's migrations as if each had run and ended.
    fn migrate_all(c: &mut Configuration, moves: &[(u16, Vec<u16>)], now: u64) {
        for (q, to) in moves {
            let copies: Vec<SlotCopy> = to
                .iter()
                .map(|&node| SlotCopy {
                    node,
                    slot: c
                        .free_index_slot(node, SLOTS, now, SETTLE)
                        .expect("a free slot"),
                })
                .collect();
            *c = c
                .reserve_migration(*q, copies.clone(), (0, now), SETTLE)
                .unwrap()
                .confirm_migration(*q, &copies, (0, now), now)
                .unwrap();
            for ch in c.index_chains.iter_mut().filter(|ch| ch.partition == *q) {
                if ch.migrating {
                    ch.migrating = false;
                } else {
                    ch.copies.clear();
                }
            }
            c.index_chains.retain(|ch| !ch.copies.is_empty());
        }
    }

    #[test]
    fn a_fresh_cluster_is_balanced() {
        let c = config(4);
        let map = c.index_map(&set()).unwrap();
        assert_eq!(map.partitions(), 12);
        assert!(map.loads().values().all(|&l| l == 6), "{:?}", map.loads());
        assert_eq!(c.plan_balance(&set(), 0, AFTER), Ok(Balance::Balanced));
    }

    /// Node 3 fails for good: its copies must be re-created on the survivors, PM3 kept, and
    /// the survivors balanced. Returns the configuration after, or what went wrong.
    fn recreate_node_3(s: &ReplicaSet) -> Result<(Configuration, u64), String> {
        let mut c = config(4);
        fail(&mut c, 3, 10);
        // Not yet: it may come back with its copies.
        if matches!(
            c.plan_balance(s, 10 + AFTER - 1, AFTER),
            Ok(Balance::Migrate(_))
        ) {
            return Err("planned before replace_after".into());
        }
        let now = 10 + AFTER;
        let moves = match c.plan_balance(s, now, AFTER) {
            Ok(Balance::Migrate(moves)) => moves,
            other => return Err(format!("no migrations: {other:?}")),
        };
        // Node 3 held 6 copies: its 3 home partitions and 3 of node 2's.
        if moves.len() != 6 {
            return Err(format!("{} migrations: {moves:?}", moves.len()));
        }
        for (q, chain) in &moves {
            let before = &c.index_map(s).unwrap().chains[*q as usize];
            if chain.len() != 2 || chain.contains(&3) || !before.contains(&3) {
                return Err(format!("partition {q}: {before:?} to {chain:?}"));
            }
            // PM3: the copy that stays leads.
            if before.iter().find(|&&n| n != 3) != Some(&chain[0]) {
                return Err(format!("partition {q}: {before:?} to {chain:?} (PM3)"));
            }
        }
        migrate_all(&mut c, &moves, now);
        let map = c.index_map(s).unwrap();
        if map.loads().get(&3).copied().unwrap_or(0) != 0 || map.under_replicated() != 0 {
            return Err(format!("after: {:?}", map.chains));
        }
        if c.plan_balance(s, now, AFTER) != Ok(Balance::Balanced) {
            return Err("not balanced after".into());
        }
        Ok((c, now))
    }

    #[test]
    fn a_node_failed_for_good_has_its_copies_recreated_on_the_survivors() {
        let s = set();
        let (mut c, now) = recreate_node_3(&s).unwrap();
        // A second node failed for good: what it held moves again, onto the two left.
        fail(&mut c, 1, now);
        let Ok(Balance::Migrate(moves)) = c.plan_balance(&s, now + AFTER, AFTER) else {
            panic!("a plan");
        };
        assert!(!moves.is_empty());
        assert!(moves
            .iter()
            .all(|(_, ch)| ch == &vec![0, 2] || ch == &vec![2, 0]));
    }

    #[test]
    fn the_mutation_that_keeps_failed_nodes_is_caught() {
        mutation::KEEP_FAILED_NODES.with(|m| m.set(true));
        let caught = recreate_node_3(&set());
        mutation::KEEP_FAILED_NODES.with(|m| m.set(false));
        let e = caught.expect_err("the mutation went unnoticed");
        assert!(e.contains("no migrations"), "{e}");
    }

    #[test]
    fn a_node_back_after_losing_its_copies_is_given_its_share() {
        let s = set();
        let mut c = config(4);
        fail(&mut c, 3, 0);
        let Ok(Balance::Migrate(moves)) = c.plan_balance(&s, AFTER, AFTER) else {
            panic!("a plan");
        };
        migrate_all(&mut c, &moves, AFTER);
        // It comes back: joining, then up, holding nothing.
        c.nodes[3].state = NodeState::Joining;
        assert!(matches!(
            c.plan_balance(&s, 2 * AFTER, AFTER),
            Ok(Balance::Wait(_))
        ));
        // Up again at `up`: held for its join settle time and a settle time (partitions
        // moved to it would wait out its join pause), then given its share.
        let up = 2 * AFTER;
        c.nodes[3].state = NodeState::Up;
        c.nodes[3].since_ns = up;
        c.nodes[3].joined_ns = up;
        let settled = up + s.join_settle_ns() + s.settle_ns();
        assert!(matches!(
            c.plan_balance(&s, settled - 1, AFTER),
            Ok(Balance::Wait(why)) if why.contains("held")
        ));
        // Settled early (every node said it knows) in this join: not held. Settled in an
        // earlier join only: held as ever.
        let early = up + 1;
        assert!(matches!(
            c.plan_balance_settled(&s, early, AFTER, &[(3, up)]),
            Ok(Balance::Migrate(_))
        ));
        assert!(matches!(
            c.plan_balance_settled(&s, early, AFTER, &[(3, up - 1)]),
            Ok(Balance::Wait(why)) if why.contains("held")
        ));
        let Ok(Balance::Migrate(moves)) = c.plan_balance(&s, settled, AFTER) else {
            panic!("a plan");
        };
        assert!(moves.iter().all(|(_, ch)| ch.contains(&3)), "{moves:?}");
        migrate_all(&mut c, &moves, settled);
        let loads = c.index_map(&s).unwrap().loads();
        assert!(loads.values().all(|&l| (5..=7).contains(&l)), "{loads:?}");
        assert_eq!(c.plan_balance(&s, settled, AFTER), Ok(Balance::Balanced));
    }

    #[test]
    fn a_migrating_partition_counts_at_its_target_and_is_not_moved_twice() {
        let s = set();
        let mut c = config(4);
        fail(&mut c, 3, 0);
        let Ok(Balance::Migrate(moves)) = c.plan_balance(&s, AFTER, AFTER) else {
            panic!("a plan");
        };
        // Start (but do not end) the first migration.
        let (q, to) = &moves[0];
        let copies: Vec<SlotCopy> = to.iter().map(|&node| SlotCopy { node, slot: 0 }).collect();
        c = c
            .reserve_migration(*q, copies.clone(), (0, AFTER), SETTLE)
            .unwrap()
            .confirm_migration(*q, &copies, (0, AFTER), AFTER)
            .unwrap();
        assert_eq!(c.index_map(&s).unwrap().chains[*q as usize], *to);
        let Ok(Balance::Migrate(rest)) = c.plan_balance(&s, AFTER, AFTER) else {
            panic!("a plan");
        };
        assert_eq!(rest, moves[1..].to_vec());
    }

    #[test]
    fn a_plan_waits_while_copies_are_filled_and_moves_nothing_for_a_joining_node() {
        let s = set();
        let mut c = config(4);
        c.nodes[2].state = NodeState::Joining;
        assert!(matches!(c.plan_balance(&s, 0, AFTER), Ok(Balance::Wait(w)) if w.contains("held")));
        c.nodes[2].state = NodeState::Up;
        c.moves.push(crate::CopyMove {
            partition: 3,
            copy: 1,
            node: 1,
            slot: 2,
            receiving: true,
            at_start: false,
            full_since_ns: 0,
        });
        assert!(
            matches!(c.plan_balance(&s, 0, AFTER), Ok(Balance::Wait(w)) if w.contains("filled"))
        );
        let ite = nessie_store::IteLayout::new(20, 4, 7).unwrap();
        let one = ReplicaSet::new(1, 4, ite, &nessie_protocols::ProtocolConfig::default()).unwrap();
        assert!(matches!(
            config(4).plan_balance(&one, 0, AFTER),
            Ok(Balance::Wait(_))
        ));
    }

    /// Node 3, leaving in `c`, drained by the balancer's plan: the configuration after, or what
    /// went wrong.
    fn drain_node_3(s: &ReplicaSet, c: &Configuration) -> Result<Configuration, String> {
        let moves = match c.plan_balance(s, 0, AFTER) {
            Ok(Balance::Migrate(moves)) => moves,
            other => return Err(format!("no migrations: {other:?}")),
        };
        if moves.len() != 6 || moves.iter().any(|(_, ch)| ch.contains(&3)) {
            return Err(format!("{moves:?}"));
        }
        let mut after = c.clone();
        migrate_all(&mut after, &moves, 0);
        Ok(after)
    }

    #[test]
    fn the_mutation_that_keeps_leaving_nodes_is_caught() {
        let c = config(4).set_leaving(3, true, &set()).unwrap().unwrap();
        mutation::LEAVING_STAYS_MEMBER.with(|m| m.set(true));
        let caught = drain_node_3(&set(), &c);
        mutation::LEAVING_STAYS_MEMBER.with(|m| m.set(false));
        let e = caught.expect_err("the mutation went unnoticed");
        assert!(e.contains("no migrations"), "{e}");
    }

    /// A leaving node is drained once nothing of the index is on it and no migration whose old
    /// chain may hold it runs; a migration among the other nodes does not hold it up
    /// (`DRAIN_WAITS_FOR_EVERY_MIGRATION`, which waits for every one, is caught).
    #[test]
    fn only_migrations_off_a_leaving_node_hold_up_its_drain() {
        let s = set();
        let c = config(4).set_leaving(3, true, &s).unwrap().unwrap();
        let moves = match c.plan_balance(&s, 0, AFTER) {
            Ok(Balance::Migrate(moves)) => moves,
            other => panic!("{other:?}"),
        };
        // All but the last moved; the last one started, not ended: its old chain holds 3.
        let (last, rest) = moves.split_last().unwrap();
        let mut c = c.clone();
        migrate_all(&mut c, rest, 0);
        let start = |c: &Configuration, q: u16, to: &[u16]| {
            let copies: Vec<SlotCopy> = to
                .iter()
                .map(|&node| SlotCopy {
                    node,
                    slot: c.free_index_slot(node, SLOTS, 0, SETTLE).unwrap(),
                })
                .collect();
            c.reserve_migration(q, copies.clone(), (0, 0), SETTLE)
                .unwrap()
                .confirm_migration(q, &copies, (0, 0), 0)
                .unwrap()
        };
        let started = start(&c, last.0, &last.1);
        assert!(started
            .index_map(&s)
            .unwrap()
            .chains
            .iter()
            .all(|ch| !ch.contains(&3)));
        assert!(
            !started.index_drained(&s, 3),
            "partition {} migrates off it",
            last.0
        );
        migrate_all(&mut c, std::slice::from_ref(last), 0);
        assert!(c.index_drained(&s, 3));
        // A partition that never had a copy on node 3, moved among the others.
        let parts = s.index_partitions().unwrap();
        let map = c.index_map(&s).unwrap();
        let q = (0..parts.count() as u16)
            .find(|&q| {
                let home = parts.home(q);
                (0..s.replicas()).all(|j| c.copy_map(&s).place(home, j).node != 3)
                    && !c.index_chains.iter().any(|ch| ch.partition == q)
            })
            .expect("a partition at home away from node 3");
        let chain = &map.chains[q as usize];
        let other = (0..3u16).find(|n| !chain.contains(n)).unwrap();
        let unrelated = start(&c, q, &[chain[0], other]);
        for mutated in [false, true] {
            mutation::DRAIN_WAITS_FOR_EVERY_MIGRATION.with(|m| m.set(mutated));
            let drained = unrelated.index_drained(&s, 3);
            mutation::DRAIN_WAITS_FOR_EVERY_MIGRATION.with(|m| m.set(false));
            assert_eq!(drained, !mutated, "mutated: {mutated}");
        }
    }

    #[test]
    fn a_leaving_node_is_drained_by_the_plan_and_enough_nodes_must_stay() {
        let s = set();
        let c = config(4);
        assert_eq!(
            c.set_leaving(9, true, &s),
            Err(MigrationError::UnknownNode(9))
        );
        let c = c.set_leaving(3, true, &s).unwrap().expect("a change");
        assert_eq!(c.leaving, vec![3]);
        assert_eq!(c.set_leaving(3, true, &s), Ok(None), "leaving already");
        assert!(!c.index_drained(&s, 3));
        let c2 = c.set_leaving(2, true, &s).unwrap().expect("a change");
        assert_eq!(
            c2.set_leaving(1, true, &s),
            Err(MigrationError::TooFewStaying {
                node: 1,
                replicas: 2,
                staying: 1
            })
        );
        // The leaving node is up, yet the plan moves every copy it holds to the others.
        let after = drain_node_3(&s, &c).unwrap();
        assert!(after
            .index_map(&s)
            .unwrap()
            .chains
            .iter()
            .all(|ch| !ch.contains(&3)));
        assert!(after.index_drained(&s, 3));
        // No migration may target it.
        let to = vec![
            crate::SlotCopy { node: 3, slot: 0 },
            crate::SlotCopy { node: 0, slot: 0 },
        ];
        assert_eq!(
            after.reserve_migration(0, to, (0, 0), SETTLE),
            Err(MigrationError::Leaving(3))
        );
        // Node 3 stepped down (failed) before its table copies moved: node 2, which holds the
        // other copy of node 2's and node 3's tables, may not leave (nor any other).
        let mut gone = after.clone();
        fail(&mut gone, 3, 0);
        for n in [0, 1, 2] {
            assert!(
                matches!(
                    gone.set_leaving(n, true, &s),
                    Err(MigrationError::NotSettled { .. })
                ),
                "node {n}"
            );
        }
        // A node may not leave while another is away.
        let mut away = config(4);
        fail(&mut away, 1, 0);
        assert!(matches!(
            away.set_leaving(3, true, &s),
            Err(MigrationError::NotSettled { node: 3, .. })
        ));
        // Staying after all: it is a member again.
        let back = c.set_leaving(3, false, &s).unwrap().expect("a change");
        assert!(back.leaving.is_empty());
        assert_eq!(back.plan_balance(&s, 0, AFTER), Ok(Balance::Balanced));
    }

    /// A read cut-over is named only for a drained, leaving node that is up while every other
    /// copy is full on an up node; once named it is kept, cannot be undone by staying after
    /// all, and the fence reads it (rule 7a); a restarted incarnation starts without.
    #[test]
    fn a_cut_over_is_named_once_for_a_drained_leaver_and_never_withdrawn() {
        let s = set();
        let c = config(4);
        let not_settled = |r| matches!(r, Err(MigrationError::NotSettled { node: 3, .. }));
        assert_eq!(
            c.name_cut_over(3, 7, &s),
            Err(MigrationError::NotLeaving(3))
        );
        let c = c.set_leaving(3, true, &s).unwrap().unwrap();
        assert!(not_settled(c.name_cut_over(3, 7, &s)), "not drained");
        let drained = drain_node_3(&s, &c).unwrap();
        // Node 0 holds the other copy of node 3's tables; node 1 holds none of what node 3
        // does.
        let mut away = drained.clone();
        fail(&mut away, 0, 0);
        assert!(not_settled(away.name_cut_over(3, 7, &s)), "node 0 is away");
        let mut away = drained.clone();
        fail(&mut away, 1, 0);
        assert!(
            matches!(away.name_cut_over(3, 7, &s), Ok(Some(_))),
            "node 1 is away"
        );
        // Node 0 (the other copy of node 3's tables) up again since 1 s: node 3 may stop only
        // once it has been full for the time asked.
        let mut back = drained.clone();
        back.nodes.iter_mut().find(|m| m.id == 0).unwrap().since_ns = 1_000_000_000;
        assert!(matches!(
            back.may_stop(3, &s, Some((1_500_000_000, 1_000_000_000))),
            Err(MigrationError::NotSettled { node: 3, .. })
        ));
        assert_eq!(
            back.may_stop(3, &s, Some((2_000_000_000, 1_000_000_000))),
            Ok(())
        );
        assert_eq!(back.may_stop(3, &s, None), Ok(()));
        let named = drained.name_cut_over(3, 7_000, &s).unwrap().unwrap();
        assert_eq!(named.epoch, drained.epoch + 1);
        assert_eq!(named.cut_over(3), Some(7_000));
        assert_eq!(named.name_cut_over(3, 9_000, &s), Ok(None), "kept");
        // One at a time: not while another node that is up has one.
        let mut other = drained.clone();
        other
            .nodes
            .iter_mut()
            .find(|m| m.id == 1)
            .unwrap()
            .cut_over_ns = 5;
        assert!(matches!(
            other.name_cut_over(3, 7, &s),
            Err(MigrationError::NotSettled { node: 3, why }) if why.contains("node 1")
        ));
        assert_eq!(
            named.set_leaving(3, false, &s),
            Err(MigrationError::CutOver(3))
        );
        let fence = nessie_protocols::Fence::unfenced();
        crate::apply(&named, (0, 0), &fence, 7_000 + 5_000_000_000, 0);
        assert!(fence.any_cut_over());
        let now = nessie_fabric::monotonic_ns();
        assert_eq!(fence.cut_over(3, now, 0), nessie_protocols::CutOver::Past);
        assert_eq!(fence.cut_over(2, now, 0), nessie_protocols::CutOver::Before);
        // Stopped, then started again: the new incarnation joins without a cut-over.
        let mut back = named.clone();
        fail(&mut back, 3, 0);
        let reg = crate::Registrations {
            present: vec![0, 1, 2, 3],
            incarnations: vec![(3, 42)],
            ..Default::default()
        };
        let policy = crate::Policy::default();
        let joining = back
            .successor(&reg, u64::MAX / 2, &policy)
            .expect("a change");
        assert_eq!(joining.state(3), Some(NodeState::Joining));
        assert_eq!(joining.cut_over(3), None);
    }

    #[test]
    fn a_node_failing_again_and_again_does_not_hold_up_another_s_copies() {
        let s = set();
        let mut c = config(4);
        fail(&mut c, 3, 0); // gone for good at AFTER
        fail(&mut c, 1, AFTER); // failed just now: held
        let Ok(Balance::Migrate(moves)) = c.plan_balance(&s, AFTER, AFTER) else {
            panic!("node 3's copies wait for node 1");
        };
        // Only partitions node 3 held move, to chains of up nodes (neither 1 nor 3); those
        // whose other copy is on node 1, or that the plan gives to node 1, wait for it.
        let before = c.index_map(&s).unwrap();
        assert!((1..=6).contains(&moves.len()), "{moves:?}");
        for (q, chain) in &moves {
            assert!(before.chains[*q as usize].contains(&3), "{q}: {chain:?}");
            assert!(chain.iter().all(|n| [0, 2].contains(n)), "{q}: {chain:?}");
        }
        // A chain of a held node and a gone one waits for the held node (its copy is the only
        // one left, and a migration reads its old chain from an up copy).
        let mut c = config(4);
        fail(&mut c, 3, 0);
        fail(&mut c, 0, AFTER);
        let before = c.index_map(&s).unwrap();
        if let Ok(Balance::Migrate(moves)) = c.plan_balance(&s, AFTER, AFTER) {
            for (q, chain) in &moves {
                assert!(!before.chains[*q as usize].contains(&0), "{q}: {chain:?}");
                assert!(!chain.contains(&0) && !chain.contains(&3), "{q}: {chain:?}");
            }
        }
        // A joining node is held too.
        let mut c = config(4);
        c.nodes[1].state = NodeState::Joining;
        fail(&mut c, 3, 0);
        let Ok(Balance::Migrate(moves)) = c.plan_balance(&s, AFTER, AFTER) else {
            panic!("a plan");
        };
        assert!(moves
            .iter()
            .all(|(_, ch)| !ch.contains(&1) && !ch.contains(&3)));
    }

    #[test]
    fn nothing_balances_while_a_node_is_held() {
        let s = set();
        // Node 3 failed for good and its copies re-created on 0, 1 and 2; it comes back
        // empty (joining: held). Unbalanced as it is, nothing moves until it is up.
        let (mut c, now) = recreate_node_3(&s).unwrap();
        c.nodes[3].state = NodeState::Joining;
        c.nodes[3].since_ns = now;
        assert_eq!(c.index_map(&s).unwrap().loads().get(&3).copied(), None);
        assert!(
            matches!(c.plan_balance(&s, now, AFTER), Ok(Balance::Wait(w)) if w.contains("nothing balances"))
        );
        // Node 0 overloaded (three of node 1's partitions moved from [1, 2] to [1, 0]), all
        // up: it balances; node 3 joining: nothing balances.
        let mut c = config(4);
        let to_0: Vec<(u16, Vec<u16>)> = (3..6).map(|q| (q, vec![1, 0])).collect();
        migrate_all(&mut c, &to_0, 0);
        assert!(matches!(
            c.plan_balance(&s, 0, AFTER),
            Ok(Balance::Migrate(_))
        ));
        c.nodes[3].state = NodeState::Joining;
        assert!(
            matches!(c.plan_balance(&s, 0, AFTER), Ok(Balance::Wait(w)) if w.contains("nothing balances"))
        );
    }
}
