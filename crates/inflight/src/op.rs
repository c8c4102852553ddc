//! The operations a [`Pipeline`](crate::Pipeline) runs, and what each returns: the blocking
//! [`KvClient`] calls, as values.

use nessie_protocols::{Cond, CondOutcome, Error, KvClient, Version};

/// One operation, owning its key and value (it outlives the call that submitted it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Get {
        key: Vec<u8>,
    },
    /// [`KvClient::get_versioned`].
    GetVersioned {
        key: Vec<u8>,
    },
    /// `expires_ns` 0: never ([`KvClient::put_parts_expiring`]).
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        expires_ns: u64,
    },
    Delete {
        key: Vec<u8>,
    },
    PutIf {
        key: Vec<u8>,
        value: Vec<u8>,
        cond: Cond,
        expires_ns: u64,
    },
    DeleteIf {
        key: Vec<u8>,
        cond: Cond,
    },
    /// [`nessie_protocols::read_modify_write`]: read with the version, write back under it.
    ReadModifyWrite {
        key: Vec<u8>,
        value: Vec<u8>,
    },
}

impl Op {
    pub fn get(key: impl Into<Vec<u8>>) -> Self {
        Op::Get { key: key.into() }
    }

    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Op::Put {
            key: key.into(),
            value: value.into(),
            expires_ns: 0,
        }
    }

    pub fn delete(key: impl Into<Vec<u8>>) -> Self {
        Op::Delete { key: key.into() }
    }

    /// The key: operations on one key run one at a time, in submission order.
    pub fn key(&self) -> &[u8] {
        match self {
            Op::Get { key }
            | Op::GetVersioned { key }
            | Op::Put { key, .. }
            | Op::Delete { key }
            | Op::PutIf { key, .. }
            | Op::DeleteIf { key, .. }
            | Op::ReadModifyWrite { key, .. } => key,
        }
    }

    /// Run it on `client`, blocking (inside a slot's coroutine, suspending at each fabric step;
    /// outside a pipeline, as the blocking call would).
    pub fn run<C: KvClient + ?Sized>(&self, client: &mut C) -> Result<Outcome, Error> {
        self.run_into(client, &mut Vec::new())
    }

    /// [`Self::run`], a GET reading its value into `buf` (taken: the outcome carries it), whose
    /// allocation and old contents a value of the same length reuses without zero-filling.
    /// Other operations leave `buf` alone.
    pub fn run_into<C: KvClient + ?Sized>(
        &self,
        client: &mut C,
        buf: &mut Vec<u8>,
    ) -> Result<Outcome, Error> {
        Ok(match self {
            Op::Get { key } => {
                let mut v = std::mem::take(buf);
                match client.get_into(key, &mut v) {
                    Ok(true) => Outcome::Got(Some(v)),
                    // No value to carry: the buffer stays the caller's.
                    r => {
                        *buf = v;
                        Outcome::Got(r?.then(Vec::new))
                    }
                }
            }
            Op::GetVersioned { key } => {
                let mut v = std::mem::take(buf);
                match client.get_versioned(key, &mut v) {
                    Ok(Some(ver)) => Outcome::GotVersioned(Some((v, ver))),
                    r => {
                        *buf = v;
                        Outcome::GotVersioned(r?.map(|ver| (Vec::new(), ver)))
                    }
                }
            }
            Op::Put {
                key,
                value,
                expires_ns: 0,
            } => client.put(key, value).map(|()| Outcome::Put)?,
            Op::Put {
                key,
                value,
                expires_ns,
            } => client
                .put_parts_expiring(key, &[value], *expires_ns)
                .map(|()| Outcome::Put)?,
            Op::Delete { key } => client.delete(key).map(|()| Outcome::Deleted)?,
            Op::PutIf {
                key,
                value,
                cond,
                expires_ns,
            } => Outcome::Cond(client.put_if_expiring(key, value, *cond, *expires_ns)?),
            Op::DeleteIf { key, cond } => Outcome::Cond(client.delete_if(key, *cond)?),
            Op::ReadModifyWrite { key, value } => {
                nessie_protocols::read_modify_write(client, key, value, &mut Vec::new())?;
                Outcome::Put
            }
        })
    }
}

/// What an operation returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A GET's value (`None`: absent).
    Got(Option<Vec<u8>>),
    /// A versioned GET's value and version.
    GotVersioned(Option<(Vec<u8>, Version)>),
    Put,
    Deleted,
    /// A conditional write's outcome.
    Cond(CondOutcome),
}
