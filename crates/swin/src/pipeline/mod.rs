//! The one pipeline every request of hits runs through: a `/hit`, an HTTP batch,
//! Envoy's descriptors and a reservation's charge each build [`Take`]s and run these
//! stages, in this order, and nothing else decides a hit:
//!
//! 1. **check** what can be checked before the store is read: the key, a cost some
//!    limit could take, that the namespace has limits ([`Take::of_key`]);
//! 2. **first touch**, once per namespace for all of the request's keys ([`touch`]):
//!    counts and runtime limits this node does not hold yet are read;
//! 3. **effective limits**: the key's runtime limits replace the config's, and the cost
//!    is checked against them ([`Take::resolve`]);
//! 4. **take together** ([`take_all`]): synchronous increments and strict holds of one
//!    request share round trips; shadow is applied here, in [`Take::take`], and only
//!    here;
//! 5. **give back** what was taken when any take was refused or failed ([`undo_allowed`]):
//!    all or nothing.
//!
//! Leases (acquire, release) are decided by the lease book's store; a request that waits
//! on the store runs to its end in a task of its own ([`crate::requests::to_the_end`]).

use std::borrow::Cow;

use swin_sync::admission::{GiveBack, Spend};

use crate::decisions::{bounds, limits_of, verdict, Verdict};
use crate::error::Error;
use crate::policy::input::check_key;
use crate::policy::limits::KeyLimits;
use crate::runtime_limits::Effective;
use crate::state::Namespace;

/// One hit of a request on its way through the pipeline: its namespace, counter key,
/// cost and the limits it is decided under (the config's or a descriptor rule's until
/// [`Take::resolve`], then the key's effective ones).
#[derive(Debug, Clone)]
pub struct Take<'r> {
    /// Its namespace.
    pub ns: &'r Namespace,
    /// The counter key.
    pub key: Cow<'r, str>,
    /// What it costs.
    pub cost: f64,
    /// The limits it is decided under.
    pub limits: Effective<'r>,
    /// In shadow (its namespace, or its descriptor rule): allowed whatever its counts say,
    /// and marked when they would deny it.
    pub shadow: bool,
    /// Denied hits count too (the namespace's `count_denied`).
    pub count_denied: bool,
}

impl<'r> Take<'r> {
    /// A hit of `cost` on `key` under the namespace's limits for the key, after the
    /// checks that need no store: the key, a cost some limit could take, and that the
    /// namespace has limits (`namespace` names it in the error).
    pub fn of_key(
        ns: &'r Namespace,
        namespace: &str,
        key: &'r str,
        cost: f64,
    ) -> Result<Take<'r>, Error> {
        check_key(key)?;
        let limits = limits_of(ns, namespace)?;
        swin_core::check_cost(cost)?;
        Ok(Take {
            ns,
            key: Cow::Borrowed(key),
            cost,
            limits: Effective::Config(limits.for_key(key)),
            shadow: limits.shadow,
            count_denied: limits.count_denied,
        })
    }

    /// A hit of `cost` on `key` under `limits` (a descriptor rule's, or limits a
    /// reservation settles under), unchecked.
    pub fn under(
        ns: &'r Namespace,
        key: impl Into<Cow<'r, str>>,
        cost: f64,
        limits: Effective<'r>,
        shadow: bool,
    ) -> Take<'r> {
        Take {
            ns,
            key: key.into(),
            cost,
            limits,
            shadow,
            count_denied: false,
        }
    }

    /// The key's effective limits (its runtime limits, read by its first touch, else
    /// those it was made with), without checking the cost (a refund takes any).
    pub fn effective_limits(&mut self) {
        if let Effective::Config(config) = self.limits {
            self.limits = self.ns.effective(&self.key, config);
        }
    }

    /// Stage 3: the key's effective limits (its runtime limits, read by its first
    /// touch, else those it was made with), and whether they take its cost (in shadow
    /// no window limit refuses a cost).
    pub fn resolve(&mut self) -> Result<(), Error> {
        self.effective_limits();
        Ok(self.limits.check_cost_in(self.cost, self.shadow)?)
    }

    /// Stage 4 for this hit alone: decides it through the namespace's admission and,
    /// unless `dry_run`, spends it when allowed (and when denied too where denied hits
    /// count, or in shadow). In shadow every hit is allowed; one its limits would deny
    /// is marked.
    pub async fn take(&self, dry_run: bool) -> Result<Verdict, Error> {
        let spend = match (dry_run, self.count_denied || self.shadow) {
            (true, _) => Spend::DryRun,
            (false, false) => Spend::IfAllowed,
            (false, true) => Spend::Always,
        };
        let ns = self.ns;
        let limits: &KeyLimits = &self.limits;
        let mut a = ns
            .admission
            .take(&self.key, bounds(limits), self.cost, spend)
            .await?;
        if self.shadow && !a.decision.allowed {
            // allowed; its wait stays, as when the hit would have passed
            a.decision.allowed = true;
            a.shadow_denied = true;
        }
        crate::spans::decided(
            ns.sync.name(),
            match (a.decision.allowed, a.shadow_denied) {
                (_, true) => "shadow_denied",
                (true, _) => "allowed",
                (false, _) => "denied",
            },
        );
        if !dry_run {
            let now = swin_sync::now().secs();
            ns.heaviest.hits.add(&self.key, self.cost, now);
            // the top denied keys include those a limit in shadow would deny
            if !a.decision.allowed || a.shadow_denied {
                ns.heaviest.denied.add(&self.key, self.cost, now);
            }
        }
        Ok(verdict(limits, a))
    }

    /// Takes back this hit, allowed and then not wanted (its request was refused as a
    /// whole): exactly what it took.
    pub async fn undo(&self) -> Result<(), Error> {
        self.ns
            .admission
            .give_back(&self.key, bounds(&self.limits), self.cost, GiveBack::Undo)
            .await?;
        Ok(())
    }

    /// Gives back up to its cost of hits admitted but not used (a refund: never below
    /// zero, GCRA never past a full bucket); answers what was given and the key after
    /// it, as a dry run would see it.
    pub async fn refund(&self) -> Result<(f64, Verdict), Error> {
        let back = self
            .ns
            .admission
            .give_back(&self.key, bounds(&self.limits), self.cost, GiveBack::Refund)
            .await?;
        let after = back.after.ok_or(Error::Internal)?;
        Ok((back.given, verdict(&self.limits, after)))
    }
}

