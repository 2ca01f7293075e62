//! The Kafka edge: the only module that imports rdkafka. It builds clients from
//! fairway's config, creates topics, produces with delivery acknowledgements and
//! exposes a consumer whose rebalances are reported to the worker loop.

use crate::config::{Config, GroupProtocol};
use crate::model::{FailureClass, Pool};
use crate::seams::Pausable;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

pub mod copy;
mod producer;
pub mod seam;
pub mod socket;
pub mod stall;
pub use producer::{
    bulk_producer, producer, submit_producer, worker_delivery_timeout, worker_producer, Outgoing, Producer,
};
pub use rdkafka::consumer::{CommitMode, Consumer};
pub use rdkafka::message::{BorrowedMessage, Headers, Message, OwnedMessage};
pub use rdkafka::{Offset, TopicPartitionList};

#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// `message` has secret property values redacted.
    #[error("cannot create Kafka client for {brokers}: {message}")]
    Client { brokers: String, message: String },
    #[error("creating topic {topic} failed: {reason}")]
    CreateTopic { topic: String, reason: String },
    #[error("producing to {topic} failed: {source}")]
    Produce { topic: String, source: rdkafka::error::KafkaError },
    #[error("the Kafka producer was given up: {0}")]
    ProducerGaveUp(String),
    #[error("Kafka consumer error: {0}")]
    Consume(#[from] rdkafka::error::KafkaError),
    #[error("no broker answered a metadata request: {0}")]
    Ping(String),
}

/// A fetch returns as soon as there is data or after this long; librdkafka's default
/// (500 ms) puts half a second on every idle hop (jobs, retries, results).
const FETCH_WAIT_MS: &str = "25";

/// Base client settings shared by producers, consumers and the admin client: fairway's
/// defaults, then `[kafka.properties]` (SASL, TLS, tuning). Settings a client sets after
/// this (idempotence, acks, group, offset storage) are fairway's correctness and win.
fn base(cfg: &Config) -> ClientConfig {
    tuned(cfg, &[])
}

/// [`base`] with `tuning` defaults that `kafka.properties` (and `FAIRWAY_KAFKA_<NAME>`)
/// may override; what correctness depends on is set by the caller after this.
fn tuned(cfg: &Config, tuning: &[(&str, &str)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &cfg.kafka.brokers)
        // Small local brokers answer slowly to metadata at first; be patient but bounded.
        .set("socket.timeout.ms", "10000")
        .set("log_level", "4");
    for (k, v) in tuning {
        c.set(*k, *v);
    }
    for (k, v) in cfg.kafka.properties.iter() {
        c.set(k, v);
    }
    if needs_ca_probe(&cfg.kafka.properties) {
        c.set("ssl.ca.location", "probe");
    }
    c
}

/// TLS without a CA given: an OpenSSL looks for CAs only where it was built to look (a
/// distribution's own build finds its store, another build may find none), so have
/// librdkafka probe the usual bundle paths (/etc/ssl/certs/...) instead.
fn needs_ca_probe(p: &crate::config::KafkaProperties) -> bool {
    let tls = p.get("security.protocol").is_some_and(|v| v.to_ascii_uppercase().ends_with("SSL"));
    tls && ["ssl.ca.location", "ssl.ca.pem", "ssl.ca.certificate.stores"].iter().all(|k| p.get(k).is_none())
}

/// A client could not be created (a bad property, usually): the error without secrets.
fn client_err(cfg: &Config) -> impl Fn(rdkafka::error::KafkaError) -> KafkaError + '_ {
    move |e| KafkaError::Client {
        brokers: cfg.kafka.brokers.clone(),
        message: format!(
            "{} (check [kafka.properties] / FAIRWAY_KAFKA_* against librdkafka's CONFIGURATION.md)",
            cfg.kafka.properties.redact(&e.to_string())
        ),
    }
}

/// Every topic fairway uses, in creation order.
pub fn all_topics(cfg: &Config) -> Vec<String> {
    let mut t: Vec<String> = Pool::ALL.iter().map(|p| cfg.pool_topic(*p)).collect();
    for class in [FailureClass::AppError, FailureClass::Timeout, FailureClass::Dependency, FailureClass::WorkerCrash] {
        t.push(cfg.retry_topic(class));
    }
    t.push(cfg.delayed_topic());
    t.push(cfg.dlq_topic());
    t.push(cfg.results_topic());
    t.push(cfg.events_topic());
    t
}

/// `retention.ms` fairway sets on a topic (`[retention]`); None: the broker's default
/// (pool topics).
pub fn topic_retention(cfg: &Config, topic: &str) -> Option<Duration> {
    let r = &cfg.retention;
    if topic == cfg.dlq_topic() {
        Some(r.dlq)
    } else if topic == cfg.results_topic() {
        Some(r.results)
    } else if topic == cfg.events_topic() {
        Some(r.events)
    } else if topic == cfg.delayed_topic() || topic.starts_with(&cfg.topic("retry.")) {
        Some(r.retry)
    } else {
        None
    }
}

