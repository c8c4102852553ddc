//! The single-member etcd that `nessie up` starts beside a local cluster, and stops with it.
//!
//! It listens on loopback only, keeps its data in `etcd-data/` of the cluster directory
//! (created 0700, as etcd requires), logs to `etcd.log` and records its pid in `etcd.pid`.
//! Stopping checks that the pid still names an etcd serving that data directory, so a reused
//! pid is never signalled.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nessie_membership::etcd::Etcd;

/// The etcd binary: `$NESSIE_ETCD`, else `etcd` on the `PATH` (Debian's `etcd-server`).
pub fn binary() -> PathBuf {
    std::env::var_os("NESSIE_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

pub const DATA_DIR: &str = "etcd-data";
pub const LOG_FILE: &str = "etcd.log";
pub const PID_FILE: &str = "etcd.pid";
/// How long a new etcd may take to answer its health check.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `stop` waits after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum EtcdServerError {
    #[error("cannot run etcd ({binary}): {err}. Install it with `apt-get install etcd-server` (scripts/setup.sh does), set NESSIE_ETCD to its path, or point the cluster at an existing etcd with --etcd URL")]
    Spawn {
        binary: PathBuf,
        err: std::io::Error,
    },
    #[error("I/O on {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{path} exists and is not a directory this user owns with mode 0700; remove it")]
    UnsafeDataDir { path: PathBuf },
    #[error("etcd did not start: {reason}\n--- last lines of {log} ---\n{tail}")]
    StartFailed {
        reason: String,
        log: PathBuf,
        tail: String,
    },
}

/// A local etcd started by [`start`]; it runs detached until [`stop`].
#[derive(Debug)]
pub struct LocalEtcd {
    pub pid: i32,
    pub client_url: String,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EtcdServerError + '_ {
    move |err| EtcdServerError::Io {
        path: path.into(),
        err,
    }
}

/// Create `dir/etcd-data` with mode 0700, or accept it if it already is a directory of ours
/// with that mode (never a link).
fn data_dir(dir: &Path) -> Result<PathBuf, EtcdServerError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let path = dir.join(DATA_DIR);
    match std::fs::DirBuilder::new().mode(0o700).create(&path) {
        Ok(()) => return Ok(path),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(&path)(e)),
    }
    let m = std::fs::symlink_metadata(&path).map_err(io(&path))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me || m.permissions().mode() & 0o777 != 0o700 {
        return Err(EtcdServerError::UnsafeDataDir { path });
    }
    Ok(path)
}

/// Start etcd for the cluster in `dir` on loopback ports `client_port` (its API) and
/// `peer_port` (unused by a single member, but etcd always listens on one), and wait until it
/// answers. `log` is the already-created log file.
pub fn start(
    dir: &Path,
    log: File,
    client_port: u16,
    peer_port: u16,
) -> Result<LocalEtcd, EtcdServerError> {
    let data = data_dir(dir)?;
    let client_url = format!("http://127.0.0.1:{client_port}");
    let log_path = dir.join(LOG_FILE);
    let err = log.try_clone().map_err(io(&log_path))?;
    let mut cmd = command(&data, &client_url, peer_port);
    cmd.stdin(Stdio::null()).stdout(log).stderr(err);
    let mut child = cmd.spawn().map_err(|err| EtcdServerError::Spawn {
        binary: binary(),
        err,
    })?;
    let pid = child.id() as i32;
    let failed = |reason: String| EtcdServerError::StartFailed {
        reason,
        log: log_path.clone(),
        tail: super::tail(&log_path, 15),
    };
    let pid_path = dir.join(PID_FILE);
    let written = crate::rundir::create_file(&pid_path)
        .map_err(|e| failed(e.to_string()))
        .and_then(|mut f| writeln!(f, "{pid}").map_err(|e| failed(e.to_string())));
    let client = Etcd::with_timeout(&client_url, Duration::from_secs(1))
        .map_err(|e| failed(e.to_string()))?;
    let deadline = Instant::now() + READY_TIMEOUT;
    let ready = written.and_then(|()| loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Err(failed(format!("exited with {status}")));
        }
        if client.health().is_ok() {
            break Ok(());
        }
        if Instant::now() >= deadline {
            break Err(failed(format!(
                "no answer at {client_url} after {READY_TIMEOUT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    });
    if let Err(e) = ready {
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(&pid_path);
        return Err(e);
    }
    Ok(LocalEtcd { pid, client_url })
}

/// The etcd command line for a single member with its data in `data`, serving `client_url`
/// on loopback, detached from the caller's session.
fn command(data: &Path, client_url: &str, peer_port: u16) -> Command {
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let mut cmd = Command::new(binary());
    cmd.arg("--name")
        .arg("nessie")
        .arg("--data-dir")
        .arg(data)
        .args(["--listen-client-urls", client_url])
        .args(["--advertise-client-urls", client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("nessie={peer_url}")])
        .args(["--log-level", "warn"]);
    // Detach from the terminal's session so etcd outlives `nessie up`, as the nodes do.
    // SAFETY: the closure runs in the forked child before exec and only calls setsid, which is
    // async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd
}

/// The pid of the etcd serving `dir`'s data directory, if it is running.
pub fn running(dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(dir.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let data = dir.join(DATA_DIR);
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let serves_ours = args
        .windows(2)
        .any(|w| w[0] == b"--data-dir" && w[1] == data.as_os_str().as_encoded_bytes());
    serves_ours.then_some(pid)
}

/// Stop the etcd serving `dir` (SIGTERM, then SIGKILL after [`STOP_GRACE`]) and remove its pid
/// file and data. Returns whether one was running.
pub fn stop(dir: &Path) -> bool {
    let was = match running(dir).and_then(|pid| crate::rundir::Pidfd::open(pid).ok()) {
        // Checked again once the pidfd pins the process: the pid cannot be reused under us.
        Some(fd) if running(dir).is_some() => {
            let _ = fd.signal(libc::SIGTERM);
            if !fd.wait_exit(STOP_GRACE) {
                let _ = fd.signal(libc::SIGKILL);
                fd.wait_exit(Duration::from_secs(1));
            }
            true
        }
        _ => false,
    };
    let _ = std::fs::remove_file(dir.join(PID_FILE));
    let data = dir.join(DATA_DIR);
    if std::fs::symlink_metadata(&data).is_ok_and(|m| m.is_dir()) {
        let _ = std::fs::remove_dir_all(&data);
    }
    was
}
