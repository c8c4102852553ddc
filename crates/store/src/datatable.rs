//! Data table management: a node's DTEs are allocated only by that node's own client workers
//! (writers place new entries in their local memory) and come back in two ways:
//! - an entry that was never published (its CAS failed) is returned at once
//!   ([`DataTable::release_unpublished`]);
//! - an entry that some ITE referred to is *marked for recycling* by whoever cleared or replaced
//!   that ITE (one word: recycle flag and expiry timestamp, written into the DTE itself). The owner finds
//!   such entries by scanning when its free list runs dry, and reuses one only once its expiry
//!   time (plus a clock-skew margin) has passed: a slow reader that saw the old ITE has timed out
//!   by then.
//!
//! Entries never handed out are tracked by a high-water mark, so a fresh table costs nothing.
//!
//! A few entries are held back for DELETE ([`Purpose::Delete`]): a delete needs a marker DTE
//! for the length of the operation, like any write, and without a reserve a table filled by
//! PUTs could never be emptied again (every delete failing with "data table full"). The reserve
//! is a low-water mark on the free entries, not a separate list: entries that come back from
//! recycling serve either purpose.

use std::sync::Mutex;

use nessie_fabric::{Endpoint, FabricError};

use crate::dte::{DteLayout, RECYCLE_OFF};
use crate::DATA_REGION;

/// One entry in this many is held back for deletes...
pub const DELETE_RESERVE_FRACTION: u64 = 64;
/// ...but at least one (when the table has two or more entries) and at most this many.
pub const MAX_DELETE_RESERVE: u64 = 1024;

/// Entries of a table of `capacity` that only deletes may take.
pub fn delete_reserve(capacity: u64) -> u64 {
    if capacity < 2 {
        return 0;
    }
    (capacity / DELETE_RESERVE_FRACTION).clamp(1, MAX_DELETE_RESERVE)
}

/// What an entry is allocated for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// A new value (PUT, or a MIGRATE copy): may not dip into the delete reserve.
    Value,
    /// A DELETE's marker: may take the last free entries.
    Delete,
}

/// Why no entry could be allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("data table {dti} is full: {capacity} entries, {awaiting_expiry} released but not yet expired")]
    Full {
        dti: u32,
        capacity: u64,
        awaiting_expiry: u64,
        next_ready_ns: Option<u64>,
    },
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// Counters describing a data table's fill.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub capacity: u64,
    /// Entries never handed out yet.
    pub never_used: u64,
    /// Entries on the free list.
    pub free: u64,
    /// Entries reclaimed by scans so far.
    pub reclaimed_total: u64,
    /// Scans performed so far.
    pub scans: u64,
}

impl Usage {
    /// Entries handed out and not known to be free (in use, in flight, or awaiting expiry).
    pub fn allocated(&self) -> u64 {
        self.capacity - self.never_used - self.free
    }
}

#[derive(Debug)]
struct State {
    free: Vec<u64>,
    fresh_next: u64,
    reclaimed_total: u64,
    scans: u64,
}

/// One node's data table allocator (shared by the node's client workers).
#[derive(Debug)]
pub struct DataTable {
    dti: u32,
    layout: DteLayout,
    capacity: u64,
    /// Free entries only deletes may take (see [`delete_reserve`]).
    reserve: u64,
    clock_margin_ns: u64,
    state: Mutex<State>,
}

impl DataTable {
    pub fn new(dti: u32, layout: DteLayout, capacity: u64, clock_margin_ns: u64) -> Self {
        Self {
            dti,
            layout,
            capacity,
            reserve: delete_reserve(capacity),
            clock_margin_ns,
            state: Mutex::new(State {
                free: Vec::new(),
                fresh_next: 0,
                reclaimed_total: 0,
                scans: 0,
            }),
        }
    }

    pub fn dti(&self) -> u32 {
        self.dti
    }

    pub fn layout(&self) -> &DteLayout {
        &self.layout
    }

