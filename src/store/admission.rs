//! The front door's shared counts, per deployment (topic prefix):
//! - `queue_depth`: per tenant and pool, counter columns `enqueued` (added by the API /
//!   CLI for every accepted job due now) and `dequeued` (added by workers when such a job
//!   is first dispatched); queued = enqueued - dequeued (`core::admission::queued`).
//! - `tenant_outcome_cells`: per 10 s bucket, pool, job type, tenant and worker, the
//!   cumulative successes, failed attempts, infrastructure failures among them and
//!   timeouts among those, and the `dependency` failures among them (idempotent cells, TTL), which API processes read to run the
//!   submission circuit breakers (`core::admission::breaker`: per tenant, and shared ones
//!   on infrastructure failures of several tenants). The older `outcome_counts` (no
//!   tenant) and `tenant_outcome_counts` (no timeouts apart) are no longer written.

use super::{prepare_statement, q, Store, StoreError};
use crate::model::Millis;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

/// One worker's cumulative outcomes of one tenant's jobs of one (pool, job type) in one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutcomeCell {
    pub pool: String,
    pub job_type: String,
    pub tenant: String,
    pub worker: String,
    pub ok: i64,
    pub failed: i64,
    /// Infrastructure failures among `failed`.
    pub infra: i64,
    /// Timeouts among `infra`.
    pub timeouts: i64,
    /// Failures of class `dependency` among `infra` (the dependency breakers' counts,
    /// `core::dependency`).
    pub dependency: i64,
}

/// Statements of the front door's counts ([`Store::admission_statements`]).
#[derive(Clone)]
pub struct AdmissionStatements {
    session: Arc<Session>,
    scope: String,
    enqueue: PreparedStatement,
    dequeue: PreparedStatement,
    depth: PreparedStatement,
    put_outcomes: PreparedStatement,
    get_outcomes: PreparedStatement,
}

impl Store {
    pub async fn admission_statements(&self) -> Result<AdmissionStatements, StoreError> {
        let ks = self.keyspace();
        let session = self.session.clone();
        let prep = |cql: String, what: &'static str| {
            let session = session.clone();
            async move { prepare_statement(&session, cql, what, false).await }
        };
        let add = |col: &str| {
            format!("UPDATE {ks}.queue_depth SET {col} = {col} + ? WHERE scope = ? AND tenant = ? AND pool = ?")
        };
        Ok(AdmissionStatements {
            session: self.session.clone(),
            scope: self.scope.clone(),
            enqueue: prep(add("enqueued"), "prepare enqueue count").await?,
            dequeue: prep(add("dequeued"), "prepare dequeue count").await?,
            depth: prep(
                format!("SELECT enqueued, dequeued FROM {ks}.queue_depth WHERE scope = ? AND tenant = ?"),
                "prepare read queue depth",
            )
            .await?,
            put_outcomes: prep(
                format!(
                    "INSERT INTO {ks}.tenant_outcome_cells (scope, bucket, pool, job_type, tenant, worker, ok, \
                     failed, infra, timeouts, dependency) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
                ),
                "prepare put outcome counts",
            )
            .await?,
            get_outcomes: prep(
                format!(
                    "SELECT pool, job_type, tenant, worker, ok, failed, infra, timeouts, dependency FROM \
                     {ks}.tenant_outcome_cells WHERE scope = ? AND bucket = ?"
                ),
                "prepare read outcome counts",
            )
            .await?,
        })
    }
}

impl AdmissionStatements {
    /// Adds `n` accepted jobs to the tenant's queue in `pool`.
    pub async fn enqueued(&self, tenant: &str, pool: &str, n: i64) -> Result<(), StoreError> {
        let v = (scylla::value::Counter(n), self.scope.as_str(), tenant, pool);
        self.session.execute_unpaged(&self.enqueue, v).await.map_err(q("count enqueued"))?;
        Ok(())
    }

    /// Takes `n` dispatched jobs off the tenant's queue in `pool`.
    pub async fn dequeued(&self, tenant: &str, pool: &str, n: i64) -> Result<(), StoreError> {
        let v = (scylla::value::Counter(n), self.scope.as_str(), tenant, pool);
        self.session.execute_unpaged(&self.dequeue, v).await.map_err(q("count dequeued"))?;
        Ok(())
    }

    /// The tenant's (enqueued, dequeued) summed over pools.
    pub async fn depth(&self, tenant: &str) -> Result<(i64, i64), StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.depth, (self.scope.as_str(), tenant))
            .await
            .map_err(q("read queue depth"))?;
        let rows = res.into_rows_result().map_err(q("read queue depth"))?;
        let mut sum = (0i64, 0i64);
        type Cells = (Option<scylla::value::Counter>, Option<scylla::value::Counter>);
        for r in rows.rows::<Cells>().map_err(q("read queue depth"))? {
            let (e, d) = r.map_err(q("read queue depth"))?;
            sum.0 += e.map_or(0, |c| c.0);
            sum.1 += d.map_or(0, |c| c.0);
        }
        Ok(sum)
    }

    /// Writes one worker's cumulative cells of a bucket (idempotent: a retried write is harmless).
    pub async fn put_outcomes(&self, bucket: Millis, cells: &[OutcomeCell], ttl_secs: i32) -> Result<(), StoreError> {
        let writes = cells.iter().map(|c| {
            let v = (
                self.scope.as_str(),
                bucket,
                &c.pool,
                &c.job_type,
                &c.tenant,
                &c.worker,
                c.ok,
                c.failed,
                c.infra,
                c.timeouts,
                c.dependency,
                ttl_secs,
            );
            self.session.execute_unpaged(&self.put_outcomes, v)
        });
        for r in futures::future::join_all(writes).await {
            r.map_err(q("put outcome counts"))?;
        }
        Ok(())
    }

    /// Every worker's cells of one bucket.
    pub async fn outcomes(&self, bucket: Millis) -> Result<Vec<OutcomeCell>, StoreError> {
        use futures::TryStreamExt;
        let pager = self
            .session
            .execute_iter(self.get_outcomes.clone(), (self.scope.as_str(), bucket))
            .await
            .map_err(q("read outcome counts"))?;
        type Row = (String, String, String, String, Option<i64>, Option<i64>, Option<i64>, Option<i64>, Option<i64>);
        let mut rows = pager.rows_stream::<Row>().map_err(q("read outcome counts"))?;
        let mut out = Vec::new();
        while let Some((pool, job_type, tenant, worker, ok, failed, infra, timeouts, dependency)) =
            rows.try_next().await.map_err(q("read outcome counts"))?
        {
            let (ok, failed, infra) = (ok.unwrap_or(0), failed.unwrap_or(0), infra.unwrap_or(0));
            out.push(OutcomeCell {
                pool,
                job_type,
                tenant,
                worker,
                ok,
                failed,
                infra,
                timeouts: timeouts.unwrap_or(0),
                dependency: dependency.unwrap_or(0),
            });
        }
        Ok(out)
    }
}
