//! A config applied to the running namespaces: unchanged ones kept, ones whose limits
//! alone changed given their new limits, changed ones rebuilt, removed ones retired.

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::info;

use super::*;
use crate::config::{Config, NamespaceConfig};

impl Control {
    /// Brings the running namespaces in line with `wanted`. Unchanged ones keep their
    /// counts and engine, as do ones whose limits alone changed. Changed ones are rebuilt
    /// and removed ones stop, in this order: the new map is served and the rebuilt
    /// namespaces' engines start (what they count is pushed on their schedule from the
    /// first hit, not once the old ones have gone: a node killed while an old namespace
    /// waits for a request that holds it, or for its store, loses no more than a sync
    /// period of them), then each old namespace is retired once no request holds it (its
    /// engine's last push then holds every hit its tables took), then rebuilt namespaces
    /// load the totals that push made.
    pub(super) async fn apply_namespaces(&mut self, wanted: &[NamespaceConfig]) {
        let mut next = BTreeMap::new();
        let mut retired = Vec::new();
        let mut rebuilt = Vec::new();
        // namespaces an earlier reload retired that owe nothing and never will
        self.orphans.retain(|o| !o.settled());
        for cfg in wanted {
            let store_config = cfg
                .store
                .as_ref()
                .and_then(|s| self.stores.get(s))
                .map(|c| c.config.clone());
            match self.running.remove(&cfg.name) {
                Some(r) if r.config == *cfg && r.store_config == store_config => {
                    next.insert(cfg.name.clone(), r);
                }
                Some(r)
                    if only_limits_changed(&r.config, cfg) && r.store_config == store_config =>
                {
                    // same counters and engine, new limits: nothing counted is lost
                    info!(namespace = cfg.name, "limits changed");
                    let namespace = Arc::new(r.namespace.with_limits(cfg));
                    // the config it runs is the new one: a later reload back to the old
                    // limits is a change too
                    let config = cfg.clone();
                    next.insert(
                        cfg.name.clone(),
                        Running {
                            namespace,
                            config,
                            ..r
                        },
                    );
                }
                Some(old) => {
                    let r = self.rebuild(cfg, &old);
                    retired.push(old);
                    rebuilt.push(cfg.name.clone());
                    next.insert(cfg.name.clone(), r);
                }
                None => {
                    info!(
                        namespace = cfg.name,
                        mode = cfg.mode.name(),
                        "namespace added"
                    );
                    let mut r = self.build(cfg, None);
                    self.warm_up(&r, false).await;
                    self.start_engine(&mut r);
                    next.insert(cfg.name.clone(), r);
                }
            }
        }
        for (name, old) in std::mem::take(&mut self.running) {
            info!(namespace = name, "namespace removed");
            self.orphans.push(super::stopping::Orphan::of(&old));
            retired.push(old);
        }
        self.running = next;
        self.publish();
        for name in &rebuilt {
            if let Some(mut r) = self.running.remove(name) {
                self.start_engine(&mut r);
                self.running.insert(name.clone(), r);
            }
        }
        for old in retired {
            self.retire(old).await;
        }
        // what the retired engines could not push goes out before the rebuilt ones load
        self.retry_leftovers().await;
        for name in rebuilt {
            if let Some(r) = self.running.get(&name) {
                self.warm_up(r, true).await;
            }
        }
    }

    /// A new version of `old`'s namespace, built for `cfg` (not started).
    fn rebuild(&mut self, cfg: &NamespaceConfig, old: &Running) -> Running {
        info!(namespace = cfg.name, "namespace changed; rebuilding");
        let r = self.build(cfg, Some(old));
        // leases, reservations and idempotency records a node keeps itself (no store)
        // are live across the rebuild: a new table would let a limit's worth more in,
        // and count retries again
        r.namespace.sync.keep_records_of(&old.namespace.sync);
        if !Arc::ptr_eq(&r.namespace.unresolved, &old.namespace.unresolved) {
            self.orphans.push(super::stopping::Orphan::of(old));
        }
        r
    }

    /// Serves the running namespaces.
    fn publish(&self) {
        let map: Namespaces = self
            .running
            .iter()
            .map(|(k, r)| (k.clone(), r.namespace.clone()))
            .collect();
        self.serving.store(Arc::new(map));
    }

    /// Brings the limiter in line with `config`: stores added or changed are connected
    /// (each must answer within `store_timeout`, else nothing changes and the error says
    /// which), removed ones let go, and namespaces added, rebuilt, given new limits or
    /// retired as [`Limiter::start`] describes for each. Unchanged namespaces keep their
    /// counts.
    pub(super) async fn reconfigure(&mut self, config: Config) -> Result<(), LimiterError> {
        let mut fresh = Vec::new();
        for (name, cfg) in &config.stores {
            if self.stores.get(name).is_some_and(|c| c.config == *cfg) {
                continue;
            }
            // a store the new config would switch to must answer now: hits counted
            // for a store that never answers could only be spooled for it
            let store = open_answering(name, cfg, self.config.store_timeout).await?;
            fresh.push((name.clone(), cfg.clone(), store));
        }
        for (name, cfg, store) in fresh {
            if config.migrate {
                // a reload does not wait for the schema
                drop(self.spawn_migrate(&name, &store));
            }
            self.add_store(name, cfg, store);
        }
        let removed: Vec<String> = self
            .stores
            .keys()
            .filter(|n| !config.stores.contains_key(*n))
            .cloned()
            .collect();
        for name in removed {
            if let Some(old) = self.stores.remove(&name) {
                old.purge.cancel();
            }
        }
        swin_sync::clock::clock().set_max_offset(config.max_clock_offset);
        self.config = config.clone();
        self.apply_namespaces(&config.namespaces).await;
        Ok(())
    }
}

/// True when two configs of a namespace differ in their limits only, and not in kind
/// (window limits and GCRA keep different state).
fn only_limits_changed(old: &NamespaceConfig, new: &NamespaceConfig) -> bool {
    // a strict namespace's quota was held or granted under its old limits: it goes back with
    // the old engine, and the new one grants under the new limits
    if old.admission != crate::config::AdmissionMode::Eventual {
        return false;
    }
    let mut same = new.clone();
    same.limits = old.limits.clone();
    same.rules = old.rules.clone();
    same.allow_decrements = old.allow_decrements;
    same.idempotency = old.idempotency;
    same == *old && is_gcra(old) == is_gcra(new)
}

fn is_gcra(cfg: &NamespaceConfig) -> bool {
    cfg.algorithm == crate::policy::algorithm::Algorithm::Gcra
}
