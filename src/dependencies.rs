//! The fleet-wide dependency breakers as a worker or an API process sees them
//! (`core::dependency`): the rows the ledger's leader writes (`store::dependencies`),
//! read every [`READ_EVERY`] into one view the process shares.
//! - A worker holds a job whose type declares an open dependency (`worker::exec`): it goes
//!   back on the dependency retry topic with its attempt unchanged until the breaker's
//!   end, plus a jitter so held jobs do not all return at once.
//! - The front door refuses such submissions with 503 `CIRCUIT_OPEN` (scope
//!   `dependency:<name>`) and `Retry-After` (`crate::admission`).
//!
//! A failed read keeps the last view (held jobs stay held until their end; nothing new is
//! held) and counts `fairway_dependency_read_failures_total`.

use crate::core::dependency::View;
use crate::metrics as m;
use crate::model::Millis;
use crate::now_ms;
use crate::store::Store;
use std::sync::RwLock;
use std::time::Duration;
use tokio::sync::watch;

/// How often the breakers' rows are read.
pub const READ_EVERY: Duration = Duration::from_secs(1);
/// Held jobs return within this after the breaker's end (spread evenly).
pub const RETURN_SPREAD_MS: Millis = 5_000;

/// Whether any job type declares a dependency and the breaker is on (else there is
/// nothing to read).
pub fn in_use(cfg: &crate::config::Config) -> bool {
    cfg.dependency_breaker.enabled && cfg.job_types.values().any(|jt| !jt.dependencies.is_empty())
}

/// The view of the breakers a process holds jobs (or refuses submissions) by.
#[derive(Default)]
pub struct Holds {
    view: RwLock<View>,
}

impl Holds {
    /// Until when a job of a type declaring `deps` is held, and by which dependency.
    pub fn held(&self, deps: &[String], now: Millis) -> Option<(String, Millis)> {
        if deps.is_empty() {
            return None;
        }
        let v = self.view.read().expect("dependency view");
        v.held(deps, now).map(|(d, until)| (d.to_string(), until))
    }

    /// Reads the rows every [`READ_EVERY`] until `stop` (only when a job type declares
    /// a dependency).
    pub async fn run(self: std::sync::Arc<Self>, store: Store, role: &'static str, mut stop: watch::Receiver<bool>) {
        let stmts = loop {
            match store.dependency_statements().await {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!(error = %e, "dependency breakers: cannot prepare their statements; trying again")
                }
            }
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(READ_EVERY) => {}
            }
        };
        loop {
            match stmts.all().await {
                Ok(rows) => {
                    let view = View::new(rows.into_iter().map(|r| (r.dependency, r.state)), now_ms());
                    *self.view.write().expect("dependency view") = view;
                }
                Err(e) => {
                    metrics::counter!(m::DEPENDENCY_READ_FAILURES, "role" => role).increment(1);
                    tracing::warn!(error = %e, "dependency breakers: cannot read their states; keeping the last read");
                }
            }
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(READ_EVERY) => {}
            }
        }
    }
}
