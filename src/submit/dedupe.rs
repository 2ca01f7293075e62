//! Unique jobs and debounce, the submission side (rules: `core::unique`; rows: the
//! `idempotency` table for unique keys, `store::debounce` for debounce windows; the
//! promoter's leader submits due windows' jobs, `worker::schedules`).
//!
//! A unique key is claimed in the tenant's idempotency keys under `fairway.unique/<key>`
//! (LWT), with the window (scope `window`) or `retention.results` (other scopes) as TTL.
//! A debounce submission produces nothing: it opens the (tenant, key) window or moves an
//! open one (LWT on its revision) and answers with the window's job id. A tenant has at
//! most `debounce.max_open_per_tenant` windows open: an open claims one of the tenant's
//! slots (`store::slots`) by LWT first, so racing opens on any number of processes never
//! pass the bound; the window frees its slot when its job is submitted. Each job's
//! payload is at most `debounce.max_payload_bytes`.

use crate::config::Config;
use crate::core::recurring::parse_duration;
use crate::core::unique::{self, debounce_due, DebounceConfig, DebounceMode, Held, UniqueScope, MAX_DEBOUNCE_MS};
use crate::model::{JobSubmitted, Millis, Pool};
use crate::store::{
    Claimed, DebounceRow, DebounceStatements, EventStatements, IdempotencyClaim, Slot, SlotKind, Slots, Store,
    StoreError,
};
use crate::submit::{NewJob, SubmitError, Submitted};

/// Longest unique or debounce key.
pub const MAX_KEY_LEN: usize = 200;
/// Longest `unique_window`.
pub const MAX_UNIQUE_WINDOW_MS: Millis = 30 * 24 * 3_600_000;
/// Compare-and-set attempts of one submission against concurrent ones.
const ATTEMPTS: usize = 5;

fn invalid(field: &'static str, message: impl Into<String>) -> SubmitError {
    SubmitError::Invalid { field, message: message.into() }
}

fn duration(field: &'static str, v: &Option<String>) -> Result<Option<Millis>, SubmitError> {
    v.as_deref().map(|s| parse_duration(field, s)).transpose().map_err(|e| invalid(e.field, e.message))
}

fn check_key(field: &'static str, key: &str) -> Result<(), SubmitError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN || key.chars().any(char::is_control) {
        return Err(invalid(field, format!("1 to {MAX_KEY_LEN} printable characters")));
    }
    Ok(())
}

/// Checks a job's unique and debounce fields (the field and the fix on error).
pub fn check(job: &NewJob, bounds: &DebounceConfig) -> Result<(), SubmitError> {
    if let Some(k) = &job.unique_key {
        check_key("unique_key", k)?;
        UniqueClaim::window_of(job)?;
    } else if job.unique_scope.is_some() || job.unique_window.is_some() {
        return Err(invalid("unique_key", "unique_scope and unique_window need a unique_key"));
    }
    if let Some(k) = &job.debounce_key {
        check_key("debounce_key", k)?;
        if job.unique_key.is_some() || job.execute_at.is_some() {
            return Err(invalid("debounce_key", "a debounced job sets its own start: drop unique_key and execute_at"));
        }
        Debounce::of(job, bounds)?;
        let (bytes, max) = (job.payload_bytes().len(), bounds.max_payload_bytes);
        if bytes > max {
            return Err(invalid(
                "payload",
                format!(
                    "a debounced job's payload is {bytes} bytes, over debounce.max_payload_bytes = {max}; pass larger \
                     inputs by reference (a key or URL the job reads)"
                ),
            ));
        }
    } else if job.debounce_delay.is_some() || job.debounce_max_delay.is_some() || job.debounce_mode.is_some() {
        return Err(invalid(
            "debounce_key",
            "debounce_delay, debounce_max_delay and debounce_mode need a debounce_key",
        ));
    }
    Ok(())
}

/// The idempotency-table key a unique key is claimed under.
pub fn unique_claim_key(key: &str) -> String {
    format!("{}unique/{key}", crate::core::unique::SYSTEM_KEY_PREFIX)
}

/// A submission's unique key, scope and the claim's TTL.
pub struct UniqueClaim<'a> {
    tenant: &'a str,
    key: String,
    scope: UniqueScope,
    ttl_secs: i32,
}

