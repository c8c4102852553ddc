//! The Redis front end against a real `redis-server` (Debian redis-server), on loopback:
//! generated sequences of the key commands Nessie serves, with their options, edge-case
//! numbers and wrong argument counts, sent to both; every reply must be the same bytes.
//! `the_redis_front_end_answers_as_redis_server` (frontends.rs) pins chosen cases; this one
//! explores their combinations, and proptest shrinks a difference to a shortest sequence.
//!
//! Nessie's commands go to its three nodes in turn (chosen per command), so a key written
//! through one node is read back through another; redis-server has one connection.
//! Replies that depend on the moment they are computed are compared in a coarser form:
//! a positive TTL or PTTL (the one time-dependent reply; every expiry generated is either
//! long past or at least 1000 s away) only as being positive.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{free_port_range, Cluster, Peer};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const NODES: u16 = 3;
/// Generated sequences run per test (each starts with FLUSHALL); `PROPTEST_CASES` overrides it
/// for a longer search.
const CASES: u32 = 160;
/// Most commands in a sequence.
const MAX_COMMANDS: usize = 10;
/// How long a reply may take before the test fails.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of replies one command may get (every generated reply is far shorter).
const MAX_REPLY: usize = 1 << 16;

/// The keys: few, so that commands meet each other's keys.
const KEYS: &[&str] = &["a", "b", "c"];
/// Values: integers at and past the 64-bit limits, and strings INCR refuses.
const VALUES: &[&str] = &[
    "1",
    "0",
    "-3",
    "41",
    "x",
    "",
    " 1",
    "1 ",
    "3.0",
    "10abc",
    "007",
    "+5",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "large:4096",
    "large:20000",
];
/// The cluster's largest value: room for every generated sequence's APPENDs of large values.
const VALUE_MAX: usize = 256 * 1024;

/// A value as sent: `large:N` stands for N bytes of a repeating pattern, which goes the
/// large-value way (into the entry straight from the connection's buffer).
fn expand(v: String) -> String {
    match v.strip_prefix("large:").map(str::parse::<usize>) {
        Some(Ok(n)) => "0123456789abcdef".chars().cycle().take(n).collect(),
        _ => v,
    }
}

/// HELLOs both servers refuse: a version out of range or not an integer, a bad option.
const HELLO_REFUSED: &[&[&str]] = &[
    &["HELLO", "4"],
    &["HELLO", "1"],
    &["HELLO", "x"],
    &["HELLO", "03"],
    &["HELLO", "3", "FOO"],
    &["HELLO", "2", "SETNAME"],
    &["HELLO", "2", "setname", "a b"],
    &["HELLO", "3", "AUTH", "default"],
];
/// AUTH on servers without a password: the default user takes any password, the one-argument
/// form and other users are refused.
const AUTHS: &[&[&str]] = &[
    &["AUTH", "x"],
    &["AUTH", "default", "x"],
    &["AUTH", "other", "x"],
    &["AUTH", "default", "x", "y"],
    &["HELLO", "2", "AUTH", "other", "x"],
];
/// INCRBY/DECRBY amounts.
const AMOUNTS: &[&str] = &[
    "5",
    "-5",
    "0",
    "x",
    "",
    "1.5",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
];

/// A generated command: its arguments and the node (of Nessie) it is sent to.
#[derive(Clone, Debug)]
struct Cmd {
    args: Vec<String>,
    node: u16,
    /// Sent as an inline command (words on one line, as telnet sends them) where its
    /// arguments allow (see [`Cmd::request`]).
    inline: bool,
}

impl Cmd {
    /// The request bytes: inline when asked and every argument is a plain word (not empty,
    /// nothing an inline line would quote or split), else a multibulk.
    fn request(&self) -> Vec<u8> {
        let plain = |a: &String| {
            !a.is_empty()
                && a.len() < 100
                && a.bytes()
                    .all(|b| b.is_ascii_graphic() && !b"\"'\\".contains(&b))
        };
        match self.inline && self.args.iter().all(plain) {
            true => format!("{}\r\n", self.args.join(" ")).into_bytes(),
            false => encode(&self.args),
        }
    }
}

