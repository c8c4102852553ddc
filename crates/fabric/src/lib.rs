//! The fabric: registered memory regions addressed by `(node, region, offset)` and the three
//! one-sided operations the Nessie protocol is built from — READ, WRITE and 64-bit
//! COMPARE-AND-SWAP.
//!
//! The protocol crates are generic over [`Endpoint`] and never learn which backend they run on
//! (see `docs/fabric.md`):
//! - [`inproc`]: the in-process backend, N nodes inside one process (unit, property and concurrency tests; delay injection),
//! - UCX (separate processes over shared memory, TCP or RDMA verbs), in `nessie-fabric-ucx`,
//! - a simulated RDMA network in virtual time, in `nessie-fabric-sim` (its cluster harness,
//!   `nessie sim`, is `nessie-sim`).
//!
//! Completion model: every call blocks the calling worker thread until the operation has
//! completed at the target (one outstanding operation per client worker, as in the paper).
//! A [`Batch`] of operations is the one exception: [`Endpoint::run_batch`] may keep all of
//! them in flight at once, and blocks until the last completes (see [`batch`]).
//! Time is part of the endpoint (`now_ns` for the wall clock, `mono_ns` for durations,
//! `sleep_ns`) so that a simulated backend can run the same protocol code in virtual time.

pub mod addr;
pub mod batch;
pub mod delay;
pub mod error;
pub mod forward;
pub mod inproc;
pub mod interpose;
pub mod memory;
pub mod post;
pub mod stats;

pub use addr::{NodeId, RegionId, RemoteAddr, ALIGN};
pub use batch::{Batch, BatchOp, OpId, MAX_BATCH_OPS};
pub use error::{ConfigError, FabricError};
pub use post::{NoYield, Post, PostResult, PostToken, MAX_POSTED};
pub use stats::{FabricStats, Locality, OpKind, StatsCell, StatsSnapshot};

/// One worker thread's handle onto the fabric.
///
/// All offsets and lengths must be multiples of [`ALIGN`] (8 bytes); CAS targets one aligned
/// 64-bit word. Writes become visible in address order at word granularity and reads observe
/// words in address order, which is what the protocol relies on (a DTE is complete before the
/// CAS that publishes it; a recycle flag is set only after its timestamp).
pub trait Endpoint: Send {
    /// The node this endpoint belongs to (its "local" node).
    fn node(&self) -> NodeId;

    /// Number of nodes in the fabric.
    fn node_count(&self) -> usize;

    /// One-sided READ of `buf.len()` bytes at `addr`.
    fn read(&mut self, addr: RemoteAddr, buf: &mut [u8]) -> Result<(), FabricError>;

    /// One-sided WRITE of `buf` at `addr`.
    fn write(&mut self, addr: RemoteAddr, buf: &[u8]) -> Result<(), FabricError>;

