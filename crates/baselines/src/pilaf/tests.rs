//! The Pilaf store and client driven by hand on an in-process fabric (no server threads): every
//! interleaving, torn entry and reused extent is placed by the test.

use std::sync::Arc;

use nessie_fabric::inproc::{InProcEndpoint, InProcFabric};
use nessie_fabric::{Endpoint, Locality, NodeId, OpKind};
use nessie_store::Geometry;

use super::layout::{self, candidates, entry_offset, key_hash, Entry, Slot, ENTRY_BYTES};
use super::*;
use crate::sd::slots::OpCode;
use crate::sd::{self, RpcConfig, RpcShared, Server, ServerOptions, SlotPool};
use nessie_protocols::cd::ClusterView;
use nessie_protocols::{Error, ProtocolConfig};

struct Rig {
    fabric: Arc<InProcFabric>,
    view: Arc<ClusterView>,
    shared: Arc<RpcShared>,
    stores: Vec<Arc<PilafStore>>,
    pools: Vec<Arc<SlotPool>>,
    cfg: ProtocolConfig,
}

fn rig(entries: u64, dtes: u64, reuse_delay_ns: u64) -> Rig {
    let g = Geometry {
        nodes: 2,
        ites_per_node: entries,
        dtes_per_node: dtes,
        key_max: 16,
        value_max: 32,
        // Only for the coupled view's owner hash (Pilaf has its own 3 candidates): 2 lets the
        // view accept tables of 4 entries.
        hash_functions: 2,
        ..Geometry::default()
    };
    let view = Arc::new(ClusterView::coupled(g.clone()).unwrap());
    let rpc = RpcConfig {
        max_clients_per_node: 2,
        ..RpcConfig::default()
    };
    let shared = sd::rpc_shared(&g, &rpc).unwrap();
    let params = PilafParams::new(&g, reuse_delay_ns).unwrap();
    let regions = vec![region_sizes(&params, &shared.layout); 2];
    let fabric = InProcFabric::new(&regions, None).unwrap();
    let stores = (0..2)
        .map(|n| PilafStore::new(n, params).unwrap())
        .collect();
    Rig {
        fabric,
        view,
        shared,
        stores,
        pools: (0..2).map(|_| SlotPool::new(2)).collect(),
        cfg: ProtocolConfig {
            retry: nessie_protocols::RetryPolicy {
                max_attempts: 20,
                ..Default::default()
            },
            ..ProtocolConfig::default()
        },
    }
}

impl Rig {
    fn client_with(&self, node: NodeId, cfg: &ProtocolConfig) -> PilafClient<InProcEndpoint> {
        let slot = self.pools[node as usize].take().unwrap();
        PilafClient::new(
            self.fabric.endpoint(node),
            self.view.clone(),
            cfg,
            self.shared.clone(),
            slot,
        )
        .unwrap()
    }

    fn client(&self, node: NodeId) -> PilafClient<InProcEndpoint> {
        self.client_with(node, &self.cfg)
    }

    /// Execute on `key`'s owner directly, as its server thread would.
    fn exec(&self, op: OpCode, key: &[u8], value: &[u8]) -> crate::sd::slots::Reply {
        let owner = self.view.index.owner(key).unwrap();
        let mut ep = self.fabric.endpoint(owner);
        self.stores[owner as usize].execute(&mut ep, op, key, value)
    }

    fn keys_of(&self, node: NodeId, n: usize) -> Vec<Vec<u8>> {
        (0..)
            .map(|i| format!("key{i}").into_bytes())
            .filter(|k| self.view.index.owner(k) == Some(node))
            .take(n)
            .collect()
    }

    /// The entry of `key` on its owner and where it is.
    fn entry_of(&self, key: &[u8]) -> (u64, Entry) {
        let owner = self.view.index.owner(key).unwrap();
        let mut ep = self.fabric.endpoint(owner);
        for c in candidates(key_hash(key), self.view.geometry.ites_per_node) {
            let mut b = [0u8; ENTRY_BYTES as usize];
            ep.local_read(TABLE_REGION, entry_offset(c), &mut b)
                .unwrap();
            if let Slot::Used(e) = Entry::decode(&b, true) {
                if e.key_hash == key_hash(key) {
                    return (c, e);
                }
            }
        }
        panic!("no entry for {key:?}");
    }
}

