//! Readiness and liveness on the real broker and CQL database: a worker's `/readyz` turns
//! 200 once every pool it serves has its first assignment (and not before its store
//! session is up), 503 while it drains; `/livez` fails once the worker cannot make
//! progress. `fairway serve`'s `/readyz` asks the store and the broker, and answers
//! from the process's start, also while it waits for its database.

use crate::common;

use fairway::api::{self, ApiState};
use fairway::handlers::Registry;
use fairway::model::Pool;
use fairway::observe::probes::{self, Probes};
use fairway::worker::{Policy, Worker, WorkerStart};
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn get(url: &str) -> (u16, String) {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let r = http.get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Polls `url` until it answers `status`; the body then, or a panic after `timeout`.
async fn wait_status(url: &str, status: u16, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let (s, body) = get(url).await;
        if s == status {
            return body;
        }
        assert!(Instant::now() < deadline, "{url} still answers {s} ({body}) after {timeout:?}, want {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_is_ready_once_its_pools_are_assigned_and_not_while_draining() {
    let cfg = Arc::new(common::config(""));
    common::init(&cfg).await;
    let pools = [Pool::Short, Pool::Long];
    let probes = Probes::worker(&pools);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let listen = "127.0.0.1:0".parse().unwrap();
    let (addr, server) = probes::serve(listen, probes::router(probes.clone(), None), stopped).await.unwrap();
    let url = |p: &str| format!("http://{addr}{p}");

    // Before the start: live, not ready, and it says what it waits for.
    assert_eq!(get(&url("/livez")).await.0, 200);
    let (s, body) = get(&url("/readyz")).await;
    assert_eq!(s, 503, "{body}");
    assert!(body.contains("store session not up") && body.contains("pool long"), "{body}");

    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let start = WorkerStart { pools: &pools, policy: Policy::Fair, probes: probes.clone() };
    let w = Worker::start_with(cfg.clone(), registry, start).await.unwrap();
    // Ready exactly when both pools' consumers got their assignment (the local broker
    // forms a new group in about 5 s).
    wait_status(&url("/readyz"), 200, Duration::from_secs(40)).await;
    assert!(w.shared.iter().all(|s| s.assigned.load(std::sync::atomic::Ordering::SeqCst) > 0));
    assert_eq!(get(&url("/livez")).await.0, 200);

    // Draining: not ready any more (the listener outlives the worker here).
    w.stop().await;
    let (s, body) = get(&url("/readyz")).await;
    assert_eq!(s, 503, "{body}");
    assert!(body.contains("draining"), "{body}");

    // A part that cannot make progress fails liveness (and readiness), with its reason.
    probes.liveness.fail("pool short: its loop failed (test)");
    let (s, body) = get(&url("/livez")).await;
    assert_eq!((s, body.as_str()), (503, "not live: pool short: its loop failed (test)\n"));
    assert_eq!(get(&url("/healthz")).await.0, 503);
    let _ = stop.send(true);
    server.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_is_ready_while_the_store_and_a_broker_answer() {
    let cfg = Arc::new(common::config(""));
    common::init(&cfg).await;
    let ops = |state: ApiState| async move {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(axum::serve(l, api::ops_router(state)).into_future());
        format!("http://{addr}")
    };
    let up = ops(ApiState::connect(cfg.clone(), None).await.expect("API state")).await;
    let (s, body) = get(&format!("{up}/readyz")).await;
    assert_eq!((s, body.as_str()), (200, "ready\n"));
    assert_eq!(get(&format!("{up}/livez")).await.0, 200);

    // The same API with no broker at its address: live, but not ready.
    let dead_port = common::free_port();
    let mut no_broker = (*cfg).clone();
    no_broker.kafka.brokers = format!("127.0.0.1:{dead_port}");
    let down = ops(ApiState::connect(Arc::new(no_broker), None).await.expect("API state without a broker")).await;
    let (s, body) = get(&format!("{down}/readyz")).await;
    assert_eq!(s, 503, "{body}");
    assert!(body.contains("no broker answered"), "{body}");
    assert_eq!(get(&format!("{down}/livez")).await.0, 200);
}

/// A worker started while its database does not answer waits for it (`store::reach`):
/// live, not ready, `/readyz` saying what it waits for, and it serves jobs once the
/// database answers. The database's address is a port nothing listens on until a
/// forwarder to the suite's database opens there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_started_before_its_database_answers_waits_for_it_and_then_serves() {
    let cfg = common::config("");
    let port = common::free_port();
    let mut late = cfg.clone();
    late.scylla.contact_points = vec![format!("127.0.0.1:{port}")];
    let at = format!("127.0.0.1:{port}");
    waits_then_serves(cfg, late, port, &["waiting for the CQL database", &at]).await;
}

/// The session opens (its contact point answers) but no node answers a request: the
/// cluster names its node at an address that is not reachable yet (here through
/// `scylla.address_map`; also a database that goes away right after the session
/// opened). The statements cannot be prepared, and the worker waits as for a database
/// that does not answer, instead of exiting with a statement error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_whose_database_node_does_not_answer_after_the_session_opened_waits_for_it() {
    let cfg = common::config("");
    let port = common::free_port();
    let mut late = cfg.clone();
    late.scylla.address_map.insert(common::cql(), format!("127.0.0.1:{port}"));
    waits_then_serves(cfg, late, port, &["waiting for the CQL database", "no node answered", "scylla.address_map"])
        .await;
}

/// Starts a worker on `late` (whose database is reached through 127.0.0.1:`port`, where
/// nothing listens yet), checks that it waits (its third try in `/readyz`, which says
/// each of `says`; live; its start not ended), opens a forwarder to the suite's database on
/// `port`, and checks that the start completes and a job of `cfg` runs.
async fn waits_then_serves(cfg: fairway::config::Config, late: fairway::config::Config, port: u16, says: &[&str]) {
    common::init(&cfg).await;
    let late = Arc::new(late);
    let pools = [Pool::Short];
    let probes = Probes::worker(&pools);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let listen = "127.0.0.1:0".parse().unwrap();
    let (addr, server) = probes::serve(listen, probes::router(probes.clone(), None), stopped).await.unwrap();
    let url = |p: &str| format!("http://{addr}{p}");

    let registry = Registry::from_config(&late, Default::default()).unwrap();
    let start = {
        let (late, probes) = (late.clone(), probes.clone());
        tokio::spawn(async move {
            Worker::start_with(late, registry, WorkerStart { pools: &pools, policy: Policy::Fair, probes }).await
        })
    };
    // It waits: three tries failed, still starting, live, and not ready saying why.
    let body = common::wait_for(Duration::from_secs(30), async || {
        let (s, body) = get(&url("/readyz")).await;
        (s == 503 && body.contains("try 3,") || start.is_finished()).then_some(body)
    })
    .await
    .expect("the worker's /readyz did not report its third try to reach the database within 30 s");
    if start.is_finished() {
        let why = start.await.unwrap().err().map(|e| e.to_string());
        panic!("the worker's start ended while its database did not answer: {why:?}");
    }
    assert!(says.iter().all(|s| body.contains(s)), "{body}");
    assert_eq!(get(&url("/livez")).await.0, 200);

    // The database answers at that address now: the start completes and jobs run.
    let _forwarder = fairway::netlab::Forwarder::start(
        format!("127.0.0.1:{port}").parse().unwrap(),
        common::cql().parse().expect("FAIRWAY_CQL is host:port"),
    )
    .expect("forwarder");
    let w = tokio::time::timeout(Duration::from_secs(60), start)
        .await
        .expect("the worker did not start within 60 s of its database answering")
        .unwrap()
        .expect("worker start");
    wait_status(&url("/readyz"), 200, Duration::from_secs(40)).await;
    let sub = fairway::submit::Submitter::new(Arc::new(cfg.clone()), None).unwrap();
    let id = sub.submit(&common::new_job("acme", "echo", serde_json::json!({"n": 1}))).await.unwrap().job_id;
    let results = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(60)).await;
    assert!(results.contains_key(&id), "the job did not end within 60 s of the late start");
    w.stop().await;
    let _ = stop.send(true);
    server.await.unwrap().unwrap();
}

