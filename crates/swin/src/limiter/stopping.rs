//! Stopping: a namespace no longer served hands what it counted to its last push (or to
//! the leftovers), and a node that stops does so for every namespace at once, within
//! `shutdown_grace`, spooling what the stores did not confirm.

use std::sync::Arc;

use tracing::{error, info, warn};

use super::leftovers::{Leftover, Leftovers};
use super::{Control, Failure, LimiterError, Running};
use crate::spool::{self, SpoolEntry};
use crate::state::Namespaces;

impl Control {
    /// Stops every engine at once (each pushes until a common deadline), tries what is
    /// left until then, and spools whatever the store still did not confirm — all within
    /// `shutdown_grace`, the last part of it kept for the spool. An error when a count
    /// could be neither confirmed nor spooled (the process then exits non-zero).
    pub(super) async fn stop(mut self) -> Result<(), LimiterError> {
        let grace = self.config.shutdown_grace;
        let started = tokio::time::Instant::now();
        // time kept for taking what is unconfirmed and writing the spool
        let reserve = (grace / 5).min(std::time::Duration::from_secs(2));
        let deadline = started + grace.saturating_sub(reserve);
        let hard_end = started + grace;
        let (unfinished, commits, owed) = self.retire_all(deadline, hard_end).await;
        let owed = owed + self.spool_orphans();
        self.shutdown.cancel();
        self.tracker.close();
        if tokio::time::timeout_at(hard_end, self.tracker.wait())
            .await
            .is_err()
        {
            warn!(
                ?grace,
                "background tasks did not finish within the grace period"
            );
        }
        // one more try at what is left, cut short at the deadline (a push cut short
        // keeps its chunk, to be spooled)
        let _ = tokio::time::timeout_at(deadline, self.retry_leftovers()).await;
        let leftovers = std::mem::take(&mut *self.leftovers.lock().await);
        let entries: Vec<SpoolEntry> = leftovers
            .into_iter()
            .filter(|l| l.file.is_none() && !l.unconfirmed.is_empty())
            .map(|l| SpoolEntry {
                store: l.store_name,
                store_fingerprint: l.fingerprint,
                unconfirmed: l.unconfirmed,
                commits: Vec::new(),
                extends: Vec::new(),
                undos: Vec::new(),
                settles: Vec::new(),
                give_backs: Vec::new(),
            })
            .chain(commits)
            .collect();
        if unfinished > 0 {
            // their engines still hold what they counted: neither pushed nor spooled
            let spooled = if entries.is_empty() {
                None
            } else {
                match spool::write(&self.config.data_dir, &entries) {
                    Ok(path) => Some(path),
                    Err(e) => {
                        error!(dir = %self.config.data_dir.display(), cause = %e, "cannot write the spool: these hits are lost");
                        None
                    }
                }
            };
            return Err(Failure::Unfinished {
                namespaces: unfinished,
                grace,
                spooled,
            }
            .into());
        }
        self.spool(&entries)?;
        if owed > 0 {
            // logged with each one's name by its namespace's retirement
            return Err(Failure::Owed { changes: owed }.into());
        }
        Ok(())
    }