/// Arguments for an expiry option: long past, far ahead (relative or absolute), or invalid.
fn expiry(now_s: u64) -> impl Strategy<Value = Vec<String>> {
    let past_s = "1".to_string();
    let ahead_s = (now_s + 100_000).to_string();
    let ahead_ms = ((now_s + 100_000) * 1000).to_string();
    prop_oneof![
        Just(vec!["EX".into(), "1000".into()]),
        Just(vec!["PX".into(), "1000000".into()]),
        Just(vec!["EXAT".into(), ahead_s]),
        Just(vec!["PXAT".into(), ahead_ms]),
        Just(vec!["EXAT".into(), past_s]),
        Just(vec!["PXAT".into(), "1".into()]),
        Just(vec!["EX".into(), "0".into()]),
        Just(vec!["PX".into(), "-5".into()]),
        Just(vec!["EX".into(), "x".into()]),
        Just(vec!["EX".into(), "99999999999999999".into()]),
        Just(vec!["EX".into()]),
    ]
}

fn pick(of: &'static [&'static str]) -> impl Strategy<Value = String> + Clone {
    proptest::sample::select(of).prop_map(str::to_string)
}

fn keys(max: usize) -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(pick(KEYS), 1..=max)
}

/// The arguments of one command (name first), well-formed or close to it.
fn command(now_s: u64) -> impl Strategy<Value = Vec<String>> {
    let k = || pick(KEYS);
    let v = || pick(VALUES).prop_map(expand);
    let set_opts = proptest::collection::vec(
        prop_oneof![
            Just(vec!["NX".to_string()]),
            Just(vec!["XX".to_string()]),
            Just(vec!["GET".to_string()]),
            Just(vec!["KEEPTTL".to_string()]),
            expiry(now_s),
        ],
        0..3,
    );
    let expire_opts = || proptest::collection::vec(pick(&["NX", "XX", "GT", "LT", "FOO"]), 0..2);
    let secs = pick(&["1000", "2000", "-1", "0", "x", "9223372036854775807"]);
    let getex_opt = prop_oneof![
        Just(vec![]),
        Just(vec!["PERSIST".to_string()]),
        expiry(now_s),
    ];
    let simple = |name: &'static str| Just(vec![name.to_string()]);
    prop_oneof![
        (k(), v(), set_opts).prop_map(|(k, v, o)| {
            let mut a = vec!["SET".into(), k, v];
            a.extend(o.into_iter().flatten());
            a
        }),
        k().prop_map(|k| vec!["GET".into(), k]),
        (k(), v()).prop_map(|(k, v)| vec!["SETNX".into(), k, v]),
        (k(), v()).prop_map(|(k, v)| vec!["GETSET".into(), k, v]),
        (
            pick(&["SETEX", "PSETEX"]),
            k(),
            pick(&["1000", "1000000", "0", "-1", "x"]),
            v()
        )
            .prop_map(|(c, k, t, v)| vec![c, k, t, v]),
        k().prop_map(|k| vec!["GETDEL".into(), k]),
        (k(), getex_opt).prop_map(|(k, o)| {
            let mut a = vec!["GETEX".into(), k];
            a.extend(o);
            a
        }),
        keys(4).prop_map(|ks| [vec!["MGET".into()], ks].concat()),
        proptest::collection::vec((k(), v()), 1..3).prop_map(|kv| {
            let mut a = vec!["MSET".to_string()];
            for (k, v) in kv {
                a.push(k);
                a.push(v);
            }
            a
        }),
        (pick(&["DEL", "UNLINK", "EXISTS"]), keys(4)).prop_map(|(c, ks)| [vec![c], ks].concat()),
        (pick(&["INCR", "DECR"]), k()).prop_map(|(c, k)| vec![c, k]),
        (pick(&["INCRBY", "DECRBY"]), k(), pick(AMOUNTS)).prop_map(|(c, k, n)| vec![c, k, n]),
        (k(), v()).prop_map(|(k, v)| vec!["APPEND".into(), k, v]),
        k().prop_map(|k| vec!["STRLEN".into(), k]),
        (pick(&["EXPIRE", "PEXPIRE"]), k(), secs, expire_opts()).prop_map(|(c, k, s, o)| [
            vec![c, k, s],
            o
        ]
        .concat()),
        (
            pick(&["EXPIREAT", "PEXPIREAT"]),
            k(),
            Just(now_s),
            expire_opts()
        )
            .prop_map(|(c, k, now, o)| {
                // Long past, or far ahead, in the command's unit.
                let ahead = now + 100_000;
                let at = match (c.as_str(), k.len() % 2) {
                    (_, 0) => "1".to_string(),
                    ("EXPIREAT", _) => ahead.to_string(),
                    _ => (ahead * 1000).to_string(),
                };
                [vec![c, k, at], o].concat()
            }),
        k().prop_map(|k| vec!["PERSIST".into(), k]),
        (pick(&["TTL", "PTTL"]), k()).prop_map(|(c, k)| vec![c, k]),
        simple("DBSIZE"),
        simple("PING"),
        (pick(&["ECHO", "PING"]), v()).prop_map(|(c, v)| vec![c, v]),
        // Only database 0 is served (docs/frontends.md): redis-server's 1 to 15 are left out.
        pick(&["0", "16", "x", "-1", "00", "+0", " 0"]).prop_map(|d| vec!["SELECT".into(), d]),
        // HELLO's refusals (its answer to a valid one names the server, so none is made).
        proptest::sample::select(HELLO_REFUSED)
            .prop_map(|a| a.iter().map(|w| w.to_string()).collect()),
        proptest::sample::select(AUTHS).prop_map(|a| a.iter().map(|w| w.to_string()).collect()),
        // Connection names: each connection has its own, so these go to node 0 (see `cmd`).
        prop_oneof![
            Just(vec!["CLIENT".to_string(), "GETNAME".to_string()]),
            pick(&["n1", "a b", "", "x\u{7f}"]).prop_map(|n| vec![
                "CLIENT".into(),
                "SETNAME".into(),
                n
            ]),
        ],
    ]
}

