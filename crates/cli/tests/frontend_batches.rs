//! Pipelined batches of plain GETs and SETs through the Redis front ends of every node, run
//! with operations in flight (`[frontends] inflight`, `docs/frontends.md`), with delays
//! injected into fabric operations and a small index to widen the races, and node 2 paused
//! (SIGSTOP) part way, or, with two copies of every node's tables, killed and restarted. Each client pipelines batches of 1 to 12 commands, DELs among them (not
//! queued: they cut a batch in two). Checked:
//! - each client's own keys, written by it alone: every GET answers the client's last SET or
//!   DEL before it in command order (B1 and B2: replies in order, one key's commands in
//!   order), though the node runs the batch's commands together;
//! - the shared keys: the history, each command between its batch's send and its own reply,
//!   is linearizable (`nessie_check`).
//!
//! The mutation that lets the nodes' pipelines start an operation while another on its key
//! runs (`nessie node --mutation-unordered-batches`) is caught by the first check.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{free_port_range, Cluster};
use nessie_check::{History, Limits, Op, Outcome};

const NODES: u16 = 3;
const CLIENTS_PER_NODE: u16 = 2;
/// How long the clients run, and when node 2 is paused (from their start).
const RUN: Duration = Duration::from_secs(4);
const PAUSE_AT: Duration = Duration::from_millis(1_500);
/// Most commands per batch.
const MAX_BATCH: u64 = 12;
const SHARED_KEYS: u64 = 4;
/// Keys per client that only it writes.
const OWN_KEYS: u64 = 3;
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Delays injected into the node processes' fabric operations: SEED,PROBABILITY,MAX_NS.
const INJECT_DELAY: &str = "--node-arg=--inject-delay=9,0.05,30000";
/// How long node 2 is paused.
const PAUSE: Duration = Duration::from_millis(400);

/// One reply of RESP: `+OK`, a bulk string or nil, an integer, or an error.
#[derive(Debug, PartialEq)]
enum Reply {
    Ok,
    Bulk(Option<String>),
    Int(i64),
    Err(String),
}

fn read_reply(r: &mut BufReader<TcpStream>) -> Reply {
    let mut line = String::new();
    r.read_line(&mut line).expect("a reply");
    let line = line.strip_suffix("\r\n").expect("a whole line");
    match line.split_at(1) {
        ("+", "OK") => Reply::Ok,
        ("-", e) => Reply::Err(e.to_string()),
        (":", n) => Reply::Int(n.parse().unwrap()),
        ("$", "-1") => Reply::Bulk(None),
        ("$", n) => {
            let mut b = vec![0u8; n.parse::<usize>().unwrap() + 2];
            r.read_exact(&mut b).unwrap();
            b.truncate(b.len() - 2);
            Reply::Bulk(Some(String::from_utf8(b).unwrap()))
        }
        _ => panic!("unexpected reply {line:?}"),
    }
}

fn resp(words: &[&str]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", words.len()).into_bytes();
    for w in words {
        v.extend_from_slice(format!("${}\r\n{w}\r\n", w.len()).as_bytes());
    }
    v
}

/// A command of a batch.
#[derive(Clone, Debug)]
enum Cmd {
    Get(String),
    Set(String, u64),
    Del(String),
}

/// The last write of `key`, if it is one of the client's own (only their writes are known).
fn note(own: &mut HashMap<String, Option<Option<u64>>>, key: &str, last: Option<Option<u64>>) {
    if key.starts_with('c') {
        own.insert(key.to_string(), last);
    }
}

/// What one client found wrong with its own keys.
type Mismatches = Vec<String>;

/// Client `id` on `port`: its batches, recorded in `history` (shared keys) and checked against
/// its own keys' last writes.
fn client(id: u64, port: u16, history: &History, until: Instant) -> (Mismatches, Duration) {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut rec = history.recorder(id as u32);
    let mut x = (id + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    // Own keys' last write (None: absent); a failed write leaves it unknown until the next.
    let mut own: HashMap<String, Option<Option<u64>>> = HashMap::new();
    let mut bad = Vec::new();
    let mut longest = Duration::ZERO;
    let mut written = 0u64;
    let mut b = 0;
    while Instant::now() < until {
        b += 1;
        let n = 1 + next(MAX_BATCH);
        let cmds: Vec<Cmd> = (0..n)
            .map(|_| {
                let key = match next(2) {
                    0 => format!("s{}", next(SHARED_KEYS)),
                    _ => format!("c{id}-{}", next(OWN_KEYS)),
                };
                match next(10) {
                    0..=4 => Cmd::Get(key),
                    5..=8 => {
                        written += 1;
                        Cmd::Set(key, id * 1_000_000 + written)
                    }
                    _ => Cmd::Del(key),
                }
            })
            .collect();
        let mut bytes = Vec::new();
        for c in &cmds {
            bytes.extend(match c {
                Cmd::Get(k) => resp(&["GET", k]),
                Cmd::Set(k, v) => resp(&["SET", k, &v.to_string()]),
                Cmd::Del(k) => resp(&["DEL", k]),
            });
        }
        let sent = rec.invoke();
        let t0 = Instant::now();
        w.write_all(&bytes).unwrap();
        for c in &cmds {
            let reply = read_reply(&mut r);
            let (key, op, outcome) = match (c, &reply) {
                (Cmd::Get(k), Reply::Bulk(v)) => {
                    let v = v.as_ref().map(|v| v.parse::<u64>().unwrap());
                    if let Some(Some(want)) = own.get(k) {
                        if *want != v {
                            bad.push(format!("batch {b}: GET {k} answered {v:?}, not {want:?}"));
                        }
                    }
                    (k, Op::Get, Outcome::Ok(v))
                }
                (Cmd::Set(k, v), Reply::Ok) => {
                    note(&mut own, k, Some(Some(*v)));
                    (k, Op::Put(*v), Outcome::Ok(None))
                }
                (Cmd::Del(k), Reply::Int(n)) => {
                    note(&mut own, k, Some(None));
                    assert!(*n == 0 || *n == 1, "DEL {k} answered {n}");
                    (k, Op::Delete, Outcome::Ok(None))
                }
                (c, Reply::Err(e)) => {
                    // Retries exhausted while node 2 was paused: the write may have landed.
                    eprintln!("client {id} batch {b}: {c:?} answered -{e}");
                    let (k, op) = match c {
                        Cmd::Get(k) => (k, Op::Get),
                        Cmd::Set(k, v) => (k, Op::Put(*v)),
                        Cmd::Del(k) => (k, Op::Delete),
                    };
                    note(&mut own, k, None);
                    (k, op, Outcome::Failed)
                }
                (c, reply) => panic!("{c:?} answered {reply:?}"),
            };
            if let Some(shared) = key.strip_prefix('s') {
                rec.complete(sent, shared.parse().unwrap(), op, outcome);
            }
        }
        longest = longest.max(t0.elapsed());
    }
    rec.flush();
    eprintln!("client {id} (port {port}): longest batch {longest:?}");
    (bad, longest)
}

/// What happens to node 2 while the clients run.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Disrupt {
    /// SIGSTOP for [`PAUSE`], then SIGCONT: its operations wait, none is lost. Clients on
    /// every node.
    Pause,
    /// SIGKILL, then a restart [`PAUSE`] later (replicated: `--replicas 2`, etcd). Clients on
    /// nodes 0 and 1 only.
    KillRestart,
}

