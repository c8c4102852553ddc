//! CPU contention from background processes: time slices of the cores they share.
//!
//! The paper's shared-CPU experiment runs CPU-bound background processes on every node.
//! Nessie's clients and the baselines' servers all spin (on completions, on request slots),
//! so the kernel shares a core between such a thread and a background process in time
//! slices: while the process has the core, the thread does nothing, and whatever it was
//! waiting for (a completion, a request) waits for its next slice. A descheduled server
//! holds up every client whose request is in its slots; a descheduled client only itself.
//!
//! Model: the k-th simulated thread created on a node runs on core `k % cores`; the node's
//! background processes go on cores in a seeded random order, one per core before any core
//! gets a second. A core with at least one background process rotates all its tasks in a
//! fixed order, each for a slice of `max(sched_latency / tasks, min_granularity)` (CFS), from
//! a seeded phase; a thread there resumes from any wait only during its own slice. Cores
//! without a background process are as before: their threads share them by FIFO booking of
//! CPU work (`Net::cpu`), never by slices.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use nessie_fabric::NodeId;

use crate::params::SimParams;

/// A thread's share of a core it shares with background processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Share {
    /// The thread's slice in each rotation: `[start, start + slice)` after the phase.
    start: u64,
    slice: u64,
    period: u64,
    phase: u64,
}

impl Share {
    /// Earliest time at or after `t` at which the thread is on its core.
    fn next_on(&self, t: u64) -> u64 {
        let pos = (t + self.phase) % self.period;
        let end = self.start + self.slice;
        if pos < self.start {
            t + (self.start - pos)
        } else if pos < end {
            t
        } else {
            t + (self.period - pos) + self.start
        }
    }
}

/// Every simulated thread's slice, if its core runs a background process.
#[derive(Debug, Default)]
pub struct Slices {
    shares: Vec<Option<Share>>,
}

impl Slices {
    /// The slices of threads on `nodes` (thread `i` runs on node `nodes[i]`), with the
    /// background processes of `p`, seeded by `seed`.
    pub fn new(p: &SimParams, seed: u64, nodes: &[NodeId]) -> Self {
        if p.background_per_node == 0 {
            return Self::default();
        }
        let cores = p.cores_per_node as usize;
        let node_count = nodes.iter().map(|&n| n as usize + 1).max().unwrap_or(0);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ 0x5105_7ace);
        let mut shares = vec![None; nodes.len()];
        for node in 0..node_count {
            let threads: Vec<usize> = (0..nodes.len())
                .filter(|&i| nodes[i] as usize == node)
                .collect();
            let mut order: Vec<usize> = (0..cores).collect();
            order.shuffle(&mut rng);
            let mut hogs = vec![0u64; cores];
            for h in 0..p.background_per_node as usize {
                hogs[order[h % cores]] += 1;
            }
            for (core, &hog_count) in hogs.iter().enumerate() {
                let mine: Vec<usize> = threads.iter().copied().skip(core).step_by(cores).collect();
                let tasks = mine.len() as u64 + hog_count;
                let slice = (p.sched_latency_ns / tasks.max(1)).max(p.sched_min_granularity_ns);
                let period = slice * tasks;
                let phase = rng.gen_range(0..period.max(1));
                if hog_count == 0 {
                    continue;
                }
                for (j, &thread) in mine.iter().enumerate() {
                    let start = j as u64 * slice;
                    shares[thread] = Some(Share {
                        start,
                        slice,
                        period,
                        phase,
                    });
                }
            }
        }
        Self { shares }
    }

    /// Earliest time at or after `t` at which `thread` can run.
    pub fn next_on(&self, thread: usize, t: u64) -> u64 {
        match self.shares.get(thread) {
            Some(Some(s)) => s.next_on(t),
            _ => t,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_resumes_only_in_its_slice() {
        let s = Share {
            start: 10,
            slice: 10,
            period: 30,
            phase: 0,
        };
        assert_eq!(s.next_on(0), 10);
        assert_eq!(s.next_on(15), 15);
        assert_eq!(s.next_on(20), 40);
        assert_eq!(s.next_on(29), 40);
        assert_eq!(s.next_on(31), 40);
        let shifted = Share { phase: 5, ..s };
        assert_eq!(shifted.next_on(0), 5);
    }

    #[test]
    fn background_processes_slice_only_their_cores() {
        let p = SimParams {
            cores_per_node: 4,
            background_per_node: 2,
            ..SimParams::default()
        };
        // 4 threads on node 0 (one per core), 1 on node 1.
        let s = Slices::new(&p, 7, &[0, 0, 0, 0, 1]);
        let sliced = (0..4).filter(|&i| s.shares[i].is_some()).count();
        assert_eq!(sliced, 2, "two cores of node 0 have a background process");
        let share = s.shares.iter().flatten().next().unwrap();
        // A thread and a process: CFS gives each half of the latency period.
        assert_eq!(share.slice, p.sched_latency_ns / 2);
        assert_eq!(share.period, p.sched_latency_ns);
        assert_eq!(
            Slices::new(&SimParams::default(), 7, &[0; 4]).shares.len(),
            0
        );
    }
}
