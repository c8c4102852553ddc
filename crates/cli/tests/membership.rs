//! Membership through a real etcd (Debian `etcd-server`), started by `nessie up`: a node killed
//! with SIGKILL is declared failed in a new epoch within its lease TTL, a restarted one
//! registers again and joins (fenced for writes), the nodes keep serving reads when etcd is
//! gone and stop writing within a lease TTL, and clusters sharing
//! an etcd keep apart. Every test stops what it started (`Cluster` runs `nessie down`, which
//! also stops the local etcd).

mod common;

use std::time::{Duration, Instant};

use std::process::Command;

use common::{restart, stderr, Cluster, BIN};
use nessie_cluster::process;
use nessie_cluster::process::etcd_server;

/// What `--lease-ttl 2` becomes: etcd raises TTLs below its minimum (3 s with its default
/// election timeout) to that minimum.
const EFFECTIVE_TTL: Duration = Duration::from_secs(3);
/// The bound on noticing a failure: lease TTL + 2 s.
const NOTICE_WITHIN: Duration = Duration::from_secs(5);

fn status_json(c: &Cluster) -> Vec<serde_json::Value> {
    common::status_nodes(&c.nessie(&["status", "--json"])).unwrap_or_else(|e| panic!("{e}"))
}

fn states(s: &[serde_json::Value]) -> Vec<String> {
    s.iter()
        .map(|n| n["state"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// Poll `status --json` until `done` holds; panics after `limit` with the last report.
fn wait_for(
    c: &Cluster,
    limit: Duration,
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> (Duration, Vec<serde_json::Value>) {
    let t0 = Instant::now();
    loop {
        let s = status_json(c);
        if done(&s) {
            return (t0.elapsed(), s);
        }
        assert!(t0.elapsed() < limit, "not within {limit:?}: {s:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn pid_of(c: &Cluster, id: u16) -> i32 {
    process::live_pid(&c.dir, id).unwrap_or_else(|| panic!("node {id} is not running"))
}

#[test]
fn a_killed_node_fails_in_a_new_epoch_within_the_ttl_and_a_restarted_one_joins() {
    let c = Cluster::up("member-kill", 3, "shm", &["--lease-ttl", "2"]);
    let (_, s) = wait_for(&c, Duration::from_secs(10), |s| {
        s.iter().all(|n| n["membership"]["epoch"] == 1)
    });
    assert_eq!(states(&s), ["up", "up", "up"]);
    assert_eq!(s[0]["epoch"], 1);
    assert!(c.nessie(&["put", "k", "v"]).status.success());

    // SAFETY: killing a node process this test started.
    unsafe { libc::kill(pid_of(&c, 1), libc::SIGKILL) };
    let (took, s) = wait_for(&c, EFFECTIVE_TTL + NOTICE_WITHIN, |s| {
        s[1]["state"] == "failed"
    });
    assert_eq!(states(&s), ["up", "failed", "up"]);
    assert_eq!(s[0]["epoch"], 2, "one failure, one new epoch: {s:#?}");
    assert!(
        took <= EFFECTIVE_TTL + NOTICE_WITHIN,
        "noticed after {took:?}"
    );
    // The survivors learn the new epoch from etcd.
    wait_for(&c, Duration::from_secs(5), |s| {
        s[0]["membership"]["epoch"] == 2 && s[2]["membership"]["epoch"] == 2
    });

    let _node = restart(&c, 1);
    let (_, s) = wait_for(&c, Duration::from_secs(30), |s| s[1]["state"] == "joining");
    assert_eq!(states(&s), ["up", "joining", "up"]);
    assert_eq!(s[0]["epoch"], 3);
    let text = String::from_utf8(c.nessie(&["status"]).stdout).unwrap();
    assert!(text.contains("membership: epoch 3"), "{text}");
    // A joining node serves reads but is fenced for writes (it rejoins no data yet); the
    // survivors write on.
    let (_, s) = wait_for(&c, Duration::from_secs(10), |s| {
        s[1]["membership"]["epoch"] == 3
    });
    assert_eq!(
        s.iter()
            .map(|n| n["membership"]["may_write"].clone())
            .collect::<Vec<_>>(),
        [true, false, true]
    );
    let put = c.nessie(&["put", "--node", "1", "k2", "v"]);
    assert!(!put.status.success());
    assert!(stderr(&put).contains("fenced"), "{}", stderr(&put));
    assert!(c
        .nessie(&["put", "--node", "2", "k2", "v"])
        .status
        .success());
}

#[test]
fn nodes_keep_serving_reads_when_etcd_is_gone_stop_writing_and_status_says_so() {
    let c = Cluster::up("member-noetcd", 2, "shm", &[]);
    assert!(c.nessie(&["put", "k", "v1"]).status.success());
    let etcd = etcd_server::running(&c.dir).expect("up started a local etcd");
    // SAFETY: killing the etcd this test's cluster started.
    unsafe { libc::kill(etcd, libc::SIGKILL) };

    let out = c.nessie(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("unreachable") && text.contains("keep serving"),
        "{text}"
    );
    let s = status_json(&c);
    assert!(s[0]["etcd_error"].is_string(), "{s:#?}");
    assert_eq!(states(&s), ["up", "up"], "nodes that answer are up");
    assert!(c.nessie(&["put", "k", "v2"]).status.success());
    let got = c.nessie(&["get", "k"]);
    assert_eq!(String::from_utf8_lossy(&got.stdout).trim(), "v2");
    // The nodes notice too, and say so in their own reports; once their leases may have
    // lapsed they stop writing (their peers could have declared them failed), and serve reads.
    wait_for(&c, Duration::from_secs(10), |s| {
        s.iter().all(|n| n["membership"]["etcd_error"].is_string())
    });
    wait_for(&c, EFFECTIVE_TTL + NOTICE_WITHIN, |s| {
        s.iter().all(|n| n["membership"]["may_write"] == false)
    });
    let put = c.nessie(&["put", "k", "v3"]);
    assert!(stderr(&put).contains("fenced"), "{}", stderr(&put));
    let got = c.nessie(&["get", "k"]);
    assert_eq!(String::from_utf8_lossy(&got.stdout).trim(), "v2");
    let down = c.nessie(&["down"]);
    assert!(down.status.success(), "{}", stderr(&down));
}

#[test]
fn clusters_sharing_an_etcd_keep_apart_and_down_stops_only_its_own() {
    let a = Cluster::up("member-share-a", 1, "shm", &[]);
    let cfg = nessie_cluster::config::ClusterConfig::load(&process::config_path(&a.dir)).unwrap();
    let url = cfg.membership.expect("membership on by default").etcd;
    let b = Cluster::up("member-share-b", 2, "shm", &["--etcd", &url]);
    let s = status_json(&b);
    assert_eq!(
        (states(&s), &s[0]["epoch"]),
        (vec!["up".into(), "up".into()], &1.into())
    );
    assert!(etcd_server::running(&b.dir).is_none(), "b started no etcd");
    assert!(b.nessie(&["down"]).status.success());
    assert!(
        etcd_server::running(&a.dir).is_some(),
        "a's etcd outlives b"
    );
    let s = status_json(&a);
    assert_eq!((states(&s), &s[0]["epoch"]), (vec!["up".into()], &1.into()));
    assert!(a.nessie(&["down"]).status.success());
    assert!(
        etcd_server::running(&a.dir).is_none(),
        "down stops the etcd up started"
    );
    assert!(!a.dir.join(etcd_server::DATA_DIR).exists());
}

/// Both nodes are up in epoch 1, and a key written reads back.
fn serves_in_epoch_one(c: &Cluster) {
    let s = status_json(c);
    assert_eq!(
        (states(&s), &s[0]["epoch"]),
        (vec!["up".into(), "up".into()], &1.into())
    );
    assert!(c.nessie(&["put", "k", "v"]).status.success());
    let got = c.nessie(&["get", "k"]);
    assert_eq!(String::from_utf8_lossy(&got.stdout).trim(), "v");
}

/// An existing etcd with auth enabled: `up` with no user is refused, naming the settings; with
/// `--etcd-user` and `--etcd-password-file` the cluster comes up, serves and reports its
/// epoch, and the password is in `cluster.toml` (mode 0600), not on any command line.
#[test]
fn an_etcd_with_auth_is_used_as_its_user() {
    use std::os::unix::fs::PermissionsExt;
    let host = Cluster::at("member-auth-etcd");
    std::fs::create_dir_all(&host.dir).unwrap();
    let ports = process::free_ports(2).unwrap();
    let log = std::fs::File::create(host.dir.join(etcd_server::LOG_FILE)).unwrap();
    let etcd = etcd_server::start(&host.dir, log, ports[0], ports[1]).unwrap();
    let url = etcd.client_url.clone();
    struct Stop(std::path::PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            etcd_server::stop(&self.0);
        }
    }
    let _stop = Stop(host.dir.clone());
    for (path, body) in [
        ("/v3/auth/role/add", serde_json::json!({ "name": "root" })),
        (
            "/v3/auth/user/add",
            serde_json::json!({ "name": "root", "password": "s3cret" }),
        ),
        (
            "/v3/auth/user/grant",
            serde_json::json!({ "user": "root", "role": "root" }),
        ),
        ("/v3/auth/enable", serde_json::json!({})),
    ] {
        ureq::post(&format!("{url}{path}")).send_json(body).unwrap();
    }
    let c = Cluster::at("member-auth");
    let refused = c.nessie(&["up", "--nodes", "2", "--etcd", &url]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("etcd_user") && stderr(&refused).contains("auth"),
        "{}",
        stderr(&refused)
    );
    let _ = c.nessie(&["down"]);
    let pw = host.dir.join("etcd-password");
    std::fs::write(&pw, "s3cret\n").unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let up = c.nessie(&[
        "up",
        "--nodes",
        "2",
        "--etcd",
        &url,
        "--etcd-user",
        "root",
        "--etcd-password-file",
        pw.to_str().unwrap(),
    ]);
    assert!(up.status.success(), "{}", stderr(&up));
    serves_in_epoch_one(&c);
    let toml = process::config_path(&c.dir);
    let mode = std::fs::metadata(&toml).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "cluster.toml holds the password");
    assert!(std::fs::read_to_string(&toml)
        .unwrap()
        .contains("etcd_password = \"s3cret\""));
    assert!(c.nessie(&["down"]).status.success());
}

/// An existing etcd over TLS that requires client certificates: `up` without TLS files is
/// refused, saying to give the CA; with `--etcd-ca`, `--etcd-cert` and `--etcd-key` (one given
/// relative to `up`'s directory) the cluster comes up over https, serves and reports its epoch,
/// and `cluster.toml` names the files by absolute path, as nodes started elsewhere need.
#[test]
fn an_etcd_over_tls_with_client_certificates_is_used() {
    let host = Cluster::at("member-tls-etcd");
    std::fs::create_dir_all(&host.dir).unwrap();
    let pki = nessie_membership::tls::testing::Pki::make(&host.dir.join("pki"));
    let ports = process::free_ports(2).unwrap();
    let url = format!("https://127.0.0.1:{}", ports[0]);
    let peer = format!("http://127.0.0.1:{}", ports[1]);
    let log = std::fs::File::create(host.dir.join("etcd.log")).unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _etcd = Kill(
        Command::new(etcd_server::binary())
            .args(["--name", "tls", "--data-dir"])
            .arg(host.dir.join("data"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("tls={peer}")])
            .args(pki.etcd_args())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let client = nessie_membership::etcd::Etcd::new(&url)
        .unwrap()
        .with_tls(&pki.client)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.health().is_err() {
        assert!(
            Instant::now() < deadline,
            "etcd over TLS not healthy after 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let c = Cluster::at("member-tls");
    let refused = c.nessie(&["up", "--nodes", "2", "--etcd", &url]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("etcd_ca"), "{}", stderr(&refused));
    let _ = c.nessie(&["down"]);
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().unwrap().to_str().unwrap().to_string();
    let up = Command::new(BIN)
        .current_dir(&pki.dir)
        .args(["up", "--nodes", "2", "--etcd", &url, "--etcd-ca", "ca.pem"])
        .args(["--etcd-cert", &path(&pki.client.cert)])
        .args(["--etcd-key", &path(&pki.client.key)])
        .arg("--dir")
        .arg(&c.dir)
        .output()
        .unwrap();
    assert!(up.status.success(), "{}", stderr(&up));
    serves_in_epoch_one(&c);
    let toml = std::fs::read_to_string(process::config_path(&c.dir)).unwrap();
    for (field, file) in [
        ("etcd_ca", &pki.client.ca),
        ("etcd_cert", &pki.client.cert),
        ("etcd_key", &pki.client.key),
    ] {
        assert!(
            toml.contains(&format!("{field} = \"{}\"", path(file))),
            "{field} by absolute path: {toml}"
        );
    }
    assert!(c.nessie(&["down"]).status.success());
}

#[test]
fn without_etcd_membership_is_off() {
    let c = Cluster::up("member-off", 1, "shm", &["--no-etcd"]);
    let text = String::from_utf8(c.nessie(&["status"]).stdout).unwrap();
    assert!(text.contains("membership: off"), "{text}");
    assert!(etcd_server::running(&c.dir).is_none());
    assert_eq!(status_json(&c)[0]["state"], "up");
}

#[test]
fn a_missing_etcd_binary_fails_up_with_a_clear_error() {
    let c = Cluster::at("member-nobin");
    let out = Command::new(BIN)
        .args(["up", "--nodes", "1", "--dir"])
        .arg(&c.dir)
        .env("NESSIE_ETCD", "/nonexistent/etcd")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("cannot run etcd") && err.contains("--etcd") && err.contains("etcd-server"),
        "{err}"
    );
    assert!(
        process::running_nodes(&c.dir).is_empty(),
        "no node was left running"
    );
}
