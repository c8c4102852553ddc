//! The data table allocator. One per node, shared by the node's client workers. It hands out
//! entries of a size class from pages the node has claimed ([`crate::pages`]):
//!
//! 1. an entry of the class that came back (unpublished, or recycled and expired);
//! 2. the next never-used entry of the class's open page;
//! 3. a fresh page of the node's own table (local writes are the paper's point);
//! 4. a scan of the next [`ROOM_SCAN_PAGES`] pages the node holds, of every class, here and on
//!    other nodes, going on from where the last such scan stopped: entries whose recycle flag
//!    has expired go back on their class's free list, and pages left with no entry in use go
//!    back to their node's pool (then a fresh local page again). Released entries not yet
//!    expired are remembered with the time they will be (a recycle word does not change until
//!    its claimer reclaims the entry), and taken once it has come, in step 1, without another
//!    scan: a writer scans again only when its class has none left to wait for (scanning
//!    whenever the free list ran dry cost a scan of every held entry per few entries freed
//!    under steady overwrites). The scan is bounded so that a write near full costs a bounded
//!    number of fabric operations; the node's reclaimer scans every page once per expiry
//!    period ([`ClassTable::reclaim_if_due`]);
//! 5. a fresh page of another node's table, claimed with one CAS (placement across nodes;
//!    [`ClassTable::local_only`] turns it off, for the baselines' servers);
//! 6. an entry of a larger class already at hand (free list or open page): it holds the value
//!    too, wasting the difference, where refusing the write would waste all of it.
//!
//! A page whose entries are all back on the free list is released, so memory moves between
//! classes as demand shifts. A class can also be given a page of another whose items are much
//! older (the page mover, `cd/evict.rs`): the page is *drained* ([`ClassTable::start_draining`]),
//! its items evicted by writers, and released once empty. Invariant DR1: no entry of a
//! draining page is handed out (its free entries leave the free list, and entries that come
//! back stay off it), so the page empties however busy its class. Invariant DR2: the table
//! counts its draining pages, so that an eviction asks whether any drains in O(1).
//!
//! Recycling stays client-driven: the claimer scans its pages, remote ones with one READ per
//! page; no server thread takes part.
//!
//! Deletes need a marker entry too, so no ordinary claim takes a node's last [`RESERVE_PAGES`]
//! free pages; a delete that finds no room elsewhere claims one as a *reserve page*, whose
//! entries only deletes take (values would otherwise use up the room that lets a full store be
//! emptied). Other nodes' writers also leave a node its last [`owner_share`] pages. Both
//! reserves are soft: two claimers racing for the last pages can both win.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use nessie_fabric::{Endpoint, FabricError, NoYield, NodeId, RemoteAddr};

use crate::classes::SizeClasses;
use crate::dte::{DteLayout, HEADER_OFF, RECYCLE_OFF};
use crate::pages::{self, Claim, PageWord, PAGE_REGION};
use crate::DATA_REGION;

/// First and longest back-off of a thread waiting for the allocator in virtual time (ns).
/// The allocator's state as a client holds it across fabric operations
/// ([`ClassTable::lock_state`]): the lock, and no giving way meanwhile.
struct Held<'a> {
    guard: MutexGuard<'a, State>,
    _no_yield: NoYield,
}

impl std::ops::Deref for Held<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.guard
    }
}

const LOCK_BACKOFF_MIN_NS: u64 = 100;
const LOCK_BACKOFF_MAX_NS: u64 = 1_600;

/// Entry size from which a scan of a remote page READs each entry's recycle word instead of the
/// whole page: one READ costs about as much as 2 KB on a 10 Gb/s link, and over shared memory a
/// READ is a copy, so for large entries reading the values too would cost more than the READs
/// it saves (a scan of 16 KiB entries copied every byte of them).
pub const WORD_READS_FROM: u64 = 2048;

/// Most held pages a writer that ran out of room scans before it claims a page of another node
/// (step 4). The scan goes on from where the last one stopped, so successive writers cover
/// every page in turn, and the node's reclaimer scans them all once per expiry period: a write
/// near full costs a bounded number of fabric operations however much memory the node holds
/// (a full scan per write made a nearly full store crawl: millions of READs per write).
pub const ROOM_SCAN_PAGES: usize = 16;

/// Largest single WRITE used to clear a freshly claimed page.
pub const ZERO_CHUNK: u64 = 1 << 20;
/// Free pages of each node that only deletes may claim.
pub const RESERVE_PAGES: u64 = 1;
/// One page in this many of each node (at least one) is left to the node's own writers: other
/// nodes' writers may not claim a node's last free pages for values, so a node whose memory was
/// filled from elsewhere still writes locally, and one busy writer cannot take every node's
/// memory while others wait.
pub const OWNER_SHARE_FRACTION: u64 = 8;

/// Free pages of a node of `pages` pages that other nodes' writers leave for values of its own.
pub fn owner_share(pages: u64) -> u64 {
    (pages / OWNER_SHARE_FRACTION).max(1)
}

/// What an entry is allocated for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// A new value (PUT, or a MIGRATE copy): may not take a node's last free pages.
    Value,
    /// A DELETE's marker: may take the reserve. Without it, a store filled by PUTs could never
    /// be emptied again (every delete failing with "data table full").
    Delete,
}

/// An entry: the node whose memory holds it, its class and its slot in that class.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot {
    pub host: NodeId,
    pub class: u8,
    pub slot: u64,
}

/// Why no entry could be allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassAllocError {
    #[error("no room for an entry of class {class} ({entry_size} B) on any node: {awaiting_expiry} released entries not yet expired")]
    Full {
        class: u8,
        entry_size: u64,
        awaiting_expiry: u64,
        /// When the first of them expires (clock margin included), if any.
        next_ready_ns: Option<u64>,
    },
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// Fill of one class, for `nessie status`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassUsage {
    pub entry_size: u64,
    /// Pages held (local and remote).
    pub pages: u64,
    pub remote_pages: u64,
    /// Entries handed out and not back on the free list.
    pub in_use: u64,
    /// Entries back on the free list.
    pub free: u64,
}

#[derive(Debug)]
struct PageState {
    claim: Claim,
    class: u8,
    /// Entries handed out so far (the never-used ones start here).
    handed: u64,
    /// Entries handed out and not back on the free list.
    in_use: u64,
    /// Claimed from the delete reserve: only deletes take its entries.
    reserve: bool,
    /// Being emptied for another class ([`ClassTable::start_draining`]): none of its entries
    /// is handed out again, and it goes back to the pool once none is in use.
    drain: Option<Drain>,
    /// One bit per entry of the page: set while the entry is on its class's pending list
    /// (PD1). Empty until the first entry is listed.
    listed: Vec<u64>,
}

impl PageState {
    fn new(claim: Claim, class: u8, handed: u64, in_use: u64, reserve: bool) -> Self {
        Self {
            claim,
            class,
            handed,
            in_use,
            reserve,
            drain: None,
            listed: Vec::new(),
        }
    }

    /// The word and bit of entry `i` in `listed`.
    fn bit(i: u64) -> (usize, u64) {
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    fn is_listed(&self, i: u64) -> bool {
        let (w, b) = Self::bit(i);
        self.listed.get(w).is_some_and(|x| x & b != 0)
    }

    /// Set entry `i`'s listed bit; false if it was set already.
    fn list(&mut self, i: u64, per_page: u64) -> bool {
        if self.listed.is_empty() {
            self.listed = vec![0; per_page.div_ceil(64) as usize];
        }
        let was = self.is_listed(i);
        let (w, b) = Self::bit(i);
        self.listed[w] |= b;
        !was
    }

    fn unlist(&mut self, i: u64) {
        assert!(
            self.is_listed(i),
            "PD1: entry {i} taken from the pending list was not listed"
        );
        let (w, b) = Self::bit(i);
        self.listed[w] &= !b;
    }
}

/// Released entries of one class waiting for their time to come, with the time (clock margin
/// included), soonest first.
///
/// Invariant PD1: an entry is here at most once, and exactly while its page's `listed` bit
/// is set. An entry listed twice would be handed out twice; the bit makes the check O(1), so
/// a scan meeting an entry already listed skips it instead of listing it anew.
///
/// Most entries come from this node's writers ([`ClassTable::note_recycled`]) in the order
/// of their ready times: those go on a FIFO, O(1) each way. The rest (scans, notes out of
/// order between threads) go on a heap. A `BTreeSet` of both, re-filled by every scan, cost
/// a tenth of a node's CPU under steady overwrites.
#[derive(Debug, Default)]
struct Pending {
    in_order: VecDeque<(u64, Slot)>,
    others: BinaryHeap<Reverse<(u64, Slot)>>,
}

impl Pending {
    fn push(&mut self, ready: u64, slot: Slot) {
        if self.in_order.back().is_none_or(|&(last, _)| last <= ready) {
            self.in_order.push_back((ready, slot));
        } else {
            self.others.push(Reverse((ready, slot)));
        }
    }

    fn first(&self) -> Option<(u64, Slot)> {
        match (self.in_order.front(), self.others.peek()) {
            (Some(&a), Some(&Reverse(b))) => Some(a.min(b)),
            (Some(&a), None) => Some(a),
            (None, Some(&Reverse(b))) => Some(b),
            (None, None) => None,
        }
    }

    fn pop_first(&mut self) -> Option<(u64, Slot)> {
        let from_fifo = match (self.in_order.front(), self.others.peek()) {
            (Some(&a), Some(&Reverse(b))) => a <= b,
            (a, _) => a.is_some(),
        };
        match from_fifo {
            true => self.in_order.pop_front(),
            false => self.others.pop().map(|Reverse(e)| e),
        }
    }

    fn len(&self) -> usize {
        self.in_order.len() + self.others.len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn retain(&mut self, mut keep: impl FnMut(&Slot) -> bool) {
        self.in_order.retain(|(_, s)| keep(s));
        self.others.retain(|Reverse((_, s))| keep(s));
    }
}

/// Where the eviction of a draining page's entries has got to.
#[derive(Clone, Debug, Default)]
struct Drain {
    /// The class the page is drained for: its writers count what they evict here as making
    /// room ([`ClassTable::drain_batch`]).
    for_class: u8,
    /// The next entry to hand to an evicting writer.
    cursor: u64,
    /// When the last pass over the page ended (0: the pass is under way).
    pass_ended_ns: u64,
    /// Passes begun over the page.
    passes: u32,
    /// The page's free entries, kept off the free list (DR1) until the page is released, or
    /// given back if the drain is called off.
    idle: Vec<Slot>,
}

/// Entries of one class at hand, in pages of one kind (ordinary or reserve).
#[derive(Debug, Default)]
struct Pool {
    free: Vec<Slot>,
    /// The page whose never-used entries are handed out next.
    open: Option<(NodeId, u64)>,
}

#[derive(Debug, Default)]
struct ClassState {
    /// Pages any write may use.
    normal: Pool,
    /// Pages a delete claimed from the reserve: values must not use up the room that lets a
    /// full store be emptied.
    reserve: Pool,
    /// Entries taken so far (eviction's measure of how fast the class is written).
    taken: u64,
    /// When the current rate window began, `taken` then, and the entries taken in the last
    /// whole window ([`ClassTable::short_of_room`]).
    window_start_ns: u64,
    window_taken: u64,
    last_window_taken: u64,
    /// Released entries this node's writers recycled or scans found not yet expired (or a
    /// bounded scan found expired), with when (clock margin included) they may be reused; the
    /// soonest first. Still in use on their pages until taken. Each at most once (PD1): scans
    /// meet again entries listed before, and an entry listed twice would be handed out twice
    /// (its ready time cannot differ between the two, since a recycle word changes only when
    /// its claimer reclaims the entry). A sorted Vec re-sorted after each scan cost a third of
    /// an evicting node's CPU (lists of thousands).
    pending: Pending,
}

impl ClassState {
    fn pool(&mut self, reserve: bool) -> &mut Pool {
        if reserve {
            &mut self.reserve
        } else {
            &mut self.normal
        }
    }
}

/// The pages a table holds, by host and page number: a two-level table, indexed directly.
///
/// Looked up three times per entry a write takes and recycles (take, note, put back). A hash
/// map (foldhash) missed the cache on its buckets there: one `cmp` of its probe was 62% of
/// `take_from`. A flat table per host would cost a `PageState` slot for every page of every
/// host a node ever held a page of (gigabytes at 64 GiB per node and 16 KiB pages), so the
/// pages of a host come in chunks of [`PAGE_CHUNK`], each allocated while it holds a page and
/// freed when its last page goes: at most a pointer per [`PAGE_CHUNK`] pages of a host, plus
/// the chunks in use.
///
/// Invariant PG1: `len` is the number of pages held (`Some` entries), and a chunk's `held`
/// the number of its own; no chunk is empty. Iteration is in key order, so the simulator
/// replays runs exactly.
#[derive(Debug, Default)]
struct PageMap {
    hosts: Vec<Vec<Option<Box<PageChunk>>>>,
    len: usize,
}

/// Pages per chunk of a [`PageMap`]: a chunk is about 8 KiB.
const PAGE_CHUNK: usize = 64;

#[derive(Debug)]
struct PageChunk {
    pages: [Option<PageState>; PAGE_CHUNK],
    held: usize,
}

impl PageMap {
    fn split(page: u64) -> (usize, usize) {
        (
            (page / PAGE_CHUNK as u64) as usize,
            (page % PAGE_CHUNK as u64) as usize,
        )
    }

    fn get(&self, &(host, page): &(NodeId, u64)) -> Option<&PageState> {
        let (c, i) = Self::split(page);
        self.hosts.get(host as usize)?.get(c)?.as_ref()?.pages[i].as_ref()
    }

    fn get_mut(&mut self, &(host, page): &(NodeId, u64)) -> Option<&mut PageState> {
        let (c, i) = Self::split(page);
        self.hosts
            .get_mut(host as usize)?
            .get_mut(c)?
            .as_mut()?
            .pages[i]
            .as_mut()
    }

    fn insert(&mut self, (host, page): (NodeId, u64), state: PageState) -> Option<PageState> {
        let (h, (c, i)) = (host as usize, Self::split(page));
        if self.hosts.len() <= h {
            self.hosts.resize_with(h + 1, Vec::new);
        }
        let chunks = &mut self.hosts[h];
        if chunks.len() <= c {
            chunks.resize_with(c + 1, || None);
        }
        let chunk = chunks[c].get_or_insert_with(|| {
            Box::new(PageChunk {
                pages: std::array::from_fn(|_| None),
                held: 0,
            })
        });
        let old = chunk.pages[i].replace(state);
        if old.is_none() {
            chunk.held += 1;
            self.len += 1;
        }
        old
    }

    fn remove(&mut self, &(host, page): &(NodeId, u64)) -> Option<PageState> {
        let (c, i) = Self::split(page);
        let slot = self.hosts.get_mut(host as usize)?.get_mut(c)?;
        let chunk = slot.as_mut()?;
        let old = chunk.pages[i].take()?;
        chunk.held -= 1;
        self.len -= 1;
        if chunk.held == 0 {
            *slot = None; // PG1: no empty chunk
        }
        Some(old)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The held pages with their keys, in key order.
    fn iter(&self) -> impl Iterator<Item = ((NodeId, u64), &PageState)> {
        self.hosts.iter().enumerate().flat_map(|(h, chunks)| {
            chunks.iter().enumerate().flat_map(move |(c, chunk)| {
                chunk.iter().flat_map(move |chunk| {
                    chunk.pages.iter().enumerate().filter_map(move |(i, ps)| {
                        let page = (c * PAGE_CHUNK + i) as u64;
                        ps.as_ref().map(|ps| ((h as NodeId, page), ps))
                    })
                })
            })
        })
    }

    fn values(&self) -> impl Iterator<Item = &PageState> {
        self.iter().map(|(_, ps)| ps)
    }
}

impl std::ops::Index<&(NodeId, u64)> for PageMap {
    type Output = PageState;

