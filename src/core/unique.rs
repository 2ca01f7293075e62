//! Unique jobs and debounce, the pure rules.
//!
//! Unique jobs: a submission with a `unique_key` claims the key for its tenant (LWT in
//! the store, so across every API process and producer). While the job holding the key
//! is inside the key's scope, later submissions with the key return that job's id
//! instead of producing another; once it left the scope, the next submission takes the
//! key over (LWT on the old holder, so one taker wins). Scopes:
//! - `queued`: until the holder starts (its row says running or later);
//! - `queued_or_running` (default): until the holder finishes (a terminal row);
//! - `window`: for `unique_window` after the claim, whatever the holder does.
//!
//! Debounce: submissions with a `debounce_key` inside the window are folded into one
//! pending job that runs once, `debounce_delay` after the last of them (but no later
//! than `debounce_max_delay` after the first), with the last payload (`replace`) or the
//! first (`keep_first`). No I/O; `now` is an argument.

use crate::model::Millis;
use serde::{Deserialize, Serialize};

/// Idempotency keys fairway claims for itself (`fairway.unique/<key>`,
/// `fairway.debounce/<job>`, `fairway.schedule/<id>/<at>`) start with this; a caller's
/// own key may not, so it can never pre-claim a unique slot, a debounce window's job or
/// a schedule's fire.
pub const SYSTEM_KEY_PREFIX: &str = "fairway.";

/// A caller's `idempotency_key`: anything outside fairway's own namespace.
pub fn check_caller_key(key: &str) -> Result<(), String> {
    if key.starts_with(SYSTEM_KEY_PREFIX) {
        return Err(format!(
            "idempotency_key {key:?} starts with {SYSTEM_KEY_PREFIX:?}, reserved for fairway's own keys; use another prefix"
        ));
    }
    Ok(())
}

/// Highest `debounce.max_open_per_tenant` allowed: a tenant at its bound has its slots
/// read (100 a statement) before an open is refused.
pub const MAX_OPEN_PER_TENANT_CEILING: usize = 10_000;

/// Bounds of debounce windows (`[debounce]`): open windows per tenant and a pending
/// job's payload. In total a deployment holds at most `max_open_per_tenant` times its
/// registered tenants (tenants are added by the operator only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DebounceConfig {
    /// Open windows a tenant may have (each holds one of the tenant's slots, claimed by
    /// LWT before it opens: racing opens never pass it).
    pub max_open_per_tenant: usize,
    /// Bytes of a debounced job's payload.
    pub max_payload_bytes: usize,
}

impl Default for DebounceConfig {
    fn default() -> Self {
        DebounceConfig { max_open_per_tenant: 1_000, max_payload_bytes: 64 * 1024 }
    }
}

impl DebounceConfig {
    pub fn validate(&self) -> Result<(), crate::core::invalid::Invalid> {
        if !(1..=MAX_OPEN_PER_TENANT_CEILING).contains(&self.max_open_per_tenant) {
            return crate::core::invalid::Invalid::err(
                "max_open_per_tenant",
                format!("must be between 1 and {MAX_OPEN_PER_TENANT_CEILING}, e.g. 1000"),
            );
        }
        if !(1..=1 << 20).contains(&self.max_payload_bytes) {
            return crate::core::invalid::Invalid::err(
                "max_payload_bytes",
                "must be between 1 and 1048576 (1 MiB), e.g. 65536; pass larger inputs by reference",
            );
        }
        Ok(())
    }
}

/// How long a `unique_key` holds (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UniqueScope {
    Queued,
    #[default]
    QueuedOrRunning,
    Window,
}

/// What a held key means for a new submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The holder is inside the scope: answer with its id.
    Duplicate,
    /// The holder left the scope (or was never produced): take the key over.
    Free,
}

