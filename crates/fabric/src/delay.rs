//! Delay injection for any backend: [`Delayed`] wraps an endpoint and adds seeded random yields
//! and sleeps before and after every operation (see [`DelayInjection`]), so race windows can be
//! widened on a real multi-process fabric as well as in process. The in-process fabric
//! (`crate::mem`) injects through the same [`Injector`].

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::{ConfigError, Endpoint, FabricError, NodeId, RegionId, RemoteAddr, StatsCell};

/// Spreads the streams of endpoints that share one seed (the 64-bit golden ratio).
const STREAM_SPREAD: u64 = 0x9E37_79B9_7F4A_7C15;
/// Most one injected sleep may last.
const MAX_INJECTED_DELAY_NS: u64 = 1_000_000_000;

/// Random delays around each operation, to widen race windows.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DelayInjection {
    /// Seed; each endpoint derives its own stream from it.
    pub seed: u64,
    /// Probability in `[0, 1]` that a delay is injected at each injection point.
    pub probability: f64,
    /// Upper bound of one injected sleep, in nanoseconds (half of the delays are plain yields).
    pub max_delay_ns: u64,
}

impl DelayInjection {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.probability) {
            return Err(ConfigError::DelayProbability(self.probability));
        }
        if self.max_delay_ns > MAX_INJECTED_DELAY_NS {
            return Err(ConfigError::DelayTooLong(self.max_delay_ns));
        }
        Ok(())
    }
}

/// One endpoint's stream of injected delays.
pub(crate) struct Injector {
    cfg: DelayInjection,
    rng: SmallRng,
}

impl Injector {
    /// `stream` distinguishes endpoints sharing one seed.
    pub(crate) fn new(cfg: DelayInjection, stream: u64) -> Self {
        let rng = SmallRng::seed_from_u64(cfg.seed ^ stream.wrapping_mul(STREAM_SPREAD));
        Self { cfg, rng }
    }

    /// At one injection point: with the configured probability, yield or sleep.
    pub(crate) fn delay(&mut self) {
        if self.cfg.probability > 0.0 && self.rng.gen_bool(self.cfg.probability) {
            if self.cfg.max_delay_ns == 0 || self.rng.gen_bool(0.5) {
                std::thread::yield_now();
            } else {
                let ns = self.rng.gen_range(0..=self.cfg.max_delay_ns);
                crate::precise_sleep_ns(ns);
            }
        }
    }
}

/// An endpoint with delays injected before and after every operation.
pub struct Delayed<E> {
    inner: E,
    injector: Injector,
}

impl<E: Endpoint> Delayed<E> {
    /// `stream` distinguishes endpoints sharing one seed.
    pub fn new(inner: E, cfg: DelayInjection, stream: u64) -> Self {
        Self {
            inner,
            injector: Injector::new(cfg, stream),
        }
    }

    pub fn inner(&self) -> &E {
        &self.inner
    }

    fn around<T>(&mut self, f: impl FnOnce(&mut E) -> T) -> T {
        self.injector.delay();
        let r = f(&mut self.inner);
        self.injector.delay();
        r
    }
}

impl<E: Endpoint> Endpoint for Delayed<E> {
    fn node(&self) -> NodeId {
        self.inner.node()
    }
    fn node_count(&self) -> usize {
        self.inner.node_count()
    }
    fn read(&mut self, addr: RemoteAddr, buf: &mut [u8]) -> Result<(), FabricError> {
        self.around(|e| e.read(addr, buf))
    }
    fn write(&mut self, addr: RemoteAddr, buf: &[u8]) -> Result<(), FabricError> {
        self.around(|e| e.write(addr, buf))
    }
    fn compare_and_swap(
        &mut self,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        self.around(|e| e.compare_and_swap(addr, expected, desired))
    }
    fn local_read(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        self.around(|e| e.local_read(region, offset, buf))
    }
    fn local_prefetch(&self, region: RegionId, offset: u64, len: u64) {
        self.inner.local_prefetch(region, offset, len)
    }

    fn local_write(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &[u8],
    ) -> Result<(), FabricError> {
        self.around(|e| e.local_write(region, offset, buf))
    }
    fn now_ns(&self) -> u64 {
        self.inner.now_ns()
    }
    fn mono_ns(&self) -> u64 {
        self.inner.mono_ns()
    }
    fn mono_coarse_ns(&self) -> u64 {
        self.inner.mono_coarse_ns()
    }
    fn coarse_lag_ns(&self) -> u64 {
        self.inner.coarse_lag_ns()
    }
    fn sleep_ns(&mut self, ns: u64) {
        self.inner.sleep_ns(ns)
    }
    fn virtual_time(&self) -> bool {
        self.inner.virtual_time()
    }
    fn reads_are_local_copies(&self) -> bool {
        self.inner.reads_are_local_copies()
    }
    fn idle_poll(&mut self, region: RegionId, watched: &[std::ops::Range<u64>]) {
        self.inner.idle_poll(region, watched)
    }
    fn stats(&self) -> &StatsCell {
        self.inner.stats()
    }
}

