//! Limits of a namespace (config keys `algorithm`, `limits`, `gcra`, `count_denied`,
//! `key_from`, `[[namespaces.overrides]]`), validated, and the decision `/hit` answers
//! with: every limit of the key is checked and the strictest decision wins (a denial,
//! then the longer wait, then fewer remaining). Runtime limits set over the API take the
//! same shapes and the same checks (`RawKeyLimits`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use swin_core::{Gcra, WindowAlgorithm, WindowLimit, WindowSize};

use super::algorithm::Algorithm;
use super::FieldError;

mod raw;

pub(crate) use self::raw::{RawGcra, RawKeyLimits, RawLimit};
pub(crate) use self::raw::{RawLimits, RawOverride};

/// The limits one key is decided against.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KeyLimits {
    /// Sliding or fixed windows, each checked; the strictest wins.
    Windows(WindowSet),
    /// One GCRA bucket.
    Gcra(Gcra),
}

impl KeyLimits {
    /// The most one hit may cost: the smallest enforced window limit (at least 1), or a
    /// bucket's burst; limits in shadow refuse no cost.
    pub(crate) fn most_at_once(&self) -> f64 {
        match self {
            KeyLimits::Gcra(g) => g.burst() as f64,
            KeyLimits::Windows(set) => set
                .iter()
                .filter(|l| !l.shadow)
                .map(|l| l.most_at_once())
                .fold(f64::INFINITY, f64::min),
        }
    }

    /// The limits that deny (those not in shadow), or `None` when every one is in shadow.
    pub(crate) fn enforced(&self) -> Option<KeyLimits> {
        match self {
            KeyLimits::Gcra(_) => Some(self.clone()),
            KeyLimits::Windows(set) if !set.iter().any(|l| l.shadow) => Some(self.clone()),
            KeyLimits::Windows(set) => {
                let on: Vec<WindowLimit> = set.iter().filter(|l| !l.shadow).copied().collect();
                (!on.is_empty()).then(|| KeyLimits::Windows(WindowSet::new(on)))
            }
        }
    }

    /// Whether any of the limits is in shadow.
    pub(crate) fn has_shadow(&self) -> bool {
        match self {
            KeyLimits::Gcra(_) => false,
            KeyLimits::Windows(set) => set.iter().any(|l| l.shadow),
        }
    }

    /// Whether a hit of `cost` can be decided at all: a finite, non-negative cost that
    /// every enforced limit can hold (more at once than a limit allows in all is an
    /// error, on every door; a limit in shadow refuses no cost, and a namespace in shadow
    /// checks only [`swin_core::check_cost`]: see [`Self::check_cost_in`]).
    pub(crate) fn check_cost(&self, cost: f64) -> Result<(), swin_core::CoreError> {
        match self {
            KeyLimits::Gcra(g) => {
                swin_core::check_cost(cost)?;
                g.units(cost).map(|_| ())
            }
            // each limit checks the number first (WindowLimit::check_cost); a set has one
            // limit at least
            KeyLimits::Windows(set) if !set.limits().is_empty() => {
                set.iter().try_for_each(|l| l.check_cost(cost))
            }
            KeyLimits::Windows(_) => swin_core::check_cost(cost),
        }
    }

    /// [`Self::check_cost`] in a namespace (or descriptor rule) that is in shadow when
    /// `shadow`: there no window limit refuses a cost (a GCRA bucket still takes whole
    /// units up to its burst: it cannot spend more).
    pub(crate) fn check_cost_in(
        &self,
        cost: f64,
        shadow: bool,
    ) -> Result<(), swin_core::CoreError> {
        match self {
            KeyLimits::Windows(_) if shadow => swin_core::check_cost(cost),
            _ => self.check_cost(cost),
        }
    }
}

/// A key's window limits, with the `RateLimit-Policy` text of each written once, when
/// the config is read (a `/hit` answers with it: writing it per request took a tenth of
/// the request's instructions).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WindowSet {
    limits: Vec<WindowLimit>,
    /// Per limit, its policy name: `60s`.
    names: Vec<Arc<str>>,
    /// Per limit, its policy item: `"60s";q=100;w=60`.
    items: Arc<[Arc<str>]>,
}

impl WindowSet {
    /// The set of `limits`, each named by its window (`60s`).
    pub(crate) fn new(limits: Vec<WindowLimit>) -> Self {
        let names: Vec<Arc<str>> = limits
            .iter()
            .map(|l| format!("{}s", l.window.secs()).into())
            .collect();
        let items = limits
            .iter()
            .zip(&names)
            .map(|(l, name)| format!("\"{name}\";q={};w={}", l.limit, l.window.secs()).into())
            .collect();
        WindowSet {
            limits,
            names,
            items,
        }
    }

    /// The policy name of the `i`th limit.
    pub(crate) fn name(&self, i: usize) -> &Arc<str> {
        &self.names[i]
    }

    /// Every limit's policy item, in order.
    pub(crate) fn items(&self) -> &Arc<[Arc<str>]> {
        &self.items
    }

