//! The server-driven baseline, NessieSD (HERD-like; reference section 4.5).
//!
//! Keys are *owned*: the coupled index ([`nessie_store::index::Placement::Coupled`]) puts all N
//! candidate ITEs of a key in its owner node's index table, and the owner's server threads write
//! its DTEs into the owner's data table. A client WRITEs each request into its request slot on
//! the owner node and polls its response slot in its own memory; server threads poll their
//! request slots, execute the operation locally with the client-driven protocol, and WRITE the
//! response back. A client on the owner node writes and reads the slots directly, without the
//! fabric.
//!
//! - [`slots`]: request/response slot formats and the slot layout,
//! - [`client`]: the request channel, client slot leases and [`SdClient`],
//! - [`server`]: the server thread loop.
//!
//! The hybrid baseline (`crate::hy`) reuses all of it for PUT and DELETE.

/// `add_counters!(self, o: a, b, ...)`: `self.a += o.a; self.b += o.b; ...` (summing stats).
macro_rules! add_counters {
    ($to:ident, $from:ident: $($field:ident),+ $(,)?) => {
        $($to.$field += $from.$field;)+
    };
}

pub mod client;
pub mod server;
pub mod slots;

use std::sync::Arc;

use nessie_store::Geometry;

pub use client::{ClientSlot, RpcShared, RpcStats, SdClient, SdClientStats, SlotPool};
pub use server::{Server, ServerLoop, ServerOptions, ServerStats, ServerStatsSnapshot};
pub use slots::{SlotError, SlotLayout, MAX_CLIENTS_PER_NODE, REQUEST_REGION, RESPONSE_REGION};

use nessie_protocols::config::{ConfigError, MAX_EXPIRY_NS};
use nessie_protocols::Error;

/// Most server threads per node.
pub const MAX_SERVER_THREADS: u16 = 64;

/// Deliberate breakages of the server-driven path, for mutation tests only (each must make the
/// concurrency checker report a violation). Only with the `testing` feature.
#[cfg(any(test, feature = "testing"))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RpcMutations {
    /// Servers acknowledge a PUT/DELETE before executing it.
    pub reply_before_execute: bool,
}

/// Parameters of the server-driven machinery (SD, and HY's writes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RpcConfig {
    /// Client workers (SD or HY clients) each node may have at once; every node reserves a
    /// request slot for each client worker of the cluster.
    pub max_clients_per_node: u16,
    /// What a server thread does after a sweep that found no request (see
    /// [`ServerOptions::idle_backoff_ns`]); `None` = spin, as the paper's servers do.
    pub idle_backoff_ns: Option<u64>,
    /// How long a client waits for a response before reporting the owner unreachable.
    pub response_timeout_ns: u64,
    /// Pilaf: how long a freed extent waits before reuse; `None` = the protocol's expiry
    /// period, `Some(0)` = at once, as in the paper (only the CRC then catches a reader of a
    /// reused extent).
    pub extent_reuse_delay_ns: Option<u64>,
    /// Test-only breakages.
    #[cfg(any(test, feature = "testing"))]
    pub mutations: RpcMutations,
    /// Test-only adversarial timing of Pilaf's servers.
    #[cfg(any(test, feature = "testing"))]
    pub pilaf: crate::pilaf::PilafTesting,
}

impl Default for RpcConfig {
    fn default() -> Self {
        Self {
            max_clients_per_node: 16,
            idle_backoff_ns: None,
            response_timeout_ns: 30_000_000_000,
            extent_reuse_delay_ns: None,
            #[cfg(any(test, feature = "testing"))]
            mutations: RpcMutations::default(),
            #[cfg(any(test, feature = "testing"))]
            pilaf: crate::pilaf::PilafTesting::default(),
        }
    }
}

