//! Settings for secured clusters: Kafka client properties (SASL, TLS), ScyllaDB
//! credentials and TLS, and the HTTP API's authentication. Secrets are kept in [`Secret`]
//! and redacted in every `Debug` print, and [`KafkaProperties::redact`] scrubs them from
//! error text, so they never reach a log line or an error message.

use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::fmt;

/// A secret string (a password): `Debug` and `Display` print `***`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret itself, for handing to a client library (never to a log).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}
impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// librdkafka properties whose values are secrets (matched on the property name).
pub fn is_secret_property(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    ["password", "secret", "jaas", "token", "sasl.oauthbearer.config", "ssl.key.pem", "ssl_key", "credentials"]
        .iter()
        .any(|s| n.contains(s))
}

/// `[kafka.properties]`: librdkafka client properties (`security.protocol`,
/// `sasl.mechanism`, `sasl.username`, `sasl.password`, `ssl.ca.location`, ...) given to
/// every producer, consumer and admin client. Values may be strings, numbers or booleans.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KafkaProperties(pub BTreeMap<String, String>);

impl KafkaProperties {
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.insert(name.into(), value.into());
    }

    /// `text` with every secret property value replaced by `***` (for error messages
    /// that may quote what the client library was given).
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (k, v) in &self.0 {
            if is_secret_property(k) && !v.is_empty() {
                out = out.replace(v.as_str(), "***");
            }
        }
        out
    }
}

impl fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut m = f.debug_map();
        for (k, v) in &self.0 {
            if is_secret_property(k) {
                m.entry(k, &"***");
            } else {
                m.entry(k, v);
            }
        }
        m.finish()
    }
}

impl<'de> Deserialize<'de> for KafkaProperties {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = BTreeMap::<String, toml::Value>::deserialize(d)?;
        let mut out = BTreeMap::new();
        for (k, v) in raw {
            let s = match v {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                toml::Value::Float(x) => x.to_string(),
                _ => {
                    return Err(serde::de::Error::custom(format!(
                        "kafka.properties.{k}: a librdkafka property is a string, number or boolean, e.g. \
                         \"security.protocol\" = \"SASL_SSL\""
                    )))
                }
            };
            out.insert(k, s);
        }
        Ok(KafkaProperties(out))
    }
}

/// Environment variables starting with this prefix set Kafka client properties:
/// `FAIRWAY_KAFKA_SASL_PASSWORD` sets `sasl.password` (lower case, `_` becomes `.`).
pub const KAFKA_ENV_PREFIX: &str = "FAIRWAY_KAFKA_";

/// `FAIRWAY_KAFKA_*` names that are not client properties (used by fairway's scripts).
const KAFKA_ENV_RESERVED: &[&str] = &["PORT", "TLS_PORT", "SASL_PORT", "CONTROLLER_PORT", "HEAP", "EXTRA", "SCRAM"];

/// The property a `FAIRWAY_KAFKA_<NAME>` variable sets, or None if `var` is not one.
pub fn kafka_env_property(var: &str) -> Option<String> {
    let name = var.strip_prefix(KAFKA_ENV_PREFIX)?;
    if name.is_empty() || KAFKA_ENV_RESERVED.contains(&name) {
        return None;
    }
    Some(name.to_ascii_lowercase().replace('_', "."))
}

/// TLS to the CQL nodes (`[scylla.tls]`; its presence turns TLS on).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ScyllaTls {
    /// PEM file of the CA(s) that signed the nodes' certificates (default: the system's).
    pub ca_file: Option<String>,
    /// Client certificate and key (PEM) for clusters that require client authentication.
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    /// Check that each node's certificate names its address (IP SAN). On by default;
    /// the chain is verified either way.
    #[serde(default = "yes")]
    pub verify_hostname: bool,
}

fn yes() -> bool {
    true
}

/// How the HTTP API authenticates callers (`api.auth`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Every `/v1` request needs `Authorization: Bearer <API key>`.
    #[default]
    Required,
    /// No authentication: every caller is admin. Local demos only (warned at start-up).
    Off,
}

