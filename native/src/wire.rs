//! What every wire contract (a request, a loader state, a claim) needs of
//! serde: deserializing a JSON value with the failing key named in the
//! protocol's words. Ground floor: it knows no contract.

use serde_json::Value;

use crate::error::{Error, Result};

/// Deserialize with the failing key named: "'seed': invalid type: ...".
pub(crate) fn deserialize<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        // serde quotes names with backticks and names Rust types; the protocol's
        // messages use 'key' and say what JSON value would be valid.
        let inner = error
            .inner()
            .to_string()
            .replace('`', "'")
            .replace("a nonzero u64", "an integer >= 1 (below 2**64)")
            .replace("expected u64", "expected an integer >= 0 (below 2**64)");
        match path.split_once('[') {
            _ if path == "." => Error::invalid(format!("{inner} in the {what}")),
            Some((key, item)) => Error::invalid(format!(
                "'{key}' in the {what}: item {}: {inner}",
                item.trim_end_matches(']')
            )),
            None => Error::invalid(format!("'{path}' in the {what}: {inner}")),
        }
    })
}
