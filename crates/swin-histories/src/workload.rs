//! The clients: each draws its requests from a `StdRng` seeded from the run's seed —
//! hits (costs, dry runs), increments, batches across namespaces, refunds, reserves on
//! one key and on several, extends, commits under and over the estimate (`debt` on
//! `main`, `cap` on `side`), leases (acquire, renew, release), runtime limit changes,
//! Envoy's `ShouldRateLimit` — sends each to a node picked at random, most under an
//! `Idempotency-Key`, sends it again (to the same node or another) after an unclear
//! answer, and records every attempt. A reservation on a key of its own is committed
//! on its node a moment later, again and again while the store is away.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::history::{Answer, Kind, Request};
use crate::plans::{draw, is_own, own_commit, own_reserve, Held, Method, Open, Plan};
use crate::rls::Rls;

/// Where attempts are written, and the clock they are timed by.
#[derive(Debug)]
pub struct Recorder {
    t0: Instant,
    next_op: AtomicU64,
    log: Mutex<Vec<Request>>,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            t0: Instant::now(),
            next_op: AtomicU64::new(1),
            log: Mutex::new(Vec::new()),
        }
    }

    pub fn ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    fn op(&self) -> u64 {
        self.next_op.fetch_add(1, Ordering::SeqCst)
    }

    fn push(&self, r: Request) {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).push(r);
    }

    /// Every attempt so far, in the order they ended.
    pub fn history(&self) -> Vec<Request> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

/// Sends `body` to `base` + `path` by `method`: the answer, byte for byte.
async fn send(
    http: &reqwest::Client,
    base: &str,
    method: Method,
    path: &str,
    body: &Value,
    idem: Option<&str>,
) -> Answer {
    let url = format!("{base}{path}");
    let mut req = match method {
        Method::Put => http.put(url),
        Method::Delete => http.delete(url),
        _ => http.post(url),
    };
    if !body.is_null() {
        req = req
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    if let Some(k) = idem {
        req = req.header("Idempotency-Key", k);
    }
    match req.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            match r.text().await {
                Ok(body) => Answer::Status { status, body },
                Err(e) => Answer::Unknown {
                    reason: format!("body lost: {e}"),
                },
            }
        }
        Err(e) if e.is_connect() => Answer::NotSent {
            reason: e.to_string(),
        },
        Err(e) if e.is_timeout() => Answer::Unknown {
            reason: "timeout".into(),
        },
        Err(e) => Answer::Unknown {
            reason: format!("connection lost: {e}"),
        },
    }
}

/// How long a client commits its reservation on a key of its own before it leaves it
/// open (the store away longer than the nemesis keeps it).
const OWN_FOR: Duration = Duration::from_secs(10);

/// A reservation on a key of its own: the node that made it, when it is committed
/// there (0.3–1.5 s later: past the node's next push of it, which a store gone away
/// meanwhile fails), and when it was made.
#[derive(Debug, Clone)]
struct Own {
    open: Open,
    node: usize,
    due: Instant,
    since: Instant,
}

/// One client's life until `deadline`.
#[derive(Debug)]
pub struct Client {
    pub id: usize,
    pub rng: StdRng,
    pub bases: Arc<Vec<String>>,
    pub rec: Arc<Recorder>,
    http: reqwest::Client,
    rls: Rls,
    open: Vec<Open>,
    /// A reservation on a key of its own: committed on its node when due, again after
    /// each unclear answer until one is clear (a store that is away leaves it owed; it
    /// lands as the store comes back). One at a time.
    own: Option<Own>,
    held: Vec<Held>,
    /// Requests drawn so far (names this client's leases).
    drawn: u64,
}

