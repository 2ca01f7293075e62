//! `fairway-bench bench throughput`: end-to-end no-op jobs on the local services; prints
//! jobs/s and latency percentiles (submit -> terminal result), last line JSON.
//!
//! `fairway-bench bench fairness`: the noisy-neighbour benchmark on the local services (see
//! [`fairness`]): quiet tenants' waits under a flood with fair scheduling and with FIFO
//! versus alone, and slot-time shares of continuously backlogged tenants versus their
//! entitlement; last line JSON.

use super::Global;
use anyhow::Context;
use fairway::config::Config;
use fairway::handlers::Registry;
use fairway::kafka::{self, Consumer, Message};
use fairway::model::Pool;
use fairway::store::RequestCounts;
use fairway::submit::{NewJob, Payload, Submitter};
use fairway::worker::{Policy, Worker};
use fairway::{codec, now_ms};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchKind,
}

#[derive(clap::Subcommand, Debug)]
pub enum BenchKind {
    /// No-op jobs end to end: jobs/s and latency percentiles.
    Throughput(ThroughputArgs),
    /// Noisy neighbour: quiet tenants' waits under a flood (fair vs FIFO vs alone) and
    /// slot-time shares of backlogged tenants versus entitlement.
    Fairness(FairnessArgs),
    /// Fairness beyond the buffer: a flood far larger than a worker buffers, quiet tenants
    /// on the flooder's partition and on others (spill vs pause).
    Flood(super::bench_flood::FloodArgs),
    /// The tenants registry at scale: register N tenants, load them, time changes reaching a live view.
    Registry(super::bench_registry::RegistryArgs),
    /// Limits never silent at scale: N tenants' refusal counts read and turned into limit alerts, a dependency breaker's sum over their cells.
    Limits(super::bench_limits::LimitsArgs),
    /// The fault suite: worker processes killed (-9) and restarted, a CQL restart, poison
    /// and malformed messages; counts lost jobs, duplicate results and jobs run twice.
    Faults(super::bench_faults::FaultsArgs),
    /// The submit path: produce only vs produce + the job's queued row (issue 15).
    Submit(super::bench_submit::SubmitBenchArgs),
    /// No-op `process` jobs (a child process each) end to end: jobs/s and CPU per job.
    Process(super::bench_process::ProcessArgs),
    /// Network partitions: a worker cut off from the broker, the store or both (a network
    /// namespace; root needed); counts lost, duplicated and re-run jobs, time to recover.
    Partitions(super::bench_partitions::PartitionsArgs),
    /// The blast radius: tenant A attacks `fairway serve` (batch floods, failing jobs,
    /// scheduled jobs, streams) while tenant B submits; peak RSS, B's answers. JSON.
    Blast(super::bench_blast::BlastArgs),
    /// Open loop: no-op jobs arriving at fixed rates; p99 submission-to-dispatch per rate
    /// and the highest rate within the objective (`max_rate_within_slo`). JSON.
    Slo(super::bench_slo::SloArgs),
    /// Delayed and scheduled jobs on time: lateness of jobs with `execute_at` arriving at
    /// fixed rates (BullMQ's `DELAYED=1`), and the fire lag of many schedules. JSON.
    Delayed(super::bench_delayed::DelayedArgs),
    /// The seed's scale: 10,000 registered tenants with a 100x skew plus row-less free
    /// accounts; light tenants' waits alone and under a heavy flood, jobs lost, registry
    /// change delays, the database's CPU and peak RSS. JSON.
    Tenants(super::bench_tenants::TenantsArgs),
    /// One tenant on the whole fleet and the fair share across it: one tenant alone on
    /// N workers, weights 1:3 both flooding, 30 tenants' spread, quiet tenants beside a
    /// spread flooder. JSON.
    Fleet(super::bench_fleet::FleetArgs),
}

/// The deployment a no-op bench runs on: in-process workers of the short pool.
#[derive(clap::Args, Debug)]
pub struct Shape {
    /// In-process worker members.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Slots of the short pool per worker.
    #[arg(long, default_value_t = 256)]
    pub slots: usize,
    #[arg(long, default_value_t = 12)]
    pub partitions: i32,
}

