//! Descriptors on a concurrency namespace (`algorithm = "concurrency"`): each
//! descriptor's counter key is a key of the namespace's leases and its hits are slots.
//! A request takes its descriptors' slots all or nothing, under leases of
//! [`ENVOY_LEASES`](crate::leases::ENVOY_LEASES) that lapse after the namespace's
//! `lease_ttl` (an Envoy that dies frees its slots by then); the same descriptors sent
//! again with `is_negative_hits` — Envoy's way of ending a request
//! (`apply_on_stream_done`) — end that many slots of the key, the earliest to lapse
//! first. A descriptor's own `limit` replaces the namespace's `limit` for it (its
//! requests per unit, in flight; its unit is not read).
//!
//! With descriptor rules, each rule's descriptors are limited to its
//! `requests_per_unit` in flight; descriptors that match no rule take no slot and are
//! OK, `unlimited` rules take none, `requests_per_unit: 0` blocks, and `shadow_mode`
//! takes the slots past the limit and answers OK. Without rules, every descriptor counts
//! under the namespace's `limit`.

use std::sync::Arc;
use std::time::Duration;

use swin_core::UnixMs;

use super::{Answer, Decided, Descriptor, Shown, Strictest};
use crate::config::Concurrency;
use crate::error::Error;
use crate::leases::AcquireAnswer;
use crate::pipeline::{Acquiring, Asked, Back, Plan, Ran, Taken};
use crate::policy::keys;
use crate::policy::rules::{Found, Rule, RuleLimit};
use crate::state::Namespace;

/// One descriptor's slots of a key.
pub(super) struct Slots {
    key: String,
    count: u32,
    limit: u64,
    /// Its rule's `shadow_mode`: slots taken past `limit` too, the answer OK.
    shadow: bool,
}

impl Slots {
    fn shown(&self, ok: bool, remaining: u64, until: Duration) -> Shown {
        Shown::Slots {
            ok,
            limit: self.limit,
            remaining,
            until,
        }
    }
}

/// What a descriptor does: take slots of a key or (its negative hits: `true`) end them,
/// or answer without any (it matched no rule, an `unlimited` one, or one that blocks:
/// then whether it is over).
pub(super) enum Part {
    Slots(Slots, bool),
    Answer(Shown, bool),
}

