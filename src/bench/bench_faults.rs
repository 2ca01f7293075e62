//! `fairway-bench bench faults`: the fault suite. Starts `--workers` worker processes (child
//! processes of this binary, on a deployment of their own: topic prefix `faults<ms>.`,
//! keyspace `fairway_faults`), submits `--jobs` sleep jobs plus one poison job (a payload
//! the handler refuses) and one malformed (non-Avro) message, and while the jobs are in
//! flight kills a random worker with SIGKILL and restarts it at once, `--kills` times
//! (evenly spread over the run by progress), optionally restarting the CQL database once
//! half way (`--cql-restart`: `scripts/services down cassandra` then `up cassandra`).
//!
//! It counts lost jobs (no terminal result), duplicate results (more than one result per
//! job id on the results topic), jobs run twice (the sleep handler's executions per job
//! id, appended by every worker to one `FAIRWAY_RUN_LOG` file) and whether the poison and
//! malformed messages reached the DLQ. Every wait is bounded. Last line JSON.

use super::bench_flood::{produce, record, round2, ResultFeed};
use super::bench_ownership;
use super::Global;
use anyhow::Context;
use fairway::config::Config;
use fairway::kafka::Producer;
use fairway::kafka::{self, Consumer, Message};
use fairway::model::{JobResult, Pool};
use fairway::{codec, now_ms};
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct FaultsArgs {
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Sleep jobs submitted at once.
    #[arg(long, default_value_t = 10_000)]
    pub jobs: usize,
    /// Run time of one job, ms.
    #[arg(long, default_value_t = 200)]
    pub job_ms: u64,
    /// SIGKILLs of a random worker (restarted at once), spread evenly over the run.
    #[arg(long, default_value_t = 4)]
    pub kills: usize,
    /// Restart the CQL database (Cassandra, through --services) once, half way.
    #[arg(long)]
    pub cql_restart: bool,
    /// The local services script (run with `down cassandra` / `up cassandra`).
    #[arg(long, default_value = "scripts/services")]
    pub services: PathBuf,
    /// A shell command that restarts the broker (run once at 60 % of the jobs, bounded to
    /// 150 s), e.g. `scripts/services down kafka && sleep 20 && scripts/services up kafka`; see docs/testing.md.
    #[arg(long)]
    pub broker_restart_cmd: Option<String>,
    /// One rolling restart of every worker at 30 % of the jobs, the way a Kubernetes
    /// rollout does it: each worker's replacement starts as it gets SIGTERM, the next
    /// worker follows once the old one exited, whoever owns what.
    #[arg(long)]
    pub rollout: bool,
    /// With `--rollout` and `--cql-restart`: the rollout starts once the CQL database is
    /// down (not at 30 %), so the workers leave and join the group during the outage.
    #[arg(long, requires_all = ["rollout", "cql_restart"])]
    pub rollout_in_outage: bool,
    /// The workers' `kafka.group_protocol`: classic or consumer (KIP-848).
    #[arg(long, value_enum, default_value_t = Protocol::Classic)]
    pub group_protocol: Protocol,
    /// With `--group-protocol classic`: the workers' `kafka.assignor`, range (the
    /// default) or cooperative-sticky.
    #[arg(long, value_enum, default_value_t = Assignor::Range)]
    pub assignor: Assignor,
    /// Quiet tenants (q0..q5) submit one 1 ms job each this often while the jobs run;
    /// their waits (submitted -> started) are reported. 0: none.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub quiet_every: Duration,
    /// Slots of the short pool per worker.
    #[arg(long, default_value_t = 64)]
    pub slots: usize,
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// The workers' kafka.session_timeout (how fast a killed worker's partitions move).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub session_timeout: Duration,
    /// How long to keep reading results after every job has one (late duplicates).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub settle: Duration,
    /// Most time from the first submission until every job has a result.
    #[arg(long, default_value = "600s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// The fairway binary the workers run (default: this one).
    #[arg(long)]
    pub worker_bin: Option<PathBuf>,
    /// Keep the run directory (workers' config and logs, the run log) for a look.
    #[arg(long)]
    pub keep: bool,
}

/// `--group-protocol`: the workers' `kafka.group_protocol`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    Classic,
    /// KIP-848.
    Consumer,
}

