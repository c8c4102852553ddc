//! Pipelines on the in-process fabric: operations in flight together, in one thread and
//! several, with the checker on the histories; same-key order (P1) and its mutation; the
//! protocol's own mutations caught through a pipeline.

use std::collections::HashMap;
use std::sync::Arc;

use nessie_check::{check, Event, History, Limits, Outcome as HOutcome, Recorder};
use nessie_fabric::inproc::{InProcEndpoint, InProcFabric};
use nessie_fabric::NodeId;
use nessie_inflight::{Op, Outcome, Pipeline, PipelineOptions, Ticket};
use nessie_protocols::cd::CdClient;
use nessie_protocols::{ClusterView, Mutations, ProtocolConfig};
use nessie_store::classtable::ClassTable;
use nessie_store::Geometry;

/// A client-driven cluster of `nodes` nodes on one in-process fabric.
struct Cluster {
    fabric: Arc<InProcFabric>,
    view: Arc<ClusterView>,
    tables: Vec<Arc<ClassTable>>,
    cfg: ProtocolConfig,
}

impl Cluster {
    fn new(ites_per_node: u64, cfg: ProtocolConfig) -> Self {
        Self::with_dtes(ites_per_node, 512, cfg)
    }

    fn with_dtes(ites_per_node: u64, dtes_per_node: u64, cfg: ProtocolConfig) -> Self {
        let g = Geometry {
            nodes: 3,
            ites_per_node,
            dtes_per_node,
            key_max: 16,
            value_max: 64,
            hash_functions: 3,
            filter_bits: 7,
        };
        let view = Arc::new(ClusterView::new(g).unwrap());
        let regions = vec![view.geometry.table_regions(); 3];
        let fabric = InProcFabric::new(&regions, None).unwrap();
        let tables = (0..3)
            .map(|n| Arc::new(view.class_table(n as NodeId, cfg.clock_margin_ns)))
            .collect();
        Self {
            fabric,
            view,
            tables,
            cfg,
        }
    }

    /// A pipeline of `slots` on `node`; its clients take worker ids from `first_worker` on.
    fn pipeline(
        &self,
        node: NodeId,
        first_worker: u16,
        opts: PipelineOptions,
    ) -> Pipeline<InProcEndpoint> {
        let (view, table, cfg) = (
            self.view.clone(),
            self.tables[node as usize].clone(),
            self.cfg.clone(),
        );
        Pipeline::new(self.fabric.endpoint(node), opts, move |s, ep| {
            CdClient::new(
                ep,
                view.clone(),
                table.clone(),
                first_worker + s as u16,
                cfg.clone(),
            )
        })
        .unwrap()
    }
}

fn fast_cfg() -> ProtocolConfig {
    ProtocolConfig {
        expiry_ns: 2_000_000,
        clock_margin_ns: 0,
        ..ProtocolConfig::default()
    }
}

fn interleaved(slots: usize, seed: u64) -> PipelineOptions {
    PipelineOptions {
        interleave: true,
        shuffle_seed: Some(seed),
        ..PipelineOptions::new(slots)
    }
}

fn key(k: u64) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

/// A value naming its writer: 8 bytes of id, padded.
fn value(id: u64) -> Vec<u8> {
    let mut v = id.to_le_bytes().to_vec();
    v.resize(8 + (id % 24) as usize, 0xab);
    v
}

/// The id a value names; bytes no writer wrote (a torn or invalid entry) name none.
fn value_id(v: &[u8]) -> u64 {
    match v.get(..8) {
        Some(id) if v.len() == value(u64::from_le_bytes(id.try_into().unwrap())).len() => {
            u64::from_le_bytes(id.try_into().unwrap())
        }
        _ => u64::MAX,
    }
}

