//! Request and response slots: the registered memory through which SD (and HY's writes) send
//! operations to the owner node's server threads and get their results back.
//!
//! Every node registers two extra regions:
//! - [`REQUEST_REGION`]: one *request slot* per client worker of the cluster
//!   (`nodes × max_clients_per_node` slots; client `(node c, local l)` uses slot
//!   `c × max_clients_per_node + l` on every node). Written by the client (remote WRITE, or a
//!   direct write when the client is on the owner), polled by the owner's server threads.
//! - [`RESPONSE_REGION`]: one *response slot* per (local client worker, server node) pair
//!   (`max_clients_per_node × nodes` slots; slot `l × nodes + s` receives the responses of node
//!   `s` to local client `l`). Written by the server (remote WRITE, or direct when the client
//!   is local), polled by the client in its own memory. One slot per server node (rather than
//!   one per client) means that only one node ever writes a given response slot, so a late
//!   response to a request that timed out can never interleave with another node's response.
//!
//! Both slot kinds are filled *right-aligned*: a message ends at the end of its slot, so one
//! WRITE of exactly the message's size (not the slot's) carries it. The last word is the
//! *control word* (sequence number and op or status) that pollers watch; the word before it is a
//! *checksum* of the rest of the message seeded with the sequence number. The fabric promises
//! single-copy atomicity of aligned words and order between operations, but not the order in
//! which the words of one WRITE land (UCX over shared memory and TCP copies with `memcpy`; see
//! `docs/fabric.md`). So a poller that sees a new control word may still read parts of the
//! previous message below it: it reads the control word first, then the rest, and accepts the
//! message only if the checksum matches (Pilaf's self-verifying entries); otherwise the WRITE is
//! still landing and it polls again. One WRITE per message, as in HERD, on any backend.
//!
//! ```text
//! request slot (R = 24 + key_max↑8 + value_max↑8 bytes)
//! R-24-K-V   K = key_len↑8     key (zero padded)
//! R-24-V     V = value_len↑8   value (zero padded)
//! R-24       8                 lengths: key length (bits 0..31), value length (bits 32..63)
//! R-16       8                 checksum of key, value and lengths, seeded with the sequence number
//! R-8        8                 control: sequence number (bits 8..63) | op (bits 0..7)
//!
//! response slot (P = 48 + max(value_max, MAX_ERROR_MESSAGE)↑8 bytes)
//! P-48-L     L = len↑8         payload: the value (GET hit) or an error message
//! P-48       8                 argument c  ┐
//! P-40       8                 argument b  ├ error details (e.g. DataTableFull's node,
//! P-32       8                 argument a  ┘ entry size and entries awaiting expiry)
//! P-24       8                 payload length (bits 0..31)
//! P-16       8                 checksum of payload, arguments and length, seeded with the sequence number
//! P-8        8                 control: sequence number (bits 8..63) | status (bits 0..7)
//! ```
//! A zero control word means "nothing yet" (registered memory starts zeroed): sequence numbers
//! start at 1. A request is new to a server when its sequence number differs from the last one
//! it served in that slot; a response is the awaited one when its sequence number equals the
//! request's.

use nessie_fabric::{FabricError, NodeId, RegionId};
use nessie_store::Geometry;

use nessie_protocols::Error;

/// A request or response slot that holds something no well-behaved peer writes. Servers answer
/// such a request with `Error::Corrupt` carrying this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    #[error("unknown op {0} in a request")]
    UnknownOp(u8),
    #[error(
        "request lengths out of range: key {key} (max {key_max}), value {value} (max {value_max})"
    )]
    RequestLengths {
        key: u32,
        key_max: u32,
        value: u32,
        value_max: u32,
    },
    #[error("response payload of {0} bytes exceeds the slot")]
    ResponsePayload(u64),
    /// Reading the slot from local memory failed.
    #[error(transparent)]
    Read(#[from] FabricError),
}

/// Region of every node holding the request slots (SD / HY only).
pub const REQUEST_REGION: RegionId = 3;
/// Region of every node holding the response slots (SD / HY only).
pub const RESPONSE_REGION: RegionId = 4;
/// Most client workers per node that SD/HY can serve (each needs a request slot on every node).
pub const MAX_CLIENTS_PER_NODE: u16 = 1024;
/// Longest error message carried in a response (longer ones are truncated).
pub const MAX_ERROR_MESSAGE: usize = 256;
/// Largest request or response region of one node.
pub const MAX_RPC_REGION_BYTES: u64 = 1 << 40;
/// Largest sequence number (56 bits); a client slot is unusable after that many requests.
pub const MAX_SEQ: u64 = (1 << 56) - 1;

