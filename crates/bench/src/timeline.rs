//! The run's timeline: completed operations and GET latency in short windows of the measured
//! window, so that a stall (nodes failing, joining, leaving) shows, and how long it lasted.
//!
//! Each client thread counts into its own cells, by the time an operation *completes* (a stall
//! is a stretch of time in which nothing completes); the agent merges its threads and the
//! runner merges the agents, cell by cell (cells are aligned on the common window start).
//! GET latencies go into coarse histograms (one significant digit, from 1 µs): a timeline
//! shows shape, the run's overall percentiles stay exact.

use hdrhistogram::Histogram;

use crate::result::{decode_hist, encode_hist, HistogramError, MAX_LATENCY_NS};

/// Width of one timeline window.
pub const WINDOW_NS: u64 = 100_000_000;
/// Most windows a timeline keeps; a longer run widens them (a multiple of [`WINDOW_NS`]).
/// Each client thread keeps a coarse histogram per window (about 4 KB): 600 bound a thread's
/// timeline to a few MB.
pub const MAX_WINDOWS: u64 = 600;
/// A run's throughput is "back" once a window after a fault completes this fraction of the
/// median window before it.
pub const RECOVERED_FRACTION: f64 = 0.5;

/// The width of a run's windows: [`WINDOW_NS`], or wider so that at most [`MAX_WINDOWS`] span it.
pub fn window_ns(duration_ns: u64) -> u64 {
    let n = duration_ns.div_ceil(WINDOW_NS).div_ceil(MAX_WINDOWS).max(1);
    n * WINDOW_NS
}

fn coarse_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1_000, MAX_LATENCY_NS, 1).expect("valid bounds")
}

/// One thread's or one node's cells.
#[derive(Clone, Debug)]
pub struct Cells {
    start_ns: u64,
    width_ns: u64,
    /// The measured window's length: its last cell may be shorter than the others.
    span_ns: u64,
    /// The cell of the last completion and the times it spans.
    cur: usize,
    cur_from: u64,
    cur_to: u64,
    ops: Vec<u64>,
    errors: Vec<u64>,
    gets: Vec<Option<Histogram<u64>>>,
}

impl Cells {
    /// Cells over `[start_ns, end_ns)`.
    pub fn new(start_ns: u64, end_ns: u64) -> Cells {
        let width_ns = window_ns(end_ns.saturating_sub(start_ns));
        let n = end_ns.saturating_sub(start_ns).div_ceil(width_ns).max(1) as usize;
        Cells {
            start_ns,
            width_ns,
            span_ns: end_ns.saturating_sub(start_ns),
            cur: 0,
            cur_from: 0,
            cur_to: 0,
            ops: vec![0; n],
            errors: vec![0; n],
            gets: vec![None; n],
        }
    }

    /// The cell of an operation that completed at `now_ns` (one completing after the window
    /// counts in the last cell: it was slow, and that is the news). Completions come in time
    /// order, so the cell of the last one is kept: no division per operation.
    fn cell(&mut self, now_ns: u64) -> usize {
        if (self.cur_from..self.cur_to).contains(&now_ns) {
            return self.cur;
        }
        let i = (now_ns.saturating_sub(self.start_ns) / self.width_ns) as usize;
        let i = i.min(self.ops.len() - 1);
        self.cur = i;
        self.cur_from = self.start_ns + i as u64 * self.width_ns;
        self.cur_to = if i + 1 == self.ops.len() {
            u64::MAX
        } else {
            self.cur_from + self.width_ns
        };
        if now_ns < self.start_ns {
            self.cur_to = self.cur_from; // before the window: look again next time
        }
        i
    }

    /// An operation completed at `now_ns`: a GET with its latency, another kind with `None`.
    pub fn completed(&mut self, now_ns: u64, get_latency_ns: Option<u64>) {
        let i = self.cell(now_ns);
        self.ops[i] += 1;
        if let Some(l) = get_latency_ns {
            self.gets[i]
                .get_or_insert_with(coarse_hist)
                .saturating_record(l.max(1_000));
        }
    }

    /// An operation failed at `now_ns`.
    pub fn failed(&mut self, now_ns: u64) {
        let i = self.cell(now_ns);
        self.errors[i] += 1;
    }

