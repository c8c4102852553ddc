//! Serving memcached's meta commands (`mg`, `ms`, `md`, `ma`; parsed by [`crate::meta`]) on a
//! connection. Every one that depends on a key's state is a read-modify-write over the store's
//! conditional writes ([`rmw`]), as the classic commands are; `mg` without `c` or `T` and `ms`
//! in set mode without `C` are a plain read and a plain write.
//!
//! A cas unique is the key's version. The store's conditional write does not answer the
//! version it made, so a `c` after a write reads the key back: if what is stored is no longer
//! what was written (another client wrote in between), the reply is `c0`, which protocol.txt
//! allows ("clients must not depend on" it) and which no `C` will ever match.

use std::sync::atomic::Ordering;

use nessie_protocols::{Error, KvClient, Version};

use super::{counter_value, read_or_touch, unix_now_ms, Conn, Hit};
use crate::item;
use crate::meta::{Meta, MetaCmd, MetaOpts};
use crate::rmw::{self, Attempt, Change, Seen, MAX_RMW_ATTEMPTS};

/// A meta command that owns its words (the parsed one borrows the input buffer).
pub(super) struct MetaReq {
    pub cmd: MetaCmd,
    pub key: Vec<u8>,
    /// The key as sent (base64 under `b`): what `k` echoes.
    pub sent_key: Vec<u8>,
    pub flags: Vec<Vec<u8>>,
    pub opts: MetaOpts,
    /// `ms`'s data block.
    pub data: Vec<u8>,
}

impl MetaReq {
    pub fn new(m: &Meta<'_>, data: &[u8]) -> MetaReq {
        MetaReq {
            cmd: m.cmd,
            key: m.key.to_vec(),
            sent_key: m.sent_key.to_vec(),
            flags: m.flags.iter().map(|f| f.to_vec()).collect(),
            opts: m.opts,
            data: data.to_vec(),
        }
    }

    fn wants(&self, flag: u8) -> bool {
        self.flags.iter().any(|f| f[0] == flag)
    }
}

/// What a reply's return flags report: `None` is not reported by this command or outcome
/// (`k` and `O` always are).
#[derive(Default)]
struct Echo {
    cas: Option<Version>,
    flags: Option<u32>,
    size: Option<usize>,
    ttl: Option<i64>,
}

/// Remaining TTL in seconds as memcached's `t` reports it: -1 for none, rounded up so that an
/// item just set with `T100` reports 100.
fn ttl_secs(expires: u64, now: u64) -> i64 {
    match expires {
        0 => -1,
        at => (at.saturating_sub(now).div_ceil(1000)) as i64,
    }
}

/// A read-modify-write of `key` that also answers the encoded item it wrote, if any (to read
/// its version back for `c`).
fn rmw_written<T>(
    c: &mut dyn KvClient,
    key: &[u8],
    now: u64,
    buf: &mut Vec<u8>,
    mut f: impl FnMut(Seen<'_>) -> Change<T>,
) -> Result<Option<(T, Option<Vec<u8>>)>, Error> {
    for _ in 0..MAX_RMW_ATTEMPTS {
        let mut written = None;
        let mut g = |s: Seen<'_>| {
            let ch = f(s);
            if let Change::Put(v, _) = &ch {
                written = Some(v.clone());
            }
            ch
        };
        if let Attempt::Done(t) = rmw::attempt(c, key, now, buf, &mut g)? {
            return Ok(Some((t, written)));
        }
    }
    Ok(None)
}

/// The version of `written` if it is still what `key` holds, else 0 (unknown: see the module
/// docs). A failed read-back is 0 too: the write itself took effect.
fn version_after(c: &mut dyn KvClient, key: &[u8], written: Option<&[u8]>) -> Version {
    let Some(written) = written else { return 0 };
    let mut buf = Vec::new();
    match c.get_versioned(key, &mut buf) {
        Ok(Some(v)) if buf == written => v,
        _ => 0,
    }
}

