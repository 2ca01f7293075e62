//! Retry policy: given why an attempt failed and what the job went through so far,
//! decide whether it runs again (on which retry topic, not before when) or goes to the
//! dead-letter queue (with a reason a person can act on).
//!
//! Retry is per failure class, because the classes fail for different reasons:
//! - `app_error` (the handler returned an error) may be transient: a schedule of growing
//!   delays (1 s, 5 s, 30 s, 5 min, 30 min, +-25% jitter) and 5 attempts in all.
//! - `timeout` usually means a runaway or a job in the wrong pool: one retry, then DLQ.
//! - `dependency` (something the handler calls is down): more attempts with capped
//!   exponential backoff and full jitter (2 s x2 up to 5 min, 8 attempts), so a
//!   recovering dependency is not hit by a synchronised wave; the per-job-type circuit
//!   breaker (`core::breaker`) stops the storm while it is down.
//! - `worker_crash` is not the job's fault and never uses up an attempt: it is
//!   re-dispatched after a short delay with `crash_count + 1`; a job that keeps killing
//!   workers is treated as poison once it reaches the crash limit (3).
//! - `poison` (the job type is quarantined by `core::poison`): at most 2 attempts.
//! - `permanent` (bad input) cannot succeed: DLQ at once.
//!
//! Limits count the job's attempts in all classes together (`JobSubmitted::attempt`): a
//! failure of class C is retried only while the attempts used, this one included, stay
//! below C's `max_attempts`. So "timeout: 2 attempts" means a timeout on the first
//! attempt gets one retry and a timeout later on is final.
//!
//! Everything is a pure function of its inputs: `now` and the jitter draw in [0, 1) are
//! arguments, so the worker stays testable and a decision can be replayed exactly.
//!
//! [`RetryBudget`] adds the per-tenant guard: a tenant's retries may not exceed twice its
//! rate of fresh dispatches (plus a small allowance), so one tenant's broken job cannot
//! fill the cluster with retries; past the cap, failures go to the DLQ early. With
//! [`RetryBudget::fleet_wide`] the counts and the cap are the whole pool's, shared out
//! between its workers (`core::fleet_counts`).
//!
//! Configuration ([`RetryPolicy`]) deserialises from partial input: only the fields
//! given override the defaults of their class, durations are milliseconds or strings
//! like `"500ms"`, `"5s"`, `"5m"`, `"1h"`.

use crate::core::fleet_counts::FleetBudget;
use crate::core::FastMap;
use crate::model::{FailureClass, JobSubmitted, Millis};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

// ---------------------------------------------------------------------------------------
// Durations and jitter in configuration

/// A non-negative duration in milliseconds, written in configuration as a number of
/// milliseconds or a string with a unit: `"250ms"`, `"5s"`, `"1.5s"`, `"5m"`, `"5min"`,
/// `"2h"`, `"1d"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct DurationMs(pub Millis);

impl DurationMs {
    pub const fn ms(ms: Millis) -> Self {
        DurationMs(ms)
    }
    pub const fn secs(s: i64) -> Self {
        DurationMs(s * 1_000)
    }
    pub const fn mins(m: i64) -> Self {
        DurationMs(m * 60_000)
    }
    pub fn as_millis(self) -> Millis {
        self.0
    }
}

/// Longest duration accepted in configuration (about 10 years): keeps `now + delay` far
/// from overflow.
const MAX_DURATION_MS: i64 = 10 * 365 * 24 * 3_600_000;

impl FromStr for DurationMs {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let unit_ms: f64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "ms" => 1.0,
            "s" | "sec" | "secs" => 1_000.0,
            "m" | "min" | "mins" => 60_000.0,
            "h" | "hr" | "hrs" => 3_600_000.0,
            "d" => 86_400_000.0,
            other => {
                return Err(format!(
                    "duration {s:?} has unknown unit {other:?}: use ms, s, m (or min), h or d, e.g. \"5s\""
                ))
            }
        };
        let value: f64 = num.parse().map_err(|_| {
            format!("duration {s:?} is not a non-negative number with a unit, e.g. \"500ms\", \"5s\", \"5m\"")
        })?;
        let ms = (value * unit_ms).round();
        if !ms.is_finite() || ms > MAX_DURATION_MS as f64 {
            return Err(format!("duration {s:?} is too long (at most 10 years)"));
        }
        Ok(DurationMs(ms as i64))
    }
}

impl fmt::Display for DurationMs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0;
        for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
            if ms != 0 && ms % size == 0 {
                return write!(f, "{}{}", ms / size, unit);
            }
        }
        write!(f, "{ms}ms")
    }
}

impl Serialize for DurationMs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DurationMs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = DurationMs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration: milliseconds as a number, or a string like \"5s\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<DurationMs, E> {
                if (0..=MAX_DURATION_MS).contains(&v) {
                    Ok(DurationMs(v))
                } else {
                    Err(E::custom(format!("duration {v} ms is out of range (0 to 10 years)")))
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<DurationMs, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(i64::MAX))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<DurationMs, E> {
                if v.is_finite() && v >= 0.0 && v <= MAX_DURATION_MS as f64 {
                    Ok(DurationMs(v.round() as i64))
                } else {
                    Err(E::custom(format!("duration {v} ms is out of range (0 to 10 years)")))
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DurationMs, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// How a nominal delay is randomised, so that jobs that failed together do not all
/// come back together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// Exactly the nominal delay.
    None,
    /// Uniform in `nominal x [1 - f, 1 + f]`; written as a fraction (`0.25`) or a
    /// percentage (`"25%"`).
    Proportional(f64),
    /// Uniform in `[0, nominal]` ("full jitter"); written `"full"`.
    Full,
}

impl Jitter {
    /// The delay for a draw `u` in [0, 1). Values outside are clamped, NaN counts as 0.5.
    pub fn apply(self, nominal: Millis, u: f64) -> Millis {
        let d = nominal.max(0) as f64;
        let u = clamp_unit(u);
        let v = match self {
            Jitter::None => d,
            Jitter::Proportional(f) => d * (1.0 + clamp_fraction(f) * (2.0 * u - 1.0)),
            Jitter::Full => d * u,
        };
        // `as` saturates and maps NaN to 0
        (v.round() as i64).max(0)
    }

    /// Smallest and largest delay [`Jitter::apply`] can return for `nominal`.
    pub fn bounds(self, nominal: Millis) -> (Millis, Millis) {
        let d = nominal.max(0) as f64;
        match self {
            Jitter::None => (nominal.max(0), nominal.max(0)),
            Jitter::Proportional(f) => {
                let f = clamp_fraction(f);
                (((d * (1.0 - f)).floor() as i64).max(0), (d * (1.0 + f)).ceil() as i64)
            }
            Jitter::Full => (0, nominal.max(0)),
        }
    }
}

fn clamp_unit(u: f64) -> f64 {
    if u.is_nan() {
        0.5
    } else {
        u.clamp(0.0, 1.0)
    }
}

fn clamp_fraction(f: f64) -> f64 {
    if f.is_nan() {
        0.0
    } else {
        f.clamp(0.0, 1.0)
    }
}

impl Serialize for Jitter {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Jitter::None => s.serialize_str("none"),
            Jitter::Full => s.serialize_str("full"),
            Jitter::Proportional(f) => s.serialize_f64(*f),
        }
    }
}

