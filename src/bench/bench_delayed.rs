//! `fairway-bench bench delayed`: delayed and scheduled jobs on time.
//! - **Delayed jobs** (the shape of the BullMQ harness's `DELAYED=1` mode): jobs arrive at
//!   each of `--rates` for `--secs`, each with `execute_at` = submission + `--delay`;
//!   **lateness** = run start - `execute_at`, p50/p99 and per second.
//! - **Schedules**: `--schedules` schedules every `--every` (1 s) over the configured
//!   tenants, fired by the in-process worker holding the promoter's lease; for the fires
//!   due in a `--schedule-secs` window, **fire lag** = run start - fire time (a fire's job
//!   id derives from (schedule id, fire time), `core::recurring::fire_job_id`), and the
//!   fires that never ran. The schedules are removed at the end. Every tier's submission
//!   rate is raised above the offered load (fires go through their tenant's front door).
//!
//! Last line JSON.

use super::bench::{bench_config, Shape};
use super::bench_slo::{arrive, collect, Offer, Rig};
use super::Global;
use fairway::codec;
use fairway::core::recurring::{fire_job_id, ScheduleSpec};
use fairway::kafka::Message;
use fairway::model::Millis;
use fairway::now_ms;
use fairway::ops::schedules::Schedules;
use futures::StreamExt;
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct DelayedArgs {
    /// Arrival rates of delayed jobs to try in turn, jobs per second.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
    pub rates: Vec<u32>,
    /// How long delayed jobs arrive at each rate.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub secs: Duration,
    /// Each job runs this long after its submission (`execute_at`).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub delay: Duration,
    #[command(flatten)]
    pub shape: Shape,
    /// After the last arrival of a rate, how long to wait for its jobs' results.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub drain: Duration,
    /// Schedules firing at once (0: no schedules phase).
    #[arg(long, default_value_t = 1_000)]
    pub schedules: usize,
    /// Each schedule's period.
    #[arg(long, default_value = "1s")]
    pub every: String,
    /// The window of fire times measured (after a 3 s warm-up from the last add).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub schedule_secs: Duration,
}

/// Fires in flight at once while the schedules are added and removed.
const ADDS_IN_FLIGHT: usize = 16;
/// Fire times from the last add on that are not measured (the first passes).
const WARM_UP: Duration = Duration::from_secs(3);
/// How long to wait for the measured fires' results after the window's end.
const FIRES_DRAIN: Duration = Duration::from_secs(30);

pub async fn run(g: &Global, a: DelayedArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(a.rates.iter().all(|r| *r > 0), "--rates: list rates above 0, e.g. 1000,5000");
    let mut cfg = (*bench_config(g, &a.shape)?).clone();
    let tenants = cfg.tenants.len().max(1);
    cfg.schedules.max_per_tenant = cfg.schedules.max_per_tenant.max(a.schedules.div_ceil(tenants));
    // A fire goes through its tenant's front door: with the tiers' default rates (100/s
    // for standard) the bench measured those limits, not the promoter (a fifth of the
    // fires held, lag p99 20 s). Every tier's rate above anything offered here.
    for tier in fairway::config::Tier::ALL {
        cfg.admission.tenant_rate.insert(tier, fairway::core::admission::Rate::per_second(100_000_000));
    }
    let cfg = Arc::new(cfg);
    let rig = Rig::start(&cfg, a.shape.workers).await?;
    let delay_ms = Some(a.delay.as_millis() as Millis);
    let mut runs = Vec::new();
    for &rate in &a.rates {
        let arrivals = arrive(&rig.sub, &rig.tenants, Offer { rate, secs: a.secs, delay_ms }).await;
        let run = collect(&rig.reader, rate, arrivals, a.drain).await;
        eprintln!("delayed: {}", serde_json::to_string(&run)?);
        runs.push(run);
    }
    let fires = if a.schedules > 0 { Some(schedules_phase(&cfg, &rig, &a).await?) } else { None };
    rig.stop().await;
    super::bench::drop_topics(&cfg).await;
    println!(
        "{}",
        serde_json::json!({
            "bench": "fairway-delayed", "delay_ms": a.delay.as_millis() as u64, "secs": a.secs.as_secs_f64(),
            "workers": a.shape.workers, "slots": a.shape.slots, "partitions": a.shape.partitions,
            "runs": runs, "schedules": fires,
        })
    );
    Ok(ExitCode::SUCCESS)
}

