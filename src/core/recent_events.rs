//! The recent job events the console's job search looks through, kept per tenant with
//! one bound for all: past it, the event that goes is the oldest of the tenant holding the
//! most. So one tenant's burst evicts its own events first, and a tenant holding fewer
//! than its equal share (the bound over the tenants kept) keeps all of its recent ones,
//! whatever the others send. No I/O.

use crate::model::JobEvent;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// Recent events per tenant, at most `max` in all.
#[derive(Debug)]
pub struct RecentEvents {
    max: usize,
    len: usize,
    by_tenant: HashMap<String, VecDeque<Arc<JobEvent>>>,
    /// Tenants by how many events they hold (the eviction's choice: the last entry).
    by_count: BTreeMap<usize, BTreeSet<String>>,
}

impl RecentEvents {
    /// At most `max` events in all (at least one).
    pub fn new(max: usize) -> RecentEvents {
        RecentEvents { max: max.max(1), len: 0, by_tenant: HashMap::new(), by_count: BTreeMap::new() }
    }

    /// Keeps `e`, then evicts while over the bound ([`RecentEvents`]).
    pub fn push(&mut self, e: Arc<JobEvent>) {
        let tenant = e.tenant.clone();
        let q = self.by_tenant.entry(tenant.clone()).or_default();
        q.push_back(e);
        let n = q.len();
        self.recount(&tenant, n - 1, n);
        self.len += 1;
        while self.len > self.max {
            self.evict_from_largest();
        }
    }

    /// Every event kept, each tenant's oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &JobEvent> {
        self.by_tenant.values().flat_map(|q| q.iter().map(|e| e.as_ref()))
    }

    /// Events kept, all tenants.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Events kept of `tenant`.
    pub fn of(&self, tenant: &str) -> usize {
        self.by_tenant.get(tenant).map_or(0, VecDeque::len)
    }

    fn evict_from_largest(&mut self) {
        let Some(tenant) = self.by_count.iter().next_back().and_then(|(_, ts)| ts.iter().next().cloned()) else {
            return;
        };
        let Some(q) = self.by_tenant.get_mut(&tenant) else { return };
        q.pop_front();
        let n = q.len();
        if n == 0 {
            self.by_tenant.remove(&tenant);
        }
        self.recount(&tenant, n + 1, n);
        self.len -= 1;
    }

    /// Moves `tenant` from the count `from` to `to` (0: not counted).
    fn recount(&mut self, tenant: &str, from: usize, to: usize) {
        if from > 0 {
            if let Some(ts) = self.by_count.get_mut(&from) {
                ts.remove(tenant);
                if ts.is_empty() {
                    self.by_count.remove(&from);
                }
            }
        }
        if to > 0 {
            self.by_count.entry(to).or_default().insert(tenant.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn event(tenant: &str, n: usize) -> Arc<JobEvent> {
        Arc::new(crate::core::events::succeeded_for_test(tenant, &format!("{tenant}-{n}"), n as i64))
    }

    #[test]
    fn a_burst_of_one_tenant_evicts_its_own_events_not_a_quiet_tenants() {
        let mut r = RecentEvents::new(100);
        for n in 0..10 {
            r.push(event("quiet", n));
        }
        for n in 0..10_000 {
            r.push(event("flood", n));
        }
        assert_eq!((r.len(), r.of("quiet"), r.of("flood")), (100, 10, 90));
        let newest_flood = r.iter().filter(|e| e.tenant == "flood").map(|e| e.at).min();
        assert_eq!(newest_flood, Some(9_910), "the flood keeps its newest");
    }

    proptest! {
        /// Whatever the order of pushes: at most `max` kept, each tenant's newest kept, and
        /// a tenant that pushed fewer than `max` over the tenants seen keeps every event.
        #[test]
        fn the_bound_holds_and_a_tenant_below_its_share_keeps_all(
            max in 1usize..60,
            pushes in prop::collection::vec(0usize..6, 0..400),
        ) {
            let mut r = RecentEvents::new(max);
            let mut pushed: HashMap<String, usize> = HashMap::new();
            for t in &pushes {
                let name = format!("t{t}");
                let n = pushed.entry(name.clone()).or_default();
                r.push(event(&name, *n));
                *n += 1;
            }
            prop_assert!(r.len() <= max);
            prop_assert_eq!(r.len(), r.iter().count());
            let share = max / pushed.len().max(1);
            for (t, n) in &pushed {
                let kept: Vec<i64> = r.iter().filter(|e| e.tenant == *t).map(|e| e.at).collect();
                let newest = (*n - kept.len()..*n).map(|i| i as i64).collect::<Vec<_>>();
                prop_assert_eq!(&kept, &newest, "{} keeps its newest", t);
                if *n < share {
                    prop_assert_eq!(kept.len(), *n, "{} is below its share {} and keeps all", t, share);
                }
            }
        }
    }
}
