//! The live tenants registry on the real services: tenants added, changed, suspended and
//! resumed while a worker runs (no restart), unknown tenants admitted by policy, invalid
//! changes refused with the field named.

use crate::common;

use fairway::config::{Config, Tier};
use fairway::core::tenants::TenantRecord;
use fairway::handlers::Registry;
use fairway::model::{JobStatus, Pool};
use fairway::store::{Store, TenantStatements};
use fairway::submit::Submitter;
use fairway::worker::{Policy, Worker};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ECHO: &str = "[job_types.say]\npool = \"short\"\nhandler = \"echo\"\n";

async fn start(extra: &str) -> (Arc<Config>, Worker, TenantStatements, Submitter) {
    let cfg = common::arc(common::config(&format!("{ECHO}{extra}")));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    assert!(worker.wait_assigned(Duration::from_secs(60)).await, "the worker got no partitions");
    let store = Store::open(&cfg).await.unwrap();
    let stmts = store.tenant_statements().await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    (cfg, worker, stmts, sub)
}

/// Produces one echo job of `tenant` straight to Kafka (as any producer could).
async fn produce(sub: &Submitter, tenant: &str) -> String {
    let rec = common::job_record(tenant, "say");
    sub.produce(&rec).await.expect("produce");
    rec.job_id
}

