//! Read-modify-write over the store's conditional writes, shared by both front ends: read a
//! key with its version, decide what to write from what was read, and write it only if the
//! key is still at that version; if another write got in between, read again and decide
//! again, up to [`MAX_RMW_ATTEMPTS`] times. A check followed by a plain put would lose the
//! other write; this never does.
//!
//! The condition is always the version read (or absence), never the item's liveness: an
//! expired item is absent to the protocols but still stored, so a write that treats it as
//! absent conditions on its exact version, not on [`Cond::Absent`].

use nessie_protocols::{Cond, CondOutcome, Error, KvClient, Version};

use crate::item::{self, Item};

/// How many times a read-modify-write is tried before the command gives up and answers that
/// the key is contended (each failure means another client's write took effect, so the
/// store as a whole progresses).
pub const MAX_RMW_ATTEMPTS: usize = 16;

/// Why a command gave up, as the protocols' error text.
pub fn contended_msg() -> String {
    format!("key contended: {MAX_RMW_ATTEMPTS} attempts in a row lost to concurrent writes")
}

/// What a read-modify-write saw: the key's version (`None`: not stored) and its item (`None`:
/// absent or expired). After a head read ([`rmw_head`]) the item's data may be cut short.
#[derive(Copy, Clone, Debug)]
pub struct Seen<'a> {
    pub version: Option<Version>,
    pub item: Option<Item<'a>>,
}

/// What to do after reading: the answer `T` stands once the write (if any) takes effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change<T> {
    /// Write nothing.
    Keep(T),
    /// Store this value (an encoded item, [`item::encode`]).
    Put(Vec<u8>, T),
    /// Remove the key.
    Delete(T),
}

impl<T> Change<T> {
    /// Store `data` (the concatenation of `parts`) with `flags`, expiring at `expires` (Unix
    /// ms, 0 = never; `None`: already expired, so the key is removed instead).
    pub fn store(flags: u32, expires: Option<u64>, parts: &[&[u8]], then: T) -> Change<T> {
        match expires {
            None => Change::Delete(then),
            Some(at) => {
                let mut v = Vec::new();
                item::encode_parts(&mut v, flags, at, parts);
                Change::Put(v, then)
            }
        }
    }
}

/// One attempt's result.
pub enum Attempt<T> {
    Done(T),
    /// The key changed between the read and the write: nothing was written.
    Lost,
}

/// One read-modify-write attempt on `key` at `now_ms`, with `buf` as the read's buffer; the
/// read covers at least the value's first `head` bytes (`usize::MAX`: all of it).
pub fn attempt<T>(
    c: &mut dyn KvClient,
    key: &[u8],
    now_ms: u64,
    buf: &mut Vec<u8>,
    head: usize,
    f: &mut dyn FnMut(Seen<'_>) -> Change<T>,
) -> Result<Attempt<T>, Error> {
    let version = match head {
        usize::MAX => c.get_versioned(key, buf)?,
        head => c.get_versioned_head(key, buf, head)?,
    };
    let item = version.and_then(|_| item::decode(buf, now_ms));
    let change = f(Seen { version, item });
    let cond = version.map_or(Cond::Absent, Cond::Version);
    let outcome = match change {
        Change::Keep(t) => return Ok(Attempt::Done(t)),
        // Nothing stored: nothing to remove.
        Change::Delete(t) if version.is_none() => return Ok(Attempt::Done(t)),
        Change::Delete(t) => (c.delete_if(key, cond)?, t),
        Change::Put(v, t) => {
            let at = item::store_expiry(item::expiry_of(&v));
            (c.put_if_expiring(key, &v, cond, at)?, t)
        }
    };
    Ok(match outcome {
        (CondOutcome::Stored, t) => Attempt::Done(t),
        (CondOutcome::Unmet { .. }, _) => Attempt::Lost,
    })
}

/// Read-modify-write `key` until a write takes effect without another in between: `Ok(None)`
/// if [`MAX_RMW_ATTEMPTS`] attempts all lost (the key is contended).
pub fn rmw<T>(
    c: &mut dyn KvClient,
    key: &[u8],
    now_ms: u64,
    buf: &mut Vec<u8>,
    f: impl FnMut(Seen<'_>) -> Change<T>,
) -> Result<Option<T>, Error> {
    rmw_reading(c, key, now_ms, buf, usize::MAX, f)
}

/// [`rmw`] for a change decided from the item's header alone (whether it is live, its flags
/// and expiry), such as a DELETE: the read covers the header, and a large item's chunks past
/// it are not read (`KvClient::get_versioned_head`). `Seen::item`'s data may be cut short.
pub fn rmw_head<T>(
    c: &mut dyn KvClient,
    key: &[u8],
    now_ms: u64,
    buf: &mut Vec<u8>,
    f: impl FnMut(Seen<'_>) -> Change<T>,
) -> Result<Option<T>, Error> {
    rmw_reading(c, key, now_ms, buf, item::HEADER_LEN, f)
}

/// [`rmw`] whose reads cover at least the value's first `head` bytes (`usize::MAX`: all of
/// it; fewer only through [`KvClient::get_versioned_head`]).
pub fn rmw_reading<T>(
    c: &mut dyn KvClient,
    key: &[u8],
    now_ms: u64,
    buf: &mut Vec<u8>,
    head: usize,
    mut f: impl FnMut(Seen<'_>) -> Change<T>,
) -> Result<Option<T>, Error> {
    for _ in 0..MAX_RMW_ATTEMPTS {
        if let Attempt::Done(t) = attempt(c, key, now_ms, buf, head, &mut f)? {
            return Ok(Some(t));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{MapClient, RacingClient};

    const NOW: u64 = 1_800_000_000_000;

    fn incr(c: &mut dyn KvClient, buf: &mut Vec<u8>) -> Option<u64> {
        rmw(c, b"n", NOW, buf, |s| {
            let n = s.item.map_or(0, |i| i.data[0] as u64) + 1;
            Change::store(0, Some(0), &[&[n as u8]], n)
        })
        .unwrap()
    }

    #[test]
    fn a_write_between_read_and_write_is_not_lost() {
        let mut c = RacingClient::new(MapClient::default(), 1, |m: &mut MapClient| {
            let mut v = Vec::new();
            item::encode(&mut v, 0, 0, &[10]);
            m.put(b"n", &v).unwrap();
        });
        let mut buf = Vec::new();
        assert_eq!(
            incr(&mut c, &mut buf),
            Some(11),
            "read again after the race"
        );
        assert_eq!(c.races_run(), 1);
    }

    #[test]
    fn gives_up_after_the_limit() {
        let mut c = RacingClient::new(MapClient::default(), usize::MAX, |m: &mut MapClient| {
            m.put(b"n", b"other").unwrap();
        });
        let mut buf = Vec::new();
        assert_eq!(incr(&mut c, &mut buf), None);
        assert_eq!(c.races_run(), MAX_RMW_ATTEMPTS);
    }

    #[test]
    fn an_expired_item_is_absent_but_conditioned_on_its_version() {
        let mut m = MapClient::default();
        let mut v = Vec::new();
        item::encode(&mut v, 0, NOW - 1, &[5]);
        m.put(b"n", &v).unwrap();
        let mut buf = Vec::new();
        let mut seen = None;
        let r = rmw(&mut m, b"n", NOW, &mut buf, |s| {
            seen = Some((s.version, s.item.is_some()));
            Change::Delete(())
        });
        assert_eq!(r.unwrap(), Some(()));
        assert_eq!(seen, Some((Some(1), false)));
        assert!(m.0.is_empty(), "removed by its version");
    }
}
