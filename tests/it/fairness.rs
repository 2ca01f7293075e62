//! The fair scheduler wired into a real worker (real broker and CQL database): a light
//! tenant's job does not wait behind a flood's run-to-completion jobs when the pool has a
//! fast lane, and does without one (the control that shows the test can fail).

use crate::common;

use fairway::handlers::Registry;
use fairway::model::{JobResult, JobStatus, Pool};
use fairway::submit::{NewJob, Submitter};
use fairway::worker::{Policy, Worker};
use std::time::{Duration, Instant};

/// Flood jobs outlast the whole exchange many times over, so the ordering asserted below
/// does not depend on timing.
const FLOOD_MS: u64 = 2_000;

fn sleep_job(tenant: &str, ms: u64) -> NewJob {
    NewJob {
        tenant: tenant.into(),
        job_type: "nap".into(),
        payload: serde_json::json!({ "ms": ms }).into(),
        ..Default::default()
    }
}

/// Fills both slots with flood jobs, then submits one quiet job. Returns the quiet job's
/// result and the flood's results.
async fn quiet_behind_flood(fast_lanes: usize) -> (JobResult, Vec<JobResult>) {
    let cfg = common::arc(common::config(&format!(
        "[pools.short]\nslots = 2\nfast_lanes = {fast_lanes}\n\
         [tenants.flood]\ntier = \"pro\"\n[tenants.quiet]\ntier = \"standard\"\n\
         [job_types.nap]\npool = \"short\"\nhandler = \"sleep\"\ntimeout = \"30s\"\n"
    )));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    assert!(worker.wait_assigned(Duration::from_secs(60)).await, "the worker got no partitions");
    let sub = Submitter::new(cfg.clone(), None).unwrap();

    let mut flood_ids = Vec::new();
    for _ in 0..4 {
        flood_ids.push(sub.submit(&sleep_job("flood", FLOOD_MS)).await.expect("submit flood").job_id);
    }
    // Wait until the flood holds both slots (the worker's stats snapshot, every 500 ms).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let running = worker.shared[0].stats.lock().unwrap()["pool"]["running"].as_u64().unwrap_or(0);
        if running >= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the flood never filled both slots");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let quiet_id = sub.submit(&sleep_job("quiet", 10)).await.expect("submit quiet").job_id;

    let mut ids = flood_ids.clone();
    ids.push(quiet_id.clone());
    let results = common::results_for(&cfg, &ids, Duration::from_secs(60)).await;
    worker.stop().await;
    let one = |id: &String| {
        let rs = results.get(id).unwrap_or_else(|| panic!("job {id} has no result"));
        assert_eq!(rs[0].status, JobStatus::Succeeded, "{rs:?}");
        rs[0].clone()
    };
    let flood = flood_ids.iter().map(one).collect();
    (one(&quiet_id), flood)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_light_tenant_starts_at_once_in_a_fast_lane_while_a_flood_holds_every_slot() {
    let (quiet, flood) = quiet_behind_flood(1).await;
    // No slot can free before the first flood job has slept its FLOOD_MS.
    let first_free = flood.iter().filter_map(|r| r.started_at).min().unwrap() + FLOOD_MS as i64;
    let started = quiet.started_at.expect("the quiet job ran");
    assert!(
        started < first_free,
        "the quiet job started {} ms after the first slot could free; it should not wait for one",
        started - first_free
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_fast_lanes_a_light_tenant_waits_for_a_slot_to_free() {
    let (quiet, flood) = quiet_behind_flood(0).await;
    // No slot can free before the first flood job has slept its FLOOD_MS.
    let first_free = flood.iter().filter_map(|r| r.started_at).min().unwrap() + FLOOD_MS as i64;
    let started = quiet.started_at.expect("the quiet job ran");
    assert!(started >= first_free, "with `fast_lanes = 0` the slots are a strict cap");
}