/// Run the clients against a fresh cluster started with `extra` node flags, disrupting node 2
/// once at [`PAUSE_AT`]; the mismatches of every client's own keys, and the history's report.
fn run(name: &str, extra: &[&str], disrupt: Disrupt) -> (Mismatches, nessie_check::Report) {
    let port = free_port_range(NODES);
    let port_s = port.to_string();
    let membership: &[&str] = match disrupt {
        Disrupt::Pause => &["--no-etcd"],
        Disrupt::KillRestart => &["--replicas", "2", "--lease-ttl", "2"],
    };
    let args = [
        membership,
        &[
            "--resp-port",
            &port_s,
            "--ites-per-node",
            "64",
            "--frontend-inflight",
            "8",
            INJECT_DELAY,
        ][..],
        extra,
    ]
    .concat();
    let c = Cluster::up(name, NODES, "shm", &args);
    let history = History::new();
    let pid: i32 = std::fs::read_to_string(c.dir.join("node-2.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let serving = match disrupt {
        Disrupt::Pause => NODES,
        Disrupt::KillRestart => NODES - 1,
    };
    let (bad, longest) = std::thread::scope(|s| {
        let clients: Vec<_> = (0..NODES * CLIENTS_PER_NODE)
            .map(|i| {
                let history = &history;
                let until = Instant::now() + RUN;
                s.spawn(move || client(i as u64, port + i % serving, history, until))
            })
            .collect();
        std::thread::sleep(PAUSE_AT);
        // Kept until the clients are done (the restarted node is stopped on drop).
        let mut restarted = None;
        match disrupt {
            Disrupt::Pause => {
                // SAFETY: signals to a node process this test started.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                std::thread::sleep(PAUSE);
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
            Disrupt::KillRestart => {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                std::thread::sleep(PAUSE);
                restarted = Some(common::restart(&c, 2));
            }
        }
        let mut bad = Vec::new();
        let mut longest = Duration::ZERO;
        for h in clients {
            let (b, l) = h.join().unwrap();
            bad.extend(b);
            longest = longest.max(l);
        }
        drop(restarted);
        (bad, longest)
    });
    // The stall it caused, as the clients saw it: their longest batch.
    eprintln!("{name}: longest batch {longest:?} (node 2: {disrupt:?}, {PAUSE:?})");
    let events = history.into_events();
    let report = nessie_check::check(&events, |_| None, &Limits::default());
    eprintln!(
        "{name}: {} events on the shared keys\n{report}",
        events.len()
    );
    if !bad.is_empty() || !report.is_ok() {
        c.dump_logs();
    }
    (bad, report)
}

#[test]
fn pipelined_gets_and_sets_keep_their_order_and_are_linearizable() {
    let (bad, report) = run("batches", &[], Disrupt::Pause);
    assert!(bad.is_empty(), "{} mismatches: {bad:#?}", bad.len());
    assert!(report.is_ok(), "not linearizable:\n{report}");
}

/// The same with two copies of every node's tables, node 2 killed and restarted while the
/// clients' batches run on nodes 0 and 1: no acknowledged write is lost, none reordered.
#[test]
fn the_same_across_a_node_killed_and_restarted() {
    let (bad, report) = run("batches-kill", &[], Disrupt::KillRestart);
    assert!(bad.is_empty(), "{} mismatches: {bad:#?}", bad.len());
    assert!(report.is_ok(), "not linearizable:\n{report}");
}

#[test]
fn mutation_unordered_batches_is_caught() {
    let (bad, _) = run(
        "batches-mutation",
        &["--node-arg=--mutation-unordered-batches"],
        Disrupt::Pause,
    );
    assert!(
        !bad.is_empty(),
        "same-key order broken in the nodes, unnoticed"
    );
    eprintln!("caught: {} mismatches, first {:?}", bad.len(), bad[0]);
}
