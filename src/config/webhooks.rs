//! `[webhooks]`: signing secrets and the retry schedule of result callbacks
//! (`crate::watch::webhooks`; rules in `core::webhooks`). A job type names its callback with
//! `job_types.<name>.webhook_url`.

use crate::config::Secret;
use crate::core::webhooks::Backoff;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// HMAC-SHA256 signing secret per tenant (`[webhooks.secrets] acme = "..."`;
    /// `FAIRWAY_WEBHOOK_SECRET_<TENANT>` overrides, tenant upper-cased with `-` and `.`
    /// as `_`). A tenant's callbacks are not sent without one.
    pub secrets: BTreeMap<String, Secret>,
    /// Attempts per result before giving up (`webhook_failed` says so).
    pub max_attempts: u32,
    /// Wait after the first failed attempt; doubles per attempt up to `backoff_max`.
    #[serde(with = "super::humantime_serde_compat")]
    pub backoff_initial: Duration,
    #[serde(with = "super::humantime_serde_compat")]
    pub backoff_max: Duration,
    /// Time limit of one POST (connect + answer).
    #[serde(with = "super::humantime_serde_compat")]
    pub timeout: Duration,
    /// POSTs in flight at once, across receivers (a delivery waiting out its backoff
    /// holds none).
    pub concurrency: usize,
    /// Deliveries of one receiver (callback URL) in progress at once, backoff included.
    pub concurrency_per_receiver: usize,
    /// Results of one receiver queued or in delivery; beyond it a new result for that
    /// receiver is given up (`webhook_failed`), other receivers' go on.
    pub queue_per_receiver: usize,
    /// Results queued or in delivery in total; at it the loop stops reading results.
    pub queue_total: usize,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            secrets: BTreeMap::new(),
            max_attempts: 8,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            timeout: Duration::from_secs(10),
            concurrency: 64,
            concurrency_per_receiver: 16,
            queue_per_receiver: 1_000,
            queue_total: 10_000,
        }
    }
}

/// The environment variable overriding a tenant's secret.
pub fn secret_env_var(tenant: &str) -> String {
    let t: String =
        tenant.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("FAIRWAY_WEBHOOK_SECRET_{t}")
}

impl WebhooksConfig {
    pub fn lanes(&self) -> crate::core::receivers::LaneBounds {
        crate::core::receivers::LaneBounds { per_receiver: self.queue_per_receiver, total: self.queue_total }
    }

    pub fn backoff(&self) -> Backoff {
        Backoff { initial: self.backoff_initial, max: self.backoff_max, max_attempts: self.max_attempts }
    }

    /// The tenant's signing secret: its environment variable, else the config file's.
    pub fn secret(&self, tenant: &str) -> Option<Secret> {
        match std::env::var(secret_env_var(tenant)) {
            Ok(s) if !s.is_empty() => Some(Secret::new(s)),
            _ => self.secrets.get(tenant).cloned(),
        }
    }

    pub fn validate(&self) -> Result<(), super::ConfigError> {
        if self.max_attempts < 1 {
            return Err(super::invalid("webhooks.max_attempts", "must be at least 1"));
        }
        if self.backoff_initial.is_zero() || self.backoff_max < self.backoff_initial {
            return Err(super::invalid(
                "webhooks.backoff_initial",
                "must be more than 0 and at most webhooks.backoff_max (e.g. \"1s\" and \"5m\")",
            ));
        }
        if self.timeout.is_zero() || self.concurrency == 0 {
            return Err(super::invalid("webhooks.timeout", "timeout and concurrency must be more than 0"));
        }
        if self.concurrency_per_receiver == 0 || self.queue_per_receiver < self.concurrency_per_receiver {
            return Err(super::invalid(
                "webhooks.queue_per_receiver",
                "concurrency_per_receiver must be at least 1 and queue_per_receiver at least concurrency_per_receiver \
                 (e.g. 16 and 1000)",
            ));
        }
        if self.queue_total <= self.queue_per_receiver {
            return Err(super::invalid(
                "webhooks.queue_total",
                "must be more than webhooks.queue_per_receiver, so one receiver cannot fill it alone (e.g. 10000)",
            ));
        }
        if let Some((t, _)) = self.secrets.iter().find(|(_, s)| s.expose().len() < 16) {
            return Err(super::invalid(
                format!("webhooks.secrets.{t}"),
                "is shorter than 16 characters; use a long random string (e.g. `openssl rand -hex 32`)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use std::time::Duration;

    #[test]
    fn defaults_overrides_and_errors() {
        let c = Config::builtin();
        assert_eq!((c.webhooks.max_attempts, c.webhooks.backoff_initial), (8, Duration::from_secs(1)));
        let c = Config::parse(
            "[webhooks]\nmax_attempts = 3\nbackoff_initial = \"200ms\"\n[webhooks.secrets]\nacme = \"0123456789abcdef0\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.webhooks.backoff().after(1), Some(Duration::from_millis(200)));
        assert_eq!(c.webhooks.secret("acme").unwrap().expose(), "0123456789abcdef0");
        assert!(!format!("{:?}", c.webhooks).contains("0123456789abcdef0"), "secrets never in Debug");
        let e = Config::parse("[webhooks.secrets]\nacme = \"short\"\n", "t").unwrap_err().to_string();
        assert!(e.contains("webhooks.secrets.acme") && e.contains("16") && !e.contains("short\""), "{e}");
        assert_eq!(super::secret_env_var("acme-eu.1"), "FAIRWAY_WEBHOOK_SECRET_ACME_EU_1");
    }
}
