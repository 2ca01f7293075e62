//! Partition scenarios in the lab, and their counts.
//!
//! Two workers of the short pool, one on the host and one inside the namespace, on a
//! deployment of their own in the lab. Each [`Cut`] of the plan is one phase, run one
//! after the other on the same two workers: `jobs` sleep jobs spread over the partitions
//! (keyed by job id); once a share of them finished, the inside worker's links of the cut
//! go down for its duration, then come back. A worker that exits (it gave up) is started
//! again after a short pause, as its supervisor would. When every job has a result (or
//! the phase's deadline passed), a batch of probe jobs over every partition checks that
//! no worker holds a partition it cannot serve: each probe must finish.
//!
//! Counted per phase: jobs stuck (no result by the deadline) and lost (none at the end),
//! duplicate results, jobs run more than once and run by two workers at once (from the
//! run log's timestamps, `netlab::runs`), time from the link's return until every job
//! finished, the inside worker's exits, producer rebuilds and give-ups, whether it served
//! again, and its `/livez` answers during and after the cut (polled over a link that
//! stays up).

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

/// One partition: the inside worker's links that go down, and for how long.
#[derive(Debug, Clone)]
pub struct Cut {
    pub links: Vec<Link>,
    pub duration: Duration,
}

impl Cut {
    pub fn new(links: &[Link], duration: Duration) -> Cut {
        Cut { links: links.to_vec(), duration }
    }

    /// `broker`, `store` or `broker+store`.
    pub fn kind(&self) -> String {
        let names: Vec<&str> = self.links.iter().map(|l| if *l == Link::Broker { "broker" } else { "store" }).collect();
        names.join("+")
    }
}

/// What to run: the fleet's settings, and the cuts, one phase each.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Jobs per phase.
    pub jobs: usize,
    pub job_ms: u64,
    pub cuts: Vec<Cut>,
    /// Share of the phase's jobs finished when the cut starts (0..1)...
    pub cut_after: f64,
    /// ...and at least this long after the phase's first submission (so long jobs are
    /// running when it starts).
    pub cut_delay: Duration,
    pub session_timeout: Duration,
    pub slots: usize,
    pub partitions: i32,
    pub keyspace: String,
    /// The workers' `worker.store_outage_limit`.
    pub store_outage_limit: Duration,
    /// Most time per phase from its first submission until every job has a result.
    pub timeout: Duration,
    /// Probe jobs after each phase (each partition gets some).
    pub probes: usize,
}

/// The counts of one phase (`fairway-bench bench partitions` prints these).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub kind: String,
    pub cut_s: f64,
    pub jobs: usize,
    pub job_ms: u64,
    pub session_timeout_s: f64,
    /// Jobs with no result when the phase's deadline passed (0 when all finished).
    pub stuck: usize,
    /// Jobs with no result at the end (after the probes too).
    pub lost: usize,
    pub duplicate_results: u64,
    pub jobs_with_duplicate_results: usize,
    pub executions: u64,
    pub jobs_run_twice: usize,
    /// Jobs run by two worker processes at once (any time), and for longer than the
    /// heartbeat lapse (`heartbeat_lapse_s`, when the reaper re-dispatches), and the
    /// longest such overlap.
    pub jobs_overlapping: usize,
    pub jobs_overlapping_beyond_lapse: usize,
    pub longest_overlap_s: f64,
    pub heartbeat_lapse_s: f64,
    /// Seconds from the phase's first submission until every job had a result (None: never).
    pub all_done_s: Option<f64>,
    /// Seconds from the link's return until every job had a result (0: all done before).
    pub recover_s: Option<f64>,
    /// Results published by the inside worker after the link returned.
    pub inside_results_after_restore: u64,
    /// Of those, results for jobs that already had one (a second result published by the
    /// cut-off worker after its link came back).
    pub inside_duplicates_after_restore: u64,
    /// Results from the inside worker read after the link returned but made (produced)
    /// before it: a record the cut-off worker queued or had on the wire, delivered late.
    pub inside_stale_after_restore: usize,
    /// Jobs with more than one result whose first result was not made in the last
    /// [`CUT_WINDOW_MS`] before the cut: repeats the cut's own window does not explain.
    pub repeats_not_from_the_cut: usize,
    /// The evidence of each job with more than one result (at most 10): each result's
    /// worker, when its record was made and read, and each run of the job, in ms from
    /// the cut (`runs` by worker pid).
    pub duplicates: Vec<String>,
    /// Exit codes of the inside worker (it gave up; restarted each time).
    pub inside_exits: Vec<Option<i32>>,
    pub host_exits: Vec<Option<i32>>,
    /// Producer rebuilds and give-ups the workers logged in this phase.
    pub producer_rebuilds: usize,
    pub gave_up: usize,
    /// Runs the workers fenced in this phase (no heartbeat acknowledged for two
    /// intervals: `worker::liveness::fence_watch`), from their logs.
    pub runs_fenced: usize,
    pub probes: usize,
    pub probes_finished: usize,
    pub probes_by_inside: usize,
    /// Seconds from the probes' submission until the last one finished.
    pub probes_s: Option<f64>,
    /// Partitions the inside worker held at the end of the phase (its last assignment
    /// logged; None: unknown).
    pub inside_partitions_at_end: Option<usize>,
    /// The inside worker's `/livez`: answered 503 during the cut, and 200 at the end of
    /// the phase (None: not polled, both links were cut).
    pub livez_failed_in_cut: Option<bool>,
    pub livez_ok_after: Option<bool>,
}

