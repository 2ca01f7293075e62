//! The operator console's pure parts (the HTTP shell is `api::console`): the outcome
//! window behind the overview's throughput and failure rate, what one caller may see of
//! the fleet's state (an admin everything, a tenant key its own tenant only), and the
//! job search over recently seen events. No I/O; `now` is an argument.

use crate::core::fleet::{FleetStats, TenantSummary};
use crate::model::{EventKind, JobEvent, Millis};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};

/// Throughput is measured over this window (jobs finished per second).
pub const THROUGHPUT_WINDOW_MS: i64 = 10_000;
/// The failure rate is measured over this window.
pub const FAILURE_WINDOW_MS: i64 = 60_000;
/// Most outcomes kept (bounded memory under any load; the oldest go first).
pub const MAX_OUTCOMES: usize = 200_000;

/// One finished attempt: its pool, tenant, and whether it succeeded.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    at: Millis,
    pool: String,
    tenant: String,
    ok: bool,
}

/// Attempts finished recently, from the job events (succeeded: ok; retrying or failed: a
/// failed attempt). Other events are not attempts' ends and are ignored.
#[derive(Debug, Default, Clone)]
pub struct Outcomes {
    recent: VecDeque<Outcome>,
}

/// Per pool rates of one view.
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize)]
pub struct Rates {
    /// Attempts finished per second over [`THROUGHPUT_WINDOW_MS`].
    pub finished_per_sec: f64,
    /// Over [`FAILURE_WINDOW_MS`]: attempts finished and, of those, failed.
    pub finished: u64,
    pub failed: u64,
    /// `failed / finished`, 0 when nothing finished.
    pub failure_rate: f64,
}

impl Outcomes {
    /// Records `e` (of a job type of `pool`) if it ends an attempt; drops what is older
    /// than the windows.
    pub fn record(&mut self, e: &JobEvent, pool: &str, now: Millis) {
        let ok = match e.kind {
            EventKind::Succeeded => true,
            EventKind::Retrying | EventKind::Failed => false,
            _ => return,
        };
        self.recent.push_back(Outcome { at: e.at, pool: pool.to_string(), tenant: e.tenant.clone(), ok });
        if self.recent.len() > MAX_OUTCOMES {
            self.recent.pop_front();
        }
        self.evict(now);
    }

    /// Drops outcomes older than both windows.
    pub fn evict(&mut self, now: Millis) {
        let keep = THROUGHPUT_WINDOW_MS.max(FAILURE_WINDOW_MS);
        while self.recent.front().is_some_and(|o| now - o.at > keep) {
            self.recent.pop_front();
        }
    }

    /// Rates of `pool`, of one tenant's attempts (Some) or all (None).
    pub fn rates(&self, pool: &str, tenant: Option<&str>, now: Millis) -> Rates {
        let mut r = Rates::default();
        let mut fast = 0u64;
        for o in self.recent.iter().filter(|o| o.pool == pool && tenant.is_none_or(|t| t == o.tenant)) {
            if now - o.at <= FAILURE_WINDOW_MS {
                r.finished += 1;
                r.failed += u64::from(!o.ok);
            }
            if now - o.at <= THROUGHPUT_WINDOW_MS {
                fast += 1;
            }
        }
        r.finished_per_sec = fast as f64 * 1000.0 / THROUGHPUT_WINDOW_MS as f64;
        if r.finished > 0 {
            r.failure_rate = r.failed as f64 / r.finished as f64;
        }
        r
    }
}

/// One pool as one caller sees it on the overview.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PoolView {
    pub pool: String,
    pub workers: usize,
    pub slots: usize,
    pub running: usize,
    /// Queued jobs, in memory plus spilled, and of those spilled.
    pub backlog: usize,
    pub spilled: usize,
    pub oldest_wait_ms: Option<Millis>,
    pub rates: Rates,
    pub breakers_open: Vec<String>,
}

/// The overview of `fleet` for a caller bound to `tenant` (None: an admin, the whole
/// fleet). A tenant sees its own running jobs, backlog and outcomes in each pool, with
/// the pool's size and open breakers (job types, not tenants' data).
pub fn overview(fleet: &FleetStats, outcomes: &Outcomes, tenant: Option<&str>, now: Millis) -> Vec<PoolView> {
    fleet
        .pools
        .iter()
        .map(|p| {
            let mut v = PoolView {
                pool: p.pool.clone(),
                workers: p.workers,
                slots: p.slots,
                rates: outcomes.rates(&p.pool, tenant, now),
                breakers_open: p.breakers_open.clone(),
                ..Default::default()
            };
            let rows = fleet.tenants.iter().filter(|t| t.pool == p.pool && tenant.is_none_or(|n| n == t.tenant));
            match tenant {
                None => {
                    v.running = p.running;
                    v.backlog = p.queued;
                    v.spilled = p.spilled;
                    v.oldest_wait_ms = rows.filter_map(|t| t.oldest_wait_ms).max();
                }
                Some(_) => {
                    for t in rows {
                        v.running += t.running;
                        v.backlog += t.backlog.total;
                        v.spilled += t.backlog.spilled;
                        v.oldest_wait_ms = v.oldest_wait_ms.max(t.oldest_wait_ms);
                    }
                }
            }
            v
        })
        .collect()
}

