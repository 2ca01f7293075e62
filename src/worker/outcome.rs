//! Stage 4 of a job's route (see `exec`): recording its outcome durably. A terminal
//! outcome (state and result), a retry on its class's topic, a dead letter, or a hand-off
//! to the next worker. Each returns whether the outcome is durable: only then may the
//! job's offset be committed (see `route::Ended::NotDurable`).

use super::route::{Ended, Origin, Run};
use super::Shared;
use crate::config::Config;
use crate::core::retry::{AttemptState, Decision};
use crate::handlers::HandlerError;
use crate::kafka::Producer;
use crate::model::{DeadLetter, FailureClass, JobResult, JobStatus, JobSubmitted};
use crate::store::StateUpdate;
use crate::{codec, kafka, metrics as m, now_ms};
use std::time::Duration;

/// Stage 4: records how a run ended. A job stopped for the worker's shutdown (and not
/// finished) is handed off; otherwise its verdict feeds the breaker and poison detector
/// and it ends succeeded, cancelled, retried or dead-lettered.
pub(super) async fn record(sh: &Shared, job: &JobSubmitted, origin: &Origin, run: &Run) -> Ended {
    let Run { started_at, timeout, result, live, .. } = run;
    let started_at = *started_at;
    // Silent past `stuck_after`: dead-lettered with the reason, whatever it returned.
    if let Some(reason) = live.stuck_reason() {
        let last_error = match result {
            Some(Ok(Err(e))) => Some(e.message.clone()),
            _ => None,
        };
        return Ended::Ran
            .or_lost(dead_letter_stuck(sh, job, origin, reason.to_string(), last_error, started_at).await);
    }
    // The worker is shutting down and the job stopped without finishing: hand it off
    // (another worker resumes it from its checkpoint; no attempt used, no crash).
    if live.is_stopping() && !live.is_cancelled() && !matches!(result, Some(Ok(Ok(_)))) {
        return Ended::Skipped.or_lost(hand_off(sh, job).await);
    }
    let run_ms = (now_ms() - started_at).max(0) as f64;
    metrics::histogram!(m::JOB_RUN_SECONDS, "pool" => sh.pool.as_str()).record(run_ms / 1000.0);
    // Outcome for the breaker and poison detector; a cancelled job gives no verdict.
    let verdict = match result {
        Some(Ok(Ok(_))) => Some(None),
        Some(Ok(Err(e))) if !live.is_cancelled() => Some(Some(e.class)),
        Some(Err(_)) => Some(Some(FailureClass::Timeout)),
        _ => None,
    };
    if let Some(failure) = verdict {
        sh.record_outcome(&job.job_type, &job.tenant, failure, now_ms());
        sh.record_run(&job.job_type, &job.tenant, run_ms as crate::model::Millis, now_ms());
    }
    let started = Some(started_at);
    let durable = match result {
        Some(Ok(Err(_))) | None if live.is_expired() => {
            let msg = format!("not finished before not_after ({}): cancelled at it", job.not_after.unwrap_or_default());
            finish(sh, job, JobStatus::Expired, None, Some(msg), None, started).await
        }
        None => {
            let msg = "cancelled: the handler did not stop within worker.cancel_grace and was aborted".to_string();
            finish(sh, job, JobStatus::Cancelled, None, Some(msg), None, started).await
        }
        Some(Ok(Ok(output))) => {
            let result = result_of(sh, job, JobStatus::Succeeded, Some(output.clone()), None, None, started);
            record_end(sh, job, &result, run.plain()).await
        }
        Some(Ok(Err(err))) if live.is_cancelled() => {
            let msg = format!("cancelled while running ({})", err.message);
            finish(sh, job, JobStatus::Cancelled, None, Some(msg), None, started).await
        }
        Some(Ok(Err(err))) => fail(sh, job, origin, err.clone(), started).await,
        Some(Err(_)) => {
            let message = format!("deadline of {timeout:?} passed");
            let err = HandlerError { class: FailureClass::Timeout, message, retry_after: None };
            fail(sh, job, origin, err, started).await
        }
    };
    Ended::Ran.or_lost(durable)
}

