//! `handler = "process"` on the real broker and CQL database with real child processes:
//! limits kill a memory hog (class `resource`, one retry, then the DLQ) while another
//! tenant's jobs on the same worker succeed; a CPU spinner dies at its CPU limit and a
//! silent sleeper at `stuck_after`; the recycling cap holds one tenant while another
//! runs; the Python example resumes from its checkpoint after a hand-off and gets
//! SIGTERM on cancel; the Node example runs. The sandbox's attacks (a fork tree over the
//! memory limit, a `setsid` stray, a control line without end, a fork bomb, reading the
//! worker's environ or a sibling's /proc fds, kill(-1)) each end in their own job while
//! another tenant's jobs on the worker succeed. A process job's result, job view and
//! ledger line carry its tree's peak memory and CPU time. Fixtures:
//! tests/fixtures/process/, examples/.

use crate::common;

use fairway::handlers::Registry;
use fairway::model::{FailureClass, JobStatus, Pool};
use fairway::store::Store;
use fairway::submit::Submitter;
use fairway::worker::{Policy, Worker};
use std::sync::Arc;
use std::time::Duration;

const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");

/// The tests of this file one at a time: each checks that no attempt cgroup of this
/// process is left, which another test's attempts in flight would fail.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn start(cfg: &Arc<fairway::config::Config>, pools: &[Pool]) -> Worker {
    let registry = Registry::from_config(cfg, Default::default()).unwrap();
    Worker::start(cfg.clone(), pools, registry, Policy::Fair).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_memory_hog_is_dead_lettered_as_resource_after_one_retry_while_another_tenants_50_jobs_succeed() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let extra = format!(
        "[pools.short]\nslots = 8\nheartbeat_interval = \"1s\"\n{}{}",
        common::misbehave("hog", "short", "hog", "limits = { memory = \"64MiB\" }\ntimeout = \"30s\""),
        common::misbehave("quick", "short", "noop", "limits = { memory = \"64MiB\" }"),
    );
    let cfg = Arc::new(common::config(&extra));
    common::init(&cfg).await;
    let w = start(&cfg, &[Pool::Short]).await;
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let hog = sub.submit(&common::new_job("globex", "hog", serde_json::Value::Null)).await.unwrap().job_id;
    let mut ids = Vec::new();
    for i in 0..50 {
        ids.push(
            sub.submit(&common::new_job("hooli", "quick", serde_json::json!(format!("job {i}")))).await.unwrap().job_id,
        );
    }
    let results = common::results_for(&cfg, &ids, Duration::from_secs(50)).await;
    let dls = common::dead_letters(&cfg, 1, Duration::from_secs(30)).await;
    let stats = w.shared[0].stats.lock().unwrap().clone();
    w.stop().await;

    assert_eq!(results.len(), 50, "every job of the other tenant finished");
    for (id, rs) in &results {
        assert_eq!(rs[0].status, JobStatus::Succeeded, "{id}: {:?}", rs[0]);
    }
    let dl = dls.iter().find(|d| d.job.as_ref().is_some_and(|j| j.job_id == hog)).expect("the hog was dead-lettered");
    assert_eq!(dl.failure_class, FailureClass::Resource, "{dl:?}");
    assert_eq!(dl.attempts, 2, "one retry, then the DLQ: {dl:?}");
    let err = dl.last_error.clone().unwrap_or_default();
    assert!(err.contains("memory limit 64MiB exceeded (peak "), "the limit and the peak: {err}");
    assert!(dl.reason.starts_with("resource:"), "{}", dl.reason);
    let said = fairway::handlers::process::Enforcement::current().name();
    assert_eq!(stats["pool"]["process_enforcement"], said.as_str(), "stats say which enforcement is in force: {stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cpu_spinner_dies_at_its_cpu_limit_and_a_silent_sleeper_at_stuck_after() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let once = "retry = { resource = { max_attempts = 1 } }";
    let extra = format!(
        "[pools.medium]\nslots = 4\nheartbeat_interval = \"1s\"\n{}{}",
        common::misbehave(
            "spin",
            "medium",
            "spin",
            &format!("limits = {{ cpu_time = \"1s\" }}\ntimeout = \"55s\"\n{once}")
        ),
        common::misbehave(
            "nap",
            "medium",
            "sleeper",
            &format!("stuck_after = \"2s\"\nkill_grace = \"1s\"\ntimeout = \"55s\"\n{once}")
        ),
    );
    let cfg = Arc::new(common::config(&extra));
    common::init(&cfg).await;
    let w = start(&cfg, &[Pool::Medium]).await;
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let spin = sub.submit(&common::new_job("acme", "spin", serde_json::Value::Null)).await.unwrap().job_id;
    let nap = sub.submit(&common::new_job("acme", "nap", serde_json::Value::Null)).await.unwrap().job_id;
    let results = common::results_for(&cfg, &[spin.clone(), nap.clone()], Duration::from_secs(50)).await;
    let dls = common::dead_letters(&cfg, 2, Duration::from_secs(10)).await;
    w.stop().await;

    let of = |id: &str| dls.iter().find(|d| d.job.as_ref().is_some_and(|j| j.job_id == id)).cloned();
    let s = of(&spin).expect("the spinner was dead-lettered");
    assert_eq!(s.failure_class, FailureClass::Resource, "{s:?}");
    assert!(s.last_error.as_deref().unwrap_or("").contains("cpu_time limit 1s exceeded"), "{s:?}");
    let n = of(&nap).expect("the sleeper was dead-lettered");
    assert_eq!(n.failure_class, FailureClass::Resource, "{n:?}");
    assert!(n.reason.starts_with("stuck: no progress, checkpoint or heartbeat for"), "{}", n.reason);
    assert_eq!(n.attempts, 1, "a stuck job is not retried");
    for id in [&spin, &nap] {
        assert_eq!(results[id][0].status, JobStatus::Failed, "{:?}", results[id]);
    }
}

