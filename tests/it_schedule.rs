//! Scheduled jobs on the real broker and CQL database: a job never starts before its
//! execute_at, whether it waits in the relay (near) or parked in the store (far).

mod common;

use fairway::handlers::Registry;
use fairway::model::{JobStatus, Pool};
use fairway::submit::{NewJob, Submitter};
use fairway::worker::{Policy, Worker};
use std::sync::Arc;
use std::time::Duration;

/// Initialises `cfg`'s topics and tables, starts a short-pool worker (assigned) and a submitter.
async fn short_worker(cfg: &Arc<fairway::config::Config>) -> (Worker, Submitter) {
    common::init(cfg).await;
    let registry = Registry::from_config(cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    assert!(w.wait_assigned(Duration::from_secs(30)).await);
    (w, Submitter::new(cfg.clone(), None).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scheduled_jobs_never_start_before_execute_at() {
    // Hold at most 1 s in the relay: the 5 s job is parked in the store and promoted; the
    // 800 ms one is held by its pool worker until due; the 2.5 s one goes through the
    // delayed topic, handed back ahead of its time and held by its worker until then.
    let mut cfg = common::config("");
    cfg.worker.relay_hold_max = Duration::from_secs(1);
    let cfg = Arc::new(cfg);
    let (w, sub) = short_worker(&cfg).await;
    let now = fairway::now_ms();
    let mut jobs = Vec::new();
    for (delay_ms, tenant) in [(0, "acme"), (800, "globex"), (2_500, "hooli"), (5_000, "initech")] {
        let j = NewJob {
            tenant: tenant.into(),
            job_type: "echo".into(),
            execute_at: Some(now + delay_ms),
            ..Default::default()
        };
        jobs.push((sub.submit(&j).await.unwrap().job_id, now + delay_ms));
    }
    let ids: Vec<String> = jobs.iter().map(|(id, _)| id.clone()).collect();
    let results = common::results_for(&cfg, &ids, Duration::from_secs(60)).await;
    w.stop().await;
    for (id, at) in &jobs {
        let r = &results.get(id).unwrap_or_else(|| panic!("job due at {at} never ran"))[0];
        assert_eq!(r.status, JobStatus::Succeeded);
        let started = r.started_at.unwrap();
        assert!(started >= *at, "started at {started}, before its execute_at {at}");
        assert!(started - at < 10_000, "started {} ms late", started - at);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn far_schedules_get_up_to_60_s_of_jitter_unless_exact() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let at = fairway::now_ms() + 2 * 3_600_000;
    let mut asked = std::collections::HashMap::new();
    for i in 0..10 {
        let exact = i % 2 == 0;
        let j = NewJob {
            tenant: "acme".into(),
            job_type: "echo".into(),
            execute_at: Some(at),
            exact_schedule: exact,
            ..Default::default()
        };
        asked.insert(sub.submit(&j).await.unwrap().job_id, exact);
    }
    // The records on the pool topic carry the execute_at workers will honour.
    let jobs = common::read_until(
        &cfg,
        &cfg.pool_topic(Pool::Short),
        Duration::from_secs(30),
        |b, _, _| fairway::codec::decode_job(b).ok(),
        |v| v.len() >= 10,
    )
    .await;
    assert_eq!(jobs.len(), 10);
    let mut moved = 0;
    for j in &jobs {
        let got = j.execute_at.unwrap();
        if asked[&j.job_id] {
            assert_eq!(got, at, "exact_schedule keeps execute_at");
        } else {
            assert!((got - at).abs() <= 60_000, "jitter within 60 s: {}", got - at);
            moved += usize::from(got != at);
        }
    }
    assert!(moved >= 4, "jitter moves (almost) every far schedule: {moved} of 5");
}

/// 120 jobs due at one instant, parked in the store, promoted at 20/s: they start over
/// about 5 s (not at once), and the promoter reports the oldest due job's age meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_promoter_paces_a_crowd_due_at_once_and_reports_the_oldest_due_age() {
    let metrics = fairway::api::install_prometheus().expect("metrics recorder");
    let mut cfg = common::config("");
    cfg.worker.relay_hold_max = Duration::from_secs(1);
    cfg.worker.promoter_rate = 20;
    let cfg = Arc::new(cfg);
    common::init(&cfg).await;
    // Parked straight in the store, as the relay parks jobs due later than it holds:
    // submitted, a slow path to the relay would let the relay or the worker hold them
    // instead, and the promoter would have nothing to pace.
    let store = fairway::store::Store::open(&cfg).await.unwrap();
    let at = fairway::now_ms() + 3_000;
    let mut ids = Vec::new();
    for i in 0..120 {
        let mut job = common::job_record(["acme", "globex", "initech"][i % 3], "echo");
        job.execute_at = Some(at);
        store.put_scheduled(at, &job.job_id, &fairway::codec::encode_job(&job).unwrap()).await.unwrap();
        ids.push(job.job_id);
    }
    let (w, _sub) = short_worker(&cfg).await;
    // Sample the gauge while the crowd is promoted.
    let age = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("fairway_oldest_due_unpromoted_age_seconds"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let sampler = tokio::spawn(async move {
        let mut peak = 0f64;
        for _ in 0..200 {
            peak = peak.max(age(&metrics.render()).unwrap_or(0.0));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (peak, age(&metrics.render()))
    });
    let results = common::results_for(&cfg, &ids, Duration::from_secs(90)).await;
    let (peak, last) = sampler.await.unwrap();
    w.stop().await;
    assert_eq!(results.len(), 120, "every job ran");
    let starts: Vec<i64> = results.values().map(|r| r[0].started_at.unwrap()).collect();
    let (first, end) = (*starts.iter().min().unwrap(), *starts.iter().max().unwrap());
    assert!(first >= at, "none before its time: the first started {} ms before execute_at", at - first);
    // 120 at 20/s after one second's burst of 20: about 5 s from first to last.
    assert!(end - first >= 4_000, "promoted over {} ms: not paced", end - first);
    assert!(peak >= 1.0, "oldest_due_unpromoted_age rose while the crowd waited: peak {peak}");
    assert_eq!(last, Some(0.0), "back to 0 once all are promoted");
}

/// A job parked long ago (here due two days back, e.g. left by a promoter that was down)
/// is promoted by a new leader: it starts at the oldest parked bucket, however old.
/// Before, a new leader looked back 24 h only and such a job stayed parked forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_promoter_leader_promotes_jobs_parked_more_than_a_day_ago() {
    let cfg = Arc::new(common::config(""));
    common::init(&cfg).await;
    let store = fairway::store::Store::open(&cfg).await.unwrap();
    let mut job = common::job_record("acme", "echo");
    let due = fairway::now_ms() - 2 * 24 * 3_600_000;
    job.execute_at = Some(due);
    job.submitted_at = due - 60_000;
    store.put_scheduled(due, &job.job_id, &fairway::codec::encode_job(&job).unwrap()).await.unwrap();
    let (w, _sub) = short_worker(&cfg).await;
    let results = common::results_for(&cfg, std::slice::from_ref(&job.job_id), Duration::from_secs(40)).await;
    w.stop().await;
    let r = results.get(&job.job_id).and_then(|r| r.first()).expect("promoted and run within 40 s");
    assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
    assert!(store.scheduled_due(fairway::store::schedule_bucket(due), fairway::now_ms(), 10).await.unwrap().is_empty());
}

/// The `fairway_jobs_held_until_due{pool="short"}` gauge on a worker's metrics listener.
async fn held_by(http: &reqwest::Client, w: &common::LoggedWorker) -> Option<f64> {
    let text = http.get(format!("http://{}/metrics", w.metrics_addr()?)).send().await.ok()?.text().await.ok()?;
    let line = text.lines().find(|l| l.starts_with("fairway_jobs_held_until_due{pool=\"short\"}"))?;
    line.rsplit(' ').next()?.parse().ok()
}

/// Waits until `w` holds delayed jobs in memory; how many, or None after 60 s.
async fn until_holding(http: &reqwest::Client, w: &common::LoggedWorker) -> Option<f64> {
    common::wait_for(Duration::from_secs(60), async || held_by(http, w).await.filter(|&n| n > 0.0)).await
}

const HELD_EXTRA: &str =
    "[worker]\nmetrics_listen = \"127.0.0.1:0\"\n[job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n";

/// A worker holding delayed jobs in memory (due within a second, offsets uncommitted)
/// loses its partitions twice: to a rebalance when a second worker joins, then to kill -9.
/// Every job still runs, none before its execute_at.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delayed_jobs_held_by_a_worker_survive_a_rebalance_and_its_kill_9() {
    let cfg = Arc::new(common::config(""));
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(&cfg, HELD_EXTRA, dir.path());
    let mut a = common::spawn_logged_worker(&path, "short");
    assert!(a.wait_owning(3, Duration::from_secs(60)).is_some(), "the first worker got no partitions");
    // 100 jobs a second for 15 s, each due 900 ms after it is produced: about 90 held at a time.
    let producing = {
        let cfg = cfg.clone();
        tokio::spawn(async move {
            let (producer, topic) = (fairway::kafka::producer(&cfg).unwrap(), cfg.pool_topic(Pool::Short));
            let mut ids = Vec::new();
            for i in 0..1500 {
                let mut job = common::job_record(["acme", "globex", "initech"][i % 3], "echo");
                job.execute_at = Some(fairway::now_ms() + 900);
                let bytes = fairway::codec::encode_job(&job).unwrap();
                fairway::kafka::send(&producer, &topic, &job.job_id, &bytes).await.expect("produce");
                ids.push((job.job_id, job.execute_at.unwrap()));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            ids
        })
    };
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let Some(held) = until_holding(&http, &a).await else {
        a.print_tail("first worker");
        panic!("the first worker never held a delayed job");
    };
    let b = common::spawn_logged_worker(&path, "short");
    let rebalanced = b.wait_owning(1, Duration::from_secs(60)).is_some();
    let held_at_kill = until_holding(&http, &a).await.expect("the first worker stopped holding after the rebalance");
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let ids = producing.await.unwrap();
    let keys: Vec<String> = ids.iter().map(|(id, _)| id.clone()).collect();
    let results = common::results_for(&cfg, &keys, Duration::from_secs(120)).await;
    let mut b = b;
    b.child.kill().ok();
    b.child.wait().ok();
    assert!(rebalanced, "the second worker never got a partition");
    eprintln!("held {held} before the rebalance, {held_at_kill} at the kill");
    let lost: Vec<&String> = keys.iter().filter(|id| !results.contains_key(*id)).collect();
    assert!(lost.is_empty(), "{} of {} delayed jobs never ran, e.g. {:?}", lost.len(), keys.len(), lost.first());
    for (id, at) in &ids {
        for r in &results[id] {
            assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
            let started = r.started_at.expect("started_at");
            assert!(started >= *at, "{id} started {} ms before its execute_at", at - started);
        }
    }
}
