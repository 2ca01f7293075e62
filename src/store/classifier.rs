//! The pool classifier's tables, per deployment (topic prefix), per (job type, tenant):
//! - `tenant_run_times`: per 10 s bucket, job type, tenant, pool run in and worker, the
//!   cumulative runs, violations and run-time histogram (idempotent cells, TTL), written
//!   by workers and read by the classifier's leader (`worker::classifier`);
//! - `tenant_pool_classes`: the pool each reclassified (job type, tenant)'s new jobs go
//!   to, written by the leader, read (cached) by every submitter (`crate::classifier`).

use super::{prepare_statement, q, Store, StoreError};
use crate::core::classifier::{Class, RunCell, Subject};
use crate::model::{Millis, Pool};
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One worker's cumulative runs of one (job type, tenant) in one pool in one bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct RunTimeCell {
    pub subject: Subject,
    pub pool: Pool,
    pub worker: String,
    pub cell: RunCell,
}

/// One row of `tenant_pool_classes`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassRow {
    pub subject: Subject,
    pub class: Class,
    pub reason: String,
}

/// Statements of the classifier's tables ([`Store::classifier_statements`]).
#[derive(Clone)]
pub struct ClassifierStatements {
    session: Arc<Session>,
    scope: String,
    put_runs: PreparedStatement,
    get_runs: PreparedStatement,
    get_classes: PreparedStatement,
    put_class: PreparedStatement,
    drop_class: PreparedStatement,
}

impl Store {
    pub async fn classifier_statements(&self) -> Result<ClassifierStatements, StoreError> {
        let ks = self.keyspace();
        let prep = |cql: String, what: &'static str| {
            let session = self.session.clone();
            async move { prepare_statement(&session, cql, what, false).await }
        };
        Ok(ClassifierStatements {
            session: self.session.clone(),
            scope: self.scope.clone(),
            put_runs: prep(
                format!(
                    "INSERT INTO {ks}.tenant_run_times (scope, bucket, job_type, tenant, pool, worker, runs, over, \
                     under, hist) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
                ),
                "prepare put run times",
            )
            .await?,
            get_runs: prep(
                format!(
                    "SELECT job_type, tenant, pool, worker, runs, over, under, hist FROM {ks}.tenant_run_times \
                     WHERE scope = ? AND bucket = ?"
                ),
                "prepare read run times",
            )
            .await?,
            get_classes: prep(
                format!(
                    "SELECT job_type, tenant, pool, since, sticky_until, reason FROM {ks}.tenant_pool_classes \
                     WHERE scope = ?"
                ),
                "prepare read pool classes",
            )
            .await?,
            put_class: prep(
                format!(
                    "INSERT INTO {ks}.tenant_pool_classes (scope, job_type, tenant, pool, since, sticky_until, \
                     reason) VALUES (?, ?, ?, ?, ?, ?, ?)"
                ),
                "prepare put pool class",
            )
            .await?,
            drop_class: prep(
                format!("DELETE FROM {ks}.tenant_pool_classes WHERE scope = ? AND job_type = ? AND tenant = ?"),
                "prepare drop pool class",
            )
            .await?,
        })
    }
}

impl ClassifierStatements {
    /// Writes one worker's cumulative cells of a bucket (idempotent: a retried write is harmless).
    pub async fn put_runs(&self, bucket: Millis, cells: &[RunTimeCell], ttl_secs: i32) -> Result<(), StoreError> {
        let writes = cells.iter().map(|c| {
            let r = &c.cell;
            let v = (
                self.scope.as_str(),
                bucket,
                &c.subject.job_type,
                &c.subject.tenant,
                c.pool.as_str(),
                &c.worker,
                r.runs,
                r.over,
                r.under,
                &r.hist,
                ttl_secs,
            );
            self.session.execute_unpaged(&self.put_runs, v)
        });
        for r in futures::future::join_all(writes).await {
            r.map_err(q("put run times"))?;
        }
        Ok(())
    }

    /// Every worker's cells of one bucket (cells of an unknown pool are skipped).
    pub async fn runs(&self, bucket: Millis) -> Result<Vec<RunTimeCell>, StoreError> {
        use futures::TryStreamExt;
        let pager = self
            .session
            .execute_iter(self.get_runs.clone(), (self.scope.as_str(), bucket))
            .await
            .map_err(q("read run times"))?;
        type Row = (String, String, String, String, Option<i64>, Option<i64>, Option<i64>, Option<BTreeMap<i32, i64>>);
        let mut rows = pager.rows_stream::<Row>().map_err(q("read run times"))?;
        let mut out = Vec::new();
        while let Some((job_type, tenant, pool, worker, runs, over, under, hist)) =
            rows.try_next().await.map_err(q("read run times"))?
        {
            let Ok(pool) = pool.parse() else { continue };
            let cell = RunCell {
                runs: runs.unwrap_or(0),
                over: over.unwrap_or(0),
                under: under.unwrap_or(0),
                hist: hist.unwrap_or_default(),
            };
            out.push(RunTimeCell { subject: Subject { job_type, tenant }, pool, worker, cell });
        }
        Ok(out)
    }

    /// Every (job type, tenant)'s class (rows naming an unknown pool are skipped).
    pub async fn classes(&self) -> Result<Vec<ClassRow>, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.get_classes, (self.scope.as_str(),))
            .await
            .map_err(q("read pool classes"))?;
        let rows = res.into_rows_result().map_err(q("read pool classes"))?;
        type Row = (String, String, String, Option<i64>, Option<i64>, Option<String>);
        let mut out = Vec::new();
        for r in rows.rows::<Row>().map_err(q("read pool classes"))? {
            let (job_type, tenant, pool, since, sticky_until, reason) = r.map_err(q("read pool classes"))?;
            let Ok(pool) = pool.parse() else { continue };
            let class = Class { pool, since: since.unwrap_or(0), sticky_until: sticky_until.unwrap_or(0) };
            out.push(ClassRow { subject: Subject { job_type, tenant }, class, reason: reason.unwrap_or_default() });
        }
        Ok(out)
    }

    /// Records a (job type, tenant)'s new class.
    pub async fn put_class(&self, row: &ClassRow) -> Result<(), StoreError> {
        let (c, s) = (&row.class, &row.subject);
        let v = (self.scope.as_str(), &s.job_type, &s.tenant, c.pool.as_str(), c.since, c.sticky_until, &row.reason);
        self.session.execute_unpaged(&self.put_class, v).await.map_err(q("put pool class"))?;
        Ok(())
    }

    /// Drops a (job type, tenant)'s class: its new jobs go to the configured pool again.
    pub async fn drop_class(&self, subject: &Subject) -> Result<(), StoreError> {
        let v = (self.scope.as_str(), &subject.job_type, &subject.tenant);
        self.session.execute_unpaged(&self.drop_class, v).await.map_err(q("drop pool class"))?;
        Ok(())
    }
}
