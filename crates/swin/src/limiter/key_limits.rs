//! A key's limits as they decide now, and where they come from: an override set at run
//! time (who set it, when, until when), or the config (the namespace's limits, the
//! file's overrides). Stored limits the namespace cannot hold (written by hand, or set
//! before its window sizes or algorithm changed) do not decide: the view is the
//! config's, with `ignored` saying what was stored.

use serde::Serialize;
use swin_sync::store::StoredLimit;

use super::Limiter;
use crate::error::Error;
use crate::policy::limits::{RawGcra, RawKeyLimits, RawLimit};
use crate::requests::Change;
use crate::state::Namespace;

/// A key's limits as they decide now, and where they come from, a document
/// (`GET …/keys/{key}/limits` answers it as it serializes): `namespace`, `key`, `source`
/// (`override`, set at run time, or `config`), the window `limits` (none on a GCRA
/// namespace) or the `gcra` bucket, an override's `expires_at` (Unix seconds; none:
/// never), who set it (`set_by`) and when (`set_at`), where the namespace keeps its
/// overrides (`kept`: `store`, every node holds them, or `node`), and stored limits the
/// namespace cannot hold (`ignored`, as stored: they do not decide).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct KeyLimitsView {
    /// The namespace.
    namespace: String,
    /// The key.
    key: String,
    /// `override` (set at run time) or `config`.
    source: &'static str,
    /// The window limits (none on a GCRA namespace).
    limits: Vec<RawLimit>,
    /// The bucket, on a GCRA namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    gcra: Option<RawGcra>,
    /// Unix seconds when an override lapses; none: never (or from the config).
    expires_at: Option<f64>,
    /// Who set the override.
    #[serde(skip_serializing_if = "Option::is_none")]
    set_by: Option<String>,
    /// When the override was set (Unix seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    set_at: Option<f64>,
    /// Where overrides of this namespace are kept: `store` (every node holds them) or
    /// `node` (a namespace without a store: this node only).
    kept: &'static str,
    /// Stored limits this namespace cannot hold, as stored (they do not decide).
    #[serde(skip_serializing_if = "Option::is_none")]
    ignored: Option<String>,
}

impl Limiter {
    /// Sets `key`'s limits from now on (kept in the namespace's store: every node holds
    /// them within two sync periods); answers the key's limits as they now decide.
    pub async fn set_limits(
        &self,
        namespace: &str,
        key: &str,
        change: Change,
    ) -> Result<KeyLimitsView, Error> {
        let stored = self.set_stored_limits(namespace, key, change).await?;
        let ns = self.namespace(namespace)?;
        Ok(view(&ns, namespace, key, Some(&stored)))
    }

    /// `key`'s limits as they decide now: its runtime limits live, as the store holds
    /// them, or the config's.
    pub async fn limits(&self, namespace: &str, key: &str) -> Result<KeyLimitsView, Error> {
        let stored = self.stored_limits(namespace, key).await?;
        let ns = self.namespace(namespace)?;
        Ok(view(&ns, namespace, key, stored.as_ref()))
    }

    /// Up to `count` keys with live runtime limits after `after`, in key order.
    pub async fn list_limits(
        &self,
        namespace: &str,
        after: Option<&str>,
        count: usize,
    ) -> Result<Vec<KeyLimitsView>, Error> {
        let page = self.list_stored_limits(namespace, after, count).await?;
        let ns = self.namespace(namespace)?;
        Ok(page
            .iter()
            .map(|l| view(&ns, namespace, &l.key, Some(l)))
            .collect())
    }
}

fn secs(t: swin_core::UnixMs) -> f64 {
    t.0 as f64 / 1e3
}

/// Where `ns` keeps its overrides: `store` or `node`.
pub(crate) fn kept(ns: &Namespace) -> &'static str {
    if ns.keeps_limits_in_store() {
        "store"
    } else {
        "node"
    }
}

/// The key's view from its runtime limits, or from the config's when it has none (or
/// none the namespace can hold).
fn view(
    ns: &Namespace,
    namespace: &str,
    key: &str,
    runtime: Option<&StoredLimit>,
) -> KeyLimitsView {
    let base = |source, raw: RawKeyLimits| {
        let (limits, gcra) = raw.into_parts();
        KeyLimitsView {
            namespace: namespace.to_owned(),
            key: key.to_owned(),
            source,
            limits,
            gcra,
            expires_at: None,
            set_by: None,
            set_at: None,
            kept: kept(ns),
            ignored: None,
        }
    };
    let held = runtime.map(|s| (s, ns.runtime_limits_of(s)));
    match held {
        Some((stored, Some(limits))) => KeyLimitsView {
            expires_at: stored.expires_at.map(secs),
            set_by: Some(stored.set_by.clone()),
            set_at: Some(secs(stored.set_at)),
            ..base("override", RawKeyLimits::of(&limits))
        },
        _ => {
            let config = ns
                .limits()
                .as_ref()
                .map(|l| RawKeyLimits::of(l.for_key(key)))
                // a namespace of descriptor rules: the descriptor's rule decides
                .unwrap_or_default();
            KeyLimitsView {
                ignored: held.map(|(stored, _)| stored.limits.clone()),
                ..base("config", config)
            }
        }
    }
}