#[test]
fn many_operations_in_flight_read_back_what_they_wrote() {
    let c = Cluster::new(256, fast_cfg());
    let mut p = c.pipeline(0, 0, interleaved(16, 3));
    let puts: Vec<Ticket> = (0..200)
        .map(|k| p.submit(Op::put(key(k), value(k))))
        .collect();
    let mut done = p.drain();
    assert_eq!(done.len(), puts.len());
    assert!(done
        .iter()
        .all(|c| c.result.as_ref().unwrap() == &Outcome::Put));
    done.sort_by_key(|c| c.ticket);
    assert_eq!(done.iter().map(|c| c.ticket).collect::<Vec<_>>(), puts);
    // Read back through another pipeline, on another node.
    let mut q = c.pipeline(1, 100, interleaved(16, 4));
    let gets: HashMap<Ticket, u64> = (0..200).map(|k| (q.submit(Op::get(key(k))), k)).collect();
    for d in q.drain() {
        let k = gets[&d.ticket];
        assert_eq!(d.result.unwrap(), Outcome::Got(Some(value(k))), "key {k}");
    }
    assert_eq!(q.outstanding(), 0);
}

#[test]
fn a_pipeline_overlaps_operations_of_different_keys() {
    // With every step interleaved, the operations of 8 slots run together: some finish in
    // another order than they were submitted.
    let c = Cluster::new(256, fast_cfg());
    let mut p = c.pipeline(0, 0, interleaved(8, 11));
    for k in 0..64 {
        p.submit(Op::put(key(k), value(k)));
    }
    let order: Vec<u64> = p.drain().iter().map(|d| d.ticket.0).collect();
    assert!(
        order.windows(2).any(|w| w[0] > w[1]),
        "operations on different keys never overlapped: {order:?}"
    );
}

/// Submit, on one hot key among others, puts of ids `base..base+8` then a get; returns the
/// hot key's completions in finishing order.
fn hot_key_round(p: &mut Pipeline<InProcEndpoint>, base: u64) -> Vec<(Ticket, Outcome)> {
    let mut hot = Vec::new();
    for i in 0..8 {
        hot.push(p.submit(Op::put(key(0), value(base + i))));
        p.submit(Op::put(key(1 + i), value(base + 100 + i)));
    }
    hot.push(p.submit(Op::get(key(0))));
    p.drain()
        .into_iter()
        .filter(|d| hot.contains(&d.ticket))
        .map(|d| (d.ticket, d.result.unwrap()))
        .collect()
}

/// P1: whether every hot-key round completes in submission order and reads the last put.
fn key_order_holds(mutation: bool, seeds: std::ops::Range<u64>) -> bool {
    let c = Cluster::new(256, fast_cfg());
    seeds.into_iter().all(|seed| {
        let opts = PipelineOptions {
            mutation_unordered_keys: mutation,
            ..interleaved(8, seed)
        };
        let mut p = c.pipeline(0, 0, opts);
        let base = seed * 1000;
        let done = hot_key_round(&mut p, base);
        let in_order = done.windows(2).all(|w| w[0].0 < w[1].0);
        let last = done.last().map(|d| d.1.clone());
        in_order && done.len() == 9 && last == Some(Outcome::Got(Some(value(base + 7))))
    })
}

#[test]
fn operations_on_one_key_complete_in_submission_order() {
    assert!(key_order_holds(false, 0..20));
}

#[test]
fn mutation_letting_operations_on_one_key_overlap_is_caught() {
    assert!(!key_order_holds(true, 0..20));
}

/// Two pipelines on one thread, their slots' steps interleaved, write one hot key over and
/// over: their CASes conflict, and each completion reports the attempts its operation aborted
/// and the retries it made (`KvClient::aborts_retries` over the operation), which the
/// benchmark sums. A completion that reported none would leave the sum at 0.
#[test]
fn completions_report_their_operations_aborts_and_retries() {
    let c = Cluster::new(256, fast_cfg());
    let mut pipes = [
        c.pipeline(0, 0, interleaved(4, 21)),
        c.pipeline(1, 100, interleaved(4, 22)),
    ];
    let (mut aborts, mut retries, mut done) = (0, 0, 0);
    for round in 0..50u64 {
        for (i, p) in pipes.iter_mut().enumerate() {
            // Different keys in one pipeline (one key's operations there run one at a time),
            // the same keys across the two.
            for k in 0..4 {
                p.submit(Op::put(key(k), value(round * 10 + i as u64)));
            }
        }
        // Poll both in turn, so that their steps interleave.
        while pipes.iter().any(|p| p.outstanding() > 0) {
            for p in pipes.iter_mut() {
                if let Some(d) = p.poll() {
                    assert!(d.result.is_ok(), "{:?}", d.result);
                    (aborts, retries, done) = (aborts + d.aborts, retries + d.retries, done + 1);
                }
            }
        }
    }
    assert_eq!(done, 400);
    assert!(aborts > 0, "no completion reported an aborted attempt");
    assert!(retries > 0, "no completion reported a retry");
}