/// `[api]`: the HTTP API server.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    pub auth: AuthMode,
    /// How long a verified key is trusted before the key table is read again (a revoked
    /// key is refused within this long).
    #[serde(with = "super::humantime_serde_compat")]
    pub key_refresh: std::time::Duration,
    /// Where `/metrics` and `/healthz` are served (not on the API's address): operators
    /// decide what is exposed. `fairway serve --metrics-listen` overrides; "off" = none.
    pub metrics_listen: String,
    /// What one key and all keys may hold of the API process at once (`[api.limits]`).
    pub limits: crate::core::api_limits::ApiLimits,
    /// How many `fairway serve` processes share the front door's rates (`fairway serve
    /// --replicas`, env `FAIRWAY_API_REPLICAS`): each admits `1/replicas` of every
    /// tenant's and end user's rate, so N replicas behind a load balancer that spreads
    /// requests admit the configured rate in all (docs/admission.md).
    pub replicas: u32,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            auth: AuthMode::Required,
            key_refresh: std::time::Duration::from_secs(2),
            metrics_listen: "127.0.0.1:9464".into(),
            limits: Default::default(),
            replicas: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_in_debug_and_errors() {
        let mut p = KafkaProperties::default();
        p.set("sasl.username", "alice");
        p.set("sasl.password", "hunter2-very-secret");
        p.set("ssl.key.password", "k3y");
        let dbg = format!("{p:?}");
        assert!(dbg.contains("alice"), "{dbg}");
        assert!(!dbg.contains("hunter2") && !dbg.contains("k3y"), "{dbg}");
        let msg = p.redact("Invalid value \"hunter2-very-secret\" for sasl.password");
        assert!(!msg.contains("hunter2") && msg.contains("***"), "{msg}");
        assert_eq!(format!("{:?} {}", Secret::new("pw"), Secret::new("pw")), "\"***\" ***");
    }

    #[test]
    fn env_names_map_to_properties() {
        assert_eq!(kafka_env_property("FAIRWAY_KAFKA_SASL_PASSWORD").as_deref(), Some("sasl.password"));
        assert_eq!(kafka_env_property("FAIRWAY_KAFKA_SECURITY_PROTOCOL").as_deref(), Some("security.protocol"));
        assert_eq!(kafka_env_property("FAIRWAY_KAFKA_PORT"), None, "a scripts setting, not a property");
        assert_eq!(kafka_env_property("FAIRWAY_KAFKA"), None);
        assert_eq!(kafka_env_property("FAIRWAY_BROKERS"), None);
    }

    #[test]
    fn environment_sets_secrets_that_debug_never_shows() {
        let mut c = crate::config::Config::builtin();
        let set = c.apply_env([
            ("FAIRWAY_KAFKA_SASL_PASSWORD".to_string(), "kafka-pw-1".to_string()),
            ("FAIRWAY_KAFKA_PORT".to_string(), "19092".to_string()),
            ("FAIRWAY_SCYLLA_USERNAME".to_string(), "fw".to_string()),
            ("FAIRWAY_SCYLLA_PASSWORD".to_string(), "cql-pw-2".to_string()),
            ("HOME".to_string(), "/root".to_string()),
        ]);
        assert_eq!(set, vec!["sasl.password".to_string()]);
        assert_eq!(c.kafka.properties.get("sasl.password"), Some("kafka-pw-1"));
        assert_eq!(c.scylla.password.as_ref().map(Secret::expose), Some("cql-pw-2"));
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("kafka-pw-1") && !dbg.contains("cql-pw-2"), "{dbg}");
        c.validate().unwrap();
        c.scylla.username = None;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("scylla.username"), "{err}");
    }

    #[test]
    fn properties_accept_scalars_only() {
        #[derive(Deserialize)]
        struct W {
            p: KafkaProperties,
        }
        let w: W = toml::from_str("[p]\n\"security.protocol\" = \"SSL\"\n\"socket.timeout.ms\" = 5000\n\"enable.ssl.certificate.verification\" = false\n").unwrap();
        assert_eq!(w.p.get("socket.timeout.ms"), Some("5000"));
        assert_eq!(w.p.get("enable.ssl.certificate.verification"), Some("false"));
        let err = toml::from_str::<W>("[p]\nx = [1]\n").err().unwrap().to_string();
        assert!(err.contains("kafka.properties.x"), "{err}");
    }
}
