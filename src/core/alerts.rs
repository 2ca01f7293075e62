//! Tenant-facing alerts' rules (issue 51, item 4): from one tenant's observations per
//! evaluation period (jobs finished, failed, queue waits), which alerts open and which
//! resolve. Pure: the caller feeds periods in order and passes `now`.
//!
//! **Once, not a storm.** A rule opens after `for_periods` periods in a row above its
//! threshold, and resolves after `for_periods` periods in a row at or below its clear
//! level (a fraction of the threshold, [`CLEAR_FRACTION`]). A value hovering between the
//! two levels, or crossing the threshold now and then, moves neither way, so each alert
//! opens once and resolves once. A period with no results is clear (nothing waited).
//!
//! **Bounded.** A tenant's period holds a fixed histogram of waits ([`WAIT_BUCKETS`]
//! buckets, each a factor of about 1.41 wide); the p99 read from it is its bucket's upper
//! bound (at most 41 % above the true value, never below it).

use crate::core::invalid::Invalid;
use crate::core::retry::DurationMs;
use crate::core::scheduler::Tier;
use crate::model::{JobResult, JobStatus, Millis};
use std::collections::{BTreeMap, HashMap};

/// Buckets of the wait histogram: bucket `i` holds waits below `2^((i+1)/2)` ms.
pub const WAIT_BUCKETS: usize = 64;
/// A rule's clear level: this fraction of its threshold.
pub const CLEAR_FRACTION: f64 = 0.5;

/// What a tenant is alerted about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// The p99 queue wait (submitted to started) of the period's results.
    QueueWait,
    /// Jobs dead-lettered in the period.
    DeadLetters,
    /// Failed (dead-lettered) over finished, with at least a minimum of jobs.
    FailureRate,
    /// Jobs finished over `volume_factor` times the tenant's own baseline (its mean per
    /// period over about the hour before, [`BASELINE_MS`]), with at least a minimum.
    Volume,
}

impl Rule {
    pub const ALL: [Rule; 4] = [Rule::QueueWait, Rule::DeadLetters, Rule::FailureRate, Rule::Volume];
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::QueueWait => "queue_wait",
            Rule::DeadLetters => "dead_letters",
            Rule::FailureRate => "failure_rate",
            Rule::Volume => "volume",
        }
    }

    pub fn parse(s: &str) -> Option<Rule> {
        Rule::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// One tenant's thresholds (tier defaults from the operator, per-tenant overrides).
#[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Thresholds {
    /// p99 queue wait above which [`Rule::QueueWait`] breaches (ms).
    pub queue_wait_p99_ms: i64,
    /// Dead-lettered jobs per period at or above which [`Rule::DeadLetters`] breaches.
    pub dead_letters: i64,
    /// Failure rate above which [`Rule::FailureRate`] breaches...
    pub failure_rate: f64,
    /// ...in periods with at least this many finished jobs.
    pub failure_min_jobs: i64,
    /// Periods in a row a rule must breach to open, or be clear to resolve.
    pub for_periods: u32,
    /// [`Rule::Volume`] breaches above this many times the tenant's baseline...
    pub volume_factor: f64,
    /// ...in periods with at least this many finished jobs.
    pub volume_min_jobs: i64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            queue_wait_p99_ms: 300_000,
            dead_letters: 10,
            failure_rate: 0.2,
            failure_min_jobs: 20,
            for_periods: 5,
            volume_factor: 10.0,
            volume_min_jobs: 100,
        }
    }
}

/// A bounded histogram of queue waits (submitted to started): [`WAIT_BUCKETS`] counts,
/// bucket `i` holding waits below `2^((i+1)/2)` ms. A quantile read from it is its
/// bucket's upper bound (at most 41 % above the true value, never below it). The alerts
/// keep one per tenant and period; the usage ledger one per account and window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitHistogram([u32; WAIT_BUCKETS]);

impl Default for WaitHistogram {
    fn default() -> Self {
        WaitHistogram([0; WAIT_BUCKETS])
    }
}

fn bucket_of(wait_ms: Millis) -> usize {
    let w = wait_ms.max(1) as f64;
    ((2.0 * w.log2()).floor() as usize).min(WAIT_BUCKETS - 1)
}

fn upper_bound(bucket: usize) -> Millis {
    2f64.powf((bucket as f64 + 1.0) / 2.0).ceil() as Millis
}

impl WaitHistogram {
    pub fn add(&mut self, wait_ms: Millis) {
        let b = &mut self.0[bucket_of(wait_ms)];
        *b = b.saturating_add(1);
    }

    pub fn merge(&mut self, o: &WaitHistogram) {
        for (a, b) in self.0.iter_mut().zip(o.0.iter()) {
            *a = a.saturating_add(*b);
        }
    }

    /// Waits counted.
    pub fn count(&self) -> u64 {
        self.0.iter().map(|c| u64::from(*c)).sum()
    }

    /// The quantile at `permille` (990: the p99) as its bucket's upper bound; 0 when
    /// nothing waited.
    pub fn quantile(&self, permille: u64) -> Millis {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let rank = (n * permille.min(1000)).div_ceil(1000).clamp(1, n);
        let mut seen = 0u64;
        for (i, c) in self.0.iter().enumerate() {
            seen += u64::from(*c);
            if seen >= rank {
                return upper_bound(i);
            }
        }
        upper_bound(WAIT_BUCKETS - 1)
    }

