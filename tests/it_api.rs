//! The HTTP API against the real broker and CQL database: submissions land on the pool
//! topic and run, validation answers name the problem, per-tenant rate limits answer 429
//! with Retry-After, idempotency keys, status and cooperative cancel; API keys (401
//! without one, tenant scoping, prompt revocation) and the separate metrics listener.

mod common;

use fairway::api::{self, ApiState, Caller};
use fairway::config::Config;
use fairway::handlers::Registry;
use fairway::model::{JobStatus, Pool};
use fairway::worker::{Policy, Worker};
use fairway::{codec, model::JobSubmitted};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A running API server on 127.0.0.1:<free port>, its metrics listener on another, and
/// a client that sends an admin key.
struct Api {
    base: String,
    ops: String,
    http: reqwest::Client,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Makes an API key for `caller` in the deployment of `cfg` (as `fairway keys create`).
async fn create_key(cfg: &Config, caller: &Caller) -> (String, String) {
    common::create_key(cfg, caller, "it_api").await
}

fn client_with_key(token: &str) -> reqwest::Client {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
    reqwest::Client::builder().timeout(Duration::from_secs(40)).default_headers(h).build().unwrap()
}

impl Api {
    async fn start(cfg: &Arc<Config>, metrics: Option<metrics_exporter_prometheus::PrometheusHandle>) -> Api {
        common::init(cfg).await;
        let state = ApiState::connect(cfg.clone(), metrics).await.expect("API state");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let ops_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ops = format!("http://{}", ops_listener.local_addr().unwrap());
        tokio::spawn(axum::serve(ops_listener, api::ops_router(state.clone())).into_future());
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(api::serve(listener, state, async move {
            let _ = rx.await;
        }));
        let (_, admin) = create_key(cfg, &Caller::Admin).await;
        Api { base: format!("http://{addr}"), ops, http: client_with_key(&admin), stop, task }
    }

    /// The same server seen through another client (another key, or none).
    fn as_client(&self, http: reqwest::Client) -> ApiView<'_> {
        ApiView { api: self, http }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let (s, _, v) = self.post_full(path, body).await;
        (s, v)
    }

    async fn post_full(&self, path: &str, body: &Value) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let r = self.http.post(self.url(path)).json(body).send().await.expect("POST");
        let (s, h) = (r.status(), r.headers().clone());
        (s, h, r.json().await.unwrap_or(Value::Null))
    }

    async fn post_raw(&self, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        let r = self
            .http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("POST");
        let s = r.status();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    /// Like `post_raw` for a body the server refuses before reading it all: it answers 413
    /// and closes the connection, and the client, still writing, may see the close before
    /// the answer (a race in any HTTP/1.1 client without `Expect: 100-continue`). Retried
    /// until the answer is read, a few times at most.
    async fn post_oversized(&self, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        for _ in 0..10 {
            let sent = self
                .http
                .post(self.url(path))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await;
            if let Ok(r) = sent {
                let s = r.status();
                let close = r.headers().get("connection").and_then(|v| v.to_str().ok());
                assert_eq!(close, Some("close"), "a body refused unread closes its connection and says so");
                return (s, r.json().await.unwrap_or(Value::Null));
            }
        }
        panic!("the server never answered an oversized POST (10 tries)");
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.as_client(self.http.clone()).get(path).await
    }

    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        let r = self.http.delete(self.url(path)).send().await.expect("DELETE");
        let s = r.status();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    /// Graceful shutdown must finish promptly.
    async fn shutdown(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("server stops within 10s of the shutdown signal")
            .unwrap()
            .expect("server returns Ok");
    }
}

/// Requests with another client against an [`Api`].
struct ApiView<'a> {
    api: &'a Api,
    http: reqwest::Client,
}

impl ApiView<'_> {
    async fn send(&self, r: reqwest::RequestBuilder) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let r = r.send().await.expect("request");
        let (s, h) = (r.status(), r.headers().clone());
        (s, h, r.json().await.unwrap_or(Value::Null))
    }
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let (s, _, v) = self.send(self.http.get(self.api.url(path))).await;
        (s, v)
    }
    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let (s, _, v) = self.send(self.http.post(self.api.url(path)).json(body)).await;
        (s, v)
    }
    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        let (s, _, v) = self.send(self.http.delete(self.api.url(path))).await;
        (s, v)
    }
}

