//! A hit as an ask of the pipeline (see [`super`]): checked, resolved against its
//! key's effective limits, taken through its namespace's admission (shadow applied here
//! and only here), undone when its request is refused as a whole.

use std::borrow::Cow;

use swin_core::UnixMs;
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
pub(crate) struct Take<'r> {
    /// Its namespace.
    pub(crate) ns: &'r Namespace,
    /// The counter key.
    pub(crate) key: Cow<'r, str>,
    /// What it costs.
    pub(crate) cost: f64,
    /// The limits it is decided under.
    pub(crate) limits: Effective<'r>,
    /// In shadow (its namespace, or its descriptor rule): allowed whatever its counts say,
    /// and marked when they would deny it.
    pub(crate) shadow: bool,
    /// Denied hits count too (the namespace's `count_denied`).
    pub(crate) count_denied: bool,
    /// The policy its decision is recorded under, when not its limit's (a descriptor
    /// rule's name).
    pub(crate) policy: Option<std::sync::Arc<str>>,
    /// Its cost is more than its limits take at once: not taken, over the limit.
    pub(crate) blocked: bool,
}

impl<'r> Take<'r> {
    /// A hit of `cost` on `key` under the namespace's limits for the key, after the
    /// checks that need no store: the key, a cost some limit could take, and that the
    /// namespace has limits (`namespace` names it in the error).
    pub(crate) fn of_key(
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
            policy: None,
            blocked: false,
        })
    }

    /// A hit of `cost` on `key` under `limits` (a descriptor rule's, or limits a
    /// reservation settles under), unchecked.
    pub(crate) fn under(
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
            policy: None,
            blocked: false,
        }
    }

    /// The key's effective limits (its runtime limits, read by its first touch, else
    /// those it was made with), without checking the cost (a refund takes any).
    pub(crate) fn effective_limits(&mut self) {
        if let Effective::Config(config) = self.limits {
            self.limits = self.ns.effective(&self.key, config);
        }
    }

    /// Stage 3: the key's effective limits (its runtime limits, read by its first
    /// touch, else those it was made with), and whether they take its cost (in shadow
    /// no window limit refuses a cost).
    pub(crate) fn resolve(&mut self) -> Result<(), Error> {
        self.effective_limits();
        Ok(self.limits.check_cost_in(self.cost, self.shadow)?)
    }

    /// Stage 4 for this hit alone: decides it through the namespace's admission and,
    /// unless `dry_run`, spends it when allowed (and when denied too where denied hits
    /// count, or in shadow). In shadow every hit is allowed; one its limits would deny
    /// is marked.
    pub(crate) async fn take(&self, dry_run: bool) -> Result<Verdict, Error> {
        self.take_at(dry_run, swin_sync::now()).await
    }

    /// [`Take::take`] at `at` (the engine's clock): the time its request's asks are
    /// taken at, which an undo of it gives again ([`Take::undo`]).
    pub(crate) async fn take_at(&self, dry_run: bool, at: UnixMs) -> Result<Verdict, Error> {
        let spend = match (dry_run, self.count_denied || self.shadow) {
            (true, _) => Spend::DryRun,
            (false, false) => Spend::IfAllowed,
            (false, true) => Spend::Always,
        };
        let ns = self.ns;
        let limits: &KeyLimits = &self.limits;
        let mut a = ns
            .admission
            .take(&self.key, bounds(limits), self.cost, spend, at)
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
            let now = at.secs();
            ns.heaviest.hits.add(&self.key, self.cost, now);
            // the top denied keys include those a limit in shadow would deny
            if !a.decision.allowed || a.shadow_denied {
                ns.heaviest.denied.add(&self.key, self.cost, now);
            }
        }
        Ok(verdict(limits, a))
    }

    /// Takes back this hit, taken at `at` and then not wanted (its request was refused
    /// as a whole, or its answer failed): exactly what it took, in the windows it
    /// counted in.
    pub(crate) async fn undo(&self, at: UnixMs) -> Result<(), Error> {
        self.ns
            .admission
            .give_back(
                &self.key,
                bounds(&self.limits),
                self.cost,
                GiveBack::Undo { at },
            )
            .await?;
        Ok(())
    }

    /// Gives back up to its cost of hits admitted but not used (a refund: never below
    /// zero, GCRA never past a full bucket); answers what was given and the key after
    /// it, as a dry run would see it.
    pub(crate) async fn refund(&self) -> Result<(f64, Verdict), Error> {
        self.give_back(GiveBack::Refund).await
    }

    /// Gives back up to its cost of a reservation's estimate not used ([`Take::refund`]
    /// but from the previous window too for what the current one cannot take back: the
    /// reserve counted there when its stream crossed a window's end).
    pub(crate) async fn settle(&self) -> Result<(f64, Verdict), Error> {
        self.give_back(GiveBack::Settle).await
    }

    /// Gives back up to its cost of a reservation's total not used, in the windows of
    /// `at`, the time one of its takes counted at ([`Take::refund`] in those windows).
    pub(crate) async fn settle_at(&self, at: UnixMs) -> Result<(f64, Verdict), Error> {
        self.give_back(GiveBack::SettleAt { at }).await
    }

    async fn give_back(&self, why: GiveBack) -> Result<(f64, Verdict), Error> {
        let back = self
            .ns
            .admission
            .give_back(&self.key, bounds(&self.limits), self.cost, why)
            .await?;
        let after = back.after.ok_or(Error::Internal)?;
        Ok((back.given, verdict(&self.limits, after)))
    }
}
