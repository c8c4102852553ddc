//! The cluster directory and the files in it, handled so that another local user cannot read
//! the cluster secret or redirect our writes:
//!
//! - the directory must be owned by us and not writable by group or others (it is created
//!   0700) and must not be a symlink;
//! - files are created with their final mode (0600), with `O_EXCL` and `O_NOFOLLOW`; a symlink
//!   where a file should be is refused, never followed;
//! - `up` and `down` hold an exclusive `flock` on the directory while they run;
//! - every node holds an exclusive `flock` on its own pid file for as long as it lives, so a
//!   locked pid file names a live node (the kernel drops the lock when the process dies), and
//!   a pid file nobody holds is a leftover.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Permission bits a cluster file may have (owner read/write only).
pub const FILE_MODE: u32 = 0o600;
/// Permission bits of a directory `up` creates.
pub const DIR_MODE: u32 = 0o700;
/// How long a starting node retries a pid-file lock briefly held by a `down`/`status` probe.
const PID_LOCK_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("cannot create directory {path}: {err}")]
    Create { path: PathBuf, err: std::io::Error },
    #[error("cannot open directory {path}: {err}")]
    Open { path: PathBuf, err: std::io::Error },
    #[error("refusing to use {path}: it is a symlink (give the real directory)")]
    Symlink { path: PathBuf },
    #[error("refusing to use {path}: it is owned by uid {owner}, not by you (uid {me})")]
    NotOwned { path: PathBuf, owner: u32, me: u32 },
    #[error("refusing to use {path}: it is writable by group or others (mode {mode:o}); `chmod go-w` it")]
    Writable { path: PathBuf, mode: u32 },
    #[error("directory {path} is locked: another `nessie up` or `nessie down` is using it")]
    Locked { path: PathBuf },
    #[error("cannot write {path}: {err}")]
    Write { path: PathBuf, err: std::io::Error },
    #[error("refusing to follow the symlink {path} (remove it)")]
    FileIsSymlink { path: PathBuf },
    #[error("node {id} is already running (pid {pid}, pid file {path})")]
    NodeRunning { id: u16, pid: i32, path: PathBuf },
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

fn last_os_error<T>() -> Result<T, std::io::Error> {
    Err(std::io::Error::last_os_error())
}

