use super::*;

fn ms(rfc3339: &str) -> Millis {
    chrono::DateTime::parse_from_rfc3339(rfc3339).expect("test time").timestamp_millis()
}

fn cron(expr: &str, tz: Option<&str>) -> Timing {
    let spec = ScheduleSpec {
        name: "s".into(),
        job_type: "echo".into(),
        cron: Some(expr.into()),
        tz: tz.map(Into::into),
        ..Default::default()
    };
    spec.timing("id-1", 0).expect("valid")
}

fn every(every: &str, created_at: Millis) -> Timing {
    let spec =
        ScheduleSpec { name: "s".into(), job_type: "echo".into(), every: Some(every.into()), ..Default::default() };
    spec.timing("id-1", created_at).expect("valid")
}

#[test]
fn cron_with_or_without_seconds() {
    let t = cron("*/2 * * * * *", None);
    assert_eq!(t.next_after(ms("2026-01-01T00:00:00.500Z")), Some(ms("2026-01-01T00:00:02Z")));
    assert_eq!(t.next_after(ms("2026-01-01T00:00:02Z")), Some(ms("2026-01-01T00:00:04Z")));
    let t = cron("0 2 * * *", None);
    assert_eq!(t.next_after(ms("2026-01-01T00:00:00Z")), Some(ms("2026-01-01T02:00:00Z")));
    assert_eq!(t.at_or_after(ms("2026-01-01T02:00:00Z")), Some(ms("2026-01-01T02:00:00Z")));
}

#[test]
fn zones_shift_wall_clock_times() {
    // 02:00 in Berlin is 01:00 UTC in winter, 00:00 UTC in summer.
    let t = cron("0 2 * * *", Some("Europe/Berlin"));
    assert_eq!(t.next_after(ms("2026-01-10T12:00:00Z")), Some(ms("2026-01-11T01:00:00Z")));
    assert_eq!(t.next_after(ms("2026-07-10T12:00:00Z")), Some(ms("2026-07-11T00:00:00Z")));
}

/// Clocks go forward (Berlin, 2026-03-29 02:00 CET -> 03:00 CEST): a skipped wall time
/// fires once when the gap ends; several skipped times collapse into that one fire.
#[test]
fn dst_gap_fires_once_when_the_gap_ends() {
    let t = cron("30 2 * * *", Some("Europe/Berlin"));
    let fires = t.upcoming(t.next_after(ms("2026-03-28T12:00:00Z")), 3);
    assert_eq!(
        fires,
        vec![ms("2026-03-29T01:00:00Z"), ms("2026-03-30T00:30:00Z"), ms("2026-03-31T00:30:00Z")],
        "03:00 CEST on the night of the change, then 02:30 CEST"
    );
    let q = cron("*/15 * * * *", Some("Europe/Berlin"));
    let fires = q.upcoming(q.next_after(ms("2026-03-29T00:40:00Z")), 3);
    // 01:45 CET, then 02:00..02:45 (skipped) fire once at 03:00 CEST, then 03:15 CEST.
    assert_eq!(fires, vec![ms("2026-03-29T00:45:00Z"), ms("2026-03-29T01:00:00Z"), ms("2026-03-29T01:15:00Z")]);
    // New York: 2026-03-08 02:00 EST -> 03:00 EDT (07:00 UTC).
    let ny = cron("30 2 * * *", Some("America/New_York"));
    assert_eq!(ny.next_after(ms("2026-03-07T12:00:00Z")), Some(ms("2026-03-08T07:00:00Z")));
}

