//! The tenants registry, live: tenants and their limits are rows in the store (pure rules
//! in `core::tenants`, statements in `store::tenants`). Each process keeps a current
//! [`TenantSet`] in a watch channel: it polls the registry's version counter every
//! `registry.poll_interval` and reloads the rows when the counter moved (and every 30 s
//! regardless), so a change made by `fairway tenants ...` or the admin API reaches every
//! worker and API process within about a second, without a restart.

use crate::config::Config;
use crate::core::tenants::{check_reservations, Admission, PoolRoom, TenantRecord, TenantSet};
use crate::now_ms;
use crate::store::{Store, StoreError, TenantStatements};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Reload everything at least this often, even if the version seems unchanged.
const FULL_RELOAD: Duration = Duration::from_secs(30);

/// A process's live view of the registry.
#[derive(Clone)]
pub struct LiveTenants {
    rx: watch::Receiver<Arc<TenantSet>>,
    /// The poller's sender too: a reload on a miss publishes what it read.
    tx: Arc<watch::Sender<Arc<TenantSet>>>,
    stmts: TenantStatements,
    cfg: Arc<Config>,
    /// Tenants this process is registering (each registered once, not once per job).
    registering: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl LiveTenants {
    /// Loads the registry and starts polling it until `shutdown`.
    pub async fn start(cfg: Arc<Config>, store: &Store, shutdown: watch::Receiver<bool>) -> Result<Self, StoreError> {
        let stmts = store.tenant_statements().await?;
        let first = load(&stmts).await?;
        if first.tenants.is_empty() && !cfg.tenants.is_empty() {
            tracing::warn!(
                configured = cfg.tenants.len(),
                "the tenants registry is empty but the config file lists tenants; run `fairway init` to seed it"
            );
        }
        let (tx, rx) = watch::channel(Arc::new(first));
        let tx = Arc::new(tx);
        tokio::spawn(poll(stmts.clone(), tx.clone(), cfg.registry.poll_interval, shutdown));
        Ok(LiveTenants { rx, tx, stmts, cfg, registering: Default::default() })
    }

    /// A miss: `tenant` is refused by this process's view, which may be up to a poll
    /// interval old. Reads the registry again (and publishes it if newer); true if the
    /// tenant is registered after all (a brand-new tenant), so its job must not be refused.
    pub async fn registered_after_all(&self, tenant: &str) -> Result<bool, StoreError> {
        let set = load(&self.stmts).await?;
        let known = set.tenants.contains_key(tenant);
        publish(&self.tx, set);
        Ok(known)
    }

    pub fn current(&self) -> Arc<TenantSet> {
        self.rx.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<TenantSet>> {
        self.rx.clone()
    }

    /// How a job of `tenant` is admitted under the configured unknown-tenant policy.
    /// The tenant's record, or a new one to register (admitted by policy), or why not.
    pub fn admission(&self, tenant: &str) -> Result<TenantRecord, String> {
        let set = self.current();
        let reg = &self.cfg.registry;
        match set.admission(tenant, reg.unknown_tenants, reg.default_tier) {
            Admission::Known(t) => Ok(t.clone()),
            Admission::Register(t) => Ok(t),
            Admission::Refused(why) => Err(why),
        }
    }

    /// Admits a job's tenant: Ok if registered, or unknown and admitted by policy (then
    /// registered in the background, once per process, while the job goes ahead);
    /// Err with the reason and the fix otherwise. One registry read.
    pub fn admit(&self, tenant: &str) -> Result<TenantRecord, String> {
        let set = self.current();
        let reg = &self.cfg.registry;
        match set.admission(tenant, reg.unknown_tenants, reg.default_tier) {
            Admission::Known(t) => Ok(t.clone()),
            Admission::Refused(why) => Err(why),
            Admission::Register(t) => {
                let (live, rec) = (self.clone(), t.clone());
                tokio::spawn(async move {
                    if let Err(e) = live.register(&rec).await {
                        tracing::warn!(tenant = %rec.name, error = %e, "cannot register an admitted tenant yet");
                    }
                });
                Ok(t)
            }
        }
    }

    /// Registers a tenant admitted by policy (no-op if someone registered it meanwhile).
    pub async fn register(&self, t: &TenantRecord) -> Result<(), StoreError> {
        if self.current().tenants.contains_key(&t.name) {
            return Ok(());
        }
        if !self.registering.lock().expect("registering").insert(t.name.clone()) {
            return Ok(());
        }
        let res = self.stmts.add(t, now_ms()).await;
        if !matches!(res, Ok(true) | Ok(false)) {
            // Failed: let a later job try again.
            self.registering.lock().expect("registering").remove(&t.name);
        }
        if res? {
            tracing::info!(tenant = %t.name, tier = %t.tier, "registered an unknown tenant by policy");
        }
        Ok(())
    }

    pub fn statements(&self) -> &TenantStatements {
        &self.stmts
    }
}

async fn load(stmts: &TenantStatements) -> Result<TenantSet, StoreError> {
    // Read the version first: a change landing between the two reads shows as a newer
    // version on the next poll, never as an old version over new rows.
    let version = stmts.version().await?;
    let tenants = stmts.list().await?;
    Ok(TenantSet { version, tenants })
}

/// Publishes `set` unless the current view is the same or newer (the poller and a
/// reload on a miss may race).
fn publish(tx: &watch::Sender<Arc<TenantSet>>, set: TenantSet) {
    tx.send_if_modified(|cur| {
        if set.version < cur.version || **cur == set {
            return false;
        }
        tracing::info!(version = set.version, tenants = set.tenants.len(), "tenants registry changed");
        *cur = Arc::new(set);
        true
    });
}

async fn poll(
    stmts: TenantStatements,
    tx: Arc<watch::Sender<Arc<TenantSet>>>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last_full = Instant::now();
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let known = tx.borrow().version;
        let moved = match stmts.version().await {
            Ok(v) => v != known,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the tenants registry version; keeping the current tenants");
                continue;
            }
        };
        if !moved && last_full.elapsed() < FULL_RELOAD {
            continue;
        }
        match load(&stmts).await {
            Ok(set) => {
                last_full = Instant::now();
                publish(&tx, set);
            }
            Err(e) => tracing::warn!(error = %e, "cannot reload the tenants registry; keeping the current tenants"),
        }
    }
}

