//! The simulator's seeds in the unit tests (so in `scripts/test`), and the injected-bug
//! check. Seed counts are bounded for a debug build (docs/simulation.md has the numbers).

use super::*;

/// Fixed seeds per test run (and `FRESH` more): ~40 s in the dev build (docs/simulation.md, Speed).
const SEEDS: u64 = 1_500;

/// Seeds below `SEEDS` known to break an invariant, each of an open class named in
/// docs/simulation.md (Findings); a listed seed that passes fails the test, so the list
/// shrinks as classes are fixed. None now.
const KNOWN_OPEN: &[u64] = &[];

fn failing(seeds: std::ops::Range<u64>) -> Vec<(u64, String)> {
    let cfg = Config::default();
    let mut out = Vec::new();
    for seed in seeds {
        let r = run(seed, &cfg);
        if let Some(first) = r.violations.first() {
            let line = format!(
                "{} ({} violations, first: {}: {})",
                r.replay_command(),
                r.violations.len(),
                first.invariant,
                first.detail
            );
            out.push((seed, line));
        }
    }
    out
}

/// Fresh seeds per run of the tests, beside the fixed `0..SEEDS`.
const FRESH: u64 = 1_000;

/// The first fresh seed: `FAIRWAY_SIM_FIRST` if set, else derived from the commit under
/// test (`git rev-parse HEAD`), so each commit explores seeds no earlier one ran and a
/// failure replays from the seed it prints. None without either (said on stderr).
pub(super) fn fresh_first() -> Option<u64> {
    if let Ok(v) = std::env::var("FAIRWAY_SIM_FIRST") {
        return Some(v.parse().expect("FAIRWAY_SIM_FIRST is a seed (a whole number)"));
    }
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success());
    let Some(hex) = out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()) else {
        eprintln!("sim: no git commit to derive fresh seeds from; set FAIRWAY_SIM_FIRST to run them");
        return None;
    };
    // 40 bits of the commit, past the fixed range.
    u64::from_str_radix(hex.get(..10)?, 16).ok().map(|h| SEEDS + h)
}

/// Every invariant (docs/simulation.md) over `SEEDS` fixed seeds and `FRESH` seeds new
/// to each commit: lost jobs, stalls, duplicates, wrong results, two runs at once,
/// attempts used by crashes, dead-letter reasons, fairness and the usage counted once.
#[test]
fn all_invariants() {
    let mut bad = failing(0..SEEDS);
    if let Some(first) = fresh_first() {
        eprintln!("sim: fresh seeds {first}..{}", first + FRESH);
        bad.extend(failing(first..first + FRESH));
    }
    let new: Vec<&str> = bad.iter().filter(|(s, _)| !KNOWN_OPEN.contains(s)).map(|(_, l)| l.as_str()).collect();
    assert!(new.is_empty(), "{} seeds broke invariants:\n{}", new.len(), new.join("\n"));
    let fixed: Vec<u64> = KNOWN_OPEN.iter().copied().filter(|k| !bad.iter().any(|(s, _)| s == k)).collect();
    assert!(fixed.is_empty(), "seeds {fixed:?} pass now: take them out of KNOWN_OPEN (and docs/simulation.md)");
}

/// Regression seeds of the bugs the simulator found (docs/simulation.md, Findings): each
/// held every invariant once fixed. 17, 33: a retry copy skipped as running here; 329: a
/// copy of a job whose run here was not durable settled as running here; 202, 56: a
/// later attempt run beside a take-over re-run of the earlier one; 19, 31: jobs the
/// simulator lost itself (its end-of-run test counted duplicate results, and it applied
/// spill answers to a newer incarnation of the partition); 528, 2191, 2491: a superseded
/// run's late `retrying` or running write regressed the row; 1749: a take-over at the
/// lease's edge (its class is open: this seed no longer reaches it since copies follow
/// routes in flight), and 8478, its other seed; 125: a partition the simulated broker kept
/// as a dropped member's, never assigned again (found by the liveness watch);
/// 238692105415: the fence dropped an outcome and committed because the row showed another
/// worker's run, which then crashed (the job lost; now such a copy is not durable and
/// follows that run); 16315: the simulated store kept a heartbeat only while the row
/// showed its writer's mark, so a run whose mark another copy overwrote looked lapsed and
/// was taken over while it still ran (the real store keeps the job's newest heartbeat,
/// whoever wrote it).
#[test]
fn regression_seeds_hold_every_invariant() {
    let cfg = Config::default();
    let seeds = [17, 33, 329, 202, 56, 19, 31, 2, 22, 528, 2191, 2491, 1749, 8478, 125, 238_692_105_415, 16315];
    for seed in seeds {
        let r = run(seed, &cfg);
        assert!(r.violations.is_empty(), "{}: {:?}", r.replay_command(), r.violations);
    }
}