    /// The limits, in order (a set is never empty).
    pub(crate) fn limits(&self) -> &[WindowLimit] {
        &self.limits
    }

    /// The limits, one by one.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, WindowLimit> {
        self.limits.iter()
    }
}

impl<'a> IntoIterator for &'a WindowSet {
    type Item = &'a WindowLimit;
    type IntoIter = std::slice::Iter<'a, WindowLimit>;
    fn into_iter(self) -> Self::IntoIter {
        self.limits.iter()
    }
}

/// Where the forward-auth endpoint takes the key from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFrom {
    /// The client's address: `X-Forwarded-For` (first), `X-Real-IP`, else the peer.
    ClientAddress,
    /// A request header (lower-cased name).
    Header(String),
}

/// A namespace's limits: the default and per-key overrides.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Limits {
    /// What a key without an override is decided against.
    pub(crate) default: KeyLimits,
    /// Keys decided against limits of their own instead.
    pub(crate) overrides: BTreeMap<String, KeyLimits>,
    /// Denied hits count too (Kong's penalty); by default they do not.
    pub(crate) count_denied: bool,
    /// Where `/v1/auth` (nginx) reads the key from.
    pub(crate) key_from: KeyFrom,
    /// Every limit decides and counts but none denies (`shadow = true`): hits they
    /// would deny pass, counted, and are marked as would-be denials.
    pub(crate) shadow: bool,
    /// What a reservation's commit above its estimate does with the excess.
    pub(crate) overrun: Overrun,
}

/// What a reservation's commit above its estimate does with the excess (`overrun`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Overrun {
    /// All of it is charged, even past the limit (`"debt"`, the default): the key's
    /// hits and reserves are then denied until its windows or bucket bring it back
    /// under the limit.
    #[default]
    Debt,
    /// Charged up to what the limits leave; the rest is reported `uncharged` and never
    /// counted (`"cap"`).
    Cap,
}

impl Overrun {
    /// Its name in a config.
    #[cfg(test)]
    pub(crate) fn name(self) -> &'static str {
        match self {
            Overrun::Debt => "debt",
            Overrun::Cap => "cap",
        }
    }

    fn parse(raw: Option<&str>) -> Result<Overrun, FieldError> {
        match raw {
            None | Some("debt") => Ok(Overrun::Debt),
            Some("cap") => Ok(Overrun::Cap),
            Some(o) => Err((
                "overrun".into(),
                format!("{o:?} is not \"debt\" or \"cap\""),
            )),
        }
    }
}

impl Limits {
    /// Where `/v1/auth` (nginx) reads the key from.
    pub fn key_from(&self) -> &KeyFrom {
        &self.key_from
    }

    /// Every limit decides and counts but none denies (`shadow = true`): hits they
    /// would deny pass, counted, and are marked as would-be denials.
    pub fn shadow(&self) -> bool {
        self.shadow
    }

    /// What a reservation's commit above its estimate does with the excess.
    #[cfg(test)]
    pub(crate) fn overrun(&self) -> Overrun {
        self.overrun
    }
}

impl Limits {
    /// The limits `key` is decided against: its override, else the default.
    pub fn for_key(&self, key: &str) -> &KeyLimits {
        self.overrides.get(key).unwrap_or(&self.default)
    }

    /// The limits' algorithm (overrides are of the same kind).
    pub fn algorithm(&self) -> Algorithm {
        match &self.default {
            KeyLimits::Gcra(_) => Algorithm::Gcra,
            KeyLimits::Windows(w) => match w.limits().first().map(|w| w.algorithm) {
                Some(WindowAlgorithm::Fixed) => Algorithm::FixedWindow,
                _ => Algorithm::SlidingWindow,
            },
        }
    }
}

fn window_limits(
    raw: &[RawLimit],
    sizes: &[WindowSize],
    algorithm: WindowAlgorithm,
    field: &str,
) -> Result<Vec<WindowLimit>, FieldError> {
    let mut out: Vec<WindowLimit> = Vec::new();
    for (i, l) in raw.iter().enumerate() {
        let f = format!("{field}[{i}]");
        let size = sizes
            .iter()
            .find(|s| i64::from(s.secs()) == l.window_size)
            .ok_or_else(|| {
                (
                    format!("{f}.window_size"),
                    format!(
                        "{} is not one of the namespace's window_sizes",
                        l.window_size
                    ),
                )
            })?;
        if out.iter().any(|o| o.window == *size) {
            return Err((
                format!("{f}.window_size"),
                format!("{} has two limits", l.window_size),
            ));
        }
        let limit = WindowLimit::new(*size, l.limit, algorithm)
            .map_err(|e| (format!("{f}.limit"), e.to_string()))?
            .shadowed(l.shadow == Some(true));
        out.push(limit);
    }
    Ok(out)
}