impl RpcConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_clients_per_node == 0 || self.max_clients_per_node > MAX_CLIENTS_PER_NODE {
            return Err(ConfigError::ClientsPerNode {
                got: self.max_clients_per_node,
                max: MAX_CLIENTS_PER_NODE,
            });
        }
        if self.idle_backoff_ns.is_some_and(|ns| ns > 1_000_000_000) {
            return Err(ConfigError::IdleBackoff);
        }
        if self.response_timeout_ns < 1_000_000 {
            return Err(ConfigError::ResponseTimeout(self.response_timeout_ns));
        }
        if let Some(d) = self.extent_reuse_delay_ns.filter(|&d| d > MAX_EXPIRY_NS) {
            return Err(ConfigError::ReuseDelay(d));
        }
        Ok(())
    }

    /// The Pilaf store parameters of `geometry` under this configuration (`cfg`: the cluster's
    /// protocol configuration, whose expiry period is the default extent reuse delay).
    pub fn pilaf_params(
        &self,
        geometry: &Geometry,
        cfg: &nessie_protocols::ProtocolConfig,
    ) -> Result<crate::pilaf::PilafParams, Error> {
        let delay = self.extent_reuse_delay_ns.unwrap_or(cfg.expiry_ns);
        #[allow(unused_mut)]
        let mut p = crate::pilaf::PilafParams::new(geometry, delay)?;
        #[cfg(any(test, feature = "testing"))]
        {
            p.testing = self.pilaf;
        }
        Ok(p)
    }

    /// Options of the server threads.
    pub fn server_options(&self) -> ServerOptions {
        ServerOptions {
            idle_backoff_ns: self.idle_backoff_ns,
            #[cfg(any(test, feature = "testing"))]
            mutations: self.mutations,
        }
    }
}

/// Slot layout and shared state for a cluster's clients and servers.
pub fn rpc_shared(geometry: &Geometry, rpc: &RpcConfig) -> Result<Arc<RpcShared>, Error> {
    rpc.validate()?;
    let layout = SlotLayout::new(geometry, rpc.max_clients_per_node)?;
    Ok(Arc::new(RpcShared::new(layout, rpc.response_timeout_ns)))
}

#[cfg(test)]
mod tests {
    //! The client and server halves driven by hand on an in-process fabric: no server threads,
    //! so every interleaving is chosen by the test.

    use std::sync::Arc;
    use std::time::Duration;

    use nessie_fabric::inproc::{InProcEndpoint, InProcFabric};
    use nessie_fabric::{Endpoint, Locality, NodeId, OpKind, RemoteAddr};
    use nessie_store::classtable::ClassTable;
    use nessie_store::Geometry;

    use super::slots::OpCode;
    use super::*;
    use nessie_protocols::cd::CdClient;
    use nessie_protocols::ClusterView;
    use nessie_protocols::ProtocolConfig;

    struct Rig {
        fabric: Arc<InProcFabric>,
        view: Arc<ClusterView>,
        tables: Vec<Arc<ClassTable>>,
        shared: Arc<RpcShared>,
        pools: Vec<Arc<SlotPool>>,
        cfg: ProtocolConfig,
    }

    fn rig(timeout_ns: u64) -> Rig {
        let g = Geometry {
            nodes: 2,
            ites_per_node: 64,
            dtes_per_node: 64,
            key_max: 16,
            value_max: 32,
            ..Geometry::default()
        };
        let view = Arc::new(ClusterView::coupled(g.clone()).unwrap());
        let rpc = RpcConfig {
            max_clients_per_node: 2,
            response_timeout_ns: timeout_ns,
            ..RpcConfig::default()
        };
        let shared = rpc_shared(&g, &rpc).unwrap();
        let mut regions = vec![g.table_regions(); 2];
        for r in regions.iter_mut() {
            r.resize(5, 0);
            r[REQUEST_REGION as usize] = shared.layout.request_region_bytes();
            r[RESPONSE_REGION as usize] = shared.layout.response_region_bytes();
        }
        let fabric = InProcFabric::new(&regions, None).unwrap();
        let cfg = ProtocolConfig {
            expiry_ns: 50_000_000,
            clock_margin_ns: 0,
            ..ProtocolConfig::default()
        };
        let tables = (0..2).map(|n| Arc::new(view.class_table(n, 0))).collect();
        let pools = (0..2).map(|_| SlotPool::new(2)).collect();
        Rig {
            fabric,
            view,
            tables,
            shared,
            pools,
            cfg,
        }
    }

