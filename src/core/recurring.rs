//! Recurring schedules, the pure rules: a schedule's definition (a cron expression in an
//! IANA time zone, or a fixed interval; a job template; a start/end window; a catch-up
//! policy; jitter), its validation, its fire times, which fires are due at `now` after a
//! stop, and the identity of each fire's job. No I/O; `now` is an argument.
//!
//! Cron expressions are evaluated in wall-clock time of their zone, and each wall-clock
//! time fires at most once:
//! - a time that does not exist (the hour skipped when clocks go forward) fires once at
//!   the first instant after the gap (02:30 on a 02:00 -> 03:00 night fires at 03:00;
//!   several skipped times collapse into that one fire);
//! - a time that exists twice (the hour repeated when clocks go back) fires once, at its
//!   first occurrence; the repeated hour's second pass fires nothing.
//!
//! An interval (`every`) counts real time from its anchor (`start_at`, else the moment
//! the schedule was created) and ignores zones and daylight saving.

use crate::model::{Millis, Pool, Priority};
use chrono::{LocalResult, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use std::str::FromStr;

/// A fire older than this at `now` was missed (the catch-up policy decides); younger
/// fires are on time and always submitted (covers a promoter hand-over of ~10 s).
pub const GRACE_MS: Millis = 60_000;
/// `catch_up = "all"` submits missed fires of at most this long ago.
pub const CATCH_UP_HORIZON_MS: Millis = 24 * 3_600_000;
/// Bounds of one schedule's definition.
pub const MIN_EVERY_MS: Millis = 1_000;
pub const MAX_EVERY_MS: Millis = 366 * 24 * 3_600_000;
pub const MAX_JITTER_MS: Millis = 3_600_000;
pub const MAX_NAME_LEN: usize = 100;
/// Highest `schedules.max_total` allowed: the promoter's leader reads every schedule's
/// cursor once a second.
pub const MAX_TOTAL_CEILING: usize = 100_000;
/// Highest `schedules.max_per_tenant` allowed: an add reads the tenant's slots
/// (`store::schedules`) before claiming one.
pub const MAX_PER_TENANT_CEILING: usize = 1_000;
/// Highest `schedules.max_payload_bytes` allowed: the leader holds a due schedule's
/// definition while it fires; larger inputs go by reference (a key the job reads).
pub const MAX_PAYLOAD_CEILING: usize = 1 << 20;
/// Latest `start_at`/`end_at` accepted (9999-12-31T23:59:59.999Z): fire-time arithmetic
/// stays far from `i64` overflow.
pub const MAX_TIME_MS: Millis = crate::core::bounds::MAX_TIME_MS;
/// Wall-clock candidates one fire-time search looks at before giving up (an expression
/// that matches nothing in years, e.g. `0 0 30 2 *`, never fires).
const MAX_STEPS: usize = 10_000;

/// How many schedules a deployment keeps (`[schedules]`): per tenant, so one tenant
/// cannot crowd the others out or load the leader's per-second read, and in total; and
/// how large one schedule's job payload may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulesConfig {
    pub max_per_tenant: usize,
    pub max_total: usize,
    /// Bytes of a schedule's `payload` as JSON.
    pub max_payload_bytes: usize,
}

impl Default for SchedulesConfig {
    fn default() -> Self {
        SchedulesConfig { max_per_tenant: 100, max_total: 10_000, max_payload_bytes: 64 * 1024 }
    }
}

impl SchedulesConfig {
    /// The field at fault and the fix.
    pub fn validate(&self) -> Result<(), crate::core::invalid::Invalid> {
        if !(1..=MAX_PER_TENANT_CEILING).contains(&self.max_per_tenant) {
            return crate::core::invalid::Invalid::err(
                "max_per_tenant",
                format!("{} must be between 1 and {MAX_PER_TENANT_CEILING}, e.g. 100", self.max_per_tenant),
            );
        }
        if !(1..=MAX_PAYLOAD_CEILING).contains(&self.max_payload_bytes) {
            return crate::core::invalid::Invalid::err(
                "max_payload_bytes",
                format!(
                    "{} must be between 1 and {MAX_PAYLOAD_CEILING} (1 MiB), e.g. 65536; pass larger inputs by \
                     reference",
                    self.max_payload_bytes
                ),
            );
        }
        if !(self.max_per_tenant..=MAX_TOTAL_CEILING).contains(&self.max_total) {
            return crate::core::invalid::Invalid::err(
                "max_total",
                format!(
                    "{} must be between schedules.max_per_tenant ({}) and {MAX_TOTAL_CEILING} (the leader reads \
                     every schedule once a second), e.g. 10000",
                    self.max_total, self.max_per_tenant
                ),
            );
        }
        Ok(())
    }
}

