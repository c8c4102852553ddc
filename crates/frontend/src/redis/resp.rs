//! The Redis protocol (RESP2, and RESP3 after `HELLO 3`): commands parsed from a connection's
//! buffer and replies encoded. Transport-free, like [`crate::memcached::proto`].
//!
//! ```text
//! request:  *<argc>\r\n  then argc × ( $<len>\r\n <len bytes> \r\n )
//!           or an inline command: words separated by spaces, ending in \r\n or \n
//! replies:  +simple  -error  :integer  $<len>\r\n<bytes>  *<n> array
//!           null: $-1 (RESP2) or _ (RESP3); a map: *2n (RESP2) or %n (RESP3)
//! ```
//! Limits on everything a client controls: arguments per command ([`MAX_ARGS`]), inline line
//! length ([`MAX_INLINE_LEN`]), and a bulk argument's length: one longer than the caller's
//! limit is not buffered but skipped ([`Parsed::Oversize`]), so the connection stays usable.

use crate::inplace::{decimal_len, write_decimal};

/// Most arguments one command may have (MSET and MGET of many keys).
pub const MAX_ARGS: usize = 64 * 1024;
/// Longest bulk string a request may announce, as Redis's default `proto-max-bulk-len`: a
/// longer one cannot be framed (`invalid bulk length`, and the connection closes). Shorter ones
/// over the value limit are skipped, the connection kept.
pub const MAX_BULK_LEN: usize = 512 << 20;
/// A command being received is held whole until it has arrived (its arguments are served
/// where they lie). It may hold at most this much, or four times the longest key and value,
/// whichever is more; past that it is refused and the connection closed, as Redis does past
/// its `client-query-buffer-limit`.
pub const MAX_REQUEST_FLOOR: usize = 64 << 20;
/// Longest inline command.
pub const MAX_INLINE_LEN: usize = 64 * 1024;
/// Longest `*<n>` or `$<len>` header line.
const MAX_HEADER_LEN: usize = 32;

/// Argument positions an [`Args`] keeps room for from one command to the next.
pub const KEPT_ARGS: usize = 64;
/// Arguments a command's slices are gathered for on the stack (more take an allocation).
const ARGS_ON_STACK: usize = 16;

/// A command's arguments (the name first) as found by [`parse`]: where each lies in the buffer
/// parsed, so a command runs on the bytes where they arrived. Copying them out cost an
/// allocation per argument and a copy of every value (4% of a node serving pipelined 100-byte
/// SETs, 7% with 16 KiB ones, `perf`). Room for more than [`KEPT_ARGS`] positions is not kept.
#[derive(Debug, Default)]
pub struct Args {
    /// Byte ranges of a multibulk command's arguments in the buffer parsed.
    spans: Vec<(usize, usize)>,
    /// The words of an inline command (quotes and escapes make them differ from its bytes).
    words: Vec<Vec<u8>>,
}

impl Args {
    /// Call `f` with the arguments of the command last parsed from `buf` (the same buffer).
    pub fn with<R>(&self, buf: &[u8], f: impl FnOnce(&[&[u8]]) -> R) -> R {
        if !self.words.is_empty() {
            let words: Vec<&[u8]> = self.words.iter().map(Vec::as_slice).collect();
            return f(&words);
        }
        let n = self.spans.len();
        if n <= ARGS_ON_STACK {
            let mut a: [&[u8]; ARGS_ON_STACK] = [&[]; ARGS_ON_STACK];
            for (slot, &(start, end)) in a.iter_mut().zip(&self.spans) {
                *slot = &buf[start..end];
            }
            return f(&a[..n]);
        }
        let a: Vec<&[u8]> = self.spans.iter().map(|&(s, e)| &buf[s..e]).collect();
        f(&a)
    }

    fn clear(&mut self) {
        if self.spans.capacity() > KEPT_ARGS {
            self.spans = Vec::new();
        }
        self.spans.clear();
        self.words.clear();
    }
}

/// What the buffer held.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole command, its arguments in the caller's [`Args`], and the bytes it took.
    Command(usize),
    /// Not a whole command yet.
    Incomplete,
    /// A command with an argument longer than the limit: `consumed` bytes are taken (up to and
    /// including that argument's `$<len>\r\n` header); the caller skips `skip` more bytes (the
    /// argument and its `\r\n`), then `args_left` more bulk arguments, then answers an error.
    Oversize {
        consumed: usize,
        skip: usize,
        args_left: usize,
        len: usize,
    },
}

