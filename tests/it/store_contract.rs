//! The store double's contract (`fairway::sim::contract`) on the real store: the same
//! cases its unit tests run on `sim::doubles::MemStore`, here on Cassandra through
//! `fairway::store::Store`'s implementation of the route's seam.

use crate::common;
use fairway::sim::contract;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_older_heartbeat_never_replaces_a_newer_one_on_the_real_store() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let store = fairway::store::Store::open(&cfg).await.unwrap();
    let job_id = format!("contract-{}", uuid::Uuid::new_v4());
    contract::a_late_older_heartbeat_never_replaces_a_newer_one(&store, &job_id, fairway::now_ms()).await.unwrap();
    let batch = format!("contract-batch-{}", uuid::Uuid::new_v4());
    contract::a_batch_of_heartbeats_lands_and_keeps_the_newest(&store, &batch, fairway::now_ms()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_marks_claims_and_frontiers_on_the_real_store() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let store = fairway::store::Store::open(&cfg).await.unwrap();
    let id = |what: &str| format!("contract-{what}-{}", uuid::Uuid::new_v4());
    let now = fairway::now_ms();
    contract::a_run_taken_over_cannot_write_its_state(&store, &id("take-over"), now).await.unwrap();
    contract::a_finished_job_takes_no_running_mark_but_a_rerun_does(&store, &id("rerun"), now).await.unwrap();
    contract::one_claim_of_a_handed_off_job_wins(&store, &id("hand-off"), now).await.unwrap();
    contract::one_take_over_of_a_lapsed_run_wins(&store, &id("lapsed"), now).await.unwrap();
    contract::of_two_runs_that_saw_the_same_row_one_marks(&store, &id("same-row"), now).await.unwrap();
    contract::the_dispatch_frontier_only_rises(&store, &id("topic")).await.unwrap();
}
