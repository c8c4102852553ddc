//! Read-modify-writes racing through the front ends of every node at once: INCR (Redis) and
//! incr (memcached) on one counter, and APPENDs to one string, from clients on all three
//! nodes, over the store's conditional writes, with a small index (keys in every candidate)
//! and delays injected into fabric operations to widen the races. The histories are checked:
//! the increments answered are exactly 1..=n and the counter ends at n; every APPEND answered
//! is in the string once, in its client's order, and no refused one is. A refusal (the key
//! contended past the retry limit) is allowed; a lost or doubled update is not.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{free_port_range, Cluster};

const NODES: u16 = 3;
/// Operations per client; each node has one client per protocol (the counter) or two (the
/// string).
const OPS: usize = 120;
/// Delays injected into node processes' fabric operations: SEED,PROBABILITY,MAX_NS.
const INJECT_DELAY: &str = "--node-arg=--inject-delay=5,0.05,30000";
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// A line-reply connection (every reply here is one line).
struct Conn(BufReader<TcpStream>);

impl Conn {
    fn connect(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
        Conn(BufReader::new(s))
    }

    fn call(&mut self, request: &[u8]) -> String {
        self.0.get_mut().write_all(request).unwrap();
        let mut line = String::new();
        self.0.read_line(&mut line).expect("a reply");
        assert!(line.ends_with("\r\n"), "cut reply {line:?}");
        line.truncate(line.len() - 2);
        line
    }

