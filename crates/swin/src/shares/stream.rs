//! A proxy's stream of reports (see `shares`): what a report must be, the namespace its
//! domain binds, the usages it takes and counts, and the answer it gets.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::assign::Action;
use super::buckets::{checked, keys, ruled, Ruled};
use super::*;
use crate::error::Error;
use crate::state::Namespace;

impl Proxy {
    /// Its stream, as a report of it runs.
    pub(crate) fn stream(&self) -> Stream {
        Stream {
            shares: self.shares.clone(),
            id: self.id,
        }
    }
}

/// A proxy's stream as one of its reports runs (the [`Proxy`] ends it when dropped).
#[derive(Debug, Clone)]
pub(crate) struct Stream {
    shares: Arc<Shares>,
    id: u64,
}

impl Stream {
    /// What a report must be to be taken at all: an error (no domain, too many buckets)
    /// ends the stream.
    pub(crate) fn check(reports: &Reports) -> Result<(), Error> {
        if reports.domain.is_empty() {
            return Err(Error::BadRequest(
                "domain: a report names its namespace; got none".into(),
            ));
        }
        if reports.usages.len() > MAX_BUCKETS_PER_REPORT {
            return Err(Error::BadRequest(format!(
                "bucket_quota_usages: {} buckets in one report; at most {MAX_BUCKETS_PER_REPORT}",
                reports.usages.len()
            )));
        }
        Ok(())
    }

    /// The namespace of a report (see [`Stream::bind`]) and the keys of its buckets to
    /// touch first.
    pub(crate) fn bound(&self, reports: &Reports) -> (Option<Arc<Namespace>>, Vec<String>) {
        let ns = self.bind(&reports.domain);
        let keys = match &ns {
            Some(ns) => keys(ns, &reports.usages, |keys| self.taken(keys)),
            None => Vec::new(),
        };
        (ns, keys)
    }

    /// Takes a report, its keys touched: records each bucket's demand, counts what was
    /// allowed, and answers each bucket's assignment now. A bad bucket, one no rule
    /// covers, or a new one past the caps on live buckets is abandoned, the others
    /// answered as usual.
    pub(crate) async fn answer(
        &self,
        ns: Option<&Arc<Namespace>>,
        reports: Reports,
    ) -> Vec<BucketAction> {
        let ttl = self.ttl();
        let mut out = Vec::with_capacity(reports.usages.len());
        let mut counts = Vec::new();
        let mut shared = Vec::new();
        for usage in reports.usages {
            let bucket = match checked(&usage.bucket) {
                Ok(Some(b)) => b,
                Ok(None) => continue,
                Err(why) => {
                    tracing::debug!(why, "a bucket abandoned");
                    out.push(BucketAction {
                        bucket: usage.bucket,
                        action: Action::Abandon,
                    });
                    continue;
                }
            };
            let Some(ns) = ns else {
                out.push(BucketAction {
                    bucket,
                    action: Action::Abandon,
                });
                continue;
            };
            let action = match ruled(ns, &bucket) {
                Ruled::Shared { limit, unit, key } => {
                    shared.push(Shared {
                        bucket,
                        usage,
                        limit,
                        unit,
                        key,
                    });
                    continue;
                }
                Ruled::Allow(key) => {
                    counts.extend(key.map(|k| (k, usage.allowed)));
                    Action::AllowAll { ttl }
                }
                Ruled::Deny => Action::DenyAll { ttl },
                Ruled::Abandon => Action::Abandon,
            };
            out.push(BucketAction { bucket, action });
        }
        if let Some(ns) = ns {
            self.take_usages(ns, shared, &mut out, &mut counts);
            count_allowed(ns, counts).await;
        }
        out
    }

    /// The namespace this stream reports on: the first report's domain; another
    /// domain later (or an unknown one) gets its buckets abandoned.
    fn bind(&self, domain: &str) -> Option<Arc<Namespace>> {
        let mut state = self.shares.state();
        let p = state.proxies.get_mut(&self.id)?;
        let now = Instant::now();
        if let Some(last) = p.last_report.replace(now) {
            // a report sooner than the last interval shortens it only slowly: one early
            // report must not make the stream's buckets look gone before its next
            let measured = now.duration_since(last);
            p.interval = Some(match p.interval {
                Some(was) => measured.max(was.mul_f64(0.75)),
                None => measured,
            });
        }
        match &p.namespace {
            Some(n) if n != domain => {
                tracing::warn!(stream = %n, domain, "a report names another domain than its stream's first: its buckets are abandoned");
                return None;
            }
            Some(_) => {}
            None => p.namespace = Some(domain.to_owned()),
        }
        drop(state);
        self.shares.namespace(domain)
    }

