//! The per-key linearizability search (see [`crate::check`] for the algorithm).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::refute::{refute, Refutation};
use crate::report::{KeyReport, Report, Verdict};
use crate::{fmt_value, Cond, Event, KeyId, Limits, Op, Outcome, ValueId};

/// Register state: `None` = absent.
pub(crate) type State = Option<ValueId>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A Get that returned the state.
    Read(State),
    /// A Put (`Some`) or Delete (`None`).
    Write(State),
    /// A conditional Put (`Some`) or Delete (`None`) that took effect (or, failed, may have).
    Guarded(Cond, State),
    /// A conditional write whose condition did not hold.
    Unmet(Cond),
    /// The expiry of the item written as this value: absent if the state is it, else no
    /// change (`Op::Expire`).
    Expire(ValueId),
}

impl Kind {
    /// The state this op leaves when it takes effect, if it writes.
    pub(crate) fn written(self) -> Option<State> {
        match self {
            Kind::Write(v) | Kind::Guarded(_, v) => Some(v),
            // It may leave absent (if it finds its value), or nothing.
            Kind::Expire(_) => Some(None),
            Kind::Read(_) | Kind::Unmet(_) => None,
        }
    }

    /// A Get, or an unmet conditional write: an op that only observes the state.
    fn observes(self, state: State) -> bool {
        match self {
            Kind::Read(v) => v == state,
            Kind::Unmet(c) => c.may_fail(state),
            _ => false,
        }
    }
}

/// One operation of a key, as searched.
pub(crate) struct KeyOp<'a> {
    pub call: u64,
    /// Response time; for an optional (failed) write, the bound described in `check`.
    pub ret: u64,
    pub kind: Kind,
    /// A failed write: may take effect or be a no-op.
    pub optional: bool,
    pub ev: &'a Event,
}

/// Turns a key's events into searchable ops sorted by (call, ret).
fn prepare<'a>(events: &[&'a Event]) -> Vec<KeyOp<'a>> {
    let mut ops = Vec::with_capacity(events.len());
    let mut failed_writes = Vec::new();
    // A conditional write observes the state too: a failed write can matter to one after the
    // last Get of its value, so with them failed writes stay open to the end.
    let conditional = events
        .iter()
        .any(|e| matches!(e.op, Op::PutIf(..) | Op::DeleteIf(_)));
    let end = events.iter().map(|e| e.response_ns.max(e.invoke_ns)).max();
    for &ev in events {
        let call = ev.invoke_ns;
        let ret = ev.response_ns.max(call);
        let kind = match (&ev.op, &ev.outcome) {
            (Op::Get, Outcome::Ok(v)) => Kind::Read(*v),
            (Op::Get, _) => continue,
            (Op::Put(v), _) => Kind::Write(Some(*v)),
            (Op::Delete, _) => Kind::Write(None),
            (Op::PutIf(_, c) | Op::DeleteIf(c), Outcome::Unmet) => Kind::Unmet(*c),
            (Op::PutIf(v, c), _) => Kind::Guarded(*c, Some(*v)),
            (Op::DeleteIf(c), _) => Kind::Guarded(*c, None),
            (Op::Expire(v), _) => Kind::Expire(*v),
        };
        let op = KeyOp {
            call,
            ret,
            kind,
            optional: false,
            ev,
        };
        if ev.outcome == Outcome::Failed {
            failed_writes.push(op);
        } else {
            ops.push(op);
        }
    }
    if !failed_writes.is_empty() {
        // Latest response of an op that observes each state: a Get returning it, or the
        // expiry of the value (which turns it absent). A failed write of `v` placed later
        // than both sets a state nothing reads before the next write replaces it (an expiry
        // of another value leaves `v` as it is), so it is equivalent to never taking effect.
        let mut last_read: HashMap<State, u64> = HashMap::new();
        for op in &ops {
            let seen = match op.kind {
                Kind::Read(v) => v,
                Kind::Expire(v) => Some(v),
                _ => continue,
            };
            let e = last_read.entry(seen).or_insert(op.ret);
            *e = (*e).max(op.ret);
        }
        for mut op in failed_writes {
            let v = op
                .kind
                .written()
                .expect("only writes are kept as failed ops");
            let bound = if conditional {
                end
            } else {
                last_read.get(&v).copied()
            };
            match bound.as_ref() {
                Some(&bound) if bound >= op.call => {
                    op.ret = bound;
                    op.optional = true;
                    ops.push(op);
                }
                // Nobody can have observed it: it is equivalent to never taking effect.
                _ => {}
            }
        }
    }
    ops.sort_by_key(|o| (o.call, o.ret));
    ops
}

