//! `fairway-bench bench tenants`: the seed's scale on the local services. `--tenants` tenants
//! are registered (default 10,000: `--heavy` of them flood, the rest are light), free
//! accounts match `registry.free_accounts` (`free-*`, no rows) and tenants never seen
//! are admitted by policy (`unknown_tenants = "admit"`). `--workers` in-process workers
//! of the short pool run the jobs.
//!
//! The run: a light trickle over `--duration` (each active light tenant submits one or
//! more echo jobs, the active free accounts and new tenants one each, spread evenly);
//! after `--flood-after`, the heavy tenants' flood (`--flood` sleep jobs of `--flood-ms`
//! at once, round robin over them); during the flood, `--changes` registry changes whose
//! arrival at every worker's view is timed. Then every job's result is awaited (at most
//! `--drain-timeout`). Printed as one JSON line: light tenants' wait (run start minus
//! submission) alone (before the flood) and during it (until the flood's last job
//! started) with their p99 ratio, the same for free accounts and new tenants, jobs
//! submitted / finished / lost / duplicated, the registry changes' delays, CPU seconds
//! and peak RSS of this process (the workers and the driver) and of the local services,
//! and the mean wait per stage (`fairway_job_wait_seconds{stage}`, all jobs) before and
//! during the flood.

use super::bench_cpu::CpuProbe;
use super::bench_flood::{pct, produce, record, round2, ResultFeed};
use super::Global;
use anyhow::Context;
use fairway::config::{Config, Tier};
use fairway::core::tenants::{TenantRecord, UnknownTenants};
use fairway::handlers::Registry;
use fairway::kafka::{self, Producer};
use fairway::model::{JobStatus, Pool};
use fairway::now_ms;
use fairway::ops::tenants::LiveTenants;
use fairway::worker::{Policy, Worker};
use futures::StreamExt;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct TenantsArgs {
    /// Tenants registered (rows in the registry); `--heavy` of them flood, the rest are light.
    #[arg(long, default_value_t = 10_000)]
    pub tenants: usize,
    #[arg(long, default_value_t = 50)]
    pub heavy: usize,
    /// Light tenants that submit during the run (default: all of them).
    #[arg(long)]
    pub light_active: Option<usize>,
    /// Jobs per active light tenant: tenant i submits 1 + i % this many.
    #[arg(long, default_value_t = 2)]
    pub light_jobs: usize,
    /// Row-less free accounts (`free-00000`...), matched by `registry.free_accounts = ["free-*"]`.
    #[arg(long, default_value_t = 50_000)]
    pub free_accounts: usize,
    /// Free accounts that submit one job each, spread over all of them.
    #[arg(long, default_value_t = 5_000)]
    pub free_active: usize,
    /// Tenants never seen before (admitted by policy, registered in the background), one job each.
    #[arg(long, default_value_t = 0)]
    pub new_tenants: usize,
    /// Sleep jobs the heavy tenants submit at once, round robin.
    #[arg(long, default_value_t = 300_000)]
    pub flood: usize,
    #[arg(long, default_value_t = 5)]
    pub flood_ms: u64,
    /// How long the light trickle lasts.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// When the flood starts (the light tenants' "alone" window ends here).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub flood_after: Duration,
    /// Left out of the "alone" window at the start.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Registry changes during the flood (2 s apart, from 3 s into it), each timed until every worker sees it.
    #[arg(long, default_value_t = 3)]
    pub changes: usize,
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Slots of the short pool per worker (default: the config's).
    #[arg(long)]
    pub slots: Option<usize>,
    /// Partitions of the bench's topics (default: the config's).
    #[arg(long)]
    pub partitions: Option<i32>,
    /// Most time to wait for every job's result after the trickle ends.
    #[arg(long, default_value = "600s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    /// Dispatch in arrival order instead of fairly (what the numbers look like without fairness).
    #[arg(long)]
    pub fifo: bool,
}

/// Which population a trickle job belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Light,
    Free,
    New,
    Heavy,
}

/// A submitted job: its tenant's kind and when it was submitted.
#[derive(Debug, Clone, Copy)]
struct Sent {
    kind: Kind,
    at: i64,
}

