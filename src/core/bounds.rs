//! What a time a caller gives may be. Every instant that comes from outside (an HTTP query
//! or body, a CLI flag, a schedule, a replay or rerun range, `execute_at` / `not_after`)
//! passes through here before any arithmetic, loop or allocation uses it, so the code after
//! the check can add a day or a year to it without overflow, and a range walked day by day
//! is walked at most [`MAX_PERIOD_DAYS`] times.
//!
//! Instants are epoch milliseconds from 1970 to the end of the year 9999
//! ([`MIN_TIME_MS`]..=[`MAX_TIME_MS`]): 34 bits of the 63 an `i64` holds, so sums and
//! differences of two of them, or of one and any duration of at most [`MAX_TIME_MS`], stay
//! far from overflow. A duration a caller gives ("2h ago", "+30s") is checked the same way.

use crate::model::Millis;
use std::time::Duration;

/// Earliest instant accepted: 1970-01-01T00:00:00Z.
pub const MIN_TIME_MS: Millis = 0;
/// Latest instant accepted: 9999-12-31T23:59:59.999Z.
pub const MAX_TIME_MS: Millis = 253_402_300_799_999;
/// One day.
pub const DAY_MS: Millis = 86_400_000;
/// Longest period any day-by-day walk covers (a usage report asks for less, see
/// `crate::ledger::MAX_REPORT_DAYS`; a month export and the console's charts too).
pub const MAX_PERIOD_DAYS: i64 = 400;

/// Why a caller's time is refused: the field, what is wrong, and the allowed range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundError {
    #[error(
        "`{field}` = {value} is out of range: give epoch milliseconds from {MIN_TIME_MS} (1970-01-01) to \
         {MAX_TIME_MS} (9999-12-31T23:59:59.999Z)"
    )]
    Time { field: &'static str, value: Millis },
    #[error(
        "`{field}`: {what} lands outside 1970-01-01 to 9999-12-31 (epoch ms {MIN_TIME_MS} to {MAX_TIME_MS}); \
         give a shorter duration"
    )]
    Duration { field: &'static str, what: String },
    #[error("`{to_field}` ({to}) must be after `{from_field}` ({from})")]
    Order { from_field: &'static str, from: Millis, to_field: &'static str, to: Millis },
    #[error(
        "`{from_field}` to `{to_field}` spans {days} days; at most {max_days} days are allowed: ask for a \
         shorter period, or several"
    )]
    Span { from_field: &'static str, to_field: &'static str, days: i64, max_days: i64 },
}

/// `value` if it is an instant fairway accepts.
pub fn instant(field: &'static str, value: Millis) -> Result<Millis, BoundError> {
    if (MIN_TIME_MS..=MAX_TIME_MS).contains(&value) {
        Ok(value)
    } else {
        Err(BoundError::Time { field, value })
    }
}

/// `value`, when given, if it is an accepted instant.
pub fn optional(field: &'static str, value: Option<Millis>) -> Result<Option<Millis>, BoundError> {
    value.map(|v| instant(field, v)).transpose()
}

/// `d` as milliseconds when it is at most [`MAX_TIME_MS`].
fn duration_ms(field: &'static str, d: Duration, what: impl FnOnce() -> String) -> Result<Millis, BoundError> {
    i64::try_from(d.as_millis())
        .ok()
        .filter(|ms| *ms <= MAX_TIME_MS)
        .ok_or_else(|| BoundError::Duration { field, what: what() })
}

/// The instant `d` before `now` ("2h ago"), if accepted.
pub fn ago(field: &'static str, now: Millis, d: Duration) -> Result<Millis, BoundError> {
    shifted(field, now, d, true)
}

/// The instant `d` after `now` ("+30s"), if accepted.
pub fn ahead(field: &'static str, now: Millis, d: Duration) -> Result<Millis, BoundError> {
    shifted(field, now, d, false)
}