/// Sets `retention.ms` on existing topics whose value differs from `[retention]`;
/// returns "topic: old -> new" for each change. Other dynamic settings of the topic are
/// kept (AlterConfigs replaces a topic's whole dynamic configuration).
pub async fn apply_retention(cfg: &Config) -> Result<Vec<String>, KafkaError> {
    use rdkafka::admin::{AlterConfig, ConfigSource, ResourceSpecifier};
    let admin: AdminClient<DefaultClientContext> = base(cfg).create().map_err(client_err(cfg))?;
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let admin_err = |e: rdkafka::error::KafkaError| KafkaError::Client {
        brokers: cfg.kafka.brokers.clone(),
        message: cfg.kafka.properties.redact(&e.to_string()),
    };
    let wanted: Vec<(String, String)> = all_topics(cfg)
        .into_iter()
        .filter_map(|t| topic_retention(cfg, &t).map(|d| (t, d.as_millis().to_string())))
        .collect();
    let specs: Vec<ResourceSpecifier> = wanted.iter().map(|(t, _)| ResourceSpecifier::Topic(t)).collect();
    // A broker without DescribeConfigs/AlterConfigs (some Kafka-protocol servers lack
    // them): say what that means and what to do.
    let admin_err = |e: rdkafka::error::KafkaError| {
        let mut err = admin_err(e);
        if let KafkaError::Client { message, .. } = &mut err {
            if message.contains("UnsupportedFeature") {
                *message = format!(
                    "{message}: this broker has no DescribeConfigs/AlterConfigs, so retention.ms of existing topics \
                     stays as it is (topics `fairway init` creates get it at creation); set it with the broker's own tools"
                );
            }
        }
        err
    };
    let described = admin.describe_configs(&specs, &opts).await.map_err(admin_err)?;
    let mut changes = Vec::new();
    let mut kept: Vec<Vec<(String, String)>> = Vec::new();
    let mut targets = Vec::new();
    for ((topic, ms), d) in wanted.iter().zip(described) {
        let res = d.map_err(|code| KafkaError::CreateTopic { topic: topic.clone(), reason: code.to_string() })?;
        let now = res.get("retention.ms").and_then(|e| e.value.clone());
        if now.as_deref() == Some(ms.as_str()) {
            continue;
        }
        let dynamic = res
            .entries
            .iter()
            .filter(|e| e.source == ConfigSource::DynamicTopic && e.name != "retention.ms" && !e.is_read_only)
            .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
            .collect();
        kept.push(dynamic);
        targets.push((topic, ms));
        changes.push(format!("{topic}: retention.ms {} -> {ms}", now.unwrap_or_else(|| "default".into())));
    }
    if targets.is_empty() {
        return Ok(changes);
    }
    let alters: Vec<AlterConfig> = targets
        .iter()
        .zip(&kept)
        .map(|((topic, ms), dynamic)| {
            let mut a = AlterConfig::new(ResourceSpecifier::Topic(topic)).set("retention.ms", ms);
            for (k, v) in dynamic {
                a = a.set(k, v);
            }
            a
        })
        .collect();
    for r in admin.alter_configs(&alters, &opts).await.map_err(admin_err)? {
        if let Err((spec, code)) = r {
            return Err(KafkaError::CreateTopic {
                topic: format!("{spec:?}"),
                reason: format!("setting retention.ms: {code}"),
            });
        }
    }
    Ok(changes)
}

/// Creates the missing topics; returns the names it created (empty: nothing to do).
pub async fn ensure_topics(cfg: &Config) -> Result<Vec<String>, KafkaError> {
    let admin: AdminClient<DefaultClientContext> = base(cfg).create().map_err(client_err(cfg))?;
    let names = all_topics(cfg);
    let retention: Vec<Option<String>> =
        names.iter().map(|n| topic_retention(cfg, n).map(|d| d.as_millis().to_string())).collect();
    let new: Vec<NewTopic> = names
        .iter()
        .zip(&retention)
        .map(|(n, r)| {
            let t = NewTopic::new(n, cfg.kafka.partitions, TopicReplication::Fixed(cfg.kafka.replication_factor));
            match r {
                Some(ms) => t.set("retention.ms", ms),
                None => t,
            }
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin.create_topics(&new, &opts).await.map_err(|e| KafkaError::Client {
        brokers: cfg.kafka.brokers.clone(),
        message: cfg.kafka.properties.redact(&e.to_string()),
    })?;
    let mut created = Vec::new();
    for r in results {
        match r {
            Ok(name) => created.push(name),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(KafkaError::CreateTopic { topic, reason: code.to_string() }),
        }
    }
    await_led(cfg, &created).await?;
    Ok(created)
}

/// Deletes every topic of `cfg`'s deployment ([`all_topics`]: its prefix's pool, retry,
/// delayed, DLQ, results and events topics). For throwaway deployments only (a bench's
/// `bench<ms>.` prefix): a broker that keeps every run's partitions grows slower with
/// each (thousands of partitions, their indexes and fetch sessions). Topics already gone
/// are not an error.
pub async fn delete_topics(cfg: &Config) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = base(cfg).create().map_err(client_err(cfg))?;
    let names = all_topics(cfg);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin.delete_topics(&refs, &opts).await.map_err(|e| KafkaError::Client {
        brokers: cfg.kafka.brokers.clone(),
        message: cfg.kafka.properties.redact(&e.to_string()),
    })?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((topic, code)) => {
                return Err(KafkaError::Client {
                    brokers: cfg.kafka.brokers.clone(),
                    message: format!("deleting topic {topic}: {code}"),
                })
            }
        }
    }
    Ok(())
}

