//! [`UcxNode`]: one per node process. Owns the ucp context, this node's registered regions and
//! the progress thread of the node's own worker (the worker peers connect to).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nessie_fabric::memory::WordMemory;
use nessie_fabric::{FabricError, FabricStats, NodeId, RegionId, ALIGN};

use crate::sys::{Context, Mapping, UcxError, Worker};
use crate::{UcxConfig, UcxEndpoint};

/// What peers need to reach one node: plain bytes, published by a bootstrap service.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeInfo {
    /// Packed address of the node's worker (`ucp_worker_get_address`).
    pub worker_address: Vec<u8>,
    /// The node's regions, indexed by [`RegionId`].
    pub regions: Vec<RegionInfo>,
}

impl NodeInfo {
    /// A node whose info is not known (it was down when this one started): endpoints treat it
    /// as unreachable until `UcxNode::set_peer` gives its info.
    pub fn unknown() -> Self {
        Self {
            worker_address: Vec::new(),
            regions: Vec::new(),
        }
    }

    pub fn is_unknown(&self) -> bool {
        self.worker_address.is_empty()
    }
}

/// One registered region of a node.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegionInfo {
    /// Virtual address of the region in the owning process (the remote address of offset 0).
    pub base: u64,
    /// Usable length in bytes (a multiple of 8).
    pub len: u64,
    /// Packed remote key (`ucp_rkey_pack`).
    pub rkey: Vec<u8>,
}

/// Where a region's memory comes from.
#[derive(Copy, Clone, Debug)]
pub enum RegionSource {
    /// Allocated (zeroed) through `ucp_mem_map(UCP_MEM_MAP_ALLOCATE)`. On shm this is a
    /// shared-memory segment peers map and access directly: the only way shm READ/WRITE/CAS
    /// complete without the target's help.
    Allocate(u64),
    /// Caller-provided memory, registered with `ucp_mem_map`. Over shm such memory is reached
    /// by cma (READ/WRITE) and CAS is emulated in software by the target's progress thread.
    Provided { ptr: *mut u8, len: u64 },
}

/// The huge page size `HugePages::Require` rounds regions up to (x86-64 and arm64 default).
const HUGE_PAGE_BYTES: u64 = 2 << 20;

/// What backs a region, read from `/proc/self/smaps` after allocation.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PageBacking {
    /// Page size of the mapping (`KernelPageSize`): 4 for ordinary pages, 2048 or 1048576 for
    /// hugetlbfs pages.
    pub page_kib: u64,
    /// Transparent huge pages currently in the mapping (`AnonHugePages` + `ShmemPmdMapped`).
    pub thp_kib: u64,
}

impl PageBacking {
    /// Whether any of the region sits on huge pages (hugetlbfs or transparent).
    pub fn is_huge(&self) -> bool {
        self.page_kib > 4 || self.thp_kib > 0
    }

    /// The backing of the mapping that contains `addr`, if `/proc/self/smaps` lists it.
    pub fn of(addr: u64) -> Option<PageBacking> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        let mut b = PageBacking {
            page_kib: 0,
            thp_kib: 0,
        };
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
                if inside {
                    break;
                }
                let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16))
                else {
                    continue;
                };
                inside = (lo..hi).contains(&addr);
            } else if inside {
                let kib = || {
                    line.split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                match first {
                    "KernelPageSize:" => b.page_kib = kib(),
                    "AnonHugePages:" | "ShmemPmdMapped:" => b.thp_kib += kib(),
                    _ => {}
                }
            }
        }
        (b.page_kib > 0).then_some(b)
    }
}

pub(crate) struct Region {
    // Field order is drop order: the view first, then the mapping it points into.
    pub mem: WordMemory,
    pub backing: Option<PageBacking>,
    _map: Mapping,
}

/// State shared by a node and the endpoints made from it (which may outlive the `UcxNode`).
pub(crate) struct NodeShared {
    pub node: NodeId,
    pub regions: Vec<Region>,
    pub config: UcxConfig,
    pub info: NodeInfo,
    pub ctx: Arc<Context>,
    /// Peers whose process was restarted since the endpoints connected (`UcxNode::set_peer`).
    pub peers: PeerTable,
}

/// New connection details of restarted peers: every endpoint reconnects to a peer whose
/// generation moved past the one it connected with.
#[derive(Default)]
pub(crate) struct PeerTable {
    /// Bumped on every change: an endpoint compares it with what it saw, one load per op.
    pub epoch: std::sync::atomic::AtomicU64,
    /// Per node: generation (0: as at startup) and its info now (`None`: unknown, unreachable).
    pub infos: Mutex<Vec<(u64, Option<NodeInfo>)>>,
    /// Per node: how many times it was said to be reachable again (`UcxNode::renew_peer`).
    /// Read only by an endpoint about to use a connection it had given up on.
    pub renewals: Mutex<Vec<u64>>,
}

