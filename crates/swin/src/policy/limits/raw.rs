//! Limits as a config file or a runtime limit writes them, before they are checked
//! (see `limits`).

use serde::{Deserialize, Serialize};

use super::*;

/// One window limit as a config or a runtime limit writes it: `{ window_size, limit }`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    pub(super) window_size: i64,
    pub(super) limit: f64,
    /// Decided and counted but not enforced (see [`swin_core::WindowLimit::shadow`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) shadow: Option<bool>,
}

/// `gcra = { burst = 300, count = 300, period = "180m" }` (Boulder's limit).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGcra {
    pub(super) burst: i64,
    pub(super) count: i64,
    pub(super) period: String,
}

/// One key's limits as set at run time and kept in the store: window limits, or a GCRA
/// bucket on a GCRA namespace — the shapes a namespace takes.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawKeyLimits {
    /// Window limits (a window algorithm).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) limits: Vec<RawLimit>,
    /// A bucket (GCRA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) gcra: Option<RawGcra>,
}

impl RawKeyLimits {
    /// Window `limits`, or a `gcra` bucket, as a client writes them.
    pub fn new(limits: Vec<RawLimit>, gcra: Option<RawGcra>) -> RawKeyLimits {
        RawKeyLimits { limits, gcra }
    }

    /// Its window limits and its bucket.
    pub fn into_parts(self) -> (Vec<RawLimit>, Option<RawGcra>) {
        (self.limits, self.gcra)
    }
}

impl RawKeyLimits {
    /// The raw form of validated limits (what an answer shows of the config's).
    pub fn of(limits: &KeyLimits) -> RawKeyLimits {
        match limits {
            KeyLimits::Windows(set) => RawKeyLimits {
                limits: set
                    .iter()
                    .map(|l| RawLimit {
                        window_size: i64::from(l.window.secs()),
                        limit: l.limit,
                        shadow: l.shadow.then_some(true),
                    })
                    .collect(),
                gcra: None,
            },
            KeyLimits::Gcra(g) => RawKeyLimits {
                limits: Vec::new(),
                gcra: Some(RawGcra {
                    burst: g.burst(),
                    count: g.count(),
                    period: humantime::format_duration(g.period()).to_string(),
                }),
            },
        }
    }

    /// Validates them for a namespace of `algorithm` and window `sizes`, as the file's
    /// overrides are: a limit the namespace could not hold is an error naming the field.
    pub fn validate(
        &self,
        algorithm: Algorithm,
        sizes: &[WindowSize],
    ) -> Result<KeyLimits, FieldError> {
        let window = algorithm.window()?;
        key_limits(window, sizes, "", &self.limits, self.gcra.as_ref())?.ok_or_else(|| match window
        {
            Some(_) => (
                "limits".into(),
                "needs at least one limit: [{\"window_size\": …, \"limit\": …}]".into(),
            ),
            None => (
                "gcra".into(),
                "a \"gcra\" namespace takes {\"gcra\": {\"burst\", \"count\", \"period\"}}".into(),
            ),
        })
    }
}

/// An `overrides` entry: keys and the limits they get instead of the default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOverride {
    pub(super) keys: Vec<String>,
    #[serde(default)]
    pub(super) limits: Vec<RawLimit>,
    pub(super) gcra: Option<RawGcra>,
}

/// A namespace's limit keys as the config file has them, before they are checked.
#[derive(Debug)]
pub(crate) struct RawLimits {
    /// `algorithm` (none: sliding windows).
    pub(crate) algorithm: Option<String>,
    /// `limits`.
    pub(crate) limits: Vec<RawLimit>,
    /// `gcra`.
    pub(crate) gcra: Option<RawGcra>,
    /// `count_denied`.
    pub(crate) count_denied: Option<bool>,
    /// `key_from`.
    pub(crate) key_from: Option<String>,
    /// `overrides`.
    pub(crate) overrides: Vec<RawOverride>,
    /// `shadow`.
    pub(crate) shadow: Option<bool>,
    /// `overrun`.
    pub(crate) overrun: Option<String>,
}
