use super::*;
use proptest::prelude::*;

fn rate(s: &str) -> Rate {
    s.parse().unwrap()
}

fn demand(tenant: &str, key: Option<&str>, n: u32, t: &str, u: Option<&str>) -> Demand {
    Demand { tenant: tenant.into(), key: key.map(Into::into), n, tenant_rate: rate(t), user_rate: u.map(rate) }
}

#[test]
fn rates_parse_below_one_per_second_and_say_how_to_fix() {
    assert_eq!(rate("3/min"), Rate { count: 3, per_ms: 60_000 });
    assert_eq!(rate("30/min"), Rate { count: 30, per_ms: 60_000 });
    assert_eq!(rate("100/s"), Rate::per_second(100));
    assert_eq!(rate("5/10s"), Rate { count: 5, per_ms: 10_000 });
    assert_eq!(rate(" 2 / h "), Rate { count: 2, per_ms: 3_600_000 });
    assert_eq!(rate("3/min").to_string(), "3/min");
    assert_eq!(rate("5/10s").to_string(), "5/10s");
    for bad in ["3", "x/min", "0/min", "3/fortnight", "3/0s"] {
        let e = bad.parse::<Rate>().unwrap_err();
        assert!(e.contains("3/min"), "{bad}: {e}");
    }
}

#[test]
fn token_bucket_bursts_one_period_then_refills_evenly() {
    let mut b = TokenBucket::new(rate("3/min"), 0);
    for _ in 0..3 {
        assert_eq!(b.fits(1, 0), Fit::Yes);
        b.take(1, 0);
    }
    assert_eq!(b.fits(1, 0), Fit::Wait(20_000), "one token every 20 s");
    assert_eq!(b.fits(1, 15_000), Fit::Wait(5_000));
    assert_eq!(b.fits(1, 20_000), Fit::Yes);
    assert_eq!(b.fits(4, 20_000), Fit::Never { most: 3 });
    assert!((b.used(20_000) - 2.0 / 3.0).abs() < 1e-9);
}

#[test]
fn sliding_window_counts_exactly_the_last_period() {
    let mut w = SlidingWindow::new(rate("3/min"));
    w.take(1, 0);
    w.take(1, 10_000);
    w.take(1, 50_000);
    assert_eq!(w.fits(1, 55_000), Fit::Wait(5_000), "the event at 0 leaves at 60 s");
    assert_eq!(w.fits(2, 55_000), Fit::Wait(15_000), "two must leave: the one at 10 s leaves at 70 s");
    assert_eq!(w.fits(1, 60_000), Fit::Yes);
    assert_eq!(w.fits(4, 60_000), Fit::Never { most: 3 });
    assert!(w.is_idle(200_000));
}

#[test]
fn both_scopes_apply_and_the_tighter_wins() {
    let mut l = RateLimiters::default();
    // Tenant 100/s, user 3/min: the user window refuses the 4th job of user u1 for ~60 s.
    for _ in 0..3 {
        l.admit(&[demand("acme", Some("u1"), 1, "100/s", Some("3/min"))], 0).unwrap();
    }
    match l.admit(&[demand("acme", Some("u1"), 1, "100/s", Some("3/min"))], 1_000) {
        Err(Refusal::Rate { scope: Limit::UserRate, wait_ms, key, .. }) => {
            assert_eq!((wait_ms, key.as_deref()), (59_000, Some("u1")))
        }
        other => panic!("{other:?}"),
    }
    // Another user of the same tenant is not affected.
    l.admit(&[demand("acme", Some("u2"), 1, "100/s", Some("3/min"))], 1_000).unwrap();
    // Tenant 2/s, user 30/min: the tenant bucket is the tighter one.
    let mut l = RateLimiters::default();
    l.admit(&[demand("t", Some("u"), 2, "2/s", Some("30/min"))], 0).unwrap();
    match l.admit(&[demand("t", Some("u"), 1, "2/s", Some("30/min"))], 0) {
        Err(Refusal::Rate { scope: Limit::TenantRate, wait_ms: 500, .. }) => {}
        other => panic!("{other:?}"),
    }
}

