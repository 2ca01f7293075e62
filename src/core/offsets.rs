//! Out-of-order completion tracking per Kafka partition, for at-least-once delivery.
//!
//! Kafka remembers one number per partition and consumer group: the next offset to
//! read. fairway runs the jobs of one partition concurrently and they finish in any
//! order, so it may only commit an offset once every job before it is finished;
//! committing further would lose the unfinished ones on a crash, committing less only
//! costs redelivery (which the completion record in the store turns into a no-op).
//!
//! [`PartitionOffsets`] keeps the started-but-not-yet-committable offsets in a deque in
//! the order Kafka delivered them (increasing). A completion is found by binary search
//! (O(log n)) and the committable point moves by popping finished entries off the front
//! (amortised O(1)), so thousands of jobs in flight cost no linear scans.
//!
//! Offsets may have gaps (compacted topics, transaction markers): the committable offset
//! is the lowest started-and-unfinished offset, or `last started + 1` when nothing is
//! unfinished, so a gap never blocks progress. The value follows Kafka's convention of
//! "next offset to consume" and is committed as is (for rdkafka: `Offset::Offset(x)` in
//! the `TopicPartitionList`, not `x + 1`).
//!
//! Finished offsets above the committable point are lost on a crash and their jobs
//! re-run. [`PartitionOffsets::finished_metadata`] encodes them compactly for the commit
//! metadata string, so a consumer that takes over the partition can skip them without a
//! store read ([`FinishedHint`]), the way Confluent's Parallel Consumer does.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

/// Why an offset was not accepted. The tracker is unchanged when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OffsetError {
    #[error("offset {offset} is negative; Kafka offsets start at 0")]
    Negative { offset: i64 },
    #[error(
        "offset {offset} arrived after offset {last}; offsets of a partition must be started in \
         increasing order (after a seek or rebalance, start a fresh tracker)"
    )]
    NotIncreasing { offset: i64, last: i64 },
    #[error("offset {offset} is too large to track")]
    TooLarge { offset: i64 },
}

/// Why commit metadata could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("commit metadata {0:?} is not fairway's finished-offsets format (expected \"fw1@<base>:<ranges>\")")]
    Format(String),
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    offset: i64,
    done: bool,
    /// The record's timestamp (epoch ms), when started with one ([`PartitionOffsets::started_at`]).
    at: Option<i64>,
}

/// Completion tracker for one partition. Reset (make a new one) when the partition is
/// assigned anew or the consumer seeks.
#[derive(Debug, Clone, Default)]
pub struct PartitionOffsets {
    /// Started offsets from the lowest unfinished one on, increasing. Invariant: the
    /// front, if any, is unfinished.
    window: VecDeque<Slot>,
    /// Entries of `window` not yet finished.
    unfinished: usize,
    /// Last started offset + 1; None before the first start.
    next: Option<i64>,
}

impl PartitionOffsets {
    pub fn new() -> Self {
        Self::default()
    }

    /// Record that the job at `offset` was taken from the partition. Offsets must be
    /// started in increasing order (gaps allowed); anything else is refused and not
    /// tracked, and a later `finished` for it is ignored.
    pub fn started(&mut self, offset: i64) -> Result<(), OffsetError> {
        self.started_at(offset, None)
    }

    /// Like [`started`](Self::started), remembering the record's timestamp (epoch ms, if
    /// the broker gave one) for [`oldest_unfinished_at`](Self::oldest_unfinished_at).
    pub fn started_at(&mut self, offset: i64, at: Option<i64>) -> Result<(), OffsetError> {
        if offset < 0 {
            return Err(OffsetError::Negative { offset });
        }
        if let Some(next) = self.next {
            if offset < next {
                return Err(OffsetError::NotIncreasing { offset, last: next - 1 });
            }
        }
        let next = offset.checked_add(1).ok_or(OffsetError::TooLarge { offset })?;
        self.window.push_back(Slot { offset, done: false, at });
        self.unfinished += 1;
        self.next = Some(next);
        Ok(())
    }

    /// Record that the job at `offset` is finished (its outcome is durable). Returns the
    /// new committable offset when this completion moved it forward, None otherwise
    /// (an earlier offset is still running, or `offset` is unknown or finished already).
    pub fn finished(&mut self, offset: i64) -> Option<i64> {
        let idx = self.window.binary_search_by_key(&offset, |s| s.offset).ok()?;
        let slot = &mut self.window[idx];
        if slot.done {
            return None;
        }
        slot.done = true;
        self.unfinished -= 1;
        if idx != 0 {
            return None;
        }
        while self.window.front().is_some_and(|s| s.done) {
            self.window.pop_front();
        }
        self.committable()
    }

