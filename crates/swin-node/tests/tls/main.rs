//! TLS with the real binary: HTTPS with a certificate made here, a client that verifies
//! it, and SIGHUP reading a new certificate; gRPC over TLS and mutual TLS on both
//! listeners (`grpc.rs`).

use std::path::Path;
use std::time::Duration;

use swin_testkit::cluster::{use_node_binary, within, Node};

mod grpc;

/// A self-signed certificate for 127.0.0.1 and localhost: its PEM and its key's PEM.
fn certificate() -> (String, String) {
    let c = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("certificate");
    (c.cert.pem(), c.key_pair.serialize_pem())
}

fn write_pair(dir: &Path, (cert, key): &(String, String)) {
    std::fs::write(dir.join("cert.pem"), cert).expect("cert");
    std::fs::write(dir.join("key.pem"), key).expect("key");
}

/// A client that trusts only `cert`.
fn client(cert: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(cert.as_bytes()).expect("pem"))
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_verified_certificate_reloaded_by_sighup() {
    let dir = tempfile::tempdir().expect("dir");
    let first = certificate();
    write_pair(dir.path(), &first);
    let config = dir.path().join("swin.toml");
    std::fs::write(
        &config,
        format!(
            "[tls]\ncert = \"{0}/cert.pem\"\nkey = \"{0}/key.pem\"\n\
             [[namespaces]]\nname = \"api\"\nwindow_sizes = [60]\nsync_rate = -1\n",
            dir.path().display()
        ),
    )
    .expect("config");
    use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    let node = Node::spawn(&config);
    let https = format!("https://127.0.0.1:{}", node.port);
    let trusts_first = client(&first.0);
    let r = trusts_first
        .post(format!("{https}/v1/namespaces/api/keys/k/increment"))
        .send()
        .await
        .expect("https request");
    assert_eq!(r.status(), 200);
    // plain HTTP on the TLS port gets no answer
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{}/healthz", node.port))
        .timeout(Duration::from_secs(3))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    // a client that trusts another certificate refuses the node
    let second = certificate();
    let trusts_second = client(&second.0);
    assert!(trusts_second
        .get(format!("{https}/healthz"))
        .send()
        .await
        .is_err());
    // SIGHUP reads the new pair: now the other client is the one that gets in
    write_pair(dir.path(), &second);
    node.signal("HUP");
    within(
        Duration::from_secs(10),
        "the new certificate served",
        async || {
            trusts_second
                .get(format!("{https}/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        },
    )
    .await;
    // a new connection (not one kept alive from before) no longer trusts the node
    assert!(client(&first.0)
        .get(format!("{https}/healthz"))
        .send()
        .await
        .is_err());
}
