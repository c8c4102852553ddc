//! Client-driven replication (`replicas` R = 1 to 3): every node's index table and data table
//! (its *partition*) has R copies, copy j of partition p on node (p + j) mod N, and clients keep
//! them in step with one-sided operations alone. No server thread takes part.
//!
//! [`Replicated`] wraps an endpoint and is itself an [`Endpoint`]: the protocol addresses a
//! partition as it addressed a node (`RemoteAddr::node` names the partition), and never learns
//! that there are copies. The index, data and page-table regions are replicated; any other
//! region (SD/HY request slots) is the node's own.
//!
//! The copies of a partition, in chain order c_0 .. c_{R-1}, skipping nodes membership has
//! declared failed (`Fence::is_gone`):
//! - **Reads** go to the first live copy, the *primary*. When the primary's node fails, nodes
//!   that have not heard yet may still read it for [`ReplicaSet::read_settle_ns`]: nodes that
//!   know wait that long before reading the next copy, and a write that cannot reach the failed
//!   copy waits that long before it goes on, so that both kinds of reader see one history.
//! - **Writes** go to every live copy, last first.
//! - A **CAS** is decided by the last live copy, the *decider*, then carried to the others in
//!   reverse chain order, the primary last. So whatever the primary holds, every copy holds or
//!   has moved past: a value a reader saw survives the loss of any R - 1 nodes.
//!
//! Carrying a CAS to a copy ("advance") must not undo a later one. Each copy only moves
//! forward through the decider's history: advance reads the copy, then the decider (whose
//! word, read after, is at or past the copy's and the one being carried), and CASes the copy
//! from what it held to the decider's word. Never by comparing the carried word with the
//! copy's: index entries carry a sequence number (`IteLayout::successor`) and page words a
//! generation, but compared modulo their width they misorder words once a carrier has been
//! held up across half a sequence's worth of changes. A writer that loses at the decider
//! helps: it carries the decider's word forward first, so a writer that died after winning
//! the decider does not wedge the primary. A data-region CAS (marking an entry given up) is carried by the same
//! CAS on each copy; a plain write that came after it wins, as it does at the decider.
//!
//! When the decider's node fails, the previous copy takes over deciding once the failure is
//! [`ReplicaSet::settle_ns`] old, and advances stop once their decider has been gone for half
//! of it: so no advance from the old decider's history lands on the new decider after it began
//! deciding (the same timing assumption as the single-copy protocol's expiry). A writer whose
//! decider failed before its CAS reached every copy gets [`FabricError::Indeterminate`]: the
//! CAS may or may not survive, and the protocol treats its entry as possibly published.
//!
//! A node started again after a failure gets its copies back (`catch_up.rs`): while it is
//! `joining` its copies are *receiving* (written and carried to after every full copy, errors
//! waited on, never read or decided at), it fills them from the primaries, and once it is `up`
//! again every operation on the partitions it holds copies of waits out
//! [`ReplicaSet::join_settle_ns`] (on every node, from when the configuration says it came
//! back), so that no operation uses its copies in their new roles while another still uses the
//! old ones. A write or CAS looks at the copies again once done, and reaches any copy placed
//! meanwhile, a copy restarted in place included (another incarnation of its node).
//!
//! A node gone for good has its copies moved to spare mirror slots of other nodes
//! (`moves.rs`, [`Fence::move_copy`]): a moved copy keeps its place in the chain, is receiving
//! while its new holder fills it (the same catch-up), then full, with the same pause.
//!
//! The argument, step by step, is in `docs/protocol.md` ("Replication", "Rejoin and
//! re-replication").

mod catch_up;
mod moves;
pub use moves::{CopyMap, Move, Placement};
mod fading;
mod handover;
pub use catch_up::CatchUp;
pub use handover::HandOver;
#[cfg(test)]
mod index_moves;
#[cfg(test)]
mod races;

use std::sync::Arc;

use nessie_fabric::{Batch, Endpoint, FabricError, NodeId, RegionId, RemoteAddr};
use nessie_store::pages::PageWord;
use nessie_store::{
    IndexPartitions, IteLayout, PartitionId, DATA_REGION, INDEX_REGION, PAGE_REGION,
};

#[cfg(any(test, feature = "testing"))]
use crate::config::Mutations;
use crate::config::ProtocolConfig;
use crate::error::Error;
use crate::fence::{Fence, NodeRole, MAX_INDEX_SLOTS};

/// Most copies of a partition.
pub const MAX_REPLICAS: u8 = 3;
/// Most spare mirror slots per node (each holds the tables of one partition).
pub const MAX_SPARE_COPIES: u8 = 8;
/// Fewest sequence-number bits replication works with. They keep a word's successive values
/// distinct, and tell a copy holding a word of another history (same sequence number, another
/// word: `Advance::Diverged`). They never order two words: compared modulo their width, a
/// carrier held up across half a sequence's worth of changes would misorder them, so advance
/// anchors on a fresh read of the decider instead (`Replicated::advance`).
pub const MIN_SEQ_BITS: u8 = 8;
/// First region id of the mirrors (after the index, data and page regions): copy j >= 1 of a
/// partition's index table is region `MIRROR_BASE + 3 (j - 1)`, its data table and its page
/// table the next two.
pub const MIRROR_BASE: RegionId = 3;
/// The regions that have copies, by region id (a copy's region is `MIRROR_BASE + ...` plus it).
const REPLICATED: [RegionId; 3] = [INDEX_REGION, DATA_REGION, PAGE_REGION];
/// How long an operation waits for an unreachable node to be declared failed (after which it
/// uses the other copies) before it fails.
pub const UNREACHABLE_WAIT_NS: u64 = 15_000_000_000;
/// Pause between tries on an unreachable node.
const RETRY_PAUSE_NS: u64 = 1_000_000;
/// Most times a plain write looks again for copies placed while it wrote (`write_all`): one
/// membership change per round, and changes are seconds apart.
const MAX_LATE_COPY_ROUNDS: u32 = 4;
/// Most rounds of advancing one copy: each round lost a CAS to another advancer, which moved
/// the copy forward.
const MAX_ADVANCE_ROUNDS: u32 = 10_000;

/// The region holding copy `copy` of a partition's `region` (index, data or page table).
pub fn mirror_region(region: RegionId, copy: u8) -> RegionId {
    debug_assert!(REPLICATED.contains(&region));
    match copy {
        0 => region,
        j => MIRROR_BASE + REPLICATED.len() as RegionId * (j as RegionId - 1) + region,
    }
}

/// Where the copies of every partition are, and what advancing needs to know.
#[derive(Clone, Debug)]
pub struct ReplicaSet {
    replicas: u8,
    nodes: u16,
    /// Mirror slots each node keeps free for copies moved to it (re-replication), after the
    /// R - 1 its home copies fill.
    spare: u8,
    /// How the index splits into partitions, and how many index slots (each room for one
    /// partition's copy) every node keeps for copies of single partitions moved to it. `None`:
    /// the index moves only with its node's tables.
    index_slots: Option<(IndexPartitions, u16)>,
    ite: IteLayout,
    settle_ns: u64,
    /// How long after learning that a copy's node failed a node still treats that copy as
    /// possibly read by others (those that have not heard yet): no more than `settle_ns`.
    read_settle_ns: u64,
    /// The longest an operation lasts: the expiry period plus the clock margin.
    op_ns: u64,
    /// How long an operation waits for an unreachable node to be declared failed
    /// ([`UNREACHABLE_WAIT_NS`]; tests shorten it).
    unreachable_wait_ns: u64,
    #[cfg(any(test, feature = "testing"))]
    mutations: Mutations,
}

impl ReplicaSet {
    /// `replicas` copies of each of `nodes` partitions, for clients running `cfg`. A failure
    /// must be [`Self::settle_ns`] old (the expiry period plus the clock margin: every attempt
    /// begun before it has ended) before the previous copy decides.
    pub fn new(
        replicas: u8,
        nodes: u16,
        ite: IteLayout,
        cfg: &ProtocolConfig,
    ) -> Result<Self, Error> {
        if replicas == 0 || replicas > MAX_REPLICAS {
            return Err(Error::Config(format!(
                "replicas = {replicas} is not in 1..={MAX_REPLICAS}"
            )));
        }
        if replicas as u16 > nodes {
            return Err(Error::Config(format!(
                "replicas = {replicas} needs at least {replicas} nodes; the cluster has {nodes}"
            )));
        }
        if replicas > 1 && ite.seq_bits < MIN_SEQ_BITS {
            return Err(Error::Config(format!(
                "replication needs {MIN_SEQ_BITS} spare ITE bits for sequence numbers; this geometry leaves {} \
                 (use fewer filter bits or a smaller table)",
                ite.seq_bits
            )));
        }
        Ok(Self {
            replicas,
            nodes,
            spare: 0,
            index_slots: None,
            ite,
            settle_ns: cfg.expiry_ns.saturating_add(cfg.clock_margin_ns),
            read_settle_ns: cfg.expiry_ns.saturating_add(cfg.clock_margin_ns),
            op_ns: cfg.expiry_ns.saturating_add(cfg.clock_margin_ns),
            unreachable_wait_ns: UNREACHABLE_WAIT_NS,
            #[cfg(any(test, feature = "testing"))]
            mutations: cfg.mutations,
        })
    }

    /// One copy of everything: the wrapper passes every operation through.
    pub fn single(nodes: u16, ite: IteLayout) -> Self {
        Self {
            replicas: 1,
            nodes,
            spare: 0,
            index_slots: None,
            ite,
            settle_ns: 0,
            read_settle_ns: 0,
            op_ns: 0,
            unreachable_wait_ns: UNREACHABLE_WAIT_NS,
            #[cfg(any(test, feature = "testing"))]
            mutations: Mutations::default(),
        }
    }

    /// Make the settle time at least `ns`. With membership, a node learns of a new epoch
    /// within its view's freshness (the lease TTL) or stops writing: a copy takes over deciding
    /// only once every node has done one or the other.
    pub fn with_settle_at_least(mut self, ns: u64) -> Self {
        self.settle_ns = self.settle_ns.max(ns);
        self
    }

    /// Set how long a node that has not heard of a failure may still read the failed node's
    /// copies: how long a view of membership stays fresh enough to read by, plus the clock
    /// margin (`Fence::may_read`). Readers that know of the failure wait that long before they
    /// read the next copy, and writers that cannot reach the failed copy wait that long before
    /// they go on. Capped at the settle time, for which failed copies are still written.
    pub fn with_read_settle(mut self, ns: u64) -> Self {
        self.read_settle_ns = ns.min(self.settle_ns);
        self
    }

    /// Make operations wait `ns` (instead of [`UNREACHABLE_WAIT_NS`]) for a node that does not
    /// answer to be declared failed before they fail.
    pub fn with_unreachable_wait(mut self, ns: u64) -> Self {
        self.unreachable_wait_ns = ns;
        self
    }

    pub fn read_settle_ns(&self) -> u64 {
        self.read_settle_ns
    }

