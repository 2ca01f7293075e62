//! `[retention]` and `[idempotency]`: how long fairway keeps what it writes (job rows and
//! event history in the store as TTLs, topics as `retention.ms`, applied by `fairway init`
//! to new and existing topics) and how long an idempotency key is remembered.

use serde::Deserialize;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Job rows, their event history and the results topic.
    #[serde(with = "super::humantime_serde_compat")]
    pub results: Duration,
    /// The dead-letter topic.
    #[serde(with = "super::humantime_serde_compat")]
    pub dlq: Duration,
    /// Retry topics and the delayed topic. A record waits there at most about
    /// `worker.relay_hold_max` (later ones are parked in the store), so this only needs to
    /// outlast a relay outage.
    #[serde(with = "super::humantime_serde_compat")]
    pub retry: Duration,
    /// The events topic: how long the history recorder (`fairway serve`) may be down
    /// without losing events.
    #[serde(with = "super::humantime_serde_compat")]
    pub events: Duration,
    /// The usage ledger's rows (`crate::ledger`): what a billing system may still read.
    #[serde(with = "super::humantime_serde_compat")]
    pub ledger: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        let h = |n: u64| Duration::from_secs(n * 3600);
        RetentionConfig { results: h(24), dlq: h(7 * 24), retry: h(24), events: h(3 * 24), ledger: h(400 * 24) }
    }
}

/// `[events]`: job lifecycle and progress events (`crate::watch::events`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {
    /// Publish events to the events topic (`false`: no history, no push; states and
    /// results are unaffected).
    pub publish: bool,
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig { publish: true }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    /// How long a key is remembered: a submission with the same key inside it is answered
    /// with the original job.
    #[serde(with = "super::humantime_serde_compat")]
    pub window: Duration,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig { window: Duration::from_secs(24 * 3600) }
    }
}

impl RetentionConfig {
    /// Every value at least one second, the retry topics at least an hour (a relay
    /// restart must not lose retries).
    pub fn validate(&self) -> Result<(), super::ConfigError> {
        for (key, v) in [
            ("retention.results", self.results),
            ("retention.dlq", self.dlq),
            ("retention.retry", self.retry),
            ("retention.events", self.events),
        ] {
            if v < Duration::from_secs(1) {
                return Err(super::invalid(key, "must be at least 1s (e.g. \"24h\", \"7d\")"));
            }
        }
        if self.retry < Duration::from_secs(3600) {
            return Err(super::invalid(
                "retention.retry",
                "must be at least 1h: retries wait there until the relay reads them, and a relay restart must not lose them",
            ));
        }
        Ok(())
    }
}

impl IdempotencyConfig {
    pub fn validate(&self) -> Result<(), super::ConfigError> {
        if self.window < Duration::from_secs(1) || self.window.as_secs() > i32::MAX as u64 {
            return Err(super::invalid("idempotency.window", "must be between 1s and 68 years (e.g. \"1h\", \"24h\")"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use std::time::Duration;

    #[test]
    fn defaults_and_overrides() {
        let c = Config::builtin();
        assert_eq!(c.retention.results, Duration::from_secs(86_400));
        assert_eq!(c.retention.dlq, Duration::from_secs(7 * 86_400));
        assert_eq!(c.idempotency.window, Duration::from_secs(86_400));
        let c = Config::parse("[retention]\nresults = \"2s\"\n[idempotency]\nwindow = \"1h\"\n", "t").unwrap();
        assert_eq!(c.retention.results, Duration::from_secs(2));
        assert_eq!(c.idempotency.window, Duration::from_secs(3600));
        assert!(Config::builtin().events.publish);
        assert!(!Config::parse("[events]\npublish = false\n", "t").unwrap().events.publish);
    }

    #[test]
    fn bad_values_are_named_with_the_fix() {
        let e = Config::parse("[retention]\nretry = \"5min\"\n", "t").unwrap_err().to_string();
        assert!(e.contains("retention.retry") && e.contains("at least 1h"), "{e}");
        let e = Config::parse("[retention]\ndlq = \"0s\"\n", "t").unwrap_err().to_string();
        assert!(e.contains("retention.dlq"), "{e}");
        let e = Config::parse("[idempotency]\nwindow = \"soon\"\n", "t").unwrap_err().to_string();
        assert!(e.contains("soon") && e.contains("24h") || e.contains("5s"), "{e}");
        let e = Config::parse("[retention]\nresultz = \"1h\"\n", "t").unwrap_err().to_string();
        assert!(e.contains("resultz"), "{e}");
    }
}
