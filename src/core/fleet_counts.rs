//! Fleet-wide failure counts, the pure part: the per-tenant retry budget
//! (`core::retry::RetryBudget`) and poison detection (`core::poison`) judged on the
//! counts of every worker of a pool, not one worker's, so N workers do not allow N times
//! the budget or need N times the failures to quarantine a job type.
//!
//! **Mechanism: per-worker count rows exchanged with the fleet-wide limits.** On every
//! pass of `worker::quota` (twice a second) each worker of a pool writes into the
//! `fleet_counts` table, keyed by the pool's topic:
//! * a presence row (`worker`, short TTL): the live workers of the pool;
//! * per tenant whose counts changed **and whose retries some worker is judging** (it
//!   has retry asks here, or another worker's row shows asks), its decayed fresh
//!   dispatches, retries and retry *asks* (retries it wanted, allowed or not: its
//!   demand), with the time they were decayed to, at most [`MAX_BUDGET_ROWS`] per pass
//!   (the most asked first); they live three budget windows, and a reader decays them to
//!   its `now`, so a stopped worker's history counts on exactly as if it were alive. A
//!   tenant that does not retry costs no row: its dispatch counts reach the fleet one
//!   exchange round after its first retry ask anywhere (until then the others judge it
//!   on fewer dispatches: fewer retries allowed, never more);
//! * per job type it judged lately, its successes and failures in the poison window
//!   (they live one window).
//!
//! It reads the other workers' rows back and:
//! * **retry budget** ([`FleetBudget`]): the fleet's headroom of a tenant (`ratio x
//!   dispatches + allowance - retries`, all workers' counts) is dealt out to the live
//!   workers ([`split`]): first by their asks (each wants its decayed asks plus one),
//!   what is left equally, in an order rotating with the exchange
//!   (`core::quota::allot`). A worker allows retries of the tenant only within its
//!   allotment until its next read; past it the retry is dead-lettered with the reason.
//!   Before its first read, or when it cannot read, a worker allows nothing beyond the
//!   allotment it had (a refused retry goes to the DLQ, from where it can be replayed).
//! * **poison detection**: every worker's detector adds the other workers' outcomes of a
//!   job type to its own window (`PoisonDetectors::set_fleet`), so the type enters (and
//!   leaves) quarantine on the fleet's failure rate and sample.
//!
//! **Worst case.** Retry budget: allotments dealt from one view add up to at most the
//! headroom; a worker's view misses the retries the others allowed since their last
//! write (at most one pass), so the fleet exceeds the budget by at most what the other
//! workers allowed within one exchange round, each within its allotment: under one
//! headroom (at most the cap) when the workers read the same rows, against `(N - 1) x
//! cap` when each worker judged alone. Poison detection: a job type enters quarantine on
//! every worker at most one exchange round (a pass to write, a pass to read: about a
//! second) after the fleet's outcomes crossed the threshold; the failures of that round
//! are still handled as ordinary ones, against up to `N x min_samples` when each worker
//! needed its own sample. The cost: a worker allows a tenant's retries only within its
//! share of the headroom, so near the edge a retry can be refused on one worker while
//! another still has allotment (for at most a pass), and a dead worker's outcomes keep
//! counting in the poison window until its rows expire (one window).

use crate::core::quota::allot;
use crate::core::window::Counts;
use crate::model::Millis;
use std::collections::{HashMap, HashSet};

/// Scope of a worker's presence row.
pub const PRESENCE: &str = "worker";
/// Most retry-budget rows a worker writes per pass (see [`FleetBudget::rows`]).
pub const MAX_BUDGET_ROWS: usize = 256;
/// Decayed counts below this are nothing.
const MIN_ASKS: f64 = 0.01;
/// A worker that could not read the counts for this long allows no retry beyond the
/// allotments it had.
pub const STALE_MS: i64 = crate::core::quota::STALE_MS;

/// One worker's row of counts for one scope (`a`, `b`, `c`: see the scope).
#[derive(Debug, Clone, PartialEq)]
pub struct CountRow {
    pub scope: String,
    pub worker: String,
    /// When the counts were taken (budget counts are decayed to this time).
    pub at: Millis,
    pub a: f64,
    pub b: f64,
    pub c: f64,
}

/// The scope of a tenant's retry budget: `a` dispatches, `b` retries, `c` asks.
pub fn budget_scope(tenant: &str) -> String {
    format!("retry:{tenant}")
}

/// The scope of a job type's poison window: `a` successes, `b` failures.
pub fn poison_scope(job_type: &str) -> String {
    format!("poison:{job_type}")
}

