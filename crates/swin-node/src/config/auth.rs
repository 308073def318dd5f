//! The `[auth]` section: bearer tokens, each with a name (for logs and metrics) and the
//! scopes it grants. The config holds the SHA-256 of each token, never the token; or it
//! names the environment variable that holds the token (`token_env`, as a container
//! orchestrator passes a secret), which is hashed as the config is read.

use serde::Deserialize;

use swin::config::ConfigError;

use super::Parser;

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
    sha256: Option<String>,
    token_env: Option<String>,
    scopes: Vec<String>,
}

/// The fewest bytes a token read from the environment may have: a placeholder left in an
/// example secret is refused rather than served (`openssl rand -hex 32` makes 64).
const MIN_TOKEN_BYTES: usize = 16;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Increment and read keys: `…/increment`, `GET …/keys/{key}`, `/v1/increments`.
    Count,
    /// Decide: `…/hit`, `…/refund`, `/v1/hits`, `/v1/auth/{ns}`, leases, and reserve,
    /// extend and commit (over one key or several).
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
            let sha256 = self.token_hash(&t, &f)?;
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

    /// The token's SHA-256: written in the config, or of the token in `token_env`.
    fn token_hash(
        &self,
        t: &RawToken,
        f: &dyn Fn(&str) -> String,
    ) -> Result<[u8; 32], ConfigError> {
        match (&t.sha256, &t.token_env) {
            (Some(hex), None) => parse_sha256(hex).ok_or_else(|| {
                self.err(
                    &f("sha256"),
                    "must be 64 hex digits (swin-node hash-token prints them)".into(),
                )
            }),
            (None, Some(var)) => {
                let value = (self.env)(var).ok_or_else(|| {
                    self.err(
                        &f("token_env"),
                        format!("the environment variable {var:?} is not set (it holds the token)"),
                    )
                })?;
                // one line: the newline a file made into a secret may end with is not
                // part of the token (as `hash-token` reads it)
                let token = value.strip_suffix('\n').unwrap_or(&value);
                let token = token.strip_suffix('\r').unwrap_or(token);
                if token.len() < MIN_TOKEN_BYTES {
                    return Err(self.err(
                        &f("token_env"),
                        format!(
                            "the token in {var:?} is {} bytes; a token needs at least {MIN_TOKEN_BYTES} (openssl rand -hex 32 makes one)",
                            token.len()
                        ),
                    ));
                }
                use sha2::{Digest, Sha256};
                Ok(Sha256::digest(token.as_bytes()).into())
            }
            (Some(_), Some(_)) => Err(self.err(
                &f("token_env"),
                "a token is given by sha256 or by token_env, not both".into(),
            )),
            (None, None) => Err(self.err(
                &f("sha256"),
                "is required, or token_env: the variable holding the token".into(),
            )),
        }
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
