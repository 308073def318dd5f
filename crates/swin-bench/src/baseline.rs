//! The baseline: a bare axum server with swin-node's increment routes, answering a
//! constant JSON body of the same shape. "swin-node against the cost of HTTP itself".

use axum::routing::post;
use axum::{Json, Router};

fn body() -> serde_json::Value {
    serde_json::json!({"namespace":"api","key":"k","windows":[{"window_size":60,"window_start":1763784000,"current":10.0,"previous":40.0,"rate":30.0}]})
}

pub fn router() -> Router {
    let one = body();
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
