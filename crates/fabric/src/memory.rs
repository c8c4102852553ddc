//! Word-addressed shared memory: the bytes behind a registered region.
//!
//! Memory that other parties access concurrently (other threads here, a NIC or another process
//! elsewhere) is treated as an array of `AtomicU64`. Reads load words with `Acquire` in
//! ascending address order, writes store them with `Release` in ascending address order, and CAS
//! is a `SeqCst` compare-exchange. That gives exactly the ordering the protocol needs:
//! - a DTE written before the CAS that publishes its ITE is fully visible to anyone who reads
//!   that ITE and then the DTE (CAS releases, the ITE read acquires);
//! - a recycle flag stored after its timestamp, and read before it, never exposes a torn
//!   timestamp.
//!
//! On x86-64 these are plain loads and stores. Copies of at least [`BULK_MIN_BYTES`] go 16
//! bytes at a time (`bulk`): aligned SSE loads and stores, which CPUs with AVX perform
//! atomically, in ascending address order, inside `asm!` so that the compiler neither splits
//! nor reorders them. x86 keeps loads in order with loads and stores with stores, so both
//! properties above hold, and a word is never torn. A word-at-a-time loop cannot be vectorised
//! (atomics never are): a cold 16 KiB local READ took 1.7× a plain copy that way. Reads of at
//! least [`REP_MIN_BYTES`] are one `rep movsq`, whose quadwords are atomic but may load out of
//! order among themselves; no protocol step depends on the order of words within one READ
//! (no backend promises it: `docs/fabric.md`), and both properties above are across words.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::stats::{Locality, OpKind, StatsCell};
use crate::{FabricError, RemoteAddr, ALIGN};

/// A contiguous array of 64-bit words.
pub struct WordMemory {
    ptr: NonNull<AtomicU64>,
    words: usize,
    owned: Option<Layout>,
}

// SAFETY: all access goes through atomics.
unsafe impl Send for WordMemory {}
unsafe impl Sync for WordMemory {}

/// Misuse of a [`WordMemory`] (the caller turns it into a fabric error with context).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    Misaligned,
    OutOfBounds,
}

impl AccessError {
    /// This misuse as the fabric error of an access of `len` bytes at `addr`, which is in `mem`.
    pub fn at(self, addr: RemoteAddr, len: usize, mem: &WordMemory) -> FabricError {
        match self {
            AccessError::Misaligned => FabricError::Misaligned {
                offset: addr.offset,
                len: len as u64,
                align: ALIGN,
            },
            AccessError::OutOfBounds => FabricError::OutOfBounds {
                node: addr.node,
                region: addr.region,
                offset: addr.offset,
                len: len as u64,
                size: mem.len_bytes(),
            },
        }
    }
}

/// An endpoint's READ of its own node's memory `mem` (at `addr`), counted as a direct access.
/// Every backend's `Endpoint::local_read`.
pub fn direct_read(
    mem: &WordMemory,
    addr: RemoteAddr,
    buf: &mut [u8],
    stats: &StatsCell,
) -> Result<(), FabricError> {
    let len = buf.len();
    mem.read(addr.offset, buf)
        .map_err(|e| e.at(addr, len, mem))?;
    stats.record(OpKind::Read, Locality::Direct, len as u64);
    Ok(())
}

/// An endpoint's WRITE to its own node's memory `mem` (at `addr`), counted as a direct access.
/// Every backend's `Endpoint::local_write`.
pub fn direct_write(
    mem: &WordMemory,
    addr: RemoteAddr,
    buf: &[u8],
    stats: &StatsCell,
) -> Result<(), FabricError> {
    mem.write(addr.offset, buf)
        .map_err(|e| e.at(addr, buf.len(), mem))?;
    stats.record(OpKind::Write, Locality::Direct, buf.len() as u64);
    Ok(())
}

