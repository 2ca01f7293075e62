//! The operator console in a real headless Chromium (driven over WebDriver by
//! chromedriver) against the real broker and CQL database: the overview updates while
//! jobs run; a dead-lettered job is found, previewed and replayed from the page and then
//! succeeds; a tenant key sees only its tenant and replays its own dead letters only (a dry run first), while an admin suspends
//! a tenant from the tenants page and pauses a tenant's schedule from the schedules page;
//! a tenant's page charts what the usage ledger counted of its jobs (and lists its alerts),
//! and the overview charts the top tenants. Screenshots of each page go to
//! `target/console-screenshots/`.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`scripts/test` installs them);
//! FAIRWAY_CHROMIUM / FAIRWAY_CHROMEDRIVER override their paths.

use crate::common;

use fairway::api::Caller;
use fairway::config::Config;
use fairway::handlers::{Handler, HandlerError, HandlerResult, JobContext, Registry};
use fairway::model::Pool;
use fairway::worker::{Policy, Worker};
use fantoccini::{Client, ClientBuilder, Locator};
use futures::future::BoxFuture;
use futures::FutureExt;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One browser at a time: the machine has two cores.
static BROWSER_LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const EXTRA: &str = "[job_types.gate]\npool = \"short\"\nhandler = \"custom\"\ntimeout = \"5s\"\n";

/// Fails permanently (straight to the DLQ) until its gate opens.
struct Gate(Arc<AtomicBool>);
impl Handler for Gate {
    fn run(&self, ctx: JobContext) -> BoxFuture<'static, HandlerResult> {
        let open = self.0.load(Ordering::SeqCst);
        async move {
            if open {
                Ok(ctx.job.payload.clone())
            } else {
                Err(HandlerError::permanent("gate closed: the downstream ledger refused the order"))
            }
        }
        .boxed()
    }
}

struct Setup {
    cfg: Arc<Config>,
    base: String,
    admin: String,
    http: reqwest::Client,
    gate: Arc<AtomicBool>,
    worker: Worker,
    stop: tokio::sync::oneshot::Sender<()>,
}

async fn create_key(cfg: &Config, caller: &Caller) -> String {
    common::create_key(cfg, caller, "it_console").await.1
}

impl Setup {
    /// The API (with the console) and one worker of the short pool, on fresh topics.
    async fn start() -> Setup {
        Setup::start_with(EXTRA).await
    }

