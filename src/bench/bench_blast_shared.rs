//! The blast's attacks on what tenants share behind the API (flow keys, webhook delivery,
//! the breakers), each with tenant B's figure alone and beside tenant A:
//! - **flows**: A parks 60 jobs on its flow key `vectorizer` (2 a second), then B submits
//!   10 jobs with a key of the same name, one every 600 ms (within that limit): B's wait.
//! - **webhooks**: A's 100 results go to a dead receiver (503 to everything), B's 10 to a
//!   live one: how long after submission B's results reached its receiver.
//! - **timeouts**: A submits 20 `sleep` jobs that outlive their 10 s timeout and B one;
//!   25 s later (the breakers judge every second over 10 s buckets) B submits short
//!   `sleep` jobs for 10 s: B's answers (a 503 would be a gate A's timeouts opened for
//!   everyone) and wait, and A's answer.

use super::{b_submits_until_with, quantile, Parties, Served, Server};
use fairway::now_ms;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The flow key of the `flows` attack and its rate (jobs a second).
const FLOW_KEY: &str = "vectorizer";
const FLOW_RATE: u32 = 2;

/// What the attacks add to the configuration, for the worker and `fairway serve` alike:
/// the webhook job types (their receiver at `receiver`) and the flow key's limit.
pub fn config_text(receiver: &str) -> String {
    format!(
        "\n[job_types.hook_dead]\npool = \"short\"\nhandler = \"echo\"\nwebhook_url = \"{receiver}/dead\"\n\
         [job_types.hook_ok]\npool = \"short\"\nhandler = \"echo\"\nwebhook_url = \"{receiver}/ok\"\n\
         [flow.keys.{FLOW_KEY}]\nrate = {FLOW_RATE}\n"
    )
}

/// One webhook POST received: path, job id, the job's submission time, arrival (ms).
type Post = (String, String, i64, i64);

/// Webhook POSTs received.
#[derive(Clone, Default)]
pub struct Received(Arc<Mutex<Vec<Post>>>);

/// A webhook receiver on 127.0.0.1: `/dead` answers 503, `/ok` 200; its base URL.
pub async fn receiver() -> anyhow::Result<(String, Received)> {
    use axum::{extract::State, http::StatusCode, routing::post, Router};
    let got = Received::default();
    let record = |path: &'static str, code: StatusCode| {
        move |State(got): State<Received>, body: axum::body::Bytes| async move {
            let v: Value = serde_json::from_slice(&body).unwrap_or_default();
            let id = v["job_id"].as_str().unwrap_or_default().to_string();
            let submitted = v["submitted_at"].as_i64().unwrap_or_default();
            got.0.lock().expect("received").push((path.into(), id, submitted, now_ms()));
            code
        }
    };
    let app = Router::new()
        .route("/dead", post(record("/dead", StatusCode::SERVICE_UNAVAILABLE)))
        .route("/ok", post(record("/ok", StatusCode::OK)))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((base, got))
}

/// B submits `n` copies of `job`, one every `every`.
async fn b_paced(p: &Parties<'_>, base: &str, job: &Value, n: usize, every: Duration) -> Served {
    let mut s = Served::default();
    for _ in 0..n {
        s.submit(p.b, base, job).await;
        tokio::time::sleep(every).await;
    }
    s
}

pub async fn flows(srv: &Server, p: &Parties<'_>) -> Value {
    let base = srv.base.as_str();
    let job = json!({"job_type": "echo", "flow_key": FLOW_KEY});
    let pace = Duration::from_millis(1_000 * 6 / 5 / u64::from(FLOW_RATE));
    let alone = b_paced(p, base, &job, 10, pace).await;
    let mut a = Served::default();
    for _ in 0..60 {
        a.submit(p.a, base, &job).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let beside = b_paced(p, base, &job, 10, pace).await;
    json!({
        "flow_key_rate_per_s": FLOW_RATE, "a_parked": a.json(),
        "b_alone": p.waits.with_wait(&alone).await, "b_beside": p.waits.with_wait(&beside).await,
    })
}

/// When each of `ids` reached the receiver's `/ok` after its submission (ms), waiting
/// up to 60 s for all.
async fn delivered(got: &Received, ids: &[String]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let delays: Vec<f64> = {
            let g = got.0.lock().expect("received");
            let firsts = ids.iter().filter_map(|id| g.iter().find(|r| r.0 == "/ok" && &r.1 == id));
            firsts.map(|r| (r.3 - r.2) as f64).collect()
        };
        if delays.len() == ids.len() || Instant::now() >= deadline {
            let n = delays.len();
            return json!({"delivered": n, "of": ids.len(), "p50_ms": quantile(delays.clone(), 0.5), "p99_ms": quantile(delays, 0.99)});
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn webhooks(srv: &Server, p: &Parties<'_>, got: &Received) -> Value {
    let base = srv.base.as_str();
    let ok = json!({"job_type": "hook_ok"});
    let alone = b_paced(p, base, &ok, 10, Duration::from_millis(200)).await;
    let alone = delivered(got, &alone.ids).await;
    let mut a = Served::default();
    for _ in 0..100 {
        a.submit(p.a, base, &json!({"job_type": "hook_dead"})).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let beside = b_paced(p, base, &ok, 10, Duration::from_millis(200)).await;
    let beside = delivered(got, &beside.ids).await;
    let dead_posts = got.0.lock().expect("received").iter().filter(|r| r.0 == "/dead").count();
    json!({"a_to_dead_receiver": a.json(), "dead_receiver_posts": dead_posts, "b_alone": alone, "b_beside": beside})
}

pub async fn timeouts(srv: &Server, p: &Parties<'_>) -> Value {
    let base = srv.base.as_str();
    let sleep = |ms: u64| json!({"job_type": "sleep", "payload": {"ms": ms}});
    let alone = b_submits_until_with(p.b, base, &sleep(10), Instant::now() + Duration::from_secs(10)).await;
    let mut a = Served::default();
    for _ in 0..20 {
        a.submit(p.a, base, &sleep(12_000)).await;
    }
    let mut b_timeout = Served::default();
    b_timeout.submit(p.b, base, &sleep(12_000)).await;
    tokio::time::sleep(Duration::from_secs(25)).await;
    let mut a_after = Served::default();
    a_after.submit(p.a, base, &sleep(10)).await;
    let after = b_submits_until_with(p.b, base, &sleep(10), Instant::now() + Duration::from_secs(10)).await;
    json!({
        "a_timing_out": a.json(), "b_timing_out": b_timeout.json(), "a_after": a_after.json(),
        "b_alone": p.waits.with_wait(&alone).await, "b_after": p.waits.with_wait(&after).await,
    })
}
