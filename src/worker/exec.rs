//! Running one job: the effectively-once check, the handler under its deadline, and the
//! durable outcome (state in the store, then the result, retry or dead letter on Kafka).
//! The job's offset is released to the commit tracker only after its outcome is durable,
//! so a crash anywhere in here redelivers the job instead of losing it.

use super::Shared;
use crate::core::breaker::Admission;
use crate::core::retry::{AttemptState, Decision};
use crate::handlers::{HandlerError, JobContext, JobLive};
use crate::model::{DeadLetter, FailureClass, JobResult, JobStatus, JobSubmitted, Pool};
use crate::store::{JobRow, StateUpdate};
use crate::{codec, kafka, metrics as m, now_ms};
use std::sync::Arc;
use std::time::Duration;

/// Where a message came from (for dead letters and commits).
#[derive(Debug, Clone)]
pub struct Origin {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// How an execution ended, for the scheduler's accounting and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The handler ran (whatever its outcome).
    Ran,
    /// Not run: already finished, cancelled, expired, stale duplicate, or deferred.
    Skipped,
    /// Its outcome could not be made durable (Kafka and the store both refused): its
    /// offset must stay uncommitted so the job is redelivered, never lost.
    NotDurable,
}

impl Ended {
    fn or_lost(self, durable: bool) -> Ended {
        if durable {
            self
        } else {
            Ended::NotDurable
        }
    }
}

/// A job that is not started within this time of its dispatch gets a "running" row
/// only if it outlives this grace: most short jobs then cost one terminal write.
const RUNNING_WRITE_GRACE: Duration = Duration::from_millis(250);

/// Gives a job's scheduler slot back. The slot is released as soon as the handler
/// returns (the tenant is charged for handler time, not for our own bookkeeping);
/// dropped unreleased, it releases without a run (the job was skipped).
pub struct SlotRelease(Option<Box<dyn FnOnce(bool) + Send>>);

impl SlotRelease {
    pub fn new(f: impl FnOnce(bool) + Send + 'static) -> Self {
        SlotRelease(Some(Box::new(f)))
    }
    /// `ran`: a handler really ran, so its time teaches the cost estimate.
    pub fn release(&mut self, ran: bool) {
        if let Some(f) = self.0.take() {
            f(ran)
        }
    }
}

impl Drop for SlotRelease {
    fn drop(&mut self) {
        self.release(false)
    }
}

/// When a job reached the worker and got its slot (epoch ms).
#[derive(Debug, Clone, Copy)]
pub struct Waited {
    pub received_at: i64,
    pub dispatched_at: i64,
}

impl Waited {
    /// Records where a job's wait went: the broker hop, the fair queue, the check.
    fn record(&self, sh: &Shared, job: &JobSubmitted, started_at: i64) {
        let pool = sh.pool.as_str();
        let fetch = (self.received_at - job.submitted_at).max(0);
        let queue = (self.dispatched_at - self.received_at).max(0);
        let check = (started_at - self.dispatched_at).max(0);
        for (stage, ms) in [("fetch", fetch), ("queue", queue), ("check", check)] {
            metrics::histogram!(m::JOB_WAIT_SECONDS, "pool" => pool, "stage" => stage).record(ms as f64 / 1000.0);
        }
        tracing::debug!(target: "fairway::timeline", job_id = %job.job_id, tenant = %job.tenant, fetch, queue, check, "started");
    }
}

