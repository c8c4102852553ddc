//! Safe owners of UCX objects. Each type frees exactly what it owns, and holds an `Arc` to the
//! objects it depends on, so the destruction order UCX requires falls out of Rust's drop
//! order:
//!
//! rkeys → endpoints → worker (see [`ConnectedWorker`]), memory mappings → context
//! ([`Mapping`] and [`Worker`] hold `Arc<Context>`; `ucp_cleanup` runs when the last one goes).

use std::ffi::CString;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::Arc;

use nessie_fabric::memory::WordMemory;
use nessie_fabric::ALIGN;

use crate::ffi;

/// A UCX error: the ucs_status_t plus what was being done.
#[derive(Debug, Clone)]
pub(crate) struct UcxError {
    pub status: c_int,
    pub what: String,
}

impl std::fmt::Display for UcxError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, ffi::status_string(self.status))
    }
}

pub(crate) fn check(status: c_int, what: impl FnOnce() -> String) -> Result<(), UcxError> {
    if status == ffi::UCS_OK {
        Ok(())
    } else {
        Err(UcxError {
            status,
            what: what(),
        })
    }
}

/// `ucp_context_h`: configuration, transports and memory registrations of one process.
pub(crate) struct Context {
    raw: *mut ffi::UcpContext,
    /// Size of ucp's internal request (for user-provided request memory).
    request_size: usize,
}

