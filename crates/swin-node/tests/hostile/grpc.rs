//! Envoy's door as a hostile caller sees it: the HTTP API's tokens and scopes on the
//! gRPC service, and no value (long, with a NUL, a bad override after good descriptors)
//! that turns an over-limit answer into an error or leaves a request half counted. Each
//! case runs in plain gRPC (`…::plain`) and over TLS (`…::over_tls`), and over TLS, a
//! socket that stalls or garbles its handshake holds up no one.
//!
//! Over 500 lines: one node per case, and each case reads whole (its config, what the
//! hostile client sends, the exact counts after).

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sha2::{Digest, Sha256};
use swin_testkit::cluster::Node;
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

pub(super) fn sha256(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(super) struct Running {
    _node: Node,
    grpc: RateLimitServiceClient<Channel>,
    pub(super) channel: Channel,
    pub(super) port: u16,
    /// The config as the test gave it, and the file it is in.
    given: String,
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// A local namespace `limited` allowing 2 per 90 s per `api_key`.
const LIMITED: &str = "[[namespaces]]\nname = \"limited\"\nsync_rate = -1\n\
    [[namespaces.descriptors]]\nkey = \"api_key\"\nlimits = [{ window_size = 90, limit = 2 }]\n";

/// A local-only node of namespace `limited` ([`LIMITED`]), with `auth` (TOML) prepended.
async fn start(auth: &str, tls: bool) -> Running {
    start_with(&format!("{auth}\n{LIMITED}"), tls).await
}

/// A node of `config` (its namespace is `limited`) with a gRPC listener, over TLS (a
/// self-signed certificate the client trusts) when `tls`.
pub(super) async fn start_with(config: &str, tls: bool) -> Running {
    let dir = tempfile::tempdir().expect("dir");
    let port = swin_testkit::free_port();
    let path = dir.path().join("swin.toml");
    let given = config.to_owned();
    let mut config = format!("grpc_listen = \"127.0.0.1:{port}\"\n{config}");
    let mut endpoint = Channel::from_shared(format!("http://127.0.0.1:{port}")).expect("uri");
    if tls {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
        std::fs::write(dir.path().join("cert.pem"), c.cert.pem()).expect("cert");
        std::fs::write(dir.path().join("key.pem"), c.key_pair.serialize_pem()).expect("key");
        config.push_str(&format!(
            "\n[tls]\ncert = \"{0}/cert.pem\"\nkey = \"{0}/key.pem\"\n",
            dir.path().display()
        ));
        let client = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(c.cert.pem()))
            .domain_name("localhost");
        endpoint = Channel::from_shared(format!("https://127.0.0.1:{port}"))
            .expect("uri")
            .tls_config(client)
            .expect("tls");
    }
    std::fs::write(&path, config).expect("config");
    let node = super::support::node(&path);
    swin_testkit::wait_for_port(port, Duration::from_secs(30));
    let channel = endpoint.connect().await.expect("connect");
    Running {
        given,
        path,
        _node: node,
        grpc: RateLimitServiceClient::new(channel.clone()),
        channel,
        port,
        _dir: dir,
    }
}

impl Running {
    /// Reloads the node (SIGHUP) with `config` in place of the one it started with.
    pub(super) fn reload(&self, config: &str) {
        let text = std::fs::read_to_string(&self.path).expect("config");
        std::fs::write(&self.path, text.replacen(&self.given, config, 1)).expect("config");
        self._node.signal("HUP");
    }

    /// The node's HTTP address.
    pub(super) fn base(&self) -> String {
        self._node.base.clone()
    }
}

/// Each case as its own test twice: `name::plain` and `name::over_tls`.
macro_rules! plain_and_over_tls {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn plain() {
                super::$name(false).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn over_tls() {
                super::$name(true).await
            }
        }
    )*};
}
pub(super) use plain_and_over_tls;

plain_and_over_tls!(
    grpc_takes_the_same_tokens_and_scopes_as_http,
    no_value_turns_over_limit_into_an_error,
    a_request_over_the_limit_counts_nothing_on_any_descriptor,
    a_message_past_the_size_limit_is_resource_exhausted,
    descriptors_past_max_batch_are_resource_exhausted,
    a_synchronous_request_is_decided_whole_even_when_envoy_gives_up,
    silent_idle_and_surplus_connections_keep_no_client_out,
);

fn key(value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: "api_key".into(),
            value: value.into(),
        }],
        ..Default::default()
    }
}

