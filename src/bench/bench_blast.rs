//! `fairway-bench bench blast`: the blast-radius suite as a benchmark on the local services.
//! Starts `fairway serve` as a child process (`--serve-bin` another build, e.g. main's,
//! for a before/after) and an in-process worker; tenant A (acme) attacks while tenant B
//! (globex) submits, each attack in turn:
//! - **batch flood**: `--bodies` concurrent maximum-size batch bodies (`[0,0,...]`) for
//!   `--seconds`; the server's peak RSS (VmHWM), B's submit latency and B's wait (submit
//!   to run start, from the results' `submitted_at` and `started_at`) alone and under
//!   attack, the slowest `/healthz`;
//! - **failing jobs**: 40 always-failing jobs from A, then B's submissions for 10 s (and
//!   their wait);
//! - **scheduled jobs**: 12 jobs 1 s ahead from a tenant with `max_queued = 5`;
//! - **streams**: 50 live streams from one key;
//! - **wide**: three concurrent `POST /v1/jobs` whose payload is a 6 MiB `[0,0,...]`
//!   (a tree of values of ~700 MB if parsed whole): the server's peak RSS;
//! - **slow**: `--slow-connections` connections from 127.0.0.3 trickling a request head
//!   one byte every 15 s, while B (from 127.0.0.2) submits: B's latency;
//! - **reads**: 16 loops of one key reading random job ids for 10 s while B reads: B's
//!   read p99 alone and beside them, and what A got.
//! - **schedules**: B's schedule fires every second; A adds `--schedules` schedules and
//!   opens as many debounce windows, each with the largest payload allowed (through the
//!   management shell and the submission path in this process, the bounds raised to fit):
//!   the promoter leader's RSS (this process's in-process worker holds the lease) idle
//!   and with them (measured for 30 s from a minute after the adds), and B's fire lag
//!   (submission - fire time) p50/p99 idle, during the adds, and with them in place.
//!
//! - **flows**, **webhooks**, **timeouts**: attacks on what tenants share behind the API
//!   (`bench_blast_shared`).
//!
//! `--attacks` picks some (default all, in that order).
//!
//! Last line JSON.

#[path = "bench_blast_shared.rs"]
mod shared;

use super::Global;
use anyhow::Context;
use fairway::core::auth::Caller;
use fairway::handlers::Registry;
use fairway::model::Pool;
use fairway::now_ms;
use fairway::worker::{Policy, Worker};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct BlastArgs {
    /// The `fairway` binary to serve the API with (default: this one).
    #[arg(long)]
    pub serve_bin: Option<std::path::PathBuf>,
    /// Concurrent maximum-size batch bodies of the flood.
    #[arg(long, default_value_t = 10)]
    pub bodies: usize,
    /// How long the flood lasts.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Connections of the slow-connection attack.
    #[arg(long, default_value_t = 4200)]
    pub slow_connections: usize,
    /// Which attacks to run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "flood,failing,scheduled,streams,wide,slow,reads,schedules,flows,webhooks,timeouts"
    )]
    pub attacks: Vec<String>,
    /// Schedules (and debounce windows) tenant A adds in the `schedules` attack.
    #[arg(long, default_value_t = 1000)]
    pub schedules: usize,
}