    /// Stops every namespace's engine at once, each pushing until `deadline`; the
    /// namespaces not stopped by `hard_end` (their counts neither pushed nor spooled).
    async fn retire_all(
        &mut self,
        deadline: tokio::time::Instant,
        hard_end: tokio::time::Instant,
    ) -> (usize, Vec<SpoolEntry>, usize) {
        // background retries stop at once (they would hold the leftovers while a store
        // call hangs); what they hold is tried after
        self.retries.cancel();
        let running = std::mem::take(&mut self.running);
        self.serving.store(Arc::new(Namespaces::new()));
        let mut retiring = tokio::task::JoinSet::new();
        let mut owing = Vec::new();
        for (_, r) in running {
            r.namespace.sync.stop_by(deadline);
            let (tx, rx) = tokio::sync::oneshot::channel();
            owing.push(rx);
            retiring.spawn(retire(r, deadline, self.leftovers.clone(), Some(tx)));
        }
        let (mut commits, mut owed) = (Vec::new(), 0);
        for rx in owing {
            if let Ok(Ok((entry, others))) = tokio::time::timeout_at(hard_end, rx).await {
                commits.extend(entry);
                owed += others;
            }
        }
        let all_retired = async { while retiring.join_next().await.is_some() {} };
        if tokio::time::timeout_at(hard_end, all_retired).await.is_ok() {
            return (0, commits, owed);
        }
        error!(
            grace = ?self.config.shutdown_grace,
            namespaces = retiring.len(),
            "sync engines did not stop within the grace period"
        );
        (retiring.len(), commits, owed)
    }

    /// Spools what namespaces a reload retired still owe, a file each: the next start
    /// replays one once its config keeps the namespace on that store, and a namespace
    /// removed (or moved to another store) leaves its file as it is without holding up
    /// the others'. How many changes are neither resolved nor spooled.
    fn spool_orphans(&mut self) -> usize {
        let mut lost = 0;
        for orphan in std::mem::take(&mut self.orphans) {
            let (entry, others) = orphan.owing();
            lost += others;
            let Some(entry) = entry else { continue };
            match spool::write(&self.config.data_dir, std::slice::from_ref(&entry)) {
                Ok(path) => {
                    warn!(file = %path.display(), namespace = orphan.config.name, "what a namespace a reload retired owed its store is spooled for the next start");
                }
                Err(e) => {
                    error!(dir = %self.config.data_dir.display(), namespace = orphan.config.name, cause = %e, "cannot write the spool: what the namespace owed its store is lost");
                    lost += entry.owed().len();
                }
            }
        }
        lost
    }

    /// Writes what the stores did not confirm to the spool, for the next start.
    fn spool(&self, entries: &[SpoolEntry]) -> Result<(), LimiterError> {
        if entries.is_empty() {
            info!("stopped");
            return Ok(());
        }
        let windows: usize = entries.iter().map(|e| e.unconfirmed.rows()).sum();
        let hits: f64 = entries.iter().map(|e| e.unconfirmed.hits()).sum();
        match spool::write(&self.config.data_dir, entries) {
            Ok(path) => {
                warn!(file = %path.display(), windows, hits, "the store did not confirm the last pushes; spooled for the next start");
                info!("stopped");
                Ok(())
            }
            Err(e) => {
                error!(dir = %self.config.data_dir.display(), cause = %e, windows, hits, "cannot write the spool: these hits are lost");
                Err(Failure::Spool {
                    windows,
                    hits,
                    dir: self.config.data_dir.clone(),
                    source: e,
                }
                .into())
            }
        }
    }
}

/// Stops a namespace no longer served: waits (until `deadline`) for the requests still
/// holding it, so that every hit that reached its tables is in what its engine pushes
/// last, then stops the engine and keeps what the store did not confirm as a leftover.
/// At a stop (`owed` given), sends what the node still owed the store for the namespace
/// at `deadline` (changes whose outcome it was resolving: see `crate::unresolved`) as
/// soon as its requests are done, before its engine stops; a reload (`None`) leaves
/// them to the namespace's next version on the same store, which shares them, or else
/// to the stop (`Control::orphans`).
pub(super) async fn retire(
    mut old: Running,
    deadline: tokio::time::Instant,
    leftovers: Leftovers,
    owed: Option<tokio::sync::oneshot::Sender<Owing>>,
) {
    while Arc::strong_count(&old.namespace) > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // told before the engine stops: what is owed is spooled even if it hangs
    if let Some(tx) = owed {
        let _ = tx.send(owed_of(&old));
    }
    old.cancel.cancel();
    if let Some(engine) = old.engine.take() {
        let _ = engine.await;
    }
    let sync = &old.namespace.sync;
    let unconfirmed = sync.take_unconfirmed(swin_sync::now()).await;
    if unconfirmed.is_empty() {
        return;
    }
    let (Some(store), Some(store_name), Some(cfg)) =
        (sync.store(), &old.config.store, &old.store_config)
    else {
        return;
    };
    warn!(
        namespace = old.config.name,
        windows = unconfirmed.rows(),
        "unconfirmed pushes kept; retried until the store takes them"
    );
    leftovers.lock().await.push(Leftover {
        store_name: store_name.clone(),
        fingerprint: cfg.fingerprint(),
        store: store.clone(),
        unconfirmed,
        file: None,
    });
}

