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
use crate::core::alerts::{Change, Evaluator, Rule, Transition};
use crate::core::scheduler::Tier;
use crate::model::{JobResult, Millis};
use crate::store::{AlertRow, AlertStatements, Store, TenantStatements};
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
}

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
        let mut eval = Evaluator::new(cfg.alerts.max_tenants, now_ms() - crate::core::alerts::CATCH_UP_MS);
        for open in stmts.open().await? {
            let a = open.alert;
            if a.resolved_at.is_none() {
                if let Some(rule) = Rule::parse(&a.rule) {
                    eval.restore(&a.tenant, rule, a.opened_at);
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
        let (tiers, tiers_read_at) = (HashMap::new(), None);
        Ok(Alerting { cfg: cfg.clone(), stmts, registry, tiers, tiers_read_at, eval, sender, untracked_warned: 0 })
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
        let ttl = (cfg.alerts.retention.0 / 1000).clamp(3600, i32::MAX as i64) as i32;
        for c in changes {
            let (row, kind) = row_of(&c);
            let stored = match kind {
                Kind::Opened => self.stmts.opened(&row, ttl).await,
                Kind::Resolved => self.stmts.resolved(&row, ttl).await,
            };
            metrics::counter!(m::ALERT_CHANGES, "kind" => kind.as_str()).increment(1);
            match stored {
                Ok(()) => self.sender.send(row, kind),
                Err(e) => {
                    tracing::warn!(error = %e, tenant = %row.tenant, alert_id = %row.alert_id, "alerts: cannot store an alert's {}; not sent", kind.as_str())
                }
            }
        }
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
