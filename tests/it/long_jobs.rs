//! Long jobs on the real broker and CQL database: checkpoints survive kill -9, a
//! partition moved during a long job never yields two concurrent executions,
//! cooperative cancellation (queued and running), and expired jobs never run.

use crate::common;

use axum::{extract::State, http::HeaderMap, routing::post, Router};
use fairway::handlers::Registry;
use fairway::model::{JobStatus, Pool};
use fairway::store::Store;
use fairway::submit::Submitter;
use fairway::worker::{Policy, Worker};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const POOLS: &str = "[pools.long]\nslots = 8\nheartbeat_interval = \"1s\"\ndefault_estimate = \"10s\"\n\
                     [pools.short]\nslots = 8\nheartbeat_interval = \"1s\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_during_a_checkpointed_long_job_resumes_from_the_checkpoint_without_using_an_attempt() {
    let extra = format!("{POOLS}[job_types.crunch]\npool = \"long\"\nhandler = \"sleep\"\ntimeout = \"2min\"\n");
    let cfg = common::config(&extra);
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(&cfg, &extra, dir.path());
    let cfg = Arc::new(cfg);
    let store = Store::open(&cfg).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    // 20 steps of 400 ms, a checkpoint every 2 steps.
    let id = sub
        .submit(&common::new_job("acme", "crunch", serde_json::json!({"ms": 8000, "checkpoint_every": 2})))
        .await
        .unwrap()
        .job_id;

    let spawn = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_fairway"))
            .args(["--config", path.to_str().unwrap(), "worker", "--pools", "long"])
            .env("FAIRWAY_LOG", "warn")
            .spawn()
            .unwrap()
    };
    let mut first = spawn();
    let step = common::wait_for(Duration::from_secs(60), async || {
        let cp = store.checkpoint(&id, 0).await.ok().flatten()?;
        let step: u32 = String::from_utf8(cp).ok()?.parse().ok()?;
        (step >= 6).then_some(step)
    })
    .await
    .expect("the job checkpointed");
    first.kill().unwrap();
    first.wait().unwrap();
    let row = store.job(&id).await.unwrap().unwrap();
    assert_eq!(row.status.as_deref(), Some("running"));

    let mut second = spawn();
    let results = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(90)).await;
    second.kill().ok();
    second.wait().ok();
    let r = &results.get(&id).expect("a result after the crash")[0];
    assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
    let out = String::from_utf8(r.output.clone().unwrap()).unwrap();
    let resumed: u32 =
        serde_json::from_str::<serde_json::Value>(&out).unwrap()["resumed_from_step"].as_u64().unwrap() as u32;
    assert!(resumed >= step, "resumed from step {resumed}, checkpoint was at {step}: {out}");
    assert_eq!(r.attempts, 1, "the crash did not use up an attempt");
    let row = store.job(&id).await.unwrap().unwrap();
    assert_eq!(row.crash_count, Some(1), "the crash was counted as a crash");
}

/// Counts concurrent and total executions per job id; each execution takes `hold`.
#[derive(Clone, Default)]
struct Tracker {
    active: Arc<Mutex<Executions>>,
}

/// Job id -> (active, max active, total).
type Executions = HashMap<String, (u32, u32, u32)>;

