//! Bearer tokens over HTTP: each area's routes require a scope (checked by the front
//! layer, [`super::layers::Front`], with [`authorize`]); without
//! `[auth]` in the config every route is open. The check is the doors' shared one
//! ([`crate::auth`]).

use std::sync::Arc;

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use tracing::{info, warn};

use super::error::ApiError;
use crate::auth::{check_authorization, Denied};
use crate::config::{AuthConfig, Scope, Token};
use crate::state::AppState;

/// Who made a request: the name of the token it carried, `anonymous` without `[auth]`
/// (for the log of runtime limit changes).
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<str>);

impl Caller {
    /// The caller of a request (`anonymous` when no token was checked).
    pub fn of(req: &axum::http::Extensions) -> Arc<str> {
        req.get::<Caller>()
            .map_or_else(|| Arc::from("anonymous"), |c| c.0.clone())
    }
}

/// `None` when the request's token grants one of `scopes` (the request then carries its
/// [`Caller`]); otherwise the refusal.
pub(super) fn authorize(
    state: &AppState,
    auth: &AuthConfig,
    scopes: &[Scope],
    req: &mut Request,
) -> Option<Response> {
    let matched = req.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    // the status page is opened by a browser, which sends what its login prompt took as
    // Basic credentials: the password is the token
    let browser = route == "/ui" || route.starts_with("/ui/");
    Some(match check(auth, req.headers(), scopes, browser) {
        Ok(token) => {
            state.metrics.auth(&token.name, "allowed");
            req.extensions_mut()
                .insert(Caller(Arc::from(token.name.as_str())));
            return None;
        }
        Err(Denied::Missing) => {
            state.metrics.auth("", "missing");
            challenge(
                browser,
                ApiError::Unauthorized(
                    "this route needs a bearer token (Authorization: Bearer …)".into(),
                ),
            )
        }
        Err(Denied::Unknown) => {
            state.metrics.auth("", "unknown");
            info!(route, "request with an unknown token");
            challenge(browser, ApiError::Unauthorized("unknown token".into()))
        }
        Err(Denied::Scope(token)) => {
            state.metrics.auth(&token.name, "forbidden");
            let wanted = scopes
                .iter()
                .map(|s| format!("{:?}", s.name()))
                .collect::<Vec<_>>()
                .join(" or ");
            warn!(
                token = token.name,
                scope = wanted,
                route,
                "token lacks the scope"
            );
            ApiError::Forbidden(format!(
                "token {:?} does not have the {wanted} scope",
                token.name,
            ))
            .into_response()
        }
    })
}

/// A 401, asking a browser for credentials (any user name, the token as the password)
/// on the status page's routes.
fn challenge(browser: bool, e: ApiError) -> Response {
    let mut resp = e.into_response();
    if browser {
        resp.headers_mut().append(
            axum::http::header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Basic realm=\"swin\", charset=\"UTF-8\""),
        );
    }
    resp
}

/// The configured token the request carries, if it grants `scope`; with `basic`, Basic
/// credentials carry it as their password too.
fn check<'a>(
    auth: &'a AuthConfig,
    headers: &HeaderMap,
    scopes: &[Scope],
    basic: bool,
) -> Result<&'a Token, Denied<'a>> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let from_basic = value
        .filter(|_| basic)
        .and_then(basic_password)
        .map(|t| format!("Bearer {t}"));
    check_authorization(
        auth,
        from_basic.as_deref().map(str::as_bytes).or(value),
        scopes,
    )
}

/// The password of `Basic <base64 of user:password>` (the scheme in any case); `None`
/// for anything else, which is then checked, and refused, as it came.
fn basic_password(value: &[u8]) -> Option<String> {
    use base64::Engine;
    let (scheme, rest) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim_ascii())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (_, password) = text.split_once(':')?;
    Some(password.to_owned())
}