impl WordMemory {
    /// Allocate `bytes` (rounded up to whole words) of zeroed memory. Large allocations come
    /// from the OS lazily, so a sparse index table costs only the pages it touches.
    pub fn zeroed(bytes: u64) -> Self {
        let words = bytes.div_ceil(ALIGN).max(1) as usize;
        let layout = Layout::array::<AtomicU64>(words).expect("region size overflows");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) } as *mut AtomicU64;
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self {
            ptr,
            words,
            owned: Some(layout),
        }
    }

    /// View foreign memory (e.g. a UCX-mapped region) as words.
    ///
    /// # Safety
    /// `ptr` must be 8-byte aligned, valid for `bytes` bytes for the lifetime of the returned
    /// value, and only ever accessed atomically by everyone else in this process.
    pub unsafe fn from_raw(ptr: *mut u8, bytes: u64) -> Self {
        assert_eq!(
            ptr as usize % ALIGN as usize,
            0,
            "region base must be word aligned"
        );
        Self {
            ptr: NonNull::new(ptr as *mut AtomicU64).expect("null region"),
            words: (bytes / ALIGN) as usize,
            owned: None,
        }
    }

    pub fn len_bytes(&self) -> u64 {
        self.words as u64 * ALIGN
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr() as *mut u8
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: ptr/words describe a live allocation of atomics.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.words) }
    }

    fn range(&self, offset: u64, len: usize) -> Result<std::ops::Range<usize>, AccessError> {
        if !offset.is_multiple_of(ALIGN) || !(len as u64).is_multiple_of(ALIGN) {
            return Err(AccessError::Misaligned);
        }
        let end = offset
            .checked_add(len as u64)
            .ok_or(AccessError::OutOfBounds)?;
        if end > self.len_bytes() {
            return Err(AccessError::OutOfBounds);
        }
        Ok((offset / ALIGN) as usize..(end / ALIGN) as usize)
    }

    /// Copy words out, in ascending address order.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), AccessError> {
        let r = self.range(offset, buf.len())?;
        let words = &self.words()[r];
        if buf.len() >= BULK_MIN_BYTES && bulk::available() {
            // SAFETY: `words` and `buf` have the same length in bytes; see `bulk`.
            unsafe { bulk::read(words, buf) };
            return Ok(());
        }
        read_words(words, buf);
        Ok(())
    }

    /// Hint that `len` bytes at `offset` will be read soon: the CPU starts loading their cache
    /// lines, so the misses overlap whatever the caller does first. Bytes outside the region
    /// are ignored; nothing is read or checked.
    pub fn prefetch(&self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.len_bytes());
        let mut at = offset & !(CACHE_LINE - 1);
        while at < end {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `at` is inside the region; a prefetch never faults or changes memory.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(self.as_ptr().add(at as usize) as *const i8);
            }
            at += CACHE_LINE;
        }
    }

    /// Copy words in, in ascending address order.
    pub fn write(&self, offset: u64, buf: &[u8]) -> Result<(), AccessError> {
        let r = self.range(offset, buf.len())?;
        let words = &self.words()[r];
        if buf.len() >= BULK_MIN_BYTES && bulk::available() {
            // SAFETY: `words` and `buf` have the same length in bytes; see `bulk`.
            unsafe { bulk::write(words, buf) };
            return Ok(());
        }
        write_words(words, buf);
        Ok(())
    }

    /// Atomic compare-and-swap of one word; returns the previous value.
    pub fn compare_and_swap(
        &self,
        offset: u64,
        expected: u64,
        desired: u64,
    ) -> Result<u64, AccessError> {
        let r = self.range(offset, 8)?;
        let w = &self.words()[r.start];
        Ok(
            match w.compare_exchange(expected, desired, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
        )
    }
}

/// Copies at least this long go 16 bytes at a time (below it the word loop is as fast).
pub const BULK_MIN_BYTES: usize = 128;

/// Reads at least this long are one `rep movsq`: the CPU's own string copy, which loads each
/// aligned quadword atomically but in no promised order (Intel SDM vol. 3A §9.2.4, fast-string
/// operation), the same guarantee as every backend's READ (`docs/fabric.md`). Shorter ones
/// pay its start-up. A cold 16 KiB read took 1.05–1.10× a plain copy with the SSE loop and
/// 0.97–1.03× with `rep movsq` (a C loop over 20,000 random offsets of 160 MiB).
pub const REP_MIN_BYTES: usize = 4096;

