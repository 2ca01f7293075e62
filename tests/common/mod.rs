//! Shared helpers for integration tests: they run against the real local broker and CQL
//! database started by `scripts/services up` (addresses from FAIRWAY_BROKERS /
//! FAIRWAY_CQL), each test with its own topics and consumer groups.
#![allow(dead_code)]

pub mod openapi;
pub mod python;

use fairway::codec;
use fairway::config::Config;
use fairway::kafka::{self, Consumer, Message};
use fairway::model::{DeadLetter, JobResult};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn brokers() -> String {
    std::env::var("FAIRWAY_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".into())
}
pub fn cql() -> String {
    std::env::var("FAIRWAY_CQL").unwrap_or_else(|_| "127.0.0.1:19042".into())
}

/// A port free on 127.0.0.1 for a child process to listen on. Drawn below the kernel's
/// ephemeral range (32768 on): a port the OS hands out for `:0` is also the next source
/// port of some outgoing connection (the suite opens thousands), which then holds it when
/// the child tries to bind. Never the same port twice in one test binary.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Option<std::collections::HashSet<u16>>> = std::sync::Mutex::new(None);
    let mut given = GIVEN.lock().unwrap();
    let given = given.get_or_insert_with(Default::default);
    for _ in 0..1000 {
        let port = rand::random_range(20_000..32_000u16);
        if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
    panic!("no free port in 20000..32000 on 127.0.0.1 after 1,000 tries");
}

/// The bundled config plus `extra` TOML, pointed at the local services with a unique
/// topic prefix and the shared integration keyspace. Every section of `extra` counts:
/// `[kafka]`, `[scylla]`, `[worker]`, `[registry]` and `[pools.*]` replace the bundled
/// file's (those are the demo's; pools keep at most 16 slots unless `extra` names
/// `[pools...]`), `[job_types.*]` and `[tenants.*]` add or replace entries, and any other
/// section's keys are set over the bundled section's (`[classifier] window = "30s"`
/// keeps the bundled `enabled = true`). A section `Config` does not know fails the parse.
pub fn config(extra: &str) -> Config {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let text = format!(
        "[kafka]\nbrokers = \"{}\"\ntopic_prefix = \"it{}.\"\ngroup_prefix = \"it{}.workers.\"\npartitions = 3\nsession_timeout = \"6s\"\n\
         [scylla]\ncontact_points = [\"{}\"]\nkeyspace = \"fairway_it\"\n{}",
        brokers(),
        &id[..12],
        &id[..12],
        cql(),
        extra
    );
    let test: toml::Table = text.parse().unwrap_or_else(|e| panic!("test config is not TOML: {e}\n{text}"));
    let mut merged: toml::Table = include_str!("../../fairway.toml").parse().expect("the bundled fairway.toml");
    for replaced in ["kafka", "scylla", "worker", "registry", "pools"] {
        merged.remove(replaced);
    }
    for (section, value) in test {
        match (section.as_str(), merged.get_mut(&section), value) {
            ("kafka" | "scylla" | "worker" | "registry" | "pools", _, value) => {
                merged.insert(section, value);
            }
            // Entries: a job type or tenant of `extra` replaces the bundled one whole.
            ("job_types" | "tenants", Some(toml::Value::Table(entries)), toml::Value::Table(over)) => {
                entries.extend(over)
            }
            // Settings: `extra`'s keys over the bundled section's.
            (_, Some(toml::Value::Table(bundled)), toml::Value::Table(over)) => merge_keys(bundled, over),
            (_, None, value) => {
                merged.insert(section, value);
            }
            (_, Some(_), value) => {
                panic!("tests/common::config cannot merge `{section} = {value}` into the bundled config")
            }
        }
    }
    let merged_text = toml::to_string(&merged).expect("the merged test config as TOML");
    let mut cfg = Config::parse(&merged_text, "test config").expect("test config");
    if !extra.contains("[pools") {
        cfg.pools.iter_mut().for_each(|(_, p)| p.slots = p.slots.min(16));
    }
    cfg
}

