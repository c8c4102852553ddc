//! Starting and stopping node processes: `nessie down` stops nodes restarted by hand, SIGTERM
//! stops a node within a second whatever it is doing, and `up` takes the cluster directory's
//! lock so concurrent runs cannot tangle. Every test stops what it started, even when it fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nessie_cluster::admin::{AdminClient, Request, Response};
use nessie_cluster::process;
use nessie_cluster::rundir::Pidfd;

const BIN: &str = env!("CARGO_BIN_EXE_nessie");
/// How quickly a node must stop after SIGTERM.
const STOP_WITHIN: Duration = Duration::from_secs(1);

/// A cluster directory; on drop, `nessie down`, then SIGKILL to anything still running from it
/// (so a failing test leaves no orphans), then the directory is removed.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("nessie-life-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Dir(d)
    }

    fn config(&self) -> PathBuf {
        process::config_path(&self.0)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = nessie(&["down"], &self.0);
        for pid in processes_using(&self.config()) {
            // SAFETY: killing a node process this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A process started by the test, killed on drop.
struct Bg(Child);

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn nessie(args: &[&str], dir: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap()
}

fn up(dir: &Path, nodes: &str) -> Output {
    nessie(
        &[
            "up",
            "--nodes",
            nodes,
            "--ites-per-node",
            "1024",
            "--dtes-per-node",
            "256",
        ],
        dir,
    )
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn assert_ok(o: &Output) {
    assert!(o.status.success(), "{}", stderr(o));
}

/// Pids of the processes whose command line names `config`.
fn processes_using(config: &Path) -> Vec<i32> {
    let want = config.as_os_str().as_encoded_bytes();
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == want) && !is_zombie(*pid))
        })
        .collect()
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// Wait for `f` to return `Some`, for at most `limit`.
fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM `pid` and return how long it took to exit (None: still running after 5 s).
fn sigterm_time(pid: i32) -> Option<Duration> {
    let fd = Pidfd::open(pid).unwrap();
    let t = Instant::now();
    fd.signal(libc::SIGTERM).unwrap();
    fd.wait_exit(Duration::from_secs(5)).then(|| t.elapsed())
}

#[test]
fn sigterm_stops_a_serving_node_within_a_second() {
    let d = Dir::new("sigterm");
    assert_ok(&up(&d.0, "2"));
    let pid = process::live_pid(&d.0, 1).expect("node 1 runs");
    let took = sigterm_time(pid).expect("node 1 stopped");
    assert!(took < STOP_WITHIN, "node 1 took {took:?} to stop");
    assert_eq!(process::live_pid(&d.0, 1), None, "its pid file is released");
}

