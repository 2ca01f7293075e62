//! A job's route (check → run → settle) run whole against the in-memory doubles of the
//! store and the broker (`sim::doubles`) under tokio's paused time: no services.

use super::exec::{self, SlotRelease, Waited};
use super::route::{Ended, Origin};
use super::{frontier, Health, RouteContext};
use crate::config::Config;
use crate::core::offsets::PartitionOffsets;
use crate::handlers::{Handler, HandlerResult, JobContext, Registry};
use crate::model::{FailureClass, JobStatus, JobSubmitted, Pool};
use crate::seams::RouteStore;
use crate::seams::{Clock, TokioClock};
use crate::sim::doubles::{MemBroker, MemStore};
use crate::store::StateUpdate;
use futures::future::BoxFuture;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const EPOCH: i64 = 1_790_000_000_000;
/// A run long enough for copies to meet it in flight, and shorter than its fence (two
/// heartbeat intervals of the short pool: no heartbeat loop runs here).
const LONG_RUN: Duration = Duration::from_secs(8);
const JOB_TYPE: &str = "t";

/// Returns its payload after `delay`; its first `hang` runs never return (the worker dies
/// under them).
struct Echo {
    runs: AtomicUsize,
    hang: usize,
    delay: Duration,
}

impl Handler for Echo {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        let hang = self.runs.fetch_add(1, Ordering::SeqCst) < self.hang;
        let delay = self.delay;
        Box::pin(async move {
            if hang {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(delay).await;
            Ok(ctx.job.payload.clone())
        })
    }
}

/// One worker's route context over the doubles (a new `worker_id` is a new process).
struct Fixture {
    store: Arc<MemStore>,
    broker: Arc<MemBroker>,
    clock: Arc<dyn Clock>,
    echo: Arc<Echo>,
    cfg: Arc<Config>,
}

impl Fixture {
    fn new(hang: usize) -> Fixture {
        Fixture::with(hang, Duration::ZERO)
    }

    fn with(hang: usize, delay: Duration) -> Fixture {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(EPOCH));
        Fixture {
            store: Arc::new(MemStore::new(clock.clone())),
            broker: Arc::new(MemBroker::default()),
            clock,
            echo: Arc::new(Echo { runs: AtomicUsize::new(0), hang, delay }),
            cfg: Arc::new(Config::builtin()),
        }
    }

    fn worker(&self, worker_id: &str) -> Arc<RouteContext> {
        self.worker_running(worker_id, self.echo.clone())
    }

    /// A worker whose handler of the job type is `handler`.
    fn worker_running(&self, worker_id: &str, handler: Arc<dyn Handler>) -> Arc<RouteContext> {
        self.worker_with_feed(worker_id, handler, Arc::new(frontier::CancelFeed::default()))
    }

    /// A worker whose frontier may skip the state read of a fresh job while `feed` is
    /// current (`CancelFeed::polled_empty`), as a worker's does.
    fn worker_with_feed(
        &self,
        worker_id: &str,
        handler: Arc<dyn Handler>,
        feed: Arc<frontier::CancelFeed>,
    ) -> Arc<RouteContext> {
        let (cfg, pool) = (self.cfg.clone(), Pool::Short);
        let mut registry = Registry::default();
        registry.insert(JOB_TYPE, handler);
        Arc::new(RouteContext {
            results_topic: cfg.results_topic(),
            metrics: crate::metrics::PoolMetrics::new(pool.as_str()),
            pool,
            store: self.store.clone(),
            broker: self.broker.clone(),
            clock: self.clock.clone(),
            dice: Arc::new(crate::seams::ThreadDice),
            checkpoints: None,
            registry,
            worker_id: worker_id.to_string(),
            running: Mutex::default(),
            in_flight: Default::default(),
            stopping: Default::default(),
            health: Mutex::new(Health::new(&cfg, worker_id)),
            frontiers: frontier::Frontiers::new(cfg.pool_topic(pool), cfg.worker.skip_fresh_reads, feed),
            admission_tally: Default::default(),
            ranges: cfg.run_ranges(),
            recycling: Mutex::new(crate::core::recycling::Recycling::new(cfg.pool(pool).recycling)),
            dependencies: Default::default(),
            store_refused_at: Default::default(),
            started_at: 0,
            cfg,
        })
    }

    fn job(&self) -> Arc<JobSubmitted> {
        let at = self.clock.now_ms();
        Arc::new(JobSubmitted::original("job-1".into(), "tenant-a".into(), JOB_TYPE.into(), b"in".to_vec(), at))
    }

    fn origin(&self) -> Origin {
        Origin {
            topic: self.cfg.pool_topic(Pool::Short),
            partition: 0,
            offset: 7,
            submitted: false,
            taken_again: false,
        }
    }

    /// Runs the job's route on `route` as the pool loop does, to its end.
    async fn execute(&self, route: Arc<RouteContext>, job: Arc<JobSubmitted>) -> Ended {
        let now = self.clock.now_ms();
        let mut slot = SlotRelease::new(|_, _| {});
        let waited = Waited { received_at: now, dispatched_at: now };
        exec::execute(route, job, self.origin(), &mut slot, waited).await
    }

    fn results(&self) -> Vec<crate::model::JobResult> {
        let topic = self.cfg.results_topic();
        self.broker.sent_to(&topic).iter().map(|s| crate::codec::decode_result(&s.payload).unwrap()).collect()
    }
}

