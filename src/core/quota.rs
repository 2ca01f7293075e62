//! Fleet-wide limits, the pure part: a limit of `N` concurrent jobs on a *scope* (a
//! tenant's `max_concurrency` in a pool, a flow key's `parallelism`) shared by every
//! worker of the pool, enforced without a store round trip per job.
//!
//! **Mechanism: per-worker allotments announced in a shared table.** Every pass
//! (`worker::quota`, twice a second) each worker of a pool writes one row per
//! scope it has work for: `want` (its jobs of the scope queued or running) and `held`
//! (the most it may be running: `max(announced cap, cap the pool loop still enforces,
//! running)`), with a short TTL, so a crashed worker's units come back by themselves.
//! It reads the pool's rows back and computes, per scope:
//!
//! * its **allotment** ([`allot`]): the limit dealt out one unit at a time, round robin
//!   over the workers that want some, in an order that rotates every
//!   [`ROTATION_MS`] (so with fewer units than workers every worker gets its turn);
//! * its **cap**: `min(allotment, N - sum of the other workers' held)`, so it never
//!   counts on units another worker still holds (a worker that must give units back
//!   keeps them in `held` until its running jobs finished);
//! * its **usable** cap: `min(cap, cap announced in its previous row)`. A *decrease*
//!   applies at once; an *increase* only after it was written and a later read still
//!   allows it. Two workers raising their caps at the same time therefore cannot both
//!   use units only one of them may have: of two announcements, the one written later
//!   was confirmed by a read that saw the earlier one.
//!
//! **Worst case.** While the store answers, the fleet never runs more than `N` jobs of
//! a scope: every start is bounded by a usable cap, usable caps only grow after an
//! announcement confirmed by a read that saw every earlier announcement, and a worker's
//! `held` covers everything it may still be running. A worker whose last successful
//! write is older than [`STALE_MS`] (well inside the rows' TTL) stops starting jobs of
//! limited scopes until it can write again, so its row never expires under running
//! jobs. What remains: a worker frozen (not crashed) for longer than the TTL with jobs
//! running - its units are dealt out again while its jobs continue: up to its `held`
//! jobs over `N`. The cost is latency, not throughput: a scope's first job on a worker
//! waits one to two passes for its first allotment, and a unit moving between workers
//! idles for up to two passes.
//!
//! **Rates** (a tenant's `rate`, a flow key's `rate`/`period`) ride the same rows: a
//! worker reports its demand of a rate scope (its jobs of the tenant queued or running;
//! its jobs of the flow key admitted or parked, on the key's `flow:` row) and gets a
//! **share** of the rate, `its want / the pool's want` ([`share`]), which its scheduler
//! applies to the tenant's token bucket, or its flow gate to the key's (`core::flow`)
//! (rate x share, burst x share but at least one, tokens kept across changes). As with caps, a decrease applies at once and an increase only once
//! announced, and a stale worker's share is 0. **Worst case:** shares computed from the
//! same rows sum to 1, so the fleet's sustained rate stays at the limit; while demand
//! moves between workers, views one pass apart may overlap by the demand that moved
//! within that pass (the confirmed-increase rule keeps it to one pass); bursts add up to
//! `burst + workers` tokens (every worker's bucket holds at least one). A worker's first
//! job of a rate-limited tenant waits one to two passes for its share.
//!
//! Rows are keyed by the pool's topic name (one partition per pool), so deployments that
//! share a keyspace never share limits.

use crate::model::Millis;
use std::collections::HashMap;

/// Units are dealt in an order that rotates this often (fairness between workers when a
/// scope has fewer units than workers wanting them).
pub const ROTATION_MS: i64 = 10_000;
/// A worker that could not write its rows for this long starts nothing of a limited
/// scope (rows live `ROW_TTL_SECS`; this leaves margin before another worker could
/// count on its units).
pub const STALE_MS: i64 = 2_500;
/// Rows expire after this (a crashed worker's units come back).
pub const ROW_TTL_SECS: i32 = 5;

/// One worker's row for one scope, as written and read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub scope: String,
    pub worker: String,
    pub want: u32,
    pub held: u32,
}

