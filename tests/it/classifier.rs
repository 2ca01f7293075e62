//! The pool classifier (`fairway::classifier`, issue 16 item 4) on the real broker and
//! CQL database: a job type configured in the short pool whose jobs of tenant acme run
//! longer than the short pool's range (`max_run = "1s"` here, 1.5 s sleeps) is moved to
//! the medium pool for acme by the classifier's leader in a `fairway worker` process,
//! while tenant globex's quick jobs of the same type stay in short (issue 34: judged per
//! tenant); acme's next submission of that
//! type (`fairway submit` in its own process, and the HTTP API) goes to the medium pool
//! topic and runs there; the worker's metrics show the violations and the move; the
//! `pool_reclassified` event is on the events topic; an explicit pool still wins; a
//! replayed dead letter of the type goes to medium unless its record names another pool
//! than the configured one.

use crate::common;

use fairway::config::Config;
use fairway::core::replay::{ReplayFilter, ReplaySource};
use fairway::model::{DeadLetter, EventKind, FailureClass, JobResult, JobSubmitted, Pool};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TYPE: &str = "[job_types.slowpoke]\npool = \"short\"\nhandler = \"sleep\"\ntimeout = \"30s\"\n";
/// Short window and sample count so the test runs in well under a minute.
const CLASSIFIER: &str = "[pools.short]\nmax_run = \"1s\"\n\
                          [classifier]\nwindow = \"30s\"\nmin_runs = 6\ninterval = \"1s\"\ncache = \"500ms\"\n";

/// A child process killed when the test ends, also when it fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `fairway submit` in its own process (NDJSON lines); the job ids it printed.
fn submit_cli(config: &std::path::Path, lines: &[String], extra_args: &[&str]) -> Vec<String> {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fairway"))
        .args(["--config", config.to_str().unwrap(), "submit", "--ndjson", "-"])
        .args(extra_args)
        .env("FAIRWAY_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn fairway submit");
    child.stdin.take().unwrap().write_all(lines.join("\n").as_bytes()).unwrap();
    let out = child.wait_with_output().expect("fairway submit");
    assert!(out.status.success(), "fairway submit failed");
    String::from_utf8(out.stdout).unwrap().lines().map(|l| l.trim().to_string()).collect()
}

fn job_line(ms: u64, pool: Option<&str>) -> String {
    tenant_line("acme", ms, pool)
}

fn tenant_line(tenant: &str, ms: u64, pool: Option<&str>) -> String {
    let mut j = serde_json::json!({ "tenant": tenant, "job_type": "slowpoke", "payload": { "ms": ms } });
    if let Some(p) = pool {
        j["pool"] = p.into();
    }
    j.to_string()
}

/// A dead letter of a slowpoke job whose record names `pool`, on the DLQ topic.
async fn dead_letter(cfg: &Config, pool: Pool) -> String {
    let job = JobSubmitted {
        pool: Some(pool),
        ..JobSubmitted::original(uuid::Uuid::now_v7().to_string(), "acme".into(), "slowpoke".into(), b"{}".to_vec(), 0)
    };
    let dl = DeadLetter {
        job: Some(job.clone()),
        raw: None,
        failure_class: FailureClass::AppError,
        reason: "gave up".into(),
        last_error: None,
        attempts: 3,
        first_failure_at: 0,
        last_failure_at: 0,
        origin_topic: cfg.pool_topic(pool),
        origin_partition: 0,
        origin_offset: 0,
        replay_count: 0,
    };
    let producer = fairway::kafka::producer(cfg).unwrap();
    let bytes = fairway::codec::encode_dead_letter(&dl).unwrap();
    fairway::kafka::send(&producer, &cfg.dlq_topic(), "acme", &bytes).await.expect("dead letter");
    job.job_id
}

/// Whether the job `id` is on `pool`'s topic (read for up to 20 s).
async fn on_topic(cfg: &Config, pool: Pool, id: &str) -> bool {
    let jobs = common::read_until(
        cfg,
        &cfg.pool_topic(pool),
        Duration::from_secs(20),
        |b, _, _| fairway::codec::decode_job(b).ok(),
        |v| v.iter().any(|j| j.job_id == id),
    )
    .await;
    jobs.iter().any(|j| j.job_id == id)
}

/// The one result of `id`.
async fn result_of(cfg: &Config, id: &str) -> JobResult {
    let mut rs = common::results_for(cfg, &[id.to_string()], Duration::from_secs(60)).await;
    rs.remove(id).and_then(|mut v| v.pop()).unwrap_or_else(|| panic!("no result for job {id}"))
}

