//! Copies of a failed node, and the readers that have not heard yet.
//!
//! When a partition's primary c_0 fails, nodes learn of it at different times: from its
//! declaration in etcd until their view is read again. A node that has not heard still reads
//! c_0, for as long as its view is fresh enough to read by ([`Fence::may_read`]); over shared
//! memory a dead process's memory stays readable, and a paused process's comes back. Two rules
//! keep every reader on one history while that lasts ([`ReplicaSet::read_settle_ns`] after a
//! node learns of the failure, which covers every view read before the declaration):
//!
//! - A reader that knows does not read c_1 yet: c_1 decides first, so it may hold a word not
//!   yet carried to c_0, and a reader that does not know could read the older word at c_0
//!   after this one returned the newer (`read_copy`).
//! - A write or carried CAS that cannot reach c_0 (its endpoint noticed the death, another's
//!   did not) does not go on until nobody reads c_0 (`wait_unread`): else a reader that does
//!   not know could read a word older than one this operation already returned.
//!
//! A node that leaves avoids both waits: its copies stop being read at a cut-over named
//! ahead of its stop, while they are still written (rule 7a, `Fence::cut_over`): past it,
//! nobody reads them, so nobody waits when it stops.
//!
//! `docs/protocol.md` (Replication, rules 7 and 7a) has the argument; the tests below drive
//! the races with a reader whose view is older than the failure or the cut-over.

use nessie_fabric::{Endpoint, FabricError, NodeId};

#[cfg(doc)]
use super::ReplicaSet;
use super::{Copy, Part, ReadWindow, Replicated, RETRY_PAUSE_NS};
#[cfg(doc)]
use crate::fence::Fence;
use crate::fence::{CutOver, NodeRole};

impl<E: Endpoint> Replicated<E> {
    /// The copy of `partition` to read: the first full one, once no copy before it may still
    /// be read by a node that has not heard that its node failed. Until then this waits: were
    /// it to read the next copy, which decides first, it could see a word that has not reached
    /// the old primary yet, and a node with an older view could then read the old word there.
    ///
    /// `old_roles`: a data read, which takes a moved copy that is still settling for the
    /// receiving copy it was (rule 10a), and waits if no other copy may be read.
    pub(super) fn read_copy(&mut self, part: Part, old_roles: bool) -> Result<Copy, FabricError> {
        loop {
            self.wait_fresh_view()?;
            // One look at each role; the clock only if a failed node comes first.
            let mut now = None;
            let mut settled = true;
            let mut skipped = false;
            // A leaving node's copy past its read cut-over, and whether a copy after it failed
            // less than the settle time ago.
            let (mut past, mut recent) = (None, false);
            for j in 0..self.set.replicas {
                let (node, spot, role) = self.place(part, j);
                if old_roles && role == NodeRole::Full && self.fence.any_moved() {
                    let t = *now.get_or_insert_with(|| self.inner.mono_ns());
                    match self.moved_copy_window(part, j, t) {
                        ReadWindow::New => {}
                        ReadWindow::Old => {
                            skipped = true;
                            continue;
                        }
                        // Neither copy may be read yet: wait.
                        ReadWindow::Between => {
                            skipped = true;
                            settled = false;
                            break;
                        }
                    }
                }
                let copy = Copy {
                    node,
                    j,
                    spot,
                    fading: false,
                    receiving: false,
                    incarnation: self.fence.incarnation(node),
                };
                if role == NodeRole::Full && settled && self.fence.has_cut_over(node) {
                    let t = *now.get_or_insert_with(|| self.inner.mono_ns());
                    match self.fence.cut_over(node, t, self.cut_over_settle_ns()) {
                        CutOver::Before => {}
                        CutOver::Around => {
                            settled = false;
                            break;
                        }
                        CutOver::Past => {
                            past = past.or(Some(copy));
                            continue;
                        }
                    }
                }
                match role {
                    NodeRole::Full if settled || mutated!(self.set, read_next_copy_at_once) => {
                        return Ok(copy);
                    }
                    NodeRole::Full => break,
                    NodeRole::Receiving => {}
                    NodeRole::Gone => {
                        let t = *now.get_or_insert_with(|| self.inner.mono_ns());
                        settled &= !self.maybe_read_by_others(node, t);
                        // Only a copy after the one past its cut-over holds it up.
                        recent |= past.is_some()
                            && self
                                .fence
                                .gone_for_ns(node, t)
                                .is_some_and(|g| g < self.set.settle_ns);
                    }
                }
            }
            // No copy after the one past its cut-over may be read. Readers returned words from
            // the next copy (the decider, with two copies) that may not have reached it, so it
            // is read again only once that copy has failed for the settle time: by then it
            // decides itself, carries from the failed one's history have stopped, and a copy
            // filled anew would be filled from it anyway. Words that did not reach it are lost
            // with that copy, as with any second failure (rule 7a).
            if let (true, false, Some(c)) = (settled, skipped, past) {
                if !recent || mutated!(self.set, read_past_cut_over_at_once) {
                    return Ok(c);
                }
                settled = false;
            }
            if settled && !skipped {
                return Err(FabricError::NoCopy {
                    node: self.home(part),
                });
            }
            self.inner.sleep_ns(RETRY_PAUSE_NS);
        }
    }