/// The child `fairway serve` and its address.
struct Server {
    child: tokio::process::Child,
    base: String,
    /// Its config file, removed with it.
    config: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

impl Server {
    fn pid(&self) -> Option<u32> {
        self.child.id()
    }
    /// Peak and current resident set of the server, MB (from /proc).
    fn rss_mb(&self) -> (f64, f64) {
        let status = self.pid().and_then(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok());
        let field = |name: &str| {
            status.as_deref().and_then(|s| {
                let line = s.lines().find(|l| l.starts_with(name))?;
                line.split_whitespace().nth(1)?.parse::<f64>().ok().map(|kb| kb / 1024.0)
            })
        };
        (field("VmHWM:").unwrap_or(0.0), field("VmRSS:").unwrap_or(0.0))
    }
}

/// `fairway serve` as a child, on the bundled configuration plus `extra` (TOML), with
/// `cfg`'s services and names and `secrets` (environment variables) set.
async fn start_server(
    bin: &std::path::Path,
    cfg: &fairway::config::Config,
    extra: &str,
    secrets: &[(String, String)],
) -> anyhow::Result<Server> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let file = std::env::temp_dir().join(format!("fairway-bench-blast-{port}.toml"));
    std::fs::write(&file, format!("{}{extra}", fairway::config::BUNDLED))?;
    let child = tokio::process::Command::new(bin)
        .arg("--config")
        .arg(&file)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--metrics-listen", "off"])
        .envs(secrets.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("FAIRWAY_TOPIC_PREFIX", &cfg.kafka.topic_prefix)
        .env("FAIRWAY_KEYSPACE", &cfg.scylla.keyspace)
        .env("FAIRWAY_BROKERS", &cfg.kafka.brokers)
        .env("FAIRWAY_CQL", cfg.scylla.contact_points.join(","))
        .env("FAIRWAY_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let child = match child {
        Ok(child) => child,
        Err(e) => {
            let _ = std::fs::remove_file(&file);
            return Err(e).with_context(|| format!("starting {} serve", bin.display()));
        }
    };
    let server = Server { child, base: format!("http://127.0.0.1:{port}"), config: file };
    let base = &server.base;
    let deadline = Instant::now() + Duration::from_secs(60);
    while reqwest::get(format!("{base}/healthz")).await.is_err() {
        anyhow::ensure!(Instant::now() < deadline, "fairway serve did not answer /healthz within 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(server)
}

/// A client sending `key`, from the loopback address `from` (each party has its own, as
/// separate clients would).
fn client(key: &str, from: &str) -> anyhow::Result<reqwest::Client> {
    Ok(client_builder(key, from)?.build()?)
}

fn client_builder(key: &str, from: &str) -> anyhow::Result<reqwest::ClientBuilder> {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("authorization", format!("Bearer {key}").parse()?);
    let from: std::net::IpAddr = from.parse()?;
    Ok(reqwest::Client::builder().default_headers(h).local_address(from).timeout(Duration::from_secs(60)))
}

/// B's submissions: (accepted, sent, latencies in ms, the accepted jobs' ids).
#[derive(Default)]
struct Served {
    accepted: usize,
    sent: usize,
    ms: Vec<f64>,
    codes: BTreeMap<String, usize>,
    ids: Vec<String>,
}

/// `p` quantile of `v` (0 when empty).
fn quantile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1))).copied().unwrap_or(0.0)
}

/// A job's result as the bench keeps it.
#[derive(Clone)]
struct Seen {
    /// Run start - submission, ms.
    wait: f64,
    tenant: String,
    submitted_at: i64,
}

/// Every job's wait as its result arrives on the results topic.
#[derive(Clone, Default)]
struct Waits(Arc<std::sync::Mutex<HashMap<String, Seen>>>);

impl Waits {
    /// Follows the results topic until the process ends.
    fn follow(cfg: &fairway::config::Config) -> anyhow::Result<Waits> {
        let reader = fairway::kafka::reader(cfg, &cfg.group("bench-blast-results"), false)?;
        fairway::kafka::Consumer::subscribe(&reader, &[&cfg.results_topic()])?;
        let waits = Waits::default();
        let seen = waits.clone();
        tokio::spawn(async move {
            while let Ok(m) = reader.recv().await {
                let Some(r) = fairway::kafka::Message::payload(&m).and_then(|p| fairway::codec::decode_result(p).ok())
                else {
                    continue;
                };
                let wait = (r.started_at.unwrap_or(r.finished_at) - r.submitted_at) as f64;
                let s = Seen { wait, tenant: r.tenant, submitted_at: r.submitted_at };
                seen.0.lock().expect("waits").insert(r.job_id, s);
            }
        });
        Ok(waits)
    }

