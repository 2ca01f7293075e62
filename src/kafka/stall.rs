//! An owned partition that makes no progress, and its restart.
//!
//! [`Watch`] reads librdkafka's statistics every 5 s and calls a partition *stalled* when,
//! for [`STALLED_AFTER`], its fetcher is not active, or the broker holds records beyond
//! every position the worker has (the application's, the committed one, the log start)
//! and the application's position has not moved, or no fetch of it has ever answered (its
//! high watermark unknown: a partition librdkafka keeps paused although the worker resumed
//! it, whose pause or resume was lost right after an assignment, confluentinc/librdkafka
//! #2190 and #5591, shows no watermark and would pass the two other tests). The loop that owns the partition
//! then restarts the fetchers and resumes it, unless it keeps it paused on purpose (a full
//! buffer, spill writes behind): only it knows its pauses.
//!
//! The first kind:
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
use std::time::{Duration, Instant};

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

/// How long a consumer's group membership may stay unsettled (librdkafka's `cgrp` state
/// other than `up`, or its join state other than `steady`) before the worker replaces the
/// consumer: seen after a broker restart under load, a consumer whose coordinator
/// requests sat in its queue unsent for minutes never joined the group again, while a new
/// client of the same process joined at once. A settled member with no partition (more
/// workers than partitions) is not unsettled.
pub const GROUP_STUCK_AFTER: Duration = Duration::from_secs(60);

/// Whether librdkafka's group states (`cgrp.state`, `cgrp.join_state` in its statistics)
/// are those of a member in the group and not rebalancing. Under the classic protocol a
/// member is `steady` once its assignment (empty or not) is applied; under KIP-848
/// (`classic` false) one without partitions may stay in join state `init`, so only the
/// coordinator state counts there.
pub fn group_settled(state: &str, join_state: &str, classic: bool) -> bool {
    state == "up" && (!classic || join_state == "steady")
}

/// Whether a consumer unsettled for `unsettled_for` is due for replacement: past
/// [`GROUP_STUCK_AFTER`], and at most once per [`GROUP_STUCK_AFTER`].
pub fn group_stuck(unsettled_for: Duration, since_last_replaced: Option<Duration>) -> bool {
    unsettled_for >= GROUP_STUCK_AFTER && since_last_replaced.is_none_or(|s| s >= GROUP_STUCK_AFTER)
}

/// One owned partition as librdkafka's statistics show it (-1: unknown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchView {
    pub topic: String,
    pub partition: i32,
    /// librdkafka's `fetch_state` (`active` when fetching).
    pub state: String,
    /// The offset after the last record handed to the application.
    pub app_offset: i64,
    pub committed_offset: i64,
    pub lo_offset: i64,
    /// The high watermark: the offset after the last record on the broker.
    pub hi_offset: i64,
}

impl FetchView {
    /// Whether the fetcher is not fetching.
    fn not_fetching(&self) -> bool {
        self.state != "active"
    }

    /// Whether no fetch of the partition has answered yet (a fetching partition learns its
    /// high watermark, 0 when empty, from its first fetch response).
    fn never_fetched(&self) -> bool {
        self.hi_offset < 0
    }

    /// Whether the broker holds records past every position the worker has.
    fn has_unread(&self) -> bool {
        self.hi_offset >= 0 && self.hi_offset > self.app_offset.max(self.committed_offset).max(self.lo_offset)
    }
}

/// What one [`Watch::observe`] found.
#[derive(Debug, Default, PartialEq)]
pub struct WatchReport {
    /// Stalled partitions (topic, partition, fetch state), for the loop to restart.
    pub stuck: Vec<(String, i32, String)>,
    /// The longest stall among them.
    pub longest: Duration,
    /// Owned partitions whose fetcher has not been active for [`STALLED_AFTER`].
    pub not_fetching: usize,
    /// Stopped fetchers to log now (at most once a minute each): topic, partition,
    /// fetch state, seconds idle.
    pub warn: Vec<(String, i32, String, u64)>,
}

/// A stalled partition's record: since when it shows no progress, at which application
/// offset, and when it was last warned about.
#[derive(Debug, Clone, Copy)]
struct Idle {
    since: Instant,
    app_offset: i64,
    warned: Option<Instant>,
}

/// The owned partitions without progress, across statistics reports (pure: `now` given).
#[derive(Debug, Default)]
pub struct Watch {
    idle: HashMap<(String, i32), Idle>,
}

