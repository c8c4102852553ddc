//! The fabric: registered memory regions addressed by `(node, region, offset)` and the three
//! one-sided operations the Nessie protocol is built from — READ, WRITE and 64-bit
//! COMPARE-AND-SWAP.
//!
//! The protocol crates are generic over [`Endpoint`] and never learn which backend they run on
//! (see `docs/fabric.md`):
//! - [`inproc`]: the in-process backend, N nodes inside one process (unit, property and concurrency tests; delay injection),
//! - UCX (separate processes over shared memory, TCP or RDMA verbs), in `nessie-fabric-ucx`.
//!
//! A virtual-time simulated RDMA network is planned as a third backend (issue 13); time is
//! already part of the endpoint so that it can run the same protocol code.
//!
//! Completion model: every call blocks the calling worker thread until the operation has
//! completed at the target (one outstanding operation per client worker, as in the paper).
//! Time is part of the endpoint (`now_ns` for the wall clock, `mono_ns` for durations,
//! `sleep_ns`) so that a simulated backend can run the same protocol code in virtual time.

pub mod addr;
pub mod delay;
pub mod error;
pub mod inproc;
pub mod interpose;
pub mod memory;
pub mod stats;

pub use addr::{NodeId, RegionId, RemoteAddr, ALIGN};
pub use error::{ConfigError, FabricError};
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

/// Wall-clock nanoseconds since the Unix epoch, for real-time backends.
#[cfg(unix)]
pub fn wall_clock_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
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
