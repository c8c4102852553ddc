//! Workload generation: which key each operation touches (uniform, Zipf, or a hot set) and
//! which operation it is (the GET/DELETE/PUT mix and the PUT's value size).

use rand::Rng;
use rand_distr::{Distribution, Zipf};

/// Why a workload cannot be built.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    #[error("bad Zipf exponent {exponent:?} in {spec:?}")]
    BadExponent { exponent: String, spec: String },
    #[error("Zipf exponent {0} is not in (0, 10)")]
    ExponentOutOfRange(f64),
    #[error("unknown key distribution {0:?}: use uniform or zipf:THETA")]
    UnknownDist(String),
    #[error("the key space is empty")]
    NoKeys,
    #[error("{hot} hot keys is more than the {keys} keys")]
    TooManyHotKeys { hot: u64, keys: u64 },
    #[error("hot-key fraction {0} is not in [0, 1]")]
    HotFraction(f64),
    #[error(
        "operation mix GET {get} + DELETE {delete} is not a set of fractions summing to at most 1"
    )]
    BadMix { get: f64, delete: f64 },
    #[error("value sizes {0}..={1} are not an ordered range")]
    BadValueSizes(usize, usize),
    #[error("YCSB workload E is made of range scans, which a hash store does not have: Nessie runs A, B, C, D and F")]
    YcsbScans,
    #[error("unknown workload {0:?}: use ycsb-a, ycsb-b, ycsb-c, ycsb-d or ycsb-f")]
    UnknownWorkload(String),
}

/// How keys are drawn.
#[derive(Clone, Debug, PartialEq)]
pub enum KeyDist {
    Uniform,
    /// Zipf with exponent `theta` (the paper uses 0.99).
    Zipf(f64),
}

impl std::str::FromStr for KeyDist {
    type Err = WorkloadError;
    fn from_str(s: &str) -> Result<Self, WorkloadError> {
        if s == "uniform" {
            return Ok(KeyDist::Uniform);
        }
        if let Some(t) = s.strip_prefix("zipf:") {
            let theta: f64 = t.parse().map_err(|_| WorkloadError::BadExponent {
                exponent: t.into(),
                spec: s.into(),
            })?;
            if !(theta > 0.0 && theta < 10.0) {
                return Err(WorkloadError::ExponentOutOfRange(theta));
            }
            return Ok(KeyDist::Zipf(theta));
        }
        Err(WorkloadError::UnknownDist(s.into()))
    }
}

/// Draws key indices in `0..keys`.
#[derive(Clone, Debug)]
pub enum KeyGen {
    Uniform(u64),
    Zipf(Zipf<f64>),
    /// YCSB's "latest": Zipf over recency. Draws a rank (0 = the newest key), which
    /// [`Workload::draw`] turns into a key counting back from the newest insert.
    Latest(Zipf<f64>),
    /// The first `hot` keys receive `fraction` of the draws, uniformly; the rest go uniformly to
    /// the whole key space (the stress harness's contention pattern).
    Hot {
        keys: u64,
        hot: u64,
        fraction: f64,
    },
}

impl KeyGen {
    pub fn new(dist: &KeyDist, keys: u64) -> Result<Self, WorkloadError> {
        if keys == 0 {
            return Err(WorkloadError::NoKeys);
        }
        Ok(match dist {
            KeyDist::Uniform => KeyGen::Uniform(keys),
            // Zipf::new fails only for an empty key space or a bad exponent, both checked.
            KeyDist::Zipf(t) => KeyGen::Zipf(
                Zipf::new(keys, *t).map_err(|_| WorkloadError::ExponentOutOfRange(*t))?,
            ),
        })
    }

    /// `hot` hot keys that receive `fraction` of the draws.
    pub fn hot(keys: u64, hot: u64, fraction: f64) -> Result<Self, WorkloadError> {
        if keys == 0 {
            return Err(WorkloadError::NoKeys);
        }
        if hot > keys {
            return Err(WorkloadError::TooManyHotKeys { hot, keys });
        }
        if !(0.0..=1.0).contains(&fraction) {
            return Err(WorkloadError::HotFraction(fraction));
        }
        Ok(KeyGen::Hot {
            keys,
            hot,
            fraction,
        })
    }