    fn index(&self, key: &(NodeId, u64)) -> &PageState {
        self.get(key)
            .unwrap_or_else(|| panic!("page {} of node {} is not held", key.1, key.0))
    }
}

#[derive(Debug)]
struct State {
    classes: Vec<ClassState>,
    pages: PageMap,
    /// The keys of `pages`, in order: where a bounded scan goes on from `scan_cursor`.
    held: BTreeSet<(NodeId, u64)>,
    /// The last page a bounded scan ([`ClassTable::scan_some`]) looked at.
    scan_cursor: Option<(NodeId, u64)>,
    reclaimed_total: u64,
    scans: u64,
    room_scans: u64,
    /// The last attempt to claim a page for a value found none on any node: the memory is
    /// all claimed, and only reclaimed entries (or an eviction) make room.
    exhausted: bool,
    /// When the last scan began (the endpoint's wall clock).
    last_scan_ns: u64,
    /// When the last bounded scan began ([`ClassTable::make_room`]).
    last_room_scan_ns: u64,
    /// When a writer last asked whether to move a page ([`ClassTable::move_check_due`]).
    last_move_check_ns: u64,
    /// Per class: the donor the last checks in a row found worth a page to it, and how many
    /// ([`ClassTable::vote_move`]).
    move_votes: Vec<(u8, u32)>,
    /// Pages drained for another class so far.
    pages_drained: u64,
    /// Pages held whose `drain` is set: every eviction asks whether any page drains, and a
    /// walk over every held page per eviction would grow with the memory (DR2: equal to the
    /// count, checked in debug builds by [`ClassTable::move_check_due`]).
    draining: usize,
}

/// What [`ClassTable::adopt`] or [`ClassTable::adopt_gone`] took over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    pub pages: u64,
    pub in_use: u64,
    pub free: u64,
    /// Pages this allocator held that another node took while this one was failed.
    pub lost: u64,
    /// Pages of a gone node left for a later look: the host guard refuses their host now (its
    /// tables settle after a copy became full), and the adopting CAS would wait out that
    /// settle time under the table's lock, with every writer of this node behind it.
    pub deferred: u64,
}

/// Released entries found by a scan that have not expired yet.
#[derive(Copy, Clone, Debug, Default)]
struct Awaiting {
    count: u64,
    next_ready_ns: Option<u64>,
}

impl Awaiting {
    fn add(&mut self, ready_ns: u64) {
        self.count += 1;
        self.next_ready_ns = Some(self.next_ready_ns.map_or(ready_ns, |t| t.min(ready_ns)));
    }
}

/// Most entries [`ClassTable::sample_in_use`] returns.
pub const MAX_SAMPLE: usize = 16;

/// Most pages of one table draining at once ([`ClassTable::start_draining`]): each is memory
/// no class uses until its last entry expires.
pub const MAX_DRAINING_PAGES: usize = 2;
/// At most one page in this many of those a table holds drains at once (one at least): in a
/// table of a few pages, two draining left a third of the memory idle.
pub const DRAINING_SHARE: usize = 8;

/// Page-mover checks in a row that must find the same page move worth making
/// ([`ClassTable::vote_move`]).
pub const MOVE_VOTES: u32 = 3;

/// Passes over a draining page before its drain is called off ([`ClassTable::drain_batch`]).
pub const DRAIN_PASSES: u32 = 3;

/// Ordinary pages a class must hold to give one to another class.
pub const MIN_DONOR_PAGES: u64 = 2;

/// Counters of a whole table, for `nessie status`.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TableCounters {
    pub reclaimed_total: u64,
    /// Scans of every held page (the reclaimer's, or [`ClassTable::reclaim`]).
    pub scans: u64,
    /// Bounded scans by writers that ran out of room (step 4).
    pub room_scans: u64,
    /// Pages drained for another class ([`ClassTable::start_draining`]); memcached's
    /// `slabs_moved`.
    pub pages_drained: u64,
}

/// Whether this node may write now (membership: its lease holds and it is a full member),
/// asked right before each write an allocator makes on its own (clearing a reclaimed entry).
#[derive(Clone)]
pub struct WriteGuard(pub Arc<dyn Fn() -> bool + Send + Sync>);

impl std::fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WriteGuard")
    }
}

/// What the host guard says of claiming pages of a node now ([`HostGuard`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostUse {
    /// Claim as usual.
    Now,
    /// A claim would wait, under the allocator's lock (the node's tables settle after a copy
    /// became full, or wait for their next copy to decide): claimed only when no other node
    /// has room, as better a write that waits than a table full.
    Avoid,
    /// Never: a standby node, whose tables have a copy fewer and which nobody may write until
    /// it is up (`nessie_membership::standby`, SB5).
    Never,
}

/// Whether pages of a node may be claimed now ([`HostUse`]), asked right before each pass.
#[derive(Clone)]
pub struct HostGuard(pub Arc<dyn Fn(NodeId) -> HostUse + Send + Sync>);

impl std::fmt::Debug for HostGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostGuard")
    }
}

/// The host guard's answers within one pass over entries (it reads the clock and the fence):
/// asked at most once per host.
#[derive(Default)]
struct HostCache(Vec<(NodeId, bool)>);

impl HostCache {
    /// Whether entries of `host` may be handed out, written or released now (`guarded`: as the
    /// host guard says; `t`'s own node's always).
    fn usable(&mut self, t: &ClassTable, host: NodeId, guarded: bool) -> bool {
        if !guarded || host == t.node || t.hosts.is_none() {
            return true;
        }
        if let Some(&(_, ok)) = self.0.iter().find(|(h, _)| *h == host) {
            return ok;
        }
        let ok = t.host_use(host) == HostUse::Now;
        self.0.push((host, ok));
        ok
    }
}

/// One node's allocator of class entries.
#[derive(Debug)]
pub struct ClassTable {
    node: NodeId,
    nodes: usize,
    classes: Arc<SizeClasses>,
    pages_per_node: u64,
    clock_margin_ns: u64,
    /// Whether pages of other nodes may be claimed.
    remote: bool,
    /// Whether pages of this table's own node may be claimed: false for a client member,
    /// whose id names no host ([`ClassTable::remote_only`]).
    own_host: bool,
    /// Pages of nodes failed for good are adopted by CAS (false only as the mutation
    /// `adopt_without_cas`).
    adopt_by_cas: bool,
    /// Pages of hosts the host guard refuses are adopted later (false only as the mutation
    /// `adopt_while_settling`).
    adopt_defers: bool,
    /// Asked before each write of a scan ([`ClassTable::guarded`]); none: always allowed.
    guard: Option<WriteGuard>,
    /// Asked before claiming a page of another node ([`ClassTable::hosts_guarded`]).
    hosts: Option<HostGuard>,
    state: Mutex<State>,
    /// Items this node's writers evicted (`nessie status`, the front ends' counters).
    evictions: std::sync::atomic::AtomicU64,
}

impl ClassTable {
    pub fn new(
        node: NodeId,
        nodes: usize,
        classes: Arc<SizeClasses>,
        pages_per_node: u64,
        clock_margin_ns: u64,
    ) -> Self {
        let per_class = (0..classes.len()).map(|_| ClassState::default()).collect();
        let move_votes = vec![(0, 0); classes.len()];
        Self {
            node,
            nodes,
            classes,
            pages_per_node,
            clock_margin_ns,
            remote: true,
            own_host: true,
            adopt_by_cas: true,
            adopt_defers: true,
            guard: None,
            hosts: None,
            evictions: Default::default(),
            state: Mutex::new(State {
                classes: per_class,
                pages: PageMap::default(),
                held: BTreeSet::new(),
                scan_cursor: None,
                reclaimed_total: 0,
                scans: 0,
                room_scans: 0,
                exhausted: false,
                last_scan_ns: 0,
                last_room_scan_ns: 0,
                last_move_check_ns: 0,
                move_votes,
                pages_drained: 0,
                draining: 0,
            }),
        }
    }

    /// Never place entries on other nodes (the baselines' servers keep data where it is served).
    pub fn local_only(mut self) -> Self {
        self.remote = false;
        self
    }

    /// Claim pages of the nodes only, never of this table's own id: the allocator of a client
    /// member, a process that is not a node (`docs/design/client-members.md`). Its id lies
    /// past the nodes'; its claims leave every node its reserve and its owner's share, as any
    /// remote claim does, so clients can never take a node's last pages from its own writers,
    /// and deletes may still take reserve pages (dev. 8: a full store can be emptied).
    pub fn remote_only(mut self) -> Self {
        assert!(
            self.node as usize >= self.nodes,
            "a remote-only table belongs to a client, whose id {} is past the {} nodes",
            self.node,
            self.nodes
        );
        self.remote = true;
        self.own_host = false;
        self
    }

    /// `false` adopts the pages of nodes failed for good without a CAS: the mutation
    /// `adopt_without_cas` (tests only), which lets two heirs hold one page.
    #[cfg(test)]
    fn adopting_by_cas(mut self, by_cas: bool) -> Self {
        self.adopt_by_cas = by_cas;
        self
    }

    /// `false` adopts pages of a host whose tables settle at once, its CAS waiting under the
    /// table's lock: the mutation `adopt_while_settling` (tests only).
    #[cfg(test)]
    fn adopting_while_settling(mut self, mutated: bool) -> Self {
        self.adopt_defers = !mutated;
        self
    }

    /// Clear reclaimed entries only while `guard` says this node may write. The pages of a
    /// node failed for good go to the survivors (`adopt_gone`), so a process that lives on
    /// past that (paused, cut off; perhaps in the middle of a scan) must not clear entries its
    /// stale state still lists: they may be the heirs' live ones. Plain writes are not fenced
    /// by the replicated endpoint (writers check their lease when an attempt starts), so the
    /// allocator checks its own, right before each.
    pub fn guarded(mut self, guard: WriteGuard) -> Self {
        self.guard = Some(guard);
        self
    }

    /// Claim pages of another node only where `hosts` allows it.
    pub fn hosts_guarded(mut self, hosts: HostGuard) -> Self {
        self.hosts = Some(hosts);
        self
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    pub fn pages_per_node(&self) -> u64 {
        self.pages_per_node
    }

    pub fn classes(&self) -> &SizeClasses {
        &self.classes
    }

    /// Byte address of an entry.
    pub fn addr(&self, s: Slot) -> RemoteAddr {
        RemoteAddr::new(s.host, DATA_REGION, self.classes.offset(s.class, s.slot))
    }

    /// Take an entry of `class`, or of a larger class when no node has room for `class` (see
    /// the module comment for the order of places tried): use the returned slot's class.
    pub fn alloc_for<E: Endpoint>(
        &self,
        ep: &mut E,
        class: u8,
        purpose: Purpose,
    ) -> Result<Slot, ClassAllocError> {
        assert_eq!(
            ep.node(),
            self.node,
            "allocate with an endpoint of this node"
        );
        let mut s = self.lock_state(ep);
        if let Some(slot) = self.take_handy(&mut s, class, purpose) {
            return Ok(slot);
        }
        if self.reclaim_pending(ep, &mut s, class)? > 0 {
            if let Some(slot) = self.take_handy(&mut s, class, purpose) {
                return Ok(slot);
            }
        }
        // A client member has no pages of its own (`remote_only`): it starts at step 4.
        let here = self.own_host.then_some(self.node);
        if let Some(here) = here {
            if let Some(slot) = self.open_page(ep, &mut s, here, class, RESERVE_PAGES, false)? {
                return Ok(slot);
            }
        }
        let awaiting = self.make_room(ep, &mut s, class)?;
        if let Some(slot) = self.take_handy(&mut s, class, purpose) {
            return Ok(slot);
        }
        if let Some(here) = here {
            if let Some(slot) = self.open_page(ep, &mut s, here, class, RESERVE_PAGES, false)? {
                return Ok(slot);
            }
        }
        let hosts = self.other_hosts();
        let remote_keep = RESERVE_PAGES + owner_share(self.pages_per_node);
        let mut failed = Vec::new();
        for &host in &hosts {
            let opened = self.open_page(ep, &mut s, host, class, remote_keep, false);
            if let Some(Some(slot)) = self.tolerate(host, opened, &mut failed)? {
                return Ok(slot);
            }
        }
        // Entries passed over for their host's settle time: better a write that waits than
        // a table full.
        if let Some(slot) = self.take_anywhere(&mut s, class, purpose) {
            return Ok(slot);
        }
        if purpose == Purpose::Value {
            s.exhausted = true;
        }
        for larger in class + 1..self.classes.len() as u8 {
            if let Some(slot) = self.take_handy(&mut s, larger, purpose) {
                return Ok(slot);
            }
        }
        if purpose == Purpose::Delete {
            // The reserve: a page no value may claim, here first.
            for host in here.into_iter().chain(hosts) {
                if failed.contains(&host) {
                    continue;
                }
                let opened = self.open_page(ep, &mut s, host, class, 0, true);
                if let Some(Some(slot)) = self.tolerate(host, opened, &mut failed)? {
                    return Ok(slot);
                }
            }
        }
        // Nodes passed over because a claim there waits out their settle time: better a write
        // that waits than a table full (never a standby node's: `HostUse::Never`).
        for host in self.other_hosts_where(HostUse::Avoid) {
            let opened = self.open_page(ep, &mut s, host, class, remote_keep, false);
            if let Some(Some(slot)) = self.tolerate(host, opened, &mut failed)? {
                return Ok(slot);
            }
            if purpose == Purpose::Delete && !failed.contains(&host) {
                let opened = self.open_page(ep, &mut s, host, class, 0, true);
                if let Some(Some(slot)) = self.tolerate(host, opened, &mut failed)? {
                    return Ok(slot);
                }
            }
        }
        Err(ClassAllocError::Full {
            class,
            entry_size: self.classes.entry_size(class),
            awaiting_expiry: awaiting.count,
            next_ready_ns: awaiting.next_ready_ns,
        })
    }

    /// Other nodes whose pages this table may claim now, nearest first (none when local-only).
    fn other_hosts(&self) -> Vec<NodeId> {
        self.other_hosts_where(HostUse::Now)
    }

    /// Other nodes, nearest first, of which the host guard says `what` (none when local-only;
    /// every node, from the one its id falls on, for a client member's table).
    fn other_hosts_where(&self, what: HostUse) -> Vec<NodeId> {
        let others = if self.remote { self.nodes } else { 1 };
        let first = usize::from(self.own_host);
        (first..others)
            .map(|d| ((self.node as usize + d) % self.nodes) as NodeId)
            .filter(|&n| self.host_use(n) == what)
            .collect()
    }

    /// What the host guard says of `host` now (no guard: claim as usual).
    fn host_use(&self, host: NodeId) -> HostUse {
        self.hosts.as_ref().map_or(HostUse::Now, |g| (g.0)(host))
    }

    /// An entry from a free list or an open page, without any fabric operation: ordinary pages
    /// first, then, for a delete, reserve pages.
    ///
    /// Entries on another node whose pages the host guard refuses now (its tables settle
    /// after a copy became full: a write there would wait) are passed over, but not lost:
    /// [`Self::take_anywhere`] takes them when nothing else is left.
    fn take_handy(&self, s: &mut State, class: u8, purpose: Purpose) -> Option<Slot> {
        self.take_handy_from(s, class, purpose, true)
    }

    /// [`Self::take_handy`] without the host guard: the last resort before the table is full.
    fn take_anywhere(&self, s: &mut State, class: u8, purpose: Purpose) -> Option<Slot> {
        self.take_handy_from(s, class, purpose, false)
    }

    fn take_handy_from(
        &self,
        s: &mut State,
        class: u8,
        purpose: Purpose,
        guarded: bool,
    ) -> Option<Slot> {
        if let Some(slot) = self.take_from(s, class, false, guarded) {
            return Some(slot);
        }
        match purpose {
            Purpose::Delete => self.take_from(s, class, true, guarded),
            Purpose::Value => None,
        }
    }

    fn take_from(&self, s: &mut State, class: u8, reserve: bool, guarded: bool) -> Option<Slot> {
        let per_page = self.classes.per_page(class);
        let mut hosts = HostCache::default();
        if let Some((host, page)) = s.classes[class as usize].pool(reserve).open {
            if !hosts.usable(self, host, guarded) {
                // A refused host's open page is closed: its entries not yet handed out go to
                // the free list (passed over like the others there, not stranded when another
                // page opens).
                let ps = s.pages.get_mut(&(host, page)).expect("open page is held");
                let rest = ps.handed..per_page;
                ps.handed = per_page;
                let pool = s.classes[class as usize].pool(reserve);
                pool.open = None;
                pool.free.extend(rest.map(|i| Slot {
                    host,
                    class,
                    slot: self.classes.slot(class, page, i),
                }));
            }
        }
        let pool = s.classes[class as usize].pool(reserve);
        let free = pool
            .free
            .iter()
            .rposition(|f| hosts.usable(self, f.host, guarded));
        let Some(i) = free else {
            return self.take_open(s, class, reserve);
        };
        let slot = pool.free.swap_remove(i);
        let page = self.page_of(slot);
        s.pages.get_mut(&(slot.host, page)).expect("held").in_use += 1;
        s.classes[class as usize].taken += 1;
        Some(slot)
    }

    /// The next entry of the pool's open page, if it has one.
    fn take_open(&self, s: &mut State, class: u8, reserve: bool) -> Option<Slot> {
        let pool = s.classes[class as usize].pool(reserve);
        let (host, page) = pool.open?;
        let ps = s.pages.get_mut(&(host, page)).expect("open page is held");
        let i = ps.handed;
        ps.handed += 1;
        ps.in_use += 1;
        if ps.handed == self.classes.per_page(class) {
            pool.open = None;
        }
        s.classes[class as usize].taken += 1;
        Some(Slot {
            host,
            class,
            slot: self.classes.slot(class, page, i),
        })
    }

    fn page_of(&self, slot: Slot) -> u64 {
        slot.slot / self.classes.per_page(slot.class)
    }

    /// Claim a free page of `host` for `class`, leaving `keep` free pages, make it the class's
    /// open page (of the reserve pool if `reserve`) and take its first entry.
    fn open_page<E: Endpoint>(
        &self,
        ep: &mut E,
        s: &mut State,
        host: NodeId,
        class: u8,
        keep: u64,
        reserve: bool,
    ) -> Result<Option<Slot>, FabricError> {
        let from = self.node as u64 * 7919 % self.pages_per_node.max(1);
        let Some(claim) = pages::claim_free_page(ep, host, self.pages_per_node, class, from, keep)?
        else {
            return Ok(None);
        };
        self.zero_page(ep, host, claim.page)?;
        let state = PageState::new(claim, class, 0, 0, reserve);
        let old = s.pages.insert((host, claim.page), state);
        s.held.insert((host, claim.page));
        assert!(
            old.is_none(),
            "page {} of node {host} claimed twice",
            claim.page
        );
        s.classes[class as usize].pool(reserve).open = Some((host, claim.page));
        s.exhausted = false;
        Ok(Some(
            self.take_open(s, class, reserve).expect("a fresh page"),
        ))
    }

    /// Clear a page just claimed. It may hold entries of another class at other offsets, and a
    /// stale word where this class keeps an entry's recycle word would make a scan hand out an
    /// entry whose writer has not written it yet. One WRITE per [`ZERO_CHUNK`] bytes; a page is
    /// claimed once per `per_page` entries.
    fn zero_page<E: Endpoint>(
        &self,
        ep: &mut E,
        host: NodeId,
        page: u64,
    ) -> Result<(), FabricError> {
        let page_bytes = self.classes.page_bytes();
        let zeros = vec![0u8; ZERO_CHUNK.min(page_bytes) as usize];
        let base = page * page_bytes;
        let mut done = 0;
        while done < page_bytes {
            let n = (zeros.len() as u64).min(page_bytes - done) as usize;
            let at = RemoteAddr::new(host, DATA_REGION, base + done);
            if host == ep.node() {
                ep.local_write(DATA_REGION, at.offset, &zeros[..n])?;
            } else {
                ep.write(at, &zeros[..n])?;
            }
            done += n as u64;
        }
        Ok(())
    }

    /// The allocator's state, for a thread of `ep`. It is held across fabric operations
    /// (claiming and zeroing pages), so where the thread runs other clients meanwhile
    /// (`Endpoint::shares_thread`: virtual time, a pipeline's coroutines) a client that finds
    /// it taken waits with back-off sleeps, as a spinning waiter would: its holder may be a
    /// client of this very thread, and a thread asleep in the kernel is invisible to the
    /// simulator's scheduler, which can only find it by polling.
    ///
    /// While it is held, the client does not give way to its thread's other clients
    /// ([`NoYield`]): one of them would find the lock taken by a client that cannot run until it
    /// gives way in turn (the plain `lock()`s below would block the whole thread on it).
    fn lock_state<E: Endpoint>(&self, ep: &mut E) -> Held<'_> {
        let held = |guard| Held {
            guard,
            _no_yield: NoYield::enter(),
        };
        if !ep.shares_thread() {
            return held(self.state.lock().unwrap());
        }
        let mut backoff = LOCK_BACKOFF_MIN_NS;
        loop {
            match self.state.try_lock() {
                Ok(s) => return held(s),
                Err(TryLockError::WouldBlock) => {
                    ep.sleep_ns(backoff);
                    backoff = (backoff * 2).min(LOCK_BACKOFF_MAX_NS);
                }
                Err(TryLockError::Poisoned(p)) => panic!("allocator state poisoned: {p}"),
            }
        }
    }

