//! The HTTP API: one router per area (counting, decisions, operating a node) merged
//! here, buildable without a socket so tests can drive it directly.

mod admin;
mod auth;
mod client_address;
mod counting;
mod decisions;
pub mod error;
mod extract;
pub mod server;

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;

pub use self::auth::hash_token;
pub use self::extract::ApiPath;
use crate::config::Scope;
use crate::error::Error;
use crate::state::AppState;

/// Every route of the API, over `state`; each area's routes need its scope when the
/// node has `[auth]` (see [`Scope`]), health and readiness never do.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .merge(auth::guard(counting::routes(), &state, Scope::Count))
        .merge(auth::guard(decisions::routes(), &state, Scope::Decide))
        .merge(auth::guard(admin::operate(), &state, Scope::Admin))
        .merge(auth::guard(admin::metrics_route(), &state, Scope::Metrics))
        .merge(admin::health())
        .fallback(|req: Request| async move {
            Error::NotFound(format!("{} {}", req.method(), req.uri().path()))
        })
        .method_not_allowed_fallback(|| async { Error::MethodNotAllowed })
        .layer(middleware::from_fn(bounded_head))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        // the extractors enforce the limit themselves (JSON 413), so no default cap
        .layer(axum::extract::DefaultBodyLimit::max(state.body_limit))
        .with_state(state)
}

/// A URI or headers past the node's limits get 414 or 431 with a JSON error. (hyper
/// answers requests past its own, much larger, buffer itself, without a body.)
async fn bounded_head(req: Request, next: Next) -> Response {
    use axum::response::IntoResponse;
    let uri = req.uri().to_string().len();
    if uri > crate::error::MAX_URI_BYTES {
        return Error::UriTooLong(uri).into_response();
    }
    let headers: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if headers > crate::error::MAX_HEADER_BYTES {
        return Error::HeadersTooLarge(headers).into_response();
    }
    next.run(req).await
}

async fn count_requests(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let resp = next.run(req).await;
    state.metrics.http_request(&route, resp.status().as_u16());
    resp
}