/// A request that cannot be framed: Redis answers `-ERR Protocol error: …` and closes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("Protocol error: invalid multibulk length")]
    MultibulkLength,
    #[error("Protocol error: invalid bulk length")]
    BulkLength,
    #[error("Protocol error: expected '$', got '{0}'")]
    ExpectedBulk(char),
    #[error("Protocol error: too big inline request")]
    InlineTooLong,
    #[error("Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    /// Not Redis's words (it closes such a client without a reply): the command would be
    /// held whole past the front end's limit ([`MAX_REQUEST_FLOOR`]).
    #[error("Protocol error: a command of more than {0} bytes")]
    TooLarge(usize),
}

/// Parse the next command in `buf` into `args`; a bulk argument longer than `max_bulk` gives
/// [`Parsed::Oversize`]. `args` holds a whole command's arguments only after
/// [`Parsed::Command`].
pub fn parse(buf: &[u8], max_bulk: usize, args: &mut Args) -> Result<Parsed, ProtoError> {
    args.clear();
    match buf.first() {
        None => Ok(Parsed::Incomplete),
        Some(b'*') => parse_multibulk(buf, max_bulk, args),
        Some(_) => parse_inline(buf, args),
    }
}

/// The line starting at `buf[at]`, without its `\r\n`, and where the next one starts.
fn header_line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = &buf[at..];
    let nl = rest
        .iter()
        .take(MAX_HEADER_LEN + 2)
        .position(|&b| b == b'\n')?;
    let line = rest[..nl].strip_suffix(b"\r").unwrap_or(&rest[..nl]);
    Some((line, at + nl + 1))
}

/// A header's decimal number: an optional `-` and 1 to 18 digits (more than any length or
/// count we accept, without overflow), else `None`.
fn number(line: &[u8]) -> Option<i64> {
    let (neg, digits) = match line.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, line),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n * 10 + (d - b'0') as i64;
    }
    Some(if neg { -n } else { n })
}

fn parse_multibulk(buf: &[u8], max_bulk: usize, args: &mut Args) -> Result<Parsed, ProtoError> {
    let Some((line, mut at)) = header_line(buf, 0) else {
        return incomplete_header(buf, 0, ProtoError::MultibulkLength);
    };
    let argc = number(&line[1..]).ok_or(ProtoError::MultibulkLength)?;
    if argc > MAX_ARGS as i64 {
        return Err(ProtoError::MultibulkLength);
    }
    if argc <= 0 {
        // Redis ignores an empty multibulk.
        return Ok(Parsed::Command(at));
    }
    let argc = argc as usize;
    for i in 0..argc {
        let Some((line, data)) = header_line(buf, at) else {
            return incomplete_header(buf, at, ProtoError::BulkLength);
        };
        match line.first() {
            Some(b'$') => {}
            Some(&c) => return Err(ProtoError::ExpectedBulk(c as char)),
            None => return Err(ProtoError::ExpectedBulk(' ')),
        }
        let len = number(&line[1..])
            .filter(|&l| l >= 0 && l <= MAX_BULK_LEN as i64)
            .ok_or(ProtoError::BulkLength)? as usize;
        if len > max_bulk {
            return Ok(Parsed::Oversize {
                consumed: data,
                skip: len + 2,
                args_left: argc - i - 1,
                len,
            });
        }
        let end = data + len;
        if buf.len() < end + 2 {
            return Ok(Parsed::Incomplete);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(ProtoError::BulkLength);
        }
        args.spans.push((data, end));
        at = end + 2;
    }
    Ok(Parsed::Command(at))
}

/// No whole header line at `at`: incomplete, unless it is already too long to be one.
fn incomplete_header(buf: &[u8], at: usize, e: ProtoError) -> Result<Parsed, ProtoError> {
    if buf.len() - at > MAX_HEADER_LEN {
        Err(e)
    } else {
        Ok(Parsed::Incomplete)
    }
}

