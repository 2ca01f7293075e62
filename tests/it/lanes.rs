//! Lanes on the real broker (`core::lanes`, docs/design/lanes.md): a tenant submitting
//! fast spreads over every partition of its pool topic and so over every worker; the
//! home lane is where librdkafka puts a record keyed by the tenant; jobs that share an
//! ordering key stay on one partition in submission order.

use crate::common;

use fairway::codec;
use fairway::core::lanes::{self, Lane};
use fairway::handlers::Registry;
use fairway::kafka;
use fairway::model::Pool;
use fairway::submit::{NewJob, Submitter};
use fairway::worker::{Policy, Worker};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The tests' configuration on six partitions per topic.
fn six_partitions() -> fairway::config::Config {
    let mut cfg = common::config("");
    cfg.kafka.partitions = 6;
    cfg
}

fn job(tenant: &str, i: usize, ordering_key: Option<&str>) -> NewJob {
    NewJob {
        tenant: tenant.into(),
        job_type: "echo".into(),
        payload: serde_json::json!({ "i": i }).into(),
        ordering_key: ordering_key.map(Into::into),
        ..Default::default()
    }
}

/// Every record of the short pool's topic: (partition, key, the payload's `i`), in offset
/// order per partition.
async fn records(cfg: &fairway::config::Config, n: usize) -> Vec<(i32, String, i64)> {
    let (rcfg, topic) = (cfg.clone(), cfg.pool_topic(Pool::Short));
    let reader = tokio::task::spawn_blocking(move || kafka::reader_from_start(&rcfg, &rcfg.group("it-lanes"), &topic))
        .await
        .unwrap()
        .expect("reader");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while out.len() < n && Instant::now() < deadline {
        use kafka::Message;
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), reader.recv()).await {
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let job = codec::decode_job(m.payload().unwrap_or_default()).expect("a job record");
            let i: serde_json::Value = serde_json::from_slice(&job.payload).expect("json payload");
            out.push((m.partition(), key, i["i"].as_i64().unwrap_or(-1)));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_tenant_spreads_over_every_partition_and_an_ordering_key_keeps_one_in_order() {
    let cfg = common::arc(six_partitions());
    common::init(&cfg).await;
    let tenant = "acme";
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    // A few jobs one by one: below `kafka.lane_rate` (50/s), so the home lane.
    for i in 0..5 {
        sub.submit(&job(tenant, 20_000 + i, None)).await.expect("submit alone");
    }
    // A burst of 1,200 jobs: far above the lane rate, so every lane.
    let burst: Vec<NewJob> = (0..1200).map(|i| job(tenant, i, None)).collect();
    for r in sub.submit_many(&burst).await {
        r.expect("submit");
    }
    // Then 100 jobs of one ordering key, one after the other (the tenant still spread).
    for i in 0..100 {
        sub.submit(&job(tenant, 10_000 + i, Some("invoice-7"))).await.expect("submit ordered");
    }
    let recs = records(&cfg, 1305).await;
    assert_eq!(recs.len(), 1305, "every record read back");

    let mut per_partition: BTreeMap<i32, usize> = BTreeMap::new();
    for (p, _, i) in &recs {
        if *i < 1_200 {
            *per_partition.entry(*p).or_default() += 1;
        }
    }
    assert_eq!(per_partition.len(), 6, "the burst reached every partition: {per_partition:?}");
    assert!(per_partition.values().all(|&c| c >= 100), "and evenly (1,200 over 6): {per_partition:?}");

    // Records on the home lane were placed by librdkafka's own partitioner from the key
    // alone: the home `core::lanes` computes is that partition.
    let home = lanes::partition(tenant, Lane::Home, 6) as i32;
    let keyed_home: Vec<i32> = recs.iter().filter(|(_, k, _)| k == tenant).map(|(p, _, _)| *p).collect();
    assert_eq!(keyed_home.len(), 5, "the jobs submitted one by one went to the home lane");
    assert!(keyed_home.iter().all(|p| *p == home), "home {home}, got {keyed_home:?}");

    // The ordering key's jobs: one partition, the one `core::lanes` names, in order.
    let ordered: Vec<&(i32, String, i64)> = recs.iter().filter(|(_, _, i)| (10_000..20_000).contains(i)).collect();
    let at = lanes::partition(tenant, Lane::ordered("invoice-7"), 6) as i32;
    assert!(ordered.iter().all(|(p, _, _)| *p == at), "one partition ({at}) for the ordering key: {ordered:?}");
    let seq: Vec<i64> = ordered.iter().map(|(_, _, i)| *i).collect();
    assert!(seq.windows(2).all(|w| w[0] < w[1]), "in submission order: {seq:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tenants_burst_runs_on_every_worker() {
    let cfg = common::arc(six_partitions());
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(Worker::start(cfg.clone(), &[Pool::Short], registry.clone(), Policy::Fair).await.unwrap());
    }
    // Every worker owns its share of the six partitions before the burst.
    let deadline = Instant::now() + Duration::from_secs(90);
    let owned = |w: &Worker| w.shared[0].assigned.load(std::sync::atomic::Ordering::SeqCst);
    while workers.iter().any(|w| owned(w) < 2) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let owned: Vec<usize> = workers.iter().map(owned).collect();
    assert!(owned.iter().all(|&n| n == 2), "two partitions each: {owned:?}");

    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let burst: Vec<NewJob> = (0..600)
        .map(|i| NewJob {
            tenant: "globex".into(),
            job_type: "sleep".into(),
            payload: serde_json::json!({ "ms": 20, "i": i }).into(),
            ..Default::default()
        })
        .collect();
    for r in sub.submit_many(&burst).await {
        r.expect("submit");
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while workers.iter().map(Worker::settled).sum::<u64>() < 600 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let settled: Vec<u64> = workers.iter().map(Worker::settled).collect();
    if settled.iter().sum::<u64>() < 600 {
        // A stall until proven otherwise: what each worker's pool loop held.
        for w in &workers {
            eprintln!("worker {} pool stats: {}", w.worker_id, w.shared[0].stats.lock().unwrap());
        }
    }
    for w in workers {
        w.stop().await;
    }
    assert_eq!(settled.iter().sum::<u64>(), 600, "every job settled: {settled:?}");
    // A batch is counted whole before it is placed: it spreads evenly over the six
    // partitions, two per worker, so every worker runs well over a quarter of it.
    assert!(settled.iter().all(|&n| n >= 150), "one tenant's burst ran on every worker: {settled:?}");
}
