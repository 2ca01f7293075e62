//! The fleet-wide dependency breaker: a job type declares the dependencies its jobs call
//! (`job_types.<name>.dependencies`); every worker counts each attempt's outcome into the
//! shared outcome cells (`core::admission::breaker::OwnOutcomes`, with the `dependency`
//! failures apart), and one process (the ledger's leader) sums the window of every
//! worker's cells per dependency and steps one [`Breaker`] per dependency. Open, it holds
//! the attempts of every job type that declares the dependency (workers put them back on
//! the dependency retry topic with their attempt unchanged, the front door answers 503
//! `CIRCUIT_OPEN` with `Retry-After`) until `cool_down` has passed; then it lets them
//! through on trial: failing again re-opens it, a window without that closes it.
//!
//! **One tenant cannot open it for others.** A dependency's counts are the shared
//! scope's rule of the front door's breaker ([`ScopeCounts::may_open`]): failures from at
//! least `min_tenants` tenants, and the ratio still above `failure_ratio` with the tenant
//! with most failures left out, or `min_tenants` tenants each above it on their own
//! attempts. A tenant whose own credentials fail on a healthy dependency opens nothing.
//!
//! Pure: `now` and the cells are arguments.

use crate::core::admission::breaker::{GateConfig, ScopeCounts, BUCKET_MS};
use crate::core::invalid::Invalid;
use crate::core::retry::DurationMs;
use crate::core::window::Counts;
use crate::model::Millis;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};

/// Most dependencies one job type may declare.
pub const MAX_PER_JOB_TYPE: usize = 8;
/// Longest dependency name.
pub const MAX_NAME_LEN: usize = 64;

/// `[dependency_breaker]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DependencyConfig {
    pub enabled: bool,
    /// Opens when the share of attempts failing with `dependency` is above this...
    pub failure_ratio: f64,
    /// ...over this window of the shared outcome cells...
    pub window: DurationMs,
    /// ...with at least this many attempts...
    pub min_attempts: u64,
    /// ...from at least this many tenants with such failures (the rule in the module docs).
    pub min_tenants: usize,
    /// Held this long after opening (and after each re-opening), then on trial.
    pub cool_down: DurationMs,
    /// Tenants told (alert webhooks) when it opens: those with attempts of the dependent
    /// job types in the window, the ones with most attempts first.
    pub max_affected_tenants: usize,
}

impl Default for DependencyConfig {
    fn default() -> Self {
        DependencyConfig {
            enabled: true,
            failure_ratio: 0.5,
            window: DurationMs::secs(60),
            min_attempts: 20,
            min_tenants: 2,
            cool_down: DurationMs::secs(60),
            max_affected_tenants: 1_000,
        }
    }
}

impl DependencyConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        self.gate().validate()?;
        if self.max_affected_tenants == 0 || self.max_affected_tenants > 100_000 {
            return Invalid::err("max_affected_tenants", "must be 1 to 100000, e.g. 1000");
        }
        Ok(())
    }

    /// The front door's gate settings these counts are judged by.
    pub fn gate(&self) -> GateConfig {
        GateConfig {
            enabled: self.enabled,
            failure_ratio: self.failure_ratio,
            window: self.window,
            min_attempts: self.min_attempts,
            cool_down: self.cool_down,
            probe_timeout: self.cool_down,
            min_tenants: self.min_tenants,
        }
    }
}

/// Checks a job type's declared dependencies: at most [`MAX_PER_JOB_TYPE`], each a name
/// of 1 to [`MAX_NAME_LEN`] characters of `a-z`, `0-9`, `.`, `_`, `-`.
pub fn validate_names(names: &[String]) -> Result<(), Invalid> {
    if names.len() > MAX_PER_JOB_TYPE {
        let why = format!("{} declared; at most {MAX_PER_JOB_TYPE}", names.len());
        return Invalid::err("dependencies", why);
    }
    for n in names {
        let ok = (1..=MAX_NAME_LEN).contains(&n.len())
            && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if !ok {
            let why = format!(
                "{n:?} must be 1 to {MAX_NAME_LEN} characters of a-z, 0-9, '.', '_', '-', e.g. \"payments-api\""
            );
            return Invalid::err("dependencies", why);
        }
    }
    Ok(())
}

/// One worker's outcome cell as read, for the dependency counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell<'a> {
    pub bucket: Millis,
    pub job_type: &'a str,
    pub tenant: &'a str,
    /// Attempts that ended (any way).
    pub attempts: i64,
    /// Of those, failures of class `dependency`.
    pub dependency: i64,
}