    pub fn next<R: Rng>(&self, rng: &mut R) -> u64 {
        match self {
            KeyGen::Uniform(n) => rng.gen_range(0..*n),
            // Zipf yields ranks 1..=n; rank 1 is the most popular.
            KeyGen::Zipf(z) | KeyGen::Latest(z) => z.sample(rng) as u64 - 1,
            KeyGen::Hot {
                keys,
                hot,
                fraction,
            } => {
                if *hot > 0 && rng.gen_bool(*fraction) {
                    rng.gen_range(0..*hot)
                } else {
                    rng.gen_range(0..*keys)
                }
            }
        }
    }
}

/// The key of index `k` for the benchmark, its agent and the fill test: `key-` and 16 digits,
/// padded with `.` to `key_size` bytes (never shorter than those 20).
pub fn key_bytes(k: u64, key_size: u32) -> Vec<u8> {
    let mut key = Vec::new();
    key_into(k, key_size, &mut key);
    key
}

/// [`key_bytes`] into `out` (its old contents replaced), without allocating once `out` is
/// large enough: the benchmark makes one key per operation.
pub fn key_into(k: u64, key_size: u32, out: &mut Vec<u8>) {
    const MIN_DIGITS: usize = 16;
    let mut digits = [b'0'; 20]; // u64::MAX has 20
    let (mut v, mut start) = (k, digits.len());
    while v > 0 {
        start -= 1;
        digits[start] = b'0' + (v % 10) as u8;
        v /= 10;
    }
    out.clear();
    out.extend_from_slice(b"key-");
    out.extend_from_slice(&digits[start.min(digits.len() - MIN_DIGITS)..]);
    out.resize((key_size as usize).max(out.len()), b'.');
}

/// A value size for key `k` spread evenly over `lo..=hi`, the same on every run and for every
/// store (preloads and the fill test).
pub fn spread_value_size(k: u64, lo: u32, hi: u32) -> u32 {
    let span = u64::from(hi - lo) + 1;
    lo + ((k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % span) as u32
}

/// Which operation a workload step performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Get,
    /// A PUT of an existing key (YCSB's update).
    Put,
    Delete,
    /// A PUT of a new key (YCSB's insert, workload D).
    Insert,
    /// Read the key and write it back under the version read (YCSB's read-modify-write,
    /// workload F): a GET and a conditional PUT, retried if another write came between.
    ReadModifyWrite,
}

/// The YCSB core workloads a hash store can run (all but E, which scans), with YCSB's
/// parameters: Zipf 0.99 request distribution, "latest" for D.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ycsb {
    /// 50% reads, 50% updates.
    A,
    /// 95% reads, 5% updates.
    B,
    /// Reads only.
    C,
    /// 95% reads of the latest keys, 5% inserts.
    D,
    /// 50% reads, 50% read-modify-writes.
    F,
}

/// YCSB's Zipf constant.
pub const YCSB_ZIPF: f64 = 0.99;

impl std::str::FromStr for Ycsb {
    type Err = WorkloadError;
    fn from_str(s: &str) -> Result<Self, WorkloadError> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "ycsb-a" => Ycsb::A,
            "ycsb-b" => Ycsb::B,
            "ycsb-c" => Ycsb::C,
            "ycsb-d" => Ycsb::D,
            "ycsb-f" => Ycsb::F,
            "ycsb-e" => return Err(WorkloadError::YcsbScans),
            _ => return Err(WorkloadError::UnknownWorkload(s.into())),
        })
    }
}

impl Ycsb {
    /// (reads, updates, inserts, read-modify-writes), summing to 1.
    pub fn mix(self) -> (f64, f64, f64, f64) {
        match self {
            Ycsb::A => (0.5, 0.5, 0.0, 0.0),
            Ycsb::B => (0.95, 0.05, 0.0, 0.0),
            Ycsb::C => (1.0, 0.0, 0.0, 0.0),
            Ycsb::D => (0.95, 0.0, 0.05, 0.0),
            Ycsb::F => (0.5, 0.0, 0.0, 0.5),
        }
    }

    /// Its mix in words, e.g. "50% reads, 50% updates" (PUT latencies are its writes).
    pub fn describe(self) -> String {
        let (r, u, i, m) = self.mix();
        [
            (r, "reads"),
            (u, "updates"),
            (i, "inserts"),
            (m, "read-modify-writes"),
        ]
        .iter()
        .filter(|(f, _)| *f > 0.0)
        .map(|(f, what)| format!("{:.0}% {what}", f * 100.0))
        .collect::<Vec<_>>()
        .join(", ")
    }

