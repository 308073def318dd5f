//! `limitador-peer STORAGE LISTEN [FLUSH_MS]`: Limitador behind its own HTTP shape.
//!
//! STORAGE is `memory` (limitador-server's default, the blocking `RateLimiter` over
//! `InMemoryStorage`), `redis` (`AsyncRedisStorage`: a script call per request) or
//! `redis_cached` (`CachedRedisStorage`: counts in memory, flushed every FLUSH_MS).
//! One limit, as swin's `/hit` is given in the same run: namespace `api`, 1,000,000,000
//! hits per 60 s per value of `key` (never reached: both sides count and allow).
//! The request body is limitador-server's: `{"namespace", "values", "delta"}`; the
//! answer is 200 or 429, as its `/check_and_report` without response headers.

use actix_web::{web, App, HttpResponse, HttpServer};
use limitador::limit::{Context, Limit};
use limitador::storage::redis::{AsyncRedisStorage, CachedRedisStorageBuilder};
use limitador::{AsyncRateLimiter, RateLimiter};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

enum Limiter {
    Blocking(RateLimiter),
    Async(AsyncRateLimiter),
}

#[derive(Deserialize)]
struct CheckAndReport {
    namespace: String,
    values: HashMap<String, String>,
    delta: u64,
}

async fn check_and_report(
    limiter: web::Data<Arc<Limiter>>,
    body: web::Json<CheckAndReport>,
) -> HttpResponse {
    let body = body.into_inner();
    let namespace: limitador::limit::Namespace = body.namespace.into();
    let ctx = Context::from(body.values);
    let result = match limiter.as_ref().as_ref() {
        Limiter::Blocking(l) => l.check_rate_limited_and_update(&namespace, &ctx, body.delta),
        Limiter::Async(l) => l.check_rate_limited_and_update(&namespace, &ctx, body.delta).await,
    };
    match result {
        Ok(r) if r.limited => HttpResponse::TooManyRequests().finish(),
        Ok(_) => HttpResponse::Ok().finish(),
        Err(_) => HttpResponse::InternalServerError().finish(),
    }
}

fn limit() -> Limit {
    let variables = vec!["key".try_into().expect("a CEL variable")];
    Limit::new("api", 1_000_000_000, 60, Vec::new(), variables)
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: limitador-peer memory|redis|redis_cached LISTEN [FLUSH_MS] [REDIS_URL]";
    let (storage, listen) = match (args.get(1), args.get(2)) {
        (Some(s), Some(l)) => (s.as_str(), l.clone()),
        _ => panic!("{usage}"),
    };
    let flush_ms: u64 = args.get(3).map_or(1000, |v| v.parse().expect("FLUSH_MS"));
    let redis_url = args.get(4).cloned().unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let limiter = match storage {
        "memory" => {
            let l = RateLimiter::new(10_000);
            l.add_limit(limit());
            Limiter::Blocking(l)
        }
        "redis" => {
            let s = AsyncRedisStorage::new(&redis_url).await.expect("redis");
            let l = AsyncRateLimiter::new_with_storage(Box::new(s));
            l.add_limit(limit());
            Limiter::Async(l)
        }
        "redis_cached" => {
            let s = CachedRedisStorageBuilder::new(&redis_url)
                .flushing_period(Duration::from_millis(flush_ms))
                .build()
                .await
                .expect("redis");
            let l = AsyncRateLimiter::new_with_storage(Box::new(s));
            l.add_limit(limit());
            Limiter::Async(l)
        }
        _ => panic!("{usage}"),
    };
    let limiter = Arc::new(limiter);
    eprintln!("limitador-peer ({storage}) listening on {listen}");
    HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(limiter.clone()))
            .route("/check_and_report", web::post().to(check_and_report))
    })
    .bind(listen)?
    .run()
    .await
}