/// Number of segments separated by quiescent points (no op pending).
fn count_segments(ops: &[KeyOp<'_>]) -> usize {
    let mut segments = 0;
    let mut max_ret: Option<u64> = None;
    for op in ops {
        if max_ret.is_none_or(|m| m < op.call) {
            segments += 1;
        }
        max_ret = Some(max_ret.map_or(op.ret, |m| m.max(op.ret)));
    }
    segments
}

/// FxHash-style hasher: the memo keys are small integers, SipHash would dominate.
#[derive(Default)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut buf = [0u8; 8];
            buf[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(buf));
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// Memo key: the linearized set as `[0, hw) \ pending` (see `check`), plus state.
#[derive(Hash, PartialEq, Eq)]
struct MemoKey {
    /// One past the highest linearized op.
    hw: u32,
    state: State,
    /// The unlinearized ops below `hw`, ascending.
    pending: Box<[u32]>,
}

/// The deepest point where the search got stuck.
struct DeadEnd {
    /// Ops linearized at that point.
    depth: usize,
    state: State,
    /// The minimal ops there (none of which could be placed).
    candidates: Vec<u32>,
    /// The op whose return ended the candidate window.
    blocker: u32,
    /// The last ops of the partial linearization, in order.
    path: Vec<u32>,
}

enum Outcome2 {
    Linearizable,
    NotLinearizable(DeadEnd),
    Unknown(Option<DeadEnd>),
}

struct Frame {
    op: u32,
    prev_state: State,
    alt: u8,
    /// A matching read taken as the only child (see `matching_read`).
    forced: bool,
    /// The parent configuration's iteration: was this the preferred op, and which op the
    /// scan skips.
    in_pref: bool,
    skip: u32,
}

/// No op.
const NONE: u32 = u32::MAX;

const HEAD: u32 = 0;
/// Number of linearized ops quoted from the deepest partial linearization.
const PATH_TAIL: usize = 8;

/// Iteration position within the current configuration: trying alternative `alt` of the op
/// at `node` (a call entry) or, while `in_pref`, of the preferred op `skip`; the scan in list
/// order skips `skip`, which was tried first.
#[derive(Clone, Copy)]
struct Cursor {
    node: u32,
    alt: u8,
    skip: u32,
    in_pref: bool,
}

impl Cursor {
    /// The start of a configuration's scan, at `node` (the first entry of the list).
    fn first(node: u32) -> Self {
        Cursor {
            node,
            alt: 0,
            skip: NONE,
            in_pref: false,
        }
    }
}

/// The depth-first search of `Search::run`.
struct Dfs<'b> {
    /// Configurations (linearized set and state) already entered.
    memo: HashSet<MemoKey, BuildHasherDefault<FxHasher>>,
    stack: Vec<Frame>,
    deepest: Option<DeadEnd>,
    /// The register after the linearized ops.
    state: State,
    cur: Cursor,
    /// True when a configuration is entered for the first time.
    fresh: bool,
    budget: u64,
    /// States explored so far (the caller's counter).
    states: &'b mut u64,
}

/// What the search does after one step.
enum Flow {
    /// Carry on from the current configuration (perhaps a new one).
    Continue,
    /// Every minimal op was tried here: record the dead end, then backtrack.
    DeadEnd,
    /// Backtrack without recording a dead end (a forced read explored before).
    Backtrack,
    /// The search is over.
    Stop(Outcome2),
}

struct Search<'s, 'a> {
    ops: &'s [KeyOp<'a>],
    next: Vec<u32>,
    prev: Vec<u32>,
    node_op: Vec<u32>,
    node_is_call: Vec<bool>,
    call_node: Vec<u32>,
    ret_node: Vec<u32>,
    tail: u32,
    /// One past the highest linearized op, and its previous values (undone by `unlift`).
    hw: u32,
    hw_stack: Vec<u32>,
}

