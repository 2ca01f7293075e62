//! The run stage of a job's route (`route`): clear the job to run (a handler, closed
//! breakers) and run its handler under its deadline, between the effectively-once check
//! (`check`) and settling its outcome (`settle`).

use super::durable::{self, update};
use super::route::{Durable, Ended, Origin, Run};
use super::{check, settle, RouteContext};
use crate::core::breaker::Verdict;
use crate::core::retry::DurationMs;
use crate::core::stuck;
use crate::handlers::{Handler, HandlerError, JobContext, JobLive};
use crate::model::JobSubmitted;
use crate::observe::telemetry;
use crate::seams::Clock;
use crate::{codec, metrics as m};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A job that is not started within this time of its dispatch gets a "running" row
/// only if it outlives this grace: most short jobs then cost one terminal write.
const RUNNING_WRITE_GRACE: Duration = Duration::from_millis(250);
/// Waits between the tries of the running-row write (after the first); the handler is
/// not polled meanwhile. Past them the job is stopped and handed back (`mark_running`).
const RUNNING_WRITE_RETRIES: [Duration; 3] =
    [Duration::from_millis(250), Duration::from_secs(1), Duration::from_secs(2)];

/// Gives a job's scheduler slot back. The slot is released as soon as the handler
/// returns (the tenant is charged for handler time, not for our own bookkeeping);
/// released without a run (`release(false, 0)`, also when dropped) if the job was
/// skipped. It remembers the output's size, which the job's outcome holds until recorded.
pub struct SlotRelease {
    release: Option<Box<dyn FnOnce(bool, usize) + Send>>,
    output_bytes: usize,
}

impl SlotRelease {
    /// `f(ran, output_bytes)` runs once, when the slot is released.
    pub fn new(f: impl FnOnce(bool, usize) + Send + 'static) -> Self {
        SlotRelease { release: Some(Box::new(f)), output_bytes: 0 }
    }
    /// `ran`: a handler really ran, so its time teaches the cost estimate; `output_bytes`:
    /// the size of what it returned. Only the first call counts.
    pub fn release(&mut self, ran: bool, output_bytes: usize) {
        if let Some(f) = self.release.take() {
            self.output_bytes = output_bytes;
            f(ran, output_bytes)
        }
    }
    /// The output size given when the slot was released (0 before, or without a run).
    pub fn output_bytes(&self) -> usize {
        self.output_bytes
    }
}

impl Drop for SlotRelease {
    fn drop(&mut self) {
        self.release(false, 0)
    }
}

/// The routes of jobs in flight on this worker (dispatched, not yet settled), by job id,
/// generation and attempt. A second copy of one of them (its partition came back and the
/// record was read again, or a hand-off copy) follows the first: it gives its slot back
/// and ends as that route ends, instead of checking and waiting on its own (a copy
/// waiting for a job running here held a slot for the whole run and starved hand-off
/// copies, docs/simulation.md, classes 3 and 5; keyed by hand-off count too, the stale
/// copies of a rolling restart filled every slot and a job stood still 25 s). One entry
/// per route, so at most a pool's slots of them; followers count as outcomes in flight
/// (`pool::OUTCOMES_IN_FLIGHT` bounds them in total). Hashed with a per-process random
/// seed (`foldhash`), not SipHash: every job enters and leaves this map, and with at most
/// a pool's slots of entries even chosen colliding job ids cost their tenant little.
#[derive(Default)]
pub struct InFlight(std::sync::Mutex<crate::core::FastMap<CopyKey, Route>>);

/// Which copies of a job are one: same job, generation and attempt.
type CopyKey = (String, i64, i32);

/// A route in flight: the hand-off count its copy carried, and where it tells how it
/// ended (durably or not). The channel is made when the first follower comes: most
/// routes have none.
struct Route {
    handoff_count: i32,
    ended: Option<watch::Sender<Option<bool>>>,
}

