//! `limitador-peer STORAGE LISTEN [FLUSH_MS] [REDIS_URL]`: Limitador behind its own HTTP
//! shape and, with `LIMITADOR_PEER_GRPC=ADDR`, its Envoy rate limit service.
//!
//! STORAGE is `memory` (limitador-server's default, the blocking `RateLimiter` over
//! `InMemoryStorage`), `redis` (`AsyncRedisStorage`: a script call per request) or
//! `redis_cached` (`CachedRedisStorage`: counts in memory, flushed every FLUSH_MS).
//! One limit, as swin's `/hit` is given in the same run: namespace `api`, 1,000,000,000
//! hits per 60 s per value of `key` (never reached: both sides count and allow), or
//! `LIMITADOR_PEER_LIMIT=MAX/SECONDS` (and then an hour's limit never reached beside it).
//! The RLS door answers `ShouldRateLimit` as limitador-server's `envoy_rls` does: the
//! descriptors become the CEL list `descriptors`, and the same limit counts per value of
//! `descriptors[0].k` (the entry swin-bench's `--grpc 'k={key}'` sends).
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
        Limiter::Async(l) => {
            l.check_rate_limited_and_update(&namespace, &ctx, body.delta)
                .await
        }
    };
    match result {
        Ok(r) if r.limited => HttpResponse::TooManyRequests().finish(),
        Ok(_) => HttpResponse::Ok().finish(),
        Err(_) => HttpResponse::InternalServerError().finish(),
    }
}

/// `(max, seconds)` of the one limit.
fn max_and_seconds() -> (u64, u64) {
    match std::env::var("LIMITADOR_PEER_LIMIT") {
        Ok(v) => {
            let (m, s) = v.split_once('/').expect("LIMITADOR_PEER_LIMIT=MAX/SECONDS");
            (m.parse().expect("MAX"), s.parse().expect("SECONDS"))
        }
        Err(_) => (1_000_000_000, 60),
    }
}

/// The limit on HTTP's `key` and the same on RLS's first descriptor's `k`; with
/// `LIMITADOR_PEER_LIMIT`, also an hour's limit on `key` never reached, whose counter in
/// the store is every hit admitted (what the fault runs read back).
fn limits() -> Vec<Limit> {
    let (max, seconds) = max_and_seconds();
    let by = |v: &str| vec![v.try_into().expect("a CEL variable")];
    let mut limits = vec![
        Limit::new("api", max, seconds, Vec::new(), by("key")),
        Limit::new("api", max, seconds, Vec::new(), by("descriptors[0].k")),
    ];
    if std::env::var("LIMITADOR_PEER_LIMIT").is_ok() {
        limits.push(Limit::new(
            "api",
            1_000_000_000_000,
            3600,
            Vec::new(),
            by("key"),
        ));
    }
    limits
}

mod rls {
    use super::Limiter;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
        RateLimitService, RateLimitServiceServer,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
    use limitador::limit::Context;
    use std::collections::HashMap;
    use std::sync::Arc;
    use tonic::{Request, Response, Status};

    struct Rls(Arc<Limiter>);

    #[tonic::async_trait]
    impl RateLimitService for Rls {
        async fn should_rate_limit(
            &self,
            request: Request<RateLimitRequest>,
        ) -> Result<Response<RateLimitResponse>, Status> {
            let req = request.into_inner();
            if req.domain.is_empty() {
                return Ok(Response::new(RateLimitResponse {
                    overall_code: Code::Unknown.into(),
                    ..Default::default()
                }));
            }
            let namespace: limitador::limit::Namespace = req.domain.into();
            let values: Vec<HashMap<String, String>> = req
                .descriptors
                .iter()
                .map(|d| {
                    d.entries
                        .iter()
                        .map(|e| (e.key.clone(), e.value.clone()))
                        .collect()
                })
                .collect();
            let hits = if req.hits_addend == 0 {
                1
            } else {
                req.hits_addend
            } as u64;
            let mut ctx = Context::default();
            ctx.list_binding("descriptors".to_string(), values);
            let result = match self.0.as_ref() {
                Limiter::Blocking(l) => l.check_rate_limited_and_update(&namespace, &ctx, hits),
                Limiter::Async(l) => {
                    l.check_rate_limited_and_update(&namespace, &ctx, hits)
                        .await
                }
            };
            let code = match result {
                Ok(r) if r.limited => Code::OverLimit,
                Ok(_) => Code::Ok,
                Err(_) => return Err(Status::unavailable("Service unavailable")),
            };
            Ok(Response::new(RateLimitResponse {
                overall_code: code.into(),
                ..Default::default()
            }))
        }
    }

    /// Serves the RLS door on `listen` until the process ends.
    pub async fn serve(limiter: Arc<Limiter>, listen: std::net::SocketAddr) {
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(Rls(limiter)))
            .serve(listen)
            .await
            .expect("the RLS door")
    }
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
    let redis_url = args
        .get(4)
        .cloned()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let limiter = match storage {
        "memory" => {
            let l = RateLimiter::new(10_000);
            for lim in limits() {
                l.add_limit(lim);
            }
            Limiter::Blocking(l)
        }
        "redis" => {
            let s = AsyncRedisStorage::new(&redis_url).await.expect("redis");
            let l = AsyncRateLimiter::new_with_storage(Box::new(s));
            for lim in limits() {
                l.add_limit(lim);
            }
            Limiter::Async(l)
        }
        "redis_cached" => {
            let s = CachedRedisStorageBuilder::new(&redis_url)
                .flushing_period(Duration::from_millis(flush_ms))
                .build()
                .await
                .expect("redis");
            let l = AsyncRateLimiter::new_with_storage(Box::new(s));
            for lim in limits() {
                l.add_limit(lim);
            }
            Limiter::Async(l)
        }
        _ => panic!("{usage}"),
    };
    let limiter = Arc::new(limiter);
    if let Ok(addr) = std::env::var("LIMITADOR_PEER_GRPC") {
        let addr = addr.parse().expect("LIMITADOR_PEER_GRPC=host:port");
        // spawned on actix's system runtime (one thread), as limitador-server's main does
        tokio::spawn(rls::serve(limiter.clone(), addr));
    }
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
