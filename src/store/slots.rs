//! A tenant's numbered slots, the atomic per-tenant count of schedules
//! (`schedule_slots`) and open debounce windows (`debounce_slots`): a holder claims a
//! free slot by `IF NOT EXISTS` before it writes its row and frees it (`IF holder = ?
//! AND at = ?`) after it deleted it, so a tenant never holds more than its bound however
//! many claims race on however many processes (one partition per slot: racing claims of
//! different slots are separate Paxos rounds).
//!
//! A claim first tries a few random slots without reading (one LWT when the tenant is
//! far from its bound), then reads the taken slots and tries free ones. A slot whose
//! holder died between its claim and its write stays taken until the caller frees it as
//! an orphan (it knows its rows; see `ops::schedules`, `submit::dedupe`).

use super::{applied, prepare_statement, q, Store, StoreError};
use crate::model::Millis;
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use std::sync::Arc;

/// Random slots tried before the taken ones are read.
const BLIND_TRIES: usize = 3;
/// Free slots one claim round tries before it reads the slots again.
const CLAIMS_PER_ROUND: usize = 8;
/// Claim rounds before a claim under heavy contention gives up.
const CLAIM_ROUNDS: usize = 50;
/// Tries of a compare-and-set whose answer was lost (a Paxos round timed out under
/// contention): each is followed by reading what was written.
pub const LWT_TRIES: usize = 5;
/// Slots read by one statement.
const READ_CHUNK: usize = 100;

/// A claimed slot.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    pub slot: i32,
    /// What claimed it (a schedule's name, a debounce key).
    pub holder: String,
    /// When it was claimed (the holder's row records it: a slot is its row's).
    pub at: Millis,
}

/// What a claim round found.
#[derive(Debug)]
pub enum Claimed {
    Held(Slot),
    /// Every slot is taken: the slots read.
    Full(Vec<Slot>),
    /// Too many racing claims to get one.
    Contended,
}

/// Which slots table.
#[derive(Debug, Clone, Copy)]
pub enum SlotKind {
    Schedule,
    Debounce,
}

/// Statements of one slots table ([`Store::slots`]).
#[derive(Clone)]
pub struct Slots {
    session: Arc<Session>,
    scope: String,
    read: PreparedStatement,
    claim: PreparedStatement,
    release: PreparedStatement,
}

impl Store {
    pub async fn slots(&self, kind: SlotKind) -> Result<Slots, StoreError> {
        let ks = self.keyspace();
        let (table, holder) = match kind {
            SlotKind::Schedule => ("schedule_slots", "name"),
            SlotKind::Debounce => ("debounce_slots", "key"),
        };
        let s = &self.session;
        let key = "WHERE scope = ? AND tenant = ? AND slot";
        Ok(Slots {
            session: self.session.clone(),
            scope: self.scope.clone(),
            read: prepare_statement(
                s,
                format!("SELECT slot, {holder}, at FROM {ks}.{table} {key} IN ?"),
                "prepare read slots",
                false,
            )
            .await?,
            claim: prepare_statement(
                s,
                format!(
                    "INSERT INTO {ks}.{table} (scope, tenant, slot, {holder}, at) VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"
                ),
                "prepare claim slot",
                true,
            )
            .await?,
            release: prepare_statement(
                s,
                format!("DELETE FROM {ks}.{table} {key} = ? IF {holder} = ? AND at = ?"),
                "prepare release slot",
                true,
            )
            .await?,
        })
    }
}

impl Slots {
    /// The claimed slots among `0..count` of a tenant.
    pub async fn taken(&self, tenant: &str, count: usize) -> Result<Vec<Slot>, StoreError> {
        let all: Vec<i32> = (0..count as i32).collect();
        let mut out = Vec::new();
        for chunk in all.chunks(READ_CHUNK) {
            out.extend(self.read(tenant, chunk).await?);
        }
        Ok(out)
    }

    /// The claimed slots of a tenant among `slots` (at most [`READ_CHUNK`]).
    pub async fn read(&self, tenant: &str, slots: &[i32]) -> Result<Vec<Slot>, StoreError> {
        let what = "read slots";
        let v = (self.scope.as_str(), tenant, slots.to_vec());
        let res = self.session.execute_unpaged(&self.read, v).await.map_err(q(what))?;
        let rows = res.into_rows_result().map_err(q(what))?;
        let mut out = Vec::new();
        for r in rows.rows::<(i32, Option<String>, Option<i64>)>().map_err(q(what))? {
            let (slot, holder, at) = r.map_err(q(what))?;
            out.push(Slot { slot, holder: holder.unwrap_or_default(), at: at.unwrap_or(0) });
        }
        Ok(out)
    }

    /// Frees a slot if `s` still holds it.
    pub async fn release(&self, tenant: &str, s: &Slot) -> Result<bool, StoreError> {
        let v = (self.scope.as_str(), tenant, s.slot, s.holder.as_str(), s.at);
        applied(self.session.execute_unpaged(&self.release, v).await.map_err(q("release slot"))?)
    }

    /// Claims one of the tenant's `max` slots for (`holder`, `at`).
    pub async fn claim_free(&self, tenant: &str, max: usize, holder: &str, at: Millis) -> Result<Claimed, StoreError> {
        use rand::seq::SliceRandom;
        use rand::Rng;
        let mine = |slot| Slot { slot, holder: holder.to_string(), at };
        for _ in 0..BLIND_TRIES.min(max) {
            let slot = rand::rng().random_range(0..max as i32);
            if self.claim(tenant, &mine(slot)).await? {
                return Ok(Claimed::Held(mine(slot)));
            }
        }
        for _ in 0..CLAIM_ROUNDS {
            let taken = self.taken(tenant, max).await?;
            let mut free: Vec<i32> = (0..max as i32).filter(|i| !taken.iter().any(|t| t.slot == *i)).collect();
            if free.is_empty() {
                return Ok(Claimed::Full(taken));
            }
            free.shuffle(&mut rand::rng());
            for slot in free.into_iter().take(CLAIMS_PER_ROUND) {
                if self.claim(tenant, &mine(slot)).await? {
                    return Ok(Claimed::Held(mine(slot)));
                }
            }
        }
        Ok(Claimed::Contended)
    }

    /// Claims `mine` by compare-and-set; true if it holds it (read back when the answer
    /// was lost or said no: a timed-out round may still have been applied).
    pub async fn claim(&self, tenant: &str, mine: &Slot) -> Result<bool, StoreError> {
        let mut lost = None;
        for _ in 0..LWT_TRIES {
            let v = (self.scope.as_str(), tenant, mine.slot, mine.holder.as_str(), mine.at);
            match self.session.execute_unpaged(&self.claim, v).await.map_err(q("claim slot")).and_then(applied) {
                Ok(true) => return Ok(true),
                Ok(false) => lost = None,
                Err(e) => lost = Some(e),
            }
            if lost.is_some() {
                contention_pause().await;
            }
            match self.read(tenant, &[mine.slot]).await?.first() {
                Some(held) => return Ok(held == mine),
                None if lost.is_none() => return Ok(false),
                None => {}
            }
        }
        Err(lost.unwrap_or_else(|| contended("claim slot")))
    }
}

/// A random pause of 20 to 200 ms before reading back a compare-and-set whose answer was
/// lost, so racing writers do not meet again at once.
pub async fn contention_pause() {
    use rand::Rng;
    let ms = rand::rng().random_range(20..200);
    tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
}

pub fn contended(what: &'static str) -> StoreError {
    StoreError::Query { what, message: "compare-and-set contended; try again".into() }
}