/// A copy's place among the copies of its job on this worker.
enum Place<'a> {
    /// The first: it runs the route, and tells its followers how it ended.
    Leads(Leading<'a>),
    /// Another one's route is in flight: this copy ends as that one does.
    Follows(Following),
}

/// A copy following a route in flight here.
struct Following {
    ended: watch::Receiver<Option<bool>>,
    /// The copy carries a higher hand-off count than the route: it may be the hand-off
    /// copy that route produced as it ended (a job handed back to this same worker), so
    /// it is never settled by that route's end (see [`follow`]).
    later: bool,
}

/// The leading copy's entry; removed when dropped (followers of a route aborted
/// before it ended end not durable).
struct Leading<'a> {
    map: &'a InFlight,
    key: CopyKey,
    /// The entry is gone already ([`Leading::ended`] took it out).
    removed: bool,
}

impl InFlight {
    fn place(&self, job: &JobSubmitted) -> Place<'_> {
        let key = (job.job_id.clone(), job.generation, job.attempt);
        let mut map = self.0.lock().expect("in-flight map");
        if let Some(route) = map.get_mut(&key) {
            let later = job.handoff_count > route.handoff_count;
            let ended = route.ended.get_or_insert_with(|| watch::channel(None).0).subscribe();
            return Place::Follows(Following { ended, later });
        }
        map.insert(key.clone(), Route { handoff_count: job.handoff_count, ended: None });
        Place::Leads(Leading { map: self, key, removed: false })
    }
}

impl Leading<'_> {
    /// Takes the entry out and tells the route's followers, if any, how it ended (under
    /// one lock: a copy placed after this leads a route of its own).
    fn ended(mut self, durable: bool) {
        let route = self.map.0.lock().expect("in-flight map").remove(&self.key);
        self.removed = true;
        if let Some(tx) = route.and_then(|route| route.ended) {
            tx.send_replace(Some(durable));
        }
    }
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        if !self.removed {
            self.map.0.lock().expect("in-flight map").remove(&self.key);
        }
    }
}

/// A following copy: its slot goes back at once; it ends durably only if the route it
/// follows did (then the job's outcome, retry or hand-off copy is recorded), else it is
/// left for redelivery like that route's own copy. A later copy (a higher hand-off count)
/// is never settled by the route's end: if that route handed the job off, this copy may
/// be the recorded hand-off itself, and settling it would lose the job (the route's
/// "durable" was this very copy). It ends not durable instead: taken in again while its
/// partition is owned here (`pool`), else its next owner reads it; its check then finds
/// the job finished (skipped) or handed off (claimed and run).
async fn follow(sh: &RouteContext, job: &JobSubmitted, slot: &mut SlotRelease, route: Following) -> Ended {
    slot.release(false, 0);
    metrics::counter!(m::JOBS_SKIPPED, "pool" => sh.pool.as_str(), "reason" => "in_flight_here").increment(1);
    let Following { mut ended, later } = route;
    let durable = match ended.wait_for(Option::is_some).await {
        Ok(ended) => ended.unwrap_or(false) && !later,
        Err(_) => false, // the route was aborted before it ended
    };
    tracing::debug!(job_id = %job.job_id, durable, later, "a copy followed the route of the job in flight here");
    Ended::Skipped.or_lost(if durable { Durable::Yes } else { Durable::No })
}

/// When a job reached the worker and got its slot (epoch ms).
#[derive(Debug, Clone, Copy)]
pub struct Waited {
    pub received_at: i64,
    pub dispatched_at: i64,
}

impl Waited {
    /// When the job became due: its submission, or its scheduled time if later.
    fn from(&self, job: &JobSubmitted) -> i64 {
        job.execute_at.map_or(job.submitted_at, |at| at.max(job.submitted_at))
    }

