//! Consumer groups on the local Apache Kafka, with `fairway worker` processes:
//! a gracefully stopped worker (SIGTERM, SIGINT) leaves its group, so its partitions move
//! to the remaining worker in about a second rather than after the session timeout; and
//! two deployments (topic prefixes) on one broker have separate groups, so workers of one
//! killed with kill -9 never hold up the other's.

use crate::common;

use std::time::{Duration, Instant};

const PARTITIONS: usize = 3;
/// The tests' `kafka.session_timeout`: what a member that did not leave would cost.
const SESSION: Duration = Duration::from_secs(6);

fn settled(workers: &[&common::LoggedWorker]) {
    for w in workers {
        assert!(w.wait_owning(1, Duration::from_secs(60)).is_some(), "a worker got no partition within 60 s");
    }
}

/// Stops `gone` with `signal` and measures how long after the signal `stays` owns every
/// partition.
fn stop_and_measure(gone: &mut common::LoggedWorker, stays: &common::LoggedWorker, signal: &str) -> Duration {
    let sent = Instant::now();
    let (exit, status) = gone.signal(signal, Duration::from_secs(40));
    assert!(status.success(), "kill -{signal}: a drained worker exits 0, got {status:?}");
    let moved = stays
        .wait_owning(PARTITIONS, Duration::from_secs(30))
        .unwrap_or_else(|| panic!("after kill -{signal} the other worker owns {:?} of {PARTITIONS}", stays.owned()));
    let took = moved.saturating_duration_since(sent);
    eprintln!("kill -{signal}: exited after {exit:?}; partitions moved after {took:?}");
    took
}