impl Watch {
    /// Takes in one statistics report's partitions at `now`.
    pub fn observe(&mut self, now: Instant, views: &[FetchView]) -> WatchReport {
        let waiting: Vec<&FetchView> =
            views.iter().filter(|v| v.not_fetching() || v.has_unread() || v.never_fetched()).collect();
        self.idle.retain(|k, _| waiting.iter().any(|v| (&v.topic, v.partition) == (&k.0, k.1)));
        let mut report = WatchReport::default();
        for v in waiting {
            let idle = self.idle.entry((v.topic.clone(), v.partition)).or_insert(Idle {
                since: now,
                app_offset: v.app_offset,
                warned: None,
            });
            if idle.app_offset != v.app_offset {
                // Records reached the application since: progress.
                *idle = Idle { since: now, app_offset: v.app_offset, warned: None };
            }
            let idle_for = now.saturating_duration_since(idle.since);
            if idle_for < STALLED_AFTER {
                continue;
            }
            report.longest = report.longest.max(idle_for);
            report.stuck.push((v.topic.clone(), v.partition, v.state.clone()));
            if v.not_fetching() {
                report.not_fetching += 1;
                if idle.warned.is_none_or(|w| now.saturating_duration_since(w) >= Duration::from_secs(60)) {
                    idle.warned = Some(now);
                    report.warn.push((v.topic.clone(), v.partition, v.state.clone(), idle_for.as_secs()));
                }
            }
        }
        report
    }
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
///
/// Then every partition of `resume` is resumed: librdkafka's pause flags survive the
/// reassignment, and a stalled partition its owner does not keep paused must not stay
/// paused by a flag its owner's books lost.
pub fn restart_fetchers<C: Consumer<X>, X: ConsumerContext>(
    consumer: &C,
    books: &HashMap<(String, i32), i64>,
    resume: &[(String, i32)],
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
    if !resume.is_empty() {
        consumer.resume(&super::tpl(resume.iter()))?;
    }
    Ok(Some(starts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsettled_group_is_replaced_after_a_minute_and_then_once_a_minute() {
        assert!(group_settled("up", "steady", true));
        for (state, join) in [("up", "wait-join"), ("wait-coord", "init"), ("query-coord", "steady")] {
            assert!(!group_settled(state, join, true), "{state} {join}");
        }
        assert!(group_settled("up", "init", false), "KIP-848: a member without partitions");
        assert!(!group_settled("wait-coord", "steady", false));
        let s = Duration::from_secs;
        assert!(!group_stuck(s(59), None));
        assert!(group_stuck(s(60), None));
        assert!(!group_stuck(s(300), Some(s(30))), "replaced 30 s ago");
        assert!(group_stuck(s(300), Some(s(60))));
    }

    #[test]
    fn restart_waits_for_a_stall_and_then_every_30_s() {
        let s = Duration::from_secs;
        assert!(!restart_due(s(14), None), "not stalled long enough");
        assert!(restart_due(s(15), None));
        assert!(!restart_due(s(60), Some(s(29))), "restarted recently");
        assert!(restart_due(s(60), Some(s(30))));
    }

    fn view(p: i32, state: &str, app: i64, hi: i64) -> FetchView {
        FetchView {
            topic: "t".into(),
            partition: p,
            state: state.into(),
            app_offset: app,
            committed_offset: -1001,
            lo_offset: 0,
            hi_offset: hi,
        }
    }

    #[test]
    fn an_active_partition_with_unread_records_and_no_progress_is_stalled() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        // Never read: app offset invalid, 6,000 records on the broker.
        let never = view(10, "active", -1001, 6000);
        let caught_up = view(1, "active", 50, 50);
        assert!(w.observe(t0, &[never.clone(), caught_up.clone()]).stuck.is_empty());
        let r = w.observe(t0 + STALLED_AFTER, &[never.clone(), caught_up]);
        assert_eq!(r.stuck, vec![("t".to_string(), 10, "active".to_string())]);
        assert_eq!(r.not_fetching, 0, "its fetcher is active");
        assert!(r.warn.is_empty(), "the loop, which knows its pauses, says why");
    }

    /// The stall: an owned partition librdkafka never fetched (its pause outlived
    /// the resume), fetch state `active`, no high watermark; an empty partition that is
    /// fetched shows watermark 0 and is not stalled.
    #[test]
    fn an_active_partition_never_fetched_is_stalled() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        let never_fetched = view(10, "active", -1001, -1001);
        let empty = view(2, "active", -1001, 0);
        assert!(w.observe(t0, &[never_fetched.clone(), empty.clone()]).stuck.is_empty());
        let r = w.observe(t0 + STALLED_AFTER, &[never_fetched, empty]);
        assert_eq!(r.stuck, vec![("t".to_string(), 10, "active".to_string())]);
    }

    #[test]
    fn progress_resets_the_stall_and_a_stopped_fetcher_is_warned_about_once_a_minute() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        w.observe(t0, &[view(2, "active", 10, 100)]);
        let r = w.observe(t0 + STALLED_AFTER, &[view(2, "active", 11, 100)]);
        assert!(r.stuck.is_empty(), "it moved");
        let r = w.observe(t0 + STALLED_AFTER * 2 - Duration::from_secs(1), &[view(2, "active", 11, 100)]);
        assert!(r.stuck.is_empty(), "not idle long enough since it moved");
        assert_eq!(w.observe(t0 + STALLED_AFTER * 2, &[view(2, "active", 11, 100)]).stuck.len(), 1);

        let stopped = view(3, "stopped", 0, 0);
        w.observe(t0, std::slice::from_ref(&stopped));
        let r = w.observe(t0 + STALLED_AFTER, std::slice::from_ref(&stopped));
        assert_eq!((r.stuck.len(), r.not_fetching, r.warn.len()), (1, 1, 1));
        let r = w.observe(t0 + STALLED_AFTER + Duration::from_secs(5), std::slice::from_ref(&stopped));
        assert_eq!((r.not_fetching, r.warn.len()), (1, 0), "warned a minute apart");
        // Gone from the report (revoked, or caught up): forgotten.
        assert!(w.observe(t0 + STALLED_AFTER * 9, &[]).stuck.is_empty());
        assert!(w.idle.is_empty());
    }

    #[test]
    fn restart_continues_after_the_last_record_taken_else_from_the_commit() {
        assert_eq!(restart_offset(41), Offset::Offset(42));
        assert_eq!(restart_offset(0), Offset::Offset(1));
        assert_eq!(restart_offset(-1), Offset::Invalid, "nothing taken: the committed offset");
    }
}
