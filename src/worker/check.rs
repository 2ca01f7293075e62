//! The check stage of a job's route (see `route`): the effectively-once check before any
//! handler runs. A redelivered copy of a finished, superseded, stale, cancelled or expired job is
//! settled here without running; a job running on another live worker waits; one whose
//! worker died is taken over (a crash, never an attempt); a handed-off job is claimed.

use super::durable::{self, record_terminal, Letter, Terminal, OUTAGE_RETRY};
use super::route::{Durable, Origin};
use super::RouteContext;
use crate::core::retry::{AttemptState, Decision};
use crate::metrics as m;
use crate::model::{FailureClass, JobSubmitted};
use crate::seams::Beat;
use crate::store::{JobRow, StoreError};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// How often a copy waiting for a job running elsewhere looks at its row again.
const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

pub(super) enum Check {
    /// Run it. `row_claimed`: its row was marked running or handed off (taken over or
    /// claimed here), so its end is recorded in that row (see `durable::record_success`).
    /// `redelivered`: a worker may have started this record before (`frontier::Start`),
    /// so its run is marked running as it starts, not after the grace: a job that kills
    /// its worker within the grace would else come back forever with no crash counted.
    Run { job: Arc<JobSubmitted>, row_claimed: bool, seen: Seen, redelivered: bool },
    /// Handled without running, durably or not.
    Done(Durable),
}

/// What the check saw of the job's row, which the run's running mark expects unchanged
/// (`exec::mark_running`): not read (a job nobody can have started, `worker::frontier`),
/// or the worker the row named and its last write (none: no row; this worker and its
/// claim's write once it claimed the job). Another copy that read the same row and
/// started first has changed it: the later mark is refused, and that run stops before
/// its handler runs past its grace. The write time tells a row its worker wrote again
/// from the one read (the fleet simulator's seed 21668: two copies of one retry, one
/// marked over the other's fresh mark because it named the same worker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    Unread,
    Row { worker: Option<String>, written_at: Option<i64> },
}

impl Seen {
    fn of(row: Option<&JobRow>) -> Seen {
        Seen::Row { worker: row.and_then(|r| r.worker.clone()), written_at: row.and_then(|r| r.updated_at) }
    }

    /// The row as the store's conditional writes take it (None: not read).
    pub fn as_read(&self) -> Option<crate::store::SeenRow<'_>> {
        match self {
            Seen::Unread => None,
            Seen::Row { worker, written_at } => {
                Some(crate::store::SeenRow { worker: worker.as_deref(), written_at: *written_at })
            }
        }
    }
}

/// The effectively-once check, before any handler runs: finished, stale, cancelled,
/// expired, scheduled for later, or running elsewhere (rebalance safety).
pub(super) async fn before_run(sh: &RouteContext, job: Arc<JobSubmitted>, origin: &Origin) -> Check {
    // Record the partition's dispatch frontier past this offset before it can start, and
    // learn whether anyone can have started it before (then its state needs no read).
    let start = match through_outage(sh, &job, "the dispatch frontier", || {
        sh.frontiers.before_start(sh.store.as_ref(), &job, origin, sh.clock.now_ms())
    })
    .await
    {
        Ok(start) => start,
        Err(held) => return held,
    };
    let (job, row_claimed, seen) = if start.skip_read {
        sh.metrics.state_reads_skipped.increment(1);
        (job, false, Seen::Unread)
    } else {
        // Boxed here and below: a rare path's future would otherwise sit inline in every
        // job's future (see `exec::execute`).
        match Box::pin(check_row(sh, job, origin)).await {
            Check::Run { job, row_claimed, seen, .. } => (job, row_claimed, seen),
            done => return done,
        }
    };
    run_unless_expired(sh, job, row_claimed, seen, start.maybe_started).await
}

/// What a look at a handed-off or running row decided for this copy.
enum Step {
    /// Go on past this look (a running job's worker found dead).
    Next,
    /// A hand-off claimed here, by the row's write at this time.
    Claimed(i64),
    /// Look at the row again.
    Again,
    /// Handled without running, durably or not.
    Done(Durable),
}