    /// Records where a job's wait went: the broker hop, the fair queue, the check.
    fn record(&self, sh: &RouteContext, job: &JobSubmitted, started_at: i64) {
        let fetch = (self.received_at - job.submitted_at).max(0);
        let queue = (self.dispatched_at - self.received_at).max(0);
        let check = (started_at - self.dispatched_at).max(0);
        let hm = &sh.metrics;
        for (h, ms) in [(&hm.wait_fetch, fetch), (&hm.wait_queue, queue), (&hm.wait_check, check)] {
            h.record(ms as f64 / 1000.0);
        }
        // Submission (or its scheduled time) to the first dispatch: only an original
        // submission's first attempt, whose wait the pools' SLOs bound (a retry's, crash
        // re-dispatch's, hand-off's, replay's or rerun copy's would count backoffs and history).
        if job.first_dispatch() && job.generation == 0 {
            let ms = (self.dispatched_at - self.from(job)).max(0);
            hm.dispatch_wait.record(ms as f64 / 1000.0);
        }
        tracing::debug!(target: "fairway::timeline", job_id = %job.job_id, tenant = %job.tenant, fetch, queue, check, "started");
    }
}
/// The spans of one job's run (`telemetry`), built around the route rather than in it:
/// nothing at all when export is off, so the hot path builds nothing.
struct RunSpans {
    job: Option<telemetry::JobSpans>,
    process: Option<telemetry::Live>,
}

impl RunSpans {
    /// The job's spans (its wait for dispatch recorded) and its process span, open.
    fn start(sh: &RouteContext, job: &JobSubmitted, origin: &Origin, waited: &Waited, started_at: i64) -> RunSpans {
        let spans = telemetry::enabled().then(|| sh.cfg.group(sh.pool.as_str())).and_then(|group| {
            let (topic, partition, offset) = (origin.topic.as_str(), origin.partition, origin.offset);
            telemetry::job(job, &telemetry::Delivery { topic, partition, offset, group: &group })
        });
        if let Some(spans) = &spans {
            spans.dispatch_wait(waited.from(job), waited.received_at, waited.dispatched_at);
        }
        let process = spans.as_ref().and_then(|s| s.process(started_at));
        RunSpans { job: spans, process }
    }

    /// The trace context the handler is given (its process span's).
    fn traceparent(&self) -> Option<String> {
        self.process.as_ref().and_then(telemetry::Live::traceparent)
    }

    /// Closes the process span with how the run ended; the outcome span is left to write.
    fn ran(self, run: &Run, ran_at: i64) -> Settling {
        let (label, error) = run.label();
        if let Some(process) = self.process {
            process.end(ran_at, error.as_deref(), Vec::new());
        }
        Settling { job: self.job, ran_at, label, error }
    }
}

/// The outcome span of a run being settled (see [`RunSpans`]).
struct Settling {
    job: Option<telemetry::JobSpans>,
    ran_at: i64,
    label: &'static str,
    error: Option<String>,
}

impl Settling {
    /// Writes the outcome span, from the run's end to `now`.
    fn settled(self, now: i64) {
        if let Some(spans) = &self.job {
            spans.outcome(self.ran_at, now, self.label, self.error.as_deref());
        }
    }
}

/// Runs one dispatched job along its route (see `route`): check, run, settle. The rare
/// branches (store reads and claims, failures, hand-offs, long runs' rows) are boxed where
/// they branch off, so a short job's future holds only the common path.
pub async fn execute(
    sh: Arc<RouteContext>,
    job: Arc<JobSubmitted>,
    origin: Origin,
    slot: &mut SlotRelease,
    waited: Waited,
) -> Ended {
    sh.admission_tally.lock().expect("admission tally").dispatched(&job);
    let leading = match sh.in_flight.place(&job) {
        Place::Leads(leading) => leading,
        Place::Follows(route) => return Box::pin(follow(&sh, &job, slot, route)).await,
    };
    let ended = route(&sh, job, origin, slot, waited).await;
    leading.ended(ended.is_durable());
    ended
}

