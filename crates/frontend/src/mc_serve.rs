//! Serving the memcached text protocol on one connection: requests parsed from the stream
//! ([`crate::memcache`]), executed with a store client the [`Backend`] lends, replies written
//! back. Pipelined: every whole request in the buffer is served before the replies are
//! written, in one write. Bounded: a request line is at most `MAX_LINE_LEN`, a data block at
//! most [`Limits::max_data`] (a larger one is read and thrown away, and answered as memcached
//! does), and replies are written out whenever they pass [`FLUSH_AT`].
//!
//! What is served: `get` (multi-key), `set`, `delete`, `version`, `verbosity`, `stats`,
//! `quit`. The commands that are conditional or read-modify-write (`gets`, `gat`, `gats`,
//! `add`, `replace`, `append`, `prepend`, `cas`, `incr`, `decr`, `touch`) need a
//! compare-and-set write the store does not offer yet, and `flush_all` a key scan: they get a
//! `SERVER_ERROR` naming the command, and the connection stays usable. `delete` answers
//! `DELETED` or `NOT_FOUND` from a read just before the delete: a racing writer can make that
//! word wrong, never the data.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nessie_protocols::{Error, KvClient};

use crate::item;
use crate::memcache::{encode_value, parse_request, take_data, Request, StoreOp};

/// Replies are written out once this many bytes are waiting (a multi-key get of large values
/// would otherwise buffer them all).
pub const FLUSH_AT: usize = 1 << 20;

/// Where a connection gets its store client.
pub trait Backend: Send + Sync {
    /// Run `f` with a client of the store (waiting for one to be free).
    fn with_client(&self, f: &mut dyn FnMut(&mut dyn KvClient));
}

/// Run `f` with one of `backend`'s clients, and return what it returned.
pub fn run_with<T>(backend: &dyn Backend, mut f: impl FnMut(&mut dyn KvClient) -> T) -> T {
    let mut r = None;
    backend.with_client(&mut |c| r = Some(f(c)));
    r.expect("the backend ran the operation")
}

/// Limits of one front end.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest key: memcached's 250 or the cluster's key limit, whichever is smaller.
    pub max_key: usize,
    /// Largest data block: the cluster's value limit less the item header.
    pub max_data: usize,
}

/// Counters shared by a front end's connections (`stats`).
#[derive(Debug, Default)]
pub struct Counters {
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
    pub cmd_get: AtomicU64,
    pub cmd_set: AtomicU64,
    pub get_hits: AtomicU64,
    pub get_misses: AtomicU64,
    pub delete_hits: AtomicU64,
    pub delete_misses: AtomicU64,
    /// When the front end started (Unix seconds).
    pub started: AtomicU64,
}

/// The memcached protocol version we speak, first in the version string: clients
/// (libmemcached among them) read the server's version to decide what it supports.
pub const PROTOCOL_VERSION: &str = "1.6.0";

/// `VERSION 1.6.0-nessie-<ours>`.
pub fn version_line() -> String {
    format!(
        "VERSION {PROTOCOL_VERSION}-nessie-{}\r\n",
        env!("CARGO_PKG_VERSION")
    )
}

/// Why the conditional and read-modify-write commands are not served yet.
const CAS_NEEDED: &str = "needs compare-and-set, which the store does not offer yet";

/// Unix seconds now.
pub fn unix_now() -> u64 {
    unix_now_ms() / 1000
}

/// Unix milliseconds now.
pub fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the connection loop does after a batch of requests.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Next {
    /// Read more bytes.
    Read,
    /// Write what is pending and close (`quit`, or a stream that cannot be framed).
    Close,
}

/// One connection's state between reads.
struct Conn<'a> {
    backend: &'a dyn Backend,
    limits: Limits,
    counters: &'a Counters,
    /// Bytes received and not yet consumed.
    inbuf: Vec<u8>,
    /// Replies not yet written.
    out: Vec<u8>,
    /// Bytes of an oversize data block (and its `\r\n`) still to be thrown away.
    skip: usize,
    /// Scratch space for a value read from or written to the store.
    scratch: Vec<u8>,
}

/// Serve `stream` until the client quits or closes it, or an I/O error. `counters` are
/// shared with the front end's other connections.
pub fn serve<S: Read + Write>(
    stream: &mut S,
    backend: &dyn Backend,
    limits: Limits,
    counters: &Counters,
) -> std::io::Result<()> {
    let mut c = Conn {
        backend,
        limits,
        counters,
        inbuf: Vec::new(),
        out: Vec::new(),
        skip: 0,
        scratch: Vec::new(),
    };
    crate::session::run(stream, &mut c)
}

