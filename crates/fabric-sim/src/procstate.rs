//! What the kernel says about a thread: the scheduler's only way to tell a simulated thread
//! that is blocked on a lock from one that is still computing (Linux `/proc`).

/// The calling thread's kernel id.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Whether thread `tid` of this process is asleep (state `S`: waiting on a futex, a pipe, a
/// timer). A running, runnable or exited thread is not.
pub fn asleep(tid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        return false;
    };
    // "tid (comm) S ...": comm may contain spaces and parentheses; the state follows the last ')'.
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next())
        == Some('S')
}

/// The futex word thread `tid` of this process waits on, if it is inside a `futex` system
/// call (Linux `/proc/<tid>/syscall`: the call's number, then its arguments in hex, the first
/// being the futex's address), else `None` (running, another call, or gone).
pub fn futex_wait_addr(tid: i32) -> Option<usize> {
    let line = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok()?;
    let mut fields = line.split_ascii_whitespace();
    let nr: i64 = fields.next()?.parse().ok()?;
    if nr != libc::SYS_futex {
        return None;
    }
    let addr = fields.next()?;
    usize::from_str_radix(addr.strip_prefix("0x").unwrap_or(addr), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_waiting_on_a_lock_is_asleep_and_a_spinning_one_is_not() {
        let m = std::sync::Arc::new(std::sync::Mutex::new(()));
        let held = m.lock().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let m2 = m.clone();
        let h = std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            drop(m2.lock().unwrap());
        });
        let tid = rx.recv().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !asleep(tid) {
            assert!(std::time::Instant::now() < deadline, "never seen asleep");
            std::thread::yield_now();
        }
        let word = &*m as *const std::sync::Mutex<()> as usize;
        let within = word..word + std::mem::size_of::<std::sync::Mutex<()>>();
        while !futex_wait_addr(tid).is_some_and(|a| within.contains(&a)) {
            assert!(
                std::time::Instant::now() < deadline,
                "never seen in a futex wait on m"
            );
            std::thread::yield_now();
        }
        drop(held);
        h.join().unwrap();
        assert!(!asleep(gettid()), "the calling thread is running");
        assert_eq!(
            futex_wait_addr(gettid()),
            None,
            "the calling thread is running"
        );
        assert!(!asleep(i32::MAX), "no such thread");
    }
}
