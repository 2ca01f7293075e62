//! fairway's producer: librdkafka's idempotent producer, rebuilt when it dies.
//!
//! An idempotent producer can hit a *fatal* error (`rd_kafka_fatal_error`): the broker
//! fenced its producer id (`ProducerFenced`, seen after a worker was cut off from the
//! broker for longer than its messages' timeout), or its sequence numbers can no longer
//! be trusted. From then on that producer instance refuses every record, forever; a
//! worker that kept it would hold partitions whose outcomes it can never publish.
//!
//! fairway uses no transactions, so nothing is fenced *in favour of* another instance:
//! a fresh producer (a new producer id from the broker) may take over at once. That is
//! what [`Producer`] does: its client context's error callback notes a fatal error (log,
//! `fairway_kafka_fatal_errors_total`), the next send builds a new client from the same
//! settings (`fairway_producer_rebuilds_total`), and a send that failed because of the
//! fatal error is sent again on the new client. So an outcome that was not yet durable
//! is retried rather than held. A record the old producer had sent but not seen
//! acknowledged may then be written twice (a duplicate result or retry record, the window
//! the results consumers and the effectively-once check already handle).
//!
//! Rebuilds are bounded (`core::vitals::RebuildBudget`): a producer that keeps dying is
//! given up, its sends fail with [`KafkaError::ProducerGaveUp`] and [`Producer::gave_up`]
//! says why, so the worker leaves its group and exits (`worker::watchdog`).

use super::{client_err, tuned, KafkaError};
use crate::config::Config;
use crate::core::vitals::RebuildBudget;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// The client context of one producer instance: notes a fatal error when librdkafka
/// reports it (its error callback), so the next send rebuilds before trying.
pub struct FatalWatch {
    fatal: Arc<AtomicBool>,
}

impl ClientContext for FatalWatch {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
            if !self.fatal.swap(true, Ordering::SeqCst) {
                metrics::counter!(crate::metrics::KAFKA_FATAL_ERRORS, "client" => "producer").increment(1);
                tracing::error!(%reason, "Kafka producer hit a fatal error; it is rebuilt before the next record");
            }
        } else {
            tracing::debug!(error = %error, %reason, "librdkafka error");
        }
    }
}

type Client = FutureProducer<FatalWatch>;

/// One client instance: its number and the flag its context raises on a fatal error.
#[derive(Clone)]
struct Generation {
    client: Client,
    number: u64,
    fatal: Arc<AtomicBool>,
}

impl Generation {
    fn new(settings: &ClientConfig, number: u64) -> Result<Self, rdkafka::error::KafkaError> {
        let fatal = Arc::new(AtomicBool::new(false));
        let client = settings.create_with_context(FatalWatch { fatal: fatal.clone() })?;
        Ok(Generation { client, number, fatal })
    }

    /// The client hit a fatal error (reported by its error callback, or found asking it).
    fn is_dead(&self) -> bool {
        self.fatal.load(Ordering::SeqCst) || self.client.client().fatal_error().is_some()
    }
}

/// An idempotent producer that replaces its librdkafka client after a fatal error.
/// Cheap to clone: every clone shares the current client.
#[derive(Clone)]
pub struct Producer {
    inner: Arc<Inner>,
}

/// One record of [`Producer::send_many`].
pub struct Outgoing<'a> {
    pub topic: &'a str,
    /// The partition to write to; None lets librdkafka hash the key.
    pub partition: Option<i32>,
    pub key: &'a str,
    pub payload: &'a [u8],
    pub headers: &'a [(&'a str, &'a str)],
}

impl<'a> Outgoing<'a> {
    fn record(&self) -> FutureRecord<'a, str, [u8]> {
        let record = FutureRecord::to(self.topic).key(self.key).payload(self.payload);
        let record = match self.partition {
            Some(p) => record.partition(p),
            None => record,
        };
        if self.headers.is_empty() {
            return record;
        }
        let owned = self
            .headers
            .iter()
            .fold(rdkafka::message::OwnedHeaders::new_with_capacity(self.headers.len()), |h, (k, v)| {
                h.insert(rdkafka::message::Header { key: k, value: Some(*v) })
            });
        record.headers(owned)
    }
}