impl<'a> UniqueClaim<'a> {
    fn window_of(job: &NewJob) -> Result<Option<Millis>, SubmitError> {
        let window = duration("unique_window", &job.unique_window)?;
        match (job.unique_scope.unwrap_or_default(), window) {
            (UniqueScope::Window, None) => {
                Err(invalid("unique_window", "scope `window` needs a unique_window, e.g. \"10m\""))
            }
            (UniqueScope::Window, Some(w)) if !(1_000..=MAX_UNIQUE_WINDOW_MS).contains(&w) => {
                Err(invalid("unique_window", "between 1s and 30 days"))
            }
            (UniqueScope::Window, w) => Ok(w),
            (_, Some(_)) => Err(invalid("unique_window", "only with unique_scope = \"window\"")),
            (_, None) => Ok(None),
        }
    }

    pub fn of(cfg: &Config, job: &'a NewJob) -> Result<Self, SubmitError> {
        let key = job.unique_key.as_deref().ok_or_else(|| invalid("unique_key", "missing"))?;
        let ttl_ms = Self::window_of(job)?.unwrap_or(cfg.retention.results.as_millis() as Millis);
        let ttl_secs = (ttl_ms / 1000).clamp(1, i32::MAX as i64) as i32;
        Ok(UniqueClaim {
            tenant: &job.tenant,
            key: unique_claim_key(key),
            scope: job.unique_scope.unwrap_or_default(),
            ttl_secs,
        })
    }

    /// Claims the key for `job_id`: None when claimed (submit it), else the holder's answer.
    pub async fn claim(
        &self,
        stmts: &EventStatements,
        store: &Store,
        job_id: &str,
        now: Millis,
        pool: Pool,
        max_produce_ms: i64,
    ) -> Result<Option<Submitted>, SubmitError> {
        for _ in 0..ATTEMPTS {
            let IdempotencyClaim::Held { job_id: held, at } =
                stmts.claim_key(self.tenant, &self.key, job_id, now, self.ttl_secs).await?
            else {
                return Ok(None);
            };
            let row = store.job_direct(&held).await?;
            match unique::held(self.scope, row.as_ref().and_then(|r| r.status.as_deref()), at, now, max_produce_ms) {
                Held::Duplicate => {
                    let pool = row.as_ref().and_then(|r| r.pool.as_deref()?.parse().ok()).unwrap_or(pool);
                    return Ok(Some(Submitted {
                        job_id: held,
                        duplicate: true,
                        pool,
                        original: row,
                        joined: true,
                        queued_row: false,
                    }));
                }
                Held::Free => {
                    if stmts.take_over_key(self.tenant, &self.key, &held, job_id, now, self.ttl_secs).await? {
                        return Ok(None);
                    }
                    // Another submission took it over first: look at its holder.
                }
            }
        }
        Err(SubmitError::Invalid {
            field: "unique_key",
            message: "contended by many submissions at once; retry".into(),
        })
    }
}

/// A submission's debounce settings.
pub struct Debounce {
    delay: Millis,
    max_delay: Option<Millis>,
    mode: DebounceMode,
    /// Open windows the tenant may have (`debounce.max_open_per_tenant`).
    max_open: usize,
}

impl Debounce {
    pub fn of(job: &NewJob, bounds: &DebounceConfig) -> Result<Debounce, SubmitError> {
        let delay = duration("debounce_delay", &job.debounce_delay)?
            .ok_or_else(|| invalid("debounce_delay", "a debounce_key needs a debounce_delay, e.g. \"5s\""))?;
        let max_delay = duration("debounce_max_delay", &job.debounce_max_delay)?;
        if !(1..=MAX_DEBOUNCE_MS).contains(&delay) {
            return Err(invalid("debounce_delay", "between 1ms and 24h"));
        }
        if let Some(m) = max_delay {
            if m < delay || m > MAX_DEBOUNCE_MS {
                return Err(invalid("debounce_max_delay", "at least debounce_delay and at most 24h"));
            }
        }
        let mode = job.debounce_mode.unwrap_or_default();
        Ok(Debounce { delay, max_delay, mode, max_open: bounds.max_open_per_tenant })
    }
}

/// A slot claimed this long ago that no window holds is an open that died between its
/// claim and its write (or a close between its delete and its release): freed when the
/// tenant is at its bound.
const ORPHAN_SLOT_MS: Millis = 60_000;

/// Debounce windows' rows and their tenants' slots.
#[derive(Clone)]
pub struct Windows {
    pub rows: DebounceStatements,
    pub slots: Slots,
}

impl Windows {
    pub async fn connect(store: &Store) -> Result<Windows, StoreError> {
        Ok(Windows { rows: store.debounce_statements().await?, slots: store.slots(SlotKind::Debounce).await? })
    }

