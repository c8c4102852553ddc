//! The memcached text protocol: request lines parsed from a connection's buffer, the data block
//! of storage commands, and reply encoding. Transport-free: the caller owns the socket and the
//! buffer, asks [`parse_request`] for the next request, and for a storage command reads its
//! data block with [`take_data`].
//!
//! ```text
//! <set|add|replace|append|prepend> <key> <flags> <exptime> <bytes> [noreply]\r\n<data>\r\n
//! cas <key> <flags> <exptime> <bytes> <cas unique> [noreply]\r\n<data>\r\n
//! get|gets <key>*\r\n            gat|gats <exptime> <key>*\r\n
//! delete <key> [noreply]\r\n     incr|decr <key> <delta> [noreply]\r\n
//! touch <key> <exptime> [noreply]\r\n
//! flush_all [delay] [noreply]\r\n  version\r\n  verbosity <n> [noreply]\r\n  stats [arg]\r\n
//! quit\r\n
//! ```
//! Errors follow what memcached 1.6 answers (checked against it): an unknown command or a
//! wrong number of arguments is `ERROR`, a malformed number `CLIENT_ERROR bad command line
//! format`, a data block not ending in `\r\n` `CLIENT_ERROR bad data chunk`. Keys are split on
//! spaces only, as memcached does.

use crate::memcached::meta::{self, Meta};

/// memcached's limit on key length.
pub const MAX_KEY_LEN: usize = 250;
/// Longest request line accepted (multi-key gets make long lines); a longer one closes the
/// connection.
pub const MAX_LINE_LEN: usize = 64 * 1024;
/// Most keys one get may name.
pub const MAX_GET_KEYS: usize = 1024;

/// A storage command.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum StoreOp {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Cas,
}

/// One parsed request. Keys borrow from the connection's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// `get`/`gets` (`with_cas`), or `gat`/`gats` with `touch` = the new exptime.
    Get {
        keys: Vec<&'a [u8]>,
        with_cas: bool,
        touch: Option<i64>,
    },
    /// A storage command; its data block of `len` bytes follows the line.
    Store {
        op: StoreOp,
        key: &'a [u8],
        flags: u32,
        exptime: i64,
        len: usize,
        /// The `cas unique` of a `cas` command (0 for the others).
        cas: u64,
        noreply: bool,
    },
    Delete {
        key: &'a [u8],
        noreply: bool,
    },
    /// `incr` (`incr` = true) or `decr`.
    Arith {
        key: &'a [u8],
        delta: u64,
        incr: bool,
        noreply: bool,
    },
    Touch {
        key: &'a [u8],
        exptime: i64,
        noreply: bool,
    },
    FlushAll {
        delay: i64,
        noreply: bool,
    },
    Version,
    Verbosity {
        noreply: bool,
    },
    Stats {
        arg: Option<&'a [u8]>,
    },
    Quit,
    /// `mn`: answers `MN`.
    MetaNoop,
    /// `mg`, `ms`, `md`, `ma` ([`crate::memcached::meta`]); an `ms`'s data block follows the line.
    Meta(Meta<'a>),
}

/// Why a request cannot be served. [`ProtoError::reply`] is what memcached answers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("unknown command")]
    UnknownCommand,
    #[error("wrong number of arguments")]
    WrongArity,
    #[error("invalid exptime argument")]
    BadExptime,
    #[error("bad command line format")]
    BadFormat,
    /// `delete` with words after its key other than `0` and `noreply`.
    #[error("bad command line format; usage: delete <key> [noreply]")]
    DeleteUsage,
    #[error("invalid numeric delta argument")]
    BadDelta,
    #[error("line too long")]
    LineTooLong,
    #[error("bad data chunk")]
    BadDataChunk,
    /// A meta command's error: its reply `line`, and how many bytes after the line to throw
    /// away (an `ms`'s data block).
    #[error("{}", line.trim_end())]
    Meta { line: &'static str, skip: usize },
}