#[derive(clap::Args, Debug)]
pub struct ThroughputArgs {
    /// Jobs in the run, 1 to 10,000,000 (`MAX_JOBS`; the results' ids and finish times are kept).
    #[arg(long, default_value_t = 20_000)]
    pub jobs: usize,
    #[command(flatten)]
    pub shape: Shape,
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Submit every job first, then start the workers (as BullMQ's harness measures:
    /// `addBulk` with the workers idle, then processing alone). Without it, submission
    /// and processing overlap and the rate is end to end.
    #[arg(long)]
    pub preload: bool,
    /// After the last result, keep counting the services' CPU this long (the database
    /// flushes and compacts after the writes); reported as `cpu_s_per_1000_jobs_with_tail`.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub cpu_tail: Duration,
    /// Bytes of each job's payload, 0 to 262,144 (`MAX_PAYLOAD_BYTES`): a JSON string of
    /// that length less its quotes (0: no payload). Larger jobs fill the consumers' local
    /// queues sooner.
    #[arg(long, default_value_t = 0)]
    pub payload_bytes: usize,
}

pub async fn run(g: &Global, a: BenchArgs) -> anyhow::Result<ExitCode> {
    match a.what {
        BenchKind::Throughput(t) => throughput(g, t).await,
        BenchKind::Fairness(f) => fairness(g, f).await,
        BenchKind::Flood(f) => super::bench_flood::run(g, f).await,
        BenchKind::Registry(r) => super::bench_registry::run(g, r).await,
        BenchKind::Limits(l) => super::bench_limits::run(g, l).await,
        BenchKind::Faults(f) => super::bench_faults::run(g, f).await,
        BenchKind::Submit(s) => super::bench_submit::run(g, s).await,
        BenchKind::Process(p) => super::bench_process::run(g, p).await,
        BenchKind::Partitions(p) => super::bench_partitions::run(g, p).await,
        BenchKind::Blast(b) => super::bench_blast::run(g, b).await,
        BenchKind::Slo(s) => super::bench_slo::run(g, s).await,
        BenchKind::Delayed(d) => super::bench_delayed::run(g, d).await,
        BenchKind::Tenants(t) => super::bench_tenants::run(g, t).await,
        BenchKind::Fleet(f) => super::bench_fleet::run(g, f).await,
    }
}

/// Most jobs one throughput run takes (`--jobs`): its buffers are sized by it.
const MAX_JOBS: usize = 10_000_000;
/// Largest payload of a throughput run's jobs (`--payload-bytes`).
const MAX_PAYLOAD_BYTES: usize = 256 * 1024;

/// A payload of `bytes` bytes: a JSON string of `x`s (none for 0 or 1).
fn padding(bytes: usize) -> Payload {
    match bytes {
        0 | 1 => Payload::default(),
        n => Payload::text(format!("\"{}\"", "x".repeat(n - 2))),
    }
}

/// `fairway-bench bench throughput`: no-op jobs through in-process workers on the local
/// services, as fast as they go: jobs/s (end to end, to the last job settled, and
/// processing alone from the first start to the last finish, read from the results
/// afterwards), latency, and CPU per 1,000 jobs per process while they ran.
async fn throughput(g: &Global, a: ThroughputArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!((1..=MAX_JOBS).contains(&a.jobs), "--jobs: give 1 to {MAX_JOBS} jobs, e.g. --jobs 60000");
    anyhow::ensure!(
        a.payload_bytes <= MAX_PAYLOAD_BYTES,
        "--payload-bytes: give 0 to {MAX_PAYLOAD_BYTES} bytes, e.g. --payload-bytes 2048"
    );
    let cfg = bench_config(g, &a.shape)?;
    let payload = padding(a.payload_bytes);
    kafka::ensure_topics(&cfg).await.context("creating bench topics (scripts/services up?)")?;
    fairway::store::ensure_schema(&cfg).await?;
    fairway::ops::tenants::seed(&cfg).await?;
    let sub = Submitter::new(cfg.clone(), None)?;
    let probe = super::bench_cpu::CpuProbe::local();
    let store = fairway::store::Store::open(&cfg).await?;
    let requests_at_start = request_counts(&store).await;
    let preloaded = if a.preload {
        Some(submit_noops(&cfg, &sub, ("echo", &payload), a.jobs, Instant::now()).await?)
    } else {
        None
    };
    let requests_preloaded = request_counts(&store).await;
    let workers = start_workers(&cfg, a.shape.workers).await?;
    let cpu_before = probe.snapshot();
    let t0 = Instant::now();
    // Jobs settled before the clock started (timed from the assignment, within 1 ms).
    let settled_before = workers.iter().map(Worker::settled).sum::<u64>();
    // The workers' own count says when every job is settled (as BullMQ's harness counts
    // its workers' `completed` events): no results reader competes for the CPU meanwhile.
    let (submitted, settle_marks) = match preloaded {
        Some(took) => (Ok(took), wait_settled(&workers, a.jobs, a.timeout).await),
        None => tokio::join!(
            submit_noops(&cfg, &sub, ("echo", &payload), a.jobs, t0),
            wait_settled(&workers, a.jobs, a.timeout)
        ),
    };
    let settled_after = t0.elapsed();
    let cpu_after = probe.snapshot();
    for w in workers {
        w.stop().await;
    }
    tokio::time::sleep(a.cpu_tail).await;
    let cpu_after_tail = probe.snapshot();
    // Without a preload the submissions overlap the processing and count with it.
    let requests_at_start = requests_at_start.filter(|_| a.preload);
    let requests = StoreRequests::between(requests_at_start, requests_preloaded, request_counts(&store).await);
    // Then every result is read back: the processing window and latencies come from the
    // results' own timestamps, and a missing result fails the run.
    let (rcfg, topic) = (cfg.clone(), cfg.results_topic());
    let reader =
        tokio::task::spawn_blocking(move || kafka::reader_from_start(&rcfg, &rcfg.group("bench-results"), &topic))
            .await?
            .map_err(|e| anyhow::anyhow!("reading the results back: {e}"))?;
    let mut seen = collect_latencies(&reader, a.jobs, a.timeout, t0).await;
    seen.elapsed = settled_after;
    let cpu = super::bench_cpu::per_thousand_jobs(&cpu_before, &cpu_after, seen.done);
    let cpu_tail = super::bench_cpu::per_thousand_jobs(&cpu_before, &cpu_after_tail, seen.done);
    report_throughput(&a, submitted?, &seen, (cpu, cpu_tail), requests, (&settle_marks, settled_before));
    drop_topics(&cfg).await;
    Ok(if seen.done == a.jobs { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Waits until the workers have settled `n` jobs between them, or `timeout` passed;
/// answers when the first job and each further tenth of them had settled (ms from the
/// call), so a slow start or a long tail shows beside the rate.
async fn wait_settled(workers: &[Worker], n: usize, timeout: Duration) -> Vec<u64> {
    let (start, deadline) = (Instant::now(), Instant::now() + timeout);
    let mut marks = Vec::with_capacity(11);
    loop {
        let settled = workers.iter().map(Worker::settled).sum::<u64>();
        while marks.len() < 11 && settled >= ((marks.len() as u64).saturating_mul(n as u64) / 10).max(1) {
            marks.push(start.elapsed().as_millis() as u64);
        }
        if settled >= n as u64 || Instant::now() >= deadline {
            return marks;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

pub(super) async fn start_workers(cfg: &Arc<Config>, n: usize) -> anyhow::Result<Vec<Worker>> {
    let registry = Registry::from_config(cfg, Default::default()).map_err(anyhow::Error::msg)?;
    let mut workers = Vec::new();
    for _ in 0..n.max(1) {
        workers.push(Worker::start(cfg.clone(), &[Pool::Short], registry.clone(), Policy::Fair).await?);
    }
    for w in &workers {
        w.wait_assigned(Duration::from_secs(60)).await;
    }
    Ok(workers)
}

/// The database's request counts, or why they could not be read (printed once).
async fn request_counts(store: &fairway::store::Store) -> Option<RequestCounts> {
    match store.request_counts().await {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("store requests per job not measured: {e}");
            None
        }
    }
}

/// Store requests a run cost: while its jobs were submitted (a preloaded run's), and
/// while the workers processed them (through the CPU tail, so the last packs count).
struct StoreRequests {
    submit: Option<RequestCounts>,
    process: Option<RequestCounts>,
}

impl StoreRequests {
    fn between(start: Option<RequestCounts>, preloaded: Option<RequestCounts>, end: Option<RequestCounts>) -> Self {
        StoreRequests {
            submit: start.zip(preloaded).map(|(s, p)| p.since(s)),
            process: preloaded.zip(end).map(|(p, e)| e.since(p)),
        }
    }

    /// Reads, writes and scans per job, as JSON (null when not measured).
    fn per_job(counts: Option<RequestCounts>, jobs: usize) -> serde_json::Value {
        let per = |n: i64| ((n as f64 / jobs.max(1) as f64) * 10_000.0).round() / 10_000.0;
        counts.map_or(
            serde_json::Value::Null,
            |c| serde_json::json!({ "reads": per(c.reads), "writes": per(c.writes), "scans": per(c.scans) }),
        )
    }
}

/// The human lines, then one JSON line.
fn report_throughput(
    a: &ThroughputArgs,
    submit_time: Duration,
    seen: &Seen,
    (cpu, cpu_tail): (BTreeMap<&'static str, f64>, BTreeMap<&'static str, f64>),
    requests: StoreRequests,
    (settle_marks, settled_before): (&[u64], u64),
) {
    let (done, hist) = (seen.done, &seen.latency_ms);
    let rate = done as f64 / seen.elapsed.as_secs_f64();
    let process_rate = seen.processing_rate();
    let mode = if a.preload { "preloaded" } else { "submit and process together" };
    let Shape { workers, slots, partitions } = &a.shape;
    println!("jobs {done}/{}  workers {workers}  slots {slots}  partitions {partitions}  ({mode})", a.jobs);
    println!("submitted in {:.2}s ({:.0}/s)", submit_time.as_secs_f64(), a.jobs as f64 / submit_time.as_secs_f64());
    println!("end to end: {:.0} jobs/s over {:.2}s", rate, seen.elapsed.as_secs_f64());
    println!("processing (first start to last finish): {process_rate:.0} jobs/s");
    println!(
        "latency ms: p50 {}  p90 {}  p99 {}  max {}",
        hist.value_at_quantile(0.5),
        hist.value_at_quantile(0.9),
        hist.value_at_quantile(0.99),
        hist.max()
    );
    println!("cpu seconds per 1,000 jobs: {cpu:?}; with {:?} after: {cpu_tail:?}", a.cpu_tail);
    let (submit_requests, process_requests) =
        (StoreRequests::per_job(requests.submit, done), StoreRequests::per_job(requests.process, done));
    println!("store requests per job: submitting {submit_requests}, processing {process_requests}");
    println!(
        "settled (ms from the start): first job, then each tenth: {settle_marks:?}; before the start: {settled_before}"
    );
    let finished_tenths = seen.finished_ms_each_tenth();
    println!("finished (ms from the first start), each tenth: {finished_tenths:?}");
    println!(
        "{}",
        serde_json::json!({
            "bench": "throughput", "jobs": done, "preload": a.preload, "payload_bytes": a.payload_bytes,
            "jobs_per_sec": rate.round(), "process_jobs_per_sec": process_rate.round(),
            "p50_ms": hist.value_at_quantile(0.5), "p99_ms": hist.value_at_quantile(0.99), "max_ms": hist.max(),
            "cpu_s_per_1000_jobs": cpu, "cpu_s_per_1000_jobs_with_tail": cpu_tail,
            "cpu_tail_s": a.cpu_tail.as_secs_f64(),
            "store_requests_per_job": { "submit": submit_requests, "process": process_requests },
            "settled_ms_first_then_each_tenth": settle_marks, "settled_before_start": settled_before,
            "finished_ms_each_tenth": finished_tenths,
        })
    );
}

/// The throughput run's results as read back.
pub(super) struct Seen {
    pub done: usize,
    /// Submission to finish, ms.
    pub latency_ms: hdrhistogram::Histogram<u64>,
    /// From the start of the run to the last result read (the throughput bench: to the
    /// last job settled).
    pub elapsed: Duration,
    /// Earliest start and latest finish among the results (epoch ms).
    first_start: Option<i64>,
    last_finish: Option<i64>,
    /// Every result's finish (epoch ms), for the ramp of the processing window.
    finishes: Vec<i64>,
}

impl Seen {
    /// Jobs per second from the first job's start to the last one's finish (what
    /// BullMQ's harness reports as `process_jobs_per_s`).
    pub fn processing_rate(&self) -> f64 {
        match (self.first_start, self.last_finish) {
            (Some(a), Some(b)) if b > a => self.done as f64 / ((b - a) as f64 / 1000.0),
            _ => 0.0,
        }
    }

    /// When each further tenth of the jobs had finished, ms from the first start: a slow
    /// ramp shows as a long first step.
    pub fn finished_ms_each_tenth(&self) -> Vec<i64> {
        let Some(start) = self.first_start else { return Vec::new() };
        let mut finishes = self.finishes.clone();
        finishes.sort_unstable();
        let n = finishes.len();
        (1..=10).filter_map(|k| finishes.get((k * n).div_ceil(10).max(1) - 1)).map(|f| f - start).collect()
    }
}

/// Deletes a bench run's topics once it is done (see `kafka::delete_topics`); a failure
/// only warns (the run's figures stand).
pub(super) async fn drop_topics(cfg: &Config) {
    if let Err(e) = kafka::delete_topics(cfg).await {
        eprintln!("warning: the bench's topics ({}*) were not deleted: {e}", cfg.kafka.topic_prefix);
    }
}

/// The configured deployment, on fresh bench topics with the requested shape.
pub(super) fn bench_config(g: &Global, shape: &Shape) -> anyhow::Result<Arc<Config>> {
    let mut cfg = (*g.load()?).clone();
    cfg.kafka.topic_prefix = format!("bench{}.", now_ms());
    cfg.kafka.partitions = shape.partitions;
    cfg.scylla.keyspace = "fairway_bench".into();
    if let Some(p) = cfg.pools.get_mut(&Pool::Short) {
        p.slots = shape.slots;
    }
    Ok(Arc::new(cfg))
}

/// Submits `n` no-op jobs of a job type with a payload, round-robin over the configured
/// tenants, 2,000 at a time; returns how long that took.
pub(super) async fn submit_noops(
    cfg: &Config,
    sub: &Submitter,
    (job_type, payload): (&str, &Payload),
    n: usize,
    t0: Instant,
) -> anyhow::Result<Duration> {
    let tenants: Vec<&String> = cfg.tenants.keys().collect();
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| NewJob {
            tenant: tenants[i % tenants.len()].clone(),
            job_type: job_type.into(),
            payload: payload.clone(),
            ..Default::default()
        })
        .collect();
    for chunk in jobs.chunks(2000) {
        for r in futures::future::join_all(chunk.iter().map(|j| sub.submit(j))).await {
            r?;
        }
    }
    Ok(t0.elapsed())
}

/// Reads results until `n` distinct jobs finished or `timeout` passed.
pub(super) async fn collect_latencies(reader: &kafka::Reader, n: usize, timeout: Duration, t0: Instant) -> Seen {
    let mut hist = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let mut seen = std::collections::HashSet::with_capacity(n);
    let (mut first_start, mut last_finish) = (None::<i64>, None::<i64>);
    let mut finishes = Vec::with_capacity(n);
    let deadline = Instant::now() + timeout;
    while seen.len() < n && Instant::now() < deadline {
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), reader.recv()).await {
            if let Some(r) = m.payload().and_then(|b| codec::decode_result(b).ok()) {
                if seen.insert(r.job_id) {
                    let _ = hist.record((r.finished_at - r.submitted_at).max(0) as u64);
                    let start = r.started_at.unwrap_or(r.finished_at);
                    first_start = Some(first_start.map_or(start, |s| s.min(start)));
                    last_finish = Some(last_finish.map_or(r.finished_at, |f| f.max(r.finished_at)));
                    finishes.push(r.finished_at);
                }
            }
        }
    }
    Seen { done: seen.len(), latency_ms: hist, elapsed: t0.elapsed(), first_start, last_finish, finishes }
}

// ---------------------------------------------------------------------------------------
// fairway-bench bench fairness

#[derive(clap::Args, Debug, Clone)]
pub struct FairnessArgs {
    /// How long the quiet tenants submit in each run; the measured window ends here.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Sleep jobs the flooding tenant submits at once when a flooded run starts. Keep it
    /// large enough to stay backlogged for the whole run (the bench warns otherwise).
    #[arg(long, default_value_t = 5000)]
    pub flood: usize,
    /// Run time of one flood job, ms.
    #[arg(long, default_value_t = 50)]
    pub flood_ms: u64,
    /// Tier of the flooding tenant.
    #[arg(long, value_enum, default_value = "pro")]
    pub flood_tier: BenchTier,
    /// Tiers of the quiet tenants, one tenant per entry.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "standard,standard,pro")]
    pub quiet_tiers: Vec<BenchTier>,
    /// Jobs per second each quiet tenant submits (evenly spaced, phases staggered).
    #[arg(long, default_value_t = 5.0)]
    pub quiet_rate: f64,
    /// Run time of one quiet job, ms.
    #[arg(long, default_value_t = 20)]
    pub quiet_ms: u64,
    /// Tiers of the continuously backlogged tenants of the share run, one tenant per
    /// entry (no enterprise: reserved slots sit outside the shared slots).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "free,standard,pro")]
    pub share_tiers: Vec<BenchTier>,
    /// Job run times (ms) of the share run's tenants, one per entry of --share-tiers
    /// (the list is cycled).
    #[arg(long, value_delimiter = ',', default_value = "50")]
    pub share_ms: Vec<u64>,
    /// Length of the share run (its tenants are kept backlogged throughout).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub share_duration: Duration,
    /// Slots of the short pool of the one worker.
    #[arg(long, default_value_t = 8)]
    pub slots: usize,
    /// Fast lanes of the short pool (beyond --slots, for tenants with nothing running);
    /// default: the configuration's rule (slots / 16 rounded up). 0 shows pure fair
    /// queueing with run-to-completion slots.
    #[arg(long)]
    pub fast_lanes: Option<usize>,
    #[arg(long, default_value_t = 12)]
    pub partitions: i32,
    /// Left out of every measurement at the start of a run (first fetches, cost
    /// estimates warming up).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Most time to wait after submissions end for the quiet tenants' last results
    /// (FIFO needs the whole flood ahead of them to drain).
    #[arg(long, default_value = "90s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    /// Runs to do, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "alone,fair,fifo,share")]
    pub runs: Vec<RunKind>,
    /// Exit 1 when a goal is missed (quiet p99 ratio fair <= 2, share error <= 0.05).
    #[arg(long)]
    pub check: bool,
    /// Run times of flood jobs vary uniformly by this fraction around --flood-ms (and
    /// --share-ms), e.g. 0.5 = 25..75 ms for 50 ms; 0 = all equal.
    #[arg(long, default_value_t = 0.0)]
    pub spread: f64,
    /// Write every run's results as CSV (job_id, tenant, submitted_at, started_at,
    /// finished_at; epoch ms) into this directory, for analysis.
    #[arg(long)]
    pub dump: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum RunKind {
    /// Quiet tenants only: their waits alone (the baseline).
    Alone,
    /// Quiet tenants plus the flood, fair scheduler.
    Fair,
    /// Quiet tenants plus the flood, plain FIFO.
    Fifo,
    /// Several tenants of different tiers all continuously backlogged, fair scheduler.
    Share,
}

impl RunKind {
    fn as_str(self) -> &'static str {
        match self {
            RunKind::Alone => "alone",
            RunKind::Fair => "fair",
            RunKind::Fifo => "fifo",
            RunKind::Share => "share",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchTier {
    Free,
    Standard,
    Pro,
}

impl BenchTier {
    fn as_str(self) -> &'static str {
        match self {
            BenchTier::Free => "free",
            BenchTier::Standard => "standard",
            BenchTier::Pro => "pro",
        }
    }
    fn config(self) -> fairway::config::Tier {
        match self {
            BenchTier::Free => fairway::config::Tier::Free,
            BenchTier::Standard => fairway::config::Tier::Standard,
            BenchTier::Pro => fairway::config::Tier::Pro,
        }
    }
    /// The scheduler's weight of the tier (for free: of the whole free flow).
    fn weight(self) -> f64 {
        use fairway::core::scheduler::{Tier, TierWeights};
        let w = TierWeights::default();
        match self {
            BenchTier::Free => w.of(Tier::Free),
            BenchTier::Standard => w.of(Tier::Standard),
            BenchTier::Pro => w.of(Tier::Pro),
        }
    }
}

/// A bench tenant: name, tier, and the run time of its sleep jobs.
#[derive(Debug, Clone)]
struct BenchTenant {
    name: String,
    tier: BenchTier,
    job_ms: u64,
}

/// One run: a fresh set of topics, one worker, floods submitted at once at `t0` and
/// quiet tenants submitting steadily until `t0 + duration`.
struct Plan {
    run: RunKind,
    policy: Policy,
    /// Tenants flooding, with their number of jobs.
    floods: Vec<(BenchTenant, usize)>,
    quiet: Vec<BenchTenant>,
    duration: Duration,
}

struct Outcome {
    t0: i64,
    /// t0 + duration (epoch ms): the measured window is [t0 + warmup, end].
    end: i64,
    results: Vec<fairway::model::JobResult>,
    /// Quiet jobs without a result when the run stopped: (tenant, submitted at).
    quiet_missing: Vec<(String, i64)>,
    quiet_submitted: usize,
    submit_errors: usize,
    /// Sorted ms from a result's `finished_at` to its arrival at the bench (one Kafka hop).
    hops: Vec<i64>,
    /// Shares of slot-time in the window by the scheduler's own accounting (from its
    /// stats, refreshed every 500 ms; empty when unavailable, e.g. FIFO).
    sched_shares: BTreeMap<String, f64>,
}

/// Cumulative slot-seconds per tenant from the worker's scheduler stats (Fair only).
fn scheduler_used(w: &Worker) -> Option<BTreeMap<String, f64>> {
    let v = w.shared.first()?.stats.lock().ok()?.clone();
    let tenants = v.get("tenants")?.as_array()?;
    Some(
        tenants
            .iter()
            .filter_map(|t| Some((t.get("tenant")?.as_str()?.to_string(), t.get("slot_seconds_used")?.as_f64()?)))
            .collect(),
    )
}

/// The noisy-neighbour benchmark (issue 4 item 6).
///
/// Runs, each on a fresh set of topics with one in-process worker whose short pool has
/// `--slots` slots (partitions assigned before anything is submitted, a few echo jobs per
/// tenant run first so connections and fetches are warm):
///
/// - **alone**: the quiet tenants submit `--quiet-rate` sleep jobs/s of `--quiet-ms`
///   each for `--duration`: their waits without contention.
/// - **fair** / **fifo**: the same, while the flooding tenant submits `--flood` sleep jobs
///   of `--flood-ms` at once, far beyond capacity; fair scheduler, then plain FIFO.
/// - **share**: the `--share-tiers` tenants all flood (sized to stay backlogged for
///   `--share-duration`); their slot-time shares are compared with `w_i / sum(w)`.
///
/// Wait = `started_at - submitted_at` of the job's result (submit call to handler start:
/// produce, fetch, queueing in the worker, the effectively-once store read). Slot-time
/// of a tenant = sum over its results of the overlap of `[started_at, finished_at]` with
/// the window (handler time; the per-job store round trips around it are not counted).
/// Everything submitted or running in the first `--warmup` of a run is left out.
///
/// Also printed, to read the waits against: the services' floor (a produce -> consume hop
/// and a job-state read, probed alone before the runs), each run's result hop, the
/// share of the slots filled by handler time, and in the share run the scheduler's own
/// slot-time accounting next to the handler-time shares.
async fn fairness(g: &Global, a: FairnessArgs) -> anyhow::Result<ExitCode> {
    check_fairness_args(&a)?;
    let base = g.load()?;
    let tenants = BenchTenants::new(&a);
    let lanes = fast_lanes(&base, &a);
    print_setup(&base, &a, &tenants, lanes);

    // What one job's wait is made of at least, measured alone on these services.
    let floor = probe_floor(&base, &a).await.context("probing the services")?;
    print_floor(&floor);

    let outcomes = run_all(&base, &a, &tenants).await?;
    let warm = a.warmup.as_millis() as i64;

    let mut json = Json::new();
    json.insert("bench".into(), "fairness".into());
    let waits = quiet_wait_table(&tenants.quiet, &outcomes, warm);
    report_quiet_p99s(&waits, &floor, &mut json);
    report_flood_shares(&a, &tenants, &outcomes, warm, &mut json);
    let max_share_error = report_backlogged_shares(&tenants, &outcomes, warm, &mut json);
    record_settings(&a, lanes, &floor, &mut json);
    Ok(report_goals(&a, waits.ratio(RunKind::Fair), max_share_error, &outcomes, json))
}

/// The JSON summary line the fairness bench prints last.
type Json = serde_json::Map<String, serde_json::Value>;

/// Rejects argument combinations the bench cannot measure.
fn check_fairness_args(a: &FairnessArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.quiet_rate > 0.0, "--quiet-rate must be positive");
    anyhow::ensure!(a.warmup < a.duration && a.warmup < a.share_duration, "--warmup must be shorter than the runs");
    anyhow::ensure!(!a.share_ms.is_empty(), "--share-ms needs at least one value");
    anyhow::ensure!((0.0..1.0).contains(&a.spread), "--spread must be in [0, 1)");
    Ok(())
}

/// The fairness bench's tenants: the flooder, the quiet ones and the share run's
/// backlogged ones.
struct BenchTenants {
    flooder: BenchTenant,
    quiet: Vec<BenchTenant>,
    backlogged: Vec<BenchTenant>,
    /// Entitlement `w_i / sum(w)` of each backlogged tenant, in their order.
    share_entitled: Vec<f64>,
}

impl BenchTenants {
    /// Names the tenants and sets their tiers and job run times from the arguments.
    fn new(a: &FairnessArgs) -> BenchTenants {
        let flooder = BenchTenant { name: "noisy".into(), tier: a.flood_tier, job_ms: a.flood_ms };
        let quiet: Vec<BenchTenant> = a
            .quiet_tiers
            .iter()
            .enumerate()
            .map(|(i, t)| BenchTenant { name: format!("quiet{}-{}", i + 1, t.as_str()), tier: *t, job_ms: a.quiet_ms })
            .collect();
        let backlogged: Vec<BenchTenant> = a
            .share_tiers
            .iter()
            .enumerate()
            .map(|(i, t)| BenchTenant {
                name: format!("busy{}-{}", i + 1, t.as_str()),
                tier: *t,
                job_ms: a.share_ms[i % a.share_ms.len()].max(1),
            })
            .collect();
        let share_entitled = entitlements(&backlogged);
        BenchTenants { flooder, quiet, backlogged, share_entitled }
    }

    /// The plan of one run: its policy, floods, quiet tenants and length.
    fn plan(&self, run: RunKind, a: &FairnessArgs) -> Plan {
        match run {
            RunKind::Alone => {
                Plan { run, policy: Policy::Fair, floods: vec![], quiet: self.quiet.clone(), duration: a.duration }
            }
            RunKind::Fair | RunKind::Fifo => Plan {
                run,
                policy: if run == RunKind::Fair { Policy::Fair } else { Policy::Fifo },
                floods: vec![(self.flooder.clone(), a.flood)],
                quiet: self.quiet.clone(),
                duration: a.duration,
            },
            RunKind::Share => {
                // Enough jobs to stay backlogged for the whole run with a 50 % margin
                // (the run times are nominal; real ones are a little longer).
                let floods = self
                    .backlogged
                    .iter()
                    .zip(&self.share_entitled)
                    .map(|(t, e)| {
                        let slot_ms = e * a.slots as f64 * a.share_duration.as_millis() as f64;
                        (t.clone(), (1.5 * slot_ms / t.job_ms as f64).ceil() as usize + 100)
                    })
                    .collect();
                Plan { run, policy: Policy::Fair, floods, quiet: vec![], duration: a.share_duration }
            }
        }
    }
}

/// Fast lanes of the short pool: `--fast-lanes`, or the configuration's rule for `--slots`.
fn fast_lanes(base: &Config, a: &FairnessArgs) -> usize {
    a.fast_lanes.unwrap_or_else(|| {
        let mut p = base.pool(Pool::Short);
        p.slots = a.slots;
        p.fast_lanes_for(Pool::Short)
    })
}

/// Prints the bench's setup: worker, services, flood and quiet tenants.
fn print_setup(base: &Config, a: &FairnessArgs, tenants: &BenchTenants, lanes: usize) {
    let (flooder, quiet) = (&tenants.flooder, &tenants.quiet);
    println!(
        "fairway bench fairness: 1 worker, short pool {} slots + {lanes} fast lane(s) (fair runs), {} partitions, brokers {}, cql {}",
        a.slots,
        a.partitions,
        base.kafka.brokers,
        base.scylla.contact_points.join(",")
    );
    println!(
        "  flood: {} ({}) {} x sleep {} ms at once;  quiet: {} at {}/s x sleep {} ms each;  {:?} per run, first {:?} not measured",
        flooder.name,
        flooder.tier.as_str(),
        a.flood,
        a.flood_ms,
        quiet.iter().map(|q| format!("{} ({})", q.name, q.tier.as_str())).collect::<Vec<_>>().join(", "),
        a.quiet_rate,
        a.quiet_ms,
        a.duration,
        a.warmup
    );
}

/// Prints the services' floor: the Kafka hop and the store read.
fn print_floor(floor: &Floor) {
    println!(
        "  floor: Kafka hop (produce -> consume) p50 {} p99 {} ms;  store read (effectively-once check) p50 {} p99 {} ms",
        pct(&floor.hop, 0.5),
        pct(&floor.hop, 0.99),
        pct(&floor.read, 0.5),
        pct(&floor.read, 0.99)
    );
}

/// Does the runs of `--runs` in order (each kind once), with a summary line, the CSV dump
/// and the ran-out-of-flood warning after each.
async fn run_all(
    base: &Config,
    a: &FairnessArgs,
    tenants: &BenchTenants,
) -> anyhow::Result<BTreeMap<RunKind, Outcome>> {
    let mut outcomes: BTreeMap<RunKind, Outcome> = BTreeMap::new();
    for &run in &a.runs {
        if outcomes.contains_key(&run) {
            continue;
        }
        let plan = tenants.plan(run, a);
        let started = Instant::now();
        let out = run_plan(base, a, &plan).await.with_context(|| format!("the {} run", run.as_str()))?;
        print_run_summary(a, run, started, &out);
        if let Some(dir) = &a.dump {
            dump_results(dir, run, &out)?;
        }
        warn_flood_ran_out(&plan, &out);
        outcomes.insert(run, out);
    }
    Ok(outcomes)
}

/// Prints one run's summary line: results, slots filled, result hop, what went missing.
fn print_run_summary(a: &FairnessArgs, run: RunKind, started: Instant, out: &Outcome) {
    let warm_ms = a.warmup.as_millis() as i64;
    let busy: f64 = slot_used(out, out.t0 + warm_ms, out.end).values().sum();
    let capacity = a.slots as f64 * (out.end - out.t0 - warm_ms) as f64;
    println!(
        "[{}] done in {:.1}s: {} results; handler time filled {:.0} % of the slots in the window; \
         result hop (finished -> bench) p50 {} p99 {} ms{}{}",
        run.as_str(),
        started.elapsed().as_secs_f64(),
        out.results.len(),
        100.0 * busy / capacity,
        pct(&out.hops, 0.5),
        pct(&out.hops, 0.99),
        if out.submit_errors > 0 { format!(", {} submissions failed", out.submit_errors) } else { String::new() },
        if out.quiet_missing.is_empty() {
            String::new()
        } else {
            format!(
                ", {} of {} quiet jobs had no result (counted with their wait so far, a lower bound)",
                out.quiet_missing.len(),
                out.quiet_submitted
            )
        }
    );
}

/// Writes one run's results as `<run>.csv` into `dir` (`--dump`).
fn dump_results(dir: &std::path::Path, run: RunKind, out: &Outcome) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}.csv", run.as_str()));
    let mut text = String::from("job_id,tenant,submitted_at,started_at,finished_at\n");
    for r in &out.results {
        let started = r.started_at.map(|s| s.to_string()).unwrap_or_default();
        text.push_str(&format!("{},{},{},{},{}\n", r.job_id, r.tenant, r.submitted_at, started, r.finished_at));
    }
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// Warns about each flooding tenant whose jobs all started before the window ended.
fn warn_flood_ran_out(plan: &Plan, out: &Outcome) {
    for (t, n) in &plan.floods {
        let started_by_end =
            out.results.iter().filter(|r| r.tenant == t.name && r.started_at.is_some_and(|s| s <= out.end)).count();
        if started_by_end >= *n {
            eprintln!(
                "warning: [{}] {} ran out of queued jobs before the window ended (all {n} started): \
                 it was not backlogged throughout; raise --flood",
                plan.run.as_str(),
                t.name
            );
        }
    }
}

/// The quiet tenants' waits in the alone, fair and fifo runs.
#[derive(Default)]
struct QuietWaits {
    /// Sorted waits of all quiet tenants together, per run.
    pooled: BTreeMap<RunKind, Vec<i64>>,
    /// Highest p99 ratio (run / alone) of a single quiet tenant, per flooded run.
    worst_ratio: BTreeMap<RunKind, f64>,
}

impl QuietWaits {
    /// p50 of a run's pooled waits (None: not run).
    fn p50(&self, r: RunKind) -> Option<i64> {
        self.pooled.get(&r).map(|w| pct(w, 0.5))
    }

    /// p99 of a run's pooled waits (None: not run).
    fn p99(&self, r: RunKind) -> Option<i64> {
        self.pooled.get(&r).map(|w| pct(w, 0.99))
    }

    /// A run's pooled p99 over the alone run's, rounded to three decimals.
    fn ratio(&self, r: RunKind) -> Option<f64> {
        match (self.p99(RunKind::Alone), self.p99(r)) {
            (Some(alone), Some(x)) => Some(round3(x as f64 / alone.max(1) as f64)),
            _ => None,
        }
    }

    /// Milliseconds a run adds to the alone run's pooled p99.
    fn added(&self, r: RunKind) -> Option<i64> {
        match (self.p99(RunKind::Alone), self.p99(r)) {
            (Some(alone), Some(x)) => Some(x - alone),
            _ => None,
        }
    }
}

/// Prints the quiet tenants' wait table (each tenant and all together, per run, with the
/// p99 ratios against alone) and returns their waits.
fn quiet_wait_table(quiet: &[BenchTenant], outcomes: &BTreeMap<RunKind, Outcome>, warm: i64) -> QuietWaits {
    let mut waits = QuietWaits::default();
    let wait_runs: Vec<RunKind> =
        [RunKind::Alone, RunKind::Fair, RunKind::Fifo].into_iter().filter(|r| outcomes.contains_key(r)).collect();
    if wait_runs.is_empty() || quiet.is_empty() {
        return waits;
    }
    println!("\nquiet tenants: wait ms (handler start - submit), jobs submitted in the measured window");
    print!("{:<20}", "tenant");
    for r in &wait_runs {
        print!(" | {:>5} {:>6} {:>6}", format!("{}:n", r.as_str()), "p50", "p99");
    }
    println!(" | p99 ratio fair  fifo");
    let mut rows: Vec<(String, Vec<&BenchTenant>)> = quiet.iter().map(|q| (q.name.clone(), vec![q])).collect();
    rows.push(("all quiet".into(), quiet.iter().collect()));
    for (label, members) in rows {
        let names: HashSet<&str> = members.iter().map(|m| m.name.as_str()).collect();
        print!("{label:<20}");
        let mut p99s = BTreeMap::new();
        for r in &wait_runs {
            let out = &outcomes[r];
            let w = quiet_waits(out, &names, out.t0 + warm);
            print!(" | {:>5} {:>6} {:>6}", w.len(), pct(&w, 0.5), pct(&w, 0.99));
            p99s.insert(*r, pct(&w, 0.99));
            if label == "all quiet" {
                waits.pooled.insert(*r, w);
            }
        }
        let ratios = print_p99_ratios(&p99s);
        if label != "all quiet" {
            for (r, x) in ratios {
                if let Some(x) = x {
                    let e = waits.worst_ratio.entry(r).or_insert(0.0);
                    *e = e.max(x);
                }
            }
        }
    }
    waits
}

/// Prints the end of a wait-table row, its fair and fifo p99 ratios against alone, and
/// returns them.
fn print_p99_ratios(p99s: &BTreeMap<RunKind, i64>) -> [(RunKind, Option<f64>); 2] {
    let ratio = |r: RunKind| match (p99s.get(&RunKind::Alone), p99s.get(&r)) {
        (Some(&alone), Some(&x)) => Some(x as f64 / alone.max(1) as f64),
        _ => None,
    };
    let show = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2}"));
    let (fair, fifo) = (ratio(RunKind::Fair), ratio(RunKind::Fifo));
    println!(" | {:>14} {:>5}", show(fair), show(fifo));
    [(RunKind::Fair, fair), (RunKind::Fifo, fifo)]
}

/// Records the quiet tenants' pooled waits in the JSON and prints what the flood added
/// to their p99.
fn report_quiet_p99s(waits: &QuietWaits, floor: &Floor, json: &mut Json) {
    json.insert("quiet_p99_ratio_fair".into(), waits.ratio(RunKind::Fair).into());
    json.insert("quiet_p99_ratio_fifo".into(), waits.ratio(RunKind::Fifo).into());
    json.insert("quiet_p99_added_ms_fair".into(), waits.added(RunKind::Fair).into());
    json.insert("quiet_p99_added_ms_fifo".into(), waits.added(RunKind::Fifo).into());
    if let Some(alone) = waits.p99(RunKind::Alone) {
        println!(
            "p99 added by the flood: fair {} ms, fifo {} ms (alone p99 {alone} ms)",
            waits.added(RunKind::Fair).map_or("-".into(), |x| x.to_string()),
            waits.added(RunKind::Fifo).map_or("-".into(), |x| x.to_string()),
        );
        let hop = pct(&floor.hop, 0.5);
        if 2 * hop > alone {
            println!(
                "note: the broker's produce->consume hop alone is {hop} ms (p50): it, not fairway, makes up most \
                 of the quiet tenants' wait alone, so the ratios understate what the flood adds; compare the \
                 added ms above"
            );
        }
    }
    for r in [RunKind::Alone, RunKind::Fair, RunKind::Fifo] {
        json.insert(format!("quiet_p50_ms_{}", r.as_str()), waits.p50(r).into());
        json.insert(format!("quiet_p99_ms_{}", r.as_str()), waits.p99(r).into());
    }
    let worst = |r: RunKind| waits.worst_ratio.get(&r).map(|x| round3(*x));
    json.insert("worst_tenant_p99_ratio_fair".into(), worst(RunKind::Fair).into());
    json.insert("worst_tenant_p99_ratio_fifo".into(), worst(RunKind::Fifo).into());
}

/// Prints the slot-time shares of the flooded runs next to the max-min fair shares and
/// records the fair run's largest error.
fn report_flood_shares(
    a: &FairnessArgs,
    tenants: &BenchTenants,
    outcomes: &BTreeMap<RunKind, Outcome>,
    warm: i64,
    json: &mut Json,
) {
    let flooded: Vec<RunKind> =
        [RunKind::Fair, RunKind::Fifo].into_iter().filter(|r| outcomes.contains_key(r)).collect();
    if flooded.is_empty() {
        return;
    }
    let mut all = vec![tenants.flooder.clone()];
    all.extend(tenants.quiet.iter().cloned());
    let demand = flood_demands(a, &tenants.flooder, &all, outcomes, warm);
    let maxmin = max_min_shares(&all, &demand);
    println!("\nslot-time share in the flooded window (handler time); max-min fair = weighted share capped at demand");
    print!("{:<20} {:>9} {:>7} {:>9}", "tenant", "tier", "demand", "max-min");
    for r in &flooded {
        print!(" {:>9}", format!("{} share", r.as_str()));
    }
    println!();
    let shares: BTreeMap<RunKind, BTreeMap<String, f64>> = flooded
        .iter()
        .map(|r| {
            let out = &outcomes[r];
            (*r, slot_shares(out, out.t0 + warm, out.end))
        })
        .collect();
    let mut err_fair: f64 = 0.0;
    for (i, t) in all.iter().enumerate() {
        let d = if demand[i].is_finite() { format!("{:.3}", demand[i]) } else { "flood".into() };
        print!("{:<20} {:>9} {:>7} {:>9.3}", t.name, t.tier.as_str(), d, maxmin[i]);
        for r in &flooded {
            let s = shares[r].get(&t.name).copied().unwrap_or(0.0);
            print!(" {:>9.3}", s);
            if *r == RunKind::Fair {
                err_fair = err_fair.max((s - maxmin[i]).abs());
            }
        }
        println!();
    }
    if shares.contains_key(&RunKind::Fair) {
        json.insert("flood_share_error_fair".into(), round3(err_fair).into());
    }
}

/// Demand of each of `all` in the flooded runs, as a fraction of the handler time used in
/// the window (infinite for the flooder).
fn flood_demands(
    a: &FairnessArgs,
    flooder: &BenchTenant,
    all: &[BenchTenant],
    outcomes: &BTreeMap<RunKind, Outcome>,
    warm: i64,
) -> Vec<f64> {
    // Offered load of a quiet tenant as a fraction of the handler time used in the
    // window (what shares are fractions of): rate x mean run time (measured in the
    // fair run) / handler ms used per ms. The flooder's demand is unbounded.
    let fair_out = outcomes.get(&RunKind::Fair).or_else(|| outcomes.values().next()).expect("a run");
    let used_per_ms = slot_used(fair_out, fair_out.t0 + warm, fair_out.end).values().sum::<f64>()
        / (fair_out.end - fair_out.t0 - warm).max(1) as f64;
    all.iter()
        .map(|t| {
            if t.name == flooder.name {
                f64::INFINITY
            } else {
                let runs: Vec<f64> = fair_out
                    .results
                    .iter()
                    .filter(|r| r.tenant == t.name)
                    .filter_map(|r| r.started_at.map(|s| (r.finished_at - s) as f64))
                    .collect();
                let mean = if runs.is_empty() { t.job_ms as f64 } else { runs.iter().sum::<f64>() / runs.len() as f64 };
                a.quiet_rate * mean / (1000.0 * used_per_ms.max(1e-9))
            }
        })
        .collect()
}

/// Prints the share run's table (if it ran) and records `max_share_error`, which it returns.
fn report_backlogged_shares(
    tenants: &BenchTenants,
    outcomes: &BTreeMap<RunKind, Outcome>,
    warm: i64,
    json: &mut Json,
) -> Option<f64> {
    let max_share_error = outcomes.get(&RunKind::Share).map(|out| share_run_table(tenants, out, warm, json));
    json.insert("max_share_error".into(), max_share_error.into());
    max_share_error
}

/// Prints the backlogged tenants' slot-time shares against their entitlements, records
/// them in the JSON and returns the largest error (rounded to four decimals).
fn share_run_table(tenants: &BenchTenants, out: &Outcome, warm: i64, json: &mut Json) -> f64 {
    let from = out.t0 + warm;
    let shares = slot_shares(out, from, out.end);
    println!(
        "\nbacklogged tenants (share run, {:.1}s window): slot-time share vs entitlement w_i / sum(w)",
        (out.end - from) as f64 / 1000.0
    );
    println!(
        "{:<20} {:>9} {:>7} {:>7} {:>9} {:>9} {:>9} {:>8} {:>11}",
        "tenant", "tier", "weight", "job ms", "entitled", "share", "error", "jobs", "sched share"
    );
    let mut err: f64 = 0.0;
    let mut sched_err: f64 = 0.0;
    let mut per = serde_json::Map::new();
    for (t, e) in tenants.backlogged.iter().zip(&tenants.share_entitled) {
        let s = shares.get(&t.name).copied().unwrap_or(0.0);
        let jobs = out
            .results
            .iter()
            .filter(|r| r.tenant == t.name && r.started_at.is_some_and(|st| st >= from && st < out.end))
            .count();
        let sched = out.sched_shares.get(&t.name).copied();
        println!(
            "{:<20} {:>9} {:>7} {:>7} {:>9.4} {:>9.4} {:>+9.4} {:>8} {:>11}",
            t.name,
            t.tier.as_str(),
            t.tier.weight(),
            t.job_ms,
            e,
            s,
            s - e,
            jobs,
            sched.map_or("-".into(), |x| format!("{x:.4}"))
        );
        err = err.max((s - e).abs());
        sched_err = sched_err.max(sched.map_or(0.0, |x| (x - e).abs()));
        per.insert(
            t.name.clone(),
            serde_json::json!({"entitled": round4(*e), "share": round4(s), "jobs": jobs, "scheduler_share": sched.map(round4)}),
        );
    }
    if !out.sched_shares.is_empty() {
        json.insert("max_share_error_scheduler_accounting".into(), round4(sched_err).into());
    }
    println!(
        "  share = handler time (started_at..finished_at from the results); sched share = the scheduler's \
         own slot-time (dispatch..slot freed, incl. the store round trips around the handler)"
    );
    json.insert("shares".into(), per.into());
    round4(err)
}

/// Records the services' floor and the bench's settings in the JSON.
fn record_settings(a: &FairnessArgs, lanes: usize, floor: &Floor, json: &mut Json) {
    json.insert("kafka_hop_p50_ms".into(), pct(&floor.hop, 0.5).into());
    json.insert("store_read_p50_ms".into(), pct(&floor.read, 0.5).into());
    json.insert("slots".into(), a.slots.into());
    json.insert("fast_lanes".into(), lanes.into());
    json.insert("flood".into(), a.flood.into());
    json.insert("duration_s".into(), a.duration.as_secs_f64().into());
}

/// Judges the goals, prints them and the JSON line, and returns the exit code (failure
/// when a run was incomplete, or with `--check` when a goal was missed).
fn report_goals(
    a: &FairnessArgs,
    fair_ratio: Option<f64>,
    max_share_error: Option<f64>,
    outcomes: &BTreeMap<RunKind, Outcome>,
    mut json: Json,
) -> ExitCode {
    let fair_ok = fair_ratio.map(|r| r <= 2.0);
    let share_ok = max_share_error.map(|e| e <= 0.05);
    let goals_met = fair_ok.unwrap_or(true) && share_ok.unwrap_or(true) && (fair_ok.is_some() || share_ok.is_some());
    json.insert("goals_met".into(), goals_met.into());
    let incomplete = outcomes.values().any(|o| o.submit_errors > 0);
    println!(
        "\ngoals: quiet p99 ratio fair {} (<= 2), max share error {} (<= 0.05)",
        fair_ratio.map_or("-".into(), |r| format!("{r:.2}")),
        max_share_error.map_or("-".into(), |e| format!("{e:.4}"))
    );
    println!("{}", serde_json::Value::Object(json));
    if incomplete || (a.check && !goals_met) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The bench's configuration for one run: fresh topics, the bench tenants only, sleep
/// and echo job types on the short pool with `slots` slots.
fn fairness_config(base: &Config, a: &FairnessArgs, plan: &Plan) -> anyhow::Result<Arc<Config>> {
    let mut cfg = base.clone();
    cfg.kafka.topic_prefix = format!("fairbench{}-{}.", now_ms(), plan.run.as_str());
    cfg.kafka.partitions = a.partitions;
    cfg.scylla.keyspace = "fairway_bench".into();
    let short = cfg.pools.entry(Pool::Short).or_insert_with(|| fairway::config::PoolConfig::default_for(Pool::Short));
    short.slots = a.slots;
    if a.fast_lanes.is_some() {
        short.fast_lanes = a.fast_lanes;
    }
    cfg.tenants.clear();
    for t in plan.floods.iter().map(|(t, _)| t).chain(&plan.quiet) {
        cfg.tenants
            .insert(t.name.clone(), fairway::config::TenantConfig { tier: t.tier.config(), ..Default::default() });
    }
    add_bench_job_types(&mut cfg)?;
    cfg.validate()?;
    Ok(Arc::new(cfg))
}

/// The job types every bench run uses: `sleep` and `echo` on the short pool.
pub(super) fn add_bench_job_types(cfg: &mut Config) -> anyhow::Result<()> {
    for (name, handler) in [("sleep", "sleep"), ("echo", "echo")] {
        let jt: fairway::config::JobTypeConfig =
            toml::from_str(&format!("pool = \"short\"\nhandler = \"{handler}\"\ntimeout = \"10s\""))?;
        cfg.job_types.insert(name.into(), jt);
    }
    Ok(())
}

/// Does one run: a fresh worker warmed up, the floods submitted at once and the quiet
/// tenants steadily, then the results collected until the quiet ones are all in.
async fn run_plan(base: &Config, a: &FairnessArgs, plan: &Plan) -> anyhow::Result<Outcome> {
    let mut rig = Rig::start(base, a, plan).await?;
    rig.warm_up(plan).await?;

    // The run: floods at once, quiet tenants steadily until t0 + duration.
    let t0 = now_ms();
    let start = Instant::now();
    let end_at = start + plan.duration;
    let flood_task = spawn_floods(rig.sub.clone(), flood_jobs(plan, a.spread));
    let quiet_tasks = spawn_quiet_tenants(&rig.sub, plan, a.quiet_rate, end_at);

    let times = Deadlines::new(a, plan, start, end_at);
    let mut got = collect_results(&mut rig, plan, &times, quiet_tasks).await;
    got.submit_errors += flood_task.await.unwrap_or(0);
    rig.stop().await;
    Ok(got.into_outcome(t0, plan))
}

/// One run's services: a submitter, the worker (partitions assigned) and the result feed
/// (declared newest first, so a run failing half-way drops them in that order).
struct Rig {
    sub: Arc<Submitter>,
    worker: Worker,
    feed: super::bench_flood::ResultFeed,
}

impl Rig {
    /// Creates the run's topics, schema and tenants, then starts the result feed, the worker
    /// (waiting for its partitions) and a submitter.
    async fn start(base: &Config, a: &FairnessArgs, plan: &Plan) -> anyhow::Result<Rig> {
        let cfg = fairness_config(base, a, plan)?;
        kafka::ensure_topics(&cfg).await.context("creating bench topics (scripts/services up?)")?;
        fairway::store::ensure_schema(&cfg).await?;
        fairway::ops::tenants::seed(&cfg).await?;

        let feed = super::bench_flood::ResultFeed::start(&cfg)?;

        let registry = Registry::from_config(&cfg, Default::default()).map_err(anyhow::Error::msg)?;
        let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, plan.policy).await?;
        if !worker.wait_assigned(Duration::from_secs(60)).await {
            worker.stop().await;
            anyhow::bail!("the worker got no partitions within 60 s");
        }
        let sub = Arc::new(Submitter::new(cfg.clone(), None)?);
        Ok(Rig { sub, worker, feed })
    }

    /// Runs a few echo jobs per tenant through the whole path (producer, fetch, store,
    /// results), so the measured run starts with warm connections and prepared statements.
    async fn warm_up(&mut self, plan: &Plan) -> anyhow::Result<()> {
        let tenants: Vec<&BenchTenant> = plan.floods.iter().map(|(t, _)| t).chain(&plan.quiet).collect();
        let warm_jobs: Vec<NewJob> = tenants
            .iter()
            .flat_map(|t| {
                (0..5).map(|_| NewJob { tenant: t.name.clone(), job_type: "echo".into(), ..Default::default() })
            })
            .collect();
        let mut warm_ids = HashSet::new();
        for r in futures::future::join_all(warm_jobs.iter().map(|j| self.sub.submit(j))).await {
            warm_ids.insert(r?.job_id);
        }
        let warm_deadline = Instant::now() + Duration::from_secs(60);
        let mut done: HashSet<String> = HashSet::new();
        while warm_ids.iter().any(|id| !done.contains(id)) {
            anyhow::ensure!(Instant::now() < warm_deadline, "warm-up jobs got no results within 60 s");
            if let Ok(Some((r, _))) = tokio::time::timeout(Duration::from_millis(200), self.feed.rx.recv()).await {
                done.insert(r.job_id);
            }
        }
        Ok(())
    }

    /// Stops the result feed, then the worker.
    async fn stop(self) {
        self.feed.stop().await;
        self.worker.stop().await;
    }
}

/// The floods' sleep jobs, interleaved across the tenants so that every flood reaches the
/// worker at about the same time.
fn flood_jobs(plan: &Plan, spread: f64) -> Vec<NewJob> {
    let mut jobs = Vec::new();
    let most = plan.floods.iter().map(|(_, n)| *n).max().unwrap_or(0);
    for i in 0..most {
        for (t, n) in &plan.floods {
            if i < *n {
                jobs.push(NewJob {
                    tenant: t.name.clone(),
                    job_type: "sleep".into(),
                    payload: serde_json::json!({ "ms": spread_ms(t.job_ms, spread) }).into(),
                    ..Default::default()
                });
            }
        }
    }
    jobs
}

/// A flood job's run time: `job_ms` varied uniformly by the fraction `spread` (`--spread`).
fn spread_ms(job_ms: u64, spread: f64) -> u64 {
    if spread > 0.0 {
        let u = rand::random::<f64>() * 2.0 - 1.0;
        (job_ms as f64 * (1.0 + spread * u)).round().max(1.0) as u64
    } else {
        job_ms
    }
}

/// Submits the flood jobs, 1000 at a time; the task returns the number of failed submissions.
fn spawn_floods(sub: Arc<Submitter>, jobs: Vec<NewJob>) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut errors = 0usize;
        for chunk in jobs.chunks(1000) {
            for r in futures::future::join_all(chunk.iter().map(|j| sub.submit(j))).await {
                if let Err(e) = r {
                    errors += 1;
                    tracing::warn!(error = %e, "flood submission failed");
                }
            }
        }
        errors
    })
}