fn job(tenant: &str, job_type: &str, payload: Value) -> Value {
    json!({ "tenant": tenant, "job_type": job_type, "payload": payload })
}

fn id_of(v: &Value) -> String {
    v["job_id"].as_str().unwrap_or_else(|| panic!("no job_id in {v}")).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn submitted_jobs_run_and_status_idempotency_and_cancel_work() {
    let cfg = common::arc(common::config(""));
    let api = Api::start(&cfg, None).await;

    // Submit: 201, Location, the pool of the job type.
    let (s, h, a) = api.post_full("/v1/jobs", &job("acme", "echo", json!({"hello": "api"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let a_id = id_of(&a);
    assert_eq!(a["pool"], "short");
    assert_eq!(a["duplicate"], false);
    assert_eq!(h.get("location").unwrap().to_str().unwrap(), format!("/v1/jobs/{a_id}"));

    // Cancel a job that is still queued (no worker yet): 202; its state shows the request.
    let (s, b) = api.post("/v1/jobs", &job("globex", "echo", json!({"cancel": "me"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let b_id = id_of(&b);
    let (s, c) = api.delete(&format!("/v1/jobs/{b_id}")).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{c}");
    assert_eq!(c["cancel_requested"], true);
    let (s, st) = api.get(&format!("/v1/jobs/{b_id}")).await;
    assert_eq!(s, StatusCode::OK, "{st}");
    assert_eq!(st["cancel_requested"], true);

    // Idempotency key: the second submission returns the first job id, marked duplicate.
    let key = format!("order-{}", uuid::Uuid::new_v4());
    let mut with_key = job("initech", "echo", json!({"order": 1}));
    with_key["idempotency_key"] = json!(key);
    let (s, first) = api.post("/v1/jobs", &with_key).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    assert_eq!(first["duplicate"], false);
    let (s, again) = api.post("/v1/jobs", &with_key).await;
    assert_eq!(s, StatusCode::CREATED, "{again}");
    assert_eq!(again["job_id"], first["job_id"], "same key, same job");
    assert_eq!(again["duplicate"], true);
    let keyed_id = id_of(&first);

    // Unknown job id: 404 with a code.
    let (s, nf) = api.get(&format!("/v1/jobs/{}", uuid::Uuid::now_v7())).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{nf}");
    assert_eq!(nf["code"], "JOB_NOT_FOUND");

    // A worker runs them: the echo job succeeds, the cancelled one is skipped as cancelled.
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let ids = vec![a_id.clone(), b_id.clone(), keyed_id.clone()];
    let results = common::results_for(&cfg, &ids, Duration::from_secs(60)).await;
    worker.stop().await;
    for id in &ids {
        assert!(results.contains_key(id), "no result for {id}: {results:?}");
    }
    let ra = &results[&a_id][0];
    assert_eq!(ra.status, JobStatus::Succeeded, "{ra:?}");
    assert!(String::from_utf8_lossy(ra.output.as_deref().unwrap_or_default()).contains("hello"));
    assert!(results[&b_id].iter().all(|r| r.status == JobStatus::Cancelled), "{:?}", results[&b_id]);
    assert_eq!(results[&keyed_id].len(), 1, "the duplicate submission produced nothing");

    // Status of the finished job, like `fairway status --json`.
    let deadline = Instant::now() + Duration::from_secs(10);
    let st = loop {
        let (s, st) = api.get(&format!("/v1/jobs/{a_id}")).await;
        if s == StatusCode::OK && st["status"] == "succeeded" || Instant::now() > deadline {
            break st;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(st["status"], "succeeded", "{st}");
    assert_eq!(st["tenant"], "acme");
    assert_eq!(st["job_type"], "echo");
    assert!(st["output"].as_str().unwrap_or_default().contains("hello"), "{st}");
    assert!(st.get("heartbeat_age_ms").is_some() && st.get("progress").is_some(), "{st}");

    // Cancelling a finished job: 409.
    let (s, c) = api.delete(&format!("/v1/jobs/{a_id}")).await;
    assert_eq!(s, StatusCode::CONFLICT, "{c}");
    assert_eq!(c["code"], "JOB_ALREADY_FINISHED");

    api.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn validation_rate_limits_and_batches() {
    let cfg = common::arc(common::config(
        "[worker]\nmax_payload_bytes = 2048\n[tenants.slowpoke]\ntier = \"free\"\nrate_per_sec = 2\n",
    ));
    let api = Api::start(&cfg, None).await;

    // Unknown tenant / job type: 400 naming it and the fix.
    let (s, e) = api.post("/v1/jobs", &job("nobody-here", "echo", json!({}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    assert_eq!(e["code"], "UNKNOWN_TENANT");
    let msg = e["error"].as_str().unwrap();
    assert!(msg.contains("nobody-here") && msg.contains("fairway tenants add nobody-here"), "{msg}");
    let (s, e) = api.post("/v1/jobs", &job("acme", "no-such-type", json!({}))).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::BAD_REQUEST, Some("UNKNOWN_JOB_TYPE")), "{e}");

    // Oversized payload: 413 naming the limit; a body far above any payload: 413 too.
    let (s, e) = api.post("/v1/jobs", &job("acme", "echo", json!("x".repeat(5000)))).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{e}");
    assert_eq!(e["code"], "PAYLOAD_TOO_LARGE");
    assert!(e["error"].as_str().unwrap().contains("max_payload_bytes"), "{e}");
    let huge = serde_json::to_vec(&job("acme", "echo", json!("y".repeat(200_000)))).unwrap();
    let (s, e) = api.post_oversized("/v1/jobs", huge).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("BODY_TOO_LARGE")), "{e}");

    // Not JSON: 400; JSON but not a job: 422 listing the fields; a job that could never run: 422.
    let (s, e) = api.post_raw("/v1/jobs", b"{nope".to_vec()).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::BAD_REQUEST, Some("INVALID_JSON")), "{e}");
    let (s, e) = api.post_raw("/v1/jobs", br#"{"tenant":"acme"}"#.to_vec()).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("INVALID_JOB")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("job_type"), "{e}");
    let mut never = job("acme", "echo", json!({}));
    never["execute_at"] = json!(2_000_000_000_000i64);
    never["not_after"] = json!(1_000_000_000_000i64);
    let (s, e) = api.post("/v1/jobs", &never).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("NEVER_RUNNABLE")), "{e}");

    // Rate limit: slowpoke may submit 2/s (burst 2); a burst of 6 gets 429 + Retry-After.
    let jobs: Vec<Value> = (0..6).map(|i| job("slowpoke", "echo", json!({ "i": i }))).collect();
    let burst = futures::future::join_all(jobs.iter().map(|j| api.post_full("/v1/jobs", j))).await;
    let ok = burst.iter().filter(|r| r.0 == StatusCode::CREATED).count();
    let limited: Vec<_> = burst.iter().filter(|r| r.0 == StatusCode::TOO_MANY_REQUESTS).collect();
    assert!((1..=3).contains(&ok), "2 (maybe 3) of 6 accepted, got {ok}: {burst:?}");
    assert_eq!(ok + limited.len(), 6, "{burst:?}");
    let (_, h, body) = limited[0];
    let retry_after: u64 = h.get("retry-after").expect("Retry-After header").to_str().unwrap().parse().unwrap();
    assert!(retry_after >= 1, "{retry_after}");
    assert_eq!(body["code"], "TENANT_RATE_LIMIT_EXCEEDED");
    assert!(body["error"].as_str().unwrap().contains("slowpoke"), "{body}");
    // Other tenants are not affected; slowpoke is accepted again after the wait.
    let (s, e) = api.post("/v1/jobs", &job("piedpiper", "echo", json!({}))).await;
    assert_eq!(s, StatusCode::CREATED, "{e}");
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    let (s, e) = api.post("/v1/jobs", &job("slowpoke", "echo", json!({"after": "wait"}))).await;
    assert_eq!(s, StatusCode::CREATED, "after Retry-After: {e}");
    let late_id = id_of(&e);

    // Batches: all-or-nothing validation, then 201 with one entry per job.
    let bad = json!([job("acme", "echo", json!({"b": 0})), job("ghost", "echo", json!({}))]);
    let (s, e) = api.post("/v1/jobs:batch", &bad).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    assert!(e["error"].as_str().unwrap().starts_with("job [1]"), "{e}");
    let good = json!([
        job("acme", "echo", json!({"b": 1})),
        job("globex", "report", json!({"ms": 1})),
        job("acme", "echo", json!("plain text")),
    ]);
    let (s, out) = api.post("/v1/jobs:batch", &good).await;
    assert_eq!(s, StatusCode::CREATED, "{out}");
    let out = out.as_array().unwrap().clone();
    assert_eq!(out.len(), 3);
    assert_eq!(out[1]["pool"], "medium");
    let too_many: Vec<Value> = (0..3).map(|i| job("slowpoke", "echo", json!({ "i": i }))).collect();
    let (s, e) = api.post("/v1/jobs:batch", &Value::Array(too_many)).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("BATCH_EXCEEDS_BURST")), "{e}");
    let (s, e) = api.post("/v1/jobs:batch", &json!([])).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("EMPTY_BATCH")), "{e}");

    // The accepted jobs are on their pool topics, Avro-encoded, with their payloads.
    let want: Vec<String> = vec![id_of(&out[0]), id_of(&out[2]), late_id.clone()];
    let short = common::read_until(
        &cfg,
        &cfg.pool_topic(Pool::Short),
        Duration::from_secs(30),
        |b, _, _| codec::decode_job(b).ok(),
        |v: &[JobSubmitted]| want.iter().all(|w| v.iter().any(|j| &j.job_id == w)),
    )
    .await;
    for w in &want {
        assert!(short.iter().any(|j| &j.job_id == w), "job {w} not on {}", cfg.pool_topic(Pool::Short));
    }
    let plain = short.iter().find(|j| j.job_id == want[1]).unwrap();
    assert_eq!((plain.tenant.as_str(), plain.payload.as_slice()), ("acme", &b"plain text"[..]));
    let late = short.iter().find(|j| j.job_id == late_id).unwrap();
    assert_eq!((late.tenant.as_str(), late.pool), ("slowpoke", Some(Pool::Short)));
    assert!(!short.iter().any(|j| j.payload == br#"{"b":0}"#), "nothing of the invalid batch was produced");
    let medium = common::read_until(
        &cfg,
        &cfg.pool_topic(Pool::Medium),
        Duration::from_secs(30),
        |b, _, _| codec::decode_job(b).ok(),
        |v: &[JobSubmitted]| v.iter().any(|j| j.job_id == id_of(&out[1])),
    )
    .await;
    assert!(medium.iter().any(|j| j.job_id == id_of(&out[1]) && j.job_type == "report"), "{medium:?}");

    // Unknown routes and methods answer JSON; /metrics is not on the API's listener, and
    // on the metrics listener without a recorder it is 404.
    let (s, e) = api.get("/v2/nothing").await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::NOT_FOUND, Some("NO_SUCH_ROUTE")), "{e}");
    let (s, e) = api.get("/v1/jobs").await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::METHOD_NOT_ALLOWED, Some("METHOD_NOT_ALLOWED")), "{e}");
    let (s, e) = api.get("/metrics").await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::NOT_FOUND, Some("NO_SUCH_ROUTE")), "{e}");
    let r = api.http.get(format!("{}/metrics", api.ops)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "METRICS_DISABLED");

    api.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_prometheus_metrics() {
    let cfg = common::arc(common::config(""));
    let handle = api::install_prometheus().expect("the only recorder of this test binary");
    let api = Api::start(&cfg, Some(handle)).await;
    let anonymous = reqwest::Client::new();
    let r = anonymous.get(api.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "health needs no key");
    assert_eq!(r.text().await.unwrap(), "ok");
    let r = anonymous.get(format!("{}/healthz", api.ops)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "the metrics listener serves health too");
    let (s, e) = api.post("/v1/jobs", &job("nobody", "echo", json!({}))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    let (s, _) = api.post("/v1/jobs", &job("acme", "echo", json!({}))).await;
    assert_eq!(s, StatusCode::CREATED);

    let r = anonymous.get(format!("{}/metrics", api.ops)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = r.text().await.unwrap();
    for want in [
        r#"fairway_api_requests_total{route="/healthz",method="GET",status="200"} 1"#,
        r#"route="/v1/jobs",method="POST",status="400""#,
        r#"fairway_api_jobs_submitted_total{pool="short",duplicate="false"}"#,
        "# HELP fairway_api_requests_total",
    ] {
        assert!(text.contains(want), "/metrics lacks {want}:\n{text}");
    }
    api.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn api_keys_authenticate_scope_to_the_tenant_and_revoke_within_seconds() {
    let cfg = common::arc(common::config("[api]\nkey_refresh = \"1s\"\n"));
    let api = tokio::time::timeout(Duration::from_secs(60), Api::start(&cfg, None)).await.expect("API starts");
    let (acme_id, acme_key) = create_key(&cfg, &Caller::Tenant("acme".into())).await;
    let (_, globex_key) = create_key(&cfg, &Caller::Tenant("globex".into())).await;
    let acme = api.as_client(client_with_key(&acme_key));
    let globex = api.as_client(client_with_key(&globex_key));
    let anonymous = api.as_client(reqwest::Client::builder().timeout(Duration::from_secs(40)).build().unwrap());

    // No key, a malformed one, an unknown one, a wrong secret for a known id: 401, JSON
    // naming the header, WWW-Authenticate.
    let body = job("acme", "echo", json!({}));
    let (s, h, e) = anonymous.send(anonymous.http.post(api.url("/v1/jobs")).json(&body)).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("UNAUTHENTICATED")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("Authorization: Bearer"), "{e}");
    assert_eq!(h.get("www-authenticate").unwrap(), "Bearer");
    let unknown = fairway::core::auth::new_key(rand::random()).token;
    let wrong_secret = format!("fwk_{acme_id}_{}", &unknown[unknown.len() - 64..]);
    for bad in [
        "Bearer nonsense".to_string(),
        format!("Basic {acme_key}"),
        format!("Bearer {unknown}"),
        format!("Bearer {wrong_secret}"),
    ] {
        let r = anonymous.http.get(api.url("/v1/jobs/x")).header("authorization", &bad).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{bad}");
    }
    let (s, e) = anonymous.get(&format!("/v1/jobs/{}", uuid::Uuid::now_v7())).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "reads need a key too: {e}");

    // A tenant key submits for its tenant (tenant may be omitted), never for another.
    let (s, a) = acme.post("/v1/jobs", &json!({"job_type": "echo", "payload": {"who": "acme"}})).await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let (s, e) = acme.post("/v1/jobs", &job("globex", "echo", json!({}))).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::FORBIDDEN, Some("FORBIDDEN")), "{e}");
    let (s, e) =
        acme.post("/v1/jobs:batch", &json!([job("acme", "echo", json!({})), job("globex", "echo", json!({}))])).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "a batch with another tenant's job is refused whole: {e}");

    // globex's job: globex reads and cancels it; acme gets exactly the unknown-id answer.
    let (s, g) = globex.post("/v1/jobs", &job("globex", "echo", json!({"who": "globex"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{g}");
    let g_id = id_of(&g);
    // Its `queued` row names its tenant: no separate owner row is written for it.
    let keys = fairway::store::Store::open(&cfg).await.unwrap().key_statements().await.unwrap();
    assert_eq!(keys.owner(&g_id).await.unwrap(), None, "one write per accepted job, not two");
    let (s, c) = globex.delete(&format!("/v1/jobs/{g_id}")).await;
    assert_eq!(s, StatusCode::ACCEPTED, "its own queued job: {c}");
    let (s, st) = globex.get(&format!("/v1/jobs/{g_id}")).await;
    assert_eq!((s, &st["cancel_requested"]), (StatusCode::OK, &json!(true)), "{st}");
    let never = uuid::Uuid::now_v7().to_string();
    let (s_other, e_other) = acme.get(&format!("/v1/jobs/{g_id}")).await;
    let (s_unknown, e_unknown) = acme.get(&format!("/v1/jobs/{never}")).await;
    assert_eq!((s_other, s_unknown), (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND), "{e_other} {e_unknown}");
    assert_eq!(
        e_other["error"].as_str().unwrap().replace(&g_id, "ID"),
        e_unknown["error"].as_str().unwrap().replace(&never, "ID")
    );
    let (s, e) = acme.delete(&format!("/v1/jobs/{g_id}")).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::NOT_FOUND, Some("JOB_NOT_FOUND")), "{e}");
    let (s, e) = acme.delete(&format!("/v1/jobs/{never}")).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "an unknown id is not 'cancelled': {e}");
    let (s, st) = api.get(&format!("/v1/jobs/{g_id}")).await;
    assert_eq!(s, StatusCode::OK, "admin sees every tenant's job: {st}");

    // Revoked: refused within seconds (key_refresh = 1 s).
    let (s, _) = acme.post("/v1/jobs", &json!({"job_type": "echo"})).await;
    assert_eq!(s, StatusCode::CREATED);
    let store = fairway::store::Store::open(&cfg).await.unwrap();
    assert!(store.key_statements().await.unwrap().revoke(&acme_id, fairway::now_ms()).await.unwrap());
    let revoked_at = Instant::now();
    loop {
        let (s, e) = acme.get(&format!("/v1/jobs/{never}")).await;
        if s == StatusCode::UNAUTHORIZED {
            break;
        }
        assert_eq!(s, StatusCode::NOT_FOUND, "{e}");
        assert!(revoked_at.elapsed() < Duration::from_secs(5), "a revoked key still works after 5 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (s, _) = globex.get(&format!("/v1/jobs/{g_id}")).await;
    assert_eq!(s, StatusCode::OK, "other keys keep working");
    api.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_off_treats_every_caller_as_admin() {
    let cfg = common::arc(common::config("[api]\nauth = \"off\"\n"));
    let api = Api::start(&cfg, None).await;
    let anonymous = api.as_client(reqwest::Client::new());
    let (s, a) = anonymous.post("/v1/jobs", &job("globex", "echo", json!({}))).await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    api.shutdown().await;
}

/// Runs `fairway --config <file> <args>`: (exit ok, stdout, stderr), bounded in time.
async fn fairway_cli(config: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_fairway"));
    cmd.arg("--config").arg(config).args(args).env("FAIRWAY_LOG", "warn").kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await.expect("CLI within 60 s").unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_cli_creates_lists_and_revokes() {
    let cfg = common::arc(common::config("[api]\nkey_refresh = \"1s\"\n"));
    let api = Api::start(&cfg, None).await;
    let dir = tempfile::tempdir().unwrap();
    let file = common::config_file(&cfg, "[api]\nkey_refresh = \"1s\"\n", dir.path());

    let (ok, token, note) = fairway_cli(&file, &["keys", "create", "--tenant", "acme", "--label", "ci"]).await;
    assert!(ok, "{note}");
    let token = token.trim().to_string();
    let (id, secret) =
        fairway::core::auth::parse_token(&token).unwrap_or_else(|| panic!("stdout is the key: {token:?}"));
    let (id, secret) = (id.to_string(), secret.to_string());
    assert!(note.contains(&id) && !note.contains(&secret), "the note names the id, never the key: {note}");
    let (ok, _, e) = fairway_cli(&file, &["keys", "create"]).await;
    assert!(!ok && e.contains("--tenant") && e.contains("--admin"), "a role is required: {e}");

    let acme = api.as_client(client_with_key(&token));
    let (s, a) = acme.post("/v1/jobs", &json!({"job_type": "echo"})).await;
    assert_eq!(s, StatusCode::CREATED, "the CLI's key works at once: {a}");

    let (ok, list, e) = fairway_cli(&file, &["keys", "list"]).await;
    assert!(ok, "{e}");
    let line = list.lines().find(|l| l.starts_with(&id)).unwrap_or_else(|| panic!("{id} not listed:\n{list}"));
    assert!(
        line.contains("tenant") && line.contains("acme") && line.contains("active") && line.contains("ci"),
        "{line}"
    );
    assert!(!list.contains(&secret), "list never shows a key");

    let (ok, _, e) = fairway_cli(&file, &["keys", "revoke", &id]).await;
    assert!(ok, "{e}");
    let (ok, _, e) = fairway_cli(&file, &["keys", "revoke", "0000000000000000"]).await;
    assert!(!ok && e.contains("keys list"), "an unknown id is an error saying where ids are: {e}");
    let (ok, list, _) = fairway_cli(&file, &["keys", "list", "--json"]).await;
    assert!(ok);
    let keys: Value = serde_json::from_str(&list).unwrap();
    assert!(keys.as_array().unwrap().iter().any(|k| k["id"] == json!(id) && k["revoked_at"].is_i64()), "{keys}");
    let revoked = Instant::now();
    loop {
        let (s, _) = acme.get(&format!("/v1/jobs/{}", uuid::Uuid::now_v7())).await;
        if s == StatusCode::UNAUTHORIZED {
            break;
        }
        assert!(revoked.elapsed() < Duration::from_secs(5), "the revoked key still works after 5 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    api.shutdown().await;
}

/// A child process killed (by its PID) when dropped.
struct Child(std::process::Child);
impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// GETs `url` until it answers (any status) or `within` passes.
async fn first_answer(http: &reqwest::Client, url: &str, within: Duration) -> reqwest::Response {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(r) = http.get(url).send().await {
            return r;
        }
        assert!(Instant::now() < deadline, "nothing answered {url} within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_and_worker_commands_put_metrics_on_their_own_listeners() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let (api_port, ops_port, worker_port) = (common::free_port(), common::free_port(), common::free_port());
    let file =
        common::config_file(&cfg, &format!("[worker]\nmetrics_listen = \"127.0.0.1:{worker_port}\"\n"), dir.path());
    let _worker = Child(common::spawn_worker(&file, "short"));
    let _serve = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_fairway"))
            .arg("--config")
            .arg(&file)
            .args(["serve", "--listen", &format!("127.0.0.1:{api_port}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{ops_port}")])
            .env("FAIRWAY_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn serve"),
    );
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
    let r = first_answer(&http, &format!("http://127.0.0.1:{api_port}/v1/jobs/x"), Duration::from_secs(60)).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "serve: keys required by default");
    let r = http.get(format!("http://127.0.0.1:{api_port}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND, "serve: no /metrics on the API's address");
    let r = first_answer(&http, &format!("http://127.0.0.1:{ops_port}/metrics"), Duration::from_secs(30)).await;
    assert_eq!(r.status(), StatusCode::OK, "serve: /metrics on --metrics-listen");
    let text = r.text().await.unwrap();
    assert!(text.contains("fairway_api_auth_refused_total 1"), "{text}");
    let r = first_answer(&http, &format!("http://127.0.0.1:{worker_port}/metrics"), Duration::from_secs(60)).await;
    assert_eq!(r.status(), StatusCode::OK, "worker: /metrics on worker.metrics_listen");
}

/// `fairway serve` drains on SIGTERM (a container's stop signal): the open event stream
/// gets a final `shutdown` event and ends, and the process exits on its own, successfully,
/// within its drain grace. Before, SIGTERM was not handled (only Ctrl-C): the process died
/// mid-stream (or, as a container's PID 1, ignored it until SIGKILL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_drains_on_sigterm_and_ends_event_streams_with_a_final_event() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let (api_port, ops_port) = (common::free_port(), common::free_port());
    let file = common::config_file(&cfg, "[api]\nauth = \"off\"\n", dir.path());
    let mut serve = Child(
        std::process::Command::new(env!("CARGO_BIN_EXE_fairway"))
            .arg("--config")
            .arg(&file)
            .args(["serve", "--listen", &format!("127.0.0.1:{api_port}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{ops_port}"), "--drain-grace", "10s"])
            .env("FAIRWAY_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn serve"),
    );
    let http = reqwest::Client::new();
    let r = first_answer(&http, &format!("http://127.0.0.1:{api_port}/healthz"), Duration::from_secs(60)).await;
    assert_eq!(r.status(), StatusCode::OK);
    let mut stream = http.get(format!("http://127.0.0.1:{api_port}/v1/events?follow=1")).send().await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let pid = serve.0.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let body = tokio::time::timeout(Duration::from_secs(30), async {
        let mut body = String::new();
        while let Ok(Some(chunk)) = stream.chunk().await {
            body.push_str(&String::from_utf8_lossy(&chunk));
        }
        body
    })
    .await
    .expect("the event stream ended within 30 s of SIGTERM");
    assert!(body.contains("event: shutdown"), "a final shutdown event: {body:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = serve.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "serve still runs 30 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "serve exits successfully after draining: {status}");
}
