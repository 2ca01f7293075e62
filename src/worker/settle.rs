//! The last stage of a job's route (see `route`): settling how its run ended. A terminal
//! outcome (state and result), a retry on its class's topic, a dead letter, or a hand-off
//! to the next worker, each written through `durable` and [`Durable`] only once
//! acknowledged: only then may the job's offset be committed (see `route::Ended`).

use super::durable::{self, produce_job, record_terminal, update, with_retries, Letter, Ran, Terminal};
use super::route::{Durable, Ended, Origin, Run};
use super::RouteContext;
use crate::core::retry::{AttemptState, Decision};
use crate::handlers::HandlerError;
use crate::metrics as m;
use crate::model::{FailureClass, JobSubmitted, Millis};
use crate::store::{RunMark, StateUpdate};

/// The settle stage: records how a run ended. A job stopped for the worker's shutdown (and not
/// finished) is handed off; otherwise its verdict feeds the breaker and poison detector
/// and it ends succeeded, cancelled, retried or dead-lettered.
pub(super) async fn settle(sh: &RouteContext, job: &JobSubmitted, origin: &Origin, run: &Run) -> Ended {
    let Run { started_at, timeout, result, live, running_written, row_claimed, superseded, unmarked } = run;
    let started_at = *started_at;
    // Its running mark found the job finished elsewhere: whatever it returned, that
    // copy's outcome stands (this one's would be a second result).
    if *superseded {
        metrics::counter!(m::JOBS_SKIPPED, "pool" => sh.pool.as_str(), "reason" => "superseded_run").increment(1);
        return Ended::Ran;
    }
    // It fenced itself (its heartbeats went unacknowledged for two intervals): another
    // worker may run the job now. Nothing is published; its copy is taken in again and
    // follows what the row then shows.
    if live.is_fenced() {
        return Ended::NotDurable;
    }
    let marked = *running_written;
    let handing_off = live.is_stopping() && !live.is_cancelled() && !matches!(result, Some(Ok(Ok(_))));
    // Its running mark was refused (the store down): while it ran on, asked to stop, no
    // row showed it, and after its heartbeats' lapse another worker may have taken the
    // job over. Whatever it ended with, nothing is published; one that stopped is handed
    // off below, any other is taken in again and its copy follows what the row shows
    // (the fleet simulator's seed 200060: a run finished during its worker's cut from the
    // store, published its result, and the take-over after the lapse ran the job again).
    if *unmarked && !handing_off {
        metrics::counter!(m::JOBS_SKIPPED, "pool" => sh.pool.as_str(), "reason" => "unmarked_run").increment(1);
        return Ended::NotDurable;
    }
    // Silent past `stuck_after`: dead-lettered with the reason, whatever it returned.
    if let Some(reason) = live.stuck_reason() {
        let last_error = match result {
            Some(Ok(Err(e))) => Some(e.message.clone()),
            _ => None,
        };
        let ran = Ran { started_at: Some(started_at), usage: live.usage(), marked, claimed: *row_claimed };
        return Ended::Ran
            .or_lost(Box::pin(dead_letter_stuck(sh, job, origin, reason.to_string(), last_error, ran)).await);
    }
    // The worker is shutting down and the job stopped without finishing: hand it off
    // (another worker resumes it from its checkpoint; no attempt used, no crash).
    if handing_off {
        return Ended::Skipped.or_lost(Box::pin(hand_off(sh, job)).await);
    }
    let ended_at = sh.clock.now_ms();
    let run_ms = (ended_at - started_at).max(0) as f64;
    sh.metrics.run_seconds.record(run_ms / 1000.0);
    // Outcome for the breaker and poison detector; a cancelled job gives no verdict.
    let verdict = match result {
        Some(Ok(Ok(_))) => Some(None),
        Some(Ok(Err(e))) if !live.is_cancelled() => Some(Some(e.class)),
        Some(Err(_)) => Some(Some(FailureClass::Timeout)),
        _ => None,
    };
    if let Some(failure) = verdict {
        sh.record_outcome(&job.job_type, &job.tenant, failure, ended_at);
        sh.record_run(&job.job_type, &job.tenant, run_ms as crate::model::Millis, ended_at);
    }
    let ran = Ran { started_at: Some(started_at), usage: live.usage(), marked, claimed: *row_claimed };
    // Only success runs inline; the rarer endings are boxed, so their futures do not sit
    // in every job's future.
    let durable = match result {
        Some(Ok(Err(_))) | None if live.is_expired() => {
            let msg = format!("not finished before not_after ({}): cancelled at it", job.not_after.unwrap_or_default());
            Box::pin(record_terminal(sh, job, Terminal::expired(msg).ran(ran))).await
        }
        None => {
            let msg = "cancelled: the handler did not stop within worker.cancel_grace and was aborted".to_string();
            Box::pin(record_terminal(sh, job, Terminal::cancelled(msg).ran(ran))).await
        }
        Some(Ok(Ok(output))) => durable::record_success(sh, job, output.clone(), ran, run.plain()).await,
        Some(Ok(Err(err))) if live.is_cancelled() => {
            let msg = format!("cancelled while running ({})", err.message);
            Box::pin(record_terminal(sh, job, Terminal::cancelled(msg).ran(ran))).await
        }
        Some(Ok(Err(err))) => Box::pin(fail(sh, job, origin, err.clone(), ran)).await,
        Some(Err(_)) => {
            let message = format!("deadline of {timeout:?} passed");
            let err = HandlerError { class: FailureClass::Timeout, message, retry_after: None };
            Box::pin(fail(sh, job, origin, err, ran)).await
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
async fn hand_off(sh: &RouteContext, job: &JobSubmitted) -> Durable {
    let handoffs = job.handoff_count.saturating_add(1);
    let count = || sh.store.put_handoff_count(&job.job_id, job.generation, handoffs);
    if let Err(e) = with_retries(count).await {
        // Only the copy below carries the count then: a redelivered older copy that
        // claims the job first is still told it was handed off (`check::claim_hand_off`).
        tracing::warn!(job_id = %job.job_id, error = %e, "could not record the hand-off count");
    }
    match with_retries(|| sh.store.mark_handed_off(&job.job_id, &sh.worker_id, sh.clock.now_ms())).await {
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
    copy.not_before = Some(sh.clock.now_ms());
    copy.handoff_count = handoffs;
    if !produce_job(sh, &sh.cfg.pool_topic(sh.pool), &copy, "hand off").await.is_yes() {
        return Durable::No;
    }
    metrics::counter!(m::HAND_OFFS, "pool" => sh.pool.as_str()).increment(1);
    tracing::info!(job_id = %job.job_id, "handed off to the next worker");
    Durable::Yes
}

/// A failed attempt: ask the retry policy, then either put the job on its class's retry
/// topic or dead-letter it (DLQ record + failed result).
pub(super) async fn fail(
    sh: &RouteContext,
    job: &JobSubmitted,
    origin: &Origin,
    err: HandlerError,
    ran: Ran,
) -> Durable {
    let started_at = ran.started_at;
    let now = sh.clock.now_ms();
    metrics::counter!(m::JOB_FAILURES, "pool" => sh.pool.as_str(), "class" => err.class.as_str()).increment(1);
    let state =
        AttemptState { attempt: job.attempt, crash_count: job.crash_count, last_error: Some(err.message.clone()) };
    let policy = sh.retry_policy(&job.job_type);
    let (class, decision) = sh.decide(err.class, &job.job_type, &job.tenant, &state, &policy, now);
    match decision {
        Decision::Retry { class_topic, not_before, attempt, crash_count } => {
            let not_before = match err.retry_after {
                Some(d) => not_before.max(now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))),
                None => not_before,
            };
            let mut next = job.clone();
            next.attempt = attempt;
            next.crash_count = crash_count;
            next.not_before = Some(not_before);
            next.last_error = Some(err.message.clone());
            next.last_failure_class = Some(err.class);
            next.first_failure_at = job.first_failure_at.or(Some(now));
            if !produce_job(sh, &sh.cfg.retry_topic(class_topic), &next, "retry").await.is_yes() {
                return Durable::No;
            }
            metrics::counter!(m::RETRIES, "class" => class_topic.as_str(), "job_type" => sh.bounded_job_type(&job.job_type)).increment(1);
            crate::watch::events::retrying(sh.broker.as_ref(), &sh.cfg, &sh.worker_id, job, not_before, &err.message);
            let mut u = update(sh, job, "retrying", started_at, None);
            u.attempts = attempt;
            u.crash_count = crash_count;
            u.error = Some(&err.message);
            u.failure_class = Some(err.class.as_str());
            record_retrying(sh, job, &u, ran.marked, now).await;
            Durable::Yes
        }
        Decision::DeadLetter { reason } => {
            // A run taken over meanwhile leaves the job to that run: no dead letter either.
            if ran.marked {
                if let Some(done) = durable::taken_over(sh, job).await {
                    return done;
                }
            }
            let attempts = if started_at.is_some() { job.attempt + 1 } else { job.attempt };
            let class = crate::core::retry::dead_letter_class(class);
            let last_error = Some(err.message.clone());
            let letter = Letter { job: Some(job), raw: None, class, reason, last_error, attempts, origin };
            // The dead letter before the result: one that is not durable stops here.
            if !durable::dead_letter(sh, letter).await.is_yes() {
                return Durable::No;
            }
            record_terminal(sh, job, Terminal::failed(err.message, class).ran(ran)).await
        }
    }
}

/// Records a failed attempt's `retrying` state (best effort: its retry copy is already
/// acknowledged). A run that wrote its running mark writes it only while the row still
/// shows that mark: if another run took the job over (this one's heartbeats lapsed) or it
/// ended meanwhile, this run is superseded and its write would regress the row (seed 528,
/// docs/correctness.md, "Superseded runs"). Its retry copy then waits behind the running
/// run and is settled by the row it finds (finished, stale, or the next attempt to run).
async fn record_retrying(sh: &RouteContext, job: &JobSubmitted, u: &StateUpdate<'_>, marked: bool, now: Millis) {
    let written = if marked {
        let mark = RunMark { worker: &sh.worker_id, attempts: job.attempt, crash_count: job.crash_count };
        with_retries(|| sh.store.put_state_if_marked(u, mark, now)).await
    } else {
        with_retries(|| sh.store.put_state(u, now)).await.map(|()| true)
    };
    match written {
        Ok(true) => {}
        Ok(false) => {
            metrics::counter!(m::SUPERSEDED_WRITES, "pool" => sh.pool.as_str(), "write" => "retrying").increment(1);
            tracing::info!(job_id = %job.job_id, "retrying state not written: another run holds the job's row now");
        }
        Err(e) => tracing::warn!(job_id = %job.job_id, error = %e, "could not record retrying state"),
    }
}

/// A stuck job (`core::stuck`): straight to the DLQ as `resource` (a retry would hold
/// another slot for nothing), and its failed result.
async fn dead_letter_stuck(
    sh: &RouteContext,
    job: &JobSubmitted,
    origin: &Origin,
    reason: String,
    last_error: Option<String>,
    ran: Ran,
) -> Durable {
    if ran.marked {
        if let Some(done) = durable::taken_over(sh, job).await {
            return done;
        }
    }
    let class = FailureClass::Resource;
    metrics::counter!(m::JOB_FAILURES, "pool" => sh.pool.as_str(), "class" => class.as_str()).increment(1);
    metrics::counter!(m::STUCK_JOBS, "pool" => sh.pool.as_str()).increment(1);
    let attempts = job.attempt + 1;
    let letter = Letter { job: Some(job), raw: None, class, reason: reason.clone(), last_error, attempts, origin };
    if !durable::dead_letter(sh, letter).await.is_yes() {
        return Durable::No;
    }
    record_terminal(sh, job, Terminal::failed(reason, class).ran(ran)).await
}
