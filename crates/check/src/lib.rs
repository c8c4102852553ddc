//! History recording and linearizability checking for Nessie's key-value histories.
//!
//! Stress tests record every `GET`/`PUT`/`DELETE` a client thread issues, with the
//! invocation and response time taken from one shared monotonic clock ([`History`],
//! [`Recorder`]). Afterwards [`check`] decides whether the history is linearizable.
//!
//! # Model
//!
//! Every key is an independent register whose state is `Option<ValueId>` (`None` =
//! absent, initially `initial(key)`): `Put(v)` sets `Some(v)`, `Delete` sets `None`,
//! `Get` must return the current state. `PutIf(v, c)` and `DeleteIf(c)` do the same if the
//! condition `c` holds in the state (outcome `Ok`), and nothing if it does not (`Unmet`,
//! which is checked like a read; see [`Cond::Is`] for the one condition it cannot judge). Linearizability is *P-compositional*: a history
//! is linearizable iff its restriction to every key is, so each key is checked on its own
//! (in parallel across keys).
//!
//! Real-time order: operation `a` precedes `b` iff `a.response_ns < b.invoke_ns`.
//! Equal timestamps count as concurrent (the conservative choice: it can only hide a
//! violation at clock resolution, never invent one). An event whose response precedes its
//! invocation is treated as responding at its invocation time.
//!
//! Failed operations ([`Outcome::Failed`]): a failed `Get` tells nothing and is dropped;
//! a failed `Put`/`Delete` may take effect at any single instant after its invocation, or
//! never. See [`check`] for how such never-completing operations are kept from defeating
//! the search.
//!
//! # Algorithm
//!
//! See [`check`]: Wing & Gong's search with Lowe's just-in-time linearization and
//! Porcupine's memoization, with a compact memo key that makes the search split itself at
//! quiescent points.

mod record;
mod refute;
mod report;
mod search;

pub use record::{Clock, History, Invocation, Recorder};
pub use report::{KeyReport, Report, Verdict};

use serde::{Deserialize, Serialize};

/// Identifies a key (one independent register).
pub type KeyId = u64;
/// Identifies a written value. Tests make every written value unique, which makes
/// violations easy to see, but the checker is correct without that assumption.
pub type ValueId = u64;

/// An operation on one key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Op {
    /// Read the key.
    Get,
    /// Write the value.
    Put(ValueId),
    /// Remove the key.
    Delete,
    /// Write the value if the condition holds ([`Outcome::Unmet`] if it did not).
    PutIf(ValueId, Cond),
    /// Remove the key if the condition holds ([`Outcome::Unmet`] if it did not).
    DeleteIf(Cond),
    /// The item written as this value expires: at one instant between the event's invocation
    /// and response (the expiry time, give or take the error of mapping the store's clock onto
    /// the history's, or as late as the write's response if the write took effect after
    /// it), the key becomes absent if it holds the value, and is unchanged otherwise. Not a
    /// client's call: a history adds one per write with an expiry (outcome `Ok(None)`).
    Expire(ValueId),
}

/// The condition of a conditional write, on the register's state.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Cond {
    /// The key is absent.
    Absent,
    /// The key is present.
    Present,
    /// The key holds this value. The store conditions on a *version*, which changes with
    /// every write but may also change without one (a MIGRATE copies the entry): so when
    /// values are unique, a write stored under this condition proves the state, and one
    /// unmet proves nothing.
    Is(ValueId),
}

impl Cond {
    /// Whether the condition holds in `state`.
    pub fn holds(self, state: Option<ValueId>) -> bool {
        match self {
            Cond::Absent => state.is_none(),
            Cond::Present => state.is_some(),
            Cond::Is(v) => state == Some(v),
        }
    }

    /// Whether an unmet condition is consistent with `state` (see [`Cond::Is`]).
    pub(crate) fn may_fail(self, state: Option<ValueId>) -> bool {
        matches!(self, Cond::Is(_)) || !self.holds(state)
    }
}