async fn long_call(State(t): State<Tracker>, headers: HeaderMap) -> &'static str {
    let id = headers.get("x-fairway-job-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    {
        let mut m = t.active.lock().unwrap();
        let e = m.entry(id.clone()).or_default();
        e.0 += 1;
        e.1 = e.1.max(e.0);
        e.2 += 1;
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    t.active.lock().unwrap().get_mut(&id).unwrap().0 -= 1;
    "ok"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_moved_during_long_jobs_never_runs_one_twice_at_once() {
    let tracker = Tracker::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/long", post(long_call)).with_state(tracker.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let extra = format!(
        "{POOLS}[job_types.slow]\npool = \"long\"\nhandler = \"http\"\nurl = \"http://{addr}/long\"\ntimeout = \"1min\"\n\
         [tenants.t0]\n[tenants.t1]\n[tenants.t2]\n[tenants.t3]\n[tenants.t4]\n[tenants.t5]\n"
    );
    let cfg = Arc::new(common::config(&extra));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let a = Worker::start(cfg.clone(), &[Pool::Long], registry.clone(), Policy::Fair).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(sub.submit(&common::new_job(&format!("t{i}"), "slow", serde_json::Value::Null)).await.unwrap().job_id);
    }
    // All six running on A, then B joins the group and takes some partitions over.
    common::wait_for(Duration::from_secs(30), async || (tracker.active.lock().unwrap().len() == 6).then_some(()))
        .await
        .expect("all started on A");
    tokio::time::sleep(Duration::from_millis(500)).await; // past the running-state write
    let b = Worker::start(cfg.clone(), &[Pool::Long], registry, Policy::Fair).await.unwrap();
    let results = common::results_for(&cfg, &ids, Duration::from_secs(90)).await;
    a.stop().await;
    b.stop().await;
    assert_eq!(results.len(), 6, "every job finished");
    let m = tracker.active.lock().unwrap().clone();
    for id in &ids {
        let (_, max_active, total) = m[id];
        assert_eq!(max_active, 1, "job {id} ran twice at once");
        assert_eq!(total, 1, "job {id} ran {total} times");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_a_queued_and_a_running_job_and_expired_jobs_never_run() {
    let extra = format!("{POOLS}[job_types.nap]\npool = \"long\"\nhandler = \"sleep\"\ntimeout = \"2min\"\n");
    let mut cfg = common::config(&extra);
    cfg.worker.cancel_grace = Duration::from_secs(3);
    let cfg = Arc::new(cfg);
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();

    let queued = sub.submit(&common::new_job("acme", "nap", serde_json::json!({"ms": 200}))).await.unwrap().job_id;
    store.request_cancel(&queued, fairway::now_ms()).await.unwrap();
    let mut late = common::new_job("acme", "echo", serde_json::json!("too late"));
    late.not_after = Some(fairway::now_ms() - 1);
    let expired = sub.submit(&late).await.unwrap().job_id;
    let running = sub.submit(&common::new_job("globex", "nap", serde_json::json!({"ms": 60000}))).await.unwrap().job_id;

    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Long, Pool::Short], registry, Policy::Fair).await.unwrap();
    common::wait_for(Duration::from_secs(30), async || {
        let r = store.job(&running).await.ok().flatten()?;
        (r.status.as_deref() == Some("running")).then_some(())
    })
    .await
    .expect("the long job started");
    let t0 = Instant::now();
    store.request_cancel(&running, fairway::now_ms()).await.unwrap();
    let ids = vec![queued.clone(), expired.clone(), running.clone()];
    let results = common::results_for(&cfg, &ids, Duration::from_secs(30)).await;
    w.stop().await;

    let q = &results[&queued][0];
    assert_eq!(q.status, JobStatus::Cancelled);
    assert_eq!(q.started_at, None, "a cancelled queued job never starts");
    let e = &results[&expired][0];
    assert_eq!(e.status, JobStatus::Expired);
    assert_eq!((e.started_at, e.attempts), (None, 0), "an expired job never runs");
    let r = &results[&running][0];
    assert_eq!(r.status, JobStatus::Cancelled, "{r:?}");
    assert!(r.started_at.is_some());
    assert!(t0.elapsed() < Duration::from_secs(20), "cancellation reached the running job through its heartbeat");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reaper_redispatches_a_running_job_whose_heartbeat_lapsed() {
    let cfg = Arc::new(common::config(POOLS));
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    // A job a hung worker marked running a minute ago; its heartbeat (TTL 1 s) is gone
    // and its message is nowhere on Kafka any more (the hung worker holds it).
    let now = fairway::now_ms();
    let mut job = common::job_record("acme", "echo");
    job.payload = b"reaped".to_vec();
    job.submitted_at = now - 70_000;
    running_since_a_minute(&store, &job, "short", "hung-worker", now).await;

    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let results = common::results_for(&cfg, std::slice::from_ref(&job.job_id), Duration::from_secs(60)).await;
    w.stop().await;
    let r = &results.get(&job.job_id).expect("the reaper re-dispatched the job")[0];
    assert_eq!(r.status, JobStatus::Succeeded);
    assert_eq!(r.output.as_deref(), Some(&b"reaped"[..]));
    assert_eq!(r.attempts, 1, "the crash did not use up an attempt");
    let row = store.job(&job.job_id).await.unwrap().unwrap();
    assert_eq!(row.crash_count, Some(1));
}