#[test]
fn requests_are_executed_by_the_owners_server_and_gets_read_directly() {
    let r = rig(64, 64, 0);
    let owner = 1;
    let exec = PilafExecutor::new(r.fabric.endpoint(owner), r.stores[1].clone()).unwrap();
    let mut server = Server::new(
        exec,
        r.fabric.endpoint(owner),
        r.shared.clone(),
        0,
        1,
        ServerOptions::default(),
    )
    .unwrap();
    let mut client = r.client(0);
    let key = r.keys_of(owner, 1).remove(0);
    std::thread::scope(|s| {
        let h = s.spawn(|| {
            client.put(&key, b"value").unwrap();
            let before = client.endpoint().stats().snapshot();
            let got = client.get(&key).unwrap();
            let d = client.endpoint().stats().snapshot().saturating_sub(&before);
            client.delete(&key).unwrap();
            (got, d, client.get(&key).unwrap())
        });
        while !h.is_finished() {
            server.sweep();
            std::thread::yield_now();
        }
        let (got, d, after) = h.join().unwrap();
        assert_eq!(got.as_deref(), Some(&b"value"[..]));
        assert_eq!(after, None, "deleted");
        assert_eq!(
            d.ops(OpKind::Write, Locality::Remote),
            0,
            "a GET sends no request"
        );
        assert!(
            d.ops(OpKind::Read, Locality::Remote) >= 2,
            "entry and extent READs: {d:?}"
        );
    });
    let st = server.stats().snapshot();
    assert_eq!((st.puts, st.deletes, st.gets, st.errors), (1, 1, 0, 0));
    assert_eq!(r.stores[1].stats().alloc.in_use, 0, "the extent was freed");
}

