//! Which jobs may skip the effectively-once read (the per-job state lookup that caps
//! throughput: Cassandra is the busiest process under load).
//!
//! The read exists for copies that may have progressed elsewhere: a redelivered offset
//! (a worker finished it but died before committing), a retry or relayed copy, a replay,
//! a rerun, a cancel, a record its worker takes in again after a run of it whose outcome
//! was not durable (`worker::route::Origin::taken_again`: another worker may have taken
//! the job over meanwhile). A **dispatch frontier** per topic partition rules out the first:
//! before starting any offset beyond it a worker raises it durably (in chunks, so one
//! write covers many jobs), and a worker taking a partition over reads it once; an
//! offset above the frontier it read was never started by anyone. The job's own fields
//! rule out the others ([`straight_from_submitter`]); a polled feed of recent cancel
//! requests covers cancels (`worker::frontier`).
//!
//! A delayed job (`execute_at`) may come back through a relay, which produces a copy at
//! another offset. Its copies carry no [`SUBMITTED_HEADER`]: only a submitter's record
//! does, so a delayed job read at its submitted offset may skip the read too, provided a
//! worker raises the frontier past that offset before it hands the job to a relay (then
//! a later reader of the offset reads the state: a copy may be running).
//!
//! Limits, stated where docs/wire-format.md promises effectively-once: a client that produces the
//! *same job id twice at two offsets* gets both run if both are fresh (use idempotency
//! keys); a cancel issued in the last poll interval before the job starts is honoured
//! only cooperatively, as for a running job.

use crate::model::{JobSubmitted, Millis};

/// The header a submitter puts on every record it produces (value "1"): the record is
/// the submission itself, not a copy a relay, promoter or hold-back produced (they set
/// only trace headers). Records without it (older submitters too) are read as copies.
pub const SUBMITTED_HEADER: &str = "fairway-submitted";

/// One partition's frontier as seen by one worker in one assignment (an incarnation of the partition's state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionFrontier {
    /// Highest offset anyone may have started before this assignment (-1: none recorded).
    before: i64,
    /// Highest offset this worker may start now (durably recorded).
    reserved: i64,
}

impl PartitionFrontier {
    /// From the frontier read at the start of the assignment.
    pub fn new(recorded: Option<i64>) -> Self {
        let before = recorded.unwrap_or(-1);
        PartitionFrontier { before, reserved: before }
    }
    /// The frontier to record before `offset` may start, if it is not covered yet: a
    /// chunk beyond it, so the next `chunk` offsets need no write.
    pub fn to_reserve(&self, offset: i64, chunk: i64) -> Option<i64> {
        (offset > self.reserved).then_some(offset + chunk.max(0))
    }
    /// `upto` is recorded.
    pub fn reserved(&mut self, upto: i64) {
        self.reserved = self.reserved.max(upto);
    }
    /// No worker can have started `offset` before this assignment, and it is covered now.
    pub fn never_started(&self, offset: i64) -> bool {
        offset > self.before && offset <= self.reserved
    }
}

/// The job is an original submission, not a copy that may have progressed elsewhere:
/// first attempt, no crash, generation 0, not replayed, never delayed or held back (those
/// come back through a relay, which may produce twice), and young enough for the
/// cancellation feed (which covers at least `max_age_ms`) to know any cancel of it.
/// `submitted`: the record carries [`SUBMITTED_HEADER`] (then a delayed job qualifies).
pub fn straight_from_submitter(job: &JobSubmitted, submitted: bool, now: Millis, max_age_ms: Millis) -> bool {
    job.attempt == 0
        && job.crash_count == 0
        && job.generation == 0
        && job.replay_count == 0
        && job.replayed_from.is_none()
        && job.not_before.is_none()
        && (job.execute_at.is_none() || submitted)
        && now - job.submitted_at <= max_age_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_above_the_recorded_frontier_were_never_started_once_reserved() {
        let mut f = PartitionFrontier::new(Some(99));
        assert!(!f.never_started(50), "below the recorded frontier: maybe started");
        assert!(!f.never_started(99));
        assert!(!f.never_started(100), "not reserved yet: must be recorded before it starts");
        assert_eq!(f.to_reserve(100, 1000), Some(1100));
        f.reserved(1100);
        assert!(f.never_started(100) && f.never_started(1100));
        assert_eq!(f.to_reserve(1100, 1000), None, "covered: no write");
        assert_eq!(f.to_reserve(1101, 1000), Some(2101));
        f.reserved(500);
        assert!(f.never_started(1100), "a lower record never shrinks the reservation");
    }

    #[test]
    fn with_nothing_recorded_every_offset_is_fresh_once_reserved() {
        let mut f = PartitionFrontier::new(None);
        assert_eq!(f.to_reserve(0, 10), Some(10));
        f.reserved(10);
        assert!(f.never_started(0));
        assert!(!f.never_started(11));
    }

    #[test]
    fn only_original_young_submissions_qualify() {
        let base = JobSubmitted::original("j".into(), "t".into(), "x".into(), Vec::new(), 1_000);
        assert!(straight_from_submitter(&base, false, 2_000, 60_000));
        assert!(!straight_from_submitter(&base, false, 62_000, 60_000), "too old for the cancel feed");
        let copies = [
            JobSubmitted { attempt: 1, ..base.clone() },
            JobSubmitted { crash_count: 1, ..base.clone() },
            JobSubmitted { generation: 1, ..base.clone() },
            JobSubmitted { replay_count: 1, ..base.clone() },
            JobSubmitted { replayed_from: Some("dlq".into()), ..base.clone() },
            JobSubmitted { not_before: Some(5), ..base.clone() },
            JobSubmitted { execute_at: Some(5), ..base.clone() },
        ];
        for c in copies {
            assert!(!straight_from_submitter(&c, false, 2_000, 60_000), "{c:?}");
        }
    }

    #[test]
    fn a_delayed_job_qualifies_only_as_its_submitters_record() {
        let base = JobSubmitted::original("j".into(), "t".into(), "x".into(), Vec::new(), 1_000);
        let delayed = JobSubmitted { execute_at: Some(3_000), ..base.clone() };
        assert!(straight_from_submitter(&delayed, true, 3_000, 60_000));
        assert!(!straight_from_submitter(&delayed, false, 3_000, 60_000), "a relay's copy");
        let others = [
            JobSubmitted { attempt: 1, ..delayed.clone() },
            JobSubmitted { not_before: Some(5), ..delayed.clone() },
            JobSubmitted { generation: 1, ..delayed.clone() },
        ];
        for c in others {
            assert!(!straight_from_submitter(&c, true, 3_000, 60_000), "{c:?}");
        }
        assert!(!straight_from_submitter(&delayed, true, 62_000, 60_000), "too old for the cancel feed");
    }
}
