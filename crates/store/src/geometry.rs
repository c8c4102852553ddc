//! Cluster geometry: the sizes that fix the memory format and the hash functions. Every node
//! and client of a cluster must agree on it exactly (see [`Geometry::fingerprint`]).

use crate::classes::{ClassError, DteField, SizeClasses};
use crate::classtable::RESERVE_PAGES;
use crate::dte::DteLayout;
use crate::ite::{IteLayout, IteLayoutError};
use crate::limits::*;

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Geometry {
    /// Nodes in the cluster; each has one index table and one data table.
    pub nodes: u32,
    /// Index table entries per node.
    pub ites_per_node: u64,
    /// Data table capacity per node, counted in entries of the largest class (values of
    /// `value_max` bytes); smaller values fit more. The table is this rounded up to whole pages,
    /// plus [`RESERVE_PAGES`] kept for deletes.
    pub dtes_per_node: u64,
    /// Largest key in bytes.
    pub key_max: u32,
    /// Largest value in bytes.
    pub value_max: u32,
    /// N of N-way cuckoo hashing.
    pub hash_functions: u8,
    /// Filter bits stored in each ITE.
    pub filter_bits: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cluster geometry: {0}")]
pub struct GeometryError(#[from] pub GeometryProblem);

/// What is wrong with a geometry: each names the field (or the derived size) at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GeometryProblem {
    #[error("nodes = {0} is not in 1..={MAX_NODES}")]
    Nodes(u32),
    #[error("hash_functions = {0} is not in {MIN_HASH_FUNCTIONS}..={MAX_HASH_FUNCTIONS}")]
    HashFunctions(u8),
    #[error("filter_bits = {0} exceeds {MAX_FILTER_BITS}")]
    FilterBits(u8),
    #[error("ites_per_node = {0} is not in 1..={MAX_ITES_PER_NODE}")]
    ItesPerNode(u64),
    #[error(
        "{total} index entries in total cannot hold {hash_functions} distinct candidates per key with room to migrate"
    )]
    IndexTooSmall { total: u64, hash_functions: u8 },
    #[error(
        "ites_per_node = {ites_per_node} cannot hold {hash_functions} distinct candidates per key with room to migrate \
         in one node's index table (coupled placement needs at least {needed})"
    )]
    CoupledIndexTooSmall {
        ites_per_node: u64,
        hash_functions: u8,
        needed: u64,
    },
    #[error("dtes_per_node = {0} is not in 1..={MAX_DTES_PER_NODE}")]
    DtesPerNode(u64),
    #[error("key_max = {0} is not in 1..={MAX_KEY_SIZE}")]
    KeyMax(u32),
    #[error(
        "value_max = {0} is not in 1..={MAX_VALUE_SIZE} (a store of empty values only is a mistake)"
    )]
    ValueMax(u32),
    #[error(
        "data table of {entries} entries x {entry_size} bytes = {bytes} bytes exceeds {MAX_DATA_TABLE_BYTES}"
    )]
    DataTableTooLarge {
        entries: u64,
        entry_size: u64,
        bytes: u64,
    },
    #[error(transparent)]
    Ite(#[from] IteLayoutError),
    #[error(transparent)]
    Classes(#[from] ClassError),
    #[error(
        "{bytes} bytes per node cannot hold the smallest data table: {pages} pages of {page_bytes} bytes \
         (each holds {per_page} entries of the largest size class, {entry_size} bytes; one page is kept \
         for deletes) and their index; give at least {needed} bytes or a smaller value_max"
    )]
    BudgetTooSmall {
        bytes: u64,
        pages: u64,
        page_bytes: u64,
        per_page: u64,
        entry_size: u64,
        needed: u64,
    },
    #[error("index load factor {0} is not in (0, 0.95]")]
    LoadFactor(String),
}

impl Default for Geometry {
    fn default() -> Self {
        Self {
            nodes: 3,
            ites_per_node: 1 << 16,
            dtes_per_node: 1 << 14,
            key_max: 128,
            value_max: 1024,
            hash_functions: 3,
            filter_bits: 7,
        }
    }
}

/// Fewest index entries per node a memory budget may leave.
pub const MIN_BUDGET_ITES: u64 = 64;

