//! `fairway-bench bench slo`: the open-loop benchmark. No-op jobs arrive at a fixed rate (in
//! 10 ms ticks, each tick's jobs submitted without waiting for earlier ticks' acks), one
//! rate after another on one running deployment; for each rate the p50/p99 wait from
//! submission to first dispatch (`started_at - submitted_at` of the results) and from
//! submission to result, and `max_rate_within_slo`: the highest rate whose p99 dispatch
//! wait stays under `--slo` with every job finished. The shape of the BullMQ harness's
//! `SLO=1` mode, so the two can be run alternately. Each rate also reports the p99 wait
//! per tenant (`wait_p99_ms_by_tenant`): when the workers fall behind the offered rate,
//! the lowest-weight tenant takes the deficit (free tenants share one weight), so the
//! overall p99 is then that tenant's. Delayed jobs' lateness (the harness's `DELAYED=1`):
//! `bench delayed`. Last line JSON.

use super::bench::{bench_config, start_workers, Shape};
use super::Global;
use anyhow::Context;
use fairway::codec;
use fairway::kafka::{self, Consumer, Message};
use fairway::model::Millis;
use fairway::submit::{NewJob, Submitter};
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Submission ticks whose jobs may still be unacknowledged: past this the arrival
/// schedule slips (reported as a lower `offered_per_s`) instead of memory growing.
const TICKS_IN_FLIGHT: usize = 200;
const TICK: Duration = Duration::from_millis(10);
/// Seconds of a run reported one by one (`wait_p99_ms_per_second`); later ones only count
/// in the totals.
const MAX_SECONDS: usize = 600;
/// Tenants whose wait is reported one by one (`wait_p99_ms_by_tenant`); the bench's own
/// tenants are the configured ones, far fewer.
const MAX_TENANTS: usize = 64;

#[derive(clap::Args, Debug)]
pub struct SloArgs {
    /// Arrival rates to try in turn, jobs per second.
    #[arg(long, value_delimiter = ',', default_value = "2000,5000,10000,15000,20000")]
    pub rates: Vec<u32>,
    /// How long jobs arrive at each rate.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub secs: Duration,
    /// The objective: p99 submission-to-first-dispatch under this.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub slo: Duration,
    #[command(flatten)]
    pub shape: Shape,
    /// After the last arrival of a rate, how long to wait for its jobs' results.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub drain: Duration,
}

/// One rate's offer: how many jobs a second, for how long, how far ahead each is due.
#[derive(Clone, Copy)]
pub(super) struct Offer {
    pub rate: u32,
    pub secs: Duration,
    pub delay_ms: Option<Millis>,
}

/// One rate's run.
#[derive(serde::Serialize, Debug)]
pub(super) struct RateRun {
    rate: u32,
    offered_per_s: f64,
    of: usize,
    /// Distinct job ids the submissions answered with.
    accepted: usize,
    done: usize,
    submit_errors: usize,
    wait_p50_ms: u64,
    wait_p99_ms: u64,
    result_p50_ms: u64,
    result_p99_ms: u64,
    /// The p99 dispatch wait of the jobs submitted in each second of the run, in order:
    /// shows whether a missed objective is one stall or a sustained queue.
    wait_p99_ms_per_second: Vec<u64>,
    /// The p99 dispatch wait of each tenant's jobs (the first [`MAX_TENANTS`] tenants seen).
    wait_p99_ms_by_tenant: std::collections::BTreeMap<String, u64>,
}

/// Dispatch waits per tenant, for at most [`MAX_TENANTS`] tenants.
#[derive(Default)]
struct ByTenant(HashMap<String, hdrhistogram::Histogram<u64>>);

impl ByTenant {
    fn record(&mut self, tenant: &str, waited_ms: u64) {
        if !self.0.contains_key(tenant) && self.0.len() >= MAX_TENANTS {
            return;
        }
        let h = self.0.entry(tenant.to_owned()).or_insert_with(|| hdrhistogram::Histogram::new(3).expect("histogram"));
        let _ = h.record(waited_ms);
    }

    fn p99s(&self) -> std::collections::BTreeMap<String, u64> {
        self.0.iter().map(|(t, h)| (t.clone(), h.value_at_quantile(0.99))).collect()
    }
}

