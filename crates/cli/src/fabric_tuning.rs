//! Fabric tuning flags shared by `nessie up` and `nessie bench` (`[cluster]` keys of the same
//! names; each node may differ).

use nessie_cluster::config::{MAX_PROGRESS_SPIN_US, MAX_WAIT_SPIN_US};

#[derive(clap::Args, Clone, Debug)]
pub struct FabricTuningArgs {
    /// Microseconds each node's progress thread keeps polling after an event before it sleeps
    /// (tcp: saves peers a wake-up per operation under load, for that much CPU per burst).
    #[arg(long, default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=MAX_PROGRESS_SPIN_US))]
    pub progress_spin_us: u64,
    /// Microseconds a client polls for an operation's answer before it sleeps until the answer
    /// arrives [default: 10 on tcp; shm polls throughout]; the largest value polls throughout.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=MAX_WAIT_SPIN_US))]
    pub wait_spin_us: Option<u64>,
    /// Send operations on a node's own memory through UCX's loopback instead of straight to
    /// memory (shm and tcp do the latter by default).
    #[arg(long)]
    pub no_direct_loopback: bool,
    /// Send operations on other nodes' memory through UCX instead of straight to the memory
    /// UCX maps into each process (shm does the latter by default).
    #[arg(long)]
    pub no_direct_peers: bool,
}
