//! Requests of hits: one hit ([`OneHit`]), and several decided as one ([`HitBatch`], HTTP
//! batches: all checked before any is spent, decided together — their synchronous
//! increments share round trips — and all or nothing).

use std::sync::Arc;

use crate::decisions::Verdict;
use crate::error::Error;
use crate::pipeline::{Asked, Plan, Ran, Request, Take, Taken};
use crate::state::Namespace;

/// A hit of `cost` on `key`, spent when allowed (and when denied too if the namespace
/// counts denied hits) unless `dry_run`.
#[derive(Debug)]
pub(crate) struct OneHit {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) key: String,
    pub(crate) cost: f64,
    pub(crate) dry_run: bool,
}

impl Request for OneHit {
    type Answer = Verdict;
    type Acted = ();

    fn waits_on_store(&self) -> bool {
        !self.dry_run && self.ns.counts_in_the_store()
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        let t = Take::of_key(&self.ns, self.ns.sync.name(), &self.key, self.cost)?;
        Ok(Plan {
            dry_run: self.dry_run,
            ..Plan::of(vec![Asked::Hit(t)])
        })
    }

    fn acts(&self) -> bool {
        false
    }

    async fn act(&self, _: &Plan<'_>) -> Result<(), Error> {
        Ok(())
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<()>) -> Result<Verdict, Error> {
        match ran.taken.into_iter().next() {
            Some(Some(Taken::Hit(v))) => Ok(v),
            _ => Err(Error::Internal),
        }
    }
}

/// What a batch of hits decided, with its RateLimit values: each hit's verdict (its
/// policies named `<namespace>.<policy>`), whether any was denied (then nothing was
/// spent), the strictest, and every policy once.
#[derive(Debug)]
pub struct Batch {
    pub(crate) verdicts: Vec<Verdict>,
    pub(crate) denied: bool,
    pub(crate) strictest: Verdict,
    pub(crate) policies: Vec<Arc<str>>,
}

impl Batch {
    /// Each hit's verdict, in order, its policies named `<namespace>.<policy>`.
    pub fn verdicts(&self) -> &[Verdict] {
        &self.verdicts
    }

    /// Whether any hit was denied (then none was spent).
    pub fn denied(&self) -> bool {
        self.denied
    }

    /// The verdict a client's RateLimit headers show: the one with the least left.
    pub fn strictest(&self) -> &Verdict {
        &self.strictest
    }

    /// The headers its answer carries: the strictest hit's (see [`Verdict::headers`])
    /// with every policy of the batch once, and `swin-shadow-denied` for a hit let
    /// through by a limit in shadow when the batch was spent.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let s = &self.strictest;
        crate::decisions::headers_of(s, &self.policies, !s.decision.allowed, self.shadowed())
    }

    /// A hit let through by a limit in shadow, when the batch was spent and its
    /// strictest hit was not one (the answer says so too).
    fn shadowed(&self) -> Option<&Verdict> {
        match self.denied || self.strictest.shadow_denied {
            true => None,
            false => self.verdicts.iter().find(|v| v.shadow_denied),
        }
    }
}

/// 1 to `max` hits over several namespaces decided as one request (Boulder's
/// BatchSpend): every hit is checked before any is spent, so a bad one leaves the batch
/// untouched (an error names it: `hits[i]: …`); when one is denied, or fails while
/// spending, what the others took is given back.
#[derive(Debug)]
pub(crate) struct HitBatch {
    pub(crate) hits: Vec<(Arc<Namespace>, String, f64)>,
    pub(crate) dry_run: bool,
}

impl HitBatch {
    /// The batch of `asked` (namespace, key, cost) over the namespaces `served`, of at
    /// most `max` hits.
    pub(crate) fn new(
        served: &crate::state::Namespaces,
        asked: &[(&str, &str, f64)],
        dry_run: bool,
        max: usize,
    ) -> Result<HitBatch, Error> {
        crate::policy::input::check_batch_size("hits", asked.len(), max)?;
        let mut hits = Vec::with_capacity(asked.len());
        for (i, &(namespace, key, cost)) in asked.iter().enumerate() {
            let ns = crate::state::namespace_in(served, namespace)
                .map_err(|e| e.at(&format!("hits[{i}]")))?;
            hits.push((ns, key.to_owned(), cost));
        }
        Ok(HitBatch { hits, dry_run })
    }
}

impl Request for HitBatch {
    type Answer = Batch;
    type Acted = ();

    fn waits_on_store(&self) -> bool {
        !self.dry_run && self.hits.iter().any(|(ns, ..)| ns.counts_in_the_store())
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        let mut asks = Vec::with_capacity(self.hits.len());
        for (i, (ns, key, cost)) in self.hits.iter().enumerate() {
            let t = Take::of_key(ns, ns.sync.name(), key, *cost)
                .map_err(|e| e.at(&format!("hits[{i}]")))?;
            asks.push(Asked::Hit(t));
        }
        Ok(Plan {
            dry_run: self.dry_run,
            label: Some("hits"),
            record_as_whole: true,
            ..Plan::of(asks)
        })
    }

    async fn act(&self, _: &Plan<'_>) -> Result<(), Error> {
        Ok(())
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<()>) -> Result<Batch, Error> {
        let denied = ran.refused;
        let mut verdicts = Vec::with_capacity(self.hits.len());
        for ((ns, _, cost), t) in self.hits.iter().zip(ran.taken) {
            let Some(Taken::Hit(mut v)) = t else {
                return Err(Error::Internal);
            };
            // nothing of a denied batch was spent: an allowed hit answers what remained
            // before it
            if denied && v.allowed() {
                v = v.given_back(*cost);
            }
            v.policy = format!("{}.{}", ns.sync.name(), v.policy).into();
            verdicts.push(v);
        }
        let strictest = swin_core::Decision::strictest(&verdicts, |v| &v.decision)
            .cloned()
            .ok_or(Error::Internal)?;
        let mut policies: Vec<Arc<str>> = Vec::new();
        for ((ns, ..), v) in self.hits.iter().zip(&verdicts) {
            for p in v.policies.iter() {
                let p: Arc<str> =
                    format!("\"{}.{}", ns.sync.name(), p.trim_start_matches('"')).into();
                if !policies.contains(&p) {
                    policies.push(p);
                }
            }
        }
        Ok(Batch {
            verdicts,
            denied,
            strictest,
            policies,
        })
    }
}
