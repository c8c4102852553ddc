//! Catching up: a restarted node fills the copies it holds (copy j of partition p, for every p
//! with `holder(p, j)` = this node), and a node that copies were moved to fills those
//! (re-replication, `Fence::moved_copy`), from each partition's primary (its first full copy),
//! with one-sided operations only, while the cluster keeps writing.
//!
//! It runs once every node writes the restarted node's copies (`NodeRole::Receiving`: every
//! node has learnt it, or stopped, and operations that chose their copies before have ended;
//! the caller waits for that). From then on every write and every carried CAS reaches these
//! copies too. What the copies held before is not trusted: zeros after a restart, or, for a
//! node that was paused and declared failed, stale words, some possibly ahead of the decider
//! or from another history (words it decided that never went further). So each word is read
//! here first, then at the primary, and:
//! - **Index entries and page words** that differ are set to the primary's by a CAS from what
//!   was read here; if a writer carried a word here in between, the CAS fails and the word is
//!   read again from both.
//! - **Data-table words** have no order: a word that differs is written from the primary, and
//!   the words written are compared again in the next pass, until a pass writes nothing. A
//!   word the copier wrote over a newer one (a writer wrote it between the copier's reads and
//!   its write) differs at the next pass. A word found equal stays right without being looked
//!   at again: every later write reaches both copies and the copier never writes it again. So
//!   the passes after the first shrink to the words writes were in flight on, and are read in
//!   spans (changed words near each other share one READ).
//!
//! Why the primary: writers reach receiving copies after every full copy, the primary
//! included, so the primary's word, read after ours, is at or past anything a writer carried
//! here; and every word the primary holds is on every full copy, so none of them dies with its
//! decider. The decider, read instead, could hand us a word it decided and then died with,
//! before carrying it on: the next copy decides another in its place, and this copy, once up,
//! would serve a word nobody acknowledged and wedge the entry (review 39, bug 6).

use nessie_fabric::{Endpoint, FabricError, NodeId, RegionId, RemoteAddr};
use nessie_store::{PartitionId, DATA_REGION, INDEX_REGION, PAGE_REGION};

use super::{mirror_region, Part, Replicated, Spot};
use crate::fence::NodeRole;

/// Bytes compared (and copied) per step.
const CHUNK_BYTES: usize = 64 * 1024;
/// Words changed in one pass that lie at most this far apart are compared again in one read
/// in the next pass (with the words between, which are compared too: harmless). A READ's round
/// trip costs as much as tens of kilobytes of transfer over TCP (30 to 40 us): one read per
/// changed word made the second pass after a restart, which meets every word the first filled,
/// a round trip per 8 bytes (1.7 M of them for a node holding 20,000-byte values).
const MAX_GAP_BYTES: u64 = 4096;
/// Most passes over one region before catching up gives up: each pass after the first only
/// meets words that writers changed during the previous one.
const MAX_PASSES: u32 = 1_000;
/// Most CAS rounds on one ordered word: each lost round lost to a writer carrying a newer word.
const MAX_WORD_ROUNDS: u32 = 10_000;

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
    /// READs from the sources (every pass).
    pub reads: u64,
    /// How long it took, in nanoseconds.
    pub ns: u64,
}

/// Two catch-ups one after the other: counts and times add up, passes are the most either made.
impl std::ops::AddAssign for CatchUp {
    fn add_assign(&mut self, o: CatchUp) {
        self.copies += o.copies;
        self.bytes_read += o.bytes_read;
        self.words_changed += o.words_changed;
        self.passes = self.passes.max(o.passes);
        self.reads += o.reads;
        self.ns += o.ns;
    }
}

