//! Catching up: a restarted node fills the copies it holds (copy j of partition p, for every p
//! with `holder(p, j)` = this node) from each partition's primary, with one-sided operations
//! only, while the cluster keeps writing.
//!
//! It runs once every node writes the restarted node's copies (`NodeRole::Receiving`: every
//! node has learnt it, or stopped; the caller waits for that). From then on every write and
//! every carried CAS reaches these copies too, so the copier only has to bring each word to
//! where the primary is, without undoing a write that reached the copy first:
//! - **Index entries and page words** have an order (sequence numbers, generations): a word is
//!   moved forward with a CAS from what the copy holds, never back. A word still 0 (memory as
//!   the restart left it) is taken from the primary whatever it holds.
//! - **Data-table words** have none. A word that differs is written from the primary, and
//!   every word written is compared again in the next pass, until a pass writes nothing: a
//!   word the copier wrote over a newer one (a writer wrote the copy between the copier's read
//!   of the primary and its write) differs from the primary at the next pass. A word found
//!   equal stays right without being looked at again: every later write reaches both, and the
//!   copier never writes it. So the passes after the first shrink to the words writes were in
//!   flight on, and catching up ends under any load.
//!
//! Where a writer has carried a word to the copy before the primary (the copy comes later in
//! the chain) the copy is ahead: index and page words stay, data words are compared again
//! until the primary has it too.

use nessie_fabric::{Endpoint, FabricError, RegionId, RemoteAddr};
use nessie_store::{DATA_REGION, INDEX_REGION, PAGE_REGION};

use super::{mirror_region, Replicated};

/// Bytes compared (and copied) per step.
const CHUNK_BYTES: usize = 64 * 1024;
/// Most passes over one region before catching up gives up: each pass after the first only
/// meets words that writers changed during the previous one.
const MAX_PASSES: u32 = 1_000;

/// What catching up did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CatchUp {
    /// Copies filled (one per partition this node holds a copy of).
    pub copies: u32,
    /// Bytes read from the primaries (every pass).
    pub bytes_read: u64,
    /// Words this node's copies were changed in (written or moved forward).
    pub words_changed: u64,
    /// Passes over all regions, the first included.
    pub passes: u32,
}

impl<E: Endpoint> Replicated<E> {
    /// Fill every copy this node holds from its partition's primary (see the module comment).
    /// `table_regions`: the sizes of the index, data and page regions (`Geometry::table_regions`).
    /// `bytes_per_s` limits the reads from the primaries (0: no limit).
    pub fn catch_up(
        &mut self,
        table_regions: &[u64],
        bytes_per_s: u64,
    ) -> Result<CatchUp, FabricError> {
        let me = self.inner.node();
        let mut done = CatchUp::default();
        let start = self.inner.mono_ns();
        for p in 0..self.set.nodes {
            for j in 0..self.set.replicas {
                if self.set.holder(p, j) != me {
                    continue;
                }
                for region in [PAGE_REGION, DATA_REGION, INDEX_REGION] {
                    let bytes = table_regions[region as usize];
                    let passes = self.fill(p, j, region, bytes, bytes_per_s, start, &mut done)?;
                    done.passes = done.passes.max(passes);
                }
                done.copies += 1;
            }
        }
        Ok(done)
    }

    /// Bring copy `j` of `partition`'s `region` (`bytes` long) to its primary: a whole pass,
    /// then passes over the words the previous pass changed, until one changes nothing (a
    /// word found equal stays equal: every later write reaches both). Returns the passes made.
    #[allow(clippy::too_many_arguments)]
    fn fill(
        &mut self,
        partition: u16,
        j: u8,
        region: RegionId,
        bytes: u64,
        bytes_per_s: u64,
        start: u64,
        done: &mut CatchUp,
    ) -> Result<u32, FabricError> {
        let mine = mirror_region(region, j);
        let mut theirs = vec![0u8; CHUNK_BYTES];
        let mut ours = vec![0u8; CHUNK_BYTES];
        // Offsets of the words the last pass changed (`None`: before the whole pass).
        let mut todo: Option<Vec<u64>> = None;
        for pass in 1..=MAX_PASSES {
            let mut changed = Vec::new();
            let spans: Vec<(u64, usize)> = match &todo {
                None => (0..bytes)
                    .step_by(CHUNK_BYTES)
                    .map(|off| (off, CHUNK_BYTES.min((bytes - off) as usize)))
                    .collect(),
                Some(words) => words.iter().map(|&off| (off, 8)).collect(),
            };
            for (off, n) in spans {
                self.read_primary(RemoteAddr::new(partition, region, off), &mut theirs[..n])?;
                done.bytes_read += n as u64;
                self.inner.local_read(mine, off, &mut ours[..n])?;
                self.merge(mine, region, off, &theirs[..n], &ours[..n], &mut changed)?;
                self.pace(bytes_per_s, start, done.bytes_read);
            }
            done.words_changed += changed.len() as u64;
            if changed.is_empty() {
                return Ok(pass);
            }
            todo = Some(changed);
        }
        Err(FabricError::Transport(format!(
            "copy {j} of partition {partition}, region {region}, still differs from its primary after {MAX_PASSES} passes"
        )))
    }

    /// Bring the words of `ours` (this node's region `mine` from `off`) that are behind
    /// `theirs` (the primary's) forward, adding the offsets of those changed to `changed`.
    fn merge(
        &mut self,
        mine: RegionId,
        region: RegionId,
        off: u64,
        theirs: &[u8],
        ours: &[u8],
        changed: &mut Vec<u64>,
    ) -> Result<(), FabricError> {
        let me = self.inner.node();
        let word = |b: &[u8], w: usize| u64::from_le_bytes(b[w * 8..w * 8 + 8].try_into().unwrap());
        for w in 0..theirs.len() / 8 {
            let (want, mut cur) = (word(theirs, w), word(ours, w));
            if want == cur {
                continue;
            }
            let at = off + w as u64 * 8;
            if region == DATA_REGION {
                self.inner.local_write(mine, at, &want.to_le_bytes())?;
                changed.push(at);
                continue;
            }
            // Ordered words: forward only, by CAS (writers carry words here concurrently).
            let addr = RemoteAddr::new(me, mine, at);
            loop {
                if cur == want || (cur != 0 && !self.set.newer(region, want, cur)) {
                    break;
                }
                let was = self.inner.compare_and_swap(addr, cur, want)?;
                if was == cur {
                    changed.push(at);
                    break;
                }
                cur = was;
            }
        }
        Ok(())
    }

    /// Sleep so that reads stay within `bytes_per_s` on average since `start`.
    fn pace(&mut self, bytes_per_s: u64, start: u64, read: u64) {
        if bytes_per_s == 0 {
            return;
        }
        let due = start + (read as u128 * 1_000_000_000 / bytes_per_s as u128) as u64;
        let now = self.inner.mono_ns();
        if due > now {
            self.inner.sleep_ns(due - now);
        }
    }
}
