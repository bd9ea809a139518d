//! Per-record payload encoding: optional compression plus a cheap checksum.

use std::ops::RangeInclusive;

use crate::hash::xxh3_64;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    None,
    Lz4,
    Zstd,
}

impl Codec {
    pub fn tag(self) -> u8 {
        match self {
            Codec::None => 0,
            Codec::Lz4 => 1,
            Codec::Zstd => 2,
        }
    }

    pub fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            0 => Some(Codec::None),
            1 => Some(Codec::Lz4),
            2 => Some(Codec::Zstd),
            _ => None,
        }
    }

    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "none" => Ok(Codec::None),
            "lz4" => Ok(Codec::Lz4),
            "zstd" => Ok(Codec::Zstd),
            other => Err(Error::invalid(format!(
                "unsupported shard compression algorithm '{other}': compression must be \
                 'none', 'lz4' or 'zstd'"
            ))),
        }
    }
}

/// Check dataset-rt 0.4.8's `ratio`, an advisory expected compression ratio:
/// finite and > 0, and exactly 1.0 for `none` (which does not compress).
pub fn check_ratio(codec: Codec, ratio: f64) -> Result<()> {
    if !ratio.is_finite() || ratio <= 0.0 {
        return Err(Error::invalid(format!(
            "shard_compression.ratio must be positive and finite, got {ratio}"
        )));
    }
    if codec == Codec::None && ratio != 1.0 {
        return Err(Error::invalid(format!(
            "shard_compression.ratio must be 1.0 when algo is 'none', got {ratio} (the ratio \
             is the expected compression ratio; only 'lz4' and 'zstd' compress)"
        )));
    }
    Ok(())
}

/// How payloads are compressed: a codec and a level, checked when built.
///
/// The level is used by zstd only, but every codec accepts exactly the zstd
/// range so that a configuration valid for one codec is valid for all.
/// (Deserializing a manifest does not re-check: it reports what a cache was
/// written with.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compression {
    codec: Codec,
    level: i32,
}

impl Compression {
    /// The levels every codec accepts (zstd's range).
    pub const LEVELS: RangeInclusive<i32> = 1..=22;

    pub fn new(codec: Codec, level: i32) -> Result<Self> {
        if !Self::LEVELS.contains(&level) {
            let (first, last) = (Self::LEVELS.start(), Self::LEVELS.end());
            let rule = format!("compression level must be between {first} and {last}");
            return Err(Error::invalid(match codec {
                Codec::Zstd => format!("{rule} for zstd, got {level}"),
                Codec::None | Codec::Lz4 => format!(
                    "{rule}, got {level} (the level is used by zstd only, but every codec \
                     accepts the same range)"
                ),
            }));
        }
        Ok(Compression { codec, level })
    }

    /// A codec by name (`none`, `lz4`, `zstd`) and a level.
    pub fn parse(codec: &str, level: i32) -> Result<Self> {
        Self::new(Codec::parse(codec)?, level)
    }

    pub fn codec(self) -> Codec {
        self.codec
    }

    pub fn level(self) -> i32 {
        self.level
    }
}

impl Default for Compression {
    fn default() -> Self {
        Compression {
            codec: Codec::None,
            level: 3,
        }
    }
}

/// A record ready to be appended to a shard.
#[derive(Debug)]
pub struct EncodedRecord {
    /// The payload itself when it is stored uncompressed (shared, not copied).
    pub stored: Bytes,
    pub codec: Codec,
    pub raw_len: u64,
    /// xxh3-64 of `stored`, verified on every read.
    pub checksum: u64,
    /// xxh3-64 of the raw payload, part of the cache's identity.
    pub raw_hash: u64,
}

/// What a shard's index and the cache's identity record of an encoded record,
/// without its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    pub codec: Codec,
    pub raw_len: u64,
    /// xxh3-64 of the stored bytes, verified on every read.
    pub checksum: u64,
    /// xxh3-64 of the raw payload, part of the cache's identity.
    pub raw_hash: u64,
}

