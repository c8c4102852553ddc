//! The memcached front end of node processes (`nessie up --memcached-port`), on loopback:
//! keys written through one node read back through another, with their flags; bad input gets
//! memcached's own error and the connection stays usable; and memcached's conformance suite
//! (`memccapable`, Debian `libmemcached-tools`) passes in full.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::{free_port_range, Cluster, Peer};

const NODES: u16 = 3;

/// memccapable's ascii tests: every one (the front end serves each command they use).
const SERVED: &[&str] = &[
    "ascii version",
    "ascii quit",
    "ascii verbosity",
    "ascii set",
    "ascii set noreply",
    "ascii get",
    "ascii gets",
    "ascii mget",
    "ascii flush",
    "ascii flush noreply",
    "ascii add",
    "ascii add noreply",
    "ascii replace",
    "ascii replace noreply",
    "ascii cas",
    "ascii cas noreply",
    "ascii delete",
    "ascii delete noreply",
    "ascii incr",
    "ascii incr noreply",
    "ascii decr",
    "ascii decr noreply",
    "ascii append",
    "ascii append noreply",
    "ascii prepend",
    "ascii prepend noreply",
    "ascii stat",
];

fn up(name: &str) -> (Cluster, u16) {
    let base = free_port_range(NODES);
    let c = Cluster::up(
        name,
        NODES,
        "shm",
        &["--no-etcd", "--memcached-port", &base.to_string()],
    );
    (c, base)
}

/// A cluster serving the Redis protocol: node K on the returned base + K.
fn up_resp(name: &str) -> (Cluster, u16) {
    let base = free_port_range(NODES);
    let c = Cluster::up(
        name,
        NODES,
        "shm",
        &["--no-etcd", "--resp-port", &base.to_string()],
    );
    (c, base)
}

/// `redis-cli -p PORT ARGS…`: its stdout, checked to have succeeded.
fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs (Debian redis-tools; scripts/setup.sh installs it)");
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A memcached text connection.
struct Mc {
    r: BufReader<TcpStream>,
}

impl Mc {
    fn connect(port: u16) -> Mc {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("the front end listens");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        Mc {
            r: BufReader::new(s),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.r.get_mut().write_all(bytes).unwrap();
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        l
    }

    /// `get KEYS`: each hit's key, flags and data.
    fn get(&mut self, keys: &str) -> Vec<(String, u32, Vec<u8>)> {
        self.send(format!("get {keys}\r\n").as_bytes());
        self.get_reply()
    }

    /// The reply to a `get` sent earlier.
    fn get_reply(&mut self) -> Vec<(String, u32, Vec<u8>)> {
        let mut hits = Vec::new();
        loop {
            let l = self.line();
            if l == "END\r\n" {
                return hits;
            }
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(w.first(), Some(&"VALUE"), "{l:?}");
            let len: usize = w[3].parse().unwrap();
            let mut data = vec![0u8; len + 2];
            self.r.read_exact(&mut data).unwrap();
            data.truncate(len);
            hits.push((w[1].to_string(), w[2].parse().unwrap(), data));
        }
    }
}

#[test]
fn keys_written_through_one_node_read_back_through_the_others() {
    let (_c, base) = up("mc-any-node");
    let mut a = Mc::connect(base);
    let mut b = Mc::connect(base + 1);
    // Pipelined: every request goes out before any reply is read.
    let mut batch = Vec::new();
    for i in 0..50 {
        batch.extend_from_slice(
            format!("set key{i} {i} 0 {}\r\nvalue-{i}\r\n", 6 + digits(i)).as_bytes(),
        );
    }
    a.send(&batch);
    for _ in 0..50 {
        assert_eq!(a.line(), "STORED\r\n");
    }
    let keys: Vec<String> = (0..50).map(|i| format!("key{i}")).collect();
    let hits = b.get(&keys.join(" "));
    assert_eq!(hits.len(), 50);
    for (i, (k, flags, data)) in hits.into_iter().enumerate() {
        assert_eq!((k, flags), (format!("key{i}"), i as u32));
        assert_eq!(data, format!("value-{i}").into_bytes());
    }
    let mut c = Mc::connect(base + 2);
    c.send(b"delete key7\r\ndelete key7\r\n");
    assert_eq!(
        (c.line(), c.line()),
        ("DELETED\r\n".into(), "NOT_FOUND\r\n".into())
    );
    assert!(a.get("key7").is_empty(), "deleted through another node");
    // A value that expired on arrival is absent everywhere.
    a.send(b"set gone 0 -1 1\r\nx\r\n");
    assert_eq!(a.line(), "STORED\r\n");
    assert!(b.get("gone").is_empty());
}

fn digits(i: u32) -> usize {
    i.to_string().len()
}

#[test]
fn oversize_keys_and_values_get_memcacheds_errors_and_the_connection_stays_usable() {
    let (c, base) = up("mc-limits");
    let cfg =
        nessie_cluster::config::ClusterConfig::load(&nessie_cluster::process::config_path(&c.dir))
            .unwrap();
    // An item of item_max bytes less memcached's item header (16 B) is the longest taken.
    let item_max = cfg.item_max() as usize;
    assert_eq!(item_max, 1 << 20, "memcached's default item limit");
    let key_max = cfg.geometry.key_max as usize;
    let mut m = Mc::connect(base);
    let big = vec![b'v'; item_max];
    m.send(format!("set big 0 0 {}\r\n", big.len()).as_bytes());
    m.send(&big);
    m.send(b"\r\n");
    assert_eq!(m.line(), "SERVER_ERROR object too large for cache\r\n");
    if key_max < 250 {
        let long = "k".repeat(key_max + 1);
        m.send(format!("set {long} 0 0 1\r\nx\r\n").as_bytes());
        assert_eq!(m.line(), "CLIENT_ERROR bad command line format\r\n");
    }
    m.send(b"set ok 0 0 2\r\nhi\r\nbogus\r\nadd ok 0 0 1\r\nx\r\n");
    assert_eq!(m.line(), "STORED\r\n");
    assert_eq!(m.line(), "ERROR\r\n");
    assert_eq!(m.line(), "NOT_STORED\r\n", "add of a present key");
    assert_eq!(m.get("ok"), vec![("ok".to_string(), 0, b"hi".to_vec())]);
}

/// Every reply to `input` on a fresh connection to `port`, until the `version` appended to it
/// is answered.
fn replies_until_version(port: u16, input: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(input).unwrap();
    s.write_all(b"version\r\n").unwrap();
    let mut r = BufReader::new(s);
    let mut out = String::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).expect("a reply line");
        if line.starts_with("VERSION ") {
            return out;
        }
        out.push_str(&line);
    }
}

