//! Tenant alerts' delivery, the I/O shell: each `alert.opened` / `alert.resolved` event is
//! POSTed to the tenant's `alerts.tenants.<name>.webhook_url`, signed like job webhooks
//! (`core::webhooks::signature` with `webhooks.secrets.<tenant>`), with
//! `Fairway-Delivery: <alert id>.opened|resolved` (the same on every attempt and copy:
//! receivers drop repeats by it), retried with the webhooks' backoff
//! (`webhooks.max_attempts`). Each (tenant, URL) pair has its own lane
//! (`core::receivers`, bounds from `[webhooks]`), delivering one event at a time in order
//! (an alert's opening before its resolution): a dead receiver holds only its own lane.
//! When a delivery ends (delivered, refused, out of attempts) the open row says so, so a
//! new ledger leader re-sends only what was not finished.

use crate::config::{Config, Secret};
use crate::core::receivers::{lane, Admit, LaneKey, Lanes};
use crate::core::webhooks::{self as hooks, Verdict};
use crate::store::{AlertRow, AlertStatements};
use crate::{metrics as m, now_ms};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{watch, Semaphore};

/// Which event of an alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Opened,
    Resolved,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Opened => "opened",
            Kind::Resolved => "resolved",
        }
    }
}

/// The JSON body POSTed for an alert event.
pub fn body(a: &AlertRow, kind: Kind) -> Vec<u8> {
    let v = serde_json::json!({
        "type": format!("alert.{}", kind.as_str()),
        "delivery_id": delivery_id(a, kind),
        "alert_id": a.alert_id,
        "tenant": a.tenant,
        "rule": a.rule,
        "opened_at": a.opened_at,
        "resolved_at": a.resolved_at,
        "value": a.value,
        "threshold": a.threshold,
    });
    serde_json::to_vec(&v).expect("a JSON value serializes")
}

fn delivery_id(a: &AlertRow, kind: Kind) -> String {
    format!("{}.{}", a.alert_id, kind.as_str())
}

/// Delivers alert events in per-receiver lanes (one `Sender` per ledger leadership).
pub struct Sender {
    cfg: Arc<Config>,
    http: reqwest::Client,
    stmts: AlertStatements,
    lanes: Mutex<(Lanes, HashMap<LaneKey, Arc<Semaphore>>)>,
    posts: Semaphore,
    stop: watch::Receiver<bool>,
}

impl Sender {
    pub fn new(cfg: Arc<Config>, stmts: AlertStatements, stop: watch::Receiver<bool>) -> reqwest::Result<Arc<Self>> {
        let http = crate::watch::webhooks::http_client(&cfg)?;
        let lanes = Mutex::new((Lanes::new(cfg.webhooks.lanes()), HashMap::new()));
        let posts = Semaphore::new(cfg.webhooks.concurrency);
        Ok(Arc::new(Sender { cfg, http, stmts, lanes, posts, stop }))
    }

    /// Queues `a`'s `kind` event for the tenant's webhook (none: the delivery is finished
    /// at once). A full lane gives the event up with a warning; the open row keeps it
    /// unsent, so the next leader tries it again.
    pub fn send(self: &Arc<Self>, a: AlertRow, kind: Kind) {
        let Some(url) = self.cfg.alerts.tenants.get(&a.tenant).and_then(|o| o.webhook_url.clone()) else {
            let me = self.clone();
            tokio::spawn(async move { me.finished(&a, kind).await });
            return;
        };
        let key = lane(&a.tenant, &url);
        let slot = {
            let mut g = self.lanes.lock().expect("lanes lock");
            if g.0.admit(&key) == Admit::ReceiverFull {
                tracing::warn!(tenant = %a.tenant, alert_id = %a.alert_id, "alert event not sent now: its receiver's lane is full (webhooks.queue_per_receiver); the next ledger leader sends it again");
                metrics::counter!(m::ALERT_DELIVERIES, "result" => "not_sent").increment(1);
                return;
            }
            g.1.entry(key.clone()).or_insert_with(|| Arc::new(Semaphore::new(1))).clone()
        };
        let me = self.clone();
        tokio::spawn(async move {
            let mut stop = me.stop.clone();
            let one = tokio::select! {
                _ = stop.wait_for(|s| *s) => None,
                one = slot.acquire() => one.ok(),
            };
            let done = match one {
                Some(_one) => me.deliver(&a, kind, &url).await,
                None => false,
            };
            if done {
                me.finished(&a, kind).await;
            }
            let mut g = me.lanes.lock().expect("lanes lock");
            g.0.done(&key);
            if g.0.pending(&key) == 0 {
                g.1.remove(&key);
            }
        });
    }

    /// Finishes `kind` of `a` without delivering it (the tenant's deliveries of the hour
    /// are used up: the alert is stored and shown, not sent).
    pub fn skip(self: &Arc<Self>, a: AlertRow, kind: Kind) {
        metrics::counter!(m::ALERT_DELIVERIES, "result" => "over_budget").increment(1);
        let me = self.clone();
        tokio::spawn(async move { me.finished(&a, kind).await });
    }

    /// Records that `kind` of `a` needs no more attempts.
    async fn finished(&self, a: &AlertRow, kind: Kind) {
        let r = match kind {
            Kind::Opened => self.stmts.opened_sent(&a.tenant, &a.rule).await,
            Kind::Resolved => self.stmts.forget_open(&a.tenant, &a.rule).await,
        };
        if let Err(e) = r {
            tracing::warn!(error = %e, alert_id = %a.alert_id, "cannot record an alert's delivery; the next ledger leader sends it again");
        }
    }

    /// Attempts until delivered, refused or out of attempts (true), or stopped (false).
    async fn deliver(&self, a: &AlertRow, kind: Kind, url: &str) -> bool {
        let Some(secret) = self.cfg.webhooks.secret(&a.tenant) else {
            tracing::error!(tenant = %a.tenant, "alert event not sent: the tenant has no signing secret; set webhooks.secrets.{} or {} and restart fairway serve", a.tenant, crate::config::secret_env_var(&a.tenant));
            metrics::counter!(m::ALERT_DELIVERIES, "result" => "not_sent").increment(1);
            return true;
        };
        let body = body(a, kind);
        let backoff = self.cfg.webhooks.backoff();
        let mut stop = self.stop.clone();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let status = self.post(url, &body, &delivery_id(a, kind), &secret).await;
            let verdict = hooks::judge(status);
            let wait = match verdict {
                Verdict::Delivered | Verdict::Refused => None,
                Verdict::Retry => backoff.after(attempt),
            };
            let result = match (verdict, wait) {
                (Verdict::Delivered, _) => "delivered",
                (Verdict::Refused, _) => "refused",
                (_, Some(_)) => "retry",
                (_, None) => "gave_up",
            };
            metrics::counter!(m::ALERT_DELIVERIES, "result" => result).increment(1);
            if result != "delivered" {
                tracing::info!(tenant = %a.tenant, alert_id = %a.alert_id, status = ?status, attempt, "alert event {result}");
            }
            let Some(wait) = wait else { return true };
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return false,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    async fn post(&self, url: &str, body: &[u8], delivery: &str, secret: &Secret) -> Option<u16> {
        let _slot = self.posts.acquire().await.ok()?;
        let sig = hooks::signature(secret.expose().as_bytes(), now_ms(), body);
        let req = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(hooks::SIGNATURE_HEADER, sig)
            .header(hooks::DELIVERY_HEADER, delivery)
            .body(body.to_vec());
        req.send().await.ok().map(|r| r.status().as_u16())
    }
}