impl Protocol {
    fn as_str(self) -> &'static str {
        match self {
            Protocol::Classic => "classic",
            Protocol::Consumer => "consumer",
        }
    }
}

/// `--assignor`: the workers' `kafka.assignor` under the classic protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Assignor {
    Range,
    CooperativeSticky,
}

impl Assignor {
    fn as_str(self) -> &'static str {
        match self {
            Assignor::Range => "range",
            Assignor::CooperativeSticky => "cooperative-sticky",
        }
    }
}

const TENANTS: [&str; 3] = ["fa", "fb", "fc"];
const QUIET: [&str; 6] = ["q0", "q1", "q2", "q3", "q4", "q5"];
const MALFORMED: &[u8] = b"this is not an Avro single-object message";

pub async fn run(g: &Global, a: FaultsArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.workers > 0 && a.jobs > 0, "--workers and --jobs must be positive");
    let run = RunDir::create(g, &a)?;
    let cfg = run.cfg.clone();
    kafka::ensure_topics(&cfg).await.context("creating the bench topics (scripts/services up?)")?;
    fairway::store::ensure_schema(&cfg).await?;
    fairway::ops::tenants::seed(&cfg).await?;
    let mut feed = ResultFeed::start(&cfg)?;
    let mut fleet = Fleet::start(&a, &run)?;
    let producer = kafka::producer(&cfg)?;
    warm_up(&cfg, &producer, &mut feed).await?;
    eprintln!("faults: {} workers up; submitting {} jobs of {} ms", a.workers, a.jobs, a.job_ms);

    let t0 = Instant::now();
    let sent = submit(&a, &cfg, &producer).await?;
    let mut tally = Tally::default();
    let faults = run_faults(&a, &mut fleet, &mut feed, &sent, &mut tally, t0).await;
    let duration = t0.elapsed();
    let restarts = fleet.starts - a.workers;
    drop(fleet);
    feed.stop().await;
    let faults = faults?;

    let dlq = dead_lettered(&cfg, &sent, Duration::from_secs(30)).await?;
    let runs = count_runs(&run.run_log, &sent.ids)?;
    let ownership = ownership(&run.dir, &a, &faults);
    let report = report(&a, &sent, &tally, &faults, &dlq, &runs, duration, restarts);
    let report = with_rollout(report, &tally, faults.rollout, ownership);
    eprintln!("faults: run directory {}", run.dir.display());
    if !a.keep {
        let _ = std::fs::remove_dir_all(&run.dir);
    }
    let ok = report["lost"] == 0 && report["poison_dead_lettered"] == true && report["malformed_dead_lettered"] == true;
    println!("{report}");
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

// ---------------------------------------------------------------------------------------
// The deployment: one config file shared by the bench and its worker processes.

struct RunDir {
    dir: PathBuf,
    config_path: PathBuf,
    run_log: PathBuf,
    cfg: Arc<Config>,
}