    /// The counts, bucket by bucket (as stored).
    pub fn counts(&self) -> &[u32; WAIT_BUCKETS] {
        &self.0
    }

    /// A histogram from stored counts (missing buckets are empty, extra ones ignored,
    /// negative counts read as 0).
    pub fn from_counts(counts: &[i32]) -> Self {
        let mut h = WaitHistogram::default();
        for (a, c) in h.0.iter_mut().zip(counts) {
            *a = (*c).max(0) as u32;
        }
        h
    }
}

/// How long a tenant's volume baseline looks back by default (`alerts.baseline`): its
/// mean jobs per period moves towards each period's count by the period's share of this
/// (an exponential mean), and [`Rule::Volume`] is judged only once the evaluator has
/// watched this long (a new leader knows no tenant's baseline).
pub const BASELINE_MS: Millis = 3_600_000;

/// One tenant's observations in one evaluation period.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Period {
    pub jobs: i64,
    pub failed: i64,
    waits: WaitHistogram,
    /// The tenant's jobs per period before this one (`alerts.baseline`), once known.
    pub baseline: Option<f64>,
}

impl Period {
    /// Adds one result: a job finished, failed or not, and how long it waited.
    pub fn observe(&mut self, r: &JobResult) {
        self.jobs += 1;
        self.failed += i64::from(r.status == JobStatus::Failed);
        if let Some(started) = r.started_at {
            self.add_wait(started - r.submitted_at);
        }
    }

    pub fn add_wait(&mut self, wait_ms: Millis) {
        self.waits.add(wait_ms);
    }

    /// The p99 wait (its bucket's upper bound); 0 when nothing waited.
    pub fn wait_p99(&self) -> Millis {
        self.waits.quantile(990)
    }
}

/// Where a period puts a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Breach,
    Clear,
    /// Between the clear level and the threshold: no move either way.
    Between,
}

/// Where `p` puts `rule` under `t`, with the value compared.
pub fn level(rule: Rule, t: &Thresholds, p: &Period) -> (Level, f64) {
    let (value, threshold, breach) = match rule {
        Rule::QueueWait => {
            let v = p.wait_p99() as f64;
            (v, t.queue_wait_p99_ms as f64, v > t.queue_wait_p99_ms as f64)
        }
        Rule::DeadLetters => (p.failed as f64, t.dead_letters as f64, p.failed >= t.dead_letters),
        Rule::FailureRate => {
            if p.jobs < t.failure_min_jobs.max(1) {
                return (Level::Clear, 0.0);
            }
            let v = p.failed as f64 / p.jobs as f64;
            (v, t.failure_rate, v > t.failure_rate)
        }
        Rule::Volume => {
            let Some(base) = p.baseline else { return (Level::Clear, 0.0) };
            let v = p.jobs as f64;
            if p.jobs < t.volume_min_jobs.max(1) {
                return (Level::Clear, v);
            }
            // A quiet tenant's baseline counts as one job per period.
            let limit = t.volume_factor * base.max(1.0);
            (v, limit, v > limit)
        }
    };
    let lvl = if breach {
        Level::Breach
    } else if value <= threshold * CLEAR_FRACTION {
        Level::Clear
    } else {
        Level::Between
    };
    (lvl, value)
}

/// One rule's state for one tenant: open since when, and the run of periods towards the
/// next transition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleState {
    pub opened_at: Option<Millis>,
    pub streak: u32,
}

/// A rule's change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Opened { opened_at: Millis },
    Resolved { opened_at: Millis, resolved_at: Millis },
}

impl RuleState {
    /// Idle: closed with no run towards opening (a caller may forget it).
    pub fn idle(&self) -> bool {
        self.opened_at.is_none() && self.streak == 0
    }

    /// Feeds one period's level at `now`.
    pub fn step(&mut self, lvl: Level, for_periods: u32, now: Millis) -> Option<Transition> {
        let towards = matches!((self.opened_at, lvl), (None, Level::Breach) | (Some(_), Level::Clear));
        if !towards {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        if self.streak < for_periods.max(1) {
            return None;
        }
        self.streak = 0;
        match self.opened_at.take() {
            None => {
                self.opened_at = Some(now);
                Some(Transition::Opened { opened_at: now })
            }
            Some(opened_at) => Some(Transition::Resolved { opened_at, resolved_at: now }),
        }
    }
}

/// An alert's id, the same for its opened and resolved events and every copy of them:
/// derived from (tenant, rule, opened_at).
pub fn alert_id(tenant: &str, rule: Rule, opened_at: Millis) -> String {
    alert_id_named(tenant, rule.as_str(), opened_at)
}

/// [`alert_id`] of an alert raised outside these rules (a dependency's breaker:
/// `core::dependency::alert_rule`).
pub fn alert_id_named(tenant: &str, rule: &str, opened_at: Millis) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(tenant.as_bytes());
    h.update([0]);
    h.update(rule.as_bytes());
    h.update([0]);
    h.update(opened_at.to_be_bytes());
    let hex: String = h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("alert-{hex}")
}

