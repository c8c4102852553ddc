//! Protocol parameters. Cluster-wide ones (expiry, clock margin) must match on every node; the
//! rest are per client.

/// Switches for the paper's optimisations (for the optimisation-stack experiment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Optimizations {
    /// Compare ITE filter bits before reading a DTE.
    pub filter_bits: bool,
    /// Cache remote DTEs (per client worker) keyed by ITE.
    pub cache: bool,
    /// Let GETs return the previous version when they meet an in-progress write.
    pub previous_versions: bool,
    /// Read a remote DTE's header and key first, and its value only if it matches (entries of
    /// at most `ProtocolConfig::whole_read_max` bytes are read whole all the same).
    pub multi_read: bool,
}

impl Default for Optimizations {
    fn default() -> Self {
        Self {
            filter_bits: true,
            cache: true,
            previous_versions: true,
            multi_read: true,
        }
    }
}

impl Optimizations {
    pub const NONE: Optimizations = Optimizations {
        filter_bits: false,
        cache: false,
        previous_versions: false,
        multi_read: false,
    };
}

/// Retry of operations that aborted because of a concurrent operation (or timed out).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Attempts before giving up with `Error::Contended` (or `Error::Timeout`).
    pub max_attempts: u32,
    /// First back-off, in nanoseconds; doubles per retry.
    pub initial_backoff_ns: u64,
    /// Back-off cap, in nanoseconds.
    pub max_backoff_ns: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 2_000,
            initial_backoff_ns: 1_000,
            max_backoff_ns: 1_000_000,
        }
    }
}

impl RetryPolicy {
    /// The retries of SD/HY server threads, whatever the clients' policy. A server thread
    /// serves every request slot assigned to it, so a back-off stalls them all: its waits stay
    /// below 10 µs, which `precise_sleep_ns` spends yielding rather than asleep, as a HERD
    /// server retries at once. The writers it races with are the node's other server threads,
    /// all of them running, so a conflict clears within an operation or two. More attempts keep
    /// its patience near the clients' (about 0.2 s of back-off in all).
    pub const SERVER: RetryPolicy = RetryPolicy {
        max_attempts: 20_000,
        initial_backoff_ns: 100,
        max_backoff_ns: 10_000,
    };
}