/// Adds the schedules, measures the fire lag of the fires due in the window, removes them.
async fn schedules_phase(
    cfg: &Arc<fairway::config::Config>,
    rig: &Rig,
    a: &DelayedArgs,
) -> anyhow::Result<serde_json::Value> {
    let store = fairway::store::Store::open(cfg).await?;
    let sch = Schedules::connect(cfg.clone(), &store).await?;
    let run = now_ms();
    let specs: Vec<ScheduleSpec> = (0..a.schedules)
        .map(|i| ScheduleSpec {
            name: format!("d{run}-{i}"),
            tenant: rig.tenants[i % rig.tenants.len()].clone(),
            job_type: "echo".into(),
            every: Some(a.every.clone()),
            ..Default::default()
        })
        .collect();
    let t0 = Instant::now();
    let added: Vec<_> = futures::stream::iter(specs.iter().cloned())
        .map(|spec| {
            let sch = &sch;
            async move { sch.add(spec, now_ms()).await }
        })
        .buffer_unordered(ADDS_IN_FLIGHT)
        .collect()
        .await;
    let add_secs = t0.elapsed().as_secs_f64();
    let listed: Vec<_> = added.into_iter().collect::<Result<_, _>>()?;
    let from = now_ms() + WARM_UP.as_millis() as Millis;
    let to = from + a.schedule_secs.as_millis() as Millis;
    let mut expected = expected_fires(&listed, from, to)?;
    let of = expected.len();
    let lags = read_fires(&rig.reader, &mut expected, to).await;
    let removed = futures::stream::iter(specs.iter())
        .map(|s| {
            let sch = &sch;
            async move { sch.remove(&s.tenant, &s.name).await.is_ok() }
        })
        .buffer_unordered(ADDS_IN_FLIGHT)
        .filter(|ok| std::future::ready(*ok))
        .count()
        .await;
    let mut sorted = lags.clone();
    sorted.sort_unstable();
    let q = |p: f64| sorted.get(((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1)).copied();
    Ok(serde_json::json!({
        "schedules": a.schedules, "every": a.every, "add_secs": add_secs, "removed": removed,
        "window_secs": a.schedule_secs.as_secs_f64(), "fires_due": of, "fires_ran": lags.len(),
        "fires_missing": expected.len(),
        "lag_p50_ms": q(0.5), "lag_p99_ms": q(0.99), "lag_max_ms": sorted.last(),
    }))
}

/// The job ids of every fire of `listed` due in `[from, to)`, with their fire times.
fn expected_fires(
    listed: &[fairway::ops::schedules::Listed],
    from: Millis,
    to: Millis,
) -> anyhow::Result<HashMap<String, Millis>> {
    let mut out = HashMap::new();
    for l in listed {
        let timing =
            l.spec.timing(&l.id, l.created_at).map_err(|e| anyhow::anyhow!("schedule {}: {e}", l.spec.name))?;
        let mut at = timing.next_after(from - 1);
        while let Some(t) = at.filter(|t| *t < to) {
            out.insert(fire_job_id(&l.id, t), t);
            at = timing.next_after(t);
        }
    }
    Ok(out)
}

/// Reads results until every expected fire ran or [`FIRES_DRAIN`] after `to`; the lags
/// (run start - fire time, ms) of those that ran, removed from `expected`.
async fn read_fires(reader: &fairway::kafka::Reader, expected: &mut HashMap<String, Millis>, to: Millis) -> Vec<u64> {
    let deadline = to + FIRES_DRAIN.as_millis() as Millis;
    let mut lags = Vec::with_capacity(expected.len());
    while !expected.is_empty() && now_ms() < deadline {
        let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), reader.recv()).await else { continue };
        let Some(r) = m.payload().and_then(|b| codec::decode_result(b).ok()) else { continue };
        if let Some(at) = expected.remove(&r.job_id) {
            lags.push((r.started_at.unwrap_or(r.finished_at) - at).max(0) as u64);
        }
    }
    lags
}
