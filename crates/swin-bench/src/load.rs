//! The load generator: N keep-alive HTTP/1.1 connections, closed loop (as fast as
//! answers come) or open loop at a target rate (latency counted from when a request was
//! due, so a stalled server is not hidden), single or batch increments, round robin
//! over several nodes.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use rand::SeedableRng;
use serde::Serialize;

use crate::keys::Keys;
use crate::schedule::{histogram, Shared, Tally};
use crate::spec::LoadSpec;

#[derive(Debug, Serialize)]
pub struct Report {
    /// Requests answered (`unanswered` not among them).
    pub requests: u64,
    pub increments: u64,
    pub seconds: f64,
    /// Open loop: the rate the requests were due at.
    pub offered_per_sec: Option<f64>,
    pub requests_per_sec: f64,
    pub increments_per_sec: f64,
    pub latency_ms: Latency,
    pub statuses: BTreeMap<u16, u64>,
    /// Requests still waiting for their answer when the run ended at its duration (in
    /// the latencies with their wait so far).
    pub unanswered: u64,
    pub errors: u64,
    /// With `--windows W`: answers 200 by the window of the wall clock they came in,
    /// keyed by the window's first unix second.
    pub admitted_per_window: BTreeMap<u64, u64>,
    /// Of those, the ones sent in the window before (decided on either side of its edge).
    pub straddling_per_window: BTreeMap<u64, u64>,
}

#[derive(Debug, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

fn path_and_body(spec: &LoadSpec, rng: &mut impl rand::Rng) -> (String, Bytes) {
    match spec.batch {
        None if spec.limitador => {
            let key = serde_json::to_string(&spec.keys.pick(rng)).unwrap_or_default();
            let ns = serde_json::to_string(&spec.namespace).unwrap_or_default();
            let body = format!("{{\"namespace\":{ns},\"values\":{{\"key\":{key}}},\"delta\":1}}");
            ("/check_and_report".to_owned(), Bytes::from(body))
        }
        None if spec.lease => {
            let key = spec.keys.pick(rng);
            (
                format!("/v1/namespaces/{}/keys/{key}/acquire", spec.namespace),
                Bytes::new(),
            )
        }
        None if spec.hit => {
            let key = spec.keys.pick(rng);
            (
                format!("/v1/namespaces/{}/keys/{key}/hit", spec.namespace),
                Bytes::new(),
            )
        }
        None => {
            let key = spec.keys.pick(rng);
            let body = match spec.window_size {
                Some(w) => format!("{{\"window_size\":{w}}}"),
                None => String::new(),
            };
            (
                format!("/v1/namespaces/{}/keys/{key}/increment", spec.namespace),
                Bytes::from(body),
            )
        }
        Some(n) => {
            // written by hand: building serde_json values per item costs the load tool
            // more CPU than the server spends counting them
            use std::fmt::Write;
            let ns = serde_json::to_string(&spec.namespace).unwrap_or_default();
            let size = spec
                .window_size
                .map(|w| format!(",\"window_size\":{w}"))
                .unwrap_or_default();
            let mut body = String::with_capacity(16 + n * (40 + ns.len()));
            body.push_str("{\"increments\":[");
            for i in 0..n {
                if i > 0 {
                    body.push(',');
                }
                let key = serde_json::to_string(&spec.keys.pick(rng)).unwrap_or_default();
                let _ = write!(body, "{{\"namespace\":{ns},\"key\":{key}{size}}}");
            }
            body.push_str("]}");
            ("/v1/increments".to_owned(), Bytes::from(body))
        }
    }
}

async fn connection(
    spec: Arc<LoadSpec>,
    shared: Arc<Shared>,
    target: String,
    id: usize,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::new(spec.windows, spec.latency_log.is_some())?;
    let stream = tokio::net::TcpStream::connect(&target).await?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut rng = rand::rngs::StdRng::seed_from_u64(id as u64 * 7919 + 1);
    // Batch bodies are costly to build and the load tool shares the machine with the
    // server: build 64 per connection up front and cycle through them.
    // (Not for sequential keys: those must each be sent.)
    let pool: Vec<(String, Bytes)> = match (&spec.batch, &spec.keys) {
        (_, Keys::Sequential(..)) | (None, _) => Vec::new(),
        (Some(_), _) => (0..64).map(|_| path_and_body(&spec, &mut rng)).collect(),
    };
    let mut n = 0usize;
    while let Some(t0) = shared.next_request(spec.requests).await {
        let (path, body) = if pool.is_empty() {
            path_and_body(&spec, &mut rng)
        } else {
            n += 1;
            pool[n % pool.len()].clone()
        };
        n += 1;
        let sent = Instant::now();
        let asked = exchange(
            &mut sender,
            &spec,
            &target,
            path,
            body,
            format!("c{id}n{n}"),
        );
        let status = tokio::select! {
            status = asked => status,
            _ = shared.deadline() => {
                tally.unanswered(t0);
                return Ok(tally);
            }
        };
        match status {
            Ok(status) => {
                tally.record(t0, sent, status);
                shared.done.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                shared.errors.fetch_add(1, Ordering::Relaxed);
                return Ok(tally);
            }
        }
    }
    Ok(tally)
}

