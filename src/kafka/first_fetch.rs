//! Where a newly assigned partition that its group never committed starts, and how soon.
//!
//! librdkafka takes a partition without a committed offset for an error: it applies
//! `auto.offset.reset` (`earliest` for every fairway consumer) only after a fixed back-off
//! of 100 ms (`rd_kafka_offset_reset`). Every partition of a new pool topic, of a new
//! group, or added by a partition increase waits so before its first record; a first
//! burst of 60,000 jobs runs in about a second, so a tenth of it went to that wait.
//!
//! So the rebalance callback asks the group's committed offsets of the partitions it is
//! handed (one `OffsetFetch`, bounded by [`ASK_TIMEOUT`]) and assigns those without one at
//! the beginning explicitly, which librdkafka starts fetching at once. Those with one are
//! assigned as before (librdkafka reads the committed offset itself). The answer is the
//! one librdkafka's own query gets a moment later: under both group protocols a partition
//! is handed out only once its previous owner revoked it, and that owner commits before
//! its revocation ends (`enable.auto.commit`, and `leave` commits first); a member that
//! lost its partitions is fenced from committing for them. When the ask fails, the
//! assignment goes on unchanged and librdkafka resets those partitions itself, 100 ms
//! later: slower, never elsewhere.

use super::{Consumer, ConsumerContext, Offset, TopicPartitionList};
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::util::Timeout;
use std::time::Duration;

/// How long the rebalance callback waits for the committed offsets (it blocks its
/// consumer's poll meanwhile). The coordinator that just answered the join answers this in
/// a few milliseconds; past this, the assignment proceeds unchanged.
pub const ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// One partition of the group's answer: its topic, partition, committed offset, and
/// whether it came without a partition-level error.
pub type Answer<'a> = (&'a str, i32, Offset, bool);

/// The partitions of an assignment whose group has no committed offset for them, from
/// the group's answer: those without an error and with no offset.
pub fn never_committed<'a>(answer: impl IntoIterator<Item = Answer<'a>>) -> Vec<(String, i32)> {
    answer
        .into_iter()
        .filter(|(_, _, offset, ok)| *ok && *offset == Offset::Invalid)
        .map(|(topic, partition, _, _)| (topic.to_string(), partition))
        .collect()
}

/// Sets the start of every partition of `assigned` that its group never committed to the
/// beginning, so its first fetch is not held back (see the module doc). Answers how many
/// were set; on a failed ask, nothing is changed and the error is answered.
pub fn start_never_committed<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    assigned: &mut TopicPartitionList,
) -> Result<usize, KafkaError> {
    // Only partitions librdkafka would look up: one given an absolute offset keeps it.
    if assigned.elements().iter().any(|e| e.offset() != Offset::Invalid) || assigned.count() == 0 {
        return Ok(0);
    }
    let committed = consumer.committed_offsets(assigned.clone(), Timeout::After(ASK_TIMEOUT))?;
    let elements = committed.elements();
    let fresh = never_committed(elements.iter().map(|e| (e.topic(), e.partition(), e.offset(), e.error().is_ok())));
    for (topic, partition) in &fresh {
        assigned.set_partition_offset(topic, *partition, Offset::Beginning)?;
    }
    Ok(fresh.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_partitions_answered_without_an_offset_and_without_an_error_start_at_the_beginning() {
        let answer = [
            ("jobs", 0, Offset::Invalid, true),
            ("jobs", 1, Offset::Offset(42), true),
            ("jobs", 2, Offset::Offset(0), true),
            ("jobs", 3, Offset::Invalid, false),
            ("other", 0, Offset::Invalid, true),
        ];
        assert_eq!(never_committed(answer), vec![("jobs".to_string(), 0), ("other".to_string(), 0)]);
    }
}