/// Hands a stopped job to the next worker: its hand-off count raised (in the store for
/// whichever copy claims it, and on the copy), its row marked `handed_off` (so the new
/// owner starts it at once instead of waiting for this worker's heartbeat to lapse), then
/// a copy on its pool topic (attempt and crash count unchanged). Marked first: a copy read
/// before the mark would find the job `running` with a fresh heartbeat and wait. The mark
/// is conditional on the row still showing the job running here: a slow dying worker
/// never overwrites the state of a worker that took the job over meanwhile.
pub(super) async fn hand_off(sh: &Shared, job: &JobSubmitted) -> bool {
    let handoffs = job.handoff_count.saturating_add(1);
    let count = || sh.store.put_handoff_count(&job.job_id, job.generation, handoffs);
    if let Err(e) = with_retries(count).await {
        // Only the copy below carries the count then: a redelivered older copy that
        // claims the job first is still told it was handed off (`check::claim_hand_off`).
        tracing::warn!(job_id = %job.job_id, error = %e, "could not record the hand-off count");
    }
    match with_retries(|| sh.store.mark_handed_off(&job.job_id, &sh.worker_id, now_ms())).await {
        Ok(true) => {}
        // Another worker runs it now (its state stays), it ended, or it never got a
        // running row here (stopped within its first 250 ms): the copy below is
        // checked against the row like any redelivery.
        Ok(false) => {
            tracing::info!(job_id = %job.job_id, "hand-off not marked: the job's row does not show it running here")
        }
        // The copy waits for this worker's heartbeat to lapse instead: slower, not lost.
        Err(e) => tracing::warn!(job_id = %job.job_id, error = %e, "could not mark the hand-off"),
    }
    // A copy, not a submission: never "fresh", so it always reads (and claims) the row.
    let mut copy = job.clone();
    copy.not_before = Some(now_ms());
    copy.handoff_count = handoffs;
    if !produce_job(sh, &sh.cfg.pool_topic(sh.pool), &copy, "hand off").await {
        return false;
    }
    metrics::counter!(m::HAND_OFFS, "pool" => sh.pool.as_str()).increment(1);
    tracing::info!(job_id = %job.job_id, "handed off to the next worker");
    true
}

/// Sends a job whose `execute_at` is ahead to the delayed topic (due at `execute_at`).
pub(crate) async fn delay(sh: &Shared, job: JobSubmitted) -> bool {
    let mut next = job;
    next.not_before = next.execute_at;
    produce_job(sh, &sh.cfg.delayed_topic(), &next, "delay").await
}

/// Produces a job record and waits for the ack; false if it could not be made durable.
async fn produce_job(sh: &Shared, topic: &str, job: &JobSubmitted, what: &str) -> bool {
    let headers = kafka::trace_headers(job);
    let Some(bytes) = encoded(codec::encode_job(job), &job.job_id, what) else { return false };
    match with_retries(|| kafka::send_with_headers(&sh.producer, topic, &job.tenant, &bytes, &headers)).await {
        Ok(_) => true,
        Err(e) => {
            tracing::error!(job_id = %job.job_id, error = %e, "cannot {what} job; it will be redelivered");
            false
        }
    }
}

/// The bytes of a record to produce, or None when it cannot be encoded: then nothing is
/// produced and the outcome is not durable (the job's offset stays uncommitted and it is
/// redelivered), logged as an error. An encode error never counts as done.
fn encoded(bytes: Result<Vec<u8>, codec::CodecError>, job_id: &str, what: &str) -> Option<Vec<u8>> {
    match bytes {
        Ok(b) => Some(b),
        Err(e) => {
            tracing::error!(job_id, error = %e, "cannot encode the record to {what}; the job will be redelivered");
            None
        }
    }
}

/// Puts a copy of a job back on its pool topic (attempt unchanged), to be read again.
pub(super) async fn requeue(sh: &Shared, job: &JobSubmitted) -> bool {
    produce_job(sh, &sh.cfg.pool_topic(sh.pool), job, "requeue").await
}

/// Puts a job back on the dependency retry topic, attempt unchanged, due at `at`.
pub(super) async fn hold_back(sh: &Shared, job: &JobSubmitted, at: i64) -> bool {
    let mut next = job.clone();
    next.not_before = Some(at);
    produce_job(sh, &sh.cfg.retry_topic(FailureClass::Dependency), &next, "hold back").await
}

pub(super) fn update<'a>(
    sh: &'a Shared,
    job: &'a JobSubmitted,
    status: &'a str,
    started_at: Option<i64>,
    finished_at: Option<i64>,
) -> StateUpdate<'a> {
    StateUpdate {
        job_id: &job.job_id,
        tenant: &job.tenant,
        job_type: &job.job_type,
        pool: sh.pool.as_str(),
        status,
        attempts: job.attempt,
        crash_count: job.crash_count,
        generation: job.generation,
        submitted_at: job.submitted_at,
        started_at,
        finished_at,
        worker: &sh.worker_id,
        error: None,
        failure_class: None,
        output: None,
    }
}

