//! Posted operations: a READ, WRITE or CAS started now and reported complete later, so that one
//! thread keeps several in flight (`nessie-inflight` runs one protocol operation per coroutine
//! over them).
//!
//! [`Post::post`] starts one operation of the [`BatchOp`] kind. It either finishes it at once
//! (an operation performed straight on memory: own memory, a peer's mapped memory, the
//! in-process fabric) and returns its result, or leaves it in flight and returns `None`; then
//! [`Post::poll_posted`] reports it, with the caller's token, once it has completed at its
//! target (the same completion as a blocking call's: a WRITE is remotely complete).
//!
//! Semantics, for every backend:
//! - **Posted operations are independent.** Two posted operations in flight together may take
//!   effect in any order; a caller that needs one before another waits for the first (a
//!   protocol step waits for its operation before its next step, so one coroutine never has two
//!   conflicting operations in flight).
//! - **Every posted operation is reported exactly once**, as its own result or as an error:
//!   a deadline (the backend's operation timeout) bounds every operation, as for blocking calls.
//! - **The buffer is the caller's until then.** A READ's destination and a WRITE's source must
//!   stay valid and untouched until the operation is reported; that is why [`Post::post`] is
//!   `unsafe`.
//!
//! The default implementation performs the operation at once with the blocking calls, so every
//! endpoint supports posting; only a backend that can overlap operations (UCX) overrides it.

use crate::{BatchOp, Endpoint, FabricError};

/// Most operations one endpoint keeps in flight at once: bounds the backend's table of posted
/// operations (and so its memory) however many coroutines post.
pub const MAX_POSTED: usize = 256;

/// Which posted operation: chosen by the caller, handed back by [`Post::poll_posted`].
pub type PostToken = u64;

/// An operation's result as a batch reports it: the value found for a CAS, 0 otherwise.
pub type PostResult = Result<u64, FabricError>;

/// Non-blocking operations on an endpoint (module comment).
pub trait Post: Endpoint {
    /// Start `op`. `Some(result)`: it finished already (and nothing will be reported for it);
    /// `None`: it is in flight and [`Self::poll_posted`] will report `token` exactly once.
    /// At most [`MAX_POSTED`] operations are in flight: a caller with that many waits first.
    ///
    /// # Safety
    /// When `None` is returned, the memory `op`'s buffer refers to must stay valid and must not
    /// be read or written by anyone else until the operation is reported.
    unsafe fn post(&mut self, op: &mut BatchOp<'_>, token: PostToken) -> Option<PostResult> {
        let _ = token;
        Some(op.run_blocking(self))
    }

    /// Make progress on the operations in flight and report each one that completed (its token
    /// and result) to `done`; returns how many were reported. Never blocks for long: a caller
    /// waiting for an operation calls it again (see [`Self::posted_wait`]).
    fn poll_posted(&mut self, done: &mut dyn FnMut(PostToken, PostResult)) -> usize {
        let _ = done;
        0
    }

    /// Operations in flight (posted, not yet reported).
    fn posted_in_flight(&self) -> usize {
        0
    }

    /// Called when a poll found nothing and the caller has nothing else to do: a backend may
    /// wait briefly for an event (a socket becoming readable) instead of spinning on.
    fn posted_idle(&mut self) {
        std::hint::spin_loop()
    }
}

thread_local! {
    /// Open [`NoYield`] sections on this thread.
    static NO_YIELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A section in which the thread's client must not give way to other clients of the thread
/// (`nessie-inflight`'s coroutines): its fabric operations wait where they are. Taken while a
/// lock is held across fabric operations (the class allocator's): a client suspended while
/// holding it would leave its thread's other clients to block on it, and the thread with them.
#[must_use = "the section ends when the guard is dropped"]
pub struct NoYield(());

impl NoYield {
    pub fn enter() -> Self {
        NO_YIELD.with(|n| n.set(n.get() + 1));
        NoYield(())
    }

    /// Whether a client running on this thread may give way now (no section is open).
    pub fn may_yield() -> bool {
        NO_YIELD.with(|n| n.get() == 0)
    }
}

impl Drop for NoYield {
    fn drop(&mut self) {
        NO_YIELD.with(|n| n.set(n.get() - 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inproc::InProcFabric;
    use crate::RemoteAddr;

    #[test]
    fn the_default_post_finishes_the_operation_at_once() {
        let fabric = InProcFabric::new(&[vec![64], vec![64]], None).unwrap();
        let mut ep = fabric.endpoint(0);
        let addr = RemoteAddr::new(1, 0, 8);
        let data = 7u64.to_le_bytes();
        // SAFETY: the default post finishes before returning.
        let r = unsafe { ep.post(&mut BatchOp::Write { addr, buf: &data }, 1) };
        assert_eq!(r.map(|r| r.unwrap()), Some(0));
        let r = unsafe {
            ep.post(
                &mut BatchOp::Cas {
                    addr,
                    expected: 7,
                    desired: 9,
                },
                2,
            )
        };
        assert_eq!(r.map(|r| r.unwrap()), Some(7), "the value found");
        assert_eq!(ep.read_u64(addr).unwrap(), 9);
        assert_eq!(
            ep.poll_posted(&mut |_, _| panic!("nothing was in flight")),
            0
        );
        assert_eq!(ep.posted_in_flight(), 0);
    }

    #[test]
    fn no_yield_sections_nest() {
        assert!(NoYield::may_yield());
        let a = NoYield::enter();
        let b = NoYield::enter();
        drop(a);
        assert!(!NoYield::may_yield());
        drop(b);
        assert!(NoYield::may_yield());
    }
}