#[test]
fn a_gracefully_stopped_workers_partitions_move_at_once_while_it_drains() {
    const SLEEP: &str = "[job_types.sleep]\npool = \"short\"\nhandler = \"sleep\"\ntimeout = \"30s\"\n";
    let cfg = common::config(SLEEP);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(common::init(&cfg));
    let dir = tempfile::tempdir().unwrap();
    let path = common::config_file(&cfg, SLEEP, dir.path());
    let cfg = std::sync::Arc::new(cfg);
    let store = rt.block_on(fairway::store::Store::open(&cfg)).unwrap();
    let sub = fairway::submit::Submitter::new(cfg.clone(), None).unwrap();

    let mut a = common::spawn_logged_worker(&path, "short");
    let mut b = common::spawn_logged_worker(&path, "short");
    settled(&[&a, &b]);
    // 8 s jobs (one per tenant, so on more than one partition), and the worker running
    // one of them is stopped: it drains (the short pool lets running jobs finish) while
    // its partitions already move.
    let ids: Vec<String> = ["acme", "globex", "initech"]
        .iter()
        .map(|t| {
            let nj = fairway::submit::NewJob {
                tenant: t.to_string(),
                job_type: "sleep".into(),
                payload: serde_json::json!({"ms": 8000}).into(),
                ..Default::default()
            };
            rt.block_on(sub.submit(&nj)).unwrap().job_id
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let busy = loop {
        let rows: Vec<_> = ids.iter().filter_map(|id| rt.block_on(store.job(id)).ok().flatten()).collect();
        let running = rows.iter().filter(|r| r.status.as_deref() == Some("running")).filter_map(|r| r.worker.clone());
        // Worker ids are "<host>-<pid>-<random>".
        let pids: Vec<String> = running.filter_map(|w| w.rsplit('-').nth(1).map(str::to_string)).collect();
        if let Some(pid) = pids.first() {
            break pid.clone();
        }
        assert!(Instant::now() < deadline, "no job started within 30 s: {rows:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let (gone, stays) = if a.child.id().to_string() == busy { (&mut a, &b) } else { (&mut b, &a) };
    assert_eq!(gone.child.id().to_string(), busy, "a job runs on one of the two workers");
    let sent = Instant::now();
    let (exit, status) = gone.signal("TERM", Duration::from_secs(40));
    assert!(status.success(), "a drained worker exits 0, got {status:?}");
    let moved = stays.wait_owning(PARTITIONS, Duration::from_secs(30)).expect("the partitions moved");
    let term = moved.saturating_duration_since(sent);
    eprintln!("kill -TERM with a job running: exited after {exit:?} (drained); partitions moved after {term:?}");
    assert!(term < exit, "the partitions moved ({term:?}) only when the drain ended ({exit:?})");
    // Every job ends once, though the stopped worker could not commit its last offsets.
    let results = rt.block_on(common::results_for(&cfg, &ids, Duration::from_secs(60)));
    for id in &ids {
        let rs = results.get(id).unwrap_or_else(|| panic!("no result for {id}"));
        assert!(rs
            .iter()
            .all(|r| r.status == fairway::model::JobStatus::Succeeded && r.finished_at == rs[0].finished_at));
    }

    // The same with SIGINT, no job running.
    let (mut a, b) = if a.child.try_wait().unwrap().is_some() { (b, a) } else { (a, b) };
    drop(b);
    let c = common::spawn_logged_worker(&path, "short");
    settled(&[&a, &c]);
    let int = stop_and_measure(&mut a, &c, "INT");
    let mut c = c;
    c.signal("TERM", Duration::from_secs(40));
    // A member that vanished without leaving is noticed only after the session timeout
    // (6 s here); one that left is gone at once, and the others rejoin on their next
    // heartbeat (kafka.session_timeout / 20, 300 ms here): a move takes about half a
    // second on Kafka (the bound leaves room for a loaded CI machine).
    for took in [term, int] {
        assert!(took < Duration::from_secs(3), "partitions moved {took:?} after a graceful stop");
    }
}

/// Writes a deployment's worker config with the default consumer groups
/// (`<topic_prefix>workers.<pool>`): no `kafka.group_prefix`.
fn deployment(dir: &std::path::Path) -> (fairway::config::Config, std::path::PathBuf) {
    let mut cfg = common::config("");
    cfg.kafka.group_prefix = String::new();
    let path = common::config_file(&cfg, "", dir);
    let text = std::fs::read_to_string(&path).unwrap().replace("group_prefix = \"\"\n", "");
    std::fs::write(&path, text).unwrap();
    (cfg, path)
}

#[test]
fn a_deployment_killed_with_kill_9_does_not_hold_up_another_on_the_same_broker() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (dx, dy) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (x, x_path) = deployment(dx.path());
    let (y, y_path) = deployment(dy.path());
    assert_ne!(x.group("short"), y.group("short"), "deployments share no group by default");
    rt.block_on(common::init(&x));
    rt.block_on(common::init(&y));

    // Deployment X: two workers, both killed with kill -9 (no leave, no commit).
    let mut x1 = common::spawn_logged_worker(&x_path, "short");
    let mut x2 = common::spawn_logged_worker(&x_path, "short");
    settled(&[&x1, &x2]);
    x1.signal("KILL", Duration::from_secs(10));
    let killed = Instant::now();
    // The survivor gets the dead member's partitions once its session lapses.
    let survivor = x2.wait_owning(PARTITIONS, SESSION * 3);
    let took = survivor.map(|at| at.saturating_duration_since(killed));
    eprintln!("deployment X: after kill -9 of one member the survivor owns {:?} after {took:?}", x2.owned());
    assert!(took.is_some(), "the survivor owns {:?} of {PARTITIONS} after {:?}", x2.owned(), SESSION * 3);
    x2.signal("KILL", Duration::from_secs(10));

    // Deployment Y on the same broker: its worker gets every partition within seconds.
    let started = Instant::now();
    let y1 = common::spawn_logged_worker(&y_path, "short");
    let got = y1.wait_owning(PARTITIONS, Duration::from_secs(20));
    let took = got.map(|at| at.saturating_duration_since(started));
    eprintln!("deployment Y: its new worker owned all {PARTITIONS} partitions after {took:?}");
    assert!(took.is_some(), "deployment Y's worker owns {:?} of {PARTITIONS} partitions after 20 s", y1.owned());

    // And X's next worker, in X's own group, once the killed members' sessions lapsed.
    let x3 = common::spawn_logged_worker(&x_path, "short");
    let x3_got = x3.wait_owning(PARTITIONS, SESSION * 3).map(|_| x3.owned());
    eprintln!("deployment X: a new worker after the kill -9s owns {x3_got:?}");
    assert!(x3_got.is_some(), "X's new worker owns {:?} of {PARTITIONS} after {:?}", x3.owned(), SESSION * 3);
    drop((x3, y1));
}
