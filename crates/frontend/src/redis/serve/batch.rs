//! A pipelined batch's plain GETs and SETs run concurrently (issue 44): while commands arrive
//! back to back in one read, each `GET key` and `SET key value` (no options) is queued instead
//! of run, and the queue runs as one batch through the backend's operations in flight
//! ([`crate::serve::Backend::run_concurrently`]) before any other command, any reply that does
//! not come from the queue, and the end of the read.
//!
//! Invariants:
//! - B1: replies go out in command order: the queue's replies are written, in queue order,
//!   before any reply of a later command (every other path flushes the queue first).
//! - B2: commands on one key keep their order: the backend runs one key's operations in the
//!   order given (the pipeline's P1), and a command that is not queued runs after the queue.
//! - B3: a queue holds at most [`MAX_QUEUED`] commands and at most
//!   [`crate::serve::queued_gets_max`] GETs, so that its replies hold at most
//!   [`crate::serve::QUEUED_REPLY_MAX`] bytes of values even with the largest values.
//!
//! What B1 and B2 do not keep: the order in which commands on *different* keys take effect.
//! Another client may see a connection's later SET before its earlier one (`SET data …`,
//! `SET flag 1`), which Redis, running a connection's commands one after the other, never
//! shows. That is why `[frontends] inflight` is off by default (`docs/frontends.md`).
//! - Without a concurrent backend (`concurrency() == 0`) nothing is queued: each command runs
//!   as before, GETs read in place.

use std::sync::atomic::Ordering;

use nessie_protocols::Error;

use super::Conn;
use crate::item;
use crate::serve::{queued_gets_max, unix_now_ms, Op, Outcome, MAX_QUEUED};

/// What a queued command answers with.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Queued {
    Get,
    Set,
}

