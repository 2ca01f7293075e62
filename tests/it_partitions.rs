//! Network partitions: a worker in a network namespace of its own is cut off from the
//! broker (or the store) while jobs run, then the link comes back (`fairway::netlab`).
//! Every job must finish, none lost, and the cut-off worker must serve again or exit:
//! never hold partitions it cannot serve. The lab (namespace, veth pairs, its own broker
//! and CQL bridge in front of the suite's database) is made by the test and removed after
//! it, also when it fails. Needs root and iproute2 (`scripts/test` installs `ip`).

use fairway::netlab::scenario::{self, Plan, Report};
use fairway::netlab::{Lab, LabSetup, Link};
use std::path::PathBuf;
use std::time::Duration;

/// The tansu binary `scripts/services` installed (or `FAIRWAY_TANSU`).
fn tansu() -> PathBuf {
    if let Some(p) = std::env::var_os("FAIRWAY_TANSU") {
        return p.into();
    }
    let dir = std::env::var_os("FAIRWAY_SERVICES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".services"));
    dir.join("bin/tansu")
}

fn setup(dir: &std::path::Path) -> LabSetup {
    let tansu = tansu();
    assert!(tansu.exists(), "no tansu at {} (run scripts/services up, or set FAIRWAY_TANSU)", tansu.display());
    LabSetup {
        tansu,
        fairway: env!("CARGO_BIN_EXE_fairway").into(),
        cassandra: format!("127.0.0.1:{}", std::env::var("FAIRWAY_CASSANDRA_PORT").unwrap_or_else(|_| "19142".into())),
        dir: dir.to_path_buf(),
    }
}

/// Prints the lab's logs (a failing test's evidence): the workers' in full (they log at
/// warn plus assignments), the servers' tails.
fn print_logs(dir: &std::path::Path) {
    for name in ["inside.before-restart", "inside", "host", "broker", "bridge"] {
        let Ok(text) = std::fs::read_to_string(dir.join(format!("{name}.log"))) else { continue };
        let lines: Vec<&str> = text.lines().collect();
        let keep = if name.starts_with("inside") || name == "host" { 400 } else { 30 };
        for l in &lines[lines.len().saturating_sub(keep)..] {
            eprintln!("{name}: {l}");
        }
    }
}

/// Runs `plan` in a fresh lab, bounded in time; the lab is removed on every path.
async fn run(plan: Plan, within: Duration) -> Report {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut lab = Lab::start(&setup(dir.path())).expect("start the partition lab (root and `ip` needed)");
    let report = tokio::time::timeout(within, scenario::run(&mut lab, &plan)).await;
    let report = match report {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            print_logs(dir.path());
            panic!("partition scenario failed: {e}");
        }
        Err(_) => {
            print_logs(dir.path());
            panic!("partition scenario took over {within:?}");
        }
    };
    println!("{}", serde_json::to_string(&report).unwrap());
    let fine = report.lost == 0 && report.all_done_s.is_some() && report.probes_finished == report.probes;
    if !fine {
        print_logs(dir.path());
    }
    drop(lab);
    report
}

/// The reported case: 30 s without the broker (above the 6 s session timeout, and the
/// 30 s message timeout of the producer) while 300 ms jobs run on both workers. Before
/// the fix the cut-off worker came back with a fenced producer, got its partitions back
/// and never finished their jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_the_broker_past_its_session_serves_again_or_exits() {
    let plan = Plan {
        jobs: 4_000,
        job_ms: 300,
        cut: vec![Link::Broker],
        cut_for: Duration::from_secs(32),
        cut_after: 0.1,
        session_timeout: Duration::from_secs(6),
        slots: 32,
        partitions: 6,
        keyspace: "fairway_it".into(),
        store_outage_limit: Duration::from_secs(180),
        timeout: Duration::from_secs(120),
        probes: 60,
    };
    let r = run(plan, Duration::from_secs(240)).await;
    assert_eq!(r.lost, 0, "every job has a result: {r:?}");
    assert!(r.all_done_s.is_some(), "every job finished: {r:?}");
    assert_eq!(r.probes_finished, r.probes, "no partition is held by a worker that cannot serve it: {r:?}");
    assert!(
        r.inside_results_after_restore + r.probes_by_inside as u64 > 0 || !r.inside_exits.is_empty(),
        "the cut-off worker served again or exited: {r:?}"
    );
}
