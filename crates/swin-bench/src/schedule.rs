//! When a connection sends its next request, and what it saw.
//!
//! Closed loop: as soon as its last answer came. Open loop: a pacer thread releases
//! request *i* at `start + i / rate` into a queue every connection takes from, whatever
//! the answers (the load an operator's clients put on a limiter), and each latency is
//! counted from that due time, not from when a connection got round to sending it — so a
//! stalled server, or a request queued behind a slow one, is counted for all of its wait
//! (corrected for coordinated omission, as wrk2 does). The pacer sleeps on the OS's
//! high-resolution timer and releases at once every request already due: the tokio timer
//! rounds every sleep up to the next millisecond, which at 5,000 requests/s added a
//! millisecond or more to most answers.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, Mutex};

pub struct Shared {
    pub sent: AtomicU64,
    pub done: AtomicU64,
    pub errors: AtomicU64,
    pub stop: AtomicBool,
    /// The end of `--duration`: each connection checks it before each request, and no
    /// answer is awaited past it, so the run ends on time whatever the target does.
    pub until: Option<Instant>,
    /// Open loop: the due times of the requests to send, in order.
    pub queue: Option<Mutex<mpsc::UnboundedReceiver<Instant>>>,
}

impl Shared {
    /// Starts the pacer (open loop at `rate`) and returns what the connections share.
    pub fn new(rate: Option<f64>, duration: Option<Duration>, requests: Option<u64>) -> Arc<Self> {
        let until = duration.map(|d| Instant::now() + d);
        let queue = rate.map(|rate| {
            let (tx, rx) = mpsc::unbounded_channel();
            std::thread::spawn(move || pace(tx, rate, until, requests));
            Mutex::new(rx)
        });
        Arc::new(Shared {
            sent: AtomicU64::new(0),
            done: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            until,
            queue,
        })
    }

    fn over(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || self.until.is_some_and(|t| Instant::now() >= t)
    }

    /// The time the connection's next request counts from, or `None` when the run is
    /// over for it: stopped, past its duration, its request budget spent or (open loop)
    /// the pacer done and the queue empty.
    pub async fn next_request(&self, requests: Option<u64>) -> Option<Instant> {
        if self.over() {
            return None;
        }
        match &self.queue {
            Some(queue) => {
                let due = tokio::select! {
                    due = async { queue.lock().await.recv().await } => due?,
                    _ = self.deadline() => return None,
                };
                (!self.over()).then_some(due)
            }
            None => {
                let sent = self.sent.fetch_add(1, Ordering::Relaxed);
                requests.is_none_or(|limit| sent < limit).then(Instant::now)
            }
        }
    }

    /// Resolves at the end of the run's duration (never without one).
    pub async fn deadline(&self) {
        match self.until {
            Some(t) => tokio::time::sleep_until(t.into()).await,
            None => std::future::pending().await,
        }
    }
}

/// The pacer: releases request i at `start + i / rate` until `until` or `requests`.
fn pace(
    tx: mpsc::UnboundedSender<Instant>,
    rate: f64,
    until: Option<Instant>,
    requests: Option<u64>,
) {
    let start = Instant::now();
    for i in 0..requests.unwrap_or(u64::MAX) {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        if until.is_some_and(|t| due >= t) {
            break;
        }
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        if tx.send(due).is_err() {
            break;
        }
    }
}

/// What one connection saw; merged at the end (no lock shared between connections).
pub struct Tally {
    pub hist: hdrhistogram::Histogram<u64>,
    pub statuses: BTreeMap<u16, u64>,
    /// Requests answered 200, by the window of the wall clock they were answered in
    /// (`unix seconds / window`), when asked for.
    pub admitted: BTreeMap<u64, u64>,
    /// Of those, the ones sent in the window before: decided on either side of the
    /// edge, so a count above the limit by no more than these is not proof of excess.
    pub straddling: BTreeMap<u64, u64>,
    /// With `--latency-log`: each answer's due time (unix µs) and latency (µs).
    pub log: Option<Vec<(u64, u64)>>,
    window: Option<u64>,
}

/// Latencies are recorded in microseconds, up to a minute.
pub fn histogram() -> anyhow::Result<hdrhistogram::Histogram<u64>> {
    Ok(hdrhistogram::Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

impl Tally {
    pub fn new(window: Option<u64>, log: bool) -> anyhow::Result<Tally> {
        Ok(Tally {
            hist: histogram()?,
            statuses: BTreeMap::new(),
            admitted: BTreeMap::new(),
            straddling: BTreeMap::new(),
            log: log.then(Vec::new),
            window,
        })
    }

    /// One answer of `status`, `t0` the time it was due (or sent), `sent` when it was.
    pub fn record(&mut self, t0: Instant, sent: Instant, status: u16) {
        let took = t0.elapsed();
        self.hist
            .saturating_record((took.as_micros() as u64).max(1));
        if let Some(log) = &mut self.log {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let due = now.saturating_sub(took).as_micros() as u64;
            log.push((due, took.as_micros() as u64));
        }
        *self.statuses.entry(status).or_default() += 1;
        if let (200, Some(w)) = (status, self.window) {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let window = now.as_secs() / w.max(1);
            *self.admitted.entry(window).or_default() += 1;
            let sent_at = now.saturating_sub(sent.elapsed());
            if sent_at.as_secs() / w.max(1) < window {
                *self.straddling.entry(window).or_default() += 1;
            }
        }
    }

    /// A request the run ended before it was answered: its latency so far, status 0.
    pub fn unanswered(&mut self, t0: Instant) {
        self.record(t0, t0, 0);
    }
}
