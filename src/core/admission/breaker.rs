//! The circuit breaker at submission, per pool and per job type (seed: when the pool's
//! failure rate exceeds 20 % over 60 s the front door stops enqueuing and answers 503;
//! half-open after 30 s lets one probe through; success closes it, failure re-opens it).
//!
//! Workers count every attempt's outcome (success, or a failure of any class) per
//! (pool, job type) into 10 s buckets ([`OwnOutcomes`], cumulative per worker, so a
//! retried write is harmless) and write them to the store every second; the API
//! processes read the buckets of the window every second, sum them ([`window_counts`])
//! and feed each [`Gate`]. Closing a gate resets what it counts: only buckets that start
//! after the close are counted, so the failures that opened it cannot re-open it.
//!
//! Scoped to whoever causes the failures (one tenant must not close a pool to all):
//! - a **tenant's gates** (`pool:<p> of tenant "<t>"`, `job_type:<j> of tenant "<t>"`)
//!   count that tenant's attempts and every failure class; they refuse only that tenant;
//! - the **shared gates** (`pool:<p>`, `job_type:<j>`) count only infrastructure
//!   failures (dependency, timeout, worker crash: [`crate::model::FailureClass::is_infrastructure`])
//!   against every attempt, timeouts only when they are spread across tenants (the rule
//!   below applied to the timeout share; else a tenant's timeouts are charged to its own
//!   gates only: jobs that outlive their timeout are usually the tenant's input), and open only when at least `min_tenants` tenants had such
//!   failures in the window and the failures are not one tenant's own
//!   ([`ScopeCounts::may_open`]): the ratio must still be above `failure_ratio` with the
//!   largest contributing tenant left out, or `min_tenants` tenants must each be above
//!   it on their own attempts. So one tenant whose jobs all time out, plus another
//!   tenant's single timeout, opens nothing for anyone but the first tenant (its own
//!   gates). The tenants whose failures opened one are its culprits and never its probe
//!   (another tenant's job decides).

use crate::core::fleet::OwnCells;
use crate::core::invalid::Invalid;
use crate::core::retry::DurationMs;
use crate::core::window::Counts;
use crate::model::Millis;
use serde::Deserialize;
use std::collections::HashMap;

/// Width of an outcome bucket.
pub const BUCKET_MS: i64 = 10_000;

/// `[admission.breaker]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GateConfig {
    pub enabled: bool,
    /// Opens when the failed share of attempts in the window is above this.
    pub failure_ratio: f64,
    pub window: DurationMs,
    /// Attempts needed in the window before it may open.
    pub min_attempts: u64,
    /// Open this long, then half-open (one probe).
    pub cool_down: DurationMs,
    /// A probe without a verdict after this long lets another probe through.
    pub probe_timeout: DurationMs,
    /// Distinct tenants with infrastructure failures in the window before a shared
    /// (pool or job type) gate may open.
    pub min_tenants: usize,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            enabled: true,
            failure_ratio: 0.2,
            window: DurationMs::secs(60),
            min_attempts: 10,
            cool_down: DurationMs::secs(30),
            probe_timeout: DurationMs::mins(5),
            min_tenants: 2,
        }
    }
}

impl GateConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        if !(self.failure_ratio > 0.0 && self.failure_ratio < 1.0) {
            let why = format!("{} must be a share between 0 and 1, e.g. 0.2", self.failure_ratio);
            return Invalid::err("failure_ratio", why);
        }
        if self.window.0 < BUCKET_MS {
            let why = format!("{} must be at least 10s (the bucket width), e.g. \"60s\"", self.window);
            return Invalid::err("window", why);
        }
        if self.min_tenants == 0 {
            return Invalid::err("min_tenants", "must be at least 1, e.g. 2");
        }
        if self.min_attempts == 0 {
            return Invalid::err("min_attempts", "must be at least 1, e.g. 10");
        }
        if self.cool_down.0 < 1_000 {
            return Invalid::err("cool_down", "must be at least 1s, e.g. \"30s\"");
        }
        if self.probe_timeout.0 < 1_000 {
            return Invalid::err("probe_timeout", "must be at least 1s, e.g. \"5m\"");
        }
        Ok(())
    }
}

