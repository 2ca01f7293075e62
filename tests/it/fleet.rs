//! Fleet-wide accounting on the real broker and CQL database: slot-time a tenant uses on
//! one worker reaches another worker's scheduler through the `usage` table, and the
//! workers' published snapshots merge into the `fairway stats` view.

use crate::common;

use fairway::core::fleet;
use fairway::handlers::Registry;
use fairway::model::Pool;
use fairway::submit::{NewJob, Submitter};
use fairway::worker::{Policy, Worker};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn usage_on_one_worker_reaches_the_other_and_the_stats_view() {
    tokio::time::timeout(Duration::from_secs(150), scenario()).await.expect("fleet scenario finished in time");
}

async fn scenario() {
    // A tenant of its own: the keyspace is shared with the other integration tests.
    let tenant = format!("fleet{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let extra = format!("[tenants.{tenant}]\ntier = \"standard\"\nmax_concurrency = 1\n");
    let cfg = common::arc(common::config(&extra));
    common::init(&cfg).await;
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    // Worker A runs the tenant's short jobs; worker B serves another pool.
    let a = Worker::start(cfg.clone(), &[Pool::Short], registry.clone(), Policy::Fair).await.unwrap();
    let b = Worker::start(cfg.clone(), &[Pool::Medium], registry, Policy::Fair).await.unwrap();
    assert!(a.wait_assigned(Duration::from_secs(60)).await, "worker A joined its group");
    assert!(b.wait_assigned(Duration::from_secs(60)).await, "worker B joined its group");

    // 8 jobs of 1.5 s, one at a time (max_concurrency = 1): ~12 s of use with a backlog.
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    for i in 0..8 {
        let job = NewJob {
            tenant: tenant.clone(),
            job_type: "sleep".into(),
            payload: serde_json::json!({ "ms": 1500, "i": i }).into(),
            ..Default::default()
        };
        sub.submit(&job).await.expect("submit");
    }

    // 1. B's scheduler is told about the tenant's use on A (another worker and pool).
    let started = Instant::now();
    let mut seen_by_b = 0.0;
    while started.elapsed() < Duration::from_secs(60) {
        seen_by_b = b.shared[0].fleet_usage.borrow().get(&tenant).copied().unwrap_or(0.0);
        if seen_by_b > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(seen_by_b > 0.0, "worker B's fleet usage shows the tenant within 60 s");
    eprintln!("fleet usage of {tenant} seen by B after {:?}: {seen_by_b:.3} slot-s", started.elapsed());

    // 2. The stats view: A's published snapshot lists the tenant running with a backlog
    //    held by its concurrency cap.
    let store = fairway::store::Store::open(&cfg).await.unwrap();
    let st = store.fleet_statements().await.unwrap();
    let key = cfg.pool_topic(Pool::Short);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = None;
    let mut found = None;
    while Instant::now() < deadline {
        let rows: Vec<fleet::SnapshotRow> =
            st.worker_stats(&key).await.unwrap().into_iter().filter(|r| r.worker == a.worker_id).collect();
        let f = fleet::aggregate(&rows, fairway::now_ms(), 30_000);
        let t = f.tenants.iter().find(|t| t.tenant == tenant).cloned();
        if let Some(t) = &t {
            if t.running >= 1 && t.backlog.total >= 1 {
                found = Some((f.clone(), t.clone()));
                break;
            }
        }
        last = Some(f);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (f, t) = found.unwrap_or_else(|| panic!("stats never showed {tenant} running with a backlog: {last:?}"));
    assert_eq!(f.snapshots, 1);
    assert_eq!(f.pools.len(), 1);
    assert_eq!(t.running, 1, "max_concurrency = 1");
    assert_eq!(t.wait_reason.as_deref(), Some("concurrency_cap"), "{t:?}");
    assert_eq!(t.tier, "standard");
    assert!(t.entitled_share > 0.0, "{t:?}");
    let js = serde_json::to_value(&f).unwrap();
    let jt = js["tenants"].as_array().unwrap().iter().find(|v| v["tenant"] == tenant.as_str()).unwrap();
    assert!(jt["running"].as_u64() == Some(1) && jt["backlog"]["total"].as_u64().unwrap() >= 1, "{jt}");
    assert!(jt["slot_seconds_used"].is_number() && jt["entitled_share"].is_number(), "{jt}");

    // 3. A never counts its own use as used elsewhere.
    let own = a.shared[0].fleet_usage.borrow().get(&tenant).copied().unwrap_or(0.0);
    assert_eq!(own, 0.0, "A's view of usage elsewhere excludes its own cells");

    a.stop().await;
    b.stop().await;
}