impl RunDir {
    fn create(g: &Global, a: &FaultsArgs) -> anyhow::Result<Self> {
        let base = g.load()?;
        let id = now_ms();
        let dir = std::env::temp_dir().join(format!("fairway-faults-{id}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let text = config_text(&base, a, &format!("faults{id}."));
        let config_path = dir.join("fairway.toml");
        std::fs::write(&config_path, &text)?;
        let mut cfg = Config::parse(&text, &config_path.display().to_string())?;
        cfg.kafka.properties = base.kafka.properties.clone();
        cfg.apply_env(std::env::vars());
        Ok(RunDir { run_log: dir.join("runs.log"), dir, config_path, cfg: Arc::new(cfg) })
    }
}

/// The workers' configuration: the services of `base`, a fresh topic prefix, the faults
/// keyspace, the three tenants and the sleep job type.
fn config_text(base: &Config, a: &FaultsArgs, prefix: &str) -> String {
    let contact_points: Vec<String> = base.scylla.contact_points.iter().map(|c| format!("{c:?}")).collect();
    let mut text = format!(
        "[kafka]\nbrokers = {:?}\ntopic_prefix = {prefix:?}\npartitions = {}\nsession_timeout = \"{}ms\"\n\
         group_protocol = {:?}\n{}\
         [scylla]\ncontact_points = [{}]\nkeyspace = \"fairway_faults\"\n\
         [pools.short]\nslots = {}\n\
         [job_types.sleep]\npool = \"short\"\nhandler = \"sleep\"\ntimeout = \"10s\"\n",
        base.kafka.brokers,
        a.partitions,
        a.session_timeout.as_millis(),
        a.group_protocol.as_str(),
        match a.group_protocol {
            Protocol::Classic => format!("assignor = {:?}\n", a.assignor.as_str()),
            Protocol::Consumer => String::new(),
        },
        contact_points.join(", "),
        a.slots,
    );
    for t in TENANTS.iter().chain(&QUIET) {
        text.push_str(&format!("[tenants.{t}]\ntier = \"standard\"\n"));
    }
    text
}

// ---------------------------------------------------------------------------------------
// The worker processes.

/// The worker processes; every one still running is killed (SIGKILL) and reaped on drop,
/// on every exit path including a panic.
struct Fleet {
    bin: PathBuf,
    config: Arc<Config>,
    config_path: PathBuf,
    run_log: PathBuf,
    dir: PathBuf,
    children: Vec<Child>,
    /// Processes started so far (the initial ones and the restarts).
    starts: usize,
}

impl Fleet {
    fn start(a: &FaultsArgs, run: &RunDir) -> anyhow::Result<Self> {
        let bin = match &a.worker_bin {
            Some(b) => b.clone(),
            None => std::env::current_exe().context("locating the fairway binary")?,
        };
        let mut fleet = Fleet {
            bin,
            config: run.cfg.clone(),
            config_path: run.config_path.clone(),
            run_log: run.run_log.clone(),
            dir: run.dir.clone(),
            children: Vec::new(),
            starts: 0,
        };
        for i in 0..a.workers {
            let c = fleet.spawn(i)?;
            fleet.children.push(c);
        }
        Ok(fleet)
    }

    fn spawn(&mut self, i: usize) -> anyhow::Result<Child> {
        let log = std::fs::File::create(self.dir.join(format!("worker{i}-{}.log", self.starts)))?;
        self.starts += 1;
        let child = std::process::Command::new(&self.bin)
            .arg("--config")
            .arg(&self.config_path)
            .args(["worker", "--pools", "short"])
            .env(fairway::handlers::RUN_LOG_ENV, &self.run_log)
            .env("FAIRWAY_LOG", "warn,fairway=info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} worker", self.bin.display()))?;
        Ok(child)
    }

    /// SIGKILL worker `i`, reap it, start a new one in its place at once.
    fn kill_restart(&mut self, i: usize) -> anyhow::Result<u32> {
        let pid = self.children[i].id();
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
        self.children[i] = self.spawn(i)?;
        Ok(pid)
    }

    /// Workers that exited on their own (none should): restarted, counted.
    fn restart_exited(&mut self) -> anyhow::Result<usize> {
        let mut n = 0;
        for i in 0..self.children.len() {
            if let Ok(Some(status)) = self.children[i].try_wait() {
                eprintln!("faults: worker {i} (pid {}) exited on its own: {status}", self.children[i].id());
                self.children[i] = self.spawn(i)?;
                n += 1;
            }
        }
        Ok(n)
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Submissions.

struct Sent {
    ids: HashSet<String>,
    poison_id: String,
    /// (partition, offset) of the malformed message.
    malformed_at: (i32, i64),
}

/// A zero-length sleep job per tenant through the whole path; returns once each has a
/// result (the workers have partitions and warm connections).
async fn warm_up(cfg: &Config, producer: &Producer, feed: &mut ResultFeed) -> anyhow::Result<()> {
    let topic = cfg.pool_topic(Pool::Short);
    let mut want = HashMap::new();
    for t in TENANTS {
        let rec = record(t, "sleep", serde_json::json!({ "ms": 0 }));
        let partition = produce(producer, &topic, &rec).await?;
        want.insert(rec.job_id, partition);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while !want.is_empty() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "warm-up jobs got no results within 120 s: {want:?} (job id: partition; worker logs kept with --keep)"
        );
        if let Ok(Some((r, _))) = tokio::time::timeout(Duration::from_millis(500), feed.rx.recv()).await {
            want.remove(&r.job_id);
        }
    }
    Ok(())
}

/// The jobs, then one poison job (a payload the sleep handler refuses: dead-lettered as
/// permanent) and one malformed message, as fast as the broker takes them.
async fn submit(a: &FaultsArgs, cfg: &Config, producer: &Producer) -> anyhow::Result<Sent> {
    let topic = cfg.pool_topic(Pool::Short);
    let recs: Vec<_> = (0..a.jobs)
        .map(|i| record(TENANTS[i % TENANTS.len()], "sleep", serde_json::json!({ "ms": a.job_ms })))
        .collect();
    let ids = recs.iter().map(|r| r.job_id.clone()).collect();
    let mut sends = futures::stream::iter(recs.iter().map(|r| produce(producer, &topic, r))).buffered(1024);
    while let Some(r) = sends.next().await {
        r?;
    }
    let mut poison = record(TENANTS[0], "sleep", serde_json::Value::Null);
    poison.payload = b"{ this is not the sleep handler's JSON".to_vec();
    produce(producer, &topic, &poison).await?;
    let malformed_at = kafka::send(producer, &topic, TENANTS[1], MALFORMED).await?;
    Ok(Sent { ids, poison_id: poison.job_id, malformed_at })
}

// ---------------------------------------------------------------------------------------
// The faults, while results come in.

#[derive(Default)]
struct Tally {
    /// Results per submitted job id.
    results: HashMap<String, u32>,
    /// Jobs by the status of their first result.
    statuses: BTreeMap<String, u64>,
    /// Quiet tenants' first results: (started at, wait from submission to start), ms.
    quiet: HashMap<String, (i64, i64)>,
}

impl Tally {
    fn add(&mut self, r: &JobResult, sent: &Sent) {
        if QUIET.contains(&r.tenant.as_str()) {
            let started = r.started_at.unwrap_or(r.finished_at);
            self.quiet.entry(r.job_id.clone()).or_insert((started, started - r.submitted_at));
            return;
        }
        if sent.ids.contains(&r.job_id) {
            let n = self.results.entry(r.job_id.clone()).or_default();
            *n += 1;
            if *n == 1 {
                *self.statuses.entry(format!("{:?}", r.status).to_lowercase()).or_default() += 1;
            }
        }
    }
}

#[derive(Default)]
struct Faults {
    kill_at_s: Vec<f64>,
    cql_restart_s: Option<f64>,
    cql_restart_error: Option<String>,
    broker_restart_s: Option<f64>,
    broker_restart_error: Option<String>,
    unexpected_exits: usize,
    /// The rollout's window (Unix ms), when one ran.
    rollout: Option<(i64, i64)>,
}

/// Reads results until every job has one (then `--settle` more) or `--timeout` passes,
/// killing a random worker at each 1/(kills+1) of progress and restarting the CQL
/// database at half way when asked.
async fn run_faults(
    a: &FaultsArgs,
    fleet: &mut Fleet,
    feed: &mut ResultFeed,
    sent: &Sent,
    tally: &mut Tally,
    t0: Instant,
) -> anyhow::Result<Faults> {
    let mut faults = Faults::default();
    let mut cql: Option<tokio::task::JoinHandle<anyhow::Result<f64>>> = None;
    // Set by the CQL restart once the database is down (`--rollout-in-outage`).
    let cql_down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut broker: Option<tokio::task::JoinHandle<anyhow::Result<f64>>> = None;
    let deadline = t0 + a.timeout;
    let mut settle_until: Option<Instant> = None;
    let mut rollout: Option<Rollout> = None;
    let quiet = (!a.quiet_every.is_zero()).then(|| tokio::spawn(quiet_jobs(fleet.config.clone(), a.quiet_every)));
    while Instant::now() < settle_until.unwrap_or(deadline) {
        drain(feed, sent, tally, Duration::from_millis(200)).await;
        let done = tally.results.len();
        let rollout_due = if a.rollout_in_outage {
            cql_down.load(std::sync::atomic::Ordering::SeqCst)
        } else {
            done >= a.jobs * 3 / 10
        };
        if a.rollout && rollout.is_none() && rollout_due {
            eprintln!("faults: rolling restart of {} workers at {done}/{} done", a.workers, a.jobs);
            rollout = Some(Rollout { started: now_ms(), next: 0, stopping: None });
        }
        if let Some(r) = rollout.as_mut() {
            if let Some(window) = r.step(fleet)? {
                faults.rollout = Some(window);
            }
        }
        if faults.kill_at_s.len() < a.kills && done >= (faults.kill_at_s.len() + 1) * a.jobs / (a.kills + 1) {
            let i = rand::random_range(0..fleet.children.len());
            let pid = fleet.kill_restart(i)?;
            faults.kill_at_s.push(round2(t0.elapsed().as_secs_f64()));
            eprintln!("faults: kill -9 worker {i} (pid {pid}) at {done}/{} done; restarted", a.jobs);
        }
        if a.cql_restart && cql.is_none() && done >= a.jobs / 2 {
            eprintln!("faults: restarting the CQL database at {done}/{} done", a.jobs);
            cql = Some(tokio::spawn(restart_cql(a.services.clone(), cql_down.clone())));
        }
        if let (Some(cmd), None) = (&a.broker_restart_cmd, &broker) {
            if done >= a.jobs * 3 / 5 {
                eprintln!("faults: restarting the broker at {done}/{} done", a.jobs);
                broker = Some(tokio::spawn(run_bounded(cmd.clone())));
            }
        }
        faults.unexpected_exits += fleet.restart_exited()?;
        if done == a.jobs && settle_until.is_none() {
            settle_until = Some(Instant::now() + a.settle);
        }
        if settle_until.is_some() {
            if let Some(q) = &quiet {
                q.abort();
            }
        }
    }
    if let Some(q) = quiet {
        q.abort();
        if let Ok(Err(e)) = q.await {
            eprintln!("faults: the quiet tenants' submissions stopped: {e:#}");
        }
    }
    if let Some(task) = cql {
        match task.await? {
            Ok(s) => faults.cql_restart_s = Some(round2(s)),
            Err(e) => faults.cql_restart_error = Some(format!("{e:#}")),
        }
    }
    if let Some(task) = broker {
        match task.await? {
            Ok(s) => faults.broker_restart_s = Some(round2(s)),
            Err(e) => faults.broker_restart_error = Some(format!("{e:#}")),
        }
    }
    Ok(faults)
}

/// An ungated rolling restart in progress (`--rollout`).
struct Rollout {
    started: i64,
    /// The next worker to replace.
    next: usize,
    /// The old worker stopping (SIGTERM sent), if any.
    stopping: Option<Child>,
}

impl Rollout {
    /// One step, without blocking: once the stopping worker exited, the next one is
    /// replaced. Returns the rollout's window when the last old worker exited.
    fn step(&mut self, fleet: &mut Fleet) -> anyhow::Result<Option<(i64, i64)>> {
        if let Some(old) = self.stopping.as_mut() {
            if old.try_wait()?.is_none() {
                return Ok(None);
            }
            self.stopping = None;
            if self.next == fleet.children.len() {
                self.next += 1;
                return Ok(Some((self.started, now_ms())));
            }
        }
        if self.next >= fleet.children.len() {
            return Ok(None);
        }
        let replacement = fleet.spawn(self.next)?;
        let mut old = std::mem::replace(&mut fleet.children[self.next], replacement);
        let pid = old.id().to_string();
        let sent = std::process::Command::new("kill").args(["-TERM", &pid]).status();
        if !sent.is_ok_and(|s| s.success()) {
            let _ = old.kill();
        }
        eprintln!("faults: rollout: SIGTERM worker {} (pid {pid}), its replacement started", self.next);
        self.stopping = Some(old);
        self.next += 1;
        Ok(None)
    }
}

/// Submits one 1 ms sleep job per quiet tenant every `every`, until aborted.
async fn quiet_jobs(cfg: Arc<Config>, every: Duration) -> anyhow::Result<()> {
    let producer = kafka::producer(&cfg)?;
    let topic = cfg.pool_topic(Pool::Short);
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        for t in QUIET {
            produce(&producer, &topic, &record(t, "sleep", serde_json::json!({ "ms": 1 }))).await?;
        }
    }
}

/// How long after the last old worker exited the rollout's window stays open: the new
/// members' joins and the rebalances they cause belong to the rollout.
const ROLLOUT_TAIL_MS: i64 = 10_000;

/// Per partition, how long it had no owner during the rollout (from the workers' logs).
fn ownership(dir: &Path, a: &FaultsArgs, faults: &Faults) -> Option<serde_json::Value> {
    let (from, to) = faults.rollout?;
    let to = to + ROLLOUT_TAIL_MS;
    let mut timelines = Vec::new();
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("worker") && name.ends_with(".log") {
            timelines.push(bench_ownership::timeline(&std::fs::read_to_string(e.path()).unwrap_or_default()));
        }
    }
    let gaps = bench_ownership::unowned(&timelines, a.partitions, from, to);
    let mut longest: Vec<i64> = gaps.values().map(|(_, l)| *l).collect();
    longest.sort_unstable();
    let total: i64 = gaps.values().map(|(t, _)| *t).sum();
    Some(serde_json::json!({
        "rollout_s": round2((to - ROLLOUT_TAIL_MS - from) as f64 / 1000.0),
        "window_s": round2((to - from) as f64 / 1000.0),
        "unowned_ms_per_partition": gaps.values().map(|(t, _)| *t).collect::<Vec<_>>(),
        "longest_unowned_ms_p50": longest.get(longest.len() / 2),
        "longest_unowned_ms_max": longest.last(),
        "unowned_ms_total": total,
    }))
}

