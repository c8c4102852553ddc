//! [`SlotEndpoint`]: the endpoint one coroutine's client runs on. Every slot of a
//! [`Pipeline`](crate::Pipeline) shares one thread's endpoint (its UCX worker); a slot's
//! READ, WRITE or CAS is posted there ([`Post::post`]) and, while it is in flight, the slot's
//! coroutine suspends so that the thread runs other slots' operations. The protocol code above
//! (CD, replication, large values) is the blocking code, unchanged: it cannot tell a slot from
//! a plain endpoint.
//!
//! Invariants (checked where they can be):
//! - **I1: one wait per slot.** A slot's coroutine suspends only inside one fabric call, so it
//!   has at most one wave of operations ([`nessie_fabric::MAX_BATCH_OPS`]) in flight; a
//!   wave's operations never conflict (`Batch::wave_end`), which is what posted operations
//!   need (`nessie_fabric::post`).
//! - **I2: the buffers outlive the wait.** An operation's buffer is borrowed by the call that
//!   posted it, and that call returns only once every operation it posted was reported: a
//!   coroutine's stack is never reused or dropped under an operation in flight (the pipeline
//!   drains before it drops its coroutines).
//! - **I3: no borrow crosses a suspension.** The shared endpoint's `RefCell` is borrowed only
//!   for one post or one poll, never while a coroutine is suspended.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use corosensei::Yielder;
use nessie_fabric::{
    Batch, BatchOp, Endpoint, FabricError, Locality, NoYield, NodeId, Post, PostResult, PostToken,
    RegionId, RemoteAddr, StatsCell, MAX_BATCH_OPS,
};

/// What the scheduler hands a slot's coroutine when it resumes it.
pub(crate) enum Resume<Op> {
    /// Start this operation (the coroutine was idle).
    Start(Op),
    /// Go on: what the coroutine waited for may have happened (it checks).
    Continue,
}

/// Why a slot's coroutine suspended.
pub(crate) enum Suspend<Out> {
    /// Its operations in flight are not all reported yet (or, when the pipeline interleaves
    /// every step, it gives way after each).
    Waiting,
    /// It sleeps until the endpoint's monotonic clock reaches this (a retry's backoff).
    Sleeping(u64),
    /// Its operation finished, with this outcome; it is idle.
    Done(Out),
}

pub(crate) type SlotYielder<Op, Out> = Yielder<Resume<Op>, Suspend<Out>>;

/// A slot's posted operations: how many are in flight and the results reported so far.
#[derive(Default)]
pub(crate) struct Waits {
    in_flight: usize,
    results: [Option<PostResult>; MAX_BATCH_OPS],
}

/// What the slots of one pipeline share: the thread's endpoint and each slot's waits.
pub(crate) struct Core<E> {
    pub(crate) ep: RefCell<E>,
    pub(crate) waits: Vec<RefCell<Waits>>,
    /// Per slot, its own counters (the shared endpoint counts for all slots together).
    pub(crate) stats: Vec<StatsCell>,
    /// Per slot, the yielder of its coroutine (null until the coroutine first runs).
    yielders: Vec<Cell<*const ()>>,
    /// Give way after every fabric step, even one that finished at once (tests: operations
    /// on one in-process fabric then interleave step by step).
    pub(crate) interleave: bool,
    /// The slot whose coroutine runs now (set by the pipeline around each resume): only its
    /// endpoint may suspend, and only inside it.
    pub(crate) running: Cell<Option<usize>>,
    /// The thread the pipeline was made on, by the address of a thread-local of it: a slot's
    /// endpoint is never used from another (see `SlotEndpoint`'s `Send`).
    thread: usize,
    /// Value buffers for the slots' next GETs: handed back by the pipeline's user
    /// (`Pipeline::recycle`), at most [`SPARES_PER_SLOT`] per slot.
    spares: RefCell<Vec<Vec<u8>>>,
}

/// Most value buffers a pipeline keeps for reuse, per slot.
pub const SPARES_PER_SLOT: usize = 2;
/// Largest buffer (capacity, bytes) a pipeline keeps for reuse: larger ones are dropped, so
/// that a few large values do not stay pinned.
pub const SPARE_MAX_BYTES: usize = 256 << 10;