/// CPU bandwidth per attempt: a spinner given a fifth of a core reaches its 1 s of CPU
/// time only after about 5 s (throttled, never killed for it); unbounded, about 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spinner_given_a_fifth_of_a_core_is_throttled_to_it() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let said = fairway::handlers::process::Enforcement::current().describe();
    assert!(said.contains("throttled by its cpu controller"), "this machine kind has a cpu controller: {said}");
    let once = "retry = { resource = { max_attempts = 1 } }";
    let limits = "limits = { cpu_time = \"1s\", cpus = 0.2 }";
    let extra = format!(
        "[pools.medium]\nslots = 2\nheartbeat_interval = \"1s\"\n{}",
        common::misbehave("slowspin", "medium", "spin", &format!("{limits}\ntimeout = \"55s\"\n{once}")),
    );
    let cfg = Arc::new(common::config(&extra));
    common::init(&cfg).await;
    let w = start(&cfg, &[Pool::Medium]).await;
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let spin = sub.submit(&common::new_job("acme", "slowspin", serde_json::Value::Null)).await.unwrap().job_id;
    let results = common::results_for(&cfg, std::slice::from_ref(&spin), Duration::from_secs(50)).await;
    w.stop().await;
    let r = &results[&spin][0];
    assert_eq!(r.status, JobStatus::Failed, "{r:?}");
    assert!(r.error.as_deref().unwrap_or("").contains("cpu_time limit 1s exceeded"), "{r:?}");
    let ran = r.finished_at - r.started_at.expect("it started");
    println!("a spinner at 0.2 cores used its 1 s of CPU in {ran} ms");
    assert!(ran >= 4_000, "1 s of CPU at 0.2 cores takes about 5 s, took {ran} ms: not throttled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_the_recycling_cap_a_tenants_jobs_wait_while_another_tenants_run() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let extra = format!(
        "[pools.short]\nslots = 2\nfast_lanes = 0\nheartbeat_interval = \"1s\"\nrecycling = {{ max = 2, window = \"2m\" }}\n{}{}",
        common::misbehave("boom", "short", "crash", "retry = { app_error = { max_attempts = 1 } }"),
        common::misbehave("quick", "short", "noop", ""),
    );
    let cfg = Arc::new(common::config(&extra));
    common::init(&cfg).await;
    let w = start(&cfg, &[Pool::Short]).await;
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let mut crashing = Vec::new();
    for _ in 0..6 {
        crashing.push(sub.submit(&common::new_job("initech", "boom", serde_json::Value::Null)).await.unwrap().job_id);
    }
    // Held once two of its children died.
    let sh = w.shared[0].clone();
    let held = common::wait_for(Duration::from_secs(30), async || {
        let stats = sh.stats.lock().unwrap().clone();
        let t = stats["tenants"].as_array()?.iter().find(|t| t["tenant"] == "initech")?.clone();
        (t["wait_reason"]["reason"] == "recycling_cap").then_some(t)
    })
    .await
    .expect("the tenant reached the recycling cap");
    assert!(held["backlog"]["total"].as_u64().unwrap() > 0, "its jobs wait: {held}");
    let held_at = fairway::now_ms();
    let mut quick = Vec::new();
    for i in 0..20 {
        quick.push(
            sub.submit(&common::new_job("piedpiper", "quick", serde_json::json!(format!("q{i}"))))
                .await
                .unwrap()
                .job_id,
        );
    }
    let q = common::results_for(&cfg, &quick, Duration::from_secs(50)).await;
    // Its first two results (a new reader takes seconds to join): the held ones have none.
    let c: Vec<fairway::model::JobResult> = common::read_until(
        &cfg,
        &cfg.results_topic(),
        Duration::from_secs(30),
        |b, _, _| fairway::codec::decode_result(b).ok().filter(|r| crashing.contains(&r.job_id)),
        |v| v.len() >= 2,
    )
    .await;
    let stats = sh.stats.lock().unwrap().clone();
    w.stop().await;

    assert_eq!(q.len(), 20, "the other tenant's jobs all ran");
    let mut waits: Vec<i64> = q.values().map(|r| r[0].finished_at - r[0].submitted_at).collect();
    waits.sort();
    let p99 = waits[(waits.len() * 99 / 100).min(waits.len() - 1)];
    println!("piedpiper's p99 submit-to-finish while initech was held: {p99} ms");
    assert!(c.len() >= 2, "the children that reached the cap: {c:?}");
    for r in &c {
        assert_eq!(r.status, JobStatus::Failed);
        assert!(r.error.as_deref().unwrap_or("").contains("ended by signal 9"), "{r:?}");
    }
    let t = stats["tenants"].as_array().unwrap().iter().find(|t| t["tenant"] == "initech").unwrap();
    assert_eq!(t["wait_reason"]["reason"], "recycling_cap", "still held: {t}");
    // Held at its second kill; at most the one job already running in the other slot
    // started after the first kill.
    assert!(t["dispatched"].as_u64().unwrap() <= 3, "{t}");
    assert_eq!(
        t["backlog"]["total"].as_u64().unwrap() + t["dispatched"].as_u64().unwrap(),
        6,
        "its other jobs wait: {t}"
    );
    assert!(held_at > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_example_resumes_from_its_checkpoint_after_a_sigterm_hand_off_and_cancel_reaches_it_as_sigterm() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let extra = format!(
        "[pools.long]\nslots = 4\nheartbeat_interval = \"1s\"\ndrain_timeout = \"0s\"\n\
         [job_types.steps]\npool = \"long\"\nhandler = \"process\"\ncommand = [\"{}\", \"{MANIFEST}/examples/python/steps.py\"]\n\
         kill_grace = \"5s\"\ntimeout = \"2min\"\nstderr_in_error = true\n\
         [job_types.words]\npool = \"long\"\nhandler = \"process\"\ncommand = [\"node\", \"{MANIFEST}/examples/node/wordcount.js\"]\nenv = [\"PATH\"]\n",
        common::python()
    );
    let mut cfg = common::config(&extra);
    cfg.worker.cancel_grace = Duration::from_secs(5);
    let cfg = Arc::new(cfg);
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let a = start(&cfg, &[Pool::Long]).await;
    let long = sub
        .submit(&common::new_job("acme", "steps", serde_json::json!({"steps": 40, "step_ms": 200})))
        .await
        .unwrap()
        .job_id;
    let cancelled = sub
        .submit(&common::new_job("acme", "steps", serde_json::json!({"steps": 400, "step_ms": 200})))
        .await
        .unwrap()
        .job_id;
    let words = sub
        .submit(&common::new_job("acme", "words", serde_json::json!("one two three\nfour five")))
        .await
        .unwrap()
        .job_id;
    let empty = sub.submit(&common::new_job("acme", "words", serde_json::json!(""))).await.unwrap().job_id;
    let step = common::wait_for(Duration::from_secs(40), async || {
        let cp = store.checkpoint(&long, 0).await.ok().flatten()?;
        let step: u32 = String::from_utf8(cp).ok()?.parse().ok()?;
        (step >= 5).then_some(step)
    })
    .await
    .expect("the Python job checkpointed");
    common::wait_for(Duration::from_secs(20), async || {
        let r = store.job(&cancelled).await.ok().flatten()?;
        (r.status.as_deref() == Some("running")).then_some(())
    })
    .await
    .expect("the second job runs");
    store.request_cancel(&cancelled, fairway::now_ms()).await.unwrap();
    let c = common::results_for(&cfg, std::slice::from_ref(&cancelled), Duration::from_secs(20)).await;
    // The worker drains: the Python child gets SIGTERM, checkpoints, exits; hand-off.
    a.stop().await;
    let b = start(&cfg, &[Pool::Long]).await;
    let ids = [long.clone(), words.clone(), empty.clone()];
    let results = common::results_for(&cfg, &ids, Duration::from_secs(50)).await;
    b.stop().await;

    let r = &c.get(&cancelled).expect("the cancelled job's result")[0];
    assert_eq!(r.status, JobStatus::Cancelled, "{r:?}");
    let err = r.error.as_deref().unwrap_or("");
    assert!(err.contains("SIGTERM") && err.contains("stopped before step"), "the child saw SIGTERM: {err}");
    let r = &results.get(&long).expect("the handed-off job finished")[0];
    assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
    let out: serde_json::Value = serde_json::from_slice(r.output.as_deref().unwrap()).unwrap();
    let resumed = out["resumed_at"].as_u64().unwrap() as u32;
    assert!(resumed >= step && resumed < 40, "resumed from its checkpoint ({step}): {out}");
    assert_eq!(r.attempts, 1, "the hand-off used no attempt");
    let r = &results.get(&words).expect("the Node job finished")[0];
    let out: serde_json::Value = serde_json::from_slice(r.output.as_deref().unwrap()).unwrap();
    assert_eq!((out["words"].as_u64(), out["job_id"].as_str()), (Some(5), Some(words.as_str())), "{out}");
    let r = &results.get(&empty).expect("the empty Node job ended")[0];
    assert_eq!((r.status, r.failure_class), (JobStatus::Failed, Some(FailureClass::Permanent)), "exit 65: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_process_jobs_result_job_view_and_ledger_carry_its_trees_peak_memory_and_cpu() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let extra = format!(
        "[pools.short]\nslots = 2\nheartbeat_interval = \"1s\"\n{}\
         [job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n",
        common::misbehave("use", "short", "use", "limits = { memory = \"256MiB\" }\ntimeout = \"40s\""),
    );
    let cfg = Arc::new(common::config(&extra));
    common::init(&cfg).await;
    let store = Store::open(&cfg).await.unwrap();
    let (stop_ledger, stopped) = tokio::sync::watch::channel(false);
    let ledger = tokio::spawn(fairway::ledger::run(cfg.clone(), store.clone(), stopped));
    let w = start(&cfg, &[Pool::Short]).await;
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let from = fairway::now_ms() - 3_600_000;
    // The ledger's rows are this run's own: their scope is the run's topic prefix.
    let tenant = "acme".to_string();
    let used = sub.submit(&common::new_job(&tenant, "use", serde_json::Value::Null)).await.unwrap().job_id;
    let plain = sub.submit(&common::new_job(&tenant, "echo", serde_json::json!("x"))).await.unwrap().job_id;
    let results = common::results_for(&cfg, &[used.clone(), plain.clone()], Duration::from_secs(50)).await;
    w.stop().await;

    let r = &results.get(&used).expect("the process job finished")[0];
    assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
    let (peak, cpu) = (r.peak_memory_bytes.expect("peak memory on the result"), r.cpu_ms.expect("cpu on the result"));
    println!("the process job's result: peak memory {peak} bytes, cpu {cpu} ms");
    // The child's 96 MiB and 1.5 s of CPU, plus the interpreters' own (tens of MiB and ms).
    assert!((96 << 20..200 << 20).contains(&peak), "the tree's peak memory: {peak} bytes");
    assert!((1_450..5_000).contains(&cpu), "the tree's CPU time: {cpu} ms");
    let e = &results.get(&plain).expect("the echo job finished")[0];
    assert_eq!((e.peak_memory_bytes, e.cpu_ms), (None, None), "not a process job: {e:?}");

    let row = store.job(&used).await.unwrap().expect("the job's state");
    let view = fairway::api::status_json(&row, None, fairway::now_ms());
    assert_eq!((view["peak_memory_bytes"].as_i64(), view["cpu_ms"].as_i64()), (Some(peak), Some(cpu)), "{view}");

    let stmts = store.ledger_statements().await.unwrap();
    let q = fairway::ledger::ReportQuery {
        tenant: tenant.clone(),
        period: fairway::core::ledger::report_period(from, fairway::now_ms() + 3_600_000).unwrap(),
        granularity: fairway::core::ledger::Granularity::Hour,
    };
    let charged = common::wait_for(Duration::from_secs(60), async || {
        let lines =
            fairway::ledger::report(&stmts, &q, &mut fairway::core::ledger::RowBudget::new(u64::MAX)).await.ok()?;
        let l = lines.iter().find(|l| l.job_type == "use")?;
        (l.usage.results == 1).then_some(l.usage)
    })
    .await
    .expect("the ledger charged the process job");
    let _ = stop_ledger.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), ledger).await;
    assert_eq!((charged.cpu_ms, charged.peak_memory_bytes), (cpu, peak), "the ledger's charge: {charged:?}");
}