/// Checkpoints belong to a (job, generation): a rerun (a new generation of the same job
/// id) starts clean, while another attempt of the same generation (a retry, a crash
/// re-dispatch, a hand-off) still resumes. Before, checkpoints were keyed by job id only
/// and a rerun resumed the previous generation's last checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_starts_clean_while_the_same_generation_resumes_its_checkpoint() {
    let cfg = common::config(POOLS);
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    let ctx = |generation: i64, attempt: i32| {
        let mut job = common::job_record("acme", "steps");
        job.job_id = "checkpoint-generations-".to_string() + &cfg.kafka.topic_prefix;
        job.generation = generation;
        job.attempt = attempt;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        fairway::handlers::JobContext::new(Arc::new(job), deadline, Default::default(), Some(store.clone()))
    };
    ctx(0, 0).checkpoint(b"7").await.unwrap();
    assert_eq!(ctx(0, 1).load_checkpoint().await.unwrap().as_deref(), Some(&b"7"[..]), "a retry resumes");
    assert_eq!(ctx(1, 0).load_checkpoint().await.unwrap(), None, "a rerun starts clean");
    ctx(1, 0).checkpoint(b"2").await.unwrap();
    assert_eq!(ctx(1, 0).load_checkpoint().await.unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(ctx(0, 0).load_checkpoint().await.unwrap().as_deref(), Some(&b"7"[..]), "generations apart");
}

/// Deadlines hold while jobs wait and while they run: a queued job past its `not_after`
/// expires then without taking a slot, and a running one is stopped at it (cancelled, then
/// aborted past the cancel grace) and ends expired. Before, `not_after` was checked only
/// when a job was picked: the queued job waited for the slot, and the running one ran on
/// past its deadline (here for a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deadlines_expire_queued_jobs_without_a_slot_and_stop_running_ones() {
    let extra = "[pools.long]\nslots = 1\nheartbeat_interval = \"1s\"\ndefault_estimate = \"10s\"\n\
                 [job_types.nap]\npool = \"long\"\nhandler = \"sleep\"\ntimeout = \"2min\"\n";
    let mut cfg = common::config(extra);
    cfg.worker.cancel_grace = Duration::from_secs(2);
    let cfg = Arc::new(cfg);
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Long], registry, Policy::Fair).await.unwrap();
    // The one slot: a minute's nap due to stop in 25 s (time for the consumer group to
    // form and the job to start).
    let mut running = common::new_job("acme", "nap", serde_json::json!({"ms": 60000}));
    running.not_after = Some(fairway::now_ms() + 25_000);
    let running = sub.submit(&running).await.unwrap().job_id;
    common::wait_for(Duration::from_secs(40), async || {
        let r = store.job(&running).await.ok().flatten()?;
        (r.status.as_deref() == Some("running")).then_some(())
    })
    .await
    .expect("the long job started");
    // Queued behind it, due to expire long before the slot frees.
    let queued_deadline = fairway::now_ms() + 3_000;
    let mut queued = common::new_job("acme", "nap", serde_json::json!({"ms": 100}));
    queued.not_after = Some(queued_deadline);
    let queued = sub.submit(&queued).await.unwrap().job_id;
    let ids = vec![running.clone(), queued.clone()];
    let results = common::results_for(&cfg, &ids, Duration::from_secs(90)).await;
    w.stop().await;
    let q = results.get(&queued).and_then(|r| r.first()).expect("the queued job has a result");
    assert_eq!(q.status, JobStatus::Expired, "{q:?}");
    assert_eq!((q.started_at, q.attempts), (None, 0), "it never ran: {q:?}");
    let r = results.get(&running).and_then(|r| r.first()).expect("the running job has a result");
    assert!(q.finished_at < r.finished_at, "expired while the slot was still taken: {q:?} {r:?}");
    assert_eq!(r.status, JobStatus::Expired, "{r:?}");
    assert!(r.started_at.is_some() && r.finished_at - r.started_at.unwrap() < 59_000, "stopped early: {r:?}");
    assert!(r.error.as_deref().unwrap_or("").contains("not_after"), "{r:?}");
}