/// The report with the rollout's ownership gaps and the quiet tenants' waits (all, and
/// of the jobs that started in the rollout's window).
fn with_rollout(
    mut report: serde_json::Value,
    tally: &Tally,
    window: Option<(i64, i64)>,
    ownership: Option<serde_json::Value>,
) -> serde_json::Value {
    let waits = |within: Option<(i64, i64)>| {
        let mut w: Vec<i64> = tally
            .quiet
            .values()
            .filter(|(started, _)| within.is_none_or(|(a, b)| *started >= a && *started <= b + ROLLOUT_TAIL_MS))
            .map(|(_, w)| *w)
            .collect();
        w.sort_unstable();
        let pct = |q: f64| w.get(((w.len() as f64 * q) as usize).min(w.len().saturating_sub(1))).copied();
        serde_json::json!({ "jobs": w.len(), "wait_ms_p50": pct(0.5), "wait_ms_p99": pct(0.99), "wait_ms_max": w.last() })
    };
    report["quiet"] = waits(None);
    if window.is_some() {
        report["quiet_in_rollout"] = waits(window);
    }
    report["rollout"] = ownership.unwrap_or(serde_json::Value::Null);
    report
}

/// `sh -c cmd`, bounded to 150 s; returns the seconds it took.
async fn run_bounded(cmd: String) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let mut c = tokio::process::Command::new("sh");
    c.args(["-c", &cmd]).stdout(Stdio::null()).kill_on_drop(true);
    let status = tokio::time::timeout(Duration::from_secs(150), c.status())
        .await
        .with_context(|| format!("`{cmd}` took over 150 s"))??;
    anyhow::ensure!(status.success(), "`{cmd}` failed: {status}");
    Ok(t0.elapsed().as_secs_f64())
}

