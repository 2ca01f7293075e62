//! The pool classifier, the pure rules: which pool a job type's new jobs go to, from
//! the run times measured across the fleet (seed 002: "a job type whose measured p95
//! violates its pool's range more than 1 % of the time is reclassified, sticky for 1 h").
//!
//! - **Ranges.** Each pool has a run-time range, `[previous pool's max_run, max_run)`
//!   ([`Ranges`], from `[pools.<p>] max_run`: short < 1 s, medium < 1 min, long beyond
//!   by default). A run outside the range of the pool it ran in is a *violation*, over
//!   (too long) or under (too short).
//! - **Per tenant.** Run times are what a tenant's inputs make them, so every judgement is
//!   per (job type, tenant), a [`Subject`]: one tenant's slow jobs of a shared type move
//!   that tenant's jobs of the type, never another tenant's.
//! - **Measuring.** Every worker counts, per (job type, tenant, pool it ran in) and 10 s
//!   bucket, its runs, violations and a log-scale histogram of run times ([`RunCell`],
//!   cumulative cells in the `tenant_run_times` table). The classifier's leader sums the
//!   window's cells of the pool a subject is assigned to now ([`window_runs`]).
//! - **Bounded.** A worker counts at most `max_tracked` subjects per pool and bucket
//!   (runs of further ones are not counted); the leader keeps at most `max_tracked`
//!   classes and drops idle ones ([`idle`]: past their sticky time with no runs in the
//!   window, their jobs go to the configured pool again and are measured afresh).
//! - **Deciding** ([`decide`]): with at least `min_runs` runs in the window and more than
//!   `max_violation_share` of them violating, the job type moves to the pool that fits its
//!   p95 run time ([`Ranges::fitting`]). A p95 that still fits the current pool (widened by
//!   `hysteresis` on both ends) moves nothing: the type's typical run belongs there, its
//!   outliers are counted (`fairway_pool_violations_total`) but not acted on. A move is
//!   sticky for `sticky`: no change at all until then, so the type cannot flap; after
//!   it the same rule runs against the new pool, which moves the type back only when its
//!   runs fall out of the new range (`move_down`) and fit the old one beyond hysteresis.
//! - **Routing** ([`route`]): a job's explicit pool wins; else its subject's class; else the
//!   configured pool. A replayed job ([`replay_pool`]) follows the class when its record
//!   names the configured pool (the record cannot tell an explicit pool equal to the
//!   configured one from none), and keeps any other pool.

use crate::core::invalid::Invalid;
use crate::core::retry::DurationMs;
use crate::model::{Millis, Pool};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

/// `[classifier]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClassifierConfig {
    /// Off: no run times are collected and every job goes to its configured pool.
    pub enabled: bool,
    /// The window the violation share and p95 are measured over.
    pub window: DurationMs,
    /// Runs in the window (in the pool the type is assigned to) before it may move.
    pub min_runs: u64,
    /// Moves when more than this share of the window's runs violate the pool's range.
    pub max_violation_share: f64,
    /// The run-time quantile that picks the fitting pool (0.95: the p95).
    pub quantile: f64,
    /// A move holds this long before the type may move again.
    pub sticky: DurationMs,
    /// A quantile within the current pool's range widened by this share on both ends
    /// keeps the type where it is (0.2: short, max 1 s, moves up above 1.2 s).
    pub hysteresis: f64,
    /// Types whose runs are shorter than their pool's range may move to a shorter pool.
    pub move_down: bool,
    /// How often the leader evaluates the window.
    pub interval: DurationMs,
    /// How long a submitting process uses the classes it read before reading again.
    pub cache: DurationMs,
    /// Most (job type, tenant) subjects measured per worker pool and bucket, and most
    /// classes kept (each a row every submitter caches, ~100 bytes).
    pub max_tracked: usize,
}