/// The route of a leading copy (see [`InFlight`]): check, run, settle.
async fn route(
    sh: &RouteContext,
    job: Arc<JobSubmitted>,
    origin: Origin,
    slot: &mut SlotRelease,
    waited: Waited,
) -> Ended {
    let (job, row_claimed, seen, redelivered) = match check::before_run(sh, job, &origin).await {
        check::Check::Run { job, row_claimed, seen, redelivered } => (job, row_claimed, seen, redelivered),
        check::Check::Done(durable) => return Ended::Skipped.or_lost(durable),
    };
    let handler = match clear_to_run(sh, &job, &origin).await {
        Ok(handler) => handler,
        Err(durable) => return Ended::Skipped.or_lost(durable),
    };
    if !super::ownership::holds() {
        // Its partition was lost during the checks (a cut from the broker past the
        // session): the partition's next owner runs the job.
        tracing::info!(job_id = %job.job_id, partition = origin.partition, "partition no longer owned here; the job is left to its next owner");
        return Ended::NotDurable;
    }
    let (start, seen) = Start::of(Start::twin_may_run(&job, &origin, redelivered), redelivered, seen);
    let started_at = sh.clock.now_ms();
    waited.record(sh, &job, started_at);
    let spans = RunSpans::start(sh, &job, &origin, &waited, started_at);
    let mut run = run(sh, &job, handler, slot, (started_at, &seen, start), spans.traceparent()).await;
    run.row_claimed = row_claimed;
    let spans = spans.ran(&run, sh.clock.now_ms());
    let ended = settle::settle(sh, &job, &origin, &run).await;
    if !ended.is_durable() && run.running_written && !run.live.is_fenced() {
        Box::pin(release_mark(sh, &job)).await;
    }
    spans.settled(sh.clock.now_ms());
    // A fenced run leaves the job's reaper entry: its row still shows it running here.
    if run.running_written && !run.live.is_fenced() {
        if let Err(e) = Box::pin(sh.store.delete_running_job(sh.pool.as_str(), &job.job_id)).await {
            tracing::debug!(job_id = %job.job_id, error = %e, "could not clear running index");
        }
    }
    ended
}

/// A queued job past its `not_after`, settled without a slot: the effectively-once check
/// expires it (or settles a redelivered copy of a job that ended as such).
pub async fn expire_queued(sh: Arc<RouteContext>, job: Arc<JobSubmitted>, origin: Origin) -> Ended {
    sh.admission_tally.lock().expect("admission tally").dispatched(&job);
    let not_after = job.not_after.unwrap_or_default();
    let durable = match check::before_run(&sh, job, &origin).await {
        check::Check::Done(durable) => durable,
        // Not past its deadline after all (the clock stepped back): it expires anyway,
        // as it was taken out of the queue for that.
        check::Check::Run { job, .. } => check::expire(&sh, &job, not_after).await,
    };
    Ended::Skipped.or_lost(durable)
}

/// Clears a job to run: it needs a handler on this worker and its dependency's breaker
/// must let it through. `Err(durable)`: it was settled instead (failed permanently, or
/// held back on the dependency retry topic with its attempt unchanged).
async fn clear_to_run(
    sh: &RouteContext,
    job: &Arc<JobSubmitted>,
    origin: &Origin,
) -> Result<Arc<dyn Handler>, Durable> {
    let Some(handler) = sh.registry.get(&job.job_type) else {
        let err = HandlerError::permanent(format!(
            "no handler for job type {:?} on this worker; add it to [job_types] or register a Rust handler",
            job.job_type
        ));
        return Err(Box::pin(settle::fail(sh, job, origin, err, super::durable::Ran::default())).await);
    };
    let now = sh.clock.now_ms();
    if let Some((dependency, until)) = sh.dependencies.held(sh.cfg.dependencies_of(&job.job_type), now) {
        // The dependency's fleet-wide breaker is open: hold the job (no attempt used)
        // until its end, spread so held jobs do not all return at once.
        metrics::counter!(m::DEPENDENCY_HELD, "dependency" => dependency, "at" => "worker").increment(1);
        let spread = (sh.dice.unit() * crate::dependencies::RETURN_SPREAD_MS as f64) as i64;
        return Err(Box::pin(durable::hold_back(sh, job, until.saturating_add(spread))).await);
    }
    if let Verdict::Rejected { retry_at } =
        sh.breaker_verdict(&job.job_type, &job.tenant, job.attempt == 0 && job.crash_count == 0, now)
    {
        // The job type's dependency is failing: hold the job back (no attempt used)
        // on the dependency retry topic until the breaker lets a probe through.
        let job_type = sh.bounded_job_type(&job.job_type);
        let what = crate::core::refusals::Holder::JobTypeBreaker(&job_type).limit();
        sh.admission_tally.lock().expect("admission tally").held(&job.tenant, &what, sh.pool.as_str(), now);
        metrics::counter!(m::BREAKER_REJECTIONS, "job_type" => job_type).increment(1);
        return Err(Box::pin(durable::hold_back(sh, job, retry_at)).await);
    }
    Ok(handler)
}