impl ProtoError {
    /// The reply line memcached sends for this error.
    pub fn reply(&self) -> &'static [u8] {
        match self {
            ProtoError::UnknownCommand | ProtoError::WrongArity => b"ERROR\r\n",
            ProtoError::BadExptime => b"CLIENT_ERROR invalid exptime argument\r\n",
            ProtoError::BadFormat => b"CLIENT_ERROR bad command line format\r\n",
            ProtoError::DeleteUsage => {
                b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"
            }
            ProtoError::BadDelta => b"CLIENT_ERROR invalid numeric delta argument\r\n",
            ProtoError::LineTooLong => b"CLIENT_ERROR line too long\r\n",
            ProtoError::BadDataChunk => b"CLIENT_ERROR bad data chunk\r\n",
            ProtoError::Meta { line, .. } => line.as_bytes(),
        }
    }

    /// Whether the reply is a `CLIENT_ERROR` (a known command with a malformed argument),
    /// which memcached leaves out under `noreply`.
    pub fn is_client_error(&self) -> bool {
        self.reply().starts_with(b"CLIENT_ERROR")
    }

    /// Bytes after the request line that belong to the failed request and are thrown away.
    pub fn skip(&self) -> usize {
        match self {
            ProtoError::Meta { skip, .. } => *skip,
            _ => 0,
        }
    }

    /// Whether the connection cannot continue (the stream can no longer be framed).
    pub fn closes_connection(&self) -> bool {
        matches!(self, ProtoError::LineTooLong)
    }
}

/// The first byte of a request in memcached's binary protocol (no text command starts with it).
pub const BINARY_REQUEST_MAGIC: u8 = 0x80;
/// Bytes of a binary request's header.
pub const BINARY_HEADER_LEN: usize = 24;
/// The binary protocol's status "Not supported".
const BINARY_NOT_SUPPORTED: u16 = 0x0083;

/// The answer to a request in the binary protocol, which is not served: a binary response
/// with status "Not supported" and why, for the opcode and opaque of `header` (the request's
/// first [`BINARY_HEADER_LEN`] bytes), so a binary client fails at once instead of waiting
/// for an answer the text parser would never give. The connection closes after it.
pub fn binary_refusal(header: &[u8]) -> Vec<u8> {
    assert!(header.len() >= BINARY_HEADER_LEN && header[0] == BINARY_REQUEST_MAGIC);
    let msg = b"Not supported: this server speaks memcached's text protocol only";
    let mut r = Vec::with_capacity(BINARY_HEADER_LEN + msg.len());
    r.push(0x81); // response magic
    r.push(header[1]); // opcode
    r.extend_from_slice(&[0, 0, 0, 0]); // key length, extras length, data type
    r.extend_from_slice(&BINARY_NOT_SUPPORTED.to_be_bytes());
    r.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    r.extend_from_slice(&header[12..16]); // opaque
    r.extend_from_slice(&[0; 8]); // cas
    r.extend_from_slice(msg);
    r
}

/// The next request line in `buf`: `Ok(None)` if no whole line has arrived yet, else the
/// request and the bytes the line took (the data block of a storage command is not included).
pub fn parse_request(buf: &[u8]) -> Result<Option<(Request<'_>, usize)>, ProtoError> {
    let Some(nl) = buf.iter().take(MAX_LINE_LEN + 2).position(|&b| b == b'\n') else {
        return if buf.len() > MAX_LINE_LEN {
            Err(ProtoError::LineTooLong)
        } else {
            Ok(None)
        };
    };
    let line = &buf[..nl];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let words: Vec<&[u8]> = line
        .split(|&b| b == b' ')
        .filter(|w| !w.is_empty())
        .collect();
    let Some((&cmd, args)) = words.split_first() else {
        return Err(ProtoError::UnknownCommand);
    };
    Ok(Some((request(cmd, args)?, nl + 1)))
}

