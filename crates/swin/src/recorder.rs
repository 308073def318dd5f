//! What the pipeline tells about the requests it decides, for whatever keeps count — the
//! daemon's `/metrics`, or an embedding program's own metrics. The pipeline records each
//! outcome once, where the request ends (after all or nothing), so that every door
//! counts the same way; a door records only what is its own (its requests, their
//! status and duration, its connections).
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//!
//! #[derive(Debug, Default)]
//! struct Denials(AtomicU64);
//!
//! impl swin::recorder::Recorder for Denials {
//!     fn decision(&self, _namespace: &str, _policy: &str, allowed: bool, _shadow: bool) {
//!         if !allowed {
//!             self.0.fetch_add(1, Ordering::Relaxed);
//!         }
//!     }
//! }
//! ```

/// Receives the outcomes the pipeline records. Every method does nothing unless
/// implemented; each is called on the request's task, so it should not block.
pub trait Recorder: Send + Sync + std::fmt::Debug {
    /// A hit decided in `namespace` by `policy` (the name of the limit that decided —
    /// `60s`, `gcra` — or of the descriptor rule: labels that do not grow with keys);
    /// `shadow_denied`: allowed only because what would deny it is in shadow.
    fn decision(&self, namespace: &str, policy: &str, allowed: bool, shadow_denied: bool) {
        let _ = (namespace, policy, allowed, shadow_denied);
    }

    /// `n` increments counted in `namespace`.
    fn increments(&self, namespace: &str, n: u64) {
        let _ = (namespace, n);
    }

    /// A lease call: `acquired`, `denied`, `released`, `renewed`, or `not_live` (a
    /// release or renewal of a lease released, lapsed or never granted).
    fn lease(&self, namespace: &str, outcome: &'static str) {
        let _ = (namespace, outcome);
    }

    /// A reserve, extend or commit: `reserved`, `denied`, `extended`, `extend_denied`,
    /// `committed`, `replayed` (a commit of a reservation committed already at the same cost, answered how it was settled), or `not_open` (a commit of a reservation committed already, lapsed
    /// or never made).
    fn reservation(&self, namespace: &str, outcome: &'static str) {
        let _ = (namespace, outcome);
    }

    /// Cost through reservations: `reserved` (estimates spent, on each key),
    /// `extended` (added by extends, on each key), `charged` (beyond the total),
    /// `given_back`, `uncharged` (beyond the total, past the limit: `overrun = "cap"`).
    fn reservation_cost(&self, namespace: &str, part: &'static str, cost: f64) {
        let _ = (namespace, part, cost);
    }

    /// A runtime limit `set` or `deleted` in `namespace`.
    fn limit_change(&self, namespace: &str, change: &'static str) {
        let _ = (namespace, change);
    }
}

/// Records nothing (a namespace nobody counts for).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NoRecorder;

impl Recorder for NoRecorder {}
