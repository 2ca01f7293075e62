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

/// `tenant`'s events of `kind` (`alert.opened`, `alert.resolved`) for held-work rules.
fn held(got: &Received, tenant: &str, kind: &str) -> Vec<serde_json::Value> {
    events(got, &format!("/{tenant}"))
        .into_iter()
        .filter(|e| e["type"] == kind && e["rule"].as_str().is_some_and(|r| r.starts_with("limit:held:")))
        .collect()
}

/// Waits (`within` at most) for `tenant`'s held-work alert to resolve, then (3 s later,
/// for stragglers) asserts exactly one opening, of `rule`, and one resolution of it.
async fn assert_one_held_alert(got: &Received, tenant: &str, rule: &str, within: Duration) {
    let resolved = wait_for(within, || async { (!held(got, tenant, "alert.resolved").is_empty()).then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = events(got, &format!("/{tenant}"));
    assert!(resolved.is_some(), "{tenant}'s held alert resolved within {within:?}: {all:?}");
    let (opened, closed) = (held(got, tenant, "alert.opened"), held(got, tenant, "alert.resolved"));
    assert_eq!((opened.len(), closed.len()), (1, 1), "one opening, one resolution: {all:?}");
    assert_eq!(opened[0]["rule"], rule);
    assert_eq!(opened[0]["alert_id"], closed[0]["alert_id"]);
}

const SECRET: &str = "it-alerts-secret-0123456789";

/// A test's deployment: `extra` settings, each of `tenants` signing its alerts with
/// [`SECRET`]; its topics and tables made.
async fn deployment(extra: &str, tenants: &[&String]) -> Arc<fairway::config::Config> {
    let mut cfg = config(extra);
    for t in tenants {
        cfg.webhooks.secrets.insert((*t).clone(), fairway::config::Secret::new(SECRET));
    }
    let cfg = arc(cfg);
    init(&cfg).await;
    cfg
}

/// The ledger's leader (alerts, dependency breakers) in this process.
struct Leader {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), fairway::ledger::LedgerError>>,
}

impl Leader {
    /// The leader, once it leads (reads the results, steps the dependency breakers): what
    /// a test does next is seen by it.
    async fn start(cfg: &Arc<fairway::config::Config>) -> Leader {
        let store = fairway::store::Store::open(cfg).await.unwrap();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (leading, mut led) = tokio::sync::watch::channel(false);
        let asked = std::time::Instant::now();
        let task = tokio::spawn(fairway::ledger::run_telling(cfg.clone(), store, stopped, leading));
        let waited = tokio::time::timeout(Duration::from_secs(60), led.wait_for(|l| *l)).await;
        assert!(matches!(waited, Ok(Ok(_))), "the ledger's leader did not lead within 60 s");
        eprintln!("the ledger's leader leads {} ms after its start", asked.elapsed().as_millis());
        Leader { stop, task }
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// A deployment with `extra` settings whose `tenants` each have a webhook under `base`
/// (`<base>/<tenant>`), one worker of the short pool and the ledger's leader running.
struct Watched {
    cfg: Arc<fairway::config::Config>,
    worker: LoggedWorker,
    leader: Leader,
    _dir: tempfile::TempDir,
}

impl Watched {
    async fn start(base: &str, extra: &str, tenants: &[&String]) -> Watched {
        let hooks: String =
            tenants.iter().map(|t| format!("[alerts.tenants.{t}]\nwebhook_url = \"{base}/{t}\"\n")).collect();
        let cfg = deployment(&format!("{extra}{hooks}"), tenants).await;
        let dir = tempfile::tempdir().unwrap();
        let path = config_file(&cfg, extra, dir.path());
        let worker = spawn_logged_worker(&path, "short");
        let leader = Leader::start(&cfg).await;
        Watched { cfg, worker, leader, _dir: dir }
    }

    async fn stop(self) {
        drop(self.worker);
        self.leader.stop().await;
    }
}

/// `tenant`'s console page as its own key sees it (logged in with `key`).
async fn console_page(api: &str, key: &str, tenant: &str) -> String {
    let c = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let r = c.post(format!("{api}/console/login")).form(&[("key", key)]).send().await.unwrap();
    let cookie = r.headers().get("set-cookie").and_then(|v| v.to_str().ok()).expect("a session cookie");
    let cookie = cookie.split(';').next().unwrap().to_string();
    let r = c.get(format!("{api}/console/tenants/{tenant}")).header("cookie", cookie).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    r.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_past_its_wait_rule_gets_one_opened_and_one_resolved_event() {
    let (base, got) = receiver().await;
    let run = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let (slow, calm) = (format!("slow{run}"), format!("calm{run}"));
    let jobs = "[registry]\nunknown_tenants = \"admit\"\n[job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n";
    let extra = format!(
        "{jobs}[alerts]\nperiod = \"1s\"\n\
         [alerts.tenants.{slow}]\nqueue_wait_p99_ms = 1\nfor_periods = 1\nwebhook_url = \"{base}/slow\"\n\
         [alerts.tenants.{calm}]\nwebhook_url = \"{base}/calm\"\n"
    );
    let cfg = deployment(&extra, &[&slow, &calm]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config_file(&cfg, jobs, dir.path());
    // Killed when dropped: a failing assertion never leaves it running.
    let worker = spawn_logged_worker(&path, "short");
    let leader = Leader::start(&cfg).await;

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
        assert!(common::signature_valid(SECRET, sig, body), "a bad signature on {p}");
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
    leader.stop().await;
}

/// The fleet-wide dependency breaker (`core::dependency`): one tenant's jobs failing on
/// `payments` open nothing; a second tenant's failing too opens one breaker for the
/// fleet, published once as `dependency_circuit_open` on the events topic, told to both
/// tenants as a `dependency_circuit:payments` alert; the front door then refuses their
/// `charge` submissions with 503 `CIRCUIT_OPEN` and a `Retry-After` in seconds, while a
/// third tenant whose job type needs the healthy `search` keeps submitting and running.
/// Fails on code without it: `dependencies` and `[dependency_breaker]` are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dependency_failing_for_two_tenants_opens_one_fleet_wide_breaker() {
    use fairway::model::{EventKind, JobEvent};
    let (base, got) = receiver().await;
    let run = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let (pa, pb, pc) = (format!("pa{run}"), format!("pb{run}"), format!("pc{run}"));
    let jobs = "[registry]\nunknown_tenants = \"admit\"\n\
        [job_types.charge]\npool = \"short\"\nhandler = \"flaky\"\ndependencies = [\"payments\"]\n\
        [job_types.index]\npool = \"short\"\nhandler = \"echo\"\ndependencies = [\"search\"]\n\
        [dependency_breaker]\nwindow = \"60s\"\nmin_attempts = 6\ncool_down = \"120s\"\n";
    let hooks: String =
        [&pa, &pb, &pc].iter().map(|t| format!("[alerts.tenants.{t}]\nwebhook_url = \"{base}/{t}\"\n")).collect();
    let cfg = deployment(&format!("{jobs}{hooks}"), &[&pa, &pb, &pc]).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config_file(&cfg, jobs, dir.path());
    let worker = spawn_logged_worker(&path, "short");
    let leader = Leader::start(&cfg).await;
    let failing = |tenant: &str| {
        let mut j = job_record(tenant, "charge");
        j.payload = br#"{"fail_attempts": 1000, "class": "dependency"}"#.to_vec();
        j
    };
    let kinds = |v: &[JobEvent], kind: EventKind| v.iter().filter(|e| e.kind == kind).count();
    let retried_by =
        |v: &[JobEvent], t: &str| v.iter().filter(|e| e.kind == EventKind::Retrying && e.tenant == t).count();
    type Until = Box<dyn Fn(&[JobEvent]) -> bool + Send>;
    let read_events = |until: Until, secs: u64| {
        let cfg = cfg.clone();
        async move {
            read_until(
                &cfg,
                &cfg.events_topic(),
                Duration::from_secs(secs),
                |b, _, _| fairway::codec::decode_event(b).ok(),
                |v| until(v),
            )
            .await
        }
    };

    // One tenant failing alone: its retries pile up, the breaker stays closed.
    let alone: Vec<_> = (0..10).map(|_| failing(&pa)).collect();
    produce_spread(&cfg, &alone, None).await;
    let pa2 = pa.clone();
    let seen = read_events(
        Box::new(move |v| v.iter().filter(|e| e.kind == EventKind::Retrying && e.tenant == pa2).count() >= 10),
        60,
    )
    .await;
    assert!(retried_by(&seen, &pa) >= 10, "tenant {pa}'s failing attempts");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let seen = read_events(Box::new(|_| false), 3).await;
    assert_eq!(kinds(&seen, EventKind::DependencyCircuitOpen), 0, "one tenant's failures opened the breaker");

    // A second tenant failing on the same dependency: one fleet-wide opening.
    let second: Vec<_> = (0..10).map(|_| failing(&pb)).collect();
    produce_spread(&cfg, &second, None).await;
    let opened = read_events(Box::new(move |v| v.iter().any(|e| e.kind == EventKind::DependencyCircuitOpen)), 60).await;
    let open: Vec<&JobEvent> = opened.iter().filter(|e| e.kind == EventKind::DependencyCircuitOpen).collect();
    assert_eq!(open.len(), 1, "one opening: {open:?}");
    assert_eq!(
        (open[0].job_id.as_str(), open[0].job_type.as_str(), open[0].tenant.as_str()),
        ("dependency/payments", "charge", "")
    );
    assert!(open[0].next_attempt_at.is_some_and(|u| u > open[0].at), "{:?}", open[0]);

    // The third tenant's job type needs a healthy dependency: it keeps running.
    let healthy: Vec<_> = (0..10).map(|_| job_record(&pc, "index")).collect();
    produce_spread(&cfg, &healthy, None).await;
    let ids: Vec<String> = healthy.iter().map(|j| j.job_id.clone()).collect();
    let done = results_for(&cfg, &ids, Duration::from_secs(60)).await;
    assert_eq!(done.len(), ids.len(), "tenant {pc}'s jobs ran while payments was held");

    // The front door refuses the held type for its tenants, not the healthy one.
    let (_, ka) = create_key(&cfg, &fairway::core::auth::Caller::Tenant(pa.clone()), "deps").await;
    let (_, kc) = create_key(&cfg, &fairway::core::auth::Caller::Tenant(pc.clone()), "deps").await;
    let (api, stop_api) = serve_api(&cfg).await;
    let http = reqwest::Client::new();
    let post = |key: String, job_type: &'static str| {
        let req = http
            .post(format!("{api}/v1/jobs"))
            .bearer_auth(key)
            .json(&serde_json::json!({"job_type": job_type, "payload": {}}));
        async move {
            let r = req.send().await.unwrap();
            let retry = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
            (r.status().as_u16(), retry, r.json::<serde_json::Value>().await.unwrap_or_default())
        }
    };
    let refused = wait_for(Duration::from_secs(15), || async {
        let (s, retry, body) = post(ka.clone(), "charge").await;
        (s == 503).then_some((retry, body))
    })
    .await
    .expect("the front door refuses charge submissions within 15 s");
    assert_eq!(refused.1["code"], "CIRCUIT_OPEN", "{}", refused.1);
    let secs: u64 = refused.0.as_deref().and_then(|v| v.parse().ok()).expect("Retry-After in seconds");
    assert!((1..=120).contains(&secs), "Retry-After {secs}");
    assert!(
        refused.1["error"].as_str().unwrap_or_default().contains("GMT"),
        "an HTTP-date in the message: {}",
        refused.1
    );
    let (s, _, body) = post(kc.clone(), "index").await;
    assert_eq!(s, 201, "{body}");

    // Both failing tenants are told, once; the healthy one is not.
    let told = wait_for(Duration::from_secs(30), || async {
        (!events(&got, &format!("/{pa}")).is_empty() && !events(&got, &format!("/{pb}")).is_empty()).then_some(())
    })
    .await;
    assert!(told.is_some(), "alerts: {:?} / {:?}", events(&got, &format!("/{pa}")), events(&got, &format!("/{pb}")));
    tokio::time::sleep(Duration::from_secs(3)).await;
    for t in [&pa, &pb] {
        let ev = events(&got, &format!("/{t}"));
        let dep: Vec<_> = ev.iter().filter(|e| e["rule"] == "dependency_circuit:payments").collect();
        assert_eq!(dep.len(), 1, "{t}: {ev:?}");
        assert_eq!(dep[0]["type"], "alert.opened");
    }
    assert!(events(&got, &format!("/{pc}")).iter().all(|e| e["rule"] != "dependency_circuit:payments"));
    let page = console_page(&api, &ka, &pa).await;
    assert!(page.contains("dependency_circuit:payments"), "the breaker's alert is on {pa}'s page");
    assert!(
        page.contains("data-breaker=\"dependency_circuit:payments\" data-state=\"open\""),
        "the breakers table shows it open on {pa}'s page"
    );
    let page_c = console_page(&api, &kc, &pc).await;
    assert!(!page_c.contains("data-breaker=\"dependency_circuit:payments\""), "not on {pc}'s page");
    let seen = read_events(Box::new(|_| false), 3).await;
    assert_eq!(kinds(&seen, EventKind::DependencyCircuitOpen), 1, "still one opening");

    drop(worker);
    let _ = stop_api.send(());
    leader.stop().await;
}

/// Limits are never silent: a tenant pushed to its end user's rate, its own rate and its
/// queue in turn gets one `alert.opened` per limit it neared (80 %) and per limit it hit, each
/// resolved once when its submissions stop, and its console page charts the refusals
/// per hour by code. Another tenant submitting beside it gets none. Fails on code
/// without limit alerts: no such events, and the page has no refusals chart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_pushed_to_each_limit_gets_one_alert_and_one_resolution_per_limit() {
    use serde_json::json;
    let (base, got) = receiver().await;
    let run = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let (hot, calm) = (format!("hot{run}"), format!("calm{run}"));
    let extra = format!(
        "[registry]\nunknown_tenants = \"admit\"\n[job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n\
         [admission.tenant_rate]\nfree = \"6/min\"\n[admission.user_rate]\nfree = \"2/min\"\n\
         [admission.max_queued]\nfree = 7\n\
         [alerts]\nperiod = \"1s\"\nlimit_clear_periods = 3\n\
         [alerts.tenants.{hot}]\nwebhook_url = \"{base}/hot\"\n[alerts.tenants.{calm}]\nwebhook_url = \"{base}/calm\"\n"
    );
    let cfg = deployment(&extra, &[&hot, &calm]).await;
    let leader = Leader::start(&cfg).await;
    let (_, kh) = create_key(&cfg, &fairway::core::auth::Caller::Tenant(hot.clone()), "limits").await;
    let (_, kc) = create_key(&cfg, &fairway::core::auth::Caller::Tenant(calm.clone()), "limits").await;
    let (api, stop_api) = serve_api(&cfg).await;
    let http = reqwest::Client::new();
    let submit = |key: &str, user: &str| {
        let req = http
            .post(format!("{api}/v1/jobs"))
            .bearer_auth(key)
            .json(&json!({"job_type": "echo", "payload": {}, "user_key": user}));
        async move {
            let r = req.send().await.unwrap();
            let s = r.status().as_u16();
            (s, r.json::<serde_json::Value>().await.unwrap_or_default())
        }
    };
    // The end user's rate (2/min): its 2nd is at 100 % of it, its 3rd refused; then the
    // tenant's (6/min): its 5th is past 80 %, its 7th refused; the 6 queued are past 80 %
    // of its queue (7), and a batch of 2 more is refused for it (no worker runs).
    let codes: Vec<(u16, String)> = {
        let mut v = Vec::new();
        for user in ["u1", "u1", "u1", "u2", "u2", "u3", "u3", "u4"] {
            let (s, b) = submit(&kh, user).await;
            v.push((s, b["code"].as_str().unwrap_or_default().to_string()));
        }
        v
    };
    let statuses: Vec<u16> = codes.iter().map(|c| c.0).collect();
    assert_eq!(statuses, [201, 201, 429, 201, 201, 201, 201, 429], "{codes:?}");
    assert_eq!(codes[2].1, "USER_RATE_LIMIT_EXCEEDED");
    assert_eq!(codes[7].1, "TENANT_RATE_LIMIT_EXCEEDED");
    let batch = json!([{"job_type": "echo", "payload": {}, "user_key": "u5"}, {"job_type": "echo", "payload": {}, "user_key": "u6"}]);
    let r = http.post(format!("{api}/v1/jobs:batch")).bearer_auth(&kh).json(&batch).send().await.unwrap();
    let (s, b) = (r.status().as_u16(), r.json::<serde_json::Value>().await.unwrap_or_default());
    assert_eq!((s, b["code"].as_str()), (429, Some("TENANT_QUEUE_FULL")), "{b}");
    assert_eq!(submit(&kc, "c1").await.0, 201, "another tenant is not held");

    let rules = |path: &str, kind: &str| -> Vec<String> {
        let mut v: Vec<String> = events(&got, path)
            .iter()
            .filter(|e| e["type"] == kind)
            .map(|e| e["rule"].as_str().unwrap_or_default().to_string())
            .collect();
        v.sort();
        v
    };
    let want = [
        "limit:near:max_queued:short",
        "limit:near:tenant_rate:short",
        "limit:near:user_rate:short",
        "limit:refused:max_queued:short",
        "limit:refused:tenant_rate:short",
        "limit:refused:user_rate:short",
    ];
    let resolved = wait_for(Duration::from_secs(60), || async {
        (rules("/hot", "alert.resolved").len() >= want.len()).then_some(())
    })
    .await;
    assert!(resolved.is_some(), "all resolved within 60 s: {:?}", events(&got, "/hot"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rules("/hot", "alert.opened"), want, "one opening per limit");
    assert_eq!(rules("/hot", "alert.resolved"), want, "one resolution per limit");
    for (p, sig, body) in got.lock().unwrap().iter() {
        assert!(common::signature_valid(SECRET, sig, body), "a bad signature on {p}");
    }
    assert!(events(&got, "/calm").is_empty(), "the calm tenant got {:?}", events(&got, "/calm"));

    // Its console page charts the refusals of the hour by code.
    let page = console_page(&api, &kh, &hot).await;
    assert!(page.contains("chart-refusals-24h"), "the refusals chart is on the page");
    for code in
        ["refused:user_rate:short", "refused:tenant_rate:short", "near:tenant_rate:short", "refused:max_queued:short"]
    {
        assert!(page.contains(code), "{code} on the page");
    }
    assert!(page.contains("limit:refused:user_rate:short"), "the alerts table lists the limit alerts");

    let _ = stop_api.send(());
    leader.stop().await;
}

/// The dependency breaker's whole course on the engines: two tenants' `charge` jobs fail
/// their first two attempts on `payments` (class `dependency`), which opens one breaker;
/// their held retries run again on trial (failing there re-opens it without a second
/// opening) and then succeed, which closes it. One `dependency_circuit_open` and one
/// `dependency_circuit_closed` on the events topic, one `alert.opened` and one
/// `alert.resolved` (the same alert id) for each failing tenant, and every job ends
/// succeeded in exactly three attempts: a held attempt is put back, not used up. (The
/// type's own per-tenant breaker is kept out of it: `min_requests` beyond the test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dependency_breaker_opens_once_goes_on_trial_and_closes_once() {
    use fairway::model::{EventKind, JobEvent};
    let (base, got) = receiver().await;
    let run = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let (pa, pb) = (format!("ta{run}"), format!("tb{run}"));
    let jobs = "[registry]\nunknown_tenants = \"admit\"\n\
        [job_types.charge]\npool = \"short\"\nhandler = \"flaky\"\ndependencies = [\"payments\"]\n\
        [job_types.charge.breaker]\nmin_requests = 100000\n\
        [dependency_breaker]\nwindow = \"10s\"\nmin_attempts = 6\ncool_down = \"5s\"\n";
    let w = Watched::start(&base, jobs, &[&pa, &pb]).await;
    let cfg = w.cfg.clone();

    let failing: Vec<_> = [&pa, &pb]
        .iter()
        .flat_map(|t| (0..10).map(move |_| *t))
        .map(|t| {
            let mut j = job_record(t, "charge");
            j.payload = br#"{"fail_attempts": 2, "class": "dependency"}"#.to_vec();
            j
        })
        .collect();
    produce_spread(&cfg, &failing, None).await;
    let ids: Vec<String> = failing.iter().map(|j| j.job_id.clone()).collect();
    let results = results_for(&cfg, &ids, Duration::from_secs(120)).await;
    let closed = |v: &[JobEvent]| v.iter().any(|e| e.kind == EventKind::DependencyCircuitClosed);
    let seen = read_until(
        &cfg,
        &cfg.events_topic(),
        Duration::from_secs(60),
        |b, _, _| fairway::codec::decode_event(b).ok(),
        closed,
    )
    .await;
    let course: Vec<EventKind> = seen
        .iter()
        .filter(|e| matches!(e.kind, EventKind::DependencyCircuitOpen | EventKind::DependencyCircuitClosed))
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        course,
        [EventKind::DependencyCircuitOpen, EventKind::DependencyCircuitClosed],
        "one opening, one closing"
    );

    assert_eq!(results.len(), ids.len(), "every job ended");
    for (id, rs) in &results {
        let last = rs.iter().max_by_key(|r| r.attempts).expect("a result");
        assert_eq!((last.status.as_str(), last.attempts), ("succeeded", 3), "job {id}: {last:?}");
    }
    let told = wait_for(Duration::from_secs(30), || async {
        [&pa, &pb].iter().all(|t| events(&got, &format!("/{t}")).len() >= 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for t in [&pa, &pb] {
        let ev = events(&got, &format!("/{t}"));
        assert!(told.is_some(), "{t}: {ev:?}");
        let dep: Vec<_> = ev.iter().filter(|e| e["rule"] == "dependency_circuit:payments").collect();
        let kinds: Vec<&str> = dep.iter().map(|e| e["type"].as_str().unwrap_or_default()).collect();
        assert_eq!(kinds, ["alert.opened", "alert.resolved"], "{t}: {ev:?}");
        assert_eq!(dep[0]["alert_id"], dep[1]["alert_id"], "{t}: one alert");
    }
    w.stop().await;
}

/// A tenant's own breaker reaches that tenant: its `risky` jobs failing with
/// `dependency` open its breaker of the type on the worker, which holds its retries (no
/// attempt used) until a probe passes; the tenant gets one `alert.opened` for the held
/// work (`limit:held:breaker/risky:short`) and one `alert.resolved` once nothing is held
/// any more. Another tenant running the same type beside it is never held and gets no
/// alert. Fails on code without held marks: no such alert.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_own_breaker_holding_its_jobs_opens_one_alert_and_resolves_it() {
    let (base, got) = receiver().await;
    let run = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let (hot, calm) = (format!("hb{run}"), format!("cb{run}"));
    let jobs = "[registry]\nunknown_tenants = \"admit\"\n\
        [job_types.risky]\npool = \"short\"\nhandler = \"flaky\"\n\
        [job_types.risky.breaker]\nwindow = \"30s\"\nmin_requests = 6\ncool_down = \"3s\"\nprobe_timeout = \"5s\"\n\
        [alerts]\nperiod = \"1s\"\nlimit_clear_periods = 3\n";
    let w = Watched::start(&base, jobs, &[&hot, &calm]).await;
    let cfg = w.cfg.clone();

    let job = |t: &str, fail_attempts: u32| {
        let mut j = job_record(t, "risky");
        j.payload = format!(r#"{{"fail_attempts": {fail_attempts}, "class": "dependency"}}"#).into_bytes();
        j
    };
    let all: Vec<_> = (0..8).map(|_| job(&hot, 1)).chain((0..8).map(|_| job(&calm, 0))).collect();
    produce_spread(&cfg, &all, None).await;
    let ids: Vec<String> = all.iter().map(|j| j.job_id.clone()).collect();
    let results = results_for(&cfg, &ids, Duration::from_secs(120)).await;
    assert_eq!(results.len(), ids.len(), "every job ended");
    for (id, rs) in &results {
        let last = rs.iter().max_by_key(|r| r.attempts).expect("a result");
        let want = if last.tenant == hot { 2 } else { 1 };
        assert_eq!((last.status.as_str(), last.attempts), ("succeeded", want), "job {id}: {last:?}");
    }
    assert_one_held_alert(&got, &hot, "limit:held:breaker/risky:short", Duration::from_secs(60)).await;
    assert!(events(&got, &format!("/{calm}")).is_empty(), "{calm} got {:?}", events(&got, &format!("/{calm}")));
    // Its page shows the breaker that held its work, now closed; the other tenant's none.
    let (_, kh) = create_key(&cfg, &fairway::core::auth::Caller::Tenant(hot.clone()), "breaker").await;
    let (_, kc) = create_key(&cfg, &fairway::core::auth::Caller::Tenant(calm.clone()), "breaker").await;
    let (api, stop_api) = serve_api(&cfg).await;
    let page = console_page(&api, &kh, &hot).await;
    assert!(
        page.contains("data-breaker=\"limit:held:breaker/risky:short\" data-state=\"closed\""),
        "the breakers table shows it closed on {hot}'s page"
    );
    assert!(console_page(&api, &kc, &calm).await.contains("none held its work"), "{calm}'s page has none");
    let _ = stop_api.send(());
    w.stop().await;
}

/// A tenant's own concurrency cap and rate reach it too: one tenant capped at one job at
/// a time and another paced at 2 jobs a second each queue more than that; each gets one
/// `alert.opened` for the limit that held its jobs (`limit:held:max_concurrency:short`,
/// `limit:held:rate_per_sec:short`) and one `alert.resolved` once nothing waits at it.
/// A tenant without limits running the same jobs beside them gets none. Fails on code
/// without these marks: no such alerts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_held_at_its_own_cap_or_rate_gets_one_alert_and_one_resolution() {
    let (base, got) = receiver().await;
    let run = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let (capped, paced, free) = (format!("cc{run}"), format!("rp{run}"), format!("fr{run}"));
    let limits = format!(
        "[registry]\nunknown_tenants = \"admit\"\n\
         [tenants.{capped}]\ntier = \"standard\"\nmax_concurrency = 1\n\
         [tenants.{paced}]\ntier = \"standard\"\nrate_per_sec = 2\n\
         [tenants.{free}]\ntier = \"standard\"\n\
         [job_types.nap]\npool = \"short\"\nhandler = \"sleep\"\n\
         [alerts]\nperiod = \"1s\"\nlimit_clear_periods = 3\n"
    );
    let w = Watched::start(&base, &limits, &[&capped, &paced, &free]).await;
    let cfg = w.cfg.clone();

    let nap = |t: &str| {
        let mut j = job_record(t, "nap");
        j.payload = br#"{"ms": 300}"#.to_vec();
        j
    };
    let all: Vec<_> = [&capped, &paced, &free].iter().flat_map(|t| (0..8).map(|_| nap(t))).collect();
    produce_spread(&cfg, &all, None).await;
    let ids: Vec<String> = all.iter().map(|j| j.job_id.clone()).collect();
    let results = results_for(&cfg, &ids, Duration::from_secs(120)).await;
    assert_eq!(results.len(), ids.len(), "every job ended");
    for (t, rule) in [(&capped, "limit:held:max_concurrency:short"), (&paced, "limit:held:rate_per_sec:short")] {
        assert_one_held_alert(&got, t, rule, Duration::from_secs(60)).await;
    }
    assert!(held(&got, &free, "alert.opened").is_empty(), "{free} got {:?}", events(&got, &format!("/{free}")));
    w.stop().await;
}

/// A job type quarantined for one tenant (most of its attempts fail: `worker.poison`)
/// reaches that tenant: its further failures go to the dead letters at once as poison,
/// and it gets one `alert.opened` for the held work (`limit:held:quarantine/shaky:short`)
/// and one `alert.resolved` once the quarantine ends (its failures left the 1-minute
/// window), the poison retry 30 s later included: the alert stays open while the
/// quarantine holds. Another tenant running the same type, whose jobs succeed, is never
/// quarantined and told nothing (the quarantine is per job type and tenant). Fails on
/// code without quarantine marks, and on marks counted per failure (the retry opened the
/// alert a second time).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_type_quarantined_for_a_tenant_gets_that_tenant_one_alert_and_one_resolution() {
    let (base, got) = receiver().await;
    let run = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let (sick, well) = (format!("qs{run}"), format!("qw{run}"));
    let jobs = "[registry]\nunknown_tenants = \"admit\"\n\
        [worker.poison]\nmin_samples = 4\nwindow = \"1m\"\n\
        [job_types.shaky]\npool = \"short\"\nhandler = \"flaky\"\n\
        [alerts]\nperiod = \"1s\"\nlimit_clear_periods = 3\n";
    let w = Watched::start(&base, jobs, &[&sick, &well]).await;
    let cfg = w.cfg.clone();

    let job = |t: &str, fail_attempts: u32| {
        let mut j = job_record(t, "shaky");
        j.payload = format!(r#"{{"fail_attempts": {fail_attempts}}}"#).into_bytes();
        j
    };
    let all: Vec<_> = (0..12).map(|_| job(&sick, 99)).chain((0..8).map(|_| job(&well, 0))).collect();
    produce_spread(&cfg, &all, None).await;
    let ids: Vec<String> = all.iter().map(|j| j.job_id.clone()).collect();
    let results = results_for(&cfg, &ids, Duration::from_secs(120)).await;
    assert_eq!(results.len(), ids.len(), "every job ended");
    let mut poisoned = 0;
    for (id, rs) in &results {
        let last = rs.iter().max_by_key(|r| r.attempts).expect("a result");
        if last.tenant == well {
            assert_eq!(last.status.as_str(), "succeeded", "job {id}: {last:?}");
        } else {
            assert_eq!(last.status.as_str(), "failed", "job {id}: {last:?}");
            poisoned += usize::from(last.attempts < 5);
        }
    }
    assert!(poisoned > 0, "some of {sick}'s jobs were dead-lettered early as poison");
    assert_one_held_alert(&got, &sick, "limit:held:quarantine/shaky:short", Duration::from_secs(180)).await;
    assert!(held(&got, &well, "alert.opened").is_empty(), "{well} got {:?}", events(&got, &format!("/{well}")));
    w.stop().await;
}

/// The recycling cap reaches the tenant whose children keep dying: two `process` jobs of
/// one tenant kill themselves (SIGKILL), which engages the pool's recycling cap for that
/// tenant (`max = 2` a minute); it gets one `alert.opened` for
/// `limit:held:recycling_cap:short` and one `alert.resolved` once the kills left the
/// window. Another tenant's process jobs beside it all succeed and it hears nothing.
/// Fails on code without recycling marks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_at_the_recycling_cap_gets_one_alert_and_one_resolution() {
    let (base, got) = receiver().await;
    let run = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let (bad, good) = (format!("rb{run}"), format!("rg{run}"));
    let extra = format!(
        "[registry]\nunknown_tenants = \"admit\"\n\
         [pools.short]\nrecycling = {{ max = 2, window = \"1m\" }}\n\
         [alerts]\nperiod = \"1s\"\nlimit_clear_periods = 3\n{}{}",
        misbehave("boom", "short", "crash", "retry = { app_error = { max_attempts = 1 } }"),
        misbehave("quick", "short", "noop", ""),
    );
    let w = Watched::start(&base, &extra, &[&bad, &good]).await;
    let cfg = w.cfg.clone();
    let all: Vec<_> =
        (0..2).map(|_| job_record(&bad, "boom")).chain((0..6).map(|_| job_record(&good, "quick"))).collect();
    produce_spread(&cfg, &all, None).await;
    let ids: Vec<String> = all.iter().map(|j| j.job_id.clone()).collect();
    let results = results_for(&cfg, &ids, Duration::from_secs(120)).await;
    assert_eq!(results.len(), ids.len(), "every job ended");
    for (id, rs) in &results {
        let last = &rs[0];
        let want = if last.tenant == good { "succeeded" } else { "failed" };
        assert_eq!(last.status.as_str(), want, "job {id}: {last:?}");
    }
    assert_one_held_alert(&got, &bad, "limit:held:recycling_cap:short", Duration::from_secs(150)).await;
    assert!(held(&got, &good, "alert.opened").is_empty(), "{good} got {:?}", events(&got, &format!("/{good}")));
    w.stop().await;
}

/// The volume rule on the engines (`alerts.baseline = "10s"` so its baseline is known in
/// seconds, not an hour): two tenants finish about 2 jobs a second each for 12 s; then one
/// of them finishes 150 at once, over 10x its own baseline, and gets one `volume`
/// `alert.opened` and, once quiet, one `alert.resolved`; the steady one gets none.
/// Fails on code without the rule, or judging against a baseline shared by tenants.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_past_ten_times_its_own_baseline_gets_one_volume_alert_and_one_resolution() {
    let (base, got) = receiver().await;
    let run = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let (spiky, steady, warm) = (format!("sp{run}"), format!("st{run}"), format!("wu{run}"));
    let extra = "[registry]\nunknown_tenants = \"admit\"\n\
        [job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n\
        [alerts]\nperiod = \"1s\"\nbaseline = \"10s\"\n\
        [alerts.tiers.free]\nfor_periods = 1\nvolume_min_jobs = 20\n\
        off = [\"queue_wait\", \"dead_letters\", \"failure_rate\"]\n";
    let w = Watched::start(&base, extra, &[&spiky, &steady]).await;
    let cfg = w.cfg.clone();
    // The worker runs jobs before the steady phase, so its first jobs do not bunch.
    let first = job_record(&warm, "echo");
    produce_spread(&cfg, std::slice::from_ref(&first), None).await;
    assert_eq!(results_for(&cfg, std::slice::from_ref(&first.job_id), Duration::from_secs(60)).await.len(), 1);

    let paced: Vec<_> = (0..48).map(|i| job_record(if i % 2 == 0 { &spiky } else { &steady }, "echo")).collect();
    produce_spread(&cfg, &paced, Some(Duration::from_millis(250))).await;
    let burst: Vec<_> = (0..150).map(|_| job_record(&spiky, "echo")).collect();
    produce_spread(&cfg, &burst, None).await;
    let ids: Vec<String> = paced.iter().chain(&burst).map(|j| j.job_id.clone()).collect();
    assert_eq!(results_for(&cfg, &ids, Duration::from_secs(60)).await.len(), ids.len(), "every job ended");

    let path = format!("/{spiky}");
    let volume = |kind: &str| -> Vec<serde_json::Value> {
        events(&got, &path).into_iter().filter(|e| e["type"] == kind && e["rule"] == "volume").collect()
    };
    let resolved =
        wait_for(Duration::from_secs(30), || async { (!volume("alert.resolved").is_empty()).then_some(()) }).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = events(&got, &path);
    assert!(resolved.is_some(), "{spiky}'s volume alert resolved within 30 s: {all:?}");
    let (opened, closed) = (volume("alert.opened"), volume("alert.resolved"));
    assert_eq!((opened.len(), closed.len(), all.len()), (1, 1, 2), "one opening, one resolution: {all:?}");
    assert_eq!(opened[0]["alert_id"], closed[0]["alert_id"]);
    let threshold = opened[0]["threshold"].as_f64().unwrap_or(0.0);
    assert!((10.0..=30.0).contains(&threshold), "10x a baseline of about 1-3 jobs a period: {}", opened[0]);
    let calm = events(&got, &format!("/{steady}"));
    assert!(calm.is_empty(), "the steady tenant got {calm:?}");
    w.stop().await;
}
