//! Scaling a cluster during a run (`nessie bench --scale-to N --scale-at S`, issue 42), while
//! every starting node's clients run; the result says how long it took, what moved, and what
//! the timeline shows of it ([`ScalingReport`]).
//!
//! - **In** (N below `--nodes`): nodes N and up leave one after the other (`nessie leave`:
//!   each drains its index partitions to the others by migrations, steps down and stops; its
//!   table copies then move to spare slots of the others a join settle time after it failed,
//!   its exit recorded in membership, and are filled there, which the next waits for).
//! - **Out** (N above `--nodes`): the cluster starts with N − `--nodes` standby nodes
//!   (`[cluster] standby`), which join side by side (`nessie join --count`); the scaling is
//!   over once the balancer has given them their shares of index partitions and nothing
//!   migrates. Clients run on the starting nodes only (a joined node serves its memory).

#[cfg(feature = "ucx")]
use std::path::Path;
#[cfg(feature = "ucx")]
use std::time::{Duration, Instant};

#[cfg(feature = "ucx")]
use nessie_cluster::config::ClusterConfig;
#[cfg(feature = "ucx")]
use nessie_cluster::process;

use crate::timeline::Timeline;

/// How long the nodes may take to drain after the measured window ends before the run fails.
#[cfg(feature = "ucx")]
const DRAIN_GRACE: Duration = Duration::from_secs(60);
/// Most nodes a run scales to (`nessie up`'s limit on local nodes).
pub const MAX_SCALE_TO: u16 = 64;
/// Earliest scaling, seconds into the measured window: five timeline windows to measure the
/// throughput before it by.
pub const MIN_SCALE_AT_S: f64 = 0.5;

/// `--scale-to N --scale-at S`: the cluster goes from `--nodes` to `to` nodes at `at_s`
/// seconds into the measured window.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct ScalePlan {
    pub to: u16,
    pub at_s: f64,
}

/// What a scaling did (times in seconds into the measured window).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScalingReport {
    pub from: u16,
    pub to: u16,
    /// When the nodes were told to leave, or the first was started to join.
    pub started_s: f64,
    /// When the last leaving node held no index partition copy and nothing migrated, and had
    /// stepped down and stopped (the copies of its tables move to spare slots a join settle
    /// time after it failed, its stop recorded: counted here only for the nodes before it); or
    /// when the joined nodes had their shares, nothing migrating or filling.
    pub finished_s: f64,
    /// The bytes of the index partition copies the leaving nodes held before, or the joining
    /// nodes hold once balanced (each an index slot's bytes): what moves during the scaling.
    pub bytes_held_before: u64,
    /// The bytes of the table copies the leaving nodes held (each a node's table regions):
    /// these move to spare slots a join settle time after each stopped (`replace_after_s`
    /// if its stop could not be recorded), the last one's after the finish. 0 scaling out (a
    /// joining node's own tables start empty).
    pub table_bytes_held: u64,
    /// What moved in on the nodes that stay until the finish: bytes read filling moved copies,
    /// and 8 bytes for each index entry installed by a handover puller.
    pub bytes_moved: u64,
    /// Median of the 100 ms windows' GET p99.9 before the start.
    pub get_p999_us_before: f64,
    /// Highest 100 ms window GET p99.9 from the start to the finish.
    pub get_p999_us_during: f64,
    /// The p99.9 of every GET that completed before the start (µs, coarse: ±6%), as
    /// Rocksteady compares tails: a window's p99.9 on a shared 2-core host jumps with each
    /// time slice a client thread waits (4 ms spikes before any scaling), so the highest one
    /// says little; this one weighs each GET once.
    #[serde(default)]
    pub get_p999_us_before_all: f64,
    /// The same of every GET that completed from the start to the finish.
    #[serde(default)]
    pub get_p999_us_during_all: f64,
    /// Median operations per window before the start, and the fewest in a window during.
    pub ops_per_window_before: f64,
    pub ops_per_window_min_during: u64,
    /// The longest stretch from the start to the end of the run in which no operation
    /// completed, in ms (whole windows).
    pub stall_ms: f64,
    /// When each node was up (scaling out) or had stepped down and stopped (in), in order.
    #[serde(default)]
    pub steps_s: Vec<f64>,
}

/// Why a scaling could not be done.
#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    #[error("--scale-to {to}: {why}")]
    Plan { to: u16, why: String },
    #[error("scaling to {to} nodes: {why}")]
    Failed { to: u16, why: String },
}