/// A quiet job's submission: its job id (None: the submission failed), tenant, and when it
/// was submitted (epoch ms).
type QuietSubmission = (Option<String>, String, i64);

/// A quiet tenant's submitting task.
type QuietTask = tokio::task::JoinHandle<Vec<QuietSubmission>>;

/// Starts one submitting task per quiet tenant, at `rate` jobs/s each with their phases
/// staggered over the period.
fn spawn_quiet_tenants(sub: &Arc<Submitter>, plan: &Plan, rate: f64, end_at: Instant) -> Vec<QuietTask> {
    let period = Duration::from_secs_f64(1.0 / rate);
    let n_quiet = plan.quiet.len().max(1);
    plan.quiet
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let phase = period.mul_f64(i as f64 / n_quiet as f64);
            tokio::spawn(submit_quiet(sub.clone(), t.clone(), phase, period, end_at))
        })
        .collect()
}

/// Submits a quiet tenant's sleep jobs, one every `period` after `phase`, until `end_at`;
/// returns every submission once all have returned.
async fn submit_quiet(
    sub: Arc<Submitter>,
    t: BenchTenant,
    phase: Duration,
    period: Duration,
    end_at: Instant,
) -> Vec<QuietSubmission> {
    use futures::StreamExt;

    tokio::time::sleep(phase).await;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut inflight = futures::stream::FuturesUnordered::new();
    let mut out: Vec<QuietSubmission> = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if Instant::now() >= end_at {
                    break;
                }
                let sub = sub.clone();
                let job = NewJob {
                    tenant: t.name.clone(),
                    job_type: "sleep".into(),
                    payload: serde_json::json!({ "ms": t.job_ms }).into(),
                    ..Default::default()
                };
                inflight.push(async move {
                    let at = now_ms();
                    let r = sub.submit(&job).await;
                    (r.ok().map(|s| s.job_id), job.tenant, at)
                });
            }
            Some(r) = inflight.next() => out.push(r),
        }
    }
    while let Some(r) = inflight.next().await {
        out.push(r);
    }
    out
}

