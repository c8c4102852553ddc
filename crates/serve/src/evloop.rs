//! The front ends' event loops: a few threads, each serving many connections with `mio`
//! (epoll), instead of a thread per connection. A request costs a wake-up of the loop that
//! owns its connection, and a loop that finds several connections ready serves them all in
//! one turn, as Redis's and memcached's loops do; a thread per connection paid a context
//! switch per request (40% of a node's time under `redis-benchmark`, `perf`).
//!
//! Each loop drives its connections' [`Session`]s: read what has arrived (up to a chunk at a time),
//! serve every whole request, write the replies without blocking, and keep what the socket
//! would not take. A connection is read one chunk per turn: its first chunk's replies go out at
//! once, and input left beyond it (a batch of large requests) is served a chunk at a time, the
//! connections in turn, with new events looked for between rounds, its replies written once it
//! is read out. So a batch's first answers do not wait for the whole batch, nor a client's
//! batch behind another's; Redis reads 16 KiB per client per turn for the same reason. A
//! connection with more than [`MAX_PENDING_OUT`] bytes of replies waiting is
//! not read from until the client has taken them, so a client that sends and never reads
//! holds a bounded amount of memory. When several connections are ready in one turn, each gets
//! at most `WRITE_SHARE` bytes of its replies written before the loop serves the next, and the
//! rest after all of them: a client pipelining large GETs sees the start of its replies while
//! the others' batches are served, not after their whole replies were written.
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
use nessie_frontend::serve::{Backend, Counters, FLUSH_AT};
use nessie_frontend::session::{Served, Session};

/// Most bytes read from a socket at a time (then served before the next read).
const READ_CHUNK: usize = 64 * 1024;
/// Room a connection's input buffer has before each read: what an idle connection holds.
const READ_MIN: usize = 16 * 1024;
/// Replies waiting for a slow client beyond which its connection is not read from.
pub const MAX_PENDING_OUT: usize = FLUSH_AT;
/// Most bytes of replies written to one connection before the loop turns to the other
/// connections ready in the same turn (the rest follows after them).
const WRITE_SHARE: usize = 64 * 1024;
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
                    backlog: Vec::new(),
                    more: Vec::new(),
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
    /// It is on the loop's list of connections with input left (`EventLoop::more`).
    more: bool,
    /// Its session holds requests it has read and not served: their replies reached the
    /// session's limit ([`Served::Held`]). They are served once the replies waiting are written.
    held: bool,
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
    /// Connections whose replies were written only up to their share in this turn, and
    /// whether their input was read until the socket was empty.
    backlog: Vec<(usize, bool)>,
    /// Connections with input left after the chunk served in this turn (and whether their
    /// peer shut its side down): served a chunk at a time, in turn ([`Self::serve_round`]).
    more: Vec<(usize, bool)>,
}

/// How far [`read_and_serve`] got.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Input {
    /// The socket was read until it was empty (or the peer closed).
    Emptied,
    /// It read a full chunk: more input may wait.
    More,
    /// It stopped because too many replies wait: input may be left that no new edge signals.
    Held,
}

impl<'a> EventLoop<'a> {
    fn run(&mut self, stop: &AtomicBool) -> std::io::Result<()> {
        let mut events = Events::with_capacity(EVENTS);
        while !stop.load(Ordering::SeqCst) {
            // With input left to serve, only look for new events between rounds.
            let wait = if self.more.is_empty() {
                IDLE_POLL
            } else {
                Duration::ZERO
            };
            match self.poll.poll(&mut events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            let ready = events.iter().filter(|ev| ev.token() != WAKE).count();
            // With one connection ready there is nobody to take turns with.
            let share = if ready > 1 { WRITE_SHARE } else { usize::MAX };
            for ev in events.iter() {
                if ev.token() == WAKE {
                    self.accept_handoffs();
                    continue;
                }
                let i = ev.token().0 - 1;
                if self.handle(i, ev.is_read_closed(), share) == After::Drop {
                    self.close(i);
                }
            }
            self.serve_round(share);
            self.write_backlog();
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
            more: false,
            held: false,
        });
        Ok(())
    }

