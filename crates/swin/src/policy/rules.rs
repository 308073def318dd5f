//! A namespace's rules for Envoy's rate limit service: envoyproxy/ratelimit's descriptor
//! tree, inline in the TOML config or in its own YAML files unchanged, and how a request
//! descriptor finds its rule — as envoyproxy/ratelimit matches: level by level, the entry's
//! `key_value` first, then a value with `*` in it (each `*` any run of characters, none
//! included; the first such rule written that matches), then the bare `key` (any value); a
//! rule applies only when it sits at the descriptor's last entry.
//!
//! Invariants: every rule's limits are validated like a namespace's own (`limits::*`);
//! every window size a rule or a request override can use has a table (see
//! `Rules::window_sizes`); a rule's error names the file (or the config), the rule
//! path and the field.

use std::collections::HashMap;
use std::sync::Arc;

use crate::policy::algorithm::Algorithm;
use crate::policy::limits::KeyLimits;
use serde::Deserialize;

/// `rate_limit = { unit, requests_per_unit, name, replaces, unlimited }`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    #[serde(default)]
    unit: String,
    #[serde(default)]
    requests_per_unit: u64,
    name: Option<String>,
    #[serde(default)]
    replaces: Vec<RawReplace>,
    #[serde(default)]
    unlimited: bool,
}

/// A `replaces` entry: the name of a rule this one takes the place of.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReplace {
    name: String,
}

/// swin's own window limit inside a rule: `{ window_size = 90, limit = 10 }`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawWindow {
    window_size: u64,
    limit: f64,
}

/// swin's own GCRA bucket inside a rule.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBucket {
    burst: i64,
    count: i64,
    period: String,
}

/// One descriptor rule, in envoyproxy/ratelimit's shape (plus `limits` / `gcra`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    key: String,
    #[serde(default)]
    value: String,
    rate_limit: Option<RawRateLimit>,
    limits: Option<Vec<RawWindow>>,
    gcra: Option<RawBucket>,
    #[serde(default)]
    shadow_mode: bool,
    /// Accepted for compatibility; swin's metrics are per namespace.
    #[serde(default)]
    detailed_metric: bool,
    #[serde(default)]
    value_to_metric: bool,
    /// Every value its `*` matches counts on one counter (the value as written).
    #[serde(default)]
    share_threshold: bool,
    /// Carried to Envoy in the answer's dynamic metadata (`envoy_dynamic_metadata`).
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    descriptors: Vec<RawRule>,
}

/// An envoyproxy/ratelimit YAML file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    domain: String,
    #[serde(default)]
    descriptors: Vec<RawRule>,
}

/// Envoy's rate limit units, in seconds (a month is 30 days, a year 365, as
/// envoyproxy/ratelimit counts them).
pub(crate) const UNITS: [(&str, u64, i32); 7] = [
    ("second", 1, 1),
    ("minute", 60, 2),
    ("hour", 3_600, 3),
    ("day", 86_400, 4),
    ("week", 604_800, 7),
    ("month", 2_592_000, 5),
    ("year", 31_536_000, 6),
];

/// The seconds of an Envoy unit number (the proto's enum), if it is one.
pub(crate) fn unit_secs(unit: i32) -> Option<u64> {
    UNITS.iter().find(|u| u.2 == unit).map(|u| u.1)
}

/// The Envoy unit of a window, or 0 (UNKNOWN) for a length that is none of them.
pub(crate) fn unit_of(secs: u64) -> i32 {
    UNITS.iter().find(|u| u.1 == secs).map_or(0, |u| u.2)
}

/// What a rule limits with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RuleLimit {
    /// Matched, counted nowhere, never limited.
    Unlimited,
    /// `requests_per_unit: 0`: every request is over the limit (envoyproxy/ratelimit's
    /// way to block a value), counted nowhere.
    Blocked,
    /// Decided against these limits, in the namespace's algorithm.
    Limited(KeyLimits),
    /// A concurrency namespace's rule (`rate_limit.requests_per_unit`, its unit not
    /// read): at most this many slots of the descriptor's key in flight.
    InFlight(u64),
}