/// Each pool of `cfg` with its room for reservations (see
/// [`crate::core::tenants::check_reservations`], which every registry write calls).
pub fn pool_rooms(cfg: &Config) -> Vec<PoolRoom> {
    cfg.pools
        .iter()
        .map(|(pool, pc)| PoolRoom {
            pool: pool.to_string(),
            slots: pc.slots,
            min_shared: crate::core::scheduler::SchedulerConfig::for_pool(*pool, pc.slots).min_shared_slots,
        })
        .collect()
}

/// Seeds the registry from the config file's `[tenants.*]`: adds the tenants it does not
/// have, never overwrites one (the registry is the truth once seeded). Returns the names added.
pub async fn seed_from_config(cfg: &Config, store: &Store) -> Result<Vec<String>, StoreError> {
    let stmts = store.tenant_statements().await?;
    let mut added = Vec::new();
    let mut registry = stmts.list().await?;
    for (name, t) in &cfg.tenants {
        let rec = TenantRecord::from_config(name, t);
        let fits = rec.validate().and_then(|()| match registry.contains_key(name) {
            true => Ok(()), // never overwritten: nothing changes
            false => check_reservations(&registry, &rec, &pool_rooms(cfg)),
        });
        if let Err(e) = fits {
            return Err(StoreError::Query { what: "seed tenants", message: format!("{e} (in the config file)") });
        }
        registry.entry(name.clone()).or_insert_with(|| rec.clone());
        if stmts.add(&rec, now_ms()).await? {
            added.push(name.clone());
        }
    }
    Ok(added)
}

/// [`seed_from_config`] with a store of its own (for `init`, the demo, benches, tests).
pub async fn seed(cfg: &Config) -> Result<Vec<String>, StoreError> {
    let store = Store::open(cfg).await?;
    seed_from_config(cfg, &store).await
}