struct Inner {
    settings: ClientConfig,
    brokers: String,
    /// The current client and its generation (bumped on every rebuild).
    current: RwLock<Generation>,
    budget: Mutex<RebuildBudget>,
    rebuilds: AtomicU64,
    /// Why the producer was given up (its rebuild budget spent), if it was.
    gave_up: Mutex<Option<String>>,
    /// Partition counts of the topics this producer placed records on by partition.
    partitions: Mutex<std::collections::HashMap<String, Known>>,
}

/// A topic's partition count as last read from the broker, and when.
#[derive(Clone, Copy)]
struct Known {
    count: i32,
    at: std::time::Instant,
}

/// How long a topic's partition count is trusted before it is read again: partitions
/// added to a topic take up to this long to receive spread lanes.
const PARTITION_COUNT_TTL: std::time::Duration = std::time::Duration::from_secs(60);
/// How long a topic whose partition count could not be read waits before it is asked
/// again.
const PARTITION_COUNT_RETRY: std::time::Duration = std::time::Duration::from_secs(5);
/// The longest a read of a topic's partition count may take.
const METADATA_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a worker's producer waits to fill a batch: results and hand-offs are on the
/// path from a job's end to its commit point, so they linger little.
const WORKER_LINGER_MS: &str = "10";
/// How long a submitter's producer (API, CLI, library) waits to fill a batch. librdkafka
/// sends one produce request per partition batch, and the local broker's CPU goes with
/// requests, not records: at a steady 30,000 submissions/s over 12 partitions, 25 ms
/// instead of 10 cut the broker's CPU by about a quarter and kept the dispatch wait's p99
/// under 150 ms where 10 ms let it climb to seconds (docs/performance.md, 2026-11-26
/// night). A lone submission's answer waits up to this long for its batch.
const SUBMIT_LINGER_MS: &str = "25";
/// How long a producer of whole batches (`POST /v1/jobs:batch`) waits: a batch's records
/// are handed over together, so they fill their partitions' batches at once and a long
/// linger only adds to every request's answer (a batch of 1,000 over 12 partitions with
/// 4 requests in flight: 55-58k jobs/s at 25 ms, 71-78k at 5 ms).
const BULK_LINGER_MS: &str = "5";

/// Idempotent producer for tools and services that are not pool workers: retries
/// inside librdkafka never duplicate or reorder records.
pub fn producer(cfg: &Config) -> Result<Producer, KafkaError> {
    producer_lingering(cfg, WORKER_LINGER_MS, DELIVERY_TIMEOUT)
}

/// [`producer`] for a pool worker: a record is acknowledged within
/// [`worker_delivery_timeout`] or fails.
pub fn worker_producer(cfg: &Config) -> Result<Producer, KafkaError> {
    producer_lingering(cfg, WORKER_LINGER_MS, worker_delivery_timeout(cfg.kafka.session_timeout))
}

/// How long a record may wait for its acknowledgement (`message.timeout.ms`) outside a
/// pool worker.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a pool worker's record may wait for its acknowledgement: the consumer group's
/// session timeout less a group heartbeat and a second (1 s at least, 30 s at most). A
/// worker cut off from the broker loses its partitions at its session timeout
/// (`worker::ownership`); a record it queued before the cut is delivered before another
/// member can own the job's partition, or never, so it never lands after the link is back
/// for a job another worker took. The kernel keeps to it too: the process's producer sockets
/// drop data unacknowledged for this long (`kafka::socket`).
pub fn worker_delivery_timeout(session_timeout: Duration) -> Duration {
    let heartbeat = super::heartbeat_interval(session_timeout);
    let left = session_timeout.saturating_sub(heartbeat).saturating_sub(Duration::from_secs(1));
    left.clamp(Duration::from_secs(1), DELIVERY_TIMEOUT)
}

