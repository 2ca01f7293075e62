//! End-to-end job path on the real broker and CQL database: submissions to pool topics,
//! workers, results, DLQ for bad input, and no loss when a worker is killed.

use crate::common;

use axum::{extract::State, http::HeaderMap, routing::post, Router};
use fairway::codec;
use fairway::handlers::Registry;
use fairway::kafka;
use fairway::model::{FailureClass, JobStatus, Pool};
use fairway::submit::{NewJob, Submitter};
use fairway::worker::{Policy, Worker};
use rdkafka::producer::FutureRecord;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn new_job(tenant: &str, job_type: &str, payload: serde_json::Value) -> NewJob {
    NewJob { tenant: tenant.into(), job_type: job_type.into(), payload: payload.into(), ..Default::default() }
}

async fn submit_all(sub: &Submitter, jobs: &[NewJob]) -> Vec<String> {
    let rs = futures::future::join_all(jobs.iter().map(|j| sub.submit(j))).await;
    rs.into_iter().map(|r| r.expect("submit").job_id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_jobs_across_tenants_and_pools_all_get_results() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short, Pool::Medium], registry, Policy::Fair).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let tenants = ["acme", "globex", "initech", "hooli", "piedpiper"];
    let mut jobs: Vec<NewJob> =
        (0..300).map(|i| new_job(tenants[i % 5], "echo", serde_json::json!({ "i": i }))).collect();
    jobs.extend((0..10).map(|i| new_job(tenants[i % 5], "report", serde_json::json!({ "ms": 50 }))));
    let ids = submit_all(&sub, &jobs).await;

    let results = common::results_for(&cfg, &ids, Duration::from_secs(90)).await;
    // Every job's outcome is recorded (a little after its result): the worker's own
    // count, which the throughput bench waits on, says so.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while worker.settled() < ids.len() as u64 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(worker.settled(), ids.len() as u64, "jobs settled by the worker");
    worker.stop().await;
    let missing: Vec<&String> = ids.iter().filter(|i| !results.contains_key(*i)).collect();
    assert!(missing.is_empty(), "{} of {} jobs have no result, e.g. {:?}", missing.len(), ids.len(), missing.first());
    for (id, rs) in &results {
        assert!(rs.iter().all(|r| r.status == JobStatus::Succeeded), "job {id} did not succeed: {rs:?}");
    }
    let medium = results.values().flatten().filter(|r| r.pool == Pool::Medium).count();
    assert!(medium >= 10, "medium-pool jobs ran in the medium pool");
    // Echo output is the payload.
    let echo = results.values().flatten().find(|r| r.job_type == "echo").unwrap();
    assert!(String::from_utf8_lossy(echo.output.as_deref().unwrap()).contains("\"i\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_and_unknown_tenant_go_to_dlq_while_the_partition_keeps_flowing() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let producer = kafka::producer(&cfg).unwrap();
    let topic = cfg.pool_topic(Pool::Short);
    let send = |bytes: Vec<u8>| {
        let producer = producer.clone();
        let topic = topic.clone();
        async move {
            let rec = FutureRecord::to(&topic).key("x").partition(0).payload(&bytes);
            let (client, _) = producer.client().unwrap();
            client.send(rec, rdkafka::util::Timeout::Never).await.map_err(|e| e.0).unwrap()
        }
    };
    let garbage = send(b"definitely not avro".to_vec()).await;
    let mut stranger = common::job_record("nobody-knows-me", "echo");
    stranger.payload = b"{}".to_vec();
    let unknown = send(codec::encode_job(&stranger).unwrap()).await;
    let mut good = Vec::new();
    for _ in 0..5 {
        let j = common::job_record("acme", "echo");
        send(codec::encode_job(&j).unwrap()).await;
        good.push(j.job_id);
    }

    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let results = common::results_for(&cfg, &good, Duration::from_secs(60)).await;
    let dlq = common::dead_letters(&cfg, 2, Duration::from_secs(30)).await;
    worker.stop().await;

    assert_eq!(results.len(), 5, "valid jobs behind bad ones in the same partition completed");
    assert_eq!(dlq.len(), 2, "{dlq:?}");
    let bad = dlq.iter().find(|d| d.job.is_none()).expect("undecodable message dead-lettered with raw bytes");
    assert_eq!(bad.raw.as_deref(), Some(&b"definitely not avro"[..]));
    assert_eq!((bad.origin_partition, bad.origin_offset), (garbage.partition, garbage.offset));
    assert!(bad.reason.contains("undecodable"), "{}", bad.reason);
    assert_eq!(bad.failure_class, FailureClass::Permanent);
    let who = dlq.iter().find(|d| d.job.is_some()).unwrap();
    assert!(who.reason.contains("unknown tenant") && who.reason.contains("nobody-knows-me"), "{}", who.reason);
    assert_eq!(who.origin_offset, unknown.offset);
    assert_eq!(who.origin_topic, topic);
}

/// Records every execution the HTTP executor makes: job id -> start times (ms).
#[derive(Clone, Default)]
struct Executions(Arc<Mutex<HashMap<String, Vec<i64>>>>);

async fn record(State(ex): State<Executions>, headers: HeaderMap) -> &'static str {
    let id = headers.get("x-fairway-job-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    ex.0.lock().unwrap().entry(id).or_default().push(fairway::now_ms());
    tokio::time::sleep(Duration::from_millis(150)).await;
    "done"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_a_worker_loses_nothing_and_reruns_only_what_the_kill_caught_unrecorded() {
    let ex = Executions::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/run", post(record)).with_state(ex.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let extra = format!(
        "[job_types.rec]\npool = \"short\"\nhandler = \"http\"\nurl = \"http://{addr}/run\"\ntimeout = \"10s\"\n"
    );
    let cfg = common::config(&extra);
    common::init(&cfg).await;
    // The worker processes read the same settings from a file.
    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(&cfg, &format!("[pools.short]\nslots = 16\n{extra}"), dir.path());
    let cfg = common::arc(cfg);

    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let tenants = ["acme", "globex", "initech"];
    let jobs: Vec<NewJob> = (0..240).map(|i| new_job(tenants[i % 3], "rec", serde_json::json!({ "i": i }))).collect();
    let ids = submit_all(&sub, &jobs).await;

    // Logged workers: a failure prints what each of them did (partitions, warnings).
    let mut first = common::spawn_logged_worker(&path, "short");
    // Let it finish some jobs and have others in flight, then kill it without warning.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while ex.0.lock().unwrap().len() < 40 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.child.kill().expect("SIGKILL the worker");
    let killed_at = fairway::now_ms();
    first.child.wait().unwrap();
    let ran_before_kill = ex.0.lock().unwrap().len();
    assert!(ran_before_kill >= 40 && ran_before_kill < ids.len(), "killed mid-run ({ran_before_kill} started)");

    let second = common::spawn_logged_worker(&path, "short");
    let results = common::results_for(&cfg, &ids, Duration::from_secs(120)).await;

    let missing: Vec<&String> = ids.iter().filter(|i| !results.contains_key(*i)).collect();
    if !missing.is_empty() {
        let by_tenant = |list: &[&String]| {
            let mut n: std::collections::BTreeMap<&str, usize> = Default::default();
            for id in list {
                let i = ids.iter().position(|x| x == *id).unwrap();
                *n.entry(tenants[i % 3]).or_default() += 1;
            }
            n
        };
        eprintln!("lost by tenant: {:?}; started before the kill: {ran_before_kill}", by_tenant(&missing));
        first.print_tail("first (killed)");
        second.print_tail("second");
    }
    drop(second);
    assert!(missing.is_empty(), "{} jobs lost after kill -9, e.g. {:?}", missing.len(), missing.first());
    // A job runs again after its result only if the kill fell between its result's
    // acknowledgement and its terminal state write (the result goes first, so a recorded
    // outcome always means a published result): a handful of jobs whose result came out
    // just before the kill. A job whose outcome was recorded is never run again.
    let execs = ex.0.lock().unwrap().clone();
    let mut in_window = 0;
    for id in &ids {
        let first_finish = results[id].iter().map(|r| r.finished_at).min().unwrap();
        if execs.get(id).into_iter().flatten().any(|started| *started > first_finish) {
            in_window += 1;
            assert!(
                first_finish > killed_at - 2_000 && first_finish <= killed_at,
                "job {id} ran again after it finished at {first_finish}, {} ms before the kill: its outcome was recorded by then",
                killed_at - first_finish
            );
        }
        assert!(results[id].iter().all(|r| r.status == JobStatus::Succeeded), "{:?}", results[id]);
    }
    // The window holds what was acknowledged but not yet written when the kill came; with
    // producer batching (linger 10 ms) and coalesced writes that is a few batches' worth
    // (14 seen once; every one of them inside the 2 s before the kill, checked above).
    assert!(in_window <= 30, "{in_window} jobs ran again after their result: more than the kill's window explains");
}

/// The job ids of every pack stored in a pack bucket, one list per pack.
async fn packed_ids(store: &fairway::store::Store, bucket: i64) -> Vec<Vec<String>> {
    let q = format!("SELECT body FROM {}.finished_packs WHERE bucket = ?", store.keyspace());
    let res = store.session().query_unpaged(q, (bucket,)).await.expect("query").into_rows_result().unwrap();
    let mut out = Vec::new();
    for row in res.rows::<(Vec<u8>,)>().unwrap() {
        let (body,) = row.unwrap();
        let opened = fairway::core::finished::open(&body).expect("a pack");
        let entries = fairway::core::finished::entries(&opened).expect("a pack's entries");
        out.push(entries.into_iter().map(|(id, _)| id.to_string()).collect());
    }
    out
}

/// A short job that succeeds is stored as one finished record grouped by submission
/// second (`core::finished`), not a `jobs` row; it is found by its id alone (status, the
/// effectively-once check), and a job whose id is not a UUIDv7 keeps its `jobs` row.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn succeeded_jobs_are_packed_records_found_by_id_and_never_run_twice() {
    let mut cfg = common::config("");
    cfg.kafka.partitions = 1;
    let cfg = common::arc(cfg);
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let jobs: Vec<NewJob> = (0..200).map(|i| new_job("acme", "echo", serde_json::json!({ "i": i }))).collect();
    let mut ids = submit_all(&sub, &jobs).await;
    let mut raw = common::job_record("acme", "echo");
    raw.job_id = uuid::Uuid::new_v4().to_string(); // a producer's own id: a UUID, not v7
    raw.payload = b"{\"raw\":true}".to_vec();
    sub.produce(&raw).await.expect("produce");
    ids.push(raw.job_id.clone());
    // A large output (over `PACK_ENTRY_MAX`) is never packed: a lookup reading its bucket
    // must not read it.
    let large = "x".repeat(fairway::core::finished::PACK_ENTRY_MAX + 1000);
    ids.extend(submit_all(&sub, &[new_job("acme", "echo", serde_json::json!(large))]).await);
    let first = common::results_for(&cfg, &ids, Duration::from_secs(90)).await;
    worker.stop().await;
    assert_eq!(first.len(), ids.len(), "every job has a result");

    let store = fairway::store::Store::open(&cfg).await.expect("store");
    for (i, id) in ids.iter().enumerate() {
        let row = store.job(id).await.expect("read").unwrap_or_else(|| panic!("job {id} has no state"));
        assert_eq!(row.status.as_deref(), Some("succeeded"), "{row:?}");
        assert_eq!(row.attempts, Some(1));
        let want = match i {
            0..200 => format!("{{\"i\":{i}}}"),
            200 => "{\"raw\":true}".to_string(),
            _ => large.clone(), // a JSON string payload is sent verbatim
        };
        assert_eq!(row.output.as_deref().map(String::from_utf8_lossy).as_deref(), Some(want.as_str()));
        assert_eq!(store.job_direct(id).await.expect("read").as_ref(), Some(&row));
    }
    // Where the states live: the UUIDv7 jobs' as packed records, many jobs per row.
    let ks = store.keyspace().to_string();
    let submitted: std::collections::HashSet<&str> = ids[..200].iter().map(String::as_str).collect();
    let buckets: std::collections::BTreeSet<i64> = ids[..200]
        .iter()
        .map(|id| fairway::core::finished::pack_bucket(id).expect("submitted ids are UUIDv7"))
        .collect();
    let (mut packed, mut packs) = (0, 0);
    for b in &buckets {
        for ids_in_pack in packed_ids(&store, *b).await {
            packed += ids_in_pack.iter().filter(|id| submitted.contains(id.as_str())).count();
            packs += 1;
        }
    }
    for id in &ids[..200] {
        let q = format!("SELECT status FROM {ks}.jobs WHERE job_id = ?");
        let res = store.session().query_unpaged(q, (id,)).await.expect("query").into_rows_result().unwrap();
        let status = res.maybe_first_row::<(Option<String>,)>().unwrap().and_then(|r| r.0);
        assert_ne!(status.as_deref(), Some("succeeded"), "job {id}: a succeeded row was written as well");
    }
    assert_eq!(packed, 200, "every submitted job's state is a packed record");
    eprintln!("200 finished jobs in {packs} packs over {} buckets", buckets.len());
    assert!(packs <= 100, "jobs finished together share packs: {packs} packs for 200 jobs");
    let q = format!("SELECT status FROM {ks}.jobs WHERE job_id = ?");
    let res = store.session().query_unpaged(q, (&raw.job_id,)).await.expect("query").into_rows_result().unwrap();
    let status = res.maybe_first_row::<(Option<String>,)>().unwrap().and_then(|r| r.0);
    assert_eq!(status.as_deref(), Some("succeeded"), "a UUIDv4 id keeps its jobs row");
    let large_id = &ids[201];
    let b = fairway::core::finished::bucket(large_id).expect("UUIDv7");
    let q = format!("SELECT job_id FROM {ks}.finished_jobs WHERE bucket = ? AND job_id = ?");
    let res = store.session().query_unpaged(q, (b, large_id)).await.expect("query").into_rows_result().unwrap();
    assert_eq!(res.rows_num(), 1, "a large finished record is a row of its own");
    let pb = fairway::core::finished::pack_bucket(large_id).expect("UUIDv7");
    for ids_in_pack in packed_ids(&store, pb).await {
        assert!(ids_in_pack.iter().all(|id| id != large_id), "the large record is not packed");
    }

    // Every record delivered again (a new consumer group reads the topic from the start):
    // the effectively-once check finds each job finished and runs none of them again.
    let mut again = (*cfg).clone();
    again.kafka.group_prefix = format!("{}again.", cfg.kafka.group_prefix);
    let again = common::arc(again);
    let registry = Registry::from_config(&again, Default::default()).unwrap();
    let worker = Worker::start(again.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let sentinel = submit_all(&sub, &[new_job("acme", "echo", serde_json::json!({ "last": true }))]).await;
    let mut all = ids.clone();
    all.extend(sentinel.iter().cloned());
    common::results_for(&cfg, &sentinel, Duration::from_secs(90)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    worker.stop().await;
    let second = common::results_for(&cfg, &all, Duration::from_secs(5)).await;
    let twice: Vec<_> = second.iter().filter(|(_, rs)| rs.len() > 1).map(|(id, _)| id).collect();
    assert!(twice.is_empty(), "{} jobs ran again on redelivery, e.g. {:?}", twice.len(), twice.first());
    assert_eq!(second.len(), all.len(), "the sentinel ran after the redelivered records");
}