/// A command as generated, or spoiled: an argument dropped or one added (wrong arity, a stray
/// option), its name in lower case.
fn cmd(now_s: u64) -> impl Strategy<Value = Cmd> {
    (
        command(now_s),
        0u8..10,
        0..NODES,
        proptest::bool::weighted(0.2),
    )
        .prop_map(|(mut args, how, node, inline)| {
            // A connection's name is its own: CLIENT goes to one connection on each side.
            let node = if args[0] == "CLIENT" { 0 } else { node };
            match how {
                // A HELLO spoiled could be a valid one, whose answer is not compared.
                _ if args[0] == "HELLO" => {}
                0 if args.len() > 1 => {
                    args.pop();
                }
                1 => args.push("x".into()),
                2 => args[0] = args[0].to_lowercase(),
                _ => {}
            }
            Cmd { args, node, inline }
        })
}

fn encode(args: &[String]) -> Vec<u8> {
    let mut b = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        b.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    b
}

/// The length of the first complete RESP2 or RESP3 reply in `b`, if it is all there.
fn reply_len(b: &[u8]) -> Option<usize> {
    let line_end = b.windows(2).position(|w| w == b"\r\n")? + 2;
    let number = || -> i64 {
        std::str::from_utf8(&b[1..line_end - 2])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad reply header {:?}", String::from_utf8_lossy(b)))
    };
    // Aggregates of `n` elements (maps and attributes: n pairs).
    let elements = |n: i64| -> Option<usize> {
        let mut at = line_end;
        for _ in 0..n.max(0) {
            at += reply_len(&b[at..])?;
        }
        Some(at)
    };
    match b[0] {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Some(line_end),
        b'$' | b'=' | b'!' => match number() {
            -1 => Some(line_end),
            n => {
                let end = line_end + n as usize + 2;
                (b.len() >= end).then_some(end)
            }
        },
        b'*' | b'~' | b'>' => elements(number()),
        b'%' => elements(2 * number()),
        b'|' => {
            // An attribute map, then the reply it annotates.
            let at = elements(2 * number())?;
            Some(at + reply_len(&b[at..])?)
        }
        other => panic!("not a RESP reply: {:?}", other as char),
    }
}

/// A connection that reads one reply per command.
struct Conn {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn connect(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        Conn { s, buf: Vec::new() }
    }

