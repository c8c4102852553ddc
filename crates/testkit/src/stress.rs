//! Concurrency stress harness: client threads hammer a key space (with hot keys), every
//! operation is recorded with its invocation and response time, and the history is checked for
//! linearizability key by key. Works with any [`KvClient`] (any protocol, any fabric).
//!
//! Every written value is unique: its first 8 bytes are a value id (thread << 40 | sequence)
//! and the rest is filler derived from the id, so a torn or mixed-up value is detected on read
//! and reported as a read of a value nobody wrote.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nessie_check::{History, KeyId, Limits, Op, Outcome, Report, ValueId};
use nessie_protocols::{Error, KvClient};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Value id recorded for a read that returned bytes no writer produced.
pub const CORRUPT_VALUE: ValueId = u64::MAX;

#[derive(Clone, Debug)]
pub struct StressSpec {
    /// Operations each client thread performs (upper bound; see `time_limit`).
    pub ops_per_thread: u64,
    /// Keys in the key space.
    pub keys: u64,
    /// The first `hot_keys` keys receive `hot_fraction` of the operations.
    pub hot_keys: u64,
    pub hot_fraction: f64,
    /// Operation mix; the rest are PUTs.
    pub get_fraction: f64,
    pub delete_fraction: f64,
    /// Value sizes are drawn uniformly from this range (at least 8 bytes).
    pub value_size: (usize, usize),
    pub seed: u64,
    /// Hard bound on the run's duration: threads stop early when it is reached.
    pub time_limit: Duration,
    /// Keys written once by thread 0 before the measured run (e.g. to fill the index).
    pub preload_keys: u64,
}

impl Default for StressSpec {
    fn default() -> Self {
        Self {
            ops_per_thread: 10_000,
            keys: 1_000,
            hot_keys: 4,
            hot_fraction: 0.5,
            get_fraction: 0.5,
            delete_fraction: 0.1,
            value_size: (8, 64),
            seed: 1,
            time_limit: Duration::from_secs(60),
            preload_keys: 0,
        }
    }
}

/// What a stress run produced.
pub struct StressOutcome {
    pub report: Report,
    /// Operations performed (all threads, excluding preload).
    pub ops: u64,
    /// Successful operations.
    pub ok_ops: u64,
    /// Errors by kind (`Debug` of the error's variant name).
    pub errors: BTreeMap<String, u64>,
    /// Reads that returned bytes no writer wrote.
    pub corrupt_reads: u64,
    pub elapsed: Duration,
    /// True if the time limit cut the run short.
    pub truncated: bool,
}

impl std::fmt::Display for StressOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} ops ({} ok) in {:.2?}{}; errors {:?}; corrupt reads {}",
            self.ops,
            self.ok_ops,
            self.elapsed,
            if self.truncated {
                " (time limit reached)"
            } else {
                ""
            },
            self.errors,
            self.corrupt_reads
        )?;
        write!(f, "{}", self.report)
    }
}

pub fn key_bytes(k: KeyId) -> Vec<u8> {
    format!("key-{k:08}").into_bytes()
}

/// The bytes of value `id`, `len` bytes long (len ≥ 8).
pub fn value_bytes(id: ValueId, len: usize) -> Vec<u8> {
    let mut v = id.to_le_bytes().to_vec();
    v.extend(
        (8..len.max(8)).map(|i| (id.wrapping_mul(31).wrapping_add(i as u64 * 131) >> 3) as u8),
    );
    v
}

/// The id of a value written by [`value_bytes`], or [`CORRUPT_VALUE`].
pub fn value_id(bytes: &[u8]) -> ValueId {
    if bytes.len() < 8 {
        return CORRUPT_VALUE;
    }
    let id = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    if id == CORRUPT_VALUE || value_bytes(id, bytes.len()) != bytes {
        return CORRUPT_VALUE;
    }
    id
}

fn error_kind(e: &Error) -> String {
    let s = format!("{e:?}");
    s.split([' ', '{', '(']).next().unwrap_or("?").to_string()
}

