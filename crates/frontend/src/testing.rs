//! What the front ends' unit tests share: a store in a map and a scripted stream.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::Mutex;

use nessie_protocols::{Cond, CondOutcome, Error, KvClient, Version};

use crate::serve::{Backend, Lease};

/// A store in a map, as one client: each key's value with its version (a counter bumped by
/// every write, as an ITE word changes with every write in the store).
#[derive(Default)]
pub struct MapClient(pub HashMap<Vec<u8>, (Vec<u8>, Version)>, pub Version);

impl MapClient {
    fn version(&self, key: &[u8]) -> Option<Version> {
        self.0.get(key).map(|(_, v)| *v)
    }
}

impl KvClient for MapClient {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.0.get(key).map(|(v, _)| v.clone()))
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        if value.len() > 1000 {
            return Err(Error::DataTableFull {
                node: 0,
                entry_size: value.len() as u64,
                awaiting_expiry: 0,
            });
        }
        self.1 += 1;
        self.0.insert(key.to_vec(), (value.to_vec(), self.1));
        Ok(())
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        self.0.remove(key);
        Ok(())
    }
    fn get_versioned(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Version>, Error> {
        out.clear();
        Ok(self.0.get(key).map(|(v, ver)| {
            out.extend_from_slice(v);
            *ver
        }))
    }
    fn put_if(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        let current = self.version(key);
        if !cond.holds(current) {
            return Ok(CondOutcome::Unmet { current });
        }
        self.put(key, value)?;
        Ok(CondOutcome::Stored)
    }
    fn scan_keys(&mut self) -> Result<Vec<Vec<u8>>, Error> {
        Ok(self.0.keys().cloned().collect())
    }
    /// The map's "index": its keys in order, key `i` in slot `i`.
    fn scan_keys_in(&mut self, slots: std::ops::Range<u64>) -> Result<Vec<Vec<u8>>, Error> {
        let mut keys: Vec<Vec<u8>> = self.0.keys().cloned().collect();
        keys.sort();
        let end = (slots.end as usize).min(keys.len());
        Ok(keys.drain(..end).skip(slots.start as usize).collect())
    }
    fn delete_if(&mut self, key: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        let current = self.version(key);
        if !cond.holds(current) {
            return Ok(CondOutcome::Unmet { current });
        }
        self.delete(key)?;
        Ok(CondOutcome::Stored)
    }
}

#[derive(Default)]
pub struct MapBackend(pub Mutex<MapClient>);

impl Backend for MapBackend {
    fn lease(&self) -> Box<dyn Lease + '_> {
        Box::new(self.0.lock().unwrap())
    }
}

/// A [`MapBackend`] that counts the clients it lent.
#[derive(Default)]
pub struct CountingBackend {
    pub map: MapBackend,
    pub leases: std::sync::atomic::AtomicUsize,
}

impl Backend for CountingBackend {
    fn lease(&self) -> Box<dyn Lease + '_> {
        self.leases
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.map.lease()
    }
}

