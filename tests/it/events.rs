//! Watching a job against the real broker and CQL database: a job submitted through the
//! API is `queued` before any worker runs; its Server-Sent Events stream carries progress
//! and ends with the terminal event; the history is recorded; a tenant stream sees only
//! its tenant; `late_execution` for a job past `not_after`; an idempotent submit whose
//! produce fails leaves no claimed key, and a duplicate returns the result; job rows
//! expire after `retention.results`; `init` sets topic retention.

use crate::common;

use fairway::api::Caller;
use fairway::config::Config;
use fairway::handlers::Registry;
use fairway::model::{EventKind, Pool};
use fairway::submit::{NewJob, Submitter};
use fairway::worker::{Policy, Worker};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Api {
    base: String,
    http: reqwest::Client,
    stop: tokio::sync::oneshot::Sender<()>,
}

async fn create_key(cfg: &Config, caller: &Caller) -> String {
    common::create_key(cfg, caller, "it_events").await.1
}

fn client_with_key(token: &str) -> reqwest::Client {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
    reqwest::Client::builder().default_headers(h).build().unwrap()
}

impl Api {
    async fn start(cfg: &Arc<Config>) -> Api {
        common::init(cfg).await;
        let (base, stop) = common::serve_api(cfg).await;
        let admin = create_key(cfg, &Caller::Admin).await;
        Api { base, http: client_with_key(&admin), stop }
    }
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let r = tokio::time::timeout(Duration::from_secs(30), self.http.post(self.url(path)).json(body).send())
            .await
            .expect("POST answers within 30 s")
            .expect("POST");
        let s = r.status();
        (s, r.json().await.unwrap_or(Value::Null))
    }
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        get_with(&self.http, &self.url(path)).await
    }
}

async fn get_with(http: &reqwest::Client, url: &str) -> (StatusCode, Value) {
    let r = tokio::time::timeout(Duration::from_secs(30), http.get(url).send())
        .await
        .expect("GET answers within 30 s")
        .expect("GET");
    let s = r.status();
    (s, r.json().await.unwrap_or(Value::Null))
}

/// Reads a Server-Sent Events stream until the server ends it, `stop` says so, or
/// `timeout` passes; returns the (event name, data) pairs and whether the server ended it.
async fn read_sse(
    http: reqwest::Client,
    url: String,
    timeout: Duration,
    stop: impl Fn(&[(String, Value)]) -> bool,
) -> (Vec<(String, Value)>, bool) {
    let mut resp = http.get(&url).send().await.expect("SSE request");
    assert_eq!(resp.status(), StatusCode::OK, "SSE {url}");
    let ct = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    assert!(ct.starts_with("text/event-stream"), "content type {ct}");
    let deadline = tokio::time::Instant::now() + timeout;
    let (mut buf, mut out) = (String::new(), Vec::new());
    loop {
        match tokio::time::timeout_at(deadline, resp.chunk()).await {
            Err(_) => return (out, false),
            Ok(Ok(None)) => return (out, true),
            Ok(chunk) => buf.push_str(&String::from_utf8_lossy(&chunk.expect("SSE chunk").expect("a chunk"))),
        }
        while let Some(end) = buf.find("\n\n") {
            let frame: String = buf.drain(..end + 2).collect();
            let (mut name, mut data) = (String::new(), String::new());
            for line in frame.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if !data.is_empty() {
                out.push((name, serde_json::from_str(&data).expect("SSE data is JSON")));
            }
        }
        if stop(&out) {
            return (out, false);
        }
    }
}

fn kinds(evs: &[(String, Value)]) -> Vec<String> {
    evs.iter().map(|(k, _)| k.clone()).collect()
}