/// What to do with fires missed while no promoter ran (older than [`GRACE_MS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// Skip them; the schedule goes on with its next fire.
    #[default]
    None,
    /// One job, now, stands for all of them.
    One,
    /// Every one of the last 24 hours, oldest first, at the promoter's pace.
    All,
}

impl CatchUp {
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::None => "none",
            CatchUp::One => "one",
            CatchUp::All => "all",
        }
    }
}

impl FromStr for CatchUp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(CatchUp::None),
            "one" => Ok(CatchUp::One),
            "all" => Ok(CatchUp::All),
            _ => Err(format!("unknown catch_up {s:?}: expected none, one or all")),
        }
    }
}

/// A schedule as users write it (CLI flags, an HTTP body), stored as JSON.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Unique per tenant: 1 to 100 of `A-Z a-z 0-9 . _ -`.
    pub name: String,
    /// The tenant key's own tenant when omitted through the API.
    #[serde(default)]
    pub tenant: String,
    pub job_type: String,
    /// Cron expression: 5 fields (minute hour day-of-month month day-of-week) or 6 with
    /// seconds first. Exactly one of `cron` and `every`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// Fixed interval, e.g. `"30s"`, `"15m"`, `"1h"` (1 s to 366 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// IANA time zone of a cron expression (default UTC), e.g. `"Europe/Berlin"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tz: Option<String>,
    #[serde(default)]
    pub payload: serde_json::Value,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<Pool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_key: Option<String>,
    /// No fire before this time (epoch ms); also the anchor of `every`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<Millis>,
    /// No fire after this time (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<Millis>,
    #[serde(default)]
    pub catch_up: CatchUp,
    /// Each fire's job starts up to this much later (a fixed draw per fire, so every
    /// promoter agrees), e.g. `"30s"`; at most 1 h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
}

/// What is wrong with a schedule: the field and how to fix it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("schedule field `{field}`: {message}")]
pub struct SpecError {
    pub field: &'static str,
    pub message: String,
}

fn bad(field: &'static str, message: impl Into<String>) -> SpecError {
    SpecError { field, message: message.into() }
}

/// When a schedule fires.
#[derive(Debug, Clone)]
enum When {
    Cron { cron: Box<croner::Cron>, tz: Tz },
    Every { every_ms: Millis, anchor: Millis },
}

/// A validated schedule's timing: fire times, jitter, catch-up.
#[derive(Debug, Clone)]
pub struct Timing {
    when: When,
    start_at: Option<Millis>,
    end_at: Option<Millis>,
    jitter_ms: Millis,
    catch_up: CatchUp,
    /// The schedule's id: seeds the jitter draws and the fires' job ids.
    id: String,
}

/// Parses a duration such as `"2s"`, `"15m"`, `"1h 30m"`.
pub fn parse_duration(field: &'static str, s: &str) -> Result<Millis, SpecError> {
    humantime::parse_duration(s.trim())
        .map(|d| d.as_millis().min(i64::MAX as u128) as Millis)
        .map_err(|e| bad(field, format!("{s:?} is not a duration ({e}); write e.g. \"30s\", \"15m\" or \"1h\"")))
}

fn parse_cron(expr: &str) -> Result<croner::Cron, SpecError> {
    let fields = expr.split_whitespace().count();
    if !(5..=6).contains(&fields) {
        return Err(bad(
            "cron",
            format!("{expr:?} has {fields} fields; write 5 (minute hour day month weekday) or 6 (seconds first)"),
        ));
    }
    croner::Cron::new(expr)
        .with_seconds_optional()
        .parse()
        .map_err(|e| bad("cron", format!("{expr:?} is not a cron expression ({e}); e.g. \"0 2 * * *\" is 02:00 daily")))
}

/// Checks the name: 1 to 100 of `A-Z a-z 0-9 . _ -`.
pub fn check_name(name: &str) -> Result<(), SpecError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(bad("name", format!("{name:?}: use 1 to {MAX_NAME_LEN} of the characters A-Z a-z 0-9 . _ -")))
    }
}

