//! Fleet-wide limits on the real broker and CQL database, with three `fairway worker`
//! processes serving one pool: a tenant's `max_concurrency` and a flow key's
//! `parallelism` hold across the workers (`core::quota` via the `quotas` table), and a
//! flow key at its limit does not hold back another key's jobs.
//!
//! The jobs are produced with their job ids as record keys (as a producer with its own
//! keys would), so they spread over the three partitions and thus the three workers.
//! The sleep handlers of all workers append `start <id> ...` / `done <id> ...` to one run log
//! (single O_APPEND writes, one global order), from which the peak number of jobs of a
//! tenant or key running at once is counted. The same workload runs first with
//! `worker.fleet_limits = false` (each worker on its own, the behaviour before), then
//! with the fleet-wide limits; both overshoots are printed.
//!
//! A tenant's `rate` and a flow key's `rate`/`period` are measured from the start times
//! of their jobs' results: the sustained rate and the most starts in the busiest window.

mod common;

use fairway::model::{JobStatus, JobSubmitted};
use std::collections::HashMap;
use std::time::Duration;

const TENANT_LIMIT: usize = 2;
const TENANT_JOBS: usize = 24;
const KEY_JOBS: usize = 9;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn limits_hold_across_three_workers() {
    tokio::time::timeout(Duration::from_secs(420), scenario()).await.expect("scenario finished in time");
}

async fn scenario() {
    let before = phase(false).await;
    before.print(false);
    let after = phase(true).await;
    after.print(true);
    // Per worker, three workers allow more than the limit (the test sees the difference).
    assert!(before.tenant_peak > TENANT_LIMIT, "without fleet limits the tenant ran {} at once", before.tenant_peak);
    assert!(before.key_peak > 1, "without fleet limits the key ran {} at once", before.key_peak);
    // Fleet-wide: never above the limits.
    assert!(after.tenant_peak <= TENANT_LIMIT, "tenant peak {} over max_concurrency {TENANT_LIMIT}", after.tenant_peak);
    assert!(after.tenant_peak >= 1);
    assert_eq!(after.key_peak, 1, "flow key with parallelism 1 ran one at a time");
    // Another key's jobs flowed meanwhile: in parallel, done before the limited key's.
    assert!(after.other_key_peak > 1, "the unlimited key ran {} at once", after.other_key_peak);
    assert!(after.other_done_before_key_done, "the unlimited key's jobs waited for the limited key's");
}

struct Measured {
    tenant_peak: usize,
    key_peak: usize,
    other_key_peak: usize,
    other_done_before_key_done: bool,
}

impl Measured {
    /// One JSON line: the peaks and overshoots of a phase.
    fn print(&self, fleet_limits: bool) {
        let js = serde_json::json!({
            "fleet_limits": fleet_limits,
            "tenant_limit": TENANT_LIMIT,
            "tenant_peak": self.tenant_peak,
            "tenant_overshoot": self.tenant_peak.saturating_sub(TENANT_LIMIT),
            "key_limit": 1,
            "key_peak": self.key_peak,
            "key_overshoot": self.key_peak.saturating_sub(1),
            "other_key_peak": self.other_key_peak,
        });
        eprintln!("{js}");
    }
}

async fn phase(fleet_limits: bool) -> Measured {
    let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let (tenant, key, other) = (format!("capped{id}"), format!("one{id}"), format!("free{id}"));
    let tenant_cfg = format!("[tenants.{tenant}]\ntier = \"standard\"\nmax_concurrency = {TENANT_LIMIT}\n");
    let dir = tempfile::tempdir().unwrap();
    let run_log = dir.path().join("runs.log");
    // The workers inherit the run log's path (the handlers append to it).
    std::env::set_var(fairway::handlers::RUN_LOG_ENV, &run_log);
    let mut groups: HashMap<String, &'static str> = HashMap::new();
    let mut jobs: Vec<JobSubmitted> = Vec::new();
    for i in 0..TENANT_JOBS.max(KEY_JOBS) {
        if i < TENANT_JOBS {
            jobs.push(sleep_job(&tenant, None, 400));
        }
        if i < KEY_JOBS {
            jobs.push(sleep_job("acme", Some(&key), 400));
            jobs.push(sleep_job("acme", Some(&other), 400));
        }
    }
    for j in &jobs {
        let group = match j.flow_key.as_deref() {
            Some(k) if k == key => "key",
            Some(_) => "other",
            None => "tenant",
        };
        groups.insert(j.job_id.clone(), group);
    }
    let workers_cfg = format!("[flow.keys.\"{key}\"]\nparallelism = 1\n");
    let results =
        run_on_fleet(&tenant_cfg, &workers_cfg, fleet_limits, &jobs, dir.path(), &|j| groups[&j.job_id]).await;
    assert!(results.values().all(|rs| rs.iter().any(|r| r.status == JobStatus::Succeeded)));
    measure(&std::fs::read_to_string(&run_log).unwrap(), &groups)
}

