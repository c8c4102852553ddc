//! Huge pages for a node's tables. A test binary of its own: it changes `vm.nr_hugepages` for a
//! moment, and no other cluster may start meanwhile and take the pages it reserves.

use std::time::Duration;

use nessie_cluster::node::AdminKvClient;
use nessie_cluster::process;

const BIN: &str = env!("CARGO_BIN_EXE_nessie");

fn hugepages_free() -> u64 {
    let m = std::fs::read_to_string("/proc/meminfo").unwrap();
    m.lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Puts `vm.nr_hugepages` back as it was, even if the test fails.
struct RestoreHugepages(String);

impl Drop for RestoreHugepages {
    fn drop(&mut self) {
        let _ = std::fs::write("/proc/sys/vm/nr_hugepages", &self.0);
    }
}

/// `--huge-pages require`: without enough reserved huge pages the node refuses to start and says
/// how to reserve them; with them (the test reserves a few when it may, and restores the
/// setting after), every region sits on 2 MiB pages and the cluster serves requests.
#[test]
fn huge_pages_require_is_enforced_and_works() {
    use nessie_cluster::config::Transport;
    let dir = std::env::temp_dir().join(format!("nessie-test-hugepages-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let geometry = nessie_store::Geometry {
        nodes: 1,
        ites_per_node: 1024,
        dtes_per_node: 64,
        key_max: 32,
        value_max: 1024,
        ..Default::default()
    };
    let opts = process::UpOptions {
        huge_pages: nessie_fabric_ucx::HugePages::Require,
        ..process::UpOptions::new(BIN.into(), 1, Transport::Shm, geometry)
    };
    // Index and data table: one 2 MiB page each.
    const NEEDED: u64 = 2;
    let mut restore = None;
    let mut checked_refusal = false;
    if hugepages_free() < NEEDED {
        let err = process::up(&dir, &opts)
            .expect_err("a node started without huge pages")
            .to_string();
        let _ = process::down(&dir);
        assert!(
            err.contains("huge_pages = require") && err.contains("vm.nr_hugepages"),
            "{err}"
        );
        checked_refusal = true;
        eprintln!("refused without huge pages: {err}");
        let old = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
            .unwrap()
            .trim()
            .to_string();
        let want = old.parse::<u64>().unwrap() + NEEDED + 2;
        if std::fs::write("/proc/sys/vm/nr_hugepages", want.to_string()).is_ok() {
            restore = Some(RestoreHugepages(old));
        }
    }
    if hugepages_free() < NEEDED {
        assert!(checked_refusal);
        eprintln!("cannot reserve huge pages here: only the refusal was checked");
        return;
    }
    let r = process::up(&dir, &opts);
    let report = r
        .as_ref()
        .ok()
        .map(|_| process::status(&dir).unwrap().1.remove(0).report.unwrap());
    let kv = r.as_ref().ok().map(|cfg| {
        let mut c =
            AdminKvClient::connect(&cfg.admin_path(0, &dir).unwrap(), Duration::from_secs(30))
                .unwrap();
        use nessie_protocols::KvClient;
        c.put(b"huge", b"pages").unwrap();
        c.get(b"huge").unwrap()
    });
    let _ = process::down(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    drop(restore);
    r.expect("up with reserved huge pages");
    let report = report.unwrap();
    for region in ["index", "data_table"] {
        assert_eq!(
            report["pages"][region]["page_kib"], 2048,
            "{region}: {}",
            report["pages"]
        );
    }
    assert_eq!(kv.unwrap().as_deref(), Some(&b"pages"[..]));
    eprintln!("served from huge pages: {}", report["pages"]);
}
