//! JSON values to and from Python objects, for the wire contracts the
//! bindings expose (stream requests, loader states): one conversion each way.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// `object` with keyword arguments `keys` set, as a contract's JSON keys (a
/// `None` value removes its key: its default applies).
pub(super) fn with_keywords(
    mut object: Map<String, Value>,
    keys: Option<&Bound<'_, PyDict>>,
) -> Result<Map<String, Value>, String> {
    for (key, value) in keys.into_iter().flat_map(|keys| keys.iter()) {
        let key: String = key
            .extract()
            .map_err(|_| "has a key that is not a string".to_string())?;
        if value.is_none() {
            object.remove(&key);
        } else {
            let value = to_json(&value).map_err(|detail| format!("'{key}' {detail}"))?;
            object.insert(key, value);
        }
    }
    Ok(object)
}

/// A Python value as JSON (the types the protocol's keys take).
pub(super) fn to_json(value: &Bound<'_, PyAny>) -> Result<Value, String> {
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if value.cast::<PyInt>().is_ok() {
        if let Ok(n) = value.extract::<u64>() {
            return Ok(Value::Number(n.into()));
        }
        if let Ok(n) = value.extract::<i64>() {
            return Ok(Value::Number(n.into()));
        }
        return Err("is an integer outside the 64-bit range".into());
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Number::from_f64(f.value())
            .map(Value::Number)
            .ok_or_else(|| "must be a finite number".into());
    }
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(Value::String(s.to_string()));
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        let mut object = Map::new();
        for (key, item) in dict.iter() {
            let key: String = key
                .extract()
                .map_err(|_| "has a key that is not a string".to_string())?;
            let item = to_json(&item).map_err(|detail| format!("'{key}' {detail}"))?;
            object.insert(key, item);
        }
        return Ok(Value::Object(object));
    }
    if value.cast::<PyList>().is_ok() || value.cast::<PyTuple>().is_ok() {
        let mut items = Vec::new();
        for item in value.try_iter().map_err(|e| e.to_string())? {
            items.push(to_json(&item.map_err(|e| e.to_string())?)?);
        }
        return Ok(Value::Array(items));
    }
    Err(format!(
        "has an unsupported type {}",
        value
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default()
    ))
}

/// JSON as Python objects (dicts, lists, ints, strings, booleans, None).
pub(super) fn to_python(py: Python<'_>, value: &Value) -> PyResult<Py<PyAny>> {
    Ok(match value {
        Value::Null => py.None(),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        Value::Number(n) => match n.as_u64() {
            Some(u) => u.into_pyobject(py)?.into_any().unbind(),
            None => n
                .as_f64()
                .unwrap_or(f64::NAN)
                .into_pyobject(py)?
                .into_any()
                .unbind(),
        },
        Value::String(s) => s.into_pyobject(py)?.into_any().unbind(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_python(py, item)?)?;
            }
            list.into_any().unbind()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (key, item) in map {
                dict.set_item(key, to_python(py, item)?)?;
            }
            dict.into_any().unbind()
        }
    })
}
