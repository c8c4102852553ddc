//! Serving the memcached text protocol on one connection: requests parsed from the stream
//! ([`crate::memcached::proto`]), executed with a store client the [`Backend`] lends, replies written
//! back. Pipelined: every whole request in the buffer is served before the replies are
//! written, in one write. Bounded: a request line is at most `MAX_LINE_LEN`, a data block at
//! most [`Limits::max_data`] (a larger one is read and thrown away, and answered as memcached
//! does), and at most about [`FLUSH_AT`] bytes of replies are held (serving stops there, even
//! part way through a multi-key get, until they are written).
//!
//! What is served: `get`, `gets`, `gat`, `gats` (multi-key), `set`, `add`, `replace`,
//! `append`, `prepend`, `cas`, `incr`, `decr`, `touch`, `delete`, `version`, `verbosity`,
//! `stats`, `quit`, and the meta commands `mn`, `mg`, `ms`, `md`, `ma` (module `meta`). Every
//! command that depends on a key's current state is a read-modify-write over the store's
//! conditional writes ([`crate::rmw`]): it reads the key with its version and writes only if
//! the key is still at that version, else reads again, so a concurrent write is never lost.
//! In a mode without conditional writes they answer `SERVER_ERROR <why>` and the connection
//! stays usable; `delete` then falls back to a read and a plain delete (its
//! `DELETED`/`NOT_FOUND` may be wrong under a racing writer, never the data). `flush_all`
//! deletes every key the store's scan of its index finds ([`crate::keyspace`]); with a delay
//! it is refused.

use std::io::{Read, Write};

use std::sync::atomic::{AtomicU64, Ordering};

use nessie_protocols::{Error, KvClient, Version};

use super::meta::MetaCmd;
use super::proto::{
    binary_refusal, encode_value, parse_request, take_data, Request, StoreOp, ValueHead,
    BINARY_HEADER_LEN, BINARY_REQUEST_MAGIC, VALUE_PREFIX,
};
use crate::rmw::{self, Attempt, Change, Seen, MAX_RMW_ATTEMPTS};
use crate::serve::{unix_now, unix_now_ms, Backend, BatchClient, Counters, FLUSH_AT};
use crate::session::Served;
use crate::{inplace, item};

mod batch;
mod meta;
use meta::MetaReq;

/// Limits of one front end.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest key: memcached's 250 or the cluster's key limit, whichever is smaller.
    pub max_key: usize,
    /// Largest data block: the cluster's value limit less the item header.
    pub max_data: usize,
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

/// What serving one request came to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Step {
    /// It took this many bytes of input.
    Took(usize),
    /// It is not all here yet.
    More,
    /// Its replies reached [`FLUSH_AT`] part way (a multi-key get): it stays in the input,
    /// to go on from where it stopped ([`Conn::resume`]) once they are written.
    Paused,
    /// Close the connection once the replies are written.
    Close,
}

/// Whether a request without a data block was served to its end.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Done {
    Yes,
    /// A multi-key get stopped part way ([`Step::Paused`]).
    Paused,
}

/// One connection's state between reads.
struct Conn<'a> {
    /// The store client of the batch being served, leased at its first use.
    store: BatchClient<'a>,
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
    /// What the last get's `VALUE` line held besides `VALUE ` and the key: where the next
    /// get's value is READ for its data to land right behind its line ([`inplace`]).
    value_line_tail: usize,
    /// Keys of the multi-key get at the head of the input already answered: it paused there,
    /// its replies at [`FLUSH_AT`], and goes on from the next.
    resume: usize,
    /// Gets and sets of this read waiting to run together ([`batch`]): what each answers,
    /// its operation, and (while they run) their results; keys of gets among them.
    queued: Vec<batch::Queued>,
    queued_ops: Vec<crate::serve::Op>,
    queued_done: Vec<Result<crate::serve::Outcome, Error>>,
    queued_gets: usize,
}

/// One connection's memcached session, for an event loop to drive.
pub fn session<'a>(
    backend: &'a dyn Backend,
    limits: Limits,
    counters: &'a Counters,
) -> impl crate::session::Session + 'a {
    Conn {
        store: BatchClient::new(backend),
        limits,
        counters,
        inbuf: Vec::new(),
        out: Vec::new(),
        skip: 0,
        scratch: Vec::new(),
        value_line_tail: 0,
        resume: 0,
        queued: Vec::new(),
        queued_ops: Vec::new(),
        queued_done: Vec::new(),
        queued_gets: 0,
    }
}

/// Serve `stream` until the client quits or closes it, or an I/O error. `counters` are
/// shared with the front end's other connections.
pub fn serve<S: Read + Write>(
    stream: &mut S,
    backend: &dyn Backend,
    limits: Limits,
    counters: &Counters,
) -> std::io::Result<()> {
    let mut c = session(backend, limits, counters);
    crate::session::run(stream, &mut c)
}

crate::session::connection_session!(Conn);