/// Reads the job's row until it settles this copy, makes it wait, or lets it run (as it
/// is, claimed after a hand-off, or taken over from a dead worker).
async fn check_row(sh: &RouteContext, mut job: Arc<JobSubmitted>, origin: &Origin) -> Check {
    let interval = sh.cfg.pool(sh.pool).heartbeat_interval;
    let mut row_claimed = false;
    let mut seen: Seen;
    loop {
        let row = match through_outage(sh, &job, "the effectively-once check", || sh.store.job(&job.job_id)).await {
            Ok(r) => r,
            Err(held) => return held,
        };
        let now = sh.clock.now_ms();
        let Some(row) = row else {
            seen = Seen::of(None);
            break;
        };
        seen = Seen::of(Some(&row));
        row_claimed |= matches!(row.status.as_deref(), Some("running" | "handed_off"));
        // Generations ("rerun all"): the row records the generation last run. A copy of
        // an older generation is superseded; a newer one runs even if the job finished.
        let row_gen = row.generation.unwrap_or(0);
        if job.generation < row_gen {
            metrics::counter!(m::JOBS_SKIPPED, "pool" => sh.pool.as_str(), "reason" => "superseded").increment(1);
            return Check::Done(Durable::Yes);
        }
        let rerun = job.generation > row_gen;
        if let Some(done) = settled_by_row(sh, &job, &row, rerun).await {
            return Check::Done(done);
        }
        if row.status.as_deref() == Some("handed_off") {
            if sh.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                // A draining worker claims nothing: it would hand the job straight off
                // again (one more copy, one more standstill). Its offset stays
                // uncommitted for the partition's next owner.
                return Check::Done(Durable::No);
            }
            match claim_hand_off(sh, &job).await {
                Step::Claimed(at) => {
                    job = with_handoffs(sh, job, 1).await;
                    seen = Seen::Row { worker: Some(sh.worker_id.clone()), written_at: Some(at) };
                    break;
                }
                Step::Next => {}
                Step::Again => continue,
                Step::Done(done) => return Check::Done(done),
            }
        }
        if row.status.as_deref() != Some("running") {
            break;
        }
        // A later attempt than the one the row says runs: that attempt ended once (a retry
        // is produced only after its attempt ends) and its best-effort "retrying" write was
        // lost, or a redelivered copy of it is running again (taken over after its worker
        // died). It waits while that run heartbeats (the simulator's seed 202: else both
        // run at once), then runs, neither skipped nor counted as a crash.
        let later = !rerun && job.attempt > row.attempts.unwrap_or(0);
        match wait_for_live_worker(sh, &job, &row, now, interval).await {
            Step::Next | Step::Claimed(_) => {}
            Step::Again => continue,
            Step::Done(done) => return Check::Done(done),
        }
        if later {
            break;
        }
        match take_over(sh, &job, &row, origin, now).await {
            Ok(Some((taken, claimed_at))) => {
                job = with_handoffs(sh, taken, 0).await;
                seen = Seen::Row { worker: Some(sh.worker_id.clone()), written_at: Some(claimed_at) };
            }
            Ok(None) => continue, // another copy took it over first: look again
            Err(done) => return Check::Done(done),
        }
        break;
    }
    Check::Run { job, row_claimed, seen, redelivered: false }
}

/// A copy its row settles without running: a finished job redelivered, a stale attempt,
/// or a cancelled job. None if the row does not settle it.
async fn settled_by_row(sh: &RouteContext, job: &JobSubmitted, row: &JobRow, rerun: bool) -> Option<Durable> {
    if row.is_terminal() && !rerun {
        // Redelivered after it finished: its result was acknowledged before its state
        // was written (see `durable::record_terminal`), so there is nothing to publish again.
        metrics::counter!(m::JOBS_SKIPPED, "pool" => sh.pool.as_str(), "reason" => "finished").increment(1);
        return Some(Durable::Yes);
    }
    if !rerun && row.attempts.unwrap_or(0) > job.attempt {
        // A stale copy: a later attempt of this job already exists on a retry topic.
        metrics::counter!(m::JOBS_SKIPPED, "pool" => sh.pool.as_str(), "reason" => "stale_attempt").increment(1);
        return Some(Durable::Yes);
    }
    if row.cancel_requested == Some(true) {
        let msg = "cancelled before it started".to_string();
        return Some(record_terminal(sh, job, Terminal::cancelled(msg)).await);
    }
    None
}

