//! The worker's watchdog: no zombie workers.
//!
//! A worker that cannot serve the partitions it holds must not keep them. The watchdog
//! probes the store every `PROBE_EVERY`, watches the producer (rebuilt in place after a
//! fatal error, `kafka::Producer`, until it is given up) and hears the pool loops report
//! a fatal consumer error; `core::vitals` decides. When the verdict is to give up, it
//! says so once (error log, `fairway_worker_gave_up_total{reason}`) and the worker process
//! leaves its groups and exits non-zero (`fairway worker`), so its supervisor restarts it
//! and the group's other members serve its partitions meanwhile.
//!
//! [`Watch`] is the small shared state a health endpoint reads: [`Watch::live`] is false
//! while the worker cannot make progress (also `fairway_worker_live`).

use crate::core::vitals::{Verdict, Vitals};
use crate::kafka::Producer;
use crate::store::Store;
use crate::{metrics as m, now_ms};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;

/// How often the store is probed.
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// A probe that has not answered within this long failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A worker's vitals, shared by its tasks (and readable by a health endpoint).
pub struct Watch {
    vitals: Mutex<Vitals>,
    /// Why the worker gave up, once it did.
    gave_up: watch::Sender<Option<String>>,
}

impl Watch {
    pub fn new(store_outage_limit: Duration) -> Self {
        Watch {
            vitals: Mutex::new(Vitals::new(store_outage_limit.as_millis() as i64)),
            gave_up: watch::channel(None).0,
        }
    }

    /// Ok while the worker can make progress; else why not (for a liveness check).
    pub fn live(&self) -> Result<(), String> {
        match self.vitals.lock().expect("vitals lock").verdict(now_ms()) {
            Verdict::Live => Ok(()),
            Verdict::Impaired { reason } | Verdict::GiveUp { reason, .. } => Err(reason),
        }
    }

    /// An unrecoverable error (e.g. a consumer's fatal error): the worker gives up.
    pub fn fatal(&self, kind: &'static str, reason: String) {
        self.vitals.lock().expect("vitals lock").fatal(kind, reason);
        self.judge();
    }

    /// Whether the worker gave up (its pools then drain without waiting for running jobs).
    pub fn has_given_up(&self) -> bool {
        self.gave_up.borrow().is_some()
    }

    /// Resolves once the worker gave up, with the reason.
    pub async fn gave_up(&self) -> String {
        let mut rx = self.gave_up.subscribe();
        loop {
            if let Some(why) = rx.borrow_and_update().clone() {
                return why;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Applies the current verdict: metrics, and the give-up (once).
    fn judge(&self) {
        let now = now_ms();
        let (verdict, down) = {
            let v = self.vitals.lock().expect("vitals lock");
            (v.verdict(now), v.store_unreachable_ms(now))
        };
        metrics::gauge!(m::STORE_UNREACHABLE_SECONDS).set(down as f64 / 1000.0);
        metrics::gauge!(m::WORKER_LIVE).set(if verdict == Verdict::Live { 1.0 } else { 0.0 });
        if let Verdict::GiveUp { kind, reason } = verdict {
            self.gave_up.send_if_modified(|g| {
                if g.is_some() {
                    return false;
                }
                metrics::counter!(m::WORKER_GAVE_UP, "reason" => kind).increment(1);
                tracing::error!(%reason, "this worker cannot serve its partitions: leaving its consumer groups and exiting non-zero");
                *g = Some(reason);
                true
            });
        }
    }
}

/// Probes the store and watches the producer until shutdown.
pub async fn watchdog_loop(
    w: std::sync::Arc<Watch>,
    store: Store,
    producer: Producer,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        let probe = tokio::time::timeout(PROBE_TIMEOUT, store.ping()).await;
        {
            let mut v = w.vitals.lock().expect("vitals lock");
            match probe {
                Ok(Ok(())) => v.store_answered(),
                Ok(Err(e)) => v.store_failed(now_ms(), e.to_string()),
                Err(_) => v.store_failed(now_ms(), format!("no answer within {PROBE_TIMEOUT:?}")),
            }
            if let Some(why) = producer.gave_up() {
                v.fatal("producer", why);
            }
        }
        w.judge();
    }
}
