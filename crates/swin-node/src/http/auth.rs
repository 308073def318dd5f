//! Bearer tokens: each area's routes require a scope ([`guard`]); without `[auth]` in the
//! config every route is open. A token is found by the SHA-256 of what the client sends,
//! compared with every configured hash in constant time.

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderMap;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tracing::{info, warn};

use crate::config::{AuthConfig, Scope, Token};
use crate::error::Error;
use crate::state::AppState;

/// `router`'s routes require `scope` (when the node has `[auth]`).
pub(super) fn guard(
    router: Router<Arc<AppState>>,
    state: &Arc<AppState>,
    scope: Scope,
) -> Router<Arc<AppState>> {
    router.route_layer(middleware::from_fn_with_state(
        (state.clone(), scope),
        authorize,
    ))
}

async fn authorize(
    State((state, scope)): State<(Arc<AppState>, Scope)>,
    req: Request,
    next: Next,
) -> Response {
    let auth = state.auth.load();
    let Some(auth) = auth.as_ref() else {
        return next.run(req).await;
    };
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_owned();
    match check(auth, req.headers(), scope) {
        Ok(token) => {
            state.metrics.auth(&token.name, "allowed");
            next.run(req).await
        }
        Err(Denied::Missing) => {
            state.metrics.auth("", "missing");
            Error::Unauthorized("this route needs a bearer token (Authorization: Bearer …)".into())
                .into_response()
        }
        Err(Denied::Unknown) => {
            state.metrics.auth("", "unknown");
            info!(route, "request with an unknown token");
            Error::Unauthorized("unknown token".into()).into_response()
        }
        Err(Denied::Scope(token)) => {
            state.metrics.auth(&token.name, "forbidden");
            warn!(
                token = token.name,
                scope = scope.name(),
                route,
                "token lacks the scope"
            );
            Error::Forbidden(format!(
                "token {:?} does not have the {:?} scope",
                token.name,
                scope.name()
            ))
            .into_response()
        }
    }
}

#[derive(Debug)]
pub(crate) enum Denied<'a> {
    Missing,
    Unknown,
    Scope(&'a Token),
}

/// The configured token the request carries, if it grants `scope`.
fn check<'a>(
    auth: &'a AuthConfig,
    headers: &HeaderMap,
    scope: Scope,
) -> Result<&'a Token, Denied<'a>> {
    check_authorization(
        auth,
        headers
            .get(axum::http::header::AUTHORIZATION)
            .map(|v| v.as_bytes()),
        scope,
    )
}

/// The configured token an `Authorization` value (an HTTP header, gRPC metadata)
/// carries, if it grants `scope`.
pub(crate) fn check_authorization<'a>(
    auth: &'a AuthConfig,
    authorization: Option<&[u8]>,
    scope: Scope,
) -> Result<&'a Token, Denied<'a>> {
    let presented = authorization.and_then(bearer).ok_or(Denied::Missing)?;
    let token = find(auth, presented).ok_or(Denied::Unknown)?;
    if token.scopes.contains(&scope) {
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