/// [`producer`] for submitters, which batch longer ([`SUBMIT_LINGER_MS`]).
pub fn submit_producer(cfg: &Config) -> Result<Producer, KafkaError> {
    producer_lingering(cfg, SUBMIT_LINGER_MS, DELIVERY_TIMEOUT)
}

/// [`producer`] for whole batches of submissions ([`BULK_LINGER_MS`]).
pub fn bulk_producer(cfg: &Config) -> Result<Producer, KafkaError> {
    producer_lingering(cfg, BULK_LINGER_MS, DELIVERY_TIMEOUT)
}

fn producer_lingering(cfg: &Config, linger_ms: &str, delivery: Duration) -> Result<Producer, KafkaError> {
    // Batching is tuning (`kafka.properties` may change it); durability is not.
    // A producer whose connections a cut ended (`kafka::socket`) reconnects within a
    // second of the link's return, not librdkafka's 10 s backoff.
    let tuning = [("linger.ms", linger_ms), ("compression.type", "lz4"), ("reconnect.backoff.max.ms", "1000")];
    let mut settings = tuned(cfg, &tuning);
    let timeout = delivery.as_millis().to_string();
    settings.set("enable.idempotence", "true").set("acks", "all").set("message.timeout.ms", timeout);
    let first = Generation::new(&settings, 0).map_err(client_err(cfg))?;
    if !super::socket::hooked() {
        return Err(KafkaError::Client {
            brokers: cfg.kafka.brokers.clone(),
            message: "this build does not hook librdkafka's sockets (build.rs links with --wrap=rd_kafka_new): \
                      a produce request cut off by the network could land long after its delivery timeout"
                .into(),
        });
    }
    Ok(Producer {
        inner: Arc::new(Inner {
            brokers: cfg.kafka.brokers.clone(),
            settings,
            current: RwLock::new(first),
            budget: Mutex::new(RebuildBudget::default()),
            rebuilds: AtomicU64::new(0),
            gave_up: Mutex::new(None),
            partitions: Mutex::new(Default::default()),
        }),
    })
}

impl Producer {
    /// The librdkafka client to send on now (rebuilt first if it reported a fatal error).
    pub fn client(&self) -> Result<(Client, u64), KafkaError> {
        let current = self.inner.current.read().expect("producer lock").clone();
        let current = if current.is_dead() { self.rebuild(current.number)? } else { current };
        Ok((current.client, current.number))
    }

    /// Rebuilds that replaced a dead client so far.
    pub fn rebuilds(&self) -> u64 {
        self.inner.rebuilds.load(Ordering::SeqCst)
    }

    /// Why the producer was given up (it kept dying faster than its rebuild budget).
    pub fn gave_up(&self) -> Option<String> {
        self.inner.gave_up.lock().expect("producer gave_up lock").clone()
    }

    /// Replaces the client of `generation` (unless another caller already did) and
    /// returns the new one. Refused once the rebuild budget is spent.
    fn rebuild(&self, generation: u64) -> Result<Generation, KafkaError> {
        let mut current = self.inner.current.write().expect("producer lock");
        if current.number != generation {
            return Ok(current.clone());
        }
        if let Some(why) = self.gave_up() {
            return Err(KafkaError::ProducerGaveUp(why));
        }
        let now = crate::now_ms();
        let reason = current.client.client().fatal_error().map(|(code, msg)| format!("{code:?}: {msg}"));
        let reason = reason.unwrap_or_else(|| "fatal error".to_string());
        if !self.inner.budget.lock().expect("rebuild budget").allow(now) {
            let why = format!("the Kafka producer died again ({reason}) after {} rebuilds", self.rebuilds());
            tracing::error!(why, "giving the producer up");
            *self.inner.gave_up.lock().expect("producer gave_up lock") = Some(why.clone());
            return Err(KafkaError::ProducerGaveUp(why));
        }
        let next = Generation::new(&self.inner.settings, generation + 1).map_err(|e| KafkaError::Client {
            brokers: self.inner.brokers.clone(),
            message: format!("rebuilding the producer: {e}"),
        })?;
        let old = std::mem::replace(&mut *current, next);
        self.inner.rebuilds.fetch_add(1, Ordering::SeqCst);
        metrics::counter!(crate::metrics::PRODUCER_REBUILDS).increment(1);
        tracing::warn!(%reason, generation = generation + 1, "Kafka producer rebuilt after a fatal error; unacknowledged records are sent again");
        // Destroying a client waits for its threads: not on this (async) thread.
        std::thread::spawn(move || drop(old));
        Ok(current.clone())
    }