/// The pool loop's commit rule: the offset is finished only if the route's end is durable;
/// the partition commits up to (not including) its oldest unfinished offset.
fn commit(offsets: &mut PartitionOffsets, offset: i64, ended: Ended) -> Option<i64> {
    if ended.is_durable() {
        offsets.finished(offset);
    }
    offsets.committable()
}

#[tokio::test(start_paused = true)]
async fn a_job_runs_and_its_result_and_state_are_recorded_before_its_commit() {
    let f = Fixture::new(0);
    let mut offsets = PartitionOffsets::new();
    offsets.started(7).unwrap();
    let ended = f.execute(f.worker("w1"), f.job()).await;
    assert_eq!(ended, Ended::Ran);
    let results = f.results();
    assert_eq!(results.len(), 1, "one result");
    assert_eq!((results[0].status, results[0].attempts), (JobStatus::Succeeded, 1));
    assert_eq!(results[0].output.as_deref(), Some(&b"in"[..]));
    assert_eq!(f.store.row("job-1").and_then(|r| r.status).as_deref(), Some("succeeded"));
    assert_eq!(commit(&mut offsets, 7, ended), Some(8), "committed past the job once its outcome is durable");
}

#[tokio::test(start_paused = true)]
async fn an_outcome_the_broker_refused_holds_the_commit_and_the_copy_runs_again() {
    let f = Fixture::new(0);
    let mut offsets = PartitionOffsets::new();
    offsets.started(7).unwrap();
    f.broker.set_refusing(true);
    let ended = f.execute(f.worker("w1"), f.job()).await;
    assert_eq!(ended, Ended::NotDurable);
    assert!(f.results().is_empty());
    assert_eq!(f.store.row("job-1").and_then(|r| r.status), None, "no state before its result");
    assert_eq!(commit(&mut offsets, 7, ended), Some(7), "the commit stays at the job: it is redelivered");
    // Redelivered (after a restart) once the broker answers: it runs and settles.
    f.broker.set_refusing(false);
    let ended = f.execute(f.worker("w2"), f.job()).await;
    assert_eq!(ended, Ended::Ran);
    assert_eq!(f.results().len(), 1);
    assert_eq!(commit(&mut offsets, 7, ended), Some(8));
}

#[tokio::test(start_paused = true)]
async fn a_crash_before_settle_reruns_the_job_without_using_an_attempt() {
    let f = Fixture::new(1);
    let job = f.job();
    // The first worker runs the job past its running-row grace, then dies mid-run.
    let first = spawn_route(&f, f.worker("w1"), job.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let row = f.store.row("job-1").expect("a running row after the grace");
    assert_eq!((row.status.as_deref(), row.worker.as_deref()), (Some("running"), Some("w1")));
    assert!(f.store.in_running_index("short", "job-1"), "the reaper can find it");
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    assert!(f.results().is_empty(), "no outcome: it died before settling");
    // Its copy is redelivered to a restarted worker: it waits out the dead worker's
    // heartbeat, takes the job over as a crash, and runs it.
    let ended = f.execute(f.worker("w2"), job).await;
    assert_eq!(ended, Ended::Ran);
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 2, "ran again");
    let results = f.results();
    assert_eq!(results.len(), 1);
    assert_eq!((results[0].status, results[0].attempts), (JobStatus::Succeeded, 1), "the crash used no attempt");
    let row = f.store.row("job-1").unwrap();
    assert_eq!((row.status.as_deref(), row.crash_count, row.attempts), (Some("succeeded"), Some(1), Some(1)));
}

/// The simulator's seed 329: a job's run ends without a durable outcome; its partition
/// comes back to this worker and the copy must not be settled as "running here" (its
/// commit would lose the job). The run released its running mark (the fleet simulator's
/// seed 1667: else a copy on another worker took the lapsed run over as a crash), so the
/// copy claims the job and runs it, with no crash counted.
#[tokio::test(start_paused = true)]
async fn a_copy_of_a_job_whose_run_here_was_not_durable_runs_again() {
    let f = Fixture::with(0, Duration::from_secs(1));
    let w1 = f.worker("w1");
    f.broker.set_refusing(true);
    let ended = f.execute(w1.clone(), f.job()).await;
    assert_eq!(ended, Ended::NotDurable);
    let row = f.store.row("job-1").expect("a row: it ran past the grace");
    assert_eq!(row.status.as_deref(), Some("handed_off"), "the running mark is released: {row:?}");
    f.broker.set_refusing(false);
    let ended = f.execute(w1, f.job()).await;
    assert_eq!(ended, Ended::Ran, "the copy ran the job: its first run's outcome was lost");
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 2);
    let results = f.results();
    assert_eq!(results.len(), 1, "one result");
    assert_eq!((results[0].status, results[0].attempts), (JobStatus::Succeeded, 1));
    assert_eq!(f.store.row("job-1").unwrap().crash_count.unwrap_or(0), 0, "no crash counted");
}

