//! Flow-control keys (`flow_key` on a job), the pure parts: the rules for the value a
//! job may carry, which limit applies to it, and the gate that holds a key's jobs back
//! while the key is at its limit.
//!
//! A key's limits are configured per key (`[flow.keys."<key>"]`) or per job type
//! (`[job_types.<t>] flow = { parallelism = N }`: every key of that type's jobs gets its
//! own): `parallelism` (jobs of the key at once) and/or `rate` jobs per `period`
//! (QStash-style, e.g. `rate = 10, period = "1m"`). Both hold across the pool's workers:
//! the scope's units are shared out by `core::quota` (allotments for `parallelism`, a
//! share of demand for `rate`). On a worker, the [`Gate`] lets a key's job into the fair
//! scheduler (queued there or running) only while the key is under its part of the
//! parallelism and its part of the rate has a token; the rest wait in the gate, outside
//! the scheduler: they hold no slot and block no one else's jobs.
//!
//! **Tenants.** A key belongs to the tenant whose jobs carry it: tenant A's
//! `"vectorizer"` and tenant B's are two flows with a limit each (scope
//! `flow:<tenant>/<key>`), so A parking jobs on its key never delays B's. An operator
//! declares a key `shared = true` where one limit must hold for every tenant (a downstream
//! API they all call): then its scope is deployment-wide and its parked jobs go on round
//! robin across tenants, in arrival order within each tenant.
//!
//! **Rate.** A key's rate is paced evenly, without a burst: one job every
//! `period / rate` (GCRA with a burst of one, the tenants' limiter of
//! `core::scheduler::clock`), so on one worker any `period`-long window sees at most
//! `rate` jobs let through. Across the fleet each worker runs at `rate x share` (its
//! demand over the pool's, from the quota rows); its limiter keeps its debt when the
//! share changes. **Worst case** in any window of one `period`: `rate + workers` (each
//! worker's pacing may round up by one job), plus the demand that moved between workers
//! within one exchange pass (half a second's worth of the rate). The rate counts jobs let
//! into the scheduler: a job let through waits there for a free slot, so starts may
//! bunch by as much as the scheduler's queueing delay.

use crate::core::invalid::Invalid;
use crate::core::quota::Scope;
use crate::core::retry::DurationMs;
use crate::core::scheduler::{Limiter, PassedClock, RateLimit};
use crate::model::Millis;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Longest flow key accepted, in bytes: it is a row key in the store and a label in
/// logs, not a payload.
pub const MAX_KEY_LEN: usize = 128;

/// A flow key is 1 to [`MAX_KEY_LEN`] bytes of text without control characters.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("flow_key is empty; leave it out (null) for no flow control, or name the flow".into());
    }
    check_named_key("flow_key", key)
}

/// The rules of a key field (`flow_key`, `user_key`): 1 to [`MAX_KEY_LEN`] bytes of text
/// without control characters; `field` names it in the error.
pub fn check_named_key(field: &str, key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err(format!("{field} is empty; leave it out (null) or give a value"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(format!("{field} is {} bytes long; at most {MAX_KEY_LEN} are accepted", key.len()));
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return Err(format!("{field} contains the control character {c:?}; use printable text"));
    }
    Ok(())
}

/// The period of a `rate` without one.
pub const DEFAULT_PERIOD: DurationMs = DurationMs::secs(1);

/// A flow key's limits (at least one of `parallelism` and `rate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowLimit {
    /// Most jobs of the key running at once across the pool's workers (at least 1).
    #[serde(default)]
    pub parallelism: Option<u32>,
    /// Most jobs of the key started per `period` across the pool's workers (at least 1).
    #[serde(default)]
    pub rate: Option<u32>,
    /// The period of `rate` (default 1 s), e.g. `"1m"`.
    #[serde(default)]
    pub period: Option<DurationMs>,
    /// One limit for every tenant's jobs with the key, shared round robin across
    /// tenants (default: each tenant has the limit for its own jobs).
    #[serde(default)]
    pub shared: bool,
}