/// A rule that a descriptor found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rule {
    /// Its path: `generic_key_login.remote_address`.
    pub(crate) path: String,
    /// What it limits with.
    pub(crate) limit: RuleLimit,
    /// Decided and counted, never denied.
    pub(crate) shadow: bool,
    /// `rate_limit.name`, for `replaces` and the answer's `current_limit.name`.
    pub(crate) name: Option<String>,
    /// Names of the rules it replaces when both apply.
    pub(crate) replaces: Vec<String>,
    /// What the answer's `current_limit` says: requests per unit and the unit (0 when
    /// the window is no Envoy unit).
    pub(crate) requests_per_unit: u32,
    /// The unit, as Envoy's `RateLimit.Unit` numbers it.
    pub(crate) unit: i32,
    /// The rule's `metadata`, for the answer's dynamic metadata.
    pub(crate) metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
}

/// A rule a descriptor found, and the entries whose values count as the rule writes
/// them (`share_threshold`: every value a `*` matches shares one counter).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Found {
    /// The rule.
    pub(crate) rule: Arc<Rule>,
    /// (entry index, the value as the rule writes it, `*` included)
    pub(crate) shared: Vec<(usize, Arc<str>)>,
}

impl Found {}

impl Found {
    /// The entries the descriptor counts under: its own, with shared values replaced.
    pub fn counted<'a>(&'a self, entries: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut out = entries.to_vec();
        for (i, value) in &self.shared {
            if let Some(e) = out.get_mut(*i) {
                e.1 = value;
            }
        }
        out
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Level {
    /// `key_value`, or `key` for a rule without a value.
    nodes: HashMap<String, Node>,
    /// The entries of `nodes` whose value has a `*`, in the order they were written.
    wildcards: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
struct Node {
    rule: Option<Arc<Rule>>,
    /// `share_threshold`: the value as written (with its `*`).
    shared: Option<Arc<str>>,
    children: Level,
}

/// A namespace's descriptor rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Rules {
    root: Level,
    /// The namespace's `algorithm`: what a request's own `limit` becomes too.
    algorithm: Algorithm,
    /// `count_denied`: every hit counts, allowed or not, as envoyproxy/ratelimit counts
    /// (by default a request over the limit counts nothing on any descriptor).
    count_denied: bool,
}

/// Where a rule error is: the file (or "the config"), the rule path, the field.
pub(crate) type RuleError = String;

impl Rules {
    /// Rules from inline TOML descriptors and, when given, a YAML file whose `domain`
    /// must be `domain`. `algorithm` is the namespace's (`rate_limit` rules become
    /// windows of that kind, or GCRA buckets of `requests_per_unit` per unit).
    pub(crate) fn load(
        domain: &str,
        inline: &[RawRule],
        file: Option<&std::path::Path>,
        algorithm: Algorithm,
    ) -> Result<Rules, RuleError> {
        let mut rules = Rules {
            algorithm,
            ..Rules::default()
        };
        let counts = Counts::Hits(algorithm);
        add(&mut rules.root, inline, "", "descriptors", counts)?;
        if let Some(path) = file {
            let shown = path.display();
            let raw = read_file(path, domain)?;
            add(&mut rules.root, &raw.descriptors, "", "descriptors", counts)
                .map_err(|e| format!("{shown}: {e}"))?;
        }
        Ok(rules)
    }

    /// The rules of a concurrency namespace (`algorithm = "concurrency"`), from the
    /// same places: a rule's `rate_limit.requests_per_unit` is the slots its key may have
    /// in flight ([`RuleLimit::InFlight`]; 0 blocks, `unlimited` takes no slot), its
    /// `unit` may be left out and is not read, and `limits` or `gcra` are refused.
    pub(crate) fn load_concurrency(
        domain: &str,
        inline: &[RawRule],
        file: Option<&std::path::Path>,
    ) -> Result<Rules, RuleError> {
        let mut rules = Rules::default();
        add(&mut rules.root, inline, "", "descriptors", Counts::InFlight)?;
        if let Some(path) = file {
            let shown = path.display();
            let raw = read_file(path, domain)?;
            add(
                &mut rules.root,
                &raw.descriptors,
                "",
                "descriptors",
                Counts::InFlight,
            )
            .map_err(|e| format!("{shown}: {e}"))?;
        }
        Ok(rules)
    }

