//! Expired front-end items reclaimed in the background. An item past its expiry time already
//! reads as absent, but its entry holds memory until the key is deleted; without this a store
//! filled with items that have since expired refuses every write. Each node walks its own
//! share of the index (the slots of its index table) a window at a time, leasing one client
//! of its front ends' pool per window, and deletes the expired items it finds with the
//! protocol's DELETE conditional on the version read expired
//! (`nessie_frontend::keyspace::reclaim_expired`): linearizable, replicated, and never
//! against a key rewritten meanwhile.
//!
//! A node's share can change between sweeps ([`Share`]): a node takes on the slots of a failed
//! node as well (its heir: the next node up after it), whose items would otherwise expire
//! unreclaimed until it came back.
//!
//! The work is bounded: at most [`WINDOW_SLOTS`] index slots per cycle, one cycle every
//! [`CYCLE`], so a node of `I` index entries sweeps them all every `I / WINDOW_SLOTS`
//! cycles. At idle a cycle reads the window's ITEs (one word each) and the header of each
//! entry in use.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nessie_frontend::keyspace::{reclaim_expired, Reclaimed};
use nessie_frontend::serve::{unix_now_ms, Backend, Counters};

/// Index slots one cycle reads.
pub const WINDOW_SLOTS: u64 = 4096;
/// The pause between two cycles.
pub const CYCLE: Duration = Duration::from_millis(100);
/// Consecutive failed cycles after which a warning is logged again (one per that many).
const WARN_EVERY_FAILURES: u64 = 100;
/// Consecutive failures of one window after which it is skipped until the next sweep: a
/// window that cannot be swept (its copies unreachable) must not stop the rest of the share.
pub const SKIP_WINDOW_AFTER_FAILURES: u64 = 10;

/// The index slots a reclaimer sweeps, asked again at the start of every sweep.
pub type Share = Box<dyn Fn() -> Vec<Range<u64>> + Send>;

/// What a reclaimer has done since it started.
#[derive(Debug, Default)]
pub struct Totals {
    /// Full sweeps of the node's share of the index.
    pub sweeps: AtomicU64,
    /// Index slots in the current sweep's share.
    pub share_slots: AtomicU64,
    /// Expired items found, and of them deleted here.
    pub expired: AtomicU64,
    pub deleted: AtomicU64,
    /// Cycles that failed (the store unreachable, a node down): retried next cycle.
    pub failed_cycles: AtomicU64,
    /// Windows given up until the next sweep after [`SKIP_WINDOW_AFTER_FAILURES`] failures.
    pub skipped_windows: AtomicU64,
}

/// A node's background reclaimer of expired items; stopped and joined when dropped.
pub struct ExpiryReclaimer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    totals: Arc<Totals>,
}

impl ExpiryReclaimer {
    /// Walk index slots `slots` (the node's share) a window of `window` slots every `cycle`,
    /// with clients leased from `backend`; each item deleted is counted in every one of
    /// `counters` (the node's front ends: memcached `reclaimed`, Redis `expired_keys`).
    pub fn start(
        backend: Arc<dyn Backend>,
        slots: Range<u64>,
        window: u64,
        cycle: Duration,
        counters: Vec<Arc<Counters>>,
    ) -> std::io::Result<Self> {
        assert!(slots.start <= slots.end, "index slots {slots:?}");
        Self::start_shared(
            backend,
            Box::new(move || vec![slots.clone()]),
            window,
            cycle,
            counters,
        )
    }

    /// As [`ExpiryReclaimer::start`], over the slots `share` returns at the start of each
    /// sweep.
    pub fn start_shared(
        backend: Arc<dyn Backend>,
        share: Share,
        window: u64,
        cycle: Duration,
        counters: Vec<Arc<Counters>>,
    ) -> std::io::Result<Self> {
        assert!(window > 0, "a reclaimer window of no slots");
        let stop = Arc::new(AtomicBool::new(false));
        let totals = Arc::new(Totals::default());
        let (s, t) = (stop.clone(), totals.clone());
        let thread = std::thread::Builder::new()
            .name("nessie-expire".into())
            .spawn(move || run(&*backend, share, window, cycle, &counters, &s, &t))?;
        Ok(Self {
            stop,
            thread: Some(thread),
            totals,
        })
    }

    pub fn totals(&self) -> &Arc<Totals> {
        &self.totals
    }
}

impl Drop for ExpiryReclaimer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn run(
    backend: &dyn Backend,
    share: Share,
    window: u64,
    cycle: Duration,
    counters: &[Arc<Counters>],
    stop: &AtomicBool,
    totals: &Totals,
) {
    // The sweep's ranges, the one being walked, and where in it.
    let mut ranges: Vec<Range<u64>> = Vec::new();
    let mut i = 0;
    let mut at = 0;
    let mut failures = 0u64;
    while !stop.load(Ordering::SeqCst) {
        while ranges.get(i).is_some_and(|r| at >= r.end) {
            i += 1;
            at = ranges.get(i).map_or(0, |r| r.start);
        }
        if i >= ranges.len() {
            if !ranges.is_empty() {
                totals.sweeps.fetch_add(1, Ordering::Relaxed);
            }
            ranges = share();
            ranges.retain(|r| !r.is_empty());
            let slots = ranges.iter().map(|r| r.end - r.start).sum();
            totals.share_slots.store(slots, Ordering::Relaxed);
            (i, at) = (0, ranges.first().map_or(0, |r| r.start));
            if ranges.is_empty() {
                std::thread::park_timeout(cycle);
            }
            continue;
        }
        let end = at.saturating_add(window).min(ranges[i].end);
        let done = {
            let mut lease = backend.lease();
            reclaim_expired(lease.client(), at..end, unix_now_ms())
        };
        match done {
            Ok(r) => {
                failures = 0;
                count(r, counters, totals);
                at = end;
            }
            Err(e) => {
                // The window is tried again next cycle.
                totals.failed_cycles.fetch_add(1, Ordering::Relaxed);
                if failures.is_multiple_of(WARN_EVERY_FAILURES) {
                    tracing::warn!(%e, slots = ?(at..end), "reclaiming expired items failed");
                }
                failures += 1;
                if failures.is_multiple_of(SKIP_WINDOW_AFTER_FAILURES) {
                    totals.skipped_windows.fetch_add(1, Ordering::Relaxed);
                    at = end;
                }
            }
        }
        std::thread::park_timeout(cycle);
    }
}