/// What a handler is told, end to end through a `process` child's FAIRWAY_* variables:
/// only the first dispatch ever of a job's generation is `FAIRWAY_FIRST_ATTEMPT=1`. A
/// job handed off by a draining worker (`Worker::stop`, what SIGTERM does) runs again
/// with `FAIRWAY_HANDOFF_COUNT=1`, one re-dispatched after its worker died with
/// `FAIRWAY_CRASH_COUNT=1`, neither as a first attempt, neither using up an attempt.
/// Before, a hand-off copy was told it was the first attempt and no count said otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handed_off_or_crashed_job_is_not_told_first_attempt_on_its_second_run() {
    // Not under /tmp: children have a private /tmp (their mount namespace). They run as
    // their attempt's own uid (the sandbox): let them write the log.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(dir.path().join("runs.log"), "").unwrap();
    std::fs::set_permissions(dir.path().join("runs.log"), std::fs::Permissions::from_mode(0o666)).unwrap();
    let log = dir.path().join("runs.log");
    // Each run logs what it was told; a first attempt then runs until it is stopped.
    let script = format!(
        "echo \"$FAIRWAY_JOB_ID $FAIRWAY_FIRST_ATTEMPT $FAIRWAY_ATTEMPT $FAIRWAY_CRASH_COUNT $FAIRWAY_HANDOFF_COUNT\" \
         >> {}; if [ \"$FAIRWAY_FIRST_ATTEMPT\" = 1 ]; then exec sleep 60; fi; echo done",
        log.display()
    );
    let extra = format!(
        "{POOLS}[job_types.probe]\npool = \"long\"\nhandler = \"process\"\ncommand = [\"/bin/sh\", \"-c\", {script:?}]\n\
         timeout = \"2min\"\n"
    );
    let cfg = Arc::new(common::config(&extra));
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    // What each run of a job was told: (first attempt, attempt, crash count, hand-off count).
    let runs = |id: &str| -> Vec<(String, u32, u32, u32)> {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 5 && f[0] == id)
                    .then(|| (f[1].into(), f[2].parse().unwrap(), f[3].parse().unwrap(), f[4].parse().unwrap()))
            })
            .collect()
    };

    // A job whose worker died while running it (its heartbeat lapsed long ago): the
    // reaper re-dispatches it as a crash.
    let now = fairway::now_ms();
    let crashed = probe_record(now);
    running_since_a_minute(&store, &crashed, "long", "dead-worker", now).await;

    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let a = Worker::start(cfg.clone(), &[Pool::Long], registry.clone(), Policy::Fair).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let id = sub.submit(&common::new_job("acme", "probe", serde_json::Value::Null)).await.unwrap().job_id;
    common::wait_for(Duration::from_secs(60), async || (!runs(&id).is_empty()).then_some(()))
        .await
        .expect("the job started on A");
    tokio::time::sleep(Duration::from_secs(1)).await; // past the running-state write
                                                      // A drains (SIGTERM's path): the running job is stopped and handed off to B.
    let b = Worker::start(cfg.clone(), &[Pool::Long], registry, Policy::Fair).await.unwrap();
    a.stop().await;
    let ids = [id.clone(), crashed.job_id.clone()];
    let results = common::results_for(&cfg, &ids, Duration::from_secs(90)).await;
    b.stop().await;
    for id in &ids {
        let r = &results.get(id).unwrap_or_else(|| panic!("no result for {id}: {:?}", runs(id)))[0];
        assert_eq!((r.status, r.attempts), (JobStatus::Succeeded, 1), "{r:?}");
    }
    let handed = runs(&id);
    assert_eq!(handed[0], ("1".to_string(), 0, 0, 0), "the first dispatch: {handed:?}");
    assert_eq!(handed.last().unwrap(), &("0".to_string(), 0, 0, 1), "after the hand-off: {handed:?}");
    assert_eq!(handed.len(), 2, "{handed:?}");
    let reaped = runs(&crashed.job_id);
    assert!(!reaped.is_empty(), "the crashed job ran again");
    assert!(reaped.iter().all(|r| *r == ("0".to_string(), 0, 1, 0)), "after the crash: {reaped:?}");
}