impl Conn<'_> {
    /// Most GETs one queue holds (B3).
    fn queued_gets_max(&self) -> usize {
        queued_gets_max(self.limits.max_value)
    }

    /// Queue `args` if it is a plain GET or SET that may run with others; `false` (nothing
    /// done) for every other command, which then runs on its own after the queue.
    pub(super) fn queue(&mut self, args: &[&[u8]]) -> bool {
        if !self.authed || self.store.concurrency() == 0 {
            return false;
        }
        // Empty and oversize keys take the one-at-a-time path and its errors.
        let (kind, op) = match args {
            [name, key] if name.eq_ignore_ascii_case(b"get") && self.queueable_key(key) => {
                if self.queued_gets >= self.queued_gets_max() {
                    self.run_queued();
                }
                self.queued_gets += 1;
                self.counters.cmd_get.fetch_add(1, Ordering::Relaxed);
                (Queued::Get, Op::get(*key))
            }
            [name, key, value] if name.eq_ignore_ascii_case(b"set") && self.queueable_key(key) => {
                self.counters.cmd_set.fetch_add(1, Ordering::Relaxed);
                let mut stored = Vec::with_capacity(item::HEADER_LEN + value.len());
                item::encode(&mut stored, 0, 0, value);
                (Queued::Set, Op::put(*key, stored))
            }
            _ => return false,
        };
        self.queued.push(kind);
        self.queued_ops.push(op);
        if self.queued.len() >= MAX_QUEUED {
            self.run_queued();
        }
        true
    }

    fn queueable_key(&self, key: &[u8]) -> bool {
        !key.is_empty() && key.len() <= self.limits.max_key
    }

    /// Run the queue, if any, and write its replies in order (B1). The clock is read once for
    /// the whole batch.
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
            "one result per queued command"
        );
        let now = unix_now_ms();
        let kinds = std::mem::take(&mut self.queued);
        for (&kind, r) in kinds.iter().zip(done.drain(..)) {
            self.answer_queued(kind, r, now);
        }
        self.queued = kinds;
        self.queued.clear();
        self.queued_done = done;
        self.queued_gets = 0;
    }

    fn answer_queued(&mut self, kind: Queued, r: Result<Outcome, Error>, now: u64) {
        match (kind, r) {
            (Queued::Get, Ok(Outcome::Got(Some(v)))) => match item::decode_at(&v, || now) {
                Some(it) => {
                    self.counters.get_hits.fetch_add(1, Ordering::Relaxed);
                    self.enc.bulk(&mut self.out, it.data);
                }
                // Expired: absent, as a GET run on its own says.
                None => {
                    self.counters.get_misses.fetch_add(1, Ordering::Relaxed);
                    self.enc.null(&mut self.out);
                }
            },
            (Queued::Get, Ok(Outcome::Got(None))) => {
                self.counters.get_misses.fetch_add(1, Ordering::Relaxed);
                self.enc.null(&mut self.out);
            }
            (Queued::Set, Ok(Outcome::Put)) => self.enc.simple(&mut self.out, "OK"),
            (_, Err(e)) => self.store_error(&e),
            (kind, Ok(o)) => unreachable!("a queued {kind:?} answered {o:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MAX_QUEUED;
    use crate::redis::serve::{serve, RespLimits};
    use crate::serve::{Backend, Counters};
    use crate::testing::{
        assert_batched_as_alone, reversed_batches_differ, Pipe, ScramblingBackend,
    };

    const LIMITS: RespLimits = RespLimits {
        max_key: 32,
        max_value: 2000,
    };

    fn cmd(words: &[String]) -> Vec<u8> {
        let mut v = format!("*{}\r\n", words.len()).into_bytes();
        for w in words {
            v.extend_from_slice(format!("${}\r\n{w}\r\n", w.len()).as_bytes());
        }
        v
    }

    /// A pipeline of `n` commands drawn from `seed` on four keys: plain GETs and SETs (queued)
    /// among commands that are not (SET NX, DEL, APPEND, MGET, PING, an oversize key, an empty
    /// key, an oversize value, HELLO 3, a refused AUTH, an unknown command).
    fn script(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let mut input = Vec::new();
        for i in 0..n {
            let k = format!("k{}", next(4));
            let w: Vec<String> = match next(20) {
                0..=6 => vec!["GET".into(), k],
                7..=13 => vec!["set".into(), k, format!("v{i}")],
                14 => vec!["SET".into(), k, format!("n{i}"), "NX".into()],
                15 => vec!["DEL".into(), k],
                16 => vec!["APPEND".into(), k, format!("+{i}")],
                17 => vec!["MGET".into(), k, "k1".into()],
                18 => match next(6) {
                    0 => vec!["GET".into(), "x".repeat(40)],
                    1 => vec!["GET".into(), String::new()],
                    // Over the value limit: thrown away as it arrives, then refused.
                    2 => vec!["SET".into(), k, "z".repeat(2500)],
                    // RESP3 from here on: every later reply is encoded so.
                    3 => vec!["HELLO".into(), "3".into()],
                    4 => vec!["AUTH".into(), "nobody".into(), "x".into()],
                    _ => vec!["NOSUCH".into(), k],
                },
                _ => vec!["PING".into()],
            };
            input.extend(cmd(&w));
        }
        input
    }

    fn run(b: &dyn Backend, input: &[u8], chunk: usize) -> String {
        let mut p = Pipe::new(input, chunk);
        serve(&mut p, b, LIMITS, &Counters::default(), 7).unwrap();
        String::from_utf8(p.output).unwrap()
    }

    /// B1 and B2: with batches run out of order (each key's operations in order), every reply
    /// is the one running each command alone gives, in command order, whatever the reads'
    /// sizes; and batches really ran several commands, never more than a queue holds.
    #[test]
    fn batched_replies_are_those_of_commands_run_one_at_a_time() {
        let script = |seed| script(seed, 150);
        let largest = assert_batched_as_alone(&script, &run, [7, 64, 1000, 1 << 16], MAX_QUEUED);
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

    /// A long run of GETs of large values is cut into queues whose largest replies stay within
    /// the queue's budget (B3): no queue holds more GETs than fit in it.
    #[test]
    fn a_queue_holds_no_more_gets_than_the_reply_limit_allows() {
        let limits = RespLimits {
            max_key: 32,
            max_value: crate::serve::QUEUED_REPLY_MAX / 3,
        };
        let b = ScramblingBackend {
            concurrency: 8,
            ..Default::default()
        };
        let mut input = cmd(&["SET".into(), "big".into(), "y".repeat(900)]);
        for _ in 0..10 {
            input.extend(cmd(&["GET".into(), "big".into()]));
        }
        let mut p = Pipe::new(&input, 1 << 20);
        serve(&mut p, &b, limits, &Counters::default(), 7).unwrap();
        let out = String::from_utf8(p.output).unwrap();
        assert_eq!(out.matches(&"y".repeat(900)).count(), 10, "{out:.200}");
        let sizes = b.batches.lock().unwrap().clone();
        assert!(sizes.iter().all(|&n| n <= 4), "batches {sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), 11);
    }
}
