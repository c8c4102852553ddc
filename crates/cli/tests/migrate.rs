//! Index partitions migrate between node processes while a writer runs (the per-ITE handover,
//! started and ended through etcd):
//! - by hand (`nessie migrate`): every partition of node 0's index moves to chains on nodes 1
//!   and 2 and one of them on again; node 0, whose index moved away, killed afterwards loses
//!   nothing;
//! - by the balancer: a node killed for good has its copies re-created on the survivors, comes
//!   back and is given its share, and a second node killed then loses nothing;
//! - leaving (`nessie leave`) and joining (`nessie join`: standby nodes).
//!
//! A writer puts and deletes throughout; no acknowledged write or delete is lost, and every
//! key reads alike through every node.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{get, stderr, Cluster};
use nessie_cluster::process;

const KEYS: usize = 60;

fn put(c: &Cluster, node: u16, key: &str, value: &str) -> bool {
    c.nessie(&["put", "--node", &node.to_string(), key, value])
        .status
        .success()
}

fn del(c: &Cluster, node: u16, key: &str) -> bool {
    c.nessie(&["del", "--node", &node.to_string(), key])
        .status
        .success()
}

/// What a key may read: its last acknowledged value (`None`: deleted), or that of a write
/// after it that failed (it may or may not have landed).
#[derive(Clone, Debug, Default)]
struct Possible {
    acked: Option<String>,
    unsure: Vec<Option<String>>,
}

impl Possible {
    fn allows(&self, got: &Option<String>) -> bool {
        *got == self.acked || self.unsure.contains(got)
    }
}

/// Every key reads one of its possible values through each of `nodes`.
fn check(c: &Cluster, nodes: &[u16], model: &BTreeMap<String, Possible>) {
    for &n in nodes {
        for (k, p) in model {
            let got = get(c, n, k);
            assert!(
                p.allows(&got),
                "{k} through node {n}: {got:?}, expected {p:?}"
            );
        }
    }
}

/// A thread that puts and deletes the test's keys (one operation in four a DELETE) through the
/// nodes `live` lists, in turn, until `stop`, recording each outcome in `model`. Returns how
/// many operations it made and how many failed.
fn spawn_writer(
    c: &Cluster,
    model: &Arc<Mutex<BTreeMap<String, Possible>>>,
    stop: &Arc<AtomicBool>,
    live: Arc<Mutex<Vec<u16>>>,
) -> std::thread::JoinHandle<(usize, usize)> {
    let (model, stop) = (model.clone(), stop.clone());
    let dir = c.dir.clone();
    std::thread::spawn(move || {
        let c = Cluster { dir };
        let (mut n, mut failed) = (0usize, 0usize);
        while !stop.load(Ordering::SeqCst) {
            let k = format!("key-{}", n % KEYS);
            let v = (n % 4 != 3).then(|| format!("value-{n}-w"));
            let node = {
                let live = live.lock().unwrap();
                live[n % live.len()]
            };
            let ok = match &v {
                Some(v) => put(&c, node, &k, v),
                None => del(&c, node, &k),
            };
            let mut m = model.lock().unwrap();
            let p = m.entry(k).or_default();
            match ok {
                true => {
                    *p = Possible {
                        acked: v,
                        unsure: Vec::new(),
                    }
                }
                false => {
                    p.unsure.push(v);
                    failed += 1;
                }
            }
            n += 1;
        }
        std::mem::forget(c); // the test's own handle stops the cluster
        (n, failed)
    })
}

fn status(c: &Cluster) -> serde_json::Value {
    serde_json::from_slice(&c.nessie(&["status", "--json"]).stdout).expect("status --json")
}

