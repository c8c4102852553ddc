//! What membership tells the protocol: whether this node may still act (its membership lease
//! holds: fencing) and which nodes' writers are gone (their nodes failed), so that their
//! in-flight writes may be completed by others.
//!
//! A node that cannot renew its lease may have been declared failed by peers that can, who
//! then complete its writers' entries: so its writers start an attempt only if the attempt
//! ends (one expiry period later) before the lease is known to lapse, and a writer of a node
//! declared failed started its last attempt before its lease lapsed, which was before the
//! failure was declared. Entries of a gone node's writers are completed only once their write
//! deadline has passed by the clock margin and one more expiry period
//! (`cd::CdClient::is_abandoned`).
//!
//! Without membership (the default), nothing is fenced and no writer is ever gone: entries of a
//! client that dies wedge their key until a client with the same writer tag retries.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use nessie_fabric::NodeId;
use nessie_store::limits::MAX_NODES;
use nessie_store::partition::{PartitionId, MAX_PARTITIONS};

const WORDS: usize = (MAX_NODES as usize).div_ceil(64);
/// Added to the monotonic instants `full_at_ns` holds, so that one before this process's
/// clock origin (a node that came up again before this process started) is kept as it is
/// rather than clamped to the origin (which would pause its partitions again at our start).
const BEFORE_ORIGIN_NS: u64 = 1 << 62;
/// Copies per partition the copy map has room for (`replica::MAX_REPLICAS`).
const COPIES: usize = 3;

/// Where a copy that moved off its home node is (re-replication): its node and the mirror slot
/// it fills there, and whether it is still receiving (being filled) or full.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MovedCopy {
    pub node: NodeId,
    /// Mirror slot on `node` (`replica::mirror_region`), never 0: slot 0 is the node's own
    /// partition's home copy.
    pub slot: u8,
    pub receiving: bool,
}

impl MovedCopy {
    // Packed in one word, so that an operation reads a copy's place and state at once:
    // bit 31 set (moved), bit 30 receiving, slot in bits 16..24, node in bits 0..16.
    const MOVED: u32 = 1 << 31;
    const RECEIVING: u32 = 1 << 30;

    fn pack(self) -> u32 {
        Self::MOVED
            | if self.receiving { Self::RECEIVING } else { 0 }
            | (self.slot as u32) << 16
            | self.node as u32
    }

    fn unpack(w: u32) -> Option<Self> {
        (w & Self::MOVED != 0).then_some(Self {
            node: w as u16,
            slot: (w >> 16) as u8,
            receiving: w & Self::RECEIVING != 0,
        })
    }
}

/// Where a copy of one *index partition* moved to on its own (`nessie_store::partition`): its
/// node and the index slot it fills there (`ReplicaSet::index_slot_region`), and whether it
/// is still receiving (being filled) or full. A partition's copy that did not move on its own
/// is wherever its home node's tables' copy is ([`MovedCopy`], or at home).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IndexCopy {
    pub node: NodeId,
    /// Index slot on `node`, below [`MAX_INDEX_SLOTS`].
    pub slot: u16,
    pub receiving: bool,
}

/// Most index slots a node may have (the slot number's width in a packed [`IndexCopy`]).
pub const MAX_INDEX_SLOTS: u16 = 1 << 14;

impl IndexCopy {
    // Packed like `MovedCopy`: bit 31 moved, bit 30 receiving, slot in bits 16..30, node in
    // bits 0..16.
    fn pack(self) -> u32 {
        assert!(
            self.slot < MAX_INDEX_SLOTS,
            "index slot {} out of range",
            self.slot
        );
        MovedCopy::MOVED
            | if self.receiving {
                MovedCopy::RECEIVING
            } else {
                0
            }
            | (self.slot as u32) << 16
            | self.node as u32
    }

    fn unpack(w: u32) -> Option<Self> {
        (w & MovedCopy::MOVED != 0).then_some(Self {
            node: w as u16,
            slot: ((w >> 16) & (MAX_INDEX_SLOTS as u32 - 1)) as u16,
            receiving: w & MovedCopy::RECEIVING != 0,
        })
    }
}

/// The moves of one kind of copy (a node's tables, or an index partition), per (partition,
/// chain position): where each moved copy is, packed, and when it became full.
#[derive(Debug)]
struct Moves {
    /// Packed place (0: not moved).
    at: Box<[AtomicU32]>,
    /// Monotonic time a moved copy became full (0: it is not one).
    full_at_ns: Box<[AtomicU64]>,
    /// When the configuration says it became full, on this clock (monotonic plus
    /// `BEFORE_ORIGIN_NS`, the clock margin added; 0: not said): data reads keep the old roles
    /// for a join settle time from the earlier of this and `full_at_ns` (rule 10a).
    said_full_at_ns: Box<[AtomicU64]>,
    /// Whether this fence saw the copy receiving before its last becoming full (that change):
    /// only then may its data reads take the old roles (rule 10c). A process that learns of a
    /// copy already full (started since, or paused through its fill) never read it in the old
    /// roles, and may not begin to once others no longer wait for such reads.
    saw_receiving: Box<[AtomicBool]>,
    /// The configuration's name for the copy's last becoming full (`CopyMove::full_since_ns`;
    /// 0: not said): a new one the fence did not see happen (paused through the copy's
    /// refill at the same place) is a new change all the same.
    full_since_id: Box<[AtomicU64]>,
    /// Monotonic time from which data reads take the new roles, as membership saw every node
    /// that may act say it applied the epoch the copy became full in (rule 10c; 0: not yet).
    reads_by_ns: Box<[AtomicU64]>,
    /// Monotonic time from which changes no longer wait for the copy, as membership saw
    /// every node that may act say it reads it in the new roles (rule 10c; 0: not yet).
    writes_by_ns: Box<[AtomicU64]>,
    /// Whether any copy ever moved (one relaxed load keeps the common case cheap).
    any: AtomicBool,
}

impl Moves {
    fn new(partitions: usize) -> Self {
        let n = partitions * COPIES;
        // One cell per (partition, chain position), all zero (false).
        fn cells<T: Default>(n: usize) -> Box<[T]> {
            (0..n).map(|_| T::default()).collect()
        }
        Self {
            at: cells(n),
            full_at_ns: cells(n),
            said_full_at_ns: cells(n),
            saw_receiving: cells(n),
            full_since_id: cells(n),
            reads_by_ns: cells(n),
            writes_by_ns: cells(n),
            any: AtomicBool::new(false),
        }
    }

    fn index(partition: usize, j: u8) -> usize {
        assert!((j as usize) < COPIES, "chain position {j} out of range");
        partition * COPIES + j as usize
    }

