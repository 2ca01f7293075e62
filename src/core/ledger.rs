//! The usage ledger's rules: what one result adds to its tenant's account, and how a
//! partition of the results topic is cut into windows whose totals every reader agrees on.
//!
//! **Windows.** Each partition of the results topic is cut into windows of [`WINDOW_MS`]
//! by the highest record timestamp seen so far on that partition: a record belongs to the
//! window of that running maximum. Records before a window's first offset all carry
//! earlier timestamps, so the cut depends on the log alone, and whoever reads a partition
//! from a window's first offset computes the same totals for every prefix of the window.
//!
//! **Counted once.** A window's totals are written with the end of the prefix they cover
//! (the next offset) as the write's timestamp: the longest prefix wins, however many
//! readers wrote before (a restarted leader re-reading the window, a lapsed lease's
//! leader still running). Each total is a pure function of its prefix, so a row left
//! unchanged by later records already holds the longest prefix's value. A reader starts
//! again at its window's first offset (`ledger_positions`), never in the middle.

use crate::core::alerts::WaitHistogram;
use crate::core::bounds::{self, BoundError, Period};
use crate::model::{JobResult, JobStatus, Millis, Pool};
use std::collections::{BTreeMap, BTreeSet};

/// Width of one ledger window (one row per account, window and partition).
pub const WINDOW_MS: Millis = 15 * 60_000;

/// Distinct (pool, job type) accounts one tenant may open in one window of one partition;
/// its further job types fold into [`OTHER_JOB_TYPE`] of their pool (a producer writing
/// straight to Kafka can put any job type on its jobs).
pub const MAX_ACCOUNTS_PER_TENANT: usize = 64;
/// The job type of a tenant's folded account. Configured job types are TOML bare keys,
/// which cannot hold parentheses; a result that carries this name anyway is folded too,
/// so a clash only merges a tenant's own lines.
pub const OTHER_JOB_TYPE: &str = "(other)";

/// The window `ts` falls in (its start).
pub fn window_of(ts: Millis) -> Millis {
    ts.div_euclid(WINDOW_MS) * WINDOW_MS
}

/// Who is charged: a tenant's jobs of one type in one pool.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Account {
    pub tenant: String,
    pub pool: Pool,
    pub job_type: String,
}

/// What an account used. Crash re-dispatches are not attempts (a worker's death is never
/// the tenant's), so they are neither counted nor charged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Results published (one per job and generation, duplicates of at-least-once included).
    pub results: i64,
    pub succeeded: i64,
    /// Failed jobs; each was dead-lettered.
    pub failed: i64,
    pub cancelled: i64,
    pub expired: i64,
    /// Attempts used up (crashes not counted).
    pub attempts: i64,
    /// Attempts beyond the first.
    pub retries: i64,
    /// Measured run time of the attempts that decided the outcomes (started to finished).
    pub run_ms: i64,
    /// Output bytes the results carried.
    pub bytes_out: i64,
    /// CPU time of the deciding attempts' process trees (process jobs), milliseconds.
    pub cpu_ms: i64,
    /// Largest peak memory of one deciding attempt's process tree (process jobs), bytes:
    /// a maximum, not a sum.
    pub peak_memory_bytes: i64,
    /// Queue waits (submitted to the deciding attempt's start) of the results that
    /// started: what the console's wait charts read (not in reports or exports).
    #[serde(skip)]
    pub waits: WaitHistogram,
}

impl Usage {
    pub fn add(&mut self, o: &Usage) {
        self.results += o.results;
        self.succeeded += o.succeeded;
        self.failed += o.failed;
        self.cancelled += o.cancelled;
        self.expired += o.expired;
        self.attempts += o.attempts;
        self.retries += o.retries;
        self.run_ms += o.run_ms;
        self.bytes_out += o.bytes_out;
        self.cpu_ms += o.cpu_ms;
        self.peak_memory_bytes = self.peak_memory_bytes.max(o.peak_memory_bytes);
        self.waits.merge(&o.waits);
    }
}

/// What one result adds to its account.
pub fn of_result(r: &JobResult) -> Usage {
    let attempts = i64::from(r.attempts.max(0));
    Usage {
        results: 1,
        succeeded: i64::from(r.status == JobStatus::Succeeded),
        failed: i64::from(r.status == JobStatus::Failed),
        cancelled: i64::from(r.status == JobStatus::Cancelled),
        expired: i64::from(r.status == JobStatus::Expired),
        attempts,
        retries: (attempts - 1).max(0),
        run_ms: r.started_at.map(|s| (r.finished_at - s).max(0)).unwrap_or(0),
        bytes_out: r.output.as_ref().map(|o| o.len() as i64).unwrap_or(0),
        cpu_ms: r.cpu_ms.unwrap_or(0).max(0),
        peak_memory_bytes: r.peak_memory_bytes.unwrap_or(0).max(0),
        waits: {
            let mut w = WaitHistogram::default();
            if let Some(started) = r.started_at {
                w.add(started - r.submitted_at);
            }
            w
        },
    }
}

pub fn account_of(r: &JobResult) -> Account {
    Account { tenant: r.tenant.clone(), pool: r.pool, job_type: r.job_type.clone() }
}

/// Totals to write for one window of one partition: each row's value covers the window's
/// records from `first` up to (not including) `upto`, written with `upto` as its timestamp.
#[derive(Clone, Debug, PartialEq)]
pub struct Flush {
    pub window: Millis,
    pub first: i64,
    pub upto: i64,
    pub rows: Vec<(Account, Usage)>,
    /// Every tenant's usage together, per pool whose accounts changed: the fleet's totals
    /// the console's shares are of (written by the same longest-prefix rule).
    pub fleet: Vec<(Pool, Usage)>,
}

