//! Envoy's rate limit quota service (`envoy.service.rate_limit_quota.v3`,
//! `StreamRateLimitQuotas`) on the gRPC listener, beside the rate limit service: one
//! stream per proxy, its usage reports turned into [`swin::shares::Reports`] and the
//! library's [`BucketAction`]s rendered back — as an answer to each report, and
//! whenever a sharing round changes what a proxy is to enforce. The stream ends when
//! the proxy ends it, on a report the library refuses (INVALID_ARGUMENT), on one it
//! cannot read (past the 4 MB message limit: RESOURCE_EXHAUSTED), or when the node
//! stops (the proxies keep their assignments until their ttl, then fall back to their
//! `expired_assignment_behavior`).

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Kind, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction as PbAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf;
use futures_util::Stream;
use swin::error::Error;
use swin::shares::{Action, BucketAction, Proxy, Reports, Usage};
use swin::Client;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::metrics::Metrics;
use crate::state::AppState;

/// The quota service over the node's shares.
#[derive(Debug, Clone)]
pub struct Rlqs {
    state: Arc<AppState>,
    stop: CancellationToken,
}

impl Rlqs {
    pub fn new(state: Arc<AppState>, stop: CancellationToken) -> Self {
        Rlqs { state, stop }
    }
}

/// Counts a stream open while it lives.
struct Open(Arc<AppState>);

impl Open {
    fn new(state: Arc<AppState>) -> Open {
        state.metrics.quota_streams.fetch_add(1, Ordering::Relaxed);
        Open(state)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.metrics.quota_streams.fetch_sub(1, Ordering::Relaxed);
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for Rlqs {
    type StreamRateLimitQuotasStream = Answers;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Answers>, Status> {
        // the caller's trace context, which each report's span joins
        let headers = request.metadata().clone().into_headers();
        // the client its streams are capped for: its token's name, else its address
        let client = match request.extensions().get::<super::Caller>() {
            Some(caller) => Client::Token(caller.0.to_string()),
            None => request
                .remote_addr()
                .map_or(Client::Unknown, |a| Client::Address(a.ip())),
        };
        let reports = request.into_inner();
        let (proxy, pushed) = self
            .state
            .limiter
            .quota_stream(&client)
            .map_err(|e| match e {
                Error::Exhausted(m) => {
                    // no report named a domain yet: counted as no namespace
                    self.state
                        .metrics
                        .quota_told(label(&self.state, ""), "refused", 1);
                    Status::resource_exhausted(m)
                }
                other => Status::internal(other.to_string()),
            })?;
        let (tx, rx) = mpsc::channel(8);
        let stream = ProxyStream {
            open: Open::new(self.state.clone()),
            proxy,
            headers,
        };
        tokio::spawn(serve_stream(stream, reports, pushed, tx, self.stop.clone()));
        let answers =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|a| (a, rx)) },
            );
        Ok(Response::new(Box::pin(answers)))
    }
}

/// A proxy's stream as the door keeps it.
struct ProxyStream {
    open: Open,
    proxy: Proxy,
    /// The call's headers: its trace context.
    headers: axum::http::HeaderMap,
}

impl ProxyStream {
    /// Why the stream's token no longer opens it (a reload removed it, or its scope),
    /// if it does not.
    fn revoked(&self, state: &AppState) -> Option<Status> {
        let token = self.headers.get("authorization").map(|v| v.as_bytes());
        super::caller(state, token, false).err()
    }

    /// Takes one report in a span of its own (when traces are on and it is sampled),
    /// joined to the caller's trace: the store calls it makes are its children.
    async fn report(&self, r: RateLimitQuotaUsageReports) -> Result<Vec<BucketAction>, Error> {
        let span = crate::telemetry::request_span(&self.headers, || {
            tracing::trace_span!(
                target: crate::telemetry::REQUEST,
                "request",
                otel.name = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas",
                otel.kind = "server",
                rpc.system = "grpc",
                rpc.service = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
                rpc.method = "StreamRateLimitQuotas",
                namespace = r.domain.as_str(),
                buckets = r.bucket_quota_usages.len(),
            )
        });
        tracing::Instrument::instrument(
            self.open.0.limiter.quota_report(&self.proxy, translate(r)),
            span,
        )
        .await
    }
}

