//! `fairway-bench bench fleet`: one tenant on a whole fleet (lanes, `core::lanes`) and the
//! fair share across it. In-process workers of the short pool on fresh topics, jobs
//! submitted in batches of 1,000 as `POST /v1/jobs:batch` does. Scenarios:
//!
//! - `one`: one tenant's jobs alone: time against the fleet's ideal
//!   (`jobs x job_ms / (workers x slots)`), jobs per worker;
//! - `weights`: two tenants of weights 1 and 3 both flooding: each one's share of the
//!   fleet's worker time while both had work, against its entitlement (25 % / 75 %);
//! - `spread`: 30 tenants' jobs: jobs per worker, busiest over least busy;
//! - `quiet`: a flooder spread over the fleet while 10 quiet tenants submit one job each
//!   every 200 ms: the quiet ones' wait (submitted to started) p50 / p99.
//!
//! Human lines, then one JSON line per scenario.

use super::bench_flood::ResultFeed;
use super::Global;
use fairway::config::{Config, TenantConfig};
use fairway::core::scheduler::Tier;
use fairway::model::{JobResult, Pool};
use fairway::now_ms;
use fairway::submit::{NewJob, Submitter};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct FleetArgs {
    /// In-process workers of the short pool.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Slots per worker.
    #[arg(long, default_value_t = 64)]
    pub slots: usize,
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Scenarios to run, comma separated: one, weights, spread, quiet.
    #[arg(long, value_delimiter = ',', default_value = "one,weights,spread,quiet")]
    pub scenarios: Vec<Scenario>,
    /// Jobs of `one`, `spread` and `quiet`'s flooder.
    #[arg(long, default_value_t = 6_000)]
    pub jobs: usize,
    /// Run time of those jobs (ms).
    #[arg(long, default_value_t = 200)]
    pub job_ms: u64,
    /// Jobs of each tenant of `weights`.
    #[arg(long, default_value_t = 9_000)]
    pub weight_jobs: usize,
    /// Run time of `weights`' jobs (ms).
    #[arg(long, default_value_t = 100)]
    pub weight_job_ms: u64,
    /// Tenants of `spread`.
    #[arg(long, default_value_t = 30)]
    pub tenants: usize,
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    One,
    Weights,
    Spread,
    Quiet,
}

pub async fn run(g: &Global, a: FleetArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!((1..=16).contains(&a.workers), "--workers must be 1 to 16");
    anyhow::ensure!((1..=4096).contains(&a.slots), "--slots must be 1 to 4096");
    anyhow::ensure!((1..=256).contains(&a.partitions), "--partitions must be 1 to 256");
    anyhow::ensure!((1..=1_000_000).contains(&a.jobs), "--jobs must be 1 to 1000000");
    anyhow::ensure!((1..=1_000_000).contains(&a.weight_jobs), "--weight-jobs must be 1 to 1000000");
    anyhow::ensure!((1..=60_000).contains(&a.job_ms), "--job-ms must be 1 to 60000");
    anyhow::ensure!((1..=60_000).contains(&a.weight_job_ms), "--weight-job-ms must be 1 to 60000");
    anyhow::ensure!((1..=10_000).contains(&a.tenants), "--tenants must be 1 to 10000");
    let mut ok = true;
    for s in &a.scenarios {
        let json = match s {
            Scenario::One => one(g, &a).await?,
            Scenario::Weights => weights(g, &a).await?,
            Scenario::Spread => spread(g, &a).await?,
            Scenario::Quiet => quiet(g, &a).await?,
        };
        ok &= json.get("complete").and_then(serde_json::Value::as_bool).unwrap_or(false);
        println!("{}", serde_json::Value::Object(json));
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

type Json = serde_json::Map<String, serde_json::Value>;

/// One scenario's deployment: fresh topics, its tenants, the workers and a result feed.
struct Fleet {
    cfg: Arc<Config>,
    sub: Arc<Submitter>,
    workers: Vec<fairway::worker::Worker>,
    feed: ResultFeed,
}

impl Fleet {
    async fn start(g: &Global, a: &FleetArgs, name: &str, tenants: &[(String, f64)]) -> anyhow::Result<Fleet> {
        let mut cfg = (*g.load()?).clone();
        cfg.kafka.topic_prefix = format!("fleetbench{}-{name}.", now_ms());
        cfg.kafka.partitions = a.partitions;
        cfg.scylla.keyspace = "fairway_bench".into();
        // Sleep jobs on a loaded machine can leave the short pool's range; the classifier
        // would move them to a pool nobody here runs.
        cfg.classifier.enabled = false;
        let short =
            cfg.pools.entry(Pool::Short).or_insert_with(|| fairway::config::PoolConfig::default_for(Pool::Short));
        short.slots = a.slots;
        cfg.tenants.clear();
        for (t, weight) in tenants {
            cfg.tenants
                .insert(t.clone(), TenantConfig { tier: Tier::Standard, weight: Some(*weight), ..Default::default() });
        }
        super::bench::add_bench_job_types(&mut cfg)?;
        cfg.validate()?;
        let cfg = Arc::new(cfg);
        fairway::kafka::ensure_topics(&cfg).await?;
        fairway::store::ensure_schema(&cfg).await?;
        fairway::ops::tenants::seed(&cfg).await?;
        let store = fairway::store::Store::open(&cfg).await?;
        let sub = Arc::new(Submitter::new(cfg.clone(), Some(store))?);
        let feed = ResultFeed::start(&cfg)?;
        let workers = super::bench::start_workers(&cfg, a.workers).await?;
        Ok(Fleet { cfg, sub, workers, feed })
    }

    /// Reads results until `n` distinct jobs ended or `timeout` passed.
    async fn collect(&mut self, n: usize, timeout: Duration) -> Vec<JobResult> {
        let deadline = Instant::now() + timeout;
        let mut seen = std::collections::HashMap::with_capacity(n);
        while seen.len() < n && Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_millis(500), self.feed.rx.recv()).await {
                Ok(Some((r, _))) => {
                    seen.entry(r.job_id.clone()).or_insert(r);
                }
                Ok(None) => break,
                Err(_) => {}
            }
        }
        seen.into_values().collect()
    }

    async fn stop(self) {
        for w in self.workers {
            w.stop().await;
        }
        self.feed.stop().await;
        super::bench::drop_topics(&self.cfg).await;
    }
}