fn request(
    descriptors: Vec<RateLimitDescriptor>,
    token: Option<&str>,
) -> tonic::Request<RateLimitRequest> {
    let mut r = tonic::Request::new(RateLimitRequest {
        domain: "limited".into(),
        descriptors,
        hits_addend: 0,
    });
    if let Some(t) = token {
        r.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("ascii"),
        );
    }
    r
}

async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
    token: Option<&str>,
) -> Result<RateLimitResponse, tonic::Status> {
    c.should_rate_limit(request(descriptors, token))
        .await
        .map(tonic::Response::into_inner)
}

fn codes(r: &RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}

async fn grpc_takes_the_same_tokens_and_scopes_as_http(tls: bool) {
    let auth = format!(
        "[[auth.tokens]]\nname = \"envoy\"\nsha256 = \"{}\"\nscopes = [\"decide\"]\n\
         [[auth.tokens]]\nname = \"reader\"\nsha256 = \"{}\"\nscopes = [\"count\", \"metrics\"]\n",
        sha256("envoy-secret"),
        sha256("reader-secret"),
    );
    let mut run = start(&auth, tls).await;
    let c = &mut run.grpc;
    for (token, code) in [
        (None, tonic::Code::Unauthenticated),
        (Some("Bearer-less"), tonic::Code::Unauthenticated),
        (Some("wrong-secret"), tonic::Code::Unauthenticated),
        (Some("reader-secret"), tonic::Code::PermissionDenied),
    ] {
        let e = ask(c, vec![key("a")], token).await.expect_err("refused");
        assert_eq!(e.code(), code, "{token:?}: {e:?}");
        assert!(!e.message().is_empty(), "the status says why");
    }
    // another scheme in the metadata is no bearer token
    let mut r = request(vec![key("a")], None);
    r.metadata_mut().insert(
        "authorization",
        "Basic ZW52b3k6c2VjcmV0".parse().expect("ascii"),
    );
    let e = c.should_rate_limit(r).await.expect_err("basic");
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    // none of the refused calls spent anything: the full quota of 2 is there
    for expect in [OK, OK, OVER] {
        let r = ask(c, vec![key("a")], Some("envoy-secret"))
            .await
            .expect("answer");
        assert_eq!(codes(&r), vec![expect]);
    }
    // health stays open
    let mut health = tonic_health::pb::health_client::HealthClient::new(run.channel.clone());
    let h = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health without a token");
    assert_eq!(
        h.into_inner().status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

async fn no_value_turns_over_limit_into_an_error(tls: bool) {
    let mut run = start("", tls).await;
    let c = &mut run.grpc;
    for expect in [OK, OK, OVER] {
        let r = ask(c, vec![key("spent")], None).await.expect("answer");
        assert_eq!(codes(&r), vec![expect]);
    }
    let long_a = "v".repeat(2000) + "a";
    let long_b = "v".repeat(2000) + "b";
    for hostile in [long_a.as_str(), "nul\0value", "é\u{10FFFF}|=%"] {
        let r = ask(c, vec![key("spent"), key(hostile)], None)
            .await
            .unwrap_or_else(|e| panic!("{hostile:?}: an answer, not {e:?}"));
        assert_eq!(r.overall_code, OVER, "{hostile:?}");
        assert_eq!(codes(&r), vec![OVER, OK], "{hostile:?}");
    }
    // the requests over the limit counted nothing (all or nothing), and long values
    // that share their first kilobytes are keys of their own: b has its full quota
    // after a has spent both of its two
    for expect in [OK, OK, OVER] {
        let r = ask(c, vec![key(&long_a)], None).await.expect("a");
        assert_eq!(codes(&r), vec![expect]);
    }
    for expect in [OK, OK, OVER] {
        let r = ask(c, vec![key(&long_b)], None).await.expect("b");
        assert_eq!(codes(&r), vec![expect]);
    }
    // a limit that cannot be read (unit 99) beside a descriptor within its limit: the
    // request is INVALID_ARGUMENT naming the field, and counts nothing for either
    let mut odd = key("fresh");
    odd.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 99,
    });
    let e = ask(c, vec![key("other"), odd], None)
        .await
        .expect_err("INVALID_ARGUMENT");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("descriptors[1].limit.unit"), "{e:?}");
    for k in ["fresh", "other"] {
        for expect in [OK, OK, OVER] {
            let r = ask(c, vec![key(k)], None).await.expect("answer");
            assert_eq!(codes(&r), vec![expect], "{k}");
        }
    }
}