impl FromStr for Jitter {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let bad = || {
            format!("jitter {s:?} is not understood: use \"none\", \"full\", a fraction like 0.25 or a percentage like \"25%\"")
        };
        match t.as_str() {
            "none" | "off" | "0" => Ok(Jitter::None),
            "full" => Ok(Jitter::Full),
            _ => {
                let f = match t.strip_suffix('%') {
                    Some(p) => p.trim().parse::<f64>().map_err(|_| bad())? / 100.0,
                    None => t.parse::<f64>().map_err(|_| bad())?,
                };
                jitter_fraction(f)
            }
        }
    }
}

fn jitter_fraction(f: f64) -> Result<Jitter, String> {
    if f.is_finite() && (0.0..=1.0).contains(&f) {
        Ok(if f == 0.0 { Jitter::None } else { Jitter::Proportional(f) })
    } else {
        Err(format!("jitter fraction {f} is out of range: use 0.0 to 1.0 (e.g. 0.25 for +-25%)"))
    }
}

impl<'de> Deserialize<'de> for Jitter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Jitter;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a jitter: \"none\", \"full\", a fraction like 0.25 or \"25%\"")
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Jitter, E> {
                jitter_fraction(v).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Jitter, E> {
                jitter_fraction(v as f64).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Jitter, E> {
                jitter_fraction(v as f64).map_err(E::custom)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Jitter, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------------------------------
// Policy

/// Retry rules for one failure class.
///
/// The delay before the retry that follows the job's `n`-th used attempt (n = 0, 1, ...)
/// is `delays[n]` (the last entry repeats) when `delays` is not empty, else
/// `min(max_delay, base x factor^n)`; then `jitter` is applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassPolicy {
    /// Attempts in all (all classes together) after which a failure of this class is
    /// final. 1 = never retried.
    pub max_attempts: i32,
    /// Explicit schedule; empty = exponential backoff.
    pub delays: Vec<DurationMs>,
    pub base: DurationMs,
    pub factor: f64,
    pub max_delay: DurationMs,
    pub jitter: Jitter,
}

impl ClassPolicy {
    /// A schedule of fixed delays with the given jitter.
    pub fn schedule(max_attempts: i32, delays: Vec<DurationMs>, jitter: Jitter) -> Self {
        ClassPolicy {
            max_attempts,
            delays,
            base: DurationMs::secs(1),
            factor: 2.0,
            max_delay: DurationMs::mins(5),
            jitter,
        }
    }

    /// Capped exponential backoff.
    pub fn exponential(
        max_attempts: i32,
        base: DurationMs,
        factor: f64,
        max_delay: DurationMs,
        jitter: Jitter,
    ) -> Self {
        ClassPolicy { max_attempts, delays: Vec::new(), base, factor, max_delay, jitter }
    }

    /// Delay before jitter for the retry after `used` attempts (0-based index).
    pub fn nominal_delay(&self, used: i32) -> Millis {
        let n = used.max(0) as usize;
        if let Some(last) = self.delays.last() {
            return self.delays.get(n).unwrap_or(last).0.max(0);
        }
        let cap = self.max_delay.0.max(0);
        let factor = if self.factor.is_finite() { self.factor.max(1.0) } else { 1.0 };
        let v = self.base.0.max(0) as f64 * factor.powi(n.min(4_096) as i32);
        if !v.is_finite() || v >= cap as f64 {
            cap
        } else {
            v.round() as i64
        }
    }

    /// The jittered delay for draw `u` in [0, 1).
    pub fn delay(&self, used: i32, u: f64) -> Millis {
        self.jitter.apply(self.nominal_delay(used), u)
    }

    /// Smallest and largest delay `delay(used, _)` can return.
    pub fn delay_bounds(&self, used: i32) -> (Millis, Millis) {
        self.jitter.bounds(self.nominal_delay(used))
    }

    fn validate(&self, class: &str) -> Result<(), PolicyError> {
        let err = |field: &str, problem: String| PolicyError::Invalid { field: format!("{class}.{field}"), problem };
        if !(1..=10_000).contains(&self.max_attempts) {
            return Err(err(
                "max_attempts",
                format!("{} is out of range: use 1 (no retry) to 10000", self.max_attempts),
            ));
        }
        if !(self.factor.is_finite() && (1.0..=100.0).contains(&self.factor)) {
            return Err(err(
                "factor",
                format!("{} is out of range: use 1.0 to 100.0 (2.0 doubles each delay)", self.factor),
            ));
        }
        for (name, d) in [("base", self.base), ("max_delay", self.max_delay)]
            .into_iter()
            .chain(self.delays.iter().map(|d| ("delays", *d)))
        {
            if !(0..=MAX_DURATION_MS).contains(&d.0) {
                return Err(err(name, format!("{} ms is out of range (0 to 10 years)", d.0)));
            }
        }
        validate_jitter(self.jitter).map_err(|p| err("jitter", p))
    }
}

fn validate_jitter(j: Jitter) -> Result<(), String> {
    match j {
        Jitter::Proportional(f) if !(f.is_finite() && (0.0..=1.0).contains(&f)) => {
            Err(format!("fraction {f} is out of range: use 0.0 to 1.0"))
        }
        _ => Ok(()),
    }
}

/// Rules for worker crashes: re-dispatch after a short delay without using an attempt;
/// at `max_crashes` crashes the job is dead-lettered as poison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CrashPolicy {
    pub max_crashes: i32,
    pub delay: DurationMs,
    pub jitter: Jitter,
}

impl CrashPolicy {
    fn validate(&self) -> Result<(), PolicyError> {
        let err =
            |field: &str, problem: String| PolicyError::Invalid { field: format!("worker_crash.{field}"), problem };
        if !(1..=10_000).contains(&self.max_crashes) {
            return Err(err("max_crashes", format!("{} is out of range: use 1 to 10000", self.max_crashes)));
        }
        if !(0..=MAX_DURATION_MS).contains(&self.delay.0) {
            return Err(err("delay", format!("{} ms is out of range", self.delay.0)));
        }
        validate_jitter(self.jitter).map_err(|p| err("jitter", p))
    }
}

/// The retry rules of one job type. Deserialises from a partial table: fields left out
/// keep their defaults, e.g. (TOML)
///
/// ```toml
/// [app_error]
/// max_attempts = 3
/// delays = ["1s", "10s"]
/// [dependency]
/// max_delay = "1m"
/// ```
///
/// Giving `base`, `factor` or `max_delay` without `delays` switches that class to
/// exponential backoff.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RetryPolicyPatch")]
pub struct RetryPolicy {
    pub app_error: ClassPolicy,
    pub timeout: ClassPolicy,
    pub dependency: ClassPolicy,
    pub worker_crash: CrashPolicy,
    pub poison: ClassPolicy,
    /// A `process` job killed for a resource limit: one retry (it may have met a busy
    /// moment), then the DLQ.
    pub resource: ClassPolicy,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            app_error: ClassPolicy::schedule(
                5,
                vec![
                    DurationMs::secs(1),
                    DurationMs::secs(5),
                    DurationMs::secs(30),
                    DurationMs::mins(5),
                    DurationMs::mins(30),
                ],
                Jitter::Proportional(0.25),
            ),
            timeout: ClassPolicy::schedule(2, vec![DurationMs::secs(5)], Jitter::Proportional(0.25)),
            dependency: ClassPolicy::exponential(8, DurationMs::secs(2), 2.0, DurationMs::mins(5), Jitter::Full),
            worker_crash: CrashPolicy { max_crashes: 3, delay: DurationMs::secs(1), jitter: Jitter::Proportional(0.5) },
            poison: ClassPolicy::schedule(2, vec![DurationMs::secs(30)], Jitter::Proportional(0.25)),
            resource: ClassPolicy::schedule(2, vec![DurationMs::secs(1)], Jitter::Proportional(0.25)),
        }
    }
}