/// One request and its answer's status; with `--lease`, the acquire then (granted) its
/// release under the connection's own lease id.
async fn exchange(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    spec: &LoadSpec,
    target: &str,
    path: String,
    body: Bytes,
    lease_id: String,
) -> anyhow::Result<u16> {
    let post = |path: &str, body: Bytes| {
        Request::post(path)
            .header("host", target)
            .header("content-type", "application/json")
            .body(Full::new(body))
    };
    let lease = Bytes::from(format!("{{\"lease\":\"{lease_id}\"}}"));
    let body = if spec.lease { lease.clone() } else { body };
    sender.ready().await?;
    let resp = sender.send_request(post(&path, body)?).await?;
    let status = resp.status().as_u16();
    resp.into_body().collect().await?;
    if spec.lease && status == 200 {
        sender.ready().await?;
        let resp = sender
            .send_request(post(&path.replace("/acquire", "/release"), lease)?)
            .await?;
        let released = resp.status().as_u16();
        resp.into_body().collect().await?;
        anyhow::ensure!(released == 200, "a release answered {released}");
    }
    Ok(status)
}

/// Once a second: prints progress (with `progress`) and ends the run at its duration.
async fn watch(spec: Arc<LoadSpec>, shared: Arc<Shared>, started: Instant) {
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let done = shared.done.load(Ordering::Relaxed);
        if spec.progress {
            eprintln!(
                "  {:>6.1} s  {:>9} req/s  {done} done",
                started.elapsed().as_secs_f64(),
                done - last
            );
        }
        last = done;
        if spec.duration.is_some_and(|d| started.elapsed() >= d) {
            shared.stop.store(true, Ordering::Relaxed);
        }
    }
}

pub async fn run(spec: LoadSpec) -> anyhow::Result<Report> {
    anyhow::ensure!(
        spec.connections > 0 && !spec.targets.is_empty(),
        "need connections and targets"
    );
    anyhow::ensure!(
        spec.rate.is_none_or(|r| r > 0.0 && r.is_finite()),
        "--rate must be a positive number of requests per second"
    );
    let shared = Shared::new(spec.rate, spec.duration, spec.requests);
    let spec = Arc::new(spec);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for id in 0..spec.connections {
        let target = spec.targets[id % spec.targets.len()].clone();
        let (spec, shared) = (spec.clone(), shared.clone());
        tasks.push(tokio::spawn(async move {
            if spec.grpc.is_some() {
                crate::grpc::grpc_connection(spec, shared, target, id).await
            } else {
                connection(spec, shared, target, id).await
            }
        }));
    }
    let progress = tokio::spawn(watch(spec.clone(), shared.clone(), started));
    let mut hist = histogram()?;
    let mut statuses = BTreeMap::new();
    let mut admitted = BTreeMap::new();
    let mut straddling = BTreeMap::new();
    let mut log = Vec::new();
    for t in tasks {
        let mut tally = t.await??;
        log.extend(tally.log.take().unwrap_or_default());
        hist.add(&tally.hist)?;
        for (s, n) in tally.statuses {
            *statuses.entry(s).or_default() += n;
        }
        for (w, n) in tally.admitted {
            *admitted.entry(w).or_default() += n;
        }
        for (w, n) in tally.straddling {
            *straddling.entry(w).or_default() += n;
        }
    }
    progress.abort();
    let seconds = started.elapsed().as_secs_f64();
    if let Some(path) = &spec.latency_log {
        write_log(path, log)?;
    }
    let unanswered = statuses.remove(&0).unwrap_or(0);
    let requests: u64 = statuses.values().sum();
    let ok = statuses.get(&200).copied().unwrap_or(0);
    let per = spec.batch.unwrap_or(1) as u64;
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    let window = spec.windows.unwrap_or(1);
    Ok(Report {
        requests,
        increments: ok * per,
        seconds,
        offered_per_sec: spec.rate,
        requests_per_sec: requests as f64 / seconds,
        increments_per_sec: (ok * per) as f64 / seconds,
        latency_ms: Latency {
            p50: ms(0.5),
            p90: ms(0.9),
            p99: ms(0.99),
            p999: ms(0.999),
            max: hist.max() as f64 / 1000.0,
        },
        statuses,
        unanswered,
        errors: shared.errors.load(Ordering::Relaxed),
        admitted_per_window: admitted.into_iter().map(|(w, n)| (w * window, n)).collect(),
        straddling_per_window: straddling
            .into_iter()
            .map(|(w, n)| (w * window, n))
            .collect(),
    })
}