#[test]
fn sigterm_stops_a_node_still_waiting_for_its_peers() {
    let d = Dir::new("waiting");
    assert_ok(&up(&d.0, "2"));
    assert_ok(&nessie(&["down"], &d.0));
    // Node 0 alone waits for node 1, which never comes.
    let mut node = Bg(Command::new(BIN)
        .args(["node", "--id", "0", "--config"])
        .arg(d.config())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
    let pid = node.0.id() as i32;
    std::thread::sleep(Duration::from_millis(500));
    assert!(node.0.try_wait().unwrap().is_none(), "node 0 waits");
    let took = sigterm_time(pid).expect("the waiting node stopped");
    assert!(took < STOP_WITHIN, "took {took:?}");
}

#[test]
fn down_stops_a_node_restarted_by_hand() {
    let d = Dir::new("restart");
    assert_ok(&up(&d.0, "2"));
    let old = process::live_pid(&d.0, 1).expect("node 1 runs");
    // SAFETY: killing the node this test started.
    unsafe { libc::kill(old, libc::SIGKILL) };
    wait_for(Duration::from_secs(5), || {
        process::live_pid(&d.0, 1).is_none().then_some(())
    })
    .expect("node 1 died");
    let log = std::fs::File::create(d.0.join("by-hand.log")).unwrap();
    let mut node = Bg(Command::new(BIN)
        .args(["node", "--id", "1", "--config"])
        .arg(d.config())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap());
    let sock = d.0.join("node-1.sock");
    wait_for(Duration::from_secs(20), || {
        let mut c = AdminClient::connect(&sock, Duration::from_secs(2)).ok()?;
        (c.call(&Request::Ping).ok()? == Response::Ok).then_some(())
    })
    .expect("the restarted node rejoined and serves");

    let out = nessie(&["down"], &d.0);
    assert_ok(&out);
    let exited = wait_for(Duration::from_secs(1), || node.0.try_wait().unwrap());
    assert!(
        exited.is_some(),
        "`nessie down` left the restarted node running: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(processes_using(&d.config()).is_empty(), "no node is left");
    let left: Vec<_> = std::fs::read_dir(&d.0)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pid") || n.ends_with(".sock"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn concurrent_ups_on_one_directory_one_wins_and_no_orphans() {
    let d = Dir::new("concurrent");
    let start = || {
        Command::new(BIN)
            .args(["up", "--nodes", "3", "--dir"])
            .arg(&d.0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (start(), start());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let wins = [&a, &b].iter().filter(|o| o.status.success()).count();
    assert_eq!(wins, 1, "a: {}\nb: {}", stderr(&a), stderr(&b));
    let loser = if a.status.success() { &b } else { &a };
    let msg = stderr(loser);
    assert!(msg.contains("is locked"), "{msg}");
    // The winner's three nodes run, and nothing else.
    let running = processes_using(&d.config());
    assert_eq!(running.len(), 3, "{running:?}");
    assert_ok(&nessie(&["down"], &d.0));
    let left = wait_for(Duration::from_secs(2), || {
        let p = processes_using(&d.config());
        p.is_empty().then_some(())
    });
    assert!(
        left.is_some(),
        "orphans: {:?}",
        processes_using(&d.config())
    );
}

#[test]
fn up_and_down_fail_clearly_while_the_directory_is_locked() {
    use nessie_cluster::rundir::RunDir;
    let d = Dir::new("locked");
    let held = RunDir::lock(&d.0, true).unwrap();
    let o = up(&d.0, "1");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("is locked"), "{}", stderr(&o));
    assert!(
        processes_using(&d.config()).is_empty(),
        "no node was started"
    );
    let o = nessie(&["down"], &d.0);
    assert!(stderr(&o).contains("is locked"), "{}", stderr(&o));
    drop(held);
    assert_ok(&up(&d.0, "1"));
}

#[test]
fn down_finds_a_node_by_its_socket_when_its_pid_file_is_gone() {
    let d = Dir::new("sockonly");
    assert_ok(&up(&d.0, "1"));
    let pid = process::live_pid(&d.0, 0).expect("node 0 runs");
    std::fs::remove_file(d.0.join("node-0.pid")).unwrap();
    let fd = Pidfd::open(pid).unwrap();
    assert_ok(&nessie(&["down"], &d.0));
    assert!(fd.wait_exit(Duration::from_secs(1)), "node 0 still runs");
    assert!(!d.0.join("node-0.sock").exists(), "its socket is removed");
}

/// `up` with no size sizes each node from a 64 MiB budget (as memcached's `-m 64`) and says
/// what the tables hold; with explicit sizes it says so too.
#[test]
fn up_says_what_its_memory_holds() {
    let d = Dir::new("budget");
    let o = nessie(&["up", "--nodes", "2", "--no-etcd"], &d.0);
    assert_ok(&o);
    let e = stderr(&o);
    assert!(e.contains("memory per node 64.0 MiB"), "{e}");
    assert!(e.contains("one node holds"), "{e}");
    let toml = std::fs::read_to_string(d.config()).unwrap();
    let ites: u64 = toml
        .lines()
        .find_map(|l| l.strip_prefix("ites_per_node = "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ites_per_node in {toml}"));
    // The sizes written are the ones said: the budget's, not the explicit defaults.
    assert!(
        e.contains(&format!(": {ites} index entries (")),
        "{ites}: {e}"
    );
    assert_ne!(ites, 1 << 16, "the sizes before budgets: {toml}");
    assert_ok(&nessie(&["down"], &d.0));
    let o = up(&d.0, "2");
    assert_ok(&o);
    let e = stderr(&o);
    assert!(e.contains("1024 index entries"), "{e}");
}

/// `--value-max` above the item limit is taken as the item limit (items in chunks of one
/// default entry); against an explicit smaller `--item-max` it is refused, naming both.
#[test]
fn a_value_max_past_the_item_limit_is_the_item_limit() {
    let d = Dir::new("value-max");
    let o = nessie(
        &[
            "up",
            "--nodes",
            "2",
            "--no-etcd",
            "--value-max",
            "512M",
            "--item-max",
            "1M",
        ],
        &d.0,
    );
    assert!(!o.status.success(), "accepted");
    let e = stderr(&o);
    assert!(
        e.contains("--value-max") && e.contains("--item-max 1048576"),
        "{e}"
    );
    let o = nessie(
        &["up", "--nodes", "2", "--no-etcd", "--value-max", "2M"],
        &d.0,
    );
    assert_ok(&o);
    assert!(
        stderr(&o).contains("taken as the longest item"),
        "{}",
        stderr(&o)
    );
    let toml = std::fs::read_to_string(d.config()).unwrap();
    assert!(toml.contains("item_max = 2097152"), "{toml}");
    assert!(toml.contains("value_max = 16384"), "{toml}");
}
