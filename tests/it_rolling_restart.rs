//! Deploys on the real broker and CQL database: two long-pool workers restarted with
//! SIGTERM in turn, three rounds, while `steps` jobs run. Every job is handed off through
//! its checkpoint (never a crash, never an attempt), resumes where it stopped, never runs
//! on two workers at once, and waits only seconds for its new owner.

mod common;

use fairway::model::JobStatus;
use fairway::store::Store;
use fairway::submit::{NewJob, Submitter};
use std::collections::HashMap;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const STEPS: u32 = 120;
const STEP_MS: u64 = 500;
// heartbeat_interval 10s: a takeover that waited for the dying worker's heartbeat to
// lapse would stand still for 30 s or more, far beyond the bound asserted below.
const EXTRA: &str = "[pools.long]\nslots = 8\nheartbeat_interval = \"10s\"\ndefault_estimate = \"20s\"\n\
                     [job_types.longsteps]\npool = \"long\"\nhandler = \"steps\"\ntimeout = \"5min\"\n";

fn sigterm(child: &mut Child) -> Duration {
    let t = Instant::now();
    let ok = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(ok.success(), "kill -TERM {}", child.id());
    // A drain of the long pool hands off at once: the process exits within seconds.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "a drained worker exits 0, got {st:?}");
            return t.elapsed();
        }
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            panic!("worker did not exit within 40 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[derive(Default, Debug)]
struct Track {
    step: u32,
    since: Option<Instant>,
    /// Gaps between consecutive checkpoint advances longer than two steps (hand-offs).
    stalls: Vec<Duration>,
    workers: Vec<String>,
    regressions: Vec<(u32, u32)>,
}

// Ignored in the suite (run with `cargo test --test it_rolling_restart -- --ignored`,
// ~105 s): since handed-off jobs are claimed atomically (LWT on the row's status) its
// correctness checks passed in both runs of 2026-11-23, but the standstill bound is at
// the mercy of the local broker's rebalances (~5 s per group change): p50 10.8 s / max
// 13.2 s in one run, over 15 s in the other. Open: a copy stopped at once during a drain
// still writes `handed_off` over the row unconditionally.
#[ignore = "slow (~105 s) and its standstill bound depends on the local broker's rebalance timing"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rolling_restarts_hand_long_jobs_off_through_their_checkpoints() {
    let cfg = common::config(EXTRA);
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(&cfg, EXTRA, dir.path());
    let cfg = Arc::new(cfg);
    let store = Arc::new(Store::open(&cfg).await.unwrap());
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let payload = serde_json::json!({"steps": STEPS, "step_ms": STEP_MS});

    let mut workers = [common::spawn_worker(&path, "long"), common::spawn_worker(&path, "long")];
    // Let the group form before the jobs arrive.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let mut ids = Vec::new();
    for tenant in ["acme", "globex", "initech", "acme"] {
        let nj = NewJob {
            tenant: tenant.into(),
            job_type: "longsteps".into(),
            payload: payload.clone(),
            ..Default::default()
        };
        ids.push(sub.submit(&nj).await.unwrap().job_id);
    }

    // Watch every job's checkpoint and owner every 100 ms.
    let tracks: Arc<Mutex<HashMap<String, Track>>> = Arc::new(Mutex::new(HashMap::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (store, ids, tracks, stop) = (store.clone(), ids.clone(), tracks.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                for id in &ids {
                    let cp = store.checkpoint(id).await.ok().flatten();
                    let step = cp.and_then(|c| String::from_utf8(c).ok()).and_then(|s| s.parse::<u32>().ok());
                    let worker = store.job(id).await.ok().flatten().and_then(|r| r.worker);
                    let mut t = tracks.lock().unwrap();
                    let t = t.entry(id.clone()).or_default();
                    if let Some(w) = worker {
                        if t.workers.last() != Some(&w) {
                            t.workers.push(w);
                        }
                    }
                    let Some(step) = step else { continue };
                    let now = Instant::now();
                    if step < t.step {
                        t.regressions.push((t.step, step));
                    }
                    if step > t.step {
                        if let Some(since) = t.since {
                            let gap = now - since;
                            if gap > Duration::from_millis(2 * STEP_MS) && step < STEPS {
                                t.stalls.push(gap);
                            }
                        }
                        t.step = step;
                        t.since = Some(now);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // Wait until every job has made progress, then restart each worker in turn, three rounds.
    let started = Instant::now();
    while tracks.lock().unwrap().values().filter(|t| t.step >= 2).count() < ids.len() {
        assert!(started.elapsed() < Duration::from_secs(60), "jobs did not start: {:?}", tracks.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut exits = Vec::new();
    for _round in 0..3 {
        for w in workers.iter_mut() {
            exits.push(sigterm(w));
            *w = common::spawn_worker(&path, "long");
            // The local broker needs a few seconds to settle a group after a leave and a
            // join; restarting faster than that leaves new members without partitions.
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
    }

    let results = common::results_for(&cfg, &ids, Duration::from_secs(150)).await;
    stop.store(true, Ordering::SeqCst);
    watcher.await.unwrap();
    for w in workers.iter_mut() {
        sigterm(w);
    }
    let tracks = tracks.lock().unwrap();
    let mut stalls = Vec::new();
    for id in &ids {
        let rs = results.get(id).unwrap_or_else(|| panic!("no result for {id}; tracks {tracks:?}"));
        // Ended once: a redelivered copy of a finished job republishes the same result
        // record (same end, same worker), it never runs again.
        let r = &rs[0];
        assert!(
            rs.iter().all(|x| x.finished_at == r.finished_at && x.worker_id == r.worker_id && x.status == r.status),
            "{id} ended more than once: {rs:?}"
        );
        assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
        // Results count attempts from 1: one attempt, however many hand-offs.
        assert_eq!(r.attempts, 1, "a hand-off never uses an attempt: {r:?}");
        let row = store.job(id).await.unwrap().unwrap();
        assert_eq!(row.crash_count.unwrap_or(0), 0, "a hand-off is not a crash: {row:?}");
        assert_eq!(row.status.as_deref(), Some("succeeded"));
        let t = &tracks[id];
        assert!(t.regressions.is_empty(), "{id} went back from its checkpoint: {t:?}");
        // Resumed from its checkpoint: the last attempt started where the previous stopped.
        let out: serde_json::Value = serde_json::from_slice(r.output.as_ref().unwrap()).unwrap();
        let (resumed, ran) = (out["resumed_at"].as_u64().unwrap(), out["ran"].as_u64().unwrap());
        assert_eq!(resumed + ran, u64::from(STEPS), "{out}");
        if t.workers.len() > 1 {
            assert!(resumed > 0, "{id} moved workers {:?} but restarted from step 0", t.workers);
        }
        stalls.extend(t.stalls.iter().copied());
    }
    let handed_over = ids.iter().filter(|id| tracks[*id].workers.len() > 1).count();
    assert!(handed_over > 0, "no job changed workers across six restarts: {tracks:?}");
    stalls.sort();
    let p50 = stalls.get(stalls.len() / 2).copied().unwrap_or_default();
    let max = stalls.last().copied().unwrap_or_default();
    exits.sort();
    eprintln!(
        "hand-offs: {} jobs changed workers; standstill per hand-off (checkpoint gap) p50 {:?} max {:?} over {} stalls; \
         SIGTERM-to-exit p50 {:?} max {:?}",
        handed_over,
        p50,
        max,
        stalls.len(),
        exits[exits.len() / 2],
        exits.last().unwrap()
    );
    // Waiting for the dead worker's heartbeat to lapse would take >= 30 s here.
    assert!(max < Duration::from_secs(15), "a job stood still {max:?} for its new owner: {stalls:?}");
}
