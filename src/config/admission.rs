//! `[admission]`: the front door's limits (HTTP API and `fairway submit`; rules in
//! `core::admission`, shell in `crate::admission`).

use crate::core::admission::Rate;
use crate::core::scheduler::Tier;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// The per-tier tables (`max_queued`, `tenant_rate`, `user_rate`) merge with their
/// defaults tier by tier: a config that sets one tier keeps the others' defaults.
/// `"unlimited"` removes a tier's queue bound or per-user window (said at start-up).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Default `max_queued` per tier, for tenants that set none (a tier without one:
    /// no limit, warned at start-up). A tenant's own `max_queued` (registry) wins.
    #[serde(deserialize_with = "tiers::max_queued")]
    pub max_queued: BTreeMap<Tier, u64>,
    /// Submission token bucket per tier, for tenants without `rate_per_sec` (every
    /// tier has one).
    #[serde(deserialize_with = "tiers::tenant_rate")]
    pub tenant_rate: BTreeMap<Tier, Rate>,
    /// Sliding window per end user (the job's `user_key`) per tier; a tier without one
    /// has no per-user limit.
    #[serde(deserialize_with = "tiers::user_rate")]
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
            max_queued: BTreeMap::from([
                (Tier::Free, 10_000),
                (Tier::Standard, 100_000),
                (Tier::Pro, 1_000_000),
                (Tier::Enterprise, 10_000_000),
            ]),
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

    /// The tenant's submission rate: its `rate_per_sec` when set, else its tier's
    /// (every tier has one: the table merges with the defaults).
    pub fn tenant_rate(&self, tier: Tier, rate_per_sec: Option<u32>) -> Rate {
        match rate_per_sec.filter(|r| *r > 0) {
            Some(r) => Rate::per_second(r),
            None => self.tenant_rate.get(&tier).copied().unwrap_or_else(|| Self::default().tenant_rate[&tier]),
        }
    }

    /// What runs without a bound, for the start-up log: tiers without `max_queued`.
    pub fn unbounded(&self) -> Vec<String> {
        Tier::ALL
            .iter()
            .filter(|t| !self.max_queued.contains_key(t))
            .map(|t| {
                format!(
                    "admission.max_queued.{t} is \"unlimited\": {t} tenants without their own max_queued may queue \
                     (and schedule) jobs without bound"
                )
            })
            .collect()
    }

    /// The tenant's queue-depth limit: its own, else its tier's.
    pub fn max_queued(&self, tier: Tier, own: Option<usize>) -> Option<u64> {
        own.map(|m| m as u64).or_else(|| self.max_queued.get(&tier).copied())
    }
}

/// The per-tier tables, each merged over its defaults tier by tier.
mod tiers {
    use super::{AdmissionConfig, Rate, Tier};
    use serde::{Deserialize, Deserializer};
    use std::collections::BTreeMap;

    /// A table entry: a value, or "unlimited" (the tier has no bound).
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Entry<T> {
        Value(T),
        Word(String),
    }

    fn merged<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
        mut table: BTreeMap<Tier, T>,
        what: &str,
    ) -> Result<BTreeMap<Tier, T>, D::Error> {
        for (tier, e) in BTreeMap::<Tier, Entry<T>>::deserialize(d)? {
            match e {
                Entry::Value(v) => {
                    table.insert(tier, v);
                }
                Entry::Word(w) if w == "unlimited" => {
                    table.remove(&tier);
                }
                Entry::Word(w) => {
                    return Err(serde::de::Error::custom(format!(
                        "{what}.{tier} = {w:?} is not valid: write {} or \"unlimited\"",
                        if what.ends_with("max_queued") { "a number of jobs" } else { "a rate such as \"100/s\"" }
                    )))
                }
            }
        }
        Ok(table)
    }

    pub fn max_queued<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<Tier, u64>, D::Error> {
        merged(d, AdmissionConfig::default().max_queued, "admission.max_queued")
    }

    pub fn tenant_rate<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<Tier, Rate>, D::Error> {
        let table = merged(d, AdmissionConfig::default().tenant_rate, "admission.tenant_rate")?;
        match Tier::ALL.iter().find(|t| !table.contains_key(t)) {
            Some(t) => Err(serde::de::Error::custom(format!(
                "admission.tenant_rate.{t} cannot be \"unlimited\": every tier needs a submission rate (give it a \
                 high one, e.g. \"100000/s\")"
            ))),
            None => Ok(table),
        }
    }

    pub fn user_rate<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<Tier, Rate>, D::Error> {
        merged(d, AdmissionConfig::default().user_rate, "admission.user_rate")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(toml_text: &str) -> Result<AdmissionConfig, String> {
        toml::from_str(toml_text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_partial_table_keeps_the_other_tiers_defaults() {
        let c = parsed("[tenant_rate]\nfree = \"5/s\"\n[max_queued]\npro = 7\n").unwrap();
        assert_eq!(c.tenant_rate[&Tier::Free], Rate::per_second(5));
        assert_eq!(c.tenant_rate[&Tier::Enterprise], Rate::per_second(10_000), "not dropped to 10/s");
        assert_eq!(c.max_queued[&Tier::Pro], 7);
        assert_eq!(c.max_queued[&Tier::Free], 10_000);
        assert_eq!(c.user_rate, AdmissionConfig::default().user_rate);
        assert!(c.unbounded().is_empty());
    }

    #[test]
    fn unlimited_removes_a_bound_and_is_said() {
        let c = parsed("[max_queued]\nenterprise = \"unlimited\"\n[user_rate]\nfree = \"unlimited\"\n").unwrap();
        assert!(!c.max_queued.contains_key(&Tier::Enterprise));
        assert!(!c.user_rate.contains_key(&Tier::Free));
        assert_eq!(c.unbounded().len(), 1);
        assert!(c.unbounded()[0].contains("admission.max_queued.enterprise"), "{:?}", c.unbounded());
    }

    #[test]
    fn every_tier_keeps_a_rate_and_bad_words_are_named() {
        let e = parsed("[tenant_rate]\npro = \"unlimited\"\n").unwrap_err();
        assert!(e.contains("every tier needs a submission rate"), "{e}");
        let e = parsed("[max_queued]\npro = \"lots\"\n").unwrap_err();
        assert!(e.contains("admission.max_queued.pro") && e.contains("unlimited"), "{e}");
    }
}
