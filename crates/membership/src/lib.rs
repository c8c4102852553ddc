//! Membership through etcd: who is in the cluster, in which state, in which epoch.
//!
//! Layout under the cluster's key prefix (`/nessie/<name>/<fingerprint>/`):
//!
//! ```text
//! members/<id>   {"id", "pid", "incarnation", "ready", "filled", "handed", "seen"}
//!                                          put by node <id> under its lease: present while it
//!                                          lives; "incarnation": a number the process drew at
//!                                          start; "ready": it holds its copies again;
//!                                          "filled": the moved copies it has filled;
//!                                          "handed": the migrations it handed over
//!                                          ([partition, since_ns] pairs); "seen": the
//!                                          epoch its fence applied, said while a node
//!                                          waits for every node to know of a change
//!                                          (`Registrations::all_learnt`)
//! config         {"epoch", "nodes": [{"id", "state", "since_ns", "joined_ns", "incarnation"}],
//!                 "moves": [{"partition", "copy", "node", "slot", "receiving"}],
//!                 "index_chains": [{"partition", "copies": [{"node", "slot"}],
//!                                   "migrating", "handed_ns", "since_ns"}],
//!                 "retired_slots": [{"node", "slot", "since_ns"}],
//!                 "leaving": [id], "standby": [id]}
//!                                          no lease; changed only by compare-and-put
//! ```
//!
//! A node registers under a lease of `lease_ttl_s` seconds and refreshes it every third of
//! that. Every node runs a [`Monitor`] that reads both keys every sixth of a TTL (and at once
//! when a watch sees them change): a node that is `up`
//! in the configuration and whose registration has lapsed, or is another process's (a node
//! restarted within its lease TTL, whose registration replaced the dead one's before that
//! lapsed: the registration's incarnation is not the one the configuration names), is declared
//! `failed`; one that has
//! been `failed` for the hold time (every node has learnt of the failure and acted on it) and
//! is registered again is `joining`: it receives its copies (`nessie_protocols::replica`,
//! catching up); one that is `joining` and whose registration says `ready` is `up` again. Each
//! change is a new epoch written with one compare-and-put on the configuration's revision, so
//! concurrent monitors agree on one successor of every epoch. `nessie up` writes epoch 1, all nodes `up`, once every node is
//! ready; monitors change nothing before that. Nodes `cluster.toml` lists as standby start
//! later ([`standby`]): epoch 1 records them failed and places what they would hold on the
//! others. When etcd cannot be reached, the configuration
//! cannot change and the monitor records the error for `status`; nodes keep serving in the
//! epoch they know while their view is fresh (reads: half a TTL after the last read that
//! succeeded, [`read_view_ns`]; writes: while the lease holds), and with one copy reads go on
//! after that too.
//!
//! **Re-replication.** With spare slots (`cluster.spare_copies`), a node failed for
//! `replace_after_s` loses its copies: the next epoch moves each to a spare slot of an up node
//! without a copy of that partition (`nessie_protocols::replica::CopyMap::replace`), receiving.
//! The new holder fills it after the join settle time and lists it in its registration's
//! "filled"; the next epoch makes it full. A node whose copies moved does not take them back
//! when it registers again: it joins holding none of them (its spare slots may take copies
//! later).
//!
//! **Migrations** (issue 42). An index partition moves to a new chain of index slots by the
//! per-ITE handover (`nessie_protocols::replica`, `handover.rs`): the node that starts one
//! writes pending into the new slots and then adds the chain to the configuration, migrating
//! ([`Configuration::start_migration`]); every node's fence sends the partition's operations
//! there once it reads that epoch; the chain's first live node hands over every entry and
//! says so in its registration ("handed"); the next epoch records when, and once the settle
//! time has passed since (every operation that met a pending word has ended), the migration
//! ends: the chain is the partition's ([`Configuration::successor`]). The slots of the chain
//! it replaced are reused only a settle time later (`retired_slots`). A node that missed the
//! end (paused through it) learns it from the next configuration it reads, which `apply`
//! feeds into the fence before the view is fresh again: a migration no longer listed is over. The balancer
//! ([`balance`]) plans which partitions migrate where; many start in one batch
//! ([`Monitor::reserve_migrations`], [`Monitor::confirm_migrations`]).
//!
//! [`etcd`] is the coordination engine behind membership (as ZooKeeper is for FaRM), reached
//! through a small blocking client for its v3 HTTP/JSON gateway. The single-member etcd that
//! `nessie up` runs by default is started and stopped with the node processes
//! (`nessie_cluster::process::etcd_server`).

pub mod balance;
pub mod etcd;
mod moved_settle;
pub mod partitions;
pub mod standby;
pub mod tls;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use nessie_protocols::replica::{CopyMap, Placement};
use nessie_protocols::{Fence, MovedCopy, NodeRole, ReplicaSet};

use crate::etcd::{Etcd, EtcdError, LeaseId};

/// Least lease TTL we ask for. etcd itself raises shorter TTLs to its own minimum (3 s with
/// its default election timeout).
pub const MIN_LEASE_TTL_S: u64 = 1;
/// Longest lease TTL accepted: failures must be noticed within minutes at worst.
pub const MAX_LEASE_TTL_S: u64 = 600;
pub const DEFAULT_LEASE_TTL_S: u64 = 3;
/// How long a node is failed, by default, before its copies move to spare slots.
pub const DEFAULT_REPLACE_AFTER_S: u64 = 60;
/// `replace_after_s` is at least this many lease TTLs: a failed node is held for a TTL and a
/// settle time before it may join, and must then have time to register again.
pub const REPLACE_AFTER_TTLS: u64 = 3;
/// A view of the configuration is fresh enough to read by for this part of a TTL after the
/// read that fetched it was sent; the monitor reads three times in that window.
const READ_VIEW_PARTS: u64 = 2;

/// How long a view of the configuration read with a lease of `lease_ttl_s` stays fresh
/// enough to read replicated memory by (`Fence::may_read`): after a failure, nodes that know
/// wait this long (plus the clock margin) before they read the failed primary's next copy
/// (`nessie_protocols::ReplicaSet::read_settle_ns`). Shorter than the TTL, so that reads come
/// back soon after a failure is declared; writes keep the whole TTL (`Shared::view_clock_ns`).
pub fn read_view_ns(lease_ttl_s: u64) -> u64 {
    lease_ttl_s * 1_000_000_000 / READ_VIEW_PARTS
}

/// A node's state in one epoch.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    Up,
    Failed,
    /// Registered again after a failure: every node writes its copies, nobody reads them or
    /// decides at them, its own workers do not write; it fills them from the primaries and
    /// says it is ready.
    Joining,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "up",
            NodeState::Failed => "failed",
            NodeState::Joining => "joining",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: u16,
    pub state: NodeState,
    /// When the node entered this state (wall clock of the monitor that wrote the epoch; 0 in
    /// epoch 1).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub since_ns: u64,
    /// When its current incarnation joined (0: the first one). Entries whose write ended
    /// before it were left by an earlier incarnation, which is dead.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub joined_ns: u64,
    /// The incarnation number of the process that is this member (its registration's; 0:
    /// not known yet). A registration with another number is a process started since: the
    /// one this member was is dead, though its lease may not have lapsed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub incarnation: u64,
    /// A leaving node's read cut-over (rule 7a of `docs/protocol.md`): from this wall time
    /// (ns, of the node that named it) nobody reads this incarnation's copies, which are still
    /// written until it stops, so that its stop makes nobody wait. 0: none. Never withdrawn
    /// while the incarnation lives; a new one starts without.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cut_over_ns: u64,
    /// When `nessie leave` saw this incarnation's process exit after it stepped down (wall
    /// ns, of the tool; 0: not seen). Set only on a member that is `failed` and had its read
    /// cut-over named ([`Configuration::mark_stopped`]); a new incarnation starts without.
    /// Such a member acts no more, so it is gone for good a join settle time after it failed
    /// ([`Member::gone_for_good`]) instead of after `replace_after_s`, which waits for a
    /// failed process that may come back.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stopped_ns: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Member {
    /// Whether this member is gone for good at wall time `now_ns`: failed for `after_ns`
    /// (`replace_after`, with whatever margin the caller adds), or seen to stop after leaving
    /// (`stopped_ns`: it will not come back as this member) and failed for `left_after_ns`
    /// (a join settle time and the clock margin: the failover it caused has settled, as a
    /// failure has before `replace_after`). Its copies then move to the others, the balancer
    /// no longer holds it, and the up nodes adopt the pages it claimed (rules 14, 14a and 17
    /// of `docs/protocol.md`).
    pub fn gone_for_good(&self, now_ns: u64, after_ns: u64, left_after_ns: u64) -> bool {
        let after_ns = match self.stopped_ns {
            0 => after_ns,
            _ => after_ns.min(left_after_ns),
        };
        self.state == NodeState::Failed && now_ns >= self.since_ns.saturating_add(after_ns)
    }
}

/// What the registrations say now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registrations {
    /// Nodes whose registration (lease) is alive.
    pub present: Vec<u16>,
    /// Those of them that hold their copies (they caught up after joining).
    pub ready: Vec<u16>,
    /// Moved copies their new holders have filled: (holder, partition, copy).
    pub filled: Vec<(u16, u16, u8)>,
    /// Migrations a node handed over: (node, partition, the migration's `since_ns`, which
    /// tells one migration of a partition from a later one).
    pub handed: Vec<(u16, u16, u64)>,
    /// The incarnation number each registration names: (node, incarnation).
    pub incarnations: Vec<(u16, u64)>,
    /// The newest epoch each node says its fence has applied ("seen"; absent: 0), which it
    /// says only while a node waits on a change ([`Configuration::wants_acks`]).
    pub seen: Vec<(u16, u64)>,
    /// The join (`Member::joined_ns`) each ready node caught up for ("ready_for").
    pub ready_for: Vec<(u16, u64)>,
    /// The epoch in whose configuration each node says it reads no full moved copy in the
    /// old roles ("reads_new"; absent: 0): rule 10c, [`Registrations::all_read_new`].
    pub reads_new: Vec<(u16, u64)>,
}

impl Registrations {
    /// The incarnation node `id`'s registration names, if it is present and names one.
    pub fn incarnation(&self, id: u16) -> Option<u64> {
        self.incarnations
            .iter()
            .find(|(n, _)| *n == id)
            .map(|&(_, i)| i)
    }

    /// Whether every node that may act in configuration `c` (`up` or `joining`) has said,
    /// in the registration of the incarnation `c` names, that its fence applied epoch
    /// `epoch` or a later one. Epochs are read in order, so such a node's operations that
    /// begin from then on follow that epoch. A node that has not said so (paused, cut off
    /// from etcd, its lease lapsing) makes this false: whoever waits falls back on the
    /// settle time, by which a node that has not learnt has stopped.
    ///
    /// A node `failed` less than `failed_ns` before wall time `now_ns` makes it false too:
    /// its process may still act for a while unasked (one replaced by a restart keeps its
    /// own lease until that lapses; one that stepped down keeps reading for its read view's
    /// time), which the settle time covers and no word from it can.
    pub fn all_learnt(&self, c: &Configuration, epoch: u64, at: (u64, u64)) -> bool {
        let any = balance::mutation::acks_from_any();
        self.all_said(&self.seen, c, at, any, |e| e >= epoch)
    }

    /// Whether every node that may act in configuration `c` has said, as in
    /// [`Self::all_learnt`], that it reads no full moved copy in the old roles as of an epoch
    /// from `epoch` to `c`'s (rule 10c, `moved_settle`): a word of a later epoch is of a
    /// configuration this one does not show (the copy may have changed again there).
    ///
    /// Every process with a registration must have said it too, member or not (a standby
    /// node's, one registered again after its lease lapsed): each reads with its own fence.
    pub fn all_read_new(&self, c: &Configuration, epoch: u64, at: (u64, u64)) -> bool {
        let ok = |e: u64| e >= epoch && e <= c.epoch;
        let registered = self
            .present
            .iter()
            .all(|&id| self.reads_new.iter().any(|&(n, e)| n == id && ok(e)));
        registered && self.all_said(&self.reads_new, c, at, false, ok)
    }

    /// Whether every node that may act in `c` said, in `said`, an epoch that passes `ok`
    /// (`any`: one node's word taken for all, the mutation `ACKS_FROM_ANY`).
    fn all_said(
        &self,
        said: &[(u16, u64)],
        c: &Configuration,
        (now_ns, failed_ns): (u64, u64),
        any: bool,
        ok: impl Fn(u64) -> bool,
    ) -> bool {
        let recently_failed = c
            .nodes
            .iter()
            .any(|m| m.state == NodeState::Failed && now_ns < m.since_ns.saturating_add(failed_ns));
        !recently_failed
            && c.nodes
                .iter()
                .filter(|m| matches!(m.state, NodeState::Up | NodeState::Joining))
                .all(|m| {
                    if any {
                        return said.iter().any(|&(_, e)| ok(e));
                    }
                    m.incarnation != 0
                        && self.incarnation(m.id) == Some(m.incarnation)
                        && said.iter().any(|&(n, e)| n == m.id && ok(e))
                })
    }
}

/// One copy moved off its home node (re-replication), as the configuration records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyMove {
    pub partition: u16,
    /// Its place in the partition's chain.
    pub copy: u8,
    /// Where it is now: node and mirror slot.
    pub node: u16,
    pub slot: u8,
    /// Its new holder is still filling it: written, not read, not decided at.
    #[serde(default, skip_serializing_if = "is_false")]
    pub receiving: bool,
    /// Placed by epoch 1 ([`standby`]): full from the start, never in another role, so no
    /// operation pauses after it as after a copy that became full.
    #[serde(default, skip_serializing_if = "is_false")]
    pub at_start: bool,
    /// When it became full (wall ns of the node that made it so; 0: receiving, placed at
    /// start, or made full before this was recorded): every node's data reads keep the old
    /// roles for a join settle time from this at the latest (`Fence::set_moved_full_since`,
    /// rule 10a of `docs/protocol.md`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub full_since_ns: u64,
}

fn is_false(v: &bool) -> bool {
    !*v
}

/// One copy of an index partition in an index slot.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotCopy {
    pub node: u16,
    pub slot: u16,
}

/// A partition reserved for a migration, and the index slots reserved for its new chain.
pub type Reserved = (u16, Vec<SlotCopy>);

/// An index partition's chain of copies in index slots: where a migration took it, or is
/// taking it (`migrating`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexChain {
    pub partition: u16,
    /// The copies, in chain order (primary first).
    pub copies: Vec<SlotCopy>,
    /// Entries are still being handed over to it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub migrating: bool,
    /// When a node said it had handed over every entry (wall clock of the monitor that saw it;
    /// 0: not yet).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub handed_ns: u64,
    /// When the migration started (or was reserved).
    pub since_ns: u64,
    /// Its slots hold pending words and the migration may begin. A chain not prepared only
    /// reserves its slots while the node starting it (`starter`) writes them (no fence acts
    /// on it); it is dropped if its starter is no longer up, its slots retired for the settle
    /// time (a starter that was cut off may still be writing one of them).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub prepared: bool,
    /// The node that reserved it.
    #[serde(default)]
    pub starter: u16,
}

fn yes() -> bool {
    true
}

fn is_true(v: &bool) -> bool {
    *v
}

impl IndexChain {
    /// The chain as the fence takes it.
    pub fn fence_copies(&self) -> Vec<nessie_protocols::fence::IndexCopy> {
        self.copies
            .iter()
            .map(|c| nessie_protocols::fence::IndexCopy {
                node: c.node,
                slot: c.slot,
                receiving: false,
            })
            .collect()
    }
}

/// An index slot a chain no longer uses: free for another once the settle time has passed
/// since (an operation that chose that chain may still be under way until then).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredSlot {
    pub node: u16,
    pub slot: u16,
    pub since_ns: u64,
}