    /// Return an entry that no ITE ever referred to: reusable at once.
    pub fn release_unpublished<E: Endpoint>(&self, ep: &mut E, slot: Slot) {
        let mut s = self.lock_state(ep);
        self.put_back(&mut s, slot);
    }

    /// Under pressure: take back expired entries and give empty pages back, so memory can move
    /// to `class`. While `class` still has released entries to wait for, a scan would find
    /// none sooner (entries released since the last scan expire after them): only what other
    /// classes have waited out is taken. Otherwise the next [`ROOM_SCAN_PAGES`] held pages are
    /// scanned ([`Self::scan_some`]), at most once per clock margin. Returns what still awaits
    /// expiry.
    fn make_room<E: Endpoint>(
        &self,
        ep: &mut E,
        s: &mut State,
        class: u8,
    ) -> Result<Awaiting, FabricError> {
        let own_pending = !s.classes[class as usize].pending.is_empty();
        // Every class's entries whose time has come, first: their pages may empty and go to
        // this class. Left listed, they would be reported as awaiting with a readiness
        // already past, and a writer would retry at once, again and again, until it gave
        // up (a CI run refused a PUT after 2,000 such attempts within a clock margin).
        let started_ns = ep.now_ns();
        let mut reclaimed = 0;
        for c in 0..self.classes.len() as u8 {
            reclaimed += self.reclaim_pending(ep, s, c)?;
        }
        // A drained page whose last entry came back (here, or by an earlier reclaim) goes to
        // the pool now, not once a scan meets it: a class is waiting for it.
        let drained =
            s.draining > 0 && s.pages.values().any(|p| p.drain.is_some() && p.in_use == 0);
        if reclaimed > 0 || own_pending || drained {
            self.release_empty_pages(ep, s, None, &mut Vec::new())?;
        }
        if !own_pending {
            // At most one bounded scan per clock margin: a class that holds no page (a
            // DELETE's marker class in a store whose pages values took) would otherwise scan
            // on every allocation, to fall back on a larger class each time (one scan of 16
            // pages per eviction in a `memcslap` run). Entries this node's writers release
            // come back without a scan (`note_recycled`); the scans find those released from
            // other nodes and empty pages that may move to another class.
            let now = ep.now_ns();
            if now.saturating_sub(s.last_room_scan_ns) >= self.clock_margin_ns {
                s.last_room_scan_ns = now;
                self.scan_some(ep, s, class)?;
            }
        }
        let awaiting = Self::awaiting(s);
        // AW1: what a writer is told to wait for lies ahead of it (everything due was taken).
        assert!(
            awaiting.next_ready_ns.is_none_or(|t| t > started_ns),
            "awaiting an entry due before {started_ns}: {awaiting:?}"
        );
        Ok(awaiting)
    }

    /// Reclaim the listed entries of `class` (noted by this node's writers or found released
    /// by scans) whose time has come.
    /// Returns how many. One whose node cannot be reached is dropped: a later scan finds it.
    fn reclaim_pending<E: Endpoint>(
        &self,
        ep: &mut E,
        s: &mut State,
        class: u8,
    ) -> Result<u64, FabricError> {
        self.reclaim_pending_skipping(ep, s, class, &mut Vec::new())
    }

    /// [`Self::reclaim_pending`], dropping (not writing to) the entries of nodes in `failed`,
    /// to which it adds those that fail now.
    fn reclaim_pending_skipping<E: Endpoint>(
        &self,
        ep: &mut E,
        s: &mut State,
        class: u8,
        failed: &mut Vec<NodeId>,
    ) -> Result<u64, FabricError> {
        if s.classes[class as usize].pending.is_empty() {
            return Ok(0); // spares the clock read
        }
        let now = ep.now_ns();
        let mut reclaimed = 0;
        while let Some((ready, slot)) = s.classes[class as usize].pending.first() {
            if now <= ready {
                break;
            }
            s.classes[class as usize].pending.pop_first();
            let cleared = match failed.contains(&slot.host) {
                true => Ok(false),
                false => self.clear_released(ep, s, slot, true, failed),
            };
            match cleared {
                Ok(true) => reclaimed += 1,
                // Dropped, its bit cleared (PD1): a later scan lists it again.
                Ok(false) => self.unlist(s, slot),
                Err(e) => {
                    self.unlist(s, slot);
                    return Err(e);
                }
            }
        }
        s.reclaimed_total += reclaimed;
        Ok(reclaimed)
    }

    /// Clear the header and recycle word of an expired released entry and put it back on its
    /// free list. False (nothing changed) if its node could not be reached.
    /// `listed`: it was just taken off its pending list, and its listed bit is cleared with
    /// it (PD1) if it goes back; left set if not.
    fn clear_released<E: Endpoint>(
        &self,
        ep: &mut E,
        s: &mut State,
        slot: Slot,
        listed: bool,
        failed: &mut Vec<NodeId>,
    ) -> Result<bool, FabricError> {
        // Clear the flag so later scans do not hand the entry out twice, and the header with
        // it (one write: they are adjacent), so that a restarted node adopting the page tells
        // a free entry (both zero) from a live one (`adopt`).
        let at = self.addr(slot).add(HEADER_OFF);
        debug_assert_eq!(RECYCLE_OFF, HEADER_OFF + 8);
        if self.guard.as_ref().is_some_and(|g| !(g.0)()) {
            return Err(FabricError::Fenced { node: self.node });
        }
        // Unordered (rule 10a of `docs/protocol.md`): nobody reads a released entry's words
        // but this table's own scans and adopters of a gone holder's pages (we hold it), and
        // the write is on every copy before the entry is handed out again; so it does not wait
        // while a moved copy of the host's tables settles, under the table's lock.
        if self
            .tolerate(slot.host, ep.write_unordered(at, &[0u8; 16]), failed)?
            .is_none()
        {
            return Ok(false);
        }
        self.put_back_as(s, slot, listed);
        Ok(true)
    }

    /// Released entries still awaiting expiry, of every class.
    fn awaiting(s: &State) -> Awaiting {
        let mut a = Awaiting::default();
        for c in &s.classes {
            if let Some((ready, _)) = c.pending.first() {
                a.add(ready + 1);
                a.count += c.pending.len() as u64 - 1;
            }
        }
        a
    }

    fn put_back(&self, s: &mut State, slot: Slot) {
        self.put_back_as(s, slot, false)
    }

    /// [`Self::put_back`], clearing the entry's listed bit if `listed` (one page lookup for
    /// both).
    fn put_back_as(&self, s: &mut State, slot: Slot, listed: bool) {
        let per_page = self.classes.per_page(slot.class);
        let Some(ps) = s.pages.get_mut(&(slot.host, slot.slot / per_page)) else {
            // Its page was adopted by another node while this one was failed, and forgotten
            // here ([`ClassTable::take_over`]): the entry is the heir's now.
            return;
        };
        if listed {
            ps.unlist(slot.slot % per_page);
        }
        assert!(ps.in_use > 0, "entry {slot:?} returned twice");
        ps.in_use -= 1;
        if let Some(d) = ps.drain.as_mut() {
            d.idle.push(slot); // DR1: a draining page's entries are not handed out again
            return;
        }
        let reserve = ps.reserve;
        s.classes[slot.class as usize].pool(reserve).free.push(slot);
    }

    /// Reclaim every expired recycled entry and release every empty page now (what a
    /// background reclaimer calls). Returns the entries reclaimed.
    pub fn reclaim<E: Endpoint>(&self, ep: &mut E) -> Result<u64, FabricError> {
        let mut s = self.lock_state(ep);
        self.scan_all(ep, &mut s)
    }

    /// Reclaim (as [`ClassTable::reclaim`]) if the node holds pages and no scan began in the
    /// last `interval_ns`. A writer scans only when it runs out of room, so without this the
    /// entries of a node that stopped writing would stay out of every writer's reach: its
    /// pages, here and on other nodes, come back only once a scan finds them empty.
    pub fn reclaim_if_due<E: Endpoint>(
        &self,
        ep: &mut E,
        interval_ns: u64,
    ) -> Result<u64, FabricError> {
        let mut s = self.lock_state(ep);
        let now = ep.now_ns();
        if s.pages.is_empty() || now.saturating_sub(s.last_scan_ns) < interval_ns {
            return Ok(0);
        }
        self.scan_all(ep, &mut s)
    }

    /// Whether a writer of `class` should make room by evicting before it runs out: every page
    /// is claimed (the last claim found none) and the entries of `class` at hand or awaiting
    /// expiry are fewer than twice what this node's writers took in the last `period_ns` (an
    /// expiry period), a quarter page at least and `max` at most. An evicted entry is reusable
    /// only an expiry period after its DELETE (readers may still be reading it): a writer that
    /// evicted only once it had no room would wait that long, and one that keeps a period's
    /// worth of entries in flight never waits. But entries in flight hold no items: the bytes
    /// at hand or awaiting expiry, of every class together, stay below `1 / share` of the
    /// pages this table holds. Past that, writers wait for room rather than evict more (a
    /// writer at 12,000 `set`s a second with a 1 s expiry period would otherwise keep half of
    /// the memory in flight, 20 classes at a time, and hold a tenth of the items it could).
    pub fn short_of_room(
        &self,
        class: u8,
        now_ns: u64,
        period_ns: u64,
        max: u64,
        share: u64,
    ) -> bool {
        let mut s = self.state.lock().unwrap();
        if !s.exhausted {
            return false;
        }
        let budget = s.pages.len() as u64 * self.classes.page_bytes() / share.max(1);
        let in_flight: u64 = s
            .classes
            .iter()
            .enumerate()
            .map(|(c, st)| {
                let entries = (st.normal.free.len() + st.pending.len()) as u64;
                entries * self.classes.entry_size(c as u8)
            })
            .sum();
        if in_flight >= budget {
            return false;
        }
        let per_page = self.classes.per_page(class);
        let open_left = s.classes[class as usize].normal.open.map_or(0, |k| {
            let handed = s.pages.get(&k).map_or(0, |p| p.handed);
            per_page.saturating_sub(handed)
        });
        let c = &mut s.classes[class as usize];
        if now_ns.saturating_sub(c.window_start_ns) >= period_ns {
            c.last_window_taken = c.taken - c.window_taken;
            c.window_start_ns = now_ns;
            c.window_taken = c.taken;
        }
        // Twice the last period's: writers held back by waiting for room would otherwise
        // never keep more in flight than they managed to take, and never speed up.
        let want = (2 * c.last_window_taken).max(per_page / 4).min(max);
        ((c.normal.free.len() + c.pending.len()) as u64 + open_left) < want
    }

    /// Whether a writer of this node should ask now whether to move a page between classes
    /// (the page mover, `docs/frontends.md`): every page is claimed (the last claim found none),
    /// fewer than [`MAX_DRAINING_PAGES`] pages are draining (and fewer than one in
    /// [`DRAINING_SHARE`] of those held, or none), and no writer of this node asked
    /// in the last `interval_ns`. Saying yes counts as the asking.
    pub fn move_check_due(&self, now_ns: u64, interval_ns: u64) -> bool {
        let mut s = self.state.lock().unwrap();
        debug_assert_eq!(
            s.draining,
            s.pages.values().filter(|p| p.drain.is_some()).count(),
            "DR2"
        );
        if !s.exhausted
            || s.draining >= Self::most_draining(&s)
            || now_ns.saturating_sub(s.last_move_check_ns) < interval_ns
        {
            return false;
        }
        s.last_move_check_ns = now_ns;
        true
    }

    /// A page-mover check found a page of `donor` worth moving to `class` (`None`: none).
    /// Returns whether [`MOVE_VOTES`] checks in a row have found so for `class`, naming the
    /// same donor: then the page moves (and the count starts again). One check alone
    /// follows the workload's noise (in a fault test of a few pages per node, single checks
    /// moved a page every 2 s back and forth, and cost a tenth of the throughput).
    pub fn vote_move(&self, class: u8, donor: Option<u8>) -> bool {
        let mut s = self.state.lock().unwrap();
        let v = &mut s.move_votes[class as usize];
        match donor {
            None => *v = (0, 0),
            Some(d) if v.0 == d && v.1 > 0 => v.1 += 1,
            Some(d) => *v = (d, 1),
        }
        if v.1 >= MOVE_VOTES {
            *v = (0, 0);
            return true;
        }
        false
    }

    /// The ordinary pages not draining each class holds: what the page mover weighs.
    pub fn class_pages(&self) -> Vec<u64> {
        let s = self.state.lock().unwrap();
        let mut pages = vec![0u64; self.classes.len()];
        for p in s.pages.values() {
            if !p.reserve && p.drain.is_none() {
                pages[p.class as usize] += 1;
            }
        }
        pages
    }

    /// Classes other than `class` that could give a page to it, with their pages (as
    /// [`Self::class_pages`] counts them), most pages first, at most `max`: those holding at
    /// least [`MIN_DONOR_PAGES`] (a class keeps one, so it never has to claim one back for its
    /// next write).
    pub fn donor_classes(&self, class: u8, max: usize) -> Vec<(u8, u64)> {
        let pages = self.class_pages();
        let mut donors: Vec<(u8, u64)> = (0..self.classes.len() as u8)
            .map(|c| (c, pages[c as usize]))
            .filter(|&(c, p)| c != class && p >= MIN_DONOR_PAGES)
            .collect();
        // Most pages first; the smaller class among equals (deterministic for the simulator).
        donors.sort_by_key(|&(c, p)| (std::cmp::Reverse(p), c));
        donors.truncate(max);
        donors
    }

    /// Start draining a page of `donor` for `for_class`: the donor's ordinary page with the
    /// fewest entries in use (the fewest items to evict; the first in key order among
    /// equals). From now on none of its entries is handed out (DR1): its free ones leave the
    /// free list, it stops being the open page, and entries that come back stay off the
    /// list. Evicting writers take its entries in turn ([`Self::drain_batch`]), and once none
    /// is in use the page goes back to the pool as any empty page, where the class short of
    /// room, whose writers are waiting for one, usually claims it. Returns whether a page was
    /// chosen: not if the donor holds fewer than [`MIN_DONOR_PAGES`] or as many pages are
    /// draining as [`Self::move_check_due`] allows (checked again here: two writers may have
    /// been told a check was due).
    pub fn start_draining(&self, donor: u8, for_class: u8) -> bool {
        let mut s = self.state.lock().unwrap();
        let s = &mut *s;
        let donor_pages = s
            .pages
            .values()
            .filter(|p| p.class == donor && !p.reserve && p.drain.is_none())
            .count() as u64;
        if s.draining >= Self::most_draining(s) || donor_pages < MIN_DONOR_PAGES {
            return false;
        }
        let page = s
            .held
            .iter()
            .filter(|k| {
                let p = &s.pages[*k];
                p.class == donor && !p.reserve && p.drain.is_none()
            })
            .min_by_key(|k| s.pages[*k].in_use)
            .copied();
        let Some(key) = page else {
            return false;
        };
        let per_page = self.classes.per_page(donor);
        let pool = &mut s.classes[donor as usize].normal;
        if pool.open == Some(key) {
            pool.open = None;
        }
        let (idle, free): (Vec<Slot>, Vec<Slot>) = std::mem::take(&mut pool.free)
            .into_iter()
            .partition(|f| (f.host, f.slot / per_page) == key);
        pool.free = free;
        s.pages.get_mut(&key).expect("held").drain = Some(Drain {
            for_class,
            idle,
            ..Drain::default()
        });
        s.pages_drained += 1;
        s.draining += 1;
        true
    }

    /// Most pages of this table that may drain at once.
    fn most_draining(s: &State) -> usize {
        (s.pages.len() / DRAINING_SHARE).clamp(1, MAX_DRAINING_PAGES)
    }