    /// Record copy `j` of `partition` at `packed` (0: back home). A copy that stops receiving,
    /// or comes full to another node, records when, for the pause after it.
    fn record(&self, partition: usize, j: u8, packed: u32, receiving: bool) {
        let i = Self::index(partition, j);
        let was = self.at[i].load(Ordering::SeqCst);
        if packed != 0 {
            self.any.store(true, Ordering::SeqCst);
            let node = |w: u32| w & 0xffff;
            let was_receiving = was & MovedCopy::RECEIVING != 0;
            let full_now = !receiving && (was == 0 || was_receiving || node(was) != node(packed));
            if full_now {
                // The old roles first, then what was said of the change before: a reader of
                // the new one never sees the old one's cells. Seen receiving only if this
                // fence still holds that (`Fence::forget_old_roles` clears it).
                let saw = was_receiving
                    && node(was) == node(packed)
                    && self.saw_receiving[i].load(Ordering::SeqCst);
                self.saw_receiving[i].store(saw, Ordering::SeqCst);
                self.forget_settled(i);
                let now = nessie_fabric::monotonic_ns();
                self.full_at_ns[i].store(now.max(1), Ordering::SeqCst);
            } else if receiving {
                self.full_at_ns[i].store(0, Ordering::SeqCst);
                self.forget_settled(i);
                self.full_since_id[i].store(0, Ordering::SeqCst);
                self.saw_receiving[i].store(true, Ordering::SeqCst);
            }
        }
        self.at[i].store(packed, Ordering::SeqCst);
    }

    /// Record copy `j` of `partition` at `packed`, full, with no pause after it: a place the
    /// partition's operations already use (the target of a migration that ends).
    fn record_quietly(&self, partition: usize, j: u8, packed: u32) {
        let i = Self::index(partition, j);
        if packed != 0 {
            self.any.store(true, Ordering::SeqCst);
        }
        self.full_at_ns[i].store(0, Ordering::SeqCst);
        self.forget_settled(i);
        self.full_since_id[i].store(0, Ordering::SeqCst);
        self.saw_receiving[i].store(false, Ordering::SeqCst);
        self.at[i].store(packed, Ordering::SeqCst);
    }

    /// Forget what the configuration and membership said of the copy's last becoming full.
    fn forget_settled(&self, i: usize) {
        self.said_full_at_ns[i].store(0, Ordering::SeqCst);
        self.reads_by_ns[i].store(0, Ordering::SeqCst);
        self.writes_by_ns[i].store(0, Ordering::SeqCst);
    }

    /// When the copy became full here, as an identity of that change (0: not full).
    fn instance(&self, partition: usize, j: u8) -> u64 {
        let w = self.get(partition, j);
        let at = self.full_at_ns[Self::index(partition, j)].load(Ordering::SeqCst);
        if w == 0 || w & MovedCopy::RECEIVING != 0 {
            0
        } else {
            at
        }
    }

    /// Bring `cell` (of the copy's change `instance`) forward to `end_ns` (never back), if the
    /// copy still shows that change.
    fn settle_by(&self, cell: &[AtomicU64], partition: usize, j: u8, instance: u64, end_ns: u64) {
        let i = Self::index(partition, j);
        if instance == 0 || self.instance(partition, j) != instance {
            return;
        }
        let end = end_ns.max(1);
        cell[i]
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
                (cur == 0 || end < cur).then_some(end)
            })
            .ok();
        if self.instance(partition, j) != instance {
            // Became full again meanwhile: what was said was of the change before.
            cell[i].store(0, Ordering::SeqCst);
        }
    }

    /// Whether `cell` says the copy's pause ended by `now_ns`.
    fn settled(&self, cell: &[AtomicU64], partition: usize, j: u8, now_ns: u64) -> bool {
        if self.instance(partition, j) == 0 {
            return false;
        }
        let by = cell[Self::index(partition, j)].load(Ordering::SeqCst);
        by != 0 && now_ns >= by
    }

    fn get(&self, partition: usize, j: u8) -> u32 {
        if !self.any.load(Ordering::Relaxed) {
            return 0;
        }
        self.at[Self::index(partition, j)].load(Ordering::SeqCst)
    }

    /// How long the moved copy has been full at `now_ns`; `None` if it did not move or is
    /// still receiving.
    fn full_for_ns(&self, partition: usize, j: u8, now_ns: u64) -> Option<u64> {
        let w = self.get(partition, j);
        let at = self.full_at_ns[Self::index(partition, j)].load(Ordering::SeqCst);
        (w != 0 && w & MovedCopy::RECEIVING == 0 && at != 0).then(|| now_ns.saturating_sub(at))
    }

    /// Record that the configuration says the moved copy became full `ago_ns` ago, in the
    /// change it names `id` (`CopyMove::full_since_ns`). Within one change the time only ever
    /// moves earlier: each epoch repeats it, read against a clock that moves on between two
    /// readings, and a later one would take a reader that had left the old roles back to them
    /// (after it said it had: rule 10c). A name the fence has not seen before, while the copy
    /// looked full all along, is a change it missed (paused through a refill at the same
    /// place): it starts anew, as if just learnt, and without the old roles.
    fn set_said_full_since(&self, partition: usize, j: u8, ago_ns: u64, id: u64) {
        let i = Self::index(partition, j);
        let w = self.at[i].load(Ordering::SeqCst);
        if w == 0 || w & MovedCopy::RECEIVING != 0 {
            return; // not full here (yet): nothing pauses after it
        }
        // Full here without a time: placed at start, quietly; said full by a change, it is
        // one this fence missed (a refill at the same place), as is a new name.
        let quiet = self.full_at_ns[i].load(Ordering::SeqCst) == 0;
        let was = self.full_since_id[i].swap(id, Ordering::SeqCst);
        if quiet || (was != 0 && was != id) {
            self.saw_receiving[i].store(false, Ordering::SeqCst);
            self.forget_settled(i);
            let now = nessie_fabric::monotonic_ns();
            self.full_at_ns[i].store(now.max(1), Ordering::SeqCst);
        }
        let at = (nessie_fabric::monotonic_ns() + BEFORE_ORIGIN_NS).saturating_sub(ago_ns);
        self.said_full_at_ns[i]
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
                (cur == 0 || at.max(1) < cur).then_some(at.max(1))
            })
            .ok();
    }

    /// Whether data reads of the copy may take the old roles on this fence (rule 10c).
    fn may_read_old(&self, partition: usize, j: u8) -> bool {
        self.saw_receiving[Self::index(partition, j)].load(Ordering::SeqCst)
    }

    /// How long the moved copy has been full at `now_ns`: since this fence learnt of it, and
    /// since the earlier of that and when the configuration says so.
    fn read_full_for_ns(&self, partition: usize, j: u8, now_ns: u64) -> Option<(u64, u64)> {
        let learnt = self.full_for_ns(partition, j, now_ns)?;
        let said = self.said_full_at_ns[Self::index(partition, j)].load(Ordering::SeqCst);
        let by_config = (said != 0).then(|| (now_ns + BEFORE_ORIGIN_NS).saturating_sub(said));
        Some((learnt, by_config.map_or(learnt, |c| c.max(learnt))))
    }
}