/// Sleep jobs of `tenant`, `ms` each.
fn sleeps(tenant: &str, n: usize, ms: u64) -> Vec<NewJob> {
    (0..n)
        .map(|_| NewJob {
            tenant: tenant.into(),
            job_type: "sleep".into(),
            payload: serde_json::json!({ "ms": ms }).into(),
            ..Default::default()
        })
        .collect()
}

/// Submits `jobs` in batches of 1,000; the number refused.
async fn submit(sub: &Submitter, jobs: &[NewJob]) -> usize {
    let mut refused = 0;
    for batch in jobs.chunks(1000) {
        refused += sub.submit_many(batch).await.iter().filter(|r| r.is_err()).count();
    }
    refused
}

/// Results per worker (by worker id), busiest first.
fn per_worker(results: &[JobResult]) -> Vec<usize> {
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for r in results {
        *by.entry(r.worker_id.as_str()).or_default() += 1;
    }
    let mut counts: Vec<usize> = by.into_values().collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    counts
}

/// The per-worker counts with zeros for workers that ran nothing.
fn padded(mut counts: Vec<usize>, workers: usize) -> Vec<usize> {
    counts.resize(workers.max(counts.len()), 0);
    counts
}

fn span_ms(results: &[JobResult], t0: i64) -> i64 {
    results.iter().map(|r| r.finished_at).max().unwrap_or(t0) - t0
}

async fn one(g: &Global, a: &FleetArgs) -> anyhow::Result<Json> {
    let tenant = "fleet-solo".to_string();
    let mut fleet = Fleet::start(g, a, "one", &[(tenant.clone(), 100.0)]).await?;
    let jobs = sleeps(&tenant, a.jobs, a.job_ms);
    let t0 = now_ms();
    let refused = submit(&fleet.sub, &jobs).await;
    let results = fleet.collect(a.jobs - refused, a.timeout).await;
    fleet.stop().await;
    let took = span_ms(&results, t0);
    let ideal = (a.jobs as u64 * a.job_ms) as f64 / (a.workers * a.slots) as f64;
    let counts = padded(per_worker(&results), a.workers);
    let least = counts.iter().min().copied().unwrap_or(0) as f64 / results.len().max(1) as f64;
    println!(
        "one tenant: {} jobs of {} ms on {} workers x {} slots: {:.2} s (ideal {:.2} s, {:.2}x); per worker {:?}",
        results.len(),
        a.job_ms,
        a.workers,
        a.slots,
        took as f64 / 1000.0,
        ideal / 1000.0,
        took as f64 / ideal,
        counts
    );
    let mut j = Json::new();
    j.insert("bench".into(), "fleet".into());
    j.insert("scenario".into(), "one".into());
    j.insert("jobs".into(), a.jobs.into());
    j.insert("done".into(), results.len().into());
    j.insert("refused".into(), refused.into());
    j.insert("complete".into(), (results.len() + refused == a.jobs && refused == 0).into());
    j.insert("seconds".into(), (took as f64 / 1000.0).into());
    j.insert("ideal_seconds".into(), (ideal / 1000.0).into());
    j.insert("over_ideal".into(), (took as f64 / ideal).into());
    j.insert("per_worker".into(), counts.into());
    j.insert("least_worker_share".into(), least.into());
    j.insert("goal_met".into(), (took as f64 <= 1.3 * ideal && least >= 0.25).into());
    Ok(j)
}