/// A run to check: `threads` threads, each with `pipes` pipelines of `slots` interleaved slots
/// (polled in a seeded random order, so that their clients' steps on one key interleave too),
/// write and read `keys` keys, a quarter of the operations on 4 hot ones.
struct Run {
    cfg: ProtocolConfig,
    ites_per_node: u64,
    keys: u64,
    threads: u64,
    pipes: usize,
    slots: usize,
    ops: u64,
    seed: u64,
}

impl Run {
    fn new(cfg: ProtocolConfig, seed: u64) -> Self {
        Self {
            cfg,
            ites_per_node: 256,
            keys: 200,
            threads: 2,
            pipes: 3,
            slots: 4,
            ops: 3_000,
            seed,
        }
    }

    /// The history of every operation, recorded at submission and completion, checked.
    fn check(self) -> nessie_check::Report {
        let c = Arc::new(Cluster::new(self.ites_per_node, self.cfg.clone()));
        let history = History::new();
        let run = Arc::new(self);
        let handles: Vec<_> = (0..run.threads)
            .map(|t| {
                let (c, rec, run) = (c.clone(), history.recorder(t as u32), run.clone());
                std::thread::spawn(move || run.thread(&c, rec, t))
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let events: Vec<Event> = history.into_events();
        check(&events, |_| None, &Limits::default())
    }

    fn thread(&self, c: &Cluster, mut rec: Recorder, t: u64) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(self.seed * 31 + t);
        let mut pipes: Vec<_> = (0..self.pipes)
            .map(|i| {
                let node = ((t as usize + i) % 3) as NodeId;
                let worker = (t as usize * self.pipes + i) * self.slots;
                let seed = self.seed * 1000 + t * 10 + i as u64;
                c.pipeline(node, worker as u16, interleaved(self.slots, seed))
            })
            .collect();
        type Pending = HashMap<(usize, Ticket), (nessie_check::Invocation, u64, nessie_check::Op)>;
        let mut pending: Pending = HashMap::new();
        let finish = |rec: &mut Recorder,
                      pending: &mut Pending,
                      i: usize,
                      d: nessie_inflight::Completion| {
            let (inv, k, op) = pending.remove(&(i, d.ticket)).expect("a submitted ticket");
            let outcome = match d.result {
                Ok(Outcome::Got(v)) => HOutcome::Ok(v.map(|v| value_id(&v))),
                Ok(_) => HOutcome::Ok(None),
                Err(_) => HOutcome::Failed,
            };
            rec.complete(inv, k, op, outcome);
        };
        for n in 0..self.ops {
            let k = match rng.gen_bool(0.25) {
                true => rng.gen_range(0..4.min(self.keys)),
                false => rng.gen_range(0..self.keys),
            };
            let id = (t << 40) | n;
            let (op, hop) = match rng.gen_range(0..10) {
                0..=4 => (Op::get(key(k)), nessie_check::Op::Get),
                5..=8 => (Op::put(key(k), value(id)), nessie_check::Op::Put(id)),
                _ => (Op::delete(key(k)), nessie_check::Op::Delete),
            };
            let i = rng.gen_range(0..pipes.len());
            // No more than a slot's worth waiting: a queued operation's interval grows, and
            // with it the checker's work.
            // Every pipeline is polled meanwhile: one's slot may hold a lock (the allocator's)
            // another's waits for.
            while pipes[i].outstanding() >= self.slots {
                let j = rng.gen_range(0..pipes.len());
                if let Some(d) = pipes[j].poll() {
                    finish(&mut rec, &mut pending, j, d);
                }
            }
            let inv = rec.invoke();
            let ticket = pipes[i].submit(op);
            pending.insert((i, ticket), (inv, k, hop));
            // Poll a few pipelines, in a random order.
            for _ in 0..2 {
                let j = rng.gen_range(0..pipes.len());
                while let Some(d) = pipes[j].poll() {
                    finish(&mut rec, &mut pending, j, d);
                }
            }
        }
        while !pending.is_empty() {
            let j = rng.gen_range(0..pipes.len());
            if let Some(d) = pipes[j].poll() {
                finish(&mut rec, &mut pending, j, d);
            }
        }
    }
}

#[test]
fn histories_of_pipelines_in_several_threads_are_linearizable() {
    let r = Run::new(fast_cfg(), 1).check();
    assert!(r.is_ok(), "{r}");
}

#[test]
fn histories_of_pipelines_over_a_small_index_are_linearizable() {
    // 3 × 64 index entries for up to 150 keys: MIGRATEs move entries under the passes.
    let r = Run {
        ites_per_node: 64,
        keys: 150,
        ..Run::new(fast_cfg(), 2)
    }
    .check();
    assert!(r.is_ok(), "{r}");
}

#[test]
fn mutation_ignoring_the_valid_flag_is_caught_through_pipelines() {
    // A GET that takes a DTE before its writer set it valid returns a value whose write may
    // still abort: with every step interleaved, some GET does, on 16 hot keys.
    let cfg = ProtocolConfig {
        mutations: Mutations {
            skip_valid_check: true,
            ..Mutations::default()
        },
        ..fast_cfg()
    };
    let caught = (0..8).filter(|seed| {
        let run = Run {
            keys: 16,
            threads: 1,
            pipes: 4,
            ..Run::new(cfg.clone(), 10 + seed)
        };
        !run.check().is_ok()
    });
    let caught = caught.count();
    eprintln!("{caught} of 8 runs rejected");
    assert!(caught > 0, "no run of the mutated protocol was rejected");
}

#[test]
fn mutation_skipping_the_reverse_pass_is_caught_through_pipelines() {
    // A GET misses a key a MIGRATE moved into a candidate it had passed: over a small index,
    // with the clients' steps interleaved, some GET does once it skips its reverse pass.
    let cfg = ProtocolConfig {
        mutations: Mutations {
            skip_get_reverse_pass: true,
            ..Mutations::default()
        },
        ..fast_cfg()
    };
    let caught = (0..16).filter(|seed| {
        // One thread: the interleaving is the seed's alone, so the run repeats.
        let run = Run {
            ites_per_node: 64,
            keys: 170,
            threads: 1,
            pipes: 4,
            slots: 8,
            ops: 10_000,
            ..Run::new(cfg.clone(), 20 + seed)
        };
        !run.check().is_ok()
    });
    let caught = caught.count();
    eprintln!("{caught} of 16 runs rejected");
    assert!(caught > 0, "no run of the mutated protocol was rejected");
}

/// Under an eviction policy, writers take the allocator's lock across fabric operations and
/// other writers of the thread check it after every PUT: a slot holding it never gives way
/// (`NoYield`), so the thread's other slots never block on it. Before, this run hung.
#[test]
fn pipelines_evicting_from_full_tables_do_not_block_their_thread() {
    let cfg = ProtocolConfig {
        eviction: nessie_protocols::Eviction::AllkeysLru,
        ..fast_cfg()
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let c = Cluster::with_dtes(256, 96, cfg);
        let mut p = c.pipeline(0, 0, interleaved(8, 5));
        for k in 0..2_000u64 {
            p.submit(Op::put(key(k), value(k)));
        }
        let done = p.drain();
        let ok = done.iter().filter(|d| d.result.is_ok()).count();
        let evicted: usize = done.iter().map(|d| d.evicted.len()).sum();
        tx.send((done.len(), ok, evicted)).unwrap();
    });
    let (n, ok, evicted) = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("the pipeline's thread hung");
    assert_eq!(n, 2_000);
    assert!(ok > 1_900, "{ok} of 2000 PUTs stored");
    assert!(
        evicted > 500,
        "the tables ran full and PUTs evicted ({evicted})"
    );
}