/// One node's view of membership, shared by its client workers.
#[derive(Debug)]
pub struct Fence {
    /// Monotonic ns (`nessie_fabric::monotonic_ns`, this process's clock) until which this
    /// node's lease is known to hold. Never the wall clock: the node sets and checks it itself,
    /// and a backward step of its wall clock must not stretch it.
    lease_until_ns: AtomicU64,
    /// Monotonic ns until which this node's view of membership is fresh enough to read by
    /// (replication: `crate::replica`).
    view_until_ns: AtomicU64,
    /// One bit per node: its writers are gone.
    gone: [AtomicU64; WORDS],
    /// Per node, the monotonic time (`nessie_fabric::monotonic_ns`) at which it was declared
    /// gone: replication lets a copy take over deciding CASes only once its predecessor has
    /// been gone for the settle time (`crate::replica`).
    gone_at_ns: Box<[AtomicU64]>,
    /// One bit per node: it is receiving its copies again after a restart (`joining`): its
    /// copies are written like any other, but not read and not decided at (`crate::replica`).
    receiving: [AtomicU64; WORDS],
    /// One bit per node: it has never been up since the cluster started (a standby node, until
    /// it is up: `nessie_membership::standby`). Nobody has written its tables, and nobody read
    /// its copies, so nobody waits for readers of them.
    never_up: [AtomicU64; WORDS],
    /// Per node, the monotonic time (plus [`BEFORE_ORIGIN_NS`]) at which it became a full
    /// member again (after being gone or receiving); 0 if it never stopped being one.
    /// Replication pauses the partitions whose copies it holds for a while after that, so that
    /// no operation uses the copy in its new role while another still uses the old roles. Set
    /// from the configuration ([`Self::set_full_since`]), on every node, and when this fence
    /// sees the change, whichever is later.
    full_at_ns: Box<[AtomicU64]>,
    /// Per node, the incarnation (`incarnation_ns`) whose coming back [`Self::set_full_since`]
    /// last recorded: each is recorded once (every epoch repeats it, and a reading taken late
    /// would only move the pause later).
    full_since_of: Box<[AtomicU64]>,
    /// Per node, the wall-clock time (ns since the Unix epoch) at which its current
    /// incarnation joined (0: the first one). Entries its earlier incarnations left in flight
    /// are abandoned, as a failed node's are.
    incarnation_ns: Box<[AtomicU64]>,
    /// The copy map's changes: per (node partition, chain position), where the copy of a
    /// node's tables is if it moved off its home node (none: at home, `ReplicaSet::holder`),
    /// and when a moved copy became full (as after a rejoin, the partition pauses for a while
    /// after that). Written by membership with each epoch that moves copies.
    moved: Moves,
    /// The same for copies of index partitions moved on their own, into index slots.
    index_moved: Moves,
    /// The chain an index partition is migrating to (the per-ITE handover,
    /// `replica/handover.rs`): its copies, all in index slots, while the partition migrates.
    index_target: Moves,
    /// Per node, its copies' read cut-over (a leaving node, rule 7a of `docs/protocol.md`):
    /// on this clock (monotonic plus [`BEFORE_ORIGIN_NS`]), the last instant they may be read
    /// (`[0]`), the first from which they are not (`[1]`: the two are the cut-over time the
    /// configuration names, less and plus the clock margin), and when this fence learnt of it
    /// (`[2]`, monotonic), and the instant as named (`[3]`, wall ns: a different one is
    /// another incarnation's). All 0: none.
    cut_over_ns: Box<[[AtomicU64; 4]]>,
    /// Whether any node has a cut-over (one relaxed load keeps the common case cheap).
    any_cut_over: AtomicBool,
}

/// Where a node's copies stand against their read cut-over ([`Fence::cut_over`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CutOver {
    /// Read as before (no cut-over, or it is still ahead by more than the clock margin).
    Before,
    /// Within the clock margin of it, or past it and learnt of less than the read settle time
    /// ago (a node that has not heard may still read the copies): read neither, wait.
    Around,
    /// Past it: nobody reads the copies any more.
    Past,
}

/// A node's part in the current epoch, as replication and completion see it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum NodeRole {
    /// Up: its copies are read, written and decided at.
    Full,
    /// Restarted and receiving its copies (`joining`): written, not read, not decided at; its
    /// own workers do not write.
    Receiving,
    /// Failed: its writers are gone, its copies are left (after the settle time).
    Gone,
}

impl Default for Fence {
    fn default() -> Self {
        Self::unfenced()
    }
}

impl Fence {
    /// No membership: never fenced, nobody gone.
    pub fn unfenced() -> Self {
        Self {
            lease_until_ns: AtomicU64::new(u64::MAX),
            view_until_ns: AtomicU64::new(u64::MAX),
            gone: std::array::from_fn(|_| AtomicU64::new(0)),
            gone_at_ns: (0..MAX_NODES).map(|_| AtomicU64::new(0)).collect(),
            receiving: std::array::from_fn(|_| AtomicU64::new(0)),
            never_up: std::array::from_fn(|_| AtomicU64::new(0)),
            full_at_ns: (0..MAX_NODES).map(|_| AtomicU64::new(0)).collect(),
            full_since_of: (0..MAX_NODES).map(|_| AtomicU64::new(0)).collect(),
            incarnation_ns: (0..MAX_NODES).map(|_| AtomicU64::new(0)).collect(),
            moved: Moves::new(MAX_NODES as usize),
            index_moved: Moves::new(MAX_PARTITIONS as usize),
            index_target: Moves::new(MAX_PARTITIONS as usize),
            cut_over_ns: (0..MAX_NODES)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            any_cut_over: AtomicBool::new(false),
        }
    }

    /// Record until when (monotonic ns) this node's lease is known to hold.
    pub fn set_lease_until(&self, ns: u64) {
        self.lease_until_ns.store(ns, Ordering::SeqCst);
    }

    pub fn lease_until(&self) -> u64 {
        self.lease_until_ns.load(Ordering::SeqCst)
    }

    /// Record until when (monotonic ns) this node's view of membership is fresh.
    pub fn set_view_until(&self, ns: u64) {
        self.view_until_ns.store(ns, Ordering::SeqCst);
    }

    pub fn view_until(&self) -> u64 {
        self.view_until_ns.load(Ordering::SeqCst)
    }

