//! Fault injection in virtual time (correctness mode): random extra delays around operations,
//! NIC engine stalls, and long pauses of client threads, typically longer than the protocol's
//! expiry period, so that operation timers, expiry and the completion of abandoned writes are
//! exercised.
//!
//! Every draw comes from a stream of its endpoint ([`FaultStream`]), seeded from the run's seed
//! and the endpoint's number (endpoints are numbered in the order they are made, by setup code),
//! and is taken by the thread that owns the endpoint, in the order of its own operations: a run
//! with faults is a function of its seed, like one without.
//!
//! The in-process tests widen races with real sleeps (`nessie_fabric::delay`, the stress tests'
//! stall hooks); here the same faults cost no real time, so pauses can be many expiry periods
//! long and frequent.

use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Longest extra delay around one operation (1 s).
pub const MAX_DELAY_NS: u64 = 1_000_000_000;
/// Longest NIC stall (1 s).
pub const MAX_NIC_STALL_NS: u64 = 1_000_000_000;
/// Longest client pause (1 h, the longest expiry period a protocol may be configured with).
pub const MAX_PAUSE_NS: u64 = 3_600_000_000_000;
/// Longest wait for a lost operation (1 s).
pub const MAX_LOSS_TIMEOUT_NS: u64 = 1_000_000_000;

/// Spreads the streams of endpoints sharing one seed (the 64-bit golden ratio).
const STREAM_SPREAD: u64 = 0x9E37_79B9_7F4A_7C15;
/// Keeps fault streams apart from the scheduler's tie-breaks, which use the same seed.
const FAULT_SALT: u64 = 0xFA17_5EED_0000_0001;

/// What faults a simulation injects. All off by default ([`SimFaults::NONE`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimFaults {
    /// Probability in `[0, 1]` of an extra delay before an operation, and again after it
    /// (READ, WRITE, CAS and direct accesses, on every simulated thread).
    pub delay_probability: f64,
    /// Longest such delay, ns; each is uniform in `1..=max_delay_ns`.
    pub max_delay_ns: u64,
    /// Probability in `[0, 1]` that a NIC engine stalls when a request reaches it (at the
    /// requester and again at the responder): it processes nothing, that request included,
    /// for the stall, and every request queued behind it waits.
    pub nic_stall_probability: f64,
    /// Longest NIC stall, ns; each is uniform in `1..=max_nic_stall_ns`.
    pub max_nic_stall_ns: u64,
    /// Probability in `[0, 1]` that a client thread pauses before an operation, usually in the
    /// middle of a protocol operation (polling server threads never pause).
    pub pause_probability: f64,
    /// Shortest pause, ns: longer than the expiry period (plus clock margin) to make the
    /// paused operation outlive its timer.
    pub min_pause_ns: u64,
    /// Longest pause, ns; each is uniform in `min_pause_ns..=max_pause_ns`.
    pub max_pause_ns: u64,
    /// Probability in `[0, 1]` that a client thread's remote READ, WRITE or CAS is lost: half
    /// of the losses are of the request (the operation never takes effect), half of the
    /// answer (it took effect). Either way the requester gives up after `loss_timeout_ns`
    /// with an error (`FabricError::Unreachable`), unable to tell which it was, as a real
    /// fabric's operation timeout leaves it.
    pub loss_probability: f64,
    /// How long after posting a lost operation its requester gives up, ns.
    pub loss_timeout_ns: u64,
}

/// What became of a remote operation ([`FaultStream::loss`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Delivered and answered.
    None,
    /// The request was lost: no effect.
    Request,
    /// The answer was lost: the effect took place.
    Answer,
}

impl Default for SimFaults {
    fn default() -> Self {
        Self::NONE
    }
}

/// Why a fault configuration is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaultsError {
    #[error("{field} = {value} is not a probability in [0, 1]")]
    Probability { field: &'static str, value: f64 },
    #[error("{field} = {value} ns exceeds the limit of {max} ns")]
    TooLong {
        field: &'static str,
        value: u64,
        max: u64,
    },
    #[error("{probability} > 0 needs {max} > 0")]
    NoLength {
        probability: &'static str,
        max: &'static str,
    },
    #[error("min_pause_ns = {min} exceeds max_pause_ns = {max}")]
    PauseOrder { min: u64, max: u64 },
}

impl SimFaults {
    /// No faults.
    pub const NONE: SimFaults = SimFaults {
        delay_probability: 0.0,
        max_delay_ns: 0,
        nic_stall_probability: 0.0,
        max_nic_stall_ns: 0,
        pause_probability: 0.0,
        min_pause_ns: 0,
        max_pause_ns: 0,
        loss_probability: 0.0,
        loss_timeout_ns: 0,
    };

