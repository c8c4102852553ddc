//! The Redis commands that depend on a key's current state: SET with NX/XX/GET/KEEPTTL,
//! SETNX, GETSET, GETDEL, GETEX, INCR/DECR/INCRBY/DECRBY, APPEND, EXPIRE and its kin, PERSIST,
//! and DEL's exact count. Each is a read-modify-write over the store's conditional writes
//! ([`crate::rmw`]), so a concurrent write is never lost; the argument checks and error texts
//! are Redis 7's (checked against redis-server 7.0).

use nessie_protocols::Error;

use super::Conn;
use crate::rmw::{self, Change, Seen};
use crate::serve::unix_now_ms;

const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
const OVERFLOW: &str = "ERR increment or decrement would overflow";

/// A reply decided by a read-modify-write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Reply {
    Ok,
    Null,
    Bulk(Vec<u8>),
    Int(i64),
    Err(String),
}

/// How an expiry argument counts.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Unit {
    /// EX: seconds from now.
    Ex,
    /// PX: milliseconds from now.
    Px,
    /// EXAT: Unix seconds.
    ExAt,
    /// PXAT: Unix milliseconds.
    PxAt,
}

/// The options of SET (`set`) or GETEX, as Redis's `parseExtendedStringArgumentsOrReply`
/// takes them: each may repeat, but not with one that excludes it.
#[derive(Clone, Debug, Default)]
struct Opts<'a> {
    nx: bool,
    xx: bool,
    get: bool,
    keepttl: bool,
    persist: bool,
    expire: Option<(Unit, &'a [u8])>,
}

/// `Err(())`: Redis's syntax error.
fn parse_opts<'a>(args: &[&'a [u8]], set: bool) -> Result<Opts<'a>, ()> {
    let mut o = Opts::default();
    let mut i = 0;
    while i < args.len() {
        let opt = args[i].to_ascii_uppercase();
        let next = args.get(i + 1);
        let unit = match opt.as_slice() {
            b"EX" => Some(Unit::Ex),
            b"PX" => Some(Unit::Px),
            b"EXAT" => Some(Unit::ExAt),
            b"PXAT" => Some(Unit::PxAt),
            _ => None,
        };
        match (opt.as_slice(), unit) {
            (b"NX", _) if set && !o.xx => o.nx = true,
            (b"XX", _) if set && !o.nx => o.xx = true,
            (b"GET", _) if set => o.get = true,
            (b"KEEPTTL", _) if set && !o.persist && o.expire.is_none() => o.keepttl = true,
            (b"PERSIST", _) if !set && !o.keepttl && o.expire.is_none() => o.persist = true,
            (_, Some(u)) if !o.keepttl && !o.persist && o.expire.is_none_or(|(e, _)| e == u) => {
                let Some(n) = next else { return Err(()) };
                o.expire = Some((u, n));
                i += 1;
            }
            _ => return Err(()),
        }
        i += 1;
    }
    Ok(o)
}

