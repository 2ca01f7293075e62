//! The observability kit on a real Prometheus (issue 18): `promtool check rules` passes on
//! docker/prometheus/alerts.yml and `promtool check config` on its scrape config; a Prometheus (Debian's `prometheus` package, installed by
//! scripts/test) scrapes a running `fairway worker` and `fairway serve` every second and
//! evaluates those rules while a small workload runs (echo, sleep, flaky and failing jobs
//! of three tenants, echo jobs through the HTTP API);
//! every PromQL expression of the provisioned Grafana dashboard returns data, every alert
//! rule evaluates without error, and the dead-letter alert fires.

use crate::common;

use fairway::codec;
use fairway::kafka;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// A child process of this test, killed (by its PID) when the test ends, however it ends.
struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            self.0.kill().ok();
            self.0.wait().ok();
        }
    }
}

fn tool(name: &str) -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/bin")]) {
        let p = dir.join(name);
        if p.is_file() {
            return p.display().to_string();
        }
    }
    panic!("`{name}` not found: scripts/test installs Debian's prometheus package (apt-get install -y prometheus)");
}

/// The PromQL expressions of the dashboard's panels, with Grafana's `$__rate_interval`
/// resolved for a 1 s scrape interval.
fn dashboard_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo("docker/grafana/dashboards/fairway.json")).expect("dashboard JSON");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("target expr").replace("$__rate_interval", "1m");
            assert!(!expr.contains('$'), "unresolved Grafana variable in {expr}");
            out.push((p["title"].as_str().unwrap_or("?").to_string(), expr));
        }
    }
    out
}

struct Prom {
    http: reqwest::Client,
    base: String,
}

impl Prom {
    async fn get(&self, path: &str, query: &[(&str, &str)]) -> serde_json::Value {
        let r = self.http.get(format!("{}{path}", self.base)).query(query).send().await.expect("prometheus answers");
        r.json().await.expect("prometheus JSON")
    }

