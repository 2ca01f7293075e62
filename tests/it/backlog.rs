//! Floods beyond the worker's buffer (real broker and CQL database): a flooding tenant's
//! excess spills to the store's backlog, so a quiet tenant on the *same* Kafka partition
//! is served while the flood is still mostly queued, the flood keeps its order, and
//! kill -9 while jobs are spilled or being read back loses nothing.

use crate::common;

use fairway::config::Config;
use fairway::handlers::Registry;
use fairway::model::{JobResult, JobStatus, Pool};
use fairway::submit::Submitter;
use fairway::worker::{Policy, Worker};
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const JOB_TYPES: &str = "[job_types.nap]\npool = \"short\"\nhandler = \"sleep\"\ntimeout = \"30s\"\n\
                         [tenants.flood]\ntier = \"standard\"\n[tenants.quiet]\ntier = \"standard\"\n";

/// One partition, so every tenant shares the flooder's partition.
fn one_partition(extra: &str) -> Config {
    let mut cfg = common::config(&format!("{JOB_TYPES}{extra}"));
    cfg.kafka.partitions = 1;
    cfg
}

/// Produces `n` sleep jobs of `ms` for `tenant`, in order; returns their ids in order.
async fn produce(sub: &Submitter, tenant: &str, n: usize, ms: u64) -> Vec<String> {
    let recs: Vec<_> = (0..n)
        .map(|_| {
            let mut r = common::job_record(tenant, "nap");
            r.payload = serde_json::to_vec(&serde_json::json!({ "ms": ms })).unwrap();
            r
        })
        .collect();
    let ids = recs.iter().map(|r| r.job_id.clone()).collect();
    // `buffered` polls (and so sends) in order: the records keep their order on the partition.
    let sent: Vec<_> = futures::stream::iter(recs.iter().map(|r| sub.produce(r))).buffered(256).collect().await;
    for s in sent {
        s.expect("produce");
    }
    ids
}

