//! One descriptor's answer, read as Envoy's `DescriptorStatus` reads it: over or not,
//! the limit it answered under (`current_limit`), what is left and until when, and the
//! rule's metadata when it passed. The door only copies these into its message.

use std::sync::Arc;
use std::time::Duration;

use swin_core::Decision;

use crate::policy::limits::KeyLimits;
use crate::policy::rules::{unit_of, Rule, RuleLimit};
use crate::runtime_limits::RuntimeLimit;

/// What one descriptor shows.
#[derive(Debug, Clone)]
pub(crate) enum Shown {
    /// No rule applies: OK, no limit.
    NoRule,
    /// Its rule sets no limit of hits: OK, the largest remaining.
    Unlimited,
    /// Decided under its rule: the decision it shows and whether it denies the request;
    /// `runtime` when a runtime limit on its key replaced the rule's limits.
    Decided {
        decision: Decision,
        denied: bool,
        runtime: Option<Arc<RuntimeLimit>>,
    },
    /// Slots of a concurrency key: whether it is OK, its limit in flight, the slots
    /// left, and until a slot is sure to be free (or the lease lapses).
    Slots {
        ok: bool,
        limit: u64,
        remaining: u64,
        until: Duration,
    },
}

/// A descriptor's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The rule that applied (none: no rule matched, or another matched rule replaced
    /// it).
    pub(crate) rule: Option<Arc<Rule>>,
    /// What it shows.
    pub(crate) shown: Shown,
}

impl Answer {
    /// Whether the descriptor is over its limit (Envoy's `OVER_LIMIT`; a rule in shadow
    /// never is).
    pub fn over(&self) -> bool {
        match &self.shown {
            Shown::Decided { denied, .. } => *denied,
            Shown::Slots { ok, .. } => !ok,
            Shown::NoRule | Shown::Unlimited => false,
        }
    }

    /// The limit it answered under, as Envoy's `current_limit` has it: the rule's name
    /// (empty without one), requests per unit and the unit as `RateLimit.Unit` numbers
    /// it (0, UNKNOWN, for a window of no Envoy unit, and for slots: in flight, not per
    /// a unit of time). A runtime limit that replaced the rule's shows its first window
    /// (a bucket: its count per period). None without a rule, or for an unlimited one.
    pub fn limit(&self) -> Option<(&str, u32, i32)> {
        fn name(r: &Rule) -> &str {
            r.name.as_deref().unwrap_or_default()
        }
        match (&self.shown, self.rule.as_deref()) {
            (Shown::Slots { limit, .. }, rule) => Some((
                rule.map_or("", name),
                u32::try_from(*limit).unwrap_or(u32::MAX),
                0,
            )),
            (Shown::Decided { runtime, .. }, Some(rule)) => {
                let (per_unit, unit) = match runtime.as_deref().map(|r| &r.limits) {
                    None => (rule.requests_per_unit, rule.unit),
                    Some(KeyLimits::Windows(w)) => match w.limits().first() {
                        Some(first) => (
                            first.limit.min(f64::from(u32::MAX)) as u32,
                            unit_of(u64::from(first.window.secs())),
                        ),
                        None => (rule.requests_per_unit, rule.unit),
                    },
                    Some(KeyLimits::Gcra(g)) => (
                        g.count().clamp(0, i64::from(u32::MAX)) as u32,
                        unit_of(g.period().as_secs()),
                    ),
                };
                Some((name(rule), per_unit, unit))
            }
            _ => None,
        }
    }

    /// What is left under the limit (Envoy's `limit_remaining`): the most a `u32` holds
    /// under an unlimited rule, 0 without a rule.
    pub fn remaining(&self) -> u32 {
        match (&self.shown, self.rule.is_some()) {
            (Shown::Slots { remaining, .. }, _) => u32::try_from(*remaining).unwrap_or(u32::MAX),
            (Shown::Decided { decision, .. }, true) => {
                decision.remaining.clamp(0.0, f64::from(u32::MAX)) as u32
            }
            (Shown::Unlimited, true) => u32::MAX,
            _ => 0,
        }
    }

    /// Until the limit resets (Envoy's `duration_until_reset`; slots: until one is sure
    /// to be free). None when it answered under no limit.
    pub fn reset_after(&self) -> Option<Duration> {
        match (&self.shown, self.rule.is_some()) {
            (Shown::Slots { until, .. }, _) => Some(*until),
            (Shown::Decided { decision, .. }, true) => Some(decision.reset_after),
            _ => None,
        }
    }

    /// The rule's `metadata` when the descriptor passed, for the answer's dynamic
    /// metadata: not over, under a rule that limits (envoyproxy/ratelimit does not count
    /// an unlimited rule's descriptor as passed).
    pub fn metadata(&self) -> Option<&serde_json::Map<String, serde_json::Value>> {
        let rule = self.rule.as_deref()?;
        if self.over() || rule.limit == RuleLimit::Unlimited {
            return None;
        }
        rule.metadata.as_deref()
    }
}
