//! The `[auth]` section: bearer tokens, each with a name (for logs and metrics) and the
//! scopes it grants. The config holds the SHA-256 of each token, never the token.

use serde::Deserialize;

use super::Parser;
use crate::config::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAuth {
    #[serde(default)]
    tokens: Vec<RawToken>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    name: String,
    sha256: String,
    scopes: Vec<String>,
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Increment and read keys: `…/increment`, `GET …/keys/{key}`, `/v1/increments`.
    Count,
    /// Decide: `…/hit`, `…/refund`, `/v1/hits`, `/v1/auth/{ns}`.
    Decide,
    /// Operate: `DELETE …/keys/{key}`, `…/sync`, `GET /v1/namespaces`, the status page.
    Admin,
    /// `GET /metrics`.
    Metrics,
    /// Set and remove keys' runtime limits (`PUT`/`DELETE …/keys/{key}/limits`); read
    /// them, as `admin` may too.
    Limits,
}

impl Scope {
    /// Every scope, in the order the docs list them.
    pub const ALL: [Scope; 5] = [
        Scope::Count,
        Scope::Decide,
        Scope::Admin,
        Scope::Metrics,
        Scope::Limits,
    ];

    /// Its name in the config.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Count => "count",
            Scope::Decide => "decide",
            Scope::Admin => "admin",
            Scope::Metrics => "metrics",
            Scope::Limits => "limits",
        }
    }
}

/// One token: who it is and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// Its name, for the logs.
    pub name: String,
    /// SHA-256 of the token as the client sends it.
    pub sha256: [u8; 32],
    /// What it may do.
    pub scopes: Vec<Scope>,
}

/// The tokens a node accepts. Without `[auth]` there is none and every route is open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfig {
    /// Every token it accepts.
    pub tokens: Vec<Token>,
}

impl Parser<'_> {
    pub(super) fn auth(&self, raw: Option<RawAuth>) -> Result<Option<AuthConfig>, ConfigError> {
        let Some(raw) = raw else {
            return Ok(None);
        };
        if raw.tokens.is_empty() {
            return Err(self.err(
                "auth.tokens",
                "needs at least one token (without [auth] the API is open)".into(),
            ));
        }
        let mut tokens: Vec<Token> = Vec::with_capacity(raw.tokens.len());
        for (i, t) in raw.tokens.into_iter().enumerate() {
            let f = |k: &str| format!("auth.tokens[{i}].{k}");
            if t.name.is_empty() || t.name.len() > 64 {
                return Err(self.err(&f("name"), "must be 1 to 64 bytes".into()));
            }
            if tokens.iter().any(|o| o.name == t.name) {
                return Err(self.err(&f("name"), format!("{:?} is used twice", t.name)));
            }
            let sha256 = parse_sha256(&t.sha256).ok_or_else(|| {
                self.err(
                    &f("sha256"),
                    "must be 64 hex digits (swin-node hash-token prints them)".into(),
                )
            })?;
            if tokens.iter().any(|o| o.sha256 == sha256) {
                return Err(self.err(&f("sha256"), "is the hash of another token".into()));
            }
            if t.scopes.is_empty() {
                return Err(self.err(&f("scopes"), "needs at least one scope".into()));
            }
            let mut scopes = Vec::new();
            for s in &t.scopes {
                let scope = Scope::ALL
                    .into_iter()
                    .find(|k| k.name() == s)
                    .ok_or_else(|| {
                        self.err(
                            &f("scopes"),
                            format!("{s:?} is not \"count\", \"decide\", \"admin\" or \"metrics\""),
                        )
                    })?;
                if !scopes.contains(&scope) {
                    scopes.push(scope);
                }
            }
            tokens.push(Token {
                name: t.name,
                sha256,
                scopes,
            });
        }
        Ok(Some(AuthConfig { tokens }))
    }
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}