impl Encoding {
    /// Encode `raw` without taking it: its encoding, and the stored bytes when
    /// they differ from `raw` (`None`: the record is stored as it is). The one
    /// encoder: `EncodedRecord::encode` and the columnar writer both use it.
    pub fn of(raw: &[u8], compression: Compression) -> Result<(Encoding, Option<Vec<u8>>)> {
        let raw_hash = xxh3_64(raw);
        let raw_len = raw.len() as u64;
        let compressed = match compression.codec() {
            Codec::None => None,
            Codec::Lz4 => Some(lz4_flex::block::compress(raw)),
            Codec::Zstd => Some(
                zstd::bulk::compress(raw, compression.level())
                    .map_err(|e| Error::internal(format!("zstd compression failed: {e}")))?,
            ),
        };
        let checksum = compressed.as_deref().map_or(raw_hash, xxh3_64);
        let encoding = Encoding {
            codec: compression.codec(),
            raw_len,
            checksum,
            raw_hash,
        };
        Ok((encoding, compressed))
    }
}

impl EncodedRecord {
    pub fn encode(raw: impl Into<Bytes>, compression: Compression) -> Result<Self> {
        let raw = raw.into();
        let (encoding, compressed) = Encoding::of(&raw, compression)?;
        Ok(EncodedRecord {
            stored: compressed.map_or(raw, Bytes::from),
            codec: encoding.codec,
            raw_len: encoding.raw_len,
            checksum: encoding.checksum,
            raw_hash: encoding.raw_hash,
        })
    }

    pub fn encoding(&self) -> Encoding {
        Encoding {
            codec: self.codec,
            raw_len: self.raw_len,
            checksum: self.checksum,
            raw_hash: self.raw_hash,
        }
    }
}

/// Decode `stored` into `out`, which must be exactly `raw_len` bytes long.
/// Returns a description of the problem on failure (the caller names the file).
pub fn decode_into(codec: Codec, stored: &[u8], out: &mut [u8]) -> std::result::Result<(), String> {
    match codec {
        Codec::None => {
            if stored.len() != out.len() {
                return Err(format!(
                    "stored length {} differs from raw length {}",
                    stored.len(),
                    out.len()
                ));
            }
            out.copy_from_slice(stored);
            Ok(())
        }
        Codec::Lz4 => match lz4_flex::block::decompress_into(stored, out) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(format!("lz4 produced {n} bytes, expected {}", out.len())),
            Err(e) => Err(format!("lz4 decompression failed: {e}")),
        },
        Codec::Zstd => match zstd::bulk::decompress_to_buffer(stored, out) {
            Ok(n) if n == out.len() => Ok(()),
            Ok(n) => Err(format!("zstd produced {n} bytes, expected {}", out.len())),
            Err(e) => Err(format!("zstd decompression failed: {e}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_codec() {
        let raw: Vec<u8> = (0..10_000u32).map(|i| (i % 7) as u8).collect();
        for codec in [Codec::None, Codec::Lz4, Codec::Zstd] {
            let rec =
                EncodedRecord::encode(raw.clone(), Compression::new(codec, 3).unwrap()).unwrap();
            assert_eq!(rec.checksum, xxh3_64(&rec.stored));
            let mut out = vec![0u8; rec.raw_len as usize];
            decode_into(rec.codec, &rec.stored, &mut out).unwrap();
            assert_eq!(out, raw);
        }
    }

    #[test]
    fn compression_is_checked_when_built() {
        for codec in ["none", "lz4", "zstd"] {
            for level in [1, 3, 22] {
                let c = Compression::parse(codec, level).unwrap();
                assert_eq!(
                    (c.codec(), c.level()),
                    (Codec::parse(codec).unwrap(), level)
                );
            }
        }
        let err = Compression::parse("zstd", 99).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "compression level must be between 1 and 22 for zstd, got 99"
        );
        for (codec, level) in [("zstd", 0), ("lz4", 23), ("none", -1)] {
            let err = Compression::parse(codec, level).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
            assert!(
                err.to_string()
                    .starts_with("compression level must be between 1 and 22"),
                "{err}"
            );
            assert!(err.to_string().contains(&format!("got {level}")), "{err}");
        }
        let err = Compression::parse("gzip", 3).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "unsupported shard compression algorithm 'gzip': compression must be 'none', \
             'lz4' or 'zstd'"
        );
        assert_eq!(
            Compression::default(),
            Compression::new(Codec::None, 3).unwrap()
        );
    }
}