fn count(r: Reclaimed, counters: &[Arc<Counters>], totals: &Totals) {
    totals.expired.fetch_add(r.expired, Ordering::Relaxed);
    totals.deleted.fetch_add(r.deleted, Ordering::Relaxed);
    for c in counters {
        c.reclaimed.fetch_add(r.deleted, Ordering::Relaxed);
        c.expired_unfetched
            .fetch_add(r.unfetched, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nessie_frontend::item;
    use nessie_frontend::testing::MapBackend;
    use nessie_protocols::KvClient;

    /// A share asked again at every sweep: slots added to it (a failed node's) are swept from
    /// the next sweep on, and the status says how many slots it covers.
    #[test]
    fn a_share_that_grows_is_swept_from_the_next_sweep() {
        let b = Arc::new(MapBackend::default());
        let now = unix_now_ms();
        {
            let mut m = b.0.lock().unwrap();
            let mut v = Vec::new();
            for i in 0..40u32 {
                item::encode(&mut v, 0, now - 1, &i.to_le_bytes());
                m.put(format!("k{i:02}").as_bytes(), &v).unwrap();
            }
        }
        let grown = Arc::new(AtomicBool::new(false));
        let g = grown.clone();
        // The test backend's slot i is its i-th key in order: 40..64 holds none, and 0..40
        // every one, once the share grows.
        let share: Share = Box::new(move || {
            let mut v: Vec<Range<u64>> = Vec::with_capacity(2);
            v.push(40..64);
            if g.load(Ordering::SeqCst) {
                v.push(0..40);
            }
            v
        });
        let r =
            ExpiryReclaimer::start_shared(b.clone(), share, 8, Duration::from_millis(1), vec![])
                .unwrap();
        let t = r.totals().clone();
        let wait = |what: &dyn Fn() -> bool| {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while !what() {
                assert!(std::time::Instant::now() < deadline, "{t:?}");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        wait(&|| t.sweeps.load(Ordering::Relaxed) >= 3);
        assert_eq!(t.deleted.load(Ordering::Relaxed), 0, "only the first share");
        assert_eq!(t.share_slots.load(Ordering::Relaxed), 24);
        grown.store(true, Ordering::SeqCst);
        wait(&|| t.deleted.load(Ordering::Relaxed) == 40);
        wait(&|| t.share_slots.load(Ordering::Relaxed) == 64);
        drop(r);
        assert!(b.0.lock().unwrap().0.is_empty());
    }

    /// A window that keeps failing (its copies unreachable) is skipped until the next sweep:
    /// the sweep still ends, and a share asked again can drop it.
    #[test]
    fn windows_that_keep_failing_do_not_stop_the_sweep() {
        use nessie_frontend::testing::{OneClient, PlainClient};
        // Its scans are Unsupported: every window fails.
        let b = Arc::new(OneClient(std::sync::Mutex::new(PlainClient::default())));
        let r = ExpiryReclaimer::start(b, 0..64, 8, Duration::from_millis(1), vec![]).unwrap();
        let t = r.totals().clone();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while t.sweeps.load(Ordering::Relaxed) < 2 {
            assert!(std::time::Instant::now() < deadline, "{t:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(r);
        assert!(t.skipped_windows.load(Ordering::Relaxed) >= 16, "{t:?}");
        assert!(
            t.failed_cycles.load(Ordering::Relaxed) >= 16 * SKIP_WINDOW_AFTER_FAILURES,
            "{t:?}"
        );
    }

    /// Expired items go, live ones stay, and the front ends' counters say how many went;
    /// the reclaimer stops when dropped.
    #[test]
    fn a_reclaimer_deletes_what_expired_and_counts_it() {
        let b = Arc::new(MapBackend::default());
        let now = unix_now_ms();
        {
            let mut m = b.0.lock().unwrap();
            let mut v = Vec::new();
            for i in 0..50u32 {
                let expires = if i % 5 == 0 { now + 3_600_000 } else { now - 1 };
                item::encode(&mut v, 0, expires, &i.to_le_bytes());
                m.put(format!("k{i:02}").as_bytes(), &v).unwrap();
            }
        }
        let counters = vec![Arc::new(Counters::default()), Arc::new(Counters::default())];
        let r = ExpiryReclaimer::start(
            b.clone(),
            0..64,
            8,
            Duration::from_millis(1),
            counters.clone(),
        )
        .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while r.totals().deleted.load(Ordering::Relaxed) < 40 {
            assert!(std::time::Instant::now() < deadline, "{:?}", r.totals());
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(r);
        let m = b.0.lock().unwrap();
        assert_eq!(m.0.len(), 10, "the live items stay");
        for c in &counters {
            assert_eq!(c.reclaimed.load(Ordering::Relaxed), 40);
        }
    }
}
