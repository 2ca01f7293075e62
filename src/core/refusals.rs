//! What held a tenant's work back, counted per hour: every refusal of the front door by
//! limit and pool (`refused:<limit>:<pool>`), every admission that found the tenant at or
//! above [`NEAR_SHARE`] of a limit (`near:<limit>:<pool>`), and every job a worker held
//! for the tenant's breakers, quarantines or the recycling cap ([`Mark::Held`]). Each
//! process counts its own cumulative cells per (hour, tenant, code) ([`OwnRefusals`],
//! written idempotently: a retried write is harmless); the tenant's console page sums
//! them per hour ([`hourly`]); the ledger's leader turns new counts into one alert per
//! (tenant, code) that opens on the first period with any and resolves after
//! `for_periods` periods without ([`LimitAlerts`]). Pure: `now` is an argument.
//!
//! Bounds, each per [`Class`] so that the free accounts (up to 100,000 of them, one flow
//! of the fair share) cannot fill what the paying tenants' alerts need: a process counts
//! at most [`Class::max_cells`] cells per hour and class, and at most
//! [`MAX_CODES_PER_TENANT`] codes per tenant and hour (past either a count is dropped and
//! said so: the harm stays with the tenant or class that filled it); the leader keeps at
//! most [`Class::max_rows`] rows of an hour per class ([`ClassBudget`]) and tracks at
//! most `max` (tenant, code) alerts per class.

use crate::config::Tier;
use crate::model::Millis;
use std::collections::{BTreeMap, HashMap};

/// The width of a count.
pub const HOUR_MS: Millis = 3_600_000;
/// An admission at or above this share of a limit is a `near` mark.
pub const NEAR_SHARE: f64 = 0.8;
/// Most codes one process counts for one tenant in one hour (a tenant's limit kinds,
/// pools and held job types; past it the tenant's new codes go uncounted, its own harm).
pub const MAX_CODES_PER_TENANT: usize = 64;

/// Whose budget a tenant's counts take: the free accounts share one, the paying tiers
/// another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    Free,
    Paying,
}

impl Class {
    /// A tenant's class by its tier (a tenant without a registry row is a free account).
    pub fn of(tier: Option<Tier>) -> Class {
        match tier {
            Some(Tier::Standard | Tier::Pro | Tier::Enterprise) => Class::Paying,
            Some(Tier::Free) | None => Class::Free,
        }
    }

    /// Most (tenant, code) cells of the class one process counts in one hour.
    pub const fn max_cells(self) -> usize {
        match self {
            Class::Free => 5_000,
            Class::Paying => 20_000,
        }
    }

    /// Most rows of the class the leader keeps of one hour (every process's cells).
    pub const fn max_rows(self) -> usize {
        match self {
            Class::Free => 40_000,
            Class::Paying => 160_000,
        }
    }

    fn index(self) -> usize {
        match self {
            Class::Free => 0,
            Class::Paying => 1,
        }
    }
}

/// A refusal, an admission near the limit, or a worker holding the tenant's jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Refused,
    Near,
    /// A worker held a queued job of the tenant: `held:breaker/<job type>:<pool>` (the
    /// job type's breaker, the tenant's own or the type's), `held:quarantine/<job
    /// type>:<pool>` (an attempt failed as poison: the type is quarantined for the
    /// tenant), `held:recycling_cap:<pool>` (its jobs wait at the recycling cap),
    /// `held:max_concurrency:<pool>` and `held:rate_per_sec:<pool>` (its queued jobs wait
    /// at its own concurrency cap or dispatch rate).
    Held,
}

impl Mark {
    pub fn as_str(self) -> &'static str {
        match self {
            Mark::Refused => "refused",
            Mark::Near => "near",
            Mark::Held => "held",
        }
    }
}

/// The limit of the front door's submission breaker's refusals (`refused:circuit_open:<pool>`).
pub const CIRCUIT_OPEN: &str = "circuit_open";
/// The limit of jobs held at the recycling cap (`held:recycling_cap:<pool>`).
pub const RECYCLING_CAP: &str = "recycling_cap";

