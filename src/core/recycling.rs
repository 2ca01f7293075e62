//! The recycling cap: how many of a tenant's children one pool may see killed or end
//! abnormally (a signal, a limit kill, a stuck kill) per window before that tenant's jobs
//! of the pool wait (wait reason `recycling_cap`) while every other tenant runs. A tenant
//! whose jobs keep blowing up then costs the pool at most `max` process restarts per
//! `window`, not a restart per job it submits.
//!
//! Pure: `now` is an argument; the worker feeds kills in and asks who is held.

use super::retry::DurationMs;
use crate::model::Millis;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};

/// `[pools.<p>] recycling = { max = 5, window = "1m" }`.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RecyclingConfig {
    /// Kills and abnormal exits of one tenant's children per window before its jobs wait.
    pub max: u32,
    pub window: DurationMs,
}

impl Default for RecyclingConfig {
    fn default() -> Self {
        RecyclingConfig { max: 10, window: DurationMs::mins(1) }
    }
}

impl RecyclingConfig {
    pub fn validate(&self) -> Result<(), crate::core::invalid::Invalid> {
        use crate::core::invalid::Invalid;
        if self.max == 0 {
            return Invalid::err("max", "= 0 would hold every tenant after no kill at all; use at least 1");
        }
        if self.window.0 <= 0 {
            return Invalid::err("window", "must be positive, e.g. \"1m\"");
        }
        Ok(())
    }
}

/// Kills per tenant inside the window (one pool on one worker).
#[derive(Debug, Clone, Default)]
pub struct Recycling {
    cfg: RecyclingConfig,
    kills: HashMap<String, VecDeque<Millis>>,
}

impl Recycling {
    pub fn new(cfg: RecyclingConfig) -> Self {
        Recycling { cfg, kills: HashMap::new() }
    }

    /// A child of `tenant` was killed or ended abnormally at `now`.
    pub fn record(&mut self, tenant: &str, now: Millis) {
        let q = self.kills.entry(tenant.to_string()).or_default();
        q.push_back(now);
        // Only the newest `max` matter for the decision: memory stays bounded per tenant.
        while q.len() > self.cfg.max as usize {
            q.pop_front();
        }
    }

    /// Until when `tenant` is held (its `max`-th newest kill plus the window), if it is.
    pub fn held_until(&self, tenant: &str, now: Millis) -> Option<Millis> {
        let q = self.kills.get(tenant)?;
        if q.len() < self.cfg.max as usize {
            return None;
        }
        let until = q.front()? + self.cfg.window.0;
        (until > now).then_some(until)
    }

    /// Every tenant held at `now`; forgets tenants whose kills all left the window.
    pub fn held(&mut self, now: Millis) -> Vec<(String, Millis)> {
        let window = self.cfg.window.0;
        self.kills.retain(|_, q| q.back().is_some_and(|&last| last + window > now));
        let mut out: Vec<(String, Millis)> =
            self.kills.keys().filter_map(|t| self.held_until(t, now).map(|u| (t.clone(), u))).collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cap(max: u32, window_ms: i64) -> Recycling {
        Recycling::new(RecyclingConfig { max, window: DurationMs(window_ms) })
    }

    #[test]
    fn a_tenant_is_held_from_its_max_th_kill_until_the_oldest_leaves_the_window() {
        let mut r = cap(3, 1_000);
        r.record("a", 0);
        r.record("a", 100);
        assert_eq!(r.held_until("a", 100), None);
        r.record("a", 200);
        assert_eq!(r.held_until("a", 200), Some(1_000));
        assert_eq!(r.held_until("b", 200), None, "others run");
        assert_eq!(r.held(500), vec![("a".to_string(), 1_000)]);
        assert_eq!(r.held_until("a", 1_000), None, "released once the oldest kill is a window old");
        assert!(r.held(1_300).is_empty());
        assert!(r.kills.is_empty(), "forgotten once every kill left the window");
    }

    proptest! {
        /// Held exactly when at least `max` kills lie within the last window.
        #[test]
        fn held_iff_max_kills_within_the_window(
            mut times in proptest::collection::vec(0i64..10_000, 0..30),
            max in 1u32..6,
            window in 1i64..3_000,
            probe in 0i64..3_000,
        ) {
            times.sort();
            let mut r = cap(max, window);
            for &t in &times {
                r.record("t", t);
            }
            let now = times.last().copied().unwrap_or(0) + probe;
            let recent = times.iter().filter(|&&t| t + window > now).count();
            prop_assert_eq!(r.held_until("t", now).is_some(), recent >= max as usize);
        }
    }
}
