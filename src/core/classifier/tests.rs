use super::*;
use proptest::prelude::*;

fn ranges() -> Ranges {
    Ranges::new([(Pool::Short, Some(1_000)), (Pool::Medium, Some(60_000)), (Pool::Long, None)])
}

fn cfg() -> ClassifierConfig {
    ClassifierConfig { min_runs: 10, ..Default::default() }
}

/// A window of `n` runs of `ms` each, counted against `pool`'s range.
fn runs(pool: Pool, ms: &[(Millis, i64)]) -> RunCell {
    let mut c = RunCell::default();
    for (run_ms, n) in ms {
        for _ in 0..*n {
            c.record(*run_ms, ranges().violation(pool, *run_ms));
        }
    }
    c
}

#[test]
fn ranges_follow_the_pools_in_order() {
    let r = ranges();
    assert_eq!(r.range(Pool::Short), (0, Some(1_000)));
    assert_eq!(r.range(Pool::Medium), (1_000, Some(60_000)));
    assert_eq!(r.range(Pool::Long), (60_000, None));
    assert_eq!(r.violation(Pool::Short, 999), None);
    assert_eq!(r.violation(Pool::Short, 1_000), Some(Violation::Over));
    assert_eq!(r.violation(Pool::Medium, 200), Some(Violation::Under));
    assert_eq!(r.violation(Pool::Long, 10 * 3_600_000), None);
}

#[test]
fn fitting_keeps_the_pool_within_the_hysteresis_band() {
    let r = ranges();
    assert_eq!(r.fitting(Pool::Short, 1_150, 0.2), Pool::Short, "within 20 % above short's max");
    assert_eq!(r.fitting(Pool::Short, 1_300, 0.2), Pool::Medium);
    assert_eq!(r.fitting(Pool::Short, 120_000, 0.2), Pool::Long);
    assert_eq!(r.fitting(Pool::Medium, 900, 0.2), Pool::Medium, "within 20 % below medium's min");
    assert_eq!(r.fitting(Pool::Medium, 700, 0.2), Pool::Short);
    assert_eq!(r.fitting(Pool::Long, 5, 0.0), Pool::Short);
}

#[test]
fn quantile_is_the_upper_end_of_its_bucket() {
    let c = runs(Pool::Short, &[(10, 95), (1_500, 5)]);
    let p95 = c.quantile(0.95).unwrap();
    assert!((10..=12).contains(&p95), "{p95}");
    let p99 = c.quantile(0.99).unwrap();
    assert!((1_500..=1_800).contains(&p99), "{p99}");
    assert_eq!(RunCell::default().quantile(0.95), None);
    assert_eq!(runs(Pool::Short, &[(0, 3)]).quantile(0.5), Some(1));
}

#[test]
fn a_short_type_running_long_moves_to_medium_sticky_for_an_hour() {
    let w = runs(Pool::Short, &[(1_500, 20)]);
    let m = decide(&cfg(), &ranges(), Pool::Short, None, &w, 1_000).expect("moves");
    assert_eq!((m.from, m.to, m.runs, m.violations), (Pool::Short, Pool::Medium, 20, 20));
    assert_eq!(m.class, Class { pool: Pool::Medium, since: 1_000, sticky_until: 1_000 + 3_600_000 });
    let s = Subject::new("report", "acme");
    assert!(m.describe(&s, &cfg()).contains("from pool short to medium"), "{}", m.describe(&s, &cfg()));
    // Sticky: nothing changes for an hour, whatever the runs.
    let fast = runs(Pool::Medium, &[(5, 50)]);
    assert_eq!(decide(&cfg(), &ranges(), Pool::Short, Some(&m.class), &fast, 3_600_000), None);
    // After it, runs too short for medium move it back.
    let back = decide(&cfg(), &ranges(), Pool::Short, Some(&m.class), &fast, 3_601_000).expect("moves back");
    assert_eq!((back.from, back.to), (Pool::Medium, Pool::Short));
}

