//! What a request can ask of the pipeline, each taken and taken back the same way
//! whatever the request: a hit ([`Take`]), slots of leases ([`Acquiring`]) and an
//! increment of counts ([`Count`]).

use swin_core::{UnixMs, WindowRate};

use super::{Acquiring, Take};
use crate::decisions::{together, Verdict};
use crate::error::Error;
use crate::leases::AcquireAnswer;
use crate::state::Namespace;

/// One ask of a request.
#[derive(Debug)]
pub(crate) enum Asked<'r> {
    /// A hit decided against its key's limits.
    Hit(Take<'r>),
    /// Slots of a key taken under a lease.
    Slots(Acquiring<'r>),
    /// Counts added to a key, no limit asked.
    Count(Count<'r>),
}

/// What a request gives back before it takes anything.
#[derive(Debug)]
pub(crate) enum Back<'r> {
    /// Hits admitted and not used (a refund, Envoy's negative hits).
    Hits(Take<'r>),
    /// Slots of a key's leases taken by Envoy's door (its negative hits), the earliest
    /// to lapse first.
    Slots {
        /// The namespace (of leases).
        ns: &'r Namespace,
        /// The key.
        key: String,
        /// Slots to end.
        count: u32,
    },
}

/// What a give-back gave.
#[derive(Debug)]
pub(crate) enum Given {
    /// Hits given and the key after it, as a dry run sees it.
    Hits(f64, Verdict),
    /// Slots ended.
    Slots,
}

impl Back<'_> {
    /// Gives it back under the key's effective limits.
    pub(crate) async fn give(&self) -> Result<Given, Error> {
        match self {
            Back::Hits(t) => {
                let (given, after) = t.refund().await?;
                Ok(Given::Hits(given, after))
            }
            Back::Slots { ns, key, count } => {
                crate::pipeline::leases::release_for_envoy(ns, key, *count).await?;
                ns.recorder().lease(ns.sync.name(), "released");
                Ok(Given::Slots)
            }
        }
    }
}

/// What an ask took.
#[derive(Debug, Clone)]
pub(crate) enum Taken {
    /// A hit's verdict.
    Hit(Verdict),
    /// An acquire's answer.
    Slots(AcquireAnswer),
    /// The key's windows after an increment.
    Count(Vec<WindowRate>),
}

impl Taken {
    /// Whether it was admitted (then taken back when its request is refused).
    pub(crate) fn admitted(&self) -> bool {
        match self {
            Taken::Hit(v) => v.allowed(),
            Taken::Slots(a) => a.acquired.granted,
            Taken::Count(_) => true,
        }
    }

    /// Why a hit was decided without its store (its namespace's `on_store_failure`).
    pub(crate) fn degraded(&self) -> Option<&'static str> {
        match self {
            Taken::Hit(v) => v.reason,
            _ => None,
        }
    }

    /// An increment's windows.
    pub(crate) fn windows(self) -> Vec<WindowRate> {
        match self {
            Taken::Count(w) => w,
            _ => Vec::new(),
        }
    }
}

impl<'r> Asked<'r> {
    /// The key its first touch reads.
    pub(crate) fn touched(&self) -> Option<(&'r Namespace, &str)> {
        match self {
            Asked::Hit(t) => Some((t.ns, &t.key)),
            Asked::Count(c) => Some((c.ns, c.key)),
            Asked::Slots(_) => None,
        }
    }

    /// Its effective limits, and whether they could ever take it.
    pub(crate) fn resolve(&mut self) -> Result<(), Error> {
        match self {
            Asked::Hit(t) => t.resolve(),
            Asked::Slots(a) if !a.fits() => Err(Error::BadRequest(format!(
                "count: {} is more than the key's limit {}",
                a.count, a.limit
            ))),
            _ => Ok(()),
        }
    }

    /// Blocks it (its cost is more than its limits take at once): answers whether that
    /// refuses its request (not in shadow).
    pub(crate) fn block(&mut self) -> bool {
        match self {
            Asked::Hit(t) => {
                t.blocked = true;
                !t.shadow
            }
            Asked::Slots(a) => {
                a.blocked = true;
                !a.shadow
            }
            Asked::Count(_) => false,
        }
    }