impl crate::session::Session for Conn<'_> {
    fn inbuf(&mut self) -> &mut Vec<u8> {
        &mut self.inbuf
    }

    fn out(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    fn serve_buffered(&mut self, stream: &mut dyn Write) -> std::io::Result<bool> {
        Conn::serve_buffered(self, stream).map(|n| n == Next::Close)
    }
}

impl Conn<'_> {
    /// Serve every whole request in the buffer; replies go to `out`, written to `stream` when
    /// they pass [`FLUSH_AT`].
    fn serve_buffered(&mut self, stream: &mut dyn Write) -> std::io::Result<Next> {
        let mut at = 0;
        let next = loop {
            if self.out.len() >= FLUSH_AT {
                stream.write_all(&self.out)?;
                self.out.clear();
            }
            if self.skip > 0 {
                let n = self.skip.min(self.inbuf.len() - at);
                self.skip -= n;
                at += n;
                if self.skip > 0 {
                    break Next::Read;
                }
            }
            match self.one(at) {
                Step::Took(n) => at += n,
                Step::More => break Next::Read,
                Step::Close => break Next::Close,
            }
        };
        self.inbuf.drain(..at);
        Ok(next)
    }

    /// Serve the request at `inbuf[at..]`.
    fn one(&mut self, at: usize) -> Step {
        let buf = &self.inbuf[at..];
        let (req, line) = match parse_request(buf) {
            Ok(Some(r)) => r,
            Ok(None) => return Step::More,
            Err(e) => {
                self.out.extend_from_slice(e.reply());
                if e.closes_connection() {
                    return Step::Close;
                }
                // The line is whole (only an overlong line is not): drop it.
                let nl = buf
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(buf.len(), |p| p + 1);
                return Step::Took(nl);
            }
        };
        match req {
            Request::Store {
                op,
                key,
                flags,
                exptime,
                len,
                noreply,
                ..
            } => {
                if len > self.limits.max_data {
                    self.out
                        .extend_from_slice(b"SERVER_ERROR object too large for cache\r\n");
                    self.skip = len.saturating_add(2);
                    return Step::Took(line);
                }
                let data = match take_data(&buf[line..], len) {
                    Ok(Some((d, n))) => (d, n),
                    Ok(None) => return Step::More,
                    Err(e) => {
                        self.out.extend_from_slice(e.reply());
                        return Step::Took(line + len + 2);
                    }
                };
                let key = key.to_vec();
                let value = data.0.to_vec();
                let taken = line + data.1;
                self.store(op, &key, flags, exptime, &value, noreply);
                Step::Took(taken)
            }
            Request::Quit => Step::Close,
            req => {
                let owned = OwnedRequest::from(&req);
                self.execute(owned);
                Step::Took(line)
            }
        }
    }

    fn store(
        &mut self,
        op: StoreOp,
        key: &[u8],
        flags: u32,
        exptime: i64,
        data: &[u8],
        noreply: bool,
    ) {
        self.counters.cmd_set.fetch_add(1, Ordering::Relaxed);
        if op != StoreOp::Set {
            let name = format!("{op:?}").to_lowercase();
            return self.unsupported(&name, CAS_NEEDED, noreply);
        }
        if key.len() > self.limits.max_key {
            return self.reply(b"CLIENT_ERROR bad command line format\r\n", false);
        }
        let now = unix_now_ms();
        let r = match item::expires_at(exptime, now) {
            // Expired on arrival: memcached stores it and nobody can read it.
            None => self.with(|c| c.delete(key)),
            Some(expires) => {
                let mut v = std::mem::take(&mut self.scratch);
                item::encode(&mut v, flags, expires, data);
                let r = self.with(|c| c.put(key, &v));
                self.scratch = v;
                r
            }
        };
        match r {
            Ok(()) => self.reply(b"STORED\r\n", noreply),
            Err(e) => self.store_error(&e),
        }
    }

    fn execute(&mut self, req: OwnedRequest) {
        match req {
            OwnedRequest::Get {
                keys,
                with_cas: false,
                touch: None,
            } => self.get(&keys),
            OwnedRequest::Get {
                with_cas, touch, ..
            } => {
                let name = match (with_cas, touch.is_some()) {
                    (true, true) => "gats",
                    (false, true) => "gat",
                    _ => "gets",
                };
                self.unsupported(name, CAS_NEEDED, false)
            }
            OwnedRequest::Delete { key, noreply } => self.delete(&key, noreply),
            OwnedRequest::Unsupported { name, noreply } => {
                self.unsupported(name, CAS_NEEDED, noreply)
            }
            OwnedRequest::FlushAll { noreply } => self.unsupported(
                "flush_all",
                "needs a key scan, which the store does not offer yet",
                noreply,
            ),
            OwnedRequest::Version => {
                self.out.extend_from_slice(version_line().as_bytes());
            }
            OwnedRequest::Verbosity { noreply } => self.reply(b"OK\r\n", noreply),
            OwnedRequest::Stats { general: true, .. } => self.stats(),
            // Sub-statistics of memcached's slab allocator: we have none of their items.
            OwnedRequest::Stats {
                general: false,
                known: true,
            } => self.out.extend_from_slice(b"END\r\n"),
            OwnedRequest::Stats {
                general: false,
                known: false,
            } => self.out.extend_from_slice(b"ERROR\r\n"),
        }
    }

    fn get(&mut self, keys: &[Vec<u8>]) {
        let now = unix_now_ms();
        let mut v = std::mem::take(&mut self.scratch);
        for key in keys {
            self.counters.cmd_get.fetch_add(1, Ordering::Relaxed);
            if key.len() > self.limits.max_key {
                self.out
                    .extend_from_slice(b"CLIENT_ERROR bad command line format\r\n");
                self.scratch = v;
                return;
            }
            match self.with(|c| c.get_into(key, &mut v)) {
                Ok(true) => match item::decode(&v, now) {
                    Some(it) => {
                        self.counters.get_hits.fetch_add(1, Ordering::Relaxed);
                        encode_value(&mut self.out, key, it.flags, it.data, None);
                    }
                    None => {
                        self.counters.get_misses.fetch_add(1, Ordering::Relaxed);
                    }
                },
                Ok(false) => {
                    self.counters.get_misses.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.scratch = v;
                    return self.server_error(&e);
                }
            }
        }
        self.scratch = v;
        self.out.extend_from_slice(b"END\r\n");
    }

    fn delete(&mut self, key: &[u8], noreply: bool) {
        if key.len() > self.limits.max_key {
            return self.reply(b"CLIENT_ERROR bad command line format\r\n", false);
        }
        let now = unix_now_ms();
        let mut v = std::mem::take(&mut self.scratch);
        let found = self.with(|c| c.get_into(key, &mut v));
        let live = matches!(found, Ok(true)) && item::decode(&v, now).is_some();
        self.scratch = v;
        if let Err(e) = found {
            return self.server_error(&e);
        }
        match self.with(|c| c.delete(key)) {
            Ok(()) if live => {
                self.counters.delete_hits.fetch_add(1, Ordering::Relaxed);
                self.reply(b"DELETED\r\n", noreply)
            }
            Ok(()) => {
                self.counters.delete_misses.fetch_add(1, Ordering::Relaxed);
                self.reply(b"NOT_FOUND\r\n", noreply)
            }
            Err(e) => self.server_error(&e),
        }
    }

    fn stats(&mut self) {
        let c = self.counters;
        let now = unix_now();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let lines = [
            ("pid", std::process::id() as u64),
            ("uptime", now.saturating_sub(get(&c.started))),
            ("time", now),
            ("curr_connections", get(&c.curr_connections)),
            ("total_connections", get(&c.total_connections)),
            ("cmd_get", get(&c.cmd_get)),
            ("cmd_set", get(&c.cmd_set)),
            ("get_hits", get(&c.get_hits)),
            ("get_misses", get(&c.get_misses)),
            ("delete_hits", get(&c.delete_hits)),
            ("delete_misses", get(&c.delete_misses)),
        ];
        let v = format!(
            "STAT version {PROTOCOL_VERSION}-nessie-{}\r\n",
            env!("CARGO_PKG_VERSION")
        );
        for (name, value) in lines {
            self.out
                .extend_from_slice(format!("STAT {name} {value}\r\n").as_bytes());
        }
        self.out.extend_from_slice(v.as_bytes());
        self.out.extend_from_slice(b"END\r\n");
    }

    fn with<T>(&self, f: impl FnMut(&mut dyn KvClient) -> T) -> T {
        run_with(self.backend, f)
    }

    fn reply(&mut self, line: &[u8], noreply: bool) {
        if !noreply {
            self.out.extend_from_slice(line);
        }
    }

    /// A command not served yet: a `SERVER_ERROR` naming it, unless the client asked for no
    /// reply (a client that sent `noreply` reads nothing back, and an answer would be taken
    /// for the next command's; memcached answers a refused `add … noreply` with silence too).
    fn unsupported(&mut self, name: &str, why: &str, noreply: bool) {
        if noreply {
            tracing::debug!(command = name, "not served yet; noreply, so not answered");
            return;
        }
        let line = format!("SERVER_ERROR {name} {why}\r\n");
        self.out.extend_from_slice(line.as_bytes());
    }

    /// A store error on a write: memcached's own words where there are some.
    fn store_error(&mut self, e: &Error) {
        match e {
            Error::DataTableFull { .. } | Error::IndexFull { .. } => self
                .out
                .extend_from_slice(b"SERVER_ERROR out of memory storing object\r\n"),
            e => self.server_error(e),
        }
    }

    fn server_error(&mut self, e: &Error) {
        let msg: String = e.to_string().chars().filter(|c| !c.is_control()).collect();
        self.out
            .extend_from_slice(format!("SERVER_ERROR {msg}\r\n").as_bytes());
    }
}

