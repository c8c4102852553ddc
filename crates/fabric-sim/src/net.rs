//! The NIC, network and CPU model: each shared resource is a FIFO server that is busy until
//! some virtual time. Work is booked on a resource at the virtual time it arrives there (the
//! scheduler runs threads in virtual-time order, so bookings come in arrival order) and starts
//! when both it has arrived and the resource is free.
//!
//! Per node: a NIC engine (per-operation processing: the message rate), the NIC port's egress
//! and ingress links (full duplex, so one of each), its PCIe link for looped-back data, and
//! the node's cores. The switch is non-blocking: a message only waits for the sender's egress
//! and the receiver's ingress link.

use crate::params::SimParams;
use nessie_fabric::NodeId;

/// A FIFO server.
#[derive(Clone, Copy, Debug, Default)]
struct Server {
    free_at: u64,
}

impl Server {
    /// Book `dur` ns of work arriving at `at`; returns when it ends.
    fn book(&mut self, at: u64, dur: u64) -> u64 {
        let end = at.max(self.free_at) + dur;
        self.free_at = end;
        end
    }
}

/// Bytes a node's NIC port has put on and taken off the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WireBytes {
    pub tx: u64,
    pub rx: u64,
}

#[derive(Debug)]
struct NodeModel {
    nic: Server,
    tx: Server,
    rx: Server,
    pcie: Server,
    /// When each core is next free; cores taken by polling threads are removed.
    cores: Vec<Server>,
    wire: WireBytes,
}

/// Every node's resources.
#[derive(Debug)]
pub struct Net {
    p: SimParams,
    nodes: Vec<NodeModel>,
}

/// Why a core cannot be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node {node} has no core left for a polling thread (cores_per_node = {cores})")]
pub struct NoCoreLeft {
    pub node: NodeId,
    pub cores: u32,
}

impl Net {
    pub fn new(p: &SimParams, nodes: usize) -> Self {
        let node = || NodeModel {
            nic: Server::default(),
            tx: Server::default(),
            rx: Server::default(),
            pcie: Server::default(),
            cores: vec![Server::default(); p.cores_per_node as usize],
            wire: WireBytes::default(),
        };
        Self {
            p: p.clone(),
            nodes: (0..nodes).map(|_| node()).collect(),
        }
    }

    /// Run `cost` ns of CPU work of a thread on `node` that is ready at `at`, on the core
    /// free first (lowest number on ties); returns when it is done.
    pub fn cpu(&mut self, node: NodeId, at: u64, cost: u64) -> u64 {
        let cores = &mut self.nodes[node as usize].cores;
        let core = cores
            .iter_mut()
            .min_by_key(|c| c.free_at.max(at))
            .expect("a node always keeps a core");
        core.book(at, cost)
    }

    /// Take a core of `node` away for good (a polling thread spins on it).
    pub fn take_core(&mut self, node: NodeId) -> Result<(), NoCoreLeft> {
        let cores = &mut self.nodes[node as usize].cores;
        if cores.len() <= 1 {
            return Err(NoCoreLeft {
                node,
                cores: self.p.cores_per_node,
            });
        }
        cores.pop();
        Ok(())
    }

    /// NIC engine work of `cost` ns on `node` arriving at `at`.
    pub fn nic(&mut self, node: NodeId, at: u64, cost: u64) -> u64 {
        self.nodes[node as usize].nic.book(at, cost)
    }

    /// Put a message of `wire` bytes on `from`'s egress link at `at`; returns when its last
    /// bit reaches the far end of the network (the base latency after it left), were the
    /// receiver's ingress link free.
    pub fn transmit(&mut self, from: NodeId, at: u64, wire: u64) -> u64 {
        let n = &mut self.nodes[from as usize];
        n.wire.tx += wire;
        n.tx.book(at, SimParams::transfer_ns(wire, self.p.link_mbps)) + self.p.one_way_latency_ns
    }

    /// Take a message of `wire` bytes off `to`'s ingress link; it would have been fully
    /// received at `arrival` on a free link. Returns when it is.
    pub fn deliver(&mut self, to: NodeId, arrival: u64, wire: u64) -> u64 {
        let ser = SimParams::transfer_ns(wire, self.p.link_mbps);
        let n = &mut self.nodes[to as usize];
        n.wire.rx += wire;
        n.rx.book(arrival.saturating_sub(ser), ser).max(arrival)
    }

    /// Move `bytes` between a node's memory and its NIC over PCIe (looped-back data) from
    /// `at`; returns when they are across.
    pub fn pcie(&mut self, node: NodeId, at: u64, bytes: u64) -> u64 {
        let dur = SimParams::transfer_ns(bytes, self.p.pcie_mbps);
        self.nodes[node as usize].pcie.book(at, dur) + self.p.loopback_latency_ns
    }

    pub fn wire_bytes(&self, node: NodeId) -> WireBytes {
        self.nodes[node as usize].wire
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_queues_work_in_booking_order() {
        let mut s = Server::default();
        assert_eq!(s.book(10, 5), 15);
        assert_eq!(s.book(12, 5), 20, "waits for the first");
        assert_eq!(s.book(30, 5), 35, "idle meanwhile");
    }

    #[test]
    fn links_serialise_and_cores_share() {
        let p = SimParams {
            cores_per_node: 2,
            ..SimParams::default()
        };
        let mut net = Net::new(&p, 2);
        // 1250 bytes = 10,000 bits = 1 µs at 10 Gb/s.
        let a = net.transmit(0, 0, 1250);
        let b = net.transmit(0, 0, 1250);
        assert_eq!(a, 1_000 + p.one_way_latency_ns);
        assert_eq!(b, 2_000 + p.one_way_latency_ns);
        assert_eq!(
            net.deliver(1, a, 1250),
            a,
            "a free ingress link adds nothing"
        );
        assert_eq!(net.deliver(1, a, 1250), a + 1_000, "a busy one queues");
        assert_eq!(net.wire_bytes(0).tx, 2_500);
        assert_eq!(net.cpu(0, 0, 100), 100);
        assert_eq!(net.cpu(0, 0, 100), 100, "second core");
        assert_eq!(net.cpu(0, 0, 100), 200, "both busy");
        net.take_core(0).unwrap();
        assert_eq!(net.take_core(0), Err(NoCoreLeft { node: 0, cores: 2 }));
    }
}
