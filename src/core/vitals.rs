//! Whether a worker can still make progress, and when it must give up.
//!
//! A worker cut off from the broker or the store is not dead: nobody restarts it, so it
//! must tell "wait, this heals" from "I hold partitions I cannot serve". The rules:
//! - A fatal client error that cannot be repaired in place (a consumer's
//!   `rd_kafka_fatal_error`, a producer that keeps dying past its [`RebuildBudget`])
//!   means give up at once: leave the group, exit non-zero, be restarted.
//! - A store that stops answering impairs the worker at once (its liveness fails after
//!   `IMPAIRED_AFTER_MS`), and makes it give up once it stayed unreachable for the
//!   configured limit (`worker.store_outage_limit`): members that reach the store then
//!   serve its partitions.
//!
//! Plain state: `now` is an argument; `worker::watchdog` feeds it and acts on it.

use crate::model::Millis;
use std::collections::VecDeque;

/// A store probe failing this long makes the worker impaired (not live).
pub const IMPAIRED_AFTER_MS: Millis = 10_000;

/// How a worker is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It can make progress.
    Live,
    /// It cannot make progress now, and may heal (the store unreachable for a while).
    Impaired { reason: String },
    /// It must give up: leave its groups and exit non-zero. `kind` is a bounded label
    /// (`producer`, `consumer`, `store`).
    GiveUp { kind: &'static str, reason: String },
}

/// What a worker knows about its own ability to serve.
#[derive(Debug, Clone, Default)]
pub struct Vitals {
    /// Since when the store probe has failed (None: it answers), and the last error.
    store_failing: Option<(Millis, String)>,
    /// The first unrecoverable error seen: (kind, reason).
    fatal: Option<(&'static str, String)>,
    /// Give up once the store stayed unreachable this long (0: never).
    store_limit_ms: Millis,
}

impl Vitals {
    pub fn new(store_limit_ms: Millis) -> Self {
        Vitals { store_limit_ms, ..Default::default() }
    }

    pub fn store_answered(&mut self) {
        self.store_failing = None;
    }

    pub fn store_failed(&mut self, now: Millis, error: String) {
        let since = self.store_failing.as_ref().map_or(now, |(since, _)| *since);
        self.store_failing = Some((since, error));
    }

    /// An unrecoverable error; the first one is kept.
    pub fn fatal(&mut self, kind: &'static str, reason: String) {
        self.fatal.get_or_insert((kind, reason));
    }

    /// How long the store has been unreachable (0: it answers).
    pub fn store_unreachable_ms(&self, now: Millis) -> Millis {
        self.store_failing.as_ref().map_or(0, |(since, _)| (now - since).max(0))
    }

    pub fn verdict(&self, now: Millis) -> Verdict {
        if let Some((kind, reason)) = &self.fatal {
            return Verdict::GiveUp { kind, reason: reason.clone() };
        }
        let Some((_, error)) = &self.store_failing else { return Verdict::Live };
        let down = self.store_unreachable_ms(now);
        if self.store_limit_ms > 0 && down >= self.store_limit_ms {
            let reason = format!(
                "the store has been unreachable for {} s (worker.store_outage_limit {} s): {error}",
                down / 1000,
                self.store_limit_ms / 1000
            );
            return Verdict::GiveUp { kind: "store", reason };
        }
        if down >= IMPAIRED_AFTER_MS {
            return Verdict::Impaired {
                reason: format!("the store has been unreachable for {} s: {error}", down / 1000),
            };
        }
        Verdict::Live
    }
}

/// How often a dead client may be replaced: at most `max` rebuilds in any `window_ms`.
/// A client that dies faster than that is not healed by rebuilding it.
#[derive(Debug, Clone)]
pub struct RebuildBudget {
    max: usize,
    window_ms: Millis,
    recent: VecDeque<Millis>,
}

impl Default for RebuildBudget {
    /// 5 rebuilds in 10 minutes.
    fn default() -> Self {
        RebuildBudget::new(5, 600_000)
    }
}

impl RebuildBudget {
    pub fn new(max: usize, window_ms: Millis) -> Self {
        RebuildBudget { max, window_ms, recent: VecDeque::new() }
    }

    /// May the client be rebuilt now? (Counts the rebuild if so.)
    pub fn allow(&mut self, now: Millis) -> bool {
        while self.recent.front().is_some_and(|t| now - t >= self.window_ms) {
            self.recent.pop_front();
        }
        if self.recent.len() >= self.max {
            return false;
        }
        self.recent.push_back(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_outage_impairs_then_gives_up_at_the_limit() {
        let mut v = Vitals::new(60_000);
        assert_eq!(v.verdict(0), Verdict::Live);
        v.store_failed(1_000, "timeout".into());
        v.store_failed(5_000, "timeout".into());
        assert_eq!(v.verdict(5_000), Verdict::Live, "a blip is not an impairment");
        assert_eq!(v.store_unreachable_ms(5_000), 4_000, "counted from the first failure");
        assert!(matches!(v.verdict(1_000 + IMPAIRED_AFTER_MS), Verdict::Impaired { .. }));
        assert!(matches!(v.verdict(61_000), Verdict::GiveUp { kind: "store", .. }));
        v.store_answered();
        assert_eq!(v.verdict(61_000), Verdict::Live, "an answer heals it");
        assert_eq!(v.store_unreachable_ms(61_000), 0);
    }

    #[test]
    fn no_store_limit_never_gives_up_on_the_store() {
        let mut v = Vitals::new(0);
        v.store_failed(0, "down".into());
        assert!(matches!(v.verdict(10_000_000), Verdict::Impaired { .. }));
    }

    #[test]
    fn a_fatal_error_gives_up_and_keeps_the_first_reason() {
        let mut v = Vitals::new(60_000);
        v.fatal("consumer", "fenced".into());
        v.fatal("producer", "later".into());
        v.store_answered();
        assert_eq!(v.verdict(0), Verdict::GiveUp { kind: "consumer", reason: "fenced".into() });
    }

    #[test]
    fn rebuilds_are_bounded_per_window() {
        let mut b = RebuildBudget::new(2, 1_000);
        assert!(b.allow(0));
        assert!(b.allow(10));
        assert!(!b.allow(20), "a third within the window is refused");
        assert!(b.allow(1_000), "the first one left the window");
        assert!(!b.allow(1_005));
        assert!(b.allow(1_010));
    }
}