    /// Keep `spare` mirror slots on every node for copies moved there when a node is gone for
    /// good (at most [`MAX_SPARE_COPIES`]; none without replication).
    pub fn with_spare_copies(mut self, spare: u8) -> Result<Self, Error> {
        if spare > MAX_SPARE_COPIES {
            return Err(Error::Config(format!(
                "spare_copies = {spare} exceeds the maximum of {MAX_SPARE_COPIES}"
            )));
        }
        if spare > 0 && self.replicas < 2 {
            return Err(Error::Config(
                "spare_copies needs replication (replicas >= 2): with one copy there is nothing to move"
                    .into(),
            ));
        }
        self.spare = spare;
        Ok(self)
    }

    /// Keep `slots` index slots on every node, each room for a copy of one partition of
    /// `partitions`, for copies of single index partitions moved there (`Fence::move_index_copy`).
    pub fn with_index_slots(
        mut self,
        partitions: IndexPartitions,
        slots: u16,
    ) -> Result<Self, Error> {
        if slots >= MAX_INDEX_SLOTS {
            return Err(Error::Config(format!(
                "index_slots = {slots} is not below {MAX_INDEX_SLOTS}"
            )));
        }
        if slots > 0 && self.replicas < 2 {
            return Err(Error::Config(
                "index slots need replication (replicas >= 2): with one copy there is nothing to move"
                    .into(),
            ));
        }
        if partitions.count() != self.nodes as u32 * partitions.per_node() {
            return Err(Error::Config(format!(
                "{} index partitions do not split {} nodes' tables",
                partitions.count(),
                self.nodes
            )));
        }
        self.index_slots = (slots > 0).then_some((partitions, slots));
        Ok(self)
    }

    /// How the index splits into partitions, when single partitions can move.
    pub fn index_partitions(&self) -> Option<IndexPartitions> {
        self.index_slots.map(|(p, _)| p)
    }

    /// Index slots per node (0: none).
    pub fn index_slots(&self) -> u16 {
        self.index_slots.map_or(0, |(_, n)| n)
    }

    /// The region holding a node's index slots: after the mirrors.
    pub fn index_slot_region(&self) -> RegionId {
        MIRROR_BASE + REPLICATED.len() as RegionId * (self.replicas + self.spare - 1) as RegionId
    }

    /// Bytes of one index slot: the longest partition's entries.
    pub fn index_slot_bytes(&self) -> u64 {
        self.index_slots.map_or(0, |(p, _)| p.max_len() * 8)
    }

    /// The spare mirror slots of every node: `replicas()..replicas() + spare`.
    pub fn spare_slots(&self) -> std::ops::Range<u8> {
        self.replicas..self.replicas + self.spare
    }

    pub fn nodes(&self) -> u16 {
        self.nodes
    }

    pub fn replicas(&self) -> u8 {
        self.replicas
    }

    pub fn settle_ns(&self) -> u64 {
        self.settle_ns
    }

    /// One operation's time: the expiry period (an operation issues its steps within it,
    /// the protocol's timing assumption) and the clock margin.
    pub fn op_ns(&self) -> u64 {
        self.op_ns
    }

    /// How long the partitions a restarted node holds copies of pause once it is full again:
    /// every node learns of it within the settle time (a lease TTL with membership) or stops,
    /// and every operation that began with the old roles ends within one more operation.
    pub fn join_settle_ns(&self) -> u64 {
        self.settle_ns.saturating_add(self.op_ns)
    }

    /// How long changes of a node's data wait after a moved copy of it became full: twice
    /// the join settle time and an operation's time (rule 10a). Reads in the old roles go on
    /// for a join settle time from the earlier of when each node learns of the change and when
    /// the configuration says it happened (read on its clock, with the margin), and a node
    /// learns up to a settle time after another; so changes in the new roles start only once
    /// every such read has ended.
    pub fn moved_change_settle_ns(&self) -> u64 {
        // And one operation's time, which covers the clock margin twice (`op_ns` is the
        // expiry period plus the margin, and the join settle time holds the margin twice): a
        // reader counts from when the configuration says, on its clock, with the margin.
        self.join_settle_ns()
            .saturating_mul(2)
            .saturating_add(self.op_ns)
    }

    /// The region sizes every node registers: `base` (index, data, page table, ...) followed
    /// by the mirrors of the tables it holds for other partitions, then its index slots.
    pub fn region_sizes(&self, base: &[u64]) -> Vec<u64> {
        let mut r = base.to_vec();
        if self.replicas > 1 {
            r.resize(MIRROR_BASE as usize, 0);
            for _ in 1..self.replicas + self.spare {
                r.extend(REPLICATED.iter().map(|&region| base[region as usize]));
            }
            if self.index_slots() > 0 {
                debug_assert_eq!(r.len(), self.index_slot_region() as usize);
                r.push(self.index_slots() as u64 * self.index_slot_bytes());
            }
        }
        r
    }

    /// The node holding copy `copy` of `partition` at home (before any move: `Fence::moved_copy`).
    pub fn holder(&self, partition: NodeId, copy: u8) -> NodeId {
        ((partition as u32 + copy as u32) % self.nodes as u32) as NodeId
    }

    /// Whether word `a` of `region` comes after `b` in one word's history: index entries by
    /// their sequence numbers (compared modulo their width), page words by generation, a
    /// claimed word after the free one of the generation before and before its release.
    fn newer(&self, region: RegionId, a: u64, b: u64) -> bool {
        if region == PAGE_REGION {
            return page_order(a) > page_order(b);
        }
        // Pending (what a migration's new chain starts with, sequence 0) comes before every
        // word of the entry's history there (no fenced word is pending: `IteLayout::fenced`).
        let pending = self.ite.pending().0;
        if a == pending || b == pending {
            return a != pending && b == pending;
        }
        let bits = self.ite.seq_bits as u32;
        let (sa, sb) = (
            self.ite.seq(nessie_store::Ite(a)),
            self.ite.seq(nessie_store::Ite(b)),
        );
        let d = sa.wrapping_sub(sb) & ((1u64 << bits) - 1);
        d != 0 && d < 1u64 << (bits - 1)
    }

    /// Whether `a` and `b` are at the same point of a word's history.
    fn same_seq(&self, region: RegionId, a: u64, b: u64) -> bool {
        if region == PAGE_REGION {
            return page_order(a) == page_order(b);
        }
        let pending = self.ite.pending().0;
        if a == pending || b == pending {
            return a == b;
        }
        self.ite.seq(nessie_store::Ite(a)) == self.ite.seq(nessie_store::Ite(b))
    }
}

/// A page word's place in its history: free at generation g, then claimed at g + 1, then
/// free at g + 1 (a release keeps the generation).
fn page_order(w: u64) -> u64 {
    let w = PageWord(w);
    2 * w.generation() + !w.is_claimed() as u64
}

/// What an address's copies are copies of: a node's tables (its data and page tables, and the
/// partitions of its index table that did not move on their own), or one index partition that
/// did (some copy of it is in an index slot).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Part {
    Tables(NodeId),
    Index(PartitionId),
    /// The chain an index partition is migrating to (`handover.rs`).
    Target(PartitionId),
}

/// Where on its node a copy is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Spot {
    /// A mirror slot: a copy of a node's tables (slot 0: the node's own).
    Mirror(u8),
    /// An index slot: a copy of one index partition.
    Index(u16),
}

/// One copy of a partition: the node holding it and its position in the chain.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Copy {
    node: NodeId,
    j: u8,
    /// Where it is on `node` (mirror slot `j` unless it moved).
    spot: Spot,
    /// Its node was declared failed less than the settle time ago: nobody who knows reads it
    /// or decides at it any more, but it is still written, once: a node that has not yet heard
    /// of the failure may still read it, so a write that fails there waits until the read
    /// settle time is over (`wait_unread`).
    fading: bool,
    /// Its node restarted and is receiving its copies (`NodeRole::Receiving`): written like a
    /// full copy (the catch-up relies on every write reaching it), never read or decided at.
    receiving: bool,
    /// When its node's incarnation joined (`Fence::incarnation`): a copy at the same node and
    /// slot after a restart is another copy, filled from the others and missing what reached
    /// the dead incarnation.
    incarnation: u64,
}

impl Copy {
    /// A full copy of its node's first incarnation (tests).
    #[cfg(test)]
    fn full(node: NodeId, j: u8, slot: u8) -> Self {
        Copy {
            node,
            j,
            spot: Spot::Mirror(slot),
            fading: false,
            receiving: false,
            incarnation: 0,
        }
    }

    /// Whether `self` is the copy `other` was: the same place, and the same incarnation of
    /// its node (rule 17).
    fn same(&self, other: &Copy, by_place_only: bool) -> bool {
        (self.node, self.spot) == (other.node, other.spot)
            && (by_place_only || self.incarnation == other.incarnation)
    }

    /// Read, written and decided at.
    fn is_full(&self) -> bool {
        !self.fading && !self.receiving
    }
}

/// The live copies of a partition, in chain order.
#[derive(Copy, Clone, Debug)]
struct Copies {
    at: [Copy; MAX_REPLICAS as usize],
    len: usize,
}

impl Copies {
    fn as_slice(&self) -> &[Copy] {
        &self.at[..self.len]
    }
}

/// What carrying a word to one copy found.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Advance {
    /// The copy holds the word now (we put it there, or someone did).
    Holds,
    /// The copy has moved past the word.
    Past,
    /// The copy holds another word with the same sequence number: another history.
    Diverged,
    /// The copy's node failed.
    Gone,
}

/// An endpoint whose index, data and page-table regions are replicated (see the module comment).
pub struct Replicated<E: Endpoint> {
    inner: E,
    set: Arc<ReplicaSet>,
    fence: Arc<Fence>,
}

impl<E: Endpoint> Replicated<E> {
    pub fn new(inner: E, set: Arc<ReplicaSet>, fence: Arc<Fence>) -> Self {
        Self { inner, set, fence }
    }

    pub fn inner(&self) -> &E {
        &self.inner
    }

    fn replicated(&self, region: RegionId) -> bool {
        self.set.replicas > 1 && REPLICATED.contains(&region)
    }

    /// What `addr`'s copies are copies of: its node's tables, unless it is an index entry of a
    /// partition some copy of which moved on its own (checked only once any did).
    fn part(&self, addr: RemoteAddr) -> Part {
        match self.index_split(addr.region) {
            Some(p) => {
                let (q, _) = p.of_home_offset(addr.node, addr.offset);
                if self.fence.migrating(q) {
                    return Part::Target(q);
                }
                match (0..self.set.replicas).any(|j| self.fence.moved_index_copy(q, j).is_some()) {
                    true => Part::Index(q),
                    false => Part::Tables(addr.node),
                }
            }
            None => Part::Tables(addr.node),
        }
    }

    /// How the index splits into partitions, if `region` is the index and some partition has
    /// moved on its own or migrated (before that, every entry goes with its node's tables).
    fn index_split(&self, region: RegionId) -> Option<IndexPartitions> {
        match self.set.index_slots {
            Some(_) if mutated!(self.set, index_moves_ignored) => None,
            Some((p, _))
                if region == INDEX_REGION
                    && (self.fence.any_index_moved() || self.fence.any_migrating()) =>
            {
                Some(p)
            }
            _ => None,
        }
    }

    /// The node `part` is at home on (what errors name).
    fn home(&self, part: Part) -> NodeId {
        match (part, self.set.index_slots) {
            (Part::Tables(n), _) => n,
            (Part::Index(q) | Part::Target(q), Some((p, _))) => p.home(q),
            (_, None) => unreachable!("an index partition without index slots"),
        }
    }