/// A tenant with more end users than [`MAX_USER_WINDOWS`] keeps that many windows (the
/// map grew by one per user_key before); its new users share one window at the user
/// rate, another tenant's users keep their own, and idle windows are pruned.
#[test]
fn end_user_windows_are_bounded_per_tenant_and_pruned() {
    let mut l = RateLimiters::default();
    for i in 0..MAX_USER_WINDOWS + 2 {
        let key = format!("u{i}");
        l.admit(&[demand("acme", Some(&key), 1, "1000000/s", Some("2/min"))], 0).unwrap();
    }
    assert_eq!(l.user_windows("acme"), MAX_USER_WINDOWS + 1, "its own windows plus the shared one");
    // The users past the bound share one window of 2/min: a third of them is refused.
    let err = l.admit(&[demand("acme", Some("one-more"), 1, "1000000/s", Some("2/min"))], 0);
    assert!(matches!(err, Err(Refusal::Rate { scope: Limit::UserRate, .. })), "{err:?}");
    l.admit(&[demand("globex", Some("u0"), 1, "100/s", Some("2/min"))], 0).unwrap();
    assert_eq!(l.user_windows("globex"), 1);
    // A minute later every window is idle: a new user of acme gets its own again.
    l.admit(&[demand("acme", Some("late"), 1, "1000000/s", Some("2/min"))], 60_000).unwrap();
    assert_eq!(l.user_windows("acme"), 1, "idle windows forgotten when the tenant was full");
    l.prune(120_000);
    assert_eq!((l.user_windows("acme"), l.user_windows("globex")), (0, 0));
}

#[test]
fn a_refused_batch_takes_nothing_from_any_scope() {
    let mut l = RateLimiters::default();
    let batch = [demand("a", Some("u"), 2, "10/s", Some("3/min")), demand("b", None, 1, "1/min", None)];
    l.admit(&batch, 0).unwrap();
    // b is empty now: the whole next batch is refused, and a's tokens stay.
    let err = l.admit(&[demand("a", Some("u"), 1, "10/s", Some("3/min")), demand("b", None, 1, "1/min", None)], 0);
    assert!(matches!(err, Err(Refusal::Rate { scope: Limit::TenantRate, wait_ms: 60_000, .. })), "{err:?}");
    l.admit(&[demand("a", Some("u"), 1, "10/s", Some("3/min"))], 0).unwrap();
    let err = l.admit(&[demand("a", Some("u"), 1, "10/s", Some("3/min"))], 0);
    assert!(matches!(err, Err(Refusal::Rate { scope: Limit::UserRate, .. })), "{err:?}");
    let err = l.admit(&[demand("c", None, 5, "3/min", None)], 0);
    assert!(matches!(err, Err(Refusal::AboveBurst { most: 3, .. })), "{err:?}");
}

#[test]
fn queue_rule_counts_the_whole_request() {
    assert!(queue_check("a", 9, 1, Some(10)).is_ok());
    assert_eq!(
        queue_check("a", 9, 2, Some(10)),
        Err(Refusal::QueueFull { tenant: "a".into(), queued: 9, n: 2, max: 10 })
    );
    assert!(queue_check("a", 1_000_000, 1, None).is_ok());
    assert_eq!(queued(5, 7), 0, "more dequeued than enqueued (jobs produced elsewhere) is an empty queue");
    assert_eq!(queued(7, 5), 2);
}

