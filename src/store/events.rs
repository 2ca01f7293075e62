//! Statements of job watching (`crate::watch::events`): the row a submission writes (`queued`
//! or `scheduled`, so the job is visible at once) when its state is not a queued record in a
//! pack (`core::finished`: a job scheduled ahead, or one whose id is not a UUIDv7), the event
//! history (`job_events`), and the idempotency claim's release and take-over.
//!
//! Why a history table rather than reading the events topic back: a job's history is
//! one store partition (one read, in time order), while the topic would have to be
//! scanned from the retention horizon for every `GET /v1/jobs/{id}/events`. The topic
//! stays the source: the recorder writes from it in batches, off every hot path.
//!
//! The submission's row is written with `USING TIMESTAMP <submission time>`: every
//! worker write to the row happens after the job was produced, so it carries a later
//! timestamp and wins, even when the submission's write lands last.

use super::{prepare_statement, q, Store, StoreError};
use crate::model::{EventKind, JobEvent, Millis};
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Most events one history read returns (the oldest first).
pub const HISTORY_LIMIT: i32 = 1000;

/// Owned values of `put_submitted`, in its bind order.
type SubmittedValues = (i32, i64, String, String, String, String, i32, i32, i64, i64, i64, String);
type SubmittedReq = (SubmittedValues, oneshot::Sender<Result<(), StoreError>>);

#[derive(Clone)]
pub struct EventStatements {
    session: Arc<Session>,
    /// Submissions' rows, merged into unlogged batches (`coalesce::serve`): concurrent
    /// submissions share a round trip.
    submitted: mpsc::Sender<SubmittedReq>,
    delete_submitted: PreparedStatement,
    put_event: PreparedStatement,
    get_events: PreparedStatement,
    get_events_since: PreparedStatement,
    claim_key: PreparedStatement,
    release_key: PreparedStatement,
    take_over_key: PreparedStatement,
}

/// An idempotency key's claim: taken by this call, or held by a job since `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyClaim {
    Claimed,
    Held { job_id: String, at: Millis },
}

type EventRow = (
    String,
    i64,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i32>,
    Option<String>,
    Option<f64>,
    Option<String>,
    Option<i64>,
);

const EVENT_COLUMNS: &str =
    "job_id, at, event_id, tenant, job_type, kind, attempt, worker, progress, message, next_attempt_at";

fn from_row(r: EventRow) -> Option<JobEvent> {
    let (job_id, at, event_id, tenant, job_type, kind, attempt, worker, progress, message, next_attempt_at) = r;
    Some(JobEvent {
        event_id,
        job_id,
        tenant: tenant.unwrap_or_default(),
        job_type: job_type.unwrap_or_default(),
        kind: kind?.parse::<EventKind>().ok()?,
        at,
        attempt: attempt.unwrap_or(0),
        worker,
        progress,
        message,
        next_attempt_at,
    })
}

impl Store {
    /// Prepares the statements of job watching.
    pub async fn event_statements(&self) -> Result<EventStatements, StoreError> {
        let ks = &self.keyspace;
        let s = &self.session;
        let put_submitted = prepare_statement(
            s,
            format!(
                "UPDATE {ks}.jobs USING TTL ? AND TIMESTAMP ? SET tenant = ?, job_type = ?, pool = ?, status = ?, \
                 attempts = ?, crash_count = ?, generation = ?, submitted_at = ?, updated_at = ? WHERE job_id = ?"
            ),
            "prepare put submitted",
            false,
        )
        .await?;
        let (submitted, rx) = mpsc::channel(4096);
        tokio::spawn(write_submitted(self.session.clone(), put_submitted, rx));
        Ok(EventStatements {
            session: self.session.clone(),
            submitted,
            delete_submitted: prepare_statement(
                s,
                format!("DELETE FROM {ks}.jobs USING TIMESTAMP ? WHERE job_id = ?"),
                "prepare delete submitted",
                false,
            )
            .await?,
            put_event: prepare_statement(
                s,
                format!("INSERT INTO {ks}.job_events ({EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"),
                "prepare put event",
                false,
            )
            .await?,
            get_events: prepare_statement(
                s,
                format!("SELECT {EVENT_COLUMNS} FROM {ks}.job_events WHERE job_id = ? LIMIT {HISTORY_LIMIT}"),
                "prepare get events",
                false,
            )
            .await?,
            get_events_since: prepare_statement(
                s,
                format!(
                    "SELECT {EVENT_COLUMNS} FROM {ks}.job_events WHERE job_id = ? AND at >= ? LIMIT {HISTORY_LIMIT}"
                ),
                "prepare get events since",
                false,
            )
            .await?,
            claim_key: prepare_statement(
                s,
                format!("INSERT INTO {ks}.idempotency (tenant, key, job_id, at) VALUES (?, ?, ?, ?) IF NOT EXISTS USING TTL ?"),
                "prepare claim idempotency key",
                true,
            )
            .await?,
            release_key: prepare_statement(
                s,
                format!("DELETE FROM {ks}.idempotency WHERE tenant = ? AND key = ? IF job_id = ?"),
                "prepare release idempotency key",
                true,
            )
            .await?,
            take_over_key: prepare_statement(
                s,
                format!(
                    "UPDATE {ks}.idempotency USING TTL ? SET job_id = ?, at = ? WHERE tenant = ? AND key = ? IF job_id = ?"
                ),
                "prepare take over idempotency key",
                true,
            )
            .await?,
        })
    }
}

/// What a submission records about its job.
pub struct Submitted<'a> {
    pub job_id: &'a str,
    pub tenant: &'a str,
    pub job_type: &'a str,
    pub pool: &'a str,
    /// `queued` or `scheduled`.
    pub status: &'a str,
    pub generation: i64,
    pub submitted_at: Millis,
    pub ttl_secs: i32,
}