/// The simulator's seed 202: a later attempt's copy finds the row running an earlier
/// attempt with a fresh heartbeat (a take-over re-run of it, or the run whose "retrying"
/// write was lost): it waits while that heartbeat is fresh instead of running beside it,
/// then runs (no crash counted).
#[tokio::test(start_paused = true)]
async fn a_later_attempt_waits_while_an_earlier_run_heartbeats() {
    // The earlier run never returns (it fences itself once its heartbeats go
    // unacknowledged); the later attempt's run returns at once.
    let f = Fixture::new(1);
    let first = spawn_route(&f, f.worker("w1"), f.job());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut later = (*f.job()).clone();
    later.attempt = 1;
    let second = spawn_route(&f, f.worker("w2"), Arc::new(later));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 1, "the later attempt waits while the earlier run heartbeats");
    // No heartbeat loop here: the first run's heartbeat lapses, and the later attempt runs.
    assert_eq!(second.await.unwrap(), Ended::Ran);
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 2);
    let row = f.store.row("job-1").unwrap();
    assert_eq!(row.crash_count.unwrap_or(0), 0, "not counted as a crash");
    first.abort();
}

/// Fails after `delay`: an application error (retried), or for good when `permanent`.
struct Fails {
    delay: Duration,
    permanent: bool,
}

impl Handler for Fails {
    fn run(&self, _ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        let (delay, permanent) = (self.delay, self.permanent);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            Err(if permanent {
                crate::handlers::HandlerError::permanent("bad input")
            } else {
                crate::handlers::HandlerError::app("boom")
            })
        })
    }
}

/// `job-1`'s state as `worker` writes it (attempt 0).
fn state<'a>(job: &'a JobSubmitted, status: &'a str, worker: &'a str, crash_count: i32) -> StateUpdate<'a> {
    StateUpdate {
        job_id: &job.job_id,
        tenant: &job.tenant,
        job_type: &job.job_type,
        pool: "short",
        status,
        attempts: 0,
        crash_count,
        generation: 0,
        submitted_at: job.submitted_at,
        started_at: Some(EPOCH),
        finished_at: None,
        worker,
        error: None,
        failure_class: None,
        output: None,
        usage: None,
    }
}

