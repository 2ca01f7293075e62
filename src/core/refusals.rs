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
//! Bounds: a process counts at most [`MAX_CELLS`] cells per hour (past it a count is
//! dropped and said so); the leader tracks at most `max` (tenant, code) alerts.

use crate::core::fleet::OwnCells;
use crate::model::Millis;
use std::collections::{BTreeMap, HashMap};

/// The width of a count.
pub const HOUR_MS: Millis = 3_600_000;
/// An admission at or above this share of a limit is a `near` mark.
pub const NEAR_SHARE: f64 = 0.8;
/// Most (tenant, code) cells one process counts in one hour.
pub const MAX_CELLS: usize = 20_000;

/// Separates tenant and code in an [`OwnRefusals`] key.
const SEP: char = '\u{1f}';

/// A refusal, an admission near the limit, or a worker holding the tenant's jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Refused,
    Near,
    /// A worker held a queued job of the tenant: `held:breaker/<job type>:<pool>` (the
    /// job type's breaker, the tenant's own or the type's), `held:quarantine/<job
    /// type>:<pool>` (an attempt failed as poison: the type is quarantined for the
    /// tenant), `held:recycling_cap:<pool>` (its jobs wait at the recycling cap).
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

/// The code of a mark: `refused:tenant_rate:short`.
pub fn code(mark: Mark, limit: &str, pool: &str) -> String {
    format!("{}:{limit}:{pool}", mark.as_str())
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

/// One process's cumulative counts per hour and (tenant, code), with what was written.
#[derive(Debug)]
pub struct OwnRefusals(OwnCells<i64>);

impl Default for OwnRefusals {
    fn default() -> Self {
        OwnRefusals(OwnCells::new(HOUR_MS))
    }
}

impl OwnRefusals {
    /// Counts `n` of `code` for `tenant` at `now`; false when the hour already holds
    /// [`MAX_CELLS`] other cells (not counted).
    pub fn record(&mut self, tenant: &str, code: &str, n: i64, now: Millis) -> bool {
        let key = format!("{tenant}{SEP}{code}");
        self.0.update_bounded(&key, now, MAX_CELLS, |c| *c = c.saturating_add(n))
    }

    /// Cells changed since written: (hour, key, cumulative count); [`OwnRefusals::key_parts`] splits the key.
    pub fn pending(&self) -> Vec<(Millis, String, i64)> {
        self.0.pending()
    }

    /// (tenant, code) of a key of [`OwnRefusals::pending`].
    pub fn key_parts(key: &str) -> (&str, &str) {
        key.split_once(SEP).unwrap_or((key, ""))
    }

    pub fn written(&mut self, cells: &[(Millis, String, i64)]) {
        self.0.written(cells)
    }

    /// Forgets hours before the previous one.
    pub fn evict(&mut self, now: Millis) {
        self.0.evict(now, 2 * HOUR_MS)
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
/// alert is open.
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
    pub fn step(&mut self, hours: &[(Millis, HourTotals)], for_periods: u32, now: Millis) -> Vec<LimitChange> {
        let mut out = Vec::new();
        let mut grew: std::collections::HashSet<(String, String)> = Default::default();
        for (hour, totals) in hours {
            for (key, total) in totals {
                if !self.watched.contains_key(key) && self.watched.len() >= self.max {
                    self.untracked += 1;
                    continue;
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

    fn totals(v: &[(&str, &str, i64)]) -> HashMap<(String, String), i64> {
        v.iter().map(|(t, c, n)| ((t.to_string(), c.to_string()), *n)).collect()
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
        assert!(own.record("acme", "refused:tenant_rate:short", 3, 10));
        assert!(own.record("acme", "refused:tenant_rate:short", 2, 20));
        let p = own.pending();
        assert_eq!(p, vec![(0, format!("acme{SEP}refused:tenant_rate:short"), 5)]);
        assert_eq!(OwnRefusals::key_parts(&p[0].1), ("acme", "refused:tenant_rate:short"));
        own.written(&p);
        assert!(own.pending().is_empty());
        for i in 0..MAX_CELLS - 1 {
            assert!(own.record(&format!("t{i}"), "refused:x:short", 1, 30));
        }
        assert!(!own.record("one-too-many", "refused:x:short", 1, 30), "the hour's cells are bounded");
        assert!(own.record("acme", "refused:tenant_rate:short", 1, 30), "a known cell still counts");
        assert!(own.record("next-hour", "refused:x:short", 1, HOUR_MS), "a new hour starts afresh");
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
        let ch = a.step(&[(0, totals(&[("acme", code, 5)]))], 3, 1_000);
        assert_eq!(
            ch,
            vec![LimitChange::Opened { tenant: "acme".into(), code: code.into(), opened_at: 1_000, count: 5 }]
        );
        // Still refused: no second opening.
        assert!(a.step(&[(0, totals(&[("acme", code, 9)]))], 3, 2_000).is_empty());
        // No new refusals for three periods: one resolution.
        assert!(a.step(&[(0, totals(&[("acme", code, 9)]))], 3, 3_000).is_empty());
        assert!(a.step(&[(0, totals(&[("acme", code, 9)]))], 3, 4_000).is_empty());
        let ch = a.step(&[(0, totals(&[("acme", code, 9)]))], 3, 5_000);
        assert_eq!(
            ch,
            vec![LimitChange::Resolved {
                tenant: "acme".into(),
                code: code.into(),
                opened_at: 1_000,
                resolved_at: 5_000
            }]
        );
        assert!(a.step(&[(0, totals(&[("acme", code, 9)]))], 3, 6_000).is_empty());
    }

    #[test]
    fn a_new_hour_counts_from_zero_and_the_tracked_pairs_are_bounded() {
        let mut a = LimitAlerts::new(2);
        let ch = a.step(&[(0, totals(&[("a", "refused:x:short", 5), ("b", "refused:x:short", 1)]))], 1, 10);
        assert_eq!(ch.len(), 2);
        let ch = a.step(&[(0, totals(&[("c", "refused:x:short", 1)]))], 1, 20);
        assert!(ch.iter().all(|c| matches!(c, LimitChange::Resolved { .. })), "{ch:?}");
        assert_eq!(a.untracked, 1, "a third pair past the bound is not tracked");
        let mut a = LimitAlerts::new(10);
        a.step(&[(0, totals(&[("a", "refused:x:short", 5)]))], 5, 10);
        // The next hour's first count (1, below the last hour's 5) is new; the last
        // hour's late count too, read beside it.
        let both = [(0, totals(&[("a", "refused:x:short", 6)])), (HOUR_MS, totals(&[("a", "refused:x:short", 1)]))];
        assert!(a.step(&both, 5, HOUR_MS + 10).is_empty(), "already open");
        assert_eq!(a.watched[&("a".to_string(), "refused:x:short".to_string())].clear, 0);
        assert!(a.step(&both, 5, HOUR_MS + 20).is_empty());
        assert_eq!(
            a.watched[&("a".to_string(), "refused:x:short".to_string())].clear,
            1,
            "nothing new: a clear period"
        );
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
                for c in a.step(&[(0, tot)], 2, i as i64 * 1_000) {
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