/// An integer as Redis reads one (`string2ll`): no sign but `-`, no leading zeros or spaces.
pub(super) fn redis_int(arg: &[u8]) -> Option<i64> {
    let digits = arg.strip_prefix(b"-").unwrap_or(arg);
    let canonical = match digits {
        [b'0'] => arg.len() == 1,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !canonical {
        return None;
    }
    std::str::from_utf8(arg).ok()?.parse().ok()
}

/// When an expiry argument of SET, SETEX, PSETEX or GETEX expires, in Unix ms (Redis's
/// `getExpireMillisecondsOrReply`): positive, and not overflowing once made absolute.
fn expire_at(unit: Unit, arg: &[u8], now: u64, cmd: &str) -> Result<u64, String> {
    let n = redis_int(arg).ok_or_else(|| NOT_INTEGER.to_string())?;
    let invalid = || format!("ERR invalid expire time in '{cmd}' command");
    if n <= 0 {
        return Err(invalid());
    }
    let ms = match unit {
        Unit::Ex | Unit::ExAt => n.checked_mul(1000).ok_or_else(invalid)?,
        Unit::Px | Unit::PxAt => n,
    };
    let at = match unit {
        Unit::Ex | Unit::Px => ms.checked_add(now as i64).ok_or_else(invalid)?,
        Unit::ExAt | Unit::PxAt => ms,
    };
    Ok(at as u64)
}

/// SETEX/PSETEX's expiry.
pub(super) fn setex_at(name: &str, arg: &[u8], now: u64) -> Result<u64, String> {
    let unit = if name == "setex" { Unit::Ex } else { Unit::Px };
    expire_at(unit, arg, now, name)
}

/// An expiry (Unix ms, 0 = never) as a stored item's: `None` if already past.
fn live_until(at: u64, now: u64) -> Option<u64> {
    (at == 0 || at > now).then_some(at)
}

/// EXPIRE's options.
#[derive(Copy, Clone, Debug, Default)]
struct ExpireOpts {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
}

/// EXPIRE's options, checked as Redis 7 checks them (each known, then compatible).
fn parse_expire_opts(args: &[&[u8]]) -> Result<ExpireOpts, String> {
    let mut o = ExpireOpts::default();
    for a in args {
        match a.to_ascii_uppercase().as_slice() {
            b"NX" => o.nx = true,
            b"XX" => o.xx = true,
            b"GT" => o.gt = true,
            b"LT" => o.lt = true,
            _ => {
                let a = String::from_utf8_lossy(a);
                return Err(format!("ERR Unsupported option {a}"));
            }
        }
    }
    if o.nx && (o.xx || o.gt || o.lt) {
        return Err("ERR NX and XX, GT or LT options at the same time are not compatible".into());
    }
    if o.gt && o.lt {
        return Err("ERR GT and LT options at the same time are not compatible".into());
    }
    Ok(o)
}

/// When EXPIRE's argument `n` expires, in Unix ms (may be in the past, even negative);
/// `None` if it overflows, as Redis checks.
fn expire_when(name: &str, n: i64, now: u64) -> Option<i64> {
    let ms = match name {
        "expire" | "expireat" => n.checked_mul(1000)?,
        _ => n,
    };
    let base = match name {
        "expire" | "pexpire" => now as i64,
        _ => 0,
    };
    ms.checked_add(base)
}

/// Whether EXPIRE's NX/XX/GT/LT refuse a new expiry `when` over the current one (0: none,
/// which GT and LT take as infinite).
fn expire_refused(o: ExpireOpts, current: u64, when: i64) -> bool {
    let none = current == 0;
    (o.nx && !none)
        || (o.xx && none)
        || (o.gt && (none || when <= current as i64))
        || (o.lt && !none && when >= current as i64)
}

impl Conn<'_> {
    /// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT: 1 if the expiry was set (a time not in the
    /// future removes the key), 0 if the key is absent or an option refused.
    pub(super) fn expire(&mut self, name: &str, rest: &[&[u8]]) {
        let o = match parse_expire_opts(&rest[2..]) {
            Ok(o) => o,
            Err(msg) => return self.enc.error(&mut self.out, &msg),
        };
        let Some(n) = redis_int(rest[1]) else {
            return self.enc.error(&mut self.out, NOT_INTEGER);
        };
        let now = unix_now_ms();
        let Some(when) = expire_when(name, n, now) else {
            let msg = format!("ERR invalid expire time in '{name}' command");
            return self.enc.error(&mut self.out, &msg);
        };
        let r = self.rmw(rest[0], now, |s| match s.item {
            None => Change::Keep(Reply::Int(0)),
            Some(it) if expire_refused(o, it.expires, when) => Change::Keep(Reply::Int(0)),
            Some(_) if when <= now as i64 => Change::Delete(Reply::Int(1)),
            Some(it) if it.expires == when as u64 => Change::Keep(Reply::Int(1)),
            Some(it) => Change::store(it.flags, Some(when as u64), &[it.data], Reply::Int(1)),
        });
        self.answer(r);
    }
}

