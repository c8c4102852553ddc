//! The hand-off scheduler: simulated threads are real OS threads, but one runs at a time, in
//! virtual-time order.
//!
//! A simulated thread runs until it waits for a virtual time (`wait_until`: a fabric
//! operation's next stage, a sleep, CPU work). Then the scheduler takes the earliest pending
//! wake-up, sets virtual time to it and hands control to that thread. Ties are broken by a
//! number derived from the seed, the thread and how many waits it has posted (not from the
//! order in which threads post), then by thread number: a run is a function of the seed and
//! the code.
//!
//! Protocol code takes real locks (a node's allocator is a `Mutex` held across fabric
//! operations). A thread that blocks on a lock held by a thread waiting for its virtual time
//! would never come back to the scheduler, so the scheduler watches running threads: one
//! that the kernel reports asleep at [`BLOCKED_POLLS`] consecutive polls, without having come
//! back, is *blocked*, and the next wake-up is dispatched. Blocked threads can only be woken by
//! a running one (they wait for a lock), so before each dispatch the scheduler asks the
//! kernel again and waits for any that woke. A woken thread may run alongside the one that
//! released it, but only until its next simulator call ([`Sched::checkin`]), where it queues
//! itself at the virtual time it was released and waits for its turn like any other: what it
//! does in between is its own work under the lock it just took. So runs stay deterministic as
//! long as a thread that releases a lock does not take it again before its next fabric
//! operation or sleep (true of the protocol code: every allocation is followed by a DTE
//! write).
//!
//! The simulator's own locks (this scheduler's state, the network's) are held only briefly and
//! never across a virtual wait, but a thread can sleep on one for a while when the machine is
//! loaded: the scheduler takes its state lock at every poll. Counting such a thread as
//! blocked would dispatch the next wake-up beside it and make the run depend on the host's
//! load, so a thread asleep on a futex inside the simulator's own memory ([`Sched::own`]) is
//! never counted as blocked.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A simulated thread's number (the order in which it was created).
pub type ThreadNo = usize;

/// How often the scheduler looks at a thread that has not come back.
const POLL: Duration = Duration::from_micros(200);
/// Consecutive polls at which a running thread must be asleep in the kernel to count as
/// blocked on a lock (a thread briefly asleep in a system call must not count).
pub const BLOCKED_POLLS: u32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// Created, not spawned: the scheduler ignores it.
    Idle,
    /// Has a pending wake-up in the queue.
    Waiting,
    Running,
    /// Asleep on something outside the simulator (a lock held by a waiting thread).
    Blocked,
    /// Was blocked, seen awake: runs until its next [`Sched::checkin`].
    Woken,
    Done,
}

/// One simulated thread's shared part.
#[derive(Debug, Default)]
pub struct Slot {
    cv: Condvar,
    /// The thread's virtual time at its last dispatch.
    clock: AtomicU64,
    /// Kernel thread id (0 until the thread has started), for the blocked check.
    os_tid: AtomicI32,
}

impl Slot {
    pub fn clock(&self) -> u64 {
        self.clock.load(Ordering::Acquire)
    }
}

struct State {
    status: Vec<Status>,
    slots: Vec<std::sync::Arc<Slot>>,
    start_ns: Vec<u64>,
    /// Times each thread has posted a wait: a blocked verdict stands only if it is unchanged.
    posts: Vec<u64>,
    /// Consecutive polls each running thread was seen asleep.
    asleep: Vec<u32>,
    /// Wake-ups: (time, tie-break, thread, the thread's wait they end). A wake-up whose wait
    /// is over (an earlier one ended it) is stale and skipped.
    heap: BinaryHeap<Reverse<(u64, u64, ThreadNo, u64)>>,
    /// Threads Running or Woken.
    running: usize,
    blocked: usize,
    rng: SmallRng,
    seed: u64,
    /// FNV-1a over every dispatch (time, thread): equal for equal runs.
    trace: u64,
    dispatches: u64,
    blocks: u64,
}

/// What a finished run did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunSummary {
    /// Virtual time of the last event, ns.
    pub end_ns: u64,
    /// Hand-offs and in-place advances of virtual time.
    pub dispatches: u64,
    /// Hash of the sequence of (virtual time, thread) dispatches.
    pub trace: u64,
    /// Times a thread was found blocked on a lock outside the simulator.
    pub blocks: u64,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

