//! The tenants' dispatch rate limiters: GCRA (a token bucket kept as one "theoretical
//! arrival time") on a clock set from the scheduler's `now`.
//!
//! [`PassedClock`] is a clock whose reading is whatever the scheduler last set (epoch
//! milliseconds, kept monotonic). Every tenant's limiter holds a clone, so advancing the
//! one clock advances them all.
//!
//! A limiter can be **scaled** ([`Limiter::set_scale`]): a worker's part of a tenant's
//! fleet-wide rate (`core::quota`) is `rate x share` with a burst of `burst x share` (at
//! least one). Rescaling keeps the dispatches already taken from the bucket (its debt,
//! in dispatches, carries over to the new rate), so a share that changes every exchange
//! never refills the bucket: the workers' buckets together hold at most the burst (plus
//! one per worker, the least a bucket holds). A scale of 0 holds every dispatch until
//! the scale rises again.

use super::config::RateLimit;
use crate::model::Millis;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const NANOS_PER_MS: u64 = 1_000_000;
const NANOS_PER_SEC: f64 = 1e9;

/// A clock set from the outside (nanoseconds since the Unix epoch).
#[derive(Debug, Clone, Default)]
pub(crate) struct PassedClock(Arc<AtomicU64>);

impl PassedClock {
    /// Moves the clock to `now` (never backwards).
    pub(crate) fn set(&self, now: Millis) {
        let ns = (now.max(0) as u64).saturating_mul(NANOS_PER_MS);
        self.0.fetch_max(ns, Ordering::Relaxed);
    }

    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// One tenant's dispatch rate limiter.
#[derive(Debug)]
pub(crate) struct Limiter {
    spec: RateLimit,
    clock: PassedClock,
    /// Part of the rate in force here (1: all of it).
    scale: f64,
    /// Theoretical arrival time of the next dispatch (ns): the bucket is full when it is
    /// at or before the clock.
    tat: u64,
    /// The debt (dispatches) carried while scaled to 0.
    parked: f64,
}

impl Limiter {
    /// `spec` must have been validated (positive rate, burst >= 1). Starts full.
    pub(crate) fn new(spec: RateLimit, clock: &PassedClock) -> Limiter {
        Limiter { spec, clock: clock.clone(), scale: 1.0, tat: 0, parked: 0.0 }
    }

    pub(crate) fn spec(&self) -> RateLimit {
        self.spec
    }

    /// The part of the rate in force here.
    pub(crate) fn scale(&self) -> f64 {
        self.scale
    }

    /// Nanoseconds between dispatches at the scaled rate (`None`: scaled to 0), rounded
    /// up to a whole nanosecond: a limiter may be a hair slower than its rate, never
    /// faster (a truncated interval let ~1 ns per dispatch accumulate into a dispatch
    /// one millisecond early after a few hundred dispatches).
    fn interval(&self) -> Option<f64> {
        let rate = self.spec.per_second * self.scale;
        (rate > 0.0).then(|| (NANOS_PER_SEC / rate).ceil().max(1.0))
    }

    /// How far (ns) the arrival time may run ahead of the clock: the burst less one.
    fn tolerance(&self, interval: f64) -> f64 {
        let burst = (f64::from(self.spec.burst.max(1)) * self.scale).max(1.0);
        (burst - 1.0) * interval
    }

    /// Sets the part of the rate in force here (0..=1); the tokens held are kept.
    pub(crate) fn set_scale(&mut self, scale: f64) {
        let scale = if scale.is_finite() { scale.clamp(0.0, 1.0) } else { 1.0 };
        let now = self.clock.now_ns();
        // The debt in dispatches at the old rate becomes the same debt at the new one.
        let debt = match self.interval() {
            Some(i) => self.tat.saturating_sub(now) as f64 / i,
            None => self.parked,
        };
        self.scale = scale;
        match self.interval() {
            Some(i) => {
                self.tat = now + (debt * i) as u64;
                // The debt lives in `tat` again (a stale `parked` would never settle).
                self.parked = 0.0;
            }
            None => self.parked = debt,
        }
    }