/// Sums the cells of the window `(now - window, now]` per dependency (buckets starting at
/// or after `since(dependency)`): each cell counts for every dependency its job type
/// declares (`deps_of`), per tenant; a failure is a `dependency` failure, every other
/// attempt (succeeded, or failed some other way: the dependency answered) counts as ok.
pub fn window_counts<'a, 'd>(
    cells: impl IntoIterator<Item = Cell<'a>>,
    deps_of: impl Fn(&str) -> &'d [String],
    now: Millis,
    window_ms: i64,
    since: impl Fn(&str) -> Millis,
) -> BTreeMap<String, ScopeCounts> {
    let mut out: BTreeMap<String, ScopeCounts> = BTreeMap::new();
    for c in cells {
        if c.bucket + BUCKET_MS <= now - window_ms || c.bucket > now {
            continue;
        }
        let attempts = c.attempts.max(0) as u64;
        let failed = (c.dependency.max(0) as u64).min(attempts);
        for d in deps_of(c.job_type) {
            if c.bucket < since(d) {
                continue;
            }
            let e = out.entry(d.clone()).or_default();
            let t = e.by_tenant.entry(c.tenant.to_string()).or_default();
            t.ok += attempts - failed;
            t.failed += failed;
            e.counts.ok += attempts - failed;
            e.counts.failed += failed;
            if failed > 0 {
                e.failing.insert(c.tenant.to_string());
            }
        }
    }
    out
}

/// Where one dependency's breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Counting buckets starting at or after `since`.
    Closed { since: Millis },
    /// Holding the dependent job types until `until`.
    Open { opened_at: Millis, until: Millis },
    /// Letting them through since `since`, counting from then.
    Trial { opened_at: Millis, since: Millis },
}

impl State {
    pub fn as_str(&self) -> &'static str {
        match self {
            State::Closed { .. } => "closed",
            State::Open { .. } => "open",
            State::Trial { .. } => "trial",
        }
    }

    /// Buckets starting before this are not counted.
    pub fn counting_since(&self) -> Millis {
        match *self {
            State::Closed { since } | State::Trial { since, .. } => since,
            State::Open { until, .. } => until,
        }
    }

    /// Until when jobs that need the dependency are held (None: they run).
    pub fn held_until(&self, now: Millis) -> Option<Millis> {
        match *self {
            State::Open { until, .. } if until > now => Some(until),
            _ => None,
        }
    }
}

/// What a step changed.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// It opened: its counts, the tenants whose failures opened it.
    Opened { opened_at: Millis, until: Millis, counts: Counts, failing: Vec<String> },
    /// It failed its trial: held again (the same outage: no new opening).
    Reopened { opened_at: Millis, until: Millis, counts: Counts },
    /// It closed: the outage from `opened_at` is over.
    Closed { opened_at: Millis, closed_at: Millis },
}

/// One dependency's breaker.
#[derive(Debug, Clone, PartialEq)]
pub struct Breaker {
    pub state: State,
}

/// A closed breaker counting the whole window: a leader that starts, or takes over from
/// one that died, while a dependency fails sees the failures already in the window (a
/// breaker that opened or closed before is not new: its stored row says since when it
/// counts).
impl Default for Breaker {
    fn default() -> Breaker {
        Breaker { state: State::Closed { since: Millis::MIN } }
    }
}

impl Breaker {
    /// One step at `now` with the counts since [`State::counting_since`] (None: nothing
    /// counted). Open turns to trial at `until`; trial closes after a window without
    /// re-opening, or sooner on `min_attempts` attempts at or below the ratio.
    pub fn step(&mut self, sc: Option<&ScopeCounts>, cfg: &DependencyConfig, now: Millis) -> Option<Change> {
        let gate = cfg.gate();
        let trips = sc.is_some_and(|sc| sc.may_open(&gate));
        let counts = sc.map(|s| s.counts).unwrap_or_default();
        let cool_down = cfg.cool_down.0;
        match self.state {
            State::Closed { .. } if trips => {
                let until = now.saturating_add(cool_down);
                self.state = State::Open { opened_at: now, until };
                let failing = sc.map(|s| s.failing.iter().cloned().collect()).unwrap_or_default();
                Some(Change::Opened { opened_at: now, until, counts, failing })
            }
            State::Closed { .. } => None,
            State::Open { opened_at, until } if now >= until => {
                self.state = State::Trial { opened_at, since: now };
                None
            }
            State::Open { .. } => None,
            State::Trial { opened_at, .. } if trips => {
                let until = now.saturating_add(cool_down);
                self.state = State::Open { opened_at, until };
                Some(Change::Reopened { opened_at, until, counts })
            }
            State::Trial { opened_at, since } => {
                let healthy = counts.total() >= cfg.min_attempts && counts.failure_ratio() <= cfg.failure_ratio;
                if healthy || now - since >= cfg.window.0 {
                    self.state = State::Closed { since: now };
                    return Some(Change::Closed { opened_at, closed_at: now });
                }
                None
            }
        }
    }
}