/// Clocks go back (Berlin, 2026-10-25 03:00 CEST -> 02:00 CET): a repeated wall time
/// fires once, at its first occurrence; the second pass of the hour fires nothing.
#[test]
fn dst_repeat_fires_once_at_the_first_occurrence() {
    let t = cron("30 2 * * *", Some("Europe/Berlin"));
    let fires = t.upcoming(t.next_after(ms("2026-10-24T12:00:00Z")), 2);
    assert_eq!(fires, vec![ms("2026-10-25T00:30:00Z"), ms("2026-10-26T01:30:00Z")]);
    let hourly = cron("0 * * * *", Some("Europe/Berlin"));
    let fires = hourly.upcoming(hourly.next_after(ms("2026-10-24T23:30:00Z")), 3);
    // 02:00 CEST (00:00Z), then 03:00 CET (02:00Z): 02:00 CET (01:00Z) is the repeat.
    assert_eq!(fires, vec![ms("2026-10-25T00:00:00Z"), ms("2026-10-25T02:00:00Z"), ms("2026-10-25T03:00:00Z")]);
    // From inside the second pass, the next fire is after it.
    assert_eq!(t.next_after(ms("2026-10-25T01:20:00Z")), Some(ms("2026-10-26T01:30:00Z")));
}

#[test]
fn intervals_count_real_time_from_their_anchor_inside_the_window() {
    let t = every("2s", 1_000);
    assert_eq!(t.next_after(0), Some(1_000));
    assert_eq!(t.next_after(1_000), Some(3_000));
    assert_eq!(t.next_after(4_999), Some(5_000));
    let spec = ScheduleSpec {
        name: "w".into(),
        job_type: "echo".into(),
        every: Some("10s".into()),
        start_at: Some(100_000),
        end_at: Some(125_000),
        ..Default::default()
    };
    let w = spec.timing("x", 0).unwrap();
    assert_eq!(w.upcoming(w.at_or_after(0), 5), vec![100_000, 110_000, 120_000]);
    let c = ScheduleSpec { cron: Some("*/10 * * * * *".into()), every: None, ..spec };
    let c = c.timing("x", 0).unwrap();
    assert_eq!(c.upcoming(c.at_or_after(0), 5), vec![100_000, 110_000, 120_000]);
}

#[test]
fn catch_up_policies_after_a_stop() {
    let now = 1_000_000;
    let cursor = now - 10 * 60_000; // down for 10 minutes, a fire every minute
    let mk = |catch_up| {
        let spec = ScheduleSpec {
            name: "c".into(),
            job_type: "echo".into(),
            every: Some("1m".into()),
            start_at: Some(cursor),
            catch_up,
            ..Default::default()
        };
        spec.timing("id", 0).unwrap()
    };
    // none: the missed fires are skipped; the one inside the grace runs.
    let p = mk(CatchUp::None).due_by(cursor, now, now, 100);
    assert_eq!(p.fires.iter().map(|f| f.at).collect::<Vec<_>>(), vec![now - 60_000, now]);
    assert_eq!(p.cursor, Some(now + 60_000));
    assert!(p.skipped);
    // one: one job now for the missed ones, then the on-time ones.
    let p = mk(CatchUp::One).due_by(cursor, now, now, 100);
    assert_eq!(p.fires[0], Fire { at: cursor, run_at: now });
    assert_eq!(p.fires[1..].iter().map(|f| f.at).collect::<Vec<_>>(), vec![now - 60_000, now]);
    assert!(p.skipped, "the other missed fires were skipped");
    assert!(is_late(p.fires[0].at, now) && !is_late(p.fires[1].at, now));
    // all: every one, oldest first, `limit` per pass; the cursor resumes after them.
    let all = mk(CatchUp::All);
    let p = all.due_by(cursor, now, now, 4);
    assert_eq!(
        p.fires.iter().map(|f| f.at).collect::<Vec<_>>(),
        (0..4).map(|i| cursor + i * 60_000).collect::<Vec<_>>()
    );
    assert_eq!(p.cursor, Some(cursor + 4 * 60_000));
    assert!(!p.skipped, "all skips nothing within the horizon");
    let p = all.due_by(p.cursor.unwrap(), now, now, 100);
    assert_eq!(p.fires.len(), 7, "the other 7 of the 11");
    // one with a single missed fire skips nothing.
    assert!(!mk(CatchUp::One).due_by(now - 2 * 60_000, now, now, 100).skipped);
    // Nothing due yet; limit 0.
    assert_eq!(all.due_by(now + 1, now, now, 10), Pass { fires: vec![], cursor: Some(now + 1), skipped: false });
    assert_eq!(all.due_by(cursor, now, now, 0), Pass { fires: vec![], cursor: Some(cursor), skipped: false });
}