    /// The waits of `ids` (waiting up to 60 s for their results): (p99 ms, how many ran).
    async fn p99(&self, ids: &[String]) -> (f64, usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got: Vec<f64> = {
                let m = self.0.lock().expect("waits");
                ids.iter().filter_map(|id| m.get(id).map(|s| s.wait)).collect()
            };
            if got.len() == ids.len() || Instant::now() >= deadline {
                return (quantile(got.clone(), 0.99), got.len());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `served`'s JSON with its jobs' p99 wait.
    async fn with_wait(&self, served: &Served) -> Value {
        let (p99, ran) = self.p99(&served.ids).await;
        let mut v = served.json();
        v["wait_p99_ms"] = json!(p99);
        v["ran"] = json!(ran);
        v
    }
}

impl Served {
    async fn submit(&mut self, http: &reqwest::Client, base: &str, job: &Value) {
        let t = Instant::now();
        let r = http.post(format!("{base}/v1/jobs")).json(job).send().await;
        self.sent += 1;
        self.ms.push(t.elapsed().as_secs_f64() * 1000.0);
        let code = match r {
            Ok(r) if r.status().is_success() => {
                self.accepted += 1;
                let b: Value = r.json().await.unwrap_or(Value::Null);
                self.ids.extend(b["job_id"].as_str().map(String::from));
                "201".to_string()
            }
            Ok(r) => {
                let s = r.status().as_u16();
                let b: Value = r.json().await.unwrap_or(Value::Null);
                format!("{s} {}", b["code"].as_str().unwrap_or(""))
            }
            Err(_) => "error".into(),
        };
        *self.codes.entry(code).or_default() += 1;
    }
    fn p99(&self) -> f64 {
        quantile(self.ms.clone(), 0.99)
    }
    fn json(&self) -> Value {
        json!({"accepted": self.accepted, "sent": self.sent, "p99_ms": self.p99(), "answers": self.codes})
    }
}

/// B submits one echo job every 50 ms until `stop`.
async fn b_submits_until(b: &reqwest::Client, base: &str, stop: Instant) -> Served {
    b_submits_until_with(b, base, &json!({"job_type": "echo"}), stop).await
}

/// B submits `job` every 50 ms until `stop`.
async fn b_submits_until_with(b: &reqwest::Client, base: &str, job: &Value, stop: Instant) -> Served {
    let mut s = Served::default();
    while Instant::now() < stop {
        s.submit(b, base, job).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s
}

/// The clients and the waits' follower.
struct Parties<'a> {
    a: &'a reqwest::Client,
    b: &'a reqwest::Client,
    waits: &'a Waits,
}

async fn batch_flood(srv: &Server, p: &Parties<'_>, args: &BlastArgs) -> Value {
    let (a, b) = (p.a, p.b);
    let base = srv.base.as_str();
    let alone = b_submits_until(b, base, Instant::now() + Duration::from_secs(5)).await;
    let (peak_before, rss_before) = srv.rss_mb();
    // Just under the default batch limit (32 MiB).
    let body = bytes::Bytes::from(format!("[{}0]", "0,".repeat((32 << 20) / 2 - 16)));
    let stop = Instant::now() + Duration::from_secs(args.seconds);
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    let flood = async {
        while Instant::now() < stop {
            let sends = (0..args.bodies).map(|_| {
                let req = a.post(format!("{base}/v1/jobs:batch")).header("content-type", "application/json");
                let body = body.clone();
                async move {
                    match req.body(body).send().await {
                        Ok(r) => {
                            let s = r.status().as_u16();
                            let v: Value = r.json().await.unwrap_or(Value::Null);
                            format!("{s} {}", v["code"].as_str().unwrap_or(""))
                        }
                        Err(_) => "reset before the answer".to_string(),
                    }
                }
            });
            for a in futures::future::join_all(sends).await {
                *answers.entry(a).or_default() += 1;
            }
        }
    };
    let health = async {
        let mut worst = 0f64;
        while Instant::now() < stop {
            let t = Instant::now();
            let ok = reqwest::get(format!("{base}/healthz")).await.is_ok_and(|r| r.status().is_success());
            worst = worst.max(if ok { t.elapsed().as_secs_f64() * 1000.0 } else { f64::INFINITY });
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        worst
    };
    let (_, attacked, healthz_worst_ms) = tokio::join!(flood, b_submits_until(b, base, stop), health);
    let (peak, rss) = srv.rss_mb();
    let (alone, attacked) = (p.waits.with_wait(&alone).await, p.waits.with_wait(&attacked).await);
    let ratio = attacked["wait_p99_ms"].as_f64().unwrap_or(0.0) / alone["wait_p99_ms"].as_f64().unwrap_or(0.0).max(1.0);
    json!({
        "bodies": args.bodies, "body_mb": body.len() as f64 / 1048576.0, "seconds": args.seconds,
        "a_answers": answers, "b_alone": alone, "b_under_attack": attacked, "b_wait_p99_ratio": ratio,
        "healthz_worst_ms": healthz_worst_ms, "rss_mb_before": rss_before, "peak_rss_mb_before": peak_before,
        "peak_rss_mb": peak, "rss_mb_after": rss,
    })
}

async fn failing_jobs(srv: &Server, p: &Parties<'_>) -> Value {
    let (a, b, base) = (p.a, p.b, srv.base.as_str());
    let alone = b_submits_until(b, base, Instant::now() + Duration::from_secs(10)).await;
    let doomed: Vec<Value> = (0..40).map(|_| json!({"job_type": "fail"})).collect();
    let sent = a.post(format!("{base}/v1/jobs:batch")).json(&doomed).send().await.map(|r| r.status().as_u16());
    // The breakers read outcomes every second over 10 s buckets: give them 25 s.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let mut a_after = Served::default();
    a_after.submit(a, base, &json!({"job_type": "echo"})).await;
    let b_after = b_submits_until(b, base, Instant::now() + Duration::from_secs(10)).await;
    let (alone, after) = (p.waits.with_wait(&alone).await, p.waits.with_wait(&b_after).await);
    let ratio = after["wait_p99_ms"].as_f64().unwrap_or(0.0) / alone["wait_p99_ms"].as_f64().unwrap_or(0.0).max(1.0);
    json!({
        "a_batch_status": sent.ok(), "a_echo_after": a_after.json(), "b_alone": alone, "b_after": after,
        "b_wait_p99_ratio": ratio,
    })
}

async fn scheduled(srv: &Server, a: &reqwest::Client) -> Value {
    let mut s = Served::default();
    for _ in 0..12 {
        s.submit(a, &srv.base, &json!({"tenant": "blastq", "job_type": "echo", "execute_at": now_ms() + 1_000})).await;
    }
    let mut far = Served::default();
    far.submit(
        a,
        &srv.base,
        &json!({"tenant": "blastq", "job_type": "echo", "execute_at": now_ms() + 400 * 86_400_000}),
    )
    .await;
    json!({"max_queued": 5, "scheduled_1s_ahead": s.json(), "scheduled_400d_ahead": far.json()})
}

async fn streams(srv: &Server, a: &reqwest::Client, b: &reqwest::Client) -> Value {
    let mut open = Vec::new();
    let mut answers: BTreeMap<u16, usize> = BTreeMap::new();
    for _ in 0..50 {
        if let Ok(r) = a.get(format!("{}/v1/events?follow=1", srv.base)).send().await {
            *answers.entry(r.status().as_u16()).or_default() += 1;
            open.push(r);
        }
    }
    let b_stream = b.get(format!("{}/v1/events?follow=1", srv.base)).send().await.map(|r| r.status().as_u16());
    json!({"a_streams_asked": 50, "a_answers": answers, "b_stream_status": b_stream.ok()})
}

async fn wide_bodies(srv: &Server, a: &reqwest::Client, b: &reqwest::Client) -> Value {
    let (peak_before, _) = srv.rss_mb();
    let body = bytes::Bytes::from(format!("{{\"job_type\":\"echo\",\"payload\":[{}0]}}", "0,".repeat(3 << 20)));
    let sends = (0..3).map(|_| {
        let req = a.post(format!("{}/v1/jobs", srv.base)).header("content-type", "application/json");
        let body = body.clone();
        async move { req.body(body).send().await.map(|r| r.status().as_u16()).map_err(|e| e.to_string()) }
    });
    let answers: Vec<_> = futures::future::join_all(sends).await;
    let mut b_after = Served::default();
    b_after.submit(b, &srv.base, &json!({"job_type": "echo"})).await;
    let (peak, rss) = srv.rss_mb();
    json!({"payload_mb": body.len() as f64 / 1048576.0, "a_answers": format!("{answers:?}"),
           "peak_rss_mb_before": peak_before, "peak_rss_mb": peak, "rss_mb_after": rss, "b_after": b_after.json()})
}

async fn slow_connections(srv: &Server, b: &reqwest::Client, n: usize) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr: std::net::SocketAddr = match srv.base.trim_start_matches("http://").parse() {
        Ok(a) => a,
        Err(e) => return json!({"error": e.to_string()}),
    };
    let alone = b_submits_until(b, &srv.base, Instant::now() + Duration::from_secs(3)).await;
    let mut open = Vec::new();
    let mut connect_errors = 0usize;
    for _ in 0..n {
        let Ok(sock) = tokio::net::TcpSocket::new_v4() else { continue };
        let bound = sock.bind(([127, 0, 0, 3], 0).into());
        match tokio::time::timeout(Duration::from_secs(2), async {
            bound?;
            sock.connect(addr).await
        })
        .await
        {
            Ok(Ok(mut s)) => {
                let _ = s.write_all(b"POST /v1/jobs HTTP/1.1\r\n").await;
                open.push(s);
            }
            _ => connect_errors += 1,
        }
    }
    let stop = Instant::now() + Duration::from_secs(30);
    let trickle = async {
        let mut rounds = 0;
        while Instant::now() < stop {
            for s in open.iter_mut() {
                let _ = s.write_all(b"X").await;
            }
            rounds += 1;
            tokio::time::sleep(Duration::from_secs(15).min(stop.saturating_duration_since(Instant::now()))).await;
        }
        rounds
    };
    let (rounds, attacked) = tokio::join!(trickle, b_submits_until(b, &srv.base, stop));
    let mut refused = 0usize;
    for s in open.iter_mut() {
        let mut buf = [0u8; 16];
        if let Ok(Ok(k)) = tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await {
            refused += usize::from(k > 0 && buf.starts_with(b"HTTP/1.1 503"));
        }
    }
    json!({"connections": n, "connected": open.len(), "connect_errors": connect_errors, "answered_503": refused,
           "trickle_rounds": rounds, "b_alone": alone.json(), "b_under_attack": attacked.json()})
}

async fn reads(srv: &Server, a: &reqwest::Client, b: &reqwest::Client) -> Value {
    let read_loop = |c: reqwest::Client, stop: Instant, pause: Duration| {
        let base = srv.base.clone();
        async move {
            let mut ms = Vec::new();
            let mut codes: BTreeMap<u16, usize> = BTreeMap::new();
            while Instant::now() < stop {
                let t = Instant::now();
                let r = c.get(format!("{base}/v1/jobs/{}", uuid::Uuid::now_v7())).send().await;
                ms.push(t.elapsed().as_secs_f64() * 1000.0);
                *codes.entry(r.map(|r| r.status().as_u16()).unwrap_or(0)).or_default() += 1;
                tokio::time::sleep(pause).await;
            }
            (ms, codes)
        }
    };
    let (alone, _) = read_loop(b.clone(), Instant::now() + Duration::from_secs(5), Duration::from_millis(20)).await;
    let stop = Instant::now() + Duration::from_secs(10);
    let attackers: Vec<_> = (0..16).map(|_| tokio::spawn(read_loop(a.clone(), stop, Duration::ZERO))).collect();
    let (beside, b_codes) = read_loop(b.clone(), stop, Duration::from_millis(20)).await;
    let mut a_codes: BTreeMap<u16, usize> = BTreeMap::new();
    for r in futures::future::join_all(attackers).await.into_iter().flatten() {
        for (k, v) in r.1 {
            *a_codes.entry(k).or_default() += v;
        }
    }
    json!({"b_read_p99_ms_alone": quantile(alone, 0.99), "b_read_p99_ms_beside": quantile(beside, 0.99),
           "b_answers": b_codes, "a_answers": a_codes, "a_loops": 16, "seconds": 10})
}

/// Resident set of this process, MB.
fn own_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or_default();
    line.split_whitespace().nth(1).and_then(|kb| kb.parse::<f64>().ok()).map_or(0.0, |kb| kb / 1024.0)
}

/// The fire lags (submission - fire time, ms) of schedule `id`'s jobs submitted in
/// `[from, to)`: a fire's job id is a UUIDv7 of its fire time (`core::recurring`).
fn fire_lags(waits: &Waits, tenant: &str, id: &str, from: i64, to: i64) -> Vec<f64> {
    let m = waits.0.lock().expect("waits");
    m.iter()
        .filter(|(_, s)| s.tenant == tenant && (from..to).contains(&s.submitted_at))
        .filter_map(|(job_id, s)| {
            let (secs, nanos) = uuid::Uuid::parse_str(job_id).ok()?.get_timestamp()?.to_unix();
            let at = (secs * 1000 + u64::from(nanos) / 1_000_000) as i64;
            (fairway::core::recurring::fire_job_id(id, at) == *job_id).then(|| (s.submitted_at - at) as f64)
        })
        .collect()
}

fn lag_json(lags: Vec<f64>) -> Value {
    json!({"fires": lags.len(), "lag_p50_ms": quantile(lags.clone(), 0.5), "lag_p99_ms": quantile(lags, 0.99)})
}

/// A's schedules and debounce windows beside B's schedule (see the module docs).
async fn schedules_attack(cfg: &Arc<fairway::config::Config>, waits: &Waits, n: usize) -> anyhow::Result<Value> {
    use fairway::core::recurring::ScheduleSpec;
    use futures::StreamExt;
    let store = fairway::store::Store::open(cfg).await?;
    let sch = fairway::ops::schedules::Schedules::connect(cfg.clone(), &store).await?;
    let run = now_ms();
    let every = |tenant: &str, name: String, every: &str, payload: Value| ScheduleSpec {
        name,
        tenant: tenant.into(),
        job_type: "echo".into(),
        every: Some(every.into()),
        payload,
        ..Default::default()
    };
    let b = sch.add(every("globex", format!("tick-{run}"), "1s", Value::Null), now_ms()).await?;
    let idle_from = now_ms();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let (rss_idle, idle_to) = (own_rss_mb(), now_ms());
    // The largest payloads allowed: a JSON string of the cap's bytes, quotes included.
    let schedule_payload = json!("x".repeat(cfg.schedules.max_payload_bytes - 2));
    let window_payload = json!("x".repeat(cfg.debounce.max_payload_bytes - 2));
    let added = futures::stream::iter(0..n)
        .map(|i| {
            let spec = every("acme", format!("a{run}-{i}"), "1h", schedule_payload.clone());
            let sch = &sch;
            async move { sch.add(spec, now_ms()).await.is_ok() }
        })
        .buffer_unordered(8)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    let submitter = fairway::submit::Submitter::new(cfg.clone(), Some(store.clone()))?;
    let opened = futures::stream::iter(0..n)
        .map(|i| {
            let job = fairway::submit::NewJob {
                tenant: "acme".into(),
                job_type: "echo".into(),
                payload: fairway::submit::Payload::json(&window_payload),
                debounce_key: Some(format!("w{run}-{i}")),
                debounce_delay: Some("1h".into()),
                ..Default::default()
            };
            let submitter = &submitter;
            async move { submitter.submit(&job).await.is_ok() }
        })
        .buffer_unordered(8)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    let adds_to = now_ms();
    // Fires held back while the adds loaded the store and this process are caught up first.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let loaded_from = now_ms();
    let mut rss_loaded = 0f64;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss_loaded = rss_loaded.max(own_rss_mb());
    }
    let loaded_to = now_ms();
    tokio::time::sleep(Duration::from_secs(3)).await;
    Ok(json!({
        "a_schedules": added, "a_debounce_windows": opened,
        "payload_bytes": cfg.schedules.max_payload_bytes,
        "leader_rss_mb_idle": rss_idle, "leader_rss_mb_loaded_max": rss_loaded,
        "leader_rss_mb_growth": rss_loaded - rss_idle,
        "adds_seconds": (adds_to - idle_to) as f64 / 1000.0,
        "b_idle": lag_json(fire_lags(waits, "globex", &b.id, idle_from, idle_to)),
        "b_during_adds_and_catch_up": lag_json(fire_lags(waits, "globex", &b.id, idle_to, loaded_from)),
        "b_loaded": lag_json(fire_lags(waits, "globex", &b.id, loaded_from, loaded_to)),
    }))
}