pub async fn execute(
    sh: Arc<Shared>,
    job: Arc<JobSubmitted>,
    origin: Origin,
    mut slot: SlotRelease,
    waited: Waited,
) -> Ended {
    let job = match precheck(&sh, job, &origin).await {
        Check::Run(job) => job,
        Check::Done(durable) => return Ended::Skipped.or_lost(durable),
    };
    let Some(handler) = sh.registry.get(&job.job_type) else {
        let err = HandlerError::permanent(format!(
            "no handler for job type {:?} on this worker; add it to [job_types] or register a Rust handler",
            job.job_type
        ));
        let durable = fail(&sh, &job, &origin, err, None).await;
        return Ended::Skipped.or_lost(durable);
    };

    if let Admission::Rejected { retry_at } =
        sh.admit(&job.job_type, &job.tenant, job.attempt == 0 && job.crash_count == 0, now_ms())
    {
        // The job type's dependency is failing: hold the job back (no attempt used)
        // on the dependency retry topic until the breaker lets a probe through.
        metrics::counter!(m::BREAKER_REJECTIONS, "job_type" => sh.bounded_job_type(&job.job_type)).increment(1);
        let durable = hold_back(&sh, &job, retry_at).await;
        return Ended::Skipped.or_lost(durable);
    }

    let started_at = now_ms();
    waited.record(&sh, &job, started_at);
    let timeout = sh.job_timeout(&job.job_type);
    let deadline = tokio::time::Instant::now() + timeout;
    let live = Arc::new(JobLive::default());
    let ctx = JobContext::new(job.clone(), deadline, live.clone(), Some(sh.store.clone()));
    {
        let mut running = sh.running.lock().expect("running map");
        running.insert(job.job_id.clone(), live.clone());
        // Started while the pool hands its jobs off (it was in its pre-run checks): ask it
        // to stop at once, as `request_stop_all` did for the others (same lock).
        if sh.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            live.request_stop();
        }
    }
    metrics::gauge!(m::JOBS_RUNNING, "pool" => sh.pool.as_str()).increment(1.0);

    let mut run = std::pin::pin!(tokio::time::timeout_at(deadline, handler.run(ctx)));
    let mut running_written = false;
    let result = tokio::select! {
        r = &mut run => Some(r),
        _ = live.aborted() => None,
        _ = tokio::time::sleep(RUNNING_WRITE_GRACE) => {
            // Outlived the grace: record it as running, with a first heartbeat and an
            // entry the reaper watches, so a dead or hung worker is noticed.
            let u = update(&sh, &job, "running", Some(started_at), None);
            let encoded = codec::encode_job(&job).unwrap_or_default();
            match sh.store.put_running_with_heartbeat(&u, &encoded, now_ms(), sh.heartbeat_ttl_secs()).await {
                Ok(()) => running_written = true,
                Err(e) => tracing::warn!(job_id = %job.job_id, error = %e, "could not record running state"),
            }
            tokio::select! {
                r = &mut run => Some(r),
                _ = live.aborted() => None,
            }
        }
    };
    slot.release(result.is_some());
    sh.running.lock().expect("running map").remove(&job.job_id);
    // The worker is shutting down and the job stopped without finishing: hand it off
    // (another worker resumes it from its checkpoint; no attempt used, no crash).
    if live.is_stopping() && !live.is_cancelled() && !matches!(result, Some(Ok(Ok(_)))) {
        metrics::gauge!(m::JOBS_RUNNING, "pool" => sh.pool.as_str()).decrement(1.0);
        let durable = hand_off(&sh, &job, started_at).await;
        if running_written {
            if let Err(e) = sh.store.delete_running_job(sh.pool.as_str(), &job.job_id).await {
                tracing::debug!(job_id = %job.job_id, error = %e, "could not clear running index");
            }
        }
        return Ended::Skipped.or_lost(durable);
    }
    metrics::gauge!(m::JOBS_RUNNING, "pool" => sh.pool.as_str()).decrement(1.0);
    let run_ms = (now_ms() - started_at).max(0) as f64;
    metrics::histogram!(m::JOB_RUN_SECONDS, "pool" => sh.pool.as_str()).record(run_ms / 1000.0);

    // Outcome for the breaker and poison detector; a cancelled job gives no verdict.
    let verdict = match &result {
        Some(Ok(Ok(_))) => Some(None),
        Some(Ok(Err(e))) if !live.is_cancelled() => Some(Some(e.class)),
        Some(Err(_)) => Some(Some(FailureClass::Timeout)),
        _ => None,
    };
    if let Some(failure) = verdict {
        sh.record_outcome(&job.job_type, failure, now_ms());
    }
    let durable = match result {
        None => {
            let msg = "cancelled: the handler did not stop within worker.cancel_grace and was aborted".to_string();
            finish(&sh, &job, JobStatus::Cancelled, None, Some(msg), None, Some(started_at)).await
        }
        Some(Ok(Ok(output))) => {
            finish(&sh, &job, JobStatus::Succeeded, Some(output), None, None, Some(started_at)).await
        }
        Some(Ok(Err(err))) if live.is_cancelled() => {
            let msg = format!("cancelled while running ({})", err.message);
            finish(&sh, &job, JobStatus::Cancelled, None, Some(msg), None, Some(started_at)).await
        }
        Some(Ok(Err(err))) => fail(&sh, &job, &origin, err, Some(started_at)).await,
        Some(Err(_)) => {
            let err = HandlerError {
                class: FailureClass::Timeout,
                message: format!("deadline of {timeout:?} passed"),
                retry_after: None,
            };
            fail(&sh, &job, &origin, err, Some(started_at)).await
        }
    };
    if running_written {
        if let Err(e) = sh.store.delete_running_job(sh.pool.as_str(), &job.job_id).await {
            tracing::debug!(job_id = %job.job_id, error = %e, "could not clear running index");
        }
    }
    Ended::Ran.or_lost(durable)
}

