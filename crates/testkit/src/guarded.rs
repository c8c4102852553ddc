//! Stress of conditional writes: client threads mix plain GETs, PUTs and DELETEs with every
//! kind of conditional write (add, replace, read-modify-write on a version, delete on a
//! version) on a few hot keys, recording everything for the linearizability checker, whose
//! model judges conditional writes (`nessie_check::Cond`).
//!
//! A read-modify-write is two operations in the history: the versioned GET (a Get of the
//! value it returned) and the write conditional on that version, recorded as conditional on
//! that value (values are unique, and a version names one entry, so one value).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nessie_check::{Cond as CheckCond, History, Limits, Op, Outcome, Recorder};
use nessie_protocols::{Cond, CondOutcome, Error, KvClient};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::stress::{
    failed_writes_read, key_bytes, put_id, value_bytes, value_id, StressOutcome, CORRUPT_VALUE,
};

/// The workload of a conditional-write stress run.
#[derive(Clone, Debug)]
pub struct GuardedSpec {
    /// Operations each thread performs (a read-modify-write counts once).
    pub ops_per_thread: u64,
    pub keys: u64,
    /// The first `hot_keys` keys receive `hot_fraction` of the operations.
    pub hot_keys: u64,
    pub hot_fraction: f64,
    /// Length of every value (at least 8).
    pub value_len: usize,
    pub seed: u64,
    /// Threads stop when it is reached.
    pub time_limit: Duration,
}

/// What one operation of the mix is, in percent (the remainder are read-modify-writes).
const GET_PCT: u32 = 25;
const PUT_PCT: u32 = 15;
const DELETE_PCT: u32 = 5;
const ADD_PCT: u32 = 15;
const REPLACE_PCT: u32 = 5;
const DELETE_IF_PCT: u32 = 10;

/// One thread of the mix: its client, its part of the history and its counts. The simulator
/// runs it on simulated threads with a virtual-time recorder.
pub struct Worker<C> {
    pub client: C,
    thread: u32,
    rec: Recorder,
    rng: SmallRng,
    /// Operations done, those that succeeded, and reads of bytes nobody wrote.
    pub ops: u64,
    pub ok: u64,
    pub corrupt: u64,
    /// Failed operations by error kind.
    pub errors: BTreeMap<String, u64>,
    buf: Vec<u8>,
    value_len: usize,
    hot_keys: u64,
    hot_fraction: f64,
    keys: u64,
}

impl<C: KvClient> Worker<C> {
    /// Client `thread`'s worker, recording into `rec`, seeded from `spec.seed`.
    pub fn new(thread: u32, client: C, rec: Recorder, spec: &GuardedSpec) -> Self {
        assert!(spec.hot_keys >= 1 && spec.hot_keys <= spec.keys && spec.value_len >= 8);
        Worker {
            client,
            thread,
            rec,
            rng: SmallRng::seed_from_u64(spec.seed ^ ((thread as u64 + 1) * 0x9E37_79B9)),
            ops: 0,
            ok: 0,
            corrupt: 0,
            errors: BTreeMap::new(),
            buf: Vec::new(),
            value_len: spec.value_len,
            hot_keys: spec.hot_keys,
            hot_fraction: spec.hot_fraction,
            keys: spec.keys,
        }
    }

    /// Perform one operation of the mix on a key drawn from the spec's distribution.
    pub fn step(&mut self) {
        let k = if self.rng.gen_bool(self.hot_fraction) {
            self.rng.gen_range(0..self.hot_keys)
        } else {
            self.rng.gen_range(0..self.keys)
        };
        self.one(k);
        self.ops += 1;
    }

    /// Hand the recorded events to the history.
    pub fn flush(&mut self) {
        self.rec.flush();
    }

    fn record(&mut self, key: u64, op: Op, started: nessie_check::Invocation, o: Outcome) {
        if o == Outcome::Ok(Some(CORRUPT_VALUE)) {
            self.corrupt += 1;
        }
        self.rec.complete(started, key, op, o);
    }

    fn count<T>(&mut self, r: &Result<T, Error>) {
        match r {
            Ok(_) => self.ok += 1,
            Err(e) => {
                let kind = format!("{e:?}");
                let kind = kind
                    .split([' ', '{', '('])
                    .next()
                    .unwrap_or("?")
                    .to_string();
                *self.errors.entry(kind).or_default() += 1;
            }
        }
    }

    fn cond_outcome(r: &Result<CondOutcome, Error>) -> Outcome {
        match r {
            Ok(CondOutcome::Stored) => Outcome::Ok(None),
            Ok(CondOutcome::Unmet { .. }) => Outcome::Unmet,
            Err(_) => Outcome::Failed,
        }
    }

    /// A conditional write of `key` (PUT of a fresh value, or DELETE) under `cond`, recorded
    /// under `check` (the same condition in the checker's terms).
    fn conditional(&mut self, k: u64, put: bool, cond: Cond, check: CheckCond) {
        let key = key_bytes(k);
        let id = put_id(self.thread, self.ops);
        let t = self.rec.invoke();
        let (op, r) = if put {
            let value = value_bytes(id, self.value_len);
            (Op::PutIf(id, check), self.client.put_if(&key, &value, cond))
        } else {
            (Op::DeleteIf(check), self.client.delete_if(&key, cond))
        };
        self.record(k, op, t, Self::cond_outcome(&r));
        self.count(&r);
    }

