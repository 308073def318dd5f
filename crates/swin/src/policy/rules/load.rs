//! Loading rules: each raw descriptor checked as envoyproxy/ratelimit checks it (and as
//! a namespace's own limits are), turned into a [`Rule`] and placed in the tree.

use std::sync::Arc;
use std::time::Duration;

use swin_core::{Gcra, WindowLimit, WindowSize};

use super::{
    unit_of, Counts, Level, Node, RawBucket, RawRateLimit, RawRule, RawWindow, Rule, RuleError,
    RuleLimit, UNITS,
};
use crate::policy::algorithm::Algorithm;
use crate::policy::limits::{KeyLimits, WindowSet};

pub(super) fn add(
    level: &mut Level,
    raw: &[RawRule],
    parent: &str,
    field: &str,
    counts: Counts,
) -> Result<(), RuleError> {
    for (i, r) in raw.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if r.key.is_empty() {
            return Err(format!("{at}.key: must not be empty"));
        }
        let map_key = if r.value.is_empty() {
            r.key.clone()
        } else {
            format!("{}_{}", r.key, r.value)
        };
        let path = if parent.is_empty() {
            map_key.clone()
        } else {
            format!("{parent}.{map_key}")
        };
        if level.nodes.contains_key(&map_key) {
            return Err(format!("{at}: duplicate descriptor {path:?}"));
        }
        let rule = rule(r, &path, &at, counts)?.map(Arc::new);
        // envoyproxy/ratelimit refuses share_threshold on a value without a `*`
        let shared = match (r.share_threshold, r.value.contains('*')) {
            (false, _) => None,
            (true, true) => Some(Arc::from(r.value.as_str())),
            (true, false) => {
                return Err(format!(
                    "{at}.share_threshold: only for a value with '*' in it ({path:?})"
                ))
            }
        };
        let mut children = Level::default();
        add(
            &mut children,
            &r.descriptors,
            &path,
            &format!("{at}.descriptors"),
            counts,
        )?;
        if r.value.contains('*') {
            level.wildcards.push(map_key.clone());
        }
        level.nodes.insert(
            map_key,
            Node {
                rule,
                shared,
                children,
            },
        );
    }
    Ok(())
}

/// The rule a raw descriptor sets, if it limits (or is `unlimited`).
fn rule(r: &RawRule, path: &str, at: &str, counts: Counts) -> Result<Option<Rule>, RuleError> {
    let given = [r.rate_limit.is_some(), r.limits.is_some(), r.gcra.is_some()];
    if given.iter().filter(|g| **g).count() > 1 {
        return Err(format!(
            "{at}: one of rate_limit, limits or gcra, not several"
        ));
    }
    let algorithm = match counts {
        Counts::Hits(a) => a,
        Counts::InFlight if r.limits.is_some() || r.gcra.is_some() => {
            let field = if r.limits.is_some() { "limits" } else { "gcra" };
            return Err(format!(
                "{at}.{field}: a concurrency namespace's rule limits requests in flight: \
                 rate_limit = {{ requests_per_unit = N }}"
            ));
        }
        // `rate_limit` below, its `unit` not needed
        Counts::InFlight => Algorithm::default(),
    };
    let in_flight = matches!(counts, Counts::InFlight);
    let out = Rule {
        path: path.to_owned(),
        limit: RuleLimit::Unlimited,
        shadow: r.shadow_mode,
        name: None,
        replaces: Vec::new(),
        requests_per_unit: 0,
        unit: 0,
        metadata: r.metadata.clone().filter(|m| !m.is_empty()).map(Arc::new),
    };
    if let Some(rl) = &r.rate_limit {
        return rate_limit_rule(out, rl, at, algorithm, in_flight);
    }
    if let Some(windows) = &r.limits {
        return windows_rule(out, windows, at, algorithm);
    }
    if let Some(b) = &r.gcra {
        return gcra_rule(out, b, at);
    }
    // a rule with nothing to limit with is a level of the tree only
    Ok(None)
}

/// A rule of `rate_limit` (Envoy's `requests_per_unit` per `unit`, `unlimited`,
/// `name`, `replaces`).
fn rate_limit_rule(
    mut out: Rule,
    rl: &RawRateLimit,
    at: &str,
    algorithm: Algorithm,
    in_flight: bool,
) -> Result<Option<Rule>, RuleError> {
    out.name = rl.name.clone();
    out.replaces = rl.replaces.iter().map(|x| x.name.clone()).collect();
    check_replaces(rl, at)?;
    let unit = UNITS.iter().find(|u| u.0.eq_ignore_ascii_case(&rl.unit));
    if rl.unlimited {
        if unit.is_some() {
            return Err(format!(
                "{at}.rate_limit.unit: an unlimited rule takes no unit ({:?})",
                rl.unit
            ));
        }
        return Ok(Some(out));
    }
    if in_flight {
        return in_flight_rule(out, rl, unit.is_some(), at);
    }
    let unit = unit.ok_or_else(|| {
        format!(
            "{at}.rate_limit.unit: {:?} is not second, minute, hour, day, week, month or year",
            rl.unit
        )
    })?;
    let rpu = u32::try_from(rl.requests_per_unit).map_err(|_| {
        format!(
            "{at}.rate_limit.requests_per_unit: {} is not between 0 and {}",
            rl.requests_per_unit,
            u32::MAX
        )
    })?;
    out.requests_per_unit = rpu;
    out.unit = unit.2;
    if rpu == 0 {
        out.limit = RuleLimit::Blocked;
        return Ok(Some(out));
    }
    out.limit = RuleLimit::Limited(
        limit_for(f64::from(rpu), unit.1, algorithm)
            .map_err(|e| format!("{at}.rate_limit: {e}"))?,
    );
    Ok(Some(out))
}