/// A breaker, quarantine or cap that holds a tenant's work, as the `limit` of a code
/// says it (the tenant page's table of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder<'a> {
    /// `refused:circuit_open:<pool>`: the front door's submission breaker.
    SubmissionBreaker,
    /// `held:breaker/<job type>:<pool>`: the job type's breaker (the tenant's own or the type's).
    JobTypeBreaker(&'a str),
    /// `held:quarantine/<job type>:<pool>`: the job type quarantined for the tenant.
    Quarantine(&'a str),
    /// `held:recycling_cap:<pool>`: its jobs wait at the recycling cap.
    RecyclingCap,
}

impl<'a> Holder<'a> {
    /// The mark its codes carry.
    pub fn mark(self) -> Mark {
        match self {
            Holder::SubmissionBreaker => Mark::Refused,
            _ => Mark::Held,
        }
    }

    /// The `limit` part of its codes.
    pub fn limit(self) -> String {
        match self {
            Holder::SubmissionBreaker => CIRCUIT_OPEN.into(),
            Holder::JobTypeBreaker(t) => format!("breaker/{t}"),
            Holder::Quarantine(t) => format!("quarantine/{t}"),
            Holder::RecyclingCap => RECYCLING_CAP.into(),
        }
    }

    /// The holder a code's mark and limit name (None: a limit that is not one).
    pub fn of(mark: Mark, limit: &'a str) -> Option<Holder<'a>> {
        match (mark, limit) {
            (Mark::Refused, CIRCUIT_OPEN) => Some(Holder::SubmissionBreaker),
            (Mark::Held, RECYCLING_CAP) => Some(Holder::RecyclingCap),
            (Mark::Held, l) => match l.split_once('/')? {
                ("breaker", t) => Some(Holder::JobTypeBreaker(t)),
                ("quarantine", t) => Some(Holder::Quarantine(t)),
                _ => None,
            },
            _ => None,
        }
    }
}

/// The code of a mark: `refused:tenant_rate:short`.
pub fn code(mark: Mark, limit: &str, pool: &str) -> String {
    format!("{}:{limit}:{pool}", mark.as_str())
}

/// The rule of a limit alert: `limit:<code>` ([`code`]).
pub fn limit_rule(code: &str) -> String {
    format!("limit:{code}")
}

/// The code of a limit alert's rule (None: not a rule of [`limit_rule`]).
pub fn limit_code(rule: &str) -> Option<&str> {
    rule.strip_prefix("limit:")
}

/// A code's mark, limit and pool (None: not a code of [`code`]).
pub fn parse(code: &str) -> Option<(Mark, &str, &str)> {
    let (mark, rest) = code.split_once(':')?;
    let (limit, pool) = rest.split_once(':')?;
    let mark = match mark {
        "refused" => Mark::Refused,
        "near" => Mark::Near,
        "held" => Mark::Held,
        _ => return None,
    };
    Some((mark, limit, pool))
}

/// One cumulative count of one process: (hour, tenant, code) and the count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    pub hour: Millis,
    pub tenant: String,
    pub code: String,
    pub n: i64,
}

/// One hour of a process's counts: cells per tenant and code (with whether written), and
/// how many cells each class holds.
#[derive(Debug, Default)]
struct Hour {
    cells: [usize; 2],
    tenants: HashMap<String, HashMap<String, (i64, bool)>>,
}

/// Why a count was not kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Untracked {
    /// The tenant already has [`MAX_CODES_PER_TENANT`] codes this hour.
    TenantFull,
    /// The tenant's class already has [`Class::max_cells`] cells this hour.
    ClassFull(Class),
}

/// One process's cumulative counts per hour and (tenant, code), with what was written.
#[derive(Debug, Default)]
pub struct OwnRefusals {
    hours: BTreeMap<Millis, Hour>,
}