/// Records a terminal outcome, result first: the result record is published and
/// acknowledged by the broker, then the terminal state is written. So a stored terminal
/// state always means its result is on the results topic, and a redelivered copy of a
/// finished job is skipped without publishing again (see `check`). The one window left
/// for a duplicate result is a crash (or a store failure) between the result's
/// acknowledgement and the state write; a results consumer can drop it by
/// (job id, generation, attempts). Not durable (the offset stays uncommitted, the job is
/// redelivered and runs again) if either step fails.
pub(crate) async fn finish(
    sh: &Shared,
    job: &JobSubmitted,
    status: JobStatus,
    output: Option<Vec<u8>>,
    error: Option<String>,
    class: Option<FailureClass>,
    started_at: Option<i64>,
) -> bool {
    let result = result_of(sh, job, status, output, error, class, started_at);
    record_end(sh, job, &result, false).await
}

/// A job's result as published (and, through `record_end`, stored).
fn result_of(
    sh: &Shared,
    job: &JobSubmitted,
    status: JobStatus,
    output: Option<Vec<u8>>,
    error: Option<String>,
    failure_class: Option<FailureClass>,
    started_at: Option<i64>,
) -> JobResult {
    JobResult {
        job_id: job.job_id.clone(),
        tenant: job.tenant.clone(),
        job_type: job.job_type.clone(),
        pool: sh.pool,
        status,
        output,
        error,
        failure_class,
        // Attempts recorded: the ones used before plus this one, unless it never ran.
        attempts: if started_at.is_some() { job.attempt + 1 } else { job.attempt },
        generation: job.generation,
        submitted_at: job.submitted_at,
        started_at,
        finished_at: now_ms(),
        worker_id: sh.worker_id.clone(),
    }
}

/// The end of `finish`: the result published, then the terminal state stored. `plain`:
/// the job has a UUIDv7 id, succeeded, and no `jobs` row holds a claim on it (it was
/// never marked running nor claimed after a hand-off), so its state is a finished record
/// grouped with others (`core::finished`) rather than a row of its own.
async fn record_end(sh: &Shared, job: &JobSubmitted, result: &JobResult, plain: bool) -> bool {
    if !publish_result(sh, result, job).await {
        return false;
    }
    let (status, finished_at) = (result.status, result.finished_at);
    let mut u = update(sh, job, status.as_str(), result.started_at, Some(finished_at));
    u.error = result.error.as_deref();
    u.failure_class = result.failure_class.map(|c| c.as_str());
    u.output = result.output.as_deref();
    u.attempts = result.attempts;
    let grouped = plain && status == JobStatus::Succeeded && crate::core::finished::bucket(&job.job_id).is_some();
    // The result is out: from here a failed write means a second run and a duplicate
    // result, so the write is retried through a store outage (a restart of the database
    // takes tens of seconds) before giving up; the offset stays uncommitted meanwhile.
    let written = if grouped {
        retry_through_outage(|| sh.store.put_finished(&u, finished_at)).await
    } else {
        retry_through_outage(|| sh.store.put_state(&u, finished_at)).await
    };
    if let Err(e) = written {
        tracing::error!(job_id = %job.job_id, error = %e, "result published but the outcome could not be recorded; the job will be redelivered and run again");
        metrics::counter!(m::OUTCOME_WRITE_FAILURES, "pool" => sh.pool.as_str()).increment(1);
        return false;
    }
    metrics::counter!(m::JOBS_FINISHED, "pool" => sh.pool.as_str(), "status" => status.as_str()).increment(1);
    let e2e = (finished_at - job.submitted_at).max(0) as f64 / 1000.0;
    metrics::histogram!(m::JOB_END_TO_END_SECONDS, "pool" => sh.pool.as_str()).record(e2e);
    true
}

/// Publishes a result and waits for the broker's acknowledgement. The job's W3C trace
/// context rides along as the record's `traceparent`/`tracestate` headers.
async fn publish_result(sh: &Shared, result: &JobResult, job: &JobSubmitted) -> bool {
    let Some(bytes) = encoded(codec::encode_result(result), &result.job_id, "publish result") else { return false };
    let topic = sh.cfg.results_topic();
    let headers = kafka::trace_headers(job);
    match with_retries(|| kafka::send_with_headers(&sh.producer, &topic, &result.tenant, &bytes, &headers)).await {
        Ok(_) => true,
        Err(e) => {
            tracing::error!(job_id = %result.job_id, error = %e, "cannot publish result; the job will be redelivered");
            false
        }
    }
}