    fn call(&mut self, args: &[String]) -> Result<Vec<u8>, String> {
        self.send(&encode(args))?;
        self.reply()
    }

    fn run(&mut self, c: &Cmd) -> Result<Vec<u8>, String> {
        self.send(&c.request())?;
        self.reply()
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.s.write_all(bytes).map_err(|e| e.to_string())
    }

    /// The next whole reply.
    fn reply(&mut self) -> Result<Vec<u8>, String> {
        let mut chunk = [0u8; 4096];
        loop {
            if !self.buf.is_empty() {
                if let Some(n) = reply_len(&self.buf) {
                    return Ok(self.buf.drain(..n).collect());
                }
            }
            if self.buf.len() > MAX_REPLY {
                return Err(format!("a reply over {MAX_REPLY} bytes"));
            }
            match self.s.read(&mut chunk) {
                Ok(0) => return Err("connection closed".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("no reply: {e}")),
            }
        }
    }
}

/// Whether `args` set an expiry time long past (EXAT 1, PXAT 1): redis-server keeps such a key
/// until it reclaims it, and its DBSIZE counts it meanwhile; Nessie's counts live keys only
/// (docs/frontends.md).
fn sets_past_expiry(args: &[String]) -> bool {
    args.windows(2)
        .any(|w| ["EXAT", "PXAT"].contains(&w[0].to_uppercase().as_str()) && w[1] == "1")
}

/// Arguments as a failure shows them: long ones by their length.
fn shown(args: &[String]) -> String {
    let short: Vec<String> = args
        .iter()
        .map(|a| match a.len() {
            0..=40 => format!("{a:?}"),
            n => format!("<{n} bytes>"),
        })
        .collect();
    format!("[{}]", short.join(", "))
}

/// The reply as compared: a positive TTL or PTTL only as positive; after a past expiry was
/// set, a DBSIZE only as a count.
fn normalized(args: &[String], reply: Vec<u8>, past_expiry: bool) -> String {
    let text = String::from_utf8_lossy(&reply).into_owned();
    let name = args[0].to_lowercase();
    let timed = ["ttl", "pttl"].contains(&name.as_str()) && args.len() == 2;
    let counted = name == "dbsize" && args.len() == 1 && past_expiry;
    match text
        .strip_prefix(':')
        .and_then(|r| r.trim_end().parse::<i64>().ok())
    {
        Some(n) if timed && n > 0 => ":<positive>\r\n".into(),
        Some(_) if counted => ":<count>\r\n".into(),
        _ => text,
    }
}

/// The servers' ports: redis-server's, and one per Nessie node.
struct Servers {
    redis: u16,
    nessie: Vec<u16>,
}

/// A case's connections, fresh for each (a case that fails leaves replies unread).
struct Conns {
    redis: Conn,
    nessie: Vec<Conn>,
}

impl Servers {
    /// Run `cmds` on both from empty stores, in RESP3 if `resp3` (else RESP2), all sent at
    /// once if `pipelined` (else each after the last reply); the first command whose replies
    /// differ. HELLO's own reply (the server's name, version and connection id) is not
    /// compared.
    fn differ(&self, cmds: &[Cmd], resp3: bool, pipelined: bool) -> Result<(), TestCaseError> {
        let mut c = Conns {
            redis: Conn::connect(self.redis),
            nessie: self.nessie.iter().map(|&p| Conn::connect(p)).collect(),
        };
        c.differ(cmds, resp3, pipelined)
    }
}

