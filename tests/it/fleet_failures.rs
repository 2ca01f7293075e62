//! Fleet-wide retry budget and poison detection on the real broker and CQL database,
//! with three `fairway worker` processes serving one pool (`core::fleet_counts`, counts
//! exchanged through the `fleet_counts` table). Each scenario runs first with
//! `worker.fleet_limits = false` (each worker judges on its own counts, the behaviour
//! before), then fleet-wide; both measurements are printed as JSON lines.
//!
//! Jobs are produced with their job ids as record keys, so they spread over the three
//! partitions and thus the three workers. Every job runs the `fail` handler.

use crate::common;

use fairway::model::{FailureClass, JobResult, JobSubmitted};
use std::collections::HashMap;
use std::time::Duration;

/// Retry budget: no allowance for dispatches (ratio 0), 6 retries per tenant.
const ALLOWANCE: usize = 6;
const BUDGET_JOBS: usize = 45;

/// Poison: quarantine once 12 outcomes are in and more than half failed.
const MIN_SAMPLES: usize = 12;
const POISON_JOBS: usize = 72;
/// Poison jobs are produced at this pace (per second).
const POISON_PACE: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_retry_budget_holds_across_three_workers() {
    tokio::time::timeout(Duration::from_secs(420), budget_scenario()).await.expect("scenario finished in time");
}

async fn budget_scenario() {
    let before = budget_phase(false).await;
    let after = budget_phase(true).await;
    // Worst case (README, core::fleet_counts): over the cap by at most one headroom (6).
    let bound = 2 * ALLOWANCE;
    print_phases(before, after, |fleet, retried| {
        serde_json::json!({
            "test": "retry_budget", "fleet_limits": fleet, "workers": 3, "budget": ALLOWANCE,
            "jobs": BUDGET_JOBS, "retried": retried, "overshoot": retried.saturating_sub(ALLOWANCE),
            "stated_bound": bound,
        })
    });
    assert!(before > bound, "judged per worker, three workers retried {before} (the test sees the difference)");
    assert!(after <= bound, "fleet-wide: {after} retries over the bound {bound}");
    assert!(after >= ALLOWANCE.min(3), "the budget's retries happen: {after}");
}

/// Runs the failing jobs on three workers; how many were retried.
async fn budget_phase(fleet_limits: bool) -> usize {
    let extra = format!(
        "[worker.retry_budget]\nratio = 0.0\nallowance = {ALLOWANCE}.0\nwindow = \"10m\"\n\
         [worker.poison]\nmin_samples = 1000000\n\
         [job_types.boom.retry.app_error]\ndelays = [\"200ms\"]\nmax_attempts = 2\njitter = 0\n"
    );
    let results = run_failing(fleet_limits, &extra, BUDGET_JOBS, None).await;
    // A retried job's final result used two attempts; a refused retry ended after one.
    results.values().filter(|r| r.attempts >= 2).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_detection_counts_the_whole_fleet() {
    tokio::time::timeout(Duration::from_secs(420), poison_scenario()).await.expect("scenario finished in time");
}

async fn poison_scenario() {
    let before = poison_phase(false).await;
    let after = poison_phase(true).await;
    // Worst case (README, core::fleet_counts): the failures of one exchange round after
    // the fleet's sample crossed the threshold; two seconds of jobs allow for a loaded box.
    let bound = MIN_SAMPLES - 1 + 2 * POISON_PACE;
    print_phases(before, after, |fleet, ordinary| {
        serde_json::json!({
            "test": "poison", "fleet_limits": fleet, "workers": 3, "min_samples": MIN_SAMPLES,
            "jobs": POISON_JOBS, "pace_per_s": POISON_PACE, "failed_before_quarantine": ordinary,
            "overshoot": ordinary.saturating_sub(MIN_SAMPLES - 1), "stated_bound": bound,
        })
    });
    assert!(before > bound, "judged per worker, {before} failures before every worker quarantined");
    assert!(after <= bound, "fleet-wide: {after} failures handled as ordinary, over the bound {bound}");
    assert!(after >= MIN_SAMPLES - 1, "no quarantine before the sample is in: {after}");
}

/// Runs the failing jobs at a pace; how many failed as ordinary `app_error`s (the rest
/// were already `poison`).
async fn poison_phase(fleet_limits: bool) -> usize {
    let extra = format!(
        "[worker.poison]\nmin_samples = {MIN_SAMPLES}\n\
         [job_types.boom.retry.app_error]\nmax_attempts = 1\n[job_types.boom.retry.poison]\nmax_attempts = 1\n"
    );
    let pace = Duration::from_millis(1000 / POISON_PACE as u64);
    let results = run_failing(fleet_limits, &extra, POISON_JOBS, Some(pace)).await;
    let poison = results.values().filter(|r| r.failure_class == Some(FailureClass::Poison)).count();
    let ordinary = results.values().filter(|r| r.failure_class == Some(FailureClass::AppError)).count();
    assert_eq!(poison + ordinary, POISON_JOBS, "every job failed as app_error or poison");
    ordinary
}

/// Prints one JSON line per phase: judged per worker, then fleet-wide.
fn print_phases(before: usize, after: usize, line: impl Fn(bool, usize) -> serde_json::Value) {
    for (fleet, measured) in [(false, before), (true, after)] {
        eprintln!("{}", line(fleet, measured));
    }
}

/// Three workers run `n` jobs of the `fail` handler (job type `boom`) of a tenant of
/// their own, produced at once or one per `pace`; each job's final result.
async fn run_failing(fleet_limits: bool, extra: &str, n: usize, pace: Option<Duration>) -> HashMap<String, JobResult> {
    let tenant = format!("failing{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let tenant_cfg = format!("[tenants.{tenant}]\ntier = \"standard\"\n");
    let cfg = common::config(&tenant_cfg);
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let file_extra = format!(
        "{tenant_cfg}[worker]\nfleet_limits = {fleet_limits}\n[job_types.boom]\npool = \"short\"\nhandler = \"fail\"\n{extra}"
    );
    let path = common::config_file(&cfg, &file_extra, dir.path());
    let mut workers = common::spawn_fleet(&path, 3);
    let jobs: Vec<JobSubmitted> = (0..n).map(|_| common::job_record(&tenant, "boom")).collect();
    common::produce_spread(&cfg, &jobs, pace).await;
    let ids: Vec<String> = jobs.iter().map(|j| j.job_id.clone()).collect();
    let results = common::results_for(&cfg, &ids, Duration::from_secs(150)).await;
    common::stop_fleet(&mut workers);
    if results.len() < n {
        // Seen once in a full run (17 of 45 ended): the fleet's logs are the evidence.
        for (i, w) in workers.iter().enumerate() {
            w.print_tail(&format!("worker {i}"));
        }
    }
    assert_eq!(results.len(), n, "every job ended (fleet_limits = {fleet_limits})");
    // The final result of each job: the one with the most attempts.
    results.into_iter().map(|(id, rs)| (id, rs.into_iter().max_by_key(|r| r.attempts).expect("a result"))).collect()
}