/// One proxy's stream, until it ends, the library refuses a report, or the node stops.
async fn serve_stream(
    stream: ProxyStream,
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    mut pushed: mpsc::Receiver<Vec<BucketAction>>,
    tx: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    stop: CancellationToken,
) {
    let state = &stream.open.0;
    let metrics = &state.metrics;
    // the stream's domain, for the metrics (its first report names it), looked up at
    // each answer: a reload may add or remove its namespace
    let mut domain = String::new();
    loop {
        let answer = tokio::select! {
            _ = stop.cancelled() => return,
            _ = tx.closed() => return,
            Some(actions) = pushed.recv() => Ok(render(actions, label(state, &domain), metrics)),
            report = reports.message() => match report {
                Ok(Some(r)) => 'report: {
                    // a token a reload removed takes no report
                    if let Some(refused) = stream.revoked(state) {
                        break 'report Err(refused);
                    }
                    if domain.is_empty() {
                        domain.clone_from(&r.domain);
                    }
                    match stream.report(r).await {
                        Ok(actions) => Ok(render(actions, label(state, &domain), metrics)),
                        Err(e) => {
                            metrics.quota_told(label(state, &domain), "refused", 1);
                            Err(Status::invalid_argument(e.to_string()))
                        }
                    }
                }
                // the proxy ended the stream
                Ok(None) => return,
                // a report that could not be read ends the stream with why, not with OK
                // and no answer: past the message size limit, tonic's OUT_OF_RANGE naming
                // the limit and the size, which the listener answers as
                // RESOURCE_EXHAUSTED (`super::too_large_is_exhausted`)
                Err(status) => Err(status),
            },
        };
        // a token a reload removed (or took the scope from) ends the streams it opened
        let answer = match stream.revoked(state) {
            None => answer,
            Some(refused) => Err(refused),
        };
        let last = answer.is_err();
        let empty = matches!(&answer, Ok(r) if r.bucket_action.is_empty());
        if !empty && tx.send(answer).await.is_err() || last {
            return;
        }
    }
}

/// The stream's `domain` in the metrics: as the rate limit service labels its calls'.
fn label<'a>(state: &AppState, domain: &'a str) -> &'a str {
    super::domain_label(domain, state.limiter.serves(domain).is_ok())
}

fn translate(r: RateLimitQuotaUsageReports) -> Reports {
    let usages = r
        .bucket_quota_usages
        .into_iter()
        .map(|u| {
            Usage::new(
                u.bucket_id
                    .map(|b| b.bucket.into_iter().collect())
                    .unwrap_or_default(),
                u.time_elapsed.and_then(|d| {
                    let nanos = u32::try_from(d.nanos).ok()?;
                    Some(Duration::new(u64::try_from(d.seconds).ok()?, nanos))
                }),
                u.num_requests_allowed,
                u.num_requests_denied,
            )
        })
        .collect();
    Reports::new(r.domain, usages)
}

fn duration(d: Duration) -> protobuf::Duration {
    protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

/// The actions as Envoy's message; each counted for `domain`.
fn render(actions: Vec<BucketAction>, domain: &str, metrics: &Metrics) -> RateLimitQuotaResponse {
    let assign = |strategy: Strategy, ttl: Duration| {
        Kind::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(duration(ttl)),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })
    };
    for a in &actions {
        let name = match a.action() {
            Action::Assign { .. } => "assign",
            Action::AllowAll { .. } => "allow_all",
            Action::DenyAll { .. } => "deny_all",
            Action::Abandon => "abandon",
        };
        metrics.quota_told(domain, name, 1);
    }
    let bucket_action = actions
        .into_iter()
        .map(|a| PbAction {
            bucket_id: Some(BucketId {
                bucket: a.bucket().clone().into_iter().collect(),
            }),
            bucket_action: Some(match a.action() {
                Action::Assign {
                    tokens_per_fill,
                    fill_interval,
                    max_tokens,
                    ttl,
                } => assign(
                    Strategy::TokenBucket(TokenBucket {
                        max_tokens,
                        tokens_per_fill: Some(protobuf::UInt32Value {
                            value: tokens_per_fill,
                        }),
                        fill_interval: Some(duration(fill_interval)),
                    }),
                    ttl,
                ),
                Action::AllowAll { ttl } => {
                    assign(Strategy::BlanketRule(BlanketRule::AllowAll as i32), ttl)
                }
                Action::DenyAll { ttl } => {
                    assign(Strategy::BlanketRule(BlanketRule::DenyAll as i32), ttl)
                }
                Action::Abandon => Kind::AbandonAction(AbandonAction {}),
            }),
        })
        .collect();
    RateLimitQuotaResponse { bucket_action }
}
