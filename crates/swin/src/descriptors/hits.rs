//! Descriptors on a namespace of hits: each is counted on its counter key like a hit,
//! or gives its hits back (`is_negative_hits`, as a refund). One request, one
//! admission: the keys are first-touched in one read, each cost is checked against the
//! key's effective limits, the descriptors are taken together, and a request over the
//! limit counts nothing on any descriptor (unless the namespace counts denied hits).

use std::sync::Arc;

use swin_core::Decision;

use super::{blocked, Answer, Counted, Decided, Descriptor, Shown, Strictest};
use crate::decisions::Verdict;
use crate::error::Error;
use crate::pipeline::{take_all, touch_takes, undo_admitted, Take};
use crate::policy::algorithm::Algorithm;
use crate::policy::keys;
use crate::policy::rules::{self, Found, Rule, RuleLimit};
use crate::runtime_limits::{Effective, RuntimeLimit};
use crate::state::Namespace;

/// A descriptor that counts: its index, its rule, and its take of the request
/// pipeline (its counter key, cost and, after the first touch, the key's effective
/// limits).
struct Counter<'r> {
    at: usize,
    rule: &'r Arc<Rule>,
    take: Take<'r>,
}

impl Counter<'_> {
    fn runtime(&self) -> Option<Arc<RuntimeLimit>> {
        match &self.take.limits {
            Effective::Runtime(r) => Some(r.clone()),
            Effective::Config(_) => None,
        }
    }

    fn shown(&self, decision: Decision, denied: bool) -> Shown {
        Shown::Decided {
            decision,
            denied,
            runtime: self.runtime(),
        }
    }
}

