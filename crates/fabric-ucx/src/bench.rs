//! Latency of single blocking fabric operations, for `nessie fabric-bench`.
//!
//! Works on any [`Endpoint`]. Each iteration is one blocking operation (one outstanding
//! operation per worker, as in the protocol), so `ops_per_sec` is `1 / mean latency`.
//!
//! # Comparing with `ucx_perftest`
//! `ucx_perftest` measures the same ucp calls without this crate around them. Start a server,
//! then point a client at it with the same transports as the [`crate::Transport`] under test
//! (the server serves one test and exits; `-O 1` keeps one operation outstanding, as here;
//! the bootstrap uses a TCP socket on `-p`, so the server must be reachable even for shm):
//!
//! ```text
//! # shared memory
//! UCX_TLS=posix,self ucx_perftest -p 13353 &
//! UCX_TLS=posix,self ucx_perftest localhost -p 13353 -t ucp_cswap -s 8     -n 200000 -O 1
//! #   (restart the server before each client run)
//! UCX_TLS=posix,self ucx_perftest localhost -p 13353 -t ucp_get   -s 8     -n 200000 -O 1
//! UCX_TLS=posix,self ucx_perftest localhost -p 13353 -t ucp_get   -s 16384 -n 100000 -O 1
//! # tcp over loopback
//! UCX_TLS=tcp,self UCX_NET_DEVICES=lo ucx_perftest -p 13353 &
//! UCX_TLS=tcp,self UCX_NET_DEVICES=lo ucx_perftest localhost -p 13353 -t ucp_get -s 16384 -n 20000 -O 1
//! ```
//!
//! The columns after the iteration count are latency in microseconds: the percentile (`-R`,
//! default 50), then average and overall. The same numbers from this crate, between two
//! processes (target in a child process, its progress thread event-driven):
//! `NESSIE_UCX_BENCH_ITERS=10 cargo test -p nessie-fabric-ucx --test multiprocess bench_op -- --nocapture`.
//!
//! What to expect (2-core VM, UCX 1.13): over shm this crate adds a few tens of nanoseconds
//! per operation (a `ucp_worker_progress` before posting, to notice failed peers; zeroing the
//! request; bounds checks and counters). Over tcp the target's progress thread sleeps in
//! `epoll` between requests, which costs a wake-up per operation compared with perftest's
//! busy-polling server (see [`crate::UcxConfig::progress_spin`]); conversely perftest's
//! `ucp_get` over tcp took ~1.1 ms per operation here at any size, apparently because its
//! responder does not drive its worker continuously in one-sided tests, so compare tcp READ
//! latency with `ucp_cswap` (same software-emulated round trip) rather than with its `ucp_get`.
//! `write` here is a put plus an endpoint flush (remote completion); perftest's `ucp_put_lat`
//! is a ping-pong of puts, not the same thing.

use std::time::Instant;

use nessie_fabric::{Endpoint, FabricError, RemoteAddr};

use crate::config::ParseError;

/// Which operation [`bench_op`] measures.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchOp {
    Read,
    Write,
    /// 64-bit CAS that always succeeds (expected = the value the previous CAS returned).
    Cas,
}

impl std::str::FromStr for BenchOp {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s.to_ascii_lowercase().as_str() {
            "read" | "get" => Ok(BenchOp::Read),
            "write" | "put" => Ok(BenchOp::Write),
            "cas" | "cswap" => Ok(BenchOp::Cas),
            _ => Err(ParseError::BenchOp(s.to_string())),
        }
    }
}

/// Result of [`bench_op`].
#[derive(Copy, Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencyStats {
    pub op: BenchOp,
    /// Bytes per operation (8 for CAS).
    pub size: usize,
    /// Measured operations (after warm-up).
    pub iterations: u64,
    pub min_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub mean_ns: f64,
    /// Operations per second over the measured run (one outstanding operation).
    pub ops_per_sec: f64,
}

impl std::fmt::Display for LatencyStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} {} B x {}: p50 {:.2} us  p99 {:.2} us  mean {:.2} us  min {:.2} us  max {:.2} us  {:.0} ops/s",
            self.op,
            self.size,
            self.iterations,
            self.p50_ns as f64 / 1e3,
            self.p99_ns as f64 / 1e3,
            self.mean_ns / 1e3,
            self.min_ns as f64 / 1e3,
            self.max_ns as f64 / 1e3,
            self.ops_per_sec
        )
    }
}