impl FlowLimit {
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.parallelism.is_none() && self.rate.is_none() {
            return Invalid::err(
                "parallelism",
                "and rate are both unset: no limit; give parallelism = N (jobs at once) and/or rate = N (jobs per \
                 period, e.g. rate = 10, period = \"1m\")",
            );
        }
        if self.parallelism == Some(0) {
            return Invalid::err("parallelism", "must be at least 1 (to stop a flow, suspend its tenant)");
        }
        if self.rate == Some(0) {
            return Invalid::err("rate", "must be at least 1 job per period (to stop a flow, suspend its tenant)");
        }
        match self.period {
            Some(_) if self.rate.is_none() => {
                Invalid::err("period", "applies to rate; add rate = N (jobs per period) or remove period")
            }
            Some(p) if p.as_millis() <= 0 => Invalid::err("period", "must be longer than 0, e.g. \"1s\" or \"1m\""),
            _ => Ok(()),
        }
    }

    /// The key's rate as a limiter's spec: `rate / period` per second, no burst.
    fn pace(&self) -> Option<RateLimit> {
        let period = self.period.unwrap_or(DEFAULT_PERIOD).as_millis().max(1) as f64 / 1000.0;
        self.rate.map(|r| RateLimit { per_second: f64::from(r) / period, burst: 1 })
    }
}

/// A job's flow: its key, job type and tenant.
#[derive(Debug, Clone, Copy)]
pub struct FlowOf<'a> {
    pub key: &'a str,
    pub job_type: &'a str,
    pub tenant: &'a str,
}

/// The quota scope and limit of a job's flow: the key's own limit if configured, else its
/// job type's per-key limit, else none; the tenant's own scope unless the limit is
/// `shared`.
pub fn scope_of(
    keys: &BTreeMap<String, FlowLimit>,
    job_type_limit: Option<&FlowLimit>,
    job: FlowOf<'_>,
) -> Option<(String, FlowLimit)> {
    let (subject, limit) = match keys.get(job.key) {
        Some(l) => (job.key.to_string(), *l),
        None => (format!("{}/{}", job.job_type, job.key), *job_type_limit?),
    };
    let subject = if limit.shared { subject } else { format!("{}/{subject}", job.tenant) };
    Some((Scope::Flow(subject).name(), limit))
}

/// Parked jobs of one flow: a queue per tenant, served round robin.
#[derive(Debug)]
struct Parked<J> {
    queues: HashMap<String, VecDeque<J>>,
    /// Tenants with parked jobs, in the order they are served next.
    turn: VecDeque<String>,
    len: usize,
}

impl<J> Default for Parked<J> {
    fn default() -> Self {
        Parked { queues: HashMap::new(), turn: VecDeque::new(), len: 0 }
    }
}

impl<J> Parked<J> {
    fn push(&mut self, tenant: &str, job: J) {
        let q = self.queues.entry(tenant.to_string()).or_default();
        if q.is_empty() {
            self.turn.push_back(tenant.to_string());
        }
        q.push_back(job);
        self.len += 1;
    }

