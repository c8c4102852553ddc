//! Shared helpers for the integration tests: event builders, a simulator of linearizable
//! concurrent histories, and a brute-force reference checker.
#![allow(dead_code)]

use std::collections::HashMap;

use nessie_check::{Cond, Event, KeyId, Op, Outcome, ValueId};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub fn ev(
    client: u32,
    key: KeyId,
    op: Op,
    outcome: Outcome,
    invoke_ns: u64,
    response_ns: u64,
) -> Event {
    Event {
        client,
        key,
        op,
        outcome,
        invoke_ns,
        response_ns,
    }
}
pub fn get(client: u32, key: KeyId, v: Option<ValueId>, i: u64, r: u64) -> Event {
    ev(client, key, Op::Get, Outcome::Ok(v), i, r)
}
pub fn put(client: u32, key: KeyId, v: ValueId, i: u64, r: u64) -> Event {
    ev(client, key, Op::Put(v), Outcome::Ok(None), i, r)
}
pub fn del(client: u32, key: KeyId, i: u64, r: u64) -> Event {
    ev(client, key, Op::Delete, Outcome::Ok(None), i, r)
}
pub fn failed_put(client: u32, key: KeyId, v: ValueId, i: u64, r: u64) -> Event {
    ev(client, key, Op::Put(v), Outcome::Failed, i, r)
}
pub fn failed_del(client: u32, key: KeyId, i: u64, r: u64) -> Event {
    ev(client, key, Op::Delete, Outcome::Failed, i, r)
}

/// Configuration of [`simulate`].
#[derive(Clone, Debug)]
pub struct Sim {
    pub clients: u32,
    pub keys: u64,
    pub ops_per_client: usize,
    /// Max idle time between a client's operations.
    pub max_gap: u64,
    /// Max time from invocation to linearization point, and from there to response.
    pub max_half: u64,
    pub put_pct: u32,
    pub delete_pct: u32,
    /// Percentage of operations that fail (a failed write takes effect half the time).
    pub fail_pct: u32,
    pub seed: u64,
}

/// Initial state used with simulated histories: even keys start present.
pub fn sim_initial(key: KeyId) -> Option<ValueId> {
    key.is_multiple_of(2).then_some(1_000_000_000 + key)
}

/// A linearizable history: every client issues sequential operations; each operation
/// takes effect at a random point inside its interval, in the order of those points.
pub fn simulate(cfg: &Sim) -> Vec<Event> {
    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    struct Pending {
        client: u32,
        key: KeyId,
        kind: u32,
        fail: bool,
        call: u64,
        lp: u64,
        ret: u64,
    }
    let mut pending = Vec::with_capacity(cfg.clients as usize * cfg.ops_per_client);
    for client in 0..cfg.clients {
        let mut t = rng.gen_range(0..=cfg.max_gap);
        for _ in 0..cfg.ops_per_client {
            let call = t + rng.gen_range(0..=cfg.max_gap);
            let lp = call + rng.gen_range(0..=cfg.max_half);
            let ret = lp + rng.gen_range(0..=cfg.max_half);
            t = ret + 1;
            let r = rng.gen_range(0..100);
            let kind = if r < cfg.put_pct {
                1
            } else if r < cfg.put_pct + cfg.delete_pct {
                2
            } else {
                0
            };
            pending.push(Pending {
                client,
                key: rng.gen_range(0..cfg.keys),
                kind,
                fail: rng.gen_range(0..100) < cfg.fail_pct,
                call,
                lp,
                ret,
            });
        }
    }
    pending.sort_by_key(|p| (p.lp, p.client));
    let mut state: HashMap<KeyId, Option<ValueId>> = HashMap::new();
    let mut next_value = 1;
    let mut events = Vec::with_capacity(pending.len());
    for p in pending {
        let cur = state.entry(p.key).or_insert_with(|| sim_initial(p.key));
        let (op, outcome) = match p.kind {
            0 => (
                Op::Get,
                if p.fail {
                    Outcome::Failed
                } else {
                    Outcome::Ok(*cur)
                },
            ),
            1 => {
                let v = next_value;
                next_value += 1;
                if !p.fail || rng.gen_bool(0.5) {
                    *cur = Some(v);
                }
                (
                    Op::Put(v),
                    if p.fail {
                        Outcome::Failed
                    } else {
                        Outcome::Ok(None)
                    },
                )
            }
            _ => {
                if !p.fail || rng.gen_bool(0.5) {
                    *cur = None;
                }
                (
                    Op::Delete,
                    if p.fail {
                        Outcome::Failed
                    } else {
                        Outcome::Ok(None)
                    },
                )
            }
        };
        events.push(ev(p.client, p.key, op, outcome, p.call, p.ret));
    }
    events.sort_by_key(|e| (e.invoke_ns, e.client));
    events
}

