//! Scale: large generated histories are checked quickly, and a single bad read in one is
//! still pinpointed (not reported Unknown).

mod common;

use std::time::Instant;

use common::*;
use nessie_check::{check, Event, Limits, Verdict};

fn big_history() -> Vec<Event> {
    simulate(&Sim {
        clients: 8,
        keys: 64,
        ops_per_client: 12_500,
        max_gap: 300,
        max_half: 1_000,
        put_pct: 30,
        delete_pct: 5,
        fail_pct: 2,
        seed: 0x5eed,
    })
}

#[test]
fn scale_100k_events_8_clients_64_keys() {
    let events = big_history();
    assert_eq!(events.len(), 100_000);
    let start = Instant::now();
    let report = check(&events, sim_initial, &Limits::default());
    let elapsed = start.elapsed();
    eprintln!("100k events: {elapsed:?}\n{report}");
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.key_count(), 64);
    // The history really is concurrent: far fewer quiescent segments than operations.
    let ops: usize = report.keys.iter().map(|k| k.ops).sum();
    let segments: usize = report.keys.iter().map(|k| k.segments).sum();
    assert!(segments * 3 < ops * 2, "{segments} segments for {ops} ops");
    // Search effort, not wall-clock time (machines are shared and noisy): near one state per op.
    assert!(
        report.states_explored < 400_000,
        "explored {} states",
        report.states_explored
    );
}

#[test]
fn one_stale_read_in_100k_events_is_found() {
    let mut events = big_history();
    let g = inject_stale_read(&mut events);
    let start = Instant::now();
    let report = check(&events, sim_initial, &Limits::default());
    eprintln!(
        "100k events with one stale read: {:?}\n{report}",
        start.elapsed()
    );
    assert!(!report.is_ok());
    assert_eq!(report.unknown().count(), 0);
    let bad: Vec<_> = report.violations().collect();
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].key, events[g].key);
    match &bad[0].verdict {
        Verdict::NotLinearizable {
            unplaceable,
            window,
            ..
        } => {
            assert!(unplaceable.contains(&events[g]), "{report}");
            assert!(window.len() <= Limits::default().max_window_events);
        }
        v => panic!("{v:?}"),
    }
}

fn hot_history() -> Vec<Event> {
    // 8 clients hammering 2 keys with long overlapping operations and failed writes.
    simulate(&Sim {
        clients: 8,
        keys: 2,
        ops_per_client: 2_500,
        max_gap: 20,
        max_half: 2_000,
        put_pct: 40,
        delete_pct: 10,
        fail_pct: 3,
        seed: 7,
    })
}

#[test]
fn hot_keys_with_high_concurrency() {
    let events = hot_history();
    let start = Instant::now();
    let report = check(&events, sim_initial, &Limits::default());
    eprintln!("20k events on 2 hot keys: {:?}\n{report}", start.elapsed());
    assert!(report.is_ok(), "{report}");
    let segments: usize = report.keys.iter().map(|k| k.segments).sum();
    assert!(
        segments < 100,
        "expected almost no quiescent points, got {segments}"
    );
}

#[test]
fn stale_read_on_a_hot_key_is_pinpointed() {
    // Refuting this by search would mean exhausting every ordering of the preceding
    // thousands of overlapping ops; the quick refutation names three events.
    let mut events = hot_history();
    let g = inject_stale_read(&mut events);
    let report = check(&events, sim_initial, &Limits::default());
    eprintln!("{report}");
    let bad = report.key(events[g].key).unwrap();
    match &bad.verdict {
        Verdict::NotLinearizable {
            unplaceable,
            window,
            ..
        } => {
            assert_eq!(unplaceable, &vec![events[g].clone()]);
            assert_eq!(window.len(), 3);
        }
        v => panic!("{v:?}"),
    }
}
