//! governor's GCRA driven by the scheduler's `now` instead of the system clock.
//!
//! governor reads time through its `Clock` trait; [`PassedClock`] is a clock whose reading
//! is whatever the scheduler last set (epoch milliseconds, kept monotonic). Every tenant's
//! limiter holds a clone, so advancing the one clock advances them all.

use super::config::RateLimit;
use crate::model::Millis;
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const NANOS_PER_MS: u64 = 1_000_000;

/// A governor clock set from the outside (nanoseconds since the Unix epoch).
#[derive(Debug, Clone, Default)]
pub(crate) struct PassedClock(Arc<AtomicU64>);

impl PassedClock {
    /// Moves the clock to `now` (never backwards).
    pub(crate) fn set(&self, now: Millis) {
        let ns = (now.max(0) as u64).saturating_mul(NANOS_PER_MS);
        self.0.fetch_max(ns, Ordering::Relaxed);
    }
}

impl Clock for PassedClock {
    type Instant = Nanos;
    fn now(&self) -> Nanos {
        Nanos::from(self.0.load(Ordering::Relaxed))
    }
}

/// One tenant's dispatch rate limiter.
pub(crate) struct Limiter {
    spec: RateLimit,
    inner: RateLimiter<NotKeyed, InMemoryState, PassedClock, NoOpMiddleware<Nanos>>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter").field("spec", &self.spec).finish()
    }
}

impl Limiter {
    /// `spec` must have been validated (positive rate, burst >= 1).
    pub(crate) fn new(spec: RateLimit, clock: &PassedClock) -> Limiter {
        let period = Duration::from_secs_f64(1.0 / spec.per_second).max(Duration::from_nanos(1));
        let burst = NonZeroU32::new(spec.burst.max(1)).expect("burst >= 1");
        let quota = Quota::with_period(period).expect("period > 0").allow_burst(burst);
        Limiter { spec, inner: RateLimiter::direct_with_clock(quota, clock.clone()) }
    }

    pub(crate) fn spec(&self) -> RateLimit {
        self.spec
    }

    /// Takes one dispatch token at the clock's current time, or says from when (epoch ms,
    /// rounded up, always later than the current time) one will be available.
    pub(crate) fn take(&self) -> Result<(), Millis> {
        match self.inner.check() {
            Ok(()) => Ok(()),
            Err(not_until) => {
                let ns = not_until.earliest_possible().as_u64();
                Err(ns.div_ceil(NANOS_PER_MS) as Millis)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_follows_the_passed_clock() {
        let clock = PassedClock::default();
        clock.set(1_000_000);
        let l = Limiter::new(RateLimit { per_second: 2.0, burst: 2 }, &clock);
        assert_eq!(l.take(), Ok(()));
        assert_eq!(l.take(), Ok(()));
        // Burst spent: the next token comes 500 ms after the first.
        assert_eq!(l.take(), Err(1_000_500));
        clock.set(1_000_499);
        assert_eq!(l.take(), Err(1_000_500));
        clock.set(1_000_500);
        assert_eq!(l.take(), Ok(()));
        assert_eq!(l.take(), Err(1_001_000));
        // The clock never goes backwards.
        clock.set(5);
        assert_eq!(l.take(), Err(1_001_000));
    }
}
