//! Counting: increments of a key in one window size or in every size of its namespace
//! ([`Increment`]), batches of them ([`IncrementBatch`]), each all or nothing, and a
//! key's rates read ([`ReadKey`]).

use std::sync::Arc;

use swin_core::{UnixMs, WindowRate};

use crate::error::Error;
use crate::pipeline::{Asked, Count, Plan, Ran, Request, Taken};
use crate::policy::input::{check_batch_size, check_increment, check_key};
use crate::state::Namespace;

/// Counts `value` (1 when none) on `key`, in one window size or every size.
#[derive(Debug)]
pub(crate) struct Increment {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) key: String,
    pub(crate) value: Option<f64>,
    pub(crate) window_size: Option<u32>,
}

impl Increment {
    fn count(&self, now: UnixMs) -> Result<Count<'_>, Error> {
        check_key(&self.key)?;
        let ns = &*self.ns;
        let value = check_increment(self.value, ns.allow_decrements, ns.sync.name())?;
        if ns.sync.counters().window_sizes().next().is_none() {
            let kind = match ns.concurrency {
                Some(_) => "requests in flight (algorithm concurrency)",
                None => "GCRA buckets (algorithm gcra)",
            };
            return Err(Error::BadRequest(format!(
                "namespace {:?} limits {kind} and has no windows: an increment counts in windows",
                ns.sync.name()
            )));
        }
        if let Some(s) = self.window_size {
            ns.sync.counters().table(s)?;
        }
        Ok(Count {
            ns,
            key: &self.key,
            value,
            window_size: self.window_size,
            now,
        })
    }
}

impl Request for Increment {
    type Answer = Vec<WindowRate>;
    type Acted = ();

    fn waits_on_store(&self) -> bool {
        self.ns.counts_in_the_store()
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        Ok(Plan::of(vec![Asked::Count(self.count(swin_sync::now())?)]))
    }

    fn acts(&self) -> bool {
        false
    }

    async fn act(&self, _: &Plan<'_>) -> Result<(), Error> {
        Ok(())
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<()>) -> Result<Vec<WindowRate>, Error> {
        let first = ran.taken.into_iter().next().flatten();
        first.map(Taken::windows).ok_or(Error::Internal)
    }
}

/// 1 to `max` increments over several namespaces, all or nothing: every item is
/// checked before anything is counted (an error names the item: `increments[i]: …`),
/// and when one fails, what the others counted is given back (a client that retries
/// the batch counts it once).
#[derive(Debug)]
pub(crate) struct IncrementBatch {
    pub(crate) items: Vec<Increment>,
}

impl IncrementBatch {
    /// The batch of `asked` (namespace, key, value, window size) over the namespaces
    /// `served`, of 1 to `max` items.
    pub(crate) fn new(
        served: &crate::state::Namespaces,
        asked: &[(&str, &str, Option<f64>, Option<u32>)],
        max: usize,
    ) -> Result<IncrementBatch, Error> {
        check_batch_size("increments", asked.len(), max)?;
        // namespaces resolved once per distinct name, not once per item
        let mut used: Vec<Arc<Namespace>> = Vec::new();
        let mut items = Vec::with_capacity(asked.len());
        for (i, &(namespace, key, value, window_size)) in asked.iter().enumerate() {
            let ns = match used.iter().find(|n| n.sync.name() == namespace) {
                Some(ns) => ns.clone(),
                None => {
                    let ns = crate::state::namespace_in(served, namespace)
                        .map_err(|e| e.at(&format!("increments[{i}]")))?;
                    used.push(ns.clone());
                    ns
                }
            };
            items.push(Increment {
                ns,
                key: key.to_owned(),
                value,
                window_size,
            });
        }
        Ok(IncrementBatch { items })
    }
}

impl Request for IncrementBatch {
    type Answer = Vec<Vec<WindowRate>>;
    type Acted = ();

    fn waits_on_store(&self) -> bool {
        self.items.iter().any(|i| i.ns.counts_in_the_store())
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        let now = swin_sync::now();
        let mut asks = Vec::with_capacity(self.items.len());
        for (i, item) in self.items.iter().enumerate() {
            let c = item
                .count(now)
                .map_err(|e| e.at(&format!("increments[{i}]")))?;
            asks.push(Asked::Count(c));
        }
        Ok(Plan {
            label: Some("increments"),
            ..Plan::of(asks)
        })
    }

    async fn act(&self, _: &Plan<'_>) -> Result<(), Error> {
        Ok(())
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<()>) -> Result<Vec<Vec<WindowRate>>, Error> {
        ran.taken
            .into_iter()
            .map(|t| t.map(Taken::windows).ok_or(Error::Internal))
            .collect()
    }
}

/// A key's rates in one window size, or in every size of its namespace, as this node
/// knows them (its first touch reads what it does not hold yet).
#[derive(Debug)]
pub(crate) struct ReadKey {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) key: String,
    pub(crate) window_size: Option<u32>,
}

impl Request for ReadKey {
    type Answer = Vec<WindowRate>;
    type Acted = Vec<WindowRate>;

    fn waits_on_store(&self) -> bool {
        false
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        check_key(&self.key)?;
        if let Some(s) = self.window_size {
            self.ns.sync.counters().table(s)?;
        }
        Ok(Plan {
            dry_run: true,
            ..Plan::touching(vec![(&*self.ns, self.key.as_str())])
        })
    }

    async fn act(&self, _: &Plan<'_>) -> Result<Vec<WindowRate>, Error> {
        let now = swin_sync::now();
        let counters = self.ns.sync.counters();
        Ok(match self.window_size {
            Some(s) => vec![counters.table(s)?.rate_tracked(&self.key, now)],
            None => counters
                .tables()
                .iter()
                .map(|t| t.rate_tracked(&self.key, now))
                .collect(),
        })
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<Vec<WindowRate>>) -> Result<Vec<WindowRate>, Error> {
        ran.acted.ok_or(Error::Internal)
    }
}
