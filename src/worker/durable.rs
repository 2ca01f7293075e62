//! The durable writes of a job's route, in one place every stage calls (`check`, `exec`,
//! `settle`, and `pool`'s intake): a terminal outcome (result, then state), a dead letter,
//! a copy of the job produced again (retry, delay, requeue, hold-back, hand-off), each
//! acknowledged by the broker or the store before it counts. Each returns a [`Durable`]:
//! only `Durable::Yes` lets the job's offset be committed (see `route::Ended`). The retry
//! helpers for transient failures and store outages live here too.

use super::route::{Durable, Origin};
use super::RouteContext;
use crate::config::Config;
use crate::kafka::KafkaError;
use crate::model::{DeadLetter, FailureClass, JobResult, JobStatus, JobSubmitted, ProcessUsage};
use crate::seams::RouteBroker;
use crate::store::StateUpdate;
use crate::{codec, kafka, metrics as m, now_ms};
use std::time::Duration;

/// A terminal outcome to record: its status, what the handler returned or why the job
/// failed, when it started (`None`: it never ran, so no attempt is counted) and what its
/// process tree used (process jobs).
pub(crate) struct Terminal {
    pub status: JobStatus,
    pub output: Option<Vec<u8>>,
    pub error: Option<String>,
    pub class: Option<FailureClass>,
    pub started_at: Option<i64>,
    pub usage: Option<ProcessUsage>,
    /// The run held the job's row (it wrote its running mark): its outcome goes out only
    /// while the row is not another run's ([`taken_elsewhere`]).
    pub fenced: bool,
    /// A run that holds no claim on the job's row (no running mark, not taken over or
    /// claimed): its offset may be committed once its result is out (`early_commit`).
    pub unclaimed: bool,
}

/// The attempt that decided an outcome: when it started (`None`: it never ran) and what
/// its process tree used (process jobs).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ran {
    pub started_at: Option<i64>,
    pub usage: Option<ProcessUsage>,
    /// It wrote its own running mark (`exec::mark_running`): its `retrying` state is
    /// written only while the row still shows that mark (`settle::fail`).
    pub marked: bool,
    /// Its check took the job's row (a take-over, a claim after a hand-off).
    pub claimed: bool,
}

impl Ran {
    /// It ran, holding no claim on the job's row (`Terminal::unclaimed`).
    fn unclaimed(&self) -> bool {
        self.started_at.is_some() && !self.marked && !self.claimed
    }
}

impl Terminal {
    fn ended(status: JobStatus, error: String) -> Terminal {
        Terminal {
            status,
            output: None,
            error: Some(error),
            class: None,
            started_at: None,
            usage: None,
            fenced: false,
            unclaimed: false,
        }
    }

    /// Succeeded with the handler's output.
    pub fn succeeded(output: Vec<u8>, ran: Ran) -> Terminal {
        Terminal {
            status: JobStatus::Succeeded,
            output: Some(output),
            error: None,
            class: None,
            started_at: ran.started_at,
            usage: ran.usage,
            fenced: ran.marked,
            unclaimed: ran.unclaimed(),
        }
    }

    /// Cancelled, and why.
    pub fn cancelled(why: String) -> Terminal {
        Terminal::ended(JobStatus::Cancelled, why)
    }

    /// Expired at its `not_after`, and how.
    pub fn expired(why: String) -> Terminal {
        Terminal::ended(JobStatus::Expired, why)
    }

    /// Failed for good, with its class (it is dead-lettered beside).
    pub fn failed(why: String, class: FailureClass) -> Terminal {
        Terminal { class: Some(class), ..Terminal::ended(JobStatus::Failed, why) }
    }