/// How long [`ensure_topics`] waits for the topics it created to be usable.
const TOPICS_READY_WITHIN: Duration = Duration::from_secs(30);

/// Waits until every partition of `topics` has a leader in the broker's metadata: a
/// created topic is not usable at once (its metadata spreads, its partitions elect
/// leaders), and a reader or producer that starts meanwhile gets `UnknownTopicOrPartition`
/// or `NotLeaderForPartition`. So `fairway init` returns with the topics ready to use.
async fn await_led(cfg: &Config, topics: &[String]) -> Result<(), KafkaError> {
    if topics.is_empty() {
        return Ok(());
    }
    let client: rdkafka::consumer::BaseConsumer = base(cfg).create().map_err(client_err(cfg))?;
    let (topics, partitions) = (topics.to_vec(), cfg.kafka.partitions.max(1) as usize);
    let waited = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + TOPICS_READY_WITHIN;
        let mut pending = topics;
        while !pending.is_empty() {
            pending.retain(|topic| {
                let Ok(md) = client.fetch_metadata(Some(topic), Duration::from_secs(5)) else { return true };
                let led = |t: &rdkafka::metadata::MetadataTopic| {
                    t.error().is_none()
                        && t.partitions().len() >= partitions
                        && t.partitions().iter().all(|p| p.error().is_none() && p.leader() >= 0)
                };
                !md.topics().iter().any(|t| t.name() == topic && led(t))
            });
            if pending.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(pending);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    });
    match waited.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(pending)) => Err(KafkaError::CreateTopic {
            topic: pending.join(", "),
            reason: format!(
                "created, but without a leader for every partition after {} s: check the brokers' logs",
                TOPICS_READY_WITHIN.as_secs()
            ),
        }),
        Err(e) => Err(KafkaError::CreateTopic { topic: "(all)".into(), reason: e.to_string() }),
    }
}

/// Does a broker answer this producer? (A metadata request of at most `timeout`, for
/// readiness probes; run off the async threads, it blocks.)
pub async fn ping(producer: &Producer, timeout: Duration) -> Result<(), KafkaError> {
    let (client, _) = producer.client()?;
    let asked = tokio::task::spawn_blocking(move || {
        use rdkafka::producer::Producer as _;
        client.client().fetch_metadata(None, timeout).map(|_| ())
    });
    asked.await.map_err(|e| KafkaError::Ping(e.to_string()))?.map_err(|e| KafkaError::Ping(e.to_string()))
}

/// Produces one record and waits for the broker's acknowledgement.
pub async fn send(producer: &Producer, topic: &str, key: &str, payload: &[u8]) -> Result<(i32, i64), KafkaError> {
    producer.send(topic, key, payload, &[]).await
}

/// Like [`send`], with record headers (e.g. W3C `traceparent` on results, so a results
/// consumer joins the job's trace without decoding the record).
pub async fn send_with_headers(
    producer: &Producer,
    topic: &str,
    key: &str,
    payload: &[u8],
    headers: &[(&str, &str)],
) -> Result<(i32, i64), KafkaError> {
    producer.send(topic, key, payload, headers).await
}

/// The W3C trace context of a job as record headers (`traceparent`, `tracestate`), so
/// tools and consumers that read Kafka headers join its trace without decoding Avro.
pub fn trace_headers(job: &crate::model::JobSubmitted) -> Vec<(&'static str, &str)> {
    [("traceparent", &job.traceparent), ("tracestate", &job.tracestate)]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.as_deref()?)))
        .collect()
}

/// Produces one record without waiting for the acknowledgement (events: the hot path
/// must not wait for them). False when the producer's queue is full or the record is
/// refused at once; delivery failures later are librdkafka's to retry, then dropped.
pub fn send_nowait(producer: &Producer, topic: &str, key: &str, payload: &[u8]) -> bool {
    producer.send_nowait(topic, key, payload)
}

