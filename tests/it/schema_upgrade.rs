//! Rolling upgrades of the wire schemas on the real broker and CQL database: a job written
//! with the previous `JobSubmitted` schema (v1, the committed fastavro fixture) is run,
//! not dead-lettered; a retry record that no longer decodes is dead-lettered with its
//! bytes and the reason, never dropped.

use crate::common;

use fairway::handlers::Registry;
use fairway::kafka;
use fairway::model::{FailureClass, JobStatus, Pool};
use fairway::worker::{Policy, Worker};
use std::time::Duration;

/// The v1 fixture (written by fastavro with schemas/history/job_submitted.v1.avsc) with
/// its job id, the first field (an Avro string of 36 bytes after a one-byte length),
/// swapped for a fresh one so that every run is a new job in the shared keyspace.
fn v1_job_with_fresh_id() -> (String, Vec<u8>) {
    let mut bytes = include_bytes!("../fixtures/v1/job_submitted_minimal_fastavro.bin").to_vec();
    assert_eq!(bytes[10], 72, "the fixture's job id is a 36-byte string (zigzag length 72)");
    let id = uuid::Uuid::now_v7().to_string();
    bytes[11..47].copy_from_slice(id.as_bytes());
    (id, bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_written_with_the_previous_schema_runs() {
    let cfg = common::arc(common::config(
        "[tenants.t]\ntier = \"standard\"\n[job_types.noop]\npool = \"short\"\nhandler = \"echo\"\n",
    ));
    common::init(&cfg).await;
    let (id, bytes) = v1_job_with_fresh_id();
    let decoded = fairway::codec::decode_job(&bytes).expect("v1 decodes by schema resolution");
    assert_eq!((decoded.job_id.as_str(), decoded.traceparent.as_deref()), (id.as_str(), None));

    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let producer = kafka::producer(&cfg).unwrap();
    kafka::send(&producer, &cfg.pool_topic(Pool::Short), "t", &bytes).await.expect("produce v1 job");

    let results = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(60)).await;
    worker.stop().await;
    let rs = results.get(&id).unwrap_or_else(|| panic!("the v1 job {id} got no result"));
    assert_eq!(rs.len(), 1, "one result: {rs:?}");
    assert_eq!(rs[0].status, JobStatus::Succeeded, "{rs:?}");
    assert_eq!(rs[0].job_type, "noop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_undecodable_retry_record_is_dead_lettered_not_dropped() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let producer = kafka::producer(&cfg).unwrap();
    // A record with fairway's marker but a schema fingerprint no release ever had.
    let mut raw = vec![0xC3, 0x01, 0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3];
    raw.extend_from_slice(b"a job from a newer fairway");
    let topic = cfg.retry_topic(FailureClass::AppError);
    kafka::send(&producer, &topic, "acme", &raw).await.expect("produce retry record");

    let dls = common::dead_letters(&cfg, 1, Duration::from_secs(60)).await;
    worker.stop().await;
    let dl = dls.first().expect("the undecodable retry record reached the DLQ");
    assert_eq!(dl.raw.as_deref(), Some(&raw[..]), "the dead letter keeps the record's bytes");
    assert_eq!(dl.origin_topic, topic);
    assert!(dl.reason.contains("deadbeef00010203") && dl.reason.contains("no longer decodes"), "{}", dl.reason);
}

/// A finished record written in the per-job layout (`finished_jobs`, before packs) is
/// still a job's state after the upgrade, so the effectively-once check never runs such a
/// job again; a newer record written in a pack (a rerun's generation) wins over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_finished_record_of_the_per_job_layout_is_still_found() {
    use fairway::core::finished::bucket;
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let store = fairway::store::Store::open(&cfg).await.expect("store");
    let id = uuid::Uuid::now_v7().to_string();
    let now = fairway::now_ms();
    let old = succeeded_before_the_upgrade("w-before-the-upgrade", now);
    let q = format!("INSERT INTO {}.finished_jobs (bucket, job_id, record) VALUES (?, ?, ?)", store.keyspace());
    let blob = old.encode(Some(b"\"old\""));
    store.session().query_unpaged(q, (bucket(&id).unwrap(), &id, blob)).await.expect("write an old-layout record");

    let row = store.job(&id).await.expect("read").expect("the old record is the job's state");
    assert_eq!(
        (row.status.as_deref(), row.worker.as_deref(), row.output.as_deref()),
        (Some("succeeded"), Some("w-before-the-upgrade"), Some(&b"\"old\""[..]))
    );
    assert_eq!(store.job_direct(&id).await.expect("read").as_ref(), Some(&row));

    // The rerun's generation, finished by a newer worker, written through the store.
    let update = fairway::store::StateUpdate {
        job_id: &id,
        tenant: &old.tenant,
        job_type: &old.job_type,
        pool: &old.pool,
        status: "succeeded",
        attempts: 1,
        crash_count: 0,
        generation: 1,
        submitted_at: old.submitted_at,
        started_at: Some(now - 2),
        finished_at: Some(now - 1),
        worker: "w-after",
        error: None,
        failure_class: None,
        output: Some(b"\"new\""),
        usage: None,
    };
    store.put_finished(&update, now).await.expect("write a packed record");
    let row = store.job(&id).await.expect("read").expect("state");
    assert_eq!(
        (row.generation, row.worker.as_deref(), row.output.as_deref()),
        (Some(1), Some("w-after"), Some(&b"\"new\""[..])),
        "the rerun's packed record is newer"
    );
}

/// A pack written before packs were compressed (layout 1: the entries as they are, each
/// the id's length (u8), the id, the record's length (u32, big-endian), the record) is
/// still read from the database, beside a compressed pack of the same bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncompressed_pack_written_before_the_upgrade_is_still_found() {
    use fairway::core::finished::pack_bucket;
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let store = fairway::store::Store::open(&cfg).await.expect("store");
    let now = fairway::now_ms();
    let record = |worker: &str| succeeded_before_the_upgrade(worker, now);
    // Two jobs of one pack bucket (the same 100 ms and shard): a lookup reads its own bucket.
    let old_id = uuid::Uuid::now_v7().to_string();
    let other_id = std::iter::repeat_with(|| uuid::Uuid::now_v7().to_string())
        .take(100_000)
        .find(|id| pack_bucket(id) == pack_bucket(&old_id))
        .expect("a second id in the same pack bucket");
    let mut body = vec![1u8];
    for (id, worker) in [(&old_id, "w-plain"), (&other_id, "w-plain-2")] {
        let blob = record(worker).encode(Some(b"\"plain\""));
        body.push(id.len() as u8);
        body.extend_from_slice(id.as_bytes());
        body.extend_from_slice(&(blob.len() as u32).to_be_bytes());
        body.extend_from_slice(&blob);
    }
    let bucket = pack_bucket(&old_id).expect("a UUIDv7 id has a pack bucket");
    let q = format!("INSERT INTO {}.finished_packs (bucket, pack, body) VALUES (?, ?, ?)", store.keyspace());
    store.session().query_unpaged(q, (bucket, uuid::Uuid::now_v7(), body)).await.expect("write a layout-1 pack");

    let row = store.job(&old_id).await.expect("read").expect("the plain pack holds the job's state");
    assert_eq!(
        (row.status.as_deref(), row.worker.as_deref(), row.output.as_deref()),
        (Some("succeeded"), Some("w-plain"), Some(&b"\"plain\""[..]))
    );
    let row = store.job(&other_id).await.expect("read").expect("its second entry is found too");
    assert_eq!(row.worker.as_deref(), Some("w-plain-2"));
}

/// A finished record as a worker of the previous release wrote it: succeeded at `now` - 3.
fn succeeded_before_the_upgrade(worker: &str, now: i64) -> fairway::core::finished::FinishedRecord<'static> {
    fairway::core::finished::FinishedRecord {
        status: "succeeded".into(),
        tenant: "acme".into(),
        job_type: "noop".into(),
        pool: "short".into(),
        attempts: 1,
        crash_count: 0,
        generation: 0,
        submitted_at: now - 5,
        started_at: Some(now - 4),
        finished_at: Some(now - 3),
        worker: worker.to_string().into(),
        updated_at: now - 3,
        peak_memory_bytes: None,
        cpu_ms: None,
    }
}