fn shifted(field: &'static str, now: Millis, d: Duration, back: bool) -> Result<Millis, BoundError> {
    let what = || format!("{} {} now", humantime::format_duration(d), if back { "before" } else { "after" });
    let ms = duration_ms(field, d, what)?;
    let at = if back { now.checked_sub(ms) } else { now.checked_add(ms) };
    at.filter(|t| (MIN_TIME_MS..=MAX_TIME_MS).contains(t)).ok_or_else(|| BoundError::Duration { field, what: what() })
}

/// A checked period `[from, to)`: both accepted instants, `from < to`, at most
/// [`MAX_PERIOD_DAYS`] days (or less, as its maker asked). Only [`period`] and
/// [`Period::clamped`] make one, so whoever walks it day by day is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    from: Millis,
    to: Millis,
}

impl Period {
    pub fn from(&self) -> Millis {
        self.from
    }
    pub fn to(&self) -> Millis {
        self.to
    }

    /// A period of times this process made itself (from its clock), never a caller's:
    /// pulled into the accepted range and cut to its last [`MAX_PERIOD_DAYS`] days.
    pub fn clamped(from: Millis, to: Millis) -> Period {
        let to = to.clamp(MIN_TIME_MS + 1, MAX_TIME_MS);
        let from = from.clamp(MIN_TIME_MS, to - 1).max(to - MAX_PERIOD_DAYS * DAY_MS);
        Period { from, to }
    }

    /// The starts of the days (UTC) that hold a part of it, oldest first: at most
    /// [`MAX_PERIOD_DAYS`] + 1.
    pub fn days(&self) -> Vec<Millis> {
        let mut d = self.from.div_euclid(DAY_MS) * DAY_MS;
        let mut out = Vec::with_capacity(((self.to - d) / DAY_MS + 1) as usize);
        while d < self.to {
            out.push(d);
            d += DAY_MS;
        }
        out
    }
}