    /// Whether this node's view of membership is fresh at `now_ns` (monotonic).
    pub fn may_read(&self, now_ns: u64) -> bool {
        now_ns < self.view_until()
    }

    /// Whether an attempt of `span_ns` starting at `now_ns` (monotonic) ends before the lease
    /// may lapse.
    pub fn may_act(&self, now_ns: u64, span_ns: u64) -> bool {
        now_ns.saturating_add(span_ns) < self.lease_until()
    }

    /// Record whether `node`'s writers are gone (the node failed in the current epoch).
    pub fn set_gone(&self, node: NodeId, gone: bool) {
        self.set_role(node, if gone { NodeRole::Gone } else { NodeRole::Full });
    }

    /// Record `node`'s role in the current epoch, and when it changed (see the fields).
    pub fn set_role(&self, node: NodeId, role: NodeRole) {
        let (w, bit) = (node as usize / 64, 1u64 << (node % 64));
        let was = self.role(node);
        if was == role {
            return;
        }
        let now = nessie_fabric::monotonic_ns();
        match role {
            NodeRole::Gone => {
                self.gone_at_ns[node as usize].store(now, Ordering::SeqCst);
                self.gone[w].fetch_or(bit, Ordering::SeqCst);
                self.receiving[w].fetch_and(!bit, Ordering::SeqCst);
            }
            NodeRole::Receiving => {
                self.receiving[w].fetch_or(bit, Ordering::SeqCst);
                self.gone[w].fetch_and(!bit, Ordering::SeqCst);
            }
            NodeRole::Full => {
                self.full_at_ns[node as usize].fetch_max(now + BEFORE_ORIGIN_NS, Ordering::SeqCst);
                self.gone[w].fetch_and(!bit, Ordering::SeqCst);
                self.receiving[w].fetch_and(!bit, Ordering::SeqCst);
            }
        }
    }

    /// Record whether `node` has never been up since the cluster started (a standby node, until
    /// it is up). Once it is no longer so, a gone node counts as gone from now: a fence that
    /// missed the epochs in which it was up does not know when it failed.
    pub fn set_never_up(&self, node: NodeId, never: bool) {
        let (w, bit) = (node as usize / 64, 1u64 << (node % 64));
        if never {
            self.never_up[w].fetch_or(bit, Ordering::SeqCst);
            return;
        }
        let was = self.never_up[w].fetch_and(!bit, Ordering::SeqCst);
        if was & bit != 0 && self.is_gone(node) {
            let now = nessie_fabric::monotonic_ns();
            self.gone_at_ns[node as usize].store(now, Ordering::SeqCst);
        }
    }

    /// Whether `node` has never been up ([`Self::set_never_up`]).
    pub fn never_up(&self, node: NodeId) -> bool {
        let (w, bit) = (node as usize / 64, 1u64 << (node % 64));
        self.never_up[w].load(Ordering::SeqCst) & bit != 0
    }

    /// `node`'s role in the current epoch.
    pub fn role(&self, node: NodeId) -> NodeRole {
        let (w, bit) = (node as usize / 64, 1u64 << (node % 64));
        if self.gone[w].load(Ordering::SeqCst) & bit != 0 {
            NodeRole::Gone
        } else if self.receiving[w].load(Ordering::SeqCst) & bit != 0 {
            NodeRole::Receiving
        } else {
            NodeRole::Full
        }
    }

    /// Record what the configuration says: `node`, a full member, came back (a later
    /// incarnation joined and caught up) `ago_ns` ago. Every node pauses after that, not only
    /// those whose fence saw the node change role: a fence made after the change (a process
    /// started meanwhile, a monitor started after the epoch) sees no change, and would
    /// otherwise use the node's copies in their new roles at once, while nodes that learnt of
    /// the change late may still use the old ones (`replica::Replicated::wait_join_settled`).
    /// Keeps the later of this and a change seen here; recorded once per incarnation of
    /// `node` (`Self::incarnation`, set first).
    pub fn set_full_since(&self, node: NodeId, ago_ns: u64) {
        let incarnation = self.incarnation(node);
        if self.role(node) != NodeRole::Full
            || self.full_since_of[node as usize].swap(incarnation, Ordering::SeqCst) == incarnation
                && incarnation != 0
        {
            return;
        }
        let at = (nessie_fabric::monotonic_ns() + BEFORE_ORIGIN_NS).saturating_sub(ago_ns);
        self.full_at_ns[node as usize].fetch_max(at.max(1), Ordering::SeqCst);
    }

