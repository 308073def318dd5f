//! gRPC over TLS and mutual TLS on both listeners, with three clients nobody here wrote the
//! TLS of: tonic (rustls), Python's grpcio (BoringSSL) and curl (OpenSSL). Certificates
//! come from CAs made here; SIGHUP swaps the server's certificate and the client CA.
//! Every refused client counts nothing: the limit's remaining count says so exactly.

use std::path::{Path, PathBuf};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};
use swin_testkit::cluster::{use_node_binary, within, Node};
use tonic::transport::{Certificate as TonicCert, ClientTlsConfig, Endpoint, Identity};

/// A CA: its certificate and key, to sign with.
struct Ca {
    cert: Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} CA"));
        let key = KeyPair::generate().expect("key");
        let cert = p.self_signed(&key).expect("CA");
        Ca { cert, key }
    }

    /// A certificate this CA signs, for a server (127.0.0.1, localhost) or a client;
    /// written as `{name}.pem` and `{name}.key` in `dir`.
    fn issue(&self, dir: &Path, name: &str, server: bool) -> Pair {
        let names = if server {
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()]
        } else {
            vec![format!("{name}.clients.test")]
        };
        let mut p = CertificateParams::new(names).expect("params");
        p.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.cert, &self.key).expect("signed");
        let pair = Pair {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&pair.cert, cert.pem()).expect("cert");
        std::fs::write(&pair.key, key.serialize_pem()).expect("key");
        pair
    }

    fn write(&self, path: &Path) {
        std::fs::write(path, self.cert.pem()).expect("CA file");
    }
}

#[derive(Clone)]
struct Pair {
    cert: PathBuf,
    key: PathBuf,
}

impl Pair {
    /// Puts this pair where the node's config reads its own.
    fn install(&self, dir: &Path) {
        std::fs::copy(&self.cert, dir.join("server.pem")).expect("cert");
        std::fs::copy(&self.key, dir.join("server.key")).expect("key");
    }
}

/// A node serving namespace "api" (key=k: 10 a minute) on both listeners over TLS.
fn node(dir: &Path, client_ca: bool) -> (Node, u16) {
    let grpc = swin_testkit::free_port();
    let ca_line = if client_ca {
        format!("client_ca = \"{}/clients.pem\"\n", dir.display())
    } else {
        String::new()
    };
    let config = dir.join("swin.toml");
    std::fs::write(
        &config,
        format!(
            "grpc_listen = \"127.0.0.1:{grpc}\"\n\
             [tls]\ncert = \"{0}/server.pem\"\nkey = \"{0}/server.key\"\n{ca_line}\
             [[namespaces]]\nname = \"api\"\nsync_rate = -1\n\
             [[namespaces.descriptors]]\nkey = \"k\"\n\
             rate_limit = {{ unit = \"minute\", requests_per_unit = 10 }}\n",
            dir.display()
        ),
    )
    .expect("config");
    use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    let node = Node::spawn(&config);
    swin_testkit::wait_for_port(grpc, Duration::from_secs(30));
    (node, grpc)
}

/// One ShouldRateLimit from tonic over TLS trusting `ca`, with `identity` if given:
/// the overall code and limit_remaining, or the error.
async fn tonic_asks(port: u16, ca: &Ca, identity: Option<&Pair>) -> Result<(i32, u32), String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(TonicCert::from_pem(ca.cert.pem()))
        .domain_name("localhost");
    if let Some(p) = identity {
        let cert = std::fs::read(&p.cert).expect("cert");
        let key = std::fs::read(&p.key).expect("key");
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let endpoint = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .expect("endpoint")
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5));
    let channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
    ask(RateLimitServiceClient::new(channel)).await
}

async fn ask(
    mut c: RateLimitServiceClient<tonic::transport::Channel>,
) -> Result<(i32, u32), String> {
    let r = c
        .should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "k".into(),
                    value: "v".into(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .map_err(|e| format!("{e:?}"))?
        .into_inner();
    Ok((r.overall_code, r.statuses[0].limit_remaining))
}

/// Python's grpcio over TLS trusting `ca` (a PEM file), with `identity` if given: what
/// `client.py` prints ("OK 9", "error: UNAVAILABLE …").
async fn grpcio_asks(port: u16, ca: &Path, identity: Option<&Pair>) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tls/client.py");
    let mut args = vec![
        format!("127.0.0.1:{port}").into(),
        ca.as_os_str().to_owned(),
    ];
    if let Some(p) = identity {
        args.extend([
            p.cert.clone().into_os_string(),
            p.key.clone().into_os_string(),
        ]);
    }
    let ran = swin_testkit::python(script, args);
    let said = ran.stdout.trim().to_owned();
    assert_eq!(ran.ok, !said.starts_with("error"), "{said}{}", ran.stderr);
    said
}