/// Partition assignment changes, reported from librdkafka's thread to the worker loop.
#[derive(Debug, Clone)]
pub enum RebalanceEvent {
    Assigned(Vec<(String, i32)>),
    Revoked(Vec<(String, i32)>),
    /// Revoked without a rebalance this member took part in (librdkafka's own session
    /// timeout, e.g. cut off from the broker, or the broker fenced the member): another
    /// member may own them and run their jobs already.
    Lost(Vec<(String, i32)>),
    /// Owned partitions without progress for [`stall::STALLED_AFTER`] (topic, partition,
    /// librdkafka's fetch state; see [`stall::Watch`]): the loop restarts the fetchers
    /// ([`stall::restart_fetchers`]) and resumes them unless it keeps them paused. At most one such
    /// event per [`stall::RESTART_EVERY`]; only consumers with statistics send it.
    Stalled(Vec<(String, i32, String)>),
    /// The group membership has been unsettled for [`stall::GROUP_STUCK_AFTER`] (why, from
    /// librdkafka's group states): the loop replaces the consumer. At most one such event
    /// per [`stall::GROUP_STUCK_AFTER`]; only consumers with statistics send it.
    GroupStuck(String),
}

/// Consumer context that forwards rebalances. Offsets already stored are committed by
/// librdkafka itself on revoke (auto commit), so nothing finished is redelivered.
pub struct WorkerContext {
    events: mpsc::UnboundedSender<RebalanceEvent>,
    /// The pool whose consumer lag this client reports (`fairway_consumer_lag{pool}`,
    /// from librdkafka's statistics); None: no statistics.
    lag_pool: Option<&'static str>,
    /// Owned partitions without progress: since when, and when last warned.
    idle_fetch: std::sync::Mutex<stall::Watch>,
    /// When the loop was last asked to restart the fetchers (`RebalanceEvent::Stalled`).
    restart_asked: std::sync::Mutex<Option<Instant>>,
    /// Since when the group membership is unsettled, and when the loop was last asked to
    /// replace the consumer (`RebalanceEvent::GroupStuck`).
    group_watch: std::sync::Mutex<(Option<Instant>, Option<Instant>)>,
    /// The group protocol is the classic one (not KIP-848): see [`stall::group_settled`].
    classic: bool,
}

impl ClientContext for WorkerContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
            metrics::counter!(crate::metrics::KAFKA_FATAL_ERRORS, "client" => "consumer").increment(1);
            tracing::error!(%reason, "Kafka consumer hit a fatal error; the worker gives up");
        } else {
            tracing::debug!(error = %error, %reason, "librdkafka error");
        }
    }

    fn stats_raw(&self, statistics: &[u8]) {
        let Some(pool) = self.lag_pool else { return };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(statistics) else { return };
        if let Some(lag) = consumer_lag(&v) {
            metrics::gauge!(crate::metrics::CONSUMER_LAG, "pool" => pool).set(lag as f64);
        }
        self.watch_fetchers(pool, &fetch_views(&v));
        self.watch_group(&v);
        if tracing::enabled!(tracing::Level::DEBUG) {
            tracing::debug!(pool, partitions = %fetch_positions(&v), "fetch positions");
        }
    }
}

/// Each owned partition's fetch state and positions from librdkafka's statistics, one
/// compact string (`p:state next=N app=N committed=N hi=N queued=N`), for debugging a
/// partition whose records do not arrive.
fn fetch_positions(stats: &serde_json::Value) -> String {
    let describe = |(_, id, p): (&str, i32, &serde_json::Value)| {
        let n = |k: &str| p.get(k).and_then(|x| x.as_i64()).unwrap_or(-1);
        let state = p.get("fetch_state").and_then(|s| s.as_str()).unwrap_or("?");
        let (next, app, committed) = (n("next_offset"), n("app_offset"), n("committed_offset"));
        format!(
            "{id}:{state} next={next} app={app} committed={committed} hi={} queued={}",
            n("hi_offset"),
            n("fetchq_cnt")
        )
    };
    owned_partitions(stats).map(describe).collect::<Vec<_>>().join("; ")
}

impl WorkerContext {
    /// Asks the loop to replace the consumer once its group membership has been unsettled
    /// for [`stall::GROUP_STUCK_AFTER`] (see there).
    fn watch_group(&self, stats: &serde_json::Value) {
        let cgrp = stats.get("cgrp");
        let field = |k: &str| cgrp.and_then(|c| c.get(k)).and_then(|s| s.as_str()).unwrap_or("");
        let (state, join_state) = (field("state"), field("join_state"));
        let now = Instant::now();
        let mut watch = self.group_watch.lock().expect("group watch lock");
        if cgrp.is_none() || stall::group_settled(state, join_state, self.classic) {
            watch.0 = None;
            return;
        }
        let since = *watch.0.get_or_insert(now);
        if stall::group_stuck(now.duration_since(since), watch.1.map(|at| now.duration_since(at))) {
            watch.1 = Some(now);
            let why =
                format!("group state {state}, join state {join_state} for {}s", now.duration_since(since).as_secs());
            let _ = self.events.send(RebalanceEvent::GroupStuck(why));
        }
    }