/// The simulator's seed 528: w1's run is taken over by w2 (its heartbeats lapsed, a take-
/// over counts a crash); w1's run then fails. Its retry copy goes out, but its `retrying`
/// write is refused: the row stays w2's, so no copy finds it `retrying` and runs beside w2.
#[tokio::test(start_paused = true)]
async fn a_superseded_runs_retrying_write_leaves_the_take_overs_row() {
    let mut f = Fixture::new(0);
    // This worker's own retry budget (the fleet-wide one has no fleet counts here).
    let mut cfg = Config::builtin();
    cfg.worker.fleet_limits = false;
    f.cfg = Arc::new(cfg);
    let (job, w1) =
        (f.job(), f.worker_running("w1", Arc::new(Fails { delay: Duration::from_secs(5), permanent: false })));
    let first = spawn_route(&f, w1, job.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(f.store.row("job-1").and_then(|r| r.worker).as_deref(), Some("w1"), "marked running on w1");
    let take_over = state(&job, "running", "w2", 1);
    assert!(f.store.put_running_with_heartbeat(&take_over, b"job", f.clock.now_ms(), 3).await.unwrap());
    assert_eq!(first.await.unwrap(), Ended::Ran);
    let row = f.store.row("job-1").unwrap();
    let seen = (row.status.as_deref(), row.worker.as_deref(), row.crash_count, row.attempts);
    assert_eq!(seen, (Some("running"), Some("w2"), Some(1), Some(0)), "the take-over's row stands");
    assert_eq!(f.broker.sent_to(&f.cfg.retry_topic(FailureClass::AppError)).len(), 1, "its retry copy went out");
}

/// The simulator's seed 2191: a copy starts while another one finishes the job; its running
/// mark (after the grace) finds the row terminal and is refused: the run is stopped and its
/// outcome dropped (no second result), the row stays terminal.
#[tokio::test(start_paused = true)]
async fn a_run_whose_running_mark_finds_the_job_finished_is_stopped_without_a_second_result() {
    let f = Fixture::with(0, Duration::from_secs(600));
    let job = f.job();
    let run = spawn_route(&f, f.worker("w1"), job.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    f.store.put_state(&state(&job, "succeeded", "w2", 0), f.clock.now_ms()).await.unwrap();
    assert_eq!(run.await.unwrap(), Ended::Ran, "stopped (aborted past its grace), not held");
    assert!(f.results().is_empty(), "no second result");
    let row = f.store.row("job-1").unwrap();
    assert_eq!((row.status.as_deref(), row.worker.as_deref()), (Some("succeeded"), Some("w2")));
    assert!(!f.store.in_running_index("short", "job-1"), "no reaper entry");
}

/// Runs a copy of the job on `route` in a task, as the pool loop does; the flag turns
/// true when its slot goes back.
fn spawn_copy(f: &Fixture, route: Arc<RouteContext>) -> (tokio::task::JoinHandle<Ended>, Arc<AtomicUsize>) {
    spawn_copy_of(f, route, f.job())
}

/// `spawn_copy` of a given copy of the job.
fn spawn_copy_of(
    f: &Fixture,
    route: Arc<RouteContext>,
    job: Arc<JobSubmitted>,
) -> (tokio::task::JoinHandle<Ended>, Arc<AtomicUsize>) {
    let freed = Arc::new(AtomicUsize::new(0));
    let (origin, flag) = (f.origin(), freed.clone());
    let task = tokio::spawn(async move {
        let mut slot = SlotRelease::new(move |_, _| {
            flag.store(1, Ordering::SeqCst);
        });
        let waited = Waited { received_at: EPOCH, dispatched_at: EPOCH };
        exec::execute(route, job, origin, &mut slot, waited).await
    });
    (task, freed)
}

/// A second copy of a job whose route is in flight on this worker (its partition came
/// back, a hand-off copy beside the redelivered original) gives its slot back at once and
/// ends as that route does: durably once the job's outcome is recorded, never running it.
/// A third copy shares the second's wait (the route's channel is made for its first
/// follower).
#[tokio::test(start_paused = true)]
async fn a_copy_of_a_job_in_flight_here_follows_it_without_a_slot() {
    let f = Fixture::with(0, LONG_RUN);
    let w1 = f.worker("w1");
    let (first, _) = spawn_copy(&f, w1.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (second, freed) = spawn_copy(&f, w1.clone());
    let (third, _) = spawn_copy(&f, w1);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(freed.load(Ordering::SeqCst), 1, "the follower gave its slot back at once");
    assert!(!second.is_finished(), "it ends only with the route it follows");
    assert_eq!(first.await.unwrap(), Ended::Ran);
    assert_eq!(second.await.unwrap(), Ended::Skipped, "durable: the job's outcome is recorded");
    assert_eq!(third.await.unwrap(), Ended::Skipped, "so is the second follower");
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 1, "the followers never ran it");
    assert_eq!(f.results().len(), 1);
}

/// The route a copy follows ends without a durable outcome: the follower is not durable
/// either (its offset stays uncommitted and the job is redelivered), never settled.
#[tokio::test(start_paused = true)]
async fn a_follower_of_a_route_that_was_not_durable_is_not_durable() {
    let f = Fixture::with(0, LONG_RUN);
    let w1 = f.worker("w1");
    f.broker.set_refusing(true);
    let (first, _) = spawn_copy(&f, w1.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (second, _) = spawn_copy(&f, w1);
    assert_eq!(first.await.unwrap(), Ended::NotDurable);
    assert_eq!(second.await.unwrap(), Ended::NotDurable);
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 1);
}

/// The job with its hand-off count set.
fn handed_off(job: &JobSubmitted, handoff_count: i32) -> Arc<JobSubmitted> {
    Arc::new(JobSubmitted { handoff_count, ..job.clone() })
}

/// A copy with a higher hand-off count than the route in flight here may be the hand-off
/// that route recorded as it ended: it follows without a slot but is never settled by that
/// end (not durable: taken in again), and its own check then settles it.
#[tokio::test(start_paused = true)]
async fn a_later_hand_off_copy_is_not_settled_by_the_route_it_follows() {
    let f = Fixture::with(0, LONG_RUN);
    let w1 = f.worker("w1");
    let (first, _) = spawn_copy(&f, w1.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (later, freed) = spawn_copy_of(&f, w1.clone(), handed_off(&f.job(), 1));
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(freed.load(Ordering::SeqCst), 1, "the follower gave its slot back at once");
    assert_eq!(first.await.unwrap(), Ended::Ran);
    assert_eq!(later.await.unwrap(), Ended::NotDurable, "never settled by the route it followed");
    let (again, _) = spawn_copy_of(&f, w1, handed_off(&f.job(), 1));
    assert_eq!(again.await.unwrap(), Ended::Skipped, "taken in again, its check finds the job finished");
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 1);
    assert_eq!(f.results().len(), 1);
}

/// A stale copy (a lower hand-off count, e.g. the original record redelivered) of a route
/// in flight here follows it and ends as it does: it waits for no heartbeat with a slot.
#[tokio::test(start_paused = true)]
async fn an_earlier_copy_follows_a_handed_off_route_in_flight_here() {
    let f = Fixture::with(0, LONG_RUN);
    let w1 = f.worker("w1");
    let (first, _) = spawn_copy_of(&f, w1.clone(), handed_off(&f.job(), 2));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (stale, freed) = spawn_copy(&f, w1);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(freed.load(Ordering::SeqCst), 1, "the follower gave its slot back at once");
    assert_eq!(first.await.unwrap(), Ended::Ran);
    assert_eq!(stale.await.unwrap(), Ended::Skipped);
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 1);
}

/// A delayed job read at its submitter's own record skips the state read as an immediate
/// one does; handed to the relay instead (not held here), its offset is covered first, so
/// the partition's next owner reads the state there (the relay's copy may be running).
#[tokio::test(start_paused = true)]
async fn a_delayed_submitters_record_skips_the_read_unless_handed_to_the_relay_before() {
    let f = Fixture::new(0);
    let now = f.clock.now_ms();
    let job = JobSubmitted { execute_at: Some(now), ..(*f.job()).clone() };
    let owner =
        |feed: &Arc<frontier::CancelFeed>| frontier::Frontiers::new(f.cfg.pool_topic(Pool::Short), true, feed.clone());
    let feed = Arc::new(frontier::CancelFeed::default());
    feed.polled_empty(now);
    let submitted = Origin { submitted: true, ..f.origin() };
    let first = owner(&feed);
    let start = async |o: &frontier::Frontiers, origin: Origin| {
        o.before_start(f.store.as_ref(), &job, &origin, now).await.unwrap()
    };
    let s = start(&first, submitted.clone()).await;
    assert!(s.skip_read && !s.maybe_started, "the submitter's record: {s:?}");
    let again = Origin { taken_again: true, ..submitted.clone() };
    let s = start(&first, again).await;
    assert!(!s.skip_read && s.maybe_started, "taken in again: read it, it ran here: {s:?}");
    let copy = Origin { offset: 9, ..f.origin() };
    assert!(!start(&first, copy).await.skip_read, "a relay's copy is read");
    // An offset far past the first's chunk, handed to the relay by the first owner.
    let handed = Origin { offset: 100_000, submitted: true, ..f.origin() };
    first.cover(f.store.as_ref(), &handed).await.unwrap();
    let next = owner(&feed);
    let s = start(&next, handed).await;
    assert!(!s.skip_read && s.maybe_started, "covered: read it, it may have run: {s:?}");
    let later = Origin { offset: 200_000, submitted: true, ..f.origin() };
    let s = start(&next, later).await;
    assert!(s.skip_read && !s.maybe_started, "beyond: nobody started it: {s:?}");
}

/// Runs `job` on `route` in the background as the pool loop does.
fn spawn_route(f: &Fixture, route: Arc<RouteContext>, job: Arc<JobSubmitted>) -> tokio::task::JoinHandle<Ended> {
    spawn_from(route, job, f.origin())
}

/// Runs `job` read at `origin` on `route` in the background as the pool loop does.
fn spawn_from(route: Arc<RouteContext>, job: Arc<JobSubmitted>, origin: Origin) -> tokio::task::JoinHandle<Ended> {
    tokio::spawn(async move {
        let mut slot = SlotRelease::new(|_, _| {});
        let waited = Waited { received_at: EPOCH, dispatched_at: EPOCH };
        exec::execute(route, job, origin, &mut slot, waited).await
    })
}

/// A run whose heartbeats lapsed (a worker cut from the store) is taken over by another
/// worker; when it ends, its row shows the other run: it publishes no result (the results
/// a cut-off worker published after its link came back, issue 62) and its copy is done
/// (the take-over's run ends the job).
#[tokio::test(start_paused = true)]
async fn a_run_taken_over_meanwhile_publishes_no_result() {
    let f = Fixture::with(0, Duration::from_secs(5));
    let job = f.job();
    let first = spawn_route(&f, f.worker("w1"), job.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(f.store.row("job-1").and_then(|r| r.worker).as_deref(), Some("w1"), "marked running on w1");
    let take_over = state(&job, "running", "w2", 1);
    assert!(f.store.put_running_with_heartbeat(&take_over, b"job", f.clock.now_ms(), 3).await.unwrap());
    // Not done here: taken in again, its check follows w2's run (which may yet die).
    assert_eq!(first.await.unwrap(), Ended::NotDurable);
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 1);
    assert!(f.results().is_empty(), "no result from the run taken over");
    let row = f.store.row("job-1").unwrap();
    assert_eq!(
        (row.status.as_deref(), row.worker.as_deref()),
        (Some("running"), Some("w2")),
        "the take-over's row stands"
    );
}

/// A run taken over meanwhile that then fails for good leaves no dead letter and no
/// result (the take-over decides the job); the same run not taken over dead-letters it.
#[tokio::test(start_paused = true)]
async fn a_run_taken_over_meanwhile_that_fails_for_good_leaves_no_dead_letter() {
    let f = Fixture::new(0);
    let fails = Arc::new(Fails { delay: Duration::from_secs(5), permanent: true });
    let job = f.job();
    let first = spawn_route(&f, f.worker_running("w1", fails.clone()), job.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(f.store.row("job-1").and_then(|r| r.worker).as_deref(), Some("w1"), "marked running on w1");
    let take_over = state(&job, "running", "w2", 1);
    assert!(f.store.put_running_with_heartbeat(&take_over, b"job", f.clock.now_ms(), 3).await.unwrap());
    assert_eq!(first.await.unwrap(), Ended::NotDurable, "taken in again to follow w2's run");
    assert!(f.broker.sent_to(&f.cfg.dlq_topic()).is_empty(), "no dead letter from the run taken over");
    assert!(f.results().is_empty(), "no result from the run taken over");
    let f = Fixture::new(0);
    let second = spawn_route(&f, f.worker_running("w1", fails), f.job());
    assert_eq!(second.await.unwrap(), Ended::Ran);
    assert_eq!(f.broker.sent_to(&f.cfg.dlq_topic()).len(), 1, "a run not taken over dead-letters the job");
    assert_eq!(f.results().len(), 1);
}

/// The same when the take-over already ended the job: no second result.
#[tokio::test(start_paused = true)]
async fn a_run_whose_job_ended_elsewhere_meanwhile_publishes_no_second_result() {
    let f = Fixture::with(0, Duration::from_secs(5));
    let job = f.job();
    let first = spawn_route(&f, f.worker("w1"), job.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ended = state(&job, "succeeded", "w2", 1);
    f.store.put_state(&ended, f.clock.now_ms()).await.unwrap();
    assert_eq!(first.await.unwrap(), Ended::Ran);
    assert!(f.results().is_empty(), "no second result");
    assert_eq!(f.store.row("job-1").and_then(|r| r.worker).as_deref(), Some("w2"));
    // A run never taken over still publishes (the fence reads, then lets it through).
    let f = Fixture::with(0, Duration::from_secs(5));
    assert_eq!(f.execute(f.worker("w1"), f.job()).await, Ended::Ran);
    assert_eq!(f.results().len(), 1);
}

/// The lease's edge (the simulator's seed 8478): a run whose heartbeats the store stops
/// acknowledging (an outage, a cut from the store) fences itself two intervals after its
/// newest acknowledged one, one interval before another copy may take the job over: it
/// publishes nothing, writes nothing, and its copy is not done. The take-over then runs
/// the job once, alone. Fails without the fence: the first run is still going at the
/// lapse, so both run at once.
#[tokio::test(start_paused = true)]
async fn a_run_whose_heartbeats_go_unacknowledged_fences_itself_before_the_lapse() {
    // Its first run would never return; the take-over's returns at once.
    let f = Fixture::new(1);
    let interval = f.cfg.pool(Pool::Short).heartbeat_interval;
    let job = f.job();
    let first = spawn_route(&f, f.worker("w1"), job.clone());
    // Marked running (with its first heartbeat) at the 250 ms grace; no beat after it.
    let marked_by = Duration::from_secs(1);
    tokio::time::sleep(marked_by).await;
    let row = f.store.row("job-1").expect("marked running");
    assert_eq!((row.status.as_deref(), row.worker.as_deref()), (Some("running"), Some("w1")));
    let lapse = super::liveness::lapse(interval);
    let first = tokio::time::timeout(lapse - marked_by, first).await.expect("fenced before the lapse").unwrap();
    assert_eq!(first, Ended::NotDurable, "its copy is taken in again");
    assert!(f.results().is_empty(), "a fenced run publishes nothing");
    let row = f.store.row("job-1").unwrap();
    assert_eq!((row.status.as_deref(), row.worker.as_deref()), (Some("running"), Some("w1")), "nothing written");
    assert!(f.store.in_running_index("short", "job-1"), "the reaper can still find it");
    // A copy elsewhere waits out the lapse, takes the job over and runs it to its end.
    let ended = f.execute(f.worker("w2"), job).await;
    assert_eq!(ended, Ended::Ran);
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 2);
    let results = f.results();
    assert_eq!(results.len(), 1, "one result");
    assert_eq!((results[0].status, results[0].attempts), (JobStatus::Succeeded, 1), "the fence used no attempt");
    assert_eq!(f.store.row("job-1").unwrap().crash_count, Some(1), "counted as the crash it looks like");
}

/// A copy taken in again after its run was fenced reads the job's row although its offset
/// is fresh to this worker's frontier: another worker took the job over meanwhile, so it
/// follows that run to its end instead of running beside it. Found on the engines
/// (`it_partitions`: a worker cut from the store re-ran 11 of its 30 fenced jobs beside
/// their take-overs once the store was back). Fails when a copy taken again may skip the
/// read: it runs a third time, at once.
#[tokio::test(start_paused = true)]
async fn a_copy_taken_in_again_after_its_fence_follows_the_take_over_instead_of_running_beside_it() {
    // The first run never returns (it is fenced); every later one takes 8 s.
    let f = Fixture::with(1, LONG_RUN);
    let feed = Arc::new(frontier::CancelFeed::default());
    feed.polled_empty(f.clock.now_ms());
    let w1 = f.worker_with_feed("w1", f.echo.clone(), feed.clone());
    let job = f.job();
    assert_eq!(spawn_route(&f, w1.clone(), job.clone()).await.unwrap(), Ended::NotDurable, "fenced");
    let second = spawn_route(&f, f.worker("w2"), job.clone());
    // w2 waits out the lapse, then takes the job over and runs it.
    for _ in 0..600 {
        if f.store.row("job-1").and_then(|r| r.worker).as_deref() == Some("w2") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 2, "taken over by w2");
    // w1 takes its record in again, as its pool loop does, with a current cancel feed.
    feed.polled_empty(f.clock.now_ms());
    let again = Origin { taken_again: true, ..f.origin() };
    let third = spawn_from(w1, job, again);
    assert_eq!(second.await.unwrap(), Ended::Ran);
    assert_eq!(third.await.unwrap(), Ended::Skipped, "it followed w2's run to its end");
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 2, "never run beside the take-over");
    assert_eq!(f.results().len(), 1);
}

/// A run whose running mark the store refused (its worker cut from the store at the
/// mark) publishes nothing, though its handler returns: no row shows the run, so once its
/// heartbeats' lapse passes another worker may take the job over and run it again (the
/// fleet simulator's seed 200060). Its copy is taken in again and follows what the row
/// shows. Fails without `Run::unmarked`: the result is published.
#[tokio::test(start_paused = true)]
async fn a_run_whose_running_mark_was_refused_publishes_nothing() {
    let f = Fixture::with(0, Duration::from_secs(5));
    let first = spawn_route(&f, f.worker("w1"), f.job());
    // Past the check's read, before the mark at the 250 ms grace.
    tokio::time::sleep(Duration::from_millis(100)).await;
    f.store.set_down(true);
    let ended = tokio::time::timeout(Duration::from_secs(30), first).await;
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 1, "the handler ran to its end");
    assert!(f.results().is_empty(), "no result from a run no row shows");
    assert_eq!(ended.expect("the route ends").unwrap(), Ended::NotDurable, "its copy is taken in again");
    f.store.set_down(false);
    assert!(f.store.row("job-1").is_none(), "nothing written");
}