impl Report {
    /// Every job finished, none lost, every probe finished.
    pub fn fine(&self) -> bool {
        self.lost == 0 && self.stuck == 0 && self.all_done_s.is_some() && self.probes_finished == self.probes
    }

    /// One line for a failing test's output.
    pub fn summary(&self) -> String {
        format!(
            "{} {}s: stuck {} lost {} dup {} (inside after restore {}, stale {}, not from the cut {}) twice {} overlap>{}s {} done {:?}s recover {:?}s inside exits {:?} \
             rebuilds {} gave_up {} fenced {} overlapping {} (longest {}s) probes {}/{} (inside {}, holds {:?}) livez cut/after {:?}/{:?}",
            self.kind,
            self.cut_s,
            self.stuck,
            self.lost,
            self.duplicate_results,
            self.inside_duplicates_after_restore,
            self.inside_stale_after_restore,
            self.repeats_not_from_the_cut,
            self.jobs_run_twice,
            self.heartbeat_lapse_s,
            self.jobs_overlapping_beyond_lapse,
            self.all_done_s,
            self.recover_s,
            self.inside_exits,
            self.producer_rebuilds,
            self.gave_up,
            self.runs_fenced,
            self.jobs_overlapping,
            self.longest_overlap_s,
            self.probes_finished,
            self.probes,
            self.probes_by_inside,
            self.inside_partitions_at_end,
            self.livez_failed_in_cut,
            self.livez_ok_after,
        )
    }
}

const TENANTS: [&str; 3] = ["pa", "pb", "pc"];
/// What a worker logs when it fences a run (`worker::liveness::fence_watch`).
const FENCED: &str = "no heartbeat of this run was acknowledged for two intervals";
const WORKER_LOG: &str = "warn,fairway::worker::pool=info,fairway::worker::watchdog=info,fairway::kafka=info";

