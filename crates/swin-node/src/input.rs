//! What a request may carry: keys, values and costs, checked before anything is
//! counted.

use crate::error::Error;
use crate::state::Namespace;

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
pub fn check_value(v: Option<f64>, ns: &Namespace) -> Result<f64, Error> {
    let v = v.unwrap_or(1.0);
    swin_core::check_value(v)?;
    if v < 0.0 && !ns.allow_decrements {
        return Err(Error::InvalidValue(format!(
            "value must not be negative, got {v} (namespace {:?} does not set allow_decrements)",
            ns.sync.name()
        )));
    }
    Ok(v)
}

pub fn gcra_cost(cost: f64) -> Result<i64, Error> {
    if !(cost.is_finite() && cost >= 0.0 && cost.fract() == 0.0 && cost <= 1e15) {
        return Err(Error::BadRequest(format!(
            "cost must be a whole number of at least 0 for a gcra limit, got {cost}"
        )));
    }
    Ok(cost as i64)
}

pub fn check_cost(cost: f64) -> Result<(), Error> {
    if !(cost.is_finite() && (0.0..=swin_core::MAX_COUNT).contains(&cost)) {
        return Err(Error::BadRequest(format!(
            "cost must be a number from 0 to 2^53, got {cost}"
        )));
    }
    Ok(())
}