/// A run that held its mark reads the job's row before publishing; when the row stays
/// unreadable through the whole outage bound (`durable::OUTAGE_RETRY`), the outcome is
/// held back rather than published blind (the fleet simulator's seed 590: the read failed
/// and the result went out while another worker had taken the job over). Fails when a
/// failed read lets the outcome through.
#[tokio::test(start_paused = true)]
async fn a_run_whose_row_stays_unreadable_before_its_outcome_publishes_nothing() {
    let f = Fixture::with(0, Duration::from_secs(5));
    let first = spawn_route(&f, f.worker("w1"), f.job());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let row = f.store.row("job-1").expect("marked running");
    assert_eq!((row.status.as_deref(), row.worker.as_deref()), (Some("running"), Some("w1")));
    f.store.set_down(true);
    let bound = super::durable::OUTAGE_RETRY + Duration::from_secs(60);
    let ended = tokio::time::timeout(bound, first).await;
    assert!(f.results().is_empty(), "no result published without reading the row");
    assert_eq!(
        ended.expect("held back within the outage bound").unwrap(),
        Ended::NotDurable,
        "its copy is taken in again"
    );
    f.store.set_down(false);
    let row = f.store.row("job-1").unwrap();
    assert_eq!(row.status.as_deref(), Some("running"), "nothing written over the mark");
}

