//! GCRA buckets through the engine: spends, refunds and dry runs, on local buckets
//! (periodic, local only) or in the store (synchronous: the advance is applied there and
//! the decision taken on the TAT it returns).

use swin_core::{Advance, CompactString, CoreError, Decision, Gcra, Tat, UnixMs};
use tracing::warn;

use super::{nanos, NamespaceSync};
use crate::store::{Store, TatPush};
use crate::StoreError;

impl NamespaceSync {
    /// A GCRA spend of `cost` on `key`, as the namespace's mode says: on local buckets
    /// (periodic, local only) or through the store (synchronous: the advance is applied
    /// there and the decision taken on the TAT it returns, taken back when denied; on a
    /// store failure the spend is decided locally and pushed later). With `force` a
    /// denied spend counts too.
    pub async fn spend(
        &self,
        gcra: &Gcra,
        key: &str,
        cost: i64,
        now: UnixMs,
        force: bool,
    ) -> Result<Decision, CoreError> {
        let buckets = self.counters.buckets();
        let now_ns = nanos(now);
        let Some(store) = self.store_for_requests() else {
            return buckets.spend(gcra, key, now_ns, cost, force);
        };
        // validates the cost before anything reaches the store (a forced spend, an
        // overrun charged as debt, may pass the burst)
        if !force {
            gcra.check_cost(cost)?;
        }
        match self
            .spend_in_store(store, gcra, key, cost, now_ns, force)
            .await
        {
            Ok(d) => Ok(d),
            Err(e) => {
                warn!(namespace = self.name(), cause = %e, "synchronous spend failed; decided locally");
                self.record(Err(&e));
                self.trip(&e);
                buckets.spend(gcra, key, now_ns, cost, force)
            }
        }
    }

    /// Applies one TAT advance in the store (no sequence number: a synchronous call).
    pub(super) async fn push_advance(
        &self,
        store: &Store,
        key: &str,
        ns: i64,
        now_ns: i64,
    ) -> Result<Vec<Tat>, StoreError> {
        let advances = [Advance {
            key: key.into(),
            ns,
        }];
        let push = TatPush {
            node_id: &self.node_id,
            seq: None,
            now_ns,
            advances: &advances,
        };
        self.call(store.push_tats(self.name(), push)).await
    }

    /// Reads the key's bucket from the store into this node's view of it (a key this
    /// node may never have spent on), within `answer_timeout`. No store: nothing to read.
    pub async fn load_bucket(&self, key: &str) -> Result<(), StoreError> {
        let Some(store) = self.store() else {
            return Ok(());
        };
        let within = self.answer_within();
        let tat = tokio::time::timeout(within, self.store_tat(store, key))
            .await
            .map_err(|_| StoreError::Timeout(within))??;
        if let Some(tat_ns) = tat {
            let tats = [Tat {
                key: key.into(),
                tat_ns,
            }];
            self.counters.buckets().apply(&tats, true);
        }
        Ok(())
    }

    /// The key's TAT in the store (`None`: the store holds no bucket, it is full).
    pub(super) async fn store_tat(
        &self,
        store: &Store,
        key: &str,
    ) -> Result<Option<i64>, StoreError> {
        let keys = [CompactString::from(key)];
        let tats = self.call(store.read_tats(self.name(), &keys)).await?;
        Ok(tats.first().map(|t| t.tat_ns))
    }

    pub(super) async fn spend_in_store(
        &self,
        store: &Store,
        gcra: &Gcra,
        key: &str,
        cost: i64,
        now_ns: i64,
        force: bool,
    ) -> Result<Decision, StoreError> {
        let advance = gcra.emission_ns().saturating_mul(cost);
        let tats = self.push_advance(store, key, advance, now_ns).await?;
        let tat = tats.first().map_or(now_ns + advance, |t| t.tat_ns);
        // the TAT before this spend, as the store's max(tat, now) saw it
        let d = gcra
            .spend(Some(tat - advance), now_ns, cost)
            .map_err(|e| StoreError::Protocol(e.to_string()))?;
        let tats = if d.decision.allowed || force {
            tats
        } else {
            self.push_advance(store, key, -advance, now_ns).await?
        };
        self.counters.buckets().apply(&tats, true);
        Ok(d.decision)
    }

    /// Gives back `cost` of a GCRA bucket (Boulder's refund), locally or, in synchronous
    /// mode, in the store (on a store failure: locally, pushed by a later sync).
    pub async fn refund_tokens(
        &self,
        gcra: &Gcra,
        key: &str,
        cost: i64,
        now: UnixMs,
    ) -> Result<Decision, CoreError> {
        let now_ns = nanos(now);
        if let Some(store) = self.store_for_requests() {
            let in_store = async {
                let tat = self.store_tat(store, key).await?;
                let d = gcra
                    .refund(tat, now_ns, cost)
                    .map_err(|e| StoreError::Protocol(e.to_string()))?;
                if d.decision.allowed {
                    let back = d.new_tat - tat.unwrap_or(now_ns).max(now_ns);
                    self.push_advance(store, key, back, now_ns).await?;
                }
                Ok::<_, StoreError>(d.decision)
            };
            match in_store.await {
                Ok(d) => return Ok(d),
                Err(e) => {
                    warn!(namespace = self.name(), cause = %e, "synchronous refund failed; given back locally");
                    self.record(Err(&e));
                    self.trip(&e);
                }
            }
        }
        self.counters.buckets().refund(gcra, key, now_ns, cost)
    }

    /// The key's bucket as a spend of `cost` would find it, spending nothing (in
    /// synchronous mode, read from the store; locally when it cannot be read).
    pub async fn dry_run(
        &self,
        gcra: &Gcra,
        key: &str,
        cost: i64,
        now: UnixMs,
    ) -> Result<Decision, CoreError> {
        let now_ns = nanos(now);
        if let Some(store) = self.store_for_requests() {
            if let Ok(tat) = self.store_tat(store, key).await {
                return Ok(gcra.dry_run(tat, now_ns, cost)?.decision);
            }
        }
        self.counters.buckets().dry_run(gcra, key, now_ns, cost)
    }
}