    /// The oldest job of the tenant whose turn it is; the tenant goes to the back.
    fn pop(&mut self) -> Option<J> {
        let tenant = self.turn.pop_front()?;
        let q = self.queues.get_mut(&tenant)?;
        let job = q.pop_front();
        if q.is_empty() {
            self.queues.remove(&tenant);
        } else {
            self.turn.push_back(tenant);
        }
        self.len -= usize::from(job.is_some());
        job
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn drain_where(&mut self, f: &mut dyn FnMut(&J) -> bool) -> Vec<J> {
        let mut out = Vec::new();
        for q in self.queues.values_mut() {
            let (gone, keep): (VecDeque<J>, VecDeque<J>) = q.drain(..).partition(|j| f(j));
            *q = keep;
            out.extend(gone);
        }
        self.queues.retain(|_, q| !q.is_empty());
        let queues = &self.queues;
        self.turn.retain(|t| queues.contains_key(t));
        self.len -= out.len();
        out
    }
}

#[derive(Debug)]
struct Flow<J> {
    limit: FlowLimit,
    /// This worker's part of `parallelism` (unused without one).
    cap: u32,
    /// This worker's part of `rate` (scaled by its share), if the key has a rate.
    pace: Option<Limiter>,
    /// Let through and not yet released (queued in the scheduler or running).
    admitted: u32,
    parked: Parked<J>,
}

impl<J> Flow<J> {
    fn new(limit: FlowLimit, clock: &PassedClock) -> Self {
        let mut pace = limit.pace().map(|r| Limiter::new(r, clock));
        if let Some(l) = &mut pace {
            // No share before the exchange (or the pool loop) gives one.
            l.set_scale(0.0);
        }
        Flow { limit, cap: 0, pace, admitted: 0, parked: Parked::default() }
    }

    fn under_cap(&self) -> bool {
        self.limit.parallelism.is_none() || self.admitted < self.cap
    }

    /// Takes a rate token if the key has a rate: `Err(when one is due)` if none is left.
    fn take(&mut self) -> Result<(), Millis> {
        self.pace.as_mut().map_or(Ok(()), Limiter::take)
    }

    /// Lets parked jobs through while the cap and the rate allow; the time the next
    /// token is due if a parked job waits for one.
    fn release_ready(&mut self, out: &mut Vec<J>) -> Option<Millis> {
        while !self.parked.is_empty() && self.under_cap() {
            if let Err(due) = self.take() {
                return Some(due);
            }
            self.admitted += 1;
            out.extend(self.parked.pop());
        }
        None
    }

    /// Anything left to remember: jobs, a cap, or a rate's debt still being paid off.
    fn live(&self) -> bool {
        self.admitted > 0 || !self.parked.is_empty() || self.cap > 0 || self.pace.as_ref().is_some_and(|l| !l.settled())
    }
}

/// Holds jobs of flow scopes at their cap or out of rate tokens back: per scope round
/// robin across tenants, in arrival order per tenant. Every call passes `now` (epoch ms).
#[derive(Debug)]
pub struct Gate<J> {
    flows: HashMap<String, Flow<J>>,
    parked: usize,
    clock: PassedClock,
    /// When the earliest rate token a parked job waits for is due.
    due: Option<Millis>,
}

impl<J> Default for Gate<J> {
    fn default() -> Self {
        Gate { flows: HashMap::new(), parked: 0, clock: PassedClock::default(), due: None }
    }
}

impl<J> Gate<J> {
    /// A job of `tenant` in `scope`: `Some(job)` to go on now (it counts against the cap
    /// until [`Gate::release`], and took a rate token), `None` if it waits in the gate.
    pub fn offer(&mut self, scope: &str, limit: FlowLimit, tenant: &str, job: J, now: Millis) -> Option<J> {
        self.clock.set(now);
        let clock = &self.clock;
        let f = self.flows.entry(scope.to_string()).or_insert_with(|| Flow::new(limit, clock));
        if f.parked.is_empty() && f.under_cap() {
            match f.take() {
                Ok(()) => {
                    f.admitted += 1;
                    return Some(job);
                }
                Err(due) => self.due = Some(self.due.map_or(due, |d| d.min(due))),
            }
        }
        f.parked.push(tenant, job);
        self.parked += 1;
        None
    }

    /// A job let through ended (or left the worker).
    pub fn release(&mut self, scope: &str) {
        if let Some(f) = self.flows.get_mut(scope) {
            f.admitted = f.admitted.saturating_sub(1);
        }
    }