    /// Atomic 64-bit compare-and-swap at `addr`; returns the value found there (the swap took
    /// place iff the returned value equals `expected`). Atomic only against other fabric
    /// operations, so index entries are always accessed through the fabric, even locally.
    fn compare_and_swap(
        &mut self,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError>;

    /// Run every operation of `batch`, each with its own result, and return when all have
    /// completed or failed (semantics in [`batch`]: every operation is attempted, overlapping
    /// ones take effect in batch order). The default runs them one after another with the
    /// blocking calls above, so every endpoint supports batches; a backend that can keep
    /// operations in flight together overrides it.
    fn run_batch(&mut self, batch: &mut Batch<'_>) {
        batch.run_sequentially(self)
    }

    /// Whether [`Endpoint::run_batch`] keeps a batch's READs of `region` in flight together,
    /// so that a caller saves round trips by batching READs it would otherwise issue one
    /// after another — even READs it may turn out not to need. `false` (the default) where a
    /// batch runs one operation after another: batching would only add those READs.
    fn overlaps_batches(&self, _region: RegionId) -> bool {
        false
    }

    /// Direct (non-fabric) read of this node's own memory: how a node reads its own data table.
    fn local_read(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), FabricError>;

    /// Hint that `len` bytes of this node's own memory at `offset` will be read soon (a DTE's
    /// value behind the header about to be read), so the cache misses overlap. Only a hint,
    /// never an error: backends whose memory is not the process's own ignore it, and a wrapper
    /// that ends up reading elsewhere (a replica) has only warmed a cache line or two.
    fn local_prefetch(&self, _region: RegionId, _offset: u64, _len: u64) {}

    /// Direct (non-fabric) write of this node's own memory: how a node writes its own DTEs.
    fn local_write(&mut self, region: RegionId, offset: u64, buf: &[u8])
        -> Result<(), FabricError>;

    /// A write whose readers tolerate seeing it on one copy of replicated memory and not yet
    /// on another (a DTE's recycle mark, read only by reclaimers, which then reclaim later): a
    /// replicated endpoint need not wait for copies' roles to settle before it. Into this
    /// node's own memory (`addr.node` is this node) it is a local write.
    fn write_unordered(&mut self, addr: RemoteAddr, buf: &[u8]) -> Result<(), FabricError> {
        match addr.node == self.node() {
            true => self.local_write(addr.region, addr.offset, buf),
            false => self.write(addr, buf),
        }
    }

    /// Wall-clock time in nanoseconds since the Unix epoch (virtual in the simulator). Only
    /// for timestamps that cross nodes: the expiry times written into DTEs. Nodes' clocks must
    /// agree within the clock margin (checked at bootstrap). It may step backwards (NTP, VM
    /// resume), so never measure a duration with it: use [`Endpoint::mono_ns`].
    fn now_ns(&self) -> u64;

    /// Monotonic time in nanoseconds from an arbitrary origin (virtual in the simulator): for
    /// operation deadlines, cache ages and every other duration measured on one node. A
    /// backward step of the wall clock must not let an operation outlive the expiry period,
    /// which is what makes reading a released DTE safe.
    fn mono_ns(&self) -> u64 {
        monotonic_ns()
    }

    /// [`Endpoint::mono_ns`] read cheaply, for a time that may safely be early (the start of
    /// an operation timer): never later than `mono_ns` at the call, normally earlier by up to
    /// [`Endpoint::coarse_lag_ns`] (a clock tick), by more when ticks are late. On this
    /// machine it costs a fifth of a precise read.
    fn mono_coarse_ns(&self) -> u64 {
        self.mono_ns()
    }

    /// How far a coarse reading normally lags a precise one (0: they are the same clock).
    fn coarse_lag_ns(&self) -> u64 {
        0
    }

    /// Block this worker for `ns` nanoseconds (virtual in the simulator).
    fn sleep_ns(&mut self, ns: u64);

    /// Whether this endpoint runs in virtual time (the simulator). There a thread must never
    /// wait in the kernel for a lock held by another simulated thread: it waits with
    /// [`Endpoint::sleep_ns`] instead, so the scheduler sees it.
    fn virtual_time(&self) -> bool {
        false
    }

    /// Whether other clients run on this thread while one of its operations waits (virtual
    /// time; a pipeline's coroutine, `nessie-inflight`). A lock held across a fabric operation
    /// must then be waited for with [`Endpoint::sleep_ns`], never in the kernel: its holder
    /// runs on this very thread.
    fn shares_thread(&self) -> bool {
        self.virtual_time()
    }

    /// Whether a READ of another node's memory is a copy this process's CPU makes from memory
    /// it maps (UCX over shared memory). A cache of remote entries then saves nothing a READ
    /// would cost and adds a copy to every miss, so clients leave it off.
    fn reads_are_local_copies(&self) -> bool {
        false
    }

    /// A poller found nothing new in the byte ranges `watched` of `region` of its own node.
    /// On a real fabric it spins on; in virtual time the thread instead waits until one of
    /// those ranges is next written (or a bounded time passes), when a spinning poller's next
    /// read would first find something.
    fn idle_poll(&mut self, _region: RegionId, _watched: &[std::ops::Range<u64>]) {
        std::hint::spin_loop()
    }

    /// This endpoint's operation counters.
    fn stats(&self) -> &StatsCell;

    /// READ one aligned 64-bit word.
    fn read_u64(&mut self, addr: RemoteAddr) -> Result<u64, FabricError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

/// Nanoseconds of `clock` (`CLOCK_REALTIME`: since the Unix epoch; `CLOCK_MONOTONIC`: since
/// boot). Straight from `clock_gettime`: the operation timer reads the clock several times per
/// operation, and `Instant`/`SystemTime` arithmetic around the same call cost a quarter again
/// of it (2.5% of a node serving pipelined SETs).
#[cfg(unix)]
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; both clocks exist on every Unix we build for.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    debug_assert_eq!(r, 0, "clock_gettime({clock})");
    timespec_ns(&ts)
}

#[cfg(unix)]
fn timespec_ns(ts: &libc::timespec) -> u64 {
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// How often [`wall_clock_ns`] looks at the system's wall clock again (it runs on the
/// monotonic clock in between): a forward step is followed within this.
#[cfg(unix)]
const WALL_CHECK_NS: u64 = 1_000_000;

/// Wall-clock nanoseconds since the Unix epoch, for real-time backends, as this process keeps
/// them: its monotonic clock plus the largest offset yet seen from it to the system's wall
/// clock ([`system_wall_clock_ns`], looked at every millisecond). The two run at one rate (NTP
/// slews both), so the offset changes only when the system clock is stepped:
/// - **a backward step is ignored.** The wall clock is what crosses nodes: the expiry stamp a
///   releaser writes into another node's entry, a writer's deadline, an epoch's time. A stamp
///   that jumped back by more than the clock margin would let the entry's node recycle it
///   while readers may still read it (`docs/protocol.md`, "Clocks"). So this clock never goes
///   back. It stays ahead by the step until the process restarts; [`wall_clock_steps`] counts
///   the steps, and a node logs them.
/// - **a forward step is followed** (a VM resumed after its monotonic clock stood still).
///
/// Deadlines a node sets and checks itself run on [`monotonic_ns`] instead, never on this.
#[cfg(unix)]
pub fn wall_clock_ns() -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    let mono = clock_ns(libc::CLOCK_MONOTONIC);
    // Until the first look (offset 0), every caller looks.
    let first = WALL.offset.load(Relaxed) == 0;
    if first || mono.saturating_sub(WALL.checked.load(Relaxed)) >= WALL_CHECK_NS {
        WALL.checked.store(mono, Relaxed);
        // A lower bound of the offset: the system clock read before the second monotonic
        // reading (a thread descheduled between the two reads overstates nothing).
        let sys = system_wall_clock_ns();
        let after = clock_ns(libc::CLOCK_MONOTONIC);
        let seen = sys.saturating_sub(after);
        let offset = WALL.offset.load(Relaxed);
        if seen > offset {
            WALL.offset.fetch_max(seen, Relaxed);
        } else if offset - seen > STEP_LOGGED_NS {
            WALL.stepped_back.fetch_add(1, Relaxed);
            WALL.offset_seen.store(seen, Relaxed);
        }
    }
    mono + WALL.offset.load(Relaxed)
}

/// A system clock this far behind the process's wall clock counts as a backward step.
#[cfg(unix)]
const STEP_LOGGED_NS: u64 = 50_000_000;

#[cfg(unix)]
struct WallClock {
    /// Largest (system wall clock - monotonic clock) seen.
    offset: std::sync::atomic::AtomicU64,
    /// Monotonic time of the last look at the system clock.
    checked: std::sync::atomic::AtomicU64,
    /// Looks that found the system clock stepped back (by more than `STEP_LOGGED_NS`).
    stepped_back: std::sync::atomic::AtomicU64,
    /// The offset the last of them saw.
    offset_seen: std::sync::atomic::AtomicU64,
    /// Added to the system clock by tests (`step_system_clock_for_tests`).
    test_step_ns: std::sync::atomic::AtomicI64,
}

#[cfg(unix)]
static WALL: WallClock = WallClock {
    offset: std::sync::atomic::AtomicU64::new(0),
    checked: std::sync::atomic::AtomicU64::new(0),
    stepped_back: std::sync::atomic::AtomicU64::new(0),
    offset_seen: std::sync::atomic::AtomicU64::new(0),
    test_step_ns: std::sync::atomic::AtomicI64::new(0),
};

/// The system's wall clock (`CLOCK_REALTIME`) as it reads now, steps and all (plus what a
/// test stepped it by).
#[cfg(unix)]
pub fn system_wall_clock_ns() -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    clock_ns(libc::CLOCK_REALTIME).saturating_add_signed(WALL.test_step_ns.load(Relaxed))
}

