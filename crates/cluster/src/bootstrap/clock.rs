//! Wall clocks at bootstrap. Wall-clock time crosses nodes only in DTE expiry timestamps, which
//! the protocol trusts to within `clock_margin`. So each node measures every peer's wall clock
//! during the authenticated bootstrap exchange (one NTP-style round trip) and refuses to start
//! when it cannot show the offset is within the margin.

/// **Tests only.** Milliseconds (may be negative) added to this process's bootstrap wall clock,
/// so a test can start a node whose clock is off. Read only by [`Clock::from_env`]; a node
/// with a skewed clock does not claim to share its host's clock, so peers on the same host
/// measure it like a remote one.
pub const TEST_SKEW_ENV: &str = "NESSIE_TEST_CLOCK_SKEW_MS";

/// **Tests only.** `ID:AFTER_MS:STEP_MS`: that many milliseconds after it starts, node `ID`
/// steps what it reads as the system's wall clock by `STEP_MS` (negative: back), as NTP or a
/// VM resume steps the real one (`nessie_fabric::step_system_clock_for_tests`). Other nodes
/// ignore it.
pub const TEST_WALL_STEP_ENV: &str = "NESSIE_TEST_WALL_STEP";

/// Read [`TEST_WALL_STEP_ENV`] for node `id`: (after, step) in ms, `None` if unset or another
/// node's.
pub fn test_wall_step(id: u16) -> Result<Option<(u64, i64)>, SkewError> {
    let Ok(v) = std::env::var(TEST_WALL_STEP_ENV) else {
        return Ok(None);
    };
    let bad = || SkewError { value: v.clone() };
    let mut parts = v.trim().splitn(3, ':');
    let mut next = || parts.next().ok_or_else(bad);
    let node = next()?.parse::<u16>().map_err(|_| bad())?;
    let after = next()?.parse::<u64>().map_err(|_| bad())?;
    let step = next()?.parse::<i64>().map_err(|_| bad())?;
    Ok((node == id).then_some((after, step)))
}

/// Where the kernel publishes an id that changes at every boot: nodes reporting the same id
/// read the same `CLOCK_REALTIME`, so their offset is zero by construction.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
/// Longest clock id carried in a bootstrap reply.
pub const MAX_CLOCK_ID_BYTES: usize = 64;

/// [`TEST_SKEW_ENV`] holds something other than a whole number of milliseconds.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{TEST_SKEW_ENV} or {TEST_WALL_STEP_ENV} holds {value:?}: not a number of milliseconds (or ID:AFTER_MS:STEP_MS)")]
pub struct SkewError {
    pub value: String,
}

/// The wall clock a node reports to, and measures, its peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clock {
    skew_ns: i64,
    /// Identifies the clock source when it is this host's unskewed system clock.
    id: Option<String>,
}

impl Clock {
    /// This host's system clock, skewed by [`TEST_SKEW_ENV`] when that is set.
    pub fn from_env() -> Result<Self, SkewError> {
        match std::env::var(TEST_SKEW_ENV) {
            Err(_) => Ok(Self::system()),
            Ok(v) => v
                .trim()
                .parse::<i64>()
                .ok()
                .and_then(|ms| ms.checked_mul(1_000_000))
                .map(|skew_ns| Self { skew_ns, id: None })
                .ok_or(SkewError { value: v }),
        }
    }

    /// This host's system clock, unskewed.
    pub fn system() -> Self {
        let id = std::fs::read_to_string(BOOT_ID_PATH)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty() && s.len() <= MAX_CLOCK_ID_BYTES);
        Self { skew_ns: 0, id }
    }

    /// **Tests only**: the system clock off by `skew_ms`, measured by peers even on this host.
    pub fn skewed(skew_ms: i64) -> Self {
        Self {
            skew_ns: skew_ms.saturating_mul(1_000_000),
            id: None,
        }
    }

    /// Nanoseconds since the Unix epoch by this clock: the process's wall clock
    /// (`nessie_fabric::wall_clock_ns`, which ignores backward steps of the system's), the one
    /// its expiry stamps are on.
    pub fn now_ns(&self) -> i64 {
        (nessie_fabric::wall_clock_ns() as i64).saturating_add(self.skew_ns)
    }

    /// The clock source's id, if it is this host's unskewed system clock, as read by every
    /// process on it: not once this process saw the system clock step back (it kept its own
    /// time, which processes started since do not share).
    pub fn id(&self) -> Option<&str> {
        if nessie_fabric::wall_clock_steps().0 > 0 {
            return None;
        }
        self.id.as_deref()
    }
}

/// One measurement of a peer's clock against ours.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ClockSample {
    /// Peer's clock minus ours, in ns (positive: the peer is ahead).
    pub offset_ns: i64,
    /// Half the round trip: the true offset lies within `offset_ns ± uncertainty_ns`.
    pub uncertainty_ns: i64,
    /// Both nodes read the same system clock (same host, same boot): the offset is zero.
    pub same_clock: bool,
}

impl ClockSample {
    /// From our clock at sending (`t0`) and receiving (`t1`) and the peer's clock in between.
    pub fn measure(t0: i64, peer: i64, t1: i64, same_clock: bool) -> Self {
        let mid = t0 + (t1 - t0) / 2;
        Self {
            offset_ns: peer - mid,
            uncertainty_ns: ((t1 - t0).max(0) + 1) / 2,
            same_clock,
        }
    }

    /// Whether the offset is shown to be within `margin_ns`.
    pub fn within(&self, margin_ns: u64) -> bool {
        self.same_clock
            || (self.offset_ns.unsigned_abs()).saturating_add(self.uncertainty_ns as u64)
                <= margin_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_is_taken_against_the_midpoint() {
        let s = ClockSample::measure(1_000, 1_700, 2_000, false);
        assert_eq!((s.offset_ns, s.uncertainty_ns), (200, 500));
        assert!(s.within(700) && !s.within(699));
        let behind = ClockSample::measure(1_000, 0, 1_000, false);
        assert_eq!(behind.offset_ns, -1_000);
        assert!(!behind.within(999));
        assert!(ClockSample::measure(0, 1 << 40, 0, true).within(0));
    }

    #[test]
    fn skewed_clocks_are_off_and_not_the_hosts() {
        let (sys, ahead) = (Clock::system(), Clock::skewed(1_000));
        assert!(ahead.id().is_none());
        let d = ahead.now_ns() - sys.now_ns();
        assert!((999_000_000..1_100_000_000).contains(&d), "{d}");
    }
}