impl std::fmt::Display for Cond {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cond::Absent => write!(f, "absent"),
            Cond::Present => write!(f, "present"),
            Cond::Is(v) => write!(f, "={v}"),
        }
    }
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Outcome {
    /// Completed successfully. For Get: the value read (None = key absent). For
    /// Put/Delete: None (a payload is ignored). For PutIf/DeleteIf: the condition held and
    /// the write took effect.
    Ok(Option<ValueId>),
    /// A conditional write whose condition did not hold: it changed nothing.
    Unmet,
    /// Returned an error: the operation may or may not have taken effect (for Put/Delete
    /// it is treated as possibly taking effect at any time after invocation, never
    /// completing); failed Gets carry no information and are dropped.
    Failed,
}

/// One completed call, as recorded by a client thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The client (thread) that issued the call; only used in explanations.
    pub client: u32,
    /// The key the call addressed.
    pub key: KeyId,
    /// What was called.
    pub op: Op,
    /// How it ended.
    pub outcome: Outcome,
    /// Nanoseconds since the history's clock origin, taken before the call started.
    pub invoke_ns: u64,
    /// Nanoseconds since the history's clock origin, taken after the call returned.
    pub response_ns: u64,
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "client {} key {}: ", self.client, self.key)?;
        match (&self.op, &self.outcome) {
            (Op::Get, Outcome::Ok(v)) => write!(f, "Get -> {}", fmt_value(*v))?,
            (Op::Get, Outcome::Failed) => write!(f, "Get -> FAILED")?,
            (Op::Put(v), Outcome::Ok(_)) => write!(f, "Put({v}) ok")?,
            (Op::Put(v), Outcome::Failed) => write!(f, "Put({v}) FAILED")?,
            (Op::Delete, Outcome::Ok(_)) => write!(f, "Delete ok")?,
            (Op::Delete, Outcome::Failed) => write!(f, "Delete FAILED")?,
            (Op::PutIf(v, c), Outcome::Ok(_)) => write!(f, "PutIf({v}, {c}) stored")?,
            (Op::PutIf(v, c), Outcome::Unmet) => write!(f, "PutIf({v}, {c}) unmet")?,
            (Op::PutIf(v, c), Outcome::Failed) => write!(f, "PutIf({v}, {c}) FAILED")?,
            (Op::DeleteIf(c), Outcome::Ok(_)) => write!(f, "DeleteIf({c}) stored")?,
            (Op::DeleteIf(c), Outcome::Unmet) => write!(f, "DeleteIf({c}) unmet")?,
            (Op::DeleteIf(c), Outcome::Failed) => write!(f, "DeleteIf({c}) FAILED")?,
            (Op::Expire(v), _) => write!(f, "Expire({v})")?,
            (op, Outcome::Unmet) => write!(f, "{op:?} unmet (only conditional writes can be)")?,
        }
        write!(f, " [{}ns..{}ns]", self.invoke_ns, self.response_ns)
    }
}

/// Formats a register state: `Some(v)` as `v`, `None` as `absent`.
pub(crate) fn fmt_value(v: Option<ValueId>) -> String {
    match v {
        Some(v) => format!("{v}"),
        None => "absent".to_string(),
    }
}

/// Search limits for [`check`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Maximum number of distinct search states (memo entries) explored for one key.
    /// When exceeded the key is reported [`Verdict::Unknown`], which is not a pass.
    /// Memory use is roughly 100 bytes per state.
    pub max_states_per_key: u64,
    /// Worker threads used to check keys in parallel; 0 = available parallelism.
    pub threads: usize,
    /// Maximum number of events quoted in one violation's window.
    pub max_window_events: usize,
    /// Before searching a key, look for a Get that provably cannot be linearized (its
    /// value was never written in time, or every write of it was overwritten before the
    /// Get began). Sound, O(n log n), and it finds stale reads that an exhaustive search
    /// of a long concurrent key could not finish refuting. Turn off to force the search.
    pub quick_refutation: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_states_per_key: 2_000_000,
            threads: 0,
            max_window_events: 24,
            quick_refutation: true,
        }
    }
}

