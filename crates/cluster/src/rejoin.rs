//! The rejoiner: one thread per node process (with replication and membership) that, while the
//! configuration says the node is `joining`, fills the copies it holds from the primaries
//! (`Replicated::catch_up`), adopts the pages its earlier incarnation claimed
//! (`ClassTable::adopt`), and then says it is ready, so that membership makes it `up`; and,
//! while it is `up`, fills the copies moved to it from a node gone for good (re-replication)
//! and says so, so that membership makes them full; and adopts its share of the pages claimed
//! by nodes failed for good (`membership.replace_after_s`), whose allocators died with them
//! (`ClassTable::adopt_gone`); hands over the entries of index partitions migrating to it; and,
//! on the lowest-numbered up node, runs the balancer (`balance_step`), which starts the
//! migrations that re-create a failed-for-good node's index copies and balance the rest.
//!
//! It starts catching up only once the node has known itself `joining` for the join settle
//! time (`ReplicaSet::join_settle_ns`: a lease TTL and an operation): by then every node writes
//! its copies, or has stopped, and operations that chose their copies before have ended. A catch-up that fails (a peer died meanwhile) is tried again. A node whose lease
//! lapsed while it ran is declared failed and joins again: its copies are caught up again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nessie_membership::{Monitor, NodeState};
use nessie_protocols::CatchUp;

use crate::node::{NodeContext, NodeError};

/// How fast a node reads from the primaries while it catches up: enough to fill a GiB of
/// copies in seconds, without taking the whole fabric from the cluster's clients.
pub const CATCH_UP_BYTES_PER_S: u64 = 512 << 20;
/// How often the rejoiner looks at the node's state.
const POLL: Duration = Duration::from_millis(100);
/// How often the balancer plans (`balance_step`).
const BALANCE_EVERY: Duration = Duration::from_secs(1);
/// Between those looks, the balancer plans on its own view (no etcd read) at every step, and
/// looks at once when that plan moves something, at most this often: a node that has just come
/// up, or more moves than one plan starts, wait a step instead of up to a second (a look reads
/// the whole configuration from etcd, half a megabyte with thousands of index chains).
const BALANCE_AGAIN: Duration = Duration::from_millis(200);
/// Pause before a failed catch-up is tried again.
const RETRY: Duration = Duration::from_secs(1);
/// How often an up node looks for pages of nodes failed for good: a read of every page table
/// (8 bytes a page), under the allocator's lock.
const ADOPT_EVERY: Duration = Duration::from_secs(2);

/// Start the rejoiner of `ctx` until `stop` is set (nothing to do without replication or
/// membership: `None`).
pub fn spawn(
    ctx: &Arc<NodeContext>,
    stop: &Arc<AtomicBool>,
) -> Result<Option<JoinHandle<()>>, NodeError> {
    if ctx.replica_set().replicas() < 2 || ctx.membership().is_none() {
        return Ok(None);
    }
    let (ctx, stop) = (ctx.clone(), stop.clone());
    std::thread::Builder::new()
        .name(format!("nessie-rejoin-{}", ctx.id))
        .spawn(move || run(&ctx, &stop))
        .map(Some)
        .map_err(|err| NodeError::Spawn {
            what: "the rejoin thread",
            err,
        })
}

/// What the rejoiner remembers between looks at the node's state.
#[derive(Default)]
struct Progress {
    /// When this process first saw itself joining in the current incarnation, and whether it
    /// said it is ready in it.
    joining_since: Option<Waiting>,
    ready: bool,
    /// The registration (`Monitor::registration`) the join above is in.
    registration: u64,
    /// The receiving copies moved here (partition, chain position), since when this process
    /// knows of them, and whether it said it filled them.
    moved: Vec<(u16, u8)>,
    moved_since: Option<Waiting>,
    /// The registration the moves above were seen under.
    moved_registration: u64,
    filled: bool,
    /// It said that its copies moved away while it was failed (once per process).
    told_moved: bool,
    /// When it last looked for pages of nodes failed for good, in which epoch, for which
    /// nodes, and whether that look finished its share (then the same epoch needs no other).
    adopt_looked: Option<Instant>,
    adopt_seen: Option<(u64, Vec<u16>)>,
    /// The endpoint adoption uses (one per process: each endpoint keeps its counters).
    adopt_ep: Option<crate::node::NodeEndpoint>,
    /// Migrating index partitions this node is to hand over, since when it knows (and in
    /// which epoch it first saw them), and those it handed over (and said so).
    migrations_seen: std::collections::HashMap<(u16, u64), Waiting>,
    handed: std::collections::HashSet<(u16, u64)>,
    /// The endpoint handing over uses.
    handover_ep: Option<crate::node::NodeEndpoint>,
    /// When the balancer last planned, and what it last said (said once, not every look).
    balanced_at: Option<Instant>,
    balance_said: String,
    /// The balancer's last plan on its own view (`work_in_view`).
    quick: Option<QuickPlan>,
}