    fn close(&mut self, i: usize) {
        // Its slot may be given to a new connection before the next round.
        self.more.retain(|&(j, _)| j != i);
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
    /// `share`: at most this many bytes of replies are written now; the rest waits in
    /// `pending`, and the connection goes on the backlog ([`Self::write_backlog`]).
    fn handle(&mut self, i: usize, read_closed: bool, share: usize) -> After {
        let Some(c) = self.conns[i].as_mut() else {
            return After::Keep; // closed earlier in this turn
        };
        if c.more {
            return After::Keep; // it is served in the round, read until empty
        }
        let r = (|| {
            flush(c, usize::MAX)?;
            let mut input = Input::Held;
            let mut held = false;
            if !c.closing && c.pending.len() <= MAX_PENDING_OUT {
                // One chunk now, and its replies out at once: a client pipelining large
                // requests has its first answers while the rest of its batch is served.
                input = read_and_serve(c, read_closed)?;
                held = flush(c, share)?;
            }
            Ok::<(Input, bool), std::io::Error>((input, held))
        })();
        match r {
            Ok((Input::More, _)) => {
                c.more = true;
                self.more.push((i, read_closed));
                After::Keep
            }
            Ok((input, true)) => {
                self.backlog.push((i, input == Input::Emptied));
                After::Keep
            }
            Ok((input, false)) => self.settle(i, input == Input::Emptied),
            Err(_) => After::Drop,
        }
    }

    /// One round over the connections that had more input than the chunk [`Self::handle`]
    /// served: a chunk each, so that none waits behind another's whole batch, and a client
    /// whose new batch arrives meanwhile is answered from the next turn's events on, not after
    /// every batch before it. A connection read out has its replies written (up to `share`,
    /// the rest in the backlog); the others stay for the next round.
    fn serve_round(&mut self, share: usize) {
        #[cfg(test)]
        tests::ROUND_CHUNKS.fetch_add(self.more.len() as u64, Ordering::Relaxed);
        for (i, read_closed) in std::mem::take(&mut self.more) {
            let Some(c) = self.conns[i].as_mut() else {
                continue;
            };
            let after = match read_and_serve(c, read_closed) {
                Ok(Input::More) => {
                    self.more.push((i, read_closed));
                    continue;
                }
                Ok(input) => {
                    c.more = false;
                    match flush(c, share) {
                        Ok(true) => {
                            self.backlog.push((i, input == Input::Emptied));
                            After::Keep
                        }
                        Ok(false) => self.settle(i, input == Input::Emptied),
                        Err(_) => After::Drop,
                    }
                }
                Err(_) => After::Drop,
            };
            if after == After::Drop {
                self.close(i);
            }
        }
    }

    /// Write the rest of the replies held back by [`Self::handle`]'s share, once every
    /// connection ready in this turn got its first share: a loop serving several pipelining
    /// clients sends each the start of its replies before the bulk of any (as Redis does,
    /// `NET_MAX_WRITES_PER_EVENT`), so one with large replies does not hold the others up.
    fn write_backlog(&mut self) {
        #[cfg(test)]
        tests::BACKLOG_WRITES.fetch_add(self.backlog.len() as u64, Ordering::Relaxed);
        for (i, emptied) in std::mem::take(&mut self.backlog) {
            let Some(c) = self.conns[i].as_mut() else {
                continue;
            };
            let after = match flush(c, usize::MAX) {
                Ok(_) => self.settle(i, emptied),
                Err(_) => After::Drop,
            };
            if after == After::Drop {
                self.close(i);
            }
        }
    }

    /// After connection `i` was served and its replies written as far as the socket took
    /// them: close it, or register the interest its state calls for.
    /// `emptied`: its input was read until the socket had no more.
    fn settle(&mut self, i: usize, emptied: bool) -> After {
        let Some(c) = self.conns[i].as_mut() else {
            return After::Keep;
        };
        if c.closing && c.pending.is_empty() {
            return After::Drop;
        }
        // Requests read and held while replies waited, and the replies now written: serve
        // them in the next round (no event will come for input already read).
        if c.held && !c.closing && c.pending.len() <= MAX_PENDING_OUT {
            if !c.more {
                c.more = true;
                self.more.push((i, false));
            }
            return After::Keep;
        }
        // Not readable while replies pile up or the connection is closing: the socket would
        // keep signalling input we will not read, and the loop spin.
        let interest = if c.pending.is_empty() {
            Interest::READABLE
        } else if c.closing || c.pending.len() > MAX_PENDING_OUT {
            Interest::WRITABLE
        } else {
            Interest::READABLE | Interest::WRITABLE
        };
        // Unchanged, the registration stands when the input was read until the socket was
        // empty (more is a new edge) or only WRITABLE is wanted (a flush met a full socket).
        // Input left unread needs the re-arm of `reregister`.
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
}

/// Read one chunk (or find the socket empty) and serve it. Nothing is read while too many
/// replies wait: data may then be left in the socket, which will not signal it again, so
/// every later event of the connection (its replies going out) reads again. Requests the
/// session holds, read but not served (their replies reached its limit), are served first.
fn read_and_serve(c: &mut Conn<'_>, read_closed: bool) -> std::io::Result<Input> {
    if c.pending.len() > MAX_PENDING_OUT {
        return Ok(Input::Held);
    }
    if c.held {
        // The socket may hold more that no edge will signal: the next round reads it.
        return Ok(match serve(c) {
            Served::Held => Input::Held,
            Served::Close => Input::Emptied,
            Served::Read => Input::More,
        });
    }
    let (n, asked) = loop {
        match read_into(&c.stream, c.session.inbuf()) {
            // The client is done sending (it may still read: `printf … | nc` shuts its side
            // down after the requests): close once the replies are out.
            Ok((0, _)) => {
                c.closing = true;
                return Ok(Input::Emptied);
            }
            Ok(r) => break r,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(Input::Emptied),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
    match serve(c) {
        Served::Close => return Ok(Input::Emptied),
        Served::Held => return Ok(Input::Held),
        Served::Read => {}
    }
    // A short read of a stream socket emptied it (epoll(7)): more input is a new edge. Spares
    // the read that would only answer "would block", one per request batch. An end of file
    // that came with the input raised no edge of its own: read on to it.
    if n < asked && !read_closed {
        return Ok(Input::Emptied);
    }
    Ok(match c.pending.len() > MAX_PENDING_OUT {
        true => Input::Held,
        false => Input::More,
    })
}

/// Serve the requests the session has read, its replies joining those waiting.
fn serve(c: &mut Conn<'_>) -> Served {
    let served = c.session.serve_buffered();
    c.held = served == Served::Held;
    if c.pending.is_empty() {
        // Nothing waiting (the common case): take the replies' buffer rather than copy it,
        // and leave ours, empty, for the next ones.
        std::mem::swap(&mut c.pending, c.session.out());
    } else {
        c.pending.append(c.session.out());
    }
    if served == Served::Close {
        c.closing = true;
    }
    served
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

/// Write what the socket takes of the waiting replies, up to `share` bytes; true if replies
/// are left that the socket might have taken (the share ran out).
fn flush(c: &mut Conn<'_>, share: usize) -> std::io::Result<bool> {
    let start = c.sent;
    let mut held = false;
    while c.sent < c.pending.len() {
        let n = (c.pending.len() - c.sent).min(share.saturating_sub(c.sent - start));
        if n == 0 {
            held = true;
            break;
        }
        match c.stream.write(&c.pending[c.sent..c.sent + n]) {
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
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufReader, Read};
    use std::sync::atomic::AtomicU64;

    /// Replies written after the other ready connections' shares, over all loops in this test
    /// binary.
    pub(super) static BACKLOG_WRITES: AtomicU64 = AtomicU64::new(0);
    /// Chunks served in rounds (input left after a connection's first chunk of a turn), over
    /// all loops in this test binary.
    pub(super) static ROUND_CHUNKS: AtomicU64 = AtomicU64::new(0);

    /// The sessions below use no store.
    struct NoStore;
    impl Backend for NoStore {
        fn lease(&self) -> Box<dyn nessie_frontend::serve::Lease + '_> {
            unreachable!("the test sessions use no store")
        }
    }

    /// Each request is a line holding a number; its reply is [`REPLY`] bytes made from it.
    /// Serving stops once `cap` bytes of replies wait ([`Served::Held`]), as the protocol
    /// sessions stop at `FLUSH_AT`.
    struct Large {
        inbuf: Vec<u8>,
        out: Vec<u8>,
        cap: usize,
    }
    /// The most reply bytes a capped `Large` session held at once, over this test binary.
    static CAPPED_MOST: AtomicU64 = AtomicU64::new(0);

    fn large(cap: usize) -> Box<dyn Session + 'static> {
        Box::new(Large {
            inbuf: Vec::new(),
            out: Vec::new(),
            cap,
        })
    }
    const REPLY: usize = 40_000;

    fn reply(n: u32) -> Vec<u8> {
        (0..REPLY as u32)
            .map(|i| (n.wrapping_mul(31) ^ i) as u8)
            .collect()
    }

    impl Session for Large {
        fn inbuf(&mut self) -> &mut Vec<u8> {
            &mut self.inbuf
        }
        fn out(&mut self) -> &mut Vec<u8> {
            &mut self.out
        }
        fn serve_buffered(&mut self) -> Served {
            while let Some(end) = self.inbuf.iter().position(|&b| b == b'\n') {
                if self.out.len() >= self.cap {
                    return Served::Held;
                }
                let n: u32 = std::str::from_utf8(&self.inbuf[..end])
                    .unwrap()
                    .parse()
                    .unwrap();
                self.out.extend_from_slice(&reply(n));
                if self.cap < usize::MAX {
                    CAPPED_MOST.fetch_max(self.out.len() as u64, Ordering::Relaxed);
                }
                self.inbuf.drain(..=end);
            }
            Served::Read
        }
    }

    /// Start one loop serving sessions `make` makes, connect `clients` clients to it, run
    /// `client(c, stream)` for each in a thread of its own, wait for all of them and stop the
    /// loop.
    fn serve_clients(make: Arc<MakeSession>, clients: u32, client: fn(u32, TcpStream)) {
        let stop = Arc::new(AtomicBool::new(false));
        let mut lp = LoopHandle::start(
            "test",
            Arc::new(NoStore),
            Arc::new(Counters::default()),
            make,
            stop.clone(),
        )
        .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let threads: Vec<_> = (0..clients)
            .map(|c| {
                std::thread::spawn(move || {
                    let s = TcpStream::connect(addr).unwrap();
                    // Replies held back and never sent fail the test instead of hanging it.
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    client(c, s)
                })
            })
            .collect();
        for id in 0..u64::from(clients) {
            let (s, _) = listener.accept().unwrap();
            lp.give(s, id).unwrap();
        }
        for t in threads {
            t.join().unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        lp.join();
    }

    /// Connections pipelining requests with large replies at the same time, on one loop: the
    /// loop writes each its share and the rest after the others' (the backlog), and every
    /// client still gets all its replies, whole and in order.
    #[test]
    fn clients_served_in_turns_get_all_their_large_replies_in_order() {
        const BATCHES: u32 = 40;
        const DEPTH: u32 = 8;
        let before = BACKLOG_WRITES.load(Ordering::Relaxed);
        let make: Arc<MakeSession> = Arc::new(|_, _, _| large(usize::MAX));
        serve_clients(make, 4, |c, s| {
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            let mut got = vec![0u8; REPLY];
            for b in 0..BATCHES {
                let ids: Vec<u32> = (0..DEPTH).map(|k| (c * BATCHES + b) * DEPTH + k).collect();
                let req: String = ids.iter().map(|n| format!("{n}\n")).collect();
                w.write_all(req.as_bytes()).unwrap();
                for &n in &ids {
                    r.read_exact(&mut got)
                        .unwrap_or_else(|e| panic!("client {c}: reply {n}: {e}"));
                    assert!(got == reply(n), "client {c}: reply {n} wrong");
                }
            }
        });
        assert!(
            BACKLOG_WRITES.load(Ordering::Relaxed) > before,
            "no turn had two connections with large replies ready: the backlog went untested"
        );
    }

    /// Each request is a line of [`LONG`] bytes ending in a number; its reply is the number.
    struct Long {
        inbuf: Vec<u8>,
        out: Vec<u8>,
    }
    const LONG: usize = 16 * 1024;

    fn long_request(n: u32) -> String {
        let id = n.to_string();
        format!("{}{id}\n", "x".repeat(LONG - id.len() - 1))
    }

    impl Session for Long {
        fn inbuf(&mut self) -> &mut Vec<u8> {
            &mut self.inbuf
        }
        fn out(&mut self) -> &mut Vec<u8> {
            &mut self.out
        }
        fn serve_buffered(&mut self) -> Served {
            let mut at = 0;
            while let Some(len) = self.inbuf[at..].iter().position(|&b| b == b'\n') {
                let line = &self.inbuf[at..at + len];
                let digits = line.iter().rev().take_while(|b| b.is_ascii_digit()).count();
                self.out.extend_from_slice(&line[len - digits..]);
                self.out.push(b'\n');
                at += len + 1;
            }
            self.inbuf.drain(..at);
            Served::Read
        }
    }

    /// Connections pipelining batches of large requests at the same time, on one loop: a batch
    /// larger than a read is served a chunk at a time, the connections in turn (and the first
    /// chunk's replies written at once), and every client still gets every reply, in order.
    #[test]
    fn batches_of_large_requests_are_served_in_turns_and_answered_in_order() {
        const BATCHES: u32 = 30;
        // 16 requests of 16 KiB: four reads' worth per batch.
        const DEPTH: u32 = 16;
        let before = ROUND_CHUNKS.load(Ordering::Relaxed);
        let make: Arc<MakeSession> = Arc::new(|_, _, _| {
            Box::new(Long {
                inbuf: Vec::new(),
                out: Vec::new(),
            })
        });
        serve_clients(make, 4, |c, s| {
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            for b in 0..BATCHES {
                let ids: Vec<u32> = (0..DEPTH).map(|k| (c * BATCHES + b) * DEPTH + k).collect();
                let req: String = ids.iter().map(|&n| long_request(n)).collect();
                w.write_all(req.as_bytes()).unwrap();
                for &n in &ids {
                    let mut line = String::new();
                    std::io::BufRead::read_line(&mut r, &mut line)
                        .unwrap_or_else(|e| panic!("client {c}: reply {n}: {e}"));
                    assert_eq!(line, format!("{n}\n"), "client {c}");
                }
            }
        });
        assert!(
            ROUND_CHUNKS.load(Ordering::Relaxed) > before,
            "no batch outlasted its first read: the rounds went untested"
        );
    }

    /// A `Large` session's reply limit in the test of held requests.
    const CAP: usize = 100_000;

    /// A session that stops at its reply limit keeps the requests it read; the loop serves
    /// them once the replies are written, with no new input to wake it (the requests all came
    /// in one read), and every reply arrives, in order, while the session never held more
    /// than its limit and one reply.
    #[test]
    fn requests_held_at_the_reply_limit_are_served_once_the_replies_are_written() {
        const REQUESTS: u32 = 60; // 2.4 MB of replies from a few hundred bytes of requests
        let make: Arc<MakeSession> = Arc::new(|_, _, _| large(CAP));
        serve_clients(make, 2, |c, s| {
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            let ids: Vec<u32> = (0..REQUESTS).map(|k| c * REQUESTS + k).collect();
            let req: String = ids.iter().map(|n| format!("{n}\n")).collect();
            w.write_all(req.as_bytes()).unwrap();
            // Replies pile up unread for a while first.
            std::thread::sleep(Duration::from_millis(200));
            let mut got = vec![0u8; REPLY];
            for &n in &ids {
                r.read_exact(&mut got)
                    .unwrap_or_else(|e| panic!("client {c}: reply {n}: {e}"));
                assert!(got == reply(n), "client {c}: reply {n} wrong");
            }
        });
        let most = CAPPED_MOST.load(Ordering::Relaxed) as usize;
        assert!(
            (CAP..CAP + REPLY).contains(&most),
            "held {most} bytes of replies"
        );
    }
}
