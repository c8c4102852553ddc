//! The operations of a node's clients (its front ends and its admin socket), counted for its
//! Prometheus metrics: every call through a [`Metered`] client counts by kind and result and
//! times into a histogram of an [`OpMetrics`], which [`OpMetrics::register`] adds to a
//! registry (the node's collector and its `/metrics` server are `nessie_cluster::metrics`).

use std::sync::Arc;
use std::time::Instant;

use nessie_protocols::{Cond, CondOutcome, Error, KvClient, Version};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Latency buckets: 1 µs doubling to about 0.5 s (20 buckets).
const LATENCY_BUCKETS: (f64, f64, u16) = (1e-6, 2.0, 20);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    kind: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// The operation kinds and results counted (every pair is created up front, so that each
/// operation only bumps a counter it already holds: no lookup, no lock).
const KINDS: [&str; 6] = ["get", "put", "delete", "put_if", "delete_if", "scan"];
const RESULTS: [&str; 7] = [
    "ok",
    "miss",
    "unmet",
    "refused",
    "full",
    "unsupported",
    "error",
];

/// An operation kind: its index in `KINDS`.
#[derive(Copy, Clone)]
enum Kind {
    Get,
    Put,
    Delete,
    PutIf,
    DeleteIf,
    Scan,
}

/// An operation result: its index in `RESULTS`.
#[derive(Copy, Clone)]
enum Res {
    Ok,
    Miss,
    Unmet,
    Refused,
    Full,
    Unsupported,
    Error,
}

/// Operations of a node's clients, by kind and result, with their latencies.
#[derive(Debug)]
pub struct OpMetrics {
    ops: Family<OpLabels, Counter>,
    latency: Family<KindLabel, Histogram>,
    /// `ops` and `latency`'s members, by index in `KINDS` and `RESULTS`.
    counters: Vec<Vec<Counter>>,
    histograms: Vec<Histogram>,
}

fn latency_histogram() -> Histogram {
    let (start, factor, n) = LATENCY_BUCKETS;
    Histogram::new(exponential_buckets(start, factor, n))
}

impl Default for OpMetrics {
    fn default() -> Self {
        let ops: Family<OpLabels, Counter> = Family::default();
        let latency: Family<KindLabel, Histogram> = Family::new_with_constructor(latency_histogram);
        let counters = KINDS
            .iter()
            .map(|&kind| {
                RESULTS
                    .iter()
                    .map(|&result| ops.get_or_create(&OpLabels { kind, result }).clone())
                    .collect()
            })
            .collect();
        let histograms = KINDS
            .iter()
            .map(|&kind| latency.get_or_create(&KindLabel { kind }).clone())
            .collect();
        Self {
            ops,
            latency,
            counters,
            histograms,
        }
    }
}

impl OpMetrics {
    /// Register the operation counters and latencies in `r`.
    pub fn register(&self, r: &mut Registry) {
        let help =
            "Operations of this node's clients (front ends, admin socket), by kind and result";
        r.register("operations", help, self.ops.clone());
        let help = "Latency of this node's client operations, by kind";
        r.register_with_unit(
            "operation_duration",
            help,
            prometheus_client::registry::Unit::Seconds,
            self.latency.clone(),
        );
    }

    fn record(&self, kind: Kind, result: Res, started: Instant) {
        self.counters[kind as usize][result as usize].inc();
        self.histograms[kind as usize].observe(started.elapsed().as_secs_f64());
    }
}

/// What an error counts as.
fn error_result(e: &Error) -> Res {
    match e {
        Error::EmptyKey
        | Error::KeyTooLarge { .. }
        | Error::ValueTooLarge { .. }
        | Error::ItemTooLarge { .. }
        | Error::KeyReserved { .. } => Res::Refused,
        Error::DataTableFull { .. } | Error::IndexFull { .. } => Res::Full,
        Error::Unsupported(_) => Res::Unsupported,
        _ => Res::Error,
    }
}

fn cond_result(r: &Result<CondOutcome, Error>) -> Res {
    match r {
        Ok(CondOutcome::Stored) => Res::Ok,
        Ok(CondOutcome::Unmet { .. }) => Res::Unmet,
        Err(e) => error_result(e),
    }
}

/// A client whose every operation is counted and timed in an [`OpMetrics`].
pub struct Metered<C> {
    pub inner: C,
    pub metrics: Arc<OpMetrics>,
}

