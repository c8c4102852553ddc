//! The memcached front end against a real `memcached` (Debian memcached 1.6.18), on loopback:
//! generated sequences of memcached text-protocol commands (storage, cas, retrieval,
//! arithmetic, touch, delete, verbosity, flush_all, the meta commands, their `noreply`/`q`
//! forms, and malformed lines) go to both, and every reply must be the same bytes once
//! normalised. frontends.rs pins chosen cases; this explores their combinations, and proptest
//! shrinks a difference to a shortest sequence, printed with both servers' replies.
//!
//! A case flushes both stores, `set`s most keys, then runs 1 to [`MAX_COMMANDS`] generated
//! commands, one at a time: each is followed by `mn` (both answer `MN`), so its whole reply is
//! read, even a silent one, before the next is sent. Nessie's go to its three nodes (chosen per
//! command), so a key written through one node is read back through another. What differs by
//! design (docs/frontends.md) is compared in a coarser form, or not generated:
//! - cas uniques (a counter in memcached, the key's store version in Nessie) are replaced by a
//!   placeholder; a `cas` or `C` that should match sends each server the unique that server
//!   last returned for the key, so both match or neither does;
//! - a positive TTL (`t`; every expiry generated is either past or 1000 s away) is compared
//!   only as being positive;
//! - memcached pads a number an `incr`/`decr`/`ma` made shorter with spaces, in place, where
//!   Nessie stores the digits: the padding is taken off memcached's item behind the test's
//!   back, right after such a command ([`unpad`]);
//! - not generated: `md … q`, `t` before `N`, `ma` with `T` or with `q` and `N`, negative
//!   values (see [`VALUES`]), keys longer than the cluster's `key_max`, flags past 32 bits,
//!   the meta flags Nessie refuses; and a touch gives Nessie a new unique, not memcached, so
//!   the uniques returned before it are forgotten.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{free_port_range, Cluster, Peer};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const NODES: u16 = 3;
/// Generated sequences run per test (each starts from an empty store); `PROPTEST_CASES`
/// overrides it for a longer search.
const CASES: u32 = 128;
/// Most commands generated for a case (after its `set`s of the keys).
const MAX_COMMANDS: usize = 12;
/// How long a reply may take before the test fails.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of replies one command may get (every generated reply is far shorter).
const MAX_REPLY: usize = 1 << 16;

/// The keys: few, so that commands meet each other's keys.
const KEYS: &[&str] = &["a", "b", "k3"];
/// Values: numbers at and past the 64-bit limit, ones `incr` reads with leading space or
/// trailing words, and strings it refuses. None ends in a space (see [`unpad`]), and none
/// holds a `-`: memcached 1.6.18 refuses to count a number of 2^63 or more if a `-` follows
/// it in its memory before a NUL byte (`safe_strtoull` looks for a sign with `strchr`, past
/// the value's end), so a negative value stored nearby would make its answer a matter of
/// memory layout. Nessie refuses a negative number as memcached does (unit tested).
const VALUES: &[&str] = &[
    "0",
    "7",
    "42",
    "100",
    "18446744073709551615",
    "18446744073709551616",
    " 5",
    "5 x",
    "x",
    "",
    "hello world",
];
const FLAGS: &[u32] = &[0, 1, 4_294_967_295];
/// Expiry times whose effect does not depend on when they are sent: the first two keep the
/// item (none, far ahead, relative), the others expire it at once (negative, and an absolute
/// Unix time long past).
const EXPTIMES: &[i64] = &[0, 1000, -1, 1_000_000_000];
/// `incr`/`decr` amounts: the first four are numbers (zero, small, the largest), the others
/// are refused (one past the largest, negative, not a number).
const DELTAS: &[&str] = &[
    "0",
    "1",
    "7",
    "18446744073709551615",
    "18446744073709551616",
    "-1",
    "x",
];
/// Uniques that are stale or never were: neither server hands them out during a run
/// (memcached's counter is moved past 1 before it, see [`Servers::start`]).
const BOGUS_UNIQUES: &[u64] = &[0, 1, u64::MAX];