/// The presence row of `worker` at `now`.
pub fn presence(worker: &str, now: Millis) -> CountRow {
    CountRow { scope: PRESENCE.into(), worker: worker.into(), at: now, a: 0.0, b: 0.0, c: 0.0 }
}

/// `value` at `from` decayed to `to` with time constant `tau_ms`.
pub fn decay(value: f64, from: Millis, to: Millis, tau_ms: f64) -> f64 {
    let dt = to.saturating_sub(from).max(0) as f64;
    value * (-dt / tau_ms.max(1.0)).exp()
}

/// Deals `headroom` retries to `workers`: first up to each one's want (its asks plus
/// one; a worker without a row wants one), the rest equally, the odd units in an order
/// rotating with `epoch`. Returns each worker's allotment; they add up to `headroom`.
pub fn split(headroom: u32, workers: &[&str], asks: &HashMap<&str, f64>, epoch: i64) -> HashMap<String, u32> {
    let wants: Vec<(&str, u32)> =
        workers.iter().map(|w| (*w, asks.get(w).map_or(1, |a| (a.max(0.0).ceil() as u32).saturating_add(1)))).collect();
    let mut given = allot(headroom, &wants, epoch);
    let dealt: u32 = given.values().sum();
    let rest = headroom - dealt;
    if rest > 0 && !workers.is_empty() {
        let n = workers.len() as u32;
        let ones: Vec<(&str, u32)> = workers.iter().map(|w| (*w, 1)).collect();
        let odd = allot(rest % n, &ones, epoch);
        for w in workers {
            *given.entry(w.to_string()).or_default() += rest / n + odd.get(*w).copied().unwrap_or(0);
        }
    }
    given
}

/// The other workers' budget counts of a tenant, as read.
#[derive(Debug, Clone, Default)]
struct Others {
    /// Sums of dispatches and retries, decayed to the read.
    dispatches: f64,
    retries: f64,
    /// Each other worker's asks, decayed to the read.
    asks: Vec<(String, f64)>,
}

/// A worker's part of the fleet-wide retry budgets of one pool (see the module docs):
/// the last read of the other workers' counts, this worker's asks, and its allotments.
#[derive(Debug, Clone, Default)]
pub struct FleetBudget {
    me: String,
    /// Time constant of the decayed counts (the budget's window).
    tau_ms: f64,
    /// Decayed retry asks per tenant here: (decayed to, value).
    asks: HashMap<String, (Millis, f64)>,
    read_at: Option<Millis>,
    /// Live workers at the last read, this one included, sorted.
    workers: Vec<String>,
    others: HashMap<String, Others>,
    /// This worker's asks as its own rows told the others at the last read: every worker
    /// deals from the same wants.
    own_asks: HashMap<String, f64>,
    /// Allotments dealt since the last read, and retries allowed against them.
    grants: HashMap<String, u32>,
    spent: HashMap<String, u32>,
    /// Tenants whose counts changed since the last write.
    dirty: HashSet<String>,
}

/// Why [`FleetBudget::take`] refused a retry.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// This worker's allotment since its last read (all of it allowed already).
    pub allotment: u32,
    pub workers: usize,
    /// No read yet, or the last one is older than [`STALE_MS`].
    pub stale: bool,
}

impl FleetBudget {
    pub fn new(me: &str, tau_ms: f64) -> Self {
        FleetBudget { me: me.to_string(), tau_ms: tau_ms.max(1.0), ..Default::default() }
    }

    /// A tenant's counts changed here (a dispatch, a retry asked).
    pub fn touch(&mut self, tenant: &str) {
        if !self.dirty.contains(tenant) {
            self.dirty.insert(tenant.to_string());
        }
    }

    fn asks_at(&self, tenant: &str, now: Millis) -> f64 {
        self.asks.get(tenant).map_or(0.0, |(at, v)| decay(*v, *at, now, self.tau_ms))
    }

    /// The other workers' (dispatches, retries) of a tenant, decayed to `now`.
    pub fn others(&self, tenant: &str, now: Millis) -> (f64, f64) {
        match (self.others.get(tenant), self.read_at) {
            (Some(o), Some(at)) => (decay(o.dispatches, at, now, self.tau_ms), decay(o.retries, at, now, self.tau_ms)),
            _ => (0.0, 0.0),
        }
    }

    /// Live workers at the last read (1 before any).
    pub fn workers(&self) -> usize {
        self.workers.len().max(1)
    }

