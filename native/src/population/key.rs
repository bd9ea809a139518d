//! A population row's key in its rows file (`rows.rs`), and where the keys
//! start: the layout both the rows file and the identity columns made from
//! it (`ids.rs`) read, so neither imports the other for it.

/// Where the keys start in a rows file (after its header).
pub const ROWS_HEADER: usize = 64;
/// Bits of a key that hold the sample id; the cache position is above them.
pub const SAMPLE_BITS: u32 = 40;
pub const SAMPLE_MASK: u64 = (1 << SAMPLE_BITS) - 1;
/// Sample ids and cache positions a key can hold.
pub const MAX_SAMPLE_ID: u64 = SAMPLE_MASK;
pub const MAX_CACHES: usize = 1 << (64 - SAMPLE_BITS);

/// A key's (cache position, sample id).
#[inline]
pub fn split_key(key: u64) -> (u64, u64) {
    (key >> SAMPLE_BITS, key & SAMPLE_MASK)
}