impl OwnRefusals {
    /// Counts `n` of `code` for `tenant` (of `class`) at `now`; a new cell past the
    /// tenant's or the class's bound of the hour is not counted.
    pub fn record(&mut self, tenant: &str, class: Class, code: &str, n: i64, now: Millis) -> Result<(), Untracked> {
        let hour = self.hours.entry(now - now.rem_euclid(HOUR_MS)).or_default();
        if let Some(codes) = hour.tenants.get_mut(tenant) {
            if let Some(c) = codes.get_mut(code) {
                *c = (c.0.saturating_add(n), false);
                return Ok(());
            }
            if codes.len() >= MAX_CODES_PER_TENANT {
                return Err(Untracked::TenantFull);
            }
        }
        if hour.cells[class.index()] >= class.max_cells() {
            return Err(Untracked::ClassFull(class));
        }
        hour.cells[class.index()] += 1;
        hour.tenants.entry(tenant.to_string()).or_default().insert(code.to_string(), (n, false));
        Ok(())
    }

    /// Cells changed since written.
    pub fn pending(&self) -> Vec<Cell> {
        let mut out = Vec::new();
        for (hour, h) in &self.hours {
            for (tenant, codes) in &h.tenants {
                let changed = codes.iter().filter(|(_, (_, written))| !written);
                out.extend(changed.map(|(code, (n, _))| Cell {
                    hour: *hour,
                    tenant: tenant.clone(),
                    code: code.clone(),
                    n: *n,
                }));
            }
        }
        out
    }

    /// These cells were stored (unless they changed meanwhile).
    pub fn written(&mut self, cells: &[Cell]) {
        for c in cells {
            let Some(h) = self.hours.get_mut(&c.hour) else { continue };
            if let Some(cell) = h.tenants.get_mut(&c.tenant).and_then(|codes| codes.get_mut(&c.code)) {
                if cell.0 == c.n {
                    cell.1 = true;
                }
            }
        }
    }

    /// Forgets hours before the previous one.
    pub fn evict(&mut self, now: Millis) {
        self.hours.retain(|start, _| start + HOUR_MS > now - 2 * HOUR_MS);
    }
}

/// What the leader keeps of an hour's rows: at most [`Class::max_rows`] per class; the
/// rows past it are counted, not kept.
#[derive(Debug, Default)]
pub struct ClassBudget {
    kept: [usize; 2],
    /// Rows not kept, per class (free, paying).
    pub dropped: [usize; 2],
}

impl ClassBudget {
    /// Whether a row of `class` is kept.
    pub fn keep(&mut self, class: Class) -> bool {
        let i = class.index();
        if self.kept[i] >= class.max_rows() {
            self.dropped[i] += 1;
            return false;
        }
        self.kept[i] += 1;
        true
    }
}

/// The hours of the last `hours` ending with `now`'s, oldest first.
pub fn hours_until(now: Millis, hours: usize) -> Vec<Millis> {
    let last = now - now.rem_euclid(HOUR_MS);
    (0..hours as i64).rev().map(|i| last - i * HOUR_MS).collect()
}

/// Per code, its count in each hour of `hours` (rows: hour, code, count; every
/// process's cells summed).
pub fn hourly(rows: &[(Millis, String, i64)], hours: &[Millis]) -> BTreeMap<String, Vec<f64>> {
    let mut out: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (hour, code, n) in rows {
        let Some(i) = hours.iter().position(|h| h == hour) else { continue };
        let v = out.entry(code.clone()).or_insert_with(|| vec![0.0; hours.len()]);
        v[i] += (*n).max(0) as f64;
    }
    out
}

/// A (tenant, code) alert's state on the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Watch {
    /// The totals last read of the two latest hours: (hour, total).
    seen: [(Millis, i64); 2],
    opened_at: Option<Millis>,
    /// Periods in a row without a new count while open.
    clear: u32,
}

impl Default for Watch {
    fn default() -> Self {
        Watch { seen: [(Millis::MIN, 0); 2], opened_at: None, clear: 0 }
    }
}