#[test]
fn fires_ahead_up_to_until_with_their_job_due_at_the_fire() {
    let spec =
        ScheduleSpec { name: "s".into(), job_type: "echo".into(), every: Some("1s".into()), ..Default::default() };
    let t = spec.timing("id", 0).unwrap();
    let fire = t.next_after(10_000_000).unwrap();
    let now = fire - 400;
    let p = t.due_by(fire, fire - 1_000, fire - 1_000 + FIRE_AHEAD_MS, 10);
    assert!(p.fires.is_empty(), "a fire beyond the look-ahead waits: {p:?}");
    let p = t.due_by(fire, now, now + FIRE_AHEAD_MS, 10);
    assert_eq!(p.fires, vec![Fire { at: fire, run_at: fire }], "fired ahead, its job due at the fire");
    assert_eq!(p.cursor, Some(fire + 1_000));
    assert!(!p.skipped && !is_late(p.fires[0].at, now));
}

#[test]
fn all_catches_up_at_most_a_day() {
    let spec = ScheduleSpec {
        name: "c".into(),
        job_type: "echo".into(),
        every: Some("1h".into()),
        start_at: Some(0),
        catch_up: CatchUp::All,
        ..Default::default()
    };
    let t = spec.timing("id", 0).unwrap();
    let now = 100 * 3_600_000;
    let p = t.due_by(0, now, now, 1000);
    assert_eq!(p.fires.len(), 25, "the hours of the last day, both ends");
    assert_eq!(p.fires[0].at, now - CATCH_UP_HORIZON_MS);
    assert!(p.skipped, "the fires older than a day were skipped");
}

#[test]
fn schedule_bounds_name_the_key_and_the_fix() {
    assert_eq!(SchedulesConfig::default().validate(), Ok(()));
    let zero = SchedulesConfig { max_per_tenant: 0, ..Default::default() };
    assert_eq!(zero.validate().unwrap_err().field, "max_per_tenant");
    let crate::core::invalid::Invalid { field: key, problem: why } =
        SchedulesConfig { max_per_tenant: 10, max_total: 5, ..Default::default() }.validate().unwrap_err();
    assert_eq!(key, "max_total");
    assert!(why.contains("between schedules.max_per_tenant (10) and 100000"), "{why}");
    let huge = SchedulesConfig { max_total: MAX_TOTAL_CEILING + 1, ..Default::default() };
    assert_eq!(huge.validate().unwrap_err().field, "max_total");
    let crowd = SchedulesConfig { max_per_tenant: MAX_PER_TENANT_CEILING + 1, ..Default::default() };
    assert_eq!(crowd.validate().unwrap_err().field, "max_per_tenant");
    assert_eq!(SchedulesConfig::default().max_payload_bytes, 65_536);
    let big = SchedulesConfig { max_payload_bytes: MAX_PAYLOAD_CEILING + 1, ..Default::default() };
    assert_eq!(big.validate().unwrap_err().field, "max_payload_bytes");
}

/// Times at the ends of `i64` used to reach fire-time arithmetic (`anchor + n * every`
/// overflowed); they are refused by field, and the latest accepted time still computes.
#[test]
fn start_and_end_times_are_bounded_so_fire_times_never_overflow() {
    let base =
        ScheduleSpec { name: "n".into(), job_type: "echo".into(), every: Some("1s".into()), ..Default::default() };
    for (start_at, end_at, field) in [
        (Some(i64::MIN), None, "start_at"),
        (Some(-1), None, "start_at"),
        (Some(MAX_TIME_MS + 1), None, "start_at"),
        (None, Some(i64::MAX), "end_at"),
        (Some(0), Some(i64::MAX), "end_at"),
    ] {
        let spec = ScheduleSpec { start_at, end_at, ..base.clone() };
        let err = spec.timing("id", 0).expect_err("an unbounded time is refused");
        assert_eq!(err.field, field, "{start_at:?}..{end_at:?}: {err}");
    }
    let latest = ScheduleSpec { start_at: Some(MAX_TIME_MS), end_at: Some(MAX_TIME_MS), ..base };
    let t = latest.timing("id", 0).unwrap();
    assert_eq!(t.at_or_after(0), Some(MAX_TIME_MS));
    assert_eq!(t.next_after(MAX_TIME_MS), None);
    assert_eq!(t.due_by(MAX_TIME_MS, MAX_TIME_MS, MAX_TIME_MS, 10).fires.len(), 1);
}

