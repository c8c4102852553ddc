//! Backend configuration: transport selection and failure-detection timing, turned into
//! `ucp_config_modify` options (never into process environment changes).

use std::time::Duration;

/// A name on the command line or in a config file that is none of the accepted ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("unknown transport {0:?} (expected shm, tcp or auto)")]
    Transport(String),
    #[error("unknown huge-pages policy {0:?} (expected off, try or require)")]
    HugePages(String),
    #[error("unknown op {0:?} (expected read, write or cas)")]
    BenchOp(String),
}

/// How long an operation over tcp polls for its answer before it sleeps on its worker's event
/// fd (`Transport::default_wait_spin`).
pub const TCP_WAIT_SPIN: Duration = Duration::from_micros(10);

/// Which UCX transports carry the fabric.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Same-host shared memory: `UCX_TLS=sm,self` (posix / sysv shared-memory segments with
    /// CPU atomics, plus cma). READ, WRITE and CAS are performed entirely by the initiator's
    /// CPU on the target's memory: no help from the target process is needed.
    Shm,
    /// TCP sockets: `UCX_TLS=tcp,self`. RMA and atomics are emulated in software by the
    /// target's UCX worker, which the node's progress thread drives.
    Tcp,
    /// UCX's own choice (`UCX_TLS` untouched): RC/DC verbs on RDMA hardware, else shm/tcp.
    #[default]
    Auto,
}

impl Transport {
    /// The `UCX_TLS` value this transport maps to (`None`: leave UCX's default).
    pub fn tls(self) -> Option<&'static str> {
        match self {
            Transport::Shm => Some("sm,self"),
            Transport::Tcp => Some("tcp,self"),
            Transport::Auto => None,
        }
    }

    /// Whether every transport this choice allows performs atomics on a node's memory as CPU
    /// atomics (shared-memory segments, the `self` transport, and tcp's software atomics run
    /// by the target's worker). Then the node's own threads may use CPU atomics on its memory
    /// beside remote peers' operations. Not so with `Auto`: verbs NICs perform atomics in the
    /// adapter, which CPU atomics are not atomic with.
    pub fn cpu_atomics(self) -> bool {
        matches!(self, Transport::Shm | Transport::Tcp)
    }

    /// How long a waiting worker polls before it sleeps ([`UcxConfig::wait_spin`]). Over tcp
    /// a round trip takes tens of microseconds and needs the target's progress thread, so
    /// after [`TCP_WAIT_SPIN`] the waiter sleeps and leaves the core to that thread. Over shm
    /// (and verbs) operations complete without the target's help in about a microsecond:
    /// polling is both faster and cheap.
    pub fn default_wait_spin(self) -> Option<Duration> {
        match self {
            Transport::Tcp => Some(TCP_WAIT_SPIN),
            Transport::Shm | Transport::Auto => None,
        }
    }
}

impl std::str::FromStr for Transport {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s.to_ascii_lowercase().as_str() {
            "shm" | "sm" => Ok(Transport::Shm),
            "tcp" => Ok(Transport::Tcp),
            "auto" => Ok(Transport::Auto),
            _ => Err(ParseError::Transport(s.to_string())),
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Shm => "shm",
            Transport::Tcp => "tcp",
            Transport::Auto => "auto",
        })
    }
}

/// Whether a node's registered regions sit on huge pages (fewer TLB misses on a large index or
/// data table; on RDMA NICs also fewer translation entries).
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum HugePages {
    /// Never: ordinary pages.
    Off,
    /// Use reserved huge pages (`vm.nr_hugepages`) when there are enough, else ordinary pages
    /// (UCX's own default).
    #[default]
    Try,
    /// Reserved (hugetlbfs) huge pages or refuse to start: a region on any other pages is an
    /// error naming how many huge pages to reserve.
    Require,
}

impl HugePages {
    /// UCX's `MM_HUGETLB_MODE` value for this policy. `Require` asks UCX only to try: UCX's
    /// `y` also applies to the shared-memory transport's own small receive FIFOs and makes
    /// worker creation fail; the regions are checked after allocation instead.
    pub fn ucx_mode(self) -> &'static str {
        match self {
            HugePages::Off => "n",
            HugePages::Try | HugePages::Require => "try",
        }
    }
}

impl std::str::FromStr for HugePages {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s.to_ascii_lowercase().as_str() {
            "off" | "no" | "n" => Ok(HugePages::Off),
            "try" => Ok(HugePages::Try),
            "require" | "yes" | "y" => Ok(HugePages::Require),
            _ => Err(ParseError::HugePages(s.to_string())),
        }
    }
}