    /// The same outcome of the attempt `ran`.
    pub fn ran(self, ran: Ran) -> Terminal {
        Terminal {
            started_at: ran.started_at,
            usage: ran.usage,
            fenced: ran.marked,
            unclaimed: ran.unclaimed(),
            ..self
        }
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
pub(crate) async fn record_terminal(sh: &RouteContext, job: &JobSubmitted, terminal: Terminal) -> Durable {
    let holds = Holds { plain: false, fenced: terminal.fenced, unclaimed: terminal.unclaimed };
    record_result(sh, job, &result_of(sh, job, terminal), holds).await
}

/// Records a success like [`record_terminal`]. `plain`: the job has no `jobs` row holding
/// a claim on it (it was never marked running nor claimed after a hand-off, see
/// `route::Run::plain`), so a UUIDv7 job's state may be a packed finished record
/// (`core::finished`) rather than a row of its own.
pub(super) async fn record_success(
    sh: &RouteContext,
    job: &JobSubmitted,
    output: Vec<u8>,
    ran: Ran,
    plain: bool,
) -> Durable {
    // Fenced only over its own running mark: a run that took the job over or claimed it
    // within its grace finds the row still naming the worker it took over from.
    let holds = Holds { plain, fenced: ran.marked, unclaimed: plain };
    record_result(sh, job, &result_of(sh, job, Terminal::succeeded(output, ran)), holds).await
}

/// What a run holds of the job's row, for [`record_result`].
#[derive(Clone, Copy)]
struct Holds {
    /// No row holds a claim on the job (see [`record_success`]).
    plain: bool,
    /// The run wrote its running mark: check the row before publishing.
    fenced: bool,
    /// It ran, holding no claim on the row: see [`state_refused`].
    unclaimed: bool,
}

/// A job's result as published (and, through `record_result`, stored).
fn result_of(sh: &RouteContext, job: &JobSubmitted, terminal: Terminal) -> JobResult {
    let Terminal { status, output, error, class, started_at, usage, .. } = terminal;
    JobResult {
        job_id: job.job_id.clone(),
        tenant: job.tenant.clone(),
        job_type: job.job_type.clone(),
        pool: sh.pool,
        status,
        output,
        error,
        failure_class: class,
        // Attempts recorded: the ones used before plus this one, unless it never ran.
        attempts: if started_at.is_some() { job.attempt + 1 } else { job.attempt },
        generation: job.generation,
        submitted_at: job.submitted_at,
        started_at,
        finished_at: sh.clock.now_ms(),
        worker_id: sh.worker_id.clone(),
        peak_memory_bytes: usage.map(|u| u.peak_memory_bytes),
        cpu_ms: usage.map(|u| u.cpu_ms),
    }
}

/// The result published, then the terminal state stored (packed when `plain`, see
/// [`record_success`]). A run that held the job's row first reads it: when another run
/// has taken the job over or ended it meanwhile, this outcome is dropped (no second
/// result) and the job is done here, as for a run whose mark found the job finished.
async fn record_result(sh: &RouteContext, job: &JobSubmitted, result: &JobResult, holds: Holds) -> Durable {
    let plain = holds.plain;
    if holds.fenced {
        if let Some(done) = taken_over(sh, job).await {
            return done;
        }
    }
    if !publish_result(sh, result, job).await.is_yes() {
        return Durable::No;
    }
    let (status, finished_at) = (result.status, result.finished_at);
    let mut u = update(sh, job, status.as_str(), result.started_at, Some(finished_at));
    u.error = result.error.as_deref();
    u.failure_class = result.failure_class.map(|c| c.as_str());
    u.output = result.output.as_deref();
    u.attempts = result.attempts;
    u.usage = result
        .peak_memory_bytes
        .zip(result.cpu_ms)
        .map(|(peak_memory_bytes, cpu_ms)| crate::model::ProcessUsage { peak_memory_bytes, cpu_ms });
    let packed = plain && status == JobStatus::Succeeded && crate::core::finished::pack_bucket(&job.job_id).is_some();
    let write = || async {
        if packed {
            sh.store.put_finished(&u, finished_at).await
        } else {
            // Boxed: the rarer path's future would otherwise sit in every job's future.
            Box::pin(sh.store.put_state(&u, finished_at)).await
        }
    };
    if let Err(e) = write().await {
        // Boxed: the rare path's future would otherwise sit in every job's future.
        if let Some(durable) = Box::pin(state_refused(sh, job, holds.unclaimed, e, write)).await {
            return durable;
        }
    }
    match status {
        JobStatus::Succeeded => sh.metrics.succeeded.increment(1),
        _ => metrics::counter!(m::JOBS_FINISHED, "pool" => sh.pool.as_str(), "status" => status.as_str()).increment(1),
    }
    let e2e = (finished_at - job.submitted_at).max(0) as f64 / 1000.0;
    sh.metrics.end_to_end.record(e2e);
    Durable::Yes
}

/// A terminal state write the store refused once, its result already out: from here a
/// failed write means a second run and a duplicate result, so the write is retried through
/// a store outage (a restart of the database takes tens of seconds) before giving up. A
/// run that holds no claim on the job's row (`unclaimed`: no running mark, not taken over
/// or claimed) lets its offset be committed meanwhile (`early_commit`): a rebalance during
/// the outage must not hand the record to a next owner that would run the job again.
/// `None`: written after all; else how the outcome ended.
async fn state_refused<F, Fut>(
    sh: &RouteContext,
    job: &JobSubmitted,
    unclaimed: bool,
    first: crate::store::StoreError,
    write: F,
) -> Option<Durable>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), crate::store::StoreError>>,
{
    sh.store_refused(sh.clock.now_ms());
    let early = unclaimed && super::early_commit::tell();
    // Debug, not warn: an outage refuses every job's write at once; the give-up is an error.
    tracing::debug!(job_id = %job.job_id, error = %first, offset_committed = early, "result published but its state write was refused; retrying through the outage");
    let e = match retry_through_outage(sh, write).await {
        Ok(()) => return None,
        Err(e) => e,
    };
    metrics::counter!(m::OUTCOME_WRITE_FAILURES, "pool" => sh.pool.as_str()).increment(1);
    if early {
        tracing::error!(job_id = %job.job_id, error = %e, "result published but its state could not be recorded within the outage retries; its offset is committed, so the job's state stays unrecorded (its result is on the results topic)");
        return Some(Durable::Yes);
    }
    tracing::error!(job_id = %job.job_id, error = %e, "result published but the outcome could not be recorded; the job will be redelivered and run again");
    Some(Durable::No)
}

/// Whether this run's outcome must be dropped because the job's row shows it ended or
/// running elsewhere ([`fenced_off`]); counted and logged when it must. Called before a
/// run's result and, for a run failing for good, before its dead letter too. `Some(Yes)`:
/// the job ended elsewhere (or is of a newer generation), this copy is done. `Some(No)`:
/// another run holds it; this copy is not done but taken in again, and its check then
/// follows that run (it ends the job, or its heartbeats lapse and the copy takes it
/// over): committing here would lose the job if that run died.
pub(super) async fn taken_over(sh: &RouteContext, job: &JobSubmitted) -> Option<Durable> {
    let done = match Box::pin(fenced_off(sh, job)).await {
        Fence::Mine => return None,
        Fence::Ended => Durable::Yes,
        Fence::RunningElsewhere => Durable::No,
        Fence::Unreadable => {
            metrics::counter!(m::JOBS_SKIPPED, "pool" => sh.pool.as_str(), "reason" => "row_unreadable").increment(1);
            tracing::error!(job_id = %job.job_id, "outcome held back: the job's row could not be read through the store outage; the job is taken in again (it may run again, it never has two results from here)");
            return Some(Durable::No);
        }
    };
    metrics::counter!(m::JOBS_SKIPPED, "pool" => sh.pool.as_str(), "reason" => "taken_over").increment(1);
    tracing::warn!(job_id = %job.job_id, ended_elsewhere = done.is_yes(), "outcome dropped: the job's row shows it taken over by another worker or ended meanwhile (this run's heartbeats lapsed); that run's outcome stands");
    Some(done)
}

/// What the job's row says of a run that held it.
#[derive(Debug, PartialEq, Eq)]
enum Fence {
    /// Still this run's.
    Mine,
    /// The row could not be read through a store outage ([`OUTAGE_RETRY`]).
    Unreadable,
    /// Ended, or of a newer generation.
    Ended,
    /// Running or handed off on another worker.
    RunningElsewhere,
}

/// What the job's row says of this run ([`taken_elsewhere`]), for runs that held the row
/// (jobs past their running grace). The read is retried through a store outage: a run
/// cut off from the store cannot tell whether its heartbeats lapsed and another worker
/// took the job over meanwhile, so it publishes nothing until it can (the fleet
/// simulator's seed 590: a run published during its worker's cut from the store, its
/// state write could not follow, and the take-over after the lapse ran the job again).
async fn fenced_off(sh: &RouteContext, job: &JobSubmitted) -> Fence {
    match retry_through_outage(sh, || sh.store.job(&job.job_id)).await {
        Ok(Some(row)) => taken_elsewhere(&row, &sh.worker_id, job.generation),
        Ok(None) => Fence::Mine,
        Err(e) => {
            tracing::warn!(job_id = %job.job_id, error = %e, "cannot read the job's row before publishing its outcome");
            Fence::Unreadable
        }
    }
}

/// A row that is not run `me`'s to end: a newer generation, ended (this generation), or
/// running or handed off on another worker (taken over after this run's heartbeats lapsed).
fn taken_elsewhere(row: &crate::store::JobRow, me: &str, generation: i64) -> Fence {
    let row_gen = row.generation.unwrap_or(0);
    if row_gen != generation {
        return if row_gen > generation { Fence::Ended } else { Fence::Mine };
    }
    if row.is_terminal() {
        Fence::Ended
    } else if matches!(row.status.as_deref(), Some("running" | "handed_off")) && row.worker.as_deref() != Some(me) {
        Fence::RunningElsewhere
    } else {
        Fence::Mine
    }
}

/// Publishes a result and waits for the broker's acknowledgement. The job's W3C trace
/// context rides along as the record's `traceparent`/`tracestate` headers.
async fn publish_result(sh: &RouteContext, result: &JobResult, job: &JobSubmitted) -> Durable {
    let Some(bytes) = encoded(codec::encode_result(result), &result.job_id, "publish result") else {
        return Durable::No;
    };
    let headers = kafka::trace_headers(job);
    match send_while_owned(sh, &sh.results_topic, &result.tenant, &bytes, &headers).await {
        Ok(()) => Durable::Yes,
        Err(e) => {
            tracing::error!(job_id = %result.job_id, error = %e, "cannot publish result; the job will be redelivered");
            Durable::No
        }
    }
}

/// Why an outcome's record was not sent.
#[derive(Debug, thiserror::Error)]
pub(super) enum SendError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    #[error("the job's partition was lost (no answer from the group coordinator within the session); its next owner handles the job")]
    NotOwned,
}

