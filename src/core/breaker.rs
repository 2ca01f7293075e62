//! Per-job-type circuit breaker for dependency failures.
//!
//! When a dependency goes down, every job that needs it fails with `dependency`, is
//! retried, fails again: a retry storm that keeps hammering the dependency while it
//! tries to recover and keeps workers busy with doomed attempts. The breaker stops that:
//! once at least half of a job type's recent attempts failed on a dependency (over a
//! rolling window, and only after a minimum number of attempts so 1 failure of 1 does
//! not trip it) it opens and the worker holds that type's jobs back (re-queues them with
//! `not_before = retry_at`, using no attempt) for a cool-down. Then exactly one probe
//! job is let through: success closes the breaker, failure opens it for another
//! cool-down.
//!
//! The breaker is a plain state machine: `now` is an argument and nothing runs on its
//! own, so an open breaker turns half-open when it is next asked (`allow`). The caller
//! decides what counts: a `dependency` failure is `record(now, false)`, a success is
//! `record(now, true)`; other failures are the job's own problem and are either
//! recorded as ok (the dependency answered) or not at all. A probe that ends without a
//! verdict (cancelled, worker lost) is released with `abandon`, and a probe that never
//! reports is given up after `probe_timeout` so the breaker cannot stay stuck.
//!
//! While half-open, the first outcome recorded is taken as the probe's verdict, even if
//! it comes from a job admitted before the breaker opened; such a late outcome is as
//! recent a sign of the dependency's health as the probe's.

use crate::core::retry::DurationMs;
use crate::core::window::{Counts, RollingWindow};
use crate::core::FastMap;
use crate::model::{FailureClass, Millis};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Settings of a [`Breaker`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// Rolling window the failure rate is measured over.
    pub window: DurationMs,
    /// Attempts needed in the window before the breaker may open.
    pub min_requests: u32,
    /// Failure share at or above which it opens (0.5 = half).
    pub failure_ratio: f64,
    /// How long it stays open before letting a probe through.
    pub cool_down: DurationMs,
    /// How long a probe may take to report before another one is let through.
    pub probe_timeout: DurationMs,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            window: DurationMs::secs(30),
            min_requests: 10,
            failure_ratio: 0.5,
            cool_down: DurationMs::secs(60),
            probe_timeout: DurationMs::mins(5),
        }
    }
}

impl BreakerConfig {
    pub fn validate(&self) -> Result<(), crate::core::invalid::Invalid> {
        let err = |field: &str, problem: String| crate::core::invalid::Invalid::err(field, problem);
        if self.window.0 < 1_000 {
            return err("window", format!("{} is too short: use at least \"1s\" (e.g. \"30s\")", self.window));
        }
        if self.min_requests < 1 {
            return err("min_requests", "must be at least 1 (e.g. 10)".into());
        }
        if !(self.failure_ratio > 0.0 && self.failure_ratio <= 1.0) {
            return err(
                "failure_ratio",
                format!("{} is out of range: use a share above 0 and at most 1 (e.g. 0.5)", self.failure_ratio),
            );
        }
        if self.cool_down.0 < 0 {
            return err("cool_down", "must not be negative (e.g. \"60s\")".into());
        }
        if self.probe_timeout.0 < 1 {
            return err("probe_timeout", "must be positive (e.g. \"5m\")".into());
        }
        Ok(())
    }
}

/// The breaker's state as of its last transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Jobs run normally; outcomes are counted.
    Closed,
    /// Jobs are held back until `until`.
    Open { until: Millis },
    /// One probe may run; `probe_deadline` is set while one is out.
    HalfOpen { probe_deadline: Option<Millis> },
}

impl BreakerState {
    /// Bounded label for metrics and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen { .. } => "half_open",
        }
    }
}

/// Whether a job of this type may run now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Run it.
    Allowed,
    /// Run it as the single probe; report its outcome with `record` (or `abandon`).
    Probe,
    /// Do not run it; hold it back until `retry_at` (always later than `now`).
    Rejected { retry_at: Millis },
}

/// Circuit breaker of one job type.
#[derive(Debug, Clone)]
pub struct Breaker {
    config: BreakerConfig,
    window: RollingWindow,
    state: BreakerState,
}

