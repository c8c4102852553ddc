//! The Pilaf client: GET by one-sided READs of the owner's candidate entries and of the extent
//! the matching entry points to, each verified by its CRC64; PUT and DELETE as requests to the
//! owner's server threads over SD's request path.
//!
//! A GET pass reads the candidates in order. An entry whose CRC fails was read while being
//! written, and an extent whose CRC differs from the one in its entry was read while being
//! rewritten (its block freed and reused): either way the pass is retried, with no
//! coordination with the server. A pass that finds the key returns its value: the entry read
//! was current when read, and the verified extent holds the bytes that entry described.
//!
//! A pass that finds the key nowhere is not enough on its own: cuckoo moves can carry the key
//! from a candidate not yet read to one already read while the pass is between them, though it
//! is in the table the whole time. So a miss is confirmed by a second pass bracketed by two
//! READs of the table's move sequence word: equal and even means no chain of moves overlapped
//! the pass, and then a key in the table would have been found. (This step is ours: the paper
//! does not discuss misses during moves.)

use std::sync::Arc;

use nessie_fabric::{Endpoint, NodeId, RegionId, RemoteAddr};

use super::layout::{
    candidates, crc64, decode_extent, entry_offset, key_hash, Entry, Slot, ENTRY_BYTES,
    EXTENT_HEADER, EXTENT_REGION, MOVE_SEQ_OFFSET, TABLE_REGION, WAYS,
};
use super::PilafParams;
use crate::sd::client::{check_sizes, owner};
use crate::sd::{ClientSlot, RpcShared, RpcStats, SdClient};
use nessie_protocols::cd::ClusterView;
use nessie_protocols::config::ProtocolConfig;
use nessie_protocols::Error;

/// Counters of one Pilaf client worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PilafClientStats {
    pub gets: u64,
    pub puts: u64,
    pub deletes: u64,
    /// GET passes retried because an entry failed its CRC.
    pub entry_crc_retries: u64,
    /// GET passes retried because an extent did not match its entry's CRC.
    pub extent_crc_retries: u64,
    /// Confirming passes retried because keys moved (or were moving) under them.
    pub move_retries: u64,
    /// GETs that gave up after the retry policy's attempts (`Error::Contended`).
    pub gave_up: u64,
    /// Entry and extent READs of GETs.
    pub entry_reads: u64,
    pub extent_reads: u64,
    /// The PUT and DELETE requests.
    pub rpc: RpcStats,
}

impl PilafClientStats {
    /// GET passes retried because a checksum failed.
    pub fn checksum_retries(&self) -> u64 {
        self.entry_crc_retries + self.extent_crc_retries
    }
}

/// What one GET pass found.
enum Pass {
    Found(Vec<u8>),
    Missing,
    /// A checksum failed: read again.
    Torn,
}

/// One client worker of the Pilaf mode.
pub struct PilafClient<E: Endpoint> {
    /// Its endpoint, view and request channel: PUT and DELETE are SD's requests, unchanged.
    sd: SdClient<E>,
    params: PilafParams,
    cfg: ProtocolConfig,
    /// GET counters (the SD client counts the writes).
    stats: PilafClientStats,
    buf: Vec<u8>,
}

impl<E: Endpoint> PilafClient<E> {
    /// A client worker on `ep`'s node; `view` must use the coupled index (for the owner of a
    /// key), like SD's.
    pub fn new(
        ep: E,
        view: Arc<ClusterView>,
        cfg: &ProtocolConfig,
        shared: Arc<RpcShared>,
        slot: ClientSlot,
    ) -> Result<Self, Error> {
        let params = PilafParams::new(&view.geometry, 0)?;
        Ok(Self {
            sd: SdClient::new(ep, view, shared, slot)?,
            params,
            cfg: cfg.clone(),
            stats: PilafClientStats::default(),
            buf: Vec::new(),
        })
    }

    /// Read `len` bytes at `off` of `region` on `owner` into `self.buf` (directly if local).
    fn read(&mut self, owner: NodeId, region: RegionId, off: u64, len: usize) -> Result<(), Error> {
        self.buf.resize(len, 0);
        if owner == self.sd.ep.node() {
            self.sd.ep.local_read(region, off, &mut self.buf)?;
        } else {
            self.sd
                .ep
                .read(RemoteAddr::new(owner, region, off), &mut self.buf)?;
        }
        Ok(())
    }

    fn move_seq(&mut self, owner: NodeId) -> Result<u64, Error> {
        self.read(owner, TABLE_REGION, MOVE_SEQ_OFFSET, 8)?;
        Ok(u64::from_le_bytes(
            self.buf[..8].try_into().expect("8 bytes"),
        ))
    }