impl State {
    fn note(&mut self, t: u64, thread: ThreadNo) {
        self.dispatches += 1;
        for b in t
            .to_le_bytes()
            .into_iter()
            .chain((thread as u64).to_le_bytes())
        {
            self.trace = (self.trace ^ b as u64).wrapping_mul(FNV_PRIME);
        }
    }

    /// The tie-break of `thread`'s next wait: a function of the seed, the thread and its
    /// count of waits (splitmix64), so independent of which thread posts first.
    fn tie(&self, thread: ThreadNo) -> u64 {
        let mut z = self.seed ^ (thread as u64) << 40 ^ self.posts[thread];
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The earliest wake-up of a thread still waiting (one that panicked in the middle of a
    /// wait has left its wake-up behind).
    fn pop(&mut self) -> Option<(u64, ThreadNo)> {
        while let Some(Reverse((t, _, thread, wait))) = self.heap.pop() {
            if self.status[thread] == Status::Waiting && self.posts[thread] == wait {
                return Some((t, thread));
            }
        }
        None
    }

    /// Drop wake-ups at the top of the queue whose wait is over.
    fn drop_stale(&mut self) {
        while let Some(Reverse((_, _, thread, wait))) = self.heap.peek() {
            if self.status[*thread] == Status::Waiting && self.posts[*thread] == *wait {
                break;
            }
            self.heap.pop();
        }
    }

    fn leave(&mut self, thread: ThreadNo) {
        match self.status[thread] {
            Status::Running | Status::Woken => self.running -= 1,
            Status::Blocked => self.blocked -= 1,
            s => panic!("simulated thread {thread} acted while {s:?}: a simulated endpoint is used outside its own thread"),
        }
    }
}

pub struct Sched {
    state: Mutex<State>,
    sched_cv: Condvar,
    now: AtomicU64,
    /// Memory that holds the simulator's own locks besides this scheduler's (the fabric's
    /// shared state, which contains it): waits on a futex there are not blocks.
    own: std::sync::OnceLock<std::ops::Range<usize>>,
}

impl Sched {
    pub fn new(seed: u64) -> Self {
        Self {
            state: Mutex::new(State {
                status: Vec::new(),
                slots: Vec::new(),
                start_ns: Vec::new(),
                posts: Vec::new(),
                asleep: Vec::new(),
                heap: BinaryHeap::new(),
                running: 0,
                blocked: 0,
                rng: SmallRng::seed_from_u64(seed),
                seed,
                trace: FNV_OFFSET,
                dispatches: 0,
                blocks: 0,
            }),
            sched_cv: Condvar::new(),
            now: AtomicU64::new(0),
            own: std::sync::OnceLock::new(),
        }
    }

    /// Declare `of` (a value that holds the simulator's other locks, set once, not moved
    /// afterwards) as the simulator's own memory: a thread asleep on a futex in it is waiting
    /// for a brief critical section, never for a thread that waits for virtual time.
    pub fn own<T>(&self, of: &T) {
        let start = of as *const T as usize;
        let range = start..start + std::mem::size_of::<T>();
        assert!(
            self.own.set(range.clone()).is_ok() || self.own.get() == Some(&range),
            "the simulator's own memory is declared once"
        );
    }

    /// Whether the futex word at `addr` is one of the simulator's own locks.
    fn is_own_lock(&self, addr: usize) -> bool {
        let me = self as *const Self as usize;
        (me..me + std::mem::size_of::<Self>()).contains(&addr)
            || self.own.get().is_some_and(|r| r.contains(&addr))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking simulated thread must not hide the others' results.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Current virtual time (constant while any thread runs).
    pub fn now(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }

    /// A new simulated thread that will start at a seeded time in `[0, jitter_ns)`.
    pub fn register(&self, jitter_ns: u64) -> (ThreadNo, std::sync::Arc<Slot>) {
        let mut st = self.lock();
        let start = if jitter_ns == 0 {
            0
        } else {
            st.rng.gen_range(0..jitter_ns)
        };
        let slot = std::sync::Arc::new(Slot::default());
        st.status.push(Status::Idle);
        st.slots.push(slot.clone());
        st.start_ns.push(start);
        st.posts.push(0);
        st.asleep.push(0);
        (st.status.len() - 1, slot)
    }

    pub fn slot(&self, thread: ThreadNo) -> std::sync::Arc<Slot> {
        self.lock().slots[thread].clone()
    }

    /// Queue the first dispatch of `thread`, whose OS thread is about to be started.
    pub fn spawned(&self, thread: ThreadNo) {
        let mut st = self.lock();
        assert_eq!(
            st.status[thread],
            Status::Idle,
            "simulated thread {thread} spawned twice"
        );
        st.status[thread] = Status::Waiting;
        let tie = st.tie(thread);
        // Relative to now: a thread spawned after an earlier run starts after it.
        let at = self.now() + st.start_ns[thread];
        let wait = st.posts[thread];
        st.heap.push(Reverse((at, tie, thread, wait)));
    }

    /// First thing a simulated OS thread does: wait for its first dispatch.
    pub fn enter(&self, thread: ThreadNo, slot: &Slot) {
        slot.os_tid
            .store(crate::procstate::gettid(), Ordering::Release);
        let mut st = self.lock();
        while st.status[thread] != Status::Running {
            st = slot.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        slot.clock.store(self.now(), Ordering::Release);
    }

    /// Last thing it does (also on panic).
    pub fn exit(&self, thread: ThreadNo) {
        let mut st = self.lock();
        if matches!(
            st.status[thread],
            Status::Running | Status::Blocked | Status::Woken
        ) {
            st.leave(thread);
        }
        st.status[thread] = Status::Done;
        self.hand_off(&mut st);
    }

    /// Before a simulated thread touches the model: one that was blocked on a lock and has
    /// been woken waits for its turn at the virtual time it was released.
    pub fn checkin(&self, thread: ThreadNo, slot: &Slot) {
        let st = self.lock();
        if matches!(st.status[thread], Status::Blocked | Status::Woken) {
            let now = self.now();
            self.park(st, thread, slot, now);
        }
    }

    /// Block the calling simulated thread until virtual time `t` (at least now); returns the
    /// virtual time it resumes at.
    pub fn wait_until(&self, thread: ThreadNo, slot: &Slot, t: u64) -> u64 {
        let mut st = self.lock();
        let t = t.max(self.now());
        let alone = st.status[thread] == Status::Running && st.running == 1 && st.blocked == 0;
        if alone {
            st.drop_stale();
            let key = (t, st.tie(thread), thread, u64::MAX);
            if st.heap.peek().is_none_or(|Reverse(top)| key < *top) {
                // Nobody can act before `t`: advance in place, no hand-off.
                st.posts[thread] += 1;
                self.now.store(t, Ordering::Release);
                st.note(t, thread);
                slot.clock.store(t, Ordering::Release);
                return t;
            }
        }
        self.park(st, thread, slot, t)
    }

    /// The number of `thread`'s next wait (what [`Sched::wake_at`] names).
    pub fn next_wait(&self, thread: ThreadNo) -> u64 {
        self.lock().posts[thread] + 1
    }

    /// End `thread`'s wait number `wait` at `t` (at least now) if it is still waiting then:
    /// an event another thread caused (a write a poller waits for) ends a wait early.
    pub fn wake_at(&self, thread: ThreadNo, wait: u64, t: u64) {
        let mut st = self.lock();
        if st.status[thread] == Status::Waiting && st.posts[thread] == wait {
            let tie = st.tie(thread);
            let t = t.max(self.now());
            st.heap.push(Reverse((t, tie, thread, wait)));
        }
    }

    /// Queue `thread`'s wake-up at `t` and wait for it.
    fn park(&self, mut st: MutexGuard<'_, State>, thread: ThreadNo, slot: &Slot, t: u64) -> u64 {
        st.leave(thread);
        let tie = st.tie(thread);
        st.status[thread] = Status::Waiting;
        st.posts[thread] += 1;
        st.asleep[thread] = 0;
        let wait = st.posts[thread];
        st.heap.push(Reverse((t, tie, thread, wait)));
        self.hand_off(&mut st);
        loop {
            match st.status[thread] {
                Status::Running => break,
                // Dispatched, but slow to wake (a loaded machine): the scheduler's polls saw
                // it asleep in the kernel, took it for a thread blocked on a lock and may have
                // run others since. Queue it again at the current time, as a thread woken
                // from a lock is (waiting on for `Running` would leave it waiting for good).
                Status::Blocked | Status::Woken => {
                    st.leave(thread);
                    let (now, tie) = (self.now(), st.tie(thread));
                    st.status[thread] = Status::Waiting;
                    st.posts[thread] += 1;
                    let wait = st.posts[thread];
                    st.heap.push(Reverse((now, tie, thread, wait)));
                    self.hand_off(&mut st);
                }
                _ => st = slot.cv.wait(st).unwrap_or_else(|p| p.into_inner()),
            }
        }
        let now = self.now();
        slot.clock.store(now, Ordering::Release);
        now
    }

    /// A thread that stops running hands control straight to the earliest waiting one (one
    /// OS wake-up per hand-off), unless some thread is blocked on a lock: then, and at the
    /// end of the run, the scheduler thread decides.
    fn hand_off(&self, st: &mut State) {
        if st.running == 0 && st.blocked == 0 {
            if let Some((t, thread)) = st.pop() {
                self.dispatch(st, t, thread);
                return;
            }
        }
        self.sched_cv.notify_one();
    }

    fn dispatch(&self, st: &mut State, t: u64, thread: ThreadNo) {
        debug_assert!(t >= self.now(), "virtual time went backwards");
        self.now.store(t, Ordering::Release);
        st.note(t, thread);
        st.status[thread] = Status::Running;
        st.running = 1;
        st.slots[thread].cv.notify_one();
    }

    /// Dispatch until every spawned thread has finished.
    pub fn run(&self) -> RunSummary {
        let mut st = self.lock();
        let mut seen = u64::MAX;
        loop {
            if st.running > 0 {
                let (g, waited) = self
                    .sched_cv
                    .wait_timeout(st, POLL)
                    .unwrap_or_else(|p| p.into_inner());
                st = g;
                // Ask the kernel only about a thread that has made no progress for a poll.
                if waited.timed_out() && st.running > 0 {
                    if st.dispatches == seen {
                        st = self.poll(st, Status::Running);
                    }
                    seen = st.dispatches;
                }
                continue;
            }
            if st.blocked > 0 {
                st = self.poll(st, Status::Blocked);
                if st.running > 0 {
                    continue;
                }
            }
            let Some((t, thread)) = st.pop() else {
                assert!(
                    st.blocked == 0,
                    "deadlock: {} simulated threads are blocked outside the simulator and nothing is left to run",
                    st.blocked
                );
                break;
            };
            self.dispatch(&mut st, t, thread);
        }
        RunSummary {
            end_ns: self.now(),
            dispatches: st.dispatches,
            trace: st.trace,
            blocks: st.blocks,
        }
    }

    /// Ask the kernel about the threads in `which` state (Running: are they blocked? Blocked:
    /// have they woken?), without holding the lock while reading `/proc`.
    fn poll<'a>(&'a self, st: MutexGuard<'a, State>, which: Status) -> MutexGuard<'a, State> {
        let look: Vec<(ThreadNo, i32, u64)> = (0..st.status.len())
            .filter(|&i| st.status[i] == which)
            .map(|i| (i, st.slots[i].os_tid.load(Ordering::Acquire), st.posts[i]))
            .filter(|&(_, tid, _)| tid != 0)
            .collect();
        drop(st);
        let asleep: Vec<bool> = look
            .iter()
            .map(|&(_, tid, _)| {
                crate::procstate::asleep(tid)
                    && !crate::procstate::futex_wait_addr(tid).is_some_and(|a| self.is_own_lock(a))
            })
            .collect();
        let mut st = self.lock();
        for (&(i, _, posts), asleep) in look.iter().zip(asleep) {
            if st.status[i] != which || st.posts[i] != posts {
                continue; // it came back meanwhile
            }
            match which {
                Status::Running if asleep => {
                    st.asleep[i] += 1;
                    if st.asleep[i] >= BLOCKED_POLLS {
                        st.status[i] = Status::Blocked;
                        st.running -= 1;
                        st.blocked += 1;
                        st.blocks += 1;
                        st.asleep[i] = 0;
                    }
                }
                Status::Running => st.asleep[i] = 0,
                Status::Blocked if !asleep => {
                    st.status[i] = Status::Woken;
                    st.blocked -= 1;
                    st.running += 1;
                }
                _ => {}
            }
        }
        st
    }
}
