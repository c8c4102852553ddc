//! Delay injection for any backend: [`Delayed`] wraps an endpoint and adds seeded random yields
//! and sleeps before and after every operation (see [`DelayInjection`]), so race windows can be
//! widened on a real multi-process fabric as well as in process.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::mem::DelayInjection;
use crate::{Endpoint, FabricError, NodeId, RegionId, RemoteAddr, StatsCell};

pub struct Delayed<E> {
    inner: E,
    cfg: DelayInjection,
    rng: SmallRng,
}

impl<E: Endpoint> Delayed<E> {
    /// `stream` distinguishes endpoints sharing one seed.
    pub fn new(inner: E, cfg: DelayInjection, stream: u64) -> Self {
        let rng = SmallRng::seed_from_u64(cfg.seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Self { inner, cfg, rng }
    }

    pub fn inner(&self) -> &E {
        &self.inner
    }

    fn delay(&mut self) {
        if self.cfg.probability > 0.0 && self.rng.gen_bool(self.cfg.probability) {
            if self.cfg.max_delay_ns == 0 || self.rng.gen_bool(0.5) {
                std::thread::yield_now();
            } else {
                let ns = self.rng.gen_range(0..=self.cfg.max_delay_ns);
                crate::precise_sleep_ns(ns);
            }
        }
    }

    fn around<T>(&mut self, f: impl FnOnce(&mut E) -> T) -> T {
        self.delay();
        let r = f(&mut self.inner);
        self.delay();
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
    fn sleep_ns(&mut self, ns: u64) {
        self.inner.sleep_ns(ns)
    }
    fn stats(&self) -> &StatsCell {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemFabric;

    #[test]
    fn wrapper_is_transparent_and_delays() {
        let f = MemFabric::new(&[vec![64]], None).unwrap();
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
}
