//! Two axum services, each with a `swin::Limiter` of its own on one store, share one
//! limit: 5 requests per minute per client across both. Each service puts
//! `swin::tower::LimiterLayer` in front of its routes, keyed by the `x-client` header
//! (`swin::tower::HeaderKey`), so that each run is a client of its own on a shared Redis;
//! a service whose clients are not to choose their key uses `swin::tower::ClientAddr`.
//!
//! ```text
//! cargo run -p swin --features tower --example axum                 # a SQLite file
//! cargo run -p swin --features tower --example axum redis://127.0.0.1:6379
//! ```
//!
//! It sends 4 requests to each service as one client and prints what each answered:
//! 5 pass across the two, 3 are refused with 429 and `Retry-After`.

use std::sync::Arc;

use axum::{routing::get, Router};
use swin::tower::{HeaderKey, LimiterLayer};

/// The config of one service: the namespace `api` on the shared store, decided in the
/// store at every request (`sync_rate = 0`), 5 per minute per key.
fn config(store: &str) -> String {
    let (kind, url) = match store.starts_with("redis://") {
        true => ("redis", store.to_owned()),
        false => ("sqlite", format!("sqlite://{store}")),
    };
    format!(
        "[stores.shared]\nkind = \"{kind}\"\nurl = \"{url}\"\n\
         [[namespaces]]\nname = \"api\"\nstore = \"shared\"\nsync_rate = 0\n\
         window_sizes = [60]\nlimits = [{{ window_size = 60, limit = 5 }}]\n"
    )
}

/// A service answering `/` with `name`, behind the rate limit layer.
async fn service(name: &'static str, store: &str) -> anyhow::Result<String> {
    let limiter =
        Arc::new(swin::Limiter::start(swin::config::Config::from_toml(&config(store))?).await?);
    // every byte of the header is the key: a value past ASCII is counted like any other,
    // and a request without the header is refused 400, never let through
    let layer = LimiterLayer::builder(limiter, "api")
        .key(HeaderKey::new("x-client"))
        .build()?;
    let app = Router::new()
        .route("/", get(move || async move { name }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(base)
}

/// One GET of `/` as `client`: (status, Retry-After, RateLimit).
async fn get_as(base: &str, client: &str) -> anyhow::Result<(u16, String, String)> {
    let response = reqwest::Client::new()
        .get(format!("{base}/"))
        .header("x-client", client)
        .send()
        .await?;
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned()
    };
    Ok((
        response.status().as_u16(),
        header("retry-after"),
        header("ratelimit"),
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = std::env::args()
        .nth(1)
        .unwrap_or_else(|| dir.path().join("shared.db").display().to_string());
    let a = service("service a", &store).await?;
    let b = service("service b", &store).await?;
    // a client no other run has used, so a shared Redis starts it at nothing
    let client = format!("client-{}", std::process::id());
    let (mut passed, mut refused) = (0, 0);
    for base in [&a, &b] {
        for _ in 0..4 {
            let (status, retry_after, state) = get_as(base, &client).await?;
            println!("{base}: {status} ratelimit={state} retry-after={retry_after}");
            match status {
                200 => passed += 1,
                _ => refused += 1,
            }
        }
    }
    println!("across both services: {passed} passed, {refused} refused (limit 5 per minute)");
    anyhow::ensure!(
        (passed, refused) == (5, 3),
        "one limit across both services"
    );
    Ok(())
}