    /// Reports owned partitions that make no progress ([`stall::Watch`]): a fetcher that
    /// stayed inactive (an offset lookup that never completed, a stopped fetcher), or an
    /// active one whose records beyond the worker's position never reach it. A stopped
    /// fetcher is logged here (once a minute each) and counted in
    /// `fairway_partitions_not_fetching{pool}`; every stalled partition goes to the loop
    /// (`RebalanceEvent::Stalled`), which restarts the fetchers and lifts the pause of
    /// any it does not mean to keep paused (see [`stall`]).
    fn watch_fetchers(&self, pool: &'static str, views: &[stall::FetchView]) {
        let now = Instant::now();
        let mut watch = self.idle_fetch.lock().expect("fetch watch lock");
        let report = watch.observe(now, views);
        for (topic, partition, state, idle_s) in &report.warn {
            tracing::warn!(
                pool, topic = %topic, partition = *partition, fetch_state = %state, idle_s = *idle_s,
                "an owned partition is not being fetched: its jobs wait; the worker restarts its fetchers"
            );
        }
        metrics::gauge!(crate::metrics::PARTITIONS_NOT_FETCHING, "pool" => pool).set(report.not_fetching as f64);
        let mut asked = self.restart_asked.lock().expect("restart lock");
        if !report.stuck.is_empty() && stall::restart_due(report.longest, asked.map(|a| now.duration_since(a))) {
            *asked = Some(now);
            let _ = self.events.send(RebalanceEvent::Stalled(report.stuck));
        }
    }
}

/// The owned (desired) partitions in librdkafka's statistics JSON: (topic, partition,
/// its statistics object). The internal `-1` partition is left out.
fn owned_partitions(stats: &serde_json::Value) -> impl Iterator<Item = (&str, i32, &serde_json::Value)> {
    let topics = stats.get("topics").and_then(|t| t.as_object()).into_iter().flatten();
    topics.flat_map(|(topic, t)| {
        let parts = t.get("partitions").and_then(|p| p.as_object()).into_iter().flatten();
        parts.filter_map(move |(id, p)| {
            let partition = id.parse::<i32>().ok().filter(|p| *p >= 0)?;
            p.get("desired").and_then(|d| d.as_bool()).unwrap_or(true).then_some((topic.as_str(), partition, p))
        })
    })
}

/// Every owned partition's fetch state and positions from librdkafka's statistics.
fn fetch_views(stats: &serde_json::Value) -> Vec<stall::FetchView> {
    owned_partitions(stats)
        .map(|(topic, partition, p)| {
            let n = |k: &str| p.get(k).and_then(|x| x.as_i64()).unwrap_or(-1);
            stall::FetchView {
                topic: topic.to_string(),
                partition,
                state: p.get("fetch_state").and_then(|s| s.as_str()).unwrap_or("").to_string(),
                app_offset: n("app_offset"),
                committed_offset: n("committed_offset"),
                lo_offset: n("lo_offset"),
                hi_offset: n("hi_offset"),
            }
        })
        .collect()
}

/// Records not yet committed on the partitions a consumer owns, from librdkafka's
/// statistics JSON: per partition `consumer_lag` (high watermark - committed offset),
/// else `consumer_lag_stored` (- stored offset) before the first commit; unknown: 0.
/// None when the statistics list no topic.
fn consumer_lag(stats: &serde_json::Value) -> Option<i64> {
    stats.get("topics")?.as_object()?;
    let lag = owned_partitions(stats)
        .map(|(_, _, p)| {
            let num = |k: &str| p.get(k).and_then(|x| x.as_i64()).unwrap_or(-1);
            [num("consumer_lag"), num("consumer_lag_stored")].into_iter().find(|l| *l >= 0).unwrap_or(0)
        })
        .sum();
    Some(lag)
}

fn tpl_vec(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect()
}

impl ConsumerContext for WorkerContext {
    fn pre_rebalance(&self, c: &rdkafka::consumer::BaseConsumer<Self>, r: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = r {
            let parts = tpl_vec(tpl);
            let ev = if c.assignment_lost() { RebalanceEvent::Lost(parts) } else { RebalanceEvent::Revoked(parts) };
            let _ = self.events.send(ev);
        }
    }
    fn post_rebalance(&self, _c: &rdkafka::consumer::BaseConsumer<Self>, r: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = r {
            let _ = self.events.send(RebalanceEvent::Assigned(tpl_vec(tpl)));
        }
    }
}

pub type WorkerConsumer = StreamConsumer<WorkerContext>;

/// The consumer's fatal error (`rd_kafka_fatal_error`), if it hit one: such a consumer
/// never consumes again and must be given up.
pub fn fatal_error<C: Consumer<X>, X: ConsumerContext>(consumer: &C) -> Option<String> {
    consumer.client().fatal_error().map(|(code, reason)| format!("{code:?}: {reason}"))
}

/// A consumer-group member for `group` with at-least-once settings: offsets are stored
/// by fairway only once everything before them finished, and auto-committed from there.
pub fn consumer(
    cfg: &Config,
    group: &str,
    topics: &[String],
) -> Result<(WorkerConsumer, mpsc::UnboundedReceiver<RebalanceEvent>), KafkaError> {
    consumer_with(cfg, group, topics, None)
}

