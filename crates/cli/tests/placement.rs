//! Placement across node processes: a node whose own memory is full writes its entries into
//! pages it claims on another node, every node reads them, and once they are deleted the
//! writer's reclaimer gives the pages back although the writer has gone idle.

use std::time::{Duration, Instant};

mod common;
use common::{stderr, Cluster};

/// Keys written through node 0: more than its own pages hold.
const KEYS: usize = 20;
/// Bytes of each value: every entry is of the largest class (8 per page).
const VALUE_LEN: usize = 3900;

fn status(c: &Cluster) -> Vec<serde_json::Value> {
    let out = c.nessie(&["status", "--json"]);
    assert!(out.status.success(), "status failed: {}", stderr(&out));
    common::status_nodes(&out).unwrap()
}

fn run(c: &Cluster, args: &[&str]) -> Vec<u8> {
    let out = c.nessie(args);
    assert!(out.status.success(), "{args:?} failed: {}", stderr(&out));
    out.stdout
}

fn value(i: usize) -> String {
    format!("{i:04}").repeat(VALUE_LEN / 4)
}

#[test]
fn a_full_node_places_entries_on_another_and_its_reclaimer_gives_them_back() {
    // Per node: 3 pages of 8 largest entries, one kept for deletes and one for the node's own
    // writers, so node 0 holds 16 values at home and 8 more in one page of node 1.
    let geometry = [
        "--dtes-per-node",
        "16",
        "--ites-per-node",
        "1024",
        "--key-max",
        "16",
        "--value-max",
        "4000",
        "--expiry-ms",
        "100",
    ];
    let c = Cluster::up("placement", 2, "shm", &geometry);
    for i in 0..KEYS {
        run(&c, &["put", &format!("k{i}"), &value(i), "--node", "0"]);
    }
    let s = status(&c);
    let remote: u64 = s[0]["data_table"]["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|cl| cl["remote_pages"].as_u64().unwrap())
        .sum();
    assert_eq!(remote, 1, "node 0 placed entries on node 1: {}", s[0]);
    assert_eq!(s[1]["data_table"]["pages_claimed"], 1, "{}", s[1]);
    // Node 1 reads every value, wherever its entry lives.
    for i in 0..KEYS {
        let got = run(&c, &["get", &format!("k{i}"), "--node", "1"]);
        assert_eq!(
            String::from_utf8_lossy(&got).trim_end(),
            value(i),
            "key k{i}"
        );
    }
    for i in 0..KEYS {
        run(&c, &["del", &format!("k{i}"), "--node", "0"]);
    }
    // Node 0 now writes nothing: only its reclaimer can give the pages back.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = status(&c);
        let claimed: Vec<u64> = s
            .iter()
            .map(|n| n["data_table"]["pages_claimed"].as_u64().unwrap())
            .collect();
        if claimed == [0, 0] {
            assert!(s[0]["data_table"]["scans"].as_u64().unwrap() >= 1);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pages still claimed {claimed:?} 10 s after the deletes: {}",
            s[0]["data_table"]
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
