//! The NIC, network and CPU model: each shared resource is a FIFO server that is busy until
//! some virtual time. Work is booked on a resource at the virtual time it arrives there (the
//! scheduler runs threads in virtual-time order, so bookings come in arrival order) and starts
//! when both it has arrived and the resource is free.
//!
//! Per node: a NIC engine (per-operation processing: the message rate), the NIC port's egress
//! and ingress links (full duplex, so one of each), its PCIe link for looped-back data, and
//! the node's cores. The switch is non-blocking: a message only waits for the sender's egress
//! and the receiver's ingress link.
//!
//! Links carry messages of many packets in FIFO order, but a message of one packet (a small
//! READ request or response, a WRITE ACK, a CAS) does not wait behind them: NICs arbitrate
//! between queue pairs packet by packet, so it waits only for the packet on the wire, goes
//! next, and pushes the longer messages back by its own time. Whole-message FIFO would make
//! every index READ or CAS wait for whole large values, which real links do not.

use crate::params::SimParams;
use nessie_fabric::NodeId;

/// A FIFO server.
#[derive(Clone, Copy, Debug, Default)]
struct Server {
    free_at: u64,
    /// When the last single-packet message interleaved into the work ends (links only).
    packet_free_at: u64,
}

impl Server {
    /// Book `dur` ns of work arriving at `at`; returns when it ends.
    fn book(&mut self, at: u64, dur: u64) -> u64 {
        let end = at.max(self.free_at).max(self.packet_free_at) + dur;
        self.free_at = end;
        end
    }

    /// Book a single-packet message of `dur` ns arriving at `at` on a link whose packets take
    /// `packet_ns`: it waits for the packet on the wire (and for earlier single packets), not
    /// for the rest of a longer message, which it pushes back by `dur`.
    fn book_packet(&mut self, at: u64, dur: u64, packet_ns: u64) -> u64 {
        if self.free_at <= at {
            return self.book(at, dur);
        }
        let on_wire = (self.free_at - at) % packet_ns.max(1);
        let start = (at + on_wire).max(self.packet_free_at);
        self.packet_free_at = start + dur;
        self.free_at += dur;
        start + dur
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
        let (ser, packet) = self.link_ns(wire);
        let n = &mut self.nodes[from as usize];
        n.wire.tx += wire;
        let sent = match packet {
            Some(packet_ns) => n.tx.book_packet(at, ser, packet_ns),
            None => n.tx.book(at, ser),
        };
        sent + self.p.one_way_latency_ns
    }

    /// A message's time on a link, and for a single-packet message the time of a full packet
    /// (see the module comment).
    fn link_ns(&self, wire: u64) -> (u64, Option<u64>) {
        let p = &self.p;
        let full = p.mtu_bytes + p.packet_overhead_bytes + crate::params::headers::ATOMIC_ETH;
        let ser = SimParams::transfer_ns(wire, p.link_mbps);
        let single = wire <= full;
        (
            ser,
            single.then(|| SimParams::transfer_ns(full, p.link_mbps)),
        )
    }

    /// Take a message of `wire` bytes off `to`'s ingress link; it would have been fully
    /// received at `arrival` on a free link. Returns when it is.
    pub fn deliver(&mut self, to: NodeId, arrival: u64, wire: u64) -> u64 {
        let (ser, packet) = self.link_ns(wire);
        let n = &mut self.nodes[to as usize];
        n.wire.rx += wire;
        let start = arrival.saturating_sub(ser);
        let received = match packet {
            Some(packet_ns) => n.rx.book_packet(start, ser, packet_ns),
            None => n.rx.book(start, ser),
        };
        received.max(arrival)
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
    fn a_single_packet_waits_for_one_packet_not_a_whole_message() {
        let mut link = Server::default();
        // A 64-packet message of 1 µs packets from 0 to 64 µs.
        assert_eq!(link.book(0, 64_000), 64_000);
        // A small message at 10.3 µs waits for the packet on the wire (to 11 µs) only...
        assert_eq!(link.book_packet(10_300, 100, 1_000), 11_100);
        // ...a second one goes after it...
        assert_eq!(link.book_packet(10_300, 100, 1_000), 11_200);
        // ...and the long message ends that much later, as does what queues behind it.
        assert_eq!(link.book(0, 1_000), 65_200);
        // On an idle link a small message starts at once.
        let mut idle = Server::default();
        assert_eq!(idle.book_packet(5, 100, 1_000), 105);
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
