//! A job's route through the worker, read top to bottom, and the types its stages pass
//! along. A consumed message goes:
//!
//! 1. **intake** (`pool::validate`, `pool`'s loop): decoded and validated (what cannot run
//!    goes to the DLQ with the reason), delayed if scheduled later, spilled if its
//!    tenant's buffer is full, else queued for the fair scheduler;
//! 2. **check** (`check::before_run`), once the scheduler gave it a slot: the
//!    effectively-once check settles a redelivered copy of a finished, stale, cancelled or
//!    expired job without running it;
//! 3. **run** (`exec`): cleared to run (`exec::clear_to_run`: a handler for its type and
//!    closed circuit breakers, or the job is held back, no attempt used), then the handler
//!    under its deadline, with a "running" row for jobs that outlive a short grace, until
//!    it returns, times out, is aborted or stops for a hand-off;
//! 4. **settle** (`settle::settle`): succeeded/failed/cancelled (state and result), a
//!    retry, a dead letter, or a hand-off to the next worker;
//! 5. **commit** (`pool`): the job's [`Ended`] comes back to the pool loop, which releases
//!    its offset to the commit tracker only once the outcome is durable, so a crash
//!    anywhere before redelivers the job instead of losing it.
//!
//! Every durable write of any stage goes through `durable` and answers a [`Durable`]
//! (`#[must_use]`), which becomes the job's [`Ended`]. Stages call forward only:
//! `pool` → `exec` → `check`, `settle`; each of them → `durable`; this module depends on
//! none of them.

use crate::handlers::{HandlerError, JobLive};
use crate::model::JobSubmitted;
use std::sync::Arc;
use std::time::Duration;

/// A decoded job waiting in the dispatcher (intake's output).
pub struct Pending {
    pub job: Arc<JobSubmitted>,
    pub origin: Origin,
    /// Which incarnation of its partition's state (a new one each time the partition is
    /// assigned) read it: an end reported to an older incarnation is ignored.
    pub incarnation: u64,
    /// When the consumer handed it over (epoch ms), for the wait breakdown.
    pub received_at: i64,
    /// Read back from a spilled backlog (its offset was committed when it spilled).
    pub spill: Option<SpillRef>,
}

/// Where a job read back from a spilled backlog came from: its end is tracked per bucket.
#[derive(Debug, Clone)]
pub struct SpillRef {
    pub tenant: String,
    pub bucket: i64,
}

/// Where a message came from (for dead letters and commits).
#[derive(Debug, Clone)]
pub struct Origin {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The record is a submitter's own (`core::frontier::SUBMITTED_HEADER`), not a copy.
    pub submitted: bool,
    /// This worker takes the record in again after a run of it whose outcome was not
    /// durable (a fenced run, a store outage at its end): another worker may have taken
    /// the job over meanwhile, so its state is read, never skipped by the frontier.
    pub taken_again: bool,
}

/// How an execution ended, for the scheduler's accounting and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The handler ran (whatever its outcome).
    Ran,
    /// Not run: already finished, cancelled, expired, stale duplicate, or deferred.
    Skipped,
    /// Its outcome could not be made durable (Kafka and the store both refused): its
    /// offset must stay uncommitted so the job is redelivered, never lost.
    NotDurable,
}

impl Ended {
    /// Whether the job's offset may be committed (its outcome is durable, or it needed none).
    pub fn is_durable(self) -> bool {
        self != Ended::NotDurable
    }

    /// `self`, unless the outcome was not durable: then `NotDurable`.
    pub(super) fn or_lost(self, durable: Durable) -> Ended {
        match durable {
            Durable::Yes => self,
            Durable::No => Ended::NotDurable,
        }
    }
}

/// Whether an outcome (a result and state, a retry, a dead letter, a hand-off, a copy
/// put back) was durably recorded: acknowledged by the broker and, where it has one,
/// written to the store. Every stage's write returns one, and only `Yes` lets the job's
/// offset be committed; ignoring it is a compile warning.
#[must_use = "an outcome that is not durable must keep the job's offset uncommitted (see `Ended::or_lost`)"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durable {
    /// Recorded: the job may be committed.
    Yes,
    /// Not recorded (the broker or the store refused): the job must be redelivered.
    No,
}

impl Durable {
    /// Durable only if both are.
    pub fn and(self, other: Durable) -> Durable {
        if self == Durable::Yes && other == Durable::Yes {
            Durable::Yes
        } else {
            Durable::No
        }
    }

    pub fn is_yes(self) -> bool {
        self == Durable::Yes
    }
}

/// What the run stage ended with, for the record stage.
pub(crate) struct Run {
    pub started_at: i64,
    pub timeout: Duration,
    /// The handler's return: `None` if it was aborted (cancelled past its grace, or
    /// ignoring a hand-off request), `Some(Err(_))` if its deadline passed.
    pub result: Option<Result<Result<Vec<u8>, HandlerError>, tokio::time::error::Elapsed>>,
    pub live: Arc<JobLive>,
    /// A "running" row (and running-index entry) was written: clear the index after.
    pub running_written: bool,
    /// The check found the job's row marked running or handed off (it took the job over
    /// or claimed it): that row's status conditions later compare-and-set steps.
    pub row_claimed: bool,
    /// Its running mark found the job finished (another copy ran it): the run was
    /// stopped and its outcome is dropped (docs/correctness.md, "Superseded runs").
    pub superseded: bool,
    /// The store did not take its running mark: the run was asked to stop, and no row
    /// showed it running while it ran on (`exec::mark_running`).
    pub unmarked: bool,
}

impl Run {
    /// No `jobs` row holds a claim on the job: a success may be stored as a grouped
    /// finished record (see `durable::record_success`).
    pub fn plain(&self) -> bool {
        !self.running_written && !self.row_claimed
    }

    /// What the run ended with, for its spans: a label and, for failures, why.
    pub(super) fn label(&self) -> (&'static str, Option<String>) {
        match &self.result {
            Some(Ok(Ok(_))) => ("succeeded", None),
            Some(Ok(Err(e))) => (e.class.as_str(), Some(e.message.clone())),
            Some(Err(_)) => ("timeout", Some(format!("deadline of {:?} passed", self.timeout))),
            None => ("stopped", None),
        }
    }
}
