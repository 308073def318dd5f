//! The baseline: a bare axum server with swin-node's increment and hit routes, answering
//! a constant JSON body of the same shape (and, for `/hit`, the same two IETF headers).
//! "swin-node against the cost of HTTP itself".

use axum::http::HeaderValue;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};

fn body() -> serde_json::Value {
    serde_json::json!({"namespace":"api","key":"k","windows":[{"window_size":60,"window_start":1763784000,"current":10.0,"previous":40.0,"rate":30.0}]})
}

/// The answer of an allowed `/hit` under one 60 s limit.
fn hit_answer() -> serde_json::Value {
    serde_json::json!({"allowed":true,"limit":1000000000.0,"remaining":999999990.0,"reset_after":60.0,"retry_after":0.0})
}

pub fn router() -> Router {
    let one = body();
    let hit = hit_answer();
    let batch = serde_json::json!({ "results": [body()] });
    Router::new()
        .route(
            "/v1/namespaces/{namespace}/keys/{key}/increment",
            post(move || {
                let one = one.clone();
                async move { Json(one) }
            }),
        )
        .route(
            "/v1/namespaces/{namespace}/keys/{key}/hit",
            post(move || {
                let hit = hit.clone();
                async move {
                    let mut resp = Json(hit).into_response();
                    let h = resp.headers_mut();
                    let policy = HeaderValue::from_static("\"60s\";q=1000000000;w=60");
                    h.insert("ratelimit-policy", policy);
                    h.insert(
                        "ratelimit",
                        HeaderValue::from_static("\"60s\";r=999999990;t=60"),
                    );
                    resp
                }
            }),
        )
        .route(
            "/v1/increments",
            post(move || {
                let batch = batch.clone();
                async move { Json(batch) }
            }),
        )
}

pub async fn serve(listen: &str) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!("baseline listening on {}", listener.local_addr()?);
    axum::serve(listener, router()).await?;
    Ok(())
}