impl ScheduleSpec {
    /// Validates everything but the tenant and the job type (the caller checks those
    /// against the registry and config) and compiles the timing. `id` is the schedule's
    /// id, `created_at` the anchor of an interval without `start_at`.
    pub fn timing(&self, id: &str, created_at: Millis) -> Result<Timing, SpecError> {
        check_name(&self.name)?;
        let when = match (&self.cron, &self.every) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(bad("cron", "give exactly one of `cron` (an expression) and `every` (an interval)"))
            }
            (Some(expr), None) => {
                let tz = match &self.tz {
                    None => Tz::UTC,
                    Some(z) => z.parse::<Tz>().map_err(|_| {
                        bad("tz", format!("{z:?} is not an IANA time zone; write e.g. \"Europe/Berlin\" or \"UTC\""))
                    })?,
                };
                When::Cron { cron: Box::new(parse_cron(expr)?), tz }
            }
            (None, Some(every)) => {
                if self.tz.is_some() {
                    return Err(bad("tz", "a time zone applies to `cron` only; `every` counts real time"));
                }
                let every_ms = parse_duration("every", every)?;
                if !(MIN_EVERY_MS..=MAX_EVERY_MS).contains(&every_ms) {
                    return Err(bad("every", format!("{every:?} is outside 1s to 366 days")));
                }
                When::Every { every_ms, anchor: self.start_at.unwrap_or(created_at) }
            }
        };
        for (field, at) in [("start_at", self.start_at), ("end_at", self.end_at)] {
            if at.is_some_and(|at| !(0..=MAX_TIME_MS).contains(&at)) {
                return Err(bad(
                    field,
                    format!("{} is outside 0 to {MAX_TIME_MS} (epoch ms up to the year 9999)", at.unwrap_or_default()),
                ));
            }
        }
        if let (Some(s), Some(e)) = (self.start_at, self.end_at) {
            if e < s {
                return Err(bad(
                    "end_at",
                    format!("end_at ({e}) is before start_at ({s}): the schedule would never fire"),
                ));
            }
        }
        let jitter_ms = match &self.jitter {
            None => 0,
            Some(j) => parse_duration("jitter", j)?,
        };
        if jitter_ms > MAX_JITTER_MS {
            return Err(bad("jitter", "at most 1h"));
        }
        if let Some(key) = &self.flow_key {
            crate::core::flow::check_key(key).map_err(|m| bad("flow_key", m))?;
        }
        let (start_at, end_at, catch_up, id) = (self.start_at, self.end_at, self.catch_up, id.to_string());
        Ok(Timing { when, start_at, end_at, jitter_ms, catch_up, id })
    }
}

/// The wall-clock time of instant `at` in `tz`, as ms of a naive (UTC-labelled) time.
fn local_ms(tz: &Tz, at: Millis) -> Millis {
    match Utc.timestamp_millis_opt(at) {
        LocalResult::Single(t) => t.with_timezone(tz).naive_local().and_utc().timestamp_millis(),
        _ => at,
    }
}

/// The instant a wall-clock time (naive ms) stands for: see the module docs for gaps
/// and repeats.
fn instant_of(tz: &Tz, local: Millis) -> Option<Millis> {
    let naive = Utc.timestamp_millis_opt(local).single()?.naive_utc();
    match tz.from_local_datetime(&naive) {
        LocalResult::Single(t) => Some(t.timestamp_millis()),
        LocalResult::Ambiguous(a, b) => Some(a.timestamp_millis().min(b.timestamp_millis())),
        LocalResult::None => Some(gap_end(tz, local)),
    }
}

/// The first instant whose wall-clock time is past `local`, a time inside a gap:
/// the moment the gap ends. Wall-clock time only moves forward within a day of a gap,
/// so a binary search over instants finds it.
fn gap_end(tz: &Tz, local: Millis) -> Millis {
    const DAY: Millis = 26 * 3_600_000;
    let (mut lo, mut hi) = (local - DAY, local + DAY);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if local_ms(tz, mid) > local {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// How far ahead of a fire the promoter submits its job (with `execute_at` at the fire,
/// so a pool worker holds it in memory until then and starts it on time to the timer's
/// millisecond, `core::promotion::HOLD_AHEAD_MS`), instead of when the first pass after
/// the fire finds it due (up to a pass period, 250 ms, plus the submission's hops late).
/// The price: a schedule paused, edited or removed less than this before a fire still
/// fires it.
pub const FIRE_AHEAD_MS: Millis = 600;
// A fired-ahead job must be held by its worker, not sent to the delayed topic.
const _: () = assert!(FIRE_AHEAD_MS < crate::core::promotion::HOLD_AHEAD_MS);

/// Whether a fire at `at` is late at `now` (older than [`GRACE_MS`]: submitted only by a
/// catch-up).
pub fn is_late(at: Millis, now: Millis) -> bool {
    at < now - GRACE_MS
}

/// One fire: its time (its identity) and when its job may start (jitter added).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fire {
    pub at: Millis,
    pub run_at: Millis,
}

/// What one promoter pass submits for a schedule, and the schedule's next cursor (its
/// first fire not yet submitted; None: it never fires again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    pub fires: Vec<Fire>,
    pub cursor: Option<Millis>,
    /// Missed fires were skipped by the catch-up policy (`none`: all of them; `one`: all
    /// but the one submitted; `all`: those beyond [`CATCH_UP_HORIZON_MS`]).
    pub skipped: bool,
}