/// One partition's running tally, fed its records in offset order from a window's first
/// offset (or the log's start).
#[derive(Clone, Debug)]
pub struct PartitionTally {
    window: Option<Millis>,
    first: i64,
    next: i64,
    max_ts: Millis,
    totals: BTreeMap<Account, Usage>,
    /// Every tenant's usage per pool in the current window.
    fleet: BTreeMap<Pool, Usage>,
    dirty: BTreeSet<Account>,
    /// Accounts of their own (not folded) per tenant in the current window.
    own: BTreeMap<String, usize>,
}

impl PartitionTally {
    /// A tally that reads from `offset`, which must be a window's first offset (or the log's start).
    pub fn starting_at(offset: i64) -> Self {
        PartitionTally {
            window: None,
            first: offset,
            next: offset,
            max_ts: Millis::MIN,
            totals: BTreeMap::new(),
            fleet: BTreeMap::new(),
            dirty: BTreeSet::new(),
            own: BTreeMap::new(),
        }
    }

    /// The offset of the next record to feed.
    pub fn next(&self) -> i64 {
        self.next
    }

    /// The current window and its first offset: where a reader starts again.
    pub fn resume_point(&self) -> (Option<Millis>, i64) {
        (self.window, self.first)
    }

    /// Accounts in the current window (what the tally holds in memory).
    pub fn accounts(&self) -> usize {
        self.totals.len()
    }

    /// Feeds the record at `offset` with timestamp `ts` (`result` None: a record that is not a
    /// result, e.g. undecodable; it moves the window like any other). A record already fed is
    /// ignored. Returns the closed window's last totals when this record opens a new one.
    pub fn observe(&mut self, offset: i64, ts: Millis, result: Option<&JobResult>) -> Option<Flush> {
        if offset < self.next {
            return None;
        }
        self.max_ts = self.max_ts.max(ts);
        let w = window_of(self.max_ts);
        let closed = match self.window {
            Some(cur) if cur != w => {
                let f = self.take(offset);
                self.totals.clear();
                self.fleet.clear();
                self.own.clear();
                self.first = offset;
                f
            }
            _ => None,
        };
        self.window = Some(w);
        if let Some(r) = result {
            let acc = self.capped(account_of(r));
            let u = of_result(r);
            self.totals.entry(acc.clone()).or_default().add(&u);
            self.fleet.entry(acc.pool).or_default().add(&u);
            self.dirty.insert(acc);
        }
        self.next = offset + 1;
        closed
    }

    /// The rows changed since the last flush, covering the window up to `next()`.
    pub fn pending(&mut self) -> Option<Flush> {
        let upto = self.next;
        self.take(upto)
    }

    /// A flush that could not be written: its accounts stay pending (totals are cumulative,
    /// so the next flush carries them).
    pub fn unflushed(&mut self, f: Flush) {
        if Some(f.window) == self.window {
            self.dirty.extend(f.rows.into_iter().map(|(a, _)| a));
        }
    }

    /// `acc`, or its tenant's folded account of the same pool once the tenant has
    /// [`MAX_ACCOUNTS_PER_TENANT`] accounts of its own in this window. Which accounts are
    /// its own depends only on the window's records in offset order, so every reader agrees.
    fn capped(&mut self, acc: Account) -> Account {
        if acc.job_type != OTHER_JOB_TYPE && self.totals.contains_key(&acc) {
            return acc;
        }
        let own = self.own.entry(acc.tenant.clone()).or_default();
        if acc.job_type != OTHER_JOB_TYPE && *own < MAX_ACCOUNTS_PER_TENANT {
            *own += 1;
            return acc;
        }
        Account { job_type: OTHER_JOB_TYPE.to_string(), ..acc }
    }

    fn take(&mut self, upto: i64) -> Option<Flush> {
        let window = self.window?;
        if self.dirty.is_empty() {
            return None;
        }
        let dirty = std::mem::take(&mut self.dirty);
        let pools: BTreeSet<Pool> = dirty.iter().map(|a| a.pool).collect();
        let fleet = pools.into_iter().map(|p| (p, self.fleet[&p])).collect();
        let rows = dirty.into_iter().map(|a| (a.clone(), self.totals[&a])).collect();
        Some(Flush { window, first: self.first, upto, rows, fleet })
    }
}

/// A ledger row as stored: an account's usage in one window of one partition.
#[derive(Clone, Debug, PartialEq)]
pub struct LedgerRow {
    pub window: Millis,
    pub account: Account,
    pub usage: Usage,
}

/// Hour or day periods of a usage report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granularity {
    Hour,
    Day,
}

impl Granularity {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "hour" => Ok(Granularity::Hour),
            "day" => Ok(Granularity::Day),
            other => Err(format!("granularity {other:?} is not one of: hour, day")),
        }
    }
    pub fn millis(self) -> Millis {
        match self {
            Granularity::Hour => 3_600_000,
            Granularity::Day => 86_400_000,
        }
    }
}

/// A report's line: one period, pool and job type of one tenant.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ReportLine {
    pub tenant: String,
    pub period_start: Millis,
    pub pool: Pool,
    pub job_type: String,
    #[serde(flatten)]
    pub usage: Usage,
}

/// The lines' sum (a report's total).
pub fn total(lines: &[ReportLine]) -> Usage {
    let mut t = Usage::default();
    for l in lines {
        t.add(&l.usage);
    }
    t
}