/// When a run writes its running mark (`mark_running`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Past `RUNNING_WRITE_GRACE`: a short job costs the store no write for it.
    Graced,
    /// At once, after the handler's first poll: a worker may have started this record
    /// before (`check::Check::Run`).
    Redelivered,
    /// Before the handler runs at all: another copy may run the job beside this one since
    /// the check's read. The partition was revoked while the job was in its checks
    /// (`worker::ownership`), so its next owner may have run it; or the job is delayed and
    /// has a twin record ([`Start::twin_may_run`]). A refused mark means the handler never
    /// runs.
    MarkFirst,
}

impl Start {
    /// The start of a run, and the row its mark expects. A job that marks first and whose
    /// check read no row (nobody could have started it then) expects none still.
    fn of(twin: bool, redelivered: bool, seen: check::Seen) -> (Start, check::Seen) {
        match (super::ownership::may_start() && !twin, redelivered) {
            (false, _) if seen == check::Seen::Unread => {
                (Start::MarkFirst, check::Seen::Row { worker: None, written_at: None })
            }
            (false, _) => (Start::MarkFirst, seen),
            (true, true) => (Start::Redelivered, seen),
            (true, false) => (Start::Graced, seen),
        }
    }

    /// A delayed job has two records once handed to the relay: the submitter's and the
    /// relay's due copy (`worker::relay`). The submitter's record is committed after the
    /// hand-off, but a partition that moves first is read again by its next owner past
    /// the job's `execute_at`, and both copies may then read the row before either writes
    /// it (the fleet simulator's seed 232185: a 0 ms job run twice, 13 ms apart). So the
    /// relay's copy, and a submitter's record of a delayed job read again, mark first: the
    /// second mark is refused. A submitter's record read the first time runs as usual.
    fn twin_may_run(job: &JobSubmitted, origin: &Origin, redelivered: bool) -> bool {
        job.execute_at.is_some() && (redelivered || !origin.submitted)
    }
}

/// Ends a timer task when dropped (the run it watches is over).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A job with a `not_after` still running at it is cancelled then (it ends as expired)
/// and aborted if it ignores that past `worker.cancel_grace`.
fn expire_at_not_after(sh: &RouteContext, job: &JobSubmitted, live: &Arc<JobLive>) -> Option<AbortOnDrop> {
    let not_after = job.not_after?;
    let (live, grace, job_id) = (live.clone(), sh.cfg.worker.cancel_grace, job.job_id.clone());
    let wait = Duration::from_millis((not_after - sh.clock.now_ms()).max(0) as u64);
    Some(AbortOnDrop(tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        tracing::info!(%job_id, not_after, "running past its not_after: cancelling it");
        live.expire();
        tokio::time::sleep(grace).await;
        tracing::warn!(%job_id, "ignored its not_after past worker.cancel_grace; aborting it");
        live.abort();
    })))
}

