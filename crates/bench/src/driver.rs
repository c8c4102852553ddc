//! The one workload loop every load generator runs: the benchmark agent inside node processes,
//! the demo and the concurrency stress harness. They differ only in when they stop, how keys
//! and values are spelled and what they record around each operation; an [`Observer`] supplies
//! those, so the loop itself (draw, invoke, perform, complete) is written once.

use std::borrow::Cow;
use std::collections::HashMap;

use nessie_fabric::Post;
use nessie_inflight::{Completion, Op, Outcome, Pipeline, Ticket};

use nessie_protocols::{Error, KvClient};
use rand::rngs::SmallRng;

use crate::workload::{OpKind, Planned, Workload};

/// What an operation returned, by kind. A GET's value is borrowed from the loop's read buffer,
/// which every GET reuses: no allocation per operation.
#[derive(Debug)]
pub enum Done<'a> {
    Got(Option<&'a [u8]>),
    Put,
    Deleted,
}

/// A load generator's side of the loop.
pub trait Observer<C> {
    /// What `invoke` hands to `complete` (a start time, a history invocation, counters).
    type Token;
    /// Whether to perform operation `seq`. An open-loop generator waits for its arrival here.
    fn proceed(&mut self, client: &C, seq: u64) -> bool;
    /// The bytes of key index `k`.
    fn key(&self, k: u64) -> Vec<u8>;
    /// The bytes of key index `k` into `out`, replacing its contents (observers on a hot path
    /// override it to spare the allocation).
    fn key_into(&self, k: u64, out: &mut Vec<u8>) {
        *out = self.key(k);
    }
    /// The value a PUT writes (may borrow a buffer the observer keeps).
    fn value(&self, op: &Planned) -> Cow<'_, [u8]>;
    /// When the item a PUT writes expires (ns since the Unix epoch; 0 = never, the default),
    /// asked after [`Observer::invoke`].
    fn expires(&mut self, op: &Planned) -> u64 {
        let _ = op;
        0
    }
    /// Just before the operation is issued.
    fn invoke(&mut self, client: &C, op: &Planned) -> Self::Token;
    /// With several operations in flight, just before [`Observer::complete`]: what this one
    /// did beside its result, which the counters around it would mix with the others' or
    /// which a pipeline is no client to ask: its fabric operations, the keys it evicted
    /// (`KvClient::evicted`), its aborted attempts and retries.
    fn completed_in_flight(&mut self, done: &Completion) {
        let _ = done;
    }
    /// Just after it returned.
    fn complete(
        &mut self,
        client: &C,
        op: &Planned,
        token: Self::Token,
        r: Result<Done<'_>, Error>,
    );
}

pub use nessie_protocols::{read_modify_write, MAX_RMW_ATTEMPTS};

/// Run `workload` on `client` until the observer says stop; returns the operations performed.
/// `workload` is this thread's own ([`Workload::for_thread`]).
pub fn drive<C: KvClient, O: Observer<C>>(
    client: &mut C,
    workload: &mut Workload,
    rng: &mut SmallRng,
    observer: &mut O,
) -> u64 {
    let mut seq = 0;
    let (mut got, mut key) = (Vec::new(), Vec::new());
    while observer.proceed(client, seq) {
        let op = workload.draw(seq, rng);
        observer.key_into(op.key, &mut key);
        let token = observer.invoke(client, &op);
        let r = match op.kind {
            OpKind::Get => client
                .get_into(&key, &mut got)
                .map(|found| Done::Got(found.then_some(&got[..]))),
            OpKind::Delete => client.delete(&key).map(|()| Done::Deleted),
            OpKind::Put | OpKind::Insert => {
                let at = observer.expires(&op);
                let value = observer.value(&op);
                match at {
                    0 => client.put(&key, &value),
                    at => client.put_parts_expiring(&key, &[&value], at),
                }
                .map(|()| Done::Put)
            }
            OpKind::ReadModifyWrite => {
                read_modify_write(client, &key, &observer.value(&op), &mut got).map(|()| Done::Put)
            }
        };
        observer.complete(client, &op, token, r);
        seq += 1;
    }
    seq
}