const RATE: usize = 4;
const RATE_JOBS: usize = 60;
/// Starts counted in a sliding window of this long.
const RATE_WINDOW_MS: i64 = 5_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_rate_holds_across_three_workers() {
    tokio::time::timeout(Duration::from_secs(420), rate_scenario()).await.expect("scenario finished in time");
}

async fn rate_scenario() {
    let before = rate_phase(false).await;
    let after = rate_phase(true).await;
    // Stated worst case (README, core::quota): the rate, plus a burst of burst + workers
    // tokens, plus one pass of overlap while demand moves (a second of the rate here).
    let window_bound = RATE * RATE_WINDOW_MS as usize / 1000 + RATE + 3 + RATE;
    let rate_bound = RATE as f64 * 1.25;
    for (fleet, (rate, peak)) in [(false, before), (true, after)] {
        let js = serde_json::json!({
            "test": "tenant_rate", "fleet_limits": fleet, "workers": 3, "rate_limit": RATE, "jobs": RATE_JOBS,
            "measured_rate": (rate * 100.0).round() / 100.0, "rate_overshoot": ((rate / RATE as f64 - 1.0) * 100.0).round() / 100.0,
            "most_starts_in_5s": peak, "limit_5s": RATE * 5, "stated_bound_5s": window_bound,
        });
        eprintln!("{js}");
    }
    // The busiest 5 s (not the first-to-last rate, which a worker's late start on a
    // loaded machine stretches): per worker, three workers start well over the limit.
    assert!(before.1 > RATE * 5 * 3 / 2, "per worker, three workers started {} in 5 s", before.1);
    assert!(after.0 <= rate_bound, "fleet-wide: {:.2}/s over {rate_bound}/s", after.0);
    assert!(after.1 <= window_bound, "fleet-wide: {} starts in 5 s, over {window_bound}", after.1);
    assert!(after.0 >= RATE as f64 * 0.5, "the rate is used: {:.2}/s", after.0);
}

/// Runs a rate-limited tenant's jobs on three workers: its measured rate (starts per
/// second from the first start to the last) and the most starts in any 5 s.
async fn rate_phase(fleet_limits: bool) -> (f64, usize) {
    let tenant = format!("paced{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let tenant_cfg = format!("[tenants.{tenant}]\ntier = \"standard\"\nrate_per_sec = {RATE}\n");
    let dir = tempfile::tempdir().unwrap();
    let jobs: Vec<JobSubmitted> = (0..RATE_JOBS).map(|_| sleep_job(&tenant, None, 10)).collect();
    let results = run_on_fleet(&tenant_cfg, "", fleet_limits, &jobs, dir.path(), &|_| "tenant").await;
    let mut starts: Vec<i64> = results.values().filter_map(|rs| rs.iter().filter_map(|r| r.started_at).min()).collect();
    starts.sort_unstable();
    rate_and_busiest(&starts, RATE_WINDOW_MS)
}

/// Starts (sorted epoch ms): the sustained rate per second (first start to last) and the
/// most starts in any half-open window of `window_ms`.
fn rate_and_busiest(starts: &[i64], window_ms: i64) -> (f64, usize) {
    let span_s = ((starts[starts.len() - 1] - starts[0]) as f64 / 1000.0).max(0.001);
    let peak = (0..starts.len()).map(|i| starts[i..].iter().take_while(|&&t| t - starts[i] < window_ms).count()).max();
    ((starts.len() - 1) as f64 / span_s, peak.unwrap_or(0))
}

const KEY_RATE: usize = 6;
const KEY_PERIOD_MS: i64 = 2_000;
const KEY_RATE_JOBS: usize = 30;
const WORKERS: usize = 3;
/// Stated worst case (README, `core::flow`) in any window of one period: the rate, one
/// job per worker (each worker's pacing rounds up), and one exchange pass (500 ms) of
/// the rate while demand moves between workers.
const KEY_BOUND: usize = KEY_RATE + WORKERS + KEY_RATE * 500 / KEY_PERIOD_MS as usize;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flow_key_rate_holds_across_three_workers() {
    tokio::time::timeout(Duration::from_secs(420), key_rate_scenario()).await.expect("scenario finished in time");
}

