//! Named points inside the protocol where tests can inject delays (e.g. stall an operation past
//! its expiry period) to force specific interleavings. Installing a [`Hook`] needs the `testing`
//! feature; without it the protocol's hook calls are empty and compile to nothing.

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum HookPoint {
    /// Any operation has just read an ITE (forward pass).
    AfterIteRead,
    /// A GET has read an ITE in its forward pass (after `AfterIteRead`).
    GetForwardPass,
    /// A DTE's header and key have been read and its value is about to be (the window in which
    /// a stalled reader could see the entry recycled and rewritten under it).
    BeforeValueRead,
    /// A GET has read a candidate DTE and is about to inspect it.
    GetAfterDteRead,
    /// A conditional write has looked at every candidate and not yet written (`guarded.rs`).
    GuardedAfterLook,
    /// A PUT/DELETE has swapped its new DTE into the candidate ITE (Step 3.1).
    AfterCandidateCas,
    /// A PUT/DELETE is about to start its reverse pass (Step 5).
    BeforeReversePass,
    /// A PUT is about to set its DTE valid (Step 6).
    BeforeSetValid,
    /// A DELETE is about to swap its tombstone for an empty ITE (Step 6).
    BeforeDeleteCommit,
    /// A MIGRATE has swapped its copy into the destination (Step 6) and not yet cleared the source.
    MigrateAfterDstCas,
    /// A MIGRATE has emptied its source (Step 7) and not yet set its copy valid.
    MigrateAfterSrcCas,
    /// An eviction has picked its victim and read its version, and not yet deleted it.
    EvictBeforeDelete,
    /// A prefetch has read its keys' ITEs and is about to read the entries they name
    /// (`prefetch.rs`).
    PrefetchBeforeEntryReads,
}

/// A test hook: called at every [`HookPoint`] by the client that owns it.
#[cfg(any(test, feature = "testing"))]
pub type Hook = Box<dyn FnMut(HookPoint) + Send>;
