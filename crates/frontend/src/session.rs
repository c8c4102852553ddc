//! The read–serve–write loop every front end's connection runs: read what has arrived, serve
//! the whole requests in it (replies buffered, so a pipeline's replies go out in one write),
//! write the replies, until the client closes the connection or a request ends it.
//!
//! A session holds at most about [`FLUSH_AT`] bytes of replies (plus the one value being
//! added): past that it stops serving, even in the middle of a multi-key read, and goes on
//! once its replies are written. A client that pipelines requests and does not read their
//! replies therefore holds a bounded amount of the node's memory.

use std::io::{ErrorKind, Read, Write};

pub use crate::serve::FLUSH_AT;

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 64 * 1024;

/// How far [`Session::serve_buffered`] got.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Served {
    /// Every whole request was served: read more.
    Read,
    /// The replies reached [`FLUSH_AT`]: write them, then serve the rest of the input before
    /// reading more.
    Held,
    /// Write the replies and close the connection (`quit`, or input that cannot be framed).
    Close,
}

/// Whether a multi-key read must stop before its key `i`, having started (or gone on) at key
/// `first` in this turn: its replies `out` reached [`FLUSH_AT`] after it answered a key. Then
/// `resume` is set to `i`, where it goes on once the replies are written.
pub fn pause_before(out: &[u8], i: usize, first: usize, resume: &mut usize) -> bool {
    let pause = i > first && out.len() >= FLUSH_AT;
    if pause {
        *resume = i;
    }
    pause
}

/// A protocol's side of one connection: what a read–serve–write loop ([`run`], or an event
/// loop over many connections) drives.
pub trait Session {
    /// Bytes received, for the caller to append to (served bytes may stay at its start until
    /// the session moves what is left to its front).
    fn inbuf(&mut self) -> &mut Vec<u8>;
    /// Replies not yet written.
    fn out(&mut self) -> &mut Vec<u8>;
    /// Serve the whole requests in the input until the replies reach [`FLUSH_AT`].
    fn serve_buffered(&mut self) -> Served;
}

/// `impl Session for $conn<'_>`, for a front end's connection type with buffers `inbuf` and
/// `out`, a batch client `store` and an inherent `serve_buffered`: one client serves the whole
/// batch and goes back when it ends (memcached's and Redis's connections alike).
macro_rules! connection_session {
    ($conn:ident) => {
        impl $crate::session::Session for $conn<'_> {
            fn inbuf(&mut self) -> &mut Vec<u8> {
                &mut self.inbuf
            }

            fn out(&mut self) -> &mut Vec<u8> {
                &mut self.out
            }

            fn serve_buffered(&mut self) -> $crate::session::Served {
                let served = $conn::serve_buffered(self);
                // One client served the whole batch: it goes back until the next one.
                self.store.end();
                served
            }
        }
    };
}
pub(crate) use connection_session;

/// Run `session` on `stream` until the client closes it, a request ends it, or an I/O error.
pub fn run<S: Read + Write>(stream: &mut S, session: &mut dyn Session) -> std::io::Result<()> {
    let mut chunk = vec![0u8; READ_CHUNK];
    loop {
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        session.inbuf().extend_from_slice(&chunk[..n]);
        loop {
            let served = session.serve_buffered();
            let out = session.out();
            stream.write_all(out)?;
            out.clear();
            match served {
                Served::Read => break,
                Served::Held => continue,
                Served::Close => return Ok(()),
            }
        }
    }
}
