//! Recurring schedules, unique jobs and debounce on the real broker and CQL database:
//! a cron every 2 s fires exactly one job per tick with three worker processes (each
//! with a promoter) and across a kill of the promoter's leader; missed fires are caught
//! up per policy after a stop; unique keys and debounce windows hold across two API
//! processes; the schedules HTTP API and console page are scoped to the key's tenant,
//! check their input and cap each tenant; the leader's fire metrics.

use crate::common;

use fairway::config::Config;
use fairway::core::auth::Caller;
use fairway::core::recurring::{fire_job_id, CatchUp, ScheduleSpec};
use fairway::handlers::Registry;
use fairway::model::{JobResult, JobSubmitted, Millis, Pool};
use fairway::ops::schedules::Schedules;
use fairway::store::{ScheduleCursor, Store};
use fairway::worker::{Policy, Worker};
use reqwest::{Method, StatusCode};
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
    let recs = common::read_until(cfg, &cfg.pool_topic(Pool::Short), timeout, |b, _, _| first_attempt(b), done).await;
    count_by_id(recs)
}

/// A pool record's job, if it is a first attempt (not a retry, not a crash's copy).
fn first_attempt(b: &[u8]) -> Option<JobSubmitted> {
    fairway::codec::decode_job(b).ok().filter(|j| j.attempt == 0 && j.crash_count == 0)
}

/// How many records each job id has.
fn count_by_id(recs: Vec<JobSubmitted>) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    for r in recs {
        *out.entry(r.job_id).or_insert(0) += 1;
    }
    out
}

/// Every first-attempt record on the short pool topic up to its end as it is when called,
/// by job id: read until each partition's high watermark of that moment is reached, not
/// for a fixed time (a reader that joins its group slowly, on a busy machine, would see
/// only the oldest records).
async fn pool_records_to_end(cfg: &Config) -> HashMap<String, usize> {
    let topic = cfg.pool_topic(Pool::Short);
    let marks = {
        let (cfg, topic) = (cfg.clone(), topic.clone());
        tokio::task::spawn_blocking(move || fairway::kafka::copy::watermarks(&cfg, &topic)).await.unwrap()
    };
    let ends: HashMap<i32, i64> = marks
        .expect("the pool topic's watermarks")
        .into_iter()
        .filter(|(_, low, high)| high > low)
        .map(|(p, _, high)| (p, high))
        .collect();
    let next = std::cell::RefCell::new(HashMap::<i32, i64>::new());
    let recs = common::read_until(
        cfg,
        &topic,
        Duration::from_secs(90),
        |b, partition, offset| {
            next.borrow_mut().insert(partition, offset + 1);
            first_attempt(b)
        },
        |_| ends.iter().all(|(p, end)| next.borrow().get(p).is_some_and(|n| n >= end)),
    )
    .await;
    let read = next.borrow();
    let short: Vec<_> = ends.iter().filter(|(p, end)| read.get(p).is_none_or(|n| n < end)).collect();
    assert!(
        short.is_empty(),
        "the pool topic read to its end within 90 s; partitions (id, end) short of it: {short:?}"
    );
    count_by_id(recs)
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
    // A fire submitted late (a pass that read the schedule before its removal, a leader's
    // retry) has 5 s to reach the topic; then the topic is read to its end.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let seen = pool_records_to_end(&cfg).await;
    common::stop_fleet(&mut fleet);
    // Exactly one first-attempt record per tick up to `until`, and nothing but ticks: a
    // pass that read the schedule before its removal fires up to FIRE_AHEAD_MS past it.
    let last_fire = removed_at + fairway::core::recurring::FIRE_AHEAD_MS;
    let ticks: BTreeMap<Millis, String> =
        (first..=last_fire).step_by(2_000).map(|at| (at, fire_job_id(&added.id, at))).collect();
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
        let moved =
            ScheduleCursor { tenant: "acme".into(), name: name.into(), paused: false, next_fire_at: Some(back) };
        assert!(sch.statements().advance(&moved, added.next_fires[0], now).await.unwrap());
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

/// A schedule whose row is due but whose due index holds no entry for it (what a backup
/// copied between a fire's index write and its row write restores, or a leader that died
/// mid-fire leaves) fires as soon as a new leader starts, not a minute later when the
/// sweep would call it overdue.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_due_schedule_missing_from_the_index_fires_when_a_leader_starts() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let (store, sch) = schedules(&cfg).await;
    let now = fairway::now_ms();
    let s = ScheduleSpec { every: Some("1h".into()), start_at: Some(now + 1_800_000), ..spec("unindexed") };
    let added = sch.add(s, now).await.expect("add");
    // The row says due 5 s ago; the index only knows the fire half an hour ahead.
    let due = now - 5_000;
    let cql = format!(
        "UPDATE {}.tenant_schedules SET next_fire_at = ? WHERE scope = ? AND tenant = ? AND name = ?",
        cfg.scylla.keyspace
    );
    store.session().query_unpaged(cql, (due, cfg.kafka.topic_prefix.clone(), "acme", "unindexed")).await.unwrap();
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let started = std::time::Instant::now();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let fired = fire_job_id(&added.id, due);
    let seen = pool_records(&cfg, Duration::from_secs(25), |v| v.iter().any(|j| j.job_id == fired)).await;
    let took = started.elapsed();
    w.stop().await;
    assert!(
        seen.contains_key(&fired),
        "the due schedule fired within 25 s of the leader's start (the overdue sweep alone would wait 55 s)"
    );
    eprintln!("fired {:.1} s after the worker started", took.as_secs_f64());
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
    let cfg = Arc::new(common::config("[api]\nauth = \"off\"\n"));
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

/// Requests to one API server, each with the key given.
struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    /// `method path` with `key` (and a JSON body): (status, JSON body or the text as a string).
    async fn call(&self, key: &str, method: Method, path: &str, body: Option<&Value>) -> (StatusCode, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(key);
        if let Some(b) = body {
            req = req.json(b);
        }
        let r = req.send().await.expect("request");
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }
}

