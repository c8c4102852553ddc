//! The process's wall clock against steps of the system's (a process of its own: the step
//! stays for the rest of it).

use std::time::Duration;

use nessie_fabric::{
    step_system_clock_for_tests, system_wall_clock_ns, wall_clock_ns, wall_clock_steps,
};

const S: i64 = 1_000_000_000;

#[test]
fn a_backward_step_is_ignored_and_counted_a_forward_one_followed() {
    let before = wall_clock_ns();
    assert!(before.abs_diff(system_wall_clock_ns()) < 10_000_000);
    assert_eq!(wall_clock_steps(), (0, 0));
    step_system_clock_for_tests(-10 * S);
    std::thread::sleep(Duration::from_millis(5));
    let after = wall_clock_ns();
    assert!(after > before, "the wall clock never goes back");
    assert!(
        after - before < 1_000_000_000,
        "it ran on: {} ns",
        after - before
    );
    let (steps, lag) = wall_clock_steps();
    assert!(steps >= 1, "the step was seen");
    assert!(
        lag.abs_diff(10 * S as u64) < 100_000_000,
        "by about 10 s: {lag}"
    );
    // The system clock comes back, then jumps ahead: followed within a look.
    step_system_clock_for_tests(10 * S + S / 2);
    std::thread::sleep(Duration::from_millis(5));
    let ahead = wall_clock_ns();
    assert!(
        ahead.abs_diff(system_wall_clock_ns()) < 10_000_000,
        "a forward step is followed"
    );
    assert!(ahead - after >= (S / 2) as u64);
}
