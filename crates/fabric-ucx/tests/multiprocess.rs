//! Multi-process tests of the UCX backend: this test binary re-executes itself as child node
//! processes (selected by the `NESSIE_UCX_TEST_CHILD` environment variable). The parent is
//! node 0; children are nodes 1 and 2. NodeInfo and commands travel over the children's
//! stdin/stdout pipes (protocol lines start with `@@`), so no sockets are needed besides the
//! ones UCX itself uses on the tcp transport (loopback only: `UCX_NET_DEVICES=lo`).
//!
//! Children are killed when their guard drops (also when a test panics) and exit by themselves
//! when their stdin closes (parent gone).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nessie_fabric::{Endpoint, FabricError, Locality, NodeId, OpKind, RemoteAddr};
use nessie_fabric_ucx::{bench_op, BenchOp, NodeInfo, Transport, UcxConfig, UcxEndpoint, UcxNode};

const ROLE_ENV: &str = "NESSIE_UCX_TEST_CHILD";
/// Region 0 ("index"): 64 KiB; region 1 ("data"): 2 MiB.
const REGIONS: [u64; 2] = [64 << 10, 2 << 20];
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Tests share 2 cores and busy-poll; run them one at a time so timing bounds are meaningful.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn config(t: Transport) -> UcxConfig {
    let mut c = UcxConfig::new(t);
    if t == Transport::Tcp {
        c.net_devices = Some("lo".into());
    }
    c.op_timeout = Duration::from_secs(3);
    c.keepalive_interval = Duration::from_secs(1);
    // For measurements only (inherited by the children): progress-thread spinning.
    if let Some(us) = std::env::var("NESSIE_UCX_PROGRESS_SPIN_US")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        c.progress_spin = Duration::from_micros(us);
    }
    c
}

