//! The `[[namespaces]]` entries: window sizes, sync mode, store, table size, and the
//! limits (validated by [`crate::policy::limits`]).

use std::collections::BTreeMap;

use serde::Deserialize;
use swin_core::WindowSize;
use swin_sync::SyncMode;

use super::concurrency::{
    DEFAULT_LEASE_TTL_SECS, MAX_CONCURRENCY, MAX_LEASE_TTL_SECS, MIN_TTL_SECS,
};
use super::{AdmissionMode, Concurrency, Parser, StoreConfig};
use crate::config::ConfigError;
use crate::policy::limits::{RawGcra, RawLimit, RawLimits, RawOverride};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNamespace {
    pub(super) name: String,
    #[serde(default)]
    pub(super) window_sizes: Vec<i64>,
    pub(super) sync_rate: f64,
    pub(super) store: Option<String>,
    pub(super) max_counters: Option<usize>,
    pub(super) algorithm: Option<String>,
    #[serde(default)]
    pub(super) limits: Vec<RawLimit>,
    pub(super) gcra: Option<RawGcra>,
    pub(super) count_denied: Option<bool>,
    pub(super) key_from: Option<String>,
    #[serde(default)]
    pub(super) overrides: Vec<RawOverride>,
    pub(super) allow_decrements: Option<bool>,
    pub(super) admission: Option<String>,
    pub(super) on_store_failure: Option<String>,
    /// Envoy's rate limit service: envoyproxy/ratelimit descriptor rules, inline…
    #[serde(default)]
    pub(super) descriptors: Vec<crate::policy::rules::RawRule>,
    /// …or in its YAML file (whose `domain` is this namespace).
    pub(super) descriptors_file: Option<String>,
    /// RateLimit headers in Envoy's `response_headers_to_add` (default true).
    pub(super) envoy_response_headers: Option<bool>,
    /// envoyproxy/ratelimit's dynamic metadata in Envoy's answers (default false).
    pub(super) envoy_dynamic_metadata: Option<bool>,
    /// `algorithm = "concurrency"`: leases in flight per key…
    pub(super) limit: Option<i64>,
    /// …and how long a lease lives unless renewed (seconds, default 30).
    pub(super) lease_ttl: Option<f64>,
    /// Every limit (and descriptor rule) decides and counts but never denies.
    pub(super) shadow: Option<bool>,
    /// How long a retried request is answered with its first answer (seconds)…
    pub(super) idempotency_ttl: Option<f64>,
    /// …how many such records the namespace keeps at most…
    pub(super) idempotency_max_keys: Option<i64>,
    /// …and how many of them one client may hold.
    pub(super) idempotency_max_keys_per_client: Option<i64>,
    /// Reservations open at once in the namespace at most…
    pub(super) reservations_max_open: Option<i64>,
    /// …and held by one client.
    pub(super) reservations_max_open_per_client: Option<i64>,
    /// A commit above its estimate: `"debt"` (charged in full) or `"cap"`.
    pub(super) overrun: Option<String>,
}

/// One `[[namespaces]]` entry, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceConfig {
    /// Its name, in routes and store keys.
    pub(crate) name: String,
    /// The window sizes it counts in (`window_sizes`, with its rules' sizes).
    pub(crate) window_sizes: Vec<WindowSize>,
    /// How it syncs (`sync_rate`): periodic, synchronous or local only.
    pub(crate) mode: SyncMode,
    /// `None` exactly when the namespace is local only.
    pub(crate) store: Option<String>,
    /// The most counters (key × window size) it keeps in memory (`max_counters`).
    pub(crate) max_counters: usize,
    /// Limits that `/hit` decides against; `None` when the namespace only counts.
    pub(crate) limits: Option<crate::policy::limits::Limits>,
    /// `/increment` takes negative values (default false).
    pub(crate) allow_decrements: bool,
    /// `admission` (and `on_store_failure`).
    pub(crate) admission: AdmissionMode,
    /// What the namespace's limits and rules count with: windows or GCRA buckets.
    pub(crate) algorithm: crate::policy::algorithm::Algorithm,
    /// Descriptor rules for Envoy's rate limit service (`descriptors`,
    /// `descriptors_file`); none when the namespace has neither.
    pub(crate) rules: Option<std::sync::Arc<crate::policy::rules::Rules>>,
    /// Envoy's answers carry the RateLimit headers (`envoy_response_headers`).
    pub(crate) envoy_response_headers: bool,
    /// Envoy's answers carry dynamic metadata (`envoy_dynamic_metadata`).
    pub(crate) envoy_dynamic_metadata: bool,
    /// `algorithm = "concurrency"`: the namespace limits leases in flight, not hits.
    pub(crate) concurrency: Option<Concurrency>,
    /// Idempotency records: how long, how many (`idempotency_ttl`,
    /// `idempotency_max_keys`).
    pub(crate) idempotency: super::Idempotency,
    /// Open reservations at most, in the namespace and per client
    /// (`reservations_max_open`, `reservations_max_open_per_client`).
    pub(crate) reservation_caps: super::ReservationCaps,
}