/// Width of the ITE's DTI (data table identifier, the node id): enough for [`MAX_NODES`] node
/// ids, fixed so that the format does not depend on the node count (layout version 3).
pub const DTI_BITS: u8 = bits_for(MAX_NODES as u64);
const _: () = assert!(1u64 << DTI_BITS == MAX_NODES as u64);

const fn bits_for(count: u64) -> u8 {
    // Bits needed to number `count` distinct things (at least one bit).
    let count = if count < 2 { 2 } else { count };
    (64 - (count - 1).leading_zeros()) as u8
}

/// Entry size (bytes) a memory budget's index is sized for, at most: a cache's items are
/// mostly small, and an index sized for the mean of values up to `value_max` filled long before
/// the data tables (2 × 128 MiB held 71,050 items of 64..4096 B, where memcached `-m 256` holds
/// 108,012). At load factor 0.5 the index costs 16 B per item: 3% of the budget.
pub const INDEX_MEAN_ENTRY: u64 = 512;

impl Geometry {
    /// Check every field against its limit and derive the ITE and DTE layouts.
    pub fn validate(&self) -> Result<(IteLayout, DteLayout), GeometryError> {
        use GeometryProblem as P;
        if self.nodes == 0 || self.nodes > MAX_NODES {
            return Err(P::Nodes(self.nodes).into());
        }
        if !(MIN_HASH_FUNCTIONS..=MAX_HASH_FUNCTIONS).contains(&self.hash_functions) {
            return Err(P::HashFunctions(self.hash_functions).into());
        }
        if self.filter_bits > MAX_FILTER_BITS {
            return Err(P::FilterBits(self.filter_bits).into());
        }
        if self.ites_per_node == 0 || self.ites_per_node > MAX_ITES_PER_NODE {
            return Err(P::ItesPerNode(self.ites_per_node).into());
        }
        let total = self.ites_per_node * self.nodes as u64;
        if total < 2 * self.hash_functions as u64 {
            return Err(P::IndexTooSmall {
                total,
                hash_functions: self.hash_functions,
            }
            .into());
        }
        if self.dtes_per_node == 0 || self.dtes_per_node > MAX_DTES_PER_NODE {
            return Err(P::DtesPerNode(self.dtes_per_node).into());
        }
        if self.key_max == 0 || self.key_max > MAX_KEY_SIZE {
            return Err(P::KeyMax(self.key_max).into());
        }
        if self.value_max == 0 || self.value_max > MAX_VALUE_SIZE {
            return Err(P::ValueMax(self.value_max).into());
        }
        let dte = DteLayout::new(self.key_max, self.value_max);
        let table_bytes = dte.entry_size.saturating_mul(self.dtes_per_node);
        if table_bytes > MAX_DATA_TABLE_BYTES {
            return Err(P::DataTableTooLarge {
                entries: self.dtes_per_node,
                entry_size: dte.entry_size,
                bytes: table_bytes,
            }
            .into());
        }
        // One data table per node: the DTI is the node id, [`DTI_BITS`] wide whatever the node
        // count, so that nodes can join without a new memory format. The DTE field names a
        // class and a slot of it (see `DteField`).
        let field = self.dte_field()?;
        let ite = IteLayout::new(field.bits(), DTI_BITS, self.filter_bits).map_err(P::from)?;
        Ok((ite, dte))
    }

    /// The size classes of this geometry's data tables.
    pub fn classes(&self) -> Result<SizeClasses, GeometryError> {
        Ok(SizeClasses::new(self.key_max, self.value_max).map_err(GeometryProblem::from)?)
    }

    /// How an ITE names a DTE in this geometry.
    pub fn dte_field(&self) -> Result<DteField, GeometryError> {
        let classes = self.classes()?;
        Ok(DteField::new(&classes, self.data_pages_per_node()))
    }

    /// Pages of one node's data table: `dtes_per_node` largest entries, rounded up to whole
    /// pages, and the delete reserve.
    pub fn data_pages_per_node(&self) -> u64 {
        let Ok(classes) = SizeClasses::new(self.key_max, self.value_max) else {
            return 0;
        };
        let largest = classes.entry_size((classes.len() - 1) as u8);
        let per_page = classes.page_bytes() / largest;
        self.dtes_per_node.div_ceil(per_page) + RESERVE_PAGES
    }

