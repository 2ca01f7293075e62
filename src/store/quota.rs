//! Fleet-wide limits (`core::quota`, driven by `worker::quota`): each worker's row per
//! (pool, scope) in `quotas` - its want and what it holds - written with a short TTL and
//! read back a pool at a time. Read and written at LOCAL_QUORUM: a worker's read must see
//! every announcement written before it (the rule that keeps two raised caps from
//! overlapping). The same statements exchange the workers' failure counts
//! (`core::fleet_counts`) in `fleet_counts`, each row with its own TTL; a missing
//! `fleet_counts` table stops only that part (and says to run `fairway init`).

use super::{prepare_statement, q, Store, StoreError};
use crate::core::fleet_counts::CountRow;
use crate::core::quota::Row;
use scylla::client::session::Session;
use scylla::serialize::row::SerializeRow;
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
    /// Put and get of `fleet_counts`, or why they could not be prepared: an older
    /// deployment lacks the table until `fairway init` runs, and the quota exchange must
    /// not stop for it (the counts exchange reports it every pass).
    counts: Result<(PreparedStatement, PreparedStatement), String>,
}

impl Store {
    pub async fn quota_statements(&self) -> Result<QuotaStatements, StoreError> {
        let ks = &self.keyspace;
        let prep = |cql: String, what: &'static str| {
            let session = &self.session;
            async move {
                let mut p = prepare_statement(session, cql, what, false).await?;
                p.set_page_size(1000);
                Ok::<_, StoreError>(p)
            }
        };
        let put_count = prep(
            format!(
                "INSERT INTO {ks}.fleet_counts (pool, scope, worker, at, a, b, c) VALUES (?, ?, ?, ?, ?, ?, ?) \
                 USING TTL ?"
            ),
            "prepare put fleet count",
        )
        .await;
        let get_counts = prep(
            format!("SELECT scope, worker, at, a, b, c FROM {ks}.fleet_counts WHERE pool = ?"),
            "prepare get fleet counts",
        )
        .await;
        let counts = match (put_count, get_counts) {
            (Ok(put), Ok(get)) => Ok((put, get)),
            (Err(e), _) | (_, Err(e)) => Err(e.to_string()),
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
            counts,
        })
    }
}

impl QuotaStatements {
    /// The statements of `fleet_counts`, or an error saying how to create the table.
    fn count_statements(&self) -> Result<&(PreparedStatement, PreparedStatement), StoreError> {
        self.counts.as_ref().map_err(|e| StoreError::Query {
            what: "fleet counts",
            message: format!("{e} (run `fairway init` to create the fleet_counts table)"),
        })
    }

    /// Runs `stmt` once per row, in unlogged batches of one partition at LOCAL_QUORUM.
    async fn put_rows<R, V: SerializeRow>(
        &self,
        stmt: &PreparedStatement,
        rows: &[R],
        values: impl Fn(&R) -> V,
        what: &'static str,
    ) -> Result<(), StoreError> {
        for chunk in rows.chunks(BATCH) {
            let mut batch = Batch::new(BatchType::Unlogged);
            batch.set_consistency(Consistency::LocalQuorum);
            for _ in chunk {
                batch.append_statement(stmt.clone());
            }
            let values: Vec<V> = chunk.iter().map(&values).collect();
            self.session.batch(&batch, values).await.map_err(q(what))?;
        }
        Ok(())
    }

    /// Writes this worker's rows of one pool.
    pub async fn put(&self, pool_key: &str, rows: &[Row], ttl_secs: i32) -> Result<(), StoreError> {
        let values = |r: &Row| (pool_key, r.scope.clone(), r.worker.clone(), r.want as i32, r.held as i32, ttl_secs);
        self.put_rows(&self.put, rows, values, "put quotas").await
    }

    /// Writes this worker's count rows of one pool, each with the TTL `ttl` gives it.
    pub async fn put_counts(
        &self,
        pool_key: &str,
        rows: &[CountRow],
        ttl: impl Fn(&CountRow) -> i32,
    ) -> Result<(), StoreError> {
        let values = |r: &CountRow| (pool_key, r.scope.clone(), r.worker.clone(), r.at, r.a, r.b, r.c, ttl(r));
        self.put_rows(&self.count_statements()?.0, rows, values, "put fleet counts").await
    }

    /// Every worker's count rows of one pool (those not expired).
    pub async fn counts(&self, pool_key: &str) -> Result<Vec<CountRow>, StoreError> {
        use futures::TryStreamExt;
        let err = |e: &dyn std::fmt::Display| StoreError::Query { what: "read fleet counts", message: e.to_string() };
        let get = self.count_statements()?.1.clone();
        let pager = self.session.execute_iter(get, (pool_key,)).await.map_err(|e| err(&e))?;
        type Raw = (String, String, Option<i64>, Option<f64>, Option<f64>, Option<f64>);
        let mut rows = pager.rows_stream::<Raw>().map_err(|e| err(&e))?;
        let mut out = Vec::new();
        while let Some((scope, worker, at, a, b, c)) = rows.try_next().await.map_err(|e| err(&e))? {
            let n = |v: Option<f64>| v.filter(|x| x.is_finite()).unwrap_or(0.0).max(0.0);
            out.push(CountRow { scope, worker, at: at.unwrap_or(0), a: n(a), b: n(b), c: n(c) });
        }
        Ok(out)
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