#[test]
fn fires_have_stable_distinct_v7_job_ids_and_fixed_jitter() {
    let t = cron("* * * * *", None);
    let a = t.job_id(ms("2026-01-01T00:01:00Z"));
    assert_eq!(a, t.job_id(ms("2026-01-01T00:01:00Z")), "every promoter derives the same id");
    assert_ne!(a, t.job_id(ms("2026-01-01T00:02:00Z")));
    assert_ne!(a, fire_job_id("another schedule", ms("2026-01-01T00:01:00Z")));
    let u = uuid::Uuid::parse_str(&a).unwrap();
    assert_eq!(u.get_version_num(), 7);
    let (secs, _) = u.get_timestamp().unwrap().to_unix();
    assert_eq!(secs as i64 * 1000, ms("2026-01-01T00:01:00Z"));
    let spec = ScheduleSpec {
        name: "j".into(),
        job_type: "echo".into(),
        cron: Some("* * * * *".into()),
        jitter: Some("30s".into()),
        ..Default::default()
    };
    let j = spec.timing("id", 0).unwrap();
    let mut moved = 0;
    for i in 0..50 {
        let at = i * 60_000;
        let f = j.due_by(at, at, at, 1).fires[0];
        assert!((at..at + 30_000).contains(&f.run_at), "jitter within [0, 30 s)");
        assert_eq!(f, j.due_by(at, at, at, 1).fires[0], "the same draw every time");
        moved += usize::from(f.run_at != at);
    }
    assert!(moved >= 45);
}

#[test]
fn bad_schedules_name_the_field_and_the_fix() {
    let base = ScheduleSpec { name: "n".into(), job_type: "echo".into(), ..Default::default() };
    let err = |s: ScheduleSpec| s.timing("id", 0).unwrap_err();
    assert_eq!(err(base.clone()).field, "cron", "neither cron nor every");
    let e = err(ScheduleSpec { cron: Some("0 2 * *".into()), ..base.clone() });
    assert!(e.to_string().contains("4 fields"), "{e}");
    let e = err(ScheduleSpec { cron: Some("99 * * * *".into()), ..base.clone() });
    assert_eq!(e.field, "cron");
    let e = err(ScheduleSpec { cron: Some("0 2 * * *".into()), tz: Some("Mars/Olympus".into()), ..base.clone() });
    assert!(e.field == "tz" && e.message.contains("IANA"), "{e}");
    let e = err(ScheduleSpec { every: Some("500ms".into()), ..base.clone() });
    assert_eq!(e.field, "every");
    let e = err(ScheduleSpec { every: Some("soon".into()), ..base.clone() });
    assert!(e.message.contains("\"30s\""), "{e}");
    let e = err(ScheduleSpec { every: Some("1m".into()), tz: Some("UTC".into()), ..base.clone() });
    assert_eq!(e.field, "tz");
    let e = err(ScheduleSpec { every: Some("1m".into()), jitter: Some("2h".into()), ..base.clone() });
    assert_eq!(e.field, "jitter");
    let e = err(ScheduleSpec { every: Some("1m".into()), start_at: Some(10), end_at: Some(5), ..base.clone() });
    assert_eq!(e.field, "end_at");
    let e = err(ScheduleSpec { name: "a b".into(), every: Some("1m".into()), ..base.clone() });
    assert_eq!(e.field, "name");
    // An expression that matches no day never fires.
    let never = cron("0 0 30 2 *", None);
    assert_eq!(never.next_after(0), None);
}
