//! Idle pollers waiting for a write.
//!
//! SD, HY and Pilaf servers spin on their request slots and their clients on their response
//! slots. Simulated step by step, every empty poll would be a scheduler hand-off: thousands
//! per operation. Instead a poller that found nothing calls `Endpoint::idle_poll` with the
//! byte ranges it polls (its slots) and waits, in virtual time, until the next write to one
//! of them takes effect
//! (or [`IDLE_POLL_MAX_NS`] passes, so it still sees its stop flag); it then resumes at the
//! write's instant and polls again, paying for that poll's reads as before. A spinning
//! poller would notice the write at its next read, a fraction of a sweep later: the model
//! leaves out that fraction.

use std::ops::Range;
use std::sync::Mutex;

use nessie_fabric::{NodeId, RegionId, RemoteAddr};

use crate::sched::{Sched, ThreadNo};

/// Longest an idle poller waits for a write before it looks again (ns of virtual time): a
/// safety net and how soon a server sees its stop flag. No write is missed without it: the
/// poller registers at the instant of its empty poll, before any other thread runs.
pub const IDLE_POLL_MAX_NS: u64 = 1_000_000;

#[derive(Clone, Debug)]
struct Watcher {
    node: NodeId,
    region: RegionId,
    ranges: Vec<Range<u64>>,
    thread: ThreadNo,
    /// The poller's wait that a write ends (see `Sched::wake_at`).
    wait: u64,
}

/// The pollers waiting for a write, in the order they began to wait (deterministic).
#[derive(Debug, Default)]
pub struct Watches(Mutex<Vec<Watcher>>);

impl Watches {
    fn list(&self) -> std::sync::MutexGuard<'_, Vec<Watcher>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `thread`'s wait number `wait` ends at the next write to one of `ranges` of `region` of
    /// `node`.
    pub fn add(
        &self,
        node: NodeId,
        region: RegionId,
        ranges: &[Range<u64>],
        thread: ThreadNo,
        wait: u64,
    ) {
        self.list().push(Watcher {
            node,
            region,
            ranges: ranges.to_vec(),
            thread,
            wait,
        });
    }

    /// `thread` stopped waiting (woken or timed out).
    pub fn remove(&self, thread: ThreadNo) {
        self.list().retain(|w| w.thread != thread);
    }

    /// A write of `bytes` at `addr` (its node and region) took effect: wake every poller
    /// waiting for one there, at the time `at(thread)` says (the write's instant, or later if
    /// the poller lacks its core).
    pub fn written(
        &self,
        sched: &Sched,
        addr: RemoteAddr,
        bytes: Range<u64>,
        at: impl Fn(ThreadNo) -> u64,
    ) {
        let mut list = self.list();
        if list.is_empty() {
            return;
        }
        list.retain(|w| {
            let hit = w.node == addr.node
                && w.region == addr.region
                && w.ranges
                    .iter()
                    .any(|r| r.start < bytes.end && bytes.start < r.end);
            if hit {
                sched.wake_at(w.thread, w.wait, at(w.thread));
            }
            !hit
        });
    }
}
