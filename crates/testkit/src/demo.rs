//! The demo workload: an in-process cluster, client threads running a GET/PUT mix, latency
//! percentiles, fabric counters and (optionally) a linearizability check of the whole history.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use nessie_check::{History, Limits, Op, Outcome};
use nessie_cluster::LocalCluster;
use nessie_fabric::NodeId;
use nessie_protocols::ProtocolConfig;
use nessie_store::Geometry;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::stress::{key_bytes, value_bytes, value_id};
use nessie_bench::workload::{KeyDist, KeyGen};

#[derive(Clone, Debug)]
pub struct DemoSpec {
    pub nodes: u32,
    pub threads: usize,
    pub keys: u64,
    pub value_size: usize,
    pub get_ratio: f64,
    pub dist: KeyDist,
    pub duration: Duration,
    pub seed: u64,
    pub check: bool,
}

pub struct DemoResult {
    pub ops: u64,
    pub gets: u64,
    pub puts: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub get_latency: Histogram<u64>,
    pub put_latency: Histogram<u64>,
    pub fabric: nessie_fabric::StatsSnapshot,
    pub check: Option<nessie_check::Report>,
    pub migrations: u64,
    pub previous_version_hits: u64,
    pub cache_hits: u64,
}

pub fn run(spec: &DemoSpec) -> Result<DemoResult, String> {
    if spec.threads == 0 || spec.threads > 256 {
        return Err(format!("threads = {} is not in 1..=256", spec.threads));
    }
    if !(0.0..=1.0).contains(&spec.get_ratio) {
        return Err(format!("get ratio {} is not in [0, 1]", spec.get_ratio));
    }
    if spec.value_size < 8 {
        return Err("value size must be at least 8 bytes (values carry an id)".into());
    }
    // Index at load factor 0.4, data table with room for every key twice over plus churn.
    let per_node_keys = spec.keys.div_ceil(spec.nodes as u64).max(1);
    let geometry = Geometry {
        nodes: spec.nodes,
        ites_per_node: (per_node_keys as f64 / 0.4).ceil() as u64 + 8,
        dtes_per_node: (spec.keys * 2 + 4096).min(nessie_store::limits::MAX_DTES_PER_NODE),
        key_max: 16,
        value_max: spec.value_size as u32,
        ..Geometry::default()
    };
    let cfg = ProtocolConfig {
        cache_entries: ((spec.keys as f64 * 0.005) as usize).max(16),
        ..ProtocolConfig::default()
    };
    let cluster = LocalCluster::new(geometry, cfg, None).map_err(|e| e.to_string())?;
    let keygen = std::sync::Arc::new(KeyGen::new(&spec.dist, spec.keys)?);
    let history = History::new();

    // Preload every key from node 0's clients... spread over nodes so each data table holds some.
    {
        let mut clients: Vec<_> = (0..spec.nodes)
            .map(|n| cluster.client(n as NodeId))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let mut rec = history.recorder(u32::MAX);
        for k in 0..spec.keys {
            let id = 1 << 62 | k;
            let inv = rec.invoke();
            clients[(k % spec.nodes as u64) as usize]
                .put(&key_bytes(k), &value_bytes(id, spec.value_size))
                .map_err(|e| format!("preload: {e}"))?;
            rec.complete(inv, k, Op::Put(id), Outcome::Ok(None));
        }
    }

    let before = cluster.fabric().stats().total(None);
    let start = Instant::now();
    let end = start + spec.duration;
    let handles: Vec<_> = (0..spec.threads)
        .map(|t| {
            let mut client = cluster
                .client((t % spec.nodes as usize) as NodeId)
                .map_err(|e| e.to_string())?;
            let mut rec = history.recorder(t as u32);
            let keygen = keygen.clone();
            let spec = spec.clone();
            Ok(std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(spec.seed.wrapping_add(t as u64));
                let mut gl = nessie_bench::result::new_hist();
                let mut pl = nessie_bench::result::new_hist();
                let (mut gets, mut puts, mut errors) = (0u64, 0u64, 0u64);
                let mut seq = 0u64;
                while Instant::now() < end {
                    let k = keygen.next(&mut rng);
                    let key = key_bytes(k);
                    let t0 = Instant::now();
                    let inv = rec.invoke();
                    if rng.gen_bool(spec.get_ratio) {
                        let r = client.get(&key);
                        gl.saturating_record(t0.elapsed().as_nanos() as u64);
                        let out = match &r {
                            Ok(v) => Outcome::Ok(v.as_deref().map(value_id)),
                            Err(_) => Outcome::Failed,
                        };
                        if spec.check {
                            rec.complete(inv, k, Op::Get, out);
                        }
                        if r.is_ok() {
                            gets += 1
                        } else {
                            errors += 1
                        }
                    } else {
                        seq += 1;
                        let id = (t as u64) << 40 | seq;
                        let r = client.put(&key, &value_bytes(id, spec.value_size));
                        pl.saturating_record(t0.elapsed().as_nanos() as u64);
                        if spec.check {
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
                        if r.is_ok() {
                            puts += 1
                        } else {
                            errors += 1
                        }
                    }
                }
                let st = client.stats();
                (
                    gets,
                    puts,
                    errors,
                    gl,
                    pl,
                    st.migrations,
                    st.previous_version_hits,
                    client.cache_stats().hits,
                )
            }))
        })
        .collect::<Result<_, String>>()?;

    let mut res = DemoResult {
        ops: 0,
        gets: 0,
        puts: 0,
        errors: 0,
        elapsed: Duration::ZERO,
        get_latency: nessie_bench::result::new_hist(),
        put_latency: nessie_bench::result::new_hist(),
        fabric: Default::default(),
        check: None,
        migrations: 0,
        previous_version_hits: 0,
        cache_hits: 0,
    };
    for h in handles {
        let (g, p, e, gl, pl, mig, pv, ch) = h
            .join()
            .map_err(|_| "a client thread panicked".to_string())?;
        res.gets += g;
        res.puts += p;
        res.errors += e;
        res.get_latency.add(gl).unwrap();
        res.put_latency.add(pl).unwrap();
        res.migrations += mig;
        res.previous_version_hits += pv;
        res.cache_hits += ch;
    }
    res.elapsed = start.elapsed();
    res.ops = res.gets + res.puts;
    res.fabric = cluster.fabric().stats().total(None).saturating_sub(&before);
    if spec.check {
        res.check = Some(nessie_check::check(
            &history.into_events(),
            |_| None,
            &Limits::default(),
        ));
    }
    Ok(res)
}