impl Breaker {
    /// A closed breaker. Settings are used as given; out-of-range values are clamped
    /// where they are used (check them with [`BreakerConfig::validate`] when parsing).
    pub fn new(config: BreakerConfig) -> Self {
        Breaker { window: RollingWindow::new(config.window.0, 10), config, state: BreakerState::Closed }
    }

    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// Outcomes counted in the window at `now` (only while closed).
    pub fn counts(&self, now: Millis) -> Counts {
        self.window.counts(now)
    }

    fn probe(&mut self, now: Millis) -> Verdict {
        let timeout = self.config.probe_timeout.0.max(1);
        self.state = BreakerState::HalfOpen { probe_deadline: Some(now.saturating_add(timeout)) };
        Verdict::Probe
    }

    /// Ask whether a job may run at `now`. Turns an open breaker half-open once its
    /// cool-down is over and hands out the probe.
    pub fn allow(&mut self, now: Millis) -> Verdict {
        match self.state {
            BreakerState::Closed => Verdict::Allowed,
            BreakerState::Open { until } if now < until => Verdict::Rejected { retry_at: until },
            BreakerState::Open { .. } => self.probe(now),
            BreakerState::HalfOpen { probe_deadline: Some(deadline) } if now < deadline => {
                Verdict::Rejected { retry_at: deadline }
            }
            BreakerState::HalfOpen { .. } => self.probe(now),
        }
    }

    fn open(&mut self, now: Millis) -> Option<BreakerState> {
        let until = now.saturating_add(self.config.cool_down.0.max(0)).max(now.saturating_add(1));
        self.state = BreakerState::Open { until };
        self.window.clear();
        Some(self.state)
    }

    /// Record an outcome at `now` (`ok = false` for a dependency failure). Returns the
    /// new state when this changed it (for logs and the `dependency_circuit_open` metric).
    pub fn record(&mut self, now: Millis, ok: bool) -> Option<BreakerState> {
        match self.state {
            BreakerState::Closed => {
                self.window.record(now, ok);
                if ok {
                    return None;
                }
                let c = self.window.counts(now);
                let ratio = if self.config.failure_ratio.is_nan() {
                    0.5
                } else {
                    self.config.failure_ratio.clamp(f64::MIN_POSITIVE, 1.0)
                };
                if c.total() >= u64::from(self.config.min_requests.max(1)) && c.failure_ratio() >= ratio {
                    self.open(now)
                } else {
                    None
                }
            }
            BreakerState::Open { .. } => None,
            BreakerState::HalfOpen { .. } => {
                if ok {
                    self.state = BreakerState::Closed;
                    self.window.clear();
                    Some(self.state)
                } else {
                    self.open(now)
                }
            }
        }
    }

    /// Release the probe without a verdict (its job was cancelled or lost): the next
    /// `allow` hands out a new probe.
    pub fn abandon(&mut self, _now: Millis) {
        if let BreakerState::HalfOpen { .. } = self.state {
            self.state = BreakerState::HalfOpen { probe_deadline: None };
        }
    }

    /// Closed with nothing in the window at `now`: holds no information worth keeping.
    pub fn is_idle(&self, now: Millis) -> bool {
        self.state == BreakerState::Closed && self.window.is_idle(now)
    }
}

/// The tenants whose jobs of each type had dependency failures lately. A job type's
/// breaker stops the type for every tenant, so it counts dependency failures only
/// while they come from at least `min_tenants` tenants (a tenant whose own inputs make
/// the dependency fail, e.g. answer 503, cannot stop the type for the others); bounded
/// by job types x tenants failing within the window ([`FailingTenants::prune`] forgets
/// the rest).
#[derive(Debug, Clone, Default)]
pub struct FailingTenants {
    /// Per job type: its window (ms) and each tenant's latest failure.
    by_type: FastMap<String, (i64, FastMap<String, Millis>)>,
}

impl FailingTenants {
    /// `tenant`'s job of `job_type` failed on its dependency at `now`; returns how many
    /// tenants did within `window_ms`.
    pub fn record(&mut self, job_type: &str, tenant: &str, now: Millis, window_ms: i64) -> usize {
        let (w, m) = self.by_type.entry(job_type.to_owned()).or_default();
        *w = window_ms;
        m.insert(tenant.to_owned(), now);
        m.retain(|_, at| *at > now - window_ms);
        m.len()
    }

    /// The tenants last recorded failing with `job_type` (sorted).
    pub fn tenants(&self, job_type: &str) -> Vec<String> {
        let mut out: Vec<String> =
            self.by_type.get(job_type).map(|(_, m)| m.keys().cloned().collect()).unwrap_or_default();
        out.sort();
        out
    }