    /// One retry of `tenant` wanted at `now`, with the fleet's `headroom` (cap minus
    /// retries, this worker's included) as this worker sees it: allowed within its
    /// allotment since the last read (dealt on the first ask after a read).
    pub fn take(&mut self, tenant: &str, headroom: f64, now: Millis) -> Result<(), Refusal> {
        let asks = self.asks_at(tenant, now) + 1.0;
        self.asks.insert(tenant.to_string(), (now, asks));
        self.touch(tenant);
        let stale = self.read_at.is_none_or(|at| now - at > STALE_MS);
        let spent = self.spent.get(tenant).copied().unwrap_or(0);
        let allotment = match self.grants.get(tenant) {
            Some(&g) => g,
            None if stale => 0,
            None => {
                // The headroom at the read: this worker's retries since are in `spent`.
                let g = self.deal(tenant, (headroom + f64::from(spent)).max(0.0).floor() as u32, now);
                self.grants.insert(tenant.to_string(), g);
                g
            }
        };
        if spent < allotment {
            self.spent.insert(tenant.to_string(), spent + 1);
            Ok(())
        } else {
            Err(Refusal { allotment, workers: self.workers(), stale })
        }
    }

    /// This worker's allotment of `headroom` retries of a tenant.
    fn deal(&self, tenant: &str, headroom: u32, now: Millis) -> u32 {
        let at = self.read_at.unwrap_or(now);
        let mut asks: HashMap<&str, f64> = HashMap::new();
        if let Some(o) = self.others.get(tenant) {
            for (w, a) in &o.asks {
                asks.insert(w.as_str(), *a);
            }
        }
        asks.insert(self.me.as_str(), self.own_asks.get(tenant).copied().unwrap_or(0.0));
        let workers: Vec<&str> = self.workers.iter().map(String::as_str).collect();
        let epoch = at.div_euclid(crate::core::quota::ROTATION_MS);
        split(headroom, &workers, &asks, epoch).get(self.me.as_str()).copied().unwrap_or(0)
    }

    /// A read of the pool's count rows at `now`: the other workers' budget counts and
    /// the live workers; the allotments are dealt afresh from here.
    pub fn read(&mut self, rows: &[CountRow], now: Millis) {
        let mut workers: Vec<String> = vec![self.me.clone()];
        let mut others: HashMap<String, Others> = HashMap::new();
        self.own_asks.clear();
        for r in rows {
            if r.worker == self.me {
                if let Some(tenant) = r.scope.strip_prefix("retry:") {
                    self.own_asks.insert(tenant.to_string(), decay(r.c, r.at, now, self.tau_ms));
                }
            } else if r.scope == PRESENCE {
                workers.push(r.worker.clone());
            } else if let Some(tenant) = r.scope.strip_prefix("retry:") {
                let o = others.entry(tenant.to_string()).or_default();
                o.dispatches += decay(r.a, r.at, now, self.tau_ms);
                o.retries += decay(r.b, r.at, now, self.tau_ms);
                o.asks.push((r.worker.clone(), decay(r.c, r.at, now, self.tau_ms)));
            }
        }
        workers.sort();
        workers.dedup();
        self.workers = workers;
        self.others = others;
        self.read_at = Some(now);
        self.grants.clear();
        self.spent.clear();
    }

    /// Rows of the tenants whose counts changed since the last write and matter to the
    /// fleet, from this worker's `(dispatches, retries)` at `now`; they count as written.
    /// A tenant's counts matter only while some worker judges its retries (it has retry
    /// asks here, or another worker's row shows asks): a tenant that never retries costs
    /// no row. At most [`MAX_BUDGET_ROWS`] per pass, the most asked first; the rest stay
    /// due for the next passes. Changed counts nobody needs are forgotten once they
    /// decayed away.
    pub fn rows(&mut self, local: impl Fn(&str) -> (f64, f64), now: Millis) -> Vec<CountRow> {
        let mut due: Vec<(f64, String)> = self
            .dirty
            .iter()
            .map(|t| (self.asks_at(t, now), t))
            .filter(|(asks, t)| *asks >= MIN_ASKS || self.asked_elsewhere(t))
            .map(|(asks, t)| (asks, t.clone()))
            .collect();
        due.sort_by(|x, y| y.0.total_cmp(&x.0).then_with(|| x.1.cmp(&y.1)));
        due.truncate(MAX_BUDGET_ROWS);
        let rows = due
            .into_iter()
            .map(|(c, t)| {
                self.dirty.remove(&t);
                let (a, b) = local(&t);
                CountRow { scope: budget_scope(&t), worker: self.me.clone(), at: now, a, b, c }
            })
            .collect();
        self.dirty.retain(|t| {
            let (d, r) = local(t);
            d >= MIN_ASKS || r >= MIN_ASKS
        });
        // Asks that decayed to nothing are forgotten (their rows expire).
        self.asks.retain(|_, (at, v)| decay(*v, *at, now, self.tau_ms) >= MIN_ASKS);
        rows
    }

