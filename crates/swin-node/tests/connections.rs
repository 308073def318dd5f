//! No connection starves the others, against the real binary: silent sockets past
//! `max_connections` while `/healthz` and an increment still answer at once; headers
//! that never end, keep-alive connections left idle and bodies that never arrive are
//! closed after their timeouts.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use swin_cluster_tests::{use_node_binary, Node};

/// A local-only node with low limits: 50 connections, 1 s for headers, body and idling.
fn node(dir: &Path) -> Node {
    let config = dir.join("swin.toml");
    std::fs::write(
        &config,
        "max_connections = 50\nheader_timeout = 1\nidle_timeout = 1\nbody_timeout = 1\n\
         [[namespaces]]\nname = \"api\"\nwindow_sizes = [60]\nsync_rate = -1\n",
    )
    .expect("write config");
    use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    Node::spawn(&config)
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s
}

/// Sends `request` on a fresh connection and reads the whole answer (the request says
/// `Connection: close`).
fn exchange(port: u16, request: &str) -> String {
    let mut s = connect(port);
    s.write_all(request.as_bytes()).expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Whether the server closed `s` (EOF) within `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).expect("timeout");
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // an answer (a 408) before the close
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn silent_sockets_past_the_cap_do_not_keep_clients_out() {
    let dir = tempfile::tempdir().expect("dir");
    let node = node(dir.path());
    let silent: Vec<TcpStream> = (0..150).map(|_| connect(node.port)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let health = exchange(
        node.port,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let inc = exchange(
        node.port,
        "POST /v1/namespaces/api/keys/k/increment HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    let took = started.elapsed();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(inc.starts_with("HTTP/1.1 200"), "{inc}");
    // well within the 1 s header timeout that would free the silent ones anyway
    assert!(took < Duration::from_millis(800), "answered after {took:?}");
    // the cap holds: the silent sockets the node closed to make room (each new
    // connection past 50 closed the one idle the longest) — long before their timeout
    let closed = silent
        .iter()
        .filter(|s| {
            let mut s = *s;
            s.set_nonblocking(true).expect("nonblocking");
            matches!(s.read(&mut [0u8; 16]), Ok(0))
        })
        .count();
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "checked too late to tell"
    );
    assert!(closed >= 100, "only {closed} of 150 silent sockets closed");
    let read = exchange(
        node.port,
        "GET /v1/namespaces/api/keys/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(read.contains("\"current\":1.0"), "{read}");
    drop(silent);
}

#[test]
fn slow_headers_idle_keep_alive_and_missing_bodies_are_closed() {
    let dir = tempfile::tempdir().expect("dir");
    let node = node(dir.path());
    // headers that never end
    let mut slow = connect(node.port);
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .expect("write");
    assert!(
        closed_within(&mut slow, Duration::from_secs(3)),
        "slow headers left open"
    );
    // a keep-alive connection left idle after its request
    let mut idle = connect(node.port);
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let mut buf = [0u8; 512];
    let n = idle.read(&mut buf).expect("answer");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let started = Instant::now();
    assert!(
        closed_within(&mut idle, Duration::from_secs(4)),
        "idle connection left open"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed before idle_timeout"
    );
    // a body that never arrives: 408, nothing counted
    let mut body = connect(node.port);
    body.write_all(
        b"POST /v1/increments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"incr",
    )
    .expect("write");
    let mut answer = String::new();
    body.set_read_timeout(Some(Duration::from_secs(4)))
        .expect("timeout");
    let _ = body.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");
}
