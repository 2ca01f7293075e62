//! An owned partition whose fetcher librdkafka stopped for good, and its restart.
//!
//! When the group coordinator answers the committed-offset query of a newly assigned
//! partition with a partition-level error (seen with the tansu broker right after a
//! network cut), librdkafka keeps the partition in the assignment but never starts its
//! fetcher (`fetch_state=stopped`) "until the application unassigns it and possibly
//! re-assigns it" (rdkafka_assignment.c). A seek cannot help (it is refused on a stopped
//! fetcher). So the consumer's current assignment is assigned again (whole under the
//! classic eager protocol; unassigned and assigned back incrementally under KIP-848), every partition at an absolute offset where the
//! worker's books know one: the one after the last record it took in during the current
//! assignment (nothing lost, nothing read twice), else the committed offset, which
//! librdkafka queries anew. Pauses are librdkafka's per-partition flags and survive it.

use super::{Consumer, ConsumerContext, KafkaError, Offset, TopicPartitionList};
use std::collections::HashMap;
use std::time::Duration;

/// An owned partition whose fetcher has not been active this long is stalled: reported
/// (`fairway_partitions_not_fetching`) and restarted.
pub const STALLED_AFTER: Duration = Duration::from_secs(15);

/// At most one restart of a consumer's fetchers this often (each one restarts them all).
pub const RESTART_EVERY: Duration = Duration::from_secs(30);

/// Whether the fetchers are due for a restart: a partition has been stalled for
/// [`STALLED_AFTER`] and the last restart (if any) was [`RESTART_EVERY`] ago or more.
pub fn restart_due(idle_for: Duration, since_last_restart: Option<Duration>) -> bool {
    idle_for >= STALLED_AFTER && since_last_restart.is_none_or(|s| s >= RESTART_EVERY)
}

/// Where a partition's fetcher restarts, from the highest offset the worker took in from
/// it in the current assignment (negative: none): right after it, else the committed
/// offset (`Invalid` in an assignment: librdkafka queries the committed offset, and
/// applies `auto.offset.reset` when there is none).
pub fn restart_offset(last_taken: i64) -> Offset {
    if last_taken >= 0 {
        Offset::Offset(last_taken + 1)
    } else {
        Offset::Invalid
    }
}

/// A restarted partition: topic, partition, the offset its fetcher starts at.
pub type Start = (String, i32, Offset);

/// Assigns the consumer's current assignment again, each partition at
/// [`restart_offset`] of the highest offset the caller took in from it (`books`: every
/// partition the caller owns, by topic and partition). Returns the partitions and their
/// start offsets, or None (nothing done) when the assignment is not the one in the books:
/// a rebalance is under way, and its callback reassigns anyway. Local to the client (no
/// broker round trip): quick enough for the caller's loop, which must not take in records
/// meanwhile.
pub fn restart_fetchers<C: Consumer<X>, X: ConsumerContext>(
    consumer: &C,
    books: &HashMap<(String, i32), i64>,
) -> Result<Option<Vec<Start>>, KafkaError> {
    let current = consumer.assignment()?;
    if current.count() != books.len() {
        return Ok(None);
    }
    let mut tpl = TopicPartitionList::new();
    let mut starts = Vec::new();
    for e in current.elements() {
        let Some(last) = books.get(&(e.topic().to_string(), e.partition())) else { return Ok(None) };
        let at = restart_offset(*last);
        tpl.add_partition_offset(e.topic(), e.partition(), at)?;
        starts.push((e.topic().to_string(), e.partition(), at));
    }
    if !starts.is_empty() {
        if matches!(consumer.rebalance_protocol(), rdkafka::consumer::RebalanceProtocol::Cooperative) {
            // KIP-848 and cooperative assignors hand out partitions one by one: a whole
            // assignment cannot be set, but the same partitions can leave and come back.
            consumer.incremental_unassign(&tpl)?;
            consumer.incremental_assign(&tpl)?;
        } else {
            consumer.assign(&tpl)?;
        }
    }
    Ok(Some(starts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_waits_for_a_stall_and_then_every_30_s() {
        let s = Duration::from_secs;
        assert!(!restart_due(s(14), None), "not stalled long enough");
        assert!(restart_due(s(15), None));
        assert!(!restart_due(s(60), Some(s(29))), "restarted recently");
        assert!(restart_due(s(60), Some(s(30))));
    }

    #[test]
    fn restart_continues_after_the_last_record_taken_else_from_the_commit() {
        assert_eq!(restart_offset(41), Offset::Offset(42));
        assert_eq!(restart_offset(0), Offset::Offset(1));
        assert_eq!(restart_offset(-1), Offset::Invalid, "nothing taken: the committed offset");
    }
}