/// Malformed or unusual lines, each complete on its own (a data block, if any, included), so
/// that both servers stay in step after them. A declared length longer than the data that
/// follows is left out: the server would read the next command as data.
fn odd_lines() -> Vec<String> {
    let long = "k".repeat(251);
    let lines = [
        "set a 0 0\r\n",
        "set a abc 0 1\r\nx\r\n",
        "set a abc 0 1 noreply\r\nx\r\n",
        "set a 0 1.5 1\r\nx\r\n",
        "set a 0 0 1\r\nxyz\r\n",
        "set a 0 0 1 noreply\r\nxyz\r\n",
        "set a 0 0 x\r\n",
        "set a 0 0 1 2 3\r\n",
        "cas a 0 0 1\r\nx\r\n",
        "cas a 0 0 1 x\r\nx\r\n",
        "get\r\n",
        "gets\r\n",
        "gat\r\n",
        "gat 0\r\n",
        "gats 1000 noreply\r\n",
        "gat x a\r\n",
        "incr a\r\n",
        "incr a 1 x\r\n",
        "decr a x noreply\r\n",
        "touch a\r\n",
        "touch a x\r\n",
        "touch a 0 x\r\n",
        "delete\r\n",
        "delete a 0\r\n",
        "delete a 0 noreply\r\n",
        "delete a b\r\n",
        "delete a b noreply\r\n",
        "delete a 0 x\r\n",
        "delete noreply\r\n",
        "verbosity\r\n",
        "verbosity x\r\n",
        "verbosity 1 2\r\n",
        "verbosity noreply\r\n",
        "flush_all x\r\n",
        "flush_all 0 x\r\n",
        "bogus\r\n",
        "bogus noreply\r\n",
        "\r\n",
        "mg\r\n",
        "mg a zz\r\n",
        "mg a v v\r\n",
        "mg a Tx v\r\n",
        "ms a\r\n",
        "ms a x\r\n",
        "ms a 1 MX\r\nx\r\n",
        "ms a 1 Cx\r\nx\r\n",
        "ms a 1\r\nxyz\r\n",
        "md a x\r\n",
        "ma a Dx\r\n",
        "ma a Mx\r\n",
        "mn extra\r\n",
    ];
    let mut v: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    v.extend([
        format!("set {long} 0 0 1\r\nx\r\n"),
        format!("set {long} 0 0 1 noreply\r\nx\r\n"),
        format!("get a {long}\r\n"),
        format!("gets {long}\r\n"),
        format!("delete {long}\r\n"),
        format!("incr {long} 1\r\n"),
        format!("touch {long} 0\r\n"),
        format!("mg {long} v\r\n"),
        format!("md {long}\r\n"),
    ]);
    v
}

/// The unique a `cas` (or a meta `C`) sends.
#[derive(Clone, Debug)]
enum Unique {
    /// The one this server last returned for the key (a bogus one if none).
    Last,
    Bogus(u64),
}

/// A meta command's flag.
#[derive(Clone, Debug)]
enum Flag {
    Word(String),
    /// `C` with a unique.
    Cas(Unique),
}

/// One generated command.
#[derive(Clone, Debug)]
enum Cmd {
    /// `set`, `add`, `replace`, `append`, `prepend`, or `cas` (with `unique`).
    Store {
        op: &'static str,
        key: &'static str,
        flags: u32,
        exptime: i64,
        value: &'static str,
        unique: Option<Unique>,
        noreply: bool,
    },
    /// `get`/`gets`, or `gat`/`gats` with `exptime`.
    Get {
        op: &'static str,
        exptime: Option<i64>,
        keys: Vec<&'static str>,
    },
    Delete {
        key: &'static str,
        noreply: bool,
    },
    /// `incr` or `decr`.
    Arith {
        op: &'static str,
        key: &'static str,
        delta: &'static str,
        noreply: bool,
    },
    Touch {
        key: &'static str,
        exptime: i64,
        noreply: bool,
    },
    Verbosity {
        level: u32,
        noreply: bool,
    },
    FlushAll {
        noreply: bool,
    },
    /// `mg`, `ms` (with its data), `md` or `ma`.
    Meta {
        op: &'static str,
        key: &'static str,
        data: Option<&'static str>,
        flags: Vec<Flag>,
    },
    Mn,
    /// A line from [`odd_lines`].
    Odd(String),
}

/// A command and the Nessie node it goes to.
#[derive(Clone, Debug)]
struct Step {
    node: u16,
    cmd: Cmd,
}

/// What a server last returned as each key's unique.
type Uniques = HashMap<String, u64>;

fn unique_for(u: &Unique, key: &str, last: &Uniques) -> u64 {
    match u {
        Unique::Last => last.get(key).copied().unwrap_or(BOGUS_UNIQUES[2]),
        Unique::Bogus(n) => *n,
    }
}

