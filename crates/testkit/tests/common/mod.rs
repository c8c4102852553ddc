//! Fixtures shared by the stress tests: the same small cluster, protocol timing and delay
//! injection for every protocol, so their runs are comparable.

use std::time::Duration;

use nessie_cluster::LocalCluster;
use nessie_fabric::inproc::DelayInjection;
use nessie_protocols::{Optimizations, ProtocolConfig};
use nessie_store::Geometry;
use nessie_testkit::stress::StressSpec;

/// 2% of fabric operations get a random yield or a sleep of up to 20 µs.
pub fn delay(seed: u64) -> Option<DelayInjection> {
    Some(DelayInjection {
        seed,
        probability: 0.02,
        max_delay_ns: 20_000,
    })
}

pub fn geometry() -> Geometry {
    Geometry {
        nodes: 3,
        ites_per_node: 1024,
        dtes_per_node: 4096,
        key_max: 16,
        value_max: 48,
        hash_functions: 3,
        filter_bits: 7,
    }
}

pub fn cfg() -> ProtocolConfig {
    ProtocolConfig {
        expiry_ns: 200_000_000,
        clock_margin_ns: 1_000_000,
        cache_entries: 64,
        // Every remote GET splits its read, as before whole reads of small entries existed, so
        // the stalls between a DTE's header and its value keep their window; the mixed-size
        // runs use the default.
        whole_read_max: 0,
        ..ProtocolConfig::default()
    }
}

/// Each stress thread's operations.
#[allow(dead_code)] // not every stress binary runs the base workload
pub const OPS_PER_THREAD: u64 = 25_000;

/// The base workload: 4 threads × 25,000 operations on 200 keys, 60% of them on 2 hot keys,
/// half GETs, 5% DELETEs.
#[allow(dead_code)]
pub fn spec(seed: u64) -> StressSpec {
    StressSpec {
        ops_per_thread: OPS_PER_THREAD,
        keys: 200,
        hot_keys: 2,
        hot_fraction: 0.6,
        get_fraction: 0.5,
        delete_fraction: 0.05,
        value_size: (8, 48),
        sizes_by_key: false,
        seed,
        time_limit: Duration::from_secs(120),
        preload_keys: 0,
        until: None,
        ttl: None,
        size_shift: None,
    }
}

/// A small index: the 40 keys of the stall and abandon scenarios in 72 slots, so that keys sit
/// in every candidate, not just the first (the large index of the other runs puts nearly every
/// key in its first candidate, where two lost-update bugs could not be reached).
#[allow(dead_code)] // not every stress binary runs the race variants
pub fn small_index() -> Geometry {
    Geometry {
        ites_per_node: 24,
        ..geometry()
    }
}

/// The race scenarios below run over each of these: every optimisation on with a large and a
/// small index, then on the small index with each optimisation off in turn, and all off.
#[allow(dead_code)]
pub fn variants() -> Vec<(&'static str, Geometry, Optimizations)> {
    let all = Optimizations::default();
    let mut v = vec![
        ("large index", geometry(), all),
        ("small index", small_index(), all),
    ];
    type Switch = (&'static str, fn(&mut Optimizations));
    let off: [Switch; 5] = [
        ("small index, no filter bits", |o| o.filter_bits = false),
        ("small index, no cache", |o| o.cache = false),
        ("small index, no previous versions", |o| {
            o.previous_versions = false
        }),
        ("small index, no multi-read", |o| o.multi_read = false),
        ("small index, all off", |o| *o = Optimizations::NONE),
    ];
    for (name, f) in off {
        let mut o = all;
        f(&mut o);
        v.push((name, small_index(), o));
    }
    v
}

/// A recycling cluster of geometry `g`, with delays injected from `seed`: a data table of 96
/// entries per node and a 5 ms expiry period (no clock margin) over `base`, so that entries
/// are reused all through a run.
#[allow(dead_code)] // not every stress binary recycles
pub fn recycling(seed: u64, g: Geometry, base: ProtocolConfig) -> (LocalCluster, ProtocolConfig) {
    let g = Geometry {
        dtes_per_node: 96,
        ..g
    };
    let cfg = ProtocolConfig {
        expiry_ns: 5_000_000,
        clock_margin_ns: 0,
        ..base
    };
    (LocalCluster::new(g, cfg.clone(), delay(seed)).unwrap(), cfg)
}