    pub fn merge(&mut self, o: &Cells) -> Result<(), HistogramError> {
        debug_assert_eq!((self.start_ns, self.width_ns), (o.start_ns, o.width_ns));
        for i in 0..self.ops.len().min(o.ops.len()) {
            self.ops[i] += o.ops[i];
            self.errors[i] += o.errors[i];
            if let Some(h) = &o.gets[i] {
                self.gets[i]
                    .get_or_insert_with(coarse_hist)
                    .add(h)
                    .map_err(HistogramError::from)?;
            }
        }
        Ok(())
    }

    /// The cells as an agent sends them.
    pub fn report(&self) -> TimelineReport {
        TimelineReport {
            start_ns: self.start_ns,
            width_ns: self.width_ns,
            span_ns: self.span_ns,
            ops: self.ops.clone(),
            errors: self.errors.clone(),
            gets: self
                .gets
                .iter()
                .map(|h| h.as_ref().map(encode_hist).unwrap_or_default())
                .collect(),
        }
    }

    /// Cells from an agent's report.
    pub fn from_report(r: &TimelineReport) -> Result<Cells, HistogramError> {
        Ok(Cells {
            start_ns: r.start_ns,
            width_ns: r.width_ns.max(1),
            span_ns: r.span_ns,
            cur: 0,
            cur_from: 0,
            cur_to: 0,
            ops: r.ops.clone(),
            errors: r.errors.clone(),
            gets: r
                .gets
                .iter()
                .map(|s| (!s.is_empty()).then(|| decode_hist(s)).transpose())
                .collect::<Result<_, _>>()?,
        })
    }

    /// The run's timeline.
    pub fn timeline(&self) -> Timeline {
        let q = |h: &Option<Histogram<u64>>, q: f64| {
            h.as_ref()
                .filter(|h| !h.is_empty())
                .map_or(0.0, |h| h.value_at_quantile(q) as f64 / 1e3)
        };
        Timeline {
            window_ms: self.width_ns as f64 / 1e6,
            duration_ms: self.span_ns as f64 / 1e6,
            ops: self.ops.clone(),
            errors: self.errors.clone(),
            get_p50_us: self.gets.iter().map(|h| q(h, 0.5)).collect(),
            get_p999_us: self.gets.iter().map(|h| q(h, 0.999)).collect(),
            gets: self.gets.clone(),
        }
    }
}

/// What an agent sends: its cells, GET histograms hex-encoded (empty for none).
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct TimelineReport {
    pub start_ns: u64,
    pub width_ns: u64,
    #[serde(default)]
    pub span_ns: u64,
    pub ops: Vec<u64>,
    pub errors: Vec<u64>,
    pub gets: Vec<String>,
}

/// The run's timeline, one entry per window of the measured window: operations completed,
/// operations failed, and GET latency percentiles (µs, 0 without GETs; coarse: ±6%).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Timeline {
    pub window_ms: f64,
    /// The measured window: the last entry covers what is left of it after the others.
    #[serde(default)]
    pub duration_ms: f64,
    pub ops: Vec<u64>,
    pub errors: Vec<u64>,
    pub get_p50_us: Vec<f64>,
    pub get_p999_us: Vec<f64>,
    /// The windows' GET histograms, for percentiles over several windows
    /// ([`Self::get_quantile_us`]); kept only in the run that merged them, not in the JSON.
    #[serde(skip)]
    pub gets: Vec<Option<Histogram<u64>>>,
}

/// A node killed during a run (`nessie bench --kill-node K --kill-at S [--restart-at S2]`), and
/// what the timeline shows of it. Times are seconds into the measured window.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FaultReport {
    pub node: u16,
    pub killed_at_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at_s: Option<f64>,
    /// The median operations per window before the kill.
    pub ops_per_window_before: f64,
    /// The longest stretch after the kill in which no operation completed, in ms (whole
    /// windows).
    pub stall_ms: f64,
    /// Time after the kill in windows that completed less than [`RECOVERED_FRACTION`] of the
    /// median before it, in ms: the degraded time, stalls included.
    pub degraded_ms: f64,
    /// Start of the first degraded window (`None`: none was).
    pub degraded_from_s: Option<f64>,
    /// End of the last degraded window: throughput stayed up from then on (`None`: the run
    /// ended degraded; equal to `degraded_from_s`'s absence when nothing degraded).
    pub recovered_at_s: Option<f64>,
}