fn request<'a>(cmd: &[u8], args: &[&'a [u8]]) -> Result<Request<'a>, ProtoError> {
    let store = |op| store(op, args);
    match cmd {
        b"get" => get(args, false, None),
        b"gets" => get(args, true, None),
        b"gat" | b"gats" => {
            let (&exptime, keys) = args.split_first().ok_or(ProtoError::WrongArity)?;
            let touch = Some(exptime_arg(exptime)?);
            if keys.is_empty() {
                // memcached answers a `gat` that names no key with no hits: `END`.
                return Ok(Request::Get {
                    keys: Vec::new(),
                    with_cas: cmd == b"gats",
                    touch,
                });
            }
            get(keys, cmd == b"gats", touch)
        }
        b"set" => store(StoreOp::Set),
        b"add" => store(StoreOp::Add),
        b"replace" => store(StoreOp::Replace),
        b"append" => store(StoreOp::Append),
        b"prepend" => store(StoreOp::Prepend),
        b"cas" => store(StoreOp::Cas),
        b"delete" => delete(args),
        b"incr" | b"decr" => arith(args, cmd == b"incr"),
        b"touch" => touch(args),
        // memcached ignores anything after `mn`.
        b"mn" => Ok(Request::MetaNoop),
        b"mg" | b"ms" | b"md" | b"ma" => meta::parse(cmd, args).map(Request::Meta),
        _ => admin(cmd, args),
    }
}

fn delete<'a>(args: &[&'a [u8]]) -> Result<Request<'a>, ProtoError> {
    // As memcached: one to three words; after the key only a legacy hold time of `0` and
    // `noreply`, else a usage error (which a last word `noreply` silences). A lone
    // `noreply` is the key.
    let (key, noreply) = match args {
        [key] | [key, b"0"] => (key, false),
        [key, b"noreply"] | [key, b"0", b"noreply"] => (key, true),
        [_, _] | [_, _, _] => return Err(ProtoError::DeleteUsage),
        _ => return Err(ProtoError::WrongArity),
    };
    Ok(Request::Delete {
        key: valid_key(key)?,
        noreply,
    })
}

fn arith<'a>(args: &[&'a [u8]], incr: bool) -> Result<Request<'a>, ProtoError> {
    let (args, noreply) = noreply(args);
    // memcached ignores a last word that is not `noreply`.
    let ([key, delta] | [key, delta, _]) = args else {
        return Err(short_by_noreply(
            noreply,
            args.len(),
            2,
            ProtoError::BadDelta,
        ));
    };
    Ok(Request::Arith {
        key: valid_key(key)?,
        delta: number(delta).map_err(|_| ProtoError::BadDelta)?,
        incr,
        noreply,
    })
}

fn touch<'a>(args: &[&'a [u8]]) -> Result<Request<'a>, ProtoError> {
    let (args, noreply) = noreply(args);
    let ([key, exptime] | [key, exptime, _]) = args else {
        return Err(short_by_noreply(
            noreply,
            args.len(),
            2,
            ProtoError::BadExptime,
        ));
    };
    Ok(Request::Touch {
        key: valid_key(key)?,
        exptime: exptime_arg(exptime)?,
        noreply,
    })
}

/// The commands that name no key.
fn admin<'a>(cmd: &[u8], args: &[&'a [u8]]) -> Result<Request<'a>, ProtoError> {
    match cmd {
        b"flush_all" => {
            // As memcached: up to two words, a last `noreply` silences; a delay is read from
            // the first word whenever there is one besides `noreply` (anything after it is
            // ignored).
            if args.len() > 2 {
                return Err(ProtoError::WrongArity);
            }
            let noreply = args.last() == Some(&&b"noreply"[..]);
            let delay = match args.len() == usize::from(noreply) {
                true => 0,
                false => exptime_arg(args[0])?,
            };
            Ok(Request::FlushAll { delay, noreply })
        }
        // memcached ignores anything after these two.
        b"version" => Ok(Request::Version),
        b"quit" => Ok(Request::Quit),
        b"verbosity" => {
            // As memcached: the level, then one more word that is ignored unless it is
            // `noreply`; a bad level (`verbosity noreply` too) is a `CLIENT_ERROR`, which a
            // last word `noreply` silences.
            let ([level] | [level, _]) = args else {
                return Err(ProtoError::WrongArity);
            };
            number::<u32>(level)?;
            Ok(Request::Verbosity {
                noreply: args.last() == Some(&&b"noreply"[..]),
            })
        }
        b"stats" => match args {
            [] => Ok(Request::Stats { arg: None }),
            [a] => Ok(Request::Stats { arg: Some(a) }),
            _ => Err(ProtoError::WrongArity),
        },
        _ => Err(ProtoError::UnknownCommand),
    }
}