/// Why a migration cannot start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MigrationError {
    #[error("partition {0} is migrating already")]
    Migrating(u16),
    #[error("node {0} is not a member of this cluster")]
    UnknownNode(u16),
    #[error("node {0} is leaving: it takes no copies")]
    Leaving(u16),
    #[error("node {0}'s copies are no longer read (its read cut-over passed or is named): it can only stop; started again, it joins holding nothing")]
    CutOver(u16),
    #[error("node {0} is not leaving (nessie leave --cancel?)")]
    NotLeaving(u16),
    #[error("node {0} stands by (it has never been up): it holds nothing to drain")]
    Standby(u16),
    #[error("node {node} cannot leave while {why}: it would leave partitions with too few copies")]
    NotSettled { node: u16, why: String },
    #[error("node {node} cannot be marked stopped: {why}")]
    NotStopped { node: u16, why: String },
    #[error("node {0} is not failed yet (its step-down or its lease's end not yet seen)")]
    NotFailedYet(u16),
    #[error("node {0} is not the lowest-numbered up node: it does not balance")]
    NotBalancer(u16),
    /// Nothing to change (the balancer's plan moves nothing now), and why.
    #[error("{0}")]
    Idle(String),
    #[error("node {node} cannot leave: {replicas} copies need {replicas} nodes that stay up, and {staying} would")]
    TooFewStaying {
        node: u16,
        replicas: u8,
        staying: usize,
    },
    #[error("node {0} is not up")]
    NotUp(u16),
    #[error("node {node} has no free index slot (all {slots} in use or retired less than the settle time ago)")]
    NoSlot { node: u16, slots: u16 },
    #[error("slot {slot} of node {node} is taken")]
    SlotTaken { node: u16, slot: u16 },
    #[error(
        "the reservation of partition {0}'s migration is gone (its starter was taken for failed)"
    )]
    ReservationGone(u16),
}

/// When and where a failed node's copies move (`None` in [`Policy`]: never).
#[derive(Clone, Debug)]
pub struct Replacing {
    /// How long a node must have been failed first.
    pub after_ns: u64,
    /// Where copies are at home and which spare slots every node has.
    pub set: ReplicaSet,
}

/// What the configuration's successor depends on besides the registrations, and how its times
/// are read.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// How long a failed node stays failed at least before it may join.
    pub hold_ns: u64,
    /// How far apart two nodes' wall clocks may be (`ProtocolConfig::clock_margin_ns`): a time
    /// another node wrote into the configuration is taken to be that much later than it reads.
    pub clock_margin_ns: u64,
    pub replacing: Option<Replacing>,
    /// How long the slots of a chain a migration replaced stay retired before another
    /// partition may take them (a lease TTL and an operation: a node that has not learnt of
    /// the end has stopped, and its operations have ended).
    pub migration_settle_ns: u64,
    /// How long after a migration's entries were all handed over it ends: an operation's
    /// time and the clock margin (every operation that met a pending word has ended). Every
    /// node that acts knew of the migration before the handover began (the hander waits for
    /// that: every node says so, or the settle time passes), so no view older than the
    /// migration is left to wait for.
    pub migration_end_ns: u64,
    /// How long a node's partitions pause after it came back (`ReplicaSet::join_settle_ns`):
    /// a settle time and an operation's time. The pause ends sooner once every node that may
    /// act said it knows, and an operation's time (`op_ns`) has passed since
    /// (`Fence::settle_join_by`).
    pub join_settle_ns: u64,
    /// One operation's time (`ReplicaSet::op_ns`).
    pub op_ns: u64,
    /// The node is fenced until epoch 1 exists, not only from the first epoch that says so: a
    /// cluster with standby nodes places their copies only in epoch 1 ([`standby`]), and a
    /// write before it would land where epoch 1 no longer looks.
    pub fenced_before_epoch_1: bool,
}

/// The configuration of one epoch, as stored in etcd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Configuration {
    pub epoch: u64,
    pub nodes: Vec<Member>,
    /// Copies that moved off their home nodes, in the order they moved (a copy moved twice
    /// appears once, at its latest place).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moves: Vec<CopyMove>,
    /// Index partitions whose chain is in index slots (migrated, or migrating), one record
    /// per partition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub index_chains: Vec<IndexChain>,
    /// Index slots chains no longer use, until they may be used again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired_slots: Vec<RetiredSlot>,
    /// Nodes draining (`nessie leave`): the balancer moves their index partitions away and
    /// gives them none, and no migration may target them; once drained they stop, and the
    /// copies of their tables move to spare slots as a failed node's do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaving: Vec<u16>,
    /// Nodes the cluster started without, which have not joined yet ([`standby`]): failed
    /// since time 0, holding nothing but copy 0 of their own tables, which nobody has written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub standby: Vec<u16>,
}

impl Configuration {
    /// Epoch 1: every node up (as the incarnation `reg` names, where it names one).
    pub fn initial(ids: impl IntoIterator<Item = u16>, reg: &Registrations) -> Self {
        let nodes = ids
            .into_iter()
            .map(|id| Member {
                id,
                state: NodeState::Up,
                since_ns: 0,
                joined_ns: 0,
                incarnation: reg.incarnation(id).unwrap_or(0),
                cut_over_ns: 0,
                stopped_ns: 0,
            })
            .collect();
        Self {
            epoch: 1,
            nodes,
            moves: Vec::new(),
            index_chains: Vec::new(),
            retired_slots: Vec::new(),
            leaving: Vec::new(),
            standby: Vec::new(),
        }
    }

    pub fn state(&self, id: u16) -> Option<NodeState> {
        self.nodes.iter().find(|m| m.id == id).map(|m| m.state)
    }

    /// Whether some node waits until every node knows of a change: a migration's hander
    /// (started, not handed over yet), a joining node before it catches up, the new holder
    /// of a moved copy before it fills it. Then every node says which epoch its fence
    /// applied ([`Registrations::all_learnt`]), and the waits end as soon as all did.
    /// Also while a node that came back is recent (up less than `recent_ns` ago at wall
    /// time `now_ns`): its partitions' pause ends as soon as every node knows.
    ///
    /// And while a moved copy became full less than `moved_ns` ago (rule 10c): its pauses
    /// end as soon as every node knows, and then as soon as every node reads it in the new
    /// roles.
    pub fn wants_acks(&self, now_ns: u64, recent_ns: u64, moved_ns: u64) -> bool {
        self.index_chains
            .iter()
            .any(|c| c.migrating && c.prepared && c.handed_ns == 0)
            || self.nodes.iter().any(|m| m.state == NodeState::Joining)
            || self.moves.iter().any(|m| m.receiving)
            || !self.came_back(now_ns, recent_ns).is_empty()
            || self.moves.iter().any(|m| {
                !m.at_start
                    && m.full_since_ns != 0
                    && now_ns < m.full_since_ns.saturating_add(moved_ns)
            })
    }

    /// The nodes that came back (a later incarnation joined, or a standby node joined) and
    /// have been up for less than `recent_ns` at wall time `now_ns`: their partitions pause.
    pub fn came_back(&self, now_ns: u64, recent_ns: u64) -> Vec<&Member> {
        self.nodes
            .iter()
            .filter(|m| m.state == NodeState::Up && m.joined_ns != 0)
            .filter(|m| now_ns < m.since_ns.saturating_add(recent_ns))
            .collect()
    }

    /// The failed nodes whose background duties fall to node `id` (sweeping their share of
    /// the index for expired items): each failed node's heir is the first node after it, in
    /// id order around the ring, that is up. Empty unless `id` is up.
    pub fn inherited_by(&self, id: u16) -> Vec<u16> {
        let mut ids: Vec<(u16, NodeState)> = self.nodes.iter().map(|m| (m.id, m.state)).collect();
        ids.sort_unstable_by_key(|&(n, _)| n);
        let n = ids.len();
        (0..n)
            .filter(|&i| ids[i].1 == NodeState::Failed)
            .filter(|&i| {
                (1..n)
                    .map(|k| ids[(i + k) % n])
                    .find(|&(_, s)| s == NodeState::Up)
                    .is_some_and(|(heir, _)| heir == id)
            })
            .map(|i| ids[i].0)
            .collect()
    }

    /// Node `id`'s state as the process with incarnation number `incarnation` sees its own:
    /// `failed` if the configuration names another process (the one it names is dead).
    pub fn own_state(&self, id: u16, incarnation: u64) -> Option<NodeState> {
        let m = self.nodes.iter().find(|m| m.id == id)?;
        match m.incarnation {
            0 => Some(m.state),
            i if i == incarnation => Some(m.state),
            _ => Some(NodeState::Failed),
        }
    }

    /// The next epoch given the registrations at wall time `now_ns`, or `None` if nothing
    /// changes. A failed node may join only once it has been failed for `policy.hold_ns` (if
    /// its copies moved meanwhile, it comes back holding only what is placed on it now); one
    /// failed for `replacing.after_ns` has its copies moved.
    pub fn successor(
        &self,
        reg: &Registrations,
        now_ns: u64,
        policy: &Policy,
    ) -> Option<Configuration> {
        let mut next = self.clone();
        let mut changed = false;
        let mut up_again = Vec::new();
        for m in &mut next.nodes {
            let registered = reg.incarnation(m.id);
            let present = reg.present.contains(&m.id);
            // Ready for this join: a ready said for an earlier one (the node failed and joined
            // again within one registration, its catch-up then missing writes) is not.
            let ready = reg.ready.contains(&m.id)
                && reg
                    .ready_for
                    .iter()
                    .find(|&&(n, _)| n == m.id)
                    .is_none_or(|&(_, j)| j == m.joined_ns);
            let held = now_ns >= m.since_ns.saturating_add(policy.hold_ns);
            // The registration is another process's than the one this member is: that one
            // died, and this one restarted before its lease lapsed.
            let replaced = m.incarnation != 0 && registered.is_some_and(|i| i != m.incarnation);
            let state = match (m.state, present) {
                (NodeState::Up | NodeState::Joining, false) => NodeState::Failed,
                (NodeState::Up | NodeState::Joining, true) if replaced => NodeState::Failed,
                (NodeState::Failed, true) if held => NodeState::Joining,
                (NodeState::Joining, true) if ready => NodeState::Up,
                (s, _) => s,
            };
            if state != m.state {
                changed = true;
                m.state = state;
                m.since_ns = now_ns;
                if state == NodeState::Joining {
                    m.joined_ns = now_ns;
                    m.incarnation = registered.unwrap_or(0);
                    m.cut_over_ns = 0;
                    if !balance::mutation::stopped_outlives_incarnation() {
                        m.stopped_ns = 0;
                    }
                }
                if state == NodeState::Up {
                    up_again.push(m.id);
                }
            } else if m.state == NodeState::Up && m.incarnation == 0 && registered.is_some() {
                // A member recorded before incarnations were: the process registered now is
                // taken for it (nothing tells otherwise), and told apart from later ones.
                changed = true;
                m.incarnation = registered.unwrap_or(0);
            }
        }
        // A standby node that is up is one like any other from now on. Until then (joining,
        // or failed while joining) nobody writes its tables (nobody claims its pages, its own
        // workers do not write), so it stays standby: its copy 0 is not moved, and its tables
        // read as zeros where no full copy is left (SB5).
        next.standby.retain(|n| !up_again.contains(n));
        if let Some(r) = &policy.replacing {
            changed |= next.fill_moves(reg, now_ns);
            let left_after_ns = r
                .set
                .join_settle_ns()
                .saturating_add(policy.clock_margin_ns);
            changed |= next.move_copies(r, now_ns, left_after_ns);
        }
        changed |= next.end_migrations(
            reg,
            now_ns,
            (policy.migration_end_ns, policy.migration_settle_ns),
        );
        changed.then(|| {
            next.epoch += 1;
            next
        })
    }

    /// Whether slot `slot` of `node` is in use at `now_ns`: by a chain (reserved, migrating
    /// or in force), or retired less than `settle_ns` ago.
    fn slot_used(&self, node: u16, slot: u16, now_ns: u64, settle_ns: u64) -> bool {
        self.index_chains
            .iter()
            .flat_map(|c| &c.copies)
            .any(|c| (c.node, c.slot) == (node, slot))
            || self.retired_slots.iter().any(|r| {
                (r.node, r.slot) == (node, slot) && now_ns < r.since_ns.saturating_add(settle_ns)
            })
    }

    /// The slot a new copy on `node` may take: the lowest of its `slots` not in use.
    pub fn free_index_slot(
        &self,
        node: u16,
        slots: u16,
        now_ns: u64,
        settle_ns: u64,
    ) -> Option<u16> {
        // One pass over the chains, not one per slot: a balancer's batch asks this for
        // hundreds of copies of thousands of chains (quadratic, it took tens of seconds).
        let mut used = vec![false; slots as usize];
        let chains = self.index_chains.iter().flat_map(|c| &c.copies);
        let retired = self
            .retired_slots
            .iter()
            .filter(|r| now_ns < r.since_ns.saturating_add(settle_ns))
            .map(|r| SlotCopy {
                node: r.node,
                slot: r.slot,
            });
        for c in chains.copied().chain(retired).filter(|c| c.node == node) {
            if let Some(u) = used.get_mut(c.slot as usize) {
                *u = true;
            }
        }
        used.iter().position(|&u| !u).map(|s| s as u16)
    }

    /// The successor that reserves `copies` (index slots) for `starter` to migrate `partition`
    /// at wall time `now_ns`: the first of the two epochs that start a migration. The starter
    /// then writes the slots pending (nobody else writes a reserved slot) and confirms
    /// ([`Self::confirm_migration`], naming the reservation by `now_ns`).
    pub fn reserve_migration(
        &self,
        partition: u16,
        copies: Vec<SlotCopy>,
        (starter, now_ns): (u16, u64),
        settle_ns: u64,
    ) -> Result<Configuration, MigrationError> {
        self.all_up(std::iter::once(starter))?;
        if self
            .index_chains
            .iter()
            .any(|c| c.partition == partition && c.migrating)
        {
            return Err(MigrationError::Migrating(partition));
        }
        self.all_up(copies.iter().map(|c| c.node))?;
        if let Some(c) = copies.iter().find(|c| self.leaving.contains(&c.node)) {
            return Err(MigrationError::Leaving(c.node));
        }
        for c in &copies {
            if self.slot_used(c.node, c.slot, now_ns, settle_ns) {
                return Err(MigrationError::SlotTaken {
                    node: c.node,
                    slot: c.slot,
                });
            }
        }
        let mut next = self.clone();
        next.epoch += 1;
        // The chain it replaces keeps its slots until the migration ends (`end_migrations`).
        next.index_chains.push(IndexChain {
            partition,
            copies,
            migrating: true,
            handed_ns: 0,
            since_ns: now_ns,
            prepared: false,
            starter,
        });
        Ok(next)
    }

    /// Every one of `nodes` is up, or the first that is not.
    fn all_up(&self, mut nodes: impl Iterator<Item = u16>) -> Result<(), MigrationError> {
        match nodes.find(|&n| self.state(n) != Some(NodeState::Up)) {
            Some(n) => Err(MigrationError::NotUp(n)),
            None => Ok(()),
        }
    }

    /// A copy of this configuration, and where in it the reservation `starter` made at
    /// `reserved_ns` for migrating `partition` to `copies` is.
    fn with_reservation(
        &self,
        partition: u16,
        copies: &[SlotCopy],
        (starter, reserved_ns): (u16, u64),
    ) -> Result<(Configuration, usize), MigrationError> {
        let i = self
            .index_chains
            .iter()
            .position(|c| {
                (c.partition, c.starter, c.since_ns) == (partition, starter, reserved_ns)
                    && !c.prepared
                    && c.copies == copies
            })
            .ok_or(MigrationError::ReservationGone(partition))?;
        Ok((self.clone(), i))
    }