/// An in-process endpoint that counts the pipeline's idle waits on the fabric.
struct CountingIdles {
    inner: InProcEndpoint,
    idles: Arc<std::sync::atomic::AtomicU64>,
}

impl nessie_fabric::Endpoint for CountingIdles {
    nessie_fabric::forward_endpoint!(field inner);
    nessie_fabric::forward_endpoint!(field inner: read, write, compare_and_swap, local_read, local_write);
}

impl nessie_fabric::Post for CountingIdles {
    fn posted_idle(&mut self) {
        self.idles
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::hint::spin_loop()
    }
}

/// A client whose every operation is a 20 ms pause (a retry's back-off) on its endpoint.
struct Pausing(nessie_inflight::PipelineEndpoint<CountingIdles>);

impl nessie_protocols::KvClient for Pausing {
    fn get(&mut self, _: &[u8]) -> Result<Option<Vec<u8>>, nessie_protocols::Error> {
        nessie_fabric::Endpoint::sleep_ns(&mut self.0, 20_000_000);
        Ok(None)
    }
    fn put(&mut self, _: &[u8], _: &[u8]) -> Result<(), nessie_protocols::Error> {
        Ok(())
    }
    fn delete(&mut self, _: &[u8]) -> Result<(), nessie_protocols::Error> {
        Ok(())
    }
}