/// Hands a stopped job to the next worker: its row marked `handed_off` (so the new owner
/// starts it at once instead of waiting for this worker's heartbeat to lapse), then a
/// copy on its pool topic (attempt and crash count unchanged). Marked first: a copy read
/// before the mark would find the job `running` with a fresh heartbeat and wait.
async fn hand_off(sh: &Shared, job: &JobSubmitted, started_at: i64) -> bool {
    let u = update(sh, job, "handed_off", Some(started_at), None);
    if let Err(e) = with_retries(|| sh.store.put_state(&u, now_ms())).await {
        // The copy waits for this worker's heartbeat to lapse instead: slower, not lost.
        tracing::warn!(job_id = %job.job_id, error = %e, "could not mark the hand-off");
    }
    if !produce_job(sh, &sh.cfg.pool_topic(sh.pool), job, "hand off").await {
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
    match codec::encode_job(job) {
        Ok(bytes) => match with_retries(|| kafka::send(&sh.producer, topic, &job.tenant, &bytes)).await {
            Ok(_) => true,
            Err(e) => {
                tracing::error!(job_id = %job.job_id, error = %e, "cannot {what} job; it will be redelivered");
                false
            }
        },
        // Our own records always encode; treat the impossible as handled.
        Err(e) => {
            tracing::error!(job_id = %job.job_id, error = %e, "cannot encode job to {what}");
            true
        }
    }
}

/// Puts a job back on the dependency retry topic, attempt unchanged, due at `at`.
async fn hold_back(sh: &Shared, job: &JobSubmitted, at: i64) -> bool {
    let mut next = job.clone();
    next.not_before = Some(at);
    produce_job(sh, &sh.cfg.retry_topic(FailureClass::Dependency), &next, "hold back").await
}

enum Check {
    Run(Arc<JobSubmitted>),
    /// Handled without running; false if that outcome could not be made durable.
    Done(bool),
}

/// The effectively-once check, before any handler runs: finished, stale, cancelled,
/// expired, scheduled for later, or running elsewhere (rebalance safety).
async fn precheck(sh: &Shared, job: Arc<JobSubmitted>, origin: &Origin) -> Check {
    let mut job = job;
    let interval = sh.cfg.pool(sh.pool).heartbeat_interval;
    // Record the partition's dispatch frontier past this offset before it can start, and
    // learn whether anyone can have started it before (then its state needs no read).
    let fresh = match with_retries(|| sh.frontiers.before_start(&sh.store, &job, origin)).await {
        Ok(fresh) => fresh,
        Err(e) => {
            tracing::warn!(job_id = %job.job_id, error = %e, "store unavailable for the dispatch frontier");
            let err = HandlerError { class: FailureClass::WorkerCrash, message: e.to_string(), retry_after: None };
            return Check::Done(fail(sh, &job, origin, err, None).await);
        }
    };
    if fresh {
        metrics::counter!(m::STATE_READS_SKIPPED, "pool" => sh.pool.as_str()).increment(1);
    }
    while !fresh {
        let row = match with_retries(|| sh.store.job(&job.job_id)).await {
            Ok(r) => r,
            Err(e) => {
                // The store is down: failing the job would be wrong, skipping it would
                // lose it. Hand it back as a worker-side failure so it is retried later.
                tracing::warn!(job_id = %job.job_id, error = %e, "store unavailable for the effectively-once check");
                let err = HandlerError { class: FailureClass::WorkerCrash, message: e.to_string(), retry_after: None };
                return Check::Done(fail(sh, &job, origin, err, None).await);
            }
        };
        let now = now_ms();
        let Some(row) = row else { break };
        // Generations ("rerun all"): the row records the generation last run. A copy of
        // an older generation is superseded; a newer one runs even if the job finished.
        let row_gen = row.generation.unwrap_or(0);
        if job.generation < row_gen {
            metrics::counter!(m::JOBS_SKIPPED, "pool" => sh.pool.as_str(), "reason" => "superseded").increment(1);
            return Check::Done(true);
        }
        let rerun = job.generation > row_gen;
        if row.is_terminal() && !rerun {
            // Redelivered after it finished: make sure its result exists, never rerun it.
            let published = republish_result(sh, &job, &row).await;
            metrics::counter!(m::JOBS_SKIPPED, "pool" => sh.pool.as_str(), "reason" => "finished").increment(1);
            return Check::Done(published);
        }
        if !rerun && row.attempts.unwrap_or(0) > job.attempt {
            // A stale copy: a later attempt of this job already exists on a retry topic.
            metrics::counter!(m::JOBS_SKIPPED, "pool" => sh.pool.as_str(), "reason" => "stale_attempt").increment(1);
            return Check::Done(true);
        }
        if row.cancel_requested == Some(true) {
            let msg = "cancelled before it started".to_string();
            return Check::Done(finish(sh, &job, JobStatus::Cancelled, None, Some(msg), None, None).await);
        }
        if row.status.as_deref() == Some("handed_off") {
            // Handed off by a draining worker: several copies may find it so (the
            // hand-off copy, a redelivery after the rebalance); one claims it, atomically.
            match with_retries(|| sh.store.claim_hand_off(&job.job_id, &sh.worker_id, now_ms())).await {
                Ok(true) => {
                    // A heartbeat at once: other copies now see it running and wait.
                    let ttl = sh.heartbeat_ttl_secs();
                    let hb = sh.store.put_heartbeat(
                        &job.job_id,
                        &sh.worker_id,
                        now_ms(),
                        0.0,
                        "claimed after a hand-off",
                        ttl,
                    );
                    if let Err(e) = hb.await {
                        tracing::warn!(job_id = %job.job_id, error = %e, "could not heartbeat a claimed job");
                    }
                    break;
                }
                Ok(false) => continue, // another copy claimed it: look again
                Err(e) => {
                    tracing::warn!(job_id = %job.job_id, error = %e, "store unavailable to claim a handed-off job");
                    let err =
                        HandlerError { class: FailureClass::WorkerCrash, message: e.to_string(), retry_after: None };
                    return Check::Done(fail(sh, &job, origin, err, None).await);
                }
            }
        }
        if row.status.as_deref() != Some("running") {
            break;
        }
        // Marked running: by a worker that still heartbeats (the partition moved while
        // the job runs) we wait; by one whose heartbeat lapsed, we take over.
        let hb = sh.store.heartbeat(&job.job_id).await.ok().flatten();
        let fresh = hb.and_then(|h| h.at).is_some_and(|at| now - at < 3 * interval.as_millis() as i64);
        if fresh {
            metrics::counter!(m::JOBS_DEFERRED, "pool" => sh.pool.as_str()).increment(1);
            tokio::time::sleep(interval).await;
            continue;
        }
        // Worker crash: never uses up an attempt, but counts towards the crash limit.
        let crashes = job.crash_count.max(row.crash_count.unwrap_or(0) + 1);
        let state = AttemptState { attempt: job.attempt, crash_count: crashes - 1, last_error: row.error.clone() };
        let policy = sh.retry_policy(&job.job_type);
        if let (_, Decision::DeadLetter { reason }) =
            sh.decide(FailureClass::WorkerCrash, &job.job_type, &job.tenant, &state, &policy, now)
        {
            let dl = dead_letter(
                sh,
                Some(&job),
                None,
                FailureClass::Poison,
                reason.clone(),
                row.error.clone(),
                job.attempt,
                origin,
            )
            .await;
            let fin = finish(sh, &job, JobStatus::Failed, None, Some(reason), Some(FailureClass::Poison), None).await;
            return Check::Done(dl && fin);
        }
        metrics::counter!(m::JOBS_TAKEN_OVER, "pool" => sh.pool.as_str()).increment(1);
        let mut j = (*job).clone();
        j.crash_count = crashes;
        job = Arc::new(j);
        break;
    }
    if let Some(not_after) = job.not_after {
        let now = now_ms();
        if now > not_after {
            let msg = format!("not started before not_after ({not_after}); picked at {now}");
            return Check::Done(finish(sh, &job, JobStatus::Expired, None, Some(msg), None, None).await);
        }
    }
    Check::Run(job)
}

fn update<'a>(
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

/// Records a terminal outcome: state first (so a redelivery is recognised as finished),
/// then the result record (republished from the state if we crash in between).
pub(crate) async fn finish(
    sh: &Shared,
    job: &JobSubmitted,
    status: JobStatus,
    output: Option<Vec<u8>>,
    error: Option<String>,
    class: Option<FailureClass>,
    started_at: Option<i64>,
) -> bool {
    let finished_at = now_ms();
    let mut u = update(sh, job, status.as_str(), started_at, Some(finished_at));
    u.error = error.as_deref();
    u.failure_class = class.map(|c| c.as_str());
    u.output = output.as_deref();
    // Attempts recorded: the ones used before plus this one, unless it never ran.
    let attempts = if started_at.is_some() { job.attempt + 1 } else { job.attempt };
    u.attempts = attempts;
    let stored = with_retries(|| sh.store.put_state(&u, finished_at)).await;
    if let Err(e) = stored {
        tracing::error!(job_id = %job.job_id, error = %e, "could not record the outcome; the job will be redelivered");
    }
    let result = JobResult {
        job_id: job.job_id.clone(),
        tenant: job.tenant.clone(),
        job_type: job.job_type.clone(),
        pool: sh.pool,
        status,
        output,
        error,
        failure_class: class,
        attempts,
        generation: job.generation,
        submitted_at: job.submitted_at,
        started_at,
        finished_at,
        worker_id: sh.worker_id.clone(),
    };
    // Durable once the result is out: a redelivery finds the stored state and
    // republishes it; without the result the offset must stay uncommitted.
    let published = publish_result(sh, &result).await;
    metrics::counter!(m::JOBS_FINISHED, "pool" => sh.pool.as_str(), "status" => status.as_str()).increment(1);
    let e2e = (finished_at - job.submitted_at).max(0) as f64 / 1000.0;
    metrics::histogram!(m::JOB_END_TO_END_SECONDS, "pool" => sh.pool.as_str()).record(e2e);
    published
}

async fn publish_result(sh: &Shared, result: &JobResult) -> bool {
    let bytes = match codec::encode_result(result) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(job_id = %result.job_id, error = %e, "cannot encode result");
            return true;
        }
    };
    let topic = sh.cfg.results_topic();
    match with_retries(|| kafka::send(&sh.producer, &topic, &result.tenant, &bytes)).await {
        Ok(_) => true,
        Err(e) => {
            tracing::error!(job_id = %result.job_id, error = %e, "cannot publish result");
            false
        }
    }
}

