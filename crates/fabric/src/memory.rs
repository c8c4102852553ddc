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
//! On x86-64 these are plain loads and stores.

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
        for (w, out) in self.words()[r].iter().zip(buf.chunks_exact_mut(8)) {
            out.copy_from_slice(&w.load(Ordering::Acquire).to_le_bytes());
        }
        Ok(())
    }

    /// Copy words in, in ascending address order.
    pub fn write(&self, offset: u64, buf: &[u8]) -> Result<(), AccessError> {
        let r = self.range(offset, buf.len())?;
        for (w, src) in self.words()[r].iter().zip(buf.chunks_exact(8)) {
            w.store(
                u64::from_le_bytes(src.try_into().unwrap()),
                Ordering::Release,
            );
        }
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
