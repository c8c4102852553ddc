//! Serving memcached's meta commands (`mg`, `ms`, `md`, `ma`; parsed by [`crate::memcached::meta`]) on a
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
use crate::memcached::meta::{Meta, MetaCmd, MetaOpts};
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

/// A read-modify-write's answer and the encoded item it wrote, if any (`None`: contended).
type Written<T> = Option<(T, Option<Vec<u8>>)>;

/// A read-modify-write of `key` that also answers the encoded item it wrote, if any (to read
/// its version back for `c`).
fn rmw_written<T>(
    c: &mut dyn KvClient,
    key: &[u8],
    now: u64,
    buf: &mut Vec<u8>,
    mut f: impl FnMut(Seen<'_>) -> Change<T>,
) -> Result<Written<T>, Error> {
    for _ in 0..MAX_RMW_ATTEMPTS {
        let mut written = None;
        let mut g = |s: Seen<'_>| {
            let ch = f(s);
            if let Change::Put(v, _) = &ch {
                written = Some(v.clone());
            }
            ch
        };
        if let Attempt::Done(t) = rmw::attempt(c, key, now, buf, usize::MAX, &mut g)? {
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
        if self.key_too_long(&m.key, false) {
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
    fn ms_plain(
        &mut self,
        m: &MetaReq,
        expires: Option<u64>,
    ) -> Result<Written<&'static str>, Error> {
        let Some(expires) = expires else {
            // Expired on arrival: memcached stores it and nobody can read it.
            return self.with(|c| c.delete(&m.key)).map(|()| Some(("HD", None)));
        };
        let mut v = Vec::new();
        item::encode(&mut v, m.opts.client_flags.unwrap_or(0), expires, &m.data);
        let at = item::store_expiry(expires);
        match self.with(|c| c.put_parts_expiring(&m.key, &[&v], at)) {
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

    /// `ma`: `HD` or, with `v`, `VA` and the new value (either, nothing under `q`, as
    /// memcached does); `NF` a miss without `N`, `EX` a `C` mismatch.
    fn ma(&mut self, m: &MetaReq) {
        let now = unix_now_ms();
        let key = &m.key;
        let mut buf = std::mem::take(&mut self.scratch);
        let r = self.with(|c| {
            rmw_written(c, key, now, &mut buf, |s| {
                ma_change(&m.opts, vivify_ttl(m), s, now)
            })
        });
        self.scratch = buf;
        let Some((outcome, written)) = self.settle(r) else {
            return;
        };
        let (n, expires) = match outcome {
            // memcached's noreply semantics: a success is not answered, value or not.
            Ok(_) if m.opts.quiet => return,
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
        } else {
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
    let mode = m.opts.mode.unwrap_or(b'S');
    // As memcached: append and prepend take `C0` for no `C`, and a miss is `NS`, `C` or not.
    let cas = match mode {
        b'A' | b'P' => m.opts.cas.filter(|&c| c != 0),
        _ => m.opts.cas,
    };
    match (mode, seen.item) {
        (b'E', Some(_)) => Change::Keep("NS"),
        (b'E', None) => stored(),
        (b'A' | b'P', None) => Change::Keep("NS"),
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

/// The TTL of an item `ma` creates on a miss (`None`: without `N` it creates none): `N`'s,
/// or `T`'s when `T` comes after it, as memcached applies them in request order.
fn vivify_ttl(m: &MetaReq) -> Option<i64> {
    m.opts.vivify?;
    m.flags.iter().rev().find_map(|f| match f[0] {
        b'N' => m.opts.vivify,
        b'T' => m.opts.ttl,
        _ => None,
    })
}

/// What `ma` writes given what it read: incr wraps at 2^64, decr stops at 0 (as `incr` and
/// `decr`); a miss with `N` creates the item holding `J` (no delta applied, as memcached),
/// with TTL `vivify` ([`vivify_ttl`]).
fn ma_change(o: &MetaOpts, vivify: Option<i64>, seen: Seen<'_>, now: u64) -> Change<MaOutcome> {
    let Some(it) = seen.item else {
        let Some(ttl) = vivify else {
            return Change::Keep(Err("NF"));
        };
        let n = o.initial.unwrap_or(0);
        let expires = item::expires_at(ttl, now);
        let done = Ok((n, expires.unwrap_or(0)));
        return Change::store(0, expires, &[n.to_string().as_bytes()], done);
    };
    // As memcached: `C0` is no `C`, and an empty value is refused before `C` is compared.
    if !it.data.is_empty() && o.cas.is_some_and(|c| c != 0 && seen.version != Some(c)) {
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

#[cfg(test)]
mod tests {
    use super::super::{serve, Counters, Limits};
    use crate::testing::{MapBackend, MapClient, OneClient, Pipe, RacingClient};
    use nessie_protocols::KvClient;

    const LIMITS: Limits = Limits {
        max_key: 250,
        max_data: 2000,
    };

    /// What the server answers to `input`, fed `chunk` bytes at a time.
    fn session(backend: &dyn super::super::Backend, input: &[u8], chunk: usize) -> String {
        let mut p = Pipe::new(input, chunk);
        serve(&mut p, backend, LIMITS, &Counters::default()).unwrap();
        String::from_utf8(p.output).unwrap()
    }

    fn put_item(b: &MapBackend, key: &[u8], flags: u32, expires: u64, data: &[u8]) {
        let mut v = Vec::new();
        crate::item::encode(&mut v, flags, expires, data);
        b.0.lock().unwrap().put(key, &v).unwrap();
    }

    #[test]
    fn mn_and_mg_return_flags_in_request_order() {
        let input = b"mn\r\nms k 3 F5\r\nabc\r\nmg k v f s t c k O7\r\nmg k\r\nmg k O1 v u\r\n\
                      mg nope v\r\nmg nope k O1 c\r\nmn extra\r\n";
        let want = "MN\r\nHD\r\nVA 3 f5 s3 t-1 c1 kk O7\r\nabc\r\nHD\r\nVA 3 O1\r\nabc\r\n\
                    EN\r\nEN knope O1\r\nMN\r\n";
        for chunk in [1, 3, 4096] {
            let b = MapBackend::default();
            assert_eq!(session(&b, input, chunk), want, "chunks of {chunk}");
        }
    }

    #[test]
    fn mg_touch_and_ttl() {
        let b = MapBackend::default();
        put_item(&b, b"k", 0, super::unix_now_ms() + 100_000, b"v");
        // T touches (a write, so a new version); t reports the TTL after it.
        let out = session(
            &b,
            b"mg k t\r\nmg k T50 t c v\r\nmg k t c\r\nmg k T-1\r\nmg k\r\n",
            64,
        );
        assert_eq!(
            out,
            "HD t100\r\nVA 1 t50 c2\r\nv\r\nHD t50 c2\r\nHD\r\nEN\r\n"
        );
    }

    /// Under `q`, the common case is not answered (mg: EN; ms: HD; md: HD and NF; ma: HD),
    /// so a pipeline ends with `mn` to know all was served.
    #[test]
    fn quiet_mode_pipelines() {
        let b = MapBackend::default();
        let input = b"mg a v q O1\r\nms a 1 q O2\r\nx\r\nms a 1 q ME O3\r\ny\r\nmg a v q O4\r\n\
                      ma a q\r\nma a q v\r\nmd a q C9\r\nmd a q\r\nmd a q\r\nma a q O5\r\nmn\r\n";
        let want = "NS O3\r\nVA 1 O4\r\nx\r\nCLIENT_ERROR cannot increment or decrement \
                    non-numeric value\r\nCLIENT_ERROR cannot increment or decrement non-numeric \
                    value\r\nEX\r\nNF O5\r\nMN\r\n";
        assert_eq!(session(&b, input, 5), want);
    }

    /// As memcached 1.6.18: `q` leaves out `ma`'s success, with `v` too (a created item too,
    /// as later memcached does); append and prepend take `C0` for no `C` and answer `NS` on a
    /// miss whatever their `C`; `ma` takes `C0` for no `C`, and refuses an empty value before
    /// it compares `C`.
    #[test]
    fn quiet_arithmetic_and_cas_zero() {
        let b = MapBackend::default();
        let input = b"ma n N0 J5 q v\r\nma n q v\r\nma n v\r\nms s 1 MA C99\r\nx\r\n\
                      ms s 1 MP C0\r\nx\r\nms s 1\r\nm\r\nms s 1 MA C0\r\n>\r\n\
                      ms s 1 MP C0\r\n<\r\nms s 1 MA C99\r\n!\r\nma n C0 v\r\nmg s v\r\n\
                      ms e 0\r\n\r\nma e C99\r\nmn\r\n";
        let want = "VA 1\r\n7\r\nNS\r\nNS\r\nHD\r\nHD\r\nHD\r\nEX\r\nVA 1\r\n8\r\n\
                    VA 3\r\n<m>\r\nHD\r\n\
                    CLIENT_ERROR cannot increment or decrement non-numeric value\r\nMN\r\n";
        assert_eq!(session(&b, input, 64), want);
    }

    /// An item `ma` creates gets the TTL of `N`, or of `T` when `T` comes after `N`, as
    /// memcached applies them in request order.
    #[test]
    fn ma_creates_with_the_last_of_n_and_t() {
        let b = MapBackend::default();
        let input = b"ma a N0 T-1\r\nma a v\r\nma b T-1 N0\r\nma b v\r\nma c N-1 T0\r\nma c v\r\n\
                      ma d T0 N-1\r\nma d v\r\nma e N100 J4 T0 t v\r\nmn\r\n";
        let want = "HD\r\nNF\r\nHD\r\nVA 1\r\n1\r\nHD\r\nVA 1\r\n1\r\nHD\r\nNF\r\n\
                    VA 1 t-1\r\n4\r\nMN\r\n";
        assert_eq!(session(&b, input, 64), want);
    }

    #[test]
    fn ms_modes_cas_and_returned_cas() {
        let b = MapBackend::default();
        let input = b"ms k 2 c F3 T0\r\nab\r\nms k 1 C9 c\r\nx\r\nms k 1 C1 c k\r\nx\r\n\
                      ms n 1 C1\r\nx\r\nms k 1 ME\r\ny\r\nms n 1 MR\r\ny\r\nms n 1 MA\r\ny\r\n\
                      ms k 1 MA F9\r\n>\r\nms k 1 MP\r\n<\r\nms n 1 ME F1\r\nn\r\n\
                      mg k v f c\r\nms k 1 MR\r\nr\r\nmg k v f\r\n";
        let want = "HD c1\r\nEX c0\r\nHD c2 kk\r\nNF\r\nNS\r\nNS\r\nNS\r\nHD\r\nHD\r\nHD\r\n\
                    VA 3 f0 c4\r\n<x>\r\nHD\r\nVA 1 f0\r\nr\r\n";
        assert_eq!(session(&b, input, 64), want);
        // A negative TTL stores an item nobody reads: the key is gone.
        let out = session(&b, b"ms k 1 T-1\r\nx\r\nmg k v\r\n", 64);
        assert_eq!(out, "HD\r\nEN\r\n");
        assert!(!b.0.lock().unwrap().0.contains_key(&b"k"[..]));
    }

    #[test]
    fn md_with_and_without_cas() {
        let b = MapBackend::default();
        let input = b"ms k 1\r\nx\r\nmd k C7 O1 k\r\nmg k v\r\nmd k C1 O2 k\r\nmd k O3\r\n\
                      ms k 1\r\nx\r\nmd k\r\n";
        let want = "HD\r\nEX O1 kk\r\nVA 1\r\nx\r\nHD O2 kk\r\nNF O3\r\nHD\r\nHD\r\n";
        assert_eq!(session(&b, input, 64), want);
    }

    #[test]
    fn ma_counts_vivifies_and_compares() {
        let b = MapBackend::default();
        put_item(&b, b"n", 4, 0, b"10");
        let input = b"ma n\r\nma n v\r\nma n MD D3 v t c k O1\r\nma n M- D100 v\r\n\
                      ma n M+ D5 v\r\nma n C1 v\r\nma n Mx\r\nma nope\r\nma nope v O9\r\n\
                      ma viv N0 J10 v t\r\nma viv v\r\nma big N0 v\r\n\
                      ma big D18446744073709551615 v\r\nma big v\r\nmg n v f\r\n";
        let want = "HD\r\nVA 2\r\n12\r\nVA 1 t-1 c4 kn O1\r\n9\r\nVA 1\r\n0\r\nVA 1\r\n5\r\n\
                    EX\r\nCLIENT_ERROR invalid mode for ma M token\r\nNF\r\nNF O9\r\n\
                    VA 2 t-1\r\n10\r\nVA 2\r\n11\r\n\
                    VA 1\r\n0\r\nVA 20\r\n18446744073709551615\r\nVA 1\r\n0\r\n\
                    VA 1 f4\r\n5\r\n";
        assert_eq!(session(&b, input, 64), want);
        let out = session(&b, b"ma n T100 t v\r\nma n t\r\n", 64);
        assert_eq!(out, "VA 1 t100\r\n6\r\nHD t100\r\n");
    }

    #[test]
    fn base64_keys() {
        let b = MapBackend::default();
        // "Zm9v" is "foo"; k echoes the key as sent, with b.
        let input = b"ms Zm9v 2 b k O1 c\r\nhi\r\nmg foo v k\r\nmg Zm9v b k v\r\nmd Zm9v b q\r\n\
                      mg foo v\r\nmg Zm9 b v\r\nms Zm9v= 2 b\r\nhi\r\nmn\r\n";
        let want = "HD kZm9v b O1 c1\r\nVA 2 kfoo\r\nhi\r\nVA 2 kZm9v b\r\nhi\r\nEN\r\n\
                    CLIENT_ERROR error decoding key\r\nCLIENT_ERROR error decoding key\r\nMN\r\n";
        assert_eq!(session(&b, input, 64), want);
    }

    /// Errors as memcached 1.6.18 answers them; an ms's data block is thrown away once its
    /// length is known; the connection stays usable.
    #[test]
    fn errors_keep_the_connection_usable() {
        let b = MapBackend::default();
        let long = "k".repeat(251);
        let input = format!(
            "mg\r\nmg k zz\r\nmg k v v\r\nmg k Tx\r\nmg k F-1\r\nmg k O{o}\r\n\
             mg k {many}\r\nmd k x\r\nma k Dx\r\nmd k {many}\r\nms k 2 Cx\r\nhi\r\n\
             ms k 2 MX\r\nhi\r\nms k 2 M\r\nhi\r\nms k x\r\nms k\r\nmg {long} v\r\n\
             mg k h\r\nms k 2 I\r\nhi\r\nmg k N30\r\nms k 2\r\nhello\r\n\
             ms big 2001\r\n{big}\r\nmn\r\n",
            o = "o".repeat(32),
            many = "c f k s t v O1 u q T5 F1 C1 D1 J1 P L M+ b",
            big = "x".repeat(2001),
        );
        let want = "ERROR\r\nCLIENT_ERROR invalid flag\r\nCLIENT_ERROR duplicate flag\r\n\
            CLIENT_ERROR bad token in command line format\r\n\
            CLIENT_ERROR bad command line format\r\nCLIENT_ERROR opaque token too long\r\n\
            CLIENT_ERROR options flags are too long\r\nCLIENT_ERROR invalid or duplicate flag\r\n\
            CLIENT_ERROR invalid or duplicate flag\r\nCLIENT_ERROR options flags too long\r\n\
            CLIENT_ERROR bad token in command line format\r\n\
            CLIENT_ERROR invalid mode for ms M token\r\n\
            CLIENT_ERROR incorrect length for M token\r\n\
            CLIENT_ERROR bad command line format\r\nCLIENT_ERROR bad command line format\r\n\
            CLIENT_ERROR bad command line format\r\n\
            CLIENT_ERROR flag h (hit before) not supported\r\n\
            CLIENT_ERROR flag I (invalidate) not supported\r\n\
            CLIENT_ERROR flag N (vivify) not supported\r\n\
            CLIENT_ERROR bad data chunk\r\nERROR\r\n\
            SERVER_ERROR object too large for cache\r\nMN\r\n";
        assert_eq!(session(&b, input.as_bytes(), 7), want);
        assert!(b.0.lock().unwrap().0.is_empty(), "nothing was stored");
    }

    fn racing(
        races: usize,
        race: impl FnMut(&mut MapClient) + Send + 'static,
    ) -> OneClient<RacingClient> {
        OneClient(std::sync::Mutex::new(RacingClient::new(
            MapClient::default(),
            races,
            race,
        )))
    }

    fn race_put(m: &mut MapClient, key: &[u8], data: &[u8]) {
        let mut v = Vec::new();
        crate::item::encode(&mut v, 0, 0, data);
        m.put(key, &v).unwrap();
    }

    /// A write between a meta command's read and its conditional write is not lost: ma reads
    /// again; ms with C sees the change (EX).
    #[test]
    fn racing_writes_are_not_lost() {
        let b = racing(1, |m| race_put(m, b"n", b"10"));
        let out = session(&b, b"ms n 1\r\n1\r\nma n v c\r\nmg n v\r\n", 64);
        // The incr's version is read back: 3 (set, race, incr).
        assert_eq!(out, "HD\r\nVA 2 c3\r\n11\r\nVA 2\r\n11\r\n");
        let b = racing(1, |m| race_put(m, b"c", b"theirs"));
        let out = session(&b, b"ms c 1\r\na\r\nms c 4 C1 c\r\nmine\r\nmg c v\r\n", 64);
        assert_eq!(out, "HD\r\nEX c0\r\nVA 6\r\ntheirs\r\n");
    }

    /// In a mode without conditional writes, plain mg, ms and md are served; what needs a
    /// versioned read answers why, and the connection stays usable.
    #[test]
    fn a_mode_without_conditional_writes() {
        let b = OneClient(std::sync::Mutex::new(crate::testing::PlainClient::default()));
        let input =
            b"ms k 1 F2\r\nx\r\nmg k v f\r\nmg k c\r\nms k 1 ME\r\ny\r\nmd k\r\nmd k q\r\nmn\r\n";
        let why = "a versioned read needs conditional writes, which only the client-driven (cd) mode offers";
        let want = format!(
            "HD\r\nVA 1 f2\r\nx\r\nSERVER_ERROR {why}\r\nSERVER_ERROR {why}\r\nHD\r\nMN\r\n"
        );
        assert_eq!(session(&b, input, 64), want);
    }
}
