//! How many keys a benchmark run preloads and how large its tables are (every backend's
//! runs: node processes, and the simulator).

use nessie_store::Geometry;

use crate::result::BenchParams;
use crate::workload::{Ycsb, YCSB_INSERT_ROOM};

/// Memory budget for the preloaded data when `keys` is not given.
const DEFAULT_DATA_BYTES: u64 = 128 << 20;
/// Memory for spare data table entries per node (overwrites awaiting expiry).
const HEADROOM_BYTES: u64 = 128 << 20;

/// Most spare entries per node in real time: 200 ms of 1.3 M PUTs a second, more than a node of
/// this machine writes. The bound was 8,192, which held a node to 41,000 small PUTs a second
/// (every PUT beyond waited for an entry to expire).
pub const HEADROOM_MAX_ENTRIES: u64 = 1 << 18;
/// The bound the simulator keeps: it sizes room for every PUT of a run itself, and its
/// published sweeps were sized so.
pub const SIM_HEADROOM_MAX_ENTRIES: u64 = 8192;

/// Keys and geometry for a run in real time.
pub fn sizing(p: &BenchParams) -> (u64, Geometry) {
    sizing_with_headroom(p, HEADROOM_MAX_ENTRIES)
}

/// Keys and geometry for a run, with at most `headroom_max` spare entries per node.
pub fn sizing_with_headroom(p: &BenchParams, headroom_max: u64) -> (u64, Geometry) {
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
    let headroom = (HEADROOM_BYTES / entry).clamp(1024, headroom_max);
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