/// A plan that fits the run: scale in or out, to at least `replicas` nodes, with replication,
/// within the measured window, on a cluster the run started.
pub fn validate(
    plan: &ScalePlan,
    nodes: u16,
    replicas: u8,
    duration_s: f64,
    owned: bool,
) -> Result<(), ScaleError> {
    let bad = |why: String| Err(ScaleError::Plan { to: plan.to, why });
    if !owned {
        return bad("a run scales only a cluster it started itself, not --cluster".into());
    }
    if plan.to > MAX_SCALE_TO {
        return bad(format!(
            "scaling out to more than {} nodes is not supported here",
            MAX_SCALE_TO
        ));
    }
    if plan.to == nodes {
        return bad(format!("the cluster has {nodes} nodes already"));
    }
    if replicas < 2 {
        return bad("a node's data lives only on it with one copy: use --replicas 2 or 3".into());
    }
    if plan.to < replicas as u16 {
        return bad(format!("{replicas} copies need at least {replicas} nodes"));
    }
    if !(MIN_SCALE_AT_S..duration_s).contains(&plan.at_s) {
        return bad(format!(
            "--scale-at {} is not within the measured window [{MIN_SCALE_AT_S}, {duration_s})",
            plan.at_s
        ));
    }
    Ok(())
}

/// What the scaler measured, before the timeline is known.
#[derive(Clone, Debug, Default)]
pub struct Scaled {
    pub started_s: f64,
    pub steps_s: Vec<f64>,
    pub finished_s: f64,
    pub bytes_held_before: u64,
    pub table_bytes_held: u64,
    pub bytes_moved: u64,
}

