//! What the proxies of Envoy's rate limit quota service ask for, shared through the
//! store so that every node divides a bucket's limit among every proxy of the cluster,
//! not only its own. Each node posts, per bucket, the demands of the proxies it serves
//! (one entry per node and bucket, replacing its last), each entry lapsing at a time of
//! the store's clock; each node reads every live entry of the buckets it serves.
//!
//! Layout: PostgreSQL and SQLite, the table `swin_demands` (namespace, bucket, node →
//! demands, expires_at). Redis: per bucket a hash, node → `<expires_at>|<demands>`,
//! `swin:{<len(namespace)>:<namespace>:<bucket>}:demands` (see `redis/demands.rs`).

use swin_core::UnixMs;

/// One node's entry for one bucket: its proxies' demands (requests per the bucket's
/// unit), live until `expires_at` (the store's time).
#[derive(Debug, Clone, PartialEq)]
pub struct Demands {
    pub bucket: String,
    pub node: String,
    pub demands: Vec<f64>,
    pub expires_at: UnixMs,
}

impl Demands {
    /// The demands as the store keeps them: comma-separated, signs kept (the quota
    /// service marks claims, proxies gone and clients with numbers below zero).
    pub fn text(&self) -> String {
        let mut out = String::with_capacity(self.demands.len() * 8);
        for (i, d) in self.demands.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let d = if d.is_finite() { *d } else { 0.0 };
            out.push_str(&d.to_string());
        }
        out
    }

    /// Demands read back from their text; `None` when it is not a list of numbers.
    pub fn parse(text: &str) -> Option<Vec<f64>> {
        if text.is_empty() {
            return Some(Vec::new());
        }
        text.split(',').map(|d| d.parse::<f64>().ok()).collect()
    }
}

store_calls! {
    /// The demand-sharing side of a store. Every store implements it beside
    /// [`super::CounterStore`].
    pub trait DemandStore {
        /// Posts `node`'s entries (each replacing the node's last for its bucket).
        fn post_demands(&self, namespace: &str, entries: &[Demands]) -> () where entries is empty;

        /// Every node's entries for `buckets` that are live at `now` (the store's time).
        fn read_demands(&self, namespace: &str, buckets: &[&str], now: UnixMs) -> Vec<Demands>
            where buckets is empty;
    }
}

/// Entries from rows of (bucket, node, demands, expires_at); a row whose demands do not
/// read back is left out (and logged).
pub(crate) fn from_rows(rows: Vec<(String, String, String, i64)>) -> Vec<Demands> {
    rows.into_iter()
        .filter_map(
            |(bucket, node, text, expires_at)| match Demands::parse(&text) {
                Some(demands) => Some(Demands {
                    bucket,
                    node,
                    demands,
                    expires_at: UnixMs(expires_at),
                }),
                None => {
                    tracing::warn!(bucket, node, "demands that do not read back: left out");
                    None
                }
            },
        )
        .collect()
}