/// Runs the handler under its deadline. Jobs that outlive `RUNNING_WRITE_GRACE` get
/// a "running" row with a first heartbeat, so a dead or hung worker is noticed; a
/// redelivered record gets it as it starts, and a copy another may run beside (a revoked
/// partition's, a delayed job's twin) before its handler runs ([`Start`]). The scheduler
/// slot is released as soon as the handler returns.
async fn run(
    sh: &RouteContext,
    job: &Arc<JobSubmitted>,
    handler: Arc<dyn Handler>,
    slot: &mut SlotRelease,
    (started_at, seen, start): (i64, &check::Seen, Start),
    traceparent: Option<String>,
) -> Run {
    let timeout = sh.job_timeout(&job.job_type);
    let deadline = tokio::time::Instant::now() + timeout;
    let live = Arc::new(JobLive::default());
    live.advanced(started_at);
    live.publish_progress(crate::watch::events::ProgressSink::new(sh.broker.clone(), &sh.cfg, &sh.worker_id, job));
    let ctx =
        JobContext::new(job.clone(), deadline, live.clone(), sh.checkpoints.clone()).with_traceparent(traceparent);
    {
        let mut running = sh.running.lock().expect("running map");
        running.insert(job.job_id.clone(), live.clone());
        // Started while the pool hands its jobs off (it was in its pre-run checks): ask it
        // to stop at once, as `request_stop_all` did for the others (same lock).
        if sh.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            live.request_stop();
        }
    }
    sh.metrics.jobs_running.increment(1.0);
    let _expiry = expire_at_not_after(sh, job, &live);
    let stuck_after = sh.cfg.stuck_after(&job.job_type, sh.pool);
    let grace = sh.cfg.kill_grace(&job.job_type);
    let (mut running_written, mut superseded, mut unmarked) = (false, false, false);
    let result = {
        // The handler is called at the first poll: a run whose first mark is refused never
        // calls it (a handler may start its work in the call, before its future is polled).
        let mut run = std::pin::pin!(tokio::time::timeout_at(deadline, async move { handler.run(ctx).await }));
        let mut stuck = std::pin::pin!(stuck_watch(&live, stuck_after, grace, sh.clock.as_ref()));
        // The handler first: a job that is done at its first poll (most short jobs) then
        // never arms the grace timer nor the deadline's (timers arm when first polled).
        let first = start == Start::MarkFirst;
        tokio::select! {
            biased;
            r = &mut run, if !first => Some(r),
            _ = live.aborted() => None,
            _ = &mut stuck => None,
            _ = tokio::time::sleep(if start == Start::Graced { RUNNING_WRITE_GRACE } else { Duration::ZERO }) => {
                crate::watch::events::started(sh.broker.as_ref(), &sh.cfg, &sh.worker_id, job, started_at);
                let (marked, _unwatched) = Box::pin(mark_running(sh, job, started_at, seen, &live)).await;
                running_written = marked == Marked::Written;
                superseded = marked == Marked::Superseded;
                unmarked = marked == Marked::NotWritten;
                // A refused first mark: the handler never runs, and nothing is published
                // (a fenced run's copy is taken in again, `settle`).
                let never_ran = first && !running_written;
                if never_ran && unmarked {
                    live.fence();
                }
                let interval = sh.cfg.pool(sh.pool).heartbeat_interval;
                tokio::select! {
                    _ = std::future::ready(()), if never_ran => None,
                    r = &mut run, if !never_ran => Some(r),
                    _ = live.aborted() => None,
                    _ = &mut stuck => None,
                    _ = super::liveness::fence_watch(&live, &job.job_id, sh.pool, interval), if running_written => None,
                }
            }
        }
    };
    // Counted before the slot goes back, so the pool loop sees the cap when it refills it.
    if live.is_abnormal() || live.stuck_reason().is_some() {
        sh.record_recycling(&job.tenant, sh.clock.now_ms());
    }
    let output_bytes = match &result {
        Some(Ok(Ok(output))) => output.len(),
        _ => 0,
    };
    slot.release(result.is_some(), output_bytes);
    sh.running.lock().expect("running map").remove(&job.job_id);
    sh.metrics.jobs_running.decrement(1.0);
    Run { started_at, timeout, result, live, running_written, row_claimed: false, superseded, unmarked }
}