/// The per-pool summaries of the tenants `tenant` may see (None: all), by tenant name.
pub fn tenant_rows<'a>(fleet: &'a FleetStats, tenant: Option<&str>) -> BTreeMap<&'a str, Vec<&'a TenantSummary>> {
    let mut out: BTreeMap<&str, Vec<&TenantSummary>> = BTreeMap::new();
    for t in fleet.tenants.iter().filter(|t| tenant.is_none_or(|n| n == t.tenant)) {
        out.entry(t.tenant.as_str()).or_default().push(t);
    }
    out
}

/// What the job search asks for; unset criteria match everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobQuery {
    pub tenant: Option<String>,
    pub job_type: Option<String>,
    /// The kind of the job's latest event (`succeeded`, `started`, `retrying`, ...).
    pub state: Option<String>,
    /// The job's latest event at or after this time.
    pub since: Option<Millis>,
}

/// A job found by [`search`]: its latest event, and when it was first seen.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobHit {
    pub job_id: String,
    pub tenant: String,
    pub job_type: String,
    pub state: &'static str,
    pub first_at: Millis,
    pub last_at: Millis,
    pub attempt: i32,
    pub message: Option<String>,
    /// When the event that set `state` happened: events of one job come from several
    /// processes (an API's replay, a worker's run) and may arrive out of their order.
    #[serde(skip)]
    pub state_at: Millis,
}