impl Watch {
    fn seen_in(&self, hour: Millis) -> i64 {
        self.seen.iter().find(|(h, _)| *h == hour).map_or(0, |(_, n)| *n)
    }

    /// Keeps `total` as `hour`'s, with the latest other hour.
    fn saw(&mut self, hour: Millis, total: i64) {
        if let Some(s) = self.seen.iter_mut().find(|(h, _)| *h == hour) {
            s.1 = s.1.max(total);
        } else if hour > self.seen[0].0.min(self.seen[1].0) {
            let oldest = if self.seen[0].0 <= self.seen[1].0 { 0 } else { 1 };
            self.seen[oldest] = (hour, total);
        }
    }
}

/// A limit alert's change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitChange {
    Opened { tenant: String, code: String, opened_at: Millis, count: i64 },
    Resolved { tenant: String, code: String, opened_at: Millis, resolved_at: Millis },
}

/// One hour's totals as read: (tenant, code) -> count summed over processes.
pub type HourTotals = HashMap<(String, String), i64>;

/// The leader's limit alerts: per (tenant, code), the totals last read and whether its
/// alert is open; at most `max` pairs per [`Class`].
#[derive(Debug)]
pub struct LimitAlerts {
    max: usize,
    watched: HashMap<(String, String), Watch>,
    /// Counts of (tenant, code) pairs not tracked: past `max`.
    pub untracked: u64,
}

impl LimitAlerts {
    pub fn new(max: usize) -> Self {
        LimitAlerts { max, watched: HashMap::new(), untracked: 0 }
    }

    /// An alert open in the store (a new leader carries on: no second opening).
    pub fn restore(&mut self, tenant: &str, code: &str, opened_at: Millis) {
        let w = self.watched.entry((tenant.to_string(), code.to_string())).or_default();
        w.opened_at = Some(opened_at);
    }

    /// One period at `now` over the hours read (`now`'s and the one before it, whose
    /// last counts may land after it ended). A pair whose total in either grew opens (if
    /// closed); an open pair without growth for `for_periods` periods in a row resolves.
    /// `class_of` gives a tenant's [`Class`] (whose share of `max` a new pair takes).
    pub fn step(
        &mut self,
        hours: &[(Millis, HourTotals)],
        for_periods: u32,
        now: Millis,
        class_of: impl Fn(&str) -> Class,
    ) -> Vec<LimitChange> {
        let mut out = Vec::new();
        let mut grew: std::collections::HashSet<(String, String)> = Default::default();
        let mut held = [0usize; 2];
        for (tenant, _) in self.watched.keys() {
            held[class_of(tenant).index()] += 1;
        }
        for (hour, totals) in hours {
            for (key, total) in totals {
                if !self.watched.contains_key(key) {
                    let i = class_of(&key.0).index();
                    if held[i] >= self.max {
                        self.untracked += 1;
                        continue;
                    }
                    held[i] += 1;
                }
                let w = self.watched.entry(key.clone()).or_default();
                let before = w.seen_in(*hour);
                if *total > before {
                    if w.opened_at.is_none() && !grew.contains(key) {
                        w.opened_at = Some(now);
                        let (tenant, code) = key.clone();
                        out.push(LimitChange::Opened { tenant, code, opened_at: now, count: total - before });
                    }
                    grew.insert(key.clone());
                    w.clear = 0;
                }
                w.saw(*hour, *total);
            }
        }
        for (key, w) in self.watched.iter_mut() {
            let Some(opened_at) = w.opened_at else { continue };
            if grew.contains(key) {
                continue;
            }
            w.clear += 1;
            if w.clear >= for_periods.max(1) {
                w.opened_at = None;
                w.clear = 0;
                let (tenant, code) = key.clone();
                out.push(LimitChange::Resolved { tenant, code, opened_at, resolved_at: now });
            }
        }
        // Closed pairs not counted in the last two hours are forgotten.
        let current = now - now.rem_euclid(HOUR_MS);
        self.watched.retain(|_, w| w.opened_at.is_some() || w.seen.iter().any(|(h, _)| *h >= current - HOUR_MS));
        out
    }