/// What arrived for a job on the results topic.
#[derive(Debug, Clone, Copy)]
struct Got {
    started_at: Option<i64>,
    ok: bool,
    results: u32,
}

fn heavy_name(i: usize) -> String {
    format!("heavy-{i:03}")
}
fn light_name(i: usize) -> String {
    format!("light-{i:05}")
}

/// Job ids are UUIDs: kept as u128 to keep the driver's memory small next to the workers'.
fn key(id: &str) -> u128 {
    uuid::Uuid::parse_str(id).map(|u| u.as_u128()).unwrap_or_default()
}

fn bench_config(base: &Config, a: &TenantsArgs) -> anyhow::Result<Arc<Config>> {
    let mut cfg = base.clone();
    cfg.kafka.topic_prefix = format!("tenantsbench{}.", now_ms());
    cfg.scylla.keyspace = "fairway_bench".into();
    if let Some(p) = a.partitions {
        cfg.kafka.partitions = p;
    }
    let short = cfg.pools.entry(Pool::Short).or_insert_with(|| fairway::config::PoolConfig::default_for(Pool::Short));
    if let Some(s) = a.slots {
        short.slots = s;
    }
    cfg.tenants.clear();
    // The workers serve the short pool only: on an overloaded box 5 ms sleeps can run past
    // the short pool's range and the classifier would move them to a pool nobody here runs.
    cfg.classifier.enabled = false;
    cfg.registry.unknown_tenants = UnknownTenants::Admit;
    cfg.registry.default_tier = Tier::Standard;
    cfg.registry.free_accounts = vec!["free-*".to_string().try_into().map_err(anyhow::Error::msg)?];
    super::bench::add_bench_job_types(&mut cfg)?;
    cfg.validate()?;
    Ok(Arc::new(cfg))
}