/// A handed-off row: claims the job for this worker, atomically.
async fn claim_hand_off(sh: &RouteContext, job: &JobSubmitted) -> Step {
    // Handed off by a draining worker: several copies may find it so (the
    // hand-off copy, a redelivery after the rebalance); one claims it, atomically.
    let claim = |now| sh.store.claim_hand_off(&job.job_id, &sh.worker_id, now);
    match claim_stamped(sh, job, "claiming a handed-off job", "claimed after a hand-off", claim).await {
        Ok(Some(at)) => Step::Claimed(at),
        Ok(None) => Step::Again, // another copy claimed it: look again
        Err(durable) => Step::Done(durable),
    }
}

/// A claim of the job's row for this worker (`claim(now)` writes `now` as the row's
/// `updated_at`), retried through a store outage ([`through_outage`]). Some(the write
/// time of the try that applied), which the run's mark is then conditional on, after a
/// heartbeat at once ([`beat_claimed`], `message`); None when another copy won.
async fn claim_stamped<F, Fut>(
    sh: &RouteContext,
    job: &JobSubmitted,
    what: &str,
    message: &str,
    claim: F,
) -> Result<Option<i64>, Durable>
where
    F: Fn(i64) -> Fut,
    Fut: std::future::Future<Output = Result<bool, StoreError>>,
{
    let at = std::sync::atomic::AtomicI64::new(0);
    let stamped = || {
        let now = sh.clock.now_ms();
        at.store(now, Relaxed);
        claim(now)
    };
    match through_outage(sh, job, what, stamped).await {
        Ok(true) => {
            beat_claimed(sh, job, message).await;
            Ok(Some(at.load(Relaxed)))
        }
        Ok(false) => Ok(None),
        Err(Check::Done(durable)) => Err(durable),
        Err(Check::Run { .. }) => unreachable!("through_outage holds a job back, never runs it"),
    }
}

/// A heartbeat at once for a job this worker just claimed (a hand-off, a take-over):
/// other copies now see it running here and wait. A failed write is logged; the run's
/// mark writes one again.
async fn beat_claimed(sh: &RouteContext, job: &JobSubmitted, message: &str) {
    let (ttl, at) = (sh.heartbeat_ttl_secs(), sh.clock.now_ms());
    let (job_id, worker) = (job.job_id.as_str(), sh.worker_id.as_str());
    let beat = Beat { job_id, worker, at, progress: 0.0, message, ttl_secs: ttl };
    if let Err(e) = sh.store.put_heartbeat(beat).await {
        tracing::warn!(job_id, error = %e, "could not heartbeat a job claimed here ({message})");
    }
}

/// A copy going on after a claimed hand-off (`at_least` 1) or a crash take-over: told how
/// often its generation was handed off, from the store's count (written by the draining
/// worker), which a redelivered older copy does not carry. If the count cannot be read,
/// the copy's own count (at least `at_least`) is used, and the log says so: the handler
/// is still told it is not the first dispatch.
async fn with_handoffs(sh: &RouteContext, job: Arc<JobSubmitted>, at_least: i32) -> Arc<JobSubmitted> {
    let stored = match sh.store.handoff_count(&job.job_id, job.generation).await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(job_id = %job.job_id, error = %e, "could not read the hand-off count; the copy's own is used");
            0
        }
    };
    let count = job.handoff_count.max(stored).max(at_least);
    if count == job.handoff_count {
        return job;
    }
    let mut j = (*job).clone();
    j.handoff_count = count;
    Arc::new(j)
}

