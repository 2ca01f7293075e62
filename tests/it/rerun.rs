//! `fairway rerun` on the real broker and CQL database with an in-process worker: a
//! finished tenant/job type is rerun once at the new generation (a cancelled job too,
//! its stale flag cleared) while other tenants are left alone, `--resume` and a dry run
//! add nothing, and a job still running when the rerun starts completes its old
//! generation first, then runs again as the new one, never concurrently.

use crate::common;

use fairway::codec;
use fairway::config::Config;
use fairway::core::rerun::{RerunFilter, RerunScope};
use fairway::handlers::Registry;
use fairway::kafka::{self, Consumer, Message, Offset, TopicPartitionList};
use fairway::model::{JobResult, JobStatus, JobSubmitted, Pool};
use fairway::ops::rerun::{self, RerunEnd, RerunOptions, RerunReport};
use fairway::store::Store;
use fairway::submit::{NewJob, Submitter};
use fairway::worker::{Policy, Worker};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Tenants unique to this run: the `generations` table is shared by every test run in
/// the keyspace, so a fresh (tenant, job type) pair makes the first rerun's generation 1.
fn tenants(n: usize) -> (Vec<String>, String) {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let names: Vec<String> = (0..n).map(|i| format!("rr{i}{}", &id[..10])).collect();
    let toml = names.iter().map(|t| format!("[tenants.{t}]\ntier = \"pro\"\n")).collect::<String>();
    (names, toml)
}

fn options(tenant: &str, job_type: &str) -> RerunOptions {
    let mut o = RerunOptions::new(RerunFilter {
        scope: RerunScope { tenant: Some(tenant.into()), job_type: Some(job_type.into()) },
        ..Default::default()
    });
    o.idle_timeout = Duration::from_secs(1);
    o.rate_per_sec = 500;
    o
}

async fn rerun(cfg: &Config, o: RerunOptions) -> RerunReport {
    tokio::time::timeout(Duration::from_secs(60), rerun::run(cfg, o, |_| {}))
        .await
        .expect("rerun finished in time")
        .expect("rerun")
}

/// Results of these jobs until `done` holds for them (or the timeout passes), by job id.
async fn results_until(
    cfg: &Config,
    ids: &[String],
    timeout: Duration,
    done: impl Fn(&[JobResult]) -> bool,
) -> HashMap<String, Vec<JobResult>> {
    let group = |rs: &[JobResult]| {
        let mut by: HashMap<String, Vec<JobResult>> = HashMap::new();
        for r in rs.iter().filter(|r| ids.contains(&r.job_id)) {
            by.entry(r.job_id.clone()).or_default().push(r.clone());
        }
        by
    };
    let rs = common::read_until(
        cfg,
        &cfg.results_topic(),
        timeout,
        |b, _, _| codec::decode_result(b).ok(),
        |v: &[JobResult]| {
            let by = group(v);
            ids.iter().all(|i| by.get(i).is_some_and(|rs| done(rs)))
        },
    )
    .await;
    group(&rs)
}