async fn drain(feed: &mut ResultFeed, sent: &Sent, tally: &mut Tally, wait: Duration) {
    let until = tokio::time::Instant::now() + wait;
    while let Ok(Some((r, _))) = tokio::time::timeout_at(until, feed.rx.recv()).await {
        tally.add(&r, sent);
    }
}

/// `services down cassandra` then `services up cassandra` (each bounded: the script's own
/// health wait is 90 s), setting `down` between them; returns the seconds it took. A
/// failed step's error carries the last lines the script printed (why it failed, the
/// database's log tail).
async fn restart_cql(script: PathBuf, down: Arc<std::sync::atomic::AtomicBool>) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    for step in ["down", "up"] {
        if step == "up" {
            down.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let mut cmd = tokio::process::Command::new(&script);
        cmd.args([step, "cassandra"])
            .env("FAIRWAY_SERVICES_TIMEOUT", "90")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(150), cmd.output())
            .await
            .with_context(|| format!("{} {step} cassandra took over 150 s", script.display()))?
            .with_context(|| format!("running {}", script.display()))?;
        let said = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            out.status.success(),
            "{} {step} cassandra failed: {}; it printed (last 40 lines):\n{}",
            script.display(),
            out.status,
            last_lines(&said, 40)
        );
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// The last `n` lines of `text`.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---------------------------------------------------------------------------------------
// Counting.