/// `fairway serve` started while its database does not answer: its metrics listener
/// answers from the process's start (live; not ready, naming the wait), its API listener
/// opens only once the database answers, and then it is ready. The database's address
/// is a port nothing listens on until a forwarder to the suite's database opens there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_started_before_its_database_answers_is_live_and_says_why_it_is_not_ready() {
    let cfg = common::config("");
    common::init(&cfg).await;
    let port = common::free_port();
    let mut late = cfg.clone();
    late.scylla.contact_points = vec![format!("127.0.0.1:{port}")];
    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(&late, "", dir.path());
    let (api_port, ops_port) = (common::free_port(), common::free_port());
    let mut serve = common::dies_with_test(&mut std::process::Command::new(env!("CARGO_BIN_EXE_fairway")))
        .args(["--config", path.to_str().unwrap(), "serve"])
        .args(["--listen", &format!("127.0.0.1:{api_port}"), "--metrics-listen", &format!("127.0.0.1:{ops_port}")])
        // The suite's database address (`--cql`'s variable) would override the config's.
        .env_remove("FAIRWAY_CQL")
        .env("FAIRWAY_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn fairway serve");
    let ops = |p: &str| format!("http://127.0.0.1:{ops_port}{p}");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let body = common::wait_for(Duration::from_secs(30), async || {
        let r = http.get(ops("/readyz")).send().await.ok()?;
        let (s, body) = (r.status().as_u16(), r.text().await.ok()?);
        (s == 503 && body.contains("try 2,")).then_some(body)
    })
    .await
    .expect("serve's /readyz did not report its second try to reach the database within 30 s");
    assert!(body.contains("waiting for the CQL database") && body.contains(&format!("127.0.0.1:{port}")), "{body}");
    assert_eq!(get(&ops("/livez")).await, (200, "ok\n".to_string()));
    let api = format!("http://127.0.0.1:{api_port}/healthz");
    assert!(http.get(&api).send().await.is_err(), "the API listened before its database answered");

    // The database answers at that address now: the start completes and serve is ready.
    let _forwarder = fairway::netlab::Forwarder::start(
        format!("127.0.0.1:{port}").parse().unwrap(),
        common::cql().parse().expect("FAIRWAY_CQL is host:port"),
    )
    .expect("forwarder");
    wait_status(&ops("/readyz"), 200, Duration::from_secs(60)).await;
    assert_eq!(get(&api).await.0, 200);
    serve.kill().expect("stop fairway serve");
    serve.wait().expect("reap fairway serve");
}
