//! Many operations in flight on one client thread.
//!
//! A [`Pipeline`] takes operations ([`Op`]) with [`Pipeline::submit`] and hands back each one's
//! [`Completion`] when it finishes ([`Pipeline::poll`], [`Pipeline::wait`]). Its slots are
//! stackful coroutines (`corosensei`), each running one blocking client — the protocol's own
//! code — over a [`SlotEndpoint`]: a READ, WRITE or CAS is posted on the thread's shared
//! endpoint (`nessie_fabric::Post`) and the slot suspends until it is reported.
//!
//! Why coroutines and not futures: the protocol (CD, replication, the fence, large values) is
//! blocking code over `Endpoint`, with every step and check in one place. Futures would mean
//! writing it again as `async fn` (and every wrapper endpoint with it) or keeping two copies;
//! a coroutine runs the one copy as it is, and costs a stack per slot
//! ([`pipeline::SLOT_STACK_BYTES`]) and a register switch per suspension. The blocking API is
//! the same code called directly, so its latency cannot regress.

pub mod op;
pub mod pipeline;
pub mod slot;

pub use op::{Op, Outcome};
pub use pipeline::{
    Completion, Pipeline, PipelineEndpoint, PipelineOptions, Ticket, MAX_SLOTS, QUEUED_PER_SLOT,
};
pub use slot::SlotEndpoint;
