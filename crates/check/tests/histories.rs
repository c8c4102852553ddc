//! Hand-written histories with known verdicts, the budget, and the recorder.

mod common;

use common::*;
use nessie_check::{check, Cond, Event, History, Limits, Op, Outcome, Report, Verdict};

const K: u64 = 7;

fn run(events: &[Event]) -> Report {
    check(events, |_| None, &Limits::default())
}

/// What one configuration of the checker said about a violation.
struct Found {
    explanation: String,
    unplaceable: Vec<Event>,
    window: Vec<Event>,
}

/// Asserts key `K` is proven not linearizable, both with the quick refutation (first)
/// and by the full search alone (second).
fn assert_violation(events: &[Event]) -> [Found; 2] {
    [true, false].map(|quick_refutation| {
        let limits = Limits {
            quick_refutation,
            ..Limits::default()
        };
        let report = check(events, |_| None, &limits);
        assert!(
            !report.is_ok(),
            "accepted a non-linearizable history:\n{report}"
        );
        match &report.key(K).expect("key checked").verdict {
            Verdict::NotLinearizable {
                explanation,
                unplaceable,
                window,
            } => {
                assert!(
                    explanation.contains("key 7: NOT LINEARIZABLE"),
                    "{explanation}"
                );
                assert!(!unplaceable.is_empty());
                for e in unplaceable {
                    assert!(
                        window.contains(e),
                        "window must contain the unplaceable ops"
                    );
                }
                Found {
                    explanation: explanation.clone(),
                    unplaceable: unplaceable.clone(),
                    window: window.clone(),
                }
            }
            other => panic!("expected NotLinearizable, got {other:?}"),
        }
    })
}

fn assert_linearizable(events: &[Event]) {
    let report = run(events);
    assert!(report.is_ok(), "rejected a linearizable history:\n{report}");
    assert_eq!(report.linearizable_count(), report.key_count());
}

// ---- known violations -------------------------------------------------------------

#[test]
fn stale_read_is_rejected() {
    let stale = get(1, K, Some(1), 40, 50);
    let [quick, searched] =
        assert_violation(&[put(0, K, 1, 0, 10), put(0, K, 2, 20, 30), stale.clone()]);
    for found in [&quick, &searched] {
        assert_eq!(found.unplaceable, vec![stale.clone()]);
        assert!(
            found.window.contains(&put(0, K, 2, 20, 30)),
            "{}",
            found.explanation
        );
    }
    assert_eq!(
        quick.window,
        vec![put(0, K, 1, 0, 10), put(0, K, 2, 20, 30), stale]
    );
    assert!(
        quick.explanation.contains("overwritten"),
        "{}",
        quick.explanation
    );
    assert!(
        searched.explanation.contains("register is 2"),
        "{}",
        searched.explanation
    );
}

#[test]
fn read_of_never_written_value_is_rejected() {
    for found in assert_violation(&[put(0, K, 1, 0, 10), get(1, K, Some(5), 20, 30)]) {
        assert_eq!(found.unplaceable, vec![get(1, K, Some(5), 20, 30)]);
        assert!(
            found.explanation.contains("writes 5"),
            "{}",
            found.explanation
        );
    }
}

#[test]
fn read_of_deleted_value_after_delete_completed_is_rejected() {
    let found = assert_violation(&[
        put(0, K, 1, 0, 10),
        del(0, K, 20, 30),
        get(1, K, Some(1), 40, 50),
    ]);
    for found in &found {
        assert_eq!(found.unplaceable, vec![get(1, K, Some(1), 40, 50)]);
    }
    assert!(
        found[0].explanation.contains("Delete ok"),
        "{}",
        found[0].explanation
    );
}

#[test]
fn new_old_inversion_between_clients_is_rejected() {
    // Two concurrent writes; client 2 sees 1 then 2, client 3 (later) sees 2 then 1.
    assert_violation(&[
        put(0, K, 1, 0, 100),
        put(1, K, 2, 0, 100),
        get(2, K, Some(1), 10, 20),
        get(2, K, Some(2), 30, 40),
        get(3, K, Some(2), 50, 60),
        get(3, K, Some(1), 70, 80),
    ]);
}