impl NamespaceConfig {
    /// Its name, in routes and store keys.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limits hits are decided against; `None` when the namespace only counts.
    #[cfg(test)]
    pub(crate) fn limits(&self) -> Option<&crate::policy::limits::Limits> {
        self.limits.as_ref()
    }
}

impl Parser<'_> {
    /// Validates every namespace; `max_counters` is the top-level default.
    pub(super) fn namespaces(
        &self,
        raw: Vec<RawNamespace>,
        stores: &BTreeMap<String, StoreConfig>,
        max_counters: usize,
    ) -> Result<Vec<NamespaceConfig>, ConfigError> {
        let mut namespaces: Vec<NamespaceConfig> = Vec::new();
        for (i, n) in raw.into_iter().enumerate() {
            let field = |k: &str| format!("namespaces[{i}].{k}");
            if n.name.is_empty() || n.name.len() > 256 {
                return Err(self.err(&field("name"), "must be 1 to 256 bytes".into()));
            }
            if namespaces.iter().any(|o| o.name == n.name) {
                return Err(self.err(&field("name"), format!("{:?} is defined twice", n.name)));
            }
            namespaces.push(self.namespace(n, &field, stores, max_counters)?);
        }
        if namespaces.is_empty() {
            // an empty or cut-off file must not take every namespace away on a reload
            return Err(self.err(
                "namespaces",
                "needs at least one [[namespaces]] entry".into(),
            ));
        }
        Ok(namespaces)
    }

    fn namespace(
        &self,
        mut n: RawNamespace,
        f: &dyn Fn(&str) -> String,
        stores: &BTreeMap<String, StoreConfig>,
        default_max: usize,
    ) -> Result<NamespaceConfig, ConfigError> {
        let algorithm = crate::policy::algorithm::Algorithm::parse(n.algorithm.as_deref())
            .map_err(|(field, why)| self.err(&f(&field), why))?;
        let concurrency = self.concurrency(&mut n, algorithm, f)?;
        let rules = self.rules(&n, algorithm, concurrency.is_some(), f)?;
        let sizes = self.sizes(&n, algorithm, rules.as_deref(), concurrency.is_some(), f)?;
        let (mode, store) = self.sync(&mut n, stores, f)?;
        let max_counters = n.max_counters.unwrap_or(default_max);
        if max_counters == 0 {
            return Err(self.err(&f("max_counters"), "must be above 0".into()));
        }
        let admission = self.admission(&n.admission, &n.on_store_failure, f)?;
        let idempotency = self.idempotency(
            n.idempotency_ttl,
            n.idempotency_max_keys,
            n.idempotency_max_keys_per_client,
            f,
        )?;
        let reservation_caps = self.reservation_caps(
            n.reservations_max_open,
            n.reservations_max_open_per_client,
            f,
        )?;
        let shadow = n.shadow;
        let limits = self.limits(&mut n, rules.is_some(), &sizes, f)?;
        self.strict(
            &admission,
            &limits,
            rules.is_some(),
            store.is_some(),
            shadow,
            f,
        )?;
        Ok(NamespaceConfig {
            name: n.name,
            window_sizes: sizes,
            mode,
            store,
            max_counters,
            limits,
            allow_decrements: n.allow_decrements.unwrap_or(false),
            admission,
            algorithm,
            rules,
            envoy_response_headers: n.envoy_response_headers.unwrap_or(true),
            envoy_dynamic_metadata: n.envoy_dynamic_metadata.unwrap_or(false),
            concurrency,
            idempotency,
            reservation_caps,
        })
    }

    /// Envoy's descriptor rules (`descriptors`, `descriptors_file`), if any: of hits, or
    /// of slots in flight on a concurrency namespace (Envoy's starts and negative hits).
    fn rules(
        &self,
        n: &RawNamespace,
        algorithm: crate::policy::algorithm::Algorithm,
        concurrency: bool,
        f: &dyn Fn(&str) -> String,
    ) -> Result<Option<std::sync::Arc<crate::policy::rules::Rules>>, ConfigError> {
        if n.descriptors.is_empty() && n.descriptors_file.is_none() {
            return Ok(None);
        }
        let file = n.descriptors_file.as_deref().map(std::path::Path::new);
        let rules = if concurrency {
            crate::policy::rules::Rules::load_concurrency(&n.name, &n.descriptors, file)
        } else {
            crate::policy::rules::Rules::load(&n.name, &n.descriptors, file, algorithm)
        }
        .map_err(|e| match &n.descriptors_file {
            Some(_) if !e.starts_with("descriptors") => self.err(&f("descriptors_file"), e),
            _ => self.err(&f("descriptors"), e),
        })?;
        // a namespace of rules only may count denied hits as envoyproxy/ratelimit
        // does; with limits of its own, its limits' `count_denied` is the rules' too
        Ok(Some(std::sync::Arc::new(
            rules
                .counting_denied(n.count_denied.unwrap_or(false))
                .shadowed(n.shadow == Some(true)),
        )))
    }

    /// The window sizes it counts in: its own and its rules'.
    fn sizes(
        &self,
        n: &RawNamespace,
        algorithm: crate::policy::algorithm::Algorithm,
        rules: Option<&crate::policy::rules::Rules>,
        concurrency: bool,
        f: &dyn Fn(&str) -> String,
    ) -> Result<Vec<WindowSize>, ConfigError> {
        // a GCRA namespace needs no windows (it may still count in some), nor one whose
        // rules come from descriptors
        if n.window_sizes.is_empty()
            && algorithm != crate::policy::algorithm::Algorithm::Gcra
            && rules.is_none()
            && !concurrency
        {
            return Err(self.err(&f("window_sizes"), "needs at least one window size".into()));
        }
        let mut sizes = self.window_sizes(&n.window_sizes, &f("window_sizes"))?;
        // (a concurrency namespace's rules count in no window)
        if let Some(r) = rules.filter(|_| !concurrency) {
            for s in r.window_sizes() {
                let size =
                    WindowSize::new(s).map_err(|e| self.err(&f("descriptors"), e.to_string()))?;
                if !sizes.contains(&size) {
                    sizes.push(size);
                }
            }
        }
        Ok(sizes)
    }

    /// How it syncs (`sync_rate`) and with which store (none when local only).
    fn sync(
        &self,
        n: &mut RawNamespace,
        stores: &BTreeMap<String, StoreConfig>,
        f: &dyn Fn(&str) -> String,
    ) -> Result<(SyncMode, Option<String>), ConfigError> {
        let mode = SyncMode::from_rate(n.sync_rate)
            .ok_or_else(|| self.err(&f("sync_rate"), "must be a finite number".into()))?;
        let store = match (mode, n.store.take()) {
            (SyncMode::LocalOnly, _) => None,
            (_, None) => {
                return Err(self.err(
                    &f("store"),
                    "is required unless sync_rate < 0 (local only)".into(),
                ))
            }
            (_, Some(s)) if !stores.contains_key(&s) => {
                return Err(self.err(
                    &f("store"),
                    format!(
                        "{s:?} is not one of [stores]: {:?}",
                        stores.keys().collect::<Vec<_>>()
                    ),
                ))
            }
            (_, Some(s)) => Some(s),
        };
        Ok((mode, store))
    }

    /// Its limits of hits, if any (`limits`, `gcra`, `overrides` and their settings).
    fn limits(
        &self,
        n: &mut RawNamespace,
        has_rules: bool,
        sizes: &[WindowSize],
        f: &dyn Fn(&str) -> String,
    ) -> Result<Option<crate::policy::limits::Limits>, ConfigError> {
        // `algorithm` alone, beside descriptor rules, is the rules' kind
        let rules_only = has_rules && n.limits.is_empty() && n.gcra.is_none();
        let raw = RawLimits {
            algorithm: if rules_only { None } else { n.algorithm.take() },
            limits: std::mem::take(&mut n.limits),
            gcra: n.gcra.take(),
            count_denied: if rules_only { None } else { n.count_denied },
            key_from: n.key_from.take(),
            overrides: std::mem::take(&mut n.overrides),
            shadow: if rules_only { None } else { n.shadow },
            overrun: n.overrun.take(),
        };
        crate::policy::limits::validate(raw, sizes)
            .map_err(|(field, why)| self.err(&f(&field), why))
    }

    fn window_sizes(&self, raw: &[i64], field: &str) -> Result<Vec<WindowSize>, ConfigError> {
        let mut sizes = Vec::new();
        for s in raw {
            let size = u64::try_from(*s)
                .ok()
                .and_then(|s| WindowSize::new(s).ok())
                .ok_or_else(|| {
                    self.err(
                        field,
                        format!(
                            "{s} is not between 1 and {} seconds",
                            swin_core::MAX_WINDOW_SIZE_SECS
                        ),
                    )
                })?;
            if sizes.contains(&size) {
                return Err(self.err(field, format!("{s} is listed twice")));
            }
            sizes.push(size);
        }
        Ok(sizes)
    }
}