thread_local! {
    static THREAD_MARK: u8 = const { 0 };
}

/// This thread, as an address unique among live threads.
fn this_thread() -> usize {
    THREAD_MARK.with(|m| m as *const u8 as usize)
}

impl<E: Post> Core<E> {
    pub(crate) fn new(ep: E, slots: usize, interleave: bool) -> Self {
        Self {
            ep: RefCell::new(ep),
            waits: (0..slots).map(|_| RefCell::default()).collect(),
            stats: (0..slots).map(|_| StatsCell::default()).collect(),
            yielders: (0..slots).map(|_| Cell::new(std::ptr::null())).collect(),
            interleave,
            running: Cell::new(None),
            thread: this_thread(),
            spares: RefCell::new(Vec::new()),
        }
    }

    /// A value buffer for a GET: a spare one if any, else a new (empty) one.
    pub(crate) fn take_spare(&self) -> Vec<u8> {
        self.spares.borrow_mut().pop().unwrap_or_default()
    }

    /// Keep `buf` for a later GET, unless enough are kept (or it holds no allocation).
    pub(crate) fn give_spare(&self, buf: Vec<u8>) {
        let mut spares = self.spares.borrow_mut();
        let size = buf.capacity();
        if size > 0 && size <= SPARE_MAX_BYTES && spares.len() < SPARES_PER_SLOT * self.waits.len()
        {
            spares.push(buf);
        }
    }

    /// Slot `slot`'s coroutine runs with `y` as its yielder from now on.
    pub(crate) fn set_yielder<Op, Out>(&self, slot: usize, y: &SlotYielder<Op, Out>) {
        self.yielders[slot].set(y as *const SlotYielder<Op, Out> as *const ());
    }

    /// A reported operation: token `slot * MAX_BATCH_OPS + i`.
    pub(crate) fn deliver(&self, token: PostToken, r: PostResult) {
        let (slot, i) = (
            token as usize / MAX_BATCH_OPS,
            token as usize % MAX_BATCH_OPS,
        );
        let mut w = self.waits[slot].borrow_mut();
        assert!(
            w.in_flight > 0,
            "slot {slot}: a report of token {token} it did not wait for"
        );
        assert!(
            w.results[i].is_none(),
            "slot {slot}: token {token} reported twice"
        );
        w.results[i] = Some(r);
        w.in_flight -= 1;
    }

    /// Whether slot `slot` waits for no operation.
    pub(crate) fn is_ready(&self, slot: usize) -> bool {
        self.waits[slot].borrow().in_flight == 0
    }
}

/// Waits, when dropped during an unwind, for the slot's operations still in flight.
struct DrainOnUnwind<'a, E: Post> {
    core: &'a Core<E>,
    slot: usize,
}

impl<E: Post> Drop for DrainOnUnwind<'_, E> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        // Every posted operation is reported within its deadline (and the backend aborts
        // rather than let one outlive a forced close), so this ends.
        while !self.core.is_ready(self.slot) {
            let Ok(mut ep) = self.core.ep.try_borrow_mut() else {
                // The endpoint itself panicked mid-call: nothing can be polled. Leaving would
                // free memory UCX may still write into.
                std::process::abort();
            };
            let core = self.core;
            ep.poll_posted(&mut |t, r| core.deliver(t, r));
        }
    }
}

/// The endpoint of one slot (module comment).
pub struct SlotEndpoint<E, Op, Out> {
    core: Rc<Core<E>>,
    slot: usize,
    node: NodeId,
    node_count: usize,
    _marker: std::marker::PhantomData<fn(Op) -> Out>,
}

// SAFETY: a slot endpoint holds an `Rc` to state shared with the other slots of its pipeline
// and with the pipeline itself. All of them live inside the one `Pipeline` value (each slot's
// endpoint inside its client, inside its coroutine), which is created on one thread and is not
// `Send`; a slot endpoint is never handed out of it. So no two clones of the `Rc` are ever used
// from two threads. `Endpoint: Send` is required of every endpoint because most are moved to
// their worker thread; this one is built on its thread by `Pipeline::new`. A factory that
// moved one out anyway would be stopped at its first operation: `yielder` asserts the thread.
unsafe impl<E, Op, Out> Send for SlotEndpoint<E, Op, Out> {}

