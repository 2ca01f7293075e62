//! Producing jobs: validation against the config, idempotency keys (LWT in the store),
//! and the keyed, idempotent produce to the pool topic. Used by the CLI, the HTTP API
//! and the demo.

use crate::config::Config;
use crate::model::{JobSubmitted, Millis, Pool, Priority};
use crate::store::Store;
use crate::{codec, kafka, now_ms};
use rdkafka::producer::FutureProducer;
use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The tenant, and what is wrong and how to fix it.
    #[error("{1}")]
    UnknownTenant(String, String),
    #[error("unknown job type {0:?}: add [job_types.{0}] to the config (known: {1})")]
    UnknownJobType(String, String),
    #[error("payload is {size} bytes, above worker.max_payload_bytes = {limit}; store large inputs elsewhere and submit a reference")]
    PayloadTooLarge { size: usize, limit: usize },
    #[error("not_after ({not_after}) is before execute_at ({execute_at}): the job could never run")]
    NeverRunnable { execute_at: Millis, not_after: Millis },
    #[error(transparent)]
    Kafka(#[from] kafka::KafkaError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Codec(#[from] codec::CodecError),
}

/// A job to submit, as given by a user (CLI flags, an NDJSON line, an HTTP body).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NewJob {
    pub tenant: String,
    pub job_type: String,
    #[serde(default)]
    pub payload: serde_json::Value,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default)]
    pub pool: Option<Pool>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub execute_at: Option<Millis>,
    #[serde(default)]
    pub not_after: Option<Millis>,
    #[serde(default)]
    pub generation: i64,
}