impl Parser<'_> {
    /// `algorithm = "concurrency"` with its `limit` and `lease_ttl` (its raw
    /// `algorithm` taken out of `n`: no limits of hits are read in its shape); `limit`
    /// and `lease_ttl` belong to such a namespace only, and limits of hits do not.
    pub(super) fn concurrency(
        &self,
        n: &mut RawNamespace,
        algorithm: crate::policy::algorithm::Algorithm,
        f: &dyn Fn(&str) -> String,
    ) -> Result<Option<Concurrency>, ConfigError> {
        if algorithm != crate::policy::algorithm::Algorithm::Concurrency {
            for (set, key) in [
                (n.limit.is_some(), "limit"),
                (n.lease_ttl.is_some(), "lease_ttl"),
            ] {
                if set {
                    return Err(self.err(&f(key), "only with algorithm = \"concurrency\"".into()));
                }
            }
            return Ok(None);
        }
        n.algorithm = None;
        let hits_only = [
            (!n.limits.is_empty(), "limits"),
            (n.gcra.is_some(), "gcra"),
            (!n.overrides.is_empty(), "overrides"),
            (n.admission.is_some(), "admission"),
            (n.on_store_failure.is_some(), "on_store_failure"),
            (n.count_denied.is_some(), "count_denied"),
            (n.key_from.is_some(), "key_from"),
            (n.shadow.is_some(), "shadow"),
            (n.overrun.is_some(), "overrun"),
        ];
        if let Some((_, key)) = hits_only.iter().find(|(set, _)| *set) {
            return Err(self.err(
                &f(key),
                "limits hits; a concurrency namespace limits leases in flight (`limit`)".into(),
            ));
        }
        let limit = match n.limit {
            Some(l) if (1..=MAX_CONCURRENCY as i64).contains(&l) => l as u64,
            Some(l) => {
                return Err(self.err(
                    &f("limit"),
                    format!("{l} is not between 1 and {MAX_CONCURRENCY}"),
                ))
            }
            None => {
                return Err(self.err(
                    &f("limit"),
                    "algorithm = \"concurrency\" needs `limit` (leases in flight per key)".into(),
                ))
            }
        };
        let ttl = n.lease_ttl.unwrap_or(DEFAULT_LEASE_TTL_SECS);
        if !((MIN_TTL_SECS..=MAX_LEASE_TTL_SECS).contains(&ttl)) {
            return Err(self.err(
                &f("lease_ttl"),
                format!(
                    "{ttl} is not a number of seconds from {MIN_TTL_SECS} (a millisecond) to {MAX_LEASE_TTL_SECS}"
                ),
            ));
        }
        Ok(Some(Concurrency {
            limit,
            lease_ttl: std::time::Duration::from_secs_f64(ttl),
        }))
    }
}