impl<E: Post, Op, Out> SlotEndpoint<E, Op, Out> {
    pub(crate) fn new(core: Rc<Core<E>>, slot: usize) -> Self {
        let (node, node_count) = {
            let ep = core.ep.borrow();
            (ep.node(), ep.node_count())
        };
        Self {
            core,
            slot,
            node,
            node_count,
            _marker: std::marker::PhantomData,
        }
    }

    /// The yielder of this slot's coroutine, if the call runs inside it and may give way now
    /// (no [`NoYield`] section is open); `None`: wait where it is.
    fn yielder(&self) -> Option<&SlotYielder<Op, Out>> {
        assert_eq!(
            this_thread(),
            self.core.thread,
            "a pipeline's slot used from another thread than its pipeline's"
        );
        if self.core.running.get() != Some(self.slot) || !NoYield::may_yield() {
            return None;
        }
        let p = self.core.yielders[self.slot].get() as *const SlotYielder<Op, Out>;
        // SAFETY: set by this slot's coroutine from the yielder it was given, which lives as
        // long as the coroutine; `running` says that coroutine is the one running now, so this
        // call is inside it.
        unsafe { p.as_ref() }
    }

    /// Post the operations `ops` (no two conflict) and return when all are reported, each
    /// result in `out`. Inside a coroutine it suspends meanwhile; outside one (a client used
    /// before the pipeline runs it) it polls the shared endpoint itself.
    fn run_wave(&mut self, ops: &mut [&mut BatchOp<'_>], out: &mut [Option<PostResult>]) {
        debug_assert!(ops.len() <= MAX_BATCH_OPS && ops.len() == out.len());
        {
            let w = self.core.waits[self.slot].borrow();
            assert_eq!(w.in_flight, 0, "slot {}: a second wait (I1)", self.slot);
        }
        // Unwinding out of here (a panic, or the coroutine dropped while it waits) must not
        // leave operations in flight on memory about to go (I2): the guard waits for them.
        let _drain = DrainOnUnwind {
            core: &self.core,
            slot: self.slot,
        };
        let mut posted = 0;
        for (i, op) in ops.iter_mut().enumerate() {
            let token = (self.slot * MAX_BATCH_OPS + i) as PostToken;
            // Never more than the backend takes: wait for room first.
            while self.core.ep.borrow().posted_in_flight() >= nessie_fabric::MAX_POSTED {
                self.give_way();
            }
            // SAFETY (I2): every buffer of `ops` is borrowed until this call returns, and it
            // returns only when `in_flight` is back to 0, i.e. every posted one was reported.
            let r = unsafe { self.core.ep.borrow_mut().post(op, token) };
            match r {
                Some(r) => out[i] = Some(r),
                None => {
                    self.core.waits[self.slot].borrow_mut().in_flight += 1;
                    posted += 1;
                }
            }
        }
        if posted > 0 || self.core.interleave {
            loop {
                self.give_way();
                if self.core.is_ready(self.slot) {
                    break;
                }
            }
        }
        let mut w = self.core.waits[self.slot].borrow_mut();
        for (i, o) in out.iter_mut().enumerate() {
            if let Some(r) = w.results[i].take() {
                assert!(
                    o.is_none(),
                    "slot {}: operation {i} finished twice",
                    self.slot
                );
                *o = Some(r);
            }
        }
        for (op, r) in ops.iter().zip(out.iter()) {
            match r {
                Some(Ok(_)) => self.core.stats[self.slot].record(
                    op.kind(),
                    self.locality(op.addr()),
                    op.len() as u64,
                ),
                Some(Err(_)) => {}
                None => unreachable!(
                    "slot {}: an operation neither finished nor reported",
                    self.slot
                ),
            }
        }
    }

    /// Let the other slots run (inside a coroutine), or drive the shared endpoint once.
    fn give_way(&self) {
        match self.yielder() {
            Some(y) => match y.suspend(Suspend::Waiting) {
                Resume::Continue => {}
                Resume::Start(_) => panic!("slot {}: started while busy", self.slot),
            },
            None => {
                let core = &self.core;
                let n = core
                    .ep
                    .borrow_mut()
                    .poll_posted(&mut |t, r| core.deliver(t, r));
                if n == 0 {
                    core.ep.borrow_mut().posted_idle();
                }
            }
        }
    }

    fn locality(&self, addr: RemoteAddr) -> Locality {
        match addr.node == self.node {
            true => Locality::Loopback,
            false => Locality::Remote,
        }
    }

    fn one(&mut self, mut op: BatchOp<'_>) -> PostResult {
        let mut out = [None];
        self.run_wave(&mut [&mut op], &mut out);
        out[0].take().expect("run_wave fills every result")
    }
}

impl<E: Post, Op, Out> Endpoint for SlotEndpoint<E, Op, Out> {
    fn node(&self) -> NodeId {
        self.node
    }