impl Timeline {
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Quantile `q` of the latencies of every GET that completed in windows `range` (µs,
    /// coarse as the windows'); 0 without GETs, or in a timeline read back from JSON.
    pub fn get_quantile_us(&self, range: std::ops::Range<usize>, q: f64) -> f64 {
        let mut all = coarse_hist();
        let end = range.end.min(self.gets.len());
        for h in self.gets[range.start.min(end)..end].iter().flatten() {
            if all.add(h).is_err() {
                return 0.0; // same bounds on both sides: cannot happen
            }
        }
        match all.is_empty() {
            true => 0.0,
            false => all.value_at_quantile(q) as f64 / 1e3,
        }
    }

    /// The longest run of windows from `from` on in which nothing completed, in windows.
    pub fn longest_stall(&self, from: usize) -> usize {
        let (mut best, mut cur) = (0, 0);
        for &n in self.ops.iter().skip(from) {
            cur = if n == 0 { cur + 1 } else { 0 };
            best = best.max(cur);
        }
        best
    }

    /// Stall and degradation after a kill `at_s` seconds into the window. Windows are
    /// counted in whole nanoseconds (no float rounding puts the kill in the wrong one); the
    /// window holding the kill is partly before it and is judged with neither side, and a
    /// last window shorter than the others is left out.
    pub fn fault(&self, node: u16, at_s: f64, restarted_at_s: Option<f64>) -> FaultReport {
        let w_ns = ((self.window_ms * 1e6).round() as u64).max(1);
        let at_ns = (at_s * 1e9).round() as u64;
        let k = ((at_ns / w_ns) as usize).min(self.ops.len());
        let span_ns = (self.duration_ms * 1e6).round() as u64;
        let full = match span_ns {
            0 => self.ops.len(),
            s => ((s / w_ns) as usize).min(self.ops.len()),
        };
        let mut before: Vec<u64> = self.ops[..k].to_vec();
        before.sort_unstable();
        let median = before.get(before.len() / 2).copied().unwrap_or(0) as f64;
        let degraded: Vec<usize> = (k + 1..full)
            .filter(|&i| (self.ops[i] as f64) < RECOVERED_FRACTION * median)
            .collect();
        let secs = |i: usize| (i as u64 * w_ns) as f64 / 1e9;
        FaultReport {
            node,
            killed_at_s: at_s,
            restarted_at_s,
            ops_per_window_before: median,
            stall_ms: self.longest_stall(k + 1) as f64 * self.window_ms,
            degraded_ms: degraded.len() as f64 * self.window_ms,
            degraded_from_s: degraded.first().map(|&i| secs(i)),
            recovered_at_s: match degraded.last() {
                Some(&i) if i + 1 == full => None,
                Some(&i) => Some(secs(i + 1)),
                None => Some(at_s),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_land_in_the_window_they_complete_in() {
        let mut c = Cells::new(1_000_000_000, 2_000_000_000);
        c.completed(1_000_000_000, Some(5_000));
        c.completed(1_150_000_000, None);
        c.failed(1_199_999_999);
        c.completed(9_000_000_000, Some(3_000_000)); // after the window: the last cell
        c.completed(1_299_999_999, None); // another thread's clock: back in time
        c.completed(1_300_000_000, None);
        let t = c.timeline();
        assert_eq!(t.window_ms, 100.0);
        assert_eq!(t.ops, vec![1, 1, 1, 1, 0, 0, 0, 0, 0, 1]);
        assert_eq!(t.errors[1], 1);
        assert!((4.5..=5.5).contains(&t.get_p50_us[0]), "{t:?}");
        assert_eq!(t.get_p50_us[1], 0.0);
        assert!(t.get_p999_us[9] > 2_500.0);
    }

    #[test]
    fn cells_merge_and_survive_the_report() {
        let mut a = Cells::new(0, 300_000_000);
        let mut b = Cells::new(0, 300_000_000);
        a.completed(10, Some(2_000));
        b.completed(250_000_000, Some(4_000));
        b.completed(20, Some(9_000));
        let b = Cells::from_report(&b.report()).unwrap();
        a.merge(&b).unwrap();
        let t = a.timeline();
        assert_eq!(t.ops, vec![2, 0, 1]);
        assert!(t.get_p999_us[0] >= 8.0, "{t:?}");
    }

    /// A percentile over several windows weighs each GET once: two slow GETs in 4,000 leave
    /// the pooled p99.9 where the others are, though their window's own p99.9 is theirs.
    #[test]
    fn a_pooled_percentile_weighs_each_get_once() {
        let mut c = Cells::new(0, 600_000_000);
        for w in 0..4u64 {
            for i in 0..1_000 {
                c.completed(w * WINDOW_NS + i, Some(10_000));
            }
        }
        c.completed(WINDOW_NS + 5_000, Some(5_000_000));
        c.completed(WINDOW_NS + 6_000, Some(5_000_000));
        for i in 0..100 {
            c.completed(4 * WINDOW_NS + i, Some(2_000_000));
        }
        let t = c.timeline();
        assert!(t.get_p999_us[1] > 4_000.0, "{:?}", t.get_p999_us);
        let before = t.get_quantile_us(0..4, 0.999);
        assert!((9.0..=11.0).contains(&before), "{before}");
        assert!(
            t.get_quantile_us(0..5, 0.999) > 1_500.0,
            "window 4's slow GETs count"
        );
        assert_eq!(t.get_quantile_us(5..6, 0.999), 0.0, "no GETs");
        assert_eq!(t.get_quantile_us(7..99, 0.5), 0.0, "out of range");
        let json = serde_json::to_string(&t).unwrap();
        assert!(!json.contains("gets"), "{json}");
        let back: Timeline = serde_json::from_str(&json).unwrap();
        assert_eq!(
            back.get_quantile_us(0..4, 0.999),
            0.0,
            "not kept in the JSON"
        );
    }

    #[test]
    fn long_runs_widen_their_windows() {
        assert_eq!(window_ns(10_000_000_000), WINDOW_NS);
        assert_eq!(window_ns(MAX_WINDOWS * WINDOW_NS), WINDOW_NS);
        assert_eq!(window_ns(MAX_WINDOWS * WINDOW_NS + 1), 2 * WINDOW_NS);
        let c = Cells::new(0, 3_600_000_000_000);
        assert!(c.ops.len() as u64 <= MAX_WINDOWS);
        assert_eq!(c.timeline().duration_ms, 3_600_000.0);
    }

    #[test]
    fn a_stall_after_a_kill_is_measured() {
        // Over shared memory reads go on after a kill until the failure is declared; then
        // nothing completes, with a blip, until the copies take over.
        let mut ops = vec![100; 30];
        for o in &mut ops[14..22] {
            *o = 0;
        }
        ops[17] = 5;
        ops[22] = 30; // not yet half the median
        let t = Timeline {
            window_ms: 100.0,
            ops,
            ..Timeline::default()
        };
        let f = t.fault(1, 1.0, None);
        assert_eq!(f.ops_per_window_before, 100.0);
        assert_eq!(f.stall_ms, 400.0, "windows 18..22");
        assert_eq!(f.degraded_ms, 900.0, "windows 14..23");
        assert!((f.degraded_from_s.unwrap() - 1.4).abs() < 1e-9);
        assert!((f.recovered_at_s.unwrap() - 2.3).abs() < 1e-9);
        assert_eq!(t.longest_stall(0), 4);
        // Never back: none.
        let t = Timeline {
            window_ms: 100.0,
            ops: vec![10, 10, 10, 0, 0],
            ..Timeline::default()
        };
        let f = t.fault(0, 0.2, None);
        assert_eq!(f.recovered_at_s, None);
        assert_eq!(f.degraded_ms, 200.0);
        // Never degraded: back at the kill.
        let t = Timeline {
            window_ms: 100.0,
            ops: vec![10; 5],
            ..Timeline::default()
        };
        assert_eq!(t.fault(0, 0.2, None).recovered_at_s, Some(0.2));
        // 0.3 s is window 3 (a float division says 2.999…): window 3 is the kill's own.
        let mut ops = vec![10; 8];
        ops[3] = 0;
        let t = Timeline {
            window_ms: 100.0,
            ops,
            ..Timeline::default()
        };
        assert_eq!(t.fault(0, 0.3, None).degraded_ms, 0.0);
        // A short last window (a 0.75 s run) is not taken for a degraded one.
        let t = Timeline {
            window_ms: 100.0,
            duration_ms: 750.0,
            ops: vec![10, 10, 10, 10, 10, 10, 10, 2],
            ..Timeline::default()
        };
        let f = t.fault(0, 0.2, None);
        assert_eq!((f.degraded_ms, f.recovered_at_s), (0.0, Some(0.2)));
    }
}