    impl Rig {
        fn server(&self, node: NodeId, opts: ServerOptions) -> Server<InProcEndpoint> {
            let exec = CdClient::new(
                self.fabric.endpoint(node),
                self.view.clone(),
                self.tables[node as usize].clone(),
                100,
                self.cfg.clone(),
            )
            .unwrap();
            Server::new(
                exec,
                self.fabric.endpoint(node),
                self.shared.clone(),
                0,
                1,
                opts,
            )
            .unwrap()
        }

        fn client(&self, node: NodeId) -> SdClient<InProcEndpoint> {
            SdClient::new(
                self.fabric.endpoint(node),
                self.view.clone(),
                self.shared.clone(),
                self.pools[node as usize].take().unwrap(),
            )
            .unwrap()
        }

        fn key_owned_by(&self, node: NodeId) -> Vec<u8> {
            (0..)
                .map(|i| format!("k{i}").into_bytes())
                .find(|k| self.view.index.owner(k) == Some(node))
                .unwrap()
        }
    }

    /// Run `f` on a client thread while `server` sweeps on this one until `f` returns.
    fn serve_while<T: Send>(
        server: &mut Server<InProcEndpoint>,
        f: impl FnOnce() -> T + Send,
    ) -> T {
        std::thread::scope(|s| {
            let h = s.spawn(f);
            while !h.is_finished() {
                server.sweep();
                std::thread::yield_now();
            }
            h.join().unwrap()
        })
    }

    #[test]
    fn a_request_is_served_once_and_answered_in_the_clients_memory() {
        let r = rig(10_000_000_000);
        let mut server = r.server(1, ServerOptions::default());
        let mut client = r.client(0);
        let key = r.key_owned_by(1);
        assert_eq!(server.sweep(), 0, "nothing to do yet");
        serve_while(&mut server, || client.put(&key, b"value")).unwrap();
        assert_eq!(server.sweep(), 0, "a served request is not served again");
        let v = serve_while(&mut server, || client.get(&key)).unwrap();
        assert_eq!(v.as_deref(), Some(&b"value"[..]));
        let st = server.stats().snapshot();
        assert_eq!((st.requests, st.puts, st.gets, st.errors), (2, 1, 1, 0));
        let cs = client.stats();
        assert_eq!(
            (cs.puts, cs.gets, cs.rpc.requests, cs.rpc.local_requests),
            (1, 1, 2, 0)
        );
        // The client: one WRITE per request; everything else in its own memory.
        let e = client.endpoint().stats().snapshot();
        assert_eq!(e.remote_ops(), 2);
        assert_eq!(e.ops(OpKind::Write, Locality::Remote), 2);
        // The executor: loopback ITE accesses and direct DTE accesses only.
        let x = server.executor().endpoint().stats().snapshot();
        assert_eq!(x.remote_ops(), 0, "{x:?}");
        assert!(
            x.ops(OpKind::Cas, Locality::Loopback) >= 1
                && x.ops(OpKind::Write, Locality::Direct) >= 1
        );
    }

