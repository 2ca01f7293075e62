//! Sticky assignment on the real broker (`kafka.assignor = "cooperative-sticky"`,
//! docs/partitions.md): a worker joining or leaving the pool's group moves only the
//! partitions that change owner; the others stay with their worker, consumed throughout,
//! and no job is lost on the way.

use crate::common;

use fairway::model::JobSubmitted;
use std::time::{Duration, Instant};

/// Waits until the workers own `want[i]` partitions each; panics with their logs if not.
fn wait_shares(workers: &[common::LoggedWorker], want: &[usize], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline {
        if workers.iter().zip(want).all(|(w, n)| w.owned().len() == *n) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (i, w) in workers.iter().enumerate() {
        w.print_tail(&format!("worker {i}"));
    }
    let owned: Vec<_> = workers.iter().map(common::LoggedWorker::owned).collect();
    panic!("{what}: owned {owned:?}, wanted {want:?} partitions each");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joining_or_leaving_worker_moves_only_the_partitions_that_change_owner() {
    let mut cfg = common::config("");
    cfg.kafka.partitions = 6;
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(&cfg, "[job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n", dir.path());
    // The sticky assignor (the default is the eager `range`).
    let text = std::fs::read_to_string(&path).unwrap().replacen(
        "[kafka]\n",
        "[kafka]\nassignor = \"cooperative-sticky\"\n",
        1,
    );
    std::fs::write(&path, text).unwrap();

    let a = common::spawn_logged_worker(&path, "short");
    wait_shares(std::slice::from_ref(&a), &[6], "the first worker owns every partition");
    // Jobs flow while members join and leave: none may be lost on the way.
    let jobs: Vec<JobSubmitted> =
        (0..900).map(|i| common::job_record(["acme", "globex", "initech"][i % 3], "echo")).collect();
    let producing = {
        let (cfg, jobs) = (cfg.clone(), jobs.clone());
        tokio::spawn(async move { common::produce_spread(&cfg, &jobs, Some(Duration::from_millis(10))).await })
    };

    let b = common::spawn_logged_worker(&path, "short");
    let mut fleet = vec![a, b];
    wait_shares(&fleet, &[3, 3], "a second worker takes half");
    fleet.push(common::spawn_logged_worker(&path, "short"));
    wait_shares(&fleet, &[2, 2, 2], "a third worker takes a third");
    let gave: Vec<usize> = fleet.iter().map(|w| w.revoked().len()).collect();
    fleet[2].signal("TERM", Duration::from_secs(60));
    wait_shares(&fleet[..2], &[3, 3], "the third worker's partitions go to the other two");

    producing.await.unwrap();
    let ids: Vec<String> = jobs.iter().map(|j| j.job_id.clone()).collect();
    let results = common::results_for(&cfg, &ids, Duration::from_secs(120)).await;
    let gave_after: Vec<usize> = fleet[..2].iter().map(|w| w.revoked().len()).collect();
    common::stop_fleet(&mut fleet[..2]);
    if results.len() < ids.len() {
        for (i, w) in fleet.iter().enumerate() {
            w.print_tail(&format!("worker {i}"));
        }
    }
    assert_eq!(results.len(), ids.len(), "every job has its result");
    let failed: Vec<_> = results.values().flatten().filter(|r| r.status.as_str() != "succeeded").collect();
    assert!(failed.is_empty(), "every job succeeded: {failed:?}");
    // Sticky: 6 -> 3 + 3 -> 2 + 2 + 2 means the first worker gave up 3 then 1, the
    // second 1; the eager default revokes everything at each step (6 + 3 and 3 here).
    assert_eq!(gave, vec![4, 1, 0], "partitions each worker gave up while the others joined");
    // A leaving worker's partitions only add to the others': they give up nothing.
    assert_eq!(gave_after, vec![4, 1], "partitions given up once the third worker left");
}
