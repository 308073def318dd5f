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

use super::{Answer, Counted, Decided, Descriptor, Shown, Strictest};
use crate::config::Concurrency;
use crate::error::Error;
use crate::leases::AcquireAnswer;
use crate::pipeline::{release_for_envoy, take_all, undo_admitted, Acquiring};
use crate::policy::keys;
use crate::policy::rules::{Found, Rule, RuleLimit};
use crate::state::Namespace;

/// One descriptor's slots of a key.
struct Slots {
    at: usize,
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

/// What a descriptor does: take or end slots of a key, or answer without any (it
/// matched no rule, an `unlimited` one, or one that blocks: then whether it is over).
enum Plan {
    Slots(Slots),
    Answer(Shown, bool),
}

/// Each descriptor's rule (for the answer) and plan: its own `limit` first, else the
/// namespace's rules (the tree, `replaces`, `share_threshold`), else — a namespace
/// without rules — the namespace's `limit` on the descriptor's key.
fn plans(
    ns: &Namespace,
    c: &Concurrency,
    asks: &[Descriptor<'_>],
) -> Vec<(Option<Arc<Rule>>, Plan)> {
    let slots = |at: usize, key: String, limit: u64, rule: Option<&Rule>| Slots {
        at,
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
                let key = keys::counter_key(&a.entries);
                (None, Plan::Slots(slots(at, key, limit, None)))
            })
            .collect();
    };
    let found: Vec<Option<Found>> = asks.iter().map(|a| rules.lookup(&a.entries)).collect();
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
                true => keys::counter_key(&a.entries),
                false => keys::counter_key(&f.counted(&a.entries)),
            };
            if let Some((n, _)) = a.limit {
                let key = f
                    .as_ref()
                    .map_or_else(|| keys::counter_key(&a.entries), key);
                return (None, Plan::Slots(slots(at, key, u64::from(n), None)));
            }
            let f = f.as_ref().filter(|f| {
                f.rule
                    .name
                    .as_deref()
                    .is_none_or(|n| !replaced.contains(&n))
            });
            let Some(f) = f else {
                return (None, Plan::Answer(Shown::NoRule, false));
            };
            let rule = &*f.rule;
            let plan = match rule.limit {
                RuleLimit::InFlight(n) => Plan::Slots(slots(at, key(f), n, Some(rule))),
                // an end on a value that is blocked ends nothing
                RuleLimit::Blocked => {
                    let denied = !a.negative && !rule.shadow;
                    let s = slots(at, String::new(), 0, Some(rule));
                    Plan::Answer(s.shown(!denied, 0, Duration::ZERO), denied)
                }
                // `unlimited` (and, never here, limits of hits): no slot
                RuleLimit::Unlimited | RuleLimit::Limited(_) => {
                    Plan::Answer(Shown::Unlimited, false)
                }
            };
            (Some(f.rule.clone()), plan)
        })
        .collect()
}

fn until(a: &AcquireAnswer, at: UnixMs) -> Duration {
    Duration::from_millis(u64::try_from(at.0 - a.now.0).unwrap_or(0))
}