/// Deliberate protocol breakages, for mutation tests only: each must make the concurrency
/// checker report a violation. Only with the `testing` feature (the config file cannot set them).
#[cfg(any(test, feature = "testing"))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mutations {
    /// GET skips its reverse pass (Appendix A.1.2 Step 3).
    pub skip_get_reverse_pass: bool,
    /// PUT/DELETE skip their reverse pass (Appendix A.1.3 Step 5).
    pub skip_put_reverse_pass: bool,
    /// Released DTEs are reusable at once instead of after an expiry period.
    pub recycle_without_expiry: bool,
    /// Operations ignore their timer (never abort with a timeout).
    pub ignore_op_timer: bool,
    /// GET returns a DTE without checking its valid flag.
    pub skip_valid_check: bool,
    /// An abandoned PUT is "completed" by emptying its candidate instead of installing a valid
    /// copy of its value or setting it valid (loses both the new and the old value).
    pub complete_to_empty: bool,
    /// Replication: a writer that loses at the decider does not carry the decider's word to
    /// the other copies (a writer that died after deciding leaves its key wedged).
    pub replica_no_helping: bool,
    /// Replication: plain writes (DTEs, valid flags) go to the primary copy only, so only the
    /// index is replicated.
    pub replicate_index_only: bool,
    /// A MIGRATE's copy names the source as its previous version (as before this was found
    /// unsafe): a GET meeting a copy that lost its source returns the value it moved, even
    /// after a DELETE of the key committed.
    pub migrate_copy_keeps_source: bool,
    /// Replication: writes skip the copies of a node that is receiving them (rejoining), so
    /// its catch-up misses what is written after it passed.
    pub rejoin_skips_receiving: bool,
    /// Replication: a reader that knows the primary's node failed reads the next copy at once,
    /// while nodes that have not heard of the failure may still read the old primary.
    pub read_next_copy_at_once: bool,
    /// Replication: a write that cannot reach a copy whose node just failed goes on at once,
    /// while nodes that have not heard of the failure may still read that copy.
    pub skip_unreached_copy_at_once: bool,
    /// Replication: a leaving node's copies stop being read at the cut-over the configuration
    /// names, however late this node learnt of it, while nodes that read their configuration
    /// before it was written may still read them (rule 7a).
    pub cut_over_when_named: bool,
    /// Replication: a leaving node's copy past its read cut-over is read again as soon as no
    /// copy after it may be read, not only once that copy has failed for the settle time.
    pub read_past_cut_over_at_once: bool,
    /// An eviction deletes its victim whatever the victim's version now, not only the version
    /// it sampled: a key rewritten in between loses its new value.
    pub evict_unconditionally: bool,
    /// A write whose commit (Step 6) was issued and failed unable to tell whether it landed
    /// forgets so: giving up, it finds its entry gone from the index (or valid there) and
    /// reports that it took no effect (as before this was found). A conditional DELETE so
    /// reports a failure though the key is gone: an eviction's went unrecorded.
    pub forget_unsure_commit: bool,
    /// Eviction ranks every sampled item alike: an LRU, LFU or TTL policy evicts at random.
    pub evict_ignoring_rank: bool,
    /// Eviction never moves a page between size classes (`cd/evict.rs`, the page mover): once
    /// one value size has filled the store, another gets room only as whole pages happen to
    /// empty.
    pub no_page_mover: bool,
    /// A prefetch keeps the entries it read however long after their ITEs it read them
    /// (`prefetch.rs`, PF1): a copy may be of an entry reused meanwhile.
    pub prefetch_past_deadline: bool,
    /// Reads find expired items present: the store's expiry is ignored by GETs.
    pub ignore_expiry: bool,
    /// The expiry reclaimer deletes a key it read expired whatever its version now
    /// (`Cond::Present`, not the version read): a key rewritten since loses its new value.
    pub reclaim_unconditionally: bool,
    /// Expiry is judged by the clock when the entry has been read, not at the attempt's
    /// start: a value replaced meanwhile can be found expired, and the key absent, while it
    /// holds the new value.
    pub expiry_judged_late: bool,
    /// A MIGRATE whose source CAS (Step 7) fails with an error returns at once, leaving its
    /// invalid copy in the index while its writer lives (as before this was found).
    pub migrate_walks_away: bool,
    /// A MIGRATE's Step 7 leaves a plain empty word in its source, not a moved word naming
    /// its copy: whoever completes a copy its migrator abandoned cannot tell that the source
    /// was emptied, and takes the key's only entry out.
    pub migrate_empties_plainly: bool,
    /// Whoever completes an abandoned MIGRATE copy rolls it forward without reading its
    /// source (as before this was found): a write of the key that replaced the source while
    /// the migrator was dying is cleared as a duplicate, or a DELETE undone.
    pub complete_ignores_source: bool,
    /// A moved word is filled without settling the copy it names first: a completer of that
    /// copy, finding the word gone, takes the key's only entry out.
    pub fill_over_unsettled_copy: bool,
    /// Replication: a plain write goes only to the copies it chose at its start, even if a
    /// copy was placed (moved, or rejoining) while it wrote.
    pub no_late_copy_writes: bool,
    /// Replication: a plain write goes to the copies in chain order from the last, receiving
    /// ones included, instead of to the receiving ones after the others.
    pub receiving_written_first: bool,
    /// Replication: advance decides whether a copy is behind the word it carries by comparing
    /// sequence numbers modulo their width (as before this was found), with no fresh read of
    /// the decider: a carrier descheduled across half a sequence's worth of changes moves the
    /// copy back.
    pub advance_by_sequence: bool,
    /// Replication: a CAS is carried only to the copies it chose before deciding, even if a
    /// copy was placed (moved, or rejoining) meanwhile.
    pub no_late_copy_cas: bool,
    /// Replication: index entries are always sent to their home node's tables' copies, as if
    /// no index partition had moved on its own.
    pub index_moves_ignored: bool,
    /// The per-ITE handover copies an entry's word to the new chain without fencing it in the
    /// old one first: a node that has not heard of the move commits there, and is lost.
    pub handover_without_fence: bool,
    /// Replication: carrying a CAS to a receiving copy ignores what it finds (errors, a copy
    /// it could not reach), as before this was found.
    pub receiving_cas_best_effort: bool,
    /// Replication: receiving copies are carried to in chain order with the full ones, and
    /// catching up fills them from the decider (as before this was found): a receiving copy
    /// may get a word that dies with its decider.
    pub catch_up_from_decider: bool,
    /// Catching up skips every copy of a never-up node's tables, not only the node's own
    /// (known zeros): a copy in a reused spare slot keeps another partition's stale words.
    pub skip_every_never_up_copy: bool,
    /// Replication: a copy counts as already written by a write or CAS that looked at its
    /// node and slot before, even if the node restarted in between (as before this was found).
    pub late_copy_by_place: bool,
    /// Replication: a data read takes a moved copy that just became full in its new role at
    /// once, rather than keeping the old roles for the join settle time (rule 10a): a reader
    /// can then miss a write another reader, in the old roles, already returned.
    pub read_settling_moved_copy: bool,
    /// Replication: a plain data write never waits for a moved copy to settle, even when
    /// that copy is its partition's new primary (rule 10a): a reader in the new roles can
    /// then miss a write a reader in the old roles already returned.
    pub moved_writes_never_wait: bool,
    /// Replication: a change waits one join settle time after a moved copy became full, not
    /// two (rule 10a): a node that learnt of it later still reads in the old roles meanwhile.
    pub moved_change_waits_once: bool,
    /// Replication: changes stop waiting for a moved copy as soon as this node's data reads
    /// take the new roles early (rule 10c: when every node said it applied the epoch), not
    /// once every node said it reads in the new roles: a node that still reads in the old
    /// roles then returns a word older than one a new-role reader returned.
    pub moved_writes_end_with_reads: bool,
    /// Replication: a fence that learns of a moved copy already full (a process started since)
    /// reads it in the old roles like one that saw it receiving (rule 10c): nobody waited for
    /// its word, so it reads an old word after another reader returned a newer one.
    pub fresh_fence_reads_old: bool,
    /// Replication: a plain data write behind the primary never waits for a moved copy to
    /// settle, even with a full copy after the moved one (R = 3, rule 10a): should the primary
    /// fail, an old-role reader reads that copy, which the write reached first, while a
    /// new-role reader reads the moved copy, which it has not reached yet (new, then old).
    pub moved_write_ignores_copy_after: bool,
    /// Replication: a plain write to another node's memory (and a migration's pending
    /// words) is issued without checking this node's lease (rule 6), as before the review of
    /// f82f64e: a node resumed after it was declared failed writes into entries the others
    /// have reused.
    pub writer_ignores_lease: bool,
    /// Replication: a node that learnt late of a moved copy becoming full reads it in the new
    /// roles once the configuration's time for it is a join settle time ago, rather than wait
    /// until it has known that long (rule 10a): the configuration's time comes before the
    /// epoch is published, and a writer that had not heard yet may still be writing the copy
    /// last.
    pub new_roles_from_configuration_time: bool,
    /// Replication: a carrier moves a copy to the anchor's word without checking this node's
    /// lease first (as before this was found): a node paused past its lease (SIGSTOP, a VM
    /// stall) resumes carrying, reads its own stale copy as the anchor, and moves the copy
    /// its successor has decided at since back to that word.
    pub carrier_ignores_lease: bool,
    /// Replication: the fence's deadlines (lease, view freshness) are checked against the wall
    /// clock (as before this was found), so a backward step makes a stale view fresh again.
    pub fence_on_wall_clock: bool,
    /// A conditional write judges the key's state from PUT Step 2's view (up to the first
    /// empty candidate), missing a valid entry of the key in a later one.
    pub guard_looks_to_candidate: bool,
    /// A conditional write passes over another writer's entry in progress and clears it, as
    /// a plain PUT's Step 4 does: that write may still take effect, unseen by the condition.
    pub guard_passes_writes: bool,
    /// A GET whose candidate ITEs were read in one batch takes a candidate whose READ failed
    /// for an empty one (as a pass that only looked at the words the batch returned would):
    /// a key on a node that cannot be reached is reported absent instead of the GET failing.
    pub batched_get_error_as_empty: bool,
    /// Pilaf GETs accept entries and extents without checking their CRC64.
    pub skip_pilaf_checksums: bool,
    /// A Pilaf GET reports a key absent after one pass that did not find it, without the
    /// confirming pass bracketed by the move sequence.
    pub pilaf_trust_first_miss: bool,
}