impl Conns {
    fn differ(&mut self, cmds: &[Cmd], resp3: bool, pipelined: bool) -> Result<(), TestCaseError> {
        let hello = vec![
            "HELLO".to_string(),
            if resp3 { "3" } else { "2" }.to_string(),
        ];
        for c in std::iter::once(&mut self.redis).chain(self.nessie.iter_mut()) {
            let r = c.call(&hello).map_err(TestCaseError::fail)?;
            prop_assert!(
                r.starts_with(if resp3 { b"%" } else { b"*" }),
                "HELLO: {:?}",
                r
            );
        }
        let flush = vec!["FLUSHALL".to_string()];
        for r in [self.redis.call(&flush), self.nessie[0].call(&flush)] {
            prop_assert_eq!(r.as_deref(), Ok(&b"+OK\r\n"[..]));
        }
        let mut transcript = format!("  (RESP{})\n", if resp3 { 3 } else { 2 });
        let mut past = false;
        if pipelined {
            // Every command at once, to node 0: served from one buffer, in rounds.
            let all: Vec<u8> = cmds.iter().flat_map(Cmd::request).collect();
            self.redis.send(&all).map_err(TestCaseError::fail)?;
            self.nessie[0].send(&all).map_err(TestCaseError::fail)?;
            transcript.push_str("  (pipelined, node 0)\n");
        }
        for c in cmds {
            past |= sets_past_expiry(&c.args);
            let node = if pipelined { 0 } else { c.node as usize };
            let (theirs, ours) = match pipelined {
                true => (self.redis.reply(), self.nessie[0].reply()),
                false => (self.redis.run(c), self.nessie[node].run(c)),
            };
            let theirs = theirs.map(|r| normalized(&c.args, r, past));
            let ours = ours.map(|r| normalized(&c.args, r, past));
            let cut = |r: &Result<String, String>| -> String {
                let r = format!("{r:?}");
                match r.char_indices().nth(200) {
                    Some((i, _)) => format!("{}… ({} chars)", &r[..i], r.len()),
                    None => r,
                }
            };
            let inline = c.request().first() != Some(&b'*');
            transcript.push_str(&format!(
                "  node {node} {}{} -> {}\n",
                shown(&c.args),
                if inline { " (inline)" } else { "" },
                cut(&ours)
            ));
            if ours != theirs {
                return Err(TestCaseError::fail(format!(
                    "Nessie answered {}\nredis-server    {}\nafter the sequence:\n{transcript}",
                    cut(&ours),
                    cut(&theirs)
                )));
            }
        }
        Ok(())
    }
}

#[test]
fn generated_command_sequences_are_answered_as_redis_server_answers_them() {
    let base = free_port_range(NODES);
    let _c = Cluster::up(
        "resp-differential",
        NODES,
        "shm",
        &[
            "--no-etcd",
            "--resp-port",
            &base.to_string(),
            "--value-max",
            &VALUE_MAX.to_string(),
            "--memory-per-node",
            "256MiB",
            // Pipelined sequences run their GETs and SETs with operations in flight.
            "--frontend-inflight",
            "8",
        ],
    );
    let (_rs, port) = Peer::redis_server();
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let servers = Servers {
        redis: port,
        nessie: (0..NODES).map(|k| base + k).collect(),
    };
    let mut runner = TestRunner::new(Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(CASES),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = (
        proptest::collection::vec(cmd(now_s), 1..=MAX_COMMANDS),
        any::<bool>(),
        any::<bool>(),
    );
    let result = runner.run(&strategy, |(cmds, resp3, pipelined)| {
        servers.differ(&cmds, resp3, pipelined)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The comparison catches a difference. Both "servers" here are one redis-server, so a
/// command is run twice: idempotent ones agree, a positive TTL is compared by sign, but INCR
/// answers 1 to the first connection and 2 to the second, and that fails.
#[test]
fn a_different_reply_fails_the_comparison() {
    let (_rs, port) = Peer::redis_server();
    let s = Servers {
        redis: port,
        nessie: vec![port],
    };
    let c = |args: &[&str]| Cmd {
        args: args.iter().map(|a| a.to_string()).collect(),
        node: 0,
        inline: false,
    };
    for resp3 in [false, true] {
        let set_get = [c(&["SET", "a", "1"]), c(&["GET", "a"])];
        assert!(s.differ(&set_get, resp3, false).is_ok());
        let ttl = [c(&["SET", "a", "1", "EX", "1000"]), c(&["PTTL", "a"])];
        assert!(
            s.differ(&ttl, resp3, false).is_ok(),
            "PTTL compared by sign"
        );
    }
    let e = s.differ(&[c(&["INCR", "a"])], true, false);
    let e = e.expect_err("1 and 2 differ");
    assert!(e.to_string().contains(r#"["INCR", "a"]"#), "{e}");
}