/// Sums stored rows (windows of every partition) into periods of `g`, keeping those that
/// start within `[from, to)`; sorted by tenant, period, pool, job type.
pub fn report(rows: &[LedgerRow], g: Granularity, from: Millis, to: Millis) -> Vec<ReportLine> {
    let mut sums: BTreeMap<(String, Millis, Pool, String), Usage> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.window >= from && r.window < to) {
        let period = r.window.div_euclid(g.millis()) * g.millis();
        let key = (r.account.tenant.clone(), period, r.account.pool, r.account.job_type.clone());
        sums.entry(key).or_default().add(&r.usage);
    }
    sums.into_iter()
        .map(|((tenant, period_start, pool, job_type), u)| ReportLine {
            tenant,
            period_start,
            pool,
            job_type,
            usage: u,
        })
        .collect()
}

/// Longest period one usage report covers (a month and then some; longer asks are refused
/// before any store read).
pub const MAX_REPORT_DAYS: i64 = 93;

/// A usage report's period as its caller gave it: `from` and `to` accepted instants
/// (`core::bounds`), `to` after `from`, at most [`MAX_REPORT_DAYS`] apart.
pub fn report_period(from: Millis, to: Millis) -> Result<Period, BoundError> {
    bounds::period(("from", from), ("to", to), MAX_REPORT_DAYS)
}

/// The days (their starts) whose store partitions hold the windows of `p`.
pub fn days(p: &Period) -> Vec<Millis> {
    p.days()
}

/// The fleet's usage (every tenant's together) in one window of one partition and pool,
/// as stored: results and run time, what shares are of.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetRow {
    pub window: Millis,
    pub pool: Pool,
    pub usage: Usage,
}

/// One period of a tenant's charts: its usage, the fleet's run time, and its entitlement.
#[derive(Clone, Debug, PartialEq)]
pub struct ChartPoint {
    pub start: Millis,
    pub usage: Usage,
    pub fleet_run_ms: i64,
    /// Its entitled share of the fleet's worker time (0..=1).
    pub entitled: f64,
}

impl ChartPoint {
    /// Its share of the fleet's worker time (run time) in the period; 0 when nothing ran.
    pub fn share(&self) -> f64 {
        if self.fleet_run_ms <= 0 {
            return 0.0;
        }
        (self.usage.run_ms as f64 / self.fleet_run_ms as f64).clamp(0.0, 1.0)
    }
}

/// One job type's outcomes over a span: how many finished and how many were
/// dead-lettered (`failed`), for the tenant page's DLQ rate per job type.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeOutcomes {
    pub pool: Pool,
    pub job_type: String,
    pub results: i64,
    pub failed: i64,
}

impl TypeOutcomes {
    /// Dead-lettered over finished (0 when nothing finished).
    pub fn dlq_rate(&self) -> f64 {
        if self.results <= 0 {
            return 0.0;
        }
        self.failed as f64 / self.results as f64
    }
}

/// `rows` of windows in [`from`, `to`) summed per (pool, job type), most dead letters
/// first (then by name).
pub fn outcomes_by_type(rows: &[LedgerRow], from: Millis, to: Millis) -> Vec<TypeOutcomes> {
    let mut sums: BTreeMap<(Pool, &str), (i64, i64)> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.window >= from && r.window < to) {
        let e = sums.entry((r.account.pool, r.account.job_type.as_str())).or_default();
        *e = (e.0.saturating_add(r.usage.results), e.1.saturating_add(r.usage.failed));
    }
    let mut out: Vec<TypeOutcomes> = sums
        .into_iter()
        .map(|((pool, t), (results, failed))| TypeOutcomes { pool, job_type: t.to_string(), results, failed })
        .collect();
    out.sort_by(|a, b| b.failed.cmp(&a.failed).then_with(|| a.job_type.cmp(&b.job_type)));
    out
}

/// Every period of `g` from the one holding `from` up to `to` (none left out: an idle
/// period is a zero), summing a tenant's stored `rows` and the fleet's; `entitled` gives
/// the entitlement of the day a period starts in (0 for a day it lacks).
pub fn chart_points(
    rows: &[LedgerRow],
    fleet: &[FleetRow],
    entitled: &BTreeMap<Millis, f64>,
    g: Granularity,
    from: Millis,
    to: Millis,
) -> Vec<ChartPoint> {
    let step = g.millis();
    let period = |w: Millis| w.div_euclid(step) * step;
    let mut points: BTreeMap<Millis, ChartPoint> = BTreeMap::new();
    let mut p = period(from);
    while p < to {
        let day = p.div_euclid(Granularity::Day.millis()) * Granularity::Day.millis();
        let e = entitled.get(&day).copied().unwrap_or(0.0);
        points.insert(p, ChartPoint { start: p, usage: Usage::default(), fleet_run_ms: 0, entitled: e });
        p += step;
    }
    for r in rows {
        if let Some(pt) = points.get_mut(&period(r.window)) {
            pt.usage.add(&r.usage);
        }
    }
    for f in fleet {
        if let Some(pt) = points.get_mut(&period(f.window)) {
            pt.fleet_run_ms += f.usage.run_ms;
        }
    }
    points.into_values().collect()
}

/// A tenant as the scheduler weighs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Weighed {
    pub tenant: String,
    pub tier: crate::core::scheduler::Tier,
    /// Its own weight, overriding the tier's (never for free tenants).
    pub weight: Option<f64>,
}