/// An endpoint that is wrapped in [`Delayed`] only when delay injection is asked for, so runs
/// without it pay nothing but a branch.
pub enum MaybeDelayed<E> {
    Direct(E),
    Delayed(Delayed<E>),
}

impl<E: Endpoint> MaybeDelayed<E> {
    /// `inner` itself without `cfg`; wrapped with `stream` (as in [`Delayed::new`]) with it.
    pub fn new(inner: E, cfg: Option<DelayInjection>, stream: u64) -> Self {
        match cfg {
            None => MaybeDelayed::Direct(inner),
            Some(cfg) => MaybeDelayed::Delayed(Delayed::new(inner, cfg, stream)),
        }
    }

    pub fn inner(&self) -> &E {
        match self {
            MaybeDelayed::Direct(e) => e,
            MaybeDelayed::Delayed(d) => d.inner(),
        }
    }
}

/// `$body` with `$e` bound to whichever endpoint `$self` holds.
macro_rules! either {
    ($self:expr, $e:ident => $body:expr) => {
        match $self {
            MaybeDelayed::Direct($e) => $body,
            MaybeDelayed::Delayed($e) => $body,
        }
    };
}

impl<E: Endpoint> Endpoint for MaybeDelayed<E> {
    fn node(&self) -> NodeId {
        either!(self, e => e.node())
    }
    fn node_count(&self) -> usize {
        either!(self, e => e.node_count())
    }
    fn read(&mut self, addr: RemoteAddr, buf: &mut [u8]) -> Result<(), FabricError> {
        either!(self, e => e.read(addr, buf))
    }
    fn write(&mut self, addr: RemoteAddr, buf: &[u8]) -> Result<(), FabricError> {
        either!(self, e => e.write(addr, buf))
    }
    fn compare_and_swap(
        &mut self,
        addr: RemoteAddr,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        either!(self, e => e.compare_and_swap(addr, expected, desired))
    }
    fn local_read(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        either!(self, e => e.local_read(region, offset, buf))
    }
    fn local_prefetch(&self, region: RegionId, offset: u64, len: u64) {
        either!(self, e => e.local_prefetch(region, offset, len))
    }
    fn local_write(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &[u8],
    ) -> Result<(), FabricError> {
        either!(self, e => e.local_write(region, offset, buf))
    }
    fn now_ns(&self) -> u64 {
        either!(self, e => e.now_ns())
    }
    fn mono_ns(&self) -> u64 {
        either!(self, e => e.mono_ns())
    }
    fn mono_coarse_ns(&self) -> u64 {
        either!(self, e => e.mono_coarse_ns())
    }
    fn coarse_lag_ns(&self) -> u64 {
        either!(self, e => e.coarse_lag_ns())
    }
    fn sleep_ns(&mut self, ns: u64) {
        either!(self, e => e.sleep_ns(ns))
    }
    fn virtual_time(&self) -> bool {
        either!(self, e => e.virtual_time())
    }
    fn reads_are_local_copies(&self) -> bool {
        either!(self, e => e.reads_are_local_copies())
    }
    fn idle_poll(&mut self, region: RegionId, watched: &[std::ops::Range<u64>]) {
        either!(self, e => e.idle_poll(region, watched))
    }
    fn stats(&self) -> &StatsCell {
        either!(self, e => e.stats())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inproc::InProcFabric;

    #[test]
    fn wrapper_is_transparent_and_delays() {
        let f = InProcFabric::new(&[vec![64]], None).unwrap();
        let cfg = DelayInjection {
            seed: 1,
            probability: 1.0,
            max_delay_ns: 200_000,
        };
        let mut d = Delayed::new(f.endpoint(0), cfg, 0);
        let t = std::time::Instant::now();
        for i in 0..20u64 {
            d.write(RemoteAddr::new(0, 0, 8), &i.to_le_bytes()).unwrap();
            assert_eq!(d.read_u64(RemoteAddr::new(0, 0, 8)).unwrap(), i);
        }
        assert_eq!(
            d.compare_and_swap(RemoteAddr::new(0, 0, 8), 19, 5).unwrap(),
            19
        );
        assert_eq!(d.stats().snapshot().total_ops(), 41);
        // 82 injection points at probability 1, half of them sleeps of up to 200 µs.
        assert!(
            t.elapsed() > std::time::Duration::from_micros(500),
            "delays were injected"
        );
    }

    #[test]
    fn maybe_delayed_wraps_only_when_asked() {
        let f = InProcFabric::new(&[vec![64]], None).unwrap();
        let mut plain = MaybeDelayed::new(f.endpoint(0), None, 0);
        assert!(matches!(plain, MaybeDelayed::Direct(_)));
        let cfg = DelayInjection {
            seed: 1,
            probability: 1.0,
            max_delay_ns: 0,
        };
        let mut delayed = MaybeDelayed::new(f.endpoint(0), Some(cfg), 1);
        assert!(matches!(delayed, MaybeDelayed::Delayed(_)));
        plain
            .write(RemoteAddr::new(0, 0, 8), &7u64.to_le_bytes())
            .unwrap();
        assert_eq!(delayed.read_u64(RemoteAddr::new(0, 0, 8)).unwrap(), 7);
        assert_eq!(delayed.inner().node(), 0);
    }
}
