//! memcached 1.6's meta commands (protocol.txt, "Meta Commands"): parsing their request lines.
//!
//! ```text
//! mn\r\n                         mg <key> <flag>*\r\n
//! ms <key> <datalen> <flag>*\r\n<data>\r\n
//! md <key> <flag>*\r\n           ma <key> <flag>*\r\n
//! ```
//! A flag is one character, some with a token after it (`T30`, `Oabc`). Errors follow what
//! memcached 1.6.18 answers (checked against it): the same texts, per command (md and ma
//! answer every flag error `invalid or duplicate flag`), and an `ms` whose line is bad after
//! its data length still has its data block thrown away.

use std::borrow::Cow;

use crate::memcached::proto::{ProtoError, MAX_KEY_LEN};

/// memcached refuses a meta line of more than 19 words (its `MFLAG_MAX_OPT_LENGTH` of 20
/// tokens counts a terminal one).
pub const MAX_META_WORDS: usize = 19;
/// memcached's limit on an opaque: 32 bytes with its `O`.
pub const MAX_OPAQUE_LEN: usize = 31;

/// Which meta command.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MetaCmd {
    Get,
    Set,
    Delete,
    Arith,
}

/// What the flags ask for (the ones that only shape the reply are read from [`Meta::flags`]).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaOpts {
    /// `b`: the key was sent in base64.
    pub base64: bool,
    /// `v`: answer the value.
    pub value: bool,
    /// `q`: suppress the common-case reply.
    pub quiet: bool,
    /// `T`: new TTL (memcached exptime).
    pub ttl: Option<i64>,
    /// `N`: create on a miss with this TTL.
    pub vivify: Option<i64>,
    /// `C`: compare with this cas unique.
    pub cas: Option<u64>,
    /// `F`: client flags to store.
    pub client_flags: Option<u32>,
    /// `M`: mode character.
    pub mode: Option<u8>,
    /// `J`: ma's initial value.
    pub initial: Option<u64>,
    /// `D`: ma's delta.
    pub delta: Option<u64>,
}

/// A parsed meta command (`mn` is [`crate::memcached::proto::Request::MetaNoop`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta<'a> {
    pub cmd: MetaCmd,
    /// The key (decoded if sent in base64).
    pub key: Cow<'a, [u8]>,
    /// The key as sent: what `k` echoes.
    pub sent_key: &'a [u8],
    /// `ms`: the data block's length (0 for the others).
    pub datalen: usize,
    /// Every flag word in request order: the reply's flags follow it.
    pub flags: Vec<&'a [u8]>,
    pub opts: MetaOpts,
}

impl Meta<'_> {
    /// The opaque to echo (`O`), if any.
    pub fn opaque(&self) -> Option<&[u8]> {
        self.flags.iter().find(|f| f[0] == b'O').map(|f| &f[1..])
    }
}

fn client_error(line: &'static str) -> ProtoError {
    ProtoError::Meta { line, skip: 0 }
}

/// Parse `mg`/`ms`/`md`/`ma` (`cmd`) with the words after it.
pub fn parse<'a>(cmd: &[u8], args: &[&'a [u8]]) -> Result<Meta<'a>, ProtoError> {
    let cmd = match cmd {
        b"mg" => MetaCmd::Get,
        b"ms" => MetaCmd::Set,
        b"md" => MetaCmd::Delete,
        _ => MetaCmd::Arith,
    };
    let (&sent_key, rest) = args.split_first().ok_or(ProtoError::WrongArity)?;
    if sent_key.len() > MAX_KEY_LEN {
        return Err(ProtoError::BadFormat);
    }
    let (datalen, flags) = match cmd {
        MetaCmd::Set => {
            let (&len, flags) = rest.split_first().ok_or(ProtoError::BadFormat)?;
            let len = std::str::from_utf8(len)
                .ok()
                .and_then(|s| s.parse::<usize>().ok());
            (len.ok_or(ProtoError::BadFormat)?, flags)
        }
        _ => (0, rest),
    };
    if args.len() + 1 > MAX_META_WORDS {
        return Err(client_error(match cmd {
            MetaCmd::Get => "CLIENT_ERROR options flags are too long\r\n",
            _ => "CLIENT_ERROR options flags too long\r\n",
        }));
    }
    let parsed = flag_opts(cmd, flags).and_then(|opts| {
        let key = if opts.base64 {
            let key = base64_decode(sent_key).ok_or("CLIENT_ERROR error decoding key\r\n")?;
            Cow::Owned(key)
        } else {
            Cow::Borrowed(sent_key)
        };
        check_mode(cmd, opts.mode)?;
        Ok((opts, key))
    });
    // memcached answers md and ma's flag errors alike, and throws away an ms's data.
    let (opts, key) = parsed.map_err(|line| match cmd {
        MetaCmd::Delete | MetaCmd::Arith
            if line.starts_with("CLIENT_ERROR opaque") || line.contains("M token") =>
        {
            client_error(line)
        }
        MetaCmd::Delete | MetaCmd::Arith => {
            client_error("CLIENT_ERROR invalid or duplicate flag\r\n")
        }
        MetaCmd::Get => client_error(line),
        MetaCmd::Set => ProtoError::Meta {
            line,
            skip: datalen.saturating_add(2),
        },
    })?;
    Ok(Meta {
        cmd,
        key,
        sent_key,
        datalen,
        flags: flags.to_vec(),
        opts,
    })
}

