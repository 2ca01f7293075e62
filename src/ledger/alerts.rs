//! Tenant alerts, evaluated by the ledger's leader (it reads every result already): each
//! result feeds `core::alerts::Evaluator`; every `alerts.period` the tracked tenants' rules
//! step with their settings (`[alerts]`, by the tier in the tenants registry), and each
//! alert opened or resolved is stored (`store::alerts`) and then sent (`watch::alerts`).
//!
//! A new leader starts from the open rows: their alerts stay open (no second opening),
//! and events whose delivery had not finished are sent again (same delivery ids). Its
//! first period takes in the results no earlier leader read (past each partition's
//! recorded position), published up to `core::alerts::CATCH_UP_MS` before it started:
//! results published while the leader was starting or absent are not skipped.

use super::LedgerError;
use crate::config::Config;
use crate::core::alerts::{alert_id_named, Change, Evaluator, Rule, Transition};
use crate::core::refusals::{Class, HourTotals, LimitAlerts, LimitChange, HOUR_MS};
use crate::core::scheduler::Tier;
use crate::model::{JobResult, Millis};
use crate::store::{AlertRow, AlertStatements, RefusalStatements, Store, TenantStatements};
use crate::watch::alerts::{Kind, Sender};
use crate::{metrics as m, now_ms};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;

/// How long the tenants' tiers read from the registry are used before reading them again.
const TIERS_EVERY_MS: Millis = 60_000;

pub(super) struct Alerting {
    cfg: Arc<Config>,
    stmts: AlertStatements,
    registry: TenantStatements,
    tiers: HashMap<String, Tier>,
    tiers_read_at: Option<Millis>,
    eval: Evaluator,
    sender: Arc<Sender>,
    untracked_warned: u64,
    /// Limit alerts from the refusal counts (`core::refusals`).
    limits: LimitAlerts,
    refusals: RefusalStatements,
    /// Openings delivered per tenant this hour (`alerts.max_deliveries_per_hour`).
    delivered: HashMap<String, (Millis, u32)>,
    /// Alerts whose opening was not delivered (over budget): their resolution is not either.
    unsent: std::collections::HashSet<String>,
    /// The last past hour read once it had settled ([`LATE_MS`] into the next one): it is
    /// not read again.
    settled_read: Option<Millis>,
}

/// How long into an hour the hour before may still gain counts (a process writes its
/// cells every 5 s and retries a failed write with the next pass). After it the leader
/// reads that hour once more and then no longer: a count written later than this (a
/// process cut from the store for minutes) opens no alert; it still shows on the page.
pub const LATE_MS: Millis = 300_000;

/// Most refusal rows read per hour and period (past it the rest are not seen, warned);
/// of those, each class of tenants keeps at most its `Class::max_rows`.
pub const MAX_REFUSAL_SCAN: usize = 1_000_000;
impl Alerting {
    /// Loads the open alerts into a new evaluator and re-sends unfinished deliveries.
    pub(super) async fn start(
        cfg: &Arc<Config>,
        store: &Store,
        stop: watch::Receiver<bool>,
    ) -> Result<Alerting, LedgerError> {
        let stmts = store.alert_statements().await?;
        let sender = Sender::new(cfg.clone(), stmts.clone(), stop)
            .map_err(|e| LedgerError::Alerts(format!("cannot build the alerts' HTTP client: {e}")))?;
        let started = now_ms() - crate::core::alerts::CATCH_UP_MS;
        let mut eval = Evaluator::with_baseline(cfg.alerts.max_tenants, started, cfg.alerts.baseline.0);
        let mut limits = LimitAlerts::new(cfg.alerts.max_tenants);
        for open in stmts.open().await? {
            let a = open.alert;
            if a.resolved_at.is_none() {
                if let Some(rule) = Rule::parse(&a.rule) {
                    eval.restore(&a.tenant, rule, a.opened_at);
                } else if let Some(code) = crate::core::refusals::limit_code(&a.rule) {
                    limits.restore(&a.tenant, code, a.opened_at);
                }
            }
            if !open.opened_sent {
                sender.send(a.clone(), Kind::Opened);
            }
            if a.resolved_at.is_some() {
                sender.send(a, Kind::Resolved);
            }
        }
        let registry = store.tenant_statements().await?;
        let refusals = store.refusal_statements().await?;
        let (tiers, tiers_read_at) = (HashMap::new(), None);
        Ok(Alerting {
            cfg: cfg.clone(),
            stmts,
            registry,
            tiers,
            tiers_read_at,
            eval,
            sender,
            untracked_warned: 0,
            limits,
            refusals,
            delivered: HashMap::new(),
            unsent: Default::default(),
            settled_read: None,
        })
    }