/// Decides the descriptors `asks` on namespace `ns` (one that limits hits) as one
/// request. An error is a store the request needed and could not use (then nothing of
/// it is counted).
pub(super) async fn decide(ns: &Namespace, asks: &[Descriptor<'_>]) -> Result<Decided, Error> {
    let found = rules_of(ns, asks);
    let mut plan = Plan::new(ns, asks, &found);
    // one read for every key this node holds nothing for
    touch_takes(
        plan.takes.iter().chain(&plan.refunds).map(|c| &c.take),
        true,
    )
    .await;
    plan.refund().await?;
    plan.check_costs();
    plan.take().await
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
            None => ns.rules.as_ref().and_then(|r| r.lookup(&a.entries)),
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
fn override_rule(a: &Descriptor<'_>, i: usize, algorithm: Algorithm) -> Option<Rule> {
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

/// A request on its way: each descriptor's answer so far, and what it takes or gives
/// back.
struct Plan<'r> {
    answers: Vec<Answer>,
    /// `None`: decided by a take or refund below.
    shown: Vec<Option<Shown>>,
    takes: Vec<Counter<'r>>,
    refunds: Vec<Counter<'r>>,
    over: bool,
    /// `count_denied`: the namespace's (its rules carry it; without rules, its limits).
    count_denied: bool,
}

impl<'r> Plan<'r> {
    /// What each descriptor answers without counting, or the hit it takes or gives back.
    fn new(ns: &'r Namespace, asks: &[Descriptor<'_>], found: &'r [Option<Found>]) -> Plan<'r> {
        let mut plan = Plan {
            answers: Vec::with_capacity(asks.len()),
            shown: Vec::with_capacity(asks.len()),
            takes: Vec::new(),
            refunds: Vec::new(),
            over: false,
            count_denied: match &ns.rules {
                Some(r) => r.count_denied(),
                None => ns.limits.as_ref().is_some_and(|l| l.count_denied),
            },
        };
        for (i, (a, f)) in asks.iter().zip(found).enumerate() {
            plan.answers.push(Answer {
                rule: f.as_ref().map(|f| f.rule.clone()),
                shown: Shown::NoRule,
            });
            let shown = match f {
                None => Some(Shown::NoRule),
                Some(f) => plan.plan_one(ns, i, a, f),
            };
            plan.shown.push(shown);
        }
        plan
    }

    fn plan_one(
        &mut self,
        ns: &'r Namespace,
        at: usize,
        a: &Descriptor<'_>,
        f: &'r Found,
    ) -> Option<Shown> {
        let rule = &f.rule;
        let mut blocked_unless_shadow = || {
            let denied = !rule.shadow;
            self.over |= denied;
            Some(Shown::Decided {
                decision: blocked(),
                denied,
                runtime: None,
            })
        };
        let limits = match &rule.limit {
            RuleLimit::Limited(l) => l,
            // envoyproxy/ratelimit: OK, the largest remaining, no limit (slots in flight
            // are a concurrency namespace's, which leases decide)
            RuleLimit::Unlimited | RuleLimit::InFlight(_) => return Some(Shown::Unlimited),
            // a refund on a value that is blocked gives nothing back and is OK
            RuleLimit::Blocked if a.negative => {
                return Some(Shown::Decided {
                    decision: blocked(),
                    denied: false,
                    runtime: None,
                })
            }
            RuleLimit::Blocked => return blocked_unless_shadow(),
        };
        let cost = a.hits as f64;
        if swin_core::check_cost(cost).is_err() && !a.negative {
            // more hits at once than any limit holds: over it, nothing counted (the
            // key's own limits, runtime ones among them, are checked after its touch)
            return blocked_unless_shadow();
        }
        let key = if f.shared.is_empty() {
            keys::counter_key(&a.entries)
        } else {
            keys::counter_key(&f.counted(&a.entries))
        };
        let mut take = Take::under(ns, key, cost, Effective::Config(limits), rule.shadow);
        take.count_denied = self.count_denied;
        let t = Counter { at, rule, take };
        if a.negative {
            self.refunds.push(t);
        } else {
            self.takes.push(t);
        }
        None
    }

    /// Refunds first, each on its own (an end of one thing beside the start of
    /// another), under the key's effective limits.
    async fn refund(&mut self) -> Result<(), Error> {
        for t in &mut self.refunds {
            t.take.effective_limits();
        }
        let given =
            futures_util::future::join_all(self.refunds.iter().map(|t| t.take.refund())).await;
        for (t, after) in self.refunds.iter().zip(given) {
            self.shown[t.at] = Some(t.shown(after?.1.decision, false));
        }
        Ok(())
    }

    /// The runtime limits set on a descriptor's counter key replace its rule's; a cost
    /// over what they allow at once is over the limit, nothing counted.
    fn check_costs(&mut self) {
        let (shown, over) = (&mut self.shown, &mut self.over);
        self.takes.retain_mut(|t| {
            if t.take.resolve().is_ok() {
                return true;
            }
            let denied = !t.rule.shadow;
            *over |= denied;
            shown[t.at] = Some(t.shown(blocked(), denied));
            false
        });
    }

    /// Takes every hit together, and gives back what was taken when the request is
    /// over the limit (unless denied hits count) or a take failed.
    async fn take(mut self) -> Result<Decided, Error> {
        let count_denied = self.count_denied;
        let mut verdicts = take_all(self.takes.iter().map(|c| &c.take), false).await;
        let failed = verdicts.iter().position(|v| match v {
            Err(_) => true,
            Ok(v) => v.reason.is_some(),
        });
        let (worst, counted) = self.show_taken(&verdicts);
        let undo = self.over && !count_denied;
        if undo {
            self.show_given_back(&verdicts);
        }
        if failed.is_some() || undo {
            let taken = self.takes.iter().zip(&verdicts);
            undo_admitted(taken.map(|(c, v)| (&c.take, v.as_ref().ok())), false).await?;
        }
        if let Some(i) = failed {
            return Err(match verdicts.swap_remove(i) {
                Err(e) => e,
                Ok(v) => Error::Store {
                    reason: v.reason.unwrap_or("store_unreachable"),
                    message: "the store could not be used; nothing was counted".into(),
                },
            });
        }
        let mut answers = self.answers;
        for (a, s) in answers.iter_mut().zip(self.shown) {
            a.shown = s.unwrap_or(Shown::NoRule);
        }
        Ok(Decided {
            answers,
            over: self.over,
            strictest: worst.map(|(v, denied)| Strictest::Hits(v, denied)),
            leases: Vec::new(),
            counted,
        })
    }

    /// Each taken descriptor's answer, the strictest verdict, and what the metrics count.
    fn show_taken(
        &mut self,
        verdicts: &[Result<Verdict, Error>],
    ) -> (Option<(Verdict, bool)>, Vec<Counted>) {
        let mut worst: Option<(&Verdict, bool)> = None;
        let mut counted = Vec::with_capacity(verdicts.len());
        for (t, v) in self.takes.iter().zip(verdicts) {
            let Ok(v) = v else { continue };
            let denied = !v.decision.allowed && !t.rule.shadow;
            counted.push(Counted {
                policy: t
                    .rule
                    .name
                    .as_deref()
                    .map_or_else(|| v.policy.clone(), Arc::from),
                allowed: !denied,
                shadow_denied: v.shadow_denied || (!v.decision.allowed && t.rule.shadow),
            });
            self.over |= denied;
            let shown = if self.count_denied && !v.decision.allowed {
                // the denied hit was counted too: nothing is left, as envoyproxy/ratelimit
                // answers
                Decision {
                    remaining: 0.0,
                    ..v.decision
                }
            } else {
                v.decision
            };
            self.shown[t.at] = Some(t.shown(shown, denied));
            if worst
                .as_ref()
                .is_none_or(|(w, _)| v.decision.cmp_strictness(&w.decision).is_ge())
            {
                worst = Some((v, denied));
            }
        }
        (worst.map(|(v, d)| (v.clone(), d)), counted)
    }

    /// Nothing of the request counted: a descriptor within its limit shows what it had
    /// before it (envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
    fn show_given_back(&mut self, verdicts: &[Result<Verdict, Error>]) {
        for (t, v) in self.takes.iter().zip(verdicts) {
            if let Ok(v) = v {
                if v.allowed() {
                    let before = v.given_back(t.take.cost).decision;
                    self.shown[t.at] = Some(t.shown(before, false));
                }
            }
        }
    }
}