/// `cfg` with operations on peers sent through UCX (over shm they go straight to the peers'
/// memory mapped into the process by default: `UcxConfig::direct_peers`).
fn via_ucx(mut cfg: UcxConfig) -> UcxConfig {
    cfg.direct_peers = false;
    cfg
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Read-then-CAS increment loop; returns the number of failed CAS attempts.
fn cas_increment(ep: &mut dyn Endpoint, addr: RemoteAddr, count: u64) -> Result<u64, FabricError> {
    let mut failures = 0;
    for _ in 0..count {
        let mut cur = ep.read_u64(addr)?;
        loop {
            let seen = ep.compare_and_swap(addr, cur, cur + 1)?;
            if seen == cur {
                break;
            }
            failures += 1;
            cur = seen;
        }
    }
    Ok(failures)
}

// ------------------------------------------------------------------------------------ child

/// Entry point of child processes; a no-op in the normal test run.
#[test]
fn child_process_entry() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let code = match child_main(&role) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("child {role}: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn child_main(role: &str) -> Result<(), String> {
    // role = "<node id>:<transport>[:ucx]" (ucx: operations on peers through UCX, not
    // straight to their mapped memory)
    let mut parts = role.split(':');
    let id: NodeId = parts
        .next()
        .unwrap_or("")
        .parse()
        .map_err(|e| format!("{e}"))?;
    let t: Transport = parts
        .next()
        .ok_or("bad role")?
        .parse()
        .map_err(|e| format!("{e}"))?;
    let cfg = match parts.next() {
        Some("ucx") => via_ucx(config(t)),
        None => config(t),
        Some(x) => return Err(format!("bad role suffix {x:?}")),
    };
    // Never outlive the parent test process, even if it was SIGKILLed mid-command.
    let parent = unsafe { libc::getppid() };
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(200));
        if unsafe { libc::getppid() } != parent {
            std::process::exit(3);
        }
    });
    let node = UcxNode::new(id, &REGIONS, &cfg).map_err(|e| e.to_string())?;
    let out = std::io::stdout();
    let reply = |s: String| {
        let mut o = out.lock();
        writeln!(o, "@@{s}")
            .and_then(|_| o.flush())
            .expect("parent gone");
    };
    reply(format!(
        "info {}",
        serde_json::to_string(node.info()).unwrap()
    ));
    let mut ep: Option<UcxEndpoint> = None;
    for line in std::io::stdin().lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let mut w = line.split_whitespace();
        let cmd = w.next().unwrap_or("");
        let mut num = || -> u64 {
            w.next()
                .and_then(|x| x.parse().ok())
                .expect("numeric argument")
        };
        let r: Result<String, FabricError> = (|| match cmd {
            "cluster" => {
                let json = line.trim_start_matches("cluster").trim();
                let infos: Vec<NodeInfo> = serde_json::from_str(json).unwrap();
                ep = Some(node.endpoint(&infos)?);
                Ok("ok".into())
            }
            "pause" => {
                node.pause_progress();
                Ok("ok".into())
            }
            "resume" => {
                node.resume_progress();
                Ok("ok".into())
            }
            "exit" => std::process::exit(0),
            _ => {
                let ep = ep.as_mut().expect("cluster not set");
                match cmd {
                    "incr" => {
                        let (n, r, o, c) = (num(), num(), num(), num());
                        let f = cas_increment(ep, RemoteAddr::new(n as NodeId, r as u16, o), c)?;
                        Ok(format!("ok {f}"))
                    }
                    "local_sum" => {
                        let (r, o, l) = (num(), num(), num());
                        let mut buf = vec![0u8; l as usize];
                        ep.local_read(r as u16, o, &mut buf)?;
                        Ok(format!("sum {}", fnv(&buf)))
                    }
                    "local_write" => {
                        let (r, o, l, seed) = (num(), num(), num(), num());
                        ep.local_write(r as u16, o, &pattern(seed, l as usize))?;
                        Ok("ok".into())
                    }
                    "read_u64" => {
                        let (n, r, o) = (num(), num(), num());
                        Ok(format!(
                            "val {}",
                            ep.read_u64(RemoteAddr::new(n as NodeId, r as u16, o))?
                        ))
                    }
                    // Read until the node is reported unreachable; reply with the time it took.
                    "probe_dead" => {
                        let n = num() as NodeId;
                        let start = Instant::now();
                        while start.elapsed() < Duration::from_secs(15) {
                            if let Err(e) = ep.read_u64(RemoteAddr::new(n, 0, 0)) {
                                return Ok(format!("dead {} {}", start.elapsed().as_millis(), e));
                            }
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Ok("alive".into())
                    }
                    _ => panic!("unknown command {line:?}"),
                }
            }
        })();
        reply(match r {
            Ok(s) => s,
            Err(e) => format!("err {e}"),
        });
    }
    Ok(()) // stdin closed: the parent is gone
}

// ----------------------------------------------------------------------------------- parent

/// A child node process; killed (SIGKILL) and reaped on drop.
struct ChildNode {
    proc: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    info: NodeInfo,
}

