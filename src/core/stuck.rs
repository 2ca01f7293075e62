//! The stuck-job rule: a running job that reports no progress, no checkpoint and no
//! heartbeat of its own for `stuck_after` holds its slot for nothing (an infinite loop,
//! a deadlock, a hung call). The worker then cancels it, kills it after the grace and
//! dead-letters it with the reason (`worker::exec`). Pure: times are arguments.

use super::retry::DurationMs;
use crate::model::Millis;

/// What the worker does with a running job at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// It advanced recently enough (or has no `stuck_after`): look again at `next`.
    Fine { next: Option<Millis> },
    /// Silent since `since` for longer than `stuck_after`.
    Stuck { silent_ms: Millis },
}

/// `last_advance`: the job's start or its newest progress/checkpoint/heartbeat.
pub fn watch(last_advance: Millis, now: Millis, stuck_after: Option<DurationMs>) -> Watch {
    let Some(after) = stuck_after else { return Watch::Fine { next: None } };
    let silent_ms = (now - last_advance).max(0);
    if silent_ms >= after.0 {
        Watch::Stuck { silent_ms }
    } else {
        Watch::Fine { next: Some(last_advance + after.0) }
    }
}

/// The dead letter's reason for a job found stuck.
pub fn reason(silent_ms: Millis, stuck_after: DurationMs) -> String {
    format!(
        "stuck: no progress, checkpoint or heartbeat for {} (stuck_after {stuck_after}); cancelled, killed after the \
         grace, not retried; make the job report progress or heartbeat (docs/process-jobs.md), or raise stuck_after",
        DurationMs(silent_ms)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stuck_once_silent_for_stuck_after_and_never_without_it() {
        let after = Some(DurationMs(1_000));
        assert_eq!(watch(0, 999, after), Watch::Fine { next: Some(1_000) });
        assert_eq!(watch(0, 1_000, after), Watch::Stuck { silent_ms: 1_000 });
        assert_eq!(watch(500, 1_200, after), Watch::Fine { next: Some(1_500) }, "an advance restarts the clock");
        assert_eq!(watch(0, 1_000_000, None), Watch::Fine { next: None });
        assert!(reason(1_500, DurationMs(1_000)).contains("stuck_after 1s"));
    }
}
