//! The library as a library: every kind of request a [`swin::Limiter`] answers, called
//! in process with no socket, each scenario run on a SQLite file and on Redis (a key
//! prefix of the test's own, deleted when the test ends). Counts are read back from the
//! store itself, or by a fresh limiter over the same store.
//!
//! By area: `hits` (one hit, dry runs, first touch, shadow), `batches` (all or nothing
//! across keys), `callers` (a caller that goes away after its ask reached the store),
//! `counting` (increments, reads, refunds), `leases`, `reservations`, `idempotency`, `runtime_limits`,
//! `descriptors` (Envoy's) and `lifecycle` (reconfiguring and stopping).

mod batches;
mod callers;
mod counting;
mod descriptors;
mod hits;
mod idempotency;
mod leases;
mod lifecycle;
mod reservations;
mod reservations_multi;
mod runtime_limits;
mod shares;

use std::ops::Deref;

use swin::config::Config;
use swin::Limiter;
use swin_testkit::TestStore;

/// A limiter, the store section it runs on and the directory its spool lives in
/// (removed with it).
#[derive(Debug)]
pub struct Running {
    limiter: Limiter,
    section: String,
    dir: tempfile::TempDir,
}

impl Running {
    /// Its config with `namespaces` instead (the same store and spool).
    pub fn config_with(&self, namespaces: &str) -> Config {
        config_on(&self.section, self.dir.path(), namespaces)
    }
}

impl Deref for Running {
    type Target = Limiter;

    fn deref(&self) -> &Limiter {
        &self.limiter
    }
}

/// A limiter of `namespaces` (TOML) on `store`, as a replica of a service would run it.
pub async fn start(store: &TestStore, namespaces: &str) -> Running {
    start_on(&store.section(), namespaces).await
}

/// A limiter of `namespaces` on the store `section` (`[stores.main]`).
pub async fn start_on(section: &str, namespaces: &str) -> Running {
    let dir = tempfile::tempdir().expect("temp dir");
    let limiter = Limiter::start(config_on(section, dir.path(), namespaces))
        .await
        .expect("start");
    Running {
        limiter,
        section: section.to_owned(),
        dir,
    }
}

/// The config of a limiter of `namespaces` on the store `section`, spooling in `dir`.
/// An answer or a read as it serializes (the daemon's JSON).
pub fn document(x: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(x).expect("a document")
}

/// A number an answer holds (as it serializes: the daemon's JSON), such as a commit's
/// settlement of a key or an acquire's slots in flight.
pub fn settled(s: &impl serde::Serialize, field: &str) -> f64 {
    let doc = serde_json::to_value(s).expect("a document");
    doc[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} in {doc}"))
}

/// The key a settlement is of.
pub fn settled_key(s: &impl serde::Serialize) -> String {
    let doc = serde_json::to_value(s).expect("a document");
    doc["key"].as_str().expect("a key").to_owned()
}

/// Whether a settlement repeats an earlier commit's (the field is left out when not).
pub fn replayed(s: &impl serde::Serialize) -> bool {
    serde_json::to_value(s).expect("a document")["replayed"] == true
}

pub fn config_on(section: &str, dir: &std::path::Path, namespaces: &str) -> Config {
    let text = format!(
        "data_dir = \"{}\"\nshutdown_grace = 3\n\n{section}\n{namespaces}",
        dir.join("spool").display()
    );
    Config::from_toml(&text).expect("config")
}

/// A namespace on the store `main` deciding against `limit` hits an hour, syncing every
/// `sync_rate` seconds (0: synchronous, every hit decided on the store's count).
pub fn hourly(name: &str, sync_rate: f64, limit: u32) -> String {
    format!(
        "[[namespaces]]\nname = \"{name}\"\nstore = \"main\"\nwindow_sizes = [3600]\n\
         sync_rate = {sync_rate}\nlimits = [{{ window_size = 3600, limit = {limit} }}]\n"
    )
}

/// What the store holds for `key` of `namespace`, summed over its windows, read as an
/// operator would (SQL on the table, HGETALL on the hashes).
pub async fn stored(store: &TestStore, namespace: &str, key: &str) -> f64 {
    store
        .totals(namespace)
        .await
        .get(key)
        .copied()
        .unwrap_or(0.0)
}

/// What `limiter` knows of `key` in the hour window: the current and previous counts.
pub async fn known(limiter: &Limiter, namespace: &str, key: &str) -> f64 {
    let rates = limiter
        .rates(namespace, key, Some(3600))
        .await
        .expect("rates");
    rates.iter().map(|r| r.current + r.previous).sum()
}
