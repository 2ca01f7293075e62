//! Quarantine of job types that fail most of the time ("poison").
//!
//! A buggy job type that fails every time still gets the full retry schedule for each
//! of its jobs: five attempts where one would tell the story, workers busy with doomed
//! work and other tenants' jobs waiting. When more than half of a job type's attempts
//! over the last hour failed (with at least a minimum sample, so 3 failures of 4 do not
//! count), the type is quarantined: its failures are classified `poison`, which the
//! retry policy allows only 2 attempts in all, so the damage is bounded until someone
//! fixes it. The failure rate is re-evaluated as old minutes leave the window, and the
//! type leaves quarantine when the rate falls to the exit threshold (40% by default,
//! below the 50% entry so it does not flap around the line) or the sample gets too thin
//! to judge.
//!
//! Counts are kept in 60 one-minute buckets per job type (about 1.5 KiB each), `now`
//! is passed in, nothing runs in the background.
//!
//! What counts: a success, and failures that are the job type's own doing (`app_error`,
//! `timeout`, `worker_crash`, `poison`). A `dependency` failure is the circuit breaker's
//! business and a `permanent` one the input's, so neither counts (see
//! [`counts_toward_poison`]). Record the underlying failure before reclassifying it as
//! `poison`, so a quarantined type keeps being measured.
//!
//! Fleet-wide (`core::fleet_counts`), each detector also counts the other workers'
//! outcomes of its type ([`PoisonDetectors::set_fleet`]): the rule is applied to the
//! pool's sample, not one worker's.
//!
//! Per tenant: the workers key detectors by [`tenant_key`] (job type and tenant), so one
//! tenant's failing inputs quarantine the type for that tenant's jobs only; a type that
//! fails for everyone is quarantined for each tenant that sends it.

use crate::core::retry::DurationMs;
use crate::core::window::{Counts, RollingWindow};
use crate::core::FastMap;
use crate::model::{FailureClass, Millis};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The detector key of `tenant`'s jobs of `job_type`.
pub fn tenant_key(job_type: &str, tenant: &str) -> String {
    let mut key = String::new();
    write_tenant_key(&mut key, job_type, tenant);
    key
}

/// Writes [`tenant_key`] into `out` (cleared first).
fn write_tenant_key(out: &mut String, job_type: &str, tenant: &str) {
    use std::fmt::Write;
    out.clear();
    write!(out, "{job_type} of tenant {tenant:?}").expect("writing to a String cannot fail");
}

/// Settings of a [`PoisonDetector`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoisonConfig {
    /// How far back outcomes count.
    pub window: DurationMs,
    /// Buckets the window is kept in (its time resolution).
    pub buckets: u32,
    /// Outcomes needed in the window before a type can be quarantined.
    pub min_samples: u64,
    /// Quarantine when the failure share is above this.
    pub enter_ratio: f64,
    /// Leave quarantine when the failure share is at or below this.
    pub exit_ratio: f64,
}

impl Default for PoisonConfig {
    fn default() -> Self {
        PoisonConfig { window: DurationMs::mins(60), buckets: 60, min_samples: 20, enter_ratio: 0.5, exit_ratio: 0.4 }
    }
}

impl PoisonConfig {
    pub fn validate(&self) -> Result<(), crate::core::invalid::Invalid> {
        let err = |field: &str, problem: String| crate::core::invalid::Invalid::err(field, problem);
        if self.window.0 < 60_000 {
            return err("window", format!("{} is too short: use at least \"1m\" (e.g. \"1h\")", self.window));
        }
        if !(1..=3_600).contains(&self.buckets) {
            return err("buckets", format!("{} is out of range: use 1 to 3600 (e.g. 60)", self.buckets));
        }
        if self.min_samples < 1 {
            return err("min_samples", "must be at least 1 (e.g. 20)".into());
        }
        if !(self.enter_ratio >= 0.0 && self.enter_ratio < 1.0) {
            return err(
                "enter_ratio",
                format!("{} is out of range: use a share from 0 to below 1 (e.g. 0.5)", self.enter_ratio),
            );
        }
        if !(self.exit_ratio >= 0.0 && self.exit_ratio <= self.enter_ratio) {
            return err(
                "exit_ratio",
                format!(
                    "{} is out of range: use a share from 0 up to enter_ratio {} (e.g. 0.4)",
                    self.exit_ratio, self.enter_ratio
                ),
            );
        }
        Ok(())
    }
}