/// A job still in its checks when its partition was revoked (`worker::ownership`) marks its
/// row before its handler runs, conditional on the row its check saw: when the partition's
/// next owner ran the job since (the fleet simulator's seed 221890: the check's read was
/// answered before that run), the mark is refused and the handler never runs. Here the
/// check skips its read (a fresh record nobody could have started), the strongest case.
/// Fails without the first mark: the handler runs and a second result goes out. With no
/// other run, the revoked copy runs behind its mark and its result goes out once.
#[tokio::test(start_paused = true)]
async fn a_job_revoked_in_its_checks_runs_only_behind_a_mark_its_next_owners_run_refuses() {
    let route = |f: &Fixture| {
        let feed = Arc::new(frontier::CancelFeed::default());
        feed.polled_empty(f.clock.now_ms());
        f.worker_with_feed("w1", f.echo.clone(), feed)
    };
    let revoked = || {
        let o = super::ownership::Ownership::new();
        o.revoke();
        o
    };
    let run_revoked = |f: &Fixture, job: Arc<JobSubmitted>| {
        let (route, origin) = (route(f), Origin { submitted: true, ..f.origin() });
        super::ownership::scope(revoked(), async move {
            let mut slot = SlotRelease::new(|_, _| {});
            let waited = Waited { received_at: EPOCH, dispatched_at: EPOCH };
            exec::execute(route, job, origin, &mut slot, waited).await
        })
    };
    let f = Fixture::new(0);
    let job = f.job();
    f.store.put_state(&state(&job, "succeeded", "w2", 0), f.clock.now_ms()).await.unwrap();
    assert_eq!(run_revoked(&f, job).await, Ended::Ran, "settled: the job finished on its next owner");
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 0, "the handler never ran");
    assert!(f.results().is_empty(), "no second result");
    let row = f.store.row("job-1").unwrap();
    assert_eq!((row.status.as_deref(), row.worker.as_deref()), (Some("succeeded"), Some("w2")));
    assert!(!f.store.in_running_index("short", "job-1"), "no reaper entry");

    let f = Fixture::new(0);
    assert_eq!(run_revoked(&f, f.job()).await, Ended::Ran);
    assert_eq!((f.echo.runs.load(Ordering::SeqCst), f.results().len()), (1, 1), "ran once, one result");
    let row = f.store.row("job-1").unwrap();
    assert_eq!((row.status.as_deref(), row.worker.as_deref()), (Some("succeeded"), Some("w1")));
    assert!(!f.store.in_running_index("short", "job-1"), "its reaper entry cleared");
}

