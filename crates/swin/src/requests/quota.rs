//! A report of Envoy's quota service: a proxy's usage of its buckets since its last
//! report. Its buckets' keys are first-touched; its own part records each bucket's
//! demand, counts what the proxy allowed (as hits are counted: what it let through
//! happened, so a store that fails it is logged, not the report's failure) and answers
//! each bucket's assignment now.

use std::sync::{Arc, Mutex};

use crate::error::Error;
use crate::pipeline::{Plan, Ran, Request};
use crate::shares::{BucketAction, Reports, Stream};
use crate::state::Namespace;

/// One report of a proxy's stream.
#[derive(Debug)]
pub(crate) struct QuotaReport {
    stream: Stream,
    ns: Option<Arc<Namespace>>,
    keys: Vec<String>,
    reports: Mutex<Option<Reports>>,
}

impl QuotaReport {
    /// The report `reports` of `stream`: checked (an error ends the stream), bound to its
    /// namespace, its keys found.
    pub(crate) fn new(stream: Stream, reports: Reports) -> Result<QuotaReport, Error> {
        Stream::check(&reports)?;
        let (ns, keys) = stream.bound(&reports);
        Ok(QuotaReport {
            stream,
            ns,
            keys,
            reports: Mutex::new(Some(reports)),
        })
    }
}

impl Request for QuotaReport {
    type Answer = Vec<BucketAction>;
    type Acted = Vec<BucketAction>;

    fn waits_on_store(&self) -> bool {
        self.ns.as_ref().is_some_and(|ns| ns.counts_in_the_store())
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        Ok(match &self.ns {
            Some(ns) => Plan::touching(self.keys.iter().map(|k| (&**ns, k.as_str())).collect()),
            None => Plan::nothing(),
        })
    }

    async fn act(&self, _: &Plan<'_>) -> Result<Vec<BucketAction>, Error> {
        let reports = self
            .reports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or(Error::Internal)?;
        Ok(self.stream.answer(self.ns.as_ref(), reports).await)
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<Vec<BucketAction>>) -> Result<Vec<BucketAction>, Error> {
        ran.acted.ok_or(Error::Internal)
    }
}
