//! Rolling success/failure counts over a fixed span of time, kept in a ring of buckets.
//!
//! Both the circuit breaker (last ~30 s) and the poison detector (last hour) need "how
//! many attempts of this job type failed lately" without keeping one entry per attempt:
//! at tens of thousands of jobs per second a per-event log would cost memory and an O(n)
//! sweep on every check. A ring of time buckets costs a fixed few hundred bytes per job
//! type, records in O(1) and sums in O(buckets). Old buckets are recycled lazily when
//! their slot is reused, so there is no timer: `now` is passed in by the caller, which
//! keeps the structure pure and lets tests drive time by hand.
//!
//! Precision is one bucket: a sample leaves the window somewhere between `span - bucket`
//! and `span` after it was recorded. That is fine for rates, which is all it serves.

use crate::model::Millis;

/// Successes and failures counted in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub ok: u64,
    pub failed: u64,
}

impl Counts {
    /// All samples.
    pub fn total(&self) -> u64 {
        self.ok.saturating_add(self.failed)
    }

    /// Failed share of all samples, 0.0 when there are none.
    pub fn failure_ratio(&self) -> f64 {
        let total = self.total();
        if total == 0 {
            0.0
        } else {
            self.failed as f64 / total as f64
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// `now.div_euclid(bucket_ms)` of the samples held; `i64::MIN` when never used.
    epoch: i64,
    counts: Counts,
}

const EMPTY: Bucket = Bucket { epoch: i64::MIN, counts: Counts { ok: 0, failed: 0 } };

/// Ring of time buckets covering roughly the last `span` milliseconds.
#[derive(Debug, Clone)]
pub struct RollingWindow {
    bucket_ms: i64,
    buckets: Vec<Bucket>,
}

impl RollingWindow {
    /// A window of `span_ms` split into `buckets` buckets. Nonsense values are clamped
    /// (at least one bucket of at least 1 ms) rather than rejected: configuration is
    /// validated where it is parsed.
    pub fn new(span_ms: Millis, buckets: usize) -> Self {
        let n = buckets.clamp(1, 10_000);
        let bucket_ms = (span_ms.max(1) / n as i64).max(1);
        RollingWindow { bucket_ms, buckets: vec![EMPTY; n] }
    }

    /// Width of one bucket in milliseconds.
    pub fn bucket_ms(&self) -> Millis {
        self.bucket_ms
    }

    /// Time actually covered: buckets x bucket width.
    pub fn span_ms(&self) -> Millis {
        self.bucket_ms.saturating_mul(self.buckets.len() as i64)
    }

    fn slot(&self, epoch: i64) -> usize {
        epoch.rem_euclid(self.buckets.len() as i64) as usize
    }

    /// Count one sample at `now`. A sample older than the bucket now occupying its slot
    /// (the clock went backwards by more than the span) is dropped.
    pub fn record(&mut self, now: Millis, ok: bool) {
        let epoch = now.div_euclid(self.bucket_ms);
        let slot = self.slot(epoch);
        let b = &mut self.buckets[slot];
        if b.epoch < epoch {
            *b = Bucket { epoch, counts: Counts::default() };
        } else if b.epoch > epoch {
            return;
        }
        if ok {
            b.counts.ok = b.counts.ok.saturating_add(1);
        } else {
            b.counts.failed = b.counts.failed.saturating_add(1);
        }
    }

    /// Samples recorded in the buckets that cover `now` and the span before it.
    pub fn counts(&self, now: Millis) -> Counts {
        let current = now.div_euclid(self.bucket_ms);
        let oldest = current.saturating_sub(self.buckets.len() as i64 - 1);
        let mut sum = Counts::default();
        for b in &self.buckets {
            if b.epoch >= oldest && b.epoch <= current {
                sum.ok = sum.ok.saturating_add(b.counts.ok);
                sum.failed = sum.failed.saturating_add(b.counts.failed);
            }
        }
        sum
    }

    /// True when no bucket could still count at `now` or later.
    pub fn is_idle(&self, now: Millis) -> bool {
        let current = now.div_euclid(self.bucket_ms);
        let oldest = current.saturating_sub(self.buckets.len() as i64 - 1);
        self.buckets.iter().all(|b| b.epoch < oldest)
    }

    /// Forget every sample.
    pub fn clear(&mut self) {
        self.buckets.iter_mut().for_each(|b| *b = EMPTY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn counts_within_span_and_forgets_after() {
        let mut w = RollingWindow::new(10_000, 10);
        w.record(0, true);
        w.record(500, false);
        w.record(9_999, false);
        assert_eq!(w.counts(9_999), Counts { ok: 1, failed: 2 });
        // bucket 0 (0..1000) leaves at 10_000
        assert_eq!(w.counts(10_000), Counts { ok: 0, failed: 1 });
        assert_eq!(w.counts(19_999), Counts { ok: 0, failed: 0 });
        assert!(w.is_idle(19_999));
    }

    #[test]
    fn reused_slot_is_reset() {
        let mut w = RollingWindow::new(1_000, 2);
        w.record(0, false);
        w.record(1_000, true); // same slot as 0, next lap
        assert_eq!(w.counts(1_000), Counts { ok: 1, failed: 0 });
    }

    #[test]
    fn stale_sample_dropped_and_negative_time_ok() {
        let mut w = RollingWindow::new(1_000, 2);
        w.record(5_000, true);
        w.record(4_000, false); // slot holds a newer bucket: dropped
        assert_eq!(w.counts(5_000), Counts { ok: 1, failed: 0 });
        let mut n = RollingWindow::new(1_000, 4);
        n.record(-1, false);
        assert_eq!(n.counts(-1).failed, 1);
    }

    #[test]
    fn degenerate_config_clamped() {
        let w = RollingWindow::new(0, 0);
        assert_eq!(w.bucket_ms(), 1);
        assert_eq!(w.span_ms(), 1);
        assert_eq!(Counts::default().failure_ratio(), 0.0);
    }

    proptest! {
        /// Against a naive log: the window counts exactly the samples whose bucket is
        /// among the last `n` buckets at the query time (times are non-decreasing).
        #[test]
        fn matches_naive_log(
            steps in proptest::collection::vec((0i64..400, any::<bool>()), 1..300),
            span in 1i64..2_000,
            n in 1usize..20,
        ) {
            let mut w = RollingWindow::new(span, n);
            let bms = w.bucket_ms();
            let mut log: Vec<(i64, bool)> = Vec::new();
            let mut now = 0i64;
            for (dt, ok) in steps {
                now += dt;
                w.record(now, ok);
                log.push((now, ok));
                let cur = now.div_euclid(bms);
                let oldest = cur - (n as i64 - 1);
                let mut exp = Counts::default();
                for &(t, o) in &log {
                    let e = t.div_euclid(bms);
                    if e >= oldest && e <= cur {
                        if o { exp.ok += 1 } else { exp.failed += 1 }
                    }
                }
                prop_assert_eq!(w.counts(now), exp);
            }
        }
    }
}
