//! Demands of Envoy's quota service on PostgreSQL (see `store::demands`).

use swin_core::UnixMs;

use super::{err, PostgresStore};
use crate::store::demands::{DemandStore, Demands};
use crate::StoreError;

impl DemandStore for PostgresStore {
    async fn post_demands(&self, namespace: &str, entries: &[Demands]) -> Result<(), StoreError> {
        let entries: Vec<&Demands> = entries
            .iter()
            .filter(|e| !e.bucket.contains('\0') && !e.node.contains('\0'))
            .collect();
        if entries.is_empty() {
            return Ok(());
        }
        let buckets: Vec<&str> = entries.iter().map(|e| e.bucket.as_str()).collect();
        let nodes: Vec<&str> = entries.iter().map(|e| e.node.as_str()).collect();
        let demands: Vec<String> = entries.iter().map(|e| e.text()).collect();
        let expiry: Vec<i64> = entries.iter().map(|e| e.expires_at.0).collect();
        sqlx::query(
            "INSERT INTO swin_demands (namespace, bucket, node, demands, expires_at)
             SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[])
             ON CONFLICT (namespace, bucket, node)
             DO UPDATE SET demands = EXCLUDED.demands, expires_at = EXCLUDED.expires_at",
        )
        .bind(namespace)
        .bind(&buckets)
        .bind(&nodes)
        .bind(&demands)
        .bind(&expiry)
        .execute(self.pool())
        .await
        .map_err(err)?;
        Ok(())
    }

    async fn read_demands(
        &self,
        namespace: &str,
        buckets: &[&str],
        now: UnixMs,
    ) -> Result<Vec<Demands>, StoreError> {
        let buckets: Vec<&str> = buckets
            .iter()
            .copied()
            .filter(|b| !b.contains('\0'))
            .collect();
        let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
            "SELECT bucket, node, demands, expires_at FROM swin_demands
             WHERE namespace = $1 AND bucket = ANY($2) AND expires_at > $3",
        )
        .bind(namespace)
        .bind(&buckets)
        .bind(now.0)
        .fetch_all(self.pool())
        .await
        .map_err(err)?;
        Ok(super::super::demands::from_rows(rows))
    }
}