impl Client {
    pub fn new(
        id: usize,
        seed: u64,
        bases: Arc<Vec<String>>,
        grpc: &[String],
        rec: Arc<Recorder>,
    ) -> Client {
        let rng = StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(id as u64));
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("http client");
        Client {
            id,
            rng,
            bases,
            rec,
            http,
            rls: Rls::new(grpc),
            open: Vec::new(),
            own: None,
            held: Vec::new(),
            drawn: 0,
        }
    }

    pub async fn run(mut self, deadline: Instant) {
        while Instant::now() < deadline {
            self.drawn += 1;
            match self.own.clone() {
                Some(o) if Instant::now() >= o.due => {
                    let plan = own_commit(&mut self.rng, &o.open);
                    if self.perform(plan, Some(o.node)).await || o.since.elapsed() > OWN_FOR {
                        self.own = None;
                    }
                }
                None if self.rng.gen_bool(0.15) => {
                    let plan = own_reserve(&mut self.rng, self.id, self.drawn);
                    self.perform(plan, None).await;
                }
                _ => {
                    let plan = draw(&mut self.rng, &self.open, &self.held, self.id, self.drawn);
                    self.perform(plan, None).await;
                }
            }
            let pause = self.rng.gen_range(20..120);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// Sends `plan` (to node `pin`, or to one drawn) and, while its answer is unclear,
    /// again (at most three more times) under its `Idempotency-Key` (a commit without
    /// one: sent again as it is). Whether the last answer was clear.
    async fn perform(&mut self, plan: Plan, pin: Option<usize>) -> bool {
        let op = self.rec.op();
        let dry = plan.body["dry_run"] == true;
        let keyed = plan.method == Method::Post
            && !matches!(plan.kind, Kind::Refund | Kind::Release | Kind::Renew);
        let idem =
            (!dry && keyed && self.rng.gen_bool(0.7)).then(|| format!("c{}-op{op}", self.id));
        // sent again after an unclear answer: what is applied once without a key too
        // (a commit, a release, a renewal, a named acquire, a limit change); never an
        // Envoy request (Envoy does not send one again)
        let retry = idem.is_some()
            || matches!(
                plan.kind,
                Kind::Commit | Kind::Release | Kind::Renew | Kind::SetLimits | Kind::DeleteLimits
            )
            || (plan.kind == Kind::Acquire && plan.body["lease"].is_string());
        let mut node = pin.unwrap_or_else(|| self.rng.gen_range(0..self.bases.len()));
        let mut last = None;
        for attempt in 0..4 {
            if attempt > 0 {
                // after 503 `outcome_unknown` the store is away: wait it out
                let unknown = last.as_ref().is_some_and(|r: &Request| {
                    crate::history::error_code(&r.json()) == Some("outcome_unknown")
                });
                let ms = if unknown {
                    self.rng.gen_range(1500..3500)
                } else {
                    self.rng.gen_range(100..400)
                };
                tokio::time::sleep(Duration::from_millis(ms)).await;
                if pin.is_none() && self.rng.gen_bool(0.5) {
                    node = self.rng.gen_range(0..self.bases.len());
                }
            }
            let start_ms = self.rec.ms();
            let answer = if plan.method == Method::Grpc {
                self.rls.send(node, &plan.body).await
            } else {
                send(
                    &self.http,
                    &self.bases[node],
                    plan.method,
                    &plan.path,
                    &plan.body,
                    idem.as_deref(),
                )
                .await
            };
            let r = Request {
                op,
                client: self.id,
                node,
                start_ms,
                end_ms: self.rec.ms(),
                kind: plan.kind,
                ns: plan.ns.clone(),
                key: plan.key.clone(),
                path: plan.path.clone(),
                body: plan.body.clone(),
                idem: idem.clone(),
                answer,
            };
            // an unclear answer is sent again; a clear one, now and then, too (its
            // replay must repeat it)
            let again =
                retry && (!r.kept() || (idem.is_some() && attempt == 0 && self.rng.gen_bool(0.1)));
            self.rec.push(r.clone());
            last = Some(r);
            if !again {
                break;
            }
        }
        let Some(r) = last else {
            return false;
        };
        self.follow(&plan, &r);
        r.kept()
    }

    /// Keeps the client's open reservations as the answer says.
    fn follow(&mut self, plan: &Plan, r: &Request) {
        let v = r.json();
        let id = plan.body["reservation"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match plan.kind {
            Kind::Reserve if r.kept() && v["reservation"].is_string() => {
                let o = Open {
                    id: v["reservation"].as_str().unwrap_or_default().to_owned(),
                    ns: plan.ns.clone(),
                    key: (!plan.key.is_empty()).then(|| plan.key.clone()),
                    total: plan.body["cost"].as_f64().unwrap_or(0.0),
                };
                match is_own(&plan.key) {
                    true => {
                        let later = Duration::from_millis(self.rng.gen_range(300..1500));
                        self.own = Some(Own {
                            open: o,
                            node: r.node,
                            due: Instant::now() + later,
                            since: Instant::now(),
                        });
                    }
                    false => self.open.push(o),
                }
            }
            Kind::Extend => match v["total"].as_f64() {
                Some(t) => self
                    .open
                    .iter_mut()
                    .filter(|o| o.id == id)
                    .for_each(|o| o.total = t),
                None if r.kept() && r.json()["error"]["code"] == "unknown_reservation" => {
                    self.open.retain(|o| o.id != id)
                }
                None => {}
            },
            Kind::Commit => self.open.retain(|o| o.id != id),
            Kind::Acquire if r.kept() && v["allowed"] == true => {
                let lease = v["lease"].as_str().unwrap_or_default().to_owned();
                if !self.held.iter().any(|h| h.lease == lease) {
                    self.held.push(Held {
                        lease,
                        key: plan.key.clone(),
                    });
                }
            }
            Kind::Release | Kind::Renew
                if r.kept() && (plan.kind == Kind::Release || v["renewed"] != true) =>
            {
                let lease = plan.body["lease"].as_str().unwrap_or_default();
                self.held.retain(|h| h.lease != lease);
            }
            _ => {}
        }
    }
}