#[test]
fn cuckoo_inserts_move_keys_and_every_key_stays_readable() {
    let entries = 16;
    let r = rig(entries, 256, 0);
    let keys = r.keys_of(0, 40);
    let mut stored = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        match r.exec(OpCode::Put, k, format!("v{i}").as_bytes()) {
            Ok(_) => stored.push((k.clone(), i)),
            Err(Error::IndexFull { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    let st = r.stores[0].stats();
    assert!(st.moves > 0 && st.chains > 0, "{st:?}");
    assert!(
        stored.len() as u64 > entries / 2,
        "load factor {} of {entries}",
        stored.len()
    );
    let mut c = r.client(1);
    for (k, i) in &stored {
        assert_eq!(c.get(k).unwrap(), Some(format!("v{i}").into_bytes()));
    }
    if stored.len() < keys.len() {
        assert!(st.index_full >= 1);
        let (k, _) = (&keys[stored.len()], ());
        assert_eq!(c.get(k).unwrap(), None, "a refused insert leaves nothing");
    }
}

#[test]
fn a_full_extent_region_refuses_the_put_and_leaves_the_table_alone() {
    // 4 largest extents' worth of pages: the region holds far fewer than 400 extents.
    let r = rig(512, 4, 0);
    let keys = r.keys_of(0, 400);
    let mut full = None;
    for (i, k) in keys.iter().enumerate() {
        if let Err(e) = r.exec(OpCode::Put, k, &[i as u8; 32]) {
            full = Some((i, e));
            break;
        }
    }
    let (n, e) = full.expect("the region fills up");
    assert!(matches!(e, Error::DataTableFull { node: 0, .. }), "{e}");
    let mut c = r.client(1);
    assert_eq!(c.get(&keys[n]).unwrap(), None);
    assert_eq!(c.get(&keys[0]).unwrap(), Some(vec![0u8; 32]));
    // An update needs a new block before the old is freed: refused too, old value kept.
    assert!(r.exec(OpCode::Put, &keys[0], &[9u8; 32]).is_err());
    assert_eq!(c.get(&keys[0]).unwrap(), Some(vec![0u8; 32]));
    // A delete frees a block (at once: no reuse delay here). Blocks keep their size class: a
    // smaller extent does not fit it, one of the same size does.
    r.exec(OpCode::Delete, &keys[1], &[]).unwrap();
    assert!(matches!(
        r.exec(OpCode::Put, &keys[n], b"small"),
        Err(Error::DataTableFull { .. })
    ));
    r.exec(OpCode::Put, &keys[n], &[7u8; 32]).unwrap();
    assert_eq!(c.get(&keys[n]).unwrap(), Some(vec![7u8; 32]));
    assert_eq!(r.stores[0].stats().region_full, 3);
}

/// A full region whose freed blocks are still in their reuse delay makes the PUT wait for the
/// first of them rather than fail.
#[test]
fn a_put_waits_for_a_block_in_its_reuse_delay() {
    let delay = 5_000_000;
    let r = rig(512, 4, delay);
    let keys = r.keys_of(0, 400);
    let n = keys
        .iter()
        .position(|k| r.exec(OpCode::Put, k, &[3u8; 32]).is_err())
        .expect("the region fills up");
    assert_eq!(r.stores[0].stats().region_waits, 0, "nothing to wait for");
    r.exec(OpCode::Delete, &keys[0], &[]).unwrap();
    let t = std::time::Instant::now();
    r.exec(OpCode::Put, &keys[n], &[4u8; 32]).unwrap();
    assert!(
        t.elapsed().as_nanos() as u64 >= delay / 2,
        "{:?}",
        t.elapsed()
    );
    let st = r.stores[0].stats();
    assert_eq!((st.region_waits, st.alloc.reused), (1, 1), "{st:?}");
    assert_eq!(r.client(1).get(&keys[n]).unwrap(), Some(vec![4u8; 32]));
}

#[test]
fn freed_extents_wait_out_the_reuse_delay() {
    let r = rig(64, 64, 60_000_000_000);
    let k = r.keys_of(0, 1).remove(0);
    r.exec(OpCode::Put, &k, b"one").unwrap();
    let (_, first) = r.entry_of(&k);
    r.exec(OpCode::Put, &k, b"two").unwrap();
    r.exec(OpCode::Put, &k, b"six").unwrap();
    let (_, third) = r.entry_of(&k);
    assert_ne!(first.offset, third.offset, "not reused within the delay");
    assert_eq!(r.stores[0].stats().alloc.quarantined, 2);
    let r0 = rig(64, 64, 0);
    r0.exec(OpCode::Put, &k, b"one").unwrap();
    let (_, a) = r0.entry_of(&k);
    r0.exec(OpCode::Put, &k, b"two").unwrap();
    r0.exec(OpCode::Put, &k, b"six").unwrap();
    assert_eq!(
        r0.entry_of(&k).1.offset,
        a.offset,
        "reused at once without a delay"
    );
}

/// The race the checksums are for: a reader holds an entry whose extent's block has been freed
/// and is being rewritten. With verification the GET never returns the mixed bytes (here the
/// block stays torn, so it gives up); without, it returns bytes nobody wrote.
#[test]
fn an_extent_rewritten_under_its_entry_is_caught_by_its_checksum() {
    let r = rig(64, 64, 0);
    let k = r.keys_of(0, 1).remove(0);
    r.exec(OpCode::Put, &k, &[1u8; 32]).unwrap();
    let (_, e) = r.entry_of(&k);
    // Half of another PUT's extent of the same size has landed in the block.
    let mut ep = r.fabric.endpoint(0);
    ep.local_write(EXTENT_REGION, e.offset + 24, &[2u8; 16])
        .unwrap();
    let mut c = r.client(1);
    assert!(matches!(c.get(&k), Err(Error::Contended { attempts: 20 })));
    assert!(c.stats().extent_crc_retries >= 20, "{:?}", c.stats());
    let mut broken = r.cfg.clone();
    broken.mutations.skip_pilaf_checksums = true;
    let mut m = r.client_with(1, &broken);
    let v = m.get(&k).unwrap().unwrap();
    assert_ne!(v, vec![1u8; 32], "unverified, the torn value is returned");
    assert_ne!(v, vec![2u8; 32]);
}

/// A torn entry (its words from two writes) is read again, and the read succeeds once the
/// write has landed.
#[test]
fn a_torn_entry_is_read_again() {
    let r = rig(64, 64, 0);
    let k = r.keys_of(1, 1).remove(0);
    r.exec(OpCode::Put, &k, b"v").unwrap();
    let (slot, e) = r.entry_of(&k);
    let good = e.encode();
    let mut torn = good;
    torn[16..24].copy_from_slice(&(e.size + 8).to_le_bytes());
    let mut ep = r.fabric.endpoint(1);
    ep.local_write(TABLE_REGION, entry_offset(slot), &torn)
        .unwrap();
    let mut c = r.client(0);
    assert!(matches!(c.get(&k), Err(Error::Contended { .. })));
    assert!(c.stats().entry_crc_retries > 0);
    ep.local_write(TABLE_REGION, entry_offset(slot), &good)
        .unwrap();
    assert_eq!(c.get(&k).unwrap(), Some(b"v".to_vec()));
}

/// A key carried by a cuckoo move from a candidate the GET has not read yet to one it has read,
/// in the middle of its pass: the pass misses the key though it was in the table throughout.
/// The confirming pass finds it; a GET that trusts its first miss (mutation) reports it absent.
#[test]
fn a_key_moved_behind_a_reader_is_found() {
    assert_eq!(get_while_moved_behind(false).as_deref(), Some(&b"k"[..]));
    assert_eq!(get_while_moved_behind(true), None, "the mutation misses it");
}

/// Runs a PUT of another key on node 0 before the client's first READ of `at`.
struct PutBefore {
    at: nessie_fabric::RemoteAddr,
    put: Option<(Arc<PilafStore>, InProcEndpoint, Vec<u8>)>,
}

impl nessie_fabric::interpose::Interposer for PutBefore {
    fn before(
        &mut self,
        op: nessie_fabric::interpose::Op,
    ) -> Result<(), nessie_fabric::FabricError> {
        if op == nessie_fabric::interpose::Op::Read(self.at) {
            if let Some((store, mut ep, x)) = self.put.take() {
                store.execute(&mut ep, OpCode::Put, &x, b"x").unwrap();
            }
        }
        Ok(())
    }
}

/// GET of key K on a 4-entry table where K sits in its second candidate with its first empty,
/// while a PUT of X, arriving between the GET's READs of those two candidates, needs K's
/// entry and moves K into its (already read) first candidate.
fn get_while_moved_behind(trust_first_miss: bool) -> Option<Vec<u8>> {
    let r = rig(4, 64, 0);
    let cands = |k: &[u8]| candidates(key_hash(k), 4);
    let keys = r.keys_of(0, 4000);
    let k = keys[0].clone();
    let [c0, c1, c2] = cands(&k);
    let d = (0..4).find(|s| ![c0, c1, c2].contains(s)).unwrap();
    let mut not_c0 = [c1, c2, d];
    not_c0.sort();
    let sorted = |x: &[u8]| {
        let mut c = cands(x);
        c.sort();
        c
    };
    // F fills c0 while K is inserted, so K lands in c1; A and B fill c2 and d and, like X,
    // cannot move to c0 (it is none of their candidates); then F leaves.
    let f = keys[1..].iter().find(|x| cands(x)[0] == c0).unwrap();
    let abx: Vec<_> = keys[1..]
        .iter()
        .filter(|x| sorted(x) == not_c0)
        .take(3)
        .collect();
    r.exec(OpCode::Put, f, b"f").unwrap();
    r.exec(OpCode::Put, &k, b"k").unwrap();
    r.exec(OpCode::Put, abx[0], b"a").unwrap();
    r.exec(OpCode::Put, abx[1], b"b").unwrap();
    r.exec(OpCode::Delete, f, &[]).unwrap();
    assert_eq!(r.entry_of(&k).0, c1);
    let hook = PutBefore {
        at: nessie_fabric::RemoteAddr::new(0, TABLE_REGION, entry_offset(c1)),
        put: Some((r.stores[0].clone(), r.fabric.endpoint(0), abx[2].clone())),
    };
    let ep = nessie_fabric::interpose::Interposed::new(r.fabric.endpoint(1), hook);
    let mut cfg = r.cfg.clone();
    cfg.mutations.pilaf_trust_first_miss = trust_first_miss;
    let slot = r.pools[1].take().unwrap();
    let mut c = PilafClient::new(ep, r.view.clone(), &cfg, r.shared.clone(), slot).unwrap();
    let got = c.get(&k).unwrap();
    assert_eq!(r.entry_of(&k).0, c0, "K was moved during the GET");
    assert_eq!(r.stores[0].stats().moves, 1);
    got
}

/// A miss is reported only when a second pass saw the move sequence even and unchanged.
#[test]
fn a_miss_waits_for_moves_to_end() {
    let r = rig(64, 64, 0);
    let k = r.keys_of(0, 1).remove(0);
    let mut ep = r.fabric.endpoint(0);
    ep.local_write(TABLE_REGION, layout::MOVE_SEQ_OFFSET, &1u64.to_le_bytes())
        .unwrap();
    let mut c = r.client(1);
    assert!(matches!(c.get(&k), Err(Error::Contended { .. })));
    assert!(c.stats().move_retries >= 20, "{:?}", c.stats());
    ep.local_write(TABLE_REGION, layout::MOVE_SEQ_OFFSET, &2u64.to_le_bytes())
        .unwrap();
    assert_eq!(c.get(&k).unwrap(), None);
}

#[test]
fn bad_geometry_and_oversized_requests_are_refused() {
    let g = Geometry {
        ites_per_node: 2,
        ..Geometry::default()
    };
    let e = PilafParams::new(&g, 0).unwrap_err().to_string();
    assert!(e.contains("hash-table entries"), "{e}");
    let r = rig(64, 64, 0);
    let mut c = r.client(0);
    let before = c.endpoint().stats().snapshot();
    assert_eq!(c.get(b""), Err(Error::EmptyKey));
    assert_eq!(
        c.put(b"k", &[0u8; 33]),
        Err(Error::ValueTooLarge { len: 33, max: 32 })
    );
    assert_eq!(c.endpoint().stats().snapshot(), before, "no memory touched");
}
