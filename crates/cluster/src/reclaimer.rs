//! The reclaimer: one thread per node that, once per expiry period (within
//! [`INTERVAL_MIN`]..=[`INTERVAL_MAX`]), scans the pages the node's writers hold, here and on
//! other nodes, unless a writer scanned meanwhile (`ClassTable::reclaim_if_due`).
//!
//! A writer scans only when it runs out of room. Without this thread a node that stopped
//! writing would keep its pages, and their expired entries, out of every other writer's reach.
//! It touches only pages its own node claimed, as a writer's scan would, serves no requests and
//! sleeps between scans: no core is spent polling.
//!
//! With membership it scans only while the node may act (`Fence::may_act`, and the node a
//! full member): a scan clears the recycle words of expired entries, a write like any other,
//! and the pages of a node failed for good are adopted by the survivors
//! (`ClassTable::adopt_gone`), so a node cut off or paused past its replacement must not
//! touch what its allocator still lists until it has joined again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nessie_fabric::Endpoint;
use nessie_protocols::fence::{Fence, NodeRole};
use nessie_store::classtable::ClassTable;

/// Longest pause between scans.
pub const INTERVAL_MAX: Duration = Duration::from_secs(1);
/// Shortest pause between scans (a very short expiry period must not make it spin).
pub const INTERVAL_MIN: Duration = Duration::from_millis(10);
/// Longest sleep before the thread looks at its stop flag again.
const STOP_CHECK: Duration = Duration::from_millis(100);

/// Start the reclaimer of `table` (whose node `ep` belongs to) until `stop` is set, scanning
/// only while `fence` (membership's view, if any) lets the node act. The thread parks between
/// steps: unpark it after setting `stop` to end it at once.
pub fn spawn<E: Endpoint + 'static>(
    table: Arc<ClassTable>,
    mut ep: E,
    expiry_ns: u64,
    fence: Option<Arc<Fence>>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    let interval = Duration::from_nanos(expiry_ns).clamp(INTERVAL_MIN, INTERVAL_MAX);
    std::thread::Builder::new()
        .name(format!("nessie-reclaimer-{}", table.node()))
        .spawn(move || {
            let step = interval.min(STOP_CHECK);
            let mut slept = Duration::ZERO;
            while !stop.load(Ordering::Acquire) {
                std::thread::park_timeout(step);
                slept += step;
                if slept < interval {
                    continue;
                }
                slept = Duration::ZERO;
                let acting = fence.as_ref().is_none_or(|f| {
                    f.role(table.node()) == NodeRole::Full
                        && f.may_act(nessie_fabric::monotonic_ns(), expiry_ns)
                });
                if !acting {
                    continue;
                }
                if let Err(e) = table.reclaim_if_due(&mut ep, interval.as_nanos() as u64) {
                    tracing::warn!(%e, node = table.node(), "reclaimer scan failed");
                }
            }
        })
}