/// Invalid retry configuration; names the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("retry policy {field}: {problem}")]
    Invalid { field: String, problem: String },
}

/// Partial rules for one class: only the fields given override.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassPolicyPatch {
    pub max_attempts: Option<i32>,
    pub delays: Option<Vec<DurationMs>>,
    pub base: Option<DurationMs>,
    pub factor: Option<f64>,
    pub max_delay: Option<DurationMs>,
    pub jitter: Option<Jitter>,
}

/// Partial crash rules.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrashPolicyPatch {
    pub max_crashes: Option<i32>,
    pub delay: Option<DurationMs>,
    pub jitter: Option<Jitter>,
}

/// Partial retry rules, e.g. one job type's overrides of the global ones.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicyPatch {
    pub app_error: Option<ClassPolicyPatch>,
    pub timeout: Option<ClassPolicyPatch>,
    pub dependency: Option<ClassPolicyPatch>,
    pub worker_crash: Option<CrashPolicyPatch>,
    pub poison: Option<ClassPolicyPatch>,
    pub resource: Option<ClassPolicyPatch>,
}

fn merge_class(base: &ClassPolicy, p: &ClassPolicyPatch) -> ClassPolicy {
    let mut out = base.clone();
    if let Some(v) = p.max_attempts {
        out.max_attempts = v;
    }
    if let Some(v) = p.base {
        out.base = v;
    }
    if let Some(v) = p.factor {
        out.factor = v;
    }
    if let Some(v) = p.max_delay {
        out.max_delay = v;
    }
    if let Some(v) = p.jitter {
        out.jitter = v;
    }
    match &p.delays {
        Some(d) => out.delays = d.clone(),
        None if p.base.is_some() || p.factor.is_some() || p.max_delay.is_some() => out.delays.clear(),
        None => {}
    }
    out
}

impl RetryPolicy {
    /// These rules with `patch` applied on top, validated.
    pub fn merged(&self, patch: &RetryPolicyPatch) -> Result<RetryPolicy, PolicyError> {
        let class = |b: &ClassPolicy, p: &Option<ClassPolicyPatch>| match p {
            Some(p) => merge_class(b, p),
            None => b.clone(),
        };
        let mut crash = self.worker_crash.clone();
        if let Some(p) = &patch.worker_crash {
            if let Some(v) = p.max_crashes {
                crash.max_crashes = v;
            }
            if let Some(v) = p.delay {
                crash.delay = v;
            }
            if let Some(v) = p.jitter {
                crash.jitter = v;
            }
        }
        let out = RetryPolicy {
            app_error: class(&self.app_error, &patch.app_error),
            timeout: class(&self.timeout, &patch.timeout),
            dependency: class(&self.dependency, &patch.dependency),
            worker_crash: crash,
            poison: class(&self.poison, &patch.poison),
            resource: class(&self.resource, &patch.resource),
        };
        out.validate()?;
        Ok(out)
    }

    /// Check every field; the error names the first bad one and how to fix it.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.app_error.validate("app_error")?;
        self.timeout.validate("timeout")?;
        self.dependency.validate("dependency")?;
        self.poison.validate("poison")?;
        self.resource.validate("resource")?;
        self.worker_crash.validate()
    }

    /// The rules of a class that is retried with backoff; None for `worker_crash`
    /// (see [`RetryPolicy::worker_crash`]) and `permanent` (never retried).
    pub fn for_class(&self, class: FailureClass) -> Option<&ClassPolicy> {
        match class {
            FailureClass::AppError => Some(&self.app_error),
            FailureClass::Timeout => Some(&self.timeout),
            FailureClass::Dependency => Some(&self.dependency),
            FailureClass::Poison => Some(&self.poison),
            FailureClass::Resource => Some(&self.resource),
            FailureClass::WorkerCrash | FailureClass::Permanent => None,
        }
    }
}

impl TryFrom<RetryPolicyPatch> for RetryPolicy {
    type Error = PolicyError;
    fn try_from(p: RetryPolicyPatch) -> Result<Self, PolicyError> {
        RetryPolicy::default().merged(&p)
    }
}

/// The retry topic a failure class is retried on: `retry.app_error`, `retry.timeout`,
/// `retry.dependency` or `retry.crash`. Poison and resource retries ride the app_error
/// topic (there is no topic of their own); permanent failures are never retried.
pub fn retry_topic_class(class: FailureClass) -> Option<FailureClass> {
    match class {
        FailureClass::AppError | FailureClass::Poison | FailureClass::Resource => Some(FailureClass::AppError),
        FailureClass::Timeout => Some(FailureClass::Timeout),
        FailureClass::Dependency => Some(FailureClass::Dependency),
        FailureClass::WorkerCrash => Some(FailureClass::WorkerCrash),
        FailureClass::Permanent => None,
    }
}

// ---------------------------------------------------------------------------------------
// Decision

/// What the job went through before the failure being decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttemptState {
    /// Attempts used so far, not counting the one that just failed.
    pub attempt: i32,
    /// Worker crashes so far, not counting this one.
    pub crash_count: i32,
    /// Error of the attempt that just failed (or the last one known).
    pub last_error: Option<String>,
}

impl From<&JobSubmitted> for AttemptState {
    fn from(job: &JobSubmitted) -> Self {
        AttemptState { attempt: job.attempt, crash_count: job.crash_count, last_error: job.last_error.clone() }
    }
}

/// What to do with a failed job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Publish the job to the retry topic of `class_topic` (see [`retry_topic_class`])
    /// with `not_before`, `attempt` and `crash_count` set to these values.
    Retry { class_topic: FailureClass, not_before: Millis, attempt: i32, crash_count: i32 },
    /// Publish to the DLQ with `reason`: what happened and what to do. Record the class
    /// given by [`dead_letter_class`] and the attempts given by [`attempts_used`].
    DeadLetter { reason: String },
}

impl Decision {
    pub fn is_retry(&self) -> bool {
        matches!(self, Decision::Retry { .. })
    }
}

/// The failure class to record on a dead letter decided for a failure of `class`: a
/// worker crash is only ever dead-lettered at the crash limit, which makes it `Poison`;
/// every other class is recorded as itself.
pub fn dead_letter_class(class: FailureClass) -> FailureClass {
    match class {
        FailureClass::WorkerCrash => FailureClass::Poison,
        c => c,
    }
}