/// Lengths, checksum, control.
const REQ_TAIL: u64 = 24;
/// Arguments c, b, a, length, checksum, control.
const RESP_TAIL: u64 = 48;

fn pad8(n: u64) -> u64 {
    n.div_ceil(8) * 8
}

fn word(buf: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(buf[off..off + 8].try_into().unwrap())
}

/// Checksum of a message (whole words), seeded with its sequence number: a folded 64×64→128-bit
/// multiply per word (wyhash-style) and a final avalanche. It only has to tell a fully landed
/// message from one mixed with the remains of an earlier one, not resist an adversary.
pub fn checksum(seq: u64, parts: &[&[u8]]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    const M: u64 = 0xA076_1D64_78BD_642F;
    let mut h = seq ^ 0x6e65_7373_6965_5344;
    let mut n = 0u64;
    for p in parts {
        debug_assert_eq!(p.len() % 8, 0);
        for c in p.chunks_exact(8) {
            let x = (h ^ u64::from_le_bytes(c.try_into().unwrap())) as u128 * (M ^ n) as u128;
            h = (x as u64) ^ ((x >> 64) as u64);
            n = n.wrapping_add(K);
        }
    }
    // fmix64 (MurmurHash3)
    h ^= n;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The operation a request asks for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpCode {
    Get = 1,
    Put = 2,
    Delete = 3,
}

impl OpCode {
    pub fn from_u8(b: u8) -> Option<Self> {
        match b {
            1 => Some(OpCode::Get),
            2 => Some(OpCode::Put),
            3 => Some(OpCode::Delete),
            _ => None,
        }
    }
}

/// What a server answers: the value for a GET hit, `None` for a GET miss or a completed
/// PUT/DELETE, or the error the operation ended with.
pub type Reply = Result<Option<Vec<u8>>, Error>;

/// Response status codes (low byte of the response control word).
mod status {
    pub const OK: u8 = 1;
    pub const VALUE: u8 = 2;
    pub const EMPTY_KEY: u8 = 16;
    pub const KEY_TOO_LARGE: u8 = 17;
    pub const VALUE_TOO_LARGE: u8 = 18;
    pub const INDEX_FULL: u8 = 19;
    pub const DATA_TABLE_FULL: u8 = 20;
    pub const TIMEOUT: u8 = 21;
    pub const CONTENDED: u8 = 22;
    pub const UNREACHABLE: u8 = 23;
    pub const CORRUPT: u8 = 24;
    pub const CONFIG: u8 = 25;
    /// Any other error, carried as its message.
    pub const OTHER: u8 = 26;
}

/// A decoded request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub seq: u64,
    pub op: OpCode,
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// What a poller finds in a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Polled<T> {
    /// Not the message looked for (never written, already served, or another sequence number).
    Nothing,
    /// The control word of the message is there but not all of the rest yet.
    Landing,
    Ready(T),
}

/// Sizes and offsets of the request and response slots of one cluster.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SlotLayout {
    pub nodes: u32,
    pub max_clients_per_node: u16,
    pub key_max: u32,
    pub value_max: u32,
    /// Bytes of one request slot.
    pub request_slot: u64,
    /// Bytes of one response slot.
    pub response_slot: u64,
}

impl SlotLayout {
    /// Slots sized for `g`'s largest key and value, for `max_clients_per_node` client workers
    /// on each node.
    pub fn new(g: &Geometry, max_clients_per_node: u16) -> Result<Self, Error> {
        if max_clients_per_node == 0 || max_clients_per_node > MAX_CLIENTS_PER_NODE {
            return Err(Error::Config(format!(
                "max_clients_per_node = {max_clients_per_node} is not in 1..={MAX_CLIENTS_PER_NODE}"
            )));
        }
        let request_slot = REQ_TAIL + pad8(g.key_max as u64) + pad8(g.value_max as u64);
        let response_slot = RESP_TAIL + pad8((g.value_max as u64).max(MAX_ERROR_MESSAGE as u64));
        let l = Self {
            nodes: g.nodes,
            max_clients_per_node,
            key_max: g.key_max,
            value_max: g.value_max,
            request_slot,
            response_slot,
        };
        for (what, bytes) in [
            ("request", l.request_region_bytes()),
            ("response", l.response_region_bytes()),
        ] {
            if bytes > MAX_RPC_REGION_BYTES {
                return Err(Error::Config(format!(
                    "{what} region of {bytes} bytes per node exceeds {MAX_RPC_REGION_BYTES} \
                     (lower max_clients_per_node or value_max)"
                )));
            }
        }
        Ok(l)
    }

