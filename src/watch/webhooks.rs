//! Result callbacks, the I/O shell (rules: `core::webhooks`; settings: `[webhooks]`,
//! `job_types.<name>.webhook_url`).
//!
//! The delivery loop runs in `fairway serve`. It reads the results topic in its own
//! consumer group (`<group prefix>webhooks`), so a worker's hot path pays nothing for
//! webhooks. Each result of a job type with a `webhook_url` is POSTed there, signed with
//! its tenant's secret, and retried with backoff (`webhooks.max_attempts`); every attempt
//! is a `webhook_delivered` / `webhook_failed` event in the job's history. Offsets are
//! committed only up to the oldest result still being delivered, so a restart (or a
//! crash) resumes the deliveries it had not finished: at least once, with a delivery id
//! that stays the same so receivers can drop copies. Redirects are not followed.
//!
//! Each (tenant, receiver) pair (the result's tenant, its callback URL) has its own lane
//! (`core::receivers`): at most `webhooks.concurrency_per_receiver` of its deliveries in
//! progress (backoff included) and `webhooks.queue_per_receiver` queued or in progress,
//! beyond which its new results are given up with a `webhook_failed` event;
//! `webhooks.concurrency` bounds the POSTs in flight across lanes (a delivery waiting
//! out its backoff holds none), and `webhooks.queue_total` the results held in total
//! (the loop stops reading at it). A dead receiver holds only its own lanes, and one
//! tenant flooding a receiver only its own lane there. A lane's semaphore exists while
//! the lane holds results (at most `webhooks.queue_total` lanes).

use crate::config::{secret_env_var, Config, Secret};
use crate::core::offsets::Tracker;
use crate::core::receivers::{lane, Admit, LaneKey, Lanes};
use crate::core::webhooks::{self as rules, Answer};
use crate::kafka::Producer;
use crate::kafka::{self, Consumer, Message, Offset, TopicPartitionList};
use crate::model::{EventKind, JobResult};
use crate::watch::events;
use crate::{codec, metrics as m, now_ms};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, Semaphore};

/// What every delivery task shares.
struct Deliverer {
    cfg: Arc<Config>,
    http: reqwest::Client,
    producer: Producer,
    /// Callback URL per job type (only those that have one).
    urls: BTreeMap<String, String>,
    /// POSTs in flight across lanes.
    posts: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
}

/// Refuses a job whose results this process would have to deliver unsigned: its job type
/// has a `webhook_url` and `tenant` has no signing secret here. The message names the
/// settings that fix it.
pub fn require_secret(cfg: &Config, tenant: &str, job_type: &str) -> Result<(), String> {
    let has_webhook = cfg.job_types.get(job_type).is_some_and(|jt| jt.webhook_url.is_some());
    if !has_webhook || cfg.webhooks.secret(tenant).is_some() {
        return Ok(());
    }
    Err(format!(
        "job type {job_type:?} posts its results to a webhook signed with the tenant's secret, and tenant {tenant:?} \
         has none: set webhooks.secrets.{tenant} (at least 16 characters) or {} for fairway serve, then submit again \
         (an unsigned callback is never sent)",
        secret_env_var(tenant)
    ))
}

/// Why the webhook deliverer could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum WebhooksError {
    #[error("cannot build the webhooks HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    #[error(transparent)]
    Kafka(#[from] kafka::KafkaError),
}

