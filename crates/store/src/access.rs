//! The access word of a DTE (layout version 2, `docs/layout.md`): what an eviction policy
//! needs to know of an entry's use, kept by GETs with one-sided WRITEs.
//!
//! ```text
//!  63 .... 57  56  55 ....... 48   47 .......................................... 0
//! +-----------+---+----------------+-----------------------------------------------+
//! | zero      | F | LFU counter    | last access, ms since the Unix epoch (48 bits) |
//! +-----------+---+----------------+-----------------------------------------------+
//! ```
//!
//! - **F, fetched**: set by the first GET that touches the entry, whatever the clock's age, so
//!   the reclaimer of expired items can count those never read (memcached's
//!   `expired_unfetched`). It costs one WRITE per item read at least once.
//! - **The access clock is coarse.** A GET rewrites the word only when the clock it holds is at
//!   least [`ACCESS_INTERVAL_MS`] old (or, for LFU, when the counter moves), so a hot key costs
//!   one WRITE per interval, not one per GET. Redis's LRU clock has a resolution of 1 s;
//!   memcached bumps an item at most once per 60 s.
//! - **The LFU counter is Redis's** (`lfu-log-factor` 10, `lfu-decay-time` 1 minute): a
//!   logarithmic 8-bit counter that an access increments with probability
//!   `1 / ((counter − LFU_INIT) × LFU_LOG_FACTOR + 1)`, and that loses one per minute since
//!   the last access. A new entry starts at [`LFU_INIT`], so that it is not evicted before it
//!   has had a chance to be read.
//! - **The word is a hint.** Two GETs may race to write it and one update is lost; a write
//!   may land on an entry that was released meanwhile (never reused within the GET's expiry
//!   period, so never on another entry's bytes). Nothing but victim choice reads it.

/// A GET rewrites an entry's access clock at most once per this many milliseconds.
pub const ACCESS_INTERVAL_MS: u64 = 100;
/// The counter of a new entry (Redis's `LFU_INIT_VAL`).
pub const LFU_INIT: u8 = 5;
/// Redis's `lfu-log-factor` default: how slowly the counter climbs.
pub const LFU_LOG_FACTOR: u64 = 10;
/// Redis's `lfu-decay-time` default: the counter loses one per this many ms without access.
pub const LFU_DECAY_MS: u64 = 60_000;

const CLOCK_BITS: u32 = 48;
const CLOCK_MASK: u64 = (1 << CLOCK_BITS) - 1;
const LFU_SHIFT: u32 = CLOCK_BITS;
const FETCHED: u64 = 1 << 56;

/// A DTE's access word, decoded.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Access(pub u64);