impl std::fmt::Display for HugePages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HugePages::Off => "off",
            HugePages::Try => "try",
            HugePages::Require => "require",
        })
    }
}

/// Configuration of a [`crate::UcxNode`] and the endpoints made from it. Every node of a
/// cluster must use the same transport.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UcxConfig {
    pub transport: Transport,
    /// `UCX_NET_DEVICES` (e.g. `"lo"` to keep TCP on loopback, `"mlx5_0:1"` for one HCA port);
    /// `None` leaves UCX's default (all devices).
    pub net_devices: Option<String>,
    /// Upper bound on one blocking operation (and on closing an endpoint). An operation that
    /// has not completed by then force-closes the endpoint and fails with
    /// `FabricError::Unreachable`; the peer stays unreachable for this endpoint afterwards.
    pub op_timeout: Duration,
    /// UCX keepalive period (`KEEPALIVE_INTERVAL`, and TCP keepalive idle/interval): how soon
    /// a dead peer is noticed when no operation to it is outstanding.
    pub keepalive_interval: Duration,
    /// How long the node's progress thread keeps busy-polling after the last event before it
    /// arms the worker and sleeps. `0` (default): purely event-driven, an idle node uses no
    /// CPU, and every software-emulated operation (tcp) pays one thread wake-up (~5-10 us).
    /// A few tens of microseconds remove that wake-up under load, at the cost of that much
    /// spinning after each burst.
    pub progress_spin: Duration,
    /// Huge pages for the node's regions.
    pub huge_pages: HugePages,
    /// Extra `ucp_config_modify` options (name without the `UCX_` prefix, value), applied last.
    pub ucx_options: Vec<(String, String)>,
    /// Operations on the endpoint's own node (its ITEs, for a CD client; every ITE, for an
    /// SD/HY server) go straight to memory with CPU loads, stores and compare-exchanges instead
    /// of through UCX's loopback, when the transport's atomics are CPU atomics
    /// ([`Transport::cpu_atomics`]). Counted as loopback operations all the same. `false`
    /// sends them through UCX, as on verbs.
    #[serde(default = "direct_by_default")]
    pub direct_loopback: bool,
    /// Operations on other nodes' memory go straight to it with CPU loads, stores and
    /// compare-exchanges where UCX maps it into this process (`ucp_rkey_ptr`), which it does
    /// for shared-memory transports; only with [`Transport::Shm`], where every node's atomics
    /// are CPU atomics. Checked as operations through UCX are (dead and restarted peers), and
    /// counted as remote operations. `false` sends them through UCX.
    #[serde(default = "direct_by_default")]
    pub direct_peers: bool,
    /// How long a worker thread polls for its operation's completion before it sleeps on its
    /// worker's event fd until the answer arrives (`None`: it polls until completion).
    /// Default: [`Transport::default_wait_spin`].
    #[serde(default)]
    pub wait_spin: Option<Duration>,
}

/// Both direct paths (own node, mapped peers) are on unless switched off.
fn direct_by_default() -> bool {
    true
}

impl Default for UcxConfig {
    fn default() -> Self {
        Self {
            transport: Transport::Auto,
            net_devices: None,
            op_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(1),
            progress_spin: Duration::ZERO,
            huge_pages: HugePages::Try,
            ucx_options: Vec::new(),
            direct_loopback: direct_by_default(),
            direct_peers: direct_by_default(),
            wait_spin: Transport::Auto.default_wait_spin(),
        }
    }
}

impl UcxConfig {
    pub fn new(transport: Transport) -> Self {
        Self {
            transport,
            wait_spin: transport.default_wait_spin(),
            ..Self::default()
        }
    }

