//! The blast radius of one tenant, on the real broker and CQL database: for each attack
//! a tenant can make, tenant A attacks while tenant B submits (and runs) jobs, and B is
//! served: a flood of maximum-size batch bodies, failing jobs that used to close the
//! pool to everyone, scheduled jobs past `max_queued`, a trace context the executor
//! cannot send, dependency failures of one tenant's inputs, and live streams without
//! end. (docs/security.md: what is bounded and by which setting.)

use crate::common;

use axum::{http::HeaderMap, http::StatusCode as AxStatus, routing, Router};
use fairway::config::Config;
use fairway::core::auth::Caller;
use fairway::core::breaker::BreakerState;
use fairway::handlers::Registry;
use fairway::model::{FailureClass, JobStatus, Pool};
use fairway::worker::{Policy, Worker};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The API for `cfg`, and a client per tenant key.
struct Api {
    base: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Api {
    async fn start(cfg: &Arc<Config>) -> Api {
        common::init(cfg).await;
        let (base, stop) = common::serve_api(cfg).await;
        Api { base, stop: Some(stop) }
    }
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// A client that sends `key` as its bearer token.
fn client(key: &str) -> reqwest::Client {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("authorization", format!("Bearer {key}").parse().unwrap());
    reqwest::Client::builder().default_headers(h).timeout(Duration::from_secs(30)).build().unwrap()
}

async fn key(cfg: &Config, tenant: &str) -> (String, String) {
    common::create_key(cfg, &Caller::Tenant(tenant.into()), "it_blast").await
}

/// POST `body`: (status, Retry-After, JSON body).
async fn post(http: &reqwest::Client, url: String, body: &Value) -> (StatusCode, Option<u64>, Value) {
    let r = http.post(url).json(body).send().await.expect("POST");
    let retry = r.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok());
    (r.status(), retry, r.json().await.unwrap_or(Value::Null))
}

/// B submits one echo job: it must be accepted.
async fn b_is_served(api: &Api, b: &reqwest::Client, what: &str) {
    let (s, _, body) = post(b, api.url("/v1/jobs"), &json!({"job_type": "echo", "payload": {}})).await;
    assert_eq!(s, StatusCode::CREATED, "tenant B refused while A {what}: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_maximum_size_batches_is_bounded_per_key_and_b_is_served() {
    let mut c = common::config("");
    c.api.limits.body_bytes_per_key = 8 << 20;
    c.api.limits.batch_body_bytes = 8 << 20;
    c.api.limits.body_bytes = 24 << 20;
    c.api.limits.idle_timeout = fairway::core::retry::DurationMs::secs(2);
    let cfg = common::arc(c);
    let api = Api::start(&cfg).await;
    let a_key = key(&cfg, "acme").await.1;
    let (a, b) = (client(&a_key), client(&key(&cfg, "globex").await.1));

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let raw_head = |len: u64| {
        format!(
            "POST /v1/jobs:batch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {a_key}\r\n\
             Content-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    let addr = api.base.trim_start_matches("http://").to_string();
    // A's maximum-size body that trickles: it holds A's body budget (8 MiB) ...
    let body_len = (8 << 20) - 16;
    let mut stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
    stalled.write_all(format!("{}[0,", raw_head(body_len)).as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ... so A's other maximum-size bodies are refused at once, 8 concurrent.
    let body = bytes::Bytes::from(format!("[{}0]", "0,".repeat(body_len as usize / 2 - 1)));
    let sends = (0..8).map(|_| {
        let (a, url, body) = (a.clone(), api.url("/v1/jobs:batch"), body.clone());
        tokio::spawn(async move {
            // Refused before its body is read, the answer still reaches the client
            // (the listener lingers instead of resetting the connection).
            let r = a.post(url).header("content-type", "application/json").body(body).send().await;
            let r = r.map_err(|e| format!("{e:?}"))?;
            let retry = r.headers().get("retry-after").is_some();
            Ok::<_, String>((r.status(), retry, r.json::<Value>().await.unwrap_or(Value::Null)))
        })
    });
    let answers: Vec<Result<(StatusCode, bool, Value), String>> =
        futures::future::join_all(sends).await.into_iter().map(Result::unwrap).collect();
    assert!(
        answers.iter().all(|a| a.as_ref().is_ok_and(|(s, retry, b)| *s == StatusCode::TOO_MANY_REQUESTS
            && *retry
            && b["code"] == "TOO_MANY_SUBMISSIONS")),
        "one key's bodies beyond its budget are each refused at once, and none is read while the budget is held: \
         {answers:?}"
    );
    // Meanwhile B submits and the server answers /healthz.
    for _ in 0..5 {
        b_is_served(&api, &b, "holds its body budget").await;
        let t = Instant::now();
        let r = reqwest::get(api.url("/healthz")).await.expect("healthz");
        assert_eq!(r.status(), StatusCode::OK);
        assert!(t.elapsed() < Duration::from_secs(2), "/healthz took {:?}", t.elapsed());
    }
    // The trickling body is cut off after idle_timeout (2 s) and the budget comes back.
    let mut buf = vec![0u8; 4096];
    let cut = tokio::time::timeout(Duration::from_secs(15), stalled.read(&mut buf)).await;
    assert!(cut.is_ok(), "a stalled body is cut off within 15 s");
    let deadline = Instant::now() + Duration::from_secs(15);
    let read = loop {
        let r = a.post(api.url("/v1/jobs:batch")).header("content-type", "application/json").body(body.clone());
        let r = r.send().await.expect("POST");
        let (s, v) = (r.status(), r.json::<Value>().await.unwrap_or(Value::Null));
        if s != StatusCode::TOO_MANY_REQUESTS {
            break (s, v);
        }
        assert!(Instant::now() < deadline, "A's budget never came back: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!((read.0, read.1["code"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("BATCH_TOO_LARGE")), "{read:?}");

    // Above the limit by Content-Length: 413 before any of the body is sent.
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(raw_head(999_999_999_999).as_bytes()).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf)).await.expect("answered").unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // A connection that stalls in its headers is closed after idle_timeout.
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    tcp.write_all(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(15), tcp.read(&mut buf)).await;
    assert!(closed.is_ok(), "a stalled connection is closed within 15 s");
    b_is_served(&api, &b, "is done").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tenants_failing_jobs_close_the_pool_for_that_tenant_only() {
    let c = common::config(
        "[job_types.doomed]\npool = \"short\"\nhandler = \"fail\"\n[job_types.doomed.retry.app_error]\nmax_attempts = 1\n\
         [admission.breaker]\nmin_attempts = 5\ncool_down = \"3s\"\n",
    );
    let cfg = common::arc(c);
    let api = Api::start(&cfg).await;
    let (a, b) = (client(&key(&cfg, "acme").await.1), client(&key(&cfg, "globex").await.1));
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();

    let doomed: Vec<Value> = (0..20).map(|_| json!({"job_type": "doomed"})).collect();
    let (s, _, body) = post(&a, api.url("/v1/jobs:batch"), &Value::Array(doomed)).await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    // A's own breaker opens; B is accepted all along.
    let deadline = Instant::now() + Duration::from_secs(45);
    let refused = loop {
        b_is_served(&api, &b, "fails every job").await;
        let (s, retry, body) = post(&a, api.url("/v1/jobs"), &json!({"job_type": "echo"})).await;
        if s == StatusCode::SERVICE_UNAVAILABLE {
            assert!(retry.is_some(), "{body}");
            break body;
        }
        assert_eq!(s, StatusCode::CREATED, "{body}");
        assert!(Instant::now() < deadline, "A's breaker never opened");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(refused["code"], "CIRCUIT_OPEN", "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("of tenant \"acme\""), "{refused}");
    for _ in 0..5 {
        b_is_served(&api, &b, "'s breaker is open").await;
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_jobs_count_against_max_queued_and_the_horizon_is_bounded() {
    let cfg =
        common::arc(common::config("[tenants.qsched]\ntier = \"enterprise\"\nmax_queued = 5\n[api]\nauth = \"off\"\n"));
    let api = Api::start(&cfg).await;
    let http = reqwest::Client::new();
    let soon = fairway::now_ms() + 60_000;
    let mut accepted = 0;
    for _ in 0..12 {
        let job = json!({"tenant": "qsched", "job_type": "echo", "execute_at": soon});
        let (s, retry, body) = post(&http, api.url("/v1/jobs"), &job).await;
        match s {
            StatusCode::CREATED => accepted += 1,
            _ => {
                assert_eq!((s, body["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("TENANT_QUEUE_FULL")));
                assert!(retry.is_some() && body["error"].as_str().unwrap().contains("max_queued = 5"), "{body}");
            }
        }
    }
    assert_eq!(accepted, 5, "scheduled jobs hold queue slots");
    let far = fairway::now_ms() + 40 * 86_400_000;
    let job = json!({"tenant": "globex", "job_type": "echo", "execute_at": far});
    let (s, retry, body) = post(&http, api.url("/v1/jobs"), &job).await;
    assert_eq!((s, body["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("SCHEDULE_TOO_FAR_AHEAD")), "{body}");
    assert!(body["error"].as_str().unwrap().contains("admission.max_schedule_ahead"), "{body}");
    assert!(retry.unwrap() > 86_400, "retry once within the horizon: {retry:?}");
    let (s, _, body) = post(&http, api.url("/v1/jobs"), &json!({"tenant": "globex", "job_type": "echo"})).await;
    assert_eq!(s, StatusCode::CREATED, "another tenant is served: {body}");
}

/// A service that answers per route: /ok 200, /redirect 302 to /ok, /big 2 MiB, and
/// /tenanted 503 for tenant acme (its inputs break the dependency) and 200 for others.
async fn service() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/ok", routing::post(|| async { "done" }))
        .route("/redirect", routing::post(|| async { (AxStatus::FOUND, [("location", "/ok")]) }))
        .route("/big", routing::post(|| async { vec![b'x'; 2 << 20] }))
        .route(
            "/tenanted",
            routing::post(|h: HeaderMap| async move {
                match h.get("x-fairway-tenant").and_then(|v| v.to_str().ok()) {
                    Some("acme") => AxStatus::SERVICE_UNAVAILABLE,
                    _ => AxStatus::OK,
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inputs_the_executor_cannot_send_are_the_jobs_own_failure() {
    let addr = service().await;
    let extra = format!(
        "[job_types.ok]\npool = \"short\"\nhandler = \"http\"\nurl = \"http://{addr}/ok?token=s3cret\"\n\
         [job_types.redirected]\npool = \"short\"\nhandler = \"http\"\nurl = \"http://{addr}/redirect\"\n\
         [job_types.big]\npool = \"short\"\nhandler = \"http\"\nurl = \"http://{addr}/big\"\n"
    );
    let cfg = common::arc(common::config(&format!("{extra}[api]\nauth = \"off\"\n")));
    let api = Api::start(&cfg).await;
    // At the API: a tracestate with a control character is refused.
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let bad = json!({"tenant": "acme", "job_type": "ok", "traceparent": tp, "tracestate": "a=b\u{1}"});
    let (s, _, body) = post(&reqwest::Client::new(), api.url("/v1/jobs"), &bad).await;
    assert_eq!((s, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("BAD_TRACE_CONTEXT")), "{body}");

    // Straight to Kafka: the bad tracestate is dropped and the job runs.
    let mut raw = common::job_record("acme", "ok");
    raw.traceparent = Some(tp.into());
    raw.tracestate = Some("a=b\u{1}".into());
    let redirected = common::job_record("acme", "redirected");
    let big = common::job_record("acme", "big");
    let ids: Vec<String> = [&raw, &redirected, &big].iter().map(|j| j.job_id.clone()).collect();
    common::produce_spread(&cfg, &[raw, redirected, big], None).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let results = common::results_for(&cfg, &ids, Duration::from_secs(45)).await;
    worker.stop().await;
    let r = &results[&ids[0]][0];
    assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
    let r = &results[&ids[1]][0];
    assert_eq!((r.status, r.failure_class), (JobStatus::Failed, Some(FailureClass::Permanent)), "{r:?}");
    assert!(r.error.as_deref().unwrap_or("").contains("follow_redirects"), "{r:?}");
    let r = &results[&ids[2]][0];
    assert_eq!((r.status, r.failure_class), (JobStatus::Failed, Some(FailureClass::Permanent)), "{r:?}");
    assert!(r.error.as_deref().unwrap_or("").contains("max_payload_bytes"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tenants_dependency_failures_do_not_stop_the_type_for_others() {
    let addr = service().await;
    let extra = format!(
        "[job_types.tenanted]\npool = \"short\"\nhandler = \"http\"\nurl = \"http://{addr}/tenanted\"\n\
         [job_types.tenanted.retry.dependency]\ndelays = [\"200ms\"]\nmax_attempts = 2\njitter = 0\n\
         [job_types.tenanted.breaker]\nwindow = \"20s\"\nmin_requests = 4\nfailure_ratio = 0.5\ncool_down = \"5s\"\n"
    );
    let cfg = Arc::new(common::config(&extra));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let sh = w.shared[0].clone();
    let attack: Vec<_> = (0..20).map(|_| common::job_record("acme", "tenanted")).collect();
    let served: Vec<_> = (0..20).map(|_| common::job_record("globex", "tenanted")).collect();
    let ids: Vec<String> = attack.iter().chain(&served).map(|j| j.job_id.clone()).collect();
    let mixed: Vec<_> = attack.into_iter().zip(served).flat_map(|(a, b)| [a, b]).collect();
    let (acme_ids, globex_ids) = ids.split_at(20);
    // The type-wide breaker must never open; acme's own must.
    let watch = async {
        let mut acme_held = false;
        loop {
            let (wide_open, acme_open) = {
                let h = sh.route.health.lock().unwrap();
                (
                    matches!(h.breakers.type_wide().state("tenanted"), BreakerState::Open { .. }),
                    matches!(h.breakers.tenant_state("tenanted", "acme"), BreakerState::Open { .. }),
                )
            };
            if wide_open {
                return acme_held;
            }
            acme_held |= acme_open;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let run = async {
        common::produce_spread(&cfg, &mixed, None).await;
        // Generous: the binary's other attacks run beside this one.
        common::results_for(&cfg, globex_ids, Duration::from_secs(120)).await
    };
    let results = tokio::select! {
        r = run => r,
        acme_held = watch => panic!("the type's breaker opened on one tenant's failures (acme's own opened: {acme_held})"),
    };
    let acme_state = sh.route.health.lock().unwrap().breakers.tenant_state("tenanted", "acme");
    let acme_results = common::results_for(&cfg, acme_ids, Duration::from_secs(5)).await;
    w.stop().await;
    let missing: Vec<&String> = globex_ids.iter().filter(|id| !results.contains_key(*id)).collect();
    assert!(missing.is_empty(), "B's jobs without a result after 120 s: {missing:?}");
    assert!(globex_ids.iter().all(|id| results[id][0].status == JobStatus::Succeeded), "B's jobs all ran");
    assert!(!matches!(acme_state, BreakerState::Closed), "acme's own breaker holds its jobs back: {acme_state:?}");
    assert!(acme_results.len() < 20, "acme's jobs wait for their probe ({} finished)", acme_results.len());
    assert!(acme_results.values().all(|r| r[0].failure_class == Some(FailureClass::Dependency)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_streams_are_capped_per_tenant_and_end_when_the_key_is_revoked() {
    let cfg = common::arc(common::config("[api]\nkey_refresh = \"1s\"\n[api.limits]\nstreams_per_key = 2\n"));
    let api = Api::start(&cfg).await;
    let (a_id, a_key) = key(&cfg, "acme").await;
    let (a, b) = (client(&a_key), client(&key(&cfg, "globex").await.1));
    let follow = |c: &reqwest::Client| c.get(api.url("/v1/events?follow=1")).send();
    let s1 = follow(&a).await.unwrap();
    let s2 = follow(&a).await.unwrap();
    assert_eq!((s1.status(), s2.status()), (StatusCode::OK, StatusCode::OK));
    let third = follow(&a).await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(third.headers().contains_key("retry-after"));
    assert_eq!(third.json::<Value>().await.unwrap()["code"], "TOO_MANY_STREAMS");
    let a2 = client(&key(&cfg, "acme").await.1);
    let more = follow(&a2).await.unwrap();
    assert_eq!(more.status(), StatusCode::TOO_MANY_REQUESTS, "another key of acme's buys no more streams");
    let sb = follow(&b).await.unwrap();
    assert_eq!(sb.status(), StatusCode::OK, "another tenant opens its streams");

    // Revoked: A's open streams end within seconds.
    let store = fairway::store::Store::open(&cfg).await.unwrap();
    assert!(store.key_statements().await.unwrap().revoke(&a_id, fairway::now_ms()).await.unwrap());
    for s in [s1, s2] {
        let ended = tokio::time::timeout(Duration::from_secs(15), async {
            let mut s = s;
            while let Ok(Some(_)) = s.chunk().await {}
        });
        ended.await.expect("a revoked key's stream ended");
    }
    drop(sb);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_dlq_page_reads_at_most_its_cap_of_records() {
    use fairway::core::replay::{ReplayFilter, ReplaySource};
    use fairway::model::{DeadLetter, JobSubmitted};
    let cfg = Arc::new(common::config(""));
    common::init(&cfg).await;
    let producer = fairway::kafka::producer(&cfg).unwrap();
    for _ in 0..6 {
        let job =
            JobSubmitted::original(uuid::Uuid::now_v7().to_string(), "acme".into(), "echo".into(), b"{}".to_vec(), 0);
        let dl = DeadLetter {
            job: Some(job),
            raw: None,
            failure_class: FailureClass::AppError,
            reason: "gave up".into(),
            last_error: None,
            attempts: 1,
            first_failure_at: 0,
            last_failure_at: 0,
            origin_topic: cfg.pool_topic(Pool::Short),
            origin_partition: 0,
            origin_offset: 0,
            replay_count: 0,
        };
        let bytes = fairway::codec::encode_dead_letter(&dl).unwrap();
        fairway::kafka::send(&producer, &cfg.dlq_topic(), "acme", &bytes).await.expect("dead letter");
    }
    let filter = ReplayFilter::default();
    let b = fairway::ops::replay::browse(&cfg, ReplaySource::Dlq, &filter, 200, 4).await.expect("browse");
    // The cap is split across the partitions (each partition's newest first): all six
    // are in acme's partition, so a page of 4 over 3 partitions reads 1 of them.
    assert!(b.scanned >= 1 && b.scanned <= 4, "one page reads at most its cap: {}", b.scanned);
    assert_eq!(b.listed.len() as u64, b.scanned);
    let b = fairway::ops::replay::browse(&cfg, ReplaySource::Dlq, &filter, 200, 100).await.expect("browse");
    assert_eq!((b.scanned, b.listed.len(), b.unread.len()), (6, 6, 0), "below the cap every record is read");
}