/// A rule's threshold under `t` for period `p`, as [`level`] compares it.
pub fn threshold(rule: Rule, t: &Thresholds, p: &Period) -> f64 {
    match rule {
        Rule::QueueWait => t.queue_wait_p99_ms as f64,
        Rule::DeadLetters => t.dead_letters as f64,
        Rule::FailureRate => t.failure_rate,
        Rule::Volume => t.volume_factor * p.baseline.unwrap_or(0.0).max(1.0),
    }
}

/// Settings over the defaults, for a tier (`[alerts.tiers.<tier>]`) or one tenant
/// (`[alerts.tenants.<name>]`): each field set replaces the one below it.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Override {
    pub queue_wait_p99_ms: Option<i64>,
    pub dead_letters: Option<i64>,
    pub failure_rate: Option<f64>,
    pub failure_min_jobs: Option<i64>,
    pub for_periods: Option<u32>,
    pub volume_factor: Option<f64>,
    pub volume_min_jobs: Option<i64>,
    /// Rules turned off (an open alert of a rule turned off resolves at the next period).
    pub off: Option<Vec<Rule>>,
    /// Where the tenant's alert events are POSTed (tenants only; signed with
    /// `webhooks.secrets.<tenant>`).
    pub webhook_url: Option<String>,
}

impl Override {
    fn apply(&self, s: &mut Settings) {
        let t = &mut s.thresholds;
        t.queue_wait_p99_ms = self.queue_wait_p99_ms.unwrap_or(t.queue_wait_p99_ms);
        t.dead_letters = self.dead_letters.unwrap_or(t.dead_letters);
        t.failure_rate = self.failure_rate.unwrap_or(t.failure_rate);
        t.failure_min_jobs = self.failure_min_jobs.unwrap_or(t.failure_min_jobs);
        t.for_periods = self.for_periods.unwrap_or(t.for_periods);
        t.volume_factor = self.volume_factor.unwrap_or(t.volume_factor);
        t.volume_min_jobs = self.volume_min_jobs.unwrap_or(t.volume_min_jobs);
        if let Some(off) = &self.off {
            s.off = off.clone();
        }
        if let Some(u) = &self.webhook_url {
            s.webhook_url = Some(u.clone());
        }
    }

    fn check(&self, at: &str) -> Result<(), Invalid> {
        let bad = |f: &str, p: &str| Err(Invalid::new(format!("{at}.{f}"), p));
        if self.queue_wait_p99_ms.is_some_and(|v| v < 1) {
            return bad("queue_wait_p99_ms", "must be at least 1 (turn the rule off with off = [\"queue_wait\"])");
        }
        if self.dead_letters.is_some_and(|v| v < 1) {
            return bad("dead_letters", "must be at least 1 (turn the rule off with off = [\"dead_letters\"])");
        }
        if self.failure_rate.is_some_and(|v| !(v > 0.0 && v < 1.0)) {
            return bad("failure_rate", "is a share above 0 and below 1, e.g. 0.2");
        }
        if self.failure_min_jobs.is_some_and(|v| v < 1) {
            return bad("failure_min_jobs", "must be at least 1");
        }
        if self.for_periods.is_some_and(|v| !(1..=1440).contains(&v)) {
            return bad("for_periods", "must be 1 to 1440 periods");
        }
        if self.volume_factor.is_some_and(|v| !(v > 1.0 && v <= 1_000.0)) {
            return bad("volume_factor", "is a multiple of the tenant's baseline above 1 and at most 1000, e.g. 10");
        }
        if self.volume_min_jobs.is_some_and(|v| v < 1) {
            return bad("volume_min_jobs", "must be at least 1 (turn the rule off with off = [\"volume\"])");
        }
        if let Some(u) = &self.webhook_url {
            crate::core::webhooks::check_url(u).map_err(|e| Invalid::new(format!("{at}.webhook_url"), e))?;
        }
        Ok(())
    }
}

/// One tenant's alert settings: the defaults, its tier's, its own.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    pub thresholds: Thresholds,
    pub off: Vec<Rule>,
    pub webhook_url: Option<String>,
}

/// `[alerts]`: tenant-facing alerts (docs/usage.md, "Tenant-facing alerts").
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {
    /// The evaluation period.
    pub period: DurationMs,
    /// How long an alert's row is kept after it opened.
    pub retention: DurationMs,
    /// Most tenants the evaluator tracks at once (a period's results of tenants beyond
    /// it are not evaluated, counted and warned); also the most (tenant, limit) pairs the
    /// limit alerts track.
    pub max_tenants: usize,
    /// A limit alert (`limit:refused:<limit>:<pool>`, `limit:near:...`) resolves after
    /// this many periods in a row without a new refusal or near-limit admission.
    pub limit_clear_periods: u32,
    /// Most alert openings delivered to one tenant's webhook per hour (the rest are
    /// stored and shown, not sent).
    pub max_deliveries_per_hour: u32,
    /// How far back a tenant's volume baseline looks ([`BASELINE_MS`] by default: the
    /// seeds' "1h baseline"), from one period to a day.
    pub baseline: DurationMs,
    /// Defaults per tier, over the built-in defaults ([`Thresholds::default`]).
    pub tiers: BTreeMap<Tier, Override>,
    /// Per-tenant settings over its tier's, and its webhook.
    pub tenants: BTreeMap<String, Override>,
}

