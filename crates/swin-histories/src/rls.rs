//! Envoy's door: `ShouldRateLimit` over gRPC, one channel per node, its answer recorded
//! as the HTTP doors' are — a reply as 200 `{"overall_code": …, "statuses": […]}`, a gRPC
//! error as its HTTP counterpart with `{"grpc": code, "message": …}` (UNAVAILABLE as
//! 503: it may have counted), no reply as unknown.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde_json::{json, Value};
use tonic::transport::{Channel, Endpoint};

use crate::history::Answer;

/// One lazily connected channel per node's gRPC address.
#[derive(Debug)]
pub struct Rls {
    channels: Vec<Channel>,
}

/// `{"domain": d, "descriptors": [[[k, v], …], …], "hits_addend": n}` as Envoy sends it.
pub fn request(body: &Value) -> RateLimitRequest {
    let descriptors = body["descriptors"]
        .as_array()
        .map(|ds| {
            ds.iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .as_array()
                        .map(|es| {
                            es.iter()
                                .map(|e| Entry {
                                    key: e[0].as_str().unwrap_or_default().to_owned(),
                                    value: e[1].as_str().unwrap_or_default().to_owned(),
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    ..Default::default()
                })
                .collect()
        })
        .unwrap_or_default();
    RateLimitRequest {
        domain: body["domain"].as_str().unwrap_or_default().to_owned(),
        descriptors,
        hits_addend: body["hits_addend"].as_u64().unwrap_or(1) as u32,
    }
}

/// The counter key swin keeps a descriptor on: `key=value|key=value` (docs/envoy.md;
/// the values here need no escaping).
pub fn counter_key(descriptor: &Value) -> String {
    descriptor
        .as_array()
        .map(|es| {
            es.iter()
                .map(|e| {
                    format!(
                        "{}={}",
                        e[0].as_str().unwrap_or(""),
                        e[1].as_str().unwrap_or("")
                    )
                })
                .collect::<Vec<_>>()
                .join("|")
        })
        .unwrap_or_default()
}

fn code_name(c: i32) -> &'static str {
    match Code::try_from(c) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

impl Rls {
    pub fn new(addrs: &[String]) -> Rls {
        let channels = addrs
            .iter()
            .map(|a| {
                Endpoint::from_shared(format!("http://{a}"))
                    .expect("a gRPC address")
                    .timeout(Duration::from_secs(5))
                    .connect_timeout(Duration::from_secs(1))
                    .connect_lazy()
            })
            .collect();
        Rls { channels }
    }

    /// Sends `body` (see [`request`]) to node `node`.
    pub async fn send(&self, node: usize, body: &Value) -> Answer {
        let mut client = RateLimitServiceClient::new(self.channels[node].clone());
        match client.should_rate_limit(request(body)).await {
            Ok(r) => {
                let r = r.into_inner();
                let statuses: Vec<Value> = r
                    .statuses
                    .iter()
                    .map(|s| json!({"code": code_name(s.code), "limit_remaining": s.limit_remaining}))
                    .collect();
                let body = json!({"overall_code": code_name(r.overall_code), "statuses": statuses});
                Answer::Status {
                    status: 200,
                    body: body.to_string(),
                }
            }
            Err(s) => {
                use tonic::Code as G;
                let status = match s.code() {
                    G::InvalidArgument => 400,
                    G::ResourceExhausted => 429,
                    G::Unavailable => 503,
                    G::DeadlineExceeded | G::Cancelled | G::Unknown => {
                        return Answer::Unknown {
                            reason: format!("gRPC {:?}: {}", s.code(), s.message()),
                        }
                    }
                    _ => 500,
                };
                let body = json!({"grpc": format!("{:?}", s.code()), "message": s.message()});
                Answer::Status {
                    status,
                    body: body.to_string(),
                }
            }
        }
    }
}
