//! The benchmark's parameters and its JSON result, one object per run. Field names are stable:
//! later tools read them. Parameters are named after their `nessie bench` flags (`-` as `_`).

use std::collections::BTreeMap;

use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchParams {
    /// cd | sd | hy
    pub mode: String,
    pub nodes: u16,
    /// Client worker threads per node.
    pub client_threads: u16,
    /// Server worker threads per node (sd and hy only).
    pub server_threads: u16,
    /// shm | tcp
    pub transport: String,
    pub key_size: u32,
    /// Value size in bytes; with `value_size_min`, the largest value.
    pub value_size: u32,
    /// Values of varying size: each PUT's size is uniform in `value_size_min..=value_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_size_min: Option<u32>,
    /// Fraction of GETs; the rest are PUTs.
    pub get_ratio: f64,
    /// uniform | zipf:THETA
    pub dist: String,
    /// Keys in the key space (all preloaded); derived from `load_factor` if absent.
    pub keys: Option<u64>,
    /// Index load factor the key count and index size are derived from.
    pub load_factor: f64,
    /// Measured window, seconds.
    pub duration: f64,
    /// Warm-up before the measured window, seconds.
    pub warmup: f64,
    /// CPU-hog processes running during the run (unpinned).
    pub background: u16,
    /// Open loop at this fraction of the closed-loop maximum throughput (Poisson arrivals);
    /// `None` = closed loop.
    pub target_load: Option<f64>,
    /// Pin client and server threads to cores (round robin).
    pub pin: bool,
    pub filter_bits: bool,
    pub cache: bool,
    pub previous_versions: bool,
    pub multi_read: bool,
    pub seed: u64,
    /// Copies of every node's tables (cd only; more than 1 runs a local etcd for membership).
    #[serde(default = "one_copy")]
    pub replicas: u8,
    /// A YCSB core workload (`ycsb-a`, `-b`, `-c`, `-d`, `-f`): it sets the operation mix and
    /// the key distribution, overriding `get_ratio` and `dist`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// The eviction policy (cd; Redis's names): its LRU and LFU policies make GETs keep
    /// entries' access words, which is what a run with it measures.
    #[serde(default = "no_eviction")]
    pub eviction: String,
    /// Operations each client thread keeps in flight (`nessie_inflight::Pipeline`; 1: the
    /// blocking client, one at a time).
    #[serde(default = "one_in_flight")]
    pub inflight: u16,
}

/// Most operations one client thread keeps in flight (`inflight`), in a run or a simulation.
pub const MAX_INFLIGHT: u16 = nessie_inflight::MAX_SLOTS as u16;

fn one_in_flight() -> u16 {
    1
}

fn one_copy() -> u8 {
    1
}

fn no_eviction() -> String {
    nessie_protocols::Eviction::NoEviction.name().to_string()
}

impl Default for BenchParams {
    fn default() -> Self {
        Self {
            mode: "cd".into(),
            nodes: 3,
            client_threads: 2,
            server_threads: 1,
            transport: "shm".into(),
            key_size: 128,
            value_size: 16384,
            value_size_min: None,
            get_ratio: 0.9,
            dist: "uniform".into(),
            keys: None,
            load_factor: 0.4,
            duration: 5.0,
            warmup: 1.0,
            background: 0,
            target_load: None,
            pin: false,
            filter_bits: true,
            cache: true,
            previous_versions: true,
            multi_read: true,
            seed: 1,
            replicas: 1,
            workload: None,
            eviction: no_eviction(),
            inflight: 1,
        }
    }
}

impl BenchParams {
    /// Smallest and largest value size.
    pub fn value_sizes(&self) -> (u32, u32) {
        (
            self.value_size_min.unwrap_or(self.value_size),
            self.value_size,
        )
    }

    /// Mean value size of the PUTs (and of the preloaded values).
    pub fn mean_value_size(&self) -> f64 {
        let (lo, hi) = self.value_sizes();
        (f64::from(lo) + f64::from(hi)) / 2.0
    }