/// A request on a concurrency namespace: releases first (a request may end one thing
/// and start another), then the acquires, all or nothing.
pub(super) async fn decide(
    ns: &Namespace,
    c: &Concurrency,
    asks: &[Descriptor<'_>],
) -> Result<Decided, Error> {
    let mut d = Decided {
        answers: Vec::with_capacity(asks.len()),
        over: false,
        strictest: None,
        counted: Vec::new(),
        leases: Vec::new(),
    };
    let (mut ends, mut takes) = (Vec::new(), Vec::new());
    for (at, (rule, plan)) in plans(ns, c, asks).into_iter().enumerate() {
        let shown = match plan {
            Plan::Slots(s) if asks[at].negative => {
                ends.push(s);
                Shown::NoRule
            }
            Plan::Slots(s) => {
                takes.push(s);
                Shown::NoRule
            }
            Plan::Answer(shown, denied) => {
                d.over |= denied;
                shown
            }
        };
        d.answers.push(Answer { rule, shown });
    }
    end_all(ns, &ends, &mut d).await?;
    take_all_slots(ns, c, &takes, &mut d).await?;
    Ok(d)
}

/// Ends each descriptor's slots of `ends`.
async fn end_all(ns: &Namespace, ends: &[Slots], d: &mut Decided) -> Result<(), Error> {
    let ended =
        futures_util::future::join_all(ends.iter().map(|s| release_for_envoy(ns, &s.key, s.count)))
            .await;
    for (s, r) in ends.iter().zip(ended) {
        r?;
        d.leases.push("released");
        d.answers[s.at].shown = s.shown(true, 0, Duration::ZERO);
    }
    Ok(())
}

/// Takes each descriptor's slots of `takes` through the pipeline, all or nothing.
async fn take_all_slots(
    ns: &Namespace,
    c: &Concurrency,
    takes: &[Slots],
    d: &mut Decided,
) -> Result<(), Error> {
    // no slots (a descriptor's hits_addend 0): nothing to take
    for s in takes.iter().filter(|s| s.count == 0) {
        d.answers[s.at].shown = s.shown(true, 0, Duration::ZERO);
    }
    let asks: Vec<(&Slots, Acquiring)> = takes
        .iter()
        .filter(|s| s.count > 0)
        .map(|s| {
            let a = Acquiring::for_envoy(ns, c, s.key.clone(), s.count, s.limit, s.shadow);
            (s, a)
        })
        .collect();
    // more slots than the limit holds in all: over it, nothing taken
    let (fit, too_many): (Vec<_>, Vec<_>) = asks.into_iter().partition(|(_, a)| a.fits());
    d.over |= !too_many.is_empty();
    for (s, _) in &too_many {
        d.answers[s.at].shown = s.shown(false, 0, Duration::ZERO);
    }
    // taken even when another descriptor is already over (and undone below), so that
    // each descriptor's answer says where its own key stands
    let mut taken = take_all(fit.iter().map(|(_, a)| a), false).await;
    let failed = taken.iter().position(Result::is_err);
    d.over |= taken
        .iter()
        .any(|t| matches!(t, Ok(a) if !a.acquired.granted));
    if failed.is_some() || d.over {
        // all or nothing: what was granted is undone
        let undone = fit
            .iter()
            .map(|(_, a)| a)
            .zip(taken.iter().map(|t| t.as_ref().ok()));
        undo_admitted(undone, false).await?;
    }
    if let Some(i) = failed {
        return Err(taken.swap_remove(i).err().unwrap_or(Error::Internal));
    }
    let fit: Vec<&Slots> = fit.iter().map(|(s, _)| *s).collect();
    show_taken(&fit, &taken, d);
    Ok(())
}

/// Each acquire's answer, what the metrics count, and the strictest.
fn show_taken(fit: &[&Slots], taken: &[Result<AcquireAnswer, Error>], d: &mut Decided) {
    let over = d.over;
    let mut strictest: Option<(&Slots, &AcquireAnswer)> = None;
    for (s, t) in fit.iter().zip(taken) {
        let Ok(a) = t else { continue };
        let granted = a.acquired.granted;
        d.leases.push(if granted { "acquired" } else { "denied" });
        // a rule in shadow took slots past its limit: a would-be denial
        d.counted.push(Counted {
            policy: Arc::from("concurrency"),
            allowed: granted,
            shadow_denied: a.shadow_denied,
        });
        d.answers[s.at].shown = if granted && !over {
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
        };
        let stricter = strictest.is_none_or(|(_, w)| {
            (!granted && w.acquired.granted)
                || (granted == w.acquired.granted
                    && s.limit.saturating_sub(a.acquired.in_flight)
                        < w.limit.saturating_sub(w.acquired.in_flight))
        });
        if stricter {
            strictest = Some((s, a));
        }
    }
    d.strictest = strictest.map(|(_, a)| Strictest::Slots(a.clone(), over));
}
