//! The namespaces a node serves and what every request shares: swapped whole on a
//! reload, read by requests without a lock.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use swin_sync::NamespaceSync;

use crate::error::Error;
use crate::metrics::Metrics;

/// A namespace as the API serves it.
#[derive(Debug)]
pub struct Namespace {
    pub sync: Arc<NamespaceSync>,
    pub store_name: Option<String>,
    pub limits: Option<crate::limits::Limits>,
    /// Whether `/increment` takes negative values (`allow_decrements`); without it a
    /// client could lift its own limit.
    pub allow_decrements: bool,
}

pub type Namespaces = BTreeMap<String, Arc<Namespace>>;

#[derive(Debug)]
pub struct AppState {
    /// Swapped whole on reload; requests read it without a lock.
    pub namespaces: ArcSwap<Namespaces>,
    pub metrics: Metrics,
    pub body_limit: usize,
}

impl AppState {
    pub fn new(namespaces: Namespaces, body_limit: usize) -> Self {
        AppState {
            namespaces: ArcSwap::from_pointee(namespaces),
            metrics: Metrics::default(),
            body_limit,
        }
    }

    pub(crate) fn namespace(&self, name: &str) -> Result<Arc<Namespace>, Error> {
        self.namespaces
            .load()
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownNamespace(name.to_owned()))
    }
}