/// A failed attempt: ask the retry policy, then either put the job on its class's retry
/// topic or dead-letter it (DLQ record + failed result).
/// Returns whether the outcome is durable (see `Ended::NotDurable`).
pub(crate) async fn fail(
    sh: &Shared,
    job: &JobSubmitted,
    origin: &Origin,
    err: HandlerError,
    started_at: Option<i64>,
) -> bool {
    let now = now_ms();
    metrics::counter!(m::JOB_FAILURES, "pool" => sh.pool.as_str(), "class" => err.class.as_str()).increment(1);
    let state =
        AttemptState { attempt: job.attempt, crash_count: job.crash_count, last_error: Some(err.message.clone()) };
    let policy = sh.retry_policy(&job.job_type);
    let (class, decision) = sh.decide(err.class, &job.job_type, &job.tenant, &state, &policy, now);
    match decision {
        Decision::Retry { class_topic, not_before, attempt, crash_count } => {
            let not_before = match err.retry_after {
                Some(d) => not_before.max(now + d.as_millis() as i64),
                None => not_before,
            };
            let mut next = job.clone();
            next.attempt = attempt;
            next.crash_count = crash_count;
            next.not_before = Some(not_before);
            next.last_error = Some(err.message.clone());
            next.last_failure_class = Some(err.class);
            next.first_failure_at = job.first_failure_at.or(Some(now));
            if !produce_job(sh, &sh.cfg.retry_topic(class_topic), &next, "retry").await {
                return false;
            }
            metrics::counter!(m::RETRIES, "class" => class_topic.as_str(), "job_type" => sh.bounded_job_type(&job.job_type)).increment(1);
            crate::watch::events::retrying(&sh.producer, &sh.cfg, &sh.worker_id, job, not_before, &err.message);
            let mut u = update(sh, job, "retrying", started_at, None);
            u.attempts = attempt;
            u.crash_count = crash_count;
            u.error = Some(&err.message);
            u.failure_class = Some(err.class.as_str());
            if let Err(e) = with_retries(|| sh.store.put_state(&u, now)).await {
                tracing::warn!(job_id = %job.job_id, error = %e, "could not record retrying state");
            }
            true
        }
        Decision::DeadLetter { reason } => {
            let attempts = if started_at.is_some() { job.attempt + 1 } else { job.attempt };
            let class = crate::core::retry::dead_letter_class(class);
            let dl = dead_letter(sh, Some(job), None, class, reason, Some(err.message.clone()), attempts, origin).await;
            let fin = finish(sh, job, JobStatus::Failed, None, Some(err.message), Some(class), started_at).await;
            dl && fin
        }
    }
}

/// A stuck job (`core::stuck`): straight to the DLQ as `resource` (a retry would hold
/// another slot for nothing), and its failed result.
async fn dead_letter_stuck(
    sh: &Shared,
    job: &JobSubmitted,
    origin: &Origin,
    reason: String,
    last_error: Option<String>,
    started_at: i64,
) -> bool {
    let class = FailureClass::Resource;
    metrics::counter!(m::JOB_FAILURES, "pool" => sh.pool.as_str(), "class" => class.as_str()).increment(1);
    metrics::counter!(m::STUCK_JOBS, "pool" => sh.pool.as_str()).increment(1);
    let attempts = job.attempt + 1;
    let dl = dead_letter(sh, Some(job), None, class, reason.clone(), last_error, attempts, origin).await;
    let fin = finish(sh, job, JobStatus::Failed, None, Some(reason), Some(class), Some(started_at)).await;
    dl && fin
}