/// `--latency-log`: `due_unix_us latency_us`, a line per answer, in due order.
fn write_log(path: &std::path::Path, mut log: Vec<(u64, u64)>) -> anyhow::Result<()> {
    use std::io::Write;
    log.sort_unstable();
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (due, took) in log {
        writeln!(out, "{due} {took}")?;
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--grpc` against a port that speaks no HTTP/2 (it answers garbage and closes):
    /// the run ends at its duration with every call an error, instead of spinning both
    /// cores past it. The run has a runtime of its own on a thread of its own, so a run
    /// that spins cannot keep this test from failing.
    #[test]
    fn a_grpc_run_ends_at_its_duration_whatever_the_target_answers() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let target = listener.local_addr().expect("addr").to_string();
        std::thread::spawn(move || {
            use std::io::Write;
            for mut s in listener.incoming().flatten() {
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
            }
        });
        let spec = LoadSpec {
            targets: vec![target],
            connections: 4,
            duration: Some(Duration::from_secs(1)),
            requests: None,
            rate: None,
            keys: Keys::parse("uniform:10").expect("keys"),
            namespace: "ns".into(),
            window_size: None,
            batch: None,
            hit: false,
            lease: false,
            grpc: Some(vec![("k".into(), "{key}".into())]),
            windows: None,
            limitador: false,
            latency_log: None,
            progress: false,
        };
        let report = run_alone(spec);
        // a connection whose handshake fails ends the run with its error; one that got
        // through counted only errors
        if let Ok(r) = report {
            assert_eq!(r.statuses.get(&200), None, "{:?}", r.statuses);
        }
    }

    /// A spec for `target`: `connections` connections, open loop at `rate` for `seconds`.
    fn open_loop(target: String, connections: usize, rate: f64, seconds: u64) -> LoadSpec {
        LoadSpec {
            targets: vec![target],
            connections,
            duration: Some(Duration::from_secs(seconds)),
            requests: None,
            rate: Some(rate),
            keys: Keys::parse("uniform:10").expect("keys"),
            namespace: "ns".into(),
            window_size: None,
            batch: None,
            hit: true,
            lease: false,
            grpc: None,
            windows: None,
            limitador: false,
            latency_log: None,
            progress: false,
        }
    }

    /// A server that answers each request on a connection `delay` after reading it.
    fn slow_server(delay: Option<Duration>) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let target = listener.local_addr().expect("addr").to_string();
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    use std::io::{Read, Write};
                    let mut s = s;
                    let mut buf = [0u8; 4096];
                    while s.read(&mut buf).is_ok_and(|n| n > 0) {
                        match delay {
                            Some(d) => std::thread::sleep(d),
                            None => std::thread::sleep(Duration::from_secs(3600)),
                        }
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if s.write_all(ok).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        target
    }

    fn run_alone(spec: LoadSpec) -> anyhow::Result<Report> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            let _ = tx.send(rt.block_on(run(spec)));
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the run ended within 30 s of its duration")
    }

    /// Open loop counts each latency from when its request was due: one connection to a
    /// server taking 300 ms, 20 requests due per second — every request after the first
    /// waits behind the ones before it, which a closed loop (and a latency counted from
    /// the send) would hide as a steady 300 ms.
    #[test]
    fn open_loop_latency_counts_the_wait_behind_a_slow_answer() {
        let target = slow_server(Some(Duration::from_millis(300)));
        let r = run_alone(open_loop(target, 1, 20.0, 2)).expect("a run");
        // 2 s at 20/s is 40 due; at most 7 answered (one per 300 ms), the rest of the
        // queue never sent; the last answered was due at 300 ms and answered past 2.1 s
        assert!(r.requests <= 7, "{r:?}");
        assert!(r.latency_ms.max >= 1_500.0, "{r:?}");
        assert!(r.latency_ms.p50 >= 300.0, "{r:?}");
        assert_eq!(r.offered_per_sec, Some(20.0));
    }

    /// A target that accepts and never answers: the run ends at its duration, the
    /// requests waiting counted as unanswered, none as answered.
    #[test]
    fn an_open_loop_run_ends_at_its_duration_when_nothing_answers() {
        let target = slow_server(None);
        let r = run_alone(open_loop(target, 4, 100.0, 1)).expect("a run");
        assert_eq!(r.requests, 0, "{r:?}");
        assert_eq!(r.unanswered, 4, "{r:?}");
    }
}