#[cfg(any(test, feature = "testing"))]
impl Mutations {
    pub fn any(&self) -> bool {
        *self != Mutations::default()
    }
}

/// Entries an eviction samples per victim by default (Redis's `maxmemory-samples` default).
pub const DEFAULT_EVICTION_SAMPLES: u8 = 5;
/// Least time between two page-mover checks of a node's writers by default: each READs 16
/// entries of up to four classes.
pub const DEFAULT_MOVE_CHECK_NS: u64 = 50_000_000;
/// Most entries anybody may have an eviction sample per victim.
pub const MAX_EVICTION_SAMPLES: u8 = 64;

/// Shortest expiry period anybody may configure (1 ms).
pub const MIN_EXPIRY_NS: u64 = 1_000_000;
/// Default `ProtocolConfig::whole_read_max`.
pub const WHOLE_READ_MAX: u64 = 4096;
/// Longest expiry period anybody may configure (1 h).
pub const MAX_EXPIRY_NS: u64 = 3_600_000_000_000;
/// Longest retry back-off anybody may configure (10 s).
pub const MAX_BACKOFF_NS: u64 = 10_000_000_000;
/// Most levels of recursive migration anybody may configure.
pub const MAX_MIGRATE_DEPTH: u8 = 32;
/// How long, in expiry periods, a writer that finds no room and has no released entry of its
/// own to wait for backs off before it fails with `Error::DataTableFull`. Other nodes' pages
/// come back as their entries expire, and a node that is paused (a stalled process) holds its
/// pages until it runs again: one period was too short for a stall of two (one refusal in
/// 40,000 operations of the multi-process stall test, 12 ms stalls against a 5 ms expiry).
pub const TABLE_FULL_WAIT_PERIODS: u64 = 4;
/// And at least this long (100 ms): with a short expiry period, scheduling delays on a busy
/// host outlast four periods (the same test failed again, once, with 2-core machines running
/// twelve clusters at once).
pub const TABLE_FULL_MIN_WAIT_NS: u64 = 100_000_000;
/// Most migrations one PUT attempt may trigger before it gives up with `Error::IndexFull`.
pub const MAX_MIGRATIONS_PER_ATTEMPT: u32 = 8;