/// `[from, to)` given by a caller as the fields named: both accepted instants, `to` after
/// `from`, at most `max_days` days long (capped at [`MAX_PERIOD_DAYS`]).
pub fn period(
    (from_field, from): (&'static str, Millis),
    (to_field, to): (&'static str, Millis),
    max_days: i64,
) -> Result<Period, BoundError> {
    let max_days = max_days.clamp(1, MAX_PERIOD_DAYS);
    instant(from_field, from)?;
    // `to` is an exclusive end: up to one past the last accepted instant.
    instant(to_field, to.saturating_sub(1)).map_err(|_| BoundError::Time { field: to_field, value: to })?;
    if to <= from {
        return Err(BoundError::Order { from_field, from, to_field, to });
    }
    if to - from > max_days * DAY_MS {
        let days = (to - from + DAY_MS - 1) / DAY_MS;
        return Err(BoundError::Span { from_field, to_field, days, max_days });
    }
    Ok(Period { from, to })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NEAR_MAX: Millis = 9_223_372_036_854_775_000;

    #[test]
    fn instants_past_the_year_9999_or_before_1970_are_refused_with_the_range() {
        assert_eq!(instant("from", 0), Ok(0));
        assert_eq!(instant("from", MAX_TIME_MS), Ok(MAX_TIME_MS));
        for v in [-1, MAX_TIME_MS + 1, NEAR_MAX, i64::MAX, i64::MIN] {
            let e = instant("from", v).unwrap_err().to_string();
            assert!(e.contains("`from`") && e.contains(&v.to_string()) && e.contains("253402300799999"), "{e}");
        }
    }

    #[test]
    fn the_attack_period_is_refused_before_any_walk() {
        let e = period(("from", NEAR_MAX), ("to", i64::MAX), 93).unwrap_err();
        assert_eq!(e, BoundError::Time { field: "from", value: NEAR_MAX });
        let e = period(("from", i64::MIN), ("to", 0), 93).unwrap_err();
        assert_eq!(e, BoundError::Time { field: "from", value: i64::MIN });
        let e = period(("from", 0), ("to", 94 * DAY_MS), 93).unwrap_err();
        assert_eq!(e, BoundError::Span { from_field: "from", to_field: "to", days: 94, max_days: 93 });
        assert!(e.to_string().contains("at most 93 days"), "{e}");
        let e = period(("from", 5), ("to", 5), 93).unwrap_err();
        assert!(matches!(e, BoundError::Order { .. }), "{e}");
        // A caller's max above the ceiling is the ceiling.
        assert!(period(("from", 0), ("to", (MAX_PERIOD_DAYS + 1) * DAY_MS), i64::MAX).is_err());
    }

    #[test]
    fn durations_ago_and_ahead_are_checked() {
        let now = 1_764_000_000_000;
        assert_eq!(ago("since", now, Duration::from_secs(3600)), Ok(now - 3_600_000));
        assert_eq!(ahead("execute_at", now, Duration::from_secs(30)), Ok(now + 30_000));
        assert!(ago("since", now, Duration::from_secs(u64::MAX)).is_err());
        assert!(ago("since", 10, Duration::from_millis(11)).is_err());
        assert!(ahead("execute_at", now, Duration::from_secs(u64::MAX)).is_err());
        assert!(ahead("execute_at", MAX_TIME_MS, Duration::from_millis(1)).is_err());
        let e = ago("since", now, Duration::from_secs(400_000 * 365 * 86_400)).unwrap_err().to_string();
        assert!(e.contains("`since`") && e.contains("9999-12-31"), "{e}");
    }

    #[test]
    fn a_clamped_period_is_within_range() {
        assert_eq!(Period::clamped(i64::MIN, i64::MAX).to(), MAX_TIME_MS);
        assert_eq!(Period::clamped(i64::MIN, i64::MAX).days().len() as i64, MAX_PERIOD_DAYS + 1);
        assert_eq!(Period::clamped(10, 5), Period { from: 4, to: 5 });
        assert_eq!(Period::clamped(0, DAY_MS).days(), vec![0]);
    }

    proptest! {
        /// Whatever two numbers a caller sends, a period is refused or walks at most
        /// `max_days + 1` days, each inside the period's days, in order.
        #[test]
        fn any_period_walks_a_bounded_number_of_days(from in any::<i64>(), to in any::<i64>(), max in any::<i64>()) {
            if let Ok(p) = period(("from", from), ("to", to), max) {
                let days = p.days();
                prop_assert!(!days.is_empty());
                prop_assert!(days.len() as i64 <= max.clamp(1, MAX_PERIOD_DAYS) + 1);
                prop_assert!(days[0] <= from && from < days[0] + DAY_MS);
                prop_assert!(*days.last().unwrap() < to);
                prop_assert!(days.windows(2).all(|w| w[1] - w[0] == DAY_MS));
            }
        }

        #[test]
        fn near_edge_periods_are_refused_or_in_range(from in (MAX_TIME_MS - 10 * DAY_MS)..=i64::MAX, len in 0..(1000 * DAY_MS)) {
            match period(("from", from), ("to", from.saturating_add(len)), 93) {
                Ok(p) => prop_assert!(p.to() <= MAX_TIME_MS && p.days().len() <= 94),
                Err(_) => prop_assert!(from > MAX_TIME_MS || from.saturating_add(len) > MAX_TIME_MS || len == 0 || len > 93 * DAY_MS),
            }
        }

        #[test]
        fn clamped_periods_never_overflow(from in any::<i64>(), to in any::<i64>()) {
            let p = Period::clamped(from, to);
            prop_assert!(MIN_TIME_MS <= p.from() && p.from() < p.to() && p.to() <= MAX_TIME_MS);
            prop_assert!(p.days().len() as i64 <= MAX_PERIOD_DAYS + 1);
        }

        #[test]
        fn ago_and_ahead_never_leave_the_range(now in any::<i64>(), ms in any::<u64>()) {
            let d = Duration::from_millis(ms);
            for t in [ago("t", now, d), ahead("t", now, d)].into_iter().flatten() {
                prop_assert!((MIN_TIME_MS..=MAX_TIME_MS).contains(&t));
            }
        }
    }
}