/// Makes one Get in the second half of `events` return a value that was overwritten
/// before it was invoked (its only write completed, then another completed write of the
/// key completed before the Get began). Returns the Get's index.
pub fn inject_stale_read(events: &mut [Event]) -> usize {
    let completed_write = |e: &Event| e.op != Op::Get && e.outcome != Outcome::Failed;
    let (g, v) = (events.len() / 2..events.len())
        .filter(|&g| events[g].op == Op::Get && events[g].outcome != Outcome::Failed)
        .find_map(|g| {
            let ge = &events[g];
            let same_key = |e: &&Event| e.key == ge.key && completed_write(e);
            let w2 = events[..g]
                .iter()
                .filter(same_key)
                .rev()
                .find(|w2| w2.response_ns < ge.invoke_ns)?;
            let w = events[..g]
                .iter()
                .filter(same_key)
                .rev()
                .find(|w| matches!(w.op, Op::Put(_)) && w.response_ns < w2.invoke_ns)?;
            let Op::Put(v) = w.op else { unreachable!() };
            Some((g, v))
        })
        .expect("a stale-read candidate");
    events[g].outcome = Outcome::Ok(Some(v));
    g
}

#[derive(Clone, Copy)]
/// One op of a history as the brute-force reference sees it.
struct B {
    call: u64,
    ret: Option<u64>, // None = never returned
    read: bool,
    value: Option<ValueId>,
    /// A conditional write's condition; with `unmet`, the op only observes that it failed.
    cond: Option<Cond>,
    unmet: bool,
    /// An expiry of this value: empties the state if it holds it, else changes nothing.
    expires: Option<ValueId>,
}
impl B {
    /// The state after this op in `state`, if it can be placed there.
    fn step(&self, state: Option<ValueId>) -> Option<Option<ValueId>> {
        match *self {
            B {
                expires: Some(v), ..
            } => Some(if state == Some(v) { None } else { state }),
            B {
                read: true, value, ..
            } => (value == state).then_some(state),
            // An unmet version condition proves nothing (`Cond::Is`).
            B {
                unmet: true,
                cond: Some(c),
                ..
            } => (matches!(c, Cond::Is(_)) || !c.holds(state)).then_some(state),
            B { unmet: true, .. } => None,
            B { cond: Some(c), .. } if !c.holds(state) => None,
            B { value, .. } => Some(value),
        }
    }
}

/// Reference checker for tiny single-key histories: tries every subset of failed writes
/// and every order consistent with real time.
pub fn brute_force(events: &[Event], initial: Option<ValueId>) -> bool {
    let mut mandatory = Vec::new();
    let mut optional = Vec::new();
    for e in events {
        let expires = match e.op {
            Op::Expire(v) => Some(v),
            _ => None,
        };
        let (read, value, cond) = match e.op {
            Op::Get => match e.outcome {
                Outcome::Ok(v) => (true, v, None),
                _ => continue,
            },
            Op::Put(v) => (false, Some(v), None),
            Op::Delete => (false, None, None),
            Op::PutIf(v, c) => (false, Some(v), Some(c)),
            Op::DeleteIf(c) => (false, None, Some(c)),
            Op::Expire(_) => (false, None, None),
        };
        let failed = e.outcome == Outcome::Failed;
        let b = B {
            call: e.invoke_ns,
            ret: (!failed).then_some(e.response_ns.max(e.invoke_ns)),
            read,
            value,
            cond,
            unmet: e.outcome == Outcome::Unmet,
            expires,
        };
        if failed {
            optional.push(b)
        } else {
            mandatory.push(b)
        }
    }
    fn dfs(ops: &[B], remaining: u32, state: Option<ValueId>) -> bool {
        if remaining == 0 {
            return true;
        }
        for o in 0..ops.len() {
            if remaining & (1 << o) == 0 {
                continue;
            }
            let must_wait = (0..ops.len()).any(|u| {
                u != o && remaining & (1 << u) != 0 && ops[u].ret.is_some_and(|r| r < ops[o].call)
            });
            if must_wait {
                continue;
            }
            let Some(next) = ops[o].step(state) else {
                continue;
            };
            if dfs(ops, remaining & !(1 << o), next) {
                return true;
            }
        }
        false
    }
    for mask in 0u32..(1 << optional.len()) {
        let mut ops = mandatory.clone();
        ops.extend(
            optional
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, b)| *b),
        );
        if dfs(&ops, (1u32 << ops.len()) - 1, initial) {
            return true;
        }
    }
    false
}
