//! The Redis front end:
//!
//! - [`resp`]: RESP2/RESP3 framing, commands parsed from a buffer and replies encoded;
//! - [`serve`]: serving it on one connection with a store client.

pub mod resp;
pub mod serve;