/// The jobs of `events` (oldest first) that match `q`, newest activity first, at most `max`.
pub fn search<'a>(events: impl Iterator<Item = &'a JobEvent>, q: &JobQuery, max: usize) -> Vec<JobHit> {
    let mut jobs: BTreeMap<&str, JobHit> = BTreeMap::new();
    for e in events {
        if q.tenant.as_ref().is_some_and(|t| *t != e.tenant) || q.job_type.as_ref().is_some_and(|t| *t != e.job_type) {
            continue;
        }
        let hit = jobs.entry(e.job_id.as_str()).or_insert_with(|| JobHit {
            job_id: e.job_id.clone(),
            tenant: e.tenant.clone(),
            job_type: e.job_type.clone(),
            state: e.kind.as_str(),
            first_at: e.at,
            last_at: e.at,
            attempt: e.attempt,
            message: None,
            state_at: e.at,
        });
        // Progress and webhook events do not change what state the job is in; an event
        // older than the one the state came from does not either.
        if e.at >= hit.state_at
            && !matches!(
                e.kind,
                EventKind::Progress
                    | EventKind::WebhookDelivered
                    | EventKind::WebhookFailed
                    | EventKind::PoolReclassified
                    | EventKind::DependencyCircuitOpen
                    | EventKind::DependencyCircuitClosed
            )
        {
            hit.state = e.kind.as_str();
            hit.message = e.message.clone();
            hit.state_at = e.at;
        }
        hit.first_at = hit.first_at.min(e.at);
        hit.last_at = hit.last_at.max(e.at);
        hit.attempt = hit.attempt.max(e.attempt);
    }
    let mut hits: Vec<JobHit> = jobs
        .into_values()
        .filter(|h| q.state.as_ref().is_none_or(|s| s == h.state))
        .filter(|h| q.since.is_none_or(|s| h.last_at >= s))
        .collect();
    hits.sort_by(|a, b| b.last_at.cmp(&a.last_at).then_with(|| a.job_id.cmp(&b.job_id)));
    hits.truncate(max);
    hits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fleet::{BacklogSum, PoolSummary};

    fn ev(job: &str, tenant: &str, kind: EventKind, at: Millis) -> JobEvent {
        JobEvent {
            event_id: format!("{job}-{at}"),
            job_id: job.into(),
            tenant: tenant.into(),
            job_type: "echo".into(),
            kind,
            at,
            attempt: 0,
            worker: None,
            progress: None,
            message: None,
            next_attempt_at: None,
        }
    }

    #[test]
    fn rates_count_attempt_ends_in_their_windows_per_tenant() {
        let mut o = Outcomes::default();
        let now = 100_000;
        o.record(&ev("a", "acme", EventKind::Succeeded, now - 1_000), "short", now);
        o.record(&ev("b", "acme", EventKind::Retrying, now - 2_000), "short", now);
        o.record(&ev("c", "globex", EventKind::Failed, now - 30_000), "short", now);
        o.record(&ev("d", "acme", EventKind::Started, now), "short", now);
        o.record(&ev("e", "acme", EventKind::Succeeded, now - 500), "long", now);
        let all = o.rates("short", None, now);
        assert_eq!((all.finished, all.failed), (3, 2));
        assert!((all.finished_per_sec - 0.2).abs() < 1e-9, "{all:?}");
        let acme = o.rates("short", Some("acme"), now);
        assert_eq!((acme.finished, acme.failed), (2, 1));
        assert!((acme.failure_rate - 0.5).abs() < 1e-9);
        // A minute later everything left the windows.
        o.evict(now + FAILURE_WINDOW_MS + 1);
        assert_eq!(o.rates("short", None, now + FAILURE_WINDOW_MS + 1), Rates::default());
    }

    fn fleet() -> FleetStats {
        let t = |tenant: &str, running, total, spilled, oldest| TenantSummary {
            pool: "short".into(),
            tenant: tenant.into(),
            running,
            backlog: BacklogSum { total, spilled, ..Default::default() },
            oldest_wait_ms: oldest,
            ..Default::default()
        };
        FleetStats {
            pools: vec![PoolSummary {
                pool: "short".into(),
                workers: 2,
                slots: 8,
                running: 5,
                queued: 40,
                spilled: 30,
                breakers_open: vec!["pay".into()],
                ..Default::default()
            }],
            tenants: vec![t("acme", 2, 10, 0, Some(500)), t("globex", 3, 30, 30, Some(9_000))],
            ..Default::default()
        }
    }

    #[test]
    fn a_tenant_sees_only_its_own_share_of_a_pool() {
        let f = fleet();
        let o = Outcomes::default();
        let admin = overview(&f, &o, None, 0);
        assert_eq!((admin[0].running, admin[0].backlog, admin[0].spilled), (5, 40, 30));
        assert_eq!(admin[0].oldest_wait_ms, Some(9_000));
        let acme = overview(&f, &o, Some("acme"), 0);
        assert_eq!((acme[0].running, acme[0].backlog, acme[0].spilled), (2, 10, 0));
        assert_eq!(acme[0].oldest_wait_ms, Some(500));
        assert_eq!(acme[0].breakers_open, vec!["pay".to_string()]);
        assert_eq!(tenant_rows(&f, Some("acme")).keys().copied().collect::<Vec<_>>(), vec!["acme"]);
        assert_eq!(tenant_rows(&f, None).len(), 2);
    }

    #[test]
    fn search_reports_each_jobs_latest_state_newest_first() {
        let events = [
            ev("j1", "acme", EventKind::Queued, 1),
            ev("j2", "globex", EventKind::Queued, 2),
            ev("j1", "acme", EventKind::Started, 3),
            ev("j1", "acme", EventKind::Progress, 4),
            ev("j2", "globex", EventKind::Succeeded, 5),
        ];
        let all = search(events.iter(), &JobQuery::default(), 10);
        assert_eq!(
            all.iter().map(|h| (h.job_id.as_str(), h.state)).collect::<Vec<_>>(),
            [("j2", "succeeded"), ("j1", "started")]
        );
        let q = JobQuery { tenant: Some("acme".into()), ..Default::default() };
        assert_eq!(search(events.iter(), &q, 10).len(), 1);
        let q = JobQuery { state: Some("succeeded".into()), ..Default::default() };
        assert_eq!(search(events.iter(), &q, 10)[0].job_id, "j2");
        let q = JobQuery { since: Some(5), ..Default::default() };
        assert_eq!(search(events.iter(), &q, 10).len(), 1);
        assert_eq!(search(events.iter(), &JobQuery::default(), 1).len(), 1);
    }

    #[test]
    fn an_event_arriving_after_a_newer_one_does_not_set_the_state() {
        // An API's replayed event reaches the events topic after the worker's run of it.
        let events = [
            ev("j1", "acme", EventKind::DeadLettered, 1),
            ev("j1", "acme", EventKind::Started, 3),
            ev("j1", "acme", EventKind::Succeeded, 4),
            ev("j1", "acme", EventKind::Replayed, 2),
        ];
        let hit = &search(events.iter(), &JobQuery::default(), 10)[0];
        assert_eq!((hit.state, hit.first_at, hit.last_at), ("succeeded", 1, 4));
    }
}