pub async fn run(g: &Global, a: TenantsArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.heavy >= 1 && a.tenants > a.heavy, "--tenants must exceed --heavy (and --heavy be at least 1)");
    anyhow::ensure!(a.free_active <= a.free_accounts, "--free-active must not exceed --free-accounts");
    anyhow::ensure!(a.light_jobs >= 1, "--light-jobs must be at least 1");
    anyhow::ensure!(
        a.warmup < a.flood_after && a.flood_after < a.duration,
        "need --warmup < --flood-after < --duration"
    );
    let cfg = bench_config(&*g.load()?, &a)?;
    let metrics = fairway::metrics::install_recorder().ok();
    kafka::ensure_topics(&cfg).await.context("creating bench topics (scripts/services up?)")?;
    fairway::store::ensure_schema(&cfg).await?;
    let store = fairway::store::Store::open(&cfg).await?;
    let stmts = store.tenant_statements().await?;
    let t = Instant::now();
    let recs: Vec<TenantRecord> = (0..a.heavy)
        .map(heavy_name)
        .chain((0..a.tenants - a.heavy).map(light_name))
        .map(|n| TenantRecord::new(&n, Tier::Standard))
        .collect();
    for chunk in recs.chunks(1_000) {
        stmts.register(chunk, now_ms()).await?;
    }
    let register_s = t.elapsed().as_secs_f64();
    eprintln!("registered {} tenants in {register_s:.1}s", a.tenants);

    let mut feed = ResultFeed::start(&cfg)?;
    let workers = start_workers(&cfg, &a).await?;
    let producer = kafka::producer(&cfg)?;
    let topic = cfg.pool_topic(Pool::Short);
    warm_up(&a, &producer, &topic, &mut feed).await?;
    let views: Vec<LiveTenants> = workers.iter().map(|w| w.tenants.clone()).collect();
    for v in &views {
        anyhow::ensure!(
            v.current().tenants.len() >= a.tenants,
            "a worker loaded {} tenants",
            v.current().tenants.len()
        );
    }

    let probe = CpuProbe::local();
    probe.reset_peak_rss();
    let cpu_before = probe.snapshot();
    let t0 = now_ms();
    let start = Instant::now();
    let trickle = tokio::spawn(trickle(producer.clone(), topic.clone(), trickle_plan(&a), start + a.duration));
    let flood = tokio::spawn(flood(producer.clone(), topic.clone(), a.clone(), start + a.flood_after));
    let changes = tokio::spawn(registry_changes(stmts.clone(), views, a.changes, start + a.flood_after));
    let mut run = Run { results: HashMap::new(), max_spilled: 0, stages: Vec::new() };
    run.stages.push(stage_means(metrics.as_ref()));
    run.collect_until(&mut feed, &workers, start + a.flood_after).await;
    run.stages.push(stage_means(metrics.as_ref()));
    run.collect_until(&mut feed, &workers, start + a.duration).await;
    let mut sent: HashMap<u128, Sent> = trickle.await??;
    let (flood_sent, flood_produce_s) = flood.await??;
    sent.extend(flood_sent);
    let deadline = Instant::now() + a.drain_timeout;
    while Instant::now() < deadline && sent.keys().any(|k| !run.results.contains_key(k)) {
        run.collect_until(&mut feed, &workers, Instant::now() + Duration::from_secs(2)).await;
    }
    run.stages.push(stage_means(metrics.as_ref()));
    let wall_s = start.elapsed().as_secs_f64();
    let cpu_after = probe.snapshot();
    let peak_rss = probe.peak_rss_mb();
    let cql_alive = cpu_after.contains_key("cql") || !cpu_before.contains_key("cql");
    let change_ms = changes.await??;

    let report = Report { a: &a, t0, sent: &sent, run: &run };
    let mut js = report.json();
    let cpu: BTreeMap<&str, f64> =
        cpu_after.iter().filter_map(|(n, t)| cpu_before.get(n).map(|b| (*n, round2(t - b)))).collect();
    let cores: BTreeMap<&str, f64> = cpu.iter().map(|(n, s)| (*n, round2(s / wall_s))).collect();
    let change_max = change_ms.iter().map(|c| c.unwrap_or(u64::MAX)).max();
    js["registry"] = json!({
        "register_s": round2(register_s), "poll_interval_ms": cfg.registry.poll_interval.as_millis() as u64,
        "change_ms_every_worker": change_ms, "change_max_ms": change_max,
        "within_2s": change_max.is_some_and(|m| m <= 2_000),
    });
    js["cpu_s"] = json!(cpu);
    js["cpu_cores_avg"] = json!(cores);
    js["peak_rss_mb"] = json!(peak_rss);
    js["wall_s"] = json!(round2(wall_s));
    js["flood"]["produce_s"] = json!(round2(flood_produce_s));
    js["cql_alive"] = json!(cql_alive);
    js["wait_stage_mean_ms"] = json!({
        "before_flood": stage_delta(&run.stages[0], &run.stages[1]),
        "flood_and_drain": stage_delta(&run.stages[1], &run.stages[2]),
    });
    js["max_spilled"] = json!(run.max_spilled);
    let complete = js["jobs"]["lost"] == json!(0) && js["jobs"]["not_succeeded"] == json!(0);
    let ratio = js["light"]["p99_ratio"].as_f64();
    js["goal_met"] =
        json!(complete && cql_alive && ratio.is_some_and(|r| r <= 2.0) && js["registry"]["within_2s"] == json!(true));
    println!("{js}");
    // Printed first: workers left with a backlog (a run cut by --drain-timeout) hand it
    // off as they stop, which may take a while; the process's exit ends them anyway.
    let stop = async {
        feed.stop().await;
        for w in workers {
            w.stop().await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), stop).await.is_err() {
        eprintln!("workers still stopping after 30 s; exiting");
    }
    Ok(if complete { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn start_workers(cfg: &Arc<Config>, a: &TenantsArgs) -> anyhow::Result<Vec<Worker>> {
    let registry = Registry::from_config(cfg, Default::default()).map_err(anyhow::Error::msg)?;
    let policy = if a.fifo { Policy::Fifo } else { Policy::Fair };
    let mut workers = Vec::new();
    for _ in 0..a.workers.max(1) {
        workers.push(Worker::start(cfg.clone(), &[Pool::Short], registry.clone(), policy).await?);
    }
    for w in &workers {
        if !w.wait_assigned(Duration::from_secs(60)).await {
            anyhow::bail!("a worker got no partitions within 60 s");
        }
    }
    Ok(workers)
}

/// One echo job of each heavy tenant through the whole path (connections, statements).
async fn warm_up(a: &TenantsArgs, producer: &Producer, topic: &str, feed: &mut ResultFeed) -> anyhow::Result<()> {
    let mut ids = HashSet::new();
    for i in 0..a.heavy {
        let rec = record(&heavy_name(i), "echo", json!({}));
        produce(producer, topic, &rec).await?;
        ids.insert(rec.job_id);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !ids.is_empty() {
        match tokio::time::timeout_at(deadline, feed.rx.recv()).await {
            Ok(Some((r, _))) => ids.remove(&r.job_id),
            _ => anyhow::bail!("{} warm-up jobs got no result within 60 s", ids.len()),
        };
    }
    Ok(())
}

/// The trickle's submissions in order: every active light tenant's jobs, the active free
/// accounts and the new tenants, interleaved by a fixed shuffle.
fn trickle_plan(a: &TenantsArgs) -> Vec<(String, Kind)> {
    use rand::{seq::SliceRandom, SeedableRng};
    let light = a.light_active.unwrap_or(a.tenants - a.heavy).min(a.tenants - a.heavy);
    let mut plan: Vec<(String, Kind)> = (0..light)
        .flat_map(|i| std::iter::repeat_n((light_name(i), Kind::Light), 1 + i % a.light_jobs))
        .chain(
            (0..a.free_active).map(|i| (format!("free-{:05}", i * a.free_accounts / a.free_active.max(1)), Kind::Free)),
        )
        .chain((0..a.new_tenants).map(|i| (format!("new-{i:05}"), Kind::New)))
        .collect();
    plan.shuffle(&mut rand::rngs::StdRng::seed_from_u64(42));
    plan
}

/// Submits the plan evenly until `end`; each send runs on its own so a slow broker
/// acknowledgement does not delay the next submission.
async fn trickle(
    producer: Producer,
    topic: String,
    plan: Vec<(String, Kind)>,
    end: Instant,
) -> anyhow::Result<HashMap<u128, Sent>> {
    let start = Instant::now();
    let step = (end - start).div_f64(plan.len().max(1) as f64);
    let mut sends = Vec::with_capacity(plan.len());
    for (k, (tenant, kind)) in plan.into_iter().enumerate() {
        tokio::time::sleep_until((start + step * k as u32).into()).await;
        let rec = record(&tenant, "echo", json!({}));
        let sent = (key(&rec.job_id), Sent { kind, at: rec.submitted_at });
        let (producer, topic) = (producer.clone(), topic.clone());
        sends.push(tokio::spawn(async move { produce(&producer, &topic, &rec).await.map(|_| sent) }));
    }
    let mut out = HashMap::new();
    for s in sends {
        let (k, sent) = s.await??;
        out.insert(k, sent);
    }
    Ok(out)
}

/// The heavy tenants' flood at `at`: `--flood` sleep jobs round robin over them, produced
/// as fast as the broker takes them. Returns them and how long producing took (s).
async fn flood(
    producer: Producer,
    topic: String,
    a: TenantsArgs,
    at: Instant,
) -> anyhow::Result<(HashMap<u128, Sent>, f64)> {
    tokio::time::sleep_until(at.into()).await;
    let t = Instant::now();
    let mut sends = futures::stream::iter((0..a.flood).map(|i| {
        let (producer, topic) = (producer.clone(), topic.clone());
        let rec = record(&heavy_name(i % a.heavy), "sleep", json!({ "ms": a.flood_ms }));
        async move {
            produce(&producer, &topic, &rec).await?;
            anyhow::Ok((key(&rec.job_id), Sent { kind: Kind::Heavy, at: rec.submitted_at }))
        }
    }))
    .buffered(1024);
    let mut out = HashMap::with_capacity(a.flood);
    while let Some(r) = sends.next().await {
        let (k, s) = r?;
        out.insert(k, s);
    }
    Ok((out, t.elapsed().as_secs_f64()))
}

/// `n` changes of light tenants' records during the flood (3 s into it, 2 s apart):
/// each one's delay until every worker's view has it (None: not within 30 s).
async fn registry_changes(
    stmts: fairway::store::TenantStatements,
    views: Vec<LiveTenants>,
    n: usize,
    flood_at: Instant,
) -> anyhow::Result<Vec<Option<u64>>> {
    let mut delays = Vec::new();
    for i in 0..n {
        tokio::time::sleep_until((flood_at + Duration::from_secs(3 + 2 * i as u64)).into()).await;
        let mut rec = TenantRecord::new(&light_name(i), Tier::Standard);
        rec.max_concurrency = Some(1_000 + i);
        let t = Instant::now();
        stmts.put(&rec, now_ms()).await?;
        let seen = |v: &LiveTenants| {
            v.current().tenants.get(&rec.name).is_some_and(|r| r.max_concurrency == rec.max_concurrency)
        };
        while !views.iter().all(seen) && t.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        delays.push(views.iter().all(seen).then(|| t.elapsed().as_millis() as u64));
    }
    Ok(delays)
}

/// The results received so far and what was sampled along the way.
struct Run {
    results: HashMap<u128, Got>,
    max_spilled: u64,
    /// `fairway_job_wait_seconds` (sum, count) per stage: at the start, the flood, the end.
    stages: Vec<BTreeMap<String, (f64, f64)>>,
}

impl Run {
    async fn collect_until(&mut self, feed: &mut ResultFeed, workers: &[Worker], until: Instant) {
        let until = tokio::time::Instant::from_std(until);
        let mut sample = tokio::time::Instant::now();
        while let Ok(Some((r, _))) = tokio::time::timeout_at(until, feed.rx.recv()).await {
            let got =
                self.results.entry(key(&r.job_id)).or_insert(Got { started_at: r.started_at, ok: false, results: 0 });
            got.results += 1;
            got.ok |= r.status == JobStatus::Succeeded;
            if tokio::time::Instant::now() >= sample {
                sample += Duration::from_millis(500);
                let spilled: u64 = workers
                    .iter()
                    .filter_map(|w| w.shared[0].stats.lock().ok().and_then(|s| s["pool"]["spilled"].as_u64()))
                    .sum();
                self.max_spilled = self.max_spilled.max(spilled);
            }
        }
    }
}

/// The run's numbers, as JSON.
struct Report<'a> {
    a: &'a TenantsArgs,
    t0: i64,
    sent: &'a HashMap<u128, Sent>,
    run: &'a Run,
}

impl Report<'_> {
    fn json(&self) -> Value {
        let a = self.a;
        let flood_at = self.t0 + a.flood_after.as_millis() as i64;
        let heavy_started = self.of(Kind::Heavy).filter_map(|(_, g)| g.and_then(|g| g.started_at));
        let drained_at = heavy_started.max().unwrap_or(flood_at);
        let during_end = drained_at.min(self.t0 + a.duration.as_millis() as i64);
        let alone = (self.t0 + a.warmup.as_millis() as i64, flood_at);
        let during = (flood_at, during_end);
        let group = |kind| {
            let (w_alone, w_during) = (self.waits(kind, alone), self.waits(kind, during));
            let ratio = match (pct(&w_alone, 0.99), pct(&w_during, 0.99)) {
                (Some(x), Some(d)) => json!(round2(d as f64 / (x as f64).max(1.0))),
                _ => Value::Null,
            };
            json!({"alone": summary(&w_alone), "during_flood": summary(&w_during), "p99_ratio": ratio})
        };
        let finished = self.sent.keys().filter(|k| self.run.results.contains_key(k)).count();
        let not_ok = self.sent.keys().filter(|k| self.run.results.get(k).is_some_and(|g| !g.ok)).count();
        let dup = self.sent.keys().filter(|k| self.run.results.get(k).is_some_and(|g| g.results > 1)).count();
        let heavy_jobs = self.of(Kind::Heavy).count();
        json!({
            "bench": "tenants", "registered": a.tenants, "heavy": a.heavy, "free_accounts": a.free_accounts,
            "free_active": a.free_active, "new_tenants": a.new_tenants, "workers": a.workers,
            "policy": if a.fifo { "fifo" } else { "fair" },
            "light": group(Kind::Light), "free": group(Kind::Free), "new": group(Kind::New),
            "flood": {
                "jobs": a.flood, "ms": a.flood_ms, "drained_s": round2((drained_at - flood_at) as f64 / 1000.0),
                "share_of_jobs": round2(heavy_jobs as f64 / self.sent.len().max(1) as f64),
            },
            "jobs": {
                "submitted": self.sent.len(), "finished": finished, "lost": self.sent.len() - finished,
                "not_succeeded": not_ok, "duplicated": dup,
            },
        })
    }

    fn of(&self, kind: Kind) -> impl Iterator<Item = (&Sent, Option<&Got>)> + '_ {
        self.sent.iter().filter(move |(_, s)| s.kind == kind).map(|(k, s)| (s, self.run.results.get(k)))
    }

    /// Waits (ms, sorted) of `kind`'s jobs submitted in `[from, to)`; a job without a
    /// result counts until now (a lower bound).
    fn waits(&self, kind: Kind, (from, to): (i64, i64)) -> Vec<i64> {
        let now = now_ms();
        let mut w: Vec<i64> = self
            .of(kind)
            .filter(|(s, _)| s.at >= from && s.at < to)
            .map(|(s, g)| g.and_then(|g| g.started_at).unwrap_or(now) - s.at)
            .collect();
        w.sort_unstable();
        w
    }
}

