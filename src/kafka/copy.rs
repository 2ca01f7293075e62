//! Disaster recovery's broker I/O (`ops::backup`): a consumer group's committed offsets,
//! a partition's watermarks, a partition's records over an offset range read by
//! assignment (no group joined, nothing committed), and records produced back into a
//! given partition in order with their keys, timestamps and headers.

use super::{base, client_err, KafkaError};
use crate::config::Config;
use crate::core::dr::{Range, Record};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(10);
/// Records produced before their acknowledgements are awaited.
const IN_FLIGHT: usize = 1000;

fn consumer(cfg: &Config, group: &str) -> Result<BaseConsumer, KafkaError> {
    base(cfg)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .create()
        .map_err(client_err(cfg))
}

/// Partition ids of `topic` with their (low, high) watermarks. Blocking: call it off the
/// async threads.
pub fn watermarks(cfg: &Config, topic: &str) -> Result<Vec<(i32, i64, i64)>, KafkaError> {
    let c = consumer(cfg, &cfg.group("backup"))?;
    let md = c.fetch_metadata(Some(topic), TIMEOUT)?;
    let mut out = Vec::new();
    for t in md.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            let (low, high) = c.fetch_watermarks(topic, p.id(), TIMEOUT)?;
            out.push((p.id(), low, high));
        }
    }
    if out.is_empty() {
        return Err(KafkaError::Ping(format!("topic {topic} is not in the broker's metadata (run `fairway init`)")));
    }
    out.sort_unstable();
    Ok(out)
}

/// `group`'s committed offset of each of `topic`'s `partitions` (None: nothing committed).
/// Reads only: the group is not joined. Blocking: call it off the async threads.
pub fn committed(
    cfg: &Config,
    group: &str,
    topic: &str,
    partitions: &[i32],
) -> Result<Vec<(i32, Option<i64>)>, KafkaError> {
    let c = consumer(cfg, group)?;
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        tpl.add_partition(topic, *p);
    }
    let got = c.committed_offsets(tpl, TIMEOUT)?;
    Ok(partitions
        .iter()
        .map(|p| {
            let off = got.find_partition(topic, *p).and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            });
            (*p, off)
        })
        .collect())
}

/// Commits `offsets` (partition → next offset) of `topic` for `group`, without joining it
/// (the group must have no live member). Blocking: call it off the async threads.
pub fn commit(
    cfg: &Config,
    group: &str,
    topic: &str,
    offsets: &std::collections::BTreeMap<i32, i64>,
) -> Result<(), KafkaError> {
    if offsets.is_empty() {
        return Ok(());
    }
    let c = consumer(cfg, group)?;
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o))?;
    }
    c.commit(&tpl, rdkafka::consumer::CommitMode::Sync)?;
    Ok(())
}

/// Passes each record of `topic`'s `partition` in `range` to `each` (offset, record), in
/// order; offsets missing from the log (compaction, transaction markers) are skipped.
/// Blocking: call it off the async threads. `each`'s error stops the read.
pub fn read_range(
    cfg: &Config,
    topic: &str,
    partition: i32,
    range: Range,
    mut each: impl FnMut(i64, Record) -> Result<(), String>,
) -> Result<(), String> {
    if range.from >= range.to {
        return Ok(());
    }
    let c = consumer(cfg, &cfg.group("backup")).map_err(|e| e.to_string())?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(range.from)).map_err(|e| e.to_string())?;
    c.assign(&tpl).map_err(|e| e.to_string())?;
    let mut idle = 0;
    loop {
        match c.poll(Duration::from_millis(500)) {
            Some(Ok(m)) => {
                idle = 0;
                if m.offset() >= range.to {
                    return Ok(());
                }
                let headers = m
                    .headers()
                    .map(|h| h.iter().map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec())).collect())
                    .unwrap_or_default();
                let record = Record {
                    key: m.key().map(<[u8]>::to_vec),
                    value: m.payload().map(<[u8]>::to_vec),
                    timestamp: m.timestamp().to_millis(),
                    headers,
                };
                each(m.offset(), record)?;
                if m.offset() + 1 >= range.to {
                    return Ok(());
                }
            }
            Some(Err(e)) => return Err(format!("reading {topic} partition {partition}: {e}")),
            None => {
                // Nothing more below `to`: the rest of the range is gone (markers) or the
                // broker stopped answering; after 20 s of silence the copy fails.
                let pos = c.position().ok().and_then(|t| match t.find_partition(topic, partition)?.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                });
                if pos.is_some_and(|p| p >= range.to) {
                    return Ok(());
                }
                idle += 1;
                if idle >= 40 {
                    return Err(format!(
                        "reading {topic} partition {partition}: no record for 20 s before offset {} (at {pos:?})",
                        range.to
                    ));
                }
            }
        }
    }
}

/// The producer of a restore (see [`restore_producer`]).
pub type RestoreProducer = FutureProducer;

/// An idempotent producer for a restore: records go to the partition given, in order.
pub fn restore_producer(cfg: &Config) -> Result<RestoreProducer, KafkaError> {
    base(cfg)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "20")
        .set("message.timeout.ms", "120000")
        .create()
        .map_err(client_err(cfg))
}

/// Produces `records` into `topic`'s `partition` in order and waits for every
/// acknowledgement.
pub async fn produce_into(
    producer: &RestoreProducer,
    topic: &str,
    partition: i32,
    records: &[Record],
) -> Result<(), KafkaError> {
    for chunk in records.chunks(IN_FLIGHT) {
        let mut acks = Vec::with_capacity(chunk.len());
        for r in chunk {
            let mut headers = OwnedHeaders::new();
            for (k, v) in &r.headers {
                headers = headers.insert(Header { key: k.as_str(), value: Some(v.as_slice()) });
            }
            let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic).partition(partition).headers(headers);
            if let Some(k) = &r.key {
                rec = rec.key(k.as_slice());
            }
            if let Some(v) = &r.value {
                rec = rec.payload(v.as_slice());
            }
            if let Some(ts) = r.timestamp {
                rec = rec.timestamp(ts);
            }
            let ack = producer
                .send_result(rec)
                .map_err(|(e, _)| KafkaError::Produce { topic: topic.to_string(), source: e })?;
            acks.push(ack);
        }
        for ack in acks {
            match ack.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => return Err(KafkaError::Produce { topic: topic.to_string(), source: e }),
                Err(_) => return Err(KafkaError::ProducerGaveUp(format!("producing to {topic}: cancelled"))),
            }
        }
    }
    Ok(())
}