/// A wait until every node knows of a change (that a node joins, that a copy moved, that a
/// partition migrates) before acting on it: every node learns of it within the settle time (a
/// TTL) or stops, and an operation that chose its copies before it learnt ends within one
/// more operation: the join settle time. Or sooner, once every node that may act has said
/// that its fence applied the change's epoch (`Monitor::all_learnt`; then operations begun
/// from then on know) and one operation's time has passed since this node saw that.
#[derive(Clone, Copy, Debug)]
struct Waiting {
    since: Instant,
    /// An epoch that has the change (the view's when this node first saw it).
    epoch: u64,
    /// When this node first saw every node say so.
    all_learnt: Option<Instant>,
    /// A join's wait: when the join began, by the configuration (another join, after the
    /// lease lapsed, waits anew).
    joined_ns: u64,
}

impl Waiting {
    fn new(epoch: u64) -> Self {
        Waiting {
            since: Instant::now(),
            epoch,
            all_learnt: None,
            joined_ns: 0,
        }
    }

    /// Whether the wait is over: `settle` since it began, or `op` since every node said it
    /// learnt the epoch.
    fn over(&mut self, m: &Monitor, settle: Duration, op: Duration) -> bool {
        if self.since.elapsed() >= settle {
            return true;
        }
        if self.all_learnt.is_none() && m.all_learnt(self.epoch) {
            self.all_learnt = Some(Instant::now());
        }
        self.all_learnt.is_some_and(|t| t.elapsed() >= op)
    }
}

fn run(ctx: &NodeContext, stop: &AtomicBool) {
    // Every node learns it is joining (or of a move) within the settle time (a TTL) or stops,
    // and an operation that chose its copies before it learnt ends within one more operation
    // (`Waiting`).
    let settle = Duration::from_nanos(ctx.replica_set().join_settle_ns());
    let mut p = Progress::default();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(POLL);
        let Some(m) = ctx.membership() else { return };
        match m.state(ctx.id) {
            Some(NodeState::Joining) => {
                if !p.told_moved && copies_moved_away(ctx, m) {
                    eprintln!(
                        "nessie node {}: its copies were moved to other nodes while it was failed; it rejoins without them",
                        ctx.id
                    );
                    p.told_moved = true;
                }
                rejoin_step(ctx, m, settle, &mut p)
            }
            Some(NodeState::Up) => {
                p.joining_since = None;
                p.ready = false;
                fill_step(ctx, m, settle, &mut p);
                adopt_step(ctx, m, &mut p);
                handover_step(ctx, m, settle, &mut p);
                balance_step(ctx, m, &mut p);
            }
            Some(NodeState::Failed) | None => {
                p = Progress {
                    told_moved: p.told_moved,
                    ..Progress::default()
                }
            }
        }
    }
}