    /// The successor that starts the migration of `partition` to `copies` reserved by
    /// `starter` at `reserved_ns`, whose slots now hold pending words.
    pub fn confirm_migration(
        &self,
        partition: u16,
        copies: &[SlotCopy],
        reserved: (u16, u64),
        now_ns: u64,
    ) -> Result<Configuration, MigrationError> {
        self.all_up(copies.iter().map(|c| c.node))?;
        let (mut next, i) = self.with_reservation(partition, copies, reserved)?;
        let c = &mut next.index_chains[i];
        c.prepared = true;
        c.since_ns = now_ns;
        next.epoch += 1;
        Ok(next)
    }

    /// The successor without the reservation `starter` made at `reserved_ns` (it gave up):
    /// its slots are retired for the settle time, as a chain's are.
    pub fn cancel_migration(
        &self,
        partition: u16,
        copies: &[SlotCopy],
        reserved: (u16, u64),
        now_ns: u64,
    ) -> Result<Configuration, MigrationError> {
        let (mut next, i) = self.with_reservation(partition, copies, reserved)?;
        next.retire_chain(i, now_ns);
        next.index_chains.remove(i);
        next.epoch += 1;
        Ok(next)
    }

    /// The successor that reserves index slots on the nodes of each chain of `plan` (the lowest
    /// free of `slots` on each, slots reserved earlier in the batch taken), for `starter` at
    /// `now_ns`. A partition that cannot be reserved (no free slot, migrating already, a node
    /// not up) is left out; an error only if none could be.
    pub fn reserve_batch(
        &self,
        plan: &[(u16, Vec<u16>)],
        (starter, now_ns): (u16, u64),
        slots: u16,
        settle_ns: u64,
    ) -> Result<(Configuration, Vec<Reserved>), MigrationError> {
        let mut next = self.clone();
        let mut got = Vec::new();
        let mut refused = None;
        for (q, to) in plan {
            let reserved = to
                .iter()
                .map(|&node| {
                    next.free_index_slot(node, slots, now_ns, settle_ns)
                        .map(|slot| SlotCopy { node, slot })
                        .ok_or(MigrationError::NoSlot { node, slots })
                })
                .collect::<Result<Vec<_>, _>>()
                .and_then(|copies| {
                    let n =
                        next.reserve_migration(*q, copies.clone(), (starter, now_ns), settle_ns)?;
                    Ok((n, copies))
                });
            match reserved {
                Ok((n, copies)) => {
                    next = n;
                    got.push((*q, copies));
                }
                Err(e) => {
                    refused.get_or_insert(e);
                }
            }
        }
        if got.is_empty() {
            return Err(refused.expect("a refusal for every partition of a plan"));
        }
        next.epoch = self.epoch + 1;
        Ok((next, got))
    }

    /// Put the slots of chain `i` among the retired ones.
    fn retire_chain(&mut self, i: usize, now_ns: u64) {
        let slots: Vec<SlotCopy> = self.index_chains[i].copies.clone();
        for s in slots {
            self.retired_slots.push(RetiredSlot {
                node: s.node,
                slot: s.slot,
                since_ns: now_ns,
            });
        }
    }

    /// Migrations whose entries a node handed over get the time it was seen; those handed
    /// over `end_ns` ago end (their chain is the partition's, the chain before is retired);
    /// retired slots older than `settle_ns` are forgotten.
    fn end_migrations(
        &mut self,
        reg: &Registrations,
        now_ns: u64,
        (end_ns, settle_ns): (u64, u64),
    ) -> bool {
        let mut changed = false;
        // Reservations whose starter is no longer up: their slots are retired (the starter,
        // cut off, may still write one of them for an operation's time).
        let dead: Vec<usize> = (0..self.index_chains.len())
            .filter(|&i| {
                let c = &self.index_chains[i];
                !c.prepared && self.state(c.starter) != Some(NodeState::Up)
            })
            .collect();
        for &i in dead.iter().rev() {
            self.retire_chain(i, now_ns);
            self.index_chains.remove(i);
            changed = true;
        }
        let mut ended = Vec::new();
        for (i, c) in self.index_chains.iter_mut().enumerate() {
            if !c.migrating || !c.prepared {
                continue;
            }
            if c.handed_ns == 0 {
                if reg
                    .handed
                    .iter()
                    .any(|&(_, q, since)| (q, since) == (c.partition, c.since_ns))
                {
                    c.handed_ns = now_ns;
                    changed = true;
                }
            } else if now_ns >= c.handed_ns.saturating_add(end_ns) {
                c.migrating = false;
                changed = true;
                ended.push((i, c.partition));
            }
        }
        for (i, q) in ended {
            // The chain the partition had before (an earlier migration's), if any, is retired.
            let before: Vec<usize> = (0..self.index_chains.len())
                .filter(|&k| {
                    k != i && self.index_chains[k].partition == q && !self.index_chains[k].migrating
                })
                .collect();
            for k in before {
                self.retire_chain(k, now_ns);
                self.index_chains[k].copies.clear();
            }
        }
        self.index_chains.retain(|c| !c.copies.is_empty());
        let before = self.retired_slots.len();
        self.retired_slots
            .retain(|r| now_ns < r.since_ns.saturating_add(settle_ns));
        changed | (self.retired_slots.len() != before)
    }

    /// Receiving copies whose holder is up and says it filled them become full.
    fn fill_moves(&mut self, reg: &Registrations, now_ns: u64) -> bool {
        let mut changed = false;
        for c in self.moves.iter_mut().filter(|c| c.receiving) {
            let up = self
                .nodes
                .iter()
                .any(|m| m.id == c.node && m.state == NodeState::Up);
            if up && reg.filled.contains(&(c.node, c.partition, c.copy)) {
                c.receiving = false;
                c.full_since_ns = now_ns;
                changed = true;
            }
        }
        changed
    }

    /// The copy map this configuration describes.
    pub fn copy_map(&self, set: &ReplicaSet) -> CopyMap {
        let mut map = CopyMap::home(set);
        for c in &self.moves {
            map.set_place(
                c.partition,
                c.copy,
                Placement {
                    node: c.node,
                    slot: c.slot,
                },
            );
        }
        map
    }

    /// Move the copies of every node gone for good (failed for `r.after_ns`, or for
    /// `left_after_ns` once seen to stop after leaving: `Member::gone_for_good`) that still
    /// holds some to spare slots on up nodes that are not leaving, receiving. Copies no node can take stay where
    /// they are. (A leaving node's table copies move only so, once it has stopped: moving the
    /// copies of a node that still serves would need them to fade as a failed node's do.)
    fn move_copies(&mut self, r: &Replacing, now_ns: u64, left_after_ns: u64) -> bool {
        let mut changed = false;
        let due: Vec<u16> = self
            .nodes
            .iter()
            .filter(|m| m.gone_for_good(now_ns, r.after_ns, left_after_ns))
            .map(|m| m.id)
            .collect();
        for gone in due {
            if self.standby.contains(&gone) {
                // Copy 0 of its own tables waits at home for it (`standby`).
                continue;
            }
            let map = self.copy_map(&r.set);
            if map.held_by(gone).is_empty() {
                continue;
            }
            let up = |n: u16| self.state(n) == Some(NodeState::Up) && !self.leaving.contains(&n);
            let (moves, stuck) = map.replace(&r.set, gone, up);
            if !stuck.is_empty() {
                tracing::warn!(node = gone, ?stuck, "copies of a failed node have nowhere to go (no spare slot on a node without them)");
            }
            for m in moves {
                self.moves
                    .retain(|c| (c.partition, c.copy) != (m.partition, m.j));
                self.moves.push(CopyMove {
                    partition: m.partition,
                    copy: m.j,
                    node: m.to.node,
                    slot: m.to.slot,
                    receiving: true,
                    at_start: false,
                    full_since_ns: 0,
                });
                changed = true;
            }
        }
        changed
    }
}

/// Put the configuration `change` makes of the one in force at wall time `now`, by
/// compare-and-put on its revision, tried again when another change came first (a monitor's,
/// or another tool's). `change` returns the successor and what to return.
pub fn change_config<T>(
    etcd: &Etcd,
    keys: &Keys,
    change: impl Fn(&Configuration, u64) -> Result<(Configuration, T), MigrationError>,
) -> Result<T, StartMigrationError> {
    change_config_cached(etcd, keys, &ConfigCache::default(), change)
}

/// [`change_config`], reading the configuration through `cache`.
pub fn change_config_cached<T>(
    etcd: &Etcd,
    keys: &Keys,
    cache: &ConfigCache,
    change: impl Fn(&Configuration, u64) -> Result<(Configuration, T), MigrationError>,
) -> Result<T, StartMigrationError> {
    for _ in 0..MAX_START_TRIES {
        let snap = snapshot_cached(etcd, keys, cache)?;
        let Some(c) = snap.config else {
            return Err(StartMigrationError::NoConfiguration);
        };
        let (next, out) = change(&c, wall_ns())?;
        let body = serde_json::to_vec(&next).expect("serialises");
        if etcd.put_if_mod_revision(&keys.config(), snap.config_revision, &body)? {
            return Ok(out);
        }
    }
    Err(StartMigrationError::Busy)
}

/// Most compare-and-puts a migration's start tries before it gives up (each lost to another
/// change of the configuration).
const MAX_START_TRIES: u32 = 20;

/// Why a migration did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartMigrationError {
    #[error(transparent)]
    Refused(#[from] MigrationError),
    #[error(transparent)]
    Membership(#[from] MembershipError),
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error("no configuration in etcd yet (the cluster has not started)")]
    NoConfiguration,
    #[error("the configuration kept changing; try again")]
    Busy,
}

#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    #[error("lease TTL {0} s is not in {MIN_LEASE_TTL_S}..={MAX_LEASE_TTL_S}")]
    LeaseTtl(u64),
    #[error("the membership configuration in etcd at {key} is not valid: {why}")]
    BadRecord { key: String, why: String },
    #[error(transparent)]
    Standby(#[from] standby::StandbyError),
}

/// Where one cluster's records live in etcd.
#[derive(Clone, Debug)]
pub struct Keys {
    pub prefix: String,
}

impl Keys {
    /// Clusters sharing an etcd are told apart by name and configuration fingerprint.
    pub fn new(cluster_name: &str, fingerprint: u64) -> Self {
        Self {
            prefix: format!("/nessie/{cluster_name}/{fingerprint:016x}/"),
        }
    }
    pub fn members(&self) -> String {
        format!("{}members/", self.prefix)
    }
    pub fn member(&self, id: u16) -> String {
        format!("{}members/{id}", self.prefix)
    }
    pub fn config(&self) -> String {
        format!("{}config", self.prefix)
    }
}

/// What etcd says about the cluster right now.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// `None` before `nessie up` wrote epoch 1.
    pub config: Option<Configuration>,
    /// The configuration's etcd revision (0 if absent), for compare-and-put.
    pub config_revision: i64,
    pub registrations: Registrations,
}

/// The configuration a monitor last read, and its revision: a read that finds it unchanged
/// ([`Etcd::get_revision`]) skips fetching and decoding it again. With thousands of index
/// chains it is half a megabyte, and every monitor reads it at every change of any
/// registration (each node says which epoch it applied while a change waits on that).
#[derive(Default)]
pub struct ConfigCache(Mutex<Option<(i64, Configuration)>>);

/// [`snapshot`], the configuration taken from `cache` if etcd has not changed it since.
pub fn snapshot_cached(
    etcd: &Etcd,
    keys: &Keys,
    cache: &ConfigCache,
) -> Result<Snapshot, MembershipError> {
    let cached = cache.0.lock().expect("config cache lock").clone();
    // The configuration before the registrations, as `snapshot` reads them: a
    // compare-and-put on the configuration's revision then succeeds only if it was still in
    // force when the registrations were read, so the two held together (registrations read
    // first could be older than the configuration, and make a node up on a stale `ready`).
    // Any revision but the cached one (a change, an etcd restored from a backup) fetches it
    // again; none means there is none.
    if let Some((rev, c)) = cached {
        if etcd.get_revision(&keys.config())? == Some(rev) {
            return Ok(Snapshot {
                config: Some(c),
                config_revision: rev,
                registrations: read_registrations(etcd, keys)?,
            });
        }
    }
    let snap = snapshot(etcd, keys)?;
    *cache.0.lock().expect("config cache lock") =
        snap.config.clone().map(|c| (snap.config_revision, c));
    Ok(snap)
}

/// Read the configuration and the live registrations.
pub fn snapshot(etcd: &Etcd, keys: &Keys) -> Result<Snapshot, MembershipError> {
    let config = etcd.get(&keys.config())?;
    let registrations = read_registrations(etcd, keys)?;
    let (config, config_revision) = match config {
        None => (None, 0),
        Some(kv) => {
            let c = serde_json::from_slice(&kv.value).map_err(|e| MembershipError::BadRecord {
                key: keys.config(),
                why: e.to_string(),
            })?;
            (Some(c), kv.mod_revision)
        }
    };
    Ok(Snapshot {
        config,
        config_revision,
        registrations,
    })
}

/// The live registrations.
fn read_registrations(etcd: &Etcd, keys: &Keys) -> Result<Registrations, MembershipError> {
    let mut registrations = Registrations::default();
    for kv in etcd.get_prefix(&keys.members())? {
        let Some(id) = kv
            .key
            .strip_prefix(&keys.members())
            .and_then(|k| k.parse::<u16>().ok())
        else {
            continue;
        };
        registrations.present.push(id);
        let record: serde_json::Value = serde_json::from_slice(&kv.value).unwrap_or_default();
        if let Some(i) = record["incarnation"].as_u64().filter(|&i| i != 0) {
            registrations.incarnations.push((id, i));
        }
        if record["ready"] == serde_json::Value::Bool(true) {
            registrations.ready.push(id);
        }
        let filled: Vec<(u16, u8)> =
            serde_json::from_value(record["filled"].clone()).unwrap_or_default();
        registrations
            .filled
            .extend(filled.into_iter().map(|(p, j)| (id, p, j)));
        let handed: Vec<(u16, u64)> =
            serde_json::from_value(record["handed"].clone()).unwrap_or_default();
        registrations
            .handed
            .extend(handed.into_iter().map(|(q, since)| (id, q, since)));
        if let Some(e) = record["seen"].as_u64().filter(|&e| e != 0) {
            registrations.seen.push((id, e));
        }
        if let Some(j) = record["ready_for"].as_u64().filter(|&j| j != 0) {
            registrations.ready_for.push((id, j));
        }
        if let Some(e) = record["reads_new"].as_u64().filter(|&e| e != 0) {
            registrations.reads_new.push((id, e));
        }
    }
    Ok(registrations)
}

/// Write epoch 1 with every node of `ids` up (as the processes registered now) but those of
/// `standby`, which start later ([`standby::first_epoch`], placing their share on the others
/// by `set`), unless a configuration exists already. Returns the configuration in force.
pub fn initialise(
    etcd: &Etcd,
    keys: &Keys,
    ids: &[u16],
    standby: &[u16],
    set: &ReplicaSet,
) -> Result<Configuration, MembershipError> {
    let reg = snapshot(etcd, keys)?.registrations;
    let first = standby::first_epoch(ids, standby, &reg, set)?;
    let body = serde_json::to_vec(&first).expect("serialises");
    if etcd.put_if_mod_revision(&keys.config(), 0, &body)? {
        return Ok(first);
    }
    snapshot(etcd, keys)?
        .config
        .ok_or_else(|| MembershipError::BadRecord {
            key: keys.config(),
            why: "vanished right after it was found".into(),
        })
}

