//! What stopped engines (or an earlier run, through the spool) left unconfirmed: tried
//! once more at start, retried every second, spooled at shutdown.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use swin_sync::{Store, Unconfirmed};
use tracing::{debug, error, info, warn};

use super::Control;
use crate::spool;

/// Chunks a stopped engine (or an earlier run, through the spool) left unconfirmed, and
/// the store they go to.
#[derive(Debug)]
pub(super) struct Leftover {
    pub(super) store_name: String,
    pub(super) fingerprint: String,
    pub(super) store: Store,
    pub(super) unconfirmed: Unconfirmed,
    /// The spool file it was read from; deleted once nothing of that file is left.
    pub(super) file: Option<PathBuf>,
}

pub(super) type Leftovers = Arc<tokio::sync::Mutex<Vec<Leftover>>>;

/// Spool files this run read and has not finished with.
pub(super) type SpoolFiles = Arc<std::sync::Mutex<BTreeSet<PathBuf>>>;

impl Control {
    /// Reads the spool files of `data_dir` into the leftovers, each entry for the store
    /// of this config with the same fingerprint; a file with an entry for no such store
    /// stays on disk untouched.
    pub(super) fn load_spool(&mut self) {
        let mut leftovers = self
            .leftovers
            .try_lock()
            .expect("nothing else holds the leftovers before the node serves");
        for (path, read) in spool::read_all(&self.config.data_dir) {
            let entries = match read {
                Ok(e) => e,
                Err(why) => {
                    error!(file = %path.display(), cause = why, "cannot read a spool file; left as it is");
                    continue;
                }
            };
            let stores: Option<Vec<(String, Store)>> = entries
                .iter()
                .map(|e| {
                    self.stores
                        .iter()
                        .find(|(_, c)| c.config.fingerprint() == e.store_fingerprint)
                        .map(|(n, c)| (n.clone(), c.store.clone()))
                })
                .collect();
            let Some(stores) = stores else {
                warn!(file = %path.display(), "spool file for a store this config does not have; left as it is");
                continue;
            };
            let refused = entries
                .iter()
                .zip(&stores)
                .find_map(|(e, (store_name, _))| {
                    let namespaces: Vec<&str> = self
                        .config
                        .namespaces
                        .iter()
                        .filter(|n| n.store.as_deref() == Some(store_name.as_str()))
                        .map(|n| n.name.as_str())
                        .collect();
                    spool::check(e, &namespaces).err()
                });
            if let Some(why) = refused {
                error!(file = %path.display(), cause = why, "spool file not replayed: it holds what no request could count; left as it is");
                continue;
            }
            let rows: usize = entries.iter().map(|e| e.unconfirmed.rows()).sum();
            info!(file = %path.display(), windows = rows, "replaying spooled pushes");
            for (e, (store_name, store)) in entries.into_iter().zip(stores) {
                let owed = e.owed();
                if !owed.is_empty() {
                    info!(file = %path.display(), changes = owed.len(), "resolving what an earlier run owed the store (commits, extends, undos, settlements, give-backs)");
                }
                self.owed.extend(owed);
                leftovers.push(Leftover {
                    store_name,
                    fingerprint: e.store_fingerprint,
                    store,
                    unconfirmed: e.unconfirmed,
                    file: Some(path.clone()),
                });
            }
            self.spool_files
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(path);
        }
    }

    /// Resolves what an earlier run spooled that its node owed the store, each in a
    /// task of its own in its namespace (held as owed there: a stop before it is
    /// resolved spools it again).
    pub(super) fn resume_owed(&mut self) {
        use crate::requests::reservations as r;
        use crate::unresolved::Owed;
        for owed in std::mem::take(&mut self.owed) {
            let namespace = match &owed {
                Owed::Commit(c) => &c.namespace,
                Owed::Extend(x) => &x.namespace,
                Owed::Undo(u) => &u.namespace,
                Owed::Settle(s) => &s.namespace,
                Owed::GiveBack(g) => &g.namespace,
                Owed::Other(_) => continue,
            };
            let Some(running) = self.running.get(namespace) else {
                error!(namespace, "{owed}: spooled by an earlier run, its namespace is not served now: not resolved");
                continue;
            };
            let ns = running.namespace.clone();
            let owing = ns.unresolved.hold(owed.clone());
            match owed {
                Owed::Commit(c) => self.tracker.spawn(async move {
                    r::resume(ns, c, &owing).await;
                    drop(owing);
                }),
                Owed::Extend(x) => self.tracker.spawn(r::resume_extend(ns, x, owing)),
                Owed::Undo(u) => self.tracker.spawn(r::undo(ns, u, owing)),
                Owed::Settle(s) => self.tracker.spawn(r::resume_settle(ns, s, owing)),
                Owed::GiveBack(g) => self.tracker.spawn(r::resume_give_back(ns, g, owing)),
                Owed::Other(_) => continue,
            };
        }
    }

    /// One attempt at every leftover, each in push order.
    pub(super) async fn retry_leftovers(&self) {
        push_leftovers(
            &self.leftovers,
            &self.spool_files,
            self.config.store_timeout,
        )
        .await;
    }

    pub(super) fn spawn_leftover_retries(&self) {
        let (leftovers, files, timeout, cancel) = (
            self.leftovers.clone(),
            self.spool_files.clone(),
            self.config.store_timeout,
            self.retries.clone(),
        );
        self.tracker.spawn(async move {
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
                // cut short when the node stops (a push cut short keeps its chunk)
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = push_leftovers(&leftovers, &files, timeout) => {}
                }
            }
        });
    }
}

/// One attempt at every leftover, each in push order; the ones done are dropped, and a
/// spool file nothing is left of is deleted.
pub(super) async fn push_leftovers(
    leftovers: &Leftovers,
    files: &SpoolFiles,
    timeout: std::time::Duration,
) {
    let mut list = leftovers.lock().await;
    if list.is_empty() {
        return;
    }
    for l in list.iter_mut() {
        match l.unconfirmed.push(&l.store, timeout).await {
            Ok(0) => {}
            Ok(n) => info!(
                namespace = l.unconfirmed.namespace,
                store = l.store_name,
                chunks = n,
                "unconfirmed pushes confirmed"
            ),
            Err(e) => {
                debug!(namespace = l.unconfirmed.namespace, cause = %e, "unconfirmed pushes wait for the store")
            }
        }
    }
    list.retain(|l| !l.unconfirmed.is_empty());
    let mut files = files.lock().unwrap_or_else(|p| p.into_inner());
    let still: BTreeSet<&PathBuf> = list.iter().filter_map(|l| l.file.as_ref()).collect();
    let done: Vec<PathBuf> = files
        .iter()
        .filter(|f| !still.contains(f))
        .cloned()
        .collect();
    for f in done {
        match std::fs::remove_file(&f) {
            Ok(()) => info!(file = %f.display(), "spool file replayed and removed"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(file = %f.display(), cause = %e, "cannot remove a replayed spool file"),
        }
        files.remove(&f);
    }
}