/// What a gate says about a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    Allowed,
    /// Allowed as the single probe: report its job with [`Gate::probe_sent`].
    Probe,
    /// Refused until `retry_at`.
    Refused {
        retry_at: Millis,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum GateState {
    /// Counting outcomes of buckets starting at or after `since`.
    Closed {
        since: Millis,
    },
    Open {
        until: Millis,
        counts: Counts,
    },
    /// One probe may go; `probe` is the job sent and when it times out.
    HalfOpen {
        probe: Option<(String, Millis)>,
    },
}

impl GateState {
    pub fn as_str(&self) -> &'static str {
        match self {
            GateState::Closed { .. } => "closed",
            GateState::Open { .. } => "open",
            GateState::HalfOpen { .. } => "half_open",
        }
    }
}

/// The breaker of one pool or job type in one API process.
#[derive(Debug, Clone)]
pub struct Gate {
    cfg: GateConfig,
    state: GateState,
}

impl Gate {
    pub fn new(cfg: GateConfig) -> Self {
        Gate { cfg, state: GateState::Closed { since: i64::MIN } }
    }
    pub fn state(&self) -> &GateState {
        &self.state
    }
    /// Only buckets starting at or after this count (None unless closed).
    pub fn counting_since(&self) -> Option<Millis> {
        match self.state {
            GateState::Closed { since } => Some(since),
            _ => None,
        }
    }

    fn open(&mut self, now: Millis, counts: Counts) {
        self.state = GateState::Open { until: now + self.cfg.cool_down.0, counts };
    }

    /// The window's counts (from buckets since [`Gate::counting_since`]); true if it opened.
    pub fn observe(&mut self, counts: Counts, now: Millis) -> bool {
        let GateState::Closed { .. } = self.state else { return false };
        if counts.total() >= self.cfg.min_attempts && counts.failure_ratio() > self.cfg.failure_ratio {
            self.open(now, counts);
            return true;
        }
        false
    }

    /// May a submission go now?
    pub fn pass(&mut self, now: Millis) -> Pass {
        match &self.state {
            GateState::Closed { .. } => Pass::Allowed,
            GateState::Open { until, .. } if now < *until => Pass::Refused { retry_at: *until },
            GateState::Open { .. } => {
                self.state = GateState::HalfOpen { probe: None };
                Pass::Probe
            }
            GateState::HalfOpen { probe: Some((_, deadline)) } if now < *deadline => {
                Pass::Refused { retry_at: (*deadline).min(now + self.cfg.cool_down.0) }
            }
            GateState::HalfOpen { .. } => Pass::Probe,
        }
    }

    /// The probe's job went out (or None: it was not submitted after all, hand out another).
    pub fn probe_sent(&mut self, job_id: Option<String>, now: Millis) {
        if let GateState::HalfOpen { probe } = &mut self.state {
            *probe = job_id.map(|id| (id, now + self.cfg.probe_timeout.0));
        }
    }

    /// The job whose outcome decides the half-open gate, if one is out.
    pub fn probe_job(&self) -> Option<&str> {
        match &self.state {
            GateState::HalfOpen { probe: Some((id, _)) } => Some(id),
            _ => None,
        }
    }

    /// The probe's verdict: success closes (counting afresh from the next bucket), failure re-opens.
    pub fn probe_verdict(&mut self, ok: bool, now: Millis) {
        if !matches!(self.state, GateState::HalfOpen { .. }) {
            return;
        }
        if ok {
            self.state = GateState::Closed { since: now - now.rem_euclid(BUCKET_MS) + BUCKET_MS };
        } else {
            self.open(now, Counts::default());
        }
    }
}

/// The breaker verdict a probe's job state gives: Some(true) succeeded, Some(false) a
/// failed attempt (retrying, failed, expired), None not decided yet (or cancelled).
pub fn probe_outcome(status: Option<&str>) -> Option<bool> {
    match status? {
        "succeeded" => Some(true),
        "failed" | "retrying" | "expired" => Some(false),
        _ => None,
    }
}

/// One worker's outcome cell as read: attempts of one tenant's jobs of one (pool, job
/// type) in one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantCell<'a> {
    pub bucket: Millis,
    pub pool: &'a str,
    pub job_type: &'a str,
    pub tenant: &'a str,
    pub ok: i64,
    /// Failed attempts, any class.
    pub failed: i64,
    /// Of those, infrastructure failures (timeouts included).
    pub infra: i64,
    /// Of those, timeouts.
    pub timeouts: i64,
}