/// Attempts used once the failure of `class` is counted: a worker crash uses none,
/// every other failure one. For `DeadLetter::attempts` and the job row.
pub fn attempts_used(class: FailureClass, job: &AttemptState) -> i32 {
    let used = job.attempt.max(0);
    match class {
        FailureClass::WorkerCrash => used,
        _ => used.saturating_add(1),
    }
}

/// Longest piece of the last error quoted in a reason.
const ERROR_QUOTE_CHARS: usize = 300;

fn last_error_clause(job: &AttemptState) -> String {
    match job.last_error.as_deref().map(str::trim) {
        Some(e) if !e.is_empty() => {
            let mut quoted: String = e.chars().take(ERROR_QUOTE_CHARS).collect();
            if e.chars().count() > ERROR_QUOTE_CHARS {
                quoted.push_str("...");
            }
            format!("; last error: {quoted}")
        }
        _ => String::new(),
    }
}

fn exhausted_reason(class: FailureClass, used: i32, max: i32, job: &AttemptState) -> String {
    let err = last_error_clause(job);
    match class {
        FailureClass::AppError => format!(
            "app_error: {used} of {max} attempts used{err}; fix the handler or the input, then replay from the DLQ"
        ),
        FailureClass::Timeout => format!(
            "timeout: the job ran past its deadline, {used} of at most {max} attempts used{err}; \
             raise the job type's timeout or move it to a longer pool (or make it checkpoint), then replay from the DLQ"
        ),
        FailureClass::Dependency => format!(
            "dependency: a dependency kept failing, {used} of {max} attempts used{err}; \
             check the dependency's health and replay from the DLQ once it has recovered"
        ),
        FailureClass::Poison => format!(
            "poison: the job type is quarantined (it fails most of the time), {used} of at most {max} attempts used{err}; \
             fix the job type's handler, then bulk-replay its dead letters"
        ),
        FailureClass::Resource => format!(
            "resource: the job was killed for a resource limit, {used} of at most {max} attempts used{err}; \
             raise the job type's [limits] or make the job use less, then replay from the DLQ"
        ),
        FailureClass::WorkerCrash | FailureClass::Permanent => format!(
            "{class}: {used} of {max} attempts used{err}; replay from the DLQ when fixed"
        ),
    }
}

/// Decide what happens after an attempt failed with `class`.
///
/// `job` is the state before this failure, `now` the current time and `jitter` a draw
/// uniform in [0, 1) (values outside are clamped; NaN counts as 0.5). The result depends
/// on nothing else.
pub fn decide(class: FailureClass, job: &AttemptState, policy: &RetryPolicy, now: Millis, jitter: f64) -> Decision {
    let used = job.attempt.max(0);
    let crashes = job.crash_count.max(0);
    match class {
        FailureClass::Permanent => Decision::DeadLetter {
            reason: format!(
                "permanent: retrying cannot help (invalid input, rejected request, or unknown tenant or job type){}; \
                 fix the input and submit it again, or replay from the DLQ once the cause is fixed",
                last_error_clause(job)
            ),
        },
        FailureClass::WorkerCrash => {
            let p = &policy.worker_crash;
            let crash_count = crashes.saturating_add(1);
            if crash_count >= p.max_crashes {
                Decision::DeadLetter {
                    reason: format!(
                        "poison: the job was running on a worker that died or lost it {crash_count} times \
                         (limit {}){}; it probably exhausts memory or aborts the process: inspect the payload and \
                         the worker logs, fix the handler, then replay from the DLQ",
                        p.max_crashes,
                        last_error_clause(job)
                    ),
                }
            } else {
                Decision::Retry {
                    class_topic: FailureClass::WorkerCrash,
                    not_before: now.saturating_add(p.jitter.apply(p.delay.0, jitter)),
                    attempt: used,
                    crash_count,
                }
            }
        }
        FailureClass::AppError
        | FailureClass::Timeout
        | FailureClass::Dependency
        | FailureClass::Poison
        | FailureClass::Resource => {
            let p = match class {
                FailureClass::AppError => &policy.app_error,
                FailureClass::Timeout => &policy.timeout,
                FailureClass::Dependency => &policy.dependency,
                FailureClass::Resource => &policy.resource,
                _ => &policy.poison,
            };
            let after = used.saturating_add(1);
            if after >= p.max_attempts {
                Decision::DeadLetter { reason: exhausted_reason(class, after, p.max_attempts.max(1), job) }
            } else {
                Decision::Retry {
                    class_topic: retry_topic_class(class).unwrap_or(FailureClass::AppError),
                    not_before: now.saturating_add(p.delay(used, jitter)),
                    attempt: after,
                    crash_count: crashes,
                }
            }
        }
    }
}

/// A failed attempt to decide on: how it failed, the job's attempts so far, and its
/// type's retry policy.
#[derive(Debug, Clone, Copy)]
pub struct Failed<'a> {
    pub class: FailureClass,
    pub state: &'a AttemptState,
    pub policy: &'a RetryPolicy,
}

/// [`decide`], then the tenant's retry budget: a retry the budget refuses becomes a dead
/// letter early. Crash re-dispatches are exempt (a crash is not the tenant's fault) and
/// do not count against the budget.
pub fn decide_with_budget(
    failed: Failed<'_>,
    budget: &mut RetryBudget,
    tenant: &str,
    now: Millis,
    jitter: f64,
) -> Decision {
    let Failed { class, state: job, policy } = failed;
    let d = decide(class, job, policy, now, jitter);
    if class == FailureClass::WorkerCrash || !d.is_retry() {
        return d;
    }
    match budget.try_retry(tenant, now) {
        Ok(()) => d,
        Err(e) => Decision::DeadLetter {
            reason: format!(
                "{class}: dropped before its retry because {e}{}; fix the failing job type, then replay from the DLQ",
                last_error_clause(job)
            ),
        },
    }
}

// ---------------------------------------------------------------------------------------
// Per-tenant retry budget

/// Settings of [`RetryBudget`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryBudgetConfig {
    /// Retries allowed per fresh dispatch, as rates (2.0 = twice the dispatch rate).
    pub ratio: f64,
    /// Time constant of the decaying counts: roughly "over the last `window`".
    pub window: DurationMs,
    /// Retries always allowed on top, so a quiet tenant can still retry a few jobs.
    pub allowance: f64,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        RetryBudgetConfig { ratio: 2.0, window: DurationMs::mins(5), allowance: 20.0 }
    }
}

impl RetryBudgetConfig {
    /// The first bad field, what is wrong with it and the fix.
    pub fn validate(&self) -> Result<(), crate::core::invalid::Invalid> {
        if !(self.ratio.is_finite() && self.ratio >= 0.0) {
            return crate::core::invalid::Invalid::err(
                "ratio",
                format!("{} is not a rate: use a number of 0 or more (e.g. 2.0)", self.ratio),
            );
        }
        if self.window.0 < 1_000 {
            return crate::core::invalid::Invalid::err(
                "window",
                format!("{} is too short: use at least \"1s\" (e.g. \"5m\")", self.window),
            );
        }
        if !(self.allowance.is_finite() && self.allowance >= 0.0) {
            return crate::core::invalid::Invalid::err(
                "allowance",
                format!("{} is not a count: use 0 or more (e.g. 20)", self.allowance),
            );
        }
        Ok(())
    }
}

