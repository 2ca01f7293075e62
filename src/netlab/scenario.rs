//! One partition scenario in the lab, and its counts.
//!
//! Two workers of the short pool, one on the host and one inside the namespace, on a
//! deployment of their own in the lab; `jobs` sleep jobs spread over the partitions (keyed
//! by job id); once a share of them finished, the inside worker's links in `cut` go down
//! for `cut_for`, then come back. A worker that exits (it gave up) is started again at
//! once, as its supervisor would. When every job has a result (or the deadline passed),
//! a batch of probe jobs over every partition checks that no worker holds a partition it
//! cannot serve: each probe must finish.
//!
//! Counted: jobs lost (no result), duplicate results, jobs run more than once (the sleep
//! handler's run log), time from the link's return until every job finished, the inside
//! worker's exits, its producer rebuilds and whether it served again.

use super::{Lab, LabError, Link};
use crate::config::Config;
use crate::kafka::{self, Consumer, Message};
use crate::model::{JobSubmitted, Pool};
use crate::{codec, now_ms};
use futures::StreamExt;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub jobs: usize,
    pub job_ms: u64,
    /// The inside worker's links that go down.
    pub cut: Vec<Link>,
    pub cut_for: Duration,
    /// Share of the jobs finished when the cut starts (0..1).
    pub cut_after: f64,
    pub session_timeout: Duration,
    pub slots: usize,
    pub partitions: i32,
    pub keyspace: String,
    /// The workers' `worker.store_outage_limit`.
    pub store_outage_limit: Duration,
    /// Most time from the first submission until every job has a result.
    pub timeout: Duration,
    /// Probe jobs after the run (each partition gets some).
    pub probes: usize,
}

/// The counts of one scenario (`fairway bench partitions` prints these).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub kind: String,
    pub cut_s: f64,
    pub jobs: usize,
    pub job_ms: u64,
    pub session_timeout_s: f64,
    /// Jobs with no result at the end.
    pub lost: usize,
    pub duplicate_results: u64,
    pub jobs_with_duplicate_results: usize,
    pub executions: u64,
    pub jobs_run_twice: usize,
    /// Seconds from the first submission until every job had a result (None: never).
    pub all_done_s: Option<f64>,
    /// Seconds from the link's return until every job had a result (0: all done before).
    pub recover_s: Option<f64>,
    /// Results published by the inside worker after the link returned.
    pub inside_results_after_restore: u64,
    /// Exit codes of the inside worker (it gave up; restarted each time).
    pub inside_exits: Vec<Option<i32>>,
    pub host_exits: Vec<Option<i32>>,
    /// Producer rebuilds and give-ups the workers logged.
    pub producer_rebuilds: usize,
    pub gave_up: usize,
    pub probes: usize,
    pub probes_finished: usize,
    pub probes_by_inside: usize,
    /// Seconds from the probes' submission until the last one finished.
    pub probes_s: Option<f64>,
}

const TENANTS: [&str; 3] = ["pa", "pb", "pc"];
const WORKER_LOG: &str = "warn,fairway::worker::pool=info,fairway::worker::watchdog=info,fairway::kafka=info";

/// The workers' configuration file in the lab.
fn config_text(lab: &Lab, plan: &Plan, prefix: &str) -> String {
    let mut text = format!(
        "[kafka]\nbrokers = {:?}\ntopic_prefix = {prefix:?}\npartitions = {}\nsession_timeout = \"{}ms\"\n\
         [scylla]\ncontact_points = [{:?}]\nkeyspace = {:?}\nlocal_bridge = true\n\
         [worker]\nstore_outage_limit = \"{}ms\"\n\
         [pools.short]\nslots = {}\n\
         [job_types.sleep]\npool = \"short\"\nhandler = \"sleep\"\ntimeout = \"60s\"\n",
        lab.broker(),
        plan.partitions,
        plan.session_timeout.as_millis(),
        lab.cql(),
        plan.keyspace,
        plan.store_outage_limit.as_millis(),
        plan.slots,
    );
    for t in TENANTS {
        text.push_str(&format!("[tenants.{t}]\ntier = \"standard\"\n"));
    }
    text
}

/// A result as the scenario counts it.
struct Seen {
    job_id: String,
    worker_id: String,
}

/// Reads the results topic into a channel until dropped.
fn result_feed(cfg: &Config) -> Result<(mpsc::UnboundedReceiver<Seen>, tokio::task::JoinHandle<()>), LabError> {
    let reader = kafka::reader(cfg, &cfg.group(&format!("partitions-results-{}", now_ms())), false)
        .map_err(|e| LabError::Failed(e.to_string()))?;
    reader.subscribe(&[&cfg.results_topic()]).map_err(|e| LabError::Failed(e.to_string()))?;
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        loop {
            let Ok(m) = reader.recv().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let Some(r) = m.payload().and_then(|b| codec::decode_result(b).ok()) else { continue };
            if tx.send(Seen { job_id: r.job_id, worker_id: r.worker_id }).is_err() {
                return;
            }
        }
    });
    Ok((rx, task))
}