/// One monitoring step: move the configuration to its successor if registrations changed
/// or copies are due to move (`policy`). Returns the configuration in
/// force afterwards (`None` before epoch 1).
pub fn step(
    etcd: &Etcd,
    keys: &Keys,
    policy: &Policy,
    cache: &ConfigCache,
) -> Result<(Option<Configuration>, Registrations), MembershipError> {
    let snap = snapshot_cached(etcd, keys, cache)?;
    let Some(config) = snap.config else {
        return Ok((None, snap.registrations));
    };
    let Some(next) = config.successor(&snap.registrations, wall_ns(), policy) else {
        return Ok((Some(config), snap.registrations));
    };
    let body = serde_json::to_vec(&next).expect("serialises");
    if etcd.put_if_mod_revision(&keys.config(), snap.config_revision, &body)? {
        tracing::info!(epoch = next.epoch, nodes = ?next.nodes, "new membership epoch");
        return Ok((Some(next), snap.registrations));
    }
    // Another monitor moved the epoch first: take what it wrote.
    let again = snapshot_cached(etcd, keys, cache)?;
    Ok((again.config, again.registrations))
}

/// Called with every configuration read, before it is applied to the fence: a node process
/// reconnects to peers that restarted (their new fabric addresses) here, so that it never
/// writes a restarted node's copies through its old connection.
pub type ConfigHook = Box<dyn Fn(&Configuration) + Send + Sync>;

/// What a node knows of membership, for its status report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct View {
    /// The configuration last read from etcd.
    pub config: Option<Configuration>,
    /// Why the last exchange with etcd failed (`None`: it succeeded).
    pub etcd_error: Option<String>,
    pub etcd_url: String,
    pub lease_ttl_s: u64,
    /// The registrations read with `config` (not in status reports).
    #[serde(skip)]
    pub registrations: Registrations,
    /// This process's registration (`Monitor::registration`) in force when `config` was read.
    #[serde(skip)]
    pub registration: u64,
}

/// A node's registration and monitor: a thread that keeps the lease alive and runs [`step`]
/// every third of a TTL, and feeds what it learns into the node's protocol [`Fence`]: the nodes that
/// failed (their writers' in-flight writes may be completed), and until when this node may
/// write: while the configuration says it is `up`, until its lease may lapse by its own clock
/// (the time it sent its last successful keep-alive plus the TTL etcd granted). A node that was
/// paused past its lease is thus fenced the moment it resumes, before it hears from etcd, and a
/// node that cannot reach etcd stops writing (reads go on) within a TTL, since its peers may
/// declare it failed and complete its writes (FaRM's rule). Dropping it stops the thread and
/// revokes the lease (a clean shutdown is seen at once; a crash when the lease lapses).
pub struct Monitor {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    etcd: Etcd,
    keys: Keys,
}

/// What the monitor thread and its owner share.
struct Shared {
    view: Mutex<View>,
    stop: AtomicBool,
    /// The lease the registration lives under now (it changes when it lapsed and was renewed).
    lease: std::sync::atomic::AtomicI64,
    /// Monotonic ns until which the lease holds for sure (the last keep-alive's send time plus
    /// the TTL etcd answered).
    lease_clock_ns: AtomicU64,
    /// Monotonic ns until which this node's view of the configuration is fresh enough to act
    /// on: the send time of the last successful read plus the TTL. Peers act on a new epoch
    /// only a TTL after they learn it (`replica::ReplicaSet::settle_ns`), so a node that has not
    /// read it by then stops writing rather than act on the old one.
    view_clock_ns: AtomicU64,
    /// Monotonic ns until which this node's view is fresh enough to read replicated memory
    /// by: the send time of the last successful read plus [`read_view_ns`].
    read_clock_ns: AtomicU64,
    lease_ttl_ns: u64,
    /// This process's incarnation number (its registration's).
    incarnation: u64,
    /// This node is `up` in the configuration last read (or there is none yet), as this
    /// process: not if the configuration names an earlier one.
    up: AtomicBool,
    /// This node stepped down (`Monitor::step_down`): its fence stays shut whatever a
    /// monitor step that was under way then does.
    stepped_down: AtomicBool,
    fence: Arc<Fence>,
    /// How long a failed node stays failed before it may join, and when copies move (`step`).
    policy: Policy,
    /// This node said it holds its copies (its registration says `ready`): 1 + the
    /// registration (`registered`) in which it caught up; 0: not ready.
    ready: AtomicU64,
    /// The join (`Member::joined_ns`) the catch-up that made it ready was for: a ready said
    /// for one join never makes a later one up ("ready_for").
    ready_for: AtomicU64,
    /// Registrations made after a lapsed lease, by this process: a catch-up begun before one
    /// must not make the new registration ready (the node was failed meanwhile, and joins
    /// again: writes it missed are not in its copies).
    registered: AtomicU64,
    /// The moved copies this node said it filled (its registration's "filled").
    filled: Mutex<Vec<(u16, u8)>>,
    /// The migrating index partitions this node said it handed over ("handed").
    handed: Mutex<Vec<(u16, u64)>>,
    /// The epoch its registration says its fence applied ("seen"; 0: none said).
    seen: AtomicU64,
    /// The epoch as of which its registration says it reads no full moved copy in the old
    /// roles ("reads_new"; 0: none said; rule 10c).
    reads_new: AtomicU64,
    /// Held while a registration record is made from the fields above and put, so that of
    /// two threads putting (the monitor saying "seen", the node saying "handed"), the later
    /// put carries both.
    record_lock: Mutex<()>,
    /// Nodes that came back (`Configuration::came_back`), as this monitor follows them.
    came_back: Mutex<Vec<CameBack>>,
    /// Moved copies that became full, as this monitor follows them (rule 10c).
    moves_seen: Mutex<Vec<moved_settle::MoveSeen>>,
    /// The configuration as last read, for reads that find it unchanged.
    config_cache: ConfigCache,
    on_config: Option<ConfigHook>,
}

/// A node that came back, as a monitor follows it until its pause ends.
#[derive(Clone, Copy, Debug)]
struct CameBack {
    node: u16,
    /// Which comeback: its incarnation and when that joined (a node whose lease lapsed joins
    /// again with the same incarnation, later).
    incarnation: u64,
    joined_ns: u64,
    /// The first epoch this monitor saw it up in, this comeback.
    epoch: u64,
    /// Every node said it knows, and this fence's pause was ended early.
    settled: bool,
    /// When the pause ends here (monotonic ns; once settled).
    ends_ns: u64,
}

impl CameBack {
    /// Whether this monitor still follows the comeback, `back` being the nodes that came back
    /// recently in `c` (`Configuration::came_back`): while it is among them, and once settled
    /// for as long as that incarnation stays up in that join, since the balancer holds a node
    /// longer than it counts as having come back (`Configuration::plan_balance_settled`: a
    /// join settle time and a settle time). Dropped after the first, the node was held again
    /// for the rest, and nothing balanced (seen: 3 s after a scale-out had finished).
    fn followed(&self, c: &Configuration, back: &[&Member]) -> bool {
        let same = |m: &Member| {
            (self.node, self.incarnation, self.joined_ns) == (m.id, m.incarnation, m.joined_ns)
        };
        back.iter().any(|m| same(m))
            || (self.settled
                && !balance::mutation::comeback_forgotten()
                && c.nodes.iter().any(|m| m.state == NodeState::Up && same(m)))
    }
}

impl Shared {
    /// How long after a node is declared failed its process may still act unasked
    /// (`Registrations::all_learnt`): the join settle time (a TTL and an operation) and the
    /// clock margin, by the failure's time in the configuration.
    fn recently_failed_ns(&self) -> u64 {
        self.policy
            .join_settle_ns
            .saturating_add(self.policy.clock_margin_ns)
    }

    /// How long after a moved copy became full (by the configuration's time) its changes may
    /// still pause (rule 10a: twice the join settle time and an operation, from when a node
    /// learnt of it) and every node says what it knows (rule 10c): that, and the clock margin
    /// twice.
    fn moved_settle_ns(&self) -> u64 {
        let p = &self.policy;
        p.join_settle_ns
            .saturating_mul(2)
            .saturating_add(p.op_ns)
            .saturating_add(p.clock_margin_ns.saturating_mul(2))
    }

    /// What the fence must say now: writes only while up, and within the lease.
    /// Whether this node is ready in the registration in force: it caught up in it.
    fn is_ready(&self) -> bool {
        ready_in(
            self.ready.load(Ordering::SeqCst),
            self.registered.load(Ordering::SeqCst),
        )
    }

    fn refresh_fence(&self) {
        let until = if self.up.load(Ordering::SeqCst) && !self.stepped_down.load(Ordering::SeqCst) {
            self.lease_clock_ns
                .load(Ordering::SeqCst)
                .min(self.view_clock_ns.load(Ordering::SeqCst))
        } else {
            0
        };
        self.fence.set_lease_until(until);
        self.fence
            .set_view_until(self.read_clock_ns.load(Ordering::SeqCst));
    }
}

/// Whether a node whose `ready` word is `ready` (1 + the registration it caught up in, or 0)
/// is ready in registration `registered`.
fn ready_in(ready: u64, registered: u64) -> bool {
    ready == registered + 1
}

/// This process's monotonic clock (`nessie_fabric::monotonic_ns`): for the deadlines a node
/// sets and checks itself (its lease, its view's freshness), which a step of the wall clock
/// must not move.
fn mono_ns() -> u64 {
    nessie_fabric::monotonic_ns()
}

/// Wall-clock ns since the Unix epoch: only for times written into the configuration, which
/// other nodes read.
fn wall_ns() -> u64 {
    nessie_fabric::wall_clock_ns()
}

impl Monitor {
    /// Register node `id` under a new lease and start monitoring, feeding `fence`.
    /// `policy.hold_ns`: how long a failed node stays failed at least before it may join again
    /// (every node must have learnt of the failure and acted on it).
    pub fn start(
        etcd: Etcd,
        keys: Keys,
        id: u16,
        lease_ttl_s: u64,
        policy: Policy,
        fence: Arc<Fence>,
        on_config: Option<ConfigHook>,
    ) -> Result<Monitor, MembershipError> {
        if !(MIN_LEASE_TTL_S..=MAX_LEASE_TTL_S).contains(&lease_ttl_s) {
            return Err(MembershipError::LeaseTtl(lease_ttl_s));
        }
        // Drawn anew by every process: a registration naming another number than the
        // configuration's member is a process started since (`Configuration::successor`).
        let incarnation = rand::random::<u64>().max(1);
        let sent = mono_ns();
        let (lease, granted) = register(&etcd, &keys, id, incarnation, lease_ttl_s, false)?;
        let shared = Arc::new(Shared {
            incarnation,
            view: Mutex::new(View {
                etcd_url: etcd.url().to_string(),
                lease_ttl_s,
                ..View::default()
            }),
            stop: AtomicBool::new(false),
            lease: std::sync::atomic::AtomicI64::new(lease.0),
            lease_clock_ns: AtomicU64::new(sent + granted * 1_000_000_000),
            view_clock_ns: AtomicU64::new(sent + lease_ttl_s * 1_000_000_000),
            read_clock_ns: AtomicU64::new(sent + read_view_ns(lease_ttl_s)),
            lease_ttl_ns: lease_ttl_s * 1_000_000_000,
            // Until the configuration says otherwise: a cluster starting has none yet.
            up: AtomicBool::new(!policy.fenced_before_epoch_1),
            stepped_down: AtomicBool::new(false),
            fence,
            policy,
            ready: AtomicU64::new(0),
            ready_for: AtomicU64::new(0),
            registered: AtomicU64::new(0),
            filled: Mutex::new(Vec::new()),
            handed: Mutex::new(Vec::new()),
            seen: AtomicU64::new(0),
            reads_new: AtomicU64::new(0),
            record_lock: Mutex::new(()),
            came_back: Mutex::new(Vec::new()),
            moves_seen: Mutex::new(Vec::new()),
            config_cache: ConfigCache::default(),
            on_config,
        });
        // Fenced until the first read: a node restarted after it was declared failed must not
        // act on its empty memory as if it were up.
        shared.fence.set_lease_until(0);
        shared.fence.set_view_until(0);
        read_configuration(&etcd, &keys, id, &shared)?;
        let spawn_failed = |e: std::io::Error| MembershipError::BadRecord {
            key: "thread".into(),
            why: e.to_string(),
        };
        let prefix = keys.prefix.clone();
        let monitor_keys = keys.clone();
        let thread = {
            let (etcd, shared) = (etcd.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("membership-{id}"))
                .spawn(move || run(etcd, keys, id, lease_ttl_s, &shared))
                .map_err(spawn_failed)?
        };
        {
            // Not joined on drop: it ends within one watch span of `stop`.
            let (etcd, shared, monitor) = (etcd.clone(), shared.clone(), thread.thread().clone());
            std::thread::Builder::new()
                .name(format!("membership-watch-{id}"))
                .spawn(move || watch(etcd, &prefix, &shared, &monitor))
                .map_err(spawn_failed)?;
        }
        Ok(Monitor {
            shared,
            thread: Some(thread),
            etcd,
            keys: monitor_keys,
        })
    }

    pub fn view(&self) -> View {
        self.shared
            .view
            .lock()
            .expect("membership view lock")
            .clone()
    }

    /// Whether, by the configuration and registrations last read, every node that may act
    /// has applied epoch `epoch` or a later one ([`Registrations::all_learnt`]).
    pub fn all_learnt(&self, epoch: u64) -> bool {
        let v = self.shared.view.lock().expect("membership view lock");
        let failed = self.shared.recently_failed_ns();
        v.config
            .as_ref()
            .is_some_and(|c| v.registrations.all_learnt(c, epoch, (wall_ns(), failed)))
    }

    /// Node `id` as the view last read has it: (the view's epoch, the member, and the
    /// registration of this process, `Self::registration`, in force when it was read). A
    /// view read before this process registered again (its lease had lapsed) may show it
    /// joining as it was before it failed.
    pub fn member_in_view(&self, id: u16) -> Option<(u64, Member, u64)> {
        let v = self.shared.view.lock().expect("membership view lock");
        let c = v.config.as_ref()?;
        let m = c.nodes.iter().find(|m| m.id == id)?.clone();
        Some((c.epoch, m, v.registration))
    }

    /// The nodes that came back whose pause this node's fence ended early, every node having
    /// said it knows (`Fence::settle_join_by`), each with the join (`joined_ns`) it came back
    /// in: the balancer holds them no longer in that join (a later one is held anew).
    pub fn settled_comebacks(&self) -> Vec<(u16, u64)> {
        let seen = self.shared.came_back.lock().expect("came-back lock");
        let now = mono_ns();
        seen.iter()
            .filter(|b| b.settled && now >= b.ends_ns)
            .map(|b| (b.node, b.joined_ns))
            .collect()
    }

    /// Whether this node may write now (it is `up` and its lease holds).
    pub fn may_write(&self) -> bool {
        self.shared.fence.lease_until() > mono_ns()
    }

    /// This node's state in the configuration last read, as this process: `failed` while the
    /// configuration still names an earlier process of this node.
    pub fn state(&self, id: u16) -> Option<NodeState> {
        let me = self.shared.incarnation;
        self.view().config.and_then(|c| c.own_state(id, me))
    }

    /// Say that this node holds its copies again (it caught up while `joining`): its
    /// registration says `ready`, and the next monitor step makes it `up`.
    /// `joined_ns`: the join it caught up for (the member's `joined_ns` in the view that
    /// showed it joining); membership makes it up only in that join.
    pub fn set_ready(
        &self,
        id: u16,
        registered: u64,
        joined_ns: u64,
    ) -> Result<bool, MembershipError> {
        self.shared.ready_for.store(joined_ns, Ordering::SeqCst);
        self.shared.ready.store(registered + 1, Ordering::SeqCst);
        self.put_own_record(id)?;
        Ok(self.shared.is_ready())
    }