/// The instants a run's result collection goes by.
struct Deadlines {
    /// Start of the measured window (after the warm-up).
    window_from: Instant,
    /// End of the submissions (and of the window).
    end_at: Instant,
    /// When the jobs running at `end_at` have surely finished.
    settle: Instant,
    /// When to stop waiting for the quiet tenants' results (`--drain-timeout`).
    deadline: Instant,
}

impl Deadlines {
    /// The deadlines of a run started at `start` whose submissions end at `end_at`.
    fn new(a: &FairnessArgs, plan: &Plan, start: Instant, end_at: Instant) -> Deadlines {
        let longest =
            plan.floods.iter().map(|(t, _)| t.job_ms).chain(plan.quiet.iter().map(|t| t.job_ms)).max().unwrap_or(0);
        Deadlines {
            window_from: start + a.warmup,
            end_at,
            settle: end_at + Duration::from_millis(longest * 3 + 1500),
            deadline: end_at + a.drain_timeout,
        }
    }
}

/// Collects results until every quiet job has its result and the jobs running at the
/// window's end have finished, or the drain timeout passes.
async fn collect_results(rig: &mut Rig, plan: &Plan, times: &Deadlines, quiet_tasks: Vec<QuietTask>) -> Collected {
    let mut got = Collected::new(plan);
    let mut quiet_tasks = Some(quiet_tasks);
    let mut last_note = Instant::now();
    loop {
        while let Ok((r, at)) = rig.feed.rx.try_recv() {
            got.receive(r, at);
        }
        got.read_scheduler(&rig.worker, times);
        if got.quiet_ids.is_none() && Instant::now() >= times.end_at {
            let tasks = quiet_tasks.take().expect("joined once");
            got.take_quiet(futures::future::join_all(tasks).await);
        }
        let now = Instant::now();
        if let Some(ids) = &got.quiet_ids {
            let all_in = ids.keys().all(|id| got.results.contains_key(id));
            if (all_in && now >= times.settle) || now >= times.deadline {
                break;
            }
            if now >= times.end_at && last_note.elapsed() > Duration::from_secs(5) {
                last_note = now;
                let missing = ids.keys().filter(|id| !got.results.contains_key(*id)).count();
                eprintln!(
                    "  [{}] waiting for {missing} quiet results ({} results so far)",
                    plan.run.as_str(),
                    got.results.len()
                );
            }
        }
        if let Ok(Some((r, at))) = tokio::time::timeout(Duration::from_millis(100), rig.feed.rx.recv()).await {
            got.receive(r, at);
        }
    }
    got
}

