//! Property tests: histories built around a known linearization are accepted, a single
//! impossible read is rejected, and on tiny arbitrary histories the checker agrees with
//! a brute-force enumeration of all orders.

mod common;

use common::*;
use nessie_check::{check, Cond, Event, KeyId, Limits, Op, Outcome, ValueId, Verdict};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::ValueTree;

const NEVER_WRITTEN: ValueId = u64::MAX - 1;

fn initial(key: KeyId) -> Option<ValueId> {
    (key == 0).then_some(999_000)
}

#[derive(Clone, Debug)]
struct Step {
    key: KeyId,
    kind: u8,
    client: u32,
    before: u64,
    after: u64,
    fail: u8,
}

fn steps(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (0..3u64, 0..10u8, 0..4u32, 0..60u64, 0..60u64, 0..12u8).prop_map(
            |(key, kind, client, before, after, fail)| Step {
                key,
                kind,
                client,
                before,
                after,
                fail,
            },
        ),
        len,
    )
}

/// Executes the steps sequentially (step `i` takes effect at time `100 + 10 i`) and gives
/// each op an interval around that point, so intervals overlap at random.
fn execute(steps: &[Step]) -> Vec<Event> {
    let mut state: std::collections::HashMap<KeyId, Option<ValueId>> = Default::default();
    let mut events = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let lp = 100 + 10 * i as u64;
        let cur = state.entry(s.key).or_insert_with(|| initial(s.key));
        let failed = s.fail == 0;
        let takes_effect = !failed || s.before % 2 == 0;
        let (op, outcome) = match s.kind {
            0..=4 => (
                Op::Get,
                if failed {
                    Outcome::Failed
                } else {
                    Outcome::Ok(*cur)
                },
            ),
            5..=7 => {
                let v = i as u64 + 1;
                if takes_effect {
                    *cur = Some(v);
                }
                (
                    Op::Put(v),
                    if failed {
                        Outcome::Failed
                    } else {
                        Outcome::Ok(None)
                    },
                )
            }
            _ => {
                if takes_effect {
                    *cur = None;
                }
                (
                    Op::Delete,
                    if failed {
                        Outcome::Failed
                    } else {
                        Outcome::Ok(None)
                    },
                )
            }
        };
        events.push(ev(
            s.client,
            s.key,
            op,
            outcome,
            lp - s.before,
            lp + s.after,
        ));
    }
    events
}

fn ok_gets(events: &[Event]) -> Vec<usize> {
    (0..events.len())
        .filter(|&i| events[i].op == Op::Get && matches!(events[i].outcome, Outcome::Ok(_)))
        .collect()
}

fn limits(quick_refutation: bool) -> Limits {
    Limits {
        quick_refutation,
        ..Limits::default()
    }
}

