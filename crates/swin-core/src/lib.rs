//! Sliding-window counting for swin, with no I/O: window math, the lock-free counter
//! table a node keeps in local memory, and the types the sync engine moves around.
//!
//! Time is always an argument ([`UnixMs`]); nothing here reads a clock, so every
//! property can be tested without sleeping.

mod buckets;
mod cell;
mod decision;
mod drain;
mod entry;
mod error;
pub mod fair;
mod gcra;
mod grant;
mod hold;
#[cfg(all(test, swin_loom))]
mod loom_models;
mod namespace;
mod sync;
mod table;
mod time;
pub mod top;
mod window;
mod window_limit;

pub use buckets::{Advance, BucketTable, Tat};
pub use compact_str::CompactString;
pub use decision::{check_cost, Decision};
pub use drain::DrainSlices;
pub use entry::Retention;
pub use error::CoreError;
pub use gcra::{Gcra, GcraOutcome};
pub use grant::{settle_grant, GrantRequest, GrantSettled, GrantState};
pub use hold::{settle_hold, HoldRequest, HoldState, HOLD_SHARE};
pub use namespace::NamespaceCounters;
pub use table::{check_value, CounterOptions, WindowTable};
pub use time::UnixMs;
pub use window::{sliding_rate, WindowRate, WindowSize, MAX_WINDOW_SIZE_SECS};
pub use window_limit::{WindowAlgorithm, WindowLimit};

/// The largest count a window may hold, either sign: 2^53, up to which a double (the
/// stores' count type) holds every integer exactly, and far enough from `f64::MAX` that
/// no sum of pushes can overflow a store's column.
pub const MAX_COUNT: f64 = 9_007_199_254_740_992.0;

/// Counters a table holds (per namespace and window size) unless told otherwise; the
/// node's config uses the same default.
pub const DEFAULT_MAX_COUNTERS: usize = 1_000_000;

/// A diff drained from the table: local hits on one key's window not yet in a store.
#[derive(Debug, Clone, PartialEq)]
pub struct Diff {
    pub key: CompactString,
    pub window_size: u32,
    /// Start of the window, Unix seconds.
    pub window_start: i64,
    pub value: f64,
}

/// A cluster total read from a store for one key's window.
#[derive(Debug, Clone, PartialEq)]
pub struct Total {
    pub key: CompactString,
    pub window_size: u32,
    /// Start of the window, Unix seconds.
    pub window_start: i64,
    pub count: f64,
}