/// A cheap per-operation timer: the TSC on x86-64 (calibrated against `Instant`), as
/// `ucx_perftest` uses, so that both measurements carry the same small timer overhead
/// (`clock_gettime` costs 20-40 ns in a VM, a third of an shm READ); `Instant` elsewhere.
struct Ticks {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    ns_per_tick: f64,
    origin: Instant,
}

impl Ticks {
    fn calibrate() -> Self {
        let origin = Instant::now();
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: rdtsc has no preconditions on x86-64.
            let t0 = unsafe { core::arch::x86_64::_rdtsc() };
            let i0 = Instant::now();
            std::thread::sleep(std::time::Duration::from_millis(20));
            let t1 = unsafe { core::arch::x86_64::_rdtsc() };
            let ns = i0.elapsed().as_nanos() as f64;
            let ticks = t1.wrapping_sub(t0) as f64;
            if ticks > 0.0 {
                return Self {
                    ns_per_tick: ns / ticks,
                    origin,
                };
            }
        }
        Self {
            ns_per_tick: 0.0,
            origin,
        }
    }

    fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.ns_per_tick > 0.0 {
            // SAFETY: as above.
            return unsafe { core::arch::x86_64::_rdtsc() };
        }
        self.origin.elapsed().as_nanos() as u64
    }

    fn ns_since(&self, t: u64) -> u64 {
        let now = self.now();
        #[cfg(target_arch = "x86_64")]
        if self.ns_per_tick > 0.0 {
            return (now.wrapping_sub(t) as f64 * self.ns_per_tick) as u64;
        }
        now - t
    }
}

/// Measure `iterations` blocking `op`s of `size` bytes at `addr` (CAS: always 8 bytes), after
/// a warm-up of `iterations / 10` (at most 1000) operations. `addr` and `size` must be valid
/// for the target region; WRITE and CAS overwrite the memory there.
pub fn bench_op<E: Endpoint + ?Sized>(
    ep: &mut E,
    addr: RemoteAddr,
    op: BenchOp,
    size: usize,
    iterations: u64,
) -> Result<LatencyStats, FabricError> {
    bench_op_over(ep, addr, op, size, size as u64, iterations)
}

/// Offsets of `size`-byte accesses spread over `span` bytes, 8-byte aligned, drawn from a fixed
/// seed (xorshift) so that runs compare. `span == size` gives offset 0 every time.
fn spread_offsets(size: u64, span: u64, n: u64) -> Vec<u64> {
    let slots = (span.saturating_sub(size)) / 8 + 1;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % slots) * 8
        })
        .collect()
}

/// [`bench_op`] at offsets spread over the `span` bytes from `addr` (READ and WRITE; CAS stays
/// on `addr`), so that a working set larger than the caches makes every access cold. Offsets
/// are drawn before the timed loop.
pub fn bench_op_over<E: Endpoint + ?Sized>(
    ep: &mut E,
    addr: RemoteAddr,
    op: BenchOp,
    size: usize,
    span: u64,
    iterations: u64,
) -> Result<LatencyStats, FabricError> {
    measure(ep, addr, op, size, span, iterations, false)
}

/// [`bench_op_over`] of READs or WRITEs of the endpoint's own region `region` with
/// `local_read`/`local_write`: the path of a GET whose entry is in its own node's memory. CAS
/// has no local path (index words always go through the fabric).
pub fn bench_local_over<E: Endpoint + ?Sized>(
    ep: &mut E,
    region: nessie_fabric::RegionId,
    op: BenchOp,
    size: usize,
    span: u64,
    iterations: u64,
) -> Result<LatencyStats, FabricError> {
    assert!(op != BenchOp::Cas, "no local CAS");
    let addr = RemoteAddr::new(ep.node(), region, 0);
    measure(ep, addr, op, size, span, iterations, true)
}

