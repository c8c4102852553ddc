//! [`Pipeline`]: many operations in flight on one thread. Submit an [`Op`], get a [`Ticket`];
//! [`Pipeline::poll`] runs the operations and hands back each [`Completion`]
//! ([`Pipeline::wait`] for one ticket, [`Pipeline::drain`] for all).
//!
//! Each of the pipeline's slots is a stackful coroutine running one blocking client
//! ([`KvClient`], any mode's) over its own [`SlotEndpoint`]; all slots share the thread's
//! endpoint. A slot suspends whenever its operation waits on the fabric, and the pipeline runs
//! another meanwhile. So every operation runs the protocol's own code, step for step and check
//! for check; only the waiting is shared.
//!
//! Order: operations on different keys overlap and complete in any order. **Operations on one
//! key run one at a time, in submission order** (P1): one starts only when no earlier-submitted
//! operation on its key is queued or running. An operation that evicts other keys
//! (`KvClient::evicted`) is not ordered against operations on those keys, as between two
//! clients.
//!
//! Waiting (PL2): a pipeline with nothing to do this round waits on the fabric while an
//! operation is in flight, and sleeps until the first sleeping slot wakes when none is: it
//! never spins through a slot's back-off.

use std::collections::VecDeque;
use std::rc::Rc;

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult};
use nessie_fabric::{Post, StatsSnapshot};
use nessie_protocols::{Error, KvClient};

use crate::op::{Op, Outcome};
use crate::slot::{Core, Resume, SlotEndpoint, Suspend};

/// Most slots (operations running at once) one pipeline has.
pub const MAX_SLOTS: usize = 64;

/// Operations a pipeline holds submitted but not started, per slot: past that,
/// [`Pipeline::submit`] runs operations until there is room (back pressure).
pub const QUEUED_PER_SLOT: usize = 4;

/// Each slot's coroutine stack. The protocol keeps its buffers on the heap; its deepest path
/// (a write that migrates, under replication, inside the large-value layer) uses well under
/// a tenth of this. The stack is allocated with a guard page, so an overflow faults.
pub const SLOT_STACK_BYTES: usize = 256 * 1024;

/// Which submitted operation: numbered from 0 in submission order.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub u64);

/// One finished operation.
#[derive(Debug)]
pub struct Completion {
    pub ticket: Ticket,
    pub result: Result<Outcome, Error>,
    /// Keys the operation evicted (`KvClient::evicted`), and those whose eviction may or may not
    /// have taken effect (`KvClient::evicted_unsure`): empty without an eviction policy.
    pub evicted: Vec<Vec<u8>>,
    pub evicted_unsure: Vec<Vec<u8>>,
    /// The fabric operations it issued (its slot's counters over its run).
    pub fabric: StatsSnapshot,
    /// Attempts it aborted and retries it made (`KvClient::aborts_retries` over its run).
    pub aborts: u64,
    pub retries: u64,
}

/// What a slot's coroutine yields when its operation is done: its [`Completion`] but for the
/// ticket, which the pipeline adds.
pub struct Finished {
    result: Result<Outcome, Error>,
    evicted: Vec<Vec<u8>>,
    evicted_unsure: Vec<Vec<u8>>,
    fabric: StatsSnapshot,
    aborts: u64,
    retries: u64,
}

type SlotCoroutine = Coroutine<Resume<Op>, Suspend<Finished>, (), DefaultStack>;

/// What a slot is doing.
enum Busy {
    Idle,
    /// Running the operation of this ticket, on this key; suspended waiting for the fabric.
    Waiting(Ticket, Vec<u8>),
    /// As `Waiting`, asleep until the monotonic clock reaches the time.
    Sleeping(Ticket, Vec<u8>, u64),
}

struct Slot {
    co: SlotCoroutine,
    busy: Busy,
}

impl Slot {
    fn key(&self) -> Option<&[u8]> {
        match &self.busy {
            Busy::Idle => None,
            Busy::Waiting(_, k) | Busy::Sleeping(_, k, _) => Some(k),
        }
    }
}

