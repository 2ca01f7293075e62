//! The invariants checked after every run, against the run's ground truth (`Trace`):
//! each returns violations with enough detail to debug (docs/simulation.md lists them).

use super::ledger::Tally;
use super::shape::{Kind, Shape};
use super::trace::{Outcome, Trace};
use super::world::{sim_policy, LEASE_MS};
use crate::model::{FailureClass, Millis};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// `lost`, `duplicate`, `wrong_result`, `two_runs`, `attempt_by_crash`, `dlq_reason`,
    /// `fairness`, `usage`, `stalled`.
    pub invariant: &'static str,
    pub detail: String,
}

fn v(invariant: &'static str, detail: String) -> Violation {
    Violation { invariant, detail }
}

/// Every invariant's violations, in a stable order.
pub fn violations(shape: &Shape, t: &Trace, ledger: &Tally) -> Vec<Violation> {
    let mut out = Vec::new();
    results(shape, t, &mut out);
    leases(shape, t, &mut out);
    attempts(t, &mut out);
    dead_letters(shape, t, &mut out);
    fairness(t, &mut out);
    usage(shape, t, ledger, &mut out);
    out.extend(t.stalls.iter().map(|s| v("stalled", s.clone())));
    out
}

fn by_job<T>(items: impl Iterator<Item = (u32, T)>) -> HashMap<u32, Vec<T>> {
    let mut m: HashMap<u32, Vec<T>> = HashMap::new();
    for (j, x) in items {
        m.entry(j).or_default().push(x);
    }
    m
}

/// Every accepted job has exactly one result, of the right kind; a second one is allowed
/// only within the documented window (the copy read the row before the first outcome's
/// state was written) and counted apart.
fn results(shape: &Shape, t: &Trace, out: &mut Vec<Violation>) {
    let results = by_job(t.results.iter().map(|r| (r.job, r)));
    let runs = by_job(t.runs.iter().map(|r| (r.job, r)));
    for (j, spec) in shape.jobs.iter().enumerate() {
        let j = j as u32;
        let Some(rs) = results.get(&j) else {
            let ran: Vec<String> = runs
                .get(&j)
                .map(|rs| rs.iter().map(|r| format!("w{}@{}:{:?}", r.worker, r.start, r.outcome)).collect())
                .unwrap_or_default();
            out.push(v(
                "lost",
                format!(
                    "job {j} (tenant t{}, {:?}, submitted at {} ms) has no result; runs: [{}]",
                    spec.tenant,
                    spec.kind,
                    spec.submit_at,
                    ran.join(", ")
                ),
            ));
            continue;
        };
        let first_terminal = t.terminal_at.get(&j).copied().unwrap_or(Millis::MAX);
        for r in rs.iter().skip(1) {
            if r.checked >= first_terminal {
                out.push(v(
                    "duplicate",
                    format!(
                        "job {j}: a second result (worker {} at {} ms) from a copy that read the row at {} ms, after it was terminal at {} ms",
                        r.worker, r.at, r.checked, first_terminal
                    ),
                ));
            }
        }
        let first = rs[0];
        let expect_ok = matches!(spec.kind, Kind::Ok | Kind::FailsThenOk(_));
        if first.ok != expect_ok && first.class != Some(FailureClass::Poison) {
            out.push(v(
                "wrong_result",
                format!(
                    "job {j} ({:?}) ended {} ({:?})",
                    spec.kind,
                    if first.ok { "succeeded" } else { "failed" },
                    first.class
                ),
            ));
        }
    }
}

/// Runs that overlapped within the check's read-then-mark window (see `leases`).
pub fn overlaps_in_window(t: &Trace) -> usize {
    t.overlaps.iter().filter(|o| o.checked <= o.marked).count()
}

/// Duplicates within the documented window.
pub fn duplicates_in_window(t: &Trace) -> usize {
    let results = by_job(t.results.iter().map(|r| (r.job, r)));
    results
        .iter()
        .map(|(j, rs)| {
            let first_terminal = t.terminal_at.get(j).copied().unwrap_or(Millis::MAX);
            rs.iter().skip(1).filter(|r| r.checked < first_terminal).count()
        })
        .sum()
}

/// No two workers run one job beyond the lease: a run starts while another runs only if
/// the other's last heartbeat is at least the lease old, less twice the clock skew (the
/// two workers read the heartbeat on different clocks), or if its copy read the job's row
/// before the other's running mark was written (the check reads, then marks: two copies
/// reading within that window both run, as in the real route, whose mark comes after a
/// 250 ms grace; those are counted, `overlaps_in_window`).
fn leases(shape: &Shape, t: &Trace, out: &mut Vec<Violation>) {
    let allowed = LEASE_MS - 2 * shape.max_skew;
    for o in t.overlaps.iter().filter(|o| o.checked > o.marked) {
        if o.at - o.last_hb < allowed {
            out.push(v(
                "two_runs",
                format!(
                    "job {}: worker {} started it at {} ms (its copy read the row at {} ms) while worker {} ran it, marked running at {} ms, last heartbeat at {} ms ({} ms < lease {LEASE_MS} - 2 x skew {})",
                    o.job, o.second, o.at, o.checked, o.first, o.marked, o.last_hb,
                    o.at - o.last_hb,
                    shape.max_skew
                ),
            ));
        }
    }
    for &(job, at, last_hb, from, by) in &t.takeovers {
        if at - last_hb < allowed {
            out.push(v(
                "two_runs",
                format!("job {job}: worker {by} took it over from worker {from} at {at} ms, heartbeat at {last_hb} ms"),
            ));
        }
    }
}