fn summary(w: &[i64]) -> Value {
    json!({"jobs": w.len(), "p50_ms": pct(w, 0.5), "p99_ms": pct(w, 0.99), "max_ms": w.last()})
}

/// `fairway_job_wait_seconds` (sum, count) per stage, from this process's recorder.
fn stage_means(handle: Option<&metrics_exporter_prometheus::PrometheusHandle>) -> BTreeMap<String, (f64, f64)> {
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let Some(text) = handle.map(|h| h.render()) else { return out };
    let prefix = fairway::metrics::JOB_WAIT_SECONDS;
    for line in text.lines().filter(|l| l.starts_with(prefix)) {
        let Some((name, value)) = line.rsplit_once(' ') else { continue };
        let Some(stage) = name.split("stage=\"").nth(1).and_then(|s| s.split('"').next()) else { continue };
        let v: f64 = value.parse().unwrap_or(0.0);
        let e = out.entry(stage.to_string()).or_default();
        if name.starts_with(&format!("{prefix}_sum")) {
            e.0 += v;
        } else if name.starts_with(&format!("{prefix}_count")) {
            e.1 += v;
        }
    }
    out
}

/// Mean wait per stage (ms) of the jobs recorded between two snapshots.
fn stage_delta(before: &BTreeMap<String, (f64, f64)>, after: &BTreeMap<String, (f64, f64)>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(stage, (sum, count))| {
            let (s0, c0) = before.get(stage).copied().unwrap_or_default();
            (stage.clone(), round2((sum - s0) * 1000.0 / (count - c0).max(1.0)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> TenantsArgs {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: TenantsArgs,
        }
        <P as clap::Parser>::parse_from(std::iter::once("x").chain(extra.iter().copied())).a
    }

    #[test]
    fn the_plan_has_every_population_once_per_job() {
        let a = args(&[
            "--tenants",
            "110",
            "--heavy",
            "10",
            "--light-jobs",
            "2",
            "--free-accounts",
            "1000",
            "--free-active",
            "20",
            "--new-tenants",
            "5",
        ]);
        let plan = trickle_plan(&a);
        let count = |k| plan.iter().filter(|(_, kind)| *kind == k).count();
        // 100 light tenants: the even ones submit once, the odd ones twice.
        assert_eq!((count(Kind::Light), count(Kind::Free), count(Kind::New)), (150, 20, 5));
        let free: HashSet<&String> = plan.iter().filter(|(_, k)| *k == Kind::Free).map(|(n, _)| n).collect();
        assert_eq!(free.len(), 20, "distinct free accounts");
        assert!(free.contains(&"free-00950".to_string()), "spread over all the accounts");
    }

    #[test]
    fn nearest_rank_percentiles() {
        let w: Vec<i64> = (1..=100).collect();
        assert_eq!((pct(&w, 0.5), pct(&w, 0.99), pct(&[], 0.99)), (Some(50), Some(99), None));
    }

    #[test]
    fn stage_means_read_the_histogram_sums() {
        let before: BTreeMap<String, (f64, f64)> = [("queue".to_string(), (1.0, 10.0))].into();
        let after: BTreeMap<String, (f64, f64)> = [("queue".to_string(), (3.0, 30.0))].into();
        assert_eq!(stage_delta(&before, &after)["queue"], 100.0);
    }
}
