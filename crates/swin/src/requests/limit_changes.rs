//! Changing a key's limits at run time: set (kept in the namespace's store, so every
//! node holds them within two sync periods; a namespace without a store keeps them on
//! this node), removed, read and listed. A key takes runtime limits where they can
//! decide: a namespace of hits with limits, or a descriptor rule that counts the key.
//! A change the store refuses (or does not confirm within `store_timeout`) is an error
//! and never lands later: it carries a deadline in the store's time. A change whose
//! reply is lost (the store may have applied it) is sent again within `store_timeout`
//! — a PUT sets the same limits again — and, its outcome still unknown, is 503
//! `outcome_unknown`, never "nothing was changed".

use swin_core::UnixMs;
use swin_sync::store::StoredLimit;
use swin_sync::StoreError;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::known::{until_known, Outcome};
use crate::pipeline::{Plan, Ran, Request};
use crate::policy::input::check_key;
use crate::policy::limits::{RawGcra, RawKeyLimits, RawLimit};
use crate::policy::rules::{RuleLimit, Rules};
use crate::runtime_limits::RuntimeLimit;
use crate::state::Namespace;

/// The longest `expires_in`: ten years.
pub(crate) const MAX_EXPIRES_IN_SECS: f64 = 10.0 * 365.0 * 86_400.0;

/// A change of a key's limits, as a client sends it: JSON (or any serde format) of
/// `limits` (window limits) or `gcra` (a bucket), the shape the namespace's algorithm
/// takes, and `expires_in` seconds (never when left out); nothing else. Who made it is
/// kept beside it ([`Change::by`]).
///
/// ```
/// let change: swin::requests::Change =
///     serde_json::from_str(r#"{"limits": [{"window_size": 3600, "limit": 2}], "expires_in": 60}"#)
///         .expect("a change");
/// let change = change.by("ops");
/// # let _ = change;
/// ```
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(from = "ChangeBody")]
pub struct Change {
    /// The limits, in the shape the namespace's algorithm takes (window limits, or a
    /// GCRA bucket).
    pub(crate) limits: RawKeyLimits,
    /// Seconds until the limits lapse (`None`: never).
    pub(crate) expires_in: Option<f64>,
    /// Who made the change (a token's name), kept beside it.
    pub(crate) set_by: String,
}

/// A change's fields as a client writes them.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangeBody {
    #[serde(default)]
    limits: Vec<RawLimit>,
    gcra: Option<RawGcra>,
    expires_in: Option<f64>,
}

impl From<ChangeBody> for Change {
    fn from(b: ChangeBody) -> Change {
        Change {
            limits: RawKeyLimits::new(b.limits, b.gcra),
            expires_in: b.expires_in,
            set_by: String::new(),
        }
    }
}

impl Change {
    /// The same change, made by `who` (a token's name, say).
    pub fn by(self, who: impl Into<String>) -> Change {
        Change {
            set_by: who.into(),
            ..self
        }
    }
}

/// Whether `key` of `namespace` can take runtime limits: the key is valid, the namespace
/// limits hits (not leases) and has limits or descriptor rules, and — a namespace of
/// rules only — a rule counts the key.
pub(crate) fn check_target(ns: &Namespace, namespace: &str, key: &str) -> Result<(), Error> {
    check_key(key)?;
    takes_limits(ns, namespace)
}

/// Whether the namespace can take runtime limits (see [`check_target`]): every limits
/// call on one that cannot, a list too, is a 400 saying why.
fn takes_limits(ns: &Namespace, namespace: &str) -> Result<(), Error> {
    if ns.concurrency.is_some() {
        return Err(Error::BadRequest(format!(
            "namespace {namespace:?} limits requests in flight: runtime limits are limits of hits"
        )));
    }
    match (&ns.limits, &ns.rules) {
        (None, None) => Err(Error::BadRequest(format!(
            "namespace {namespace:?} has no limits to decide against: runtime limits need a namespace with limits or descriptor rules"
        ))),
        _ => Ok(()),
    }
}

