//! `index.bin`: one fixed-size little-endian entry per record, in sample order.
//!
//! | bytes | field |
//! |-------|-------|
//! | 0..4  | shard number (u32) |
//! | 4     | codec tag (0 none, 1 lz4, 2 zstd) |
//! | 5..8  | zero |
//! | 8..16 | offset of the stored record in its shard (u64) |
//! | 16..24| stored length (u64) |
//! | 24..32| raw (decoded) length (u64) |
//! | 32..40| xxh3-64 of the stored bytes (u64) |

use super::codec::Codec;

pub const INDEX_ENTRY_BYTES: usize = 40;

#[cfg(target_endian = "big")]
compile_error!("index.bin and population rows files are little-endian and read in place");

/// An entry as it lies in `index.bin`, read in place from the mapped file
/// (the layout above, little-endian). `entry` decodes its codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct StoredEntry {
    pub shard: u32,
    pub codec: u8,
    pub reserved: [u8; 3],
    pub offset: u64,
    pub stored_len: u64,
    pub raw_len: u64,
    pub checksum: u64,
}

// SAFETY: integers only, no padding (4 + 1 + 3 + 4 * 8 = 40 bytes, align 8).
unsafe impl crate::storage::Plain for StoredEntry {}

const _: () = assert!(size_of::<StoredEntry>() == INDEX_ENTRY_BYTES);

impl StoredEntry {
    /// The entry, or None when its codec tag is unknown (a damaged file; the
    /// cache checks every entry when it opens).
    #[inline]
    pub fn entry(&self) -> Option<IndexEntry> {
        Some(IndexEntry {
            shard: self.shard,
            codec: Codec::from_tag(self.codec)?,
            offset: self.offset,
            stored_len: self.stored_len,
            raw_len: self.raw_len,
            checksum: self.checksum,
        })
    }

    /// What is malformed in the entry, if anything.
    pub fn problem(&self) -> Option<String> {
        if Codec::from_tag(self.codec).is_none() {
            return Some(format!("unknown codec tag {}", self.codec));
        }
        (self.reserved != [0, 0, 0]).then(|| "reserved bytes are not zero".to_string())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub shard: u32,
    pub codec: Codec,
    pub offset: u64,
    pub stored_len: u64,
    pub raw_len: u64,
    pub checksum: u64,
}

impl IndexEntry {
    /// Whether the stored bytes are the payload itself (no codec).
    pub fn stored_as_is(&self) -> bool {
        self.codec == Codec::None && self.stored_len == self.raw_len
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.shard.to_le_bytes());
        out.extend_from_slice(&[self.codec.tag(), 0, 0, 0]);
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.stored_len.to_le_bytes());
        out.extend_from_slice(&self.raw_len.to_le_bytes());
        out.extend_from_slice(&self.checksum.to_le_bytes());
    }

    /// Decode one entry; `Err` describes what is malformed. (Readers map
    /// `index.bin` and read `StoredEntry`s in place.)
    #[cfg(test)]
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() != INDEX_ENTRY_BYTES {
            return Err(format!(
                "an index entry is {INDEX_ENTRY_BYTES} bytes, got {}",
                bytes.len()
            ));
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let mut shard = [0u8; 4];
        shard.copy_from_slice(&bytes[0..4]);
        let codec =
            Codec::from_tag(bytes[4]).ok_or_else(|| format!("unknown codec tag {}", bytes[4]))?;
        if bytes[5..8] != [0, 0, 0] {
            return Err("reserved bytes are not zero".to_string());
        }
        Ok(IndexEntry {
            shard: u32::from_le_bytes(shard),
            codec,
            offset: u64_at(8),
            stored_len: u64_at(16),
            raw_len: u64_at(24),
            checksum: u64_at(32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let e = IndexEntry {
            shard: 3,
            codec: Codec::Zstd,
            offset: 1 << 40,
            stored_len: 17,
            raw_len: 99,
            checksum: 0xDEAD_BEEF,
        };
        let mut buf = Vec::new();
        e.encode(&mut buf);
        assert_eq!(buf.len(), INDEX_ENTRY_BYTES);
        assert_eq!(IndexEntry::decode(&buf).unwrap(), e);
        buf[4] = 9;
        assert!(IndexEntry::decode(&buf).is_err());
    }
}