impl Cmd {
    /// The request bytes for the server whose uniques are `last`.
    fn render(&self, last: &Uniques) -> Vec<u8> {
        let nr = |noreply: bool| if noreply { " noreply" } else { "" };
        match self {
            Cmd::Store {
                op,
                key,
                flags,
                exptime,
                value,
                unique,
                noreply,
            } => {
                let cas = unique
                    .as_ref()
                    .map_or(String::new(), |u| format!(" {}", unique_for(u, key, last)));
                format!(
                    "{op} {key} {flags} {exptime} {}{cas}{}\r\n{value}\r\n",
                    value.len(),
                    nr(*noreply)
                )
            }
            Cmd::Get { op, exptime, keys } => {
                let e = exptime.map_or(String::new(), |e| format!(" {e}"));
                format!("{op}{e} {}\r\n", keys.join(" "))
            }
            Cmd::Delete { key, noreply } => format!("delete {key}{}\r\n", nr(*noreply)),
            Cmd::Arith {
                op,
                key,
                delta,
                noreply,
            } => format!("{op} {key} {delta}{}\r\n", nr(*noreply)),
            Cmd::Touch {
                key,
                exptime,
                noreply,
            } => format!("touch {key} {exptime}{}\r\n", nr(*noreply)),
            Cmd::Verbosity { level, noreply } => format!("verbosity {level}{}\r\n", nr(*noreply)),
            Cmd::FlushAll { noreply } => format!("flush_all{}\r\n", nr(*noreply)),
            Cmd::Meta {
                op,
                key,
                data,
                flags,
            } => {
                let mut line = format!("{op} {key}");
                if let Some(d) = data {
                    line += &format!(" {}", d.len());
                }
                for f in flags {
                    match f {
                        Flag::Word(w) => line += &format!(" {w}"),
                        Flag::Cas(u) => line += &format!(" C{}", unique_for(u, key, last)),
                    }
                }
                line += "\r\n";
                if let Some(d) = data {
                    line += &format!("{d}\r\n");
                }
                line
            }
            Cmd::Mn => "mn\r\n".to_string(),
            Cmd::Odd(l) => l.clone(),
        }
        .into_bytes()
    }

    /// `MN` replies the command itself gets (the one after it is the test's).
    fn mn_replies(&self) -> usize {
        match self {
            Cmd::Mn => 1,
            Cmd::Odd(l) if l.starts_with("mn") => 1,
            _ => 0,
        }
    }

    /// The key of a one-key command.
    fn key(&self) -> Option<&'static str> {
        match self {
            Cmd::Store { key, .. }
            | Cmd::Delete { key, .. }
            | Cmd::Arith { key, .. }
            | Cmd::Touch { key, .. }
            | Cmd::Meta { key, .. } => Some(key),
            _ => None,
        }
    }

    /// Keys whose expiry the command may change without a new value. In Nessie that is a
    /// write, so a new unique; memcached keeps the unique (docs/frontends.md, `gat`): the
    /// uniques either server returned before are forgotten.
    fn touched(&self) -> Vec<&'static str> {
        match self {
            Cmd::Touch { key, .. } => vec![key],
            Cmd::Get {
                exptime: Some(_),
                keys,
                ..
            } => keys.clone(),
            Cmd::Meta {
                op: "mg",
                key,
                flags,
                ..
            } if flags
                .iter()
                .any(|f| matches!(f, Flag::Word(w) if w.starts_with('T'))) =>
            {
                vec![key]
            }
            Cmd::Odd(l) if ["touch ", "gat"].iter().any(|c| l.starts_with(c)) => KEYS.to_vec(),
            _ => Vec::new(),
        }
    }

    /// The keys whose number the command may make shorter (see [`unpad`]).
    fn counted(&self) -> Vec<&'static str> {
        match self {
            Cmd::Arith { key, .. } | Cmd::Meta { op: "ma", key, .. } => vec![key],
            Cmd::Odd(l) if ["incr ", "decr ", "ma "].iter().any(|c| l.starts_with(c)) => {
                KEYS.to_vec()
            }
            _ => Vec::new(),
        }
    }
}

/// A key, mostly the first ones: commands meet each other's keys more often.
fn key() -> impl Strategy<Value = &'static str> {
    prop_oneof![3 => Just(KEYS[0]), 2 => Just(KEYS[1]), 1 => Just(KEYS[2])]
}

/// An expiry time, mostly one that keeps the item.
fn exptime() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => select(&EXPTIMES[..2]),
        1 => select(&EXPTIMES[2..]),
    ]
}

/// `noreply` (or not), a command in four.
fn noreply() -> impl Strategy<Value = bool> {
    proptest::bool::weighted(0.25)
}

fn unique() -> impl Strategy<Value = Unique> {
    prop_oneof![
        4 => Just(Unique::Last),
        1 => select(BOGUS_UNIQUES).prop_map(Unique::Bogus),
    ]
}

fn word(w: impl Into<String>) -> Flag {
    Flag::Word(w.into())
}