/// (tenant, name) of each schedule in a listing, sorted.
fn names(v: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = v
        .as_array()
        .unwrap_or_else(|| panic!("not a listing: {v}"))
        .iter()
        .map(|s| (s["tenant"].as_str().unwrap().to_string(), s["name"].as_str().unwrap().to_string()))
        .collect();
    out.sort();
    out
}

fn pair(tenant: &str, name: &str) -> (String, String) {
    (tenant.to_string(), name.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_schedules_http_api_and_console_are_tenant_scoped_check_input_and_cap_each_tenant() {
    let cfg = common::arc(common::config("[schedules]\nmax_per_tenant = 3\n"));
    common::init(&cfg).await;
    let (base, _stop) = common::serve_api(&cfg).await;
    let api = Api { base, http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap() };
    let (_, admin) = common::create_key(&cfg, &Caller::Admin, "it_recurring").await;
    let (_, acme) = common::create_key(&cfg, &Caller::Tenant("acme".into()), "it_recurring").await;
    let (_, globex) = common::create_key(&cfg, &Caller::Tenant("globex".into()), "it_recurring").await;
    let (acme, globex, admin) = (acme.as_str(), globex.as_str(), admin.as_str());

    // A tenant key adds for its own tenant (`tenant` omitted); 02:00 Berlin is 00:00 or 01:00 UTC.
    let nightly = json!({"name": "nightly", "job_type": "echo", "cron": "0 2 * * *", "tz": "Europe/Berlin"});
    let (s, a) = api.call(acme, Method::POST, "/v1/schedules", Some(&nightly)).await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    assert_eq!((a["tenant"].as_str(), a["paused"].as_bool()), (Some("acme"), Some(false)), "{a}");
    let next: Vec<Millis> = serde_json::from_value(a["next_fires"].clone()).unwrap();
    assert_eq!(next.len(), 3, "{a}");
    assert!([0, 3_600_000].contains(&next[0].rem_euclid(86_400_000)), "02:00 Berlin in UTC: {next:?}");
    let (s, e) = api.call(acme, Method::POST, "/v1/schedules", Some(&nightly)).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::CONFLICT, Some("SCHEDULE_EXISTS")), "{e}");
    // globex: the same name (names are per tenant) and one of its own.
    let (s, e) = api.call(globex, Method::POST, "/v1/schedules", Some(&nightly)).await;
    assert_eq!(s, StatusCode::CREATED, "{e}");
    let g_only = json!({"name": "g-only", "job_type": "echo", "every": "1h"});
    let (s, e) = api.call(globex, Method::POST, "/v1/schedules", Some(&g_only)).await;
    assert_eq!(s, StatusCode::CREATED, "{e}");

    // Listings: a tenant key its own; an admin every tenant's, or one tenant's.
    let (_, l) = api.call(acme, Method::GET, "/v1/schedules", None).await;
    assert_eq!(names(&l), vec![pair("acme", "nightly")]);
    let (_, l) = api.call(admin, Method::GET, "/v1/admin/schedules", None).await;
    assert_eq!(names(&l), vec![pair("acme", "nightly"), pair("globex", "g-only"), pair("globex", "nightly")]);
    let (_, l) = api.call(admin, Method::GET, "/v1/schedules?tenant=globex", None).await;
    assert_eq!(names(&l), vec![pair("globex", "g-only"), pair("globex", "nightly")]);
    let (s, _) = api.call(acme, Method::GET, "/v1/admin/schedules", None).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "the admin listing needs an admin key");
    let (s, _) = api.call(acme, Method::GET, "/v1/schedules?tenant=globex", None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // acme can never read, change, pause, resume or delete globex's: by name it finds no
    // such schedule of its own (404, like an unknown name); naming globex is refused (403).
    let change = json!({"name": "g-only", "job_type": "echo", "every": "1m"});
    let calls = [
        (Method::GET, "/v1/schedules/g-only", None),
        (Method::PUT, "/v1/schedules/g-only", Some(&change)),
        (Method::POST, "/v1/schedules/g-only:pause", None),
        (Method::POST, "/v1/schedules/g-only:resume", None),
        (Method::DELETE, "/v1/schedules/g-only", None),
    ];
    for (method, path, body) in calls {
        let (s, e) = api.call(acme, method.clone(), path, body).await;
        assert_eq!((s, e["code"].as_str()), (StatusCode::NOT_FOUND, Some("UNKNOWN_SCHEDULE")), "{method} {path}: {e}");
        assert!(!e.to_string().contains("globex"), "nothing of globex in the answer: {e}");
        let (s, e) = api.call(acme, method.clone(), &format!("{path}?tenant=globex"), body).await;
        assert_eq!((s, e["code"].as_str()), (StatusCode::FORBIDDEN, Some("FORBIDDEN")), "{method} {path}: {e}");
    }
    let (s, _) = api
        .call(
            acme,
            Method::POST,
            "/v1/schedules",
            Some(&json!({"tenant": "globex", "name": "x", "job_type": "echo", "every": "1m"})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "a tenant key adds for its own tenant only");
    let moved = json!({"tenant": "globex", "name": "nightly", "job_type": "echo", "every": "1m"});
    let (s, _) = api.call(acme, Method::PUT, "/v1/schedules/nightly", Some(&moved)).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "nor moves its schedule to another tenant");
    let (s, g) = api.call(admin, Method::GET, "/v1/schedules/g-only?tenant=globex", None).await;
    assert_eq!(
        (s, g["every"].as_str(), g["paused"].as_bool()),
        (StatusCode::OK, Some("1h"), Some(false)),
        "untouched: {g}"
    );

    // Its own: replace, pause, resume.
    let every = json!({"name": "nightly", "job_type": "echo", "every": "30m"});
    let (s, a) = api.call(acme, Method::PUT, "/v1/schedules/nightly", Some(&every)).await;
    assert_eq!((s, a["every"].as_str(), a.get("cron")), (StatusCode::OK, Some("30m"), None), "{a}");
    let next: Vec<Millis> = serde_json::from_value(a["next_fires"].clone()).unwrap();
    assert_eq!(next[1] - next[0], 1_800_000, "{a}");
    let (s, a) = api.call(acme, Method::POST, "/v1/schedules/nightly:pause", None).await;
    assert_eq!((s, a["paused"].as_bool(), a["next_fires"].clone()), (StatusCode::OK, Some(true), json!([])), "{a}");
    let (_, a) = api.call(acme, Method::GET, "/v1/schedules/nightly", None).await;
    assert_eq!(a["paused"].as_bool(), Some(true), "{a}");
    let (s, a) = api.call(acme, Method::POST, "/v1/schedules/nightly:resume", None).await;
    assert_eq!(
        (s, a["paused"].as_bool(), a["next_fires"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(false), Some(3))
    );
    let renamed = json!({"name": "daily", "job_type": "echo", "every": "30m"});
    let (s, e) = api.call(acme, Method::PUT, "/v1/schedules/nightly", Some(&renamed)).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(e["error"].as_str().unwrap().contains("`name`"), "{e}");

    // Bad input: 422 naming the field and the fix.
    let bad = |extra: Value| {
        let mut b = json!({"name": "bad", "job_type": "echo"});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    for (body, field, fix) in [
        (bad(json!({"cron": "61 * * * *"})), "`cron`", "e.g. \"0 2 * * *\""),
        (bad(json!({"cron": "0 2 * *"})), "`cron`", "write 5"),
        (bad(json!({"cron": "0 2 * * *", "tz": "Mars/Olympus"})), "`tz`", "Europe/Berlin"),
        (bad(json!({"job_type": "nope", "every": "1m"})), "`job_type`", "[job_types.nope]"),
        (bad(json!({})), "`cron`", "`every`"),
        (bad(json!({"every": "soon"})), "`every`", "\"15m\""),
        (bad(json!({"name": "b c", "every": "1m"})), "`name`", "A-Z a-z 0-9"),
        (bad(json!({"every": "1m", "colour": "red"})), "colour", "fields: name"),
    ] {
        let (s, e) = api.call(acme, Method::POST, "/v1/schedules", Some(&body)).await;
        assert_eq!(
            (s, e["code"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("INVALID_SCHEDULE")),
            "{body}: {e}"
        );
        let msg = e["error"].as_str().unwrap();
        assert!(msg.contains(field) && msg.contains(fix), "{body}: {msg}");
    }

    // At most 3 per tenant here: globex's third fits, its fourth is refused naming the bound
    // and the fix; acme is not held back by globex.
    let add = |name: &str| json!({"name": name, "job_type": "echo", "every": "1h"});
    let (s, e) = api.call(globex, Method::POST, "/v1/schedules", Some(&add("g3"))).await;
    assert_eq!(s, StatusCode::CREATED, "{e}");
    let (s, e) = api.call(globex, Method::POST, "/v1/schedules", Some(&add("g4"))).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("TOO_MANY_SCHEDULES")), "{e}");
    let msg = e["error"].as_str().unwrap();
    assert!(msg.contains("schedules.max_per_tenant") && msg.contains("remove"), "{msg}");
    let (s, e) = api.call(acme, Method::POST, "/v1/schedules", Some(&add("a2"))).await;
    assert_eq!(s, StatusCode::CREATED, "{e}");

    // Remove: 204, then it is gone.
    let (s, _) = api.call(acme, Method::DELETE, "/v1/schedules/nightly", None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = api.call(acme, Method::GET, "/v1/schedules/nightly", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, g) = api.call(admin, Method::GET, "/v1/schedules/nightly?tenant=globex", None).await;
    assert_eq!(g["name"].as_str(), Some("nightly"), "globex's schedule of the same name stays: {g}");

    // The console: acme sees its own schedules, read-only; an admin every tenant's, and
    // pauses one of globex's.
    let (s, page) = api.call(acme, Method::GET, "/console/schedules", None).await;
    let page = page.as_str().unwrap_or_default().to_string();
    assert_eq!(s, StatusCode::OK, "{page}");
    assert!(page.contains("data-schedule=\"a2\""), "{page}");
    assert!(!page.contains("globex") && !page.contains("g-only"), "nothing of globex: {page}");
    assert!(!page.contains("pause-schedule"), "no actions for a tenant key");
    let pause = json!({"paused": true});
    let (s, _) = api.call(acme, Method::POST, "/console/api/schedules/globex/g-only", Some(&pause)).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, page) = api.call(admin, Method::GET, "/console/schedules", None).await;
    let page = page.as_str().unwrap_or_default().to_string();
    assert_eq!(s, StatusCode::OK);
    for row in ["data-tenant=\"acme\" data-schedule=\"a2\"", "data-tenant=\"globex\" data-schedule=\"g-only\""] {
        assert!(page.contains(row), "{row}: {page}");
    }
    assert!(page.contains("class=\"pause-schedule\" data-tenant=\"globex\" data-name=\"g-only\""), "{page}");
    let (s, g) = api.call(admin, Method::POST, "/console/api/schedules/globex/g-only", Some(&pause)).await;
    assert_eq!((s, g["paused"].as_bool()), (StatusCode::OK, Some(true)), "{g}");
    let (_, page) = api.call(admin, Method::GET, "/console/schedules", None).await;
    assert!(page.as_str().unwrap().contains("data-schedule=\"g-only\" data-paused=\"true\""), "{page}");
}

/// The value of the series `series` (name and labels exactly as exported) in a
/// Prometheus text page.
/// 300 `POST /v1/schedules` with distinct names race through two API processes (each with
/// its own store session) against `max_per_tenant = 100`: exactly 100 are created (an
/// unlocked count let 163 through), the rest answer 429; a removed schedule frees its
/// slot for one more add and no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_schedule_adds_on_two_apis_never_pass_the_tenant_bound() {
    let cfg = common::arc(common::config("[schedules]\nmax_per_tenant = 100\n"));
    common::init(&cfg).await;
    let (base_a, _stop_a) = common::serve_api(&cfg).await;
    let (base_b, _stop_b) = common::serve_api(&cfg).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
    let apis = [Api { base: base_a, http: http.clone() }, Api { base: base_b, http }];
    let apis = Arc::new(apis);
    let (_, acme) = common::create_key(&cfg, &Caller::Tenant("acme".into()), "it_recurring").await;
    // Many keys of the tenant (a key may have 4 requests with bodies in flight per API
    // process), and a request refused for being busy is sent again: every add reaches
    // the cap's check, up to 128 at once.
    let mut keys = Vec::new();
    for _ in 0..40 {
        keys.push(common::create_key(&cfg, &Caller::Tenant("acme".into()), "it_recurring").await.1);
    }
    let mut racers = tokio::task::JoinSet::new();
    for i in 0..300 {
        let (apis, key) = (apis.clone(), keys[i % keys.len()].clone());
        racers.spawn(async move {
            let body = json!({"name": format!("race-{i}"), "job_type": "echo", "every": "1h"});
            loop {
                let (s, b) = apis[i % 2].call(&key, Method::POST, "/v1/schedules", Some(&body)).await;
                let busy =
                    ["TOO_MANY_REQUESTS_WITH_BODIES", "TOO_MANY_REQUESTS"].contains(&b["code"].as_str().unwrap_or(""));
                if !busy {
                    return (s, b);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    while let Some(r) = racers.join_next().await {
        let (status, body) = r.unwrap();
        assert!(matches!(status, StatusCode::CREATED | StatusCode::TOO_MANY_REQUESTS), "{status}: {body}");
        *by_status.entry(status.as_u16()).or_default() += 1;
    }
    let (_, listed) = apis[0].call(&acme, Method::GET, "/v1/schedules", None).await;
    let listed = names(&listed);
    assert_eq!(by_status.get(&201), Some(&100), "created under the race: {by_status:?}");
    assert_eq!(listed.len(), 100, "schedules stored");

    let add = |name: &str| json!({"name": name, "job_type": "echo", "every": "1h"});
    let (s, _) = apis[1].call(&acme, Method::DELETE, &format!("/v1/schedules/{}", listed[0].1), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, e) = apis[0].call(&acme, Method::POST, "/v1/schedules", Some(&add("after-remove"))).await;
    assert_eq!(s, StatusCode::CREATED, "the removed schedule's slot is free: {e}");
    let (s, e) = apis[1].call(&acme, Method::POST, "/v1/schedules", Some(&add("one-too-many"))).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("TOO_MANY_SCHEDULES")), "{e}");
}

/// A schedule's payload is bounded (`schedules.max_payload_bytes`): over it, 413 naming
/// the field, the bound and the fix; at it, created. Start and end times beyond the
/// year 9999 are refused by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schedule_payloads_and_times_are_bounded() {
    let cfg = common::arc(common::config("[schedules]\nmax_payload_bytes = 1024\n"));
    common::init(&cfg).await;
    let (base, _stop) = common::serve_api(&cfg).await;
    let api = Api { base, http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap() };
    let (_, acme) = common::create_key(&cfg, &Caller::Tenant("acme".into()), "it_recurring").await;
    let with =
        |name: &str, payload: Value| json!({"name": name, "job_type": "echo", "every": "1h", "payload": payload});
    let (s, e) = api.call(&acme, Method::POST, "/v1/schedules", Some(&with("big", json!("x".repeat(2_000))))).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("PAYLOAD_TOO_LARGE")), "{e}");
    let msg = e["error"].as_str().unwrap();
    assert!(msg.contains("payload") && msg.contains("max_payload_bytes = 1024") && msg.contains("reference"), "{msg}");
    let (s, e) = api.call(&acme, Method::POST, "/v1/schedules", Some(&with("small", json!("x".repeat(1_000))))).await;
    assert_eq!(s, StatusCode::CREATED, "{e}");
    let (s, e) =
        api.call(&acme, Method::PUT, "/v1/schedules/small", Some(&with("small", json!("y".repeat(2_000))))).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "a replace is bounded too: {e}");
    let far = json!({"name": "far", "job_type": "echo", "every": "1h", "start_at": i64::MAX - 1});
    let (s, e) = api.call(&acme, Method::POST, "/v1/schedules", Some(&far)).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(e["error"].as_str().unwrap().contains("start_at"), "{e}");
}