/// The flags' options, checked as memcached does; `Err`: the reply line.
fn flag_opts(cmd: MetaCmd, flags: &[&[u8]]) -> Result<MetaOpts, &'static str> {
    const BAD_TOKEN: &str = "CLIENT_ERROR bad token in command line format\r\n";
    let mut o = MetaOpts::default();
    let mut seen = [false; 128];
    for f in flags {
        let c = f[0];
        if c >= 127 || std::mem::replace(&mut seen[c as usize], true) {
            return Err("CLIENT_ERROR duplicate flag\r\n");
        }
        let tok = &f[1..];
        match c {
            b'b' => o.base64 = true,
            b'v' => o.value = true,
            b'q' => o.quiet = true,
            b'T' => o.ttl = Some(num(tok).ok_or(BAD_TOKEN)?),
            // A vivified item's won/already-won state (`W`, `Z`) is not kept: refused.
            b'N' if cmd == MetaCmd::Get => {
                return Err("CLIENT_ERROR flag N (vivify) not supported\r\n")
            }
            b'N' => o.vivify = Some(num(tok).ok_or(BAD_TOKEN)?),
            b'C' => o.cas = Some(num(tok).ok_or(BAD_TOKEN)?),
            b'F' => {
                let flags = num(tok).ok_or("CLIENT_ERROR bad command line format\r\n")?;
                o.client_flags = Some(flags);
            }
            b'M' if f.len() != 2 => return Err("CLIENT_ERROR incorrect length for M token\r\n"),
            b'M' => o.mode = Some(tok[0]),
            b'J' => o.initial = Some(num(tok).ok_or(BAD_TOKEN)?),
            b'D' => o.delta = Some(num(tok).ok_or(BAD_TOKEN)?),
            b'O' if tok.len() > MAX_OPAQUE_LEN => {
                return Err("CLIENT_ERROR opaque token too long\r\n")
            }
            // Answered from what is stored, or no-ops here (`u`: there is no LRU; `P`, `L`:
            // memcached's proxy hints).
            b'O' | b'k' | b's' | b't' | b'c' | b'f' | b'u' | b'P' | b'L' => {}
            b'h' | b'l' | b'R' | b'I' => refused(cmd, c)?,
            _ => return Err("CLIENT_ERROR invalid flag\r\n"),
        }
    }
    Ok(o)
}

/// The flags memcached accepts that need what Nessie does not keep: an item's access history
/// (`h`, `l`, `R`) or a stale state (`I`). Refused where they would mean something, ignored
/// elsewhere as memcached ignores them.
fn refused(cmd: MetaCmd, flag: u8) -> Result<(), &'static str> {
    match (cmd, flag) {
        (MetaCmd::Get, b'h') => Err("CLIENT_ERROR flag h (hit before) not supported\r\n"),
        (MetaCmd::Get, b'l') => Err("CLIENT_ERROR flag l (last access) not supported\r\n"),
        (MetaCmd::Get, b'R') => Err("CLIENT_ERROR flag R (recache) not supported\r\n"),
        (MetaCmd::Set | MetaCmd::Delete, b'I') => {
            Err("CLIENT_ERROR flag I (invalidate) not supported\r\n")
        }
        _ => Ok(()),
    }
}