/// `(flag, wanted)` pairs: the wanted ones.
fn chosen(pairs: Vec<(Flag, bool)>) -> Vec<Flag> {
    pairs
        .into_iter()
        .filter(|(_, on)| *on)
        .map(|(f, _)| f)
        .collect()
}

/// `mg` flags, in any order. `t` only without `T`: 1.6.18 reports the old TTL when `t` comes
/// first (docs/frontends.md).
fn mg_flags() -> impl Strategy<Value = Vec<Flag>> {
    (any::<[bool; 8]>(), proptest::option::of(exptime()))
        .prop_map(|(on, touch)| {
            let mut f = chosen(vec![
                (word("v"), on[0]),
                (word("f"), on[1]),
                (word("s"), on[2]),
                (word("k"), on[3]),
                (word("c"), on[4]),
                (word("q"), on[5]),
                (word("t"), on[6] && touch.is_none()),
                (word("O17"), on[7]),
            ]);
            f.extend(touch.map(|t| word(format!("T{t}"))));
            f
        })
        .prop_shuffle()
}

/// `ms` flags, in any order. `I` (invalidate) is refused by Nessie (docs/frontends.md).
fn ms_flags() -> impl Strategy<Value = Vec<Flag>> {
    (
        any::<[bool; 4]>(),
        proptest::option::of(select(FLAGS)),
        proptest::option::of(exptime()),
        proptest::option::of(select(&["E", "A", "P", "R", "S"][..])),
        proptest::option::of(unique()),
    )
        .prop_map(|(on, flags, ttl, mode, cas)| {
            let mut f = chosen(vec![
                (word("q"), on[0]),
                (word("c"), on[1]),
                (word("k"), on[2]),
                (word("O9"), on[3]),
            ]);
            f.extend(flags.map(|x| word(format!("F{x}"))));
            f.extend(ttl.map(|t| word(format!("T{t}"))));
            f.extend(mode.map(|m| word(format!("M{m}"))));
            f.extend(cas.map(Flag::Cas));
            f
        })
        .prop_shuffle()
}

/// `md` flags. No `q`: 1.6.18 still answers `NF` under it, Nessie follows protocol.txt and
/// does not (docs/frontends.md).
fn md_flags() -> impl Strategy<Value = Vec<Flag>> {
    (any::<[bool; 2]>(), proptest::option::of(unique()))
        .prop_map(|(on, cas)| {
            let mut f = chosen(vec![(word("k"), on[0]), (word("O3"), on[1])]);
            f.extend(cas.map(Flag::Cas));
            f
        })
        .prop_shuffle()
}

/// `ma` flags, in any order. No `T`: memcached sets it on the item it read, which is not the
/// one stored when the new number is written to a new item (it is longer, or the old one is
/// still referenced), so the TTL is kept or not by chance (docs/frontends.md). `t` only
/// without `N` (1.6.18 reports the TTL from before `N` when `t` comes first;
/// docs/frontends.md), and no `q` with `N` (on a miss 1.6.18 answers a created item under
/// `q`, later memcached and Nessie do not; docs/frontends.md).
fn ma_flags() -> impl Strategy<Value = Vec<Flag>> {
    (
        any::<[bool; 6]>(),
        proptest::option::of(exptime()),
        proptest::option::of(select(&["0", "3", "18446744073709551615"][..])),
        proptest::option::of(select(&["0", "1", "5", "18446744073709551615"][..])),
        proptest::option::of(select(&["I", "+", "D", "-"][..])),
        proptest::option::of(unique()),
    )
        .prop_map(|(on, vivify, initial, delta, mode, cas)| {
            let mut f = chosen(vec![
                (word("q"), on[0] && vivify.is_none()),
                (word("v"), on[1]),
                (word("t"), on[2] && vivify.is_none()),
                (word("c"), on[3]),
                (word("k"), on[4]),
                (word("O5"), on[5]),
            ]);
            f.extend(vivify.map(|t| word(format!("N{t}"))));
            f.extend(initial.map(|j| word(format!("J{j}"))));
            f.extend(delta.map(|d| word(format!("D{d}"))));
            f.extend(mode.map(|m| word(format!("M{m}"))));
            f.extend(cas.map(Flag::Cas));
            f
        })
        .prop_shuffle()
}

