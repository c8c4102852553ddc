//! The result of [`crate::check`].

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Event, KeyId};

/// The verdict for one key.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Verdict {
    /// A linearization exists.
    Linearizable,
    /// No linearization exists (the search was exhaustive).
    NotLinearizable {
        /// Human-readable explanation naming the key, the ops that cannot be placed and
        /// the window of conflicting events.
        explanation: String,
        /// The pending operations (Gets) that could not be placed at the deepest dead end.
        unplaceable: Vec<Event>,
        /// A small window of events around the conflict, sorted by invocation time.
        window: Vec<Event>,
    },
    /// The search budget ([`crate::Limits::max_states_per_key`]) ran out. Not a pass.
    Unknown {
        /// Why, and how far the search got.
        reason: String,
    },
}

/// The result for one key.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KeyReport {
    /// The key.
    pub key: KeyId,
    /// Events recorded for the key.
    pub events: usize,
    /// Operations searched (after dropping failed Gets and failed writes that cannot
    /// have been observed).
    pub ops: usize,
    /// Number of segments between quiescent points (with failed writes bounded as
    /// described in [`crate::check`]).
    pub segments: usize,
    /// Distinct search states (memo entries) explored.
    pub states_explored: u64,
    /// The verdict.
    pub verdict: Verdict,
}

impl KeyReport {
    /// True if the key is linearizable.
    pub fn is_ok(&self) -> bool {
        matches!(self.verdict, Verdict::Linearizable)
    }
}

/// The result of checking a history.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// One entry per key, sorted by key.
    pub keys: Vec<KeyReport>,
    /// Number of events in the history.
    pub events: usize,
    /// Distinct search states explored over all keys.
    pub states_explored: u64,
}

impl Report {
    /// True only if every key is linearizable (`Unknown` is not a pass).
    pub fn is_ok(&self) -> bool {
        self.keys.iter().all(KeyReport::is_ok)
    }

    /// The report of one key.
    pub fn key(&self, key: KeyId) -> Option<&KeyReport> {
        self.keys
            .binary_search_by_key(&key, |k| k.key)
            .ok()
            .map(|i| &self.keys[i])
    }

    /// Keys proven not linearizable.
    pub fn violations(&self) -> impl Iterator<Item = &KeyReport> {
        self.keys
            .iter()
            .filter(|k| matches!(k.verdict, Verdict::NotLinearizable { .. }))
    }

    /// Keys whose search budget ran out.
    pub fn unknown(&self) -> impl Iterator<Item = &KeyReport> {
        self.keys
            .iter()
            .filter(|k| matches!(k.verdict, Verdict::Unknown { .. }))
    }

    /// Number of keys checked.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Number of linearizable keys.
    pub fn linearizable_count(&self) -> usize {
        self.keys.iter().filter(|k| k.is_ok()).count()
    }
}

/// At most this many failing keys are detailed by `Display`.
const MAX_DETAILED_KEYS: usize = 10;

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bad = self.violations().count();
        let unknown = self.unknown().count();
        writeln!(
            f,
            "linearizability {}: {} keys ({} linearizable, {} not linearizable, {} unknown), {} events, {} states explored",
            if self.is_ok() { "OK" } else if bad > 0 { "VIOLATED" } else { "UNKNOWN" },
            self.key_count(),
            self.linearizable_count(),
            bad,
            unknown,
            self.events,
            self.states_explored
        )?;
        let failing: Vec<&KeyReport> = self.keys.iter().filter(|k| !k.is_ok()).collect();
        for k in failing.iter().take(MAX_DETAILED_KEYS) {
            match &k.verdict {
                Verdict::Linearizable => {}
                Verdict::NotLinearizable { explanation, .. } => writeln!(f, "{explanation}")?,
                Verdict::Unknown { reason } => writeln!(f, "{reason}")?,
            }
        }
        if failing.len() > MAX_DETAILED_KEYS {
            writeln!(
                f,
                "... and {} more failing keys",
                failing.len() - MAX_DETAILED_KEYS
            )?;
        }
        Ok(())
    }
}
