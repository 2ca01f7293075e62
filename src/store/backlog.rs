//! Spilled backlogs (see `core::backlog`): the rows of jobs a flooding tenant submitted
//! beyond its buffer, per (pool topic, partition, tenant, bucket of offsets), ordered by
//! offset, and the index of which (tenant, bucket) partitions exist per topic partition,
//! read by a partition's new owner. Rows are written in unlogged batches of one store
//! partition each and never deleted one by one: a finished bucket is dropped whole (one
//! partition tombstone), so reads never wade through per-row tombstones.

use super::{prepare_statement, q, Store, StoreError};
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
use std::sync::Arc;

/// Most rows, and most payload bytes, in one batch.
const BATCH_ROWS: usize = 200;
const BATCH_BYTES: usize = 256 * 1024;

/// Where one tenant's spilled rows of a bucket live.
#[derive(Debug, Clone, Copy)]
pub struct BacklogKey<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub tenant: &'a str,
    pub bucket: i64,
}

/// Statements of the spill path ([`Store::backlog_statements`]).
#[derive(Clone)]
pub struct BacklogStatements {
    session: Arc<Session>,
    put_row: PreparedStatement,
    put_index: PreparedStatement,
    read_rows: PreparedStatement,
    list_index: PreparedStatement,
    drop_bucket: PreparedStatement,
    drop_index: PreparedStatement,
}

impl Store {
    pub async fn backlog_statements(&self) -> Result<BacklogStatements, StoreError> {
        let ks = self.keyspace();
        let session = self.session.clone();
        let prep = |cql: String, what: &'static str| {
            let session = session.clone();
            async move { prepare_statement(&session, cql, what, false).await }
        };
        Ok(BacklogStatements {
            session: self.session.clone(),
            put_row: prep(
                format!(
                    "INSERT INTO {ks}.backlog (topic, partition, tenant, bucket, offset, job) VALUES (?, ?, ?, ?, ?, ?)"
                ),
                "prepare put backlog row",
            )
            .await?,
            put_index: prep(
                format!("INSERT INTO {ks}.backlog_index (topic, partition, tenant, bucket) VALUES (?, ?, ?, ?)"),
                "prepare put backlog index",
            )
            .await?,
            read_rows: prep(
                format!(
                    "SELECT offset, job FROM {ks}.backlog WHERE topic = ? AND partition = ? AND tenant = ? \
                     AND bucket = ? AND offset > ? AND offset < ? LIMIT ?"
                ),
                "prepare read backlog",
            )
            .await?,
            list_index: prep(
                format!("SELECT tenant, bucket FROM {ks}.backlog_index WHERE topic = ? AND partition = ?"),
                "prepare list backlog index",
            )
            .await?,
            drop_bucket: prep(
                format!("DELETE FROM {ks}.backlog WHERE topic = ? AND partition = ? AND tenant = ? AND bucket = ?"),
                "prepare drop backlog bucket",
            )
            .await?,
            drop_index: prep(
                format!(
                    "DELETE FROM {ks}.backlog_index WHERE topic = ? AND partition = ? AND tenant = ? AND bucket = ?"
                ),
                "prepare drop backlog index",
            )
            .await?,
        })
    }
}

impl BacklogStatements {
    /// Writes rows `(offset, encoded job)` of one bucket: its index entry first (so a new
    /// owner finds the rows), then the rows in batches of one store partition each.
    pub async fn put_rows(&self, key: BacklogKey<'_>, rows: &[(i64, &[u8])]) -> Result<(), StoreError> {
        let BacklogKey { topic, partition, tenant, bucket } = key;
        self.session
            .execute_unpaged(&self.put_index, (topic, partition, tenant, bucket))
            .await
            .map_err(q("put backlog index"))?;
        let mut start = 0;
        while start < rows.len() {
            let mut end = start;
            let mut bytes = 0;
            while end < rows.len()
                && end - start < BATCH_ROWS
                && (end == start || bytes + rows[end].1.len() <= BATCH_BYTES)
            {
                bytes += rows[end].1.len();
                end += 1;
            }
            let mut batch = Batch::new(BatchType::Unlogged);
            batch.set_consistency(Consistency::LocalQuorum);
            let mut values = Vec::with_capacity(end - start);
            for (offset, job) in &rows[start..end] {
                batch.append_statement(self.put_row.clone());
                values.push((topic, partition, tenant, bucket, *offset, *job));
            }
            self.session.batch(&batch, values).await.map_err(q("put backlog rows"))?;
            start = end;
        }
        Ok(())
    }

    /// Rows of a bucket with `after < offset < before`, at most `limit`, in offset order.
    pub async fn read_rows(
        &self,
        key: BacklogKey<'_>,
        after: i64,
        before: i64,
        limit: usize,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        let BacklogKey { topic, partition, tenant, bucket } = key;
        let limit = limit.min(i32::MAX as usize) as i32;
        let res = self
            .session
            .execute_unpaged(&self.read_rows, (topic, partition, tenant, bucket, after, before, limit))
            .await
            .map_err(q("read backlog"))?;
        let rows = res.into_rows_result().map_err(q("read backlog"))?;
        let it = rows.rows::<(i64, Option<Vec<u8>>)>().map_err(q("read backlog"))?;
        it.map(|r| r.map(|(o, j)| (o, j.unwrap_or_default())).map_err(q("read backlog"))).collect()
    }

    /// Every (tenant, bucket) with spilled rows on a topic partition.
    pub async fn list(&self, topic: &str, partition: i32) -> Result<Vec<(String, i64)>, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.list_index, (topic, partition))
            .await
            .map_err(q("list backlog index"))?;
        let rows = res.into_rows_result().map_err(q("list backlog index"))?;
        let it = rows.rows::<(String, i64)>().map_err(q("list backlog index"))?;
        it.map(|r| r.map_err(q("list backlog index"))).collect()
    }

    /// Drops a finished bucket: its rows (one partition tombstone), then its index entry.
    pub async fn drop_bucket(&self, key: BacklogKey<'_>) -> Result<(), StoreError> {
        let BacklogKey { topic, partition, tenant, bucket } = key;
        self.session
            .execute_unpaged(&self.drop_bucket, (topic, partition, tenant, bucket))
            .await
            .map_err(q("drop backlog bucket"))?;
        self.session
            .execute_unpaged(&self.drop_index, (topic, partition, tenant, bucket))
            .await
            .map_err(q("drop backlog index"))?;
        Ok(())
    }
}