    /// Up to `max` entries of a draining page for an evicting writer to evict if they hold
    /// items, each handed to one writer per pass, with the class the page is drained for.
    /// A page whose pass has ended but still has entries in use (items being written during
    /// the pass, whose eviction lost a race, or that its policy spares) gets another pass
    /// once `repass_after_ns` have gone by since; after [`DRAIN_PASSES`] passes the drain is
    /// called off and the page serves its class again, its free entries back on the free
    /// list: a page that does not empty must not hold idle memory, nor the mover's turn, for
    /// good.
    pub fn drain_batch(
        &self,
        now_ns: u64,
        max: usize,
        repass_after_ns: u64,
    ) -> Option<(u8, Vec<Slot>)> {
        let mut s = self.state.lock().unwrap();
        let s = &mut *s;
        if s.draining == 0 {
            return None;
        }
        let mut called_off = Vec::new();
        let mut out = None;
        for key in s.held.iter() {
            let p = s.pages.get_mut(key).expect("held");
            let Some(d) = p.drain.as_mut() else {
                continue;
            };
            if d.cursor >= p.handed || d.passes == 0 {
                if d.passes > 0 && d.pass_ended_ns == 0 {
                    d.pass_ended_ns = now_ns.max(1);
                }
                let due =
                    d.passes == 0 || now_ns.saturating_sub(d.pass_ended_ns) >= repass_after_ns;
                if p.in_use == 0 || !due {
                    continue;
                }
                if d.passes >= DRAIN_PASSES {
                    called_off.push(*key);
                    continue;
                }
                d.passes += 1;
                d.cursor = 0;
                d.pass_ended_ns = 0;
            }
            let end = d.cursor.saturating_add(max as u64).min(p.handed);
            let slots = (d.cursor..end)
                .map(|i| Slot {
                    host: key.0,
                    class: p.class,
                    slot: self.classes.slot(p.class, key.1, i),
                })
                .collect();
            d.cursor = end;
            out = Some((d.for_class, slots));
            break;
        }
        for key in called_off {
            let p = s.pages.get_mut(&key).expect("held");
            let d = p.drain.take().expect("draining");
            s.draining -= 1;
            tracing::debug!(
                host = key.0,
                page = key.1,
                in_use = p.in_use,
                "drain called off"
            );
            s.classes[p.class as usize].normal.free.extend(d.idle);
        }
        out
    }

    /// Whether a draining page has entries no evicting writer has been handed yet in its
    /// current pass: a writer waiting for room should come back soon to evict more of them,
    /// rather than wait for an expiry.
    pub fn drain_in_progress(&self) -> bool {
        let s = self.state.lock().unwrap();
        s.draining > 0
            && s.pages.values().any(|p| {
                p.drain
                    .as_ref()
                    .is_some_and(|d| d.passes == 0 || d.cursor < p.handed)
            })
    }

    /// Up to `n` (at most [`MAX_SAMPLE`]) entries of `class` in ordinary pages this table
    /// holds, picked at random (`seed`) among those handed out: eviction's candidates. Some
    /// may be free or released by now; the caller reads each to tell.
    pub fn sample_in_use(&self, class: u8, n: usize, seed: u64) -> Vec<Slot> {
        let s = self.state.lock().unwrap();
        let pages: Vec<(NodeId, u64, u64)> = s
            .pages
            .iter()
            .filter(|(_, p)| p.class == class && !p.reserve && p.in_use > 0)
            .map(|(k, p)| (k.0, k.1, p.handed))
            .collect();
        let mut out = Vec::new();
        if pages.is_empty() {
            return out;
        }
        let mut x = seed | 1;
        for _ in 0..n.min(MAX_SAMPLE) {
            // xorshift64: cheap, and the choice need not be unpredictable.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (host, page, handed) = pages[(x % pages.len() as u64) as usize];
            let i = (x >> 32) % handed.max(1);
            let slot = Slot {
                host,
                class,
                slot: self.classes.slot(class, page, i),
            };
            if !out.contains(&slot) {
                out.push(slot);
            }
        }
        out.sort_unstable(); // deterministic order for the simulator
        out
    }

    /// `slot` has just been given the recycle word `word` by one of this node's writers (the
    /// operation whose CAS took it out of the index): if this table holds its page, list it as
    /// pending until its expiry, so that writers take it then without a scan. What a scan
    /// would list for it is the same pair (the ready time comes from the word), so a later
    /// scan does not list it twice. Listed only if its time has not come yet (see below).
    /// Without this, a writer at full scanned pages for each entry it needed (a DELETE's
    /// marker per eviction: 150,000 bounded scans of 16 pages in a `memcslap` run).
    pub fn note_recycled<E: Endpoint>(&self, ep: &mut E, slot: Slot, word: u64) {
        let Some(expiry) = DteLayout::recycle_expiry(word) else {
            return;
        };
        let mut held = self.lock_state(ep);
        let s = &mut *held;
        let per_page = self.classes.per_page(slot.class);
        // Its page, held for its class: an entry still in use keeps its page from going back.
        let Some(ps) = s.pages.get_mut(&(slot.host, slot.slot / per_page)) else {
            return;
        };
        if ps.class != slot.class {
            return;
        }
        let ready = expiry.saturating_add(self.clock_margin_ns);
        // Only while it cannot have been reclaimed yet. A writer delayed between its WRITE of
        // the word and this call (longer than the expiry period) could otherwise list an entry
        // a scan has reclaimed meanwhile and handed out again: listed, it would be cleared
        // under its new item. Every reclaim of this table's entries happens under this lock,
        // on this node's clock (which never goes back), once `now > ready`: a clock still at or
        // before `ready` here means none has. A later one is the scans' to find.
        if ep.now_ns() > ready {
            return;
        }
        // `list`, with the page already at hand.
        if ps.list(slot.slot % per_page, per_page) {
            s.classes[slot.class as usize].pending.push(ready, slot);
        }
    }

    /// Put `slot` on its class's pending list with its ready time, unless it is listed
    /// already (PD1). Its page must be held.
    fn list(&self, s: &mut State, ready: u64, slot: Slot) {
        let per_page = self.classes.per_page(slot.class);
        let page = slot.slot / per_page;
        let ps = s
            .pages
            .get_mut(&(slot.host, page))
            .expect("a listed entry's page is held");
        if ps.list(slot.slot % per_page, per_page) {
            s.classes[slot.class as usize].pending.push(ready, slot);
        }
    }

    fn is_listed(&self, s: &State, slot: Slot) -> bool {
        let per_page = self.classes.per_page(slot.class);
        s.pages
            .get(&(slot.host, slot.slot / per_page))
            .is_some_and(|p| p.is_listed(slot.slot % per_page))
    }

    /// Clear the listed bit of `slot`, just taken off its pending list (PD1).
    fn unlist(&self, s: &mut State, slot: Slot) {
        let per_page = self.classes.per_page(slot.class);
        let page = slot.slot / per_page;
        if let Some(ps) = s.pages.get_mut(&(slot.host, page)) {
            ps.unlist(slot.slot % per_page);
        }
    }

    /// Count an item one of this node's writers evicted.
    pub fn count_eviction(&self) {
        self.evictions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Items this node's writers have evicted.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn counters(&self) -> TableCounters {
        let s = self.state.lock().unwrap();
        TableCounters {
            reclaimed_total: s.reclaimed_total,
            scans: s.scans,
            room_scans: s.room_scans,
            pages_drained: s.pages_drained,
        }
    }

    /// Scan every held page for expired recycled entries, then release the pages left empty.
    /// Released entries not yet expired go on their class's pending list ([`Self::awaiting`]
    /// counts them). Returns the entries reclaimed.
    fn scan_all<E: Endpoint>(&self, ep: &mut E, s: &mut State) -> Result<u64, FabricError> {
        let now = ep.now_ns();
        // In key order: the simulator replays runs exactly.
        let held: Vec<(NodeId, u64)> = s.held.iter().copied().collect();
        s.scans += 1;
        s.last_scan_ns = now;
        // What is still pending stays listed: the scan skips it (PD1) and adds what was
        // released since.
        // Other nodes that failed during this scan: their pages wait for a later one.
        let mut failed: Vec<NodeId> = Vec::new();
        let mut reclaimed = 0;
        for key in held {
            if !failed.contains(&key.0) {
                reclaimed += self.scan_page(ep, s, key, now, &mut failed, false)?;
            }
        }
        s.reclaimed_total += reclaimed;
        // Listed entries whose time has come (the scan left them to their lists); those of
        // nodes that failed during the scan are dropped, as they were before PD1.
        for c in 0..self.classes.len() as u8 {
            reclaimed += self.reclaim_pending_skipping(ep, s, c, &mut failed)?;
        }
        self.release_empty_pages(ep, s, None, &mut failed)?;
        Ok(reclaimed)
    }

    /// A writer's bounded scan: the held pages after the last one scanned (wrapping around),
    /// at most [`ROOM_SCAN_PAGES`]. What it finds released goes on the pending lists, expired
    /// or not (PD1: an entry listed already is not listed again). Then what has expired is
    /// reclaimed.
    /// It stops early at a page that had expired entries of `class`: the writer has room then,
    /// and each further page of small entries would cost a READ of the whole page.
    fn scan_some<E: Endpoint>(
        &self,
        ep: &mut E,
        s: &mut State,
        class: u8,
    ) -> Result<(), FabricError> {
        let now = ep.now_ns();
        s.room_scans += 1;
        let budget = ROOM_SCAN_PAGES.min(s.held.len());
        let mut scanned: Vec<(NodeId, u64)> = Vec::with_capacity(budget);
        let mut failed: Vec<NodeId> = Vec::new();
        // Classes whose pending list this scan added to: only they have new entries to
        // reclaim (every class's looked at on every writer's scan cost 3% of a PUT-heavy run).
        let mut touched: Vec<u8> = Vec::new();
        while scanned.len() < budget {
            let after = s.scan_cursor.and_then(|c| {
                s.held
                    .range((Bound::Excluded(c), Bound::Unbounded))
                    .next()
                    .copied()
            });
            let Some(key) = after.or_else(|| s.held.first().copied()) else {
                break;
            };
            s.scan_cursor = Some(key);
            scanned.push(key);
            if failed.contains(&key.0) {
                continue;
            }
            let c = s.pages[&key].class;
            let pending = s.classes[c as usize].pending.len();
            let expired = self.scan_page(ep, s, key, now, &mut failed, true)?;
            if s.classes[c as usize].pending.len() > pending && !touched.contains(&c) {
                touched.push(c);
            }
            if c == class && expired > 0 {
                break;
            }
        }
        for &c in &touched {
            self.reclaim_pending(ep, s, c)?;
        }
        self.release_empty_pages(ep, s, Some(&scanned), &mut failed)
    }

    /// Scan one held page (`key`): its released entries not yet expired go on their class's
    /// pending list, and so do the expired ones if `list_expired` (a bounded scan, which may
    /// meet entries already listed), else they go back on their free list at once. Returns the
    /// entries reclaimed, or listed expired; a failure of another node is remembered in
    /// `failed`.
    fn scan_page<E: Endpoint>(
        &self,
        ep: &mut E,
        s: &mut State,
        (host, page): (NodeId, u64),
        now: u64,
        failed: &mut Vec<NodeId>,
        list_expired: bool,
    ) -> Result<u64, FabricError> {
        let ps = &s.pages[&(host, page)];
        let (class, handed) = (ps.class, ps.handed);
        let mut waiting = Vec::new();
        let found = self.expired_entries(ep, host, page, class, handed, now, &mut waiting);
        let Some(expired) = self.tolerate(host, found, failed)? else {
            return Ok(0);
        };
        let slot = |i| Slot {
            host,
            class,
            slot: self.classes.slot(class, page, i),
        };
        for &(i, ready) in &waiting {
            self.list(s, ready, slot(i));
        }
        if list_expired {
            for &(i, ready) in &expired {
                self.list(s, ready, slot(i));
            }
            return Ok(expired.len() as u64);
        }
        let mut reclaimed = 0;
        for (i, _) in expired {
            if self.is_listed(s, slot(i)) {
                // PD1: the pending list hands it out (`scan_all` takes what is due there);
                // reclaimed here too, it would be on the free list twice.
                continue;
            }
            if !self.clear_released(ep, s, slot(i), false, failed)? {
                break;
            }
            reclaimed += 1;
        }
        Ok(reclaimed)
    }