/// Sends an outcome's record, retried a few times ([`with_retries`]), each try only while
/// this worker owns the partition the job came from (`worker::ownership`): past that, the
/// partition's next owner may already have run the job, and a record sent now would be a
/// second outcome.
async fn send_while_owned(
    sh: &RouteContext,
    topic: &str,
    key: &str,
    bytes: &[u8],
    headers: &[(&str, &str)],
) -> Result<(), SendError> {
    let send = || async {
        if !super::ownership::holds() {
            return Err(SendError::NotOwned);
        }
        sh.broker.send(topic, key, bytes, headers).await.map(|_| ()).map_err(SendError::from)
    };
    // Lost ownership does not come back for this copy: no retry, no backoff.
    match retry_while(send, |e| !matches!(e, SendError::NotOwned)).await {
        Err(SendError::NotOwned) => {
            metrics::counter!(m::OUTCOMES_NOT_SENT_UNOWNED, "pool" => sh.pool.as_str()).increment(1);
            Err(SendError::NotOwned)
        }
        other => other,
    }
}

/// The state row of a job at one step of its route (the fields not given are filled by
/// the caller: error, class, output, or attempts past this one).
pub(super) fn update<'a>(
    sh: &'a RouteContext,
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
        usage: None,
    }
}

/// A dead letter to produce: the job (or, for a message that could not be decoded, its
/// raw bytes), its class, why, the handler's last error, the attempts used, and where the
/// message was read.
pub(crate) struct Letter<'a> {
    pub job: Option<&'a JobSubmitted>,
    pub raw: Option<Vec<u8>>,
    pub class: FailureClass,
    pub reason: String,
    pub last_error: Option<String>,
    pub attempts: i32,
    pub origin: &'a Origin,
}