/// A run that ended here with an outcome that is not durable (the broker or the store
/// refused a write) leaves its row handed off, no longer running here: its heartbeats
/// stopped with it, and the copy that runs the job again (here, or on the partition's
/// next owner) claims it instead of taking a lapsed run over and counting a crash of a
/// worker that is alive (the fleet simulator's seed 1667: two crashes and a cut from the
/// broker dead-lettered a healthy job as poison). Best effort: the mark is conditional on
/// the row showing the job running here, and a refused one leaves the lapse to decide.
async fn release_mark(sh: &RouteContext, job: &JobSubmitted) {
    match sh.store.mark_handed_off(&job.job_id, &sh.worker_id, sh.clock.now_ms()).await {
        Ok(released) => {
            tracing::debug!(job_id = %job.job_id, released, "outcome not durable: the running mark is released")
        }
        Err(e) => {
            tracing::debug!(job_id = %job.job_id, error = %e, "outcome not durable; the running mark stays until it lapses")
        }
    }
}

/// How a run's running mark went (`mark_running`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marked {
    Written,
    /// The row shows the job finished (another copy ran it meanwhile): this run is
    /// superseded, stopped, and its outcome dropped (`settle`).
    Superseded,
    /// The store did not take the write: the run is stopped and handed back.
    NotWritten,
}

/// Writes the running row, first heartbeat and reaper entry of a job that outlived
/// `RUNNING_WRITE_GRACE`, retried a few times. A job the store has no running row for
/// must not go on: if its worker died, nothing would re-dispatch it, and a redelivered
/// copy would find no row and run it a second time at once. So when the store does not
/// take the write (or the job cannot be encoded for the reaper), the job is asked to
/// stop, aborted past `worker.cancel_grace` or the fence's bound (two heartbeat intervals)
/// if sooner, and handed back like a hand-off (its copy is held by the pre-run check
/// while the store is down): logged as an error, counted in
/// `fairway_running_write_failures_total`. The mark is conditional on the row not showing
/// the job finished: a run that finds it so is stopped the same way, as superseded
/// (counted in `fairway_superseded_writes_total{write="running"}`). Returns how the mark
/// went, and the abort timer of a job that was stopped (dropped when the run ends).
async fn mark_running(
    sh: &RouteContext,
    job: &JobSubmitted,
    started_at: i64,
    seen: &check::Seen,
    live: &Arc<JobLive>,
) -> (Marked, Option<AbortOnDrop>) {
    let failure = match codec::encode_job(job) {
        Ok(encoded) => {
            let u = update(sh, job, "running", Some(started_at), None);
            let mut waits = RUNNING_WRITE_RETRIES.iter();
            loop {
                let sent = tokio::time::Instant::now();
                let (now, ttl) = (sh.clock.now_ms(), sh.heartbeat_ttl_secs());
                let marked = match seen.as_read() {
                    None => sh.store.put_running_with_heartbeat(&u, &encoded, now, ttl).await,
                    Some(row) => sh.store.put_running_as_seen(&u, &encoded, now, ttl, row).await,
                };
                match marked {
                    Ok(true) => {
                        live.beat_acknowledged(sent);
                        return (Marked::Written, None);
                    }
                    Ok(false) if seen.as_read().is_some() && !finished_meanwhile(sh, job).await => {
                        return changed_meanwhile(sh, job, live);
                    }
                    Ok(false) => {
                        metrics::counter!(m::SUPERSEDED_WRITES, "pool" => sh.pool.as_str(), "write" => "running")
                            .increment(1);
                        tracing::info!(job_id = %job.job_id, "the job finished elsewhere while it started here; this run is stopped");
                        return (Marked::Superseded, Some(stop_run(sh, live)));
                    }
                    Err(e) => match waits.next() {
                        Some(wait) => tokio::time::sleep(*wait).await,
                        None => break e.to_string(),
                    },
                }
            }
        }
        Err(e) => format!("the job cannot be encoded for the reaper: {e}"),
    };
    metrics::counter!(m::RUNNING_WRITE_FAILURES, "pool" => sh.pool.as_str()).increment(1);
    tracing::error!(
        job_id = %job.job_id, error = %failure,
        "could not record the running state; the run is fenced and the job handed back (it does not run without a reaper entry)"
    );
    // Aborted within the fence's bound, not `worker.cancel_grace` (300 s by default):
    // the row does not show this run, so a copy may start anywhere meanwhile (the fleet
    // simulator's seed 1213: two runs at once for 15 s, past the lease's lapse).
    let interval = sh.cfg.pool(sh.pool).heartbeat_interval;
    let grace = sh.cfg.worker.cancel_grace.min(super::liveness::fence_after(interval));
    (Marked::NotWritten, Some(stop_run_within(live, grace)))
}