/// Open `path` itself (never through a symlink) with `flags`.
fn open_nofollow(path: &Path, flags: libc::c_int, mode: u32) -> std::io::Result<OwnedFd> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid NUL-terminated path; the returned fd is owned by us.
    let fd = unsafe { libc::open(c.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return last_os_error();
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `flock(fd, how | LOCK_NB)`; `Ok(false)` when someone else holds a conflicting lock.
fn try_flock(fd: RawFd, how: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(fd, how | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.kind() == std::io::ErrorKind::WouldBlock {
        Ok(false)
    } else {
        Err(e)
    }
}

/// A cluster directory that passed the ownership checks, opened (and possibly locked) by us.
pub struct RunDir {
    path: PathBuf,
    fd: OwnedFd,
}

impl RunDir {
    /// Open `path` (creating it 0700 if `create`) and check that we may trust it.
    pub fn open(path: &Path, create: bool) -> Result<RunDir, DirError> {
        if create {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(path)
                .map_err(|err| DirError::Create {
                    path: path.into(),
                    err,
                })?;
        }
        let fd =
            open_nofollow(path, libc::O_RDONLY | libc::O_DIRECTORY, 0).map_err(|err| match err
                .raw_os_error()
            {
                Some(libc::ELOOP) | Some(libc::ENOTDIR) if is_symlink(path) => {
                    DirError::Symlink { path: path.into() }
                }
                _ => DirError::Open {
                    path: path.into(),
                    err,
                },
            })?;
        // Check what we opened, not the name (which could be swapped after the check).
        let meta = File::from(fd.try_clone().map_err(|err| DirError::Open {
            path: path.into(),
            err,
        })?)
        .metadata()
        .map_err(|err| DirError::Open {
            path: path.into(),
            err,
        })?;
        if meta.uid() != euid() {
            return Err(DirError::NotOwned {
                path: path.into(),
                owner: meta.uid(),
                me: euid(),
            });
        }
        if meta.mode() & 0o022 != 0 {
            return Err(DirError::Writable {
                path: path.into(),
                mode: meta.mode() & 0o7777,
            });
        }
        Ok(RunDir {
            path: path.into(),
            fd,
        })
    }

    /// [`RunDir::open`] and take the directory's exclusive lock (released on drop).
    pub fn lock(path: &Path, create: bool) -> Result<RunDir, DirError> {
        let d = Self::open(path, create)?;
        match try_flock(d.fd.as_raw_fd(), libc::LOCK_EX) {
            Ok(true) => Ok(d),
            Ok(false) => Err(DirError::Locked { path: path.into() }),
            Err(err) => Err(DirError::Open {
                path: path.into(),
                err,
            }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Create `name` afresh with mode 0600, replacing a leftover regular file (never writing
    /// through a symlink).
    pub fn create_file(&self, name: &str) -> Result<File, DirError> {
        create_file(&self.path.join(name))
    }
}

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Create `path` afresh with mode 0600 (`O_EXCL | O_NOFOLLOW`), replacing a leftover regular
/// file or socket; a symlink there is refused.
pub fn create_file(path: &Path) -> Result<File, DirError> {
    let werr = |err| DirError::Write {
        path: path.into(),
        err,
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(DirError::FileIsSymlink { path: path.into() })
        }
        Ok(_) => std::fs::remove_file(path).map_err(werr)?,
        Err(_) => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(werr)
}

/// Write `data` to a fresh file `path` (see [`create_file`]).
pub fn write_file(path: &Path, data: &[u8]) -> Result<(), DirError> {
    create_file(path)?
        .write_all(data)
        .map_err(|err| DirError::Write {
            path: path.into(),
            err,
        })
}

/// The pid file of a running node: locked for the node's lifetime, removed on drop.
pub struct PidFile {
    path: PathBuf,
    file: File,
}

impl PidFile {
    /// Create and lock `path` for node `id`, recording our pid in it.
    pub fn acquire(path: &Path, id: u16) -> Result<PidFile, DirError> {
        let werr = |err| DirError::Write {
            path: path.into(),
            err,
        };
        let deadline = Instant::now() + PID_LOCK_WAIT;
        loop {
            let fd =
                open_nofollow(path, libc::O_RDWR | libc::O_CREAT, FILE_MODE).map_err(|err| {
                    match err.raw_os_error() {
                        Some(libc::ELOOP) => DirError::FileIsSymlink { path: path.into() },
                        _ => werr(err),
                    }
                })?;
            let mut file = File::from(fd);
            if !try_flock(file.as_raw_fd(), libc::LOCK_EX).map_err(werr)? {
                if Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                let pid = read_pid(&mut file).unwrap_or(0);
                return Err(DirError::NodeRunning {
                    id,
                    pid,
                    path: path.into(),
                });
            }
            // A `down` may have removed the leftover between our open and our lock: make sure
            // the name still refers to the file we locked.
            let ours = file.metadata().map_err(werr)?;
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.ino() == ours.ino() && m.dev() == ours.dev() => {}
                _ => continue,
            }
            file.set_len(0).map_err(werr)?;
            write!(file, "{}", std::process::id()).map_err(werr)?;
            return Ok(PidFile {
                path: path.into(),
                file,
            });
        }
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let ours = self.file.metadata().ok();
        let there = std::fs::symlink_metadata(&self.path).ok();
        if let (Some(a), Some(b)) = (ours, there) {
            if a.ino() == b.ino() && a.dev() == b.dev() {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

fn read_pid(f: &mut File) -> Option<i32> {
    let mut s = String::new();
    f.rewind().ok()?;
    f.read_to_string(&mut s).ok()?;
    s.trim().parse().ok().filter(|&p| p > 0)
}

/// The pid recorded in the pid file `path` if a live process holds its lock, else `None`
/// (no file, a symlink, or a leftover of a dead node).
pub fn pid_file_holder(path: &Path) -> Option<i32> {
    let mut f = File::from(open_nofollow(path, libc::O_RDONLY, 0).ok()?);
    if try_flock(f.as_raw_fd(), libc::LOCK_SH).ok()? {
        return None; // nobody holds it; our shared lock goes with `f`
    }
    read_pid(&mut f)
}

/// The pid of the process listening on the Unix socket `path`, if one is.
pub fn socket_listener_pid(path: &Path) -> Option<i32> {
    use std::os::unix::fs::FileTypeExt;
    if !std::fs::symlink_metadata(path)
        .ok()?
        .file_type()
        .is_socket()
    {
        return None;
    }
    let s = std::os::unix::net::UnixStream::connect(path).ok()?;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the given size.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0 && cred.pid > 0 && cred.uid == euid()).then_some(cred.pid)
}

/// A process handle that cannot be confused with a later process reusing the pid.
pub struct Pidfd(OwnedFd);

impl Pidfd {
    pub fn open(pid: i32) -> std::io::Result<Pidfd> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return last_os_error();
        }
        // SAFETY: a fresh fd owned by us.
        Ok(Pidfd(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }))
    }

    pub fn signal(&self, sig: libc::c_int) -> std::io::Result<()> {
        // SAFETY: pidfd_send_signal on our pidfd with no siginfo.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            return last_os_error();
        }
        Ok(())
    }

    /// Wait until the process has exited; `false` if it is still running after `timeout`.
    pub fn wait_exit(&self, timeout: Duration) -> bool {
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    }
}