/// Produces a dead letter and tells the job's watchers.
pub(crate) async fn dead_letter(sh: &RouteContext, letter: Letter<'_>) -> Durable {
    let Letter { job, raw, class, reason, last_error, attempts, origin } = letter;
    let now = sh.clock.now_ms();
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
    let produced = produce_dead_letter(&sh.cfg, sh.broker.as_ref(), &dl, key).await;
    // Every path that dead-letters a job (failed attempts, poison takeovers, rejected
    // messages) tells its watchers.
    if let Some(j) = job {
        crate::watch::events::dead_lettered(sh.broker.as_ref(), &sh.cfg, &sh.worker_id, j, &dl.reason);
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
    producer: &dyn RouteBroker,
    raw: Vec<u8>,
    error: &codec::CodecError,
    origin: &Origin,
) -> Durable {
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

/// Produces a dead letter and waits for the ack.
async fn produce_dead_letter(cfg: &Config, producer: &dyn RouteBroker, dl: &DeadLetter, key: &str) -> Durable {
    let topic = cfg.dlq_topic();
    let headers = dl.job.as_ref().map(kafka::trace_headers).unwrap_or_default();
    match codec::encode_dead_letter(dl) {
        Ok(bytes) => match with_retries(|| producer.send(&topic, key, &bytes, &headers)).await {
            Ok(_) => Durable::Yes,
            Err(e) => {
                tracing::error!(error = %e, "cannot produce dead letter; the message will be redelivered");
                Durable::No
            }
        },
        Err(e) => {
            tracing::error!(error = %e, "cannot encode dead letter");
            Durable::Yes
        }
    }
}

/// Sends a job whose `execute_at` is ahead to the delayed topic (due at `execute_at`).
pub(crate) async fn delay(sh: &RouteContext, job: JobSubmitted) -> Durable {
    let mut next = job;
    next.not_before = next.execute_at;
    produce_job(sh, &sh.cfg.delayed_topic(), &next, "delay").await
}

/// Puts a copy of a job back on its pool topic (attempt unchanged), to be read again.
pub(super) async fn requeue(sh: &RouteContext, job: &JobSubmitted) -> Durable {
    produce_job(sh, &sh.cfg.pool_topic(sh.pool), job, "requeue").await
}

/// Puts a job back on the dependency retry topic, attempt unchanged, due at `at`.
pub(super) async fn hold_back(sh: &RouteContext, job: &JobSubmitted, at: i64) -> Durable {
    let mut next = job.clone();
    next.not_before = Some(at);
    produce_job(sh, &sh.cfg.retry_topic(FailureClass::Dependency), &next, "hold back").await
}

/// Produces a job record and waits for the ack.
pub(super) async fn produce_job(sh: &RouteContext, topic: &str, job: &JobSubmitted, what: &str) -> Durable {
    let headers = kafka::trace_headers(job);
    let Some(bytes) = encoded(codec::encode_job(job), &job.job_id, what) else { return Durable::No };
    match send_while_owned(sh, topic, &job.tenant, &bytes, &headers).await {
        Ok(()) => Durable::Yes,
        Err(e) => {
            tracing::error!(job_id = %job.job_id, error = %e, "cannot {what} job; it will be redelivered");
            Durable::No
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

/// How long a write that must not fail (see `record_terminal`) is retried: longer than a
/// restart of the database, shorter than a stuck process should hold its partition's
/// commits.
pub(crate) const OUTAGE_RETRY: Duration = Duration::from_secs(180);

/// Retries a store call with backoff (capped at 5 s) for up to `OUTAGE_RETRY`; each
/// refusal is noted (`RouteContext::store_refused`: no lapse is judged soon after).
async fn retry_through_outage<T, E: std::fmt::Display, F, Fut>(sh: &RouteContext, mut f: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let give_up = tokio::time::Instant::now() + OUTAGE_RETRY;
    let mut delay = Duration::from_millis(100);
    loop {
        let r = f().await;
        if r.is_err() {
            sh.store_refused(sh.clock.now_ms());
        }
        match r {
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
pub(crate) async fn with_retries<T, E: std::fmt::Display, F, Fut>(f: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    retry_while(f, |_| true).await
}

/// [`with_retries`], but an error `retryable` refuses ends it at once.
async fn retry_while<T, E: std::fmt::Display, F, Fut>(mut f: F, retryable: impl Fn(&E) -> bool) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut delay = Duration::from_millis(100);
    let mut tries = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tries < 4 && retryable(&e) => {
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

    #[test]
    fn a_row_another_run_holds_or_ended_is_not_this_runs_to_end() {
        let row = |status: &str, worker: &str, generation: i64| crate::store::JobRow {
            status: Some(status.into()),
            worker: Some(worker.into()),
            generation: Some(generation),
            ..Default::default()
        };
        let fence = |status, worker, gen| taken_elsewhere(&row(status, worker, gen), "w1", 0);
        assert_eq!(fence("running", "w1", 0), Fence::Mine, "still this worker's");
        assert_eq!(fence("running", "w2", 0), Fence::RunningElsewhere, "taken over");
        assert_eq!(fence("handed_off", "w2", 0), Fence::RunningElsewhere, "handed off elsewhere");
        assert_eq!(fence("succeeded", "w2", 0), Fence::Ended, "ended elsewhere");
        assert_eq!(fence("failed", "w1", 0), Fence::Ended, "ended by an earlier run here");
        assert_eq!(fence("retrying", "w2", 0), Fence::Mine, "a retrying row holds no run");
        assert_eq!(fence("running", "w1", 1), Fence::Ended, "a newer generation");
        let newer = taken_elsewhere(&row("succeeded", "w2", 0), "w1", 1);
        assert_eq!(newer, Fence::Mine, "this run is the newer generation");
        assert_eq!(taken_elsewhere(&crate::store::JobRow::default(), "w1", 0), Fence::Mine, "no row");
    }

    /// An encode error in `produce_job` / `publish_result` is not durable (before, the
    /// running-row path wrote empty bytes and a failed encode could count as done).
    #[test]
    fn an_encode_error_is_never_a_durable_outcome() {
        let e = CodecError::TooShort { len: 0, expected: RecordKind::JobResult };
        assert_eq!(encoded(Err(e), "j", "publish result"), None);
        assert_eq!(encoded(Ok(vec![1, 2]), "j", "publish result"), Some(vec![1, 2]));
    }

    /// An error the caller calls final ends the retries at once; others are tried five
    /// times in all, with backoff.
    #[tokio::test(start_paused = true)]
    async fn a_final_error_is_not_retried() {
        let tries = std::cell::Cell::new(0);
        let failing = |e: &'static str| {
            let tries = &tries;
            move || async move {
                tries.set(tries.get() + 1);
                Err::<(), _>(e)
            }
        };
        let started = tokio::time::Instant::now();
        assert_eq!(retry_while(failing("final"), |e| *e != "final").await, Err("final"));
        assert_eq!((tries.get(), started.elapsed()), (1, Duration::ZERO));
        assert_eq!(retry_while(failing("transient"), |e| *e != "final").await, Err("transient"));
        assert_eq!(tries.get(), 6);
        assert_eq!(started.elapsed(), Duration::from_millis(100 + 300 + 900 + 2700));
    }

    /// A dead letter plus a failed result is durable only when both are.
    #[test]
    fn durability_of_two_writes_needs_both() {
        assert_eq!(Durable::Yes.and(Durable::Yes), Durable::Yes);
        assert_eq!(Durable::Yes.and(Durable::No), Durable::No);
        assert_eq!(Durable::No.and(Durable::Yes), Durable::No);
        assert_eq!(Durable::No.and(Durable::No), Durable::No);
    }

    /// A terminal outcome that never ran counts no attempt; one that ran counts its own,
    /// with what its process tree used.
    #[test]
    fn terminal_outcomes_carry_their_status_class_start_and_usage() {
        let used = Some(ProcessUsage { peak_memory_bytes: 1 << 20, cpu_ms: 9 });
        let t = Terminal::failed("gone".into(), FailureClass::Poison).ran(Ran {
            started_at: Some(5),
            usage: used,
            marked: false,
            claimed: false,
        });
        assert_eq!(
            (t.status, t.class, t.error.as_deref(), t.started_at, t.usage),
            (JobStatus::Failed, Some(FailureClass::Poison), Some("gone"), Some(5), used)
        );
        let t = Terminal::cancelled("stop".into());
        assert_eq!((t.status, t.class, t.started_at), (JobStatus::Cancelled, None, None));
        assert_eq!(Terminal::expired("late".into()).status, JobStatus::Expired);
        let t = Terminal::succeeded(vec![1], Ran { started_at: Some(7), usage: None, marked: false, claimed: false });
        assert!(t.unclaimed, "a run with no mark nor claim");
        let claimed = Ran { started_at: Some(7), usage: None, marked: false, claimed: true };
        assert!(!Terminal::cancelled("stop".into()).ran(claimed).unclaimed);
        assert!(!Terminal::cancelled("stop".into()).unclaimed, "never ran");
        assert_eq!((t.status, t.output, t.started_at, t.usage), (JobStatus::Succeeded, Some(vec![1]), Some(7), None));
    }
}
