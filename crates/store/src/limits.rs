//! Explicit upper bounds on everything the configuration can size. A geometry outside them is
//! rejected at start-up with an error naming the limit.

/// Most nodes in one cluster.
pub const MAX_NODES: u32 = 4096;
/// Fewest / most cuckoo hash functions (N of N-way cuckoo hashing).
pub const MIN_HASH_FUNCTIONS: u8 = 2;
pub const MAX_HASH_FUNCTIONS: u8 = 8;
/// Most filter bits in an ITE (0 disables the field): 15 since layout version 4 took a bit
/// for the fence, so that the widest geometry the other limits allow still fits one word.
pub const MAX_FILTER_BITS: u8 = 15;
/// Largest key, in bytes (keys are stored inline in each DTE, padded to 8 bytes).
pub const MAX_KEY_SIZE: u32 = 64 * 1024;
/// Largest value, in bytes (the largest size class holds one with the longest key).
pub const MAX_VALUE_SIZE: u32 = 64 * 1024 * 1024;
/// Most ITEs per node (8 bytes each: 2^36 ITEs = 512 GiB).
pub const MAX_ITES_PER_NODE: u64 = 1 << 36;
/// Most DTEs per node.
pub const MAX_DTES_PER_NODE: u64 = u32::MAX as u64;
/// Largest data table per node, in bytes.
pub const MAX_DATA_TABLE_BYTES: u64 = 1 << 40;