impl<'s, 'a> Search<'s, 'a> {
    fn new(ops: &'s [KeyOp<'a>]) -> Self {
        let n = ops.len();
        // (time, 0 = call / 1 = return, op): calls sort before returns at equal times,
        // so equal timestamps are concurrent; calls at equal times keep op order.
        let mut entries: Vec<(u64, u8, u32)> = Vec::with_capacity(2 * n);
        for (i, op) in ops.iter().enumerate() {
            entries.push((op.call, 0, i as u32));
            entries.push((op.ret, 1, i as u32));
        }
        entries.sort_unstable();
        let tail = (2 * n + 1) as u32;
        let nodes = 2 * n + 2;
        let mut node_op = vec![0u32; nodes];
        let mut node_is_call = vec![false; nodes];
        let mut call_node = vec![0u32; n];
        let mut ret_node = vec![0u32; n];
        for (pos, &(_, kind, op)) in entries.iter().enumerate() {
            let node = pos as u32 + 1;
            node_op[node as usize] = op;
            if kind == 0 {
                node_is_call[node as usize] = true;
                call_node[op as usize] = node;
            } else {
                ret_node[op as usize] = node;
            }
        }
        let next = (0..nodes as u32).map(|x| x + 1).collect();
        let prev = (0..nodes as u32).map(|x| x.saturating_sub(1)).collect();
        Search {
            ops,
            next,
            prev,
            node_op,
            node_is_call,
            call_node,
            ret_node,
            tail,
            hw: 0,
            hw_stack: Vec::with_capacity(n),
        }
    }

    fn unlink(&mut self, x: u32) {
        let (p, n) = (self.prev[x as usize], self.next[x as usize]);
        self.next[p as usize] = n;
        self.prev[n as usize] = p;
    }

    fn relink(&mut self, x: u32) {
        let (p, n) = (self.prev[x as usize], self.next[x as usize]);
        self.next[p as usize] = x;
        self.prev[n as usize] = x;
    }

    /// Marks op `i` linearized: unlinks its call and return entries.
    fn lift(&mut self, i: u32) {
        self.unlink(self.call_node[i as usize]);
        self.unlink(self.ret_node[i as usize]);
        self.hw_stack.push(self.hw);
        self.hw = self.hw.max(i + 1);
    }

    /// Undoes `lift(i)` (must be the most recent lift still in effect).
    fn unlift(&mut self, i: u32) {
        self.relink(self.ret_node[i as usize]);
        self.relink(self.call_node[i as usize]);
        self.hw = self.hw_stack.pop().expect("unlift matches a lift");
    }

    /// The memo key of the current linearized set with register `state`.
    ///
    /// The unlinearized ops below `hw` are exactly the first entries of the list: each
    /// was invoked before op `hw - 1`, and none returned before it was invoked (op
    /// `hw - 1` was minimal when it was placed), so no return entry precedes them. There
    /// are only about as many as there are concurrent operations, even when the earliest
    /// unlinearized op is far behind (a long or failed operation), so keys stay small
    /// and the history is in effect split at quiescent points, where `pending` is empty.
    fn memo_key(&self, state: State) -> MemoKey {
        let mut pending = Vec::new();
        let mut x = self.next[HEAD as usize];
        while self.node_is_call[x as usize] && self.node_op[x as usize] < self.hw {
            pending.push(self.node_op[x as usize]);
            x = self.next[x as usize];
        }
        MemoKey {
            hw: self.hw,
            state,
            pending: pending.into_boxed_slice(),
        }
    }

    /// True if another minimal optional op with the same effect has an earlier bound:
    /// trying that one first loses no linearization (the two can be exchanged).
    fn dominated(&self, i: u32) -> bool {
        let me = &self.ops[i as usize];
        let mut x = self.next[HEAD as usize];
        while self.node_is_call[x as usize] {
            let j = self.node_op[x as usize];
            let other = &self.ops[j as usize];
            if j != i && other.optional && other.kind == me.kind && (other.ret, j) < (me.ret, i) {
                return true;
            }
            x = self.next[x as usize];
        }
        false
    }

    fn step(op: &KeyOp<'_>, state: State, alt: u8) -> Option<State> {
        match (op.kind, alt) {
            (k @ (Kind::Read(_) | Kind::Unmet(_)), _) => k.observes(state).then_some(state),
            (Kind::Write(v), 0) => Some(v),
            (Kind::Guarded(c, v), 0) => c.holds(state).then_some(v),
            (Kind::Expire(v), _) => Some(if state == Some(v) { None } else { state }),
            // Optional write that does not take effect.
            (Kind::Write(_) | Kind::Guarded(..), _) => Some(state),
        }
    }

    /// A minimal Get that returns the current state, if any. Linearizing it next is
    /// always safe: in any completion it can be moved to the front (it is minimal, so
    /// nothing must precede it, and it changes no state), so it is the only child tried.
    fn matching_read(&self, state: State) -> Option<u32> {
        let mut x = self.next[HEAD as usize];
        while self.node_is_call[x as usize] {
            let j = self.node_op[x as usize];
            if self.ops[j as usize].kind.observes(state) {
                return Some(j);
            }
            x = self.next[x as usize];
        }
        None
    }

    /// The op to try first in a configuration without a matching read. The op with the
    /// earliest pending return (the *blocker*) must be placed before anything invoked
    /// after it returns: if it is a write, try it first; if it is a Get of `v`, try a
    /// minimal write of `v` first (so the Get can follow). Only an ordering heuristic,
    /// for the common linearizable case: every other candidate is still tried.
    fn preferred(&self) -> Option<u32> {
        let mut x = self.next[HEAD as usize];
        while self.node_is_call[x as usize] {
            x = self.next[x as usize];
        }
        let b = self.node_op[x as usize];
        let Kind::Read(v) = self.ops[b as usize].kind else {
            return Some(b);
        };
        let mut x = self.next[HEAD as usize];
        while self.node_is_call[x as usize] {
            let j = self.node_op[x as usize];
            if self.ops[j as usize].kind.written() == Some(v) {
                return Some(j);
            }
            x = self.next[x as usize];
        }
        None
    }

    fn run(&mut self, initial: State, budget: u64, states: &mut u64) -> Outcome2 {
        let mut dfs = Dfs {
            memo: HashSet::default(),
            stack: Vec::with_capacity(self.ops.len()),
            deepest: None,
            state: initial,
            cur: Cursor::first(self.next[HEAD as usize]),
            fresh: true,
            budget,
            states,
        };
        loop {
            if self.next[HEAD as usize] == self.tail {
                return Outcome2::Linearizable;
            }
            let entered = if dfs.fresh {
                self.enter(&mut dfs)
            } else {
                None
            };
            match entered.unwrap_or_else(|| self.scan(&mut dfs)) {
                Flow::Continue => continue,
                Flow::DeadEnd => {
                    if dfs
                        .deepest
                        .as_ref()
                        .is_none_or(|d| dfs.stack.len() > d.depth)
                    {
                        dfs.deepest = Some(self.dead_end(&dfs.stack, dfs.state, dfs.cur.node));
                    }
                }
                Flow::Backtrack => {}
                Flow::Stop(outcome) => return outcome,
            }
            if let Some(outcome) = self.backtrack(&mut dfs) {
                return outcome;
            }
        }
    }

    /// Enters a configuration for the first time. A matching read is its only child: descend
    /// into it, or backtrack if that child was explored before. Otherwise `None`: the scan
    /// starts, with the preferred op if there is one.
    fn enter(&mut self, dfs: &mut Dfs<'_>) -> Option<Flow> {
        dfs.fresh = false;
        dfs.cur = Cursor::first(self.next[HEAD as usize]);
        if let Some(r) = self.matching_read(dfs.state) {
            let frame = Frame {
                op: r,
                prev_state: dfs.state,
                alt: 0,
                forced: true,
                in_pref: false,
                skip: NONE,
            };
            return Some(match self.descend(dfs, dfs.state, frame) {
                Ok(true) => Flow::Continue,
                // Its only child was explored before and failed.
                Ok(false) => Flow::Backtrack,
                Err(outcome) => Flow::Stop(outcome),
            });
        }
        if let Some(p) = self.preferred() {
            dfs.cur.skip = p;
            dfs.cur.in_pref = true;
        }
        None
    }

    /// Tries the op at the cursor: descends into its first alternative that leads to an
    /// unexplored configuration, or moves the cursor on to the next op.
    fn scan(&mut self, dfs: &mut Dfs<'_>) -> Flow {
        let c = dfs.cur;
        if !c.in_pref && !self.node_is_call[c.node as usize] {
            // A return entry: every minimal op was tried from here. Dead end.
            return Flow::DeadEnd;
        }
        let i = if c.in_pref {
            c.skip
        } else {
            self.node_op[c.node as usize]
        };
        if i == c.skip && !c.in_pref {
            dfs.cur.node = self.next[c.node as usize];
            return Flow::Continue;
        }
        if let Err(outcome) = self.try_alternatives(dfs, i) {
            return Flow::Stop(outcome);
        }
        if !dfs.fresh {
            if dfs.cur.in_pref {
                dfs.cur.in_pref = false;
                dfs.cur.node = self.next[HEAD as usize];
            } else {
                dfs.cur.node = self.next[dfs.cur.node as usize];
            }
            dfs.cur.alt = 0;
        }
        Flow::Continue
    }

    /// Tries the alternatives of op `i` from the cursor's `alt` on, descending into the first
    /// that leads to an unexplored configuration (then `dfs.fresh` is set).
    fn try_alternatives(&mut self, dfs: &mut Dfs<'_>, i: u32) -> Result<(), Outcome2> {
        let ops = self.ops;
        let op = &ops[i as usize];
        let alts: u8 = if op.optional { 2 } else { 1 };
        if dfs.cur.alt == 0 && op.optional && self.dominated(i) {
            dfs.cur.alt = alts;
        }
        while dfs.cur.alt < alts {
            if let Some(new_state) = Self::step(op, dfs.state, dfs.cur.alt) {
                let frame = Frame {
                    op: i,
                    prev_state: dfs.state,
                    alt: dfs.cur.alt,
                    forced: false,
                    in_pref: dfs.cur.in_pref,
                    skip: dfs.cur.skip,
                };
                if self.descend(dfs, new_state, frame)? {
                    break;
                }
            }
            dfs.cur.alt += 1;
        }
        Ok(())
    }

    /// Linearizes `frame.op` next, leaving the register at `new_state`, unless that
    /// configuration was explored before (then it is undone: `Ok(false)`). `Err` once the
    /// budget of states is exhausted.
    fn descend(
        &mut self,
        dfs: &mut Dfs<'_>,
        new_state: State,
        frame: Frame,
    ) -> Result<bool, Outcome2> {
        self.lift(frame.op);
        if !dfs.memo.insert(self.memo_key(new_state)) {
            self.unlift(frame.op);
            return Ok(false);
        }
        *dfs.states += 1;
        if *dfs.states > dfs.budget {
            return Err(Outcome2::Unknown(dfs.deepest.take()));
        }
        dfs.stack.push(frame);
        dfs.state = new_state;
        dfs.fresh = true;
        Ok(true)
    }

    /// Backtracks to the most recent configuration with untried alternatives. With none left
    /// the key is not linearizable.
    fn backtrack(&mut self, dfs: &mut Dfs<'_>) -> Option<Outcome2> {
        loop {
            let Some(frame) = dfs.stack.pop() else {
                let dead_end = dfs
                    .deepest
                    .take()
                    .unwrap_or_else(|| self.dead_end(&dfs.stack, dfs.state, dfs.cur.node));
                return Some(Outcome2::NotLinearizable(dead_end));
            };
            self.unlift(frame.op);
            dfs.state = frame.prev_state;
            if !frame.forced {
                dfs.cur = Cursor {
                    node: self.call_node[frame.op as usize],
                    alt: frame.alt + 1,
                    skip: frame.skip,
                    in_pref: frame.in_pref,
                };
                return None;
            }
        }
    }

    fn dead_end(&self, stack: &[Frame], state: State, node: u32) -> DeadEnd {
        let mut candidates = Vec::new();
        let mut x = self.next[HEAD as usize];
        while x != node && self.node_is_call[x as usize] {
            candidates.push(self.node_op[x as usize]);
            x = self.next[x as usize];
        }
        DeadEnd {
            depth: stack.len(),
            state,
            candidates,
            blocker: self.node_op[node as usize],
            path: stack[stack.len().saturating_sub(PATH_TAIL)..]
                .iter()
                .map(|f| f.op)
                .collect(),
        }
    }
}