/// How a pipeline runs (tests change the defaults).
#[derive(Clone, Debug)]
pub struct PipelineOptions {
    /// Slots: operations running at once (1 ..= [`MAX_SLOTS`]).
    pub slots: usize,
    /// Switch slots after every fabric step, even one that finished at once (an in-process
    /// fabric): interleaves operations step by step for race tests. Off, a slot runs on until
    /// an operation of its is really in flight.
    pub interleave: bool,
    /// With `interleave`, resume ready slots in an order drawn from this seed rather than
    /// round robin.
    pub shuffle_seed: Option<u64>,
    /// Mutation for tests: let an operation start while another on its key runs (breaks P1).
    #[doc(hidden)]
    pub mutation_unordered_keys: bool,
}

impl PipelineOptions {
    pub fn new(slots: usize) -> Self {
        Self {
            slots,
            interleave: false,
            shuffle_seed: None,
            mutation_unordered_keys: false,
        }
    }
}

/// Many operations in flight on one thread (module comment). Not `Send` (it holds an `Rc`):
/// it is built and used on one thread.
pub struct Pipeline<E: Post + 'static> {
    core: Rc<Core<E>>,
    slots: Vec<Slot>,
    queue: VecDeque<(Ticket, Op)>,
    done: VecDeque<Completion>,
    next_ticket: u64,
    rng: Option<u64>,
    opts: PipelineOptions,
}

/// A slot's endpoint in a pipeline over `E`.
pub type PipelineEndpoint<E> = SlotEndpoint<E, Op, Finished>;

