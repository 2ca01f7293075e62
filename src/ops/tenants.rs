//! The tenants registry, live: tenants and their limits are rows in the store (pure rules
//! in `core::tenants`, statements in `store::tenants`). Each process keeps a current
//! [`TenantSet`] in a watch channel. It loads every row once at start (paged), then polls
//! the registry's version counter every `registry.poll_interval` and, when it moved,
//! applies the change feed since it last looked (a few rows per change, whatever the
//! number of tenants); every [`FULL_RELOAD`] it reloads every row as a safety net. A
//! change made by `fairway tenants ...` or the admin API reaches every worker and API
//! process within about a second, without a restart.
//!
//! Tenants admitted by policy are registered in the background, many per store write
//! ([`Registrar`]): the job that met the tenant never waits for it.

use crate::config::Config;
use crate::core::tenants::{check_reservations, PoolRoom, Standing, TenantRecord, TenantSet};
use crate::now_ms;
use crate::store::{Store, StoreError, TenantStatements};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// Reload every row at least this often (the safety net behind the change feed).
pub const FULL_RELOAD: Duration = Duration::from_secs(300);
/// The feed is re-read from this long before the last read's start: a change stamped by
/// a writer whose clock runs behind (or written slowly) by up to this much is not missed.
const FEED_OVERLAP_MS: i64 = 5_000;
/// Most tenants waiting to be registered per process; beyond it a tenant is registered
/// on a later job of its own (it runs at the default tier meanwhile).
const MAX_PENDING: usize = 10_000;
/// Most tenants per registration pass.
const REGISTER_PASS: usize = 1_000;
/// A job of a tenant this process does not know asks the store at most this often (one
/// read of the version counter; the change feed only when it moved): a flood of jobs
/// from unknown tenants costs the store nothing more.
const MISS_RECHECK: Duration = Duration::from_millis(500);
/// How long a miss waits for the follower to apply a newer version.
const MISS_CATCH_UP: Duration = Duration::from_secs(5);

/// What a process read from the registry (for benches and tests: it grows with changes,
/// not with tenants, once started).
#[derive(Debug, Default)]
pub struct RegistryReads {
    /// Full reloads of every row (start-up and the safety net).
    pub full_reloads: AtomicU64,
    /// Rows read by full reloads.
    pub rows_read: AtomicU64,
    /// Feed entries read.
    pub changes_read: AtomicU64,
}

/// A process's live view of the registry.
#[derive(Clone)]
pub struct LiveTenants {
    rx: watch::Receiver<Arc<TenantSet>>,
    stmts: TenantStatements,
    cfg: Arc<Config>,
    registrar: Arc<Registrar>,
    reads: Arc<RegistryReads>,
    /// When the latest miss check started (one at a time, see [`MISS_RECHECK`]).
    miss: Arc<tokio::sync::Mutex<Option<Instant>>>,
    /// Wakes the follower at once (a miss saw a newer version).
    poke: Arc<Notify>,
}

/// Tenants admitted by policy that this process is registering: each once, many per write.
#[derive(Default)]
struct Registrar {
    /// Names queued or written and not yet seen in the registry (bounded by `MAX_PENDING`).
    known: Mutex<HashSet<String>>,
    queue: Mutex<Vec<TenantRecord>>,
    wake: Notify,
}

impl LiveTenants {
    /// Loads the registry and starts following it (and registering) until `shutdown`.
    pub async fn start(cfg: Arc<Config>, store: &Store, shutdown: watch::Receiver<bool>) -> Result<Self, StoreError> {
        let stmts = store.tenant_statements().await?;
        let reads = Arc::new(RegistryReads::default());
        let loaded_at = now_ms();
        let first = load(&stmts, &reads).await?;
        if first.tenants.is_empty() && !cfg.tenants.is_empty() {
            tracing::warn!(
                configured = cfg.tenants.len(),
                "the tenants registry is empty but the config file lists tenants; run `fairway init` to seed it"
            );
        }
        let (tx, rx) = watch::channel(Arc::new(first));
        let tx = Arc::new(tx);
        let poke = Arc::new(Notify::new());
        let follow = Follow {
            stmts: stmts.clone(),
            tx: tx.clone(),
            reads: reads.clone(),
            read_from: loaded_at - FEED_OVERLAP_MS,
            poke: poke.clone(),
        };
        tokio::spawn(follow.run(cfg.registry.poll_interval, shutdown.clone()));
        let miss = Arc::new(tokio::sync::Mutex::new(None));
        let live = LiveTenants { rx, stmts, cfg, registrar: Default::default(), reads, miss, poke };
        tokio::spawn(live.clone().register_in_background(shutdown));
        Ok(live)
    }

