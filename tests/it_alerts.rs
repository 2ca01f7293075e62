//! Tenant-facing alerts end to end: a tenant whose jobs wait past its queue-wait rule (a
//! 1 ms threshold, 1 s periods, set per tenant in `[alerts.tenants.<name>]`) gets exactly
//! one signed `alert.opened` event on its webhook and, once its jobs stop (empty periods
//! are clear), exactly one `alert.resolved` with the same alert id; a tenant on the
//! defaults with the same jobs gets none; `GET /v1/alerts` shows the alert. Fails on code
//! without alerts: `[alerts]` is refused and nothing is ever POSTed.

mod common;

use common::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Received = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

async fn receiver() -> (String, Received) {
    use axum::{extract::State, http::HeaderMap, http::Uri};
    let got: Received = Default::default();
    let handler = |State(got): State<Received>, uri: Uri, h: HeaderMap, body: axum::body::Bytes| async move {
        let sig = h.get("fairway-signature").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        got.lock().unwrap().push((uri.path().to_string(), sig, body.to_vec()));
        axum::http::StatusCode::OK
    };
    let app = axum::Router::new().fallback(axum::routing::post(handler)).with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), got)
}

fn events(got: &Received, path: &str) -> Vec<serde_json::Value> {
    got.lock()
        .unwrap()
        .iter()
        .filter(|(p, _, _)| p == path)
        .map(|(_, _, b)| serde_json::from_slice(b).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_past_its_wait_rule_gets_one_opened_and_one_resolved_event() {
    let (base, got) = receiver().await;
    let run = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let (slow, calm) = (format!("slow{run}"), format!("calm{run}"));
    let secret = "it-alerts-secret-0123456789";
    let jobs = "[registry]\nunknown_tenants = \"admit\"\n[job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n";
    let extra = format!(
        "{jobs}[alerts]\nperiod = \"1s\"\n\
         [alerts.tenants.{slow}]\nqueue_wait_p99_ms = 1\nfor_periods = 1\nwebhook_url = \"{base}/slow\"\n\
         [alerts.tenants.{calm}]\nwebhook_url = \"{base}/calm\"\n"
    );
    let mut cfg = config(&extra);
    for t in [&slow, &calm] {
        cfg.webhooks.secrets.insert(t.clone(), fairway::config::Secret::new(secret));
    }
    let cfg = arc(cfg);
    init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config_file(&cfg, jobs, dir.path());
    // Killed when dropped: a failing assertion never leaves it running.
    let worker = spawn_logged_worker(&path, "short");
    let store = fairway::store::Store::open(&cfg).await.unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let leader = tokio::spawn(fairway::ledger::run(cfg.clone(), store.clone(), stopped));

    let all: Vec<_> = (0..10).map(|i| job_record(if i % 2 == 0 { &slow } else { &calm }, "echo")).collect();
    produce_spread(&cfg, &all, None).await;
    let ids: Vec<String> = all.iter().map(|j| j.job_id.clone()).collect();
    assert_eq!(results_for(&cfg, &ids, Duration::from_secs(60)).await.len(), ids.len());

    let resolved = wait_for(Duration::from_secs(60), || async {
        events(&got, "/slow").iter().any(|e| e["type"] == "alert.resolved").then_some(())
    })
    .await;
    drop(worker);
    assert!(resolved.is_some(), "no alert.resolved within 60 s; got {:?}", events(&got, "/slow"));
    // Periods go on: still one event each.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let slow_events = events(&got, "/slow");
    let kinds: Vec<_> = slow_events.iter().map(|e| e["type"].as_str().unwrap().to_string()).collect();
    assert_eq!(kinds, ["alert.opened", "alert.resolved"], "{slow_events:?}");
    assert_eq!(slow_events[0]["alert_id"], slow_events[1]["alert_id"]);
    assert_eq!(slow_events[0]["rule"], "queue_wait");
    for (p, sig, body) in got.lock().unwrap().iter() {
        assert!(common::signature_valid(secret, sig, body), "a bad signature on {p}");
    }
    assert!(events(&got, "/calm").is_empty(), "the tenant without a breach got events");

    let (_, token) = create_key(&cfg, &fairway::core::auth::Caller::Tenant(slow.clone()), "alerts").await;
    let (api, stop_api) = serve_api(&cfg).await;
    let http = reqwest::Client::new();
    let body: serde_json::Value = http
        .get(format!("{api}/v1/alerts?state=all"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    let alerts = body["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{body}");
    assert_eq!(alerts[0]["alert_id"], slow_events[0]["alert_id"]);
    assert!(alerts[0]["resolved_at"].is_i64(), "{body}");
    let open: serde_json::Value =
        http.get(format!("{api}/v1/alerts")).bearer_auth(&token).send().await.unwrap().json().await.unwrap();
    assert_eq!(open["alerts"].as_array().map(Vec::len), Some(0), "{open}");

    let _ = stop_api.send(());
    stop.send(true).unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(10), leader).await;
}
