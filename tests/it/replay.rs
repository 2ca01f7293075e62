//! `fairway replay` on the real broker and CQL database: dead letters written straight to
//! a test DLQ topic are replayed with filters, a dry run, the loop guard, resumption (by
//! --limit, by the stop flag) and the end-of-scan rule, then run by a real worker.

use crate::common;

use fairway::config::Config;
use fairway::core::replay::{ReplayFilter, ReplaySource};
use fairway::handlers::Registry;
use fairway::kafka::{self, Consumer, Message, Offset, TopicPartitionList};
use fairway::model::{DeadLetter, FailureClass, JobStatus, JobSubmitted, Pool, Priority};
use fairway::ops::replay::{self, ReplayOptions, ReplayReport, Stopped};
use fairway::store::{StateUpdate, Store};
use fairway::worker::{Policy, Worker};
use fairway::{codec, now_ms};
use rdkafka::producer::FutureRecord;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const IDLE: Duration = Duration::from_secs(2);

fn job(cfg: &Config, tenant: &str, job_type: &str, replay_count: i32) -> JobSubmitted {
    JobSubmitted {
        job_id: uuid::Uuid::now_v7().to_string(),
        tenant: tenant.into(),
        job_type: job_type.into(),
        pool: Some(cfg.job_types[job_type].pool),
        priority: Priority::Normal,
        payload: br#"{"replayed":true}"#.to_vec(),
        idempotency_key: None,
        execute_at: None,
        not_after: None,
        attempt: 5,
        crash_count: 1,
        generation: 0,
        submitted_at: now_ms() - 60_000,
        not_before: Some(now_ms() + 600_000),
        last_error: Some("upstream returned 503".into()),
        last_failure_class: Some(FailureClass::AppError),
        first_failure_at: Some(now_ms() - 50_000),
        replay_count,
        replayed_from: None,
        traceparent: None,
        tracestate: None,
        flow_key: None,
        user_key: None,
        handoff_count: 0,
    }
}

fn dead_letter(job: Option<JobSubmitted>) -> DeadLetter {
    DeadLetter {
        replay_count: job.as_ref().map_or(0, |j| j.replay_count),
        raw: if job.is_none() { Some(b"\x00not avro".to_vec()) } else { None },
        job,
        failure_class: FailureClass::AppError,
        reason: "gave up after 5 attempts".into(),
        last_error: Some("upstream returned 503".into()),
        attempts: 5,
        first_failure_at: now_ms() - 50_000,
        last_failure_at: now_ms() - 1_000,
        origin_topic: "somewhere.jobs.short".into(),
        origin_partition: 0,
        origin_offset: 0,
    }
}

async fn send_dl(p: &kafka::Producer, cfg: &Config, dl: &DeadLetter, partition: Option<i32>) {
    let bytes = codec::encode_dead_letter(dl).unwrap();
    let topic = cfg.dlq_topic();
    let key = dl.job.as_ref().map_or("", |j| j.tenant.as_str()).to_string();
    let mut rec = FutureRecord::to(&topic).key(&key).payload(&bytes);
    if let Some(n) = partition {
        rec = rec.partition(n);
    }
    let (client, _) = p.client().expect("producer");
    client.send(rec, rdkafka::util::Timeout::Never).await.map_err(|e| e.0).expect("produce dead letter");
}

fn opts(filter: ReplayFilter) -> ReplayOptions {
    let mut o = ReplayOptions::new(ReplaySource::Dlq, "it::replay");
    o.filter = filter;
    o.idle_timeout = IDLE;
    o
}

fn tenant(t: &str) -> ReplayFilter {
    ReplayFilter { tenant: Some(t.into()), ..Default::default() }
}

async fn replay(cfg: &Config, o: ReplayOptions) -> ReplayReport {
    tokio::time::timeout(Duration::from_secs(60), replay::run(cfg, o, |_| {}))
        .await
        .expect("replay finished in time")
        .expect("replay")
}

