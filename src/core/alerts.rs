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

use crate::model::{JobResult, JobStatus, Millis};

/// Buckets of the wait histogram: bucket `i` holds waits below `2^((i+1)/2)` ms.
pub const WAIT_BUCKETS: usize = 64;
/// A rule's clear level: this fraction of its threshold.
pub const CLEAR_FRACTION: f64 = 0.5;

/// What a tenant is alerted about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// The p99 queue wait (submitted to started) of the period's results.
    QueueWait,
    /// Jobs dead-lettered in the period.
    DeadLetters,
    /// Failed (dead-lettered) over finished, with at least a minimum of jobs.
    FailureRate,
}

impl Rule {
    pub const ALL: [Rule; 3] = [Rule::QueueWait, Rule::DeadLetters, Rule::FailureRate];
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::QueueWait => "queue_wait",
            Rule::DeadLetters => "dead_letters",
            Rule::FailureRate => "failure_rate",
        }
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
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            queue_wait_p99_ms: 300_000,
            dead_letters: 10,
            failure_rate: 0.2,
            failure_min_jobs: 20,
            for_periods: 5,
        }
    }
}

/// One tenant's observations in one evaluation period.
#[derive(Clone, Debug, PartialEq)]
pub struct Period {
    pub jobs: i64,
    pub failed: i64,
    waits: [u32; WAIT_BUCKETS],
}

impl Default for Period {
    fn default() -> Self {
        Period { jobs: 0, failed: 0, waits: [0; WAIT_BUCKETS] }
    }
}

fn bucket_of(wait_ms: Millis) -> usize {
    let w = wait_ms.max(1) as f64;
    ((2.0 * w.log2()).floor() as usize).min(WAIT_BUCKETS - 1)
}

fn upper_bound(bucket: usize) -> Millis {
    2f64.powf((bucket as f64 + 1.0) / 2.0).ceil() as Millis
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
        let b = &mut self.waits[bucket_of(wait_ms)];
        *b = b.saturating_add(1);
    }

    /// The p99 wait (its bucket's upper bound); 0 when nothing waited.
    pub fn wait_p99(&self) -> Millis {
        let n: u64 = self.waits.iter().map(|c| u64::from(*c)).sum();
        if n == 0 {
            return 0;
        }
        let rank = n - n / 100;
        let mut seen = 0u64;
        for (i, c) in self.waits.iter().enumerate() {
            seen += u64::from(*c);
            if seen >= rank {
                return upper_bound(i);
            }
        }
        upper_bound(WAIT_BUCKETS - 1)
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
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(tenant.as_bytes());
    h.update([0]);
    h.update(rule.as_str().as_bytes());
    h.update([0]);
    h.update(opened_at.to_be_bytes());
    let hex: String = h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("alert-{hex}")
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
    fn alert_ids_depend_on_tenant_rule_and_opening() {
        let a = alert_id("acme", Rule::QueueWait, 5);
        assert_eq!(a, alert_id("acme", Rule::QueueWait, 5));
        assert_ne!(a, alert_id("acme", Rule::QueueWait, 6));
        assert_ne!(a, alert_id("acme", Rule::DeadLetters, 5));
        assert_ne!(a, alert_id("acmf", Rule::QueueWait, 5));
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