// SAFETY: the context is created with `mt_workers_shared = 1`, which makes the context-level
// calls used here (worker creation, ucp_mem_map/unmap, rkey packing) thread safe.
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Context {
    /// `ucp_config_read` + `ucp_config_modify(key, value)` for each option + `ucp_init` with
    /// RMA | AMO64 | WAKEUP.
    pub fn new(options: &[(String, String)]) -> Result<Arc<Self>, UcxError> {
        let cstr = |s: &str| {
            CString::new(s).map_err(|_| UcxError {
                status: -5,
                what: format!("UCX option {s:?} contains NUL"),
            })
        };
        let keys = options
            .iter()
            .map(|(k, _)| cstr(k))
            .collect::<Result<Vec<_>, _>>()?;
        let vals = options
            .iter()
            .map(|(_, v)| cstr(v))
            .collect::<Result<Vec<_>, _>>()?;
        let kp: Vec<*const c_char> = keys.iter().map(|k| k.as_ptr()).collect();
        let vp: Vec<*const c_char> = vals.iter().map(|v| v.as_ptr()).collect();
        let mut raw = std::ptr::null_mut();
        let mut err = [0 as c_char; 256];
        // SAFETY: arrays of valid C strings of length n; err is a writable buffer.
        let status = unsafe {
            ffi::nsh_init(
                kp.as_ptr(),
                vp.as_ptr(),
                kp.len(),
                1,
                &mut raw,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if status != ffi::UCS_OK {
            // SAFETY: the shim NUL-terminates err (snprintf).
            let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }
                .to_string_lossy()
                .into_owned();
            return Err(UcxError { status, what: msg });
        }
        // SAFETY: valid context.
        let request_size = unsafe { ffi::nsh_request_size(raw) };
        if request_size == 0 {
            // SAFETY: valid context, not used afterwards.
            unsafe { ffi::nsh_cleanup(raw) };
            return Err(UcxError {
                status: -5,
                what: "ucp_context_query(request size)".into(),
            });
        }
        Ok(Arc::new(Self { raw, request_size }))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every worker and mapping holds an Arc to us, so none is left.
        unsafe { ffi::nsh_cleanup(self.raw) }
    }
}

/// `ucp_worker_h` (thread mode SINGLE): used by one thread at a time, hence `Send`, not `Sync`.
pub(crate) struct Worker {
    raw: *mut ffi::UcpWorker,
    ctx: Arc<Context>,
}

// SAFETY: a worker may move between threads; `&mut`/ownership guarantees one user at a time.
unsafe impl Send for Worker {}

impl Worker {
    pub fn new(ctx: &Arc<Context>) -> Result<Self, UcxError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid context.
        check(unsafe { ffi::nsh_worker_create(ctx.raw, &mut raw) }, || {
            "ucp_worker_create".into()
        })?;
        Ok(Self {
            raw,
            ctx: ctx.clone(),
        })
    }

    pub fn raw(&self) -> *mut ffi::UcpWorker {
        self.raw
    }

    /// The packed worker address (opaque bytes that a peer passes to `ucp_ep_create`).
    pub fn address(&self) -> Result<Vec<u8>, UcxError> {
        let mut p = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: valid worker; the address is copied and then released.
        unsafe {
            check(ffi::nsh_worker_address(self.raw, &mut p, &mut len), || {
                "ucp_worker_get_address".into()
            })?;
            let v = std::slice::from_raw_parts(p as *const u8, len).to_vec();
            ffi::nsh_worker_release_address(self.raw, p);
            Ok(v)
        }
    }

    pub fn progress(&mut self) -> u32 {
        // SAFETY: valid worker, exclusive access.
        unsafe { ffi::nsh_worker_progress(self.raw) }
    }

    pub fn event_fd(&self) -> Result<c_int, UcxError> {
        let mut fd = -1;
        // SAFETY: valid worker.
        check(
            unsafe { ffi::nsh_worker_get_efd(self.raw, &mut fd) },
            || "ucp_worker_get_efd".into(),
        )?;
        Ok(fd)
    }

    /// `ucp_worker_arm`: `Ok(true)` if armed (safe to sleep on the event fd), `Ok(false)` if
    /// there are unprocessed events (UCS_ERR_BUSY: progress again first).
    pub fn arm(&mut self) -> Result<bool, UcxError> {
        // SAFETY: valid worker, exclusive access.
        match unsafe { ffi::nsh_worker_arm(self.raw) } {
            ffi::UCS_OK => Ok(true),
            ffi::UCS_ERR_BUSY => Ok(false),
            s => Err(UcxError {
                status: s,
                what: "ucp_worker_arm".into(),
            }),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // SAFETY: endpoints on this worker were closed by their owner (ConnectedWorker) first.
        unsafe { ffi::nsh_worker_destroy(self.raw) }
    }
}

/// A registered (and possibly UCX-allocated) memory region: `ucp_mem_h`.
pub(crate) struct Mapping {
    memh: *mut ffi::UcpMem,
    base: *mut u8,
    len: usize,
    ctx: Arc<Context>,
}

// SAFETY: the memh is only used for unmap/rkey packing, which are context-level and thread
// safe; the memory itself is accessed only atomically (WordMemory).
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Allocate `len` bytes through UCX (`UCP_MEM_MAP_ALLOCATE`, so shared-memory transports can
    /// give peers direct access), or register `given` memory.
    pub fn new(ctx: &Arc<Context>, given: Option<*mut u8>, len: usize) -> Result<Self, UcxError> {
        let mut memh = std::ptr::null_mut();
        let mut base = std::ptr::null_mut();
        let mut mapped = 0usize;
        let addr = given.map_or(std::ptr::null_mut(), |p| p as *mut c_void);
        // SAFETY: valid context; for given memory the caller guarantees validity.
        check(
            unsafe { ffi::nsh_mem_map(ctx.raw, addr, len, &mut memh, &mut base, &mut mapped) },
            || format!("ucp_mem_map of {len} bytes"),
        )?;
        Ok(Self {
            memh,
            base: base as *mut u8,
            len: mapped.min(len),
            ctx: ctx.clone(),
        })
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// `ucp_rkey_pack`, copied into a Vec and the UCX buffer released.
    pub fn pack_rkey(&self) -> Result<Vec<u8>, UcxError> {
        let mut p = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: valid context and memh; buffer copied then released.
        unsafe {
            check(
                ffi::nsh_rkey_pack(self.ctx.raw, self.memh, &mut p, &mut len),
                || "ucp_rkey_pack".into(),
            )?;
            let v = std::slice::from_raw_parts(p as *const u8, len).to_vec();
            ffi::nsh_rkey_buffer_release(p);
            Ok(v)
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: valid memh; nobody in this process uses the memory any more (the owner drops
        // the WordMemory view first).
        let _ = unsafe { ffi::nsh_mem_unmap(self.ctx.raw, self.memh) };
    }
}

/// Connection to one peer worker: the shim endpoint and the peer's unpacked rkeys.
pub(crate) struct PeerEp {
    ep: *mut ffi::NshEp,
    rkeys: Vec<*mut ffi::UcpRkey>,
    /// Each region as mapped into this process (`ucp_rkey_ptr`), where the transport maps the
    /// peer's memory and direct access was asked for (`ConnectedWorker::map_direct`). Lives
    /// no longer than the rkeys it came from: both go with this value.
    direct: Vec<Option<WordMemory>>,
}

// SAFETY: owned by a ConnectedWorker and only used together with its worker, by one thread at
// a time.
unsafe impl Send for PeerEp {}

impl PeerEp {
    pub fn ep(&self) -> *mut ffi::NshEp {
        self.ep
    }
    pub fn rkey(&self, i: usize) -> *mut ffi::UcpRkey {
        self.rkeys[i]
    }
    /// `ucp_ep_print_info`: the endpoint's lanes and transports.
    pub fn describe(&self) -> String {
        let mut buf = vec![0 as c_char; 16384];
        // SAFETY: valid endpoint; buffer NUL-terminated by the shim.
        unsafe {
            ffi::nsh_ep_info(self.ep, buf.as_mut_ptr(), buf.len());
            std::ffi::CStr::from_ptr(buf.as_ptr())
                .to_string_lossy()
                .into_owned()
        }
    }

    /// Status recorded by the endpoint's error callback (UCS_OK while healthy).
    pub fn status(&self) -> c_int {
        // SAFETY: valid shim endpoint.
        unsafe { ffi::nsh_ep_status(self.ep) }
    }

    /// Region `i` of the peer as mapped into this process, if it is.
    pub fn direct(&self, i: usize) -> Option<&WordMemory> {
        self.direct.get(i).and_then(Option::as_ref)
    }

    /// Where region `i`, `len` bytes at the peer's address `base`, is mapped in this process:
    /// `None` unless the rkey maps it (shared-memory transports do) whole and contiguously.
    fn map_region(&self, i: usize, base: u64, len: u64) -> Option<WordMemory> {
        let ptr = |raddr: u64| {
            let mut p = std::ptr::null_mut();
            // SAFETY: valid rkey; the shim only writes `p`.
            let s = unsafe { ffi::nsh_rkey_ptr(*self.rkeys.get(i)?, raddr, &mut p) };
            (s == ffi::UCS_OK && !p.is_null()).then_some(p as *mut u8)
        };
        if len < ALIGN || !len.is_multiple_of(ALIGN) {
            return None;
        }
        let first = ptr(base)?;
        let last = ptr(base + len - ALIGN)?;
        let contiguous = (last as usize).wrapping_sub(first as usize) == (len - ALIGN) as usize;
        if !contiguous || !(first as usize).is_multiple_of(ALIGN as usize) {
            return None;
        }
        // SAFETY: aligned, mapped for `len` bytes while the rkey lives, which outlives this
        // value (both are owned by this `PeerEp`, the mapping dropped first); every access to
        // a region, in every process, is word-atomic (CPU atomics on shm).
        Some(unsafe { WordMemory::from_raw(first, len) })
    }
}

/// A worker plus its endpoints; drops rkeys, then endpoints, then the worker.
pub(crate) struct ConnectedWorker {
    peers: Vec<Option<PeerEp>>,
    close_timeout_ns: u64,
    /// An operation's wait that has polled this long sleeps on the worker's event fd (0:
    /// never; `UcxConfig::wait_spin`).
    block_after_ns: u64,
    worker: Worker,
}

impl ConnectedWorker {
    pub fn new(worker: Worker, close_timeout_ns: u64, block_after_ns: u64) -> Self {
        Self {
            peers: Vec::new(),
            close_timeout_ns,
            block_after_ns,
            worker,
        }
    }

    pub fn worker(&mut self) -> &mut Worker {
        &mut self.worker
    }

    /// Connect to a peer worker and unpack its rkeys; pushes `None` on failure and returns the
    /// error.
    pub fn connect(&mut self, address: &[u8], rkeys: &[&[u8]]) -> Result<(), UcxError> {
        let mut ep = std::ptr::null_mut();
        // SAFETY: address bytes came from ucp_worker_get_address (UCX validates the header).
        let s = unsafe {
            ffi::nsh_ep_create(
                self.worker.raw,
                address.as_ptr() as *const c_void,
                self.worker.ctx.request_size,
                self.block_after_ns,
                &mut ep,
            )
        };
        if let Err(e) = check(s, || "ucp_ep_create".into()) {
            self.peers.push(None);
            return Err(e);
        }
        let mut peer = PeerEp {
            ep,
            rkeys: Vec::with_capacity(rkeys.len()),
            direct: Vec::new(),
        };
        for (i, rk) in rkeys.iter().enumerate() {
            let mut h = std::ptr::null_mut();
            // SAFETY: valid endpoint; rkey bytes came from ucp_rkey_pack.
            let s = unsafe { ffi::nsh_rkey_unpack(ep, rk.as_ptr() as *const c_void, &mut h) };
            if let Err(e) = check(s, || format!("ucp_ep_rkey_unpack of region {i}")) {
                self.destroy_peer(peer);
                self.peers.push(None);
                return Err(e);
            }
            peer.rkeys.push(h);
        }
        self.peers.push(Some(peer));
        Ok(())
    }

    /// Take the next peer's place without connecting (its address is not known).
    pub fn skip(&mut self) {
        self.peers.push(None);
    }

    /// Replace the connection to peer `i` (a restarted process: new address, new rkeys):
    /// the old endpoint and rkeys are destroyed first. On failure the peer is left without one.
    pub fn reconnect(&mut self, i: usize, address: &[u8], rkeys: &[&[u8]]) -> Result<(), UcxError> {
        if let Some(old) = self.peers.get_mut(i).and_then(Option::take) {
            self.destroy_peer(old);
        }
        let tail = self.peers.split_off(i);
        let r = self.connect(address, rkeys);
        self.peers.extend(tail.into_iter().skip(1));
        r
    }

    /// Drop the connection to peer `i` (its info is unknown): operations to it fail.
    pub fn disconnect(&mut self, i: usize) {
        if let Some(old) = self.peers.get_mut(i).and_then(Option::take) {
            self.destroy_peer(old);
        }
    }

    /// Map peer `i`'s regions, `(base, len)` each, into this process where its transport allows
    /// (shared memory), for operations performed straight on them; returns how many are mapped.
    pub fn map_direct(&mut self, i: usize, regions: &[(u64, u64)]) -> usize {
        let Some(p) = self.peers.get_mut(i).and_then(Option::as_mut) else {
            return 0;
        };
        p.direct = regions
            .iter()
            .enumerate()
            .map(|(r, &(base, len))| p.map_region(r, base, len))
            .collect();
        p.direct.iter().flatten().count()
    }

    /// Check peer `i`'s endpoint before an operation performed straight on its memory, as a
    /// posted operation is checked: every few calls the worker is progressed so that failure
    /// events (keepalive) reach the endpoint. Returns the endpoint's status.
    pub fn check_direct(&mut self, i: usize) -> c_int {
        match self.peers.get(i).and_then(|p| p.as_ref()) {
            // SAFETY: valid worker and endpoint, used by this thread only.
            Some(p) => unsafe { ffi::nsh_ep_check(self.worker.raw, p.ep) },
            None => ffi::UCS_ERR_NOT_CONNECTED,
        }
    }

    /// The worker and the peer's endpoint, borrowed together for an operation.
    pub fn split(&mut self, i: usize) -> (&mut Worker, Option<&PeerEp>) {
        (&mut self.worker, self.peers.get(i).and_then(|p| p.as_ref()))
    }

    /// Force-close a failed peer's endpoint (its rkeys first); later ops see it as gone.
    pub fn fail_peer(&mut self, i: usize, status: c_int) {
        if let Some(mut p) = self.peers.get_mut(i).and_then(Option::take) {
            // The mappings before the rkeys that keep them.
            p.direct.clear();
            // SAFETY: valid endpoint; force close is bounded.
            unsafe {
                for r in &p.rkeys {
                    ffi::nsh_rkey_destroy(*r);
                }
                ffi::nsh_ep_fail(self.worker.raw, p.ep, status, self.close_timeout_ns);
                ffi::nsh_ep_destroy(self.worker.raw, p.ep, self.close_timeout_ns);
            }
        }
    }

    fn destroy_peer(&mut self, mut p: PeerEp) {
        p.direct.clear(); // the mappings before the rkeys that keep them
                          // SAFETY: rkeys before their endpoint; each destroyed exactly once (p is consumed).
        unsafe {
            for r in &p.rkeys {
                ffi::nsh_rkey_destroy(*r);
            }
            ffi::nsh_ep_destroy(self.worker.raw, p.ep, self.close_timeout_ns);
        }
    }
}

impl Drop for ConnectedWorker {
    fn drop(&mut self) {
        for p in std::mem::take(&mut self.peers).into_iter().flatten() {
            self.destroy_peer(p);
        }
        // then `worker` is dropped (ucp_worker_destroy)
    }
}