fn node_logs(c: &Cluster) -> String {
    std::fs::read_dir(&c.dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect()
}

#[test]
fn index_partitions_migrate_under_writes_and_a_kill_afterwards_loses_nothing() {
    // A small index (256 entries a node: 4 partitions of 64 each), so that the keys fill
    // every partition.
    let c = Cluster::up(
        "migrate",
        3,
        "shm",
        &[
            "--lease-ttl",
            "2",
            "--replicas",
            "2",
            "--ites-per-node",
            "256",
            "--dtes-per-node",
            "4096",
            // Partitions placed by hand only: the balancer would move node 0's back to it.
            "--no-rebalance",
        ],
    );
    let top = status(&c);
    assert_eq!(top["index_partitions"], 12, "{top:#}");
    assert_eq!(top["migrating"], 0);

    // Bad requests are refused with what is wrong, and change nothing.
    for (args, says) in [
        (&["--partition", "12", "--to", "1,2"][..], "not in 0..12"),
        (&["--partition", "0", "--to", "1,1"][..], "2 distinct nodes"),
        (&["--partition", "0", "--to", "1"][..], "2 distinct nodes"),
    ] {
        let out = c.nessie(&[&["migrate"][..], args].concat());
        assert!(!out.status.success());
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    assert_eq!(status(&c)["epoch"], 1, "a refused request moves no epoch");

    let model = Arc::new(Mutex::new(BTreeMap::<String, Possible>::new()));
    for i in 0..KEYS {
        let (k, v) = (format!("key-{i}"), format!("value-{i}"));
        assert!(put(&c, (i % 3) as u16, &k, &v));
        model.lock().unwrap().entry(k).or_default().acked = Some(v);
    }
    // A writer puts and deletes keys through every node throughout (one op in four a DELETE:
    // the first design of the handover lost acknowledged DELETEs).
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(&c, &model, &stop, Arc::new(Mutex::new(vec![0, 1, 2])));

    // Every partition of node 0's index (0 to 3) to a chain on nodes 1 and 2, all at once.
    let t0 = Instant::now();
    for q in 0..4 {
        let to = if q % 2 == 0 { "1,2" } else { "2,1" };
        let out = c.nessie(&["migrate", "--partition", &q.to_string(), "--to", to]);
        assert!(out.status.success(), "partition {q}: {}", stderr(&out));
        let said = String::from_utf8(out.stdout).unwrap();
        assert!(
            said.contains(&format!("partition {q} migrating to node")),
            "{said}"
        );
    }
    // The same partition again while it migrates is refused.
    let again = c.nessie(&["migrate", "--partition", "0", "--to", "2,1"]);
    assert!(
        stderr(&again).contains("migrating already"),
        "{}",
        stderr(&again)
    );
    let mut last = serde_json::Value::Null;
    while t0.elapsed() < Duration::from_secs(60) {
        last = status(&c);
        if last["migrating"] == 0 {
            break;
        }
        assert_eq!(last["rebalancing"], true, "{last:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(last["migrating"], 0, "still migrating after 60 s: {last:#}");
    eprintln!("4 partitions migrated in {:?}", t0.elapsed());
    // One of them on again, from slots to slots, with --wait.
    let out = c.nessie(&["migrate", "--partition", "1", "--to", "1,2", "--wait"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(said.contains("partition 1 migrated in"), "{said}");
    let top = status(&c);
    assert_eq!(
        (
            &top["migrating"],
            &top["rebalancing"],
            &top["index_partitions_short"]
        ),
        (&0.into(), &false.into(), &0.into()),
        "{top:#}"
    );
    // Writes go on a little after the end too.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let (writes, failed) = writer.join().unwrap();
    eprintln!("{writes} writes and deletes beside the migrations, {failed} failed");
    assert!(writes > 50, "the writer kept going: {writes}");
    let logs = node_logs(&c);
    for q in 0..4 {
        assert!(
            logs.contains(&format!("handed over index partition {q} (")),
            "partition {q} not handed over:\n{logs}"
        );
    }

    let model = model.lock().unwrap().clone();
    check(&c, &[0, 1, 2], &model);

    // Node 0 killed: its index lives on nodes 1 and 2 now (its data tables' second copies on
    // node 1), and everything still reads and writes through them.
    let pid = process::live_pid(&c.dir, 0).expect("node 0 runs");
    // SAFETY: killing a node process this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let killed = Instant::now();
    while status(&c)["nodes"][0]["state"] != "failed" {
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "node 0 not failed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    check(&c, &[1, 2], &model);
    for (i, k) in model.keys().enumerate() {
        assert!(
            put(&c, [1, 2][i % 2], k, "after the kill"),
            "{k} cannot be written"
        );
    }
}

/// Four nodes, two copies, `--lease-ttl 2 --replace-after 6`, a 16-partition index: the
/// cluster of the balancer's and the leave's tests.
fn four_nodes(name: &str) -> Cluster {
    Cluster::up(
        name,
        4,
        "shm",
        &[
            "--lease-ttl",
            "2",
            "--replicas",
            "2",
            "--replace-after",
            "6",
            "--ites-per-node",
            "256",
            "--dtes-per-node",
            "4096",
        ],
    )
}

/// The test's keys written through nodes `0..nodes` in turn: the model of what each reads.
fn load(c: &Cluster, nodes: u16) -> Arc<Mutex<BTreeMap<String, Possible>>> {
    let model = Arc::new(Mutex::new(BTreeMap::<String, Possible>::new()));
    for i in 0..KEYS {
        let (k, v) = (format!("key-{i}"), format!("value-{i}"));
        assert!(put(c, (i % nodes as usize) as u16, &k, &v));
        model.lock().unwrap().entry(k).or_default().acked = Some(v);
    }
    model
}

/// Index partition copies each node holds, from `status --json`.
fn index_copies(top: &serde_json::Value) -> Vec<u64> {
    top["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["index_copies"].as_u64().unwrap())
        .collect()
}

/// Wait up to `limit` until `done` holds of `status --json`; returns it then.
fn wait_status(
    c: &Cluster,
    what: &str,
    limit: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let top = status(c);
        if done(&top) {
            eprintln!("{what}: after {:?}", t0.elapsed());
            return top;
        }
        assert!(t0.elapsed() < limit, "{what}: not after {limit:?}: {top:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every index partition has its copies on up nodes, none migrates, the up nodes `up` hold
/// their shares (within the planner's ±10% of the mean, rounded outwards), and every table
/// has its copies (unless not `tables`).
fn whole_and_balanced(top: &serde_json::Value, up: &[u16], tables: bool) -> bool {
    let copies = index_copies(top);
    let total: u64 = up.iter().map(|&n| copies[n as usize]).sum();
    let (lo, hi) = nessie_membership::partitions::balance_bounds(total, up.len());
    top["migrating"] == 0
        && top["index_partitions_short"] == 0
        && top["rebalancing"] == false
        && (!tables || top["under_replicated"] == 0)
        && total == 2 * top["index_partitions"].as_u64().unwrap()
        && up.iter().all(|&n| (lo..=hi).contains(&copies[n as usize]))
}

/// The balancer with the default flags but a short `--replace-after`: node 1 killed for good
/// has its index copies re-created on the survivors (the copies of its tables move to spare
/// slots, as before) and the survivors balanced; started again, it comes back holding nothing
/// and is given its share; then node 2 killed loses nothing, and its index copies are
/// re-created in turn. A writer runs throughout.
#[test]
fn the_balancer_recreates_a_lost_node_s_copies_and_gives_a_returning_node_its_share() {
    let c = four_nodes("balance");
    let top = status(&c);
    assert_eq!(top["index_partitions"], 16, "{top:#}");
    assert!(whole_and_balanced(&top, &[0, 1, 2, 3], true), "{top:#}");
    let model = load(&c, 4);
    let stop = Arc::new(AtomicBool::new(false));
    let live = Arc::new(Mutex::new(vec![0, 2, 3]));
    let writer = spawn_writer(&c, &model, &stop, live.clone());

    // Node 1 killed for good.
    let pid = process::live_pid(&c.dir, 1).expect("node 1 runs");
    // SAFETY: killing a node process this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let top = wait_status(
        &c,
        "node 1's copies re-created",
        Duration::from_secs(120),
        |t| {
            t["nodes"][1]["state"] == "failed"
                && index_copies(t)[1] == 0
                && whole_and_balanced(t, &[0, 2, 3], true)
        },
    );
    eprintln!("index copies held: {:?}", index_copies(&top));
    // The writer stops while the keys are read (a read races with its writes otherwise).
    let mut ops = stop_writer(&stop, writer);
    check(&c, &[0, 2, 3], &model.lock().unwrap());
    let writer = spawn_writer(&c, &model, &stop, live.clone());

    // Node 1 back: it joins holding nothing and the balancer gives it its share.
    let _node1 = common::restart(&c, 1);
    let top = wait_status(
        &c,
        "node 1 back and given its share",
        Duration::from_secs(120),
        |t| t["nodes"][1]["state"] == "up" && whole_and_balanced(t, &[0, 1, 2, 3], true),
    );
    eprintln!("index copies held: {:?}", index_copies(&top));
    live.lock().unwrap().push(1);
    let logs = node_logs(&c);
    assert!(
        logs.contains("balancer: ") && logs.contains(" partitions migrating (epoch"),
        "the balancer said nothing:\n{logs}"
    );

    // Node 2 killed: every partition keeps a copy on another node, and every table too.
    live.lock().unwrap().retain(|&n| n != 2);
    std::thread::sleep(Duration::from_millis(300));
    let pid = process::live_pid(&c.dir, 2).expect("node 2 runs");
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_status(&c, "node 2 failed", Duration::from_secs(15), |t| {
        t["nodes"][2]["state"] == "failed"
    });
    // Its index copies too are re-created, those in index slots among them (chains that
    // moved to node 1). Its tables stay one copy short: the spare slot of every survivor holds
    // a copy of node 1's old tables or node 0's (tables move only into spare slots).
    let top = wait_status(
        &c,
        "node 2's index copies re-created",
        Duration::from_secs(120),
        |t| index_copies(t)[2] == 0 && whole_and_balanced(t, &[0, 1, 3], false),
    );
    assert!(top["under_replicated"].as_u64().unwrap() > 0, "{top:#}");
    eprintln!("index copies held: {:?}", index_copies(&top));
    let more = stop_writer(&stop, writer);
    ops = (ops.0 + more.0, ops.1 + more.1);
    eprintln!(
        "{} writes and deletes beside the faults, {} failed",
        ops.0, ops.1
    );
    assert!(ops.0 > 50, "the writer kept going: {ops:?}");
    check(&c, &[0, 1, 3], &model.lock().unwrap());
}

/// Stop the writer and wait for it: (operations, failed).
fn stop_writer(
    stop: &AtomicBool,
    writer: std::thread::JoinHandle<(usize, usize)>,
) -> (usize, usize) {
    stop.store(true, Ordering::SeqCst);
    let done = writer.join().unwrap();
    stop.store(false, Ordering::SeqCst);
    done
}

/// `nessie leave`: node 3 drains while a writer runs through every node (itself included,
/// until it stops): the balancer moves its index partitions to the others; then it steps
/// down and stops, and, its exit seen and recorded in membership, the copies of its tables
/// move to spare slots of the others a join settle time after it failed, not
/// `--replace-after` (6 s) as a failed node's do. Nothing is lost, and node 2 killed afterwards loses nothing either.
/// Bad requests are refused first.
#[test]
fn a_node_leaves_under_writes_and_nothing_is_lost() {
    let c = four_nodes("leave");
    for (args, says) in [
        (&["--node", "9"][..], "node 9"),
        (
            &["--node", "1", "--cancel", "--keep-running"][..],
            "cannot be used with",
        ),
    ] {
        let out = c.nessie(&[&["leave"][..], args].concat());
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    let model = load(&c, 4);
    let stop = Arc::new(AtomicBool::new(false));
    let live = Arc::new(Mutex::new(vec![0, 1, 2, 3]));
    let writer = spawn_writer(&c, &model, &stop, live.clone());
    let t0 = Instant::now();
    let out = c.nessie(&["leave", "--node", "3", "--timeout", "120"]);
    live.lock().unwrap().retain(|&n| n != 3);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{said}{}", stderr(&out));
    assert!(
        said.contains("node 3 leaving")
            && said.contains("index partitions moved to the others in")
            && said.contains("stepped down and stopped")
            && said.contains("move to spare slots of the others now"),
        "{said}"
    );
    eprintln!("node 3 left in {:?}", t0.elapsed());
    // It holds no index partition, and its table copies leave it a join settle time (a
    // 2 s TTL and an operation) after it failed, not --replace-after (6 s): `leave` recorded
    // its stop.
    let cfg = nessie_cluster::config::ClusterConfig::load(&process::config_path(&c.dir)).unwrap();
    let s = process::membership_status(&cfg).unwrap().unwrap();
    let m = s
        .config
        .unwrap()
        .nodes
        .into_iter()
        .find(|m| m.id == 3)
        .unwrap();
    assert!(
        m.state == nessie_membership::NodeState::Failed && m.stopped_ns != 0,
        "{m:?}"
    );
    let top = status(&c);
    assert_eq!(index_copies(&top)[3], 0, "{top:#}");
    assert_eq!(top["nodes"][3]["leaving"], true, "{top:#}");
    // A second node may not leave before node 3's tables have moved (node 2 holds the other
    // copy of some of them).
    let out = c.nessie(&["leave", "--node", "2"]);
    assert!(
        !out.status.success() && stderr(&out).contains("cannot leave while"),
        "{}",
        stderr(&out)
    );
    assert_eq!(top["nodes"][0]["leaving"], false, "{top:#}");
    wait_status(
        &c,
        "node 3's table copies moved",
        Duration::from_secs(60),
        |t| t["nodes"][3]["state"] == "failed" && t["nodes"][3]["partitions"] == 0,
    );
    let failed_for = nessie_fabric::wall_clock_ns().saturating_sub(m.since_ns);
    assert!(
        failed_for < 6_000_000_000,
        "node 3's copies moved only {} ms after it failed: the --replace-after wait",
        failed_for / 1_000_000
    );
    // The others then balance what they hold: every partition whole on nodes 0 to 2.
    let top = wait_status(
        &c,
        "node 3's tables moved, the rest balanced",
        Duration::from_secs(90),
        |t| {
            t["nodes"][3]["state"] == "failed"
                && t["nodes"][3]["partitions"] == 0
                && whole_and_balanced(t, &[0, 1, 2], true)
        },
    );
    eprintln!("index copies held: {:?}", index_copies(&top));
    let mut ops = stop_writer(&stop, writer);
    check(&c, &[0, 1, 2], &model.lock().unwrap());

    // Node 2 killed: every copy node 3 held has another holder besides node 2.
    let writer = spawn_writer(&c, &model, &stop, Arc::new(Mutex::new(vec![0, 1])));
    let pid = process::live_pid(&c.dir, 2).expect("node 2 runs");
    // SAFETY: killing a node process this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_status(&c, "node 2 failed", Duration::from_secs(15), |t| {
        t["nodes"][2]["state"] == "failed"
    });
    std::thread::sleep(Duration::from_millis(500));
    let more = stop_writer(&stop, writer);
    ops = (ops.0 + more.0, ops.1 + more.1);
    eprintln!(
        "{} writes and deletes beside the leave, {} failed",
        ops.0, ops.1
    );
    assert!(ops.0 > 50, "the writer kept going: {ops:?}");
    check(&c, &[0, 1], &model.lock().unwrap());
}

/// `nessie join`: a cluster started with three nodes and two standing by (`--standby 2`,
/// R = 2) grows to five while a writer runs, each node given its share of index partitions by
/// the balancer with no manual step; then the two leave again (`nessie leave`). Nothing is
/// lost, and every key reads alike through every node at each size. Bad requests are refused.
#[test]
fn standby_nodes_join_under_writes_then_leave_and_nothing_is_lost() {
    let refused = Cluster::at("join-refused");
    let out = refused.nessie(&["up", "--nodes", "3", "--standby", "2"]);
    assert!(
        !out.status.success() && stderr(&out).contains("cluster.standby"),
        "standby nodes without copies: {}",
        stderr(&out)
    );
    let c = Cluster::up(
        "join",
        3,
        "shm",
        &[
            "--standby",
            "2",
            "--lease-ttl",
            "2",
            "--replicas",
            "2",
            // Leaving nodes' tables move only into spare slots: two leaves, after the two
            // copies epoch 1 placed for the standby nodes, need more than one per node.
            "--spare-copies",
            "2",
            "--replace-after",
            "6",
            "--ites-per-node",
            "256",
            "--dtes-per-node",
            "4096",
        ],
    );
    let top = wait_status(
        &c,
        "epoch 1's copies filled",
        Duration::from_secs(30),
        |t| whole_and_balanced(t, &[0, 1, 2], true),
    );
    assert_eq!(top["nodes"][3]["state"], "standby", "{top:#}");
    assert_eq!(index_copies(&top)[3..], [0, 0], "{top:#}");
    // A process without the cluster's secret cannot join: the bootstrap refuses it.
    let stranger = c.dir.join("stranger");
    std::fs::create_dir(&stranger).unwrap();
    let toml = std::fs::read_to_string(c.dir.join("cluster.toml")).unwrap();
    let secret = toml.lines().find(|l| l.starts_with("secret = ")).unwrap();
    let wrong = toml.replace(secret, &format!("secret = \"{}\"", "5a".repeat(32)));
    std::fs::write(stranger.join("cluster.toml"), wrong).unwrap();
    let out = std::process::Command::new(common::BIN)
        .args(["node", "--config"])
        .arg(stranger.join("cluster.toml"))
        .args(["--id", "3"])
        .output()
        .unwrap();
    assert!(
        !out.status.success() && stderr(&out).contains("does not know the cluster secret"),
        "{}",
        stderr(&out)
    );
    assert_eq!(status(&c)["nodes"][3]["state"], "standby");
    let model = load(&c, 3);
    // Node 0 holds the only copy of node 4's tables but copy 0 (which waits on standby node
    // 4): killed and started again, it fills that copy from nothing (nobody wrote it) and is
    // up again; it used to find no full copy and stay joining for good.
    let pid = process::live_pid(&c.dir, 0).expect("node 0 runs");
    // SAFETY: killing a node process this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_status(&c, "node 0 failed", Duration::from_secs(15), |t| {
        t["nodes"][0]["state"] == "failed"
    });
    let _node0 = common::restart(&c, 0);
    wait_status(&c, "node 0 back", Duration::from_secs(60), |t| {
        whole_and_balanced(t, &[0, 1, 2], true) && t["nodes"][0]["state"] == "up"
    });
    check(&c, &[0, 1, 2], &model.lock().unwrap());
    // More nodes than stand by: refused, nothing started.
    let out = c.nessie(&["join", "--count", "3"]);
    assert!(
        !out.status.success() && stderr(&out).contains("only 2 standby node(s) are left"),
        "{}",
        stderr(&out)
    );
    assert!(process::live_pid(&c.dir, 3).is_none() && process::live_pid(&c.dir, 4).is_none());
    let stop = Arc::new(AtomicBool::new(false));
    let live = Arc::new(Mutex::new(vec![0, 1, 2]));
    let writer = spawn_writer(&c, &model, &stop, live.clone());
    for id in [3u16, 4] {
        let t0 = Instant::now();
        let out = c.nessie(&["join", "--quiet", "--timeout", "60"]);
        assert!(out.status.success(), "join: {}", stderr(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), id.to_string());
        live.lock().unwrap().push(id);
        let up: Vec<u16> = (0..=id).collect();
        let top = wait_status(
            &c,
            &format!("node {id} joined and given its share"),
            Duration::from_secs(120),
            |t| whole_and_balanced(t, &up, true),
        );
        eprintln!(
            "node {id} joined and balanced in {:?}: index copies {:?}",
            t0.elapsed(),
            index_copies(&top)
        );
    }
    let out = c.nessie(&["join"]);
    assert!(
        !out.status.success() && stderr(&out).contains("every standby node has joined"),
        "{}",
        stderr(&out)
    );
    let mut ops = stop_writer(&stop, writer);
    check(&c, &[0, 1, 2, 3, 4], &model.lock().unwrap());

    let writer = spawn_writer(&c, &model, &stop, Arc::new(Mutex::new(vec![0, 1, 2])));
    for id in [4u16, 3] {
        let out = c.nessie(&["leave", "--node", &id.to_string(), "--timeout", "120"]);
        assert!(out.status.success(), "leave {id}: {}", stderr(&out));
        let up: Vec<u16> = (0..id).collect();
        wait_status(
            &c,
            &format!("node {id} left, its tables moved, the rest balanced"),
            Duration::from_secs(120),
            |t| t["nodes"][id as usize]["partitions"] == 0 && whole_and_balanced(t, &up, true),
        );
    }
    let more = stop_writer(&stop, writer);
    ops = (ops.0 + more.0, ops.1 + more.1);
    eprintln!(
        "{} writes and deletes beside the joins and leaves, {} failed",
        ops.0, ops.1
    );
    assert!(ops.0 > 50, "the writer kept going: {ops:?}");
    check(&c, &[0, 1, 2], &model.lock().unwrap());
}
