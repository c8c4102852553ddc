//! `extern "C"` declarations of the shim in `csrc/shim.c`. UCX handles are opaque pointers
//! here; no Rust code depends on the layout of any UCX structure.

use std::os::raw::{c_char, c_int, c_uint, c_void};

#[repr(C)]
pub struct UcpContext {
    _p: [u8; 0],
}
#[repr(C)]
pub struct UcpWorker {
    _p: [u8; 0],
}
#[repr(C)]
pub struct UcpMem {
    _p: [u8; 0],
}
#[repr(C)]
pub struct UcpRkey {
    _p: [u8; 0],
}
/// The shim's endpoint record (`nsh_ep_t`: the ucp_ep_h plus the status set by its error
/// callback).
#[repr(C)]
pub struct NshEp {
    _p: [u8; 0],
}

/// One operation of `nsh_batch` (`nsh_batch_op_t` in the shim; same layout).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct NshBatchOp {
    pub ep: *mut NshEp,
    pub rkey: *mut UcpRkey,
    pub raddr: u64,
    /// READ: destination; WRITE: source; CAS: unused.
    pub buf: *mut c_void,
    pub len: usize,
    /// CAS: the value expected.
    pub expected: u64,
    /// CAS: in, the value to swap in; out, the value found.
    pub result: u64,
    /// `NSH_OP_*`.
    pub kind: c_int,
    /// Out: the operation's `ucs_status_t`.
    pub status: c_int,
}

/// A request in flight (`nsh_pending_t` in the shim; same layout).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct NshPending {
    pub req: *mut c_void,
    pub user_mem: *mut c_void,
    pub ep: *mut NshEp,
    pub status: c_int,
}

/// One posted operation (`nsh_posted_t` in the shim; same layout): kept at one address (boxed)
/// until `nsh_posted_test` returns a final status.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct NshPosted {
    pub op: NshBatchOp,
    pub q: NshPending,
    pub flushing: c_int,
}

pub const NSH_OP_READ: c_int = 0;
pub const NSH_OP_WRITE: c_int = 1;
pub const NSH_OP_CAS: c_int = 2;
/// Most operations one `nsh_batch` call takes (`NSH_BATCH_MAX` in the shim).
pub const NSH_BATCH_MAX: usize = 64;

impl NshBatchOp {
    pub const EMPTY: NshBatchOp = NshBatchOp {
        ep: std::ptr::null_mut(),
        rkey: std::ptr::null_mut(),
        raddr: 0,
        buf: std::ptr::null_mut(),
        len: 0,
        expected: 0,
        result: 0,
        kind: NSH_OP_READ,
        status: 0,
    };
}

pub const UCS_OK: c_int = 0;
pub const UCS_INPROGRESS: c_int = 1;
pub const UCS_ERR_TIMED_OUT: c_int = -20;
pub const UCS_ERR_NOT_CONNECTED: c_int = -24;
pub const UCS_ERR_BUSY: c_int = -15;