/// What envoyproxy/ratelimit refuses to load in `replaces`, refused here too.
fn check_replaces(rl: &RawRateLimit, at: &str) -> Result<(), RuleError> {
    for (j, x) in rl.replaces.iter().enumerate() {
        if x.name.is_empty() {
            return Err(format!(
                "{at}.rate_limit.replaces[{j}].name: must not be empty"
            ));
        }
        if rl.name.as_deref() == Some(x.name.as_str()) {
            return Err(format!(
                "{at}.rate_limit.replaces[{j}].name: {:?} is this rule's own name",
                x.name
            ));
        }
    }
    Ok(())
}

/// A concurrency namespace's rule: at most `requests_per_unit` slots in flight (its
/// unit, if any, is checked and not read).
fn in_flight_rule(
    mut out: Rule,
    rl: &RawRateLimit,
    known_unit: bool,
    at: &str,
) -> Result<Option<Rule>, RuleError> {
    if !known_unit && !rl.unit.is_empty() {
        return Err(format!(
            "{at}.rate_limit.unit: {:?} is not second, minute, hour, day, week, month or year (and is not read: requests in flight have no unit)",
            rl.unit
        ));
    }
    let n = rl.requests_per_unit;
    if n > crate::policy::algorithm::MAX_CONCURRENCY {
        return Err(format!(
            "{at}.rate_limit.requests_per_unit: {n} is not between 0 and {} (requests in flight)",
            crate::policy::algorithm::MAX_CONCURRENCY
        ));
    }
    out.requests_per_unit = n as u32;
    out.limit = match n {
        0 => RuleLimit::Blocked,
        n => RuleLimit::InFlight(n),
    };
    Ok(Some(out))
}

/// A rule of window limits (`limits`, as a namespace writes them).
fn windows_rule(
    mut out: Rule,
    windows: &[RawWindow],
    at: &str,
    algorithm: Algorithm,
) -> Result<Option<Rule>, RuleError> {
    let Some(kind) = algorithm
        .window()
        .map_err(|(_, why)| format!("{at}.limits: {why}"))?
    else {
        return Err(format!(
            "{at}.limits: a \"gcra\" namespace takes gcra = {{ burst, count, period }}"
        ));
    };
    let mut set = Vec::new();
    for (j, w) in windows.iter().enumerate() {
        let size = WindowSize::new(w.window_size)
            .map_err(|e| format!("{at}.limits[{j}].window_size: {e}"))?;
        set.push(
            WindowLimit::new(size, w.limit, kind)
                .map_err(|e| format!("{at}.limits[{j}].limit: {e}"))?,
        );
    }
    let Some(first) = set.first() else {
        return Err(format!("{at}.limits: needs at least one limit"));
    };
    out.requests_per_unit = first.limit.min(f64::from(u32::MAX)) as u32;
    out.unit = unit_of(u64::from(first.window.secs()));
    out.limit = RuleLimit::Limited(KeyLimits::Windows(WindowSet::new(set)));
    Ok(Some(out))
}

/// A rule of a GCRA bucket (`gcra`).
fn gcra_rule(mut out: Rule, b: &RawBucket, at: &str) -> Result<Option<Rule>, RuleError> {
    let period =
        humantime::parse_duration(&b.period).map_err(|e| format!("{at}.gcra.period: {e}"))?;
    let g = Gcra::new(b.burst, b.count, period).map_err(|e| format!("{at}.gcra: {e}"))?;
    out.requests_per_unit = u32::try_from(b.burst).unwrap_or(u32::MAX);
    out.unit = unit_of(period.as_secs());
    out.limit = RuleLimit::Limited(KeyLimits::Gcra(g));
    Ok(Some(out))
}

/// `n` per `secs` seconds as the namespace's algorithm counts it.
pub(crate) fn limit_for(n: f64, secs: u64, algorithm: Algorithm) -> Result<KeyLimits, String> {
    let size = WindowSize::new(secs).map_err(|e| e.to_string())?;
    match algorithm.window().map_err(|(_, why)| why)? {
        None => {
            let burst = n as i64;
            Gcra::new(burst, burst, Duration::from_secs(secs))
                .map(KeyLimits::Gcra)
                .map_err(|e| e.to_string())
        }
        Some(kind) => WindowLimit::new(size, n, kind)
            .map(|l| KeyLimits::Windows(WindowSet::new(vec![l])))
            .map_err(|e| e.to_string()),
    }
}