    pub(crate) fn blocked(&self) -> bool {
        match self {
            Asked::Hit(t) => t.blocked,
            Asked::Slots(a) => a.blocked,
            Asked::Count(_) => false,
        }
    }

    /// Stage 5 for this ask alone, at `at` (a hit's time; see [`Plan::taken_at`]).
    ///
    /// [`Plan::taken_at`]: super::Plan::taken_at
    pub(crate) async fn take(&self, dry_run: bool, at: UnixMs) -> Result<Taken, Error> {
        Ok(match self {
            Asked::Hit(t) => Taken::Hit(t.take_at(dry_run, at).await?),
            Asked::Slots(a) => Taken::Slots(a.take().await?),
            Asked::Count(c) => Taken::Count(c.take().await?),
        })
    }

    /// Puts back exactly what it took, taken at `at`.
    pub(crate) async fn undo(&self, taken: &Taken, at: UnixMs) -> Result<(), Error> {
        match (self, taken) {
            (Asked::Hit(t), _) => t.undo(at).await,
            (Asked::Slots(a), Taken::Slots(taken)) => {
                a.undo(taken).await;
                Ok(())
            }
            (Asked::Count(c), _) => {
                c.undo(&c.sizes()).await;
                Ok(())
            }
            (Asked::Slots(_), _) => Ok(()),
        }
    }

    /// Records what it took (`refused`: its request was refused as a whole).
    pub(crate) fn record(&self, taken: &Taken, refused: bool) {
        match (self, taken) {
            (Asked::Hit(t), Taken::Hit(v)) => {
                let policy = t.policy.as_ref().unwrap_or(&v.policy);
                t.ns.recorder().decision(
                    t.ns.sync.name(),
                    policy,
                    v.allowed() && !refused,
                    v.shadow_denied && !refused,
                );
            }
            (Asked::Slots(a), Taken::Slots(taken)) => a.record(taken),
            (Asked::Count(c), _) => c.ns.recorder().increments(c.ns.sync.name(), 1),
            _ => {}
        }
    }
}

/// An increment of a key in one window size, or in every size of its namespace; all or
/// nothing within the key too (a window that refuses it gives back the others).
#[derive(Debug)]
pub(crate) struct Count<'r> {
    pub(crate) ns: &'r Namespace,
    pub(crate) key: &'r str,
    pub(crate) value: f64,
    pub(crate) window_size: Option<u32>,
    pub(crate) now: UnixMs,
}

impl Count<'_> {
    /// Counts it: the key's windows after it.
    pub(crate) async fn take(&self) -> Result<Vec<WindowRate>, Error> {
        let (ns, key, value, now) = (self.ns, self.key, self.value, self.now);
        if let Some(s) = self.window_size {
            // one window: nothing before it to give back (and no list of sizes to build)
            return Ok(vec![ns.sync.increment(key, s, value, now).await?]);
        }
        let sizes = self.sizes();
        // every window at once: synchronous increments of one key share a round trip
        let counted = together(
            ns.counts_in_the_store(),
            sizes.iter().map(|&s| ns.sync.increment(key, s, value, now)),
        )
        .await;
        if counted.iter().any(Result::is_err) {
            let done: Vec<u32> = sizes
                .iter()
                .zip(&counted)
                .filter(|(_, r)| r.is_ok())
                .map(|(&s, _)| s)
                .collect();
            self.undo(&done).await;
        }
        Ok(counted.into_iter().collect::<Result<_, _>>()?)
    }

    /// The window sizes it counts in.
    fn sizes(&self) -> Vec<u32> {
        match self.window_size {
            Some(s) => vec![s],
            None => self
                .ns
                .sync
                .counters()
                .window_sizes()
                .map(|s| s.secs())
                .collect(),
        }
    }

    /// Takes its value back out of the windows of `sizes`.
    async fn undo(&self, sizes: &[u32]) {
        let (ns, key) = (self.ns, self.key);
        for &s in sizes {
            if let Err(e) = ns.sync.undo_increment(key, s, self.value, self.now).await {
                // the key holds the value just counted, so its entry cannot be refused
                tracing::error!(namespace = ns.sync.name(), key, cause = %e, "could not give back an increment");
            }
        }
    }
}