    pub(super) fn observe(&mut self, r: &JobResult, published_at: Millis) {
        self.eval.observe(r, published_at);
    }

    /// Ends a period: stores and sends each change.
    pub(super) async fn evaluate(&mut self, now: Millis) {
        self.read_tiers(now).await;
        if self.eval.untracked > self.untracked_warned {
            let n = self.eval.untracked - self.untracked_warned;
            metrics::counter!(m::ALERTS_UNTRACKED).increment(n);
            tracing::warn!(
                results = n,
                max_tenants = self.cfg.alerts.max_tenants,
                "alerts: results of tenants past alerts.max_tenants were not evaluated; raise it"
            );
            self.untracked_warned = self.eval.untracked;
        }
        let (cfg, tiers) = (&self.cfg, &self.tiers);
        let default_tier = cfg.registry.default_tier;
        let changes =
            self.eval.evaluate(now, |t| cfg.alerts.settings(t, tiers.get(t).copied().unwrap_or(default_tier)));
        for c in changes {
            let (row, kind) = row_of(&c);
            self.record(row, kind).await;
        }
        self.evaluate_limits(now).await;
    }

    /// Limit alerts: reads the refusal counts of this hour and of the one before (until it
    /// has been read once after [`LATE_MS`]), and opens or resolves one alert per (tenant,
    /// code) (`core::refusals::LimitAlerts`; an hour not read again counts no growth).
    async fn evaluate_limits(&mut self, now: Millis) {
        let current = now - now.rem_euclid(HOUR_MS);
        let previous = current - HOUR_MS;
        let settled = now - current >= LATE_MS;
        let mut hours = Vec::new();
        for hour in [previous, current] {
            if hour == previous && settled && self.settled_read == Some(previous) {
                continue;
            }
            let tiers = &self.tiers;
            let class_of = |t: &str| Class::of(tiers.get(t).copied());
            let read = match self.refusals.hour(hour, MAX_REFUSAL_SCAN, class_of).await {
                Ok(read) => read,
                Err(e) => {
                    tracing::warn!(error = %e, "alerts: cannot read the refusal counts; limit alerts wait for the next period");
                    return;
                }
            };
            if read.cut || read.dropped != [0, 0] {
                tracing::warn!(
                    cut = read.cut,
                    free_dropped = read.dropped[0],
                    paying_dropped = read.dropped[1],
                    "alerts: an hour holds more refusal rows than are read or kept; limit alerts judge those kept"
                );
            }
            let cells = read.cells;
            let mut totals: HourTotals = HashMap::new();
            for c in cells {
                let t = totals.entry((c.tenant, c.code)).or_default();
                *t = t.saturating_add(c.n.max(0));
            }
            hours.push((hour, totals));
        }
        if settled {
            self.settled_read = Some(previous);
        }
        let for_periods = self.cfg.alerts.limit_clear_periods;
        let tiers = &self.tiers;
        for change in self.limits.step(&hours, for_periods, now, |t| Class::of(tiers.get(t).copied())) {
            let (tenant, code, opened_at, resolved_at, value) = match change {
                LimitChange::Opened { tenant, code, opened_at, count } => (tenant, code, opened_at, None, count as f64),
                LimitChange::Resolved { tenant, code, opened_at, resolved_at } => {
                    (tenant, code, opened_at, Some(resolved_at), 0.0)
                }
            };
            let rule = crate::core::refusals::limit_rule(&code);
            let threshold = match crate::core::refusals::parse(&code) {
                Some((crate::core::refusals::Mark::Near, ..)) => crate::core::refusals::NEAR_SHARE,
                _ => 1.0,
            };
            let alert_id = alert_id_named(&tenant, &rule, opened_at);
            let row = AlertRow { tenant, alert_id, rule, opened_at, resolved_at, value, threshold };
            self.record(row, if resolved_at.is_some() { Kind::Resolved } else { Kind::Opened }).await;
        }
    }