/// What a gate counts in the window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScopeCounts {
    pub counts: Counts,
    /// The tenant a tenant's gate is for (None: a shared gate).
    pub tenant: Option<String>,
    /// Tenants with failures counted here (a shared gate's culprits if it opens).
    pub failing: std::collections::BTreeSet<String>,
    /// A shared gate's counts per tenant (empty for a tenant's own gate).
    pub by_tenant: std::collections::BTreeMap<String, Counts>,
}

impl ScopeCounts {
    /// Whether these counts may open their gate. A tenant's own gate: yes. A shared gate
    /// needs failures from at least `min_tenants` tenants, and either the ratio above
    /// `failure_ratio` on at least `min_attempts` with the largest contributing tenant
    /// (most failures) left out, or `min_tenants` tenants each above it on their own
    /// attempts (at least `min_attempts / min_tenants` each).
    pub fn may_open(&self, cfg: &GateConfig) -> bool {
        if self.tenant.is_some() {
            return true;
        }
        if self.failing.len() < cfg.min_tenants {
            return false;
        }
        self.holds_without_largest(cfg) || self.tenants_above_ratio(cfg) >= cfg.min_tenants
    }

    fn holds_without_largest(&self, cfg: &GateConfig) -> bool {
        let Some(largest) = self.by_tenant.values().max_by_key(|c| (c.failed, c.total())) else { return false };
        let rest = Counts {
            ok: self.counts.ok.saturating_sub(largest.ok),
            failed: self.counts.failed.saturating_sub(largest.failed),
        };
        rest.total() >= cfg.min_attempts && rest.failure_ratio() > cfg.failure_ratio
    }

    fn tenants_above_ratio(&self, cfg: &GateConfig) -> usize {
        let each = cfg.min_attempts.div_ceil(cfg.min_tenants.max(1) as u64).max(1);
        self.by_tenant.values().filter(|c| c.total() >= each && c.failure_ratio() > cfg.failure_ratio).count()
    }
}

/// The key of `tenant`'s own gate of a shared scope (`pool:<p>` or `job_type:<j>`).
pub fn tenant_scope(scope: &str, tenant: &str) -> String {
    format!("{scope} of tenant {tenant:?}")
}

/// A shared scope's attempts of one tenant in the window, by kind of failure.
#[derive(Debug, Clone, Copy, Default)]
struct Raw {
    ok: u64,
    /// Failures that are not the infrastructure's (the job's own: counted as attempts).
    own: u64,
    /// Infrastructure failures other than timeouts.
    infra: u64,
    timeouts: u64,
}

impl Raw {
    fn total(&self) -> u64 {
        self.ok + self.own + self.infra + self.timeouts
    }
}

/// Whether a shared scope's timeouts are spread across tenants, so they count as the
/// infrastructure's: the same rule as [`ScopeCounts::may_open`]'s applied to the timeout
/// share (above `failure_ratio` with the tenant with most timeouts left out, or
/// `min_tenants` tenants each above it on their own attempts). Else each tenant's
/// timeouts are its own (its gates count them, the shared ones do not).
fn timeouts_spread(by_tenant: &std::collections::BTreeMap<String, Raw>, cfg: &GateConfig) -> bool {
    let timed_out = by_tenant.values().filter(|r| r.timeouts > 0).count();
    if timed_out < cfg.min_tenants {
        return false;
    }
    let share = |t: u64, n: u64| n > 0 && t as f64 / n as f64 > cfg.failure_ratio;
    let Some(largest) = by_tenant.values().max_by_key(|r| (r.timeouts, r.total())) else { return false };
    let (all_t, all_n) = by_tenant.values().fold((0, 0), |(t, n), r| (t + r.timeouts, n + r.total()));
    let (rest_t, rest_n) = (all_t - largest.timeouts, all_n - largest.total());
    let each = cfg.min_attempts.div_ceil(cfg.min_tenants.max(1) as u64).max(1);
    let above = by_tenant.values().filter(|r| r.total() >= each && share(r.timeouts, r.total())).count();
    (rest_n >= cfg.min_attempts && share(rest_t, rest_n)) || above >= cfg.min_tenants
}

