//! Failure classes on the real broker and CQL database: each class reaches its
//! documented end, retry delays are honoured, a circuit breaker opens, pauses, probes
//! and closes, and a flood of poison jobs is quarantined without hurting healthy jobs.

use crate::common;

use axum::{extract::State, http::HeaderMap, http::StatusCode, routing::post, Router};
use fairway::core::breaker::BreakerState;
use fairway::handlers::Registry;
use fairway::model::{FailureClass, JobStatus, Pool};
use fairway::submit::{NewJob, Submitter};
use fairway::worker::{Policy, Worker};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Default)]
struct Server {
    starts: Arc<Mutex<HashMap<String, Vec<i64>>>>,
    dependency_down: Arc<AtomicBool>,
}

fn note(s: &Server, h: &HeaderMap) {
    let id = h.get("x-fairway-job-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    s.starts.lock().unwrap().entry(id).or_default().push(fairway::now_ms());
}

async fn app_error(State(s): State<Server>, h: HeaderMap) -> StatusCode {
    note(&s, &h);
    StatusCode::INTERNAL_SERVER_ERROR
}
async fn bad_input(State(s): State<Server>, h: HeaderMap) -> StatusCode {
    note(&s, &h);
    StatusCode::BAD_REQUEST
}
async fn slow(State(s): State<Server>, h: HeaderMap) -> StatusCode {
    note(&s, &h);
    tokio::time::sleep(Duration::from_secs(2)).await;
    StatusCode::OK
}
async fn dependency(State(s): State<Server>, h: HeaderMap) -> StatusCode {
    note(&s, &h);
    if s.dependency_down.load(Ordering::SeqCst) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

async fn server() -> (Server, std::net::SocketAddr) {
    let s = Server::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/app", post(app_error))
        .route("/bad", post(bad_input))
        .route("/slow", post(slow))
        .route("/dep", post(dependency))
        .with_state(s.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (s, addr)
}

fn job(tenant: &str, job_type: &str) -> NewJob {
    NewJob { tenant: tenant.into(), job_type: job_type.into(), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_class_reaches_its_documented_end_with_delays_honoured() {
    let (srv, addr) = server().await;
    let extra = format!(
        "[job_types.app]\npool = \"short\"\nhandler = \"http\"\nurl = \"http://{addr}/app\"\n\
         [job_types.app.retry.app_error]\ndelays = [\"1s\", \"2s\"]\nmax_attempts = 3\njitter = 0\n\
         [job_types.bad]\npool = \"short\"\nhandler = \"http\"\nurl = \"http://{addr}/bad\"\n\
         [job_types.slow]\npool = \"short\"\nhandler = \"http\"\nurl = \"http://{addr}/slow\"\ntimeout = \"300ms\"\n\
         [job_types.slow.retry.timeout]\ndelays = [\"500ms\"]\n"
    );
    let cfg = Arc::new(common::config(&extra));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let app = sub.submit(&job("acme", "app")).await.unwrap().job_id;
    let bad = sub.submit(&job("acme", "bad")).await.unwrap().job_id;
    let slow = sub.submit(&job("globex", "slow")).await.unwrap().job_id;
    let ids = vec![app.clone(), bad.clone(), slow.clone()];
    let results = common::results_for(&cfg, &ids, Duration::from_secs(60)).await;
    let dlq = common::dead_letters(&cfg, 3, Duration::from_secs(20)).await;
    w.stop().await;

    let starts = srv.starts.lock().unwrap().clone();
    // app_error: 3 runs, 1 s then 2 s apart (never early; late by at most the retry
    // consumer's lag, which a loaded 2-core CI machine can stretch to seconds), then the DLQ.
    let a = &starts[&app];
    assert_eq!(a.len(), 3, "app_error runs: {a:?}");
    let (d1, d2) = (a[1] - a[0], a[2] - a[1]);
    assert!((1000..10_000).contains(&d1), "first retry delay {d1} ms, policy 1 s");
    assert!((2000..11_000).contains(&d2), "second retry delay {d2} ms, policy 2 s");
    // permanent (4xx): one run, straight to the DLQ.
    assert_eq!(starts[&bad].len(), 1);
    // timeout: one retry, then the DLQ.
    assert_eq!(starts[&slow].len(), 2, "timeout runs");

    for (id, class, attempts) in
        [(&app, FailureClass::AppError, 3), (&bad, FailureClass::Permanent, 1), (&slow, FailureClass::Timeout, 2)]
    {
        let r = &results[id][0];
        assert_eq!(r.status, JobStatus::Failed);
        assert_eq!(r.failure_class, Some(class), "{r:?}");
        let d = dlq.iter().find(|d| d.job.as_ref().is_some_and(|j| &j.job_id == id)).expect("dead letter");
        assert_eq!(d.failure_class, class);
        assert_eq!(d.attempts, attempts, "{d:?}");
        assert!(d.last_error.is_some() && !d.reason.is_empty());
        assert!(d.first_failure_at <= d.last_failure_at);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_breaker_opens_pauses_probes_and_closes() {
    let (srv, addr) = server().await;
    let extra = format!(
        "[job_types.dep]\npool = \"short\"\nhandler = \"http\"\nurl = \"http://{addr}/dep\"\n\
         [job_types.dep.retry.dependency]\ndelays = [\"300ms\"]\nmax_attempts = 20\njitter = 0\n\
         [job_types.dep.breaker]\nwindow = \"20s\"\nmin_requests = 4\nfailure_ratio = 0.5\ncool_down = \"2s\"\n"
    );
    let cfg = Arc::new(common::config(&extra));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    srv.dependency_down.store(true, Ordering::SeqCst);
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(sub.submit(&job(["acme", "globex"][i % 2], "dep")).await.unwrap().job_id);
    }
    // Watch the breaker: it must open while the dependency is down.
    let sh = w.shared[0].clone();
    let mut seen_open = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !seen_open && std::time::Instant::now() < deadline {
        seen_open =
            matches!(sh.route.health.lock().unwrap().breakers.type_wide().state("dep"), BreakerState::Open { .. });
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen_open, "breaker opened");
    // While open, the dependency is not called (dispatch paused).
    let calls_at_open: usize = srv.starts.lock().unwrap().values().map(Vec::len).sum();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let calls_while_open: usize = srv.starts.lock().unwrap().values().map(Vec::len).sum::<usize>() - calls_at_open;
    assert!(calls_while_open <= 1, "{calls_while_open} calls while the breaker was open");
    srv.dependency_down.store(false, Ordering::SeqCst);

    let results = common::results_for(&cfg, &ids, Duration::from_secs(60)).await;
    let final_state = sh.route.health.lock().unwrap().breakers.type_wide().state("dep");
    w.stop().await;
    assert_eq!(results.len(), 8, "every held-back job ran once the dependency recovered");
    assert!(results.values().all(|r| r[0].status == JobStatus::Succeeded));
    assert_eq!(final_state, BreakerState::Closed, "the probe succeeded and closed the breaker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_poison_jobs_is_quarantined_and_healthy_jobs_still_finish() {
    let extra = "[worker.poison]\nmin_samples = 10\n\
                 [job_types.boom]\npool = \"short\"\nhandler = \"fail\"\n\
                 [job_types.boom.retry.app_error]\ndelays = [\"1500ms\"]\nmax_attempts = 5\njitter = 0\n";
    // Retries wait longer than one exchange round (~1 s): a type enters quarantine on
    // every worker within a round of crossing the threshold (docs/design/fleet-limits.md),
    // so no job's third attempt comes before it. With 100 ms retries a job could fail three
    // times within that round on a fast broker, and be dead-lettered at attempt 3.
    let cfg = Arc::new(common::config(extra));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let mut poison = Vec::new();
    for _ in 0..60 {
        poison.push(sub.submit(&job("initech", "boom")).await.unwrap().job_id);
    }
    let mut healthy = Vec::new();
    for _ in 0..30 {
        healthy.push(sub.submit(&job("hooli", "echo")).await.unwrap().job_id);
    }
    let all: Vec<String> = poison.iter().chain(&healthy).cloned().collect();
    let results = common::results_for(&cfg, &all, Duration::from_secs(90)).await;
    let dlq = common::dead_letters(&cfg, 60, Duration::from_secs(30)).await;
    w.stop().await;
    assert_eq!(results.len(), 90);
    assert!(healthy.iter().all(|id| results[id][0].status == JobStatus::Succeeded));
    let quarantined: Vec<_> = dlq.iter().filter(|d| d.failure_class == FailureClass::Poison).collect();
    assert!(!quarantined.is_empty(), "the failing job type was quarantined");
    assert!(quarantined.iter().all(|d| d.attempts <= 2), "quarantined jobs get at most 2 attempts");
}