/// Whether a failure of `class` is evidence that the job type itself is broken.
pub fn counts_toward_poison(class: FailureClass) -> bool {
    match class {
        FailureClass::AppError | FailureClass::Timeout | FailureClass::WorkerCrash | FailureClass::Poison => true,
        // A limit kill is the job's or its input's size, not the type being broken.
        FailureClass::Dependency | FailureClass::Permanent | FailureClass::Resource => false,
    }
}

/// Failure-rate tracker and quarantine flag of one job type.
#[derive(Debug, Clone)]
pub struct PoisonDetector {
    config: PoisonConfig,
    window: RollingWindow,
    quarantined_since: Option<Millis>,
    /// The other workers' outcomes in their windows, as last read (fleet-wide).
    fleet: Counts,
    /// The (tenant, job type) it judges, once an outcome was recorded for them here
    /// ([`PoisonDetectors::record_tenant_outcome`]).
    subject: Option<(String, String)>,
}

impl PoisonDetector {
    /// Settings are used as given (check them with [`PoisonConfig::validate`] when
    /// parsing); nonsense values are clamped where used.
    pub fn new(config: PoisonConfig) -> Self {
        PoisonDetector {
            window: RollingWindow::new(config.window.0, config.buckets.max(1) as usize),
            config,
            quarantined_since: None,
            fleet: Counts::default(),
            subject: None,
        }
    }

    pub fn config(&self) -> &PoisonConfig {
        &self.config
    }

    /// Outcomes in the window at `now`.
    pub fn counts(&self, now: Millis) -> Counts {
        self.window.counts(now)
    }

    /// When the current quarantine began, as of the last evaluation.
    pub fn quarantined_since(&self) -> Option<Millis> {
        self.quarantined_since
    }

    /// Whether the type would be quarantined at `now`, given whether it was before
    /// (the entry and exit thresholds differ).
    fn verdict(&self, now: Millis, was: bool) -> bool {
        let own = self.window.counts(now);
        let c =
            Counts { ok: own.ok.saturating_add(self.fleet.ok), failed: own.failed.saturating_add(self.fleet.failed) };
        if c.total() < self.config.min_samples.max(1) {
            return false;
        }
        let r = c.failure_ratio();
        if was {
            r > self.config.exit_ratio
        } else {
            r > self.config.enter_ratio
        }
    }

    /// Re-evaluate at `now`; Some(new status) when it changed.
    fn evaluate(&mut self, now: Millis) -> Option<bool> {
        let was = self.quarantined_since.is_some();
        let is = self.verdict(now, was);
        if is == was {
            return None;
        }
        self.quarantined_since = is.then_some(now);
        Some(is)
    }

    /// Record one outcome (`ok = false` for a failure that counts, see
    /// [`counts_toward_poison`]). Returns Some(quarantined) when the status changed,
    /// for the alert and the log line.
    pub fn record(&mut self, now: Millis, ok: bool) -> Option<bool> {
        self.window.record(now, ok);
        self.evaluate(now)
    }

    /// Whether the type is quarantined at `now`. Takes `&mut self` because the status
    /// changes as old outcomes leave the window.
    pub fn is_quarantined(&mut self, now: Millis) -> bool {
        self.evaluate(now);
        self.quarantined_since.is_some()
    }

    /// Nothing in the window at `now` and not quarantined.
    pub fn is_idle(&self, now: Millis) -> bool {
        self.quarantined_since.is_none() && self.window.is_idle(now) && self.fleet.total() == 0
    }
}

/// Poison detectors of all job types, created on first outcome.
#[derive(Debug, Clone, Default)]
pub struct PoisonDetectors {
    config: PoisonConfig,
    by_type: FastMap<String, PoisonDetector>,
    /// When [`PoisonDetectors::sweep_due`] last swept.
    swept_at: Millis,
    /// Where [`PoisonDetectors::record_tenant_outcome`] writes its key (reused: no
    /// allocation per outcome).
    scratch: String,
}

/// How often [`PoisonDetectors::sweep_due`] sweeps: idle detectors (one per job type and
/// tenant that had outcomes) are forgotten within this after their window empties.
pub const SWEEP_EVERY_MS: Millis = 60_000;

