//! Per-tenant submission rate limits (governor token buckets, one per registered tenant,
//! kept in step with the live registry by [`TenantLimiters::sync`]). Rate: the tenant's
//! `rate_per_sec` when set, otherwise the tier's default; burst: one second's worth.
//! Unknown tenants have no bucket (their submissions fail validation).

use crate::config::{Config, Tier};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::time::Duration;

/// Default submissions per second of a tier (when the tenant sets no `rate_per_sec`).
pub fn tier_rate(tier: Tier) -> u32 {
    match tier {
        Tier::Free => 10,
        Tier::Standard => 100,
        Tier::Pro => 1_000,
        Tier::Enterprise => 10_000,
    }
}

/// The submission rate of a configured tenant: its `rate_per_sec` if set (and non-zero),
/// otherwise its tier's default.
pub fn tenant_rate(t: &crate::config::TenantConfig) -> NonZeroU32 {
    t.rate_per_sec.and_then(NonZeroU32::new).or_else(|| NonZeroU32::new(tier_rate(t.tier))).unwrap_or(NonZeroU32::MIN)
}

/// Why a submission was refused by the limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Over the rate: try again after this long.
    Wait { rate: u32, wait: Duration },
    /// More jobs at once than the bucket can ever hold (batch larger than the burst).
    AboveBurst { burst: u32 },
    /// The tenant has no bucket (not configured).
    UnknownTenant,
}

struct Bucket {
    rate: NonZeroU32,
    limiter: DefaultDirectRateLimiter,
}

/// One token bucket per registered tenant.
pub struct TenantLimiters {
    buckets: std::sync::RwLock<HashMap<String, Bucket>>,
    clock: DefaultClock,
}

fn bucket(rate: NonZeroU32) -> Bucket {
    // per_second: burst = the rate, i.e. one second's worth of submissions.
    Bucket { rate, limiter: RateLimiter::direct(Quota::per_second(rate)) }
}

/// The submission rate of a registered tenant (as [`tenant_rate`]).
pub fn record_rate(t: &crate::core::tenants::TenantRecord) -> NonZeroU32 {
    t.rate_per_sec.and_then(NonZeroU32::new).or_else(|| NonZeroU32::new(tier_rate(t.tier))).unwrap_or(NonZeroU32::MIN)
}

impl TenantLimiters {
    pub fn from_config(cfg: &Config) -> Self {
        let buckets = cfg.tenants.iter().map(|(name, t)| (name.clone(), bucket(tenant_rate(t)))).collect();
        TenantLimiters { buckets: std::sync::RwLock::new(buckets), clock: DefaultClock::default() }
    }

    /// Follows the registry: buckets for new tenants and changed rates (a changed rate
    /// starts full), none for removed tenants; unchanged buckets keep their state.
    pub fn sync(&self, set: &crate::core::tenants::TenantSet) {
        let mut buckets = self.buckets.write().expect("limiters");
        buckets.retain(|name, _| set.tenants.contains_key(name));
        for (name, t) in &set.tenants {
            let rate = record_rate(t);
            if buckets.get(name).is_none_or(|b| b.rate != rate) {
                buckets.insert(name.clone(), bucket(rate));
            }
        }
    }

    /// A bucket for a tenant admitted by policy before the registry shows it.
    pub fn ensure(&self, t: &crate::core::tenants::TenantRecord) {
        let mut buckets = self.buckets.write().expect("limiters");
        buckets.entry(t.name.clone()).or_insert_with(|| bucket(record_rate(t)));
    }

    /// The configured rate of a tenant (None if unknown).
    pub fn rate(&self, tenant: &str) -> Option<u32> {
        self.buckets.read().expect("limiters").get(tenant).map(|b| b.rate.get())
    }

    /// Takes `n` tokens from the tenant's bucket, all or none.
    pub fn check(&self, tenant: &str, n: u32) -> Result<(), Refusal> {
        let buckets = self.buckets.read().expect("limiters");
        let Some(b) = buckets.get(tenant) else { return Err(Refusal::UnknownTenant) };
        let Some(n) = NonZeroU32::new(n) else { return Ok(()) };
        match b.limiter.check_n(n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => {
                Err(Refusal::Wait { rate: b.rate.get(), wait: not_until.wait_time_from(self.clock.now()) })
            }
            Err(_insufficient) => Err(Refusal::AboveBurst { burst: b.rate.get() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TenantConfig;

    #[test]
    fn rate_comes_from_config_else_tier() {
        let t = |tier, rate| TenantConfig { tier, rate_per_sec: rate, ..Default::default() };
        assert_eq!(tenant_rate(&t(Tier::Free, None)).get(), 10);
        assert_eq!(tenant_rate(&t(Tier::Standard, None)).get(), 100);
        assert_eq!(tenant_rate(&t(Tier::Pro, None)).get(), 1000);
        assert_eq!(tenant_rate(&t(Tier::Enterprise, None)).get(), 10000);
        assert_eq!(tenant_rate(&t(Tier::Enterprise, Some(2))).get(), 2);
        assert_eq!(tenant_rate(&t(Tier::Pro, Some(0))).get(), 1000, "0 falls back to the tier");
    }

    #[test]
    fn burst_is_one_second_then_refuses_with_a_wait() {
        let mut cfg = Config::builtin();
        cfg.tenants.insert("slow".into(), TenantConfig { rate_per_sec: Some(2), ..Default::default() });
        let l = TenantLimiters::from_config(&cfg);
        assert_eq!(l.rate("slow"), Some(2));
        assert_eq!(l.rate("piedpiper"), Some(10));
        assert!(l.check("slow", 1).is_ok());
        assert!(l.check("slow", 1).is_ok());
        match l.check("slow", 1) {
            Err(Refusal::Wait { rate: 2, wait }) => {
                assert!(wait > Duration::ZERO && wait <= Duration::from_millis(500))
            }
            other => panic!("expected a wait, got {other:?}"),
        }
        assert_eq!(l.check("slow", 3), Err(Refusal::AboveBurst { burst: 2 }));
        assert_eq!(l.check("nobody", 1), Err(Refusal::UnknownTenant));
        // Other tenants are unaffected.
        assert!(l.check("piedpiper", 10).is_ok());
    }
}
