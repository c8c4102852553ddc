//! The store behind a node's front ends ([`nessie_frontend::serve::Backend`]): the node's pool
//! of client workers for commands run one at a time, and, on each event-loop thread, a
//! pipeline of `[frontends] inflight` slots for the plain GETs and SETs of a pipelined batch
//! (issue 44; `nessie_frontend::redis::serve`'s `batch`).
//!
//! A pipeline is built on the thread that uses it, at its first batch (it is not `Send`), and
//! kept in a thread-local until the thread ends; a batch takes it out while it runs, so that a
//! panic drops it while unwinding. One that cannot be built (worker ids run out) is not tried
//! again on that thread: its batches run one command at a time, as they would with
//! `inflight = 1`, after one warning.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nessie_frontend::serve::{Backend, Lease, Op, Outcome};
use nessie_serve::pool::ClientPool;

use crate::node::NodePipeline;

/// Builds the calling thread's pipeline.
pub type MakePipeline = dyn Fn() -> Result<NodePipeline, String> + Send + Sync;

/// A node's front ends' store (module comment).
pub struct FrontStore {
    pool: Arc<ClientPool>,
    /// `None`: no operations in flight (`inflight = 1`, or a mode without pipelines).
    make: Option<Box<MakePipeline>>,
    inflight: usize,
    /// Which of a thread's pipelines is this store's.
    id: u64,
}

/// Distinct ids for [`FrontStore`]s (a process may run several, in tests).
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A store's pipeline on one thread.
enum Held {
    Ready(NodePipeline),
    /// Taken out by the batch running on it (a batch that unwound leaves this: the next
    /// batch builds a new pipeline; the old one was dropped while unwinding, waiting for its
    /// posted operations as a panicking drop does).
    InUse,
    /// It could not be built: this thread runs its batches one command at a time.
    Unbuildable,
}

thread_local! {
    /// This thread's pipeline of each store that ran a batch on it.
    static PIPELINES: RefCell<Vec<(u64, Held)>> = const { RefCell::new(Vec::new()) };
}

impl FrontStore {
    /// One command at a time on `pool`'s clients, or with `make` batches with `inflight`
    /// operations in flight per thread.
    pub fn new(pool: Arc<ClientPool>, make: Option<Box<MakePipeline>>, inflight: usize) -> Self {
        assert!(
            make.is_none() || (2..=nessie_inflight::MAX_SLOTS).contains(&inflight),
            "a front end's pipeline has 2 to {} slots, not {inflight}",
            nessie_inflight::MAX_SLOTS
        );
        Self {
            pool,
            make,
            inflight,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl FrontStore {
    /// This store's pipeline on this thread, taken out (built if it has none, or its last
    /// batch unwound); `None` if it cannot be built.
    fn take(&self, all: &mut Vec<(u64, Held)>, make: &MakePipeline) -> Option<NodePipeline> {
        let i = match all.iter().position(|(id, _)| *id == self.id) {
            Some(i) => i,
            None => {
                all.push((self.id, Held::InUse));
                all.len() - 1
            }
        };
        match std::mem::replace(&mut all[i].1, Held::InUse) {
            Held::Ready(p) => Some(p),
            Held::Unbuildable => {
                all[i].1 = Held::Unbuildable;
                None
            }
            Held::InUse => match make() {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::warn!(
                        "a front-end thread runs its batches one command at a time: its \
                         pipeline could not be built: {e}"
                    );
                    all[i].1 = Held::Unbuildable;
                    None
                }
            },
        }
    }
}

impl Backend for FrontStore {
    fn lease(&self) -> Box<dyn Lease + '_> {
        Box::new(self.pool.lease())
    }

    fn concurrency(&self) -> usize {
        match self.make {
            Some(_) => self.inflight,
            None => 0,
        }
    }

    fn run_concurrently(
        &self,
        ops: &mut Vec<Op>,
        done: &mut Vec<Result<Outcome, nessie_protocols::Error>>,
    ) -> bool {
        let Some(make) = &self.make else {
            return false;
        };
        // Out of the thread-local while it runs: a panic drops it while unwinding.
        let Some(mut p) = PIPELINES.with(|cell| self.take(&mut cell.borrow_mut(), make)) else {
            return false;
        };
        let tickets: Vec<_> = ops.drain(..).map(|op| p.submit(op)).collect();
        for t in tickets {
            done.push(p.wait(t).result);
        }
        assert_eq!(
            p.outstanding(),
            0,
            "every operation of the batch was answered"
        );
        PIPELINES.with(|cell| {
            let mut all = cell.borrow_mut();
            let (_, held) = all
                .iter_mut()
                .find(|(id, _)| *id == self.id)
                .expect("taken from here");
            *held = Held::Ready(p);
        });
        true
    }
}