/// `tenant`'s entitled share of the fleet's worker time among `active` (the tenants that
/// used the fleet in the period; `tenant` counts as active whether or not it is listed):
/// its weight over their weights' sum, as the scheduler splits slot-time. Free tenants
/// share one flow of the free tier's weight, split evenly among the active ones.
pub fn entitled_share(tenant: &Weighed, active: &[Weighed], weights: &crate::core::scheduler::TierWeights) -> f64 {
    use crate::core::scheduler::Tier;
    let mut all: BTreeMap<&str, &Weighed> = active.iter().map(|w| (w.tenant.as_str(), w)).collect();
    all.insert(tenant.tenant.as_str(), tenant);
    let free = all.values().filter(|w| w.tier == Tier::Free).count().max(1) as f64;
    let weight = |w: &Weighed| match w.tier {
        Tier::Free => weights.of(Tier::Free) / free,
        t => w.weight.unwrap_or(weights.of(t)).max(0.0),
    };
    let sum: f64 = all.values().map(|w| weight(w)).sum();
    if sum <= 0.0 {
        return 0.0;
    }
    weight(tenant) / sum
}

/// What the tenants active on one day weigh together, folded as their names are read
/// (the console's entitlement of any tenant that day follows from it without holding
/// the day's list): the sum of the weights of the active tenants that are not free, and
/// how many are free.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DayWeights {
    pub paid: f64,
    pub free: usize,
}

impl DayWeights {
    /// Adds one active tenant (each tenant once).
    pub fn add(&mut self, w: &Weighed, weights: &crate::core::scheduler::TierWeights) {
        use crate::core::scheduler::Tier;
        match w.tier {
            Tier::Free => self.free = self.free.saturating_add(1),
            t => self.paid += w.weight.unwrap_or(weights.of(t)).max(0.0),
        }
    }

    /// [`entitled_share`] of `tenant` from the day's folded weights; `listed`: whether
    /// `tenant` was among the tenants folded (it counts as active either way).
    pub fn share_of(&self, tenant: &Weighed, listed: bool, weights: &crate::core::scheduler::TierWeights) -> f64 {
        use crate::core::scheduler::Tier;
        let mut all = *self;
        if !listed {
            all.add(tenant, weights);
        }
        let free_weight = weights.of(Tier::Free);
        let sum = all.paid + if all.free > 0 { free_weight } else { 0.0 };
        if sum <= 0.0 {
            return 0.0;
        }
        let mine = match tenant.tier {
            Tier::Free => free_weight / all.free.max(1) as f64,
            t => tenant.weight.unwrap_or(weights.of(t)).max(0.0),
        };
        mine / sum
    }
}

/// Rows one request may still read from the store: each read takes what it got, and
/// the request stops at the first read past the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowBudget {
    limit: u64,
    read: u64,
}

/// A request read more rows than its budget allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("more than {limit} rows")]
pub struct OverBudget {
    pub limit: u64,
}

impl RowBudget {
    pub fn new(limit: u64) -> RowBudget {
        RowBudget { limit, read: 0 }
    }

    /// Takes `n` more rows; past the limit, refuses (and what was taken stays taken).
    pub fn take(&mut self, n: u64) -> Result<(), OverBudget> {
        self.read = self.read.saturating_add(n);
        if self.read > self.limit {
            return Err(OverBudget { limit: self.limit });
        }
        Ok(())
    }

    pub fn read(&self) -> u64 {
        self.read
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// The `n` tenants with the most run time in `usage` (tenant, run ms), most first
/// (ties by name).
pub fn top_by_run_time<'a>(usage: impl IntoIterator<Item = (&'a str, i64)>, n: usize) -> Vec<(String, i64)> {
    let mut sums: BTreeMap<&str, i64> = BTreeMap::new();
    for (t, ms) in usage {
        *sums.entry(t).or_default() += ms;
    }
    let mut all: Vec<(String, i64)> = sums.into_iter().map(|(t, ms)| (t.to_string(), ms)).collect();
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all.truncate(n);
    all
}

/// A report's bound as given: `2026-11-28` (midnight UTC), RFC 3339
/// (`2026-11-28T10:00:00Z`), or epoch milliseconds.
pub fn parse_instant(s: &str) -> Result<Millis, String> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<Millis>()
            .map_err(|e| format!("{s:?}: {e}; give epoch milliseconds from 0 to {}", bounds::MAX_TIME_MS));
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(t.timestamp_millis());
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(d.and_time(chrono::NaiveTime::MIN).and_utc().timestamp_millis());
    }
    Err(format!("{s:?} is not a time: use a date (2026-11-28), RFC 3339 (2026-11-28T10:00:00Z) or epoch milliseconds"))
}

/// A calendar month (`2026-11`, UTC, 1970-01 to 9999-12) as `[from, to)`.
pub fn month(s: &str) -> Result<Period, String> {
    let bad = || format!("{s:?} is not a month: use YYYY-MM from 1970-01 to 9999-12, e.g. 2026-11");
    let first = chrono::NaiveDate::parse_from_str(&format!("{s}-01"), "%Y-%m-%d").map_err(|_| bad())?;
    let next = first.checked_add_months(chrono::Months::new(1)).ok_or_else(bad)?;
    let ms = |d: chrono::NaiveDate| d.and_time(chrono::NaiveTime::MIN).and_utc().timestamp_millis();
    bounds::period(("month", ms(first)), ("month", ms(next)), 31)
        .map_err(|_| format!("{s:?} is outside the months fairway accepts: use YYYY-MM from 1970-01 to 9999-12"))
}