/// Most (job type, tenant) detectors [`PoisonDetectors::record_tenant_outcome`] keeps
/// (each ~1.5 KiB at the default 60 buckets): past it, a new tenant's outcomes are not judged (its failures keep
/// their class and are retried by its policy) until a sweep frees room.
pub const MAX_TENANT_DETECTORS: usize = 10_000;

impl PoisonDetectors {
    pub fn new(config: PoisonConfig) -> Self {
        PoisonDetectors { config, by_type: FastMap::default(), swept_at: 0, scratch: String::new() }
    }

    /// See [`PoisonDetector::record`].
    pub fn record(&mut self, job_type: &str, now: Millis, ok: bool) -> Option<bool> {
        if let Some(d) = self.by_type.get_mut(job_type) {
            return d.record(now, ok);
        }
        let mut d = PoisonDetector::new(self.config.clone());
        let changed = d.record(now, ok);
        self.by_type.insert(job_type.to_owned(), d);
        changed
    }

    /// Record the outcome of an attempt: `None` for success, `Some(class)` for a
    /// failure (the class before any reclassification as poison). Failures that do not
    /// count (see [`counts_toward_poison`]) are ignored.
    pub fn record_outcome(&mut self, job_type: &str, now: Millis, failure: Option<FailureClass>) -> Option<bool> {
        match failure {
            None => self.record(job_type, now, true),
            Some(c) if counts_toward_poison(c) => self.record(job_type, now, false),
            Some(_) => None,
        }
    }

    /// [`record_outcome`] of `job_type`'s jobs of `tenant` (keyed by [`tenant_key`]),
    /// remembering whose they are for [`quarantined_subjects`].
    ///
    /// [`record_outcome`]: PoisonDetectors::record_outcome
    /// [`quarantined_subjects`]: PoisonDetectors::quarantined_subjects
    pub fn record_tenant_outcome(
        &mut self,
        job_type: &str,
        tenant: &str,
        now: Millis,
        failure: Option<FailureClass>,
    ) -> Option<bool> {
        let mut key = std::mem::take(&mut self.scratch);
        write_tenant_key(&mut key, job_type, tenant);
        let changed = if self.by_type.len() >= MAX_TENANT_DETECTORS && !self.by_type.contains_key(&key) {
            None
        } else {
            let changed = self.record_outcome(&key, now, failure);
            if let Some(d) = self.by_type.get_mut(&key).filter(|d| d.subject.is_none()) {
                d.subject = Some((tenant.to_owned(), job_type.to_owned()));
            }
            changed
        };
        self.scratch = key;
        changed
    }

    /// The (tenant, job type) pairs recorded here whose quarantine holds at `now`
    /// (re-evaluated, so a quarantine ends as its failures leave the window).
    pub fn quarantined_subjects(&mut self, now: Millis) -> Vec<(String, String)> {
        self.by_type.values_mut().filter_map(|d| if d.is_quarantined(now) { d.subject.clone() } else { None }).collect()
    }

    /// See [`PoisonDetector::is_quarantined`]; false for a type never seen.
    pub fn is_quarantined(&mut self, job_type: &str, now: Millis) -> bool {
        self.by_type.get_mut(job_type).is_some_and(|d| d.is_quarantined(now))
    }

    /// The class to hand to the retry policy: `app_error` and `timeout` failures of a
    /// quarantined type become `poison`; everything else is unchanged.
    pub fn effective_class(&mut self, job_type: &str, class: FailureClass, now: Millis) -> FailureClass {
        match class {
            FailureClass::AppError | FailureClass::Timeout if self.is_quarantined(job_type, now) => {
                FailureClass::Poison
            }
            c => c,
        }
    }

    pub fn get(&self, job_type: &str) -> Option<&PoisonDetector> {
        self.by_type.get(job_type)
    }