impl Default for ClassifierConfig {
    fn default() -> Self {
        ClassifierConfig {
            enabled: true,
            window: DurationMs::mins(10),
            min_runs: 100,
            max_violation_share: 0.01,
            quantile: 0.95,
            sticky: DurationMs::mins(60),
            hysteresis: 0.2,
            move_down: true,
            interval: DurationMs::secs(10),
            cache: DurationMs::secs(5),
            max_tracked: 10_000,
        }
    }
}

impl ClassifierConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        if !(self.max_violation_share > 0.0 && self.max_violation_share < 1.0) {
            let share = self.max_violation_share;
            return Invalid::err("max_violation_share", format!("{share} must be between 0 and 1, e.g. 0.01"));
        }
        if !(self.quantile > 0.0 && self.quantile <= 1.0) {
            return Invalid::err("quantile", format!("{} must be above 0 and at most 1, e.g. 0.95", self.quantile));
        }
        if !(0.0..1.0).contains(&self.hysteresis) {
            return Invalid::err("hysteresis", format!("{} must be at least 0 and below 1, e.g. 0.2", self.hysteresis));
        }
        if self.window.0 < RUN_BUCKET_MS {
            let why = format!("{} must be at least 10s (the bucket width), e.g. \"10m\"", self.window);
            return Invalid::err("window", why);
        }
        if self.max_tracked == 0 {
            return Invalid::err("max_tracked", "must be at least 1, e.g. 10000");
        }
        if self.min_runs == 0 {
            return Invalid::err("min_runs", "must be at least 1, e.g. 100");
        }
        if self.interval.0 < 1_000 {
            return Invalid::err("interval", "must be at least 1s, e.g. \"10s\"");
        }
        if self.cache.0 < 100 {
            return Invalid::err("cache", "must be at least 100ms, e.g. \"5s\"");
        }
        Ok(())
    }
}

/// Width of a run-time bucket (as the breaker's outcome buckets).
pub const RUN_BUCKET_MS: i64 = crate::core::admission::breaker::BUCKET_MS;

/// Which side of its pool's range a run fell out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    Over,
    Under,
}

impl Violation {
    pub fn as_str(self) -> &'static str {
        match self {
            Violation::Over => "over",
            Violation::Under => "under",
        }
    }
}

/// The pools' run-time ranges: pool `i` holds `[max of pool i-1 (0 for short), max_run
/// of pool i)`, no upper end when unset.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranges {
    max: BTreeMap<Pool, Option<Millis>>,
}

impl Ranges {
    /// From each pool's `max_run` (checked increasing by the config).
    pub fn new(max: impl IntoIterator<Item = (Pool, Option<Millis>)>) -> Self {
        Ranges { max: max.into_iter().collect() }
    }

    /// `[min, max)` of `pool`'s range (max None: unbounded).
    pub fn range(&self, pool: Pool) -> (Millis, Option<Millis>) {
        let min = self.max.range(..pool).next_back().and_then(|(_, m)| *m).unwrap_or(0);
        (min, self.max.get(&pool).copied().flatten())
    }

    /// Whether a run of `run_ms` in `pool` is outside its range.
    pub fn violation(&self, pool: Pool, run_ms: Millis) -> Option<Violation> {
        let (min, max) = self.range(pool);
        if max.is_some_and(|m| run_ms >= m) {
            Some(Violation::Over)
        } else if run_ms < min {
            Some(Violation::Under)
        } else {
            None
        }
    }

    /// The pool for a typical run of `run_ms`, now in `current`: `current` while the run
    /// is within its range widened by `hysteresis` on both ends, else the pool whose
    /// range holds it.
    pub fn fitting(&self, current: Pool, run_ms: Millis, hysteresis: f64) -> Pool {
        let (min, max) = self.range(current);
        let low = (min as f64 * (1.0 - hysteresis)) as Millis;
        let high = max.map(|m| (m as f64 * (1.0 + hysteresis)) as Millis);
        if run_ms >= low && high.is_none_or(|h| run_ms < h) {
            return current;
        }
        self.max.keys().copied().find(|p| self.violation(*p, run_ms).is_none()).unwrap_or(current)
    }
}

