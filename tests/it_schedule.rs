//! Scheduled jobs on the real broker and CQL database: a job never starts before its
//! execute_at, whether it waits in the relay (near) or parked in the store (far).

mod common;

use fairway::handlers::Registry;
use fairway::model::{JobStatus, Pool};
use fairway::submit::{NewJob, Submitter};
use fairway::worker::{Policy, Worker};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scheduled_jobs_never_start_before_execute_at() {
    // Hold at most 1 s in the relay: the 5 s job is parked in the store and promoted.
    let mut cfg = common::config("");
    cfg.worker.relay_hold_max = Duration::from_secs(1);
    let cfg = Arc::new(cfg);
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    assert!(w.wait_assigned(Duration::from_secs(30)).await);
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let now = fairway::now_ms();
    let mut jobs = Vec::new();
    for (delay_ms, tenant) in [(0, "acme"), (800, "globex"), (5_000, "initech")] {
        let j = NewJob {
            tenant: tenant.into(),
            job_type: "echo".into(),
            execute_at: Some(now + delay_ms),
            ..Default::default()
        };
        jobs.push((sub.submit(&j).await.unwrap().job_id, now + delay_ms));
    }
    let ids: Vec<String> = jobs.iter().map(|(id, _)| id.clone()).collect();
    let results = common::results_for(&cfg, &ids, Duration::from_secs(60)).await;
    w.stop().await;
    for (id, at) in &jobs {
        let r = &results.get(id).unwrap_or_else(|| panic!("job due at {at} never ran"))[0];
        assert_eq!(r.status, JobStatus::Succeeded);
        let started = r.started_at.unwrap();
        assert!(started >= *at, "started at {started}, before its execute_at {at}");
        assert!(started - at < 10_000, "started {} ms late", started - at);
    }
}