/// A retry the budget refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "tenant {tenant:?} is over its retry budget: {retries:.1} retries against {dispatches:.1} fresh dispatches \
     in the last ~{window} (cap: {ratio}x dispatches + {allowance}){fleet}"
)]
pub struct BudgetExceeded {
    pub tenant: String,
    pub retries: f64,
    pub dispatches: f64,
    pub ratio: f64,
    pub allowance: f64,
    pub window: DurationMs,
    /// Fleet-wide budgets: how this worker's part ran out (empty otherwise).
    pub fleet: String,
}

/// The `fleet` clause of a refusal of a fleet-wide budget.
fn fleet_clause(r: &crate::core::fleet_counts::Refusal) -> String {
    if r.stale {
        format!(
            "; counts are fleet-wide and this worker could not read the other workers' counts lately \
             (its {} retries of allotment are used; check the database)",
            r.allotment
        )
    } else {
        format!(
            "; counts are fleet-wide over {} workers and this worker's allotment of {} retries until the next \
             exchange is used",
            r.workers, r.allotment
        )
    }
}

#[derive(Debug, Clone, Copy)]
struct Decayed {
    at: Millis,
    dispatches: f64,
    retries: f64,
}

impl Decayed {
    fn advance(&mut self, now: Millis, tau_ms: f64) {
        let dt = now.saturating_sub(self.at);
        if dt > 0 {
            let k = (-(dt as f64) / tau_ms).exp();
            self.dispatches *= k;
            self.retries *= k;
            self.at = now;
        }
    }
}

/// Per-tenant retry budget: exponentially decayed counts of fresh dispatches and of
/// retries (O(1) memory per tenant, no timers). A retry is allowed while
/// `retries + 1 <= ratio x dispatches + allowance`.
///
/// Count as dispatches only first attempts (jobs read from the pool topics), not jobs
/// read back from retry topics: otherwise retries would raise their own budget.
#[derive(Debug, Clone, Default)]
pub struct RetryBudget {
    config: RetryBudgetConfig,
    tenants: FastMap<String, Decayed>,
    /// Fleet-wide: the other workers' counts and this worker's allotments.
    fleet: Option<FleetBudget>,
}

impl RetryBudget {
    pub fn new(config: RetryBudgetConfig) -> Self {
        RetryBudget { config, tenants: FastMap::default(), fleet: None }
    }

    /// Judge on the counts of every worker of the pool (exchanged through
    /// `worker::quota`), this one being `me`.
    pub fn fleet_wide(&mut self, me: &str) {
        self.fleet = Some(FleetBudget::new(me, self.tau()));
    }

    /// The fleet-wide part, when on.
    pub fn fleet_mut(&mut self) -> Option<&mut FleetBudget> {
        self.fleet.as_mut()
    }

    /// Rows of this worker's changed counts for the exchange (none when not fleet-wide).
    pub fn fleet_rows(&mut self, now: Millis) -> Vec<crate::core::fleet_counts::CountRow> {
        let Some(mut f) = self.fleet.take() else { return Vec::new() };
        let rows = f.rows(|t| self.counts(t, now), now);
        self.fleet = Some(f);
        rows
    }

    pub fn config(&self) -> &RetryBudgetConfig {
        &self.config
    }

    fn tau(&self) -> f64 {
        self.config.window.0.max(1) as f64
    }

    /// Decay the tenant's counts to `now`, then add one dispatch or one retry.
    fn bump(&mut self, tenant: &str, now: Millis, dispatch: bool) {
        let tau = self.tau();
        let add = |e: &mut Decayed| {
            e.advance(now, tau);
            if dispatch {
                e.dispatches += 1.0;
            } else {
                e.retries += 1.0;
            }
        };
        if let Some(e) = self.tenants.get_mut(tenant) {
            add(e);
            return;
        }
        let mut e = Decayed { at: now, dispatches: 0.0, retries: 0.0 };
        add(&mut e);
        self.tenants.insert(tenant.to_owned(), e);
    }

    /// Count one fresh dispatch (first attempt) of `tenant`.
    pub fn record_dispatch(&mut self, tenant: &str, now: Millis) {
        self.bump(tenant, now, true);
        if let Some(f) = &mut self.fleet {
            f.touch(tenant);
        }
    }

    /// The decayed `(dispatches, retries)` of `tenant` at `now`.
    pub fn counts(&self, tenant: &str, now: Millis) -> (f64, f64) {
        match self.tenants.get(tenant) {
            Some(e) => {
                let mut e = *e;
                e.advance(now, self.tau());
                (e.dispatches, e.retries)
            }
            None => (0.0, 0.0),
        }
    }

    fn cap(&self, dispatches: f64) -> f64 {
        let ratio = if self.config.ratio.is_finite() { self.config.ratio.max(0.0) } else { 2.0 };
        let allowance = if self.config.allowance.is_finite() { self.config.allowance.max(0.0) } else { 0.0 };
        ratio * dispatches + allowance
    }

    /// Take one retry from the budget of `tenant`: counted and Ok when allowed, not
    /// counted and Err (saying why) when not.
    pub fn try_retry(&mut self, tenant: &str, now: Millis) -> Result<(), BudgetExceeded> {
        let (mut d, mut r) = self.counts(tenant, now);
        let verdict = match self.fleet.as_ref().map(|f| f.others(tenant, now)) {
            None if r + 1.0 <= self.cap(d) => Ok(()),
            None => Err(String::new()),
            Some((d_o, r_o)) => {
                (d, r) = (d + d_o, r + r_o);
                let headroom = self.cap(d) - r;
                let f = self.fleet.as_mut().expect("fleet-wide");
                f.take(tenant, headroom, now).map_err(|e| fleet_clause(&e))
            }
        };
        match verdict {
            Ok(()) => {
                self.bump(tenant, now, false);
                Ok(())
            }
            Err(fleet) => Err(BudgetExceeded {
                tenant: tenant.to_owned(),
                retries: r,
                dispatches: d,
                ratio: self.config.ratio,
                allowance: self.config.allowance,
                window: self.config.window,
                fleet,
            }),
        }
    }

    /// Forget tenants whose counts have decayed below 0.01 (call now and then to bound
    /// memory).
    pub fn prune(&mut self, now: Millis) {
        let tau = self.tau();
        self.tenants.retain(|_, e| {
            let mut e = *e;
            e.advance(now, tau);
            e.dispatches >= 0.01 || e.retries >= 0.01
        });
    }