/// Sums the cells of the window `(now - window, now]`, only buckets starting at or after
/// `since(key)`, per gate: `pool:<p>` and `job_type:<j>` (infrastructure failures of
/// every tenant, timeouts only when spread across tenants: [`timeouts_spread`]) and each
/// tenant's own of both (its failures of any class).
pub fn window_counts<'a>(
    cells: impl IntoIterator<Item = TenantCell<'a>>,
    now: Millis,
    window_ms: i64,
    cfg: &GateConfig,
    since: impl Fn(&str) -> Millis,
) -> HashMap<String, ScopeCounts> {
    let mut out: HashMap<String, ScopeCounts> = HashMap::new();
    let mut shared: HashMap<String, std::collections::BTreeMap<String, Raw>> = HashMap::new();
    for c in cells {
        if c.bucket + BUCKET_MS <= now - window_ms || c.bucket > now {
            continue;
        }
        let (ok, failed) = (c.ok.max(0) as u64, c.failed.max(0) as u64);
        let infra = (c.infra.max(0) as u64).min(failed);
        let timeouts = (c.timeouts.max(0) as u64).min(infra);
        for scope in [format!("pool:{}", c.pool), format!("job_type:{}", c.job_type)] {
            let own = tenant_scope(&scope, c.tenant);
            if c.bucket >= since(&own) {
                let e = out.entry(own).or_default();
                e.tenant = Some(c.tenant.to_string());
                e.counts.ok += ok;
                e.counts.failed += failed;
                if failed > 0 {
                    e.failing.insert(c.tenant.to_string());
                }
            }
            if c.bucket >= since(&scope) {
                let r = shared.entry(scope).or_default().entry(c.tenant.to_string()).or_default();
                r.ok += ok;
                r.own += failed - infra;
                r.infra += infra - timeouts;
                r.timeouts += timeouts;
            }
        }
    }
    for (scope, by_tenant) in shared {
        let spread = timeouts_spread(&by_tenant, cfg);
        let e = out.entry(scope).or_default();
        for (tenant, r) in by_tenant {
            let bad = r.infra + if spread { r.timeouts } else { 0 };
            let t = Counts { ok: r.total() - bad, failed: bad };
            e.counts.ok += t.ok;
            e.counts.failed += t.failed;
            if bad > 0 {
                e.failing.insert(tenant.clone());
            }
            e.by_tenant.insert(tenant, t);
        }
    }
    out
}

/// A worker's outcome cell: (ok, failed, infrastructure failures among them, timeouts
/// among those, dependency failures among those).
pub type OutcomeCounts = (i64, i64, i64, i64, i64);

/// One worker's outcome counts per bucket and (job type, tenant) (one pool), with
/// what was written.
#[derive(Debug)]
pub struct OwnOutcomes(OwnCells<OutcomeCounts>);

impl Default for OwnOutcomes {
    fn default() -> Self {
        OwnOutcomes(OwnCells::new(BUCKET_MS))
    }
}

impl OwnOutcomes {
    /// An attempt of `tenant`'s job of `job_type` ended: `failure` None succeeded.
    pub fn record(&mut self, job_type: &str, tenant: &str, failure: Option<crate::model::FailureClass>, now: Millis) {
        self.0.update_joined((job_type, tenant), now, None, |c| match failure {
            None => c.0 += 1,
            Some(f) => {
                c.1 += 1;
                c.2 += i64::from(f.is_infrastructure());
                c.3 += i64::from(f == crate::model::FailureClass::Timeout);
                c.4 += i64::from(f == crate::model::FailureClass::Dependency);
            }
        });
    }

    /// Cells changed since written: (bucket, key, counts); [`OwnOutcomes::key_parts`] splits the key.
    pub fn pending(&self) -> Vec<(Millis, String, OutcomeCounts)> {
        self.0.pending()
    }

    /// (job type, tenant) of a key of [`OwnOutcomes::pending`].
    pub fn key_parts(key: &str) -> (&str, &str) {
        crate::core::fleet::split_joined(key).unwrap_or((key, ""))
    }

    /// These cells were stored (unless they changed meanwhile).
    pub fn written(&mut self, cells: &[(Millis, String, OutcomeCounts)]) {
        self.0.written(cells)
    }