/// Whether a job whose running mark was refused shows finished (its run is superseded);
/// false also when the row cannot be read (the run is then fenced: its copy looks again).
async fn finished_meanwhile(sh: &RouteContext, job: &JobSubmitted) -> bool {
    matches!(sh.store.job(&job.job_id).await, Ok(Some(row)) if row.is_terminal())
}

/// A run whose running mark was refused because the row no longer names the worker its
/// check saw, and the job has not finished: another copy that read the same row started
/// first and marked it (a partition moved while that run was in its grace). The run is fenced at once (its outcome dropped, nothing published) and its copy
/// taken in again, whose check then follows what the row shows: it waits for that run's
/// heartbeats, or skips the finished job, or takes a lapsed run over.
fn changed_meanwhile(sh: &RouteContext, job: &JobSubmitted, live: &Arc<JobLive>) -> (Marked, Option<AbortOnDrop>) {
    metrics::counter!(m::SUPERSEDED_WRITES, "pool" => sh.pool.as_str(), "write" => "running_as_seen").increment(1);
    tracing::info!(job_id = %job.job_id, "another copy of the job started meanwhile: this run is fenced and its copy looks again");
    live.fence();
    (Marked::NotWritten, None)
}

/// Asks a run to stop, and aborts it past `worker.cancel_grace` unless the returned timer
/// is dropped first (when the run ends).
fn stop_run(sh: &RouteContext, live: &Arc<JobLive>) -> AbortOnDrop {
    stop_run_within(live, sh.cfg.worker.cancel_grace)
}

/// Asks a run to stop, and aborts it past `grace` unless the returned timer is dropped
/// first.
fn stop_run_within(live: &Arc<JobLive>, grace: Duration) -> AbortOnDrop {
    live.request_stop();
    let live = live.clone();
    AbortOnDrop(tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        live.abort();
    }))
}

/// The stuck-job detector of one run (`core::stuck`): once the job is silent for
/// `stuck_after` it is marked stuck (its handler is asked to stop: a `process` child gets
/// SIGTERM); this future then ends after `grace`, and the run is aborted if the handler
/// has not returned by then. Never ends without a `stuck_after`.
async fn stuck_watch(live: &JobLive, stuck_after: Option<DurationMs>, grace: Duration, clock: &dyn Clock) {
    loop {
        let now = clock.now_ms();
        match stuck::watch(live.last_advance(), now, stuck_after) {
            stuck::Watch::Fine { next: None } => std::future::pending::<()>().await,
            stuck::Watch::Fine { next: Some(at) } => {
                tokio::time::sleep(Duration::from_millis((at - now).max(1) as u64)).await
            }
            stuck::Watch::Stuck { silent_ms } => {
                let after = stuck_after.unwrap_or_default();
                tracing::warn!(silent_ms, stuck_after = %after, "job stuck: no progress, checkpoint or heartbeat; stopping it");
                live.mark_stuck(stuck::reason(silent_ms, after));
                break;
            }
        }
    }
    tokio::time::sleep(grace).await;
}