/// The HTTP client of webhook deliveries (job results and tenant alerts): no redirects
/// followed, `webhooks.timeout` per request.
pub fn http_client(cfg: &Config) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(cfg.webhooks.timeout)
        .user_agent(concat!("fairway-webhooks/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Runs the delivery loop until `stop` turns true (returns at once when no job type
/// names a `webhook_url`).
pub async fn deliver(cfg: Arc<Config>, stop: watch::Receiver<bool>) -> Result<(), WebhooksError> {
    let urls: BTreeMap<String, String> =
        cfg.job_types.iter().filter_map(|(name, jt)| Some((name.clone(), jt.webhook_url.clone()?))).collect();
    if urls.is_empty() {
        return Ok(());
    }
    let http = http_client(&cfg)?;
    let consumer = kafka::reader(&cfg, &cfg.group("webhooks"), false)?;
    let topic = cfg.results_topic();
    consumer.subscribe(&[topic.as_str()]).map_err(kafka::KafkaError::from)?;
    let d = Arc::new(Deliverer {
        producer: kafka::producer(&cfg)?,
        posts: Arc::new(Semaphore::new(cfg.webhooks.concurrency)),
        cfg,
        http,
        urls,
        stop: stop.clone(),
    });
    run_loop(d, consumer, topic, stop).await
}

/// Reads results while the lanes have room, starts a delivery per result with a
/// callback in its receiver's lane, commits what is finished.
async fn run_loop(
    d: Arc<Deliverer>,
    consumer: kafka::Reader,
    topic: String,
    mut stop: watch::Receiver<bool>,
) -> Result<(), WebhooksError> {
    let mut lanes = Lanes::new(d.cfg.webhooks.lanes());
    // Deliveries in progress per lane, while the lane holds results.
    let mut slots: HashMap<LaneKey, Arc<Semaphore>> = HashMap::new();
    let (done_tx, mut done) = mpsc::unbounded_channel::<(i32, i64, Option<LaneKey>)>();
    let mut tracker = Tracker::new();
    loop {
        tokio::select! {
            _ = stop.changed() => return Ok(()),
            Some((p, o, key)) = done.recv() => {
                if let Some(key) = key {
                    lanes.done(&key);
                    if lanes.pending(&key) == 0 {
                        slots.remove(&key);
                    }
                }
                if o >= 0 {
                    if let Some(next) = tracker.finished(&topic, p, o) {
                        commit(&consumer, &topic, p, next);
                    }
                }
            }
            m = consumer.recv(), if lanes.accepting() => match m {
                Ok(m) => {
                    let (p, o) = (m.partition(), m.offset());
                    if tracker.started(&topic, p, o).is_err() {
                        // Read again from an earlier offset (a rebalance): track anew.
                        tracker.revoke(&topic, p);
                        let _ = tracker.started(&topic, p, o);
                    }
                    match m.payload().and_then(|b| d.callback(b)) {
                        None => {
                            let _ = done_tx.send((p, o, None));
                        }
                        Some((r, url)) => {
                            let key = lane(&r.tenant, &url);
                            let (d, done_tx) = (d.clone(), done_tx.clone());
                            if lanes.admit(&key) == Admit::ReceiverFull {
                                tokio::spawn(async move {
                                    give_up_full(&d, &r, &url);
                                    let _ = done_tx.send((p, o, None));
                                });
                                continue;
                            }
                            let per_lane = d.cfg.webhooks.concurrency_per_receiver;
                            let lane_slots =
                                slots.entry(key.clone()).or_insert_with(|| Arc::new(Semaphore::new(per_lane))).clone();
                            tokio::spawn(async move {
                                let finished = deliver_in_lane(&d, &r, &url, &lane_slots).await;
                                let _ = done_tx.send((p, if finished { o } else { -1 }, Some(key)));
                            });
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "webhooks: consume failed");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            },
        }
    }
}

/// Delivers one result once its lane has a free delivery slot; see [`deliver_one`].
async fn deliver_in_lane(d: &Deliverer, r: &JobResult, url: &str, lane: &Semaphore) -> bool {
    let mut stop = d.stop.clone();
    let _slot = tokio::select! {
        _ = stop.wait_for(|s| *s) => return false,
        slot = lane.acquire() => slot,
    };
    deliver_one(d, r, url).await
}

/// A result whose receiver's lane is full: not sent, and its job's history says why.
fn give_up_full(d: &Deliverer, r: &JobResult, url: &str) {
    let why = format!(
        "not sent: its receiver already has webhooks.queue_per_receiver = {} of the tenant's results queued or in \
         delivery (is it down?); results to other receivers go on",
        d.cfg.webhooks.queue_per_receiver
    );
    tracing::warn!(job_id = %r.job_id, job_type = %r.job_type, "webhook {why}");
    metrics::counter!(m::WEBHOOK_ATTEMPTS, "result" => "not_sent").increment(1);
    let not_sent = rules::Delivery { event_id: new_id(), result: r, url, attempt: 0 };
    let ev = rules::delivery_event(not_sent, EventKind::WebhookFailed, why, None, now_ms());
    events::emit(&d.producer, &d.cfg, &ev);
}

impl Deliverer {
    /// The result in a results-topic message and its callback URL, if its job type has one.
    fn callback(&self, bytes: &[u8]) -> Option<(JobResult, String)> {
        let r = codec::decode_result(bytes).ok()?;
        let url = self.urls.get(&r.job_type)?.clone();
        Some((r, url))
    }
}

fn commit(consumer: &kafka::Reader, topic: &str, partition: i32, next: i64) {
    let mut tpl = TopicPartitionList::new();
    if tpl.add_partition_offset(topic, partition, Offset::Offset(next)).is_ok() {
        if let Err(e) = consumer.commit(&tpl, kafka::CommitMode::Async) {
            tracing::debug!(error = %e, "webhooks: commit failed (those results are delivered again after a restart)");
        }
    }
}

/// Delivers one result until it is delivered, refused or out of attempts (true), or the
/// loop stops (false: not finished, delivered again after a restart).
async fn deliver_one(d: &Deliverer, r: &JobResult, url: &str) -> bool {
    let Some(secret) = d.cfg.webhooks.secret(&r.tenant) else {
        let why = format!(
            "not sent: tenant {} has no signing secret; set webhooks.secrets.{} or {} and restart fairway serve",
            r.tenant,
            r.tenant,
            secret_env_var(&r.tenant)
        );
        tracing::error!(job_id = %r.job_id, "webhook {why}");
        metrics::counter!(m::WEBHOOK_ATTEMPTS, "result" => "not_sent").increment(1);
        let not_sent = rules::Delivery { event_id: new_id(), result: r, url, attempt: 0 };
        let ev = rules::delivery_event(not_sent, EventKind::WebhookFailed, why, None, now_ms());
        events::emit(&d.producer, &d.cfg, &ev);
        return true;
    };
    metrics::gauge!(m::WEBHOOKS_IN_FLIGHT).increment(1.0);
    let finished = attempts(d, r, url, &secret).await;
    metrics::gauge!(m::WEBHOOKS_IN_FLIGHT).decrement(1.0);
    finished
}

async fn attempts(d: &Deliverer, r: &JobResult, url: &str, secret: &Secret) -> bool {
    let body = rules::body(r);
    let backoff = d.cfg.webhooks.backoff();
    let mut stop = d.stop.clone();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (status, error) = post(d, url, r, &body, secret).await;
        let answer = Answer { status, error: &error };
        let delivery = rules::Delivery { event_id: new_id(), result: r, url, attempt };
        let o = rules::attempt_outcome(delivery, answer, &backoff, now_ms());
        let result = match (o.event.kind, o.retry_at) {
            (EventKind::WebhookDelivered, _) => "delivered",
            (_, Some(_)) => "retry",
            _ if rules::judge(status) == rules::Verdict::Refused => "refused",
            _ => "gave_up",
        };
        metrics::counter!(m::WEBHOOK_ATTEMPTS, "result" => result).increment(1);
        if result != "delivered" {
            tracing::info!(job_id = %r.job_id, "webhook {}", o.event.message.as_deref().unwrap_or(""));
        }
        events::emit(&d.producer, &d.cfg, &o.event);
        let Some(at) = o.retry_at else { return true };
        let wait = Duration::from_millis((at - now_ms()).max(0) as u64);
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return false,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One signed POST (holding one of `webhooks.concurrency` slots while it is in
/// flight): the status, or why there was none.
async fn post(d: &Deliverer, url: &str, r: &JobResult, body: &[u8], secret: &Secret) -> (Option<u16>, String) {
    let Ok(_slot) = d.posts.acquire().await else { return (None, "the delivery loop stopped".into()) };
    let sig = rules::signature(secret.expose().as_bytes(), now_ms(), body);
    let req = d
        .http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(rules::SIGNATURE_HEADER, sig)
        .header(rules::DELIVERY_HEADER, rules::delivery_id(r))
        .body(body.to_vec());
    match req.send().await {
        Ok(resp) => (Some(resp.status().as_u16()), String::new()),
        // Without the URL: its path or query may hold a token.
        Err(e) => (None, describe(e)),
    }
}

fn describe(e: reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "cannot connect".into()
    } else {
        e.without_url().to_string()
    }
}

fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_job_of_a_tenant_without_a_secret_is_refused_naming_the_settings() {
        let toml = "[tenants.nosecret-26]\n[tenants.signed]\n\
                    [job_types.hooked]\npool = \"short\"\nhandler = \"echo\"\nwebhook_url = \"http://127.0.0.1:9/cb\"\n\
                    [webhooks.secrets]\nsigned = \"0123456789abcdef0\"\n";
        let cfg = Config::parse(toml, "t").unwrap();
        let e = require_secret(&cfg, "nosecret-26", "hooked").unwrap_err();
        assert!(e.contains("webhooks.secrets.nosecret-26") && e.contains("FAIRWAY_WEBHOOK_SECRET_NOSECRET_26"), "{e}");
        assert!(require_secret(&cfg, "signed", "hooked").is_ok());
        assert!(require_secret(&cfg, "nosecret-26", "echo").is_ok(), "no webhook, no secret needed");
    }
}
