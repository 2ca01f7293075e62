//! Spilled backlogs (see `core::backlog`): the jobs a flooding tenant submitted beyond
//! its buffer, per (pool topic, partition, tenant, bucket of offsets), and the index of
//! which (tenant, bucket) partitions exist per topic partition, read by a partition's new
//! owner. Each write of a bucket's spilled jobs is one or a few *pack* rows
//! (`backlog_packs`, clustered by the pack's last offset; `core::backlog::encode_pack`),
//! so the store pays per write, not per job. Rows of the older one-row-per-job table
//! (`backlog`) are still read and dropped, so backlogs spilled before an upgrade drain.
//! Rows are never deleted one by one: a finished bucket is dropped whole (one partition
//! tombstone per table), so reads never wade through per-row tombstones.

use super::{prepare_statement, q, Store, StoreError};
use crate::core::backlog::{decode_pack, encode_pack};
use futures::TryStreamExt;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Most jobs, and most payload bytes, in one pack row (a bucket spans 1,024 offsets, so
/// a write of a whole bucket is usually one row).
const PACK_JOBS: usize = 1024;
const PACK_BYTES: usize = 512 * 1024;

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
    put_pack: PreparedStatement,
    put_index: PreparedStatement,
    read_packs: PreparedStatement,
    read_rows: PreparedStatement,
    list_index: PreparedStatement,
    drop_packs: PreparedStatement,
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
        let key = "topic = ? AND partition = ? AND tenant = ? AND bucket = ?";
        Ok(BacklogStatements {
            session: self.session.clone(),
            put_pack: prep(
                format!("INSERT INTO {ks}.backlog_packs (topic, partition, tenant, bucket, last, jobs) VALUES (?, ?, ?, ?, ?, ?)"),
                "prepare put backlog pack",
            )
            .await?,
            put_index: prep(
                format!("INSERT INTO {ks}.backlog_index (topic, partition, tenant, bucket) VALUES (?, ?, ?, ?)"),
                "prepare put backlog index",
            )
            .await?,
            read_packs: prep(
                format!("SELECT jobs FROM {ks}.backlog_packs WHERE {key} AND last > ?"),
                "prepare read backlog packs",
            )
            .await?,
            read_rows: prep(
                format!("SELECT offset, job FROM {ks}.backlog WHERE {key} AND offset > ? AND offset < ? LIMIT ?"),
                "prepare read backlog",
            )
            .await?,
            list_index: prep(
                format!("SELECT tenant, bucket FROM {ks}.backlog_index WHERE topic = ? AND partition = ?"),
                "prepare list backlog index",
            )
            .await?,
            drop_packs: prep(format!("DELETE FROM {ks}.backlog_packs WHERE {key}"), "prepare drop backlog packs").await?,
            drop_bucket: prep(format!("DELETE FROM {ks}.backlog WHERE {key}"), "prepare drop backlog bucket").await?,
            drop_index: prep(format!("DELETE FROM {ks}.backlog_index WHERE {key}"), "prepare drop backlog index")
                .await?,
        })
    }
}

/// Splits a write's jobs into packs of at most `PACK_JOBS` jobs and `PACK_BYTES` bytes
/// (a single larger job gets a pack of its own).
fn packs<'r, 'j>(rows: &'r [(i64, &'j [u8])]) -> Vec<&'r [(i64, &'j [u8])]> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < rows.len() {
        let (mut end, mut bytes) = (start, 0);
        while end < rows.len() && end - start < PACK_JOBS && (end == start || bytes + rows[end].1.len() <= PACK_BYTES) {
            bytes += rows[end].1.len();
            end += 1;
        }
        out.push(&rows[start..end]);
        start = end;
    }
    out
}

impl BacklogStatements {
    /// Writes spilled jobs `(offset, encoded job)` of one bucket, in ascending offset
    /// order: its index entry first (so a new owner finds the rows), then the jobs in
    /// pack rows, written at once. Returns the pack rows written.
    pub async fn put_rows(&self, key: BacklogKey<'_>, rows: &[(i64, &[u8])]) -> Result<usize, StoreError> {
        let BacklogKey { topic, partition, tenant, bucket } = key;
        self.session
            .execute_unpaged(&self.put_index, (topic, partition, tenant, bucket))
            .await
            .map_err(q("put backlog index"))?;
        let packs = packs(rows);
        let writes = packs.iter().map(|pack| {
            let last = pack.last().map_or(0, |(o, _)| *o);
            let blob = encode_pack(pack);
            async move {
                self.session
                    .execute_unpaged(&self.put_pack, (topic, partition, tenant, bucket, last, blob))
                    .await
                    .map_err(q("put backlog pack"))
            }
        });
        futures::future::try_join_all(writes).await?;
        Ok(packs.len())
    }