pub async fn run(g: &Global, args: BlastArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = (*g.load()?).clone();
    cfg.kafka.topic_prefix = format!("blast{}.", now_ms());
    cfg.scylla.keyspace = "fairway_bench".into();
    cfg.tenants.insert("blastq".into(), toml::from_str("tier = \"pro\"\nmax_queued = 5\n")?);
    // A's schedules in the `schedules` attack (the leader is this process's worker).
    cfg.schedules.max_per_tenant = cfg.schedules.max_per_tenant.max(args.schedules);
    cfg.debounce.max_open_per_tenant = cfg.debounce.max_open_per_tenant.max(args.schedules);
    // The shared-state attacks' job types and flow key, in this process's worker and in serve's.
    let (hooks_base, hooks) = shared::receiver().await?;
    let extra = shared::config_text(&hooks_base);
    let with = fairway::config::Config::parse(&format!("{}{extra}", fairway::config::BUNDLED), "bench blast")?;
    for t in ["hook_dead", "hook_ok"] {
        cfg.job_types.insert(t.into(), with.job_types[t].clone());
    }
    cfg.flow.keys.extend(with.flow.keys.clone());
    let secrets: Vec<(String, String)> = ["acme", "globex"]
        .iter()
        .map(|t| (fairway::config::secret_env_var(t), format!("bench-blast-{}", uuid::Uuid::new_v4().simple())))
        .collect();
    let cfg = Arc::new(cfg);
    fairway::kafka::ensure_topics(&cfg).await?;
    fairway::store::ensure_schema(&cfg).await?;
    fairway::ops::tenants::seed(&cfg).await?;
    let store = fairway::store::Store::open(&cfg).await?;
    let keys = store.key_statements().await?;
    let key = |caller: Caller| {
        let k = fairway::core::auth::new_key(rand::random());
        let keys = keys.clone();
        async move {
            keys.insert(&k.id, &k.hash, &caller, Some("bench blast"), now_ms()).await?;
            anyhow::Ok(k.token)
        }
    };
    let a = client(&key(Caller::Admin).await?, "127.0.0.1")?;
    let a_tenant = client(&key(Caller::Tenant("acme".into())).await?, "127.0.0.1")?;
    let b_key = key(Caller::Tenant("globex".into())).await?;
    let b = client(&b_key, "127.0.0.2")?;
    // B as a client that opens a new connection for each request (as most do after a
    // pause): a kept-alive connection would hold its place through a connection attack.
    let b_fresh =
        client_builder(&b_key, "127.0.0.2")?.pool_max_idle_per_host(0).timeout(Duration::from_secs(10)).build()?;
    let bin = match &args.serve_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?,
    };
    let srv = start_server(&bin, &cfg, &extra, &secrets).await?;
    eprintln!("fairway serve ({}) on {}", bin.display(), srv.base);
    let waits = Waits::follow(&cfg)?;
    let registry = Registry::from_config(&cfg, Default::default()).map_err(anyhow::Error::msg)?;
    let worker = Worker::start(cfg.clone(), &[Pool::Short], registry, Policy::Fair).await?;
    let parties = Parties { a: &a_tenant, b: &b, waits: &waits };
    // Warm up: the worker's consumer group forms (about a second) before
    // any wait is measured.
    let mut warm = Served::default();
    warm.submit(&b, &srv.base, &json!({"job_type": "echo"})).await;
    waits.p99(&warm.ids).await;
    let mut out = json!({"serve_bin": bin.display().to_string()});
    for attack in &args.attacks {
        let v = match attack.as_str() {
            "flood" => batch_flood(&srv, &parties, &args).await,
            "failing" => failing_jobs(&srv, &parties).await,
            "scheduled" => scheduled(&srv, &a).await,
            "streams" => streams(&srv, &a_tenant, &b).await,
            "wide" => wide_bodies(&srv, &a_tenant, &b).await,
            "slow" => slow_connections(&srv, &b_fresh, args.slow_connections).await,
            "reads" => reads(&srv, &a_tenant, &b).await,
            "schedules" => schedules_attack(&cfg, &waits, args.schedules).await?,
            "flows" => shared::flows(&srv, &parties).await,
            "webhooks" => shared::webhooks(&srv, &parties, &hooks).await,
            "timeouts" => shared::timeouts(&srv, &parties).await,
            other => anyhow::bail!(
                "unknown attack {other:?}: flood, failing, scheduled, streams, wide, slow, reads, schedules, flows, webhooks, timeouts"
            ),
        };
        eprintln!("{attack}: {v}");
        out[attack.as_str()] = v;
    }
    worker.stop().await;
    println!("{out}");
    Ok(ExitCode::SUCCESS)
}