    /// Whether any fault can happen.
    pub fn any(&self) -> bool {
        self.delay_probability > 0.0
            || self.nic_stall_probability > 0.0
            || self.pause_probability > 0.0
            || self.loss_probability > 0.0
    }

    pub fn validate(&self) -> Result<(), FaultsError> {
        let probabilities = [
            ("delay_probability", self.delay_probability),
            ("nic_stall_probability", self.nic_stall_probability),
            ("pause_probability", self.pause_probability),
            ("loss_probability", self.loss_probability),
        ];
        for (field, value) in probabilities {
            if !(0.0..=1.0).contains(&value) {
                return Err(FaultsError::Probability { field, value });
            }
        }
        let lengths = [
            ("max_delay_ns", self.max_delay_ns, MAX_DELAY_NS),
            ("max_nic_stall_ns", self.max_nic_stall_ns, MAX_NIC_STALL_NS),
            ("max_pause_ns", self.max_pause_ns, MAX_PAUSE_NS),
            ("loss_timeout_ns", self.loss_timeout_ns, MAX_LOSS_TIMEOUT_NS),
        ];
        for (field, value, max) in lengths {
            if value > max {
                return Err(FaultsError::TooLong { field, value, max });
            }
        }
        let needs = [
            (
                "delay_probability",
                "max_delay_ns",
                self.delay_probability,
                self.max_delay_ns,
            ),
            (
                "nic_stall_probability",
                "max_nic_stall_ns",
                self.nic_stall_probability,
                self.max_nic_stall_ns,
            ),
            (
                "pause_probability",
                "min_pause_ns",
                self.pause_probability,
                self.min_pause_ns,
            ),
            (
                "loss_probability",
                "loss_timeout_ns",
                self.loss_probability,
                self.loss_timeout_ns,
            ),
        ];
        for (probability, max, p, len) in needs {
            if p > 0.0 && len == 0 {
                return Err(FaultsError::NoLength { probability, max });
            }
        }
        if self.min_pause_ns > self.max_pause_ns {
            return Err(FaultsError::PauseOrder {
                min: self.min_pause_ns,
                max: self.max_pause_ns,
            });
        }
        Ok(())
    }
}

/// How many faults a run injected (all endpoints).
#[derive(Debug, Default)]
pub struct FaultCounts {
    delays: AtomicU64,
    nic_stalls: AtomicU64,
    pauses: AtomicU64,
    paused_ns: AtomicU64,
    lost_requests: AtomicU64,
    lost_answers: AtomicU64,
}

/// A snapshot of [`FaultCounts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaultTotals {
    pub delays: u64,
    pub nic_stalls: u64,
    pub pauses: u64,
    /// Virtual time client threads spent paused, ns.
    pub paused_ns: u64,
    /// Remote operations whose request, or whose answer, was lost.
    pub lost_requests: u64,
    pub lost_answers: u64,
}

impl FaultCounts {
    pub fn totals(&self) -> FaultTotals {
        FaultTotals {
            delays: self.delays.load(Ordering::Relaxed),
            nic_stalls: self.nic_stalls.load(Ordering::Relaxed),
            pauses: self.pauses.load(Ordering::Relaxed),
            paused_ns: self.paused_ns.load(Ordering::Relaxed),
            lost_requests: self.lost_requests.load(Ordering::Relaxed),
            lost_answers: self.lost_answers.load(Ordering::Relaxed),
        }
    }
}

/// One endpoint's faults: each method draws and returns how long to wait (0: no fault).
pub struct FaultStream {
    cfg: SimFaults,
    rng: SmallRng,
    /// Whether this endpoint's thread may pause and lose operations (client threads; not
    /// polling servers).
    pauses: bool,
}

impl FaultStream {
    /// `stream` tells apart the endpoints of one run (their creation order).
    pub fn new(cfg: SimFaults, seed: u64, stream: u64, pauses: bool) -> Self {
        let s = seed ^ FAULT_SALT ^ stream.wrapping_add(1).wrapping_mul(STREAM_SPREAD);
        Self {
            cfg,
            rng: SmallRng::seed_from_u64(s),
            pauses,
        }
    }

    fn draw(&mut self, p: f64, lo: u64, hi: u64) -> u64 {
        if p > 0.0 && self.rng.gen_bool(p) {
            self.rng.gen_range(lo..=hi)
        } else {
            0
        }
    }

    /// Before an operation: a pause, then a delay.
    pub fn before(&mut self, counts: &FaultCounts) -> u64 {
        let c = &self.cfg;
        let (pp, lo, hi) = (c.pause_probability, c.min_pause_ns, c.max_pause_ns);
        let pause = if self.pauses {
            self.draw(pp, lo, hi)
        } else {
            0
        };
        if pause > 0 {
            counts.pauses.fetch_add(1, Ordering::Relaxed);
            counts.paused_ns.fetch_add(pause, Ordering::Relaxed);
        }
        pause + self.after(counts)
    }

