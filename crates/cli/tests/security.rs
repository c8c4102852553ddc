//! Another local user must not be able to read the cluster secret or make `nessie up` write
//! through links it planted. Tests that need a second user run it with `setpriv` as `nobody`
//! when we are root, and say they are skipped otherwise.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const BIN: &str = env!("CARGO_BIN_EXE_nessie");
const NOBODY: u32 = 65534;

/// Paths removed (and their nodes stopped) on drop, even if the test fails.
struct Cleanup(Vec<PathBuf>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for p in &self.0 {
            if p.join("cluster.toml").exists() && !p.is_symlink() {
                let _ = Command::new(BIN).arg("down").arg("--dir").arg(p).output();
            }
            if p.is_symlink() {
                let _ = std::fs::remove_file(p);
            } else {
                let _ = std::fs::remove_dir_all(p);
            }
        }
    }
}

fn tmp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("nessie-sec-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    let _ = std::fs::remove_file(&p);
    p
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Run `args` as the unprivileged user `nobody`.
fn as_nobody(args: &[&str]) -> Output {
    let id = NOBODY.to_string();
    Command::new("setpriv")
        .args([
            &format!("--reuid={id}"),
            &format!("--regid={id}"),
            "--clear-groups",
            "--",
        ])
        .args(args)
        .output()
        .unwrap()
}

fn sh_nobody(script: &str) {
    let o = as_nobody(&["sh", "-c", script]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn up(dir: &Path) -> Output {
    Command::new(BIN)
        .args([
            "up",
            "--nodes",
            "1",
            "--ites-per-node",
            "1024",
            "--dtes-per-node",
            "256",
        ])
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap()
}

fn refused(o: &Output, why: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "up accepted it");
    assert!(err.contains(why), "expected {why:?} in: {err}");
}

/// A file of ours `up` must never touch, in a directory only we can enter.
fn victim(c: &mut Cleanup, name: &str) -> PathBuf {
    let d = tmp(&format!("{name}-victim"));
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    c.0.push(d.clone());
    let f = d.join("precious");
    std::fs::write(&f, "precious").unwrap();
    f
}

#[test]
fn up_refuses_a_directory_another_user_owns() {
    if !is_root() {
        eprintln!("skipped: needs root to act as a second user");
        return;
    }
    let mut c = Cleanup(vec![]);
    let v = victim(&mut c, "owned");
    let dir = tmp("owned");
    c.0.push(dir.clone());
    // The predictable-name trap: another user creates the directory first and plants links.
    sh_nobody(&format!(
        "mkdir -m 700 {d} && ln -s {v} {d}/node-0.log && ln -s {v} {d}/cluster.toml && chmod 755 {d}",
        d = dir.display(),
        v = v.display()
    ));
    refused(&up(&dir), "owned by uid 65534");
    assert_eq!(std::fs::read_to_string(&v).unwrap(), "precious");
}

#[test]
fn up_refuses_a_symlink_to_a_directory() {
    if !is_root() {
        eprintln!("skipped: needs root to act as a second user");
        return;
    }
    let mut c = Cleanup(vec![]);
    let v = victim(&mut c, "link");
    let link = tmp("link");
    c.0.push(link.clone());
    sh_nobody(&format!(
        "ln -s {} {}",
        v.parent().unwrap().display(),
        link.display()
    ));
    refused(&up(&link), "is a symlink");
    assert!(!v.parent().unwrap().join("cluster.toml").exists());
}

#[test]
fn up_refuses_a_directory_writable_by_others() {
    let c = Cleanup(vec![tmp("writable")]);
    let dir = &c.0[0];
    std::fs::create_dir(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(&up(dir), "writable by group or others");
    assert!(!dir.join("cluster.toml").exists());
}

#[test]
fn up_never_writes_through_a_planted_symlink() {
    let mut c = Cleanup(vec![]);
    let v = victim(&mut c, "planted");
    let dir = tmp("planted");
    c.0.push(dir.clone());
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    for name in ["cluster.toml", "node-0.log"] {
        let link = dir.join(name);
        std::os::unix::fs::symlink(&v, &link).unwrap();
        refused(&up(&dir), "refusing to follow the symlink");
        assert_eq!(std::fs::read_to_string(&v).unwrap(), "precious", "{name}");
        std::fs::remove_file(&link).unwrap();
    }
}

/// Mode bits of everything in `dir` that anyone but the owner has.
fn exposed(dir: &Path) -> Vec<(String, u32)> {
    let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
    entries
        .filter_map(|e| {
            let mode = e.metadata().ok()?.permissions().mode() & 0o777;
            (mode & 0o077 != 0).then(|| (e.file_name().to_string_lossy().into_owned(), mode))
        })
        .collect()
}

#[test]
fn files_up_creates_are_never_readable_by_others() {
    let c = Cleanup(vec![tmp("modes")]);
    let dir = c.0[0].clone();
    // Watch the directory while `up` runs, with no umask to help: nothing may ever be exposed.
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (dir, done) = (dir.clone(), done.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !done.load(Ordering::SeqCst) {
                seen.extend(exposed(&dir));
            }
            seen
        })
    };
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask 0 && exec {BIN} up --nodes 2 --ites-per-node 1024 --dtes-per-node 256 --dir {}",
            dir.display()
        ))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    done.store(true, Ordering::SeqCst);
    let seen = watcher.join().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "directory mode {mode:o}");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for want in ["cluster.toml", "node-0.pid", "node-0.log", "node-1.sock"] {
        assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
    }
    assert_eq!(exposed(&dir), vec![], "after up");
    assert_eq!(seen, vec![], "while up ran");
    if is_root() {
        let cfg = dir.join("cluster.toml");
        let o = as_nobody(&["cat", cfg.to_str().unwrap()]);
        assert!(!o.status.success(), "another user read the secret");
    }
}

#[test]
fn an_unwritable_directory_names_the_failed_write() {
    let c = Cleanup(vec![tmp("readonly")]);
    let dir = &c.0[0];
    let script = format!(
        "mkdir -m 700 {d} && chmod 500 {d} && exec {BIN} up --nodes 1 --dir {d}",
        d = dir.display()
    );
    let o = if is_root() {
        as_nobody(&["sh", "-c", &script])
    } else {
        Command::new("sh").arg("-c").arg(&script).output().unwrap()
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    // The first file `up` writes is the log of the etcd it starts for membership.
    let want = format!("cannot write {}", dir.join("etcd.log").display());
    assert!(err.contains(&want), "expected {want:?} in: {err}");
    assert!(!err.contains("cannot read"), "{err}");
}
