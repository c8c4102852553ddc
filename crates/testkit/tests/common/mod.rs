//! Fixtures shared by the stress tests: the same small cluster, protocol timing and delay
//! injection for every protocol, so their runs are comparable.

use std::time::Duration;

use nessie_fabric::inproc::DelayInjection;
use nessie_protocols::ProtocolConfig;
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
pub const OPS_PER_THREAD: u64 = 25_000;

/// The base workload: 4 threads × 25,000 operations on 200 keys, 60% of them on 2 hot keys,
/// half GETs, 5% DELETEs.
pub fn spec(seed: u64) -> StressSpec {
    StressSpec {
        ops_per_thread: OPS_PER_THREAD,
        keys: 200,
        hot_keys: 2,
        hot_fraction: 0.6,
        get_fraction: 0.5,
        delete_fraction: 0.05,
        value_size: (8, 48),
        seed,
        time_limit: Duration::from_secs(120),
        preload_keys: 0,
        until: None,
    }
}
