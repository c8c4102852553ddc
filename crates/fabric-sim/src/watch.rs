//! Idle pollers waiting for a write.
//!
//! SD, HY and Pilaf servers spin on their request slots and their clients on their response
//! slots. Simulated step by step, every empty poll would be a scheduler hand-off: thousands
//! per operation. Instead a poller that found nothing calls `Endpoint::idle_poll(region)`
//! and waits, in virtual time, until the next write to that region of its node takes effect
//! (or [`IDLE_POLL_MAX_NS`] passes, so it still sees its stop flag); it then resumes at the
//! write's instant and polls again, paying for that poll's reads as before. A spinning
//! poller would notice the write at its next read, a fraction of a sweep later: the model
//! leaves out that fraction.

use std::sync::Mutex;

use nessie_fabric::{NodeId, RegionId};

use crate::sched::{Sched, ThreadNo};

/// Longest an idle poller waits for a write before it looks again (ns of virtual time).
pub const IDLE_POLL_MAX_NS: u64 = 20_000;

#[derive(Clone, Copy, Debug)]
struct Watcher {
    node: NodeId,
    region: RegionId,
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

    /// `thread`'s wait number `wait` ends at the next write to `region` of `node`.
    pub fn add(&self, node: NodeId, region: RegionId, thread: ThreadNo, wait: u64) {
        self.list().push(Watcher {
            node,
            region,
            thread,
            wait,
        });
    }

    /// `thread` stopped waiting (woken or timed out).
    pub fn remove(&self, thread: ThreadNo) {
        self.list().retain(|w| w.thread != thread);
    }

    /// A write to `region` of `node` took effect at `t`: wake every poller waiting for one.
    pub fn written(&self, sched: &Sched, node: NodeId, region: RegionId, t: u64) {
        let mut list = self.list();
        if list.is_empty() {
            return;
        }
        list.retain(|w| {
            let hit = w.node == node && w.region == region;
            if hit {
                sched.wake_at(w.thread, w.wait, t);
            }
            !hit
        });
    }
}