/// A running row: waits while its worker (this one or another) heartbeats or the row was
/// just written (`liveness::run_alive`); Next once both lapsed.
async fn wait_for_live_worker(
    sh: &RouteContext,
    job: &JobSubmitted,
    row: &JobRow,
    now: i64,
    interval: std::time::Duration,
) -> Step {
    // Marked running: by a worker that still heartbeats (the partition moved while
    // the job runs) we wait; by one whose heartbeat lapsed, we take over.
    // A heartbeat that cannot be read is not a lapsed one: taking the job over would
    // count a crash that never happened.
    let hb =
        match through_outage(sh, job, "reading a running job's heartbeat", || sh.store.heartbeat(&job.job_id)).await {
            Ok(hb) => hb,
            Err(Check::Done(durable)) => return Step::Done(durable),
            Err(Check::Run { .. }) => unreachable!("through_outage holds a job back, never runs it"),
        };
    let lapse = super::liveness::lapse(interval);
    // A lapse this worker cannot judge yet (it started, or the store refused it, within a
    // lapse: the run's heartbeats may have been lost to the same outage) counts as fresh.
    let fresh = super::liveness::run_alive(hb.and_then(|h| h.at), row.updated_at, now, lapse)
        || !super::liveness::may_judge_lapses(sh.store_steady_since(), now, lapse);
    // A row running on this very worker, seen by a copy that does not follow a route in
    // flight here (`exec::InFlight`: a copy of a job whose route is still in flight here
    // never gets this far): that route ended without a durable outcome (or a previous
    // process of this worker id ran it). It waits like any other: settling it at once
    // would commit its offset and nothing would redeliver the job (the simulator's seed
    // 329); the heartbeat lapses and the job is taken over.
    if !fresh {
        return Step::Next;
    }
    metrics::counter!(m::JOBS_DEFERRED, "pool" => sh.pool.as_str()).increment(1);
    if sh.stopping.load(std::sync::atomic::Ordering::SeqCst) {
        // This worker hands its jobs off and has left the group: a copy waiting
        // for another worker's job is not its business any more (its offset stays
        // uncommitted for the partition's next owner).
        return Step::Done(Durable::No);
    }
    // Looked at again within a second, not a heartbeat interval: when the running
    // worker hands the job off, this copy may be the one to claim it (the
    // hand-off copy can wait behind such copies for a slot).
    tokio::time::sleep(interval.min(RECHECK)).await;
    Step::Again
}

/// A job whose worker died, claimed for this one ([`claim_take_over`]; None: another
/// copy took it over first): the job to run with its crash counted, or Err once
/// dead-lettered past its crash limit (durably or not).
async fn take_over(
    sh: &RouteContext,
    job: &Arc<JobSubmitted>,
    row: &JobRow,
    origin: &Origin,
    now: i64,
) -> Result<Option<(Arc<JobSubmitted>, i64)>, Durable> {
    let Some(claimed_at) = claim_take_over(sh, job, row).await? else {
        return Ok(None);
    };
    // The run it takes over was this process's own, which fenced itself (the store did
    // not acknowledge its heartbeats): no worker died, so no crash is counted. Else a
    // store outage would count one crash per long job, and three outages would
    // dead-letter healthy jobs as poison (the fleet simulator, `sim::fleet`). So too when
    // the store refused this worker's calls within two lapses: the run's worker may be
    // alive and its heartbeats lost to the same outage (seed 3373: two crashes and an
    // outage dead-lettered a job as poison). A real death then goes uncounted once.
    let lapse = i64::try_from(super::liveness::lapse(sh.cfg.pool(sh.pool).heartbeat_interval).as_millis());
    let outage = sh.store_refused_within(now, lapse.unwrap_or(i64::MAX).saturating_mul(2));
    if row.worker.as_deref() == Some(sh.worker_id.as_str()) || outage {
        let mut j = (**job).clone();
        j.crash_count = job.crash_count.max(row.crash_count.unwrap_or(0));
        metrics::counter!(m::JOBS_TAKEN_OVER, "pool" => sh.pool.as_str()).increment(1);
        return Ok(Some((Arc::new(j), claimed_at)));
    }
    // Worker crash: never uses up an attempt, but counts towards the crash limit.
    let crashes = job.crash_count.max(row.crash_count.unwrap_or(0) + 1);
    let state = AttemptState { attempt: job.attempt, crash_count: crashes - 1, last_error: row.error.clone() };
    let policy = sh.retry_policy(&job.job_type);
    if let (_, Decision::DeadLetter { reason }) =
        sh.decide(FailureClass::WorkerCrash, &job.job_type, &job.tenant, &state, &policy, now)
    {
        let class = FailureClass::Poison;
        let (last_error, attempts) = (row.error.clone(), job.attempt);
        let letter = Letter { job: Some(job), raw: None, class, reason: reason.clone(), last_error, attempts, origin };
        // The dead letter first: a job whose letter is not durable gets no result either
        // (its copy is taken in again and dead-letters it then).
        if !durable::dead_letter(sh, letter).await.is_yes() {
            return Err(Durable::No);
        }
        return Err(record_terminal(sh, job, Terminal::failed(reason, class)).await);
    }
    metrics::counter!(m::JOBS_TAKEN_OVER, "pool" => sh.pool.as_str()).increment(1);
    let mut j = (**job).clone();
    j.crash_count = crashes;
    Ok(Some((Arc::new(j), claimed_at)))
}