#[test]
fn absent_after_completed_put_is_rejected() {
    let [quick, _] = assert_violation(&[put(0, K, 1, 0, 10), get(1, K, None, 20, 30)]);
    assert!(
        quick
            .explanation
            .contains("absent is the initial state, but it was overwritten"),
        "{}",
        quick.explanation
    );
}

#[test]
fn failed_put_observed_before_its_invocation_is_rejected() {
    assert_violation(&[get(1, K, Some(2), 0, 10), failed_put(0, K, 2, 20, 30)]);
}

#[test]
fn value_cannot_reappear_after_observed_failed_delete() {
    // The failed delete must have taken effect (absent was read), so 1 cannot come back.
    assert_violation(&[
        put(0, K, 1, 0, 10),
        failed_del(0, K, 20, 30),
        get(1, K, None, 40, 50),
        get(1, K, Some(1), 60, 70),
    ]);
}

#[test]
fn only_the_bad_key_fails() {
    let events = vec![
        put(0, 1, 10, 0, 10),
        get(1, 1, Some(10), 20, 30),
        put(0, K, 1, 0, 10),
        put(0, K, 2, 20, 30),
        get(1, K, Some(1), 40, 50),
    ];
    let report = run(&events);
    assert!(!report.is_ok());
    assert!(report.key(1).unwrap().is_ok());
    assert!(!report.key(K).unwrap().is_ok());
    assert_eq!(
        report.violations().map(|k| k.key).collect::<Vec<_>>(),
        vec![K]
    );
    assert_eq!(report.events, 5);
    let text = report.to_string();
    assert!(
        text.contains("VIOLATED") && text.contains("key 7: NOT LINEARIZABLE"),
        "{text}"
    );
    assert!(!text.contains("key 1:"), "{text}");
}

// ---- linearizable histories with overlap ---------------------------------------------

#[test]
fn concurrent_get_may_see_old_or_new_value() {
    for seen in [Some(1), Some(2)] {
        assert_linearizable(&[
            put(0, K, 1, 0, 10),
            put(0, K, 2, 20, 40),
            get(1, K, seen, 25, 35),
        ]);
    }
    // A read overlapping the first write may still see the initial (absent) state.
    assert_linearizable(&[
        put(0, K, 1, 0, 10),
        get(1, K, None, 5, 15),
        get(1, K, Some(1), 16, 20),
    ]);
    // Equal timestamps count as concurrent.
    assert_linearizable(&[put(0, K, 1, 0, 10), get(1, K, None, 10, 12)]);
}

#[test]
fn concurrent_writes_may_be_ordered_either_way() {
    for (a, b) in [(1, 2), (2, 1)] {
        assert_linearizable(&[
            put(0, K, 1, 0, 100),
            put(1, K, 2, 0, 100),
            get(2, K, Some(a), 10, 20),
            get(3, K, Some(b), 30, 40),
            get(2, K, Some(b), 110, 120),
        ]);
    }
}

#[test]
fn failed_put_later_observed_is_accepted() {
    // The failed put takes effect long after it returned, across quiescent points and
    // after an intervening completed write.
    assert_linearizable(&[
        put(0, K, 1, 0, 10),
        failed_put(1, K, 2, 20, 30),
        get(2, K, Some(1), 40, 45),
        put(0, K, 3, 50, 60),
        get(2, K, Some(3), 70, 80),
        get(2, K, Some(2), 100, 110),
        get(3, K, Some(2), 120, 130),
    ]);
}

#[test]
fn failed_put_never_observed_is_accepted() {
    assert_linearizable(&[
        put(0, K, 1, 0, 10),
        failed_put(1, K, 2, 20, 30),
        get(2, K, Some(1), 40, 50),
        get(2, K, Some(1), 1_000, 1_010),
    ]);
}

