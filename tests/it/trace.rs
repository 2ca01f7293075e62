//! W3C trace context end to end on the real broker and CQL database: the submitter's
//! `traceparent`/`tracestate` travel in the job record and reach the HTTP executor's
//! request; a submission without one starts a new, valid trace.

use crate::common;

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
    let decode = |p: &[u8]| fairway::codec::decode_result(p).ok().map(|r| r.job_id);
    let headers = trace_headers(&cfg, &cfg.results_topic(), decode, &[&given, &fresh]).await;
    assert_eq!(headers[&given], Some(tp.to_string()));
    assert_eq!(headers[&fresh], Some(generated.to_string()));
    // So do the job records on the pool topic.
    let decode = |p: &[u8]| fairway::codec::decode_job(p).ok().map(|j| j.job_id);
    let headers = trace_headers(&cfg, &cfg.pool_topic(Pool::Short), decode, &[&given]).await;
    assert_eq!(headers[&given], Some(tp.to_string()));
}

/// job id -> `traceparent` header of its record on `topic` (`id` reads a record's job id).
async fn trace_headers(
    cfg: &fairway::config::Config,
    topic: &str,
    id: impl Fn(&[u8]) -> Option<String>,
    ids: &[&String],
) -> HashMap<String, Option<String>> {
    let c = fairway::kafka::reader(cfg, &format!("trace-{}", uuid::Uuid::new_v4()), false).unwrap();
    c.subscribe(&[topic]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut out = HashMap::new();
    while out.len() < ids.len() && std::time::Instant::now() < deadline {
        let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), c.recv()).await else { continue };
        let Some(job_id) = m.payload().and_then(&id) else { continue };
        if ids.contains(&&job_id) {
            let tp = m.headers().and_then(|h| {
                h.iter()
                    .find(|h| h.key == "traceparent")
                    .and_then(|h| h.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            });
            out.insert(job_id, tp);
        }
    }
    out
}

/// Spans received by a local OTLP/HTTP (JSON) collector, flattened.
type Spans = Arc<Mutex<Vec<serde_json::Value>>>;

async fn collect(State(spans): State<Spans>, body: axum::body::Bytes) -> &'static str {
    let v: serde_json::Value = serde_json::from_slice(&body).expect("OTLP JSON");
    let mut out = spans.lock().unwrap();
    for rs in v["resourceSpans"].as_array().into_iter().flatten() {
        for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
            out.extend(ss["spans"].as_array().into_iter().flatten().cloned());
        }
    }
    "{}"
}

fn attr<'a>(span: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    let a = span["attributes"].as_array()?.iter().find(|a| a["key"] == key)?;
    a["value"].as_object()?.values().next()
}

/// With `OTEL_EXPORTER_OTLP_ENDPOINT` set, `fairway submit` and `fairway worker` export a
/// job's spans (send, dispatch wait, process, outcome) in the submitter's trace, with the
/// messaging attributes, and the handler runs under the `process` span.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spans_are_exported_over_otlp() {
    let (seen, spans): (Seen, Spans) = Default::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new()
        .route("/run", post(record).with_state(seen.clone()))
        .route("/v1/traces", post(collect).with_state(spans.clone()));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let extra = format!("[job_types.traced]\npool = \"short\"\nhandler = \"http\"\nurl = \"http://{addr}/run\"\n");
    let cfg = common::arc(common::config(&extra));
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(&cfg, &extra, dir.path());
    let otel = |c: &mut std::process::Command| {
        c.env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .env("OTEL_SERVICE_NAME", "fairway-it");
    };
    let mut worker = std::process::Command::new(env!("CARGO_BIN_EXE_fairway"));
    worker.args(["--config", path.to_str().unwrap(), "worker", "--pools", "short"]).env("FAIRWAY_LOG", "warn");
    otel(&mut worker);
    let mut worker = worker.stdout(std::process::Stdio::null()).spawn().expect("spawn worker");

    let (trace_id, caller_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let mut submit = std::process::Command::new(env!("CARGO_BIN_EXE_fairway"));
    submit
        .args(["--config", path.to_str().unwrap(), "submit", "--tenant", "acme", "--type", "traced"])
        .env("TRACEPARENT", format!("00-{trace_id}-{caller_span}-01"));
    otel(&mut submit);
    let out = submit.output().expect("fairway submit");
    assert!(out.status.success(), "submit: {}", String::from_utf8_lossy(&out.stderr));
    let job_id = String::from_utf8(out.stdout).unwrap().trim().to_string();

    let results = common::results_for(&cfg, std::slice::from_ref(&job_id), Duration::from_secs(90)).await;
    assert_eq!(results.len(), 1, "the job finished: {results:?}");
    let names = ["send", "fairway.dispatch_wait", "process", "fairway.outcome"];
    let find = |spans: &[serde_json::Value], name: &str| {
        spans
            .iter()
            .find(|s| {
                attr(s, "messaging.message.id").and_then(|v| v.as_str()) == Some(job_id.as_str())
                    && s["name"].as_str().is_some_and(|n| n == name || n.starts_with(&format!("{name} ")))
            })
            .cloned()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let got = loop {
        let all = spans.lock().unwrap().clone();
        let got: Vec<_> = names.iter().filter_map(|n| find(&all, n)).collect();
        if got.len() == names.len() || std::time::Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = worker.kill();
    let _ = worker.wait();
    assert_eq!(got.len(), names.len(), "spans of the job: {got:#?}");
    let [send, wait, process, outcome] = [&got[0], &got[1], &got[2], &got[3]];
    for s in &got {
        assert_eq!(s["traceId"].as_str(), Some(trace_id), "every span is in the caller's trace: {s}");
        assert_eq!(attr(s, "messaging.system").and_then(|v| v.as_str()), Some("kafka"), "{s}");
        assert_eq!(attr(s, "fairway.tenant").and_then(|v| v.as_str()), Some("acme"), "{s}");
    }
    let topic = cfg.pool_topic(Pool::Short);
    assert_eq!(send["name"].as_str(), Some(format!("send {topic}").as_str()));
    assert_eq!(send["parentSpanId"].as_str(), Some(caller_span), "send is the caller's child");
    for s in [wait, process, outcome] {
        assert_eq!(s["parentSpanId"], send["spanId"], "worker spans are children of send: {s}");
    }
    assert_eq!(process["name"].as_str(), Some(format!("process {topic}").as_str()));
    assert_eq!(attr(process, "messaging.operation.type").and_then(|v| v.as_str()), Some("process"));
    assert_eq!(attr(process, "messaging.destination.name").and_then(|v| v.as_str()), Some(topic.as_str()));
    assert_eq!(attr(outcome, "fairway.outcome").and_then(|v| v.as_str()), Some("succeeded"));
    // The handler ran under the process span.
    let (handed, _) = seen.lock().unwrap()[&job_id].clone();
    let process_span = process["spanId"].as_str().unwrap();
    assert_eq!(handed, Some(format!("00-{trace_id}-{process_span}-01")), "the handler's traceparent");
}
