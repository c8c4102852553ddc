//! The hardware the simulator models, as named parameters with physical defaults.
//!
//! Every default comes from a public hardware specification or a published microbenchmark of
//! the class of machine the Nessie paper used (ConnectX-3 class 10 GbE RDMA NICs on PCIe 3.0
//! servers); none is fitted to the paper's result tables. `docs/sim.md` lists them with their
//! sources and says how each enters the timing of an operation.

use serde::{Deserialize, Serialize};

/// Most nodes a simulated cluster may have (node ids are 16 bits; a simulated node costs
/// little, but each simulated thread is a real OS thread).
pub const MAX_NODES: usize = 1024;
/// Most cores a simulated node may have.
pub const MAX_CORES: u32 = 1024;
/// Longest start-time jitter (1 ms): more only delays the run.
pub const MAX_START_JITTER_NS: u64 = 1_000_000;
/// Most background processes per simulated node.
pub const MAX_BACKGROUND: u32 = 64;
/// Longest scheduling period or slice (1 s).
pub const MAX_SLICE_NS: u64 = 1_000_000_000;

/// The simulated hardware. Times are nanoseconds, rates are per second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimParams {
    /// Link bandwidth of each NIC port, each direction (full duplex), in Mb/s. 10 GbE:
    /// 10,000 Mb/s of Ethernet frame bits (IEEE 802.3ae); the per-packet overheads below are
    /// charged on top of the payload.
    pub link_mbps: u64,
    /// Base one-way latency of a minimum-size message, NIC to NIC: the requester's doorbell
    /// and WQE fetch over PCIe, the NIC pipelines, the wire and one cut-through switch hop,
    /// and the DMA at the other end. 850 ns makes a small READ's round trip (with the NIC and
    /// CPU costs below) about 2 µs, the range `ib_read_lat` (perftest) reports for ConnectX-3
    /// over RoCE on 10/40 GbE and the vendor's "sub-2 µs" RDMA latency for ConnectX-3 EN.
    pub one_way_latency_ns: u64,
    /// NIC processing per operation, at the requester and again at the responder: the
    /// message-rate limit. 30 ns is about 33 M operations/s per NIC, the order of the
    /// ConnectX-3 product brief's message rate and of the ~26-35 M small READs/s measured
    /// per ConnectX-3 NIC (Kalia et al., HERD, SIGCOMM 2014).
    pub nic_op_ns: u64,
    /// Extra responder-NIC time of a 64-bit CAS: the NIC reads, compares and writes the word
    /// over PCIe while it holds it (two dependent PCIe transactions). 400 ns is about 2.5 M
    /// atomics/s per NIC, the order ConnectX-3 reaches for atomics (Kalia et al., "Design
    /// Guidelines for High Performance RDMA Systems", ATC 2016, report a few M/s).
    pub nic_atomic_ns: u64,
    /// Payload bytes per packet (RoCE path MTU). 1024 bytes: the largest RoCE MTU that fits a
    /// standard 1500-byte Ethernet frame, the usual setting on 10 GbE.
    pub mtu_bytes: u64,
    /// Bytes each packet adds on the wire besides payload and the operation's own extended
    /// header: preamble and start delimiter (8), Ethernet header (14), IPv4 (20), UDP (8),
    /// InfiniBand BTH (12), ICRC (4), FCS (4) and the inter-frame gap (12) = 82 (RoCE v2,
    /// IEEE 802.3 and the InfiniBand Architecture Specification, Annex A17).
    pub packet_overhead_bytes: u64,
    /// Latency of an operation the NIC loops back to its own host (index entries on the
    /// caller's node): one PCIe round trip each way instead of the wire. 450 ns: the PCIe
    /// round trip Neugebauer et al. measured for NICs ("Understanding PCIe performance for
    /// end host networking", SIGCOMM 2018).
    pub loopback_latency_ns: u64,
    /// PCIe bandwidth available to loopback data, Mb/s: PCIe 3.0 x8 (ConnectX-3's slot),
    /// 8 GT/s × 8 lanes × 128/130 encoding ≈ 63,000 Mb/s.
    pub pcie_mbps: u64,
    /// CPU time of one fabric operation on the calling thread: building and posting the work
    /// request (an MMIO doorbell write) and polling its completion. 150 ns: a doorbell is a
    /// PCIe posted write of a few hundred ns latency but ~100-200 ns of CPU time (Kalia et al.,
    /// ATC 2016, measure posting costs of this order).
    pub cpu_op_ns: u64,
    /// Fixed CPU time of a direct (non-fabric) access to local memory: about one DRAM miss
    /// (~80-100 ns on the Xeon E5 generation of ConnectX-3 servers).
    pub local_op_ns: u64,
    /// Memory-copy bandwidth of one core, MB/s, for direct accesses and per-byte copies:
    /// ~10 GB/s, single-core `memcpy` from DRAM on the same servers (STREAM copy per core).
    pub copy_mb_per_s: u64,
    /// Cores per node. Simulated threads of a node share them (a thread's CPU work waits for
    /// a free core), and a polling thread takes one for the whole run.
    pub cores_per_node: u32,
    /// Each simulated thread starts at a seeded random time in `[0, start_jitter_ns)`, so
    /// that runs with different seeds interleave differently from their first operation.
    pub start_jitter_ns: u64,
    /// CPU-bound background processes per node (the paper's shared-CPU experiment; not
    /// hardware). They share cores with the node's threads in time slices (`crate::slices`).
    pub background_per_node: u32,
    /// CFS's scheduling period, shared among a core's runnable tasks: 24 ms, Linux 3.13's
    /// `sched_latency_ns` (6 ms × (1 + log2 8) on machines of 8 or more CPUs, the paper's
    /// kernel on 12 cores).
    pub sched_latency_ns: u64,
    /// CFS's shortest slice: 3 ms, Linux 3.13's `sched_min_granularity_ns` (0.75 ms, scaled as
    /// above).
    pub sched_min_granularity_ns: u64,
}

