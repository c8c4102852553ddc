//! Delay injection for any backend: [`Delayed`] wraps an endpoint and adds seeded random yields
//! and sleeps before and after every operation (see [`DelayInjection`]), so race windows can be
//! widened on a real multi-process fabric as well as in process. The in-process fabric
//! (`crate::mem`) injects through the same [`Injector`].

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::{Batch, ConfigError, Endpoint, FabricError, RegionId, RemoteAddr};

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
    fn local_write(
        &mut self,
        region: RegionId,
        offset: u64,
        buf: &[u8],
    ) -> Result<(), FabricError> {
        self.around(|e| e.local_write(region, offset, buf))
    }
    /// The delays around the whole batch, which the wrapped endpoint runs as it runs any
    /// (natively where it can): a batch is one injection point, as one operation is.
    fn run_batch(&mut self, batch: &mut Batch<'_>) {
        self.around(|e| e.run_batch(batch))
    }
    crate::forward_endpoint!(field inner: overlaps_batches);
    crate::forward_endpoint!(field inner);
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

impl<E: Endpoint> Endpoint for MaybeDelayed<E> {
    crate::forward_endpoint!(match MaybeDelayed { Direct, Delayed }:
        read, write, compare_and_swap, local_read, local_write, run_batch, overlaps_batches);
    crate::forward_endpoint!(match MaybeDelayed { Direct, Delayed });
}

/// Posted operations run at once, with their delays: a delayed run is a race test, where the
/// delays matter and overlap does not.
impl<E: Endpoint> crate::Post for Delayed<E> {}

/// Without delays, operations are posted on the wrapped endpoint (overlapping where it can);
/// with them, they run at once ([`Delayed`]'s `Post`).
impl<E: crate::Post> crate::Post for MaybeDelayed<E> {
    unsafe fn post(
        &mut self,
        op: &mut crate::BatchOp<'_>,
        token: crate::PostToken,
    ) -> Option<crate::PostResult> {
        match self {
            // SAFETY: the caller's contract, passed on.
            MaybeDelayed::Direct(e) => unsafe { e.post(op, token) },
            MaybeDelayed::Delayed(d) => unsafe { d.post(op, token) },
        }
    }

    fn poll_posted(&mut self, done: &mut dyn FnMut(crate::PostToken, crate::PostResult)) -> usize {
        match self {
            MaybeDelayed::Direct(e) => e.poll_posted(done),
            MaybeDelayed::Delayed(d) => d.poll_posted(done),
        }
    }

    fn posted_in_flight(&self) -> usize {
        match self {
            MaybeDelayed::Direct(e) => e.posted_in_flight(),
            MaybeDelayed::Delayed(d) => d.posted_in_flight(),
        }
    }

    fn posted_idle(&mut self) {
        match self {
            MaybeDelayed::Direct(e) => e.posted_idle(),
            MaybeDelayed::Delayed(d) => d.posted_idle(),
        }
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
