//! A rolling restart driven by readiness, as Kubernetes runs one (maxSurge 1,
//! maxUnavailable 0), on the real broker and CQL database: two long-pool workers, three
//! rounds; each restart starts the replacement, waits for its `/readyz`, then stops the
//! old worker with SIGTERM. Every long job stays in its first attempt, no crash is
//! counted, and a job moved by a restart resumes from its checkpoint.

use crate::common;

use fairway::model::JobStatus;
use fairway::store::Store;
use fairway::submit::Submitter;
use std::sync::Arc;
use std::time::{Duration, Instant};

const STEPS: u32 = 120;
const STEP_MS: u64 = 250;
// The metrics listener on a free port (each worker prints where: "metrics and probes on").
const EXTRA: &str = "[worker]\nmetrics_listen = \"127.0.0.1:0\"\n\
                     [pools.long]\nslots = 8\nheartbeat_interval = \"10s\"\ndefault_estimate = \"20s\"\n\
                     [job_types.longsteps]\npool = \"long\"\nhandler = \"steps\"\ntimeout = \"5min\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_gated_on_readiness_keeps_long_jobs_in_their_first_attempt() {
    let cfg = common::config(EXTRA);
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(&cfg, EXTRA, dir.path());
    let cfg = Arc::new(cfg);
    let store = Store::open(&cfg).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let test_started = Instant::now();

    let mut workers = [common::spawn_logged_worker(&path, "long"), common::spawn_logged_worker(&path, "long")];
    for w in &workers {
        assert!(w.wait_ready(Duration::from_secs(40)).is_some(), "a first worker was not ready within 40 s");
    }
    let ids = common::submit_long_steps(&sub, &["acme", "globex", "initech", "acme"], STEPS, STEP_MS).await;
    // Restart only once every job runs (has a checkpoint), so each restart moves some.
    let deadline = Instant::now() + Duration::from_secs(40);
    for id in &ids {
        while store.checkpoint(id, 0).await.unwrap().is_none() {
            assert!(Instant::now() < deadline, "job {id} did not start within 40 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    let mut to_ready = Vec::new();
    for round in 0..3 {
        // By index: the body replaces workers[i] and then reads every worker.
        #[allow(clippy::needless_range_loop)]
        for i in 0..2 {
            let replacement = common::spawn_logged_worker(&path, "long");
            let started = Instant::now();
            let ready = replacement.wait_ready(Duration::from_secs(40));
            if ready.is_none() {
                replacement.print_tail("replacement");
            }
            let ready = ready.unwrap_or_else(|| panic!("round {round}: the replacement was not ready within 40 s"));
            to_ready.push(ready - started);
            let mut old = std::mem::replace(&mut workers[i], replacement);
            let (_, status) = old.signal("TERM", Duration::from_secs(40));
            assert!(status.success(), "a drained worker exits 0, got {status:?}");
        }
    }

    let results = common::results_for(&cfg, &ids, Duration::from_secs(90)).await;
    for w in workers.iter_mut() {
        w.signal("TERM", Duration::from_secs(40));
    }
    let mut moved = 0;
    for id in &ids {
        let rs = results.get(id).unwrap_or_else(|| panic!("no result for {id}"));
        let r = &rs[0];
        assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
        assert_eq!(r.attempts, 1, "a restart never uses an attempt: {r:?}");
        let row = store.job(id).await.unwrap().unwrap();
        assert_eq!(row.crash_count.unwrap_or(0), 0, "a readiness-gated restart is not a crash: {row:?}");
        let out: serde_json::Value = serde_json::from_slice(r.output.as_ref().unwrap()).unwrap();
        let (resumed, ran) = (out["resumed_at"].as_u64().unwrap(), out["ran"].as_u64().unwrap());
        assert_eq!(resumed + ran, u64::from(STEPS), "{out}");
        moved += usize::from(resumed > 0);
    }
    assert!(moved > 0, "no job was moved by six restarts: the test did not test hand-offs");
    to_ready.sort();
    eprintln!(
        "readiness-gated restarts: replacement ready after p50 {:?} max {:?}; {moved} of {} jobs moved; test took {:?}",
        to_ready[to_ready.len() / 2],
        to_ready.last().unwrap(),
        ids.len(),
        test_started.elapsed()
    );
}