/// Run `clients` (one thread each) against the spec, check the history, and hand the clients
/// back (their statistics are the caller's to inspect).
pub fn run<C: KvClient + 'static>(
    mut clients: Vec<C>,
    spec: &StressSpec,
) -> (StressOutcome, Vec<C>) {
    assert!(!clients.is_empty() && spec.keys > 0 && spec.hot_keys <= spec.keys);
    assert!(spec.value_size.0 >= 8 && spec.value_size.0 <= spec.value_size.1);
    let history = History::new();

    // Preload (recorded: it is part of the history).
    {
        let mut rec = history.recorder(0);
        let c = &mut clients[0];
        for k in 0..spec.preload_keys.min(spec.keys) {
            let id = (1u64 << 62) | k;
            let inv = rec.invoke();
            let r = c.put(&key_bytes(k), &value_bytes(id, spec.value_size.0));
            rec.complete(
                inv,
                k,
                Op::Put(id),
                if r.is_ok() {
                    Outcome::Ok(None)
                } else {
                    Outcome::Failed
                },
            );
        }
    }

    let start = Instant::now();
    let deadline = start + spec.time_limit;
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(t, mut client)| {
            let mut rec = history.recorder(t as u32);
            let spec = spec.clone();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(
                    spec.seed ^ (t as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                );
                let mut errors: BTreeMap<String, u64> = BTreeMap::new();
                let (mut ops, mut ok, mut corrupt) = (0u64, 0u64, 0u64);
                let mut truncated = false;
                for seq in 0..spec.ops_per_thread {
                    if seq % 64 == 0 && Instant::now() >= deadline {
                        truncated = true;
                        break;
                    }
                    let k = if spec.hot_keys > 0 && rng.gen_bool(spec.hot_fraction) {
                        rng.gen_range(0..spec.hot_keys)
                    } else {
                        rng.gen_range(0..spec.keys)
                    };
                    let key = key_bytes(k);
                    let dice: f64 = rng.gen();
                    let inv = rec.invoke();
                    let r: Result<(), Error> = if dice < spec.get_fraction {
                        let r = client.get(&key);
                        let out = match &r {
                            Ok(v) => {
                                let id = v.as_deref().map(value_id);
                                if id == Some(CORRUPT_VALUE) {
                                    corrupt += 1;
                                }
                                Outcome::Ok(id)
                            }
                            Err(_) => Outcome::Failed,
                        };
                        rec.complete(inv, k, Op::Get, out);
                        r.map(|_| ())
                    } else if dice < spec.get_fraction + spec.delete_fraction {
                        let r = client.delete(&key);
                        rec.complete(
                            inv,
                            k,
                            Op::Delete,
                            if r.is_ok() {
                                Outcome::Ok(None)
                            } else {
                                Outcome::Failed
                            },
                        );
                        r
                    } else {
                        let id = (t as u64) << 40 | seq;
                        let len = rng.gen_range(spec.value_size.0..=spec.value_size.1);
                        let r = client.put(&key, &value_bytes(id, len));
                        rec.complete(
                            inv,
                            k,
                            Op::Put(id),
                            if r.is_ok() {
                                Outcome::Ok(None)
                            } else {
                                Outcome::Failed
                            },
                        );
                        r
                    };
                    match r {
                        Ok(()) => ok += 1,
                        Err(e) => *errors.entry(error_kind(&e)).or_default() += 1,
                    }
                    ops += 1;
                }
                drop(rec);
                (client, ops, ok, corrupt, errors, truncated)
            })
        })
        .collect();

    let mut out_clients = Vec::new();
    let (mut ops, mut ok_ops, mut corrupt_reads) = (0, 0, 0);
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut truncated = false;
    for t in threads {
        let (c, o, k, cr, e, tr) = t.join().expect("stress thread panicked");
        out_clients.push(c);
        ops += o;
        ok_ops += k;
        corrupt_reads += cr;
        truncated |= tr;
        for (kind, n) in e {
            *errors.entry(kind).or_default() += n;
        }
    }
    let elapsed = start.elapsed();
    let events = history.into_events();
    let report = nessie_check::check(&events, |_| None, &Limits::default());
    (
        StressOutcome {
            report,
            ops,
            ok_ops,
            errors,
            corrupt_reads,
            elapsed,
            truncated,
        },
        out_clients,
    )
}