fn gcra_limit(raw: &RawGcra, field: &str) -> Result<Gcra, FieldError> {
    let period = humantime::parse_duration(raw.period.trim()).map_err(|e| {
        (
            format!("{field}.period"),
            format!(
                "{:?} is not a duration like \"1s\", \"180m\" or \"1h 30m\": {e}",
                raw.period
            ),
        )
    })?;
    Gcra::new(raw.burst, raw.count, period).map_err(|e| (field.to_owned(), e.to_string()))
}

fn key_from(raw: Option<&str>) -> Result<KeyFrom, FieldError> {
    match raw {
        None | Some("client_address") => Ok(KeyFrom::ClientAddress),
        Some(h) => match h.strip_prefix("header:") {
            Some(name)
                if !name.is_empty() && http::HeaderName::from_bytes(name.as_bytes()).is_ok() =>
            {
                Ok(KeyFrom::Header(name.to_ascii_lowercase()))
            }
            _ => Err((
                "key_from".into(),
                format!("{h:?} is not \"client_address\" or \"header:<name>\""),
            )),
        },
    }
}

/// Validates a namespace's limit keys; `None` when it has none.
pub(crate) fn validate(raw: RawLimits, sizes: &[WindowSize]) -> Result<Option<Limits>, FieldError> {
    let algorithm = algorithm(raw.algorithm.as_deref())?;
    let key_from = key_from(raw.key_from.as_deref())?;
    let overrun = Overrun::parse(raw.overrun.as_deref())?;
    let default = key_limits(algorithm, sizes, "", &raw.limits, raw.gcra.as_ref())?;
    let overrides = overrides(algorithm, sizes, &raw.overrides)?;
    let Some(default) = default else {
        if algorithm.is_none() {
            return Err((
                "gcra".into(),
                "algorithm = \"gcra\" needs `gcra = { burst, count, period }`".into(),
            ));
        }
        if !overrides.is_empty() {
            return Err((
                "limits".into(),
                "overrides need a default: every key is limited by `limits` unless overridden"
                    .into(),
            ));
        }
        if raw.count_denied.is_some()
            || raw.algorithm.is_some()
            || raw.key_from.is_some()
            || raw.shadow.is_some()
            || raw.overrun.is_some()
        {
            return Err((
                "limits".into(),
                "algorithm, count_denied, key_from, overrun and shadow need limits".into(),
            ));
        }
        return Ok(None);
    };
    Ok(Some(Limits {
        default,
        overrides,
        count_denied: raw.count_denied.unwrap_or(false),
        key_from,
        shadow: raw.shadow.unwrap_or(false),
        overrun,
    }))
}

/// The window algorithm (`None`: GCRA); sliding windows unless told otherwise.
fn algorithm(raw: Option<&str>) -> Result<Option<WindowAlgorithm>, FieldError> {
    Algorithm::parse(raw)?.window()
}

/// The limits of the namespace or of one override (`field` prefixes its fields): window
/// limits for a window algorithm, a bucket for GCRA, never both; `None` when it has none.
fn key_limits(
    algorithm: Option<WindowAlgorithm>,
    sizes: &[WindowSize],
    field: &str,
    limits: &[RawLimit],
    gcra: Option<&RawGcra>,
) -> Result<Option<KeyLimits>, FieldError> {
    match algorithm {
        Some(a) => {
            if gcra.is_some() {
                return Err((
                    format!("{field}gcra"),
                    "only for algorithm = \"gcra\"".into(),
                ));
            }
            let l = window_limits(limits, sizes, a, &format!("{field}limits"))?;
            Ok((!l.is_empty()).then(|| KeyLimits::Windows(WindowSet::new(l))))
        }
        None => {
            if !limits.is_empty() {
                return Err((
                    format!("{field}limits"),
                    "a \"gcra\" namespace takes `gcra = { burst, count, period }`, not window limits".into(),
                ));
            }
            gcra.map(|g| gcra_limit(g, &format!("{field}gcra")).map(KeyLimits::Gcra))
                .transpose()
        }
    }
}

/// Per-key overrides: each lists its keys (none in two overrides) and its own limits.
fn overrides(
    algorithm: Option<WindowAlgorithm>,
    sizes: &[WindowSize],
    raw: &[RawOverride],
) -> Result<BTreeMap<String, KeyLimits>, FieldError> {
    let mut overrides = BTreeMap::new();
    for (i, o) in raw.iter().enumerate() {
        let f = format!("overrides[{i}].");
        if o.keys.is_empty() {
            return Err((format!("{f}keys"), "needs at least one key".into()));
        }
        let Some(limits) = key_limits(algorithm, sizes, &f, &o.limits, o.gcra.as_ref())? else {
            let what = if algorithm.is_some() {
                "limits"
            } else {
                "gcra"
            };
            return Err((format!("{f}{what}"), "an override needs its limits".into()));
        };
        for k in &o.keys {
            if overrides.insert(k.clone(), limits.clone()).is_some() {
                return Err((format!("{f}keys"), format!("{k:?} is in two overrides")));
            }
        }
    }
    Ok(overrides)
}

/// Whole seconds, rounded up: a client told to wait must not come back early.
pub(crate) fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests;
