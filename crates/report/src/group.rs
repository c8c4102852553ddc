//! Results grouped the way a preset's figures show them (panel → line → x), averaged per point,
//! and the shared setup line of a figure's subtitle.

use std::collections::BTreeMap;
use std::fmt;

use nessie_bench::result::BenchResult;

use crate::plot::{self, Series};
use crate::preset::{classify, Preset, MODES_ALL, OPTIMIZATION_STEPS};

/// Results of a preset grouped for plotting: group → series → x → values (repeated runs of one
/// point are averaged).
pub(crate) type Grouped<'r> =
    BTreeMap<String, BTreeMap<String, BTreeMap<OrdF64, Vec<&'r BenchResult>>>>;

#[derive(Clone, Copy, Debug)]
pub(crate) struct OrdF64(pub f64);
impl PartialEq for OrdF64 {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

pub(crate) fn group_results(preset: Preset, results: &[BenchResult]) -> Grouped<'_> {
    let mut grouped: Grouped<'_> = BTreeMap::new();
    for r in results {
        if let Some(point) = classify(preset, &r.params) {
            grouped
                .entry(point.group)
                .or_default()
                .entry(point.series)
                .or_default()
                .entry(OrdF64(point.x))
                .or_default()
                .push(r);
        }
    }
    grouped
}

/// Mean of `metric` over the runs of one point (`None` when no run has the metric).
pub(crate) fn mean(
    runs: &[&BenchResult],
    metric: &dyn Fn(&BenchResult) -> Option<f64>,
) -> Option<f64> {
    let values: Vec<f64> = runs
        .iter()
        .filter_map(|r| metric(r))
        .filter(|v| v.is_finite())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Series of one group, ordered cd, sd, hy, then others.
pub(crate) fn series_of(
    group: &BTreeMap<String, BTreeMap<OrdF64, Vec<&BenchResult>>>,
    metric: &dyn Fn(&BenchResult) -> Option<f64>,
) -> Vec<Series> {
    let mut names: Vec<&String> = group.keys().collect();
    // Modes in their usual order, optimisation steps in the order they are switched on.
    names.sort_by_key(|n| {
        (
            MODES_ALL
                .iter()
                .position(|m| m == n)
                .unwrap_or(MODES_ALL.len()),
            OPTIMIZATION_STEPS
                .iter()
                .position(|s| s.0 == n.as_str())
                .unwrap_or(OPTIMIZATION_STEPS.len()),
            n.to_string(),
        )
    });
    names
        .into_iter()
        .map(|name| Series {
            name: name.clone(),
            points: group[name]
                .iter()
                .filter_map(|(x, runs)| mean(runs, metric).map(|y| (x.0, y)))
                .collect(),
        })
        .collect()
}

/// Parameter values shared by the results (or their range), for figure subtitles.
pub(crate) fn describe_setup(results: &[&BenchResult]) -> String {
    fn distinct<T: PartialEq + Clone>(values: impl Iterator<Item = T>) -> Vec<T> {
        let mut out: Vec<T> = Vec::new();
        for v in values {
            if !out.contains(&v) {
                out.push(v);
            }
        }
        out
    }
    fn one_or_mixed<T: fmt::Display + PartialEq + Clone>(values: Vec<T>) -> String {
        match values.as_slice() {
            [one] => one.to_string(),
            _ => values
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("/"),
        }
    }
    let nodes = one_or_mixed(distinct(results.iter().map(|r| r.params.nodes)));
    let clients = one_or_mixed(distinct(results.iter().map(|r| r.params.client_threads)));
    let servers = one_or_mixed(distinct(
        results
            .iter()
            .filter(|r| r.params.mode != "cd")
            .map(|r| r.params.server_threads),
    ));
    let transport = one_or_mixed(distinct(results.iter().map(|r| r.params.transport.clone())));
    let duration = one_or_mixed(distinct(
        results
            .iter()
            .map(|r| plot::format_number(r.params.duration)),
    ));
    let warmup = one_or_mixed(distinct(
        results.iter().map(|r| plot::format_number(r.params.warmup)),
    ));
    let mut s = format!("{nodes} nodes × {clients} client threads");
    if !servers.is_empty() {
        let noun = if servers == "1" { "thread" } else { "threads" };
        s.push_str(&format!(" (+{servers} server {noun} for sd/hy)"));
    }
    if transport == "sim" {
        // Simulated windows differ run by run (a fixed number of operations each).
        s.push_str(", simulated cluster, virtual time");
    } else {
        s.push_str(&format!(
            ", {transport}, {duration} s runs after {warmup} s warm-up"
        ));
    }
    s
}
