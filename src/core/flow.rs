//! Flow-control keys (`flow_key` on a job), the pure parts: the rules for the value a
//! job may carry, which limit applies to it, and the gate that holds a key's jobs back
//! while the key is at its limit.
//!
//! A key's `parallelism` is configured per key (`[flow.keys."<key>"]`) or per job type
//! (`[job_types.<t>] flow = { parallelism = N }`: every key of that type's jobs gets N
//! of its own). It holds across the pool's workers: the scope's units are shared out by
//! `core::quota`. On a worker, the [`Gate`] lets at most its part of a key's jobs into
//! the fair scheduler (queued there or running); the rest wait in the gate, in arrival
//! order, outside the scheduler: they hold no slot and block no one else's jobs.

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
    if key.len() > MAX_KEY_LEN {
        return Err(format!("flow_key is {} bytes long; at most {MAX_KEY_LEN} are accepted", key.len()));
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return Err(format!("flow_key contains the control character {c:?}; use printable text"));
    }
    Ok(())
}

/// A flow key's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowLimit {
    /// Most jobs of the key running at once across the pool's workers (at least 1).
    pub parallelism: u32,
}

impl FlowLimit {
    pub fn validate(&self) -> Result<(), String> {
        if self.parallelism == 0 {
            return Err("parallelism must be at least 1 (to stop a flow, suspend its tenant)".into());
        }
        Ok(())
    }
}

/// The quota scope and parallelism limiting a job with `key` of `job_type`: the key's
/// own limit if configured, else its job type's per-key limit, else none.
pub fn scope_of(
    keys: &BTreeMap<String, FlowLimit>,
    job_type_limit: Option<&FlowLimit>,
    key: &str,
    job_type: &str,
) -> Option<(String, u32)> {
    if let Some(l) = keys.get(key) {
        return Some((crate::core::quota::flow_scope(key), l.parallelism));
    }
    job_type_limit.map(|l| (crate::core::quota::flow_scope(&format!("{job_type}/{key}")), l.parallelism))
}

#[derive(Debug)]
struct Flow<J> {
    limit: u32,
    cap: u32,
    /// Let through and not yet released (queued in the scheduler or running).
    admitted: u32,
    parked: VecDeque<J>,
}

/// Holds jobs of flow scopes at their cap back, in arrival order per scope.
#[derive(Debug)]
pub struct Gate<J> {
    flows: HashMap<String, Flow<J>>,
    parked: usize,
}

impl<J> Default for Gate<J> {
    fn default() -> Self {
        Gate { flows: HashMap::new(), parked: 0 }
    }
}

impl<J> Gate<J> {
    /// A job of `scope`: `Some(job)` to go on now (it counts against the cap until
    /// [`Gate::release`]), `None` if it waits in the gate.
    pub fn offer(&mut self, scope: &str, limit: u32, job: J) -> Option<J> {
        let f =
            self.flows.entry(scope.to_string()).or_insert(Flow { limit, cap: 0, admitted: 0, parked: VecDeque::new() });
        f.limit = limit;
        if f.parked.is_empty() && f.admitted < f.cap {
            f.admitted += 1;
            return Some(job);
        }
        f.parked.push_back(job);
        self.parked += 1;
        None
    }

    /// A job let through ended (or left the worker).
    pub fn release(&mut self, scope: &str) {
        if let Some(f) = self.flows.get_mut(scope) {
            f.admitted = f.admitted.saturating_sub(1);
        }
    }

    /// This worker's part of the scope's limit changed.
    pub fn set_cap(&mut self, scope: &str, cap: u32) {
        if let Some(f) = self.flows.get_mut(scope) {
            f.cap = cap;
        }
    }

    /// Parked jobs that may go on now (their scopes are under their caps).
    pub fn ready(&mut self) -> Vec<J> {
        let mut out = Vec::new();
        for f in self.flows.values_mut() {
            while f.admitted < f.cap {
                let Some(j) = f.parked.pop_front() else { break };
                f.admitted += 1;
                out.push(j);
            }
        }
        self.parked -= out.len();
        out
    }

    /// Removes parked jobs matching `f` (e.g. of revoked partitions).
    pub fn drain_where(&mut self, f: &mut dyn FnMut(&J) -> bool) -> Vec<J> {
        let mut out = Vec::new();
        for flow in self.flows.values_mut() {
            let (gone, keep): (VecDeque<J>, VecDeque<J>) = flow.parked.drain(..).partition(|j| f(j));
            flow.parked = keep;
            out.extend(gone);
        }
        self.parked -= out.len();
        out
    }

    /// Jobs waiting in the gate.
    pub fn parked(&self) -> usize {
        self.parked
    }

    /// Per scope: (scope, limit, jobs here (admitted + parked), admitted). Scopes with
    /// nothing left are dropped after being listed once with zeros.
    pub fn demand(&mut self) -> Vec<(String, u32, u32, u32)> {
        let out = self
            .flows
            .iter()
            .map(|(k, f)| (k.clone(), f.limit, f.admitted + f.parked.len() as u32, f.admitted))
            .collect();
        self.flows.retain(|_, f| f.admitted > 0 || !f.parked.is_empty() || f.cap > 0);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_holds_jobs_over_the_cap_in_order_and_lets_them_on_as_room_appears() {
        let mut g: Gate<u32> = Gate::default();
        assert_eq!(g.offer("k", 2, 1), None, "no cap yet: waits for its allotment");
        g.set_cap("k", 1);
        assert_eq!(g.ready(), vec![1]);
        assert_eq!(g.offer("k", 2, 2), None);
        assert_eq!(g.offer("k", 2, 3), None);
        assert_eq!(g.parked(), 2);
        assert!(g.ready().is_empty(), "at its cap");
        g.release("k");
        assert_eq!(g.ready(), vec![2], "oldest first");
        g.set_cap("k", 2);
        assert_eq!(g.ready(), vec![3]);
        assert_eq!(g.offer("other", 1, 9), None);
        g.set_cap("other", 1);
        assert_eq!(g.ready(), vec![9], "another key is not held by k");
        assert_eq!(g.demand().into_iter().find(|d| d.0 == "k"), Some(("k".to_string(), 2, 2, 2)));
        assert_eq!(g.offer("k", 2, 4), None);
        assert_eq!(g.drain_where(&mut |j| *j == 4), vec![4]);
        assert_eq!(g.parked(), 0);
    }

    #[test]
    fn limits_per_key_win_over_the_job_types() {
        let keys = BTreeMap::from([("vip".to_string(), FlowLimit { parallelism: 5 })]);
        let jt = FlowLimit { parallelism: 1 };
        assert_eq!(scope_of(&keys, Some(&jt), "vip", "embed"), Some(("flow:vip".into(), 5)));
        assert_eq!(scope_of(&keys, Some(&jt), "u1", "embed"), Some(("flow:embed/u1".into(), 1)));
        assert_eq!(scope_of(&keys, None, "u1", "embed"), None);
        assert!(FlowLimit { parallelism: 0 }.validate().is_err());
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
}