fn parse_inline(buf: &[u8], args: &mut Args) -> Result<Parsed, ProtoError> {
    let Some(nl) = buf
        .iter()
        .take(MAX_INLINE_LEN + 2)
        .position(|&b| b == b'\n')
    else {
        return if buf.len() > MAX_INLINE_LEN {
            Err(ProtoError::InlineTooLong)
        } else {
            Ok(Parsed::Incomplete)
        };
    };
    let line = buf[..nl].strip_suffix(b"\r").unwrap_or(&buf[..nl]);
    args.words = split_inline(line)?;
    Ok(Parsed::Command(nl + 1))
}

/// Words of an inline command; double quotes group words (with `\"` and `\\` escapes), as
/// redis-cli's own splitting does for the common cases.
fn split_inline(line: &[u8]) -> Result<Vec<Vec<u8>>, ProtoError> {
    let mut words = Vec::new();
    let mut i = 0;
    while i < line.len() {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == line.len() {
            break;
        }
        let mut w = Vec::new();
        if line[i] == b'"' {
            i += 1;
            loop {
                match line.get(i) {
                    None => return Err(ProtoError::UnbalancedQuotes),
                    Some(b'"') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') if i + 1 < line.len() => {
                        w.push(line[i + 1]);
                        i += 2;
                    }
                    Some(&c) => {
                        w.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < line.len() && !line[i].is_ascii_whitespace() {
                w.push(line[i]);
                i += 1;
            }
        }
        words.push(w);
    }
    Ok(words)
}

/// After an oversize argument's bytes: the next bulk header at the start of `buf`, as the
/// number of bytes to skip for it (header included). `None` until it has arrived.
pub fn next_bulk_to_skip(buf: &[u8]) -> Result<Option<usize>, ProtoError> {
    let Some((line, data)) = header_line(buf, 0) else {
        return incomplete_header(buf, 0, ProtoError::BulkLength).map(|_| None);
    };
    if line.first() != Some(&b'$') {
        return Err(ProtoError::ExpectedBulk(
            *line.first().unwrap_or(&b' ') as char
        ));
    }
    let len = number(&line[1..])
        .filter(|&l| l >= 0)
        .ok_or(ProtoError::BulkLength)? as usize;
    Ok(Some(data + len + 2))
}

/// Reply encoding for one protocol version (2 or 3).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Encoder {
    pub resp3: bool,
}

/// Length of a bulk string's header (`$<len>\r\n`) for `len` bytes.
pub fn bulk_header_len(len: usize) -> usize {
    3 + decimal_len(len as u64)
}

/// Write the header of a bulk string of `len` bytes into `dst`, exactly
/// [`bulk_header_len`]`(len)` bytes long.
pub fn write_bulk_header(dst: &mut [u8], len: usize) {
    assert_eq!(dst.len(), bulk_header_len(len), "room for the header");
    let last = dst.len() - 1;
    dst[0] = b'$';
    write_decimal(&mut dst[1..last - 1], len as u64);
    dst[last - 1..].copy_from_slice(b"\r\n");
}

/// The bulk string header as a reply's header line: GET's reply around a value read in place
/// ([`crate::inplace`]).
pub struct BulkHead;

impl crate::inplace::ReplyHead for BulkHead {
    fn len(&self, _: u32, len: usize) -> usize {
        bulk_header_len(len)
    }
    fn write(&self, dst: &mut [u8], _: u32, len: usize) {
        write_bulk_header(dst, len)
    }
}

impl Encoder {
    pub fn simple(&self, out: &mut Vec<u8>, s: &str) {
        out.push(b'+');
        out.extend_from_slice(s.as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    /// An error line; `msg` starts with its code (`ERR`, `WRONGTYPE`, …).
    pub fn error(&self, out: &mut Vec<u8>, msg: &str) {
        out.push(b'-');
        out.extend(msg.bytes().filter(|&b| b != b'\r' && b != b'\n'));
        out.extend_from_slice(b"\r\n");
    }

    pub fn integer(&self, out: &mut Vec<u8>, n: i64) {
        out.extend_from_slice(format!(":{n}\r\n").as_bytes());
    }

    pub fn bulk(&self, out: &mut Vec<u8>, b: &[u8]) {
        let at = out.len();
        out.resize(at + bulk_header_len(b.len()), 0);
        write_bulk_header(&mut out[at..], b.len());
        out.extend_from_slice(b);
        out.extend_from_slice(b"\r\n");
    }

    pub fn null(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(if self.resp3 { b"_\r\n" } else { b"$-1\r\n" });
    }

    pub fn array(&self, out: &mut Vec<u8>, n: usize) {
        out.extend_from_slice(format!("*{n}\r\n").as_bytes());
    }

    /// A map of `n` pairs (RESP3), or an array of 2n elements (RESP2).
    pub fn map(&self, out: &mut Vec<u8>, n: usize) {
        if self.resp3 {
            out.extend_from_slice(format!("%{n}\r\n").as_bytes());
        } else {
            self.array(out, 2 * n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cmd(words: &[&[u8]]) -> Vec<u8> {
        let mut v = format!("*{}\r\n", words.len()).into_bytes();
        for w in words {
            v.extend_from_slice(format!("${}\r\n", w.len()).as_bytes());
            v.extend_from_slice(w);
            v.extend_from_slice(b"\r\n");
        }
        v
    }

    /// What `parse` gives, with a command's arguments copied out.
    #[derive(Debug, PartialEq, Eq)]
    enum Owned {
        Command(Vec<Vec<u8>>, usize),
        Other(Parsed),
    }

    fn parse_owned(buf: &[u8], max_bulk: usize) -> Result<Owned, ProtoError> {
        let mut args = Args::default();
        Ok(match parse(buf, max_bulk, &mut args)? {
            Parsed::Command(n) => Owned::Command(
                args.with(buf, |a| a.iter().map(|w| w.to_vec()).collect()),
                n,
            ),
            other => Owned::Other(other),
        })
    }

    #[test]
    fn arguments_are_where_they_arrived_and_room_is_not_hoarded() {
        let mut args = Args::default();
        let mut buf = cmd(&[b"SET", b"k", b"v"]);
        let first = buf.len();
        buf.extend_from_slice(&cmd(&[b"GET", b"key"]));
        assert_eq!(parse(&buf, 10, &mut args), Ok(Parsed::Command(first)));
        args.with(&buf, |a| assert_eq!(a, [&b"SET"[..], b"k", b"v"]));
        let rest = &buf[first..];
        assert_eq!(parse(rest, 10, &mut args), Ok(Parsed::Command(rest.len())));
        args.with(rest, |a| assert_eq!(a, [&b"GET"[..], b"key"]));
        let many: Vec<Vec<u8>> = (0..KEPT_ARGS + 5)
            .map(|i| i.to_string().into_bytes())
            .collect();
        let refs: Vec<&[u8]> = many.iter().map(|w| w.as_slice()).collect();
        let c = cmd(&refs);
        assert_eq!(parse(&c, 10, &mut args), Ok(Parsed::Command(c.len())));
        args.with(&c, |a| assert_eq!(a, &refs[..]));
        assert_eq!(parse(&buf, 10, &mut args), Ok(Parsed::Command(first)));
        assert!(
            args.spans.capacity() <= KEPT_ARGS,
            "the room for many was let go"
        );
        let inline = b"set \"a b\" c\r\n";
        assert_eq!(
            parse(inline, 10, &mut args),
            Ok(Parsed::Command(inline.len()))
        );
        args.with(inline, |a| assert_eq!(a, [&b"set"[..], b"a b", b"c"]));
        assert_eq!(parse(&buf, 10, &mut args), Ok(Parsed::Command(first)));
        args.with(&buf, |a| {
            assert_eq!(a, [&b"SET"[..], b"k", b"v"], "no inline words left")
        });
    }

    #[test]
    fn header_numbers() {
        assert_eq!(number(b"0"), Some(0));
        assert_eq!(number(b"16384"), Some(16384));
        assert_eq!(number(b"-1"), Some(-1));
        assert_eq!(number(b"999999999999999999"), Some(999_999_999_999_999_999));
        for bad in [
            &b""[..],
            b"-",
            b"+1",
            b"1 ",
            b"1x",
            b"9999999999999999999",
            b"--1",
        ] {
            assert_eq!(number(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn multibulk_and_inline_commands() {
        let c = cmd(&[b"SET", b"k", b"v\r\nx"]);
        assert_eq!(
            parse_owned(&c, 100),
            Ok(Owned::Command(
                vec![b"SET".to_vec(), b"k".to_vec(), b"v\r\nx".to_vec()],
                c.len()
            ))
        );
        for cut in 0..c.len() {
            assert_eq!(
                parse_owned(&c[..cut], 100),
                Ok(Owned::Other(Parsed::Incomplete)),
                "cut at {cut}"
            );
        }
        assert_eq!(
            parse_owned(b"get  \"a b\" c\r\nPING\r\n", 100),
            Ok(Owned::Command(
                vec![b"get".to_vec(), b"a b".to_vec(), b"c".to_vec()],
                14
            ))
        );
        assert_eq!(
            parse_owned(b"ping\n", 100),
            Ok(Owned::Command(vec![b"ping".to_vec()], 5))
        );
        assert_eq!(
            parse_owned(b"\r\n", 100),
            Ok(Owned::Command(vec![], 2)),
            "an empty line"
        );
        assert_eq!(parse_owned(b"*0\r\n", 100), Ok(Owned::Command(vec![], 4)));
    }

    #[test]
    fn bad_framing_is_a_protocol_error() {
        assert_eq!(parse_owned(b"*x\r\n", 10), Err(ProtoError::MultibulkLength));
        assert_eq!(
            parse_owned(b"*99999999\r\n", 10),
            Err(ProtoError::MultibulkLength)
        );
        assert_eq!(
            parse_owned(b"*1\r\n:1\r\n", 10),
            Err(ProtoError::ExpectedBulk(':'))
        );
        assert_eq!(
            parse_owned(b"*1\r\n$-5\r\n", 10),
            Err(ProtoError::BulkLength)
        );
        assert_eq!(
            parse_owned(b"*1\r\n$1\r\nab\r\n", 10),
            Err(ProtoError::BulkLength)
        );
        assert_eq!(
            parse_owned(b"get \"a\r\n", 10),
            Err(ProtoError::UnbalancedQuotes)
        );
        let long = vec![b'a'; MAX_INLINE_LEN + 3];
        assert_eq!(parse_owned(&long, 10), Err(ProtoError::InlineTooLong));
        assert_eq!(
            parse_owned(&[b'*'; 40], 10),
            Err(ProtoError::MultibulkLength)
        );
    }

    #[test]
    fn an_oversize_argument_is_skipped_not_buffered() {
        let c = cmd(&[b"SET", b"k", &[b'v'; 50], b"EX", b"10"]);
        let Ok(Owned::Other(Parsed::Oversize {
            consumed,
            skip,
            args_left,
            len,
        })) = parse_owned(&c[..30], 20)
        else {
            panic!("{:?}", parse_owned(&c[..30], 20));
        };
        assert_eq!((skip, args_left, len), (52, 2, 50));
        let mut at = consumed + skip;
        for _ in 0..args_left {
            at += next_bulk_to_skip(&c[at..]).unwrap().unwrap();
        }
        assert_eq!(at, c.len(), "everything of the command is skipped");
        assert_eq!(next_bulk_to_skip(b"$3\r"), Ok(None));
    }

    #[test]
    fn replies_in_both_versions() {
        let (two, three) = (Encoder { resp3: false }, Encoder { resp3: true });
        let mut o = Vec::new();
        two.null(&mut o);
        three.null(&mut o);
        two.map(&mut o, 2);
        three.map(&mut o, 2);
        two.error(&mut o, "ERR bad\r\nline");
        two.integer(&mut o, -2);
        two.bulk(&mut o, b"");
        assert_eq!(
            o,
            b"$-1\r\n_\r\n*4\r\n%2\r\n-ERR badline\r\n:-2\r\n$0\r\n\r\n"
        );
    }

    proptest! {
        #[test]
        fn any_command_round_trips(words in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..8)) {
            let refs: Vec<&[u8]> = words.iter().map(|w| w.as_slice()).collect();
            let c = cmd(&refs);
            prop_assert_eq!(parse_owned(&c, 64), Ok(Owned::Command(words.clone(), c.len())));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_owned(&bytes, 16);
            let _ = next_bulk_to_skip(&bytes);
        }
    }
}