impl Limits {
    /// Default limits with a different per-key state budget.
    pub fn with_max_states(max_states_per_key: u64) -> Self {
        Limits {
            max_states_per_key,
            ..Limits::default()
        }
    }
}

/// Checks `events` for linearizability, key by key.
///
/// `initial(key)` gives the register's state before the history (`None` = absent).
///
/// # Search (per key)
///
/// *Preparation.* Failed Gets are dropped. A failed Put/Delete `w` that writes state `s`
/// is optional (it may take effect or be a no-op) and nominally never returns. Left like
/// that it would stay pending to the end of the history, so no point after it would be
/// quiescent and the search could try to place it anywhere. It is bounded instead: if
/// `w` takes effect and matters, some op `g` that observes `s` is linearized after `w`
/// with only Gets and expiries of other values (which leave `s` as it is) between them:
/// a Get that returns `s`, or the expiry of `s`'s value (it empties the key only if the
/// key holds that value). So `w` lies before `g`'s response. Hence `w` gets the
/// return time `R` = the latest response of such an op (it is dropped when
/// `R < w.invoke` or there is none), and in the search it may be placed either
/// effectively or as a no-op. Any linearization of the original history can be turned
/// into one obeying these bounds (drop or keep `w` where it was; everything invoked after
/// `R` already follows `g`), and every bounded linearization is a linearization of the
/// original, so the verdict is unchanged. Failed Puts of unique values are thereby
/// bounded by their last observation; a failed Delete stays open until the last Get
/// that returned absent, which can be far away: that widens the search (the delete is a
/// candidate all along), not the verdict. A conditional write observes the state as a Get
/// does, so on a key with conditional writes every failed write stays open to the end of
/// the history.
///
/// *Just-in-time linearization (Wing & Gong, Lowe).* Calls and returns are sorted by time
/// into a doubly linked list. The search repeatedly linearizes a *minimal* operation:
/// one whose call precedes the first return still in the list (an op that returned
/// earlier must be placed first). Placing an op unlinks its call and return (dancing
/// links, so backtracking relinks them in O(1)); when the scan reaches a return entry no
/// op can be placed and the search backtracks. The history is linearizable iff the list
/// can be emptied.
///
/// *Memoization (Porcupine).* A configuration is (set of linearized ops, register
/// state); the future depends only on that, so a configuration seen before is never
/// explored again. With ops numbered by invocation, the set is stored as
/// `(hw, pending)`: `hw` is one past the highest linearized op and `pending` lists the
/// unlinearized ops below `hw` (those are exactly the first entries of the list, so the
/// key is built in O(concurrency)). At a quiescent point `pending` is empty and the key
/// degenerates to `(segment start, state)`: this is what splitting the history at
/// quiescent points buys (memory and hashing proportional to concurrency, not to history
/// length), without giving up backtracking into an earlier segment when a later one needs
/// a different end state. A long or failed op only adds itself to `pending`.
///
/// *Pruning and ordering.* (1) A minimal Get that returns the current state is placed
/// immediately and is the only child tried: in any completion it can be moved to the
/// front. (2) Among minimal optional ops with the same effect, only the one with the
/// earliest bound `R` is tried: exchanging two such ops in any linearization yields
/// another valid one. (3) Candidates are tried in a guided order: first the op whose
/// return is earliest (or, if that is a Get of `v`, a write of `v`), then the others in
/// invocation order. (1) and (2) lose no linearization; (3) only changes the order.
///
/// *Quick refutation.* Before searching, each key is scanned for a Get with a short
/// certificate of impossibility (value never written in time, or every write of it
/// overwritten before the Get began; see [`Limits::quick_refutation`]). Such a key is
/// reported with a three-event window and is not searched.
///
/// *Diagnosis.* On failure the deepest dead end (most ops linearized) is reported: the
/// register state there, the last ops of that partial linearization, and the pending
/// ops, all Gets inconsistent with the state, that could not be placed.
pub fn check(
    events: &[Event],
    initial: impl Fn(KeyId) -> Option<ValueId>,
    limits: &Limits,
) -> Report {
    search::check_all(events, &initial, limits)
}