    /// As [`Setup::start`], with `extra` as the test config's additions.
    async fn start_with(extra: &str) -> Setup {
        let cfg = common::arc(common::config(extra));
        common::init(&cfg).await;
        let (base, stop) = common::serve_api(&cfg).await;
        let gate = Arc::new(AtomicBool::new(false));
        let mut custom: HashMap<String, Arc<dyn Handler>> = HashMap::new();
        custom.insert("gate".into(), Arc::new(Gate(gate.clone())));
        let registry = Registry::from_config(&cfg, custom).unwrap();
        let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
        let admin = create_key(&cfg, &Caller::Admin).await;
        Setup { cfg, base, admin, http: reqwest::Client::new(), gate, worker, stop }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Submits jobs through the HTTP API; returns their ids.
    async fn submit(&self, jobs: Value) -> Vec<String> {
        let r = self.http.post(self.url("/v1/jobs:batch")).bearer_auth(&self.admin).json(&jobs).send().await.unwrap();
        assert_eq!(r.status(), reqwest::StatusCode::CREATED);
        let v: Value = r.json().await.unwrap();
        v.as_array().unwrap().iter().map(|j| j["job_id"].as_str().unwrap().to_string()).collect()
    }

    async fn stop(self) {
        self.worker.stop().await;
        let _ = self.stop.send(());
    }
}

/// chromedriver (on a free port) and a headless Chromium session with a fresh profile.
struct Browser {
    driver: std::process::Child,
    client: Option<Client>,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

async fn browser() -> Browser {
    let port = common::free_port();
    let driver_bin = std::env::var("FAIRWAY_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    let driver = std::process::Command::new(&driver_bin)
        .arg(format!("--port={port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {driver_bin} ({e}): install chromium-driver (scripts/test does)"));
    let profile = tempfile::tempdir().unwrap();
    let mut b = Browser { driver, client: None, _profile: profile };
    let chromium = std::env::var("FAIRWAY_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1360,900",
    ];
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.push(format!("--user-data-dir={}", b._profile.path().display()));
    let caps = json!({"goog:chromeOptions": {"binary": chromium, "args": args}});
    let caps = match caps {
        Value::Object(m) => m,
        _ => unreachable!(),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
        {
            Ok(c) => {
                b.client = Some(c);
                return b;
            }
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => panic!("no WebDriver session from chromedriver within 30 s: {e}"),
        }
    }
}

/// Runs `body` with a browser, closing the browser whatever happens.
async fn with_browser<F, Fut>(body: F)
where
    F: FnOnce(Client) -> Fut,
    Fut: Future<Output = ()>,
{
    let _one = BROWSER_LOCK.lock().await;
    let mut b = browser().await;
    let client = b.client.take().unwrap();
    let outcome = std::panic::AssertUnwindSafe(body(client.clone())).catch_unwind().await;
    let _ = client.close().await;
    drop(b);
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

async fn screenshot(c: &Client, name: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let png = c.screenshot().await.expect("screenshot");
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

async fn login(c: &Client, base: &str, key: &str) {
    c.goto(&format!("{base}/console")).await.unwrap();
    // Without a session the console sends the login form.
    let field = c.wait().at_most(Duration::from_secs(20)).for_element(Locator::Css("#key")).await.unwrap();
    field.send_keys(key).await.unwrap();
    c.find(Locator::Css("#login")).await.unwrap().click().await.unwrap();
    c.wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("#pools"))
        .await
        .expect("the overview after login");
}

/// Polls `f` until it yields a value or `timeout` passes (then panics with `what`).
async fn until<T, Fut: Future<Output = Option<T>>>(timeout: Duration, what: &str, mut f: impl FnMut() -> Fut) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn text(c: &Client, css: &str) -> Option<String> {
    c.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

async fn js(c: &Client, script: &str) -> Value {
    c.execute(script, vec![]).await.expect("script")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_overview_updates_while_jobs_run() {
    let setup = Setup::start().await;
    let s = &setup;
    with_browser(|c| async move {
        login(&c, &s.base, &s.admin).await;
        // Nothing ran yet: no throughput.
        let card = "[data-pool=\"short\"]";
        until(Duration::from_secs(60), "the short pool's card", || text(&c, card)).await;
        let t0 = text(&c, &format!("{card} [data-metric=throughput]")).await.unwrap();
        assert_eq!(t0, "0.0", "no job finished yet");
        // 48 two-second jobs on 16 slots: about 6 s of work, seen live on the page.
        let jobs: Vec<Value> = (0..48)
            .map(|i| json!({"tenant": if i % 2 == 0 { "acme" } else { "globex" }, "job_type": "sleep", "payload": {"ms": 2000}}))
            .collect();
        s.submit(Value::Array(jobs)).await;
        let max_running = std::cell::Cell::new(0u64);
        let tput = until(Duration::from_secs(90), "throughput above 0 and running jobs on the overview", || {
            let (c, max_running) = (c.clone(), &max_running);
            async move {
                let running = text(&c, &format!("{card} [data-metric=running]")).await?;
                let n: u64 = running.split('/').next()?.trim().parse().ok()?;
                max_running.set(max_running.get().max(n));
                let t: f64 = text(&c, &format!("{card} [data-metric=throughput]")).await?.parse().ok()?;
                (t > 0.0 && max_running.get() > 0).then_some(t)
            }
        })
        .await;
        assert!(tput > 0.0);
        // A few more seconds of history for the sparklines (and the screenshot).
        tokio::time::sleep(Duration::from_secs(5)).await;
        // The sparkline drew the history it received.
        let points = js(&c, "return document.querySelector('[data-pool=\"short\"] svg.spark polyline').getAttribute('points')").await;
        assert!(points.as_str().is_some_and(|p| p.split(' ').count() >= 2), "sparkline: {points}");
        screenshot(&c, "overview").await;
    })
    .await;
    setup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_lettered_job_is_found_previewed_and_replayed_from_the_page_then_succeeds() {
    let setup = Setup::start().await;
    let s = &setup;
    let id = s.submit(json!([{"tenant": "acme", "job_type": "gate", "payload": {"order": 4242}}])).await.remove(0);
    let dls = common::dead_letters(&s.cfg, 1, Duration::from_secs(60)).await;
    assert!(dls.iter().any(|d| d.job.as_ref().is_some_and(|j| j.job_id == id)), "the job was dead-lettered");
    let id = &id;
    with_browser(|c| async move {
        login(&c, &s.base, &s.admin).await;
        screenshot(&c, "overview-admin").await;
        c.goto(&s.url("/console/dlq?job_type=gate&error=ledger")).await.unwrap();
        let row = format!("tr[data-job=\"{id}\"]");
        let found =
            c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css(&row)).await.expect("the dead letter");
        let html = found.html(false).await.unwrap();
        assert!(html.contains("4242"), "the payload is shown: {html}");
        assert!(html.contains("gate closed"), "the reason/error is shown: {html}");
        // The cause is fixed; select the job, preview, confirm.
        s.gate.store(true, Ordering::SeqCst);
        c.find(Locator::Css(&format!("input.pick[value=\"{id}\"]"))).await.unwrap().click().await.unwrap();
        let rate = c.find(Locator::Css("#rate")).await.unwrap();
        rate.clear().await.unwrap();
        rate.send_keys("5").await.unwrap();
        c.find(Locator::Css("#preview")).await.unwrap().click().await.unwrap();
        let n = until(Duration::from_secs(60), "the dry-run preview", || text(&c, "#would-replay")).await;
        assert_eq!(n, "1", "the preview shows one job to replay");
        let label = text(&c, "#confirm-replay").await.unwrap();
        assert_eq!(label, "Replay 1 job(s) at 5/s");
        screenshot(&c, "dlq").await;
        // Nothing was replayed by the preview.
        let row = s.worker_row(id).await;
        assert_eq!(row.as_deref(), Some("failed"), "still failed after the dry run");
        c.find(Locator::Css("#confirm-replay")).await.unwrap().click().await.unwrap();
        let done = until(Duration::from_secs(60), "the replay's end on the page", || text(&c, "#replay-done")).await;
        assert!(done.contains("1 job(s) replayed"), "{done}");
        screenshot(&c, "dlq-replayed").await;
        until(Duration::from_secs(60), "the replayed job to succeed", || async {
            (s.worker_row(id).await.as_deref() == Some("succeeded")).then_some(())
        })
        .await;
        // Its page shows the new run.
        c.goto(&s.url(&format!("/console/jobs?id={id}"))).await.unwrap();
        let state = until(Duration::from_secs(20), "the job page", || text(&c, "#job-state")).await;
        assert_eq!(state, "succeeded");
        let timeline = text(&c, "#timeline").await.unwrap();
        assert!(timeline.contains("failed") || timeline.contains("dead_lettered"), "{timeline}");
        screenshot(&c, "job").await;
        // The search finds it among the events seen since the console started (the replay's run);
        // the run's result reaches the page's feed on its own topic, so the search is repeated
        // until it has (the store said succeeded before the feed need have it).
        let hit = format!("#jobs a.job[href$=\"{id}\"]");
        let mut rows = String::new();
        for _ in 0..40 {
            c.goto(&s.url("/console/jobs?tenant=acme&job_type=gate")).await.unwrap();
            c.wait()
                .at_most(Duration::from_secs(20))
                .for_element(Locator::Css(&hit))
                .await
                .expect("the job in the search");
            rows = text(&c, "#jobs").await.unwrap();
            if rows.contains("succeeded") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(rows.contains("succeeded"), "the search shows the replayed run's end within 20 s: {rows}");
        screenshot(&c, "jobs").await;
    })
    .await;
    setup.stop().await;
}

impl Setup {
    /// The job's status in the store.
    async fn worker_row(&self, id: &str) -> Option<String> {
        let store = fairway::store::Store::open(&self.cfg).await.ok()?;
        store.job(id).await.ok().flatten()?.status
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_key_sees_only_its_tenant_and_an_admin_suspends_one() {
    let setup = Setup::start().await;
    let s = &setup;
    let ids = s
        .submit(json!([
            {"tenant": "acme", "job_type": "gate", "payload": {"who": "acme"}},
            {"tenant": "globex", "job_type": "gate", "payload": {"who": "globex"}},
        ]))
        .await;
    let (acme_job, globex_job) = (ids[0].clone(), ids[1].clone());
    common::dead_letters(&s.cfg, 2, Duration::from_secs(60)).await;
    let acme = create_key(&s.cfg, &Caller::Tenant("acme".into())).await;
    let (acme, acme_job, globex_job) = (&acme, &acme_job, &globex_job);
    // A yearly schedule each (none fires while the test runs).
    let store = fairway::store::Store::open(&s.cfg).await.unwrap();
    let sch = fairway::ops::schedules::Schedules::connect(s.cfg.clone(), &store).await.unwrap();
    for (tenant, name) in [("acme", "a-yearly"), ("globex", "g-yearly")] {
        let spec = fairway::core::recurring::ScheduleSpec {
            name: name.into(),
            tenant: tenant.into(),
            job_type: "gate".into(),
            cron: Some("0 0 1 1 *".into()),
            ..Default::default()
        };
        sch.add(spec, fairway::now_ms()).await.expect("add schedule");
    }
    let sch = &sch;
    with_browser(|c| async move {
        login(&c, &s.base, acme).await;
        assert_eq!(text(&c, "#who").await.as_deref(), Some("acme"));
        // Tenants: its own row only.
        c.goto(&s.url("/console/tenants")).await.unwrap();
        c.wait().at_most(Duration::from_secs(20)).for_element(Locator::Css("#tenants")).await.unwrap();
        let rows =
            js(&c, "return [...document.querySelectorAll('#tenants tr[data-tenant]')].map(r => r.dataset.tenant)")
                .await;
        assert_eq!(rows, json!(["acme"]), "a tenant key lists its own tenant only");
        assert!(c.find(Locator::Css("button.suspend")).await.is_err(), "no admin actions for a tenant key");
        screenshot(&c, "tenants-as-tenant").await;
        // Schedules: its own, with their next fires, no pause button.
        c.goto(&s.url("/console/schedules")).await.unwrap();
        c.wait().at_most(Duration::from_secs(20)).for_element(Locator::Css("#schedules")).await.unwrap();
        let rows = js(
            &c,
            "return [...document.querySelectorAll('#schedules tr[data-schedule]')].map(r => r.dataset.schedule)",
        )
        .await;
        assert_eq!(rows, json!(["a-yearly"]), "a tenant key lists its own schedules only");
        assert!(c.find(Locator::Css("button.pause-schedule")).await.is_err(), "no schedule actions for a tenant key");
        // DLQ: its own dead letter, not globex's; its replay previews only its own.
        c.goto(&s.url("/console/dlq")).await.unwrap();
        c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("#dlq")).await.unwrap();
        let listed = js(&c, "return [...document.querySelectorAll('#dlq tr[data-job]')].map(r => r.dataset.job)").await;
        assert_eq!(listed, json!([acme_job]), "only acme's dead letter");
        c.find(Locator::Css("#preview")).await.expect("a tenant's replay panel").click().await.unwrap();
        let n = until(Duration::from_secs(60), "the tenant's dry-run preview", || text(&c, "#would-replay")).await;
        assert_eq!(n, "1", "acme's preview counts its own dead letter only");
        // Even asking for globex's in the query shows only its own.
        c.goto(&s.url("/console/dlq?tenant=globex")).await.unwrap();
        c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("#dlq")).await.unwrap();
        let listed = js(&c, "return [...document.querySelectorAll('#dlq tr[data-job]')].map(r => r.dataset.job)").await;
        assert_eq!(listed, json!([acme_job]));
        // Another tenant's job answers like an unknown one.
        c.goto(&s.url(&format!("/console/jobs?id={globex_job}"))).await.unwrap();
        let page = c.source().await.unwrap();
        assert!(page.contains("no state for job"), "globex's job answers like an unknown id");
        assert!(c.find(Locator::Css("#job-id")).await.is_err(), "no job detail");
        assert!(!page.contains("globex"), "nothing of another tenant on the page");
        // Admin actions are refused even with the page's token; a replay naming another
        // tenant is the key's own tenant's.
        let post = |path: &str, body: &str| {
            format!(
                "const done = arguments[0]; fetch('{path}', {{method: 'POST', headers: {{'Content-Type': \
                 'application/json', 'X-CSRF-Token': document.querySelector('meta[name=csrf]').content}}, body: \
                 JSON.stringify({body})}}).then(async r => done([r.status, await r.json()]))"
            )
        };
        let answer = c.execute_async(&post("/console/api/tenants/globex", "{suspended: true}"), vec![]).await.unwrap();
        assert_eq!(answer[0], json!(403), "{answer}");
        let answer =
            c.execute_async(&post("/console/api/replays", "{dry_run: true, tenant: 'globex'}"), vec![]).await.unwrap();
        assert_eq!((&answer[0], &answer[1]["would_replay"]), (&json!(200), &json!(1)), "{answer}");
        // The tenant replays its own dead letter from the page: preview, then confirm. The
        // cause is fixed for both tenants, yet only acme's job runs again.
        s.gate.store(true, Ordering::SeqCst);
        c.goto(&s.url("/console/dlq?job_type=gate")).await.unwrap();
        c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("#dlq")).await.unwrap();
        c.find(Locator::Css("#preview")).await.unwrap().click().await.unwrap();
        let n = until(Duration::from_secs(60), "the tenant's preview before its replay", || text(&c, "#would-replay"))
            .await;
        assert_eq!(n, "1", "acme's preview before its replay");
        screenshot(&c, "dlq-as-tenant").await;
        c.find(Locator::Css("#confirm-replay")).await.expect("a tenant confirms its replay").click().await.unwrap();
        let done = until(Duration::from_secs(60), "the tenant's replay's end", || text(&c, "#replay-done")).await;
        assert!(done.contains("1 job(s) replayed"), "{done}");
        until(Duration::from_secs(60), "acme's replayed job to succeed", || async {
            (s.worker_row(acme_job).await.as_deref() == Some("succeeded")).then_some(())
        })
        .await;
        assert_eq!(s.worker_row(globex_job).await.as_deref(), Some("failed"), "globex's dead letter was not replayed");
        // The overview is the tenant's own.
        c.goto(&s.url("/console")).await.unwrap();
        c.wait().at_most(Duration::from_secs(20)).for_element(Locator::Css("#pools")).await.unwrap();
        assert!(c.source().await.unwrap().contains("Tenant acme"), "the overview is scoped to acme");
    })
    .await;
    // An admin sees both and suspends globex from the tenants page (same path as the API).
    with_browser(|c| async move {
        login(&c, &s.base, &s.admin).await;
        c.goto(&s.url("/console/tenants")).await.unwrap();
        c.wait().at_most(Duration::from_secs(20)).for_element(Locator::Css("#tenants")).await.unwrap();
        let rows =
            js(&c, "return [...document.querySelectorAll('#tenants tr[data-tenant]')].map(r => r.dataset.tenant)")
                .await;
        let rows: Vec<String> = serde_json::from_value(rows).unwrap();
        assert!(rows.contains(&"acme".to_string()) && rows.contains(&"globex".to_string()), "{rows:?}");
        screenshot(&c, "tenants").await;
        c.find(Locator::Css("button.suspend[data-tenant=\"globex\"]")).await.unwrap().click().await.unwrap();
        until(Duration::from_secs(30), "globex suspended in the registry", || async {
            let store = fairway::store::Store::open(&s.cfg).await.ok()?;
            let t = store.tenant_statements().await.ok()?.list().await.ok()?;
            t.get("globex").filter(|g| g.suspended).map(|_| ())
        })
        .await;
        let after = until(Duration::from_secs(20), "the page after the reload", || async {
            let t = text(&c, "#tenants tr[data-tenant=\"globex\"]").await?;
            t.contains("suspended").then_some(t)
        })
        .await;
        assert!(after.contains("Resume"), "{after}");
        // Schedules: every tenant's; pause globex's from the page.
        c.goto(&s.url("/console/schedules")).await.unwrap();
        c.wait().at_most(Duration::from_secs(20)).for_element(Locator::Css("#schedules")).await.unwrap();
        screenshot(&c, "schedules").await;
        let pause = Locator::Css("button.pause-schedule[data-tenant=\"globex\"][data-name=\"g-yearly\"]");
        c.find(pause).await.unwrap().click().await.unwrap();
        until(Duration::from_secs(30), "g-yearly paused in the store", || async {
            sch.get("globex", "g-yearly").await.ok().filter(|g| g.row.paused).map(|_| ())
        })
        .await;
        until(Duration::from_secs(20), "the page after the reload", || async {
            text(&c, "#schedules tr[data-schedule=\"g-yearly\"]").await.filter(|t| t.contains("Resume"))
        })
        .await;
        assert!(!sch.get("acme", "a-yearly").await.unwrap().row.paused, "only the one clicked");
        // The DLQ lists both tenants' dead letters for an admin.
        c.goto(&s.url("/console/dlq?job_type=gate")).await.unwrap();
        c.wait().at_most(Duration::from_secs(30)).for_element(Locator::Css("#dlq")).await.unwrap();
        let listed = js(&c, "return [...document.querySelectorAll('#dlq tr[data-job]')].map(r => r.dataset.job)").await;
        let listed: Vec<String> = serde_json::from_value(listed).unwrap();
        assert!(listed.contains(acme_job) && listed.contains(globex_job), "{listed:?}");
    })
    .await;
    setup.stop().await;
}

/// `GET path` as the admin, as JSON.
async fn admin_get(s: &Setup, path: &str) -> Value {
    s.http.get(s.url(path)).bearer_auth(&s.admin).send().await.unwrap().json().await.unwrap()
}

/// The values (`data-value`) of the marks matching `css`.
async fn mark_values(c: &Client, css: &str) -> Vec<f64> {
    let script = format!("return [...document.querySelectorAll('{css}')].map(e => Number(e.dataset.value))");
    serde_json::from_value(js(c, &script).await).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_page_charts_what_the_ledger_counted_and_the_overview_its_top_tenants() {
    // acme's jobs wait past a 1 ms rule: an alert to list on its page.
    // ...and its end user "u1" may submit one job a minute: a refusal for its page.
    let extra = format!(
        "{EXTRA}[alerts]\nperiod = \"1s\"\n[alerts.tenants.acme]\nqueue_wait_p99_ms = 1\nfor_periods = 1\n\
         [admission.user_rate]\nenterprise = \"1/min\"\n"
    );
    let setup = Setup::start_with(&extra).await;
    let s = &setup;
    let mut jobs: Vec<Value> =
        (0..10).map(|_| json!({"tenant": "acme", "job_type": "sleep", "payload": {"ms": 400}})).collect();
    jobs.extend((0..2).map(|i| json!({"tenant": "acme", "job_type": "gate", "payload": {"n": i}})));
    jobs.extend((0..6).map(|_| json!({"tenant": "globex", "job_type": "sleep", "payload": {"ms": 200}})));
    s.submit(Value::Array(jobs)).await;
    // The ledger's flush (every few seconds) brings every result into the store.
    let (from, to) = (fairway::now_ms() - 3_600_000, fairway::now_ms() + 3_600_000);
    for (tenant, want) in [("acme", 12), ("globex", 6)] {
        let path = format!("/v1/usage?tenant={tenant}&from={from}&to={to}");
        until(Duration::from_secs(90), &format!("{tenant}'s {want} results in the ledger"), || async {
            let v = admin_get(s, &path).await;
            (v["total"]["results"] == json!(want)).then_some(())
        })
        .await;
    }
    until(Duration::from_secs(60), "acme's queue-wait alert", || async {
        let v = admin_get(s, "/v1/alerts?tenant=acme&state=all").await;
        v["alerts"].as_array().filter(|a| !a.is_empty()).map(|_| ())
    })
    .await;
    with_browser(|c| async move {
        login(&c, &s.base, &s.admin).await;
        c.set_window_size(1360, 2200).await.unwrap();
        c.goto(&s.url("/console/tenants/acme")).await.unwrap();
        c.wait().at_most(Duration::from_secs(20)).for_element(Locator::Css("#chart-outcomes-24h")).await.unwrap();
        // Jobs by outcome: 10 succeeded and 2 failed (dead-lettered) this hour.
        let bars = mark_values(&c, "#chart-outcomes-24h rect.bar").await;
        assert_eq!(bars.iter().sum::<f64>(), 12.0, "every result in the bars: {bars:?}");
        assert!(bars.contains(&10.0) && bars.contains(&2.0), "{bars:?}");
        let titles = js(
            &c,
            "return [...document.querySelectorAll('#chart-outcomes-24h rect.bar title')].map(t => t.textContent)",
        )
        .await;
        let titles: Vec<String> = serde_json::from_value(titles).unwrap();
        assert!(titles.iter().any(|t| t.ends_with("failed (dead-lettered): 2 jobs")), "{titles:?}");
        // Its share of the fleet's run time: 10 x 400 ms of 10 x 400 + 6 x 200 ms (plus the gate's).
        let share = mark_values(&c, "#chart-share-24h circle.point").await;
        assert_eq!(share.len(), 48, "24 hours of share and of entitlement");
        let top_share = share[..24].iter().cloned().fold(0.0, f64::max);
        assert!((60.0..=90.0).contains(&top_share), "acme's share {top_share} % ({share:?})");
        let entitled = share[24..].iter().cloned().fold(0.0, f64::max);
        assert!(entitled > 0.0 && entitled <= 100.0, "its entitlement {entitled}");
        // Run time: at least the ten 400 ms sleeps; waits p99 above p50 or equal, both drawn.
        let run = mark_values(&c, "#chart-usage-24h circle.point").await;
        assert!(run.iter().cloned().fold(0.0, f64::max) >= 4.0, "{run:?}");
        let waits = mark_values(&c, "#chart-waits-24h circle.point").await;
        assert!(waits.iter().any(|w| *w > 0.0), "{waits:?}");
        // The 30 days: today holds the same 12 jobs.
        let days = mark_values(&c, "#chart-outcomes-30d rect.bar").await;
        assert_eq!(days.iter().sum::<f64>(), 12.0, "{days:?}");
        // Entitled only on days someone used the fleet: today, not 29 days ago.
        let days_share = mark_values(&c, "#chart-share-30d circle.point").await;
        assert_eq!(days_share.len(), 60, "{days_share:?}");
        assert!(days_share[30] == 0.0 && days_share[59] > 0.0, "{days_share:?}");
        let points = js(&c, "return document.querySelector('#chart-outcomes-30d svg').dataset.points").await;
        assert_eq!(points, json!("30"));
        // Dead letters per job type: the two gate jobs failed for good, no sleep job did.
        let cells = |t: &str| {
            format!(
                "return [...document.querySelectorAll('#dead-letters tr[data-type={t}] td')].map(d => d.textContent)"
            )
        };
        let gate = js(&c, &cells("gate")).await;
        assert_eq!(gate, json!(["gate", "short", "2", "2", "100.0 %", "2", "2", "100.0 %"]), "{gate}");
        let sleep: Vec<String> = serde_json::from_value(js(&c, &cells("sleep")).await).unwrap();
        assert_eq!(sleep[2..5], ["10", "0", "0.0 %"], "{sleep:?}");
        // Its alert is listed.
        let alerts = js(&c, "return [...document.querySelectorAll('#alerts tr[data-alert]')].length").await;
        assert!(alerts.as_u64().is_some_and(|n| n >= 1), "{alerts}");
        assert!(text(&c, "#alerts").await.unwrap().contains("queue_wait"));
        screenshot(&c, "tenant-page").await;
        // Its breakers in their latest state: two alert rows as the ledger's leader writes
        // them (their rules run end to end in it_alerts; here, how the page shows them).
        let alerts = fairway::store::Store::open(&s.cfg).await.unwrap().alert_statements().await.unwrap();
        let now = fairway::now_ms();
        let row = |rule: &str, opened_at: i64, resolved_at: Option<i64>| fairway::store::AlertRow {
            tenant: "acme".into(),
            alert_id: format!("{rule}-{opened_at}"),
            rule: rule.into(),
            opened_at,
            resolved_at,
            value: 1.0,
            threshold: 0.0,
        };
        alerts.opened(&row("dependency_circuit:payments", now - 5_000, None), 3_600).await.unwrap();
        alerts.opened(&row("limit:held:breaker/gate:short", now - 60_000, Some(now - 30_000)), 3_600).await.unwrap();
        c.goto(&s.url("/console/tenants/acme")).await.unwrap();
        let states = js(
            &c,
            "return [...document.querySelectorAll('#breakers tr[data-breaker]')].map(r => r.dataset.breaker + ' ' + r.dataset.state)",
        )
        .await;
        assert_eq!(states, json!(["dependency_circuit:payments open", "limit:held:breaker/gate:short closed"]));
        screenshot(&c, "tenant-page-breakers").await;
        // Its end user past its rate: one admitted, two refused, charted by code once the
        // API process wrote its counts (every 5 s).
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let job = json!({"tenant": "acme", "job_type": "sleep", "payload": {"ms": 1}, "user_key": "u1"});
            let r = s.http.post(s.url("/v1/jobs")).bearer_auth(&s.admin).json(&job).send().await.unwrap();
            statuses.push(r.status().as_u16());
        }
        assert_eq!(statuses, [201, 429, 429]);
        let refused = until(Duration::from_secs(60), "acme's refusals charted", || {
            let c = c.clone();
            async move {
                c.goto(&s.url("/console/tenants/acme")).await.ok()?;
                let bars = mark_values(&c, "#chart-refusals-24h rect.bar").await;
                (bars.iter().sum::<f64>() >= 3.0).then_some(bars)
            }
        })
        .await;
        // Two refused and one near the rate (the admitted one took all of it), at least.
        assert!(refused.iter().sum::<f64>() >= 3.0, "{refused:?}");
        let legend = text(&c, "#chart-refusals-24h").await.unwrap_or_default();
        assert!(legend.contains("refused:user_rate:short"), "{legend}");
        screenshot(&c, "tenant-page-refusals").await;
        // The overview's top tenants: acme first, then globex.
        c.goto(&s.url("/console")).await.unwrap();
        c.wait().at_most(Duration::from_secs(20)).for_element(Locator::Css("#chart-top-tenants")).await.unwrap();
        let top = js(
            &c,
            "return [...document.querySelectorAll('#chart-top-tenants rect.bar title')].map(t => t.textContent)",
        )
        .await;
        let top: Vec<String> = serde_json::from_value(top).unwrap();
        assert_eq!(top.len(), 2, "{top:?}");
        assert!(top[0].starts_with("acme · run time: ") && top[1].starts_with("globex · "), "{top:?}");
        screenshot(&c, "overview-top-tenants").await;
    })
    .await;
    // A tenant key cannot open another tenant's page.
    let globex = create_key(&s.cfg, &Caller::Tenant("globex".into())).await;
    let r = s.http.get(s.url("/console/tenants/acme")).bearer_auth(&globex).send().await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::NOT_FOUND);
    let r = s.http.get(s.url("/console/tenants/globex")).bearer_auth(&globex).send().await.unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    assert!(r.text().await.unwrap().contains("chart-outcomes-24h"));
    setup.stop().await;
}
