//! Limits of a namespace (config keys `algorithm`, `limits`, `count_denied`,
//! `[[namespaces.overrides]]`), validated, and the decision `/hit` answers with: every
//! limit of the key is checked and the strictest decision wins (a denial, then the longer
//! wait, then fewer remaining).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use swin_core::{WindowAlgorithm, WindowDecision, WindowLimit, WindowSize};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    window_size: i64,
    limit: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOverride {
    keys: Vec<String>,
    #[serde(default)]
    limits: Vec<RawLimit>,
    gcra: Option<toml::Value>,
}

#[derive(Debug)]
pub struct RawLimits {
    pub algorithm: Option<String>,
    pub limits: Vec<RawLimit>,
    pub gcra: Option<toml::Value>,
    pub count_denied: Option<bool>,
    pub overrides: Vec<RawOverride>,
}

/// A namespace's limits: the default set and per-key overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub default: Vec<WindowLimit>,
    pub overrides: BTreeMap<String, Vec<WindowLimit>>,
    /// Denied hits count too (Kong's penalty); by default they do not.
    pub count_denied: bool,
}

impl Limits {
    pub fn for_key(&self, key: &str) -> &[WindowLimit] {
        self.overrides.get(key).map_or(&self.default, Vec::as_slice)
    }
}

type FieldError = (String, String);

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
            .map_err(|e| (format!("{f}.limit"), e.to_string()))?;
        out.push(limit);
    }
    Ok(out)
}

/// Validates a namespace's limit keys; `None` when it has none.
pub fn validate(raw: RawLimits, sizes: &[WindowSize]) -> Result<Option<Limits>, FieldError> {
    let algorithm = match raw.algorithm.as_deref() {
        None | Some("sliding_window") => WindowAlgorithm::Sliding,
        Some("fixed_window") => WindowAlgorithm::Fixed,
        Some("gcra") => {
            return Err(("algorithm".into(), "\"gcra\" namespaces are not available in this version (sliding_window and fixed_window are)".into()))
        }
        Some(other) => return Err(("algorithm".into(), format!("{other:?} is not \"sliding_window\", \"fixed_window\" or \"gcra\""))),
    };
    if raw.gcra.is_some() {
        return Err(("gcra".into(), "only for algorithm = \"gcra\"".into()));
    }
    let default = window_limits(&raw.limits, sizes, algorithm, "limits")?;
    let mut overrides = BTreeMap::new();
    for (i, o) in raw.overrides.iter().enumerate() {
        if o.gcra.is_some() {
            return Err((
                format!("overrides[{i}].gcra"),
                "only for algorithm = \"gcra\"".into(),
            ));
        }
        if o.keys.is_empty() {
            return Err((
                format!("overrides[{i}].keys"),
                "needs at least one key".into(),
            ));
        }
        let limits = window_limits(
            &o.limits,
            sizes,
            algorithm,
            &format!("overrides[{i}].limits"),
        )?;
        if limits.is_empty() {
            return Err((
                format!("overrides[{i}].limits"),
                "needs at least one limit".into(),
            ));
        }
        for k in &o.keys {
            if overrides.insert(k.clone(), limits.clone()).is_some() {
                return Err((
                    format!("overrides[{i}].keys"),
                    format!("{k:?} is in two overrides"),
                ));
            }
        }
    }
    if default.is_empty() && overrides.is_empty() {
        if raw.count_denied.is_some() || raw.algorithm.is_some() {
            return Err((
                "limits".into(),
                "algorithm and count_denied need limits".into(),
            ));
        }
        return Ok(None);
    }
    Ok(Some(Limits {
        default,
        overrides,
        count_denied: raw.count_denied.unwrap_or(false),
    }))
}

/// The strictest of several decisions: a denial, then the longer wait, then the fewer
/// remaining.
pub fn strictest(
    decisions: &[(WindowLimit, WindowDecision)],
) -> Option<(WindowLimit, WindowDecision)> {
    decisions.iter().copied().max_by(|(_, a), (_, b)| {
        (
            !a.allowed,
            a.retry_after,
            std::cmp::Reverse(a.remaining as i64),
        )
            .cmp(&(
                !b.allowed,
                b.retry_after,
                std::cmp::Reverse(b.remaining as i64),
            ))
    })
}

/// Whole seconds, rounded up: a client told to wait must not come back early.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes() -> Vec<WindowSize> {
        vec![
            WindowSize::new(60).expect("size"),
            WindowSize::new(3600).expect("size"),
        ]
    }

    fn raw(algorithm: Option<&str>, limits: Vec<(i64, f64)>) -> RawLimits {
        RawLimits {
            algorithm: algorithm.map(str::to_owned),
            limits: limits
                .into_iter()
                .map(|(window_size, limit)| RawLimit { window_size, limit })
                .collect(),
            gcra: None,
            count_denied: None,
            overrides: Vec::new(),
        }
    }

    #[test]
    fn limits_are_validated_against_the_window_sizes() {
        assert_eq!(validate(raw(None, vec![]), &sizes()).expect("none"), None);
        let l = validate(raw(Some("fixed_window"), vec![(60, 5.0)]), &sizes())
            .expect("valid")
            .expect("some");
        assert_eq!(l.default[0].algorithm, WindowAlgorithm::Fixed);
        assert_eq!(
            validate(raw(None, vec![(30, 5.0)]), &sizes())
                .expect_err("size")
                .0,
            "limits[0].window_size"
        );
        assert_eq!(
            validate(raw(None, vec![(60, 0.0)]), &sizes())
                .expect_err("limit")
                .0,
            "limits[0].limit"
        );
        assert_eq!(
            validate(raw(None, vec![(60, 1.0), (60, 2.0)]), &sizes())
                .expect_err("twice")
                .0,
            "limits[1].window_size"
        );
        assert_eq!(
            validate(raw(Some("leaky"), vec![(60, 1.0)]), &sizes())
                .expect_err("algo")
                .0,
            "algorithm"
        );
        assert!(validate(raw(Some("gcra"), vec![]), &sizes())
            .expect_err("gcra")
            .1
            .contains("not available"));
    }

    #[test]
    fn overrides_replace_the_default_for_their_keys() {
        let mut r = raw(None, vec![(60, 5.0)]);
        r.overrides.push(RawOverride {
            keys: vec!["vip".into()],
            limits: vec![RawLimit {
                window_size: 60,
                limit: 50.0,
            }],
            gcra: None,
        });
        let l = validate(r, &sizes()).expect("valid").expect("some");
        assert_eq!(l.for_key("vip")[0].limit, 50.0);
        assert_eq!(l.for_key("anyone")[0].limit, 5.0);
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(ceil_secs(Duration::from_millis(1500)), 2);
        assert_eq!(ceil_secs(Duration::from_secs(3)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
    }
}