    /// Where copy `c` holds the word at `addr`.
    fn at(&self, addr: RemoteAddr, c: Copy) -> RemoteAddr {
        match c.spot {
            Spot::Mirror(slot) => {
                RemoteAddr::new(c.node, mirror_region(addr.region, slot), addr.offset)
            }
            Spot::Index(k) => {
                let (p, _) = self.set.index_slots.expect("index slots");
                debug_assert_eq!(addr.region, INDEX_REGION);
                let (q, e) = p.of_home_offset(addr.node, addr.offset);
                debug_assert!(e < p.len(q));
                RemoteAddr::new(
                    c.node,
                    self.set.index_slot_region(),
                    k as u64 * self.set.index_slot_bytes() + e * 8 + addr.offset % 8,
                )
            }
        }
    }

    /// The copies of `part` on nodes not declared failed, and (`with_fading`) those
    /// declared failed less than the settle time ago and those receiving their copies, in
    /// chain order. Fails if no copy is full (on a node that is up).
    fn copies(&self, part: Part, with_fading: bool) -> Result<Copies, FabricError> {
        let mut c = Copies {
            at: [Copy {
                node: 0,
                j: 0,
                spot: Spot::Mirror(0),
                fading: false,
                receiving: false,
                incarnation: 0,
            }; MAX_REPLICAS as usize],
            len: 0,
        };
        let now = with_fading.then(|| self.inner.mono_ns());
        let mut full = 0;
        for j in 0..self.set.replicas {
            // One look at the copy's place and role; only a gone node's declaration time is
            // read too.
            let (node, spot, role) = self.place(part, j);
            let receiving = role == NodeRole::Receiving;
            if receiving && (!with_fading || mutated!(self.set, rejoin_skips_receiving)) {
                continue;
            }
            let fading = match role {
                NodeRole::Gone => match (now, self.fence.gone_for_ns(node, now.unwrap_or(0))) {
                    (Some(_), Some(t)) if t < self.set.settle_ns => true,
                    _ => continue,
                },
                _ => false,
            };
            let copy = Copy {
                node,
                j,
                spot,
                fading,
                receiving,
                incarnation: self.fence.incarnation(node),
            };
            full += copy.is_full() as usize;
            c.at[c.len] = copy;
            c.len += 1;
        }
        if full == 0 {
            return Err(FabricError::NoCopy {
                node: self.home(part),
            });
        }
        Ok(c)
    }

    /// Where copy `j` of `part` is now (node, spot) and its role there: its node's role, or
    /// receiving while a copy moved there is being filled. An index partition's copy that did
    /// not move on its own is where its home node's tables' copy is.
    fn place(&self, part: Part, j: u8) -> (NodeId, Spot, NodeRole) {
        let partition = match part {
            Part::Tables(n) => n,
            Part::Target(q) => match self.fence.migration_target(q, j) {
                Some(m) => return (m.node, Spot::Index(m.slot), self.fence.role(m.node)),
                // The migration ended since: its target is the partition's chain now.
                None => return self.place(Part::Index(q), j),
            },
            Part::Index(q) => match self.fence.moved_index_copy(q, j) {
                Some(m) => {
                    return (
                        m.node,
                        Spot::Index(m.slot),
                        self.moved_role(m.node, m.receiving),
                    )
                }
                None => self.home(part),
            },
        };
        match self.fence.moved_copy(partition, j) {
            None => {
                let node = self.set.holder(partition, j);
                (node, Spot::Mirror(j), self.fence.role(node))
            }
            Some(m) => (
                m.node,
                Spot::Mirror(m.slot),
                self.moved_role(m.node, m.receiving),
            ),
        }
    }

    /// The role of a moved copy on `node`: its node's, or receiving while it is being filled.
    fn moved_role(&self, node: NodeId, receiving: bool) -> NodeRole {
        match self.fence.role(node) {
            NodeRole::Full if receiving => NodeRole::Receiving,
            r => r,
        }
    }

    /// How long copy `j` of `part`, if it moved, has been full in its new place at `now_ns`.
    fn moved_full_for_ns(&self, part: Part, j: u8, now_ns: u64) -> Option<u64> {
        if let Part::Index(q) | Part::Target(q) = part {
            if self.fence.moved_index_copy(q, j).is_some() {
                return self.fence.moved_index_full_for_ns(q, j, now_ns);
            }
        }
        self.fence.moved_full_for_ns(self.home(part), j, now_ns)
    }

    /// Whether membership ended the pause of changes after moved copy `j` of `part` became
    /// full early (rule 10c: every node said it reads the copy in the new roles). A copy of
    /// an index partition that moved on its own has no such end.
    fn moved_writes_settled(&self, part: Part, j: u8, now_ns: u64) -> bool {
        if let Part::Index(q) | Part::Target(q) = part {
            if self.fence.moved_index_copy(q, j).is_some() {
                return false;
            }
        }
        let home = self.home(part);
        match mutated!(self.set, moved_writes_end_with_reads) {
            true => self.fence.moved_reads_settled(home, j, now_ns),
            false => self.fence.moved_writes_settled(home, j, now_ns),
        }
    }

    /// Whether nothing has written `part` since the cluster started: the tables of a node
    /// that has never been up (a standby node: `Fence::set_never_up`).
    fn never_written(&self, part: Part) -> bool {
        matches!(part, Part::Tables(p) if self.fence.never_up(p))
    }

    /// The full copies of `part`: on nodes up, not receiving.
    fn live(&self, part: Part) -> Result<Copies, FabricError> {
        self.copies(part, false)
    }

    /// Wait while a copy of `partition` has been full again (after a restart) for less than
    /// the join settle time: no operation may use the copy in its new role (primary, decider)
    /// while an operation that began before every node knew of it may still use the old ones
    /// (`ReplicaSet::join_settle_ns`).
    ///
    /// A *moved* copy of a node's data (data and page words, not index entries) is different
    /// (`docs/protocol.md`, rule 10a): its reads do not wait but keep the old roles for the
    /// join settle time (`read_copy` skips the copy). A change waits twice as long
    /// ([`ReplicaSet::moved_change_settle_ns`]) where the copy changes what a reader reads: a
    /// CAS (the decider may change too) or a plain write when the copy is the partition's new
    /// primary (no full copy before it); so no change in the new roles is under way while a
    /// node reads in the old ones. A plain write behind the primary, or an unordered one (a
    /// recycle mark: `Endpoint::write_unordered`), does not wait for a moved copy at all. A
    /// moved copy holds a gone or departed node's tables, or another's copy that node held:
    /// reads (GETs of values it wrote) and recycle marks go on.
    fn wait_join_settled(&mut self, part: Part, access: Access) {
        let moved = self.fence.any_moved() || !matches!(part, Part::Tables(_));
        let moved_settle_ns = match access {
            Access::Index => Some(self.set.join_settle_ns()),
            Access::DataRead | Access::Unordered => None,
            Access::DataWrite | Access::DataCas if mutated!(self.set, moved_change_waits_once) => {
                Some(self.set.join_settle_ns())
            }
            Access::DataWrite | Access::DataCas => Some(self.set.moved_change_settle_ns()),
        };
        loop {
            let mut recent = false;
            let mut now = None;
            // A full copy before the one looked at, itself settled: the primary stays.
            let mut primary_stays = false;
            let places: [(NodeId, NodeRole); MAX_REPLICAS as usize] =
                std::array::from_fn(|j| match j < self.set.replicas as usize {
                    true => {
                        let (node, _, role) = self.place(part, j as u8);
                        (node, role)
                    }
                    false => (0, NodeRole::Gone),
                });
            let roles = places.map(|(_, role)| role);
            for j in 0..self.set.replicas {
                let (node, role) = places[j as usize];
                // A full copy after it: an old-role reader may read that one while a new-role
                // reader reads this one (R = 3), so a plain write waits there too.
                let full_after = roles[j as usize + 1..].contains(&NodeRole::Full)
                    && !mutated!(self.set, moved_write_ignores_copy_after);
                let rejoined = self.fence.rejoined(node);
                if !rejoined && !moved {
                    primary_stays |= role == NodeRole::Full;
                    continue;
                }
                let t = *now.get_or_insert_with(|| self.inner.mono_ns());
                let settling = |f: Option<u64>, ns: u64| f.is_some_and(|f| f < ns);
                recent |= rejoined
                    && settling(self.fence.full_for_ns(node, t), self.set.join_settle_ns());
                let mut this_settles = false;
                if let Some(ns) = moved_settle_ns {
                    // Behind the primary with no full copy after it, every reader reads the
                    // primary in either roles: a plain write need not wait, and a CAS only for
                    // the decider's change (the join settle time, as after a rejoin).
                    let behind = primary_stays && !full_after;
                    let ns = match access {
                        Access::DataCas if behind => self.set.join_settle_ns(),
                        _ => ns,
                    };
                    this_settles = moved
                        && settling(self.moved_full_for_ns(part, j, t), ns)
                        && !self.moved_writes_settled(part, j, t);
                    let waits = match access {
                        Access::DataWrite => {
                            !behind && !mutated!(self.set, moved_writes_never_wait)
                        }
                        _ => true,
                    };
                    recent |= this_settles && waits;
                }
                primary_stays |= role == NodeRole::Full && !this_settles;
            }
            if !recent {
                return;
            }
            self.inner.sleep_ns(RETRY_PAUSE_NS);
        }
    }

    /// Which roles a data read takes for copy `j` of `part` (rule 10a): the new ones once this
    /// node has known for the join settle time that the moved copy is full; the old ones (skip
    /// it) while both that and the configuration's time for it are less than the join settle
    /// time ago; in between (a node that learnt late), neither: it waits. The configuration's
    /// time is written before its epoch is published, so it may be well before anyone could
    /// learn of it: it may end the old roles early, never start the new ones.
    fn moved_copy_window(&self, part: Part, j: u8, now_ns: u64) -> ReadWindow {
        if !matches!(part, Part::Tables(_)) || mutated!(self.set, read_settling_moved_copy) {
            return ReadWindow::New;
        }
        let settle = self.set.join_settle_ns();
        if self.fence.moved_reads_settled(self.home(part), j, now_ns) {
            return ReadWindow::New; // rule 10c: every write of the old roles is on the copy
        }
        match self
            .fence
            .moved_read_full_for_ns(self.home(part), j, now_ns)
        {
            None => ReadWindow::New,
            Some((learnt, _)) if learnt >= settle => ReadWindow::New,
            // Only a fence that saw the copy receiving (rule 10c): one that learns of it full
            // may be a process others did not wait for.
            Some((_, said))
                if said < settle
                    && (self.fence.moved_may_read_old(self.home(part), j)
                        || mutated!(self.set, fresh_fence_reads_old)) =>
            {
                ReadWindow::Old
            }
            Some(_) if mutated!(self.set, new_roles_from_configuration_time) => ReadWindow::New,
            Some(_) => ReadWindow::Between,
        }
    }

