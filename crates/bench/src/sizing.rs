//! How many keys a benchmark run preloads and how large its tables are (every backend's
//! runs: node processes, and the simulator).

use nessie_store::Geometry;

use crate::result::BenchParams;
use crate::workload::{Ycsb, YCSB_INSERT_ROOM};

/// Memory budget for the preloaded data when `keys` is not given.
const DEFAULT_DATA_BYTES: u64 = 128 << 20;
/// Memory for spare data table entries per node (overwrites awaiting expiry).
const HEADROOM_BYTES: u64 = 128 << 20;

/// Keys and geometry for a run.
pub fn sizing(p: &BenchParams) -> (u64, Geometry) {
    let keys = p
        .keys
        .unwrap_or_else(|| (DEFAULT_DATA_BYTES / p.mean_value_size() as u64).clamp(1_000, 200_000));
    // YCSB D inserts new keys: room for them (`YCSB_INSERT_ROOM`).
    let inserting = p.workload.as_deref().and_then(|w| w.parse::<Ycsb>().ok()) == Some(Ycsb::D);
    let room = if inserting { YCSB_INSERT_ROOM } else { 1 };
    let per_node = (keys * room).div_ceil(p.nodes as u64);
    // Coupled placement (sd, hy) puts a key's candidates on one node: allow for imbalance.
    let ites = ((per_node as f64 / p.load_factor) * 1.1).ceil() as u64 + 64;
    // Every node holds its share plus room for overwrites awaiting expiry (200 ms of PUTs):
    // headroom sized by bytes, so large values do not allocate gigabytes of spare entries.
    let entry = nessie_store::DteLayout::new(p.key_size, p.value_size).entry_size;
    let headroom = (HEADROOM_BYTES / entry).clamp(1024, 8192);
    let dtes = (per_node as f64 * 1.3) as u64 + headroom;
    let g = Geometry {
        nodes: p.nodes as u32,
        ites_per_node: ites,
        dtes_per_node: dtes,
        key_max: p.key_size,
        value_max: p.value_size,
        ..Geometry::default()
    };
    (keys, g)
}