fn check_mode(cmd: MetaCmd, mode: Option<u8>) -> Result<(), &'static str> {
    match (cmd, mode) {
        (_, None) | (MetaCmd::Get | MetaCmd::Delete, _) => Ok(()),
        (MetaCmd::Set, Some(b'E' | b'A' | b'P' | b'R' | b'S')) => Ok(()),
        (MetaCmd::Set, _) => Err("CLIENT_ERROR invalid mode for ms M token\r\n"),
        (MetaCmd::Arith, Some(b'I' | b'+' | b'D' | b'-')) => Ok(()),
        (MetaCmd::Arith, _) => Err("CLIENT_ERROR invalid mode for ma M token\r\n"),
    }
}

fn num<T: std::str::FromStr>(tok: &[u8]) -> Option<T> {
    std::str::from_utf8(tok).ok()?.parse().ok()
}

/// Standard base64 with padding, strictly (memcached refuses a key that is not).
pub fn base64_decode(s: &[u8]) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    if s.is_empty() || !s.len().is_multiple_of(4) {
        return None;
    }
    let pad = s.iter().rev().take_while(|&&c| c == b'=').count();
    if pad > 2 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    for (i, quad) in s.chunks(4).enumerate() {
        let last = i == s.len() / 4 - 1;
        let n_pad = if last { pad } else { 0 };
        let mut word = 0u32;
        for &c in &quad[..4 - n_pad] {
            word = word << 6 | sextet(c)?;
        }
        word <<= 6 * n_pad as u32;
        out.extend_from_slice(&word.to_be_bytes()[1..4 - n_pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memcached::proto::{parse_request, Request};

    fn meta(line: &str) -> Result<Meta<'_>, ProtoError> {
        match parse_request(line.as_bytes())?.expect("a whole line").0 {
            Request::Meta(m) => Ok(m),
            r => panic!("not a meta command: {r:?}"),
        }
    }

    #[test]
    fn flags_parse_into_options_in_order() {
        let m = meta("ms k 5 T30 F7 C9 MA q O1 c k\r\n").unwrap();
        assert_eq!((m.cmd, &*m.key, m.datalen), (MetaCmd::Set, &b"k"[..], 5));
        assert_eq!(
            (m.opts.ttl, m.opts.client_flags, m.opts.cas, m.opts.mode),
            (Some(30), Some(7), Some(9), Some(b'A'))
        );
        assert!(m.opts.quiet && !m.opts.value);
        assert_eq!(m.opaque(), Some(&b"1"[..]));
        assert_eq!(m.flags.len(), 8);
        let m = meta("ma n N0 J5 D2 M-\r\n").unwrap();
        assert_eq!(
            (m.opts.vivify, m.opts.initial, m.opts.delta, m.opts.mode),
            (Some(0), Some(5), Some(2), Some(b'-'))
        );
        assert_eq!(parse_request(b"mn\r\n"), Ok(Some((Request::MetaNoop, 4))));
    }

    #[test]
    fn an_ms_error_after_its_length_throws_its_data_away() {
        let e = meta("ms k 5 zz\r\n").unwrap_err();
        assert_eq!(e.reply(), b"CLIENT_ERROR invalid flag\r\n");
        assert_eq!(e.skip(), 7, "the data and its \\r\\n");
        assert_eq!(meta("ms k x\r\n").unwrap_err().skip(), 0);
        assert_eq!(meta("mg k zz\r\n").unwrap_err().skip(), 0);
    }

    #[test]
    fn base64_is_strict() {
        assert_eq!(base64_decode(b"Zm9v").as_deref(), Some(&b"foo"[..]));
        assert_eq!(base64_decode(b"Zm8=").as_deref(), Some(&b"fo"[..]));
        assert_eq!(base64_decode(b"Zg==").as_deref(), Some(&b"f"[..]));
        assert_eq!(base64_decode(b"AP8A").as_deref(), Some(&[0, 255, 0][..]));
        for bad in [&b""[..], b"Zm9", b"Zm9v=", b"Z===", b"Zm=v", b"Zm9#"] {
            assert_eq!(base64_decode(bad), None, "{bad:?}");
        }
        let m = meta("mg Zm9v b k\r\n").unwrap();
        assert_eq!((&*m.key, m.sent_key), (&b"foo"[..], &b"Zm9v"[..]));
    }
}