/// What a fleet-wide scope limits. Its name (`kind:subject`, see [`Scope::name`]) keys
/// the exchange's rows and this module's maps; [`Scope::parse`] reads one back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// A tenant's `max_concurrency`: `tenant:<tenant>`.
    Tenant(String),
    /// A tenant's `rate` (shared by demand, see [`share`]): `rate:<tenant>`.
    Rate(String),
    /// A flow key's `parallelism` (`core::flow`): `flow:<key>`.
    Flow(String),
}

impl Scope {
    /// The scope's name as written in the exchange's rows.
    pub fn name(&self) -> String {
        match self {
            Scope::Tenant(t) => format!("tenant:{t}"),
            Scope::Rate(t) => format!("rate:{t}"),
            Scope::Flow(k) => format!("flow:{k}"),
        }
    }

    /// The scope a name stands for; None for a kind this version does not know.
    pub fn parse(name: &str) -> Option<Scope> {
        let (kind, subject) = name.split_once(':')?;
        let subject = subject.to_string();
        match kind {
            "tenant" => Some(Scope::Tenant(subject)),
            "rate" => Some(Scope::Rate(subject)),
            "flow" => Some(Scope::Flow(subject)),
            _ => None,
        }
    }
}

/// This worker's part of a rate: its want over the want of every worker (0 without want).
pub fn share(mine: u32, others: &[u32]) -> f64 {
    if mine == 0 {
        return 0.0;
    }
    let total: u64 = others.iter().map(|&w| u64::from(w)).sum::<u64>() + u64::from(mine);
    f64::from(mine) / total as f64
}