#[test]
fn failed_delete_observed_or_not_is_accepted() {
    assert_linearizable(&[
        put(0, K, 1, 0, 10),
        failed_del(0, K, 20, 30),
        get(1, K, Some(1), 40, 50),
        get(1, K, None, 60, 70),
    ]);
    assert_linearizable(&[
        put(0, K, 1, 0, 10),
        failed_del(0, K, 20, 30),
        get(1, K, Some(1), 40, 50),
    ]);
}

#[test]
fn failed_gets_are_ignored() {
    assert_linearizable(&[
        put(0, K, 1, 0, 10),
        ev(1, K, Op::Get, Outcome::Failed, 20, 30),
        get(1, K, Some(1), 40, 50),
    ]);
}

#[test]
fn duplicate_values_and_initial_state() {
    assert_linearizable(&[
        put(0, K, 1, 0, 10),
        put(0, K, 2, 20, 30),
        put(0, K, 1, 40, 50),
        get(1, K, Some(1), 60, 70),
    ]);
    let events = [
        get(0, K, Some(9), 0, 10),
        del(0, K, 20, 30),
        get(0, K, None, 40, 50),
    ];
    assert!(check(&events, |_| Some(9), &Limits::default()).is_ok());
    assert!(!check(&events, |_| None, &Limits::default()).is_ok());
}

#[test]
fn empty_history_is_ok() {
    let report = run(&[]);
    assert!(report.is_ok());
    assert_eq!(report.key_count(), 0);
}

// ---- budget ----------------------------------------------------------------------------

#[test]
fn exceeded_budget_is_unknown_and_not_ok() {
    let events = simulate(&Sim {
        clients: 4,
        keys: 1,
        ops_per_client: 50,
        max_gap: 5,
        max_half: 20,
        put_pct: 40,
        delete_pct: 10,
        fail_pct: 0,
        seed: 1,
    });
    assert!(check(&events, sim_initial, &Limits::default()).is_ok());

    let report = check(&events, sim_initial, &Limits::with_max_states(10));
    assert!(!report.is_ok(), "Unknown must not pass:\n{report}");
    assert_eq!(report.violations().count(), 0);
    let unknown: Vec<_> = report.unknown().collect();
    assert_eq!(unknown.len(), 1);
    match &unknown[0].verdict {
        Verdict::Unknown { reason } => assert!(reason.contains("budget"), "{reason}"),
        v => panic!("expected Unknown, got {v:?}"),
    }
    assert!(
        report.to_string().starts_with("linearizability UNKNOWN"),
        "{report}"
    );
}

// ---- recorder ------------------------------------------------------------------------------

