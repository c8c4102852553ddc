//! What the replication tests share: a small geometry, keys and values, a model of what the
//! cluster holds, and writing rounds through clients on several nodes.

use std::collections::BTreeMap;

use nessie_cluster::LocalCluster;
use nessie_fabric::NodeId;
use nessie_protocols::ProtocolConfig;
use nessie_store::Geometry;

pub fn geometry(nodes: u32) -> Geometry {
    Geometry {
        nodes,
        ites_per_node: 256,
        dtes_per_node: 512,
        key_max: 16,
        value_max: 64,
        hash_functions: 3,
        filter_bits: 7,
    }
}

pub fn cfg() -> ProtocolConfig {
    ProtocolConfig {
        expiry_ns: 5_000_000,
        clock_margin_ns: 0,
        ..ProtocolConfig::default()
    }
}

pub fn key(i: u64) -> Vec<u8> {
    format!("k{i:05}").into_bytes()
}

pub fn value(i: u64, round: u64) -> Vec<u8> {
    let mut v = format!("v{i}-{round}-").into_bytes();
    v.resize(8 + (i % 40) as usize, b'x');
    v
}

/// The cluster's last acknowledged state of every key.
pub type Model = BTreeMap<u64, Option<Vec<u8>>>;

/// PUT `keys` keys from clients on every node in `writers` in turn (`round` picks the values),
/// and DELETE every `delete_every`-th.
pub fn write_round(
    c: &LocalCluster,
    writers: &[NodeId],
    keys: u64,
    round: u64,
    delete_every: u64,
    model: &mut Model,
) {
    let mut clients: Vec<_> = writers.iter().map(|&n| c.client(n).unwrap()).collect();
    for i in 0..keys {
        let w = &mut clients[(i % writers.len() as u64) as usize];
        if delete_every != 0 && i % delete_every == 0 {
            w.delete(&key(i)).unwrap();
            model.insert(i, None);
        } else {
            w.put(&key(i), &value(i, round)).unwrap();
            model.insert(i, Some(value(i, round)));
        }
    }
}

pub fn crash(c: &LocalCluster, node: NodeId) {
    c.fabric().kill_node(node);
    c.fail_node(node);
}
