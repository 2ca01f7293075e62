//! The seed's scale on the real services: 10,000 tenants (2,500 new ones through a worker). The registry follows changes,
//! not tenants (a change reaches a process by the change feed, without re-reading every
//! row); tenants admitted by policy are registered in batches (not one store write and
//! one version per tenant) while their jobs run; free accounts matching
//! `registry.free_accounts` run without a row.

use crate::common;

use fairway::config::Tier;
use fairway::core::tenants::TenantRecord;
use fairway::handlers::Registry;
use fairway::model::{JobStatus, Pool};
use fairway::store::Store;
use fairway::submit::Submitter;
use fairway::worker::{Policy, Worker};
use futures::StreamExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const TENANTS: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_among_10000_tenants_reaches_a_process_without_rereading_them() {
    let cfg = common::arc(common::config("[registry]\npoll_interval = \"500ms\"\n"));
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    let stmts = store.tenant_statements().await.unwrap();
    let seeded = stmts.list().await.unwrap().len(); // the config file's tenants
    let recs: Vec<TenantRecord> =
        (0..TENANTS).map(|i| TenantRecord::new(&format!("t{i:05}"), Tier::Standard)).collect();
    let t = Instant::now();
    for chunk in recs.chunks(1_000) {
        stmts.register(chunk, fairway::now_ms()).await.unwrap();
    }
    eprintln!("registered {TENANTS} tenants in {:?}", t.elapsed());
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let live = fairway::ops::tenants::LiveTenants::start(cfg.clone(), &store, stopped).await.unwrap();
    let total = TENANTS + seeded;
    assert_eq!(live.current().tenants.len(), total);
    // The feed re-reads the last 5 s at each poll: let the registrations' burst age out,
    // then count what following 5 changes costs.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let reads = live.reads();
    let feed_before = reads.changes_read.load(Ordering::Relaxed);
    let changes = 5;
    for i in 0..changes {
        let mut rec = live.current().tenants[&format!("t{i:05}")].clone();
        rec.max_concurrency = Some(i + 1);
        let t = Instant::now();
        stmts.put(&rec, fairway::now_ms()).await.unwrap();
        while live.current().tenants[&rec.name].max_concurrency != Some(i + 1) {
            assert!(t.elapsed() < Duration::from_secs(5), "change {i} did not reach the process within 5 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!("change {i} reached the process in {:?}", t.elapsed());
    }
    let (full, rows, feed) = (
        reads.full_reloads.load(Ordering::Relaxed),
        reads.rows_read.load(Ordering::Relaxed),
        reads.changes_read.load(Ordering::Relaxed) - feed_before,
    );
    eprintln!("full reloads {full}, rows read {rows}, feed entries read {feed}");
    assert_eq!((full, rows), (1, total as u64), "only the start-up load reads every row");
    // Each change is read again by the polls within the feed's overlap (5 s / 500 ms).
    assert!(feed <= changes as u64 * 12, "{feed} feed entries read for {changes} changes");
}

/// A job of a tenant the process does not know asks the store whether it was registered
/// meanwhile. A flood of them (an attacker's, or a producer's typo) must not re-read the
/// registry per job: one version read per check, checks shared and spaced out, and a
/// tenant registered a moment ago is still found (through the change feed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_unknown_tenants_do_not_reread_the_registry() {
    // A poll interval longer than the test: only the misses can bring news.
    let cfg = common::arc(common::config("[registry]\npoll_interval = \"60s\"\n"));
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let live = fairway::ops::tenants::LiveTenants::start(cfg.clone(), &store, stopped).await.unwrap();
    let t = Instant::now();
    let answers: Vec<bool> = futures::stream::iter(0..300)
        .map(|i| {
            let live = live.clone();
            async move { live.registered_after_all(&format!("nobody{i}")).await.unwrap() }
        })
        .buffer_unordered(300)
        .collect()
        .await;
    eprintln!("300 misses answered in {:?}", t.elapsed());
    assert!(answers.iter().all(|known| !known));
    let reads = live.reads();
    assert_eq!(reads.full_reloads.load(Ordering::Relaxed), 1, "misses must not reload every tenant");
    // A tenant registered after the process's last read is found on its first miss.
    let stmts = store.tenant_statements().await.unwrap();
    stmts.register(&[TenantRecord::new("brand-new", Tier::Standard)], fairway::now_ms()).await.unwrap();
    assert!(live.registered_after_all("brand-new").await.unwrap(), "a tenant registered meanwhile is found");
    assert_eq!(reads.full_reloads.load(Ordering::Relaxed), 1, "found through the change feed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn new_tenants_and_rowless_free_accounts_run_and_register_in_batches() {
    let extra = "[job_types.say]\npool = \"short\"\nhandler = \"echo\"\n\
                 [registry]\nunknown_tenants = \"admit\"\ndefault_tier = \"standard\"\nfree_accounts = [\"free-*\"]\n";
    let cfg = common::arc(common::config(extra));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    assert!(worker.wait_assigned(Duration::from_secs(60)).await, "the worker got no partitions");
    let store = Store::open(&cfg).await.unwrap();
    let stmts = store.tenant_statements().await.unwrap();
    let version_before = stmts.version().await.unwrap();

    // Jobs of new tenants (a debug worker on a loaded 2-core box runs ~150-300 jobs/s).
    let (paid, free) = (2_000, 500);
    let jobs: Vec<_> = (0..paid)
        .map(|i| common::job_record(&format!("paid{i:05}"), "say"))
        .chain((0..free).map(|i| common::job_record(&format!("free-{i:05}"), "say")))
        .collect();
    let ids: Vec<String> = jobs.iter().map(|j| j.job_id.clone()).collect();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let t = Instant::now();
    let sent: Vec<_> = futures::stream::iter(jobs.iter().map(|j| sub.produce(j))).buffer_unordered(500).collect().await;
    assert!(sent.iter().all(|r| r.is_ok()), "produce failed");
    let results = common::results_for(&cfg, &ids, Duration::from_secs(50)).await;
    let ok = ids.iter().filter(|id| results.get(*id).is_some_and(|r| r[0].status == JobStatus::Succeeded)).count();
    eprintln!("{ok} of {} jobs of new tenants succeeded in {:?}", ids.len(), t.elapsed());
    assert_eq!(ok, ids.len(), "every new tenant's job runs");

    // Registered in batches, in the background: every paid tenant has its row, no free
    // account has one, and the registry's version moved per batch, not per tenant.
    let deadline = Instant::now() + Duration::from_secs(20);
    let listed = loop {
        let listed = stmts.list().await.unwrap();
        if listed.len() >= paid || Instant::now() > deadline {
            break listed;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let registered = listed.keys().filter(|n| n.starts_with("paid")).count();
    assert_eq!(registered, paid, "every admitted tenant is registered");
    assert!(listed.keys().all(|n| !n.starts_with("free-")), "free accounts have no rows");
    assert!(listed.iter().filter(|(n, _)| n.starts_with("paid")).all(|(_, t)| t.tier == Tier::Standard));
    let bumps = stmts.version().await.unwrap() - version_before;
    eprintln!("registry version moved by {bumps} for {paid} registrations");
    assert!(bumps <= (paid / 50) as i64, "{bumps} version bumps for {paid} registrations");
    let reads = worker.tenants.reads();
    // One load at start; a failed feed read (a loaded store) may add a reload or two.
    let full = reads.full_reloads.load(Ordering::Relaxed);
    assert!(full <= 3, "the worker reloaded every row {full} times while {paid} tenants arrived");
    worker.stop().await;
}

/// `fairway-bench bench tenants` at the test's size: 10,000 registered tenants (50 heavy), 50,000
/// row-less free accounts (200 submit), 200 tenants never seen before, 3 workers; a light
/// trickle, and after 8 s a flood of 12,000 sleep jobs from the heavy tenants. Every job
/// finishes once, light tenants keep their waits under the flood, and registry changes
/// reach every worker during it.
#[test]
fn light_tenants_among_10000_keep_their_wait_under_a_heavy_flood() {
    let cfg = common::config("");
    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(&cfg, "", dir.path());
    let t = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fairway-bench"))
        .args(["--config", path.to_str().unwrap(), "bench", "tenants"])
        .args(["--tenants", "10000", "--heavy", "50", "--light-active", "600", "--light-jobs", "1"])
        .args(["--free-accounts", "50000", "--free-active", "200", "--new-tenants", "200"])
        .args(["--flood", "12000", "--flood-ms", "5", "--duration", "28s", "--flood-after", "8s", "--warmup", "2s"])
        .args(["--workers", "3", "--slots", "16", "--partitions", "6", "--changes", "2", "--drain-timeout", "40s"])
        .env("FAIRWAY_LOG", "warn")
        .output()
        .expect("run fairway-bench bench tenants");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{}\n{stdout}\nin {:?}", String::from_utf8_lossy(&out.stderr), t.elapsed());
    let js: serde_json::Value = serde_json::from_str(stdout.lines().last().expect("a JSON line")).expect("JSON");
    let jobs = &js["jobs"];
    assert!(jobs["submitted"].as_u64().unwrap() >= 5_000, "every job was submitted: {jobs}");
    assert_eq!(
        (jobs["lost"].as_u64(), jobs["not_succeeded"].as_u64()),
        (Some(0), Some(0)),
        "every job finishes: {jobs}"
    );
    assert!(js["cql_alive"].as_bool().unwrap(), "the database stays up");
    // Registry changes made during the flood reach every worker's view (the bench's goal is
    // 2 s with the default 1 s poll; 5 s leaves room for a loaded debug build).
    let change_max = js["registry"]["change_max_ms"].as_u64().unwrap_or(u64::MAX);
    assert!(change_max <= 5_000, "a registry change took {change_max} ms to reach every worker");
    // Fairness: under the flood, a light tenant's job is next in its worker's fair queue (the
    // heavy tenants are far ahead in virtual time), so its wait stays near its wait alone
    // (measured: p99 170 ms under the flood vs 169 ms alone, loaded debug build). Without
    // fairness (`--fifo`, or a scheduler serving the flood first) it waits behind the
    // flood's backlog, which a loaded debug build runs at ~1,000-1,400 jobs/s: 12,000 jobs
    // are ~9 s, so p99 is seconds above alone (with `--fifo` at this size: 8,269 ms vs 32 ms
    // alone, 258x; the seed-scale regression was 47x). The bound, 4x alone plus
    // 2 s, leaves room for a loaded 2-core box's stalls and is far under the backlog's wait.
    let (alone, during) = (&js["light"]["alone"]["p99_ms"], &js["light"]["during_flood"]["p99_ms"]);
    let (alone, during) =
        (alone.as_i64().expect("light waits alone"), during.as_i64().expect("light waits in the flood"));
    assert!(js["light"]["during_flood"]["jobs"].as_u64().unwrap() >= 50, "light jobs were measured during the flood");
    assert!(during <= 4 * alone + 2_000, "light tenants' p99 {during} ms under the flood vs {alone} ms alone");
    assert!(out.status.success(), "the bench reports its run complete");
}