/// [`consumer`] for a pool topic that also reports its lag as `fairway_consumer_lag{pool}`
/// (librdkafka statistics every 5 s).
pub fn pool_consumer(
    cfg: &Config,
    group: &str,
    topic: &str,
    pool: &'static str,
) -> Result<(WorkerConsumer, mpsc::UnboundedReceiver<RebalanceEvent>), KafkaError> {
    consumer_with(cfg, group, &[topic.to_string()], Some(pool))
}

fn consumer_with(
    cfg: &Config,
    group: &str,
    topics: &[String],
    lag_pool: Option<&'static str>,
) -> Result<(WorkerConsumer, mpsc::UnboundedReceiver<RebalanceEvent>), KafkaError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut conf = base(cfg);
    if lag_pool.is_some() {
        conf.set("statistics.interval.ms", "5000");
    }
    conf.set("group.id", group)
        .set("fetch.wait.max.ms", FETCH_WAIT_MS)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "500")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest");
    match cfg.kafka.group_protocol {
        GroupProtocol::Classic => {
            conf.set("session.timeout.ms", cfg.kafka.session_timeout.as_millis().to_string())
                // Members learn of a rebalance (a member left or joined) from their next
                // heartbeat: a short interval moves partitions within about a second.
                .set("heartbeat.interval.ms", heartbeat_ms(cfg.kafka.session_timeout).to_string())
                .set("partition.assignment.strategy", assignor(cfg).strategy())
        }
        // KIP-848: the broker owns the session and heartbeat settings and the assignor.
        GroupProtocol::Consumer => conf.set("group.protocol", "consumer"),
    };
    let c: WorkerConsumer = conf
        // Execution is decoupled from polling, so long jobs never trip this.
        .set("max.poll.interval.ms", "300000")
        .set("queued.max.messages.kbytes", "16384")
        .create_with_context(WorkerContext {
            events: tx,
            lag_pool,
            idle_fetch: Default::default(),
            restart_asked: Default::default(),
            group_watch: Default::default(),
            classic: !matches!(cfg.kafka.group_protocol, GroupProtocol::Consumer),
        })
        .map_err(client_err(cfg))?;
    let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    c.subscribe(&refs)?;
    Ok((c, rx))
}

/// What to do about a consumer error a configuration causes, for its log line (empty
/// when there is nothing to add).
pub fn error_hint(e: &rdkafka::error::KafkaError) -> &'static str {
    match e.rdkafka_error_code() {
        Some(RDKafkaErrorCode::InconsistentGroupProtocol) => {
            "the group's members use different assignors or protocols (kafka.assignor, kafka.group_protocol): \
             librdkafka cannot mix an eager and a cooperative assignor in one group, so this member gets no \
             partitions; stop every worker of the pool, then start them all with one setting \
             (docs/partitions.md, Sticky assignment)"
        }
        _ => "",
    }
}

/// The classic protocol's assignor: `kafka.assignor`, eager `range` when unset
/// (docs/partitions.md: cooperative-sticky moves fewer partitions but slowed rollouts'
/// hand-offs).
pub fn assignor(cfg: &Config) -> crate::config::Assignor {
    cfg.kafka.assignor.unwrap_or(crate::config::Assignor::Range)
}

/// A group member's heartbeat period: a twentieth of the session timeout, 100 ms to 1 s.
fn heartbeat_ms(session_timeout: Duration) -> u128 {
    heartbeat_interval(session_timeout).as_millis()
}

/// [`heartbeat_ms`] as a duration.
fn heartbeat_interval(session_timeout: Duration) -> Duration {
    (session_timeout / 20).clamp(Duration::from_millis(100), Duration::from_secs(1))
}

/// A topic partition a consumer owns.
pub type TopicPartition = (String, i32);

/// An error of librdkafka's consumer (a record, a pause, a commit point).
pub type ConsumeError = rdkafka::error::KafkaError;

/// The error librdkafka gives an offset fetch the broker did not answer (for the simulated
/// consumer group, whose member is cut off).
pub fn offset_fetch_unanswered() -> ConsumeError {
    ConsumeError::OffsetFetch(rdkafka::types::RDKafkaErrorCode::BrokerTransportFailure)
}

/// The partitions a group consumer holds paused, kept in step with librdkafka.
///
/// librdkafka keeps an application pause on the partition itself, across rebalances: a
/// partition paused, revoked and assigned back (every rebalance of the eager protocol
/// does that to every partition) stays paused although the group handed it over anew.
/// A consumer that forgot its pauses on revocation then never resumed it, and that
/// partition's records stopped arriving for good. So a revoked partition that was
/// paused is remembered as *stale*, and its pause is lifted when it is assigned again;
/// [`Pauses::set`] then pauses what the owner wants paused. Only stale pauses are lifted:
/// every pause or resume bumps the partition's op version in librdkafka, which outdates
/// its in-flight offset and fetch replies (retried, but later). The worker's pool loop
/// and the retry relay both keep their pauses here.
#[derive(Debug, Default)]
pub struct Pauses {
    paused: std::collections::BTreeSet<TopicPartition>,
    /// Paused when revoked: librdkafka still holds them paused.
    stale: HashSet<TopicPartition>,
}