    /// A request whose control word has landed before the rest of its WRITE (allowed: the
    /// fabric does not order the words of one WRITE) is left alone until it is complete.
    #[test]
    fn a_request_still_landing_is_served_only_once_complete() {
        let r = rig(10_000_000_000);
        let mut server = r.server(1, ServerOptions::default());
        let l = r.shared.layout;
        let key = r.key_owned_by(1);
        let mut buf = Vec::new();
        let at = l.encode_request(&mut buf, 1, OpCode::Put, &key, b"landing");
        let base = l.request_offset(l.client_index(0, 0)) + at;
        let mut ep = r.fabric.endpoint(0);
        let n = buf.len();
        // Control word and key first; the value, lengths and checksum words not yet.
        ep.write(
            RemoteAddr::new(1, REQUEST_REGION, base + n as u64 - 8),
            &buf[n - 8..],
        )
        .unwrap();
        ep.write(RemoteAddr::new(1, REQUEST_REGION, base), &buf[..8])
            .unwrap();
        assert_eq!(
            server.sweep(),
            0,
            "a half-landed request must not be served"
        );
        assert_eq!(server.sweep(), 0);
        assert_eq!(server.stats().snapshot().landing, 2);
        ep.write(RemoteAddr::new(1, REQUEST_REGION, base + 8), &buf[8..n - 8])
            .unwrap();
        assert_eq!(server.sweep(), 1, "served once complete");
        assert_eq!(server.sweep(), 0, "and only once");
        let mut reader = CdClient::new(
            r.fabric.endpoint(0),
            r.view.clone(),
            r.tables[0].clone(),
            7,
            r.cfg.clone(),
        )
        .unwrap();
        assert_eq!(reader.get(&key).unwrap().as_deref(), Some(&b"landing"[..]));
        let mut slot = vec![0u8; l.response_slot as usize];
        ep.local_read(RESPONSE_REGION, l.response_offset(0, 1), &mut slot)
            .unwrap();
        assert_eq!(
            l.decode_response(&slot, 1, 1),
            Ok(slots::Polled::Ready(Ok(None))),
            "answered in node 0's memory"
        );
    }

    #[test]
    fn server_errors_reach_the_client_unchanged() {
        let r = rig(10_000_000_000);
        let mut server = r.server(0, ServerOptions::default());
        let mut client = r.client(0);
        // Fill node 0's data table (64 DTEs) with distinct keys it owns: the next PUT of a new
        // key finds no free entry and nothing awaiting expiry.
        let keys: Vec<Vec<u8>> = (0..)
            .map(|i| format!("f{i}").into_bytes())
            .filter(|k| r.view.index.owner(k) == Some(0))
            .take(80)
            .collect();
        let mut last = Ok(());
        for k in &keys {
            last = serve_while(&mut server, || client.put(k, b"v"));
            if last.is_err() {
                break;
            }
        }
        match last {
            Err(Error::DataTableFull {
                node: 0,
                awaiting_expiry: 0,
                ..
            }) => {}
            Err(Error::IndexFull { .. }) => {} // the 64-entry index may fill up first
            other => panic!("expected a full table, got {other:?}"),
        }
        assert!(server.stats().snapshot().errors >= 1);
    }

