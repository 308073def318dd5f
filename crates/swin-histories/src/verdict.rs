//! What the checks give and take: a broken promise ([`Violation`]), what a run's checks
//! found ([`Report`]) and what they need besides the history ([`Expect`]).

use std::collections::BTreeMap;

use crate::accounting::Key;
use crate::history::Event;

/// One broken promise.
#[derive(Debug, Clone, PartialEq)]
pub struct Violation {
    /// `exactly-once`, `bounds`, `leases`, `answers`, `idempotency` or `clean-stop`.
    pub check: &'static str,
    /// `namespace/key`, or what else it is about (a node).
    pub key: String,
    pub what: String,
    /// The operations involved.
    pub ops: Vec<u64>,
}

/// What the checks found, and how many were made.
#[derive(Debug, Default)]
pub struct Report {
    pub checks: usize,
    pub violations: Vec<Violation>,
}

/// What the checks need besides the history.
#[derive(Debug, Clone)]
pub struct Expect {
    /// Each key's count in the store after the nodes stopped, all windows.
    pub store: BTreeMap<Key, f64>,
    /// The limit of each namespace whose admission is strict (checked for bounds).
    pub strict_limits: BTreeMap<String, f64>,
    /// The nemesis's faults.
    pub events: Vec<Event>,
    /// The namespaces' sync period in ms (0: synchronous).
    pub sync_ms: u64,
}

/// How long after a node's last successful sync its pushes may still be outstanding
/// besides the sync period: a store call's `store_timeout`.
pub const PUSH_MS: u64 = 1000;
