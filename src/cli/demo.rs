//! `fairway demo`: the five-minute tour on local services. Starts the services if they
//! are not up, creates a fresh set of topics, runs two in-process workers, submits a
//! mixed workload for several tenants (fast and slow jobs, a few failing ones), shows
//! live progress and ends with a per-tenant summary. Exit 0 only if every job reached
//! a terminal result.

use super::Global;
use anyhow::{bail, Context};
use fairway::config::Config;
use fairway::handlers::Registry;
use fairway::kafka::{self, Consumer, Message};
use fairway::model::{JobResult, JobStatus, Priority};
use fairway::submit::{NewJob, Submitter};
use fairway::worker::{Policy, Worker};
use fairway::{codec, now_ms};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Jobs to submit in total.
    #[arg(long, default_value_t = 2000)]
    pub jobs: usize,
    /// Give up waiting for results after this long.
    #[arg(long, default_value = "180s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Do not try to start the local services.
    #[arg(long)]
    pub no_services: bool,
    /// Worker members to run in-process.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
}

/// The demo's configuration: the bundled tenants and job types, with retries fast
/// enough that failing jobs reach the DLQ while you watch.
const DEMO_OVERRIDES: &str = r#"
[worker.poison]
min_samples = 100
[job_types.fail.retry.app_error]
delays = ["200ms", "500ms"]
max_attempts = 3
[job_types.fail.retry.poison]
delays = ["500ms"]
[job_types.flaky.retry.app_error]
delays = ["300ms"]
max_attempts = 3
[job_types.flaky.retry.poison]
delays = ["500ms"]
"#;

pub async fn run(g: &Global, a: DemoArgs) -> anyhow::Result<ExitCode> {
    let cfg = prepare(g, &a).await?;

    // Results reader first, so the group is formed while workers start.
    let reader = kafka::reader(&cfg, &cfg.group("demo-results"), false)?;
    reader.subscribe(&[&cfg.results_topic()])?;
    let workers = start_workers(&cfg, a.workers).await?;
    let store = fairway::store::Store::open(&cfg).await?;
    let submitter = Submitter::new(cfg.clone(), Some(store))?;

    let mut tally = Tally::submit(&submitter, a.jobs).await?;
    tally.wait_for_results(&reader, a.timeout).await?;
    let elapsed = tally.started.elapsed().as_secs_f64();
    println!();
    for w in workers {
        w.stop().await;
    }

    tally.print_summary(elapsed);
    if tally.seen.len() < tally.submitted.len() {
        eprintln!("error: {} jobs had no result within {:?}", tally.submitted.len() - tally.seen.len(), a.timeout);
        return Ok(ExitCode::FAILURE);
    }
    print_next_steps(&cfg);
    Ok(ExitCode::SUCCESS)
}

/// Loads the demo's configuration (starting the local services unless told not to) and
/// creates its topics, keyspace and tenants.
async fn prepare(g: &Global, a: &DemoArgs) -> anyhow::Result<Arc<Config>> {
    let base = g.load()?;
    if !a.no_services {
        ensure_services(&base)?;
    }
    let cfg = demo_config(&base)?;
    println!(
        "fairway demo: brokers {}  cql {}  topics {}*",
        cfg.kafka.brokers,
        cfg.scylla.contact_points.join(","),
        cfg.kafka.topic_prefix
    );
    kafka::ensure_topics(&cfg).await.context("creating demo topics (is the broker up? scripts/services up)")?;
    fairway::store::ensure_schema(&cfg).await.context("creating keyspace")?;
    fairway::ops::tenants::seed(&cfg).await.context("registering the demo tenants")?;
    Ok(cfg)
}

/// Starts `n` (at least one) in-process workers on the short and medium pools and waits
/// until each has its partitions.
async fn start_workers(cfg: &Arc<Config>, n: usize) -> anyhow::Result<Vec<Worker>> {
    let registry = Registry::from_config(cfg, Default::default()).map_err(anyhow::Error::msg)?;
    let mut workers = Vec::new();
    for _ in 0..n.max(1) {
        workers.push(
            Worker::start(
                cfg.clone(),
                &[fairway::model::Pool::Short, fairway::model::Pool::Medium],
                registry.clone(),
                Policy::Fair,
            )
            .await?,
        );
    }
    // Wait for the consumer groups to form (about a second on Kafka), so the
    // latencies below measure fairway, not group formation.
    for w in &workers {
        w.wait_assigned(Duration::from_secs(30)).await;
    }
    Ok(workers)
}

