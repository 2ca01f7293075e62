//! Recurring schedules, unique jobs and debounce on the real broker and CQL database:
//! a cron every 2 s fires exactly one job per tick with three worker processes (each
//! with a promoter) and across a kill of the promoter's leader; missed fires are caught
//! up per policy after a stop; unique keys and debounce windows hold across two API
//! processes.

mod common;

use fairway::config::{AuthMode, Config};
use fairway::core::recurring::{fire_job_id, CatchUp, ScheduleSpec};
use fairway::handlers::Registry;
use fairway::model::{JobResult, JobSubmitted, Millis, Pool};
use fairway::schedules::Schedules;
use fairway::store::Store;
use fairway::worker::{Policy, Worker};
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

async fn schedules(cfg: &Arc<Config>) -> (Store, Schedules) {
    let store = Store::open(cfg).await.expect("store");
    let s = Schedules::connect(cfg.clone(), &store).await.expect("schedules");
    (store, s)
}

fn spec(name: &str) -> ScheduleSpec {
    ScheduleSpec { name: name.into(), tenant: "acme".into(), job_type: "echo".into(), ..Default::default() }
}

/// First-attempt records on the short pool topic, by job id (read until `done`).
async fn pool_records(
    cfg: &Config,
    timeout: Duration,
    done: impl FnMut(&[JobSubmitted]) -> bool,
) -> HashMap<String, usize> {
    let recs = common::read_until(
        cfg,
        &cfg.pool_topic(Pool::Short),
        timeout,
        |b, _, _| fairway::codec::decode_job(b).ok().filter(|j| j.attempt == 0 && j.crash_count == 0),
        done,
    )
    .await;
    let mut out = HashMap::new();
    for r in recs {
        *out.entry(r.job_id).or_insert(0) += 1;
    }
    out
}

