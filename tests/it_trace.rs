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
}