    /// Tenants tracked.
    pub fn len(&self) -> usize {
        self.tenants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use FailureClass::*;

    fn st(attempt: i32, crash_count: i32) -> AttemptState {
        AttemptState { attempt, crash_count, last_error: Some("boom".into()) }
    }

    #[test]
    fn app_error_schedule_then_dlq() {
        let p = RetryPolicy::default();
        let expected = [1_000, 5_000, 30_000, 300_000];
        for (used, want) in expected.iter().enumerate() {
            // jitter 0.5 = exactly the nominal delay
            match decide(AppError, &st(used as i32, 0), &p, 1_000, 0.5) {
                Decision::Retry { class_topic, not_before, attempt, crash_count } => {
                    assert_eq!(class_topic, AppError);
                    assert_eq!(not_before, 1_000 + want);
                    assert_eq!(attempt, used as i32 + 1);
                    assert_eq!(crash_count, 0);
                }
                d => panic!("{d:?}"),
            }
        }
        match decide(AppError, &st(4, 0), &p, 0, 0.5) {
            Decision::DeadLetter { reason } => {
                assert_eq!(dead_letter_class(AppError), AppError);
                assert_eq!(attempts_used(AppError, &st(4, 0)), 5);
                assert!(reason.starts_with("app_error: 5 of 5 attempts used; last error: boom; fix"), "{reason}");
                assert!(reason.contains("replay from the DLQ"));
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn jitter_bounds_of_app_error() {
        let p = RetryPolicy::default();
        let nb = |u| match decide(AppError, &st(0, 0), &p, 0, u) {
            Decision::Retry { not_before, .. } => not_before,
            d => panic!("{d:?}"),
        };
        assert_eq!(nb(0.0), 750);
        assert_eq!(nb(0.999_999), 1_250);
        assert_eq!(nb(f64::NAN), 1_000);
        assert_eq!(nb(-3.0), 750);
    }

    #[test]
    fn timeout_retries_once() {
        let p = RetryPolicy::default();
        assert!(matches!(
            decide(Timeout, &st(0, 0), &p, 0, 0.5),
            Decision::Retry { class_topic: Timeout, attempt: 1, .. }
        ));
        match decide(Timeout, &st(1, 0), &p, 0, 0.5) {
            Decision::DeadLetter { reason } => {
                assert!(reason.contains("deadline") && reason.contains("longer pool"), "{reason}")
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn resource_retries_once_on_the_app_error_topic_then_dead_letters() {
        let p = RetryPolicy::default();
        assert!(matches!(
            decide(Resource, &st(0, 0), &p, 0, 0.5),
            Decision::Retry { class_topic: AppError, attempt: 1, crash_count: 0, .. }
        ));
        match decide(Resource, &st(1, 0), &p, 0, 0.5) {
            Decision::DeadLetter { reason } => {
                assert!(reason.starts_with("resource:") && reason.contains("[limits]"), "{reason}")
            }
            d => panic!("{d:?}"),
        }
        assert_eq!(dead_letter_class(Resource), Resource);
    }

    #[test]
    fn dependency_exponential_full_jitter_capped() {
        let p = RetryPolicy::default();
        assert_eq!(p.dependency.nominal_delay(0), 2_000);
        assert_eq!(p.dependency.nominal_delay(3), 16_000);
        assert_eq!(p.dependency.nominal_delay(7), 256_000);
        assert_eq!(p.dependency.nominal_delay(8), 300_000);
        assert_eq!(p.dependency.nominal_delay(i32::MAX), 300_000);
        assert_eq!(p.dependency.delay(3, 0.0), 0);
        assert_eq!(p.dependency.delay(3, 0.5), 8_000);
        assert!(decide(Dependency, &st(6, 0), &p, 0, 0.1).is_retry());
        assert!(!decide(Dependency, &st(7, 0), &p, 0, 0.1).is_retry());
    }

    #[test]
    fn crash_keeps_attempt_until_limit_then_poison() {
        let p = RetryPolicy::default();
        match decide(WorkerCrash, &st(2, 0), &p, 10_000, 0.5) {
            Decision::Retry { class_topic, not_before, attempt, crash_count } => {
                assert_eq!(class_topic, WorkerCrash);
                assert_eq!(not_before, 11_000);
                assert_eq!(attempt, 2);
                assert_eq!(crash_count, 1);
            }
            d => panic!("{d:?}"),
        }
        assert!(decide(WorkerCrash, &st(2, 1), &p, 0, 0.5).is_retry());
        match decide(WorkerCrash, &st(2, 2), &p, 0, 0.5) {
            Decision::DeadLetter { reason } => {
                assert_eq!(dead_letter_class(WorkerCrash), Poison);
                assert_eq!(attempts_used(WorkerCrash, &st(2, 2)), 2);
                assert!(reason.starts_with("poison:") && reason.contains("3 times (limit 3)"), "{reason}");
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn poison_two_attempts_on_app_error_topic() {
        let p = RetryPolicy::default();
        assert!(matches!(
            decide(Poison, &st(0, 0), &p, 0, 0.5),
            Decision::Retry { class_topic: AppError, not_before: 30_000, attempt: 1, .. }
        ));
        assert!(matches!(decide(Poison, &st(1, 0), &p, 0, 0.5), Decision::DeadLetter { .. }));
    }

    #[test]
    fn permanent_and_hostile_input() {
        let p = RetryPolicy::default();
        let mut s = st(-5, -5);
        s.last_error = Some("x".repeat(10_000));
        match decide(Permanent, &s, &p, i64::MAX, f64::INFINITY) {
            Decision::DeadLetter { reason } => {
                assert_eq!(dead_letter_class(Permanent), Permanent);
                assert_eq!(attempts_used(Permanent, &s), 1);
                assert!(reason.len() < 1_000);
                assert!(reason.contains("fix the input"));
            }
            d => panic!("{d:?}"),
        }
        // extreme values neither panic nor overflow
        let d = decide(WorkerCrash, &st(i32::MAX, 0), &p, i64::MAX, 0.9);
        assert!(matches!(d, Decision::Retry { not_before: i64::MAX, attempt: i32::MAX, .. }));
        assert!(!decide(AppError, &st(i32::MAX, i32::MAX), &p, i64::MIN, 0.3).is_retry());
        assert!(!decide(WorkerCrash, &st(0, i32::MAX), &p, 0, 0.3).is_retry());
        let no_err = AttemptState { last_error: Some("  ".into()), ..st(9, 0) };
        if let Decision::DeadLetter { reason, .. } = decide(AppError, &no_err, &p, 0, 0.5) {
            assert!(!reason.contains("last error"));
        }
    }

    #[test]
    fn attempt_state_from_job() {
        let job = JobSubmitted {
            job_id: "j".into(),
            tenant: "t".into(),
            job_type: "x".into(),
            pool: None,
            priority: Default::default(),
            payload: vec![],
            idempotency_key: None,
            execute_at: None,
            not_after: None,
            attempt: 3,
            crash_count: 1,
            generation: 0,
            submitted_at: 0,
            not_before: None,
            last_error: Some("e".into()),
            last_failure_class: None,
            first_failure_at: None,
            replay_count: 0,
            replayed_from: None,
            traceparent: None,
            tracestate: None,
            flow_key: None,
            user_key: None,
            handoff_count: 0,
        };
        assert_eq!(AttemptState::from(&job), AttemptState { attempt: 3, crash_count: 1, last_error: Some("e".into()) });
    }

    #[test]
    fn durations_parse_and_print() {
        for (s, ms) in [
            ("250ms", 250),
            ("5s", 5_000),
            ("1.5s", 1_500),
            ("5m", 300_000),
            ("5min", 300_000),
            ("2h", 7_200_000),
            ("1d", 86_400_000),
            ("42", 42),
            (" 3 s ", 3_000),
            ("10MS", 10),
        ] {
            assert_eq!(s.parse::<DurationMs>(), Ok(DurationMs(ms)), "{s}");
        }
        for s in ["", "s", "-1s", "5 parsecs", "1e3", "1.2.3s", "99999999999d"] {
            assert!(s.parse::<DurationMs>().is_err(), "{s}");
        }
        assert_eq!(DurationMs(300_000).to_string(), "5m");
        assert_eq!(DurationMs(1_500).to_string(), "1500ms");
        assert_eq!(DurationMs(0).to_string(), "0ms");
        assert_eq!(DurationMs(7_200_000).to_string(), "2h");
    }

    #[test]
    fn jitter_parse() {
        assert_eq!("full".parse::<Jitter>(), Ok(Jitter::Full));
        assert_eq!("none".parse::<Jitter>(), Ok(Jitter::None));
        assert_eq!("25%".parse::<Jitter>(), Ok(Jitter::Proportional(0.25)));
        assert_eq!("0.1".parse::<Jitter>(), Ok(Jitter::Proportional(0.1)));
        assert!("150%".parse::<Jitter>().is_err());
        assert!("lots".parse::<Jitter>().is_err());
    }

    #[test]
    fn config_overrides_only_what_is_given() {
        let p: RetryPolicy = toml::from_str(
            r#"
            [app_error]
            max_attempts = 3
            delays = ["2s", 10000]
            jitter = "10%"
            [dependency]
            max_delay = "1m"
            [worker_crash]
            max_crashes = 5
            "#,
        )
        .unwrap();
        let d = RetryPolicy::default();
        assert_eq!(p.app_error.max_attempts, 3);
        assert_eq!(p.app_error.delays, vec![DurationMs(2_000), DurationMs(10_000)]);
        assert_eq!(p.app_error.jitter, Jitter::Proportional(0.1));
        assert_eq!(p.dependency.max_delay, DurationMs(60_000));
        assert_eq!(p.dependency.base, d.dependency.base);
        assert_eq!(p.dependency.jitter, Jitter::Full);
        assert_eq!(p.worker_crash.max_crashes, 5);
        assert_eq!(p.worker_crash.delay, d.worker_crash.delay);
        assert_eq!(p.timeout, d.timeout);
        // an empty table is the defaults
        let e: RetryPolicy = toml::from_str("").unwrap();
        assert_eq!(e, d);
        // switching a schedule class to exponential
        let x: RetryPolicy = toml::from_str("[app_error]\nbase = \"1s\"\nfactor = 3.0").unwrap();
        assert!(x.app_error.delays.is_empty());
        assert_eq!(x.app_error.nominal_delay(2), 9_000);
        // JSON works too, and a serialised policy reads back the same
        let j = serde_json::to_string(&p).unwrap();
        let back: RetryPolicy = serde_json::from_str(&j).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn config_errors_name_the_field() {
        for (src, field) in [
            ("[app_error]\nmax_attempts = 0", "app_error.max_attempts"),
            ("[dependency]\nfactor = 0.5", "dependency.factor"),
            ("[worker_crash]\nmax_crashes = -1", "worker_crash.max_crashes"),
        ] {
            let e = toml::from_str::<RetryPolicy>(src).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
        for src in [
            "[app_error]\nmax_atempts = 2",
            "[app_error]\njitter = 2.0",
            "[timeout]\ndelays = [\"-1s\"]",
            "[bogus]\nx = 1",
        ] {
            assert!(toml::from_str::<RetryPolicy>(src).is_err(), "{src}");
        }
        let mut p = RetryPolicy::default();
        p.poison.jitter = Jitter::Proportional(f64::NAN);
        assert!(p.validate().unwrap_err().to_string().contains("poison.jitter"));
    }

    #[test]
    fn budget_caps_retries_at_twice_dispatches() {
        let mut b = RetryBudget::new(RetryBudgetConfig { ratio: 2.0, window: DurationMs::mins(5), allowance: 0.0 });
        let now = 1_000_000;
        for _ in 0..10 {
            b.record_dispatch("t", now);
        }
        for i in 0..20 {
            assert!(b.try_retry("t", now).is_ok(), "retry {i}");
        }
        let e = b.try_retry("t", now).unwrap_err();
        assert!(e.to_string().contains("over its retry budget"));
        // other tenants are unaffected
        assert!(b.try_retry("u", now).is_err()); // no allowance, no dispatches
        b.record_dispatch("u", now);
        assert!(b.try_retry("u", now).is_ok());
        // fresh dispatches make room again
        for _ in 0..5 {
            b.record_dispatch("t", now + 1);
        }
        assert!(b.try_retry("t", now + 1).is_ok());
        // prune forgets quiet tenants
        b.prune(now + 10 * 3_600_000);
        assert!(b.is_empty());
    }

    #[test]
    fn a_fleet_wide_budget_counts_the_other_workers() {
        use crate::core::fleet_counts::{presence, CountRow};
        let cfg = RetryBudgetConfig { ratio: 1.0, window: DurationMs::mins(5), allowance: 0.0 };
        let mut b = RetryBudget::new(cfg);
        b.fleet_wide("me");
        let now = 1_000_000;
        assert!(b.try_retry("t", now).unwrap_err().to_string().contains("could not read"), "no read yet");
        // Another worker dispatched 4 and retried 3: headroom 1, dealt to one of two.
        let other = CountRow { scope: "retry:t".into(), worker: "o".into(), at: now, a: 4.0, b: 3.0, c: 0.0 };
        let rows = [presence("o", now), other];
        b.fleet_mut().unwrap().read(&rows, now);
        let allowed = (0..3).filter(|_| b.try_retry("t", now).is_ok()).count();
        assert!(allowed <= 1, "at most the fleet's headroom of 1: {allowed}");
        let e = b.try_retry("t", now).unwrap_err();
        assert!(e.to_string().contains("fleet-wide over 2 workers"), "{e}");
        assert!(e.retries >= 3.0 && e.dispatches >= 4.0, "the fleet's counts: {e:?}");
        // Its counts go out in the next rows, with the asks.
        let rows = b.fleet_rows(now);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].scope, "retry:t");
        assert!(rows[0].c >= 4.0, "four asks: {:?}", rows[0]);
    }

    #[test]
    fn budget_turns_retry_into_dead_letter_but_not_crash() {
        let p = RetryPolicy::default();
        let mut b = RetryBudget::new(RetryBudgetConfig { allowance: 0.0, ..Default::default() });
        match decide_with_budget(Failed { class: AppError, state: &st(0, 0), policy: &p }, &mut b, "t", 0, 0.5) {
            Decision::DeadLetter { reason } => {
                assert!(reason.contains("retry budget"), "{reason}");
            }
            d => panic!("{d:?}"),
        }
        assert!(decide_with_budget(Failed { class: WorkerCrash, state: &st(0, 0), policy: &p }, &mut b, "t", 0, 0.5)
            .is_retry());
        b.record_dispatch("t", 0);
        assert!(decide_with_budget(Failed { class: AppError, state: &st(0, 0), policy: &p }, &mut b, "t", 0, 0.5)
            .is_retry());
        assert_eq!(b.counts("t", 0), (1.0, 1.0));
        // a dead letter by policy does not consume budget
        assert!(!decide_with_budget(Failed { class: Permanent, state: &st(0, 0), policy: &p }, &mut b, "t", 0, 0.5)
            .is_retry());
        assert_eq!(b.counts("t", 0), (1.0, 1.0));
    }

    // ---- property tests

    fn arb_jitter() -> impl Strategy<Value = Jitter> {
        prop_oneof![Just(Jitter::None), Just(Jitter::Full), (0.0f64..=1.0).prop_map(Jitter::Proportional)]
    }

    fn arb_class_policy() -> impl Strategy<Value = ClassPolicy> {
        (
            1i32..12,
            proptest::collection::vec((0i64..10_000_000).prop_map(DurationMs), 0..6),
            (0i64..100_000).prop_map(DurationMs),
            1.0f64..10.0,
            (0i64..10_000_000).prop_map(DurationMs),
            arb_jitter(),
        )
            .prop_map(|(max_attempts, delays, base, factor, max_delay, jitter)| ClassPolicy {
                max_attempts,
                delays,
                base,
                factor,
                max_delay,
                jitter,
            })
    }

    fn arb_policy() -> impl Strategy<Value = RetryPolicy> {
        (
            arb_class_policy(),
            arb_class_policy(),
            arb_class_policy(),
            arb_class_policy(),
            (1i32..6, (0i64..60_000).prop_map(DurationMs), arb_jitter()),
            arb_class_policy(),
        )
            .prop_map(|(a, t, d, p, (max_crashes, delay, jitter), r)| RetryPolicy {
                app_error: a,
                timeout: t,
                dependency: d,
                poison: p,
                worker_crash: CrashPolicy { max_crashes, delay, jitter },
                resource: r,
            })
    }

    fn arb_class() -> impl Strategy<Value = FailureClass> {
        proptest::sample::select(FailureClass::ALL.to_vec())
    }

    proptest! {
        #[test]
        fn decisions_respect_bounds(
            policy in arb_policy(),
            class in arb_class(),
            attempt in -3i32..20,
            crashes in -3i32..8,
            now in -1_000_000_000i64..4_000_000_000_000,
            u in 0.0f64..1.0,
        ) {
            prop_assert!(policy.validate().is_ok());
            let s = st(attempt, crashes);
            let d = decide(class, &s, &policy, now, u);
            // deterministic
            prop_assert_eq!(&d, &decide(class, &s, &policy, now, u));
            let used = attempt.max(0);
            match d {
                Decision::Retry { class_topic, not_before, attempt: a, crash_count } => {
                    prop_assert!(class != Permanent);
                    prop_assert!(matches!(class_topic, AppError | Timeout | Dependency | WorkerCrash));
                    prop_assert_eq!(Some(class_topic), retry_topic_class(class));
                    let delay = not_before - now;
                    prop_assert!(delay >= 0);
                    if class == WorkerCrash {
                        prop_assert_eq!(a, used, "a crash never uses an attempt");
                        prop_assert_eq!(crash_count, crashes.max(0) + 1);
                        prop_assert!(crash_count < policy.worker_crash.max_crashes);
                        let (lo, hi) = policy.worker_crash.jitter.bounds(policy.worker_crash.delay.0);
                        prop_assert!(lo <= delay && delay <= hi);
                    } else {
                        let cp = policy.for_class(class).unwrap();
                        prop_assert_eq!(a, used + 1);
                        prop_assert!(a < cp.max_attempts, "attempts stay below the max");
                        prop_assert_eq!(crash_count, crashes.max(0));
                        let (lo, hi) = cp.delay_bounds(used);
                        prop_assert!(lo <= delay && delay <= hi, "{} not in [{}, {}]", delay, lo, hi);
                        // bounds are the nominal delay +- the jitter fraction
                        let nominal = cp.nominal_delay(used);
                        if let Jitter::Proportional(f) = cp.jitter {
                            prop_assert!((delay as f64) >= (nominal as f64) * (1.0 - f) - 1.0);
                            prop_assert!((delay as f64) <= (nominal as f64) * (1.0 + f) + 1.0);
                        }
                        if cp.delays.is_empty() {
                            prop_assert!(nominal <= cp.max_delay.0);
                        }
                    }
                }
                Decision::DeadLetter { reason } => {
                    let c = dead_letter_class(class);
                    let a = attempts_used(class, &s);
                    prop_assert!(!reason.is_empty());
                    prop_assert!(reason.contains(c.as_str()));
                    if class == WorkerCrash {
                        prop_assert_eq!(c, Poison);
                        prop_assert_eq!(a, used);
                    } else {
                        prop_assert_eq!(c, class);
                        prop_assert_eq!(a, used + 1);
                    }
                }
            }
            if class == Permanent {
                prop_assert!(!decide(class, &s, &policy, now, u).is_retry());
            }
        }

        /// A job failing again and again, in any mix of classes, ends in the DLQ within
        /// (max attempts + max crashes) failures and never stores more attempts than the
        /// largest max.
        #[test]
        fn lifecycle_terminates_within_limits(
            policy in arb_policy(),
            classes in proptest::collection::vec(arb_class(), 1..200),
            draws in proptest::collection::vec(0.0f64..1.0, 200),
        ) {
            let max_any = FailureClass::ALL.iter()
                .filter_map(|c| policy.for_class(*c)).map(|c| c.max_attempts).max().unwrap();
            let mut s = AttemptState::default();
            let mut now = 0;
            let mut ended = false;
            for (i, class) in classes.iter().enumerate() {
                match decide(*class, &s, &policy, now, draws[i]) {
                    Decision::Retry { not_before, attempt, crash_count, .. } => {
                        prop_assert!(attempt >= s.attempt && attempt <= max_any);
                        prop_assert!(crash_count >= s.crash_count);
                        prop_assert!(not_before >= now);
                        now = not_before;
                        s.attempt = attempt;
                        s.crash_count = crash_count;
                    }
                    Decision::DeadLetter { .. } => {
                        prop_assert!(attempts_used(*class, &s) <= max_any);
                        ended = true;
                        break;
                    }
                }
                prop_assert!(i < (max_any + policy.worker_crash.max_crashes) as usize);
            }
            if !ended {
                prop_assert!(classes.len() < (max_any + policy.worker_crash.max_crashes) as usize);
            }
        }

        #[test]
        fn duration_display_parses_back(ms in 0i64..MAX_DURATION_MS) {
            let d = DurationMs(ms);
            prop_assert_eq!(d.to_string().parse::<DurationMs>(), Ok(d));
        }

        #[test]
        fn jitter_apply_within_bounds(j in arb_jitter(), nominal in -10i64..1_000_000_000_000, u in proptest::num::f64::ANY) {
            let v = j.apply(nominal, u);
            let (lo, hi) = j.bounds(nominal);
            prop_assert!(0 <= lo && lo <= v && v <= hi);
        }

        #[test]
        fn budget_never_exceeds_cap(
            ops in proptest::collection::vec((any::<bool>(), 0i64..5_000), 1..400),
            ratio in 0.0f64..4.0,
            allowance in 0.0f64..10.0,
        ) {
            let mut b = RetryBudget::new(RetryBudgetConfig { ratio, window: DurationMs::secs(60), allowance });
            let mut now = 0;
            for (dispatch, dt) in ops {
                now += dt;
                if dispatch {
                    b.record_dispatch("t", now);
                } else {
                    let _ = b.try_retry("t", now);
                }
                let (d, r) = b.counts("t", now);
                prop_assert!(r <= ratio * d + allowance + 1e-9);
            }
        }
    }
}