/// The pid in the holder of the deployment's promoter lease (worker ids are host-pid-rand).
async fn promoter_pid(cfg: &Config, store: &Store) -> Option<u32> {
    let cql = format!("SELECT holder FROM {}.leases WHERE name = ?", cfg.scylla.keyspace);
    let name = format!("{}promoter", cfg.kafka.topic_prefix);
    let res = store.session().query_unpaged(cql, (name,)).await.ok()?;
    let rows = res.into_rows_result().ok()?;
    let (holder,) = rows.maybe_first_row::<(Option<String>,)>().ok()??;
    let holder = holder?;
    let parts: Vec<&str> = holder.rsplitn(3, '-').collect();
    parts.get(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cron_every_2s_fires_one_job_per_tick_across_three_workers_and_a_leader_kill() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let file = common::config_file(&cfg, "[job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n", dir.path());
    let mut fleet = common::spawn_fleet(&file, 3);
    let (store, sch) = schedules(&cfg).await;
    let added = sch
        .add(ScheduleSpec { cron: Some("*/2 * * * * *".into()), ..spec("tick") }, fairway::now_ms())
        .await
        .expect("add schedule");
    let first = added.next_fires[0];
    // Let it fire a few ticks, then kill the promoter's leader (SIGKILL: its lease lapses).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let pid = loop {
        match promoter_pid(&cfg, &store).await {
            Some(pid) => break pid,
            None if tokio::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            None => panic!("no worker holds the promoter lease"),
        }
    };
    let leader = fleet.iter_mut().position(|w| w.child.id() == pid).expect("the leader is one of the fleet");
    let mut killed = fleet.remove(leader);
    killed.signal("KILL", Duration::from_secs(10));
    let killed_at = fairway::now_ms();
    // Another worker takes the lease over and fires the ticks from the kill on; two more.
    let until = killed_at - killed_at.rem_euclid(2_000) + 8_000;
    let last = fire_job_id(&added.id, until);
    let seen = pool_records(&cfg, Duration::from_secs(45), |v| v.iter().any(|j| j.job_id == last)).await;
    assert!(seen.contains_key(&last), "the ticks after the leader's kill fired (lease taken over)");
    sch.remove("acme", "tick").await.expect("remove");
    let removed_at = fairway::now_ms();
    let seen = pool_records(&cfg, Duration::from_secs(5), |_| false).await;
    common::stop_fleet(&mut fleet);
    // Exactly one first-attempt record per tick up to `until`, and nothing but ticks.
    let ticks: BTreeMap<Millis, String> =
        (first..=removed_at).step_by(2_000).map(|at| (at, fire_job_id(&added.id, at))).collect();
    for (at, id) in ticks.range(..=until) {
        assert_eq!(seen.get(id), Some(&1), "tick at {at} ({} ms after the first) fired exactly once", at - first);
    }
    let ids: Vec<&String> = ticks.values().collect();
    assert!(seen.keys().all(|id| ids.contains(&id)), "every job on the topic is a tick: {seen:?}");
    let results = common::results_for(&cfg, &[ticks[&first].clone()], Duration::from_secs(30)).await;
    assert_eq!(results.len(), 1, "the first tick's job ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missed_fires_are_caught_up_per_policy_after_a_stop() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let (_store, sch) = schedules(&cfg).await;
    let now = fairway::now_ms();
    // Every 20 s on a grid; the cursors are put back 200 s, as if no promoter ran since.
    let grid = now - now.rem_euclid(20_000) - 1_000_000;
    let back = now - now.rem_euclid(20_000) - 200_000;
    let mut ids = HashMap::new();
    for (name, catch_up) in [("none", CatchUp::None), ("one", CatchUp::One), ("all", CatchUp::All)] {
        let s = ScheduleSpec { every: Some("20s".into()), start_at: Some(grid), catch_up, ..spec(name) };
        let added = sch.add(s, now).await.expect("add");
        assert!(sch.statements().advance("acme", name, added.next_fires[0], Some(back)).await.unwrap());
        ids.insert(name, added.id);
    }
    let started = fairway::now_ms();
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    // Fires older than a minute when any pass ran are missed; `all` submits each of them.
    let missed: Vec<Millis> = (back..started - 60_000).step_by(20_000).collect();
    let all_missed: Vec<String> = missed.iter().map(|at| fire_job_id(&ids["all"], *at)).collect();
    let one = fire_job_id(&ids["one"], back);
    let seen = pool_records(&cfg, Duration::from_secs(40), |v| {
        all_missed.iter().all(|id| v.iter().any(|j| &j.job_id == id)) && v.iter().any(|j| j.job_id == one)
    })
    .await;
    w.stop().await;
    assert!(all_missed.iter().all(|id| seen.contains_key(id)), "all: every missed fire ran ({} of them)", missed.len());
    assert!(seen.contains_key(&one), "one: one job for the missed fires");
    for at in &missed[1..] {
        assert!(!seen.contains_key(&fire_job_id(&ids["one"], *at)), "one: no other missed fire ran");
    }
    for at in &missed {
        assert!(!seen.contains_key(&fire_job_id(&ids["none"], *at)), "none: no missed fire ran");
    }
    let on_time = (back..=fairway::now_ms()).step_by(20_000).filter(|at| *at >= started - 60_000);
    let none_on_time = on_time.map(|at| fire_job_id(&ids["none"], at)).filter(|id| seen.contains_key(id)).count();
    assert!(none_on_time >= 1, "none: the fires of the last minute ran");
    assert!(seen.values().all(|n| *n == 1), "one record per fire: {seen:?}");
}

/// Two API processes (each its own producer, store session and front door).
struct TwoApis {
    urls: [String; 2],
    http: reqwest::Client,
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl TwoApis {
    async fn start(cfg: &Arc<Config>) -> TwoApis {
        let (a, sa) = common::serve_api(cfg).await;
        let (b, sb) = common::serve_api(cfg).await;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
        TwoApis { urls: [a, b], http, _stops: vec![sa, sb] }
    }

    /// POSTs a job to API `i`: (status, body).
    async fn submit(&self, i: usize, body: &Value) -> (StatusCode, Value) {
        let r = self.http.post(format!("{}/v1/jobs", self.urls[i % 2])).json(body).send().await.expect("POST");
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }
}

fn id(v: &Value) -> String {
    v["job_id"].as_str().unwrap_or_else(|| panic!("no job_id in {v}")).to_string()
}

async fn result(cfg: &Config, id: &str) -> Vec<JobResult> {
    common::results_for(cfg, &[id.to_string()], Duration::from_secs(40)).await.remove(id).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unique_keys_and_debounce_hold_across_two_api_processes() {
    let mut cfg = common::config("");
    cfg.api.auth = AuthMode::Off;
    let cfg = Arc::new(cfg);
    common::init(&cfg).await;
    let apis = TwoApis::start(&cfg).await;
    // Unique, queued or running: while the first job waits, both APIs answer with it (200).
    // Keys of this run (idempotency and unique keys are per tenant, and tests share the keyspace).
    let run = uuid::Uuid::new_v4().simple().to_string();
    let unique =
        json!({"tenant": "acme", "job_type": "echo", "payload": {"u": 1}, "unique_key": format!("report-{run}")});
    let (s, first) = apis.submit(0, &unique).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    let answers = futures::future::join_all((0..8).map(|i| apis.submit(i, &unique))).await;
    for (s, v) in &answers {
        assert_eq!((*s, id(v)), (StatusCode::OK, id(&first)), "{v}");
    }
    // Window scope: holds even after its job finished.
    let windowed = json!({"tenant": "acme", "job_type": "echo", "unique_key": format!("w-{run}"), "unique_scope": "window", "unique_window": "1h"});
    let (s, w1) = apis.submit(1, &windowed).await;
    assert_eq!(s, StatusCode::CREATED, "{w1}");
    // Debounce: five submissions over both APIs within the delay fold into one job, run
    // with the last payload, about 2 s after the last one.
    let debounced = |n: i32| json!({"tenant": "acme", "job_type": "echo", "payload": {"n": n}, "debounce_key": "d", "debounce_delay": "2s"});
    let (s, d1) = apis.submit(0, &debounced(0)).await;
    assert_eq!(s, StatusCode::CREATED, "{d1}");
    for n in 1..5 {
        let (s, v) = apis.submit(n as usize, &debounced(n)).await;
        assert_eq!((s, id(&v)), (StatusCode::OK, id(&d1)), "{v}");
    }
    let last_at = fairway::now_ms();
    let keep = |n: i32| json!({"tenant": "acme", "job_type": "echo", "payload": {"k": n}, "debounce_key": "k", "debounce_delay": "1s", "debounce_mode": "keep_first"});
    let (_, k1) = apis.submit(1, &keep(0)).await;
    let (s, k2) = apis.submit(0, &keep(1)).await;
    assert_eq!((s, id(&k2)), (StatusCode::OK, id(&k1)));
    // A worker runs them.
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let unique_run = result(&cfg, &id(&first)).await;
    let debounce_run = result(&cfg, &id(&d1)).await;
    let keep_run = result(&cfg, &id(&k1)).await;
    assert_eq!(unique_run.len(), 1, "the unique job ran once");
    assert_eq!(debounce_run.len(), 1, "one debounced job ran");
    assert_eq!(debounce_run[0].output.as_deref(), Some(br#"{"n":4}"#.as_slice()), "with the last payload");
    let started = debounce_run[0].started_at.unwrap_or(0);
    assert!(started >= last_at + 1_500, "ran {} ms after the last submission, not 2 s", started - last_at);
    assert_eq!(keep_run[0].output.as_deref(), Some(br#"{"k":0}"#.as_slice()), "keep_first: the first payload");
    // Finished: the queued-or-running key is free again, the window key is not.
    // (The job's row says succeeded a moment after its result: ask until it does.)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let again = loop {
        let (s, v) = apis.submit(1, &unique).await;
        if s == StatusCode::CREATED || tokio::time::Instant::now() > deadline {
            break v;
        }
        assert_eq!((s, id(&v)), (StatusCode::OK, id(&first)));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_ne!(id(&again), id(&first), "a new job once the first finished: {again}");
    let (s, w2) = apis.submit(0, &windowed).await;
    assert_eq!((s, id(&w2)), (StatusCode::OK, id(&w1)), "the window still holds");
    // Bad input names the field.
    let (s, bad) = apis.submit(0, &json!({"tenant": "acme", "job_type": "echo", "debounce_key": "x"})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(bad["error"].as_str().unwrap().contains("debounce_delay"), "{bad}");
    w.stop().await;
}