impl Conn<'_> {
    /// SET with options; a SET without NX, XX, GET or KEEPTTL is a plain write.
    pub(super) fn set(&mut self, rest: &[&[u8]]) {
        let Ok(o) = parse_opts(&rest[2..], true) else {
            return self.enc.error(&mut self.out, "ERR syntax error");
        };
        let plain = !(o.nx || o.xx || o.get || o.keepttl);
        // A plain SET without an expiry needs no clock (`put` compares only an expiry).
        let now = match plain && o.expire.is_none() {
            true => 0,
            false => unix_now_ms(),
        };
        let at = match o.expire.map(|(u, a)| expire_at(u, a, now, "set")) {
            Some(Err(msg)) => return self.enc.error(&mut self.out, &msg),
            Some(Ok(at)) => at,
            None => 0,
        };
        let (key, value) = (&rest[0], &rest[1]);
        if plain {
            return self.store(key, value, at, now);
        }
        self.counters
            .cmd_set
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let r = self.rmw(key, now, |s| {
            let old = s.item.map(|i| i.data.to_vec());
            let not_set = if o.get {
                old.clone().map_or(Reply::Null, Reply::Bulk)
            } else {
                Reply::Null
            };
            if (o.nx && old.is_some()) || (o.xx && old.is_none()) {
                return Change::Keep(not_set);
            }
            let set = if o.get { not_set } else { Reply::Ok };
            let at = match s.item {
                Some(i) if o.keepttl => i.expires,
                _ => at,
            };
            Change::store(0, live_until(at, now), &[value], set)
        });
        self.answer(r);
    }

    pub(super) fn setnx(&mut self, rest: &[&[u8]]) {
        let now = unix_now_ms();
        let r = self.rmw(rest[0], now, |s| match s.item {
            Some(_) => Change::Keep(Reply::Int(0)),
            None => Change::store(0, Some(0), &[rest[1]], Reply::Int(1)),
        });
        self.answer(r);
    }

    /// GETSET: the old value; the new one has no expiry, as after a SET.
    pub(super) fn getset(&mut self, rest: &[&[u8]]) {
        let r = self.rmw(rest[0], unix_now_ms(), |s| {
            let old = s.item.map_or(Reply::Null, |i| Reply::Bulk(i.data.to_vec()));
            Change::store(0, Some(0), &[rest[1]], old)
        });
        self.answer(r);
    }

    pub(super) fn getdel(&mut self, key: &[u8]) {
        // An expired item is removed too (by its version); the reply is nil.
        let r = self.rmw(key, unix_now_ms(), |s| {
            Change::Delete(s.item.map_or(Reply::Null, |i| Reply::Bulk(i.data.to_vec())))
        });
        self.answer(r);
    }

    /// GETEX: the value, its expiry changed (EX, PX, EXAT, PXAT) or removed (PERSIST). As in
    /// Redis, an absent key is nil before the expiry argument is looked at.
    pub(super) fn getex(&mut self, rest: &[&[u8]]) {
        let Ok(o) = parse_opts(&rest[1..], false) else {
            return self.enc.error(&mut self.out, "ERR syntax error");
        };
        let now = unix_now_ms();
        let r = self.rmw(rest[0], now, |s| {
            let Some(it) = s.item else {
                return Change::Keep(Reply::Null);
            };
            let at = match o.expire.map(|(u, a)| expire_at(u, a, now, "getex")) {
                Some(Err(msg)) => return Change::Keep(Reply::Err(msg)),
                Some(Ok(at)) => at,
                None if o.persist => 0,
                None => it.expires,
            };
            let value = Reply::Bulk(it.data.to_vec());
            if at == it.expires {
                return Change::Keep(value);
            }
            Change::store(it.flags, live_until(at, now), &[it.data], value)
        });
        self.answer(r);
    }

    /// INCR, DECR, INCRBY, DECRBY: the value (0 if absent) must be a 64-bit integer; its
    /// expiry is kept.
    pub(super) fn incr(&mut self, name: &str, rest: &[&[u8]]) {
        let delta = match (name, rest.get(1)) {
            ("incr", _) => Some(1),
            ("decr", _) => Some(-1),
            ("incrby", Some(d)) => redis_int(d),
            (_, Some(d)) => match redis_int(d) {
                Some(i64::MIN) => {
                    return self
                        .enc
                        .error(&mut self.out, "ERR decrement would overflow")
                }
                d => d.map(|d| -d),
            },
            (_, None) => None,
        };
        let Some(delta) = delta else {
            return self.enc.error(&mut self.out, NOT_INTEGER);
        };
        let r = self.rmw(rest[0], unix_now_ms(), |s| {
            let (flags, at, old) = match s.item {
                None => (0, 0, Some(0)),
                Some(it) => (it.flags, it.expires, redis_int(it.data)),
            };
            let Some(old) = old else {
                return Change::Keep(Reply::Err(NOT_INTEGER.into()));
            };
            let Some(n) = old.checked_add(delta) else {
                return Change::Keep(Reply::Err(OVERFLOW.into()));
            };
            Change::store(flags, Some(at), &[n.to_string().as_bytes()], Reply::Int(n))
        });
        self.answer(r);
    }

    /// APPEND: the new length; the expiry is kept.
    pub(super) fn append(&mut self, rest: &[&[u8]]) {
        let max = self.limits.max_value;
        let r = self.rmw(rest[0], unix_now_ms(), |s| {
            let (flags, at, old) = s
                .item
                .map_or((0, 0, &[][..]), |i| (i.flags, i.expires, i.data));
            let len = old.len() + rest[1].len();
            if len > max {
                let msg = format!(
                    "ERR string exceeds maximum allowed size (this cluster's limit of {max} bytes)"
                );
                return Change::Keep(Reply::Err(msg));
            }
            Change::store(flags, Some(at), &[old, rest[1]], Reply::Int(len as i64))
        });
        self.answer(r);
    }

    pub(super) fn persist(&mut self, key: &[u8]) {
        let r = self.rmw(key, unix_now_ms(), |s| match s.item {
            Some(it) if it.expires != 0 => {
                Change::store(it.flags, Some(0), &[it.data], Reply::Int(1))
            }
            _ => Change::Keep(Reply::Int(0)),
        });
        self.answer(r);
    }

    /// DEL and UNLINK: each key removed by the version read, so the count is exact. In a
    /// mode without conditional writes, a read and a plain delete per key (the count may be
    /// wrong under a racing writer, never the data).
    pub(super) fn del(&mut self, keys: &[&[u8]]) {
        let now = unix_now_ms();
        let mut n = 0;
        for k in keys {
            if self.cannot_exist(k) {
                continue;
            }
            // The header tells whether the item is live: a large item's other chunks stay
            // unread.
            let r = match self.rmw_head(k, now, |s| Change::Delete(s.item.is_some())) {
                Err(Error::Unsupported(_)) => self.plain_delete(k),
                r => r,
            };
            match r {
                Ok(Some(found)) => n += found as i64,
                Ok(None) => return self.contended(),
                Err(e) => return self.store_error(&e),
            }
        }
        self.enc.integer(&mut self.out, n);
    }

    fn plain_delete(&mut self, key: &[u8]) -> Result<Option<bool>, Error> {
        let found = self.read(key)?;
        self.with(|c| c.delete(key))?;
        Ok(Some(found.is_some()))
    }

    /// A read-modify-write of `key` ([`rmw::rmw`]) with one of the backend's clients.
    pub(super) fn rmw<T>(
        &mut self,
        key: &[u8],
        now: u64,
        f: impl FnMut(Seen<'_>) -> Change<T>,
    ) -> Result<Option<T>, Error> {
        self.rmw_reading(key, now, usize::MAX, f)
    }

    /// [`Self::rmw`] deciding from the item's header alone ([`rmw::rmw_head`]).
    pub(super) fn rmw_head<T>(
        &mut self,
        key: &[u8],
        now: u64,
        f: impl FnMut(Seen<'_>) -> Change<T>,
    ) -> Result<Option<T>, Error> {
        self.rmw_reading(key, now, crate::item::HEADER_LEN, f)
    }

    fn rmw_reading<T>(
        &mut self,
        key: &[u8],
        now: u64,
        head: usize,
        mut f: impl FnMut(Seen<'_>) -> Change<T>,
    ) -> Result<Option<T>, Error> {
        if key.len() > self.limits.max_key {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max: self.limits.max_key as u32,
            });
        }
        let mut buf = std::mem::take(&mut self.scratch);
        let r = self.with(|c| rmw::rmw_reading(c, key, now, &mut buf, head, &mut f));
        self.scratch = buf;
        r
    }

    fn contended(&mut self) {
        let msg = format!("ERR {}", rmw::contended_msg());
        self.enc.error(&mut self.out, &msg);
    }

    /// The reply of a read-modify-write, or why there is none.
    pub(super) fn answer(&mut self, r: Result<Option<Reply>, Error>) {
        let (e, out) = (self.enc, &mut self.out);
        match r {
            Ok(Some(Reply::Ok)) => e.simple(out, "OK"),
            Ok(Some(Reply::Null)) => e.null(out),
            Ok(Some(Reply::Bulk(v))) => e.bulk(out, &v),
            Ok(Some(Reply::Int(n))) => e.integer(out, n),
            Ok(Some(Reply::Err(msg))) => e.error(out, &msg),
            Ok(None) => self.contended(),
            Err(err) => self.store_error(&err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item;
    use crate::redis::serve::{serve, RespLimits};
    use crate::serve::{Backend, Counters};
    use crate::testing::{MapBackend, MapClient, OneClient, Pipe, PlainClient, RacingClient};
    use nessie_protocols::KvClient;

    const LIMITS: RespLimits = RespLimits {
        max_key: 32,
        max_value: 100,
    };

    /// The replies to `list`, as one string.
    fn run(b: &dyn Backend, list: &[&[&str]]) -> String {
        let mut input = Vec::new();
        for words in list {
            input.extend_from_slice(format!("*{}\r\n", words.len()).as_bytes());
            for w in *words {
                input.extend_from_slice(format!("${}\r\n{w}\r\n", w.len()).as_bytes());
            }
        }
        let mut p = Pipe::new(&input, 7);
        serve(&mut p, b, LIMITS, &Counters::default(), 1).unwrap();
        String::from_utf8(p.output).unwrap()
    }

    /// The stored item of `key`: (flags, expires, data).
    fn stored(b: &MapBackend, key: &[u8]) -> Option<(u32, u64, Vec<u8>)> {
        let m = b.0.lock().unwrap();
        let it = item::decode(&m.0.get(key)?.0, 0).unwrap();
        Some((it.flags, it.expires, it.data.to_vec()))
    }

    fn put_item(m: &mut MapClient, key: &[u8], flags: u32, expires: u64, data: &[u8]) {
        let mut v = Vec::new();
        item::encode(&mut v, flags, expires, data);
        m.put(key, &v).unwrap();
    }

    #[test]
    fn set_with_conditions() {
        let b = MapBackend::default();
        let out = run(
            &b,
            &[
                &["SET", "k", "v", "NX", "GET"],
                &["SET", "k", "w", "NX", "GET"],
                &["SET", "k", "w", "NX"],
                &["SET", "k", "w", "XX", "GET"],
                &["SET", "nope", "w", "XX"],
                &["SET", "nope", "w", "XX", "GET"],
                &["SET", "k", "x", "GET", "GET"],
                &["SET", "k", "w", "NX", "XX"],
                &["SET", "k", "w", "KEEPTTL", "EX", "10"],
                &["SET", "k", "w", "EX", "10", "PX", "10"],
                &["SET", "k", "w", "EX", "abc"],
                &["SET", "k", "w", "EX", "9223372036854775807"],
                &["GET", "k"],
            ],
        );
        let want = "$-1\r\n$1\r\nv\r\n$-1\r\n$1\r\nv\r\n$-1\r\n$-1\r\n$1\r\nw\r\n\
                    -ERR syntax error\r\n-ERR syntax error\r\n-ERR syntax error\r\n\
                    -ERR value is not an integer or out of range\r\n\
                    -ERR invalid expire time in 'set' command\r\n$1\r\nx\r\n";
        assert_eq!(out, want);
        assert_eq!(stored(&b, b"nope"), None);
    }

    #[test]
    fn set_keepttl_and_expiry_in_the_past() {
        let b = MapBackend::default();
        let at = unix_now_ms() + 100_000;
        put_item(&mut b.0.lock().unwrap(), b"k", 0, at, b"v");
        let out = run(
            &b,
            &[
                &["SET", "k", "w", "KEEPTTL", "XX"],
                &["SET", "k", "x", "PXAT", "1", "GET"],
                &["EXISTS", "k"],
                &["SET", "n", "x", "NX", "EXAT", "1"],
                &["EXISTS", "n"],
            ],
        );
        assert_eq!(out, "+OK\r\n$1\r\nw\r\n:0\r\n+OK\r\n:0\r\n");
        put_item(&mut b.0.lock().unwrap(), b"k", 0, at, b"v");
        assert_eq!(
            run(&b, &[&["SET", "k", "w", "KEEPTTL", "GET"]]),
            "$1\r\nv\r\n"
        );
        assert_eq!(stored(&b, b"k"), Some((0, at, b"w".to_vec())), "TTL kept");
        assert_eq!(run(&b, &[&["SET", "k", "y", "GET"]]), "$1\r\nw\r\n");
        assert_eq!(stored(&b, b"k"), Some((0, 0, b"y".to_vec())), "TTL removed");
    }

    #[test]
    fn setnx_getset_getdel() {
        let b = MapBackend::default();
        let out = run(
            &b,
            &[
                &["SETNX", "k", "a"],
                &["SETNX", "k", "b"],
                &["GETSET", "k", "c"],
                &["GETSET", "new", "d"],
                &["GETDEL", "k"],
                &["GETDEL", "k"],
                &["GET", "new"],
                &["SETNX", "k"],
                &["GETDEL"],
            ],
        );
        let want = ":1\r\n:0\r\n$1\r\na\r\n$-1\r\n$1\r\nc\r\n$-1\r\n$1\r\nd\r\n\
                    -ERR wrong number of arguments for 'setnx' command\r\n\
                    -ERR wrong number of arguments for 'getdel' command\r\n";
        assert_eq!(out, want);
    }

    #[test]
    fn getex() {
        let b = MapBackend::default();
        let out = run(
            &b,
            &[
                &["SET", "k", "v"],
                &["GETEX", "k"],
                &["GETEX", "k", "EX", "100"],
                &["TTL", "k"],
                &["GETEX", "k", "PERSIST"],
                &["TTL", "k"],
                &["GETEX", "k", "EX", "0"],
                &["GETEX", "k", "PERSIST", "EX", "10"],
                &["GETEX", "nope", "EX", "abc"],
                &["GETEX", "k", "PXAT", "1"],
                &["EXISTS", "k"],
            ],
        );
        let want = "+OK\r\n$1\r\nv\r\n$1\r\nv\r\n:100\r\n$1\r\nv\r\n:-1\r\n\
                    -ERR invalid expire time in 'getex' command\r\n-ERR syntax error\r\n\
                    $-1\r\n$1\r\nv\r\n:0\r\n";
        assert_eq!(out, want);
    }

    #[test]
    fn counters() {
        let b = MapBackend::default();
        let max = i64::MAX.to_string();
        let min = i64::MIN.to_string();
        let out = run(
            &b,
            &[
                &["INCR", "n"],
                &["INCRBY", "n", "41"],
                &["DECRBY", "n", "2"],
                &["DECR", "n"],
                &["INCRBY", "n", "1.5"],
                &["INCRBY", "n", "01"],
                &["DECRBY", "n", &min],
                &["SET", "m", &max],
                &["INCR", "m"],
                &["SET", "m", &min],
                &["DECR", "m"],
                &["SET", "m", "+1"],
                &["INCR", "m"],
                &["DECR", "fresh"],
                &["INCR"],
            ],
        );
        let not_int = "-ERR value is not an integer or out of range\r\n";
        let over = "-ERR increment or decrement would overflow\r\n";
        let want = format!(
            ":1\r\n:42\r\n:40\r\n:39\r\n{not_int}{not_int}-ERR decrement would overflow\r\n\
             +OK\r\n{over}+OK\r\n{over}+OK\r\n{not_int}:-1\r\n\
             -ERR wrong number of arguments for 'incr' command\r\n"
        );
        assert_eq!(out, want);
        // The expiry and flags (of a memcached item) are kept.
        let at = unix_now_ms() + 100_000;
        put_item(&mut b.0.lock().unwrap(), b"c", 9, at, b"5");
        assert_eq!(run(&b, &[&["INCRBY", "c", "-10"]]), ":-5\r\n");
        assert_eq!(stored(&b, b"c"), Some((9, at, b"-5".to_vec())));
    }

    #[test]
    fn append() {
        let b = MapBackend::default();
        let big = "x".repeat(98);
        let out = run(
            &b,
            &[
                &["APPEND", "k", "ab"],
                &["APPEND", "k", "cd"],
                &["GET", "k"],
                &["APPEND", "k", &big],
                &["APPEND"],
            ],
        );
        let want = ":2\r\n:4\r\n$4\r\nabcd\r\n\
                    -ERR string exceeds maximum allowed size (this cluster's limit of 100 bytes)\r\n\
                    -ERR wrong number of arguments for 'append' command\r\n";
        assert_eq!(out, want);
    }

    #[test]
    fn expire_and_persist() {
        let b = MapBackend::default();
        let out = run(
            &b,
            &[
                &["SET", "k", "v"],
                &["EXPIRE", "k", "100", "XX"],
                &["EXPIRE", "k", "100", "GT"],
                &["EXPIRE", "k", "100", "NX"],
                &["EXPIRE", "k", "50", "GT"],
                &["EXPIRE", "k", "200", "GT"],
                &["EXPIRE", "k", "300", "LT"],
                &["PEXPIRE", "k", "10000", "LT"],
                &["TTL", "k"],
                &["PERSIST", "k"],
                &["PERSIST", "k"],
                &["PERSIST", "nope"],
                &["EXPIRE", "nope", "10"],
                &["EXPIRE", "k", "-1", "GT"],
                &["EXISTS", "k"],
                &["EXPIREAT", "k", "1"],
                &["EXISTS", "k"],
            ],
        );
        let want = "+OK\r\n:0\r\n:0\r\n:1\r\n:0\r\n:1\r\n:0\r\n:1\r\n:10\r\n:1\r\n:0\r\n:0\r\n\
                    :0\r\n:0\r\n:1\r\n:1\r\n:0\r\n";
        assert_eq!(out, want);
        let out = run(
            &b,
            &[
                &["EXPIRE", "k", "20", "NX", "GT"],
                &["EXPIRE", "k", "20", "GT", "LT"],
                &["EXPIRE", "k", "1", "2", "3"],
                &["EXPIRE", "k", "abc"],
                &["EXPIRE", "k", "9223372036854775807"],
                &["PEXPIREAT", "k"],
            ],
        );
        let want = "-ERR NX and XX, GT or LT options at the same time are not compatible\r\n\
                    -ERR GT and LT options at the same time are not compatible\r\n\
                    -ERR Unsupported option 2\r\n\
                    -ERR value is not an integer or out of range\r\n\
                    -ERR invalid expire time in 'expire' command\r\n\
                    -ERR wrong number of arguments for 'pexpireat' command\r\n";
        assert_eq!(out, want);
    }

    /// An expired key is absent to every command, and removed or replaced by its version.
    #[test]
    fn expired_keys_are_absent() {
        let b = MapBackend::default();
        let past = unix_now_ms() - 1;
        for k in ["a", "b", "c", "d", "e", "f", "g"] {
            put_item(&mut b.0.lock().unwrap(), k.as_bytes(), 0, past, b"7");
        }
        let out = run(
            &b,
            &[
                &["SET", "a", "x", "XX"],
                &["SETNX", "b", "x"],
                &["INCR", "c"],
                &["APPEND", "d", "x"],
                &["GETDEL", "e"],
                &["EXPIRE", "f", "10"],
                &["DEL", "g", "a"],
                &["GETSET", "a", "y"],
            ],
        );
        assert_eq!(out, "$-1\r\n:1\r\n:1\r\n:1\r\n$-1\r\n:0\r\n:0\r\n$-1\r\n");
        assert_eq!(stored(&b, b"e"), None);
        assert_eq!(stored(&b, b"g"), None);
    }

    #[test]
    fn del_counts_exactly_and_races_are_not_lost() {
        let race = |m: &mut MapClient| put_item(m, b"n", 0, 0, b"10");
        let b = OneClient(std::sync::Mutex::new(RacingClient::new(
            MapClient::default(),
            1,
            race,
        )));
        let out = run(&b, &[&["SET", "n", "1"], &["INCR", "n"], &["GET", "n"]]);
        assert_eq!(
            out, "+OK\r\n:11\r\n$2\r\n11\r\n",
            "read again after the race"
        );
        let out = run(&b, &[&["SET", "a", "1"], &["DEL", "a", "a", "b"]]);
        assert_eq!(out, "+OK\r\n:1\r\n");
        let b = OneClient(std::sync::Mutex::new(RacingClient::new(
            MapClient::default(),
            usize::MAX,
            race,
        )));
        let out = run(&b, &[&["SET", "n", "1"], &["APPEND", "n", "x"]]);
        let want = format!("+OK\r\n-ERR {}\r\n", rmw::contended_msg());
        assert_eq!(out, want);
    }

    /// In a mode without conditional writes the commands that need them answer why; DEL
    /// still counts (from reads) and the connection stays usable.
    #[test]
    fn a_mode_without_conditional_writes() {
        let b = OneClient(std::sync::Mutex::new(PlainClient::default()));
        let out = run(
            &b,
            &[
                &["SET", "k", "v", "NX"],
                &["INCR", "k"],
                &["SET", "k", "v"],
                &["DEL", "k", "k"],
                &["GET", "k"],
            ],
        );
        let why = "-ERR a versioned read needs conditional writes, which only the client-driven (cd) mode offers\r\n";
        assert_eq!(out, format!("{why}{why}+OK\r\n:1\r\n$-1\r\n"));
    }

    #[test]
    fn integers_as_redis_reads_them() {
        assert_eq!(redis_int(b"0"), Some(0));
        assert_eq!(redis_int(b"-12"), Some(-12));
        assert_eq!(redis_int(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"-0",
            b"01",
            b"+1",
            b" 1",
            b"1 ",
            b"9223372036854775808",
        ] {
            assert_eq!(redis_int(bad), None, "{bad:?}");
        }
    }
}