    /// The namespace's `algorithm`.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Rules whose hits count whether allowed or denied (`count_denied = true`).
    pub fn counting_denied(mut self, count_denied: bool) -> Rules {
        self.count_denied = count_denied;
        self
    }

    /// Every rule in shadow mode when `on` (a namespace with `shadow = true`).
    pub fn shadowed(mut self, on: bool) -> Rules {
        fn walk(level: &mut Level) {
            for node in level.nodes.values_mut() {
                if let Some(rule) = &mut node.rule {
                    Arc::make_mut(rule).shadow = true;
                }
                walk(&mut node.children);
            }
        }
        if on {
            walk(&mut self.root);
        }
        self
    }

    /// Whether every hit counts, allowed or denied.
    pub fn count_denied(&self) -> bool {
        self.count_denied
    }

    /// Every window size a rule uses, and every Envoy unit (a request's own `limit`
    /// may name any).
    pub fn window_sizes(&self) -> Vec<u64> {
        let mut sizes: Vec<u64> = UNITS.iter().map(|u| u.1).collect();
        collect_sizes(&self.root, &mut sizes);
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }

    /// The rule for a request descriptor's entries, as envoyproxy/ratelimit finds it.
    pub fn find(&self, entries: &[(&str, &str)]) -> Option<Arc<Rule>> {
        self.lookup(entries).map(|f| f.rule)
    }

    /// The rule for a request descriptor's entries and the values it counts under:
    /// an entry matched by a `share_threshold` wildcard, at any level on the way,
    /// counts under the rule's value.
    pub fn lookup(&self, entries: &[(&str, &str)]) -> Option<Found> {
        let mut level = &self.root;
        let mut shared = Vec::new();
        let mut full = String::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            full.clear();
            full.push_str(key);
            full.push('_');
            full.push_str(value);
            let node = match level.nodes.get(&full) {
                Some(n) => Some(n),
                None => {
                    let wild = level
                        .wildcards
                        .iter()
                        .find(|w| glob_match(w, &full))
                        .and_then(|w| level.nodes.get(w));
                    if let Some(v) = wild.and_then(|n| n.shared.as_ref()) {
                        shared.push((i, v.clone()));
                    }
                    wild.or_else(|| level.nodes.get(*key))
                }
            };
            let Some(node) = node else {
                break;
            };
            if i == entries.len() - 1 {
                return node.rule.clone().map(|rule| Found { rule, shared });
            }
            if node.children.nodes.is_empty() {
                break;
            }
            level = &node.children;
        }
        None
    }
}

/// An envoyproxy/ratelimit YAML file, whose `domain` must be `domain`.
fn read_file(path: &std::path::Path, domain: &str) -> Result<RawFile, RuleError> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{shown}: {e}"))?;
    let raw: RawFile = serde_yaml_ng::from_str(&text).map_err(|e| format!("{shown}: {e}"))?;
    if raw.domain != domain {
        return Err(format!(
            "{shown}: domain: {:?} is not this namespace ({domain:?})",
            raw.domain
        ));
    }
    Ok(raw)
}

/// What a namespace's rules limit: hits, under its algorithm, or requests in flight.
#[derive(Debug, Clone, Copy)]
enum Counts {
    Hits(Algorithm),
    InFlight,
}

/// Whether `text` is `pattern` with each `*` standing for any run of characters (none
/// included). Greedy with backtracking to the last `*`: linear in practice, at worst
/// `pattern × text` steps, both bounded (a rule from the config, a value of at most a
/// request's size).
fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut i, mut j) = (0, 0);
    // the last `*` seen and where in `text` its run ends so far
    let mut star: Option<(usize, usize)> = None;
    while j < t.len() {
        if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == t[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            // the `*` takes one more byte
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&b| b == b'*')
}

fn collect_sizes(level: &Level, sizes: &mut Vec<u64>) {
    for node in level.nodes.values() {
        if let Some(rule) = &node.rule {
            if let RuleLimit::Limited(KeyLimits::Windows(set)) = &rule.limit {
                sizes.extend(set.iter().map(|l| u64::from(l.window.secs())));
            }
        }
        collect_sizes(&node.children, sizes);
    }
}

mod load;

use load::add;
pub(crate) use load::limit_for;

#[cfg(test)]
mod tests;