/// What a run's result collection gathers.
struct Collected {
    results: HashMap<String, fairway::model::JobResult>,
    /// Result produced (finished_at) -> received here: one Kafka hop, for comparison with
    /// the waits (which contain one such hop: submit -> worker fetch).
    hops: Vec<i64>,
    /// The quiet jobs submitted: job id -> (tenant, submitted at); None until the quiet
    /// tenants' tasks are joined at the end of the submissions.
    quiet_ids: Option<HashMap<String, (String, i64)>>,
    submit_errors: usize,
    /// The scheduler's own slot-time accounting (dispatch to slot freed, i.e. including
    /// the store round trips around the handler) at both ends of the window.
    sched_from: Option<BTreeMap<String, f64>>,
    sched_to: Option<BTreeMap<String, f64>>,
}

impl Collected {
    /// Nothing collected yet (no quiet jobs to wait for when the plan has no quiet tenants).
    fn new(plan: &Plan) -> Collected {
        Collected {
            results: HashMap::new(),
            hops: Vec::new(),
            quiet_ids: if plan.quiet.is_empty() { Some(HashMap::new()) } else { None },
            submit_errors: 0,
            sched_from: None,
            sched_to: None,
        }
    }

    /// Keeps one result received at `at` (epoch ms) and its hop.
    fn receive(&mut self, r: fairway::model::JobResult, at: i64) {
        self.hops.push(at - r.finished_at);
        self.results.insert(r.job_id.clone(), r);
    }