/// Sub-buckets per doubling of the run-time histogram (about 19 % wide each).
const STEPS_PER_DOUBLING: f64 = 4.0;

/// Histogram bucket of a run time: 0 for under 1 ms, then 4 per doubling.
pub fn hist_bucket(run_ms: Millis) -> i32 {
    if run_ms < 1 {
        return 0;
    }
    1 + ((run_ms as f64).log2() * STEPS_PER_DOUBLING).floor() as i32
}

/// The upper end of a histogram bucket (every run in it was shorter).
pub fn hist_upper(bucket: i32) -> Millis {
    if bucket <= 0 {
        return 1;
    }
    2f64.powf(bucket as f64 / STEPS_PER_DOUBLING).ceil() as Millis
}

/// Runs of one job type in one pool (one worker's cell of a bucket, or a window's sum).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunCell {
    pub runs: i64,
    pub over: i64,
    pub under: i64,
    /// Histogram bucket ([`hist_bucket`]) -> runs.
    pub hist: BTreeMap<i32, i64>,
}

impl RunCell {
    pub fn record(&mut self, run_ms: Millis, violation: Option<Violation>) {
        self.runs += 1;
        match violation {
            Some(Violation::Over) => self.over += 1,
            Some(Violation::Under) => self.under += 1,
            None => {}
        }
        *self.hist.entry(hist_bucket(run_ms)).or_default() += 1;
    }

    pub fn add(&mut self, other: &RunCell) {
        self.runs += other.runs.max(0);
        self.over += other.over.max(0);
        self.under += other.under.max(0);
        for (b, n) in &other.hist {
            *self.hist.entry(*b).or_default() += (*n).max(0);
        }
    }

    /// The `q` quantile of the run times, as the upper end of its histogram bucket
    /// (an over-estimate by at most one bucket, ~19 %). None without runs.
    pub fn quantile(&self, q: f64) -> Option<Millis> {
        let total: i64 = self.hist.values().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as i64).clamp(1, total);
        let mut seen = 0;
        for (b, n) in &self.hist {
            seen += n;
            if seen >= rank {
                return Some(hist_upper(*b));
            }
        }
        None
    }
}

/// What the classifier judges: a job type's runs of one tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Subject {
    pub job_type: String,
    pub tenant: String,
}

impl Subject {
    pub fn new(job_type: &str, tenant: &str) -> Self {
        Subject { job_type: job_type.to_string(), tenant: tenant.to_string() }
    }

    /// One string for a worker's in-memory cells (names hold no control characters).
    pub fn key(&self) -> String {
        format!("{}{}{}", self.job_type, crate::core::fleet::KEY_JOIN, self.tenant)
    }

    /// The subject of a [`Subject::key`].
    pub fn from_key(key: &str) -> Option<Subject> {
        let (job_type, tenant) = crate::core::fleet::split_joined(key)?;
        Some(Subject::new(job_type, tenant))
    }
}

/// Sums the cells `(bucket, subject, pool, cell)` of the window `(now - window_ms, now]`
/// per (subject, pool).
pub fn window_runs<'a>(
    cells: impl IntoIterator<Item = (Millis, &'a Subject, Pool, &'a RunCell)>,
    now: Millis,
    window_ms: i64,
) -> HashMap<(Subject, Pool), RunCell> {
    let mut out: HashMap<(Subject, Pool), RunCell> = HashMap::new();
    for (bucket, subject, pool, cell) in cells {
        if bucket + RUN_BUCKET_MS <= now - window_ms || bucket > now {
            continue;
        }
        out.entry((subject.clone(), pool)).or_default().add(cell);
    }
    out
}