    /// After an operation (before it returns): a delay.
    pub fn after(&mut self, counts: &FaultCounts) -> u64 {
        let d = self.draw(self.cfg.delay_probability, 1, self.cfg.max_delay_ns);
        counts.delays.fetch_add((d > 0) as u64, Ordering::Relaxed);
        d
    }

    /// Whether a client thread's remote operation is lost, and which half.
    pub fn loss(&mut self, counts: &FaultCounts) -> Loss {
        let p = self.cfg.loss_probability;
        if !self.pauses || p == 0.0 || !self.rng.gen_bool(p) {
            return Loss::None;
        }
        if self.rng.gen_bool(0.5) {
            counts.lost_requests.fetch_add(1, Ordering::Relaxed);
            Loss::Request
        } else {
            counts.lost_answers.fetch_add(1, Ordering::Relaxed);
            Loss::Answer
        }
    }

    /// How long a requester waits for a lost operation.
    pub fn loss_timeout_ns(&self) -> u64 {
        self.cfg.loss_timeout_ns
    }

    /// When a request reaches a NIC engine: a stall it waits out first.
    pub fn nic_stall(&mut self, counts: &FaultCounts) -> u64 {
        let s = self.draw(self.cfg.nic_stall_probability, 1, self.cfg.max_nic_stall_ns);
        counts
            .nic_stalls
            .fetch_add((s > 0) as u64, Ordering::Relaxed);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> SimFaults {
        SimFaults {
            delay_probability: 0.5,
            max_delay_ns: 1_000,
            nic_stall_probability: 0.5,
            max_nic_stall_ns: 2_000,
            pause_probability: 0.5,
            min_pause_ns: 10_000,
            max_pause_ns: 20_000,
            loss_probability: 0.5,
            loss_timeout_ns: 5_000,
        }
    }

    #[test]
    fn every_field_is_validated() {
        all().validate().unwrap();
        SimFaults::NONE.validate().unwrap();
        let bad = [
            (
                SimFaults {
                    delay_probability: 1.5,
                    ..all()
                },
                "delay_probability = 1.5",
            ),
            (
                SimFaults {
                    pause_probability: f64::NAN,
                    ..all()
                },
                "pause_probability = NaN",
            ),
            (
                SimFaults {
                    max_delay_ns: MAX_DELAY_NS + 1,
                    ..all()
                },
                "max_delay_ns",
            ),
            (
                SimFaults {
                    max_nic_stall_ns: 0,
                    ..all()
                },
                "needs max_nic_stall_ns",
            ),
            (
                SimFaults {
                    min_pause_ns: 30_000,
                    ..all()
                },
                "exceeds max_pause_ns",
            ),
            (
                SimFaults {
                    max_pause_ns: MAX_PAUSE_NS + 1,
                    ..all()
                },
                "max_pause_ns",
            ),
            (
                SimFaults {
                    loss_probability: -0.1,
                    ..all()
                },
                "loss_probability = -0.1",
            ),
            (
                SimFaults {
                    loss_timeout_ns: 0,
                    ..all()
                },
                "needs loss_timeout_ns",
            ),
            (
                SimFaults {
                    loss_timeout_ns: MAX_LOSS_TIMEOUT_NS + 1,
                    ..all()
                },
                "loss_timeout_ns",
            ),
        ];
        for (f, msg) in bad {
            let e = f.validate().unwrap_err().to_string();
            assert!(e.contains(msg), "{e:?} should say {msg:?}");
        }
    }

    #[test]
    fn streams_replay_and_draw_in_range() {
        let counts = FaultCounts::default();
        let draws = |stream| {
            let mut s = FaultStream::new(all(), 7, stream, true);
            (0..200)
                .map(|_| (s.before(&counts), s.after(&counts), s.nic_stall(&counts)))
                .collect::<Vec<_>>()
        };
        let a = draws(1);
        assert_eq!(a, draws(1), "same seed and stream, same faults");
        assert_ne!(a, draws(2), "streams differ");
        assert!(a.iter().all(|&(_, d, s)| d <= 1_000 && s <= 2_000));
        assert!(a.iter().any(|&(b, _, _)| b >= 10_000), "some pauses");
        let t = counts.totals();
        assert!(t.pauses > 0 && t.delays > 0 && t.nic_stalls > 0, "{t:?}");
        let mut server = FaultStream::new(all(), 7, 1, false);
        assert!(
            (0..200).all(|_| server.before(&counts) <= 1_000),
            "no pauses"
        );
    }
}