/// A report line as CSV (header: [`CSV_HEADER`]).
pub fn csv_line(l: &ReportLine) -> String {
    let u = &l.usage;
    let period = chrono::DateTime::from_timestamp_millis(l.period_start).map(|t| t.to_rfc3339()).unwrap_or_default();
    format!(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
        csv_field(&l.tenant),
        period,
        l.pool.as_str(),
        csv_field(&l.job_type),
        u.results,
        u.succeeded,
        u.failed,
        u.cancelled,
        u.expired,
        u.attempts,
        u.retries,
        u.run_ms,
        u.bytes_out,
        u.cpu_ms,
        u.peak_memory_bytes
    )
}

pub const CSV_HEADER: &str =
    "tenant,period_start,pool,job_type,results,succeeded,failed,cancelled,expired,attempts,retries,run_ms,bytes_out,cpu_ms,peak_memory_bytes\n";

/// A CSV field, quoted when it holds a comma, quote or line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn result(tenant: &str, status: JobStatus, attempts: i32, run: i64) -> JobResult {
        JobResult {
            job_id: "j".into(),
            tenant: tenant.into(),
            job_type: "echo".into(),
            pool: Pool::Short,
            status,
            output: Some(vec![1, 2, 3]),
            error: None,
            failure_class: None,
            attempts,
            generation: 0,
            submitted_at: 0,
            started_at: Some(1_000),
            finished_at: 1_000 + run,
            worker_id: "w".into(),
            peak_memory_bytes: None,
            cpu_ms: None,
        }
    }

    #[test]
    fn a_result_adds_its_outcome_attempts_run_time_and_bytes() {
        let u = of_result(&result("a", JobStatus::Failed, 3, 250));
        assert_eq!(
            Usage { waits: WaitHistogram::default(), ..u },
            Usage { results: 1, failed: 1, attempts: 3, retries: 2, run_ms: 250, bytes_out: 3, ..Usage::default() }
        );
        assert_eq!((u.waits.count(), u.waits.quantile(500)), (1, 1_024), "waited 1 s (submitted 0, started 1 s)");
    }

    #[test]
    fn a_new_window_closes_the_last_one_at_its_first_offset() {
        let mut t = PartitionTally::starting_at(10);
        let r = result("a", JobStatus::Succeeded, 1, 5);
        assert!(t.observe(10, 1_000, Some(&r)).is_none());
        assert!(t.observe(11, 2_000, Some(&r)).is_none());
        let closed = t.observe(12, WINDOW_MS + 5, Some(&r)).expect("closed");
        assert_eq!((closed.window, closed.first, closed.upto), (0, 10, 12));
        assert_eq!(closed.rows[0].1.results, 2);
        let open = t.pending().expect("pending");
        assert_eq!((open.window, open.first, open.upto, open.rows[0].1.results), (WINDOW_MS, 12, 13, 1));
        assert!(t.pending().is_none(), "nothing changed since");
    }

    #[test]
    fn a_late_timestamp_stays_in_the_window_of_the_running_maximum() {
        let mut t = PartitionTally::starting_at(0);
        let r = result("a", JobStatus::Succeeded, 1, 5);
        t.observe(0, WINDOW_MS + 1, Some(&r));
        assert!(t.observe(1, 10, Some(&r)).is_none(), "an older clock does not reopen a window");
        assert_eq!(t.pending().unwrap().rows[0].1.results, 2);
    }

    #[test]
    fn records_fed_twice_count_once() {
        let mut t = PartitionTally::starting_at(0);
        let r = result("a", JobStatus::Succeeded, 1, 5);
        t.observe(0, 1, Some(&r));
        t.observe(0, 1, Some(&r));
        assert_eq!(t.pending().unwrap().rows[0].1.results, 1);
    }

    #[test]
    fn reports_sum_windows_into_hours_and_days() {
        let acc = Account { tenant: "a".into(), pool: Pool::Short, job_type: "echo".into() };
        let u = Usage { results: 1, run_ms: 1_500, ..Usage::default() };
        let rows: Vec<LedgerRow> =
            (0..8).map(|i| LedgerRow { window: i * WINDOW_MS, account: acc.clone(), usage: u }).collect();
        let hours = report(&rows, Granularity::Hour, 0, 2 * 3_600_000);
        assert_eq!(hours.len(), 2);
        assert_eq!((hours[0].usage.results, hours[0].usage.run_ms), (4, 6_000));
        let day = report(&rows, Granularity::Day, 0, 86_400_000);
        assert_eq!(day[0].usage.results, 8);
        assert_eq!(report(&rows, Granularity::Hour, 3_600_000, 3_600_000 + 1).len(), 1);
        assert_eq!(days(&report_period(1, 86_400_000 + 1).unwrap()), vec![0, 86_400_000]);
        assert!(report_period(9_223_372_036_854_775_000, i64::MAX).is_err());
        assert!(report_period(i64::MIN, 0).is_err());
        assert!(report_period(0, (MAX_REPORT_DAYS + 1) * 86_400_000).is_err());
    }

    #[test]
    fn outcomes_by_type_sum_the_span_per_pool_and_type_most_dead_letters_first() {
        let row = |window, pool, job_type: &str, results, failed| LedgerRow {
            window,
            account: Account { tenant: "a".into(), pool, job_type: job_type.into() },
            usage: Usage { results, failed, ..Usage::default() },
        };
        let rows = [
            row(0, Pool::Short, "echo", 10, 1),
            row(WINDOW_MS, Pool::Short, "echo", 10, 1),
            row(WINDOW_MS, Pool::Long, "echo", 4, 4),
            row(WINDOW_MS, Pool::Short, "resize", 5, 0),
            row(10 * WINDOW_MS, Pool::Short, "resize", 5, 5),
        ];
        let got = outcomes_by_type(&rows, 0, 2 * WINDOW_MS);
        let view: Vec<(Pool, &str, i64, i64)> =
            got.iter().map(|t| (t.pool, t.job_type.as_str(), t.results, t.failed)).collect();
        assert_eq!(view, [(Pool::Long, "echo", 4, 4), (Pool::Short, "echo", 20, 2), (Pool::Short, "resize", 5, 0)]);
        assert_eq!((got[0].dlq_rate(), got[1].dlq_rate(), got[2].dlq_rate()), (1.0, 0.1, 0.0));
        assert!(outcomes_by_type(&rows, 3 * WINDOW_MS, 4 * WINDOW_MS).is_empty());
        let none = TypeOutcomes { pool: Pool::Short, job_type: "x".into(), results: 0, failed: 0 };
        assert_eq!(none.dlq_rate(), 0.0, "nothing finished: no rate, no division by zero");
    }

    #[test]
    fn chart_points_cover_every_period_with_shares_of_the_fleet_and_waits() {
        let acc = Account { tenant: "a".into(), pool: Pool::Short, job_type: "echo".into() };
        let mut u = Usage { results: 2, run_ms: 1_000, ..Usage::default() };
        u.waits.add(10);
        u.waits.add(5_000);
        let rows = vec![
            LedgerRow { window: WINDOW_MS, account: acc.clone(), usage: u },
            LedgerRow { window: 2 * WINDOW_MS, account: acc.clone(), usage: u },
            LedgerRow { window: 9 * 3_600_000, account: acc, usage: u },
        ];
        let fleet_usage = Usage { run_ms: 8_000, ..Usage::default() };
        let fleet = vec![
            FleetRow { window: WINDOW_MS, pool: Pool::Short, usage: fleet_usage },
            FleetRow { window: 0, pool: Pool::Long, usage: fleet_usage },
        ];
        let entitled = BTreeMap::from([(0, 0.25)]);
        let pts = chart_points(&rows, &fleet, &entitled, Granularity::Hour, 0, 3 * 3_600_000);
        assert_eq!(pts.iter().map(|p| p.start).collect::<Vec<_>>(), vec![0, 3_600_000, 7_200_000], "idle hours too");
        assert_eq!((pts[0].usage.results, pts[0].usage.run_ms, pts[0].fleet_run_ms), (4, 2_000, 16_000));
        assert!((pts[0].share() - 0.125).abs() < 1e-9 && pts[0].entitled == 0.25);
        assert_eq!((pts[0].usage.waits.quantile(500), pts[0].usage.waits.quantile(990)), (12, 5_793));
        assert_eq!((pts[1].share(), pts[1].usage.results), (0.0, 0), "nothing ran: no share");
        let days = chart_points(&rows, &fleet, &BTreeMap::new(), Granularity::Day, 1, 86_400_000);
        assert_eq!((days.len(), days[0].usage.results, days[0].entitled), (1, 6, 0.0));
    }

    #[test]
    fn entitlement_is_the_weight_over_the_active_tenants_weights_free_ones_sharing_one() {
        use crate::core::scheduler::{Tier, TierWeights};
        let w = |t: &str, tier, weight| Weighed { tenant: t.into(), tier, weight };
        let weights = TierWeights::default();
        let pro = w("p", Tier::Pro, None);
        let active = [w("s", Tier::Standard, None), w("f1", Tier::Free, None), w("f2", Tier::Free, None)];
        assert!((entitled_share(&pro, &active, &weights) - 100.0 / 111.0).abs() < 1e-9);
        assert!((entitled_share(&active[1], &active, &weights) - 0.5 / 11.0).abs() < 1e-9, "free split in two");
        assert_eq!(entitled_share(&pro, &[], &weights), 1.0, "alone: everything");
        let own = w("p", Tier::Pro, Some(300.0));
        assert!(
            (entitled_share(&own, std::slice::from_ref(&pro), &weights) - 1.0).abs() < 1e-9,
            "itself listed counts once"
        );
        assert!((entitled_share(&own, &active[..1], &weights) - 300.0 / 310.0).abs() < 1e-9);
    }

    #[test]
    fn top_tenants_by_run_time_sum_and_cut() {
        let top = top_by_run_time([("a", 5), ("b", 7), ("a", 4), ("c", 9), ("d", 1)], 3);
        assert_eq!(top, vec![("a".to_string(), 9), ("c".to_string(), 9), ("b".to_string(), 7)]);
    }

    #[test]
    fn bounds_parse_from_dates_rfc3339_and_millis() {
        assert_eq!(parse_instant("1970-01-02"), Ok(86_400_000));
        assert_eq!(parse_instant("1970-01-01T00:00:01Z"), Ok(1_000));
        assert_eq!(parse_instant("42"), Ok(42));
        // A negative or huge number is a number (refused by the range check, with the range).
        assert_eq!(parse_instant("-5"), Ok(-5));
        assert!(parse_instant("99999999999999999999").unwrap_err().contains("253402300799999"));
        assert!(parse_instant("yesterday").unwrap_err().contains("not a time"));
        let feb = month("1970-02").unwrap();
        assert_eq!((feb.from(), feb.to()), (31 * 86_400_000, 59 * 86_400_000));
        assert_eq!(month("9999-12").unwrap().to(), bounds::MAX_TIME_MS + 1);
        assert!(month("1969-12").is_err() && month("10000-01").is_err() && month("-0001-01").is_err());
        assert!(month("1970-13").is_err());
    }

    #[test]
    fn csv_quotes_what_needs_it() {
        let l = ReportLine {
            tenant: "a,b".into(),
            period_start: 0,
            pool: Pool::Short,
            job_type: "echo".into(),
            usage: Usage { results: 2, run_ms: 1500, cpu_ms: 40, peak_memory_bytes: 1024, ..Usage::default() },
        };
        assert_eq!(csv_line(&l), "\"a,b\",1970-01-01T00:00:00+00:00,short,echo,2,0,0,0,0,0,0,1500,0,40,1024\n");
        assert_eq!(CSV_HEADER.trim_end().split(',').count(), csv_line(&l).trim_end().split(',').count() - 1);
    }

    #[test]
    fn process_jobs_add_their_cpu_and_the_largest_peak_others_nothing() {
        let mut r = result("a", JobStatus::Succeeded, 1, 10);
        assert_eq!((of_result(&r).cpu_ms, of_result(&r).peak_memory_bytes), (0, 0), "not a process job");
        (r.cpu_ms, r.peak_memory_bytes) = (Some(300), Some(5 << 20));
        let mut u = of_result(&r);
        (r.cpu_ms, r.peak_memory_bytes) = (Some(200), Some(3 << 20));
        u.add(&of_result(&r));
        assert_eq!((u.cpu_ms, u.peak_memory_bytes), (500, 5 << 20), "CPU summed, peak the maximum");
    }

    /// A stored cell: its value and the write timestamp it was written with.
    type Cells = BTreeMap<(Millis, Account), (i64, Usage)>;

    /// The test's name for a pool's fleet cell (not a tenant's).
    const FLEET: &str = "*fleet*";

    fn write(cells: &mut Cells, f: &Flush) {
        let fleet =
            f.fleet.iter().map(|(p, u)| (Account { tenant: FLEET.into(), pool: *p, job_type: String::new() }, *u));
        for (acc, u) in f.rows.iter().cloned().chain(fleet) {
            let cell = cells.entry((f.window, acc.clone())).or_insert((i64::MIN, Usage::default()));
            if f.upto >= cell.0 {
                *cell = (f.upto, u);
            }
        }
    }

    /// Reads `log` from `start` up to `stop`, flushing every `every` records (and at the end
    /// when `finish`: else what was not flushed is lost, as in a crash), into `cells`;
    /// returns where a restarted reader resumes.
    fn read(
        log: &[(Millis, JobResult)],
        start: i64,
        stop: usize,
        every: usize,
        finish: bool,
        cells: &mut Cells,
    ) -> i64 {
        let mut t = PartitionTally::starting_at(start);
        for (off, (ts, r)) in log.iter().enumerate().take(stop).skip(start as usize) {
            if let Some(f) = t.observe(off as i64, *ts, Some(r)) {
                write(cells, &f);
            }
            if (off + 1) % every == 0 {
                if let Some(f) = t.pending() {
                    write(cells, &f);
                }
            }
        }
        if finish {
            if let Some(f) = t.pending() {
                write(cells, &f);
            }
        }
        t.resume_point().1
    }

    fn tenants_results(cells: &Cells) -> i64 {
        cells.iter().filter(|((_, a), _)| a.tenant != FLEET).map(|(_, (_, u))| u.results).sum()
    }

    fn totals(cells: &Cells) -> BTreeMap<(Millis, Account), Usage> {
        cells.iter().map(|(k, (_, u))| (k.clone(), *u)).collect()
    }

    #[test]
    fn a_tenant_past_its_account_cap_folds_into_other_and_others_are_untouched() {
        let mut t = PartitionTally::starting_at(0);
        let mut off = 0;
        for i in 0..MAX_ACCOUNTS_PER_TENANT + 10 {
            let mut r = result("greedy", JobStatus::Succeeded, 1, 5);
            r.job_type = format!("t{i}");
            t.observe(off, 1, Some(&r));
            off += 1;
        }
        t.observe(off, 1, Some(&result("quiet", JobStatus::Succeeded, 1, 5)));
        let f = t.pending().unwrap();
        let greedy: Vec<_> = f.rows.iter().filter(|(a, _)| a.tenant == "greedy").collect();
        assert_eq!(greedy.len(), MAX_ACCOUNTS_PER_TENANT + 1, "its own accounts and one folded");
        let other = greedy.iter().find(|(a, _)| a.job_type == OTHER_JOB_TYPE).expect("folded account");
        assert_eq!(other.1.results, 10);
        assert_eq!(greedy.iter().map(|(_, u)| u.results).sum::<i64>(), MAX_ACCOUNTS_PER_TENANT as i64 + 10);
        assert!(f.rows.iter().any(|(a, u)| a.tenant == "quiet" && a.job_type == "echo" && u.results == 1));
        // A job type that already has its account keeps it past the cap.
        let mut r = result("greedy", JobStatus::Succeeded, 1, 5);
        r.job_type = "t0".into();
        t.observe(off + 1, 1, Some(&r));
        assert_eq!(t.pending().unwrap().rows[0].0.job_type, "t0");
    }

    fn weighed_strategy() -> impl Strategy<Value = Weighed> {
        use crate::core::scheduler::Tier;
        (0usize..40, 0usize..4, prop::option::of(0.0f64..50.0)).prop_map(|(n, tier, weight)| {
            let tier = [Tier::Free, Tier::Standard, Tier::Pro, Tier::Enterprise][tier];
            let weight = if tier == Tier::Free { None } else { weight };
            Weighed { tenant: format!("t{n}"), tier, weight }
        })
    }

    proptest! {
        /// Folding a day's active tenants one by one gives every tenant the entitlement
        /// `entitled_share` computes from the whole list, listed or not.
        #[test]
        fn folded_day_weights_give_the_listed_entitlement(
            active in proptest::collection::vec(weighed_strategy(), 0..30),
            me in weighed_strategy(),
        ) {
            let weights = crate::core::scheduler::TierWeights::default();
            let mut unique: BTreeMap<String, Weighed> = BTreeMap::new();
            for w in active {
                unique.entry(w.tenant.clone()).or_insert(w);
            }
            let me = unique.get(&me.tenant).cloned().unwrap_or(me);
            let active: Vec<Weighed> = unique.into_values().collect();
            let mut day = DayWeights::default();
            for w in &active {
                day.add(w, &weights);
            }
            let listed = active.iter().any(|w| w.tenant == me.tenant);
            let want = entitled_share(&me, &active, &weights);
            let got = day.share_of(&me, listed, &weights);
            prop_assert!((want - got).abs() < 1e-9, "want {} got {}", want, got);
        }

        /// A budget refuses the first take past its limit and every one after it, never
        /// one within it.
        #[test]
        fn a_row_budget_refuses_exactly_past_its_limit(
            limit in 0u64..10_000,
            takes in proptest::collection::vec(0u64..3_000, 0..20),
        ) {
            let mut b = RowBudget::new(limit);
            let mut sum = 0u64;
            let mut refused = false;
            for n in takes {
                sum += n;
                let r = b.take(n);
                prop_assert_eq!(r.is_err(), sum > limit);
                prop_assert!(!refused || r.is_err(), "refused once, refused after");
                refused |= r.is_err();
            }
            prop_assert_eq!(b.read(), sum);
        }
    }

    proptest! {
        /// Whatever job types tenants put on their jobs, no tenant holds more than
        /// [`MAX_ACCOUNTS_PER_TENANT`] accounts of its own plus one folded account per pool in
        /// a window; every result is still counted once, and restarts still agree.
        #[test]
        fn accounts_per_tenant_are_capped_and_every_result_still_counts(
            steps in proptest::collection::vec((0i64..6_000, 0usize..3, 0usize..200, 0usize..3), 1..400),
            crashes in proptest::collection::vec((0usize..400, 1usize..50), 0..4),
        ) {
            let mut clock = 0;
            let log: Vec<(Millis, JobResult)> = steps.iter().map(|(dt, t, jt, pool)| {
                clock += dt;
                let mut r = result(["a", "b", "c"][*t], JobStatus::Succeeded, 1, 7);
                r.job_type = if *jt == 199 { OTHER_JOB_TYPE.to_string() } else { format!("t{}", jt % (if *t == 0 { 199 } else { 3 })) };
                r.pool = Pool::ALL[*pool];
                (clock, r)
            }).collect();
            let mut reference = Cells::new();
            read(&log, 0, log.len(), usize::MAX, true, &mut reference);
            let mut per_tenant: BTreeMap<(Millis, String), usize> = BTreeMap::new();
            for (w, acc) in reference.keys() {
                *per_tenant.entry((*w, acc.tenant.clone())).or_default() += 1;
            }
            for n in per_tenant.values() {
                prop_assert!(*n <= MAX_ACCOUNTS_PER_TENANT + Pool::ALL.len());
            }
            let counted: i64 = tenants_results(&reference);
            prop_assert_eq!(counted, log.len() as i64);

            let mut cells = Cells::new();
            let mut start = 0i64;
            for (stop, every) in crashes {
                let stop = stop.min(log.len()).max(start as usize);
                start = read(&log, start, stop, every, false, &mut cells);
            }
            read(&log, start, log.len(), 7, true, &mut cells);
            prop_assert_eq!(totals(&cells), totals(&reference));
        }

        /// However a partition is read (readers crashing with totals not yet written, each
        /// restarting at its window's first offset, flushing at any pace), the stored totals
        /// equal one uninterrupted reading's, and every result is counted once.
        #[test]
        fn any_sequence_of_restarts_counts_every_result_once(
            steps in proptest::collection::vec((0i64..40 * 60_000, 0usize..3, prop::bool::ANY), 1..120),
            crashes in proptest::collection::vec((0usize..120, 1usize..7), 0..5),
            flush_every in 1usize..9,
        ) {
            let mut clock = 0;
            let log: Vec<(Millis, JobResult)> = steps.iter().map(|(dt, t, fail)| {
                clock += dt / 8;
                let skew = if *fail { -(*dt % 90_000) } else { 0 };
                let status = if *fail { JobStatus::Failed } else { JobStatus::Succeeded };
                (clock + skew, result(["a", "b", "c"][*t], status, 1 + *t as i32, *dt % 1000))
            }).collect();
            let mut reference = Cells::new();
            read(&log, 0, log.len(), usize::MAX, true, &mut reference);

            let mut cells = Cells::new();
            let mut start = 0i64;
            for (stop, every) in crashes {
                let stop = stop.min(log.len()).max(start as usize);
                start = read(&log, start, stop, every, false, &mut cells);
            }
            read(&log, start, log.len(), flush_every, true, &mut cells);
            prop_assert_eq!(totals(&cells), totals(&reference));
            prop_assert_eq!(tenants_results(&cells), log.len() as i64);
            let fleet: i64 = cells.iter().filter(|((_, a), _)| a.tenant == FLEET).map(|(_, (_, u))| u.results).sum();
            prop_assert_eq!(fleet, log.len() as i64, "the fleet's cells count every result once too");
        }
    }
}