/// Waits until the store says where `tenant`'s jobs of `job_type` go now (the leader's
/// decision); reads at least once.
async fn class_of(cfg: &Config, job_type: &str, tenant: &str, within: Duration) -> Option<Pool> {
    let store = fairway::store::Store::open(cfg).await.expect("store");
    let stmts = store.classifier_statements().await.expect("statements");
    let deadline = Instant::now() + within;
    loop {
        let rows = stmts.classes().await.expect("read classes");
        if let Some(r) = rows.iter().find(|r| r.subject.job_type == job_type && r.subject.tenant == tenant) {
            return Some(r.class.pool);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The worker's /metrics lines naming `metric` and `slowpoke`.
async fn metric_lines(port: u16, metric: &str) -> Vec<String> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.unwrap().text().await.unwrap();
    text.lines().filter(|l| l.starts_with(metric) && l.contains("job_type=\"slowpoke\"")).map(String::from).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_type_running_long_moves_to_medium_and_its_next_jobs_run_there() {
    let cfg = Arc::new(common::config(&format!("{TYPE}[api]\nauth = \"off\"\n[classifier]\ncache = \"500ms\"\n")));
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = common::free_port();
    let extra = format!("{TYPE}{CLASSIFIER}[worker]\nmetrics_listen = \"127.0.0.1:{metrics_port}\"\n");
    let path = common::config_file(&cfg, &extra, dir.path());
    let _worker = KillOnDrop(common::spawn_worker(&path, "short,medium"));
    let t0 = Instant::now();

    // 8 jobs of 1.5 s: every run is over the short pool's 1 s; globex's 8 of the same
    // type take 50 ms.
    let quick = submit_cli(&path, &(0..8).map(|_| tenant_line("globex", 50, None)).collect::<Vec<_>>(), &[]);
    let ids = submit_cli(&path, &(0..8).map(|_| job_line(1_500, None)).collect::<Vec<_>>(), &[]);
    assert_eq!(ids.len(), 8, "{ids:?}");
    assert_eq!(common::results_for(&cfg, &quick, Duration::from_secs(60)).await.len(), 8, "globex's jobs ran");
    let mut last_finished = 0;
    for id in &ids {
        let r = result_of(&cfg, id).await;
        assert_eq!(r.pool, Pool::Short, "configured short, not yet measured");
        last_finished = last_finished.max(r.finished_at);
    }
    let moved = class_of(&cfg, "slowpoke", "acme", Duration::from_secs(45)).await;
    assert_eq!(moved, Some(Pool::Medium), "the classifier never moved slowpoke");
    let decided = t0.elapsed();
    // globex's runs of the type were quick: its jobs keep the configured pool.
    assert_eq!(class_of(&cfg, "slowpoke", "globex", Duration::from_millis(1)).await, None, "globex moved too");
    let theirs = submit_cli(&path, &[tenant_line("globex", 50, None)], &[]);
    assert!(on_topic(&cfg, Pool::Short, &theirs[0]).await, "globex's next job left the short pool");

    // The next submission, from another process, lands on the medium topic and runs there.
    let next = submit_cli(&path, &[job_line(200, None)], &[]);
    assert!(on_topic(&cfg, Pool::Medium, &next[0]).await, "the next job is not on the medium topic");
    assert_eq!(result_of(&cfg, &next[0]).await.pool, Pool::Medium);

    // The HTTP API routes it there too; an explicit pool still wins.
    let (base, stop) = common::serve_api(&cfg).await;
    let http = reqwest::Client::new();
    for (pool, want) in [(None, "medium"), (Some("short"), "short")] {
        let body: serde_json::Value = serde_json::from_str(&job_line(100, pool)).unwrap();
        let r = http.post(format!("{base}/v1/jobs")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), reqwest::StatusCode::CREATED);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["pool"], want, "explicit pool {pool:?}: {v}");
    }
    let explicit = submit_cli(&path, &[job_line(100, Some("short"))], &[]);
    assert_eq!(result_of(&cfg, &explicit[0]).await.pool, Pool::Short, "an explicit pool wins");

    // Replays: a dead letter naming the configured pool follows the class; one naming
    // another pool keeps it.
    let (follows, keeps) = (dead_letter(&cfg, Pool::Short).await, dead_letter(&cfg, Pool::Long).await);
    let mut o = fairway::ops::replay::ReplayOptions::new(ReplaySource::Dlq, "it::classifier");
    o.filter = ReplayFilter { tenant: Some("acme".into()), ..Default::default() };
    let report = fairway::ops::replay::run(&cfg, o, |_| {}).await.expect("replay");
    assert_eq!(report.replayed, 2, "{report:#?}");
    assert!(on_topic(&cfg, Pool::Medium, &follows).await, "the replayed short job is not on medium");
    assert!(on_topic(&cfg, Pool::Long, &keeps).await, "the replayed long job left long");

    // The worker's metrics: the violations and the move.
    let violations = metric_lines(metrics_port, "fairway_pool_violations_total").await;
    let over: f64 = violations
        .iter()
        .filter(|l| l.contains("pool=\"short\"") && l.contains("direction=\"over\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(over >= 8.0, "{violations:?}");
    let moves = metric_lines(metrics_port, "fairway_pool_reclassifications_total").await;
    assert!(
        moves.iter().any(|l| l.contains("from=\"short\"") && l.contains("to=\"medium\"") && l.ends_with(" 1")),
        "{moves:?}"
    );

    // The event, on the events topic.
    let events = common::read_until(
        &cfg,
        &cfg.events_topic(),
        Duration::from_secs(20),
        |b, _, _| fairway::codec::decode_event(b).ok(),
        |v| v.iter().any(|e| e.kind == EventKind::PoolReclassified),
    )
    .await;
    let ev = events.iter().find(|e| e.kind == EventKind::PoolReclassified).expect("pool_reclassified event");
    assert_eq!(
        (ev.job_id.as_str(), ev.job_type.as_str(), ev.tenant.as_str()),
        ("job_type/slowpoke", "slowpoke", "acme")
    );
    let msg = ev.message.as_deref().unwrap_or_default();
    assert!(msg.contains("from pool short to medium"), "{msg}");
    eprintln!(
        "reclassified {} ms after the last slow run ended ({decided:?} after the worker started): {msg}",
        ev.at - last_finished
    );

    let _ = stop.send(());
}
