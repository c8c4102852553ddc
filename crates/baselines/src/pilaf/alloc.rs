//! The server-side extent allocator: size classes carved from one node's extent region.
//!
//! An extent of `n` bytes takes a block of the smallest class of at least `n` bytes. Classes
//! start at [`MIN_BLOCK`] and grow by ×1.25 (rounded up to 8 bytes, at least +8) up to the
//! largest extent the geometry allows. A class takes its blocks from its own free list first
//! (LIFO: the block freed last is reused first, which is the worst case for a straggling
//! reader and so the one the tests want), else carves a new block from the region's unused
//! tail (a bump pointer). Blocks never change class and are never merged: a memcached-style
//! slab allocator without rebalancing, so a workload whose sizes shift can find the region
//! full while another class has free blocks. A full region is [`AllocError::Full`], never a
//! lost or overwritten extent.
//!
//! **Reuse delay.** A freed block is not reused at once: it waits `reuse_delay_ns` in a FIFO
//! quarantine (time from the server's monotonic clock). A client that READ an entry and then
//! READs the extent it points to within that time reads the bytes the entry's CRC describes.
//! A client slower than that may read a block reused for another extent; the extent CRC in the
//! entry it read then does not match, and it retries (Pilaf's own defence, which with
//! `reuse_delay_ns = 0` is the only one, as in the paper).

use std::collections::VecDeque;

/// Smallest block: an extent's length word and one word of key.
pub const MIN_BLOCK: u64 = 16;
/// Most size classes (the largest extent the limits allow, 64 KiB key and 64 MiB value, needs
/// 68).
pub const MAX_CLASSES: usize = 96;

/// Why an extent could not be allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("extent region full: no free block of {block} bytes for an extent of {size} bytes ({awaiting_reuse} freed blocks of that class still in their reuse delay)")]
    Full {
        size: u64,
        block: u64,
        awaiting_reuse: u64,
    },
    #[error("extent of {size} bytes exceeds the largest class ({max} bytes)")]
    TooLarge { size: u64, max: u64 },
}

/// Counters of one allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Blocks handed out and not freed.
    pub in_use: u64,
    /// Freed blocks waiting out their reuse delay.
    pub quarantined: u64,
    /// Bytes of the region carved into blocks so far.
    pub carved: u64,
    /// Blocks handed out again after being freed.
    pub reused: u64,
}

/// One node's extent allocator (used under its store's lock).
#[derive(Debug)]
pub struct ExtentAlloc {
    classes: Vec<u64>,
    free: Vec<Vec<u64>>,
    /// (due time, class, offset), in order of due time.
    quarantine: VecDeque<(u64, usize, u64)>,
    bump: u64,
    bytes: u64,
    reuse_delay_ns: u64,
    stats: AllocStats,
}

/// Block sizes from [`MIN_BLOCK`] up to `max` (a multiple of 8).
pub fn block_classes(max: u64) -> Vec<u64> {
    let max = max.max(MIN_BLOCK).div_ceil(8) * 8;
    let mut c = vec![MIN_BLOCK.min(max)];
    while *c.last().expect("one class") < max {
        let prev = *c.last().expect("one class");
        let next = ((prev * 5 / 4).div_ceil(8) * 8).max(prev + 8).min(max);
        c.push(next);
    }
    c
}

impl ExtentAlloc {
    /// An allocator over `bytes` bytes of extent region for extents of at most `max_extent`
    /// bytes. `None` if that needs more than [`MAX_CLASSES`] classes.
    pub fn new(bytes: u64, max_extent: u64, reuse_delay_ns: u64) -> Option<Self> {
        let classes = block_classes(max_extent);
        if classes.len() > MAX_CLASSES {
            return None;
        }
        Some(Self {
            free: vec![Vec::new(); classes.len()],
            classes,
            quarantine: VecDeque::new(),
            bump: 0,
            bytes,
            reuse_delay_ns,
            stats: AllocStats::default(),
        })
    }

    fn class_of(&self, size: u64) -> Result<usize, AllocError> {
        let max = *self.classes.last().expect("one class");
        self.classes
            .iter()
            .position(|&c| c >= size)
            .ok_or(AllocError::TooLarge { size, max })
    }

    /// Move every block whose delay has passed by `now` to its class's free list.
    fn release_due(&mut self, now: u64) {
        while let Some(&(due, class, off)) = self.quarantine.front() {
            if due > now {
                break;
            }
            self.quarantine.pop_front();
            self.stats.quarantined -= 1;
            self.free[class].push(off);
        }
    }