pub(crate) fn tpl<'a>(parts: impl IntoIterator<Item = &'a TopicPartition>) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (topic, p) in parts {
        tpl.add_partition(topic, *p);
    }
    tpl
}

impl Pauses {
    /// The partitions paused now.
    pub fn paused(&self) -> impl Iterator<Item = &TopicPartition> {
        self.paused.iter()
    }

    /// Partitions were assigned: a pause they kept from before their revocation is lifted.
    pub fn assigned<C: Pausable + ?Sized>(&mut self, consumer: &C, parts: &[TopicPartition]) {
        let stale: Vec<TopicPartition> = parts.iter().filter(|tp| self.stale.remove(*tp)).cloned().collect();
        if stale.is_empty() {
            return;
        }
        match consumer.resume(&stale) {
            Ok(()) => tracing::debug!(partitions = ?stale, "lifted pauses kept from before a rebalance"),
            Err(e) => {
                tracing::warn!(partitions = ?stale, error = %e, "could not lift old pauses of assigned partitions")
            }
        }
    }

    /// Partitions were revoked: not ours to pause or resume until assigned again (the
    /// paused ones are remembered, to be lifted then).
    pub fn revoked(&mut self, parts: &[TopicPartition]) {
        for tp in parts {
            if self.paused.remove(tp) {
                self.stale.insert(tp.clone());
            }
        }
    }

    /// Pauses the partitions in `want` and resumes the paused ones not in it.
    pub fn set<C: Pausable + ?Sized>(&mut self, consumer: &C, want: &HashSet<TopicPartition>) {
        let to_pause: Vec<TopicPartition> = want.iter().filter(|tp| !self.paused.contains(*tp)).cloned().collect();
        if !to_pause.is_empty() && consumer.pause(&to_pause).is_ok() {
            self.paused.extend(to_pause);
        }
        let to_resume: Vec<TopicPartition> = self.paused.iter().filter(|tp| !want.contains(*tp)).cloned().collect();
        if !to_resume.is_empty() && consumer.resume(&to_resume).is_ok() {
            for tp in &to_resume {
                self.paused.remove(tp);
            }
        }
    }
}

/// A plain consumer for reading topics (results, DLQ, events, replay scans) outside the
/// worker; no group commits unless asked for.
pub type Reader = StreamConsumer;

pub fn reader(cfg: &Config, group: &str, commit: bool) -> Result<Reader, KafkaError> {
    base(cfg)
        .set("group.id", group)
        .set("fetch.wait.max.ms", FETCH_WAIT_MS)
        .set("enable.auto.commit", if commit { "true" } else { "false" })
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .create()
        .map_err(client_err(cfg))
}

/// A reader of every partition of `topic` from its beginning, by assignment: no group to
/// join, so it reads at once (e.g. a bench reading its results back after a run). Blocks
/// for the topic's metadata (up to 10 s): call it off the async threads.
pub fn reader_from_start(cfg: &Config, group: &str, topic: &str) -> Result<Reader, String> {
    let r = reader(cfg, group, false).map_err(|e| e.to_string())?;
    let md = r.fetch_metadata(Some(topic), Duration::from_secs(10)).map_err(|e| e.to_string())?;
    let parts = md.topics().iter().find(|t| t.name() == topic).map(|t| t.partitions()).unwrap_or_default();
    if parts.is_empty() {
        return Err(format!("topic {topic} has no partitions in the broker's metadata"));
    }
    let mut tpl = TopicPartitionList::new();
    for p in parts {
        tpl.add_partition_offset(topic, p.id(), Offset::Beginning).map_err(|e| e.to_string())?;
    }
    r.assign(&tpl).map_err(|e| e.to_string())?;
    Ok(r)
}

/// Assigns `reader` the partitions of `topic` in `starts`, each from its offset (None: the
/// partition's beginning): a reader that resumes where its own records say, without a group.
pub fn assign_from(reader: &Reader, topic: &str, starts: &[(i32, Option<i64>)]) -> Result<(), KafkaError> {
    let mut tpl = TopicPartitionList::new();
    for (p, start) in starts {
        let offset = start.map(Offset::Offset).unwrap_or(Offset::Beginning);
        tpl.add_partition_offset(topic, *p, offset)?;
    }
    reader.assign(&tpl)?;
    Ok(())
}