    /// Reads the scheduler's accounting once the window starts and once it ends.
    fn read_scheduler(&mut self, worker: &Worker, times: &Deadlines) {
        if self.sched_from.is_none() && Instant::now() >= times.window_from {
            self.sched_from = scheduler_used(worker);
        }
        if self.sched_to.is_none() && Instant::now() >= times.end_at {
            self.sched_to = scheduler_used(worker);
        }
    }

    /// Keeps the quiet jobs the joined tasks submitted; failed submissions count as errors.
    fn take_quiet(&mut self, joined: Vec<Result<Vec<QuietSubmission>, tokio::task::JoinError>>) {
        let mut ids = HashMap::new();
        for (jid, tenant, at) in joined.into_iter().flat_map(|r| r.unwrap_or_default()) {
            match jid {
                Some(id) => {
                    ids.insert(id, (tenant, at));
                }
                None => self.submit_errors += 1,
            }
        }
        self.quiet_ids = Some(ids);
    }

    /// The run's outcome: its sleep jobs' results, the quiet jobs still without one, the
    /// sorted hops and the scheduler's shares in the window.
    fn into_outcome(mut self, t0: i64, plan: &Plan) -> Outcome {
        let ids = self.quiet_ids.unwrap_or_default();
        let quiet_missing: Vec<(String, i64)> =
            ids.iter().filter(|(id, _)| !self.results.contains_key(*id)).map(|(_, (t, at))| (t.clone(), *at)).collect();
        self.hops.sort_unstable();
        Outcome {
            hops: self.hops,
            sched_shares: scheduler_shares(self.sched_from, self.sched_to),
            t0,
            end: t0 + plan.duration.as_millis() as i64,
            results: self.results.into_values().filter(|r| r.job_type == "sleep").collect(),
            quiet_missing,
            quiet_submitted: ids.len(),
            submit_errors: self.submit_errors,
        }
    }
}