/// Hand over the entries of every index partition migrating to a chain whose first node that
/// is up is this one, once every node's view names the migration: once every node that may
/// act said it applied the epoch in which this node first saw the migration
/// (`Monitor::all_learnt`), or else once this node has known of it for the settle time (a
/// node that has not learnt by then has stopped). Few operations then meet a fenced word
/// and wait, and the migration may end an operation's time after the handover
/// (`Policy::migration_end_ns`), which it could not if a node might not know of it yet.
/// Then say so: the monitor records when, and ends the migration.
fn handover_step(ctx: &NodeContext, m: &Monitor, settle: Duration, p: &mut Progress) {
    let Some(c) = m.view().config else { return };
    let epoch = c.epoch;
    // Forget migrations that ended (the map stays as long as the migrations running).
    let running: std::collections::HashSet<(u16, u64)> = c
        .index_chains
        .iter()
        .filter(|ch| ch.migrating)
        .map(|ch| (ch.partition, ch.since_ns))
        .collect();
    p.migrations_seen.retain(|id, _| running.contains(id));
    p.handed.retain(|id| running.contains(id));
    // Said in one registration write for the whole look: a write per partition, each waking
    // every monitor, made a batch of hundreds take tens of seconds.
    let mut done_now = Vec::new();
    for ch in &c.index_chains {
        let id = (ch.partition, ch.since_ns);
        if !ch.migrating || !ch.prepared || ch.handed_ns != 0 || p.handed.contains(&id) {
            continue;
        }
        let puller = ch
            .copies
            .iter()
            .map(|s| s.node)
            .find(|&n| c.state(n) == Some(NodeState::Up));
        if puller != Some(ctx.id) {
            continue;
        }
        let q = ch.partition;
        let waiting = p
            .migrations_seen
            .entry(id)
            .or_insert_with(|| Waiting::new(epoch));
        // Once every node knows (no operation's time more: one that chose the old chain
        // before its node learnt meets a fenced word and waits for a fresh view). The
        // migration's short end relies on this wait: every node that acts knew of the
        // migration before any entry was handed over (`Policy::migration_end_ns`).
        if !waiting.over(m, settle, Duration::ZERO) {
            continue;
        }
        if p.handover_ep.is_none() {
            match ctx.endpoint() {
                Ok(ep) => p.handover_ep = Some(ep),
                Err(e) => {
                    tracing::warn!(%e, "no endpoint to hand partitions over");
                    return;
                }
            }
        }
        let ep = p.handover_ep.as_mut().expect("made above");
        match ep.hand_over_partition(q, CATCH_UP_BYTES_PER_S) {
            Ok(done) => {
                ctx.moved_in_handed_entries
                    .fetch_add(done.handed, std::sync::atomic::Ordering::Relaxed);
                eprintln!(
                    "nessie node {}: handed over index partition {q} ({} entries, {} installed here, in {:.2} s)",
                    ctx.id,
                    done.entries,
                    done.handed,
                    done.ns as f64 / 1e9
                );
                done_now.push(id);
            }
            Err(e) => tracing::warn!(%e, partition = q, "handing over failed; trying again"),
        }
    }
    if done_now.is_empty() {
        return;
    }
    match m.set_handed(ctx.id, &done_now) {
        Ok(()) => p.handed.extend(done_now),
        Err(e) => tracing::warn!(%e, "could not say {} partitions are handed over", done_now.len()),
    }
}

/// The balancer, on the lowest-numbered node that is up: every [`BALANCE_EVERY`], migrate the
/// index partitions the configuration's plan moves (`nessie_membership::balance`): the copies
/// of nodes failed for good re-created on the survivors, then every up node within its share.
/// The plan is made on the configuration in force when the reservation is written (not on
/// this node's view), by the node that is the lowest up there: two nodes whose views differ
/// cannot both plan from stale maps.
fn balance_step(ctx: &NodeContext, m: &Monitor, p: &mut Progress) {
    let Some(section) = &ctx.cfg.membership else {
        return;
    };
    // Gone for good: failed for replace_after, and a settle time more (the copies of its
    // tables have moved to spare slots by then, where there are spare slots).
    let after = (section.replace_after_s * 1_000_000_000)
        .saturating_add(ctx.replica_set().join_settle_ns());
    let since = p.balanced_at.map(|t| t.elapsed());
    if since.is_some_and(|e| e < BALANCE_EVERY) {
        // Not after a look that failed: its reservations and their cancels are epochs too,
        // and each retries no sooner than the next full look.
        let soon = since.is_some_and(|e| e < BALANCE_AGAIN);
        let failed = p.balance_said.starts_with("could not");
        if soon || failed || !section.rebalance || !work_in_view(ctx, m, after, &mut p.quick) {
            return;
        }
    }
    p.balanced_at = Some(Instant::now());
    // Every node gives up its own leaked reservations (a `nessie migrate` through it may
    // have left one), balancer or not.
    ctx.cancel_stale_reservations();
    if !section.rebalance {
        return;
    }
    let Some(c) = m.view().config else { return };
    if c.balancer() != Some(ctx.id) {
        return;
    }
    let said = match ctx.balance_once(after) {
        Ok(Ok((epoch, started))) => {
            eprintln!(
                "nessie node {}: balancer: {} partitions migrating (epoch {epoch})",
                ctx.id,
                started.len(),
            );
            "migrating".to_string()
        }
        Ok(Err(why)) => why,
        Err(e) => format!("could not start migrations: {e}"),
    };
    // A look that started nothing answers for the view it was made on: no quick look again
    // until the view changes (a stale view that shows work would otherwise look every step).
    if said != "migrating" {
        if let Some(q) = &mut p.quick {
            q.work = false;
        }
    }
    if said != p.balance_said {
        if said.starts_with("could not") || said.starts_with("no plan") {
            eprintln!("nessie node {}: balancer: {said}", ctx.id);
        } else {
            tracing::info!(node = ctx.id, "balancer: {said}");
        }
        p.balance_said = said;
    }
}