/// The demo's jobs: who submitted them, and which of them have a result so far.
struct Tally {
    /// Job id -> tenant.
    submitted: HashMap<String, String>,
    per_tenant: BTreeMap<String, TenantSummary>,
    /// Job ids with a result.
    seen: HashSet<String>,
    /// When the first job was submitted.
    started: Instant,
}

impl Tally {
    /// Submits the demo workload of `jobs` jobs, 500 at a time.
    async fn submit(submitter: &Submitter, jobs: usize) -> anyhow::Result<Tally> {
        let plan = workload(jobs);
        let started = Instant::now();
        let mut submitted: HashMap<String, String> = HashMap::new(); // job id -> tenant
        let mut per_tenant: BTreeMap<String, TenantSummary> = BTreeMap::new();
        for chunk in plan.chunks(500) {
            let rs = futures::future::join_all(chunk.iter().map(|j| submitter.submit(j))).await;
            for (j, r) in chunk.iter().zip(rs) {
                let s = r.with_context(|| format!("submitting a {} job for {}", j.job_type, j.tenant))?;
                submitted.insert(s.job_id, j.tenant.clone());
                per_tenant.entry(j.tenant.clone()).or_default().submitted += 1;
            }
        }
        println!(
            "submitted {} jobs for {} tenants in {:.1}s; waiting for results...",
            submitted.len(),
            per_tenant.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(Tally { submitted, per_tenant, seen: HashSet::new(), started })
    }

    /// Reads results until every job has one or `timeout` passed, showing live progress.
    async fn wait_for_results(&mut self, reader: &kafka::Reader, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last_print = Instant::now();
        let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
        while self.seen.len() < self.submitted.len() && Instant::now() < deadline {
            let msg = match tokio::time::timeout(Duration::from_millis(250), reader.recv()).await {
                Ok(Ok(m)) => Some(m),
                Ok(Err(e)) => bail!("reading results: {e}"),
                Err(_) => None,
            };
            if let Some(m) = msg {
                if let Some(r) = m.payload().and_then(|b| codec::decode_result(b).ok()) {
                    if self.submitted.contains_key(&r.job_id) && self.seen.insert(r.job_id.clone()) {
                        *counts.entry(r.status.as_str()).or_default() += 1;
                        self.per_tenant.entry(r.tenant.clone()).or_default().add(&r);
                    }
                }
            }
            if last_print.elapsed() > Duration::from_millis(500) {
                last_print = Instant::now();
                self.print_progress(&counts);
            }
        }
        Ok(())
    }

    /// One line of live progress: results so far, by status, overwriting the last one.
    fn print_progress(&self, counts: &BTreeMap<&'static str, usize>) {
        let c: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
        print!(
            "\r  {:>6}/{} finished  [{}]  {:.1}s   ",
            self.seen.len(),
            self.submitted.len(),
            c.join(", "),
            self.started.elapsed().as_secs_f64()
        );
        let _ = std::io::stdout().flush();
    }

    /// The per-tenant table and the totals line, `elapsed` seconds after the start.
    fn print_summary(&mut self, elapsed: f64) {
        println!();
        println!(
            "{:<10} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9}",
            "tenant", "submitted", "succeeded", "failed", "other", "p50 ms", "p99 ms"
        );
        for (t, s) in &mut self.per_tenant {
            s.latencies.sort_unstable();
            println!(
                "{:<10} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9}",
                t,
                s.submitted,
                s.succeeded,
                s.failed,
                s.other,
                pct(&s.latencies, 0.50),
                pct(&s.latencies, 0.99)
            );
        }
        let mut all: Vec<i64> = self.per_tenant.values().flat_map(|s| s.latencies.iter().copied()).collect();
        all.sort_unstable();
        println!(
            "\n{} of {} jobs reached a terminal result in {:.1}s: {:.0} jobs/s, end-to-end p50 {} ms, p99 {} ms",
            self.seen.len(),
            self.submitted.len(),
            elapsed,
            self.seen.len() as f64 / elapsed,
            pct(&all, 0.5),
            pct(&all, 0.99)
        );
    }
}

/// Where to look next: the dead letters, and how to stop the services.
fn print_next_steps(cfg: &Config) {
    println!(
        "dead letters are on {}; inspect them with `fairway replay --from dlq --topic-prefix {} --keyspace fairway_demo --dry-run`",
        cfg.dlq_topic(),
        cfg.kafka.topic_prefix
    );
    println!("the local services keep running for the tour in README.md; `scripts/services down` stops them");
}

#[derive(Default)]
struct TenantSummary {
    submitted: usize,
    succeeded: usize,
    failed: usize,
    other: usize,
    latencies: Vec<i64>,
}

impl TenantSummary {
    fn add(&mut self, r: &JobResult) {
        match r.status {
            JobStatus::Succeeded => self.succeeded += 1,
            JobStatus::Failed => self.failed += 1,
            _ => self.other += 1,
        }
        self.latencies.push(r.finished_at - r.submitted_at);
    }
}

fn pct(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// A deterministic mixed workload: most jobs are fast echoes, some sleep, a few fail,
/// some are flaky (succeed on retry), a handful are medium-pool reports.
fn workload(n: usize) -> Vec<NewJob> {
    let tenants = ["acme", "globex", "initech", "hooli", "piedpiper"];
    (0..n)
        .map(|i| {
            let tenant = tenants[i % tenants.len()].to_string();
            let (job_type, payload) = match i % 50 {
                0 => ("fail", serde_json::Value::Null),
                // One flaky job in three fails its first attempt (a type failing most of
                // the time would be quarantined as poison, like `fail` is).
                1 | 2 | 5 => ("flaky", serde_json::json!({"fail_attempts": i32::from(i % 50 == 1)})),
                3 => ("report", serde_json::json!({"ms": 400})),
                4 | 6..=13 => ("sleep", serde_json::json!({"ms": 20 + (i % 7) * 15})),
                _ => ("echo", serde_json::json!({"n": i})),
            };
            NewJob {
                tenant,
                job_type: job_type.into(),
                payload: payload.into(),
                priority: if i % 10 == 0 { Priority::Urgent } else { Priority::Normal },
                ..Default::default()
            }
        })
        .collect()
}

fn demo_config(base: &Config) -> anyhow::Result<Arc<Config>> {
    let mut cfg = base.clone();
    let overrides: toml::Table = toml::from_str(DEMO_OVERRIDES)?;
    if let Some(p) = overrides.get("worker").and_then(|w| w.get("poison")) {
        cfg.worker.poison = p.clone().try_into().context("demo poison settings")?;
    }
    // Apply the demo's fast retry policies to the bundled job types.
    for (name, jt) in cfg.job_types.iter_mut() {
        if let Some(r) = overrides.get("job_types").and_then(|j| j.get(name)).and_then(|j| j.get("retry")) {
            jt.retry = Some(r.clone().try_into().context("demo retry policy")?);
        }
    }
    // A fresh set of topics per run: results of earlier demos do not mix in.
    cfg.kafka.topic_prefix = format!("demo{}.", now_ms() / 1000);
    cfg.scylla.keyspace = "fairway_demo".into();
    Ok(Arc::new(cfg))
}

/// Starts the local services with scripts/services when the broker is not reachable.
fn ensure_services(cfg: &Config) -> anyhow::Result<()> {
    let broker = cfg.kafka.brokers.split(',').next().unwrap_or_default().to_string();
    let cql = cfg.scylla.contact_points.first().cloned().unwrap_or_default();
    let up = |addr: &str| {
        addr.parse::<std::net::SocketAddr>()
            .ok()
            .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok())
    };
    if up(&broker) && up(&cql) {
        return Ok(());
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/services");
    println!("starting local services with {} (first run installs them: a few minutes)", script.display());
    let status = std::process::Command::new(&script)
        .arg("up")
        .status()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !status.success() {
        bail!("{} up failed; see .services/logs/", script.display());
    }
    Ok(())
}
