//! `fairway-bench bench flood`: fairness beyond the worker's buffer. One tenant floods far more
//! jobs than a worker buffers (`worker.tenant_queue_limit`); quiet tenants that hash to
//! the flooder's Kafka partition and quiet tenants on other partitions each submit one
//! echo job every `--quiet-every`. Printed per mode (`spill`: the flood's excess spills to
//! the store; `pause`: `worker.spill_backlogs = false`, the partition pauses as a plain
//! consumer's would): the quiet tenants' waits (started_at - submitted_at) on the
//! flooder's partition and on the others, their p99 ratio, and the flooder's throughput.
//! Last line JSON.

use super::Global;
use anyhow::Context;
use fairway::config::Config;
use fairway::handlers::Registry;
use fairway::kafka::Producer;
use fairway::kafka::{self, Consumer, Message};
use fairway::model::{JobResult, JobSubmitted, Pool};
use fairway::worker::{Policy, Worker};
use fairway::{codec, now_ms};
use futures::StreamExt;
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

#[derive(clap::Args, Debug, Clone)]
pub struct FloodArgs {
    /// Sleep jobs the flooding tenant produces at once.
    #[arg(long, default_value_t = 150_000)]
    pub flood: usize,
    /// Run time of one flood job, ms.
    #[arg(long, default_value_t = 20)]
    pub flood_ms: u64,
    /// Standard-tier tenants registered (t00 floods; quiet ones are picked among the rest).
    #[arg(long, default_value_t = 30)]
    pub tenants: usize,
    /// Quiet tenants on the flooder's partition, and on other partitions.
    #[arg(long, default_value_t = 3)]
    pub quiet_same: usize,
    #[arg(long, default_value_t = 3)]
    pub quiet_other: usize,
    /// Each quiet tenant submits one echo job this often.
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    pub quiet_every: Duration,
    /// How long the quiet tenants submit (the measured window ends here).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Left out of the measurement at the start (the flood is still being produced).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Most time to wait after the window for the quiet tenants' last results.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    #[arg(long, default_value_t = 64)]
    pub slots: usize,
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// The worker's per-tenant buffer (`worker.tenant_queue_limit`).
    #[arg(long, default_value_t = 10_000)]
    pub buffer: usize,
    /// Modes to run, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "spill,pause")]
    pub modes: Vec<FloodMode>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FloodMode {
    /// Spill the flood's excess to the store (the default behaviour).
    Spill,
    /// Pause the flooder's partition when its buffer is full (`spill_backlogs = false`).
    Pause,
}

impl FloodMode {
    fn as_str(self) -> &'static str {
        match self {
            FloodMode::Spill => "spill",
            FloodMode::Pause => "pause",
        }
    }
}

