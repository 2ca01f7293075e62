//! `[admission]`: the front door's limits (HTTP API and `fairway submit`; rules in
//! `core::admission`, shell in `crate::admission`).

use crate::core::admission::Rate;
use crate::core::scheduler::Tier;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Default `max_queued` per tier, for tenants that set none (a tier not listed: no
    /// limit). A tenant's own `max_queued` (registry) wins.
    pub max_queued: BTreeMap<Tier, u64>,
    /// Submission token bucket per tier, for tenants without `rate_per_sec`.
    pub tenant_rate: BTreeMap<Tier, Rate>,
    /// Sliding window per end user (the job's `user_key`) per tier; a tier not listed
    /// has no per-user limit.
    pub user_rate: BTreeMap<Tier, Rate>,
    /// How long an API process uses a tenant's queued count read from the store before
    /// reading it again (its own admissions since the read are added meanwhile).
    #[serde(with = "super::humantime_serde_compat")]
    pub queue_cache: Duration,
    /// Quota alert levels: shares of a limit in use that raise an event and move the
    /// gauge when a tenant crosses them.
    pub alert_levels: Vec<f64>,
    /// The circuit breaker at submission, per pool and job type (`[admission.breaker]`).
    pub breaker: crate::core::admission::breaker::GateConfig,
    /// Furthest ahead a job's `execute_at` may be (scheduled jobs hold a `max_queued`
    /// slot from submission until they run, so the horizon bounds how long).
    pub max_schedule_ahead: crate::core::retry::DurationMs,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        let per_sec = |n| Rate::per_second(n);
        let per_min = |n| Rate { count: n, per_ms: 60_000 };
        AdmissionConfig {
            max_queued: BTreeMap::new(),
            tenant_rate: BTreeMap::from([
                (Tier::Free, per_sec(10)),
                (Tier::Standard, per_sec(100)),
                (Tier::Pro, per_sec(1_000)),
                (Tier::Enterprise, per_sec(10_000)),
            ]),
            user_rate: BTreeMap::from([
                (Tier::Free, per_min(3)),
                (Tier::Standard, per_min(10)),
                (Tier::Pro, per_min(30)),
            ]),
            queue_cache: Duration::from_secs(1),
            alert_levels: vec![0.6, 0.8],
            breaker: Default::default(),
            max_schedule_ahead: crate::core::retry::DurationMs(30 * 24 * 3_600_000),
        }
    }
}

impl AdmissionConfig {
    pub fn validate(&self) -> Result<(), super::ConfigError> {
        for (tier, max) in &self.max_queued {
            if *max == 0 {
                return Err(super::invalid(
                    format!("admission.max_queued.{tier}"),
                    "must be at least 1 (leave the tier out for no limit)",
                ));
            }
        }
        if self.alert_levels.iter().any(|l| !(*l > 0.0 && *l <= 1.0)) {
            return Err(super::invalid(
                "admission.alert_levels",
                "levels are shares above 0 and at most 1, e.g. [0.6, 0.8]",
            ));
        }
        if self.queue_cache > Duration::from_secs(60) {
            return Err(super::invalid(
                "admission.queue_cache",
                "at most \"60s\" (the default \"1s\" keeps overshoot small)",
            ));
        }
        if self.max_schedule_ahead.0 < 60_000 {
            return Err(super::invalid(
                "admission.max_schedule_ahead",
                "must be at least \"1m\" (the default is \"30d\")",
            ));
        }
        self.breaker.validate().map_err(super::invalid_in("admission.breaker"))?;
        Ok(())
    }

    /// The tenant's submission rate: its `rate_per_sec` when set, else its tier's.
    pub fn tenant_rate(&self, tier: Tier, rate_per_sec: Option<u32>) -> Rate {
        match rate_per_sec.filter(|r| *r > 0) {
            Some(r) => Rate::per_second(r),
            None => self.tenant_rate.get(&tier).copied().unwrap_or(Rate::per_second(10)),
        }
    }

    /// The tenant's queue-depth limit: its own, else its tier's.
    pub fn max_queued(&self, tier: Tier, own: Option<usize>) -> Option<u64> {
        own.map(|m| m as u64).or_else(|| self.max_queued.get(&tier).copied())
    }
}