/// Worker time (ms) of each tenant's runs inside `[from, to)`.
fn worker_time(results: &[JobResult], from: i64, to: i64) -> BTreeMap<String, i64> {
    let mut by = BTreeMap::new();
    for r in results {
        let start = r.started_at.unwrap_or(r.finished_at).max(from);
        let end = r.finished_at.min(to);
        if end > start {
            *by.entry(r.tenant.clone()).or_insert(0i64) += end - start;
        }
    }
    by
}

async fn weights(g: &Global, a: &FleetArgs) -> anyhow::Result<Json> {
    let tenants = [("fleet-w1".to_string(), 100.0), ("fleet-w3".to_string(), 300.0)];
    let mut fleet = Fleet::start(g, a, "weights", &tenants).await?;
    // Both floods interleaved batch by batch, so both are backlogged from the start.
    let (light, heavy) =
        (sleeps(&tenants[0].0, a.weight_jobs, a.weight_job_ms), sleeps(&tenants[1].0, a.weight_jobs, a.weight_job_ms));
    let t0 = now_ms();
    let mut refused = 0;
    for (l, h) in light.chunks(1000).zip(heavy.chunks(1000)) {
        let (x, y) = tokio::join!(submit(&fleet.sub, l), submit(&fleet.sub, h));
        refused += x + y;
    }
    let results = fleet.collect(2 * a.weight_jobs - refused, a.timeout).await;
    fleet.stop().await;
    // Both backlogged: from the first start until either tenant's last job started.
    let from = results.iter().filter_map(|r| r.started_at).min().unwrap_or(t0);
    let last_start =
        |t: &str| results.iter().filter(|r| r.tenant == t).filter_map(|r| r.started_at).max().unwrap_or(from);
    let to = last_start(&tenants[0].0).min(last_start(&tenants[1].0));
    let used = worker_time(&results, from, to);
    let total: i64 = used.values().sum();
    let share = |t: &str| used.get(t).copied().unwrap_or(0) as f64 / total.max(1) as f64;
    let (s1, s3) = (share(&tenants[0].0), share(&tenants[1].0));
    let error = (s1 - 0.25).abs().max((s3 - 0.75).abs());
    println!(
        "weights 1:3, {} jobs of {} ms each: shares while both backlogged ({:.1} s) {:.1} % / {:.1} % (entitled 25 / 75); per worker {:?}",
        a.weight_jobs,
        a.weight_job_ms,
        (to - from) as f64 / 1000.0,
        100.0 * s1,
        100.0 * s3,
        padded(per_worker(&results), a.workers)
    );
    let mut j = Json::new();
    j.insert("bench".into(), "fleet".into());
    j.insert("scenario".into(), "weights".into());
    j.insert("done".into(), results.len().into());
    j.insert("complete".into(), (results.len() == 2 * a.weight_jobs && refused == 0).into());
    j.insert("backlogged_seconds".into(), ((to - from) as f64 / 1000.0).into());
    j.insert("share_w1".into(), s1.into());
    j.insert("share_w3".into(), s3.into());
    j.insert("max_share_error_points".into(), (100.0 * error).into());
    j.insert("goal_met".into(), (error <= 0.05).into());
    j.insert("per_worker".into(), padded(per_worker(&results), a.workers).into());
    Ok(j)
}

