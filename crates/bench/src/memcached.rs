//! A minimal memcached text-protocol connection (`set`, `get`), so that the fill test can load
//! memcached with exactly the loader that loads Nessie. Not a general client.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::fill::{FillTarget, Refusal};

/// memcached's limit on key length.
pub const MAX_MEMCACHED_KEY: usize = 250;
/// Longest reply line read (memcached's are short).
const MAX_LINE: usize = 1024;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum MemcachedError {
    #[error("memcached connection: {0}")]
    Io(#[from] io::Error),
    #[error("key of {0} bytes is not a memcached key (1..={MAX_MEMCACHED_KEY} bytes, no spaces or control characters)")]
    BadKey(usize),
    #[error("memcached answered {0:?}")]
    Reply(String),
}

/// One connection to a memcached server.
pub struct MemcachedConn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl MemcachedConn {
    pub fn connect(addr: &str, timeout: Duration) -> Result<Self, MemcachedError> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    fn check_key(key: &[u8]) -> Result<(), MemcachedError> {
        let ok = !key.is_empty()
            && key.len() <= MAX_MEMCACHED_KEY
            && key.iter().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(())
        } else {
            Err(MemcachedError::BadKey(key.len()))
        }
    }

    fn line(&mut self) -> Result<String, MemcachedError> {
        let mut buf = Vec::new();
        (&mut self.reader)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut buf)?;
        if !buf.ends_with(b"\r\n") {
            return Err(MemcachedError::Reply(String::from_utf8_lossy(&buf).into()));
        }
        buf.truncate(buf.len() - 2);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// `set key 0 0 len`; returns memcached's reply line (`STORED` or an error line).
    pub fn set(&mut self, key: &[u8], value: &[u8]) -> Result<String, MemcachedError> {
        Self::check_key(key)?;
        let mut req = Vec::with_capacity(key.len() + value.len() + 32);
        req.extend_from_slice(b"set ");
        req.extend_from_slice(key);
        req.extend_from_slice(format!(" 0 0 {}\r\n", value.len()).as_bytes());
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        self.writer.write_all(&req)?;
        self.line()
    }

    /// `get key`: the value, or `None` if memcached does not hold the key.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, MemcachedError> {
        Self::check_key(key)?;
        let mut req = b"get ".to_vec();
        req.extend_from_slice(key);
        req.extend_from_slice(b"\r\n");
        self.writer.write_all(&req)?;
        let head = self.line()?;
        if head == "END" {
            return Ok(None);
        }
        // VALUE <key> <flags> <bytes>
        let len: usize = match head.split(' ').collect::<Vec<_>>()[..] {
            ["VALUE", _, _, n] => n.parse().map_err(|_| MemcachedError::Reply(head.clone()))?,
            _ => return Err(MemcachedError::Reply(head)),
        };
        let mut value = vec![0u8; len + 2];
        self.reader.read_exact(&mut value)?;
        value.truncate(len);
        let end = self.line()?;
        if end != "END" {
            return Err(MemcachedError::Reply(end));
        }
        Ok(Some(value))
    }
}

impl FillTarget for MemcachedConn {
    fn store(&mut self, key: &[u8], value: &[u8]) -> Result<(), Refusal> {
        match self.set(key, value) {
            Ok(r) if r == "STORED" => Ok(()),
            // `memcached -M` refuses instead of evicting when its memory is used up.
            Ok(r) if r.contains("out of memory") => Err(Refusal::Full(r)),
            Ok(r) => Err(Refusal::Failed(r)),
            Err(e) => Err(Refusal::Failed(e.to_string())),
        }
    }
}