fn measure<E: Endpoint + ?Sized>(
    ep: &mut E,
    addr: RemoteAddr,
    op: BenchOp,
    size: usize,
    span: u64,
    iterations: u64,
    local: bool,
) -> Result<LatencyStats, FabricError> {
    let size = if op == BenchOp::Cas { 8 } else { size };
    let span = if op == BenchOp::Cas {
        8
    } else {
        span.max(size as u64)
    };
    let warmup = (iterations / 10).min(1000);
    let iterations = iterations.max(1);
    let offsets = spread_offsets(size as u64, span, warmup + iterations);
    let mut buf = vec![0u8; size];
    let mut cur = if op == BenchOp::Cas {
        ep.read_u64(addr)?
    } else {
        0
    };
    let mut one = |ep: &mut E, buf: &mut Vec<u8>, off: u64| -> Result<(), FabricError> {
        match op {
            BenchOp::Read if local => ep.local_read(addr.region, addr.offset + off, buf),
            BenchOp::Write if local => ep.local_write(addr.region, addr.offset + off, buf),
            BenchOp::Read => ep.read(addr.add(off), buf),
            BenchOp::Write => ep.write(addr.add(off), buf),
            BenchOp::Cas => {
                let seen = ep.compare_and_swap(addr, cur, cur.wrapping_add(1))?;
                cur = if seen == cur {
                    cur.wrapping_add(1)
                } else {
                    seen
                };
                Ok(())
            }
        }
    };
    for &off in &offsets[..warmup as usize] {
        one(ep, &mut buf, off)?;
    }
    let mut lat = Vec::with_capacity(iterations as usize);
    let clock = Ticks::calibrate();
    let start = Instant::now();
    for &off in &offsets[warmup as usize..] {
        let t = clock.now();
        one(ep, &mut buf, off)?;
        lat.push(clock.ns_since(t));
    }
    Ok(summarise(op, size, lat, start.elapsed()))
}

/// The physical limit a READ is measured against: one plain copy of `size` bytes from a local
/// buffer of `span` bytes, at the same spread offsets, with the same timer.
pub fn bench_copy(size: usize, span: u64, iterations: u64) -> LatencyStats {
    let span = span.max(size as u64);
    let iterations = iterations.max(1);
    // Written, not just allocated: every page is backed before the timed loop.
    let src: Vec<u8> = (0..span).map(|i| i as u8).collect();
    let mut dst = vec![0u8; size];
    let offsets = spread_offsets(size as u64, span, iterations);
    let mut lat = Vec::with_capacity(iterations as usize);
    let clock = Ticks::calibrate();
    let start = Instant::now();
    for &off in &offsets {
        let t = clock.now();
        dst.copy_from_slice(&src[off as usize..off as usize + size]);
        std::hint::black_box(&mut dst);
        lat.push(clock.ns_since(t));
    }
    summarise(BenchOp::Read, size, lat, start.elapsed())
}

fn summarise(
    op: BenchOp,
    size: usize,
    mut lat: Vec<u64>,
    total: std::time::Duration,
) -> LatencyStats {
    let iterations = lat.len() as u64;
    lat.sort_unstable();
    let pct = |p: f64| lat[(((lat.len() - 1) as f64) * p).round() as usize];
    let sum: u64 = lat.iter().sum();
    LatencyStats {
        op,
        size,
        iterations,
        min_ns: lat[0],
        p50_ns: pct(0.50),
        p99_ns: pct(0.99),
        max_ns: *lat.last().unwrap(),
        mean_ns: sum as f64 / lat.len() as f64,
        ops_per_sec: iterations as f64 / total.as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_offsets_stay_aligned_inside_the_span() {
        let offs = spread_offsets(16384, 1 << 24, 10_000);
        assert!(offs.iter().all(|&o| o % 8 == 0 && o + 16384 <= 1 << 24));
        let distinct: std::collections::HashSet<_> = offs.iter().collect();
        assert!(distinct.len() > 9_000, "offsets spread: {}", distinct.len());
        assert!(spread_offsets(64, 64, 10).iter().all(|&o| o == 0));
    }

    #[test]
    fn bench_copy_measures_every_iteration() {
        let s = bench_copy(4096, 1 << 20, 1_000);
        assert_eq!((s.iterations, s.size), (1_000, 4096));
        assert!(s.min_ns <= s.p50_ns && s.p50_ns <= s.p99_ns && s.p99_ns <= s.max_ns);
        assert!(s.ops_per_sec > 0.0);
    }
}