/// `over`'s keys set into `base`, tables key by key (other values replaced).
fn merge_keys(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_keys(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

static SCHEMA: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();

pub async fn init(cfg: &Config) {
    // FAIRWAY_TEST_LOG=fairway=debug shows the worker's logs while debugging a test.
    if let Ok(filter) = std::env::var("FAIRWAY_TEST_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    }
    kafka::ensure_topics(cfg).await.expect("create topics");
    // Tests share one keyspace; create it once per test binary (concurrent DDL races).
    SCHEMA
        .get_or_init(|| async {
            fairway::store::ensure_schema(cfg).await.expect("create schema");
        })
        .await;
    // Each test has its own deployment (topic prefix) and so its own tenants registry.
    fairway::ops::tenants::seed(cfg).await.expect("register the test's tenants");
}

/// Reads `topic` from the beginning until `done` says so or `timeout` passes.
pub async fn read_until<T>(
    cfg: &Config,
    topic: &str,
    timeout: Duration,
    decode: impl Fn(&[u8], i32, i64) -> Option<T>,
    mut done: impl FnMut(&[T]) -> bool,
) -> Vec<T> {
    let c = kafka::reader(cfg, &format!("reader-{}", uuid::Uuid::new_v4()), false).expect("reader");
    c.subscribe(&[topic]).expect("subscribe");
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    while Instant::now() < deadline && !done(&out) {
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), c.recv()).await {
            if let Some(v) = m.payload().and_then(|p| decode(p, m.partition(), m.offset())) {
                out.push(v);
            }
        }
    }
    out
}

/// Results for the given job ids (all of them, or what arrived before the timeout).
pub async fn results_for(cfg: &Config, ids: &[String], timeout: Duration) -> HashMap<String, Vec<JobResult>> {
    let want: std::collections::HashSet<&String> = ids.iter().collect();
    let rs = read_until(
        cfg,
        &cfg.results_topic(),
        timeout,
        |b, _, _| codec::decode_result(b).ok(),
        |v: &[JobResult]| {
            let got: std::collections::HashSet<&String> =
                v.iter().map(|r| &r.job_id).filter(|i| want.contains(i)).collect();
            got.len() == want.len()
        },
    )
    .await;
    let mut by: HashMap<String, Vec<JobResult>> = HashMap::new();
    for r in rs.into_iter().filter(|r| want.contains(&r.job_id)) {
        by.entry(r.job_id.clone()).or_default().push(r);
    }
    by
}

pub async fn dead_letters(cfg: &Config, n: usize, timeout: Duration) -> Vec<DeadLetter> {
    read_until(
        cfg,
        &cfg.dlq_topic(),
        timeout,
        |b, _, _| codec::decode_dead_letter(b).ok(),
        |v: &[DeadLetter]| v.len() >= n,
    )
    .await
}

/// Serves the HTTP API for `cfg` on a free 127.0.0.1 port: its base URL, and the sender
/// that stops it.
pub async fn serve_api(cfg: &Arc<Config>) -> (String, tokio::sync::oneshot::Sender<()>) {
    let state = fairway::api::ApiState::connect(cfg.clone(), None).await.expect("API state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(fairway::api::serve(listener, state, async move {
        let _ = rx.await;
    }));
    (base, stop)
}

pub fn arc(cfg: Config) -> Arc<Config> {
    Arc::new(cfg)
}

/// A job record as a producer would write it (for tests that produce raw records).
pub fn job_record(tenant: &str, job_type: &str) -> fairway::model::JobSubmitted {
    fairway::model::JobSubmitted {
        pool: Some(fairway::model::Pool::Short),
        ..fairway::model::JobSubmitted::original(
            uuid::Uuid::now_v7().to_string(),
            tenant.into(),
            job_type.into(),
            vec![],
            fairway::now_ms(),
        )
    }
}

/// Writes a config file for worker processes: `cfg`'s Kafka/CQL settings plus `extra`.
pub fn config_file(cfg: &Config, extra: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let text = format!(
        "[kafka]\nbrokers = \"{}\"\ntopic_prefix = \"{}\"\ngroup_prefix = \"{}\"\npartitions = {}\nsession_timeout = \"6s\"\n\
         [scylla]\ncontact_points = [\"{}\"]\nkeyspace = \"{}\"\n\
         [tenants.acme]\ntier = \"enterprise\"\n[tenants.globex]\ntier = \"pro\"\n[tenants.initech]\ntier = \"standard\"\n{}",
        cfg.kafka.brokers,
        cfg.kafka.topic_prefix,
        cfg.kafka.group_prefix,
        cfg.kafka.partitions,
        cfg.scylla.contact_points[0],
        cfg.scylla.keyspace,
        extra
    );
    let path = dir.join("fairway.toml");
    std::fs::write(&path, text).expect("write config file");
    path
}

