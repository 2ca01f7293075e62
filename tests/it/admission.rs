//! The front door (`fairway::admission`) on the real broker and CQL database, through
//! the HTTP API and `fairway submit`: the per-tenant queue-depth limit (429
//! TENANT_QUEUE_FULL before anything is written, freed as workers dispatch), the two
//! rate scopes (per end user and per tenant, the tighter wins, Retry-After per scope),
//! and the submission circuit breaker fed by the workers' outcome counts.

use crate::common;

use fairway::config::Config;
use fairway::core::admission::Rate;
use fairway::handlers::Registry;
use fairway::model::Pool;
use fairway::worker::{Policy, Worker};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A running API (auth off) and a client.
struct Api {
    base: String,
    http: reqwest::Client,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Api {
    async fn start(cfg: &Arc<Config>) -> Api {
        common::init(cfg).await;
        let (base, stop) = common::serve_api(cfg).await;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(40)).build().unwrap();
        Api { base, http, stop }
    }

    /// POST a job: (status, Retry-After seconds, body).
    async fn submit(&self, body: &Value) -> (StatusCode, Option<u64>, Value) {
        let path = if body.is_array() { "/v1/jobs:batch" } else { "/v1/jobs" };
        let r = self.http.post(format!("{}{path}", self.base)).json(body).send().await.expect("POST");
        let status = r.status();
        let retry = r.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse().ok());
        (status, retry, r.json().await.unwrap_or(Value::Null))
    }
}

/// A job of `tenant`, for end user `user_key` if given.
fn job(tenant: &str, job_type: &str, user_key: Option<&str>) -> Value {
    let mut j = json!({ "tenant": tenant, "job_type": job_type, "payload": {} });
    if let Some(k) = user_key {
        j["user_key"] = json!(k);
    }
    j
}

fn test_config(extra: &str) -> Config {
    common::config(&format!("[api]\nauth = \"off\"\n{extra}"))
}

/// Jobs of `tenant` on the short pool topic (read for a few seconds).
async fn jobs_on_topic(cfg: &Config, tenant: &str) -> usize {
    let topic = cfg.pool_topic(Pool::Short);
    let all = common::read_until(
        cfg,
        &topic,
        Duration::from_secs(6),
        |b, _, _| fairway::codec::decode_job(b).ok(),
        |_| false,
    )
    .await;
    all.iter().filter(|j| j.tenant == tenant).count()
}