impl Conn<'_> {
    pub(super) fn meta(&mut self, m: MetaReq) {
        if self.key_too_long(&m.key) {
            return;
        }
        match m.cmd {
            MetaCmd::Get => self.mg(&m),
            MetaCmd::Set => self.ms(&m),
            MetaCmd::Delete => self.md(&m),
            MetaCmd::Arith => self.ma(&m),
        }
    }

    /// Append `<code> <return flags>*\r\n` (and `value`'s data block) to the replies.
    fn meta_reply(&mut self, m: &MetaReq, code: &str, e: &Echo, value: Option<&[u8]>) {
        let out = &mut self.out;
        out.extend_from_slice(code.as_bytes());
        for f in &m.flags {
            let shown = match f[0] {
                b'O' => format!(" O{}", String::from_utf8_lossy(&f[1..])),
                b'k' if m.opts.base64 => format!(" k{} b", String::from_utf8_lossy(&m.sent_key)),
                b'k' => {
                    out.extend_from_slice(b" k");
                    out.extend_from_slice(&m.sent_key);
                    continue;
                }
                b'c' => e.cas.map_or(String::new(), |c| format!(" c{c}")),
                b'f' => e.flags.map_or(String::new(), |f| format!(" f{f}")),
                b's' => e.size.map_or(String::new(), |s| format!(" s{s}")),
                b't' => e.ttl.map_or(String::new(), |t| format!(" t{t}")),
                _ => continue,
            };
            out.extend_from_slice(shown.as_bytes());
        }
        out.extend_from_slice(b"\r\n");
        if let Some(v) = value {
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
    }

    /// A read-modify-write's result, or its failure answered (errors are always answered,
    /// `q` or not, as memcached does).
    fn settle<T>(&mut self, r: Result<Option<T>, Error>) -> Option<T> {
        match r {
            Ok(Some(t)) => Some(t),
            Ok(None) => {
                self.contended();
                None
            }
            Err(e) => {
                self.fail(&e, false);
                None
            }
        }
    }

    /// `mg`: a hit answers `VA` with `v`, else `HD`; a miss `EN` (nothing under `q`).
    fn mg(&mut self, m: &MetaReq) {
        self.counters.cmd_get.fetch_add(1, Ordering::Relaxed);
        let now = unix_now_ms();
        let r = self.mg_read(m, now);
        let Some(hit) = self.settle(r) else { return };
        let Some(h) = hit else {
            self.counters.get_misses.fetch_add(1, Ordering::Relaxed);
            if !m.opts.quiet {
                self.meta_reply(m, "EN", &Echo::default(), None);
            }
            return;
        };
        self.counters.get_hits.fetch_add(1, Ordering::Relaxed);
        let e = Echo {
            cas: Some(h.cas),
            flags: Some(h.flags),
            size: Some(h.data.len()),
            ttl: Some(ttl_secs(h.expires, now)),
        };
        if m.opts.value {
            let code = format!("VA {}", h.data.len());
            self.meta_reply(m, &code, &e, Some(&h.data));
        } else {
            self.meta_reply(m, "HD", &e, None);
        }
    }

    /// `mg`'s read: versioned (and a read-modify-write) only for `c` or `T`, so a plain `mg`
    /// is served in every mode.
    fn mg_read(&mut self, m: &MetaReq, now: u64) -> Result<Option<Option<Hit>>, Error> {
        let mut buf = std::mem::take(&mut self.scratch);
        let r = if m.wants(b'c') || m.opts.ttl.is_some() {
            let expires = m.opts.ttl.map(|t| item::expires_at(t, now));
            let with_cas = m.wants(b'c');
            self.with(|c| read_or_touch(c, &m.key, now, &mut buf, expires, with_cas))
        } else {
            self.with(|c| c.get_into(&m.key, &mut buf)).map(|found| {
                let it = found.then(|| item::decode(&buf, now)).flatten();
                Some(it.map(|it| Hit {
                    flags: it.flags,
                    expires: it.expires,
                    data: it.data.to_vec(),
                    cas: 0,
                }))
            })
        };
        self.scratch = buf;
        r
    }

    /// `ms`: `HD` stored (nothing under `q`), `NS` not stored, `EX` a `C` mismatch, `NF` a
    /// `C` on a miss.
    fn ms(&mut self, m: &MetaReq) {
        self.counters.cmd_set.fetch_add(1, Ordering::Relaxed);
        let now = unix_now_ms();
        let expires = item::expires_at(m.opts.ttl.unwrap_or(0), now);
        let max = self.limits.max_data;
        let key = &m.key;
        let plain = matches!(m.opts.mode, None | Some(b'S')) && m.opts.cas.is_none();
        let r = if plain {
            self.ms_plain(m, expires)
        } else {
            let mut buf = std::mem::take(&mut self.scratch);
            let r = self
                .with(|c| rmw_written(c, key, now, &mut buf, |s| ms_change(m, s, expires, max)));
            self.scratch = buf;
            r
        };
        let Some((code, written)) = self.settle(r) else {
            return;
        };
        let cas = match m.wants(b'c') {
            true => Some(self.with(|c| version_after(c, key, written.as_deref()))),
            false => None,
        };
        if !(m.opts.quiet && code == "HD") {
            let e = Echo {
                cas,
                ..Echo::default()
            };
            self.meta_reply(m, code, &e, None);
        }
    }

    /// `ms` in set mode without `C`: no condition, so a plain write, as `set` is.
    #[allow(clippy::type_complexity)]
    fn ms_plain(
        &mut self,
        m: &MetaReq,
        expires: Option<u64>,
    ) -> Result<Option<(&'static str, Option<Vec<u8>>)>, Error> {
        let Some(expires) = expires else {
            // Expired on arrival: memcached stores it and nobody can read it.
            return self.with(|c| c.delete(&m.key)).map(|()| Some(("HD", None)));
        };
        let mut v = Vec::new();
        item::encode(&mut v, m.opts.client_flags.unwrap_or(0), expires, &m.data);
        match self.with(|c| c.put(&m.key, &v)) {
            Ok(()) => Ok(Some(("HD", Some(v)))),
            Err(e) => Err(e),
        }
    }

    /// `md`: `HD` deleted, `NF` not found (both nothing under `q`), `EX` a `C` mismatch. In a
    /// mode without conditional writes and without `C`, a read and a plain delete, as
    /// `delete`.
    fn md(&mut self, m: &MetaReq) {
        let now = unix_now_ms();
        let cas = m.opts.cas;
        // An expired item is removed too (by its version), but it was not found.
        let r = match self.rmw(&m.key, now, |s| match s.item {
            None => Change::Delete("NF"),
            Some(_) if cas.is_some_and(|c| s.version != Some(c)) => Change::Keep("EX"),
            Some(_) => Change::Delete("HD"),
        }) {
            Err(Error::Unsupported(_)) if cas.is_none() => self
                .plain_delete(&m.key, now)
                .map(|found| found.map(|f| if f { "HD" } else { "NF" })),
            r => r,
        };
        let Some(code) = self.settle(r) else { return };
        let counter = match code {
            "HD" => &self.counters.delete_hits,
            _ => &self.counters.delete_misses,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if !(m.opts.quiet && matches!(code, "HD" | "NF")) {
            self.meta_reply(m, code, &Echo::default(), None);
        }
    }

    /// `ma`: `HD` (nothing under `q`) or, with `v`, `VA` and the new value; `NF` a miss
    /// without `N`, `EX` a `C` mismatch.
    fn ma(&mut self, m: &MetaReq) {
        let now = unix_now_ms();
        let key = &m.key;
        let mut buf = std::mem::take(&mut self.scratch);
        let r = self.with(|c| rmw_written(c, key, now, &mut buf, |s| ma_change(&m.opts, s, now)));
        self.scratch = buf;
        let Some((outcome, written)) = self.settle(r) else {
            return;
        };
        let (n, expires) = match outcome {
            Ok(done) => done,
            Err(line) if line.starts_with("CLIENT_ERROR") => {
                return self.out.extend_from_slice(line.as_bytes());
            }
            Err(code) => return self.meta_reply(m, code, &Echo::default(), None),
        };
        let e = Echo {
            cas: m
                .wants(b'c')
                .then(|| self.with(|c| version_after(c, key, written.as_deref()))),
            ttl: Some(ttl_secs(expires, now)),
            ..Echo::default()
        };
        if m.opts.value {
            let digits = n.to_string();
            let code = format!("VA {}", digits.len());
            self.meta_reply(m, &code, &e, Some(digits.as_bytes()));
        } else if !m.opts.quiet {
            self.meta_reply(m, "HD", &e, None);
        }
    }
}

/// What `ms` writes given what it read (`expires`: the new item's expiry, `None` if already
/// past); the answer is the reply's code.
fn ms_change(
    m: &MetaReq,
    seen: Seen<'_>,
    expires: Option<u64>,
    max_data: usize,
) -> Change<&'static str> {
    let flags = m.opts.client_flags.unwrap_or(0);
    let stored = || Change::store(flags, expires, &[&m.data], "HD");
    let cas = m.opts.cas;
    match (m.opts.mode.unwrap_or(b'S'), seen.item) {
        (b'E', Some(_)) => Change::Keep("NS"),
        (b'E', None) => stored(),
        (_, None) if cas.is_some() => Change::Keep("NF"),
        (b'S', None) => stored(),
        (_, None) => Change::Keep("NS"),
        (_, Some(_)) if cas.is_some_and(|c| seen.version != Some(c)) => Change::Keep("EX"),
        (b'S' | b'R', Some(_)) => stored(),
        // Too large to store: memcached answers so too.
        (_, Some(it)) if it.data.len() + m.data.len() > max_data => Change::Keep("NS"),
        // Append and prepend keep the item's flags and expiry, as memcached does.
        (b'A', Some(it)) => Change::store(it.flags, Some(it.expires), &[it.data, &m.data], "HD"),
        (_, Some(it)) => Change::store(it.flags, Some(it.expires), &[&m.data, it.data], "HD"),
    }
}