fn cmd() -> impl Strategy<Value = Cmd> {
    let store = (
        select(
            &[
                "set", "set", "set", "add", "add", "replace", "append", "prepend",
            ][..],
        ),
        key(),
        select(FLAGS),
        exptime(),
        select(VALUES),
        noreply(),
    )
        .prop_map(|(op, key, flags, exptime, value, noreply)| Cmd::Store {
            op,
            key,
            flags,
            exptime,
            value,
            unique: None,
            noreply,
        });
    let cas = (
        key(),
        select(FLAGS),
        exptime(),
        select(VALUES),
        unique(),
        noreply(),
    )
        .prop_map(|(key, flags, exptime, value, u, noreply)| Cmd::Store {
            op: "cas",
            key,
            flags,
            exptime,
            value,
            unique: Some(u),
            noreply,
        });
    let keys = || proptest::collection::vec(key(), 1..=3);
    let get = (select(&["get", "gets", "gets"][..]), keys()).prop_map(|(op, keys)| Cmd::Get {
        op,
        exptime: None,
        keys,
    });
    let gat =
        (select(&["gat", "gats"][..]), exptime(), keys()).prop_map(|(op, e, keys)| Cmd::Get {
            op,
            exptime: Some(e),
            keys,
        });
    let delete = (key(), noreply()).prop_map(|(key, noreply)| Cmd::Delete { key, noreply });
    let arith = (
        select(&["incr", "decr"][..]),
        key(),
        prop_oneof![3 => select(&DELTAS[..4]), 1 => select(&DELTAS[4..])],
        noreply(),
    )
        .prop_map(|(op, key, delta, noreply)| Cmd::Arith {
            op,
            key,
            delta,
            noreply,
        });
    let touch = (key(), exptime(), noreply()).prop_map(|(key, exptime, noreply)| Cmd::Touch {
        key,
        exptime,
        noreply,
    });
    let admin = prop_oneof![
        (0..=1u32, noreply()).prop_map(|(level, noreply)| Cmd::Verbosity { level, noreply }),
        noreply().prop_map(|noreply| Cmd::FlushAll { noreply }),
        Just(Cmd::Mn),
    ];
    let meta = |op: &'static str, flags: BoxedStrategy<Vec<Flag>>| {
        (key(), flags).prop_map(move |(key, flags)| Cmd::Meta {
            op,
            key,
            data: None,
            flags,
        })
    };
    let ms = (key(), select(VALUES), ms_flags()).prop_map(|(key, d, flags)| Cmd::Meta {
        op: "ms",
        key,
        data: Some(d),
        flags,
    });
    prop_oneof![
        10 => store,
        4 => cas,
        5 => get,
        2 => gat,
        3 => delete,
        4 => arith,
        2 => touch,
        1 => admin,
        4 => meta("mg", mg_flags().boxed()),
        4 => ms,
        2 => meta("md", md_flags().boxed()),
        3 => meta("ma", ma_flags().boxed()),
        2 => select(odd_lines()).prop_map(Cmd::Odd),
    ]
}

/// A case: a `set` of each key, mostly (so that the commands after meet items more often
/// than misses), then 1 to [`MAX_COMMANDS`] generated commands.
fn steps() -> impl Strategy<Value = Vec<Step>> {
    let preset = (
        0..NODES,
        select(FLAGS),
        select(&EXPTIMES[..2]),
        select(VALUES),
    );
    let presets = [(); KEYS.len()].map(|_| proptest::option::weighted(0.75, preset.clone()));
    let cmds = proptest::collection::vec(
        (0..NODES, cmd()).prop_map(|(node, cmd)| Step { node, cmd }),
        1..=MAX_COMMANDS,
    );
    (presets, cmds).prop_map(|(presets, cmds)| {
        let sets = KEYS.iter().zip(presets).filter_map(|(&key, p)| {
            let (node, flags, exptime, value) = p?;
            let cmd = Cmd::Store {
                op: "set",
                key,
                flags,
                exptime,
                value,
                unique: None,
                noreply: false,
            };
            Some(Step { node, cmd })
        });
        sets.chain(cmds).collect()
    })
}

/// A piece of a reply: a line, or a data block (`VALUE`, `VA`) with its `\r\n`.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Line(Vec<u8>),
    Data(Vec<u8>),
}

fn joined(pieces: &[Piece]) -> Vec<u8> {
    pieces
        .iter()
        .flat_map(|p| match p {
            Piece::Line(b) | Piece::Data(b) => b.clone(),
        })
        .collect()
}

/// The length of the data block that follows a reply `line`, if one does.
fn data_len(line: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(line).ok()?;
    let w: Vec<&str> = text.split_whitespace().collect();
    match *w.first()? {
        "VALUE" => w.get(3)?.parse().ok(),
        "VA" => w.get(1)?.parse().ok(),
        _ => None,
    }
}

/// A memcached text connection.
struct Conn {
    r: BufReader<TcpStream>,
}