    /// The geometry that spends `bytes_per_node` on one node's index, data and page tables.
    /// The index is sized for a data table full of entries of [`INDEX_MEAN_ENTRY`] bytes (or,
    /// if smaller, the mean size of items with values uniform in 0..=`value_max` and keys of
    /// `key_max / 2`), at `load_factor`; the data table gets whole pages and the index whatever
    /// is left. Other fields are the defaults.
    pub fn for_memory(
        nodes: u32,
        bytes_per_node: u64,
        key_max: u32,
        value_max: u32,
        load_factor: f64,
    ) -> Result<Self, GeometryError> {
        if !(load_factor > 0.0 && load_factor <= 0.95) {
            return Err(GeometryProblem::LoadFactor(load_factor.to_string()).into());
        }
        let classes = SizeClasses::new(key_max, value_max).map_err(GeometryProblem::from)?;
        let largest = classes.entry_size((classes.len() - 1) as u8);
        let mean = classes
            .class_for(key_max / 2, value_max / 2)
            .map_or(largest, |c| classes.entry_size(c))
            .min(INDEX_MEAN_ENTRY);
        // Each data byte brings 8 / (load_factor * mean) index bytes, and a page its page word.
        let page = classes.page_bytes() as f64;
        let share = 1.0 + 8.0 / (load_factor * mean as f64) + 8.0 / page;
        let min_pages = RESERVE_PAGES + 1;
        let min_tables = min_pages * (classes.page_bytes() + 8);
        let too_small = GeometryProblem::BudgetTooSmall {
            bytes: bytes_per_node,
            pages: min_pages,
            page_bytes: classes.page_bytes(),
            per_page: classes.page_bytes() / largest,
            entry_size: largest,
            needed: ((min_pages as f64 * page * share).ceil() as u64)
                .max(min_tables + 8 * MIN_BUDGET_ITES),
        };
        let pages = ((bytes_per_node as f64 / share) / page) as u64;
        if pages <= RESERVE_PAGES {
            return Err(too_small.into());
        }
        let dtes = (pages - RESERVE_PAGES) * (classes.page_bytes() / largest);
        let mut g = Self {
            nodes,
            ites_per_node: 1,
            dtes_per_node: dtes,
            key_max,
            value_max,
            ..Self::default()
        };
        let tables = g.data_table_bytes() + g.page_table_bytes();
        g.ites_per_node = bytes_per_node.saturating_sub(tables) / 8;
        if g.ites_per_node < MIN_BUDGET_ITES {
            return Err(too_small.into());
        }
        g.validate()?;
        Ok(g)
    }

    /// Total ITEs across the cluster.
    pub fn total_ites(&self) -> u64 {
        self.ites_per_node * self.nodes as u64
    }

    /// Bytes of one node's index table.
    pub fn index_table_bytes(&self) -> u64 {
        self.ites_per_node * 8
    }

    /// Bytes of one node's data table.
    pub fn data_table_bytes(&self) -> u64 {
        let page = SizeClasses::new(self.key_max, self.value_max).map_or(0, |c| c.page_bytes());
        self.data_pages_per_node() * page
    }

    /// Bytes of one node's page table (one word per page of its data table).
    pub fn page_table_bytes(&self) -> u64 {
        self.data_pages_per_node() * 8
    }

    /// Bytes of one node's tables together: index, data and page table.
    pub fn node_table_bytes(&self) -> u64 {
        self.index_table_bytes() + self.data_table_bytes() + self.page_table_bytes()
    }

    /// Sizes of the regions that hold one node's tables, by region id: index, data and page
    /// table ([`crate::INDEX_REGION`], [`crate::DATA_REGION`], [`crate::PAGE_REGION`]).
    pub fn table_regions(&self) -> Vec<u64> {
        vec![
            self.index_table_bytes(),
            self.data_table_bytes(),
            self.page_table_bytes(),
        ]
    }

    /// A stable digest of the geometry; peers whose fingerprints differ must not join.
    pub fn fingerprint(&self) -> u64 {
        let s = format!(
            "nessie-geometry-v3:{}:{}:{}:{}:{}:{}:{}",
            self.nodes,
            self.ites_per_node,
            self.dtes_per_node,
            self.key_max,
            self.value_max,
            self.hash_functions,
            self.filter_bits
        );
        xxhash_rust::xxh3::xxh3_64(s.as_bytes())
    }
}