    /// Claims one of the tenant's `max` slots for a window of `key` opened at `now`;
    /// orphaned slots are freed once the tenant looks full.
    async fn claim(&self, tenant: &str, key: &str, max: usize, now: Millis) -> Result<Slot, SubmitError> {
        let mut orphans_freed = false;
        loop {
            match self.slots.claim_free(tenant, max, key, now).await? {
                Claimed::Held(s) => return Ok(s),
                Claimed::Full(taken) => {
                    if orphans_freed || self.free_orphans(tenant, &taken, now).await? == 0 {
                        return Err(SubmitError::TooManyWindows { tenant: tenant.to_string(), max });
                    }
                    orphans_freed = true;
                }
                Claimed::Contended => {
                    return Err(invalid("debounce_key", "too many windows opened at once to claim a slot; retry"))
                }
            }
        }
    }

    /// Frees the slots of `taken` claimed over [`ORPHAN_SLOT_MS`] ago that no window
    /// holds; how many.
    async fn free_orphans(&self, tenant: &str, taken: &[Slot], now: Millis) -> Result<usize, StoreError> {
        let open = self.rows.windows(tenant, crate::core::unique::MAX_OPEN_PER_TENANT_CEILING).await?;
        let held = |s: &Slot| open.iter().any(|w| w.key == s.holder && w.slot == s.slot && w.slot_at == s.at);
        let mut freed = 0;
        for s in taken.iter().filter(|s| s.at < now - ORPHAN_SLOT_MS && !held(s)) {
            freed += usize::from(self.slots.release(tenant, s).await?);
        }
        Ok(freed)
    }

    /// Frees a closed window's slot (its job is in).
    pub async fn release(&self, w: &DebounceRow) -> Result<(), StoreError> {
        if w.slot >= 0 {
            let s = Slot { slot: w.slot, holder: w.key.clone(), at: w.slot_at };
            self.slots.release(&w.tenant, &s).await?;
        }
        Ok(())
    }
}

/// Folds a submission (`rec`, its job) into the (tenant, key) window: opens it (with a
/// slot of the tenant's), or moves the open one's due time (and job, in `replace` mode).
/// Answers with the window's job id.
pub async fn debounce(
    store: &Store,
    windows: &tokio::sync::OnceCell<Windows>,
    key: &str,
    d: &Debounce,
    rec: &mut JobSubmitted,
    now: Millis,
) -> Result<Submitted, SubmitError> {
    let w = windows.get_or_try_init(|| Windows::connect(store)).await?;
    let pool = rec.pool.unwrap_or(Pool::Short);
    let rev = uuid::Uuid::new_v4().to_string();
    for _ in 0..ATTEMPTS {
        let Some(open) = w.rows.get(&rec.tenant, key).await? else {
            let slot = w.claim(&rec.tenant, key, d.max_open, now).await?;
            let row = DebounceRow {
                tenant: rec.tenant.clone(),
                key: key.to_string(),
                window_id: rec.job_id.clone(),
                first_at: now,
                due_at: debounce_due(now, now, d.delay, d.max_delay),
                rev: rev.clone(),
                job: crate::codec::encode_job(rec)?,
                slot: slot.slot,
                slot_at: slot.at,
            };
            if w.rows.open(&row, now).await? {
                return Ok(Submitted {
                    job_id: row.window_id,
                    duplicate: false,
                    pool,
                    original: None,
                    joined: false,
                    queued_row: false,
                });
            }
            w.slots.release(&rec.tenant, &slot).await?;
            continue;
        };
        rec.job_id = open.window_id.clone();
        let job = match d.mode {
            DebounceMode::Replace => crate::codec::encode_job(rec)?,
            DebounceMode::KeepFirst => open.job.clone(),
        };
        let due_at = debounce_due(open.first_at, now, d.delay, d.max_delay);
        let moved = DebounceRow { due_at, rev: rev.clone(), job, ..open.clone() };
        if w.rows.extend(&moved, &open).await? {
            return Ok(Submitted {
                job_id: open.window_id,
                duplicate: true,
                pool,
                original: None,
                joined: true,
                queued_row: false,
            });
        }
    }
    Err(SubmitError::Invalid { field: "debounce_key", message: "contended by many submissions at once; retry".into() })
}

/// The job a closed window submits: its pending record as a submission with its id.
pub fn window_job(rec: JobSubmitted) -> NewJob {
    let payload = super::Payload::bytes(rec.payload);
    NewJob {
        idempotency_key: Some(format!("fairway.debounce/{}", rec.job_id)),
        job_id: Some(rec.job_id),
        tenant: rec.tenant,
        job_type: rec.job_type,
        payload,
        priority: rec.priority,
        pool: rec.pool,
        traceparent: rec.traceparent,
        tracestate: rec.tracestate,
        flow_key: rec.flow_key,
        user_key: rec.user_key,
        ..Default::default()
    }
}