impl Conn {
    fn connect(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("the server listens");
        s.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            r: BufReader::new(s),
        }
    }

    /// Send `req` and `mn`, and read the reply up to the `MN` that answers the `mn` (after
    /// `own_mn` that `req` gets itself).
    fn roundtrip(&mut self, req: &[u8], own_mn: usize) -> Result<Vec<Piece>, String> {
        let mut bytes = req.to_vec();
        bytes.extend_from_slice(b"mn\r\n");
        self.send(&bytes)?;
        self.reply(own_mn)
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.r
            .get_mut()
            .write_all(bytes)
            .map_err(|e| format!("send: {e}"))
    }

    /// The reply to one request followed by `mn`, up to the `MN` that answers the `mn` (after
    /// `own_mn` that the request gets itself).
    fn reply(&mut self, own_mn: usize) -> Result<Vec<Piece>, String> {
        let mut pieces = Vec::new();
        let mut mns = 0;
        let mut total = 0;
        loop {
            let mut line = Vec::new();
            match self.r.read_until(b'\n', &mut line) {
                Ok(0) => return Err(format!("connection closed after {:?}", joined(&pieces))),
                Ok(_) => {}
                Err(e) => return Err(format!("no reply ({e}) after {:?}", joined(&pieces))),
            }
            if line == b"MN\r\n" {
                if mns == own_mn {
                    return Ok(pieces);
                }
                mns += 1;
            }
            let data = data_len(&line);
            total += line.len();
            pieces.push(Piece::Line(line));
            if let Some(n) = data {
                let mut block = vec![0u8; n + 2];
                self.r
                    .read_exact(&mut block)
                    .map_err(|e| format!("data block of {n} bytes: {e}"))?;
                total += block.len();
                pieces.push(Piece::Data(block));
            }
            if total > MAX_REPLY {
                return Err(format!("a reply of more than {MAX_REPLY} bytes"));
            }
        }
    }
}

/// The reply with what may differ by design replaced: uniques (`VALUE`'s fifth word, a meta
/// reply's `c` flag) and positive TTLs (a meta reply's `t` flag).
fn normalised(pieces: &[Piece]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        match p {
            Piece::Data(d) => out.extend_from_slice(d),
            Piece::Line(l) => out.extend_from_slice(&normalised_line(l)),
        }
    }
    out
}

fn normalised_line(line: &[u8]) -> Vec<u8> {
    let Some(body) = line
        .strip_suffix(b"\r\n")
        .and_then(|b| std::str::from_utf8(b).ok())
    else {
        return line.to_vec();
    };
    let mut w: Vec<String> = body.split(' ').map(str::to_string).collect();
    match w[0].as_str() {
        "VALUE" if w.len() == 5 => w[4] = "<cas>".into(),
        "VA" | "HD" | "EN" | "NF" | "NS" | "EX" => {
            // `VA`'s size is not a flag.
            let first = if w[0] == "VA" { 2 } else { 1 }.min(w.len());
            for f in &mut w[first..] {
                if let Some(rest) = f.strip_prefix('c') {
                    if rest.parse::<u64>().is_ok() {
                        *f = "c<cas>".into();
                    }
                } else if let Some(rest) = f.strip_prefix('t') {
                    if rest.parse::<i64>().is_ok_and(|t| t > 0) {
                        *f = "t<positive>".into();
                    }
                }
            }
        }
        _ => {}
    }
    let mut out = w.join(" ").into_bytes();
    out.extend_from_slice(b"\r\n");
    out
}

/// Note the uniques a reply to `cmd` carries: `gets`/`gats` hits, and a meta command's `c`
/// on success (a `c0` is no unique: Nessie's "unknown").
fn record(cmd: &Cmd, pieces: &[Piece], last: &mut Uniques) {
    for p in pieces {
        let Piece::Line(l) = p else { continue };
        let text = String::from_utf8_lossy(l);
        let w: Vec<&str> = text.split_whitespace().collect();
        match w.first() {
            Some(&"VALUE") if w.len() == 5 => {
                if let Ok(u) = w[4].parse() {
                    last.insert(w[1].to_string(), u);
                }
            }
            Some(&"VA" | &"HD") => {
                let (Some(key), Cmd::Meta { .. }) = (cmd.key(), cmd) else {
                    continue;
                };
                let u = w[1..]
                    .iter()
                    .filter_map(|f| f.strip_prefix('c')?.parse::<u64>().ok())
                    .find(|&u| u != 0);
                if let Some(u) = u {
                    last.insert(key.to_string(), u);
                }
            }
            _ => {}
        }
    }
}