    /// The number of partitions of `topic`, cached for [`PARTITION_COUNT_TTL`]. None
    /// while it cannot be read (logged and counted; asked again after
    /// [`PARTITION_COUNT_RETRY`]): the caller then lets the key's hash place the record.
    pub async fn partition_count(&self, topic: &str) -> Option<i32> {
        let cached = self.inner.partitions.lock().expect("partition counts").get(topic).copied();
        match cached {
            Some(k) if k.count > 0 && k.at.elapsed() < PARTITION_COUNT_TTL => return Some(k.count),
            Some(k) if k.count == 0 && k.at.elapsed() < PARTITION_COUNT_RETRY => return None,
            _ => {}
        }
        let read = match self.client() {
            Ok((client, _)) => {
                let name = topic.to_string();
                tokio::task::spawn_blocking(move || {
                    let md =
                        client.client().fetch_metadata(Some(&name), METADATA_TIMEOUT).map_err(|e| e.to_string())?;
                    let n = md.topics().first().map_or(0, |t| t.partitions().len());
                    i32::try_from(n)
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| "no partitions (run `fairway init`)".to_string())
                })
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
            }
            Err(e) => Err(e.to_string()),
        };
        let count = match read {
            Ok(n) => n,
            Err(error) => {
                metrics::counter!(crate::metrics::PARTITION_COUNT_FAILURES).increment(1);
                // The last count read stays in force; none known: placed by the key's hash.
                let last = cached.map_or(0, |k| k.count);
                tracing::warn!(topic, %error, last, "cannot read the topic's partition count; records are placed by key hash until it is read");
                last
            }
        };
        let known = Known { count, at: std::time::Instant::now() };
        self.inner.partitions.lock().expect("partition counts").insert(topic.to_string(), known);
        (count > 0).then_some(count)
    }

    /// Produces one record and waits for the broker's acknowledgement. A failure caused
    /// by a fatal error of the client is sent again on a rebuilt client.
    pub async fn send(
        &self,
        topic: &str,
        key: &str,
        payload: &[u8],
        headers: &[(&str, &str)],
    ) -> Result<(i32, i64), KafkaError> {
        self.send_to(topic, None, key, payload, headers).await
    }

    /// [`Producer::send`] to `partition` (None: by the key's hash).
    pub async fn send_to(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: &str,
        payload: &[u8],
        headers: &[(&str, &str)],
    ) -> Result<(i32, i64), KafkaError> {
        loop {
            let (client, generation) = self.client()?;
            let record = Outgoing { topic, partition, key, payload, headers }.record();
            match client.send(record, rdkafka::util::Timeout::Never).await {
                Ok(d) => return Ok((d.partition, d.offset)),
                Err((source, _))
                    if is_fatal(&self.inner.current.read().expect("producer lock"), generation, &source) =>
                {
                    tracing::debug!(topic, error = %source, "send failed on a dead producer; rebuilding and sending again");
                    self.rebuild(generation)?;
                }
                Err((source, _)) => return Err(KafkaError::Produce { topic: topic.to_string(), source }),
            }
        }
    }

    /// Produces many records at once: each is handed to librdkafka without a future of
    /// its own, then the acknowledgements are awaited together (a submission batch of a
    /// thousand jobs holds a thousand small delivery futures, not a thousand sends). One
    /// answer per record, in order, as [`Producer::send`] gives it; a record librdkafka
    /// refuses at once (its queue full) or that fails on a dead client goes through
    /// [`Producer::send`], which waits for room and rebuilds the client.
    pub async fn send_many(&self, records: &[Outgoing<'_>]) -> Vec<Result<(i32, i64), KafkaError>> {
        let Ok((client, generation)) = self.client() else {
            // The client could not be rebuilt: each send says why.
            let sends =
                records.iter().map(|r| Box::pin(self.send_to(r.topic, r.partition, r.key, r.payload, r.headers)));
            return futures::future::join_all(sends).await;
        };
        let handed: Vec<_> = records.iter().map(|r| client.send_result(r.record()).map_err(|(e, _)| e)).collect();
        let acks = handed.into_iter().zip(records).map(|(handed, r)| async move {
            let failed = match handed {
                Ok(delivery) => match delivery.await {
                    Ok(Ok(d)) => return Ok((d.partition, d.offset)),
                    Ok(Err((e, _))) => e,
                    Err(_) => rdkafka::error::KafkaError::Canceled,
                },
                Err(e) => e,
            };
            let queue_full = failed.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull);
            let fatal = is_fatal(&self.inner.current.read().expect("producer lock"), generation, &failed);
            if queue_full || fatal {
                return Box::pin(self.send_to(r.topic, r.partition, r.key, r.payload, r.headers)).await;
            }
            Err(KafkaError::Produce { topic: r.topic.to_string(), source: failed })
        });
        futures::future::join_all(acks).await
    }

    /// Produces one record without waiting for the acknowledgement. False when the
    /// producer's queue is full or the record is refused at once.
    pub fn send_nowait(&self, topic: &str, key: &str, payload: &[u8]) -> bool {
        match self.client() {
            Ok((client, _)) => client.send_result(FutureRecord::to(topic).key(key).payload(payload)).is_ok(),
            Err(_) => false,
        }
    }
}