impl PeerTable {
    /// How many times `node` was renewed.
    pub fn renewals_of(&self, node: usize) -> u64 {
        let r = self.renewals.lock().unwrap();
        r.get(node).copied().unwrap_or(0)
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Want {
    Run,
    Pause,
    Stop,
}

struct ProgressCtl {
    /// (requested state, state the thread has reached)
    state: Mutex<(Want, Want)>,
    /// Set with every request, so a spinning progress thread notices it without locking.
    attention: AtomicBool,
    /// Keep polling this long after the last event before sleeping (0: sleep at once).
    spin: Duration,
    cv: Condvar,
    /// eventfd that wakes the thread out of poll().
    wake: OwnedFd,
}

impl ProgressCtl {
    /// Running, with a fresh eventfd to wake the thread.
    fn new(spin: Duration) -> Result<Self, FabricError> {
        // SAFETY: plain syscall; the result is checked.
        let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(FabricError::Transport(format!(
                "eventfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Self {
            state: Mutex::new((Want::Run, Want::Run)),
            attention: AtomicBool::new(false),
            spin,
            cv: Condvar::new(),
            // SAFETY: fresh fd we own.
            wake: unsafe { OwnedFd::from_raw_fd(wake) },
        })
    }

    fn kick(&self) {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to an eventfd we own.
        unsafe {
            libc::write(
                self.wake.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }

    fn request(&self, want: Want) {
        let mut st = self.state.lock().unwrap();
        st.0 = want;
        self.attention.store(true, Ordering::SeqCst);
        self.cv.notify_all();
        drop(st);
        self.kick();
    }

    /// Wait until the thread has reached `want` (or exited).
    fn await_state(&self, want: Want) {
        let mut st = self.state.lock().unwrap();
        while st.1 != want && st.1 != Want::Stop {
            st = self.cv.wait(st).unwrap();
        }
    }
}

/// One node of the fabric (one per process). See the crate docs for the design.
pub struct UcxNode {
    shared: Arc<NodeShared>,
    stats: Arc<FabricStats>,
    ctl: Arc<ProgressCtl>,
    progress: Option<JoinHandle<()>>,
}

fn ucx_err(e: UcxError) -> FabricError {
    FabricError::Transport(e.to_string())
}

/// The memory a region source names, and its length in bytes: an allocation rounded up to
/// whole words, or provided memory, which must already be aligned.
fn region_extent(src: &RegionSource) -> Result<(Option<*mut u8>, u64), FabricError> {
    match *src {
        RegionSource::Allocate(b) => Ok((None, b.div_ceil(ALIGN).max(1) * ALIGN)),
        RegionSource::Provided { ptr, len } => {
            if !(ptr as usize).is_multiple_of(ALIGN as usize)
                || !len.is_multiple_of(ALIGN)
                || len == 0
            {
                return Err(FabricError::Misaligned {
                    offset: ptr as u64,
                    len,
                    align: ALIGN,
                });
            }
            Ok((Some(ptr), len))
        }
    }
}

/// Map and register one region: its view for this process and what peers need to reach it.
///
/// # Safety
/// As [`UcxNode::with_regions`] for a provided `src`.
unsafe fn map_region(
    ctx: &Arc<Context>,
    src: &RegionSource,
    config: &UcxConfig,
) -> Result<(Region, RegionInfo), FabricError> {
    let (given, len) = region_extent(src)?;
    let require = config.huge_pages == crate::HugePages::Require && given.is_none();
    // UCX's sysv MD only takes huge pages when rounding up to one at most doubles the
    // request; under `Require` round up ourselves (the tail is unused).
    let len = if require {
        len.div_ceil(HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    } else {
        len
    };
    let hint = |what: String| {
        FabricError::Transport(format!(
            "{what}; huge_pages = require needs at least {} free 2 MiB huge pages for this region \
             (see /proc/meminfo HugePages_Free; reserve with `sysctl vm.nr_hugepages=N`), \
             or use huge_pages = try",
            len.div_ceil(HUGE_PAGE_BYTES)
        ))
    };
    let map = Mapping::new(ctx, given, len as usize).map_err(|e| {
        if require {
            hint(e.to_string())
        } else {
            ucx_err(e)
        }
    })?;
    let backing = PageBacking::of(map.base() as u64);
    if require && backing.is_none_or(|b| b.page_kib <= 4) {
        return Err(hint(format!(
            "region of {len} bytes is not on hugetlbfs pages ({backing:?})"
        )));
    }
    let len = (map.len() as u64 / ALIGN) * ALIGN;
    if given.is_none() {
        // Not zeroed by hand: every method of `ALLOC_PRIO` (`config::alloc_prio`) maps fresh
        // kernel pages, zero until written and resident only once touched, so a node's
        // tables, spare mirror slots above all, take memory as they fill. Spot-check it (two
        // pages touched), as memory that came from anywhere else would be a format error.
        // SAFETY: freshly mapped, `len` bytes, word aligned; nobody else knows of it yet.
        let (first, last) = unsafe {
            let words = map.base() as *const u64;
            (*words, *words.add(len as usize / ALIGN as usize - 1))
        };
        if first != 0 || last != 0 {
            return Err(FabricError::Transport(format!(
                "a region of {len} bytes allocated by UCX is not zeroed (first word {first:#x}, \
                 last {last:#x}): UCX_ALLOC_PRIO must list only methods that map fresh pages"
            )));
        }
        if config.huge_pages != crate::HugePages::Off && backing.is_none_or(|b| b.page_kib <= 4) {
            // Transparent huge pages where the kernel gives them (anonymous memory; shared
            // memory only as `shmem_enabled` allows): what UCX's `thp` method did, without its
            // heap. Advice only: an error changes nothing.
            // SAFETY: the mapping is ours, `len` bytes from its page-aligned base.
            unsafe {
                libc::madvise(
                    map.base() as *mut libc::c_void,
                    len as usize,
                    libc::MADV_HUGEPAGE,
                )
            };
        }
    }
    let info = RegionInfo {
        base: map.base() as u64,
        len,
        rkey: map.pack_rkey().map_err(ucx_err)?,
    };
    // SAFETY: the mapping is aligned (UCX allocations are page aligned, provided memory
    // is checked above), lives as long as the view (same Region), and is only accessed
    // atomically in this process.
    let mem = unsafe { WordMemory::from_raw(map.base(), len) };
    let region = Region {
        mem,
        backing,
        _map: map,
    };
    Ok((region, info))
}

impl UcxNode {
    /// Start node `node` with zeroed regions of the given sizes (bytes, rounded up to 8),
    /// allocated by UCX.
    pub fn new(
        node: NodeId,
        region_sizes: &[u64],
        config: &UcxConfig,
    ) -> Result<Self, FabricError> {
        let src: Vec<_> = region_sizes
            .iter()
            .map(|&b| RegionSource::Allocate(b))
            .collect();
        // SAFETY: no caller-provided memory.
        unsafe { Self::with_regions(node, &src, config) }
    }

    /// Start a node whose regions may be caller-provided memory.
    ///
    /// # Safety
    /// Every [`RegionSource::Provided`] pointer must be 8-byte aligned, valid for `len` bytes
    /// for as long as this node and every endpoint made from it live, and only ever accessed
    /// atomically (as `AtomicU64` words) by this process.
    pub unsafe fn with_regions(
        node: NodeId,
        regions: &[RegionSource],
        config: &UcxConfig,
    ) -> Result<Self, FabricError> {
        let ctx = Context::new(&config.ucp_options()).map_err(ucx_err)?;
        let mut regs = Vec::with_capacity(regions.len());
        let mut infos = Vec::with_capacity(regions.len());
        for src in regions {
            // SAFETY: passed on from our caller.
            let (region, info) = unsafe { map_region(&ctx, src, config)? };
            regs.push(region);
            infos.push(info);
        }

        let mut worker = Worker::new(&ctx).map_err(ucx_err)?;
        let info = NodeInfo {
            worker_address: worker.address().map_err(ucx_err)?,
            regions: infos,
        };
        let efd = worker.event_fd().map_err(ucx_err)?;
        let ctl = Arc::new(ProgressCtl::new(config.progress_spin)?);
        let shared = Arc::new(NodeShared {
            node,
            regions: regs,
            config: config.clone(),
            info,
            ctx,
            peers: PeerTable::default(),
        });
        let c = ctl.clone();
        // Drive the worker once so its interfaces are ready before anyone connects.
        worker.progress();
        let progress = std::thread::Builder::new()
            .name(format!("ucx-progress-{node}"))
            .spawn(move || progress_loop(worker, efd, &c))
            .map_err(|e| FabricError::Transport(format!("spawning the progress thread: {e}")))?;
        Ok(Self {
            shared,
            stats: Arc::new(FabricStats::default()),
            ctl,
            progress: Some(progress),
        })
    }

    /// This node's id.
    pub fn node(&self) -> NodeId {
        self.shared.node
    }

    /// What peers need to reach this node (publish it through the bootstrap service).
    pub fn info(&self) -> &NodeInfo {
        &self.shared.info
    }

    pub fn config(&self) -> &UcxConfig {
        &self.shared.config
    }

    /// Direct view of one of this node's regions.
    pub fn region(&self, region: RegionId) -> Option<&WordMemory> {
        self.shared.regions.get(region as usize).map(|r| &r.mem)
    }

    /// What backs region `region` (page size, transparent huge pages), if known.
    pub fn region_backing(&self, region: RegionId) -> Option<PageBacking> {
        self.shared
            .regions
            .get(region as usize)
            .and_then(|r| r.backing)
    }

    /// Counters of every endpoint made from this node.
    pub fn stats(&self) -> &Arc<FabricStats> {
        &self.stats
    }

    /// A new endpoint for one worker thread. `cluster[n]` is node `n`'s [`NodeInfo`], including
    /// this node's own (loopback operations go through UCX too).
    pub fn endpoint(&self, cluster: &[NodeInfo]) -> Result<UcxEndpoint, FabricError> {
        UcxEndpoint::connect(
            self.shared.clone(),
            self.stats.register(self.node()),
            cluster,
        )
    }

    /// Peer `node`'s process was restarted: its worker address and rkeys are `info` now
    /// (`None`: not known, operations to it fail until it is). Every endpoint of this node
    /// reconnects before its next operation.
    pub fn set_peer(&self, node: NodeId, info: Option<NodeInfo>) {
        let mut t = self.shared.peers.infos.lock().unwrap();
        if t.len() <= node as usize {
            t.resize(node as usize + 1, (0, None));
        }
        let e = &mut t[node as usize];
        *e = (e.0 + 1, info);
        self.shared
            .peers
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Peer `node` (the same process as before) should be reachable again: every endpoint of
    /// this node that gave up on it (an operation failed or timed out) connects to it afresh
    /// before its next operation to it. Connections that work are left alone. A connection that
    /// broke stays broken until then, since the fabric cannot tell a peer that is gone from one
    /// that was stopped for a while; the caller (membership) can.
    pub fn renew_peer(&self, node: NodeId) {
        let mut r = self.shared.peers.renewals.lock().unwrap();
        if r.len() <= node as usize {
            r.resize(node as usize + 1, 0);
        }
        r[node as usize] += 1;
    }

    /// Stop driving the node's worker until [`Self::resume_progress`]; returns once the
    /// progress thread is parked. Over shm, READ/WRITE/CAS to this node keep completing
    /// (tests use this to prove it); over tcp they stall and time out.
    pub fn pause_progress(&self) {
        self.ctl.request(Want::Pause);
        self.ctl.await_state(Want::Pause);
    }

    /// Resume the progress thread after [`Self::pause_progress`].
    pub fn resume_progress(&self) {
        self.ctl.request(Want::Run);
        self.ctl.await_state(Want::Run);
    }
}

impl Drop for UcxNode {
    fn drop(&mut self) {
        self.ctl.request(Want::Stop);
        if let Some(h) = self.progress.take() {
            let _ = h.join();
        }
    }
}

/// Event-driven progress of the node's worker: progress until idle, arm, sleep in poll() on
/// the worker's event fd and the control eventfd.
fn progress_loop(mut worker: Worker, efd: i32, ctl: &ProgressCtl) {
    let wake = ctl.wake.as_raw_fd();
    loop {
        {
            let mut st = ctl.state.lock().unwrap();
            ctl.attention.store(false, Ordering::SeqCst);
            if st.0 == Want::Pause {
                st.1 = Want::Pause;
                ctl.cv.notify_all();
                while st.0 == Want::Pause {
                    st = ctl.cv.wait(st).unwrap();
                }
            }
            st.1 = st.0;
            ctl.cv.notify_all();
            if st.0 == Want::Stop {
                break;
            }
        }
        while worker.progress() != 0 {}
        if !ctl.spin.is_zero() {
            // Busy-poll a little longer: under load the next request usually arrives before
            // an epoll wake-up would have been needed (saves the wake-up latency).
            let mut until = Instant::now() + ctl.spin;
            while !ctl.attention.load(Ordering::Relaxed) && Instant::now() < until {
                if worker.progress() != 0 {
                    until = Instant::now() + ctl.spin;
                }
            }
            if ctl.attention.load(Ordering::Relaxed) {
                continue;
            }
        }
        match worker.arm() {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                // Cannot sleep on events: fall back to polling with a short nap.
                eprintln!("nessie-fabric-ucx: {e}; progress thread falls back to 1 ms polling");
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
        }
        let mut fds = [
            libc::pollfd {
                fd: efd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: valid pollfd array.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if fds[1].revents != 0 {
            let mut v: u64 = 0;
            // SAFETY: reading 8 bytes from our nonblocking eventfd resets it.
            unsafe { libc::read(wake, &mut v as *mut u64 as *mut libc::c_void, 8) };
        }
    }
    // `worker` is destroyed here, on the thread that drove it.
    drop(worker);
    let mut st = ctl.state.lock().unwrap();
    st.1 = Want::Stop;
    ctl.cv.notify_all();
}
