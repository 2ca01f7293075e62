//! The fault suite, small and bounded, on the real broker and CQL database: `fairway bench
//! faults` runs 3 worker processes, 1,500 short jobs, 2 `kill -9`s of a random worker
//! (restarted at once), a poison job and a malformed message, and prints JSON; this test
//! asserts on it: nothing lost, every job terminal (succeeded), both bad messages
//! dead-lettered, and few duplicate results per kill (see the bound's comment).
//!
//! The CQL-restart variant stops and starts the shared local Cassandra, which would break
//! tests running beside it: it is ignored, run it alone with
//! `cargo test --test it_faults -- --ignored`.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `fairway bench faults` with `args`, killing it if it runs past `limit`; returns
/// the JSON report (its last stdout line).
fn bench_faults(args: &[&str], limit: Duration) -> serde_json::Value {
    let services = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/services");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fairway"))
        .args(["bench", "faults", "--services", services])
        .args(args)
        .stdout(Stdio::piped())
        // Its own process group, the worker processes it starts included: a timeout
        // kills them all by the group id (the bench's pid).
        .process_group(0)
        .spawn()
        .expect("start fairway bench faults");
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the bench") {
            break s;
        }
        if started.elapsed() > limit {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            panic!("fairway bench faults ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    eprintln!("bench faults ({status}, {:.1} s): {out}", started.elapsed().as_secs_f64());
    let last = out.lines().last().unwrap_or_else(|| panic!("no output from the bench ({status})"));
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {last}"))
}

fn assert_no_loss(r: &serde_json::Value, jobs: u64) {
    assert_eq!(r["lost"], 0, "lost jobs: {r}");
    assert_eq!(r["terminal"], jobs, "every job has a terminal result: {r}");
    assert_eq!(r["statuses"]["succeeded"], jobs, "every job succeeded: {r}");
    assert_eq!(r["poison_dead_lettered"], true, "the poison job is in the DLQ: {r}");
    assert_eq!(r["malformed_dead_lettered"], true, "the malformed message is in the DLQ: {r}");
    assert_eq!(r["unexpected_worker_exits"], 0, "no worker exited on its own: {r}");
    assert!(r["executions"].as_u64().unwrap() >= jobs, "every job ran: {r}");
}

const SMALL: &[&str] = &[
    "--workers",
    "3",
    "--jobs",
    "1500",
    "--job-ms",
    "100",
    "--kills",
    "2",
    "--slots",
    "16",
    "--session-timeout",
    "6s",
    "--settle",
    "5s",
];

#[test]
fn kill_9_of_workers_loses_nothing_and_publishes_each_result_about_once() {
    let mut args = SMALL.to_vec();
    args.extend(["--timeout", "90s"]);
    let r = bench_faults(&args, Duration::from_secs(150));
    assert_no_loss(&r, 1500);
    assert_eq!(r["kills_done"], 2, "{r}");
    // The one window left (a kill between a result's ack and its state write, a few ms
    // of queue and write latency) yields 0-5 duplicates per kill in most runs and ~10 in
    // an unlucky one on a loaded 2-core box; before results were published once, every
    // job finished since the last offset commit came back (hundreds per kill). The bound
    // leaves room for the unlucky run while still failing on that old behaviour.
    let per_kill = r["duplicates_per_kill"].as_f64().unwrap();
    assert!(per_kill <= 20.0, "at most 20 duplicate results per kill on average, got {per_kill}: {r}");
}

#[test]
#[ignore = "restarts the shared local Cassandra: run alone (cargo test --test it_faults -- --ignored)"]
fn a_cql_restart_mid_run_loses_nothing() {
    let mut args = SMALL.to_vec();
    args.extend(["--cql-restart", "--timeout", "240s"]);
    let r = bench_faults(&args, Duration::from_secs(330));
    assert!(r["cql_restart_s"].is_number(), "the CQL database restarted: {r}");
    assert_no_loss(&r, 1500);
}