/// The highest value the worker's pool stats showed for `field`, sampled every 20 ms
/// until the returned task is aborted.
fn peak_of(worker: &Worker, field: &'static str) -> (Arc<std::sync::atomic::AtomicU64>, tokio::task::JoinHandle<()>) {
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (shared, max) = (worker.shared[0].clone(), peak.clone());
    let task = tokio::spawn(async move {
        loop {
            let v = shared.stats.lock().unwrap()["pool"][field].as_u64().unwrap_or(0);
            max.fetch_max(v, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (peak, task)
}

fn all_succeeded(results: &HashMap<String, Vec<JobResult>>, ids: &[String]) -> Vec<JobResult> {
    ids.iter()
        .map(|id| {
            let rs = results.get(id).unwrap_or_else(|| panic!("job {id} has no result"));
            assert!(rs.iter().all(|r| r.status == JobStatus::Succeeded), "{rs:?}");
            rs[0].clone()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quiet_tenant_on_the_flooders_partition_is_served_while_the_flood_is_mostly_queued() {
    // A buffer of 100 jobs per tenant; the flood is 30x that.
    let cfg =
        common::arc(one_partition("[worker]\ntenant_queue_limit = 100\n[pools.short]\nslots = 4\nfast_lanes = 0\n"));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    assert!(worker.wait_assigned(Duration::from_secs(60)).await, "the worker got no partitions");
    let sub = Submitter::new(cfg.clone(), None).unwrap();

    // The most spilled rows the worker's stats showed at any time of the run.
    let (max_spilled, sampler) = peak_of(&worker, "spilled");

    // 3000 jobs of 10 ms on 4 slots: at least 7.5 s of work.
    let flood = produce(&sub, "flood", 3000, 10).await;
    let mut quiet = Vec::new();
    for _ in 0..5 {
        quiet.extend(produce(&sub, "quiet", 1, 1).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut ids = flood.clone();
    ids.extend(quiet.iter().cloned());
    let results = common::results_for(&cfg, &ids, Duration::from_secs(120)).await;
    sampler.abort();
    worker.stop().await;

    let max_spilled = max_spilled.load(std::sync::atomic::Ordering::Relaxed);
    assert!(max_spilled > 1000, "the flood beyond the buffer should have spilled (saw at most {max_spilled})");
    let flood_rs = all_succeeded(&results, &flood);
    let quiet_rs = all_succeeded(&results, &quiet);
    let mut flood_done: Vec<i64> = flood_rs.iter().map(|r| r.finished_at).collect();
    flood_done.sort();
    let half = flood_done[flood_done.len() / 2];
    for q in &quiet_rs {
        assert!(
            q.finished_at < half,
            "a quiet job finished {} ms after half the flood; it must not wait behind the flood",
            q.finished_at - half
        );
    }
    // Order inside the flooding tenant is kept across the spill (4 slots start in
    // parallel, so allow a little jitter, never a jump back by a whole read-back).
    let starts: Vec<i64> = flood_rs.iter().map(|r| r.started_at.unwrap()).collect();
    let mut latest = i64::MIN;
    for (i, s) in starts.iter().enumerate() {
        assert!(*s + 200 >= latest, "flood job {i} started at {s}, {} ms before an earlier one", latest - s);
        latest = latest.max(*s);
    }
}

/// A tenant whose jobs carry large payloads spills by its bytes, far below its job count
/// limit: its share of the worker's memory is bounded (`core::buffer`, 32 MiB per tenant
/// and pool), and a quiet tenant on the same partition is still served ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_with_large_payloads_spills_by_bytes_and_the_others_are_served() {
    // The default count limit (10,000 jobs per tenant) is never reached by 150 jobs.
    let cfg = common::arc(one_partition("[pools.short]\nslots = 2\nfast_lanes = 0\n"));
    common::init(&cfg).await;
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    // 150 jobs of ~512 KiB (75 MiB), produced before the worker starts: it meets them at once.
    let pad = "x".repeat(512 << 10);
    let recs: Vec<_> = (0..150)
        .map(|_| {
            let mut r = common::job_record("flood", "nap");
            r.payload = serde_json::to_vec(&serde_json::json!({ "ms": 20, "pad": pad })).unwrap();
            r
        })
        .collect();
    let heavy: Vec<String> = recs.iter().map(|r| r.job_id.clone()).collect();
    for r in &recs {
        sub.produce(r).await.expect("produce");
    }
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    assert!(worker.wait_assigned(Duration::from_secs(60)).await, "the worker got no partitions");
    let (peak_bytes, sampler) = peak_of(&worker, "buffered_bytes");
    let quiet = produce(&sub, "quiet", 3, 1).await;
    let mut ids = heavy.clone();
    ids.extend(quiet.iter().cloned());
    let results = common::results_for(&cfg, &ids, Duration::from_secs(120)).await;
    sampler.abort();
    let spilled = worker.shared[0].stats.lock().unwrap()["pool"]["spill"]["jobs_written"].as_u64().unwrap_or(0);
    worker.stop().await;

    assert!(spilled >= 50, "75 MiB of one tenant's jobs should spill past its 32 MiB share; {spilled} spilled");
    let peak = peak_bytes.load(std::sync::atomic::Ordering::Relaxed);
    assert!(peak <= 40 << 20, "the worker buffered {peak} bytes of jobs; one tenant's share is 32 MiB");
    let heavy_rs = all_succeeded(&results, &heavy);
    let quiet_rs = all_succeeded(&results, &quiet);
    let mut heavy_done: Vec<i64> = heavy_rs.iter().map(|r| r.finished_at).collect();
    heavy_done.sort();
    let last = *heavy_done.last().unwrap();
    for q in &quiet_rs {
        assert!(q.finished_at < last, "a quiet job finished after the whole heavy backlog");
    }
}

/// Waits until at least `n` of `ids` have a result (or `timeout`); returns how many.
async fn wait_results(cfg: &Config, ids: &[String], n: usize, timeout: Duration) -> usize {
    let want: std::collections::HashSet<&String> = ids.iter().collect();
    let rs = common::read_until(
        cfg,
        &cfg.results_topic(),
        timeout,
        |b, _, _| fairway::codec::decode_result(b).ok().map(|r| r.job_id),
        |v: &[String]| v.iter().filter(|i| want.contains(i)).collect::<std::collections::HashSet<_>>().len() >= n,
    )
    .await;
    rs.iter().filter(|i| want.contains(i)).collect::<std::collections::HashSet<_>>().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_while_jobs_are_spilled_and_while_they_are_read_back_loses_nothing() {
    let mut cfg = one_partition("");
    cfg.worker.tenant_queue_limit = 50;
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(
        &cfg,
        &format!("{JOB_TYPES}[worker]\ntenant_queue_limit = 50\n[pools.short]\nslots = 4\n"),
        dir.path(),
    );
    let cfg = Arc::new(cfg);
    let store = fairway::store::Store::open(&cfg).await.expect("store");
    let backlog = store.backlog_statements().await.expect("backlog statements");
    let topic = cfg.pool_topic(Pool::Short);
    let spilled_buckets = || async { backlog.list(&topic, 0).await.expect("list backlog").len() };

    let sub = Submitter::new(cfg.clone(), None).unwrap();
    // 1500 jobs of 20 ms on 4 slots: about 7.5 s of work, 30x the buffer.
    let flood = produce(&sub, "flood", 1500, 20).await;

    // Kill 1: once some jobs finished, while most of the flood sits spilled in the store.
    let mut w = common::spawn_worker(&path, "short");
    assert!(wait_results(&cfg, &flood, 50, Duration::from_secs(60)).await >= 50, "the first worker ran nothing");
    assert!(spilled_buckets().await > 0, "the flood should be spilled at the first kill");
    w.kill().unwrap();
    w.wait().unwrap();

    // Kill 2: the next owner is reading the spilled rows back.
    let mut w = common::spawn_worker(&path, "short");
    assert!(wait_results(&cfg, &flood, 700, Duration::from_secs(90)).await >= 700, "the second worker stalled");
    assert!(spilled_buckets().await > 0, "spilled rows should still be read back at the second kill");
    w.kill().unwrap();
    w.wait().unwrap();

    let mut w = common::spawn_worker(&path, "short");
    let results = common::results_for(&cfg, &flood, Duration::from_secs(120)).await;
    // Finished buckets are dropped once every job read from them is done.
    let deadline = Instant::now() + Duration::from_secs(20);
    while spilled_buckets().await > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let left = spilled_buckets().await;
    w.kill().ok();
    w.wait().ok();

    let missing: Vec<&String> = flood.iter().filter(|i| !results.contains_key(*i)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} jobs lost after two kill -9s, e.g. {:?}",
        missing.len(),
        flood.len(),
        missing.first()
    );
    all_succeeded(&results, &flood);
    // The last bucket stays until the partition is consumed past its end (it may still fill).
    assert!(left <= 1, "{left} spilled buckets left behind after every job finished");
}

/// A flood already waiting on the partition is consumed at the broker's pace, so its
/// excess reaches the spill writer in large groups: each store row must carry many
/// spilled jobs (one row per job made the store, not the broker, set the partition's
/// pace, and the partition paused behind it; docs/design/floods.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_spills_many_jobs_per_store_row() {
    let cfg =
        common::arc(one_partition("[worker]\ntenant_queue_limit = 100\n[pools.short]\nslots = 2\nfast_lanes = 0\n"));
    common::init(&cfg).await;
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    // Produced before the worker starts: it meets 6,000 jobs at once, 60x its buffer.
    produce(&sub, "flood", 6000, 1).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    assert!(worker.wait_assigned(Duration::from_secs(60)).await, "the worker got no partitions");

    let spill = || worker.shared[0].stats.lock().unwrap()["pool"]["spill"].clone();
    let deadline = Instant::now() + Duration::from_secs(45);
    while spill()["jobs_written"].as_u64().unwrap_or(0) < 5000 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s = spill();
    worker.stop().await;

    let (jobs, rows) = (s["jobs_written"].as_u64().unwrap_or(0), s["rows_written"].as_u64().unwrap_or(0));
    assert!(jobs >= 5000, "the flood's excess should have spilled within 45 s: {s}");
    assert!(
        rows > 0 && jobs >= 10 * rows,
        "{jobs} spilled jobs took {rows} store rows; want at least 10 jobs per row: {s}"
    );
}
