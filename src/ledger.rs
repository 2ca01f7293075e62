//! The usage ledger: what each tenant used, per 15-minute window, from the results topic
//! (rules: `core::ledger`; statements: `store::ledger`; docs/usage.md).
//!
//! One `fairway serve` process at a time holds the `ledger` lease and reads every
//! partition of the results topic by assignment, each from its current window's first
//! offset (`ledger_positions`; the log's start the first time). It tallies each result to
//! its account (tenant, pool, job type), writes the changed totals every [`FLUSH`] and
//! whenever a window closes, then the partition's resume position. A leader that stops
//! (deploy, crash, lost lease) costs nothing but time: the next one re-reads the open
//! windows, and its totals overwrite equal or shorter ones (`core::ledger`), so every
//! result is counted once.
//!
//! The leader also evaluates tenant-facing alerts from the results it reads ([`alerts`],
//! rules `core::alerts`, every `alerts.period`), and steps the fleet-wide dependency
//! breakers every second ([`dependencies`], rules `core::dependency`).
//!
//! Bounds: the leader holds, per partition, the accounts seen in the open window (one
//! entry per tenant, pool and job type); a flush writes one row per changed account.

use crate::config::Config;
use crate::core::bounds::Period;
use crate::core::ledger::{
    self as rules, ChartPoint, DayWeights, FleetRow, Flush, Granularity, PartitionTally, ReportLine, RowBudget, Usage,
    Weighed,
};
use crate::core::scheduler::{Tier, TierWeights};
use crate::core::tenants::TenantRecord;
use crate::kafka::{self, Message};
use crate::model::Millis;
use crate::store::{LedgerPosition, LedgerReadError, LedgerStatements, Store, StoreError};
use crate::{codec, metrics as m, now_ms};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

mod alerts;
mod dependencies;

/// The lease one `fairway serve` holds while it writes the ledger.
pub const LEASE: &str = "ledger";
const LEASE_SECS: i32 = 15;
/// How often the leader writes changed totals (and renews its lease).
pub const FLUSH: Duration = Duration::from_secs(5);
/// A leader whose renewals fail stops leading this long after the last one that
/// landed: the lease (`LEASE_SECS`) is surely still its own until then.
const RENEW_WITHIN: Duration = Duration::from_secs(LEASE_SECS as u64 - FLUSH.as_secs() - 1);
/// How often the leader asks the broker for the partitions' ends to report its lag.
pub const LAG_EVERY: Duration = Duration::from_secs(30);
pub use crate::core::ledger::MAX_REPORT_DAYS;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Kafka(String),
    #[error("{0}")]
    Alerts(String),
}

/// Runs the ledger until `stop` turns true: waits for the lease, leads while it holds it.
pub async fn run(cfg: Arc<Config>, store: Store, stop: watch::Receiver<bool>) -> Result<(), LedgerError> {
    run_telling(cfg, store, stop, watch::channel(false).0).await
}

/// As [`run`], telling on `leading` when this process leads: true once it reads the
/// results and steps the dependency breakers, false when it stops leading.
pub async fn run_telling(
    cfg: Arc<Config>,
    store: Store,
    mut stop: watch::Receiver<bool>,
    leading: watch::Sender<bool>,
) -> Result<(), LedgerError> {
    let stmts = store.ledger_statements().await?;
    let holder = format!("ledger-{}", uuid::Uuid::new_v4().simple());
    loop {
        if *stop.borrow() {
            return Ok(());
        }
        match store.lease(LEASE, &holder, LEASE_SECS, now_ms()).await {
            Ok(true) => {
                metrics::gauge!(m::LEDGER_LEADER).set(1.0);
                let led = Leader { cfg: &cfg, store: &store, stmts: &stmts, holder: &holder, leading: &leading };
                if let Err(e) = led.lead(stop.clone()).await {
                    tracing::warn!(error = %e, "usage ledger: leading stopped; trying again");
                }
                leading.send_replace(false);
                metrics::gauge!(m::LEDGER_LEADER).set(0.0);
            }
            Ok(false) => {}
            Err(e) => tracing::debug!(error = %e, "usage ledger: cannot take the lease"),
        }
        tokio::select! {
            _ = stop.changed() => {}
            _ = tokio::time::sleep(Duration::from_secs((LEASE_SECS / 3) as u64)) => {}
        }
    }
}

struct Leader<'a> {
    cfg: &'a Arc<Config>,
    store: &'a Store,
    stmts: &'a LedgerStatements,
    holder: &'a str,
    leading: &'a watch::Sender<bool>,
}