async fn key_rate_scenario() {
    let before = key_rate_phase(false).await;
    let after = key_rate_phase(true).await;
    let per_sec = KEY_RATE as f64 * 1000.0 / KEY_PERIOD_MS as f64;
    for (fleet, m) in [(false, &before), (true, &after)] {
        let js = serde_json::json!({
            "test": "flow_key_rate", "fleet_limits": fleet, "workers": WORKERS, "rate": KEY_RATE,
            "period_ms": KEY_PERIOD_MS, "jobs": KEY_RATE_JOBS,
            "measured_rate_per_sec": (m.rate * 100.0).round() / 100.0, "limit_per_sec": per_sec,
            "most_starts_in_a_period": m.busiest, "stated_bound": KEY_BOUND,
            "unlimited_key_done_ms_after_first_start": m.other_done_after_ms,
            "limited_key_last_start_ms_after_first_start": m.key_last_start_after_ms,
        });
        eprintln!("{js}");
    }
    assert!(before.busiest > KEY_BOUND, "per worker, three workers started {} in a period", before.busiest);
    assert!(after.busiest <= KEY_BOUND, "fleet-wide: {} starts in a period, over {KEY_BOUND}", after.busiest);
    assert!(after.rate <= per_sec * 1.25, "fleet-wide: {:.2}/s over {per_sec}/s", after.rate);
    assert!(after.rate >= per_sec * 0.5, "the rate is used: {:.2}/s", after.rate);
    // The unlimited key of the same tenant was not held back by the limited one.
    assert!(
        after.other_done_after_ms < after.key_last_start_after_ms,
        "the unlimited key's jobs finished {} ms in, the limited key's last started {} ms in",
        after.other_done_after_ms,
        after.key_last_start_after_ms
    );
}

struct KeyRate {
    rate: f64,
    busiest: usize,
    /// Since the first start of either key: the unlimited key's last finish, the limited
    /// key's last start.
    other_done_after_ms: i64,
    key_last_start_after_ms: i64,
}

/// Runs a key limited to `KEY_RATE` per `KEY_PERIOD_MS` and an unlimited key (same
/// tenant, as many jobs) on three workers.
async fn key_rate_phase(fleet_limits: bool) -> KeyRate {
    let id = &uuid::Uuid::new_v4().simple().to_string()[..10];
    let (key, other) = (format!("paced{id}"), format!("free{id}"));
    let dir = tempfile::tempdir().unwrap();
    let mut jobs: Vec<JobSubmitted> = Vec::new();
    for _ in 0..KEY_RATE_JOBS {
        jobs.push(sleep_job("acme", Some(&key), 100));
        jobs.push(sleep_job("acme", Some(&other), 100));
    }
    let workers_cfg = format!("[flow.keys.\"{key}\"]\nrate = {KEY_RATE}\nperiod = \"{KEY_PERIOD_MS}ms\"\n");
    let group =
        |j: &JobSubmitted| if j.flow_key.as_deref() == Some(key.as_str()) { "limited key" } else { "other key" };
    let results = run_on_fleet("", &workers_cfg, fleet_limits, &jobs, dir.path(), &group).await;
    let keyed: HashMap<&str, &str> = jobs.iter().map(|j| (j.job_id.as_str(), j.flow_key.as_deref().unwrap())).collect();
    let (mut starts, mut other_starts, mut other_done) = (Vec::new(), Vec::new(), 0);
    for (id, rs) in &results {
        let Some(r) = rs.iter().find(|r| r.status == JobStatus::Succeeded) else { panic!("job {id} did not succeed") };
        let start = rs.iter().filter_map(|r| r.started_at).min().expect("a start time");
        if keyed[id.as_str()] == key {
            starts.push(start);
        } else {
            other_starts.push(start);
            other_done = other_done.max(r.finished_at);
        }
    }
    starts.sort_unstable();
    let first = starts[0].min(other_starts.iter().copied().min().unwrap());
    let (rate, busiest) = rate_and_busiest(&starts, KEY_PERIOD_MS);
    KeyRate {
        rate,
        busiest,
        other_done_after_ms: other_done - first,
        key_last_start_after_ms: starts[starts.len() - 1] - first,
    }
}

fn sleep_job(tenant: &str, key: Option<&str>, ms: u64) -> JobSubmitted {
    JobSubmitted {
        payload: serde_json::json!({ "ms": ms }).to_string().into_bytes(),
        flow_key: key.map(str::to_string),
        ..common::job_record(tenant, "sleep")
    }
}