    /// Which registration of this process is in force ([`Self::set_ready`] takes the one a
    /// catch-up began in).
    pub fn registration(&self) -> u64 {
        self.shared.registered.load(Ordering::SeqCst)
    }

    /// Say that this node filled the moved copies `filled` (partition, chain position) it
    /// holds: the next monitor step makes them full.
    pub fn set_filled(&self, id: u16, filled: &[(u16, u8)]) -> Result<(), MembershipError> {
        {
            let mut f = self.shared.filled.lock().expect("filled lock");
            for c in filled {
                if !f.contains(c) {
                    f.push(*c);
                }
            }
        }
        self.put_own_record(id)
    }

    /// Say that this node handed over every entry of the migrating index partitions `handed`
    /// (partition, the migration's `since_ns`), in one write of its registration: each
    /// migration ends a settle time after the next monitor step sees it.
    pub fn set_handed(&self, id: u16, handed: &[(u16, u64)]) -> Result<(), MembershipError> {
        let migrating: Vec<(u16, u64)> = self.view().config.map_or(Vec::new(), |c| {
            c.index_chains
                .iter()
                .filter(|ch| ch.migrating)
                .map(|ch| (ch.partition, ch.since_ns))
                .collect()
        });
        {
            let mut h = self.shared.handed.lock().expect("handed lock");
            // Only what some migration still waits for (the record stays short).
            h.retain(|m| migrating.contains(m));
            for m in handed {
                if !h.contains(m) {
                    h.push(*m);
                }
            }
        }
        self.put_own_record(id)
    }

    /// Reserve index slots for migrating `partition` to the nodes `to` (chain order), each
    /// the lowest free slot of the `slots` every node has: one compare-and-put of the next
    /// epoch (tried again if another change came first). `id`: this node, the starter.
    /// Returns the slots reserved and the reservation's time, which names it; the caller
    /// writes them pending, then calls [`Self::confirm_migrations`].
    pub fn reserve_migration(
        &self,
        id: u16,
        partition: u16,
        to: &[u16],
        slots: u16,
        settle_ns: u64,
    ) -> Result<(Vec<SlotCopy>, u64), StartMigrationError> {
        let (mut got, at) =
            self.reserve_migrations(id, &[(partition, to.to_vec())], slots, settle_ns)?;
        Ok((got.pop().expect("one reserved").1, at))
    }

    /// [`Self::reserve_migration`] for many partitions in one epoch (the balancer's batch).
    /// A partition that cannot be reserved now (no free slot, migrating already, a node not
    /// up) is left out; an error only if none could be.
    pub fn reserve_migrations(
        &self,
        id: u16,
        plan: &[(u16, Vec<u16>)],
        slots: u16,
        settle_ns: u64,
    ) -> Result<(Vec<Reserved>, u64), StartMigrationError> {
        assert!(!plan.is_empty(), "a batch of nothing");
        self.change_config(|c, now| {
            let (next, got) = c.reserve_batch(plan, (id, now), slots, settle_ns)?;
            Ok((next, (got, now)))
        })
    }

    /// As [`Self::reserve_migrations`] for the migrations the balancer plans
    /// ([`Configuration::plan_balance`]) on the configuration in force as the compare-and-put
    /// finds it (not on this node's view, which may be older), if this node is the lowest
    /// up one there. `Ok(None)`: nothing to migrate now, and why.
    /// `settled`: nodes up again whose pause this node's fence has seen end
    /// ([`Configuration::plan_balance_settled`]).
    pub fn reserve_balance(
        &self,
        id: u16,
        set: &ReplicaSet,
        replace_after_ns: u64,
        settled: &[(u16, u64)],
    ) -> Result<Result<(Vec<Reserved>, u64), String>, StartMigrationError> {
        let slots = set.index_slots();
        let settle_ns = set.join_settle_ns();
        self.change_config(|c, now| {
            if c.balancer() != Some(id) {
                return Err(MigrationError::NotBalancer(id));
            }
            match c.plan_balance_settled(set, now, replace_after_ns, settled) {
                Ok(balance::Balance::Migrate(plan)) => {
                    let (next, got) = c.reserve_batch(&plan, (id, now), slots, settle_ns)?;
                    Ok((next, Ok((got, now))))
                }
                // Nothing to write: the same configuration again would be a new revision
                // for nothing, so say why through the error path.
                Ok(balance::Balance::Balanced) => Err(MigrationError::Idle("balanced".into())),
                Ok(balance::Balance::Wait(why)) => {
                    Err(MigrationError::Idle(format!("waiting: {why}")))
                }
                Err(e) => Err(MigrationError::Idle(format!("no plan: {e}"))),
            }
        })
        .or_else(|e| match e {
            StartMigrationError::Refused(MigrationError::Idle(why)) => Ok(Err(why)),
            e => Err(e),
        })
    }

    /// Start the migrations reserved by [`Self::reserve_migrations`] (`reserved_ns` names
    /// them), whose slots now hold pending words, in one epoch. One that cannot start (a node
    /// of its chain is no longer up) is given up, its slots retired. Returns the epoch and
    /// the partitions that started.
    pub fn confirm_migrations(
        &self,
        id: u16,
        reserved: &[Reserved],
        reserved_ns: u64,
    ) -> Result<(u64, Vec<u16>), StartMigrationError> {
        self.change_config(|c, now| {
            let mut next = c.clone();
            let mut started = Vec::new();
            let mut refused = None;
            for (q, copies) in reserved {
                match next.confirm_migration(*q, copies, (id, reserved_ns), now) {
                    Ok(n) => {
                        next = n;
                        started.push(*q);
                    }
                    Err(e) => {
                        if let Ok(n) = next.cancel_migration(*q, copies, (id, reserved_ns), now) {
                            next = n;
                        }
                        refused.get_or_insert(e);
                    }
                }
            }
            if started.is_empty() && next.index_chains == c.index_chains {
                return Err(refused.expect("a refusal for every partition"));
            }
            next.epoch = c.epoch + 1;
            if started.is_empty() {
                // Nothing started, but the reservations are given up: say why all the same.
                tracing::warn!(?refused, "no reserved migration could start");
            }
            let epoch = next.epoch;
            Ok((next, (epoch, started)))
        })
    }

    /// Give up the reservations [`Self::reserve_migrations`] made (named by `reserved_ns`):
    /// their slots are retired for the settle time.
    pub fn cancel_migrations(
        &self,
        id: u16,
        reserved: &[Reserved],
        reserved_ns: u64,
    ) -> Result<(), StartMigrationError> {
        self.change_config(|c, now| {
            let mut next = c.clone();
            for (q, copies) in reserved {
                // One already gone (its starter was taken for failed) has nothing to give up.
                if let Ok(n) = next.cancel_migration(*q, copies, (id, reserved_ns), now) {
                    next = n;
                }
            }
            if next.index_chains == c.index_chains {
                return Err(MigrationError::Idle("nothing to give up".into()));
            }
            next.epoch = c.epoch + 1;
            Ok((next, ()))
        })
        .or_else(|e| match e {
            StartMigrationError::Refused(MigrationError::Idle(_)) => Ok(()),
            e => Err(e),
        })
    }

    /// Put the configuration `change` makes of the one in force, by compare-and-put, tried
    /// again when another change came first.
    fn change_config<T>(
        &self,
        change: impl Fn(&Configuration, u64) -> Result<(Configuration, T), MigrationError>,
    ) -> Result<T, StartMigrationError> {
        let out = change_config_cached(&self.etcd, &self.keys, &self.shared.config_cache, change)?;
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
        Ok(out)
    }

    fn put_own_record(&self, id: u16) -> Result<(), MembershipError> {
        put_own(&self.etcd, &self.keys, id, &self.shared, None, None)?;
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
        Ok(())
    }
}

impl Monitor {
    /// Leave membership at once, as a node stopping does: the monitor stops (it neither
    /// refreshes the lease nor registers again), this node stops writing, and the lease is
    /// revoked, so that the others declare the node failed at their next step instead of a
    /// TTL later. The process should exit soon after (`nessie leave`).
    pub fn step_down(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.stepped_down.store(true, Ordering::SeqCst);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
        self.shared.fence.set_lease_until(0);
        let _ = self
            .etcd
            .revoke(LeaseId(self.shared.lease.load(Ordering::SeqCst)));
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        let lease = LeaseId(self.shared.lease.load(Ordering::Relaxed));
        // Revoking ends the lease at once: stop writing first.
        self.shared.fence.set_lease_until(0);
        let _ = self.etcd.revoke(lease);
    }
}

/// Step the configuration and feed it into the fence: failed and joining nodes gone, this
/// node writing only while `up`, its view fresh for a TTL from the read. The state is settled
/// before the fence is opened, so a node restarted after being declared failed is never
/// unfenced, not even between its registration and its first read.
fn read_configuration(
    etcd: &Etcd,
    keys: &Keys,
    id: u16,
    shared: &Shared,
) -> Result<(), MembershipError> {
    let sent = mono_ns();
    if sent >= shared.lease_clock_ns.load(Ordering::SeqCst) {
        // Its lease may have lapsed: the others may have stopped waiting for this process's
        // reads in the old roles (rule 10c). Before this read can freshen its view again.
        shared.fence.forget_old_roles();
    }
    // The registration this read is made under (a view read before a new one may show this
    // node as it was before its lease lapsed: `Monitor::member_in_view`).
    let registered = shared.registered.load(Ordering::SeqCst);
    let (c, registrations) = step(etcd, keys, &shared.policy, &shared.config_cache)?;
    let (mut say, mut say_reads_new) = (None, None);
    if let Some(c) = c {
        if let Some(hook) = &shared.on_config {
            hook(&c);
        }
        let me = shared.incarnation;
        // The monotonic clock just before the wall clock: a pause between the two readings
        // then places a named instant early here, which is the safe side (`Fence::set_cut_over`).
        let mono_at_wall = mono_ns();
        apply_clocked(
            &c,
            (id, me),
            &shared.fence,
            (wall_ns(), mono_at_wall),
            shared.policy.clock_margin_ns,
        );
        shared
            .up
            .store(c.own_state(id, me) == Some(NodeState::Up), Ordering::SeqCst);
        // Say the fence applied this epoch while some node waits for every node to know of
        // a change (`Registrations::all_learnt`): a put per node per epoch, only then, and
        // again at every read until one succeeds.
        let (now, recent) = (wall_ns(), shared.recently_failed_ns());
        let wants = c.wants_acks(now, recent, shared.moved_settle_ns());
        if wants && shared.seen.load(Ordering::SeqCst) < c.epoch {
            say = Some(c.epoch);
        }
        let mono = mono_ns();
        if wants {
            // Rule 10c: say as of which epoch this node reads every full moved copy in the
            // new roles (again at every read until a put succeeds).
            let e = moved_settle::reads_new_epoch(
                &c,
                &shared.fence,
                mono,
                shared.policy.join_settle_ns,
            );
            say_reads_new = e.filter(|&e| shared.reads_new.load(Ordering::SeqCst) < e);
        }
        settle_comebacks(&c, &registrations, shared, (now, recent));
        settle_moves(&c, &registrations, shared, (now, recent, mono));
        let mut v = shared.view.lock().expect("membership view lock");
        v.config = Some(c);
        v.registrations = registrations;
        v.registration = registered;
    }
    shared
        .view_clock_ns
        .store(sent + shared.lease_ttl_ns, Ordering::SeqCst);
    shared.read_clock_ns.store(
        sent + shared.lease_ttl_ns / READ_VIEW_PARTS,
        Ordering::SeqCst,
    );
    shared.refresh_fence();
    // After the fence is refreshed: a slow put must not hold it up.
    if say.is_some() || say_reads_new.is_some() {
        if let Err(e) = put_own(etcd, keys, id, shared, say, say_reads_new) {
            // Tried again at the next read; until then whoever waits on it waits longer.
            tracing::debug!(error = %e, "membership: could not say which epoch was applied");
        }
    }
    Ok(())
}

/// End the pause of each node that came back once every node that may act said it knows
/// (`Registrations::all_learnt`, from the first epoch this monitor saw it up in) and an
/// operation's time more has passed: operations in the old roles have all ended by then, as
/// they have a settle time (a TTL) and an operation after it without word from the nodes.
fn settle_comebacks(
    c: &Configuration,
    registrations: &Registrations,
    shared: &Shared,
    (now_ns, recent_ns): (u64, u64),
) {
    let mut seen = shared.came_back.lock().expect("came-back lock");
    let back = c.came_back(now_ns, recent_ns);
    let same = |b: &CameBack, m: &Member| {
        (b.node, b.incarnation, b.joined_ns) == (m.id, m.incarnation, m.joined_ns)
    };
    seen.retain(|b| b.followed(c, &back));
    for m in back {
        if !seen.iter().any(|b| same(b, m)) {
            seen.push(CameBack {
                node: m.id,
                incarnation: m.incarnation,
                joined_ns: m.joined_ns,
                epoch: c.epoch,
                settled: false,
                ends_ns: 0,
            });
        }
    }
    let failed = shared.recently_failed_ns();
    for b in seen.iter_mut() {
        if b.settled || !registrations.all_learnt(c, b.epoch, (now_ns, failed)) {
            continue;
        }
        b.settled = true;
        let end = mono_ns().saturating_add(shared.policy.op_ns);
        b.ends_ns = end;
        shared
            .fence
            .settle_join_by(b.node, b.joined_ns, shared.policy.join_settle_ns, end);
        tracing::info!(
            node = b.node,
            epoch = b.epoch,
            "every node knows the node is up again: its pause ends an operation's time from now"
        );
    }
}

/// End the pauses after moved copies became full as every node says it may (rule 10c,
/// `moved_settle`), and say so in the log.
fn settle_moves(
    c: &Configuration,
    registrations: &Registrations,
    shared: &Shared,
    (now_ns, failed_ns, mono): (u64, u64, u64),
) {
    let mut seen = shared.moves_seen.lock().expect("moves-seen lock");
    let (reads, writes) = moved_settle::settle_moves(
        c,
        registrations,
        &shared.fence,
        &mut seen,
        (now_ns, failed_ns, mono),
        shared.policy.op_ns,
    );
    for (partition, copy) in reads {
        tracing::info!(
            partition,
            copy,
            "every node knows the moved copy is full: reads take the new roles an operation's time from now"
        );
    }
    for (partition, copy) in writes {
        tracing::info!(
            partition,
            copy,
            "every node reads the moved copy in the new roles: changes stop waiting an operation's time from now"
        );
    }
}

/// How long one watch request lasts before it is made again (from the revision it reached).
const WATCH_SPAN: Duration = Duration::from_secs(1);

/// The watcher thread: watches every key of the cluster (registrations, the configuration) and
/// wakes the monitor on any change, so that a lapsed lease is declared failed, and a new epoch
/// learnt, at once rather than at the next poll (which stays, in case a watch misses something:
/// its revision compacted, etcd restarted).
fn watch(etcd: Etcd, prefix: &str, shared: &Shared, monitor: &std::thread::Thread) {
    let mut after = 0;
    while !shared.stop.load(Ordering::Relaxed) {
        let woke = |_| {
            monitor.unpark();
            !shared.stop.load(Ordering::Relaxed)
        };
        match etcd.watch_prefix(prefix, after, WATCH_SPAN, woke) {
            Ok(rev) => after = rev,
            Err(e) => {
                tracing::debug!(error = %e, "membership: watch failed; polling until it works again");
                after = 0;
                std::thread::sleep(WATCH_SPAN);
            }
        }
    }
}