#[test]
fn no_move_below_min_runs_at_or_below_the_share_or_when_the_quantile_fits() {
    let c = cfg();
    assert_eq!(decide(&c, &ranges(), Pool::Short, None, &runs(Pool::Short, &[(1_500, 9)]), 0), None, "9 < min_runs");
    // 1 violation in 100 is 1 %: not more than the limit.
    assert_eq!(decide(&c, &ranges(), Pool::Short, None, &runs(Pool::Short, &[(10, 99), (5_000, 1)]), 0), None);
    // 3 % outliers: over the share, but the p95 still fits short.
    assert_eq!(decide(&c, &ranges(), Pool::Short, None, &runs(Pool::Short, &[(10, 97), (5_000, 3)]), 0), None);
    // Too short for medium, but moving down is off.
    let off = ClassifierConfig { move_down: false, ..c };
    assert_eq!(decide(&off, &ranges(), Pool::Medium, None, &runs(Pool::Medium, &[(10, 50)]), 0), None);
}

#[test]
fn routing_explicit_pool_wins_and_replays_follow_the_class_from_the_configured_pool() {
    let class = Class { pool: Pool::Medium, since: 0, sticky_until: 1 };
    assert_eq!(route(None, Pool::Short, Some(&class)), Pool::Medium);
    assert_eq!(route(Some(Pool::Short), Pool::Short, Some(&class)), Pool::Short);
    assert_eq!(route(None, Pool::Short, None), Pool::Short);
    assert_eq!(replay_pool(Some(Pool::Short), Pool::Short, Some(&class)), Pool::Medium);
    assert_eq!(replay_pool(None, Pool::Short, Some(&class)), Pool::Medium);
    assert_eq!(replay_pool(Some(Pool::Long), Pool::Short, Some(&class)), Pool::Long);
}

#[test]
fn window_runs_sum_the_window_per_subject_and_pool() {
    let a = runs(Pool::Short, &[(1_500, 2)]);
    let b = runs(Pool::Short, &[(10, 3)]);
    let (t, u) = (Subject::new("t", "acme"), Subject::new("t", "globex"));
    let cells = [(0, &t, Pool::Short, &a), (10_000, &t, Pool::Short, &b), (10_000, &t, Pool::Medium, &a)];
    let w = window_runs(cells, 20_000, 10_000);
    assert_eq!(w[&(t.clone(), Pool::Short)].runs, 3, "bucket 0 ended at the window's start");
    let w = window_runs(cells, 15_000, 60_000);
    let short = &w[&(t.clone(), Pool::Short)];
    assert_eq!((short.runs, short.over, short.under), (5, 2, 0));
    assert_eq!(short.hist.values().sum::<i64>(), 5);
    assert_eq!(w[&(t.clone(), Pool::Medium)].runs, 2);
    assert!(!w.contains_key(&(u, Pool::Short)), "another tenant's runs of the type are its own");
}

#[test]
fn one_tenants_slow_runs_move_that_tenants_jobs_only() {
    let (acme, globex) = (Subject::new("shared", "acme"), Subject::new("shared", "globex"));
    let slow = runs(Pool::Short, &[(1_500, 20)]);
    let fast = runs(Pool::Short, &[(10, 20)]);
    let cells = [(0, &acme, Pool::Short, &slow), (0, &globex, Pool::Short, &fast)];
    let w = window_runs(cells, 5_000, 60_000);
    let moved = |s: &Subject| decide(&cfg(), &ranges(), Pool::Short, None, &w[&(s.clone(), Pool::Short)], 5_000);
    let m = moved(&acme).expect("acme's jobs move");
    assert_eq!(m.to, Pool::Medium);
    assert_eq!(moved(&globex), None, "globex's jobs of the type stay");
    assert_eq!(route(None, Pool::Short, Some(&m.class)), Pool::Medium);
    assert!(m.describe(&acme, &cfg()).contains("of tenant \"acme\""));
}

#[test]
fn subject_keys_round_trip() {
    let s = Subject::new("video.encode", "acme-1");
    assert_eq!(Subject::from_key(&s.key()), Some(s));
    assert_eq!(Subject::from_key("no separator"), None);
}