#[test]
fn quota_levels_alert_once_per_crossing_upwards() {
    let mut q = QuotaLevels::new(vec![0.8, 0.6]);
    assert_eq!(q.observe("a", Limit::Queue, 0.5), None);
    let c = q.observe("a", Limit::Queue, 0.65).unwrap();
    assert_eq!((c.level, c.limit), (0.6, Limit::Queue));
    assert_eq!(q.observe("a", Limit::Queue, 0.7), None, "still above 60 %: no repeat");
    assert_eq!(q.observe("a", Limit::Queue, 0.9).unwrap().level, 0.8);
    assert_eq!(q.observe("a", Limit::TenantRate, 0.95).unwrap().level, 0.8, "straight to 80 %: one alert");
    let at = q.tenants_at();
    assert!(at.contains(&(Limit::Queue, 0.8, 1)) && at.contains(&(Limit::UserRate, 0.6, 0)), "{at:?}");
    assert_eq!(q.observe("a", Limit::Queue, 0.1), None);
    assert_eq!(q.observe("a", Limit::Queue, 0.61).unwrap().level, 0.6, "re-armed after falling back");
}

proptest! {
    /// Whatever the arrival pattern, the sliding window never lets more than `count`
    /// events into any window of `per_ms`, and a refusal's wait is exact: just before
    /// it the event is still refused, at it the event fits.
    #[test]
    fn sliding_window_never_exceeds_and_waits_are_exact(
        count in 1u32..6, per_ms in 1_000i64..120_000,
        gaps in proptest::collection::vec(0i64..30_000, 1..80),
    ) {
        let r = Rate { count, per_ms };
        let mut w = SlidingWindow::new(r);
        let mut now = 0;
        let mut admitted: Vec<Millis> = Vec::new();
        for g in gaps {
            now += g;
            match w.fits(1, now) {
                Fit::Yes => { w.take(1, now); admitted.push(now); }
                Fit::Wait(ms) => {
                    prop_assert!(ms >= 1);
                    prop_assert_eq!(w.clone().fits(1, now + ms), Fit::Yes);
                    if ms > 1 { prop_assert!(w.clone().fits(1, now + ms - 1) != Fit::Yes); }
                }
                Fit::Never { .. } => prop_assert!(false, "1 <= count"),
            }
            let in_window = admitted.iter().filter(|t| **t + per_ms > now).count();
            prop_assert!(in_window <= count as usize);
        }
    }

    /// The token bucket admits at most `count + elapsed * rate` events over any run.
    #[test]
    fn token_bucket_stays_within_burst_plus_rate(
        count in 1u32..20, per_ms in 100i64..120_000,
        gaps in proptest::collection::vec(0i64..5_000, 1..200),
    ) {
        let r = Rate { count, per_ms };
        let mut b = TokenBucket::new(r, 0);
        let (mut now, mut taken) = (0i64, 0u64);
        for g in gaps {
            now += g;
            if b.fits(1, now) == Fit::Yes { b.take(1, now); taken += 1; }
            let most = f64::from(count) + now as f64 / r.interval_ms();
            prop_assert!(taken as f64 <= most + 1e-6, "{} > {}", taken, most);
        }
    }
}

proptest::proptest! {
    /// N replicas each admitting one share admit the whole rate: the steady rates add
    /// up to the configured one within one event per period, and no share bursts above
    /// its part.
    #[test]
    fn shares_add_up_to_the_rate(count in 1u32..100_000, per_ms in 1i64..3_600_000, n in 1u32..16) {
        let r = Rate { count, per_ms };
        let s = r.share(n);
        let whole = f64::from(count) / per_ms as f64;
        let parts = f64::from(n) * f64::from(s.count) / s.per_ms as f64;
        proptest::prop_assert!((parts - whole).abs() <= whole * 0.01 + 1.0 / per_ms as f64, "{r} / {n} = {s}");
        proptest::prop_assert!(s.count == (count / n).max(1));
    }
}

#[test]
fn one_share_is_the_rate() {
    let r = Rate::per_second(10);
    assert_eq!(r.share(1), r);
    assert_eq!(r.share(0), r);
    assert_eq!(r.share(3), Rate { count: 3, per_ms: 900 });
}