/// What a writer that finds no room does (`nessie up --eviction`, `[cache] eviction`), with
/// Redis's `maxmemory-policy` names (`cd/evict.rs`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Eviction {
    /// Refuse the write (`Error::DataTableFull`, `Error::IndexFull`): Redis's default.
    #[default]
    NoEviction,
    /// The least recently read of a sample of items in the writer's way (by the access clock
    /// GETs keep in each entry, `nessie_store::access`).
    AllkeysLru,
    /// The least frequently read of a sample (by the entries' LFU counters, Redis's).
    AllkeysLfu,
    /// Items picked at random among those in the writer's way: entries of the size class it
    /// needs that its own node allocated, or the key's candidate index entries.
    AllkeysRandom,
    /// As `AllkeysLru`, among items with an expiry only.
    VolatileLru,
    /// As `AllkeysLfu`, among items with an expiry only.
    VolatileLfu,
    /// As `AllkeysRandom`, among items with an expiry only.
    VolatileRandom,
    /// The item that expires soonest, among a sample of items with an expiry.
    VolatileTtl,
}

impl Eviction {
    /// Every policy, by Redis's name.
    pub const ALL: [Eviction; 8] = [
        Eviction::NoEviction,
        Eviction::AllkeysLru,
        Eviction::AllkeysLfu,
        Eviction::AllkeysRandom,
        Eviction::VolatileLru,
        Eviction::VolatileLfu,
        Eviction::VolatileRandom,
        Eviction::VolatileTtl,
    ];