fn get<'a>(
    keys: &[&'a [u8]],
    with_cas: bool,
    touch: Option<i64>,
) -> Result<Request<'a>, ProtoError> {
    if keys.is_empty() {
        return Err(ProtoError::WrongArity);
    }
    if keys.len() > MAX_GET_KEYS {
        return Err(ProtoError::BadFormat);
    }
    let keys = keys
        .iter()
        .map(|k| valid_key(k))
        .collect::<Result<_, _>>()?;
    Ok(Request::Get {
        keys,
        with_cas,
        touch,
    })
}

fn store<'a>(op: StoreOp, args: &[&'a [u8]]) -> Result<Request<'a>, ProtoError> {
    let (args, noreply) = noreply(args);
    let (fixed, cas) = match (op, args) {
        (StoreOp::Cas, [key, flags, exptime, len, cas]) => {
            ([*key, *flags, *exptime, *len], number(cas)?)
        }
        (StoreOp::Cas, _) => {
            return Err(short_by_noreply(
                noreply,
                args.len(),
                5,
                ProtoError::BadFormat,
            ))
        }
        (_, [key, flags, exptime, len]) => ([*key, *flags, *exptime, *len], 0),
        _ => {
            return Err(short_by_noreply(
                noreply,
                args.len(),
                4,
                ProtoError::BadFormat,
            ))
        }
    };
    let [key, flags, exptime, len] = fixed;
    Ok(Request::Store {
        op,
        key: valid_key(key)?,
        flags: number(flags)?,
        exptime: number(exptime)?,
        len: number(len)?,
        cas,
        noreply,
    })
}

/// Whether a request `line` (with its line end) is a classic command, not a meta one, whose
/// last word is `noreply`: memcached answers such a line's errors with silence.
pub fn classic_noreply_line(line: &[u8]) -> bool {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
    let meta = matches!(words.next(), Some([b'm', _]));
    !meta && words.next_back() == Some(b"noreply".as_slice())
}

/// The error for `got` arguments where `need` are wanted, a trailing `noreply` taken off.
/// memcached does not take it off when that leaves one too few: it reads `noreply` as the
/// last argument, which does not parse (`as_arg`, a `CLIENT_ERROR`, which `noreply` then
/// silences); other counts are the wrong arity (`ERROR`).
fn short_by_noreply(noreply: bool, got: usize, need: usize, as_arg: ProtoError) -> ProtoError {
    if noreply && got + 1 == need {
        as_arg
    } else {
        ProtoError::WrongArity
    }
}

/// Split a trailing `noreply` off the arguments.
fn noreply<'a, 'b>(args: &'b [&'a [u8]]) -> (&'b [&'a [u8]], bool) {
    match args.split_last() {
        Some((&b"noreply", rest)) => (rest, true),
        _ => (args, false),
    }
}

fn valid_key(key: &[u8]) -> Result<&[u8], ProtoError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(ProtoError::BadFormat);
    }
    Ok(key)
}

fn exptime_arg(word: &[u8]) -> Result<i64, ProtoError> {
    number(word).map_err(|_| ProtoError::BadExptime)
}

fn number<T: std::str::FromStr>(word: &[u8]) -> Result<T, ProtoError> {
    std::str::from_utf8(word)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(ProtoError::BadFormat)
}

/// The data block of a storage command of `len` bytes at the start of `buf`: `Ok(None)` until
/// it and its `\r\n` have arrived, else the data and the bytes taken.
pub fn take_data(buf: &[u8], len: usize) -> Result<Option<(&[u8], usize)>, ProtoError> {
    let need = len.checked_add(2).ok_or(ProtoError::BadDataChunk)?;
    if buf.len() < need {
        return Ok(None);
    }
    if &buf[len..need] != b"\r\n" {
        return Err(ProtoError::BadDataChunk);
    }
    Ok(Some((&buf[..len], need)))
}

/// How a get's hit begins: `VALUE <key> <flags> <bytes>[ <cas>]\r\n`.
pub const VALUE_PREFIX: &[u8] = b"VALUE ";

