//! Descriptors on a namespace of hits: each is counted on its counter key like a hit,
//! or gives its hits back (`is_negative_hits`, as a refund). One request, one
//! pipeline run: the keys are first-touched in one read, each cost is checked against
//! the key's effective limits (a cost they cannot take blocks its descriptor), the
//! descriptors are taken together, and a request over the limit counts nothing on any
//! descriptor (unless the namespace counts denied hits).

use std::sync::Arc;

use swin_core::Decision;

use super::{blocked, Answer, Decided, Descriptor, Shown, Strictest};
use crate::decisions::Verdict;
use crate::error::Error;
use crate::pipeline::{Asked, Back, Given, Plan, Ran, Refusal, Take, Taken};
use crate::policy::algorithm::Algorithm;
use crate::policy::keys;
use crate::policy::rules::{self, Found, Rule, RuleLimit};
use crate::runtime_limits::{Effective, RuntimeLimit};
use crate::state::Namespace;

/// What one descriptor does in its request.
pub(super) enum Part {
    /// Answers without counting, and whether that denies the request.
    Shown(Shown, bool),
    /// Counts a hit (or gives one back) on its counter key under its rule.
    Counts {
        rule: Arc<Rule>,
        key: String,
        cost: f64,
        negative: bool,
    },
}