/// Checks one key.
fn check_key(key: KeyId, events: &[&Event], initial: State, limits: &Limits) -> KeyReport {
    let ops = prepare(events);
    let segments = count_segments(&ops);
    let mut states = 0u64;
    let refutation = if limits.quick_refutation {
        refute(&ops, initial)
    } else {
        None
    };
    let verdict = if ops.is_empty() {
        Verdict::Linearizable
    } else if let Some(r) = refutation {
        explain_refutation(key, &ops, initial, &r)
    } else {
        let mut search = Search::new(&ops);
        match search.run(initial, limits.max_states_per_key, &mut states) {
            Outcome2::Linearizable => Verdict::Linearizable,
            Outcome2::NotLinearizable(d) => explain(key, &ops, initial, &d, limits),
            Outcome2::Unknown(d) => Verdict::Unknown {
                reason: format!(
                    "key {key}: UNKNOWN, search budget of {} states exhausted ({} ops in {} segments; deepest partial linearization placed {} ops{})",
                    limits.max_states_per_key,
                    ops.len(),
                    segments,
                    d.as_ref().map_or(0, |d| d.depth),
                    d.as_ref()
                        .map(|d| format!(", stuck before {}", ops[d.blocker as usize].ev))
                        .unwrap_or_default()
                ),
            },
        }
    };
    KeyReport {
        key,
        events: events.len(),
        ops: ops.len(),
        segments,
        states_explored: states,
        verdict,
    }
}