impl NewJob {
    /// Payload bytes: a JSON string is sent as its text, anything else as its JSON.
    pub fn payload_bytes(&self) -> Vec<u8> {
        match &self.payload {
            serde_json::Value::Null => Vec::new(),
            serde_json::Value::String(s) => s.clone().into_bytes(),
            v => v.to_string().into_bytes(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    pub job_id: String,
    /// True when the idempotency key was already used: nothing was produced.
    pub duplicate: bool,
    pub pool: Pool,
}

pub struct Submitter {
    cfg: std::sync::Arc<Config>,
    producer: FutureProducer,
    store: Option<Store>,
    /// The live registry (API, CLI); without it, the config file's tenants.
    tenants: Option<crate::tenants::LiveTenants>,
}

/// How long an idempotency key is remembered.
pub const IDEMPOTENCY_TTL_SECS: i32 = 24 * 3600;

impl Submitter {
    pub fn new(cfg: std::sync::Arc<Config>, store: Option<Store>) -> Result<Self, SubmitError> {
        let producer = kafka::producer(&cfg)?;
        Ok(Submitter { cfg, producer, store, tenants: None })
    }

    /// Checks tenants against the live registry instead of the config file's list.
    pub fn with_tenants(mut self, tenants: crate::tenants::LiveTenants) -> Self {
        self.tenants = Some(tenants);
        self
    }

    /// Checks a job against the registry (or the config) and the job types; returns
    /// the pool it goes to.
    pub fn validate(&self, job: &NewJob, payload_len: usize) -> Result<Pool, SubmitError> {
        match &self.tenants {
            Some(live) => {
                let pool = validate_job(&self.cfg, job, payload_len)?;
                live.admit(&job.tenant).map_err(|why| SubmitError::UnknownTenant(job.tenant.clone(), why))?;
                Ok(pool)
            }
            None => validate(&self.cfg, job, payload_len),
        }
    }

    pub async fn submit(&self, job: &NewJob) -> Result<Submitted, SubmitError> {
        let payload = job.payload_bytes();
        let pool = self.validate(job, payload.len())?;
        let job_id = uuid::Uuid::now_v7().to_string();
        if let (Some(key), Some(store)) = (&job.idempotency_key, &self.store) {
            if let Some(existing) =
                store.claim_idempotency(&job.tenant, key, &job_id, now_ms(), IDEMPOTENCY_TTL_SECS).await?
            {
                return Ok(Submitted { job_id: existing, duplicate: true, pool });
            }
        }
        let rec = JobSubmitted {
            pool: Some(pool),
            priority: job.priority,
            idempotency_key: job.idempotency_key.clone(),
            execute_at: job.execute_at,
            not_after: job.not_after,
            generation: job.generation,
            ..JobSubmitted::original(job_id.clone(), job.tenant.clone(), job.job_type.clone(), payload, now_ms())
        };
        self.produce(&rec).await?;
        Ok(Submitted { job_id, duplicate: false, pool })
    }

    /// Produces an already built record to its pool topic.
    pub async fn produce(&self, rec: &JobSubmitted) -> Result<(), SubmitError> {
        let pool = rec.pool.or_else(|| self.cfg.job_types.get(&rec.job_type).map(|j| j.pool)).unwrap_or(Pool::Short);
        let bytes = codec::encode_job(rec)?;
        kafka::send(&self.producer, &self.cfg.pool_topic(pool), &rec.tenant, &bytes).await?;
        Ok(())
    }

    pub fn producer(&self) -> &FutureProducer {
        &self.producer
    }
}

/// Checks a job against the config file (tenants included): for producers without a store.
pub fn validate(cfg: &Config, job: &NewJob, payload_len: usize) -> Result<Pool, SubmitError> {
    if !cfg.tenants.contains_key(&job.tenant) {
        let known: Vec<&str> = cfg.tenants.keys().map(String::as_str).collect();
        let t = &job.tenant;
        return Err(SubmitError::UnknownTenant(
            t.clone(),
            format!("unknown tenant {t:?}: add [tenants.{t}] to the config (known: {})", known.join(", ")),
        ));
    }
    validate_job(cfg, job, payload_len)
}

/// Everything but the tenant: job type, payload size, times.
fn validate_job(cfg: &Config, job: &NewJob, payload_len: usize) -> Result<Pool, SubmitError> {
    let Some(jt) = cfg.job_types.get(&job.job_type) else {
        let known: Vec<&str> = cfg.job_types.keys().map(String::as_str).collect();
        return Err(SubmitError::UnknownJobType(job.job_type.clone(), known.join(", ")));
    };
    if payload_len > cfg.worker.max_payload_bytes {
        return Err(SubmitError::PayloadTooLarge { size: payload_len, limit: cfg.worker.max_payload_bytes });
    }
    if let (Some(e), Some(n)) = (job.execute_at, job.not_after) {
        if n < e {
            return Err(SubmitError::NeverRunnable { execute_at: e, not_after: n });
        }
    }
    Ok(job.pool.unwrap_or(jt.pool))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(t: &str, jt: &str) -> NewJob {
        NewJob { tenant: t.into(), job_type: jt.into(), ..Default::default() }
    }

    #[test]
    fn validation_names_the_problem() {
        let cfg = Config::builtin();
        assert_eq!(validate(&cfg, &job("acme", "echo"), 10).unwrap(), Pool::Short);
        let e = validate(&cfg, &job("nobody", "echo"), 10).unwrap_err().to_string();
        assert!(e.contains("nobody") && e.contains("[tenants.nobody]"), "{e}");
        let e = validate(&cfg, &job("acme", "nope"), 10).unwrap_err().to_string();
        assert!(e.contains("[job_types.nope]"), "{e}");
        let e = validate(&cfg, &job("acme", "echo"), 10 << 20).unwrap_err().to_string();
        assert!(e.contains("max_payload_bytes"), "{e}");
    }

    #[test]
    fn payload_string_is_sent_verbatim() {
        let mut j = job("acme", "echo");
        j.payload = serde_json::json!("hello");
        assert_eq!(j.payload_bytes(), b"hello");
        j.payload = serde_json::json!({"ms": 5});
        assert_eq!(j.payload_bytes(), br#"{"ms":5}"#);
    }
}