#[test]
fn recorder_captures_a_real_concurrent_store() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    let history = Arc::new(History::new());
    let store: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let threads: Vec<_> = (0..4u32)
        .map(|client| {
            let history = Arc::clone(&history);
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut rec = history.recorder(client);
                for i in 0..2_000u64 {
                    let key = (i * 7 + u64::from(client)) % 8;
                    match i % 5 {
                        0 | 1 => {
                            let v = u64::from(client) << 32 | i;
                            rec.record(key, Op::Put(v), || {
                                store.lock().unwrap().insert(key, v);
                                Outcome::Ok(None)
                            });
                        }
                        2 => {
                            rec.record(key, Op::Delete, || {
                                store.lock().unwrap().remove(&key);
                                Outcome::Ok(None)
                            });
                        }
                        _ => {
                            let t = rec.invoke();
                            let v = store.lock().unwrap().get(&key).copied();
                            rec.complete(t, key, Op::Get, Outcome::Ok(v));
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let events = history.events();
    assert_eq!(events.len(), 8_000);
    assert!(events.windows(2).all(|w| w[0].invoke_ns <= w[1].invoke_ns));
    assert!(events.iter().all(|e| e.invoke_ns <= e.response_ns));
    let report = check(&events, |_| None, &Limits::default());
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.key_count(), 8);

    // A lying read injected after the fact is caught.
    let mut bad = Arc::try_unwrap(history).unwrap().into_events();
    let last_get = bad.iter().rposition(|e| e.op == Op::Get).unwrap();
    bad[last_get].outcome = Outcome::Ok(Some(u64::MAX));
    assert!(!check(&bad, |_| None, &Limits::default()).is_ok());
}

#[test]
fn recorder_flushes_on_drop_only() {
    let history = History::new();
    let mut rec = history.recorder(3);
    let t = rec.invoke();
    rec.complete(t, 1, Op::Put(1), Outcome::Ok(None));
    assert!(history.is_empty(), "events are buffered per thread");
    rec.flush();
    assert_eq!(history.len(), 1);
    let t = rec.invoke();
    rec.complete(t, 1, Op::Get, Outcome::Ok(Some(2)));
    drop(rec);
    let events = history.events();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].client, 3);
    assert!(!run(&events).is_ok());
}

#[test]
fn events_round_trip_through_json() {
    let events = vec![
        put(0, K, 1, 0, 10),
        failed_put(1, K, 2, 20, 30),
        failed_del(1, K, 31, 32),
        get(2, K, Some(2), 40, 50),
        get(2, K, None, 60, 70),
    ];
    let json = serde_json::to_string(&events).unwrap();
    let back: Vec<Event> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, events);
    assert!(run(&back).is_ok());
    let report = run(&[put(0, K, 1, 0, 10), get(1, K, None, 20, 30)]);
    let json = serde_json::to_string(&report).unwrap();
    assert!(json.contains("NotLinearizable"), "{json}");
}

#[test]
fn failed_put_may_have_no_effect_even_if_its_value_is_read() {
    // The read of 1 overlaps the failed put but is explained by the completed Put(1);
    // had the failed put taken effect anywhere after its invocation, the final read
    // could not return 2.
    assert_linearizable(&[
        put(0, K, 1, 0, 1),
        get(1, K, Some(1), 0, 20),
        put(0, K, 2, 2, 5),
        failed_put(2, K, 1, 10, 11),
        get(0, K, Some(2), 30, 40),
    ]);
}

// ---- conditional writes -----------------------------------------------------------

fn put_if(client: u32, v: u64, c: Cond, outcome: Outcome, i: u64, r: u64) -> Event {
    ev(client, K, Op::PutIf(v, c), outcome, i, r)
}

#[test]
fn two_adds_of_an_absent_key_cannot_both_be_stored() {
    // Concurrent or not: without a delete between them, the second finds the first's value.
    assert_violation(&[
        put_if(0, 1, Cond::Absent, Outcome::Ok(None), 0, 10),
        put_if(1, 2, Cond::Absent, Outcome::Ok(None), 5, 20),
    ]);
    assert_linearizable(&[
        put_if(0, 1, Cond::Absent, Outcome::Ok(None), 0, 10),
        put_if(1, 2, Cond::Absent, Outcome::Unmet, 5, 20),
        get(2, K, Some(1), 30, 40),
    ]);
}

#[test]
fn a_conditional_write_judged_on_a_stale_state_is_rejected() {
    // The put completed before the add began: the add must find the key present.
    assert_violation(&[
        put(0, K, 1, 0, 10),
        put_if(1, 2, Cond::Absent, Outcome::Ok(None), 20, 30),
    ]);
    // A compare-and-set on a value overwritten before it began.
    assert_violation(&[
        put(0, K, 1, 0, 10),
        put(0, K, 3, 11, 12),
        put_if(1, 2, Cond::Is(1), Outcome::Ok(None), 20, 30),
    ]);
    // An unmet "absent" on a key that is absent throughout.
    assert_violation(&[
        put_if(1, 2, Cond::Absent, Outcome::Unmet, 20, 30),
        get(0, K, None, 40, 50),
    ]);
}