/// Writes at least this long stream their 64-byte blocks past the cache (`movntdq`, then
/// `sfence`). An entry is written into memory recycled an expiry period ago, long evicted: a
/// cached store first reads every line it fills. A cold 16 KiB write took 1.46 µs with cached
/// stores and 0.70 µs streamed (a C loop over 20,000 random offsets of 160 MiB). The writer
/// rarely reads its own entry back; readers on other cores find it in memory either way.
pub const STREAM_MIN_BYTES: usize = 4096;

/// Bytes per CPU cache line, the step of `WordMemory::prefetch`.
const CACHE_LINE: u64 = 64;

fn read_words(words: &[AtomicU64], buf: &mut [u8]) {
    for (w, out) in words.iter().zip(buf.chunks_exact_mut(8)) {
        out.copy_from_slice(&w.load(Ordering::Acquire).to_le_bytes());
    }
}

fn write_words(words: &[AtomicU64], buf: &[u8]) {
    for (w, src) in words.iter().zip(buf.chunks_exact(8)) {
        w.store(
            u64::from_le_bytes(src.try_into().unwrap()),
            Ordering::Release,
        );
    }
}

/// Bulk copies of shared words: a word-aligned head or tail word atomically, the 16-byte
/// aligned middle 64 bytes per step with aligned SSE loads or stores (each one atomic on CPUs
/// with AVX: Intel SDM vol. 3A §9.1.1, AMD APM vol. 2 §7.3.2), all in ascending order; reads
/// of [`REP_MIN_BYTES`] or more with one `rep movsq`.
#[cfg(target_arch = "x86_64")]
mod bulk {
    use super::{read_words, write_words, REP_MIN_BYTES, STREAM_MIN_BYTES};
    use std::sync::atomic::AtomicU64;

    /// Whether the CPU makes aligned 16-byte accesses atomic.
    pub fn available() -> bool {
        std::arch::is_x86_feature_detected!("avx")
    }

    /// Word counts of the head (up to 16-byte alignment), the 64-byte steps and the tail.
    fn split(words: &[AtomicU64]) -> (usize, usize, usize) {
        let head = usize::from(!(words.as_ptr() as usize).is_multiple_of(16)).min(words.len());
        let steps = (words.len() - head) / 8;
        (head, steps, words.len() - head - steps * 8)
    }

    /// # Safety
    /// `buf.len() == 8 * words.len()`, and the CPU has AVX (`available`).
    pub unsafe fn read(words: &[AtomicU64], buf: &mut [u8]) {
        debug_assert_eq!(buf.len(), words.len() * 8);
        if buf.len() >= REP_MIN_BYTES {
            // SAFETY: `words.len()` quadwords from `words` into `buf`, which holds as many
            // bytes. Each quadword is loaded whole: it is 8-byte aligned, so inside one cache
            // line (SDM vol. 3A §9.2.4). The direction flag is clear on entry to `asm!`.
            unsafe {
                std::arch::asm!(
                    "rep movsq",
                    inout("rcx") words.len() => _,
                    inout("rsi") words.as_ptr() => _,
                    inout("rdi") buf.as_mut_ptr() => _,
                    options(nostack, preserves_flags),
                );
            }
            return;
        }
        let (head, steps, _) = split(words);
        read_words(&words[..head], &mut buf[..head * 8]);
        let mid = head + steps * 8;
        if steps > 0 {
            // SAFETY: `steps` 64-byte blocks from a 16-byte aligned word of `words` into `buf`.
            unsafe {
                std::arch::asm!(
                    "2:",
                    "prefetcht0 [{s} + 512]",
                    "movdqa {a}, xmmword ptr [{s}]",
                    "movdqa {b}, xmmword ptr [{s} + 16]",
                    "movdqa {c}, xmmword ptr [{s} + 32]",
                    "movdqa {e}, xmmword ptr [{s} + 48]",
                    "movdqu xmmword ptr [{d}], {a}",
                    "movdqu xmmword ptr [{d} + 16], {b}",
                    "movdqu xmmword ptr [{d} + 32], {c}",
                    "movdqu xmmword ptr [{d} + 48], {e}",
                    "add {s}, 64",
                    "add {d}, 64",
                    "dec {n}",
                    "jnz 2b",
                    s = inout(reg) words[head..].as_ptr() => _,
                    d = inout(reg) buf[head * 8..].as_mut_ptr() => _,
                    n = inout(reg) steps => _,
                    a = out(xmm_reg) _,
                    b = out(xmm_reg) _,
                    c = out(xmm_reg) _,
                    e = out(xmm_reg) _,
                    options(nostack),
                );
            }
        }
        read_words(&words[mid..], &mut buf[mid * 8..]);
    }