    /// A miss: `tenant` is refused by this process's view, which may be up to a poll
    /// interval old. True if the tenant is registered after all (a brand-new tenant), so
    /// its job must not be refused. Answers from a view at least as new as the registry
    /// when it was asked: one check at a time per process, at most one per
    /// [`MISS_RECHECK`], each a read of the version counter (plus the change feed, by the
    /// follower, if it moved); misses asked before a check started share its answer. So
    /// jobs of unknown tenants cost the store O(1) reads per `MISS_RECHECK`, not a read of
    /// every tenant each.
    pub async fn registered_after_all(&self, tenant: &str) -> Result<bool, StoreError> {
        let asked = Instant::now();
        let mut last = self.miss.lock().await;
        if last.is_none_or(|t| t < asked) {
            if let Some(t) = *last {
                tokio::time::sleep_until((t + MISS_RECHECK).into()).await;
            }
            *last = Some(Instant::now());
            self.catch_up().await?;
        }
        Ok(self.current().tenants.contains_key(tenant))
    }

    /// Brings this process's view up to the registry's current version: reads the
    /// version; if it moved, wakes the follower (feed since its last read) and waits.
    async fn catch_up(&self) -> Result<(), StoreError> {
        let version = self.stmts.version().await?;
        if self.current().version >= version {
            return Ok(());
        }
        self.poke.notify_one();
        let mut rx = self.rx.clone();
        let caught_up =
            tokio::time::timeout(MISS_CATCH_UP, rx.wait_for(|s| s.version >= version)).await.is_ok_and(|r| r.is_ok());
        if caught_up {
            return Ok(());
        }
        Err(StoreError::Query {
            what: "tenants registry",
            message: format!("registry version {version} not applied within {MISS_CATCH_UP:?}"),
        })
    }

    pub fn current(&self) -> Arc<TenantSet> {
        self.rx.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<TenantSet>> {
        self.rx.clone()
    }

    /// What this process has read from the registry so far.
    pub fn reads(&self) -> &RegistryReads {
        &self.reads
    }

    /// How a job of `tenant` is admitted under the configured unknown-tenant policy.
    /// The tenant's record (its row's, a free account's defaults, or a new one to
    /// register), or why not.
    pub fn standing(&self, tenant: &str) -> Result<TenantRecord, String> {
        match self.current().standing(tenant, self.cfg.registry.unregistered()) {
            Standing::Known(t) => Ok(t.clone()),
            Standing::Register(t) | Standing::Rowless(t) => Ok(t),
            Standing::Refused(why) => Err(why),
        }
    }

    /// Accepts a job's tenant: Ok if registered, a row-less free account, or unknown and
    /// admitted by policy (then queued for registration, once per process, while the job
    /// goes ahead); Err with the reason and the fix otherwise. No store access.
    pub fn accept(&self, tenant: &str) -> Result<TenantRecord, String> {
        match self.current().standing(tenant, self.cfg.registry.unregistered()) {
            Standing::Known(t) => Ok(t.clone()),
            Standing::Rowless(t) => Ok(t),
            Standing::Refused(why) => Err(why),
            Standing::Register(t) => {
                self.queue_registration(&t);
                Ok(t)
            }
        }
    }

    fn queue_registration(&self, t: &TenantRecord) {
        let r = &self.registrar;
        {
            let mut known = r.known.lock().expect("registrar");
            if known.len() >= MAX_PENDING || !known.insert(t.name.clone()) {
                return;
            }
        }
        r.queue.lock().expect("registrar").push(t.clone());
        r.wake.notify_one();
    }

    /// Registers what [`LiveTenants::admit`] queued, up to `REGISTER_PASS` per write pass.
    async fn register_in_background(self, mut shutdown: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = self.registrar.wake.notified() => {}
            }
            // Let a burst of new tenants gather into one pass.
            tokio::time::sleep(Duration::from_millis(100)).await;
            loop {
                let batch: Vec<TenantRecord> = {
                    let mut q = self.registrar.queue.lock().expect("registrar");
                    let n = q.len().min(REGISTER_PASS);
                    q.drain(..n).collect()
                };
                if batch.is_empty() {
                    break;
                }
                self.register_pass(batch).await;
            }
            let set = self.current();
            self.registrar.known.lock().expect("registrar").retain(|n| !set.tenants.contains_key(n));
        }
    }

    async fn register_pass(&self, batch: Vec<TenantRecord>) {
        let set = self.current();
        let todo: Vec<TenantRecord> = batch.into_iter().filter(|t| !set.tenants.contains_key(&t.name)).collect();
        match self.stmts.register(&todo, now_ms()).await {
            Ok(()) if !todo.is_empty() => {
                tracing::info!(tenants = todo.len(), tier = %todo[0].tier, "registered unknown tenants by policy")
            }
            Ok(()) => {}
            Err(e) => {
                // Let a later job of each try again.
                tracing::warn!(tenants = todo.len(), error = %e, "cannot register admitted tenants yet");
                let mut known = self.registrar.known.lock().expect("registrar");
                for t in &todo {
                    known.remove(&t.name);
                }
            }
        }
    }

    pub fn statements(&self) -> &TenantStatements {
        &self.stmts
    }
}