    fn node_count(&self) -> usize {
        self.node_count
    }

    fn read(&mut self, addr: RemoteAddr, buf: &mut [u8]) -> Result<(), FabricError> {
        self.one(BatchOp::Read { addr, buf }).map(|_| ())
    }

    fn write(&mut self, addr: RemoteAddr, buf: &[u8]) -> Result<(), FabricError> {
        self.one(BatchOp::Write { addr, buf }).map(|_| ())
    }

    fn compare_and_swap(
        &mut self,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        self.one(BatchOp::Cas {
            addr,
            expected,
            desired,
        })
    }

    /// A wave of the batch at a time (`Batch::wave_end`: no two of its operations conflict),
    /// all posted before the slot waits for them.
    fn run_batch(&mut self, batch: &mut Batch<'_>) {
        let mut start = 0;
        while start < batch.len() {
            let end = batch.wave_end(start);
            let mut out: [Option<PostResult>; MAX_BATCH_OPS] = Default::default();
            {
                let mut ops: Vec<&mut BatchOp<'_>> = batch.ops_mut(start..end).collect();
                self.run_wave(&mut ops, &mut out[..end - start]);
            }
            for (i, r) in out[..end - start].iter_mut().enumerate() {
                batch.complete(start + i, r.take().expect("run_wave fills every result"));
            }
            start = end;
        }
    }

    fn overlaps_batches(&self, region: RegionId) -> bool {
        self.core.ep.borrow().overlaps_batches(region)
    }

    fn local_read(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        self.core.ep.borrow_mut().local_read(region, offset, buf)
    }

    fn local_prefetch(&self, region: RegionId, offset: u64, len: u64) {
        self.core.ep.borrow().local_prefetch(region, offset, len)
    }

    fn local_write(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &[u8],
    ) -> Result<(), FabricError> {
        self.core.ep.borrow_mut().local_write(region, offset, buf)
    }

    fn now_ns(&self) -> u64 {
        self.core.ep.borrow().now_ns()
    }

    fn mono_ns(&self) -> u64 {
        self.core.ep.borrow().mono_ns()
    }

    fn mono_coarse_ns(&self) -> u64 {
        self.core.ep.borrow().mono_coarse_ns()
    }

    fn coarse_lag_ns(&self) -> u64 {
        self.core.ep.borrow().coarse_lag_ns()
    }

    /// Inside a coroutine the slot sleeps while the others run; outside, the thread sleeps.
    fn sleep_ns(&mut self, ns: u64) {
        let Some(y) = self.yielder() else {
            return self.core.ep.borrow_mut().sleep_ns(ns);
        };
        let until = self.mono_ns().saturating_add(ns);
        while self.mono_ns() < until {
            match y.suspend(Suspend::Sleeping(until)) {
                Resume::Continue => {}
                Resume::Start(_) => panic!("slot {}: started while asleep", self.slot),
            }
        }
    }

    fn virtual_time(&self) -> bool {
        self.core.ep.borrow().virtual_time()
    }

    /// Inside its coroutine, the other slots run on this thread while it waits.
    fn shares_thread(&self) -> bool {
        self.yielder().is_some() || self.core.ep.borrow().shares_thread()
    }

    fn reads_are_local_copies(&self) -> bool {
        self.core.ep.borrow().reads_are_local_copies()
    }

    fn idle_poll(&mut self, region: RegionId, watched: &[std::ops::Range<u64>]) {
        self.core.ep.borrow_mut().idle_poll(region, watched)
    }

    fn stats(&self) -> &StatsCell {
        &self.core.stats[self.slot]
    }
}