    /// # Safety
    /// `buf.len() == 8 * words.len()`, and the CPU has AVX (`available`).
    pub unsafe fn write(words: &[AtomicU64], buf: &[u8]) {
        debug_assert_eq!(buf.len(), words.len() * 8);
        let (head, steps, _) = split(words);
        write_words(&words[..head], &buf[..head * 8]);
        let mid = head + steps * 8;
        // `steps` 64-byte blocks from `buf` to a 16-byte aligned word of `words`, with the
        // given store instruction, then the given fence.
        macro_rules! store_blocks {
            ($store:literal, $fence:literal) => {
                std::arch::asm!(
                    "2:",
                    "movdqu {a}, xmmword ptr [{s}]",
                    "movdqu {b}, xmmword ptr [{s} + 16]",
                    "movdqu {c}, xmmword ptr [{s} + 32]",
                    "movdqu {e}, xmmword ptr [{s} + 48]",
                    concat!($store, " xmmword ptr [{d}], {a}"),
                    concat!($store, " xmmword ptr [{d} + 16], {b}"),
                    concat!($store, " xmmword ptr [{d} + 32], {c}"),
                    concat!($store, " xmmword ptr [{d} + 48], {e}"),
                    "add {s}, 64",
                    "add {d}, 64",
                    "dec {n}",
                    "jnz 2b",
                    $fence,
                    s = inout(reg) buf[head * 8..].as_ptr() => _,
                    d = inout(reg) words[head..].as_ptr() => _,
                    n = inout(reg) steps => _,
                    a = out(xmm_reg) _,
                    b = out(xmm_reg) _,
                    c = out(xmm_reg) _,
                    e = out(xmm_reg) _,
                    options(nostack),
                )
            };
        }
        if steps > 0 && buf.len() >= STREAM_MIN_BYTES {
            // SAFETY: `steps` whole blocks lie in both. The `sfence` makes the streamed stores
            // visible before any later store (the tail words here, the CAS that publishes the
            // entry after).
            unsafe { store_blocks!("movntdq", "sfence") }
        } else if steps > 0 {
            // SAFETY: as above; aligned stores are ordered like any other.
            unsafe { store_blocks!("movdqa", "") }
        }
        write_words(&words[mid..], &buf[mid * 8..]);
    }
}

/// Elsewhere every copy is a word loop.
#[cfg(not(target_arch = "x86_64"))]
mod bulk {
    use std::sync::atomic::AtomicU64;

    pub fn available() -> bool {
        false
    }

    pub unsafe fn read(_: &[AtomicU64], _: &mut [u8]) {
        unreachable!("no bulk copies on this architecture")
    }

    pub unsafe fn write(_: &[AtomicU64], _: &[u8]) {
        unreachable!("no bulk copies on this architecture")
    }
}