    /// Forgets failures older than their type's window, and types with none left.
    pub fn prune(&mut self, now: Millis) {
        self.by_type.retain(|_, (w, m)| {
            m.retain(|_, at| *at > now - *w);
            !m.is_empty()
        });
    }

    /// Tenants remembered, over all job types.
    pub fn len(&self) -> usize {
        self.by_type.values().map(|(_, m)| m.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_type.is_empty()
    }
}

/// Breakers of all job types, created on first use with a shared configuration.
#[derive(Debug, Clone, Default)]
pub struct Breakers {
    config: BreakerConfig,
    by_type: FastMap<String, Breaker>,
}

impl Breakers {
    pub fn new(config: BreakerConfig) -> Self {
        Breakers { config, by_type: FastMap::default() }
    }

    /// Use `breaker` (e.g. with its own settings) for `job_type`.
    pub fn insert(&mut self, job_type: &str, breaker: Breaker) {
        self.by_type.insert(job_type.to_owned(), breaker);
    }

    fn get_or_create(&mut self, job_type: &str) -> &mut Breaker {
        let config = &self.config;
        self.by_type.entry(job_type.to_owned()).or_insert_with(|| Breaker::new(config.clone()))
    }

    /// See [`Breaker::allow`]; a type never seen is allowed.
    pub fn allow(&mut self, job_type: &str, now: Millis) -> Verdict {
        match self.by_type.get_mut(job_type) {
            Some(b) => b.allow(now),
            None => Verdict::Allowed,
        }
    }

    /// See [`Breaker::record`].
    pub fn record(&mut self, job_type: &str, now: Millis, ok: bool) -> Option<BreakerState> {
        if let Some(b) = self.by_type.get_mut(job_type) {
            return b.record(now, ok);
        }
        if ok {
            // a success of a type with no breaker changes nothing worth a map entry
            return None;
        }
        self.get_or_create(job_type).record(now, ok)
    }

    /// See [`Breaker::abandon`].
    pub fn abandon(&mut self, job_type: &str, now: Millis) {
        if let Some(b) = self.by_type.get_mut(job_type) {
            b.abandon(now);
        }
    }

    /// State of `job_type`'s breaker; `Closed` for a type never seen.
    pub fn state(&self, job_type: &str) -> BreakerState {
        self.by_type.get(job_type).map_or(BreakerState::Closed, Breaker::state)
    }

    pub fn get(&self, job_type: &str) -> Option<&Breaker> {
        self.by_type.get(job_type)
    }

    /// `(job type, state)` of every breaker that is not closed (for metrics).
    pub fn not_closed(&self) -> impl Iterator<Item = (&str, BreakerState)> + '_ {
        self.by_type.iter().filter(|(_, b)| b.state() != BreakerState::Closed).map(|(t, b)| (t.as_str(), b.state()))
    }

    /// Drop closed breakers with nothing in their window (bounds memory).
    pub fn prune(&mut self, now: Millis) {
        self.by_type.retain(|_, b| !b.is_idle(now));
    }

    pub fn len(&self) -> usize {
        self.by_type.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_type.is_empty()
    }
}

/// Most (job type, tenant) breakers one pool of a worker keeps: past it, idle ones are
/// dropped first, and a new pair is not tracked apart while every one is busy (its
/// failures still count toward the type-wide breaker). About 1 KiB each.
pub const MAX_TENANT_BREAKERS: usize = 10_000;

/// Who opened a type-wide breaker, and until when only other tenants may probe it.
#[derive(Debug, Clone)]
struct Openers {
    tenants: Vec<String>,
    others_only_until: Millis,
}

/// What a recorded outcome changed: the type-wide breaker's state, the tenant's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes {
    pub type_wide: Option<BreakerState>,
    pub tenant: Option<BreakerState>,
}