extern "C" {
    pub fn nsh_status_string(status: c_int) -> *const c_char;
    pub fn nsh_version(major: *mut c_uint, minor: *mut c_uint, release: *mut c_uint);

    pub fn nsh_init(
        keys: *const *const c_char,
        vals: *const *const c_char,
        n: usize,
        wakeup: c_int,
        out: *mut *mut UcpContext,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn nsh_cleanup(ctx: *mut UcpContext);

    pub fn nsh_worker_create(ctx: *mut UcpContext, out: *mut *mut UcpWorker) -> c_int;
    pub fn nsh_worker_destroy(w: *mut UcpWorker);
    pub fn nsh_worker_address(w: *mut UcpWorker, addr: *mut *mut c_void, len: *mut usize) -> c_int;
    pub fn nsh_worker_release_address(w: *mut UcpWorker, addr: *mut c_void);
    pub fn nsh_worker_progress(w: *mut UcpWorker) -> c_uint;
    pub fn nsh_worker_get_efd(w: *mut UcpWorker, fd: *mut c_int) -> c_int;
    pub fn nsh_worker_arm(w: *mut UcpWorker) -> c_int;

    pub fn nsh_request_size(ctx: *mut UcpContext) -> usize;
    pub fn nsh_ep_create(
        w: *mut UcpWorker,
        addr: *const c_void,
        req_size: usize,
        block_after_ns: u64,
        out: *mut *mut NshEp,
    ) -> c_int;
    pub fn nsh_ep_status(e: *const NshEp) -> c_int;
    pub fn nsh_ep_info(e: *const NshEp, buf: *mut c_char, len: usize);
    pub fn nsh_ep_flush(w: *mut UcpWorker, e: *mut NshEp, timeout_ns: u64) -> c_int;
    pub fn nsh_ep_fail(w: *mut UcpWorker, e: *mut NshEp, status: c_int, timeout_ns: u64);
    pub fn nsh_ep_destroy(w: *mut UcpWorker, e: *mut NshEp, timeout_ns: u64);

    pub fn nsh_mem_map(
        ctx: *mut UcpContext,
        addr: *mut c_void,
        len: usize,
        memh: *mut *mut UcpMem,
        base: *mut *mut c_void,
        mapped_len: *mut usize,
    ) -> c_int;
    pub fn nsh_mem_unmap(ctx: *mut UcpContext, memh: *mut UcpMem) -> c_int;
    pub fn nsh_rkey_pack(
        ctx: *mut UcpContext,
        memh: *mut UcpMem,
        buf: *mut *mut c_void,
        len: *mut usize,
    ) -> c_int;
    pub fn nsh_rkey_buffer_release(buf: *mut c_void);
    pub fn nsh_rkey_unpack(e: *mut NshEp, buf: *const c_void, rkey: *mut *mut UcpRkey) -> c_int;
    pub fn nsh_rkey_destroy(rkey: *mut UcpRkey);
    pub fn nsh_rkey_ptr(rkey: *mut UcpRkey, raddr: u64, ptr: *mut *mut c_void) -> c_int;
    pub fn nsh_ep_check(w: *mut UcpWorker, e: *mut NshEp) -> c_int;

    pub fn nsh_get(
        w: *mut UcpWorker,
        e: *mut NshEp,
        buf: *mut c_void,
        len: usize,
        raddr: u64,
        rkey: *mut UcpRkey,
        timeout_ns: u64,
    ) -> c_int;
    pub fn nsh_put(
        w: *mut UcpWorker,
        e: *mut NshEp,
        buf: *const c_void,
        len: usize,
        raddr: u64,
        rkey: *mut UcpRkey,
        timeout_ns: u64,
    ) -> c_int;
    pub fn nsh_cswap64(
        w: *mut UcpWorker,
        e: *mut NshEp,
        expected: u64,
        desired: u64,
        raddr: u64,
        rkey: *mut UcpRkey,
        timeout_ns: u64,
        old: *mut u64,
    ) -> c_int;
    /// Post every operation of `ops[..n]` (which must not conflict), progress `w` until all
    /// complete, flush the endpoints that took a WRITE; each operation's `status` is set.
    pub fn nsh_batch(w: *mut UcpWorker, ops: *mut NshBatchOp, n: usize, timeout_ns: u64) -> c_int;
    pub fn nsh_post(w: *mut UcpWorker, p: *mut NshPosted) -> c_int;
    pub fn nsh_posted_test(p: *mut NshPosted) -> c_int;
}

/// Human-readable name of a `ucs_status_t`.
pub fn status_string(status: c_int) -> String {
    // SAFETY: ucs_status_string returns a static NUL-terminated string for any value.
    unsafe { std::ffi::CStr::from_ptr(nsh_status_string(status)) }
        .to_string_lossy()
        .into_owned()
}