    /// `Err` if the expression does not parse or evaluate, else the number of series.
    async fn series(&self, expr: &str) -> Result<usize, String> {
        let v = self.get("/api/v1/query", &[("query", expr)]).await;
        if v["status"] != "success" {
            return Err(format!("{}: {}", v["errorType"], v["error"]));
        }
        Ok(v["data"]["result"].as_array().map(|a| a.len()).unwrap_or(0))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_queries_return_data_and_the_dlq_alert_fires_on_a_real_prometheus() {
    let started = Instant::now();
    let rules = repo("docker/prometheus/alerts.yml");
    let check = Command::new(tool("promtool")).arg("check").arg("rules").arg(&rules).output().expect("promtool");
    assert!(
        check.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    // The shipped scrape config is valid (its rules path pointed at the repository's file).
    let dir = tempfile::tempdir().unwrap();
    let shipped = std::fs::read_to_string(repo("docker/prometheus/prometheus.yml")).unwrap();
    assert!(shipped.contains("/etc/prometheus/alerts.yml"), "compose mounts the rules there");
    let shipped_copy = dir.path().join("shipped.yml");
    std::fs::write(&shipped_copy, shipped.replace("/etc/prometheus/alerts.yml", &rules.display().to_string())).unwrap();
    let check =
        Command::new(tool("promtool")).arg("check").arg("config").arg(&shipped_copy).output().expect("promtool");
    assert!(
        check.status.success(),
        "promtool check config docker/prometheus/prometheus.yml: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    // A worker with its /metrics on a free port: `fail` jobs retry once, then dead-letter.
    let cfg = common::config("");
    common::init(&cfg).await;
    let (metrics_port, api_port, api_metrics_port) = (common::free_port(), common::free_port(), common::free_port());
    let extra = format!(
        "[api]\nauth = \"off\"\n[worker]\nmetrics_listen = \"127.0.0.1:{metrics_port}\"\n\
         [pools.short]\nslots = 4\n\
         [job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n\
         [job_types.sleep]\npool = \"short\"\nhandler = \"sleep\"\n\
         [job_types.flaky]\npool = \"short\"\nhandler = \"flaky\"\n\
         [job_types.fail]\npool = \"short\"\nhandler = \"fail\"\n\
         [job_types.fail.retry.app_error]\ndelays = [\"200ms\"]\nmax_attempts = 2\njitter = 0\n"
    );
    let path = common::config_file(&cfg, &extra, dir.path());
    let _worker = Guard(common::spawn_worker(&path, "short"));
    // The HTTP API (keys off: this test's callers are admins), its /metrics scraped too.
    let _api = Guard(
        Command::new(env!("CARGO_BIN_EXE_fairway"))
            .arg("--config")
            .arg(&path)
            .args(["serve", "--listen", &format!("127.0.0.1:{api_port}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{api_metrics_port}")])
            .env("FAIRWAY_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn fairway serve"),
    );

    // Prometheus: 1 s scrapes and rule evaluations, the shipped rules file as is.
    let prom_port = common::free_port();
    let prom_yml = dir.path().join("prometheus.yml");
    std::fs::write(
        &prom_yml,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: fairway-workers\n    static_configs:\n      - targets: [\"127.0.0.1:{metrics_port}\"]\n\
             \x20 - job_name: fairway-api\n    static_configs:\n      - targets: [\"127.0.0.1:{api_metrics_port}\"]\n",
            rules.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let _prom = Guard(
        Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", prom_yml.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn prometheus"),
    );
    let prom = Prom {
        http: reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap(),
        base: format!("http://127.0.0.1:{prom_port}"),
    };
    let ready_by = Instant::now() + Duration::from_secs(30);
    loop {
        match prom.http.get(format!("{}/-/ready", prom.base)).send().await {
            Ok(r) if r.status().is_success() => break,
            _ => assert!(Instant::now() < ready_by, "prometheus not ready within 30 s (see its log)"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The workload, until the checks pass (or time out): every 500 ms a few quick jobs,
    // sleeps that keep the 4 slots busy and a queue waiting, a flaky job (a retry) and a
    // failing one (a retry, then a dead letter) for three tenants of three tiers, and an
    // echo job through the HTTP API (refused until the API is up: that is not a failure).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (cfg, stop) = (cfg.clone(), stop.clone());
        tokio::spawn(async move {
            let producer = kafka::producer(&cfg).unwrap();
            let topic = cfg.pool_topic(fairway::model::Pool::Short);
            let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().unwrap();
            let api = format!("http://127.0.0.1:{api_port}/v1/jobs");
            let mut round = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for (tenant, job_type, payload) in [
                    ("acme", "echo", "{}"),
                    ("globex", "echo", "{}"),
                    ("initech", "echo", "{}"),
                    ("acme", "sleep", "{\"ms\":400}"),
                    ("globex", "sleep", "{\"ms\":400}"),
                    ("initech", "sleep", "{\"ms\":400}"),
                    ("globex", "flaky", "{\"fail_attempts\":1}"),
                    ("initech", "fail", "{}"),
                ] {
                    let mut job = common::job_record(tenant, job_type);
                    job.payload = payload.as_bytes().to_vec();
                    kafka::send(&producer, &topic, tenant, &codec::encode_job(&job).unwrap()).await.expect("produce");
                }
                let body = serde_json::json!({"tenant": "acme", "job_type": "echo", "payload": {"via": "api"}});
                let _ = http.post(&api).json(&body).send().await;
                round += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            round
        })
    };

    // Every dashboard expression must return data, every rule must evaluate, and the DLQ
    // alert must fire: polled once a second, 75 s at most.
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 20, "the dashboard has its panels ({} expressions)", exprs.len());
    let deadline = Instant::now() + Duration::from_secs(75);
    let (mut empty, mut rules_bad, mut firing): (Vec<String>, Vec<String>, BTreeSet<String>);
    loop {
        empty = Vec::new();
        for (title, expr) in &exprs {
            match prom.series(expr).await {
                Ok(0) => empty.push(format!("{title}: {expr}")),
                Ok(_) => {}
                Err(e) => panic!("dashboard panel {title:?}: {expr} does not evaluate: {e}"),
            }
        }
        let rules_now = prom.get("/api/v1/rules", &[]).await;
        rules_bad = Vec::new();
        let mut n_rules = 0;
        for g in rules_now["data"]["groups"].as_array().into_iter().flatten() {
            for r in g["rules"].as_array().into_iter().flatten() {
                n_rules += 1;
                if r["health"] != "ok" {
                    rules_bad.push(format!("{} ({}): {}", r["name"], r["health"], r["lastError"]));
                }
            }
        }
        if n_rules < 6 {
            rules_bad.push(format!("{n_rules} rules loaded, expected 6"));
        }
        let alerts = prom.get("/api/v1/alerts", &[]).await;
        firing = alerts["data"]["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["state"] == "firing")
            .map(|a| {
                format!("{}{{job_type={}}}", a["labels"]["alertname"].as_str().unwrap_or("?"), a["labels"]["job_type"])
            })
            .collect();
        let dlq_firing = firing.contains("FairwayDeadLetterGrowth{job_type=\"fail\"}");
        for job in ["fairway-workers", "fairway-api"] {
            if prom.series(&format!("up{{job=\"{job}\"}} == 1")).await != Ok(1) {
                empty.push(format!("target {job} is not up"));
            }
        }
        // The lag gauge reports records waiting (the queued sleeps hold commits back),
        // not only zeros.
        if prom.series("max_over_time(fairway_consumer_lag[5m]) > 0").await != Ok(1) {
            empty.push("fairway_consumer_lag never above 0".into());
        }
        if prom.series("max_over_time(fairway_consumer_lag_seconds[5m]) > 0").await != Ok(1) {
            empty.push("fairway_consumer_lag_seconds never above 0".into());
        }
        if empty.is_empty() && rules_bad.is_empty() && dlq_firing {
            break;
        }
        if started.elapsed().as_secs().is_multiple_of(5) {
            let dl = prom.get("/api/v1/query", &[("query", "sum by (class) (fairway_dead_letters_total)")]).await;
            let rt = prom.get("/api/v1/query", &[("query", "sum by (class) (fairway_retries_total)")]).await;
            eprintln!(
                "{:?}: waiting for {empty:?}, rules not ok {rules_bad:?}, firing {firing:?} DL {} RT {}",
                started.elapsed(),
                dl["data"]["result"],
                rt["data"]["result"]
            );
        }
        if Instant::now() > deadline {
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            let plog = std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
            let tail: Vec<&str> = plog.lines().rev().take(15).collect();
            panic!(
                "after {:?}: dashboard expressions without data: {empty:#?}\nrules not ok: {rules_bad:#?}\n\
                 firing: {firing:?} (want FairwayDeadLetterGrowth for job_type fail)\nprometheus log (last lines, newest first): {tail:#?}",
                started.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let rounds = load.await.unwrap();

    // Every alert expression parses and evaluates on its own as well (the rules API says
    // so for the group; this also covers expressions that are empty while all is well).
    let rules_text = std::fs::read_to_string(&rules).unwrap();
    let mut checked = 0;
    for block in rules_text.split("expr:").skip(1) {
        let expr = alert_expr(block);
        prom.series(&expr).await.unwrap_or_else(|e| panic!("alert expression {expr:?}: {e}"));
        checked += 1;
    }
    assert_eq!(checked, 6, "every alert rule's expression was queried");
    // The checker itself can fail: a metric no one exports returns nothing.
    assert_eq!(prom.series("fairway_no_such_metric").await, Ok(0));
    assert!(prom.series("sum by (pool (fairway_jobs_queued)").await.is_err(), "a broken expression is an error");
    let peak = prom.get("/api/v1/query", &[("query", "max(max_over_time(fairway_consumer_lag[5m]))")]).await;
    eprintln!(
        "{} dashboard expressions with data, 6 rules ok, firing {firing:?}, peak consumer lag {}, {rounds} workload rounds, {:?}",
        exprs.len(),
        peak["data"]["result"][0]["value"][1],
        started.elapsed()
    );
}

/// The expression after an `expr:` key of the rules file: the rest of the line, or the
/// indented lines of a `|` block.
fn alert_expr(after_key: &str) -> String {
    let mut lines = after_key.lines();
    let first = lines.next().unwrap_or("").trim();
    if first != "|" {
        return first.to_string();
    }
    lines
        .take_while(|l| !l.trim().is_empty() && l.starts_with("          "))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}