/// The worker-side breakers of one pool, scoped to whoever causes the failures. Only
/// infrastructure failures count (dependency, timeout, worker crash:
/// [`FailureClass::is_infrastructure`]); a job's own failures release a probe without a
/// verdict.
///
/// - A **tenant's breaker** per (job type, tenant) counts that tenant's failures and
///   holds back that tenant's jobs only (at most [`MAX_TENANT_BREAKERS`]).
/// - The **type-wide breaker** counts failures only while at least `min_tenants`
///   tenants have them in its window ([`FailingTenants`]). The tenants failing when it
///   opens are its openers: for one more cool-down after it opens they are never its
///   probe and their outcomes are never its verdict (another tenant's job decides);
///   only when no other tenant came to probe by then may an opener's job probe, so a
///   type that fails for every tenant still recovers.
#[derive(Debug, Clone, Default)]
pub struct ScopedBreakers {
    types: Breakers,
    configs: HashMap<String, BreakerConfig>,
    default: BreakerConfig,
    tenants: FastMap<(String, String), Breaker>,
    failing: FailingTenants,
    openers: FastMap<String, Openers>,
    min_tenants: usize,
}

impl ScopedBreakers {
    /// `configs`: job types with their own settings (else `default`).
    pub fn new(default: BreakerConfig, configs: HashMap<String, BreakerConfig>, min_tenants: usize) -> Self {
        let mut types = Breakers::new(default.clone());
        for (job_type, c) in &configs {
            types.insert(job_type, Breaker::new(c.clone()));
        }
        ScopedBreakers { types, configs, default, min_tenants: min_tenants.max(1), ..Default::default() }
    }

    /// The settings of `job_type`'s breakers.
    pub fn config(&self, job_type: &str) -> &BreakerConfig {
        self.configs.get(job_type).unwrap_or(&self.default)
    }

    /// The type-wide breakers.
    pub fn type_wide(&self) -> &Breakers {
        &self.types
    }

    /// State of `tenant`'s own breaker of `job_type` (`Closed` when not tracked).
    pub fn tenant_state(&self, job_type: &str, tenant: &str) -> BreakerState {
        self.tenants.get(&(job_type.to_owned(), tenant.to_owned())).map_or(BreakerState::Closed, Breaker::state)
    }

    /// (Job type, tenant) breakers tracked now (at most [`MAX_TENANT_BREAKERS`]).
    pub fn tenants_tracked(&self) -> usize {
        self.tenants.len()
    }

    /// Until when `tenant`, an opener of `job_type`'s type-wide breaker, must leave its
    /// probe to the others (None: it need not).
    fn others_only(&self, job_type: &str, tenant: &str, now: Millis) -> Option<Millis> {
        let o = self.openers.get(job_type)?;
        let applies = self.types.state(job_type) != BreakerState::Closed
            && now < o.others_only_until
            && o.tenants.iter().any(|t| t == tenant);
        applies.then_some(o.others_only_until)
    }

    /// May `tenant`'s job of `job_type` run at `now`? Its own breaker first, then the
    /// type-wide one (which an opener may not probe).
    pub fn allow(&mut self, job_type: &str, tenant: &str, now: Millis) -> Verdict {
        let key = (job_type.to_owned(), tenant.to_owned());
        let own = self.tenants.get_mut(&key).map_or(Verdict::Allowed, |b| b.allow(now));
        if let Verdict::Rejected { .. } = own {
            return own;
        }
        let wide = match self.others_only(job_type, tenant, now) {
            Some(until) => Verdict::Rejected { retry_at: until },
            None => self.types.allow(job_type, now),
        };
        match (own, wide) {
            (_, Verdict::Rejected { .. }) => {
                if let (Verdict::Probe, Some(b)) = (own, self.tenants.get_mut(&key)) {
                    b.abandon(now);
                }
                wide
            }
            (Verdict::Probe, _) | (_, Verdict::Probe) => Verdict::Probe,
            _ => Verdict::Allowed,
        }
    }

    /// `tenant`'s breaker of `job_type`, created if there is room (idle ones are dropped
    /// to make room).
    fn tenant_breaker(&mut self, job_type: &str, tenant: &str, now: Millis) -> Option<&mut Breaker> {
        let key = (job_type.to_owned(), tenant.to_owned());
        if !self.tenants.contains_key(&key) && self.tenants.len() >= MAX_TENANT_BREAKERS {
            self.tenants.retain(|_, b| !b.is_idle(now));
            if self.tenants.len() >= MAX_TENANT_BREAKERS {
                return None;
            }
        }
        let config = self.config(job_type).clone();
        Some(self.tenants.entry(key).or_insert_with(|| Breaker::new(config)))
    }

    /// Forgets what no longer counts at `now`: failures past their window, idle tenant
    /// breakers, openers whose others-only time is over (bounds memory between uses).
    pub fn prune(&mut self, now: Millis) {
        self.failing.prune(now);
        self.tenants.retain(|_, b| !b.is_idle(now));
        self.openers.retain(|_, o| o.others_only_until > now);
    }

