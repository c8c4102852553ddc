//! A pipelined batch's `get`s and `set`s run concurrently (issue 44), as the Redis front end's
//! (`crate::redis::serve`'s `batch`, whose invariants B1–B3 hold here too): while requests
//! arrive back to back in one read, each `get` of keys within the limit (every key of a
//! multi-key get an operation of its own) and each `set` is queued instead of run, and the
//! queue runs as one batch through the backend's operations in flight before any other
//! request, any reply that does not come from the queue, and the end of the read.
//!
//! A queued get answers as one run on its own: its hits' `VALUE` lines in key order, then
//! `END`; if the store fails on one of its keys, that key's `SERVER_ERROR` ends its reply
//! (the keys after it are not answered, nor counted, though they were read). As there, the
//! order in which requests on different keys take effect is not kept. A queued `set … noreply` answers nothing, an error
//! included, as memcached does.

use std::sync::atomic::Ordering;

use nessie_protocols::Error;

use super::{Conn, StoreReq};
use crate::item;
use crate::memcached::proto::encode_value;
use crate::serve::{queued_gets_max, unix_now_ms, Op, Outcome, MAX_QUEUED};

/// What a queued operation answers with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Queued {
    /// A key of a get: its `VALUE` line if found; `last`: `END` after it.
    Get {
        key: Vec<u8>,
        last: bool,
    },
    Set {
        noreply: bool,
    },
}