    #[test]
    fn a_timed_out_request_blocks_its_slot_until_the_late_response_arrives() {
        let r = rig(20_000_000);
        let mut server = r.server(1, ServerOptions::default());
        let mut client = r.client(0);
        let key = r.key_owned_by(1);
        // No server is sweeping: the PUT times out.
        match client.put(&key, b"late") {
            Err(Error::Unreachable { node: 1, reason }) => {
                assert!(reason.contains("no response"), "{reason}")
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert_eq!(client.stats().rpc.timeouts, 1);
        // Still nobody serving: the next request to node 1 may not overwrite the unconsumed
        // request, so it waits for the old response and times out without sending.
        assert!(matches!(
            client.get(&key),
            Err(Error::Unreachable { node: 1, .. })
        ));
        assert_eq!(
            client.stats().rpc.requests,
            1,
            "nothing was sent over the pending request"
        );
        // The server finally serves the PUT; the client's next GET collects the late response
        // first, then sends, and sees the PUT's effect.
        assert_eq!(server.sweep(), 1);
        let v = serve_while(&mut server, || client.get(&key)).unwrap();
        assert_eq!(v.as_deref(), Some(&b"late"[..]));
        // A slot with an unanswered request is not handed out again.
        let mut c2 = r.client(0);
        let k0 = r.key_owned_by(1);
        std::thread::sleep(Duration::from_millis(1));
        assert!(matches!(c2.put(&k0, b"x"), Err(Error::Unreachable { .. })));
        let slot = c2.slot();
        drop(c2);
        assert_eq!(
            r.pools[0].available(),
            0,
            "slot {slot} has a request in flight: not returned"
        );
        drop(client);
        assert_eq!(r.pools[0].available(), 1, "a clean slot is returned");
    }

    #[test]
    fn reused_slots_continue_their_sequence_numbers() {
        let r = rig(10_000_000_000);
        let mut server = r.server(1, ServerOptions::default());
        let key = r.key_owned_by(1);
        for i in 0..5u8 {
            // Each client takes the slot the previous one returned; a repeated sequence number
            // would look like an already-served request and hang until the timeout.
            let mut c = r.client(0);
            serve_while(&mut server, || c.put(&key, &[i])).unwrap();
        }
        let mut c = r.client(0);
        assert_eq!(
            serve_while(&mut server, || c.get(&key)).unwrap(),
            Some(vec![4])
        );
    }

    /// Whether the client's response slot already held a response when the server's executor
    /// first touched the index, for a PUT served with `opts`.
    fn replied_before_executing(opts: ServerOptions) -> bool {
        use std::sync::atomic::{AtomicU64, Ordering};
        let r = rig(10_000_000_000);
        let mut server = r.server(1, opts);
        let mut client = r.client(0);
        let key = r.key_owned_by(1);
        let seen = Arc::new(AtomicU64::new(u64::MAX));
        let (seen2, fabric, layout, local) = (
            seen.clone(),
            r.fabric.clone(),
            r.shared.layout,
            client.slot(),
        );
        server.executor_mut().set_hook(Some(Box::new(move |_| {
            if seen2.load(Ordering::SeqCst) == u64::MAX {
                let mut w = [0u8; 8];
                let off = layout.response_offset(local, 1) + layout.response_ctrl_offset();
                fabric
                    .endpoint(0)
                    .local_read(RESPONSE_REGION, off, &mut w)
                    .unwrap();
                seen2.store(
                    SlotLayout::parse_response_ctrl(u64::from_le_bytes(w)).0,
                    Ordering::SeqCst,
                );
            }
        })));
        serve_while(&mut server, || client.put(&key, b"v")).unwrap();
        // Either way the PUT is executed (by the time the sweep ends).
        let mut reader = CdClient::new(
            r.fabric.endpoint(0),
            r.view.clone(),
            r.tables[0].clone(),
            7,
            r.cfg.clone(),
        )
        .unwrap();
        assert_eq!(reader.get(&key).unwrap().as_deref(), Some(&b"v"[..]));
        let seq = seen.load(Ordering::SeqCst);
        assert_ne!(seq, u64::MAX, "the executor ran");
        seq == 1
    }

    #[test]
    fn responses_follow_execution_unless_mutated() {
        assert!(!replied_before_executing(ServerOptions::default()));
        let broken = ServerOptions {
            mutations: RpcMutations {
                reply_before_execute: true,
            },
            ..ServerOptions::default()
        };
        assert!(replied_before_executing(broken));
    }

    #[test]
    fn server_and_client_refuse_a_decoupled_view() {
        let r = rig(1_000_000_000);
        let dec = Arc::new(ClusterView::new(r.view.geometry.clone()).unwrap());
        let exec = CdClient::new(
            r.fabric.endpoint(0),
            dec.clone(),
            r.tables[0].clone(),
            1,
            r.cfg.clone(),
        )
        .unwrap();
        let e = Server::new(
            exec,
            r.fabric.endpoint(0),
            r.shared.clone(),
            0,
            1,
            ServerOptions::default(),
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("coupled"), "{e}");
        let e = SdClient::new(
            r.fabric.endpoint(0),
            dec,
            r.shared.clone(),
            ClientSlot::fixed(0, 1),
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("coupled"), "{e}");
        let e = SdClient::new(
            r.fabric.endpoint(0),
            r.view.clone(),
            r.shared.clone(),
            ClientSlot::fixed(2, 1),
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("outside the 2 slots"), "{e}");
    }
}