/// A delayed job's two records (`exec::Start::twin_may_run`): the submitter's, read again
/// after its partition moved before its commit, and the relay's due copy, each on a
/// worker whose store calls take 10 ms, so both checks read no row before either run
/// writes. Both mark before their handlers run; the second mark is refused, so the job
/// runs once and one result goes out (the fleet simulator's seed 232185). Fails without
/// the first mark: both 0 ms runs end at their first poll and publish.
#[tokio::test(start_paused = true)]
async fn a_delayed_jobs_submitter_record_read_again_and_its_relay_copy_run_it_once() {
    let f = Fixture::new(0);
    let slow = |worker: &str| {
        let mut ctx = Arc::try_unwrap(f.worker(worker)).ok().expect("one handle");
        ctx.store = Arc::new(f.store.view(Some(crate::sim::doubles::Latency::new(7, (10, 10), (0.0, 10)))));
        Arc::new(ctx)
    };
    let job = Arc::new(JobSubmitted { execute_at: Some(f.clock.now_ms()), ..(*f.job()).clone() });
    let again = Origin { submitted: true, taken_again: true, ..f.origin() };
    let relayed = Origin { partition: 1, offset: 3, ..f.origin() };
    let first = spawn_from(slow("w1"), job.clone(), again);
    let second = spawn_from(slow("w2"), job, relayed);
    let ended = [first.await.unwrap(), second.await.unwrap()];
    assert_eq!(f.echo.runs.load(Ordering::SeqCst), 1, "one run: {ended:?}");
    assert_eq!(f.results().len(), 1, "one result");
    assert!(ended.contains(&Ended::NotDurable), "the copy refused is taken in again: {ended:?}");
    assert_eq!(f.store.row("job-1").and_then(|r| r.status).as_deref(), Some("succeeded"));
}

/// docs/security.md counts an outcome in flight's task at up to ~2.5 KiB (~40 MiB at a
/// pool's 16,384): a job's route inside its partition's ownership, as the pool spawns it,
/// stays within that. An `async fn` around the scope held the route twice (~3.9 KiB).
#[tokio::test(start_paused = true)]
async fn a_jobs_task_stays_within_the_memory_an_outcome_in_flight_is_counted_at() {
    let f = Fixture::new(0);
    let mut slot = SlotRelease::new(|_, _| {});
    let waited = Waited { received_at: EPOCH, dispatched_at: EPOCH };
    let route = exec::execute(f.worker("w1"), f.job(), f.origin(), &mut slot, waited);
    let task = super::ownership::scope(super::ownership::Ownership::new(), route);
    let bytes = std::mem::size_of_val(&task);
    assert!(bytes <= 2560, "a job's task is {bytes} bytes, more than the 2.5 KiB the docs count");
}