/// Asserts that exactly `key` is proven non-linearizable, with and without the quick
/// refutation.
fn assert_only_key_rejected(events: &[Event], key: KeyId) -> Result<(), TestCaseError> {
    for quick in [true, false] {
        let report = check(events, initial, &limits(quick));
        prop_assert!(!report.is_ok());
        for k in &report.keys {
            if k.key == key {
                prop_assert!(
                    matches!(k.verdict, Verdict::NotLinearizable { .. }),
                    "{}",
                    report
                );
            } else {
                prop_assert!(k.is_ok(), "{}", report);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn generated_linearizable_histories_are_accepted(steps in steps(1..120)) {
        let events = execute(&steps);
        for quick in [true, false] {
            let report = check(&events, initial, &limits(quick));
            prop_assert!(report.is_ok(), "{}", report);
        }
    }

    #[test]
    fn a_read_of_a_never_written_value_is_rejected(steps in steps(1..120), pick in any::<Index>()) {
        let mut events = execute(&steps);
        let gets = ok_gets(&events);
        prop_assume!(!gets.is_empty());
        let g = gets[pick.index(gets.len())];
        events[g].outcome = Outcome::Ok(Some(NEVER_WRITTEN));
        assert_only_key_rejected(&events, events[g].key)?;
    }

    /// A Get returns a value `v` whose (unique, completed) write was followed in real
    /// time by another completed write that returned before the Get was invoked.
    #[test]
    fn a_stale_read_is_rejected(steps in steps(30..120), pick in any::<Index>()) {
        let mut events = execute(&steps);
        let completed_write = |e: &Event| e.op != Op::Get && e.outcome != Outcome::Failed;
        let mut candidates = Vec::new();
        for g in ok_gets(&events) {
            let ge = &events[g];
            for w in events.iter().filter(|w| w.key == ge.key && completed_write(w)) {
                let Op::Put(v) = w.op else { continue };
                let overwritten = events.iter().any(|w2| {
                    w2.key == ge.key && completed_write(w2)
                        && w.response_ns < w2.invoke_ns && w2.response_ns < ge.invoke_ns
                });
                if overwritten && ge.outcome != Outcome::Ok(Some(v)) {
                    candidates.push((g, v));
                }
            }
        }
        prop_assume!(!candidates.is_empty());
        let (g, v) = candidates[pick.index(candidates.len())];
        events[g].outcome = Outcome::Ok(Some(v));
        assert_only_key_rejected(&events, events[g].key)?;
    }
}

/// Tiny arbitrary single-key histories (overlapping, tied timestamps, duplicate values,
/// failed ops): the checker must agree exactly with brute force.
fn tiny_history() -> impl Strategy<Value = (Vec<Event>, Option<ValueId>)> {
    let event = (0..7u8, 1..4u64, 0..12u64, 0..8u64, 0..4u8, 0..3u32).prop_map(
        |(kind, v, call, dur, fail, client)| {
            let failed = fail == 0;
            let (op, outcome) = match kind {
                0..=2 => {
                    let read = if v == 3 { None } else { Some(v) };
                    (
                        Op::Get,
                        if failed {
                            Outcome::Failed
                        } else {
                            Outcome::Ok(read)
                        },
                    )
                }
                3..=5 => (
                    Op::Put(v),
                    if failed {
                        Outcome::Failed
                    } else {
                        Outcome::Ok(None)
                    },
                ),
                _ => (
                    Op::Delete,
                    if failed {
                        Outcome::Failed
                    } else {
                        Outcome::Ok(None)
                    },
                ),
            };
            ev(client, 0, op, outcome, call, call + dur)
        },
    );
    (
        prop::collection::vec(event, 1..8),
        prop::option::of(Just(1u64)),
    )
}

/// Tiny single-key histories mixing conditional writes (every condition, stored, unmet or
/// failed) with plain ones.
fn tiny_conditional_history() -> impl Strategy<Value = (Vec<Event>, Option<ValueId>)> {
    let cond = prop_oneof![
        Just(Cond::Absent),
        Just(Cond::Present),
        (1..4u64).prop_map(Cond::Is)
    ];
    let outcome = prop_oneof![
        Just(Outcome::Ok(None)),
        Just(Outcome::Unmet),
        Just(Outcome::Failed)
    ];
    let conditional = (0..2u8, 1..4u64, cond, outcome, 0..12u64, 0..8u64, 0..3u32).prop_map(
        |(kind, v, c, outcome, call, dur, client)| {
            let op = if kind == 0 {
                Op::PutIf(v, c)
            } else {
                Op::DeleteIf(c)
            };
            ev(client, 0, op, outcome, call, call + dur)
        },
    );
    let plain = tiny_history().prop_map(|(events, _)| events);
    (
        prop::collection::vec(conditional, 1..5),
        plain,
        prop::option::of(Just(1u64)),
    )
        .prop_map(|(mut c, p, init)| {
            c.extend(p.into_iter().take(4));
            (c, init)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn agrees_with_brute_force_on_tiny_conditional_histories(
        (events, init) in tiny_conditional_history()
    ) {
        let expected = brute_force(&events, init);
        for quick in [true, false] {
            let report = check(&events, |_| init, &limits(quick));
            prop_assert_eq!(report.is_ok(), expected, "quick_refutation {}: {}", quick, report);
            prop_assert_eq!(report.unknown().count(), 0);
        }
    }

    #[test]
    fn agrees_with_brute_force_on_tiny_histories((events, init) in tiny_history()) {
        let expected = brute_force(&events, init);
        for quick in [true, false] {
            let report = check(&events, |_| init, &limits(quick));
            prop_assert_eq!(report.is_ok(), expected, "quick_refutation {}: {}", quick, report);
            prop_assert_eq!(report.unknown().count(), 0);
        }
    }
}

#[test]
fn brute_force_sanity() {
    // The reference itself must be able to say no.
    assert!(!brute_force(
        &[put(0, 0, 1, 0, 10), get(1, 0, None, 20, 30)],
        None
    ));
    assert!(brute_force(
        &[put(0, 0, 1, 0, 10), get(1, 0, None, 5, 30)],
        None
    ));
    assert!(brute_force(
        &[failed_put(0, 0, 1, 0, 10), get(1, 0, Some(1), 20, 30)],
        None
    ));
    assert!(!brute_force(
        &[get(1, 0, Some(1), 0, 5), failed_put(0, 0, 1, 10, 20)],
        None
    ));
}

/// How many of 2,000 histories `strategy` draws brute force accepts, and rejects.
fn verdicts(strategy: impl Strategy<Value = (Vec<Event>, Option<ValueId>)>) -> (u32, u32) {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut yes, mut no) = (0, 0);
    for _ in 0..2000 {
        let (events, init) = strategy.new_tree(&mut runner).unwrap().current();
        if brute_force(&events, init) {
            yes += 1
        } else {
            no += 1
        }
    }
    (yes, no)
}

#[test]
fn tiny_history_mixes_have_both_verdicts() {
    // Guards the generators above: each must produce plenty of both verdicts.
    for (name, (yes, no)) in [
        ("plain", verdicts(tiny_history())),
        ("conditional", verdicts(tiny_conditional_history())),
    ] {
        assert!(
            yes > 300 && no > 300,
            "{name}: linearizable {yes}, not {no}"
        );
        eprintln!("tiny {name} histories: linearizable {yes}, not {no}");
    }
}