/// Marks `job` running on `worker` since a minute before `now`, with a heartbeat (TTL 1 s)
/// of that time: a worker that died or hung running it.
async fn running_since_a_minute(store: &Store, job: &fairway::model::JobSubmitted, pool: &str, worker: &str, now: i64) {
    let u = fairway::store::StateUpdate {
        job_id: &job.job_id,
        tenant: &job.tenant,
        job_type: &job.job_type,
        pool,
        status: "running",
        attempts: 0,
        crash_count: 0,
        generation: 0,
        submitted_at: job.submitted_at,
        started_at: Some(now - 60_000),
        finished_at: None,
        worker,
        error: None,
        failure_class: None,
        output: None,
        usage: None,
    };
    let encoded = fairway::codec::encode_job(job).unwrap();
    assert!(store.put_running_with_heartbeat(&u, &encoded, now - 60_000, 1).await.unwrap(), "marked running");
}

/// A superseded run's late writes are refused on the real store (docs/correctness.md,
/// "Superseded runs", seeds 528 and 2191): w2's run is taken over by w1 (a take-over
/// counts a crash); w2's `retrying` write then finds w1's mark and leaves the row alone,
/// while w1's own goes through. Once the job is terminal, a late running mark of the same
/// generation is refused too, and a rerun's (a newer generation) is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_runs_late_state_writes_are_refused() {
    use fairway::store::{RunMark, StateUpdate};
    let cfg = Arc::new(common::config(POOLS));
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    let now = fairway::now_ms();
    let job = probe_record(now);
    let encoded = fairway::codec::encode_job(&job).unwrap();
    let u = |status, worker, crash_count, generation| StateUpdate {
        job_id: &job.job_id,
        tenant: &job.tenant,
        job_type: &job.job_type,
        pool: "long",
        status,
        attempts: 0,
        crash_count,
        generation,
        submitted_at: job.submitted_at,
        started_at: Some(now),
        finished_at: None,
        worker,
        error: None,
        failure_class: None,
        output: None,
        usage: None,
    };
    assert!(store.put_running_with_heartbeat(&u("running", "w2", 0, 0), &encoded, now, 5).await.unwrap());
    assert!(store.put_running_with_heartbeat(&u("running", "w1", 1, 0), &encoded, now + 1, 5).await.unwrap());
    let mut late = u("retrying", "w2", 0, 0);
    late.attempts = 1;
    let w2 = RunMark { worker: "w2", attempts: 0, crash_count: 0 };
    assert!(!store.put_state_if_marked(&late, w2, now + 2).await.unwrap(), "w2's run was superseded");
    let row = store.job_direct(&job.job_id).await.unwrap().unwrap();
    assert_eq!((row.status.as_deref(), row.worker.as_deref(), row.crash_count), (Some("running"), Some("w1"), Some(1)));

    let mut own = u("retrying", "w1", 1, 0);
    own.attempts = 1;
    let w1 = RunMark { worker: "w1", attempts: 0, crash_count: 1 };
    assert!(store.put_state_if_marked(&own, w1, now + 3).await.unwrap(), "w1 holds the row");
    let row = store.job_direct(&job.job_id).await.unwrap().unwrap();
    assert_eq!((row.status.as_deref(), row.attempts), (Some("retrying"), Some(1)));

    store.put_state(&u("succeeded", "w1", 1, 0), now + 4).await.unwrap();
    let refused = store.put_running_with_heartbeat(&u("running", "w3", 2, 0), &encoded, now + 5, 5).await.unwrap();
    assert!(!refused, "a running mark never lands over a finished job");
    let row = store.job_direct(&job.job_id).await.unwrap().unwrap();
    assert_eq!((row.status.as_deref(), row.worker.as_deref()), (Some("succeeded"), Some("w1")));
    assert!(store.put_running_with_heartbeat(&u("running", "w3", 0, 1), &encoded, now + 6, 5).await.unwrap(), "rerun");
    let row = store.job_direct(&job.job_id).await.unwrap().unwrap();
    assert_eq!((row.status.as_deref(), row.generation), (Some("running"), Some(1)));
}

