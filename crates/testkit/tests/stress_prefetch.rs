//! Concurrency stress of GETs after prefetches (`crates/protocols/src/cd/prefetch.rs`): every
//! GET first reads ahead its key and the last keys its client read, over a fabric whose
//! batches overlap, while writers overwrite and recycle entries in tiny data tables with a
//! short expiry period. One client stalls past the expiry period between its prefetch's ITE
//! and entry READs, and between a prefetch and the GET that uses it: a copy read ahead must
//! never answer for an entry reused since. Every history is checked for linearizability, over
//! the race variants (small index, each optimisation off).

mod common;
use common::{cfg, spec, variants};

use std::collections::VecDeque;
use std::time::Duration;

use nessie_cluster::LocalEndpoint;
use nessie_protocols::cd::CdClient;
use nessie_protocols::{Error, HookPoint, KvClient, Optimizations, ProtocolConfig};
use nessie_store::Geometry;
use nessie_testkit::assertions::{assert_clean_run, MIN_OPS};
use nessie_testkit::stress::{self, StressSpec};

const THREADS_NODES: [u16; 4] = [0, 1, 2, 0];

/// Keys a client reads ahead besides the one it is about to GET.
const RECENT: usize = 3;

/// A CD client that prefetches before every GET.
struct Prefetching {
    inner: CdClient<LocalEndpoint>,
    recent: VecDeque<Vec<u8>>,
}

impl KvClient for Prefetching {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let mut keys: Vec<&[u8]> = vec![key];
        keys.extend(self.recent.iter().map(|k| k.as_slice()));
        self.inner.prefetch(&keys);
        let r = self.inner.get(key);
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(key.to_vec());
        r
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.inner.put(key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        self.inner.delete(key)
    }
}

fn run(name: &str, seed: u64, g: Geometry, o: Optimizations) {
    let base = ProtocolConfig {
        optimizations: o,
        ..cfg()
    };
    let (c, cfg) = common::recycling(seed, g, base);
    c.fabric().set_batches_overlap(true);
    let mut cs: Vec<Prefetching> = THREADS_NODES
        .iter()
        .map(|&n| Prefetching {
            inner: c.client_with(n, cfg.clone()).unwrap(),
            recent: VecDeque::new(),
        })
        .collect();
    let stall = Duration::from_nanos(cfg.expiry_ns + 2_000_000);
    let mut n = 0u64;
    cs[1].inner.set_hook(Some(Box::new(move |p| {
        if matches!(
            p,
            HookPoint::PrefetchBeforeEntryReads | HookPoint::GetForwardPass
        ) {
            n += 1;
            if n.is_multiple_of(101) {
                std::thread::sleep(stall);
            }
        }
    })));
    let s = StressSpec {
        keys: 40,
        get_fraction: 0.6,
        ops_per_thread: MIN_OPS / THREADS_NODES.len() as u64,
        ..spec(seed)
    };
    let (out, cs) = stress::run(cs, &s);
    let hits: u64 = cs.iter().map(|c| c.inner.prefetch_stats().hits).sum();
    eprintln!("{out}\nprefetch hits {hits}");
    assert_clean_run(name, &out, MIN_OPS);
    if o.cache {
        assert!(
            hits > 1_000,
            "{name}: GETs took {hits} entries from prefetches"
        );
    } else {
        assert_eq!(
            hits, 0,
            "{name}: no prefetch without the cache optimisation"
        );
    }
}

#[test]
fn gets_after_prefetches_stay_linearizable_through_stalls_and_recycling() {
    for (i, (name, g, o)) in variants().into_iter().enumerate() {
        eprintln!("variant: {name}");
        run(name, 40 + i as u64, g, o);
    }
}