    /// The copies a change goes to, once the last full copy may decide: every copy after it
    /// in the chain has been gone for the settle time (waits if one failed more recently). The
    /// decider is the last full copy; receiving copies may follow it.
    fn deciding(&mut self, part: Part, access: Access) -> Result<(Copies, usize), FabricError> {
        loop {
            self.wait_join_settled(part, access);
            let c = self.copies(part, true)?;
            let d = c
                .as_slice()
                .iter()
                .rposition(Copy::is_full)
                .expect("copies() returns a full copy");
            let last = c.as_slice()[d];
            let now = self.inner.mono_ns();
            let unsettled = (last.j + 1..self.set.replicas).any(|j| {
                let (node, _, _) = self.place(part, j);
                self.fence
                    .gone_for_ns(node, now)
                    .is_some_and(|t| t < self.set.settle_ns)
            });
            if !unsettled {
                return Ok((c, d));
            }
            self.inner.sleep_ns(RETRY_PAUSE_NS);
        }
    }

    /// `Fenced` once the monotonic clock reaches `until` (no clock read without membership).
    /// Never the wall clock: a node sets and checks these deadlines itself, and a backward
    /// step of its wall clock (NTP, a VM resume) must not make a stale view fresh again.
    fn fenced_after(&self, until: u64) -> Result<(), FabricError> {
        fenced_after(&self.inner, self.on_wall_clock(), until)
    }

    /// Whether the fence's deadlines are on the wall clock (the mutation
    /// `fence_on_wall_clock`, as before it was found) rather than the monotonic one.
    fn on_wall_clock(&self) -> bool {
        mutated!(self.set, fence_on_wall_clock)
    }

    /// The clock the fence's deadlines are on.
    fn fence_now(&self) -> u64 {
        match self.on_wall_clock() {
            true => self.inner.now_ns(),
            false => self.inner.mono_ns(),
        }
    }

    /// A node whose membership view may be stale (or that is not `up`) decides nothing: its
    /// peers may already decide at another copy. Checked before every deciding CAS, since a
    /// CAS may come long after the operation's own check (waits for unreachable nodes, settling).
    fn check_fence(&self) -> Result<(), FabricError> {
        self.fenced_after(self.fence.lease_until())
    }

    /// Whether advances from `decider`'s history must stop: it has been gone for half the
    /// settle time, so its successor may soon decide.
    fn stale(&self, decider: Copy) -> bool {
        let now = self.inner.mono_ns();
        self.fence
            .gone_for_ns(decider.node, now)
            .is_some_and(|t| t >= self.set.settle_ns / 2)
    }

