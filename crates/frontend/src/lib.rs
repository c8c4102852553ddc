//! Protocol front ends (issue 12): the wire formats applications already speak, translated to
//! Nessie operations inside each node process. So far:
//! - [`memcache`]: the memcached text protocol's requests and replies (parsing and encoding);
//! - [`meta`]: memcached 1.6's meta commands (`mg`, `ms`, `md`, `ma`, `mn`);
//! - [`mc_serve`]: serving it on one connection with a store client;
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
pub mod mc_serve;
pub mod memcache;
pub mod meta;
pub mod resp;
pub mod resp_serve;
pub mod rmw;
pub mod session;
#[cfg(test)]
mod testing;
