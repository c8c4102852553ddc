//! The protocol front ends a node process serves on TCP (`[frontends]`, issue 12): a listener
//! per protocol (memcached, Redis) whose connections are served by `[frontends] threads` event
//! loops (`evloop`), at most `max_connections` connections at once per protocol (more, and any
//! the process has no file descriptor for, are refused with the protocol's own error line),
//! each served with the node's pool of front-end client workers ([`crate::pool`]; sessions from
//! `nessie_frontend::memcached::serve` and `nessie_frontend::redis::serve`).

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nessie_frontend::item;
use nessie_frontend::memcached::proto::MAX_KEY_LEN;
use nessie_frontend::memcached::serve::{self as mc_serve, Limits};
use nessie_frontend::redis::serve::{self as resp_serve, RespLimits};
use nessie_frontend::serve::{unix_now, Backend, Counters};
use nessie_frontend::session::Session;
use nessie_store::Geometry;

use crate::evloop::{LoopHandle, MakeSession};

/// How often an accept loop looks at its stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(100);

/// The limits of a memcached front end on a cluster of geometry `g` whose store takes values
/// of up to `item_max` bytes (`[cache] item_max` in the client-driven mode, `value_max` in the
/// others): memcached's key limit or the cluster's, whichever is smaller; values up to
/// `item_max` less the item header.
pub fn limits(g: &Geometry, item_max: u64) -> Limits {
    Limits {
        max_key: MAX_KEY_LEN.min(g.key_max as usize),
        max_data: (item_max as usize).saturating_sub(item::HEADER_LEN),
    }
}

/// Most event loops one front end runs.
pub const MAX_LOOPS: u16 = 64;

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
    /// memcached on `addr`, served by `loops` event loops, for items up to `item_max` bytes.
    pub fn memcached(
        addr: SocketAddr,
        backend: Arc<dyn Backend>,
        g: &Geometry,
        item_max: u64,
        max_connections: u32,
        loops: u16,
    ) -> std::io::Result<Self> {
        let l = limits(g, item_max);
        let make: Arc<MakeSession> =
            Arc::new(move |b, c, _| Box::new(mc_serve::session(b, l, c)) as Box<dyn Session + '_>);
        let refusal = b"SERVER_ERROR Too many open connections\r\n";
        let how = Serving {
            backend,
            make,
            refusal,
            max_connections,
            loops,
        };
        Self::start("memcached", addr, how)
    }

    /// The Redis protocol on `addr`, served by `loops` event loops; with a `password`,
    /// clients must `AUTH` first.
    pub fn resp(
        addr: SocketAddr,
        backend: Arc<dyn Backend>,
        g: &Geometry,
        item_max: u64,
        max_connections: u32,
        loops: u16,
        password: Option<String>,
    ) -> std::io::Result<Self> {
        let l = RespLimits {
            max_key: g.key_max as usize,
            max_value: (item_max as usize).saturating_sub(item::HEADER_LEN),
        };
        let password: Option<Arc<[u8]>> = password.map(|p| p.into_bytes().into());
        let make: Arc<MakeSession> = Arc::new(move |b, c, id| {
            Box::new(resp_serve::session(b, l, c, id, password.clone())) as Box<dyn Session + '_>
        });
        let refusal = b"-ERR max number of clients reached\r\n";
        let how = Serving {
            backend,
            make,
            refusal,
            max_connections,
            loops,
        };
        Self::start("resp", addr, how)
    }

    fn start(name: &'static str, addr: SocketAddr, how: Serving) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let counters = Arc::new(Counters::default());
        counters.started.store(unix_now(), Ordering::Relaxed);
        let loops = (0..how.loops.clamp(1, MAX_LOOPS))
            .map(|_| {
                LoopHandle::start(
                    name,
                    how.backend.clone(),
                    counters.clone(),
                    how.make.clone(),
                    stop.clone(),
                )
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let l = Listener {
            name,
            loops,
            refusal: how.refusal,
            max_connections: how.max_connections,
            counters: counters.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("nessie-{name}"))
            .spawn(move || {
                let mut l = l;
                l.accept_loop(&listener, &stop2)
            })?;
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

/// How a front end serves its connections.
struct Serving {
    backend: Arc<dyn Backend>,
    make: Arc<MakeSession>,
    /// The line a connection over the limit gets before it is closed.
    refusal: &'static [u8],
    max_connections: u32,
    /// Event loops (threads) serving the connections.
    loops: u16,
}

/// What an accept loop needs.
struct Listener {
    name: &'static str,
    loops: Vec<LoopHandle>,
    /// The line a connection over the limit gets before it is closed.
    refusal: &'static [u8],
    max_connections: u32,
    counters: Arc<Counters>,
}

impl Listener {
    fn accept_loop(&mut self, listener: &TcpListener, stop: &AtomicBool) {
        use std::os::fd::AsRawFd;
        let mut shedder = crate::accept::Shedder::new(self.name);
        while !stop.load(Ordering::SeqCst) {
            crate::accept::wait_readable(listener.as_raw_fd(), ACCEPT_POLL);
            match listener.accept() {
                Ok((s, _)) => self.connection(s),
                Err(e) => shedder.failed(&e, || listener.accept(), |(s, _)| self.refuse(s)),
            }
        }
        for l in &mut self.loops {
            l.join();
        }
    }

    /// Give a connection there is no room for the protocol's refusal, and close it.
    fn refuse(&self, mut s: TcpStream) {
        let _ = s.set_nonblocking(false);
        let _ = s.write_all(self.refusal);
    }

    /// Hand one accepted connection to an event loop, round robin, if there is room for it.
    fn connection(&self, s: TcpStream) {
        let counters = &self.counters;
        let active = counters.curr_connections.fetch_add(1, Ordering::SeqCst);
        if active >= self.max_connections as u64 {
            counters.curr_connections.fetch_sub(1, Ordering::SeqCst);
            self.refuse(s);
            return;
        }
        let id = counters.total_connections.fetch_add(1, Ordering::Relaxed) + 1;
        let l = &self.loops[(id % self.loops.len() as u64) as usize];
        if let Err(e) = l.give(s, id) {
            counters.curr_connections.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(%e, front_end = self.name, "could not hand a connection to a loop");
        }
    }
}