    /// This worker's part of the scope's parallelism changed.
    pub fn set_cap(&mut self, scope: &str, cap: u32) {
        if let Some(f) = self.flows.get_mut(scope) {
            f.cap = cap;
        }
    }

    /// This worker's part (0..=1) of the scope's rate changed; the tokens taken stay taken.
    pub fn set_share(&mut self, scope: &str, share: f64, now: Millis) {
        self.clock.set(now);
        if let Some(l) = self.flows.get_mut(scope).and_then(|f| f.pace.as_mut()) {
            if l.scale() != share {
                l.set_scale(share);
            }
        }
    }

    /// When a parked job's rate token is due (the pool loop wakes then).
    pub fn next_due(&self) -> Option<Millis> {
        self.due
    }

    /// Parked jobs that may go on now (their scopes are under their caps and have rate
    /// tokens).
    pub fn ready(&mut self, now: Millis) -> Vec<J> {
        self.clock.set(now);
        let mut out = Vec::new();
        let mut due: Option<Millis> = None;
        for f in self.flows.values_mut() {
            if let Some(d) = f.release_ready(&mut out) {
                due = Some(due.map_or(d, |x| x.min(d)));
            }
        }
        self.due = due;
        self.parked -= out.len();
        out
    }

    /// Removes parked jobs matching `f` (e.g. of revoked partitions).
    pub fn drain_where(&mut self, f: &mut dyn FnMut(&J) -> bool) -> Vec<J> {
        let mut out = Vec::new();
        for flow in self.flows.values_mut() {
            out.extend(flow.parked.drain_where(f));
        }
        self.parked -= out.len();
        out
    }

    /// Jobs waiting in the gate.
    pub fn parked(&self) -> usize {
        self.parked
    }