    /// Bytes of each node's request region.
    pub fn request_region_bytes(&self) -> u64 {
        (self.nodes as u64 * self.max_clients_per_node as u64).saturating_mul(self.request_slot)
    }

    /// Bytes of each node's response region.
    pub fn response_region_bytes(&self) -> u64 {
        (self.nodes as u64 * self.max_clients_per_node as u64).saturating_mul(self.response_slot)
    }

    /// Number of client workers the cluster can have (= request slots per node).
    pub fn clients(&self) -> u32 {
        self.nodes * self.max_clients_per_node as u32
    }

    /// Cluster-wide number of client `(node, local)`: its request slot on every node.
    pub fn client_index(&self, node: NodeId, local: u16) -> u32 {
        debug_assert!((node as u32) < self.nodes && local < self.max_clients_per_node);
        node as u32 * self.max_clients_per_node as u32 + local as u32
    }

    /// The `(node, local)` of a client index.
    pub fn client_of(&self, index: u32) -> (NodeId, u16) {
        let m = self.max_clients_per_node as u32;
        ((index / m) as NodeId, (index % m) as u16)
    }

    /// Offset of client `index`'s request slot in every node's request region.
    pub fn request_offset(&self, index: u32) -> u64 {
        index as u64 * self.request_slot
    }

    /// Offset, in the client's node's response region, of the slot where `server_node`
    /// answers local client `local`.
    pub fn response_offset(&self, local: u16, server_node: NodeId) -> u64 {
        (local as u64 * self.nodes as u64 + server_node as u64) * self.response_slot
    }

    // ---- requests ----

    /// Encode a request into `buf`; returns the offset within the slot at which `buf` must be
    /// written (in one WRITE: the control word is its last word). Sizes must be checked by the
    /// caller.
    pub fn encode_request(
        &self,
        buf: &mut Vec<u8>,
        seq: u64,
        op: OpCode,
        key: &[u8],
        value: &[u8],
    ) -> u64 {
        assert!(key.len() <= self.key_max as usize && value.len() <= self.value_max as usize);
        assert!(
            (1..=MAX_SEQ).contains(&seq),
            "sequence number {seq} out of range"
        );
        let k = pad8(key.len() as u64) as usize;
        let v = pad8(value.len() as u64) as usize;
        buf.clear();
        buf.resize(k + v + REQ_TAIL as usize, 0);
        buf[..key.len()].copy_from_slice(key);
        buf[k..k + value.len()].copy_from_slice(value);
        let lens = key.len() as u64 | (value.len() as u64) << 32;
        buf[k + v..k + v + 8].copy_from_slice(&lens.to_le_bytes());
        let sum = checksum(seq, &[&buf[..k + v + 8]]);
        buf[k + v + 8..k + v + 16].copy_from_slice(&sum.to_le_bytes());
        buf[k + v + 16..].copy_from_slice(&(seq << 8 | op as u64).to_le_bytes());
        self.request_slot - buf.len() as u64
    }

    /// Offset within a request slot of its control word.
    pub fn request_ctrl_offset(&self) -> u64 {
        self.request_slot - 8
    }

    /// Offset within a request slot of its lengths and checksum words (16 bytes, read together
    /// after the control word).
    pub fn request_meta_offset(&self) -> u64 {
        self.request_slot - REQ_TAIL
    }

    /// Split a request control word: `None` if the slot has never been written, else the
    /// sequence number and the raw op byte.
    pub fn parse_request_ctrl(w: u64) -> Option<(u64, u8)> {
        (w != 0).then_some((w >> 8, w as u8))
    }

    /// Key and value lengths from the 16 meta bytes (lengths, checksum), checked against the
    /// slot's capacity. (Every word a valid client ever wrote passes, so a failure means a
    /// malformed request, not one still landing.)
    pub fn parse_request_lens(&self, meta: &[u8]) -> Result<(usize, usize), SlotError> {
        let w = word(meta, 0);
        let (k, v) = (w as u32, (w >> 32) as u32);
        if k > self.key_max || v > self.value_max {
            return Err(SlotError::RequestLengths {
                key: k,
                key_max: self.key_max,
                value: v,
                value_max: self.value_max,
            });
        }
        Ok((k as usize, v as usize))
    }

    /// Offset within a request slot, and length, of the body (key and value) of a request with
    /// these lengths.
    pub fn request_body(&self, key_len: usize, value_len: usize) -> (u64, usize) {
        let len = pad8(key_len as u64) + pad8(value_len as u64);
        (self.request_slot - REQ_TAIL - len, len as usize)
    }

