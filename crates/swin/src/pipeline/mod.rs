//! The request pipeline: [`run`] alone orders the stages of every request, whatever
//! its kind (a hit, a batch, Envoy's descriptors, an increment, an acquire, a
//! reservation, a refund, a limit change, a quota report). A kind ([`Request`]) only
//! builds what it asks ([`Plan`]) and renders what it got ([`Ran`]):
//!
//! 1. **check**: the kind's [`Request::plan`] checks what can be checked before the
//!    store is read (the key, a cost some limit could take, a known namespace) and
//!    builds its asks;
//! 2. **first touch**, once per namespace for all of the request's keys: counts and
//!    runtime limits this node does not hold yet are read;
//! 3. **give back** what the request returns (Envoy's negative hits, a refund), each
//!    under its key's effective limits;
//! 4. **effective limits**: a key's runtime limits replace the config's, and each cost
//!    is checked against them (an error, or for Envoy a descriptor over the limit);
//! 5. **take together** ([`Ask::take`]): synchronous increments, strict holds and
//!    acquires of one request share round trips; shadow is applied in each ask's take,
//!    and only there;
//! 6. **all or nothing**: when an ask is refused or fails, what the others took is
//!    taken back (for Envoy's descriptors on a namespace that counts denied hits, only
//!    on a failure); when all were admitted the kind does its own part
//!    ([`Request::act`]: records a reservation, settles a commit, sets a limit), and
//!    what was taken is taken back if that fails (but for an outcome the store did not
//!    tell, which the kind resolves itself once the store answers);
//! 7. **record** each decision (the daemon's metrics).
//!
//! A request whose asks go to the store while its caller waits
//! ([`Request::waits_on_store`]) runs to its end in a task of its own, so that a caller
//! who goes away leaves all of it or nothing, never some.

mod asks;
mod hits;
mod leases;

use std::future::Future;

use swin_core::UnixMs;

use crate::error::Error;
use crate::state::Namespace;

pub(crate) use self::asks::{Asked, Back, Count, Given, Taken};
pub(crate) use self::hits::Take;
pub(crate) use self::leases::{concurrency_of, Acquiring};

/// A kind of request: what it asks of the pipeline, what it does itself once its asks
/// were admitted, and what it answers.
pub(crate) trait Request: Send + Sync + 'static {
    /// What the caller gets.
    type Answer: Send + 'static;
    /// What the kind's own part made (see [`Request::act`]).
    type Acted: Send;

    /// Whether it goes to the store while its caller waits: then it runs to its end in
    /// a task of its own.
    fn waits_on_store(&self) -> bool;

    /// Stage 1: checks the request and builds what it asks.
    fn plan(&self) -> Result<Plan<'_>, Error>;

    /// Stage 6, once every ask was admitted: the kind's own part. An error takes back
    /// what the asks took.
    fn act<'a>(
        &'a self,
        plan: &'a Plan<'a>,
    ) -> impl Future<Output = Result<Self::Acted, Error>> + Send + 'a;

    /// Whether it has a part of its own ([`Request::act`]) once its asks were
    /// admitted: a kind that has none and asks one thing takes the short way through
    /// the stages (see [`run`]).
    fn acts(&self) -> bool {
        true
    }

    /// Renders what the request got.
    fn answer(&self, plan: Plan<'_>, ran: Ran<Self::Acted>) -> Result<Self::Answer, Error>;
}

/// How one refused ask weighs on its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// All or nothing: what the others took is taken back.
    Whole,
    /// Each stands as counted (Envoy's descriptors on a namespace that counts denied
    /// hits); a failure still takes everything back.
    Each,
}