/// A worker crash never uses an attempt: the attempts a result or dead letter reports
/// are at most the handler failures seen (plus the successful run).
fn attempts(t: &Trace, out: &mut Vec<Violation>) {
    let mut failed: HashMap<u32, i32> = HashMap::new();
    for r in &t.runs {
        if r.outcome == Outcome::Failed {
            *failed.entry(r.job).or_default() += 1;
        }
    }
    for r in &t.results {
        let f = failed.get(&r.job).copied().unwrap_or(0);
        let allowed = if r.ok { f + 1 } else { f };
        if r.attempts > allowed {
            out.push(v(
                "attempt_by_crash",
                format!("job {}: result reports {} attempts, but its handler failed {f} times", r.job, r.attempts),
            ));
        }
    }
    for d in &t.dlq {
        let f = failed.get(&d.job).copied().unwrap_or(0);
        if d.attempts > f {
            out.push(v(
                "attempt_by_crash",
                format!("job {}: dead letter reports {} attempts, but its handler failed {f} times", d.job, d.attempts),
            ));
        }
    }
}

/// Dead letters carry the class of the failure (and a reason naming it): `permanent` for
/// permanent failures, `app_error` once the attempts ran out, `poison` only after the crash
/// limit's take-overs.
fn dead_letters(shape: &Shape, t: &Trace, out: &mut Vec<Violation>) {
    let max_crashes = sim_policy().worker_crash.max_crashes as usize;
    let mut takeovers: HashMap<u32, usize> = HashMap::new();
    for &(job, ..) in &t.takeovers {
        *takeovers.entry(job).or_default() += 1;
    }
    for d in &t.dlq {
        let kind = shape.jobs[d.job as usize].kind;
        let expected = match kind {
            Kind::Permanent => Some(FailureClass::Permanent),
            Kind::AlwaysFails => Some(FailureClass::AppError),
            _ => None,
        };
        let crashed_enough = takeovers.get(&d.job).copied().unwrap_or(0) >= max_crashes;
        let ok = d.class == d.reason_class
            && (expected == Some(d.class) || (d.class == FailureClass::Poison && crashed_enough));
        if !ok {
            out.push(v(
                "dlq_reason",
                format!(
                    "job {} ({kind:?}) dead-lettered as {:?} after {} take-overs (crash limit {max_crashes})",
                    d.job,
                    d.class,
                    takeovers.get(&d.job).copied().unwrap_or(0)
                ),
            ));
        }
    }
    for (job, class, reason) in &t.reasons {
        if !reason.starts_with(class.as_str()) {
            out.push(v("dlq_reason", format!("job {job}: reason for {class:?} does not name it: {reason}")));
        }
    }
}

/// A quiet tenant's job waits for a slot at most its bound (`World::quiet_bound`).
fn fairness(t: &Trace, out: &mut Vec<Violation>) {
    for q in &t.quiet {
        if q.wait > q.bound {
            out.push(v(
                "fairness",
                format!("quiet job {} waited {} ms on worker {} (bound {} ms)", q.job, q.wait, q.worker, q.bound),
            ));
        }
    }
}

/// What one tenant's results on the topic add up to, and what it should be billed for.
#[derive(Debug, Default, PartialEq)]
struct Billed {
    results: i64,
    succeeded: i64,
    failed: i64,
    attempts: i64,
}

/// The usage counted once: per tenant, the ledger's totals (`sim::ledger`, read back from
/// its rows after leader restarts and store outages) equal its results on the topic, one
/// per accepted job that has a result plus the duplicates within the documented window.
fn usage(shape: &Shape, t: &Trace, ledger: &Tally, out: &mut Vec<Violation>) {
    let tenant_of = |j: u32| super::world::tenant_name(shape.jobs[j as usize].tenant);
    let mut on_topic: BTreeMap<String, Billed> = BTreeMap::new();
    for r in &t.results {
        let b = on_topic.entry(tenant_of(r.job)).or_default();
        b.results += 1;
        b.succeeded += i64::from(r.ok);
        b.failed += i64::from(!r.ok);
        b.attempts += i64::from(r.attempts.max(0));
    }
    let mut owed: BTreeMap<String, i64> = BTreeMap::new();
    for (j, rs) in by_job(t.results.iter().map(|r| (r.job, r))) {
        let first_terminal = t.terminal_at.get(&j).copied().unwrap_or(Millis::MAX);
        let in_window = rs.iter().skip(1).filter(|r| r.checked < first_terminal).count() as i64;
        *owed.entry(tenant_of(j)).or_default() += 1 + in_window;
    }
    for (tenant, topic) in &on_topic {
        let counted = ledger.by_tenant.get(tenant).copied().unwrap_or_default();
        let got = Billed {
            results: counted.results,
            succeeded: counted.succeeded,
            failed: counted.failed,
            attempts: counted.attempts,
        };
        if &got != topic {
            out.push(v(
                "usage",
                format!("tenant {tenant}: the ledger counted {got:?}, its results on the topic are {topic:?}"),
            ));
        }
        let owed = owed.get(tenant).copied().unwrap_or(0);
        if counted.results != owed {
            out.push(v(
                "usage",
                format!("tenant {tenant}: billed {} results for {owed} (its jobs with a result and their duplicates within the window)", counted.results),
            ));
        }
    }
    for tenant in ledger.by_tenant.keys().filter(|t| !on_topic.contains_key(*t)) {
        out.push(v("usage", format!("tenant {tenant}: the ledger counted results it has none of on the topic")));
    }
}