/// In a namespace of descriptor rules, a runtime limit replaces the limits of the rule
/// its counter key's descriptor finds; a key no such rule counts (no rule matches, or it
/// is `unlimited` or blocks every request) would change nothing: a 400 saying why.
fn counted_by_a_rule(rules: &Rules, namespace: &str, key: &str) -> Result<(), Error> {
    let refuse = |why: String| {
        Err(Error::BadRequest(format!(
            "key {key:?} of namespace {namespace:?} {why}: a runtime limit there would change nothing"
        )))
    };
    let Some(entries) = crate::policy::keys::entries_of(key) else {
        return refuse(
            "is no descriptor's counter key (`key=value|…`, as the rate limit service writes it)"
                .into(),
        );
    };
    let entries: Vec<(&str, &str)> = entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    match rules
        .find(&entries)
        .map(|r| (r.path.clone(), r.limit.clone()))
    {
        None => refuse("matches no descriptor rule".into()),
        Some((path, RuleLimit::Unlimited)) => {
            refuse(format!("matches rule {path:?}, which is unlimited"))
        }
        Some((path, RuleLimit::Blocked)) => refuse(format!(
            "matches rule {path:?}, which blocks every request (requests_per_unit: 0)"
        )),
        Some(_) => Ok(()),
    }
}

/// Sets `key`'s limits from now on; answers what was stored.
async fn set(
    ns: &Namespace,
    namespace: &str,
    key: &str,
    change: Change,
) -> Result<StoredLimit, Error> {
    check_target(ns, namespace, key)?;
    if let (None, Some(rules)) = (&ns.limits, &ns.rules) {
        counted_by_a_rule(rules, namespace, key)?;
    }
    let sizes: Vec<_> = ns.sync.counters().window_sizes().collect();
    let limits = change
        .limits
        .validate(ns.algorithm, &sizes)
        .map_err(|(field, why)| Error::BadRequest(format!("{field}: {why}")))?;
    if limits.has_shadow()
        && matches!(
            ns.admission_mode,
            crate::config::AdmissionMode::Strict { .. }
        )
    {
        return Err(Error::BadRequest(format!(
            "limits: {}",
            crate::config::STRICT_SHADOW
        )));
    }
    let now = swin_sync::now();
    let expires_at = match change.expires_in {
        None => None,
        Some(s) if s.is_finite() && s > 0.0 && s <= MAX_EXPIRES_IN_SECS => {
            Some(UnixMs(now.0 + (s * 1e3).ceil() as i64))
        }
        Some(s) => {
            return Err(Error::BadRequest(format!(
            "expires_in: {s} is not a number of seconds above 0 and at most {MAX_EXPIRES_IN_SECS}"
        )))
        }
    };
    let stored = StoredLimit {
        key: key.to_owned(),
        limits: serde_json::to_string(&change.limits).map_err(|_| Error::Internal)?,
        expires_at,
        set_by: change.set_by,
        set_at: now,
    };
    let (put, _) = until_stored(ns, |w| ns.sync.put_limit(&stored, w)).await;
    match put {
        Outcome::Known(()) => {}
        Outcome::NotApplied(e) => return Err(Error::store(&e, "runtime limits not set")),
        Outcome::Unknown(e) => {
            tracing::warn!(cause = %e, key, "setting runtime limits: the outcome is unknown");
            return Err(Error::OutcomeUnknown(format!(
                "setting the runtime limits of key {key:?}: the store may have set them, but its reply was lost and asking again within store_timeout did not tell: read them (GET, `set_at` says which change holds) or send the same PUT again (it sets the same limits)"
            )));
        }
    }
    ns.runtime.remember(
        key,
        Some(RuntimeLimit {
            limits,
            stored: stored.clone(),
        }),
    );
    ns.recorder().limit_change(namespace, "set");
    Ok(stored)
}

/// Removes `key`'s runtime limits (the config's decide again); whether it had some.
async fn remove(ns: &Namespace, namespace: &str, key: &str) -> Result<bool, Error> {
    check_target(ns, namespace, key)?;
    let had = if ns.sync.keeps_limits_in_store() {
        let (deleted, lost) = until_stored(ns, |w| ns.sync.delete_limit(key, w)).await;
        match deleted {
            Outcome::Known(true) => true,
            // an earlier attempt may have removed them: what this one found tells
            // nothing of what the request did
            Outcome::Known(false) if lost => {
                ns.runtime.remember(key, None);
                return Err(Error::OutcomeUnknown(format!(
                    "removing the runtime limits of key {key:?}: the key has none now (the config's limits decide), but the store's reply to a first attempt was lost, so whether this request removed them or the key had none is unknown; nothing more to do"
                )));
            }
            Outcome::Known(false) => false,
            Outcome::NotApplied(e) => return Err(Error::store(&e, "runtime limits not deleted")),
            Outcome::Unknown(e) => {
                tracing::warn!(cause = %e, key, "removing runtime limits: the outcome is unknown");
                return Err(Error::OutcomeUnknown(format!(
                    "removing the runtime limits of key {key:?}: the store may have removed them, but its reply was lost and asking again within store_timeout did not tell: read them (GET) or send the DELETE again (the key has none after it)"
                )));
            }
        }
    } else {
        ns.runtime.get(key, swin_sync::now()).is_some()
    };
    ns.runtime.remember(key, None);
    if had {
        ns.recorder().limit_change(namespace, "deleted");
    }
    Ok(had)
}