fn order_key(worker: &str, epoch: i64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in worker.bytes().chain(epoch.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Deals `limit` units to the workers by `want`, one at a time round robin, starting in
/// an order that depends only on the worker names and `epoch` (every worker computes the
/// same result from the same rows). Nobody gets more than it wants; the units handed out
/// never exceed `limit`.
pub fn allot(limit: u32, wants: &[(&str, u32)], epoch: i64) -> HashMap<String, u32> {
    let mut order: Vec<(&str, u32)> = wants.iter().copied().filter(|(_, w)| *w > 0).collect();
    order.sort_by_key(|(w, _)| (order_key(w, epoch), *w));
    let mut given: Vec<u32> = vec![0; order.len()];
    let mut left = limit;
    while left > 0 {
        let mut dealt = false;
        for (i, (_, want)) in order.iter().enumerate() {
            if left == 0 {
                break;
            }
            if given[i] < *want {
                given[i] += 1;
                left -= 1;
                dealt = true;
            }
        }
        if !dealt {
            break;
        }
    }
    order.iter().zip(given).map(|((w, _), g)| (w.to_string(), g)).collect()
}

/// This worker's state of one scope.
#[derive(Debug, Clone, Default, PartialEq)]
struct ScopeState {
    limit: u32,
    /// Reported by the pool loop: its jobs of the scope queued or running, and running.
    want: u32,
    running: u32,
    /// The cap the pool loop enforces now (it lags `usable` by one loop iteration).
    applied: u32,
    /// Cap computed from the latest read, and the part of it usable now.
    cap: u32,
    usable: u32,
    /// Cap of the last row written successfully (what the others count on).
    announced: u32,
    /// Rate scopes: the share computed from the latest read, the part of it usable now,
    /// and the share when the last row was written.
    share: f64,
    usable_share: f64,
    announced_share: f64,
}

/// A worker's fleet-wide limits of one pool: what the pool loop reports, what the quota
/// pass computes from the shared rows, and the caps the pool loop may use.
#[derive(Debug, Default)]
pub struct Quotas {
    scopes: HashMap<String, ScopeState>,
    /// When this worker's rows were last written successfully.
    written_at: Option<Millis>,
    /// Bumped whenever a usable cap changes (the pool loop re-applies then).
    pub version: u64,
}

impl Quotas {
    /// The pool loop's figures for a scope (call for every limited scope with work, and
    /// once more with zeros when its work is gone).
    pub fn report(&mut self, scope: &str, limit: u32, want: u32, running: u32) {
        let s = self.scopes.entry(scope.to_string()).or_default();
        s.limit = limit;
        s.want = want;
        s.running = running;
    }

    /// The pool loop enforces `cap` for the scope from now on.
    pub fn applied(&mut self, scope: &str, cap: u32) {
        if let Some(s) = self.scopes.get_mut(scope) {
            s.applied = cap;
        }
    }

    /// How many jobs of the scope this worker may run now: 0 while its rows are stale.
    pub fn usable(&self, scope: &str, now: Millis) -> u32 {
        if self.written_at.is_none_or(|at| now - at > STALE_MS) {
            return 0;
        }
        self.scopes.get(scope).map_or(0, |s| s.usable)
    }

    /// This worker's share (0..=1) of a rate scope now: 0 while its rows are stale.
    pub fn usable_share(&self, scope: &str, now: Millis) -> f64 {
        if self.written_at.is_none_or(|at| now - at > STALE_MS) {
            return 0.0;
        }
        self.scopes.get(scope).map_or(0.0, |s| s.usable_share)
    }

    /// No scope to exchange rows for.
    pub fn is_empty(&self) -> bool {
        self.scopes.is_empty()
    }

    /// Tenants with a `tenant:` or `rate:` scope tracked (each once, sorted).
    pub fn tenants(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .scopes
            .keys()
            .filter_map(|k| match Scope::parse(k) {
                Some(Scope::Tenant(t) | Scope::Rate(t)) => Some(t),
                _ => None,
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// Is `scope` tracked (reported, or still holding units)?
    pub fn has(&self, scope: &str) -> bool {
        self.scopes.contains_key(scope)
    }

    /// Every scope's usable cap (see [`Quotas::usable`]).
    pub fn all_usable(&self, now: Millis) -> Vec<(String, u32)> {
        self.scopes.keys().map(|k| (k.clone(), self.usable(k, now))).collect()
    }

    /// After reading the pool's rows at `now`: recomputes every scope's cap and usable
    /// cap, and returns this worker's rows to write.
    pub fn plan(&mut self, rows: &[Row], me: &str, now: Millis) -> Vec<Row> {
        let epoch = now.div_euclid(ROTATION_MS);
        let mut by_scope: HashMap<&str, Vec<&Row>> = HashMap::new();
        for r in rows.iter().filter(|r| r.worker != me) {
            by_scope.entry(r.scope.as_str()).or_default().push(r);
        }
        let mut out = Vec::new();
        let mut changed = false;
        for (name, s) in &mut self.scopes {
            let others = by_scope.get(name.as_str()).map(Vec::as_slice).unwrap_or(&[]);
            let mut wants: Vec<(&str, u32)> = others.iter().map(|r| (r.worker.as_str(), r.want)).collect();
            wants.push((me, s.want));
            let allotment = allot(s.limit, &wants, epoch).get(me).copied().unwrap_or(0);
            let others_held: u32 = others.iter().map(|r| r.held).fold(0, u32::saturating_add);
            s.cap = allotment.min(s.limit.saturating_sub(others_held));
            let usable = s.cap.min(s.announced);
            changed |= usable != s.usable;
            s.usable = usable;
            let other_wants: Vec<u32> = others.iter().map(|r| r.want).collect();
            s.share = share(s.want, &other_wants);
            let usable_share = s.share.min(s.announced_share);
            changed |= usable_share != s.usable_share;
            s.usable_share = usable_share;
            let held = s.cap.max(s.applied).max(s.running);
            out.push(Row { scope: name.clone(), worker: me.to_string(), want: s.want, held });
        }
        if changed {
            self.version += 1;
        }
        out
    }

    /// The rows of [`Quotas::plan`] were written at `at`: their caps are announced.
    /// Scopes without work, nothing held and a zero row written are forgotten.
    pub fn written(&mut self, rows: &[Row], at: Millis) {
        self.written_at = Some(at);
        for r in rows {
            if let Some(s) = self.scopes.get_mut(&r.scope) {
                s.announced = s.cap;
                s.announced_share = s.share;
            }
        }
        let idle: Vec<String> = rows
            .iter()
            .filter(|r| r.want == 0 && r.held == 0)
            .filter(|r| self.scopes.get(&r.scope).is_some_and(|s| s.want == 0 && s.running == 0 && s.applied == 0))
            .map(|r| r.scope.clone())
            .collect();
        for k in idle {
            self.scopes.remove(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn allot_deals_round_robin_up_to_want() {
        let a = allot(5, &[("a", 10), ("b", 1), ("c", 0)], 0);
        assert_eq!(a["b"], 1);
        assert_eq!(a["a"], 4);
        assert_eq!(a.get("c"), None, "no want, no units");
        let a = allot(3, &[("a", 1), ("b", 1)], 0);
        assert_eq!((a["a"], a["b"]), (1, 1), "no more than wanted");
    }

    #[test]
    fn with_fewer_units_than_workers_the_turn_rotates() {
        let wants = [("w1", 5), ("w2", 5), ("w3", 5)];
        let mut winners = std::collections::HashSet::new();
        for epoch in 0..50 {
            let a = allot(1, &wants, epoch);
            let w: Vec<_> = a.iter().filter(|(_, n)| **n == 1).map(|(k, _)| k.clone()).collect();
            assert_eq!(w.len(), 1);
            winners.extend(w);
        }
        assert_eq!(winners.len(), 3, "every worker gets its turn");
    }

    /// A worker of the fleet simulation: its quotas, what it runs, and its row in the table.
    struct Sim {
        name: String,
        q: Quotas,
        running: u32,
        want: u32,
    }

    /// Steps a fleet of workers through passes in an arbitrary interleaving (reads and
    /// writes of different workers interleave; each worker's pass is read, then write)
    /// and checks that the jobs running fleet-wide never exceed the limit.
    fn run_fleet(limit: u32, steps: &[(usize, u8, u32)]) -> u32 {
        let mut table: HashMap<(String, String), Row> = HashMap::new();
        let mut ws: Vec<Sim> =
            (0..3).map(|i| Sim { name: format!("w{i}"), q: Quotas::default(), running: 0, want: 0 }).collect();
        let mut planned: Vec<Option<Vec<Row>>> = vec![None, None, None];
        let mut peak = 0;
        for (i, &(w, action, n)) in steps.iter().enumerate() {
            let now = i as Millis * 100;
            let w = w % ws.len();
            let s = &mut ws[w];
            match action % 4 {
                // The pool loop: new work arrives, then starts what the cap allows.
                0 => {
                    s.want += n;
                    let cap = s.q.usable("k", now);
                    s.q.applied("k", cap);
                    while s.running < cap && s.running < s.want {
                        s.running += 1;
                    }
                    s.q.report("k", limit, s.want, s.running);
                }
                // A job finishes.
                1 => {
                    if s.running > 0 {
                        s.running -= 1;
                        s.want -= 1;
                    }
                    s.q.report("k", limit, s.want, s.running);
                }
                // The quota pass: read.
                2 => {
                    let rows: Vec<Row> = table.values().cloned().collect();
                    planned[w] = Some(s.q.plan(&rows, &s.name.clone(), now));
                }
                // The quota pass: write what the last read planned.
                _ => {
                    if let Some(rows) = planned[w].take() {
                        for r in &rows {
                            table.insert((r.scope.clone(), r.worker.clone()), r.clone());
                        }
                        s.q.written(&rows, now);
                    }
                }
            }
            let total: u32 = ws.iter().map(|s| s.running).sum();
            peak = peak.max(total);
            assert!(total <= limit, "step {i}: {total} running over the limit {limit}");
        }
        peak
    }

    #[test]
    fn a_fleet_in_lockstep_uses_the_whole_limit() {
        let mut steps = Vec::new();
        for _ in 0..10 {
            for w in 0..3 {
                steps.extend([(w, 0, 4), (w, 2, 0), (w, 3, 0)]);
            }
        }
        assert_eq!(run_fleet(4, &steps), 4);
    }

    #[test]
    fn a_stale_worker_starts_nothing() {
        let mut q = Quotas::default();
        q.report("k", 3, 5, 0);
        let rows = q.plan(&[], "me", 0);
        q.written(&rows, 0);
        q.plan(&[], "me", 100);
        assert_eq!(q.usable("k", 200), 3);
        assert_eq!(q.usable("k", STALE_MS + 1), 0);
    }

    #[test]
    fn an_increase_waits_for_its_announcement() {
        let mut q = Quotas::default();
        q.report("k", 2, 2, 0);
        let rows = q.plan(&[], "me", 0);
        assert_eq!(q.usable("k", 0), 0, "not announced yet");
        assert_eq!(rows[0].held, 2, "the planned cap is held");
        q.written(&rows, 0);
        q.plan(&[], "me", 10);
        assert_eq!(q.usable("k", 10), 2);
        // Another worker holds one unit now: the cap drops at once.
        let other = Row { scope: "k".into(), worker: "o".into(), want: 1, held: 1 };
        q.plan(std::slice::from_ref(&other), "me", 20);
        assert_eq!(q.usable("k", 20), 1);
    }

    #[test]
    fn units_still_running_stay_held() {
        let mut q = Quotas::default();
        q.report("k", 2, 2, 0);
        let rows = q.plan(&[], "me", 0);
        q.written(&rows, 0);
        q.plan(&[], "me", 1);
        q.applied("k", 2);
        q.report("k", 2, 2, 2);
        let other = Row { scope: "k".into(), worker: "o".into(), want: 5, held: 0 };
        let rows = q.plan(std::slice::from_ref(&other), "me", 2);
        assert!(q.usable("k", 2) <= 1, "the other worker gets a share");
        assert_eq!(rows[0].held, 2, "two jobs still run here");
    }

    #[test]
    fn idle_scopes_are_forgotten_after_a_zero_row() {
        let mut q = Quotas::default();
        q.report("k", 2, 0, 0);
        let rows = q.plan(&[], "me", 0);
        assert_eq!(rows[0], Row { scope: "k".into(), worker: "me".into(), want: 0, held: 0 });
        q.written(&rows, 0);
        assert!(q.plan(&[], "me", 1).is_empty());
    }

    #[test]
    fn scope_names_round_trip_and_unknown_kinds_are_none() {
        for scope in [Scope::Tenant("a".into()), Scope::Rate("b:c".into()), Scope::Flow("embed/u1".into())] {
            assert_eq!(Scope::parse(&scope.name()), Some(scope));
        }
        assert_eq!(Scope::Flow("vip".into()).name(), "flow:vip");
        assert_eq!(Scope::parse("pool:short"), None);
        assert_eq!(Scope::parse("flow"), None);
    }

    #[test]
    fn a_rate_is_shared_by_want_and_a_rising_share_waits_for_its_announcement() {
        assert_eq!(share(0, &[3]), 0.0);
        assert_eq!(share(1, &[]), 1.0);
        assert_eq!(share(1, &[1, 2]), 0.25);
        let mut q = Quotas::default();
        let k = Scope::Rate("t".into()).name();
        q.report(&k, 0, 3, 0);
        let other = Row { scope: k.clone(), worker: "o".into(), want: 1, held: 0 };
        let rows = q.plan(std::slice::from_ref(&other), "me", 0);
        assert_eq!(q.usable_share(&k, 0), 0.0, "not announced yet");
        q.written(&rows, 0);
        q.plan(std::slice::from_ref(&other), "me", 10);
        assert_eq!(q.usable_share(&k, 10), 0.75);
        // The other worker's demand grows: the share drops at once.
        let other = Row { want: 9, ..other };
        q.plan(std::slice::from_ref(&other), "me", 20);
        assert_eq!(q.usable_share(&k, 20), 0.25);
        assert_eq!(q.usable_share(&k, STALE_MS + 1), 0.0, "stale: nothing");
    }

    proptest! {
        /// Shares computed from one table state never add up to more than the rate.
        #[test]
        fn prop_shares_of_one_view_sum_to_at_most_one(wants in prop::collection::vec(0u32..50, 1..8)) {
            let total: f64 = (0..wants.len())
                .map(|i| {
                    let others: Vec<u32> = wants.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, w)| *w).collect();
                    share(wants[i], &others)
                })
                .sum();
            prop_assert!(total <= 1.0 + 1e-9);
        }

        #[test]
        fn prop_allot_never_exceeds_limit_or_wants(
            limit in 0u32..50,
            wants in prop::collection::vec(0u32..20, 0..6),
            epoch in any::<i64>(),
        ) {
            let named: Vec<(String, u32)> = wants.iter().enumerate().map(|(i, w)| (format!("w{i}"), *w)).collect();
            let refs: Vec<(&str, u32)> = named.iter().map(|(n, w)| (n.as_str(), *w)).collect();
            let a = allot(limit, &refs, epoch);
            let total: u32 = a.values().sum();
            prop_assert!(total <= limit);
            prop_assert_eq!(total, limit.min(wants.iter().sum()));
            for (n, w) in &refs {
                prop_assert!(a.get(*n).copied().unwrap_or(0) <= *w);
            }
        }

        #[test]
        fn prop_interleaved_workers_never_exceed_the_limit(
            limit in 1u32..6,
            steps in prop::collection::vec((0usize..3, any::<u8>(), 0u32..4), 1..300),
        ) {
            run_fleet(limit, &steps);
        }
    }
}