/// The rule name of a tenant's alert about `dependency`'s breaker (its webhook's `rule`).
pub fn alert_rule(dependency: &str) -> String {
    format!("dependency_circuit:{dependency}")
}

/// The dependency an alert's rule is about (None: not a rule of [`alert_rule`]).
pub fn alert_dependency(rule: &str) -> Option<&str> {
    rule.strip_prefix("dependency_circuit:")
}

/// The tenants a dependency's opening concerns: those with attempts of its dependent job
/// types in the counts, most attempts first, at most `max`.
pub fn affected_tenants(sc: &ScopeCounts, max: usize) -> Vec<String> {
    let mut v: Vec<(&String, u64)> = sc.by_tenant.iter().map(|(t, c)| (t, c.total())).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    v.into_iter().take(max).map(|(t, _)| t.clone()).collect()
}

/// The dependencies' states as a worker or an API process last read them: which job
/// types are held, and until when.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// Dependency -> until when it holds its job types (open ones only).
    open: HashMap<String, Millis>,
}

impl View {
    /// A view of the rows read: (dependency, state).
    pub fn new(rows: impl IntoIterator<Item = (String, State)>, now: Millis) -> View {
        let open = rows.into_iter().filter_map(|(d, s)| Some((d, s.held_until(now)?))).collect();
        View { open }
    }