    /// Read the value of `key`; `Ok(None)` if it is not in the store.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        check_sizes(&self.sd.view, key, None)?;
        self.stats.gets += 1;
        let owner = owner(&self.sd.view, key);
        let h = key_hash(key);
        let cands = candidates(h, self.params.entries);
        let attempts = self.cfg.retry.max_attempts;
        // A miss seen by an unbracketed pass, to be confirmed by a bracketed one.
        let mut confirming = false;
        let mut retries = 0u32;
        while retries < attempts {
            let before = if confirming {
                Some(self.move_seq(owner)?)
            } else {
                None
            };
            let pass = match before {
                Some(s) if !s.is_multiple_of(2) => None, // a chain of moves is under way
                _ => Some(self.pass(owner, key, h, &cands)?),
            };
            match pass {
                Some(Pass::Found(v)) => return Ok(Some(v)),
                Some(Pass::Missing) if mutated!(self.cfg, pilaf_trust_first_miss) => {
                    return Ok(None)
                }
                Some(Pass::Missing) if !confirming => {
                    confirming = true;
                    continue;
                }
                Some(Pass::Missing) if Some(self.move_seq(owner)?) == before => return Ok(None),
                Some(Pass::Torn) => {}
                _ => self.stats.move_retries += 1,
            }
            retries += 1;
            self.backoff(retries);
        }
        self.stats.gave_up += 1;
        Err(Error::Contended { attempts })
    }

    fn backoff(&mut self, retries: u32) {
        let r = &self.cfg.retry;
        let ns = r
            .initial_backoff_ns
            .saturating_mul(1 << retries.min(20))
            .min(r.max_backoff_ns);
        if retries > 1 {
            self.sd.ep.sleep_ns(ns);
        }
    }

    fn verify(&self) -> bool {
        !mutated!(self.cfg, skip_pilaf_checksums)
    }

    /// One pass over the candidates.
    fn pass(
        &mut self,
        owner: NodeId,
        key: &[u8],
        h: u64,
        cands: &[u64; WAYS],
    ) -> Result<Pass, Error> {
        let verify = self.verify();
        for &c in cands {
            self.read(owner, TABLE_REGION, entry_offset(c), ENTRY_BYTES as usize)?;
            self.stats.entry_reads += 1;
            let e = match Entry::decode(&self.buf, verify) {
                Slot::Empty => continue,
                Slot::Torn => {
                    self.stats.entry_crc_retries += 1;
                    return Ok(Pass::Torn);
                }
                Slot::Used(e) if e.key_hash != h => continue,
                Slot::Used(e) => e,
            };
            if e.size < EXTENT_HEADER
                || e.size > self.params.max_extent()
                || !e.size.is_multiple_of(8)
            {
                if verify {
                    return Err(Error::Corrupt(format!("pilaf entry of {} bytes", e.size)));
                }
                continue;
            }
            self.read(owner, EXTENT_REGION, e.offset, e.size as usize)?;
            self.stats.extent_reads += 1;
            if verify && crc64(&self.buf) != e.extent_crc {
                self.stats.extent_crc_retries += 1;
                return Ok(Pass::Torn);
            }
            if let Some(v) = self.value_of(key, verify)? {
                return Ok(Pass::Found(v));
            }
        }
        Ok(Pass::Missing)
    }

    /// The value in the extent in `self.buf` if it holds `key`.
    fn value_of(&self, key: &[u8], verify: bool) -> Result<Option<Vec<u8>>, Error> {
        match decode_extent(&self.buf) {
            Ok(x) => Ok((x.key == key).then(|| x.value.to_vec())),
            Err(b) if verify => Err(Error::Corrupt(b.to_string())),
            Err(b) => {
                // Unverified (mutation only): take what is there, as a reader that trusts
                // the lengths would.
                let start = (EXTENT_HEADER + b.key.div_ceil(8) * 8) as usize;
                let end = (start as u64 + b.value).min(self.buf.len() as u64) as usize;
                let k_end = (EXTENT_HEADER + b.key).min(self.buf.len() as u64) as usize;
                let same = self.buf[EXTENT_HEADER as usize..k_end] == *key;
                Ok(same.then(|| self.buf[start.min(end)..end].to_vec()))
            }
        }
    }

    /// Store `value` under `key` (SD's request, executed by the owner's server).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.sd.put(key, value)
    }

    /// Remove `key` (a no-op if absent; SD's request, executed by the owner's server).
    pub fn delete(&mut self, key: &[u8]) -> Result<(), Error> {
        self.sd.delete(key)
    }

    pub fn stats(&self) -> PilafClientStats {
        let sd = self.sd.stats();
        PilafClientStats {
            puts: sd.puts,
            deletes: sd.deletes,
            rpc: sd.rpc,
            ..self.stats
        }
    }

    /// The SD client that carries this client's endpoint, view and writes (its node, slot,
    /// endpoint and view are this client's).
    pub fn requests(&self) -> &SdClient<E> {
        &self.sd
    }

    pub fn endpoint(&self) -> &E {
        self.sd.endpoint()
    }
}