/// The balancer's last plan on its own view (`work_in_view`): what it was made on, and whether
/// it moved something.
#[derive(Clone, Debug, Default)]
struct QuickPlan {
    epoch: u64,
    settled: Vec<(u16, u64)>,
    work: bool,
}

/// Whether this node is the balancer in its own view and a plan on that view moves partitions
/// (what a look, on the configuration read from etcd, would then most likely start). Planned
/// once per view (epoch, and the comebacks settled): `last` keeps the answer.
fn work_in_view(
    ctx: &NodeContext,
    m: &Monitor,
    replace_after_ns: u64,
    last: &mut Option<QuickPlan>,
) -> bool {
    let Some(c) = m.view().config else {
        return false;
    };
    if c.balancer() != Some(ctx.id) {
        return false;
    }
    let settled = m.settled_comebacks();
    if let Some(q) = last
        .as_ref()
        .filter(|q| q.epoch == c.epoch && q.settled == settled)
    {
        return q.work;
    }
    let now = nessie_fabric::wall_clock_ns();
    let plan = c.plan_balance_settled(ctx.replica_set(), now, replace_after_ns, &settled);
    let work = matches!(plan, Ok(nessie_membership::balance::Balance::Migrate(_)));
    *last = Some(QuickPlan {
        epoch: c.epoch,
        settled,
        work,
    });
    work
}

/// Whether a copy this node held at home moved to another node (re-replication).
fn copies_moved_away(ctx: &NodeContext, m: &Monitor) -> bool {
    let Some(c) = m.view().config else {
        return false;
    };
    let set = ctx.replica_set();
    let home = nessie_protocols::replica::CopyMap::home(set).held_by(ctx.id);
    let now = c.copy_map(set).held_by(ctx.id);
    // Copies moved *to* it (spare slots) are no reason to say so.
    home.iter().any(|h| !now.contains(h))
}

/// While joining: catch up once the join settle time is over, then say the node is ready.
fn rejoin_step(ctx: &NodeContext, m: &Monitor, settle: Duration, p: &mut Progress) {
    // A registration made since (the lease lapsed: the node was failed and joins again) starts
    // the join over: the settle wait and the catch-up.
    let registration = m.registration();
    if p.registration != registration {
        p.registration = registration;
        p.joining_since = None;
        p.ready = false;
    }
    // The wait is for this join: a view read under this registration that shows this node
    // joining, whose epoch every node must then know. A view read before the registration
    // may show the join before the lease lapsed, an epoch others have passed (they took the
    // node for failed since, and write nothing to its copies).
    let Some((epoch, me, read_under)) = m.member_in_view(ctx.id) else {
        return;
    };
    if read_under != registration || me.state != NodeState::Joining {
        return;
    }
    // Another join (failed and joining again, unseen in between) starts over.
    if p.joining_since.is_some_and(|w| w.joined_ns != me.joined_ns) {
        p.joining_since = None;
        p.ready = false;
    }
    if p.ready {
        return;
    }
    let op = Duration::from_nanos(ctx.replica_set().op_ns());
    let waiting = p.joining_since.get_or_insert_with(|| Waiting {
        joined_ns: me.joined_ns,
        ..Waiting::new(epoch)
    });
    if !waiting.over(m, settle, op) {
        return;
    }
    let waited = waiting.since.elapsed().as_secs_f64();
    match waiting.all_learnt {
        Some(t) => eprintln!(
            "nessie node {}: every node knew it joins {:.2} s after it saw so; catching up",
            ctx.id,
            waited - t.elapsed().as_secs_f64()
        ),
        None => eprintln!(
            "nessie node {}: catching up after the join settle time ({waited:.2} s): not every node said it knew it joins",
            ctx.id
        ),
    }
    match catch_up(ctx) {
        Ok(c) => match m.set_ready(ctx.id, registration, me.joined_ns) {
            Ok(true) => {
                tracing::info!(node = ctx.id, ?c, "caught up; ready to be up again");
                eprintln!("nessie node {}: caught up ({c}); ready", ctx.id);
                p.ready = true;
            }
            Ok(false) => tracing::warn!(
                node = ctx.id,
                "caught up, but the lease lapsed meanwhile: joining again"
            ),
            Err(e) => tracing::warn!(%e, "could not say the node is ready"),
        },
        Err(e) => {
            tracing::warn!(node = ctx.id, %e, "catching up failed; trying again");
            std::thread::sleep(RETRY);
        }
    }
}