/// Each descriptor's rule (for the answer) and what it does: found for every
/// descriptor before any is counted.
pub(super) fn parts(ns: &Namespace, asks: &[Descriptor<'_>]) -> Vec<(Option<Arc<Rule>>, Part)> {
    rules_of(ns, asks)
        .into_iter()
        .zip(asks)
        .map(|(f, a)| (f.as_ref().map(|f| f.rule.clone()), part(a, f.as_ref())))
        .collect()
}

fn part(a: &Descriptor, f: Option<&Found>) -> Part {
    let Some(f) = f else {
        return Part::Shown(Shown::NoRule, false);
    };
    let rule = &f.rule;
    let blocked_unless_shadow = || {
        let denied = !rule.shadow;
        Part::Shown(
            Shown::Decided {
                decision: blocked(),
                denied,
                runtime: None,
            },
            denied,
        )
    };
    match &rule.limit {
        RuleLimit::Limited(_) => {}
        // envoyproxy/ratelimit: OK, the largest remaining, no limit (slots in flight are
        // a concurrency namespace's, which leases decide)
        RuleLimit::Unlimited | RuleLimit::InFlight(_) => {
            return Part::Shown(Shown::Unlimited, false)
        }
        // a refund on a value that is blocked gives nothing back and is OK
        RuleLimit::Blocked if a.negative => {
            return Part::Shown(
                Shown::Decided {
                    decision: blocked(),
                    denied: false,
                    runtime: None,
                },
                false,
            )
        }
        RuleLimit::Blocked => return blocked_unless_shadow(),
    };
    let cost = a.hits as f64;
    if swin_core::check_cost(cost).is_err() && !a.negative {
        // more hits at once than any limit holds: over it, nothing counted (the key's
        // own limits, runtime ones among them, are checked after its touch)
        return blocked_unless_shadow();
    }
    let entries = a.pairs();
    let key = if f.shared.is_empty() {
        keys::counter_key(entries)
    } else {
        keys::counter_key(&f.counted(entries))
    };
    Part::Counts {
        rule: rule.clone(),
        key,
        cost,
        negative: a.negative,
    }
}

/// `count_denied`: the namespace's (its rules carry it; without rules, its limits).
fn count_denied(ns: &Namespace) -> bool {
    match &ns.rules {
        Some(r) => r.count_denied(),
        None => ns.limits.as_ref().is_some_and(|l| l.count_denied),
    }
}

/// The plan of a request of descriptors on namespace `ns` (one that limits hits).
pub(super) fn plan<'r>(ns: &'r Namespace, parts: &'r [(Option<Arc<Rule>>, Part)]) -> Plan<'r> {
    let mut plan = Plan {
        refusal: if count_denied(ns) {
            Refusal::Each
        } else {
            Refusal::Whole
        },
        block_bad_costs: true,
        fail_degraded: true,
        ..Plan::nothing()
    };
    for (_, p) in parts {
        match p {
            Part::Shown(_, denied) => plan.refused |= denied,
            Part::Counts {
                rule,
                key,
                cost,
                negative,
            } => {
                let RuleLimit::Limited(limits) = &rule.limit else {
                    continue;
                };
                let mut take = Take::under(
                    ns,
                    key.as_str(),
                    *cost,
                    Effective::Config(limits),
                    rule.shadow,
                );
                take.count_denied = plan.refusal == Refusal::Each;
                take.policy = rule.name.as_deref().map(Arc::from);
                match negative {
                    true => plan.refunds.push(Back::Hits(take)),
                    false => plan.asks.push(Asked::Hit(take)),
                }
            }
        }
    }
    plan
}

/// What the request decided, each descriptor's answer in order.
pub(super) fn answer(
    parts: &[(Option<Arc<Rule>>, Part)],
    plan: Plan<'_>,
    ran: Ran<()>,
) -> Result<Decided, Error> {
    let count_denied = plan.refusal == Refusal::Each;
    let over = ran.refused;
    let undone = over && !count_denied;
    let (mut takes, mut refunds) = (
        plan.asks.iter().zip(ran.taken),
        plan.refunds.iter().zip(ran.refunded),
    );
    let mut answers = Vec::with_capacity(parts.len());
    let mut worst: Option<(Verdict, bool)> = None;
    for (rule, p) in parts {
        let rule = rule.clone();
        let shown = match p {
            Part::Shown(shown, _) => shown.clone(),
            Part::Counts { negative: true, .. } => match refunds.next() {
                Some((Back::Hits(t), Given::Hits(_, after))) => shown_of(t, after.decision, false),
                _ => return Err(Error::Internal),
            },
            Part::Counts { rule: r, .. } => match takes.next() {
                Some((Asked::Hit(t), None)) => shown_of(t, blocked(), !r.shadow),
                Some((Asked::Hit(t), Some(Taken::Hit(v)))) => {
                    let denied = !v.decision.allowed && !r.shadow;
                    let shown = if undone && v.allowed() {
                        // nothing of the request counted: a descriptor within its limit
                        // shows what it had before it (envoyproxy/ratelimit's
                        // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT)
                        v.given_back(t.cost).decision
                    } else if count_denied && !v.decision.allowed {
                        // the denied hit was counted too: nothing is left, as
                        // envoyproxy/ratelimit answers
                        Decision {
                            remaining: 0.0,
                            ..v.decision
                        }
                    } else {
                        v.decision
                    };
                    if worst
                        .as_ref()
                        .is_none_or(|(w, _)| v.decision.cmp_strictness(&w.decision).is_ge())
                    {
                        worst = Some((v.clone(), denied));
                    }
                    shown_of(t, shown, denied)
                }
                _ => return Err(Error::Internal),
            },
        };
        answers.push(Answer { rule, shown });
    }
    Ok(Decided {
        answers,
        over,
        strictest: worst.map(|(v, denied)| Strictest::Hits(v, denied)),
        envoy_headers: false,
        envoy_metadata: false,
    })
}

/// A counted descriptor's answer: `runtime` when a runtime limit on its key replaced
/// the rule's limits.
fn shown_of(t: &Take<'_>, decision: Decision, denied: bool) -> Shown {
    let runtime: Option<Arc<RuntimeLimit>> = match &t.limits {
        Effective::Runtime(r) => Some(r.clone()),
        Effective::Config(_) => None,
    };
    Shown::Decided {
        decision,
        denied,
        runtime,
    }
}

/// Each descriptor's rule: its own override, else the tree's; found for every
/// descriptor before any is counted.
fn rules_of(ns: &Namespace, asks: &[Descriptor<'_>]) -> Vec<Option<Found>> {
    let algorithm = match (&ns.rules, &ns.limits) {
        (Some(r), _) => r.algorithm(),
        (None, Some(l)) => l.algorithm(),
        (None, None) => Algorithm::default(),
    };
    let mut found: Vec<Option<Found>> = asks
        .iter()
        .enumerate()
        .map(|(i, a)| match override_rule(a, i, algorithm) {
            Some(r) => Some(Found {
                rule: Arc::new(r),
                shared: Vec::new(),
            }),
            None => ns.rules.as_ref().and_then(|r| r.lookup(a.pairs())),
        })
        .collect();
    // a rule named in another matched rule's `replaces` does not apply
    let replaced: Vec<String> = found
        .iter()
        .flatten()
        .flat_map(|f| f.rule.replaces.iter().cloned())
        .collect();
    for f in &mut found {
        if f.as_ref()
            .is_some_and(|f| f.rule.name.as_ref().is_some_and(|n| replaced.contains(n)))
        {
            *f = None;
        }
    }
    found
}

/// The rule a descriptor's own limit sets for this request (its requests per unit,
/// under the namespace's algorithm). An override the algorithm cannot hold blocks that
/// descriptor instead of failing the request: an error would let Envoy's default
/// `failure_mode_deny: false` through, past the limits of the other descriptors.
fn override_rule(a: &Descriptor, i: usize, algorithm: Algorithm) -> Option<Rule> {
    let (requests_per_unit, unit) = a.limit?;
    let limit = match rules::unit_secs(unit) {
        // 0 per unit blocks, as a rule's requests_per_unit: 0 does
        Some(_) if requests_per_unit == 0 => RuleLimit::Blocked,
        Some(secs) => match rules::limit_for(f64::from(requests_per_unit), secs, algorithm) {
            Ok(l) => RuleLimit::Limited(l),
            Err(e) => {
                tracing::warn!(descriptor = i, cause = %e, "a descriptor's limit cannot be held: blocked");
                RuleLimit::Blocked
            }
        },
        None => RuleLimit::Blocked, // the door refuses such a unit
    };
    Some(Rule {
        path: String::new(),
        limit,
        shadow: false,
        name: None,
        replaces: Vec::new(),
        requests_per_unit,
        unit,
        metadata: None,
    })
}
