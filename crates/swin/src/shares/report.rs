//! What a proxy's stream carries: its reports (each bucket's usage since the last) and
//! what it is told for each bucket.

use std::time::Duration;

use super::{Action, BucketId};

/// One report of a proxy: its domain (a namespace) and each bucket's usage.
#[derive(Debug, Clone, Default)]
pub struct Reports {
    /// The namespace.
    pub(crate) domain: String,
    /// Each bucket's usage since the last report.
    pub(crate) usages: Vec<Usage>,
}

impl Reports {
    /// A report on the namespace `domain` of each bucket's usage.
    pub fn new(domain: String, usages: Vec<Usage>) -> Reports {
        Reports { domain, usages }
    }
}

/// One bucket's usage since the proxy's last report of it.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    /// The bucket (any order; sorted here).
    pub(crate) bucket: BucketId,
    /// The time the usage covers, as the proxy measured it (`None` or zero: unknown).
    pub(crate) elapsed: Option<Duration>,
    /// Requests the proxy let through.
    pub(crate) allowed: u64,
    /// Requests the proxy refused.
    pub(crate) denied: u64,
}

impl Usage {
    /// A bucket's usage: `allowed` and `denied` requests over `elapsed` (its report's
    /// own measure, if it sent one).
    pub fn new(bucket: BucketId, elapsed: Option<Duration>, allowed: u64, denied: u64) -> Usage {
        Usage {
            bucket,
            elapsed,
            allowed,
            denied,
        }
    }
}

/// What a proxy is told for one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketAction {
    /// The bucket.
    pub(crate) bucket: BucketId,
    /// What it enforces.
    pub(crate) action: Action,
}

impl BucketAction {
    /// The bucket.
    pub fn bucket(&self) -> &BucketId {
        &self.bucket
    }

    /// What it enforces.
    pub fn action(&self) -> Action {
        self.action
    }
}

impl BucketAction {
    /// `bucket` abandoned: its proxy falls back on its own default.
    pub(super) fn abandon(bucket: BucketId) -> BucketAction {
        BucketAction {
            bucket,
            action: Action::Abandon,
        }
    }
}