/// What a request asks: built by its kind, run by [`run`].
#[derive(Debug)]
pub(crate) struct Plan<'r> {
    /// Taken together.
    pub(crate) asks: Vec<Asked<'r>>,
    /// Given back before anything is taken (Envoy's negative hits, a refund).
    pub(crate) refunds: Vec<Back<'r>>,
    /// Keys read at the first touch besides the asks' and refunds' own.
    pub(crate) touch: Vec<(&'r Namespace, &'r str)>,
    /// Decide, spend nothing.
    pub(crate) dry_run: bool,
    /// How a refused ask weighs on the request.
    pub(crate) refusal: Refusal,
    /// Refused before anything is taken (a descriptor blocked by its rule): what the
    /// asks take is taken back as for a refusal.
    pub(crate) refused: bool,
    /// A hit whose cost its effective limits cannot take blocks itself (Envoy's
    /// descriptors) instead of failing the request.
    pub(crate) block_bad_costs: bool,
    /// A hit admitted only by its namespace's `on_store_failure` fails the request
    /// (Envoy's descriptors: Envoy's own failure mode decides).
    pub(crate) fail_degraded: bool,
    /// Errors name the ask as `<label>[i]` (a batch's `hits`, `increments`).
    pub(crate) label: Option<&'static str>,
    /// Each hit is recorded as its request went (a batch), not as it went itself.
    pub(crate) record_as_whole: bool,
    /// When the request was planned: its kind's own part waits for the store only
    /// within what is left of its answer time ([`Plan::left_of`]).
    pub(crate) started: tokio::time::Instant,
    /// When its hits are taken (the engine's clock, set as they are, by the stages; 0
    /// while the request is planned and its keys read): each counts in the
    /// windows of this time, and an undo takes back in the same windows, however late it
    /// comes (a take just before a window's end and its undo just after).
    pub(crate) taken_at: UnixMs,
}

impl<'r> Plan<'r> {
    /// A plan of `asks`, all or nothing, counting.
    pub(crate) fn of(asks: Vec<Asked<'r>>) -> Plan<'r> {
        Plan {
            asks,
            refunds: Vec::new(),
            touch: Vec::new(),
            dry_run: false,
            refusal: Refusal::Whole,
            refused: false,
            block_bad_costs: false,
            fail_degraded: false,
            label: None,
            record_as_whole: false,
            started: tokio::time::Instant::now(),
            // set by the stages as the asks are taken (the engine's clock read once)
            taken_at: UnixMs(0),
        }
    }

    /// What is left of an answer time `within` since the request was planned.
    pub(crate) fn left_of(&self, within: std::time::Duration) -> std::time::Duration {
        within.saturating_sub(self.started.elapsed())
    }

    /// A plan that asks nothing of the pipeline but to read `touch` first.
    pub(crate) fn touching(touch: Vec<(&'r Namespace, &'r str)>) -> Plan<'r> {
        Plan {
            touch,
            ..Plan::of(Vec::new())
        }
    }

    /// A plan that asks nothing of the pipeline (the kind's own part does it all).
    pub(crate) fn nothing() -> Plan<'r> {
        Plan::of(Vec::new())
    }

    /// One ask, nothing given back or read besides it, nothing refused before it is
    /// taken and no degraded answer failing it: nothing can be taken back.
    fn is_one_take(&self) -> bool {
        self.asks.len() == 1
            && self.refunds.is_empty()
            && self.touch.is_empty()
            && !self.refused
            && !self.fail_degraded
    }

    fn at(&self, i: usize, e: Error) -> Error {
        match self.label {
            Some(l) => e.at(&format!("{l}[{i}]")),
            None => e,
        }
    }
}

/// What a request got from the pipeline.
#[derive(Debug)]
pub(crate) struct Ran<T> {
    /// Each ask's result, in order: `None` for one blocked by its cost.
    pub(crate) taken: Vec<Option<Taken>>,
    /// Each refund's result, in order: what was given and the key after it.
    pub(crate) refunded: Vec<Given>,
    /// Whether the request was refused (then, all or nothing, nothing of it stays).
    pub(crate) refused: bool,
    /// The kind's own part, when the request was admitted.
    pub(crate) acted: Option<T>,
}