async fn load(stmts: &TenantStatements, reads: &RegistryReads) -> Result<TenantSet, StoreError> {
    // Read the version first: a change landing between the two reads shows as a newer
    // version on the next poll, never as an old version over new rows.
    let version = stmts.version().await?;
    let tenants = stmts.list().await?;
    reads.full_reloads.fetch_add(1, Ordering::Relaxed);
    reads.rows_read.fetch_add(tenants.len() as u64, Ordering::Relaxed);
    Ok(TenantSet { version, tenants })
}

/// Publishes `set` unless the current view is the same or newer.
fn publish(tx: &watch::Sender<Arc<TenantSet>>, set: TenantSet) {
    tx.send_if_modified(|cur| {
        if set.version < cur.version || **cur == set {
            return false;
        }
        tracing::debug!(version = set.version, tenants = set.tenants.len(), "tenants registry changed");
        *cur = Arc::new(set);
        true
    });
}

/// Follows the registry: the version counter, then the feed, and the full reload.
struct Follow {
    stmts: TenantStatements,
    tx: Arc<watch::Sender<Arc<TenantSet>>>,
    reads: Arc<RegistryReads>,
    /// Where the next feed read starts (writers' clock, ms).
    read_from: i64,
    /// A miss saw a newer version: poll now.
    poke: Arc<Notify>,
}

impl Follow {
    async fn run(mut self, every: Duration, mut shutdown: watch::Receiver<bool>) {
        let mut last_full = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(every) => {}
                _ = self.poke.notified() => {}
            }
            let known = self.tx.borrow().version;
            let version = match self.stmts.version().await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the tenants registry version; keeping the current tenants");
                    continue;
                }
            };
            let started = crate::now_ms();
            let full_due = last_full.elapsed() >= FULL_RELOAD;
            if version == known && !full_due {
                // Nothing new was bumped: a change's feed entry lands before its bump, so
                // the next read may start here (less the overlap), not at the last read.
                self.read_from = started - FEED_OVERLAP_MS;
                continue;
            }
            let next = if full_due { None } else { self.feed(version, started).await };
            let next = match next {
                Some(set) => set,
                None => match load(&self.stmts, &self.reads).await {
                    Ok(set) => {
                        last_full = Instant::now();
                        set
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot reload the tenants registry; keeping the current tenants");
                        continue;
                    }
                },
            };
            self.read_from = started - FEED_OVERLAP_MS;
            publish(&self.tx, next);
        }
    }

    /// The current set with the feed's changes since the last read applied, at
    /// `version`; None when the feed cannot say (too far behind, unreadable).
    async fn feed(&self, version: i64, now: i64) -> Option<TenantSet> {
        let changes = match self.stmts.changes_since(self.read_from, now).await {
            Ok(Some(c)) => c,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the tenants registry's changes; reloading every tenant");
                return None;
            }
        };
        self.reads.changes_read.fetch_add(changes.len() as u64, Ordering::Relaxed);
        let mut set = TenantSet::clone(&self.tx.borrow());
        set.apply(&changes);
        set.version = version;
        Some(set)
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

impl crate::seams::TenantsView for LiveTenants {
    fn current(&self) -> Arc<TenantSet> {
        LiveTenants::current(self)
    }
    fn subscribe(&self) -> watch::Receiver<Arc<TenantSet>> {
        LiveTenants::subscribe(self)
    }
    fn accept(&self, tenant: &str) -> Result<TenantRecord, String> {
        LiveTenants::accept(self, tenant)
    }
    fn registered_after_all<'a>(&'a self, tenant: &'a str) -> crate::seams::Io<'a, Result<bool, StoreError>> {
        Box::pin(LiveTenants::registered_after_all(self, tenant))
    }
}
