//! The `Idempotency-Key` header byte by byte, over a raw socket (a client library would
//! refuse to send most of these): which bytes make a key, which reach the node and are
//! refused naming the header, and which the HTTP parser refuses before any handler runs
//! (a bare 400, as docs/api.md says). Nothing refused is counted, and the node serves
//! on with exact counts.

use swin_testkit::TestStore;

use super::support::node_in;

/// One synchronous namespace, `a`, on `store`, with room for every byte's key.
fn config(store: &TestStore) -> String {
    format!(
        "{}\n[[namespaces]]\nname = \"a\"\nwindow_sizes = [86400]\nsync_rate = 0\nstore = \"main\"\n\
         limits = [{{ window_size = 86400, limit = 1000 }}]\n",
        store.section()
    )
}

/// A hit of `a`'s key `k` through `reqwest`, under `key` if any: its status.
async fn hit(c: &reqwest::Client, base: &str, key: Option<&str>) -> u16 {
    let mut r = c
        .post(format!("{base}/v1/namespaces/a/keys/k/hit"))
        .json(&serde_json::json!({"cost": 1}));
    if let Some(key) = key {
        r = r.header("idempotency-key", key);
    }
    r.send().await.expect("send").status().as_u16()
}

/// A hit sent over a raw socket with `key` as its `Idempotency-Key` value, byte for
/// byte: the status, the body, and whether the node closed the connection after it.
fn raw_hit(port: u16, key: &[u8]) -> (u16, String, bool) {
    use std::io::{Read, Write};
    let body = br#"{"cost":1}"#;
    let mut req = format!(
        "POST /v1/namespaces/a/keys/k/hit HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nIdempotency-Key: ",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(key);
    req.extend_from_slice(b"\r\n\r\n");
    req.extend_from_slice(body);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(&req).expect("write");
    // one answer: its head, then as many body bytes as it says
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "{key:?}: closed without an answer");
        got.extend_from_slice(&buf[..n]);
        if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&got[..head_end]).to_lowercase();
    let status = head[9..12].parse().expect("status");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().expect("length"));
    while got.len() < head_end + length {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "{key:?}: body cut");
        got.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&got[head_end..head_end + length]).into_owned();
    // the connection is closed after a refused head (read 0)
    let closed = length == 0 && matches!(s.read(&mut buf), Ok(0));
    (status, body, closed)
}

/// Every byte in the middle of an `Idempotency-Key` value, sent raw. Visible ASCII is a
/// key (200, counted once). A tab, a space and bytes past ASCII (obs-text) reach the node:
/// 400 JSON naming `Idempotency-Key`. The other control characters (NUL to 0x08, LF, CR
/// and 0x0B to 0x1F, DEL) are refused by the HTTP parser before any handler runs: a
/// bare 400, no body, the connection closed (docs/api.md says so; hyper has no way to
/// give it a body). Nothing refused is counted, and the node serves on, counts exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_byte_of_a_key_is_a_key_a_json_400_or_the_parser_s_bare_400() {
    let store = TestStore::sqlite().await;
    let dir = tempfile::tempdir().expect("dir");
    let a = node_in(dir.path(), &config(&store));
    let port = a.port;
    let answers = tokio::task::spawn_blocking(move || {
        (0..=255u8)
            .map(|b| (b, raw_hit(port, &[b'k', b, b'x'])))
            .collect::<Vec<_>>()
    })
    .await
    .expect("raw hits");
    let mut ran = 0;
    for (b, (status, body, closed)) in answers {
        match b {
            0x21..=0x7e => {
                assert_eq!(status, 200, "{b:#04x}: {body}");
                ran += 1;
            }
            b'\t' | b' ' | 0x80..=0xff => {
                assert_eq!(status, 400, "{b:#04x}: {body}");
                let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
                assert_eq!(v["error"]["code"], "bad_request", "{b:#04x}: {v}");
                let message = v["error"]["message"].as_str().expect("message");
                assert!(message.starts_with("Idempotency-Key: "), "{b:#04x}: {v}");
            }
            _ => {
                assert_eq!((status, body.as_str()), (400, ""), "{b:#04x}");
                assert!(
                    closed,
                    "{b:#04x}: the connection is closed after a malformed head"
                );
            }
        }
    }
    assert_eq!(ran, 94);
    // what a client is told of the parser's 400
    let api = include_str!("../../../../docs/api.md");
    assert!(
        api.contains(
            "the HTTP parser refuses the request before any handler runs, with a bare 400"
        ),
        "docs/api.md says how a malformed Idempotency-Key line is refused"
    );
    let c = reqwest::Client::new();
    assert_eq!(hit(&c, &a.base, Some("after")).await, 200);
    assert_eq!(hit(&c, &a.base, None).await, 200);
    assert_eq!(
        store.totals("a").await.get("k").copied().unwrap_or(0.0),
        96.0,
        "each visible key once, and the two after; nothing refused"
    );
}