    /// The result of a fabric operation on `host`'s memory during a scan or a claim. A failure
    /// on another node (it may have died) is logged and remembered in `failed`, and the caller
    /// skips that node's pages (`None`): one dead node must not stop this node's writers, whose
    /// own memory and other nodes' may still have room. A failure on this node is returned.
    fn tolerate<T>(
        &self,
        host: NodeId,
        r: Result<T, FabricError>,
        failed: &mut Vec<NodeId>,
    ) -> Result<Option<T>, FabricError> {
        match r {
            Ok(v) => Ok(Some(v)),
            // Not an error naming this table's own member: that is the writer's own death
            // (or fence), not the host's, and no other host would do better.
            Err(e) if host != self.node && !self.names_me(&e) => {
                tracing::warn!(%e, node = self.node, host, "skipping the pages of an unreachable node");
                failed.push(host);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Whether `e` is about this table's own member rather than a host it tried.
    fn names_me(&self, e: &FabricError) -> bool {
        matches!(e, FabricError::Unreachable { node, .. } | FabricError::Fenced { node }
            if *node == self.node)
    }

    /// Entries among the first `handed` of a page whose recycle expiry (plus the clock margin)
    /// has passed, with that time (index in the page, time); the others that carry a recycle
    /// flag go into `waiting` with the time they will be ready. A local page is read word by word; a remote one
    /// with a single READ of its entries, or, when they are [`WORD_READS_FROM`] bytes or more,
    /// with a READ of each recycle word.
    #[allow(clippy::too_many_arguments)]
    fn expired_entries<E: Endpoint>(
        &self,
        ep: &mut E,
        host: NodeId,
        page: u64,
        class: u8,
        handed: u64,
        now: u64,
        waiting: &mut Vec<(u64, u64)>,
    ) -> Result<Vec<(u64, u64)>, FabricError> {
        let size = self.classes.entry_size(class);
        let base = RemoteAddr::new(host, DATA_REGION, page * self.classes.page_bytes());
        let remote = host != ep.node();
        let mut whole = Vec::new();
        if remote && handed > 0 && size < WORD_READS_FROM {
            whole = vec![0u8; (handed * size) as usize];
            ep.read(base, &mut whole)?;
        }
        let mut expired = Vec::new();
        for i in 0..handed {
            let at = i * size + RECYCLE_OFF;
            let word = if !whole.is_empty() {
                u64::from_le_bytes(whole[at as usize..at as usize + 8].try_into().unwrap())
            } else {
                let mut w = [0u8; 8];
                read_words(ep, base.add(at), &mut w)?;
                u64::from_le_bytes(w)
            };
            let Some(expiry) = DteLayout::recycle_expiry(word) else {
                continue;
            };
            let ready = expiry.saturating_add(self.clock_margin_ns);
            if now > ready {
                expired.push((i, ready));
            } else {
                waiting.push((i, ready));
            }
        }
        Ok(expired)
    }

    /// Give back every page with no entry in use, open pages included: a class that has gone
    /// quiet must not keep memory another class needs.
    fn release_empty_pages<E: Endpoint>(
        &self,
        ep: &mut E,
        s: &mut State,
        only: Option<&[(NodeId, u64)]>,
        failed: &mut Vec<NodeId>,
    ) -> Result<(), FabricError> {
        // An empty page of a refused host (its tables settle) is released later, unless a
        // class waits for it (drained): the release, a CAS there, would wait under the table's
        // lock.
        let mut hosts = HostCache::default();
        let empty = |k: &(NodeId, u64)| {
            s.pages.get(k).is_some_and(|p| {
                p.in_use == 0 && (p.drain.is_some() || hosts.usable(self, k.0, true))
            }) && !failed.contains(&k.0)
        };
        // In key order (`held` is sorted), not the map's: the simulator replays runs exactly.
        let empty: Vec<(NodeId, u64)> = match only {
            Some(keys) => keys.iter().copied().filter(empty).collect(),
            None => s.held.iter().copied().filter(empty).collect(),
        };
        // Released pages by pool (class, reserve): their entries leave each free list in one
        // pass at the end, not one pass per page (which was quadratic in a large table).
        let mut released: HashMap<(u8, bool), HashSet<(NodeId, u64)>> = HashMap::new();
        let mut result = Ok(());
        for key in empty {
            let claim = s.pages[&key].claim;
            let ours = match self.tolerate(key.0, pages::release_page(ep, &claim), failed) {
                Ok(Some(ours)) => ours,
                Ok(None) => continue,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            if !ours {
                // Survivors adopt the pages of a node failed for good (`adopt_gone`): this
                // process was that node, paused or cut off past its replacement. Its writers
                // were fenced meanwhile, so the page is theirs now; forget it as if released.
                tracing::warn!(
                    node = self.node,
                    host = key.0,
                    page = key.1,
                    "a page this node held was adopted by another while it was failed"
                );
            }
            let ps = s.pages.remove(&key).expect("held");
            s.held.remove(&key);
            if ps.drain.is_some() {
                s.draining -= 1;
            }
            let pool = s.classes[ps.class as usize].pool(ps.reserve);
            if pool.open == Some(key) {
                pool.open = None;
            }
            released
                .entry((ps.class, ps.reserve))
                .or_default()
                .insert(key);
        }
        for ((class, reserve), pages) in released {
            let per_page = self.classes.per_page(class);
            let pool = s.classes[class as usize].pool(reserve);
            pool.free
                .retain(|f| !pages.contains(&(f.host, f.slot / per_page)));
        }
        result
    }

    /// Take over the pages an earlier incarnation of this node claimed. A restarted node's
    /// allocator starts empty, but the page words (in every node's page table, read here
    /// through `ep`) still name this node as their claimer: without this, those pages and
    /// their entries would never be reused. Call it before this node allocates anything.
    /// See [`ClassTable::take_over`] for what a page holds.
    ///
    /// The words are taken as they are, not by CAS: a joining node changes no replicated
    /// memory (its copies are receiving, `NodeRole::Receiving`). No survivor takes one of them
    /// meanwhile: survivors adopt only from a node the configuration says is `failed`
    /// ([`ClassTable::adopt_gone`]), by a CAS made while their view is fresh (a lease TTL),
    /// and this runs a join settle time (more than a TTL) after the node became `joining`;
    /// so every such CAS landed before these words are read, and its page is skipped.
    pub fn adopt<E: Endpoint>(&self, ep: &mut E) -> Result<Adopted, FabricError> {
        let me = self.node;
        let hosts = if self.remote {
            (0..self.nodes as NodeId).collect()
        } else {
            vec![self.node]
        };
        self.take_over(ep, &hosts, false, |_, _, w| w.claimer() == me)
    }

    /// Take over this node's share of the pages claimed by `gone`, nodes failed for good
    /// (`membership.replace_after_s`): their allocators died with them, so without this their
    /// pages and the entries in them would stay claimed until they came back, perhaps never.
    /// The survivors share the work: the one of rank `rank` of `of` takes the pages whose
    /// number across the cluster is `rank` modulo `of`; a page another survivor (or a
    /// returning incarnation of the node) took first is left to it. Pages of every node's
    /// table are looked at, wherever `gone` claimed them.
    ///
    /// Each page is taken by a CAS from its word to one naming this node a generation on, so
    /// two heirs never both hold it, and copies carry the change as any claim. Safe because a
    /// node failed that long starts no write: its lease lapsed (it is fenced) and, if its
    /// process lives on (paused, cut off), it must join again before it writes; joining
    /// adopts what still names it ([`ClassTable::adopt`]) and forgets what its allocator held
    /// and finds taken.
    ///
    /// `still(node)` is asked right before each CAS: whether `node` is still gone as the
    /// caller's current view says (and the pass within its time). The argument that no
    /// returning incarnation uses a page adopted from it rests on every adopting CAS being
    /// issued while a fresh view says its claimer is failed.
    pub fn adopt_gone<E: Endpoint>(
        &self,
        ep: &mut E,
        gone: &[NodeId],
        rank: u64,
        of: u64,
        still: impl Fn(NodeId) -> bool,
    ) -> Result<Adopted, FabricError> {
        assert!(rank < of, "survivor {rank} of {of}");
        assert!(
            !gone.contains(&self.node),
            "a node adopting its own pages as gone"
        );
        let hosts: Vec<NodeId> = (0..self.nodes as NodeId).collect();
        let per_node = self.pages_per_node;
        self.take_over(ep, &hosts, self.adopt_by_cas, |host, page, w| {
            gone.contains(&w.claimer())
                && (host as u64 * per_node + page) % of == rank
                && still(w.claimer())
        })
    }

    /// Take every claimed page of `hosts`' tables whose word `wants`: with `by_cas`, by a CAS
    /// from its word to one naming this node a generation on (a page another heir took first
    /// is left to it); else with its word as read. Each page is adopted whole: an entry whose header and
    /// recycle word are both zero (never written, or reclaimed: the scan clears both) is free;
    /// any other is in use (live, awaiting expiry, which a scan then reclaims, or left by a
    /// write its dead writer never published, which stays lost). Pages this allocator holds
    /// whose word changed meanwhile were taken from it while its node was failed: forgotten.
    fn take_over<E: Endpoint>(
        &self,
        ep: &mut E,
        hosts: &[NodeId],
        by_cas: bool,
        wants: impl Fn(NodeId, u64, PageWord) -> bool,
    ) -> Result<Adopted, FabricError> {
        let mut s = self.lock_state(ep);
        let mut done = Adopted::default();
        let word = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        for &host in hosts {
            let mut words = vec![0u8; (self.pages_per_node * 8) as usize];
            ep.read(RemoteAddr::new(host, PAGE_REGION, 0), &mut words)?;
            for page in 0..self.pages_per_node {
                let w = PageWord(word(&words, page as usize * 8));
                if let Some(held) = s.pages.get(&(host, page)) {
                    if held.claim.word != w {
                        self.forget(&mut s, (host, page));
                        done.lost += 1;
                    }
                    continue;
                }
                if !w.is_claimed() || !wants(host, page, w) {
                    continue;
                }
                // A CAS on a page word of a host whose tables settle waits that out (rule 10a
                // of `docs/protocol.md`), here under the table's lock: every writer of this
                // node would wait with it (a 3–6 s stall of the whole cluster after each node
                // left, 2026-12-01). Asked right before each page, this node's own included;
                // the page is taken at a later look.
                if by_cas && self.adopt_defers && self.host_use(host) != HostUse::Now {
                    done.deferred += 1;
                    continue;
                }
                let class = w.class();
                // The entries first: a READ that fails then leaves nothing claimed and not
                // held. Their state cannot change before the CAS in a way that matters: only
                // the claimer (gone) hands out a free entry; others only release used ones.
                let (per_page, size) =
                    (self.classes.per_page(class), self.classes.entry_size(class));
                let mut bytes = vec![0u8; (per_page * size) as usize];
                let base = page * self.classes.page_bytes();
                ep.read(RemoteAddr::new(host, DATA_REGION, base), &mut bytes)?;
                let mine = if by_cas {
                    let mine = PageWord::claimed_after(w, self.node, class);
                    let at = RemoteAddr::new(host, PAGE_REGION, page * 8);
                    let found = match ep.compare_and_swap(at, w.0, mine.0) {
                        Ok(found) => found,
                        // Whether it took place is unknown: the word says (a page claimed
                        // and never held would stay claimed for good).
                        Err(FabricError::Indeterminate { .. }) => {
                            let mut b = [0u8; 8];
                            ep.read(at, &mut b)?;
                            match u64::from_le_bytes(b) == mine.0 {
                                true => w.0,
                                false => mine.0,
                            }
                        }
                        Err(e) => return Err(e),
                    };
                    if found != w.0 {
                        continue; // another heir took it first
                    }
                    mine
                } else {
                    w
                };
                let mut in_use = 0;
                for i in 0..per_page {
                    let at = (i * size) as usize;
                    if word(&bytes, at + HEADER_OFF as usize) == 0
                        && word(&bytes, at + RECYCLE_OFF as usize) == 0
                    {
                        let slot = self.classes.slot(class, page, i);
                        s.classes[class as usize]
                            .normal
                            .free
                            .push(Slot { host, class, slot });
                    } else {
                        in_use += 1;
                    }
                }
                let claim = Claim {
                    host,
                    page,
                    word: mine,
                };
                s.held.insert((host, page));
                s.pages.insert(
                    (host, page),
                    PageState::new(claim, class, per_page, in_use, false),
                );
                done.pages += 1;
                done.in_use += in_use;
                done.free += per_page - in_use;
            }
        }
        Ok(done)
    }

    /// Drop a held page from the allocator's state without touching its word (another node
    /// holds it now): its free entries leave the free lists and its pending ones the queue.
    fn forget(&self, s: &mut State, key: (NodeId, u64)) {
        let Some(ps) = s.pages.remove(&key) else {
            return;
        };
        s.held.remove(&key);
        if ps.drain.is_some() {
            s.draining -= 1;
        }
        let per_page = self.classes.per_page(ps.class);
        let cs = &mut s.classes[ps.class as usize];
        cs.pending.retain(|f| (f.host, f.slot / per_page) != key);
        let pool = cs.pool(ps.reserve);
        if pool.open == Some(key) {
            pool.open = None;
        }
        pool.free.retain(|f| (f.host, f.slot / per_page) != key);
        if s.scan_cursor == Some(key) {
            s.scan_cursor = None;
        }
    }

    /// Fill of every class.
    pub fn usage(&self) -> Vec<ClassUsage> {
        let s = self.state.lock().unwrap();
        let mut u: Vec<ClassUsage> = (0..self.classes.len())
            .map(|c| ClassUsage {
                entry_size: self.classes.entry_size(c as u8),
                free: (s.classes[c].normal.free.len() + s.classes[c].reserve.free.len()) as u64,
                ..ClassUsage::default()
            })
            .collect();
        for ((host, _), p) in s.pages.iter() {
            let c = &mut u[p.class as usize];
            c.pages += 1;
            c.remote_pages += (host != self.node) as u64;
            c.in_use += p.in_use;
        }
        u
    }
}

/// Read words of a data table, directly when they are this node's own.
pub fn read_words<E: Endpoint>(
    ep: &mut E,
    at: RemoteAddr,
    buf: &mut [u8],
) -> Result<(), FabricError> {
    if at.node == ep.node() {
        ep.local_read(at.region, at.offset, buf)
    } else {
        ep.read(at, buf)
    }
}

/// Write words of a data table, directly when they are this node's own.
#[cfg(test)]
fn write_words<E: Endpoint>(ep: &mut E, at: RemoteAddr, bytes: &[u8]) -> Result<(), FabricError> {
    if at.node == ep.node() {
        ep.local_write(at.region, at.offset, bytes)
    } else {
        ep.write(at, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nessie_fabric::inproc::InProcFabric;
    use std::collections::HashSet;

    const PAGES: u64 = 4;

    /// `nodes` nodes of `PAGES` pages each, and a table for each node.
    fn setup(nodes: usize) -> (Arc<InProcFabric>, Vec<ClassTable>) {
        let classes = Arc::new(SizeClasses::new(32, 600_000).unwrap());
        let regions = vec![8, PAGES * classes.page_bytes(), PAGES * 8];
        let f = InProcFabric::new(&vec![regions; nodes], None).unwrap();
        let tables = (0..nodes)
            .map(|n| ClassTable::new(n as NodeId, nodes, classes.clone(), PAGES, 0))
            .collect();
        (f, tables)
    }

    /// Mark an entry recycled with an expiry long past.
    fn recycle(f: &Arc<InProcFabric>, t: &ClassTable, slot: Slot) {
        let at = t.addr(slot).add(RECYCLE_OFF);
        let mut ep = f.endpoint(0);
        ep.write(at, &DteLayout::recycle_word(1).to_le_bytes())
            .unwrap();
    }

    /// Allocate entries of the largest class on `t`'s node until its own pages and one page of
    /// node 1 are full, then mark them all recycled long ago. Returns how many.
    fn fill_beyond_own_pages_and_recycle(
        f: &Arc<InProcFabric>,
        t: &ClassTable,
        ep: &mut nessie_fabric::inproc::InProcEndpoint,
    ) -> u64 {
        let big = (t.classes().len() - 1) as u8;
        let n = (PAGES - RESERVE_PAGES + 1) * t.classes().per_page(big);
        let slots: Vec<Slot> = (0..n)
            .map(|_| t.alloc_for(ep, big, Purpose::Value).unwrap())
            .collect();
        assert!(slots.iter().any(|s| s.host == 1));
        for s in &slots {
            recycle(f, t, *s);
        }
        n
    }

    /// Entries at hand on a node the host guard refuses (its tables settle after a copy
    /// became full) are passed over for a page elsewhere, and taken only when nothing else is
    /// left: better a write that waits than a table full.
    #[test]
    fn entries_on_a_refused_host_are_passed_over_but_not_lost() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let (f, t) = setup(3);
        let refused = Arc::new(AtomicU64::new(0));
        let r = refused.clone();
        let guard = HostGuard(Arc::new(move |n| {
            if r.load(Ordering::SeqCst) & (1 << n) == 0 {
                HostUse::Now
            } else {
                HostUse::Avoid
            }
        }));
        let classes = Arc::new(SizeClasses::new(32, 600_000).unwrap());
        drop(t);
        let t0 = ClassTable::new(0, 3, classes, PAGES, 0).hosts_guarded(guard);
        let mut ep = f.endpoint(0);
        let big = (t0.classes().len() - 1) as u8;
        // Own pages full, then one entry of a page of node 1: the rest of it is at hand.
        let slot = loop {
            let s = t0.alloc_for(&mut ep, big, Purpose::Value).unwrap();
            if s.host != 0 {
                break s;
            }
        };
        assert_eq!(slot.host, 1);
        assert!(
            t0.classes().per_page(big) > 1,
            "the page has entries left at hand"
        );
        refused.store(1 << 1, Ordering::SeqCst);
        let next = t0.alloc_for(&mut ep, big, Purpose::Value).unwrap();
        assert_eq!(
            next.host, 2,
            "node 1's open page is passed over for one of node 2"
        );
        // With both refused, the rest of node 1's page (closed, not stranded) and of node 2's
        // are taken, every one, before the table is full.
        refused.store((1 << 1) | (1 << 2), Ordering::SeqCst);
        let per = t0.classes().per_page(big);
        let mut taken = vec![slot, next];
        while let Ok(s) = t0.alloc_for(&mut ep, big, Purpose::Value) {
            assert_ne!(s.host, 0);
            assert!(!taken.contains(&s), "{s:?} handed out twice");
            taken.push(s);
            if taken.len() as u64 == 2 * per {
                break;
            }
        }
        assert_eq!(taken.iter().filter(|s| s.host == 1).count() as u64, per);
        assert_eq!(taken.iter().filter(|s| s.host == 2).count() as u64, per);
        // Nothing at hand: a page of a node to avoid is claimed rather than the table full.
        let s = t0.alloc_for(&mut ep, big, Purpose::Value).unwrap();
        assert_eq!(s.host, 1, "a fresh page of the nearest node to avoid");
        assert!(!taken.contains(&s), "{s:?} handed out twice");
    }

    /// A node to avoid (a claim there waits out its settle time) is claimed when nothing else
    /// is left; a standby node (`HostUse::Never`) never is.
    #[test]
    fn avoided_hosts_are_claimed_last_and_standby_hosts_never() {
        use std::sync::atomic::{AtomicU8, Ordering};
        let (f, t) = setup(2);
        drop(t);
        let what = Arc::new(AtomicU8::new(0));
        let w = what.clone();
        let guard = HostGuard(Arc::new(move |n| match (n, w.load(Ordering::SeqCst)) {
            (0, _) | (_, 0) => HostUse::Now,
            (_, 1) => HostUse::Avoid,
            _ => HostUse::Never,
        }));
        let classes = Arc::new(SizeClasses::new(32, 600_000).unwrap());
        let t0 = ClassTable::new(0, 2, classes, PAGES, 0).hosts_guarded(guard);
        let mut ep = f.endpoint(0);
        let big = (t0.classes().len() - 1) as u8;
        let local = (PAGES - RESERVE_PAGES) * t0.classes().per_page(big);
        for _ in 0..local {
            assert_eq!(t0.alloc_for(&mut ep, big, Purpose::Value).unwrap().host, 0);
        }
        what.store(2, Ordering::SeqCst);
        let e = t0.alloc_for(&mut ep, big, Purpose::Value).unwrap_err();
        assert!(matches!(e, ClassAllocError::Full { .. }), "{e}");
        what.store(1, Ordering::SeqCst);
        let s = t0.alloc_for(&mut ep, big, Purpose::Value).unwrap();
        assert_eq!(s.host, 1, "the node to avoid, as nothing else has room");
    }

    #[test]
    fn local_pages_first_then_other_nodes() {
        let (f, t) = setup(2);
        let mut ep = f.endpoint(0);
        let big = (t[0].classes().len() - 1) as u8;
        let per = t[0].classes().per_page(big);
        let local_pages = PAGES - RESERVE_PAGES;
        let remote_pages = local_pages - owner_share(PAGES);
        let hosts: Vec<NodeId> = (0..(local_pages + remote_pages) * per)
            .map(|_| t[0].alloc_for(&mut ep, big, Purpose::Value).unwrap().host)
            .collect();
        let local = (local_pages * per) as usize;
        assert!(hosts[..local].iter().all(|&h| h == 0), "{hosts:?}");
        assert!(hosts[local..].iter().all(|&h| h == 1), "{hosts:?}");
        let e = t[0].alloc_for(&mut ep, big, Purpose::Value).unwrap_err();
        assert!(
            matches!(e, ClassAllocError::Full { class, .. } if class == big),
            "{e}"
        );
        // The reserve is for deletes.
        assert_eq!(
            t[0].alloc_for(&mut ep, big, Purpose::Delete).unwrap().host,
            0
        );
        let u = &t[0].usage()[big as usize];
        assert_eq!(
            (u.pages, u.remote_pages, u.in_use),
            (
                local_pages + 1 + remote_pages,
                remote_pages,
                (local_pages + remote_pages) * per + 1
            )
        );
        // Node 1's own writers still have their share of its memory.
        let mut ep1 = f.endpoint(1);
        let s = t[1].alloc_for(&mut ep1, big, Purpose::Value).unwrap();
        assert_eq!(s.host, 1);
    }

    /// Client member 7 of a 3-node cluster (`remote_only`): never a page of its own id, every
    /// node's pages from the one its id falls on, each node's reserve and its owner's share
    /// left, deletes still served from the reserve; its page words name it.
    #[test]
    fn a_client_table_claims_only_nodes_pages_and_leaves_their_share() {
        const CLIENT: NodeId = 7;
        let (f, t) = setup(3);
        let client = ClassTable::new(CLIENT, 3, t[0].classes.clone(), PAGES, 0).remote_only();
        let mut ep = f.client_endpoint(CLIENT);
        let big = (client.classes().len() - 1) as u8;
        let per = client.classes().per_page(big);
        let per_host = PAGES - RESERVE_PAGES - owner_share(PAGES);
        assert!(per_host > 0, "the test needs pages a client may claim");
        let hosts: Vec<NodeId> = (0..3 * per_host * per)
            .map(|_| client.alloc_for(&mut ep, big, Purpose::Value).unwrap().host)
            .collect();
        // Nearest first from the node its id falls on: 7 % 3 = 1, then 2, then 0.
        let expect: Vec<NodeId> = [1, 2, 0]
            .iter()
            .flat_map(|&h| std::iter::repeat_n(h, (per_host * per) as usize))
            .collect();
        assert_eq!(hosts, expect);
        let e = client.alloc_for(&mut ep, big, Purpose::Value).unwrap_err();
        assert!(
            matches!(e, ClassAllocError::Full { class, .. } if class == big),
            "{e}"
        );
        // The nodes' own writers still have their share; deletes take a reserve page.
        for (n, table) in t.iter().enumerate() {
            let mut own = f.endpoint(n as NodeId);
            let s = table.alloc_for(&mut own, big, Purpose::Value).unwrap();
            assert_eq!(s.host, n as NodeId, "node {n}'s own writer");
        }
        let d = client.alloc_for(&mut ep, big, Purpose::Delete).unwrap();
        assert!((d.host as usize) < 3, "{d:?}");
        let claimed_by_client: u64 = (0..3)
            .flat_map(|h| pages::read_table(&mut ep, h, PAGES).unwrap())
            .filter(|w| w.is_claimed() && w.claimer() == CLIENT)
            .count() as u64;
        assert_eq!(claimed_by_client, 3 * per_host + 1);
        assert_eq!(
            client.usage()[big as usize].remote_pages,
            3 * per_host + 1,
            "every page a client holds is another node's"
        );
    }

    /// A client member that dies leaves its pages to the nodes, which adopt each once by CAS
    /// and reuse its free entries; its endpoints issue nothing more.
    #[test]
    fn nodes_adopt_a_dead_clients_pages_once() {
        const CLIENT: NodeId = 9;
        let (f, t) = setup(3);
        let client = ClassTable::new(CLIENT, 3, t[0].classes.clone(), PAGES, 0).remote_only();
        let mut ep = f.client_endpoint(CLIENT);
        let big = (client.classes().len() - 1) as u8;
        let per = client.classes().per_page(big);
        let slots: Vec<Slot> = (0..2 * per + 1)
            .map(|_| client.alloc_for(&mut ep, big, Purpose::Value).unwrap())
            .collect();
        let live = slots.iter().step_by(2).count() as u64;
        for s in slots.iter().step_by(2) {
            ep.write(client.addr(*s).add(HEADER_OFF), &7u64.to_le_bytes())
                .unwrap();
        }
        let held = client.usage()[big as usize].pages;
        assert_eq!(held, 3, "{:?}", client.usage()[big as usize]);
        f.kill_client(CLIENT);
        // A class with nothing at hand: the allocator must reach a node, and fails as dead.
        let r = client.alloc_for(&mut ep, 0, Purpose::Value);
        assert!(
            matches!(r, Err(ClassAllocError::Fabric(FabricError::Unreachable { node, .. })) if node == CLIENT),
            "a dead client's endpoint reaches nothing: {r:?}"
        );
        let claimed_by = |ep: &mut nessie_fabric::inproc::InProcEndpoint, who: NodeId| {
            (0..3)
                .flat_map(|h| pages::read_table(ep, h, PAGES).unwrap())
                .filter(|w| w.is_claimed() && w.claimer() == who)
                .count() as u64
        };
        let mut eps: Vec<_> = (0..3).map(|n| f.endpoint(n)).collect();
        assert_eq!(claimed_by(&mut eps[0], CLIENT), held);
        let adopted: Vec<Adopted> = (0..3)
            .map(|n| {
                t[n].adopt_gone(&mut eps[n], &[CLIENT], n as u64, 3, |_| true)
                    .unwrap()
            })
            .collect();
        assert_eq!(adopted.iter().map(|a| a.pages).sum::<u64>(), held);
        assert_eq!(adopted.iter().map(|a| a.in_use).sum::<u64>(), live);
        assert_eq!(claimed_by(&mut eps[0], CLIENT), 0);
        let again = t[0]
            .adopt_gone(&mut eps[0], &[CLIENT], 0, 1, |_| true)
            .unwrap();
        assert_eq!(again.pages, 0, "each page adopted once: {again:?}");
    }

    #[test]
    #[should_panic(expected = "belongs to a client")]
    fn a_node_id_cannot_make_a_remote_only_table() {
        let (_f, t) = setup(3);
        let _ = ClassTable::new(2, 3, t[0].classes.clone(), PAGES, 0).remote_only();
    }

    #[test]
    fn entries_are_distinct_and_do_not_overlap() {
        let (f, t) = setup(1);
        let mut ep = f.endpoint(0);
        let mut taken: Vec<(u64, u64)> = Vec::new();
        let mut seen = HashSet::new();
        for class in [0u8, 3, 7] {
            for _ in 0..500 {
                let s = t[0].alloc_for(&mut ep, class, Purpose::Value).unwrap();
                assert!(seen.insert(s), "{s:?} handed out twice");
                let a = t[0].addr(s).offset;
                taken.push((a, a + t[0].classes().entry_size(class)));
            }
        }
        taken.sort();
        for w in taken.windows(2) {
            assert!(w[0].1 <= w[1].0, "entries {w:?} overlap");
        }
    }

    #[test]
    fn recycled_entries_come_back_after_expiry_and_empty_pages_go_back() {
        let (f, t) = setup(1);
        let mut ep = f.endpoint(0);
        let big = (t[0].classes().len() - 1) as u8;
        let per = t[0].classes().per_page(big);
        let slots: Vec<Slot> = (0..(PAGES - RESERVE_PAGES) * per)
            .map(|_| t[0].alloc_for(&mut ep, big, Purpose::Value).unwrap())
            .collect();
        assert!(t[0].alloc_for(&mut ep, big, Purpose::Value).is_err());
        recycle(&f, &t[0], slots[1]);
        let again = t[0].alloc_for(&mut ep, big, Purpose::Value).unwrap();
        assert_eq!(again, slots[1], "the expired entry is reused");

        // Release everything: pages with no entry in use go back to the pool.
        for s in &slots {
            recycle(&f, &t[0], *s);
        }
        assert_eq!(t[0].reclaim(&mut ep).unwrap(), slots.len() as u64);
        let words = pages::read_table(&mut ep, 0, PAGES).unwrap();
        let held = words.iter().filter(|w| w.is_claimed()).count();
        assert_eq!(held, 0, "every page went back: {words:?}");
    }

    /// One scan releases many pages at once, of two nodes, beside a page it keeps: the released
    /// pages' entries leave the free list (their pages then go to another class), the kept
    /// page's come back, and nothing is handed out twice or overlaps the entry still in use.
    #[test]
    fn a_scan_that_releases_many_pages_keeps_every_entry_single() {
        let (f, t) = setup(2);
        let mut ep = f.endpoint(0);
        let mut all = Vec::new();
        while let Ok(s) = t[0].alloc_for(&mut ep, 0, Purpose::Value) {
            all.push(s);
        }
        let per = t[0].classes().per_page(0);
        let page_of = |s: &Slot| (s.host, s.slot / per);
        assert!(all.iter().any(|s| s.host == 1), "pages of both nodes");
        let kept = all[per as usize + 1]; // in the second page
        for s in all.iter().filter(|s| **s != kept) {
            recycle(&f, &t[0], *s);
        }
        assert_eq!(t[0].reclaim(&mut ep).unwrap(), all.len() as u64 - 1);
        assert_eq!(
            t[0].usage()[0].pages,
            1,
            "only the kept entry's page is held"
        );
        let mut taken = vec![kept];
        while let Ok(s) = t[0].alloc_for(&mut ep, 1, Purpose::Value) {
            taken.push(s);
        }
        while let Ok(s) = t[0].alloc_for(&mut ep, 0, Purpose::Value) {
            assert_eq!(
                page_of(&s),
                page_of(&kept),
                "class 0 keeps only its held page"
            );
            taken.push(s);
        }
        assert!(taken.iter().any(|s| s.class == 1 && s.host == 1));
        let mut ranges: Vec<(NodeId, u64, u64)> = taken
            .iter()
            .map(|s| {
                let a = t[0].addr(*s).offset;
                (s.host, a, a + t[0].classes().entry_size(s.class))
            })
            .collect();
        ranges.sort();
        for w in ranges.windows(2) {
            assert!(
                w[0].0 != w[1].0 || w[0].2 <= w[1].1,
                "entries {w:?} overlap"
            );
        }
    }

    /// Two nodes of `pages` pages each, with small classes (a page holds many small entries).
    fn setup_many(pages: u64) -> (Arc<InProcFabric>, Vec<ClassTable>) {
        let classes = Arc::new(SizeClasses::new(32, 4000).unwrap());
        let regions = vec![8, pages * classes.page_bytes(), pages * 8];
        let f = InProcFabric::new(&vec![regions; 2], None).unwrap();
        let tables = (0..2)
            .map(|n| ClassTable::new(n as NodeId, 2, classes.clone(), pages, 0))
            .collect();
        (f, tables)
    }

    fn fabric_ops_of(f: &InProcFabric, node: NodeId) -> u64 {
        f.stats().total(Some(node)).fabric_ops()
    }

    /// A write that finds no room does a bounded amount of fabric work however many pages the
    /// node holds: a scan of every held page per write made a nearly full store crawl.
    #[test]
    fn a_write_near_full_costs_bounded_fabric_work() {
        let mut per_attempt = Vec::new();
        for pages in [64u64, 256] {
            let (f, t) = setup_many(pages);
            let mut ep = f.endpoint(0);
            let mut held = 0;
            while t[0].alloc_for(&mut ep, 0, Purpose::Value).is_ok() {
                held += 1;
            }
            assert!(held > 0);
            let remote_pages = t[0].usage().iter().map(|u| u.remote_pages).sum::<u64>();
            assert!(
                remote_pages > 2 * ROOM_SCAN_PAGES as u64,
                "the test needs more held remote pages ({remote_pages}) than a bounded scan reads"
            );
            let before = fabric_ops_of(&f, 0);
            for _ in 0..10 {
                assert!(t[0].alloc_for(&mut ep, 0, Purpose::Value).is_err());
            }
            per_attempt.push((fabric_ops_of(&f, 0) - before) / 10);
        }
        // Each attempt: at most ROOM_SCAN_PAGES page READs, and a READ of the page table per
        // claim tried (PAGE_SCAN_CHUNK words each).
        let bound = ROOM_SCAN_PAGES as u64 + 8;
        assert!(
            per_attempt.iter().all(|&n| n <= bound),
            "fabric operations per refused write at 64 and 256 pages: {per_attempt:?} (bound {bound})"
        );
    }

    /// Eviction's signal: only once every page is claimed, and then while the class has fewer
    /// entries at hand than twice what its writers took in the last period (a quarter page at
    /// least, `max` at most), and all classes' together less than 1/share of the held pages.
    #[test]
    fn short_of_room_follows_the_rate_of_the_class() {
        let (f, t) = setup_many(16);
        let mut ep = f.endpoint(0);
        let quarter = t[0].classes().per_page(0) / 4;
        assert!(
            !t[0].short_of_room(0, 0, 1_000, u64::MAX, 1),
            "pages are free"
        );
        let mut taken = Vec::new();
        while let Ok(s) = t[0].alloc_for(&mut ep, 0, Purpose::Value) {
            taken.push(s);
        }
        assert!(
            t[0].short_of_room(0, 0, 1_000, u64::MAX, 1),
            "full, nothing at hand"
        );
        assert!(!t[0].short_of_room(0, 0, 1_000, 0, 1), "max 0: never short");
        for s in taken.drain(..quarter as usize) {
            t[0].release_unpublished(&mut ep, s);
        }
        assert!(
            !t[0].short_of_room(0, 0, 1_000, u64::MAX, 1),
            "a quarter page at hand"
        );
        // A period in which 3 quarter pages were taken: twice that is wanted at hand.
        let mut again = Vec::new();
        for _ in 0..3 {
            while let Ok(s) = t[0].alloc_for(&mut ep, 0, Purpose::Value) {
                again.push(s);
            }
            for s in again.drain(..) {
                t[0].release_unpublished(&mut ep, s);
            }
            for _ in 0..quarter {
                again.push(t[0].alloc_for(&mut ep, 0, Purpose::Value).unwrap());
            }
        }
        for s in again.drain(..) {
            t[0].release_unpublished(&mut ep, s);
        }
        // `quarter` entries at hand, and 3 quarters (and the fill) taken in the window.
        assert!(
            t[0].short_of_room(0, 1_000, 1_000, u64::MAX, 1),
            "the rate asks for more"
        );
        assert!(
            !t[0].short_of_room(0, 1_500, 1_000, quarter, 1),
            "capped at max"
        );
        // The bytes at hand of every class together are capped at 1/share of the held pages:
        // an eighth of a page here, less than the quarter page at hand.
        let held = t[0].usage().iter().map(|u| u.pages).sum::<u64>();
        assert!(
            !t[0].short_of_room(0, 1_500, 1_000, u64::MAX, 8 * held),
            "capped across classes"
        );
    }

    /// Bounded scans go round every held page: an expired entry on any page is found within a
    /// lap, and entries met again by later scans (of another class's writer) are handed out
    /// once each.
    #[test]
    fn bounded_scans_cover_every_page_and_hand_out_each_entry_once() {
        let pages = 96;
        let (f, t) = setup_many(pages);
        let mut ep = f.endpoint(0);
        let big = (t[0].classes().len() - 1) as u8;
        let mut bigs = Vec::new();
        while let Ok(s) = t[0].alloc_for(&mut ep, big, Purpose::Value) {
            if s.class != big {
                t[0].release_unpublished(&mut ep, s);
                break;
            }
            bigs.push(s);
        }
        let held = t[0].usage().iter().map(|u| u.pages).sum::<u64>();
        assert!(held > 3 * ROOM_SCAN_PAGES as u64, "{held} pages held");
        // Every entry released, to expire in 40 ms.
        let expires = ep.now_ns() + 40_000_000;
        for s in &bigs {
            let at = t[0].addr(*s).add(RECYCLE_OFF);
            ep.write(at, &DteLayout::recycle_word(expires).to_le_bytes())
                .unwrap();
        }
        // Writers of a small class scan lap after lap, meeting the released entries again.
        let laps = 3 * held as usize / ROOM_SCAN_PAGES + 1;
        for _ in 0..laps {
            assert!(t[0].alloc_for(&mut ep, 0, Purpose::Value).is_err());
        }
        while ep.now_ns() <= expires {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut again = HashSet::new();
        let mut refused = 0;
        while again.len() < bigs.len() {
            match t[0].alloc_for(&mut ep, big, Purpose::Value) {
                Ok(s) => assert!(again.insert(s), "{s:?} handed out twice"),
                Err(_) => {
                    refused += 1;
                    assert!(refused <= laps, "entries not found within {laps} scans");
                }
            }
        }
        let want: HashSet<Slot> = bigs.iter().copied().collect();
        assert_eq!(again, want, "the same entries, each once");
        assert!(
            t[0].alloc_for(&mut ep, big, Purpose::Value).is_err(),
            "no entry handed out twice"
        );
    }

    /// Entries a scan found released but not yet expired are taken once their time has come,
    /// without another scan; a scan meanwhile (the reclaimer's) neither loses nor doubles them.
    #[test]
    fn released_entries_are_taken_when_ready_without_scanning_again() {
        for rescan in [false, true] {
            let (f, t) = setup(1);
            let mut ep = f.endpoint(0);
            let big = (t[0].classes().len() - 1) as u8;
            let mut slots = HashSet::new();
            while let Ok(s) = t[0].alloc_for(&mut ep, big, Purpose::Value) {
                slots.insert(s);
            }
            let expires = ep.now_ns() + 40_000_000;
            for s in &slots {
                let at = t[0].addr(*s).add(RECYCLE_OFF);
                ep.write(at, &DteLayout::recycle_word(expires).to_le_bytes())
                    .unwrap();
            }
            let full = t[0].alloc_for(&mut ep, big, Purpose::Value).unwrap_err();
            let ClassAllocError::Full {
                awaiting_expiry,
                next_ready_ns,
                ..
            } = full
            else {
                panic!("{full}")
            };
            assert_eq!(awaiting_expiry, slots.len() as u64);
            assert_eq!(next_ready_ns, Some(expires + 1));
            let scans = t[0].counters().room_scans;
            assert!(t[0].alloc_for(&mut ep, big, Purpose::Value).is_err());
            assert_eq!(t[0].counters().room_scans, scans, "nothing to scan for yet");
            while ep.now_ns() <= expires {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            if rescan {
                t[0].reclaim(&mut ep).unwrap();
            }
            let scans = t[0].counters().room_scans;
            let mut again = HashSet::new();
            for _ in 0..slots.len() {
                let s = t[0].alloc_for(&mut ep, big, Purpose::Value).unwrap();
                assert!(again.insert(s), "{s:?} handed out twice");
            }
            assert_eq!(again, slots, "the same entries, each once");
            assert_eq!(t[0].counters().room_scans, scans, "taken without a scan");
            assert!(t[0].alloc_for(&mut ep, big, Purpose::Value).is_err());
            assert_eq!(
                t[0].counters().room_scans,
                scans + 1,
                "none left to wait for: a scan"
            );
        }
    }

    /// Entries this node's writers recycle are listed at once (`note_recycled`): taken when
    /// ready without any scan, each once, even when a scan meets them too (a lap of bounded
    /// scans by a small class's writers, or the reclaimer's full scan); an entry of a page the
    /// table does not hold, or a word without the recycle flag, is not listed. And a class
    /// with no room scans at most once per clock margin.
    #[test]
    fn recycled_entries_come_back_without_a_scan_and_scans_stay_rare() {
        for rescan in [false, true] {
            let classes = Arc::new(SizeClasses::new(32, 600_000).unwrap());
            let regions = vec![8, PAGES * classes.page_bytes(), PAGES * 8];
            let f = InProcFabric::new(&vec![regions; 1], None).unwrap();
            let margin = 10_000_000;
            let t = ClassTable::new(0, 1, classes, PAGES, margin);
            let mut ep = f.endpoint(0);
            let big = (t.classes().len() - 1) as u8;
            let mut slots = HashSet::new();
            while let Ok(s) = t.alloc_for(&mut ep, big, Purpose::Value) {
                assert_eq!(s.class, big);
                slots.insert(s);
            }
            let scans = t.counters().room_scans;
            let expires = ep.now_ns() + 40_000_000;
            let word = DteLayout::recycle_word(expires);
            for s in &slots {
                write_words(&mut ep, t.addr(*s).add(RECYCLE_OFF), &word.to_le_bytes()).unwrap();
                t.note_recycled(&mut ep, *s, word);
                t.note_recycled(&mut ep, *s, word); // twice: listed once
            }
            let stranger = Slot {
                host: 0,
                class: 0,
                slot: 0,
            };
            t.note_recycled(&mut ep, stranger, word); // no page of class 0 is held
            let first = *slots.iter().next().unwrap();
            t.note_recycled(&mut ep, first, 0); // no recycle flag
            let Err(ClassAllocError::Full {
                awaiting_expiry, ..
            }) = t.alloc_for(&mut ep, big, Purpose::Value)
            else {
                panic!("full until they expire")
            };
            assert_eq!(awaiting_expiry, slots.len() as u64);
            assert_eq!(t.counters().room_scans, scans, "known without a scan");
            // A small class with no page: one bounded scan per clock margin, however many
            // writers try (it meets the listed entries again).
            for _ in 0..5 {
                assert!(t.alloc_for(&mut ep, 0, Purpose::Value).is_err());
            }
            let small_scans = t.counters().room_scans - scans;
            assert!(
                small_scans <= 1,
                "{small_scans} scans within one clock margin"
            );
            while ep.now_ns() <= expires + margin {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            if rescan {
                t.reclaim(&mut ep).unwrap();
            }
            let scans = t.counters().room_scans;
            let mut again = HashSet::new();
            for _ in 0..slots.len() {
                let s = t.alloc_for(&mut ep, big, Purpose::Value).unwrap();
                assert!(again.insert(s), "{s:?} handed out twice");
            }
            assert_eq!(again, slots, "the same entries, each once");
            assert_eq!(t.counters().room_scans, scans, "taken without a scan");
            assert!(t.alloc_for(&mut ep, big, Purpose::Value).is_err());
            // A writer delayed past an entry's time notes it late, when it may have been
            // reclaimed and handed out again (as every entry is here): it is not listed, or
            // the next writer would clear it under its new item.
            for s in &slots {
                t.note_recycled(&mut ep, *s, word);
            }
            assert!(
                t.alloc_for(&mut ep, big, Purpose::Value).is_err(),
                "an entry in use was listed by a late note"
            );
        }
    }

    /// The page map keeps PG1 (its count, no empty chunk), answers only for held pages, and
    /// iterates in key order whatever the insertion order, across chunks.
    #[test]
    fn the_page_map_counts_and_orders_its_pages() {
        let claim = |host, page| Claim {
            host,
            page,
            word: PageWord(0),
        };
        let mut m = PageMap::default();
        let far = 5 * PAGE_CHUNK as u64 + 3;
        let keys = [(2, far), (0, 3), (2, 1), (0, 0)];
        for (n, &(h, p)) in keys.iter().enumerate() {
            assert!(m
                .insert((h, p), PageState::new(claim(h, p), n as u8, 0, 0, false))
                .is_none());
            assert_eq!(m.len(), n + 1);
        }
        let again = m.insert((2, far), PageState::new(claim(2, far), 9, 0, 0, false));
        assert_eq!(again.map(|p| p.class), Some(0), "replaced, not added");
        assert_eq!(m.len(), 4);
        let order: Vec<_> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(order, vec![(0, 0), (0, 3), (2, 1), (2, far)]);
        assert!(m.get(&(1, 0)).is_none() && m.get(&(0, 1)).is_none() && m.get(&(9, 9)).is_none());
        assert!(m.get(&(2, far - 1)).is_none() && m.get(&(2, far + 100)).is_none());
        assert_eq!(m[&(2, far)].class, 9);
        let chunks = |m: &PageMap| m.hosts.iter().flatten().flatten().count();
        assert_eq!(
            chunks(&m),
            3,
            "host 0's first chunk, host 2's first and sixth"
        );
        assert_eq!(m.remove(&(0, 3)).map(|p| p.class), Some(1));
        assert!(m.remove(&(0, 3)).is_none(), "removed twice");
        assert!(m.remove(&(5, 3)).is_none(), "never held");
        assert_eq!(m.len(), 3);
        assert_eq!(m.values().count(), 3);
        m.remove(&(2, far));
        assert_eq!(chunks(&m), 2, "a chunk goes with its last page");
        for k in [(0, 0), (2, 1)] {
            m.remove(&k);
        }
        assert!(m.is_empty() && m.iter().next().is_none());
        assert_eq!(chunks(&m), 0);
    }

    proptest::proptest! {
        /// The pending list hands entries out soonest first, whatever order they came in
        /// (mostly in order, as writers' notes come, with some out of order, as scans and
        /// racing threads add them), pops interleaved with pushes, and `retain` keeps that.
        #[test]
        fn pending_entries_come_out_soonest_first(
            steps in proptest::collection::vec((0u64..1_000, 0u64..100, proptest::bool::ANY), 1..400),
        ) {
            let mut p = Pending::default();
            let mut model: Vec<(u64, Slot)> = Vec::new();
            let mut clock = 0;
            for (n, &(jump, back, pop)) in steps.iter().enumerate() {
                clock += jump;
                let slot = Slot { host: (n % 3) as NodeId, class: 0, slot: n as u64 };
                let ready = clock.saturating_sub(back * (n as u64 % 4));
                p.push(ready, slot);
                model.push((ready, slot));
                if pop {
                    // Soonest first; among equal times any order.
                    let soonest = model.iter().map(|e| e.0).min();
                    let first = p.first();
                    let got = p.pop_first();
                    proptest::prop_assert_eq!(first, got);
                    proptest::prop_assert_eq!(got.map(|e| e.0), soonest);
                    let at = model.iter().position(|e| Some(*e) == got);
                    proptest::prop_assert!(at.is_some(), "{:?} was not pushed", got);
                    model.remove(at.unwrap());
                }
                if n % 97 == 96 {
                    p.retain(|s| s.host != 1);
                    model.retain(|(_, s)| s.host != 1);
                }
                proptest::prop_assert_eq!(p.len(), model.len());
            }
            let mut last = 0;
            while let Some(got) = p.pop_first() {
                proptest::prop_assert!(got.0 >= last, "{:?} after {}", got, last);
                last = got.0;
                let at = model.iter().position(|e| *e == got);
                proptest::prop_assert!(at.is_some(), "{:?} was not pushed", got);
                model.remove(at.unwrap());
            }
            proptest::prop_assert!(model.is_empty() && p.is_empty() && p.first().is_none());
        }
    }

    /// Entries of one class whose time has come are taken by a writer of another class,
    /// whose pages they empty, even within a clock margin of the last scan: left listed, they
    /// were reported as awaiting with a readiness already past, and the writer retried at
    /// once until it gave up (a CI failure: a PUT refused after 2,000 attempts). AW1.
    #[test]
    fn entries_due_in_another_class_make_room_without_a_scan() {
        let classes = Arc::new(SizeClasses::new(32, 600_000).unwrap());
        let regions = vec![8, PAGES * classes.page_bytes(), PAGES * 8];
        let f = InProcFabric::new(&vec![regions; 1], None).unwrap();
        let margin = 100_000_000;
        let t = ClassTable::new(0, 1, classes, PAGES, margin);
        let mut ep = f.endpoint(0);
        let big = (t.classes().len() - 1) as u8;
        let mut slots = Vec::new();
        while let Ok(s) = t.alloc_for(&mut ep, big, Purpose::Value) {
            assert_eq!(s.class, big);
            slots.push(s);
        }
        let expires = ep.now_ns() + 40_000_000;
        let word = DteLayout::recycle_word(expires);
        for s in &slots {
            write_words(&mut ep, t.addr(*s).add(RECYCLE_OFF), &word.to_le_bytes()).unwrap();
            t.note_recycled(&mut ep, *s, word);
        }
        let Err(ClassAllocError::Full {
            awaiting_expiry,
            next_ready_ns: Some(ready),
            ..
        }) = t.alloc_for(&mut ep, 0, Purpose::Value)
        else {
            panic!("full until they expire")
        };
        assert_eq!(awaiting_expiry, slots.len() as u64);
        assert_eq!(ready, expires + margin + 1);
        while ep.now_ns() <= ready {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // A scan may run again now, but it lists nothing new (the entries are listed already).
        let small = t
            .alloc_for(&mut ep, 0, Purpose::Value)
            .expect("the big entries' pages, emptied, go to the small class");
        assert_eq!(small.class, 0);
    }

    #[test]
    fn memory_moves_between_classes() {
        let (f, t) = setup(1);
        let mut ep = f.endpoint(0);
        let big = (t[0].classes().len() - 1) as u8;
        let small = 0u8;
        let per_page = t[0].classes().per_page(small);
        // Fill every page a value may take with small entries.
        let n = per_page * (PAGES - RESERVE_PAGES);
        let smalls: Vec<Slot> = (0..n)
            .map(|_| t[0].alloc_for(&mut ep, small, Purpose::Value).unwrap())
            .collect();
        assert!(t[0].alloc_for(&mut ep, big, Purpose::Value).is_err());
        for s in &smalls {
            recycle(&f, &t[0], *s);
        }
        // The big class gets pages the small class gave back.
        let b = t[0].alloc_for(&mut ep, big, Purpose::Value).unwrap();
        assert_eq!(b.class, big);
        assert!(t[0].usage()[big as usize].pages >= 1);
    }

    /// The page mover's part here: a draining page is the donor's with the fewest entries in
    /// use; none of its entries is handed out again (DR1), free or coming back; each is handed
    /// to one evicting writer per pass; and once its entries are gone the page goes to the
    /// class that needed it.
    #[test]
    fn a_draining_page_hands_out_nothing_and_goes_to_the_needy_class() {
        let (f, t) = setup(1);
        let t = &t[0];
        let mut ep = f.endpoint(0);
        assert!(
            !t.move_check_due(ep.now_ns(), 0),
            "nothing is exhausted yet"
        );
        let big = (t.classes().len() - 1) as u8;
        let small = 0u8;
        let per_page = t.classes().per_page(small);
        let smalls: Vec<Slot> = (0..per_page * (PAGES - RESERVE_PAGES))
            .map(|_| t.alloc_for(&mut ep, small, Purpose::Value).unwrap())
            .collect();
        assert!(t.alloc_for(&mut ep, big, Purpose::Value).is_err());
        let page = |s: &Slot| s.slot / per_page;
        let pages: BTreeSet<u64> = smalls.iter().map(page).collect();
        let (p0, p1) = (*pages.first().unwrap(), *pages.iter().nth(1).unwrap());
        // Page p1 ends with the fewest entries in use: 5 of it freed, 2 of p0.
        let on = |p: u64| smalls.iter().filter(move |s| page(s) == p).copied();
        for s in on(p1).take(5).chain(on(p0).take(2)) {
            recycle(&f, t, s);
        }
        t.reclaim(&mut ep).unwrap();
        assert!(t.move_check_due(ep.now_ns(), 0));
        assert!(!t.move_check_due(ep.now_ns(), u64::MAX), "asked just now");
        assert_eq!(
            t.donor_classes(big, 3),
            vec![(small, PAGES - RESERVE_PAGES)]
        );
        assert!(
            t.donor_classes(small, 3).is_empty(),
            "no other class holds pages"
        );
        assert!(t.start_draining(small, big));
        assert!(
            !t.start_draining(small, big),
            "one page drains at once in a small table"
        );
        // The free entries left are p0's two: none of p1's five.
        for _ in 0..2 {
            let s = t.alloc_for(&mut ep, small, Purpose::Value).unwrap();
            assert_eq!(page(&s), p0);
        }
        assert!(t.alloc_for(&mut ep, small, Purpose::Value).is_err());
        assert!(t.drain_in_progress());
        let (for_class, batch) = t.drain_batch(ep.now_ns(), 10, u64::MAX).unwrap();
        let (_, rest) = t.drain_batch(ep.now_ns(), usize::MAX, u64::MAX).unwrap();
        assert_eq!(for_class, big);
        assert_eq!(batch.len(), 10);
        assert_eq!(batch.len() + rest.len(), per_page as usize);
        assert!(batch
            .iter()
            .chain(&rest)
            .all(|s| page(s) == p1 && s.class == small));
        assert!(!t.drain_in_progress());
        assert!(
            t.drain_batch(ep.now_ns(), 10, u64::MAX).is_none(),
            "one pass"
        );
        // The page's items evicted (recycled), it goes to the big class, not back to small.
        for s in on(p1).skip(5) {
            recycle(&f, t, s);
        }
        let b = t.alloc_for(&mut ep, big, Purpose::Value).unwrap();
        assert_eq!(b.class, big);
        assert_eq!(b.slot / t.classes().per_page(big), p1, "the drained page");
        assert_eq!(t.usage()[small as usize].pages, PAGES - RESERVE_PAGES - 1);
        assert_eq!(t.counters().pages_drained, 1);
    }

    /// A draining page that does not empty (its items are not evicted) is given up after
    /// `DRAIN_PASSES` passes: its free entries, and those that came back meanwhile, serve its
    /// class again, and another page may drain.
    #[test]
    fn a_drain_that_does_not_empty_its_page_is_called_off() {
        let (f, t) = setup(1);
        let t = &t[0];
        let mut ep = f.endpoint(0);
        let big = (t.classes().len() - 1) as u8;
        let per_page = t.classes().per_page(0);
        let smalls: Vec<Slot> = (0..per_page * (PAGES - RESERVE_PAGES))
            .map(|_| t.alloc_for(&mut ep, 0, Purpose::Value).unwrap())
            .collect();
        assert!(t.alloc_for(&mut ep, big, Purpose::Value).is_err());
        recycle(&f, t, smalls[0]);
        t.reclaim(&mut ep).unwrap(); // one free entry, on the first page
        assert!(t.start_draining(0, big));
        assert!(t.alloc_for(&mut ep, 0, Purpose::Value).is_err(), "DR1");
        recycle(&f, t, smalls[1]);
        t.reclaim(&mut ep).unwrap(); // comes back while draining: kept off the list
        for pass in 1..=DRAIN_PASSES {
            let (_, slots) = t.drain_batch(ep.now_ns(), usize::MAX, 0).unwrap();
            assert_eq!(slots.len() as u64, per_page, "pass {pass}");
            // Nobody evicts: the page stays in use.
        }
        assert!(
            t.drain_batch(ep.now_ns(), usize::MAX, 0).is_none(),
            "called off"
        );
        let back: HashSet<Slot> = (0..2)
            .map(|_| t.alloc_for(&mut ep, 0, Purpose::Value).unwrap())
            .collect();
        assert_eq!(back, HashSet::from([smalls[0], smalls[1]]));
        assert!(t.start_draining(0, big), "the drain's turn is free again");
    }

    #[test]
    fn a_page_reused_by_another_class_starts_clean() {
        let (f, t) = setup(1);
        let mut ep = f.endpoint(0);
        let per_page = t[0].classes().per_page(0);
        // Every page a value may take, filled by class 0 with values that look like expired
        // recycle words wherever another class might keep one.
        let n = per_page * (PAGES - RESERVE_PAGES);
        let old: Vec<Slot> = (0..n)
            .map(|_| t[0].alloc_for(&mut ep, 0, Purpose::Value).unwrap())
            .collect();
        let junk: Vec<u8> = (0..t[0].classes().entry_size(0) / 8)
            .flat_map(|_| DteLayout::recycle_word(1).to_le_bytes())
            .collect();
        for s in &old {
            ep.write(t[0].addr(*s), &junk).unwrap();
        }
        for s in &old {
            recycle(&f, &t[0], *s);
        }
        // Class 1 takes pages class 0 gave back; its fresh entries, not yet written by their
        // writers, must not look recycled to a scan.
        let fresh: Vec<Slot> = (0..100)
            .map(|_| t[0].alloc_for(&mut ep, 1, Purpose::Value).unwrap())
            .collect();
        assert!(fresh.iter().all(|s| s.class == 1));
        t[0].reclaim(&mut ep).unwrap();
        let fresh_set: HashSet<Slot> = fresh.iter().copied().collect();
        for _ in 0..200 {
            let s = t[0].alloc_for(&mut ep, 1, Purpose::Value).unwrap();
            assert!(!fresh_set.contains(&s), "{s:?} handed out while in use");
        }
    }

    /// Writers on two nodes allocate, tag and recycle entries of five classes while delays are
    /// injected into every fabric operation, so pages are claimed, released and claimed again
    /// by other classes and nodes. An entry shared by two writers at once would show up as a
    /// tag overwritten by the other writer.
    #[test]
    fn churn_under_delay_injection_never_shares_an_entry() {
        let classes = Arc::new(SizeClasses::new(32, 600_000).unwrap());
        let regions = vec![8, PAGES * classes.page_bytes(), PAGES * 8];
        let delay = nessie_fabric::inproc::DelayInjection {
            seed: 7,
            probability: 0.05,
            max_delay_ns: 20_000,
        };
        let f = InProcFabric::new(&[regions.clone(), regions], Some(delay)).unwrap();
        let t: Arc<Vec<ClassTable>> = Arc::new(
            (0..2)
                .map(|n| ClassTable::new(n as NodeId, 2, classes.clone(), PAGES, 0))
                .collect(),
        );
        let threads: Vec<_> = (0..4u64)
            .map(|w| {
                let (f, t, classes) = (f.clone(), t.clone(), classes.clone());
                std::thread::spawn(move || {
                    let node = (w % 2) as usize;
                    let mut ep = f.endpoint(node as NodeId);
                    let mut live: std::collections::VecDeque<(Slot, u64)> = Default::default();
                    let mut full = 0;
                    for i in 0..3_000u64 {
                        // More classes than the pages writers may hold: pages must move.
                        let class = [0u8, 2, 4, 6, (classes.len() - 1) as u8][(i % 5) as usize];
                        match t[node].alloc_for(&mut ep, class, Purpose::Value) {
                            Ok(s) => {
                                let tag = w << 32 | i;
                                let a = t[node].addr(s);
                                let last = a.add(classes.entry_size(s.class) - 8);
                                ep.write(a, &tag.to_le_bytes()).unwrap();
                                ep.write(last, &tag.to_le_bytes()).unwrap();
                                live.push_back((s, tag));
                            }
                            Err(ClassAllocError::Full { .. }) => full += 1,
                            Err(e) => panic!("{e}"),
                        }
                        if live.len() > 8 || (full > 0 && !live.is_empty()) {
                            let (s, tag) = live.pop_front().unwrap();
                            let a = t[node].addr(s);
                            let last = a.add(classes.entry_size(s.class) - 8);
                            assert_eq!(ep.read_u64(a).unwrap(), tag, "{s:?} shared");
                            assert_eq!(ep.read_u64(last).unwrap(), tag, "{s:?} shared");
                            let at = a.add(RECYCLE_OFF);
                            ep.write(at, &DteLayout::recycle_word(1).to_le_bytes())
                                .unwrap();
                        }
                    }
                    live.len()
                })
            })
            .collect();
        for h in threads {
            h.join().unwrap();
        }
        let pages_held: u64 = t.iter().flat_map(|t| t.usage()).map(|u| u.pages).sum();
        assert!(pages_held <= 2 * PAGES, "{pages_held} pages held");
        let mut ep = f.endpoint(0);
        let reclaimed_pages = (0..2)
            .flat_map(|n| pages::read_table(&mut ep, n, PAGES).unwrap())
            .filter(|w| w.generation() >= 2)
            .count();
        assert!(
            reclaimed_pages > 0,
            "no page was released and claimed again"
        );
    }

    #[test]
    fn a_full_class_borrows_a_larger_entry_at_hand() {
        let (f, t) = setup(1);
        let mut ep = f.endpoint(0);
        let big = (t[0].classes().len() - 1) as u8;
        // One big entry takes a page, leaving the rest of it at hand.
        t[0].alloc_for(&mut ep, big, Purpose::Value).unwrap();
        let per_page = t[0].classes().per_page(0);
        let smalls = per_page * (PAGES - RESERVE_PAGES - 1);
        for _ in 0..smalls {
            assert_eq!(t[0].alloc_for(&mut ep, 0, Purpose::Value).unwrap().class, 0);
        }
        let spare = t[0].classes().per_page(big) - 1;
        for _ in 0..spare {
            let s = t[0].alloc_for(&mut ep, 0, Purpose::Value).unwrap();
            assert_eq!(s.class, big, "class 0 is full: a big entry serves");
        }
        let e = t[0].alloc_for(&mut ep, 0, Purpose::Value).unwrap_err();
        assert!(matches!(e, ClassAllocError::Full { class: 0, .. }), "{e}");
    }

    #[test]
    fn an_idle_holder_gives_its_pages_back_when_a_scan_is_due() {
        let (f, t) = setup(2);
        let mut ep = f.endpoint(0);
        // Node 0 fills its own pages and one of node 1's, then stops writing.
        let n = fill_beyond_own_pages_and_recycle(&f, &t[0], &mut ep);
        let scans = t[0].counters().scans;
        assert_eq!(
            t[0].reclaim_if_due(&mut ep, u64::MAX).unwrap(),
            0,
            "not due"
        );
        assert_eq!(t[0].counters().scans, scans);
        assert_eq!(t[0].reclaim_if_due(&mut ep, 0).unwrap(), n);
        for node in 0..2 {
            let words = pages::read_table(&mut ep, node, PAGES).unwrap();
            assert!(words.iter().all(|w| !w.is_claimed()), "{words:?}");
        }
        assert_eq!(t[0].reclaim_if_due(&mut ep, 0).unwrap(), 0, "nothing held");
    }

    /// A node holding pages on a node that died keeps allocating: scans, releases and claims
    /// skip the dead node's pages, and its own memory and the live nodes' still serve.
    #[test]
    fn a_dead_node_does_not_stop_allocation() {
        let (f, t) = setup(3);
        let mut ep = f.endpoint(0);
        let big = (t[0].classes().len() - 1) as u8;
        let per = t[0].classes().per_page(big);
        let n = fill_beyond_own_pages_and_recycle(&f, &t[0], &mut ep);
        f.kill_node(1);
        // The scan skips node 1's page and gives the local ones back.
        let reclaimed = t[0].reclaim(&mut ep).unwrap();
        assert_eq!(reclaimed, (PAGES - RESERVE_PAGES) * per);
        let u = &t[0].usage()[big as usize];
        assert_eq!(
            (u.pages, u.remote_pages),
            (1, 1),
            "the dead node's page stays held"
        );
        // Allocation goes on: local pages, then node 2 (node 1 is skipped).
        let hosts: Vec<NodeId> = (0..n)
            .map(|_| t[0].alloc_for(&mut ep, big, Purpose::Value).unwrap().host)
            .collect();
        assert!(hosts.contains(&0) && hosts.contains(&2), "{hosts:?}");
        assert!(!hosts.contains(&1), "{hosts:?}");
    }

    /// A survivor adopts no page of a host the host guard refuses (its tables settle after a
    /// copy became full): the CAS would wait that out under the table's lock, every writer
    /// with it. It leaves them (`deferred`) for a later look, which takes them once the host
    /// is allowed again. The mutation `adopt_while_settling` takes them at once (caught).
    #[test]
    fn a_survivor_defers_the_pages_of_a_host_whose_tables_settle() {
        use std::sync::atomic::{AtomicU64, Ordering};
        for mutated in [false, true] {
            let (f, t) = setup(3);
            let mut ep1 = f.endpoint(1);
            let big = (t[1].classes().len() - 1) as u8;
            let per = t[1].classes().per_page(big);
            // Node 1 fills its own pages and one of node 0's or node 2's.
            for _ in 0..(PAGES - RESERVE_PAGES + 1) * per {
                t[1].alloc_for(&mut ep1, big, Purpose::Value).unwrap();
            }
            let mut ep0 = f.endpoint(0);
            let claimed = |ep: &mut nessie_fabric::inproc::InProcEndpoint, host: NodeId, who| {
                pages::read_table(ep, host, PAGES)
                    .unwrap()
                    .iter()
                    .filter(|w| w.is_claimed() && w.claimer() == who)
                    .count() as u64
            };
            let on_1 = claimed(&mut ep0, 1, 1);
            let elsewhere = claimed(&mut ep0, 0, 1) + claimed(&mut ep0, 2, 1);
            assert!(on_1 > 0 && elsewhere > 0, "{on_1} {elsewhere}");
            // Node 0 alone survives; node 1's own tables settle.
            let refused = Arc::new(AtomicU64::new(1 << 1));
            let r = refused.clone();
            let guard = HostGuard(Arc::new(move |n| {
                if r.load(Ordering::SeqCst) & (1 << n) == 0 {
                    HostUse::Now
                } else {
                    HostUse::Avoid
                }
            }));
            let heir = ClassTable::new(0, 3, t[0].classes.clone(), PAGES, 0)
                .hosts_guarded(guard)
                .adopting_while_settling(mutated);
            let a = heir.adopt_gone(&mut ep0, &[1], 0, 1, |_| true).unwrap();
            let left_on_1 = claimed(&mut ep0, 1, 1);
            if mutated {
                assert_eq!(
                    (a.pages, a.deferred, left_on_1),
                    (on_1 + elsewhere, 0, 0),
                    "{a:?}"
                );
                continue;
            }
            assert_eq!((a.pages, a.deferred), (elsewhere, on_1), "{a:?}");
            assert_eq!(
                left_on_1, on_1,
                "node 1's pages wait while its tables settle"
            );
            // Settled: the next look takes them.
            refused.store(0, Ordering::SeqCst);
            let b = heir.adopt_gone(&mut ep0, &[1], 0, 1, |_| true).unwrap();
            assert_eq!((b.pages, b.deferred), (on_1, 0), "{b:?}");
            assert_eq!(claimed(&mut ep0, 1, 1), 0);
        }
    }

    /// The pages of a node gone for good go to the survivors, shared by rank, each exactly
    /// once, with what their entries hold; the gone node's allocator, if its process lives
    /// on (paused past its replacement), forgets them instead of handing their entries out
    /// again, and a restarted incarnation finds none to adopt.
    #[test]
    fn survivors_adopt_a_gone_nodes_pages_once_and_it_forgets_them() {
        let (f, t) = setup(3);
        let mut ep1 = f.endpoint(1);
        let big = (t[1].classes().len() - 1) as u8;
        let per = t[1].classes().per_page(big);
        // Node 1 fills its own pages and one of another node's; every other entry is live.
        let n = (PAGES - RESERVE_PAGES + 1) * per;
        let slots: Vec<Slot> = (0..n)
            .map(|_| t[1].alloc_for(&mut ep1, big, Purpose::Value).unwrap())
            .collect();
        assert!(slots.iter().any(|s| s.host != 1), "{slots:?}");
        let live = slots.iter().step_by(2).count() as u64;
        for s in slots.iter().step_by(2) {
            ep1.write(t[1].addr(*s).add(HEADER_OFF), &7u64.to_le_bytes())
                .unwrap();
        }
        let held = t[1].usage()[big as usize].pages;
        let claimed_by = |ep: &mut nessie_fabric::inproc::InProcEndpoint, who: NodeId| {
            (0..3)
                .flat_map(|h| pages::read_table(ep, h, PAGES).unwrap())
                .filter(|w| w.is_claimed() && w.claimer() == who)
                .count() as u64
        };
        let mut ep0 = f.endpoint(0);
        assert_eq!(claimed_by(&mut ep0, 1), held);
        // Nodes 0 and 2 share them by rank; a second look takes nothing more.
        let mut ep2 = f.endpoint(2);
        // A view that no longer says node 1 is gone adopts nothing.
        assert_eq!(
            t[0].adopt_gone(&mut ep0, &[1], 0, 1, |_| false)
                .unwrap()
                .pages,
            0
        );
        assert_eq!(claimed_by(&mut ep0, 1), held);
        let a0 = t[0].adopt_gone(&mut ep0, &[1], 0, 2, |_| true).unwrap();
        let a2 = t[2].adopt_gone(&mut ep2, &[1], 1, 2, |_| true).unwrap();
        assert_eq!(a0.pages + a2.pages, held, "{a0:?} {a2:?}");
        assert!(a0.pages > 0 && a2.pages > 0, "shared: {a0:?} {a2:?}");
        assert_eq!(a0.in_use + a2.in_use, live);
        assert_eq!(a0.free + a2.free, n - live);
        assert_eq!(claimed_by(&mut ep0, 1), 0);
        assert_eq!(
            claimed_by(&mut ep0, 0) + claimed_by(&mut ep0, 2),
            held,
            "each page held once"
        );
        // Another heir, or the same one looking again, finds none left.
        assert_eq!(
            t[0].adopt_gone(&mut ep0, &[1], 0, 1, |_| true)
                .unwrap()
                .pages,
            0
        );
        // The adopted free entries serve node 0's writers, on pages it holds.
        let fresh = t[0].alloc_for(&mut ep0, big, Purpose::Value).unwrap();
        let w =
            pages::read_table(&mut ep0, fresh.host, PAGES).unwrap()[(fresh.slot / per) as usize];
        assert_eq!(w.claimer(), 0, "{fresh:?}");
        // Node 1's process lives on: joining again, it forgets the pages taken from it, and
        // its allocator hands out only entries of pages it holds.
        let back = t[1].adopt(&mut ep1).unwrap();
        assert_eq!((back.pages, back.lost), (0, held), "{back:?}");
        assert_eq!(t[1].usage()[big as usize].pages, 0);
        for _ in 0..per {
            let s = t[1].alloc_for(&mut ep1, big, Purpose::Value).unwrap();
            let page = s.slot / per;
            let w = pages::read_table(&mut ep1, s.host, PAGES).unwrap()[page as usize];
            assert_eq!(w.claimer(), 1, "{s:?} is on a page of node {}", w.claimer());
        }
        // A restarted incarnation of node 1 has nothing of the old one's to adopt.
        let restarted = ClassTable::new(1, 3, t[1].classes.clone(), PAGES, 0);
        let r = restarted.adopt(&mut ep1).unwrap();
        assert_eq!(r.pages, 1, "only the page claimed just now: {r:?}");
    }

    /// Two survivors that both look at a gone node's pages (ranks changed between their
    /// looks) never both hold one: the CAS decides. Without it (the mutation
    /// `adopt_without_cas`) both take every page, and hand out the same entries.
    #[test]
    fn two_heirs_never_hold_one_page_and_the_mutation_shows_why() {
        for by_cas in [true, false] {
            let (f, t) = setup(3);
            let t: Vec<ClassTable> = t.into_iter().map(|t| t.adopting_by_cas(by_cas)).collect();
            let mut ep1 = f.endpoint(1);
            let big = (t[1].classes().len() - 1) as u8;
            for _ in 0..t[1].classes().per_page(big) + 1 {
                t[1].alloc_for(&mut ep1, big, Purpose::Value).unwrap();
            }
            let held = t[1].usage()[big as usize].pages;
            let (mut ep0, mut ep2) = (f.endpoint(0), f.endpoint(2));
            let a0 = t[0].adopt_gone(&mut ep0, &[1], 0, 1, |_| true).unwrap();
            let a2 = t[2].adopt_gone(&mut ep2, &[1], 0, 1, |_| true).unwrap();
            let s0: HashSet<Slot> = (0..a0.free)
                .map(|_| t[0].alloc_for(&mut ep0, big, Purpose::Value).unwrap())
                .collect();
            let s2: HashSet<Slot> = (0..a2.free)
                .map(|_| t[2].alloc_for(&mut ep2, big, Purpose::Value).unwrap())
                .collect();
            let shared = s0.intersection(&s2).count();
            if by_cas {
                assert_eq!((a0.pages, a2.pages), (held, 0));
                assert_eq!(shared, 0);
            } else {
                assert_eq!(
                    (a0.pages, a2.pages),
                    (held, held),
                    "mutation: both took them"
                );
                assert!(shared > 0, "mutation: entries handed out twice");
            }
        }
    }

    /// An allocator whose node may not write (its lease lapsed: paused or cut off, perhaps
    /// past its replacement) clears no entry: its scan stops, fenced, and changes nothing.
    #[test]
    fn a_fenced_allocator_clears_nothing() {
        let (f, t) = setup(1);
        let allowed = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let a = allowed.clone();
        let t = ClassTable::new(0, 1, t[0].classes.clone(), PAGES, 0).guarded(WriteGuard(
            Arc::new(move || a.load(std::sync::atomic::Ordering::SeqCst)),
        ));
        let mut ep = f.endpoint(0);
        let slot = t.alloc_for(&mut ep, 0, Purpose::Value).unwrap();
        ep.write(t.addr(slot).add(HEADER_OFF), &7u64.to_le_bytes())
            .unwrap();
        recycle(&f, &t, slot);
        allowed.store(false, std::sync::atomic::Ordering::SeqCst);
        let e = t.reclaim(&mut ep).unwrap_err();
        assert!(matches!(e, FabricError::Fenced { node: 0 }), "{e}");
        let mut header = [0u8; 8];
        ep.read(t.addr(slot).add(HEADER_OFF), &mut header).unwrap();
        assert_eq!(u64::from_le_bytes(header), 7, "nothing cleared");
        allowed.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(t.reclaim(&mut ep).unwrap(), 1);
    }

    /// A node that finds, on releasing a page, that another node adopted it (it was failed
    /// for good meanwhile) forgets the page instead of stopping.
    #[test]
    fn releasing_a_page_adopted_meanwhile_forgets_it() {
        let (f, t) = setup(2);
        let mut ep = f.endpoint(0);
        let n = fill_beyond_own_pages_and_recycle(&f, &t[0], &mut ep);
        assert!(n > 0);
        let mut ep1 = f.endpoint(1);
        let taken = t[1].adopt_gone(&mut ep1, &[0], 0, 1, |_| true).unwrap();
        assert!(taken.pages > 0);
        // Its scan finds every entry expired and releases the pages: all were taken.
        t[0].reclaim(&mut ep).unwrap();
        assert_eq!(t[0].usage().iter().map(|u| u.pages).sum::<u64>(), 0);
        for host in 0..2 {
            let words = pages::read_table(&mut ep, host, PAGES).unwrap();
            assert!(
                words.iter().all(|w| !w.is_claimed() || w.claimer() == 1),
                "{words:?}"
            );
        }
    }

    #[test]
    fn unpublished_entries_are_reusable_at_once() {
        let (f, t) = setup(1);
        let mut ep = f.endpoint(0);
        let a = t[0].alloc_for(&mut ep, 2, Purpose::Value).unwrap();
        t[0].release_unpublished(&mut ep, a);
        assert_eq!(t[0].alloc_for(&mut ep, 2, Purpose::Value).unwrap(), a);
    }

    #[test]
    fn concurrent_writers_on_two_nodes_never_share_an_entry() {
        let (f, t) = setup(2);
        let t = Arc::new(t);
        let threads: Vec<_> = (0..4usize)
            .map(|i| {
                let (f, t) = (f.clone(), t.clone());
                std::thread::spawn(move || {
                    let node = i % 2;
                    let mut ep = f.endpoint(node as NodeId);
                    let mut mine = Vec::new();
                    for k in 0..2_000u64 {
                        let class = (k % 3) as u8;
                        match t[node].alloc_for(&mut ep, class, Purpose::Value) {
                            Ok(s) => mine.push(s),
                            Err(ClassAllocError::Full { .. }) => break,
                            Err(e) => panic!("{e}"),
                        }
                    }
                    mine
                })
            })
            .collect();
        let all: Vec<Slot> = threads
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        let mut ranges: Vec<(NodeId, u64, u64)> = all
            .iter()
            .map(|s| {
                let a = t[0].addr(*s);
                (
                    a.node,
                    a.offset,
                    a.offset + t[0].classes().entry_size(s.class),
                )
            })
            .collect();
        ranges.sort();
        for w in ranges.windows(2) {
            assert!(w[0].0 != w[1].0 || w[0].2 <= w[1].1, "{w:?} overlap");
        }
        assert_eq!(all.len(), 8_000);
    }
}
