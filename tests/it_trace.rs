//! W3C trace context end to end on the real broker and CQL database: the submitter's
//! `traceparent`/`tracestate` travel in the job record and reach the HTTP executor's
//! request; a submission without one starts a new, valid trace.

mod common;

use axum::{extract::State, http::HeaderMap, routing::post, Router};
use fairway::core::trace::check_traceparent;
use fairway::handlers::Registry;
use fairway::model::Pool;
use fairway::submit::{NewJob, Submitter};
use fairway::worker::{Policy, Worker};
use rdkafka::consumer::Consumer;
use rdkafka::message::{Headers, Message};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// job id -> (traceparent, tracestate) headers the executor's request carried.
type Seen = Arc<Mutex<HashMap<String, (Option<String>, Option<String>)>>>;

async fn record(State(seen): State<Seen>, headers: HeaderMap) -> &'static str {
    let text = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
    let id = text("x-fairway-job-id").unwrap_or_default();
    seen.lock().unwrap().insert(id, (text("traceparent"), text("tracestate")));
    "ok"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trace_context_reaches_the_http_handler() {
    let seen: Seen = Default::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/run", post(record)).with_state(seen.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let extra = format!("[job_types.traced]\npool = \"short\"\nhandler = \"http\"\nurl = \"http://{addr}/run\"\n");
    let cfg = common::arc(common::config(&extra));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();

    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let job = |traceparent: Option<&str>, tracestate: Option<&str>| NewJob {
        tenant: "acme".into(),
        job_type: "traced".into(),
        traceparent: traceparent.map(str::to_string),
        tracestate: tracestate.map(str::to_string),
        ..Default::default()
    };
    let given = sub.submit(&job(Some(tp), Some("vendor=opaque"))).await.unwrap().job_id;
    let fresh = sub.submit(&job(None, None)).await.unwrap().job_id;
    // Bad input is refused with the reason, before anything is produced.
    let err = sub.submit(&job(Some("00-bad"), None)).await.unwrap_err().to_string();
    assert!(err.contains("traceparent") && err.contains("expected version-traceid-parentid-flags"), "{err}");

    let results = common::results_for(&cfg, &[given.clone(), fresh.clone()], Duration::from_secs(60)).await;
    worker.stop().await;
    assert_eq!(results.len(), 2, "both jobs finished: {results:?}");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[&given], (Some(tp.to_string()), Some("vendor=opaque".to_string())));
    let (generated, state) = &seen[&fresh];
    let generated = generated.as_deref().expect("a new trace for a job submitted without one");
    assert_eq!(check_traceparent(generated), Ok(()));
    assert_ne!(generated, tp);
    assert_eq!(state, &None);

    // The result records carry the same trace as headers.
    let headers = result_trace_headers(&cfg, &[&given, &fresh]).await;
    assert_eq!(headers[&given], Some(tp.to_string()));
    assert_eq!(headers[&fresh], Some(generated.to_string()));
}

/// job id -> `traceparent` header of its result record.
async fn result_trace_headers(cfg: &fairway::config::Config, ids: &[&String]) -> HashMap<String, Option<String>> {
    let c = fairway::kafka::reader(cfg, &format!("trace-{}", uuid::Uuid::new_v4()), false).unwrap();
    c.subscribe(&[&cfg.results_topic()]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut out = HashMap::new();
    while out.len() < ids.len() && std::time::Instant::now() < deadline {
        let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), c.recv()).await else { continue };
        let Some(r) = m.payload().and_then(|p| fairway::codec::decode_result(p).ok()) else { continue };
        if ids.contains(&&r.job_id) {
            let tp = m.headers().and_then(|h| {
                h.iter()
                    .find(|h| h.key == "traceparent")
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            });
            out.insert(r.job_id, tp);
        }
    }
    out
}