impl<E: Post + 'static> Pipeline<E> {
    /// A pipeline over the thread's endpoint `ep`, with `opts.slots` clients made by
    /// `make_client`, each over its slot's endpoint (a client that writes needs its own worker
    /// id, as a thread's would).
    pub fn new<C, F>(ep: E, opts: PipelineOptions, mut make_client: F) -> Result<Self, Error>
    where
        C: KvClient + 'static,
        F: FnMut(usize, PipelineEndpoint<E>) -> Result<C, Error>,
    {
        if opts.slots == 0 || opts.slots > MAX_SLOTS {
            return Err(Error::Config(format!(
                "a pipeline has 1 to {MAX_SLOTS} slots (operations in flight), not {}",
                opts.slots
            )));
        }
        if ep.virtual_time() {
            return Err(Error::Config(
                "a pipeline runs on a real fabric: the simulator models one with lanes \
                 (`nessie sim --inflight`)"
                    .into(),
            ));
        }
        let core = Rc::new(Core::new(ep, opts.slots, opts.interleave));
        let mut slots = Vec::with_capacity(opts.slots);
        for s in 0..opts.slots {
            // Boxed: the coroutine's closure is placed on its stack's first page, which a
            // client (kilobytes of buffers and caches inline) may not fit.
            let mut client = Box::new(make_client(s, SlotEndpoint::new(core.clone(), s))?);
            let c = core.clone();
            let stack = DefaultStack::new(SLOT_STACK_BYTES)
                .map_err(|e| Error::Config(format!("a slot's stack: {e}")))?;
            let co = Coroutine::with_stack(stack, move |y, first: Resume<Op>| {
                c.set_yielder(s, y);
                let mut next = first;
                loop {
                    let Resume::Start(op) = next else {
                        panic!("slot {s}: resumed while idle");
                    };
                    let before = c.stats[s].snapshot();
                    let (a0, r0) = client.aborts_retries();
                    // A spare value buffer for a GET; one that found no value gives it back.
                    let reads = matches!(op, Op::Get { .. } | Op::GetVersioned { .. });
                    let mut buf = if reads { c.take_spare() } else { Vec::new() };
                    let result = op.run_into(&mut *client, &mut buf);
                    c.give_spare(buf);
                    let (a1, r1) = client.aborts_retries();
                    next = y.suspend(Suspend::Done(Finished {
                        result,
                        evicted: client.evicted().to_vec(),
                        evicted_unsure: client.evicted_unsure().to_vec(),
                        fabric: c.stats[s].snapshot().saturating_sub(&before),
                        aborts: a1.saturating_sub(a0),
                        retries: r1.saturating_sub(r0),
                    }));
                }
            });
            slots.push(Slot {
                co,
                busy: Busy::Idle,
            });
        }
        Ok(Self {
            core,
            slots,
            queue: VecDeque::new(),
            done: VecDeque::new(),
            next_ticket: 0,
            rng: opts.shuffle_seed.map(|s| s | 1),
            opts,
        })
    }

    /// Slots: how many operations run at once.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Operations submitted and not yet handed back by [`Self::poll`].
    pub fn outstanding(&self) -> usize {
        self.queue.len() + self.running() + self.done.len()
    }

    fn running(&self) -> usize {
        self.slots.iter().filter(|s| s.key().is_some()).count()
    }

    /// Submit `op`; it runs during later calls. When the queue is full this runs operations
    /// until there is room (their completions are kept for [`Self::poll`]).
    pub fn submit(&mut self, op: Op) -> Ticket {
        while self.queue.len() >= QUEUED_PER_SLOT * self.slots.len() {
            if !self.step() {
                self.idle();
            }
        }
        let t = Ticket(self.next_ticket);
        self.next_ticket += 1;
        self.queue.push_back((t, op));
        self.start_queued();
        t
    }

    /// The next finished operation, after making what progress can be made now without
    /// waiting; `None` if none has finished yet.
    pub fn poll(&mut self) -> Option<Completion> {
        if self.done.is_empty() {
            self.step();
        }
        self.done.pop_front()
    }

    /// An operation that has finished already, without running anything; `None` if none has.
    pub fn take_done(&mut self) -> Option<Completion> {
        self.done.pop_front()
    }

    /// Run until an operation finishes and return it; `None` if nothing is outstanding.
    pub fn next_done(&mut self) -> Option<Completion> {
        loop {
            if let Some(c) = self.done.pop_front() {
                return Some(c);
            }
            if self.queue.is_empty() && self.running() == 0 {
                return None;
            }
            if !self.step() {
                self.idle();
            }
        }
    }

    /// Run until the operation of `ticket` finishes and return it (others that finish
    /// meanwhile are kept for [`Self::poll`]). Panics if `ticket` is not outstanding.
    pub fn wait(&mut self, ticket: Ticket) -> Completion {
        loop {
            if let Some(i) = self.done.iter().position(|c| c.ticket == ticket) {
                return self.done.remove(i).expect("found");
            }
            let known = self.queue.iter().any(|(t, _)| *t == ticket)
                || self.slots.iter().any(|s| match &s.busy {
                    Busy::Waiting(t, _) | Busy::Sleeping(t, _, _) => *t == ticket,
                    Busy::Idle => false,
                });
            assert!(known, "{ticket:?} is not outstanding");
            if !self.step() {
                self.idle();
            }
        }
    }

    /// Run every outstanding operation to its end; their completions, in finishing order.
    pub fn drain(&mut self) -> Vec<Completion> {
        let mut out = Vec::new();
        while let Some(c) = self.next_done() {
            out.push(c);
        }
        out
    }

    /// Submit `op` and wait for it: the blocking call, through the pipeline.
    pub fn run(&mut self, op: Op) -> Completion {
        let t = self.submit(op);
        self.wait(t)
    }

    /// Give back a value buffer a completion brought (a GET's), for a later GET to read into:
    /// that GET then needs no allocation, and a value as long as the buffer's no zero-filling.
    /// At most a few per slot are kept; the rest are dropped.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        self.core.give_spare(buf);
    }

    /// The shared endpoint (its counters, its node).
    pub fn with_endpoint<T>(&self, f: impl FnOnce(&E) -> T) -> T {
        f(&self.core.ep.borrow())
    }

    /// Nothing could be done this round: wait for something to happen. While a slot waits on
    /// the fabric, the endpoint waits for it (`Post::posted_idle`). While every busy slot
    /// sleeps (a back-off, a retry's pause), nothing can happen before the first one wakes
    /// (no operation is in flight, and a round that could start a queued one would have), so
    /// the thread sleeps until then instead of spinning (PL2).
    fn idle(&mut self) {
        let mut wake: Option<u64> = None;
        for s in &self.slots {
            match s.busy {
                Busy::Waiting(..) => return self.core.ep.borrow_mut().posted_idle(),
                Busy::Sleeping(_, _, until) => wake = Some(wake.map_or(until, |w| w.min(until))),
                Busy::Idle => {}
            }
        }
        let mut ep = self.core.ep.borrow_mut();
        match wake {
            Some(until) => {
                let now = ep.mono_ns();
                if until > now {
                    ep.sleep_ns(until - now);
                }
            }
            None => ep.posted_idle(),
        }
    }

    /// One round: report what the fabric completed, resume every slot that can go on, start
    /// queued operations on idle slots. Returns whether anything happened.
    fn step(&mut self) -> bool {
        let core = &self.core;
        let reported = core
            .ep
            .borrow_mut()
            .poll_posted(&mut |t, r| core.deliver(t, r));
        let mut progressed = reported > 0;
        let n = self.slots.len();
        let first = match &mut self.rng {
            Some(x) => {
                // xorshift: a cheap seeded order for race tests.
                *x ^= *x << 13;
                *x ^= *x >> 7;
                *x ^= *x << 17;
                (*x % n as u64) as usize
            }
            None => 0,
        };
        let mut now = None;
        for k in 0..n {
            let s = (first + k) % n;
            let resume = match self.slots[s].busy {
                Busy::Idle => false,
                Busy::Waiting(..) => self.core.is_ready(s),
                Busy::Sleeping(_, _, until) => {
                    let t = *now.get_or_insert_with(|| self.core.ep.borrow().mono_ns());
                    t >= until
                }
            };
            if resume {
                self.resume(s, Resume::Continue);
                progressed = true;
            }
        }
        progressed |= self.start_queued();
        progressed
    }

    /// Start every queued operation that may start (P1) on an idle slot.
    fn start_queued(&mut self) -> bool {
        let mut started = false;
        let mut i = 0;
        while i < self.queue.len() {
            let Some(free) = self.slots.iter().position(|s| s.key().is_none()) else {
                break;
            };
            let key = self.queue[i].1.key();
            let blocked = !self.opts.mutation_unordered_keys
                && (self.slots.iter().any(|s| s.key() == Some(key))
                    || self.queue.iter().take(i).any(|(_, o)| o.key() == key));
            if blocked {
                i += 1;
                continue;
            }
            let (t, op) = self.queue.remove(i).expect("in range");
            self.slots[free].busy = Busy::Waiting(t, op.key().to_vec());
            self.resume(free, Resume::Start(op));
            started = true;
            // The queue may have changed ahead of `i` only by this removal.
        }
        started
    }

    /// Resume slot `s` with `input` and record why it stopped.
    fn resume(&mut self, s: usize, input: Resume<Op>) {
        let slot = &mut self.slots[s];
        let (ticket, key) = match std::mem::replace(&mut slot.busy, Busy::Idle) {
            Busy::Waiting(t, k) | Busy::Sleeping(t, k, _) => (t, k),
            Busy::Idle => unreachable!("slot {s} resumed while idle"),
        };
        let prev = self.core.running.replace(Some(s));
        let r = slot.co.resume(input);
        self.core.running.set(prev);
        match r {
            CoroutineResult::Yield(Suspend::Waiting) => slot.busy = Busy::Waiting(ticket, key),
            CoroutineResult::Yield(Suspend::Sleeping(until)) => {
                slot.busy = Busy::Sleeping(ticket, key, until)
            }
            CoroutineResult::Yield(Suspend::Done(f)) => self.done.push_back(Completion {
                ticket,
                result: f.result,
                evicted: f.evicted,
                evicted_unsure: f.evicted_unsure,
                fabric: f.fabric,
                aborts: f.aborts,
                retries: f.retries,
            }),
            CoroutineResult::Return(()) => unreachable!("a slot's coroutine never returns"),
        }
    }
}

impl<E: Post + 'static> Drop for Pipeline<E> {
    /// Operations in flight write into their coroutines' stacks: run them all to their end
    /// before the stacks go (I2 of `slot.rs`). Coroutines then sit idle at a suspension point
    /// and are unwound as they drop.
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A slot panicked; the others' operations in flight still must finish first.
            while self.core.ep.borrow().posted_in_flight() > 0 {
                let core = &self.core;
                core.ep
                    .borrow_mut()
                    .poll_posted(&mut |t, r| core.deliver(t, r));
            }
            return;
        }
        self.queue.clear();
        while self.running() > 0 {
            if !self.step() {
                self.idle();
            }
        }
    }
}
