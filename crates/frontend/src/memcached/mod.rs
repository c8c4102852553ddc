//! The memcached front end:
//!
//! - [`proto`]: the text protocol's requests and replies (parsing and encoding);
//! - [`meta`]: memcached 1.6's meta commands (`mg`, `ms`, `md`, `ma`, `mn`);
//! - [`serve`]: serving it on one connection with a store client.

pub mod meta;
pub mod proto;
pub mod serve;