    /// Spilled jobs of a bucket with `after < offset < before`, at most `limit`, in
    /// offset order. Reads every pack of the bucket ending past `after` (a bucket holds
    /// at most 1,024 offsets; a job written twice, after a crash, is returned once) and
    /// the bucket's rows in the one-row-per-job table.
    pub async fn read_rows(
        &self,
        key: BacklogKey<'_>,
        after: i64,
        before: i64,
        limit: usize,
    ) -> Result<Vec<(i64, Vec<u8>)>, StoreError> {
        let BacklogKey { topic, partition, tenant, bucket } = key;
        let mut jobs: BTreeMap<i64, Vec<u8>> = BTreeMap::new();
        let pager = self
            .session
            .execute_iter(self.read_packs.clone(), (topic, partition, tenant, bucket, after))
            .await
            .map_err(q("read backlog packs"))?;
        let mut packs = pager.rows_stream::<(Option<Vec<u8>>,)>().map_err(q("read backlog packs"))?;
        while let Some((pack,)) = packs.try_next().await.map_err(q("read backlog packs"))? {
            let decoded = decode_pack(&pack.unwrap_or_default()).map_err(|e| StoreError::Query {
                what: "decode backlog pack",
                message: format!("{topic} partition {partition}, tenant {tenant}, bucket {bucket}: {e}"),
            })?;
            jobs.extend(decoded.into_iter().filter(|(o, _)| after < *o && *o < before));
        }
        let limit_i32 = limit.min(i32::MAX as usize) as i32;
        let res = self
            .session
            .execute_unpaged(&self.read_rows, (topic, partition, tenant, bucket, after, before, limit_i32))
            .await
            .map_err(q("read backlog"))?;
        let rows = res.into_rows_result().map_err(q("read backlog"))?;
        for r in rows.rows::<(i64, Option<Vec<u8>>)>().map_err(q("read backlog"))? {
            let (o, j) = r.map_err(q("read backlog"))?;
            jobs.entry(o).or_insert_with(|| j.unwrap_or_default());
        }
        Ok(jobs.into_iter().take(limit).collect())
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

    /// Drops a finished bucket: its packs and rows (one partition tombstone per table),
    /// then its index entry.
    pub async fn drop_bucket(&self, key: BacklogKey<'_>) -> Result<(), StoreError> {
        let BacklogKey { topic, partition, tenant, bucket } = key;
        let values = (topic, partition, tenant, bucket);
        let packs = self.session.execute_unpaged(&self.drop_packs, values);
        let rows = self.session.execute_unpaged(&self.drop_bucket, values);
        let (packs, rows) = futures::join!(packs, rows);
        packs.map_err(q("drop backlog packs"))?;
        rows.map_err(q("drop backlog bucket"))?;
        self.session.execute_unpaged(&self.drop_index, values).await.map_err(q("drop backlog index"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_are_cut_by_jobs_and_bytes() {
        let small = [0u8; 10];
        let rows: Vec<(i64, &[u8])> = (0..2500).map(|o| (o, &small[..])).collect();
        let sizes: Vec<usize> = packs(&rows).iter().map(|p| p.len()).collect();
        assert_eq!(sizes, vec![1024, 1024, 452]);
        let big = vec![0u8; PACK_BYTES / 2 + 1];
        let rows: Vec<(i64, &[u8])> = (0..3).map(|o| (o, &big[..])).collect();
        assert_eq!(packs(&rows).len(), 3, "two of these exceed the byte bound");
        let huge = vec![0u8; PACK_BYTES * 2];
        assert_eq!(packs(&[(1, &huge[..])]).len(), 1, "a job larger than the bound still gets a pack");
        assert!(packs(&[]).is_empty());
    }
}