/// DLQ entries of the poison job and of the malformed message: read until both are there
/// and nothing new came for 3 s (copies dead-lettered again after a kill), or `wait` passes.
async fn dead_lettered(cfg: &Config, sent: &Sent, wait: Duration) -> anyhow::Result<(u32, u32)> {
    let reader = kafka::reader(cfg, &cfg.group(&format!("faults-dlq-{}", now_ms())), false)?;
    reader.subscribe(&[&cfg.dlq_topic()])?;
    let (mut poison, mut malformed) = (0, 0);
    let deadline = Instant::now() + wait;
    let mut last = Instant::now();
    while Instant::now() < deadline && (poison == 0 || malformed == 0 || last.elapsed() < Duration::from_secs(3)) {
        let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), reader.recv()).await else { continue };
        last = Instant::now();
        let Some(d) = m.payload().and_then(|b| codec::decode_dead_letter(b).ok()) else { continue };
        poison += u32::from(d.job.as_ref().is_some_and(|j| j.job_id == sent.poison_id));
        malformed += u32::from(
            d.raw.as_deref() == Some(MALFORMED)
                || (d.origin_partition, d.origin_offset) == sent.malformed_at && d.job.is_none(),
        );
    }
    Ok((poison, malformed))
}

#[derive(Default)]
struct Runs {
    started: u64,
    started_twice: usize,
    completed_twice: usize,
}