/// Partition ids of `topic` with their high watermark at this moment, sorted (blocking
/// metadata calls, run off the async threads). The error says what the broker answered.
pub async fn partition_ends(reader: std::sync::Arc<Reader>, topic: String) -> Result<Vec<(i32, i64)>, String> {
    tokio::task::spawn_blocking(move || -> Result<Vec<(i32, i64)>, String> {
        let timeout = Duration::from_secs(10);
        let md = reader.fetch_metadata(Some(&topic), timeout).map_err(|e| e.to_string())?;
        let Some(mt) = md.topics().iter().find(|m| m.name() == topic) else {
            return Err("not in the broker's metadata".into());
        };
        if let Some(err) = mt.error() {
            return Err(format!("{:?}", rdkafka::types::RDKafkaErrorCode::from(err)));
        }
        if mt.partitions().is_empty() {
            return Err("no partitions".into());
        }
        let mut out = Vec::new();
        for p in mt.partitions() {
            let (_, hw) = reader.fetch_watermarks(&topic, p.id(), timeout).map_err(|e| e.to_string())?;
            out.push((p.id(), hw));
        }
        out.sort_unstable();
        Ok(out)
    })
    .await
    .map_err(|e| e.to_string())?
}

/// The offset `reader` will read next from `topic`'s partition `p`, if it has one.
pub fn position(reader: &Reader, topic: &str, p: i32) -> Option<i64> {
    let tpl = reader.position().ok()?;
    match tpl.find_partition(topic, p)?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// A reader that starts at the topic's end (no commits): live tails such as the events
/// feed of `fairway serve`.
pub fn tail_reader(cfg: &Config, group: &str) -> Result<StreamConsumer, KafkaError> {
    base(cfg)
        .set("group.id", group)
        .set("fetch.wait.max.ms", FETCH_WAIT_MS)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "latest")
        .set("session.timeout.ms", "6000")
        .create()
        .map_err(client_err(cfg))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_member_refused_for_its_assignor_is_told_how_to_mend_it() {
        use rdkafka::error::{KafkaError, RDKafkaErrorCode};
        let refused = KafkaError::MessageConsumption(RDKafkaErrorCode::InconsistentGroupProtocol);
        assert!(super::error_hint(&refused).contains("kafka.assignor"));
        assert_eq!(super::error_hint(&KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure)), "");
    }

    #[test]
    fn fetch_views_list_owned_partitions_with_their_positions() {
        let v = serde_json::json!({"topics": {"p.jobs.short": {"partitions": {
            "0": {"desired": true, "fetch_state": "active", "app_offset": 5, "hi_offset": 9, "lo_offset": 0, "committed_offset": 3},
            "1": {"desired": true, "fetch_state": "offset-query"},
            "2": {"desired": false, "fetch_state": "none"},
            "-1": {"desired": false, "fetch_state": "none"}
        }}}});
        let views = super::fetch_views(&v);
        assert_eq!(views.len(), 2);
        assert_eq!(
            (views[0].partition, views[0].state.as_str(), views[0].app_offset, views[0].hi_offset),
            (0, "active", 5, 9)
        );
        assert_eq!((views[1].partition, views[1].state.as_str(), views[1].app_offset), (1, "offset-query", -1));
        assert!(super::fetch_views(&serde_json::json!({"name": "x"})).is_empty());
    }

    #[test]
    fn consumer_lag_sums_owned_partitions() {
        let v = serde_json::json!({"topics": {"p.jobs.short": {"partitions": {
            "0": {"desired": true, "consumer_lag": 5, "consumer_lag_stored": 4},
            "1": {"desired": true, "consumer_lag": -1, "consumer_lag_stored": 3},
            "2": {"desired": true, "consumer_lag": -1, "consumer_lag_stored": -1},
            "3": {"desired": false, "consumer_lag": 100},
            "-1": {"consumer_lag": 7}
        }}}});
        assert_eq!(super::consumer_lag(&v), Some(8));
        assert_eq!(super::consumer_lag(&serde_json::json!({"name": "x"})), None);
    }

    use crate::config::KafkaProperties;

    #[test]
    fn topics_get_retention_from_the_config() {
        let mut cfg = crate::config::Config::builtin();
        cfg.retention.dlq = std::time::Duration::from_secs(7);
        let r = |t: String| super::topic_retention(&cfg, &t).map(|d| d.as_secs());
        assert_eq!(r(cfg.dlq_topic()), Some(7));
        assert_eq!(r(cfg.results_topic()), Some(86_400));
        assert_eq!(r(cfg.events_topic()), Some(3 * 86_400));
        assert_eq!(r(cfg.retry_topic(crate::model::FailureClass::AppError)), Some(86_400));
        assert_eq!(r(cfg.delayed_topic()), Some(86_400));
        assert_eq!(r(cfg.pool_topic(crate::model::Pool::Short)), None, "pool topics keep the broker's default");
        assert!(super::all_topics(&cfg).contains(&cfg.events_topic()));
    }

    #[test]
    fn tls_without_a_ca_probes_the_system_bundle() {
        let mut p = KafkaProperties::default();
        assert!(!super::needs_ca_probe(&p), "plaintext");
        p.set("security.protocol", "sasl_ssl");
        assert!(super::needs_ca_probe(&p));
        p.set("ssl.ca.location", "/etc/fairway/ca.pem");
        assert!(!super::needs_ca_probe(&p), "a CA given is used as is");
        p.set("security.protocol", "SASL_PLAINTEXT");
        assert!(!super::needs_ca_probe(&p));
    }
}