    /// Forgets buckets older than `keep_ms`.
    pub fn evict(&mut self, now: Millis, keep_ms: i64) {
        self.0.evict(now, keep_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(ok: u64, failed: u64) -> Counts {
        Counts { ok, failed }
    }

    #[test]
    fn opens_above_the_ratio_half_opens_after_cool_down_and_a_probe_decides() {
        let mut g = Gate::new(GateConfig::default());
        assert!(!g.observe(counts(16, 4), 0), "20 % is not above 20 %");
        assert!(!g.observe(counts(3, 2), 0), "too few attempts");
        assert!(g.observe(counts(15, 5), 1_000));
        assert_eq!(g.pass(2_000), Pass::Refused { retry_at: 31_000 });
        assert_eq!(g.pass(31_000), Pass::Probe);
        g.probe_sent(Some("j1".into()), 31_000);
        assert_eq!(g.probe_job(), Some("j1"));
        assert!(matches!(g.pass(31_500), Pass::Refused { .. }), "one probe only");
        g.probe_verdict(false, 40_000);
        assert_eq!(g.pass(40_001), Pass::Refused { retry_at: 70_000 }, "failure re-opens for a cool-down");
        assert_eq!(g.pass(70_000), Pass::Probe);
        g.probe_sent(Some("j2".into()), 70_000);
        g.probe_verdict(true, 75_000);
        assert_eq!(g.pass(75_001), Pass::Allowed);
        assert_eq!(g.counting_since(), Some(80_000), "only buckets after the close count");
    }

    #[test]
    fn an_unsent_or_silent_probe_hands_out_another() {
        let mut g = Gate::new(GateConfig::default());
        g.observe(counts(0, 10), 0);
        assert_eq!(g.pass(30_000), Pass::Probe);
        g.probe_sent(None, 30_000);
        assert_eq!(g.pass(30_001), Pass::Probe, "the probe was never submitted");
        g.probe_sent(Some("p".into()), 30_001);
        assert_eq!(g.pass(30_001 + 300_000), Pass::Probe, "timed out without a verdict");
    }

    fn cell<'a>(
        bucket: Millis,
        pool: &'a str,
        job_type: &'a str,
        tenant: &'a str,
        c: (i64, i64, i64),
    ) -> TenantCell<'a> {
        TenantCell { bucket, pool, job_type, tenant, ok: c.0, failed: c.1, infra: c.2, timeouts: 0 }
    }

