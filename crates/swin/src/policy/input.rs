//! What a request may carry: keys, values and costs, checked before anything is
//! counted.

use crate::error::Error;

/// The longest key, in bytes (400 past it).
pub const MAX_KEY_BYTES: usize = 1024;

/// Keys are UTF-8 (the path extractor checked that) of 1 to [`MAX_KEY_BYTES`] bytes
/// without U+0000, which PostgreSQL's `text` cannot hold.
pub fn check_key(key: &str) -> Result<(), Error> {
    if key.contains('\0') {
        return Err(Error::InvalidKey("key must not contain U+0000".into()));
    }
    if key.is_empty() {
        return Err(Error::InvalidKey("key must not be empty".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::InvalidKey(format!(
            "key is {} bytes; the limit is {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    Ok(())
}

/// The value of an increment (1 when absent): finite, within ±2^53, and not negative
/// unless the namespace allows decrements.
pub fn check_increment(
    v: Option<f64>,
    allow_decrements: bool,
    namespace: &str,
) -> Result<f64, Error> {
    let v = v.unwrap_or(1.0);
    swin_core::check_value(v)?;
    if v < 0.0 && !allow_decrements {
        return Err(Error::InvalidValue(format!(
            "value must not be negative, got {v} (namespace {namespace:?} does not set allow_decrements)"
        )));
    }
    Ok(v)
}