impl Drop for WordMemory {
    fn drop(&mut self) {
        if let Some(layout) = self.owned {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr() as *mut u8, layout) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prefetch is only a hint: any offset and length, inside the region or not, leaves
    /// memory as it was and never faults.
    #[test]
    fn prefetch_anywhere_changes_nothing() {
        let m = WordMemory::zeroed(4096);
        m.write(64, &[7u8; 256]).unwrap();
        for (off, len) in [
            (0, 4096),
            (3, 1),
            (4000, 1 << 20),
            (4096, 64),
            (u64::MAX - 8, u64::MAX),
        ] {
            m.prefetch(off, len);
        }
        let mut all = vec![0u8; 4096];
        m.read(0, &mut all).unwrap();
        assert!(all[..64].iter().chain(&all[320..]).all(|&b| b == 0));
        assert!(all[64..320].iter().all(|&b| b == 7));
    }

    /// Every offset and length around the bulk threshold and the 16-byte alignment (head word,
    /// 64-byte steps, tail words) copies exactly its bytes and nothing beside them.
    #[test]
    fn bulk_copies_match_word_copies_at_every_alignment() {
        let size = 2 * REP_MIN_BYTES as u64;
        let near_rep = (REP_MIN_BYTES - 16..=REP_MIN_BYTES + 16).step_by(8);
        for off in (0..64).step_by(8) {
            for len in (0..=BULK_MIN_BYTES * 3).step_by(8).chain(near_rep.clone()) {
                let m = WordMemory::zeroed(size);
                let data: Vec<u8> = (0..len).map(|i| (i * 7 + off + 1) as u8).collect();
                m.write(off as u64, &data).unwrap();
                let mut all = vec![0u8; size as usize];
                read_words(m.words(), &mut all);
                assert_eq!(&all[off..off + len], &data[..], "write at {off}+{len}");
                assert!(all[..off].iter().chain(&all[off + len..]).all(|&b| b == 0));
                let mut out = vec![0u8; len];
                m.read(off as u64, &mut out).unwrap();
                assert_eq!(out, data, "read at {off}+{len}");
            }
        }
    }

    /// A reader racing a writer sees every word whole: each one of the values written, never a
    /// mix of two (every byte of a value is the same, so a torn word shows).
    #[test]
    fn words_are_never_torn_by_concurrent_bulk_copies() {
        // Reads with the SSE loop and with `rep movsq`, against writes with cached and with
        // streamed stores.
        for write_len in [
            STREAM_MIN_BYTES - 64,
            2 * STREAM_MIN_BYTES.max(REP_MIN_BYTES),
        ] {
            for len in [REP_MIN_BYTES - 8, REP_MIN_BYTES + 8] {
                never_torn(len, write_len);
            }
        }
    }

    fn never_torn(len: usize, write_len: usize) {
        let size = write_len.max(len);
        let m = std::sync::Arc::new(WordMemory::zeroed(size as u64 + 8));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (m, stop) = (m.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut k, mut src) = (0u8, vec![0u8; write_len]);
                while !stop.load(Ordering::Relaxed) {
                    k = k.wrapping_add(1);
                    src.fill(k);
                    // A head word, then 16-byte aligned; beyond it, the words stay zero.
                    m.write(8, &src).unwrap();
                }
            })
        };
        let mut buf = vec![0u8; len];
        let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
        let mut reads = 0u64;
        while std::time::Instant::now() < until {
            m.read(8, &mut buf).unwrap();
            reads += 1;
            for w in buf.chunks_exact(8) {
                assert!(w.iter().all(|&b| b == w[0]), "torn word {w:?}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(reads > 0);
    }

    #[test]
    fn roundtrip_and_bounds() {
        let m = WordMemory::zeroed(64);
        let data: Vec<u8> = (0..16).collect();
        m.write(8, &data).unwrap();
        let mut out = [0u8; 16];
        m.read(8, &mut out).unwrap();
        assert_eq!(&out[..], &data[..]);
        assert_eq!(m.read(3, &mut out), Err(AccessError::Misaligned));
        assert_eq!(m.read(56, &mut out), Err(AccessError::OutOfBounds));
        assert_eq!(m.write(8, &data[..5]), Err(AccessError::Misaligned));
        let mut z = [0u8; 8];
        m.read(0, &mut z).unwrap();
        assert_eq!(z, [0; 8], "fresh memory is zeroed");
    }

    #[test]
    fn cas_semantics() {
        let m = WordMemory::zeroed(16);
        assert_eq!(m.compare_and_swap(8, 0, 7).unwrap(), 0);
        assert_eq!(
            m.compare_and_swap(8, 0, 9).unwrap(),
            7,
            "failed CAS returns current value"
        );
        let mut b = [0u8; 8];
        m.read(8, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), 7);
        assert_eq!(m.compare_and_swap(4, 0, 1), Err(AccessError::Misaligned));
    }
}