    /// Whether it needs conditional writes (the CD protocol's).
    pub fn needs_conditional_writes(self) -> bool {
        self.mix().3 > 0.0
    }

    /// The key distribution.
    pub fn dist(self) -> &'static str {
        match self {
            Ycsb::D => "latest",
            _ => "zipf:0.99",
        }
    }
}

/// One drawn operation: its sequence number in the thread, key index, kind, and (for a PUT)
/// the value's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    pub seq: u64,
    pub key: u64,
    pub kind: OpKind,
    pub value_len: usize,
}

/// Key choice plus operation mix: `get` of the operations are GETs, `delete` are DELETEs,
/// `insert` PUTs of new keys, `rmw` read-modify-writes and the rest PUTs, whose value sizes
/// are uniform in `value_size`. Each thread draws from its own copy ([`Workload::for_thread`]),
/// which numbers its inserts.
#[derive(Clone, Debug)]
pub struct Workload {
    pub keys: KeyGen,
    get: f64,
    delete: f64,
    insert: f64,
    rmw: f64,
    value_size: (usize, usize),
    /// Every PUT of a key writes the same size ([`spread_value_size`] of the key), as a cache
    /// whose items keep their size, instead of a size drawn per PUT.
    sizes_by_key: bool,
    inserts: Inserts,
}

/// How a thread numbers the keys it inserts: thread `slot` of `stride` inserts keys
/// `base + slot`, `base + slot + stride`, ..., so that inserts never collide; the newest key
/// overall is estimated as if every thread had inserted as many as this one. The threads
/// together insert at most `(YCSB_INSERT_ROOM - 1) * base` distinct keys: past that, each
/// thread's inserts wrap around to its oldest inserted key, so the store holds at most
/// `YCSB_INSERT_ROOM * base` keys however long the run (an insert on shared memory takes about
/// a microsecond: a few seconds of YCSB D would otherwise fill any table).
#[derive(Clone, Copy, Debug, Default)]
struct Inserts {
    base: u64,
    slot: u64,
    stride: u64,
    done: u64,
    /// Distinct keys this thread inserts before wrapping around.
    cap: u64,
}

/// A YCSB D store holds at most this many times its preloaded records.
pub const YCSB_INSERT_ROOM: u64 = 2;

impl Workload {
    pub fn new(
        keys: KeyGen,
        get: f64,
        delete: f64,
        value_size: (usize, usize),
    ) -> Result<Self, WorkloadError> {
        let fraction = |x: f64| (0.0..=1.0).contains(&x);
        if !(fraction(get) && fraction(delete) && get + delete <= 1.0) {
            return Err(WorkloadError::BadMix { get, delete });
        }
        if value_size.0 > value_size.1 {
            return Err(WorkloadError::BadValueSizes(value_size.0, value_size.1));
        }
        Ok(Self {
            keys,
            get,
            delete,
            insert: 0.0,
            rmw: 0.0,
            value_size,
            sizes_by_key: false,
            inserts: Inserts::default(),
        })
    }

    /// This workload with every key's PUTs of one size, spread over the value sizes by key.
    pub fn with_sizes_by_key(self) -> Self {
        Self {
            sizes_by_key: true,
            ..self
        }
    }

    /// A YCSB core workload over `records` preloaded keys.
    pub fn ycsb(w: Ycsb, records: u64, value_size: (usize, usize)) -> Result<Self, WorkloadError> {
        if records == 0 {
            return Err(WorkloadError::NoKeys);
        }
        let zipf = Zipf::new(records, YCSB_ZIPF).map_err(|_| WorkloadError::NoKeys)?;
        let keys = match w {
            Ycsb::D => KeyGen::Latest(zipf),
            _ => KeyGen::Zipf(zipf),
        };
        let (get, _, insert, rmw) = w.mix();
        let mut wl = Self::new(keys, get, 0.0, value_size)?;
        wl.insert = insert;
        wl.rmw = rmw;
        wl.inserts = Inserts {
            base: records,
            slot: 0,
            stride: 1,
            done: 0,
            cap: records * (YCSB_INSERT_ROOM - 1),
        };
        Ok(wl)
    }