    /// Records the usage of the report's divided buckets (under one lock), each with its
    /// action now, and the keys their allowed requests are counted on.
    fn take_usages(
        &self,
        ns: &Namespace,
        shared: Vec<Shared>,
        out: &mut Vec<BucketAction>,
        counts: &mut Vec<(String, u64)>,
    ) {
        let now = Instant::now();
        let limits = self.shares.limits;
        let mut state = self.shares.state();
        let State {
            proxies,
            held,
            buckets,
            client_buckets,
            ..
        } = &mut *state;
        let name = ns.sync.name();
        let Some(p) = proxies.get_mut(&self.id) else {
            out.extend(shared.into_iter().map(|s| BucketAction::abandon(s.bucket)));
            return;
        };
        let mut capped = 0;
        let of_client = client_buckets.entry(p.client.clone()).or_default();
        for s in shared {
            let demand = s.demand(p.interval);
            if !p.buckets.contains_key(&s.key) {
                if p.buckets.len() >= limits.buckets_per_stream
                    || *of_client >= limits.buckets_per_client
                    || *buckets >= limits.buckets
                {
                    capped += 1;
                    out.push(BucketAction::abandon(s.bucket));
                    continue;
                }
                *buckets += 1;
                *of_client += 1;
            }
            let b = p
                .buckets
                .entry(s.key.clone())
                .or_insert_with(|| ProxyBucket {
                    id: s.bucket.clone(),
                    demand,
                    limit: s.limit,
                    unit: s.unit,
                    reported: now,
                    reports: 0,
                    sent: None,
                    divided: None,
                    posted: None,
                });
            (b.demand, b.limit, b.unit, b.reported) = (demand, s.limit, s.unit, now);
            b.reports = b.reports.saturating_add(1);
            counts.push((s.key.clone(), s.usage.allowed));
            // a share grows only in a sharing round, after this node's assignments are
            // posted; here it stays or comes down (a proxy holding nothing waits for the
            // round), and holds no longer than this node's entry surely lives in the
            // store: told again only while the store shows it (in an outage assignments
            // are left to lapse)
            let until = held.get(&(name.to_owned(), s.key)).copied();
            let action = b
                .divided
                .and_then(|d| b.no_more_than_held(d, now))
                .and_then(|a| within(a, until, now));
            if let Some(action) = action {
                b.sent = Some((action, now));
                out.push(BucketAction {
                    bucket: s.bucket,
                    action,
                });
            }
        }
        if capped > 0 {
            warn_capped(name, &p.client.to_string(), capped, &limits);
        }
    }

    /// Of a report's keys, those its stream holds already and the new ones the caps on
    /// live buckets leave room for, in order.
    fn taken(&self, mut keys: Vec<String>) -> Vec<String> {
        let limits = self.shares.limits;
        let state = self.shares.state();
        let Some(p) = state.proxies.get(&self.id) else {
            return Vec::new();
        };
        let of_client = state.client_buckets.get(&p.client).copied().unwrap_or(0);
        let mut room = limits
            .buckets_per_stream
            .saturating_sub(p.buckets.len())
            .min(limits.buckets_per_client.saturating_sub(of_client))
            .min(limits.buckets.saturating_sub(state.buckets));
        keys.retain(|k| {
            p.buckets.contains_key(k) || {
                let fits = room > 0;
                room = room.saturating_sub(1);
                fits
            }
        });
        keys
    }

    fn ttl(&self) -> Duration {
        self.shares
            .state()
            .proxies
            .get(&self.id)
            .map_or(Duration::from_secs(2), ProxyState::ttl)
    }
}

/// Counts each bucket's allowed requests on its key, as hits are counted.
/// Many at a time: a report of thousands of buckets on a synchronous namespace waits
/// for a few round trips, not one per bucket.
async fn count_allowed(ns: &Namespace, counts: Vec<(String, u64)>) {
    use futures_util::StreamExt;
    let now = swin_sync::now();
    futures_util::stream::iter(counts.into_iter().filter(|(_, n)| *n > 0))
        .map(|(key, allowed)| async move {
            let count = crate::pipeline::Count {
                ns,
                key: &key,
                value: allowed as f64,
                window_size: None,
                now,
            };
            let counted = count.take().await;
            if let Err(e) = counted {
                tracing::warn!(key, cause = %e, "a proxy's allowed requests were not counted");
            }
        })
        .buffer_unordered(64)
        .collect::<()>()
        .await;
}

/// New buckets past the caps on live buckets were abandoned: said once per report.
fn warn_capped(namespace: &str, client: &str, capped: usize, limits: &QuotaLimits) {
    tracing::warn!(
        namespace,
        client,
        capped,
        per_stream = limits.buckets_per_stream,
        per_client = limits.buckets_per_client,
        per_node = limits.buckets,
        "new quota buckets past quota.buckets_per_stream, quota.buckets_per_client or quota.buckets: abandoned"
    );
}