pub async fn run(g: &Global, a: SloArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !a.rates.is_empty() && a.rates.iter().all(|r| *r > 0),
        "--rates: list rates above 0, e.g. 2000,5000"
    );
    let cfg = bench_config(g, &a.shape)?;
    let rig = Rig::start(&cfg, a.shape.workers).await?;
    let mut runs = Vec::new();
    for &rate in &a.rates {
        let arrivals = arrive(&rig.sub, &rig.tenants, Offer { rate, secs: a.secs, delay_ms: None }).await;
        let run = collect(&rig.reader, rate, arrivals, a.drain).await;
        eprintln!("slo: {}", serde_json::to_string(&run)?);
        runs.push(run);
    }
    rig.stop().await;
    super::bench::drop_topics(&cfg).await;
    let slo_ms = a.slo.as_millis() as u64;
    let within = runs.iter().filter(|r| r.done == r.of && r.wait_p99_ms < slo_ms).map(|r| r.rate).max().unwrap_or(0);
    println!(
        "{}",
        serde_json::json!({
            "bench": "fairway-open-loop", "slo_ms": slo_ms, "secs": a.secs.as_secs_f64(),
            "workers": a.shape.workers, "slots": a.shape.slots, "partitions": a.shape.partitions,
            "max_rate_within_slo": within, "runs": runs,
        })
    );
    Ok(ExitCode::SUCCESS)
}

/// A running deployment on fresh topics: in-process workers, a submitter and a reader of
/// the results topic.
pub(super) struct Rig {
    pub reader: kafka::Reader,
    pub sub: Arc<Submitter>,
    pub tenants: Arc<Vec<String>>,
    workers: Vec<fairway::worker::Worker>,
}

impl Rig {
    pub async fn start(cfg: &Arc<fairway::config::Config>, workers: usize) -> anyhow::Result<Rig> {
        kafka::ensure_topics(cfg).await.context("creating bench topics (scripts/services up?)")?;
        fairway::store::ensure_schema(cfg).await?;
        fairway::ops::tenants::seed(cfg).await?;
        let reader = kafka::reader(cfg, &cfg.group("bench-slo-results"), false)?;
        reader.subscribe(&[&cfg.results_topic()])?;
        let sub = Arc::new(Submitter::new(cfg.clone(), None)?);
        let workers = start_workers(cfg, workers).await?;
        let tenants = Arc::new(cfg.tenants.keys().cloned().collect());
        Ok(Rig { reader, sub, tenants, workers })
    }

    pub async fn stop(self) {
        for w in self.workers {
            w.stop().await;
        }
    }
}

/// What one rate's arrivals produced: the ids accepted (with the time each was due to
/// run, if delayed), failures, and the real rate.
pub(super) struct Arrivals {
    ids: HashMap<String, Option<Millis>>,
    of: usize,
    errors: usize,
    offered_per_s: f64,
    /// Wall clock (ms since the epoch) when the first job was submitted.
    first_submitted_ms: i64,
}