    /// Redis's name.
    pub fn name(self) -> &'static str {
        match self {
            Eviction::NoEviction => "noeviction",
            Eviction::AllkeysLru => "allkeys-lru",
            Eviction::AllkeysLfu => "allkeys-lfu",
            Eviction::AllkeysRandom => "allkeys-random",
            Eviction::VolatileLru => "volatile-lru",
            Eviction::VolatileLfu => "volatile-lfu",
            Eviction::VolatileRandom => "volatile-random",
            Eviction::VolatileTtl => "volatile-ttl",
        }
    }

    /// Whether GETs keep entries' access words for this policy (the LRU and LFU ones).
    pub fn tracks_access(self) -> bool {
        self.lru() || self.lfu()
    }

    /// Victims chosen by least recent access.
    pub fn lru(self) -> bool {
        matches!(self, Eviction::AllkeysLru | Eviction::VolatileLru)
    }

    /// Victims chosen by least frequent access (GETs keep the LFU counter).
    pub fn lfu(self) -> bool {
        matches!(self, Eviction::AllkeysLfu | Eviction::VolatileLfu)
    }

    /// Only items with an expiry are evicted (Redis's `volatile-*`: with none, a write that
    /// finds no room is refused as under `noeviction`).
    pub fn volatile(self) -> bool {
        matches!(
            self,
            Eviction::VolatileLru
                | Eviction::VolatileLfu
                | Eviction::VolatileRandom
                | Eviction::VolatileTtl
        )
    }
}

impl std::fmt::Display for Eviction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Eviction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Eviction::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Eviction::ALL.iter().map(|e| e.name()).collect();
                format!(
                    "unknown eviction policy {s:?}: one of {} (Redis's names)",
                    names.join(", ")
                )
            })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ProtocolConfig {
    /// Expiry period: how long a released DTE stays untouched, and the limit on any operation.
    pub expiry_ns: u64,
    /// Allowance for clock skew between nodes when deciding a DTE has expired.
    pub clock_margin_ns: u64,
    /// Deepest recursive migration (0 = only direct moves).
    pub max_migrate_depth: u8,
    /// DTEs in each client worker's cache (0 = none).
    pub cache_entries: usize,
    pub optimizations: Optimizations,
    /// Largest DTE a GET reads whole with one READ even with the multi-read optimisation on:
    /// for entries this small a second round trip costs more than the bytes a mismatch wastes
    /// (filter bits make mismatches rare). The ITE names the entry's size class, so the READ
    /// is exact. 0 splits every read, as the paper's multi-read does.
    pub whole_read_max: u64,
    pub retry: RetryPolicy,
    /// What a writer that finds no room does.
    pub eviction: Eviction,
    /// Entries an eviction samples per victim (Redis's `maxmemory-samples`): more choose
    /// better victims (closer to true LRU or LFU) for more READs.
    pub eviction_samples: u8,
    /// Least time between two page-mover checks of one node's writers (`cd/evict.rs`,
    /// `consider_move`): a page moves at most once per `MOVE_VOTES` of them. Tests with
    /// expiry periods of a few ms shorten it.
    pub move_check_ns: u64,
    /// Test-only breakages (read through `mutated!`).
    #[cfg(any(test, feature = "testing"))]
    pub mutations: Mutations,
}

impl Default for ProtocolConfig {
    fn default() -> Self {
        Self {
            expiry_ns: 1_000_000_000,
            clock_margin_ns: 10_000_000,
            max_migrate_depth: 8,
            cache_entries: 1024,
            optimizations: Optimizations::default(),
            whole_read_max: WHOLE_READ_MAX,
            retry: RetryPolicy::default(),
            eviction: Eviction::NoEviction,
            eviction_samples: DEFAULT_EVICTION_SAMPLES,
            move_check_ns: DEFAULT_MOVE_CHECK_NS,
            #[cfg(any(test, feature = "testing"))]
            mutations: Mutations::default(),
        }
    }
}