impl Conn<'_> {
    /// Most keys of gets one queue holds (B3).
    fn queued_gets_max(&self) -> usize {
        queued_gets_max(self.limits.max_data)
    }

    fn queueing(&self) -> bool {
        self.store.concurrency() > 0
    }

    /// Queue a plain get of `keys`; `false` (nothing done) if it must run on its own: keys
    /// over the limit (its `CLIENT_ERROR`), or more keys than one queue holds (it may pause).
    pub(super) fn queue_get(&mut self, keys: &[Vec<u8>]) -> bool {
        if !self.queueing()
            || keys.is_empty()
            || keys.len() > self.queued_gets_max()
            || keys.iter().any(|k| k.len() > self.limits.max_key)
        {
            return false;
        }
        if self.queued_gets + keys.len() > self.queued_gets_max()
            || self.queued.len() + keys.len() > MAX_QUEUED
        {
            self.run_queued();
        }
        for (i, key) in keys.iter().enumerate() {
            self.counters.cmd_get.fetch_add(1, Ordering::Relaxed);
            self.queued.push(Queued::Get {
                key: key.clone(),
                last: i + 1 == keys.len(),
            });
            self.queued_ops.push(Op::get(key.clone()));
        }
        self.queued_gets += keys.len();
        true
    }

    /// Queue a `set`; `false` (nothing done) if it must run on its own: a key over the limit,
    /// or an exptime already past (a delete).
    pub(super) fn queue_set(&mut self, s: &StoreReq) -> bool {
        if !self.queueing() || s.key.len() > self.limits.max_key {
            return false;
        }
        let Some(expires) = item::expires_at(s.exptime, unix_now_ms()) else {
            return false;
        };
        if self.queued.len() >= MAX_QUEUED {
            self.run_queued();
        }
        self.counters.cmd_set.fetch_add(1, Ordering::Relaxed);
        let mut stored = Vec::with_capacity(item::HEADER_LEN + s.data.len());
        item::encode(&mut stored, s.flags, expires, &s.data);
        self.queued.push(Queued::Set { noreply: s.noreply });
        self.queued_ops.push(Op::Put {
            key: s.key.clone(),
            value: stored,
            expires_ns: item::store_expiry(expires),
        });
        true
    }

    /// Run the queue, if any, and write its replies in order. The clock is read once.
    pub(super) fn run_queued(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        let mut done = std::mem::take(&mut self.queued_done);
        done.clear();
        self.store.run_all(&mut self.queued_ops, &mut done);
        assert_eq!(
            done.len(),
            self.queued.len(),
            "one result per queued operation"
        );
        let now = unix_now_ms();
        let queued = std::mem::take(&mut self.queued);
        // Whether the get being answered failed on a key: the rest of its reply is dropped.
        let mut get_failed = false;
        for (q, r) in queued.iter().zip(done.drain(..)) {
            match q {
                Queued::Get { key, last } => {
                    if !get_failed {
                        get_failed = self.answer_get(key, r, now);
                        if *last && !get_failed {
                            self.out.extend_from_slice(b"END\r\n");
                        }
                    } else {
                        // Run alone, the get would not have asked for this key.
                        self.counters.cmd_get.fetch_sub(1, Ordering::Relaxed);
                    }
                    if *last {
                        get_failed = false;
                    }
                }
                Queued::Set { noreply } => match r {
                    Ok(Outcome::Put) => self.reply(b"STORED\r\n", *noreply),
                    Err(e) => self.fail(&e, *noreply),
                    Ok(o) => unreachable!("a queued set answered {o:?}"),
                },
            }
        }
        self.queued = queued;
        self.queued.clear();
        self.queued_done = done;
        self.queued_gets = 0;
    }

    /// Answer one key of a queued get; `true` if the store failed on it (its reply ends).
    fn answer_get(&mut self, key: &[u8], r: Result<Outcome, Error>, now: u64) -> bool {
        match r {
            Ok(Outcome::Got(Some(v))) => match item::decode_at(&v, || now) {
                Some(it) => {
                    self.counters.get_hits.fetch_add(1, Ordering::Relaxed);
                    encode_value(&mut self.out, key, it.flags, it.data, None);
                }
                None => {
                    self.counters.get_misses.fetch_add(1, Ordering::Relaxed);
                }
            },
            Ok(Outcome::Got(None)) => {
                self.counters.get_misses.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.server_error(&e);
                return true;
            }
            Ok(o) => unreachable!("a queued get answered {o:?}"),
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::MAX_QUEUED;
    use crate::memcached::serve::{serve, Limits};
    use crate::serve::{Backend, Counters};
    use crate::testing::{assert_batched_as_alone, reversed_batches_differ, Pipe};

    const LIMITS: Limits = Limits {
        max_key: 32,
        max_data: 2000,
    };

    /// A pipeline of `n` requests drawn from `seed` on four keys: gets of one to three keys and
    /// sets (queued, `noreply` ones among them) among requests that are not (`add`, `delete`,
    /// `incr`, `append`, `mn`, `mg`, a set already expired, an oversize key, an oversize or
    /// malformed data block, an unknown command).
    fn script(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut input = String::new();
        for i in 0..n {
            let k = format!("k{}", next(4));
            let v = format!("{}", i * 7);
            let line = match next(20) {
                0..=4 => format!("get {k}\r\n"),
                5..=6 => format!("get {k} k{} k{}\r\n", next(4), next(4)),
                7..=11 => format!("set {k} {} 0 {}\r\n{v}\r\n", next(3), v.len()),
                12 => format!("set {k} 0 0 {} noreply\r\n{v}\r\n", v.len()),
                13 => format!("add {k} 0 0 {}\r\n{v}\r\n", v.len()),
                14 => format!("delete {k}\r\n"),
                15 => format!("incr {k} 1\r\n"),
                // Not `gets`: the test store numbers versions across keys, so another order
                // of writes to different keys gives other (equally valid) cas uniques.
                16 => format!("append {k} 0 0 1\r\n+\r\n"),
                17 => format!("set {k} 0 -1 {}\r\n{v}\r\n", v.len()),
                18 => match next(6) {
                    0 => format!("get {}\r\n", "x".repeat(40)),
                    1 => "mn\r\n".to_string(),
                    // Over the data limit: thrown away as it arrives, then refused.
                    2 => format!("set {k} 0 0 2500\r\n{}\r\n", "z".repeat(2500)),
                    // A data block longer than its line said.
                    3 => format!("set {k} 0 0 1\r\n{v}\r\n"),
                    4 => format!("mg {k} v f\r\n"),
                    _ => "bogus\r\n".to_string(),
                },
                _ => format!("get {k} {k}\r\n"),
            };
            input.push_str(&line);
        }
        input.into_bytes()
    }

    fn run(b: &dyn Backend, input: &[u8], chunk: usize) -> String {
        let mut p = Pipe::new(input, chunk);
        serve(&mut p, b, LIMITS, &Counters::default()).unwrap();
        String::from_utf8(p.output).unwrap()
    }

    /// Replies in order and each key's requests in order (B1, B2): with batches run out of
    /// order (each key's operations in order), every reply is the one running each request
    /// alone gives, whatever the reads' sizes; batches really ran several operations.
    #[test]
    fn batched_replies_are_those_of_requests_run_one_at_a_time() {
        let script = |seed| script(seed, 150);
        let largest = assert_batched_as_alone(&script, &run, [5, 64, 1000, 1 << 16], MAX_QUEUED);
        assert!(largest > 4, "batches of at most {largest} operations");
    }

    /// A backend that breaks one key's order is noticed by the test above.
    #[test]
    fn a_backend_reordering_one_keys_operations_is_caught() {
        let script = |seed| script(seed, 150);
        assert!(
            reversed_batches_differ(&script, &run),
            "reversed batches gave the same replies"
        );
    }
}
