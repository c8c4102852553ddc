//! The front ends' event loops: a few threads, each serving many connections with `mio`
//! (epoll), instead of a thread per connection. A request costs a wake-up of the loop that
//! owns its connection, and a loop that finds several connections ready serves them all in
//! one turn, as Redis's and memcached's loops do; a thread per connection paid a context
//! switch per request (40% of a node's time under `redis-benchmark`, `perf`).
//!
//! Each loop drives its connections' [`Session`]s: read what has arrived (up to a chunk at a time),
//! serve every whole request, write the replies without blocking, and keep what the socket
//! would not take. A connection with more than [`MAX_PENDING_OUT`] bytes of replies waiting is
//! not read from until the client has taken them, so a client that sends and never reads
//! holds a bounded amount of memory.
//!
//! There are as many loops as the node has front-end workers (`[[node]] workers`): a store
//! operation runs on its loop's thread, so that many may run at once, as before.

use std::io::{ErrorKind, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

use mio::net::TcpStream as MioStream;
use mio::{Events, Interest, Poll, Token, Waker};
use nessie_frontend::mc_serve::{Backend, Counters, FLUSH_AT};
use nessie_frontend::session::Session;

/// Most bytes read from a socket at a time (then served before the next read).
const READ_CHUNK: usize = 64 * 1024;
/// Room a connection's input buffer has before each read: what an idle connection holds.
const READ_MIN: usize = 16 * 1024;
/// Replies waiting for a slow client beyond which its connection is not read from.
pub const MAX_PENDING_OUT: usize = FLUSH_AT;
/// Events handled per poll.
const EVENTS: usize = 256;
/// How often a loop looks at its stop flag while idle.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// The token of a loop's waker (connections have tokens from 1).
const WAKE: Token = Token(0);

/// Makes one connection's session, borrowing the loop's backend and counters.
pub type MakeSession =
    dyn for<'a> Fn(&'a dyn Backend, &'a Counters, u64) -> Box<dyn Session + 'a> + Send + Sync;

/// A connection handed to a loop: its socket and its id.
type Handoff = (TcpStream, u64);

/// The sending side of one event loop.
pub struct LoopHandle {
    tx: Sender<Handoff>,
    waker: Arc<Waker>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LoopHandle {
    /// Start a loop serving the connections it is given with sessions `make` makes.
    pub fn start(
        name: &'static str,
        backend: Arc<dyn Backend>,
        counters: Arc<Counters>,
        make: Arc<MakeSession>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<Self> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let (tx, rx) = channel();
        let thread = std::thread::Builder::new()
            .name(format!("nessie-{name}-loop"))
            .spawn(move || {
                let mut l = EventLoop {
                    poll,
                    rx,
                    conns: Vec::new(),
                    backend: backend.as_ref(),
                    counters: counters.as_ref(),
                    make: make.as_ref(),
                };
                if let Err(e) = l.run(&stop) {
                    tracing::error!(%e, front_end = name, "event loop stopped");
                }
            })?;
        Ok(Self {
            tx,
            waker,
            thread: Some(thread),
        })
    }

    /// Hand `stream` (connection `id`) to the loop.
    pub fn give(&self, stream: TcpStream, id: u64) -> std::io::Result<()> {
        self.tx
            .send((stream, id))
            .map_err(|_| std::io::Error::other("the event loop has stopped"))?;
        self.waker.wake()
    }

    /// Wait for the loop to end (its stop flag must be set).
    pub fn join(&mut self) {
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection of a loop.
struct Conn<'a> {
    stream: MioStream,
    session: Box<dyn Session + 'a>,
    /// Replies not yet written, from `sent`.
    pending: Vec<u8>,
    sent: usize,
    /// The session asked to close once its replies are out.
    closing: bool,
    /// What the connection is registered for: changed only when it must be (an `epoll_ctl`
    /// per request batch was a measurable share of a pipelining loop's time).
    interest: Interest,
}

/// What to do with a connection after handling an event.
#[derive(PartialEq, Eq)]
enum After {
    Keep,
    Drop,
}

struct EventLoop<'a> {
    poll: Poll,
    rx: Receiver<Handoff>,
    conns: Vec<Option<Conn<'a>>>,
    backend: &'a dyn Backend,
    counters: &'a Counters,
    make: &'a MakeSession,
}

impl<'a> EventLoop<'a> {
    fn run(&mut self, stop: &AtomicBool) -> std::io::Result<()> {
        let mut events = Events::with_capacity(EVENTS);
        while !stop.load(Ordering::SeqCst) {
            match self.poll.poll(&mut events, Some(IDLE_POLL)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            for ev in events.iter() {
                if ev.token() == WAKE {
                    self.accept_handoffs();
                    continue;
                }
                let i = ev.token().0 - 1;
                if self.handle(i, ev.is_read_closed()) == After::Drop {
                    self.close(i);
                }
            }
        }
        for i in 0..self.conns.len() {
            if self.conns[i].is_some() {
                self.close(i);
            }
        }
        Ok(())
    }

    /// Register the connections the acceptor handed over.
    fn accept_handoffs(&mut self) {
        while let Ok((stream, id)) = self.rx.try_recv() {
            if let Err(e) = self.add(stream, id) {
                tracing::debug!(%e, "could not serve a connection");
                self.counters
                    .curr_connections
                    .fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    fn add(&mut self, stream: TcpStream, id: u64) -> std::io::Result<()> {
        stream.set_nonblocking(true)?;
        let _ = stream.set_nodelay(true);
        let mut stream = MioStream::from_std(stream);
        let i = match self.conns.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.conns.push(None);
                self.conns.len() - 1
            }
        };
        self.poll
            .registry()
            .register(&mut stream, Token(i + 1), Interest::READABLE)?;
        self.conns[i] = Some(Conn {
            stream,
            session: (self.make)(self.backend, self.counters, id),
            pending: Vec::new(),
            sent: 0,
            closing: false,
            interest: Interest::READABLE,
        });
        Ok(())
    }

    fn close(&mut self, i: usize) {
        if let Some(mut c) = self.conns[i].take() {
            let _ = self.poll.registry().deregister(&mut c.stream);
            self.counters
                .curr_connections
                .fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Serve what connection `i` has to read and write.
    /// `read_closed`: the event says the peer shut its sending side down (its end of file is
    /// then read even after a short read).
    fn handle(&mut self, i: usize, read_closed: bool) -> After {
        let Some(c) = self.conns[i].as_mut() else {
            return After::Keep; // closed earlier in this turn
        };
        let r = (|| {
            flush(c)?;
            let mut emptied = false;
            if !c.closing && c.pending.len() <= MAX_PENDING_OUT {
                emptied = read_and_serve(c, read_closed)?;
                flush(c)?;
            }
            Ok::<bool, std::io::Error>(emptied)
        })();
        match r {
            Ok(_) if c.closing && c.pending.is_empty() => After::Drop,
            Ok(emptied) => {
                // Not readable while replies pile up or the connection is closing: the
                // socket would keep signalling input we will not read, and the loop spin.
                let interest = if c.pending.is_empty() {
                    Interest::READABLE
                } else if c.closing || c.pending.len() > MAX_PENDING_OUT {
                    Interest::WRITABLE
                } else {
                    Interest::READABLE | Interest::WRITABLE
                };
                // Unchanged, the registration stands when the input was read until the
                // socket was empty (more is a new edge) or only WRITABLE is wanted (a flush
                // met a full socket). Input left unread needs the re-arm of `reregister`.
                if interest == c.interest && (emptied || interest == Interest::WRITABLE) {
                    return After::Keep;
                }
                c.interest = interest;
                match self
                    .poll
                    .registry()
                    .reregister(&mut c.stream, Token(i + 1), interest)
                {
                    Ok(()) => After::Keep,
                    Err(_) => After::Drop,
                }
            }
            Err(_) => After::Drop,
        }
    }
}

/// Read until the socket is empty, serving each chunk as it comes; whether it was emptied.
/// Reading stops early while too many replies wait: data may then be left in the socket,
/// which will not signal it again, so every later event of the connection (its replies going
/// out) reads again.
fn read_and_serve(c: &mut Conn<'_>, read_closed: bool) -> std::io::Result<bool> {
    loop {
        if c.pending.len() > MAX_PENDING_OUT {
            return Ok(false);
        }
        let (n, asked) = match read_into(&c.stream, c.session.inbuf()) {
            // The client is done sending (it may still read: `printf … | nc` shuts its side
            // down after the requests): close once the replies are out.
            Ok((0, _)) => {
                c.closing = true;
                return Ok(true);
            }
            Ok(r) => r,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        // Replies written early by the session go after those already waiting.
        let close = c.session.serve_buffered(&mut c.pending)?;
        if c.pending.is_empty() {
            // Nothing waiting (the common case): take the replies' buffer rather than copy
            // it, and leave ours, empty, for the next ones.
            std::mem::swap(&mut c.pending, c.session.out());
        } else {
            c.pending.append(c.session.out());
        }
        if close {
            c.closing = true;
            return Ok(true);
        }
        // A short read of a stream socket emptied it (epoll(7)): more input is a new edge.
        // Spares the read that would only answer "would block", one per request batch. An end
        // of file that came with the input raised no edge of its own: read on to it.
        if n < asked && !read_closed {
            return Ok(true);
        }
    }
}

/// Read from `stream` onto the end of `buf`, straight into its spare room (at least
/// [`READ_MIN`] bytes of it, at most [`READ_CHUNK`]): reading into a chunk and then appending it
/// copied every request's bytes once more (6% of a node serving pipelined 16 KiB SETs, `perf`).
/// Returns the bytes read and the bytes asked for.
fn read_into(stream: &MioStream, buf: &mut Vec<u8>) -> std::io::Result<(usize, usize)> {
    use std::os::fd::AsRawFd;
    buf.reserve(READ_MIN);
    let spare = buf.spare_capacity_mut();
    let asked = spare.len().min(READ_CHUNK);
    // SAFETY: `recv` writes at most `asked` bytes, all inside the spare room the vector owns,
    // and returns how many it wrote; only those become part of the vector, so no uninitialised
    // byte is ever exposed.
    let r = unsafe { libc::recv(stream.as_raw_fd(), spare.as_mut_ptr().cast(), asked, 0) };
    let n = usize::try_from(r).map_err(|_| std::io::Error::last_os_error())?;
    // SAFETY: the `n` bytes after the old length were just written by `recv`.
    unsafe { buf.set_len(buf.len() + n) };
    Ok((n, asked))
}

/// Write what the socket takes of the waiting replies.
fn flush(c: &mut Conn<'_>) -> std::io::Result<()> {
    while c.sent < c.pending.len() {
        match c.stream.write(&c.pending[c.sent..]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => c.sent += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    if c.sent == c.pending.len() {
        c.pending.clear();
        c.sent = 0;
    } else if c.sent > MAX_PENDING_OUT {
        c.pending.drain(..c.sent);
        c.sent = 0;
    }
    Ok(())
}