#[test]
fn a_seed_replays_the_same_trace() {
    let cfg = Config::default();
    for seed in [1, 7, 42] {
        let (a, b) = (run(seed, &cfg), run(seed, &cfg));
        assert_eq!(a.trace_hash, b.trace_hash, "seed {seed}");
        assert_eq!(a.violations, b.violations, "seed {seed}");
        assert_eq!(a.events, b.events, "seed {seed}");
    }
    assert_ne!(run(1, &cfg).trace_hash, run(2, &cfg).trace_hash);
}

/// The injected bug (a job's offset released for commit when its handler returns, before
/// its outcome is durable) is caught within the budget: some seed loses a job with the
/// bug that it does not lose without it, and that seed replays to the same violation.
#[test]
fn commit_before_durable_is_caught_and_replays() {
    let clean = Config::default();
    let buggy = Config { bugs: Bugs { commit_before_durable: true, ..Bugs::default() }, ..Config::default() };
    let lost = |r: &Report| -> Vec<String> {
        r.violations.iter().filter(|v| v.invariant == "lost").map(|v| v.detail.clone()).collect()
    };
    let found = (0..SEEDS).find_map(|seed| {
        let with_bug = lost(&run(seed, &buggy));
        let without = lost(&run(seed, &clean));
        let new: Vec<String> = with_bug.into_iter().filter(|d| !without.contains(d)).collect();
        (!new.is_empty()).then_some((seed, new))
    });
    let Some((seed, new)) = found else { panic!("the injected bug went unnoticed in {SEEDS} seeds") };
    let (a, b) = (run(seed, &buggy), run(seed, &buggy));
    assert_eq!(a.trace_hash, b.trace_hash, "seed {seed} does not replay");
    assert!(new.iter().all(|d| lost(&b).contains(d)), "seed {seed} replays without {new:?}");
}

/// The liveness watch catches a stall: without taking a not-durable job in again (the
/// injected bug), some seed holds a partition with records nobody moves, and that seed
/// holds every invariant without the bug.
#[test]
fn a_job_never_taken_in_again_is_a_stall_the_watch_reports() {
    let buggy = Config { bugs: Bugs { never_again: true, ..Bugs::default() }, ..Config::default() };
    let stalled = |r: &Report| r.violations.iter().any(|v| v.invariant == "stalled");
    let seed = (0..SEEDS)
        .find(|&seed| stalled(&run(seed, &buggy)))
        .unwrap_or_else(|| panic!("a job never taken in again went unnoticed in {SEEDS} seeds"));
    let clean = run(seed, &Config::default());
    assert!(clean.violations.is_empty(), "{}: {:?}", clean.replay_command(), clean.violations);
}

/// The lease's edge: without the fence (the injected bug), a run whose heartbeat lands
/// just after a take-over read the older one goes on beside the take-over's run (seeds
/// 4302 and 4454, found over seeds 4,000-4,454); with it both seeds hold every invariant.
#[test]
fn a_run_past_its_lease_is_two_runs_and_the_fence_stops_it() {
    let buggy = Config { bugs: Bugs { no_fence: true, ..Bugs::default() }, ..Config::default() };
    for seed in [4302, 4454] {
        let r = run(seed, &buggy);
        assert!(
            r.violations.iter().any(|v| v.invariant == "two_runs"),
            "seed {seed} without the fence: {:?}",
            r.violations
        );
        let clean = run(seed, &Config::default());
        assert!(clean.violations.is_empty(), "{}: {:?}", clean.replay_command(), clean.violations);
        assert!(clean.runs_fenced > 0, "seed {seed}: the fence fell");
    }
}