/// While up: fill the copies moved here (re-replication) once every node writes them, then
/// say so, so that membership makes them full.
fn fill_step(ctx: &NodeContext, m: &Monitor, settle: Duration, p: &mut Progress) {
    // As for a join: a wait begun under an earlier registration (the lease lapsed since) is
    // over, and only a view read under this one counts.
    let registration = m.registration();
    if p.moved_registration != registration {
        p.moved_registration = registration;
        p.moved = Vec::new();
        p.moved_since = None;
        p.filled = false;
    }
    if m.member_in_view(ctx.id).map(|(.., r)| r) != Some(registration) {
        return;
    }
    let (moved, epoch) = moved_here(m, ctx.id);
    if moved != p.moved {
        // New moves: every node must learn of them before the copier passes their words.
        p.moved_since = (!moved.is_empty()).then(|| Waiting::new(epoch));
        p.moved = moved;
        p.filled = false;
    }
    let op = Duration::from_nanos(ctx.replica_set().op_ns());
    let Some(waiting) = p.moved_since.as_mut() else {
        return;
    };
    if p.filled || !waiting.over(m, settle, op) {
        return;
    }
    let filled = ctx
        .endpoint()
        .map_err(|e| e.to_string())
        .and_then(|mut ep| {
            ep.catch_up(&ctx.cfg.geometry.table_regions(), CATCH_UP_BYTES_PER_S)
                .map_err(|e| e.to_string())
        });
    match filled {
        Ok(c) => {
            ctx.moved_in_fill_bytes
                .fetch_add(c.bytes_read, std::sync::atomic::Ordering::Relaxed);
            eprintln!("nessie node {}: filled the copies moved here ({c})", ctx.id);
            match m.set_filled(ctx.id, &p.moved) {
                Ok(()) => p.filled = true,
                Err(e) => tracing::warn!(%e, "could not say the moved copies are filled"),
            }
        }
        Err(e) => {
            tracing::warn!(node = ctx.id, %e, "filling moved copies failed; trying again");
            std::thread::sleep(RETRY);
        }
    }
}

