//! Operational subcommands: init, submit, worker, status, cancel, results.

use anyhow::{bail, Context};
use fairway::config::Config;
use fairway::handlers::Registry;
use fairway::kafka::{self, Message};
use fairway::model::{Pool, Priority};
use fairway::store::Store;
use fairway::submit::{NewJob, Payload, Submitter};
use fairway::worker::{Policy, Worker, WorkerStart};
use fairway::{codec, now_ms};
use std::io::{BufRead, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

pub async fn init(cfg: &Config) -> anyhow::Result<ExitCode> {
    let topics = kafka::ensure_topics(cfg).await.context("creating topics")?;
    // [retention] on topics that existed before (new ones were created with it).
    let retention = match kafka::apply_retention(cfg).await {
        Ok(changed) => changed,
        Err(e) => {
            eprintln!("warning: cannot apply [retention] to existing topics ({e}); the broker must allow AlterConfigs");
            Vec::new()
        }
    };
    let tables = fairway::store::ensure_schema(cfg).await.context("creating keyspace and tables")?;
    let seeded = fairway::ops::tenants::seed(cfg).await.context("seeding the tenants registry from [tenants.*]")?;
    for r in &retention {
        println!("set {r}");
    }
    if topics.is_empty() && tables.is_empty() && seeded.is_empty() && retention.is_empty() {
        println!(
            "nothing to do: {} topics and keyspace {} already exist",
            kafka::all_topics(cfg).len(),
            cfg.scylla.keyspace
        );
    } else {
        for t in &topics {
            println!("created topic {t}");
        }
        for t in &tables {
            println!("created {t}");
        }
        for t in &seeded {
            println!("registered tenant {t} (from the config file)");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    /// Tenant id (must be configured).
    #[arg(long, required_unless_present = "ndjson")]
    pub tenant: Option<String>,
    /// Job type (must be configured).
    #[arg(long = "type", required_unless_present = "ndjson")]
    pub job_type: Option<String>,
    /// Payload text (a JSON object for the demo handlers).
    #[arg(long, conflicts_with_all = ["payload_file", "stdin"])]
    pub payload: Option<String>,
    /// Read the payload from a file.
    #[arg(long)]
    pub payload_file: Option<PathBuf>,
    /// Read the payload from standard input.
    #[arg(long)]
    pub stdin: bool,
    #[arg(long, value_enum, default_value = "normal")]
    pub priority: PriorityArg,
    /// Override the job type's pool.
    #[arg(long)]
    pub pool: Option<Pool>,
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Do not run before this time (epoch ms, or +duration like +30s).
    #[arg(long, value_parser = parse_time)]
    pub execute_at: Option<i64>,
    /// Keep --execute-at exactly (more than an hour ahead it is otherwise spread by up to
    /// ±60 s so jobs scheduled for one instant do not all start at once).
    #[arg(long)]
    pub exact_schedule: bool,
    /// Give up (result `expired`) if not started by this time (epoch ms or +duration).
    #[arg(long, value_parser = parse_time)]
    pub not_after: Option<i64>,
    /// Flow-control key (e.g. a job family, a downstream service): jobs with the same key
    /// share its fleet-wide parallelism and rate limits (`[flow]` in the config).
    #[arg(long)]
    pub flow_key: Option<String>,
    /// The end user the job is for: the front door's per-user rate window
    /// (`admission.user_rate`) is keyed by it.
    #[arg(long)]
    pub user_key: Option<String>,
    /// Jobs of a tenant with the same ordering key stay on one partition, in submission
    /// order (jobs without one spread over the tenant's partitions in no order).
    #[arg(long)]
    pub ordering_key: Option<String>,
    /// Submit many jobs from NDJSON (one JSON object per line; `-` for stdin), fields as
    /// in the HTTP API: tenant, job_type, payload, priority, idempotency_key, execute_at,
    /// not_after, flow_key, user_key, ordering_key.
    #[arg(long)]
    pub ndjson: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum PriorityArg {
    Urgent,
    Normal,
    Low,
}

impl From<PriorityArg> for Priority {
    fn from(p: PriorityArg) -> Priority {
        match p {
            PriorityArg::Urgent => Priority::Urgent,
            PriorityArg::Normal => Priority::Normal,
            PriorityArg::Low => Priority::Low,
        }
    }
}

fn parse_time(s: &str) -> Result<i64, String> {
    if let Some(d) = s.strip_prefix('+') {
        let d = humantime::parse_duration(d).map_err(|e| format!("{s:?}: {e}; write e.g. +30s or +5min"))?;
        return fairway::core::bounds::ahead("time", now_ms(), d).map_err(|e| format!("{s:?}: {e}"));
    }
    s.parse::<i64>().map_err(|_| format!("{s:?} is neither epoch milliseconds nor +duration (e.g. +30s)"))
}

/// Front-door admission of `jobs` (breakers as the store shows them now, queue depth,
/// rates); the error carries the API's code and message.
async fn admit(
    admission: &fairway::admission::Admission,
    submitter: &Submitter,
    jobs: &[NewJob],
) -> anyhow::Result<fairway::admission::Ticket> {
    admission.read_breakers_now().await?;
    let mut asks = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        let pool = submitter.validate(j, j.payload_bytes().len()).with_context(|| format!("job {}", i + 1))?;
        asks.push(fairway::admission::Ask {
            tenant: j.tenant.clone(),
            user_key: j.user_key.clone(),
            pool,
            job_type: j.job_type.clone(),
        });
    }
    admission.admit(asks).await.map_err(|r| {
        let e = fairway::api::ApiError::refused(&r);
        let wait = e.retry_after_secs.map(|s| format!(" (retry after {s}s)")).unwrap_or_default();
        anyhow::anyhow!("[{}] {}{wait}", e.code, e.message)
    })
}

pub async fn submit(cfg: &Arc<Config>, a: SubmitArgs) -> anyhow::Result<ExitCode> {
    let jobs = if let Some(path) = &a.ndjson {
        let reader: Box<dyn BufRead + Send> = if path.as_os_str() == "-" {
            Box::new(std::io::BufReader::new(std::io::stdin()))
        } else {
            Box::new(std::io::BufReader::new(
                std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
            ))
        };
        Jobs::Ndjson(reader)
    } else {
        Jobs::One(Box::new(job_from_flags(a)?))
    };
    match submit_jobs(cfg, jobs, &mut std::io::stdout()).await? {
        Submitted::Refused(e) => {
            eprintln!("error: {e:#}");
            Ok(ExitCode::FAILURE)
        }
        Submitted::Done { failed: 0 } => Ok(ExitCode::SUCCESS),
        Submitted::Done { .. } => Ok(ExitCode::FAILURE),
    }
}

/// What `fairway submit` sends: one job from its flags, or NDJSON lines.
pub(crate) enum Jobs {
    One(Box<NewJob>),
    Ndjson(Box<dyn BufRead + Send>),
}

/// How a `fairway submit` ended once its jobs were read.
pub(crate) enum Submitted {
    /// The front door refused the jobs (all or none): nothing was produced.
    Refused(anyhow::Error),
    /// Produced; `failed` jobs could not be (each reported on stderr).
    Done { failed: usize },
}

/// The job `fairway submit --tenant .. --type ..` describes.
fn job_from_flags(a: SubmitArgs) -> anyhow::Result<NewJob> {
    if let Some(key) = &a.idempotency_key {
        caller_key(key).context("--idempotency-key")?;
    }
    let payload = if let Some(p) = a.payload {
        p
    } else if let Some(f) = &a.payload_file {
        std::fs::read_to_string(f).with_context(|| format!("cannot read payload file {}", f.display()))?
    } else if a.stdin {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        String::new()
    };
    Ok(NewJob {
        tenant: a.tenant.unwrap_or_default(),
        job_type: a.job_type.unwrap_or_default(),
        payload: Payload::text(payload),
        priority: a.priority.into(),
        pool: a.pool,
        idempotency_key: a.idempotency_key,
        execute_at: a.execute_at,
        exact_schedule: a.exact_schedule,
        not_after: a.not_after,
        flow_key: a.flow_key,
        user_key: a.user_key,
        ordering_key: a.ordering_key,
        generation: 0,
        // W3C trace context from the environment (the OpenTelemetry convention for
        // processes): a CI job or script that runs in a trace passes it on.
        traceparent: std::env::var("TRACEPARENT").ok(),
        tracestate: std::env::var("TRACESTATE").ok(),
        ..Default::default()
    })
}

/// A caller's idempotency key, refused in fairway's own namespace as the API refuses it.
fn caller_key(key: &str) -> anyhow::Result<()> {
    fairway::core::unique::check_caller_key(key).map_err(anyhow::Error::msg)
}

/// Reads NDJSON jobs, each checked as the API checks it; the error names the line.
fn read_ndjson(reader: Box<dyn BufRead + Send>, submitter: &Submitter) -> anyhow::Result<Vec<NewJob>> {
    let mut jobs = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let job: NewJob = serde_json::from_str(&line).with_context(|| {
            format!("line {}: not a job object (fields: tenant, job_type, payload, priority, idempotency_key, execute_at, not_after, flow_key, user_key, ordering_key)", i + 1)
        })?;
        if let Some(key) = &job.idempotency_key {
            caller_key(key).with_context(|| format!("line {}", i + 1))?;
        }
        submitter.validate(&job, job.payload_bytes().len()).with_context(|| format!("line {}", i + 1))?;
        jobs.push(job);
    }
    Ok(jobs)
}

/// Most jobs of one `fairway submit --ndjson` in flight at once.
const SUBMIT_IN_FLIGHT: usize = 2048;

/// `fairway submit`'s path (also what `fairway-bench bench submit` measures): connects, reads
/// and checks the jobs, passes the front door (all or none), produces them concurrently
/// and writes one line per job to `out` (its id, or that it was a duplicate).
pub(crate) async fn submit_jobs(
    cfg: &Arc<Config>,
    jobs: Jobs,
    out: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<Submitted> {
    // The store: idempotency keys, and the tenants registry that validates tenants.
    let store = Store::open(cfg).await?;
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let live = fairway::ops::tenants::LiveTenants::start(cfg.clone(), &store, stopped).await?;
    let submitter = Submitter::new(cfg.clone(), Some(store.clone()))?.with_tenants(live.clone());
    // The pool classifier's decisions, read once before the jobs are routed.
    submitter.refresh_classes().await;
    let jobs = match jobs {
        Jobs::One(job) => vec![*job],
        Jobs::Ndjson(reader) => read_ndjson(reader, &submitter)?,
    };
    // The front door, as for the HTTP API: all jobs or none, before anything is written.
    let admission = fairway::admission::Admission::connect(cfg.clone(), &store, Some(live)).await?;
    let ticket = match admit(&admission, &submitter, &jobs).await {
        Ok(t) => t,
        Err(e) => return Ok(Submitted::Refused(e)),
    };
    // Submit concurrently, a bounded number in flight (each holds its encoded record and
    // the producer's delivery future); the producer batches and keeps per-partition order.
    use futures::StreamExt;
    let results: Vec<_> =
        futures::stream::iter(jobs.iter().map(|j| submitter.submit(j))).buffered(SUBMIT_IN_FLIGHT).collect().await;
    let accepted: Vec<Option<String>> =
        results.iter().map(|r| r.as_ref().ok().filter(|s| !s.duplicate).map(|s| s.job_id.clone())).collect();
    admission.settle(ticket, &accepted).await;
    let mut failed = 0;
    for r in results {
        match r {
            Ok(s) if s.duplicate => writeln!(out, "{}\tduplicate (idempotency key already used)", s.job_id)?,
            Ok(s) => writeln!(out, "{}", s.job_id)?,
            Err(e) => {
                failed += 1;
                eprintln!("error: {e}");
            }
        }
    }
    Ok(Submitted::Done { failed })
}

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// Pools to serve, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "short,medium,long")]
    pub pools: Vec<Pool>,
    /// Dispatch policy.
    #[arg(long, value_enum, default_value = "fair")]
    pub policy: Policy,
    /// Serve Prometheus metrics, /readyz and /livez on 127.0.0.1:PORT (overrides
    /// worker.metrics_listen; 0 = off).
    #[arg(long)]
    pub metrics_port: Option<u16>,
}

pub async fn worker(cfg: Arc<Config>, a: WorkerArgs) -> anyhow::Result<ExitCode> {
    let listen = if a.metrics_port.is_some() { None } else { cfg.worker.metrics_listen.as_deref() };
    let probes = fairway::observe::probes::Probes::worker(&a.pools);
    // The listener is up before the worker starts: /livez answers during the start and
    // /readyz says what it still waits for.
    let (stop_probes, probes_stopped) = tokio::sync::watch::channel(false);
    let mut probe_task = None;
    if let Some(at) = fairway::metrics::listen_addr(listen, a.metrics_port.unwrap_or(0))? {
        let recorder = fairway::metrics::install_recorder()?;
        let router = fairway::observe::probes::router(probes.clone(), Some(recorder));
        let (addr, task) = fairway::observe::probes::serve(at, router, probes_stopped).await.with_context(|| {
            format!("cannot listen on {at} for /metrics (in use? pick another with worker.metrics_listen or --metrics-port)")
        })?;
        eprintln!("metrics and probes on http://{addr}/metrics, /readyz, /livez");
        probe_task = Some(task);
    }
    let registry = Registry::from_config(&cfg, Default::default()).map_err(anyhow::Error::msg)?;
    let start = WorkerStart { pools: &a.pools, policy: a.policy, probes };
    let w = Worker::start_with(cfg, registry, start).await?;
    eprintln!("worker {} serving pools {:?}; SIGTERM or Ctrl-C drains it", w.worker_id, a.pools);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut signals = async move || {
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.map(|_| "SIGINT"),
            _ = term.recv() => Ok("SIGTERM"),
        }
    };
    let watch = w.watch.clone();
    let first = tokio::select! {
        sig = signals() => sig?,
        why = watch.gave_up() => return give_up(w, &why).await,
    };
    eprintln!("{first}: draining (no new work; running jobs finish within each pool's drain_timeout, then are handed off); a second signal hands off at once");
    // A second signal: every running job is asked to stop now and handed off.
    let shared = w.shared.clone();
    let second = tokio::spawn(async move {
        if let Ok(sig) = signals().await {
            eprintln!("{sig} again: handing running jobs off now");
            for sh in &shared {
                sh.route.request_stop_all();
            }
        }
    });
    w.stop().await;
    second.abort();
    let _ = stop_probes.send(true);
    if let Some(t) = probe_task {
        let _ = t.await;
    }
    eprintln!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Exit status of a worker that gave up (`worker::watchdog`): its supervisor restarts it.
const GAVE_UP: u8 = 75;

/// How long a worker that gave up takes at most to exit: its pools skip the drain
/// timeout (two hand-off phases remain), and its other tasks get a few seconds more.
const GIVE_UP_WITHIN: Duration = fairway::worker::pool::HAND_OFF_GRACE.saturating_mul(3);

/// The worker cannot serve its partitions (a fatal client error, the store unreachable
/// too long): leave the groups at once, hand running jobs off where possible, and exit
/// non-zero within [`GIVE_UP_WITHIN`] so the supervisor restarts it. What could not
/// settle by then is not committed: the partitions' next owners run it.
async fn give_up(w: Worker, why: &str) -> anyhow::Result<ExitCode> {
    eprintln!("giving up: {why}; leaving the consumer groups and exiting with status {GAVE_UP}");
    for sh in &w.shared {
        sh.route.request_stop_all();
    }
    if tokio::time::timeout(GIVE_UP_WITHIN, w.stop()).await.is_err() {
        eprintln!("giving up: the worker's tasks did not end within {GIVE_UP_WITHIN:?}; exiting without them");
    }
    Ok(ExitCode::from(GAVE_UP))
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    pub job_id: String,
    #[arg(long)]
    pub json: bool,
    /// Show live progress until the job ends (a progress bar; with --json, one event per line).
    #[arg(long)]
    pub follow: bool,
    /// With --follow: give up after this long (e.g. 10min); 0 = until the job ends.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

pub async fn status(cfg: &Config, a: StatusArgs) -> anyhow::Result<ExitCode> {
    if a.follow {
        return super::watch::follow(cfg, &a.job_id, a.json, a.timeout).await;
    }
    let store = Store::open(cfg).await?;
    let Some(row) = store.job(&a.job_id).await? else {
        if a.json {
            println!("{}", serde_json::json!({"job_id": a.job_id, "status": "unknown"}));
        } else {
            println!(
                "{}: no state (never submitted, expired after retention.results, or produced straight to Kafka and not \
                 seen by a worker yet)",
                a.job_id
            );
        }
        return Ok(ExitCode::from(2));
    };
    // Heartbeats only mean something while the job runs (they expire shortly after).
    let hb = if row.is_terminal() { None } else { store.heartbeat(&a.job_id).await? };
    let now = now_ms();
    if a.json {
        let v = serde_json::json!({
            "job_id": row.job_id, "tenant": row.tenant, "job_type": row.job_type, "pool": row.pool,
            "status": row.status, "attempts": row.attempts, "crash_count": row.crash_count,
            "generation": row.generation, "submitted_at": row.submitted_at, "started_at": row.started_at,
            "finished_at": row.finished_at, "worker": row.worker, "error": row.error,
            "failure_class": row.failure_class, "cancel_requested": row.cancel_requested.unwrap_or(false),
            "output": row.output.as_ref().map(|o| String::from_utf8_lossy(o).into_owned()),
            "progress": hb.as_ref().and_then(|h| h.progress),
            "progress_message": hb.as_ref().and_then(|h| h.message.clone()),
            "heartbeat_age_ms": hb.as_ref().and_then(|h| h.at).map(|t| now - t),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        println!("job        {}", row.job_id);
        println!("status     {}", opt(&row.status));
        println!("tenant     {}   type {}   pool {}", opt(&row.tenant), opt(&row.job_type), opt(&row.pool));
        println!(
            "attempts   {}   crashes {}   generation {}",
            row.attempts.unwrap_or(0),
            row.crash_count.unwrap_or(0),
            row.generation.unwrap_or(0)
        );
        if let Some(w) = &row.worker {
            println!("worker     {w}");
        }
        if let (Some(s), Some(f)) = (row.started_at, row.finished_at) {
            println!("ran        {} ms", f - s);
        }
        if let Some(h) = &hb {
            println!(
                "progress   {:.0}% {}   (heartbeat {:.1}s ago)",
                h.progress.unwrap_or(0.0) * 100.0,
                h.message.clone().unwrap_or_default(),
                h.at.map(|t| (now - t) as f64 / 1000.0).unwrap_or(f64::NAN)
            );
        }
        if let Some(e) = &row.error {
            println!("error      {} ({})", e, opt(&row.failure_class));
        }
        if row.cancel_requested == Some(true) {
            println!("cancel     requested");
        }
        if let Some(o) = &row.output {
            println!("output     {}", String::from_utf8_lossy(&o[..o.len().min(200)]));
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    pub job_id: String,
}

pub async fn cancel(cfg: &Config, a: CancelArgs) -> anyhow::Result<ExitCode> {
    let store = Store::open(cfg).await?;
    if let Some(row) = store.job(&a.job_id).await? {
        if row.is_terminal() {
            println!("{} already finished ({}); nothing to cancel", a.job_id, row.status.unwrap_or_default());
            return Ok(ExitCode::SUCCESS);
        }
    }
    store.request_cancel(&a.job_id, now_ms()).await?;
    println!(
        "cancellation requested for {}: a queued job is skipped, a running one is told through its heartbeat",
        a.job_id
    );
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct ResultsArgs {
    /// Keep waiting for new results.
    #[arg(long)]
    pub follow: bool,
    #[arg(long)]
    pub tenant: Option<String>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
    /// Stop after this many results.
    #[arg(long)]
    pub limit: Option<usize>,
}

pub async fn results(cfg: &Config, a: ResultsArgs) -> anyhow::Result<ExitCode> {
    let topic = cfg.results_topic();
    let (c, group, t) = (cfg.clone(), cfg.group(&format!("cli.results.{}", uuid::Uuid::new_v4())), topic.clone());
    let consumer = std::sync::Arc::new(
        tokio::task::spawn_blocking(move || kafka::reader_from_start(&c, &group, &t))
            .await?
            .map_err(|e| anyhow::anyhow!("reading {topic}: {e}"))?,
    );
    // Without --follow: what was on the topic when the command started, up to each
    // partition's high watermark taken now (later results are left for the next run).
    let mut ends: std::collections::HashMap<i32, i64> = if a.follow {
        Default::default()
    } else {
        let ends = kafka::partition_ends(consumer.clone(), topic.clone()).await;
        ends.map_err(|e| anyhow::anyhow!("reading the ends of {topic}: {e}"))?.into_iter().collect()
    };
    let mut n = 0usize;
    loop {
        if !a.follow {
            ends.retain(|p, end| *end > 0 && kafka::position(&consumer, &topic, *p).is_none_or(|at| at < *end));
            if ends.is_empty() {
                break;
            }
        }
        let msg = match tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await {
            Err(_) => continue,
            Ok(Err(e)) => bail!("reading {topic}: {e}"),
            Ok(Ok(m)) => m,
        };
        if ends.get(&msg.partition()).is_some_and(|end| msg.offset() + 1 >= *end) {
            ends.remove(&msg.partition());
        }
        let Some(bytes) = msg.payload() else { continue };
        let r = match codec::decode_result(bytes) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipping undecodable record at offset {}: {e}", msg.offset());
                continue;
            }
        };
        if a.tenant.as_ref().is_some_and(|t| *t != r.tenant) {
            continue;
        }
        if a.json {
            let v = serde_json::json!({
                "job_id": r.job_id, "tenant": r.tenant, "job_type": r.job_type, "pool": r.pool.as_str(),
                "status": r.status.as_str(), "attempts": r.attempts, "error": r.error,
                "failure_class": r.failure_class.map(|c| c.as_str()),
                "output": r.output.as_ref().map(|o| String::from_utf8_lossy(o).into_owned()),
                "submitted_at": r.submitted_at, "finished_at": r.finished_at, "worker_id": r.worker_id,
            });
            println!("{v}");
        } else {
            println!(
                "{}  {:<9} {:<10} {:<8} attempts={} {}",
                r.job_id,
                r.status.as_str(),
                r.tenant,
                r.job_type,
                r.attempts,
                r.error.unwrap_or_default()
            );
        }
        n += 1;
        if a.limit.is_some_and(|l| n >= l) {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod submit_tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: SubmitArgs,
    }

    fn args(extra: &[&str]) -> SubmitArgs {
        let mut argv = vec!["fairway", "--tenant", "acme", "--type", "echo"];
        argv.extend(extra);
        Cli::try_parse_from(argv).expect("flags").a
    }

    #[test]
    fn submit_refuses_the_reserved_idempotency_prefix_as_the_api_does() {
        let e = job_from_flags(args(&["--idempotency-key", "fairway.unique/report"])).unwrap_err();
        let why = format!("{e:#}");
        assert!(why.contains("--idempotency-key") && why.contains("reserved for fairway's own keys"), "{why}");
        let job = job_from_flags(args(&["--idempotency-key", "order-4711"])).expect("an own key");
        assert_eq!(job.idempotency_key.as_deref(), Some("order-4711"));
        let lines = "{\"tenant\":\"acme\",\"job_type\":\"echo\",\"idempotency_key\":\"fairway.schedule/x/1\"}\n";
        let submitter = Submitter::new(Arc::new(Config::builtin()), None).expect("submitter");
        let e = read_ndjson(Box::new(std::io::Cursor::new(lines)), &submitter).unwrap_err();
        assert!(format!("{e:#}").contains("line 1: idempotency_key \"fairway.schedule/x/1\""), "{e:#}");
    }
}
