//! The HTTP API: one router per area (counting, decisions, operating a node) merged
//! here, buildable without a socket so tests can drive it directly.

mod admin;
pub(crate) mod auth;
mod counting;
mod decisions;
pub mod error;
mod extract;
mod idempotency;
mod layers;
mod leases;
mod limits;
mod reservations;
pub mod server;

use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;
use axum::routing::MethodRouter;
use axum::Router;

use self::error::ApiError;
pub use self::extract::ApiPath;
pub use crate::auth::hash_token;
use crate::config::Scope;
use crate::state::AppState;

/// The API's description (OpenAPI 3.1), served at `/v1/openapi.json`; a test checks it
/// against [`routes`].
pub const OPENAPI: &str = include_str!("openapi.json");

/// One route: its method (`*`: any standard method), its path template and its handler. Each area lists
/// its routes; the router is built from those lists, so the list is the router.
#[derive(Debug)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    handler: MethodRouter<Arc<AppState>>,
}

impl Route {
    fn new(method: &'static str, path: &'static str, handler: MethodRouter<Arc<AppState>>) -> Self {
        Route {
            method,
            path,
            handler,
        }
    }
}

/// Each area's routes and the scopes that open them, any one of them (`None`: open to
/// every client).
fn areas() -> Vec<(Vec<Route>, Option<&'static [Scope]>)> {
    vec![
        (counting::routes(), Some(&[Scope::Count])),
        (decisions::routes(), Some(&[Scope::Decide])),
        (leases::routes(), Some(&[Scope::Decide])),
        (reservations::routes(), Some(&[Scope::Decide])),
        (admin::operate(), Some(&[Scope::Admin])),
        (admin::metrics_route(), Some(&[Scope::Metrics])),
        (limits::writes(), Some(&[Scope::Limits])),
        (limits::reads(), Some(&[Scope::Limits, Scope::Admin])),
        (admin::open(), None),
    ]
}

/// Every route of the API: method and path template.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    areas()
        .into_iter()
        .flat_map(|(routes, _)| routes.into_iter().map(|r| (r.method, r.path)))
        .collect()
}

/// Every route of the API, over `state`; each area's routes need its scope when the
/// node has `[auth]` (see [`Scope`]), health, readiness and the description never do.
pub fn router(state: Arc<AppState>) -> Router {
    let mut router = Router::new();
    let mut scoped = layers::Scopes::default();
    for (routes, scope) in areas() {
        let area = routes.into_iter().fold(Router::new(), |r, route| {
            if let Some(scopes) = scope {
                scoped
                    .entry(route.path)
                    .or_default()
                    .push((route.method, scopes));
            }
            r.route(route.path, route.handler)
        });
        router = router.merge(area);
    }
    router
        .fallback(|req: Request| async move {
            ApiError::NotFound(format!("{} {}", req.method(), req.uri().path()))
        })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(layers::Front {
            state: state.clone(),
            scopes: Arc::new(scoped),
        })
        .with_state(state)
}

/// A URI or headers past the node's limits get 414 or 431 with a JSON error. (hyper
/// answers requests past its own, much larger, buffer itself, without a body.)
fn bounded_head(req: &Request) -> Option<Response> {
    use axum::response::IntoResponse;
    // the URI's length without writing it out (this runs on every request)
    let u = req.uri();
    let uri = u.path_and_query().map_or(0, |p| p.as_str().len())
        + u.authority().map_or(0, |a| a.as_str().len())
        + u.scheme_str().map_or(0, str::len);
    if uri > error::MAX_URI_BYTES {
        return Some(ApiError::UriTooLong(uri).into_response());
    }
    let headers: usize = req
        .headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    if headers > error::MAX_HEADER_BYTES {
        return Some(ApiError::HeadersTooLarge(headers).into_response());
    }
    None
}
