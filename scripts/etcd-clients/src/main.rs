//! Latency of etcd puts and gets, one at a time, through one client: `etcd-clients MODE
//! HOST:PORT [PREFIX]`, MODE `http` (the v3 JSON gateway through ureq, as
//! `crates/membership` speaks it) or `grpc` (the `etcd-client` crate), each compiled in by its
//! feature so that a build holds one client's dependencies only. 200 warm-up rounds, then
//! 2,000 puts and 2,000 gets of 64-byte values on distinct keys; prints p50, p99 and mean.

use std::time::Instant;

const N: usize = 2000;
const WARM: usize = 200;

fn stats(name: &str, mut v: Vec<f64>) {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    let p = |q: f64| {
        v[(((n as f64) * q).ceil() as usize)
            .saturating_sub(1)
            .min(n - 1)]
    };
    let mean = v.iter().sum::<f64>() / n as f64;
    println!(
        "RESULT {name} n={n} p50_us={:.1} p99_us={:.1} mean_us={:.1}",
        p(0.50),
        p(0.99),
        mean
    );
}

fn value() -> Vec<u8> {
    (0..64u8).map(|i| b'a' + (i % 26)).collect()
}

#[cfg(feature = "http")]
fn run_http(endpoint: &str, prefix: &str) {
    use base64::{engine::general_purpose::STANDARD as B64, Engine};
    use serde_json::{json, Value};
    let agent = ureq::AgentBuilder::new().build();
    let put_url = format!("http://{endpoint}/v3/kv/put");
    let range_url = format!("http://{endpoint}/v3/kv/range");
    let val = B64.encode(value());
    let put = |k: &str| {
        let r: Value = agent
            .post(&put_url)
            .send_json(json!({"key": B64.encode(k), "value": val}))
            .expect("put")
            .into_json()
            .expect("json");
        assert!(r.get("header").is_some());
    };
    let get = |k: &str| {
        let r: Value = agent
            .post(&range_url)
            .send_json(json!({"key": B64.encode(k)}))
            .expect("range")
            .into_json()
            .expect("json");
        let v = r["kvs"][0]["value"].as_str().expect("value");
        assert_eq!(B64.decode(v).unwrap().len(), 64);
    };
    for i in 0..WARM {
        let k = format!("{prefix}/warm/{i}");
        put(&k);
        get(&k);
    }
    let mut pl = Vec::with_capacity(N);
    for i in 0..N {
        let k = format!("{prefix}/k/{i}");
        let t = Instant::now();
        put(&k);
        pl.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut gl = Vec::with_capacity(N);
    for i in 0..N {
        let k = format!("{prefix}/k/{i}");
        let t = Instant::now();
        get(&k);
        gl.push(t.elapsed().as_secs_f64() * 1e6);
    }
    stats("http put", pl);
    stats("http get", gl);
}

#[cfg(feature = "grpc")]
fn run_grpc(endpoint: &str, prefix: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut client = rt
        .block_on(etcd_client::Client::connect(
            [format!("http://{endpoint}")],
            None,
        ))
        .expect("connect");
    let val = value();
    let mut put = |c: &mut etcd_client::Client, k: &str| {
        rt.block_on(c.put(k, val.clone(), None)).expect("put");
    };
    for i in 0..WARM {
        let k = format!("{prefix}/warm/{i}");
        put(&mut client, &k);
        rt.block_on(client.get(k.as_str(), None)).expect("get");
    }
    let mut pl = Vec::with_capacity(N);
    for i in 0..N {
        let k = format!("{prefix}/k/{i}");
        let t = Instant::now();
        put(&mut client, &k);
        pl.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut gl = Vec::with_capacity(N);
    for i in 0..N {
        let k = format!("{prefix}/k/{i}");
        let t = Instant::now();
        let r = rt.block_on(client.get(k.as_str(), None)).expect("get");
        gl.push(t.elapsed().as_secs_f64() * 1e6);
        assert_eq!(r.kvs()[0].value().len(), 64);
    }
    stats("grpc put", pl);
    stats("grpc get", gl);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(mode), Some(endpoint)) = (args.get(1), args.get(2)) else {
        eprintln!(
            "usage: etcd-clients http|grpc HOST:PORT [PREFIX] (the mode must be compiled in)"
        );
        std::process::exit(2);
    };
    let prefix = args
        .get(3)
        .cloned()
        .unwrap_or_else(|| format!("bench/{}", std::process::id()));
    match mode.as_str() {
        #[cfg(feature = "http")]
        "http" => run_http(endpoint, &prefix),
        #[cfg(feature = "grpc")]
        "grpc" => run_grpc(endpoint, &prefix),
        _ => {
            eprintln!("mode {mode:?} is not compiled in (features http, grpc)");
            std::process::exit(2);
        }
    }
}
