//! Errors of the counting core; each variant is something a caller can act on.

/// What went wrong with a counting call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CoreError {
    #[error("value must be a finite number, got {0}")]
    NonFiniteValue(f64),
    /// A value, or the count it would make, beyond ±[`crate::MAX_COUNT`]: past 2^53 a
    /// store's double no longer holds every integer, and sums can overflow.
    #[error("value {value} would take a count past ±{max} (2^53); nothing was counted")]
    CountOutOfRange { value: f64, max: f64 },
    #[error("window size must be between 1 and {max} seconds, got {got}")]
    InvalidWindowSize { got: u64, max: u32 },
    #[error("namespace {namespace:?} has no window size {window_size}")]
    UnknownWindowSize { namespace: String, window_size: u32 },
    #[error("invalid limit: {0}")]
    InvalidLimit(String),
    /// A cost outside what the limit deciding it can take: a window's limit, a
    /// bucket's burst (whole units), or 2^53 before any limit is known.
    #[error("cost must be {what} from 0 to {max}, got {cost}")]
    InvalidCost {
        cost: f64,
        max: f64,
        what: &'static str,
    },
    #[error(
        "counter table of namespace {namespace:?} is full ({max} counters, all with unsynced hits)"
    )]
    CapacityExceeded { namespace: String, max: usize },
    #[error(
        "GCRA table of namespace {namespace:?} is full ({max} buckets, all with spends not yet pushed to the store)"
    )]
    BucketsFull { namespace: String, max: usize },
}