/// curl's HTTPS request to `/healthz` trusting `ca`, with `identity` if given: the
/// status, or curl's failure.
fn curl(port: u16, ca: &Path, identity: Option<&Pair>) -> Result<String, String> {
    let mut cmd = std::process::Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "5",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
    ])
    .arg("--cacert")
    .arg(ca);
    if let Some(p) = identity {
        cmd.arg("--cert").arg(&p.cert).arg("--key").arg(&p.key);
    }
    cmd.arg(format!("https://127.0.0.1:{port}/healthz"));
    let out = cmd.output().expect("curl (apt-get install curl)");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_tls_for_tonic_and_grpcio_reloaded_by_sighup() {
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path();
    let (first, second) = (Ca::new("first"), Ca::new("second"));
    let (first_ca, second_ca) = (d.join("first-ca.pem"), d.join("second-ca.pem"));
    first.write(&first_ca);
    second.write(&second_ca);
    first.issue(d, "first-server", true).install(d);
    let second_server = second.issue(d, "second-server", true);
    let (mut node, port) = node(d, false);
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;

    assert_eq!(tonic_asks(port, &first, None).await, Ok((ok, 9)));
    assert_eq!(grpcio_asks(port, &first_ca, None).await, "OK 8");
    // a client that trusts another CA, and a plaintext one, get nothing and count nothing
    let refused = tonic_asks(port, &second, None).await;
    assert!(refused.is_err(), "{refused:?}");
    let said = grpcio_asks(port, &second_ca, None).await;
    assert!(said.starts_with("error: UNAVAILABLE"), "{said}");
    let plain = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"));
    if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_secs(5), plain).await {
        let answered = tokio::time::timeout(Duration::from_secs(5), ask(c)).await;
        assert!(answered.map_or(true, |r| r.is_err()), "plaintext answered");
    }
    assert_eq!(tonic_asks(port, &first, None).await, Ok((ok, 7)));

    // SIGHUP: the second CA's certificate for new connections, on the gRPC listener too
    second_server.install(d);
    node.signal("HUP");
    within(
        Duration::from_secs(10),
        "the new certificate served over gRPC",
        async || tonic_asks(port, &second, None).await.is_ok(),
    )
    .await;
    for _ in 0..5 {
        let _ = tonic_asks(port, &second, None).await.expect("second CA");
    }
    // 1 + 1 + 1 + 1 (the first accepted under `within`) + 5 = 9: one left, then over
    assert_eq!(grpcio_asks(port, &second_ca, None).await, "OK 0");
    assert_eq!(tonic_asks(port, &second, None).await, Ok((over, 0)));
    let old = tonic_asks(port, &first, None).await;
    assert!(old.is_err(), "the old CA still trusted: {old:?}");
    assert!(node.terminate());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_on_both_listeners_refuses_clients_without_a_signed_certificate() {
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path();
    let (servers, clients, rogue) = (Ca::new("servers"), Ca::new("clients"), Ca::new("rogue"));
    let servers_ca = d.join("servers-ca.pem");
    servers.write(&servers_ca);
    clients.write(&d.join("clients.pem"));
    servers.issue(d, "servers-server", true).install(d);
    let alice = clients.issue(d, "alice", false);
    let mallory = rogue.issue(d, "mallory", false);
    let (mut node, grpc) = node(d, true);
    let ok = Code::Ok as i32;

    // HTTPS: curl with a certificate the client CA signed gets in; without one, or with
    // another CA's, the handshake fails
    assert_eq!(curl(node.port, &servers_ca, Some(&alice)), Ok("200".into()));
    let none = curl(node.port, &servers_ca, None);
    assert!(none.is_err(), "{none:?}");
    let other = curl(node.port, &servers_ca, Some(&mallory));
    assert!(other.is_err(), "{other:?}");

    // gRPC: the same for tonic and grpcio
    assert_eq!(tonic_asks(grpc, &servers, Some(&alice)).await, Ok((ok, 9)));
    assert_eq!(grpcio_asks(grpc, &servers_ca, Some(&alice)).await, "OK 8");
    for who in [None, Some(&mallory)] {
        let r = tonic_asks(grpc, &servers, who).await;
        assert!(
            r.is_err(),
            "tonic got in without a signed certificate: {r:?}"
        );
        let said = grpcio_asks(grpc, &servers_ca, who).await;
        assert!(said.starts_with("error: UNAVAILABLE"), "{said}");
    }
    // nobody refused counted: 10 - 2 - this one
    assert_eq!(tonic_asks(grpc, &servers, Some(&alice)).await, Ok((ok, 7)));

    // SIGHUP reads the client CA again: now the rogue CA's clients are the ones let in
    rogue.write(&d.join("clients.pem"));
    node.signal("HUP");
    within(
        Duration::from_secs(10),
        "the new client CA on HTTPS",
        async || curl(node.port, &servers_ca, Some(&mallory)).is_ok(),
    )
    .await;
    assert_eq!(
        tonic_asks(grpc, &servers, Some(&mallory)).await,
        Ok((ok, 6))
    );
    let old = tonic_asks(grpc, &servers, Some(&alice)).await;
    assert!(old.is_err(), "a client of the old CA still let in: {old:?}");
    // an operator's bad day: a client CA file that holds no certificate, then SIGHUP —
    // the running CA stays, the node answers, the count goes on exactly
    std::fs::write(d.join("clients.pem"), "not a certificate\n").expect("garbage");
    node.signal("HUP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(node.is_running());
    assert_eq!(
        tonic_asks(grpc, &servers, Some(&mallory)).await,
        Ok((ok, 5))
    );
    assert_eq!(
        curl(node.port, &servers_ca, Some(&mallory)),
        Ok("200".into())
    );
    assert!(node.terminate());
}