/// One partition being read: its tally and the position last written.
struct Reading {
    tally: PartitionTally,
    written: Option<LedgerPosition>,
}

impl Leader<'_> {
    /// Reads the results topic from the recorded positions until the lease is lost or `stop`.
    async fn lead(&self, mut stop: watch::Receiver<bool>) -> Result<(), LedgerError> {
        let topic = self.cfg.results_topic();
        let reader =
            kafka::reader(self.cfg, &self.cfg.group("ledger"), false).map_err(|e| LedgerError::Kafka(e.to_string()))?;
        let reader = Arc::new(reader);
        let ends = kafka::partition_ends(reader.clone(), topic.clone())
            .await
            .map_err(|e| LedgerError::Kafka(format!("results topic {topic}: {e}")))?;
        let positions: HashMap<i32, LedgerPosition> =
            self.stmts.positions(&topic).await?.into_iter().map(|p| (p.partition, p)).collect();
        let mut reading = HashMap::new();
        let mut starts = Vec::new();
        // Per partition, the offset earlier leaders read up to: alerts count only past it.
        let read_to: HashMap<i32, i64> = positions.iter().map(|(p, x)| (*p, x.next)).collect();
        for (p, _) in &ends {
            let start = positions.get(p).map(|x| x.first);
            starts.push((*p, start));
            let tally = PartitionTally::starting_at(start.unwrap_or(0));
            reading.insert(*p, Reading { tally, written: positions.get(p).copied() });
        }
        kafka::assign_from(&reader, &topic, &starts).map_err(|e| LedgerError::Kafka(e.to_string()))?;
        let mut alerting = alerts::Alerting::start(self.cfg, self.store, stop.clone()).await?;
        let mut period = tokio::time::interval(std::time::Duration::from_millis(self.cfg.alerts.period.0 as u64));
        period.tick().await;
        let mut deps = dependencies::Dependencies::start(self.cfg, self.store).await?;
        let mut deps_tick = tokio::time::interval(dependencies::STEP);
        deps_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tracing::info!(partitions = ends.len(), "usage ledger: leading");
        self.leading.send_replace(true);
        let ttl = ttl_secs(self.cfg);
        let mut tick = tokio::time::interval(FLUSH);
        let mut renewed = tokio::time::Instant::now();
        let mut lag_tick = tokio::time::interval(LAG_EVERY);
        loop {
            tokio::select! {
                _ = stop.changed() => {
                    self.flush_all(&topic, &mut reading, ttl).await;
                    let _ = self.store.release_lease(LEASE, self.holder).await;
                    return Ok(());
                }
                _ = tick.tick() => {
                    self.flush_all(&topic, &mut reading, ttl).await;
                    match self.store.lease(LEASE, self.holder, LEASE_SECS, now_ms()).await {
                        Ok(true) => renewed = tokio::time::Instant::now(),
                        Ok(false) => return Err(LedgerError::Kafka("the ledger lease was lost".into())),
                        // A renewal that timed out may have landed: lead on while the
                        // last one that did is surely still held.
                        Err(e) if renewed.elapsed() < RENEW_WITHIN => {
                            tracing::warn!(error = %e, "usage ledger: cannot renew the lease; leading on until it may lapse");
                        }
                        Err(e) => return Err(LedgerError::Store(e)),
                    }
                }
                _ = lag_tick.tick() => self.report_lag(&reader, &topic, &reading).await,
                _ = period.tick() => alerting.evaluate(now_ms()).await,
                _ = deps_tick.tick(), if deps.is_some() => {
                    if let Some(d) = deps.as_mut() {
                        d.step(&mut alerting, now_ms()).await;
                    }
                }
                msg = reader.recv() => {
                    let msg = msg.map_err(|e| LedgerError::Kafka(e.to_string()))?;
                    let Some(r) = reading.get_mut(&msg.partition()) else { continue };
                    let result = msg.payload().and_then(|b| codec::decode_result(b).ok());
                    if result.is_none() {
                        metrics::counter!(m::LEDGER_UNDECODABLE).increment(1);
                    } else {
                        metrics::counter!(m::LEDGER_RESULTS).increment(1);
                    }
                    let ts = msg.timestamp().to_millis().unwrap_or(Millis::MIN);
                    let read = read_to.get(&msg.partition()).copied().unwrap_or(0);
                    if let Some(r) = result.as_ref().filter(|_| crate::core::alerts::unread_by_an_earlier_leader(msg.offset(), read)) {
                        alerting.observe(r, ts);
                    }
                    if let Some(closed) = r.tally.observe(msg.offset(), ts, result.as_ref()) {
                        if !self.write(msg.partition(), &closed, ttl, &stop).await {
                            // Stopping with a closed window unwritten: no position may move past it.
                            return Ok(());
                        }
                    }
                }
            }
        }
    }

    /// Writes a flush, retrying until it lands (or `stop`): a closed window must be in the
    /// store before the position may move past it.
    async fn write(&self, part: i32, f: &Flush, ttl: i32, stop: &watch::Receiver<bool>) -> bool {
        let mut delay = Duration::from_millis(200);
        loop {
            match self.stmts.put_flush(part, f, ttl).await {
                Ok(()) => return true,
                Err(e) => {
                    metrics::counter!(m::LEDGER_WRITE_FAILURES).increment(1);
                    tracing::warn!(error = %e, partition = part, "usage ledger: cannot write totals; retrying");
                    if *stop.borrow() {
                        return false;
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// Writes every partition's changed totals, then the positions that moved.
    async fn flush_all(&self, topic: &str, reading: &mut HashMap<i32, Reading>, ttl: i32) {
        for (part, r) in reading.iter_mut() {
            if let Some(f) = r.tally.pending() {
                if let Err(e) = self.stmts.put_flush(*part, &f, ttl).await {
                    metrics::counter!(m::LEDGER_WRITE_FAILURES).increment(1);
                    tracing::warn!(error = %e, partition = part, "usage ledger: cannot write totals; the next flush retries");
                    // Not written: the totals stay pending through the next flush.
                    r.tally.unflushed(f);
                    continue;
                }
            }
            let (_, first) = r.tally.resume_point();
            let pos = LedgerPosition { partition: *part, first, next: r.tally.next() };
            if r.written != Some(pos) && self.stmts.put_position(topic, &pos, now_ms()).await.is_ok() {
                r.written = Some(pos);
            }
        }
    }

    /// Sets the lag gauge: results published and not yet tallied, over all partitions.
    async fn report_lag(&self, reader: &Arc<kafka::Reader>, topic: &str, reading: &HashMap<i32, Reading>) {
        let Ok(ends) = kafka::partition_ends(reader.clone(), topic.to_string()).await else { return };
        let lag: i64 =
            ends.iter().map(|(p, hw)| reading.get(p).map(|r| (hw - r.tally.next()).max(0)).unwrap_or(0)).sum();
        metrics::gauge!(m::LEDGER_LAG).set(lag as f64);
    }
}

fn ttl_secs(cfg: &Config) -> i32 {
    cfg.retention.ledger.as_secs().clamp(3600, 20 * 365 * 86_400) as i32
}

/// A usage report's question: whose, which period (checked: `core::ledger::report_period`),
/// how fine.
#[derive(Clone, Debug)]
pub struct ReportQuery {
    pub tenant: String,
    pub period: Period,
    pub granularity: Granularity,
}

/// One tenant's usage per period (store reads: one partition per day of the period, at
/// most `budget`'s rows in all; each day's rows are summed into its lines as read, so
/// what is held is one day's rows and the lines).
pub async fn report(
    stmts: &LedgerStatements,
    q: &ReportQuery,
    budget: &mut RowBudget,
) -> Result<Vec<ReportLine>, LedgerReadError> {
    let mut lines = Vec::new();
    for day in rules::days(&q.period) {
        let rows = stmts.rows_within(&q.tenant, day, budget).await?;
        lines.extend(rules::report(&rows, q.granularity, q.period.from(), q.period.to()));
    }
    Ok(lines)
}

/// Tenants' days an export reads at once.
pub const EXPORT_CONCURRENCY: usize = 32;

/// Every tenant's usage on the day starting at `day`, for a billing export: a stream of
/// lines, [`EXPORT_CONCURRENCY`] tenants' days at a time in the index's order, so an
/// export holds one chunk of tenants' rows at once (and the day's tenant names), never a
/// day or a month of every tenant's; each tenant's day is read within `rows_per_tenant`
/// rows (past it the stream ends with the error).
pub fn export_day(
    stmts: LedgerStatements,
    day: Millis,
    g: Granularity,
    rows_per_tenant: u64,
) -> impl futures::Stream<Item = Result<Vec<ReportLine>, LedgerReadError>> + Send + 'static {
    use futures::{StreamExt, TryStreamExt};
    futures::stream::once(async move {
        let tenants = stmts.tenants(day).await?;
        let chunks: Vec<Vec<String>> = tenants.chunks(EXPORT_CONCURRENCY).map(<[String]>::to_vec).collect();
        Ok::<_, LedgerReadError>(futures::stream::iter(chunks).then(move |chunk| {
            let stmts = stmts.clone();
            async move {
                let days = futures::future::try_join_all(chunk.iter().map(|t| {
                    let stmts = &stmts;
                    async move { stmts.rows_within(t, day, &mut RowBudget::new(rows_per_tenant)).await }
                }))
                .await?;
                Ok(days.iter().flat_map(|rows| rules::report(rows, g, day, day + 86_400_000)).collect())
            }
        }))
    })
    .try_flatten()
}

/// Days a tenant's charts read: the 30-day chart's (the 24-hour chart's are among them).
pub const CHART_DAYS: i64 = 30;
/// Tenants the overview's top-tenants chart reads per day at most (in the index's order).
pub const TOP_SCAN_TENANTS: usize = 1000;

/// A tenant's charts' data: the last 24 hours and the last 30 days.
#[derive(Clone, Debug, Default)]
pub struct TenantCharts {
    pub hours: Vec<ChartPoint>,
    pub days: Vec<ChartPoint>,
    /// Finished and dead-lettered per job type: the last 24 hours, the last 30 days.
    pub types_24h: Vec<rules::TypeOutcomes>,
    pub types_30d: Vec<rules::TypeOutcomes>,
}

/// Whose charts, weighed how, and when.
pub struct ChartsQuery<'a> {
    pub tenant: &'a str,
    /// The registry (tiers and weights); tenants missing from it have `default_tier`.
    pub registry: &'a BTreeMap<String, TenantRecord>,
    pub default_tier: Tier,
    pub now: Millis,
}

fn weighed(name: &str, registry: &BTreeMap<String, TenantRecord>, default_tier: Tier) -> Weighed {
    let rec = registry.get(name);
    Weighed { tenant: name.to_string(), tier: rec.map_or(default_tier, |r| r.tier), weight: rec.and_then(|r| r.weight) }
}

/// The fleet's side of one day, folded once for every tenant's page: the fleet's run
/// time per window (at most 96 windows) and the weights of the day's active tenants.
#[derive(Clone, Debug, Default)]
pub struct FleetDay {
    pub run_ms: BTreeMap<Millis, i64>,
    pub weights: DayWeights,
    /// Tenants listed as active that day.
    pub active: usize,
}

/// A day's fold is reused for this long (the current day's, and any day's after a
/// registry change of weights, are at most this stale).
pub const FLEET_DAY_FRESH_MS: Millis = 60_000;
/// A closed day's fold is reused for this long.
pub const CLOSED_DAY_FRESH_MS: Millis = 10 * 60_000;

/// The fleet's days folded (pre-aggregated) for the console's tenant pages: each day is
/// read (its fleet rows and active tenants, within the request's row budget) by one
/// page at a time and then served from memory to every tenant's page, instead of
/// 2 x 30 partitions per page. Holds at most [`CHART_DAYS`] + 1 days.
#[derive(Default)]
pub struct FleetDays {
    days: tokio::sync::Mutex<BTreeMap<Millis, (Millis, Arc<FleetDay>)>>,
}

impl FleetDays {
    /// The fold of `day` (read afresh when older than its freshness), read by `read_day`.
    async fn get(
        &self,
        stmts: &LedgerStatements,
        q: &ChartsQuery<'_>,
        day: Millis,
        row_limit: u64,
    ) -> Result<Arc<FleetDay>, LedgerReadError> {
        const DAY: Millis = 86_400_000;
        let mut days = self.days.lock().await;
        let oldest = q.now.div_euclid(DAY) * DAY - CHART_DAYS * DAY;
        days.retain(|d, _| *d >= oldest);
        let fresh = if day + DAY > q.now { FLEET_DAY_FRESH_MS } else { CLOSED_DAY_FRESH_MS };
        if let Some((at, f)) = days.get(&day) {
            if q.now.saturating_sub(*at) < fresh {
                return Ok(f.clone());
            }
        }
        let f = Arc::new(read_day(stmts, q, day, &mut RowBudget::new(row_limit)).await?);
        days.insert(day, (q.now, f.clone()));
        Ok(f)
    }
}

/// Reads and folds one fleet day (its fleet rows, then its tenant index) within `budget`.
async fn read_day(
    stmts: &LedgerStatements,
    q: &ChartsQuery<'_>,
    day: Millis,
    budget: &mut RowBudget,
) -> Result<FleetDay, LedgerReadError> {
    let weights = TierWeights::default();
    let mut f = FleetDay::default();
    stmts
        .fold_fleet(day, budget, |r| {
            let e = f.run_ms.entry(r.window).or_default();
            *e = e.saturating_add(r.usage.run_ms);
        })
        .await?;
    stmts
        .fold_tenants(day, budget, |t| {
            f.weights.add(&weighed(t, q.registry, q.default_tier), &weights);
            f.active += 1;
        })
        .await?;
    Ok(f)
}

/// A tenant's charts (store reads: the tenant's rows of each of the last [`CHART_DAYS`],
/// within `budget`; the fleet's days from `fleet`, each read at most once a minute for
/// every page of the process).
pub async fn tenant_charts(
    stmts: &LedgerStatements,
    q: &ChartsQuery<'_>,
    fleet: &FleetDays,
    budget: &mut RowBudget,
) -> Result<TenantCharts, LedgerReadError> {
    const DAY: Millis = 86_400_000;
    const HOUR: Millis = 3_600_000;
    let from_day = q.now.div_euclid(DAY) * DAY - (CHART_DAYS - 1) * DAY;
    let me = weighed(q.tenant, q.registry, q.default_tier);
    let weights = TierWeights::default();
    let (mut rows, mut fleet_rows, mut entitled) = (Vec::new(), Vec::new(), BTreeMap::new());
    for day in rules::days(&Period::clamped(from_day, q.now + 1)) {
        let r = stmts.rows_within(q.tenant, day, budget).await?;
        let f = fleet.get(stmts, q, day, budget.limit()).await?;
        // A day nobody used the fleet entitles nobody to anything: no line there.
        if f.active > 0 {
            entitled.insert(day, f.weights.share_of(&me, !r.is_empty(), &weights));
        }
        fleet_rows.extend(f.run_ms.iter().map(|(w, ms)| FleetRow {
            window: *w,
            pool: crate::model::Pool::Short,
            usage: Usage { run_ms: *ms, ..Usage::default() },
        }));
        rows.extend(r);
    }
    let from_hour = q.now.div_euclid(HOUR) * HOUR - 23 * HOUR;
    Ok(TenantCharts {
        hours: rules::chart_points(&rows, &fleet_rows, &entitled, Granularity::Hour, from_hour, q.now + 1),
        days: rules::chart_points(&rows, &fleet_rows, &entitled, Granularity::Day, from_day, q.now + 1),
        types_24h: rules::outcomes_by_type(&rows, from_hour, q.now + 1),
        types_30d: rules::outcomes_by_type(&rows, from_day, q.now + 1),
    })
}

/// The `n` tenants with the most run time in the 24 hours before `now`, and whether a
/// day's index held more than [`TOP_SCAN_TENANTS`] tenants (those beyond were not read).
/// Store reads: the two days' tenant indexes and each listed tenant's day.
pub async fn top_tenants(
    stmts: &LedgerStatements,
    now: Millis,
    n: usize,
) -> Result<(Vec<(String, i64)>, bool), StoreError> {
    let from = rules::window_of(now - 86_400_000);
    let mut usage: Vec<(String, i64)> = Vec::new();
    let mut cut = false;
    for day in rules::days(&Period::clamped(from, now + 1)) {
        // The day's index read only as far as the chart reads it (at 100,000 tenants a
        // day, the rest would be read for nothing).
        let mut tenants = Vec::new();
        let mut budget = RowBudget::new(TOP_SCAN_TENANTS as u64);
        match stmts.fold_tenants(day, &mut budget, |t| tenants.push(t.to_string())).await {
            Ok(()) => {}
            Err(LedgerReadError::OverBudget(_)) => cut = true,
            Err(LedgerReadError::Store(e)) => return Err(e),
        }
        for chunk in tenants.chunks(EXPORT_CONCURRENCY) {
            let days = futures::future::try_join_all(chunk.iter().map(|t| stmts.rows(t, day))).await?;
            for r in days.iter().flatten().filter(|r| r.window >= from) {
                usage.push((r.account.tenant.clone(), r.usage.run_ms));
            }
        }
    }
    Ok((rules::top_by_run_time(usage.iter().map(|(t, ms)| (t.as_str(), *ms)), n), cut))
}