impl Conn<'_> {
    /// Serve the whole requests in the buffer until the replies reach [`FLUSH_AT`].
    fn serve_buffered(&mut self) -> Served {
        let mut at = 0;
        let next = loop {
            if self.out.len() >= FLUSH_AT {
                break Served::Held;
            }
            if self.skip > 0 {
                let n = self.skip.min(self.inbuf.len() - at);
                self.skip -= n;
                at += n;
                if self.skip > 0 {
                    break Served::Read;
                }
            }
            match self.one(at) {
                Step::Took(n) => at += n,
                Step::More => break Served::Read,
                Step::Paused => break Served::Held,
                Step::Close => break Served::Close,
            }
        };
        self.run_queued();
        self.inbuf.drain(..at);
        next
    }

    /// Serve the request at `inbuf[at..]`.
    fn one(&mut self, at: usize) -> Step {
        let buf = &self.inbuf[at..];
        if buf.first() == Some(&BINARY_REQUEST_MAGIC) {
            if buf.len() < BINARY_HEADER_LEN {
                return Step::More;
            }
            self.run_queued();
            let buf = &self.inbuf[at..];
            let refusal = binary_refusal(&buf[..BINARY_HEADER_LEN]);
            self.out.extend_from_slice(&refusal);
            return Step::Close;
        }
        let (req, line) = match parse_request(buf) {
            Ok(Some(r)) => r,
            Ok(None) => return Step::More,
            Err(e) => {
                self.run_queued();
                return self.refused(at, e);
            }
        };
        let len = match &req {
            Request::Store { len, .. } => *len,
            Request::Meta(m) if m.cmd == MetaCmd::Set => m.datalen,
            Request::Meta(m) => {
                let m = MetaReq::new(m, &[]);
                self.run_queued();
                self.meta(m);
                return Step::Took(line);
            }
            Request::Quit => return Step::Close,
            Request::MetaNoop => {
                self.run_queued();
                self.out.extend_from_slice(b"MN\r\n");
                return Step::Took(line);
            }
            req => {
                let owned = OwnedRequest::from(req);
                if let OwnedRequest::Get {
                    keys,
                    with_cas: false,
                    touch: None,
                } = &owned
                {
                    if self.resume == 0 && self.queue_get(keys) {
                        return Step::Took(line);
                    }
                }
                self.run_queued();
                return match self.execute(owned) {
                    Done::Yes => Step::Took(line),
                    Done::Paused => Step::Paused,
                };
            }
        };
        // memcached answers a classic storage command's errors with silence under `noreply`
        // (its client reads nothing back: an answer would be taken for the next command's);
        // a meta command's errors are answered whatever its flags.
        let silent = matches!(req, Request::Store { noreply: true, .. });
        if len > self.limits.max_data {
            self.run_queued();
            self.reply(b"SERVER_ERROR object too large for cache\r\n", silent);
            self.skip = len.saturating_add(2);
            return Step::Took(line);
        }
        let (data, n) = match take_data(&buf[line..], len) {
            Ok(Some(d)) => d,
            Ok(None) => return Step::More,
            Err(e) => {
                self.run_queued();
                self.reply(e.reply(), silent);
                return Step::Took(line + len + 2);
            }
        };
        match req {
            Request::Store {
                op,
                key,
                flags,
                exptime,
                cas,
                noreply,
                ..
            } => {
                let s = StoreReq {
                    op,
                    key: key.to_vec(),
                    flags,
                    exptime,
                    data: data.to_vec(),
                    cas,
                    noreply,
                };
                if !(s.op == StoreOp::Set && self.queue_set(&s)) {
                    self.run_queued();
                    self.store(&s);
                }
            }
            Request::Meta(m) => {
                let m = MetaReq::new(&m, data);
                self.run_queued();
                self.meta(m);
            }
            _ => unreachable!("only storage commands have data"),
        }
        Step::Took(line + n)
    }

    /// Answer a request line that does not parse (at `at` in the input), and drop it.
    fn refused(&mut self, at: usize, e: crate::memcached::proto::ProtoError) -> Step {
        if e.closes_connection() {
            self.out.extend_from_slice(e.reply());
            return Step::Close;
        }
        // The line is whole (only an overlong line is not): drop it, and what follows it of
        // the failed request (an `ms`'s data block).
        let buf = &self.inbuf[at..];
        let nl = buf
            .iter()
            .position(|&b| b == b'\n')
            .map_or(buf.len(), |p| p + 1);
        // As memcached: a known classic command's malformed line that ends in `noreply` gets
        // no `CLIENT_ERROR`; `ERROR` (unknown command, wrong arity) and meta errors are answered.
        let silent =
            e.is_client_error() && crate::memcached::proto::classic_noreply_line(&buf[..nl]);
        self.reply(e.reply(), silent);
        self.skip = e.skip();
        Step::Took(nl)
    }

    /// A key longer than the front end's limit: true if it was refused (answered so unless
    /// `noreply`).
    fn key_too_long(&mut self, key: &[u8], noreply: bool) -> bool {
        let long = key.len() > self.limits.max_key;
        if long {
            self.reply(b"CLIENT_ERROR bad command line format\r\n", noreply);
        }
        long
    }

    fn store(&mut self, s: &StoreReq) {
        self.counters.cmd_set.fetch_add(1, Ordering::Relaxed);
        if self.key_too_long(&s.key, s.noreply) {
            return;
        }
        let now = unix_now_ms();
        let expires = item::expires_at(s.exptime, now);
        if s.op == StoreOp::Set {
            return self.set(s, expires);
        }
        let max = self.limits.max_data;
        let r = self.rmw(&s.key, now, |seen| store_change(s, seen, expires, max));
        self.answer(r, s.noreply);
    }

    /// `set`: no condition, so a plain write.
    fn set(&mut self, s: &StoreReq, expires: Option<u64>) {
        let r = match expires {
            // Expired on arrival: memcached stores it and nobody can read it.
            None => self.with(|c| c.delete(&s.key)),
            Some(expires) => {
                let h = item::header(s.flags, expires);
                let at = item::store_expiry(expires);
                self.with(|c| c.put_parts_expiring(&s.key, &[&h, &s.data], at))
            }
        };
        match r {
            Ok(()) => self.reply(b"STORED\r\n", s.noreply),
            Err(e) => self.fail(&e, s.noreply),
        }
    }

    /// Run a request without a data block. Only a multi-key get can pause.
    fn execute(&mut self, req: OwnedRequest) -> Done {
        match req {
            OwnedRequest::Get {
                keys,
                with_cas: false,
                touch: None,
            } => return self.get(&keys),
            OwnedRequest::Get {
                keys,
                with_cas,
                touch,
            } => return self.get_versioned(&keys, with_cas, touch),
            OwnedRequest::Delete { key, noreply } => self.delete(&key, noreply),
            OwnedRequest::Arith {
                key,
                delta,
                incr,
                noreply,
            } => self.arith(&key, delta, incr, noreply),
            OwnedRequest::Touch {
                key,
                exptime,
                noreply,
            } => self.touch(&key, exptime, noreply),
            OwnedRequest::FlushAll { delay, noreply } => self.flush_all(delay, noreply),
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
        Done::Yes
    }

    /// [`crate::session::pause_before`], with this connection's replies and resume point.
    fn pause_before(&mut self, i: usize, first: usize) -> bool {
        crate::session::pause_before(&self.out, i, first, &mut self.resume)
    }

    fn get(&mut self, keys: &[Vec<u8>]) -> Done {
        let first = std::mem::take(&mut self.resume);
        for (i, key) in keys.iter().enumerate().skip(first) {
            if self.pause_before(i, first) {
                return Done::Paused;
            }
            self.counters.cmd_get.fetch_add(1, Ordering::Relaxed);
            if self.key_too_long(key, false) {
                return Done::Yes;
            }
            // The value is READ straight into the reply (`inplace`), its `VALUE` line guessed
            // as long as the last one but for the key.
            let head = ValueHead(key);
            let guess = VALUE_PREFIX.len() + key.len() + self.value_line_tail;
            let mut out = std::mem::take(&mut self.out);
            let r =
                self.with(|c| inplace::reply_in_place(c, key, &mut out, guess, unix_now_ms, &head));
            self.out = out;
            match r {
                Ok(Some(placed)) => {
                    self.value_line_tail = placed.head_len - VALUE_PREFIX.len() - key.len();
                    self.counters.get_hits.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None) => {
                    self.counters.get_misses.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.server_error(&e);
                    return Done::Yes;
                }
            }
        }
        self.out.extend_from_slice(b"END\r\n");
        Done::Yes
    }

    /// `gets` (`with_cas`, no `touch`), `gat` and `gats` (`touch`: the new exptime).
    fn get_versioned(&mut self, keys: &[Vec<u8>], with_cas: bool, touch: Option<i64>) -> Done {
        let first = std::mem::take(&mut self.resume);
        for (i, key) in keys.iter().enumerate().skip(first) {
            if self.pause_before(i, first) {
                return Done::Paused;
            }
            self.counters.cmd_get.fetch_add(1, Ordering::Relaxed);
            if self.key_too_long(key, false) {
                return Done::Yes;
            }
            let now = unix_now_ms();
            let mut buf = std::mem::take(&mut self.scratch);
            let expires = touch.map(|t| item::expires_at(t, now));
            let r = self.with(|c| read_or_touch(c, key, now, &mut buf, expires, with_cas));
            self.scratch = buf;
            let hit = match r {
                Ok(Some(hit)) => hit,
                Ok(None) => {
                    self.contended();
                    return Done::Yes;
                }
                Err(e) => {
                    self.fail(&e, false);
                    return Done::Yes;
                }
            };
            let Some(h) = hit else {
                self.counters.get_misses.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            self.counters.get_hits.fetch_add(1, Ordering::Relaxed);
            let cas = with_cas.then_some(h.cas);
            encode_value(&mut self.out, key, h.flags, &h.data, cas);
        }
        self.out.extend_from_slice(b"END\r\n");
        Done::Yes
    }

    /// `incr`/`decr`: the value must be a decimal u64; incr wraps at 2^64, decr stops at 0.
    fn arith(&mut self, key: &[u8], delta: u64, incr: bool, noreply: bool) {
        if self.key_too_long(key, noreply) {
            return;
        }
        let r = self.rmw(key, unix_now_ms(), |s| {
            let Some(it) = s.item else {
                return Change::Keep(b"NOT_FOUND\r\n".to_vec());
            };
            let Some(n) = counter_value(it.data) else {
                let e = b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
                return Change::Keep(e.to_vec());
            };
            let n = if incr {
                n.wrapping_add(delta)
            } else {
                n.saturating_sub(delta)
            };
            let digits = n.to_string();
            let reply = format!("{digits}\r\n").into_bytes();
            Change::store(it.flags, Some(it.expires), &[digits.as_bytes()], reply)
        });
        self.answer(r, noreply);
    }

    fn touch(&mut self, key: &[u8], exptime: i64, noreply: bool) {
        if self.key_too_long(key, noreply) {
            return;
        }
        let now = unix_now_ms();
        let expires = item::expires_at(exptime, now);
        let r = self.rmw(key, now, |s| match s.item {
            None => Change::Keep(&b"NOT_FOUND\r\n"[..]),
            Some(it) if Some(it.expires) == expires => Change::Keep(&b"TOUCHED\r\n"[..]),
            Some(it) => Change::store(it.flags, expires, &[it.data], &b"TOUCHED\r\n"[..]),
        });
        self.answer(r, noreply);
    }

    /// `delete`: removes the version it read, so `DELETED`/`NOT_FOUND` is exact. In a mode
    /// without conditional writes, a read and a plain delete (the word may be wrong under a
    /// racing writer, never the data).
    fn delete(&mut self, key: &[u8], noreply: bool) {
        if self.key_too_long(key, noreply) {
            return;
        }
        let now = unix_now_ms();
        // An expired item is removed too (by its version), but it was not found.
        // The header tells whether the item is live: a large item's other chunks stay unread.
        let r = match self.rmw_head(key, now, |s| Change::Delete(s.item.is_some())) {
            Err(Error::Unsupported(_)) => self.plain_delete(key, now),
            r => r,
        };
        let r = r.map(|found| {
            found.map(|found| {
                let (counter, line) = if found {
                    (&self.counters.delete_hits, &b"DELETED\r\n"[..])
                } else {
                    (&self.counters.delete_misses, &b"NOT_FOUND\r\n"[..])
                };
                counter.fetch_add(1, Ordering::Relaxed);
                line
            })
        });
        self.answer(r, noreply);
    }

    /// A read, then a plain delete: whether a live item was there.
    fn plain_delete(&mut self, key: &[u8], now: u64) -> Result<Option<bool>, Error> {
        let mut v = std::mem::take(&mut self.scratch);
        let found = self.with(|c| c.get_into(key, &mut v));
        let live = matches!(found, Ok(true)) && item::decode(&v, now).is_some();
        self.scratch = v;
        found?;
        self.with(|c| c.delete(key))?;
        Ok(Some(live))
    }

    /// A read-modify-write of `key` ([`rmw::rmw`]) with one of the backend's clients.
    fn rmw<T>(
        &mut self,
        key: &[u8],
        now: u64,
        f: impl FnMut(Seen<'_>) -> Change<T>,
    ) -> Result<Option<T>, Error> {
        self.rmw_reading(key, now, usize::MAX, f)
    }

    /// [`Self::rmw`] deciding from the item's header alone ([`rmw::rmw_head`]).
    fn rmw_head<T>(
        &mut self,
        key: &[u8],
        now: u64,
        f: impl FnMut(Seen<'_>) -> Change<T>,
    ) -> Result<Option<T>, Error> {
        self.rmw_reading(key, now, item::HEADER_LEN, f)
    }

    /// [`rmw::rmw_reading`] with this connection's scratch buffer as the read's.
    fn rmw_reading<T>(
        &mut self,
        key: &[u8],
        now: u64,
        head: usize,
        mut f: impl FnMut(Seen<'_>) -> Change<T>,
    ) -> Result<Option<T>, Error> {
        let mut buf = std::mem::take(&mut self.scratch);
        let r = self.with(|c| rmw::rmw_reading(c, key, now, &mut buf, head, &mut f));
        self.scratch = buf;
        r
    }

    /// The reply of a read-modify-write: its line, or why there is none.
    fn answer(&mut self, r: Result<Option<impl AsRef<[u8]>>, Error>, noreply: bool) {
        match r {
            Ok(Some(line)) => self.reply(line.as_ref(), noreply),
            Ok(None) if noreply => tracing::debug!("contended; noreply, so not answered"),
            Ok(None) => self.contended(),
            Err(e) => self.fail(&e, noreply),
        }
    }

    fn contended(&mut self) {
        let line = format!("SERVER_ERROR {}\r\n", rmw::contended_msg());
        self.out.extend_from_slice(line.as_bytes());
    }

    /// A store error, not answered under `noreply`, as memcached answers none then (its
    /// client reads nothing back: an answer would be taken for the next command's).
    fn fail(&mut self, e: &Error, noreply: bool) {
        if noreply {
            tracing::debug!(%e, "failed; noreply, so not answered");
        } else {
            self.store_error(e);
        }
    }
    fn stats(&mut self) {
        let c = self.counters;
        let now = unix_now();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let f = c.figures();
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
            ("reclaimed", get(&c.reclaimed)),
            ("evictions", c.evictions()),
            ("slabs_moved", c.pages_moved()),
            ("curr_items", f.items),
            ("bytes", f.bytes),
            ("limit_maxbytes", f.limit_bytes),
        ];
        // Known only where GETs keep access words: absent rather than a made-up zero.
        let unfetched = c
            .tracks_access()
            .then(|| ("expired_unfetched", get(&c.expired_unfetched)));
        let v = format!(
            "STAT version {PROTOCOL_VERSION}-nessie-{}\r\n",
            env!("CARGO_PKG_VERSION")
        );
        for (name, value) in lines.into_iter().chain(unfetched) {
            self.out
                .extend_from_slice(format!("STAT {name} {value}\r\n").as_bytes());
        }
        self.out.extend_from_slice(v.as_bytes());
        self.out.extend_from_slice(b"END\r\n");
    }

    /// Run `f` with this batch's store client.
    fn with<T>(&mut self, f: impl FnOnce(&mut dyn KvClient) -> T) -> T {
        self.store.with(f)
    }

    fn reply(&mut self, line: &[u8], noreply: bool) {
        if !noreply {
            self.out.extend_from_slice(line);
        }
    }

    /// A command not served yet: a `SERVER_ERROR` naming it, unless the client asked for no
    /// reply (a client that sent `noreply` reads nothing back, and an answer would be taken
    /// for the next command's; memcached answers a refused `add … noreply` with silence too).
    /// `flush_all`: every item deleted now, over the store's scan (`keyspace`). A delay
    /// would need a timer that outlives the connection: refused.
    fn flush_all(&mut self, delay: i64, noreply: bool) {
        if delay > 0 {
            return self.unsupported(
                "flush_all",
                "with a delay is not served (flush_all 0 flushes at once)",
                noreply,
            );
        }
        let r = self
            .with(crate::keyspace::flush)
            .map(|_| Some(&b"OK\r\n"[..]));
        self.answer(r, noreply);
    }

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

/// A storage command with its data block.
struct StoreReq {
    op: StoreOp,
    key: Vec<u8>,
    flags: u32,
    exptime: i64,
    data: Vec<u8>,
    /// `cas`'s unique (0 for the others).
    cas: u64,
    noreply: bool,
}

/// What a conditional storage command does with what it read (`expires`: the new item's
/// expiry, `None` if already past; `max_data`: the largest data an append may make); the
/// answer is the reply line.
fn store_change(
    s: &StoreReq,
    seen: Seen<'_>,
    expires: Option<u64>,
    max_data: usize,
) -> Change<&'static [u8]> {
    const STORED: &[u8] = b"STORED\r\n";
    const NOT_STORED: &[u8] = b"NOT_STORED\r\n";
    let stored = || Change::store(s.flags, expires, &[&s.data], STORED);
    match (s.op, seen.item) {
        (StoreOp::Set, _) => stored(),
        (StoreOp::Add, Some(_)) => Change::Keep(NOT_STORED),
        (StoreOp::Add, None) => stored(),
        (StoreOp::Replace | StoreOp::Append | StoreOp::Prepend, None) => Change::Keep(NOT_STORED),
        (StoreOp::Replace, Some(_)) => stored(),
        (StoreOp::Cas, None) => Change::Keep(b"NOT_FOUND\r\n"),
        (StoreOp::Cas, Some(_)) if seen.version != Some(s.cas) => Change::Keep(b"EXISTS\r\n"),
        (StoreOp::Cas, Some(_)) => stored(),
        // Too large to store: memcached answers so too.
        (_, Some(it)) if it.data.len() + s.data.len() > max_data => Change::Keep(NOT_STORED),
        // The item keeps its flags and expiry; the command's are ignored, as memcached does.
        (StoreOp::Append, Some(it)) => {
            Change::store(it.flags, Some(it.expires), &[it.data, &s.data], STORED)
        }
        (StoreOp::Prepend, Some(it)) => {
            Change::store(it.flags, Some(it.expires), &[&s.data, it.data], STORED)
        }
    }
}

/// The number a value holds for `incr`/`decr`, read as memcached does (`strtoull`): optional
/// leading whitespace and `+`, decimal digits that fit in 64 bits, then the end or whitespace.
fn counter_value(data: &[u8]) -> Option<u64> {
    let start = data.iter().position(|b| !b.is_ascii_whitespace())?;
    let rest = &data[start..];
    let rest = rest.strip_prefix(b"+").unwrap_or(rest);
    let end = rest
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(rest.len());
    if end == 0 || rest.get(end).is_some_and(|b| !b.is_ascii_whitespace()) {
        return None;
    }
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// A hit of `gets`/`gat`/`gats`.
struct Hit {
    flags: u32,
    /// Unix ms, 0 = never (after a touch, the new expiry).
    expires: u64,
    data: Vec<u8>,
    cas: Version,
}

/// `gets` (`expires` = `None`) or `gat`/`gats` (`Some`: the new expiry, `Some(None)` if past)
/// of one key: `Ok(None)` if contended, `Ok(Some(None))` a miss. A touch that changes the
/// item makes a new version; for `gats` (`with_cas`) it is read back, and the touch tried
/// again if the item read back is not the one written.
fn read_or_touch(
    c: &mut dyn KvClient,
    key: &[u8],
    now: u64,
    buf: &mut Vec<u8>,
    expires: Option<Option<u64>>,
    with_cas: bool,
) -> Result<Option<Option<Hit>>, Error> {
    for _ in 0..MAX_RMW_ATTEMPTS {
        let mut written = None;
        let mut f = |s: Seen<'_>| {
            let Some(it) = s.item else {
                return Change::Keep(None);
            };
            let mut hit = Hit {
                flags: it.flags,
                expires: it.expires,
                data: it.data.to_vec(),
                cas: s.version.expect("an item read has a version"),
            };
            match expires {
                Some(e) if e != Some(it.expires) => {
                    // Touched into the past: expires now.
                    hit.expires = e.unwrap_or(now);
                    let ch = Change::store(it.flags, e, &[it.data], Some(hit));
                    if let Change::Put(v, _) = &ch {
                        written = Some(v.clone());
                    }
                    ch
                }
                _ => Change::Keep(Some(hit)),
            }
        };
        let hit = match rmw::attempt(c, key, now, buf, usize::MAX, &mut f)? {
            Attempt::Done(h) => h,
            Attempt::Lost => continue,
        };
        let (Some(written), true) = (written, with_cas) else {
            return Ok(Some(hit));
        };
        let mut h = hit.expect("only an item read is touched");
        match c.get_versioned(key, buf)? {
            Some(v) if *buf == written => {
                h.cas = v;
                return Ok(Some(Some(h)));
            }
            _ => continue,
        }
    }
    Ok(None)
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
    Arith {
        key: Vec<u8>,
        delta: u64,
        incr: bool,
        noreply: bool,
    },
    Touch {
        key: Vec<u8>,
        exptime: i64,
        noreply: bool,
    },
    FlushAll {
        delay: i64,
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
            Request::Arith {
                key,
                delta,
                incr,
                noreply,
            } => OwnedRequest::Arith {
                key: key.to_vec(),
                delta: *delta,
                incr: *incr,
                noreply: *noreply,
            },
            Request::Touch {
                key,
                exptime,
                noreply,
            } => OwnedRequest::Touch {
                key: key.to_vec(),
                exptime: *exptime,
                noreply: *noreply,
            },
            Request::FlushAll { delay, noreply } => OwnedRequest::FlushAll {
                delay: *delay,
                noreply: *noreply,
            },
            Request::Version => OwnedRequest::Version,
            Request::Verbosity { noreply } => OwnedRequest::Verbosity { noreply: *noreply },
            Request::Stats { arg } => OwnedRequest::Stats {
                general: arg.is_none(),
                known: arg.is_some_and(|a| {
                    [&b"items"[..], b"slabs", b"sizes", b"settings", b"conns"].contains(&a)
                }),
            },
            Request::Meta(_) | Request::MetaNoop | Request::Store { .. } | Request::Quit => {
                unreachable!("served by the caller")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{MapBackend, MapClient, OneClient, Pipe, PlainClient, RacingClient};

    const LIMITS: Limits = Limits {
        max_key: 250,
        max_data: 2000,
    };

    /// What the server answers to `input`, fed `chunk` bytes at a time.
    fn session(backend: &dyn Backend, input: &[u8], chunk: usize) -> String {
        let mut p = Pipe::new(input, chunk);
        serve(&mut p, backend, LIMITS, &Counters::default()).unwrap();
        String::from_utf8(p.output).unwrap()
    }

    /// A request in the binary protocol gets a binary "Not supported" response carrying its
    /// opcode and opaque, and the connection closes; text before it is served.
    #[test]
    fn binary_requests_are_refused_in_the_binary_protocol() {
        let b = MapBackend::default();
        let mut input = b"version\r\n".to_vec();
        // A binary GET of "k": magic, opcode 0, key length 1, opaque 0xdeadbeef.
        let mut get = vec![0x80, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0, 0, 1];
        get.extend_from_slice(&0xdead_beef_u32.to_be_bytes());
        get.extend_from_slice(&[0; 8]);
        get.push(b'k');
        input.extend_from_slice(&get);
        input.extend_from_slice(b"version\r\n");
        for chunk in [1, 5, 4096] {
            let mut p = Pipe::new(&input, chunk);
            serve(&mut p, &b, LIMITS, &Counters::default()).unwrap();
            let v = version_line();
            assert!(p.output.starts_with(v.as_bytes()));
            let r = &p.output[v.len()..];
            assert_eq!(r[..2], [0x81, 0x00], "response magic, the request's opcode");
            assert_eq!(u16::from_be_bytes([r[6], r[7]]), 0x0083, "Not supported");
            let body = u32::from_be_bytes(r[8..12].try_into().unwrap()) as usize;
            assert_eq!(r[12..16], 0xdead_beef_u32.to_be_bytes(), "opaque");
            assert_eq!(r.len(), 24 + body, "nothing after it: chunk {chunk}");
        }
    }

    /// A multi-key get whose reply passes the session's limit is answered in parts, the
    /// session never holding much more than the limit, whole and in order, and the connection
    /// goes on after it; so do `gets` and `gat`.
    #[test]
    fn a_get_larger_than_the_reply_limit_is_answered_in_parts() {
        let b = MapBackend::default();
        let value = |k: usize| format!("{k}").repeat(900);
        let mut input = String::new();
        for k in 0..10 {
            input.push_str(&format!("set k{k} {k} 0 900 noreply\r\n{}\r\n", value(k)));
        }
        let keys = 1000; // the most a get may name
        let names: Vec<String> = (0..keys).map(|i| format!("k{}", i % 10)).collect();
        let line = names.join(" ");
        let gets = 2 * FLUSH_AT / (900 * keys) + 1;
        for _ in 0..gets {
            input.push_str(&format!("get {line} nope\r\n"));
        }
        input.push_str(&format!("gets {line}\r\ngat 0 {line}\r\nversion\r\n"));
        let mut p = Pipe::new(input.as_bytes(), 65536);
        serve(&mut p, &b, LIMITS, &Counters::default()).unwrap();
        let out = String::from_utf8(p.output).unwrap();
        let mut want = String::new();
        for _ in 0..gets {
            for i in 0..keys {
                let k = i % 10;
                want.push_str(&format!("VALUE k{k} {k} 900\r\n{}\r\n", value(k)));
            }
            want.push_str("END\r\n");
        }
        assert!(out.starts_with(&want), "get replies differ");
        let rest = &out[want.len()..];
        assert_eq!(rest.matches("VALUE ").count(), 2 * keys, "gets and gat");
        assert_eq!(rest.matches("END\r\n").count(), 2);
        assert!(
            rest.ends_with(&version_line()),
            "{}",
            &rest[rest.len() - 40..]
        );
        assert!(
            p.largest_write < FLUSH_AT + 1000,
            "the session held {} bytes of replies",
            p.largest_write
        );
    }

    /// A store that fails and a key over the cluster's limit (below memcached's 250) are not
    /// answered under `noreply`, as memcached answers nothing then; without it, they are.
    #[test]
    fn failures_under_noreply_are_not_answered() {
        let b = MapBackend::default();
        let long = "k".repeat(9);
        // `MapClient` refuses values over 1000 bytes as a full data table would.
        let v = "v".repeat(1200);
        let input = format!(
            "set {long} 0 0 1 noreply\r\nx\r\ndelete {long} noreply\r\n\
             set f 0 0 1200 noreply\r\n{v}\r\nadd f 0 0 1200 noreply\r\n{v}\r\n\
             set {long} 0 0 1\r\nx\r\nset f 0 0 1200\r\n{v}\r\nget f\r\n"
        );
        let mut p = Pipe::new(input.as_bytes(), 64);
        let limits = Limits {
            max_key: 8,
            ..LIMITS
        };
        serve(&mut p, &b, limits, &Counters::default()).unwrap();
        assert_eq!(
            String::from_utf8(p.output).unwrap(),
            "CLIENT_ERROR bad command line format\r\n\
             SERVER_ERROR out of memory storing object\r\nEND\r\n"
        );
    }

    /// Word counts memcached reads in its own way (checked against 1.6.18): a `gat` naming no
    /// key, `delete`'s usage error (silent under noreply), a lone `noreply` as a key, and a
    /// second word of `verbosity` and `flush_all` ignored.
    #[test]
    fn odd_word_counts_are_answered_as_memcached_answers_them() {
        let b = MapBackend::default();
        let input = b"set a 0 0 1\r\nx\r\ngat 0\r\ngats 0 noreply\r\ndelete a b\r\n\
                      delete a b noreply\r\ndelete noreply\r\nverbosity 1 2\r\n\
                      verbosity x noreply\r\nflush_all 0 x\r\nget a\r\n";
        let usage = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n";
        let want = format!("STORED\r\nEND\r\nEND\r\n{usage}NOT_FOUND\r\nOK\r\nOK\r\nEND\r\n");
        assert_eq!(session(&b, input, 64), want);
    }

    #[test]
    fn flush_all_deletes_every_item_and_refuses_a_delay() {
        let b = MapBackend::default();
        let input = b"set a 0 0 1\r\nx\r\nset b 5 0 1\r\ny\r\nflush_all 10\r\nget a\r\n\
            flush_all\r\nget a b\r\nset c 0 0 1\r\nz\r\nflush_all noreply\r\nget c\r\n";
        let out = session(&b, input, 5);
        assert_eq!(
            out,
            "STORED\r\nSTORED\r\n\
             SERVER_ERROR flush_all with a delay is not served (flush_all 0 flushes at once)\r\n\
             VALUE a 0 1\r\nx\r\nEND\r\nOK\r\nEND\r\nSTORED\r\nEND\r\n"
        );
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
                    NOT_FOUND\r\n\
                    END\r\n\
                    OK\r\n";
        assert_eq!(out, want, "nothing after quit is served");
        assert!(b.0.lock().unwrap().0.is_empty(), "nothing was stored");
    }

    /// In a mode without conditional writes, the commands that need them answer why (unless
    /// sent with `noreply`: a client that sent it reads nothing back, and an answer would be
    /// taken for the next command's; pymemcache sends `add` with noreply by default); `get`,
    /// `set` and `delete` are served.
    #[test]
    fn a_mode_without_conditional_writes_refuses_and_stays_usable() {
        let b = OneClient(std::sync::Mutex::new(PlainClient::default()));
        let input = b"add k 0 0 1 noreply\r\nx\r\nincr k 1 noreply\r\nflush_all noreply\r\n\
                      add k 0 0 1\r\nx\r\ngets k\r\nset k 0 0 1\r\ny\r\nget k\r\n\
                      delete k\r\ndelete k\r\n";
        let why = "a versioned read needs conditional writes, which only the client-driven (cd) mode offers";
        let want = format!(
            "SERVER_ERROR {why}\r\nSERVER_ERROR {why}\r\nSTORED\r\nVALUE k 0 1\r\ny\r\nEND\r\n\
             DELETED\r\nNOT_FOUND\r\n"
        );
        assert_eq!(session(&b, input, 64), want);
    }

    #[test]
    fn an_overlong_line_closes_the_connection() {
        let b = MapBackend::default();
        let mut input = b"get ".to_vec();
        input.extend(std::iter::repeat_n(
            b'k',
            crate::memcached::proto::MAX_LINE_LEN + 10,
        ));
        let out = session(&b, &input, 4096);
        assert_eq!(out, "CLIENT_ERROR line too long\r\n");
    }

    /// Store an item directly (flags, expiry in Unix ms), as if written earlier.
    fn put_item(b: &MapBackend, key: &[u8], flags: u32, expires: u64, data: &[u8]) {
        let mut v = Vec::new();
        item::encode(&mut v, flags, expires, data);
        b.0.lock().unwrap().put(key, &v).unwrap();
    }

    /// The stored item of `key`: (flags, expires, data).
    fn stored(b: &MapBackend, key: &[u8]) -> Option<(u32, u64, Vec<u8>)> {
        let m = b.0.lock().unwrap();
        let (v, _) = m.0.get(key)?;
        let it = item::decode(v, 0).unwrap();
        Some((it.flags, it.expires, it.data.to_vec()))
    }

    #[test]
    fn gets_and_cas() {
        let b = MapBackend::default();
        let input = b"set a 5 0 3\r\nabc\r\ngets a nope\r\ncas a 6 0 2 1\r\nxy\r\n\
                      cas a 6 0 2 1\r\nzz\r\ncas a 0 0 1 0\r\nq\r\ncas nope 0 0 1 1\r\nq\r\n\
                      cas a 7 0 1 2 noreply\r\nn\r\ncas a 7 0 1 2 noreply\r\nm\r\ngets a\r\n";
        let want = "STORED\r\nVALUE a 5 3 1\r\nabc\r\nEND\r\nSTORED\r\nEXISTS\r\nEXISTS\r\n\
                    NOT_FOUND\r\nVALUE a 7 1 3\r\nn\r\nEND\r\n";
        assert_eq!(session(&b, input, 5), want);
    }

    #[test]
    fn add_and_replace() {
        let b = MapBackend::default();
        let input = b"add k 1 0 1\r\na\r\nadd k 2 0 1\r\nb\r\nreplace nope 0 0 1\r\nc\r\n\
                      replace k 3 0 1\r\nd\r\nadd k 0 0 1 noreply\r\ne\r\n\
                      replace nope 0 0 1 noreply\r\nf\r\nget k nope\r\n";
        let want = "STORED\r\nNOT_STORED\r\nNOT_STORED\r\nSTORED\r\nVALUE k 3 1\r\nd\r\nEND\r\n";
        assert_eq!(session(&b, input, 64), want);
        // A negative exptime stores an item nobody can read: the key is gone.
        assert_eq!(
            session(&b, b"replace k 0 -1 1\r\nx\r\nget k\r\n", 64),
            "STORED\r\nEND\r\n"
        );
        assert_eq!(stored(&b, b"k"), None);
    }

    #[test]
    fn append_and_prepend_keep_flags_and_expiry() {
        let b = MapBackend::default();
        let at = unix_now_ms() + 100_000;
        put_item(&b, b"k", 7, at, b"mid");
        let input = b"append k 1 1 2\r\n>>\r\nprepend k 2 2 2\r\n<<\r\nappend nope 0 0 1\r\nx\r\n\
                      prepend nope 0 0 1 noreply\r\nx\r\nappend k 0 0 1 noreply\r\n!\r\nget k\r\n";
        let want = "STORED\r\nSTORED\r\nNOT_STORED\r\nVALUE k 7 8\r\n<<mid>>!\r\nEND\r\n";
        assert_eq!(session(&b, input, 3), want);
        assert_eq!(stored(&b, b"k"), Some((7, at, b"<<mid>>!".to_vec())));
        // Past the data limit (2000): NOT_STORED, as memcached answers; past the store's
        // (1000 bytes for the map): out of memory.
        put_item(&b, b"big", 0, 0, &[b'x'; 900]);
        let mut input = b"append big 0 0 1200\r\n".to_vec();
        input.extend_from_slice(&[b'y'; 1200]);
        input.extend_from_slice(b"\r\nappend big 0 0 200\r\n");
        input.extend_from_slice(&[b'y'; 200]);
        input.extend_from_slice(b"\r\n");
        let want = "NOT_STORED\r\nSERVER_ERROR out of memory storing object\r\n";
        assert_eq!(session(&b, &input, 4096), want);
    }

    #[test]
    fn incr_and_decr() {
        let b = MapBackend::default();
        put_item(&b, b"n", 9, 0, b"18446744073709551614");
        let input = b"incr n 1\r\nincr n 1\r\nincr n 5\r\ndecr n 2\r\ndecr n 100\r\n\
                      incr n 10 noreply\r\nget n\r\nincr nope 1\r\ndecr nope 1 noreply\r\n\
                      set t 0 0 2\r\nab\r\nincr t 1\r\nincr t 1 noreply\r\n\
                      set p 0 0 4\r\n 99 \r\nincr p 1\r\nset q 0 0 2\r\n-1\r\nincr q 1\r\n\
                      set big 0 0 20\r\n18446744073709551616\r\nincr big 1\r\n";
        let non = "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
        let want = format!(
            "18446744073709551615\r\n0\r\n5\r\n3\r\n0\r\nVALUE n 9 2\r\n10\r\nEND\r\nNOT_FOUND\r\n\
             STORED\r\n{non}STORED\r\n100\r\nSTORED\r\n{non}STORED\r\n{non}"
        );
        assert_eq!(session(&b, input, 64), want);
        assert_eq!(stored(&b, b"n").unwrap().0, 9, "flags kept");
    }

    #[test]
    fn counter_values_read_as_memcached_reads_them() {
        assert_eq!(counter_value(b"0"), Some(0));
        assert_eq!(counter_value(b" +12 x"), Some(12));
        assert_eq!(counter_value(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b" ",
            b"+",
            b"1a",
            b"-1",
            b"18446744073709551616",
            b"0x1",
        ] {
            assert_eq!(counter_value(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn touch_gat_and_gats() {
        let b = MapBackend::default();
        put_item(&b, b"k", 3, 0, b"v");
        let input = b"touch k 100\r\ntouch nope 1\r\ntouch k 50 noreply\r\ngat 200 k nope\r\n\
                      gats 0 k\r\ngats 0 k\r\ngets k\r\n";
        // Each touch that changes the expiry writes, so makes a new version; gats answers it.
        let want =
            "TOUCHED\r\nNOT_FOUND\r\nVALUE k 3 1\r\nv\r\nEND\r\nVALUE k 3 1 5\r\nv\r\nEND\r\n\
                    VALUE k 3 1 5\r\nv\r\nEND\r\nVALUE k 3 1 5\r\nv\r\nEND\r\n";
        assert_eq!(session(&b, input, 64), want);
        assert_eq!(stored(&b, b"k"), Some((3, 0, b"v".to_vec())));
        let out = session(&b, b"gat 100 k\r\n", 64);
        assert_eq!(out, "VALUE k 3 1\r\nv\r\nEND\r\n");
        let at = stored(&b, b"k").unwrap().1;
        assert!(
            at > unix_now_ms() + 99_000 && at <= unix_now_ms() + 100_000,
            "{at}"
        );
        // A negative exptime expires the item at once (gat still answers what it read).
        let out = session(&b, b"gat -1 k\r\nget k\r\ntouch k 1\r\n", 64);
        assert_eq!(out, "VALUE k 3 1\r\nv\r\nEND\r\nEND\r\nNOT_FOUND\r\n");
        assert_eq!(stored(&b, b"k"), None);
    }

    /// An expired item is absent to every command, and is conditioned on by its version.
    #[test]
    fn expired_items_are_absent_to_conditional_commands() {
        let b = MapBackend::default();
        let past = unix_now_ms() - 1;
        for k in [&b"a"[..], b"r", b"p", b"i", b"t", b"c", b"d"] {
            put_item(&b, k, 0, past, b"1");
        }
        let input = b"replace r 0 0 1\r\nx\r\nappend p 0 0 1\r\nx\r\nincr i 1\r\ntouch t 0\r\n\
                      cas c 0 0 1 6\r\nx\r\ngets a r p i t c\r\ndelete d\r\nadd a 0 0 1\r\nx\r\n\
                      get a\r\n";
        let want = "NOT_STORED\r\nNOT_STORED\r\nNOT_FOUND\r\nNOT_FOUND\r\nNOT_FOUND\r\nEND\r\n\
                    NOT_FOUND\r\nSTORED\r\nVALUE a 0 1\r\nx\r\nEND\r\n";
        assert_eq!(session(&b, input, 64), want);
        assert_eq!(stored(&b, b"d"), None, "an expired item deleted is removed");
    }

    /// A backend whose client lets `races` writes of `race` in between a read-modify-write's
    /// read and its conditional write.
    fn racing(
        races: usize,
        race: impl FnMut(&mut MapClient) + Send + 'static,
    ) -> OneClient<RacingClient> {
        let c = RacingClient::new(MapClient::default(), races, race);
        OneClient(std::sync::Mutex::new(c))
    }

    fn race_put(m: &mut MapClient, key: &[u8], data: &[u8]) {
        let mut v = Vec::new();
        item::encode(&mut v, 0, 0, data);
        m.put(key, &v).unwrap();
    }

    #[test]
    fn a_write_racing_a_read_modify_write_is_not_lost() {
        let b = racing(1, |m| race_put(m, b"n", b"10"));
        let out = session(&b, b"set n 0 0 1\r\n1\r\nincr n 1\r\nget n\r\n", 64);
        assert_eq!(out, "STORED\r\n11\r\nVALUE n 0 2\r\n11\r\nEND\r\n");
        assert_eq!(b.0.lock().unwrap().races_run(), 1);
        let b = racing(1, |m| race_put(m, b"s", b"mid"));
        let out = session(&b, b"append s 0 0 1\r\n!\r\nget s\r\n", 64);
        assert_eq!(
            out, "NOT_STORED\r\nEND\r\n",
            "absent when read; the race is a put"
        );
        let b = racing(2, |m| race_put(m, b"s", b"x"));
        let input = b"set s 0 0 1\r\na\r\nappend s 0 0 1\r\n!\r\nget s\r\n";
        assert_eq!(
            session(&b, input, 64),
            "STORED\r\nSTORED\r\nVALUE s 0 2\r\nx!\r\nEND\r\n"
        );
        // cas sees the race as a change: EXISTS, and the racing write stays.
        let b = racing(1, |m| race_put(m, b"c", b"theirs"));
        let input = b"set c 0 0 1\r\na\r\ncas c 0 0 4 1\r\nmine\r\nget c\r\n";
        let want = "STORED\r\nEXISTS\r\nVALUE c 0 6\r\ntheirs\r\nEND\r\n";
        assert_eq!(session(&b, input, 64), want);
        // delete reads again and removes the racing write's version.
        let b = racing(1, |m| race_put(m, b"d", b"new"));
        let out = session(&b, b"set d 0 0 1\r\na\r\ndelete d\r\nget d\r\n", 64);
        assert_eq!(out, "STORED\r\nDELETED\r\nEND\r\n");
        assert_eq!(b.0.lock().unwrap().races_run(), 1);
    }

    #[test]
    fn a_key_always_raced_is_answered_as_contended() {
        let b = racing(usize::MAX, |m| race_put(m, b"n", b"1"));
        let input = b"set n 0 0 1\r\n1\r\nincr n 1\r\nincr n 1 noreply\r\nget n\r\n";
        let out = session(&b, input, 64);
        // Under `noreply` the refusal is not answered: memcached answers nothing then.
        let err = format!("SERVER_ERROR {}\r\n", rmw::contended_msg());
        assert_eq!(out, format!("STORED\r\n{err}VALUE n 0 1\r\n1\r\nEND\r\n"));
        assert_eq!(b.0.lock().unwrap().races_run(), 2 * MAX_RMW_ATTEMPTS);
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
        assert!(out.contains("STAT evictions 0\r\n"), "{out}");
    }

    /// `stats` reports the store's evictions, items and memory, and `expired_unfetched` only
    /// under a policy that keeps access words.
    #[test]
    fn stats_report_the_stores_figures() {
        let b = MapBackend::default();
        let f = crate::testing::FIXED_FIGURES;
        for (policy, unfetched) in [("allkeys-random", false), ("allkeys-lru", true)] {
            let c = crate::testing::counters_with_gauges(42, policy);
            c.expired_unfetched.store(3, Ordering::Relaxed);
            let mut p = Pipe::new(b"stats\r\n", 64);
            serve(&mut p, &b, LIMITS, &c).unwrap();
            let out = String::from_utf8(p.output).unwrap();
            for line in [
                "STAT evictions 42\r\n".to_string(),
                format!("STAT curr_items {}\r\n", f.items),
                format!("STAT bytes {}\r\n", f.bytes),
                format!("STAT limit_maxbytes {}\r\n", f.limit_bytes),
            ] {
                assert!(out.contains(&line), "{line:?} in {out}");
            }
            assert_eq!(
                out.contains("STAT expired_unfetched 3\r\n"),
                unfetched,
                "{policy}: {out}"
            );
        }
    }
}
