//! The load generator's gRPC side: Envoy's `ShouldRateLimit` over HTTP/2, one call at
//! a time per connection, scheduled and tallied as HTTP requests are (`load`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rand::SeedableRng;

use crate::schedule::{Shared, Tally};
use crate::spec::LoadSpec;

/// Calls sent straight onto one HTTP/2 connection, as Envoy's client sends them: no
/// channel (tonic's puts a buffer task between a call and its connection, a second
/// wake-up per call that costs this 2-core machine CPU the server then lacks).
#[derive(Clone)]
struct H2Calls(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl tower::Service<hyper::Request<tonic::body::Body>> for H2Calls {
    type Response = hyper::Response<hyper::body::Incoming>;
    type Error = hyper::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: hyper::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(req))
    }
}

/// One HTTP/2 connection asking `ShouldRateLimit`, one call at a time.
pub(crate) async fn grpc_connection(
    spec: Arc<LoadSpec>,
    shared: Arc<Shared>,
    target: String,
    id: usize,
) -> anyhow::Result<Tally> {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let mut tally = Tally::new(spec.windows, spec.latency_log.is_some())?;
    let entries = spec.grpc.clone().unwrap_or_default();
    let stream = tokio::net::TcpStream::connect(&target).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await?;
    tokio::spawn(conn);
    let origin: hyper::Uri = format!("http://{target}").parse()?;
    let mut client = RateLimitServiceClient::with_origin(H2Calls(sender), origin);
    let mut rng = rand::rngs::StdRng::seed_from_u64(id as u64 * 7919 + 1);
    while let Some(t0) = shared.next_request(spec.requests).await {
        let key = spec.keys.pick(&mut rng);
        let req = RateLimitRequest {
            domain: spec.namespace.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: k.clone(),
                        value: v.replace("{key}", &key),
                    })
                    .collect(),
                ..Default::default()
            }],
            hits_addend: 1,
        };
        let sent = Instant::now();
        let asked = client.should_rate_limit(req);
        let answer = tokio::select! {
            answer = asked => answer,
            _ = shared.deadline() => {
                tally.unanswered(t0);
                return Ok(tally);
            }
        };
        let status = match answer {
            Ok(r) if r.get_ref().overall_code == 2 => 429,
            Ok(_) => 200,
            Err(e) => {
                shared.errors.fetch_add(1, Ordering::Relaxed);
                1000 + e.code() as u16
            }
        };
        tally.record(t0, sent, status);
        shared.done.fetch_add(1, Ordering::Relaxed);
        if status >= 1000 {
            // a call that failed may have failed at once (a target that speaks no HTTP/2):
            // let the other tasks run
            tokio::task::yield_now().await;
        }
    }
    Ok(tally)
}
