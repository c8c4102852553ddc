//! The protocol front ends a node process serves on TCP (`[frontends]`, issue 12): a listener
//! per protocol, a thread per connection, at most `max_connections` connections at once (more
//! are refused with the protocol's own error line), each served with the node's pool of client
//! workers (`nessie_frontend::mc_serve`).

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nessie_frontend::item;
use nessie_frontend::mc_serve::{self, Backend, Counters, Limits};
use nessie_frontend::memcache::MAX_KEY_LEN;
use nessie_protocols::KvClient;
use nessie_store::Geometry;

use crate::admin::ClientPool;

/// How often an accept loop looks at its stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

impl Backend for ClientPool {
    fn with_client(&self, f: &mut dyn FnMut(&mut dyn KvClient)) {
        self.with(|c| f(c))
    }
}

/// The limits of a front end on a cluster of geometry `g`: memcached's key limit or the
/// cluster's, whichever is smaller; values up to the cluster's limit less the item header.
pub fn limits(g: &Geometry) -> Limits {
    Limits {
        max_key: MAX_KEY_LEN.min(g.key_max as usize),
        max_data: (g.value_max as usize).saturating_sub(item::HEADER_LEN),
    }
}

/// A memcached listener; stops accepting when dropped (connections being served end when their
/// clients close them, or with the process).
pub struct MemcachedServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MemcachedServer {
    pub fn start(
        addr: SocketAddr,
        backend: Arc<dyn Backend>,
        limits: Limits,
        max_connections: u32,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let counters = Arc::new(Counters::default());
        counters
            .started
            .store(mc_serve::unix_now(), Ordering::Relaxed);
        let thread = std::thread::Builder::new()
            .name("nessie-memcached".into())
            .spawn(move || {
                accept_loop(
                    &listener,
                    &backend,
                    limits,
                    max_connections,
                    &counters,
                    &stop2,
                )
            })?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MemcachedServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    backend: &Arc<dyn Backend>,
    limits: Limits,
    max_connections: u32,
    counters: &Arc<Counters>,
    stop: &AtomicBool,
) {
    use std::os::fd::AsRawFd;
    while !stop.load(Ordering::SeqCst) {
        let mut p = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, ACCEPT_POLL.as_millis() as libc::c_int) };
        let Ok((mut s, _)) = listener.accept() else {
            continue;
        };
        if s.set_nonblocking(false).is_err() {
            continue;
        }
        let _ = s.set_nodelay(true);
        let active = counters.curr_connections.fetch_add(1, Ordering::SeqCst);
        if active >= max_connections as u64 {
            counters.curr_connections.fetch_sub(1, Ordering::SeqCst);
            let _ = s.write_all(b"SERVER_ERROR Too many open connections\r\n");
            continue;
        }
        counters.total_connections.fetch_add(1, Ordering::Relaxed);
        let (b, c) = (backend.clone(), counters.clone());
        let spawned = std::thread::Builder::new()
            .name("nessie-mc-conn".into())
            .spawn(move || {
                if let Err(e) = mc_serve::serve(&mut s, b.as_ref(), limits, &c) {
                    tracing::debug!(%e, "memcached connection ended");
                }
                c.curr_connections.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            counters.curr_connections.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(%e, "could not start a thread for a memcached connection");
        }
    }
}