/// Stage 2: the first touch of every key of a request, one read per namespace for all
/// of its keys (see [`Namespace::first_touch`]); `counting` when the request counts
/// (not a dry run).
pub async fn touch<'a>(hits: &[(&'a Namespace, &'a str)], counting: bool) {
    let mut touched: Vec<&Namespace> = Vec::new();
    for &(ns, _) in hits {
        if touched.iter().any(|n| std::ptr::eq(*n, ns)) {
            continue;
        }
        let keys: Vec<&str> = hits
            .iter()
            .filter(|(o, _)| std::ptr::eq(*o, ns))
            .map(|&(_, k)| k)
            .collect();
        ns.first_touch(&keys, counting).await;
        touched.push(ns);
    }
}

/// Stage 2 for the takes of a request (see [`touch`]).
pub async fn touch_takes<'a, 'r: 'a>(
    takes: impl IntoIterator<Item = &'a Take<'r>>,
    counting: bool,
) {
    let keys: Vec<(&Namespace, &str)> = takes.into_iter().map(|t| (t.ns, &*t.key)).collect();
    match keys.as_slice() {
        // one key: no list of namespaces to walk
        [(ns, key)] => ns.first_touch(&[key], counting).await,
        keys => touch(keys, counting).await,
    }
}

/// Stage 4: decides every take of a request together (see [`Take::take`]), so that
/// synchronous increments and strict holds share round trips; each result in order.
pub async fn take_all<'a, 'r: 'a>(
    takes: impl IntoIterator<Item = &'a Take<'r>>,
    dry_run: bool,
) -> Vec<Result<Verdict, Error>> {
    futures_util::future::join_all(takes.into_iter().map(|t| t.take(dry_run))).await
}

/// Stage 5: gives back every take whose verdict allowed it (`Err`: it failed, nothing
/// taken), as one request refused as a whole; nothing in a dry run.
pub async fn undo_allowed<'a, 'r: 'a>(
    taken: impl IntoIterator<Item = (&'a Take<'r>, Option<&'a Verdict>)>,
    dry_run: bool,
) -> Result<(), Error> {
    if dry_run {
        return Ok(());
    }
    let back = taken
        .into_iter()
        .filter(|(_, v)| v.is_some_and(Verdict::allowed))
        .map(|(t, _)| t.undo());
    futures_util::future::join_all(back)
        .await
        .into_iter()
        .collect()
}
