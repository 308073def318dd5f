//! What a request may carry: keys, values and costs, checked before anything is
//! counted.

use crate::error::Error;

/// The longest key, in bytes (400 past it).
pub(crate) const MAX_KEY_BYTES: usize = 1024;

/// Keys are UTF-8 (the path extractor checked that) of 1 to 1024 (`MAX_KEY_BYTES`) bytes
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

/// A batch's size: 1 to `max` items (`max_batch`); `list` names the batch's list in its
/// body. An empty batch is refused like an oversized one: it would answer nothing, and
/// an idempotency key on it would record nothing.
pub(crate) fn check_batch_size(list: &str, len: usize, max: usize) -> Result<(), Error> {
    if len == 0 || len > max {
        return Err(Error::BadRequest(format!(
            "{list} must hold 1 to {max} items (max_batch), got {len}"
        )));
    }
    Ok(())
}

/// `v` with a negative zero made 0: a cost a client sent as `-0.0` is 0 wherever it is
/// kept or shown again (JSON would echo `-0.0`).
pub(crate) fn unsigned_zero(v: f64) -> f64 {
    if v == 0.0 {
        0.0
    } else {
        v
    }
}

/// The value of an increment (1 when absent): finite, within ±2^53, and not negative
/// unless the namespace allows decrements.
pub(crate) fn check_increment(
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