/// A send on client `generation` failed because that client died (a fatal error), not
/// for the record itself: the client was replaced since, or it is dead now.
///
/// Without transactions librdkafka does not always raise a broker's fencing as a fatal
/// error: seen with tansu after a 30 s cut, every delivery failed with `ProducerFenced`
/// while `rd_kafka_fatal_error` stayed empty. Those producer-id errors kill the client
/// just the same (it never sends again), so they count as fatal here.
fn is_fatal(current: &Generation, generation: u64, e: &rdkafka::error::KafkaError) -> bool {
    let dead_client = matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::Fatal
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::UnknownProducerId
                | RDKafkaErrorCode::InvalidProducerIdMapping
                | RDKafkaErrorCode::OutOfOrderSequenceNumber
        )
    );
    if dead_client && current.number == generation {
        current.fatal.store(true, Ordering::SeqCst);
    }
    dead_client || current.number != generation || current.is_dead()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_records_are_delivered_within_its_session_or_never() {
        let s = Duration::from_secs;
        // 10 s session, 500 ms heartbeat: 8.5 s.
        assert_eq!(worker_delivery_timeout(s(10)), Duration::from_millis(8_500));
        // 6 s session, 300 ms heartbeat: 4.7 s.
        assert_eq!(worker_delivery_timeout(s(6)), Duration::from_millis(4_700));
        assert_eq!(worker_delivery_timeout(Duration::from_millis(1_500)), s(1), "1 s at least");
        assert_eq!(worker_delivery_timeout(s(300)), s(30), "30 s at most");
        for secs in 1..=120 {
            let t = worker_delivery_timeout(s(secs));
            assert!(t < s(secs).max(s(2)), "{secs} s session: {t:?}");
        }
    }
}