/// memcached writes the result of an `incr`/`decr`/`ma` that is shorter than the number it
/// replaces in place, padded with spaces ("100" decremented is "99 "); Nessie stores the
/// digits only (docs/frontends.md; protocol.txt: clients must not rely on either). So
/// after such a command the padding is taken off memcached's value, its flags and TTL kept
/// (no value generated ends in a space, so trailing spaces are padding): true if it was.
fn unpad(mc: &mut Conn, key: &str) -> Result<bool, String> {
    let reply = mc.roundtrip(format!("mg {key} v f t\r\n").as_bytes(), 0)?;
    let [Piece::Line(head), Piece::Data(data)] = &reply[..] else {
        return Ok(false);
    };
    let data = &data[..data.len() - 2];
    if !data.ends_with(b" ") {
        return Ok(false);
    }
    let head = String::from_utf8_lossy(head);
    let flag = |c: char| {
        head.split_whitespace()
            .skip(2)
            .find_map(|f| f.strip_prefix(c)?.parse::<i64>().ok())
            .unwrap_or(0)
    };
    // `t-1`: no expiry, `T0`.
    let (flags, ttl) = (flag('f'), flag('t').max(0));
    let digits = data.trim_ascii_end();
    let mut req = format!("ms {key} {} F{flags} T{ttl}\r\n", digits.len()).into_bytes();
    req.extend_from_slice(digits);
    req.extend_from_slice(b"\r\n");
    let stored = mc.roundtrip(&req, 0)?;
    if stored != [Piece::Line(b"HD\r\n".to_vec())] {
        return Err(format!(
            "memcached's padding could not be taken off: {:?}",
            joined(&stored).escape_ascii().to_string()
        ));
    }
    Ok(true)
}

/// Both servers, started once for every case.
struct Servers {
    memcached: u16,
    nessie: u16,
    _memcached: Peer,
    _cluster: Cluster,
}

impl Servers {
    fn start() -> Servers {
        let nessie = free_port_range(NODES);
        let cluster = Cluster::up(
            "mc-differential",
            NODES,
            "shm",
            // Pipelined sequences run their gets and sets with operations in flight.
            &[
                "--no-etcd",
                "--memcached-port",
                &nessie.to_string(),
                "--frontend-inflight",
                "8",
            ],
        );
        let (peer, port) = Peer::memcached();
        // Move memcached's cas counter past the bogus uniques (its first write gets 1).
        let mut c = Conn::connect(port);
        for _ in 0..4 {
            c.roundtrip(b"set warmup 0 0 1\r\nx\r\n", 0).unwrap();
        }
        Servers {
            memcached: port,
            nessie,
            _memcached: peer,
            _cluster: cluster,
        }
    }
}

