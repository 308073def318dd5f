//! Requests of hits: one hit decided alone ([`take`]), and several decided as one (HTTP
//! batches): all checked before any is spent, decided together — their synchronous
//! increments share round trips — and all or nothing.

use std::sync::Arc;

use crate::decisions::{first_failure, Verdict};
use crate::error::Error;
use crate::pipeline::{take_all, touch_takes, undo_admitted, Ask, Take};
use crate::state::Namespace;

/// Decides a hit of `cost` on `key` and, unless `dry_run`, spends it when allowed (and
/// when denied too if the namespace counts denied hits): the request pipeline
/// ([`crate::pipeline`]) with one take, recorded.
pub async fn take(
    ns: &Namespace,
    namespace: &str,
    key: &str,
    cost: f64,
    dry_run: bool,
) -> Result<Verdict, Error> {
    let mut t = Take::of_key(ns, namespace, key, cost)?;
    ns.first_touch(&[key], !dry_run).await;
    t.resolve()?;
    let v = t.take(dry_run).await?;
    ns.recorder()
        .decision(namespace, &v.policy, v.allowed(), v.shadow_denied);
    Ok(v)
}

/// One hit of a batch.
#[derive(Debug)]
pub struct Hit<'a> {
    /// Its namespace.
    pub ns: Arc<Namespace>,
    /// Its namespace's name (for errors and policy names).
    pub namespace: &'a str,
    /// The key.
    pub key: &'a str,
    /// What it costs (1 for one request).
    pub cost: f64,
}

/// What a batch decided: each hit's verdict, in order, and whether any was denied (then
/// nothing of the batch was spent).
#[derive(Debug)]
pub struct BatchVerdict {
    /// Each hit's verdict, in the batch's order.
    pub verdicts: Vec<Verdict>,
    /// Whether any hit was denied (then none was spent).
    pub denied: bool,
}

/// Decides every hit of a batch (Boulder's BatchSpend) through the request pipeline
/// ([`crate::pipeline`]). Every hit is checked before any is spent, so a bad one leaves
/// the batch untouched; when one is denied, or fails while spending (a full table),
/// what the others took is given back. Errors come with the failing hit's index.
pub async fn decide_all(hits: &[Hit<'_>], dry_run: bool) -> Result<BatchVerdict, (usize, Error)> {
    let mut takes = Vec::with_capacity(hits.len());
    for (i, h) in hits.iter().enumerate() {
        takes.push(Take::of_key(&h.ns, h.namespace, h.key, h.cost).map_err(|e| (i, e))?);
    }
    // every key this node holds nothing for, read in one call per namespace
    touch_takes(&takes, !dry_run).await;
    // every hit checked against its key's limits (runtime ones read by the touch)
    // before any is spent
    for (i, t) in takes.iter_mut().enumerate() {
        t.resolve().map_err(|e| (i, e))?;
    }
    let (verdicts, failed) = first_failure(take_all(&takes, dry_run).await);
    let denied = verdicts.iter().flatten().any(|v| !v.allowed());
    if failed.is_some() || denied {
        let at = failed.as_ref().map_or(0, |(i, _)| *i);
        undo_admitted(
            takes.iter().zip(verdicts.iter().map(Option::as_ref)),
            dry_run,
        )
        .await
        .map_err(|e| (at, e))?;
    }
    if let Some(f) = failed {
        return Err(f);
    }
    // nothing of a denied batch was spent: an allowed hit answers what remained before it
    let verdicts = verdicts
        .into_iter()
        .flatten()
        .zip(hits)
        .map(|(v, h)| match denied && v.allowed() {
            true => v.given_back(h.cost),
            false => v,
        })
        .collect();
    Ok(BatchVerdict { verdicts, denied })
}

/// One hit of a batch, as a door read it.
#[derive(Debug, Clone, Copy)]
pub struct AskedHit<'a> {
    /// The namespace named.
    pub namespace: &'a str,
    /// The key.
    pub key: &'a str,
    /// What it costs.
    pub cost: f64,
}

/// What a batch over several namespaces decided, with the batch's RateLimit values:
/// each hit's verdict (its policies named `<namespace>.<policy>`), whether any was
/// denied (then nothing was spent), the strictest, and every policy once.
#[derive(Debug)]
pub struct Batch {
    /// Each hit's verdict, in order, its policies named `<namespace>.<policy>`.
    pub verdicts: Vec<Verdict>,
    /// Whether any hit was denied (then none was spent).
    pub denied: bool,
    /// The verdict a client's RateLimit headers show: the one with the least left.
    pub strictest: Verdict,
    /// Every policy of the batch, once.
    pub policies: Vec<Arc<str>>,
}

impl Batch {
    /// A hit let through by a limit in shadow, when the batch was spent and its
    /// strictest hit was not one (the answer says so too).
    pub fn shadowed(&self) -> Option<&Verdict> {
        match self.denied || self.strictest.shadow_denied {
            true => None,
            false => self.verdicts.iter().find(|v| v.shadow_denied),
        }
    }
}

/// Decides a batch of 1 to `max` hits over `namespaces` as one request (see
/// [`decide_all`]); an error names the hit (`hits[i]: …`).
pub async fn decide_batch(
    namespaces: &crate::state::Namespaces,
    asked: &[AskedHit<'_>],
    dry_run: bool,
    max: usize,
) -> Result<Batch, Error> {
    if asked.is_empty() || asked.len() > max {
        return Err(Error::BadRequest(format!(
            "hits must hold 1 to {max} hits (max_batch), got {}",
            asked.len()
        )));
    }
    let mut hits = Vec::with_capacity(asked.len());
    for a in asked {
        hits.push(Hit {
            ns: crate::state::namespace_in(namespaces, a.namespace)?,
            namespace: a.namespace,
            key: a.key,
            cost: a.cost,
        });
    }
    let decided = decide_all(&hits, dry_run)
        .await
        .map_err(|(i, e)| e.at(&format!("hits[{i}]")))?;
    for (h, v) in hits.iter().zip(&decided.verdicts) {
        // as a whole: allowed when the batch was
        let (allowed, shadow_denied) = (!decided.denied, !decided.denied && v.shadow_denied);
        h.ns.recorder()
            .decision(h.namespace, &v.policy, allowed, shadow_denied);
    }
    let verdicts: Vec<Verdict> = asked
        .iter()
        .zip(decided.verdicts)
        .map(|(a, mut v)| {
            v.policy = format!("{}.{}", a.namespace, v.policy).into();
            v
        })
        .collect();
    let strictest = swin_core::Decision::strictest(&verdicts, |v| &v.decision)
        .cloned()
        .ok_or(Error::Internal)?;
    let mut policies: Vec<Arc<str>> = Vec::new();
    for (a, v) in asked.iter().zip(&verdicts) {
        for p in v.policies.iter() {
            let p: Arc<str> = format!("\"{}.{}", a.namespace, p.trim_start_matches('"')).into();
            if !policies.contains(&p) {
                policies.push(p);
            }
        }
    }
    Ok(Batch {
        verdicts,
        denied: decided.denied,
        strictest,
        policies,
    })
}