/// While up, every [`ADOPT_EVERY`]: take this node's share of the pages claimed by nodes
/// gone for good: failed for at least `replace_after_s` (clock margin included: the time is
/// another monitor's), or for a join settle time and the margin once seen to exit after
/// leaving (`Member::stopped_ns`). The up nodes share the pages by rank; a page left over
/// when ranks change, or one whose host's tables settle (`Adopted::deferred`), is taken at a
/// later look. Each CAS is made only while the current view,
/// fresh, still says its claimer is gone for good, and within a quarter of a lease TTL of the
/// look's start
/// (`ClassTable::adopt_gone`, `docs/protocol.md` rule 17).
fn adopt_step(ctx: &NodeContext, m: &Monitor, p: &mut Progress) {
    if p.adopt_looked.is_some_and(|t| t.elapsed() < ADOPT_EVERY) {
        return;
    }
    p.adopt_looked = Some(Instant::now());
    let (Some(c), Some(mc)) = (m.view().config, ctx.cfg.membership.as_ref()) else {
        return;
    };
    let after_ns = mc
        .replace_after_s
        .saturating_mul(1_000_000_000)
        .saturating_add(ctx.cfg.protocol_config().clock_margin_ns);
    // Failed that long, or a join settle time once seen to exit after it left (its process
    // claims nothing more).
    let left_after_ns = ctx
        .replica_set()
        .join_settle_ns()
        .saturating_add(ctx.cfg.protocol_config().clock_margin_ns);
    let gone_long = |c: &nessie_membership::Configuration, n: u16| {
        c.nodes.iter().any(|m| {
            m.id == n && m.gone_for_good(nessie_fabric::wall_clock_ns(), after_ns, left_after_ns)
        })
    };
    let gone: Vec<u16> = c
        .nodes
        .iter()
        .map(|n| n.id)
        .filter(|&n| gone_long(&c, n))
        .collect();
    let mut up: Vec<u16> = c
        .nodes
        .iter()
        .filter(|n| n.state == NodeState::Up)
        .map(|n| n.id)
        .collect();
    up.sort_unstable();
    let Some(rank) = up.iter().position(|&n| n == ctx.id) else {
        return;
    };
    let seen = (c.epoch, gone.clone());
    if gone.is_empty() || p.adopt_seen.as_ref() == Some(&seen) {
        return;
    }
    if p.adopt_ep.is_none() {
        match ctx.endpoint() {
            Ok(ep) => p.adopt_ep = Some(ep),
            Err(e) => {
                tracing::warn!(node = ctx.id, %e, "no endpoint to adopt pages with");
                return;
            }
        }
    }
    let ep = p.adopt_ep.as_mut().expect("made above");
    let deadline = Instant::now() + Duration::from_secs(mc.lease_ttl_s.max(1)) / 4;
    let cut = std::cell::Cell::new(false);
    let still = |n: u16| {
        let ok = Instant::now() < deadline
            && ctx.fence().may_read(nessie_fabric::monotonic_ns())
            && m.view().config.is_some_and(|c| gone_long(&c, n));
        cut.set(cut.get() || !ok);
        ok
    };
    match ctx
        .table()
        .adopt_gone(ep, &gone, rank as u64, up.len() as u64, still)
    {
        Ok(a) => {
            if a.pages > 0 {
                ctx.adopted_pages.fetch_add(a.pages, Ordering::Relaxed);
                eprintln!(
                    "nessie node {}: adopted {} pages claimed by node(s) {gone:?}, failed for good ({} entries in use, {} free)",
                    ctx.id, a.pages, a.in_use, a.free
                );
            }
            // A look cut short, or one that left pages of a host whose tables settle, looks
            // again; a whole one is enough for this epoch.
            p.adopt_seen = (!cut.get() && a.deferred == 0).then_some(seen);
        }
        Err(e) => {
            tracing::warn!(node = ctx.id, %e, "adopting the pages of nodes failed for good failed; trying again")
        }
    }
}

/// The copies the configuration moved to node `id` and still has receiving.
/// The receiving copies moved to node `id` (partition, chain position), and the epoch of the
/// view that says so.
fn moved_here(m: &Monitor, id: u16) -> (Vec<(u16, u8)>, u64) {
    let Some(c) = m.view().config else {
        return (Vec::new(), 0);
    };
    let moved = c
        .moves
        .iter()
        .filter(|c| c.node == id && c.receiving)
        .map(|c| (c.partition, c.copy))
        .collect();
    (moved, c.epoch)
}

/// Fill the copies, then adopt the pages the node's earlier incarnation claimed (its allocator
/// started empty).
fn catch_up(ctx: &NodeContext) -> Result<CatchUp, String> {
    let mut ep = ctx.endpoint().map_err(|e| e.to_string())?;
    let caught = ep
        .catch_up(&ctx.cfg.geometry.table_regions(), CATCH_UP_BYTES_PER_S)
        .map_err(|e| e.to_string())?;
    let adopted = ctx.table().adopt(&mut ep).map_err(|e| e.to_string())?;
    tracing::info!(
        node = ctx.id,
        ?adopted,
        "adopted the pages of the earlier incarnation"
    );
    Ok(caught)
}
