//! Scheduled jobs at scale, the pure rules: submission-time jitter (so "every day at
//! 09:00" from many tenants does not land on one millisecond) and the promoter's pacing
//! (so millions of jobs due at one instant reach the pool topics over minutes instead of
//! at once). No I/O; `now` and the random draw are arguments.

use crate::model::Millis;

/// Jobs scheduled further ahead than this get jitter.
pub const JITTER_AFTER_MS: Millis = 3_600_000;
/// The jitter's half width: `execute_at` moves by up to this much either way.
pub const JITTER_MS: Millis = 60_000;

/// The `execute_at` to store for a submission at `now`: more than an hour ahead it moves
/// by `(2r - 1) * 60 s` (`r` uniform in [0, 1) from the caller), never to less than an
/// hour ahead; `exact` (the job's opt-out) keeps it as asked.
pub fn jittered(execute_at: Millis, now: Millis, exact: bool, r: f64) -> Millis {
    if exact || execute_at.saturating_sub(now) <= JITTER_AFTER_MS {
        return execute_at;
    }
    let shift = ((2.0 * r.clamp(0.0, 1.0) - 1.0) * JITTER_MS as f64).round() as Millis;
    execute_at.saturating_add(shift).max(now.saturating_add(JITTER_AFTER_MS))
}

/// A pool worker holds a job due within this in memory until its `execute_at` (instead of
/// sending it to the delayed topic), so it starts on time to the timer's millisecond.
/// 5 s covers the common short delays (a 2 s delay is one hop, not three: pool topic,
/// delayed topic, pool topic); the pool loop's holding bound (50,000 jobs, 64 MiB)
/// sends the rest to the delayed topic.
pub const HOLD_AHEAD_MS: Millis = 5_000;

/// The relay hands a delayed job (due at its `execute_at`) back to its pool this long
/// before it is due, so the hops to a worker are behind it when it falls due; the worker
/// then holds it until then. Less than [`HOLD_AHEAD_MS`], so a released job is held, not
/// delayed again. Retries are handed back when due: their worker would not hold them.
pub const RELEASE_AHEAD_MS: Millis = 500;

/// When the relay hands a job back: `not_before`, less [`RELEASE_AHEAD_MS`] for a delayed
/// job (one due at its `execute_at`: its worker holds it until then).
pub fn release_at(not_before: Millis, execute_at: Option<Millis>) -> Millis {
    if execute_at == Some(not_before) {
        not_before - RELEASE_AHEAD_MS
    } else {
        not_before
    }
}

/// Whether a pool worker holds a job due at `execute_at` in memory at `now` (due within
/// [`HOLD_AHEAD_MS`]) rather than sending it to the delayed topic.
pub fn hold_in_worker(execute_at: Millis, now: Millis) -> bool {
    execute_at - now <= HOLD_AHEAD_MS
}

/// The promoter's pace: a token bucket of `rate` jobs per second holding at most one
/// second's worth, so a backlog of due jobs drains at `rate` and never in one burst.
#[derive(Debug, Clone)]
pub struct Pace {
    rate: f64,
    tokens: f64,
    last: Option<Millis>,
}

impl Pace {
    /// `rate` jobs per second (at least 1).
    pub fn new(rate: u32) -> Pace {
        Pace { rate: rate.max(1) as f64, tokens: 0.0, last: None }
    }

    /// How many of `want` due jobs may be promoted at `now` (taken from the bucket).
    pub fn take(&mut self, want: usize, now: Millis) -> usize {
        let elapsed = self.last.map_or(1_000, |l| (now - l).max(0));
        self.last = Some(now);
        self.tokens = (self.tokens + self.rate * elapsed as f64 / 1000.0).min(self.rate);
        let n = (self.tokens.floor() as usize).min(want);
        self.tokens -= n as f64;
        n
    }

    /// Returns `n` taken but unused (a pass that took for its upper bound of fires).
    pub fn give_back(&mut self, n: usize) {
        self.tokens = (self.tokens + n as f64).min(self.rate);
    }
}

