use nessie_fabric_sim::correctness::{run, CheckRun, CheckSpec};
use nessie_fabric_sim::{SimFaults, SimParams};
use nessie_protocols::{Mutations, ProtocolConfig};
use nessie_store::Geometry;

const EXPIRY_NS: u64 = 5_000_000;

fn geometry() -> Geometry {
    Geometry {
        nodes: 3,
        ites_per_node: 1024,
        dtes_per_node: 96,
        key_max: 16,
        value_max: 48,
        hash_functions: 3,
        filter_bits: 7,
    }
}

fn cfg(mutations: Mutations) -> ProtocolConfig {
    ProtocolConfig {
        expiry_ns: EXPIRY_NS,
        clock_margin_ns: 0,
        cache_entries: 64,
        whole_read_max: 0,
        mutations,
        ..ProtocolConfig::default()
    }
}

fn faults() -> SimFaults {
    SimFaults {
        delay_probability: 0.05,
        max_delay_ns: 20_000,
        nic_stall_probability: 0.01,
        max_nic_stall_ns: 50_000,
        pause_probability: 0.002,
        min_pause_ns: EXPIRY_NS + 1_000_000,
        max_pause_ns: 3 * EXPIRY_NS,
    }
}

fn spec(mutations: Mutations) -> CheckSpec {
    CheckSpec {
        geometry: geometry(),
        cfg: cfg(mutations),
        hw: SimParams::default(),
        faults: faults(),
        threads_per_node: 2,
        ops_per_thread: 1000,
        keys: 40,
        hot_keys: 2,
        hot_fraction: 0.5,
        get_fraction: 0.5,
        delete_fraction: 0.1,
        value_size: (8, 48),
        preload_keys: 0,
    }
}

fn show(name: &str, r: &CheckRun) {
    eprintln!(
        "{name} seed {}: passed {} violations {} corrupt {} end {} ms {:?}\n  {:?}",
        r.seed,
        r.passed(),
        r.report.violations().count(),
        r.corrupt,
        r.summary.end_ns / 1_000_000,
        r.faults,
        r.stats
    );
}

#[test]
#[ignore]
fn explore() {
    let which = std::env::var("M").unwrap_or_default();
    let mut m = Mutations::default();
    match which.as_str() {
        "skip_valid_check" => m.skip_valid_check = true,
        "ignore_op_timer" => m.ignore_op_timer = true,
        "recycle_without_expiry" => m.recycle_without_expiry = true,
        "complete_to_empty" => m.complete_to_empty = true,
        "skip_get_reverse_pass" => m.skip_get_reverse_pass = true,
        "skip_put_reverse_pass" => m.skip_put_reverse_pass = true,
        "migrate_copy_keeps_source" => m.migrate_copy_keeps_source = true,
        "migrate_empties_plainly" => m.migrate_empties_plainly = true,
        "complete_ignores_source" => m.complete_ignores_source = true,
        "fill_over_unsettled_copy" => m.fill_over_unsettled_copy = true,
        _ => {}
    }
    let seeds: u64 = std::env::var("SEEDS").map(|s| s.parse().unwrap()).unwrap_or(3);
    for seed in 1..=seeds {
        let t = std::time::Instant::now();
        let r = run(&spec(m), seed, &mut |_, _| {}).unwrap();
        show(&which, &r);
        eprintln!("  {:.1} s", t.elapsed().as_secs_f64());
    }
}