/// Put node `id`'s registration under a new lease. Returns it and the TTL etcd granted (it
/// raises TTLs below its minimum).
fn register(
    etcd: &Etcd,
    keys: &Keys,
    id: u16,
    incarnation: u64,
    ttl_s: u64,
    ready: bool,
) -> Result<(LeaseId, u64), MembershipError> {
    let lease = etcd.grant(ttl_s)?;
    let record = Record {
        ready,
        filled: &[],
        handed: &[],
        seen: 0,
        reads_new: 0,
        ready_for: 0,
    };
    put_record(etcd, keys, id, incarnation, lease, &record)?;
    // The granted TTL is what a keep-alive right now reports.
    let granted = u64::try_from(etcd.keep_alive(lease)?).unwrap_or(0);
    Ok((lease, granted))
}

/// What a registration says besides who it is.
struct Record<'a> {
    ready: bool,
    filled: &'a [(u16, u8)],
    handed: &'a [(u16, u64)],
    /// The epoch the node's fence applied (0: not said).
    seen: u64,
    /// The epoch as of which it reads every full moved copy in the new roles (0: not said).
    reads_new: u64,
    /// The join `ready` is for (0: not said).
    ready_for: u64,
}

/// Put this node's registration record as `shared` says it now, under its lease.
/// `say_seen`: say that the fence applied this epoch too; `say_reads_new`: that it reads
/// every full moved copy in the new roles as of this epoch (each remembered only once put).
fn put_own(
    etcd: &Etcd,
    keys: &Keys,
    id: u16,
    shared: &Shared,
    say_seen: Option<u64>,
    say_reads_new: Option<u64>,
) -> Result<(), MembershipError> {
    let _one_at_a_time = shared.record_lock.lock().expect("record lock");
    let lease = LeaseId(shared.lease.load(Ordering::Relaxed));
    let filled = shared.filled.lock().expect("filled lock").clone();
    let handed = shared.handed.lock().expect("handed lock").clone();
    let record = Record {
        ready: shared.is_ready(),
        filled: &filled,
        handed: &handed,
        seen: shared
            .seen
            .load(Ordering::SeqCst)
            .max(say_seen.unwrap_or(0)),
        reads_new: shared
            .reads_new
            .load(Ordering::SeqCst)
            .max(say_reads_new.unwrap_or(0)),
        ready_for: shared.ready_for.load(Ordering::SeqCst),
    };
    put_record(etcd, keys, id, shared.incarnation, lease, &record)?;
    // Said: later puts (of any thread) say it too.
    shared.seen.fetch_max(record.seen, Ordering::SeqCst);
    shared
        .reads_new
        .fetch_max(record.reads_new, Ordering::SeqCst);
    Ok(())
}

/// Put node `id`'s registration record (process `incarnation`) under `lease`.
fn put_record(
    etcd: &Etcd,
    keys: &Keys,
    id: u16,
    incarnation: u64,
    lease: LeaseId,
    r: &Record,
) -> Result<(), MembershipError> {
    let mut record = serde_json::json!({
        "id": id,
        "pid": std::process::id(),
        "incarnation": incarnation,
        "ready": r.ready,
    });
    if !r.filled.is_empty() {
        record["filled"] = serde_json::json!(r.filled);
    }
    if !r.handed.is_empty() {
        record["handed"] = serde_json::json!(r.handed);
    }
    if r.seen != 0 {
        record["seen"] = serde_json::json!(r.seen);
    }
    if r.reads_new != 0 {
        record["reads_new"] = serde_json::json!(r.reads_new);
    }
    if r.ready && r.ready_for != 0 {
        record["ready_for"] = serde_json::json!(r.ready_for);
    }
    etcd.put(&keys.member(id), record.to_string().as_bytes(), Some(lease))?;
    Ok(())
}

/// The monitor thread: refresh the lease every TTL/3, step the configuration every TTL/6, and
/// step at once when the watcher saw a change. A view read at time t is fresh for writing until
/// t + TTL (`Shared::view_clock_ns`), so after each read more than two thirds of a TTL remain,
/// more than a write attempt (validation: 2 TTL > 3 expiry), and for reading until t + TTL/2
/// (`Shared::read_clock_ns`): three reads fall in that window.
fn run(etcd: Etcd, keys: Keys, id: u16, ttl_s: u64, shared: &Shared) {
    let tick = Duration::from_millis(ttl_s * 1000 / 6).max(Duration::from_millis(100));
    let mut ticks = 0u64;
    let mut steps_told = 0;
    while !shared.stop.load(Ordering::Relaxed) {
        let (steps, lag) = nessie_fabric::wall_clock_steps();
        if steps > steps_told {
            steps_told = steps;
            tracing::warn!(
                id,
                behind_ms = lag / 1_000_000,
                "the system wall clock stepped back; this node keeps its own time (expiry stamps, \
                 epoch times) {} ms ahead of it until it restarts",
                lag / 1_000_000
            );
        }
        let mut result = Ok(());
        if ticks.is_multiple_of(2) {
            result = keep_registered(&etcd, &keys, id, ttl_s, shared);
        }
        if result.is_ok() {
            result = read_configuration(&etcd, &keys, id, shared);
        }
        let err = result.err().map(|e| e.to_string());
        if let Some(e) = &err {
            tracing::warn!(error = %e, "membership: etcd exchange failed; serving in the known epoch");
        }
        shared.view.lock().expect("membership view lock").etcd_error = err;
        ticks += 1;
        std::thread::park_timeout(tick);
    }
}

/// Feed configuration `c` into node `id`'s fence: each node's role (a failed node is gone: its
/// writers are dead, its copies left; a joining one receives its copies; an up one is full),
/// when a node that came back became full (every node pauses the partitions it holds copies of
/// for a while after that, whether or not it saw the change: `Fence::set_full_since`; the
/// epoch's time is read at `now_wall_ns` on this node's wall clock, with the clock margin),
/// where moved copies are and whether they are still receiving,
/// when its incarnation joined (entries of earlier ones are abandoned), and this node writes
/// only while it is `up` (then until `lease_until`). `(id, incarnation)`: this node and this
/// process's incarnation number; a configuration that names an earlier process of this node
/// says this one is not a member yet: it is failed here (its memory is not the member's).
///
/// For tests: it reads the monotonic clock after the caller read `now_wall_ns`, which places
/// a named read cut-over's end of reads late by whatever passed between (the unsafe side,
/// `Fence::set_cut_over`); membership itself uses [`apply_clocked`].
pub fn apply(
    c: &Configuration,
    (id, incarnation): (u16, u64),
    fence: &Fence,
    now_wall_ns: u64,
    clock_margin_ns: u64,
) {
    let mono = nessie_fabric::monotonic_ns();
    apply_clocked(
        c,
        (id, incarnation),
        fence,
        (now_wall_ns, mono),
        clock_margin_ns,
    );
}

/// [`apply`], with the monotonic clock's reading taken just before `now_wall_ns` was.
pub fn apply_clocked(
    c: &Configuration,
    (id, incarnation): (u16, u64),
    fence: &Fence,
    (now_wall_ns, mono_at_wall_ns): (u64, u64),
    clock_margin_ns: u64,
) {
    for m in &c.nodes {
        let state = match m.id == id {
            true => c.own_state(id, incarnation).unwrap_or(m.state),
            false => m.state,
        };
        fence.set_incarnation(m.id, m.joined_ns);
        // Named on a clock that may be the margin away from ours (`Fence::cut_over`).
        fence.set_cut_over(
            m.id,
            m.cut_over_ns,
            (now_wall_ns, mono_at_wall_ns),
            clock_margin_ns,
        );
        fence.set_role(
            m.id,
            match state {
                NodeState::Up => NodeRole::Full,
                NodeState::Joining => NodeRole::Receiving,
                NodeState::Failed => NodeRole::Gone,
            },
        );
        // A standby node, until it is up: nobody wrote its tables or read its copies. After
        // the role: a node made up must not look claimable while it still looks receiving.
        fence.set_never_up(m.id, c.standby.contains(&m.id));
        if m.state == NodeState::Up && m.joined_ns != 0 {
            // Up since `since_ns` by the writer's clock, which may be ahead of ours by the
            // margin: count from that much later.
            let ago = now_wall_ns.saturating_sub(m.since_ns.saturating_add(clock_margin_ns));
            fence.set_full_since(m.id, ago);
        }
    }
    for m in &c.moves {
        let at = MovedCopy {
            node: m.node,
            slot: m.slot,
            receiving: m.receiving,
        };
        match m.at_start && !m.receiving {
            true => fence.place_copy_at_start(m.partition, m.copy, at),
            false => fence.move_copy(m.partition, m.copy, Some(at)),
        }
        if !m.receiving && m.full_since_ns != 0 {
            // From the latest it can have been on this clock, as for a rejoin.
            let ago = now_wall_ns.saturating_sub(m.full_since_ns.saturating_add(clock_margin_ns));
            fence.set_moved_full_since(m.partition, m.copy, ago, m.full_since_ns);
        }
    }
    for ch in c.index_chains.iter().filter(|ch| ch.prepared) {
        let copies = ch.fence_copies();
        match ch.migrating {
            true => fence.start_migration(ch.partition, &copies),
            false => fence.finish_migration(ch.partition, &copies),
        }
    }
    // A migration the fence saw start and the configuration no longer lists as migrating is
    // over (it ended, or was given up, in epochs this node missed): after the chains above,
    // so that its partition's operations go to the chain in force from here on.
    if !balance::mutation::keeps_missed_migrations() {
        let listed: std::collections::HashSet<u16> = c
            .index_chains
            .iter()
            .filter(|ch| ch.prepared && ch.migrating)
            .map(|ch| ch.partition)
            .collect();
        fence.forget_migrations_except(|q| listed.contains(&q));
    }
    if c.own_state(id, incarnation) != Some(NodeState::Up) {
        fence.set_lease_until(0);
    }
}