impl EventStatements {
    /// The submission's row (see the module docs for its write timestamp).
    pub async fn put_submitted(&self, s: &Submitted<'_>) -> Result<(), StoreError> {
        let ts = s.submitted_at.saturating_mul(1000);
        let v = (
            s.ttl_secs,
            ts,
            s.tenant.to_string(),
            s.job_type.to_string(),
            s.pool.to_string(),
            s.status.to_string(),
            0i32,
            0i32,
            s.generation,
            s.submitted_at,
            s.submitted_at,
            s.job_id.to_string(),
        );
        let (tx, rx) = oneshot::channel();
        let closed = || StoreError::Query { what: "put submitted job", message: "the store's writer stopped".into() };
        self.submitted.send((v, tx)).await.map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }

    /// Takes back a submission's row whose produce failed: a tombstone at the same
    /// timestamp wins over the row's cells, and any worker write (later) over it.
    pub async fn delete_submitted(&self, job_id: &str, submitted_at: Millis) -> Result<(), StoreError> {
        let ts = submitted_at.saturating_mul(1000);
        self.session.execute_unpaged(&self.delete_submitted, (ts, job_id)).await.map_err(q("delete submitted job"))?;
        Ok(())
    }

    /// Writes events to their jobs' histories (concurrently, a bounded number at once).
    pub async fn put_events(&self, events: &[JobEvent], ttl_secs: i32) -> Result<(), StoreError> {
        for chunk in events.chunks(32) {
            let mut writes = Vec::with_capacity(chunk.len());
            for e in chunk {
                let v = (
                    e.job_id.as_str(),
                    e.at,
                    e.event_id.as_str(),
                    e.tenant.as_str(),
                    e.job_type.as_str(),
                    e.kind.as_str(),
                    e.attempt,
                    e.worker.as_deref(),
                    e.progress,
                    e.message.as_deref(),
                    e.next_attempt_at,
                    ttl_secs,
                );
                writes.push(self.session.execute_unpaged(&self.put_event, v));
            }
            for r in futures::future::join_all(writes).await {
                r.map_err(q("put job events"))?;
            }
        }
        Ok(())
    }

    /// A job's history, oldest first (at most [`HISTORY_LIMIT`]), from `since` when given.
    pub async fn events(&self, job_id: &str, since: Option<Millis>) -> Result<Vec<JobEvent>, StoreError> {
        let res = match since {
            Some(t) => self.session.execute_unpaged(&self.get_events_since, (job_id, t)).await,
            None => self.session.execute_unpaged(&self.get_events, (job_id,)).await,
        }
        .map_err(q("get job events"))?;
        let rows = res.into_rows_result().map_err(q("get job events"))?;
        let it = rows.rows::<EventRow>().map_err(q("get job events"))?;
        let mut out = Vec::new();
        for r in it {
            if let Some(e) = from_row(r.map_err(q("get job events"))?) {
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Claims an idempotency key for `job_id` (LWT), or says who holds it since when.
    pub async fn claim_key(
        &self,
        tenant: &str,
        key: &str,
        job_id: &str,
        now: Millis,
        ttl_secs: i32,
    ) -> Result<IdempotencyClaim, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.claim_key, (tenant, key, job_id, now, ttl_secs))
            .await
            .map_err(q("claim idempotency key"))?;
        let rows = res.into_rows_result().map_err(q("claim idempotency key"))?;
        let row = rows.maybe_first_row::<scylla::value::Row>().map_err(q("claim idempotency key"))?;
        let Some(row) = row else { return Ok(IdempotencyClaim::Claimed) };
        use scylla::value::CqlValue;
        if matches!(row.columns.first(), Some(Some(CqlValue::Boolean(true)))) {
            return Ok(IdempotencyClaim::Claimed);
        }
        // Not applied: the existing row's columns follow [applied] (tenant and key are
        // text too; the job id is the one that parses as a UUID).
        let mut held = String::new();
        let mut at = 0;
        for c in row.columns.iter().skip(1).flatten() {
            match c {
                CqlValue::Text(s) if uuid::Uuid::parse_str(s).is_ok() => held = s.clone(),
                CqlValue::BigInt(v) => at = *v,
                _ => {}
            }
        }
        Ok(IdempotencyClaim::Held { job_id: held, at })
    }

    /// Releases a key this submission claimed for `job_id` (its produce failed). True if
    /// it was released (false: someone else holds it now).
    pub async fn release_key(&self, tenant: &str, key: &str, job_id: &str) -> Result<bool, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.release_key, (tenant, key, job_id))
            .await
            .map_err(q("release idempotency key"))?;
        super::applied(res)
    }

    /// Moves an orphaned key from `old` (a job that was never produced) to `new`.
    #[allow(clippy::too_many_arguments)]
    pub async fn take_over_key(
        &self,
        tenant: &str,
        key: &str,
        old: &str,
        new: &str,
        now: Millis,
        ttl_secs: i32,
    ) -> Result<bool, StoreError> {
        let res = self
            .session
            .execute_unpaged(&self.take_over_key, (ttl_secs, new, now, tenant, key, old))
            .await
            .map_err(q("take over idempotency key"))?;
        super::applied(res)
    }
}

/// Writes submissions' rows: whatever is waiting goes in one unlogged batch, a bounded
/// number of batches in flight (the state writes' coalescer).
async fn write_submitted(session: Arc<Session>, stmt: PreparedStatement, rx: mpsc::Receiver<SubmittedReq>) {
    super::coalesce::write_loop(session, stmt, rx, "put submitted jobs").await
}