async fn republish_result(sh: &Shared, job: &JobSubmitted, row: &JobRow) -> bool {
    let status = match row.status.as_deref() {
        Some("succeeded") => JobStatus::Succeeded,
        Some("cancelled") => JobStatus::Cancelled,
        Some("expired") => JobStatus::Expired,
        _ => JobStatus::Failed,
    };
    let result = JobResult {
        job_id: job.job_id.clone(),
        tenant: job.tenant.clone(),
        job_type: job.job_type.clone(),
        pool: sh.pool,
        status,
        output: row.output.clone(),
        error: row.error.clone(),
        failure_class: row.failure_class.as_deref().and_then(|c| c.parse().ok()),
        attempts: row.attempts.unwrap_or(job.attempt),
        generation: row.generation.unwrap_or(job.generation),
        submitted_at: job.submitted_at,
        started_at: row.started_at,
        finished_at: row.finished_at.unwrap_or_else(now_ms),
        worker_id: row.worker.clone().unwrap_or_default(),
    };
    publish_result(sh, &result).await
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
    let topic = sh.cfg.dlq_topic();
    let produced = match codec::encode_dead_letter(&dl) {
        Ok(bytes) => match with_retries(|| kafka::send(&sh.producer, &topic, key, &bytes)).await {
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
    };
    let jt = job.map(|j| sh.bounded_job_type(&j.job_type)).unwrap_or_else(|| "unknown".to_string());
    metrics::counter!(m::DEAD_LETTERS, "class" => class.as_str(), "job_type" => jt).increment(1);
    produced
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

pub fn pool_of(job: &JobSubmitted, default: Pool) -> Pool {
    job.pool.unwrap_or(default)
}