    /// The offset that is safe to commit now (next offset to consume): the lowest
    /// started-and-unfinished offset, or last started + 1 when all are finished. None
    /// before anything was started.
    pub fn committable(&self) -> Option<i64> {
        match self.window.front() {
            Some(s) => Some(s.offset),
            None => self.next,
        }
    }

    /// Jobs started and not finished.
    pub fn in_flight(&self) -> usize {
        self.unfinished
    }

    /// The timestamp of the lowest unfinished record (the one the committed offset waits
    /// for): the partition's lag in time is `now` minus this. None when nothing is
    /// unfinished or it was started without a timestamp.
    pub fn oldest_unfinished_at(&self) -> Option<i64> {
        self.window.front().and_then(|s| s.at)
    }

    /// Offsets held in memory: in flight plus finished ones waiting for an earlier
    /// offset. A large value with a small `in_flight` means one slow job holds the
    /// partition back (a candidate for pausing the partition).
    pub fn window_len(&self) -> usize {
        self.window.len()
    }

    /// Finished offsets above the committable one, in increasing order: the jobs a crash
    /// now would redeliver although they are done.
    pub fn finished_above(&self) -> impl Iterator<Item = i64> + '_ {
        self.window.iter().filter(|s| s.done).map(|s| s.offset)
    }

    /// Compact text for the Kafka commit metadata: `fw1@<base>:<ranges>` with `base` the
    /// committable offset and ranges of finished offsets as `start-end` or `start`, each
    /// relative to the end of the previous range (to keep numbers short), e.g.
    /// `fw1@100:2-4,3` = 102..=104 and 107. At most `max_bytes` long (Kafka's default
    /// `offset.metadata.max.bytes` is 4096); ranges that do not fit are left out, which
    /// only costs re-running those jobs. Returns an empty string when nothing started.
    pub fn finished_metadata(&self, max_bytes: usize) -> String {
        match self.committable() {
            Some(base) => hint_metadata(base, self.finished_above(), max_bytes),
            None => String::new(),
        }
    }
}

/// Commit metadata in the format of [`PartitionOffsets::finished_metadata`] for the
/// commit point `base` and the finished offsets `finished` (increasing; those at or below
/// `base` are left out); ranges past `max_bytes` are left out, and it is empty when the
/// header alone does not fit.
pub fn hint_metadata(base: i64, finished: impl Iterator<Item = i64>, max_bytes: usize) -> String {
    let mut out = format!("fw1@{base}:");
    if out.len() > max_bytes {
        return String::new();
    }
    let mut prev_end = base;
    let mut first = true;
    let mut iter = finished.skip_while(|&o| o <= base).peekable();
    let mut piece = String::new();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end += 1;
            iter.next();
        }
        piece.clear();
        if !first {
            piece.push(',');
        }
        let rel = start - prev_end;
        if end == start {
            let _ = write!(piece, "{rel}");
        } else {
            let _ = write!(piece, "{rel}-{}", end - start);
        }
        if out.len() + piece.len() > max_bytes {
            break;
        }
        out.push_str(&piece);
        prev_end = end;
        first = false;
    }
    out
}

/// Finished offsets read back from commit metadata written by
/// [`PartitionOffsets::finished_metadata`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FinishedHint {
    /// The committable offset the metadata was written with. Use the hint only if it
    /// equals the committed offset Kafka returns with it.
    pub base: i64,
    /// Inclusive, increasing, non-overlapping ranges of finished offsets above `base`.
    pub ranges: Vec<(i64, i64)>,
}

impl FinishedHint {
    /// Parse commit metadata. An empty string is an empty hint with base 0.
    pub fn parse(meta: &str) -> Result<FinishedHint, MetadataError> {
        let bad = || MetadataError::Format(meta.chars().take(64).collect());
        if meta.is_empty() {
            return Ok(FinishedHint::default());
        }
        let rest = meta.strip_prefix("fw1@").ok_or_else(bad)?;
        let (base, list) = rest.split_once(':').ok_or_else(bad)?;
        let base: i64 = base.parse().map_err(|_| bad())?;
        if base < 0 {
            return Err(bad());
        }
        let mut ranges = Vec::new();
        let mut prev_end = base;
        if !list.is_empty() {
            for part in list.split(',') {
                let (rel, len) = match part.split_once('-') {
                    Some((a, b)) => (a, Some(b)),
                    None => (part, None),
                };
                let rel: i64 = rel.parse().map_err(|_| bad())?;
                let len: i64 = match len {
                    Some(l) => l.parse().map_err(|_| bad())?,
                    None => 0,
                };
                if rel < 1 || len < 0 {
                    return Err(bad());
                }
                let start = prev_end.checked_add(rel).ok_or_else(bad)?;
                let end = start.checked_add(len).ok_or_else(bad)?;
                ranges.push((start, end));
                prev_end = end;
            }
        }
        Ok(FinishedHint { base, ranges })
    }