impl ProtocolConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(MIN_EXPIRY_NS..=MAX_EXPIRY_NS).contains(&self.expiry_ns) {
            return Err(ConfigError::Expiry(self.expiry_ns));
        }
        // A DTE is reused after expiry + margin; a margin over half the expiry means the
        // nodes' clocks may disagree by more than the protocol's own safety window.
        if self.clock_margin_ns.saturating_mul(2) > self.expiry_ns {
            return Err(ConfigError::ClockMargin {
                margin_ms: self.clock_margin_ns as f64 / 1e6,
                expiry_ms: self.expiry_ns as f64 / 1e6,
            });
        }
        if self.max_migrate_depth > MAX_MIGRATE_DEPTH {
            return Err(ConfigError::MigrateDepth(self.max_migrate_depth));
        }
        if self.retry.max_attempts == 0 {
            return Err(ConfigError::NoAttempts);
        }
        if self.retry.initial_backoff_ns > self.retry.max_backoff_ns {
            return Err(ConfigError::BackoffOrder);
        }
        if self.retry.max_backoff_ns > MAX_BACKOFF_NS {
            return Err(ConfigError::BackoffTooLong);
        }
        if !(1..=MAX_EVICTION_SAMPLES).contains(&self.eviction_samples) {
            return Err(ConfigError::EvictionSamples(self.eviction_samples));
        }
        Ok(())
    }
}

/// Why a protocol, mode or server-driven (RPC) configuration is rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("expiry {0} ns is not between 1 ms and 1 h")]
    Expiry(u64),
    #[error("clock margin {margin_ms} ms exceeds half the expiry period ({expiry_ms} ms)")]
    ClockMargin { margin_ms: f64, expiry_ms: f64 },
    #[error("migrate depth {0} exceeds {MAX_MIGRATE_DEPTH}")]
    MigrateDepth(u8),
    #[error("retry.max_attempts must be at least 1")]
    NoAttempts,
    #[error("retry.initial_backoff_ns exceeds retry.max_backoff_ns")]
    BackoffOrder,
    #[error("retry.max_backoff_ns exceeds 10 s")]
    BackoffTooLong,
    #[error("eviction samples {0} is not in 1..={MAX_EVICTION_SAMPLES}")]
    EvictionSamples(u8),
    #[error("server_threads = {got} is not in 1..={max}")]
    ServerThreads { got: u16, max: u16 },
    #[error("max_clients_per_node = {got} is not in 1..={max}")]
    ClientsPerNode { got: u16, max: u16 },
    #[error("idle_backoff_ns exceeds 1 s")]
    IdleBackoff,
    #[error("response timeout {0} ns is below 1 ms")]
    ResponseTimeout(u64),
    #[error("pilaf extent reuse delay {0} ns exceeds 1 h")]
    ReuseDelay(u64),
}

/// The client API reports every configuration problem as [`Error::Config`] with its message:
/// that variant's text is what crosses the wire (admin replies, SD response slots).
impl From<ConfigError> for crate::Error {
    fn from(e: ConfigError) -> Self {
        crate::Error::Config(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every policy parses from its Redis name and prints it back; anything else is refused
    /// with the list of names.
    #[test]
    fn eviction_policies_by_redis_names() {
        for e in Eviction::ALL {
            assert_eq!(e.name().parse::<Eviction>(), Ok(e));
            assert_eq!(e.to_string(), e.name());
            assert_eq!(e.tracks_access(), e.lru() || e.lfu());
            assert!(!(e.lru() && e.lfu()));
        }
        assert!(Eviction::VolatileTtl.volatile() && !Eviction::AllkeysLru.volatile());
        assert!(!Eviction::NoEviction.tracks_access() && !Eviction::VolatileTtl.tracks_access());
        for bad in ["", "lru", "allkeys_lru", "ALLKEYS-LRU", "volatile-lru "] {
            let e = bad.parse::<Eviction>().unwrap_err();
            assert!(
                e.contains("unknown eviction policy") && e.contains("volatile-ttl"),
                "{e}"
            );
        }
    }

    #[test]
    fn clock_margin_is_at_most_half_the_expiry() {
        let ok = ProtocolConfig {
            expiry_ns: 1_000_000_000,
            clock_margin_ns: 500_000_000,
            ..ProtocolConfig::default()
        };
        ok.validate().unwrap();
        let bad = ProtocolConfig {
            clock_margin_ns: 500_000_001,
            ..ok
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(
            e.contains("exceeds half the expiry period (1000 ms)"),
            "{e}"
        );
    }
}
