//! How a commit settles one key of its reservation at the actual cost: the give-back
//! where the reservation counted (below the estimate), the overrun as debt or capped
//! (above it), and the key after it.

use swin_core::UnixMs;

use crate::config::AdmissionMode;
use crate::decisions::Verdict;
use crate::error::Error;
use crate::pipeline::Take;
use crate::policy::limits::{KeyLimits, Overrun};
use crate::runtime_limits::Effective;
use crate::state::Namespace;
use crate::unresolved::{Owed, OwedGiveBack, Owing};

use super::{RETRY_EVERY, RETRY_MOST};

/// Pieces a commit's overrun is charged in, in a namespace in shadow.
const SHADOW_PIECES: usize = 16;

/// What a give-back could not give yet: per take's time, the part of it the store's
/// count of the take's windows did not hold (see [`give_back`]).
pub(super) type Short = Vec<(UnixMs, f64)>;

/// Charges or gives back the difference between `cost` and `estimate` (the
/// reservation's total, `counted` where its record says): (charged, given back, the key
/// after it, what is still to give back).
pub(super) async fn settle(
    ns: &Namespace,
    key: &str,
    limits: &KeyLimits,
    overrun: Overrun,
    (estimate, counted): (f64, &[(UnixMs, f64)]),
    cost: f64,
) -> Result<(f64, f64, Verdict, Short), Error> {
    // each step a take of the request pipeline under the limits the commit read
    let under =
        |cost: f64, shadow: bool| Take::under(ns, key, cost, Effective::Config(limits), shadow);
    if cost < estimate {
        let (given, after, short) =
            give_back(ns, key, limits, (estimate, counted), estimate - cost).await?;
        return Ok((0.0, given, after, short));
    }
    let in_shadow = ns.limits.as_ref().is_some_and(|l| l.shadow);
    if overrun == Overrun::Debt && cost > estimate {
        // all of it, even past the limit: counted whatever the decision
        let over = cost - estimate;
        let forced = Take {
            count_denied: true,
            ..under(over, in_shadow)
        };
        forced.take(false).await?;
        let after = under(0.0, in_shadow).take(true).await?;
        let after = next_hit(after, under(1.0, in_shadow)).await?;
        return Ok((over, 0.0, after, Vec::new()));
    }
    let (charged, given, after) = capped(ns, key, limits, in_shadow, cost - estimate).await?;
    Ok((
        charged,
        given,
        next_hit(after, under(1.0, in_shadow)).await?,
        Vec::new(),
    ))
}

/// The key after a charge, saying when its next hit (of 1, `one`'s dry run) can pass
/// when none can now: not when a debt is paid (a bucket needs a unit more, a sliding
/// window the hit's weight more), nor 0 for a key left at its limit.
pub(super) async fn next_hit(mut after: Verdict, one: Take<'_>) -> Result<Verdict, Error> {
    if !after.allowed() || after.decision.remaining < 1.0 {
        let next = one.take(true).await?;
        after.decision.retry_after = after.decision.retry_after.max(next.decision.retry_after);
    }
    Ok(after)
}

/// Gives back `back` of a reservation's total where it was counted, the latest takes
/// first: each take's part at its time, in the windows it counted in (one give-back per
/// run of takes that share their windows), never below zero on the cluster's count. What the record cannot place — takes it
/// did not keep, takes in windows older than the previous one, a GCRA bucket's — is
/// settled as a refund is, from the current window and then the previous one.
///
/// Under eventual admission with a store, a take's windows in the store hold at least
/// the take once it is there; a count below its part means the take is not there yet
/// (counted on a node whose push has not landed: a round trip that failed, a sync to
/// come). What such a run could not give is returned as short, to give back once the
/// take lands ([`give_back_later`]).
async fn give_back(
    ns: &Namespace,
    key: &str,
    limits: &KeyLimits,
    (total, counted): (f64, &[(UnixMs, f64)]),
    back: f64,
) -> Result<(f64, Verdict, Short), Error> {
    let under = |cost: f64| Take::under(ns, key, cost, Effective::Config(limits), false);
    let KeyLimits::Windows(set) = limits else {
        let (given, after) = under(back).settle().await?;
        return Ok((given, after, Vec::new()));
    };
    let later = gives_back_later(ns);
    let now = swin_sync::now();
    let windows_of =
        |at: UnixMs| -> Vec<i64> { set.iter().map(|l| l.window.start_of(at)).collect() };
    let live = |at: UnixMs| {
        set.iter()
            .all(|l| l.window.start_of(at) >= l.window.previous_start_of(now))
    };
    let placed: f64 = counted.iter().map(|&(_, v)| v).sum();
    // the takes the record did not keep came last
    let mut unplaced = (total - placed).max(0.0).min(back);
    let mut left = back - unplaced;
    let mut runs: Vec<(UnixMs, f64)> = Vec::new();
    for &(at, amount) in counted.iter().rev() {
        if left <= 0.0 {
            break;
        }
        let part = amount.min(left).max(0.0);
        left -= part;
        if !live(at) {
            unplaced += part;
            continue;
        }
        match runs.last_mut() {
            Some((last, sum)) if windows_of(*last) == windows_of(at) => *sum += part,
            _ => runs.push((at, part)),
        }
    }
    unplaced += left.max(0.0);
    let mut given = 0.0;
    let mut after = None;
    let mut short = Vec::new();
    for (at, part) in runs {
        if part > 0.0 {
            let (back, then) = under(part).settle_at(at).await?;
            given += back;
            after = Some(then);
            if later && back < part {
                short.push((at, part - back));
            }
        }
    }
    if unplaced > 0.0 || after.is_none() {
        let (settled, then) = under(unplaced).settle().await?;
        given += settled;
        after = Some(then);
    }
    Ok((given, after.ok_or(Error::Internal)?, short))
}