/// What `ma`'s outcome is: the new value and its expiry (Unix ms, 0 = never), or a reply code
/// or error line.
type MaOutcome = Result<(u64, u64), &'static str>;

/// What `ma` writes given what it read: incr wraps at 2^64, decr stops at 0 (as `incr` and
/// `decr`); a miss with `N` creates the item holding `J` (no delta applied, as memcached).
fn ma_change(o: &MetaOpts, seen: Seen<'_>, now: u64) -> Change<MaOutcome> {
    let Some(it) = seen.item else {
        let Some(ttl) = o.vivify else {
            return Change::Keep(Err("NF"));
        };
        let n = o.initial.unwrap_or(0);
        let expires = item::expires_at(ttl, now);
        let done = Ok((n, expires.unwrap_or(0)));
        return Change::store(0, expires, &[n.to_string().as_bytes()], done);
    };
    if o.cas.is_some_and(|c| seen.version != Some(c)) {
        return Change::Keep(Err("EX"));
    }
    let Some(n) = counter_value(it.data) else {
        let e = "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
        return Change::Keep(Err(e));
    };
    let delta = o.delta.unwrap_or(1);
    let n = match o.mode {
        Some(b'D' | b'-') => n.saturating_sub(delta),
        _ => n.wrapping_add(delta),
    };
    let expires = o.ttl.map_or(Some(it.expires), |t| item::expires_at(t, now));
    let done = Ok((n, expires.unwrap_or(0)));
    Change::store(it.flags, expires, &[n.to_string().as_bytes()], done)
}