/// Runs `attacks` (job type name, misbehave mode, extra settings) of tenant "globex"
/// beside 20 quick jobs of tenant "hooli" on one worker; the attacks' results, and
/// asserts the quick jobs all succeeded and no attempt cgroup is left.
async fn beside_quick_jobs(
    attacks: &[(&str, &str, &str)],
) -> std::collections::HashMap<String, fairway::model::JobResult> {
    let mut extra = "[pools.short]\nslots = 8\nheartbeat_interval = \"1s\"\n".to_string();
    for (name, mode, more) in attacks {
        let once = "retry = { resource = { max_attempts = 1 }, app_error = { max_attempts = 1 } }\ntimeout = \"40s\"";
        extra += &common::misbehave(name, "short", mode, &format!("{more}\n{once}"));
    }
    extra += &common::misbehave("quick", "short", "noop", "limits = { memory = \"64MiB\" }");
    extra += &common::misbehave("victim", "short", "victim", "");
    let cfg = Arc::new(common::config(&extra));
    common::init(&cfg).await;
    let w = start(&cfg, &[Pool::Short]).await;
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    let mut ids = Vec::new();
    for (name, _, _) in attacks {
        ids.push((
            name.to_string(),
            sub.submit(&common::new_job("globex", name, serde_json::Value::Null)).await.unwrap().job_id,
        ));
    }
    let victim = sub.submit(&common::new_job("hooli", "victim", serde_json::json!("still here"))).await.unwrap().job_id;
    let mut quick = vec![victim.clone()];
    for i in 0..20 {
        quick.push(
            sub.submit(&common::new_job("hooli", "quick", serde_json::json!(format!("job {i}")))).await.unwrap().job_id,
        );
    }
    let attack_ids: Vec<String> = ids.iter().map(|(_, id)| id.clone()).collect();
    let all: Vec<String> = attack_ids.iter().chain(&quick).cloned().collect();
    let results = common::results_for(&cfg, &all, Duration::from_secs(60)).await;
    w.stop().await;
    for id in &quick {
        let r = &results.get(id).unwrap_or_else(|| panic!("another tenant's job {id} finished"))[0];
        assert_eq!(r.status, JobStatus::Succeeded, "another tenant's job beside the attacks: {r:?}");
    }
    assert_eq!(results[&victim][0].output.as_deref(), Some(&b"still here"[..]), "the victim's own output");
    assert_eq!(leftover_cgroups(), Vec::<String>::new(), "no attempt cgroup is left");
    ids.into_iter().map(|(name, id)| (name, results[&id][0].clone())).collect()
}