/// `oldest_due_unpromoted_age` in seconds: how long the oldest due job still parked has
/// been due (0 when none is).
pub fn oldest_due_age_secs(oldest_due_at: Option<Millis>, now: Millis) -> f64 {
    oldest_due_at.map_or(0.0, |at| (now - at).max(0) as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_released_delayed_job_is_held_by_its_worker_not_delayed_again() {
        let due = 1_000_000;
        let released = release_at(due, Some(due));
        assert_eq!(released, due - RELEASE_AHEAD_MS);
        assert!(hold_in_worker(due, released), "released early, held until due");
        assert!(!hold_in_worker(due, released - HOLD_AHEAD_MS), "further ahead: the delayed topic");
        assert_eq!(release_at(due, None), due, "a retry is handed back when due");
        assert_eq!(release_at(due, Some(due - 60_000)), due, "so is the retry of a job that was delayed once");
    }

    #[test]
    fn jitter_only_far_ahead_and_not_when_exact() {
        let now = 1_000_000_000;
        assert_eq!(jittered(now + 60_000, now, false, 0.0), now + 60_000, "an hour or less: as asked");
        assert_eq!(jittered(now + JITTER_AFTER_MS, now, false, 0.0), now + JITTER_AFTER_MS);
        let far = now + 2 * JITTER_AFTER_MS;
        assert_eq!(jittered(far, now, true, 0.0), far, "opt-out");
        assert_eq!(jittered(far, now, false, 0.0), far - JITTER_MS);
        assert_eq!(jittered(far, now, false, 0.5), far);
        assert_eq!(jittered(far, now, false, 0.999_999), far + JITTER_MS);
    }

    proptest! {
        /// A record produced straight to Kafka skips the submit checks: any `execute_at`
        /// and `now` give an answer, never an overflow.
        #[test]
        fn jitter_of_any_time_never_overflows(at in any::<i64>(), now in any::<i64>(), r in 0.0f64..1.0) {
            let j = jittered(at, now, false, r);
            prop_assert!(j.abs_diff(at) <= JITTER_MS as u64 || j >= now.saturating_add(JITTER_AFTER_MS));
        }

        #[test]
        fn jitter_stays_within_60_s_and_past_the_hour(ahead in 0i64..100_000_000, r in 0.0f64..1.0) {
            let now = 1_700_000_000_000;
            let at = now + ahead;
            let j = jittered(at, now, false, r);
            prop_assert!((j - at).abs() <= JITTER_MS);
            if ahead > JITTER_AFTER_MS {
                prop_assert!(j >= now + JITTER_AFTER_MS);
            } else {
                prop_assert_eq!(j, at);
            }
        }

        /// Over any stretch of time the pace promotes at most rate * seconds (+ one
        /// second's burst), and, asked at least every second with enough due jobs, at
        /// least rate * seconds - rate (a longer pause loses all but one second's worth).
        #[test]
        fn pace_holds_its_rate(rate in 1u32..100_000, steps in proptest::collection::vec(1i64..=1_000, 1..50)) {
            let mut p = Pace::new(rate);
            let (mut now, mut total) = (0i64, 0usize);
            total += p.take(usize::MAX, now);
            for s in &steps {
                now += s;
                total += p.take(usize::MAX, now);
            }
            let secs = now as f64 / 1000.0;
            prop_assert!(total as f64 <= rate as f64 * (secs + 1.0) + 1.0);
            prop_assert!(total as f64 >= rate as f64 * secs - rate as f64 - 1.0);
        }
    }

    #[test]
    fn ten_million_due_at_once_take_minutes() {
        let mut p = Pace::new(50_000);
        let (mut left, mut now) = (10_000_000usize, 0i64);
        while left > 0 {
            left -= p.take(left, now);
            now += 1_000;
        }
        assert!((199_000..=201_000).contains(&now), "10 M at 50,000/s take 200 s, took {now} ms");
        assert_eq!(oldest_due_age_secs(Some(1_000), 3_500), 2.5);
        assert_eq!(oldest_due_age_secs(None, 3_500), 0.0);
    }
}