/// Issue 63 (2): a schedule add costs the same few store calls however many tenants the
/// registry holds (a keyed registry read, its tenant's partition, the total's counter,
/// a slot claim, the insert: it used to read the registry twice and one partition per
/// registered tenant), and the deployment's total (`schedules.max_total`, a counter)
/// still holds: the add past it is refused, a remove makes room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_schedule_add_costs_the_same_store_calls_however_many_tenants_and_the_total_holds() {
    use fairway::core::scheduler::Tier;
    use fairway::core::tenants::TenantRecord;
    use fairway::ops::schedules::ScheduleError;
    let cfg = common::arc(common::config("[schedules]\nmax_total = 4\nmax_per_tenant = 3\n"));
    common::init(&cfg).await;
    let (store, s) = schedules(&cfg).await;
    let every =
        |name: &str, tenant: &str| ScheduleSpec { tenant: tenant.into(), every: Some("1h".into()), ..spec(name) };
    let add = |sp: ScheduleSpec| {
        let s = s.clone();
        async move {
            let (before, t) = (s.store_calls(), std::time::Instant::now());
            let r = s.add(sp, fairway::now_ms()).await;
            (r, s.store_calls() - before, t.elapsed())
        }
    };
    let (r, few, few_took) = add(every("one", "acme")).await;
    r.expect("acme's first schedule");
    let reg = store.tenant_statements().await.expect("registry");
    let many: Vec<TenantRecord> =
        (0..2_000).map(|i| TenantRecord::new(&format!("many-{i:04}"), Tier::Standard)).collect();
    reg.register(&many, fairway::now_ms()).await.expect("register 2,000 tenants");
    let (r, lots, lots_took) = add(every("two", "many-1999")).await;
    r.expect("a schedule of the last registered tenant");
    println!(
        "store calls of one add: {few} with the test's tenants ({few_took:?}), {lots} with 2,000 more ({lots_took:?})"
    );
    assert!(few <= 8, "an add costs a few store calls, not one per tenant: {few}");
    assert_eq!(few, lots, "the same calls with 2,000 more registered tenants");
    // An unregistered tenant is refused by one keyed read.
    let e = add(every("x", "nobody-registered")).await.0.expect_err("unregistered");
    assert!(e.to_string().contains("not registered"), "{e}");
    // The total: 2 so far; two more fit, the fifth is refused, a remove makes room.
    add(every("three", "globex")).await.0.expect("third");
    add(every("four", "many-0001")).await.0.expect("fourth");
    let e = add(every("five", "many-0002")).await.0.expect_err("past max_total");
    assert!(matches!(&e, ScheduleError::TooMany(m) if m.contains("schedules.max_total")), "{e}");
    assert_eq!(s.statements().total().await.unwrap(), 4, "the refused add took its count back");
    s.remove("globex", "three").await.expect("remove");
    add(every("five", "many-0002")).await.0.expect("room again after a remove");
    assert_eq!(s.statements().total().await.unwrap(), 4);
}