    /// A block for an extent of `size` bytes; its offset in the region.
    pub fn alloc(&mut self, size: u64, now: u64) -> Result<u64, AllocError> {
        let class = self.class_of(size)?;
        self.release_due(now);
        let block = self.classes[class];
        let off = if let Some(off) = self.free[class].pop() {
            self.stats.reused += 1;
            off
        } else if self.bytes - self.bump >= block {
            self.bump += block;
            self.stats.carved = self.bump;
            self.bump - block
        } else {
            let awaiting_reuse = self.quarantine.iter().filter(|q| q.1 == class).count() as u64;
            return Err(AllocError::Full {
                size,
                block,
                awaiting_reuse,
            });
        };
        self.stats.in_use += 1;
        Ok(off)
    }

    /// When the first block of the class for `size` waiting out its reuse delay becomes free
    /// (`None` if none waits).
    pub fn next_due(&self, size: u64) -> Option<u64> {
        let class = self.class_of(size).ok()?;
        self.quarantine.iter().find(|q| q.1 == class).map(|q| q.0)
    }

    /// Give back the block at `offset` that holds an extent of `size` bytes; reusable from
    /// `now + reuse_delay_ns`.
    pub fn free(&mut self, offset: u64, size: u64, now: u64) {
        let class = self.class_of(size).expect("freed extents were allocated");
        self.stats.in_use -= 1;
        if self.reuse_delay_ns == 0 {
            self.free[class].push(offset);
            return;
        }
        self.quarantine
            .push_back((now + self.reuse_delay_ns, class, offset));
        self.stats.quarantined += 1;
    }

    pub fn stats(&self) -> AllocStats {
        self.stats
    }

    /// Block sizes by class.
    pub fn classes(&self) -> &[u64] {
        &self.classes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_grow_by_a_quarter_up_to_the_largest_extent() {
        let c = block_classes(1000);
        assert_eq!(&c[..6], &[16, 24, 32, 40, 56, 72]);
        assert_eq!(*c.last().unwrap(), 1000);
        assert!(c.windows(2).all(|w| w[1] > w[0] && w[1].is_multiple_of(8)));
        assert_eq!(
            block_classes(8),
            vec![16],
            "at least one block of MIN_BLOCK"
        );
        // The largest extent the limits allow (64 KiB key, 64 MiB value) fits the class cap.
        assert!(ExtentAlloc::new(1 << 40, 8 + (64 << 10) + (64 << 20), 0).is_some());
    }

    #[test]
    fn blocks_are_distinct_and_within_the_region() {
        let mut a = ExtentAlloc::new(4096, 256, 0).unwrap();
        let mut got = Vec::new();
        for size in [16u64, 24, 100, 256, 17, 40] {
            let off = a.alloc(size, 0).unwrap();
            let block = a.classes()[a.class_of(size).unwrap()];
            assert!(off.is_multiple_of(8) && off + block <= 4096);
            got.push((off, block));
        }
        got.sort();
        assert!(got.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "{got:?}");
        assert_eq!(a.stats().in_use, 6);
    }

    #[test]
    fn a_full_region_is_an_error_naming_the_blocks_awaiting_reuse() {
        let mut a = ExtentAlloc::new(64, 32, 1_000).unwrap();
        let x = a.alloc(32, 0).unwrap();
        let y = a.alloc(32, 0).unwrap();
        assert_eq!(
            a.alloc(32, 0),
            Err(AllocError::Full {
                size: 32,
                block: 32,
                awaiting_reuse: 0
            })
        );
        a.free(x, 32, 10);
        assert_eq!(
            a.alloc(30, 500),
            Err(AllocError::Full {
                size: 30,
                block: 32,
                awaiting_reuse: 1
            }),
            "a freed block waits out its delay"
        );
        assert_eq!(a.next_due(30), Some(1_010));
        assert_eq!(a.next_due(16), None, "no block of that class waits");
        assert_eq!(a.alloc(32, 1_010), Ok(x), "and is reused after it");
        assert_eq!(a.stats().reused, 1);
        assert_eq!(
            a.alloc(33, 0),
            Err(AllocError::TooLarge { size: 33, max: 32 })
        );
        assert_ne!(x, y);
        let e = a.alloc(8, 2_000).unwrap_err().to_string();
        assert!(e.contains("extent region full"), "{e}");
    }

    #[test]
    fn without_a_delay_the_last_freed_block_is_reused_first() {
        let mut a = ExtentAlloc::new(1024, 64, 0).unwrap();
        let x = a.alloc(24, 0).unwrap();
        let y = a.alloc(24, 0).unwrap();
        a.free(x, 24, 0);
        a.free(y, 24, 0);
        assert_eq!(a.alloc(24, 0), Ok(y));
        assert_eq!(a.alloc(20, 0), Ok(x));
        assert_eq!(a.stats().quarantined, 0);
    }
}