impl<C: KvClient> Metered<C> {
    fn timed<T>(
        &mut self,
        kind: Kind,
        result: impl Fn(&Result<T, Error>) -> Res,
        op: impl FnOnce(&mut C) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let started = Instant::now();
        let r = op(&mut self.inner);
        self.metrics.record(kind, result(&r), started);
        r
    }
}

fn found<T>(r: &Result<Option<T>, Error>) -> Res {
    match r {
        Ok(Some(_)) => Res::Ok,
        Ok(None) => Res::Miss,
        Err(e) => error_result(e),
    }
}

fn done<T>(r: &Result<T, Error>) -> Res {
    r.as_ref().map_or_else(error_result, |_| Res::Ok)
}

impl<C: KvClient> KvClient for Metered<C> {
    fn prefetch(&mut self, keys: &[&[u8]]) {
        self.inner.prefetch(keys)
    }
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.timed(Kind::Get, found, |c| c.get(key))
    }
    fn get_into(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool, Error> {
        let r = |r: &Result<bool, Error>| match r {
            Ok(true) => Res::Ok,
            Ok(false) => Res::Miss,
            Err(e) => error_result(e),
        };
        self.timed(Kind::Get, r, |c| c.get_into(key, out))
    }
    fn get_into_at(&mut self, key: &[u8], out: &mut Vec<u8>, at: usize) -> Result<bool, Error> {
        let r = |r: &Result<bool, Error>| match r {
            Ok(true) => Res::Ok,
            Ok(false) => Res::Miss,
            Err(e) => error_result(e),
        };
        self.timed(Kind::Get, r, |c| c.get_into_at(key, out, at))
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.timed(Kind::Put, done, |c| c.put(key, value))
    }
    fn put_parts(&mut self, key: &[u8], parts: &[&[u8]]) -> Result<(), Error> {
        self.timed(Kind::Put, done, |c| c.put_parts(key, parts))
    }
    fn put_parts_expiring(&mut self, key: &[u8], parts: &[&[u8]], at: u64) -> Result<(), Error> {
        self.timed(Kind::Put, done, |c| c.put_parts_expiring(key, parts, at))
    }
    fn put_if_expiring(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: Cond,
        at: u64,
    ) -> Result<CondOutcome, Error> {
        self.timed(Kind::PutIf, cond_result, |c| {
            c.put_if_expiring(key, value, cond, at)
        })
    }
    fn reclaim_expired_in(
        &mut self,
        slots: std::ops::Range<u64>,
    ) -> Result<Option<nessie_protocols::Reclaimed>, Error> {
        self.inner.reclaim_expired_in(slots)
    }
    fn reclaim_expired_in_noting(
        &mut self,
        slots: std::ops::Range<u64>,
        note: &mut dyn FnMut(&nessie_protocols::ScanNote),
    ) -> Result<Option<nessie_protocols::Reclaimed>, Error> {
        self.inner.reclaim_expired_in_noting(slots, note)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        self.timed(Kind::Delete, done, |c| c.delete(key))
    }
    fn get_versioned(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Version>, Error> {
        self.timed(Kind::Get, found, |c| c.get_versioned(key, out))
    }
    fn get_versioned_head(
        &mut self,
        key: &[u8],
        out: &mut Vec<u8>,
        head: usize,
    ) -> Result<Option<Version>, Error> {
        self.timed(Kind::Get, found, |c| c.get_versioned_head(key, out, head))
    }
    fn put_if(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        self.timed(Kind::PutIf, cond_result, |c| c.put_if(key, value, cond))
    }
    fn delete_if(&mut self, key: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        self.timed(Kind::DeleteIf, cond_result, |c| c.delete_if(key, cond))
    }
    fn scan_keys(&mut self) -> Result<Vec<Vec<u8>>, Error> {
        self.timed(Kind::Scan, done, |c| c.scan_keys())
    }
    fn scan_keys_in(&mut self, slots: std::ops::Range<u64>) -> Result<Vec<Vec<u8>>, Error> {
        self.timed(Kind::Scan, done, |c| c.scan_keys_in(slots))
    }
    fn evicted(&self) -> &[Vec<u8>] {
        self.inner.evicted()
    }
    fn evicted_unsure(&self) -> &[Vec<u8>] {
        self.inner.evicted_unsure()
    }
    fn aborts_retries(&self) -> (u64, u64) {
        self.inner.aborts_retries()
    }
}
