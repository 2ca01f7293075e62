//! The fleet-wide dependency breakers, stepped by the ledger's leader (one process at a
//! time, so one opening is one event and one alert per affected tenant): every
//! [`STEP`] it reads the window's outcome cells every worker writes (settled buckets
//! once), sums them per dependency (`core::dependency::window_counts`), steps each
//! dependency's breaker and, when one changes, writes its row (`store::dependencies`:
//! what workers and API processes hold jobs by), publishes `dependency_circuit_open` /
//! `_closed` on the events topic, sets `fairway_dependency_circuit_open`, and opens or
//! resolves a `dependency_circuit:<name>` alert for each affected tenant (the tenants
//! with attempts of the dependent job types in the window, at most
//! `dependency_breaker.max_affected_tenants`, most attempts first).
//!
//! A new leader starts from the stored rows: an open breaker stays open (no second
//! opening) and its affected tenants' alerts resolve when it closes.

use crate::config::Config;
use crate::core::admission::breaker::BUCKET_MS;
use crate::core::alerts::alert_id_named;
use crate::core::dependency::{self as rules, Breaker, Change, State};
use crate::core::fleet::BucketReads;
use crate::kafka::Producer;
use crate::metrics as m;
use crate::model::Millis;
use crate::store::{AdmissionStatements, AlertRow, DependencyRow, DependencyStatements, OutcomeCell, Store};
use crate::watch::alerts::Kind;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::alerts::Alerting;
use super::LedgerError;

/// How often the breakers are stepped.
pub const STEP: Duration = Duration::from_secs(1);
/// A bucket is read until it is this old, then kept as read (late writes of a worker are
/// rare and small).
const SETTLE_MS: i64 = 5_000;

/// One dependency's breaker and the tenants told of its opening.
struct Tracked {
    breaker: Breaker,
    affected: Vec<String>,
    counted: (i64, i64),
}

pub(super) struct Dependencies {
    cfg: Arc<Config>,
    stmts: DependencyStatements,
    cells: AdmissionStatements,
    reads: BucketReads<OutcomeCell>,
    tracked: BTreeMap<String, Tracked>,
    producer: Producer,
}

impl Dependencies {
    /// None when no job type declares a dependency or the breaker is off.
    pub(super) async fn start(cfg: &Arc<Config>, store: &Store) -> Result<Option<Dependencies>, LedgerError> {
        let names: BTreeSet<&String> = cfg.job_types.values().flat_map(|jt| jt.dependencies.iter()).collect();
        if names.is_empty() || !cfg.dependency_breaker.enabled {
            return Ok(None);
        }
        let stmts = store.dependency_statements().await?;
        let stored: BTreeMap<String, DependencyRow> =
            stmts.all().await?.into_iter().map(|r| (r.dependency.clone(), r)).collect();
        let tracked = names
            .into_iter()
            .map(|d| {
                let t = match stored.get(d) {
                    Some(r) => Tracked {
                        breaker: Breaker { state: r.state },
                        affected: r.affected.clone(),
                        counted: (r.failed, r.attempts),
                    },
                    None => Tracked { breaker: Breaker::default(), affected: Vec::new(), counted: (0, 0) },
                };
                gauge(d, &t.breaker.state);
                (d.clone(), t)
            })
            .collect();
        let producer = crate::kafka::producer(cfg).map_err(|e| LedgerError::Kafka(e.to_string()))?;
        let reads = BucketReads::new(BUCKET_MS, cfg.dependency_breaker.window.0, SETTLE_MS);
        let cells = store.admission_statements().await?;
        Ok(Some(Dependencies { cfg: cfg.clone(), stmts, cells, reads, tracked, producer }))
    }

