//! `fairway rerun` (src/ops/rerun.rs): the target generation per (tenant, job type) in
//! `generations`, raised by lightweight transactions so two concurrent reruns never
//! draw the same number, and the job-row facts a rerun checks before producing a copy
//! (plus clearing a stale cancellation flag, conditional on the row being unchanged).
//! Its resume points live in `replays` ([`super::ReplayStatements`]). Every statement is
//! valid CQL for Cassandra 2.1 (LWT `IF NOT EXISTS` / `IF col = ?` included).

use super::{applied, prepare_statement, q, Store, StoreError};
use crate::core::rerun::{Raise, RowFacts};
use crate::model::Millis;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::collections::HashMap;
use std::sync::Arc;

/// Job ids per `IN` query of [`RerunStatements::job_facts`].
pub const FACTS_CHUNK: usize = 100;

/// Statements of `fairway rerun`, prepared once per run ([`Store::rerun_statements`]).
#[derive(Clone)]
pub struct RerunStatements {
    session: Arc<Session>,
    lookup: Arc<super::coalesce::Lookup>,
    get_generation: PreparedStatement,
    insert_generation: PreparedStatement,
    cas_generation: PreparedStatement,
    job_facts: PreparedStatement,
    clear_cancel: PreparedStatement,
}

/// A job row as a rerun sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFacts {
    pub facts: RowFacts,
    /// The row's last write time: the condition that clears a stale cancellation flag
    /// only if nothing wrote the row since it was read.
    pub updated_at: Option<Millis>,
}

impl Store {
    /// Prepares the statements `fairway rerun` uses.
    pub async fn rerun_statements(&self) -> Result<RerunStatements, StoreError> {
        let (ks, ttl) = (&self.keyspace, self.row_ttl);
        let prep = |cql: String, what: &'static str, lwt: bool| {
            let session = &self.session;
            async move { prepare_statement(session, cql, what, lwt).await }
        };
        Ok(RerunStatements {
            session: self.session.clone(),
            lookup: self.lookup.clone(),
            get_generation: prep(
                format!("SELECT generation FROM {ks}.generations WHERE tenant = ? AND job_type = ?"),
                "prepare get generation",
                false,
            )
            .await?,
            insert_generation: prep(
                format!("INSERT INTO {ks}.generations (tenant, job_type, generation) VALUES (?, ?, ?) IF NOT EXISTS"),
                "prepare insert generation",
                true,
            )
            .await?,
            cas_generation: prep(
                format!(
                    "UPDATE {ks}.generations SET generation = ? WHERE tenant = ? AND job_type = ? IF generation = ?"
                ),
                "prepare raise generation",
                true,
            )
            .await?,
            job_facts: prep(
                format!(
                    "SELECT job_id, status, generation, cancel_requested, updated_at FROM {ks}.jobs WHERE job_id IN ?"
                ),
                "prepare job facts",
                false,
            )
            .await?,
            clear_cancel: prep(
                format!(
                    "UPDATE {ks}.jobs USING TTL {ttl} SET cancel_requested = false, updated_at = ? WHERE job_id = ? IF updated_at = ?"
                ),
                "prepare clear stale cancel",
                true,
            )
            .await?,
        })
    }
}

impl RerunStatements {
    /// The target generation of a (tenant, job type) pair; None when it has no row (0).
    pub async fn target_generation(&self, tenant: &str, job_type: &str) -> Result<Option<i64>, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.get_generation, (tenant, job_type))
            .await
            .map_err(q("get generation"))?;
        let rows = res.into_rows_result().map_err(q("get generation"))?;
        let row = rows.maybe_first_row::<(Option<i64>,)>().map_err(q("get generation"))?;
        Ok(row.and_then(|r| r.0))
    }

    /// Raises a pair's target generation (LWT). False when the row was not as expected
    /// (another rerun got there first): re-read and decide again.
    pub async fn raise_generation(&self, tenant: &str, job_type: &str, raise: Raise) -> Result<bool, StoreError> {
        let res = match raise {
            Raise::Insert { to } => self
                .session
                .execute_unpaged(&self.insert_generation, (tenant, job_type, to))
                .await
                .map_err(q("insert generation"))?,
            Raise::Cas { from, to } => self
                .session
                .execute_unpaged(&self.cas_generation, (to, tenant, job_type, from))
                .await
                .map_err(q("raise generation"))?,
        };
        applied(res)
    }

    /// The rows of these jobs (at most [`FACTS_CHUNK`] ids per query); jobs without a
    /// row are absent.
    pub async fn job_facts(&self, job_ids: &[String]) -> Result<HashMap<String, JobFacts>, StoreError> {
        let mut out = HashMap::new();
        for chunk in job_ids.chunks(FACTS_CHUNK) {
            let res =
                self.session.execute_unpaged(&self.job_facts, (chunk.to_vec(),)).await.map_err(q("read job rows"))?;
            let rows = res.into_rows_result().map_err(q("read job rows"))?;
            let it = rows
                .rows::<(String, Option<String>, Option<i64>, Option<bool>, Option<i64>)>()
                .map_err(q("read job rows"))?;
            for r in it {
                let (job_id, status, generation, cancel_requested, updated_at) = r.map_err(q("read job rows"))?;
                out.insert(job_id, JobFacts { facts: RowFacts { status, generation, cancel_requested }, updated_at });
            }
            // A finished record newer than the row (`core::finished`) gives the status and
            // generation; the cancellation flag and the write time (the condition of
            // `clear_cancel`) stay the row's.
            for (id, state) in self.lookup.fetch(chunk.to_vec()).await? {
                let f = out.entry(id).or_default();
                f.facts.status = state.status;
                f.facts.generation = state.generation;
            }
        }
        Ok(out)
    }

    /// Clears a job's cancellation flag if the row was not written since `updated_at`
    /// was read (LWT). False when it was (read it again and decide again), or when the
    /// row has no write time to compare with.
    pub async fn clear_cancel(
        &self,
        job_id: &str,
        updated_at: Option<Millis>,
        now: Millis,
    ) -> Result<bool, StoreError> {
        let Some(updated_at) = updated_at else { return Ok(false) };
        let res = self
            .session
            .execute_unpaged(&self.clear_cancel, (now, job_id, updated_at))
            .await
            .map_err(q("clear stale cancel"))?;
        applied(res)
    }
}