/// Claims a run whose heartbeat lapsed for this worker, atomically (the row must still
/// show it running on the lapsed worker), and heartbeats it at once: a copy that reads
/// the row after sees it running here and waits, and a copy that read the same lapsed
/// run loses the claim. Without it, two copies reading the row within the new run's
/// running grace both took it over and ran at once (the fleet simulator on the real pool
/// loop: a restart moved a partition during a take-over). False: another copy won.
async fn claim_take_over(sh: &RouteContext, job: &JobSubmitted, row: &JobRow) -> Result<Option<i64>, Durable> {
    let from = crate::store::SeenRow { worker: row.worker.as_deref(), written_at: row.updated_at };
    let claim = |now| sh.store.claim_take_over(&job.job_id, from, &sh.worker_id, now);
    claim_stamped(sh, job, "claiming a lapsed run", "taken over", claim).await
}

/// A store read or claim the check cannot do without, retried through a store outage:
/// the job is held back (it keeps its slot; no attempt, no crash counted, no dead letter)
/// and goes on once the store answers. Err (the copy held unfinished: its offset stays
/// uncommitted and it is redelivered) when the worker stops meanwhile or the outage
/// outlasts `durable::OUTAGE_RETRY`.
async fn through_outage<T, F, Fut>(sh: &RouteContext, job: &JobSubmitted, what: &str, mut f: F) -> Result<T, Check>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let give_up = tokio::time::Instant::now() + OUTAGE_RETRY;
    let mut delay = std::time::Duration::from_millis(100);
    let mut held = false;
    loop {
        let e = match f().await {
            Ok(v) => {
                if held {
                    tracing::info!(job_id = %job.job_id, "store back; the held job goes on");
                }
                return Ok(v);
            }
            Err(e) => e,
        };
        sh.store_refused(sh.clock.now_ms());
        let stopping = sh.stopping.load(std::sync::atomic::Ordering::SeqCst);
        if !super::ownership::holds() {
            tracing::info!(job_id = %job.job_id, error = %e, "store unavailable for {what} and the partition is no longer owned here; the job is left to its next owner");
            return Err(Check::Done(Durable::No));
        }
        if stopping || tokio::time::Instant::now() + delay >= give_up {
            tracing::error!(job_id = %job.job_id, error = %e, stopping, "store unavailable for {what}; the job is left for redelivery");
            return Err(Check::Done(Durable::No));
        }
        if !held {
            held = true;
            metrics::counter!(m::JOBS_HELD_STORE_DOWN, "pool" => sh.pool.as_str()).increment(1);
            tracing::warn!(job_id = %job.job_id, error = %e, "store unavailable for {what}; holding the job until it is back");
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(std::time::Duration::from_secs(2));
    }
}

/// The last check: a job not started before its `not_after` expires instead of running.
async fn run_unless_expired(
    sh: &RouteContext,
    job: Arc<JobSubmitted>,
    row_claimed: bool,
    seen: Seen,
    redelivered: bool,
) -> Check {
    if let Some(not_after) = job.not_after {
        if sh.clock.now_ms() > not_after {
            return Check::Done(Box::pin(expire(sh, &job, not_after)).await);
        }
    }
    Check::Run { job, row_claimed, seen, redelivered }
}

/// Ends a job that did not start before its `not_after` as expired (never run).
pub(super) async fn expire(sh: &RouteContext, job: &JobSubmitted, not_after: i64) -> Durable {
    let now = sh.clock.now_ms();
    let msg = format!("not started before not_after ({not_after}); expired at {now}");
    crate::watch::events::late(sh.broker.as_ref(), &sh.cfg, &sh.worker_id, job, not_after);
    record_terminal(sh, job, Terminal::expired(msg)).await
}
