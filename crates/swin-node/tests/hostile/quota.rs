//! Envoy's rate limit quota service as a hostile proxy sees it: a report with no
//! domain, an unknown domain, buckets that are empty, unnamed, too wide or matched by no
//! rule, a report of too many buckets, a token without the scope — each answered as the
//! proto and gRPC conventions say, none ending another stream's or another bucket's
//! assignment, and only the reports taken counted, exactly. Each case runs in plain gRPC
//! and over TLS.

use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::google::protobuf;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use super::grpc::{start_with, Running};

/// A local namespace `quota` sharing 100 per second on bucket `name=api`.
const QUOTA: &str = "[[namespaces]]\nname = \"quota\"\nsync_rate = -1\nwindow_sizes = [60]\n\
    [[namespaces.descriptors]]\nkey = \"name\"\nvalue = \"api\"\n\
    rate_limit = { unit = \"second\", requests_per_unit = 100 }\n";

fn bucket(pairs: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

fn usage(b: BucketId, allowed: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(b),
        time_elapsed: Some(protobuf::Duration {
            seconds: 1,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: 0,
    }
}

fn report(domain: &str, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.into(),
        bucket_quota_usages: usages,
    }
}

/// One proxy's stream: what it sends, and the answers (or the status that ended it).
struct Stream {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: tonic::Streaming<RateLimitQuotaResponse>,
}

async fn open(channel: &Channel, token: Option<&str>) -> Result<Stream, tonic::Status> {
    let (tx, rx) = mpsc::channel(16);
    let reports =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let mut req = tonic::Request::new(reports);
    if let Some(t) = token {
        let value = format!("Bearer {t}").parse().expect("metadata");
        req.metadata_mut().insert("authorization", value);
    }
    let answers = RateLimitQuotaServiceClient::new(channel.clone())
        .stream_rate_limit_quotas(req)
        .await?
        .into_inner();
    Ok(Stream { tx, answers })
}

impl Stream {
    async fn send(&self, r: RateLimitQuotaUsageReports) {
        self.tx.send(r).await.expect("the stream takes reports");
    }

    /// The next answer within 3 s (two rounds and a ttl refresh fit in it).
    async fn next(&mut self) -> Result<Option<RateLimitQuotaResponse>, tonic::Status> {
        tokio::time::timeout(Duration::from_secs(3), self.answers.message())
            .await
            .expect("an answer within 3 s")
    }

    /// Answers until one names `pairs`: its action.
    async fn action_for(&mut self, pairs: &[(&str, &str)]) -> Kind {
        let want = bucket(pairs);
        loop {
            let r = self.next().await.expect("answers").expect("an open stream");
            if let Some(a) = r
                .bucket_action
                .into_iter()
                .find(|a| a.bucket_id.as_ref() == Some(&want))
            {
                return a.bucket_action.expect("an action");
            }
        }
    }
}

fn is_assignment(k: &Kind) -> bool {
    matches!(k, Kind::QuotaAssignmentAction(q) if q.rate_limit_strategy.is_some())
}

/// The node's count of `name=api` in `quota` (its minute, and the one before), over
/// HTTP (HTTPS when the node serves TLS) with `token`.
async fn counted(r: &Running, tls: bool, token: Option<&str>) -> f64 {
    let base = match tls {
        true => r.base().replacen("http://", "https://", 1),
        false => r.base(),
    };
    // the node's certificate is its own, for "localhost": this client reads counts only
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("client");
    let mut get = client.get(format!(
        "{base}/v1/namespaces/quota/keys/name%3Dapi?window_size=60"
    ));
    if let Some(t) = token {
        get = get.bearer_auth(t);
    }
    let v: serde_json::Value = get.send().await.expect("read").json().await.expect("json");
    let w = &v["windows"][0];
    w["current"].as_f64().expect("current") + w["previous"].as_f64().expect("previous")
}

/// A report with no domain ends its own stream with INVALID_ARGUMENT, counting nothing;
/// another proxy's stream goes on being told its assignment.
async fn a_report_without_a_domain_ends_only_its_stream(tls: bool) {
    let r = start_with(QUOTA, tls).await;
    let mut good = open(&r.channel, None).await.expect("open");
    good.send(report("quota", vec![usage(bucket(&[("name", "api")]), 7)]))
        .await;
    assert!(is_assignment(&good.action_for(&[("name", "api")]).await));
    let mut bad = open(&r.channel, None).await.expect("open");
    bad.send(report("", vec![usage(bucket(&[("name", "api")]), 1_000)]))
        .await;
    let ended = bad.next().await.expect_err("the stream ends");
    assert_eq!(ended.code(), tonic::Code::InvalidArgument, "{ended:?}");
    assert!(ended.message().contains("domain"), "{ended:?}");
    // the good stream is told its assignment again before its ttl (2 s) lapses
    assert!(is_assignment(&good.action_for(&[("name", "api")]).await));
    assert_eq!(counted(&r, tls, None).await, 7.0);
    // the operator sees one proxy left, on /metrics and on the status page
    let status = get(&r, tls, "/ui/status").await;
    let status: serde_json::Value = serde_json::from_str(&status).expect("json");
    assert_eq!(status["quota_streams"], 1, "{status}");
    let metrics = get(&r, tls, "/metrics").await;
    assert!(metrics.contains("\nswin_quota_streams 1\n"), "{metrics}");
    assert!(
        metrics.contains("swin_quota_actions_total{domain=\"unknown\",action=\"refused\"} 1"),
        "{metrics}"
    );
}

/// A GET of `path` on the node's HTTP listener: its body.
async fn get(r: &Running, tls: bool, path: &str) -> String {
    let base = match tls {
        true => r.base().replacen("http://", "https://", 1),
        false => r.base(),
    };
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("client")
        .get(format!("{base}{path}"))
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("body")
}

/// Buckets that are unnamed, too wide or of no rule are abandoned and an empty one is
/// skipped, while the good bucket of the same report is assigned and counted; an
/// unknown domain abandons every bucket and counts nothing.
async fn bad_buckets_are_abandoned_and_the_others_answered(tls: bool) {
    let r = start_with(QUOTA, tls).await;
    let mut s = open(&r.channel, None).await.expect("open");
    let wide: Vec<(String, String)> = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
    let wide: Vec<(&str, &str)> = wide.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    s.send(report(
        "quota",
        vec![
            usage(bucket(&[("name", "")]), 5),
            usage(bucket(&[]), 5),
            usage(bucket(&wide), 5),
            usage(bucket(&[("other", "x")]), 5),
            usage(bucket(&[("name", "api")]), 3),
        ],
    ))
    .await;
    let first = s.next().await.expect("answers").expect("open");
    let abandoned = |pairs: &[(&str, &str)]| {
        let want = bucket(pairs);
        first.bucket_action.iter().any(|a| {
            a.bucket_id.as_ref() == Some(&want)
                && matches!(a.bucket_action, Some(Kind::AbandonAction(_)))
        })
    };
    assert!(abandoned(&[("name", "")]), "{first:?}");
    assert!(abandoned(&wide), "{first:?}");
    assert!(abandoned(&[("other", "x")]), "{first:?}");
    assert!(
        !first
            .bucket_action
            .iter()
            .any(|a| a.bucket_id == Some(bucket(&[]))),
        "{first:?}"
    );
    assert!(is_assignment(&s.action_for(&[("name", "api")]).await));
    let mut unknown = open(&r.channel, None).await.expect("open");
    unknown
        .send(report(
            "nowhere",
            vec![usage(bucket(&[("name", "api")]), 9)],
        ))
        .await;
    let k = unknown.action_for(&[("name", "api")]).await;
    assert!(matches!(k, Kind::AbandonAction(_)), "{k:?}");
    assert_eq!(counted(&r, tls, None).await, 3.0);
}

/// More buckets in one report than the service takes: INVALID_ARGUMENT, nothing counted.
async fn a_report_of_too_many_buckets_is_refused(tls: bool) {
    let r = start_with(QUOTA, tls).await;
    let mut s = open(&r.channel, None).await.expect("open");
    let usages = (0..10_001)
        .map(|_| usage(bucket(&[("name", "api")]), 1))
        .collect();
    s.send(report("quota", usages)).await;
    let ended = s.next().await.expect_err("the stream ends");
    assert_eq!(ended.code(), tonic::Code::InvalidArgument, "{ended:?}");
    assert_eq!(counted(&r, tls, None).await, 0.0);
}

/// The quota service takes the HTTP API's tokens: none is UNAUTHENTICATED, a token
/// without the `decide` scope PERMISSION_DENIED, and neither counts anything.
async fn the_quota_service_takes_the_same_tokens(tls: bool) {
    let auth = format!(
        "[[auth.tokens]]\nname = \"reader\"\nsha256 = \"{}\"\nscopes = [\"count\"]\n\
         [[auth.tokens]]\nname = \"proxy\"\nsha256 = \"{}\"\nscopes = [\"decide\", \"count\"]\n",
        super::grpc::sha256("r-token"),
        super::grpc::sha256("p-token"),
    );
    let r = start_with(&format!("{auth}\n{QUOTA}"), tls).await;
    for (token, code) in [
        (None, tonic::Code::Unauthenticated),
        (Some("r-token"), tonic::Code::PermissionDenied),
    ] {
        let refused = match open(&r.channel, token).await {
            Err(status) => status,
            Ok(mut s) => {
                s.send(report("quota", vec![usage(bucket(&[("name", "api")]), 4)]))
                    .await;
                s.next().await.expect_err("refused")
            }
        };
        assert_eq!(refused.code(), code, "{token:?}: {refused:?}");
    }
    let mut s = open(&r.channel, Some("p-token")).await.expect("open");
    s.send(report("quota", vec![usage(bucket(&[("name", "api")]), 2)]))
        .await;
    assert!(is_assignment(&s.action_for(&[("name", "api")]).await));
    assert_eq!(counted(&r, tls, Some("p-token")).await, 2.0);
}

/// A token a reload removes ends the quota streams it opened (with UNAUTHENTICATED) at
/// their next answer, counting nothing more; another token's stream goes on.
async fn a_token_removed_by_a_reload_ends_its_streams(tls: bool) {
    let token = |name: &str, secret: &str| {
        format!(
            "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nscopes = [\"decide\", \"count\"]\n",
            super::grpc::sha256(secret)
        )
    };
    let both = format!(
        "{}{}\n{QUOTA}",
        token("old", "o-token"),
        token("new", "n-token")
    );
    let r = start_with(&both, tls).await;
    let mut old = open(&r.channel, Some("o-token")).await.expect("open");
    let mut new = open(&r.channel, Some("n-token")).await.expect("open");
    for s in [&mut old, &mut new] {
        s.send(report("quota", vec![usage(bucket(&[("name", "api")]), 1)]))
            .await;
        assert!(is_assignment(&s.action_for(&[("name", "api")]).await));
    }
    r.reload(&format!("{}\n{QUOTA}", token("new", "n-token")));
    // the reload applies within a second or two; reports after it are refused
    tokio::time::sleep(Duration::from_secs(2)).await;
    // its stream ends at its next answer (a report's, or a round's refresh)
    let _ = old
        .tx
        .send(report("quota", vec![usage(bucket(&[("name", "api")]), 50)]))
        .await;
    let ended = loop {
        match old.next().await {
            Err(status) => break status,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended with OK"),
        }
    };
    assert_eq!(ended.code(), tonic::Code::Unauthenticated, "{ended:?}");
    new.send(report("quota", vec![usage(bucket(&[("name", "api")]), 3)]))
        .await;
    assert!(is_assignment(&new.action_for(&[("name", "api")]).await));
    // 1 + 1 + 3 (the answer seen may be a round's, before the report's): the removed
    // token's last report counted nothing
    let mut total = 0.0;
    for _ in 0..50 {
        total = counted(&r, tls, Some("n-token")).await;
        if total >= 5.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!((total, counted(&r, tls, Some("n-token")).await), (5.0, 5.0));
}

/// One client cannot take the node's room for buckets from the others: a token holding
/// `quota.buckets_per_client` (150) across three streams gets its next new buckets
/// abandoned, and another token's new bucket is still assigned on a node that holds 200.
async fn one_client_cannot_fill_the_node_with_buckets(tls: bool) {
    let token = |name: &str, secret: &str| {
        format!(
            "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nscopes = [\"decide\", \"count\"]\n",
            super::grpc::sha256(secret)
        )
    };
    let config = format!(
        "{}{}[quota]\nbuckets_per_stream = 100\nbuckets_per_client = 150\nbuckets = 200\n\
         [[namespaces]]\nname = \"quota\"\nsync_rate = -1\nwindow_sizes = [60]\n\
         [[namespaces.descriptors]]\nkey = \"name\"\n\
         rate_limit = {{ unit = \"second\", requests_per_unit = 100 }}\n",
        token("flood", "f-token"),
        token("honest", "h-token"),
    );
    let r = start_with(&config, tls).await;
    let mut abandoned = Vec::new();
    let mut held = Vec::new();
    for s in 0..3 {
        let mut stream = open(&r.channel, Some("f-token")).await.expect("open");
        let names: Vec<String> = (0..100).map(|i| format!("f{s}-{i}")).collect();
        let usages = names
            .iter()
            .map(|n| usage(bucket(&[("name", n.as_str())]), 1))
            .collect();
        stream.send(report("quota", usages)).await;
        let answer = stream.next().await.expect("answers").expect("open");
        abandoned.push(
            answer
                .bucket_action
                .iter()
                .filter(|a| matches!(a.bucket_action, Some(Kind::AbandonAction(_))))
                .count(),
        );
        held.push(stream);
    }
    // 100 + 50 taken: the client's cap; the rest abandoned
    assert_eq!(abandoned, [0, 50, 100]);
    let mut honest = open(&r.channel, Some("h-token")).await.expect("open");
    honest
        .send(report("quota", vec![usage(bucket(&[("name", "api")]), 1)]))
        .await;
    assert!(is_assignment(&honest.action_for(&[("name", "api")]).await));
}

/// A runtime limit set on a bucket's counter key replaces its rule's for the proxies,
/// as for every other door: a rule of 100 per second and a runtime limit of 30 per
/// second on `name=api` assign 30 (or less), never 100.
async fn a_runtime_limit_on_the_buckets_key_is_what_the_proxies_share(tls: bool) {
    let r = start_with(QUOTA, tls).await;
    let base = match tls {
        true => r.base().replacen("http://", "https://", 1),
        false => r.base(),
    };
    let set = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("client")
        .put(format!("{base}/v1/namespaces/quota/keys/name%3Dapi/limits"))
        .json(&serde_json::json!({"limits": [{"window_size": 1, "limit": 30}]}))
        .send()
        .await
        .expect("put");
    assert_eq!(set.status(), 200, "{:?}", set.text().await);
    let mut s = open(&r.channel, None).await.expect("open");
    s.send(report("quota", vec![usage(bucket(&[("name", "api")]), 1)]))
        .await;
    let tokens = |k: &Kind| match k {
        Kind::QuotaAssignmentAction(q) => match q.rate_limit_strategy.and_then(|r| r.strategy) {
            Some(Strategy::TokenBucket(tb)) => tb.tokens_per_fill.map(|t| t.value),
            _ => None,
        },
        Kind::AbandonAction(_) => None,
    };
    let first = s.action_for(&[("name", "api")]).await;
    assert!(tokens(&first).is_some_and(|t| t <= 30), "{first:?}");
    // told again (the half-ttl refresh): still the runtime limit's
    let again = s.action_for(&[("name", "api")]).await;
    assert!(tokens(&again).is_some_and(|t| t <= 30), "{again:?}");
}

/// Proxies that name a new domain on each stream grow no series: every domain that is
/// no namespace of the node is one `unknown` label, beside the served namespace's own.
async fn made_up_domains_share_one_metric_label(tls: bool) {
    let r = start_with(QUOTA, tls).await;
    let mut served = open(&r.channel, None).await.expect("open");
    served
        .send(report("quota", vec![usage(bucket(&[("name", "api")]), 1)]))
        .await;
    assert!(is_assignment(&served.action_for(&[("name", "api")]).await));
    const STREAMS: usize = 50;
    for i in 0..STREAMS {
        let mut s = open(&r.channel, None).await.expect("open");
        // a domain of 1 KB, new on each stream
        let domain = format!("{i:04}{}", "d".repeat(1020));
        s.send(report(&domain, vec![usage(bucket(&[("name", "api")]), 1)]))
            .await;
        let k = s.action_for(&[("name", "api")]).await;
        assert!(matches!(k, Kind::AbandonAction(_)), "{k:?}");
    }
    let metrics = get(&r, tls, "/metrics").await;
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("swin_quota_actions_total{"))
        .collect();
    let short: Vec<&str> = series.iter().map(|l| &l[..l.len().min(60)]).collect();
    assert!(
        series.len() <= 5 && !metrics.contains("dddd"),
        "{} series: {short:?}",
        series.len()
    );
    assert!(
        series.contains(
            &format!("swin_quota_actions_total{{domain=\"unknown\",action=\"abandon\"}} {STREAMS}")
                .as_str()
        ),
        "{series:?}"
    );
    assert!(
        series
            .iter()
            .any(|l| l.starts_with("swin_quota_actions_total{domain=\"quota\",action=\"assign\"}")),
        "{series:?}"
    );
}

/// A report past the gRPC message size limit (4 MB) ends its stream with
/// RESOURCE_EXHAUSTED naming the limit, not with OK and no answer; another proxy's
/// stream on the node goes on being told its assignment, and nothing is counted.
async fn a_report_past_the_size_limit_is_resource_exhausted(tls: bool) {
    let r = start_with(QUOTA, tls).await;
    let mut good = open(&r.channel, None).await.expect("open");
    good.send(report("quota", vec![usage(bucket(&[("name", "api")]), 7)]))
        .await;
    assert!(is_assignment(&good.action_for(&[("name", "api")]).await));
    let mut huge = open(&r.channel, None).await.expect("open");
    let value = "v".repeat(5 << 20);
    huge.send(report(
        "quota",
        vec![usage(bucket(&[("name", &value)]), 1_000)],
    ))
    .await;
    let ended = huge.next().await.expect_err("the stream ends");
    assert_eq!(ended.code(), tonic::Code::ResourceExhausted, "{ended:?}");
    assert!(ended.message().contains("4194304"), "{ended:?}");
    assert!(is_assignment(&good.action_for(&[("name", "api")]).await));
    assert_eq!(counted(&r, tls, None).await, 7.0);
}

super::grpc::plain_and_over_tls!(
    a_report_without_a_domain_ends_only_its_stream,
    bad_buckets_are_abandoned_and_the_others_answered,
    a_report_of_too_many_buckets_is_refused,
    the_quota_service_takes_the_same_tokens,
    a_runtime_limit_on_the_buckets_key_is_what_the_proxies_share,
    made_up_domains_share_one_metric_label,
    a_report_past_the_size_limit_is_resource_exhausted,
    a_token_removed_by_a_reload_ends_its_streams,
    one_client_cannot_fill_the_node_with_buckets,
);
