//! etcd, the coordination engine behind membership (as ZooKeeper is for FaRM).
//!
//! - [`client`]: a small blocking client for etcd's v3 HTTP/JSON gateway: leases, puts, ranges
//!   and one compare-and-put transaction. Plain HTTP: the etcd is local (started by
//!   `nessie up`) or on the cluster's trusted network.
//! - [`server`]: starting and stopping the single-member etcd that `nessie up` runs by default.

pub mod client;
#[cfg(feature = "ucx")]
pub mod server;

pub use client::{Etcd, EtcdError, KeyValue, LeaseId};