    /// A versioned GET, then a write conditional on what it returned.
    fn read_modify_write(&mut self, k: u64, put: bool) {
        let key = key_bytes(k);
        let t = self.rec.invoke();
        let r = self.client.get_versioned(&key, &mut self.buf);
        let read = r.as_ref().ok().map(|v| v.map(|_| value_id(&self.buf)));
        let outcome = read.map_or(Outcome::Failed, Outcome::Ok);
        self.record(k, Op::Get, t, outcome);
        self.count(&r);
        let (Ok(version), Some(seen)) = (r, read) else {
            return;
        };
        let (cond, check) = match (version, seen) {
            (Some(v), Some(id)) => (Cond::Version(v), CheckCond::Is(id)),
            _ => (Cond::Absent, CheckCond::Absent),
        };
        self.conditional(k, put, cond, check);
    }

    fn one(&mut self, k: u64) {
        let key = key_bytes(k);
        let dice = self.rng.gen_range(0..100);
        let id = put_id(self.thread, self.ops);
        let mut at = 0;
        let mut next = |pct| {
            at += pct;
            dice < at
        };
        if next(GET_PCT) {
            let t = self.rec.invoke();
            let r = self.client.get_into(&key, &mut self.buf);
            let o = match &r {
                Ok(true) => Outcome::Ok(Some(value_id(&self.buf))),
                Ok(false) => Outcome::Ok(None),
                Err(_) => Outcome::Failed,
            };
            self.record(k, Op::Get, t, o);
            self.count(&r);
        } else if next(PUT_PCT) {
            let t = self.rec.invoke();
            let r = self.client.put(&key, &value_bytes(id, self.value_len));
            self.record(k, Op::Put(id), t, plain_outcome(&r));
            self.count(&r);
        } else if next(DELETE_PCT) {
            let t = self.rec.invoke();
            let r = self.client.delete(&key);
            self.record(k, Op::Delete, t, plain_outcome(&r));
            self.count(&r);
        } else if next(ADD_PCT) {
            self.conditional(k, true, Cond::Absent, CheckCond::Absent);
        } else if next(REPLACE_PCT) {
            self.conditional(k, true, Cond::Present, CheckCond::Present);
        } else if next(DELETE_IF_PCT) {
            self.read_modify_write(k, false);
        } else {
            self.read_modify_write(k, true);
        }
    }
}

fn plain_outcome(r: &Result<(), Error>) -> Outcome {
    match r {
        Ok(()) => Outcome::Ok(None),
        Err(_) => Outcome::Failed,
    }
}

/// One thread running the mix on `client` until `spec.ops_per_thread` or `deadline`; it hands
/// back its worker and whether the deadline cut it short.
fn spawn_worker<C: KvClient + 'static>(
    thread: u32,
    client: C,
    history: &History,
    spec: &GuardedSpec,
    deadline: Instant,
) -> std::thread::JoinHandle<(Worker<C>, bool)> {
    let ops = spec.ops_per_thread;
    let mut w = Worker::new(thread, client, history.recorder(thread), spec);
    std::thread::spawn(move || {
        let mut truncated = false;
        while w.ops < ops {
            if w.ops.is_multiple_of(64) && Instant::now() >= deadline {
                truncated = true;
                break;
            }
            w.step();
        }
        w.flush();
        (w, truncated)
    })
}

/// Run `clients` (one thread each) on the mix, check the history, and hand the clients back.
pub fn run_guarded<C: KvClient + 'static>(
    clients: Vec<C>,
    spec: &GuardedSpec,
) -> (StressOutcome, Vec<C>) {
    let history = History::new();
    let start = Instant::now();
    let deadline = start + spec.time_limit;
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(t, client)| spawn_worker(t as u32, client, &history, spec, deadline))
        .collect();
    let (mut ops, mut ok_ops, mut corrupt_reads, mut truncated) = (0, 0, 0, false);
    let mut errors = BTreeMap::new();
    let mut clients = Vec::new();
    for t in threads {
        let (w, cut) = t.join().expect("stress thread panicked");
        ops += w.ops;
        ok_ops += w.ok;
        corrupt_reads += w.corrupt;
        truncated |= cut;
        for (k, n) in w.errors {
            *errors.entry(k).or_default() += n;
        }
        clients.push(w.client);
    }
    let elapsed = start.elapsed();
    let events = history.into_events();
    let out = StressOutcome {
        failed_writes_read: failed_writes_read(&events),
        report: nessie_check::check(&events, |_| None, &Limits::default()),
        ops,
        ok_ops,
        errors,
        corrupt_reads,
        elapsed,
        truncated,
        evictions: 0, // guarded workers run without eviction
        evictions_unsure: 0,
        longest_stall: crate::stress::longest_stall(&events),
        expiries: 0,
    };
    (out, clients)
}