/// Runs `request` through every stage (see the module's docs), to its end in a task of
/// its own when it waits on the store.
pub(crate) async fn run<R: Request>(request: R) -> Result<R::Answer, Error> {
    let whole = request.waits_on_store();
    let decide = async move {
        let mut plan = request.plan()?;
        let ran = match plan.is_one_take() && !request.acts() {
            true => one(&mut plan).await?,
            // boxed: the short way's future (every hit's) does not carry this one's size
            false => Box::pin(stages(&request, &mut plan)).await?,
        };
        request.answer(plan, ran)
    };
    if !whole {
        return decide.await;
    }
    // the task keeps the request's span (traces: its store calls stay its children)
    let decide = tracing::Instrument::in_current_span(decide);
    // boxed: the task holds a pointer, not the whole request moved through tokio's frames
    tokio::spawn(Box::pin(decide)).await.map_err(|e| {
        tracing::error!(cause = %e, "a request's task failed");
        Error::Internal
    })?
}

/// Stages 2 to 7 of a request of one ask and nothing else (see [`Plan::is_one_take`])
/// whose kind has no part of its own: what [`stages`] does, without its sets of
/// futures, as one refused or failed ask took nothing to take back.
async fn one<T>(plan: &mut Plan<'_>) -> Result<Ran<T>, Error> {
    touch(plan).await;
    let blocked = resolve(plan)?;
    plan.taken_at = swin_sync::now();
    let ask = &plan.asks[0];
    let taken = match ask.blocked() {
        true => None,
        false => Some(
            ask.take(plan.dry_run, plan.taken_at)
                .await
                .map_err(|e| plan.at(0, e))?,
        ),
    };
    let refused = blocked || taken.as_ref().is_some_and(|t| !t.admitted());
    let taken = [taken];
    record(plan, &taken, refused);
    Ok(Ran {
        taken: Vec::from(taken),
        refunded: Vec::new(),
        refused,
        acted: None,
    })
}

/// Stages 2 to 7 of a planned request.
async fn stages<R: Request>(request: &R, plan: &mut Plan<'_>) -> Result<Ran<R::Acted>, Error> {
    touch(plan).await;
    let refunded = give_back(plan).await?;
    let blocked = resolve(plan)?;
    plan.taken_at = swin_sync::now();
    let mut taken = take_all(plan).await;
    let failed = taken.iter().position(|t| match t {
        Some(Err(_)) => true,
        Some(Ok(t)) => plan.fail_degraded && t.degraded().is_some(),
        None => false,
    });
    let refused =
        plan.refused || blocked || taken.iter().flatten().flatten().any(|t| !t.admitted());
    if failed.is_some() || (refused && plan.refusal == Refusal::Whole) {
        undo_admitted(plan, &taken)
            .await
            .map_err(|e| plan.at(failed.unwrap_or(0), e))?;
    }
    if let Some(i) = failed {
        return Err(plan.at(i, failure(taken.swap_remove(i))));
    }
    let mut acted = None;
    if !refused {
        match request.act(plan).await {
            Ok(a) => acted = Some(a),
            // the kind resolves it (applied: what was taken stays; not: taken back)
            Err(e @ Error::OutcomeUnknown(_)) => return Err(e),
            Err(e) => {
                if let Err(u) = undo_admitted(plan, &taken).await {
                    tracing::warn!(cause = %u, "what a failed request took could not all be taken back");
                }
                return Err(e);
            }
        }
    }
    // no ask failed (a failure returned above)
    let taken: Vec<Option<Taken>> = taken.into_iter().map(|t| t.and_then(Result::ok)).collect();
    record(plan, &taken, refused);
    Ok(Ran {
        taken,
        refunded,
        refused,
        acted,
    })
}