    /// This workload for thread `slot` of `stride` threads drawing from it together.
    pub fn for_thread(&self, slot: u64, stride: u64) -> Self {
        assert!(slot < stride.max(1));
        let mut w = self.clone();
        w.inserts.slot = slot;
        w.inserts.stride = stride.max(1);
        w.inserts.cap = (w.inserts.base * (YCSB_INSERT_ROOM - 1) / w.inserts.stride).max(1);
        w
    }

    /// Draw operation number `seq`.
    pub fn draw<R: Rng>(&mut self, seq: u64, rng: &mut R) -> Planned {
        let drawn = self.keys.next(rng);
        let ins = &mut self.inserts;
        let key = match self.keys {
            // Count back from the newest key (as if every thread inserted as many as we did).
            KeyGen::Latest(_) => {
                (ins.base - 1 + ins.done.min(ins.cap) * ins.stride).saturating_sub(drawn)
            }
            _ => drawn,
        };
        let dice: f64 = rng.gen();
        let mut at = 0.0;
        let mut next = |x: f64| {
            at += x;
            dice < at
        };
        let (kind, key) = if next(self.get) {
            (OpKind::Get, key)
        } else if next(self.delete) {
            (OpKind::Delete, key)
        } else if next(self.insert) {
            let i = ins.done % ins.cap.max(1);
            ins.done += 1;
            (OpKind::Insert, ins.base + ins.slot + i * ins.stride)
        } else if next(self.rmw) {
            (OpKind::ReadModifyWrite, key)
        } else {
            (OpKind::Put, key)
        };
        let value_len = match kind {
            OpKind::Get | OpKind::Delete => 0,
            _ => {
                let (lo, hi) = self.value_size;
                if lo == hi {
                    lo
                } else if self.sizes_by_key {
                    spread_value_size(key, lo as u32, hi as u32) as usize
                } else {
                    rng.gen_range(lo..=hi)
                }
            }
        };
        Planned {
            seq,
            key,
            kind,
            value_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Keys are `key-`, the index with at least 16 digits, and dots up to the key size; the
    /// reused buffer is overwritten whatever it held.
    #[test]
    fn keys_are_the_zero_padded_index() {
        let mut out = b"left over from a longer key, much longer than any".to_vec();
        for k in [
            0,
            7,
            99,
            10u64.pow(15),
            10u64.pow(16) - 1,
            10u64.pow(16),
            u64::MAX,
        ] {
            for size in [8, 20, 24, 128] {
                let want = format!("key-{k:016}");
                let want = format!("{want:.<width$}", width = size.max(want.len()));
                key_into(k, size as u32, &mut out);
                assert_eq!(String::from_utf8_lossy(&out), want, "key {k}, size {size}");
                assert_eq!(key_bytes(k, size as u32), out);
            }
        }
    }

    #[test]
    fn parse() {
        assert_eq!("uniform".parse::<KeyDist>().unwrap(), KeyDist::Uniform);
        assert_eq!("zipf:0.99".parse::<KeyDist>().unwrap(), KeyDist::Zipf(0.99));
        assert!("zipf:x"
            .parse::<KeyDist>()
            .unwrap_err()
            .to_string()
            .contains("bad Zipf"));
        assert!("zipf:-1".parse::<KeyDist>().is_err());
        assert!("normal"
            .parse::<KeyDist>()
            .unwrap_err()
            .to_string()
            .contains("unknown"));
    }

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let g = KeyGen::new(&KeyDist::Zipf(0.99), 1000).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let mut hist = vec![0u32; 1000];
        for _ in 0..100_000 {
            hist[g.next(&mut rng) as usize] += 1;
        }
        assert!(
            hist[0] > 10 * hist[500].max(1),
            "rank 0 should dominate: {} vs {}",
            hist[0],
            hist[500]
        );
        let u = KeyGen::new(&KeyDist::Uniform, 10).unwrap();
        assert!((0..1000).all(|_| u.next(&mut rng) < 10));
        assert!(KeyGen::new(&KeyDist::Uniform, 0).is_err());
    }

    #[test]
    fn hot_keys_take_their_fraction() {
        let g = KeyGen::hot(1000, 4, 0.5).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(2);
        let hot = (0..10_000).filter(|_| g.next(&mut rng) < 4).count();
        // 50% to the hot set plus 0.4% of the uniform half: about 5020.
        assert!((4_700..5_300).contains(&hot), "{hot} hot draws");
        assert!(KeyGen::hot(10, 11, 0.5).is_err());
        assert_eq!(
            KeyGen::hot(10, 2, 1.5).err(),
            Some(WorkloadError::HotFraction(1.5))
        );
    }

    #[test]
    fn the_mix_follows_its_fractions() {
        let mut w = Workload::new(KeyGen::Uniform(100), 0.5, 0.2, (8, 64)).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let mut n = [0u32; 3];
        for seq in 0..10_000 {
            let p = w.draw(seq, &mut rng);
            assert_eq!(p.seq, seq);
            assert!(p.key < 100);
            match p.kind {
                OpKind::Get => n[0] += 1,
                OpKind::Delete => n[1] += 1,
                OpKind::Put => {
                    assert!((8..=64).contains(&p.value_len));
                    n[2] += 1
                }
                k => panic!("{k:?} is not in the mix"),
            }
        }
        assert!((4_700..5_300).contains(&n[0]), "{n:?}");
        assert!((1_800..2_200).contains(&n[1]), "{n:?}");
        assert!(Workload::new(KeyGen::Uniform(1), 0.7, 0.4, (8, 8)).is_err());
        assert!(Workload::new(KeyGen::Uniform(1), 0.5, 0.0, (9, 8)).is_err());
    }

    #[test]
    fn ycsb_mixes_follow_their_definitions() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(4);
        for (name, w) in [
            ("ycsb-a", Ycsb::A),
            ("YCSB-F", Ycsb::F),
            ("ycsb-d", Ycsb::D),
        ] {
            assert_eq!(name.parse::<Ycsb>(), Ok(w));
            let mut wl = Workload::ycsb(w, 1000, (100, 100))
                .unwrap()
                .for_thread(1, 4);
            let mut n = std::collections::HashMap::new();
            let mut inserts = 0u64;
            for seq in 0..20_000 {
                let p = wl.draw(seq, &mut rng);
                *n.entry(p.kind).or_insert(0u32) += 1;
                if p.kind == OpKind::Insert {
                    // Thread 1 of 4 owns 250 of the 1,000 keys of room, then wraps around.
                    assert_eq!(p.key, 1000 + 1 + 4 * (inserts % 250), "{p:?}");
                    inserts += 1;
                } else if w == Ycsb::D {
                    assert!(p.key <= 999 + 4 * inserts.min(250), "{p:?}");
                } else {
                    assert!(p.key < 1000);
                }
            }
            let (get, update, insert, rmw) = w.mix();
            for (kind, f) in [
                (OpKind::Get, get),
                (OpKind::Put, update),
                (OpKind::Insert, insert),
                (OpKind::ReadModifyWrite, rmw),
            ] {
                let got = *n.get(&kind).unwrap_or(&0) as f64 / 20_000.0;
                assert!((got - f).abs() < 0.02, "{name} {kind:?}: {got} vs {f}");
            }
        }
        assert_eq!("ycsb-e".parse::<Ycsb>(), Err(WorkloadError::YcsbScans));
        assert!("ycsb-e"
            .parse::<Ycsb>()
            .unwrap_err()
            .to_string()
            .contains("scans"));
        assert!(matches!(
            "tpcc".parse::<Ycsb>(),
            Err(WorkloadError::UnknownWorkload(_))
        ));
    }

    #[test]
    fn latest_reads_favour_the_newest_keys() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let mut wl = Workload::ycsb(Ycsb::D, 1000, (8, 8))
            .unwrap()
            .for_thread(0, 1);
        let mut newest = 0;
        for seq in 0..10_000 {
            let p = wl.draw(seq, &mut rng);
            if p.kind == OpKind::Insert {
                newest = p.key;
            } else if newest > 0 {
                assert!(p.key <= newest, "a read of a key not yet inserted: {p:?}");
            }
        }
        let reads: Vec<u64> = (0..2_000)
            .map(|s| wl.draw(s, &mut rng))
            .filter(|p| p.kind == OpKind::Get)
            .map(|p| p.key)
            .collect();
        let recent = reads.iter().filter(|&&k| k + 100 > newest).count();
        assert!(
            recent * 2 > reads.len(),
            "{recent} of {} reads among the 100 newest",
            reads.len()
        );
    }
}