#[cfg(feature = "ucx")]
/// At `plan.at_s` into the window starting at `window_start_unix_ns`, make nodes
/// `plan.to..nodes` leave, wait until all have drained, stop them, and measure.
pub fn scale_in(
    dir: &Path,
    cfg: &ClusterConfig,
    plan: ScalePlan,
    window_start_unix_ns: u64,
    window_s: f64,
) -> Result<Scaled, ScaleError> {
    let fail = |why: String| ScaleError::Failed { to: plan.to, why };
    let nodes = cfg.node.len() as u16;
    let leaving: Vec<u16> = (plan.to..nodes).collect();
    let set = cfg.replica_set().map_err(|e| fail(e.to_string()))?;
    crate::agent::sleep_until_unix(window_start_unix_ns + (plan.at_s * 1e9) as u64);
    let since = |t: Instant| plan.at_s + t.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let before = moved_in(dir, &leaving);
    let snap = || match process::membership_status(cfg) {
        Some(Ok(s)) => s
            .config
            .ok_or_else(|| fail("no configuration in etcd".into())),
        Some(Err(e)) => Err(fail(e.to_string())),
        None => Err(fail("the cluster runs without membership".into())),
    };
    let c = snap()?;
    let region_bytes: u64 = cfg.geometry.table_regions().iter().sum();
    let index_maps = c.index_map(&set);
    let bytes_held_before = leaving
        .iter()
        .map(|&k| {
            index_maps
                .as_ref()
                .and_then(|m| m.loads().get(&k).copied())
                .unwrap_or(0)
                * set.index_slot_bytes()
        })
        .sum();
    let table_bytes_held = leaving
        .iter()
        .map(|&k| c.copy_map(&set).held_by(k).len() as u64 * region_bytes)
        .sum();
    let deadline = Duration::from_secs_f64((window_s - plan.at_s).max(0.0)) + DRAIN_GRACE;
    // One at a time: a node may leave only once every partition has its copies on up nodes
    // (the tables of the one before have moved to spare slots of the others).
    let mut steps_s = Vec::new();
    for &k in &leaving {
        loop {
            let why = match snap()?.may_leave(k, &set) {
                Ok(()) => break,
                Err(e) => e.to_string(),
            };
            if t0.elapsed() > deadline {
                return Err(fail(format!("node {k} may not leave: {why}")));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let left = deadline
            .saturating_sub(t0.elapsed())
            .max(Duration::from_secs(1));
        let left = process::leave(cfg, dir, k, left, false, &mut |_| {})
            .map_err(|e| fail(format!("node {k}: {e}")))?;
        if let Err(why) = &left.marked_stopped {
            // The run goes on, slower: the next leave waits for `replace_after_s`.
            eprintln!("scale-in: node {k}'s stop not recorded in membership ({why}): its table copies move after replace_after_s");
        }
        steps_s.push(since(t0));
    }
    let finished_s = since(t0);
    let after = moved_in(dir, &leaving);
    Ok(Scaled {
        started_s: plan.at_s,
        steps_s,
        finished_s,
        bytes_held_before,
        table_bytes_held,
        bytes_moved: after.saturating_sub(before),
    })
}

#[cfg(feature = "ucx")]
/// At `plan.at_s` into the window starting at `window_start_unix_ns`, start the standby nodes
/// side by side (`nessie join --count`, with `binary`), wait until the balancer has given them
/// their shares and nothing migrates or fills, and measure.
pub fn scale_out(
    dir: &Path,
    cfg: &ClusterConfig,
    binary: &Path,
    plan: ScalePlan,
    window_start_unix_ns: u64,
    window_s: f64,
) -> Result<Scaled, ScaleError> {
    use nessie_membership::balance::Balance;
    let fail = |why: String| ScaleError::Failed { to: plan.to, why };
    let joining = cfg.cluster.standby.clone();
    let set = cfg.replica_set().map_err(|e| fail(e.to_string()))?;
    let replace_after_ns = cfg
        .membership
        .as_ref()
        .map_or(0, |m| m.replace_after_s * 1_000_000_000);
    crate::agent::sleep_until_unix(window_start_unix_ns + (plan.at_s * 1e9) as u64);
    let since = |t: Instant| plan.at_s + t.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let before = moved_in(dir, &[]);
    let deadline = Duration::from_secs_f64((window_s - plan.at_s).max(0.0)) + DRAIN_GRACE;
    // All at once: each waits its own join settle time, side by side.
    let joined = process::join_many(
        dir,
        binary,
        joining.len() as u16,
        deadline.max(Duration::from_secs(1)),
        &mut |_| {},
    )
    .map_err(|e| fail(format!("nodes {joining:?}: {e}")))?;
    let ids: Vec<u16> = joined.iter().map(|j| j.id).collect();
    if ids != joining {
        return Err(fail(format!(
            "nodes {ids:?} joined where {joining:?} were expected"
        )));
    }
    let steps_s: Vec<f64> = joined
        .iter()
        .map(|j| plan.at_s + j.took.as_secs_f64())
        .collect();
    // Balanced: the plan moves nothing, nothing migrates, no moved copy is filling.
    let c = loop {
        let c = match process::membership_status(cfg) {
            Some(Ok(s)) => s
                .config
                .ok_or_else(|| fail("no configuration in etcd".into()))?,
            Some(Err(e)) => return Err(fail(e.to_string())),
            None => return Err(fail("the cluster runs without membership".into())),
        };
        // The joined nodes, in the joins they are up in.
        let joined: Vec<(u16, u64)> = c
            .nodes
            .iter()
            .filter(|m| joining.contains(&m.id))
            .map(|m| (m.id, m.joined_ns))
            .collect();
        let settled = !c.index_chains.iter().any(|ch| ch.migrating)
            && !c.moves.iter().any(|m| m.receiving)
            && matches!(
                // Whether the plan moves anything more, held nodes or not: the joined nodes
                // have their shares once it moves nothing.
                c.plan_balance_settled(
                    &set,
                    nessie_fabric::wall_clock_ns(),
                    replace_after_ns,
                    &joined
                ),
                Ok(Balance::Balanced)
            );
        if settled {
            break c;
        }
        if t0.elapsed() > deadline {
            return Err(fail(format!(
                "the joined nodes {joining:?} were not given their shares in {:.0} s",
                deadline.as_secs_f64()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let finished_s = since(t0);
    let bytes_held_before = joining
        .iter()
        .map(|&k| {
            c.index_map(&set)
                .and_then(|m| m.loads().get(&k).copied())
                .unwrap_or(0)
                * set.index_slot_bytes()
        })
        .sum();
    let after = moved_in(dir, &[]);
    Ok(Scaled {
        started_s: plan.at_s,
        steps_s,
        finished_s,
        bytes_held_before,
        table_bytes_held: 0,
        bytes_moved: after.saturating_sub(before),
    })
}

#[cfg(feature = "ucx")]
/// What moved in so far on the nodes that stay (their status reports' `moved_in`).
fn moved_in(dir: &Path, leaving: &[u16]) -> u64 {
    let Ok((_, nodes)) = process::status(dir) else {
        return 0;
    };
    nodes
        .iter()
        .filter(|n| !leaving.contains(&n.id))
        .filter_map(|n| n.report.as_ref().ok())
        .map(|r| {
            let m = &r["moved_in"];
            m["fill_bytes"].as_u64().unwrap_or(0) + 8 * m["handed_entries"].as_u64().unwrap_or(0)
        })
        .sum()
}

impl ScalingReport {
    /// The report of `s`, from `from` nodes to `to`, with what `t` shows.
    pub fn new(from: u16, to: u16, s: &Scaled, t: &Timeline) -> Self {
        // Whole nanoseconds, as `Timeline::fault` counts: no float rounding moves a time into
        // the window before.
        let w_ns = ((t.window_ms * 1e6).round() as u64).max(1);
        let at = |secs: f64| (((secs * 1e9).round() as u64 / w_ns) as usize).min(t.ops.len());
        let (k, end) = (at(s.started_s), at(s.finished_s) + 1);
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        let during = k..end.min(t.ops.len());
        ScalingReport {
            from,
            to,
            started_s: s.started_s,
            finished_s: s.finished_s,
            bytes_held_before: s.bytes_held_before,
            table_bytes_held: s.table_bytes_held,
            bytes_moved: s.bytes_moved,
            get_p999_us_before: median(t.get_p999_us[..k].to_vec()),
            get_p999_us_during: t.get_p999_us[during.clone()]
                .iter()
                .copied()
                .fold(0.0, f64::max),
            get_p999_us_before_all: t.get_quantile_us(0..k, 0.999),
            get_p999_us_during_all: t.get_quantile_us(during.clone(), 0.999),
            ops_per_window_before: median(t.ops[..k].iter().map(|&n| n as f64).collect()),
            ops_per_window_min_during: t.ops[during].iter().copied().min().unwrap_or(0),
            stall_ms: t.longest_stall(k) as f64 * t.window_ms,
            steps_s: s.steps_s.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_refused_with_their_reason() {
        let p = |to, at_s| ScalePlan { to, at_s };
        assert!(validate(&p(3, 2.0), 4, 2, 5.0, true).is_ok());
        assert!(validate(&p(5, 2.0), 3, 2, 5.0, true).is_ok());
        for (plan, nodes, replicas, owned, says) in [
            (p(99, 2.0), 3, 2, true, "more than"),
            (p(5, 2.0), 3, 1, true, "one copy"),
            (p(4, 2.0), 4, 2, true, "has 4 nodes already"),
            (p(3, 2.0), 4, 1, true, "one copy"),
            (p(1, 2.0), 4, 2, true, "at least 2 nodes"),
            (p(3, 9.0), 4, 2, true, "not within"),
            (p(3, 2.0), 4, 2, false, "--cluster"),
        ] {
            let e = validate(&plan, nodes, replicas, 5.0, owned).unwrap_err();
            assert!(e.to_string().contains(says), "{plan:?}: {e}");
        }
    }

    #[test]
    fn the_report_reads_the_timeline_around_the_scaling() {
        // 10 windows of 100 ms: 100 ops each, but 40 in window 4 and none in 5 and 6.
        let mut ops = vec![100; 10];
        ops[4] = 40;
        ops[5] = 0;
        ops[6] = 0;
        let mut p999 = vec![50.0; 10];
        p999[4] = 900.0;
        let t = Timeline {
            window_ms: 100.0,
            duration_ms: 1_000.0,
            ops,
            errors: vec![0; 10],
            get_p50_us: vec![5.0; 10],
            get_p999_us: p999,
            gets: Vec::new(),
        };
        let s = Scaled {
            started_s: 0.4,
            steps_s: vec![0.7],
            finished_s: 0.75,
            bytes_held_before: 10,
            table_bytes_held: 20,
            bytes_moved: 7,
        };
        let r = ScalingReport::new(4, 3, &s, &t);
        assert_eq!(r.get_p999_us_before, 50.0);
        assert_eq!(r.get_p999_us_during, 900.0);
        // Read back from JSON: no histograms to pool.
        assert_eq!(
            (r.get_p999_us_before_all, r.get_p999_us_during_all),
            (0.0, 0.0)
        );
        assert_eq!(r.ops_per_window_before, 100.0);
        assert_eq!(r.ops_per_window_min_during, 0);
        assert_eq!(r.stall_ms, 200.0);
        assert_eq!((r.from, r.to, r.bytes_moved), (4, 3, 7));
    }
}
