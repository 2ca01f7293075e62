//! The broker as the worker's seams see it (`crate::seams`): the producer's sends
//! ([`RouteBroker`]), and the pool topic's consumer group ([`PoolGroup`], [`PoolConsumer`]).

use super::{
    tpl, ConsumeError, Consumer, KafkaError, Message, Producer, RebalanceEvent, TopicPartition, WorkerConsumer,
};
use crate::config::Config;
use crate::seams::{CommitPoint, Io, Pausable, PoolConsumer, PoolGroup, PoolRecord, RouteBroker};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::mpsc;

impl RouteBroker for Producer {
    fn send<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        payload: &'a [u8],
        headers: &'a [(&'a str, &'a str)],
    ) -> Io<'a, Result<(i32, i64), KafkaError>> {
        Box::pin(Producer::send(self, topic, key, payload, headers))
    }
    fn send_nowait(&self, topic: &str, key: &str, payload: &[u8]) -> bool {
        Producer::send_nowait(self, topic, key, payload)
    }
}

impl Pausable for WorkerConsumer {
    fn pause(&self, parts: &[TopicPartition]) -> Result<(), ConsumeError> {
        Consumer::pause(self, &tpl(parts))
    }
    fn resume(&self, parts: &[TopicPartition]) -> Result<(), ConsumeError> {
        Consumer::resume(self, &tpl(parts))
    }
}

/// A consumed message copied out of librdkafka's buffer.
fn record(msg: &super::BorrowedMessage<'_>) -> PoolRecord {
    use super::Headers;
    let submitted = msg.headers().is_some_and(|h| h.iter().any(|h| h.key == crate::core::frontier::SUBMITTED_HEADER));
    PoolRecord {
        partition: msg.partition(),
        offset: msg.offset(),
        payload: msg.payload().unwrap_or_default().to_vec(),
        submitted,
        timestamp: msg.timestamp().to_millis(),
    }
}

impl PoolConsumer for WorkerConsumer {
    async fn recv(&self) -> Result<PoolRecord, ConsumeError> {
        rdkafka::consumer::StreamConsumer::recv(self).await.map(|msg| record(&msg))
    }
    fn try_recv(&self) -> Option<Result<PoolRecord, ConsumeError>> {
        use futures::FutureExt;
        rdkafka::consumer::StreamConsumer::recv(self).now_or_never().map(|r| r.map(|msg| record(&msg)))
    }
    fn store_offsets(&self, topic: &str, commits: &[CommitPoint]) -> Result<(), ConsumeError> {
        let list = commit_list(topic, commits.iter())?;
        Consumer::store_offsets(self, &list)?;
        if commits.iter().any(|c| c.now) {
            Consumer::commit(self, &commit_list(topic, commits.iter().filter(|c| c.now))?, super::CommitMode::Async)?;
        }
        Ok(())
    }
    fn committed_metadata(&self, topic: &str, partitions: &[i32]) -> Result<Vec<(i32, i64, String)>, ConsumeError> {
        let mut list = super::TopicPartitionList::new();
        for &p in partitions {
            list.add_partition(topic, p);
        }
        let committed = off_the_runtime(|| Consumer::committed_offsets(self, list, COMMITTED_TIMEOUT))?;
        Ok(committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                super::Offset::Offset(next) => Some((e.partition(), next, e.metadata().to_string())),
                _ => None,
            })
            .collect())
    }
    fn fatal_error(&self) -> Option<String> {
        super::fatal_error(self)
    }
    fn restart_fetchers(
        &self,
        books: &HashMap<TopicPartition, i64>,
        resume: &[TopicPartition],
    ) -> Result<Option<Vec<super::stall::Start>>, KafkaError> {
        super::stall::restart_fetchers(self, books, resume)
    }
    fn leave(&self) {
        if let Err(e) = self.commit_consumer_state(super::CommitMode::Sync) {
            tracing::debug!(error = %e, "commit before leaving the group");
        }
        self.unsubscribe();
    }
}

/// How long the group's committed offsets are waited for at an assignment.
const COMMITTED_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs a blocking librdkafka call (up to its timeout) from async code without holding a
/// runtime worker: on a multi-thread runtime the worker's other tasks (job routes,
/// heartbeats) move to another thread meanwhile; elsewhere (a current-thread runtime, no
/// runtime) it runs in place.
fn off_the_runtime<T>(call: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(call),
        _ => call(),
    }
}

/// Commit points as librdkafka takes them, each with its metadata.
fn commit_list<'a>(
    topic: &str,
    commits: impl Iterator<Item = &'a CommitPoint>,
) -> Result<super::TopicPartitionList, ConsumeError> {
    let mut list = super::TopicPartitionList::new();
    for c in commits {
        list.add_partition_offset(topic, c.partition, super::Offset::Offset(c.next))?;
        if let (Some(md), Some(mut e)) = (&c.metadata, list.find_partition(topic, c.partition)) {
            e.set_metadata(md.as_str());
        }
    }
    Ok(list)
}

/// A pool's consumer group on the broker: each member a librdkafka consumer
/// ([`super::pool_consumer`]).
pub struct KafkaPoolGroup {
    pub cfg: Arc<Config>,
    pub group: String,
    pub topic: String,
    pub pool: &'static str,
}

impl PoolGroup for KafkaPoolGroup {
    type Consumer = WorkerConsumer;
    fn join(&self) -> Result<(WorkerConsumer, mpsc::UnboundedReceiver<RebalanceEvent>), KafkaError> {
        super::pool_consumer(&self.cfg, &self.group, &self.topic, self.pool)
    }
}