/// PL2: while every busy slot sleeps and nothing is in flight, the pipeline sleeps until the
/// first wakes instead of spinning on the fabric's idle wait (which, with nothing posted, a
/// UCX endpoint answers at once: millions of calls in 20 ms).
#[test]
fn a_pipeline_whose_slots_all_sleep_sleeps_too() {
    let c = Cluster::new(64, fast_cfg());
    let idles = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ep = CountingIdles {
        inner: c.fabric.endpoint(0),
        idles: idles.clone(),
    };
    let mut p = Pipeline::new(ep, PipelineOptions::new(4), |_, ep| Ok(Pausing(ep))).unwrap();
    for k in 0..8 {
        p.submit(Op::get(key(k)));
    }
    let done = p.drain();
    assert_eq!(done.len(), 8);
    assert!(done.iter().all(|d| d.result == Ok(Outcome::Got(None))));
    let idles = idles.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        idles < 10,
        "{idles} idle waits on the fabric with nothing in flight"
    );
}

/// A GET reads into a buffer handed back with `recycle`: it answers exactly its value (no
/// tail of the longer one the buffer held before), and the buffer is the one handed back
/// (its allocation reused). The values are on another node and read on their own, straight
/// into the buffer (`whole_read_max` 0), where a stale tail would show.
#[test]
fn gets_read_into_recycled_buffers_and_answer_exactly_their_values() {
    let cfg = ProtocolConfig {
        whole_read_max: 0,
        ..fast_cfg()
    };
    let c = Cluster::new(256, cfg);
    let mut w = c.pipeline(0, 0, PipelineOptions::new(1));
    w.run(Op::put(key(1), value(1)));
    w.run(Op::put(key(2), value(23)));
    let mut p = c.pipeline(1, 10, PipelineOptions::new(1));
    let old = vec![0xee; 4096];
    let old_ptr = old.as_ptr();
    p.recycle(old);
    let d = p.run(Op::get(key(1)));
    let Ok(Outcome::Got(Some(v))) = d.result else {
        panic!("{:?}", d.result)
    };
    assert_eq!(v, value(1));
    assert_eq!(v.as_ptr(), old_ptr, "the GET read into the recycled buffer");
    assert!(v.capacity() >= 4096);
    // A GET that finds nothing keeps the buffer for the next.
    assert_eq!(p.run(Op::get(key(9))).result, Ok(Outcome::Got(None)));
    // Back again, now holding a shorter value than the next one.
    p.recycle(v);
    assert_eq!(
        p.run(Op::get(key(2))).result,
        Ok(Outcome::Got(Some(value(23))))
    );
    assert_eq!(p.run(Op::get(key(3))).result, Ok(Outcome::Got(None)));
}