/// Sends a change of runtime limits (given the time left to wait for it) until the
/// store answers, within `store_timeout` (an operator's change: `answer_timeout` does
/// not bound it): what it came to, and whether an attempt's reply was lost (the store
/// may have applied that attempt). A change that timed out may have been applied too (in
/// time, its reply late): its deadline only keeps it from landing later.
async fn until_stored<T, F, Fut>(ns: &Namespace, mut change: F) -> (Outcome<T>, bool)
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let lost = AtomicBool::new(false);
    let noted = &lost;
    let r = until_known(ns.sync.store_timeout(), |w| {
        let attempt = change(w);
        async move {
            let r = attempt.await;
            if r.as_ref().is_err_and(StoreError::may_have_run) {
                noted.store(true, Ordering::Relaxed);
            }
            r
        }
    })
    .await;
    (r, lost.load(Ordering::Relaxed))
}

/// `key`'s runtime limits live now, as the store holds them (this node may not serve
/// the key); without a store, as this node does.
async fn read(ns: &Namespace, namespace: &str, key: &str) -> Result<Option<StoredLimit>, Error> {
    check_target(ns, namespace, key)?;
    let now = swin_sync::now();
    if !ns.sync.keeps_limits_in_store() {
        return Ok(ns.runtime.get(key, now).map(|r| r.stored.clone()));
    }
    Ok(ns
        .sync
        .read_limits(&[key])
        .await
        .map_err(|e| Error::store(&e, "runtime limits not read"))?
        .into_iter()
        .find(|l| l.live_at(now)))
}

/// Up to `count` keys' live runtime limits after `after`, in key order.
async fn list(
    ns: &Namespace,
    after: Option<&str>,
    count: usize,
) -> Result<Vec<StoredLimit>, Error> {
    let now = swin_sync::now();
    if !ns.sync.keeps_limits_in_store() {
        return Ok(ns.runtime.list(after, count, now));
    }
    ns.sync
        .list_limits(after, count, now)
        .await
        .map_err(|e| Error::store(&e, "runtime limits not listed"))
}

/// What a request does to runtime limits.
#[derive(Debug)]
pub(crate) enum Op {
    /// Sets a key's limits.
    Set(Change),
    /// Removes a key's limits.
    Remove,
    /// Reads a key's limits.
    Read,
    /// Lists up to `count` keys' limits after `after`.
    List(Option<String>, usize),
}

/// What it answers.
#[derive(Debug)]
pub(crate) enum Changed {
    /// What was stored.
    Set(StoredLimit),
    /// Whether the key had limits.
    Removed(bool),
    /// The key's limits.
    Read(Option<StoredLimit>),
    /// A page of keys' limits.
    Listed(Vec<StoredLimit>),
}

/// A change (or a read) of runtime limits: its key checked, then done; a change in the
/// store runs to its end once started.
#[derive(Debug)]
pub(crate) struct LimitChange {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) key: String,
    pub(crate) op: Op,
}

impl Request for LimitChange {
    type Answer = Changed;
    type Acted = Changed;

    fn waits_on_store(&self) -> bool {
        matches!(self.op, Op::Set(_) | Op::Remove) && self.ns.sync.keeps_limits_in_store()
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        let name = self.ns.sync.name();
        match &self.op {
            Op::List(after, _) => {
                takes_limits(&self.ns, name)?;
                // a cursor is a key (or empty: the first page)
                if let Some(after) = after.as_deref().filter(|a| !a.is_empty()) {
                    check_key(after).map_err(|e| e.at("after"))?;
                }
            }
            _ => check_target(&self.ns, name, &self.key)?,
        }
        Ok(Plan::nothing())
    }

    async fn act(&self, _: &Plan<'_>) -> Result<Changed, Error> {
        let (ns, name, key) = (&*self.ns, self.ns.sync.name(), self.key.as_str());
        Ok(match &self.op {
            Op::Set(change) => Changed::Set(set(ns, name, key, change.clone()).await?),
            Op::Remove => Changed::Removed(remove(ns, name, key).await?),
            Op::Read => Changed::Read(read(ns, name, key).await?),
            Op::List(after, count) => Changed::Listed(list(ns, after.as_deref(), *count).await?),
        })
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<Changed>) -> Result<Changed, Error> {
        ran.acted.ok_or(Error::Internal)
    }
}