async fn spread(g: &Global, a: &FleetArgs) -> anyhow::Result<Json> {
    let tenants: Vec<(String, f64)> = (0..a.tenants).map(|i| (format!("fleet-t{i:03}"), 100.0)).collect();
    let mut fleet = Fleet::start(g, a, "spread", &tenants).await?;
    let per = a.jobs / a.tenants;
    // Round robin over the tenants, as many clients submitting at once would.
    let jobs: Vec<NewJob> =
        (0..per).flat_map(|_| tenants.iter().map(|(t, _)| sleeps(t, 1, a.job_ms).remove(0))).collect();
    let n = jobs.len();
    let t0 = now_ms();
    let refused = submit(&fleet.sub, &jobs).await;
    let results = fleet.collect(n - refused, a.timeout).await;
    fleet.stop().await;
    let counts = padded(per_worker(&results), a.workers);
    let (max, min) = (counts.iter().max().copied().unwrap_or(0), counts.iter().min().copied().unwrap_or(0));
    let ratio = max as f64 / min.max(1) as f64;
    println!(
        "{} tenants, {} jobs of {} ms: {:.2} s; per worker {:?} (busiest / least {:.2})",
        a.tenants,
        results.len(),
        a.job_ms,
        span_ms(&results, t0) as f64 / 1000.0,
        counts,
        ratio
    );
    let mut j = Json::new();
    j.insert("bench".into(), "fleet".into());
    j.insert("scenario".into(), "spread".into());
    j.insert("tenants".into(), a.tenants.into());
    j.insert("done".into(), results.len().into());
    j.insert("complete".into(), (results.len() == n && refused == 0).into());
    j.insert("seconds".into(), (span_ms(&results, t0) as f64 / 1000.0).into());
    j.insert("per_worker".into(), counts.into());
    j.insert("busiest_over_least".into(), ratio.into());
    j.insert("goal_met".into(), (ratio <= 1.5).into());
    Ok(j)
}

async fn quiet(g: &Global, a: &FleetArgs) -> anyhow::Result<Json> {
    let mut tenants: Vec<(String, f64)> = vec![("fleet-noisy".into(), 100.0)];
    tenants.extend((0..10).map(|i| (format!("fleet-quiet{i}"), 100.0)));
    let mut fleet = Fleet::start(g, a, "quiet", &tenants).await?;
    let flood = sleeps(&tenants[0].0, a.jobs, a.job_ms);
    let t0 = now_ms();
    let refused = submit(&fleet.sub, &flood).await;
    // The quiet tenants: one job each every 200 ms for the flood's ideal time, at least 5 s.
    let ideal_ms = (a.jobs as u64 * a.job_ms) / (a.workers * a.slots) as u64;
    let ticks = (ideal_ms.max(5_000) / 200) as usize;
    let mut quiet_sent = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    for _ in 0..ticks {
        tick.tick().await;
        let batch: Vec<NewJob> = tenants[1..].iter().flat_map(|(t, _)| sleeps(t, 1, 10)).collect();
        quiet_sent += batch.len() - submit(&fleet.sub, &batch).await;
    }
    let results = fleet.collect(a.jobs - refused + quiet_sent, a.timeout).await;
    fleet.stop().await;
    let mut waits = hdrhistogram::Histogram::<u64>::new(3)?;
    for r in results.iter().filter(|r| r.tenant != tenants[0].0) {
        waits.record((r.started_at.unwrap_or(r.finished_at) - r.submitted_at).max(0) as u64)?;
    }
    let flood_done = results.iter().filter(|r| r.tenant == tenants[0].0).count();
    println!(
        "quiet beside a spread flooder ({} jobs of {} ms, {:.2} s): quiet waits p50 {} ms p99 {} ms ({} jobs)",
        flood_done,
        a.job_ms,
        span_ms(&results, t0) as f64 / 1000.0,
        waits.value_at_quantile(0.5),
        waits.value_at_quantile(0.99),
        waits.len()
    );
    let mut j = Json::new();
    j.insert("bench".into(), "fleet".into());
    j.insert("scenario".into(), "quiet".into());
    j.insert("complete".into(), (results.len() == a.jobs - refused + quiet_sent && refused == 0).into());
    j.insert("flood_done".into(), flood_done.into());
    j.insert("quiet_jobs".into(), waits.len().into());
    j.insert("quiet_wait_p50_ms".into(), waits.value_at_quantile(0.5).into());
    j.insert("quiet_wait_p99_ms".into(), waits.value_at_quantile(0.99).into());
    j.insert("per_worker".into(), padded(per_worker(&results), a.workers).into());
    Ok(j)
}
