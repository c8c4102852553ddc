//! The protocol front ends a node process serves on TCP (`[frontends]`, issue 12): a listener
//! per protocol (memcached, Redis), a thread per connection, at most `max_connections`
//! connections at once per protocol (more are refused with the protocol's own error line),
//! each served with the node's pool of front-end client workers (`nessie_frontend::mc_serve`,
//! `resp_serve`).

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nessie_frontend::item;
use nessie_frontend::mc_serve::{self, Backend, Counters, Limits};
use nessie_frontend::memcache::MAX_KEY_LEN;
use nessie_frontend::resp_serve::{self, RespLimits};
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

/// The limits of a memcached front end on a cluster of geometry `g`: memcached's key limit or
/// the cluster's, whichever is smaller; values up to the cluster's limit less the item header.
pub fn limits(g: &Geometry) -> Limits {
    Limits {
        max_key: MAX_KEY_LEN.min(g.key_max as usize),
        max_data: (g.value_max as usize).saturating_sub(item::HEADER_LEN),
    }
}

/// One connection's server: serves the stream with the front end's counters and the
/// connection's id.
type ServeFn = dyn Fn(&mut TcpStream, &Counters, u64) -> std::io::Result<()> + Send + Sync;

/// A protocol listener; stops accepting when dropped (connections being served end when
/// their clients close them, or with the process).
pub struct FrontEnd {
    name: &'static str,
    addr: SocketAddr,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FrontEnd {
    /// memcached on `addr`.
    pub fn memcached(
        addr: SocketAddr,
        backend: Arc<dyn Backend>,
        g: &Geometry,
        max_connections: u32,
    ) -> std::io::Result<Self> {
        let l = limits(g);
        let serve: Arc<ServeFn> =
            Arc::new(move |s, c, _| mc_serve::serve(s, backend.as_ref(), l, c));
        let refusal = b"SERVER_ERROR Too many open connections\r\n";
        Self::start("memcached", addr, serve, refusal, max_connections)
    }

    /// The Redis protocol on `addr`; with a `password`, clients must `AUTH` first.
    pub fn resp(
        addr: SocketAddr,
        backend: Arc<dyn Backend>,
        g: &Geometry,
        max_connections: u32,
        password: Option<String>,
    ) -> std::io::Result<Self> {
        let l = RespLimits {
            max_key: g.key_max as usize,
            max_value: (g.value_max as usize).saturating_sub(item::HEADER_LEN),
        };
        let serve: Arc<ServeFn> = Arc::new(move |s, c, id| {
            let password = password.as_deref().map(str::as_bytes);
            resp_serve::serve_with_password(s, backend.as_ref(), l, c, id, password)
        });
        let refusal = b"-ERR max number of clients reached\r\n";
        Self::start("resp", addr, serve, refusal, max_connections)
    }

    fn start(
        name: &'static str,
        addr: SocketAddr,
        serve: Arc<ServeFn>,
        refusal: &'static [u8],
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
        let l = Listener {
            name,
            serve,
            refusal,
            max_connections,
            counters: counters.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("nessie-{name}"))
            .spawn(move || l.accept_loop(&listener, &stop2))?;
        Ok(Self {
            name,
            addr,
            counters,
            stop,
            thread: Some(thread),
        })
    }

    /// Its connection and command counters.
    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// The protocol: `memcached` or `resp`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for FrontEnd {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What an accept loop needs.
struct Listener {
    name: &'static str,
    serve: Arc<ServeFn>,
    /// The line a connection over the limit gets before it is closed.
    refusal: &'static [u8],
    max_connections: u32,
    counters: Arc<Counters>,
}

impl Listener {
    fn accept_loop(&self, listener: &TcpListener, stop: &AtomicBool) {
        use std::os::fd::AsRawFd;
        while !stop.load(Ordering::SeqCst) {
            crate::admin::wait_readable(listener.as_raw_fd(), ACCEPT_POLL);
            let Ok((s, _)) = listener.accept() else {
                continue;
            };
            self.connection(s);
        }
    }

    /// Serve one accepted connection on a thread of its own, if there is room for it.
    fn connection(&self, mut s: TcpStream) {
        if s.set_nonblocking(false).is_err() {
            return;
        }
        let _ = s.set_nodelay(true);
        let counters = &self.counters;
        let active = counters.curr_connections.fetch_add(1, Ordering::SeqCst);
        if active >= self.max_connections as u64 {
            counters.curr_connections.fetch_sub(1, Ordering::SeqCst);
            let _ = s.write_all(self.refusal);
            return;
        }
        let id = counters.total_connections.fetch_add(1, Ordering::Relaxed) + 1;
        let (serve, c, name) = (self.serve.clone(), counters.clone(), self.name);
        let spawned = std::thread::Builder::new()
            .name(format!("nessie-{name}-conn"))
            .spawn(move || {
                if let Err(e) = serve(&mut s, &c, id) {
                    tracing::debug!(%e, front_end = name, "connection ended");
                }
                c.curr_connections.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            counters.curr_connections.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(%e, front_end = name, "could not start a thread for a connection");
        }
    }
}