/// What serving one request did with the buffer.
enum Step {
    /// It took this many bytes.
    Took(usize),
    /// It needs more bytes.
    More,
    Close,
}

/// A request that owns its keys (the parsed one borrows the input buffer).
enum OwnedRequest {
    Get {
        keys: Vec<Vec<u8>>,
        with_cas: bool,
        touch: Option<i64>,
    },
    Delete {
        key: Vec<u8>,
        noreply: bool,
    },
    Unsupported {
        name: &'static str,
        noreply: bool,
    },
    FlushAll {
        noreply: bool,
    },
    Version,
    Verbosity {
        noreply: bool,
    },
    Stats {
        general: bool,
        /// A sub-statistic memcached knows (`items`, `slabs`, `sizes`, `settings`, `conns`).
        known: bool,
    },
}

impl From<&Request<'_>> for OwnedRequest {
    fn from(r: &Request<'_>) -> Self {
        match r {
            Request::Get {
                keys,
                with_cas,
                touch,
            } => OwnedRequest::Get {
                keys: keys.iter().map(|k| k.to_vec()).collect(),
                with_cas: *with_cas,
                touch: *touch,
            },
            Request::Delete { key, noreply } => OwnedRequest::Delete {
                key: key.to_vec(),
                noreply: *noreply,
            },
            Request::Arith { incr, noreply, .. } => OwnedRequest::Unsupported {
                name: if *incr { "incr" } else { "decr" },
                noreply: *noreply,
            },
            Request::Touch { noreply, .. } => OwnedRequest::Unsupported {
                name: "touch",
                noreply: *noreply,
            },
            Request::FlushAll { noreply, .. } => OwnedRequest::FlushAll { noreply: *noreply },
            Request::Version => OwnedRequest::Version,
            Request::Verbosity { noreply } => OwnedRequest::Verbosity { noreply: *noreply },
            Request::Stats { arg } => OwnedRequest::Stats {
                general: arg.is_none(),
                known: arg.is_some_and(|a| {
                    [&b"items"[..], b"slabs", b"sizes", b"settings", b"conns"].contains(&a)
                }),
            },
            Request::Store { .. } | Request::Quit => unreachable!("served by the caller"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{MapBackend, Pipe};

    const LIMITS: Limits = Limits {
        max_key: 250,
        max_data: 2000,
    };

    /// What the server answers to `input`, fed `chunk` bytes at a time.
    fn session(backend: &MapBackend, input: &[u8], chunk: usize) -> String {
        let mut p = Pipe {
            input: input.to_vec(),
            at: 0,
            chunk,
            output: Vec::new(),
        };
        serve(&mut p, backend, LIMITS, &Counters::default()).unwrap();
        String::from_utf8(p.output).unwrap()
    }

    #[test]
    fn set_get_delete_pipelined_in_any_chunking() {
        let input = b"set a 5 0 3\r\nabc\r\nset b 0 0 0 noreply\r\n\r\nget a b c\r\n\
                      delete a\r\ndelete a\r\ndelete b noreply\r\nget a b\r\nversion\r\n";
        let want = format!(
            "STORED\r\nVALUE a 5 3\r\nabc\r\nVALUE b 0 0\r\n\r\nEND\r\nDELETED\r\nNOT_FOUND\r\nEND\r\n{}",
            version_line()
        );
        for chunk in [1, 2, 7, 4096] {
            let b = MapBackend::default();
            assert_eq!(session(&b, input, chunk), want, "chunks of {chunk}");
        }
    }

    #[test]
    fn expired_items_are_absent() {
        let b = MapBackend::default();
        let out = session(
            &b,
            b"set a 0 -1 1\r\nx\r\nget a\r\nset p 0 1 1\r\ny\r\nget p\r\n",
            64,
        );
        assert_eq!(
            out,
            "STORED\r\nEND\r\nSTORED\r\nVALUE p 0 1\r\ny\r\nEND\r\n"
        );
        // An item whose time has passed reads as absent.
        let mut v = Vec::new();
        item::encode(&mut v, 0, unix_now_ms() - 1, b"old");
        b.0.lock().unwrap().0.insert(b"o".to_vec(), (v, 1));
        assert_eq!(
            session(&b, b"get o\r\ndelete o\r\n", 64),
            "END\r\nNOT_FOUND\r\n"
        );
    }

    #[test]
    fn oversize_values_and_bad_input_keep_the_connection_usable() {
        let b = MapBackend::default();
        let big = vec![b'x'; 2001];
        let mut input = b"set big 0 0 2001\r\n".to_vec();
        input.extend_from_slice(&big);
        input.extend_from_slice(b"\r\nset k 0 0 2\r\nabcd\r\nbogus\r\nset full 0 0 1500\r\n");
        input.extend_from_slice(&[b'y'; 1500]);
        input.extend_from_slice(
            b"\r\nget big k full\r\nincr k 1\r\ngets k\r\nflush_all\r\nquit\r\nget k\r\n",
        );
        let out = session(&b, &input, 100);
        // As memcached 1.6 answers: a bad chunk swallows its declared length and the two bytes
        // after it, and what is left of the line ("\r\n") is an empty command.
        let want = "SERVER_ERROR object too large for cache\r\n\
                    CLIENT_ERROR bad data chunk\r\n\
                    ERROR\r\n\
                    ERROR\r\n\
                    SERVER_ERROR out of memory storing object\r\n\
                    END\r\n\
                    SERVER_ERROR incr needs compare-and-set, which the store does not offer yet\r\n\
                    SERVER_ERROR gets needs compare-and-set, which the store does not offer yet\r\n\
                    SERVER_ERROR flush_all needs a key scan, which the store does not offer yet\r\n";
        assert_eq!(out, want, "nothing after quit is served");
        assert!(b.0.lock().unwrap().0.is_empty(), "nothing was stored");
    }

    /// A client that sent `noreply` reads nothing back: an answer would be taken for the next
    /// command's (pymemcache sends `add` with noreply by default).
    #[test]
    fn unsupported_commands_sent_with_noreply_are_not_answered() {
        let b = MapBackend::default();
        let out = session(
            &b,
            b"add k 0 0 1 noreply\r\nx\r\nincr k 1 noreply\r\nflush_all noreply\r\nget k\r\n",
            64,
        );
        assert_eq!(out, "END\r\n");
    }

    #[test]
    fn an_overlong_line_closes_the_connection() {
        let b = MapBackend::default();
        let mut input = b"get ".to_vec();
        input.extend(std::iter::repeat_n(
            b'k',
            crate::memcache::MAX_LINE_LEN + 10,
        ));
        let out = session(&b, &input, 4096);
        assert_eq!(out, "CLIENT_ERROR line too long\r\n");
    }

    #[test]
    fn stats_count_what_was_served() {
        let b = MapBackend::default();
        let out = session(
            &b,
            b"set a 0 0 1\r\n1\r\nget a b\r\nstats\r\nstats items\r\nstats foo\r\n",
            64,
        );
        for line in [
            "STAT cmd_get 2\r\n",
            "STAT cmd_set 1\r\n",
            "STAT get_hits 1\r\n",
            "STAT get_misses 1\r\n",
        ] {
            assert!(out.contains(line), "{line:?} in {out}");
        }
        assert!(out.ends_with("END\r\nEND\r\nERROR\r\n"), "{out}");
    }
}