/// Each descriptor's rule (for the answer) and plan: its own `limit` first, else the
/// namespace's rules (the tree, `replaces`, `share_threshold`), else — a namespace
/// without rules — the namespace's `limit` on the descriptor's key.
pub(super) fn parts(
    ns: &Namespace,
    c: &Concurrency,
    asks: &[Descriptor<'_>],
) -> Vec<(Option<Arc<Rule>>, Part)> {
    let slots = |at: usize, key: String, limit: u64, rule: Option<&Rule>| Slots {
        key,
        count: u32::try_from(asks[at].hits).unwrap_or(u32::MAX),
        limit,
        shadow: rule.is_some_and(|r| r.shadow),
    };
    let Some(rules) = &ns.rules else {
        return asks
            .iter()
            .enumerate()
            .map(|(at, a)| {
                let limit = a.limit.map_or(c.limit, |(n, _)| u64::from(n));
                let key = keys::counter_key(a.pairs());
                (None, Part::Slots(slots(at, key, limit, None), a.negative))
            })
            .collect();
    };
    let found: Vec<Option<Found>> = asks.iter().map(|a| rules.lookup(a.pairs())).collect();
    // a rule named in another matched rule's `replaces` does not apply
    let replaced: Vec<&str> = found
        .iter()
        .flatten()
        .flat_map(|f| f.rule.replaces.iter().map(String::as_str))
        .collect();
    asks.iter()
        .zip(&found)
        .enumerate()
        .map(|(at, (a, f))| {
            let key = |f: &Found| match f.shared.is_empty() {
                true => keys::counter_key(a.pairs()),
                false => keys::counter_key(&f.counted(a.pairs())),
            };
            if let Some((n, _)) = a.limit {
                let key = f.as_ref().map_or_else(|| keys::counter_key(a.pairs()), key);
                return (
                    None,
                    Part::Slots(slots(at, key, u64::from(n), None), a.negative),
                );
            }
            let f = f.as_ref().filter(|f| {
                f.rule
                    .name
                    .as_deref()
                    .is_none_or(|n| !replaced.contains(&n))
            });
            let Some(f) = f else {
                return (None, Part::Answer(Shown::NoRule, false));
            };
            let rule = &*f.rule;
            let part = match rule.limit {
                RuleLimit::InFlight(n) => Part::Slots(slots(at, key(f), n, Some(rule)), a.negative),
                // an end on a value that is blocked ends nothing
                RuleLimit::Blocked => {
                    let denied = !a.negative && !rule.shadow;
                    let s = slots(at, String::new(), 0, Some(rule));
                    Part::Answer(s.shown(!denied, 0, Duration::ZERO), denied)
                }
                // `unlimited` (and, never here, limits of hits): no slot
                RuleLimit::Unlimited | RuleLimit::Limited(_) => {
                    Part::Answer(Shown::Unlimited, false)
                }
            };
            (Some(f.rule.clone()), part)
        })
        .collect()
}

fn until(a: &AcquireAnswer, at: UnixMs) -> Duration {
    Duration::from_millis(u64::try_from(at.0 - a.now.0).unwrap_or(0))
}

/// The plan of a request of descriptors on a concurrency namespace: each descriptor's
/// slots ended (its negative hits) or taken, all or nothing.
pub(super) fn plan<'r>(
    ns: &'r Namespace,
    c: &Concurrency,
    parts: &'r [(Option<Arc<Rule>>, Part)],
) -> Plan<'r> {
    let mut plan = Plan {
        block_bad_costs: true,
        ..Plan::nothing()
    };
    for (_, p) in parts {
        match p {
            Part::Slots(s, true) => plan.refunds.push(Back::Slots {
                ns,
                key: s.key.clone(),
                count: s.count,
            }),
            // no slots (a descriptor's hits_addend 0): nothing to take
            Part::Slots(s, false) if s.count == 0 => {}
            Part::Slots(s, false) => plan.asks.push(Asked::Slots(Acquiring::for_envoy(
                ns,
                c,
                s.key.clone(),
                s.count,
                s.limit,
                s.shadow,
            ))),
            Part::Answer(_, denied) => plan.refused |= denied,
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
    let over = ran.refused;
    let mut d = Decided {
        answers: Vec::with_capacity(parts.len()),
        over,
        strictest: None,
        envoy_headers: false,
        envoy_metadata: false,
    };
    let mut takes = plan.asks.iter().zip(ran.taken);
    let mut strictest: Option<(u64, AcquireAnswer)> = None;
    for (rule, p) in parts {
        let shown = match p {
            Part::Answer(shown, _) => shown.clone(),
            Part::Slots(s, true) => s.shown(true, 0, Duration::ZERO),
            Part::Slots(s, false) if s.count == 0 => s.shown(true, 0, Duration::ZERO),
            Part::Slots(s, false) => match takes.next() {
                // more slots than the limit holds in all: over it, nothing taken
                Some((_, None)) => s.shown(false, 0, Duration::ZERO),
                Some((_, Some(Taken::Slots(a)))) => {
                    let shown = show_taken(s, &a, over);
                    let left = s.limit.saturating_sub(a.acquired.in_flight);
                    let stricter = strictest.as_ref().is_none_or(|(w_left, w)| {
                        (!a.acquired.granted && w.acquired.granted)
                            || (a.acquired.granted == w.acquired.granted && left < *w_left)
                    });
                    if stricter {
                        strictest = Some((left, a));
                    }
                    shown
                }
                _ => return Err(Error::Internal),
            },
        };
        d.answers.push(Answer {
            rule: rule.clone(),
            shown,
        });
    }
    d.strictest = strictest.map(|(_, a)| Strictest::Slots(a, over));
    Ok(d)
}

/// An acquire's answer.
fn show_taken(s: &Slots, a: &AcquireAnswer, over: bool) -> Shown {
    let granted = a.acquired.granted;
    if granted && !over {
        s.shown(
            true,
            s.limit.saturating_sub(a.acquired.in_flight),
            until(a, a.expires_at),
        )
    } else if granted {
        // granted, then ended with the rest: as it was before
        let before = a.acquired.in_flight.saturating_sub(u64::from(s.count));
        s.shown(true, s.limit.saturating_sub(before), Duration::ZERO)
    } else {
        let at = a.acquired.earliest_lapse.unwrap_or(a.expires_at);
        s.shown(
            false,
            s.limit.saturating_sub(a.acquired.in_flight),
            until(a, at),
        )
    }
}
