//! UCX backend of the Nessie fabric: one-sided READ, WRITE and 64-bit CAS between node
//! processes through UCX's ucp API, over shared memory, TCP or RDMA verbs.
//!
//! # Pieces
//! - [`UcxNode`] — one per node process. Owns the ucp context, registers this node's regions
//!   and publishes [`NodeInfo`] (worker address + per region: base address, length, packed
//!   rkey; plain serde-serialisable bytes) for a bootstrap service to distribute.
//! - [`UcxEndpoint`] — one per client worker thread, `impl nessie_fabric::Endpoint`. Built from
//!   the node and the `NodeInfo` of every node, **including its own**: index entries on the own
//!   node are accessed through the fabric (Loopback), DTEs of the own node directly
//!   (`local_read`/`local_write`, Direct).
//! - [`bench_op`] — latency of single blocking operations (for `nessie fabric-bench`); its docs
//!   say how to compare with `ucx_perftest`.
//!
//! ```no_run
//! use nessie_fabric::{Endpoint, RemoteAddr};
//! use nessie_fabric_ucx::{Transport, UcxConfig, UcxNode};
//! # fn publish_and_collect(_: &nessie_fabric_ucx::NodeInfo) -> Vec<nessie_fabric_ucx::NodeInfo> { vec![] }
//! let node = UcxNode::new(1, &[1 << 20, 64 << 20], &UcxConfig::new(Transport::Shm))?;
//! let cluster = publish_and_collect(node.info()); // bootstrap: cluster[n] is node n's info
//! let mut ep = node.endpoint(&cluster)?;           // one per worker thread
//! let old = ep.compare_and_swap(RemoteAddr::new(0, 0, 64), 0, 42)?;
//! # Ok::<(), nessie_fabric::FabricError>(())
//! ```
//!
//! # Contexts, workers, threads
//! One ucp context per process (features RMA | AMO64 | WAKEUP, `mt_workers_shared`), one ucp
//! worker per thread, each in thread mode SINGLE so UCX takes no locks: the node's own worker
//! (the one peers connect to), driven only by the progress thread, and one worker per
//! `UcxEndpoint`, driven only by the thread that owns the endpoint (`Send`, not `Sync`). An
//! endpoint has a ucp endpoint (error mode PEER) to every node's worker and the unpacked rkey of
//! every region. Drop order is enforced by ownership: rkeys, then ucp endpoints (graceful close,
//! forced for failed peers, bounded by `op_timeout`), then the worker; the context
//! (`ucp_cleanup`) and the region mappings go when the node *and* all its endpoints are gone, so
//! an endpoint may outlive its `UcxNode`. All UCX calls go through a small C shim
//! (`csrc/shim.c`, built with `cc`, UCX found with `pkg-config`) taking plain arguments, so no
//! Rust code depends on the layout of `ucp_*_params_t`; no UCX type is public.
//!
//! # Completion by polling
//! Each operation posts one nbx call (`ucp_get_nbx`, `ucp_put_nbx`, `ucp_atomic_op_nbx` with
//! `UCP_ATOMIC_OP_CSWAP`) and busy-polls its own worker with `ucp_worker_progress` until the
//! request completes — the paper's model of one outstanding operation per client worker. A
//! WRITE is followed by `ucp_ep_flush_nbx`, so it has completed *at the target* when `write`
//! returns (a put alone only means the source buffer is reusable). Bounds and alignment are
//! checked before anything is posted, with the same errors, in the same order, as the
//! in-process backend (`nessie_fabric::inproc`); counters are recorded only for operations that
//! succeeded. Creating an endpoint flushes every ucp endpoint once, so wireup is finished before
//! the endpoint is used (this also avoids a UCX 1.13 assertion when a worker is destroyed with a
//! wireup reply still pending towards an idle worker).
//!
//! # The progress thread
//! Over shm (and RDMA) READ/WRITE/CAS are executed by the initiator (CPU on a mapped segment, or
//! the NIC): the target process does nothing. Over TCP, UCX emulates RMA and atomics with active
//! messages that the *target's* worker must process, so every node runs a progress thread on its
//! worker: progress until idle, `ucp_worker_arm`, then `poll()` on the worker's event fd
//! (`ucp_worker_get_efd`) and a control eventfd. An idle node therefore uses ~0% CPU (the tests
//! measure it), and a TCP operation pays one thread wake-up at the target unless
//! [`UcxConfig::progress_spin`] keeps the thread polling for a while after each event.
//! [`UcxNode::pause_progress`]/[`UcxNode::resume_progress`] park the thread; the tests use it
//! to show that shm READ/WRITE/CAS complete without any help from the target, and that TCP
//! operations then time out (so the pause is real).
//!
//! # Transports ([`Transport`], applied with `ucp_config_modify`, never via the environment)
//! - `Shm` → `TLS=sm,self`. Regions are allocated by `ucp_mem_map(ALLOCATE)`, which takes them
//!   from the sysv (else posix) shared-memory MD, so peers map the segment when they unpack the
//!   rkey; `ucx_info -d` lists 32/64-bit atomics including `atomic_cswap` for **sysv, posix and
//!   self** (CPU atomics on the mapped memory), none for cma (cma only has get/put zcopy through
//!   process_vm_readv/writev). The lanes UCX picks here: sysv (am, amo, keepalive) and posix
//!   (amo); put is short/bcopy, get bcopy, i.e. memcpy by the initiator.
//!   `MM_ERROR_HANDLING=y` is set because UCX 1.13's posix/sysv only advertise peer-failure
//!   handling with it; without it an shm endpoint in error mode PEER cannot be created ("no
//!   peer failure handler"). Caller-provided memory ([`RegionSource::Provided`]) cannot be
//!   exposed by sysv/posix: UCX then serves it in software through the target's worker (CAS
//!   included), i.e. it needs the progress thread like TCP.
//! - `Tcp` → `TLS=tcp,self` (plus `NET_DEVICES`, e.g. `lo` for the tests). tcp has no RMA or
//!   atomic capability of its own (`ucx_info -d` lists none): READ, WRITE and CAS are all
//!   software-emulated by the target worker (CAS executed there by the CPU), so they need the
//!   progress thread and cost a round trip plus a wake-up.
//! - `Auto` → UCX's default transport selection: RC/DC verbs with NIC atomics on RDMA hardware;
//!   on this kind of machine it picks sysv/posix within a host.
//!
//! CAS works on both shm and tcp (tested across three processes, increments sum exactly).
//!
//! # Errors and dead peers
//! Every ucp endpoint uses `UCP_ERR_HANDLING_MODE_PEER` with an error callback, and the context
//! sets `KEEPALIVE_INTERVAL` (and TCP keepalive) from [`UcxConfig::keepalive_interval`]
//! (default 1 s). On top of that every operation has a deadline, [`UcxConfig::op_timeout`]
//! (default 5 s). A failure (error callback, failed request, or deadline) force-closes that
//! peer's ucp endpoint and returns `FabricError::Unreachable { node, .. }`; the peer then stays
//! unreachable *for this endpoint* (further calls fail at once; a new endpoint may try again).
//! What the tests observe on this machine after SIGKILL of a peer:
//! - tcp: the kernel resets the connection; the next operation fails within microseconds.
//! - shm: the dead node's segment stays mapped in the survivors, so operations keep
//!   "succeeding" on the orphaned memory until UCX's keepalive (which checks the peer process)
//!   fails the endpoint, about one keepalive interval later (~1 s). Keepalive only runs while
//!   the endpoint's worker is progressed, i.e. during operations ([`UcxEndpoint::progress`]
//!   lets an idle thread drive it). Operations performed straight on a peer's mapped segment
//!   ([`UcxConfig::direct_peers`]) progress the worker as often as posted ones do (every 32nd
//!   operation) and check the endpoint's status first, so they find a dead peer as soon.
//!
//! An operation that timed out may still take effect at the target later (its request was
//! already on the wire): Unreachable does not mean "did not happen". UCX does not validate
//! `NodeInfo` bytes; corrupted addresses or rkeys can crash the process (they must come from a
//! trusted bootstrap). UCX 1.13 also crashes when it purges an outstanding software-emulated
//! CAS (forced close or peer failure); the shim avoids this by giving every operation its own
//! zeroed request memory (`UCP_OP_ATTR_FIELD_REQUEST`).
//!
//! # Memory ordering
//! Regions are viewed locally as `AtomicU64` words (`WordMemory::from_raw`), so direct accesses
//! are word-atomic and ordered as in the in-process backend. Fabric operations are ordered
//! *between* operations: each one has completed at the target before the next is issued (WRITE
//! is flushed; READ and CAS complete only when their data is back), so "DTE written, then CAS
//! publishes the ITE" holds on every transport. *Within* one READ or WRITE there is no
//! guarantee of ascending word order, and word atomicity rests on memcpy of 8-byte-aligned data:
//! - shm: the initiator's memcpy (glibc; vector or `rep movsb` copies, possibly overlapping or
//!   backwards) directly on the shared segment. On x86-64, aligned 8-byte words are not torn in
//!   practice, but the order in which words of one WRITE become visible is unspecified.
//! - tcp: the target worker memcpys received data into the region (WRITE) or the region into
//!   its reply (READ); same caveat. CAS is a CPU compare-and-swap at the target, atomic with
//!   respect to other fabric CAS and to direct `AtomicU64` accesses.
//! - RDMA (Auto on verbs): PCIe/NIC semantics; ordering within one RDMA WRITE is not
//!   guaranteed either, and NIC atomics are atomic only with respect to other NIC atomics
//!   (hence the protocol's rule that index entries are always accessed through the fabric).
//!
//! Protocol steps that need "word A visible before word B" must use two operations.

mod bench;
mod config;
mod endpoint;
mod ffi;
mod node;
mod sys;

pub use bench::{bench_copy, bench_local_over, bench_op, bench_op_over, BenchOp, LatencyStats};
pub use config::{HugePages, ParseError, Transport, UcxConfig, TCP_WAIT_SPIN};
pub use endpoint::UcxEndpoint;
pub use node::{NodeInfo, PageBacking, RegionInfo, RegionSource, UcxNode};

/// Version of the UCX library in use, as (major, minor, release).
pub fn ucx_version() -> (u32, u32, u32) {
    let (mut a, mut b, mut c) = (0, 0, 0);
    // SAFETY: writes three integers.
    unsafe { ffi::nsh_version(&mut a, &mut b, &mut c) };
    (a, b, c)
}
