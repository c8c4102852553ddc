//! Nessie's protocols. [`cd`] is the client-driven protocol of the paper (GET, PUT, DELETE and
//! MIGRATE done entirely with one-sided fabric operations). The server-driven (SD) and hybrid
//! (HY) baselines will live beside it and share the store's layout and hashing.
//!
//! Every protocol is generic over `nessie_fabric::Endpoint` and never learns which fabric it
//! runs on.

pub mod cd;
pub mod config;
pub mod error;
pub mod hooks;

pub use config::{Mutations, Optimizations, ProtocolConfig, RetryPolicy};
pub use error::Error;
pub use hooks::HookPoint;

/// What every protocol's client offers: the key-value API. Workloads, stress tests and
/// benchmarks drive clients through it, whatever the protocol and fabric.
pub trait KvClient: Send {
    /// Read `key`; `Ok(None)` if absent.
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error>;
    /// Store `value` under `key`.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error>;
    /// Remove `key` (no-op if absent).
    fn delete(&mut self, key: &[u8]) -> Result<(), Error>;
}

impl<E: nessie_fabric::Endpoint> KvClient for cd::CdClient<E> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        cd::CdClient::get(self, key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        cd::CdClient::put(self, key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        cd::CdClient::delete(self, key)
    }
}