    /// End the pause after `node` came back (`pause_ns` long, from [`Self::full_for_ns`]) by
    /// monotonic time `end_ns` at the latest: membership saw every node that may act say it
    /// knows the node is full, and `end_ns` is an operation's time after that, when no
    /// operation in the old roles is left. Only ever shortens the pause of the comeback in
    /// force, that of the incarnation that joined at `joined_ns` (wall clock, as
    /// [`Self::set_incarnation`] records it); a later one, recorded by `set_role` or
    /// [`Self::set_full_since`], starts anew.
    pub fn settle_join_by(&self, node: NodeId, joined_ns: u64, pause_ns: u64, end_ns: u64) {
        if self.role(node) != NodeRole::Full || self.incarnation(node) != joined_ns {
            return;
        }
        let at = end_ns
            .saturating_add(BEFORE_ORIGIN_NS)
            .saturating_sub(pause_ns)
            .max(1);
        let cell = &self.full_at_ns[node as usize];
        let mut cur = cell.load(Ordering::SeqCst);
        while cur != 0 && at < cur {
            match cell.compare_exchange(cur, at, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// How long `node` has been a full member again at monotonic time `now_ns`; `None` if it
    /// is not one, or never stopped being one.
    pub fn full_for_ns(&self, node: NodeId, now_ns: u64) -> Option<u64> {
        let at = self.full_at_ns[node as usize].load(Ordering::SeqCst);
        (at != 0 && self.role(node) == NodeRole::Full)
            .then(|| (now_ns + BEFORE_ORIGIN_NS).saturating_sub(at))
    }

    /// Whether `node` ever became a full member again after a restart (cheap: no clock).
    pub fn rejoined(&self, node: NodeId) -> bool {
        self.full_at_ns[node as usize].load(Ordering::Relaxed) != 0
    }

    /// Record when `node`'s current incarnation joined (wall clock).
    pub fn set_incarnation(&self, node: NodeId, wall_ns: u64) {
        self.incarnation_ns[node as usize].store(wall_ns, Ordering::SeqCst);
    }

    /// When `node`'s current incarnation joined (wall clock; 0 = its first).
    pub fn incarnation(&self, node: NodeId) -> u64 {
        self.incarnation_ns[node as usize].load(Ordering::SeqCst)
    }

    pub fn is_gone(&self, node: NodeId) -> bool {
        let (w, bit) = (node as usize / 64, 1u64 << (node % 64));
        self.gone[w].load(Ordering::SeqCst) & bit != 0
    }

    /// Record that copy `j` of `partition` is at `at` now (`None`: back at its home). A copy
    /// that stops receiving records when, for the pause after it (`moved_full_for_ns`).
    pub fn move_copy(&self, partition: NodeId, j: u8, at: Option<MovedCopy>) {
        if let Some(m) = at {
            assert!(
                m.slot != 0,
                "a moved copy never takes slot 0 (the home copy's)"
            );
        }
        self.moved.record(
            partition as usize,
            j,
            at.map_or(0, MovedCopy::pack),
            at.is_some_and(|m| m.receiving),
        );
    }

    /// Record copy `j` of `partition` at `at`, full, with no pause after it: a copy placed
    /// when the cluster was made (`nessie_membership::standby`), which never had another role.
    pub fn place_copy_at_start(&self, partition: NodeId, j: u8, at: MovedCopy) {
        assert!(
            at.slot != 0 && !at.receiving,
            "a copy placed at start is full, in a spare slot"
        );
        self.moved.record_quietly(partition as usize, j, at.pack());
    }

    /// Where copy `j` of `partition` is, if it moved off its home node.
    pub fn moved_copy(&self, partition: NodeId, j: u8) -> Option<MovedCopy> {
        MovedCopy::unpack(self.moved.get(partition as usize, j))
    }

    /// Whether any copy of a node's tables ever moved (cheap: no clock).
    pub fn any_moved(&self) -> bool {
        self.moved.any.load(Ordering::Relaxed)
    }

    /// How long moved copy `j` of `partition` has been full at monotonic time `now_ns`; `None`
    /// if it did not move, or is still receiving.
    pub fn moved_full_for_ns(&self, partition: NodeId, j: u8, now_ns: u64) -> Option<u64> {
        self.moved.full_for_ns(partition as usize, j, now_ns)
    }

    /// Record that the configuration says moved copy `j` of `partition` became full `ago_ns`
    /// ago (the clock margin taken off: counted from the latest it can have been), as
    /// `membership::apply` does with every epoch. A fence that learns of it late (its node
    /// paused, or its reads late) then stops reading in the old roles as the others do.
    ///
    /// `id` names that becoming full (`CopyMove::full_since_ns`): a name the fence has not
    /// seen before, for a copy that looked full all along, is a change it missed, which starts
    /// anew here.
    pub fn set_moved_full_since(&self, partition: NodeId, j: u8, ago_ns: u64, id: u64) {
        self.moved
            .set_said_full_since(partition as usize, j, ago_ns, id);
    }

    /// Whether this fence saw moved copy `j` of `partition` receiving before it became full
    /// (that change): only then may its data reads take the old roles (rule 10c). A process
    /// that learns of a copy already full waits instead (rule 10a's `Between`) until its reads
    /// may take the new roles.
    pub fn moved_may_read_old(&self, partition: NodeId, j: u8) -> bool {
        self.moved.may_read_old(partition as usize, j)
    }

    /// Take the old roles for no moved copy from now on: this process lost its lease (it
    /// registers anew), and the others may have stopped waiting for its reads meanwhile.
    pub fn forget_old_roles(&self) {
        for saw in self.moved.saw_receiving.iter() {
            saw.store(false, Ordering::SeqCst);
        }
    }

    /// How long moved copy `j` of `partition` has been full, for data reads (rule 10a): since
    /// this fence learnt of it, and since the earlier of that and when the configuration says.
    pub fn moved_read_full_for_ns(
        &self,
        partition: NodeId,
        j: u8,
        now_ns: u64,
    ) -> Option<(u64, u64)> {
        self.moved.read_full_for_ns(partition as usize, j, now_ns)
    }

    /// When moved copy `j` of `partition` became full here, as an identity of that change for
    /// [`Self::settle_moved_reads_by`] and [`Self::settle_moved_writes_by`] (0: not a moved
    /// copy, or receiving).
    pub fn moved_full_instance(&self, partition: NodeId, j: u8) -> u64 {
        self.moved.instance(partition as usize, j)
    }

    /// Data reads take the new roles for moved copy `j` of `partition` from monotonic time
    /// `end_ns` (rule 10c): membership saw every node that may act say it applied the epoch
    /// the copy became full in, and `end_ns` is an operation's time after that, when every
    /// write made in the old roles has reached the copy. Only for the change `instance`
    /// ([`Self::moved_full_instance`]); only ever sooner.
    pub fn settle_moved_reads_by(&self, partition: NodeId, j: u8, instance: u64, end_ns: u64) {
        let m = &self.moved;
        m.settle_by(&m.reads_by_ns, partition as usize, j, instance, end_ns);
    }

    /// Changes stop waiting for moved copy `j` of `partition` from monotonic time `end_ns`
    /// (rule 10c): membership saw every node that may act say it reads the copy in the new
    /// roles, and `end_ns` is an operation's time after that, when every read in the old
    /// roles has ended. Only for the change `instance`; only ever sooner.
    pub fn settle_moved_writes_by(&self, partition: NodeId, j: u8, instance: u64, end_ns: u64) {
        let m = &self.moved;
        m.settle_by(&m.writes_by_ns, partition as usize, j, instance, end_ns);
    }

    /// Whether data reads of moved copy `j` of `partition` take the new roles at `now_ns` by
    /// [`Self::settle_moved_reads_by`].
    pub fn moved_reads_settled(&self, partition: NodeId, j: u8, now_ns: u64) -> bool {
        let m = &self.moved;
        m.settled(&m.reads_by_ns, partition as usize, j, now_ns)
    }

    /// Whether data reads of moved copy `j` of `partition` still take the old roles at
    /// `now_ns` (rule 10a's window `Old`, with join settle time `settle_ns`; rule 10c): this
    /// fence saw the copy receiving, its reads are not yet settled early, and both its
    /// learning and the configuration's time for it are less than the join settle time ago.
    pub fn moved_reads_old(&self, partition: NodeId, j: u8, now_ns: u64, settle_ns: u64) -> bool {
        self.moved_may_read_old(partition, j)
            && !self.moved_reads_settled(partition, j, now_ns)
            && self
                .moved_read_full_for_ns(partition, j, now_ns)
                .is_some_and(|(learnt, said)| learnt < settle_ns && said < settle_ns)
    }

    /// Whether changes stop waiting for moved copy `j` of `partition` at `now_ns` by
    /// [`Self::settle_moved_writes_by`].
    pub fn moved_writes_settled(&self, partition: NodeId, j: u8, now_ns: u64) -> bool {
        let m = &self.moved;
        m.settled(&m.writes_by_ns, partition as usize, j, now_ns)
    }

    /// Record that copy `j` of index partition `q` is at `at` on its own now. There is no
    /// way back to where its home node's tables' copy is: that place stopped being written
    /// when the copy moved, so it would have to be filled again like any new place.
    pub fn move_index_copy(&self, q: PartitionId, j: u8, at: IndexCopy) {
        self.index_moved
            .record(q as usize, j, at.pack(), at.receiving);
    }

    /// Where copy `j` of index partition `q` is, if it moved on its own.
    pub fn moved_index_copy(&self, q: PartitionId, j: u8) -> Option<IndexCopy> {
        IndexCopy::unpack(self.index_moved.get(q as usize, j))
    }

    /// Whether any index partition's copy ever moved on its own (cheap: no clock).
    pub fn any_index_moved(&self) -> bool {
        self.index_moved.any.load(Ordering::Relaxed)
    }

    /// Index partition `q` starts migrating to the chain `to` (copy j at `to[j]`, every copy
    /// in an index slot whose words are pending): operations that know go there, and hand
    /// over each entry they meet pending.
    pub fn start_migration(&self, q: PartitionId, to: &[IndexCopy]) {
        assert!(
            !to.is_empty() && to.len() <= COPIES,
            "a chain of {} copies",
            to.len()
        );
        // Copy 0 last: `migrating` looks at it, so an operation that sees the migration finds
        // every copy of the new chain already named.
        for (j, c) in to.iter().enumerate().rev() {
            assert!(
                !c.receiving,
                "a migration's target copies are full from the start"
            );
            self.index_target
                .record_quietly(q as usize, j as u8, c.pack());
        }
    }

    /// Index partition `q`'s migration to the chain `to` is over (every entry handed over):
    /// that is its chain from now on, with no pause (operations that knew used it already).
    /// A fence that never saw the migration start learns the chain here all the same. Only
    /// once no word is pending and every operation that met one has ended (an operation
    /// time after the last handover, the protocol's timing assumption): a hander that met a
    /// pending word and found the migration ended would fence a word of the new chain, and an
    /// operation that chose the old chain's copies and looks again for copies placed since
    /// would carry its word into the new chain.
    pub fn finish_migration(&self, q: PartitionId, to: &[IndexCopy]) {
        assert!(
            !to.is_empty() && to.len() <= COPIES,
            "a chain of {} copies",
            to.len()
        );
        for (j, c) in to.iter().enumerate() {
            self.index_moved
                .record_quietly(q as usize, j as u8, c.pack());
        }
        // Only this migration's target is cleared: a later migration of the partition, which
        // starts from this chain, may be under way already (a configuration lists both).
        let ours = to
            .iter()
            .enumerate()
            .all(|(j, c)| self.index_target.get(q as usize, j as u8) == c.pack());
        if ours {
            for j in 0..COPIES as u8 {
                self.index_target.record_quietly(q as usize, j, 0);
            }
        }
    }

    /// Only the index partitions for which `listed` holds are migrating: a migration this
    /// fence saw start and the configuration no longer lists ended, or was given up, in epochs
    /// this fence never read (its node was paused, or its reads were late). That chain may be
    /// retired by now and its slots reused by another partition, so no operation may go there
    /// any more.
    pub fn forget_migrations_except(&self, listed: impl Fn(PartitionId) -> bool) {
        if !self.any_migrating() {
            return;
        }
        for q in 0..MAX_PARTITIONS as PartitionId {
            if self.migrating(q) && !listed(q) {
                for j in 0..COPIES as u8 {
                    self.index_target.record_quietly(q as usize, j, 0);
                }
            }
        }
    }

    /// Where copy `j` of the chain index partition `q` migrates to is, while it migrates.
    pub fn migration_target(&self, q: PartitionId, j: u8) -> Option<IndexCopy> {
        IndexCopy::unpack(self.index_target.get(q as usize, j))
    }

    /// Whether index partition `q` is migrating.
    pub fn migrating(&self, q: PartitionId) -> bool {
        self.migration_target(q, 0).is_some()
    }

    /// Whether any index partition ever migrated (cheap: no clock).
    pub fn any_migrating(&self) -> bool {
        self.index_target.any.load(Ordering::Relaxed)
    }

    /// How long copy `j` of index partition `q`, moved on its own, has been full at `now_ns`.
    pub fn moved_index_full_for_ns(&self, q: PartitionId, j: u8, now_ns: u64) -> Option<u64> {
        self.index_moved.full_for_ns(q as usize, j, now_ns)
    }

    /// Record `node`'s read cut-over (rule 7a): its copies stop being read at wall time
    /// `named_ns` (0: it has none) by the clock of the node that named it, which may be
    /// `margin_ns` away from ours. `(now_wall_ns, mono_at_wall_ns)`: our wall clock, and our
    /// monotonic clock read just before it. A pause between the two readings places the
    /// instant early from the first (the safe side for the end of reads of its copies) and
    /// late from a monotonic reading taken after (the safe side for the start of reads of the
    /// next copy): the end is placed from the first, the start from one taken now. Each later
    /// reading of the same instant (every epoch repeats it) may only bring the end earlier;
    /// the start, and when this fence learnt of it, stay where they were first placed.
    pub fn set_cut_over(
        &self,
        node: NodeId,
        named_ns: u64,
        (now_wall_ns, mono_at_wall_ns): (u64, u64),
        margin_ns: u64,
    ) {
        let c = &self.cut_over_ns[node as usize];
        if named_ns == 0 {
            c.iter().for_each(|w| w.store(0, Ordering::SeqCst));
            return;
        }
        let now = nessie_fabric::monotonic_ns();
        let d = named_ns as i128 - now_wall_ns as i128;
        let on = |mono: u64| (mono.min(now) + BEFORE_ORIGIN_NS) as i128 + d;
        let clamp = |v: i128| v.clamp(1, u64::MAX as i128) as u64;
        let end = clamp(on(mono_at_wall_ns) - margin_ns as i128);
        if c[3].load(Ordering::SeqCst) == named_ns {
            c[0].fetch_min(end, Ordering::SeqCst);
            return;
        }
        c[0].store(end, Ordering::SeqCst);
        c[2].store(now.max(1), Ordering::SeqCst);
        c[3].store(named_ns, Ordering::SeqCst);
        // Last: `cut_over` looks at it first.
        c[1].store(clamp(on(now) + margin_ns as i128), Ordering::SeqCst);
        self.any_cut_over.store(true, Ordering::SeqCst);
    }

    /// Whether any node has a read cut-over (cheap: no clock).
    pub fn any_cut_over(&self) -> bool {
        self.any_cut_over.load(Ordering::Relaxed)
    }

    /// Whether `node` has a read cut-over (cheap: no clock).
    pub fn has_cut_over(&self, node: NodeId) -> bool {
        self.any_cut_over() && self.cut_over_ns[node as usize][1].load(Ordering::SeqCst) != 0
    }

    /// Where `node`'s copies stand against their read cut-over at monotonic time `now_ns`.
    /// Past it only once this fence has known of it for `read_settle_ns` too: the
    /// configuration that names it may have been written late, and nodes that read theirs
    /// before it was may still read the copies until a read settle time after this one
    /// learnt of it.
    pub fn cut_over(&self, node: NodeId, now_ns: u64, read_settle_ns: u64) -> CutOver {
        let c = &self.cut_over_ns[node as usize];
        let past_from = c[1].load(Ordering::SeqCst);
        if past_from == 0 {
            return CutOver::Before;
        }
        let t = now_ns + BEFORE_ORIGIN_NS;
        let learnt = c[2].load(Ordering::SeqCst);
        if t < c[0].load(Ordering::SeqCst) {
            CutOver::Before
        } else if t >= past_from && now_ns.saturating_sub(learnt) >= read_settle_ns {
            CutOver::Past
        } else {
            CutOver::Around
        }
    }

    /// How long `node` has been gone at monotonic time `now_ns`; `None` if it is not.
    pub fn gone_for_ns(&self, node: NodeId, now_ns: u64) -> Option<u64> {
        self.is_gone(node).then(|| match self.never_up(node) {
            // Never read by anyone: gone forever.
            true => u64::MAX,
            false => now_ns.saturating_sub(self.gone_at_ns[node as usize].load(Ordering::SeqCst)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A never-up node is gone forever (nobody waits for its readers); once it is no longer
    /// never-up, a fence that still has it gone counts it gone from then (it missed the
    /// epochs in which the node was up, and so when it failed).
    #[test]
    fn a_node_once_up_is_gone_from_when_the_fence_learns_it() {
        let f = Fence::unfenced();
        f.set_role(5, NodeRole::Gone);
        f.set_never_up(5, true);
        let later = nessie_fabric::monotonic_ns() + 10_000_000_000;
        assert!(f.never_up(5));
        assert_eq!(f.gone_for_ns(5, later), Some(u64::MAX));
        // The fence skipped its joining and up epochs: it is gone again, no longer never-up.
        f.set_role(5, NodeRole::Gone);
        f.set_never_up(5, false);
        let now = nessie_fabric::monotonic_ns();
        let gone = f.gone_for_ns(5, now).unwrap();
        assert!(gone < 1_000_000_000, "gone for {gone} ns, counted from now");
        // Up: not gone at all.
        f.set_role(5, NodeRole::Full);
        assert_eq!(f.gone_for_ns(5, now), None);
    }

    /// The pause after a comeback ends by the time membership names, never later than it
    /// would have, and only for a node that is full; a later comeback pauses anew.
    #[test]
    fn a_comeback_s_pause_only_ever_ends_sooner() {
        const PAUSE: u64 = 4_000_000_000;
        let f = Fence::unfenced();
        f.set_role(2, NodeRole::Gone);
        f.set_incarnation(2, 500);
        f.set_role(2, NodeRole::Full);
        let now = nessie_fabric::monotonic_ns();
        let paused = |t: u64| f.full_for_ns(2, t).is_some_and(|d| d < PAUSE);
        assert!(paused(now) && paused(now + PAUSE - 1_000_000_000));
        // Another comeback's word changes nothing.
        f.settle_join_by(2, 400, PAUSE, now);
        assert!(paused(now + 1_000_000));
        f.settle_join_by(2, 500, PAUSE, now + 100_000_000);
        assert!(paused(now + 99_000_000), "until the time named");
        assert!(!paused(now + 100_000_000), "and over from then");
        // A later time does not move it back.
        f.settle_join_by(2, 500, PAUSE, now + 2_000_000_000);
        assert!(!paused(now + 100_000_000));
        // A node not full is left alone; a new comeback pauses again.
        f.set_role(3, NodeRole::Receiving);
        f.settle_join_by(3, 0, PAUSE, now);
        assert_eq!(f.full_for_ns(3, now), None);
        f.set_role(2, NodeRole::Gone);
        f.set_role(2, NodeRole::Full);
        assert!(paused(nessie_fabric::monotonic_ns() + 1_000_000_000));
    }

    #[test]
    fn unfenced_until_told_otherwise() {
        let f = Fence::unfenced();
        assert!(f.may_act(u64::MAX - 10, 5));
        assert!(!f.is_gone(0) && !f.is_gone(MAX_NODES as NodeId - 1));
        f.set_lease_until(1_000);
        assert!(f.may_act(100, 899));
        assert!(
            !f.may_act(100, 900),
            "the attempt would end as the lease lapses"
        );
        f.set_gone(70, true);
        f.set_gone(3, true);
        assert!(f.is_gone(70) && f.is_gone(3) && !f.is_gone(6) && !f.is_gone(71));
        f.set_gone(70, false);
        assert!(!f.is_gone(70) && f.is_gone(3));
        let now = nessie_fabric::monotonic_ns();
        assert_eq!(f.gone_for_ns(70, now), None);
        assert!(f.gone_for_ns(3, now + 5_000).unwrap() >= 5_000);
    }

    #[test]
    fn roles_and_when_a_node_became_full_again() {
        let f = Fence::unfenced();
        assert_eq!(f.role(4), NodeRole::Full);
        assert_eq!(f.full_for_ns(4, u64::MAX), None, "never stopped being full");
        f.set_role(4, NodeRole::Gone);
        assert!(f.is_gone(4));
        f.set_role(4, NodeRole::Receiving);
        assert_eq!(f.role(4), NodeRole::Receiving);
        assert!(
            !f.is_gone(4),
            "a receiving node's writers are not the failed ones"
        );
        assert_eq!(f.full_for_ns(4, u64::MAX), None);
        f.set_role(4, NodeRole::Full);
        let now = nessie_fabric::monotonic_ns();
        assert!(f.full_for_ns(4, now + 1_000).unwrap() >= 1_000);
        f.set_incarnation(4, 77);
        assert_eq!((f.incarnation(4), f.incarnation(5)), (77, 0));
    }

    #[test]
    fn the_copy_map_records_moves_and_when_a_moved_copy_became_full() {
        let f = Fence::unfenced();
        assert_eq!(f.moved_copy(7, 1), None, "every copy at home");
        let at = |receiving| MovedCopy {
            node: 4095,
            slot: 255,
            receiving,
        };
        f.move_copy(7, 1, Some(at(true)));
        assert_eq!(f.moved_copy(7, 1), Some(at(true)), "packed without loss");
        assert_eq!((f.moved_copy(7, 0), f.moved_copy(6, 1)), (None, None));
        let now = nessie_fabric::monotonic_ns();
        assert_eq!(f.moved_full_for_ns(7, 1, now), None, "still receiving");
        f.move_copy(7, 1, Some(at(false)));
        let now = nessie_fabric::monotonic_ns();
        assert!(f.moved_full_for_ns(7, 1, now + 1_000).unwrap() >= 1_000);
        // Told again that it is full (every epoch repeats the map): the pause is not restarted.
        let first = f.moved_full_for_ns(7, 1, now + 1_000).unwrap();
        f.move_copy(7, 1, Some(at(false)));
        assert_eq!(f.moved_full_for_ns(7, 1, now + 1_000).unwrap(), first);
        f.move_copy(7, 1, None);
        assert_eq!(f.moved_copy(7, 1), None);
    }

    /// Rule 10c's early ends apply to the change they were said of, only ever sooner, and are
    /// forgotten when the copy becomes full again (another change) or moves on.
    #[test]
    fn a_moved_copy_s_pause_ends_early_only_for_the_change_said() {
        let f = Fence::unfenced();
        let at = |node, receiving| MovedCopy {
            node,
            slot: 2,
            receiving,
        };
        assert_eq!(f.moved_full_instance(3, 0), 0, "not moved");
        f.move_copy(3, 0, Some(at(5, true)));
        assert_eq!(f.moved_full_instance(3, 0), 0, "receiving");
        f.move_copy(3, 0, Some(at(5, false)));
        let change = f.moved_full_instance(3, 0);
        assert_ne!(change, 0);
        let now = nessie_fabric::monotonic_ns();
        f.settle_moved_reads_by(3, 0, change + 1, now);
        assert!(!f.moved_reads_settled(3, 0, now), "another change's word");
        f.settle_moved_reads_by(3, 0, change, now + 2_000);
        assert!(!f.moved_reads_settled(3, 0, now + 1_999));
        assert!(f.moved_reads_settled(3, 0, now + 2_000));
        f.settle_moved_reads_by(3, 0, change, now + 5_000);
        assert!(f.moved_reads_settled(3, 0, now + 2_000), "only ever sooner");
        assert!(
            !f.moved_writes_settled(3, 0, now + 2_000),
            "writes separately"
        );
        f.settle_moved_writes_by(3, 0, change, now + 3_000);
        assert!(f.moved_writes_settled(3, 0, now + 3_000));
        // Told again that it is full: the same change, still settled.
        f.move_copy(3, 0, Some(at(5, false)));
        assert!(f.moved_writes_settled(3, 0, now + 3_000));
        // Full on another node: a new change, which pauses anew.
        f.move_copy(3, 0, Some(at(6, false)));
        assert!(!f.moved_reads_settled(3, 0, now + 3_000));
        assert!(!f.moved_writes_settled(3, 0, now + 3_000));
        f.settle_moved_writes_by(3, 0, change, now);
        assert!(
            !f.moved_writes_settled(3, 0, now + 3_000),
            "said of the last change"
        );
        f.move_copy(3, 0, Some(at(6, true)));
        assert_eq!(f.moved_full_instance(3, 0), 0);
    }

    /// Rule 10c's limits on the old roles: only a fence that saw the copy receiving may read
    /// in them; the configuration's time for a change only ever moves earlier (a reader that
    /// left the old roles never goes back); a change the fence missed (same place, a new
    /// name) starts anew without them; and a process that lost its lease forgets them all.
    #[test]
    fn only_a_fence_that_saw_the_copy_filled_reads_it_in_the_old_roles() {
        const SETTLE: u64 = 10_000_000_000;
        let f = Fence::unfenced();
        let at = |receiving| MovedCopy {
            node: 5,
            slot: 2,
            receiving,
        };
        f.move_copy(3, 0, Some(at(false)));
        f.set_moved_full_since(3, 0, 0, 100);
        let now = nessie_fabric::monotonic_ns();
        assert!(!f.moved_may_read_old(3, 0), "learnt of it full");
        assert!(!f.moved_reads_old(3, 0, now, SETTLE));
        f.move_copy(3, 1, Some(at(true)));
        f.move_copy(3, 1, Some(at(false)));
        f.set_moved_full_since(3, 1, 0, 200);
        let now = nessie_fabric::monotonic_ns();
        assert!(f.moved_may_read_old(3, 1) && f.moved_reads_old(3, 1, now, SETTLE));
        // Said a settle time ago, then (a later epoch, a clock read later) less: kept.
        f.set_moved_full_since(3, 1, SETTLE + 1_000_000, 200);
        let now = nessie_fabric::monotonic_ns();
        assert!(!f.moved_reads_old(3, 1, now, SETTLE));
        f.set_moved_full_since(3, 1, 0, 200);
        assert!(
            !f.moved_reads_old(3, 1, now, SETTLE),
            "never back to the old roles"
        );
        // A change missed: the same place, a new name.
        let before = f.moved_full_instance(3, 1);
        let change = before;
        f.settle_moved_writes_by(3, 1, change, now);
        f.set_moved_full_since(3, 1, 0, 300);
        assert_ne!(f.moved_full_instance(3, 1), before, "a new change");
        assert!(!f.moved_writes_settled(3, 1, nessie_fabric::monotonic_ns()));
        assert!(
            !f.moved_may_read_old(3, 1),
            "it did not see this one filled"
        );
        // A lost lease, after the copy became full, or while it was receiving (the fence's
        // place still says receiving: becoming full does not bring the old roles back).
        f.move_copy(3, 2, Some(at(true)));
        f.move_copy(3, 2, Some(at(false)));
        assert!(f.moved_may_read_old(3, 2));
        f.forget_old_roles();
        assert!(!f.moved_may_read_old(3, 2));
        f.move_copy(5, 2, Some(at(true)));
        f.forget_old_roles();
        f.move_copy(5, 2, Some(at(false)));
        assert_ne!(f.moved_full_instance(5, 2), 0);
        assert!(!f.moved_may_read_old(5, 2), "forgotten while receiving");
        // Placed at start, then said full by a change this fence missed: it pauses after it.
        let start = MovedCopy {
            node: 6,
            slot: 3,
            receiving: false,
        };
        f.place_copy_at_start(4, 1, start);
        assert_eq!(
            f.moved_full_instance(4, 1),
            0,
            "no pause after a copy placed at start"
        );
        f.move_copy(4, 1, Some(start));
        f.set_moved_full_since(4, 1, 0, 400);
        let now = nessie_fabric::monotonic_ns();
        assert_ne!(f.moved_full_instance(4, 1), 0, "a change");
        assert!(f.moved_full_for_ns(4, 1, now).is_some_and(|t| t < SETTLE));
        assert!(!f.moved_may_read_old(4, 1));
    }
}