impl Default for SimParams {
    fn default() -> Self {
        Self {
            link_mbps: 10_000,
            one_way_latency_ns: 850,
            nic_op_ns: 30,
            nic_atomic_ns: 400,
            mtu_bytes: 1024,
            packet_overhead_bytes: 82,
            loopback_latency_ns: 450,
            pcie_mbps: 63_000,
            cpu_op_ns: 150,
            local_op_ns: 90,
            copy_mb_per_s: 10_000,
            cores_per_node: 8,
            start_jitter_ns: 1_000,
            background_per_node: 0,
            sched_latency_ns: 24_000_000,
            sched_min_granularity_ns: 3_000_000,
        }
    }
}

/// A [`SimParams`] the simulator cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    #[error("{field} must be positive")]
    Zero { field: &'static str },
    #[error("{field} = {value} exceeds its limit {max}")]
    TooLarge {
        field: &'static str,
        value: u64,
        max: u64,
    },
}

impl SimParams {
    pub fn validate(&self) -> Result<(), ParamsError> {
        for (field, v) in [
            ("link_mbps", self.link_mbps),
            ("mtu_bytes", self.mtu_bytes),
            ("pcie_mbps", self.pcie_mbps),
            ("copy_mb_per_s", self.copy_mb_per_s),
            ("cores_per_node", self.cores_per_node as u64),
            ("sched_latency_ns", self.sched_latency_ns),
            ("sched_min_granularity_ns", self.sched_min_granularity_ns),
        ] {
            if v == 0 {
                return Err(ParamsError::Zero { field });
            }
        }
        for (field, value, max) in [
            (
                "cores_per_node",
                self.cores_per_node as u64,
                MAX_CORES as u64,
            ),
            ("start_jitter_ns", self.start_jitter_ns, MAX_START_JITTER_NS),
            (
                "background_per_node",
                self.background_per_node as u64,
                MAX_BACKGROUND as u64,
            ),
            ("sched_latency_ns", self.sched_latency_ns, MAX_SLICE_NS),
            (
                "sched_min_granularity_ns",
                self.sched_min_granularity_ns,
                MAX_SLICE_NS,
            ),
        ] {
            if value > max {
                return Err(ParamsError::TooLarge { field, value, max });
            }
        }
        Ok(())
    }

    /// Time to serialise `bytes` onto a link of `mbps`, rounded up to whole nanoseconds.
    pub fn transfer_ns(bytes: u64, mbps: u64) -> u64 {
        // bits / (Mb/s) = µs; × 1000 for ns. u128: 64-bit byte counts times 8000 overflow u64.
        ((bytes as u128 * 8_000).div_ceil(mbps as u128)) as u64
    }

    /// Bytes on the wire of a message carrying `payload` bytes and an extended header of
    /// `ext_header` bytes (in its first packet).
    pub fn wire_bytes(&self, payload: u64, ext_header: u64) -> u64 {
        let packets = payload.div_ceil(self.mtu_bytes).max(1);
        payload + ext_header + packets * self.packet_overhead_bytes
    }

    /// CPU time to copy `bytes` with one core.
    pub fn copy_ns(&self, bytes: u64) -> u64 {
        // bytes / (MB/s) = µs.
        ((bytes as u128 * 1_000).div_ceil(self.copy_mb_per_s as u128)) as u64
    }
}

/// Extended transport headers of each message (InfiniBand Architecture Specification,
/// chapter 9): what an operation adds to its first packet beyond [`SimParams::packet_overhead_bytes`].
pub mod headers {
    /// RDMA READ request and the first packet of an RDMA WRITE: RETH (virtual address,
    /// rkey, length).
    pub const RETH: u64 = 16;
    /// READ response and WRITE acknowledgement: AETH.
    pub const AETH: u64 = 4;
    /// Atomic request: AtomicETH (address, rkey, swap and compare values).
    pub const ATOMIC_ETH: u64 = 28;
    /// Atomic response: AETH plus AtomicAckETH (the original value).
    pub const ATOMIC_ACK: u64 = 4 + 8;
}
