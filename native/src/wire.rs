//! What every wire contract (a request, a loader state, a claim) needs of
//! serde: deserializing a JSON value with the failing key named in the
//! protocol's words. Ground floor: it knows no contract.

use serde_json::Value;

use crate::error::{Error, Result};

/// Largest command, ticket or action body accepted, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

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

/// UTF-8 JSON holding an object, at most `MAX_MESSAGE_BYTES`.
pub(crate) fn decode(raw: &[u8], what: &str) -> Result<Value> {
    if raw.len() > MAX_MESSAGE_BYTES {
        return Err(Error::invalid(format!(
            "the {what} is {} bytes; at most {MAX_MESSAGE_BYTES} allowed",
            raw.len()
        )));
    }
    let text = std::str::from_utf8(raw)
        .map_err(|e| Error::invalid(format!("the {what} is not UTF-8 JSON: {e}")))?;
    let value: Value = serde_json::from_str(text)
        .map_err(|e| Error::invalid(format!("the {what} is not UTF-8 JSON: {e}")))?;
    if !value.is_object() {
        return Err(Error::invalid(format!(
            "the {what} must be a JSON object, got {}",
            json_kind(&value)
        )));
    }
    Ok(value)
}

/// The kind of a JSON value, as Python names it (clients are mostly Python).
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}