impl Default for AlertsConfig {
    fn default() -> Self {
        AlertsConfig {
            period: DurationMs::secs(60),
            retention: DurationMs(30 * 86_400_000),
            max_tenants: 100_000,
            limit_clear_periods: 5,
            max_deliveries_per_hour: 30,
            baseline: DurationMs(BASELINE_MS),
            tiers: BTreeMap::new(),
            tenants: BTreeMap::new(),
        }
    }
}

impl AlertsConfig {
    /// What is wrong, at its key under `alerts`.
    pub fn validate(&self) -> Result<(), Invalid> {
        if !(1_000..=3_600_000).contains(&self.period.0) {
            return Err(Invalid::new("period", "must be from \"1s\" to \"1h\" (the default is \"60s\")"));
        }
        if self.retention.0 < 3_600_000 {
            return Err(Invalid::new("retention", "must be at least \"1h\" (the default is \"30d\")"));
        }
        if self.max_tenants == 0 {
            return Err(Invalid::new("max_tenants", "must be at least 1 (the default is 100000)"));
        }
        if !(1..=1_000).contains(&self.limit_clear_periods) {
            return Err(Invalid::new("limit_clear_periods", "must be 1 to 1000 (the default is 5)"));
        }
        if !(1..=10_000).contains(&self.max_deliveries_per_hour) {
            return Err(Invalid::new("max_deliveries_per_hour", "must be 1 to 10000 (the default is 30)"));
        }
        if self.baseline.0 < self.period.0 || self.baseline.0 > 86_400_000 {
            return Err(Invalid::new(
                "baseline",
                "must be from one period (alerts.period) to \"24h\" (the default is \"1h\")",
            ));
        }
        for (tier, o) in &self.tiers {
            if o.webhook_url.is_some() {
                return Err(Invalid::new(
                    format!("tiers.{tier}.webhook_url"),
                    "a webhook is a tenant's own: set it under [alerts.tenants.<name>]",
                ));
            }
            o.check(&format!("tiers.{tier}"))?;
        }
        for (name, o) in &self.tenants {
            o.check(&format!("tenants.{name}"))?;
        }
        Ok(())
    }

    /// `tenant`'s settings at `tier`.
    pub fn settings(&self, tenant: &str, tier: Tier) -> Settings {
        let mut s = Settings::default();
        if let Some(o) = self.tiers.get(&tier) {
            o.apply(&mut s);
        }
        if let Some(o) = self.tenants.get(tenant) {
            o.apply(&mut s);
        }
        s
    }
}

/// One tenant under evaluation: this period's observations, each rule's state and its
/// volume baseline (mean jobs per period over the evaluator's baseline).
#[derive(Clone, Debug, Default)]
struct Tracked {
    period: Period,
    states: [RuleState; Rule::ALL.len()],
    mean_jobs: f64,
}

impl Tracked {
    /// Nothing to remember: no results, no rule under way, a baseline of under half a
    /// job per period (forgotten, it reads as none, which is what it nearly is).
    fn idle(&self) -> bool {
        self.period.jobs == 0 && self.states.iter().all(RuleState::idle) && self.mean_jobs < 0.5
    }
}

fn rule_index(rule: Rule) -> usize {
    Rule::ALL.iter().position(|r| *r == rule).expect("every rule is in Rule::ALL")
}

/// An alert opened or resolved at an evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub tenant: String,
    pub rule: Rule,
    pub alert_id: String,
    pub transition: Transition,
    /// The value of the period that made the change, and the threshold it was held to.
    pub value: f64,
    pub threshold: f64,
}

/// How far before its start a leader's first period reaches: the results published
/// while no leader read them (a leader starting, or taking over after one that stopped)
/// are evaluated in its first period, up to this old.
pub const CATCH_UP_MS: Millis = 15 * 60_000;

/// Whether the result at `offset` is new to the alerts: at or past `read_to`, the offset a
/// previous leader had read up to on its partition (its recorded resume position's `next`;
/// 0 when none). Those before it are read again to rebuild the open usage window, and were
/// counted by that leader's alerts already.
pub fn unread_by_an_earlier_leader(offset: i64, read_to: i64) -> bool {
    offset >= read_to
}

/// Every tenant's alerts, fed results as they are read and evaluated once per period.
/// Holds only tenants with results this period or a rule not idle, at most `max_tenants`.
#[derive(Clone, Debug)]
pub struct Evaluator {
    max_tenants: usize,
    /// How far back the volume baseline looks (`alerts.baseline`), in ms.
    baseline_ms: Millis,
    /// When this evaluator began watching: baselines are known `baseline_ms` later.
    started: Millis,
    period_start: Millis,
    tracked: HashMap<String, Tracked>,
    /// Results not evaluated: their tenant would pass `max_tenants`.
    pub untracked: u64,
}