impl ChildNode {
    /// A child whose operations on peers go straight to their mapped memory (`direct`) or
    /// through UCX.
    fn spawn(id: NodeId, t: Transport, direct: bool) -> ChildNode {
        let role = match direct {
            true => format!("{id}:{t}"),
            false => format!("{id}:{t}:ucx"),
        };
        let mut proc = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_process_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_ENV, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child");
        let stdin = proc.stdin.take().unwrap();
        let stdout = proc.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // libtest may print "test child_process_entry ... " in front of the first line.
                if let Some(i) = line.find("@@") {
                    if tx.send(line[i + 2..].to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        let mut c = ChildNode {
            proc,
            stdin,
            lines,
            info: NodeInfo {
                worker_address: vec![],
                regions: vec![],
            },
        };
        let first = c.recv();
        let json = first
            .strip_prefix("info ")
            .unwrap_or_else(|| panic!("child {id} said {first:?}"));
        c.info = serde_json::from_str(json).unwrap();
        c
    }

    fn pid(&self) -> u32 {
        self.proc.id()
    }

    fn send(&mut self, line: &str) {
        writeln!(self.stdin, "{line}")
            .and_then(|_| self.stdin.flush())
            .expect("child stdin");
    }

    fn recv(&mut self) -> String {
        match self.lines.recv_timeout(REPLY_TIMEOUT) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => panic!(
                "child {} did not answer within {REPLY_TIMEOUT:?}",
                self.pid()
            ),
            Err(RecvTimeoutError::Disconnected) => panic!("child {} exited", self.pid()),
        }
    }

    fn cmd(&mut self, line: &str) -> String {
        self.send(line);
        self.recv()
    }

    fn ok(&mut self, line: &str) -> String {
        let r = self.cmd(line);
        assert!(
            r.starts_with("ok") || r.starts_with("sum") || r.starts_with("val"),
            "{line:?} -> {r:?}"
        );
        r
    }

    fn kill(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

impl Drop for ChildNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Parent node 0 plus `children` child nodes, all connected.
struct Cluster {
    // Field order = drop order: endpoint, then node, then children (killed).
    ep: UcxEndpoint,
    node: UcxNode,
    infos: Vec<NodeInfo>,
    children: Vec<ChildNode>,
}

fn cluster(t: Transport, children: usize) -> Cluster {
    cluster_with(t, children, config(t))
}

fn cluster_with(t: Transport, children: usize, cfg: UcxConfig) -> Cluster {
    let direct = cfg.direct_peers;
    cluster_mixed(t, cfg, &vec![direct; children])
}

/// Parent node 0 with `cfg` plus one child per entry of `direct`, whose operations on peers go
/// straight to their mapped memory or through UCX.
fn cluster_mixed(t: Transport, cfg: UcxConfig, direct: &[bool]) -> Cluster {
    let mut kids: Vec<ChildNode> = (1..=direct.len())
        .map(|i| ChildNode::spawn(i as NodeId, t, direct[i - 1]))
        .collect();
    let node = UcxNode::new(0, &REGIONS, &cfg).unwrap();
    let mut infos = vec![node.info().clone()];
    infos.extend(kids.iter().map(|c| c.info.clone()));
    let json = serde_json::to_string(&infos).unwrap();
    for k in &mut kids {
        k.ok(&format!("cluster {json}"));
    }
    let ep = node.endpoint(&infos).unwrap();
    Cluster {
        ep,
        node,
        infos,
        children: kids,
    }
}

fn sum_reply(r: String) -> u64 {
    r.strip_prefix("sum ")
        .unwrap_or_else(|| panic!("expected a sum, got {r:?}"))
        .parse()
        .unwrap()
}

/// CPU time (user + system, in clock ticks of 10 ms) a process has used.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // fields after the command: state(3) ... utime(14) stime(15) => indexes 11, 12 here
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

const SIZES: [usize; 9] = [8, 16, 64, 256, 4096, 16 << 10, 64 << 10, 256 << 10, 1 << 20];

fn read_write_cas_errors_and_counters(t: Transport, direct: bool) {
    let _s = serial();
    let cfg = if direct {
        config(t)
    } else {
        via_ucx(config(t))
    };
    let mut c = cluster_with(t, 1, cfg);
    // Over shm the peer's memory is mapped into this process and used straight, unless
    // switched off; over tcp it is not mapped.
    assert_eq!(c.ep.maps_memory_of(1), direct && t == Transport::Shm, "{t}");
    assert!(!c.ep.maps_memory_of(0), "the own node is not a peer");
    let before = c.ep.stats().snapshot();

    // WRITE to node 1, verified by node 1's own direct read; READ back exactly.
    for (i, &len) in SIZES.iter().enumerate() {
        let off = 8 * (i as u64 + 1);
        let data = pattern(i as u64 + 1, len);
        c.ep.write(RemoteAddr::new(1, 1, off), &data).unwrap();
        let child_sum = sum_reply(c.children[0].cmd(&format!("local_sum 1 {off} {len}")));
        assert_eq!(
            child_sum,
            fnv(&data),
            "{len} B write to node 1 not visible there"
        );
        let mut back = vec![0u8; len];
        c.ep.read(RemoteAddr::new(1, 1, off), &mut back).unwrap();
        assert!(back == data, "{len} B read back differs");
        // And data written by node 1 itself is what we READ.
        c.children[0].ok(&format!("local_write 1 {off} {len} {}", 100 + i));
        c.ep.read(RemoteAddr::new(1, 1, off), &mut back).unwrap();
        assert!(
            back == pattern(100 + i as u64, len),
            "{len} B written by node 1 read wrongly"
        );
    }

    // CAS: success returns the old value and swaps; failure returns the current value and
    // leaves it; full 64-bit values.
    let w = RemoteAddr::new(1, 0, 16);
    assert_eq!(c.ep.compare_and_swap(w, 0, 42).unwrap(), 0);
    assert_eq!(
        c.ep.compare_and_swap(w, 0, 7).unwrap(),
        42,
        "failed CAS returns current value"
    );
    assert_eq!(c.ep.read_u64(w).unwrap(), 42, "failed CAS must not swap");
    assert_eq!(c.ep.compare_and_swap(w, 42, u64::MAX).unwrap(), 42);
    assert_eq!(
        c.ep.compare_and_swap(w, u64::MAX, 0x8000_0000_0000_0001)
            .unwrap(),
        u64::MAX
    );
    let r = c.children[0].ok("local_sum 0 16 8");
    assert_eq!(
        sum_reply(r),
        fnv(&0x8000_0000_0000_0001u64.to_le_bytes()),
        "node 1 sees the CAS result"
    );

    // Loopback (own node through UCX) and direct access to the own node agree.
    let own = RemoteAddr::new(0, 1, 4096);
    let data = pattern(9, 16 << 10);
    c.ep.write(own, &data).unwrap();
    let mut direct = vec![0u8; data.len()];
    c.ep.local_read(1, 4096, &mut direct).unwrap();
    assert!(direct == data);
    c.ep.local_write(0, 8, &5u64.to_le_bytes()).unwrap();
    assert_eq!(
        c.ep.compare_and_swap(RemoteAddr::new(0, 0, 8), 5, 6)
            .unwrap(),
        5
    );
    let mut b = [0u8; 8];
    c.ep.local_read(0, 8, &mut b).unwrap();
    assert_eq!(u64::from_le_bytes(b), 6);
    assert_eq!(c.node.region(0).unwrap().len_bytes(), REGIONS[0]);

    // Errors, checked before anything is posted (and not counted).
    let mut buf = [0u8; 8];
    let e = |r: Result<(), FabricError>| r.unwrap_err();
    assert!(matches!(
        e(c.ep.read(RemoteAddr::new(9, 0, 0), &mut buf)),
        FabricError::UnknownNode { node: 9, nodes: 2 }
    ));
    assert!(matches!(
        e(c.ep.read(RemoteAddr::new(1, 7, 0), &mut buf)),
        FabricError::UnknownRegion { node: 1, region: 7 }
    ));
    assert!(matches!(
        e(c.ep.read(RemoteAddr::new(1, 0, 4), &mut buf)),
        FabricError::Misaligned { offset: 4, .. }
    ));
    assert!(matches!(
        e(c.ep.write(RemoteAddr::new(1, 0, 0), &[0u8; 12])),
        FabricError::Misaligned { len: 12, .. }
    ));
    assert!(matches!(
        c.ep.compare_and_swap(RemoteAddr::new(1, 0, 3), 0, 1),
        Err(FabricError::Misaligned { .. })
    ));
    let end = REGIONS[0];
    assert!(matches!(
        e(c.ep.read(RemoteAddr::new(1, 0, end - 8), &mut [0u8; 16])),
        FabricError::OutOfBounds { node: 1, region: 0, size, .. } if size == end
    ));
    assert!(matches!(
        c.ep.compare_and_swap(RemoteAddr::new(1, 0, end), 0, 1),
        Err(FabricError::OutOfBounds { .. })
    ));
    assert!(matches!(
        e(c.ep.read(RemoteAddr::new(1, 0, u64::MAX - 7), &mut buf)),
        FabricError::OutOfBounds { .. }
    ));
    assert!(matches!(
        e(c.ep.local_read(0, end, &mut buf)),
        FabricError::OutOfBounds { node: 0, .. }
    ));
    assert!(matches!(
        e(c.ep.local_write(0, 1, &buf)),
        FabricError::Misaligned { .. }
    ));
    assert!(matches!(
        e(c.ep.local_read(5, 0, &mut buf)),
        FabricError::UnknownRegion { node: 0, region: 5 }
    ));

    // Counters by kind and locality.
    let d = c.ep.stats().snapshot().saturating_sub(&before);
    let n = SIZES.len() as u64;
    let total: u64 = SIZES.iter().map(|&s| s as u64).sum();
    assert_eq!(d.ops(OpKind::Write, Locality::Remote), n);
    assert_eq!(d.bytes(OpKind::Write, Locality::Remote), total);
    assert_eq!(d.ops(OpKind::Read, Locality::Remote), 2 * n + 1); // + 1 read_u64
    assert_eq!(d.bytes(OpKind::Read, Locality::Remote), 2 * total + 8);
    assert_eq!(d.ops(OpKind::Cas, Locality::Remote), 4);
    assert_eq!(d.ops(OpKind::Write, Locality::Loopback), 1);
    assert_eq!(d.bytes(OpKind::Write, Locality::Loopback), 16 << 10);
    assert_eq!(d.ops(OpKind::Cas, Locality::Loopback), 1);
    assert_eq!(d.bytes(OpKind::Cas, Locality::Loopback), 8);
    assert_eq!(d.ops(OpKind::Read, Locality::Direct), 2);
    assert_eq!(d.ops(OpKind::Write, Locality::Direct), 1);
    assert_eq!(d.ops(OpKind::Read, Locality::Loopback), 0);
    assert_eq!(d.total_ops(), 3 * n + 1 + 4 + 1 + 1 + 3);
    assert_eq!(
        c.node.stats().total(Some(0)),
        c.ep.stats().snapshot(),
        "node registry sees the endpoint"
    );

    // An idle node (progress thread armed and asleep) uses ~no CPU.
    std::thread::sleep(Duration::from_millis(200));
    let pid = c.children[0].pid();
    let t0 = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(pid) - t0;
    assert!(
        used <= 5,
        "idle child node used {used} ticks (of 100) in one second"
    );
}

#[test]
fn shm_read_write_cas_errors_and_counters() {
    read_write_cas_errors_and_counters(Transport::Shm, true);
}

#[test]
fn shm_read_write_cas_errors_and_counters_through_ucx() {
    read_write_cas_errors_and_counters(Transport::Shm, false);
}

#[test]
fn tcp_read_write_cas_errors_and_counters() {
    read_write_cas_errors_and_counters(Transport::Tcp, true);
}

fn concurrent_cas_increments(t: Transport, per_process: u64) {
    let _s = serial();
    // Node 2 sends its operations through UCX, the parent (over shm) straight to node 1's
    // mapped memory: the two kinds of CAS must be atomic with each other.
    let mut c = cluster_mixed(t, config(t), &[true, false]);
    assert_eq!(c.ep.maps_memory_of(1), t == Transport::Shm);
    // Target: a word in node 1's memory. Node 1 increments it through loopback, node 2 and the
    // parent (node 0) remotely, all at once.
    let target = RemoteAddr::new(1, 0, 64);
    let cmd = format!("incr 1 0 64 {per_process}");
    c.children[0].send(&cmd);
    c.children[1].send(&cmd);
    let mine = cas_increment(&mut c.ep, target, per_process).unwrap();
    let r1 = c.children[0].recv();
    let r2 = c.children[1].recv();
    assert!(
        r1.starts_with("ok") && r2.starts_with("ok"),
        "{r1:?} {r2:?}"
    );
    let value = c.ep.read_u64(target).unwrap();
    assert_eq!(value, 3 * per_process, "lost or duplicated increments");
    let contended: u64 = [r1, r2]
        .iter()
        .map(|r| r[3..].parse::<u64>().unwrap())
        .sum::<u64>()
        + mine;
    eprintln!(
        "{t}: {} increments, {contended} failed CAS attempts (contention)",
        3 * per_process
    );
}

#[test]
fn shm_concurrent_cas_increments_from_three_processes_sum_exactly() {
    concurrent_cas_increments(Transport::Shm, 20_000);
}

#[test]
fn tcp_concurrent_cas_increments_from_three_processes_sum_exactly() {
    concurrent_cas_increments(Transport::Tcp, 1_500);
}

/// Over shm READ, WRITE and CAS need no help from the target, through UCX (the sm
/// transports) and straight on its mapped memory alike.
#[test]
fn shm_read_write_cas_complete_while_target_progress_is_paused() {
    for direct in [false, true] {
        target_progress_paused(direct);
    }
}

fn target_progress_paused(direct: bool) {
    let _s = serial();
    let cfg = if direct {
        config(Transport::Shm)
    } else {
        via_ucx(config(Transport::Shm))
    };
    let mut c = cluster_with(Transport::Shm, 1, cfg);
    assert_eq!(c.ep.maps_memory_of(1), direct);
    // Warm up (wireup finished) while the target is still progressing.
    c.ep.read_u64(RemoteAddr::new(1, 0, 0)).unwrap();
    c.children[0].ok("pause");
    let data = pattern(3, 16 << 10);
    c.ep.write(RemoteAddr::new(1, 1, 0), &data).unwrap();
    let mut back = vec![0u8; data.len()];
    c.ep.read(RemoteAddr::new(1, 1, 0), &mut back).unwrap();
    assert!(back == data);
    let w = RemoteAddr::new(1, 0, 8);
    assert_eq!(c.ep.compare_and_swap(w, 0, 11).unwrap(), 0);
    assert_eq!(c.ep.compare_and_swap(w, 0, 12).unwrap(), 11);
    assert_eq!(c.ep.read_u64(w).unwrap(), 11);
    let n = 2000;
    // Had these needed the paused target's help they would have failed with Unreachable.
    cas_increment(&mut c.ep, w, n).unwrap();
    // The child (its main thread; the progress thread is parked) sees the results.
    assert_eq!(
        sum_reply(c.children[0].ok("local_sum 1 0 16384")),
        fnv(&data)
    );
    assert_eq!(
        sum_reply(c.children[0].ok("local_sum 0 8 8")),
        fnv(&(11 + n).to_le_bytes())
    );
    c.children[0].ok("resume");
    assert_eq!(c.ep.read_u64(w).unwrap(), 11 + n);
}

/// The control for the test above: pausing really stops the target's progress, so over tcp
/// (software-emulated RMA) an operation cannot complete and times out as Unreachable.
#[test]
fn tcp_ops_time_out_while_target_progress_is_paused() {
    let _s = serial();
    let mut cfg = config(Transport::Tcp);
    cfg.op_timeout = Duration::from_millis(1500);
    let mut c = cluster_with(Transport::Tcp, 1, cfg);
    c.ep.read_u64(RemoteAddr::new(1, 0, 0)).unwrap();
    c.children[0].ok("pause");
    let start = Instant::now();
    let e = c.ep.read_u64(RemoteAddr::new(1, 0, 0)).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(e, FabricError::Unreachable { node: 1, .. }), "{e}");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(c.ep.is_unreachable(1));
    // Still unreachable for this endpoint, immediately.
    let start = Instant::now();
    assert!(matches!(
        c.ep.read_u64(RemoteAddr::new(1, 0, 0)),
        Err(FabricError::Unreachable { node: 1, .. })
    ));
    // Without waiting for the 1.5 s op timeout again.
    assert!(start.elapsed() < Duration::from_secs(1));
    c.children[0].ok("resume");
    // A fresh endpoint reaches the resumed node.
    let mut ep2 = c.node.endpoint(&c.infos).unwrap();
    assert_eq!(
        ep2.compare_and_swap(RemoteAddr::new(1, 0, 0), 0, 1)
            .unwrap(),
        0
    );
    // The endpoint that gave up on it does not, until the node is told the peer is back ...
    assert!(matches!(
        c.ep.read_u64(RemoteAddr::new(1, 0, 0)),
        Err(FabricError::Unreachable { node: 1, .. })
    ));
    c.node.renew_peer(1);
    // ... and then it connects afresh, once: a renewal is not a standing order.
    assert_eq!(c.ep.read_u64(RemoteAddr::new(1, 0, 0)).unwrap(), 1);
    assert!(!c.ep.is_unreachable(1));
    assert_eq!(
        ep2.read_u64(RemoteAddr::new(1, 0, 0)).unwrap(),
        1,
        "a working one is left alone"
    );
    assert_eq!(
        c.ep.read_u64(RemoteAddr::new(0, 0, 0)).unwrap(),
        0,
        "loopback unaffected"
    );
}

fn killed_peer_becomes_unreachable(t: Transport, direct: bool) {
    let _s = serial();
    let cfg = if direct {
        config(t)
    } else {
        via_ucx(config(t))
    };
    let mut c = cluster_with(t, 2, cfg);
    assert_eq!(c.ep.maps_memory_of(1), direct && t == Transport::Shm);
    for n in 0..3 {
        c.ep.write(RemoteAddr::new(n, 0, 0), &[1u8; 64]).unwrap();
    }
    c.children[1].ok("read_u64 1 0 0");
    // Node 2 is in the middle of a long CAS-increment loop on node 1 when node 1 dies.
    c.children[1].send("incr 1 0 256 1000000000");
    std::thread::sleep(Duration::from_millis(100));
    c.children[0].kill(); // SIGKILL node 1
    let start = Instant::now();
    let err = loop {
        match c.ep.read_u64(RemoteAddr::new(1, 0, 0)) {
            Err(e) => break e,
            Ok(_) => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "node 1 still reachable after 10 s"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    let took = start.elapsed();
    eprintln!("{t}: killed node 1 reported unreachable after {took:?}: {err}");
    assert!(
        matches!(err, FabricError::Unreachable { node: 1, .. }),
        "{err}"
    );
    assert!(took < Duration::from_secs(10));
    // Every kind of op to the dead node fails fast now.
    let t0 = Instant::now();
    assert!(matches!(
        c.ep.write(RemoteAddr::new(1, 0, 0), &[0u8; 8]),
        Err(FabricError::Unreachable { node: 1, .. })
    ));
    assert!(matches!(
        c.ep.compare_and_swap(RemoteAddr::new(1, 0, 0), 0, 1),
        Err(FabricError::Unreachable { node: 1, .. })
    ));
    // Without waiting for the op timeout.
    assert!(t0.elapsed() < Duration::from_secs(1));
    // The survivors keep working: node 2 remotely, node 0 through loopback.
    for n in [2, 0] {
        let a = RemoteAddr::new(n, 1, 512);
        c.ep.write(a, &pattern(n as u64, 4096)).unwrap();
        let mut b = vec![0u8; 4096];
        c.ep.read(a, &mut b).unwrap();
        assert!(b == pattern(n as u64, 4096));
        assert_eq!(
            c.ep.compare_and_swap(a, 0, 1).unwrap(),
            u64::from_le_bytes(b[..8].try_into().unwrap())
        );
    }
    // ... and node 2's CAS loop ended with Unreachable (not a hang, not a crash) ...
    let r = c.children[1].recv();
    assert!(
        r.starts_with("err node 1 is unreachable"),
        "node 2's CAS loop: {r}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "node 2 needed {:?}",
        start.elapsed()
    );
    eprintln!("{t}: node 2's CAS loop: {r}");
    // ... node 2 keeps seeing node 1 dead, while still reaching node 0.
    let r = c.children[1].cmd("probe_dead 1");
    assert!(r.starts_with("dead "), "node 2 still reaches node 1: {r}");
    assert!(r.contains("unreachable"), "{r}");
    c.children[1].ok("incr 0 0 128 100");
    assert_eq!(c.ep.read_u64(RemoteAddr::new(0, 0, 128)).unwrap(), 100);
}

#[test]
fn shm_killed_peer_becomes_unreachable_and_survivors_work() {
    killed_peer_becomes_unreachable(Transport::Shm, true);
}

/// As above, with operations on peers through UCX rather than straight to mapped memory.
#[test]
fn shm_killed_peer_becomes_unreachable_through_ucx() {
    killed_peer_becomes_unreachable(Transport::Shm, false);
}

/// A peer whose process was restarted (a new process, a new shared segment) is reached at its
/// new memory once the node is told (`UcxNode::set_peer`): the mapping of the old segment goes
/// with the old connection, so nothing is written into the dead process's orphaned memory.
#[test]
fn shm_restarted_peer_is_reached_at_its_new_memory() {
    for direct in [true, false] {
        let _s = serial();
        let t = Transport::Shm;
        let cfg = if direct {
            config(t)
        } else {
            via_ucx(config(t))
        };
        let mut c = cluster_with(t, 1, cfg);
        let a = RemoteAddr::new(1, 1, 4096);
        c.ep.write(a, &pattern(1, 256)).unwrap();
        assert_eq!(c.ep.maps_memory_of(1), direct);
        c.children[0].kill();
        let mut fresh = ChildNode::spawn(1, t, direct);
        let infos = vec![c.infos[0].clone(), fresh.info.clone()];
        fresh.ok(&format!(
            "cluster {}",
            serde_json::to_string(&infos).unwrap()
        ));
        c.node.set_peer(1, Some(fresh.info.clone()));
        // The new process's memory starts zeroed: nothing of the old one shows through.
        let mut back = vec![0u8; 256];
        c.ep.read(a, &mut back).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "direct {direct}: old memory read"
        );
        assert_eq!(c.ep.maps_memory_of(1), direct);
        c.ep.write(a, &pattern(2, 256)).unwrap();
        assert_eq!(
            c.ep.compare_and_swap(RemoteAddr::new(1, 0, 8), 0, 5)
                .unwrap(),
            0
        );
        assert_eq!(
            sum_reply(fresh.cmd("local_sum 1 4096 256")),
            fnv(&pattern(2, 256)),
            "direct {direct}: the restarted node does not see the write"
        );
        assert_eq!(
            sum_reply(fresh.cmd("local_sum 0 8 8")),
            fnv(&5u64.to_le_bytes())
        );
        c.children[0] = fresh;
    }
}

#[test]
fn tcp_killed_peer_becomes_unreachable_and_survivors_work() {
    killed_peer_becomes_unreachable(Transport::Tcp, true);
}

/// Latency numbers (printed; run with --nocapture to see them). Asserts only sanity.
#[test]
fn bench_op_measures_remote_latency() {
    let _s = serial();
    // NESSIE_UCX_BENCH_ITERS scales the run (for measurements); the default keeps it short.
    let scale: u64 = std::env::var("NESSIE_UCX_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for t in [Transport::Shm, Transport::Tcp] {
        let mut c = cluster(t, 1);
        let iters = scale * if t == Transport::Shm { 20_000 } else { 2_000 };
        for (op, size) in [
            (BenchOp::Cas, 8),
            (BenchOp::Read, 8),
            (BenchOp::Read, 16 << 10),
            (BenchOp::Write, 16 << 10),
        ] {
            let s = bench_op(&mut c.ep, RemoteAddr::new(1, 1, 0), op, size, iters).unwrap();
            eprintln!("{t} remote {s}");
            assert!(
                s.p50_ns > 0 && s.p50_ns <= s.p99_ns && s.p99_ns <= s.max_ns && s.ops_per_sec > 0.0
            );
        }
    }
}