/// Waits until the worker's registry satisfies `f`; returns how long it took.
async fn until_worker_sees(worker: &Worker, f: impl Fn(&fairway::core::tenants::TenantSet) -> bool) -> Duration {
    let t = Instant::now();
    while !f(&worker.shared[0].tenants.current()) {
        assert!(t.elapsed() < Duration::from_secs(10), "the worker did not see the registry change within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_added_or_changed_while_a_worker_runs_takes_effect_within_seconds() {
    let (cfg, worker, stmts, sub) = start("").await;
    let mut newco = TenantRecord::new("newco", Tier::Standard);
    stmts.add(&newco, fairway::now_ms()).await.unwrap();
    let seen = until_worker_sees(&worker, |s| s.tenants.contains_key("newco")).await;
    assert!(seen <= Duration::from_secs(5), "propagation took {seen:?}");
    eprintln!("registry propagation (add): {seen:?}");
    let id = produce(&sub, "newco").await;
    let results = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(30)).await;
    assert_eq!(results[&id][0].status, JobStatus::Succeeded, "{:?}", results[&id]);

    // A tier change reaches the worker's scheduler.
    newco.tier = Tier::Pro;
    stmts.put(&newco, fairway::now_ms()).await.unwrap();
    let seen = until_worker_sees(&worker, |s| s.tenants.get("newco").is_some_and(|t| t.tier == Tier::Pro)).await;
    eprintln!("registry propagation (set): {seen:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = worker.shared[0].stats.lock().unwrap().clone();
        let tier = stats["tenants"].as_array().and_then(|ts| {
            ts.iter().find(|t| t["tenant"] == "newco").map(|t| t["tier"].as_str().unwrap_or("").to_string())
        });
        if tier.as_deref() == Some("pro") {
            assert!(stats["pool"]["registry_version"].as_i64().unwrap() >= 2, "{}", stats["pool"]);
            break;
        }
        assert!(Instant::now() < deadline, "the scheduler still has newco as {tier:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_suspended_tenants_jobs_wait_and_run_after_resume() {
    let (cfg, worker, stmts, sub) = start("[tenants.holdco]\ntier = \"standard\"\n").await;
    let mut holdco = stmts.list().await.unwrap()["holdco"].clone();
    holdco.suspended = true;
    stmts.put(&holdco, fairway::now_ms()).await.unwrap();
    until_worker_sees(&worker, |s| s.tenants.get("holdco").is_some_and(|t| t.suspended)).await;

    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(produce(&sub, "holdco").await);
    }
    // They reach the worker and wait there, suspended (the scheduler says why).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let stats = worker.shared[0].stats.lock().unwrap().clone();
        let t = stats["tenants"].as_array().and_then(|ts| ts.iter().find(|t| t["tenant"] == "holdco").cloned());
        if let Some(t) = t.filter(|t| t["backlog"]["total"] == 3) {
            assert_eq!(t["wait_reason"]["reason"], "suspended", "{t}");
            assert_eq!(t["running"], 0, "{t}");
            break;
        }
        assert!(Instant::now() < deadline, "the suspended tenant's jobs never showed as queued");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let resumed_at = fairway::now_ms();
    holdco.suspended = false;
    stmts.put(&holdco, fairway::now_ms()).await.unwrap();
    let results = common::results_for(&cfg, &ids, Duration::from_secs(30)).await;
    worker.stop().await;
    for id in &ids {
        let rs = results.get(id).unwrap_or_else(|| panic!("job {id} never ran after resume"));
        assert_eq!(rs[0].status, JobStatus::Succeeded, "{rs:?}");
        assert!(rs[0].started_at.unwrap() >= resumed_at, "a job of the suspended tenant started before the resume");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_tenant_is_admitted_as_the_default_tier_or_dead_lettered_by_policy() {
    let (cfg, worker, stmts, sub) = start("[registry]\nunknown_tenants = \"admit\"\ndefault_tier = \"free\"\n").await;
    let id = produce(&sub, "walkin").await;
    let results = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(30)).await;
    assert_eq!(results[&id][0].status, JobStatus::Succeeded, "{:?}", results[&id]);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(t) = stmts.list().await.unwrap().get("walkin") {
            assert_eq!(t.tier, Tier::Free);
            break;
        }
        assert!(Instant::now() < deadline, "the admitted tenant was not registered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.stop().await;

    // The default policy refuses: the job fails permanently with the fix in its reason.
    let (cfg, worker, _stmts, sub) = start("").await;
    let id = produce(&sub, "stranger").await;
    let results = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(30)).await;
    worker.stop().await;
    let r = &results[&id][0];
    assert_eq!(r.status, JobStatus::Failed);
    assert!(r.error.as_deref().unwrap_or("").contains("fairway tenants add stranger"), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_manages_tenants_and_refuses_invalid_changes_naming_the_field() {
    let cfg = common::config(ECHO);
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(&cfg, ECHO, dir.path());
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fairway"))
            .arg("--config")
            .arg(&path)
            .arg("tenants")
            .args(args)
            .env("FAIRWAY_LOG", "error")
            .output()
            .expect("run fairway tenants");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
    };
    let (ok, out) = cli(&["add", "cli-co", "--tier", "pro", "--max-concurrency", "4", "--label", "team=search"]);
    assert!(ok, "{out}");
    let (ok, out) = cli(&["add", "cli-co", "--tier", "pro"]);
    assert!(!ok && out.contains("already exists"), "{out}");
    let (ok, out) = cli(&["set", "cli-co", "--max-concurrency", "0"]);
    assert!(!ok && out.contains("max_concurrency"), "an invalid change names the field: {out}");
    let (ok, out) = cli(&["set", "cli-co", "--reserved-slots", "2"]);
    assert!(!ok && out.contains("reserved_slots") && out.contains("enterprise"), "{out}");
    let (ok, out) = cli(&["suspend", "cli-co"]);
    assert!(ok, "{out}");
    let (ok, out) = cli(&["list", "--json"]);
    assert!(ok, "{out}");
    let listed: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    let t = listed["tenants"].as_array().unwrap().iter().find(|t| t["name"] == "cli-co").unwrap().clone();
    assert_eq!(
        (t["tier"].as_str(), t["max_concurrency"].as_u64()),
        (Some("pro"), Some(4)),
        "refused changes left no trace"
    );
    assert_eq!(t["suspended"], true);
    assert_eq!(t["labels"]["team"], "search");
    let (ok, out) = cli(&["remove", "cli-co"]);
    assert!(ok, "{out}");
    let (ok, out) = cli(&["remove", "cli-co"]);
    assert!(!ok && out.contains("fairway tenants add cli-co"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_manage_tenants_and_tenant_keys_cannot() {
    use fairway::core::auth::Caller;
    let cfg = common::arc(common::config(ECHO));
    common::init(&cfg).await;
    let state = fairway::api::ApiState::connect(cfg.clone(), None).await.expect("API state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(fairway::api::serve(listener, state, std::future::pending()));
    let store = Store::open(&cfg).await.unwrap();
    let keys = store.key_statements().await.unwrap();
    let client = |caller: Caller| {
        let keys = keys.clone();
        async move {
            let k = fairway::core::auth::new_key(rand::random());
            assert!(keys.insert(&k.id, &k.hash, &caller, Some("it_tenants"), fairway::now_ms()).await.unwrap());
            let mut h = reqwest::header::HeaderMap::new();
            h.insert(reqwest::header::AUTHORIZATION, format!("Bearer {}", k.token).parse().unwrap());
            reqwest::Client::builder().timeout(Duration::from_secs(20)).default_headers(h).build().unwrap()
        }
    };
    let admin = client(Caller::Admin).await;
    let tenant = client(Caller::Tenant("acme".into())).await;
    let url = |p: &str| format!("{base}{p}");

    let r = admin
        .post(url("/v1/admin/tenants"))
        .json(&serde_json::json!({"name": "apico", "tier": "pro", "max_concurrency": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let r = admin.post(url("/v1/admin/tenants")).json(&serde_json::json!({"name": "apico"})).send().await.unwrap();
    assert_eq!(r.status(), 409);
    let r = admin
        .put(url("/v1/admin/tenants/apico"))
        .json(&serde_json::json!({"name": "apico", "tier": "pro", "max_concurrency": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("max_concurrency"), "{body}");
    let r = admin.post(url("/v1/admin/tenants/apico:suspend")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = tenant.get(url("/v1/admin/tenants")).send().await.unwrap();
    assert_eq!(r.status(), 403, "a tenant key is not an admin key");
    let listed: serde_json::Value = admin.get(url("/v1/admin/tenants")).send().await.unwrap().json().await.unwrap();
    let t = listed["tenants"].as_array().unwrap().iter().find(|t| t["name"] == "apico").unwrap().clone();
    assert_eq!((t["max_concurrency"].as_u64(), t["suspended"].as_bool()), (Some(2), Some(true)), "{t}");
    let r = admin.delete(url("/v1/admin/tenants/apico")).send().await.unwrap();
    assert_eq!(r.status(), 204);
    let r = admin.delete(url("/v1/admin/tenants/apico")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    server.abort();
}

/// Reserved slots are checked against the pools' slots when the registry is written (the
/// CLI refuses, naming the tenants and the pool), and registry content that does not fit
/// (written before that check) never stops a worker from starting: it applies what fits.
/// Before, two enterprise tenants with 2 reserved slots each on the 4-slot long pool were
/// accepted, and every worker serving `long` then refused to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_that_do_not_fit_a_pool_are_refused_and_never_stop_a_worker() {
    let extra = format!("{ECHO}[pools.long]\nslots = 4\n");
    let cfg = common::arc(common::config(&extra));
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    let stmts = store.tenant_statements().await.unwrap();
    let ent = |name: &str, r: usize| TenantRecord { reserved_slots: r, ..TenantRecord::new(name, Tier::Enterprise) };
    // As an older version could write them: 2 + 2 of long's 4 slots, none left shared.
    stmts.put(&ent("res-a", 2), fairway::now_ms()).await.unwrap();
    stmts.put(&ent("res-b", 2), fairway::now_ms()).await.unwrap();
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Long], registry, Policy::Fair).await;
    let worker = worker.expect("a worker starts whatever the registry holds");
    worker.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(&cfg, &extra, dir.path());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fairway"))
        .arg("--config")
        .arg(&path)
        .args(["tenants", "add", "res-c", "--tier", "enterprise", "--reserved-slots", "1"])
        .env("FAIRWAY_LOG", "error")
        .output()
        .expect("run fairway tenants");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused: {text}");
    for part in ["reserved_slots", "pool long", "res-a (2)", "res-b (2)", "res-c (1)"] {
        assert!(text.contains(part), "names {part}: {text}");
    }
    assert!(!stmts.list().await.unwrap().contains_key("res-c"), "nothing written");
}

/// A brand-new tenant's first job, reaching a worker whose registry view predates the
/// tenant (here the view is refreshed every 30 s only), runs: the worker reads the
/// registry again on the miss before refusing. Before, it was dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_brand_new_tenants_first_job_runs_on_a_worker_with_an_older_registry_view() {
    let (cfg, worker, stmts, sub) = start("[registry]\npoll_interval = \"30s\"\n").await;
    stmts.put(&TenantRecord::new("newco", Tier::Pro), fairway::now_ms()).await.unwrap();
    let id = produce(&sub, "newco").await;
    let results = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(25)).await;
    worker.stop().await;
    let r = results.get(&id).and_then(|r| r.first()).expect("a result");
    assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
}