impl Access {
    /// The word of an entry written at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self::of(now_ms, LFU_INIT)
    }

    fn of(last_ms: u64, lfu: u8) -> Self {
        Self(last_ms & CLOCK_MASK | (lfu as u64) << LFU_SHIFT)
    }

    /// Whether a GET has touched the entry since it was written.
    pub fn fetched(self) -> bool {
        self.0 & FETCHED != 0
    }

    /// When the entry was last read (or written), ms since the Unix epoch.
    pub fn last_ms(self) -> u64 {
        self.0 & CLOCK_MASK
    }

    /// The LFU counter as stored (not decayed).
    pub fn counter(self) -> u8 {
        (self.0 >> LFU_SHIFT) as u8
    }

    /// The LFU counter at `now_ms`: one less per [`LFU_DECAY_MS`] since the last access.
    pub fn lfu_at(self, now_ms: u64) -> u8 {
        let periods = now_ms.saturating_sub(self.last_ms()) / LFU_DECAY_MS;
        self.counter()
            .saturating_sub(periods.min(u8::MAX as u64) as u8)
    }

    /// The word a GET at `now_ms` should write, if any: the clock when it is
    /// [`ACCESS_INTERVAL_MS`] old or the entry was never fetched, and with `lfu` the counter,
    /// decayed and then incremented with Redis's probability (`coin` uniform in
    /// `0..u64::MAX`). The word written is always marked fetched.
    pub fn touched(self, now_ms: u64, lfu: bool, coin: u64) -> Option<Access> {
        let stale = now_ms.saturating_sub(self.last_ms()) >= ACCESS_INTERVAL_MS || !self.fetched();
        let of = |c| Self(Self::of(now_ms, c).0 | FETCHED);
        if !lfu {
            return stale.then(|| of(self.counter()));
        }
        let mut c = self.lfu_at(now_ms);
        if c < u8::MAX {
            let base = c.saturating_sub(LFU_INIT) as u64;
            // P(increment) = 1 / (base × factor + 1): always at or below LFU_INIT.
            if coin.is_multiple_of(base * LFU_LOG_FACTOR + 1) {
                c += 1;
            }
        }
        (stale || c != self.counter()).then(|| of(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn a_new_word_round_trips_and_fits_its_bits() {
        let a = Access::new(NOW);
        assert_eq!((a.last_ms(), a.counter()), (NOW, LFU_INIT));
        assert_eq!(a.0 >> 56, 0, "the top byte is zero: not fetched");
        assert!(!a.fetched());
        const { assert!(NOW < CLOCK_MASK, "48 bits of ms last until the year 10889") };
    }

    #[test]
    fn the_first_touch_marks_the_entry_fetched_whatever_the_clock() {
        for lfu in [false, true] {
            let a = Access::new(NOW);
            let b = a.touched(NOW + 1, lfu, 1).expect("the first touch writes");
            assert!(b.fetched() && b.last_ms() == NOW + 1, "{b:?}");
            assert_eq!(b.0 >> 57, 0, "bits above F stay zero");
            // Once fetched, the interval applies again (the coin misses above LFU_INIT + 1).
            let hot = Access(Access::of(NOW, LFU_INIT + 3).0 | FETCHED);
            assert_eq!(hot.touched(NOW + 1, lfu, 1), None);
        }
    }

    #[test]
    fn the_clock_is_rewritten_once_per_interval() {
        let a = Access::new(NOW).touched(NOW, false, 0).unwrap();
        assert_eq!(a.touched(NOW + ACCESS_INTERVAL_MS - 1, false, 0), None);
        let b = a.touched(NOW + ACCESS_INTERVAL_MS, false, 0).unwrap();
        assert_eq!(
            (b.last_ms(), b.counter(), b.fetched()),
            (NOW + ACCESS_INTERVAL_MS, LFU_INIT, true)
        );
        assert_eq!(
            a.touched(NOW - 5, false, 0),
            None,
            "a clock behind the word's"
        );
    }

    #[test]
    fn the_lfu_counter_climbs_logarithmically_and_decays() {
        // At or below LFU_INIT every access counts.
        let a = Access::new(NOW).touched(NOW, true, 7).unwrap();
        assert_eq!(a.counter(), LFU_INIT + 1);
        // Above it, an access counts with probability 1 / (base × 10 + 1).
        let hot = Access(Access::of(NOW, LFU_INIT + 3).0 | FETCHED);
        assert_eq!(
            hot.touched(NOW, true, 1),
            None,
            "a miss of the coin, clock fresh"
        );
        assert_eq!(hot.touched(NOW, true, 31).unwrap().counter(), LFU_INIT + 4);
        // Many accesses: the counter grows far slower than their number (Redis documents
        // 142 after 100,000 hits at this factor, from 0 rather than LFU_INIT).
        let (mut w, mut coin) = (Access::new(NOW), 0x9e37_79b9_7f4a_7c15u64);
        for _ in 0..100_000 {
            coin = coin
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if let Some(n) = w.touched(NOW, true, coin >> 11) {
                w = n;
            }
        }
        assert!((120..180).contains(&w.counter()), "{}", w.counter());
        // One per minute idle.
        assert_eq!(w.lfu_at(NOW + 3 * LFU_DECAY_MS), w.counter() - 3);
        assert_eq!(Access::of(NOW, 2).lfu_at(NOW + 100 * LFU_DECAY_MS), 0);
        // The counter saturates.
        let max = Access(Access::of(NOW, u8::MAX).0 | FETCHED);
        assert_eq!(max.touched(NOW, true, 0), None);
    }
}
