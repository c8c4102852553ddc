//! Fixtures shared by the stress tests: the same small cluster, protocol timing and delay
//! injection for every protocol, so their runs are comparable.

use nessie_fabric::mem::DelayInjection;
use nessie_protocols::ProtocolConfig;
use nessie_store::Geometry;

/// 2% of fabric operations get a random yield or a sleep of up to 20 µs.
pub fn delay(seed: u64) -> Option<DelayInjection> {
    Some(DelayInjection { seed, probability: 0.02, max_delay_ns: 20_000 })
}

pub fn geometry() -> Geometry {
    Geometry { nodes: 3, ites_per_node: 1024, dtes_per_node: 4096, key_max: 16, value_max: 48, hash_functions: 3, filter_bits: 7 }
}

pub fn cfg() -> ProtocolConfig {
    ProtocolConfig { expiry_ns: 200_000_000, clock_margin_ns: 1_000_000, cache_entries: 64, ..ProtocolConfig::default() }
}