/// Whether a give-back short of a take's part is given back later: eventual admission
/// with a store (under strict admission a give-back returns this node's quota, and what
/// it does not hold stays spent).
fn gives_back_later(ns: &Namespace) -> bool {
    matches!(ns.admission_mode, AdmissionMode::Eventual)
        && ns.sync.mode() != swin_sync::SyncMode::LocalOnly
}

/// Gives back, as each take lands in the store, what a commit's give-back found short
/// (`short`, per take's time, for `owed`'s key): tried every [`RETRY_EVERY`] and then
/// less often, while the take's windows are still counted, held by `owing` (a stop
/// between two tries spools what is left, as `owed` with it). Answers what is left (0
/// when all of it went back, or a stop took it).
pub(super) async fn give_back_later(
    ns: &Namespace,
    owed: &OwedGiveBack,
    limits: &KeyLimits,
    mut short: Short,
    owing: &Owing,
) -> f64 {
    let KeyLimits::Windows(set) = limits else {
        return 0.0;
    };
    let mut wait = RETRY_EVERY;
    loop {
        let now = swin_sync::now();
        // a take in a window no longer counted has nothing left to give
        short.retain(|&(at, left)| {
            left > 0.0
                && set
                    .iter()
                    .all(|l| l.window.start_of(at) >= l.window.previous_start_of(now))
        });
        if short.is_empty() {
            return 0.0;
        }
        let left = OwedGiveBack {
            short: short.iter().map(|&(at, v)| (at.0, v)).collect(),
            ..owed.clone()
        };
        if !owing.go_on(Owed::GiveBack(left.clone())) {
            return 0.0;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RETRY_MOST);
        if !owing.go_on(Owed::Other(format!("{}, under way", Owed::GiveBack(left)))) {
            return 0.0;
        }
        for (at, left) in short.iter_mut() {
            let take = Take::under(ns, &owed.key, *left, Effective::Config(limits), false);
            if let Ok((back, _)) = take.settle_at(*at).await {
                *left -= back;
            }
        }
    }
}

/// `overrun = "cap"`: charges `left` up to what the limits leave: (charged, 0, the key
/// after it).
async fn capped(
    ns: &Namespace,
    key: &str,
    limits: &KeyLimits,
    in_shadow: bool,
    mut left: f64,
) -> Result<(f64, f64, Verdict), Error> {
    let under =
        |cost: f64, shadow: bool| Take::under(ns, key, cost, Effective::Config(limits), shadow);
    let mut charged = 0.0;
    let enforced = limits.enforced();
    let Some(enforced) = enforced.filter(|_| !in_shadow) else {
        // a namespace in shadow (or limits all in shadow) refuses nothing: the whole
        // overrun counts, in pieces
        // every limit can take at once (at most SHADOW_PIECES; past that, uncharged)
        let most = limits.most_at_once();
        let mut last = None;
        for _ in 0..SHADOW_PIECES {
            if left <= 0.0 {
                break;
            }
            let piece = left.min(most);
            last = Some(under(piece, true).take(false).await?);
            charged += piece;
            left -= piece;
        }
        let after = match last {
            Some(v) => v,
            None => under(0.0, true).take(true).await?,
        };
        return Ok((charged, 0.0, after));
    };
    // what the enforced limits leave (a limit in shadow caps nothing: it counts the
    // charge and marks it), then that much at most; a hit racing in between can take
    // it first, so the room is read again (four tries, then the rest goes uncharged).
    // A strict bucket's room is the units this node holds and the store's room after
    // them, which one take cannot have at once: a denied take says what one could.
    let mut most = f64::INFINITY;
    for _ in 0..4 {
        let room_left = Take::under(ns, key, 0.0, Effective::Config(&enforced), false)
            .take(true)
            .await?;
        if left <= 0.0 {
            break;
        }
        let mut room = room_left.decision.remaining.min(left).min(most);
        if matches!(limits, KeyLimits::Gcra(_)) {
            room = room.floor();
        }
        if room <= 0.0 {
            break;
        }
        let v = under(room, false).take(false).await?;
        if v.allowed() {
            charged += room;
            left -= room;
            most = f64::INFINITY;
            if left <= 0.0 {
                return Ok((charged, 0.0, v));
            }
        } else {
            most = v.decision.remaining;
        }
    }
    let now = under(0.0, false).take(true).await?;
    Ok((charged, 0.0, now))
}
