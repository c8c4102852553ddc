//! The paper's baselines, run beside Nessie on the same store layout and hashing (see
//! `docs/baselines.md`): [`sd`] (NessieSD, server-driven, HERD-like) and [`hy`] (NessieHY,
//! client-driven GET and server-driven PUT/DELETE, FaRM-KV-like), both over the coupled index,
//! and [`pilaf`] (Pilaf, ATC 2013: client-driven GETs verified by CRC64, server-driven writes
//! into its own checksummed hash table). `nessie-deploy` picks one per cluster (`Mode`).
//!
//! They stand on `nessie-protocols` (the view, the configuration, the client-driven worker that
//! SD's and HY's servers execute with) and never the other way round.

/// `mutated!(cfg, name)`: whether the test-only mutation `name` is on in `cfg` (a
/// `ProtocolConfig` or an `sd` server's options). Without the `testing` feature it is the
/// constant `false`, so production code carries no trace of them. The same as
/// `nessie_protocols`' own, defined again on purpose: its `cfg` must be this crate's `testing`
/// feature (which gates `RpcMutations`), not the protocols crate's, which another crate of the
/// build may turn on alone.
#[cfg(any(test, feature = "testing"))]
macro_rules! mutated {
    ($cfg:expr, $name:ident) => {
        $cfg.mutations.$name
    };
}
#[cfg(not(any(test, feature = "testing")))]
macro_rules! mutated {
    ($cfg:expr, $name:ident) => {{
        let _ = &$cfg;
        false
    }};
}

pub mod hy;
pub mod pilaf;
pub mod sd;

use nessie_fabric::Endpoint;
use nessie_protocols::{Error, KvClient};

impl<E: Endpoint> KvClient for sd::SdClient<E> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        sd::SdClient::get(self, key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        sd::SdClient::put(self, key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        sd::SdClient::delete(self, key)
    }
}

impl<E: Endpoint> KvClient for hy::HyClient<E> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        hy::HyClient::get(self, key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        hy::HyClient::put(self, key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        hy::HyClient::delete(self, key)
    }
}

impl<E: Endpoint> KvClient for pilaf::PilafClient<E> {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        pilaf::PilafClient::get(self, key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        pilaf::PilafClient::put(self, key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        pilaf::PilafClient::delete(self, key)
    }
}