fn show(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

/// Run `steps` on memcached (its port) and on Nessie (a port per node) from an empty store;
/// `Err`: the transcript up to the first difference.
fn run_case(memcached: u16, nodes: &[u16], steps: &[Step]) -> Result<(), TestCaseError> {
    let mut mc = Conn::connect(memcached);
    let mut nessie: Vec<Conn> = nodes.iter().map(|&p| Conn::connect(p)).collect();
    for (c, name) in [(&mut mc, "memcached"), (&mut nessie[0], "nessie")] {
        let r = c.roundtrip(b"flush_all\r\n", 0);
        if r != Ok(vec![Piece::Line(b"OK\r\n".to_vec())]) {
            return Err(TestCaseError::fail(format!("{name}: flush_all: {r:?}")));
        }
    }
    // [memcached, Nessie]
    let mut last: [Uniques; 2] = Default::default();
    let mut transcript = String::new();
    for step in steps {
        let reqs = [step.cmd.render(&last[0]), step.cmd.render(&last[1])];
        let own = step.cmd.mn_replies();
        let replies = [
            mc.roundtrip(&reqs[0], own),
            nessie[step.node as usize].roundtrip(&reqs[1], own),
        ];
        transcript += &format!("> {}", show(&reqs[0]));
        if reqs[1] != reqs[0] {
            transcript += &format!("   (to Nessie: {})", show(&reqs[1]));
        }
        transcript += &format!("   [node {}]\n", step.node);
        let [mc_reply, ne_reply] = match replies {
            [Ok(a), Ok(b)] => [a, b],
            [a, b] => {
                return Err(TestCaseError::fail(format!(
                    "{transcript}  memcached: {a:?}\n  nessie:    {b:?}"
                )))
            }
        };
        let (a, b) = (normalised(&mc_reply), normalised(&ne_reply));
        transcript += &format!("  memcached: {}\n", show(&joined(&mc_reply)));
        transcript += &format!("  nessie:    {}\n", show(&joined(&ne_reply)));
        if a != b {
            return Err(TestCaseError::fail(format!(
                "the replies differ (after normalising uniques and TTLs):\n{transcript}"
            )));
        }
        for key in step.cmd.touched() {
            last[0].remove(key);
            last[1].remove(key);
        }
        record(&step.cmd, &mc_reply, &mut last[0]);
        record(&step.cmd, &ne_reply, &mut last[1]);
        for key in step.cmd.counted() {
            match unpad(&mut mc, key) {
                // The rewrite gave memcached's item a new unique.
                Ok(true) => {
                    last[0].remove(key);
                    last[1].remove(key);
                    transcript += "  (memcached's padding taken off)\n";
                }
                Ok(false) => {}
                Err(e) => return Err(TestCaseError::fail(format!("{transcript}{e}"))),
            }
        }
    }
    Ok(())
}

/// [`run_case`] with every request (each followed by `mn`) sent at once to memcached and to
/// node 0, then the replies read in turn: the front end serves what one read brought, in
/// order. A `cas` meant to match cannot know its unique before the replies come, so each
/// gets a bogus one; a sequence that changes a number (memcached pads it, see [`unpad`])
/// is run one request at a time instead.
fn run_pipelined(memcached: u16, node0: u16, steps: &[Step]) -> Result<(), TestCaseError> {
    if steps.iter().any(|s| !s.cmd.counted().is_empty()) {
        return run_case(memcached, &[node0], &steps_on_node0(steps));
    }
    let mut conns = [Conn::connect(memcached), Conn::connect(node0)];
    let none = Uniques::new();
    let mut all = b"flush_all\r\nmn\r\n".to_vec();
    for step in steps {
        all.extend_from_slice(&step.cmd.render(&none));
        all.extend_from_slice(b"mn\r\n");
    }
    let mut transcript = String::from("(pipelined to node 0)\n");
    for c in &mut conns {
        c.send(&all).map_err(TestCaseError::fail)?;
        let flushed = c.reply(0).map_err(TestCaseError::fail)?;
        prop_assert_eq!(flushed, vec![Piece::Line(b"OK\r\n".to_vec())]);
    }
    for step in steps {
        let own = step.cmd.mn_replies();
        let [mc_reply, ne_reply] = [conns[0].reply(own), conns[1].reply(own)];
        transcript += &format!("> {}\n", show(&step.cmd.render(&none)));
        let (mc_reply, ne_reply) = match (mc_reply, ne_reply) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                return Err(TestCaseError::fail(format!(
                    "{transcript}  memcached: {a:?}\n  nessie:    {b:?}"
                )))
            }
        };
        transcript += &format!("  memcached: {}\n", show(&joined(&mc_reply)));
        transcript += &format!("  nessie:    {}\n", show(&joined(&ne_reply)));
        if normalised(&mc_reply) != normalised(&ne_reply) {
            return Err(TestCaseError::fail(format!(
                "the replies differ (after normalising uniques and TTLs):\n{transcript}"
            )));
        }
    }
    Ok(())
}

/// `steps`, every one sent to node 0.
fn steps_on_node0(steps: &[Step]) -> Vec<Step> {
    let to0 = |s: &Step| Step {
        node: 0,
        cmd: s.cmd.clone(),
    };
    steps.iter().map(to0).collect()
}

/// Generated command sequences get the same replies from memcached and from Nessie's
/// memcached front end (through any node, or pipelined to one).
#[test]
fn the_memcached_front_end_answers_as_memcached() {
    let servers = Servers::start();
    let nodes: Vec<u16> = (0..NODES).map(|k| servers.nessie + k).collect();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let ran = std::cell::Cell::new(0usize);
    let strategy = (steps(), proptest::bool::weighted(0.3));
    let result = runner.run(&strategy, |(steps, pipelined)| {
        ran.set(ran.get() + steps.len());
        match pipelined {
            true => run_pipelined(servers.memcached, nodes[0], &steps),
            false => run_case(servers.memcached, &nodes, &steps),
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(
        ran.get() >= cases as usize,
        "every case ran its commands: {}",
        ran.get()
    );
}

/// The comparison catches a difference: memcached against itself (one server behind both
/// sides, so each command runs twice) agrees on commands that can be repeated, and fails
/// on an `add`, stored the first time and not the second.
#[test]
fn a_different_reply_fails_the_comparison() {
    let (_mc, port) = Peer::memcached();
    let step = |line: &str| Step {
        node: 0,
        cmd: Cmd::Odd(line.to_string()),
    };
    let repeatable = [step("set a 0 0 1\r\nx\r\n"), step("get a\r\n")];
    assert!(run_case(port, &[port], &repeatable).is_ok());
    let once = [step("add z 0 0 1\r\nx\r\n")];
    let e = run_case(port, &[port], &once).expect_err("STORED and NOT_STORED differ");
    assert!(e.to_string().contains("NOT_STORED"), "{e}");
}