fn sleep_job(tenant: &str, ms: u64) -> JobSubmitted {
    let payload = serde_json::to_vec(&serde_json::json!({ "ms": ms })).expect("json");
    JobSubmitted {
        pool: Some(Pool::Short),
        ..JobSubmitted::original(uuid::Uuid::now_v7().to_string(), tenant.into(), "sleep".into(), payload, now_ms())
    }
}

/// Produces `n` sleep jobs keyed by job id (spread over the partitions); their ids.
async fn submit(cfg: &Config, producer: &kafka::Producer, n: usize, ms: u64) -> Result<HashSet<String>, LabError> {
    let topic = cfg.pool_topic(Pool::Short);
    let jobs: Vec<JobSubmitted> = (0..n).map(|i| sleep_job(TENANTS[i % TENANTS.len()], ms)).collect();
    let sends = jobs.iter().map(|j| {
        let bytes = codec::encode_job(j).expect("encode job");
        let topic = topic.clone();
        async move { kafka::send(producer, &topic, &j.job_id, &bytes).await }
    });
    let mut sends = futures::stream::iter(sends).buffer_unordered(512);
    while let Some(r) = sends.next().await {
        r.map_err(|e| LabError::Failed(format!("submitting jobs: {e}")))?;
    }
    drop(sends);
    Ok(jobs.into_iter().map(|j| j.job_id).collect())
}

/// Lines of a log file containing `needle`.
fn count_in_log(path: &std::path::Path, needle: &str) -> usize {
    std::fs::read_to_string(path).map(|t| t.lines().filter(|l| l.contains(needle)).count()).unwrap_or(0)
}

/// The two workers and how they are started (again).
struct Fleet {
    config: PathBuf,
    run_log: String,
    inside_exits: Vec<Option<i32>>,
    host_exits: Vec<Option<i32>>,
}

impl Fleet {
    fn env<'a>(&'a self, name: &'a str) -> [(&'a str, &'a str); 3] {
        [("FAIRWAY_LOG", WORKER_LOG), (crate::handlers::RUN_LOG_ENV, self.run_log.as_str()), ("HOSTNAME", name)]
    }

    fn start(&self, lab: &mut Lab, name: &str) -> Result<u32, LabError> {
        lab.spawn_worker(name, name == "inside", &self.config, &self.env(name))
    }

    /// A worker that exited is started again at once (its supervisor's job).
    fn restart_exited(&mut self, lab: &mut Lab) -> Result<(), LabError> {
        for name in ["inside", "host"] {
            if let Some(status) = lab.exited(name) {
                tracing::warn!(worker = name, %status, "worker exited; starting it again");
                let exits = if name == "inside" { &mut self.inside_exits } else { &mut self.host_exits };
                exits.push(status.code());
                lab.restart_worker(name, &self.config, &self.env(name))?;
            }
        }
        Ok(())
    }
}

/// Waits until both workers logged an assignment (a group of two formed).
async fn wait_assigned(lab: &Lab, within: Duration) -> Result<(), LabError> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if ["inside", "host"].iter().all(|n| count_in_log(&lab.log_path(n), "partitions assigned") > 0) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(LabError::Failed(format!("the two workers did not both get partitions within {within:?}")))
}

