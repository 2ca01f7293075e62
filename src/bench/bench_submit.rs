//! `fairway bench submit`: what watching a job costs at submission. Submits `--jobs`
//! echo jobs, `--concurrency` at a time, through the same `Submitter` twice: without a
//! store (produce only, plus the `queued` event) and with one (the `queued` row written
//! alongside the produce), alternating rounds; prints per-submit latency percentiles and
//! submissions per second of each. No worker runs: this measures the submit path only.
//! Last line JSON.

use super::Global;
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
}

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
    let mut cfg = (*g.load()?).clone();
    cfg.kafka.topic_prefix = format!("submitbench{}.", now_ms());
    cfg.scylla.keyspace = "fairway_bench".into();
    let cfg = Arc::new(cfg);
    fairway::kafka::ensure_topics(&cfg).await?;
    fairway::store::ensure_schema(&cfg).await?;
    fairway::ops::tenants::seed(&cfg).await?;
    let store = Store::open(&cfg).await?;
    let plain = Submitter::new(cfg.clone(), None)?;
    let watched = Submitter::new(cfg.clone(), Some(store))?;
    // Warm up both (connections, prepared statements).
    round(&plain, 200, a.concurrency).await?;
    round(&watched, 200, a.concurrency).await?;
    let (mut p, mut w) = (Vec::new(), Vec::new());
    for _ in 0..a.rounds.max(1) {
        p.push(round(&plain, a.jobs, a.concurrency).await?);
        w.push(round(&watched, a.jobs, a.concurrency).await?);
    }
    let show = |name: &str, rs: &[Round]| {
        for r in rs {
            println!("{name:<22} {:>8.0}/s  p50 {:>6} us  p99 {:>7} us", r.per_s, r.p50_us, r.p99_us);
        }
    };
    show("produce only", &p);
    show("produce + queued row", &w);
    let med = |rs: &[Round], f: fn(&Round) -> f64| {
        let mut v: Vec<f64> = rs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let json = serde_json::json!({
        "jobs": a.jobs, "concurrency": a.concurrency, "rounds": a.rounds,
        "plain_per_s": med(&p, |r| r.per_s), "watched_per_s": med(&w, |r| r.per_s),
        "plain_p50_us": med(&p, |r| r.p50_us as f64), "watched_p50_us": med(&w, |r| r.p50_us as f64),
        "plain_p99_us": med(&p, |r| r.p99_us as f64), "watched_p99_us": med(&w, |r| r.p99_us as f64),
    });
    println!("{json}");
    Ok(ExitCode::SUCCESS)
}
