//! Tests of idle-tenant eviction: memory returns to a bound, no credit survives it, and
//! tenants moved between indexes keep every job and every set consistent.

use super::sim::{Rng, T0};
use super::*;
use proptest::prelude::*;

const IDLE: Millis = 600_000;

fn sched(slots: usize) -> Scheduler<u64> {
    let mut c = SchedulerConfig::for_pool(Pool::Short, slots);
    c.idle_evict_ms = IDLE;
    c.fast_lanes = 1;
    Scheduler::new(Pool::Short, c).unwrap()
}

/// Runs every queued job for `ms` each, one at a time per free slot, until none is left.
fn drain(s: &mut Scheduler<u64>, now: &mut Millis, ms: Millis) -> Vec<u64> {
    let mut ran = Vec::new();
    loop {
        let mut started = Vec::new();
        while let Some(d) = s.next(*now) {
            ran.push(d.payload);
            started.push(d.id);
        }
        if started.is_empty() {
            return ran;
        }
        *now += ms;
        for id in started {
            s.complete(id, *now).unwrap();
        }
    }
}

#[test]
fn a_hundred_thousand_one_job_tenants_leave_a_bounded_state() {
    let mut s = sched(8);
    let mut now = T0;
    let n = 100_000u64;
    for i in 0..n {
        s.enqueue(&format!("t{i}"), "echo", Priority::Normal, i, now).unwrap();
        if i % 1_000 == 999 {
            now += 1;
            drain(&mut s, &mut now, 5);
        }
    }
    // One tenant is active when the sweep comes.
    s.enqueue("heavy", "echo", Priority::Normal, n, now).unwrap();
    assert_eq!(s.tracked_tenants(), n as usize + 1, "every tenant is tracked while recent");
    let ran = drain(&mut s, &mut now, 5);
    assert!(ran.contains(&n));
    s.local_usage_since_last_report(now);
    // Not idle long enough yet: nothing goes.
    assert_eq!(s.evict_idle(now + IDLE / 2), 0);
    s.enqueue("heavy", "echo", Priority::Normal, n + 1, now + IDLE).unwrap();
    let evicted = s.evict_idle(now + IDLE);
    assert_eq!(evicted, n as usize, "every idle tenant is forgotten");
    assert_eq!(s.tracked_tenants(), 1, "only the active tenant is left");
    assert_eq!(s.pool_stats(now + IDLE).evicted_tenants, n);
    assert!(s.tenants.capacity() <= 64, "the tenants' storage shrank (capacity {})", s.tenants.capacity());
    assert_eq!(s.queued("heavy"), 1);
    s.check_consistency();
}

#[test]
fn an_evicted_tenant_returns_with_no_credit_like_a_new_one() {
    let mut s = sched(1);
    let mut now = T0;
    // b stays backlogged; a runs a little and goes idle long enough to be evicted.
    for i in 0..10_000 {
        s.enqueue("b", "echo", Priority::Normal, i, now).unwrap();
    }
    s.enqueue("a", "echo", Priority::Normal, 100_000, now).unwrap();
    for _ in 0..4 {
        let d = s.next(now).unwrap();
        now += 100;
        s.complete(d.id, now).unwrap();
    }
    assert_eq!(s.queued("a"), 0, "a ran its job");
    // b runs alone for the idle period (a kept would bank nothing either).
    while now < T0 + IDLE + 1_000 {
        let d = s.next(now).unwrap();
        now += 100;
        s.complete(d.id, now).unwrap();
    }
    s.local_usage_since_last_report(now);
    assert_eq!(s.evict_idle(now), 1, "a is forgotten, b is not");
    assert_eq!(s.running_of("a"), 0);
    // a and a brand-new tenant c come at the same time: the same position (no credit).
    s.enqueue("a", "echo", Priority::Normal, 200_000, now).unwrap();
    s.enqueue("c", "echo", Priority::Normal, 300_000, now).unwrap();
    let stats = s.stats(now);
    let deficit = |t: &str| stats.iter().find(|x| x.tenant == t).unwrap().deficit_ms;
    assert_eq!(deficit("a"), deficit("c"), "an evicted tenant is a new tenant");
    assert!(deficit("a") <= 0.0, "no banked credit: {}", deficit("a"));
    // Each gets one slot turn, not a burst.
    let mut order = Vec::new();
    for _ in 0..3 {
        let d = s.next(now).unwrap();
        order.push(d.tenant.to_string());
        now += 100;
        s.complete(d.id, now).unwrap();
    }
    assert!(order.contains(&"a".to_string()) && order.contains(&"c".to_string()), "{order:?}");
    s.check_consistency();
}