/// Runs the scenario on a started lab.
pub async fn run(lab: &mut Lab, plan: &Plan) -> Result<Report, LabError> {
    let prefix = format!("parts{}.", now_ms());
    let text = config_text(lab, plan, &prefix);
    let config = lab.dir().join("fairway.toml");
    std::fs::write(&config, &text).map_err(super::io("writing the lab's config"))?;
    let cfg = Config::parse(&text, "the lab's config").map_err(|e| LabError::Failed(e.to_string()))?;
    let fail = |what: &'static str| move |e: Box<dyn std::error::Error>| LabError::Failed(format!("{what}: {e}"));
    kafka::ensure_topics(&cfg).await.map_err(|e| fail("creating topics")(e.into()))?;
    crate::store::ensure_schema(&cfg).await.map_err(|e| fail("schema")(e.into()))?;
    crate::tenants::seed(&cfg).await.map_err(|e| fail("tenants")(e.into()))?;
    let run_log = lab.dir().join("runs.log");
    let mut fleet =
        Fleet { config, run_log: run_log.display().to_string(), inside_exits: Vec::new(), host_exits: Vec::new() };
    fleet.start(lab, "inside")?;
    fleet.start(lab, "host")?;
    let (mut feed, reader) = result_feed(&cfg)?;
    wait_assigned(lab, Duration::from_secs(90)).await?;
    let producer = kafka::producer(&cfg).map_err(|e| fail("producer")(e.into()))?;

    let t0 = Instant::now();
    let ids = submit(&cfg, &producer, plan.jobs, plan.job_ms).await?;
    let mut results: HashMap<String, u32> = HashMap::new();
    let (mut cut_at, mut restored_at, mut all_done_at) = (None::<Instant>, None::<Instant>, None::<Instant>);
    let mut inside_after_restore = 0u64;
    let deadline = t0 + plan.timeout;
    while Instant::now() < deadline && all_done_at.is_none() {
        let until = tokio::time::Instant::now() + Duration::from_millis(200);
        while let Ok(Some(r)) = tokio::time::timeout_at(until, feed.recv()).await {
            if ids.contains(&r.job_id) {
                *results.entry(r.job_id).or_default() += 1;
                inside_after_restore += u64::from(restored_at.is_some() && r.worker_id.starts_with("inside-"));
            }
        }
        let done = results.len();
        if cut_at.is_none() && done as f64 >= plan.cut_after * plan.jobs as f64 {
            for l in &plan.cut {
                lab.set_link(*l, false)?;
            }
            cut_at = Some(Instant::now());
            tracing::info!(done, "links cut");
        }
        if let (Some(at), None) = (cut_at, restored_at) {
            if at.elapsed() >= plan.cut_for {
                for l in &plan.cut {
                    lab.set_link(*l, true)?;
                }
                restored_at = Some(Instant::now());
                tracing::info!(done, "links restored");
            }
        }
        fleet.restart_exited(lab)?;
        if done == ids.len() && restored_at.is_some() {
            all_done_at = Some(Instant::now());
        }
    }
    if restored_at.is_none() {
        for l in &plan.cut {
            lab.set_link(*l, true)?;
        }
        restored_at = Some(Instant::now());
    }

    // Probes: every partition must be served again, by whoever owns it now.
    let probe_ids = submit(&cfg, &producer, plan.probes, 0).await?;
    let probes_sent = Instant::now();
    let (mut probes_done, mut probes_inside, mut probes_last) = (HashSet::new(), 0, None);
    let probe_deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < probe_deadline && probes_done.len() < probe_ids.len() {
        let until = tokio::time::Instant::now() + Duration::from_millis(200);
        while let Ok(Some(r)) = tokio::time::timeout_at(until, feed.recv()).await {
            if ids.contains(&r.job_id) {
                *results.entry(r.job_id).or_default() += 1;
            } else if probe_ids.contains(&r.job_id) && probes_done.insert(r.job_id) {
                probes_inside += usize::from(r.worker_id.starts_with("inside-"));
                probes_last = Some(probes_sent.elapsed());
            }
        }
        fleet.restart_exited(lab)?;
    }
    // Late duplicates of the jobs.
    let settle = tokio::time::Instant::now() + Duration::from_secs(2);
    while let Ok(Some(r)) = tokio::time::timeout_at(settle, feed.recv()).await {
        if ids.contains(&r.job_id) {
            *results.entry(r.job_id).or_default() += 1;
        }
    }
    reader.abort();
    let (executions, run_twice) = count_runs(&run_log, &ids);
    let logs = [lab.log_path("inside"), lab.log_path("host"), lab.log_path("inside.before-restart")];
    let in_logs = |needle: &str| -> usize { logs.iter().map(|p| count_in_log(p, needle)).sum() };
    let restored = restored_at.expect("restored");
    Ok(Report {
        kind: plan
            .cut
            .iter()
            .map(|l| if *l == Link::Broker { "broker" } else { "store" })
            .collect::<Vec<_>>()
            .join("+"),
        cut_s: plan.cut_for.as_secs_f64(),
        jobs: plan.jobs,
        job_ms: plan.job_ms,
        session_timeout_s: plan.session_timeout.as_secs_f64(),
        lost: ids.len() - results.len(),
        duplicate_results: results.values().map(|n| u64::from(n.saturating_sub(1))).sum(),
        jobs_with_duplicate_results: results.values().filter(|n| **n > 1).count(),
        executions,
        jobs_run_twice: run_twice,
        all_done_s: all_done_at.map(|t| round2(t.duration_since(t0).as_secs_f64())),
        recover_s: all_done_at.map(|t| round2(t.saturating_duration_since(restored).as_secs_f64())),
        inside_results_after_restore: inside_after_restore,
        inside_exits: fleet.inside_exits,
        host_exits: fleet.host_exits,
        producer_rebuilds: in_logs("producer rebuilt"),
        gave_up: in_logs("cannot serve its partitions"),
        probes: probe_ids.len(),
        probes_finished: probes_done.len(),
        probes_by_inside: probes_inside,
        probes_s: probes_last.map(|d| round2(d.as_secs_f64())),
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Executions of the jobs (`start <id>` lines of the sleep handler's run log) and how
/// many jobs started more than once.
fn count_runs(path: &std::path::Path, ids: &HashSet<String>) -> (u64, usize) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut per: HashMap<&str, u32> = HashMap::new();
    for id in text.lines().filter_map(|l| l.strip_prefix("start ")) {
        if ids.contains(id) {
            *per.entry(id).or_default() += 1;
        }
    }
    (per.values().map(|n| u64::from(*n)).sum(), per.values().filter(|n| **n > 1).count())
}
