//! The engine's identities, on the ground floor: every module that names a
//! population or a run takes these types, and the rule each id follows is
//! written here once.
//!
//! - `PopulationId`: the xxh3-128 of a population's canonical table, 32
//!   lowercase hex digits (`population::table_id`).
//! - `RunId`: drawn when a training run starts, kept by every resume of it,
//!   32 lowercase hex digits (`run::fence` knows a run by it).
//! - `unique_suffix`: a name part no other writer uses (temporary files, run
//!   ids).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::hash::xxh3_128;

/// Whether `value` is 32 lowercase hex digits (both kinds of id).
fn is_hex_id(value: &str) -> bool {
    value.len() == 32
        && value
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A population id: 32 lowercase hex digits (a content hash).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PopulationId(String);

/// `InvalidArgument` unless `id` is a population id.
fn check_population_id(id: &str) -> Result<()> {
    if is_hex_id(id) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "population id {id:?} is malformed; a population id is 32 lowercase hex digits"
        )))
    }
}

impl TryFrom<String> for PopulationId {
    type Error = Error;

    fn try_from(value: String) -> Result<Self> {
        check_population_id(&value)?;
        Ok(PopulationId(value))
    }
}

impl From<PopulationId> for String {
    fn from(value: PopulationId) -> String {
        value.0
    }
}

impl PopulationId {
    pub fn parse(value: &str) -> Result<Self> {
        Self::try_from(value.to_string())
    }

    /// The id of content whose xxh3-128 is `hash`.
    pub fn of_hash(hash: u128) -> Self {
        PopulationId(format!("{hash:032x}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PopulationId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A run id: 32 lowercase hex digits, drawn when a run starts and kept by every
/// resume of it (fencing knows a run by it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

impl TryFrom<String> for RunId {
    type Error = Error;

    fn try_from(value: String) -> Result<Self> {
        if is_hex_id(&value) {
            Ok(RunId(value))
        } else {
            Err(Error::invalid(format!(
                "run id {value:?} is malformed; a run id is 32 lowercase hex digits"
            )))
        }
    }
}

impl From<RunId> for String {
    fn from(value: RunId) -> String {
        value.0
    }
}

impl RunId {
    /// A new id, unique across processes and machines (a hash of this
    /// process's random nonce, a counter and the time).
    pub fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let seed = format!("{}-{nanos}", unique_suffix());
        RunId(format!("{:032x}", xxh3_128(seed.as_bytes())))
    }

    /// The id of a run known only by what it is (`bytes`): the same bytes
    /// give the same id on every machine (a state saved before run ids).
    pub fn derived(bytes: &[u8]) -> Self {
        RunId(format!("{:032x}", xxh3_128(bytes)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for RunId {
    fn default() -> Self {
        Self::new()
    }
}

/// A name part no other writer uses: the process id (for people reading a
/// listing), a random number fixed for this process (writers in containers
/// share pid 1) and a counter.
pub fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{:016x}-{}",
        std::process::id(),
        process_nonce(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A random number fixed for the life of this process (std's hasher keys are
/// drawn from the OS's random source).
fn process_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NONCE.get_or_init(|| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(std::process::id() as u64);
        hasher.finish()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_one_rule() {
        let good = "0123456789abcdef0123456789abcdef";
        assert!(PopulationId::parse(good).is_ok());
        assert!(RunId::try_from(good.to_string()).is_ok());
        for bad in [
            "",
            "0123",
            &good.to_uppercase(),
            &format!("{good}0"),
            "../../etc/passwd",
        ] {
            assert!(PopulationId::parse(bad).is_err(), "{bad}");
            assert!(RunId::try_from(bad.to_string()).is_err(), "{bad}");
        }
        assert_ne!(RunId::new(), RunId::new());
        assert_ne!(unique_suffix(), unique_suffix());
    }
}