/// Whether the system clock has been seen stepped back behind this process's wall clock, and
/// by how much (ns) the last time: (steps seen, lag).
#[cfg(unix)]
pub fn wall_clock_steps() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    let steps = WALL.stepped_back.load(Relaxed);
    let lag = WALL
        .offset
        .load(Relaxed)
        .saturating_sub(WALL.offset_seen.load(Relaxed));
    (steps, if steps == 0 { 0 } else { lag })
}

/// **Tests only.** Step what this process reads as the system's wall clock by `delta_ns`, as
/// NTP or a VM resume steps the real one.
#[cfg(unix)]
pub fn step_system_clock_for_tests(delta_ns: i64) {
    WALL.test_step_ns
        .fetch_add(delta_ns, std::sync::atomic::Ordering::Relaxed);
}

/// Nanoseconds on the process's monotonic clock since its first use.
#[cfg(unix)]
pub fn monotonic_ns() -> u64 {
    since_origin(clock_ns(libc::CLOCK_MONOTONIC))
}

/// [`monotonic_ns`] at the last clock tick (`CLOCK_MONOTONIC_COARSE`, the same clock read
/// without the TSC): never later than `monotonic_ns`, earlier by up to
/// [`coarse_clock_lag_ns`] while ticks keep time. A fifth of the cost here (5 ns against 23).
#[cfg(unix)]
pub fn monotonic_coarse_ns() -> u64 {
    since_origin(clock_ns(libc::CLOCK_MONOTONIC_COARSE))
}