    /// Take a free entry for a new value (see [`DataTable::alloc_for`]).
    pub fn alloc<E: Endpoint>(&self, ep: &mut E) -> Result<u64, AllocError> {
        self.alloc_for(ep, Purpose::Value)
    }

    /// Take a free entry, scanning for expired recycled entries if too few are at hand: a
    /// value leaves the delete reserve untouched, a delete may take the last entry.
    /// `ep` must be an endpoint of this table's node.
    pub fn alloc_for<E: Endpoint>(&self, ep: &mut E, purpose: Purpose) -> Result<u64, AllocError> {
        let keep = match purpose {
            Purpose::Value => self.reserve,
            Purpose::Delete => 0,
        };
        let mut s = self.state.lock().unwrap();
        let mut scan = (0, None);
        if self.available(&s) <= keep {
            scan = self.scan_locked(&mut s, ep)?;
        }
        if self.available(&s) <= keep {
            let (awaiting_expiry, next_ready_ns) = scan;
            return Err(AllocError::Full {
                dti: self.dti,
                capacity: self.capacity,
                awaiting_expiry,
                next_ready_ns,
            });
        }
        if let Some(i) = s.free.pop() {
            return Ok(i);
        }
        s.fresh_next += 1;
        Ok(s.fresh_next - 1)
    }

    /// Entries that can be handed out now without a scan.
    fn available(&self, s: &State) -> u64 {
        s.free.len() as u64 + (self.capacity - s.fresh_next)
    }

    /// Entries held back for deletes.
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// Return an entry that was never referenced by any ITE: reusable immediately.
    pub fn release_unpublished(&self, index: u64) {
        assert!(
            index < self.capacity,
            "DTE {index} outside table of {}",
            self.capacity
        );
        self.state.lock().unwrap().free.push(index);
    }

    /// Reclaim every expired recycled entry now (what a background reclaimer calls).
    /// Returns the number of entries reclaimed.
    pub fn reclaim<E: Endpoint>(&self, ep: &mut E) -> Result<u64, FabricError> {
        let mut s = self.state.lock().unwrap();
        let before = s.free.len();
        self.scan_locked(&mut s, ep)?;
        Ok((s.free.len() - before) as u64)
    }

    /// Returns (entries awaiting expiry, earliest time one becomes reusable).
    fn scan_locked<E: Endpoint>(
        &self,
        s: &mut State,
        ep: &mut E,
    ) -> Result<(u64, Option<u64>), FabricError> {
        assert_eq!(
            ep.node() as u32,
            self.dti,
            "scan must run on the table's own node"
        );
        s.scans += 1;
        let now = ep.now_ns();
        let mut awaiting = 0;
        let mut next_ready: Option<u64> = None;
        let mut w = [0u8; 8];
        for i in 0..s.fresh_next {
            let base = self.layout.offset(i);
            ep.local_read(DATA_REGION, base + RECYCLE_OFF, &mut w)?;
            let Some(expiry) = DteLayout::recycle_expiry(u64::from_le_bytes(w)) else {
                continue;
            };
            let ready_at = expiry.saturating_add(self.clock_margin_ns);
            if now > ready_at {
                // Clear the flag so later scans do not hand the entry out twice.
                ep.local_write(DATA_REGION, base + RECYCLE_OFF, &0u64.to_le_bytes())?;
                s.free.push(i);
                s.reclaimed_total += 1;
            } else {
                awaiting += 1;
                next_ready = Some(next_ready.map_or(ready_at, |t: u64| t.min(ready_at)));
            }
        }
        Ok((awaiting, next_ready))
    }