/// The classes to drop at `now`: past their sticky time, with no runs in the window
/// (`active` says which subjects had some). Their jobs go to the configured pool again.
pub fn idle<'a>(
    classes: impl IntoIterator<Item = (&'a Subject, &'a Class)>,
    active: impl Fn(&Subject) -> bool,
    now: Millis,
) -> Vec<Subject> {
    classes.into_iter().filter(|(s, c)| now >= c.sticky_until && !active(s)).map(|(s, _)| s.clone()).collect()
}

/// Whether a subject without a class may get one: fewer than `max_tracked` classes.
pub fn room_for_class(classes: usize, cfg: &ClassifierConfig) -> bool {
    classes < cfg.max_tracked
}

/// Where a job type's new jobs go, as decided by the classifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Class {
    pub pool: Pool,
    /// When it was decided.
    pub since: Millis,
    /// No other decision before this.
    pub sticky_until: Millis,
}

/// A decision to move a job type.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub from: Pool,
    pub to: Pool,
    /// The quantile's run time that picked `to`.
    pub quantile_ms: Millis,
    pub runs: i64,
    pub violations: i64,
    pub class: Class,
}

impl Move {
    /// One line for logs and the event: what moved, why, until when.
    pub fn describe(&self, subject: &Subject, cfg: &ClassifierConfig) -> String {
        format!(
            "job type {} of tenant {:?} moved from pool {} to {}: p{:.0} run time {} ms; {} of {} runs ({:.1} %) outside \
             {}'s range over the last {} (limit {:.1} %); sticky until {} (epoch ms)",
            subject.job_type,
            subject.tenant,
            self.from,
            self.to,
            cfg.quantile * 100.0,
            self.quantile_ms,
            self.violations,
            self.runs,
            100.0 * self.violations as f64 / self.runs.max(1) as f64,
            self.from,
            cfg.window,
            cfg.max_violation_share * 100.0,
            self.class.sticky_until
        )
    }
}

/// The pool a job type is assigned to: its class, else its configured pool.
pub fn assigned(declared: Pool, class: Option<&Class>) -> Pool {
    class.map_or(declared, |c| c.pool)
}

/// The pool of a new job: its explicit pool, else its type's assigned pool.
pub fn route(explicit: Option<Pool>, declared: Pool, class: Option<&Class>) -> Pool {
    explicit.unwrap_or_else(|| assigned(declared, class))
}

/// The pool of a replayed job whose record names `recorded`: the assigned pool when the
/// record names none or the configured pool, else the recorded one.
pub fn replay_pool(recorded: Option<Pool>, declared: Pool, class: Option<&Class>) -> Pool {
    match recorded {
        Some(p) if p != declared => p,
        _ => assigned(declared, class),
    }
}

/// Whether a job type assigned to `class` (or its configured pool `declared`) moves,
/// given `runs`, the window's runs in its assigned pool (see the module docs).
pub fn decide(
    cfg: &ClassifierConfig,
    ranges: &Ranges,
    declared: Pool,
    class: Option<&Class>,
    runs: &RunCell,
    now: Millis,
) -> Option<Move> {
    if class.is_some_and(|c| now < c.sticky_until) || runs.runs < cfg.min_runs as i64 {
        return None;
    }
    let from = assigned(declared, class);
    let violations = runs.over + if cfg.move_down { runs.under } else { 0 };
    if (violations as f64) <= cfg.max_violation_share * runs.runs as f64 {
        return None;
    }
    let quantile_ms = runs.quantile(cfg.quantile)?;
    let to = ranges.fitting(from, quantile_ms, cfg.hysteresis);
    if to == from || (to < from && !cfg.move_down) {
        return None;
    }
    let class = Class { pool: to, since: now, sticky_until: now.saturating_add(cfg.sticky.0) };
    Some(Move { from, to, quantile_ms, runs: runs.runs, violations, class })
}

#[cfg(test)]
mod tests;