/// How far the coarse clock normally lags the precise one: its resolution, one tick.
#[cfg(unix)]
pub fn coarse_clock_lag_ns() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAG: AtomicU64 = AtomicU64::new(0);
    match LAG.load(Ordering::Relaxed) {
        0 => {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid timespec to write.
            let r = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
            let lag = match r {
                0 => timespec_ns(&ts).max(1),
                _ => u64::MAX, // unknown: callers then keep to the precise clock
            };
            LAG.store(lag, Ordering::Relaxed);
            lag
        }
        lag => lag,
    }
}

/// A reading of `CLOCK_MONOTONIC` (precise or coarse) as nanoseconds since the first one.
#[cfg(unix)]
fn since_origin(now: u64) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    // 0 until the first call; the clock is never 0 after boot.
    static ORIGIN: AtomicU64 = AtomicU64::new(0);
    let origin = match ORIGIN.load(Ordering::Relaxed) {
        0 => match ORIGIN.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => now,
            Err(first) => first,
        },
        o => o,
    };
    now.saturating_sub(origin)
}

/// Wall-clock nanoseconds since the Unix epoch, for real-time backends.
#[cfg(not(unix))]
pub fn wall_clock_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The system's wall clock (no steps are told apart without Unix).
#[cfg(not(unix))]
pub fn system_wall_clock_ns() -> u64 {
    wall_clock_ns()
}

/// No steps are told apart without Unix.
#[cfg(not(unix))]
pub fn wall_clock_steps() -> (u64, u64) {
    (0, 0)
}

/// Nanoseconds on the process's monotonic clock since its first use.
#[cfg(not(unix))]
pub fn monotonic_ns() -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// No coarse clock without Unix: the precise one.
#[cfg(not(unix))]
pub fn monotonic_coarse_ns() -> u64 {
    monotonic_ns()
}

/// No coarse clock without Unix: no lag.
#[cfg(not(unix))]
pub fn coarse_clock_lag_ns() -> u64 {
    0
}

/// Sleep that is accurate at microsecond scale: short waits spin (yielding), long ones sleep.
pub fn precise_sleep_ns(ns: u64) {
    const SPIN_BELOW_NS: u64 = 50_000;
    if ns >= SPIN_BELOW_NS {
        std::thread::sleep(std::time::Duration::from_nanos(ns));
        return;
    }
    let until = std::time::Instant::now() + std::time::Duration::from_nanos(ns);
    while std::time::Instant::now() < until {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod clock_tests {
    use super::*;

    /// The clocks agree with the standard library's and the monotonic one never goes back.
    #[test]
    fn clocks_agree_with_std_and_move_forward() {
        let std_wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert!(wall_clock_ns().abs_diff(std_wall) < 1_000_000_000);
        let mut last = monotonic_ns();
        for _ in 0..10_000 {
            let now = monotonic_ns();
            assert!(now >= last, "monotonic clock went back: {last} then {now}");
            last = now;
        }
        let (before, std_before) = (monotonic_ns(), std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let slept = monotonic_ns() - before;
        let std_slept = std_before.elapsed().as_nanos() as u64;
        assert!(slept >= 20_000_000, "20 ms sleep measured as {slept} ns");
        assert!(
            slept.abs_diff(std_slept) < 2_000_000,
            "{slept} ns against std's {std_slept} ns"
        );
    }
}