/// Every record of `topic` (all partitions assigned from the beginning: no group join),
/// until nothing arrived for `idle`.
async fn read_jobs(cfg: &Config, topic: &str, idle: Duration) -> Vec<JobSubmitted> {
    let c = kafka::reader(cfg, &format!("it-replay-read-{}", uuid::Uuid::new_v4()), false).unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..cfg.kafka.partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    while let Ok(m) = tokio::time::timeout(idle, c.recv()).await {
        let m = m.expect("read");
        out.push(codec::decode_job(m.payload().unwrap()).expect("a job"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dlq_replay_round_trip_with_filters_dry_run_resume_and_loop_guard() {
    let t0 = Instant::now();
    let cfg = Arc::new(common::config(""));
    common::init(&cfg).await;
    let producer = kafka::producer(&cfg).unwrap();
    let store = Store::open(&cfg).await.unwrap();

    let acme_echo: Vec<JobSubmitted> = (0..3).map(|_| job(&cfg, "acme", "echo", 0)).collect();
    let acme_report: Vec<JobSubmitted> = (0..2).map(|_| job(&cfg, "acme", "report", 0)).collect();
    let globex: Vec<JobSubmitted> =
        vec![job(&cfg, "globex", "echo", 0), job(&cfg, "globex", "echo", 1), job(&cfg, "globex", "report", 0)];
    let looping = job(&cfg, "acme", "echo", 3); // replayed 3 times already: the loop guard's limit
    for j in acme_echo.iter().chain(&acme_report).chain(&globex).chain([&looping]) {
        send_dl(&producer, &cfg, &dead_letter(Some(j.clone())), None).await;
    }
    send_dl(&producer, &cfg, &dead_letter(None), None).await; // raw bytes only
                                                              // The first job failed for good in the store: replay must make it runnable again.
    let failed = StateUpdate {
        job_id: &acme_echo[0].job_id,
        tenant: "acme",
        job_type: "echo",
        pool: "short",
        status: "failed",
        attempts: 5,
        crash_count: 1,
        generation: 0,
        submitted_at: acme_echo[0].submitted_at,
        started_at: Some(now_ms() - 2_000),
        finished_at: Some(now_ms() - 1_000),
        worker: "w-old",
        error: Some("upstream returned 503"),
        failure_class: Some("app_error"),
        output: None,
        usage: None,
    };
    store.put_state(&failed, now_ms()).await.unwrap();

    // Dry run for one tenant: counts and a sample, nothing produced, nothing saved.
    let mut dry = opts(tenant("acme"));
    dry.dry_run = true;
    let r = replay(&cfg, dry.clone()).await;
    assert_eq!(r.scanned, 10, "{r:#?}");
    assert_eq!(r.matched, 6, "3 echo + 2 report + the looping one: {r:#?}");
    assert_eq!((r.would_replay, r.replayed), (5, 0));
    let s = &r.skipped;
    assert_eq!((s.other_tenants, s.filter, s.loop_guard, s.undecodable), (3, 0, 1, 1), "globex's 3 apart: {r:#?}");
    assert_eq!(r.refused, vec![looping.job_id.clone()]);
    assert_eq!(r.sample.len(), 6);
    assert!(r.sample.iter().all(|s| s.tenant == "acme" && s.attempts == 5 && s.last_error.contains("503")));
    assert!(r.next_offsets.values().sum::<i64>() == 10, "{:?}", r.next_offsets);
    let again = replay(&cfg, dry).await;
    assert!(again.resumed_from.is_empty(), "a dry run saves no resume points");
    assert_eq!(again.would_replay, 5);

    // A real replay of acme's echo jobs, interrupted by --limit, then resumed.
    let filter = ReplayFilter { tenant: Some("acme".into()), job_type: Some("echo".into()), ..Default::default() };
    let mut first = opts(filter.clone());
    first.limit = Some(2);
    let r1 = replay(&cfg, first).await;
    assert_eq!((r1.replayed, r1.stopped), (2, Stopped::Limit), "{r1:#?}");
    let r2 = replay(&cfg, opts(filter.clone())).await;
    assert!(!r2.resumed_from.is_empty(), "continued from the saved resume points");
    assert_eq!(r2.replayed, 1, "only the job the first run did not reach: {r2:#?}");
    assert_eq!(r2.skipped.loop_guard, 1);
    assert_eq!(r1.replay_id, r2.replay_id);
    let r3 = replay(&cfg, opts(filter.clone())).await;
    assert_eq!((r3.scanned, r3.replayed), (0, 0), "a finished replay replays nothing: {r3:#?}");

    // The store row of the failed job was reset so a worker runs the copy.
    let row = store.job(&acme_echo[0].job_id).await.unwrap().unwrap();
    assert_eq!((row.status.as_deref(), row.attempts), (Some("replayed"), Some(0)));

    // The loop guard gives way to --force for that one job.
    let mut forced = opts(ReplayFilter { job_ids: Some([looping.job_id.clone()].into()), ..Default::default() });
    forced.force = true;
    let r4 = replay(&cfg, forced).await;
    assert_eq!((r4.matched, r4.replayed, r4.skipped.loop_guard), (1, 1, 0), "{r4:#?}");

    // Exactly the replayed jobs reached the pool topics, fresh and with provenance.
    let short = read_jobs(&cfg, &cfg.pool_topic(Pool::Short), IDLE).await;
    let want: HashSet<&str> = acme_echo.iter().chain([&looping]).map(|j| j.job_id.as_str()).collect();
    let got: HashSet<&str> = short.iter().map(|j| j.job_id.as_str()).collect();
    assert_eq!(short.len(), 4, "each once: {short:#?}");
    assert_eq!(got, want);
    for j in &short {
        let before = if j.job_id == looping.job_id { 3 } else { 0 };
        assert_eq!((j.attempt, j.crash_count, j.not_before), (0, 0, None), "{j:#?}");
        assert_eq!(j.replay_count, before + 1);
        assert_eq!(j.replayed_from.as_deref(), Some(cfg.dlq_topic().as_str()));
        assert_eq!((j.last_error.as_deref(), j.first_failure_at), (None, None));
        assert_eq!(j.payload, br#"{"replayed":true}"#);
    }
    let medium = read_jobs(&cfg, &cfg.pool_topic(Pool::Medium), Duration::from_millis(500)).await;
    assert!(medium.is_empty(), "the dry runs matched acme's report jobs but produced nothing: {medium:#?}");

    // And a worker runs the replayed jobs (the reset row is not taken as finished).
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let ids: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    let results = common::results_for(&cfg, &ids, Duration::from_secs(60)).await;
    worker.stop().await;
    assert_eq!(results.len(), 4, "{results:#?}");
    assert!(results.values().flatten().all(|r| r.status == JobStatus::Succeeded), "{results:#?}");
    eprintln!("round trip took {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_stops_at_records_written_after_it_started() {
    let cfg = common::config("");
    common::init(&cfg).await;
    let producer = kafka::producer(&cfg).unwrap();
    for p in 0..3 {
        for _ in 0..2 {
            send_dl(&producer, &cfg, &dead_letter(Some(job(&cfg, "acme", "echo", 0))), Some(p)).await;
        }
    }
    // A long idle timeout: the run must end on the new records, not on idleness.
    let mut o = opts(ReplayFilter::default());
    o.idle_timeout = Duration::from_secs(30);
    let t = Instant::now();
    let (r, ()) = tokio::join!(replay(&cfg, o), async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        for p in 0..3 {
            send_dl(&producer, &cfg, &dead_letter(Some(job(&cfg, "acme", "echo", 0))), Some(p)).await;
        }
    });
    assert_eq!(r.stopped, Stopped::End, "{r:#?}");
    assert!(t.elapsed() < Duration::from_secs(20), "ended early: {:?}", t.elapsed());
    assert_eq!((r.scanned, r.replayed), (6, 6), "the records written during the run are left: {r:#?}");
    assert_eq!(r.next_offsets.values().copied().collect::<Vec<_>>(), vec![2, 2, 2]);
    let next = replay(&cfg, opts(ReplayFilter::default())).await;
    assert_eq!((next.scanned, next.replayed), (3, 3), "the next run takes them: {next:#?}");
    let jobs = read_jobs(&cfg, &cfg.pool_topic(Pool::Short), IDLE).await;
    assert_eq!(jobs.iter().map(|j| &j.job_id).collect::<HashSet<_>>().len(), 9);
    assert_eq!(jobs.len(), 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interrupted_replay_resumes_without_replaying_twice() {
    let cfg = common::config("");
    common::init(&cfg).await;
    let producer = kafka::producer(&cfg).unwrap();
    for i in 0..12 {
        send_dl(&producer, &cfg, &dead_letter(Some(job(&cfg, ["acme", "globex"][i % 2], "echo", 0))), None).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut o = opts(ReplayFilter::default());
    o.rate_per_sec = 4;
    o.stop = Some(stop.clone());
    let t = Instant::now();
    let (r1, ()) = tokio::join!(replay(&cfg, o), async {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(r1.stopped, Stopped::Interrupted, "{r1:#?}");
    assert!(r1.replayed >= 1 && r1.replayed < 12, "{r1:#?}");
    // --rate 4/s: no more than the burst plus 4 per second went out.
    assert!(r1.replayed as f64 <= 1.0 + 4.0 * t.elapsed().as_secs_f64(), "{r1:#?} in {:?}", t.elapsed());
    let mut o = opts(ReplayFilter::default());
    o.rate_per_sec = 50;
    let r2 = replay(&cfg, o).await;
    assert_eq!(r1.replayed + r2.replayed, 12, "first {r1:#?} then {r2:#?}");
    let jobs = read_jobs(&cfg, &cfg.pool_topic(Pool::Short), IDLE).await;
    assert_eq!(jobs.len(), 12, "no job replayed twice");
    assert_eq!(jobs.iter().map(|j| &j.job_id).collect::<HashSet<_>>().len(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replay_from_a_retry_topic_with_an_error_filter() {
    let cfg = common::config("");
    common::init(&cfg).await;
    let producer = kafka::producer(&cfg).unwrap();
    let topic = cfg.retry_topic(FailureClass::AppError);
    let mut jobs = Vec::new();
    for i in 0..4 {
        let mut j = job(&cfg, "acme", "echo", 0);
        j.last_error = Some(if i % 2 == 0 { "Upstream returned 503".into() } else { "bad input".into() });
        kafka::send(&producer, &topic, &j.tenant, &codec::encode_job(&j).unwrap()).await.unwrap();
        jobs.push(j);
    }
    kafka::send(&producer, &topic, "acme", b"not a job").await.unwrap();
    let mut o = opts(ReplayFilter { error_contains: Some("upstream".into()), ..Default::default() });
    o.source = ReplaySource::Retry(FailureClass::AppError);
    let r = replay(&cfg, o).await;
    assert_eq!((r.scanned, r.matched, r.replayed), (5, 2, 2), "{r:#?}");
    assert_eq!((r.skipped.filter, r.skipped.undecodable), (2, 1), "{r:#?}");
    assert!(r.operator_notes.iter().any(|w| w.contains("undecodable")), "{:?}", r.operator_notes);
    let got = read_jobs(&cfg, &cfg.pool_topic(Pool::Short), IDLE).await;
    let want: HashSet<&str> = [jobs[0].job_id.as_str(), jobs[2].job_id.as_str()].into();
    assert_eq!(got.iter().map(|j| j.job_id.as_str()).collect::<HashSet<_>>(), want);
    assert_eq!(got.len(), 2);
    for j in &got {
        assert_eq!((j.attempt, j.not_before, j.replay_count), (0, None, 1));
        assert_eq!(j.replayed_from.as_deref(), Some(topic.as_str()));
    }
}

/// One tenant floods the DLQ (300 dead letters), then another's single dead letter
/// arrives: a browse that may read 99 records (33 per partition) still shows it, because
/// each partition is read from its newest records back. (Read from the start, the 99
/// were all the flood's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dlq_browse_shows_each_partitions_newest_records_past_a_flood() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let p = kafka::producer(&cfg).unwrap();
    for i in 0..300 {
        send_dl(&p, &cfg, &dead_letter(Some(job(&cfg, "acme", "echo", 0))), Some(i % 3)).await;
    }
    let globex = job(&cfg, "globex", "echo", 0);
    send_dl(&p, &cfg, &dead_letter(Some(globex.clone())), Some(1)).await;
    let b = replay::browse(&cfg, ReplaySource::Dlq, &tenant("globex"), 10, 99).await.expect("browse");
    let ids: Vec<String> = b.listed.iter().filter_map(|l| Some(l.candidate.job.as_ref()?.job_id.clone())).collect();
    assert_eq!(ids, vec![globex.job_id], "globex's dead letter is in view (scanned {})", b.scanned);
    assert!(b.scanned <= 99, "{}", b.scanned);
    let all = replay::browse(&cfg, ReplaySource::Dlq, &ReplayFilter::default(), 5, 99).await.expect("browse");
    assert_eq!(all.listed.len(), 5);
    assert_eq!(all.listed.last().and_then(|l| l.candidate.job.as_ref()).map(|j| j.tenant.as_str()), Some("globex"));
}

/// A tenant replays its own dead letters through the API (`POST /v1/replays`): a dry
/// run first, then the run it follows to its report; the replayed jobs are back on their
/// pool topic with fresh attempts. Another tenant's key neither sees them nor the run,
/// and cannot name them; a second replay while one runs is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_replays_its_own_dead_letters_through_the_api() {
    use fairway::core::auth::Caller;
    use serde_json::{json, Value};
    let cfg = Arc::new(common::config(""));
    common::init(&cfg).await;
    let producer = kafka::producer(&cfg).unwrap();
    let acme: Vec<JobSubmitted> = (0..3).map(|_| job(&cfg, "acme", "echo", 0)).collect();
    let globex: Vec<JobSubmitted> = (0..2).map(|_| job(&cfg, "globex", "echo", 0)).collect();
    for j in acme.iter().chain(&globex) {
        send_dl(&producer, &cfg, &dead_letter(Some(j.clone())), None).await;
    }
    send_dl(&producer, &cfg, &dead_letter(None), None).await; // raw bytes: no one's, as far as anyone can tell
    let (_, a) = common::create_key(&cfg, &Caller::Tenant("acme".into()), "it_replay").await;
    let (_, g) = common::create_key(&cfg, &Caller::Tenant("globex".into()), "it_replay").await;
    let (_, admin) = common::create_key(&cfg, &Caller::Admin, "it_replay").await;
    let (base, stop_api) = common::serve_api(&cfg).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let call = |key: &str, method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut req = http.request(method, format!("{base}{path}")).bearer_auth(key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        async move {
            let r = req.send().await.expect("an answer");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or_default())
        }
    };
    use reqwest::Method;

    let (status, dry) = call(&a, Method::POST, "/v1/replays", Some(json!({"dry_run": true}))).await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!((dry["would_replay"].as_u64(), dry["replayed"].as_u64()), (Some(3), Some(0)), "{dry}");
    let sampled: Vec<&str> = dry["sample"].as_array().unwrap().iter().map(|s| s["tenant"].as_str().unwrap()).collect();
    assert!(!sampled.is_empty() && sampled.iter().all(|t| *t == "acme"), "acme's dry run shows {sampled:?}");
    // The topic is shared; a tenant's counts are of its own records only.
    assert_eq!(dry["scanned"].as_u64(), Some(3), "acme is told of its own 3 records, not of the 6 read: {dry}");
    assert!(dry["skipped"].get("other_tenants").is_none() && dry["skipped"].get("undecodable").is_none(), "{dry}");
    assert_eq!(dry["warnings"], json!([]), "nothing of the undecodable record: {dry}");
    let (status, all) = call(&admin, Method::POST, "/v1/replays", Some(json!({"dry_run": true}))).await;
    assert_eq!(status, 200, "{all}");
    assert_eq!((all["scanned"].as_u64(), all["would_replay"].as_u64()), (Some(6), Some(5)), "{all}");
    assert_eq!((all["skipped"]["undecodable"].as_u64(), all["skipped"]["other_tenants"].as_u64()), (Some(1), Some(0)));
    assert_eq!(all["warnings"].as_array().map(Vec::len), Some(1), "the admin is told where it is: {all}");
    let (status, theirs) = call(&g, Method::POST, "/v1/replays", Some(json!({"dry_run": true}))).await;
    assert_eq!((status, theirs["would_replay"].as_u64()), (200, Some(2)), "globex sees its own two: {theirs}");
    let (status, named) = call(&g, Method::POST, "/v1/replays", Some(json!({"dry_run": true, "tenant": "acme"}))).await;
    assert_eq!((status, named["code"].as_str()), (403, Some("FORBIDDEN")), "{named}");

    let (status, started) = call(&a, Method::POST, "/v1/replays", Some(json!({"rate": 1000}))).await;
    assert_eq!(status, 202, "{started}");
    let run = started["run"].as_str().expect("a run id").to_string();
    let (status, again) = call(&a, Method::POST, "/v1/replays", Some(json!({}))).await;
    assert_eq!((status, again["code"].as_str()), (429, Some("TOO_MANY_REPLAYS")), "{again}");
    let (status, peek) = call(&g, Method::GET, &format!("/v1/replays/{run}"), None).await;
    assert_eq!((status, peek["code"].as_str()), (404, Some("REPLAY_NOT_FOUND")), "another tenant's run: {peek}");
    let done = common::wait_for(Duration::from_secs(60), async || {
        let (status, p) = call(&a, Method::GET, &format!("/v1/replays/{run}"), None).await;
        assert_eq!(status, 200, "{p}");
        (p["done"] == true).then_some(p)
    })
    .await
    .expect("the replay finished within 60 s");
    assert_eq!(done["replayed"].as_u64(), Some(3), "{done}");

    let back = read_jobs(&cfg, &cfg.pool_topic(Pool::Short), IDLE).await;
    let ids: HashSet<&str> = back.iter().map(|j| j.job_id.as_str()).collect();
    assert!(acme.iter().all(|j| ids.contains(j.job_id.as_str())), "acme's jobs are back on the pool topic");
    assert!(globex.iter().all(|j| !ids.contains(j.job_id.as_str())), "globex's were not replayed");
    assert!(back.iter().all(|j| j.attempt == 0 && j.replay_count == 1), "fresh attempts: {back:?}");

    // Each replayed job's events say who replayed it and in which replay (its audit).
    let acme_ids: HashSet<&str> = acme.iter().map(|j| j.job_id.as_str()).collect();
    let replayed = |v: &[fairway::model::JobEvent]| {
        v.iter()
            .filter(|e| e.kind == fairway::model::EventKind::Replayed && acme_ids.contains(e.job_id.as_str()))
            .count()
    };
    let events = common::read_until(
        &cfg,
        &cfg.events_topic(),
        Duration::from_secs(20),
        |b, _, _| codec::decode_event(b).ok(),
        |v| replayed(v) >= 3,
    )
    .await;
    assert_eq!(replayed(&events), 3, "one replayed event per job");
    let audit: Vec<&fairway::model::JobEvent> =
        events.iter().filter(|e| e.kind == fairway::model::EventKind::Replayed).collect();
    for e in &audit {
        let msg = e.message.as_deref().unwrap_or_default();
        assert!(msg.starts_with("replayed by tenant acme (key ") && msg.contains("replay 1 of this job"), "{msg}");
        assert_eq!(e.tenant, "acme", "only acme's jobs were replayed: {e:?}");
    }
    let _ = stop_api.send(());
}

/// A replay bounded in records read (what a tenant's replay through the API is) stops at
/// the bound and says so; the same replay again continues after them, so nothing is
/// skipped or replayed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_bounded_in_records_read_stops_there_and_resumes() {
    let cfg = Arc::new(common::config(""));
    common::init(&cfg).await;
    let producer = kafka::producer(&cfg).unwrap();
    let jobs: Vec<JobSubmitted> = (0..5).map(|_| job(&cfg, "acme", "echo", 0)).collect();
    for j in &jobs {
        // One partition: records are read in the order written.
        send_dl(&producer, &cfg, &dead_letter(Some(j.clone())), Some(0)).await;
    }
    let bounded = || {
        let mut o = opts(tenant("acme"));
        o.max_scanned = Some(2);
        o
    };
    let first = replay(&cfg, bounded()).await;
    assert_eq!((first.scanned, first.replayed, first.stopped), (2, 2, Stopped::ScanLimit), "{first:?}");
    let second = replay(&cfg, bounded()).await;
    assert_eq!((second.scanned, second.replayed), (2, 2), "{second:?}");
    let third = replay(&cfg, bounded()).await;
    assert_eq!((third.scanned, third.replayed), (1, 1), "{third:?}");
    let back = read_jobs(&cfg, &cfg.pool_topic(Pool::Short), IDLE).await;
    let mut ids: Vec<&str> = back.iter().filter_map(|j| j.replayed_from.as_ref().map(|_| j.job_id.as_str())).collect();
    ids.sort_unstable();
    let mut want: Vec<&str> = jobs.iter().map(|j| j.job_id.as_str()).collect();
    want.sort_unstable();
    assert_eq!(ids.len(), 5, "each of the five replayed once: {back:?}");
    assert_eq!(ids, want);
}