/// Executions per job id from the shared run log (`start <id>` / `done <id>` lines).
fn count_runs(path: &Path, ids: &HashSet<String>) -> anyhow::Result<Runs> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut per: HashMap<(&str, &str), u32> = HashMap::new();
    for line in text.lines() {
        let mut fields = line.split(' ');
        if let (Some(phase), Some(id)) = (fields.next(), fields.next()) {
            if ids.contains(id) {
                *per.entry((phase, id)).or_default() += 1;
            }
        }
    }
    let twice = |phase: &str| per.iter().filter(|((p, _), n)| *p == phase && **n > 1).count();
    let started = per.iter().filter(|((p, _), _)| *p == "start").map(|(_, n)| u64::from(*n)).sum();
    Ok(Runs { started, started_twice: twice("start"), completed_twice: twice("done") })
}

#[allow(clippy::too_many_arguments)]
fn report(
    a: &FaultsArgs,
    sent: &Sent,
    tally: &Tally,
    faults: &Faults,
    dlq: &(u32, u32),
    runs: &Runs,
    duration: Duration,
    restarts: usize,
) -> serde_json::Value {
    let extra: u64 = tally.results.values().map(|n| u64::from(n.saturating_sub(1))).sum();
    let dup_jobs = tally.results.values().filter(|n| **n > 1).count();
    let kills = faults.kill_at_s.len();
    serde_json::json!({
        "bench": "faults",
        "config": {
            "workers": a.workers, "jobs": a.jobs, "job_ms": a.job_ms, "kills": a.kills,
            "cql_restart": a.cql_restart, "slots": a.slots, "partitions": a.partitions,
            "rollout": a.rollout, "rollout_in_outage": a.rollout_in_outage, "group_protocol": a.group_protocol.as_str(), "assignor": a.assignor.as_str(),
            "session_timeout_ms": a.session_timeout.as_millis() as u64,
        },
        "duration_s": round2(duration.as_secs_f64()),
        "lost": sent.ids.len() - tally.results.len(),
        "terminal": tally.results.len(),
        "statuses": tally.statuses,
        "duplicate_results": extra,
        "jobs_with_duplicate_results": dup_jobs,
        "duplicates_per_kill": if kills > 0 { round2(extra as f64 / kills as f64) } else { 0.0 },
        "executions": runs.started,
        "jobs_run_twice": runs.started_twice,
        "jobs_completed_twice": runs.completed_twice,
        "poison_dead_lettered": dlq.0 > 0,
        "malformed_dead_lettered": dlq.1 > 0,
        "poison_dlq_entries": dlq.0,
        "malformed_dlq_entries": dlq.1,
        "kills_done": kills,
        "kill_at_s": faults.kill_at_s,
        "worker_restarts": restarts,
        "unexpected_worker_exits": faults.unexpected_exits,
        "cql_restart_s": faults.cql_restart_s,
        "cql_restart_error": faults.cql_restart_error,
        "broker_restart_s": faults.broker_restart_s,
        "broker_restart_error": faults.broker_restart_error,
    })
}
