//! A simulated RDMA cluster in virtual time: a fabric backend, the peer of `nessie-fabric-ucx`
//! and of the in-process fabric. It depends on `nessie-fabric` alone; the harness that runs
//! Nessie's clusters on it (benchmarks, correctness runs) is `nessie-sim`.
//!
//! The protocols run unchanged on [`SimEndpoint`]s: every simulated thread is a real OS
//! thread, but the hand-off scheduler ([`sched`]) lets one run at a time, in virtual-time
//! order, so a run is a function of its seed. Memory holds real bytes ([`WordMemory`], as in
//! the in-process backend); the model ([`net`], [`params`]) only decides *when* each READ,
//! WRITE and CAS takes effect and completes: NIC message rate, full-duplex links behind a
//! non-blocking switch, base latency, NIC-executed atomics, PCIe loopback, and CPU costs on a
//! node's cores. `docs/sim.md` describes the model and the source of every default.
//!
//! Correctness mode: [`faults`] injects delays, NIC stalls and client pauses in virtual time,
//! drawn from the run's seed; `nessie_sim::correctness` runs CD under them and checks the
//! history for linearizability (`nessie sim check`).
//!
//! ```no_run
//! use nessie_fabric::{Endpoint, RemoteAddr};
//! use nessie_fabric_sim::{Sim, SimParams};
//! let sim = Sim::new(SimParams::default(), 1, &[vec![64], vec![64]]).unwrap();
//! let mut ep = sim.endpoint(0);
//! let h = sim.spawn(ep.thread(), move || {
//!     ep.write(RemoteAddr::new(1, 0, 0), &[7; 8]).unwrap();
//!     ep.mono_ns()
//! });
//! let run = sim.run();
//! assert_eq!(h.join().unwrap(), run.end_ns);
//! ```
//!
//! [`WordMemory`]: nessie_fabric::memory::WordMemory

pub mod fabric;
pub mod faults;
pub mod net;
pub mod params;
mod procstate;
pub mod sched;
pub mod slices;
pub mod watch;

pub use fabric::{
    NodeCrashed, Sim, SimClock, SimEndpoint, SimError, SimThread, MAX_LANE_SLOTS, SIM_EPOCH_NS,
};
pub use faults::SimFaults;
pub use net::WireBytes;
pub use params::SimParams;
pub use sched::RunSummary;
