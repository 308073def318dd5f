//! Bearer tokens, the same on every door (HTTP and gRPC): the token an `Authorization`
//! value carries is found by the SHA-256 of what the client sends, compared with every
//! configured hash in constant time, and must grant the route's scope.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{AuthConfig, Scope, Token};

/// Why a request was not let in.
#[derive(Debug)]
pub enum Denied<'a> {
    /// No token (401).
    Missing,
    /// A token the node does not know (401).
    Unknown,
    /// A known token without the route's scope (403).
    Scope(&'a Token),
}

/// The configured token an `Authorization` value (an HTTP header, gRPC metadata)
/// carries, if it grants one of `scopes`.
pub fn check_authorization<'a>(
    auth: &'a AuthConfig,
    authorization: Option<&[u8]>,
    scopes: &[Scope],
) -> Result<&'a Token, Denied<'a>> {
    let presented = authorization.and_then(bearer).ok_or(Denied::Missing)?;
    let token = find(auth, presented).ok_or(Denied::Unknown)?;
    if token.scopes.iter().any(|s| scopes.contains(s)) {
        Ok(token)
    } else {
        Err(Denied::Scope(token))
    }
}

/// The token of `Bearer <token>` (the scheme in any case, RFC 7235).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// The token whose hash is the presented token's: every configured hash is compared, in
/// constant time, whatever matches.
fn find<'a>(auth: &'a AuthConfig, presented: &[u8]) -> Option<&'a Token> {
    let hash: [u8; 32] = Sha256::digest(presented).into();
    let mut found = None;
    for t in &auth.tokens {
        if bool::from(t.sha256.ct_eq(&hash)) {
            found = Some(t);
        }
    }
    found
}

/// The hex SHA-256 of a token, as `[auth]` wants it (`swin-node hash-token`).
pub fn hash_token(token: &[u8]) -> String {
    Sha256::digest(token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