/// A connection's stream: the client's bytes, delivered `chunk` at a time, and what the
/// server wrote.
pub struct Pipe {
    pub input: Vec<u8>,
    pub at: usize,
    pub chunk: usize,
    pub output: Vec<u8>,
    /// The most bytes written at once: what the session held.
    pub largest_write: usize,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.chunk.min(buf.len()).min(self.input.len() - self.at);
        buf[..n].copy_from_slice(&self.input[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.largest_write = self.largest_write.max(buf.len());
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Pipe {
    /// A stream delivering `input` `chunk` bytes at a time.
    pub fn new(input: &[u8], chunk: usize) -> Pipe {
        Pipe {
            input: input.to_vec(),
            at: 0,
            chunk,
            output: Vec::new(),
            largest_write: 0,
        }
    }
}

/// A race at will: before each of its first `races` conditional writes, `race` writes to the
/// store, as another client would between this one's read and its conditional write (so the
/// condition no longer holds, and the command must read again).
pub struct RacingClient {
    pub inner: MapClient,
    races_left: usize,
    races_run: usize,
    race: Box<dyn FnMut(&mut MapClient) + Send>,
}

impl RacingClient {
    pub fn new(
        inner: MapClient,
        races: usize,
        race: impl FnMut(&mut MapClient) + Send + 'static,
    ) -> Self {
        RacingClient {
            inner,
            races_left: races,
            races_run: 0,
            race: Box::new(race),
        }
    }

    /// How many races were run.
    pub fn races_run(&self) -> usize {
        self.races_run
    }

    fn maybe_race(&mut self) {
        if self.races_left > 0 {
            self.races_left -= 1;
            self.races_run += 1;
            (self.race)(&mut self.inner);
        }
    }
}

impl KvClient for RacingClient {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.inner.get(key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.inner.put(key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        self.inner.delete(key)
    }
    fn get_versioned(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Option<Version>, Error> {
        self.inner.get_versioned(key, out)
    }
    fn put_if(&mut self, key: &[u8], value: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        self.maybe_race();
        self.inner.put_if(key, value, cond)
    }
    fn put_if_expiring(
        &mut self,
        key: &[u8],
        value: &[u8],
        cond: Cond,
        at: u64,
    ) -> Result<CondOutcome, Error> {
        self.maybe_race();
        self.inner.put_if_expiring(key, value, cond, at)
    }
    fn delete_if(&mut self, key: &[u8], cond: Cond) -> Result<CondOutcome, Error> {
        self.maybe_race();
        self.inner.delete_if(key, cond)
    }
    fn scan_keys_in(&mut self, slots: std::ops::Range<u64>) -> Result<Vec<Vec<u8>>, Error> {
        self.inner.scan_keys_in(slots)
    }
}

/// A backend lending one client of any kind.
pub struct OneClient<C>(pub Mutex<C>);

impl<C: KvClient + Send> Backend for OneClient<C> {
    fn lease(&self) -> Box<dyn Lease + '_> {
        Box::new(self.0.lock().unwrap())
    }
}

/// A client of a mode without conditional writes (the trait's defaults answer Unsupported).
#[derive(Default)]
pub struct PlainClient(pub HashMap<Vec<u8>, Vec<u8>>);

impl KvClient for PlainClient {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.0.get(key).cloned())
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.0.insert(key.to_vec(), value.to_vec());
        Ok(())
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        self.0.remove(key);
        Ok(())
    }
}

/// A store's gauges fixed at `evictions`, `policy` and `figures`, for tests of `stats` and
/// `INFO`.
#[derive(Debug)]
pub struct FixedGauges {
    pub evictions: u64,
    pub policy: &'static str,
    pub figures: crate::serve::StoreFigures,
}

impl crate::serve::StoreGauges for FixedGauges {
    fn evictions(&self) -> u64 {
        self.evictions
    }
    fn eviction_policy(&self) -> &'static str {
        self.policy
    }
    fn tracks_access(&self) -> bool {
        self.policy.ends_with("-lru") || self.policy.ends_with("-lfu")
    }
    fn figures(&self) -> crate::serve::StoreFigures {
        self.figures
    }
}

/// The figures [`counters_with_gauges`] reports.
pub const FIXED_FIGURES: crate::serve::StoreFigures = crate::serve::StoreFigures {
    items: 11,
    bytes: 2200,
    used_bytes: 65536,
    limit_bytes: 1 << 20,
};

/// Counters whose store reports `evictions` evicted items under `policy`.
pub fn counters_with_gauges(evictions: u64, policy: &'static str) -> crate::serve::Counters {
    let c = crate::serve::Counters::default();
    c.store
        .set(std::sync::Arc::new(FixedGauges {
            evictions,
            policy,
            figures: FIXED_FIGURES,
        }))
        .expect("fresh counters");
    c
}

/// A [`MapBackend`] that runs batches "concurrently": in an order other than the one given,
/// as operations in flight may finish, while keeping each key's operations in order (the
/// pipeline's P1): keys are taken last-seen first, each key's operations in order. It records
/// the size of every batch it ran. `mutation_reverse` runs each batch backwards, one key's
/// operations too (breaks P1): a test of ordering must notice.
#[derive(Default)]
pub struct ScramblingBackend {
    pub map: MapBackend,
    pub concurrency: usize,
    pub batches: Mutex<Vec<usize>>,
    pub mutation_reverse: bool,
}

impl Backend for ScramblingBackend {
    fn lease(&self) -> Box<dyn Lease + '_> {
        self.map.lease()
    }