/// What a namespace's node still owes at a stop: a spool entry for its store, and how
/// many other changes (named, not spooled).
type Owing = (Option<SpoolEntry>, usize);

/// A namespace a reload retired, with what it owed its store then (see
/// `Control::orphans`).
#[derive(Debug)]
pub(super) struct Orphan {
    config: crate::config::NamespaceConfig,
    store_config: Option<crate::config::StoreConfig>,
    unresolved: Arc<crate::unresolved::Unresolved>,
}

impl Orphan {
    /// `old`, retired by a reload, whose unresolved changes no namespace served now
    /// shares.
    pub(super) fn of(old: &Running) -> Orphan {
        Orphan {
            config: old.config.clone(),
            store_config: old.store_config.clone(),
            unresolved: old.namespace.unresolved.clone(),
        }
    }

    /// Whether it owes nothing and never will: nothing but this holds its book — no
    /// request still under way on the retired namespace, no task resolving an entry
    /// (each holds the book while its entry is owed, and a task moving on to its next
    /// step adds that step before it lets go of the last).
    pub(super) fn settled(&self) -> bool {
        Arc::strong_count(&self.unresolved) == 1
    }

    /// What it still owes at a stop, as [`owed_of`] tells a running namespace's.
    pub(super) fn owing(&self) -> Owing {
        owing(&self.config, self.store_config.as_ref(), &self.unresolved)
    }
}

/// What `old`'s node still owes: what a spool keeps (commits, extends, undos,
/// settlements, give-backs: resolved by the next start) as a spool entry for its store,
/// and how many other changes (steps under way, named here as errors).
fn owed_of(old: &Running) -> Owing {
    owing(
        &old.config,
        old.store_config.as_ref(),
        &old.namespace.unresolved,
    )
}

/// What the namespace of `config` on `store_config` owes, of `unresolved` (see
/// [`owed_of`]).
fn owing(
    config: &crate::config::NamespaceConfig,
    store_config: Option<&crate::config::StoreConfig>,
    unresolved: &crate::unresolved::Unresolved,
) -> Owing {
    let name = &config.name;
    let mut entry = SpoolEntry {
        store: config.store.clone().unwrap_or_default(),
        store_fingerprint: store_config.map(|c| c.fingerprint()).unwrap_or_default(),
        unconfirmed: swin_sync::Unconfirmed {
            namespace: name.clone(),
            push_id: String::new(),
            chunks: Default::default(),
        },
        commits: Vec::new(),
        extends: Vec::new(),
        undos: Vec::new(),
        settles: Vec::new(),
        give_backs: Vec::new(),
    };
    let has_store = config.store.is_some() && store_config.is_some();
    let (mut spooled, mut others) = (0, 0);
    for owed in unresolved.take_at_stop() {
        let named = owed.to_string();
        let kept = match has_store {
            true => entry.spool(owed),
            false => false,
        };
        if kept {
            warn!(
                namespace = name,
                "{named}: spooled, resolved by the next start"
            );
            spooled += 1;
        } else {
            error!(
                namespace = name,
                "{named}: not resolved by the stop; the store may keep it charged"
            );
            others += 1;
        }
    }
    ((spooled > 0).then_some(entry), others)
}