    /// Per scope: (scope, limit, jobs here (admitted + parked), admitted). Scopes with
    /// nothing left (no jobs, no cap, no rate debt) are dropped after being listed once
    /// with zeros.
    pub fn demand(&mut self, now: Millis) -> Vec<(String, FlowLimit, u32, u32)> {
        self.clock.set(now);
        let out = self
            .flows
            .iter()
            .map(|(k, f)| (k.clone(), f.limit, f.admitted + f.parked.len as u32, f.admitted))
            .collect();
        self.flows.retain(|_, f| f.live());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn par(n: u32) -> FlowLimit {
        FlowLimit { parallelism: Some(n), ..FlowLimit::default() }
    }

    fn rate(n: u32, period: &str) -> FlowLimit {
        FlowLimit { rate: Some(n), period: Some(period.parse().unwrap()), ..FlowLimit::default() }
    }

    #[test]
    fn gate_holds_jobs_over_the_cap_in_order_and_lets_them_on_as_room_appears() {
        let mut g: Gate<u32> = Gate::default();
        assert_eq!(g.offer("k", par(2), "acme", 1, 0), None, "no cap yet: waits for its allotment");
        g.set_cap("k", 1);
        assert_eq!(g.ready(0), vec![1]);
        assert_eq!(g.offer("k", par(2), "acme", 2, 0), None);
        assert_eq!(g.offer("k", par(2), "acme", 3, 0), None);
        assert_eq!(g.parked(), 2);
        assert!(g.ready(0).is_empty(), "at its cap");
        assert_eq!(g.next_due(), None, "waiting for a unit, not a token");
        g.release("k");
        assert_eq!(g.ready(0), vec![2], "oldest first");
        g.set_cap("k", 2);
        assert_eq!(g.ready(0), vec![3]);
        assert_eq!(g.offer("other", par(1), "acme", 9, 0), None);
        g.set_cap("other", 1);
        assert_eq!(g.ready(0), vec![9], "another key is not held by k");
        assert_eq!(g.demand(0).into_iter().find(|d| d.0 == "k"), Some(("k".to_string(), par(2), 2, 2)));
        assert_eq!(g.offer("k", par(2), "acme", 4, 0), None);
        assert_eq!(g.drain_where(&mut |j| *j == 4), vec![4]);
        assert_eq!(g.parked(), 0);
    }

    #[test]
    fn a_rate_paces_a_key_evenly_and_says_when_the_next_token_is_due() {
        let mut g: Gate<u32> = Gate::default();
        let t0 = 1_000_000;
        let l = rate(10, "1m");
        assert_eq!(g.offer("k", l, "acme", 1, t0), None, "no share yet");
        g.set_share("k", 1.0, t0);
        assert_eq!(g.ready(t0), vec![1]);
        assert_eq!(g.offer("k", l, "acme", 2, t0), None, "one every 6 s, no burst");
        assert_eq!(g.next_due(), Some(t0 + 6_000));
        assert!(g.ready(t0 + 5_999).is_empty());
        assert_eq!(g.ready(t0 + 6_000), vec![2]);
        assert_eq!(g.next_due(), None);
        // Without a parallelism the key has no cap: the jobs admitted do not hold it.
        assert_eq!(g.offer("k", l, "acme", 3, t0 + 12_000), Some(3));
        // Half the rate here: one every 12 s.
        g.set_share("k", 0.5, t0 + 12_000);
        assert_eq!(g.offer("k", l, "acme", 4, t0 + 12_000), None);
        assert_eq!(g.next_due(), Some(t0 + 24_000));
        // Another key is not held by k's rate.
        assert_eq!(g.offer("o", par(5), "acme", 9, t0 + 12_000), None);
        g.set_cap("o", 5);
        assert_eq!(g.ready(t0 + 12_000), vec![9]);
        // The debt keeps the flow listed after its jobs are gone.
        g.release("k");
        g.release("k");
        g.release("k");
        assert_eq!(g.ready(t0 + 24_000), vec![4]);
        g.release("k");
        g.demand(t0 + 24_000);
        assert!(g.demand(t0 + 24_001).iter().any(|d| d.0 == "k"), "debt still being paid off");
    }

    #[test]
    fn parallelism_and_rate_both_hold() {
        let mut g: Gate<u32> = Gate::default();
        let l = FlowLimit { parallelism: Some(1), rate: Some(2), ..FlowLimit::default() };
        g.set_share("k", 1.0, 0);
        assert_eq!(g.offer("k", l, "acme", 1, 0), None, "flow created by the offer: no share yet");
        g.set_share("k", 1.0, 0);
        g.set_cap("k", 1);
        assert_eq!(g.ready(0), vec![1]);
        assert_eq!(g.offer("k", l, "acme", 2, 1_000), None, "token there, but at its parallelism");
        g.release("k");
        assert_eq!(g.ready(1_000), vec![2]);
        g.release("k");
        assert_eq!(g.offer("k", l, "acme", 3, 1_100), None, "room, but no token before 1.5 s");
        assert_eq!(g.ready(1_500), vec![3]);
    }

    fn of<'a>(key: &'a str, tenant: &'a str) -> FlowOf<'a> {
        FlowOf { key, job_type: "embed", tenant }
    }

    #[test]
    fn limits_per_key_win_over_the_job_types_and_keys_are_the_tenants_unless_shared() {
        let shared = FlowLimit { shared: true, ..par(3) };
        let keys = BTreeMap::from([("vip".to_string(), par(5)), ("openai".to_string(), shared)]);
        let jt = par(1);
        assert_eq!(scope_of(&keys, Some(&jt), of("vip", "acme")), Some(("flow:acme/vip".into(), par(5))));
        assert_eq!(scope_of(&keys, Some(&jt), of("vip", "globex")), Some(("flow:globex/vip".into(), par(5))));
        assert_eq!(scope_of(&keys, Some(&jt), of("u1", "acme")), Some(("flow:acme/embed/u1".into(), par(1))));
        assert_eq!(scope_of(&keys, None, of("u1", "acme")), None);
        assert_eq!(scope_of(&keys, None, of("openai", "acme")), Some(("flow:openai".into(), shared)));
        assert_eq!(scope_of(&keys, None, of("openai", "globex")), Some(("flow:openai".into(), shared)));
        let l: FlowLimit = toml::from_str("rate = 1\nshared = true").unwrap();
        assert!(l.shared);
    }

    /// Acme parks 40 jobs on its "vectorizer" (1 a second); globex's job on a key of the
    /// same name goes on at once, on its own limit (one scope per tenant: the same gate
    /// with one scope held it 40 s, behind all of acme's).
    #[test]
    fn one_tenants_parked_key_never_delays_anothers_key_of_the_same_name() {
        let keys = BTreeMap::from([("vectorizer".to_string(), rate(1, "1s"))]);
        let mut g: Gate<(String, u32)> = Gate::default();
        let t0 = 1_000_000;
        let offer = |g: &mut Gate<(String, u32)>, tenant: &str, n: u32, now: Millis| {
            let (scope, limit) = scope_of(&keys, None, of("vectorizer", tenant)).unwrap();
            g.set_share(&scope, 1.0, now);
            let out = g.offer(&scope, limit, tenant, (tenant.to_string(), n), now);
            g.set_share(&scope, 1.0, now);
            out.into_iter().chain(g.ready(now)).collect::<Vec<_>>()
        };
        let mut acme_through = 0;
        for n in 0..40 {
            acme_through += offer(&mut g, "acme", n, t0).len();
        }
        assert!(acme_through <= 1, "acme's key at 1/s: {acme_through}");
        let globex = offer(&mut g, "globex", 0, t0 + 10);
        assert_eq!(globex, vec![("globex".to_string(), 0)], "globex waits only for its own limit");
    }

    /// A shared key's parked jobs go on round robin across tenants, not in arrival
    /// order: globex's one job, parked behind 40 of acme's, is the second let through.
    #[test]
    fn a_shared_key_lets_tenants_on_in_turn() {
        let l = FlowLimit { shared: true, ..par(1) };
        let mut g: Gate<(&str, u32)> = Gate::default();
        for n in 0..40 {
            assert_eq!(g.offer("flow:api", l, "acme", ("acme", n), 0), None);
        }
        assert_eq!(g.offer("flow:api", l, "globex", ("globex", 0), 0), None);
        assert_eq!(g.offer("flow:api", l, "initech", ("initech", 0), 0), None);
        g.set_cap("flow:api", 1);
        let mut order = Vec::new();
        for _ in 0..5 {
            order.extend(g.ready(0));
            g.release("flow:api");
        }
        assert_eq!(order, vec![("acme", 0), ("globex", 0), ("initech", 0), ("acme", 1), ("acme", 2)]);
        assert_eq!(g.parked(), 37);
        assert_eq!(g.drain_where(&mut |j| j.1 % 2 == 0).len(), 18);
        assert_eq!(g.parked(), 19);
        assert_eq!(g.ready(0), vec![("acme", 3)]);
    }

    #[test]
    fn limits_are_validated_with_a_way_out() {
        assert!(par(0).validate().unwrap_err().to_string().contains("at least 1"));
        assert!(FlowLimit::default().validate().unwrap_err().problem.contains("parallelism = N"));
        assert!(rate(0, "1s").validate().unwrap_err().to_string().contains("`rate` must be at least 1"));
        assert!(rate(1, "0s").validate().unwrap_err().to_string().contains("longer than 0"));
        let period_alone = FlowLimit { parallelism: Some(1), period: Some(DEFAULT_PERIOD), ..FlowLimit::default() };
        assert!(period_alone.validate().unwrap_err().to_string().contains("add rate"));
        assert_eq!(rate(10, "1m").validate(), Ok(()));
        let l: FlowLimit = toml::from_str("rate = 10\nperiod = \"1m\"").unwrap();
        assert_eq!(l, rate(10, "1m"));
        assert!(toml::from_str::<FlowLimit>("rate = 10\nperiod = \"1 fortnight\"").is_err());
    }

    #[test]
    fn key_rules() {
        assert_eq!(check_key("vectorizer"), Ok(()));
        assert_eq!(check_key("user:ümlaut-42"), Ok(()));
        assert_eq!(check_key(&"k".repeat(MAX_KEY_LEN)), Ok(()));
        assert!(check_key("").unwrap_err().contains("empty"));
        assert!(check_key(&"k".repeat(MAX_KEY_LEN + 1)).unwrap_err().contains("129 bytes"));
        assert!(check_key("a\nb").unwrap_err().contains("control"));
    }

    /// The most of `times` (sorted) in any half-open window of `len` ms.
    fn busiest(times: &[Millis], len: Millis) -> usize {
        (0..times.len()).map(|i| times[i..].iter().take_while(|&&t| t - times[i] < len).count()).max().unwrap_or(0)
    }

    /// Gates (workers) that always have a key's jobs parked, asked at random times, each
    /// with a share of the rate from `wants`: the times their jobs were let through.
    fn run_gates(limit: FlowLimit, wants: &[u32], steps: &[(usize, u16)], reshare: Option<&[f64]>) -> Vec<Millis> {
        let mut gates: Vec<Gate<()>> = wants.iter().map(|_| Gate::default()).collect();
        let mut now: Millis = 1_000_000;
        let mut let_through = Vec::new();
        for (i, g) in gates.iter_mut().enumerate() {
            for _ in 0..1_000 {
                g.offer("k", limit, "acme", (), now);
            }
            let others: Vec<u32> = wants.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, w)| *w).collect();
            g.set_share("k", crate::core::quota::share(wants[i], &others), now);
        }
        for (n, &(w, dt)) in steps.iter().enumerate() {
            now += Millis::from(dt);
            let g = &mut gates[w % wants.len()];
            if let Some(shares) = reshare {
                g.set_share("k", shares[n % shares.len()], now);
            }
            let out = g.ready(now).len();
            let_through.extend(vec![now; out]);
        }
        let_through.sort_unstable();
        let_through
    }