/// Polls `GET path` until `ok` holds (at most `timeout`); returns the last answer.
async fn poll(
    api: &Api,
    path: &str,
    timeout: Duration,
    ok: impl Fn(StatusCode, &Value) -> bool,
) -> (StatusCode, Value) {
    let deadline = Instant::now() + timeout;
    loop {
        let (s, v) = api.get(path).await;
        if ok(s, &v) || Instant::now() > deadline {
            return (s, v);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn queued_at_once_then_sse_progress_to_the_end_history_and_tenant_stream() {
    let cfg = common::arc(common::config(""));
    let api = Api::start(&cfg).await;

    // Queued before any worker runs: the row is written at submission.
    let (s, a) = api.post("/v1/jobs", &json!({"tenant": "acme", "job_type": "sleep", "payload": {"ms": 1500}})).await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let id = a["job_id"].as_str().unwrap().to_string();
    let (s, st) = api.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!(s, StatusCode::OK, "a queued job is visible at once: {st}");
    assert_eq!((st["status"].as_str(), st["state"].as_str()), (Some("queued"), Some("queued")), "{st}");
    assert_eq!(st["tenant"], "acme");

    // A job scheduled ahead is `scheduled`.
    let later = fairway::now_ms() + 600_000;
    let (s, b) = api.post("/v1/jobs", &json!({"tenant": "acme", "job_type": "echo", "execute_at": later})).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (_, st) = api.get(&format!("/v1/jobs/{}", b["job_id"].as_str().unwrap())).await;
    assert_eq!(st["state"], "scheduled", "{st}");

    // Where those states live: the queued job's is a packed record (no `jobs` row); the
    // scheduled one keeps its row (it outlives the packs' TTL).
    let store = fairway::store::Store::open(&cfg).await.expect("store");
    let row_status = |job_id: String| {
        let (store, q) = (store.clone(), format!("SELECT status FROM {}.jobs WHERE job_id = ?", store.keyspace()));
        async move {
            let res = store.session().query_unpaged(q, (job_id,)).await.expect("query").into_rows_result().unwrap();
            res.maybe_first_row::<(Option<String>,)>().unwrap().and_then(|r| r.0)
        }
    };
    assert_eq!(row_status(id.clone()).await, None, "a queued job has no row");
    assert_eq!(row_status(b["job_id"].as_str().unwrap().to_string()).await.as_deref(), Some("scheduled"));

    // Follow the first job; a tenant key follows globex's events only.
    let follow = tokio::spawn(read_sse(
        api.http.clone(),
        api.url(&format!("/v1/jobs/{id}/events?follow=1")),
        Duration::from_secs(60),
        |_| false,
    ));
    let globex = client_with_key(&create_key(&cfg, &Caller::Tenant("globex".into())).await);
    let (s, e) = get_with(&globex, &api.url("/v1/events?follow=1&tenant=acme")).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "a tenant key cannot follow another tenant: {e}");
    let (s, e) = get_with(&globex, &api.url("/v1/events")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    assert!(e["error"].as_str().unwrap().contains("follow=1"), "{e}");
    let tenant_stream =
        tokio::spawn(read_sse(globex.clone(), api.url("/v1/events?follow=1"), Duration::from_secs(60), |evs| {
            evs.iter().any(|(k, _)| k == "succeeded")
        }));
    // The feed starts at the topic's end once its consumer has partitions: give it a moment.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (s, g) = api.post("/v1/jobs", &json!({"tenant": "globex", "job_type": "echo", "payload": "hi"})).await;
    assert_eq!(s, StatusCode::CREATED, "{g}");
    let g_id = g["job_id"].as_str().unwrap().to_string();

    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();

    let (evs, ended) = follow.await.unwrap();
    let k = kinds(&evs);
    assert!(ended, "the stream ends by itself after the terminal event: {k:?}");
    assert_eq!(k.first().map(String::as_str), Some("queued"), "{k:?}");
    assert!(k.iter().any(|k| k == "started"), "{k:?}");
    let progress: Vec<f64> =
        evs.iter().filter(|(k, _)| k == "progress").filter_map(|(_, v)| v["progress"].as_f64()).collect();
    assert!(progress.len() >= 3, "progress events while it runs: {k:?}");
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "progress in order: {progress:?}");
    assert_eq!(k.last().map(String::as_str), Some("succeeded"), "{k:?}");
    assert!(evs.iter().all(|(_, v)| v["job_id"] == id.as_str()), "only this job's events");

    let (tevs, _) = tenant_stream.await.unwrap();
    assert!(tevs.iter().all(|(_, v)| v["tenant"] == "globex"), "only globex's events: {tevs:?}");
    assert!(
        tevs.iter().any(|(k, v)| k == "succeeded" && v["job_id"] == g_id.as_str()),
        "globex's job's end: {:?}",
        kinds(&tevs)
    );

    // The history, recorded from the topic.
    let (s, h) = poll(&api, &format!("/v1/jobs/{id}/events"), Duration::from_secs(20), |s, v| {
        s == StatusCode::OK && v["events"].as_array().is_some_and(|e| e.iter().any(|e| e["kind"] == "succeeded"))
    })
    .await;
    assert_eq!(s, StatusCode::OK, "{h}");
    assert_eq!(h["state"], "succeeded", "{h}");
    let hk: Vec<&str> = h["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(hk.first(), Some(&"queued"), "{hk:?}");
    assert!(hk.contains(&"started") && hk.contains(&"progress"), "{hk:?}");
    // Its `queued` event is told by its packed state, not recorded (the submitter wrote
    // that state and said so on the record); the scheduled job's event is recorded.
    let recorded = store.event_statements().await.unwrap();
    let rk: Vec<EventKind> = recorded.events(&id, None).await.unwrap().iter().map(|e| e.kind).collect();
    assert!(rk.contains(&EventKind::Succeeded) && !rk.contains(&EventKind::Queued), "recorded: {rk:?}");
    let b_id = b["job_id"].as_str().unwrap().to_string();
    let (s, bh) = poll(&api, &format!("/v1/jobs/{b_id}/events"), Duration::from_secs(20), |s, v| {
        s == StatusCode::OK && v["events"].as_array().is_some_and(|e| !e.is_empty())
    })
    .await;
    assert_eq!(bh["events"][0]["kind"], "scheduled", "{s} {bh}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let rk = loop {
        let rk: Vec<EventKind> = recorded.events(&b_id, None).await.unwrap().iter().map(|e| e.kind).collect();
        if !rk.is_empty() || Instant::now() > deadline {
            break rk;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(rk, vec![EventKind::Scheduled], "the scheduled job's submission is recorded");
    // Another tenant's key sees neither the job nor its history.
    let (s, _) = get_with(&globex, &api.url(&format!("/v1/jobs/{id}/events"))).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    worker.stop().await;
    let _ = api.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_past_not_after_reports_late_execution_and_expires() {
    let cfg = common::arc(common::config(""));
    let api = Api::start(&cfg).await;
    let past = fairway::now_ms() - 1_000;
    let (s, a) = api.post("/v1/jobs", &json!({"tenant": "acme", "job_type": "echo", "not_after": past})).await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let id = a["job_id"].as_str().unwrap().to_string();
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let (s, h) = poll(&api, &format!("/v1/jobs/{id}/events"), Duration::from_secs(40), |s, v| {
        s == StatusCode::OK && v["events"].as_array().is_some_and(|e| e.iter().any(|e| e["kind"] == "expired"))
    })
    .await;
    worker.stop().await;
    assert_eq!(s, StatusCode::OK, "{h}");
    let evs = h["events"].as_array().unwrap();
    let late = evs.iter().find(|e| e["kind"] == "late_execution").unwrap_or_else(|| panic!("no late_execution: {h}"));
    assert!(late["message"].as_str().unwrap().contains("not_after"), "{late}");
    assert_eq!(h["state"], "expired", "{h}");
    let _ = api.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_produce_leaves_no_claimed_key_and_a_duplicate_returns_the_result() {
    let cfg = common::arc(common::config(""));
    let api = Api::start(&cfg).await;
    let store = fairway::store::Store::open(&cfg).await.unwrap();
    let key = format!("order-{}", uuid::Uuid::new_v4());
    let claimed = |store: fairway::store::Store, key: String| async move {
        let cql = format!("SELECT job_id FROM {}.idempotency WHERE tenant = ? AND key = ?", store.keyspace());
        let r = store.session().query_unpaged(cql, ("acme", key.as_str())).await.unwrap();
        r.into_rows_result().unwrap().rows_num()
    };

    // A producer that refuses the record at once (larger than its message.max.bytes).
    let mut small = (*cfg).clone();
    small.kafka.properties.set("message.max.bytes", "1000");
    let failing = Submitter::new(Arc::new(small), Some(store.clone())).unwrap();
    let failed_id = uuid::Uuid::now_v7().to_string();
    let job = NewJob {
        tenant: "acme".into(),
        job_type: "echo".into(),
        payload: json!("x".repeat(4000)).into(),
        idempotency_key: Some(key.clone()),
        job_id: Some(failed_id.clone()),
        ..Default::default()
    };
    let err = failing.submit(&job).await.expect_err("the produce fails");
    assert!(err.to_string().contains("producing to"), "{err}");
    assert_eq!(claimed(store.clone(), key.clone()).await, 0, "no key left claimed after the failed produce");
    // Nothing was recorded for it: no queued record in a pack (written only after the
    // broker's acknowledgement), no row.
    let left = store.job(&failed_id).await.expect("read");
    assert!(left.is_none(), "a job whose produce failed has no state: {left:?}");

    // The client's retry is a fresh submission, runs, and a later duplicate answers with
    // the original job's state and result.
    let body = json!({"tenant": "acme", "job_type": "echo", "payload": "x".repeat(4000), "idempotency_key": key});
    let (s, first) = api.post("/v1/jobs", &body).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    assert_eq!(first["duplicate"], false, "the retry after a failed produce is not a duplicate: {first}");
    assert_eq!(claimed(store.clone(), key.clone()).await, 1);
    let id = first["job_id"].as_str().unwrap().to_string();
    let (s, dup) = api.post("/v1/jobs", &body).await;
    assert_eq!(s, StatusCode::CREATED, "{dup}");
    assert_eq!((dup["duplicate"].as_bool(), dup["job_id"].as_str()), (Some(true), Some(id.as_str())), "{dup}");
    assert_eq!(dup["state"], "queued", "{dup}");

    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let (_, st) =
        poll(&api, &format!("/v1/jobs/{id}"), Duration::from_secs(40), |_, v| v["status"] == "succeeded").await;
    worker.stop().await;
    assert_eq!(st["status"], "succeeded", "{st}");
    let (s, dup) = api.post("/v1/jobs", &body).await;
    assert_eq!(s, StatusCode::CREATED, "{dup}");
    assert_eq!(dup["job_id"], id.as_str());
    assert_eq!(dup["state"], "succeeded", "{dup}");
    assert_eq!(dup["result"]["status"], "succeeded", "{dup}");
    assert!(dup["result"]["output"].as_str().unwrap_or_default().contains("xxxx"), "{dup}");
    let _ = api.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_rows_expire_after_retention_and_init_sets_topic_retention() {
    let mut c = common::config("");
    c.retention.results = Duration::from_secs(2);
    let cfg = common::arc(c);
    common::init(&cfg).await;
    let store = fairway::store::Store::open(&cfg).await.unwrap();
    let submitter = Submitter::new(cfg.clone(), Some(store.clone())).unwrap();
    let job = NewJob { tenant: "acme".into(), job_type: "echo".into(), ..Default::default() };
    let s = submitter.submit(&job).await.unwrap();
    let row = store.job_direct(&s.job_id).await.unwrap().expect("queued row");
    assert_eq!(row.status.as_deref(), Some("queued"));
    let deadline = Instant::now() + Duration::from_secs(15);
    while store.job_direct(&s.job_id).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the row outlived its 2 s TTL by far");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Topics are created with [retention] (retention.ms at creation); `init` changes it on
    // existing topics through DescribeConfigs/AlterConfigs: nothing to change after
    // creation, then exactly one change, then nothing again.
    let mut changed = (*cfg).clone();
    changed.retention.dlq = Duration::from_secs(2 * 86_400);
    let none = fairway::kafka::apply_retention(&cfg).await.expect("describe configs");
    assert_eq!(none, Vec::<String>::new(), "every topic was created with its configured retention.ms");
    let out = fairway::kafka::apply_retention(&changed).await.expect("alter configs");
    assert!(out.len() == 1 && out[0].contains("dlq") && out[0].contains("172800000"), "{out:?}");
    assert_eq!(fairway::kafka::apply_retention(&changed).await.unwrap(), Vec::<String>::new());
}

/// What the test's webhook receiver got: (path, signature header, delivery header, body).
type Received = Arc<std::sync::Mutex<Vec<(String, String, String, Vec<u8>)>>>;

/// A local HTTP receiver on 127.0.0.1: `/ok` answers 200; `/flaky` answers 500 to the
/// first POST of each delivery id and 200 after; `/dead` always answers 503.
async fn webhook_receiver() -> (String, Received) {
    use axum::{extract::State, http::HeaderMap, http::StatusCode as S, http::Uri};
    let got: Received = Default::default();
    let handler = |State(got): State<Received>, uri: Uri, h: HeaderMap, body: axum::body::Bytes| async move {
        let header = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let (sig, delivery) = (header("fairway-signature"), header("fairway-delivery"));
        let mut g = got.lock().unwrap();
        let seen = g.iter().any(|(_, _, d, _)| *d == delivery);
        g.push((uri.path().to_string(), sig, delivery, body.to_vec()));
        if uri.path() == "/dead" {
            S::SERVICE_UNAVAILABLE
        } else if uri.path() == "/flaky" && !seen {
            S::INTERNAL_SERVER_ERROR
        } else {
            S::OK
        }
    };
    let app = axum::Router::new().fallback(axum::routing::post(handler)).with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhooks_one_signed_post_per_job_a_500_is_retried_and_attempts_are_events() {
    let (base, got) = webhook_receiver().await;
    let secret = "it-secret-0123456789abcdef";
    let mut cfg = common::config(&format!(
        "[job_types.hook_ok]\npool = \"short\"\nhandler = \"echo\"\nwebhook_url = \"{base}/ok?token=t0\"\n\
         [job_types.hook_flaky]\npool = \"short\"\nhandler = \"echo\"\nwebhook_url = \"{base}/flaky\"\n"
    ));
    cfg.webhooks.secrets.insert("acme".into(), fairway::config::Secret::new(secret));
    cfg.webhooks.backoff_initial = Duration::from_millis(300);
    let cfg = common::arc(cfg);
    let api = Api::start(&cfg).await;
    let mut ok_ids = Vec::new();
    for i in 0..3 {
        let (s, a) = api.post("/v1/jobs", &json!({"tenant": "acme", "job_type": "hook_ok", "payload": i})).await;
        assert_eq!(s, StatusCode::CREATED, "{a}");
        ok_ids.push(a["job_id"].as_str().unwrap().to_string());
    }
    let (s, a) = api.post("/v1/jobs", &json!({"tenant": "acme", "job_type": "hook_flaky", "payload": "x"})).await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let flaky = a["job_id"].as_str().unwrap().to_string();
    // globex has no signing secret: its webhook jobs are refused before they run (an
    // unsigned callback is never sent; before, its results were silently not delivered).
    let (s, refused) = api.post("/v1/jobs", &json!({"tenant": "globex", "job_type": "hook_ok", "payload": 0})).await;
    let code = refused["code"].as_str();
    assert_eq!((s, code), (StatusCode::UNPROCESSABLE_ENTITY, Some("WEBHOOK_SECRET_MISSING")), "{refused}");
    assert!(refused["error"].as_str().unwrap().contains("webhooks.secrets.globex"), "{refused}");
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();

    // 3 POSTs to /ok and 2 to /flaky (the 500, then the retry), then nothing more.
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.lock().unwrap().len() < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    worker.stop().await;
    let got = got.lock().unwrap().clone();
    let summary: Vec<(&str, &str)> = got.iter().map(|(p, _, d, _)| (p.as_str(), d.as_str())).collect();
    assert_eq!(got.len(), 5, "one POST per ok job, two for the flaky one: {summary:?}");
    for (path, sig, delivery, body) in &got {
        assert!(common::signature_valid(secret, sig, body), "bad signature {sig:?} on {path}");
        assert!(!common::signature_valid("another-secret-0123456789", sig, body), "a wrong secret must not verify");
        let v: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(v["delivery_id"].as_str(), Some(delivery.as_str()), "{v}");
        assert_eq!(v["status"], "succeeded", "{v}");
    }
    for id in &ok_ids {
        let n = got
            .iter()
            .filter(|(p, _, _, b)| p == "/ok" && serde_json::from_slice::<Value>(b).unwrap()["job_id"] == id.as_str())
            .count();
        assert_eq!(n, 1, "exactly one POST for {id}: {summary:?}");
    }
    let n = got.iter().filter(|(p, _, d, _)| p == "/flaky" && d.starts_with(&flaky)).count();
    assert_eq!(n, 2, "the 500 is retried once: {summary:?}");

    // The attempts are in the job's events: a failed attempt 1 (HTTP 500), delivered on 2.
    let (s, h) = poll(&api, &format!("/v1/jobs/{flaky}/events"), Duration::from_secs(20), |s, v| {
        s == StatusCode::OK
            && v["events"].as_array().is_some_and(|e| e.iter().any(|e| e["kind"] == "webhook_delivered"))
    })
    .await;
    assert_eq!(s, StatusCode::OK, "{h}");
    let evs = h["events"].as_array().unwrap();
    let failed = evs.iter().find(|e| e["kind"] == "webhook_failed").unwrap_or_else(|| panic!("{h}"));
    assert_eq!(failed["attempt"], 1, "{failed}");
    assert!(failed["message"].as_str().unwrap().contains("HTTP 500"), "{failed}");
    assert!(failed["next_attempt_at"].as_i64().is_some(), "{failed}");
    let delivered = evs.iter().find(|e| e["kind"] == "webhook_delivered").unwrap();
    assert_eq!(delivered["attempt"], 2, "{delivered}");
    assert!(delivered["message"].as_str().unwrap().contains("HTTP 200"), "{delivered}");
    assert_eq!(h["state"], "succeeded", "webhook events do not move the state: {h}");
    let (_, h) = poll(&api, &format!("/v1/jobs/{}/events", ok_ids[0]), Duration::from_secs(20), |_, v| {
        v["events"].as_array().is_some_and(|e| e.iter().any(|e| e["kind"] == "webhook_delivered"))
    })
    .await;
    let msgs: Vec<&str> = h["events"].as_array().unwrap().iter().filter_map(|e| e["message"].as_str()).collect();
    assert!(msgs.iter().all(|m| !m.contains("token=t0")), "no URL query in events: {msgs:?}");
    let _ = api.stop.send(());
}

/// A dead receiver (503 to everything, so its deliveries wait out long backoffs) with 8
/// results in delivery, against `webhooks.concurrency = 4`: another receiver's result is
/// still delivered within seconds. (When a delivery held one of the shared slots through
/// its backoff, the dead receiver's 4 held them all and the other result waited for
/// minutes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_webhook_receiver_holds_only_its_own_deliveries() {
    let (base, got) = webhook_receiver().await;
    let mut cfg = common::config(&format!(
        "[job_types.hook_dead]\npool = \"short\"\nhandler = \"echo\"\nwebhook_url = \"{base}/dead\"\n\
         [job_types.hook_ok]\npool = \"short\"\nhandler = \"echo\"\nwebhook_url = \"{base}/ok\"\n"
    ));
    cfg.webhooks.secrets.insert("acme".into(), fairway::config::Secret::new("it-secret-0123456789abcdef"));
    cfg.webhooks.secrets.insert("globex".into(), fairway::config::Secret::new("it-secret-globex-0123456789"));
    cfg.webhooks.backoff_initial = Duration::from_secs(20);
    cfg.webhooks.concurrency = 4;
    let cfg = common::arc(cfg);
    let api = Api::start(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    for i in 0..8 {
        let (s, a) = api.post("/v1/jobs", &json!({"tenant": "acme", "job_type": "hook_dead", "payload": i})).await;
        assert_eq!(s, StatusCode::CREATED, "{a}");
    }
    let dead_posts = || got.lock().unwrap().iter().filter(|(p, ..)| p == "/dead").count();
    let deadline = Instant::now() + Duration::from_secs(60);
    while dead_posts() < 8 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(dead_posts() >= 4, "the dead receiver's first attempts: {}", dead_posts());
    let asked = Instant::now();
    let (s, a) = api.post("/v1/jobs", &json!({"tenant": "globex", "job_type": "hook_ok", "payload": 0})).await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let ok_posts = || got.lock().unwrap().iter().filter(|(p, ..)| p == "/ok").count();
    let deadline = asked + Duration::from_secs(60);
    while ok_posts() == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let waited = asked.elapsed();
    worker.stop().await;
    let _ = api.stop.send(());
    println!("other receiver's webhook after {waited:?} (dead receiver: {} POSTs)", dead_posts());
    assert_eq!(ok_posts(), 1, "the live receiver's result is delivered while the dead one backs off");
    assert!(waited < Duration::from_secs(15), "delivered {waited:?} after submission");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_produced_straight_to_kafka_is_queued_before_any_worker_runs_it() {
    let cfg = common::arc(common::config(""));
    let api = Api::start(&cfg).await;
    let job = common::job_record("acme", "echo");
    let producer = fairway::kafka::producer(&cfg).unwrap();
    let bytes = fairway::codec::encode_job(&job).unwrap();
    fairway::kafka::send(&producer, &cfg.pool_topic(Pool::Short), "acme", &bytes).await.unwrap();
    // No worker runs: the job's record on its pool topic is its `queued` event.
    let path = format!("/v1/jobs/{}", job.job_id);
    let (s, st) = poll(&api, &path, Duration::from_secs(30), |s, _| s == StatusCode::OK).await;
    assert_eq!(s, StatusCode::OK, "visible without a worker: {st}");
    assert_eq!(st["state"], "queued", "{st}");
    let (_, h) = api.get(&format!("{path}/events")).await;
    let e = &h["events"][0];
    assert_eq!((e["kind"].as_str(), e["at"].as_i64()), (Some("queued"), Some(job.submitted_at)), "{h}");
    // Then a worker runs it, and the history goes on from there.
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let (_, st) = poll(&api, &path, Duration::from_secs(40), |_, v| v["state"] == "succeeded").await;
    worker.stop().await;
    assert_eq!(st["state"], "succeeded", "{st}");
    let _ = api.stop.send(());
}