async fn a_request_over_the_limit_counts_nothing_on_any_descriptor(tls: bool) {
    let mut run = start("", tls).await;
    let c = &mut run.grpc;
    for expect in [OK, OK, OVER] {
        let r = ask(c, vec![key("spent")], None).await.expect("answer");
        assert_eq!(codes(&r), vec![expect]);
    }
    // "fresh" is within its limit each time, but the request is over it: not counted
    for _ in 0..3 {
        let r = ask(c, vec![key("fresh"), key("spent")], None)
            .await
            .expect("answer");
        assert_eq!(r.overall_code, OVER);
        assert_eq!(codes(&r), vec![OK, OVER]);
    }
    for expect in [OK, OK, OVER] {
        let r = ask(c, vec![key("fresh")], None).await.expect("answer");
        assert_eq!(codes(&r), vec![expect], "fresh still has its quota of 2");
    }
}

/// A message past the 4 MB decoding limit is RESOURCE_EXHAUSTED (tonic answered
/// OUT_OF_RANGE), counts nothing, and the node keeps answering; an answer's code is
/// rewritten only for that (an ordinary bad request stays INVALID_ARGUMENT).
async fn a_message_past_the_size_limit_is_resource_exhausted(tls: bool) {
    let mut run = start("", tls).await;
    let c = &mut run.grpc;
    let huge = key(&"v".repeat(5 << 20));
    let e = ask(c, vec![key("small"), huge], None)
        .await
        .expect_err("too large");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    for expect in [OK, OK, OVER] {
        let r = ask(c, vec![key("small")], None).await.expect("answer");
        assert_eq!(codes(&r), vec![expect], "nothing counted, still answering");
    }
    let e = ask(c, vec![], None).await.expect_err("no descriptors");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
}

/// More descriptors in one request than `max_batch` (the HTTP batch cap, 1,000 by
/// default): RESOURCE_EXHAUSTED naming the cap, and nothing counted; at the cap, answered.
async fn descriptors_past_max_batch_are_resource_exhausted(tls: bool) {
    let mut run = start("", tls).await;
    let c = &mut run.grpc;
    let over: Vec<RateLimitDescriptor> = (0..1_001).map(|i| key(&format!("cap-{i}"))).collect();
    let e = ask(c, over, None).await.expect_err("over the cap");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("max_batch"), "{e:?}");
    // nothing of it was counted: the first key still has its quota of 2
    for expect in [OK, OK, OVER] {
        let r = ask(c, vec![key("cap-0")], None).await.expect("answer");
        assert_eq!(codes(&r), vec![expect]);
    }
    let at: Vec<RateLimitDescriptor> = (0..1_000).map(|i| key(&format!("at-{i}"))).collect();
    let r = ask(c, at, None).await.expect("at the cap: an answer");
    assert_eq!(r.statuses.len(), 1_000);
}

/// 10,000 distinct descriptors of one request on a synchronous namespace, limit 1 each.
fn many(prefix: &str) -> Vec<RateLimitDescriptor> {
    (0..10_000).map(|i| key(&format!("{prefix}-{i}"))).collect()
}

/// The same request asked again after the first one's answer: every descriptor OVER
/// if the first counted them all, OK if it counted none; anything else is a request
/// half counted.
fn codes_after(c: &[i32]) -> &'static str {
    if c.iter().all(|&x| x == OVER) {
        "all counted"
    } else if c.iter().all(|&x| x == OK) {
        "none counted"
    } else {
        "half counted"
    }
}

async fn a_synchronous_request_is_decided_whole_even_when_envoy_gives_up(tls: bool) {
    let redis = swin_testkit::TestStore::redis();
    // `max_batch` caps descriptors per request as it caps HTTP batches (1,000 by default)
    let mut run = start_with(&format!(
        "max_batch = 10000\n{}\n[[namespaces]]\nname = \"limited\"\nsync_rate = 0\nstore = \"main\"\n\
         [[namespaces.descriptors]]\nkey = \"api_key\"\nlimits = [{{ window_size = 90, limit = 1 }}]\n",
        redis.section()
    ), tls)
    .await;
    let c = &mut run.grpc;
    let mut big = RateLimitRequest {
        domain: "limited".into(),
        descriptors: many("whole"),
        hits_addend: 0,
    };
    let started = std::time::Instant::now();
    let r = c
        .should_rate_limit(big.clone())
        .await
        .expect("answer")
        .into_inner();
    let whole = started.elapsed();
    eprintln!("10,000 descriptors, synchronous Redis: {whole:?}");
    assert_eq!(r.overall_code, OK);
    let r = c
        .should_rate_limit(big.clone())
        .await
        .expect("again")
        .into_inner();
    assert_eq!(codes_after(&codes(&r)), "all counted");
    // Envoy gives up half-way through the time a whole request takes (its own default
    // is 20 ms): the request is counted whole or not at all, never in part
    big.descriptors = many("cut");
    let mut cut = tonic::Request::new(big.clone());
    cut.set_timeout((whole / 2).max(Duration::from_millis(5)));
    let _ = c.should_rate_limit(cut).await;
    tokio::time::sleep(Duration::from_secs(1).max(whole * 2)).await;
    let r = c.should_rate_limit(big).await.expect("after").into_inner();
    assert_ne!(codes_after(&codes(&r)), "half counted");
}