/// Produces a dead letter; `raw` carries the bytes of a message that could not be decoded.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn dead_letter(
    sh: &Shared,
    job: Option<&JobSubmitted>,
    raw: Option<Vec<u8>>,
    class: FailureClass,
    reason: String,
    last_error: Option<String>,
    attempts: i32,
    origin: &Origin,
) -> bool {
    let now = now_ms();
    let dl = DeadLetter {
        job: job.cloned(),
        raw,
        failure_class: class,
        reason,
        last_error,
        attempts,
        first_failure_at: job.and_then(|j| j.first_failure_at).unwrap_or(now),
        last_failure_at: now,
        origin_topic: origin.topic.clone(),
        origin_partition: origin.partition,
        origin_offset: origin.offset,
        replay_count: job.map(|j| j.replay_count).unwrap_or(0),
    };
    let key = job.map(|j| j.tenant.as_str()).unwrap_or("");
    let produced = produce_dead_letter(&sh.cfg, &sh.producer, &dl, key).await;
    // Every path that dead-letters a job (failed attempts, poison takeovers, rejected
    // messages) tells its watchers.
    if let Some(j) = job {
        crate::watch::events::dead_lettered(&sh.producer, &sh.cfg, &sh.worker_id, j, &dl.reason);
    }
    let jt = job.map(|j| sh.bounded_job_type(&j.job_type)).unwrap_or_else(|| "unknown".to_string());
    metrics::counter!(m::DEAD_LETTERS, "class" => class.as_str(), "job_type" => jt).increment(1);
    produced
}

/// Dead-letters one of fairway's own records (a retry record, a parked scheduled job, a
/// running-index entry) that no longer decodes, with the raw bytes and the reason, instead
/// of dropping it. `origin` names where it was read (a topic, or `store:<table>`).
pub(crate) async fn dead_letter_undecodable(
    cfg: &Config,
    producer: &Producer,
    raw: Vec<u8>,
    error: &codec::CodecError,
    origin: &Origin,
) -> bool {
    let now = now_ms();
    let dl = DeadLetter {
        job: None,
        raw: Some(raw),
        failure_class: FailureClass::Permanent,
        reason: format!("fairway's own record in {} no longer decodes: {error}", origin.topic),
        last_error: None,
        attempts: 0,
        first_failure_at: now,
        last_failure_at: now,
        origin_topic: origin.topic.clone(),
        origin_partition: origin.partition,
        origin_offset: origin.offset,
        replay_count: 0,
    };
    tracing::error!(origin = %origin.topic, partition = origin.partition, offset = origin.offset, %error, "undecodable record dead-lettered");
    let produced = produce_dead_letter(cfg, producer, &dl, "").await;
    metrics::counter!(m::DEAD_LETTERS, "class" => FailureClass::Permanent.as_str(), "job_type" => "unknown")
        .increment(1);
    produced
}

/// Produces a dead letter and waits for the ack; false if it could not be made durable.
async fn produce_dead_letter(cfg: &Config, producer: &Producer, dl: &DeadLetter, key: &str) -> bool {
    let topic = cfg.dlq_topic();
    let headers = dl.job.as_ref().map(kafka::trace_headers).unwrap_or_default();
    match codec::encode_dead_letter(dl) {
        Ok(bytes) => match with_retries(|| kafka::send_with_headers(producer, &topic, key, &bytes, &headers)).await {
            Ok(_) => true,
            Err(e) => {
                tracing::error!(error = %e, "cannot produce dead letter; the message will be redelivered");
                false
            }
        },
        Err(e) => {
            tracing::error!(error = %e, "cannot encode dead letter");
            true
        }
    }
}

/// How long a write that must not fail (see `finish`) is retried: longer than a restart
/// of the database, shorter than a stuck process should hold its partition's commits.
pub(crate) const OUTAGE_RETRY: Duration = Duration::from_secs(180);

/// Retries an I/O operation with backoff (capped at 5 s) for up to `OUTAGE_RETRY`.
async fn retry_through_outage<T, E: std::fmt::Display, F, Fut>(mut f: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let give_up = tokio::time::Instant::now() + OUTAGE_RETRY;
    let mut delay = Duration::from_millis(100);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() + delay < give_up => {
                tracing::debug!(error = %e, "store write failed, retrying through the outage");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Retries a transient I/O operation a few times with backoff before giving up.
pub(crate) async fn with_retries<T, E: std::fmt::Display, F, Fut>(mut f: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut delay = Duration::from_millis(100);
    let mut tries = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tries < 4 => {
                tracing::debug!(error = %e, "transient failure, retrying");
                tries += 1;
                tokio::time::sleep(delay).await;
                delay *= 3;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{CodecError, RecordKind};

    /// An encode error in `produce_job` / `publish_result` is not durable (before, the
    /// running-row path wrote empty bytes and a failed encode could count as done).
    #[test]
    fn an_encode_error_is_never_a_durable_outcome() {
        let e = CodecError::TooShort { len: 0, expected: RecordKind::JobResult };
        assert_eq!(encoded(Err(e), "j", "publish result"), None);
        assert_eq!(encoded(Ok(vec![1, 2]), "j", "publish result"), Some(vec![1, 2]));
    }
}