    /// Until when a job of a type declaring `deps` is held, and by which dependency
    /// (the one open longest); None: it runs.
    pub fn held<'a>(&self, deps: &'a [String], now: Millis) -> Option<(&'a str, Millis)> {
        deps.iter()
            .filter_map(|d| Some((d.as_str(), *self.open.get(d)?)))
            .filter(|(_, until)| *until > now)
            .max_by_key(|(_, until)| *until)
    }

    /// Whether any dependency is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cfg() -> DependencyConfig {
        DependencyConfig { min_attempts: 10, min_tenants: 2, ..Default::default() }
    }

    fn deps() -> HashMap<String, Vec<String>> {
        HashMap::from([
            ("charge".to_string(), vec!["payments".to_string()]),
            ("refund".to_string(), vec!["payments".to_string(), "ledger-db".to_string()]),
            ("index".to_string(), vec!["search".to_string()]),
        ])
    }

    fn cell<'a>(job_type: &'a str, tenant: &'a str, attempts: i64, dependency: i64) -> Cell<'a> {
        Cell { bucket: 0, job_type, tenant, attempts, dependency }
    }

    fn sums(cells: Vec<Cell<'_>>) -> BTreeMap<String, ScopeCounts> {
        let d = deps();
        window_counts(cells, |jt| d.get(jt).map_or(&[][..], |v| v.as_slice()), 5_000, 60_000, |_| Millis::MIN)
    }

    #[test]
    fn a_cell_counts_for_each_dependency_its_type_declares() {
        let s = sums(vec![cell("refund", "acme", 10, 4), cell("charge", "globex", 5, 5), cell("index", "acme", 3, 0)]);
        assert_eq!(s["payments"].counts, Counts { ok: 6, failed: 9 });
        assert_eq!(s["ledger-db"].counts, Counts { ok: 6, failed: 4 });
        assert_eq!(s["search"].counts, Counts { ok: 3, failed: 0 });
        assert_eq!(s["payments"].failing.len(), 2);
        assert!(!s.contains_key("unknown"));
    }

    #[test]
    fn two_tenants_failing_open_it_and_one_tenant_alone_does_not() {
        let c = cfg();
        let alone = sums(vec![cell("charge", "acme", 100, 100), cell("charge", "globex", 100, 0)]);
        let mut b = Breaker::default();
        assert_eq!(b.step(alone.get("payments"), &c, 1_000), None, "one tenant's failures open nothing");
        let both = sums(vec![cell("charge", "acme", 100, 100), cell("charge", "globex", 20, 15)]);
        let opened = b.step(both.get("payments"), &c, 2_000);
        assert!(matches!(opened, Some(Change::Opened { opened_at: 2_000, until: 62_000, .. })), "{opened:?}");
        assert_eq!(b.state.held_until(2_000), Some(62_000));
    }

    #[test]
    fn a_new_breaker_counts_the_failures_already_in_the_window() {
        // A leader starting at 15 s, a bucket after the failures were written.
        let (c, d) = (cfg(), deps());
        let mut b = Breaker::default();
        let since = b.state.counting_since();
        let cells = vec![cell("charge", "acme", 20, 20), cell("charge", "globex", 20, 20)];
        let s = window_counts(cells, |jt| d.get(jt).map_or(&[][..], |v| v.as_slice()), 15_000, 60_000, |_| since);
        assert!(matches!(b.step(s.get("payments"), &c, 15_000), Some(Change::Opened { .. })));
    }

    #[test]
    fn open_turns_to_trial_then_reopens_or_closes() {
        let c = cfg();
        let failing = sums(vec![cell("charge", "acme", 20, 20), cell("charge", "globex", 20, 20)]);
        let healthy = sums(vec![cell("charge", "acme", 20, 0), cell("charge", "globex", 20, 1)]);
        let mut b = Breaker::default();
        assert!(matches!(b.step(failing.get("payments"), &c, 0), Some(Change::Opened { .. })));
        assert_eq!(b.step(failing.get("payments"), &c, 30_000), None, "held for the cool-down");
        assert_eq!(b.step(None, &c, 60_000), None);
        assert!(matches!(b.state, State::Trial { since: 60_000, .. }));
        assert_eq!(b.state.held_until(60_000), None, "on trial, jobs run");
        let re = b.step(failing.get("payments"), &c, 70_000);
        assert_eq!(re, Some(Change::Reopened { opened_at: 0, until: 130_000, counts: Counts { ok: 0, failed: 40 } }));
        assert_eq!(b.step(None, &c, 130_000), None);
        let closed = b.step(healthy.get("payments"), &c, 131_000);
        assert_eq!(closed, Some(Change::Closed { opened_at: 0, closed_at: 131_000 }));
        // A trial without traffic closes after a window.
        let mut b = Breaker { state: State::Trial { opened_at: 0, since: 10_000 } };
        assert_eq!(b.step(None, &c, 69_999), None);
        assert!(matches!(b.step(None, &c, 70_000), Some(Change::Closed { .. })));
    }

    #[test]
    fn the_view_holds_only_dependent_types_until_the_latest_open_end() {
        let rows = vec![
            ("payments".to_string(), State::Open { opened_at: 0, until: 50_000 }),
            ("ledger-db".to_string(), State::Open { opened_at: 0, until: 80_000 }),
            ("search".to_string(), State::Trial { opened_at: 0, since: 1 }),
        ];
        let v = View::new(rows, 10_000);
        let d = deps();
        assert_eq!(v.held(&d["charge"], 10_000), Some(("payments", 50_000)));
        assert_eq!(v.held(&d["refund"], 10_000), Some(("ledger-db", 80_000)));
        assert_eq!(v.held(&d["index"], 10_000), None);
        assert_eq!(v.held(&d["charge"], 50_000), None, "past its end it runs");
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_names(&["payments-api".into(), "db.main_1".into()]).is_ok());
        assert!(validate_names(&["Payments".into()]).is_err());
        assert!(validate_names(&["".into()]).is_err());
        assert!(validate_names(&vec!["a".to_string(); MAX_PER_JOB_TYPE + 1]).is_err());
    }

    proptest! {
        /// However failures are spread, one tenant's never open the breaker, and the
        /// affected tenants are bounded and ordered by attempts.
        #[test]
        fn one_tenants_failures_never_open_it(
            own in 0i64..10_000,
            others in proptest::collection::vec((0i64..1_000, 0i64..1_000), 0..50),
        ) {
            let c = cfg();
            let names: Vec<String> = (0..others.len()).map(|i| format!("t{i}")).collect();
            let mut cells = vec![cell("charge", "acme", own, own)];
            for ((n, _), name) in others.iter().zip(&names) {
                cells.push(cell("charge", name, *n, 0));
            }
            let s = sums(cells);
            let mut b = Breaker::default();
            prop_assert_eq!(b.step(s.get("payments"), &c, 1_000), None);
            if let Some(sc) = s.get("payments") {
                let a = affected_tenants(sc, 10);
                prop_assert!(a.len() <= 10);
                let totals: Vec<u64> = a.iter().map(|t| sc.by_tenant[t].total()).collect();
                prop_assert!(totals.windows(2).all(|w| w[0] >= w[1]));
            }
        }
    }
}