/// Refresh the lease and the lease clock; if the lease lapsed (this process was stopped, or
/// etcd unreachable, for a TTL), fence the node (its peers may declare it failed and complete
/// its writes) and register again under a new one.
fn keep_registered(
    etcd: &Etcd,
    keys: &Keys,
    id: u16,
    ttl_s: u64,
    shared: &Shared,
) -> Result<(), MembershipError> {
    let lease = LeaseId(shared.lease.load(Ordering::Relaxed));
    let sent = mono_ns();
    let left = etcd.keep_alive(lease)?;
    if left > 0 {
        shared
            .lease_clock_ns
            .store(sent + left as u64 * 1_000_000_000, Ordering::SeqCst);
        shared.refresh_fence();
        return Ok(());
    }
    shared.lease_clock_ns.store(0, Ordering::SeqCst);
    shared.refresh_fence();
    let sent = mono_ns();
    // Declared failed by now, most likely: it must catch up again before it is ready (and a
    // catch-up begun before this does not count: `Monitor::set_ready`).
    shared.registered.fetch_add(1, Ordering::SeqCst);
    shared.ready.store(0, Ordering::SeqCst);
    // And fill again whatever moved copies it had filled (handed-over partitions stay so:
    // a handover is done in memory every node reads, not in this node's).
    shared.filled.lock().expect("filled lock").clear();
    if shared.stop.load(Ordering::SeqCst) {
        // Stepped down (or stopping): never registered again.
        return Ok(());
    }
    let (lease, granted) = {
        // The new record says no epoch: neither does this process until it says one again.
        let _one_at_a_time = shared.record_lock.lock().expect("record lock");
        let got = register(etcd, keys, id, shared.incarnation, ttl_s, false)?;
        shared.seen.store(0, Ordering::SeqCst);
        shared.reads_new.store(0, Ordering::SeqCst);
        // Others may have stopped waiting for this process's reads in the old roles while it
        // had no lease (rule 10c): it takes them no more.
        shared.fence.forget_old_roles();
        got
    };
    shared.lease.store(lease.0, Ordering::Relaxed);
    // A lease of our own again, but the configuration (failed, then joining) keeps us fenced.
    shared
        .lease_clock_ns
        .store(sent + granted * 1_000_000_000, Ordering::SeqCst);
    tracing::warn!(id, "membership: lease had lapsed; fenced, registered again");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(c: &Configuration) -> Vec<NodeState> {
        c.nodes.iter().map(|m| m.state).collect()
    }

    fn reg(present: &[u16], ready: &[u16]) -> Registrations {
        Registrations {
            present: present.to_vec(),
            ready: ready.to_vec(),
            filled: vec![],
            handed: vec![],
            incarnations: vec![],
            seen: vec![],
            ready_for: vec![],
            reads_new: vec![],
        }
    }

    /// Every node that may act (up or joining) must have said, as the process the
    /// configuration names, that its fence applied the epoch; failed nodes are not asked,
    /// but one failed less than the settle time ago makes everyone wait that out.
    /// `ACKS_FROM_ANY` (one node's word taken for all) is caught.
    #[test]
    fn every_acting_node_must_have_learnt_an_epoch() {
        // Now 1,000; a node failed less than 100 ago may still act.
        const AT: (u64, u64) = (1_000, 100);
        let incarnations = [(0, 10), (1, 11), (2, 12), (3, 13)];
        let all = Registrations {
            present: vec![0, 1, 2, 3],
            incarnations: incarnations.to_vec(),
            ..Registrations::default()
        };
        let mut c = Configuration::initial(0..4, &all);
        c.epoch = 7;
        c.nodes[2].state = NodeState::Joining;
        c.nodes[3].state = NodeState::Failed;
        let seen = |seen: &[(u16, u64)]| Registrations {
            seen: seen.to_vec(),
            ..all.clone()
        };
        for mutated in [false, true] {
            balance::mutation::ACKS_FROM_ANY.with(|m| m.set(mutated));
            let r = seen(&[(0, 7), (1, 9), (2, 7)]);
            assert!(r.all_learnt(&c, 7, AT), "every acting node at 7 or later");
            let caught_8 = !r.all_learnt(&c, 8, AT); // nodes 0 and 2 have not learnt epoch 8
                                                     // The failed node is not asked; the joining one is.
            let lagging = seen(&[(0, 7), (1, 7), (3, 7)]);
            let caught = !lagging.all_learnt(&c, 7, AT);
            // Another process of node 1 registered since: its word is not the member's.
            let restarted = Registrations {
                incarnations: vec![(0, 10), (1, 99), (2, 12), (3, 13)],
                ..seen(&[(0, 7), (1, 7), (2, 7)])
            };
            let caught_restart = !restarted.all_learnt(&c, 7, AT);
            // A node with no registration (its lease lapsed) has said nothing.
            let gone = Registrations {
                incarnations: vec![(0, 10), (2, 12)],
                present: vec![0, 2],
                ..seen(&[(0, 7), (2, 7)])
            };
            let caught_gone = !gone.all_learnt(&c, 7, AT);
            // A node failed just now may still act unasked: wait the settle time.
            let mut just_failed = c.clone();
            just_failed.nodes[3].since_ns = 950;
            let caught_failed =
                !r.all_learnt(&just_failed, 7, AT) && r.all_learnt(&just_failed, 7, (1_050, 100));
            balance::mutation::ACKS_FROM_ANY.with(|m| m.set(false));
            if mutated {
                assert!(!caught, "the mutation takes node 0's word for node 2's");
            } else {
                assert!(caught && caught_8 && caught_restart && caught_gone && caught_failed);
            }
        }
        assert!(
            !Registrations::default().all_learnt(&c, 1, AT),
            "nobody said anything"
        );
    }

    /// A settled comeback stays followed for as long as that incarnation stays up in that
    /// join, after it no longer counts as having come back: the balancer holds such a node
    /// longer than that, and a monitor that forgot it held the node again (nothing balanced
    /// for 3 s after a scale-out had finished). A comeback not yet settled, or a member that
    /// failed or joined again since, is dropped.
    #[test]
    fn a_settled_comeback_is_followed_while_its_node_stays_up() {
        let mut c = Configuration::initial(0..3, &Registrations::default());
        c.nodes[2].joined_ns = 500;
        c.nodes[2].incarnation = 77;
        let b = |settled| CameBack {
            node: 2,
            incarnation: 77,
            joined_ns: 500,
            epoch: 3,
            settled,
            ends_ns: 0,
        };
        let recent: Vec<&Member> = c.nodes.iter().filter(|m| m.id == 2).collect();
        assert!(b(false).followed(&c, &recent) && b(true).followed(&c, &recent));
        // No longer recent (`came_back` is empty): kept only once settled.
        for mutated in [false, true] {
            balance::mutation::COMEBACK_FORGOTTEN.with(|m| m.set(mutated));
            let kept = b(true).followed(&c, &[]);
            balance::mutation::COMEBACK_FORGOTTEN.with(|m| m.set(false));
            assert_eq!(kept, !mutated, "mutated: {mutated}");
        }
        assert!(!b(false).followed(&c, &[]), "never settled");
        let mut again = c.clone();
        again.nodes[2].joined_ns = 900;
        assert!(!b(true).followed(&again, &[]), "another join");
        let mut failed = c.clone();
        failed.nodes[2].state = NodeState::Failed;
        assert!(!b(true).followed(&failed, &[]), "failed since");
    }

    /// A failed node's duties go to the next up node after it, around the ring; none to a
    /// node that is not up, and every failed node has exactly one heir while any node is up.
    #[test]
    fn a_failed_nodes_duties_go_to_the_next_up_node() {
        let mut c = Configuration::initial(0..5, &Registrations::default());
        let set = |c: &mut Configuration, id: u16, s: NodeState| {
            c.nodes.iter_mut().find(|m| m.id == id).unwrap().state = s
        };
        assert!((0..5).all(|n| c.inherited_by(n).is_empty()));
        set(&mut c, 1, NodeState::Failed);
        set(&mut c, 2, NodeState::Joining);
        set(&mut c, 4, NodeState::Failed);
        assert_eq!(
            c.inherited_by(3),
            vec![1],
            "2 is joining: 3 is next up after 1"
        );
        assert_eq!(c.inherited_by(0), vec![4], "around the ring");
        assert!(c.inherited_by(2).is_empty() && c.inherited_by(1).is_empty());
        set(&mut c, 0, NodeState::Failed);
        assert_eq!(c.inherited_by(3), vec![0, 1, 4]);
        set(&mut c, 3, NodeState::Failed);
        assert!((0..5).all(|n| c.inherited_by(n).is_empty()), "nobody up");
    }

    /// A catch-up that began before the lease lapsed (and the node was registered again)
    /// does not make the new registration ready: the node was failed meanwhile and missed
    /// writes (found by review: a paused catch-up finishing late said ready).
    #[test]
    fn a_catch_up_from_an_earlier_registration_is_not_ready() {
        assert!(!ready_in(0, 0), "never caught up");
        assert!(
            ready_in(1, 0),
            "caught up in registration 0, still in force"
        );
        assert!(!ready_in(1, 1), "caught up in 0, registered again since");
        assert!(ready_in(2, 1));
    }

    #[test]
    fn successor_fails_lapsed_nodes_holds_them_then_lets_them_join_and_come_up_when_ready() {
        use NodeState::*;
        const HOLD: &Policy = &Policy {
            hold_ns: 1_000,
            clock_margin_ns: 0,
            replacing: None,
            migration_settle_ns: 0,
            migration_end_ns: 0,
            join_settle_ns: 0,
            op_ns: 0,
            fenced_before_epoch_1: false,
        };
        let c = Configuration::initial([0, 1, 2], &Registrations::default());
        assert_eq!(
            c.successor(&reg(&[0, 1, 2], &[]), 10, HOLD),
            None,
            "nothing changed"
        );
        let c2 = c.successor(&reg(&[0, 2], &[]), 10, HOLD).unwrap();
        assert_eq!((c2.epoch, states(&c2)), (2, vec![Up, Failed, Up]));
        assert_eq!(c2.nodes[1].since_ns, 10);
        assert_eq!(c2.successor(&reg(&[0, 2], &[]), 20, HOLD), None);
        assert_eq!(
            c2.successor(&reg(&[2, 1, 0], &[]), 500, HOLD),
            None,
            "failed for less than the hold time: it may not join yet"
        );
        let c3 = c2.successor(&reg(&[2, 1, 0], &[]), 1_010, HOLD).unwrap();
        assert_eq!((c3.epoch, states(&c3)), (3, vec![Up, Joining, Up]));
        assert_eq!(
            (c3.nodes[1].since_ns, c3.nodes[1].joined_ns),
            (1_010, 1_010)
        );
        assert_eq!(
            c3.successor(&reg(&[0, 1, 2], &[]), 1_020, HOLD),
            None,
            "not ready"
        );
        // Ready for an earlier join (it failed and joined again within one registration,
        // its catch-up then missing writes): not up on it.
        let stale = Registrations {
            ready_for: vec![(1, 999)],
            ..reg(&[0, 1, 2], &[1])
        };
        assert_eq!(
            c3.successor(&stale, 1_030, HOLD),
            None,
            "ready for another join"
        );
        let for_this = Registrations {
            ready_for: vec![(1, 1_010)],
            ..reg(&[0, 1, 2], &[1])
        };
        assert_eq!(
            states(&c3.successor(&for_this, 1_030, HOLD).unwrap()),
            vec![Up, Up, Up]
        );
        let c4 = c3.successor(&reg(&[0, 1, 2], &[1]), 1_030, HOLD).unwrap();
        assert_eq!((c4.epoch, states(&c4)), (4, vec![Up, Up, Up]));
        assert_eq!(c4.nodes[1].joined_ns, 1_010, "the incarnation is kept");
        let c5 = c4.successor(&reg(&[0, 2], &[]), 2_000, HOLD).unwrap();
        assert_eq!((c5.epoch, states(&c5)), (5, vec![Up, Failed, Up]));
        assert_eq!(c5.state(1), Some(Failed));
        assert_eq!(c5.state(9), None);
        let c6 = c3.successor(&reg(&[0, 2], &[]), 1_040, HOLD).unwrap();
        assert_eq!(
            states(&c6),
            vec![Up, Failed, Up],
            "a joining node that lapses failed"
        );
    }

    #[test]
    fn applying_a_configuration_sets_roles_incarnations_and_fences_a_node_not_up() {
        use NodeState::*;
        let m = |id, state, joined_ns| Member {
            id,
            state,
            since_ns: 5,
            joined_ns,
            incarnation: 0,
            cut_over_ns: 0,
            stopped_ns: 0,
        };
        let c = Configuration {
            epoch: 3,
            nodes: vec![m(0, Up, 0), m(1, Failed, 0), m(2, Joining, 77)],
            moves: vec![],
            index_chains: vec![],
            retired_slots: vec![],
            leaving: vec![],
            standby: vec![],
        };
        let f = Fence::unfenced();
        apply(&c, (0, 0), &f, 10, 0);
        assert_eq!(f.role(0), NodeRole::Full);
        assert!(f.is_gone(1) && !f.is_gone(0));
        assert_eq!(
            f.role(2),
            NodeRole::Receiving,
            "a joining node receives its copies"
        );
        assert_eq!(f.incarnation(2), 77);
        assert!(f.may_act(1, 1), "node 0 is up: its lease clock rules");
        apply(&c, (2, 0), &f, 10, 0);
        assert!(!f.may_act(1, 1), "a joining node does not write");
        let mut up = c.clone();
        up.nodes[1].state = Up;
        up.nodes[2].state = Up;
        apply(&up, (0, 0), &f, 10, 0);
        assert!(!f.is_gone(1) && f.role(2) == NodeRole::Full, "up again");
        assert!(f.rejoined(2));
    }

    /// Bug 8 of review 39: a process restarted within its lease TTL puts its registration under
    /// a new lease before the old one lapsed, so the key never disappears. Its incarnation
    /// number does change: the member is declared failed, held, and joins as the new process.
    #[test]
    fn a_node_restarted_within_its_lease_is_failed_then_joins_as_the_new_process() {
        use NodeState::*;
        const HOLD: &Policy = &Policy {
            hold_ns: 1_000,
            clock_margin_ns: 0,
            replacing: None,
            migration_settle_ns: 0,
            migration_end_ns: 0,
            join_settle_ns: 0,
            op_ns: 0,
            fenced_before_epoch_1: false,
        };
        let reg = |incarnations: &[(u16, u64)], ready: &[u16]| Registrations {
            present: incarnations.iter().map(|&(n, _)| n).collect(),
            ready: ready.to_vec(),
            filled: vec![],
            handed: vec![],
            incarnations: incarnations.to_vec(),
            seen: vec![],
            ready_for: vec![],
            reads_new: vec![],
        };
        let first = reg(&[(0, 10), (1, 11), (2, 12)], &[]);
        let c = Configuration::initial([0, 1, 2], &first);
        assert_eq!(
            c.nodes[1].incarnation, 11,
            "epoch 1 names the processes registered"
        );
        assert_eq!(
            c.successor(&first, 5, HOLD),
            None,
            "the same processes: no change"
        );
        let restarted = reg(&[(0, 10), (1, 99), (2, 12)], &[]);
        let failed = c.successor(&restarted, 10, HOLD).unwrap();
        assert_eq!(states(&failed), vec![Up, Failed, Up]);
        assert_eq!(failed.own_state(1, 99), Some(Failed));
        assert_eq!(failed.successor(&restarted, 500, HOLD), None, "held");
        let joining = failed.successor(&restarted, 1_010, HOLD).unwrap();
        assert_eq!(states(&joining), vec![Up, Joining, Up]);
        assert_eq!(joining.nodes[1].incarnation, 99);
        assert_eq!(joining.nodes[1].joined_ns, 1_010);
        assert_eq!(joining.own_state(1, 99), Some(Joining));
        assert_eq!(
            joining.own_state(1, 11),
            Some(Failed),
            "the dead process is no member"
        );
        // Restarted again while joining: failed again.
        let again = reg(&[(0, 10), (1, 100), (2, 12)], &[1]);
        assert_eq!(
            states(&joining.successor(&again, 1_020, HOLD).unwrap()),
            vec![Up, Failed, Up]
        );
        let up = joining
            .successor(&reg(&[(0, 10), (1, 99), (2, 12)], &[1]), 1_030, HOLD)
            .unwrap();
        assert_eq!(states(&up), vec![Up, Up, Up]);
        // A configuration written before incarnations were takes the process registered now.
        let legacy = Configuration::initial([0, 1, 2], &Registrations::default());
        let adopted = legacy.successor(&first, 5, HOLD).unwrap();
        assert_eq!(states(&adopted), vec![Up, Up, Up]);
        assert_eq!(adopted.nodes[1].incarnation, 11);
        // Applied by the new process, the epoch that still names the old one fences it and
        // says its own copies are not the member's.
        let f = Fence::unfenced();
        apply(&c, (1, 99), &f, 10, 0);
        assert_eq!(f.role(1), NodeRole::Gone);
        assert!(!f.may_act(1, 1));
        let f = Fence::unfenced();
        apply(&c, (1, 11), &f, 10, 0);
        assert_eq!(
            f.role(1),
            NodeRole::Full,
            "the process the epoch names is up"
        );
    }

    /// A node that came back is paused after on every node by what the configuration says, not
    /// only on those whose fence saw it change role: a fence made after the epoch that made it
    /// up (a process started meanwhile) pauses too, counting from the epoch's time less the
    /// clock margin; an epoch long past pauses nothing.
    #[test]
    fn a_fence_that_missed_the_rejoin_pauses_by_the_configuration() {
        use NodeState::*;
        const S: u64 = 1_000_000_000;
        let now = wall_ns();
        let m = |id, state, since_ns, joined_ns| Member {
            id,
            state,
            since_ns,
            joined_ns,
            incarnation: 0,
            cut_over_ns: 0,
            stopped_ns: 0,
        };
        let rejoined = |since_ns| Configuration {
            epoch: 4,
            nodes: vec![
                m(0, Up, 0, 0),
                m(1, Up, since_ns, since_ns - S),
                m(2, Up, 0, 0),
            ],
            moves: vec![],
            index_chains: vec![],
            retired_slots: vec![],
            leaving: vec![],
            standby: vec![],
        };
        let fresh = Fence::unfenced();
        apply(&rejoined(now - S), (2, 0), &fresh, now, S / 2);
        let mono = nessie_fabric::monotonic_ns();
        let paused_for = fresh.full_for_ns(1, mono).expect("node 1 came back");
        assert!(
            paused_for < S,
            "up 1 s ago by a clock up to 0.5 s ahead: full for at most 0.5 s here, not {paused_for}"
        );
        assert_eq!(fresh.full_for_ns(0, mono), None, "never left");
        let long_ago = Fence::unfenced();
        apply(&rejoined(now - 3600 * S), (2, 0), &long_ago, now, S / 2);
        let full_for = long_ago
            .full_for_ns(1, nessie_fabric::monotonic_ns())
            .unwrap();
        assert!(
            full_for > 3000 * S,
            "an old rejoin pauses nothing: {full_for}"
        );
    }

    /// Two copies of `nodes` partitions with `spare` spare slots each; failed nodes are held
    /// 10 ns and replaced after 100 ns.
    fn replacing(nodes: u16, spare: u8) -> (ReplicaSet, Policy) {
        let ite = nessie_store::IteLayout::new(20, 4, 7).unwrap();
        let set = ReplicaSet::new(2, nodes, ite, &nessie_protocols::ProtocolConfig::default())
            .unwrap()
            .with_spare_copies(spare)
            .unwrap();
        let policy = Policy {
            hold_ns: 10,
            clock_margin_ns: 0,
            migration_settle_ns: 0,
            migration_end_ns: 0,
            join_settle_ns: 0,
            op_ns: 0,
            replacing: Some(Replacing {
                after_ns: 100,
                set: set.clone(),
            }),
            fenced_before_epoch_1: false,
        };
        (set, policy)
    }

    #[test]
    fn a_node_failed_long_enough_has_its_copies_moved_then_filled_and_rejoins_without_them() {
        use NodeState::*;
        let (set, policy) = replacing(4, 1);
        let c = Configuration::initial([0, 1, 2, 3], &Registrations::default());
        let failed = c.successor(&reg(&[0, 2, 3], &[]), 1_000, &policy).unwrap();
        assert_eq!(states(&failed), vec![Up, Failed, Up, Up]);
        assert!(failed.moves.is_empty(), "not failed for long yet");
        assert_eq!(
            failed.successor(&reg(&[0, 2, 3], &[]), 1_050, &policy),
            None
        );
        let moved = failed
            .successor(&reg(&[0, 2, 3], &[]), 1_100, &policy)
            .unwrap();
        assert_eq!(moved.epoch, failed.epoch + 1);
        let mv = |partition, copy, node, receiving| CopyMove {
            partition,
            copy,
            node,
            slot: 2,
            receiving,
            at_start: false,
            full_since_ns: 0,
        };
        assert_eq!(moved.moves, vec![mv(0, 1, 2, true), mv(1, 0, 0, true)]);
        assert!(moved.copy_map(&set).held_by(1).is_empty());
        // Node 1 comes back: it joins, and its copies stay where they moved.
        let back = moved
            .successor(&reg(&[0, 1, 2, 3], &[]), 2_000, &policy)
            .unwrap();
        assert_eq!(states(&back), vec![Up, Joining, Up, Up]);
        assert_eq!(back.moves, moved.moves);
        assert!(back.copy_map(&set).held_by(1).is_empty());
        // Node 2 says it filled its copy: that one is full; node 0's is still receiving.
        let mut r = reg(&[0, 2, 3], &[]);
        r.filled = vec![(2, 0, 1), (3, 1, 0)];
        let filled = moved.successor(&r, 2_000, &policy).unwrap();
        let full = CopyMove {
            full_since_ns: 2_000,
            ..mv(0, 1, 2, false)
        };
        assert_eq!(filled.moves, vec![full, mv(1, 0, 0, true)]);
        // Every fence counts data reads in the old roles from then at the latest (rule 10a):
        // one that learns of it an hour later reads in them no more.
        let late = Fence::unfenced();
        apply(&filled, (0, 0), &late, 2_000 + 3_600 * 1_000_000_000, 0);
        let now = nessie_fabric::monotonic_ns();
        let (learnt, said) = late.moved_read_full_for_ns(0, 1, now).unwrap();
        assert!(learnt < 1_000_000_000);
        assert!(said >= 3_600 * 1_000_000_000);
        // Without spare slots nothing moves.
        let none = Policy {
            replacing: None,
            ..policy.clone()
        };
        assert_eq!(failed.successor(&reg(&[0, 2, 3], &[]), 5_000, &none), None);
        // The record round-trips; a full move does not say "receiving".
        let json = serde_json::to_string(&filled).unwrap();
        assert!(
            json.contains(r#"{"partition":0,"copy":1,"node":2,"slot":2,"full_since_ns":2000}"#),
            "{json}"
        );
        assert_eq!(
            serde_json::from_str::<Configuration>(&json).unwrap(),
            filled
        );
    }

    /// A node seen to stop after leaving (`nessie leave`: stepped down, its process exited)
    /// is gone for good a join settle time after it failed (the failover it caused settled),
    /// not `replace_after`: its copies move then. Only a
    /// failed member with its read cut-over named, in the incarnation that stopped, may be
    /// marked; a later incarnation starts unmarked (`STOPPED_OUTLIVES_INCARNATION`, which
    /// keeps the mark, is caught: that process, failed in turn, would lose its copies and
    /// pages a join settle time later while it may still come back).
    #[test]
    fn a_node_seen_to_stop_after_leaving_is_gone_for_good_at_once() {
        use NodeState::*;
        let (set, mut policy) = replacing(4, 1);
        // replace_after far beyond the join settle time.
        let settle = set.join_settle_ns();
        let after = 1_000 * settle;
        policy.replacing.as_mut().unwrap().after_ns = after;
        let mut c = Configuration::initial([0, 1, 2, 3], &Registrations::default());
        for m in &mut c.nodes {
            m.incarnation = 10 + m.id as u64;
        }
        c.leaving = vec![1];
        let refused = |c: &Configuration, inc| c.mark_stopped(1, inc, 1_010).unwrap_err();
        assert!(
            matches!(refused(&c, 11), MigrationError::NotStopped { .. }),
            "no cut-over"
        );
        c.nodes[1].cut_over_ns = 900;
        assert_eq!(refused(&c, 11), MigrationError::NotFailedYet(1), "still up");
        let failed = c.successor(&reg(&[0, 2, 3], &[]), 1_000, &policy).unwrap();
        assert_eq!(states(&failed), vec![Up, Failed, Up, Up]);
        assert!(failed.moves.is_empty(), "not failed for long yet");
        assert!(
            matches!(refused(&failed, 12), MigrationError::NotStopped { .. }),
            "another process"
        );
        let gone = |c: &Configuration, t| c.nodes[1].gone_for_good(t, after, settle);
        assert!(!gone(&failed, 1_000 + settle));
        let marked = failed.mark_stopped(1, 11, 1_010).unwrap().unwrap();
        assert_eq!(marked.epoch, failed.epoch + 1);
        assert_eq!(
            marked.mark_stopped(1, 11, 1_020).unwrap(),
            None,
            "marked already"
        );
        assert!(!gone(&marked, 1_000 + settle - 1) && gone(&marked, 1_000 + settle));
        // Its copies move a join settle time after it failed, not `after`.
        let step = |c: &Configuration, t| c.successor(&reg(&[0, 2, 3], &[]), t, &policy);
        assert_eq!(step(&marked, 1_000 + settle - 1), None);
        let moved = step(&marked, 1_000 + settle).unwrap();
        assert_eq!(moved.moves.len(), 2, "{:?}", moved.moves);
        assert!(moved.moves.iter().all(|m| m.receiving && m.node != 1));
        assert!(moved.copy_map(&set).held_by(1).is_empty());
        assert_eq!(
            step(&failed, 1_000 + settle),
            None,
            "unmarked: it may come back"
        );
        // Started again, it is another member: failed in turn, it is held as any.
        for mutated in [false, true] {
            balance::mutation::STOPPED_OUTLIVES_INCARNATION.with(|m| m.set(mutated));
            let mut back_reg = reg(&[0, 1, 2, 3], &[]);
            back_reg.incarnations = vec![(1, 12)];
            let back = moved.successor(&back_reg, 2_000 + settle, &policy).unwrap();
            balance::mutation::STOPPED_OUTLIVES_INCARNATION.with(|m| m.set(false));
            assert_eq!(states(&back), vec![Up, Joining, Up, Up]);
            let t = 2_100 + settle;
            let again = step(&back, t).unwrap();
            assert_eq!(states(&again), vec![Up, Failed, Up, Up]);
            assert_eq!(gone(&again, t + settle), mutated, "mutated: {mutated}");
        }
    }

    /// A node that fails while it fills a copy moved to it loses that copy too: the next move
    /// takes it elsewhere, receiving again, and the record names the new holder only.
    #[test]
    fn a_copy_whose_new_holder_fails_while_filling_it_moves_again() {
        use NodeState::*;
        let (set, policy) = replacing(5, 2);
        let all = [0, 1, 2, 3, 4];
        let c = Configuration::initial(all, &Registrations::default());
        let c = c
            .successor(&reg(&[0, 2, 3, 4], &[]), 1_000, &policy)
            .unwrap();
        let c = c
            .successor(&reg(&[0, 2, 3, 4], &[]), 1_100, &policy)
            .unwrap();
        assert_eq!(c.moves.len(), 2);
        assert!(c.moves.iter().all(|m| m.receiving));
        // The holder of the first moved copy fails before it says it filled it.
        let lost = c.moves[0].clone();
        let up: Vec<u16> = all
            .iter()
            .copied()
            .filter(|&n| n != 1 && n != lost.node)
            .collect();
        let c = c.successor(&reg(&up, &[]), 1_200, &policy).unwrap();
        assert_eq!(c.state(lost.node), Some(Failed));
        let c = c.successor(&reg(&up, &[]), 1_300, &policy).unwrap();
        let again: Vec<_> = c
            .moves
            .iter()
            .filter(|m| (m.partition, m.copy) == (lost.partition, lost.copy))
            .collect();
        assert_eq!(again.len(), 1, "one record per copy: {:?}", c.moves);
        assert!(again[0].node != lost.node && again[0].node != 1 && again[0].receiving);
        let map = c.copy_map(&set);
        assert!(map.held_by(1).is_empty() && map.held_by(lost.node).is_empty());
        for p in 0..5u16 {
            let nodes: Vec<u16> = (0..2).map(|j| map.place(p, j).node).collect();
            assert_ne!(
                nodes[0], nodes[1],
                "partition {p} has both copies on one node"
            );
        }
    }

    #[test]
    fn applying_moves_puts_them_in_the_fence() {
        let mut c = Configuration::initial([0, 1, 2], &Registrations::default());
        c.moves.push(CopyMove {
            partition: 1,
            copy: 0,
            node: 2,
            slot: 3,
            receiving: true,
            at_start: false,
            full_since_ns: 0,
        });
        let f = Fence::unfenced();
        apply(&c, (0, 0), &f, 10, 0);
        let at = f.moved_copy(1, 0).expect("moved");
        assert_eq!((at.node, at.slot, at.receiving), (2, 3, true));
        assert_eq!(f.moved_copy(0, 0), None);
    }

    #[test]
    fn keys_of_clusters_sharing_an_etcd_do_not_overlap() {
        let a = Keys::new("local", 1);
        let b = Keys::new("local", 0x10);
        assert!(!a.member(1).starts_with(&b.prefix) && !b.config().starts_with(&a.prefix));
        assert_eq!(a.member(3), format!("{}members/3", a.prefix));
        assert!(a.member(12).starts_with(&a.members()));
    }

    #[test]
    fn configuration_record_is_stable_json() {
        let c = Configuration::initial([0, 1], &Registrations::default());
        let s = serde_json::to_string(&c).unwrap();
        assert_eq!(
            s, r#"{"epoch":1,"nodes":[{"id":0,"state":"up"},{"id":1,"state":"up"}]}"#,
            "epoch 1 records no times, as before they existed"
        );
        assert_eq!(serde_json::from_str::<Configuration>(&s).unwrap(), c);
    }

    /// A migration: reserved (slots taken, no fence acts), confirmed (every fence migrates),
    /// handed over (the time recorded), ended an operation's time later (the chain in force,
    /// the chain before retired and its slots free again a settle time after that); a second
    /// migration of the same partition is refused while one runs; a reservation is confirmed
    /// only by its starter, and goes (slots retired) when its starter fails or gives up.
    #[test]
    fn a_migration_is_reserved_confirmed_handed_over_and_ended() {
        use NodeState::*;
        const SETTLE: u64 = 1_000;
        const END: u64 = 250;
        let policy = Policy {
            migration_settle_ns: SETTLE,
            migration_end_ns: END,
            ..Policy::default()
        };
        let c = Configuration::initial([0, 1, 2], &Registrations::default());
        let slot = |node, slot| SlotCopy { node, slot };
        assert_eq!(c.free_index_slot(1, 4, 0, SETTLE), Some(0));
        let to = vec![slot(1, 0), slot(2, 0)];
        let r = c.reserve_migration(5, to.clone(), (1, 10), SETTLE).unwrap();
        assert_eq!(r.epoch, 2);
        assert_eq!(
            r.free_index_slot(1, 4, 10, SETTLE),
            Some(1),
            "slot 0 is reserved"
        );
        assert!(matches!(
            r.reserve_migration(5, vec![slot(1, 1), slot(2, 1)], (1, 10), SETTLE),
            Err(MigrationError::Migrating(5))
        ));
        assert!(matches!(
            r.reserve_migration(6, vec![slot(1, 0), slot(0, 0)], (1, 10), SETTLE),
            Err(MigrationError::SlotTaken { node: 1, slot: 0 })
        ));
        // Reserved: no fence migrates yet.
        let f = Fence::unfenced();
        apply(&r, (0, 0), &f, 10, 0);
        assert!(!f.migrating(5));
        // Only the reservation's own starter, naming it, confirms it.
        assert!(matches!(
            r.confirm_migration(5, &to, (2, 10), 20),
            Err(MigrationError::ReservationGone(5))
        ));
        assert!(matches!(
            r.confirm_migration(5, &to, (1, 11), 20),
            Err(MigrationError::ReservationGone(5))
        ));
        let started = r.confirm_migration(5, &to, (1, 10), 20).unwrap();
        apply(&started, (0, 0), &f, 20, 0);
        assert!(f.migrating(5));
        assert_eq!(
            f.migration_target(5, 1).map(|c| (c.node, c.slot)),
            Some((2, 0))
        );
        // Nothing changes until a node says it handed over.
        let none = reg(&[0, 1, 2], &[]);
        assert_eq!(started.successor(&none, 30, &policy), None);
        let handed = Registrations {
            handed: vec![(1, 5, 20)],
            ..none.clone()
        };
        let seen = started.successor(&handed, 40, &policy).unwrap();
        assert_eq!(seen.index_chains[0].handed_ns, 40);
        assert!(seen.index_chains[0].migrating);
        assert_eq!(seen.successor(&handed, 40 + END - 1, &policy), None);
        let ended = seen.successor(&handed, 40 + END, &policy).unwrap();
        assert!(!ended.index_chains[0].migrating);
        apply(&ended, (0, 0), &f, 40 + END, 0);
        assert!(!f.migrating(5));
        assert_eq!(
            f.moved_index_copy(5, 0).map(|c| (c.node, c.slot)),
            Some((1, 0))
        );
        // Migrating again retires the chain in force once the new one ends.
        let to2 = vec![slot(2, 1), slot(0, 0)];
        let t = 2 * SETTLE;
        let again = ended
            .reserve_migration(5, to2.clone(), (2, t), SETTLE)
            .unwrap();
        let again = again.confirm_migration(5, &to2, (2, t), t).unwrap();
        // The report of the first migration's handover does not end the second.
        assert_eq!(again.successor(&handed, t + 1, &policy), None);
        let handed = Registrations {
            handed: vec![(1, 5, 20), (2, 5, t)],
            ..none.clone()
        };
        let seen = again.successor(&handed, t + 1, &policy).unwrap();
        let done = seen.successor(&handed, t + 1 + END, &policy).unwrap();
        assert_eq!(done.index_chains.len(), 1);
        assert_eq!(done.index_chains[0].copies, to2);
        assert_eq!(done.retired_slots.len(), 2);
        // A fence that saw the first migration start and next reads `done` (its node was
        // paused through both ends): the first chain is retired, its slots free for another
        // partition a settle time on, so no operation may go there any more.
        for mutated in [false, true] {
            balance::mutation::KEEPS_MISSED_MIGRATIONS.with(|m| m.set(mutated));
            let paused = Fence::unfenced();
            apply(&started, (0, 0), &paused, 20, 0);
            assert!(paused.migrating(5));
            apply(&done, (0, 0), &paused, t + 1 + END, 0);
            balance::mutation::KEEPS_MISSED_MIGRATIONS.with(|m| m.set(false));
            assert_eq!(
                paused.migrating(5),
                mutated,
                "a migration the configuration no longer lists is over (mutated: {mutated})"
            );
            assert_eq!(
                paused.moved_index_copy(5, 0).map(|c| (c.node, c.slot)),
                Some((2, 1))
            );
        }
        // Retired for the settle time, not the (shorter) end time.
        assert_eq!(
            done.free_index_slot(1, 4, t + 1 + END + SETTLE - 1, SETTLE),
            Some(1),
            "retired"
        );
        assert_eq!(
            done.successor(&none, t + 1 + END + SETTLE - 1, &policy),
            None
        );
        let later = done
            .successor(&none, t + 1 + END + SETTLE, &policy)
            .unwrap();
        assert!(later.retired_slots.is_empty());
        assert_eq!(
            later.free_index_slot(1, 4, t + 1 + END + SETTLE, SETTLE),
            Some(0)
        );
        // A reservation stays while its starter is up, and goes with it (slots retired);
        // one given up goes at once (slots retired too); a node not up takes none.
        let stale = c
            .reserve_migration(7, vec![slot(0, 0), slot(1, 0)], (2, 0), SETTLE)
            .unwrap();
        assert_eq!(stale.successor(&none, u64::MAX / 2, &policy), None);
        let mut starter_failed = stale.clone();
        starter_failed.nodes[2].state = Failed;
        let dropped = starter_failed
            .successor(&reg(&[0, 1], &[]), 50, &policy)
            .unwrap();
        assert!(dropped.index_chains.is_empty());
        assert_eq!(dropped.retired_slots.len(), 2);
        assert_eq!(dropped.free_index_slot(0, 4, 50, SETTLE), Some(1));
        let cancelled = stale
            .cancel_migration(7, &[slot(0, 0), slot(1, 0)], (2, 0), 60)
            .unwrap();
        assert!(cancelled.index_chains.is_empty());
        assert_eq!(cancelled.retired_slots.len(), 2);
        let mut failed = c.clone();
        failed.nodes[2].state = Failed;
        assert!(matches!(
            failed.reserve_migration(7, vec![slot(0, 0), slot(2, 0)], (0, 0), SETTLE),
            Err(MigrationError::NotUp(2))
        ));
        assert!(matches!(
            failed.reserve_migration(7, vec![slot(0, 0), slot(1, 0)], (2, 0), SETTLE),
            Err(MigrationError::NotUp(2))
        ));
        // The record round-trips.
        let back: Configuration =
            serde_json::from_str(&serde_json::to_string(&seen).unwrap()).unwrap();
        assert_eq!(back, seen);
    }
}