impl Timing {
    /// The first fire strictly after `t`, inside the start/end window.
    pub fn next_after(&self, t: Millis) -> Option<Millis> {
        let t = match self.start_at {
            Some(s) if s > t => s - 1,
            _ => t,
        };
        let at = match &self.when {
            When::Every { every_ms, anchor } => {
                if t < *anchor {
                    *anchor
                } else {
                    anchor + ((t - anchor) / every_ms + 1) * every_ms
                }
            }
            When::Cron { cron, tz } => self.next_cron(cron, tz, t)?,
        };
        Some(at).filter(|at| self.end_at.is_none_or(|e| *at <= e))
    }

    fn next_cron(&self, cron: &croner::Cron, tz: &Tz, t: Millis) -> Option<Millis> {
        // Whole seconds: the cron crate steps from the given time by one second, keeping
        // its milliseconds.
        let mut local = Utc.timestamp_millis_opt(local_ms(tz, t).div_euclid(1000) * 1000).single()?;
        for _ in 0..MAX_STEPS {
            let cand = cron.find_next_occurrence(&local, false).ok()?;
            let at = instant_of(tz, cand.timestamp_millis())?;
            // A wall time of a repeated hour already passed (its first occurrence is
            // before `t`): look further.
            if at > t {
                return Some(at);
            }
            local = cand;
        }
        None
    }

    /// The first fire at or after `t`.
    pub fn at_or_after(&self, t: Millis) -> Option<Millis> {
        self.next_after(t - 1)
    }

    /// The next `n` fires from `cursor` on (for listings).
    pub fn upcoming(&self, cursor: Option<Millis>, n: usize) -> Vec<Millis> {
        let mut out = Vec::with_capacity(n);
        let mut next = cursor;
        while let Some(at) = next.filter(|_| out.len() < n) {
            out.push(at);
            next = self.next_after(at);
        }
        out
    }

    /// A fire's job start: its time plus a draw in [0, jitter) fixed by (id, time).
    fn run_at(&self, at: Millis, not_before: Millis) -> Millis {
        let j = if self.jitter_ms > 0 { (seed(&self.id, at) % self.jitter_ms as u64) as Millis } else { 0 };
        at.max(not_before) + j
    }

    /// The fires due by `until` (at `now` or up to [`FIRE_AHEAD_MS`] later) from `cursor`
    /// (the first fire not yet submitted), at most `limit`, with the catch-up policy
    /// applied to fires older than [`GRACE_MS`] at `now`.
    pub fn due_by(&self, cursor: Millis, now: Millis, until: Millis, limit: usize) -> Pass {
        if limit == 0 || cursor > until {
            return Pass { fires: Vec::new(), cursor: Some(cursor), skipped: false };
        }
        let late = now - GRACE_MS;
        let mut fires = Vec::new();
        let mut next = Some(cursor);
        let mut skipped = false;
        if cursor < late {
            next = match self.catch_up {
                CatchUp::None => self.at_or_after(late),
                CatchUp::One => {
                    fires.push(Fire { at: cursor, run_at: self.run_at(cursor, now) });
                    self.at_or_after(late)
                }
                CatchUp::All => self.at_or_after(cursor.max(now - CATCH_UP_HORIZON_MS)),
            };
            skipped = match self.catch_up {
                CatchUp::None => true,
                CatchUp::One => self.next_after(cursor).is_some_and(|n| n < late),
                CatchUp::All => cursor < now - CATCH_UP_HORIZON_MS,
            };
        }
        while let Some(at) = next.filter(|at| *at <= until && fires.len() < limit) {
            fires.push(Fire { at, run_at: self.run_at(at, at) });
            next = self.next_after(at);
        }
        Pass { fires, cursor: next, skipped }
    }

    /// The job id of the fire at `at`: a UUID v7 whose time is the fire's and whose other
    /// bits come from (schedule id, fire time), so every promoter derives the same id and
    /// a fire submitted twice collapses into one job.
    pub fn job_id(&self, at: Millis) -> String {
        fire_job_id(&self.id, at)
    }

    /// The idempotency key of the fire at `at` (scoped to the tenant by the store).
    pub fn fire_key(&self, at: Millis) -> String {
        format!("fairway.schedule/{}/{at}", self.id)
    }
}

/// 64 bits of SHA-256 over (`id`, `at`).
fn seed(id: &str, at: Millis) -> u64 {
    let bytes = digest(id, at);
    u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"))
}

fn digest(id: &str, at: Millis) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(id.as_bytes());
    h.update(at.to_be_bytes());
    h.finalize().into()
}

/// A UUID v7 with `at` as its time and (id, at)'s digest as its other bits.
pub fn fire_job_id(id: &str, at: Millis) -> String {
    let d = digest(id, at);
    let rest: [u8; 10] = d[..10].try_into().expect("10 bytes");
    uuid::Builder::from_unix_timestamp_millis(at.max(0) as u64, &rest).into_uuid().to_string()
}

#[cfg(test)]
mod tests;
