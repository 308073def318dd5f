//! Bearer tokens over HTTP: each area's routes require a scope ([`guard`]); without
//! `[auth]` in the config every route is open. The check is the doors' shared one
//! ([`crate::auth`]).

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::HeaderMap;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tracing::{info, warn};

use crate::auth::{check_authorization, Denied};
use crate::config::{AuthConfig, Scope, Token};
use crate::error::Error;
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

/// `router`'s routes require one of `scopes` (when the node has `[auth]`).
pub(super) fn guard(
    router: Router<Arc<AppState>>,
    state: &Arc<AppState>,
    scopes: &'static [Scope],
) -> Router<Arc<AppState>> {
    router.route_layer(middleware::from_fn_with_state(
        (state.clone(), scopes),
        authorize,
    ))
}

async fn authorize(
    State((state, scopes)): State<(Arc<AppState>, &'static [Scope])>,
    mut req: Request,
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
    match check(auth, req.headers(), scopes) {
        Ok(token) => {
            state.metrics.auth(&token.name, "allowed");
            req.extensions_mut()
                .insert(Caller(Arc::from(token.name.as_str())));
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
            Error::Forbidden(format!(
                "token {:?} does not have the {wanted} scope",
                token.name,
            ))
            .into_response()
        }
    }
}

/// The configured token the request carries, if it grants `scope`.
fn check<'a>(
    auth: &'a AuthConfig,
    headers: &HeaderMap,
    scopes: &[Scope],
) -> Result<&'a Token, Denied<'a>> {
    check_authorization(
        auth,
        headers
            .get(axum::http::header::AUTHORIZATION)
            .map(|v| v.as_bytes()),
        scopes,
    )
}