    /// Whether nodes that have not heard of `node`'s failure may still read its copies at
    /// monotonic time `now_ns`: it was declared failed (here) less than the read settle time
    /// ago.
    fn maybe_read_by_others(&self, node: NodeId, now_ns: u64) -> bool {
        self.fence
            .gone_for_ns(node, now_ns)
            .is_some_and(|t| t < self.set.read_settle_ns)
            && !(self.fence.has_cut_over(node)
                && self.fence.cut_over(node, now_ns, self.cut_over_settle_ns()) == CutOver::Past)
    }

    /// Whether reads of `node`'s copies are no longer as before its read cut-over (rule 7a):
    /// then they go by [`Self::read_copy`], which waits around it and skips them past it.
    pub(super) fn near_cut_over(&self, node: NodeId) -> bool {
        self.fence.has_cut_over(node)
            && self
                .fence
                .cut_over(node, self.inner.mono_ns(), self.cut_over_settle_ns())
                != CutOver::Before
    }

    /// How long after learning of a leaving node's read cut-over this node waits, past it,
    /// before it stops reading the node's copies: the read settle time (rule 7a).
    pub(super) fn cut_over_settle_ns(&self) -> u64 {
        match mutated!(self.set, cut_over_when_named) {
            true => 0,
            false => self.set.read_settle_ns,
        }
    }

    /// Wait, after skipping copy `c` (its node failed), until nobody reads it any more: a
    /// node that has not heard of the failure may still read it, and must not read a word
    /// older than what this operation wrote or carried elsewhere.
    pub(super) fn wait_unread(&mut self, c: Copy) {
        if mutated!(self.set, skip_unreached_copy_at_once) {
            return;
        }
        while self.maybe_read_by_others(c.node, self.inner.mono_ns()) {
            self.inner.sleep_ns(RETRY_PAUSE_NS);
        }
    }