/// [`drive`] with many operations in flight: `pipeline` keeps up to its slot count running
/// (`nessie_inflight`), the observer sees each operation invoked when it is submitted and
/// completed when it finishes (in any order across keys), with the pipeline as the client.
/// Returns the operations performed.
pub fn drive_pipelined<E, O>(
    pipeline: &mut Pipeline<E>,
    workload: &mut Workload,
    rng: &mut SmallRng,
    observer: &mut O,
) -> u64
where
    E: Post + 'static,
    O: Observer<Pipeline<E>>,
{
    let mut seq = 0;
    let mut running: HashMap<Ticket, (Planned, O::Token)> = HashMap::new();
    let mut more = true;
    loop {
        while more && running.len() < pipeline.slots() {
            if !observer.proceed(pipeline, seq) {
                more = false;
                break;
            }
            let planned = workload.draw(seq, rng);
            let key = observer.key(planned.key);
            let token = observer.invoke(pipeline, &planned);
            let op = match planned.kind {
                OpKind::Get => Op::Get { key },
                OpKind::Delete => Op::Delete { key },
                OpKind::Put | OpKind::Insert => {
                    let expires_ns = observer.expires(&planned);
                    let value = observer.value(&planned).into_owned();
                    Op::Put {
                        key,
                        value,
                        expires_ns,
                    }
                }
                OpKind::ReadModifyWrite => Op::ReadModifyWrite {
                    key,
                    value: observer.value(&planned).into_owned(),
                },
            };
            running.insert(pipeline.submit(op), (planned, token));
            seq += 1;
        }
        let Some(first) = pipeline.next_done() else {
            break;
        };
        // Every operation already finished is completed before any more is submitted: one
        // completed after a later submission would look, to the observer (a history), as if
        // it ran longer than it did.
        let mut next = Some(first);
        while let Some(done) = next {
            let (planned, token) = running
                .remove(&done.ticket)
                .expect("every completion is of an operation submitted here");
            let r = match &done.result {
                Ok(Outcome::Got(v)) => Ok(Done::Got(v.as_deref())),
                Ok(Outcome::Deleted) => Ok(Done::Deleted),
                Ok(_) => Ok(Done::Put),
                Err(e) => Err(e.clone()),
            };
            observer.completed_in_flight(&done);
            observer.complete(pipeline, &planned, token, r);
            // The value's buffer, for a later GET to read into.
            if let Ok(Outcome::Got(Some(v))) = done.result {
                pipeline.recycle(v);
            }
            next = pipeline.take_done();
        }
    }
    debug_assert!(running.is_empty());
    seq
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::KeyGen;
    use rand::SeedableRng;
    use std::collections::HashMap;

    /// A map standing in for a store.
    #[derive(Default)]
    struct MapClient(HashMap<Vec<u8>, Vec<u8>>);

    impl KvClient for MapClient {
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

    /// Stops after `limit` operations and checks every GET against a shadow map.
    struct Shadow {
        limit: u64,
        model: HashMap<u64, u64>,
        invoked: u64,
        checked_gets: u64,
    }

    impl Observer<MapClient> for Shadow {
        type Token = u64;
        fn proceed(&mut self, _: &MapClient, seq: u64) -> bool {
            seq < self.limit
        }
        fn key(&self, k: u64) -> Vec<u8> {
            k.to_le_bytes().to_vec()
        }
        fn value(&self, op: &Planned) -> Cow<'_, [u8]> {
            Cow::Owned(op.seq.to_le_bytes().to_vec())
        }
        fn invoke(&mut self, _: &MapClient, op: &Planned) -> u64 {
            self.invoked += 1;
            op.seq
        }
        fn complete(
            &mut self,
            _: &MapClient,
            op: &Planned,
            token: u64,
            r: Result<Done<'_>, Error>,
        ) {
            assert_eq!(token, op.seq, "the token comes back with its operation");
            match (op.kind, r.unwrap()) {
                (OpKind::Get, Done::Got(v)) => {
                    let got = v.map(|b| u64::from_le_bytes(b.try_into().unwrap()));
                    assert_eq!(got, self.model.get(&op.key).copied());
                    self.checked_gets += 1;
                }
                (OpKind::Put, Done::Put) => {
                    self.model.insert(op.key, op.seq);
                }
                (OpKind::Delete, Done::Deleted) => {
                    self.model.remove(&op.key);
                }
                (k, d) => panic!("{k:?} answered with {d:?}"),
            }
        }
    }

    #[test]
    fn drives_every_operation_through_the_observer() {
        let mut w = Workload::new(KeyGen::Uniform(16), 0.4, 0.2, (8, 8)).unwrap();
        let mut obs = Shadow {
            limit: 2_000,
            model: HashMap::new(),
            invoked: 0,
            checked_gets: 0,
        };
        let mut rng = SmallRng::seed_from_u64(9);
        let n = drive(&mut MapClient::default(), &mut w, &mut rng, &mut obs);
        assert_eq!((n, obs.invoked), (2_000, 2_000));
        assert!(obs.checked_gets > 600, "{} GETs", obs.checked_gets);
    }
}