impl Evaluator {
    /// An evaluator watching from `now`, its baselines looking [`BASELINE_MS`] back.
    pub fn new(max_tenants: usize, now: Millis) -> Self {
        Evaluator::with_baseline(max_tenants, now, BASELINE_MS)
    }

    /// An evaluator whose volume baselines look `baseline_ms` back (at least 1 ms).
    pub fn with_baseline(max_tenants: usize, now: Millis, baseline_ms: Millis) -> Self {
        let baseline_ms = baseline_ms.max(1);
        Evaluator { max_tenants, baseline_ms, started: now, period_start: now, tracked: HashMap::new(), untracked: 0 }
    }

    /// Tenants tracked now.
    pub fn tenants(&self) -> usize {
        self.tracked.len()
    }

    /// An alert open in the store (a new leader picks up where the last one stopped).
    pub fn restore(&mut self, tenant: &str, rule: Rule, opened_at: Millis) {
        if let Some(t) = self.entry(tenant) {
            t.states[rule_index(rule)] = RuleState { opened_at: Some(opened_at), streak: 0 };
        }
    }

    fn entry(&mut self, tenant: &str) -> Option<&mut Tracked> {
        if !self.tracked.contains_key(tenant) {
            if self.tracked.len() >= self.max_tenants {
                self.untracked += 1;
                return None;
            }
            self.tracked.insert(tenant.to_string(), Tracked::default());
        }
        self.tracked.get_mut(tenant)
    }

    /// Adds a result published at `published_at`; a result published before this period
    /// began is not counted. The first period of a leader begins [`CATCH_UP_MS`] before it
    /// starts (`Evaluator::new(max, now - CATCH_UP_MS)`): results published while no leader
    /// read them count, results older than that do not; the caller feeds only results no
    /// earlier leader read (by offset: [`unread_by_an_earlier_leader`]).
    pub fn observe(&mut self, r: &JobResult, published_at: Millis) {
        if published_at < self.period_start {
            return;
        }
        if let Some(t) = self.entry(&r.tenant) {
            t.period.observe(r);
        }
    }