/// Shares of the scheduler's slot-time between two readings of its accounting (empty
/// unless both were read).
fn scheduler_shares(from: Option<BTreeMap<String, f64>>, to: Option<BTreeMap<String, f64>>) -> BTreeMap<String, f64> {
    let (Some(a), Some(b)) = (from, to) else { return BTreeMap::new() };
    let mut d: BTreeMap<String, f64> =
        b.iter().map(|(t, v)| (t.clone(), v - a.get(t).copied().unwrap_or(0.0))).collect();
    let total: f64 = d.values().sum();
    if total > 0.0 {
        d.values_mut().for_each(|v| *v /= total);
    }
    d
}

/// Waits (ms) of the given quiet tenants' jobs submitted in `[from, end]`; jobs without
/// a result count with their wait up to the end of the run (a lower bound).
fn quiet_waits(out: &Outcome, tenants: &HashSet<&str>, from: i64) -> Vec<i64> {
    let in_window = |at: i64| at >= from && at <= out.end;
    let mut w: Vec<i64> = out
        .results
        .iter()
        .filter(|r| tenants.contains(r.tenant.as_str()) && in_window(r.submitted_at))
        .map(|r| (r.started_at.unwrap_or(r.finished_at) - r.submitted_at).max(0))
        .collect();
    let stop = out.results.iter().map(|r| r.finished_at).max().unwrap_or(out.end);
    w.extend(
        out.quiet_missing
            .iter()
            .filter(|(t, at)| tenants.contains(t.as_str()) && in_window(*at))
            .map(|(_, at)| stop - at),
    );
    w.sort_unstable();
    w
}