/// Debounce windows are bounded per tenant (`debounce.max_open_per_tenant`: the 4th key of
/// acme answers 429 while globex opens its own, and acme's open keys still fold in) and
/// by payload (`debounce.max_payload_bytes`); a caller's idempotency key may not use
/// fairway's own namespace (`fairway.`), so it cannot pre-claim a unique slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debounce_windows_are_bounded_per_tenant_and_system_keys_are_reserved() {
    let cfg = common::arc(common::config("[debounce]\nmax_open_per_tenant = 3\nmax_payload_bytes = 1024\n"));
    common::init(&cfg).await;
    let (base, _stop) = common::serve_api(&cfg).await;
    let api = Api { base, http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap() };
    let (_, acme) = common::create_key(&cfg, &Caller::Tenant("acme".into()), "it_recurring").await;
    let (_, globex) = common::create_key(&cfg, &Caller::Tenant("globex".into()), "it_recurring").await;
    let debounced = |key: &str, payload: Value| json!({"job_type": "echo", "payload": payload, "debounce_key": key, "debounce_delay": "1h"});
    for k in ["k1", "k2", "k3"] {
        let (s, e) = api.call(&acme, Method::POST, "/v1/jobs", Some(&debounced(k, json!(1)))).await;
        assert_eq!(s, StatusCode::CREATED, "{k}: {e}");
    }
    let (s, e) = api.call(&acme, Method::POST, "/v1/jobs", Some(&debounced("k4", json!(1)))).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::TOO_MANY_REQUESTS, Some("TOO_MANY_DEBOUNCE_WINDOWS")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("debounce.max_open_per_tenant"), "{e}");
    let (s, e) = api.call(&acme, Method::POST, "/v1/jobs", Some(&debounced("k1", json!(2)))).await;
    assert_eq!(s, StatusCode::OK, "an open window still folds submissions in: {e}");
    let (s, e) = api.call(&globex, Method::POST, "/v1/jobs", Some(&debounced("k4", json!(1)))).await;
    assert_eq!(s, StatusCode::CREATED, "another tenant's windows are its own: {e}");
    let (s, e) = api.call(&globex, Method::POST, "/v1/jobs", Some(&debounced("k5", json!("x".repeat(2_000))))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(e["error"].as_str().unwrap().contains("debounce.max_payload_bytes = 1024"), "{e}");

    // A fresh key name per run: the keyspace is shared by runs, and a unique slot holds
    // while its job is queued.
    let report = format!("report-{}", uuid::Uuid::new_v4().simple());
    let claim = json!({"job_type": "echo", "idempotency_key": format!("fairway.unique/{report}")});
    let (s, e) = api.call(&acme, Method::POST, "/v1/jobs", Some(&claim)).await;
    assert_eq!((s, e["code"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("INVALID_JOB")), "{e}");
    assert!(e["error"].as_str().unwrap().contains("reserved"), "{e}");
    let unique = json!({"job_type": "echo", "unique_key": report});
    let (s, e) = api.call(&acme, Method::POST, "/v1/jobs", Some(&unique)).await;
    assert_eq!(s, StatusCode::CREATED, "the unique slot was not pre-claimed: {e}");
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_promoter_leader_counts_fires_skips_and_lag_without_tenant_labels() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let extra = "[worker]\nmetrics_listen = \"127.0.0.1:0\"\n[job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n";
    let file = common::config_file(&cfg, extra, dir.path());
    let (_store, sch) = schedules(&cfg).await;
    let now = fairway::now_ms();
    // On time every second; and two every 20 s whose cursors are put back 200 s (missed
    // fires: `none` skips them, `one` submits one late job for them and skips the rest).
    sch.add(ScheduleSpec { every: Some("1s".into()), ..spec("tick") }, now).await.expect("add");
    let grid = now - now.rem_euclid(20_000) - 1_000_000;
    let back = now - now.rem_euclid(20_000) - 200_000;
    for (name, catch_up) in [("none", CatchUp::None), ("one", CatchUp::One)] {
        let s = ScheduleSpec { every: Some("20s".into()), start_at: Some(grid), catch_up, ..spec(name) };
        let added = sch.add(s, now).await.expect("add");
        let moved =
            ScheduleCursor { tenant: "acme".into(), name: name.into(), paused: false, next_fire_at: Some(back) };
        assert!(sch.statements().advance(&moved, added.next_fires[0], now).await.unwrap());
    }
    let worker = common::spawn_logged_worker(&file, "short");
    let want = [
        ("fairway_schedule_fires_total{outcome=\"on_time\"}", 2.0),
        ("fairway_schedule_fires_total{outcome=\"caught_up\"}", 1.0),
        ("fairway_schedule_skips_total{policy=\"none\"}", 1.0),
        ("fairway_schedule_skips_total{policy=\"one\"}", 1.0),
        ("fairway_schedule_fire_lag_seconds_count", 3.0),
        ("fairway_schedules{state=\"active\"}", 3.0),
        // Set at the end of a pass (the first one submits the fires due since the adds).
        ("fairway_schedule_oldest_due_seconds", 0.0),
    ];
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let text = common::wait_for(Duration::from_secs(60), async || {
        let url = format!("http://{}/metrics", worker.metrics_addr()?);
        let text = http.get(url).send().await.ok()?.text().await.ok()?;
        want.iter().all(|(series, at_least)| metric(&text, series).is_some_and(|v| v >= *at_least)).then_some(text)
    })
    .await;
    let Some(text) = text else {
        worker.print_tail("worker");
        panic!("the leader's metrics never showed {want:?}");
    };
    let ours: Vec<&str> =
        text.lines().filter(|l| l.starts_with("fairway_schedule_") || l.starts_with("fairway_schedules")).collect();
    let labels = |l: &str| l.split_once('{').map(|(_, rest)| rest.split('}').next().unwrap_or("").to_string());
    assert!(
        ours.iter().all(|l| !labels(l).unwrap_or_default().contains("tenant")),
        "never labelled by tenant: {ours:?}"
    );
}

/// The tombstones a read of the deployment's debounce due-index buckets from `from` to
/// `to` (epoch ms) wades through, as Cassandra's trace of the read says, and its live rows.
async fn due_index_read(cfg: &Config, store: &Store, from: Millis, to: Millis) -> (u64, u64) {
    let buckets: Vec<i64> = (from.div_euclid(60_000)..=to.div_euclid(60_000)).collect();
    let cql = format!(
        "SELECT due_at, tenant, name, rev FROM {}.due_index WHERE scope = ? AND kind = 'debounce' AND bucket IN ?",
        cfg.scylla.keyspace
    );
    let mut stmt = scylla::statement::Statement::new(cql);
    stmt.set_tracing(true);
    let res = store.session().query_unpaged(stmt, (cfg.kafka.topic_prefix.as_str(), buckets)).await.expect("read");
    let id = res.tracing_id().expect("traced");
    let mut events = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if let Ok(info) = store.session().get_tracing_info(&id).await {
            events = info.events.into_iter().filter_map(|e| e.activity).collect::<Vec<_>>();
            if events.iter().any(|a| a.contains("Request complete") || a.contains("tombstone")) {
                break;
            }
        }
    }
    let (mut live, mut tombstones) = (0, 0);
    for a in &events {
        // "Read 1 live rows and 299 tombstone cells for query ..."
        if let (Some(l), Some(t)) = (a.find(" live rows and "), a.find(" tombstone cells")) {
            let words = |s: &str| s.split_whitespace().last().and_then(|w| w.parse::<u64>().ok()).unwrap_or(0);
            live += words(&a[..l]);
            tombstones += words(&a[..t]);
        }
    }
    assert!(!events.is_empty(), "the read's trace");
    (live, tombstones)
}