    proptest! {
        /// Workers with the shares of one view let at most `rate + workers` jobs through
        /// in any window of one period (each worker's pacing rounds up by at most one).
        #[test]
        fn prop_a_fleet_keeps_the_rate_within_one_job_per_worker(
            r in 1u32..20,
            period_ms in 200i64..5_000,
            wants in prop::collection::vec(1u32..10, 1..4),
            steps in prop::collection::vec((0usize..4, 0u16..700), 1..400),
        ) {
            let limit = FlowLimit { rate: Some(r), period: Some(DurationMs::ms(period_ms)), ..FlowLimit::default() };
            let times = run_gates(limit, &wants, &steps, None);
            let most = busiest(&times, period_ms);
            prop_assert!(most <= r as usize + wants.len(), "{most} in a period, rate {r}, {} workers", wants.len());
        }

        /// One worker whose share keeps changing (never above 1) stays within `rate + 1`
        /// per period: rescaling keeps the debt, it never refills the bucket.
        #[test]
        fn prop_a_changing_share_refills_nothing(
            r in 1u32..20,
            period_ms in 200i64..5_000,
            shares in prop::collection::vec(0.0f64..=1.0, 1..10),
            steps in prop::collection::vec((0usize..1, 0u16..700), 1..400),
        ) {
            let limit = FlowLimit { rate: Some(r), period: Some(DurationMs::ms(period_ms)), ..FlowLimit::default() };
            let times = run_gates(limit, &[1], &steps, Some(&shares));
            let most = busiest(&times, period_ms);
            prop_assert!(most <= r as usize + 1, "{most} in a period, rate {r}");
        }
    }
}