#[test]
fn idle_classes_are_dropped_after_their_sticky_time_and_new_ones_are_capped() {
    let class = Class { pool: Pool::Medium, since: 0, sticky_until: 1_000 };
    let (busy, quiet) = (Subject::new("t", "busy"), Subject::new("t", "quiet"));
    let classes: HashMap<Subject, Class> = [(busy.clone(), class.clone()), (quiet.clone(), class)].into();
    let active = |s: &Subject| *s == busy;
    assert!(idle(&classes, active, 999).is_empty(), "sticky: kept");
    assert_eq!(idle(&classes, active, 1_000), vec![quiet], "no runs in the window and past sticky");
    let c = ClassifierConfig { max_tracked: 2, ..Default::default() };
    assert!(room_for_class(1, &c));
    assert!(!room_for_class(2, &c));
    assert!(ClassifierConfig { max_tracked: 0, ..Default::default() }.validate().is_err());
}

#[test]
fn config_is_validated() {
    assert!(ClassifierConfig::default().validate().is_ok());
    let bad = ClassifierConfig { max_violation_share: 1.5, ..Default::default() };
    assert!(bad.validate().unwrap_err().to_string().contains("0.01"));
    let bad = ClassifierConfig { window: DurationMs::secs(1), ..Default::default() };
    assert!(bad.validate().unwrap_err().to_string().contains("10s"));
}

fn pool() -> impl Strategy<Value = Pool> {
    prop_oneof![Just(Pool::Short), Just(Pool::Medium), Just(Pool::Long)]
}

proptest! {
    /// Every run time falls in exactly one pool's range, and fitting without hysteresis
    /// picks that pool.
    #[test]
    fn every_run_time_fits_exactly_one_pool(ms in 0i64..10_000_000, current in pool()) {
        let r = ranges();
        let fits: Vec<Pool> = Pool::ALL.into_iter().filter(|p| r.violation(*p, ms).is_none()).collect();
        prop_assert_eq!(fits.len(), 1);
        prop_assert_eq!(r.fitting(current, ms, 0.0), fits[0]);
    }

    /// A run time lies below the upper end of its histogram bucket, and above the
    /// previous bucket's upper end (the quantile over-estimates by at most one bucket).
    #[test]
    fn histogram_buckets_bound_their_runs(ms in 0i64..100_000_000) {
        let b = hist_bucket(ms);
        prop_assert!(ms < hist_upper(b) || (b == 0 && ms < 1), "{} in {} < {}", ms, b, hist_upper(b));
        prop_assert!(b == 0 || ms >= hist_upper(b - 1) - 1);
        prop_assert!(hist_upper(b) as f64 <= (ms.max(1) as f64) * 1.19 + 1.0);
    }

    /// Decisions: nothing moves while sticky or below min_runs; a move always goes to
    /// another pool, in the direction of the violations, and is sticky from `now`.
    #[test]
    fn decisions_respect_stickiness_and_direction(
        current in pool(),
        samples in proptest::collection::vec((0i64..200_000, 1i64..30), 1..8),
        sticky_left in -5_000i64..5_000,
        now in 0i64..1_000_000_000,
    ) {
        let c = cfg();
        let w = runs(current, &samples);
        let class = Class { pool: current, since: 0, sticky_until: now + sticky_left };
        let d = decide(&c, &ranges(), Pool::Short, Some(&class), &w, now);
        if sticky_left > 0 || w.runs < c.min_runs as i64 {
            prop_assert_eq!(d, None);
        } else if let Some(m) = d {
            prop_assert_eq!(m.from, current);
            prop_assert_ne!(m.to, current);
            prop_assert!(m.violations as f64 > c.max_violation_share * w.runs as f64);
            if m.to > current { prop_assert!(w.over > 0) } else { prop_assert!(w.under > 0) }
            prop_assert_eq!(m.class.sticky_until, now + c.sticky.0);
            // The target pool holds the quantile.
            prop_assert_eq!(ranges().violation(m.to, m.quantile_ms), None);
        }
    }
}