    /// The value size as `nessie bench --value-size` takes it: `N` or `MIN..MAX`.
    pub fn value_size_label(&self) -> String {
        match self.value_size_min {
            Some(lo) => format!("{lo}..{}", self.value_size),
            None => self.value_size.to_string(),
        }
    }
}

/// Why a `--value-size` does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueSizeError {
    #[error("{0}")]
    Bytes(#[from] nessie_store::geometry::ByteCountError),
    #[error("{0}: more than 4 GiB - 1")]
    TooLarge(String),
    #[error("{0:?}: the smallest size exceeds the largest")]
    Reversed(String),
}

/// Parse `--value-size`: `N` bytes, or `MIN..MAX` for sizes uniform in that range (inclusive);
/// each a byte count with an optional unit ([`nessie_store::geometry::parse_bytes`]: `4K`).
pub fn parse_value_size(s: &str) -> Result<(Option<u32>, u32), ValueSizeError> {
    let num = |t: &str| {
        let n = nessie_store::geometry::parse_bytes(t)?;
        u32::try_from(n).map_err(|_| ValueSizeError::TooLarge(t.trim().into()))
    };
    match s.split_once("..") {
        None => Ok((None, num(s)?)),
        Some((lo, hi)) => {
            let (lo, hi) = (num(lo)?, num(hi.strip_prefix('=').unwrap_or(hi))?);
            if lo > hi {
                return Err(ValueSizeError::Reversed(s.into()));
            }
            Ok((Some(lo), hi))
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PerKind<T> {
    pub get: T,
    pub put: T,
    pub all: T,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LatencySummary {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
}

impl LatencySummary {
    /// Mean and percentiles in µs of a histogram of nanoseconds (zeros when it is empty).
    pub fn of(h: &hdrhistogram::Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            mean: h.mean() / 1e3,
            p50: h.value_at_quantile(0.5) as f64 / 1e3,
            p99: h.value_at_quantile(0.99) as f64 / 1e3,
            p999: h.value_at_quantile(0.999) as f64 / 1e3,
        }
    }
}

/// Fabric work per operation: means and histograms (fabric ops per operation → count; bytes per
/// operation, bucketed to the next power of two → count).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FabricPerOp {
    pub ops_mean: f64,
    pub bytes_mean: f64,
    pub ops_hist: BTreeMap<u64, u64>,
    pub bytes_hist: BTreeMap<u64, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FabricSummary {
    pub get: FabricPerOp,
    pub put: FabricPerOp,
    pub all: FabricPerOp,
    /// Fabric operations (remote and loopback) in the measured window.
    pub total_ops: u64,
    /// Bytes that crossed between nodes in the measured window.
    pub total_bytes: u64,
    /// Bytes accessed on the client's own node (loopback and direct) in the measured window.
    pub local_bytes: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CpuSeconds {
    pub client: f64,
    pub server: f64,
    pub progress: f64,
    pub total: f64,
    /// Of `client` (and `total`): open-loop client threads waiting for their next arrival, the
    /// load generator's cost (0 in a closed loop). `total - pacing` is the store's.
    #[serde(default)]
    pub pacing: f64,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BenchResult {
    pub mode: String,
    pub params: BenchParams,
    /// Successful operations in the measured window.
    pub ops: PerKind<u64>,
    pub ops_per_sec: f64,
    /// Successful operations × value size / second.
    pub goodput_bytes_per_sec: f64,
    pub latency_us: PerKind<LatencySummary>,
    pub fabric: FabricSummary,
    /// Attempts aborted by concurrent operations or timeouts.
    pub aborts: u64,
    /// Retries performed by client retry loops.
    pub retries: u64,
    /// CPU time of the node processes' threads in the measured window, from the OS.
    pub cpu_seconds: CpuSeconds,
    /// Operations that failed (after retries) in the measured window.
    pub errors: u64,
    /// `errors` by kind (`agent::error_kind`): unreachable, fenced, timeout, contended,
    /// indeterminate, no_copy, transport, fabric, data_table_full, index_full, other.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub error_kinds: BTreeMap<String, u64>,
    /// The offered load in operations per second (open loop only).
    pub offered_ops_per_sec: Option<f64>,
    /// Operations and GET latency by 100 ms window of the measured window (node runs; empty
    /// from the simulator).
    #[serde(default, skip_serializing_if = "crate::timeline::Timeline::is_empty")]
    pub timeline: crate::timeline::Timeline,
    /// The node killed during the run, and the stall it caused (`--kill-node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<crate::timeline::FaultReport>,
    /// Nodes that left during the run, and what the timeline shows of it (`--scale-to`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<crate::scale::ScalingReport>,
}

/// Largest histogram value: one hour, in nanoseconds.
pub const MAX_LATENCY_NS: u64 = 3_600_000_000_000;
/// Significant decimal digits the latency histograms keep.
const LATENCY_SIGFIG: u8 = 3;

/// An empty latency histogram (1 ns up to [`MAX_LATENCY_NS`]); every latency histogram of the
/// benchmarks is made here so they can be merged.
pub fn new_hist() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, MAX_LATENCY_NS, LATENCY_SIGFIG)
        .expect("valid bounds")
}

pub fn encode_hist(h: &Histogram<u64>) -> String {
    let mut buf = Vec::new();
    V2Serializer::new()
        .serialize(h, &mut buf)
        .expect("histogram serialises");
    hex::encode(buf)
}

/// Why a latency histogram in an agent's report cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum HistogramError {
    #[error("histogram is not hex: {0}")]
    NotHex(#[from] hex::FromHexError),
    #[error("bad histogram: {0}")]
    Bad(#[from] hdrhistogram::serialization::DeserializeError),
    #[error("merging latency histograms: {0}")]
    Merge(#[from] hdrhistogram::AdditionError),
}

pub fn decode_hist(s: &str) -> Result<Histogram<u64>, HistogramError> {
    let bytes = hex::decode(s)?;
    Ok(Deserializer::new().deserialize(&mut &bytes[..])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_sizes_parse_as_a_number_or_a_range() {
        assert_eq!(parse_value_size("16384"), Ok((None, 16384)));
        assert_eq!(parse_value_size("64..4096"), Ok((Some(64), 4096)));
        assert_eq!(parse_value_size("64..=4096"), Ok((Some(64), 4096)));
        assert!(parse_value_size("4096..64")
            .unwrap_err()
            .to_string()
            .contains("exceeds"));
        assert!(parse_value_size("a..64")
            .unwrap_err()
            .to_string()
            .contains("byte count"));
        assert_eq!(parse_value_size("64..4K"), Ok((Some(64), 4096)));
        assert_eq!(parse_value_size("1KiB"), Ok((None, 1024)));
        assert!(parse_value_size("4G")
            .unwrap_err()
            .to_string()
            .contains("more than 4 GiB"));
        assert!(parse_value_size("12Q")
            .unwrap_err()
            .to_string()
            .starts_with("12Q: unknown unit"));
        assert!(parse_value_size("").is_err());
        let p = BenchParams {
            value_size_min: Some(64),
            value_size: 4096,
            ..BenchParams::default()
        };
        assert_eq!(p.value_sizes(), (64, 4096));
        assert_eq!(p.mean_value_size(), 2080.0);
        assert_eq!(p.value_size_label(), "64..4096");
    }

    #[test]
    fn results_without_a_size_range_still_load() {
        let p = BenchParams::default();
        let json = serde_json::to_string(&p).unwrap();
        assert!(
            !json.contains("value_size_min"),
            "fixed sizes keep the old JSON"
        );
        let back: BenchParams = serde_json::from_str(&json).unwrap();
        assert_eq!(back, p);
    }
}