/// Decoded results of a run's results topic with their arrival time, until stopped.
pub(super) struct ResultFeed {
    pub rx: mpsc::UnboundedReceiver<(JobResult, i64)>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl ResultFeed {
    pub fn start(cfg: &Config) -> anyhow::Result<Self> {
        let reader = kafka::reader(cfg, &cfg.group("bench-results"), false)?;
        reader.subscribe(&[&cfg.results_topic()])?;
        let (tx, rx) = mpsc::unbounded_channel();
        let (stop, mut stop_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            // A record is passed on once: a reader whose group session lapsed (a broker
            // restart) rejoins without commits and reads the topic from the start again.
            let mut seen = std::collections::HashSet::new();
            loop {
                tokio::select! {
                    _ = stop_rx.changed() => break,
                    m = reader.recv() => {
                        let Ok(m) = m else { continue };
                        if !seen.insert((m.partition(), m.offset())) {
                            continue;
                        }
                        if let Some(r) = m.payload().and_then(|b| codec::decode_result(b).ok()) {
                            if tx.send((r, now_ms())).is_err() {
                                break;
                            }
                        }
                    }
                }
            }
        });
        Ok(ResultFeed { rx, stop, task })
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

pub async fn run(g: &Global, a: FloodArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.tenants > a.quiet_same + a.quiet_other, "--tenants must exceed the quiet tenants");
    anyhow::ensure!(a.warmup < a.duration, "--warmup must be shorter than --duration");
    let base = g.load()?;
    let mut modes = serde_json::Map::new();
    let mut complete = true;
    for mode in &a.modes {
        eprintln!("== {} (flood {} x {} ms, buffer {})", mode.as_str(), a.flood, a.flood_ms, a.buffer);
        let out = run_mode(&base, &a, *mode).await?;
        complete &= out.missing == 0;
        let js = out.report(&a);
        eprintln!("   {js}");
        modes.insert(mode.as_str().into(), js);
    }
    let mut summary = serde_json::json!({
        "bench": "flood", "flood": a.flood, "flood_ms": a.flood_ms, "buffer": a.buffer,
        "slots": a.slots, "partitions": a.partitions, "modes": modes,
    });
    let get = |m: &str, path: &[&str]| path.iter().fold(&summary["modes"][m], |v, k| &v[*k]).as_f64();
    let tput = (get("spill", &["flood_jobs_per_sec"]), get("pause", &["flood_jobs_per_sec"]));
    let p99 = (get("spill", &["same_partition", "p99_ms"]), get("spill", &["other_partitions", "p99_ms"]));
    if let (Some(s), Some(p)) = tput {
        summary["flood_throughput_spill_vs_pause"] = round2(s / p.max(1e-9)).into();
    }
    if let (Some(s), Some(o)) = p99 {
        summary["goal_met"] = (s <= 2.0 * o || s <= o + 50.0).into();
    }
    println!("{summary}");
    Ok(if complete { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

struct Outcome {
    /// Quiet waits (ms) of jobs submitted in the window, sorted: on the flooder's
    /// partition, on others. Jobs without a result count up to the end (a lower bound).
    same: Vec<i64>,
    other: Vec<i64>,
    missing: usize,
    flood_done_in_window: usize,
    window_ms: i64,
    max_spilled: u64,
    same_tenants: usize,
    /// The worker's spill counters at the end of the window (`SpillCounters`).
    spill: serde_json::Value,
}

impl Outcome {
    fn report(&self, a: &FloodArgs) -> serde_json::Value {
        let waits = |w: &[i64]| serde_json::json!({"jobs": w.len(), "p50_ms": pct(w, 0.5), "p99_ms": pct(w, 0.99), "max_ms": w.last()});
        let ratio = match (pct(&self.same, 0.99), pct(&self.other, 0.99)) {
            (Some(s), Some(o)) => serde_json::json!(round2(s as f64 / (o as f64).max(1.0))),
            _ => serde_json::Value::Null,
        };
        let per_sec = self.flood_done_in_window as f64 * 1000.0 / self.window_ms.max(1) as f64;
        serde_json::json!({
            "same_partition": waits(&self.same), "other_partitions": waits(&self.other),
            "p99_ratio_same_vs_other": ratio, "quiet_tenants_on_flood_partition": self.same_tenants,
            "quiet_missing": self.missing, "flood_jobs_per_sec": per_sec.round(),
            "flood_capacity_per_sec": (a.slots as f64 * 1000.0 / a.flood_ms.max(1) as f64).round(),
            "max_spilled": self.max_spilled, "spill": self.spill,
        })
    }
}

fn bench_config(base: &Config, a: &FloodArgs, mode: FloodMode) -> anyhow::Result<Arc<Config>> {
    let mut cfg = base.clone();
    cfg.kafka.topic_prefix = format!("floodbench{}-{}.", now_ms(), mode.as_str());
    cfg.kafka.partitions = a.partitions;
    cfg.scylla.keyspace = "fairway_bench".into();
    cfg.worker.tenant_queue_limit = a.buffer;
    cfg.worker.spill_backlogs = mode == FloodMode::Spill;
    let short = cfg.pools.entry(Pool::Short).or_insert_with(|| fairway::config::PoolConfig::default_for(Pool::Short));
    short.slots = a.slots;
    cfg.tenants.clear();
    for i in 0..a.tenants {
        let t = fairway::config::TenantConfig { tier: fairway::config::Tier::Standard, ..Default::default() };
        cfg.tenants.insert(tenant(i), t);
    }
    super::bench::add_bench_job_types(&mut cfg)?;
    cfg.validate()?;
    Ok(Arc::new(cfg))
}

fn tenant(i: usize) -> String {
    format!("t{i:02}")
}

pub(super) fn record(tenant: &str, job_type: &str, payload: serde_json::Value) -> JobSubmitted {
    let payload = serde_json::to_vec(&payload).expect("json");
    let id = uuid::Uuid::now_v7().to_string();
    JobSubmitted {
        pool: Some(Pool::Short),
        ..JobSubmitted::original(id, tenant.into(), job_type.into(), payload, now_ms())
    }
}

/// Produces a job record keyed by its tenant; returns its partition.
pub(super) async fn produce(producer: &Producer, topic: &str, rec: &JobSubmitted) -> anyhow::Result<i32> {
    let bytes = codec::encode_job(rec)?;
    Ok(kafka::send(producer, topic, &rec.tenant, &bytes).await?.0)
}

async fn run_mode(base: &Config, a: &FloodArgs, mode: FloodMode) -> anyhow::Result<Outcome> {
    let cfg = bench_config(base, a, mode)?;
    kafka::ensure_topics(&cfg).await.context("creating bench topics (scripts/services up?)")?;
    fairway::store::ensure_schema(&cfg).await?;
    fairway::ops::tenants::seed(&cfg).await?;
    let mut feed = ResultFeed::start(&cfg)?;
    let registry = Registry::from_config(&cfg, Default::default()).map_err(anyhow::Error::msg)?;
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await?;
    if !worker.wait_assigned(Duration::from_secs(60)).await {
        worker.stop().await;
        anyhow::bail!("the worker got no partitions within 60 s");
    }
    let producer = kafka::producer(&cfg)?;
    let topic = cfg.pool_topic(Pool::Short);
    let partition_of = warm_up(a, &producer, &topic, &mut feed).await?;
    let flood_p = partition_of[&tenant(0)];
    let pick = |same: bool, n: usize| -> Vec<String> {
        (1..a.tenants).map(tenant).filter(|t| (partition_of[t] == flood_p) == same).take(n).collect()
    };
    let (same, other) = (pick(true, a.quiet_same), pick(false, a.quiet_other));
    if same.is_empty() {
        eprintln!("   warning: no tenant but t00 hashes to partition {flood_p}; raise --tenants");
    }

    let t0 = now_ms();
    let end_at = Instant::now() + a.duration;
    let flood = tokio::spawn(produce_flood(producer.clone(), topic.clone(), a.flood, a.flood_ms));
    let quiet: Vec<_> = same
        .iter()
        .chain(&other)
        .enumerate()
        .map(|(i, t)| {
            let phase = a.quiet_every.mul_f64(i as f64 / (same.len() + other.len()) as f64);
            tokio::spawn(quiet_tenant(producer.clone(), topic.clone(), t.clone(), a.quiet_every, phase, end_at))
        })
        .collect();
    let mut results: HashMap<String, JobResult> = HashMap::new();
    let mut max_spilled = 0u64;
    let mut spill = serde_json::Value::Null;
    while Instant::now() < end_at {
        drain(&mut feed, &mut results, Duration::from_millis(200)).await;
        let pool = worker.shared[0].stats.lock().map(|s| s["pool"].clone()).unwrap_or_default();
        max_spilled = max_spilled.max(pool["spilled"].as_u64().unwrap_or(0));
        spill = pool["spill"].clone();
    }
    let mut quiet_jobs: Vec<(String, String, i64)> = Vec::new();
    for q in quiet {
        quiet_jobs.extend(q.await??);
    }
    flood.await??;
    let deadline = Instant::now() + a.drain_timeout;
    while quiet_jobs.iter().any(|(id, _, _)| !results.contains_key(id)) && Instant::now() < deadline {
        drain(&mut feed, &mut results, Duration::from_millis(500)).await;
    }
    let stopped = now_ms();
    feed.stop().await;
    worker.stop().await;

    let from = t0 + a.warmup.as_millis() as i64;
    let window_end = t0 + a.duration.as_millis() as i64;
    let waits = |group: &[String]| {
        let mut w: Vec<i64> = quiet_jobs
            .iter()
            .filter(|(_, t, at)| group.contains(t) && *at >= from)
            .map(|(id, _, at)| match results.get(id).and_then(|r| r.started_at) {
                Some(s) => s - at,
                None => stopped - at,
            })
            .collect();
        w.sort_unstable();
        w
    };
    let flood_done_in_window = results
        .values()
        .filter(|r| {
            r.tenant == tenant(0) && r.job_type == "sleep" && r.finished_at >= from && r.finished_at <= window_end
        })
        .count();
    Ok(Outcome {
        same: waits(&same),
        other: waits(&other),
        missing: quiet_jobs.iter().filter(|(id, _, _)| !results.contains_key(id)).count(),
        flood_done_in_window,
        window_ms: window_end - from,
        max_spilled,
        same_tenants: same.len(),
        spill,
    })
}

/// One echo job per tenant through the whole path (warm connections and statements);
/// their delivery reports tell each tenant's partition.
async fn warm_up(
    a: &FloodArgs,
    producer: &Producer,
    topic: &str,
    feed: &mut ResultFeed,
) -> anyhow::Result<HashMap<String, i32>> {
    let mut partition_of = HashMap::new();
    let mut ids = Vec::new();
    for i in 0..a.tenants {
        let rec = record(&tenant(i), "echo", serde_json::json!({}));
        partition_of.insert(tenant(i), produce(producer, topic, &rec).await?);
        ids.push(rec.job_id);
    }
    let mut results = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while ids.iter().any(|id| !results.contains_key(id)) {
        anyhow::ensure!(Instant::now() < deadline, "warm-up jobs got no results within 60 s");
        drain(feed, &mut results, Duration::from_millis(200)).await;
    }
    Ok(partition_of)
}

/// Receives results for up to `wait`.
async fn drain(feed: &mut ResultFeed, results: &mut HashMap<String, JobResult>, wait: Duration) {
    let until = tokio::time::Instant::now() + wait;
    while let Ok(Some((r, _))) = tokio::time::timeout_at(until, feed.rx.recv()).await {
        results.insert(r.job_id.clone(), r);
    }
}

/// The flood: `n` sleep jobs of t00, produced in order as fast as the broker takes them.
async fn produce_flood(producer: Producer, topic: String, n: usize, ms: u64) -> anyhow::Result<()> {
    let recs: Vec<JobSubmitted> =
        (0..n).map(|_| record(&tenant(0), "sleep", serde_json::json!({ "ms": ms }))).collect();
    let mut errors = 0usize;
    let mut sends = futures::stream::iter(recs.into_iter().map(|r| {
        let (producer, topic) = (producer.clone(), topic.clone());
        async move { produce(&producer, &topic, &r).await }
    }))
    .buffered(1024);
    while let Some(r) = sends.next().await {
        errors += usize::from(r.is_err());
    }
    anyhow::ensure!(errors == 0, "{errors} flood records could not be produced");
    Ok(())
}

/// A quiet tenant: one echo job every `every` until `end_at`; returns (job id, tenant,
/// submitted at).
async fn quiet_tenant(
    producer: Producer,
    topic: String,
    t: String,
    every: Duration,
    phase: Duration,
    end_at: Instant,
) -> anyhow::Result<Vec<(String, String, i64)>> {
    tokio::time::sleep(phase).await;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    loop {
        tick.tick().await;
        if Instant::now() >= end_at {
            return Ok(out);
        }
        let rec = record(&t, "echo", serde_json::json!({}));
        produce(&producer, &topic, &rec).await?;
        out.push((rec.job_id, t.clone(), rec.submitted_at));
    }
}

/// The `q` quantile of sorted values (nearest rank); None when there are none.
pub(super) fn pct(sorted: &[i64], q: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i])
}

pub(super) fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