    /// Reads are served only while this node's view of membership is fresh: a node that has
    /// not heard of a failure reads the failed node's copies, which the others maintain, and
    /// wait for, only for the read settle time after they learn of it. A view that went stale
    /// less than the read settle time ago is waited on (the monitor reads it several times per
    /// freshness window, so a refresh is probably late, not lost); one stale for longer fails
    /// the read as `Fenced` at once, so a node cut off from membership answers quickly.
    pub(super) fn wait_fresh_view(&mut self) -> Result<(), FabricError> {
        let until = self.fence.view_until();
        if self.fenced_after(until).is_ok() {
            return Ok(());
        }
        let give_up = until.saturating_add(self.set.read_settle_ns);
        while self.fence_now() < give_up {
            self.inner.sleep_ns(RETRY_PAUSE_NS);
            if self.fence_now() < self.fence.view_until() {
                return Ok(());
            }
        }
        Err(FabricError::Fenced {
            node: self.inner.node(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use nessie_fabric::inproc::{InProcEndpoint, InProcFabric};
    use nessie_fabric::interpose::{Interposed, Interposer, Op};
    use nessie_fabric::RemoteAddr;
    use nessie_store::{Ite, IteLayout, INDEX_REGION};

    use super::super::{mirror_region, ReplicaSet};
    use super::*;
    use crate::config::{Mutations, ProtocolConfig};
    use crate::fence::Fence;

    /// How long after learning of a failure others may still read the failed copy (here).
    const READ_SETTLE: Duration = Duration::from_millis(150);
    /// Partition 0's first index entry: copy 0 on node 0 (the primary), copy 1 on node 1.
    const ENTRY: RemoteAddr = RemoteAddr::new(0, INDEX_REGION, 0);

    fn layout() -> IteLayout {
        IteLayout::new(20, 4, 7).unwrap()
    }

    /// What an endpoint whose node has noticed that `dead` died runs in front of its
    /// operations: every operation on `dead` fails, as over shared memory once a transport's
    /// keep-alive saw the process go, while endpoints of other nodes still reach its memory.
    struct Noticed {
        dead: NodeId,
    }

    impl Interposer for Noticed {
        fn before(&mut self, op: Op) -> Result<(), FabricError> {
            if op.addr().node == self.dead {
                return Err(FabricError::Unreachable {
                    node: self.dead,
                    reason: "peer process died".into(),
                });
            }
            Ok(())
        }
    }

    /// Two copies of three partitions; node 0 (partition 0's primary) is about to be declared
    /// failed. `old` is the view of a node that has not heard: fresh to read by for the read
    /// settle time from now, as if read just before the declaration.
    struct Rig {
        fabric: Arc<InProcFabric>,
        set: Arc<ReplicaSet>,
        old: Arc<Fence>,
        new: Arc<Fence>,
    }

    fn rig(mutations: Mutations) -> Rig {
        rig_settling(mutations, 2 * READ_SETTLE)
    }

    /// [`rig`], with a settle time of `settle`.
    fn rig_settling(mutations: Mutations, settle: Duration) -> Rig {
        let cfg = ProtocolConfig {
            expiry_ns: 5_000_000,
            clock_margin_ns: 0,
            mutations,
            ..ProtocolConfig::default()
        };
        let set = ReplicaSet::new(2, 3, layout(), &cfg)
            .unwrap()
            .with_settle_at_least(settle.as_nanos() as u64)
            .with_read_settle(READ_SETTLE.as_nanos() as u64);
        let regions = vec![set.region_sizes(&[64, 64, 8]); 3];
        let old = Fence::unfenced();
        old.set_view_until(nessie_fabric::monotonic_ns() + READ_SETTLE.as_nanos() as u64);
        Rig {
            fabric: InProcFabric::new(&regions, None).unwrap(),
            set: Arc::new(set),
            old: Arc::new(old),
            new: Arc::new(Fence::unfenced()),
        }
    }

    impl Rig {
        /// A client on node 2 that has not heard of the failure.
        fn old_reader(&self) -> Replicated<InProcEndpoint> {
            Replicated::new(self.fabric.endpoint(2), self.set.clone(), self.old.clone())
        }

        /// A client on node 2 whose endpoint noticed node 0's death, with the new view.
        fn knowing(&self) -> Replicated<Interposed<InProcEndpoint, Noticed>> {
            let inner = Interposed::new(self.fabric.endpoint(2), Noticed { dead: 0 });
            Replicated::new(inner, self.set.clone(), self.new.clone())
        }

        /// The word copy `j` of `ENTRY` holds.
        fn copy(&self, j: u8) -> u64 {
            let node = self.set.holder(0, j);
            let at = RemoteAddr::new(node, mirror_region(INDEX_REGION, j), 0);
            self.fabric.endpoint(node).read_u64(at).unwrap()
        }
    }

    /// The word a CAS from `prev` to an entry naming DTE `dte` installs.
    fn word(prev: u64, dte: u64) -> u64 {
        let l = layout();
        l.successor(Ite(prev), l.encode(1, 0, dte)).0
    }

    /// A read by a node that has not heard of the failure, after `after` returned: it must
    /// see `after`'s word, or be refused because its view went stale meanwhile.
    fn old_read_is_not_older(r: &Rig, after: u64) -> Result<(), String> {
        match r.old_reader().read_u64(ENTRY) {
            Ok(w) if w == after => Ok(()),
            Ok(w) => Err(format!(
                "a node that has not heard of the failure read {w:#x} at the old primary after {after:#x} was returned"
            )),
            Err(FabricError::Fenced { .. }) => Ok(()),
            Err(e) => Err(format!("unexpected error: {e}")),
        }
    }

    /// A writer whose endpoint cannot reach the failed primary any more decides at copy 1
    /// and cannot carry the word to copy 0, where others may still read: its CAS returns only
    /// once they no longer do.
    fn write_missing_the_primary(mutations: Mutations) -> Result<(), String> {
        let r = rig(mutations);
        r.new.set_gone(0, true);
        let w = word(0, 5);
        let mut writer = r.knowing();
        assert_eq!(writer.compare_and_swap(ENTRY, 0, w).unwrap(), 0);
        assert_eq!((r.copy(0), r.copy(1)), (0, w), "only copy 1 has the word");
        old_read_is_not_older(&r, w)
    }

    #[test]
    fn a_write_that_misses_the_failed_primary_waits_until_nobody_reads_it() {
        write_missing_the_primary(Mutations::default()).unwrap();
    }

    #[test]
    fn a_write_that_goes_on_at_once_is_caught() {
        let err = write_missing_the_primary(Mutations {
            skip_unreached_copy_at_once: true,
            ..Mutations::default()
        })
        .unwrap_err();
        assert!(err.contains("read 0x0"), "{err}");
    }

    /// A writer decided at copy 1 and has not reached copy 0 yet (it is slow, or died). A
    /// reader that knows of the failure reads, then one that does not: they must not see the
    /// word go back.
    fn read_across_views(mutations: Mutations) -> Result<(), String> {
        let r = rig(mutations);
        let w = word(0, 6);
        let decider = RemoteAddr::new(1, mirror_region(INDEX_REGION, 1), 0);
        assert_eq!(
            r.fabric
                .endpoint(1)
                .compare_and_swap(decider, 0, w)
                .unwrap(),
            0
        );
        r.new.set_gone(0, true);
        let seen = r.knowing().read_u64(ENTRY).unwrap();
        assert_eq!(seen, w, "the next copy holds the decided word");
        old_read_is_not_older(&r, seen)
    }

    #[test]
    fn a_reader_that_knows_waits_before_reading_the_next_copy() {
        let t0 = std::time::Instant::now();
        read_across_views(Mutations::default()).unwrap();
        assert!(t0.elapsed() >= READ_SETTLE, "the knowing read waited");
    }

    #[test]
    fn reading_the_next_copy_at_once_is_caught() {
        let err = read_across_views(Mutations {
            read_next_copy_at_once: true,
            ..Mutations::default()
        })
        .unwrap_err();
        assert!(err.contains("read 0x0"), "{err}");
    }

    /// A writer that does not know yet retries the unreachable primary; once the failure is
    /// declared it gives the copy up, and still waits until nobody reads it.
    #[test]
    fn a_write_that_learns_of_the_failure_while_retrying_also_waits() {
        let r = rig(Mutations::default());
        let inner = Interposed::new(r.fabric.endpoint(2), Noticed { dead: 0 });
        let mut writer = Replicated::new(inner, r.set.clone(), r.new.clone());
        let fence = r.new.clone();
        let declare = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            fence.set_gone(0, true);
            std::time::Instant::now()
        });
        let w = word(0, 7);
        assert_eq!(writer.compare_and_swap(ENTRY, 0, w).unwrap(), 0);
        let returned = std::time::Instant::now();
        let declared = declare.join().unwrap();
        assert!(
            returned.duration_since(declared) >= READ_SETTLE,
            "returned {:?} after the declaration",
            returned.duration_since(declared)
        );
        assert_eq!((r.copy(0), r.copy(1)), (0, w));
    }

    impl Rig {
        /// Put `w` straight into copy `j` of `ENTRY`, as if written there earlier.
        fn set_copy(&self, j: u8, w: u64) {
            let node = self.set.holder(0, j);
            let at = RemoteAddr::new(node, mirror_region(INDEX_REGION, j), 0);
            let was = self.copy(j);
            let mut e = self.fabric.endpoint(node);
            assert_eq!(e.compare_and_swap(at, was, w).unwrap(), was);
        }

        /// A client on node 2 with the new view, which reads the copies as they are.
        fn reader(&self) -> Replicated<InProcEndpoint> {
            Replicated::new(self.fabric.endpoint(2), self.set.clone(), self.new.clone())
        }
    }

    const MS: i128 = 1_000_000;
    /// The wall clock's reading now, as the tests pretend.
    const WALL: u64 = 1_000_000 * 1_000_000_000;

    fn mono() -> u64 {
        nessie_fabric::monotonic_ns()
    }

    /// Node 0 leaves: its copies are read until its cut-over, then the next copy is, and
    /// within the clock margin of it neither is.
    #[test]
    fn a_leaving_primary_is_read_until_its_cut_over_then_the_next_copy() {
        let r = rig(Mutations::default());
        let (a, b) = (word(0, 1), word(0, 2));
        r.set_copy(0, a);
        r.set_copy(1, b);
        // Learnt now, the cut-over a read settle time and 100 ms ahead, a 20 ms margin.
        let ahead = READ_SETTLE.as_nanos() as i128 + 100 * MS;
        // Before the fence reads its clock: the waits below are measured from no later.
        let t0 = std::time::Instant::now();
        r.new
            .set_cut_over(0, WALL + ahead as u64, (WALL, mono()), 20_000_000);
        assert_eq!(r.reader().read_u64(ENTRY).unwrap(), a, "before: copy 0");
        let cut = Duration::from_nanos(ahead as u64);
        std::thread::sleep((cut - Duration::from_millis(10)).saturating_sub(t0.elapsed()));
        // Within the margin: waits until it is past, then reads copy 1.
        assert_eq!(r.reader().read_u64(ENTRY).unwrap(), b, "after: copy 1");
        assert!(
            t0.elapsed() >= cut + Duration::from_millis(20),
            "read at {:?}, before the margin had passed",
            t0.elapsed()
        );
        assert_eq!(r.reader().read_u64(ENTRY).unwrap(), b);
    }

    /// A writer decided at copy 1 and has not reached copy 0. The cut-over was written late:
    /// it is past when a node learns of it, while a node that read its configuration before
    /// it was written still reads copy 0. A reader that knows must not read copy 1 until that
    /// node's view is stale.
    fn read_across_a_late_cut_over(mutations: Mutations) -> Result<(), String> {
        let r = rig(mutations);
        let w = word(0, 8);
        r.set_copy(1, w);
        r.new
            .set_cut_over(0, WALL - 1_000 * MS as u64, (WALL, mono()), 0);
        let seen = r.reader().read_u64(ENTRY).unwrap();
        assert_eq!(seen, w, "past the cut-over: copy 1");
        old_read_is_not_older(&r, seen)
    }

    #[test]
    fn a_reader_that_learns_of_a_past_cut_over_waits_the_read_settle_time() {
        let t0 = std::time::Instant::now();
        read_across_a_late_cut_over(Mutations::default()).unwrap();
        assert!(t0.elapsed() >= READ_SETTLE, "the knowing read waited");
    }

    #[test]
    fn a_cut_over_taken_as_named_is_caught() {
        let err = read_across_a_late_cut_over(Mutations {
            cut_over_when_named: true,
            ..Mutations::default()
        })
        .unwrap_err();
        assert!(err.contains("read 0x0"), "{err}");
    }

    /// Past its cut-over, a leaving node that stops makes nobody wait: readers already read
    /// copy 1, and writers that miss its copy go on. Without the cut-over both wait the read
    /// settle time (the tests above).
    #[test]
    fn a_node_that_stops_past_its_cut_over_makes_nobody_wait() {
        let r = rig(Mutations::default());
        r.new
            .set_cut_over(0, WALL - 1_000 * MS as u64, (WALL, mono()), 0);
        std::thread::sleep(READ_SETTLE);
        r.new.set_gone(0, true);
        let t0 = std::time::Instant::now();
        let w = word(0, 9);
        assert_eq!(r.knowing().compare_and_swap(ENTRY, 0, w).unwrap(), 0);
        assert_eq!(r.knowing().read_u64(ENTRY).unwrap(), w);
        assert_eq!((r.copy(0), r.copy(1)), (0, w), "copy 0 missed it");
        assert!(t0.elapsed() < READ_SETTLE / 2, "waited {:?}", t0.elapsed());
    }

    /// How long the fallback test's settle time is: long enough that a carrier may still land
    /// after the read settle time (carries stop at half the settle time).
    const FALLBACK_SETTLE: Duration = Duration::from_millis(1_200);

    /// Past its cut-over, a leaving node's copy is read again only once the copy after it (the
    /// decider, which readers read) has failed for the settle time: before that, a carrier of
    /// a word decided there, which a reader returned, may still be on its way to it.
    fn read_back_after_the_next_copy_fails(mutations: Mutations) -> Result<Duration, String> {
        let r = rig_settling(mutations, FALLBACK_SETTLE);
        r.new
            .set_cut_over(0, WALL - 1_000 * MS as u64, (WALL, mono()), 0);
        std::thread::sleep(READ_SETTLE);
        let w = word(0, 3);
        r.set_copy(1, w);
        let seen = r.reader().read_u64(ENTRY).unwrap();
        assert_eq!(seen, w, "copy 1, past the cut-over");
        let t0 = std::time::Instant::now();
        r.new.set_gone(1, true);
        // The writer's carry reaches copy 0 late, before half the settle time.
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(FALLBACK_SETTLE * 3 / 8);
                r.set_copy(0, w);
            });
            match r.reader().read_u64(ENTRY) {
                Ok(v) if v == seen => Ok(t0.elapsed()),
                Ok(v) => Err(format!(
                    "read {v:#x} at copy 0 after {seen:#x} was returned from copy 1"
                )),
                Err(e) => Err(format!("unexpected error: {e}")),
            }
        })
    }

    #[test]
    fn a_copy_past_its_cut_over_is_read_again_only_once_the_next_has_failed_for_the_settle_time() {
        let waited = read_back_after_the_next_copy_fails(Mutations::default()).unwrap();
        assert!(waited >= FALLBACK_SETTLE, "read back after {waited:?}");
    }

    #[test]
    fn reading_a_copy_past_its_cut_over_again_at_once_is_caught() {
        let err = read_back_after_the_next_copy_fails(Mutations {
            read_past_cut_over_at_once: true,
            ..Mutations::default()
        })
        .unwrap_err();
        assert!(err.contains("read 0x0"), "{err}");
    }

    /// The leaving node's own reads of its own copies follow the cut-over too: they go to the
    /// next copy, as everyone else's do.
    #[test]
    fn a_leaving_node_reads_its_own_copies_by_the_cut_over_too() {
        use nessie_store::DATA_REGION;
        let r = rig(Mutations::default());
        let copy = |j: u8| RemoteAddr::new(r.set.holder(0, j), mirror_region(DATA_REGION, j), 0);
        r.fabric.endpoint(0).write(copy(0), &[1; 8]).unwrap();
        r.fabric.endpoint(1).write(copy(1), &[2; 8]).unwrap();
        let mut own = Replicated::new(r.fabric.endpoint(0), r.set.clone(), r.new.clone());
        let mut buf = [0u8; 8];
        own.local_read(DATA_REGION, 0, &mut buf).unwrap();
        assert_eq!(buf, [1; 8], "before: its own memory");
        r.new
            .set_cut_over(0, WALL - 1_000 * MS as u64, (WALL, mono()), 0);
        std::thread::sleep(READ_SETTLE);
        own.local_read(DATA_REGION, 0, &mut buf).unwrap();
        assert_eq!(buf, [2; 8], "past the cut-over: copy 1");
    }

    /// A leaving node's own read that first waits for its view, and is taken past the cut-over
    /// by that wait, reads the next copy, not its own memory.
    #[test]
    fn a_leaving_node_s_own_read_that_waits_past_the_cut_over_reads_the_next_copy() {
        use nessie_store::DATA_REGION;
        let r = rig(Mutations::default());
        let copy = |j: u8| RemoteAddr::new(r.set.holder(0, j), mirror_region(DATA_REGION, j), 0);
        r.fabric.endpoint(0).write(copy(0), &[1; 8]).unwrap();
        r.fabric.endpoint(1).write(copy(1), &[2; 8]).unwrap();
        let fence = Arc::new(Fence::unfenced());
        fence.set_view_until(mono());
        // Its end of reads 30 ms ahead; the view refreshed 60 ms from now (a read waits up to
        // the read settle time, 150 ms, for that).
        fence.set_cut_over(0, WALL + 30 * MS as u64, (WALL, mono()), 0);
        let mut own = Replicated::new(r.fabric.endpoint(0), r.set.clone(), fence.clone());
        let mut buf = [0u8; 8];
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(60));
                fence.set_view_until(u64::MAX - 1);
            });
            own.local_read(DATA_REGION, 0, &mut buf).unwrap();
        });
        assert_eq!(buf, [2; 8], "read its own copy past the cut-over");
    }

    /// A view gone stale is waited on: refreshed in time, the read goes on; not, it is refused,
    /// and once it has been stale for the read settle time, refused at once.
    #[test]
    fn a_read_waits_for_a_stale_view_then_is_refused() {
        let r = rig(Mutations::default());
        r.old.set_view_until(nessie_fabric::monotonic_ns());
        let fence = r.old.clone();
        let refresh = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            fence.set_view_until(u64::MAX - 1);
        });
        assert_eq!(r.old_reader().read_u64(ENTRY).unwrap(), 0);
        refresh.join().unwrap();
        let stale_at = nessie_fabric::monotonic_ns();
        r.old.set_view_until(stale_at);
        let t0 = std::time::Instant::now();
        assert!(matches!(
            r.old_reader().read_u64(ENTRY),
            Err(FabricError::Fenced { node: 2 })
        ));
        let waited = t0.elapsed();
        assert!(
            waited >= READ_SETTLE - Duration::from_millis(5),
            "it waited for a refresh first: {waited:?}"
        );
        let t1 = std::time::Instant::now();
        assert!(matches!(
            r.old_reader().read_u64(ENTRY),
            Err(FabricError::Fenced { node: 2 })
        ));
        assert!(
            t1.elapsed() < READ_SETTLE / 2,
            "a view stale for longer is refused at once"
        );
    }
}