    fn resp(&mut self, args: &[&str]) -> String {
        let mut b = format!("*{}\r\n", args.len());
        for a in args {
            b.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.call(b.as_bytes())
    }

    /// A command answered with a bulk string: its text.
    fn resp_bulk(&mut self, args: &[&str]) -> String {
        let head = self.resp(args);
        let len: usize = head
            .strip_prefix('$')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{args:?} answered {head:?}"));
        let mut line = String::new();
        self.0.read_line(&mut line).expect("the bulk string");
        assert_eq!(line.len(), len + 2, "{args:?}: one line of {len} bytes");
        line.truncate(len);
        line
    }
}

/// Conditional writes that found the key changed since their read (each a read-modify-write
/// that lost a race and read again), summed over the nodes' `/metrics`.
fn unmet_conditional_writes(metrics: u16) -> u64 {
    let mut sum = 0;
    for k in 0..NODES {
        let mut s = TcpStream::connect(("127.0.0.1", metrics + k)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        std::io::Read::read_to_string(&mut s, &mut body).unwrap();
        sum += body
            .lines()
            .filter(|l| l.starts_with("nessie_operations_total{kind=\"put_if\",result=\"unmet\"}"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum::<u64>();
    }
    sum
}

/// A refusal after the retry limit (`rmw::contended_msg`): the update did not take place.
fn contended(reply: &str) -> bool {
    reply.contains("key contended")
}

/// The counter's history: each increment answered with its new value (`answered`), and the
/// value read at the end. Linearizable iff the answers are exactly 1..=n, once each, and the
/// counter ends at n.
fn check_counter(mut answered: Vec<u64>, last: u64) -> Result<(), String> {
    answered.sort_unstable();
    let n = answered.len() as u64;
    if let Some((i, v)) = (1..).zip(&answered).find(|(i, v)| i != *v) {
        return Err(format!(
            "increment answers are not 1..={n}: position {i} holds {v} (lost or doubled)"
        ));
    }
    match last == n {
        true => Ok(()),
        false => Err(format!("{n} increments answered, the counter reads {last}")),
    }
}

/// The string's history: the tokens each client appended in order, with whether each was
/// answered (applied) or refused, and the string read at the end (tokens end with `,`).
fn check_appends(clients: &[Vec<(String, bool)>], last: &str) -> Result<(), String> {
    let found: Vec<&str> = last.split_terminator(',').collect();
    let mut seen = std::collections::HashSet::new();
    for t in &found {
        if !seen.insert(*t) {
            return Err(format!("token {t} appended twice"));
        }
    }
    for ops in clients {
        let mut at = 0; // position in `found` of this client's previous token
        for (token, applied) in ops {
            let pos = found.iter().position(|t| t == token);
            match (pos, applied) {
                (None, true) => return Err(format!("answered APPEND {token} lost")),
                (Some(_), false) => return Err(format!("refused APPEND {token} applied")),
                (Some(p), true) if p < at => {
                    return Err(format!("{token} lies before its client's earlier append"))
                }
                (Some(p), true) => at = p,
                (None, false) => {}
            }
        }
    }
    let applied = clients.iter().flatten().filter(|(_, a)| *a).count();
    match applied == found.len() {
        true => Ok(()),
        false => Err(format!("{} tokens for {applied} appends", found.len())),
    }
}

#[test]
fn increments_and_appends_through_every_node_lose_nothing_and_double_nothing() {
    races("frontend-races", &[]);
}

/// The same with other nodes' memory reached through UCX rather than straight.
#[test]
fn the_same_through_ucx() {
    races("frontend-races-ucx", &["--no-direct-peers"]);
}

/// The same with each of the protocol's optimisations off in turn (each changes how the
/// versioned read of a read-modify-write finds the key).
#[test]
fn the_same_without_filter_bits() {
    races("frontend-races-nofilter", &["--no-filter-bits"]);
}

#[test]
fn the_same_without_the_cache() {
    races("frontend-races-nocache", &["--no-cache"]);
}

#[test]
fn the_same_without_previous_versions() {
    races("frontend-races-noprev", &["--no-previous-versions"]);
}

#[test]
fn the_same_without_multi_read() {
    races("frontend-races-nomulti", &["--no-multi-read"]);
}

fn races(name: &str, extra: &[&str]) {
    let (mc, resp, metrics) = (
        free_port_range(NODES),
        free_port_range(NODES),
        free_port_range(NODES),
    );
    let (mc_s, resp_s, metrics_s) = (mc.to_string(), resp.to_string(), metrics.to_string());
    let args = [
        &[
            "--no-etcd",
            "--memcached-port",
            &mc_s,
            "--resp-port",
            &resp_s,
            "--metrics-port",
            &metrics_s,
            "--ites-per-node",
            "64",
            "--workers",
            "2",
            INJECT_DELAY,
        ][..],
        extra,
    ]
    .concat();
    let _c = Cluster::up(name, NODES, "shm", &args);
    assert_eq!(Conn::connect(resp).resp(&["SET", "n", "0"]), "+OK");

    // The counter: a Redis and a memcached client on each node.
    let counters: Vec<std::thread::JoinHandle<Vec<u64>>> = (0..NODES)
        .flat_map(|k| [(resp + k, true), (mc + k, false)])
        .map(|(port, redis)| {
            std::thread::spawn(move || {
                let mut c = Conn::connect(port);
                let mut answered = Vec::new();
                for _ in 0..OPS {
                    let r = match redis {
                        true => c.resp(&["INCR", "n"]),
                        false => c.call(b"incr n 1\r\n"),
                    };
                    match r.strip_prefix(':').unwrap_or(&r).parse::<u64>() {
                        Ok(v) => answered.push(v),
                        Err(_) => assert!(contended(&r), "INCR answered {r:?}"),
                    }
                }
                answered
            })
        })
        .collect();
    let answered: Vec<u64> = counters
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let last = Conn::connect(resp + 2).resp_bulk(&["GET", "n"]);
    let last: u64 = last.parse().expect("the counter reads as a number");
    assert!(
        answered.len() > OPS,
        "most increments went through: {}",
        answered.len()
    );
    let lost = unmet_conditional_writes(metrics);
    eprintln!(
        "counter: {} of {} increments answered, {lost} conditional writes lost a race",
        answered.len(),
        OPS * 2 * NODES as usize
    );
    check_counter(answered, last).unwrap();
    assert!(lost > 0, "the clients raced");

    // The string: two Redis clients on each node.
    let appenders: Vec<std::thread::JoinHandle<Vec<(String, bool)>>> = (0..2 * NODES)
        .map(|i| {
            std::thread::spawn(move || {
                let mut c = Conn::connect(resp + i % NODES);
                (0..OPS)
                    .map(|op| {
                        let token = format!("c{i}o{op}");
                        let r = c.resp(&["APPEND", "s", &format!("{token},")]);
                        let applied = r.starts_with(':');
                        assert!(applied || contended(&r), "APPEND answered {r:?}");
                        (token, applied)
                    })
                    .collect()
            })
        })
        .collect();
    let clients: Vec<_> = appenders.into_iter().map(|t| t.join().unwrap()).collect();
    let last = Conn::connect(resp).resp_bulk(&["GET", "s"]);
    let applied = clients.iter().flatten().filter(|(_, a)| *a).count();
    eprintln!(
        "string: {applied} of {} appends answered",
        OPS * 2 * NODES as usize
    );
    check_appends(&clients, &last).unwrap();
}

/// The checks reject bad histories: a lost, a doubled, a misordered and a phantom update.
#[test]
fn the_checks_reject_lost_doubled_and_misordered_updates() {
    assert!(check_counter(vec![2, 1, 3], 3).is_ok());
    assert!(check_counter(vec![1, 3], 3).is_err(), "an increment lost");
    assert!(check_counter(vec![1, 2, 2], 3).is_err(), "one answer twice");
    assert!(
        check_counter(vec![1, 2, 3], 2).is_err(),
        "the counter behind"
    );
    let ops = |v: &[(&str, bool)]| -> Vec<(String, bool)> {
        v.iter().map(|(t, a)| (t.to_string(), *a)).collect()
    };
    let clients = [
        ops(&[("c0o0", true), ("c0o1", false), ("c0o2", true)]),
        ops(&[("c1o0", true)]),
    ];
    assert!(check_appends(&clients, "c1o0,c0o0,c0o2,").is_ok());
    assert!(check_appends(&clients, "c1o0,c0o0,").is_err(), "lost");
    assert!(
        check_appends(&clients, "c1o0,c0o0,c0o2,c0o2,").is_err(),
        "doubled"
    );
    assert!(
        check_appends(&clients, "c1o0,c0o2,c0o0,").is_err(),
        "misordered"
    );
    assert!(
        check_appends(&clients, "c1o0,c0o0,c0o1,c0o2,").is_err(),
        "refused but applied"
    );
}