impl std::fmt::Display for CatchUp {
    /// What a node's log says: copies, bytes and reads, passes, words changed, seconds.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.ns as f64 / 1e9;
        write!(
            f,
            "{} copies: {} bytes read in {} reads over {} passes, {} words changed, in {:.2} s ({:.1} MB/s)",
            self.copies,
            self.bytes_read,
            self.reads,
            self.passes,
            self.words_changed,
            s,
            if s > 0.0 { self.bytes_read as f64 / s / 1e6 } else { 0.0 },
        )
    }
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
        let pace = (bytes_per_s, start);
        for p in 0..self.set.nodes {
            for j in 0..self.set.replicas {
                // Every copy this node holds after a restart (its role is receiving), or only
                // those moved here and not yet full.
                let (node, spot, role) = self.place(Part::Tables(p), j);
                if node != me || role != NodeRole::Receiving {
                    continue;
                }
                let Spot::Mirror(slot) = spot else {
                    unreachable!("a node's tables in an index slot")
                };
                // A node that has never been up, filling its own tables: every copy of them is
                // all zeros (SB5: nobody writes them until it is up, its own workers included,
                // and its process has written none of its regions), and so is what it holds.
                // Comparing the data region would read every page of both, which faults the
                // whole regions in on this node and on the copy read from: their memory, and
                // seconds of CPU that delay the join (a 200 MB data region took 3 to 4 s under
                // load). Its page words (8 bytes a page) are filled as any copy's, and the data
                // region skipped only if none is claimed: a data entry lies only on a claimed
                // page, so SB5 stays checked. Another never-up node's copy held here may sit in
                // a reused slot, stale: filled whole.
                let own = p == me || mutated!(self.set, skip_every_never_up_copy);
                let own_never_up = own && self.never_written(Part::Tables(p));
                for region in [PAGE_REGION, DATA_REGION] {
                    if region == DATA_REGION
                        && own_never_up
                        && self.no_page_claimed(slot, table_regions[PAGE_REGION as usize])?
                    {
                        continue;
                    }
                    let bytes = table_regions[region as usize];
                    let from = RemoteAddr::new(p, region, 0);
                    let to = (mirror_region(region, slot), 0);
                    let part = Part::Tables(p);
                    let passes = self.fill(part, from, to, bytes, j, pace, &mut done)?;
                    done.passes = done.passes.max(passes);
                }
                let passes = self.fill_index(p, (j, slot), table_regions, pace, &mut done)?;
                done.passes = done.passes.max(passes);
                done.copies += 1;
            }
        }
        // Copies of single index partitions held in index slots here: moved here, or held
        // here across a restart (a migration's target chain too).
        let moved = self.fence.any_index_moved() || self.fence.any_migrating();
        if let Some((parts, _)) = self.set.index_slots.filter(|_| moved) {
            for q in 0..parts.count() as PartitionId {
                for part in [Part::Index(q), Part::Target(q)] {
                    if part == Part::Target(q) && !self.fence.migrating(q) {
                        continue;
                    }
                    for j in 0..self.set.replicas {
                        let (node, spot, role) = self.place(part, j);
                        let Spot::Index(k) = spot else { continue };
                        if node != me || role != NodeRole::Receiving {
                            continue;
                        }
                        let from =
                            RemoteAddr::new(parts.home(q), INDEX_REGION, parts.home_offset(q));
                        let to = (
                            self.set.index_slot_region(),
                            k as u64 * self.set.index_slot_bytes(),
                        );
                        let bytes = parts.len(q) * 8;
                        let passes = self.fill(part, from, to, bytes, j, pace, &mut done)?;
                        done.passes = done.passes.max(passes);
                        done.copies += 1;
                    }
                }
            }
        }
        done.ns = self.inner.mono_ns().saturating_sub(start);
        Ok(done)
    }

    /// Whether every page word of the copy in mirror slot `slot` (`bytes` of them, filled) is
    /// zero: no page of it is claimed, so its data region holds no entry.
    fn no_page_claimed(&mut self, slot: u8, bytes: u64) -> Result<bool, FabricError> {
        let mine = mirror_region(PAGE_REGION, slot);
        let mut buf = vec![0u8; CHUNK_BYTES];
        for off in (0..bytes).step_by(CHUNK_BYTES) {
            let n = CHUNK_BYTES.min((bytes - off) as usize);
            self.inner.local_read(mine, off, &mut buf[..n])?;
            if buf[..n].iter().any(|&b| b != 0) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Fill copy `j` of node `p`'s index table, held here in mirror slot `slot`: all of it,
    /// or, where index partitions can move, each partition whose copy j is that mirror's (the
    /// others' copy j is elsewhere, and this part of the mirror is nobody's), from that
    /// partition's own chain. Returns the passes made.
    fn fill_index(
        &mut self,
        p: NodeId,
        (j, slot): (u8, u8),
        table_regions: &[u64],
        pace: (u64, u64),
        done: &mut CatchUp,
    ) -> Result<u32, FabricError> {
        let mine = mirror_region(INDEX_REGION, slot);
        let Some((parts, _)) = self.set.index_slots else {
            let (from, bytes) = (RemoteAddr::new(p, INDEX_REGION, 0), table_regions[0]);
            return self.fill(Part::Tables(p), from, (mine, 0), bytes, j, pace, done);
        };
        let mut passes = 0;
        for q in parts.of_home(p) {
            let part = Part::Index(q);
            if self.place(part, j) != self.place(Part::Tables(p), j) {
                continue;
            }
            let at = parts.home_offset(q);
            let from = RemoteAddr::new(p, INDEX_REGION, at);
            let n = self.fill(part, from, (mine, at), parts.len(q) * 8, j, pace, done)?;
            passes = passes.max(n);
        }
        Ok(passes)
    }

    /// Bring copy `j` of the `bytes` at `from` (a partition's words, as the protocol addresses
    /// them), held here in region `mine` from offset `base`, to their primary in `part`'s
    /// chain: a whole pass, then passes over the words the previous pass changed, until one
    /// changes nothing (a word found equal stays equal: every later write reaches both).
    /// Returns the passes made.
    #[allow(clippy::too_many_arguments)]
    fn fill(
        &mut self,
        part: Part,
        from: RemoteAddr,
        (mine, base): (RegionId, u64),
        bytes: u64,
        j: u8,
        (bytes_per_s, start): (u64, u64),
        done: &mut CatchUp,
    ) -> Result<u32, FabricError> {
        let (partition, region) = (from.node, from.region);
        let mut theirs = vec![0u8; CHUNK_BYTES];
        let mut ours = vec![0u8; CHUNK_BYTES];
        // The runs of words the last pass changed (`None`: before the whole pass).
        let mut todo: Option<Vec<(u64, u64)>> = None;
        for pass in 1..=MAX_PASSES {
            let mut changed = Vec::new();
            let spans: Vec<(u64, usize)> = match &todo {
                None => (0..bytes)
                    .step_by(CHUNK_BYTES)
                    .map(|off| (off, CHUNK_BYTES.min((bytes - off) as usize)))
                    .collect(),
                Some(runs) => spans_of(runs),
            };
            for (off, n) in spans {
                // Ours first: the primary's words, read after, are at or past every word a
                // writer had carried to our copy by then.
                self.inner.local_read(mine, base + off, &mut ours[..n])?;
                let at = RemoteAddr::new(partition, region, from.offset + off);
                self.read_source(part, at, &mut theirs[..n])?;
                done.bytes_read += n as u64;
                done.reads += 1;
                let here = (mine, base + off);
                self.merge(
                    part,
                    at,
                    here,
                    (&theirs[..n], &ours[..n]),
                    &mut changed,
                    off,
                )?;
                self.pace(bytes_per_s, start, done.bytes_read);
            }
            done.words_changed += changed.iter().map(|&(_, n)| n / 8).sum::<u64>();
            if changed.is_empty() {
                return Ok(pass);
            }
            // Spans are merged in ascending order, and so are the runs each leaves.
            debug_assert!(changed.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0));
            todo = Some(changed);
        }
        Err(FabricError::Transport(format!(
            "copy {j} of partition {partition}, region {region}, still differs from its primary after {MAX_PASSES} passes"
        )))
    }

    /// READ `buf.len()` bytes of `addr` (a partition's region) from the partition's primary,
    /// its first full copy: every word carried or written to a receiving copy reached the
    /// primary first (receiving copies come after every full one), so the primary's word,
    /// read after ours, is at or past it; and every word the primary holds is on every full
    /// copy, so none dies with its decider (a word read from the decider could: decided there,
    /// never carried on, and then the next copy decides another).
    fn read_source(
        &mut self,
        part: Part,
        addr: RemoteAddr,
        buf: &mut [u8],
    ) -> Result<(), FabricError> {
        loop {
            self.wait_fresh_view()?;
            let live = match self.live(part) {
                // The tables of a standby node (never up), whose only full copies are gone:
                // nobody has written them since the cluster started (`nessie_membership::
                // standby`, SB5: until it is up its own clients are fenced, no page of it is
                // claimed, its index is in index slots), so they are all zeros, and so is what
                // a copy of them holds once filled from nothing.
                Err(FabricError::NoCopy { .. }) if self.never_written(part) => {
                    buf.fill(0);
                    return Ok(());
                }
                live => live?,
            };
            let c = if mutated!(self.set, catch_up_from_decider) {
                live.as_slice()[live.len - 1]
            } else {
                live.as_slice()[0]
            };
            let a = self.at(addr, c);
            if self.on_copy(c, true, |e| e.read(a, buf))?.is_some() {
                return Ok(());
            }
        }
    }

    /// Make the words of `ours` (this node's region `mine` from offset `here`, the copy of the
    /// words at `at`) that differ from `theirs` (the primary's, read after ours) equal to them,
    /// adding the runs of words changed (offsets from `rel`, relative to the span filled; bytes)
    /// to `changed`. Data words are written a run of differing words at a time: a restarted
    /// node's copy differs in every word written before, tens of millions of them. Index entries and page words are set by CAS from what we read: what our copy
    /// held before catching up may be stale, even ahead of the decider or from another
    /// history (a paused node's memory: words it decided that never went further), so it is
    /// replaced whatever it is; a word a writer carries here meanwhile makes the CAS fail, and
    /// the word is read again from both.
    fn merge(
        &mut self,
        part: Part,
        at: RemoteAddr,
        (mine, here): (RegionId, u64),
        (theirs, ours): (&[u8], &[u8]),
        changed: &mut Vec<(u64, u64)>,
        rel: u64,
    ) -> Result<(), FabricError> {
        let me = self.inner.node();
        let word = |b: &[u8], w: usize| u64::from_le_bytes(b[w * 8..w * 8 + 8].try_into().unwrap());
        let words = theirs.len() / 8;
        let mut w = 0;
        while w < words {
            let (mut want, mut cur) = (word(theirs, w), word(ours, w));
            if want == cur {
                w += 1;
                continue;
            }
            if at.region == DATA_REGION {
                // The run of differing words from here, written at once.
                let end = (w + 1..words)
                    .find(|&v| word(theirs, v) == word(ours, v))
                    .unwrap_or(words);
                let (from, to) = (w * 8, end * 8);
                self.inner
                    .local_write(mine, here + from as u64, &theirs[from..to])?;
                push_run(changed, rel + from as u64, (to - from) as u64);
                w = end;
                continue;
            }
            let at_word = w as u64 * 8;
            w += 1;
            // The word's offset in our region, and in the span being filled (what the next
            // pass looks at again).
            let (off, next) = (here + at_word, rel + at_word);
            let addr = RemoteAddr::new(me, mine, off);
            for _ in 0..MAX_WORD_ROUNDS {
                let was = self.inner.compare_and_swap(addr, cur, want)?;
                if was == cur {
                    push_run(changed, next, 8);
                    break;
                }
                // A writer carried a word here: read both again, ours first.
                cur = was;
                let mut b = [0u8; 8];
                let a = RemoteAddr::new(at.node, at.region, at.offset + at_word);
                self.read_source(part, a, &mut b)?;
                want = u64::from_le_bytes(b);
                if want == cur {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Sleep so that reads stay within `bytes_per_s` on average since `start`.
    pub(super) fn pace(&mut self, bytes_per_s: u64, start: u64, read: u64) {
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

/// Add the run of changed words at `off` (`bytes` of them) to `runs` (ascending), joined to
/// the last run where they touch.
fn push_run(runs: &mut Vec<(u64, u64)>, off: u64, bytes: u64) {
    debug_assert!(
        off.is_multiple_of(8) && bytes.is_multiple_of(8) && bytes > 0,
        "whole words"
    );
    if let Some((start, len)) = runs.last_mut() {
        debug_assert!(off >= *start + *len, "runs ascend");
        if *start + *len == off {
            *len += bytes;
            return;
        }
    }
    runs.push((off, bytes));
}

/// The spans (offset, bytes) that cover the runs of words `runs` (offset, bytes; ascending,
/// apart): runs at most [`MAX_GAP_BYTES`] apart share a span, and no span is longer than
/// [`CHUNK_BYTES`] (a longer run is split).
fn spans_of(runs: &[(u64, u64)]) -> Vec<(u64, usize)> {
    let chunk = CHUNK_BYTES as u64;
    let mut spans: Vec<(u64, usize)> = Vec::new();
    for &(mut off, mut bytes) in runs {
        debug_assert!(
            off.is_multiple_of(8) && bytes.is_multiple_of(8),
            "whole words"
        );
        while bytes > 0 {
            if let Some((start, len)) = spans.last_mut() {
                let end = *start + *len as u64;
                if off < end {
                    // Overlapping the span before (runs should not): what it covers is done.
                    let skip = (end - off).min(bytes);
                    (off, bytes) = (off + skip, bytes - skip);
                    continue;
                }
                if off - end <= MAX_GAP_BYTES && off + 8 <= *start + chunk {
                    let take = bytes.min(*start + chunk - off);
                    *len = (off + take - *start) as usize;
                    (off, bytes) = (off + take, bytes - take);
                    continue;
                }
            }
            let take = bytes.min(chunk);
            spans.push((off, take as usize));
            (off, bytes) = (off + take, bytes - take);
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Single words as runs.
    fn spans_of_words(words: &[u64]) -> Vec<(u64, usize)> {
        let mut runs = Vec::new();
        for &w in words {
            push_run(&mut runs, w, 8);
        }
        spans_of(&runs)
    }

    #[test]
    fn changed_words_are_read_again_in_spans() {
        let spans_of = spans_of_words;
        assert_eq!(spans_of(&[]), vec![]);
        assert_eq!(spans_of(&[16]), vec![(16, 8)]);
        // Neighbours and words a little apart share one read; a word far off gets its own.
        assert_eq!(spans_of(&[0, 8, 16, 64]), vec![(0, 72)]);
        let far = 72 + MAX_GAP_BYTES + 8;
        assert_eq!(spans_of(&[0, 64, far]), vec![(0, 72), (far, 8)]);
        // No span is longer than a chunk.
        let words: Vec<u64> = (0..(2 * CHUNK_BYTES as u64) / 8).map(|w| w * 8).collect();
        let spans = spans_of(&words);
        assert_eq!(
            spans,
            vec![(0, CHUNK_BYTES), (CHUNK_BYTES as u64, CHUNK_BYTES)]
        );
        // Every word is covered.
        let scattered: Vec<u64> = (0..5000u64)
            .map(|i| i * i * 8 % 1_000_000 / 8 * 8)
            .collect();
        let mut sorted = scattered.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let spans = spans_of(&sorted);
        for w in &sorted {
            assert!(spans
                .iter()
                .any(|&(o, n)| *w >= o && *w + 8 <= o + n as u64));
        }
    }

    /// Runs of changed words (data words are written a run at a time): touching runs join, a
    /// run longer than a chunk is split, and a run a little apart shares the span before.
    #[test]
    fn runs_of_changed_words_are_read_again_in_spans() {
        let chunk = CHUNK_BYTES as u64;
        let mut runs = Vec::new();
        push_run(&mut runs, 0, 16);
        push_run(&mut runs, 16, 8);
        assert_eq!(runs, vec![(0, 24)], "touching runs join");
        push_run(&mut runs, 64, 2 * chunk);
        assert_eq!(runs, vec![(0, 24), (64, 2 * chunk)]);
        let spans = spans_of(&runs);
        assert_eq!(
            spans,
            vec![(0, CHUNK_BYTES), (chunk, CHUNK_BYTES), (2 * chunk, 64),]
        );
        assert_eq!(
            spans.iter().map(|s| s.1 as u64).sum::<u64>(),
            64 + 2 * chunk,
            "every byte from the first run's start to the last's end, once"
        );
        let far = 24 + MAX_GAP_BYTES + 8;
        assert_eq!(spans_of(&[(0, 24), (far, 8)]), vec![(0, 24), (far, 8)]);
    }
}
