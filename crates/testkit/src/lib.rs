//! Test and demo harnesses that drive Nessie clients: the concurrency stress harness with
//! history checking ([`stress`]), the assertions the stress tests share ([`assertions`]) and
//! the demo ([`demo`]).

pub mod assertions;
pub mod demo;
pub mod guarded;
pub mod stress;
