//! The fill test: how many items a store holds in a given amount of memory. One loader writes
//! distinct keys, values of sizes spread over a range, until the store refuses for lack of
//! room; the same loop fills Nessie (through any [`KvClient`]) and memcached (through
//! [`crate::memcached::MemcachedConn`]), so the two counts are comparable.

use nessie_protocols::{Error, KvClient};

pub use crate::workload::{key_bytes, spread_value_size};

/// Most items one fill writes (a bound on the run, far above any budget tested here).
pub const MAX_FILL_ITEMS: u64 = 1 << 32;

/// What a fill writes.
#[derive(Clone, Debug, PartialEq)]
pub struct FillSpec {
    /// Keys are `key-` and 16 digits, padded with `.` to this many bytes (at least 20).
    pub key_size: u32,
    /// Value sizes, spread evenly over this range (inclusive).
    pub value_sizes: (u32, u32),
    /// Stop after this many items even if the store has room.
    pub max_items: u64,
}

/// How a store answered one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Out of memory (or of index room): the fill is over.
    Full(String),
    /// Anything else: the fill failed.
    Failed(String),
}

/// A store the fill can write into.
pub trait FillTarget {
    fn store(&mut self, key: &[u8], value: &[u8]) -> Result<(), Refusal>;
}

/// Any Nessie client: a full data table or index ends the fill.
pub struct Client<C>(pub C);

impl<C: KvClient> FillTarget for Client<C> {
    fn store(&mut self, key: &[u8], value: &[u8]) -> Result<(), Refusal> {
        self.0.put(key, value).map_err(refusal)
    }
}

fn refusal(e: Error) -> Refusal {
    match e {
        Error::DataTableFull { .. } | Error::IndexFull { .. } => Refusal::Full(e.to_string()),
        e => Refusal::Failed(e.to_string()),
    }
}

/// Several Nessie clients (one per node) written to in turn, so that every node's data table
/// fills: today a node's writes go to its own table.
pub struct RoundRobin<C> {
    clients: Vec<C>,
    next: usize,
}

impl<C> RoundRobin<C> {
    pub fn new(clients: Vec<C>) -> Self {
        assert!(!clients.is_empty(), "a fill needs a client");
        Self { clients, next: 0 }
    }
}

impl<C: KvClient> FillTarget for RoundRobin<C> {
    fn store(&mut self, key: &[u8], value: &[u8]) -> Result<(), Refusal> {
        let i = self.next;
        self.next = (i + 1) % self.clients.len();
        self.clients[i].put(key, value).map_err(refusal)
    }
}

/// What a fill achieved.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FillOutcome {
    /// Items stored before the first refusal.
    pub items: u64,
    /// Bytes of keys and values stored.
    pub key_bytes: u64,
    pub value_bytes: u64,
    /// The store's answer that ended the fill (`None`: `max_items` reached).
    pub refusal: Option<String>,
}

/// Why a fill failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FillError {
    #[error("keys need at least 20 bytes, not {0}")]
    KeySize(u32),
    #[error("value sizes {0}..={1} are not an ordered range")]
    ValueSizes(u32, u32),
    #[error("item {item} was refused: {reason}")]
    Failed { item: u64, reason: String },
}

/// Write items `0, 1, 2, …` into `target` until it is full (or `max_items`).
pub fn fill<T: FillTarget>(target: &mut T, spec: &FillSpec) -> Result<FillOutcome, FillError> {
    if spec.key_size < 20 {
        return Err(FillError::KeySize(spec.key_size));
    }
    let (lo, hi) = spec.value_sizes;
    if lo > hi {
        return Err(FillError::ValueSizes(lo, hi));
    }
    let value = vec![0x6du8; hi as usize];
    let mut out = FillOutcome {
        items: 0,
        key_bytes: 0,
        value_bytes: 0,
        refusal: None,
    };
    for i in 0..spec.max_items.min(MAX_FILL_ITEMS) {
        let key = key_bytes(i, spec.key_size);
        let len = spread_value_size(i, lo, hi) as usize;
        match target.store(&key, &value[..len]) {
            Ok(()) => {
                out.items += 1;
                out.key_bytes += key.len() as u64;
                out.value_bytes += len as u64;
            }
            Err(Refusal::Full(why)) => {
                out.refusal = Some(why);
                break;
            }
            Err(Refusal::Failed(reason)) => return Err(FillError::Failed { item: i, reason }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store with room for `budget` bytes of keys and values.
    struct Budget {
        budget: u64,
        used: u64,
    }

    impl FillTarget for Budget {
        fn store(&mut self, key: &[u8], value: &[u8]) -> Result<(), Refusal> {
            let need = (key.len() + value.len()) as u64;
            if self.used + need > self.budget {
                return Err(Refusal::Full("out of memory".into()));
            }
            self.used += need;
            Ok(())
        }
    }

    #[test]
    fn fills_until_the_store_refuses() {
        let spec = FillSpec {
            key_size: 32,
            value_sizes: (64, 4096),
            max_items: u64::MAX,
        };
        let mut b = Budget {
            budget: 1 << 20,
            used: 0,
        };
        let out = fill(&mut b, &spec).unwrap();
        assert_eq!(out.refusal.as_deref(), Some("out of memory"));
        assert_eq!(out.key_bytes + out.value_bytes, b.used);
        let mean = out.value_bytes as f64 / out.items as f64;
        assert!((1_800.0..2_400.0).contains(&mean), "mean value size {mean}");
        let capped = fill(
            &mut Budget {
                budget: 1 << 20,
                used: 0,
            },
            &FillSpec {
                max_items: 10,
                ..spec.clone()
            },
        )
        .unwrap();
        assert_eq!((capped.items, capped.refusal), (10, None));
    }

    #[test]
    fn other_refusals_fail_the_fill_and_bad_specs_are_named() {
        struct Broken;
        impl FillTarget for Broken {
            fn store(&mut self, _: &[u8], _: &[u8]) -> Result<(), Refusal> {
                Err(Refusal::Failed("connection reset".into()))
            }
        }
        let spec = FillSpec {
            key_size: 20,
            value_sizes: (1, 1),
            max_items: 5,
        };
        let e = fill(&mut Broken, &spec).unwrap_err();
        assert!(e.to_string().contains("connection reset"), "{e}");
        let e = fill(
            &mut Broken,
            &FillSpec {
                key_size: 8,
                ..spec.clone()
            },
        )
        .unwrap_err();
        assert_eq!(e, FillError::KeySize(8));
        let e = fill(
            &mut Broken,
            &FillSpec {
                value_sizes: (9, 8),
                ..spec
            },
        )
        .unwrap_err();
        assert_eq!(e, FillError::ValueSizes(9, 8));
    }

    #[test]
    fn keys_and_sizes_are_stable() {
        assert_eq!(key_bytes(7, 24), b"key-0000000000000007....".to_vec());
        assert!((0..10_000).all(|i| (64..=4096).contains(&spread_value_size(i, 64, 4096))));
        assert_eq!(spread_value_size(5, 100, 100), 100);
    }
}