/// A worker's configuration file in the lab; `metrics` is its `/metrics` + probes
/// listener (host:port), if any.
fn config_text(lab: &Lab, plan: &Plan, prefix: &str, metrics: Option<&str>) -> String {
    let metrics = metrics.map(|m| format!("metrics_listen = {m:?}\n")).unwrap_or_default();
    let (reported, forwarder) = lab.cql_address_map();
    let mut text = format!(
        "[kafka]\nbrokers = {:?}\ntopic_prefix = {prefix:?}\npartitions = {}\nsession_timeout = \"{}ms\"\n\
         [scylla]\ncontact_points = [{:?}]\nkeyspace = {:?}\naddress_map = {{ {reported:?} = {forwarder:?} }}\n\
         [worker]\nstore_outage_limit = \"{}ms\"\n{metrics}\
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
    /// The record's timestamp (the producer's creation time), unix ms.
    created_ms: i64,
    /// When the feed read it, unix ms.
    read_ms: i64,
    attempts: i32,
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
            let created_ms = m.timestamp().to_millis().unwrap_or(0);
            let seen =
                Seen { job_id: r.job_id, worker_id: r.worker_id, created_ms, read_ms: now_ms(), attempts: r.attempts };
            if tx.send(seen).is_err() {
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

/// A worker that exited is started again after this pause (a supervisor's back-off: a
/// worker that cannot start while the store is cut off would otherwise spin).
const RESTART_AFTER: Duration = Duration::from_secs(2);

/// The two workers and how they are started (again).
struct Fleet {
    /// Configuration file per worker name.
    configs: HashMap<&'static str, PathBuf>,
    run_log: String,
    inside_exits: Vec<Option<i32>>,
    host_exits: Vec<Option<i32>>,
    /// Workers that exited, waiting for their restart: since when.
    down: HashMap<&'static str, Instant>,
}

impl Fleet {
    fn env<'a>(&'a self, name: &'a str) -> [(&'a str, &'a str); 3] {
        [("FAIRWAY_LOG", WORKER_LOG), (crate::handlers::RUN_LOG_ENV, self.run_log.as_str()), ("HOSTNAME", name)]
    }

    fn start(&self, lab: &mut Lab, name: &'static str) -> Result<u32, LabError> {
        lab.spawn_worker(name, name == "inside", &self.configs[name], &self.env(name))
    }

    /// A worker that exited is started again after [`RESTART_AFTER`] (its supervisor's job).
    fn restart_exited(&mut self, lab: &mut Lab) -> Result<(), LabError> {
        for name in ["inside", "host"] {
            if let Some(since) = self.down.get(name) {
                if since.elapsed() >= RESTART_AFTER {
                    self.down.remove(name);
                    lab.restart_worker(name, &self.configs[name], &self.env(name))?;
                }
            } else if let Some(status) = lab.exited(name) {
                tracing::warn!(worker = name, %status, "worker exited; starting it again shortly");
                let exits = if name == "inside" { &mut self.inside_exits } else { &mut self.host_exits };
                exits.push(status.code());
                self.down.insert(name, Instant::now());
            }
        }
        Ok(())
    }

    /// Lines containing `needle` in every log of both workers so far.
    fn in_logs(lab: &Lab, needle: &str) -> usize {
        let logs = ["inside", "host"].into_iter().flat_map(|n| lab.worker_logs(n));
        logs.map(|p| count_in_log(&p, needle)).sum()
    }
}

/// Ownership changes the inside worker logged so far (assignments, revocations).
fn count_changes(lab: &Lab) -> usize {
    let logs = lab.worker_logs("inside");
    let n = |needle| logs.iter().map(|p| count_in_log(p, needle)).sum::<usize>();
    n("partitions assigned") + n("partitions revoked")
}

/// Give-ups the inside worker logged so far.
fn count_give_ups(lab: &Lab) -> usize {
    lab.worker_logs("inside").iter().map(|p| count_in_log(p, "cannot serve its partitions")).sum()
}

/// What the inside worker had done when the cut began.
struct AtCut {
    changes: usize,
    give_ups: usize,
    exits: usize,
}

/// After the links are back, waits (up to 60 s) until the inside worker shows it is back:
/// a result of its own since the restore, an ownership change since the cut (it learned
/// that the group moved on without it, and rejoined), or an exit; a worker that gave up
/// is back only once it exited. On Apache Kafka the other worker may have finished every
/// job during the cut, so the probes must not be judged before the cut-off worker had the
/// chance to come back.
async fn inside_back(
    lab: &mut Lab,
    s: &mut Session,
    ids: &HashSet<String>,
    tally: &mut Tally,
    at_cut: &AtCut,
) -> Result<(), LabError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let exited = s.fleet.inside_exits.len() > at_cut.exits;
        let exit_pending = count_give_ups(lab) > at_cut.give_ups && !exited;
        let served_or_rejoined = tally.inside_after_restore > 0 || count_changes(lab) > at_cut.changes;
        if exited || (served_or_rejoined && !exit_pending) {
            // Whatever the change, let the group settle on it (no ownership change for
            // 2 s) before the probes.
            let (mut seen, mut quiet_since) = (count_changes(lab), Instant::now());
            while Instant::now() < deadline && quiet_since.elapsed() < Duration::from_secs(2) {
                tally.take(s, ids, true, None).await;
                s.fleet.restart_exited(lab)?;
                if count_changes(lab) != seen {
                    (seen, quiet_since) = (count_changes(lab), Instant::now());
                }
            }
            return Ok(());
        }
        tally.take(s, ids, true, None).await;
        s.fleet.restart_exited(lab)?;
    }
    tracing::warn!("the inside worker showed no sign of life within 60 s of the restore");
    Ok(())
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

/// The inside worker's `/livez` answers (None: no answer), polled every second.
type LivezLog = std::sync::Arc<std::sync::Mutex<Vec<(Instant, Option<u16>)>>>;

/// Polls `url` until aborted, recording each answer.
fn poll_livez(url: String) -> (LivezLog, tokio::task::JoinHandle<()>) {
    let log = LivezLog::default();
    let into = log.clone();
    let task = tokio::spawn(async move {
        let client = reqwest::Client::builder().timeout(Duration::from_secs(1)).build().expect("http client");
        loop {
            let status = client.get(&url).send().await.ok().map(|r| r.status().as_u16());
            into.lock().expect("livez log").push((Instant::now(), status));
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    (log, task)
}

/// Everything the phases share: the fleet, the results feed, a producer.
struct Session {
    cfg: Config,
    producer: kafka::Producer,
    feed: mpsc::UnboundedReceiver<Seen>,
    reader: tokio::task::JoinHandle<()>,
    fleet: Fleet,
    run_log: PathBuf,
    /// The inside worker's probes listener port (inside the namespace).
    metrics_port: u16,
}

/// Runs the plan's phases on a started lab, one report each.
pub async fn run(lab: &mut Lab, plan: &Plan) -> Result<Vec<Report>, LabError> {
    let mut s = start(lab, plan).await?;
    let mut reports = Vec::new();
    for cut in &plan.cuts {
        reports.push(phase(lab, plan, cut, &mut s).await?);
    }
    s.reader.abort();
    Ok(reports)
}

/// Writes the configs, makes topics, schema and tenants, starts both workers and waits
/// until they share the partitions.
async fn start(lab: &mut Lab, plan: &Plan) -> Result<Session, LabError> {
    let prefix = format!("parts{}.", now_ms());
    let metrics_port = super::free_port(std::net::Ipv4Addr::LOCALHOST)?;
    let host_text = config_text(lab, plan, &prefix, None);
    let inside_text = config_text(lab, plan, &prefix, Some(&format!("0.0.0.0:{metrics_port}")));
    let mut configs = HashMap::new();
    for (name, text) in [("host", &host_text), ("inside", &inside_text)] {
        let path = lab.dir().join(format!("{name}.toml"));
        std::fs::write(&path, text).map_err(super::io("writing the lab's config"))?;
        configs.insert(name, path);
    }
    let cfg = Config::parse(&host_text, "the lab's config").map_err(|e| LabError::Failed(e.to_string()))?;
    let fail = |what: &'static str| move |e: Box<dyn std::error::Error>| LabError::Failed(format!("{what}: {e}"));
    kafka::ensure_topics(&cfg).await.map_err(|e| fail("creating topics")(e.into()))?;
    crate::store::ensure_schema(&cfg).await.map_err(|e| fail("schema")(e.into()))?;
    crate::ops::tenants::seed(&cfg).await.map_err(|e| fail("tenants")(e.into()))?;
    let run_log = lab.dir().join("runs.log");
    let fleet = Fleet {
        configs,
        run_log: run_log.display().to_string(),
        inside_exits: Vec::new(),
        host_exits: Vec::new(),
        down: HashMap::new(),
    };
    fleet.start(lab, "inside")?;
    fleet.start(lab, "host")?;
    let (feed, reader) = result_feed(&cfg)?;
    wait_assigned(lab, Duration::from_secs(90)).await?;
    let producer = kafka::producer(&cfg).map_err(|e| fail("producer")(e.into()))?;
    Ok(Session { cfg, producer, feed, reader, fleet, run_log, metrics_port })
}

/// Every result of each job: (worker, made, read, attempts).
type Each = HashMap<String, Vec<(String, i64, i64, i32)>>;

/// What a phase saw of its jobs' results.
#[derive(Default)]
struct Tally {
    results: HashMap<String, u32>,
    each: Each,
    inside_after_restore: u64,
    /// Of those, results for jobs that already had one.
    inside_repeats_after_restore: u64,
}

impl Tally {
    /// Takes the results arriving within 200 ms; `probes` collects the probe jobs'
    /// (first) results with whether the inside worker ran them.
    async fn take(&mut self, s: &mut Session, ids: &HashSet<String>, restored: bool, probes: Option<&mut Probes>) {
        let until = tokio::time::Instant::now() + Duration::from_millis(200);
        let mut probes = probes;
        while let Ok(Some(r)) = tokio::time::timeout_at(until, s.feed.recv()).await {
            let inside = r.worker_id.starts_with("inside-");
            if ids.contains(&r.job_id) {
                self.each.entry(r.job_id.clone()).or_default().push((
                    r.worker_id.clone(),
                    r.created_ms,
                    r.read_ms,
                    r.attempts,
                ));
                let seen = self.results.entry(r.job_id).or_default();
                *seen += 1;
                self.inside_after_restore += u64::from(restored && inside);
                self.inside_repeats_after_restore += u64::from(restored && inside && *seen > 1);
            } else if let Some(p) = probes.as_deref_mut() {
                if p.ids.contains(&r.job_id) && p.done.insert(r.job_id) {
                    p.by_inside += usize::from(inside);
                    p.last = Some(p.sent.elapsed());
                }
            }
        }
    }
}

/// How long before a cut a job's result may have been made and still be repeated by the
/// cut alone: the result acknowledged, its state write (gathered for up to 80 ms, then
/// sent) refused by the cut, so the partition's next owner finds the job unfinished and
/// runs it (docs/wire-format.md). Measured here 88-178 ms; the bound leaves room for a
/// slower machine's broker acknowledgement and store write under load.
pub const CUT_WINDOW_MS: i64 = 2_000;

/// Results (worker, made, read, attempts) from the inside worker read at or after
/// `restored_ms` whose record was made before it.
fn stale_after(each: &Each, restored_ms: i64) -> usize {
    let stale = |(w, made, read, _): &&(String, i64, i64, i32)| {
        w.starts_with("inside-") && *read >= restored_ms && *made < restored_ms
    };
    each.values().flatten().filter(stale).count()
}

/// Jobs with more than one result whose first result was made outside the
/// [`CUT_WINDOW_MS`] before `cut_ms`.
fn repeats_not_from(each: &Each, cut_ms: i64) -> usize {
    let first_made = |rs: &Vec<(String, i64, i64, i32)>| rs.iter().map(|r| r.1).min();
    let in_window = |made: i64| (cut_ms - CUT_WINDOW_MS..=cut_ms).contains(&made);
    each.values().filter(|rs| rs.len() > 1 && !first_made(rs).is_some_and(in_window)).count()
}

/// The probe jobs of a phase.
struct Probes {
    ids: HashSet<String>,
    sent: Instant,
    done: HashSet<String>,
    by_inside: usize,
    last: Option<Duration>,
}

/// Cuts and restores the cut's links while the phase's jobs run, until every job has a
/// result (or the deadline); returns when the link went down and came back, and when
/// all were done.
async fn cut_while_running(
    lab: &mut Lab,
    plan: &Plan,
    cut: &Cut,
    s: &mut Session,
    ids: &HashSet<String>,
    tally: &mut Tally,
) -> Result<(Option<Instant>, Instant, Option<Instant>), LabError> {
    let started = Instant::now();
    let deadline = started + plan.timeout;
    let (mut cut_at, mut restored_at, mut all_done_at) = (None::<Instant>, None::<Instant>, None::<Instant>);
    while Instant::now() < deadline && all_done_at.is_none() {
        tally.take(s, ids, restored_at.is_some(), None).await;
        let done = tally.results.len();
        let due = done as f64 >= plan.cut_after * plan.jobs as f64 && started.elapsed() >= plan.cut_delay;
        if cut_at.is_none() && due {
            for l in &cut.links {
                lab.set_link(*l, false)?;
            }
            cut_at = Some(Instant::now());
            tracing::info!(done, "links cut");
        }
        if let (Some(at), None) = (cut_at, restored_at) {
            if at.elapsed() >= cut.duration {
                for l in &cut.links {
                    lab.set_link(*l, true)?;
                }
                restored_at = Some(Instant::now());
                tracing::info!(done, "links restored");
            }
        }
        s.fleet.restart_exited(lab)?;
        if done == ids.len() && restored_at.is_some() {
            all_done_at = Some(Instant::now());
        }
    }
    let restored = match restored_at {
        Some(at) => at,
        None => {
            for l in &cut.links {
                lab.set_link(*l, true)?;
            }
            Instant::now()
        }
    };
    Ok((cut_at, restored, all_done_at))
}

/// One phase: jobs, the cut while they run, probes, counts.
async fn phase(lab: &mut Lab, plan: &Plan, cut: &Cut, s: &mut Session) -> Result<Report, LabError> {
    let (exits_before, rebuilds_before, gave_up_before, fenced_before) = (
        (s.fleet.inside_exits.len(), s.fleet.host_exits.len()),
        Fleet::in_logs(lab, "producer rebuilt"),
        Fleet::in_logs(lab, "cannot serve its partitions"),
        Fleet::in_logs(lab, FENCED),
    );
    // `/livez` over a link this cut leaves up.
    let up = [Link::Broker, Link::Store].into_iter().find(|l| !cut.links.contains(l));
    let livez = up.map(|l| poll_livez(format!("http://{}:{}/livez", lab.inside_addr(l), s.metrics_port)));

    let t0 = Instant::now();
    let ids = submit(&s.cfg, &s.producer, plan.jobs, plan.job_ms).await?;
    let mut tally = Tally::default();
    let at_cut = AtCut { changes: count_changes(lab), give_ups: count_give_ups(lab), exits: exits_before.0 };
    let (cut_at, restored, all_done_at) = cut_while_running(lab, plan, cut, s, &ids, &mut tally).await?;
    let stuck = ids.len() - tally.results.len();
    inside_back(lab, s, &ids, &mut tally, &at_cut).await?;

    // Probes: every partition must be served again, by whoever owns it now.
    let probe_ids = submit(&s.cfg, &s.producer, plan.probes, 0).await?;
    let mut probes = Probes { ids: probe_ids, sent: Instant::now(), done: HashSet::new(), by_inside: 0, last: None };
    let probe_deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < probe_deadline && probes.done.len() < probes.ids.len() {
        tally.take(s, &ids, true, Some(&mut probes)).await;
        s.fleet.restart_exited(lab)?;
    }
    // Late duplicates of the jobs.
    let settle = Instant::now() + Duration::from_secs(2);
    while Instant::now() < settle {
        tally.take(s, &ids, true, None).await;
    }
    let livez = livez.map(|(log, task)| {
        task.abort();
        let log = log.lock().expect("livez log").clone();
        let in_cut = |at: &Instant| cut_at.is_some_and(|c| *at >= c && *at <= restored);
        let failed = log.iter().any(|(at, st)| in_cut(at) && *st == Some(503));
        (failed, log.last().is_some_and(|(_, st)| *st == Some(200)))
    });
    // When the reaper re-dispatches a silent worker's running job (`worker::liveness`).
    let lapse = s.cfg.pool(Pool::Short).heartbeat_interval * 3;
    let text = std::fs::read_to_string(&s.run_log).unwrap_or_default();
    let each_run = super::runs::parse(&text, &ids, plan.job_ms as i64);
    let runs = super::runs::count(&each_run, lapse.as_millis() as i64);
    let results = &tally.results;
    let unix_ms = |at: Instant| now_ms() - at.elapsed().as_millis() as i64;
    let cut_ms = cut_at.map(unix_ms).unwrap_or_else(|| unix_ms(restored));
    let restored_ms = unix_ms(restored) - cut_ms;
    let duplicates = tally
        .each
        .iter()
        .filter(|(_, rs)| rs.len() > 1)
        .take(10)
        .map(|(job, rs)| {
            let results: Vec<String> = rs
                .iter()
                .map(|(w, made, read, attempts)| {
                    format!("{w} made {} read {} attempts {attempts}", made - cut_ms, read - cut_ms)
                })
                .collect();
            let runs: Vec<String> = each_run
                .get(job)
                .map(|rs| {
                    rs.iter().map(|r| format!("pid {} {}..{}", r.pid, r.start - cut_ms, r.end - cut_ms)).collect()
                })
                .unwrap_or_default();
            format!(
                "job {job} (restored at {restored_ms}): results [{}] runs [{}]",
                results.join("; "),
                runs.join("; ")
            )
        })
        .collect();
    Ok(Report {
        kind: cut.kind(),
        cut_s: cut.duration.as_secs_f64(),
        jobs: plan.jobs,
        job_ms: plan.job_ms,
        session_timeout_s: plan.session_timeout.as_secs_f64(),
        stuck,
        lost: ids.len() - results.len(),
        duplicate_results: results.values().map(|n| u64::from(n.saturating_sub(1))).sum(),
        jobs_with_duplicate_results: results.values().filter(|n| **n > 1).count(),
        executions: runs.executions,
        jobs_run_twice: runs.run_twice,
        jobs_overlapping: runs.overlapping,
        jobs_overlapping_beyond_lapse: runs.overlapping_beyond,
        longest_overlap_s: round2(runs.longest_overlap_ms as f64 / 1000.0),
        heartbeat_lapse_s: lapse.as_secs_f64(),
        all_done_s: all_done_at.map(|t| round2(t.duration_since(t0).as_secs_f64())),
        recover_s: all_done_at.map(|t| round2(t.saturating_duration_since(restored).as_secs_f64())),
        inside_results_after_restore: tally.inside_after_restore,
        inside_duplicates_after_restore: tally.inside_repeats_after_restore,
        inside_stale_after_restore: stale_after(&tally.each, unix_ms(restored)),
        repeats_not_from_the_cut: repeats_not_from(&tally.each, cut_ms),
        duplicates,
        inside_exits: s.fleet.inside_exits[exits_before.0..].to_vec(),
        host_exits: s.fleet.host_exits[exits_before.1..].to_vec(),
        producer_rebuilds: Fleet::in_logs(lab, "producer rebuilt") - rebuilds_before,
        gave_up: Fleet::in_logs(lab, "cannot serve its partitions") - gave_up_before,
        runs_fenced: Fleet::in_logs(lab, FENCED) - fenced_before,
        probes: probes.ids.len(),
        probes_finished: probes.done.len(),
        probes_by_inside: probes.by_inside,
        probes_s: probes.last.map(|d| round2(d.as_secs_f64())),
        inside_partitions_at_end: held_partitions(&lab.log_path("inside")),
        livez_failed_in_cut: livez.map(|l| l.0),
        livez_ok_after: livez.map(|l| l.1),
    })
}

/// The partitions a worker holds according to its log: its last `partitions assigned`
/// line's list, none after a `partitions revoked` line (the eager protocol revokes all).
fn held_partitions(log: &std::path::Path) -> Option<usize> {
    let text = std::fs::read_to_string(log).ok()?;
    let last = text.lines().rev().find(|l| l.contains("partitions assigned") || l.contains("partitions revoked"))?;
    if last.contains("partitions revoked") {
        return Some(0);
    }
    let list = last.split_once("partitions=[")?.1.split_once(']')?.0;
    Some(list.split(',').filter(|p| !p.trim().is_empty()).count())
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per job, its results as (worker, made, read).
    type Given<'a> = [(&'a str, &'a [(&'a str, i64, i64)])];

    fn each(jobs: &Given) -> Each {
        let rs = |rs: &[(&str, i64, i64)]| rs.iter().map(|(w, m, r)| (w.to_string(), *m, *r, 1)).collect();
        jobs.iter().map(|(j, r)| (j.to_string(), rs(r))).collect()
    }

    #[test]
    fn a_repeat_counts_as_the_cuts_only_when_its_first_result_was_made_just_before_it() {
        let cut = 100_000;
        let e = each(&[
            ("once", &[("inside-1", 10_000, 10_010)]),
            ("just before", &[("inside-1", cut - 40, cut - 30), ("host-1", cut + 20_000, cut + 20_010)]),
            ("long before", &[("inside-1", cut - 5_000, cut - 4_990), ("host-1", cut + 20_000, cut + 20_010)]),
            ("after", &[("host-1", cut + 1_000, cut + 1_010), ("host-1", cut + 3_000, cut + 3_010)]),
        ]);
        assert_eq!(repeats_not_from(&e, cut), 2);
    }

    #[test]
    fn a_result_of_the_inside_worker_made_before_the_restore_and_read_after_it_is_stale() {
        let restored = 130_000;
        let e = each(&[
            ("late", &[("inside-1", 99_000, restored + 500)]),
            ("rerun", &[("inside-1", restored + 2_000, restored + 2_010)]),
            ("host", &[("host-1", 99_000, restored + 500)]),
            ("in time", &[("inside-1", 99_000, 99_010)]),
        ]);
        assert_eq!(stale_after(&e, restored), 1);
    }
}
