//! The read–serve–write loop every front end's connection runs: read what has arrived, serve
//! every whole request in it (replies buffered, so a pipeline's replies go out in one write),
//! write the replies, until the client closes the connection or a request ends it.

use std::io::{ErrorKind, Read, Write};

/// Bytes read from the socket at a time.
const READ_CHUNK: usize = 64 * 1024;

/// A protocol's side of one connection: what a read–serve–write loop ([`run`], or an event
/// loop over many connections) drives.
pub trait Session {
    /// Bytes received, for the caller to append to (served bytes may stay at its start until
    /// the session moves what is left to its front).
    fn inbuf(&mut self) -> &mut Vec<u8>;
    /// Replies not yet written.
    fn out(&mut self) -> &mut Vec<u8>;
    /// Serve every whole request in the input (writing replies out early to `stream` when
    /// many are waiting); true if the connection must close once the replies are written.
    fn serve_buffered(&mut self, stream: &mut dyn Write) -> std::io::Result<bool>;
}

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
        let close = session.serve_buffered(stream)?;
        let out = session.out();
        stream.write_all(out)?;
        out.clear();
        if close {
            return Ok(());
        }
    }
}