/// Stage 2: the first touch of every key of a request, one read per namespace for all
/// of its keys (see [`Namespace::first_touch`]).
async fn touch(plan: &Plan<'_>) {
    let counting = !plan.dry_run;
    if let ([ask], [], []) = (plan.asks.as_slice(), plan.refunds.as_slice(), &*plan.touch) {
        // one ask (a hit, an increment): no list of keys to build
        if let Some((ns, key)) = ask.touched() {
            ns.first_touch(&[key], counting).await;
        }
        return;
    }
    let keys: Vec<(&Namespace, &str)> = plan
        .asks
        .iter()
        .filter_map(Asked::touched)
        .chain(plan.refunds.iter().filter_map(|b| match b {
            Back::Hits(t) => Some((t.ns, &*t.key)),
            Back::Slots { .. } => None,
        }))
        .chain(plan.touch.iter().copied())
        .collect();
    match keys.as_slice() {
        [] => {}
        // one key: no list of namespaces to walk
        [(ns, key)] => ns.first_touch(&[key], counting).await,
        keys => {
            let mut touched: Vec<&Namespace> = Vec::new();
            for &(ns, _) in keys {
                if touched.iter().any(|n| std::ptr::eq(*n, ns)) {
                    continue;
                }
                let of_ns: Vec<&str> = keys
                    .iter()
                    .filter(|(o, _)| std::ptr::eq(*o, ns))
                    .map(|&(_, k)| k)
                    .collect();
                ns.first_touch(&of_ns, counting).await;
                touched.push(ns);
            }
        }
    }
}

/// Stage 3: the refunds, each on its own, under its key's effective limits.
async fn give_back(plan: &mut Plan<'_>) -> Result<Vec<Given>, Error> {
    for b in &mut plan.refunds {
        if let Back::Hits(t) = b {
            t.effective_limits();
        }
    }
    futures_util::future::join_all(plan.refunds.iter().map(Back::give))
        .await
        .into_iter()
        .collect()
}

/// Stage 4: every ask's effective limits, and whether they take its cost; answers
/// whether an ask was blocked by its cost (see [`Plan::block_bad_costs`]).
fn resolve(plan: &mut Plan<'_>) -> Result<bool, Error> {
    let mut blocked = false;
    for i in 0..plan.asks.len() {
        if let Err(e) = plan.asks[i].resolve() {
            if !plan.block_bad_costs {
                return Err(plan.at(i, e));
            }
            blocked |= plan.asks[i].block();
        }
    }
    Ok(blocked)
}

/// Stage 5: every ask not blocked, taken together.
async fn take_all(plan: &Plan<'_>) -> Vec<Option<Result<Taken, Error>>> {
    let (dry_run, at) = (plan.dry_run, plan.taken_at);
    if let [a] = plan.asks.as_slice() {
        // one ask: taken as it is, not moved into a set of futures to poll together
        return vec![match a.blocked() {
            true => None,
            false => Some(a.take(dry_run, at).await),
        }];
    }
    futures_util::future::join_all(plan.asks.iter().map(|a| async move {
        match a.blocked() {
            true => None,
            false => Some(a.take(dry_run, at).await),
        }
    }))
    .await
}

/// Stage 6: takes back every ask that was admitted, as one request refused as a whole;
/// nothing in a dry run.
async fn undo_admitted(
    plan: &Plan<'_>,
    taken: &[Option<Result<Taken, Error>>],
) -> Result<(), Error> {
    if plan.dry_run {
        return Ok(());
    }
    let back = plan.asks.iter().zip(taken).filter_map(|(a, t)| match t {
        Some(Ok(t)) if t.admitted() => Some(a.undo(t, plan.taken_at)),
        _ => None,
    });
    futures_util::future::join_all(back)
        .await
        .into_iter()
        .collect()
}

/// The error a failed ask makes its request fail with.
fn failure(taken: Option<Result<Taken, Error>>) -> Error {
    match taken {
        Some(Err(e)) => e,
        Some(Ok(t)) => Error::Store {
            reason: t.degraded().unwrap_or("store_unreachable"),
            message: "the store could not be used; nothing was counted".into(),
        },
        None => Error::Internal,
    }
}

/// Stage 7: each ask's outcome, recorded (a request refused as a whole: none allowed).
fn record(plan: &Plan<'_>, taken: &[Option<Taken>], refused: bool) {
    let whole = refused && plan.record_as_whole;
    for (a, t) in plan.asks.iter().zip(taken) {
        if let Some(t) = t {
            a.record(t, whole);
        }
    }
}
