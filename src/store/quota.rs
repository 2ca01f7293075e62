//! Fleet-wide limits (`core::quota`, driven by `worker::quota`): each worker's row per
//! (pool, scope) in `quotas` - its want and what it holds - written with a short TTL and
//! read back a pool at a time. Read and written at LOCAL_QUORUM: a worker's read must see
//! every announcement written before it (the rule that keeps two raised caps from
//! overlapping).

use super::{q, Store, StoreError};
use crate::core::quota::Row;
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
use std::sync::Arc;

/// Most rows in one unlogged batch (all of one partition).
const BATCH: usize = 100;

/// Statements of the quota exchange ([`Store::quota_statements`]).
#[derive(Clone)]
pub struct QuotaStatements {
    session: Arc<Session>,
    put: PreparedStatement,
    get: PreparedStatement,
}

impl Store {
    pub async fn quota_statements(&self) -> Result<QuotaStatements, StoreError> {
        let ks = &self.keyspace;
        let prep = |cql: String, what: &'static str| {
            let session = &self.session;
            async move {
                let mut p =
                    session.prepare(cql).await.map_err(|e| StoreError::Query { what, message: e.to_string() })?;
                p.set_consistency(Consistency::LocalQuorum);
                p.set_page_size(1000);
                Ok::<_, StoreError>(p)
            }
        };
        Ok(QuotaStatements {
            session: self.session.clone(),
            put: prep(
                format!("INSERT INTO {ks}.quotas (pool, scope, worker, want, held) VALUES (?, ?, ?, ?, ?) USING TTL ?"),
                "prepare put quota",
            )
            .await?,
            get: prep(
                format!("SELECT scope, worker, want, held FROM {ks}.quotas WHERE pool = ?"),
                "prepare get quotas",
            )
            .await?,
        })
    }
}

impl QuotaStatements {
    /// Writes this worker's rows of one pool (unlogged batches of one partition).
    pub async fn put(&self, pool_key: &str, rows: &[Row], ttl_secs: i32) -> Result<(), StoreError> {
        for chunk in rows.chunks(BATCH) {
            let mut batch = Batch::new(BatchType::Unlogged);
            batch.set_consistency(Consistency::LocalQuorum);
            let mut values = Vec::with_capacity(chunk.len());
            for r in chunk {
                batch.append_statement(self.put.clone());
                values.push((pool_key, r.scope.as_str(), r.worker.as_str(), r.want as i32, r.held as i32, ttl_secs));
            }
            self.session.batch(&batch, values).await.map_err(q("put quotas"))?;
        }
        Ok(())
    }

    /// Every live worker's rows of one pool.
    pub async fn rows(&self, pool_key: &str) -> Result<Vec<Row>, StoreError> {
        use futures::TryStreamExt;
        let err = |e: &dyn std::fmt::Display| StoreError::Query { what: "read quotas", message: e.to_string() };
        let pager = self.session.execute_iter(self.get.clone(), (pool_key,)).await.map_err(|e| err(&e))?;
        let mut rows = pager.rows_stream::<(String, String, Option<i32>, Option<i32>)>().map_err(|e| err(&e))?;
        let mut out = Vec::new();
        while let Some((scope, worker, want, held)) = rows.try_next().await.map_err(|e| err(&e))? {
            let n = |v: Option<i32>| v.unwrap_or(0).max(0) as u32;
            out.push(Row { scope, worker, want: n(want), held: n(held) });
        }
        Ok(out)
    }
}