/// Over TLS, sockets that never start their handshake, and sockets that send something
/// that is no TLS, hold up no client and count nothing; the node closes the silent ones
/// when `header_timeout` (2 s here) runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_and_garbled_tls_handshakes_hold_up_no_one() {
    use tokio::io::AsyncWriteExt;
    let mut run = start_with(&format!("header_timeout = 2\n{LIMITED}"), true).await;
    let addr = format!("127.0.0.1:{}", run.port);
    let mut silent = Vec::new();
    for _ in 0..200 {
        silent.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect"),
        );
    }
    for _ in 0..20 {
        let mut s = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let _ = s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        silent.push(s);
    }
    // a TLS client is answered at once, and the limit holds exactly
    let c = &mut run.grpc;
    for expect in [OK, OK, OVER] {
        let asked = tokio::time::timeout(Duration::from_secs(2), ask(c, vec![key("tls")], None));
        let r = asked
            .await
            .expect("answered while 220 sockets stall")
            .expect("answer");
        assert_eq!(codes(&r), vec![expect]);
    }
    // every stalled socket is closed by the node within the handshake time (and slack)
    assert_eq!(
        closed_of(&mut silent, Duration::from_secs(5)).await,
        220,
        "sockets left open past the handshake time"
    );
    let r = ask(c, vec![key("tls")], None)
        .await
        .expect("still answering");
    assert_eq!(codes(&r), vec![OVER]);
}

/// How many of `sockets` the node closes within `within`, all waited on at once.
async fn closed_of(sockets: &mut [tokio::net::TcpStream], within: Duration) -> usize {
    let closed =
        futures_util::future::join_all(sockets.iter_mut().map(|s| closed_within(s, within))).await;
    closed.into_iter().filter(|c| *c).count()
}

/// Whether the node closes `s` within `within`: a read ends (EOF or an error).
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 256];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// The HTTP listener's connection limits hold on the gRPC listener: 40 silent sockets
/// against `max_connections = 30` keep a new client out for at most a second (then the
/// quietest is closed for it), every silent socket is closed by `header_timeout`, a
/// connection that spoke and went quiet by `idle_timeout`, and the limit counts exactly.
async fn silent_idle_and_surplus_connections_keep_no_client_out(tls: bool) {
    use tokio::io::AsyncWriteExt;
    let config = format!("max_connections = 30\nheader_timeout = 1\nidle_timeout = 2\n{LIMITED}");
    let mut run = start_with(&config, tls).await;
    let addr = format!("127.0.0.1:{}", run.port);
    let r = ask(&mut run.grpc, vec![key("surplus")], None)
        .await
        .expect("first");
    assert_eq!(codes(&r), vec![OK]);
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect"),
        );
    }
    // a client that spoke HTTP/2's preface and settings, then went quiet
    let mut quiet = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    if !tls {
        quiet
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .expect("preface");
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // a new client gets in: the quietest sockets make room for it
    let fresh = Channel::from_shared(format!(
        "{}://127.0.0.1:{}",
        if tls { "https" } else { "http" },
        run.port
    ))
    .expect("uri");
    let fresh = match tls {
        false => fresh,
        true => fresh
            .tls_config(
                tonic::transport::ClientTlsConfig::new()
                    .ca_certificate(tonic::transport::Certificate::from_pem(
                        std::fs::read(run._dir.path().join("cert.pem")).expect("cert"),
                    ))
                    .domain_name("localhost"),
            )
            .expect("tls"),
    };
    let mut fresh =
        RateLimitServiceClient::new(fresh.connect().await.expect("a new client gets in"));
    for expect in [OK, OVER] {
        let r = ask(&mut fresh, vec![key("surplus")], None)
            .await
            .expect("answer");
        assert_eq!(codes(&r), vec![expect]);
    }
    assert_eq!(
        closed_of(&mut silent, Duration::from_secs(4)).await,
        40,
        "silent sockets left open"
    );
    assert!(
        closed_within(&mut quiet, Duration::from_secs(5)).await,
        "a quiet connection left open"
    );
    // the node still answers the connection in use
    let r = ask(&mut fresh, vec![key("surplus")], None)
        .await
        .expect("still answering");
    assert_eq!(codes(&r), vec![OVER]);
}