/// Every record of a pool topic (assigned from the beginning), until none arrived for `idle`.
async fn pool_records(cfg: &Config, pool: Pool, idle: Duration) -> Vec<JobSubmitted> {
    let c = kafka::reader(cfg, &format!("it-rerun-read-{}", uuid::Uuid::new_v4()), false).unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..cfg.kafka.partitions {
        tpl.add_partition_offset(&cfg.pool_topic(pool), p, Offset::Beginning).unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    while let Ok(m) = tokio::time::timeout(idle, c.recv()).await {
        out.push(codec::decode_job(m.expect("read").payload().unwrap()).expect("a job"));
    }
    out
}

fn gen(rs: &[JobResult], g: i64) -> Vec<&JobResult> {
    rs.iter().filter(|r| r.generation == g).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rerun_all_runs_every_job_of_the_pair_once_more_at_the_new_generation() {
    let t0 = Instant::now();
    let (names, toml) = tenants(2);
    let (acme, other) = (names[0].clone(), names[1].clone());
    let cfg = common::arc(common::config(&toml));
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();

    // Generation 0: echo jobs of two tenants, a report job of the rerun tenant (another
    // job type), and one echo job cancelled before any worker saw it.
    let echo = |t: &str, i: usize| NewJob {
        tenant: t.into(),
        job_type: "echo".into(),
        payload: serde_json::json!({ "i": i }).into(),
        ..Default::default()
    };
    let mut ours = Vec::new();
    for i in 0..12 {
        ours.push(sub.submit(&echo(&acme, i)).await.unwrap().job_id);
    }
    let mut theirs = Vec::new();
    for i in 0..4 {
        theirs.push(sub.submit(&echo(&other, i)).await.unwrap().job_id);
    }
    let report_job = NewJob { tenant: acme.clone(), job_type: "report".into(), ..Default::default() };
    let report_id = sub.submit(&report_job).await.unwrap().job_id;
    let mut cancelled = common::job_record(&acme, "echo");
    cancelled.payload = br#"{"cancelled":true}"#.to_vec();
    sub.produce(&cancelled).await.unwrap();
    store.request_cancel(&cancelled.job_id, fairway::now_ms()).await.unwrap();
    ours.push(cancelled.job_id.clone());

    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let all: Vec<String> = ours.iter().chain(&theirs).cloned().collect();
    let first = common::results_for(&cfg, &all, Duration::from_secs(60)).await;
    assert_eq!(first.len(), all.len(), "every job finished generation 0: {first:#?}");
    assert_eq!(first[&cancelled.job_id][0].status, JobStatus::Cancelled);
    assert!(all.iter().filter(|i| **i != cancelled.job_id).all(|i| first[i][0].status == JobStatus::Succeeded));
    assert!(first.values().flatten().all(|r| r.generation == 0));

    // A dry run draws nothing and writes nothing.
    let mut dry = options(&acme, "echo");
    dry.dry_run = true;
    let d = rerun(&cfg, dry).await;
    assert_eq!((d.generation, d.would_rerun, d.rerun), (Some(1), 13, 0), "{d:#?}");
    assert_eq!(d.cancel_cleared, 1, "counts the stale flag it would clear: {d:#?}");
    assert_eq!(d.sample.len(), 10);
    let stmts = store.rerun_statements().await.unwrap();
    assert_eq!(stmts.target_generation(&acme, "echo").await.unwrap(), None, "a dry run writes no generation");

    // Rerun all of (acme, echo).
    let r = rerun(&cfg, options(&acme, "echo")).await;
    assert_eq!(r.ended, RerunEnd::Done, "{r:#?}");
    assert_eq!(r.generation, Some(1), "{r:#?}");
    assert_eq!(r.rerun_id.as_deref(), Some(format!("rerun-{acme}-echo-g1").as_str()));
    // Every pool topic is scanned (the pool classifier may have moved echo): the report
    // job on the medium topic is read and filtered out too.
    assert_eq!((r.scanned, r.matched, r.selected, r.rerun), (18, 13, 13, 13), "{r:#?}");
    assert_eq!((r.skipped.filter, r.skipped.duplicate, r.skipped.at_generation), (5, 0, 0), "{r:#?}");
    assert_eq!(r.cancel_cleared, 1, "the cancelled job's stale flag: {r:#?}");
    assert_eq!(r.pairs.len(), 1);
    assert_eq!((r.pairs[0].previous, r.pairs[0].target), (None, 1));
    assert_eq!(stmts.target_generation(&acme, "echo").await.unwrap(), Some(1));

    // Every job of the pair gets a second result, at generation 1, succeeded; the
    // cancelled one too (its flag belonged to generation 0).
    let rs = results_until(&cfg, &ours, Duration::from_secs(60), |rs| !gen(rs, 1).is_empty()).await;
    for id in &ours {
        let rs = rs.get(id).cloned().unwrap_or_default();
        assert_eq!(gen(&rs, 0).len(), 1, "job {id}: {rs:#?}");
        let g1 = gen(&rs, 1);
        assert_eq!(g1.len(), 1, "job {id} ran once at generation 1: {rs:#?}");
        assert_eq!(g1[0].status, JobStatus::Succeeded, "{rs:#?}");
        assert_eq!(g1[0].attempts, 1, "a fresh attempt counter");
        let row = store.job_direct(id).await.unwrap().unwrap();
        assert_eq!((row.generation, row.status.as_deref()), (Some(1), Some("succeeded")), "{row:#?}");
    }
    let row = store.job_direct(&cancelled.job_id).await.unwrap().unwrap();
    assert_eq!(row.cancel_requested, Some(false), "the stale flag was cleared");

    // Resuming the finished rerun produces nothing: every job's newest record is at 1.
    let mut again = options(&acme, "echo");
    again.resume = true;
    let a = rerun(&cfg, again).await;
    assert_eq!((a.generation, a.rerun, a.skipped.at_generation), (Some(1), 0, 13), "{a:#?}");
    assert_eq!(a.skipped.duplicate, 13, "the generation-0 records");

    worker.stop().await;
    // Nothing of the other tenant, nor the other job type, was rerun.
    let short = pool_records(&cfg, Pool::Short, Duration::from_secs(2)).await;
    let copies: Vec<&JobSubmitted> = short.iter().filter(|j| j.generation > 0).collect();
    assert_eq!(copies.len(), 13, "one copy per job: {copies:#?}");
    assert!(copies.iter().all(|j| j.tenant == acme && j.job_type == "echo" && j.attempt == 0));
    let medium = pool_records(&cfg, Pool::Medium, Duration::from_secs(2)).await;
    assert_eq!(medium.len(), 1, "only the submission of the other job type: {medium:#?}");
    assert!(medium[0].generation == 0 && medium[0].job_id == report_id, "{medium:#?}");
    let rs = results_until(&cfg, &theirs, Duration::from_secs(5), |rs| !rs.is_empty()).await;
    for id in &theirs {
        assert_eq!(rs[id].len(), 1, "job {id} of the other tenant ran once: {:#?}", rs[id]);
        assert_eq!(rs[id][0].generation, 0);
    }
    eprintln!("rerun round trip took {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_running_during_the_rerun_finishes_its_generation_then_runs_again() {
    let t0 = Instant::now();
    let (names, toml) = tenants(1);
    let tenant = names[0].clone();
    let cfg = common::arc(common::config(&toml));
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let job = NewJob {
        tenant: tenant.clone(),
        job_type: "sleep".into(),
        payload: serde_json::json!({ "ms": 4000 }).into(),
        ..Default::default()
    };
    let id = sub.submit(&job).await.unwrap().job_id;

    // Wait until the worker records it running (generation 0), then rerun.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = store.job_direct(&id).await.unwrap();
        if row.as_ref().is_some_and(|r| r.status.as_deref() == Some("running")) {
            break;
        }
        assert!(Instant::now() < deadline, "the sleep job never started: {row:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = rerun(&cfg, options(&tenant, "sleep")).await;
    let rerun_done = fairway::now_ms();
    assert_eq!((r.generation, r.rerun, r.ended), (Some(1), 1, RerunEnd::Done), "{r:#?}");
    assert_eq!(r.cancel_pending_count, 0);
    // The row was not reset: still generation 0, running.
    let row = store.job_direct(&id).await.unwrap().unwrap();
    assert_eq!(row.generation, Some(0));

    let ids = vec![id.clone()];
    let rs = results_until(&cfg, &ids, Duration::from_secs(60), |rs| !gen(rs, 1).is_empty()).await;
    worker.stop().await;
    let rs = rs.get(&id).cloned().unwrap_or_default();
    let (g0, g1) = (gen(&rs, 0), gen(&rs, 1));
    assert_eq!((g0.len(), g1.len()), (1, 1), "each generation ran once: {rs:#?}");
    assert_eq!((g0[0].status, g1[0].status), (JobStatus::Succeeded, JobStatus::Succeeded), "{rs:#?}");
    assert!(g0[0].finished_at > rerun_done, "the rerun happened while generation 0 ran: {rs:#?}");
    let g1_started = g1[0].started_at.expect("generation 1 ran");
    assert!(
        g1_started >= g0[0].finished_at,
        "generation 1 started at {g1_started}, before generation 0 finished at {}",
        g0[0].finished_at
    );
    let row = store.job_direct(&id).await.unwrap().unwrap();
    assert_eq!((row.generation, row.status.as_deref()), (Some(1), Some("succeeded")), "{row:#?}");
    assert!(row.started_at.is_some_and(|s| s >= g0[0].finished_at), "{row:#?}");
    eprintln!("running-job rerun took {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_job_type_of_a_tenant_across_pools_limit_then_resume_produces_each_copy_once() {
    let (names, toml) = tenants(2);
    let (t, u) = (names[0].clone(), names[1].clone());
    let cfg = common::arc(common::config(&toml));
    common::init(&cfg).await;
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let mut ours = Vec::new();
    for (tenant, job_type, n, pool) in
        [(&t, "echo", 8, Pool::Short), (&t, "report", 5, Pool::Medium), (&u, "echo", 3, Pool::Short)]
    {
        for _ in 0..n {
            let mut j = common::job_record(tenant, job_type);
            j.pool = Some(pool);
            j.attempt = 2; // as if relayed from a retry topic
            j.last_error = Some("boom".into());
            sub.produce(&j).await.unwrap();
            if *tenant == t {
                ours.push(j.job_id);
            }
        }
    }
    let mut o = options(&t, "echo");
    o.filter.scope.job_type = None; // --all-job-types
    assert_eq!(o.pools(&cfg), Pool::ALL.to_vec());
    o.limit = Some(6);
    let r1 = rerun(&cfg, o.clone()).await;
    assert_eq!((r1.ended, r1.rerun, r1.generation), (RerunEnd::Limit, 6, Some(1)), "{r1:#?}");
    assert_eq!(
        r1.pairs.iter().map(|p| (p.job_type.as_str(), p.target)).collect::<Vec<_>>(),
        vec![("echo", 1), ("report", 1)]
    );
    o.limit = None;
    o.resume = true;
    let r2 = rerun(&cfg, o).await;
    assert_eq!((r2.ended, r2.rerun, r2.generation), (RerunEnd::Done, 7, Some(1)), "{r2:#?}");
    assert_eq!(r2.rerun_id, r1.rerun_id);
    assert_eq!(r2.skipped.at_generation, 6, "the first run's copies are the newest records: {r2:#?}");
    assert!(!r2.resumed_from.is_empty(), "{r2:#?}");

    let mut copies: Vec<JobSubmitted> = pool_records(&cfg, Pool::Short, Duration::from_secs(2)).await;
    copies.extend(pool_records(&cfg, Pool::Medium, Duration::from_secs(2)).await);
    copies.retain(|j| j.generation > 0);
    assert_eq!(copies.len(), 13, "each job once: {copies:#?}");
    let mut got: Vec<&str> = copies.iter().map(|j| j.job_id.as_str()).collect();
    got.sort_unstable();
    let mut want: Vec<&str> = ours.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(got, want);
    for j in &copies {
        assert_eq!((j.generation, j.attempt, j.crash_count, j.last_error.as_deref()), (1, 0, 0, None), "{j:#?}");
        let pool = if j.job_type == "report" { Pool::Medium } else { Pool::Short };
        assert_eq!(j.pool, Some(pool), "back to the pool topic it came from");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reruns_of_a_pair_never_share_a_generation() {
    let (names, toml) = tenants(1);
    let cfg = common::arc(common::config(&toml));
    common::init(&cfg).await;
    // Nothing on the topics: the scans end at once and the reruns race on the LWT.
    let runs = (0..4).map(|_| rerun(&cfg, options(&names[0], "echo")));
    let reports = futures::future::join_all(runs).await;
    let mut gens: Vec<i64> = reports.iter().map(|r| r.generation.expect("drawn")).collect();
    gens.sort_unstable();
    gens.dedup();
    assert_eq!(gens.len(), 4, "distinct generations: {gens:?}");
    let store = Store::open(&cfg).await.unwrap();
    let target = store.rerun_statements().await.unwrap().target_generation(&names[0], "echo").await.unwrap();
    assert_eq!(target, gens.last().copied(), "the table holds the highest");
    assert!(reports.iter().all(|r| r.ended == RerunEnd::Done && r.rerun == 0));
}