/// Handler slot-time (ms) in `[from, to]` per tenant.
fn slot_used(out: &Outcome, from: i64, to: i64) -> BTreeMap<String, f64> {
    let mut used: BTreeMap<String, f64> = BTreeMap::new();
    for r in &out.results {
        let Some(s) = r.started_at else { continue };
        let overlap = (r.finished_at.min(to) - s.max(from)).max(0) as f64;
        *used.entry(r.tenant.clone()).or_default() += overlap;
    }
    used
}

/// Share of handler slot-time in `[from, to]` per tenant (fractions of the total used).
fn slot_shares(out: &Outcome, from: i64, to: i64) -> BTreeMap<String, f64> {
    let mut used = slot_used(out, from, to);
    let total: f64 = used.values().sum();
    if total > 0.0 {
        for v in used.values_mut() {
            *v /= total;
        }
    }
    used
}

/// Fair-queueing entitlement of continuously backlogged tenants: `w_i / sum(w)`, where
/// the free tenants together count once with the free-tier weight and split it equally.
fn entitlements(tenants: &[BenchTenant]) -> Vec<f64> {
    let free = tenants.iter().filter(|t| t.tier == BenchTier::Free).count();
    let w: Vec<f64> = tenants
        .iter()
        .map(|t| if t.tier == BenchTier::Free { t.tier.weight() / free as f64 } else { t.tier.weight() })
        .collect();
    let total: f64 = w.iter().sum();
    w.iter().map(|x| x / total).collect()
}

/// Max-min weighted fair shares: a tenant demanding less than its weighted share gets its
/// demand, the rest is split by weight among the others (water filling).
fn max_min_shares(tenants: &[BenchTenant], demand: &[f64]) -> Vec<f64> {
    let base = entitlements(tenants); // weights, normalised; free tenants already split
    let mut share = vec![0.0; tenants.len()];
    let mut open: Vec<usize> = (0..tenants.len()).collect();
    let mut left = 1.0;
    loop {
        let w: f64 = open.iter().map(|&i| base[i]).sum();
        if open.is_empty() || w <= 0.0 {
            break;
        }
        let capped: Vec<usize> = open.iter().copied().filter(|&i| demand[i] <= left * base[i] / w).collect();
        if capped.is_empty() {
            for &i in &open {
                share[i] = left * base[i] / w;
            }
            break;
        }
        for &i in &capped {
            share[i] = demand[i];
            left -= demand[i];
        }
        open.retain(|i| !capped.contains(i));
    }
    share
}

fn pct(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    // Nearest rank.
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn round4(x: f64) -> f64 {
    (x * 10000.0).round() / 10000.0
}

/// Latency floor of the services, ms, sorted.
struct Floor {
    hop: Vec<i64>,
    read: Vec<i64>,
}

/// Sequential probes: a record produced and consumed back (one Kafka hop, as between a
/// submit and the worker's fetch), and a job-state read (the check before every run).
async fn probe_floor(base: &Config, a: &FairnessArgs) -> anyhow::Result<Floor> {
    let plan = Plan { run: RunKind::Alone, policy: Policy::Fair, floods: vec![], quiet: vec![], duration: a.duration };
    let mut cfg = (*fairness_config(base, a, &plan)?).clone();
    cfg.kafka.topic_prefix = format!("fairbench{}-probe.", now_ms());
    let cfg = Arc::new(cfg);
    kafka::ensure_topics(&cfg).await.context("creating probe topics (scripts/services up?)")?;
    fairway::store::ensure_schema(&cfg).await?;
    fairway::ops::tenants::seed(&cfg).await?;
    let topic = cfg.results_topic();
    let reader = kafka::reader(&cfg, &cfg.group("probe"), false)?;
    reader.subscribe(&[&topic])?;
    let producer = kafka::producer(&cfg)?;
    let mut hop = Vec::new();
    for i in 0..45 {
        let sent = now_ms();
        kafka::send(&producer, &topic, "probe", &sent.to_be_bytes()).await?;
        let got = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match reader.recv().await {
                    Ok(m) if m.payload() == Some(&sent.to_be_bytes()[..]) => return Ok(now_ms()),
                    Ok(_) => {}
                    Err(e) => return Err(e),
                }
            }
        })
        .await
        .context("probe record not consumed within 30 s")??;
        if i >= 5 {
            hop.push(got - sent); // the first ones include the reader's group join
        }
    }
    let store = fairway::store::Store::open(&cfg).await?;
    let mut read = Vec::new();
    for i in 0..45 {
        let id = uuid::Uuid::now_v7().to_string();
        let t = Instant::now();
        store.job(&id).await?;
        if i >= 5 {
            read.push(t.elapsed().as_millis() as i64);
        }
    }
    hop.sort_unstable();
    read.sort_unstable();
    Ok(Floor { hop, read })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(first_start: i64, finishes: Vec<i64>) -> Seen {
        Seen {
            done: finishes.len(),
            latency_ms: hdrhistogram::Histogram::new(3).expect("histogram"),
            elapsed: Duration::ZERO,
            first_start: Some(first_start),
            last_finish: finishes.iter().copied().max(),
            finishes,
        }
    }

    #[test]
    fn each_tenth_is_when_that_many_jobs_had_finished() {
        // 20 jobs, read back out of order: the 2nd, 4th, ... 20th finish in time.
        let mut finishes: Vec<i64> = (1..=20).map(|k| 1_000 + 10 * k).collect();
        finishes.reverse();
        let s = seen(1_000, finishes);
        assert_eq!(s.finished_ms_each_tenth(), vec![20, 40, 60, 80, 100, 120, 140, 160, 180, 200]);
    }

    #[test]
    fn a_slow_first_tenth_shows_as_a_long_first_step() {
        let finishes = [300, 310, 320, 330, 340, 350, 360, 370, 380, 390].map(|f| 1_000 + f).to_vec();
        assert_eq!(seen(1_000, finishes).finished_ms_each_tenth()[..2], [300, 310]);
    }

    #[test]
    fn fewer_jobs_than_tenths_and_no_results_give_what_there_is() {
        assert_eq!(seen(0, vec![5, 7, 9]).finished_ms_each_tenth(), vec![5, 5, 5, 7, 7, 7, 9, 9, 9, 9]);
        let none = Seen { first_start: None, ..seen(0, Vec::new()) };
        assert!(none.finished_ms_each_tenth().is_empty());
    }
}