/// Submits `rate * secs` no-op jobs in 10 ms ticks, round-robin over the tenants; each
/// tick's jobs go out as one task, so a slow acknowledgement never delays the next tick
/// (up to [`TICKS_IN_FLIGHT`]).
pub(super) async fn arrive(sub: &Arc<Submitter>, tenants: &Arc<Vec<String>>, offer: Offer) -> Arrivals {
    let Offer { rate, secs, delay_ms } = offer;
    let total = (f64::from(rate) * secs.as_secs_f64()).round() as usize;
    let per_tick = f64::from(rate) * TICK.as_secs_f64();
    let gate = Arc::new(tokio::sync::Semaphore::new(TICKS_IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    let t0 = Instant::now();
    let first_submitted_ms = fairway::now_ms();
    let mut sent = 0usize;
    while sent < total {
        let ticks = (t0.elapsed().as_secs_f64() / TICK.as_secs_f64()).floor() + 1.0;
        let due = ((ticks * per_tick).round() as usize).min(total);
        if due > sent {
            let permit = gate.clone().acquire_owned().await.expect("semaphore open");
            let (sub, tenants, range) = (sub.clone(), tenants.clone(), sent..due);
            tasks.spawn(async move {
                let execute_at = delay_ms.map(|d| fairway::now_ms() + d);
                let jobs: Vec<NewJob> = range
                    .map(|i| NewJob {
                        tenant: tenants[i % tenants.len()].clone(),
                        job_type: "echo".into(),
                        execute_at,
                        ..Default::default()
                    })
                    .collect();
                let out = futures::future::join_all(jobs.iter().map(|j| sub.submit(j))).await;
                drop(permit);
                out.into_iter().map(|r| r.map(|s| (s.job_id, execute_at))).collect::<Vec<_>>()
            });
            sent = due;
        }
        let next = t0 + TICK.mul_f64(ticks);
        tokio::time::sleep_until(next.into()).await;
    }
    let offered_per_s = total as f64 / t0.elapsed().as_secs_f64();
    let mut arrivals = Arrivals { ids: HashMap::new(), of: total, errors: 0, offered_per_s, first_submitted_ms };
    while let Some(done) = tasks.join_next().await {
        for r in done.unwrap_or_default() {
            match r {
                Ok((id, due)) => {
                    arrivals.ids.insert(id, due);
                }
                Err(_) => arrivals.errors += 1,
            }
        }
    }
    arrivals
}

/// Reads results until every accepted job of this rate finished or `drain` passed.
pub(super) async fn collect(reader: &kafka::Reader, rate: u32, mut arrivals: Arrivals, drain: Duration) -> RateRun {
    let mut wait = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let mut result = wait.clone();
    let mut per_second: Vec<hdrhistogram::Histogram<u64>> = Vec::new();
    let mut by_tenant = ByTenant::default();
    let first = arrivals.first_submitted_ms;
    let accepted = arrivals.ids.len();
    let deadline = Instant::now() + drain;
    let mut done = 0;
    while !arrivals.ids.is_empty() && Instant::now() < deadline {
        let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), reader.recv()).await else { continue };
        let Some(r) = m.payload().and_then(|b| codec::decode_result(b).ok()) else { continue };
        if let Some(due) = arrivals.ids.remove(&r.job_id) {
            done += 1;
            let started = r.started_at.unwrap_or(r.finished_at);
            let waited = (started - due.unwrap_or(r.submitted_at)).max(0) as u64;
            let _ = wait.record(waited);
            by_tenant.record(&r.tenant, waited);
            let second = ((r.submitted_at - first).max(0) / 1000) as usize;
            if second < MAX_SECONDS {
                if per_second.len() <= second {
                    per_second.resize(second + 1, hdrhistogram::Histogram::new_from(&wait));
                }
                let _ = per_second[second].record(waited);
            }
            let _ = result.record((r.finished_at - r.submitted_at).max(0) as u64);
        }
    }
    RateRun {
        rate,
        offered_per_s: arrivals.offered_per_s.round(),
        of: arrivals.of,
        accepted,
        done,
        submit_errors: arrivals.errors,
        wait_p50_ms: wait.value_at_quantile(0.5),
        wait_p99_ms: wait.value_at_quantile(0.99),
        result_p50_ms: result.value_at_quantile(0.5),
        result_p99_ms: result.value_at_quantile(0.99),
        wait_p99_ms_per_second: per_second.iter().map(|h| h.value_at_quantile(0.99)).collect(),
        wait_p99_ms_by_tenant: by_tenant.p99s(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_gets_its_own_p99() {
        let mut b = ByTenant::default();
        for ms in 1..=100 {
            b.record("paid", ms);
            b.record("free", ms * 100);
        }
        let p99s = b.p99s();
        assert_eq!(p99s.len(), 2);
        assert!((99..=100).contains(&p99s["paid"]), "{p99s:?}");
        assert!((9_900..=10_000).contains(&p99s["free"]), "{p99s:?}");
    }

    #[test]
    fn tenants_past_the_cap_are_left_out_but_known_ones_still_count() {
        let mut b = ByTenant::default();
        for t in 0..MAX_TENANTS + 10 {
            b.record(&format!("t{t}"), 1);
        }
        b.record("t0", 5_000);
        let p99s = b.p99s();
        assert_eq!(p99s.len(), MAX_TENANTS);
        assert!(!p99s.contains_key(&format!("t{}", MAX_TENANTS)));
        assert!(p99s["t0"] >= 4_990, "{p99s:?}");
    }
}