    /// The finished offsets, increasing (lazily: a caller bounds how many it takes).
    pub fn offsets(&self) -> impl Iterator<Item = i64> + '_ {
        self.ranges.iter().flat_map(|&(start, end)| start..=end)
    }

    /// Whether `offset` was recorded as finished.
    pub fn contains(&self, offset: i64) -> bool {
        let i = self.ranges.partition_point(|&(_, end)| end < offset);
        self.ranges.get(i).is_some_and(|&(start, _)| start <= offset)
    }
}

/// Completion trackers for all partitions a consumer holds, keyed by topic and partition.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    topics: HashMap<String, HashMap<i32, PartitionOffsets>>,
}

impl Tracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// See [`PartitionOffsets::started`]; creates the partition's tracker on first use.
    pub fn started(&mut self, topic: &str, partition: i32, offset: i64) -> Result<(), OffsetError> {
        let parts = match self.topics.get_mut(topic) {
            Some(p) => p,
            None => self.topics.entry(topic.to_owned()).or_default(),
        };
        parts.entry(partition).or_default().started(offset)
    }

    /// See [`PartitionOffsets::finished`]; None for a partition not tracked.
    pub fn finished(&mut self, topic: &str, partition: i32, offset: i64) -> Option<i64> {
        self.topics.get_mut(topic)?.get_mut(&partition)?.finished(offset)
    }

    /// See [`PartitionOffsets::committable`].
    pub fn committable(&self, topic: &str, partition: i32) -> Option<i64> {
        self.partition(topic, partition)?.committable()
    }

    /// The tracker of one partition.
    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionOffsets> {
        self.topics.get(topic)?.get(&partition)
    }

    /// Forget a partition (revoked in a rebalance, or before a seek). Returns its tracker
    /// so the caller can make a last commit.
    pub fn revoke(&mut self, topic: &str, partition: i32) -> Option<PartitionOffsets> {
        let parts = self.topics.get_mut(topic)?;
        let gone = parts.remove(&partition);
        if parts.is_empty() {
            self.topics.remove(topic);
        }
        gone
    }

    /// Jobs in flight over all partitions.
    pub fn in_flight(&self) -> usize {
        self.topics.values().flat_map(|p| p.values()).map(PartitionOffsets::in_flight).sum()
    }

    /// `(topic, partition, committable)` for every tracked partition that has one.
    pub fn committable_all(&self) -> impl Iterator<Item = (&str, i32, i64)> + '_ {
        self.topics
            .iter()
            .flat_map(|(t, parts)| parts.iter().filter_map(move |(&p, o)| o.committable().map(|c| (t.as_str(), p, c))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_in_time_is_the_age_of_the_lowest_unfinished_record() {
        let mut p = PartitionOffsets::new();
        assert_eq!(p.oldest_unfinished_at(), None);
        p.started_at(10, Some(1_000)).unwrap();
        p.started_at(11, Some(2_000)).unwrap();
        p.started_at(12, Some(3_000)).unwrap();
        assert_eq!(p.oldest_unfinished_at(), Some(1_000));
        p.finished(11);
        assert_eq!(p.oldest_unfinished_at(), Some(1_000), "11 finished, 10 still holds the commit");
        p.finished(10);
        assert_eq!(p.oldest_unfinished_at(), Some(3_000));
        p.finished(12);
        assert_eq!(p.oldest_unfinished_at(), None, "caught up");
    }
    use proptest::prelude::*;

    #[test]
    fn example_from_the_brief() {
        let mut p = PartitionOffsets::new();
        assert_eq!(p.committable(), None);
        for o in [5, 6, 7] {
            p.started(o).unwrap();
        }
        assert_eq!(p.committable(), Some(5));
        assert_eq!(p.finished(6), None);
        assert_eq!(p.finished(5), Some(7));
        assert_eq!(p.in_flight(), 1);
        assert_eq!(p.finished(7), Some(8));
        assert_eq!(p.in_flight(), 0);
        assert_eq!(p.committable(), Some(8));
    }

    #[test]
    fn gaps_do_not_block() {
        let mut p = PartitionOffsets::new();
        for o in [10, 13, 20] {
            p.started(o).unwrap();
        }
        assert_eq!(p.finished(10), Some(13));
        assert_eq!(p.finished(20), None);
        assert_eq!(p.finished(13), Some(21));
        // a later start after a gap moves the committable point to it
        p.started(30).unwrap();
        assert_eq!(p.committable(), Some(30));
    }

    #[test]
    fn duplicates_unknown_and_bad_input_ignored() {
        let mut p = PartitionOffsets::new();
        p.started(1).unwrap();
        p.started(2).unwrap();
        assert_eq!(p.finished(99), None);
        assert_eq!(p.finished(2), None);
        assert_eq!(p.finished(2), None);
        assert_eq!(p.in_flight(), 1);
        assert_eq!(p.started(2), Err(OffsetError::NotIncreasing { offset: 2, last: 2 }));
        assert_eq!(p.started(-1), Err(OffsetError::Negative { offset: -1 }));
        assert_eq!(p.started(i64::MAX), Err(OffsetError::TooLarge { offset: i64::MAX }));
        assert_eq!(p.in_flight(), 1);
        assert_eq!(p.finished(1), Some(3));
        assert_eq!(p.finished(1), None);
        assert!(p.started(2).is_err());
        assert!(OffsetError::Negative { offset: -1 }.to_string().contains("negative"));
    }

    #[test]
    fn big_window_is_fast_enough() {
        // 200k in flight, finished in reverse: each completion is a binary search.
        let mut p = PartitionOffsets::new();
        let n = 200_000i64;
        for o in 0..n {
            p.started(o * 2).unwrap();
        }
        for o in (1..n).rev() {
            assert_eq!(p.finished(o * 2), None);
        }
        assert_eq!(p.window_len(), n as usize);
        assert_eq!(p.finished(0), Some(n * 2 - 1));
        assert_eq!(p.window_len(), 0);
    }

    #[test]
    fn a_hint_of_chosen_offsets_leaves_out_those_at_or_below_its_base_and_reads_back() {
        let m = hint_metadata(10, [3, 10, 12, 13, 14, 20].into_iter(), 4096);
        assert_eq!(m, "fw1@10:2-2,6");
        let h = FinishedHint::parse(&m).unwrap();
        assert_eq!((h.base, h.offsets().collect::<Vec<_>>()), (10, vec![12, 13, 14, 20]));
        assert_eq!(hint_metadata(10, std::iter::empty(), 4096), "fw1@10:");
        assert_eq!(hint_metadata(10, [12, 20].into_iter(), 9), "fw1@10:2", "what does not fit is left out");
        assert_eq!(hint_metadata(10, [12].into_iter(), 3), "");
    }

    #[test]
    fn metadata_round_trip_and_truncation() {
        let mut p = PartitionOffsets::new();
        assert_eq!(p.finished_metadata(4096), "");
        for o in 100..110 {
            p.started(o).unwrap();
        }
        for o in [102, 103, 104, 107] {
            p.finished(o);
        }
        let m = p.finished_metadata(4096);
        assert_eq!(m, "fw1@100:2-2,3");
        let h = FinishedHint::parse(&m).unwrap();
        assert_eq!(h.base, 100);
        assert_eq!(h.ranges, vec![(102, 104), (107, 107)]);
        assert!(h.contains(103) && h.contains(107));
        assert!(!h.contains(100) && !h.contains(105) && !h.contains(108));
        assert_eq!(p.finished_metadata(10), "fw1@100:");
        assert_eq!(p.finished_metadata(3), "");
        assert_eq!(FinishedHint::parse("").unwrap(), FinishedHint::default());
        for bad in ["x", "fw1@", "fw1@-1:", "fw1@5:0", "fw1@5:a", "fw1@5:1-", "fw1@5:1--1"] {
            assert!(FinishedHint::parse(bad).is_err(), "{bad}");
        }
        assert!(FinishedHint::parse(&format!("fw1@{}:1", i64::MAX)).is_err());
    }

    #[test]
    fn tracker_per_partition() {
        let mut t = Tracker::new();
        t.started("a", 0, 5).unwrap();
        t.started("a", 1, 5).unwrap();
        t.started("b", 0, 1).unwrap();
        assert_eq!(t.in_flight(), 3);
        assert_eq!(t.finished("a", 1, 5), Some(6));
        assert_eq!(t.finished("zzz", 1, 5), None);
        assert_eq!(t.committable("a", 0), Some(5));
        assert_eq!(t.committable("a", 1), Some(6));
        let mut all: Vec<_> = t.committable_all().map(|(t, p, c)| (t.to_owned(), p, c)).collect();
        all.sort();
        assert_eq!(all, vec![("a".into(), 0, 5), ("a".into(), 1, 6), ("b".into(), 0, 1)]);
        assert!(t.revoke("b", 0).is_some());
        assert!(t.revoke("b", 0).is_none());
        assert!(t.partition("b", 0).is_none());
        assert_eq!(t.in_flight(), 1);
    }

    /// Increasing offsets with gaps, and a permutation to finish them in.
    fn scenario() -> impl Strategy<Value = (Vec<i64>, Vec<usize>)> {
        (0i64..1_000, proptest::collection::vec(1i64..5, 1..400)).prop_flat_map(|(first, gaps)| {
            let mut offs = Vec::with_capacity(gaps.len());
            let mut o = first;
            for g in &gaps {
                offs.push(o);
                o += g;
            }
            let n = offs.len();
            (Just(offs), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
        })
    }

    proptest! {
        #[test]
        fn committable_is_safe_monotonic_and_complete(
            (offs, order) in scenario(),
            interleave in proptest::collection::vec(any::<bool>(), 0..800),
        ) {
            let mut p = PartitionOffsets::new();
            let mut finished = vec![false; offs.len()];
            let mut started = 0usize;
            let mut remaining = order;
            let mut last: Option<i64> = None;
            let mut coin = interleave.into_iter();
            // interleave starts and finishes; finish only what was started, in the
            // order given by the permutation (skipping what is not started yet)
            while !remaining.is_empty() {
                let finishable = remaining.iter().position(|&i| i < started);
                let do_start = started < offs.len()
                    && (finishable.is_none() || coin.next().unwrap_or(true));
                if do_start {
                    p.started(offs[started]).unwrap();
                    started += 1;
                } else if let Some(pos) = finishable {
                    let i = remaining.remove(pos);
                    let before = p.committable();
                    let r = p.finished(offs[i]);
                    finished[i] = true;
                    // the returned value is the new committable, only when it moved
                    match r {
                        Some(c) => {
                            prop_assert!(Some(c) > before);
                            prop_assert_eq!(Some(c), p.committable());
                        }
                        None => prop_assert_eq!(before, p.committable()),
                    }
                }
                let c = p.committable();
                prop_assert!(c >= last, "monotonic");
                last = c;
                // equal to (so never past) the lowest started-and-unfinished offset
                let lowest_unfinished = (0..started).find(|&i| !finished[i]).map(|i| offs[i]);
                match lowest_unfinished {
                    Some(lu) => prop_assert_eq!(c, Some(lu)),
                    None => prop_assert_eq!(c, Some(offs[started - 1] + 1)),
                }
                prop_assert_eq!(p.in_flight(), (0..started).filter(|&i| !finished[i]).count());
            }
            prop_assert_eq!(p.committable(), Some(offs[offs.len() - 1] + 1));
            prop_assert_eq!(p.in_flight(), 0);
            prop_assert_eq!(p.window_len(), 0);
        }

        #[test]
        fn metadata_lists_exactly_the_finished_above((offs, order) in scenario(), k in 0usize..400) {
            let mut p = PartitionOffsets::new();
            for &o in &offs { p.started(o).unwrap(); }
            let k = k.min(order.len());
            for &i in &order[..k] { p.finished(offs[i]); }
            let h = FinishedHint::parse(&p.finished_metadata(usize::MAX)).unwrap();
            prop_assert_eq!(Some(h.base), p.committable());
            let above: Vec<i64> = p.finished_above().collect();
            let c = p.committable().unwrap();
            for (i, &o) in offs.iter().enumerate() {
                let done = order[..k].contains(&i);
                prop_assert_eq!(h.contains(o), done && o > c, "offset {}", o);
                prop_assert_eq!(above.contains(&o), done && o > c);
            }
            // truncated metadata fits and claims nothing it should not
            let short = p.finished_metadata(40);
            prop_assert!(short.len() <= 40);
            if !short.is_empty() {
                let hs = FinishedHint::parse(&short).unwrap();
                for &(s, e) in &hs.ranges {
                    for o in s..=e { prop_assert!(h.contains(o)); }
                }
            }
        }
    }
}
