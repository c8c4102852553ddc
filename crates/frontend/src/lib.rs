//! Protocol front ends (issue 12): the wire formats applications already speak, translated to
//! Nessie operations inside each node process. So far:
//! - [`memcache`]: the memcached text protocol's requests and replies (parsing and encoding;
//!   not yet served).
//!
//! Each module is transport-free: it turns bytes into requests and replies into bytes, with an
//! explicit limit on everything a client controls (line length, key length, value length).

pub mod memcache;