    /// A cell of `ok` successes and `timeouts` timed-out attempts.
    fn timed_out(tenant: &str, ok: i64, timeouts: i64) -> TenantCell<'_> {
        TenantCell {
            bucket: 0,
            pool: "short",
            job_type: "slow",
            tenant,
            ok,
            failed: timeouts,
            infra: timeouts,
            timeouts,
        }
    }

    #[test]
    fn window_sums_pools_and_job_types_within_the_window_and_since() {
        let cells = vec![
            cell(0, "short", "echo", "a", (5, 1, 1)),
            cell(10_000, "short", "fail", "b", (0, 4, 4)),
            cell(50_000, "medium", "echo", "a", (2, 0, 0)),
            cell(-20_000, "short", "echo", "a", (100, 100, 100)),
        ];
        let c = window_counts(cells.clone(), 55_000, 60_000, &GateConfig::default(), |_| i64::MIN);
        assert_eq!(c["pool:short"].counts, counts(5, 5));
        assert_eq!(c["job_type:echo"].counts, counts(7, 1));
        assert_eq!(c["pool:medium"].counts, counts(2, 0));
        let c = window_counts(cells, 55_000, 60_000, &GateConfig::default(), |k| {
            if k == "pool:short" {
                10_000
            } else {
                i64::MIN
            }
        });
        assert_eq!(c["pool:short"].counts, counts(0, 4));
        assert_eq!(probe_outcome(Some("retrying")), Some(false));
        assert_eq!(probe_outcome(Some("queued")), None);
    }

    #[test]
    fn one_tenants_failures_open_only_its_own_gates() {
        // Tenant a: 40 app errors; tenant b: 10 successes, same pool and type.
        let cells = vec![cell(0, "short", "fail", "a", (0, 40, 0)), cell(0, "short", "echo", "b", (10, 0, 0))];
        let c = window_counts(cells, 5_000, 60_000, &GateConfig::default(), |_| i64::MIN);
        let mut pool = Gate::new(GateConfig::default());
        assert_eq!(c["pool:short"].counts, counts(50, 0), "app errors are not the pool's failures");
        assert!(!c["pool:short"].may_open(&GateConfig::default()));
        assert!(!pool.observe(c["pool:short"].counts, 5_000), "app errors never open the shared gate");
        let own = &c[&tenant_scope("pool:short", "a")];
        assert_eq!(own.counts, counts(0, 40));
        assert!(own.may_open(&GateConfig::default()) && Gate::new(GateConfig::default()).observe(own.counts, 5_000));
        assert_eq!(c[&tenant_scope("pool:short", "b")].counts, counts(10, 0));
    }

    #[test]
    fn infrastructure_failures_open_a_shared_gate_only_across_tenants() {
        // One tenant's dependency failures (e.g. payloads its service answers 503 to).
        let one = vec![cell(0, "short", "http", "a", (0, 20, 20)), cell(0, "short", "echo", "b", (10, 0, 0))];
        let c = window_counts(one, 5_000, 60_000, &GateConfig::default(), |_| i64::MIN);
        assert_eq!(c["pool:short"].counts, counts(10, 20));
        assert!(!c["pool:short"].may_open(&GateConfig::default()), "one tenant cannot open the pool's gate");
        let two = vec![cell(0, "short", "http", "a", (0, 20, 20)), cell(0, "short", "http", "b", (1, 9, 9))];
        let c = window_counts(two, 5_000, 60_000, &GateConfig::default(), |_| i64::MIN);
        assert!(c["pool:short"].may_open(&GateConfig::default()));
        assert_eq!(c["pool:short"].failing.len(), 2);
    }

    /// Tenant a's jobs all outlive their timeout (infrastructure failures by class);
    /// tenants b and c run fine but b had one timeout. The shared gates used to open
    /// (2 tenants failed, ratio 200/250 over the pool): with a left out the ratio is
    /// 1/50, and only a is above it on its own, so they stay closed for everyone; a's
    /// own gate opens.
    #[test]
    fn one_tenants_timeouts_never_open_a_shared_gate() {
        let cfg = GateConfig::default();
        let cells = vec![
            cell(0, "short", "slow", "a", (0, 200, 200)),
            cell(0, "short", "slow", "b", (24, 1, 1)),
            cell(0, "short", "slow", "c", (25, 0, 0)),
        ];
        let c = window_counts(cells, 5_000, 60_000, &GateConfig::default(), |_| i64::MIN);
        for shared in ["pool:short", "job_type:slow"] {
            let sc = &c[shared];
            assert_eq!(sc.failing.len(), 2);
            assert!(sc.counts.failure_ratio() > cfg.failure_ratio && sc.counts.total() >= cfg.min_attempts);
            assert!(!sc.may_open(&cfg), "{shared}: one tenant's timeouts open nothing for the others");
        }
        assert!(c[&tenant_scope("pool:short", "a")].may_open(&cfg));
        assert!(Gate::new(cfg.clone()).observe(c[&tenant_scope("pool:short", "a")].counts, 5_000));
    }

    /// A failure the tenants share still opens the shared gate: by the ratio without the
    /// largest tenant, or by `min_tenants` tenants each above the ratio.
    #[test]
    fn failures_spread_across_tenants_still_open_a_shared_gate() {
        let cfg = GateConfig::default();
        let spread = vec![
            cell(0, "short", "http", "a", (10, 90, 90)),
            cell(0, "short", "http", "b", (5, 5, 5)),
            cell(0, "short", "http", "c", (5, 5, 5)),
        ];
        let sc = &window_counts(spread, 5_000, 60_000, &GateConfig::default(), |_| i64::MIN)["pool:short"];
        assert!(sc.holds_without_largest(&cfg) && sc.may_open(&cfg));
        // Two tenants, each 5 of 5 failed: without the larger there are too few attempts
        // left, but each is above the ratio on its own (at least 10 / 2 attempts each).
        let two = vec![cell(0, "short", "http", "a", (0, 5, 5)), cell(0, "short", "http", "b", (0, 5, 5))];
        let sc = &window_counts(two, 5_000, 60_000, &GateConfig::default(), |_| i64::MIN)["pool:short"];
        assert!(!sc.holds_without_largest(&cfg));
        assert_eq!(sc.tenants_above_ratio(&cfg), 2);
        assert!(sc.may_open(&cfg));
    }

    /// Tenant a's jobs time out (half of them); b's and d's time out now and then (below
    /// the ratio) and c has dependency failures above it. Charged to the infrastructure,
    /// a's timeouts opened the pool for everyone (with c, the largest, left out: 60 of 208
    /// attempts failed); charged to a, the pool stays open to the others, and a's own gate
    /// opens.
    #[test]
    fn one_tenants_timeouts_are_charged_to_it_not_to_the_shared_gates() {
        let cfg = GateConfig::default();
        let cells = vec![
            timed_out("a", 50, 50),
            timed_out("b", 48, 2),
            cell(0, "short", "slow", "c", (10, 90, 90)),
            timed_out("d", 50, 8),
        ];
        let c = window_counts(cells, 5_000, 60_000, &cfg, |_| i64::MIN);
        let sc = &c["pool:short"];
        assert_eq!(sc.counts.failed, 90, "only c's dependency failures count: {sc:?}");
        assert!(!sc.may_open(&cfg), "{sc:?}");
        assert!(c[&tenant_scope("pool:short", "a")].may_open(&cfg));
        assert!(Gate::new(cfg.clone()).observe(c[&tenant_scope("pool:short", "a")].counts, 5_000));
    }

    /// Timeouts every tenant sees (a slow shared dependency) still open the shared gates.
    #[test]
    fn timeouts_spread_across_tenants_open_a_shared_gate() {
        let cfg = GateConfig::default();
        let cells = vec![timed_out("a", 10, 40), timed_out("b", 10, 10), timed_out("c", 5, 5)];
        let c = window_counts(cells, 5_000, 60_000, &cfg, |_| i64::MIN);
        let sc = &c["job_type:slow"];
        assert_eq!(sc.counts, counts(25, 55));
        assert!(sc.may_open(&cfg) && Gate::new(cfg).observe(sc.counts, 5_000));
    }

    proptest::proptest! {
        /// Whatever the other tenants' outcomes, one tenant's timeouts decide no shared
        /// gate: the verdict is the one with its timeouts counted as plain attempts.
        #[test]
        fn one_tenants_timeouts_never_decide_a_shared_gate(
            a in (0i64..200, 0i64..400),
            others in proptest::collection::vec((0i64..60, 0i64..60, 0i64..60), 1..5),
        ) {
            let cfg = GateConfig::default();
            let names = ["b", "c", "d", "e", "f"];
            let rest: Vec<TenantCell> = others
                .iter()
                .zip(names)
                .map(|(&(ok, dep, own), t)| cell(0, "short", "slow", t, (ok, dep + own, dep)))
                .collect();
            let with: Vec<TenantCell> = std::iter::once(timed_out("a", a.0, a.1)).chain(rest.clone()).collect();
            let plain: Vec<TenantCell> =
                std::iter::once(cell(0, "short", "slow", "a", (a.0 + a.1, 0, 0))).chain(rest).collect();
            let verdict = |cells: Vec<TenantCell>| {
                let c = window_counts(cells, 5_000, 60_000, &cfg, |_| i64::MIN);
                ["pool:short", "job_type:slow"].map(|k| c.get(k).is_some_and(|s| s.may_open(&cfg) && s.counts.total() >= cfg.min_attempts && s.counts.failure_ratio() > cfg.failure_ratio))
            };
            proptest::prop_assert_eq!(verdict(with), verdict(plain));
        }
    }

    #[test]
    fn own_outcomes_are_cumulative_and_rewritten_only_when_changed() {
        use crate::model::FailureClass as F;
        let mut o = OwnOutcomes::default();
        o.record("echo", "a", None, 1_000);
        o.record("echo", "a", Some(F::Dependency), 2_000);
        o.record("echo", "a", Some(F::AppError), 2_000);
        let p = o.pending();
        assert_eq!(p.len(), 1);
        assert_eq!(OwnOutcomes::key_parts(&p[0].1), ("echo", "a"));
        assert_eq!(p[0].2, (1, 2, 1, 0, 1), "the dependency failure counted apart");
        o.record("echo", "a", None, 3_000);
        o.written(&p);
        assert_eq!(o.pending()[0].2, (2, 2, 1, 0, 1), "changed after the read: written again");
        o.record("echo", "a", Some(F::Timeout), 3_000);
        assert_eq!(o.pending()[0].2, (2, 3, 2, 1, 1), "a timeout is an infrastructure failure, counted apart too");
        o.written(&o.pending());
        assert!(o.pending().is_empty());
        o.evict(100_000, 60_000);
        assert!(o.pending().is_empty());
    }
}
