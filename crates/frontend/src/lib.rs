//! Protocol front ends (issue 12): the wire formats applications already speak, translated to
//! Nessie operations inside each node process.
//!
//! - [`memcached`]: the memcached text protocol and its meta commands (parsing, encoding, and
//!   serving a connection);
//! - [`redis`]: the Redis protocol, RESP2 and RESP3 (the same);
//! - [`serve`]: what serving a connection needs from both: the store client a [`serve::Backend`]
//!   leases for each batch of requests, the counters, the clock;
//! - [`session`]: the read–serve–write loop of one connection;
//! - [`item`]: what a front end stores as a value (the client's flags and expiry, then data);
//! - [`inplace`]: a GET's reply built around its value, READ straight into the reply buffer;
//! - [`rmw`]: read-modify-write over the store's conditional writes (both front ends);
//! - [`keyspace`]: flushing and counting every key, over the store's scan of its index.
//!
//! Each module is transport-free: it turns bytes into requests and replies into bytes, with an
//! explicit limit on everything a client controls (line length, key length, value length).

pub mod inplace;
pub mod item;
pub mod keyspace;
pub mod memcached;
pub mod redis;
pub mod rmw;
pub mod serve;
pub mod session;
/// Test doubles (a store in a map, a client that races): the unit tests' and, with the
/// `testing` feature, other crates' tests'.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
