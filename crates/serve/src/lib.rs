//! What a node serves its clients with, over TCP and without UCX (the node process in
//! `nessie_cluster` puts it together with its store clients):
//!
//! - [`frontends`]: the protocol front ends a node serves on TCP (memcached, Redis), on
//!   [`evloop`] event loops;
//! - [`accept`]: accepting connections when file descriptors run out, and the limit raised at
//!   start;
//! - [`pool`]: a node's store clients, leased by its front ends and its admin socket;
//! - [`metered`]: the per-operation counters and latencies of those clients, for the node's
//!   Prometheus metrics;
//! - [`expire`]: expired items reclaimed in the background, a window of the node's index at a
//!   time.

pub mod accept;
pub mod evloop;
pub mod expire;
pub mod frontends;
pub mod metered;
pub mod pool;