    /// Run `op` on copy `c` until it succeeds; `None` if the copy's node is declared failed
    /// (now or while we wait for that), once nobody reads the copy any more (`wait_unread`).
    /// A fading copy is tried once. A node that stays unreachable without being declared
    /// failed fails the operation after the unreachable wait ([`UNREACHABLE_WAIT_NS`]). `reading`: `op` reads for
    /// a client, which may only happen while this node's view is fresh (the caller checks it
    /// before the first try, this before every later one: a retry may come long after).
    /// `op` must be safe to repeat.
    fn on_copy<T>(
        &mut self,
        c: Copy,
        reading: bool,
        mut op: impl FnMut(&mut E) -> Result<T, FabricError>,
    ) -> Result<Option<T>, FabricError> {
        if c.fading {
            return match op(&mut self.inner) {
                Ok(v) => Ok(Some(v)),
                Err(FabricError::Unreachable { .. } | FabricError::Transport(_)) => {
                    self.wait_unread(c);
                    Ok(None)
                }
                Err(e) => Err(e),
            };
        }
        // When the first try failed (no clock read on the way that almost always succeeds).
        let mut start = None;
        // Whether the copy was chosen before its read cut-over (rule 7a), where a retry past
        // it must choose again; one chosen past it (read again, no other copy being readable)
        // is retried as any other. A clock read only for a node that has one.
        let chosen_before =
            reading && self.fence.has_cut_over(c.node) && !self.near_cut_over(c.node);
        loop {
            if self.fence.is_gone(c.node) {
                self.wait_unread(c);
                return Ok(None);
            }
            if reading && start.is_some() {
                // The caller checked the view before the first try.
                self.wait_fresh_view()?;
                // And the copy's read cut-over (rule 7a): a retry may be past it. Choose again.
                if chosen_before && self.near_cut_over(c.node) {
                    return Ok(None);
                }
            }
            match op(&mut self.inner) {
                Ok(v) => return Ok(Some(v)),
                Err(e @ (FabricError::Unreachable { .. } | FabricError::Transport(_))) => {
                    // Waiting helps only if the failure is the other node's, not ours.
                    let me = self.inner.node();
                    let ours = matches!(e, FabricError::Unreachable { node, .. } if node == me)
                        || self.fence.is_gone(me);
                    let now = self.inner.mono_ns();
                    let waited = now.saturating_sub(*start.get_or_insert(now));
                    if ours || waited > self.set.unreachable_wait_ns {
                        return Err(e);
                    }
                    self.inner.sleep_ns(RETRY_PAUSE_NS);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// READ from the primary (the first live copy), moving on if it fails.
    fn read_primary(&mut self, addr: RemoteAddr, buf: &mut [u8]) -> Result<(), FabricError> {
        self.read_primary_in(self.part(addr), addr, buf)
    }

    /// [`Self::read_primary`] from the copies of `part`.
    fn read_primary_in(
        &mut self,
        part: Part,
        addr: RemoteAddr,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        let access = Access::of(part, addr.region, Access::DataRead);
        self.wait_join_settled(part, access);
        loop {
            let c = match self.read_copy(part, access == Access::DataRead) {
                // A standby node's tables whose only full copies are gone (SB5 of
                // `nessie_membership::standby`): nobody has written them, so they read as
                // zeros (a restarted node adopting its pages reads every node's page table).
                Err(FabricError::NoCopy { .. }) if self.never_written(part) => {
                    buf.fill(0);
                    return Ok(());
                }
                c => c?,
            };
            let a = self.at(addr, c);
            if self.on_copy(c, true, |e| e.read(a, buf))?.is_some() {
                return Ok(());
            }
        }
    }

    /// WRITE to every live (or fading) copy, last first (`local`: copy 0 is this node's own
    /// memory).
    ///
    /// A copy placed while we wrote (a move or a rejoin our choice of copies missed) gets the
    /// write too, before we return: otherwise a write that chose its copies before the change
    /// and landed after the copier had passed its words would be missing from the new copy
    /// for good (the copier's settle wait covers such writes only if they end within an
    /// operation time, which a thread descheduled that long breaks: found by the replace hunt
    /// on a loaded machine). Writing the same bytes again is harmless: every plain write is to
    /// an entry nobody else writes until we return (unpublished, or freed only after).
    ///
    /// Receiving copies (a rejoining node's, or moved ones being filled) are written after the
    /// others: the copier sets a receiving copy's data words to the decider's and compares
    /// again only the words it wrote, so a write that reached the receiving copy first and the
    /// decider only after the copier's last comparison (its thread descheduled between the two)
    /// would leave the copy behind for good (found by the replace hunt on a loaded machine).
    /// Written last, the receiving copy gets the decider's word from us or from the copier.
    ///
    /// `access`: `DataWrite`, or `Unordered` for a write whose readers tolerate seeing it on
    /// one copy and not another (`Endpoint::write_unordered`).
    fn write_all(
        &mut self,
        addr: RemoteAddr,
        buf: &[u8],
        local: bool,
        access: Access,
    ) -> Result<(), FabricError> {
        let part = self.part(addr);
        self.wait_join_settled(part, Access::of(part, addr.region, access));
        let copies = self.copies(part, true)?;
        let mut written = false;
        match self.write_copies(part, addr, buf, local, copies, &mut written) {
            // Refused past the lease once some copy has it: some copies have it, some not.
            Err(FabricError::Fenced { node }) if written => {
                Err(FabricError::Indeterminate { node })
            }
            r => r,
        }
    }

    /// [`Self::write_all`]'s writes to `copies`, then to copies placed since (rule 17);
    /// `written` is set once some copy has the bytes.
    fn write_copies(
        &mut self,
        part: Part,
        addr: RemoteAddr,
        buf: &[u8],
        local: bool,
        copies: Copies,
        written: &mut bool,
    ) -> Result<(), FabricError> {
        let primary = copies.as_slice().iter().find(|c| c.is_full()).copied();
        let receiving_first = mutated!(self.set, receiving_written_first);
        // Two passes over the copies, each last first: the others, then the receiving ones.
        let in_pass = |c: &Copy, pass: u8| match receiving_first {
            true => pass == 0,
            false => c.receiving == (pass == 1),
        };
        for pass in 0..2 {
            for &c in copies.as_slice().iter().rev().filter(|c| in_pass(c, pass)) {
                if mutated!(self.set, replicate_index_only) && Some(c) != primary {
                    continue;
                }
                self.write_copy(addr, buf, local, c)?;
                *written = true;
            }
        }
        if mutated!(self.set, replicate_index_only) || mutated!(self.set, no_late_copy_writes) {
            return Ok(());
        }
        self.on_late_copies(part, addr, copies, |s, c| s.write_copy(addr, buf, local, c))
    }

    /// Run `each` on every copy of `partition` placed since `chosen` were (rule 17), looking
    /// again after each round, at most [`MAX_LATE_COPY_ROUNDS`] rounds.
    fn on_late_copies(
        &mut self,
        part: Part,
        addr: RemoteAddr,
        chosen: Copies,
        mut each: impl FnMut(&mut Self, Copy) -> Result<(), FabricError>,
    ) -> Result<(), FabricError> {
        let mut seen = chosen;
        for _ in 0..MAX_LATE_COPY_ROUNDS {
            let part = self.late_part(part, addr);
            let (now, late) = self.late_copies(part, &seen)?;
            if late.is_empty() {
                break;
            }
            for c in late {
                each(self, c)?;
            }
            seen = now;
        }
        Ok(())
    }

    /// The chain an operation that chose the copies of `part` looks at again for copies placed
    /// since (rule 17): the same chain, wherever its copies are now (an index partition may
    /// have moved on its own meanwhile), but never the chain a partition began migrating to:
    /// the old chain's words reach the new one only by the handover (`handover.rs`), never by
    /// carrying (that would install them without fencing the old chain).
    fn late_part(&self, part: Part, addr: RemoteAddr) -> Part {
        match (part, self.part(addr)) {
            (Part::Target(q), _) => Part::Target(q),
            (_, Part::Target(q)) => Part::Index(q),
            (_, now) => now,
        }
    }

    /// The copies of `part` now (fading and receiving ones included), and those of them
    /// that are not among `chosen` (rule 17): placed since (a move, a rejoin), or at the same
    /// node and slot but of another incarnation of its node (a restart in between: that copy
    /// was filled from the others, and lacks whatever reached the one before).
    fn late_copies(&self, part: Part, chosen: &Copies) -> Result<(Copies, Vec<Copy>), FabricError> {
        let now = self.copies(part, true)?;
        let by_place = mutated!(self.set, late_copy_by_place);
        let late = now
            .as_slice()
            .iter()
            .filter(|c| !chosen.as_slice().iter().any(|o| c.same(o, by_place)))
            .copied()
            .collect();
        Ok((now, late))
    }

    /// One copy's share of [`Self::write_all`]. A write to another node's memory is issued
    /// only while this node's lease holds, checked just before it as a carrier's CAS is
    /// (rule 6): a node paused past its lease may have been declared failed, its pages adopted
    /// and its entries completed, recycled and handed out by the others, and a late header,
    /// value or mark would land on someone else's entry (review of f82f64e). Past the lease it
    /// waits, until a settle time after the lapse, for a renewal, then writes; not renewed, the
    /// write is refused: `Fenced`, or `Indeterminate` if an earlier try of it went unanswered
    /// (it may have landed). Its own memory (copy 0, `local`) nobody reads once it is declared
    /// failed.
    fn write_copy(
        &mut self,
        addr: RemoteAddr,
        buf: &[u8],
        local: bool,
        c: Copy,
    ) -> Result<(), FabricError> {
        if local && c.spot == Spot::Mirror(0) {
            self.inner.local_write(addr.region, addr.offset, buf)?;
            return Ok(());
        }
        let a = self.at(addr, c);
        // A try that failed in flight may have landed: a refusal after it is not "not written".
        let mut unanswered = false;
        loop {
            let mut lease = self.lease_check(mutated!(self.set, writer_ignores_lease));
            let written = self.on_copy(c, false, |e| {
                lease.check(e)?;
                let r = e.write(a, buf);
                unanswered |= r.is_err();
                r
            });
            match written {
                Ok(_) => return Ok(()),
                // Only the lease check above refuses with `Fenced` here.
                Err(FabricError::Fenced { .. }) if self.lease_renewed(lease.lapsed) => continue,
                Err(FabricError::Fenced { node }) if unanswered => {
                    return Err(FabricError::Indeterminate { node })
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The CAS at the deciding copy (once it may decide, and if this node may change
    /// replicated memory): the copies the change goes to (the decider last), the decider, and
    /// the word it held.
    fn decide(
        &mut self,
        part: Part,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<(Copies, Copy, u64), FabricError> {
        let (copies, d) = self.deciding(part, Access::of(part, addr.region, Access::DataCas))?;
        let decider = copies.as_slice()[d];
        self.check_fence()?;
        let at = self.at(addr, decider);
        let found = self
            .inner
            .compare_and_swap(at, expected, desired)
            .map_err(|e| match e {
                // We cannot tell whether a CAS that failed in flight took place.
                FabricError::Unreachable { node, .. } => FabricError::Indeterminate { node },
                e => e,
            })?;
        Ok((copies, decider, found))
    }

    /// The copies a CAS decided at `decider` is carried to, in order: the full (and fading)
    /// ones last first, then the receiving ones last first. Receiving copies come after every
    /// full one, the primary included, so that they only ever get words every full copy has:
    /// a word that dies with its decider (decided, never carried further) never reaches a copy
    /// that is about to become full (catching up fills them from the primary, for the same
    /// reason: rule 9).
    fn carry_order(
        &self,
        copies: &Copies,
        decider: Copy,
    ) -> ([Copy; MAX_REPLICAS as usize], usize) {
        let mut order = [decider; MAX_REPLICAS as usize];
        let mut n = 0;
        let chain_order = mutated!(self.set, catch_up_from_decider);
        for pass in 0..2 {
            for &c in copies.as_slice().iter().rev() {
                let in_pass =
                    chain_order && pass == 0 || !chain_order && c.receiving == (pass == 1);
                if c != decider && in_pass {
                    order[n] = c;
                    n += 1;
                }
            }
        }
        (order, n)
    }

    /// The decider's invariants, checked where a CAS crosses from deciding to carrying (a
    /// handful of copies: cheap beside the remote CAS just made). The decider is a full copy
    /// of the partition, the last full one in chain order (rule 3: the chain's end decides);
    /// every other live copy is carried to exactly once, never the decider; and, unless the
    /// mutation restores the old order, no receiving copy comes before a full one (rule 9).
    fn assert_carry_order(copies: &Copies, decider: Copy, order: &[Copy], chain_order: bool) {
        let all = copies.as_slice();
        assert!(
            decider.is_full(),
            "decided at a copy that is not full: {decider:?}"
        );
        assert!(
            all.iter().rposition(Copy::is_full).map(|d| all[d]) == Some(decider),
            "the decider {decider:?} is not the last full copy of {all:?}"
        );
        assert_eq!(
            order.len() + 1,
            all.len(),
            "carried to {order:?}, copies {all:?}"
        );
        for (i, c) in order.iter().enumerate() {
            assert!(*c != decider, "the decider is carried to: {order:?}");
            assert!(all.contains(c), "carried to a copy not in the chain: {c:?}");
            assert!(!order[..i].contains(c), "carried to {c:?} twice: {order:?}");
        }
        if !chain_order {
            let first_receiving = order
                .iter()
                .position(|c| c.receiving)
                .unwrap_or(order.len());
            assert!(
                order[first_receiving..].iter().all(|c| c.receiving),
                "a receiving copy carried before a full one: {order:?}"
            );
        }
    }

    /// CAS of an index entry or a page word (words with an order): the decider, then every
    /// other copy advanced to the word it installed, or, if it lost, to the word it found
    /// there (helping its writer); then any copy placed meanwhile (rule 17).
    fn cas_ordered(
        &mut self,
        part: Part,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        let (copies, decider, found) = self.decide(part, addr, expected, desired)?;
        let won = found == expected;
        if !won
            && (!self.set.newer(addr.region, found, expected)
                || mutated!(self.set, replica_no_helping))
        {
            return Ok(found);
        }
        let word = if won { desired } else { found };
        let (order, n) = self.carry_order(&copies, decider);
        Self::assert_carry_order(
            &copies,
            decider,
            &order[..n],
            mutated!(self.set, catch_up_from_decider),
        );
        let mut sure = true;
        // The first full copy that holds the word: what receiving copies are carried up to.
        let mut primary = None;
        for &c in &order[..n] {
            let anchor = if c.receiving {
                primary.unwrap_or(decider)
            } else {
                decider
            };
            let advanced = self.carry(addr, c, word, anchor, decider);
            if c.is_full() && matches!(advanced, Ok(Advance::Holds | Advance::Past)) {
                primary = Some(c);
            }
            match advanced {
                Ok(Advance::Holds | Advance::Gone) => {}
                Ok(Advance::Past) => sure &= !self.fence.is_gone(decider.node),
                Ok(Advance::Diverged) => sure = false,
                // Helping is best effort: the writer or the next helper carries on.
                Err(_) if !won => return Ok(found),
                Err(e) => return Err(e),
            }
        }
        if !mutated!(self.set, no_late_copy_cas) {
            let carried = self.on_late_copies(part, addr, copies, |s, c| {
                if c.is_full() && c.j > decider.j {
                    // A copy after ours in the chain that is full decides now: we decided at a
                    // copy that no longer does, and cannot tell whether our word stands (only
                    // a carrier held up past the join pause gets here).
                    sure = false;
                    return Ok(());
                }
                let anchor = primary.filter(|_| c.receiving).unwrap_or(decider);
                sure &= s.carry(addr, c, word, anchor, decider)? != Advance::Diverged;
                Ok(())
            });
            match carried {
                Ok(()) => {}
                Err(_) if !won => return Ok(found),
                Err(e) => return Err(e),
            }
        }
        if won && !sure {
            return Err(FabricError::Indeterminate { node: decider.node });
        }
        Ok(found)
    }

    /// [`Self::advance`], or with the mutation `receiving_cas_best_effort`, what it did before
    /// rule 8 was kept for CASes: a receiving copy's outcome ignored.
    fn carry(
        &mut self,
        addr: RemoteAddr,
        c: Copy,
        word: u64,
        anchor: Copy,
        decider: Copy,
    ) -> Result<Advance, FabricError> {
        if c.receiving && mutated!(self.set, receiving_cas_best_effort) {
            let _ = self.advance(addr, c, word, anchor, decider);
            return Ok(Advance::Gone);
        }
        self.advance(addr, c, word, anchor, decider)
    }

    /// Carry `word` (an index entry or a page word, which `decider` took) to copy `c`: leave
    /// `c` holding `word` or a later word of the decider's history.
    ///
    /// Never by comparing `word` with what `c` holds: sequence numbers are compared modulo
    /// their width, so a carrier held up across half a sequence's worth of changes (a hot key
    /// makes them within a scheduler quantum) would take `c`'s word for an older one and move
    /// `c` back. Instead each round reads `c`, then the word `anchor` holds now: `anchor` is
    /// the decider, or for a receiving copy the first full copy already carried to, so its
    /// word, read after `c`'s, is at or past both `word` (taken before) and `c`'s (every copy
    /// follows the anchor). `c` is moved from its word to the anchor's by a CAS, which fails,
    /// and is tried again, if another carrier moved `c` in between.
    fn advance(
        &mut self,
        addr: RemoteAddr,
        c: Copy,
        word: u64,
        anchor: Copy,
        decider: Copy,
    ) -> Result<Advance, FabricError> {
        let by_sequence = mutated!(self.set, advance_by_sequence);
        // A receiving copy's anchor, the primary, failed since it was carried to: the decider
        // is at or past it.
        let anchor = match anchor != decider && self.fence.is_gone(anchor.node) {
            true => decider,
            false => anchor,
        };
        let a = self.at(addr, c);
        let from = self.at(addr, anchor);
        for _ in 0..MAX_ADVANCE_ROUNDS {
            let Some(cur) = self.on_copy(c, false, |e| e.read_u64(a))? else {
                return Ok(Advance::Gone);
            };
            if cur == word {
                return Ok(Advance::Holds);
            }
            if by_sequence {
                // As before the anchor: `word` unless `cur`'s sequence number looks later.
                if self.set.newer(addr.region, cur, word) {
                    return Ok(Advance::Past);
                }
                if self.set.same_seq(addr.region, cur, word) {
                    return Ok(Advance::Diverged);
                }
            }
            if self.stale(decider) || !by_sequence && self.fence.is_gone(anchor.node) {
                return Err(FabricError::Indeterminate { node: decider.node });
            }
            let to = match by_sequence {
                true => word,
                false => {
                    let Some(to) = self.on_copy(anchor, false, |e| e.read_u64(from))? else {
                        return Err(FabricError::Indeterminate { node: decider.node });
                    };
                    if to == cur {
                        // Level with the anchor, which has moved past `word`.
                        return Ok(Advance::Past);
                    }
                    // What a receiving copy held is not trusted (catching up replaces it
                    // whatever it is); a full copy with the anchor's sequence number but
                    // another word holds a word of another history.
                    if !c.receiving && self.set.same_seq(addr.region, cur, to) {
                        return Ok(Advance::Diverged);
                    }
                    to
                }
            };
            let moved = match self.carry_cas(c, a, cur, to, decider)? {
                Carry::Done(moved) => moved,
                Carry::LookAgain => continue,
            };
            match moved {
                None => return Ok(Advance::Gone),
                Some(was) if was == cur && to == word => return Ok(Advance::Holds),
                Some(was) if was == cur => return Ok(Advance::Past),
                Some(_) => {}
            }
        }
        Err(FabricError::Transport(format!(
            "copy {} of {addr} kept changing while it was advanced",
            c.j
        )))
    }

    /// CAS of a data-region word (a DTE header): the decider, then the same CAS on every other
    /// copy (receiving ones last, any placed meanwhile too), which fails harmlessly where a
    /// later write already replaced the word.
    fn cas_data(
        &mut self,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        let part = self.part(addr);
        let (copies, decider, found) = self.decide(part, addr, expected, desired)?;
        if found != expected {
            return Ok(found);
        }
        let (order, n) = self.carry_order(&copies, decider);
        for &c in &order[..n] {
            self.cas_copy(addr, c, expected, desired, decider)?;
        }
        if !mutated!(self.set, no_late_copy_cas) {
            self.on_late_copies(part, addr, copies, |s, c| {
                s.cas_copy(addr, c, expected, desired, decider)
            })?;
        }
        Ok(found)
    }

    /// One copy's share of [`Self::cas_data`].
    fn cas_copy(
        &mut self,
        addr: RemoteAddr,
        c: Copy,
        expected: u64,
        desired: u64,
        decider: Copy,
    ) -> Result<(), FabricError> {
        let a = self.at(addr, c);
        if c.receiving && mutated!(self.set, receiving_cas_best_effort) {
            let _ = self.carry_cas(c, a, expected, desired, decider);
            return Ok(());
        }
        for _ in 0..MAX_ADVANCE_ROUNDS {
            if let Carry::Done(_) = self.carry_cas(c, a, expected, desired, decider)? {
                return Ok(());
            }
            // The lease was renewed after lapsing: the decider may have been declared failed
            // meanwhile, and its successor may decide on this word (rule 6).
            if self.stale(decider) || self.fence.is_gone(decider.node) {
                return Err(FabricError::Indeterminate { node: decider.node });
            }
        }
        Err(FabricError::Indeterminate { node: decider.node })
    }

    /// A carrier's CAS of copy `c`'s word at `a` from `cur` to `to`, for a CAS decided at
    /// `decider`: `Done(None)` if the copy's node is gone (`on_copy`).
    ///
    /// This node's lease is checked just before it (rule 6). A carrier paused past its lease
    /// (SIGSTOP, a VM stall) may have missed a failure: the decider's, or its own. The
    /// successor may have moved `c` on since, and `to`, read from an anchor the fence still
    /// trusts, may be a stale word. Its fence learns only after the pause. So past the lease
    /// the CAS is not made. The carrier waits, until a settle time after the lapse
    /// ([`Self::lease_renewed`]), for the monitor to renew the lease (with a fresh view), then
    /// looks again (`LookAgain`: the caller reads the copy and its anchor afresh, and its
    /// failover checks see the view). A lease that is not renewed in time, as for a node
    /// declared failed, leaves the decided word's fate unknown: `Indeterminate`.
    fn carry_cas(
        &mut self,
        c: Copy,
        a: RemoteAddr,
        cur: u64,
        to: u64,
        decider: Copy,
    ) -> Result<Carry, FabricError> {
        let mut lease = self.lease_check(mutated!(self.set, carrier_ignores_lease));
        let moved = self.on_copy(c, false, |e| {
            lease.check(e)?;
            e.compare_and_swap(a, cur, to)
        });
        match moved {
            Ok(m) => Ok(Carry::Done(m)),
            // Only the lease check above refuses with `Fenced` here.
            Err(FabricError::Fenced { .. }) => match self.lease_renewed(lease.lapsed) {
                true => Ok(Carry::LookAgain),
                false => Err(FabricError::Indeterminate { node: decider.node }),
            },
            Err(e) => Err(e),
        }
    }

    /// Whether this node's lease, found lapsed at `lapsed`, is renewed within a settle time of
    /// that (the monitor renews it within a TTL of hearing from etcd again, unless the node was
    /// declared failed). Measured from the lapse, not from now: a node declared failed rejoins only
    /// after a hold of more than a settle time from its failure, so no renewal seen here is a
    /// rejoin's (whose catch-up may have replaced the decided word: acknowledging it then
    /// would report a lost word as a win). A lease of 0 (not up, stepped down) is not renewed.
    fn lease_renewed(&mut self, lapsed: u64) -> bool {
        if lapsed == 0 {
            return false;
        }
        let give_up = lapsed.saturating_add(self.set.settle_ns);
        loop {
            if self.check_fence().is_ok() {
                return true;
            }
            if self.fence_now() >= give_up {
                return false;
            }
            self.inner.sleep_ns(RETRY_PAUSE_NS);
        }
    }
}

/// This node's lease as a check made just before each try of a carrier's CAS or a plain
/// write, inside [`Replicated::on_copy`] (which lends out the inner endpoint, not the fence):
/// each try reads the deadline afresh, so a step-down (lease 0) during retries stops them.
struct LeaseCheck {
    /// `None` without membership (the lease never lapses: no clock read) or when the
    /// mutation skips the check.
    fence: Option<Arc<Fence>>,
    wall: bool,
    /// The deadline the last check read (0 before any).
    lapsed: u64,
}

impl LeaseCheck {
    fn check<E: Endpoint>(&mut self, e: &E) -> Result<(), FabricError> {
        let Some(fence) = &self.fence else {
            return Ok(());
        };
        self.lapsed = fence.lease_until();
        fenced_after(e, self.wall, self.lapsed)
    }
}

impl<E: Endpoint> Replicated<E> {
    /// The lease check of a carrier or a writer; `skip` for the mutations that leave it out.
    fn lease_check(&self, skip: bool) -> LeaseCheck {
        let membership = self.fence.lease_until() != u64::MAX;
        LeaseCheck {
            fence: (membership && !skip).then(|| self.fence.clone()),
            wall: self.on_wall_clock(),
            lapsed: 0,
        }
    }
}

/// What a carrier's CAS did ([`Replicated::carry_cas`]).
enum Carry {
    /// It was made: what the copy held (`None`: the copy's node is gone).
    Done(Option<u64>),
    /// It was not made (this node's lease had lapsed, and has been renewed since): read the
    /// copy and its anchor again.
    LookAgain,
}

impl<E: Endpoint> Replicated<E> {
    /// The end (offset) of the run of bytes from `addr` that have the same copies: the end of
    /// `addr`'s index partition once some partition moved or migrates, else `end` (a scan of
    /// a node's index pays one READ per span, not per partition, until then). A move recorded
    /// after this is met by [`Self::read_index_run`], which checks again.
    fn same_copies_until(&self, addr: RemoteAddr, end: u64) -> u64 {
        match self.index_split(addr.region) {
            Some(p) => {
                let (q, _) = p.of_home_offset(addr.node, addr.offset);
                end.min(p.home_offset(q) + p.len(q) * 8)
            }
            None => end,
        }
    }

    /// Run `each` on the runs of `len` bytes from `addr` that have the same copies, with the
    /// run's address and its range in the buffer.
    fn by_runs(
        &mut self,
        addr: RemoteAddr,
        len: usize,
        mut each: impl FnMut(&mut Self, RemoteAddr, std::ops::Range<usize>) -> Result<(), FabricError>,
    ) -> Result<(), FabricError> {
        let end = addr.offset + len as u64;
        let mut at = addr.offset;
        loop {
            let until = self.same_copies_until(RemoteAddr { offset: at, ..addr }, end);
            let r = (at - addr.offset) as usize..(until - addr.offset) as usize;
            each(self, RemoteAddr { offset: at, ..addr }, r)?;
            if until >= end {
                return Ok(());
            }
            at = until;
        }
    }
}

impl<E: Endpoint> Endpoint for Replicated<E> {
    fn read(&mut self, addr: RemoteAddr, buf: &mut [u8]) -> Result<(), FabricError> {
        if !self.replicated(addr.region) {
            return self.inner.read(addr, buf);
        }
        match addr.region {
            INDEX_REGION => self.read_index(addr, buf),
            _ => self.read_primary(addr, buf),
        }
    }

    fn write(&mut self, addr: RemoteAddr, buf: &[u8]) -> Result<(), FabricError> {
        if !self.replicated(addr.region) {
            return self.inner.write(addr, buf);
        }
        self.by_runs(addr, buf.len(), |s, a, r| {
            s.write_all(a, &buf[r], false, Access::DataWrite)
        })
    }

    fn compare_and_swap(
        &mut self,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        match addr.region {
            _ if !self.replicated(addr.region) => {
                self.inner.compare_and_swap(addr, expected, desired)
            }
            INDEX_REGION => self.cas_index(addr, expected, desired),
            PAGE_REGION => self.cas_ordered(self.part(addr), addr, expected, desired),
            _ => self.cas_data(addr, expected, desired),
        }
    }

    fn local_read(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        // Copy 0 of our own partition is in our memory, and it is the primary while we are a
        // member. A node that failed and came back holds nothing until it is given its data
        // again, and one whose copies moved away while it was failed holds none of its own
        // partition for good: it reads the copies the others hold.
        if self.replicated(region) {
            let me = self.inner.node();
            // Once an index partition moved on its own, our own index table may no longer hold
            // copy 0 of every partition of it: such reads go by the copies.
            // Where index partitions can move, our own table may no longer hold copy 0 of each
            // of them (moved, or fenced by a migration our view does not know yet): reads go by
            // the chains, which never return a fenced word.
            // Nor once our read cut-over is near (rule 7a): others read the copy after ours
            // from it on, and so must we.
            if self.fence.role(me) != NodeRole::Full
                || self.fence.moved_copy(me, 0).is_some()
                || region == INDEX_REGION && self.set.index_slots.is_some()
                || self.near_cut_over(me)
            {
                return self.read(RemoteAddr::new(me, region, offset), buf);
            }
            if self.fence.rejoined(me) {
                self.wait_join_settled(
                    Part::Tables(me),
                    Access::of(Part::Tables(me), region, Access::DataRead),
                );
            }
            self.wait_fresh_view()?;
            // Again after the waits, which may have taken us to it.
            if self.near_cut_over(me) {
                return self.read(RemoteAddr::new(me, region, offset), buf);
            }
        }
        self.inner.local_read(region, offset, buf)
    }

    fn local_write(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &[u8],
    ) -> Result<(), FabricError> {
        if !self.replicated(region) {
            return self.inner.local_write(region, offset, buf);
        }
        let addr = RemoteAddr::new(self.inner.node(), region, offset);
        self.by_runs(addr, buf.len(), |s, a, r| {
            s.write_all(a, &buf[r], true, Access::DataWrite)
        })
    }

    fn write_unordered(&mut self, addr: RemoteAddr, buf: &[u8]) -> Result<(), FabricError> {
        let local = addr.node == self.inner.node();
        if !self.replicated(addr.region) {
            return match local {
                true => self.inner.local_write(addr.region, addr.offset, buf),
                false => self.inner.write(addr, buf),
            };
        }
        self.by_runs(addr, buf.len(), |s, a, r| {
            s.write_all(a, &buf[r], local, Access::Unordered)
        })
    }

    /// Straight to the wrapped endpoint (natively batched where it can) when no operation
    /// touches replicated memory; otherwise op by op (the default), each through the copy
    /// logic above, which needs its own sequence of operations per write.
    fn run_batch(&mut self, batch: &mut Batch<'_>) {
        if batch.ops().any(|op| self.replicated(op.addr().region)) {
            batch.run_sequentially(self)
        } else {
            self.inner.run_batch(batch)
        }
    }

    fn overlaps_batches(&self, region: RegionId) -> bool {
        !self.replicated(region) && self.inner.overlaps_batches(region)
    }

    nessie_fabric::forward_endpoint!(field inner);
}

/// `Err(Fenced)` once the fence deadline `until` has passed on `ep`'s clock (the wall clock
/// with `wall`, else the monotonic one); `u64::MAX` never passes.
fn fenced_after<E: Endpoint>(ep: &E, wall: bool, until: u64) -> Result<(), FabricError> {
    if until == u64::MAX {
        return Ok(()); // no membership: no clock read
    }
    let now = match wall {
        true => ep.now_ns(),
        false => ep.mono_ns(),
    };
    if now < until {
        return Ok(());
    }
    Err(FabricError::Fenced { node: ep.node() })
}

/// Whether operations on node `partition`'s tables wait now, at monotonic `now_ns`, for a copy
/// that became full less than the join settle time ago (a rejoined node's, a moved one):
/// what `Replicated::wait_join_settled` waits for, for an allocator that would rather claim a
/// page elsewhere than wait (`ClassTable::hosts_guarded`).
pub fn tables_settling(set: &ReplicaSet, fence: &Fence, partition: NodeId, now_ns: u64) -> bool {
    let moved = fence.any_moved();
    let settling = |f: Option<u64>, ns: u64| f.is_some_and(|f| f < ns);
    (0..set.replicas).any(|j| {
        let node = fence
            .moved_copy(partition, j)
            .map_or_else(|| set.holder(partition, j), |m| m.node);
        // A claim is a change of a page word: a moved copy holds it up for longer (rule 10a).
        (fence.rejoined(node) && settling(fence.full_for_ns(node, now_ns), set.join_settle_ns()))
            || (moved
                && settling(
                    fence.moved_full_for_ns(partition, j, now_ns),
                    set.moved_change_settle_ns(),
                )
                && !fence.moved_writes_settled(partition, j, now_ns))
    })
}

/// What an allocator may do with node `n`'s pages at monotonic `now_ns`
/// (`ClassTable::hosts_guarded`): never claim those of a standby node (its tables have a copy
/// fewer: `nessie_membership::standby`, SB5); claim those of a node whose tables settle after
/// a copy became full ([`tables_settling`]: a node that just joined, or a moved copy) or whose
/// decider failed less than a settle time ago ([`tables_deciding_waits`]) only when no other
/// node has room, as the claim, under the allocator's lock, would wait.
pub fn host_use(
    set: &ReplicaSet,
    fence: &Fence,
    n: NodeId,
    now_ns: u64,
) -> nessie_store::classtable::HostUse {
    use nessie_store::classtable::HostUse;
    if fence.never_up(n) {
        HostUse::Never
    } else if tables_settling(set, fence, n, now_ns) || tables_deciding_waits(set, fence, n, now_ns)
    {
        HostUse::Avoid
    } else {
        HostUse::Now
    }
}

/// Whether a CAS on node `partition`'s tables waits now, at monotonic `now_ns`, for its
/// decider's failure to settle: a copy after the last live one failed less than the settle
/// time ago, so the copy before it does not decide yet (rule 6; `Replicated::deciding`). As
/// [`tables_settling`], for an allocator that would rather claim a page elsewhere than wait
/// (after a node leaves or fails, the pages of the tables it decided for).
pub fn tables_deciding_waits(
    set: &ReplicaSet,
    fence: &Fence,
    partition: NodeId,
    now_ns: u64,
) -> bool {
    let node = |j: u8| {
        fence
            .moved_copy(partition, j)
            .map_or_else(|| set.holder(partition, j), |m| m.node)
    };
    let Some(last) = (0..set.replicas).rev().find(|&j| !fence.is_gone(node(j))) else {
        return false;
    };
    (last + 1..set.replicas).any(|j| {
        fence
            .gone_for_ns(node(j), now_ns)
            .is_some_and(|g| g < set.settle_ns)
    })
}

/// Which roles a data read takes for a moved copy that became full (rule 10a).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum ReadWindow {
    /// The old ones: the copy is skipped as the receiving copy it was.
    Old,
    /// Neither yet: the read waits.
    Between,
    /// The new ones: the copy is read like any full copy.
    New,
}

/// What an operation does to replicated memory, for the settle waits after a copy became full
/// (`Replicated::wait_join_settled`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Access {
    /// Index entries (of a node's tables or of an index partition's chain): every operation
    /// waits out the join settle time.
    Index,
    /// Reads of data and page words: a moved copy is skipped while it settles, not waited for.
    DataRead,
    /// Plain writes of data and page words: held up twice as long by a moved copy that is the
    /// partition's new primary.
    DataWrite,
    /// CASes of data and page words: held up twice as long by any moved copy.
    DataCas,
    /// Writes whose readers tolerate seeing them on one copy and not yet on another (a recycle
    /// mark): never held up by a moved copy.
    Unordered,
}

impl Access {
    /// `kind`: what the operation would be on a node's data (`DataRead`, `DataWrite`,
    /// `DataCas` or `Unordered`); index entries are always `Index`.
    fn of(part: Part, region: RegionId, kind: Access) -> Self {
        match part {
            Part::Tables(_) if region != INDEX_REGION => kind,
            _ => Access::Index,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nessie_fabric::inproc::{InProcEndpoint, InProcFabric};
    use nessie_store::Ite;

    struct Rig {
        fabric: Arc<InProcFabric>,
        set: Arc<ReplicaSet>,
        fence: Arc<Fence>,
    }

    fn layout() -> IteLayout {
        IteLayout::new(20, 4, 7).unwrap()
    }

    fn rig(replicas: u8, mutations: Mutations) -> Rig {
        let cfg = ProtocolConfig {
            expiry_ns: 5_000_000,
            clock_margin_ns: 0,
            mutations,
            ..ProtocolConfig::default()
        };
        let set = Arc::new(ReplicaSet::new(replicas, 3, layout(), &cfg).unwrap());
        let regions = vec![set.region_sizes(&[64, 64, 8]); 3];
        Rig {
            fabric: InProcFabric::new(&regions, None).unwrap(),
            set,
            fence: Arc::new(Fence::unfenced()),
        }
    }

    impl Rig {
        fn ep(&self, node: NodeId) -> Replicated<InProcEndpoint> {
            Replicated::new(
                self.fabric.endpoint(node),
                self.set.clone(),
                self.fence.clone(),
            )
        }

        /// The word copy `j` of partition 0's first index entry holds.
        fn copy(&self, j: u8) -> u64 {
            let node = self.set.holder(0, j);
            let at = RemoteAddr::new(node, mirror_region(INDEX_REGION, j), 0);
            self.fabric.endpoint(node).read_u64(at).unwrap()
        }
    }

    const ENTRY: RemoteAddr = RemoteAddr::new(0, INDEX_REGION, 0);

    /// The word a CAS from `prev` to an entry naming DTE `dte` installs.
    fn word(prev: u64, dte: u64) -> u64 {
        let l = layout();
        l.successor(Ite(prev), l.encode(1, 0, dte)).0
    }

    /// A writer that died after deciding (the decider holds its word, the primary does not)
    /// would wedge the entry: every CAS expecting the primary's word fails at the decider.
    /// The loser carries the decider's word on, and the next attempt succeeds.
    fn died_after_deciding(mutations: Mutations) -> (bool, Rig) {
        let r = rig(2, mutations);
        let decider = RemoteAddr::new(1, mirror_region(INDEX_REGION, 1), 0);
        let dead = word(0, 7);
        assert_eq!(
            r.fabric
                .endpoint(2)
                .compare_and_swap(decider, 0, dead)
                .unwrap(),
            0
        );
        let mut ep = r.ep(2);
        let mut succeeded = false;
        for _ in 0..3 {
            let seen = ep.read_u64(ENTRY).unwrap();
            let mine = word(seen, 9);
            if ep.compare_and_swap(ENTRY, seen, mine).unwrap() == seen {
                succeeded = true;
                break;
            }
        }
        (succeeded, r)
    }

    #[test]
    fn a_writer_that_died_after_deciding_is_helped_along() {
        let (ok, r) = died_after_deciding(Mutations::default());
        assert!(ok, "the second attempt must succeed");
        assert_eq!(r.copy(0), r.copy(1), "both copies hold the last word");
        assert_eq!(
            layout().seq(Ite(r.copy(0))),
            2,
            "the dead writer's word came first"
        );
    }

    #[test]
    fn without_helping_the_entry_is_wedged() {
        let (ok, r) = died_after_deciding(Mutations {
            replica_no_helping: true,
            ..Mutations::default()
        });
        assert!(!ok, "without helping no attempt can succeed");
        assert_eq!(r.copy(0), 0, "the primary never moved");
    }

    #[test]
    fn advancing_never_moves_a_copy_back() {
        let r = rig(3, Mutations::default());
        let mut ep = r.ep(0);
        let w1 = word(0, 1);
        let w2 = word(w1, 2);
        assert_eq!(ep.compare_and_swap(ENTRY, 0, w1).unwrap(), 0);
        assert_eq!(ep.compare_and_swap(ENTRY, w1, w2).unwrap(), w1);
        let decider = Copy::full(2, 2, 2);
        for j in 0..2 {
            let c = Copy::full(r.set.holder(0, j), j, j);
            assert_eq!(
                ep.advance(ENTRY, c, w1, decider, decider).unwrap(),
                Advance::Past
            );
            assert_eq!(
                ep.advance(ENTRY, c, w2, decider, decider).unwrap(),
                Advance::Holds
            );
        }
        assert!((0..3).all(|j| r.copy(j) == w2));
        // A copy holding a word with the decider's sequence number but another entry holds
        // another history: it is left alone.
        let other = word(w1, 3);
        let copy0 = RemoteAddr::new(0, INDEX_REGION, 0);
        r.fabric
            .endpoint(0)
            .write(copy0, &other.to_le_bytes())
            .unwrap();
        let c = Copy::full(0, 0, 0);
        assert_eq!(
            ep.advance(ENTRY, c, w2, decider, decider).unwrap(),
            Advance::Diverged
        );
        assert_eq!(r.copy(0), other);
    }

    /// Page words are carried in generation order: a stale claim never lands on a copy that
    /// already saw its release.
    #[test]
    fn page_words_advance_in_generation_order() {
        let r = rig(2, Mutations::default());
        let mut ep = r.ep(2);
        let at = RemoteAddr::new(0, PAGE_REGION, 0);
        let free0 = PageWord::free(0).0;
        let claimed = PageWord::claimed_after(PageWord(free0), 2, 3).0;
        let released = PageWord::free(PageWord(claimed).generation()).0;
        assert_eq!(ep.compare_and_swap(at, free0, claimed).unwrap(), free0);
        assert_eq!(ep.compare_and_swap(at, claimed, released).unwrap(), claimed);
        let primary = Copy::full(0, 0, 0);
        let decider = Copy::full(1, 1, 1);
        assert_eq!(
            ep.advance(at, primary, claimed, decider, decider).unwrap(),
            Advance::Past,
            "the claim is older than its release"
        );
        let mut w = [0u8; 8];
        for j in 0..2 {
            let node = r.set.holder(0, j);
            r.fabric
                .endpoint(node)
                .read(
                    RemoteAddr::new(node, mirror_region(PAGE_REGION, j), 0),
                    &mut w,
                )
                .unwrap();
            assert_eq!(u64::from_le_bytes(w), released, "copy {j}");
        }
    }

    #[test]
    fn the_next_copy_decides_only_once_the_failure_is_settled() {
        let r = rig(2, Mutations::default());
        let mut ep = r.ep(2);
        r.fabric.kill_node(1);
        let t0 = ep.mono_ns();
        r.fence.set_gone(1, true);
        let w = word(0, 4);
        assert_eq!(ep.compare_and_swap(ENTRY, 0, w).unwrap(), 0);
        assert!(
            ep.mono_ns() - t0 >= r.set.settle_ns(),
            "the CAS must wait out the settle time"
        );
        assert_eq!(r.copy(0), w);
    }

    #[test]
    fn writes_reach_every_copy_and_reads_move_on_when_the_primary_fails() {
        let r = rig(3, Mutations::default());
        let mut ep = r.ep(1);
        let at = RemoteAddr::new(0, DATA_REGION, 16);
        ep.write(at, &[5u8; 16]).unwrap();
        for j in 0..3 {
            let node = r.set.holder(0, j);
            let mut b = [0u8; 16];
            r.fabric
                .endpoint(node)
                .read(
                    RemoteAddr::new(node, mirror_region(DATA_REGION, j), 16),
                    &mut b,
                )
                .unwrap();
            assert_eq!(b, [5u8; 16], "copy {j}");
        }
        r.fabric.kill_node(0);
        r.fence.set_gone(0, true);
        let mut b = [0u8; 16];
        ep.read(at, &mut b).unwrap();
        assert_eq!(b, [5u8; 16]);
        r.fabric.kill_node(1);
        r.fence.set_gone(1, true);
        let mut survivor = r.ep(2);
        survivor.read(at, &mut b).unwrap();
        assert_eq!(b, [5u8; 16], "the last copy still serves");
        r.fabric.kill_node(2);
        r.fence.set_gone(2, true);
        assert!(matches!(
            r.ep(2).read(at, &mut b),
            Err(FabricError::NoCopy { node: 0 }) | Err(FabricError::Unreachable { .. })
        ));
    }

    /// Table sizes of [`spare_rig`]'s nodes.
    const SPARE_RIG_TABLES: [u64; 3] = [64, 64, 8];

    /// Three nodes, two copies and one spare slot each.
    fn spare_rig(mutations: Mutations) -> (Arc<ReplicaSet>, Arc<InProcFabric>, Arc<Fence>) {
        spare_rig_expiring(mutations, 5_000_000)
    }

    fn spare_rig_expiring(
        mutations: Mutations,
        expiry_ns: u64,
    ) -> (Arc<ReplicaSet>, Arc<InProcFabric>, Arc<Fence>) {
        let cfg = ProtocolConfig {
            expiry_ns,
            clock_margin_ns: 0,
            mutations,
            ..ProtocolConfig::default()
        };
        let set = ReplicaSet::new(2, 3, layout(), &cfg).unwrap();
        let set = Arc::new(set.with_spare_copies(1).unwrap());
        let regions = vec![set.region_sizes(&SPARE_RIG_TABLES); 3];
        let fabric = InProcFabric::new(&regions, None).unwrap();
        (set, fabric, Arc::new(Fence::unfenced()))
    }

    /// The allocator's host guard refuses a node's tables while a CAS there would wait for
    /// the decider's failure to settle: the last copy failed less than the settle time ago.
    /// A failed primary with a live copy after it decides at once; the settle time ends it.
    #[test]
    fn tables_whose_decider_failed_just_now_are_refused_for_the_settle_time() {
        let (set, _fabric, fence) = spare_rig(Mutations::default());
        let now = nessie_fabric::monotonic_ns;
        assert!((0..3).all(|p| !tables_deciding_waits(&set, &fence, p, now())));
        // Node 1 fails: it is copy 1 (the decider) of partition 0, copy 0 of partition 1.
        fence.set_gone(1, true);
        assert_eq!((set.holder(0, 1), set.holder(1, 0)), (1, 1));
        assert!(tables_deciding_waits(&set, &fence, 0, now()));
        assert!(
            !tables_deciding_waits(&set, &fence, 1, now()),
            "copy 1 on node 2 decides"
        );
        std::thread::sleep(std::time::Duration::from_nanos(set.settle_ns() + 1_000_000));
        assert!(!tables_deciding_waits(&set, &fence, 0, now()), "settled");
    }

    /// The allocator's host guard (`host_use`): a standby node never, a node whose tables
    /// settle after a moved copy became full only as a last resort, until its time passes or
    /// every node said it reads the copy in the new roles (rule 10c), then as usual.
    #[test]
    fn the_host_guard_avoids_settling_tables_and_never_takes_a_standby_node() {
        use nessie_store::classtable::HostUse;
        // Rule 10a's pause lasts seconds: the steps below fall well inside it.
        let (set, _fabric, fence) = spare_rig_expiring(Mutations::default(), 2_000_000_000);
        let now = nessie_fabric::monotonic_ns;
        assert!((0..3).all(|n| host_use(&set, &fence, n, now()) == HostUse::Now));
        fence.set_never_up(2, true);
        assert_eq!(host_use(&set, &fence, 2, now()), HostUse::Never);
        fence.set_never_up(2, false);
        let at = crate::fence::MovedCopy {
            node: 2,
            slot: 2,
            receiving: false,
        };
        fence.move_copy(0, 1, Some(at));
        assert_eq!(host_use(&set, &fence, 0, now()), HostUse::Avoid, "rule 10a");
        assert_eq!(host_use(&set, &fence, 1, now()), HostUse::Now);
        let change = fence.moved_full_instance(0, 1);
        fence.settle_moved_reads_by(0, 1, change, now());
        assert_eq!(
            host_use(&set, &fence, 0, now()),
            HostUse::Avoid,
            "reads only"
        );
        fence.settle_moved_writes_by(0, 1, change, now());
        assert_eq!(host_use(&set, &fence, 0, now()), HostUse::Now, "rule 10c");
    }

    /// Moves partition 0's copy 1 to node 2's spare slot just before the first write it
    /// sees: as if the writer chose its copies before the move and wrote after it.
    struct MoveDuringWrite {
        fence: Arc<Fence>,
        moved: bool,
    }

    impl nessie_fabric::interpose::Interposer for MoveDuringWrite {
        fn before(&mut self, op: nessie_fabric::interpose::Op) -> Result<(), FabricError> {
            if matches!(op, nessie_fabric::interpose::Op::Write(_)) && !self.moved {
                self.moved = true;
                let to = crate::fence::MovedCopy {
                    node: 2,
                    slot: 2,
                    receiving: true,
                };
                self.fence.move_copy(0, 1, Some(to));
            }
            Ok(())
        }
    }

    /// What a write that chose partition 0's copies just before its copy 1 moved leaves in
    /// the moved copy (node 2, spare slot 2).
    fn write_across_a_move(mutations: Mutations) -> [u8; 16] {
        let (set, fabric, fence) = spare_rig(mutations);
        let hook = MoveDuringWrite {
            fence: fence.clone(),
            moved: false,
        };
        let inner = nessie_fabric::interpose::Interposed::new(fabric.endpoint(1), hook);
        let mut ep = Replicated::new(inner, set, fence);
        ep.write(RemoteAddr::new(0, DATA_REGION, 16), &[5u8; 16])
            .unwrap();
        let mut b = [0u8; 16];
        let moved = RemoteAddr::new(2, mirror_region(DATA_REGION, 2), 16);
        fabric.endpoint(2).read(moved, &mut b).unwrap();
        b
    }

    /// A copy placed while a write was under way gets that write before it returns, so a
    /// write landing after the copier passed is not missing from the new copy for good.
    #[test]
    fn a_write_that_chose_its_copies_before_a_move_reaches_the_moved_copy() {
        assert_eq!(write_across_a_move(Mutations::default()), [5u8; 16]);
        let without = Mutations {
            no_late_copy_writes: true,
            ..Mutations::default()
        };
        assert_eq!(write_across_a_move(without), [0u8; 16], "the control");
    }

    /// Holds a writer between its first and second plain write until told to go on.
    struct PauseBetweenWrites {
        writes: u32,
        first_done: std::sync::mpsc::Sender<()>,
        go: std::sync::mpsc::Receiver<()>,
    }

    impl nessie_fabric::interpose::Interposer for PauseBetweenWrites {
        fn before(&mut self, op: nessie_fabric::interpose::Op) -> Result<(), FabricError> {
            if matches!(op, nessie_fabric::interpose::Op::Write(_)) {
                self.writes += 1;
                if self.writes == 2 {
                    self.first_done.send(()).unwrap();
                    self.go.recv().unwrap();
                }
            }
            Ok(())
        }
    }

    /// A writer on node 1 writes a data word of partition 0, whose copy 1 moved to node 2 and
    /// is receiving; between its write to one copy and to the other, node 2's copier fills the
    /// moved copy to the end. What the two copies then hold.
    fn write_across_a_fill(mutations: Mutations) -> ([u8; 8], [u8; 8]) {
        let (set, fabric, fence) = spare_rig(mutations);
        let tables = SPARE_RIG_TABLES;
        let to = crate::fence::MovedCopy {
            node: 2,
            slot: 2,
            receiving: true,
        };
        fence.move_copy(0, 1, Some(to));
        let (first_done, wait_first) = std::sync::mpsc::channel();
        let (go, wait_go) = std::sync::mpsc::channel();
        let hook = PauseBetweenWrites {
            writes: 0,
            first_done,
            go: wait_go,
        };
        let inner = nessie_fabric::interpose::Interposed::new(fabric.endpoint(1), hook);
        let mut writer = Replicated::new(inner, set.clone(), fence.clone());
        let mut copier = Replicated::new(fabric.endpoint(2), set, fence);
        let at = RemoteAddr::new(0, DATA_REGION, 16);
        std::thread::scope(|s| {
            let w = s.spawn(move || writer.write(at, &[7u8; 8]).unwrap());
            wait_first.recv().unwrap();
            let filled = copier.catch_up(&tables, u64::MAX).unwrap();
            assert_eq!(filled.copies, 1, "{filled:?}");
            go.send(()).unwrap();
            w.join().unwrap();
        });
        let read = |node: NodeId, slot: u8| {
            let mut b = [0u8; 8];
            let a = RemoteAddr::new(node, mirror_region(DATA_REGION, slot), 16);
            fabric.endpoint(node).read(a, &mut b).unwrap();
            b
        };
        (read(0, 0), read(2, 2))
    }

    /// Written after the others, the receiving copy ends with the word the decider holds,
    /// whenever the copier passes; written first, the copier can set it back to the decider's
    /// older word and be done before the decider is written.
    #[test]
    fn a_write_the_copier_overtakes_still_reaches_the_receiving_copy() {
        assert_eq!(write_across_a_fill(Mutations::default()), ([7; 8], [7; 8]));
        let first = Mutations {
            receiving_written_first: true,
            ..Mutations::default()
        };
        assert_eq!(write_across_a_fill(first), ([7; 8], [0; 8]), "the control");
    }

    #[test]
    fn settings_are_checked() {
        let cfg = ProtocolConfig::default();
        let e = |r, n, l| ReplicaSet::new(r, n, l, &cfg).unwrap_err().to_string();
        assert!(e(0, 3, layout()).contains("replicas = 0"));
        assert!(e(4, 5, layout()).contains("not in 1..=3"));
        assert!(e(3, 2, layout()).contains("at least 3 nodes"));
        let no_seq = IteLayout::new(40, 12, 9).unwrap();
        assert!(e(2, 3, no_seq).contains("sequence numbers"));
        assert!(
            ReplicaSet::new(1, 1, no_seq, &cfg).is_ok(),
            "one copy needs none"
        );
    }
}