    /// Stores an alert's opening or resolution and sends it: the rules' changes and the
    /// alerts raised elsewhere on the leader (a dependency's breaker, `super::dependencies`).
    ///
    /// A tenant's openings are delivered at most `alerts.max_deliveries_per_hour` times an
    /// hour (each is stored and shown all the same); an opening not delivered has its
    /// resolution not delivered either.
    pub(super) async fn record(&mut self, row: AlertRow, kind: Kind) {
        let ttl = (self.cfg.alerts.retention.0 / 1000).clamp(3600, i32::MAX as i64) as i32;
        let stored = match kind {
            Kind::Opened => self.stmts.opened(&row, ttl).await,
            Kind::Resolved => self.stmts.resolved(&row, ttl).await,
        };
        metrics::counter!(m::ALERT_CHANGES, "kind" => kind.as_str()).increment(1);
        let deliver = match kind {
            Kind::Opened => self.within_budget(&row.tenant, row.opened_at),
            Kind::Resolved => !self.unsent.remove(&row.alert_id),
        };
        if !deliver && kind == Kind::Opened {
            self.unsent.insert(row.alert_id.clone());
        }
        match stored {
            Ok(()) if !deliver => self.sender.skip(row, kind),
            Ok(()) => self.sender.send(row, kind),
            Err(e) => {
                tracing::warn!(error = %e, tenant = %row.tenant, alert_id = %row.alert_id, "alerts: cannot store an alert's {}; not sent", kind.as_str())
            }
        }
    }

    /// Takes one of the tenant's deliveries of `now`'s hour, if any is left.
    fn within_budget(&mut self, tenant: &str, now: Millis) -> bool {
        let hour = now - now.rem_euclid(HOUR_MS);
        if self.delivered.len() >= self.cfg.alerts.max_tenants {
            self.delivered.retain(|_, (h, _)| *h >= hour);
        }
        let e = self.delivered.entry(tenant.to_string()).or_insert((hour, 0));
        if e.0 != hour {
            *e = (hour, 0);
        }
        if e.1 >= self.cfg.alerts.max_deliveries_per_hour {
            tracing::warn!(
                tenant,
                max = self.cfg.alerts.max_deliveries_per_hour,
                "alerts: the tenant's alert deliveries of this hour are used up; this one is stored, not sent"
            );
            return false;
        }
        e.1 += 1;
        true
    }

    async fn read_tiers(&mut self, now: Millis) {
        if self.tiers_read_at.is_some_and(|at| now - at < TIERS_EVERY_MS) {
            return;
        }
        match self.registry.list().await {
            Ok(list) => {
                self.tiers = list.into_iter().map(|(name, t)| (name, t.tier)).collect();
                self.tiers_read_at = Some(now);
            }
            Err(e) => {
                tracing::warn!(error = %e, "alerts: cannot read the tenants registry; using the tiers read before")
            }
        }
    }
}

fn row_of(c: &Change) -> (AlertRow, Kind) {
    let (opened_at, resolved_at, kind) = match c.transition {
        Transition::Opened { opened_at } => (opened_at, None, Kind::Opened),
        Transition::Resolved { opened_at, resolved_at } => (opened_at, Some(resolved_at), Kind::Resolved),
    };
    let row = AlertRow {
        tenant: c.tenant.clone(),
        alert_id: c.alert_id.clone(),
        rule: c.rule.as_str().to_string(),
        opened_at,
        resolved_at,
        value: c.value,
        threshold: c.threshold,
    };
    (row, kind)
}