/// A `probe` job of acme on the long pool, submitted at `now - 70 s`.
fn probe_record(now: i64) -> fairway::model::JobSubmitted {
    let mut job = common::job_record("acme", "probe");
    job.pool = Some(Pool::Long);
    job.submitted_at = now - 70_000;
    job
}

/// Runs until released (then succeeds) or asked to stop for a hand-off (then returns an
/// error, as a handler should); counts its runs and its stops.
#[derive(Clone, Default)]
struct Holdable {
    release: Arc<std::sync::atomic::AtomicBool>,
    runs: Arc<std::sync::atomic::AtomicU32>,
    stopped: Arc<std::sync::atomic::AtomicU32>,
}

impl fairway::handlers::Handler for Holdable {
    fn run(
        &self,
        ctx: fairway::handlers::JobContext,
    ) -> futures::future::BoxFuture<'static, fairway::handlers::HandlerResult> {
        use std::sync::atomic::Ordering::SeqCst;
        let me = self.clone();
        Box::pin(async move {
            me.runs.fetch_add(1, SeqCst);
            loop {
                if ctx.stop_reason() == Some(fairway::handlers::StopReason::ShuttingDown) {
                    me.stopped.fetch_add(1, SeqCst);
                    return Err(fairway::handlers::HandlerError::app("asked to stop"));
                }
                if me.release.load(SeqCst) {
                    return Ok(b"released".to_vec());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    }
}

/// A job whose outcome cannot be made durable is taken in again on the partition that
/// still holds it, instead of waiting for a restart or rebalance that may never come.
/// Here a delayed job cannot be handed to the relay: its dispatch frontier cannot be
/// recorded (the table dropped in a keyspace of this test's own for a few seconds, then
/// created again), so its outcome is not durable. Before, it waited for a rebalance and
/// never ran on a quiet fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_whose_outcome_was_not_durable_runs_once_the_store_is_back_without_a_rebalance() {
    let mut cfg = common::config(POOLS);
    cfg.scylla.keyspace = format!("fw_again_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let cfg = Arc::new(cfg);
    // Not `common::init`: that creates the binary's shared keyspace once, and this test
    // breaks a table of its own.
    fairway::kafka::ensure_topics(&cfg).await.unwrap();
    fairway::store::ensure_schema(&cfg).await.unwrap();
    fairway::ops::tenants::seed(&cfg).await.unwrap();
    let session = fairway::store::connect(&cfg).await.unwrap();
    let registry = Registry::from_config(&cfg, HashMap::new()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let drop_frontier = format!("DROP TABLE {}.dispatch_frontier", cfg.scylla.keyspace);
    session.query_unpaged(drop_frontier, ()).await.unwrap();

    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let mut job = common::new_job("acme", "echo", serde_json::json!({"again": true}));
    job.execute_at = Some(fairway::now_ms() + 3_000);
    let id = sub.submit(&job).await.unwrap().job_id;
    // Refused while the table is gone: the first hand-over and at least one taken in again.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let early = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(1)).await;
    assert!(early.is_empty(), "no result while the frontier cannot be recorded: {early:?}");
    fairway::store::ensure_schema(&cfg).await.unwrap();
    let t0 = Instant::now();
    // Taken in again 5, 10, 20, 40 s after each refusal: 120 s covers two more refusals
    // after the table is back (a loaded box re-preparing the statements).
    let results = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(120)).await;
    w.stop().await;
    let r = &results.get(&id).expect("a result once the store is back, with no rebalance")[0];
    assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
    eprintln!("result {:.1} s after the table came back", t0.elapsed().as_secs_f64());
    let _ = session.query_unpaged(format!("DROP KEYSPACE {}", cfg.scylla.keyspace), ()).await;
}

/// A job whose running row and reaper entry the store does not take must not run on
/// unwatched (if its worker died, nothing would re-dispatch it; a redelivered copy would
/// run it twice at once): it is stopped and handed back, and runs once the store takes
/// the write again. Here the store refuses the write because the reaper's table is gone
/// (dropped in a keyspace of this test's own, then created again). Before, the failed
/// write was a warning and the job ran on, unwatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_whose_running_row_cannot_be_written_is_stopped_and_handed_back() {
    let extra = format!("{POOLS}[job_types.holdable]\npool = \"long\"\nhandler = \"custom\"\ntimeout = \"2min\"\n");
    let mut cfg = common::config(&extra);
    cfg.scylla.keyspace = format!("fw_running_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    cfg.worker.cancel_grace = Duration::from_secs(2);
    let cfg = Arc::new(cfg);
    // Not `common::init`: that creates the binary's shared keyspace once, and this test
    // breaks a table of its own.
    fairway::kafka::ensure_topics(&cfg).await.unwrap();
    fairway::store::ensure_schema(&cfg).await.unwrap();
    fairway::ops::tenants::seed(&cfg).await.unwrap();
    let session = fairway::store::connect(&cfg).await.unwrap();
    let h = Holdable::default();
    let custom = HashMap::from([("holdable".to_string(), Arc::new(h.clone()) as Arc<dyn fairway::handlers::Handler>)]);
    let registry = Registry::from_config(&cfg, custom).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Long], registry, Policy::Fair).await.unwrap();
    let drop_index = format!("DROP TABLE {}.running_index", cfg.scylla.keyspace);
    session.query_unpaged(drop_index, ()).await.unwrap();

    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let id = sub.submit(&common::new_job("acme", "holdable", serde_json::Value::Null)).await.unwrap().job_id;
    use std::sync::atomic::Ordering::SeqCst;
    let t0 = std::time::Instant::now();
    let stopped = common::wait_for(Duration::from_secs(40), async || (h.stopped.load(SeqCst) >= 1).then_some(())).await;
    assert!(stopped.is_some(), "the job ran on without a running row ({} runs)", h.runs.load(SeqCst));
    let t_stopped = t0.elapsed();
    // Handed back: it is dispatched again (and stopped again while the table is gone).
    let again = common::wait_for(Duration::from_secs(40), async || (h.runs.load(SeqCst) >= 2).then_some(())).await;
    assert!(
        again.is_some(),
        "the stopped job was not handed back within 40 s of its stop (stopped {:.1} s after submission; runs {}, stops {})",
        t_stopped.as_secs_f64(),
        h.runs.load(SeqCst),
        h.stopped.load(SeqCst)
    );
    eprintln!(
        "stopped after {:.1} s, dispatched again {:.1} s later",
        t_stopped.as_secs_f64(),
        (t0.elapsed() - t_stopped).as_secs_f64()
    );

    fairway::store::ensure_schema(&cfg).await.unwrap();
    h.release.store(true, SeqCst);
    let results = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(60)).await;
    w.stop().await;
    let r = &results.get(&id).expect("a result once the store took the write")[0];
    assert_eq!((r.status, r.attempts), (JobStatus::Succeeded, 1), "stops for the store never use an attempt: {r:?}");
    let _ = session.query_unpaged(format!("DROP KEYSPACE {}", cfg.scylla.keyspace), ()).await;
}