/// A command whose process is killed (SIGKILL) when the thread that started it ends: a
/// test that fails before stopping its workers does not leave them running, holding the
/// suite's output pipe open (`scripts/test` then waits for ever). Start it from the test's
/// own thread or a runtime worker thread, never from a `spawn_blocking` thread (those end
/// when idle).
pub fn dies_with_test(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: `prctl` is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Starts a `fairway worker` process for `pools` with the config file at `config_path`
/// (killed when the test's thread ends: [`dies_with_test`]).
pub fn spawn_worker(config_path: &std::path::Path, pools: &str) -> std::process::Child {
    dies_with_test(&mut std::process::Command::new(env!("CARGO_BIN_EXE_fairway")))
        .args(["--config", config_path.to_str().unwrap(), "worker", "--pools", pools])
        .env("FAIRWAY_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn worker")
}

/// A `fairway worker` process whose log is followed: which partitions of its pool topic
/// it owns (from its "partitions assigned" / "partitions revoked" lines) and since when.
/// Serve one pool per process, so the partitions are that pool's.
pub struct LoggedWorker {
    pub child: std::process::Child,
    owned: Arc<std::sync::Mutex<Owned>>,
    /// Its log for a failing test to print: the first `LOG_EVENTS` lines that are not
    /// periodic, and the last `LOG_TAIL` lines of all.
    log: Arc<std::sync::Mutex<(Vec<String>, VecDeque<String>)>>,
    /// Address of its metrics listener (`/readyz`, `/livez`), from its start line, when the
    /// config sets `worker.metrics_listen` (e.g. "127.0.0.1:0").
    probes: Arc<std::sync::Mutex<Option<String>>>,
}

/// What a worker's log says it owns: the partitions, since when, and every partition it
/// gave up (revoked or lost), in order.
struct Owned {
    parts: std::collections::BTreeSet<i32>,
    since: Instant,
    revoked: Vec<i32>,
}

const LOG_TAIL: usize = 300;
const LOG_EVENTS: usize = 3000;
/// Lines a worker logs periodically (its loop state, the quota exchange, fetch positions).
const PERIODIC: [&str; 3] = ["loop state", "quota exchange", "fetch positions"];

/// Starts a `fairway worker` for `pools` (one pool) and follows its log (killed when the
/// test's thread ends: [`dies_with_test`]).
pub fn spawn_logged_worker(config_path: &std::path::Path, pools: &str) -> LoggedWorker {
    use std::io::BufRead;
    let mut child = dies_with_test(&mut std::process::Command::new(env!("CARGO_BIN_EXE_fairway")))
        .args(["--config", config_path.to_str().unwrap(), "worker", "--pools", pools])
        .env("FAIRWAY_LOG", std::env::var("IT_WORKER_LOG").unwrap_or_else(|_| "warn,fairway::worker::pool=info".into()))
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn worker");
    let owned = Arc::new(std::sync::Mutex::new(Owned {
        parts: Default::default(),
        since: Instant::now(),
        revoked: Vec::new(),
    }));
    let (log, state) = (child.stderr.take().expect("stderr"), owned.clone());
    let log_kept = Arc::new(std::sync::Mutex::new((Vec::new(), VecDeque::with_capacity(LOG_TAIL))));
    let kept = log_kept.clone();
    let probes = Arc::new(std::sync::Mutex::new(None));
    let probes_seen = probes.clone();
    // IT_WORKER_LOG_DIR keeps each worker's whole log in <dir>/worker-<pid>.log.
    let mut copy = std::env::var_os("IT_WORKER_LOG_DIR").map(|dir| {
        let path = std::path::Path::new(&dir).join(format!("worker-{}.log", child.id()));
        std::fs::File::create(path).expect("create the worker's log copy")
    });
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(log).lines().map_while(Result::ok) {
            let line = strip_ansi(&line);
            if let Some(f) = copy.as_mut() {
                use std::io::Write;
                writeln!(f, "{line}").ok();
            }
            if let Some(rest) = line.strip_prefix("metrics and probes on http://") {
                *probes_seen.lock().unwrap() = rest.split('/').next().map(str::to_string);
            }
            {
                let mut k = kept.lock().unwrap();
                if k.0.len() < LOG_EVENTS && !PERIODIC.iter().any(|p| line.contains(p)) {
                    k.0.push(line.clone());
                }
                if k.1.len() == LOG_TAIL {
                    k.1.pop_front();
                }
                k.1.push_back(line.clone());
            }
            let assigned = line.contains("partitions assigned");
            if !assigned && !line.contains("partitions revoked") {
                if line.contains("WARN") || line.contains("ERROR") {
                    eprintln!("worker: {line}");
                }
                continue;
            }
            let Some(list) = line.split("partitions=").nth(1) else { continue };
            let list = list.trim_start_matches(['[', '{']);
            let list = &list[..list.find([']', '}']).unwrap_or(list.len())];
            let parts = list.split(',').filter_map(|p| p.trim().parse::<i32>().ok());
            let mut s = state.lock().unwrap();
            if assigned {
                s.parts = parts.collect();
            } else {
                for p in parts {
                    s.parts.remove(&p);
                    s.revoked.push(p);
                }
            }
            s.since = Instant::now();
        }
    });
    LoggedWorker { child, owned, log: log_kept, probes }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl LoggedWorker {
    /// Prints the last lines of its log (a failing test's evidence).
    pub fn print_tail(&self, name: &str) {
        let log = self.log.lock().unwrap();
        for line in &log.0 {
            eprintln!("{name}: {line}");
        }
        eprintln!("{name}: ---- the last {} lines:", log.1.len());
        for line in &log.1 {
            eprintln!("{name}: {line}");
        }
    }

    /// The partitions it owns now.
    pub fn owned(&self) -> std::collections::BTreeSet<i32> {
        self.owned.lock().unwrap().parts.clone()
    }

    /// Every partition it gave up so far (revoked or lost), in order, repeats included.
    pub fn revoked(&self) -> Vec<i32> {
        self.owned.lock().unwrap().revoked.clone()
    }

    /// Waits until it owns `n` partitions or more; when it got them, or None after `timeout`.
    pub fn wait_owning(&self, n: usize, timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            {
                let s = self.owned.lock().unwrap();
                if s.parts.len() >= n {
                    return Some(s.since);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// GET `path` on its metrics listener: the status code, None when it does not answer
    /// (not listening yet, or `worker.metrics_listen` not set).
    pub fn probe(&self, path: &str) -> Option<u16> {
        let addr = self.metrics_addr()?;
        http_get_status(&addr, path)
    }

    /// The host:port of its metrics listener, once its start line named it.
    pub fn metrics_addr(&self) -> Option<String> {
        self.probes.lock().unwrap().clone()
    }

    /// Waits until its `/readyz` answers 200; when, or None after `timeout`.
    pub fn wait_ready(&self, timeout: Duration) -> Option<Instant> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.probe("/readyz") == Some(200) {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Sends `signal` (TERM, INT, KILL) and waits for the exit (at most `timeout`);
    /// returns how long that took and the exit status.
    pub fn signal(&mut self, signal: &str, timeout: Duration) -> (Duration, std::process::ExitStatus) {
        let t = Instant::now();
        let pid = self.child.id().to_string();
        let ok = std::process::Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap();
        assert!(ok.success(), "kill -{signal} {pid}");
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return (t.elapsed(), st);
            }
            if t.elapsed() > timeout {
                self.child.kill().ok();
                self.child.wait().ok();
                self.print_tail(&format!("worker {pid}"));
                panic!("worker {pid} did not exit within {timeout:?} of kill -{signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LoggedWorker {
    fn drop(&mut self) {
        // A test that failed half-way must not leave workers behind (this process's child).
        if self.child.try_wait().ok().flatten().is_none() {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

/// Starts `n` logged workers of the short pool (config file at `config_path`) and waits
/// until each owns a partition of it.
pub fn spawn_fleet(config_path: &std::path::Path, n: usize) -> Vec<LoggedWorker> {
    let workers: Vec<LoggedWorker> = (0..n).map(|_| spawn_logged_worker(config_path, "short")).collect();
    for w in &workers {
        assert!(w.wait_owning(1, Duration::from_secs(90)).is_some(), "every worker owns a partition");
    }
    workers
}

/// Stops workers gracefully (SIGTERM).
pub fn stop_fleet(workers: &mut [LoggedWorker]) {
    for w in workers {
        w.signal("TERM", Duration::from_secs(60));
    }
}

/// Produces job records to the short pool's topic keyed by their job ids (as a producer
/// with its own keys would), so they spread over the partitions and thus the workers;
/// all at once, or one per `pace`.
pub async fn produce_spread(cfg: &Config, jobs: &[fairway::model::JobSubmitted], pace: Option<Duration>) {
    let producer = kafka::producer(cfg).unwrap();
    let topic = cfg.pool_topic(fairway::model::Pool::Short);
    for j in jobs {
        let bytes = codec::encode_job(j).unwrap();
        kafka::send(&producer, &topic, &j.job_id, &bytes).await.expect("produce");
        if let Some(p) = pace {
            tokio::time::sleep(p).await;
        }
    }
}

/// Creates an API key for `caller` in the test's keyspace: `(key id, bearer token)`.
pub async fn create_key(cfg: &Config, caller: &fairway::core::auth::Caller, label: &str) -> (String, String) {
    let store = fairway::store::Store::open(cfg).await.expect("store");
    let keys = store.key_statements().await.expect("key statements");
    let k = fairway::core::auth::new_key(rand::random());
    assert!(keys.insert(&k.id, &k.hash, caller, Some(label), fairway::now_ms()).await.expect("insert key"));
    (k.id, k.token)
}

/// A plain HTTP/1.0 GET of `path` at `addr` (host:port, 127.0.0.1) with a 2 s budget: the
/// response's status code, None when it cannot be had. For probes from synchronous code.
pub fn http_get_status(addr: &str, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let sock: std::net::SocketAddr = addr.parse().ok()?;
    let mut conn = std::net::TcpStream::connect_timeout(&sock, Duration::from_secs(2)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).ok()?;
    let mut head = [0u8; 12];
    conn.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Submits one `longsteps` job (handler `steps`: `steps` checkpoints of `step_ms` each)
/// per tenant of `tenants`, in order; their job ids.
pub async fn submit_long_steps(
    sub: &fairway::submit::Submitter,
    tenants: &[&str],
    steps: u32,
    step_ms: u64,
) -> Vec<String> {
    let payload = serde_json::json!({"steps": steps, "step_ms": step_ms});
    let mut ids = Vec::new();
    for tenant in tenants {
        let nj = fairway::submit::NewJob {
            tenant: tenant.to_string(),
            job_type: "longsteps".into(),
            payload: payload.clone().into(),
            ..Default::default()
        };
        ids.push(sub.submit(&nj).await.unwrap().job_id);
    }
    ids
}

/// A job of `tenant` and `job_type` with `payload`, everything else at its default.
pub fn new_job(tenant: &str, job_type: &str, payload: serde_json::Value) -> fairway::submit::NewJob {
    fairway::submit::NewJob {
        tenant: tenant.into(),
        job_type: job_type.into(),
        payload: payload.into(),
        ..Default::default()
    }
}

/// Polls `f` every 100 ms until it answers Some or `timeout` passes (then None).
pub async fn wait_for<T>(timeout: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Some(v) = f().await {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// Checks `Fairway-Signature: t=<secs>,v1=<hex>` against an HMAC-SHA256 computed here.
pub fn signature_valid(secret: &str, header: &str, body: &[u8]) -> bool {
    use hmac::Mac;
    let Some((t, v1)) = header.strip_prefix("t=").and_then(|r| r.split_once(",v1=")) else { return false };
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    let want: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let fresh = t.parse::<i64>().is_ok_and(|t| (fairway::now_ms() / 1000 - t).abs() < 300);
    want == v1 && fresh
}

/// What the clients' tests run against (`tests/it/clients.rs`):
/// the test config with `extra`, a `fairway worker` for the short pool that owns a
/// partition, the HTTP API (`api`: its base URL) and an admin key (`key`, labelled `label`).
pub struct ClientServices {
    pub cfg: Arc<Config>,
    pub worker: LoggedWorker,
    pub api: String,
    pub key: String,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

pub async fn client_services(extra: &str, label: &str) -> ClientServices {
    let cfg = config(extra);
    init(&cfg).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config_file(&cfg, extra, dir.path());
    let worker = spawn_logged_worker(&path, "short");
    let cfg = Arc::new(cfg);
    let (api, stop) = serve_api(&cfg).await;
    let (_, key) = create_key(&cfg, &fairway::core::auth::Caller::Admin, label).await;
    assert!(worker.wait_owning(1, Duration::from_secs(40)).is_some(), "the worker got no partition within 40 s");
    ClientServices { cfg, worker, api, key, _stop: stop, _dir: dir }
}

/// The real interpreter for `process` jobs (pyenv shims need variables the allow-list
/// does not pass on), one the attempts' own uids can run (the system's; a pyenv under
/// /root is private).
pub fn python() -> String {
    if std::path::Path::new("/usr/bin/python3").exists() {
        return "/usr/bin/python3".into();
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3 is installed");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A `process` job type `name` of `pool` running tests/fixtures/process/misbehave.py in
/// `mode` (crash, noop, hog, ...), with `more` settings appended.
pub fn misbehave(name: &str, pool: &str, mode: &str, more: &str) -> String {
    format!(
        "[job_types.{name}]\npool = \"{pool}\"\nhandler = \"process\"\n\
         command = [\"{}\", \"{}/tests/fixtures/process/misbehave.py\", \"{mode}\"]\nenv = [\"PATH\"]\n{more}\n",
        python(),
        env!("CARGO_MANIFEST_DIR")
    )
}