/// Under `noreply` a classic command's errors are not answered, as memcached 1.6 answers
/// none (its client reads nothing back, so an answer would be taken for the next command's:
/// pymemcache sets with `noreply` by default). Each case goes to a real `memcached` and to the
/// front end, which must answer alike: values too large, bad data chunks, malformed numbers,
/// overlong keys, and a failed store; without `noreply` the same errors are answered.
#[test]
fn errors_under_noreply_are_answered_as_memcached_answers_them() {
    let (c, base) = up("mc-noreply");
    let cfg =
        nessie_cluster::config::ClusterConfig::load(&nessie_cluster::process::config_path(&c.dir))
            .unwrap();
    let (_mc, port) = Peer::memcached();
    // Over both servers' value limits (memcached's is 1 MiB).
    let big = vec![b'x'; (1 << 20).max(cfg.geometry.value_max as usize) + 1000];
    let too_large = |noreply: &str| {
        let mut v = format!("set big 0 0 {}{noreply}\r\n", big.len()).into_bytes();
        v.extend_from_slice(&big);
        v.extend_from_slice(b"\r\n");
        v
    };
    let long_key = "k".repeat(251);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("too large", too_large(" noreply")),
        ("too large, answered", too_large("")),
        (
            "bad data chunk",
            b"set k 0 0 3 noreply\r\nabcde\r\n".to_vec(),
        ),
        (
            "bad data chunk, answered",
            b"set k 0 0 3\r\nabcde\r\n".to_vec(),
        ),
        ("bad length", b"set k 0 0 xx noreply\r\n".to_vec()),
        ("bad length, answered", b"set k 0 0 xx\r\n".to_vec()),
        ("negative length", b"set k 0 0 -1 noreply\r\n".to_vec()),
        ("bad flags", b"set k abc 0 1 noreply\r\nx\r\n".to_vec()),
        ("bad exptime", b"touch k abc noreply\r\n".to_vec()),
        (
            "bad delta",
            b"set n 0 0 1\r\n1\r\nincr n abc noreply\r\n".to_vec(),
        ),
        (
            "non-numeric incr",
            b"set q 0 0 1\r\nx\r\nincr q 1 noreply\r\n".to_vec(),
        ),
        (
            "long key",
            format!("set {long_key} 0 0 1 noreply\r\nx\r\n").into_bytes(),
        ),
        (
            "long key, answered",
            format!("set {long_key} 0 0 1\r\nx\r\n").into_bytes(),
        ),
        ("unknown command", b"bogus noreply\r\n".to_vec()),
        ("incr short", b"incr k noreply\r\n".to_vec()),
        ("touch short", b"touch k noreply\r\n".to_vec()),
        ("set short", b"set k 0 0 noreply\r\n".to_vec()),
        ("cas short", b"cas k 0 0 1 noreply\r\n".to_vec()),
        ("incr shorter", b"incr noreply\r\n".to_vec()),
        ("set shorter", b"set k 0 noreply\r\n".to_vec()),
        (
            "misses",
            b"delete zz noreply\r\nincr zz 1 noreply\r\ntouch zz 1 noreply\r\n".to_vec(),
        ),
    ];
    let mut differ = Vec::new();
    for (name, input) in &cases {
        let theirs = replies_until_version(port, input);
        let ours = replies_until_version(base, input);
        if ours != theirs {
            differ.push(format!("{name}: memcached {theirs:?}, Nessie {ours:?}"));
        }
    }
    assert!(
        differ.is_empty(),
        "answered unlike memcached:\n{}",
        differ.join("\n")
    );
    // A store that fails is silent too, and the next command's reply is its own: an item
    // longer than one entry whose key (within memcached's limit and the cluster's) is too
    // long to name its chunks (`docs/large-values.md`).
    let key_max = cfg.geometry.key_max as usize;
    let room = key_max - nessie_protocols::large::CHUNK_KEY_OVERHEAD;
    let key = "m".repeat(room + 1);
    let mid = vec![b'y'; cfg.geometry.value_max as usize + 1];
    let mut input = format!("set {key} 0 0 {} noreply\r\n", mid.len()).into_bytes();
    input.extend_from_slice(&mid);
    input.extend_from_slice(format!("\r\nget {key}\r\n").as_bytes());
    assert_eq!(replies_until_version(base, &input), "END\r\n");
    let mut answered = format!("set {key} 0 0 {}\r\n", mid.len()).into_bytes();
    answered.extend_from_slice(&mid);
    answered.extend_from_slice(b"\r\n");
    let reply = replies_until_version(base, &answered);
    assert!(
        reply.starts_with("SERVER_ERROR") && reply.contains("too long"),
        "{reply}"
    );
}