    /// Reads the window's cells and steps every breaker; a change is written, published
    /// and alerted. A failed read keeps every breaker as it is.
    pub(super) async fn step(&mut self, alerting: &mut Alerting, now: Millis) {
        for b in self.reads.wanted(now) {
            match self.cells.outcomes(b).await {
                Ok(cells) => self.reads.put(b, cells, now),
                Err(e) => {
                    metrics::counter!(m::DEPENDENCY_READ_FAILURES, "role" => "leader").increment(1);
                    tracing::warn!(error = %e, "dependency breakers: cannot read the outcome cells; stepping later");
                    return;
                }
            }
        }
        let cfg = &self.cfg;
        let since: BTreeMap<&str, Millis> =
            self.tracked.iter().map(|(d, t)| (d.as_str(), t.breaker.state.counting_since())).collect();
        let cells = self.reads.cells().map(|(bucket, c)| rules::Cell {
            bucket,
            job_type: &c.job_type,
            tenant: &c.tenant,
            attempts: c.ok.saturating_add(c.failed),
            dependency: c.dependency,
        });
        let sums = rules::window_counts(
            cells,
            |jt| cfg.dependencies_of(jt),
            now,
            cfg.dependency_breaker.window.0,
            |d| since.get(d).copied().unwrap_or(Millis::MAX),
        );
        let mut changed = Vec::new();
        for (d, t) in self.tracked.iter_mut() {
            let before = t.breaker.state;
            let sc = sums.get(d);
            let change = t.breaker.step(sc, &cfg.dependency_breaker, now);
            if let (Some(Change::Opened { .. }), Some(sc)) = (&change, sc) {
                t.affected = rules::affected_tenants(sc, cfg.dependency_breaker.max_affected_tenants);
            }
            if let Some(Change::Opened { counts, .. } | Change::Reopened { counts, .. }) = &change {
                t.counted = (counts.failed as i64, counts.total() as i64);
            }
            if before != t.breaker.state || change.is_some() {
                changed.push((d.clone(), change));
            }
        }
        for (d, change) in changed {
            self.apply(alerting, &d, change, now).await;
        }
    }

    /// Writes `d`'s row, then tells of the change (event, metrics, alerts).
    async fn apply(&self, alerting: &mut Alerting, d: &str, change: Option<Change>, now: Millis) {
        let Some(t) = self.tracked.get(d) else { return };
        let row = DependencyRow {
            dependency: d.to_string(),
            state: t.breaker.state,
            failed: t.counted.0,
            attempts: t.counted.1,
            affected: t.affected.clone(),
            changed_at: now,
        };
        if let Err(e) = self.stmts.put(&row).await {
            // Workers keep the last state they read; the next change writes the row again.
            tracing::warn!(dependency = d, error = %e, "dependency breaker: cannot write its state");
        }
        gauge(d, &t.breaker.state);
        let Some(change) = change else { return };
        let ratio = self.cfg.dependency_breaker.failure_ratio;
        let (kind, open, message, until) = match &change {
            Change::Opened { until, counts, failing, .. } => {
                let msg = format!(
                    "{} of {} attempts in the last {} failed with `dependency` across {} tenants (threshold {ratio}); \
                     its job types are held until {} ({}), then tried again",
                    counts.failed,
                    counts.total(),
                    self.cfg.dependency_breaker.window,
                    failing.len(),
                    http_date(*until),
                    iso(*until),
                );
                ("opened", true, msg, Some(*until))
            }
            Change::Reopened { until, .. } => ("reopened", true, String::new(), Some(*until)),
            Change::Closed { opened_at, .. } => {
                ("closed", false, format!("closed after {} s open or on trial", (now - opened_at) / 1000), None)
            }
        };
        metrics::counter!(m::DEPENDENCY_CIRCUIT_CHANGES, "dependency" => d.to_string(), "kind" => kind).increment(1);
        tracing::warn!(dependency = d, kind, affected = t.affected.len(), "{message}");
        if matches!(change, Change::Reopened { .. }) {
            return;
        }
        crate::watch::events::dependency_circuit(&self.producer, &self.cfg, d, open, message, until);
        let opened_at = match change {
            Change::Opened { opened_at, .. } | Change::Closed { opened_at, .. } => opened_at,
            Change::Reopened { .. } => return,
        };
        let rule = rules::alert_rule(d);
        let value = if t.counted.1 > 0 { t.counted.0 as f64 / t.counted.1 as f64 } else { 0.0 };
        for tenant in &t.affected {
            let a = AlertRow {
                tenant: tenant.clone(),
                alert_id: alert_id_named(tenant, &rule, opened_at),
                rule: rule.clone(),
                opened_at,
                resolved_at: (!open).then_some(now),
                value,
                threshold: ratio,
            };
            alerting.record(a, if open { Kind::Opened } else { Kind::Resolved }).await;
        }
    }
}

fn gauge(d: &str, s: &State) {
    let open = matches!(s, State::Open { .. });
    metrics::gauge!(m::DEPENDENCY_CIRCUIT_OPEN, "dependency" => d.to_string()).set(if open { 1.0 } else { 0.0 });
}

/// `at` as an HTTP-date (RFC 9110: `Tue, 01 Dec 2026 12:00:00 GMT`), the form of a
/// `Retry-After` date.
pub fn http_date(at: Millis) -> String {
    httpdate::fmt_http_date(std::time::UNIX_EPOCH + Duration::from_millis(at.max(0) as u64))
}

fn iso(at: Millis) -> String {
    chrono::DateTime::from_timestamp_millis(at).map(|t| t.to_rfc3339()).unwrap_or_default()
}