fn explain_refutation(key: KeyId, ops: &[KeyOp<'_>], initial: State, r: &Refutation) -> Verdict {
    let read = &ops[r.read as usize];
    let Kind::Read(v) = read.kind else {
        unreachable!("refutations are about reads")
    };
    let mut s = format!(
        "key {key}: NOT LINEARIZABLE (initial state {}). {} cannot be linearized: ",
        fmt_value(initial),
        read.ev
    );
    match (r.writer, r.killer) {
        (_, None) => {
            let _ = write!(
                s,
                "no operation invoked before it returned writes {}, which is not the initial state.",
                fmt_value(v)
            );
        }
        (Some(w), Some(k)) => {
            let _ = write!(
                s,
                "every write of {v} invoked before it returned was overwritten before it was invoked; the latest, {}, was followed by {}, which completed before the Get started{}.",
                ops[w as usize].ev,
                ops[k as usize].ev,
                if initial == v { " (the initial state was overwritten too)" } else { "" },
                v = fmt_value(v),
            );
        }
        (None, Some(k)) => {
            let _ = write!(
                s,
                "{} is the initial state, but it was overwritten by {}, which completed before the Get started, and nothing invoked in time writes it again.",
                fmt_value(v),
                ops[k as usize].ev
            );
        }
    }
    let mut window: Vec<u32> = [Some(r.read), r.writer, r.killer]
        .into_iter()
        .flatten()
        .collect();
    window.sort_unstable_by_key(|&i| (ops[i as usize].call, i));
    let window: Vec<Event> = window
        .into_iter()
        .map(|i| ops[i as usize].ev.clone())
        .collect();
    let _ = write!(s, "\n  conflicting window ({} events):", window.len());
    for e in &window {
        let _ = write!(s, "\n    {e}");
    }
    Verdict::NotLinearizable {
        explanation: s,
        unplaceable: vec![read.ev.clone()],
        window,
    }
}

fn explain(key: KeyId, ops: &[KeyOp<'_>], initial: State, d: &DeadEnd, limits: &Limits) -> Verdict {
    let mut s = format!(
        "key {key}: NOT LINEARIZABLE (initial state {}). At most {} of {} ops can be linearized; the first such order found leaves the register at {} and none of the pending ops fits.",
        fmt_value(initial),
        d.depth,
        ops.len(),
        fmt_value(d.state)
    );
    describe_dead_end(&mut s, ops, d);
    let window = dead_end_window(&mut s, ops, initial, d);
    let window = write_window(&mut s, ops, window, limits);
    Verdict::NotLinearizable {
        explanation: s,
        unplaceable: d
            .candidates
            .iter()
            .map(|&i| ops[i as usize].ev.clone())
            .collect(),
        window,
    }
}

/// Appends the tail of the longest partial linearization and the ops that cannot follow it.
fn describe_dead_end(s: &mut String, ops: &[KeyOp<'_>], d: &DeadEnd) {
    if !d.path.is_empty() {
        let _ = write!(s, "\n  last ops of the longest partial linearization:");
        for &i in &d.path {
            let note = if ops[i as usize].optional {
                " (failed write, placed here)"
            } else {
                ""
            };
            let _ = write!(s, "\n    {}{note}", ops[i as usize].ev);
        }
    }
    let _ = write!(
        s,
        "\n  cannot be placed next (register is {}):",
        fmt_value(d.state)
    );
    for &i in &d.candidates {
        let _ = write!(s, "\n    {}", ops[i as usize].ev);
    }
    let b = &ops[d.blocker as usize];
    if d.candidates.len() > 1 {
        let _ = write!(
            s,
            "\n  (all were invoked before client {}'s {:?} returned at {}ns, so one of them had to be placed next)",
            b.ev.client, b.ev.op, b.ret
        );
    }
}

/// The window: the tail of the partial linearization, the unplaceable ops, and the latest
/// writes (invoked before the blocker returned) of the values they expected, in invocation
/// order. Notes a value nothing wrote in time.
fn dead_end_window(s: &mut String, ops: &[KeyOp<'_>], initial: State, d: &DeadEnd) -> Vec<u32> {
    let b = &ops[d.blocker as usize];
    let mut window: Vec<u32> = d.path.iter().chain(&d.candidates).copied().collect();
    for &c in &d.candidates {
        if let Kind::Read(v) = ops[c as usize].kind {
            let writers: Vec<u32> = (0..ops.len() as u32)
                .filter(|&j| {
                    ops[j as usize].kind.written() == Some(v) && ops[j as usize].call <= b.ret
                })
                .collect();
            if writers.is_empty() && v != initial {
                let _ = write!(
                    s,
                    "\n  no operation invoked before {}ns writes {} (and it is not the initial state)",
                    b.ret,
                    fmt_value(v)
                );
            }
            window.extend(writers.iter().rev().take(2));
        }
    }
    window.sort_unstable_by_key(|&i| (ops[i as usize].call, i));
    window.dedup();
    window
}

/// Appends the window (at most `limits.max_window_events` of its events) and returns them.
fn write_window(
    s: &mut String,
    ops: &[KeyOp<'_>],
    mut window: Vec<u32>,
    limits: &Limits,
) -> Vec<Event> {
    let total = window.len();
    window.truncate(limits.max_window_events.max(1));
    let window: Vec<Event> = window
        .into_iter()
        .map(|i| ops[i as usize].ev.clone())
        .collect();
    let (lo, hi) = window.iter().fold((u64::MAX, 0), |(lo, hi), e| {
        (lo.min(e.invoke_ns), hi.max(e.response_ns))
    });
    let _ = write!(
        s,
        "\n  conflicting window ({total} events, {lo}ns..{hi}ns):"
    );
    for e in &window {
        let _ = write!(s, "\n    {e}");
    }
    if total > window.len() {
        let _ = write!(s, "\n    ... {} more", total - window.len());
    }
    window
}

/// Groups events by key and checks the keys in parallel.
pub(crate) fn check_all(
    events: &[Event],
    initial: &dyn Fn(KeyId) -> Option<ValueId>,
    limits: &Limits,
) -> Report {
    let mut by_key: HashMap<KeyId, Vec<&Event>> = HashMap::new();
    for e in events {
        by_key.entry(e.key).or_default().push(e);
    }
    let mut keys: Vec<(KeyId, Vec<&Event>, State)> = by_key
        .into_iter()
        .map(|(k, evs)| (k, evs, initial(k)))
        .collect();
    keys.sort_unstable_by_key(|k| k.0);
    // Biggest keys first, for load balance.
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(keys[i].1.len()));

    let threads = match limits.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .clamp(1, keys.len().max(1));
    let results: Mutex<Vec<Option<KeyReport>>> = Mutex::new(vec![None; keys.len()]);
    let next = AtomicUsize::new(0);
    let work = || {
        while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
            let (key, evs, init) = &keys[i];
            let report = check_key(*key, evs, *init, limits);
            results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(report);
        }
    };
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(work);
            }
        });
    }
    let keys: Vec<KeyReport> = results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .map(|r| r.expect("every key was checked"))
        .collect();
    Report {
        states_explored: keys.iter().map(|k| k.states_explored).sum(),
        events: events.len(),
        keys,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(op: Op, outcome: Outcome, i: u64, r: u64) -> Event {
        Event {
            client: 0,
            key: 0,
            op,
            outcome,
            invoke_ns: i,
            response_ns: r,
        }
    }

    #[test]
    fn memo_key_is_small_and_exact() {
        // Op 0 is a long write overlapping 199 short sequential puts.
        let mut events = vec![ev(Op::Put(0), Outcome::Ok(None), 0, 10_000)];
        events.extend((1..200).map(|i| ev(Op::Put(i), Outcome::Ok(None), 10 * i, 10 * i + 5)));
        let refs: Vec<&Event> = events.iter().collect();
        let ops = prepare(&refs);
        let mut s = Search::new(&ops);
        for i in 1..=100 {
            s.lift(i);
        }
        let a = s.memo_key(None);
        assert_eq!((a.hw, &*a.pending), (101, &[0][..]));
        s.lift(102);
        let b = s.memo_key(None);
        assert_eq!((b.hw, &*b.pending), (103, &[0, 101][..]));
        s.lift(101);
        let c = s.memo_key(None);
        assert_eq!((c.hw, &*c.pending), (103, &[0][..]));
        assert!(a != b && b != c && a != c);
        assert!(c != s.memo_key(Some(1)), "the state is part of the key");
        s.unlift(101);
        s.unlift(102);
        assert!(a == s.memo_key(None), "unlift restores the key");
        s.lift(0);
        let d = s.memo_key(None);
        assert_eq!((d.hw, d.pending.len()), (101, 0));
    }

    #[test]
    fn failed_writes_are_bounded_by_their_last_observation() {
        let events = [
            ev(Op::Put(1), Outcome::Failed, 10, 11),
            ev(Op::Get, Outcome::Ok(Some(1)), 20, 30),
            ev(Op::Get, Outcome::Ok(Some(1)), 40, 50),
            ev(Op::Put(2), Outcome::Failed, 60, 61), // never observed: dropped
            ev(Op::Delete, Outcome::Failed, 60, 61), // absent only read before: dropped
            ev(Op::Get, Outcome::Ok(None), 0, 5),
            ev(Op::Get, Outcome::Failed, 0, 5), // dropped
        ];
        let refs: Vec<&Event> = events.iter().collect();
        let ops = prepare(&refs);
        assert_eq!(ops.len(), 4);
        let failed: Vec<_> = ops.iter().filter(|o| o.optional).collect();
        assert_eq!(failed.len(), 1);
        assert_eq!((failed[0].call, failed[0].ret), (10, 50));
        // Quiescent points: [0,5] | [10..50] with the bounded failed put.
        assert_eq!(count_segments(&ops), 2);
    }

    /// A failed write of an expiring value stays open until its expiry (which may be what
    /// empties the key), not to the end of the history; one nothing observes is dropped. Open
    /// to the end, ~25 failed writes of a hot key made a 107-op history exhaust a budget of
    /// 20 million states (CI, 2026-11-28).
    #[test]
    fn failed_writes_of_expiring_values_are_bounded_by_their_expiry() {
        let events = [
            ev(Op::Put(1), Outcome::Ok(None), 0, 10),
            ev(Op::Put(2), Outcome::Failed, 20, 30),
            ev(Op::Expire(2), Outcome::Ok(None), 40, 45),
            ev(Op::Put(3), Outcome::Failed, 50, 55), // never observed: dropped
            ev(Op::Expire(3), Outcome::Ok(None), 20, 25), // before the write: observes nothing
            ev(Op::Get, Outcome::Ok(None), 60, 70),
            ev(Op::Put(4), Outcome::Ok(None), 80, 90),
            ev(Op::Get, Outcome::Ok(Some(4)), 100, 110),
        ];
        let refs: Vec<&Event> = events.iter().collect();
        let ops = prepare(&refs);
        let failed: Vec<_> = ops.iter().filter(|o| o.optional).collect();
        assert_eq!(failed.len(), 1);
        assert_eq!((failed[0].call, failed[0].ret), (20, 45));
        assert_eq!(count_segments(&ops), 5);
        // The absent Get is explained only by the failed write taking effect and expiring.
        assert!(verdict(&events));
        let no_expiry: Vec<Event> = events
            .iter()
            .filter(|e| e.op != Op::Expire(2))
            .cloned()
            .collect();
        assert!(!verdict(&no_expiry));
    }

    fn verdict(events: &[Event]) -> bool {
        crate::check(events, |_| None, &Limits::default()).is_ok()
    }

    /// An expiry empties the key if it holds the expiring value, at the expiry's instant:
    /// a read after it that still sees the value is a violation, one before it that does not
    /// is too, and an expiry of a value since overwritten changes nothing.
    #[test]
    fn expiries_empty_the_key_at_their_instant_only_if_it_holds_their_value() {
        let put1 = ev(Op::Put(1), Outcome::Ok(None), 0, 10);
        let exp1 = ev(Op::Expire(1), Outcome::Ok(None), 50, 50);
        let get = |v, i, r| ev(Op::Get, Outcome::Ok(v), i, r);
        // Before: present; after: absent.
        assert!(verdict(&[
            put1.clone(),
            get(Some(1), 20, 30),
            exp1.clone(),
            get(None, 60, 70)
        ]));
        // After, still present: rejected (the refutation and the search both).
        let stale = [put1.clone(), exp1.clone(), get(Some(1), 60, 70)];
        assert!(!verdict(&stale));
        let no_quick = Limits {
            quick_refutation: false,
            ..Limits::default()
        };
        assert!(!crate::check(&stale, |_| None, &no_quick).is_ok());
        // Before, already absent: rejected.
        assert!(!verdict(&[put1.clone(), get(None, 20, 30), exp1.clone()]));
        // Overlapping the instant: either answer.
        assert!(verdict(&[put1.clone(), exp1.clone(), get(Some(1), 40, 60)]));
        assert!(verdict(&[put1.clone(), exp1.clone(), get(None, 40, 60)]));
        // The value was overwritten before its expiry: the new one stays.
        let put2 = ev(Op::Put(2), Outcome::Ok(None), 20, 30);
        assert!(verdict(&[
            put1.clone(),
            put2.clone(),
            exp1.clone(),
            get(Some(2), 60, 70)
        ]));
        assert!(!verdict(&[
            put1.clone(),
            put2.clone(),
            exp1.clone(),
            get(None, 60, 70)
        ]));
        assert!(!crate::check(&[put1, put2, exp1, get(None, 60, 70)], |_| None, &no_quick).is_ok());
    }
}
