//! Cheap, sound refutations tried before the search (see [`crate::Limits::quick_refutation`]).
//!
//! The search proves a violation only by exhausting every alternative linearization of
//! everything before it, which on a long, highly concurrent key can exceed any budget.
//! The common anomalies have short certificates that need no search. For a Get `r`
//! returning `v` (with `t < u` meaning "returned before invoked", the real-time order):
//!
//! * **never written**: `v` is not the initial state and no write of `v` was invoked
//!   before `r` returned;
//! * **overwritten**: no failed (optional) write of `v` was invoked before `r` returned,
//!   every completed write `w` of `v` invoked before `r` returned has a completed write
//!   `k` of another state with `w < k < r`, and if `v` is the initial state some completed
//!   write of another state precedes `r`. Then in any linearization the last write of `v`
//!   before `r` (or the initial state) is followed by such a `k` before `r`, so `r`
//!   cannot read `v`. Covers stale reads, reads of deleted values and absent reads after
//!   a completed put.
//!
//! Only the writer of `v` with the latest return matters (a `k` for it serves all
//! earlier ones and the initial state), and the `k` returning earliest among writes
//! invoked after it is the best candidate, so each Get costs two binary searches.

use std::collections::HashMap;

use crate::search::{KeyOp, Kind, State};

/// A Get that cannot be linearized, with its witnesses.
pub(crate) struct Refutation {
    pub read: u32,
    /// The latest-returning write of the value read, if any was invoked in time.
    pub writer: Option<u32>,
    /// The completed write of another state between `writer` (or the initial state) and
    /// the read; `None` for a value never written.
    pub killer: Option<u32>,
}

#[derive(Default)]
struct Writers {
    /// Completed writers of one state, by invocation: call, and the latest return
    /// (with its op) among this and earlier ones.
    calls: Vec<u64>,
    max_ret: Vec<(u64, u32)>,
    /// Earliest invocation of a failed (optional) writer.
    optional_call: Option<u64>,
}

/// Finds the earliest-returning Get with a certificate, if any. `ops` are sorted by call.
pub(crate) fn refute(ops: &[KeyOp<'_>], initial: State) -> Option<Refutation> {
    let killers = Killers::new(ops);
    let by_value = writers_by_value(ops);
    let no_writers = Writers::default();
    let mut found: Option<Refutation> = None;
    for (r, op) in ops.iter().enumerate() {
        let Kind::Read(v) = op.kind else { continue };
        if found
            .as_ref()
            .is_some_and(|f| ops[f.read as usize].ret <= op.ret)
        {
            continue;
        }
        let w = by_value.get(&v).unwrap_or(&no_writers);
        let refutation = refute_read(r as u32, op, v, initial, w, &killers);
        if refutation.is_some() {
            found = refutation;
        }
    }
    found
}

/// The certificate for Get `r` (`op`, returning `v`) whose value's writers are `w`, if any.
fn refute_read(
    r: u32,
    op: &KeyOp<'_>,
    v: State,
    initial: State,
    w: &Writers,
    killers: &Killers<'_, '_>,
) -> Option<Refutation> {
    if w.optional_call.is_some_and(|c| c <= op.ret) {
        return None;
    }
    let n = w.calls.partition_point(|&c| c <= op.ret);
    let latest = n.checked_sub(1).map(|n| w.max_ret[n]);
    match latest {
        None if initial != v => Some(Refutation {
            read: r,
            writer: None,
            killer: None,
        }),
        None => killers.killer(None, op).map(|k| Refutation {
            read: r,
            writer: None,
            killer: Some(k),
        }),
        // `k` also overwrote the initial state, should it be `v`.
        Some((wret, widx)) => killers.killer(Some(wret), op).map(|k| Refutation {
            read: r,
            writer: Some(widx),
            killer: Some(k),
        }),
    }
}

/// The completed writers of each state, and the earliest invocation of a failed one.
fn writers_by_value(ops: &[KeyOp<'_>]) -> HashMap<State, Writers> {
    let mut by_value: HashMap<State, Writers> = HashMap::new();
    for (i, op) in ops.iter().enumerate() {
        let Some(v) = op.kind.written() else { continue };
        let w = by_value.entry(v).or_default();
        // An expiry may write absent or nothing: as a write that may not take effect.
        if op.optional || matches!(op.kind, Kind::Expire(_)) {
            w.optional_call = Some(w.optional_call.map_or(op.call, |c| c.min(op.call)));
        } else {
            let prev = w.max_ret.last().copied();
            w.calls.push(op.call);
            w.max_ret.push(match prev {
                Some(p) if p.0 >= op.ret => p,
                _ => (op.ret, i as u32),
            });
        }
    }
    by_value
}

/// The completed writes by invocation, to find the killer of a read.
struct Killers<'o, 'a> {
    ops: &'o [KeyOp<'a>],
    writes: Vec<u32>,
    /// suffix[pos]: the earliest-returning completed write among writes[pos..].
    suffix: Vec<Option<u32>>,
}

impl<'o, 'a> Killers<'o, 'a> {
    fn new(ops: &'o [KeyOp<'a>]) -> Self {
        let writes: Vec<u32> = (0..ops.len() as u32)
            .filter(|&i| {
                let op = &ops[i as usize];
                // An expiry need not change the state: it kills no read.
                op.kind.written().is_some() && !op.optional && !matches!(op.kind, Kind::Expire(_))
            })
            .collect();
        let mut suffix: Vec<Option<u32>> = vec![None; writes.len() + 1];
        for (pos, &i) in writes.iter().enumerate().rev() {
            suffix[pos] = match suffix[pos + 1] {
                Some(j) if ops[j as usize].ret <= ops[i as usize].ret => Some(j),
                _ => Some(i),
            };
        }
        Self {
            ops,
            writes,
            suffix,
        }
    }

    /// The earliest-returning completed write invoked after `t` (any if `t` is None), if
    /// it returned before Get `r` was invoked. It never writes `r`'s value: with `t` the
    /// latest return of a write of that value invoked before `r` returned (or no such
    /// write), a write of it invoked after `t` that returned before `r` was invoked would
    /// be one of those, returning later than `t`.
    fn killer(&self, t: Option<u64>, r: &KeyOp<'_>) -> Option<u32> {
        let ops = self.ops;
        let pos = t.map_or(0, |t| {
            self.writes.partition_point(|&k| ops[k as usize].call <= t)
        });
        let k = self.suffix[pos].filter(|&k| ops[k as usize].ret < r.call)?;
        debug_assert!(
            ops[k as usize].kind.written()
                != Some(match r.kind {
                    Kind::Read(v) => v,
                    _ => unreachable!(),
                })
        );
        Some(k)
    }
}