/// Submits `body` every 500 ms until it is accepted (refused meanwhile with `code`), 60 s at most.
async fn until_accepted(api: &Api, body: &Value, code: &str, never: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (s, _, b) = api.submit(body).await;
        if s == StatusCode::CREATED {
            return;
        }
        assert_eq!(b["code"], code, "{b}");
        assert!(Instant::now() < deadline, "{never}: {b}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn fairway_cli(config: &std::path::Path, args: &[&str]) -> (bool, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_fairway"));
    cmd.arg("--config").arg(config).args(args).env("FAIRWAY_LOG", "error").kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), cmd.output()).await.expect("CLI within 90 s").unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_depth_limit_refuses_before_writing_and_frees_as_workers_dispatch() {
    let cfg = common::arc(test_config("[tenants.qtest]\ntier = \"standard\"\nmax_queued = 3\n"));
    let api = Api::start(&cfg).await;

    // No worker: 3 jobs fill the queue; the 4th and a batch of 2 are refused.
    for i in 0..3 {
        let (s, _, b) = api.submit(&job("qtest", "echo", None)).await;
        assert_eq!(s, StatusCode::CREATED, "job {i}: {b}");
    }
    let (s, retry, b) = api.submit(&job("qtest", "echo", None)).await;
    assert_eq!((s, b["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("TENANT_QUEUE_FULL")), "{b}");
    assert_eq!(retry, Some(5), "{b}");
    let msg = b["error"].as_str().unwrap();
    assert!(msg.contains("3 jobs queued") && msg.contains("max_queued = 3") && msg.contains("--max-queued"), "{msg}");
    let (s, _, b) = api.submit(&json!([job("qtest", "echo", None), job("acme", "echo", None)])).await;
    assert_eq!((s, b["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("TENANT_QUEUE_FULL")), "{b}");
    // Other tenants are not affected.
    let (s, _, b) = api.submit(&job("acme", "echo", None)).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");

    // `fairway submit` shares the count (another process, read from the store).
    let dir = tempfile::tempdir().unwrap();
    let file = common::config_file(&cfg, "[job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n", dir.path());
    let (ok, err) = fairway_cli(&file, &["submit", "--tenant", "qtest", "--type", "echo", "--payload", "{}"]).await;
    assert!(!ok && err.contains("TENANT_QUEUE_FULL") && err.contains("max_queued = 3"), "{err}");
    assert_eq!(jobs_on_topic(&cfg, "qtest").await, 3, "nothing was written for the refused submissions");

    // A worker dispatches them: the queue drains and submissions are accepted again.
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    until_accepted(&api, &job("qtest", "echo", None), "TENANT_QUEUE_FULL", "the queue never drained").await;
    let (ok, err) = fairway_cli(&file, &["submit", "--tenant", "qtest", "--type", "echo", "--payload", "{}"]).await;
    assert!(ok, "the CLI is admitted once the queue has room: {err}");
    worker.stop().await;
    let _ = api.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_window_and_tenant_bucket_apply_together_with_retry_after_each() {
    let mut c = test_config("[tenants.rtest]\ntier = \"free\"\n");
    c.admission.user_rate.insert(fairway::config::Tier::Free, "3/min".parse::<Rate>().unwrap());
    c.admission.tenant_rate.insert(fairway::config::Tier::Free, "5/min".parse::<Rate>().unwrap());
    let cfg = common::arc(c);
    let api = Api::start(&cfg).await;

    // End user u1: 3 per minute, the 4th waits for the first to leave the window (~60 s).
    for i in 0..3 {
        let (s, _, b) = api.submit(&job("rtest", "echo", Some("u1"))).await;
        assert_eq!(s, StatusCode::CREATED, "job {i}: {b}");
    }
    let (s, retry, b) = api.submit(&job("rtest", "echo", Some("u1"))).await;
    assert_eq!((s, b["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("USER_RATE_LIMIT_EXCEEDED")), "{b}");
    let retry = retry.expect("Retry-After");
    assert!((50..=60).contains(&retry), "u1's window frees in about a minute: {retry}");
    assert!(b["error"].as_str().unwrap().contains("3/min"), "{b}");

    // Another user of the tenant goes through until the tenant's bucket (5/min) is empty.
    for i in 0..2 {
        let (s, _, b) = api.submit(&job("rtest", "echo", Some("u2"))).await;
        assert_eq!(s, StatusCode::CREATED, "u2 job {i}: {b}");
    }
    let (s, retry, b) = api.submit(&job("rtest", "echo", Some("u3"))).await;
    assert_eq!((s, b["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("TENANT_RATE_LIMIT_EXCEEDED")), "{b}");
    let retry = retry.expect("Retry-After");
    assert!((1..=12).contains(&retry), "one token every 12 s: {retry}");
    assert!(b["error"].as_str().unwrap().contains("5/min"), "{b}");

    // Both refuse u1: the tighter (longer) wait wins.
    let (s, retry, b) = api.submit(&job("rtest", "echo", Some("u1"))).await;
    assert_eq!((s, b["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("USER_RATE_LIMIT_EXCEEDED")), "{b}");
    assert!(retry.unwrap() > 12, "{retry:?}");

    // A bucket token comes back after its Retry-After: u3 is admitted then.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let (s, _, b) = api.submit(&job("rtest", "echo", Some("u3"))).await;
    assert_eq!(s, StatusCode::CREATED, "after the tenant's Retry-After: {b}");
    assert_eq!(jobs_on_topic(&cfg, "rtest").await, 6, "3 of u1, 2 of u2, 1 of u3");
    let _ = api.stop.send(());
}

/// The seed's pattern: batches of 100 jobs sharing the downstream flow key "vectorizer"
/// (flow parallelism 100). The flow key is not an end user: all are admitted at the
/// tier's default per-user window, which applies to `user_key` instead (API and CLI).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_key_shared_by_a_batch_is_not_an_end_user_the_user_window_keys_on_user_key() {
    let mut c = test_config(
        "[tenants.vtest]\ntier = \"standard\"\n[flow.keys.vectorizer]\nparallelism = 100\n\
         [job_types.vec]\npool = \"short\"\nhandler = \"echo\"\n",
    );
    // The tenant's bucket out of the way: this test is about the per-user window
    // (standard's default: 10/min).
    c.admission.tenant_rate.insert(fairway::config::Tier::Standard, "100000/s".parse::<Rate>().unwrap());
    let cfg = common::arc(c);
    let api = Api::start(&cfg).await;

    let vec_job = |user: Option<&str>| {
        let mut j = job("vtest", "vec", user);
        j["flow_key"] = json!("vectorizer");
        j
    };
    for round in 0..2 {
        let batch: Vec<Value> = (0..100).map(|_| vec_job(None)).collect();
        let (s, _, b) = api.submit(&Value::Array(batch)).await;
        assert_eq!(s, StatusCode::CREATED, "batch {round} of 100 with flow_key \"vectorizer\": {b}");
        assert_eq!(b.as_array().map(Vec::len), Some(100), "{b}");
    }

    // End user alice: 10 a minute, whatever the flow key; bob is not affected.
    for i in 0..10 {
        let (s, _, b) = api.submit(&vec_job(Some("alice"))).await;
        assert_eq!(s, StatusCode::CREATED, "alice's job {i}: {b}");
    }
    let (s, retry, b) = api.submit(&vec_job(Some("alice"))).await;
    assert_eq!((s, b["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("USER_RATE_LIMIT_EXCEEDED")), "{b}");
    assert!(retry.is_some_and(|r| r > 1), "{retry:?}");
    let msg = b["error"].as_str().unwrap();
    assert!(msg.contains("\"alice\" (user_key)") && msg.contains("10/min"), "{msg}");
    let (s, _, b) = api.submit(&vec_job(Some("bob"))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, _, b) = api.submit(&vec_job(Some(""))).await;
    assert_eq!((s, b["code"].as_str()), (StatusCode::BAD_REQUEST, Some("BAD_USER_KEY")), "{b}");
    assert!(b["error"].as_str().unwrap().contains("user_key"), "{b}");

    // `fairway submit --user-key` writes it on the record, next to the flow key.
    let dir = tempfile::tempdir().unwrap();
    let extra = "[tenants.vtest]\ntier = \"standard\"\n[job_types.vec]\npool = \"short\"\nhandler = \"echo\"\n";
    let file = common::config_file(&cfg, extra, dir.path());
    let args = ["submit", "--tenant", "vtest", "--type", "vec", "--flow-key", "vectorizer", "--user-key", "carol"];
    let (ok, err) = fairway_cli(&file, &args).await;
    assert!(ok, "{err}");
    let topic = cfg.pool_topic(Pool::Short);
    let jobs = common::read_until(
        &cfg,
        &topic,
        Duration::from_secs(20),
        |b, _, _| fairway::codec::decode_job(b).ok().filter(|j| j.tenant == "vtest"),
        // The batches spread over the partitions (lanes): read until every job is in.
        |got| got.iter().any(|j| j.user_key.as_deref() == Some("carol")) && got.len() >= 212,
    )
    .await;
    let carol = jobs.iter().find(|j| j.user_key.as_deref() == Some("carol")).expect("the CLI's job on the topic");
    assert_eq!(carol.flow_key.as_deref(), Some("vectorizer"));
    let by_user = |u: Option<&str>| jobs.iter().filter(|j| j.user_key.as_deref() == u).count();
    assert_eq!((by_user(None), by_user(Some("alice")), by_user(Some("bob"))), (200, 10, 1));
    let _ = api.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_breaker_opens_on_worker_failures_and_a_successful_probe_closes_it() {
    let c = test_config(
        "[tenants.btest]\ntier = \"enterprise\"\n\
         [job_types.doomed]\npool = \"short\"\nhandler = \"fail\"\n[job_types.doomed.retry.app_error]\nmax_attempts = 1\n\
         [admission.breaker]\nmin_attempts = 5\ncool_down = \"3s\"\n",
    );
    let cfg = common::arc(c);
    let api = Api::start(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();

    // 8 jobs that fail: the short pool's failure rate is 100 % > 20 %.
    let doomed: Vec<Value> = (0..8).map(|_| job("btest", "doomed", None)).collect();
    let (s, _, b) = api.submit(&Value::Array(doomed)).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let (retry, b) = loop {
        let (s, retry, b) = api.submit(&job("btest", "echo", None)).await;
        if s == StatusCode::SERVICE_UNAVAILABLE {
            break (retry, b);
        }
        assert_eq!(s, StatusCode::CREATED, "{b}");
        assert!(Instant::now() < deadline, "the breaker never opened");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(b["code"], "CIRCUIT_OPEN", "{b}");
    assert!((1..=3).contains(&retry.expect("Retry-After")), "{retry:?}");
    assert!(b["error"].as_str().unwrap().contains("pool:short"), "{b}");

    // After the cool-down one probe goes through; the others wait for its verdict.
    tokio::time::sleep(Duration::from_secs(retry.unwrap())).await;
    let (s, _, probe) = api.submit(&job("btest", "echo", None)).await;
    assert_eq!(s, StatusCode::CREATED, "the probe: {probe}");
    let (s, _, b) = api.submit(&job("btest", "echo", None)).await;
    assert_eq!((s, b["code"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("CIRCUIT_OPEN")), "one probe: {b}");
    // The probe succeeds (echo): the breaker closes.
    until_accepted(&api, &job("btest", "echo", None), "CIRCUIT_OPEN", "the probe's success never closed the breaker")
        .await;
    worker.stop().await;
    let _ = api.stop.send(());
}