    /// Key and value within a body read from [`Self::request_body`].
    pub fn split_body(body: &[u8], key_len: usize, value_len: usize) -> (&[u8], &[u8]) {
        let k = pad8(key_len as u64) as usize;
        (&body[..key_len], &body[k..k + value_len])
    }

    /// Whether a body and meta read after control word `seq` form the complete request.
    pub fn request_complete(seq: u64, body: &[u8], meta: &[u8]) -> bool {
        checksum(seq, &[body, &meta[..8]]) == word(meta, 8)
    }

    /// Decode a whole request slot image the way a server reads it (control word, meta,
    /// body, checksum) and tell whether it holds a request other than `last_seq`. For tests and
    /// tools; servers read the pieces separately.
    pub fn decode_request<'a>(
        &self,
        slot: &'a [u8],
        last_seq: u64,
    ) -> Result<Polled<Request<'a>>, SlotError> {
        assert_eq!(slot.len() as u64, self.request_slot);
        let Some((seq, op)) =
            Self::parse_request_ctrl(word(slot, self.request_ctrl_offset() as usize))
        else {
            return Ok(Polled::Nothing);
        };
        if seq == last_seq {
            return Ok(Polled::Nothing);
        }
        let op = OpCode::from_u8(op).ok_or(SlotError::UnknownOp(op))?;
        let m = self.request_meta_offset() as usize;
        let meta = &slot[m..m + 16];
        let (k, v) = self.parse_request_lens(meta)?;
        let (off, len) = self.request_body(k, v);
        let body = &slot[off as usize..off as usize + len];
        if !Self::request_complete(seq, body, meta) {
            return Ok(Polled::Landing);
        }
        let (key, value) = Self::split_body(body, k, v);
        Ok(Polled::Ready(Request {
            seq,
            op,
            key,
            value,
        }))
    }

    // ---- responses ----

    /// Encode the response to request `seq` into `buf`; returns the offset within the
    /// response slot at which `buf` must be written (in one WRITE).
    pub fn encode_response(&self, buf: &mut Vec<u8>, seq: u64, reply: &Reply) -> u64 {
        assert!(
            (1..=MAX_SEQ).contains(&seq),
            "sequence number {seq} out of range"
        );
        let msg;
        let (st, args, payload): (u8, [u64; 3], &[u8]) = match reply {
            Ok(None) => (status::OK, [0; 3], &[]),
            Ok(Some(v)) => (status::VALUE, [0; 3], v.as_slice()),
            Err(e) => {
                let (st, args, text) = encode_error(e);
                msg = text;
                (st, args, truncate(&msg))
            }
        };
        assert!(
            payload.len() as u64 <= self.response_slot - RESP_TAIL,
            "payload does not fit the response slot"
        );
        let p = pad8(payload.len() as u64) as usize;
        buf.clear();
        buf.resize(p + RESP_TAIL as usize, 0);
        buf[..payload.len()].copy_from_slice(payload);
        let [a, b, c] = args;
        for (i, w) in [c, b, a, payload.len() as u64].into_iter().enumerate() {
            buf[p + 8 * i..p + 8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        let sum = checksum(seq, &[&buf[..p + 32]]);
        buf[p + 32..p + 40].copy_from_slice(&sum.to_le_bytes());
        buf[p + 40..].copy_from_slice(&(seq << 8 | st as u64).to_le_bytes());
        self.response_slot - buf.len() as u64
    }

    /// Offset within a response slot of its control word.
    pub fn response_ctrl_offset(&self) -> u64 {
        self.response_slot - 8
    }

    /// Offset within a response slot of the 40 bytes holding arguments c, b, a, the payload
    /// length and the checksum (read in one go after the control word).
    pub fn response_tail_offset(&self) -> u64 {
        self.response_slot - RESP_TAIL
    }

    /// Whether a payload (padded, as read) and tail read after control word `seq` form the
    /// complete response.
    pub fn response_complete(seq: u64, payload_padded: &[u8], tail: &[u8]) -> bool {
        checksum(seq, &[payload_padded, &tail[..32]]) == word(tail, 32)
    }

    /// Split a response control word into sequence number and status.
    pub fn parse_response_ctrl(w: u64) -> (u64, u8) {
        (w >> 8, w as u8)
    }

    /// Payload length from the 40-byte tail; checked against the slot.
    pub fn response_payload_len(&self, tail: &[u8]) -> Result<usize, SlotError> {
        let len = word(tail, 24) as u32 as u64;
        if len > self.response_slot - RESP_TAIL {
            return Err(SlotError::ResponsePayload(len));
        }
        Ok(len as usize)
    }

    /// Offset within a response slot, and length to read, of a payload of `len` bytes.
    pub fn response_payload(&self, len: usize) -> (u64, usize) {
        let p = pad8(len as u64);
        (self.response_slot - RESP_TAIL - p, p as usize)
    }

    /// The reply from a status, the 40-byte tail and the payload (`len` bytes, unpadded).
    /// `server` names the node that answered (used in messages of errors it reports).
    pub fn decode_reply(status: u8, tail: &[u8], payload: &[u8], server: NodeId) -> Reply {
        let (c, b, a) = (word(tail, 0), word(tail, 8), word(tail, 16));
        let text = || String::from_utf8_lossy(payload).into_owned();
        Err(match status {
            status::OK => return Ok(None),
            status::VALUE => return Ok(Some(payload.to_vec())),
            status::EMPTY_KEY => Error::EmptyKey,
            status::KEY_TOO_LARGE => Error::KeyTooLarge {
                len: a as usize,
                max: b as u32,
            },
            status::VALUE_TOO_LARGE => Error::ValueTooLarge {
                len: a as usize,
                max: b as u32,
            },
            status::INDEX_FULL => Error::IndexFull { depth: a as u8 },
            status::DATA_TABLE_FULL => Error::DataTableFull {
                node: a as NodeId,
                entry_size: b,
                awaiting_expiry: c,
            },
            status::TIMEOUT => Error::Timeout { expiry_ms: a },
            status::CONTENDED => Error::Contended { attempts: a as u32 },
            status::UNREACHABLE => Error::Unreachable {
                node: a as NodeId,
                reason: text(),
            },
            status::CORRUPT => Error::Corrupt(text()),
            status::CONFIG => Error::Config(text()),
            status::OTHER => Error::Fabric(FabricError::Transport(format!(
                "server on node {server}: {}",
                text()
            ))),
            s => Error::Corrupt(format!("unknown response status {s} from node {server}")),
        })
    }

    /// Decode a whole response slot image the way a client reads it, looking for the
    /// response to `seq`. For tests and tools.
    pub fn decode_response(
        &self,
        slot: &[u8],
        seq: u64,
        server: NodeId,
    ) -> Result<Polled<Reply>, SlotError> {
        assert_eq!(slot.len() as u64, self.response_slot);
        let (s, st) = Self::parse_response_ctrl(word(slot, self.response_ctrl_offset() as usize));
        if s != seq {
            return Ok(Polled::Nothing);
        }
        let t = self.response_tail_offset() as usize;
        let tail = &slot[t..t + 40];
        let len = self.response_payload_len(tail)?;
        let (off, padded) = self.response_payload(len);
        let payload = &slot[off as usize..off as usize + padded];
        if !Self::response_complete(seq, payload, tail) {
            return Ok(Polled::Landing);
        }
        Ok(Polled::Ready(Self::decode_reply(
            st,
            tail,
            &payload[..len],
            server,
        )))
    }
}

fn truncate(msg: &str) -> &[u8] {
    let mut end = msg.len().min(MAX_ERROR_MESSAGE);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    &msg.as_bytes()[..end]
}

/// Status, arguments (a, b, c) and message of an error.
fn encode_error(e: &Error) -> (u8, [u64; 3], String) {
    let none = String::new();
    match e {
        Error::EmptyKey => (status::EMPTY_KEY, [0; 3], none),
        Error::KeyTooLarge { len, max } => {
            (status::KEY_TOO_LARGE, [*len as u64, *max as u64, 0], none)
        }
        Error::ValueTooLarge { len, max } => {
            (status::VALUE_TOO_LARGE, [*len as u64, *max as u64, 0], none)
        }
        Error::IndexFull { depth } => (status::INDEX_FULL, [*depth as u64, 0, 0], none),
        Error::DataTableFull {
            node,
            entry_size,
            awaiting_expiry,
        } => (
            status::DATA_TABLE_FULL,
            [*node as u64, *entry_size, *awaiting_expiry],
            none,
        ),
        Error::Timeout { expiry_ms } => (status::TIMEOUT, [*expiry_ms, 0, 0], none),
        Error::Contended { attempts } => (status::CONTENDED, [*attempts as u64, 0, 0], none),
        Error::Unreachable { node, reason } => {
            (status::UNREACHABLE, [*node as u64, 0, 0], reason.clone())
        }
        Error::Corrupt(m) => (status::CORRUPT, [0; 3], m.clone()),
        Error::Config(m) => (status::CONFIG, [0; 3], m.clone()),
        // Fabric errors (and any variant added later) travel as their message.
        e => (status::OTHER, [0; 3], e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> SlotLayout {
        let g = Geometry {
            nodes: 3,
            key_max: 20,
            value_max: 100,
            ..Geometry::default()
        };
        SlotLayout::new(&g, 4).unwrap()
    }

    /// Write `buf` into a slot image at `off` (what one fabric WRITE does, once it has landed).
    fn place(slot: &mut [u8], off: u64, buf: &[u8]) {
        assert_eq!(
            off as usize + buf.len(),
            slot.len(),
            "messages end at the end of the slot"
        );
        assert_eq!(off % 8, 0);
        slot[off as usize..].copy_from_slice(buf);
    }

    fn ready<T: std::fmt::Debug>(p: Polled<T>) -> T {
        match p {
            Polled::Ready(t) => t,
            other => panic!("expected a ready message, got {other:?}"),
        }
    }

    #[test]
    fn sizes_and_offsets() {
        let l = layout();
        assert_eq!(l.request_slot, 24 + 24 + 104);
        assert_eq!(
            l.response_slot,
            48 + 256,
            "error messages need room even with small values"
        );
        assert_eq!(l.request_region_bytes(), 12 * l.request_slot);
        assert_eq!(l.response_region_bytes(), 12 * l.response_slot);
        assert_eq!(l.client_index(2, 3), 11);
        assert_eq!(l.client_of(11), (2, 3));
        assert_eq!(l.request_offset(11), 11 * l.request_slot);
        assert_eq!(l.response_offset(3, 1), 10 * l.response_slot);
        let big = Geometry {
            value_max: 4096,
            ..Geometry::default()
        };
        assert_eq!(SlotLayout::new(&big, 1).unwrap().response_slot, 48 + 4096);
    }

    #[test]
    fn limits_are_enforced() {
        let g = Geometry::default();
        assert!(SlotLayout::new(&g, 0)
            .unwrap_err()
            .to_string()
            .contains("max_clients_per_node"));
        assert!(SlotLayout::new(&g, MAX_CLIENTS_PER_NODE + 1).is_err());
        let huge = Geometry {
            nodes: 4096,
            value_max: 64 << 20,
            ..Geometry::default()
        };
        let e = SlotLayout::new(&huge, MAX_CLIENTS_PER_NODE)
            .unwrap_err()
            .to_string();
        assert!(e.contains("request region"), "{e}");
    }

    #[test]
    fn request_roundtrip_and_overwrite_by_a_shorter_one() {
        let l = layout();
        let mut slot = vec![0u8; l.request_slot as usize];
        assert_eq!(
            l.decode_request(&slot, 0).unwrap(),
            Polled::Nothing,
            "zeroed slot holds no request"
        );
        let mut buf = Vec::new();
        let off = l.encode_request(&mut buf, 1, OpCode::Put, &[7u8; 20], &[9u8; 100]);
        assert_eq!(
            buf.len() as u64,
            l.request_slot,
            "largest request fills the slot"
        );
        place(&mut slot, off, &buf);
        let r = ready(l.decode_request(&slot, 0).unwrap());
        assert_eq!(
            r,
            Request {
                seq: 1,
                op: OpCode::Put,
                key: &[7u8; 20],
                value: &[9u8; 100]
            }
        );
        assert_eq!(
            l.decode_request(&slot, 1).unwrap(),
            Polled::Nothing,
            "already served"
        );
        // A shorter request written over it: the old one's remains stay below it, unread.
        let off = l.encode_request(&mut buf, 2, OpCode::Get, b"abc", b"");
        assert_eq!(buf.len(), 8 + 24, "a GET carries key and tail only");
        place(&mut slot, off, &buf);
        let r = ready(l.decode_request(&slot, 1).unwrap());
        assert_eq!(
            r,
            Request {
                seq: 2,
                op: OpCode::Get,
                key: b"abc",
                value: b""
            }
        );
        let off = l.encode_request(&mut buf, MAX_SEQ, OpCode::Delete, b"k", b"");
        place(&mut slot, off, &buf);
        let r = ready(l.decode_request(&slot, 2).unwrap());
        assert_eq!((r.seq, r.op), (MAX_SEQ, OpCode::Delete));
    }

    #[test]
    fn the_control_word_is_the_last_word_and_the_checksum_precedes_it() {
        let l = layout();
        let mut buf = Vec::new();
        l.encode_request(&mut buf, 5, OpCode::Put, b"key", b"value");
        let w = |b: &[u8], from_end: usize| {
            u64::from_le_bytes(b[b.len() - from_end..][..8].try_into().unwrap())
        };
        assert_eq!(
            SlotLayout::parse_request_ctrl(w(&buf, 8)),
            Some((5, OpCode::Put as u8))
        );
        assert_eq!(w(&buf, 16), checksum(5, &[&buf[..buf.len() - 16]]));
        l.encode_response(&mut buf, 6, &Ok(Some(b"v".to_vec())));
        assert_eq!(
            SlotLayout::parse_response_ctrl(w(&buf, 8)),
            (6, status::VALUE)
        );
        assert_eq!(w(&buf, 16), checksum(6, &[&buf[..buf.len() - 16]]));
    }

    /// Every way a WRITE can be caught half-landed (any subset of its words new, the others
    /// still the previous message's), with the new control word visible: never accepted.
    #[test]
    fn partly_landed_requests_are_never_accepted() {
        let l = layout();
        let mut old = vec![0u8; l.request_slot as usize];
        let mut buf = Vec::new();
        let off = l.encode_request(&mut buf, 7, OpCode::Put, b"old-key", &[1u8; 40]);
        place(&mut old, off, &buf);
        let off = l.encode_request(&mut buf, 8, OpCode::Put, b"new-key", &[2u8; 40]);
        let words = buf.len() / 8;
        let ctrl_word = words - 1;
        // Subsets of the non-control words (over 2^8 combinations, all of them for this size).
        assert!(words - 1 <= 12);
        for mask in 0u32..(1 << (words - 1)) {
            let mut slot = old.clone();
            for i in 0..words {
                if i == ctrl_word || mask & (1 << i) != 0 {
                    let at = off as usize + 8 * i;
                    slot[at..at + 8].copy_from_slice(&buf[8 * i..8 * i + 8]);
                }
            }
            // Words equal in both messages (lengths, zero arguments) make some subsets whole.
            let full = slot[off as usize..] == buf[..];
            match l.decode_request(&slot, 7).unwrap() {
                Polled::Ready(r) => {
                    assert!(
                        full,
                        "accepted a half-landed request (mask {mask:#b}): {r:?}"
                    );
                    assert_eq!((r.key, r.value), (&b"new-key"[..], &[2u8; 40][..]));
                }
                Polled::Landing => assert!(!full, "a fully landed request was not accepted"),
                Polled::Nothing => panic!("the new control word is there"),
            }
        }
    }

    #[test]
    fn partly_landed_responses_are_never_accepted() {
        let l = layout();
        let mut old = vec![0u8; l.response_slot as usize];
        let mut buf = Vec::new();
        let off = l.encode_response(&mut buf, 3, &Ok(Some(vec![5u8; 24])));
        place(&mut old, off, &buf);
        let off = l.encode_response(&mut buf, 4, &Ok(Some(vec![6u8; 24])));
        let words = buf.len() / 8;
        for mask in 0u32..(1 << (words - 1)) {
            let mut slot = old.clone();
            for i in 0..words {
                if i == words - 1 || mask & (1 << i) != 0 {
                    let at = off as usize + 8 * i;
                    slot[at..at + 8].copy_from_slice(&buf[8 * i..8 * i + 8]);
                }
            }
            // Words equal in both messages (lengths, zero arguments) make some subsets whole.
            let full = slot[off as usize..] == buf[..];
            match l.decode_response(&slot, 4, 0).unwrap() {
                Polled::Ready(r) => {
                    assert!(full, "accepted a half-landed response (mask {mask:#b})");
                    assert_eq!(r, Ok(Some(vec![6u8; 24])));
                }
                Polled::Landing => assert!(!full),
                Polled::Nothing => panic!("the new control word is there"),
            }
        }
    }

    #[test]
    fn malformed_requests_are_rejected() {
        let l = layout();
        let mut slot = vec![0u8; l.request_slot as usize];
        let c = l.request_ctrl_offset() as usize;
        slot[c..c + 8].copy_from_slice(&(3u64 << 8 | 9).to_le_bytes());
        assert!(l
            .decode_request(&slot, 0)
            .unwrap_err()
            .to_string()
            .contains("unknown op 9"));
        slot[c..c + 8].copy_from_slice(&(3u64 << 8 | 1).to_le_bytes());
        let m = l.request_meta_offset() as usize;
        slot[m..m + 8].copy_from_slice(&(21u64).to_le_bytes());
        assert!(l
            .decode_request(&slot, 0)
            .unwrap_err()
            .to_string()
            .contains("key 21 (max 20)"));
        slot[m..m + 8].copy_from_slice(&(101u64 << 32).to_le_bytes());
        assert!(l
            .decode_request(&slot, 0)
            .unwrap_err()
            .to_string()
            .contains("value 101 (max 100)"));
        // Well-formed lengths with a wrong checksum: indistinguishable from a WRITE in flight.
        slot[m..m + 8].copy_from_slice(&(3u64).to_le_bytes());
        assert_eq!(l.decode_request(&slot, 0).unwrap(), Polled::Landing);
    }

    #[test]
    fn every_reply_roundtrips() {
        let l = layout();
        let replies: Vec<Reply> = vec![
            Ok(None),
            Ok(Some(Vec::new())),
            Ok(Some(b"hello".to_vec())),
            Ok(Some(vec![0xAB; 100])),
            Err(Error::EmptyKey),
            Err(Error::KeyTooLarge { len: 21, max: 20 }),
            Err(Error::ValueTooLarge { len: 101, max: 100 }),
            Err(Error::IndexFull { depth: 8 }),
            Err(Error::DataTableFull {
                node: 2,
                entry_size: 96,
                awaiting_expiry: 40,
            }),
            Err(Error::Timeout { expiry_ms: 5 }),
            Err(Error::Contended { attempts: 2000 }),
            Err(Error::Unreachable {
                node: 1,
                reason: "node was killed".into(),
            }),
            Err(Error::Corrupt("bad lengths".into())),
            Err(Error::Config("nope".into())),
        ];
        let mut slot = vec![0u8; l.response_slot as usize];
        let mut buf = Vec::new();
        for (i, r) in replies.iter().enumerate() {
            let seq = 100 + i as u64;
            assert_eq!(
                l.decode_response(&slot, seq, 1),
                Ok(Polled::Nothing),
                "not there before it is written"
            );
            let off = l.encode_response(&mut buf, seq, r);
            place(&mut slot, off, &buf);
            assert_eq!(
                l.decode_response(&slot, seq, 1),
                Ok(Polled::Ready(r.clone())),
                "reply {i}"
            );
            assert_eq!(
                l.decode_response(&slot, seq + 1, 1),
                Ok(Polled::Nothing),
                "another sequence number is not it"
            );
        }
    }

    #[test]
    fn fabric_errors_travel_as_messages_and_long_messages_are_truncated() {
        let l = layout();
        let mut slot = vec![0u8; l.response_slot as usize];
        let mut buf = Vec::new();
        let e = Error::Fabric(FabricError::Misaligned {
            offset: 3,
            len: 8,
            align: 8,
        });
        let off = l.encode_response(&mut buf, 1, &Err(e.clone()));
        place(&mut slot, off, &buf);
        match ready(l.decode_response(&slot, 1, 2).unwrap()) {
            Err(Error::Fabric(FabricError::Transport(m))) => {
                assert!(
                    m.contains("server on node 2") && m.contains(&e.to_string()),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        let long = "é".repeat(300); // multi-byte: truncation must respect char boundaries
        let off = l.encode_response(&mut buf, 2, &Err(Error::Corrupt(long)));
        place(&mut slot, off, &buf);
        match ready(l.decode_response(&slot, 2, 0).unwrap()) {
            Err(Error::Corrupt(m)) => assert_eq!(m.len(), MAX_ERROR_MESSAGE),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_payload_length_is_reported() {
        let l = layout();
        let mut slot = vec![0u8; l.response_slot as usize];
        let t = l.response_tail_offset() as usize;
        slot[t + 24..t + 32].copy_from_slice(&(10_000u64).to_le_bytes());
        let c = l.response_ctrl_offset() as usize;
        slot[c..c + 8].copy_from_slice(&(1u64 << 8 | status::VALUE as u64).to_le_bytes());
        assert!(l
            .decode_response(&slot, 1, 0)
            .unwrap_err()
            .to_string()
            .contains("exceeds the slot"));
    }

    #[test]
    fn checksum_depends_on_sequence_order_and_content() {
        let a = [1u8; 16];
        let b = [2u8; 16];
        let base = checksum(1, &[&a, &b]);
        assert_eq!(
            base,
            checksum(1, &[&a[..8], &a[8..], &b]),
            "split into parts does not matter"
        );
        assert_ne!(
            base,
            checksum(2, &[&a, &b]),
            "seeded with the sequence number"
        );
        assert_ne!(base, checksum(1, &[&b, &a]), "order matters");
        assert_ne!(
            base,
            checksum(1, &[&a, &b, &[0u8; 8]]),
            "length matters, even with zero words"
        );
        let mut c = b;
        c[15] ^= 1;
        assert_ne!(base, checksum(1, &[&a, &c]));
    }
}
