//! Per-endpoint operation counters: ops and bytes by kind (read / write / cas) and by locality.
//!
//! A [`StatsCell`] is written by exactly one worker thread (its endpoint) and may be read by any
//! thread at any time (per-node totals, `nessie status`, benchmarks). Single-writer counters are
//! updated with a relaxed load + store (no locked RMW on the hot path).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    Read,
    Write,
    Cas,
}

/// Where an operation went.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Locality {
    /// Through the fabric to another node: crosses the network.
    Remote,
    /// Through the fabric to the caller's own node (index entries are always accessed so).
    Loopback,
    /// Direct memory access to the caller's own node, bypassing the fabric (local DTEs).
    Direct,
}

impl OpKind {
    pub const ALL: [OpKind; 3] = [OpKind::Read, OpKind::Write, OpKind::Cas];
    fn idx(self) -> usize {
        self as usize
    }
}

impl Locality {
    pub const ALL: [Locality; 3] = [Locality::Remote, Locality::Loopback, Locality::Direct];
    fn idx(self) -> usize {
        self as usize
    }
}

const CELLS: usize = 9;

/// Live counters of one endpoint.
#[derive(Debug, Default)]
pub struct StatsCell {
    ops: [AtomicU64; CELLS],
    bytes: [AtomicU64; CELLS],
}

fn cell(kind: OpKind, loc: Locality) -> usize {
    kind.idx() * 3 + loc.idx()
}

impl StatsCell {
    /// Record one operation. Must only be called by the owning endpoint's thread.
    #[inline]
    pub fn record(&self, kind: OpKind, loc: Locality, bytes: u64) {
        let i = cell(kind, loc);
        self.ops[i].store(self.ops[i].load(Relaxed) + 1, Relaxed);
        self.bytes[i].store(self.bytes[i].load(Relaxed) + bytes, Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        let mut s = StatsSnapshot::default();
        for i in 0..CELLS {
            s.ops[i] = self.ops[i].load(Relaxed);
            s.bytes[i] = self.bytes[i].load(Relaxed);
        }
        s
    }
}

/// A point-in-time copy of counters; snapshots add (per-node totals) and subtract (deltas).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    ops: [u64; CELLS],
    bytes: [u64; CELLS],
}

impl StatsSnapshot {
    pub fn ops(&self, kind: OpKind, loc: Locality) -> u64 {
        self.ops[cell(kind, loc)]
    }
    pub fn bytes(&self, kind: OpKind, loc: Locality) -> u64 {
        self.bytes[cell(kind, loc)]
    }
    /// Operations that went through the fabric (remote + loopback).
    pub fn fabric_ops(&self) -> u64 {
        OpKind::ALL
            .iter()
            .map(|&k| self.ops(k, Locality::Remote) + self.ops(k, Locality::Loopback))
            .sum()
    }
    /// Operations that crossed to another node.
    pub fn remote_ops(&self) -> u64 {
        OpKind::ALL
            .iter()
            .map(|&k| self.ops(k, Locality::Remote))
            .sum()
    }
    /// Bytes that crossed to another node.
    pub fn remote_bytes(&self) -> u64 {
        OpKind::ALL
            .iter()
            .map(|&k| self.bytes(k, Locality::Remote))
            .sum()
    }
    /// Bytes accessed on the caller's own node (loopback and direct).
    pub fn local_bytes(&self) -> u64 {
        OpKind::ALL
            .iter()
            .map(|&k| self.bytes(k, Locality::Loopback) + self.bytes(k, Locality::Direct))
            .sum()
    }
    pub fn total_ops(&self) -> u64 {
        self.ops.iter().sum()
    }
    pub fn saturating_sub(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        let mut d = *self;
        for i in 0..CELLS {
            d.ops[i] = d.ops[i].saturating_sub(earlier.ops[i]);
            d.bytes[i] = d.bytes[i].saturating_sub(earlier.bytes[i]);
        }
        d
    }
}

impl std::ops::AddAssign for StatsSnapshot {
    fn add_assign(&mut self, o: Self) {
        for i in 0..CELLS {
            self.ops[i] += o.ops[i];
            self.bytes[i] += o.bytes[i];
        }
    }
}

impl std::fmt::Display for StatsSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for loc in Locality::ALL {
            write!(f, "{:>8}:", format!("{loc:?}").to_lowercase())?;
            for kind in OpKind::ALL {
                write!(
                    f,
                    "  {:<5} {:>10} ops {:>14} B",
                    format!("{kind:?}").to_lowercase(),
                    self.ops(kind, loc),
                    self.bytes(kind, loc)
                )?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// Registry of every endpoint's counters in a fabric, for per-node totals.
#[derive(Debug, Default)]
pub struct FabricStats {
    cells: std::sync::Mutex<Vec<(crate::NodeId, std::sync::Arc<StatsCell>)>>,
}

impl FabricStats {
    pub fn register(&self, node: crate::NodeId) -> std::sync::Arc<StatsCell> {
        let c = std::sync::Arc::new(StatsCell::default());
        self.cells.lock().unwrap().push((node, c.clone()));
        c
    }
    /// Sum of all endpoints on `node` (all nodes if `None`).
    pub fn total(&self, node: Option<crate::NodeId>) -> StatsSnapshot {
        let mut t = StatsSnapshot::default();
        for (n, c) in self.cells.lock().unwrap().iter() {
            if node.is_none_or(|x| x == *n) {
                t += c.snapshot();
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_and_aggregate() {
        let reg = FabricStats::default();
        let a = reg.register(0);
        let b = reg.register(1);
        a.record(OpKind::Read, Locality::Remote, 64);
        a.record(OpKind::Cas, Locality::Loopback, 8);
        b.record(OpKind::Write, Locality::Direct, 100);
        let n0 = reg.total(Some(0));
        assert_eq!(n0.ops(OpKind::Read, Locality::Remote), 1);
        assert_eq!(n0.remote_bytes(), 64);
        assert_eq!(n0.local_bytes(), 8);
        assert_eq!(n0.fabric_ops(), 2);
        let all = reg.total(None);
        assert_eq!(all.total_ops(), 3);
        assert_eq!(all.local_bytes(), 108);
        let d = all.saturating_sub(&n0);
        assert_eq!(d.total_ops(), 1);
        assert_eq!(d.bytes(OpKind::Write, Locality::Direct), 100);
    }
}
