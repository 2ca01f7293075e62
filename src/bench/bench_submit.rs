//! `fairway-bench bench submit`: the submission paths' rates, no worker running. Alternating
//! rounds of `--jobs` echo jobs each:
//! - `plain` / `watched`: the library's `Submitter`, `--concurrency` submits at a time,
//!   without a store (produce only, plus the `queued` event) and with one (the `queued`
//!   row written alongside the produce): per-submit latency percentiles and rate;
//! - `api`: `POST /v1/jobs:batch` of `--batch` jobs, `--requests` in flight, against the
//!   HTTP API served in this process with API-key authentication and the front door's
//!   admission on (the bench's tenant gets a rate limit above the offered load);
//! - `ndjson`: `fairway submit --ndjson`'s path on a file of the jobs (connect, read,
//!   check, admit all, produce).
//!
//! Last line JSON: each path's median jobs/s (BullMQ's counterpart is `addBulk`'s
//! `enqueue_jobs_per_s` in `../shared/peers/bullmq`).

use super::Global;
use fairway::api::ApiState;
use fairway::config::Config;
use fairway::core::admission::Rate;
use fairway::core::auth::Caller;
use fairway::now_ms;
use fairway::store::Store;
use fairway::submit::{NewJob, Submitter};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct SubmitBenchArgs {
    #[arg(long, default_value_t = 5_000)]
    pub jobs: usize,
    /// Submissions in flight at once.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Rounds of each variant (alternating).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Jobs per `POST /v1/jobs:batch` (at most the API's 1,000).
    #[arg(long, default_value_t = 1_000)]
    pub batch: usize,
    /// Batch requests in flight at once.
    #[arg(long, default_value_t = 4)]
    pub requests: usize,
    /// The paths measured (e.g. `api` alone, to profile it).
    #[arg(long, value_delimiter = ',', default_value = "plain,watched,api,ndjson")]
    pub paths: Vec<SubmitPath>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitPath {
    Plain,
    Watched,
    Api,
    Ndjson,
}

/// The bench's tenant: enterprise, and its submission rate above anything offered here.
const TENANT: &str = "acme";

struct Round {
    per_s: f64,
    p50_us: u64,
    p99_us: u64,
}

async fn round(sub: &Submitter, jobs: usize, concurrency: usize) -> anyhow::Result<Round> {
    use futures::StreamExt;
    let job = NewJob { tenant: "acme".into(), job_type: "echo".into(), ..Default::default() };
    let t0 = Instant::now();
    let lat: Vec<anyhow::Result<Duration>> = futures::stream::iter(0..jobs)
        .map(|_| async {
            let t = Instant::now();
            sub.submit(&job).await?;
            anyhow::Ok(t.elapsed())
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let elapsed = t0.elapsed();
    let mut hist = hdrhistogram::Histogram::<u64>::new(3)?;
    for l in lat {
        hist.record(l?.as_micros() as u64)?;
    }
    Ok(Round {
        per_s: jobs as f64 / elapsed.as_secs_f64(),
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
    })
}

pub async fn run(g: &Global, a: SubmitBenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        (1..=fairway::api::MAX_BATCH_JOBS).contains(&a.batch),
        "--batch must be 1..={}",
        fairway::api::MAX_BATCH_JOBS
    );
    let cfg = bench_config(g)?;
    fairway::kafka::ensure_topics(&cfg).await?;
    fairway::store::ensure_schema(&cfg).await?;
    fairway::ops::tenants::seed(&cfg).await?;
    let store = Store::open(&cfg).await?;
    let plain = Submitter::new(cfg.clone(), None)?;
    let watched = Submitter::new(cfg.clone(), Some(store.clone()))?;
    let api = ApiBench::start(cfg.clone(), &store, &a).await?;

    let ndjson = NdjsonBench::write(a.jobs)?;
    // Warm up every path (connections, prepared statements).
    round(&plain, 200, a.concurrency).await?;
    round(&watched, 200, a.concurrency).await?;
    api.round(a.batch.min(200)).await?;
    let (mut p, mut w, mut h, mut n) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let on = |path| a.paths.contains(&path);
    for _ in 0..a.rounds.max(1) {
        if on(SubmitPath::Plain) {
            p.push(round(&plain, a.jobs, a.concurrency).await?);
        }
        if on(SubmitPath::Watched) {
            w.push(round(&watched, a.jobs, a.concurrency).await?);
        }
        if on(SubmitPath::Api) {
            h.push(api.round(a.jobs).await?);
        }
        if on(SubmitPath::Ndjson) {
            n.push(ndjson.round(&cfg).await?);
        }
    }
    for (name, rs) in [("produce only", &p), ("produce + queued row", &w)] {
        for r in rs {
            println!("{name:<22} {:>8.0}/s  p50 {:>6} us  p99 {:>7} us", r.per_s, r.p50_us, r.p99_us);
        }
    }
    for (name, rs) in [("POST /v1/jobs:batch", &h), ("submit --ndjson", &n)] {
        for r in rs {
            println!("{name:<22} {r:>8.0}/s");
        }
    }
    let json = serde_json::json!({
        "jobs": a.jobs, "concurrency": a.concurrency, "rounds": a.rounds,
        "batch": a.batch, "requests_in_flight": a.requests,
        "plain_per_s": median(p.iter().map(|r| r.per_s)), "watched_per_s": median(w.iter().map(|r| r.per_s)),
        "plain_p50_us": median(p.iter().map(|r| r.p50_us as f64)), "watched_p50_us": median(w.iter().map(|r| r.p50_us as f64)),
        "plain_p99_us": median(p.iter().map(|r| r.p99_us as f64)), "watched_p99_us": median(w.iter().map(|r| r.p99_us as f64)),
        "api_batch_jobs_per_s": median(h.iter().copied()), "api_batch_runs": h,
        "ndjson_jobs_per_s": median(n.iter().copied()), "ndjson_runs": n,
    });
    println!("{json}");
    super::bench::drop_topics(&cfg).await;
    Ok(ExitCode::SUCCESS)
}

fn median(xs: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = xs.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The loaded config, on fresh topics, with the bench tenant's submission rate lifted.
fn bench_config(g: &Global) -> anyhow::Result<Arc<Config>> {
    let mut cfg = (*g.load()?).clone();
    cfg.kafka.topic_prefix = format!("submitbench{}.", now_ms());
    cfg.scylla.keyspace = "fairway_bench".into();
    let tier = cfg.tenants.get(TENANT).map(|t| t.tier).ok_or_else(|| {
        anyhow::anyhow!("the bench submits as tenant {TENANT:?}; add [tenants.{TENANT}] to the config")
    })?;
    cfg.admission.tenant_rate.insert(tier, Rate::per_second(100_000_000));
    Ok(Arc::new(cfg))
}

/// The HTTP API served on a local port, and an API key of the bench tenant.
struct ApiBench {
    url: String,
    token: String,
    client: reqwest::Client,
    requests: usize,
    batch: usize,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl ApiBench {
    async fn start(cfg: Arc<Config>, store: &Store, a: &SubmitBenchArgs) -> anyhow::Result<ApiBench> {
        let key = fairway::core::auth::new_key(rand::random());
        let caller = Caller::Tenant(TENANT.into());
        let keys = store.key_statements().await?;
        anyhow::ensure!(keys.insert(&key.id, &key.hash, &caller, Some("bench"), now_ms()).await?, "API key id taken");
        let state = ApiState::connect(cfg, None).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/v1/jobs:batch", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(fairway::api::serve(listener, state, async move {
            let _ = stopped.await;
        }));
        Ok(ApiBench {
            url,
            token: key.token,
            client: reqwest::Client::new(),
            requests: a.requests.max(1),
            batch: a.batch,
            _stop: stop,
        })
    }

    /// Submits `jobs` echo jobs in batches; jobs/s.
    async fn round(&self, jobs: usize) -> anyhow::Result<f64> {
        use futures::StreamExt;
        let one = serde_json::json!({"tenant": TENANT, "job_type": "echo", "payload": "x"});
        let sizes: Vec<usize> = (0..jobs).step_by(self.batch).map(|i| self.batch.min(jobs - i)).collect();
        let bodies: Vec<String> =
            sizes.iter().map(|n| serde_json::to_string(&vec![&one; *n])).collect::<Result<_, _>>()?;
        let t0 = Instant::now();
        let done: Vec<anyhow::Result<()>> = futures::stream::iter(bodies)
            .map(|body| async move {
                let resp = self
                    .client
                    .post(&self.url)
                    .bearer_auth(&self.token)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await?;
                let status = resp.status();
                anyhow::ensure!(
                    status.as_u16() == 201,
                    "POST /v1/jobs:batch answered {status}: {}",
                    resp.text().await?
                );
                Ok(())
            })
            .buffer_unordered(self.requests)
            .collect()
            .await;
        let elapsed = t0.elapsed();
        done.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
        Ok(jobs as f64 / elapsed.as_secs_f64())
    }
}

/// An NDJSON file of the bench's jobs (removed on drop), submitted as `fairway submit
/// --ndjson` does.
struct NdjsonBench {
    path: std::path::PathBuf,
    jobs: usize,
}

impl Drop for NdjsonBench {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl NdjsonBench {
    fn write(jobs: usize) -> anyhow::Result<NdjsonBench> {
        use std::io::Write;
        let path =
            std::env::temp_dir().join(format!("fairway-bench-submit-{}-{}.ndjson", std::process::id(), now_ms()));
        let bench = NdjsonBench { path, jobs };
        let line = format!("{}\n", serde_json::json!({"tenant": TENANT, "job_type": "echo", "payload": "x"}));
        let mut w = std::io::BufWriter::new(std::fs::File::create(&bench.path)?);
        for _ in 0..jobs {
            w.write_all(line.as_bytes())?;
        }
        w.flush()?;
        Ok(bench)
    }

    /// One `fairway submit --ndjson` run (the job ids it prints are discarded); jobs/s.
    async fn round(&self, cfg: &Arc<Config>) -> anyhow::Result<f64> {
        let reader = Box::new(std::io::BufReader::new(std::fs::File::open(&self.path)?));
        let t0 = Instant::now();
        match super::cli::ops::submit_jobs(cfg, super::cli::ops::Jobs::Ndjson(reader), &mut std::io::sink()).await? {
            super::cli::ops::Submitted::Refused(e) => anyhow::bail!("the front door refused the NDJSON jobs: {e:#}"),
            super::cli::ops::Submitted::Done { failed: 0 } => Ok(self.jobs as f64 / t0.elapsed().as_secs_f64()),
            super::cli::ops::Submitted::Done { failed } => anyhow::bail!("{failed} NDJSON jobs could not be produced"),
        }
    }
}