    /// Job types quarantined as of their last evaluation, with the start time.
    pub fn quarantined(&self) -> impl Iterator<Item = (&str, Millis)> + '_ {
        self.by_type.iter().filter_map(|(t, d)| d.quarantined_since().map(|s| (t.as_str(), s)))
    }

    /// [`sweep`] at most once per [`SWEEP_EVERY_MS`]: called on every stats tick, it keeps
    /// the detectors bounded whether or not the fleet exchange (`worker.fleet_limits`)
    /// sweeps them too.
    ///
    /// [`sweep`]: PoisonDetectors::sweep
    pub fn sweep_due(&mut self, now: Millis) -> Vec<(String, bool)> {
        if now.saturating_sub(self.swept_at) < SWEEP_EVERY_MS {
            return Vec::new();
        }
        self.swept_at = now;
        self.sweep(now)
    }

    /// Re-evaluate every type at `now` and drop idle ones (call now and then, e.g. once
    /// a minute, so quarantines end without traffic and memory stays bounded).
    /// Returns the types whose status changed, with the new status.
    pub fn sweep(&mut self, now: Millis) -> Vec<(String, bool)> {
        let mut changed = Vec::new();
        for (t, d) in self.by_type.iter_mut() {
            if let Some(s) = d.evaluate(now) {
                changed.push((t.clone(), s));
            }
        }
        self.by_type.retain(|_, d| !d.is_idle(now));
        changed
    }

    /// The other workers' outcomes per job type (their windows, as read): each type's
    /// detector judges its own and these together from now on; a type seen only
    /// elsewhere gets a detector while fewer than [`MAX_TENANT_DETECTORS`] are kept (past
    /// it, the others' counts of types new here are not judged here: each worker keeps
    /// its own bound, so N workers cannot make one hold N times it). Returns the types
    /// whose status changed.
    pub fn set_fleet(&mut self, others: HashMap<String, Counts>, now: Millis) -> Vec<(String, bool)> {
        for d in self.by_type.values_mut() {
            d.fleet = Counts::default();
        }
        for (t, c) in others {
            if let Some(d) = self.by_type.get_mut(&t) {
                d.fleet = c;
            } else if self.by_type.len() < MAX_TENANT_DETECTORS {
                let mut d = PoisonDetector::new(self.config.clone());
                d.fleet = c;
                self.by_type.insert(t, d);
            }
        }
        self.sweep(now)
    }

    /// Every type's own window counts at `now` (what this worker tells the others).
    pub fn own_counts(&self, now: Millis) -> Vec<(String, Counts)> {
        self.by_type.iter().map(|(t, d)| (t.clone(), d.counts(now))).collect()
    }

    pub fn len(&self) -> usize {
        self.by_type.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_type.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: Millis = 60_000;

    #[test]
    fn needs_majority_and_minimum_sample() {
        let mut d = PoisonDetector::new(PoisonConfig::default());
        // 19 failures: below the minimum sample
        for i in 0..19 {
            assert_eq!(d.record(i, false), None);
        }
        assert!(!d.is_quarantined(100));
        // 10 ok + 10 failed = exactly 50%: not above
        let mut e = PoisonDetector::new(PoisonConfig::default());
        for i in 0..10 {
            e.record(i, true);
            e.record(i, false);
        }
        assert!(!e.is_quarantined(100));
        assert_eq!(e.record(100, false), Some(true));
        assert_eq!(e.quarantined_since(), Some(100));
        assert!(e.is_quarantined(101));
    }

    #[test]
    fn leaves_when_rate_drops_with_hysteresis() {
        let mut d = PoisonDetector::new(PoisonConfig::default());
        for i in 0..20 {
            d.record(i, false);
        }
        assert!(d.is_quarantined(20));
        // 20 failed + 25 ok = 44%: above the exit line, still quarantined
        for i in 0..25 {
            assert_eq!(d.record(30 + i, true), None);
        }
        assert!(d.is_quarantined(100));
        // 20 failed / 30 ok = 40%: out
        let mut changed = None;
        for i in 0..5 {
            changed = changed.or(d.record(100 + i, true));
        }
        assert_eq!(changed, Some(false));
        assert!(!d.is_quarantined(200));
        // back in only above 50%
        for i in 0..10 {
            assert_eq!(d.record(300 + i, false), None); // up to 30 of 60: not above half
        }
        assert_eq!(d.record(400, false), Some(true)); // 31 of 61
    }

    #[test]
    fn old_failures_age_out() {
        let mut d = PoisonDetector::new(PoisonConfig::default());
        for i in 0..30 {
            d.record(i * 1_000, false);
        }
        assert!(d.is_quarantined(40 * MIN));
        assert!(d.is_quarantined(59 * MIN));
        // an hour later the window is empty: the sample is too thin to keep it
        assert!(!d.is_quarantined(61 * MIN));
        assert!(d.is_idle(61 * MIN));
    }

    #[test]
    fn map_classifies_and_sweeps() {
        let mut m = PoisonDetectors::new(PoisonConfig::default());
        assert!(!m.is_quarantined("x", 0));
        assert_eq!(m.effective_class("x", FailureClass::AppError, 0), FailureClass::AppError);
        let mut went_in = None;
        for i in 0..25 {
            went_in = went_in.or(m.record_outcome("x", i, Some(FailureClass::AppError)));
            assert_eq!(m.record_outcome("x", i, Some(FailureClass::Dependency)), None);
            m.record_outcome("x", i, Some(FailureClass::Permanent));
        }
        assert_eq!(went_in, Some(true));
        assert_eq!(m.get("x").map(|d| d.counts(30)), Some(Counts { ok: 0, failed: 25 }));
        m.record_outcome("y", 0, None);
        assert_eq!(m.effective_class("x", FailureClass::AppError, 30), FailureClass::Poison);
        assert_eq!(m.effective_class("x", FailureClass::Timeout, 30), FailureClass::Poison);
        assert_eq!(m.effective_class("x", FailureClass::Dependency, 30), FailureClass::Dependency);
        assert_eq!(m.effective_class("x", FailureClass::WorkerCrash, 30), FailureClass::WorkerCrash);
        assert_eq!(m.effective_class("y", FailureClass::AppError, 30), FailureClass::AppError);
        let q: Vec<_> = m.quarantined().map(|(t, s)| (t.to_owned(), s)).collect();
        assert_eq!(q, vec![("x".to_owned(), 19)]);
        assert_eq!(m.len(), 2);
        assert_eq!(m.sweep(70 * MIN), vec![("x".to_owned(), false)]);
        assert!(m.quarantined_subjects(70 * MIN).is_empty(), "recorded without a tenant: no subject");
        assert!(m.is_empty());
    }

    #[test]
    fn the_fleet_sample_counts_with_the_own() {
        let mut m = PoisonDetectors::new(PoisonConfig { min_samples: 10, ..Default::default() });
        for i in 0..4 {
            m.record_outcome("x", i, Some(FailureClass::AppError));
        }
        assert!(!m.is_quarantined("x", 5), "4 of its own: too thin");
        let others: HashMap<String, Counts> =
            [("x".to_string(), Counts { ok: 1, failed: 5 }), ("y".to_string(), Counts { ok: 0, failed: 10 })].into();
        let changed = m.set_fleet(others, 6);
        assert!(
            changed.contains(&("x".to_string(), true)) && changed.contains(&("y".to_string(), true)),
            "{changed:?}"
        );
        assert_eq!(m.effective_class("y", FailureClass::AppError, 7), FailureClass::Poison, "seen only elsewhere");
        assert_eq!(m.own_counts(7).iter().find(|(t, _)| t == "x").map(|(_, c)| *c), Some(Counts { ok: 0, failed: 4 }));
        // The others' outcomes gone (their rows expired): judged on its own again.
        assert_eq!(m.set_fleet(HashMap::new(), 8).len(), 2);
        assert!(!m.is_quarantined("x", 9));
    }

    #[test]
    fn config_parse_and_validate() {
        let c: PoisonConfig = toml::from_str("window = \"30m\"\nmin_samples = 50").unwrap();
        assert_eq!(c.window, DurationMs::mins(30));
        assert_eq!(c.min_samples, 50);
        assert_eq!(c.buckets, 60);
        assert!(c.validate().is_ok());
        let bad = PoisonConfig { exit_ratio: 0.6, ..Default::default() };
        assert_eq!(bad.validate().unwrap_err().field, "exit_ratio");
        let bad = PoisonConfig { buckets: 0, ..Default::default() };
        assert!(bad.validate().unwrap_err().to_string().contains("buckets"));
        assert!(toml::from_str::<PoisonConfig>("treshold = 1").is_err());
        assert!(counts_toward_poison(FailureClass::WorkerCrash));
        assert!(!counts_toward_poison(FailureClass::Permanent));
    }

    proptest! {
        /// After every step the flag agrees with the rule applied to the window: in
        /// quarantine only with enough samples above the exit line, out of it only when
        /// not (enough samples and above the entry line).
        #[test]
        fn flag_follows_the_rule(
            steps in proptest::collection::vec((any::<bool>(), 0i64..120_000, any::<bool>()), 1..500),
            min_samples in 1u64..40,
        ) {
            let config = PoisonConfig { min_samples, ..Default::default() };
            let mut d = PoisonDetector::new(config.clone());
            let mut now = 0i64;
            let mut prev = false;
            for (ok, dt, query) in steps {
                now += dt;
                let changed = if query {
                    let q = d.is_quarantined(now);
                    (q != prev).then_some(q)
                } else {
                    d.record(now, ok)
                };
                let q = d.quarantined_since().is_some();
                prop_assert_eq!(changed.is_some(), q != prev);
                let c = d.counts(now);
                let enough = c.total() >= min_samples;
                if q {
                    prop_assert!(enough && c.failure_ratio() > config.exit_ratio);
                } else {
                    prop_assert!(!(enough && c.failure_ratio() > config.enter_ratio));
                }
                if q && !prev {
                    prop_assert!(c.failure_ratio() > config.enter_ratio);
                }
                prev = q;
            }
        }
    }

    /// A tenant's quarantined job type is listed with its tenant while the quarantine
    /// holds, another tenant's healthy type never, and the listing ends with the window.
    #[test]
    fn quarantined_subjects_name_the_tenant_while_it_holds() {
        let cfg = PoisonConfig { min_samples: 4, ..PoisonConfig::default() };
        let mut m = PoisonDetectors::new(cfg);
        for i in 0..4 {
            m.record_tenant_outcome("shaky", "sick", i, Some(FailureClass::AppError));
            m.record_tenant_outcome("shaky", "well", i, None);
        }
        let want = vec![("sick".to_owned(), "shaky".to_owned())];
        assert_eq!(m.quarantined_subjects(10), want);
        assert_eq!(m.quarantined_subjects(59 * MIN), want, "still within the window");
        assert!(m.quarantined_subjects(61 * MIN).is_empty(), "its failures left the window");
    }

    /// Detectors of tenants whose outcomes left the window are forgotten by the due
    /// sweep, at most once a minute, without the fleet exchange.
    #[test]
    fn the_due_sweep_forgets_idle_tenants_once_a_minute() {
        let cfg = PoisonConfig { window: DurationMs::mins(1), buckets: 60, ..PoisonConfig::default() };
        let mut m = PoisonDetectors::new(cfg);
        for t in 0..1_000 {
            m.record_tenant_outcome("x", &format!("t{t}"), 10_000, None);
        }
        assert_eq!(m.len(), 1_000);
        m.sweep_due(MIN);
        assert_eq!(m.len(), 1_000, "still within their window");
        m.sweep_due(MIN + 59_000);
        assert_eq!(m.len(), 1_000, "idle now, but the last sweep was 59 s ago: not due");
        m.record_tenant_outcome("x", "late", 2 * MIN, None);
        m.sweep_due(2 * MIN + 1);
        assert_eq!(m.len(), 1, "only the tenant with an outcome in the window is kept");
        m.sweep_due(4 * MIN);
        assert!(m.is_empty());
        for t in 0..MAX_TENANT_DETECTORS + 5 {
            m.record_tenant_outcome("x", &format!("t{t}"), 5 * MIN, Some(FailureClass::AppError));
        }
        assert_eq!(m.len(), MAX_TENANT_DETECTORS, "bounded: the newest tenants are not judged");
    }

    /// Three other workers each at their own bound of distinct pairs: this one keeps at
    /// most its bound, and a pair it holds still gets the others' counts.
    #[test]
    fn the_fleets_counts_do_not_pass_the_bound() {
        let mut m = PoisonDetectors::new(PoisonConfig::default());
        m.record_tenant_outcome("x", "mine", MIN, Some(FailureClass::AppError));
        let failing = Counts { ok: 0, failed: 50 };
        let mut others: HashMap<String, Counts> =
            (0..3 * MAX_TENANT_DETECTORS).map(|t| (tenant_key("x", &format!("t{t}")), failing)).collect();
        others.insert(tenant_key("x", "mine"), failing);
        m.set_fleet(others, MIN + 1);
        assert_eq!(m.len(), MAX_TENANT_DETECTORS);
        assert_eq!(m.get(&tenant_key("x", "mine")).map(|d| d.fleet), Some(failing));
    }
}