/// Append one `VALUE` line and its data (a get's hit) to `out`; `cas` for gets/gats.
pub fn encode_value(out: &mut Vec<u8>, key: &[u8], flags: u32, data: &[u8], cas: Option<u64>) {
    use std::io::Write;
    out.extend_from_slice(VALUE_PREFIX);
    out.extend_from_slice(key);
    // Formatted straight into `out`: `format!` allocated a string per hit.
    let _ = match cas {
        Some(c) => write!(out, " {flags} {} {c}\r\n", data.len()),
        None => write!(out, " {flags} {}\r\n", data.len()),
    };
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The `VALUE <key> <flags> <bytes>` line of a get's hit (without cas), for a reply built
/// around a value read in place ([`crate::inplace`]).
pub struct ValueHead<'k>(pub &'k [u8]);

impl crate::inplace::ReplyHead for ValueHead<'_> {
    fn len(&self, flags: u32, len: usize) -> usize {
        use crate::inplace::decimal_len;
        let numbers = decimal_len(flags.into()) + decimal_len(len as u64);
        VALUE_PREFIX.len() + self.0.len() + 1 + numbers + 1 + 2
    }
    fn write(&self, dst: &mut [u8], flags: u32, len: usize) {
        use crate::inplace::{decimal_len, write_decimal};
        assert_eq!(dst.len(), self.len(flags, len), "room for the line");
        let (f, l) = (decimal_len(flags.into()), decimal_len(len as u64));
        let (prefix, rest) = dst.split_at_mut(VALUE_PREFIX.len());
        prefix.copy_from_slice(VALUE_PREFIX);
        let (key, rest) = rest.split_at_mut(self.0.len());
        key.copy_from_slice(self.0);
        rest[0] = b' ';
        write_decimal(&mut rest[1..1 + f], flags.into());
        rest[1 + f] = b' ';
        write_decimal(&mut rest[2 + f..2 + f + l], len as u64);
        rest[2 + f + l..].copy_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn one(line: &str) -> Result<Request<'_>, ProtoError> {
        let (r, n) = parse_request(line.as_bytes())?.expect("a whole line");
        assert_eq!(n, line.len());
        Ok(r)
    }

    #[test]
    fn storage_commands() {
        assert_eq!(
            one("set k 5 0 3\r\n").unwrap(),
            Request::Store {
                op: StoreOp::Set,
                key: b"k",
                flags: 5,
                exptime: 0,
                len: 3,
                cas: 0,
                noreply: false
            }
        );
        assert_eq!(
            one("cas k 0 -1 10 77 noreply\r\n").unwrap(),
            Request::Store {
                op: StoreOp::Cas,
                key: b"k",
                flags: 0,
                exptime: -1,
                len: 10,
                cas: 77,
                noreply: true
            }
        );
        for (cmd, op) in [
            ("add", StoreOp::Add),
            ("replace", StoreOp::Replace),
            ("append", StoreOp::Append),
            ("prepend", StoreOp::Prepend),
        ] {
            let line = format!("{cmd} key 1 2 3\r\n");
            let r = one(&line).unwrap();
            assert!(matches!(r, Request::Store { op: o, .. } if o == op));
        }
        assert_eq!(one("set k 0 0\r\n"), Err(ProtoError::WrongArity));
        assert_eq!(
            one("cas k 0 0 1\r\n"),
            Err(ProtoError::WrongArity),
            "cas needs its unique"
        );
        assert_eq!(one("set k x 0 1\r\n"), Err(ProtoError::BadFormat));
        assert_eq!(one("set k 0 0 -1\r\n"), Err(ProtoError::BadFormat));
        assert_eq!(
            one("set k 4294967296 0 1\r\n"),
            Err(ProtoError::BadFormat),
            "flags are 32 bits"
        );
    }

    #[test]
    fn retrieval_commands() {
        assert_eq!(
            one("gets a bb ccc\r\n").unwrap(),
            Request::Get {
                keys: vec![b"a", b"bb", b"ccc"],
                with_cas: true,
                touch: None
            }
        );
        assert_eq!(
            one("gat 100 a\r\n").unwrap(),
            Request::Get {
                keys: vec![b"a"],
                with_cas: false,
                touch: Some(100)
            }
        );
        assert_eq!(one("get\r\n"), Err(ProtoError::WrongArity));
        assert_eq!(one("touch k\r\n"), Err(ProtoError::WrongArity));
        assert_eq!(one("verbosity\r\n"), Err(ProtoError::WrongArity));
        assert_eq!(one("flush_all x\r\n"), Err(ProtoError::BadExptime));
        assert_eq!(one("version x\r\n").unwrap(), Request::Version);
    }

    #[test]
    fn key_and_admin_commands() {
        assert_eq!(
            one("delete k noreply\r\n").unwrap(),
            Request::Delete {
                key: b"k",
                noreply: true
            }
        );
        assert_eq!(
            one("delete k 0\r\n").unwrap(),
            Request::Delete {
                key: b"k",
                noreply: false
            }
        );
        assert_eq!(
            one("decr n 18446744073709551615\r\n").unwrap(),
            Request::Arith {
                key: b"n",
                delta: u64::MAX,
                incr: false,
                noreply: false
            }
        );
        assert_eq!(one("incr n -1\r\n"), Err(ProtoError::BadDelta));
        assert_eq!(
            one("touch k 10 noreply\r\n").unwrap(),
            Request::Touch {
                key: b"k",
                exptime: 10,
                noreply: true
            }
        );
        assert_eq!(
            one("flush_all\r\n").unwrap(),
            Request::FlushAll {
                delay: 0,
                noreply: false
            }
        );
        assert_eq!(
            one("flush_all 5 noreply\r\n").unwrap(),
            Request::FlushAll {
                delay: 5,
                noreply: true
            }
        );
        assert_eq!(one("version\r\n").unwrap(), Request::Version);
        assert_eq!(
            one("verbosity 1\r\n").unwrap(),
            Request::Verbosity { noreply: false }
        );
        assert_eq!(one("stats\r\n").unwrap(), Request::Stats { arg: None });
        assert_eq!(
            one("stats slabs\r\n").unwrap(),
            Request::Stats {
                arg: Some(b"slabs")
            }
        );
        assert_eq!(one("quit\r\n").unwrap(), Request::Quit);
        assert_eq!(one("bogus\r\n"), Err(ProtoError::UnknownCommand));
        assert_eq!(one("\r\n"), Err(ProtoError::UnknownCommand));
        assert_eq!(
            one("get a\n").unwrap(),
            one("get a\r\n").unwrap(),
            "a bare \\n ends a line too"
        );
    }

    /// Word counts memcached 1.6.18 reads in its own way, checked against it.
    #[test]
    fn word_counts_as_memcached_reads_them() {
        // delete: after the key only `0` and `noreply`, else a usage error.
        assert_eq!(
            one("delete noreply\r\n").unwrap(),
            Request::Delete {
                key: b"noreply",
                noreply: false
            },
            "a lone noreply is the key"
        );
        assert_eq!(
            one("delete k 0 noreply\r\n").unwrap(),
            Request::Delete {
                key: b"k",
                noreply: true
            }
        );
        for bad in [
            "delete k x\r\n",
            "delete k 0 x\r\n",
            "delete k x noreply\r\n",
        ] {
            assert_eq!(one(bad), Err(ProtoError::DeleteUsage), "{bad}");
        }
        assert_eq!(
            ProtoError::DeleteUsage.reply(),
            b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"
        );
        assert!(
            ProtoError::DeleteUsage.is_client_error(),
            "silenced under noreply"
        );
        assert_eq!(one("delete k 0 noreply x\r\n"), Err(ProtoError::WrongArity));
        // gat/gats naming no key: no hits.
        assert_eq!(
            one("gats 10\r\n").unwrap(),
            Request::Get {
                keys: vec![],
                with_cas: true,
                touch: Some(10)
            }
        );
        assert_eq!(one("gat\r\n"), Err(ProtoError::WrongArity));
        // verbosity: a second word is ignored unless it is noreply.
        assert_eq!(
            one("verbosity 1 2\r\n").unwrap(),
            Request::Verbosity { noreply: false }
        );
        assert_eq!(
            one("verbosity 1 noreply\r\n").unwrap(),
            Request::Verbosity { noreply: true }
        );
        assert_eq!(one("verbosity noreply\r\n"), Err(ProtoError::BadFormat));
        assert_eq!(one("verbosity 1 2 3\r\n"), Err(ProtoError::WrongArity));
        // flush_all: the delay is the first word besides noreply.
        assert_eq!(
            one("flush_all 0 x\r\n").unwrap(),
            Request::FlushAll {
                delay: 0,
                noreply: false
            }
        );
        assert_eq!(one("flush_all x noreply\r\n"), Err(ProtoError::BadExptime));
        assert_eq!(one("flush_all 0 1 2\r\n"), Err(ProtoError::WrongArity));
    }

    #[test]
    fn incr_and_touch_ignore_a_last_word_that_is_not_noreply() {
        assert_eq!(
            one("incr n 1 x\r\n"),
            one("incr n 1\r\n"),
            "as memcached does"
        );
        assert_eq!(one("incr n 1 x y\r\n"), Err(ProtoError::WrongArity));
        assert_eq!(one("touch k 1 x\r\n"), one("touch k 1\r\n"));
    }

    #[test]
    fn keys_are_bounded_and_split_on_spaces_only() {
        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert_eq!(one(&format!("get {long}\r\n")), Err(ProtoError::BadFormat));
        let ok = "k".repeat(MAX_KEY_LEN);
        assert!(one(&format!("get {ok}\r\n")).is_ok());
        assert_eq!(
            one("get a\tb\r\n").unwrap(),
            Request::Get {
                keys: vec![b"a\tb"],
                with_cas: false,
                touch: None
            },
            "memcached splits on spaces only"
        );
        let many = vec!["k"; MAX_GET_KEYS + 1].join(" ");
        assert_eq!(one(&format!("get {many}\r\n")), Err(ProtoError::BadFormat));
    }

    #[test]
    fn partial_lines_wait_and_overlong_lines_close_the_connection() {
        assert_eq!(parse_request(b"get ke"), Ok(None));
        assert_eq!(parse_request(b""), Ok(None));
        let junk = vec![b'x'; MAX_LINE_LEN + 1];
        let e = parse_request(&junk).unwrap_err();
        assert_eq!(e, ProtoError::LineTooLong);
        assert!(e.closes_connection());
        let (r, n) = parse_request(b"get a\r\nget b\r\n").unwrap().unwrap();
        assert_eq!(
            (r, n),
            (one("get a\r\n").unwrap(), 7),
            "pipelined requests parse one by one"
        );
    }

    #[test]
    fn data_blocks() {
        assert_eq!(take_data(b"abc\r\nget", 3), Ok(Some((&b"abc"[..], 5))));
        assert_eq!(take_data(b"abc\r", 3), Ok(None));
        assert_eq!(take_data(b"abcd\r\n", 3), Err(ProtoError::BadDataChunk));
        assert_eq!(take_data(b"\r\n", 0), Ok(Some((&b""[..], 2))));
        assert_eq!(take_data(b"", usize::MAX), Err(ProtoError::BadDataChunk));
        assert_eq!(
            ProtoError::BadDataChunk.reply(),
            b"CLIENT_ERROR bad data chunk\r\n"
        );
        assert_eq!(ProtoError::UnknownCommand.reply(), b"ERROR\r\n");
    }

    #[test]
    fn values_encode_as_memcached_sends_them() {
        let mut out = Vec::new();
        encode_value(&mut out, b"k", 7, b"xyz", None);
        encode_value(&mut out, b"k2", 0, b"", Some(42));
        assert_eq!(
            out,
            b"VALUE k 7 3\r\nxyz\r\nVALUE k2 0 0 42\r\n\r\n".to_vec()
        );
    }

    proptest! {
        #[test]
        fn storage_lines_round_trip(
            key in "[!-~]{1,250}",
            flags: u32,
            exptime in -1_000_000i64..1_000_000,
            len in 0usize..(1 << 24),
            cas: u64,
            is_cas: bool,
            nr: bool,
        ) {
            let op = if is_cas { StoreOp::Cas } else { StoreOp::Set };
            let line = format!(
                "{} {key} {flags} {exptime} {len}{}{}\r\n",
                if is_cas { "cas" } else { "set" },
                if is_cas { format!(" {cas}") } else { String::new() },
                if nr { " noreply" } else { "" },
            );
            let (r, n) = parse_request(line.as_bytes()).unwrap().unwrap();
            prop_assert_eq!(n, line.len());
            prop_assert_eq!(r, Request::Store {
                op,
                key: key.as_bytes(),
                flags,
                exptime,
                len,
                cas: if is_cas { cas } else { 0 },
                noreply: nr,
            });
        }

        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_request(&buf);
            let _ = take_data(&buf, buf.len() / 2);
        }
    }
}