/// Whether the key's holder still holds it. `status`: the holder's row status (None: no
/// row yet); `claimed_at`: when it claimed the key; `max_produce_ms`: after this long
/// without a row, its produce failed and the claim is orphaned.
pub fn held(scope: UniqueScope, status: Option<&str>, claimed_at: Millis, now: Millis, max_produce_ms: i64) -> Held {
    let Some(status) = status else {
        // No row: being produced (holds), or never produced (free).
        return if now - claimed_at > max_produce_ms { Held::Free } else { Held::Duplicate };
    };
    let state = crate::core::events::JobState::from_status(status);
    use crate::core::events::JobState as S;
    let inside = match scope {
        // The key's TTL is the window: a key still there holds.
        UniqueScope::Window => true,
        UniqueScope::Queued => matches!(state, Some(S::Queued | S::Scheduled | S::Waiting)),
        UniqueScope::QueuedOrRunning => !state.is_some_and(S::is_terminal),
    };
    if inside {
        Held::Duplicate
    } else {
        Held::Free
    }
}

/// Keep the first payload of a debounce window, or replace it with each new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DebounceMode {
    #[default]
    Replace,
    KeepFirst,
}

/// Bounds of a debounce (the delay and max delay a submission may ask).
pub const MAX_DEBOUNCE_MS: Millis = 24 * 3_600_000;

/// When a debounced job runs: `delay` after the latest submission (`now`), but no
/// later than `max_delay` after the window's first (`first_at`).
pub fn debounce_due(first_at: Millis, now: Millis, delay: Millis, max_delay: Option<Millis>) -> Millis {
    let due = now + delay;
    match max_delay {
        Some(m) => due.min(first_at + m).max(now),
        None => due,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant's key of the system's form (a schedule's fire, a unique slot, a debounce
    /// window's job) used to be accepted and claimed first; now it is refused.
    #[test]
    fn callers_keys_stay_out_of_the_system_namespace() {
        let spec = crate::core::recurring::ScheduleSpec {
            name: "n".into(),
            job_type: "echo".into(),
            every: Some("1m".into()),
            ..Default::default()
        };
        let fire = spec.timing("id", 0).unwrap().fire_key(60_000);
        for key in [fire.as_str(), "fairway.unique/report", "fairway.debounce/0190"] {
            let why = check_caller_key(key).unwrap_err();
            assert!(why.contains("reserved") && why.contains("another prefix"), "{why}");
        }
        assert_eq!(check_caller_key("order-4711"), Ok(()));
        assert_eq!(check_caller_key("fairway-order"), Ok(()));
    }

    #[test]
    fn a_key_holds_while_its_job_is_in_scope() {
        let (at, now, max) = (1_000, 2_000, 45_000);
        use Held::*;
        use UniqueScope::*;
        for (scope, status, want) in [
            (Queued, "queued", Duplicate),
            (Queued, "scheduled", Duplicate),
            (Queued, "replayed", Duplicate),
            (Queued, "running", Free),
            (Queued, "succeeded", Free),
            (QueuedOrRunning, "queued", Duplicate),
            (QueuedOrRunning, "running", Duplicate),
            (QueuedOrRunning, "retrying", Duplicate),
            (QueuedOrRunning, "succeeded", Free),
            (QueuedOrRunning, "failed", Free),
            (QueuedOrRunning, "cancelled", Free),
            (Window, "succeeded", Duplicate),
        ] {
            assert_eq!(held(scope, Some(status), at, now, max), want, "{scope:?} {status}");
        }
        // No row yet: being produced holds; orphaned after the produce timeout.
        assert_eq!(held(Queued, None, at, at + max, max), Duplicate);
        assert_eq!(held(Queued, None, at, at + max + 1, max), Free);
    }

    #[test]
    fn debounce_runs_after_the_last_submission_within_the_max_delay() {
        assert_eq!(debounce_due(0, 0, 1_000, None), 1_000);
        assert_eq!(debounce_due(0, 5_000, 1_000, None), 6_000);
        assert_eq!(debounce_due(0, 5_000, 1_000, Some(5_500)), 5_500, "capped by max delay");
        assert_eq!(debounce_due(0, 7_000, 1_000, Some(5_500)), 7_000, "never in the past");
    }
}