/// Peaks of jobs running at once per group, from the run log's global order.
fn measure(log: &str, groups: &HashMap<String, &str>) -> Measured {
    let mut running: HashMap<&str, usize> = HashMap::new();
    let mut peak: HashMap<&str, usize> = HashMap::new();
    let mut done: HashMap<&str, usize> = HashMap::new();
    let (mut other_last, mut key_last) = (0, 0);
    for (n, line) in log.lines().enumerate() {
        // `start|done <job id> <unix ms> <pid>` (handlers::demo's run log).
        let mut fields = line.split(' ');
        let (Some(phase), Some(id)) = (fields.next(), fields.next()) else { continue };
        let Some(&g) = groups.get(id) else { continue };
        let r = running.entry(g).or_default();
        if phase == "start" {
            *r += 1;
            let p = peak.entry(g).or_default();
            *p = (*p).max(*r);
        } else {
            *r = r.saturating_sub(1);
            *done.entry(g).or_default() += 1;
            match g {
                "other" => other_last = n,
                "key" => key_last = n,
                _ => {}
            }
        }
    }
    let get = |g: &str| peak.get(g).copied().unwrap_or(0);
    Measured {
        tenant_peak: get("tenant"),
        key_peak: get("key"),
        other_key_peak: get("other"),
        other_done_before_key_done: other_last < key_last,
    }
}

/// Runs `jobs` on three `fairway worker` processes of a fresh deployment: `tenant_cfg` in
/// the test's and the workers' configuration, `workers_cfg` (and `fleet_limits`, and the
/// sleep job type) in the workers' only; the jobs produced spread over the partitions.
/// Every job must finish within 150 s; if some do not, the evidence is printed first:
/// the missing jobs by `group`, and every worker's log.
async fn run_on_fleet(
    tenant_cfg: &str,
    workers_cfg: &str,
    fleet_limits: bool,
    jobs: &[JobSubmitted],
    dir: &std::path::Path,
    group: &dyn Fn(&JobSubmitted) -> &'static str,
) -> HashMap<String, Vec<fairway::model::JobResult>> {
    let cfg = common::config(tenant_cfg);
    common::init(&cfg).await;
    let file_extra = format!(
        "{tenant_cfg}[worker]\nfleet_limits = {fleet_limits}\n{workers_cfg}\
         [job_types.sleep]\npool = \"short\"\nhandler = \"sleep\"\ntimeout = \"30s\"\n"
    );
    let path = common::config_file(&cfg, &file_extra, dir);
    let mut workers = common::spawn_fleet(&path, WORKERS);
    common::produce_spread(&cfg, jobs, None).await;
    let ids: Vec<String> = jobs.iter().map(|j| j.job_id.clone()).collect();
    let results = common::results_for(&cfg, &ids, Duration::from_secs(150)).await;
    if results.len() < ids.len() {
        let mut missing: HashMap<&str, usize> = HashMap::new();
        for j in jobs.iter().filter(|j| !results.contains_key(&j.job_id)) {
            *missing.entry(group(j)).or_default() += 1;
        }
        eprintln!("missing by group: {missing:?} (fleet_limits = {fleet_limits})");
        for (i, w) in workers.iter().enumerate() {
            w.print_tail(&format!("worker{i}"));
        }
    }
    common::stop_fleet(&mut workers);
    assert_eq!(results.len(), ids.len(), "every job finished (fleet_limits = {fleet_limits})");
    results
}

/// Tenant acme parks 40 jobs on its flow key "vectorizer" limited to 1/s; tenant globex
/// then submits one job with a key of the same name: it starts within seconds, on its
/// own limit (a key is its tenant's flow). When the key was one flow for every tenant,
/// globex's job started about 40 s later, behind all of acme's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tenants_saturated_flow_key_never_delays_anothers_of_the_same_name() {
    use fairway::submit::{NewJob, Submitter};
    let cfg = common::arc(common::config("[flow.keys.vectorizer]\nrate = 1\n"));
    common::init(&cfg).await;
    let registry = fairway::handlers::Registry::from_config(&cfg, Default::default()).unwrap();
    let pools = [fairway::model::Pool::Short];
    let w = fairway::worker::Worker::start(cfg.clone(), &pools, registry, fairway::worker::Policy::Fair).await.unwrap();
    assert!(w.wait_assigned(Duration::from_secs(30)).await);
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let keyed = |tenant: &str| NewJob {
        tenant: tenant.into(),
        job_type: "echo".into(),
        flow_key: Some("vectorizer".into()),
        ..Default::default()
    };
    for _ in 0..40 {
        sub.submit(&keyed("acme")).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let submitted = fairway::now_ms();
    let id = sub.submit(&keyed("globex")).await.unwrap().job_id;
    let results = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(90)).await;
    w.stop().await;
    let r = &results.get(&id).expect("globex's job ran")[0];
    assert_eq!(r.status, JobStatus::Succeeded);
    let waited = r.started_at.unwrap() - submitted;
    println!("globex's job on its \"vectorizer\" key started {waited} ms after submission, acme's 40 parked");
    assert!(waited < 5_000, "globex's job waited {waited} ms behind acme's key");
}