/// This process's attempt cgroups still present (v1 memory hierarchy or v2).
fn leftover_cgroups() -> Vec<String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut dirs = Vec::new();
    for l in own.lines() {
        let mut f = l.splitn(3, ':');
        let (_, list, rel) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let mount = match list {
            "memory" => "/sys/fs/cgroup/memory",
            "pids" => "/sys/fs/cgroup/pids",
            "" => "/sys/fs/cgroup",
            _ => continue,
        };
        dirs.push(std::path::Path::new(mount).join(rel.trim_start_matches('/')));
    }
    let prefix = format!("fairway-{}-", std::process::id());
    dirs.iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

fn error(r: &fairway::model::JobResult) -> String {
    r.error.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tree_limits_end_a_fork_tree_a_fork_bomb_and_an_endless_control_line_as_resource() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let r = beside_quick_jobs(&[
        ("forktree", "forktree", "limits = { memory = \"96MiB\" }"),
        ("forkbomb", "forkbomb", "limits = { processes = 32 }"),
        ("endless", "endless_control", ""),
    ])
    .await;
    let f = &r["forktree"];
    assert_eq!((f.status, f.failure_class), (JobStatus::Failed, Some(FailureClass::Resource)), "{f:?}");
    assert!(error(f).contains("memory limit 96MiB exceeded"), "the tree's memory, not the leader's: {f:?}");
    let b = &r["forkbomb"];
    assert_eq!((b.status, b.failure_class), (JobStatus::Failed, Some(FailureClass::Resource)), "{b:?}");
    assert!(error(b).contains("processes limit 32 reached"), "{b:?}");
    let e = &r["endless"];
    assert_eq!((e.status, e.failure_class), (JobStatus::Failed, Some(FailureClass::Resource)), "{e:?}");
    assert!(error(e).contains("control line longer than 64KiB"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_setsid_grandchild_does_not_outlive_its_job() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let r = beside_quick_jobs(&[("stray", "stray", "")]).await;
    let s = &r["stray"];
    assert_eq!(s.status, JobStatus::Succeeded, "{s:?}");
    let pid: i32 =
        String::from_utf8_lossy(s.output.as_deref().unwrap_or_default()).trim().parse().expect("the stray's pid");
    let alive =
        |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with("sleep\x00300"));
    // In a pid namespace the printed pid is the namespace's: look for the stray in this
    // process's attempt cgroups as well.
    let ours = format!("/fairway-{}-", std::process::id());
    let strays = || {
        let pids = std::fs::read_dir("/proc").into_iter().flatten().flatten();
        pids.filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|p| alive(*p))
            .filter(|p| std::fs::read_to_string(format!("/proc/{p}/cgroup")).is_ok_and(|c| c.contains(&ours)))
            .collect::<Vec<i32>>()
    };
    let gone =
        common::wait_for(Duration::from_secs(5), async || (!alive(pid) && strays().is_empty()).then_some(())).await;
    if gone.is_none() {
        for p in strays().into_iter().chain([pid].into_iter().filter(|p| alive(*p))) {
            // SAFETY: kill(2) of a stray this test's job started, so the test leaves nothing behind.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
    assert!(gone.is_some(), "the job's setsid grandchild ({pid} as it saw itself) is gone after its attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_child_cannot_read_the_worker_or_a_sibling_reach_the_broker_or_signal_others() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let r = beside_quick_jobs(&[
        ("read_worker", "read_worker", ""),
        ("read_sibling", "read_sibling", ""),
        ("kill_all", "kill_all", ""),
        ("connect", &format!("connect:{}", common::brokers()), ""),
        ("list_proc", "list_proc", ""),
    ])
    .await;
    let out = |name: &str| String::from_utf8_lossy(r[name].output.as_deref().unwrap_or_default()).into_owned();
    assert_eq!(r["read_worker"].status, JobStatus::Succeeded, "{:?}", r["read_worker"]);
    assert!(out("read_worker").starts_with("refused /proc/"), "the worker's environ: {}", out("read_worker"));
    assert_eq!(r["read_sibling"].status, JobStatus::Succeeded, "{:?}", r["read_sibling"]);
    let lines: Vec<String> = out("read_sibling").lines().map(String::from).collect();
    let hidden = lines == ["no victim found"];
    assert!(
        hidden || (lines.len() == 2 && lines.iter().all(|l| l.starts_with("refused /proc/"))),
        "another tenant's child's fd 3 and environ: {lines:?}"
    );
    // With a mount namespace per attempt, /proc lists only the child's own uid's processes.
    let mountns = fairway::handlers::process::Enforcement::current().mountns.is_ok();
    assert_eq!(r["list_proc"].status, JobStatus::Succeeded, "{:?}", r["list_proc"]);
    if mountns {
        assert_eq!(out("list_proc"), "sees no other job\n", "a sibling job's pid in this child's /proc");
        assert!(hidden, "{lines:?}");
    }
    // kill(-1) signals every process the caller may signal but itself: with a uid of its
    // own that is nothing (the victim and the quick jobs succeeded, checked above).
    assert_eq!(r["kill_all"].status, JobStatus::Succeeded, "{:?}", r["kill_all"]);
    assert_eq!(out("kill_all"), "alive after kill(-1)\n", "not run as root");
    assert!(out("connect").starts_with("refused "), "no network without network = true: {}", out("connect"));
}

/// A pooled job type (mode = "pooled") running tests/fixtures/process/pooled.py.
fn pooled(name: &str, more: &str) -> String {
    format!(
        "[job_types.{name}]\npool = \"short\"\nhandler = \"process\"\nmode = \"pooled\"\n\
         command = [\"{}\", \"{MANIFEST}/tests/fixtures/process/pooled.py\"]\nenv = [\"PATH\"]\n{more}\n",
        common::python()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pooled_jobs_share_one_child_a_violation_ends_only_its_job_and_tenants_never_share_one() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let more = "limits = { memory = \"64MiB\" }\nretry = { resource = { max_attempts = 1 } }\n\
                pooled = { jobs_per_child = 100, idle = \"1s\" }";
    let extra = format!("[pools.short]\nslots = 4\nheartbeat_interval = \"1s\"\n{}", pooled("pooled", more));
    let cfg = Arc::new(common::config(&extra));
    common::init(&cfg).await;
    let w = start(&cfg, &[Pool::Short]).await;
    let sub = Submitter::new(cfg.clone(), None).unwrap();
    // One job at a time, each waited for: the order is the test's.
    let run = async |tenant: &str, what: &str| {
        let id = sub.submit(&common::new_job(tenant, "pooled", serde_json::json!(what))).await.unwrap().job_id;
        let r = common::results_for(&cfg, std::slice::from_ref(&id), Duration::from_secs(30)).await;
        r.get(&id).unwrap_or_else(|| panic!("{what} of {tenant} finished"))[0].clone()
    };
    let out =
        |r: &fairway::model::JobResult| String::from_utf8_lossy(r.output.as_deref().unwrap_or_default()).into_owned();
    let mut pids = Vec::new();
    for _ in 0..3 {
        let r = run("acme", "pid").await;
        assert_eq!(r.status, JobStatus::Succeeded, "{r:?}");
        pids.push(out(&r));
    }
    assert!(pids.iter().all(|p| *p == pids[0]), "three jobs in sequence on one child: {pids:?}");
    let hog = run("acme", "hog").await;
    assert_eq!((hog.status, hog.failure_class), (JobStatus::Failed, Some(FailureClass::Resource)), "{hog:?}");
    assert!(error(&hog).contains("memory limit 64MiB exceeded"), "{hog:?}");
    let after = run("acme", "leave s3cret").await;
    assert_eq!(after.status, JobStatus::Succeeded, "the job after the violation: {after:?}");
    assert_ne!(out(&after), pids[0], "a fresh child after the kill");
    let same: serde_json::Value = serde_json::from_str(&out(&run("acme", "look").await)).unwrap();
    assert_eq!(same["kept"], "s3cret", "the tenant's next job runs in its child: {same}");
    let other: serde_json::Value = serde_json::from_str(&out(&run("globex", "look").await)).unwrap();
    assert_ne!(other["pid"].to_string(), out(&after), "another tenant's job gets a child of its own: {other}");
    assert_eq!((&other["env"], &other["kept"]), (&serde_json::Value::Null, &serde_json::Value::Null), "{other}");
    assert!(!other["tmp"].as_array().unwrap().iter().any(|f| f == "left-behind"), "{other}");
    w.stop().await;
    let gone = common::wait_for(Duration::from_secs(10), async || leftover_cgroups().is_empty().then_some(())).await;
    assert!(gone.is_some(), "idle pooled children end with their cgroups: {:?}", leftover_cgroups());
}