    /// The `(name, value)` pairs passed to `ucp_config_modify`, in order.
    pub fn ucp_options(&self) -> Vec<(String, String)> {
        let mut o: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: String| o.push((k.to_string(), v));
        if let Some(tls) = self.transport.tls() {
            set("TLS", tls.to_string());
        }
        if let Some(dev) = &self.net_devices {
            set("NET_DEVICES", dev.clone());
        }
        let ka_us = self.keepalive_interval.as_micros().max(1000);
        set("KEEPALIVE_INTERVAL", format!("{ka_us}us"));
        let (shm, tcp) = match self.transport {
            Transport::Shm => (true, false),
            Transport::Tcp => (false, true),
            Transport::Auto => (true, true),
        };
        if shm {
            // posix/sysv only advertise peer-failure handling (and so are only usable by
            // endpoints with UCP_ERR_HANDLING_MODE_PEER) when this is on; without it an shm-only
            // endpoint cannot be created at all ("no peer failure handler").
            set("MM_ERROR_HANDLING", "y".into());
        }
        if shm {
            // Regions come from the sysv (else posix) shared-memory MD; both allocate from
            // hugetlbfs according to this mode. It is a field of their common parent table, so
            // `ucp_config_modify` takes it as `MM_HUGETLB_MODE` (UCX 1.13 reports the
            // `SYSV_`/`POSIX_` forms, which are environment-variable names, as invalid).
            set("MM_HUGETLB_MODE", self.huge_pages.ucx_mode().into());
        }
        // Without a shared-memory MD (tcp), UCX allocates by the first method of ALLOC_PRIO
        // that works: `huge` (hugetlb mmap), `thp` (madvise), then plain mmap. Every method
        // left in the list maps fresh pages from the kernel, which are zero and cost nothing
        // until touched, so a region is not zeroed by hand and a table (a spare mirror slot
        // above all) takes memory only as it fills. UCX's default list ends with `md:*` (a
        // NIC's device memory) and `heap` (malloc), which promise neither: both are left out.
        set("ALLOC_PRIO", alloc_prio(self.huge_pages).into());
        // `Require` is enforced after allocation by checking what backs each region
        // (`UcxNode::with_regions`), whatever the transport.
        if tcp {
            // TCP socket keepalive: notice a silent peer (no RST, e.g. a vanished host) within a
            // few periods. Fields of a transport's own table take their bare name here (the
            // `TCP_` prefix form is reported unused by UCX 1.13); inherited ones (MM_) keep it.
            let ka_s = self.keepalive_interval.as_secs().max(1);
            set("KEEPIDLE", format!("{ka_s}s"));
            set("KEEPINTVL", format!("{ka_s}s"));
        }
        for (k, v) in &self.ucx_options {
            o.push((k.trim_start_matches("UCX_").to_string(), v.clone()));
        }
        o
    }
}

/// UCX's allocation methods for the regions, in order: only those that map zeroed pages from
/// the kernel (`map_region` relies on it), hugetlb unless `off`. Not UCX's `thp`, which takes
/// large blocks from the C heap (`posix_memalign`), whose memory may be reused and written:
/// `map_region` asks for transparent huge pages itself (`madvise`) on what `mmap` maps.
pub fn alloc_prio(huge_pages: HugePages) -> &'static str {
    match huge_pages {
        HugePages::Off => "md:sysv,md:posix,mmap",
        _ => "md:sysv,md:posix,huge,mmap",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(c: &UcxConfig, k: &str) -> Option<String> {
        c.ucp_options()
            .into_iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v)
    }

    #[test]
    fn huge_pages_policy_maps_to_ucx_options() {
        for (p, mode) in [
            (HugePages::Off, "n"),
            (HugePages::Try, "try"),
            (HugePages::Require, "try"),
        ] {
            let c = UcxConfig {
                huge_pages: p,
                ..UcxConfig::new(Transport::Shm)
            };
            assert_eq!(opt(&c, "MM_HUGETLB_MODE").as_deref(), Some(mode));
            assert_eq!(p.to_string().parse::<HugePages>(), Ok(p));
        }
        // Without a shared-memory MD, `off` removes the huge and thp allocators.
        let tcp_off = UcxConfig {
            huge_pages: HugePages::Off,
            ..UcxConfig::new(Transport::Tcp)
        };
        assert!(opt(&tcp_off, "MM_HUGETLB_MODE").is_none());
        let prio = opt(&tcp_off, "ALLOC_PRIO").unwrap();
        assert!(!prio.contains("huge") && !prio.contains("thp"), "{prio}");
        // No method that may hand out memory already written (malloc, thp's heap blocks, a
        // NIC's device memory).
        for p in [HugePages::Off, HugePages::Try, HugePages::Require] {
            let c = UcxConfig {
                huge_pages: p,
                ..UcxConfig::new(Transport::Tcp)
            };
            let prio = opt(&c, "ALLOC_PRIO").unwrap();
            assert!(
                !prio.contains("heap") && !prio.contains("md:*") && !prio.contains("thp"),
                "{prio}"
            );
        }
        assert!("sometimes"
            .parse::<HugePages>()
            .unwrap_err()
            .to_string()
            .contains("off, try or require"));
    }
}