    fn concurrency(&self) -> usize {
        self.concurrency
    }

    fn run_concurrently(
        &self,
        ops: &mut Vec<crate::serve::Op>,
        done: &mut Vec<Result<crate::serve::Outcome, Error>>,
    ) -> bool {
        self.batches.lock().unwrap().push(ops.len());
        let mut order: Vec<usize> = (0..ops.len()).collect();
        if self.mutation_reverse {
            order.reverse();
        } else {
            // Keys in order of their last appearance, backwards; each key's operations in order.
            let mut keys: Vec<&[u8]> = Vec::new();
            for op in ops.iter().rev() {
                if !keys.contains(&op.key()) {
                    keys.push(op.key());
                }
            }
            order.sort_by_key(|&i| {
                let k = keys.iter().position(|k| *k == ops[i].key()).unwrap();
                (k, i)
            });
        }
        let mut results: Vec<Option<Result<crate::serve::Outcome, Error>>> =
            (0..ops.len()).map(|_| None).collect();
        let mut client = self.map.0.lock().unwrap();
        for i in order {
            results[i] = Some(ops[i].run(&mut *client));
        }
        done.extend(results.into_iter().map(|r| r.expect("every operation ran")));
        ops.clear();
        true
    }
}

/// A session's replies to `input`, delivered `chunk` bytes per read, served from a backend.
pub type RunSession<'a> = &'a dyn Fn(&dyn Backend, &[u8], usize) -> String;

/// For each of 200 seeds, the input `script` draws, read in chunks of `chunks` in turn: its
/// replies served with batches run out of order ([`ScramblingBackend`]) are those served one
/// command at a time, and no batch ran more than `max_queued` operations. Returns the largest
/// batch run.
pub fn assert_batched_as_alone(
    script: &dyn Fn(u64) -> Vec<u8>,
    run: RunSession<'_>,
    chunks: [usize; 4],
    max_queued: usize,
) -> usize {
    let mut largest = 0;
    for seed in 0..200 {
        let input = script(seed);
        let chunk = chunks[seed as usize % chunks.len()];
        let alone = run(&MapBackend::default(), &input, chunk);
        let b = ScramblingBackend {
            concurrency: 8,
            ..Default::default()
        };
        let batched = run(&b, &input, chunk);
        assert_eq!(batched, alone, "seed {seed}, reads of {chunk} bytes");
        let sizes = b.batches.lock().unwrap();
        assert!(sizes.iter().all(|&n| (1..=max_queued).contains(&n)));
        largest = largest.max(sizes.iter().copied().max().unwrap_or(0));
    }
    largest
}

/// Whether some of 50 inputs `script` draws gets other replies when each batch runs backwards
/// (the mutation of [`ScramblingBackend`]) than when each command runs on its own.
pub fn reversed_batches_differ(script: &dyn Fn(u64) -> Vec<u8>, run: RunSession<'_>) -> bool {
    (0..50).any(|seed| {
        let input = script(seed);
        let alone = run(&MapBackend::default(), &input, 1 << 16);
        let b = ScramblingBackend {
            concurrency: 8,
            mutation_reverse: true,
            ..Default::default()
        };
        run(&b, &input, 1 << 16) != alone
    })
}