    /// Ends the period at `now`: each tracked tenant's rules step with its settings, its
    /// baseline moves towards the period's count, and tenants left idle are forgotten.
    pub fn evaluate(&mut self, now: Millis, settings: impl Fn(&str) -> Settings) -> Vec<Change> {
        let mut out = Vec::new();
        let known = now.saturating_sub(self.started) >= self.baseline_ms;
        let share = (now.saturating_sub(self.period_start) as f64 / self.baseline_ms as f64).clamp(0.0, 1.0);
        for (tenant, t) in self.tracked.iter_mut() {
            t.period.baseline = known.then_some(t.mean_jobs);
            let s = settings(tenant);
            for rule in Rule::ALL {
                let (lvl, value, for_periods) = if s.off.contains(&rule) {
                    (Level::Clear, 0.0, 1)
                } else {
                    let (lvl, value) = level(rule, &s.thresholds, &t.period);
                    (lvl, value, s.thresholds.for_periods)
                };
                let Some(tr) = t.states[rule_index(rule)].step(lvl, for_periods, now) else { continue };
                let opened_at = match tr {
                    Transition::Opened { opened_at } | Transition::Resolved { opened_at, .. } => opened_at,
                };
                out.push(Change {
                    tenant: tenant.clone(),
                    rule,
                    alert_id: alert_id(tenant, rule, opened_at),
                    transition: tr,
                    value,
                    threshold: threshold(rule, &s.thresholds, &t.period),
                });
            }
            t.mean_jobs += share * (t.period.jobs as f64 - t.mean_jobs);
            t.period = Period::default();
        }
        self.tracked.retain(|_, t| !t.idle());
        self.period_start = now;
        out.sort_by(|a, b| (&a.tenant, a.rule).cmp(&(&b.tenant, b.rule)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn period(waits: &[Millis], jobs: i64, failed: i64) -> Period {
        let mut p = Period { jobs, failed, ..Period::default() };
        for w in waits {
            p.add_wait(*w);
        }
        p
    }

    #[test]
    fn histograms_merge_read_quantiles_and_round_trip_their_counts() {
        let (mut a, mut b) = (WaitHistogram::default(), WaitHistogram::default());
        (0..50).for_each(|_| a.add(10));
        (0..50).for_each(|_| b.add(1_000));
        a.merge(&b);
        assert_eq!((a.count(), a.quantile(500), a.quantile(510), a.quantile(990)), (100, 12, 1_024, 1_024));
        let stored: Vec<i32> = a.counts().iter().map(|c| *c as i32).collect();
        assert_eq!(WaitHistogram::from_counts(&stored), a);
        assert_eq!(WaitHistogram::from_counts(&[-3, 2]).count(), 2, "negative counts read as none");
        assert_eq!(WaitHistogram::default().quantile(500), 0);
    }

    #[test]
    fn p99_is_an_upper_bound_within_41_percent() {
        for w in [1, 7, 100, 999, 60_000, 3_600_000] {
            let p = period(&[w], 1, 0);
            let p99 = p.wait_p99();
            assert!(p99 >= w && (p99 as f64) <= w as f64 * 1.42 + 1.0, "{w} -> {p99}");
        }
        let mut waits = vec![10; 99];
        waits.push(1_000_000);
        assert!(period(&waits, 100, 0).wait_p99() < 100, "one outlier in 100 is above the p99");
        assert_eq!(Period::default().wait_p99(), 0);
    }

    #[test]
    fn a_long_wait_opens_once_after_its_periods_and_resolves_once_when_clear() {
        let t = Thresholds { queue_wait_p99_ms: 1_000, for_periods: 2, ..Thresholds::default() };
        let mut s = RuleState::default();
        let slow = period(&[5_000], 1, 0);
        let mut out = Vec::new();
        for (i, p) in [&slow, &slow, &slow, &Period::default(), &Period::default()].iter().enumerate() {
            out.extend(s.step(level(Rule::QueueWait, &t, p).0, t.for_periods, i as Millis));
        }
        assert_eq!(
            out,
            vec![Transition::Opened { opened_at: 1 }, Transition::Resolved { opened_at: 1, resolved_at: 4 }]
        );
    }

    #[test]
    fn failure_rate_needs_its_minimum_of_jobs() {
        let t = Thresholds { failure_rate: 0.1, failure_min_jobs: 10, ..Thresholds::default() };
        assert_eq!(level(Rule::FailureRate, &t, &period(&[], 5, 5)).0, Level::Clear);
        assert_eq!(level(Rule::FailureRate, &t, &period(&[], 10, 5)).0, Level::Breach);
        assert_eq!(level(Rule::FailureRate, &t, &period(&[], 100, 9)).0, Level::Between);
        assert_eq!(level(Rule::FailureRate, &t, &period(&[], 100, 5)).0, Level::Clear);
        assert_eq!(level(Rule::DeadLetters, &t, &period(&[], 100, 10)).0, Level::Breach);
    }

    #[test]
    fn volume_breaches_past_its_factor_of_the_baseline_with_its_minimum() {
        let t = Thresholds::default();
        let at = |jobs: i64, baseline: Option<f64>| {
            level(Rule::Volume, &t, &Period { jobs, baseline, ..Period::default() }).0
        };
        assert_eq!(at(5_000, None), Level::Clear, "no baseline known yet");
        assert_eq!(at(99, Some(0.0)), Level::Clear, "under the minimum");
        assert_eq!(at(100, Some(0.0)), Level::Breach, "a quiet tenant's baseline counts as one job");
        assert_eq!(at(1_001, Some(100.0)), Level::Breach);
        assert_eq!(at(1_000, Some(100.0)), Level::Between);
        assert_eq!(at(500, Some(100.0)), Level::Clear);
        let p = Period { jobs: 1, baseline: Some(30.0), ..Period::default() };
        assert_eq!(threshold(Rule::Volume, &t, &p), 300.0);
    }

    /// A tenant steady for an hour, then at 20x: one volume alert, after its periods;
    /// back to steady, it resolves. A new evaluator (a new leader) judges no volume in its
    /// first hour, however large.
    #[test]
    fn a_tenant_at_twenty_times_its_hour_opens_one_volume_alert() {
        let minute = 60_000;
        let only_volume = |_: &str| Settings {
            thresholds: Thresholds { for_periods: 2, ..Thresholds::default() },
            off: vec![Rule::QueueWait, Rule::DeadLetters, Rule::FailureRate],
            ..Settings::default()
        };
        let mut e = Evaluator::new(10, 0);
        let mut changes = Vec::new();
        for m in 1..=150 {
            let jobs = if (70..80).contains(&m) { 2_000 } else { 100 };
            for _ in 0..jobs {
                e.observe(&result("acme", 1), (m - 1) * minute);
            }
            let got = e.evaluate(m * minute, only_volume);
            if m <= 60 {
                assert!(got.is_empty(), "minute {m}: nothing is judged in the first hour: {got:?}");
            }
            changes.extend(got);
        }
        let kinds: Vec<_> =
            changes.iter().map(|c| (c.rule, matches!(c.transition, Transition::Opened { .. }))).collect();
        assert_eq!(kinds, vec![(Rule::Volume, true), (Rule::Volume, false)], "{changes:?}");
        assert_eq!(changes[0].transition, Transition::Opened { opened_at: 71 * minute });
        assert!(
            (990.0..1_100.0).contains(&changes[0].threshold),
            "10x a baseline of about 100: {}",
            changes[0].threshold
        );
    }

    /// A 10 s baseline (`alerts.baseline`) of 1 s periods: judged after 10 s, not an hour,
    /// and a tenant steady at 2 jobs a period that then finishes 100 in one opens one
    /// volume alert against a baseline of about 2, resolved once its periods are quiet.
    #[test]
    fn a_short_baseline_is_known_after_it_and_judges_against_its_own_mean() {
        let only_volume = |_: &str| Settings {
            thresholds: Thresholds { for_periods: 1, volume_min_jobs: 20, ..Thresholds::default() },
            off: vec![Rule::QueueWait, Rule::DeadLetters, Rule::FailureRate],
            ..Settings::default()
        };
        let mut e = Evaluator::with_baseline(10, 0, 10_000);
        let mut changes = Vec::new();
        for s in 1..=40 {
            let jobs = match s {
                25 => 100,
                _ if s < 25 => 2,
                _ => 0,
            };
            for _ in 0..jobs {
                e.observe(&result("acme", 1), (s - 1) * 1_000);
            }
            changes.extend(e.evaluate(s * 1_000, only_volume));
        }
        let kinds: Vec<_> = changes.iter().map(|c| matches!(c.transition, Transition::Opened { .. })).collect();
        assert_eq!(kinds, vec![true, false], "{changes:?}");
        assert_eq!(changes[0].transition, Transition::Opened { opened_at: 25_000 });
        assert!((10.0..=20.0).contains(&changes[0].threshold), "10x a baseline of under 2: {}", changes[0].threshold);
        let bad = |b: &str| toml::from_str::<AlertsConfig>(&format!("period = \"60s\"\nbaseline = \"{b}\"\n")).unwrap();
        bad("1h").validate().unwrap();
        assert_eq!(bad("30s").validate().unwrap_err().field, "baseline", "shorter than a period");
        assert_eq!(bad("2d").validate().unwrap_err().field, "baseline", "longer than a day");
    }

    #[test]
    fn alert_ids_depend_on_tenant_rule_and_opening() {
        let a = alert_id("acme", Rule::QueueWait, 5);
        assert_eq!(a, alert_id("acme", Rule::QueueWait, 5));
        assert_ne!(a, alert_id("acme", Rule::QueueWait, 6));
        assert_ne!(a, alert_id("acme", Rule::DeadLetters, 5));
        assert_ne!(a, alert_id("acmf", Rule::QueueWait, 5));
    }

    fn result(tenant: &str, wait: Millis) -> JobResult {
        JobResult {
            job_id: "j".into(),
            tenant: tenant.into(),
            job_type: "echo".into(),
            pool: crate::model::Pool::Short,
            status: JobStatus::Succeeded,
            output: None,
            error: None,
            failure_class: None,
            attempts: 1,
            generation: 0,
            submitted_at: 1_000,
            started_at: Some(1_000 + wait),
            finished_at: 2_000 + wait,
            worker_id: "w".into(),
            peak_memory_bytes: None,
            cpu_ms: None,
        }
    }

    fn quick(queue_wait_p99_ms: i64) -> Settings {
        let thresholds = Thresholds { queue_wait_p99_ms, for_periods: 1, ..Thresholds::default() };
        Settings { thresholds, ..Settings::default() }
    }

    #[test]
    fn the_evaluator_opens_and_resolves_once_and_forgets_idle_tenants() {
        let mut e = Evaluator::new(10, 0);
        for now in 1..=3 {
            e.observe(&result("slow", 5_000), now * 100);
            e.observe(&result("fast", 1), now * 100);
            let got = e.evaluate(now * 100 + 50, |_| quick(1_000));
            assert_eq!(got.len(), usize::from(now == 1), "{got:?}");
        }
        assert_eq!(e.tenants(), 1, "fast is forgotten at each evaluation, slow has an open alert");
        let got = e.evaluate(400, |_| quick(1_000));
        assert!(matches!(got[..], [Change { transition: Transition::Resolved { opened_at: 150, .. }, .. }]));
        assert_eq!(got[0].alert_id, alert_id("slow", Rule::QueueWait, 150));
        assert_eq!(e.tenants(), 0, "a tenant without results or open alerts costs nothing");
    }

    #[test]
    fn results_before_the_period_and_tenants_past_the_bound_are_not_counted() {
        let mut e = Evaluator::new(1, 1_000);
        e.observe(&result("replayed", 5_000), 999);
        assert_eq!(e.tenants(), 0);
        e.observe(&result("a", 5_000), 1_000);
        e.observe(&result("b", 5_000), 1_000);
        assert_eq!((e.tenants(), e.untracked), (1, 1));
    }

    #[test]
    fn a_leaders_first_period_takes_in_what_no_leader_read_up_to_the_catch_up() {
        let start = 10 * CATCH_UP_MS;
        let mut e = Evaluator::new(10, start - CATCH_UP_MS);
        // Published while the leader was starting (or none led): counted.
        e.observe(&result("waited", 5_000), start - 2_000);
        // Older than the catch-up: not.
        e.observe(&result("ancient", 5_000), start - CATCH_UP_MS - 1);
        assert_eq!(e.tenants(), 1);
        let got = e.evaluate(start + 1_000, |_| quick(1_000));
        assert!(matches!(got[..], [Change { transition: Transition::Opened { .. }, .. }]), "{got:?}");
        assert_eq!(got[0].tenant, "waited");
        // Offsets an earlier leader read (re-read for the usage window) are not fed again.
        assert!(!unread_by_an_earlier_leader(41, 42));
        assert!(unread_by_an_earlier_leader(42, 42) && unread_by_an_earlier_leader(0, 0));
    }

    #[test]
    fn a_restored_alert_does_not_open_again_and_a_rule_turned_off_resolves() {
        let mut e = Evaluator::new(10, 0);
        e.restore("t", Rule::QueueWait, 7);
        e.observe(&result("t", 5_000), 0);
        assert!(e.evaluate(10, |_| quick(1_000)).is_empty(), "still open: no second opened");
        e.observe(&result("t", 5_000), 10);
        let off = |_: &str| Settings { off: vec![Rule::QueueWait], ..quick(1_000) };
        let got = e.evaluate(20, off);
        assert!(matches!(got[..], [Change { transition: Transition::Resolved { opened_at: 7, resolved_at: 20 }, .. }]));
    }

    #[test]
    fn settings_merge_defaults_tier_and_tenant_and_bad_ones_are_named() {
        let toml = "period = \"5s\"\n[tiers.pro]\nqueue_wait_p99_ms = 10\nfor_periods = 2\n\
                    [tenants.acme]\nfor_periods = 3\noff = [\"failure_rate\"]\nwebhook_url = \"http://127.0.0.1:9/a\"\n";
        let c: AlertsConfig = toml::from_str(toml).unwrap();
        c.validate().unwrap();
        let s = c.settings("acme", Tier::Pro);
        assert_eq!((s.thresholds.queue_wait_p99_ms, s.thresholds.for_periods), (10, 3));
        assert_eq!((s.off, s.webhook_url.as_deref()), (vec![Rule::FailureRate], Some("http://127.0.0.1:9/a")));
        assert_eq!(c.settings("other", Tier::Free), Settings::default());
        let bad: AlertsConfig = toml::from_str("[tiers.pro]\nwebhook_url = \"http://x/\"\n").unwrap();
        assert_eq!(bad.validate().unwrap_err().field, "tiers.pro.webhook_url");
        let bad: AlertsConfig = toml::from_str("[tenants.a]\nfailure_rate = 2.0\n").unwrap();
        assert_eq!(bad.validate().unwrap_err().field, "tenants.a.failure_rate");
        for v in ["1.0", "0.5", "1001.0", "nan"] {
            let bad: AlertsConfig = toml::from_str(&format!("[tiers.pro]\nvolume_factor = {v}\n")).unwrap();
            assert_eq!(bad.validate().unwrap_err().field, "tiers.pro.volume_factor", "{v}");
        }
        let bad: AlertsConfig = toml::from_str("[tenants.a]\nvolume_min_jobs = 0\n").unwrap();
        assert_eq!(bad.validate().unwrap_err().field, "tenants.a.volume_min_jobs");
        assert!(toml::from_str::<AlertsConfig>("[tenants.a]\noff = [\"nope\"]\n").is_err());
    }

    proptest! {
        /// Whatever the tenants' waits, the evaluator never holds more than its bound,
        /// and per (tenant, rule) its changes alternate opened, resolved.
        #[test]
        fn the_evaluator_stays_bounded_and_alternates(
            periods in proptest::collection::vec(proptest::collection::vec((0usize..20, 0i64..3_000), 0..30), 1..40),
            max_tenants in 1usize..8,
        ) {
            let mut e = Evaluator::new(max_tenants, 0);
            let mut open: HashMap<String, bool> = HashMap::new();
            for (i, results) in periods.iter().enumerate() {
                let now = i as Millis * 10;
                for (t, w) in results {
                    e.observe(&result(&format!("t{t}"), *w), now);
                }
                prop_assert!(e.tenants() <= max_tenants);
                for c in e.evaluate(now + 5, |_| quick(1_000)) {
                    let was = open.insert(c.tenant.clone(), matches!(c.transition, Transition::Opened { .. }));
                    prop_assert_ne!(was.unwrap_or(false), matches!(c.transition, Transition::Opened { .. }));
                }
            }
        }
    }

    proptest! {
        /// Any sequence of periods gives alternating transitions, opened first, each
        /// resolution naming the opening before it; never two opens in a row.
        #[test]
        fn transitions_alternate_whatever_the_values(
            waits in proptest::collection::vec(0i64..3_000, 0..300),
            for_periods in 1u32..5,
        ) {
            let t = Thresholds { queue_wait_p99_ms: 1_000, for_periods, ..Thresholds::default() };
            let mut s = RuleState::default();
            let mut open: Option<Millis> = None;
            for (now, w) in waits.iter().enumerate() {
                match s.step(level(Rule::QueueWait, &t, &period(&[*w], 1, 0)).0, for_periods, now as Millis) {
                    Some(Transition::Opened { opened_at }) => {
                        prop_assert!(open.is_none(), "two opens in a row");
                        open = Some(opened_at);
                    }
                    Some(Transition::Resolved { opened_at, .. }) => {
                        prop_assert_eq!(open.take(), Some(opened_at));
                    }
                    None => {}
                }
                prop_assert_eq!(s.opened_at, open);
            }
        }

        /// A value hovering around the threshold (never down to the clear level) opens at
        /// most once and never resolves.
        #[test]
        fn hovering_at_the_threshold_opens_at_most_once(
            waits in proptest::collection::vec(400i64..1_300, 0..300),
        ) {
            let t = Thresholds { queue_wait_p99_ms: 1_000, for_periods: 1, ..Thresholds::default() };
            let mut s = RuleState::default();
            let mut n = 0;
            for (now, w) in waits.iter().enumerate() {
                n += usize::from(s.step(level(Rule::QueueWait, &t, &period(&[*w], 1, 0)).0, 1, now as Millis).is_some());
            }
            prop_assert!(n <= 1, "{} transitions", n);
        }
    }
}