    /// Another worker's row (last read) shows retry asks of `tenant`.
    fn asked_elsewhere(&self, tenant: &str) -> bool {
        self.others.get(tenant).is_some_and(|o| o.asks.iter().any(|(_, a)| *a >= MIN_ASKS))
    }

    /// Rows not written after all: written again next pass.
    pub fn unwritten(&mut self, rows: &[CountRow]) {
        for r in rows {
            if let Some(t) = r.scope.strip_prefix("retry:") {
                self.touch(t);
            }
        }
    }
}

/// The other workers' poison windows from a read: successes and failures per job type.
pub fn poison_counts(rows: &[CountRow], me: &str) -> HashMap<String, Counts> {
    let mut out: HashMap<String, Counts> = HashMap::new();
    for r in rows.iter().filter(|r| r.worker != me) {
        if let Some(jt) = r.scope.strip_prefix("poison:") {
            let c = out.entry(jt.to_string()).or_default();
            c.ok = c.ok.saturating_add(r.a.max(0.0) as u64);
            c.failed = c.failed.saturating_add(r.b.max(0.0) as u64);
        }
    }
    out
}

/// This worker's poison rows: its window's counts per job type at `now`.
pub fn poison_rows(local: &[(String, Counts)], me: &str, now: Millis) -> Vec<CountRow> {
    local
        .iter()
        .map(|(jt, c)| CountRow {
            scope: poison_scope(jt),
            worker: me.to_string(),
            at: now,
            a: c.ok as f64,
            b: c.failed as f64,
            c: 0.0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row(scope: &str, worker: &str, at: Millis, a: f64, b: f64, c: f64) -> CountRow {
        CountRow { scope: scope.into(), worker: worker.into(), at, a, b, c }
    }

    #[test]
    fn split_deals_asks_first_then_equally() {
        let asks: HashMap<&str, f64> = [("a", 4.0), ("b", 0.0)].into_iter().collect();
        let g = split(9, &["a", "b", "c"], &asks, 0);
        assert_eq!(g.values().sum::<u32>(), 9);
        // a wants 5, b and c want 1: 7 dealt by want, 2 left equally (one each to two).
        assert!(g["a"] >= 5 && g["b"] >= 1 && g["c"] >= 1, "{g:?}");
        let g = split(2, &["a", "b", "c"], &asks, 0);
        assert_eq!(g.values().sum::<u32>(), 2);
    }

    #[test]
    fn three_workers_share_one_headroom() {
        let mut ws: Vec<FleetBudget> = ["w0", "w1", "w2"].iter().map(|w| FleetBudget::new(w, 60_000.0)).collect();
        let presence: Vec<CountRow> = ["w0", "w1", "w2"].iter().map(|w| presence(w, 0)).collect();
        for w in &mut ws {
            w.read(&presence, 0);
        }
        // Cap 6, nothing used: each worker may allow its part only.
        let allowed: usize = ws.iter_mut().map(|w| (0..10).filter(|_| w.take("t", 6.0, 1).is_ok()).count()).sum();
        assert_eq!(allowed, 6);
        let refusal = ws[0].take("t", 6.0, 1).unwrap_err();
        assert_eq!((refusal.workers, refusal.stale), (3, false));
    }

    #[test]
    fn others_counts_decay_and_asks_steer_the_deal() {
        let mut b = FleetBudget::new("me", 1_000.0);
        let rows = [presence("o", 0), row("retry:t", "o", 0, 10.0, 4.0, 8.0), row("poison:x", "o", 0, 3.0, 7.0, 0.0)];
        b.read(&rows, 1_000);
        let (d, r) = b.others("t", 1_000);
        assert!((d - 10.0 / std::f64::consts::E).abs() < 1e-9 && (r - 4.0 / std::f64::consts::E).abs() < 1e-9);
        // The other worker asked a lot: it gets most of a small headroom.
        assert!(b.take("t", 4.0, 1_000).is_ok());
        assert!(b.take("t", 4.0, 1_000).is_err());
        assert_eq!(poison_counts(&rows, "me")["x"], Counts { ok: 3, failed: 7 });
        assert!(poison_counts(&rows, "o").is_empty());
    }

    #[test]
    fn nothing_is_allowed_before_the_first_read_or_once_stale() {
        let mut b = FleetBudget::new("me", 1_000.0);
        assert!(b.take("t", 100.0, 0).unwrap_err().stale);
        b.read(&[], 0);
        assert!(b.take("t", 100.0, 10).is_ok());
        assert!(b.take("u", 100.0, STALE_MS + 1).unwrap_err().stale, "no new allotment while stale");
        assert!(b.take("t", 100.0, STALE_MS + 1).is_ok(), "the allotment it had still holds");
    }

    #[test]
    fn changed_tenants_are_written_once() {
        let mut b = FleetBudget::new("me", 1_000.0);
        b.touch("t");
        let _ = b.take("t", 10.0, 5);
        let rows = b.rows(|_| (2.0, 1.0), 5);
        assert_eq!(rows, vec![row("retry:t", "me", 5, 2.0, 1.0, 1.0)]);
        assert!(b.rows(|_| (2.0, 1.0), 6).is_empty());
        b.unwritten(&rows);
        assert_eq!(b.rows(|_| (2.0, 1.0), 7).len(), 1);
    }

    /// The counts exchange writes rows only for tenants whose retries are being judged,
    /// at most MAX_BUDGET_ROWS per pass, however many tenants dispatched.
    #[test]
    fn budget_rows_per_pass_are_bounded_and_only_for_retrying_tenants() {
        let mut b = FleetBudget::new("me", 60_000.0);
        for i in 0..10_000 {
            b.touch(&format!("t{i}"));
        }
        assert!(b.rows(|_| (1.0, 0.0), 10).is_empty(), "tenants that never retry cost no row");
        // Another worker judges t7's retries: this worker's dispatches of t7 go out.
        b.read(&[presence("o", 10), row("retry:t7", "o", 10, 1.0, 1.0, 2.0)], 10);
        let rows = b.rows(|_| (1.0, 0.0), 20);
        assert_eq!(rows.iter().map(|r| r.scope.as_str()).collect::<Vec<_>>(), vec!["retry:t7"]);
        // 1,000 tenants retrying here: bounded per pass, all written over the passes.
        for i in 0..1_000 {
            let _ = b.take(&format!("t{i}"), 10.0, 30);
        }
        let mut written = std::collections::HashSet::new();
        for pass in 0..5 {
            let rows = b.rows(|_| (1.0, 0.0), 40 + pass);
            assert!(rows.len() <= MAX_BUDGET_ROWS, "{} rows in one pass", rows.len());
            written.extend(rows.into_iter().map(|r| r.scope));
        }
        assert_eq!(written.len(), 1_000, "every retrying tenant's row went out");
        // Counts nobody needs are forgotten once they decayed.
        b.rows(|_| (0.0, 0.0), 50);
        assert!(b.dirty.is_empty());
    }

    proptest! {
        #[test]
        fn prop_split_deals_exactly_the_headroom(
            headroom in 0u32..500,
            asks in prop::collection::vec(0.0f64..50.0, 1..6),
            epoch in any::<i64>(),
        ) {
            let names: Vec<String> = (0..asks.len()).map(|i| format!("w{i}")).collect();
            let workers: Vec<&str> = names.iter().map(String::as_str).collect();
            let a: HashMap<&str, f64> = workers.iter().copied().zip(asks.iter().copied()).collect();
            let g = split(headroom, &workers, &a, epoch);
            prop_assert_eq!(g.values().sum::<u32>(), headroom);
            // Equal parts of what the wants leave: nobody below the floor of an equal split
            // of the rest.
            let wants: u32 = asks.iter().map(|x| x.ceil() as u32 + 1).sum();
            let floor = headroom.saturating_sub(wants) / workers.len() as u32;
            for w in &workers {
                prop_assert!(g.get(*w).copied().unwrap_or(0) >= floor);
            }
        }

        /// Workers that read the same rows never allow more than the headroom together,
        /// whatever order they ask in.
        #[test]
        fn prop_one_view_allows_at_most_the_headroom(
            headroom in 0u32..40,
            asks in prop::collection::vec(0usize..3, 0..80),
        ) {
            let names = ["w0", "w1", "w2"];
            let mut ws: Vec<FleetBudget> = names.iter().map(|w| FleetBudget::new(w, 60_000.0)).collect();
            let presence: Vec<CountRow> = names.iter().map(|w| presence(w, 0)).collect();
            for w in &mut ws {
                w.read(&presence, 0);
            }
            let allowed = asks.iter().filter(|&&i| ws[i].take("t", f64::from(headroom), 1).is_ok()).count();
            prop_assert!(allowed as u32 <= headroom);
        }
    }
}