    pub fn len(&self) -> usize {
        self.watched.len()
    }

    pub fn is_empty(&self) -> bool {
        self.watched.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn paying(_: &str) -> Class {
        Class::Paying
    }

    fn totals(v: &[(&str, &str, i64)]) -> HashMap<(String, String), i64> {
        v.iter().map(|(t, c, n)| ((t.to_string(), c.to_string()), *n)).collect()
    }

    #[test]
    fn each_holder_is_read_back_from_its_own_code_and_other_limits_are_none() {
        let all = [
            Holder::SubmissionBreaker,
            Holder::JobTypeBreaker("charge"),
            Holder::Quarantine("parse"),
            Holder::RecyclingCap,
        ];
        for h in all {
            let c = code(h.mark(), &h.limit(), "short");
            let (mark, limit, pool) = parse(&c).expect("a code");
            assert_eq!((Holder::of(mark, limit), pool), (Some(h), "short"), "{c}");
        }
        assert_eq!(Holder::of(Mark::Held, "max_concurrency"), None);
        assert_eq!(Holder::of(Mark::Refused, "tenant_rate"), None);
        assert_eq!(Holder::of(Mark::Near, "circuit_open"), None);
        assert_eq!(Holder::of(Mark::Held, "other/charge"), None);
    }

    #[test]
    fn codes_round_trip() {
        let c = code(Mark::Refused, "tenant_rate", "short");
        assert_eq!(c, "refused:tenant_rate:short");
        assert_eq!(parse(&c), Some((Mark::Refused, "tenant_rate", "short")));
        assert_eq!(parse("near:max_queued:long"), Some((Mark::Near, "max_queued", "long")));
        assert_eq!(parse("other:x:y"), None);
        assert_eq!(parse("refused:x"), None);
    }

    #[test]
    fn a_process_counts_cells_per_hour_within_its_bound() {
        let mut own = OwnRefusals::default();
        let code = "refused:tenant_rate:short";
        own.record("acme", Class::Paying, code, 3, 10).unwrap();
        own.record("acme", Class::Paying, code, 2, 20).unwrap();
        let p = own.pending();
        let cell = Cell { hour: 0, tenant: "acme".into(), code: code.into(), n: 5 };
        assert_eq!(p, vec![cell]);
        own.written(&p);
        assert!(own.pending().is_empty());
        own.record("acme", Class::Paying, code, 1, 25).unwrap();
        assert_eq!(own.pending()[0].n, 6, "a changed cell is pending again");
        for i in 0..Class::Paying.max_cells() - 1 {
            own.record(&format!("t{i}"), Class::Paying, "refused:x:short", 1, 30).unwrap();
        }
        let full = own.record("one-too-many", Class::Paying, "refused:x:short", 1, 30);
        assert_eq!(full, Err(Untracked::ClassFull(Class::Paying)), "the hour's cells are bounded");
        own.record("acme", Class::Paying, code, 1, 30).expect("a known cell still counts");
        own.record("next-hour", Class::Paying, "refused:x:short", 1, HOUR_MS).expect("a new hour starts afresh");
        own.evict(3 * HOUR_MS);
        assert!(own.pending().iter().all(|c| c.hour >= HOUR_MS), "hours before the previous one are forgotten");
    }

    /// The free accounts filling their budget leave the paying tenants theirs, and a
    /// tenant with many codes fills only its own.
    #[test]
    fn free_accounts_cannot_fill_the_paying_tenants_cells() {
        let mut own = OwnRefusals::default();
        for i in 0..100_000 {
            let _ = own.record(&format!("free-{i}"), Class::Free, "refused:tenant_rate:short", 1, 0);
        }
        let free = own.pending().len();
        assert_eq!(free, Class::Free.max_cells(), "the free accounts' cells stop at their budget");
        for i in 0..10_000 {
            own.record(&format!("paying-{i}"), Class::Paying, "refused:tenant_rate:short", 1, 0)
                .expect("every paying tenant still counted");
        }
        for k in 0..MAX_CODES_PER_TENANT {
            own.record("greedy", Class::Paying, &format!("held:breaker/t{k}:short"), 1, 0).unwrap();
        }
        let more = own.record("greedy", Class::Paying, "held:breaker/one-more:short", 1, 0);
        assert_eq!(more, Err(Untracked::TenantFull));
        own.record("paying-new", Class::Paying, "refused:max_queued:short", 1, 0).expect("others unharmed");
        let mut budget = ClassBudget::default();
        assert!((0..Class::Free.max_rows()).all(|_| budget.keep(Class::Free)));
        assert!(!budget.keep(Class::Free), "the leader keeps the free rows within theirs");
        assert!(budget.keep(Class::Paying), "and the paying ones still");
        assert_eq!(budget.dropped, [1, 0]);
    }

    #[test]
    fn the_page_sums_processes_per_hour_and_code() {
        let hours = hours_until(3 * HOUR_MS + 5, 3);
        assert_eq!(hours, vec![HOUR_MS, 2 * HOUR_MS, 3 * HOUR_MS]);
        let rows = vec![
            (HOUR_MS, "refused:tenant_rate:short".to_string(), 4),
            (HOUR_MS, "refused:tenant_rate:short".to_string(), 6),
            (3 * HOUR_MS, "near:max_queued:short".to_string(), 2),
            (0, "refused:tenant_rate:short".to_string(), 99),
        ];
        let h = hourly(&rows, &hours);
        assert_eq!(h["refused:tenant_rate:short"], vec![10.0, 0.0, 0.0]);
        assert_eq!(h["near:max_queued:short"], vec![0.0, 0.0, 2.0]);
    }

    #[test]
    fn one_alert_per_limit_opens_once_and_resolves_once() {
        let mut a = LimitAlerts::new(100);
        let code = "refused:tenant_rate:short";
        let ch = a.step(&[(0, totals(&[("acme", code, 5)]))], 3, 1_000, paying);
        assert_eq!(
            ch,
            vec![LimitChange::Opened { tenant: "acme".into(), code: code.into(), opened_at: 1_000, count: 5 }]
        );
        // Still refused: no second opening.
        assert!(a.step(&[(0, totals(&[("acme", code, 9)]))], 3, 2_000, paying).is_empty());
        // No new refusals for three periods: one resolution.
        assert!(a.step(&[(0, totals(&[("acme", code, 9)]))], 3, 3_000, paying).is_empty());
        assert!(a.step(&[(0, totals(&[("acme", code, 9)]))], 3, 4_000, paying).is_empty());
        let ch = a.step(&[(0, totals(&[("acme", code, 9)]))], 3, 5_000, paying);
        assert_eq!(
            ch,
            vec![LimitChange::Resolved {
                tenant: "acme".into(),
                code: code.into(),
                opened_at: 1_000,
                resolved_at: 5_000
            }]
        );
        assert!(a.step(&[(0, totals(&[("acme", code, 9)]))], 3, 6_000, paying).is_empty());
    }

    #[test]
    fn a_new_hour_counts_from_zero_and_the_tracked_pairs_are_bounded() {
        let mut a = LimitAlerts::new(2);
        let ch = a.step(&[(0, totals(&[("a", "refused:x:short", 5), ("b", "refused:x:short", 1)]))], 1, 10, paying);
        assert_eq!(ch.len(), 2);
        let ch = a.step(&[(0, totals(&[("c", "refused:x:short", 1)]))], 1, 20, paying);
        assert!(ch.iter().all(|c| matches!(c, LimitChange::Resolved { .. })), "{ch:?}");
        assert_eq!(a.untracked, 1, "a third pair past the bound is not tracked");
        let mut a = LimitAlerts::new(10);
        a.step(&[(0, totals(&[("a", "refused:x:short", 5)]))], 5, 10, paying);
        // The next hour's first count (1, below the last hour's 5) is new; the last
        // hour's late count too, read beside it.
        let both = [(0, totals(&[("a", "refused:x:short", 6)])), (HOUR_MS, totals(&[("a", "refused:x:short", 1)]))];
        assert!(a.step(&both, 5, HOUR_MS + 10, paying).is_empty(), "already open");
        assert_eq!(a.watched[&("a".to_string(), "refused:x:short".to_string())].clear, 0);
        assert!(a.step(&both, 5, HOUR_MS + 20, paying).is_empty());
        assert_eq!(
            a.watched[&("a".to_string(), "refused:x:short".to_string())].clear,
            1,
            "nothing new: a clear period"
        );
    }

    /// The leader stops reading a settled past hour: leaving out an hour whose totals did
    /// not change decides the same as reading it again.
    #[test]
    fn a_settled_hour_left_out_decides_as_the_same_hour_read_again() {
        let prev = totals(&[("a", "refused:x:short", 5), ("b", "refused:x:short", 2)]);
        let (mut read, mut skipped) = (LimitAlerts::new(10), LimitAlerts::new(10));
        let first = [(0, prev.clone()), (HOUR_MS, totals(&[("b", "refused:x:short", 1)]))];
        assert_eq!(read.step(&first, 2, HOUR_MS + 10, paying), skipped.step(&first, 2, HOUR_MS + 10, paying));
        for (i, cur) in [1, 1, 3, 3, 3].into_iter().enumerate() {
            let now = HOUR_MS + 400_000 + i as i64 * 60_000;
            let current = (HOUR_MS, totals(&[("b", "refused:x:short", cur)]));
            let sorted = |mut v: Vec<LimitChange>| {
                v.sort_by_key(|c| format!("{c:?}"));
                v
            };
            let both = sorted(read.step(&[(0, prev.clone()), current.clone()], 2, now, paying));
            assert_eq!(both, sorted(skipped.step(&[current], 2, now, paying)), "period {i}");
        }
    }

    /// Free accounts past the leader's bound leave the paying tenants' alerts tracked.
    #[test]
    fn the_leaders_tracked_pairs_are_bounded_per_class() {
        let mut a = LimitAlerts::new(2);
        let class = |t: &str| if t.starts_with("free-") { Class::Free } else { Class::Paying };
        let free = totals(&[
            ("free-1", "refused:x:short", 1),
            ("free-2", "refused:x:short", 1),
            ("free-3", "refused:x:short", 1),
        ]);
        assert_eq!(a.step(&[(0, free)], 5, 10, class).len(), 2);
        assert_eq!(a.untracked, 1);
        let ch = a.step(&[(0, totals(&[("acme", "refused:x:short", 1)]))], 5, 20, class);
        assert_eq!(ch.len(), 1, "a paying tenant's alert opens beside the free accounts' full share");
    }

    proptest! {
        /// However totals move, a pair never has two openings without a resolution
        /// between them, and the tracked pairs stay within the bound.
        #[test]
        fn openings_and_resolutions_alternate(steps in proptest::collection::vec((0usize..4, 0i64..5), 1..60)) {
            let mut a = LimitAlerts::new(3);
            let mut open: HashMap<String, bool> = HashMap::new();
            let mut total: HashMap<String, i64> = HashMap::new();
            for (i, (t, add)) in steps.into_iter().enumerate() {
                let tenant = format!("t{t}");
                *total.entry(tenant.clone()).or_default() += add;
                let tot: HourTotals =
                    total.iter().map(|(t, n)| ((t.clone(), "refused:x:short".to_string()), *n)).collect();
                for c in a.step(&[(0, tot)], 2, i as i64 * 1_000, paying) {
                    match c {
                        LimitChange::Opened { tenant, .. } => {
                            prop_assert!(!open.get(&tenant).copied().unwrap_or(false));
                            open.insert(tenant, true);
                        }
                        LimitChange::Resolved { tenant, .. } => {
                            prop_assert!(open.get(&tenant).copied().unwrap_or(false));
                            open.insert(tenant, false);
                        }
                    }
                }
                prop_assert!(a.len() <= 3);
            }
        }
    }
}