/// Why a byte count does not parse. Each message starts with what was given.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ByteCountError {
    #[error("empty: give a byte count, e.g. 4096, 64K or 128MiB")]
    Empty,
    #[error("{0}: negative (a byte count is 0 or more)")]
    Negative(String),
    #[error("{0}: not a byte count (e.g. 4096, 64K or 128MiB)")]
    NotANumber(String),
    #[error("{spec}: unknown unit {unit:?} (K, M, G or KiB, MiB, GiB: powers of 1024)")]
    Unit { unit: String, spec: String },
    #[error("{0}: too large")]
    TooLarge(String),
}

/// Parse a byte count: `N` bytes, or `N` with a unit K, M, G (or KiB, MiB, GiB, KB, MB, GB,
/// any case; all powers of 1024, as memory is counted), with or without a space between.
pub fn parse_bytes(s: &str) -> Result<u64, ByteCountError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(ByteCountError::Empty);
    }
    if t.starts_with('-') {
        return Err(ByteCountError::Negative(t.into()));
    }
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits);
    if n.is_empty() {
        return Err(ByteCountError::NotANumber(t.into()));
    }
    let unit = unit.trim();
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        _ => {
            return Err(ByteCountError::Unit {
                unit: unit.into(),
                spec: t.into(),
            })
        }
    };
    // Only digits: the one way to fail is overflow.
    let n: u64 = n.parse().map_err(|_| ByteCountError::TooLarge(t.into()))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| ByteCountError::TooLarge(t.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_widths_follow_geometry() {
        let g = Geometry::default();
        let (ite, dte) = g.validate().unwrap();
        assert_eq!(
            ite.dti_bits, 12,
            "node ids up to 4095, whatever the node count"
        );
        let one = Geometry {
            nodes: 1,
            ..g.clone()
        }
        .validate()
        .unwrap()
        .0;
        assert_eq!(one, ite, "the ITE format does not depend on the node count");
        // docs/layout.md's worked examples.
        assert_eq!((ite.dte_bits, ite.seq_bits), (22, 20));
        let fill = Geometry::for_memory(2, 128 << 20, 32, 4096, 0.5).unwrap();
        let (fill_ite, _) = fill.validate().unwrap();
        assert_eq!((fill_ite.dte_bits, fill_ite.seq_bits), (26, 16));
        let field = g.dte_field().unwrap();
        assert_eq!(ite.dte_bits, field.bits());
        let classes = g.classes().unwrap();
        assert!(
            1u64 << field.slot_bits >= g.data_pages_per_node() * classes.per_page(0),
            "every slot of the smallest class has a number"
        );
        assert_eq!(ite.filter_bits, 7);
        assert_eq!(dte.entry_size % 8, 0);
    }

    #[test]
    fn a_memory_budget_pays_for_index_and_data() {
        let g = Geometry::for_memory(2, 128 << 20, 32, 4096, 0.5).unwrap();
        let spent = g.node_table_bytes();
        assert!(spent <= 128 << 20 && spent > 127 << 20, "{spent} bytes");
        // Enough index entries for a data table full of mean-sized items at load factor 0.5.
        let classes = g.classes().unwrap();
        let mean = classes.entry_size(classes.class_for(16, 2048).unwrap());
        let items = g.data_table_bytes() / mean.min(INDEX_MEAN_ENTRY);
        assert!(
            g.ites_per_node >= items * 2,
            "{} ITEs for {items} items",
            g.ites_per_node
        );
        let e = Geometry::for_memory(2, 1024, 32, 4096, 0.5).unwrap_err();
        // The least budget the error names is enough.
        let GeometryError(GeometryProblem::BudgetTooSmall { needed, .. }) = e.clone() else {
            panic!("{e}");
        };
        Geometry::for_memory(2, needed, 32, 4096, 0.5).unwrap();
        Geometry::for_memory(2, needed - 1, 32, 4096, 0.5).unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot hold the smallest data table"),
            "{e}"
        );
        let e = Geometry::for_memory(2, 1 << 20, 32, 4096, 0.0).unwrap_err();
        assert!(e.to_string().contains("load factor"), "{e}");
        let e = Geometry::for_memory(0, 1 << 20, 32, 4096, 0.5).unwrap_err();
        assert!(e.to_string().contains("nodes"), "{e}");
    }

    #[test]
    fn bits_for_boundaries() {
        assert_eq!(bits_for(1), 1);
        assert_eq!(bits_for(2), 1);
        assert_eq!(bits_for(3), 2);
        assert_eq!(bits_for(4), 2);
        assert_eq!(bits_for(5), 3);
        assert_eq!(bits_for(1 << 32), 32);
        assert_eq!(bits_for((1 << 32) + 1), 33);
    }

    #[test]
    fn every_limit_is_enforced_with_a_named_error() {
        type Case = (Box<dyn Fn(&mut Geometry)>, &'static str);
        let cases: Vec<Case> = vec![
            (Box::new(|g| g.nodes = 0), "nodes"),
            (Box::new(|g| g.nodes = MAX_NODES + 1), "nodes"),
            (Box::new(|g| g.hash_functions = 1), "hash_functions"),
            (Box::new(|g| g.hash_functions = 9), "hash_functions"),
            (Box::new(|g| g.filter_bits = 17), "filter_bits"),
            (Box::new(|g| g.ites_per_node = 0), "ites_per_node"),
            (
                Box::new(|g| {
                    g.nodes = 1;
                    g.ites_per_node = 5
                }),
                "distinct candidates",
            ),
            (Box::new(|g| g.dtes_per_node = 0), "dtes_per_node"),
            (Box::new(|g| g.key_max = 0), "key_max"),
            (Box::new(|g| g.key_max = MAX_KEY_SIZE + 1), "key_max"),
            (Box::new(|g| g.value_max = MAX_VALUE_SIZE + 1), "value_max"),
            (
                Box::new(|g| g.value_max = 0),
                "value_max = 0 is not in 1..=",
            ),
            (
                Box::new(|g| {
                    g.dtes_per_node = u32::MAX as u64;
                    g.value_max = MAX_VALUE_SIZE
                }),
                "data table",
            ),
        ];
        for (f, needle) in cases {
            let mut g = Geometry::default();
            f(&mut g);
            let e = g.validate().expect_err(needle).to_string();
            assert!(e.contains(needle), "{e:?} should mention {needle}");
        }
    }

    #[test]
    fn widest_geometry_still_fits_one_word() {
        let g = Geometry {
            nodes: MAX_NODES,
            dtes_per_node: MAX_DTES_PER_NODE,
            filter_bits: MAX_FILTER_BITS,
            key_max: 8,
            value_max: 1,
            ..Geometry::default()
        };
        let (ite, _) = g.validate().unwrap();
        assert!(
            u32::from(ite.dte_bits) + u32::from(ite.dti_bits) + u32::from(ite.filter_bits) < 64
        );
    }

    #[test]
    fn fingerprint_changes_with_any_field() {
        let base = Geometry::default();
        let mut other = base.clone();
        other.value_max += 8;
        assert_ne!(base.fingerprint(), other.fingerprint());
        assert_eq!(base.fingerprint(), Geometry::default().fingerprint());
    }

    #[test]
    fn byte_counts_take_binary_units() {
        assert_eq!(parse_bytes("134217728"), Ok(128 << 20));
        assert_eq!(parse_bytes("128MiB"), Ok(128 << 20));
        assert_eq!(parse_bytes("128M"), Ok(128 << 20));
        assert_eq!(parse_bytes("2 GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("64k"), Ok(64 << 10));
        assert_eq!(parse_bytes("64KB"), Ok(64 << 10));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes(" 7b "), Ok(7));
    }

    #[test]
    fn a_bad_byte_count_says_what_is_wrong() {
        let e = |s: &str| parse_bytes(s).unwrap_err().to_string();
        assert!(
            e("12Q").starts_with("12Q: unknown unit \"Q\""),
            "{}",
            e("12Q")
        );
        assert!(e("12XB").contains("unknown unit"));
        assert!(e("MiB").starts_with("MiB: not a byte count"));
        assert!(
            e("1.5G").contains("unknown unit"),
            "no fractions: {}",
            e("1.5G")
        );
        assert_eq!(e("99999999999999999G"), "99999999999999999G: too large");
        assert_eq!(
            e("99999999999999999999999"),
            "99999999999999999999999: too large"
        );
        assert!(e("").starts_with("empty"));
        assert!(e("  ").starts_with("empty"));
        assert!(e("-5").starts_with("-5: negative"));
        assert!(e("-5K").starts_with("-5K: negative"));
    }
}