#[test]
fn a_failed_write_can_explain_an_unmet_condition() {
    // Nothing reads 1, but the failed put may have taken effect: that explains the unmet add.
    assert_linearizable(&[
        failed_put(0, K, 1, 0, 10),
        put_if(1, 2, Cond::Absent, Outcome::Unmet, 20, 30),
    ]);
    // An unmet version condition proves nothing (a MIGRATE changes the version).
    assert_linearizable(&[
        put(0, K, 1, 0, 10),
        put_if(1, 2, Cond::Is(1), Outcome::Unmet, 20, 30),
        get(0, K, Some(1), 40, 50),
    ]);
    assert_linearizable(&[
        put(0, K, 1, 0, 10),
        ev(1, K, Op::DeleteIf(Cond::Is(1)), Outcome::Ok(None), 20, 30),
        get(0, K, None, 40, 50),
    ]);
}

/// Parses a key's history as the stress harness dumps it (`$NESSIE_HISTORY_DIR`, one
/// `Event` per line in its `Display` form).
fn parse_dump(text: &str) -> Vec<Event> {
    fn fail(line: &str) -> ! {
        panic!("unparsable history line: {line:?}")
    }
    fn num(line: &str, s: &str) -> u64 {
        s.parse().unwrap_or_else(|_| fail(line))
    }
    fn arg(line: &str, s: &str, pre: &str) -> u64 {
        let v = s.strip_prefix(pre).and_then(|s| s.strip_suffix(')'));
        num(line, v.unwrap_or_else(|| fail(line)))
    }
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (head, rest) = line.split_once(": ").unwrap_or_else(|| fail(line));
            let w: Vec<&str> = head.split_whitespace().collect();
            let ["client", c, "key", k] = w[..] else {
                fail(line)
            };
            let (what, times) = rest.rsplit_once(" [").unwrap_or_else(|| fail(line));
            let (i, r) = times
                .trim_end_matches(']')
                .split_once("..")
                .unwrap_or_else(|| fail(line));
            let (op, outcome) = if let Some(v) = what.strip_prefix("Get -> ") {
                let v = (v != "absent").then(|| num(line, v));
                (Op::Get, Outcome::Ok(v))
            } else if let Some(p) = what.strip_suffix(" ok") {
                (Op::Put(arg(line, p, "Put(")), Outcome::Ok(None))
            } else if let Some(p) = what.strip_suffix(" FAILED") {
                (Op::Put(arg(line, p, "Put(")), Outcome::Failed)
            } else {
                (Op::Expire(arg(line, what, "Expire(")), Outcome::Ok(None))
            };
            Event {
                client: num(line, c) as u32,
                key: num(line, k),
                op,
                outcome,
                invoke_ns: num(line, i.trim_end_matches("ns")),
                response_ns: num(line, r.trim_end_matches("ns")),
            }
        })
        .collect()
}

/// A hot key of a stress run with expiring items and a small index (a quarter of its PUTs
/// refused, each a failed write that may have taken effect): 112 ops whose 24 failed writes,
/// held open to the end of the history, exhausted a budget of 20 million states (CI,
/// 2026-11-28). Bounded by their expiries, the search decides it at once.
#[test]
fn an_expiring_hot_key_with_many_failed_writes_is_decided() {
    let text = include_str!("histories/expiring-hot-key-with-failed-writes.txt");
    let events = parse_dump(text);
    assert_eq!(events.len(), 112);
    for (e, line) in events.iter().zip(text.lines()) {
        assert_eq!(e.to_string(), line, "parsed as dumped");
    }
    let limits = Limits::with_max_states(100_000);
    let report = check(&events, |_| None, &limits);
    assert!(report.is_ok(), "{report}");
    // A Get that returns a value the key never held is still caught in it.
    let mut bad = events.clone();
    let g = bad
        .iter()
        .rposition(|e| e.op == Op::Get && e.outcome != Outcome::Ok(None))
        .expect("a Get of a value");
    bad[g].outcome = Outcome::Ok(Some(u64::MAX - 1));
    assert!(!check(&bad, |_| None, &limits).is_ok());
}
