//! Recording histories from many threads.
//!
//! Each thread owns a [`Recorder`] that buffers its events locally; the buffer is moved
//! into the shared [`History`] (one lock acquisition) when the recorder is flushed or
//! dropped, so the hot path takes no lock and shares no cache line with other threads.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::{Event, KeyId, Op, Outcome};

struct Inner {
    start: Instant,
    events: Mutex<Vec<Event>>,
}

impl Inner {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A shared, thread-safe history: the clock origin plus the events flushed by recorders.
///
/// Cloning is cheap and yields a handle to the same history (it may also be put in an
/// `Arc`). Events of a [`Recorder`] become visible when it is flushed or dropped.
#[derive(Clone)]
pub struct History {
    inner: Arc<Inner>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History")
            .field("flushed_events", &self.len())
            .finish()
    }
}

impl History {
    /// A new, empty history whose clock starts now.
    pub fn new() -> Self {
        History {
            inner: Arc::new(Inner {
                start: Instant::now(),
                events: Mutex::new(Vec::new()),
            }),
        }
    }

    /// A recorder for one client thread. Several recorders may share a client id, but
    /// explanations are clearer if each thread has its own.
    pub fn recorder(&self, client: u32) -> Recorder {
        Recorder {
            client,
            buf: Vec::with_capacity(1024),
            inner: Arc::clone(&self.inner),
            clock: None,
        }
    }

    /// A recorder whose events are timed by `clock` (nanoseconds) instead of the history's
    /// own: a simulated thread's virtual clock, shared by every recorder of the history.
    pub fn recorder_with_clock(&self, client: u32, clock: Clock) -> Recorder {
        let mut r = self.recorder(client);
        r.clock = Some(clock);
        r
    }

    /// Nanoseconds since this history was created (the clock used for all events).
    pub fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }

    /// Number of events flushed so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True if no event has been flushed yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the flushed events, sorted by invocation time. Call it after the
    /// recording threads have finished (dropped or flushed their recorders).
    pub fn events(&self) -> Vec<Event> {
        let mut events = self.lock().clone();
        sort_events(&mut events);
        events
    }

    /// Takes the flushed events out of the history (sorted by invocation time), leaving
    /// it empty.
    pub fn into_events(self) -> Vec<Event> {
        let mut events = std::mem::take(&mut *self.lock());
        sort_events(&mut events);
        events
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Event>> {
        // A panicking recorder thread must not hide the others' events.
        self.inner
            .events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn sort_events(events: &mut [Event]) {
    events.sort_by_key(|e| (e.invoke_ns, e.client, e.response_ns));
}

/// The invocation time of a call in progress; pass it to [`Recorder::complete`].
#[must_use = "pass the invocation to Recorder::complete"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invocation {
    /// Nanoseconds since the history's clock origin.
    pub invoke_ns: u64,
}

/// A recorder's own clock, in nanoseconds.
pub type Clock = Box<dyn Fn() -> u64 + Send>;

/// Records the events of one client thread. Not shared: each thread owns one.
///
/// ```
/// use nessie_check::{History, Op, Outcome};
/// let history = History::new();
/// let mut rec = history.recorder(0);
/// let t = rec.invoke();
/// // ... perform the PUT ...
/// rec.complete(t, 7, Op::Put(1), Outcome::Ok(None));
/// drop(rec);
/// assert_eq!(history.events().len(), 1);
/// ```
pub struct Recorder {
    client: u32,
    buf: Vec<Event>,
    inner: Arc<Inner>,
    clock: Option<Clock>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("client", &self.client)
            .field("buffered", &self.buf.len())
            .finish()
    }
}

impl Recorder {
    /// This recorder's client id.
    pub fn client(&self) -> u32 {
        self.client
    }

    /// Takes the invocation time; call it immediately before issuing the operation.
    pub fn invoke(&self) -> Invocation {
        Invocation {
            invoke_ns: self.now_ns(),
        }
    }

    /// Now, by this recorder's clock (the history's, unless it was given its own).
    pub fn now_ns(&self) -> u64 {
        match &self.clock {
            Some(clock) => clock(),
            None => self.inner.now_ns(),
        }
    }

    /// Takes the response time and records the event; call it immediately after the
    /// operation returned.
    pub fn complete(&mut self, invocation: Invocation, key: KeyId, op: Op, outcome: Outcome) {
        let response_ns = self.now_ns();
        self.buf.push(Event {
            client: self.client,
            key,
            op,
            outcome,
            invoke_ns: invocation.invoke_ns,
            response_ns,
        });
    }

    /// Records an event that is no call of this client's, between `invoke_ns` and
    /// `response_ns` of the history's clock: an item's expiry ([`crate::Op::Expire`]), placed
    /// at its expiry time give or take the error of mapping the store's clock onto this one.
    pub fn record_at(
        &mut self,
        key: KeyId,
        op: Op,
        outcome: Outcome,
        invoke_ns: u64,
        response_ns: u64,
    ) {
        self.buf.push(Event {
            client: self.client,
            key,
            op,
            outcome,
            invoke_ns,
            response_ns,
        });
    }

    /// Runs `f` as one operation and records it; returns `f`'s outcome.
    pub fn record(&mut self, key: KeyId, op: Op, f: impl FnOnce() -> Outcome) -> Outcome {
        let invocation = self.invoke();
        let outcome = f();
        self.complete(invocation, key, op, outcome.clone());
        outcome
    }

    /// Moves the buffered events into the shared history.
    pub fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let mut shared = self
            .inner
            .events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        shared.append(&mut self.buf);
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.flush();
    }
}