    /// No debt: the bucket is full (nothing taken is still being paid off).
    pub(crate) fn settled(&self) -> bool {
        self.tat <= self.clock.now_ns() && self.parked == 0.0
    }

    /// Takes one dispatch token at the clock's current time, or says from when (epoch ms,
    /// rounded up, always later than the current time) one will be available (with a
    /// scale of 0: one second on, to look again).
    pub(crate) fn take(&mut self) -> Result<(), Millis> {
        let now = self.clock.now_ns();
        let Some(interval) = self.interval() else {
            return Err((now.div_ceil(NANOS_PER_MS) + 1_000) as Millis);
        };
        let tolerance = self.tolerance(interval).floor() as u64;
        let start = self.tat.max(now);
        if start - now <= tolerance {
            self.tat = start + interval as u64;
            Ok(())
        } else {
            let at = (start - tolerance).max(now + 1);
            Err(at.div_ceil(NANOS_PER_MS) as Millis)
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
        let mut l = Limiter::new(RateLimit { per_second: 2.0, burst: 2 }, &clock);
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

    #[test]
    fn a_scaled_limiter_runs_at_its_part_and_rescaling_refills_nothing() {
        let clock = PassedClock::default();
        clock.set(1_000_000);
        let mut l = Limiter::new(RateLimit { per_second: 10.0, burst: 10 }, &clock);
        l.set_scale(0.5);
        // Half the burst, then one every 200 ms.
        for _ in 0..5 {
            assert_eq!(l.take(), Ok(()));
        }
        assert_eq!(l.take(), Err(1_000_200));
        // The whole rate: the 5 dispatches taken stay taken (of a burst of 10 now).
        l.set_scale(1.0);
        for _ in 0..5 {
            assert_eq!(l.take(), Ok(()));
        }
        assert_eq!(l.take(), Err(1_000_100));
        clock.set(1_000_100);
        assert_eq!(l.take(), Ok(()));
        assert!(l.take().is_err());
        // Scaled to 0 with an empty bucket: nothing, and the debt waits through it.
        l.set_scale(0.0);
        clock.set(1_010_000);
        assert!(l.take().is_err());
        l.set_scale(1.0);
        let free = std::iter::from_fn(|| l.take().ok()).take(20).count();
        assert_eq!(free, 0, "not refilled by the pause at 0");
        clock.set(1_010_100);
        assert_eq!(l.take(), Ok(()));
        // Its debt paid off, it is settled again (nothing left over from the pause).
        clock.set(1_020_000);
        assert!(l.settled(), "a limiter whose debt was paid off after a pause at 0 settles");
    }

    proptest::proptest! {
        /// Over any stretch, a limiter scaled to `s` dispatches at most
        /// `burst x s (at least 1) + rate x s x time`, whatever the rescaling before.
        #[test]
        fn prop_a_scaled_limiter_keeps_its_rate(
            rate in 1u32..50,
            burst in 1u32..20,
            before in proptest::collection::vec(0.0f64..=1.0, 0..5),
            scale in 0.05f64..=1.0,
            steps in proptest::collection::vec(0u64..200, 1..300),
        ) {
            let clock = PassedClock::default();
            clock.set(1_000_000);
            let mut l = Limiter::new(RateLimit { per_second: f64::from(rate), burst }, &clock);
            for s in before {
                l.set_scale(s);
                let _ = l.take();
            }
            l.set_scale(scale);
            let mut now = 1_000_000i64;
            let mut taken = 0u64;
            for dt in steps {
                now += dt as i64;
                clock.set(now);
                while l.take().is_ok() {
                    taken += 1;
                }
            }
            let secs = (now - 1_000_000) as f64 / 1000.0;
            let bound = (f64::from(burst) * scale).max(1.0) + f64::from(rate) * scale * secs + 1.0;
            proptest::prop_assert!(taken as f64 <= bound, "{taken} over {bound}");
        }
    }
}