#[test]
fn policies_outlive_eviction_and_worker_set_state_keeps_a_tenant() {
    let mut s = sched(4);
    let now = T0;
    s.set_tenant("pro", TenantPolicy::tier(Tier::Pro)).unwrap();
    s.set_tenant("capped", TenantPolicy::tier(Tier::Standard)).unwrap();
    s.set_fleet_cap("capped", Some(2));
    s.set_held("held", Some(now + 10 * IDLE));
    let limited = TenantPolicy { rate_limit: Some(RateLimit { per_second: 1.0, burst: 1 }), ..Default::default() };
    s.set_tenant("limited", limited.clone()).unwrap();
    s.set_fleet_rate("limited", 0.5);
    // Worker settings at their defaults do not create state for untracked tenants.
    s.set_fleet_cap("nobody", None);
    s.set_fleet_rate("nobody", 1.0);
    s.set_held("nobody", None);
    assert_eq!(s.tracked_tenants(), 4);
    let later = now + IDLE;
    assert_eq!(s.evict_idle(later), 1, "only the pro tenant had nothing set by the worker");
    assert_eq!(s.tenant_policy("pro").tier, Tier::Pro, "its policy is kept");
    s.enqueue("pro", "echo", Priority::Normal, 1, later).unwrap();
    let st = s.stats(later);
    assert_eq!(st.iter().find(|x| x.tenant == "pro").unwrap().tier, Tier::Pro, "returns with its tier");
    // Cleared worker settings let them go.
    s.set_fleet_cap("capped", None);
    s.set_held("held", None);
    s.set_fleet_rate("limited", 1.0);
    assert_eq!(s.evict_idle(later + IDLE), 3);
    assert_eq!(s.tracked_tenants(), 1);
    assert_eq!(s.tenant_policy("limited"), limited);
    s.check_consistency();
}

#[derive(Debug, Clone)]
enum Op {
    Enqueue { tenant: usize, priority: usize },
    Next,
    Complete { pick: usize },
    Advance { ms: Millis },
    Evict,
    Cap { tenant: usize, cap: Option<usize> },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..12, 0usize..3).prop_map(|(tenant, priority)| Op::Enqueue { tenant, priority }),
        3 => Just(Op::Next),
        3 => (0usize..64).prop_map(|pick| Op::Complete { pick }),
        2 => (0 as Millis..3 * IDLE).prop_map(|ms| Op::Advance { ms }),
        2 => Just(Op::Evict),
        1 => (0usize..12, prop::option::of(0usize..3)).prop_map(|(tenant, cap)| Op::Cap { tenant, cap }),
    ]
}

proptest! {
    /// Whatever the interleaving of jobs, completions and evictions (tenants of every
    /// tier, rate-limited ones, free ones), every job is dispatched exactly once and
    /// every structure naming tenants by index stays consistent.
    #[test]
    fn prop_eviction_keeps_every_job_and_the_sets_consistent(
        ops in prop::collection::vec(op(), 1..300),
        seed in any::<u64>(),
    ) {
        let mut s = sched(3);
        let tiers = [Tier::Free, Tier::Standard, Tier::Pro, Tier::Free];
        for t in 0..12 {
            let mut p = TenantPolicy::tier(tiers[t % 4]);
            if t % 5 == 0 {
                p.rate_limit = Some(RateLimit { per_second: 20.0, burst: 2 });
            }
            s.set_tenant(&format!("t{t}"), p).unwrap();
        }
        let mut rng = Rng::new(seed);
        let mut now = T0;
        let mut seq = 0u64;
        let mut running: Vec<DispatchId> = Vec::new();
        let mut dispatched = std::collections::HashSet::new();
        for op in ops {
            match op {
                Op::Enqueue { tenant, priority } => {
                    let p = Priority::ALL[priority];
                    if s.enqueue(&format!("t{tenant}"), "x", p, seq, now).is_ok() {
                        seq += 1;
                    }
                }
                Op::Next => {
                    if let Some(d) = s.next(now) {
                        prop_assert!(dispatched.insert(d.payload), "job {} dispatched twice", d.payload);
                        running.push(d.id);
                    }
                }
                Op::Complete { pick } if !running.is_empty() => {
                    let id = running.swap_remove(pick % running.len());
                    let at = now + rng.range(0, 50);
                    prop_assert!(s.complete(id, at).is_some());
                }
                Op::Complete { .. } => {}
                Op::Advance { ms } => {
                    now += ms;
                    s.local_usage_since_last_report(now);
                }
                Op::Evict => {
                    s.evict_idle(now);
                }
                Op::Cap { tenant, cap } => s.set_fleet_cap(&format!("t{tenant}"), cap),
            }
            s.check_consistency();
        }
        // Lift the caps, then everything queued runs exactly once.
        for t in 0..12 {
            s.set_fleet_cap(&format!("t{t}"), None);
        }
        for id in running.drain(..) {
            s.complete(id, now).unwrap();
        }
        for _ in 0..100_000 {
            if s.queued_total() == 0 {
                break;
            }
            now += 100;
            while let Some(d) = s.next(now) {
                prop_assert!(dispatched.insert(d.payload), "job {} dispatched twice", d.payload);
                s.complete(d.id, now + 10).unwrap();
            }
            if rng.unit() < 0.1 {
                s.evict_idle(now);
            }
            s.check_consistency();
        }
        prop_assert_eq!(dispatched.len() as u64, seq, "every accepted job ran once");
    }
}