    pub fn usage(&self) -> Usage {
        let s = self.state.lock().unwrap();
        Usage {
            capacity: self.capacity,
            never_used: self.capacity - s.fresh_next,
            free: s.free.len() as u64,
            reclaimed_total: s.reclaimed_total,
            scans: s.scans,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nessie_fabric::inproc::InProcFabric;
    use nessie_fabric::RemoteAddr;

    fn setup(cap: u64) -> (std::sync::Arc<InProcFabric>, DataTable) {
        let layout = DteLayout::new(8, 8);
        let f = InProcFabric::new(&[vec![8, layout.entry_size * cap], vec![8, 8]], None).unwrap();
        (f, DataTable::new(0, layout, cap, 1_000))
    }

    #[test]
    fn fresh_then_unpublished_then_full() {
        let (f, t) = setup(3);
        let mut ep = f.endpoint(0);
        assert_eq!(t.reserve(), 1);
        let got: Vec<u64> = (0..2).map(|_| t.alloc(&mut ep).unwrap()).collect();
        assert_eq!(got, vec![0, 1]);
        assert!(
            t.alloc(&mut ep).is_err(),
            "the last entry is kept for deletes"
        );
        assert_eq!(t.alloc_for(&mut ep, Purpose::Delete).unwrap(), 2);
        let e = t.alloc_for(&mut ep, Purpose::Delete).unwrap_err();
        assert!(
            matches!(
                e,
                AllocError::Full {
                    capacity: 3,
                    awaiting_expiry: 0,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("data table 0 is full"));
        t.release_unpublished(1);
        assert!(t.alloc(&mut ep).is_err(), "one free entry is the reserve");
        t.release_unpublished(0);
        assert_eq!(t.alloc(&mut ep).unwrap(), 0);
        assert_eq!(t.alloc_for(&mut ep, Purpose::Delete).unwrap(), 1);
        assert_eq!(t.usage().allocated(), 3);
    }

    #[test]
    fn delete_reserve_scales_with_the_table() {
        assert_eq!(delete_reserve(1), 0);
        assert_eq!(delete_reserve(2), 1);
        assert_eq!(delete_reserve(640), 10);
        assert_eq!(delete_reserve(1 << 30), MAX_DELETE_RESERVE);
    }

    #[test]
    fn recycled_entries_come_back_only_after_expiry_and_only_once() {
        let (f, t) = setup(2);
        let mut owner = f.endpoint(0);
        let mut remote = f.endpoint(1);
        let mut take = || t.alloc_for(&mut owner, Purpose::Delete).unwrap();
        let (a, b) = (take(), take());
        let layout = *t.layout();
        let now = remote.now_ns();
        // A remote releaser marks `a` expiring far in the future and `b` already expired.
        remote
            .write(
                RemoteAddr::new(0, DATA_REGION, layout.offset(a) + RECYCLE_OFF),
                &DteLayout::recycle_word(now + 60_000_000_000).to_le_bytes(),
            )
            .unwrap();
        remote
            .write(
                RemoteAddr::new(0, DATA_REGION, layout.offset(b) + RECYCLE_OFF),
                &DteLayout::recycle_word(now - 10_000).to_le_bytes(),
            )
            .unwrap();
        assert_eq!(
            t.alloc_for(&mut owner, Purpose::Delete).unwrap(),
            b,
            "expired entry is reclaimed"
        );
        match t.alloc_for(&mut owner, Purpose::Delete).unwrap_err() {
            AllocError::Full {
                awaiting_expiry: 1,
                next_ready_ns: Some(r),
                ..
            } => assert!(r > now),
            e => panic!("unexpected {e:?}"),
        }
        assert_eq!(
            t.reclaim(&mut owner).unwrap(),
            0,
            "b is not handed out twice, a not yet expired"
        );
        assert_eq!(t.usage().reclaimed_total, 1);
    }

    #[test]
    fn clock_margin_delays_reuse() {
        let layout = DteLayout::new(8, 8);
        let f = InProcFabric::new(&[vec![8, layout.entry_size]], None).unwrap();
        let t = DataTable::new(0, layout, 1, 10_000_000_000);
        let mut ep = f.endpoint(0);
        let a = t.alloc(&mut ep).unwrap();
        let now = ep.now_ns();
        ep.local_write(
            DATA_REGION,
            layout.offset(a) + RECYCLE_OFF,
            &DteLayout::recycle_word(now - 1_000).to_le_bytes(),
        )
        .unwrap();
        assert!(
            t.alloc(&mut ep).is_err(),
            "expired by its own clock but within the skew margin"
        );
    }
}
