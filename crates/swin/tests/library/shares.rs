//! Envoy's quota service against streams that keep reporting: the limit is shared fair
//! by client (a token's name, else a peer address), then among one client's streams, so
//! many streams of one client take no more than one honest proxy's client does, and no
//! bucket with room has every stream told to deny.

use std::time::Duration;

use swin::shares::{Action, BucketAction, Proxy, Reports, Usage};
use swin::Client;
use swin_testkit::TestStore;
use tokio::sync::mpsc::Receiver;
use tokio::time::Instant;

use super::start;

swin_testkit::for_stores!([sqlite, redis] [
    many_streams_of_one_client_leave_an_honest_proxy_half_the_bucket,
    streams_of_four_clients_past_the_limit_are_never_all_denied,
]);

/// 100 a second on `name=api`, shared by the proxies of the namespace `quota`.
const QUOTA: &str = r#"
[[namespaces]]
name = "quota"
store = "main"
sync_rate = 0.2
window_sizes = [60]

[[namespaces.descriptors]]
key = "name"
value = "api"
rate_limit = { unit = "second", requests_per_unit = 100 }
"#;

const LIMIT: u64 = 100;

/// One proxy's stream, and what it was last told for `name=api` (and when).
struct Stream {
    proxy: Proxy,
    pushed: Receiver<Vec<BucketAction>>,
    told: Option<(Action, Instant)>,
}

impl Stream {
    async fn open(limiter: &swin::Limiter, client: &str) -> Stream {
        let client = Client::Address(client.parse().expect("an address"));
        let (proxy, pushed) = limiter.quota_stream(&client).expect("a stream");
        Stream {
            proxy,
            pushed,
            told: None,
        }
    }

    /// Reports `allowed` and `denied` over the last second; keeps what it is told.
    async fn report(&mut self, limiter: &swin::Limiter, allowed: u64, denied: u64) {
        let bucket = vec![("name".to_owned(), "api".to_owned())];
        let usage = Usage::new(bucket, Some(Duration::from_secs(1)), allowed, denied);
        let reports = Reports::new("quota".into(), vec![usage]);
        let answers = limiter
            .quota_report(&self.proxy, reports)
            .await
            .expect("a report taken");
        self.keep(answers);
    }

    /// Keeps what the sharing rounds told it since.
    fn drain(&mut self) {
        while let Ok(answers) = self.pushed.try_recv() {
            self.keep(answers);
        }
    }

    fn keep(&mut self, answers: Vec<BucketAction>) {
        if let Some(a) = answers.last() {
            self.told = Some((a.action(), Instant::now()));
        }
    }

    /// What it holds now: its last assignment's tokens per second while it holds (a
    /// deny, or nothing told or left: 0).
    fn holds(&self) -> u64 {
        match self.told {
            Some((a, at)) if at + a.ttl() > Instant::now() => a.share().unwrap_or(LIMIT),
            _ => 0,
        }
    }
}

/// The honest proxy asks for the whole limit and reports what it let through of it;
/// 64 streams of one other client each report 120 denied every second. After four
/// seconds (a claim, then three shown reports) the honest proxy holds at least 40 of
/// the 100 at each of the next three seconds: max-min over two clients gives it 50.
async fn many_streams_of_one_client_leave_an_honest_proxy_half_the_bucket(store: &TestStore) {
    let limiter = start(store, QUOTA).await;
    let mut honest = Stream::open(&limiter, "10.0.0.1").await;
    let mut flood = Vec::new();
    for _ in 0..64 {
        flood.push(Stream::open(&limiter, "10.0.0.2").await);
    }
    let mut seen = Vec::new();
    for second in 0..7 {
        honest.drain();
        let allowed = honest.holds().min(LIMIT);
        honest.report(&limiter, allowed, LIMIT - allowed).await;
        for s in &mut flood {
            s.drain();
            s.report(&limiter, 0, 120).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        honest.drain();
        if second >= 4 {
            seen.push(honest.holds());
        }
    }
    assert!(
        seen.iter().all(|&h| h >= 40),
        "the honest proxy held {seen:?} of {LIMIT} a second beside 64 streams of one client"
    );
    drop((honest, flood));
    limiter.stop().await.expect("stop");
}

/// 256 streams over four clients, 64 each, every one reporting 120 denied a second:
/// from the third second on, at each second some stream of each client holds a token
/// bucket (never every stream told to deny while the limit has room), what they hold
/// adds up to about the limit, and a client's 25 tokens go round its streams in turn (more
/// than 25 of them held one over the four seconds).
async fn streams_of_four_clients_past_the_limit_are_never_all_denied(store: &TestStore) {
    let limiter = start(store, QUOTA).await;
    let mut streams: Vec<(usize, Stream)> = Vec::new();
    for client in 0..4 {
        for _ in 0..64 {
            let s = Stream::open(&limiter, &format!("10.0.1.{client}")).await;
            streams.push((client, s));
        }
    }
    let mut seen = Vec::new();
    let mut ever = vec![false; streams.len()];
    for second in 0..6 {
        for (_, s) in &mut streams {
            s.drain();
            s.report(&limiter, 0, 120).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        if second < 2 {
            continue;
        }
        let mut held = vec![0; 5];
        for (i, (client, s)) in streams.iter_mut().enumerate() {
            s.drain();
            held[*client] += s.holds();
            held[4] += s.holds();
            ever[i] |= s.holds() > 0;
        }
        seen.push(held);
    }
    for held in &seen {
        assert!(
            held[..4].iter().all(|&h| h > 0),
            "a client's streams all denied (tokens held per client, then in all, each second): {seen:?}"
        );
        // a round's answers are read while they are sent: one may show a share that
        // grew before another shows the one that fell for it
        assert!(held[4] <= LIMIT + LIMIT / 4, "{seen:?}");
        assert!(held[4] >= LIMIT / 2, "{seen:?}");
    }
    for client in 0..4 {
        let turned = ever[client * 64..(client + 1) * 64]
            .iter()
            .filter(|&&e| e)
            .count();
        assert!(
            turned > 25,
            "client {client}: {turned} of its streams ever held a token"
        );
    }
    drop(streams);
    limiter.stop().await.expect("stop");
}