    /// Records the outcome of `tenant`'s attempt of `job_type` (`failure` None: success).
    pub fn record(&mut self, job_type: &str, tenant: &str, failure: Option<FailureClass>, now: Millis) -> Changes {
        let infra = failure.is_some_and(FailureClass::is_infrastructure);
        let tenant_change = if infra {
            self.tenant_breaker(job_type, tenant, now).and_then(|b| b.record(now, false))
        } else {
            // Most outcomes find no tenant breaker at all: no key is built for those.
            let breaker = if self.tenants.is_empty() {
                None
            } else {
                self.tenants.get_mut(&(job_type.to_owned(), tenant.to_owned()))
            };
            match (failure, breaker) {
                (None, Some(b)) => b.record(now, true),
                (Some(_), Some(b)) => {
                    b.abandon(now);
                    None
                }
                (_, None) => None,
            }
        };
        let changes = |type_wide| Changes { type_wide, tenant: tenant_change };
        if self.others_only(job_type, tenant, now).is_some() {
            // An opener's outcome is never the type-wide verdict.
            return changes(None);
        }
        let type_wide = match failure {
            None => self.types.record(job_type, now, true),
            Some(_) if infra => {
                let window = self.config(job_type).window.0;
                if self.failing.record(job_type, tenant, now, window) >= self.min_tenants {
                    self.types.record(job_type, now, false)
                } else {
                    self.types.abandon(job_type, now);
                    None
                }
            }
            Some(_) => {
                self.types.abandon(job_type, now);
                None
            }
        };
        match type_wide {
            Some(BreakerState::Open { until }) => {
                let others_only_until = until.saturating_add(self.config(job_type).cool_down.0.max(0));
                let tenants = self.failing.tenants(job_type);
                self.openers.insert(job_type.to_owned(), Openers { tenants, others_only_until });
            }
            Some(BreakerState::Closed) => {
                self.openers.remove(job_type);
            }
            _ => {}
        }
        changes(type_wide)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_tenants_are_forgotten_after_their_window() {
        let mut f = FailingTenants::default();
        for i in 0..1_000 {
            f.record("fetch", &format!("t{i}"), 1_000, 30_000);
        }
        f.record("mail", "a", 20_000, 60_000);
        assert_eq!(f.len(), 1_001);
        f.prune(31_000);
        assert_eq!(f.len(), 1, "fetch's failures left its 30 s window; mail's (60 s) did not");
        f.prune(80_001);
        assert!(f.is_empty());
    }

    #[test]
    fn failing_tenants_counts_distinct_tenants_in_the_window() {
        let mut f = FailingTenants::default();
        assert_eq!(f.record("http", "a", 0, 30_000), 1);
        assert_eq!(f.record("http", "a", 1_000, 30_000), 1, "the same tenant again");
        assert_eq!(f.record("http", "b", 2_000, 30_000), 2);
        assert_eq!(f.record("other", "c", 2_000, 30_000), 1, "per job type");
        assert_eq!(f.record("http", "c", 40_000, 30_000), 1, "a and b left the window");
    }

    fn scoped() -> ScopedBreakers {
        let c = BreakerConfig { min_requests: 4, cool_down: DurationMs::secs(10), ..BreakerConfig::default() };
        ScopedBreakers::new(c, HashMap::new(), 2)
    }

    const DEP: Option<FailureClass> = Some(FailureClass::Dependency);

    #[test]
    fn one_tenants_infrastructure_failures_hold_back_that_tenant_only() {
        let mut b = scoped();
        for i in 0..4 {
            assert_eq!(b.allow("http", "a", i), Verdict::Allowed);
            b.record("http", "a", DEP, i);
        }
        assert!(matches!(b.tenant_state("http", "a"), BreakerState::Open { .. }));
        assert!(matches!(b.allow("http", "a", 5), Verdict::Rejected { .. }), "a is held back");
        assert_eq!(b.allow("http", "b", 5), Verdict::Allowed, "b runs");
        assert_eq!(b.type_wide().state("http"), BreakerState::Closed);
        // a's app errors and bad inputs are not infrastructure: they open nothing
        for i in 0..20 {
            b.record("http", "c", Some(FailureClass::AppError), 10 + i);
            b.record("http", "c", Some(FailureClass::Permanent), 10 + i);
        }
        assert_eq!(b.allow("http", "c", 40), Verdict::Allowed);
    }

    #[test]
    fn timeouts_and_crashes_count_as_infrastructure() {
        let mut b = scoped();
        for (i, class) in [FailureClass::Timeout, FailureClass::WorkerCrash].into_iter().cycle().take(4).enumerate() {
            b.record("http", "a", Some(class), i as Millis);
        }
        assert!(matches!(b.tenant_state("http", "a"), BreakerState::Open { .. }));
    }

    /// a and b fail together until the type-wide breaker opens; returns when.
    fn opened_by_a_and_b(b: &mut ScopedBreakers) -> Millis {
        for i in 0..3 {
            for t in ["a", "b"] {
                if let Some(BreakerState::Open { until }) = b.record("http", t, DEP, i).type_wide {
                    return until;
                }
            }
        }
        panic!("the type-wide breaker did not open");
    }

    #[test]
    fn a_type_wide_breaker_opens_on_several_tenants_and_an_opener_is_never_its_probe() {
        let mut b = scoped();
        let until = opened_by_a_and_b(&mut b);
        assert!(matches!(b.allow("http", "c", until - 1), Verdict::Rejected { .. }), "open for all");
        // after the cool-down the openers wait; c's job is the probe
        assert!(matches!(b.allow("http", "a", until), Verdict::Rejected { .. }), "opener a");
        assert!(matches!(b.allow("http", "b", until), Verdict::Rejected { .. }), "opener b");
        assert_eq!(b.allow("http", "c", until), Verdict::Probe);
        // an opener's late outcome is not the verdict, either way
        assert_eq!(b.record("http", "a", None, until + 1).type_wide, None);
        assert_eq!(b.record("http", "a", DEP, until + 2).type_wide, None);
        assert!(matches!(b.type_wide().state("http"), BreakerState::HalfOpen { .. }));
        // c's probe succeeds: closed for everyone
        assert_eq!(b.record("http", "c", None, until + 3).type_wide, Some(BreakerState::Closed));
        assert_eq!(b.allow("http", "c", until + 4), Verdict::Allowed);
    }

    #[test]
    fn an_opener_probes_only_when_no_other_tenant_came_for_a_cool_down() {
        let mut b = scoped();
        let until = opened_by_a_and_b(&mut b);
        let others_only_until = until + 10_000;
        assert_eq!(b.allow("http", "a", others_only_until - 1), Verdict::Rejected { retry_at: others_only_until });
        assert_eq!(b.allow("http", "a", others_only_until), Verdict::Probe, "the type still recovers");
        assert_eq!(b.record("http", "a", None, others_only_until + 1).type_wide, Some(BreakerState::Closed));
    }

    #[test]
    fn tenant_breakers_are_bounded_and_idle_ones_make_room() {
        let mut b = scoped();
        for i in 0..MAX_TENANT_BREAKERS + 5 {
            b.record(&format!("type{i}"), "a", DEP, 0);
        }
        assert_eq!(b.tenants_tracked(), MAX_TENANT_BREAKERS, "busy ones are kept, new ones not tracked");
        // a window later every one is idle: a new failing tenant is tracked again
        b.record("late", "a", DEP, 60_000);
        assert_eq!(b.tenants_tracked(), 1);
        assert!(b.tenants.contains_key(&("late".to_string(), "a".to_string())));
    }

    #[test]
    fn prune_forgets_failures_idle_tenant_breakers_and_expired_openers() {
        let mut b = scoped();
        for t in ["a", "b", "c"] {
            b.record("dep", t, DEP, 0);
        }
        assert!(b.tenants_tracked() > 0 && !b.failing.is_empty());
        b.prune(1);
        assert!(b.tenants_tracked() > 0, "a breaker with failures in its window is kept");
        b.prune(10_000_000);
        assert_eq!(b.tenants_tracked(), 0);
        assert!(b.failing.is_empty() && b.openers.is_empty());
    }
    use proptest::prelude::*;

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            window: DurationMs::secs(30),
            min_requests: 10,
            failure_ratio: 0.5,
            cool_down: DurationMs::secs(30),
            probe_timeout: DurationMs::secs(60),
        }
    }

    fn tripped(now: Millis) -> Breaker {
        let mut b = Breaker::new(cfg());
        for i in 0..5 {
            assert_eq!(b.record(now + i, true), None);
        }
        for i in 0..4 {
            assert_eq!(b.record(now + 5 + i, false), None);
        }
        assert_eq!(b.record(now + 9, false), Some(BreakerState::Open { until: now + 9 + 30_000 }));
        b
    }

    #[test]
    fn does_not_open_below_minimum() {
        let mut b = Breaker::new(cfg());
        for i in 0..9 {
            assert_eq!(b.record(i, false), None);
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.allow(10), Verdict::Allowed);
        assert!(b.record(10, false).is_some());
    }

    #[test]
    fn stays_closed_below_ratio_and_forgets_old_failures() {
        let mut b = Breaker::new(cfg());
        for i in 0..6 {
            b.record(i, true);
        }
        for i in 0..5 {
            assert_eq!(b.record(10 + i, false), None); // 5 of 11
        }
        // 40 s later the old samples are gone: 1 of 1 is below the minimum
        assert_eq!(b.record(40_000, false), None);
        assert_eq!(b.counts(40_000), Counts { ok: 0, failed: 1 });
    }

    #[test]
    fn full_cycle() {
        let mut b = tripped(0);
        let until = 30_009;
        assert_eq!(b.allow(1_000), Verdict::Rejected { retry_at: until });
        assert_eq!(b.record(1_000, false), None, "outcomes while open are ignored");
        assert_eq!(b.allow(until), Verdict::Probe);
        let deadline = until + 60_000;
        assert_eq!(b.state(), BreakerState::HalfOpen { probe_deadline: Some(deadline) });
        assert_eq!(b.allow(until + 1), Verdict::Rejected { retry_at: deadline });
        // probe fails: open again for a full cool-down
        assert_eq!(b.record(until + 5, false), Some(BreakerState::Open { until: until + 5 + 30_000 }));
        assert_eq!(b.allow(until + 6), Verdict::Rejected { retry_at: until + 5 + 30_000 });
        // next probe succeeds: closed, with a clean window
        assert_eq!(b.allow(until + 5 + 30_000), Verdict::Probe);
        assert_eq!(b.record(until + 30_010, true), Some(BreakerState::Closed));
        assert_eq!(b.allow(until + 30_011), Verdict::Allowed);
        assert_eq!(b.counts(until + 30_011), Counts::default());
        assert_eq!(b.record(until + 30_012, false), None);
    }

    #[test]
    fn lost_and_abandoned_probes_are_replaced() {
        let mut b = tripped(0);
        assert_eq!(b.allow(40_000), Verdict::Probe);
        // never reports: after probe_timeout a new probe goes out
        assert_eq!(b.allow(99_999), Verdict::Rejected { retry_at: 100_000 });
        assert_eq!(b.allow(100_000), Verdict::Probe);
        b.abandon(100_001);
        assert_eq!(b.state(), BreakerState::HalfOpen { probe_deadline: None });
        assert_eq!(b.allow(100_002), Verdict::Probe);
        assert_eq!(b.allow(100_003), Verdict::Rejected { retry_at: 160_002 });
        b.abandon(0); // no-op outside half-open after closing
        b.record(100_004, true);
        b.abandon(100_005);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn zero_cool_down_still_rejects_until_later() {
        let mut c = cfg();
        c.cool_down = DurationMs(0);
        c.min_requests = 1;
        let mut b = Breaker::new(c);
        assert!(b.record(5, false).is_some());
        assert_eq!(b.allow(5), Verdict::Rejected { retry_at: 6 });
        assert_eq!(b.allow(6), Verdict::Probe);
    }

    #[test]
    fn map_by_job_type() {
        let mut m = Breakers::new(cfg());
        assert_eq!(m.allow("a", 0), Verdict::Allowed);
        assert_eq!(m.record("a", 0, true), None);
        assert!(m.is_empty(), "successes of unknown types allocate nothing");
        for i in 0..10 {
            m.record("a", i, false);
        }
        m.record("b", 0, false);
        assert!(matches!(m.state("a"), BreakerState::Open { .. }));
        assert_eq!(m.state("b"), BreakerState::Closed);
        assert_eq!(m.state("zzz"), BreakerState::Closed);
        assert!(matches!(m.allow("a", 1), Verdict::Rejected { .. }));
        assert_eq!(m.allow("b", 1), Verdict::Allowed);
        let open: Vec<_> = m.not_closed().map(|(t, s)| (t.to_owned(), s.as_str())).collect();
        assert_eq!(open, vec![("a".to_owned(), "open")]);
        m.prune(100_000);
        assert_eq!(m.len(), 1, "b is idle and dropped, a is open and kept");
        m.abandon("a", 0);
        let mut custom = cfg();
        custom.min_requests = 1;
        m.insert("c", Breaker::new(custom));
        assert!(m.record("c", 0, false).is_some());
        assert_eq!(m.get("c").map(|b| b.config().min_requests), Some(1));
    }

    #[test]
    fn config_parse_and_validate() {
        let c: BreakerConfig = toml::from_str("window = \"10s\"\ncool_down = 5000").unwrap();
        assert_eq!(c.window, DurationMs(10_000));
        assert_eq!(c.cool_down, DurationMs(5_000));
        assert_eq!(c.min_requests, 10);
        assert!(c.validate().is_ok());
        assert!(BreakerConfig::default().validate().is_ok());
        let bad = BreakerConfig { failure_ratio: 1.5, ..Default::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("failure_ratio"));
        let bad = BreakerConfig { min_requests: 0, ..Default::default() };
        assert_eq!(bad.validate().unwrap_err().field, "min_requests");
        assert!(toml::from_str::<BreakerConfig>("windw = 1").is_err());
        assert_eq!(BreakerState::HalfOpen { probe_deadline: None }.as_str(), "half_open");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allow,
        Record(bool),
        Abandon,
        Wait(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Allow),
            4 => any::<bool>().prop_map(Op::Record),
            1 => Just(Op::Abandon),
            3 => (0i64..20_000).prop_map(Op::Wait),
        ]
    }

    proptest! {
        /// A caller that runs every admitted job and reports each outcome: at most one
        /// probe is ever out at a time (a probe counts as out until its verdict, its
        /// abandonment or its timeout), rejections point to the future, a closed breaker
        /// admits everything and it opens only with enough samples.
        #[test]
        fn single_probe_and_sane_transitions(
            ops in proptest::collection::vec(op(), 1..400),
            min_requests in 1u32..15,
            ratio in 0.1f64..1.0,
        ) {
            let config = BreakerConfig { min_requests, failure_ratio: ratio, ..cfg() };
            let timeout = config.probe_timeout.0;
            let mut b = Breaker::new(config);
            let mut now = 1_000_000i64;
            // grant time of the probe currently out, if any
            let mut probe_out: Option<Millis> = None;
            for op in ops {
                match op {
                    Op::Wait(dt) => now += dt,
                    Op::Allow => {
                        let before = b.state();
                        match b.allow(now) {
                            Verdict::Allowed => prop_assert_eq!(before, BreakerState::Closed),
                            Verdict::Probe => {
                                if let Some(t) = probe_out {
                                    prop_assert!(now >= t + timeout, "second probe while one is out");
                                }
                                probe_out = Some(now);
                                let half_open_with_probe = matches!(b.state(), BreakerState::HalfOpen { probe_deadline: Some(_) });
                                prop_assert!(half_open_with_probe);
                            }
                            Verdict::Rejected { retry_at } => {
                                prop_assert!(retry_at > now);
                                prop_assert!(before != BreakerState::Closed);
                            }
                        }
                    }
                    Op::Record(ok) => {
                        let before = b.state();
                        let counts_before = b.counts(now);
                        let t = b.record(now, ok);
                        if let BreakerState::HalfOpen { .. } = before {
                            probe_out = None;
                            prop_assert!(t.is_some());
                        }
                        if before == BreakerState::Closed {
                            if let Some(BreakerState::Open { until }) = t {
                                prop_assert!(!ok);
                                prop_assert!(until > now);
                                let total = counts_before.total() + 1;
                                prop_assert!(total >= u64::from(min_requests));
                                let failed = counts_before.failed + 1;
                                prop_assert!(failed as f64 / total as f64 >= ratio);
                            }
                        }
                        if let Some(s) = t {
                            prop_assert_eq!(s, b.state());
                        }
                    }
                    Op::Abandon => {
                        if let BreakerState::HalfOpen { .. } = b.state() {
                            probe_out = None;
                        }
                        b.abandon(now);
                    }
                }
                // a probe can only be out while half-open
                if !matches!(b.state(), BreakerState::HalfOpen { .. }) {
                    prop_assert!(probe_out.is_none());
                }
            }
        }
    }
}