/// Issue 63 (7): joins of a debounce window write nothing into the due index every
/// tenant's windows share: 300 joins of one key leave one live entry and no tombstone
/// in its buckets (each join used to put a new entry and tombstone the old one, and the
/// leader's every read of the bucket waded through them); the window still fires once,
/// with the last payload, after its entry moved to its due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debounce_joins_leave_no_tombstones_in_the_shared_due_index() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let (base, _stop) = common::serve_api(&cfg).await;
    let api = Api { base, http: reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap() };
    let (_, acme) = common::create_key(&cfg, &Caller::Tenant("acme".into()), "it_recurring").await;
    let store = Store::open(&cfg).await.expect("store");
    let started = fairway::now_ms();
    let join = |n: usize, delay: &str| json!({"job_type": "echo", "payload": {"n": n}, "debounce_key": "hot", "debounce_delay": delay});
    let (s, first) = api.call(&acme, Method::POST, "/v1/jobs", Some(&join(0, "1h"))).await;
    assert_eq!(s, StatusCode::CREATED, "{first}");
    for n in 1..300 {
        let (s, v) = api.call(&acme, Method::POST, "/v1/jobs", Some(&join(n, "1h"))).await;
        assert_eq!(s, StatusCode::OK, "join {n}: {v}");
    }
    let (live, tombstones) = due_index_read(&cfg, &store, started, fairway::now_ms() + 3_600_000 + 120_000).await;
    println!("300 joins of one window: the due index holds {live} live entries and {tombstones} tombstones");
    assert_eq!(live, 1, "one entry for the window");
    assert_eq!(tombstones, 0, "joins tombstone nothing in the shared index");

    // A short window joined 20 times fires once, with the last payload, after the
    // leader moved its entry to its due time.
    let (s, short) = api
        .call(
            &acme,
            Method::POST,
            "/v1/jobs",
            Some(&json!({"job_type": "echo", "payload": {"n": 0}, "debounce_key": "short", "debounce_delay": "2s"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{short}");
    for n in 1..20 {
        let body = json!({"job_type": "echo", "payload": {"n": n}, "debounce_key": "short", "debounce_delay": "2s"});
        let (s, v) = api.call(&acme, Method::POST, "/v1/jobs", Some(&body)).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let ran = result(&cfg, &id(&short)).await;
    assert_eq!(ran.len(), 1, "the joined window fired once");
    assert_eq!(ran[0].output.as_deref(), Some(br#"{"n":19}"#.as_slice()), "with the last payload");
    w.stop().await;
}

/// Opens racing on two API processes (30 distinct debounce keys of one tenant at once,
/// against `debounce.max_open_per_tenant = 3`): exactly 3 windows open, the rest answer
/// 429 (a count read before each open let most of them through); another tenant's
/// windows are its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_debounce_opens_on_two_apis_never_pass_the_tenant_bound() {
    let cfg = common::arc(common::config("[debounce]\nmax_open_per_tenant = 3\n"));
    common::init(&cfg).await;
    let (base_a, _stop_a) = common::serve_api(&cfg).await;
    let (base_b, _stop_b) = common::serve_api(&cfg).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
    let apis = Arc::new([Api { base: base_a, http: http.clone() }, Api { base: base_b, http }]);
    let mut keys = Vec::new();
    for _ in 0..16 {
        keys.push(common::create_key(&cfg, &Caller::Tenant("acme".into()), "it_recurring").await.1);
    }
    let mut racers = tokio::task::JoinSet::new();
    for i in 0..30 {
        let (apis, key) = (apis.clone(), keys[i % keys.len()].clone());
        racers.spawn(async move {
            let body = json!({"job_type": "echo", "debounce_key": format!("race-{i}"), "debounce_delay": "1h"});
            loop {
                let (s, b) = apis[i % 2].call(&key, Method::POST, "/v1/jobs", Some(&body)).await;
                let busy =
                    ["TOO_MANY_REQUESTS_WITH_BODIES", "TOO_MANY_REQUESTS"].contains(&b["code"].as_str().unwrap_or(""));
                if !busy {
                    return (s, b);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    while let Some(r) = racers.join_next().await {
        let (status, body) = r.unwrap();
        assert!(matches!(status, StatusCode::CREATED | StatusCode::TOO_MANY_REQUESTS), "{status}: {body}");
        *by_status.entry(status.as_u16()).or_default() += 1;
    }
    assert_eq!(by_status.get(&201), Some(&3), "windows opened under the race: {by_status:?}");
    let (_, globex) = common::create_key(&cfg, &Caller::Tenant("globex".into()), "it_recurring").await;
    let body = json!({"job_type": "echo", "debounce_key": "race-0", "debounce_delay": "1h"});
    let (s, e) = apis[0].call(&globex, Method::POST, "/v1/jobs", Some(&body)).await;
    assert_eq!(s, StatusCode::CREATED, "another tenant's windows are its own: {e}");
}

/// Rows of a keyspace from before (a schedule in the per-deployment `schedules` table,
/// from before slots; a window in `debounces`) move to their tenants' partitions once,
/// the schedule holding a slot, and fire; an index row not matching its schedule (a
/// cursor moved without it) is dropped; a schedule overdue without an index row is
/// indexed again by the leader's sweep and fires. None of it on the old layout: the
/// leader read the per-deployment partitions whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn old_rows_move_to_tenant_partitions_and_the_due_index_repairs_itself() {
    let cfg = common::arc(common::config(""));
    common::init(&cfg).await;
    let (store, sch) = schedules(&cfg).await;
    let (ks, scope, s) = (&cfg.scylla.keyspace, &cfg.kafka.topic_prefix, store.session());
    let now = fairway::now_ms();
    // A pre-slot schedule every 2 s in the old table; its definition as `add` writes it.
    let old_spec = ScheduleSpec { every: Some("2s".into()), ..spec("old") };
    let old_id = uuid::Uuid::new_v4().to_string();
    let created = now - 60_000;
    let cql = format!(
        "INSERT INTO {ks}.schedules (scope, tenant, name, id, spec, paused, next_fire_at, created_at, updated_at) \
         VALUES (?, 'acme', 'old', ?, ?, false, ?, ?, ?)"
    );
    // Its grid is anchored at its `created_at`: the next fire is 2 s from now.
    let next = created + 31 * 2_000;
    s.query_unpaged(cql, (scope, &old_id, serde_json::to_string(&old_spec).unwrap(), next, created, created))
        .await
        .unwrap();
    // A window due in 2 s in the old table, its job encoded as a submission keeps it.
    let window_id = uuid::Uuid::now_v7().to_string();
    let mut rec = JobSubmitted::original(window_id.clone(), "acme".into(), "echo".into(), b"{}".to_vec(), now);
    rec.pool = Some(Pool::Short);
    let cql = format!(
        "INSERT INTO {ks}.debounces (scope, tenant, key, window_id, first_at, due_at, rev, job) \
         VALUES (?, 'acme', 'old-window', ?, ?, ?, 'r1', ?)"
    );
    s.query_unpaged(cql, (scope, &window_id, now, now + 2_000, fairway::codec::encode_job(&rec).unwrap()))
        .await
        .unwrap();
    // A schedule whose index row went missing (its cursor 2 min overdue, no index row),
    // and a stale index row (a minute old) pointing at a schedule not due then.
    let grid = now - now.rem_euclid(20_000) - 1_000_000;
    let every_20s =
        ScheduleSpec { every: Some("20s".into()), start_at: Some(grid), catch_up: CatchUp::All, ..spec("lost") };
    let lost = sch.add(every_20s, now).await.unwrap();
    let overdue = now - now.rem_euclid(20_000) - 120_000;
    let cql = format!(
        "UPDATE {ks}.tenant_schedules SET next_fire_at = ? WHERE scope = ? AND tenant = 'acme' AND name = 'lost'"
    );
    s.query_unpaged(cql, (overdue, scope)).await.unwrap();
    let stale_at = now - 30_000;
    let cql = format!(
        "INSERT INTO {ks}.due_index (scope, kind, bucket, due_at, tenant, name, rev, written_at) \
         VALUES (?, 'schedule', ?, ?, 'acme', 'lost', '', ?)"
    );
    s.query_unpaged(cql, (scope, stale_at.div_euclid(60_000), stale_at, now - 120_000)).await.unwrap();
    let cql = format!("INSERT INTO {ks}.due_buckets (scope, kind, bucket) VALUES (?, 'schedule', ?)");
    s.query_unpaged(cql, (scope, stale_at.div_euclid(60_000))).await.unwrap();

    let registry = Registry::from_config(&cfg, Default::default()).unwrap();
    let w = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await.unwrap();
    let old_tick = fire_job_id(&old_id, next + 2_000);
    let lost_fire = fire_job_id(&lost.id, overdue);
    let want = [old_tick.clone(), lost_fire.clone(), window_id.clone()];
    let seen =
        pool_records(&cfg, Duration::from_secs(40), |v| want.iter().all(|id| v.iter().any(|j| j.job_id == *id))).await;
    w.stop().await;
    assert!(seen.contains_key(&old_tick), "the moved schedule fires");
    assert!(seen.contains_key(&window_id), "the moved window's job is submitted when due");
    assert!(seen.contains_key(&lost_fire), "the unindexed overdue schedule is indexed again and fires");

    let count = |cql: String| async move {
        let r = s.query_unpaged(cql, (scope.as_str(),)).await.unwrap().into_rows_result().unwrap();
        r.rows::<(i64,)>().unwrap().next().unwrap().unwrap().0
    };
    assert_eq!(count(format!("SELECT count(*) FROM {ks}.schedules WHERE scope = ?")).await, 0, "old schedules moved");
    assert_eq!(count(format!("SELECT count(*) FROM {ks}.debounces WHERE scope = ?")).await, 0, "old windows moved");
    let moved = sch.get("acme", "old").await.expect("moved into the tenant's partition");
    assert_eq!(moved.row.id, old_id);
    let cql = format!("SELECT name, at FROM {ks}.schedule_slots WHERE scope = ? AND tenant = 'acme' AND slot IN ? ");
    let slots: Vec<i32> = (0..cfg.schedules.max_per_tenant as i32).collect();
    let r = s.query_unpaged(cql, (scope.as_str(), slots)).await.unwrap().into_rows_result().unwrap();
    let held: Vec<(String, i64)> = r.rows::<(String, i64)>().unwrap().map(|r| r.unwrap()).collect();
    assert!(held.contains(&("old".to_string(), created)), "the pre-slot schedule holds a slot: {held:?}");
    let cql = format!(
        "SELECT count(*) FROM {ks}.due_index WHERE scope = ? AND kind = 'schedule' AND bucket = {} AND due_at = {stale_at}",
        stale_at.div_euclid(60_000)
    );
    assert_eq!(count(cql).await, 0, "the stale index row is dropped");
}

/// One tenant's schedules all due at one instant do not hold another tenant's fire behind
/// them: tenant acme has 400 schedules first due at `T`, globex one first due 1 ms later.
/// The promoter's leader takes due entries in tenant turns, so globex's fire is submitted
/// among the first of the 401; read in due-time order (as before), it came last.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tenants_schedules_due_at_once_do_not_hold_anothers_fire() {
    use futures::StreamExt;
    const A_SCHEDULES: usize = 400;
    let cfg = common::arc(common::config("[schedules]\nmax_per_tenant = 500\n"));
    common::init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let file = common::config_file(&cfg, "[job_types.echo]\npool = \"short\"\nhandler = \"echo\"\n", dir.path());
    let mut fleet = common::spawn_fleet(&file, 1);
    let (_store, sch) = schedules(&cfg).await;
    let now = fairway::now_ms();
    let t = now - now.rem_euclid(1_000) + 40_000;
    let hourly = |tenant: &str, name: String, start_at: Millis| ScheduleSpec {
        tenant: tenant.into(),
        every: Some("1h".into()),
        start_at: Some(start_at),
        ..spec(&name)
    };
    let added = futures::stream::iter(0..A_SCHEDULES)
        .map(|i| {
            let (sch, spec) = (&sch, hourly("acme", format!("bulk-{i}"), t));
            async move { sch.add(spec, fairway::now_ms()).await.expect("acme's schedule").id }
        })
        .buffer_unordered(16)
        .collect::<Vec<String>>()
        .await;
    let b = sch.add(hourly("globex", "tick".into(), t + 1), fairway::now_ms()).await.expect("globex's schedule");
    assert!(fairway::now_ms() < t - 2_000, "the adds took too long to leave every fire due at T; raise T");
    let a_ids: Vec<String> = added.iter().map(|id| fire_job_id(id, t)).collect();
    let b_id = fire_job_id(&b.id, t + 1);
    let fired = common::read_until(
        &cfg,
        &cfg.pool_topic(Pool::Short),
        Duration::from_secs(120),
        |bytes, _, _| fairway::codec::decode_job(bytes).ok().filter(|j| j.attempt == 0),
        |seen| seen.len() > A_SCHEDULES,
    )
    .await;
    common::stop_fleet(&mut fleet);
    let at: HashMap<&str, Millis> = fired.iter().map(|j| (j.job_id.as_str(), j.submitted_at)).collect();
    let b_at = *at.get(b_id.as_str()).expect("globex's fire was submitted");
    let a_fired: Vec<Millis> = a_ids.iter().filter_map(|id| at.get(id.as_str()).copied()).collect();
    assert_eq!(a_fired.len(), A_SCHEDULES, "every one of acme's fires was submitted");
    let a_before_b = a_fired.iter().filter(|a| **a < b_at).count();
    // In the first wave (the promoter works on 128 entries at once, finishing in any
    // order): at most about 128 of acme's go out first; read in due order, all 400 would.
    assert!(
        a_before_b <= A_SCHEDULES / 2,
        "globex's fire waited behind {a_before_b} of acme's {A_SCHEDULES} (tenant turns put it in the first wave)"
    );
}
