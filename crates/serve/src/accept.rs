//! Accepting connections when the process is out of file descriptors, and the descriptor
//! limit the front ends need.
//!
//! A listener whose backlog holds a connection stays readable. When `accept` fails with
//! `EMFILE` (or `ENFILE`) the connection stays in the backlog, so a loop that polls and retries
//! spins at full speed and the client waits for ever. Each accept loop keeps one spare
//! descriptor instead: on `EMFILE` it closes the spare, accepts the waiting connection, gives it
//! the protocol's refusal, closes it and takes the spare again (the approach of libev's and
//! nginx's users). What cannot be accepted even so is waited out with a short pause.

use std::fs::File;
use std::io;
use std::time::{Duration, Instant};

/// How long an accept loop pauses after an error it cannot shed (no spare, or another
/// thread took the freed descriptor): long enough not to spin, short enough not to be noticed.
pub(crate) const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// At most one warning about refused connections per listener per this period.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// A listener's spare descriptor and its warning clock.
pub struct Shedder {
    what: &'static str,
    spare: Option<File>,
    last_warning: Option<Instant>,
    /// Connections refused for want of descriptors since the last warning.
    shed: u64,
}

impl Shedder {
    /// `what`: the listener, for the log.
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            spare: File::open("/dev/null").ok(),
            last_warning: None,
            shed: 0,
        }
    }

    /// Deal with `err` from `accept`. Out of descriptors: accept the connection waiting with the
    /// spare's descriptor (`accept_one`), hand it to `refuse` (which answers and drops it) and
    /// take the spare again. Transient errors (a connection reset before it was accepted, a
    /// signal, nothing to accept): nothing. Anything else, or no spare: pause, so the loop does
    /// not spin on a listener that stays readable.
    pub fn failed<S>(
        &mut self,
        err: &io::Error,
        accept_one: impl FnOnce() -> io::Result<S>,
        refuse: impl FnOnce(S),
    ) {
        use io::ErrorKind::*;
        if matches!(
            err.kind(),
            WouldBlock | Interrupted | ConnectionAborted | ConnectionReset
        ) {
            return;
        }
        let out_of_fds = matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
        let mut shed = false;
        if out_of_fds && self.spare.take().is_some() {
            if let Ok(s) = accept_one() {
                refuse(s);
                shed = true;
            }
            self.spare = File::open("/dev/null").ok();
        }
        if shed {
            self.shed += 1;
        }
        let due = self.last_warning.is_none_or(|t| t.elapsed() >= WARN_EVERY);
        if due {
            match out_of_fds {
                true => tracing::warn!(
                    listener = self.what,
                    refused = self.shed,
                    "out of file descriptors: connections refused (raise `ulimit -n` or lower \
                     [frontends] max_connections)"
                ),
                false => tracing::warn!(listener = self.what, %err, "accept failed"),
            }
            self.last_warning = Some(Instant::now());
            self.shed = 0;
        }
        if !shed {
            std::thread::sleep(ACCEPT_ERROR_PAUSE);
        }
    }
}

/// Raise this process's soft limit on open files to its hard limit (as memcached does at
/// start): front ends hold a descriptor per connection. Returns the soft limit now in force
/// (`None` if it could not be read).
pub fn raise_fd_limit() -> Option<u64> {
    let mut l = open_file_limit()?;
    if l.rlim_cur < l.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: l.rlim_max,
            rlim_max: l.rlim_max,
        };
        // SAFETY: a valid rlimit; raising the soft limit up to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            l.rlim_cur = l.rlim_max;
        }
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is u64 on Linux, not everywhere
    Some(l.rlim_cur as u64)
}

/// This process's limit on open files (soft and hard).
fn open_file_limit() -> Option<libc::rlimit> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid rlimit to write.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } == 0).then_some(l)
}

/// Wait until `fd` is readable (a connection to accept), for at most `timeout`.
pub fn wait_readable(fd: std::os::fd::RawFd, timeout: Duration) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, timeout.as_millis() as libc::c_int) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// Out of descriptors, a waiting connection is accepted with the spare one, refused, and
    /// the spare taken back; the loop neither spins nor leaves the client waiting.
    #[test]
    fn out_of_descriptors_a_waiting_connection_is_refused_not_left_waiting() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let mut s = Shedder::new("test");
        assert!(s.spare.is_some());
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        let t = Instant::now();
        s.failed(
            &emfile,
            || listener.accept().map(|(c, _)| c),
            |mut c: TcpStream| {
                let _ = c.write_all(b"REFUSED\r\n");
            },
        );
        assert!(
            t.elapsed() < ACCEPT_ERROR_PAUSE,
            "a shed connection needs no pause"
        );
        assert!(s.spare.is_some(), "the spare is taken back");
        assert_eq!(s.shed, 0, "counted, then reported with the first warning");
        let mut got = String::new();
        client.read_to_string(&mut got).unwrap();
        assert_eq!(got, "REFUSED\r\n");
    }

    /// An error that cannot be shed pauses the loop; a transient one does not.
    #[test]
    fn errors_that_cannot_be_shed_pause_the_loop() {
        let mut s = Shedder::new("test");
        let t = Instant::now();
        let other = io::Error::from_raw_os_error(libc::ENOBUFS);
        s.failed(
            &other,
            || Err::<(), _>(nothing_to_accept()),
            |_| unreachable!(),
        );
        assert!(t.elapsed() >= ACCEPT_ERROR_PAUSE);
        let t = Instant::now();
        let wb = io::Error::from(io::ErrorKind::WouldBlock);
        s.failed(
            &wb,
            || Err::<(), _>(nothing_to_accept()),
            |_| unreachable!(),
        );
        assert!(t.elapsed() < ACCEPT_ERROR_PAUSE);
        // Out of descriptors with nothing left to accept: a pause too.
        let t = Instant::now();
        let emfile = io::Error::from_raw_os_error(libc::EMFILE);
        s.failed(
            &emfile,
            || Err::<(), _>(nothing_to_accept()),
            |_| unreachable!(),
        );
        assert!(t.elapsed() >= ACCEPT_ERROR_PAUSE);
        assert!(s.spare.is_some());
    }

    /// What `accept` answers when no connection waits.
    fn nothing_to_accept() -> io::Error {
        io::Error::from(io::ErrorKind::WouldBlock)
    }

    #[test]
    fn the_soft_fd_limit_is_raised_to_the_hard_one() {
        let soft = raise_fd_limit().expect("getrlimit");
        let l = open_file_limit().expect("getrlimit");
        #[allow(clippy::unnecessary_cast)]
        let cur = l.rlim_cur as u64;
        assert_eq!(soft, cur);
        assert_eq!(l.rlim_cur, l.rlim_max);
    }
}