/// Every reply to `cmds` (after a FLUSHALL) on a fresh RESP connection to `port`, up to the
/// answer to a final PING.
fn resp_replies(port: u16, cmds: &[&[&str]]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut input = Vec::new();
    for c in [&["FLUSHALL"][..]]
        .iter()
        .chain(cmds)
        .chain([&["PING"][..]].iter())
    {
        input.extend_from_slice(format!("*{}\r\n", c.len()).as_bytes());
        for a in *c {
            input.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
    }
    s.write_all(&input).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while !out.ends_with(b"+PONG\r\n") {
        let n = s.read(&mut buf).expect("replies");
        assert!(
            n > 0,
            "connection closed after {:?}",
            String::from_utf8_lossy(&out)
        );
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The Redis front end answers as a real `redis-server` does, byte for byte, over commands
/// and their errors: arity, options and their conflicts, numbers that do not parse or
/// overflow, expiry edge cases, multi-key commands, connection commands, unknown commands and
/// subcommands (named as typed), and client names.
#[test]
fn the_redis_front_end_answers_as_redis_server() {
    let (_c, base) = up_resp("resp-vs-redis");
    let (_rs, port) = Peer::redis_server();
    let cases: &[&[&[&str]]] = &[
        &[&["GET"]],
        &[&["GET", "a", "b"]],
        &[&["SET", "a"]],
        &[&["SET", "a", "1", "FOO"]],
        &[&["SET", "a", "1", "EX", "0"]],
        &[&["SET", "a", "1", "EX", "-5"]],
        &[&["SET", "a", "1", "EX", "x"]],
        &[&["SET", "a", "1", "EX", "99999999999999999"]],
        &[&["SET", "a", "1", "NX", "XX"]],
        &[&["SET", "a", "1", "EX", "10", "PX", "100"]],
        &[&["SET", "a", "1", "KEEPTTL", "EX", "10"]],
        &[&["SET", "a", "1", "GET"]],
        &[&["SET", "a", "0"], &["SET", "a", "1", "GET"], &["GET", "a"]],
        &[&["SET", "a", "0"], &["SET", "a", "1", "NX", "GET"]],
        &[&["SET", "a", "x"], &["INCR", "a"]],
        &[&["SET", "a", "9223372036854775807"], &["INCR", "a"]],
        &[&["INCRBY", "a", "x"]],
        &[&["DECRBY", "a", "-9223372036854775808"]],
        &[&["SET", "a", " 1"], &["INCR", "a"]],
        &[
            &["INCR", "a"],
            &["INCRBY", "a", "41"],
            &["DECR", "a"],
            &["DECRBY", "a", "2"],
        ],
        &[
            &["APPEND", "a", "xy"],
            &["APPEND", "a", "z"],
            &["GET", "a"],
            &["STRLEN", "a"],
        ],
        &[&["STRLEN", "a"]],
        &[
            &["INFO", "keyspace"],
            &["SET", "a", "1"],
            &["SET", "b", "2"],
            &["INFO", "KEYSPACE"],
        ],
        &[&["INFO", "nosuchsection"]],
        &[
            &["AUTH", "default", "any"],
            &["AUTH", "any"],
            &["AUTH", "nobody", "any"],
        ],
        &[&["MGET", "", "a"], &["EXISTS", "", "a"], &["DEL", ""]],
        &[&["EXPIRE", "a", "10"]],
        &[&["SET", "a", "1"], &["EXPIRE", "a", "x"]],
        &[&["SET", "a", "1"], &["EXPIRE", "a", "-1"], &["EXISTS", "a"]],
        &[
            &["SET", "a", "1"],
            &["EXPIRE", "a", "10", "NX"],
            &["EXPIRE", "a", "20", "NX"],
        ],
        &[&["SET", "a", "1"], &["EXPIRE", "a", "10", "GT", "LT"]],
        &[
            &["SET", "a", "1"],
            &["TTL", "a"],
            &["PTTL", "a"],
            &["TTL", "b"],
        ],
        &[
            &["SET", "a", "1", "EX", "100"],
            &["PERSIST", "a"],
            &["PERSIST", "a"],
            &["TTL", "a"],
        ],
        &[
            &["SET", "a", "1"],
            &["EXPIREAT", "a", "1"],
            &["EXISTS", "a"],
        ],
        &[&["MSET", "a", "1", "b"]],
        &[&["MSET", "a", "1", "b", "2"], &["MGET", "a", "x", "b"]],
        &[
            &["MSET", "a", "1", "b", "2"],
            &["DEL", "a", "b", "c"],
            &["DBSIZE"],
        ],
        &[&["SET", "a", "1"], &["EXISTS", "a", "a", "b"]],
        &[&["SET", "a", "1"], &["GETDEL", "a"], &["GETDEL", "a"]],
        &[
            &["SET", "a", "1", "EX", "100"],
            &["GETEX", "a", "PERSIST"],
            &["TTL", "a"],
        ],
        &[&["SET", "a", "1"], &["GETEX", "a", "EX"]],
        &[&["SETEX", "a", "0", "v"]],
        &[&["SETNX", "a", "1"], &["SETNX", "a", "2"], &["GET", "a"]],
        &[&["GETSET", "a", "1"], &["GETSET", "a", "2"]],
        &[&["FOO", "bar"]],
        &[&["set", "a", "1"], &["get", "a"]],
        &[&["SELECT", "0"], &["SELECT", "x"], &["SELECT", "99"]],
        &[
            &["PING", "hello"],
            &["PING", "a", "b"],
            &["ECHO"],
            &["ECHO", "e"],
        ],
        &[
            &["CLIENT", "GETNAME"],
            &["CLIENT", "SETNAME", "a b"],
            &["CLIENT", "SETNAME", "n1"],
        ],
        &[&["CLIENT", "GETNAME"], &["CLIENT", "Foo"]],
    ];
    let mut differ = Vec::new();
    for cmds in cases {
        let theirs = resp_replies(port, cmds);
        let ours = resp_replies(base, cmds);
        if ours != theirs {
            differ.push(format!(
                "{cmds:?}:\n  redis-server {theirs:?}\n  Nessie       {ours:?}"
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "answered unlike redis-server:\n{}",
        differ.join("\n")
    );
}

/// The value of `STAT name` in a memcached `stats` reply.
fn stat(mc: &mut Mc, name: &str) -> Option<u64> {
    mc.send(b"stats\r\n");
    let mut found = None;
    loop {
        let l = mc.line();
        if l == "END\r\n" || l.is_empty() {
            return found;
        }
        if let Some(v) = l.strip_prefix(&format!("STAT {name} ")) {
            found = v.trim().parse().ok();
        }
    }
}

/// Expired items give their memory back (issue 41): each node's reclaimer deletes the
/// expired items of its share of the index in the background, with the protocol's DELETE
/// conditional on the version it read expired; live items stay. `stats` counts them as
/// `reclaimed`, those never read as `expired_unfetched` (under LRU, which keeps access words),
/// and `curr_items` and `nessie status` show the index emptied of them.
#[test]
fn expired_items_are_reclaimed_in_the_background() {
    let base = free_port_range(2);
    let c = Cluster::up(
        "expire-reclaim",
        2,
        "shm",
        &[
            "--no-etcd",
            "--eviction",
            "allkeys-lru",
            "--memcached-port",
            &base.to_string(),
        ],
    );
    let mut mc = Mc::connect(base);
    const EXPIRING: u32 = 300;
    const LIVE: u32 = 20;
    for i in 0..EXPIRING + LIVE {
        let exptime = if i < EXPIRING { 1 } else { 0 };
        mc.send(format!("set k{i} 0 {exptime} 100\r\n{}\r\n", "v".repeat(100)).as_bytes());
        assert_eq!(mc.line(), "STORED\r\n", "set k{i}");
    }
    const READ: u32 = 100;
    for i in 0..READ {
        assert_eq!(mc.get(&format!("k{i}")).len(), 1, "k{i} before its expiry");
    }
    // Node 0's reclaimer deletes the expired items of node 0's share; node 1's of its own:
    // together, all of them.
    let mut mc1 = Mc::connect(base + 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let both = stat(&mut mc, "reclaimed").unwrap() + stat(&mut mc1, "reclaimed").unwrap();
        if both == u64::from(EXPIRING) {
            break;
        }
        assert!(
            both < u64::from(EXPIRING),
            "{both} reclaimed of {EXPIRING} expiring"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "30 s on, {both} of {EXPIRING} expired items reclaimed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in EXPIRING..EXPIRING + LIVE {
        assert_eq!(mc.get(&format!("k{i}")).len(), 1, "live k{i} is kept");
    }
    let both = |m0: &mut Mc, m1: &mut Mc, name| stat(m0, name).unwrap() + stat(m1, name).unwrap();
    assert_eq!(
        both(&mut mc, &mut mc1, "expired_unfetched"),
        u64::from(EXPIRING - READ)
    );
    assert_eq!(both(&mut mc, &mut mc1, "curr_items"), u64::from(LIVE));
    let status = c.nessie(&["status", "--json"]);
    let s: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let used: u64 = s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["index"]["present"].as_u64().unwrap())
        .sum();
    assert_eq!(
        used,
        u64::from(LIVE),
        "only the live items hold index entries: {s}"
    );
}

/// A 2-node cluster over shared memory that evicts under `policy`, with `memory` per node and
/// the memcached and RESP front ends at `mcp` and `resp` (and `extra` flags). Its expiry period
/// is short: evicted entries come back an expiry period after their DELETE, and a short one
/// keeps writers at full from waiting long (docs/frontends.md).
fn evicting_cluster(
    name: &str,
    memory: &str,
    policy: &str,
    mcp: u16,
    resp: u16,
    extra: &[&str],
) -> Cluster {
    let (mc, rs) = (mcp.to_string(), resp.to_string());
    let mut args = vec![
        "--no-etcd",
        "--memory-per-node",
        memory,
        "--eviction",
        policy,
    ];
    args.extend([
        "--expiry-ms",
        "50",
        "--memcached-port",
        &mc,
        "--resp-port",
        &rs,
    ]);
    args.extend_from_slice(extra);
    Cluster::up(name, 2, "shm", &args)
}

/// With `--eviction allkeys-random`, a store written to three times what it holds takes
/// every write, and the evictions show in memcached `stats`, Redis `INFO`, `CONFIG GET
/// maxmemory-policy` and Prometheus; recent keys read back whole or not at all.
#[test]
fn a_full_store_evicts_with_allkeys_random() {
    let base = free_port_range(6);
    let (mcp, resp, metrics) = (base, base + 2, base + 4);
    let metrics_port = metrics.to_string();
    let extra = ["--value-max", "4KiB", "--metrics-port", &metrics_port];
    let c = evicting_cluster("evict", "2MiB", "allkeys-random", mcp, resp, &extra);
    let mut mc = Mc::connect(mcp);
    const SIZE: usize = 2000;
    // 2 × 2 MiB hold about 2,000 items of 2000 B: write three times that.
    const WRITES: u32 = 6_000;
    for i in 0..WRITES {
        mc.send(format!("set k{i} 0 0 {SIZE}\r\n{}\r\n", "v".repeat(SIZE)).as_bytes());
        assert_eq!(mc.line(), "STORED\r\n", "set k{i}");
    }
    let evicted = stat(&mut mc, "evictions").unwrap();
    assert!(evicted > 0, "nothing evicted");
    let mut present = 0;
    for i in WRITES - 200..WRITES {
        let got = mc.get(&format!("k{i}"));
        if let Some(v) = got.first() {
            assert_eq!(v.2.len(), SIZE, "k{i} read back whole");
            present += 1;
        }
    }
    assert!(present > 0, "none of the last 200 keys is held");
    let info = redis_cli(resp, &["INFO", "memory", "stats"]);
    assert!(info.contains("maxmemory_policy:allkeys-random"), "{info}");
    assert!(
        info.contains(&format!("evicted_keys:{evicted}")),
        "node 0's count: {info}"
    );
    let policy = redis_cli(resp, &["CONFIG", "GET", "maxmemory-policy"]);
    assert_eq!(policy, "maxmemory-policy\nallkeys-random\n");
    let (_, body) = http_get(metrics, "/metrics");
    assert_eq!(
        sample(&body, "nessie_evictions_total"),
        Some(evicted as f64),
        "{body}"
    );
    assert!(
        body.contains("nessie_eviction_policy{policy=\"allkeys-random\"} 1"),
        "{body}"
    );
    assert!(
        sample(&body, "nessie_expired_reclaimed_total").is_some(),
        "{body}"
    );
    // Prometheus gives the figures memcached `stats` gives. No writes now, but the node's
    // reclaimer may still return released entries: `bytes` only falls.
    let before = stat(&mut mc, "bytes").unwrap();
    let (_, body) = http_get(metrics, "/metrics");
    let after = stat(&mut mc, "bytes").unwrap();
    let bytes = sample(&body, "nessie_data_entry_bytes").expect("entry bytes");
    assert!(
        (after as f64..=before as f64).contains(&bytes),
        "{after} <= {bytes} <= {before}"
    );
    let limit = stat(&mut mc, "limit_maxbytes").map(|n| n as f64);
    assert_eq!(sample(&body, "nessie_data_bytes_limit"), limit, "{body}");
    let claimed = sample(&body, "nessie_data_bytes_claimed").expect("claimed bytes");
    assert!(claimed > 0.0, "{body}");
    drop(c);
}

/// With `--eviction volatile-ttl`, only items with an expiry are evicted: keys written
/// without one survive a store written to three times what it holds with expiring items,
/// every write is taken, and `CONFIG GET maxmemory-policy` names the policy.
#[test]
fn volatile_ttl_evicts_only_items_with_an_expiry() {
    let base = free_port_range(4);
    let (mcp, resp) = (base, base + 2);
    let extra = ["--value-max", "4KiB"];
    let c = evicting_cluster("volatile", "2MiB", "volatile-ttl", mcp, resp, &extra);
    let mut mc = Mc::connect(mcp);
    const SIZE: usize = 2000;
    const KEPT: u32 = 100;
    let value = "v".repeat(SIZE);
    for i in 0..KEPT {
        mc.send(format!("set p{i} 0 0 {SIZE}\r\n{value}\r\n").as_bytes());
        assert_eq!(mc.line(), "STORED\r\n", "set p{i}");
    }
    // Later keys expire later: volatile-ttl takes the soonest of its samples.
    for i in 0..6_000u32 {
        let ttl = 3_600 + i;
        mc.send(format!("set t{i} 0 {ttl} {SIZE}\r\n{value}\r\n").as_bytes());
        assert_eq!(mc.line(), "STORED\r\n", "set t{i}");
    }
    assert!(stat(&mut mc, "evictions").unwrap() > 0, "nothing evicted");
    for i in 0..KEPT {
        let got = mc.get(&format!("p{i}"));
        assert_eq!(got.len(), 1, "p{i}, without an expiry, was evicted");
        assert_eq!(got[0].2.len(), SIZE);
    }
    let policy = redis_cli(resp, &["CONFIG", "GET", "maxmemory-policy"]);
    assert_eq!(policy, "maxmemory-policy\nvolatile-ttl\n");
    // The counters of a full store: every item has its index entry on one node and its
    // entry held by one writer, so the nodes' curr_items add up to the keys a scan finds and
    // their bytes to at least those items' (all written through node 0 here).
    let (mut items, mut bytes_sum) = (0, 0);
    for node in 0..2 {
        let mut m = Mc::connect(mcp + node);
        items += stat(&mut m, "curr_items").unwrap();
        let (bytes, limit) = (stat(&mut m, "bytes"), stat(&mut m, "limit_maxbytes"));
        let (bytes, limit) = (bytes.unwrap(), limit.unwrap());
        assert!(
            limit > 1 << 20 && limit <= 2 << 20,
            "node {node}: limit_maxbytes {limit} of --memory-per-node 2MiB"
        );
        bytes_sum += bytes;
        assert_eq!(
            stat(&mut m, "expired_unfetched"),
            None,
            "volatile-ttl keeps no access words"
        );
    }
    let dbsize = redis_cli(resp, &["DBSIZE"]);
    assert_eq!(
        dbsize.trim(),
        items.to_string(),
        "DBSIZE against the nodes' curr_items"
    );
    assert!(
        bytes_sum >= items * SIZE as u64,
        "bytes {bytes_sum} for {items} items"
    );
    let info = redis_cli(resp, &["INFO", "memory"]);
    let field = |name: &str| -> u64 {
        let line = info.lines().find(|l| l.starts_with(&format!("{name}:")));
        line.and_then(|l| l.split(':').nth(1)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in {info}"))
    };
    let (used, max) = (field("used_memory"), field("maxmemory"));
    assert!(
        used <= max && used * 10 >= max * 9,
        "a full node: used_memory {used} of {max}"
    );
    drop(c);
}

/// The real tools with a key space ten times the memory and eviction on (issue 41): memcslap
/// sets 40,000 random keys of values up to 5 KB (about 100 MB) and redis-benchmark 40,000
/// random keys (`-r`) of 2,000 B (80 MB) into 2 × 4 MiB, with `--eviction allkeys-lru`: every
/// `set` is taken, none answers an error, and the store holds items at the end.
#[test]
fn memcslap_and_redis_benchmark_at_ten_times_the_memory_with_eviction() {
    let base = free_port_range(4);
    let (mcp, resp) = (base, base + 2);
    let c = evicting_cluster("tenfold", "4MiB", "allkeys-lru", mcp, resp, &[]);
    let out = Command::new("memcslap")
        .args(["-s", &format!("127.0.0.1:{mcp}"), "-t", "set", "-c", "2"])
        .args(["-e", "20000"])
        .output()
        .expect("memcslap runs (Debian libmemcached-tools)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // memcslap stops a thread at its first failed set, so the count says it all.
    let set = text
        .lines()
        .find(|l| l.starts_with("Time to set"))
        .and_then(|l| l.split_whitespace().nth(3));
    assert!(
        set == Some("40000") && !text.contains("rror"),
        "memcslap: {text}"
    );
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &resp.to_string()])
        .args([
            "-t", "set", "-n", "40000", "-r", "40000", "-d", "2000", "-c", "4",
        ])
        .arg("-q")
        .output()
        .expect("redis-benchmark runs (Debian redis-tools)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    // redis-benchmark stops at the first error reply (an OOM refusal among them) and fails.
    assert!(
        out.status.success() && text.contains("SET: ") && !text.contains("rror"),
        "redis-benchmark: {text}"
    );
    let mut mc = Mc::connect(mcp);
    let evicted = stat(&mut mc, "evictions").unwrap();
    assert!(
        evicted > 40_000,
        "{evicted} evictions for 80,000 writes of 2 × 4 MiB"
    );
    let items = stat(&mut mc, "curr_items").unwrap()
        + stat(&mut Mc::connect(mcp + 1), "curr_items").unwrap();
    assert!(items > 500, "{items} items held at the end");
    drop(c);
}

/// A cache whose value size changes (`docs/frontends.md`, "Moving pages between size
/// classes"): redis-benchmark fills 2 × 4 MiB with 300-byte values, then writes 2,000-byte ones.
/// Every SET of both is taken (redis-benchmark stops at its first error: before the page
/// mover, the first 2,000-byte SET was refused), and memcached `stats` counts the pages moved.
#[test]
fn a_new_value_size_takes_the_memory_of_an_old_one() {
    let base = free_port_range(4);
    let (mcp, resp) = (base, base + 2);
    let c = evicting_cluster("size-shift", "4MiB", "allkeys-lru", mcp, resp, &[]);
    for (size, n) in [("300", "40000"), ("2000", "20000")] {
        let out = Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &resp.to_string()])
            .args(["-t", "set", "-n", n, "-r", "40000", "-d", size, "-c", "4"])
            .arg("-q")
            .output()
            .expect("redis-benchmark runs (Debian redis-tools)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("SET: ") && !text.contains("rror"),
            "redis-benchmark -d {size}: {text}"
        );
    }
    let moved = stat(&mut Mc::connect(mcp), "slabs_moved").unwrap()
        + stat(&mut Mc::connect(mcp + 1), "slabs_moved").unwrap();
    assert!(moved > 0, "no page moved to the 2,000-byte class");
    drop(c);
}

/// The whole ascii suite runs (`-T` alone is not reliable: some tests depend on what earlier
/// ones learnt of the server, and real memcached fails `-T "ascii quit"` alone too); every
/// test of a served command must pass. memccapable prints `NAME` padded to 40 columns, then
/// `[pass]` on stdout; a failure goes to stderr.
#[test]
fn memccapable_passes_in_full() {
    let (_c, base) = up("mc-capable");
    let out = Command::new("memccapable")
        .args(["-h", "127.0.0.1", "-p", &base.to_string(), "-a", "-t", "10"])
        .output()
        .expect("memccapable runs (Debian libmemcached-tools; scripts/setup.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Every test it ran passed, including any a newer memccapable adds.
    let failures = String::from_utf8_lossy(&out.stderr).contains("[FAIL]");
    assert!(
        out.status.success() && !stdout.contains("[FAIL]") && !failures,
        "memccapable -a failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let failed: Vec<&&str> = SERVED
        .iter()
        .filter(|t| !stdout.contains(&format!("{t:<40}[pass]")))
        .collect();
    assert!(
        failed.is_empty(),
        "memccapable -a: {failed:?} did not pass\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// pymemcache (Debian python3-pymemcache, the Python client most used) against the cluster:
/// values round-trip through different nodes, a multi-get, expiry, and a refused `add` sent
/// with noreply does not desynchronise the connection.
#[test]
fn pymemcache_works_against_the_cluster() {
    let (_c, base) = up("mc-pymemcache");
    let script = format!(
        r#"
import time
from pymemcache.client.base import Client
# Replies waited for: noreply writes (pymemcache's default) are not ordered before another
# connection's reads.
a = Client(("127.0.0.1", {base}), default_noreply=False)
b = Client(("127.0.0.1", {base} + 1), default_noreply=False)
a.set("k", b"v" * 1000)
assert b.get("k") == b"v" * 1000
a.set_many({{"x": "1", "y": "2"}})
assert b.get_many(["x", "y", "z"]) == {{"x": b"1", "y": b"2"}}
assert b.delete("x") and b.get("x") is None
a.set("t", "soon", expire=1)
assert b.get("t") == b"soon"
time.sleep(2.1)
assert b.get("t") is None, "expired"
a.add("y", "3", noreply=True)
assert a.get("y") == b"2", "the refused add left the connection in step"
value, cas = b.gets("y")
assert value == b"2" and a.cas("y", "4", cas) and not b.cas("y", "5", cas)
assert a.incr("y", 10) == 14 and b.decr("y", 20) == 0
assert a.append("y", "1") and a.prepend("y", "9") and b.get("y") == b"901"
assert b.touch("y", 100) and a.replace("y", "r") and not a.replace("nope", "r")
assert a.flush_all() and b.get("y") is None
print("pymemcache ok")
"#
    );
    run_python(
        &script,
        "pymemcache ok",
        "pymemcache (Debian python3-pymemcache)",
    );
}

/// redis-cli against three nodes: a key written through one reads back through the others,
/// with its expiry; errors are Redis's own words.
#[test]
fn redis_cli_reaches_every_node() {
    let (_c, base) = up_resp("resp-cli");
    assert_eq!(
        redis_cli(base, &["SET", "greeting", "hello", "EX", "100"]),
        "OK\n"
    );
    assert_eq!(redis_cli(base + 1, &["GET", "greeting"]), "hello\n");
    assert_eq!(redis_cli(base + 2, &["TTL", "greeting"]), "100\n");
    assert_eq!(redis_cli(base + 2, &["MSET", "a", "1", "b", "2"]), "OK\n");
    assert_eq!(redis_cli(base, &["MGET", "a", "b", "c"]), "1\n2\n\n");
    assert_eq!(redis_cli(base + 1, &["DEL", "a", "c"]), "1\n");
    assert_eq!(redis_cli(base, &["EXISTS", "a", "b"]), "1\n");
    // redis-cli prints an error and an empty line.
    assert_eq!(
        redis_cli(base, &["FOO", "x"]).trim_end(),
        "ERR unknown command 'FOO', with args beginning with: 'x'"
    );
    assert_eq!(
        redis_cli(base, &["GET"]).trim_end(),
        "ERR wrong number of arguments for 'get' command"
    );
    assert_eq!(redis_cli(base, &["PING"]), "PONG\n");
}

/// redis-benchmark's SET and GET, plain and pipelined (`-P 16`), against node 0: every
/// request answered without an error.
#[test]
fn redis_benchmark_runs_set_and_get() {
    let (_c, base) = up_resp("resp-bench");
    for pipeline in ["1", "16"] {
        let out = Command::new("redis-benchmark")
            .args(["-h", "127.0.0.1", "-p", &base.to_string()])
            .args(["-t", "set,get", "-n", "4000", "-c", "4", "-d", "100", "-q"])
            .args(["-P", pipeline])
            .output()
            .expect("redis-benchmark runs (Debian redis-tools)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "redis-benchmark -P {pipeline}: {text}"
        );
        for t in ["SET: ", "GET: "] {
            assert!(
                text.contains(t),
                "redis-benchmark -P {pipeline}: no {t}in {text}"
            );
        }
        assert!(
            !text.contains("ERR"),
            "redis-benchmark -P {pipeline}: {text}"
        );
    }
    // Its keys are in the store: `key:__rand_int__` with -r absent is `key:__rand_int__`.
    assert_eq!(
        redis_cli(base + 1, &["STRLEN", "key:__rand_int__"]),
        "100\n"
    );
}

/// Large items through both front ends (issue 41): memcached's default item limit (1 MiB)
/// with default flags, items of many chunks through RESP with a larger --item-max, read back
/// byte-identical through other nodes; read-modify-writes, expiry and deletes of large items;
/// and what is left of the chunks afterwards.
#[test]
fn large_items_round_trip_through_both_front_ends() {
    let base = free_port_range(NODES);
    let resp = base + 100;
    let c = Cluster::up(
        "large",
        NODES,
        "shm",
        &[
            "--no-etcd",
            "--memory-per-node",
            "64M",
            "--item-max",
            "24M",
            "--memcached-port",
            &base.to_string(),
            "--resp-port",
            &resp.to_string(),
        ],
    );
    let script = format!(
        r#"
import os, time, hashlib, redis
from pymemcache.client.base import Client
mc = [Client(("127.0.0.1", {base} + i), default_noreply=False) for i in range(3)]
v = os.urandom(1_000_000)
assert mc[0].set("mc-big", v)
assert mc[1].get("mc-big") == v and mc[2].get("mc-big") == v
# Lengths around the chunk size (16383 B of item per chunk, less memcached's 16 B header).
for n in (16383 - 17, 16383 - 16, 16383 - 15, 2 * 16383 - 16, 2 * 16383 - 15):
    w = os.urandom(n)
    assert mc[0].set(f"edge{{n}}", w) and mc[2].get(f"edge{{n}}") == w, n
r = [redis.Redis(host="127.0.0.1", port={resp} + i) for i in range(3)]
h = os.urandom(20 << 20)
assert r[0].set("huge", h)
got = r[1].get("huge")
assert hashlib.sha256(got).digest() == hashlib.sha256(h).digest(), "20 MiB read back whole"
assert r[2].strlen("huge") == 20 << 20
assert r[0].append("huge", b"tail") == (20 << 20) + 4 and r[1].get("huge")[-8:] == h[-4:] + b"tail"
assert r[1].set("huge", b"small now") and r[0].get("huge") == b"small now"
assert r[0].set("ttl", os.urandom(100_000), px=1000)
time.sleep(1.2)
assert r[1].get("ttl") is None
assert r[0].dbsize() == 7, r[0].dbsize()  # mc-big, five edges, huge; ttl expired
assert r[2].delete("mc-big") == 1 and mc[0].get("mc-big") is None
try:
    r[0].set("toolong", b"x" * ((24 << 20) - 15))
    raise SystemExit("an item over --item-max was taken")
except redis.ResponseError as e:
    assert "larger than this cluster's limit" in str(e), e
assert r[0].get("huge") == b"small now", "the connection is still in step"
print("large ok")
"#
    );
    run_python(&script, "large ok", "pymemcache and redis-py");
    drop(c);
}

/// redis-py (Debian python3-redis): strings across nodes, a pipeline, expiry, and an
/// unsupported command raising a ResponseError that leaves the connection usable.
#[test]
fn redis_py_works_against_the_cluster() {
    let (_c, base) = up_resp("resp-py");
    let script = format!(
        r#"
import time, redis
a = redis.Redis(host="127.0.0.1", port={base})
b = redis.Redis(host="127.0.0.1", port={base} + 1)
assert a.set("k", b"v" * 1000)
assert b.get("k") == b"v" * 1000
p = a.pipeline(transaction=False)
for i in range(50):
    p.set(f"p{{i}}", i)
assert all(p.execute())
assert b.mget([f"p{{i}}" for i in range(50)]) == [str(i).encode() for i in range(50)]
assert a.delete("p0", "p1", "nope") == 2
assert a.exists("p0", "p2") == 1
a.set("t", "soon", px=1500)
assert 0 < b.pttl("t") <= 1500
time.sleep(1.6)
assert b.get("t") is None and b.ttl("t") == -2
try:
    a.incr("k")
    raise SystemExit("INCR of a non-number should be refused")
except redis.ResponseError as e:
    assert "not an integer" in str(e)
assert a.get("p2") == b"2", "the connection is still in step"
assert a.incr("n") == 1 and b.incrby("n", 41) == 42
assert a.set("n", "x", nx=True) is None and b.set("new", "y", nx=True)
assert a.set("n", "7", xx=True, get=True) == b"42" and b.get("n") == b"7"
assert a.append("n", "0") == 2 and b.getdel("n") == b"70" and a.get("n") is None
assert a.expire("new", 100) and 0 < b.ttl("new") <= 100 and a.persist("new")
assert b.dbsize() >= 50
assert a.flushall() and b.dbsize() == 0 and a.get("p2") is None
print("redis-py ok")
"#
    );
    run_python(&script, "redis-py ok", "redis-py (Debian python3-redis)");
}

/// Run a Python `script` that prints `done` when all went well; `what` names the client
/// library in the failure message.
fn run_python(script: &str, done: &str, what: &str) {
    // The system's Python, where apt puts the client libraries, even when another Python
    // (pyenv, a virtualenv) comes first on PATH.
    let debian = std::path::Path::new("/usr/bin/python3");
    let python = if debian.exists() {
        debian.as_os_str()
    } else {
        std::ffi::OsStr::new("python3")
    };
    let out = Command::new(python)
        .args(["-c", script])
        .output()
        .expect("python3 runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains(done),
        "{what}; scripts/setup.sh installs it:\n{text}"
    );
}

/// `GET path` over HTTP/1.1 on loopback `port`: the status line and the body.
fn http_get(port: u16, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("metrics listener");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n"
    )
    .unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    let (head, body) = all.split_once("\r\n\r\n").expect("an HTTP answer");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the sample `line` (name and labels, exactly) in an exposition.
fn sample(body: &str, line: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(' ')?.parse().ok())
}

/// `--metrics-port`: each node serves Prometheus's text format; its operation counters and
/// histograms count what its front end did, by kind and result, beside the fabric, table
/// and connection metrics.
#[test]
fn metrics_count_what_each_node_did() {
    let base = free_port_range(NODES);
    let metrics = free_port_range(NODES);
    let _c = Cluster::up(
        "metrics",
        NODES,
        "shm",
        &[
            "--no-etcd",
            "--memcached-port",
            &base.to_string(),
            "--metrics-port",
            &metrics.to_string(),
        ],
    );
    let mut m = Mc::connect(base + 1);
    m.send(b"set a 0 0 1\r\nx\r\nget a\r\nget nope\r\nadd a 0 0 1\r\ny\r\n");
    for want in ["STORED", "VALUE a 0 1", "x", "END", "END", "NOT_STORED"] {
        assert_eq!(m.line(), format!("{want}\r\n"));
    }
    let (status, body) = http_get(metrics + 1, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
    let at = |line: &str| sample(&body, line).unwrap_or_else(|| panic!("no {line} in\n{body}"));
    assert_eq!(
        at(r#"nessie_operations_total{kind="put",result="ok"}"#),
        1.0
    );
    assert_eq!(
        at(r#"nessie_operations_total{kind="get",result="miss"}"#),
        1.0
    );
    assert!(at(r#"nessie_operations_total{kind="get",result="ok"}"#) >= 2.0);
    assert_eq!(
        at(r#"nessie_operation_duration_seconds_count{kind="put"}"#),
        1.0
    );
    assert_eq!(
        at(r#"nessie_frontend_connections{protocol="memcached"}"#),
        1.0
    );
    let fabric: f64 = body
        .lines()
        .filter(|l| l.starts_with("nessie_fabric_operations_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        fabric >= 3.0,
        "a PUT and two GETs took fabric operations:\n{body}"
    );
    assert!(
        at("nessie_data_entries_allocated") >= 1.0,
        "the PUT's entry"
    );
    assert!(at("nessie_index_entries") > 0.0);
    assert!(body.ends_with("# EOF\n"), "{body}");
    // Node 0 did nothing through its front end: its counters exist, at zero.
    let (_, quiet) = http_get(metrics, "/metrics");
    let put = r#"nessie_operations_total{kind="put",result="ok"}"#;
    assert_eq!(sample(&quiet, put), Some(0.0), "{quiet}");
    assert_eq!(http_get(metrics, "/").0, "HTTP/1.1 404 Not Found");
}

/// `--resp-password-file`: the Redis front end asks for the password before any command, as
/// Redis's `requirepass` does; redis-cli's `-a` gives it.
#[test]
fn a_redis_password_is_required() {
    let base = free_port_range(NODES);
    let file = std::env::temp_dir().join(format!("nessie-pw-{}", std::process::id()));
    std::fs::write(&file, "s3cret phrase\n").unwrap();
    let c = Cluster::up(
        "resp-auth",
        NODES,
        "shm",
        &[
            "--no-etcd",
            "--resp-port",
            &base.to_string(),
            "--resp-password-file",
            file.to_str().unwrap(),
        ],
    );
    std::fs::remove_file(&file).unwrap();
    let cfg = std::fs::read_to_string(c.dir.join("cluster.toml")).unwrap();
    assert!(cfg.contains("resp_password"), "{cfg}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(c.dir.join("cluster.toml"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "the file holding the password is its owner's only"
    );
    let out = Command::new("redis-cli")
        .args(["-p", &base.to_string(), "SET", "k", "v"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("NOAUTH Authentication required."), "{said}");
    let authed = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-p", &(base + 1).to_string(), "--no-auth-warning"])
            .args(["-a", "s3cret phrase"])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(authed(&["SET", "k", "v"]), "OK\n");
    assert_eq!(authed(&["GET", "k"]), "v\n");
}

/// One event loop serves every connection of a node's front end (`--frontend-threads 1`):
/// many connections at once each get their own answers, and a client that pipelines more
/// replies than the loop keeps waiting for it (16 KiB values, 16 MB of replies sent before
/// it reads any) gets every one of them, in order, once it reads; meanwhile the loop sleeps.
#[test]
fn one_event_loop_serves_many_connections_and_slow_readers() {
    let (c, base) = up("mc-evloop");
    let mut conns: Vec<Mc> = (0..64).map(|_| Mc::connect(base)).collect();
    for (i, m) in conns.iter_mut().enumerate() {
        m.send(format!("set k{i} {i} 0 2\r\n{:02}\r\nget k{i}\r\n", i % 100).as_bytes());
    }
    for (i, m) in conns.iter_mut().enumerate() {
        assert_eq!(m.line(), "STORED\r\n");
        assert_eq!(m.line(), format!("VALUE k{i} {i} 2\r\n"));
        assert_eq!(m.line(), format!("{:02}\r\n", i % 100));
        assert_eq!(m.line(), "END\r\n");
    }
    drop(conns);
    let mut m = Mc::connect(base + 1);
    let big = vec![b'b'; 16_000];
    m.send(format!("set big 7 0 {}\r\n", big.len()).as_bytes());
    m.send(&big);
    m.send(b"\r\n");
    assert_eq!(m.line(), "STORED\r\n");
    // 16 MB of replies: more than the socket buffers hold, so the loop keeps some waiting.
    let n = 1000;
    m.send("get big\r\n".repeat(n).as_bytes());
    m.send(b"version\r\n");
    // While the replies wait for us, the loop must sleep, not spin on the unread input.
    let pid = std::fs::read_to_string(c.dir.join("node-1.pid")).unwrap();
    let cpu = || cpu_seconds(pid.trim());
    let before = cpu();
    std::thread::sleep(Duration::from_secs(1));
    let busy = cpu() - before;
    assert!(
        busy < 0.5,
        "node 1 spent {busy:.2} s of CPU in 1 s waiting for a reader"
    );
    for _ in 0..n {
        assert_eq!(m.get_reply(), vec![("big".to_string(), 7, big.clone())]);
    }
    assert!(m.line().starts_with("VERSION 1.6.0-nessie"));
}

/// The meta commands against node processes: a value set through one node with `ms` is read
/// with `mg` through another (flags, cas, TTL), a compare-and-set with a stale cas is refused,
/// `ma` counts, `md` removes, and quiet mode answers nothing until `mn`.
#[test]
fn meta_commands_work_across_nodes() {
    let (_c, base) = up("mc-meta");
    let mut a = Mc::connect(base);
    let mut b = Mc::connect(base + 2);
    a.send(b"ms greeting 5 F7 T100 c\r\nhello\r\n");
    let stored = a.line();
    assert!(stored.starts_with("HD c"), "{stored:?}");
    let cas: u64 = stored.trim_end()[4..].parse().unwrap();
    b.send(b"mg greeting v f t c\r\n");
    let head = b.line();
    assert!(head.starts_with("VA 5 f7 t"), "{head:?}");
    assert!(head.trim_end().ends_with(&format!(" c{cas}")), "{head:?}");
    assert_eq!(b.line(), "hello\r\n");
    b.send(format!("ms greeting 3 C{cas}\r\nbye\r\n").as_bytes());
    assert_eq!(b.line(), "HD\r\n");
    a.send(format!("ms greeting 3 C{cas}\r\nold\r\n").as_bytes());
    assert_eq!(a.line(), "EX\r\n", "a stale cas is refused");
    a.send(b"ma n N0 J10 v\r\nma n D5 v\r\nmd greeting q\r\nmg greeting v q\r\nmn\r\n");
    for want in ["VA 2", "10", "VA 2", "15", "MN"] {
        assert_eq!(a.line(), format!("{want}\r\n"));
    }
    b.send(b"mg greeting v\r\n");
    assert_eq!(b.line(), "EN\r\n");
}

/// CPU seconds (user and system) process `pid` has used, from /proc.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (in parentheses): utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// A client that sends its requests and then shuts its side of the connection down (as
/// `printf … | nc` does) still gets every reply before the front end closes.
#[test]
fn replies_reach_a_client_that_shut_down_its_sending_side() {
    let (_c, base) = up("mc-halfclose");
    let mut s = TcpStream::connect(("127.0.0.1", base)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"set k 0 0 2\r\nhi\r\nget k\r\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    assert_eq!(all, "STORED\r\nVALUE k 0 2\r\nhi\r\nEND\r\n");
}

/// A node out of file descriptors refuses the connections it cannot serve with memcached's
/// own error line, and neither spins (a listener with connections waiting stays readable)
/// nor leaves them waiting; once connections close it serves new ones again.
#[test]
fn connections_past_the_open_file_limit_are_refused_not_left_waiting() {
    let base = free_port_range(1);
    let c = Cluster::up(
        "mc-emfile",
        1,
        "shm",
        &["--no-etcd", "--memcached-port", &base.to_string()],
    );
    let pid: libc::pid_t = std::fs::read_to_string(c.dir.join("node-0.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Room for 20 more descriptors than the node holds now.
    let open = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64;
    let limit = libc::rlimit {
        rlim_cur: open + 20,
        rlim_max: open + 20,
    };
    // SAFETY: a valid rlimit; lowering another process of ours' limit needs no privilege.
    let r = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &limit, std::ptr::null_mut()) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());

    let mut conns: Vec<Mc> = (0..40).map(|_| Mc::connect(base)).collect();
    let (mut served, mut refused) = (0, 0);
    for m in &mut conns {
        m.r.get_mut()
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let _ = m.r.get_mut().write_all(b"version\r\n");
        let mut l = String::new();
        let got = m.r.read_line(&mut l);
        match l.as_str() {
            l if l.starts_with("VERSION ") => served += 1,
            "SERVER_ERROR Too many open connections\r\n" => refused += 1,
            other => panic!("connection got {other:?} ({got:?}): neither served nor refused"),
        }
    }
    assert!(
        served > 0 && refused > 0,
        "served {served}, refused {refused}"
    );
    let pid = pid.to_string();
    let before = cpu_seconds(&pid);
    std::thread::sleep(Duration::from_secs(1));
    let busy = cpu_seconds(&pid) - before;
    assert!(
        busy < 0.5,
        "node spent {busy:.2} s of CPU in 1 s at its fd limit"
    );
    drop(conns);
    std::thread::sleep(Duration::from_millis(300));
    let mut m = Mc::connect(base);
    m.send(b"version\r\n");
    assert!(
        m.line().starts_with("VERSION "),
        "served again once fds are free"
    );
}

/// Resident memory of process `pid`, in bytes.
fn rss_bytes(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kb * 1024
}

/// How much more memory than this a client that does not read its replies may make a node
/// hold: the session's limit (1 MiB), the loop's (1 MiB), a value, the socket buffers and
/// the allocator's slack.
const UNREAD_REPLIES_MAX_GROWTH: u64 = 48 << 20;

/// Multi-key reads whose replies are far larger than the front ends keep (hundreds of MB),
/// sent by clients that do not read them for a while: the node's memory stays bounded (they
/// are answered a part at a time, as the client takes them), and every reply still arrives
/// whole, in order.
#[test]
fn huge_multi_key_replies_to_clients_that_do_not_read_take_bounded_memory() {
    let (mb, rb) = (free_port_range(1), free_port_range(1));
    let c = Cluster::up(
        "fe-bounded",
        1,
        "shm",
        &[
            "--no-etcd",
            "--memcached-port",
            &mb.to_string(),
            "--resp-port",
            &rb.to_string(),
        ],
    );
    let pid = std::fs::read_to_string(c.dir.join("node-0.pid")).unwrap();
    let pid = pid.trim();
    let big = vec![b'v'; 16_000];

    // memcached: 16 gets of the same 16 KB value a thousand times (256 MB of replies).
    let mut m = Mc::connect(mb);
    m.send(format!("set big 3 0 {}\r\n", big.len()).as_bytes());
    m.send(&big);
    m.send(b"\r\n");
    assert_eq!(m.line(), "STORED\r\n");
    let before = rss_bytes(pid);
    let line = format!("get{}\r\n", " big".repeat(1000));
    m.send(line.repeat(16).as_bytes());
    std::thread::sleep(Duration::from_millis(500));
    let grew = rss_bytes(pid).saturating_sub(before);
    assert!(
        grew < UNREAD_REPLIES_MAX_GROWTH,
        "memcached: the node grew {grew} bytes for a client not reading its replies"
    );
    for g in 0..16 {
        let hits = m.get_reply();
        assert_eq!(hits.len(), 1000, "get {g}");
        assert!(hits
            .iter()
            .all(|(k, f, d)| k == "big" && *f == 3 && *d == big));
    }

    // Redis: one MGET of the same key 20,000 times (320 MB of reply).
    let mut s = TcpStream::connect(("127.0.0.1", rb)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n${}\r\n", big.len()).into_bytes();
    req.extend_from_slice(&big);
    req.extend_from_slice(b"\r\n");
    s.write_all(&req).unwrap();
    let mut ok = [0u8; 5];
    s.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"+OK\r\n");
    let before = rss_bytes(pid);
    const KEYS: usize = 20_000;
    let mut mget = format!("*{}\r\n$4\r\nMGET\r\n", KEYS + 1);
    mget.push_str(&"$3\r\nbig\r\n".repeat(KEYS));
    mget.push_str("*1\r\n$4\r\nPING\r\n");
    s.write_all(mget.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let grew = rss_bytes(pid).saturating_sub(before);
    assert!(
        grew < UNREAD_REPLIES_MAX_GROWTH,
        "resp: the node grew {grew} bytes for a client not reading its reply"
    );
    let mut r = BufReader::new(s);
    let mut l = String::new();
    r.read_line(&mut l).unwrap();
    assert_eq!(l, format!("*{KEYS}\r\n"));
    let element = format!("${}\r\n{}\r\n", big.len(), String::from_utf8(big).unwrap());
    let mut got = vec![0u8; element.len()];
    for k in 0..KEYS {
        r.read_exact(&mut got).unwrap();
        assert!(got == element.as_bytes(), "element {k}");
    }
    l.clear();
    r.read_line(&mut l).unwrap();
    assert_eq!(l, "+PONG\r\n", "the connection goes on after the MGET");
}

/// `--bind` puts the front ends and the metrics on the address it names (another loopback
/// address here), and nothing listens on the default 127.0.0.1.
#[test]
fn bind_puts_the_front_ends_on_the_address_given() {
    let base = free_port_range(3);
    let (mc, resp, metrics) = (base, base + 1, base + 2);
    let _c = Cluster::up(
        "fe-bind",
        1,
        "shm",
        &[
            "--no-etcd",
            "--bind",
            "127.0.0.2",
            "--memcached-port",
            &mc.to_string(),
            "--resp-port",
            &resp.to_string(),
            "--metrics-port",
            &metrics.to_string(),
        ],
    );
    for port in [mc, resp, metrics] {
        assert!(
            TcpStream::connect(("127.0.0.2", port)).is_ok(),
            "nothing on 127.0.0.2:{port}"
        );
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "127.0.0.1:{port} answers too"
        );
    }
    let mut s = TcpStream::connect(("127.0.0.2", mc)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"version\r\n").unwrap();
    let mut l = String::new();
    BufReader::new(s).read_line(&mut l).unwrap();
    assert!(l.starts_with("VERSION "), "{l:?}");
}
