//! Disaster recovery's pure parts (`fairway backup` / `fairway restore`, I/O in
//! `ops::backup`): which tables a backup copies and how, the consistent cut, the manifest
//! and the framing of copied topic records.
//!
//! **The cut.** A backup reads a wall-clock instant `t0` first, then every consumer
//! group's committed offsets, then copies the store, then reads each topic's high
//! watermark and copies the records below it. A job's terminal state and its result are
//! written with the same `finished_at`/`updated_at` (the result is acknowledged first:
//! `worker::durable::record_terminal`), so one rule keeps both sides consistent: a state
//! written after `t0` ([`keep_state`]) and a result finished after `t0` ([`keep_result`])
//! are both left out, and the job, whose record is still in the copied range of its topic
//! (its offset is committed only after its state is durable), runs again. A finished
//! state kept always has its result kept, and the other way round.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The manifest's layout version; a restore refuses any other.
pub const MANIFEST_VERSION: u32 = 1;

/// The manifest's file name in a backup directory.
pub const MANIFEST: &str = "manifest.json";

/// How a table is backed up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Control plane: copied whole, restored as is.
    Control,
    /// Job state: copied whole but for rows whose write time (ms) in `column` is after
    /// the cut (a job's row; an idempotency claim, so a client's retry of a submission
    /// the backup lost is accepted again after a restore instead of deduplicated).
    Cut { column: &'static str },
    /// Job state in a blob of [`crate::core::finished`] records (`column`): records
    /// written after the cut are left out (a pack keeps the others).
    Finished { column: &'static str, packed: bool },
    /// Not copied, and why (derived, short-lived, or keyed by Kafka positions that mean
    /// nothing on a new cluster).
    Skipped(&'static str),
}

/// Every table of `store::TABLES` and its role: a table added to the schema needs a line
/// here (a unit test holds it).
pub const TABLES: &[(&str, Role)] = &[
    ("jobs", Role::Cut { column: "updated_at" }),
    ("finished_jobs", Role::Finished { column: "record", packed: false }),
    ("finished_packs", Role::Finished { column: "body", packed: true }),
    ("heartbeats", Role::Skipped("liveness of the old fleet: a running job's copy takes over at once without one")),
    ("checkpoints", Role::Skipped("no longer written (job_checkpoints is)")),
    ("job_checkpoints", Role::Control),
    ("job_handoffs", Role::Control),
    ("running_index", Role::Skipped("a job running at the cut is still in its pool topic's copied range (offsets are committed only past finished jobs); restoring the index would make the reaper dispatch it twice")),
    ("idempotency", Role::Cut { column: "at" }),
    ("scheduled_jobs", Role::Control),
    ("usage", Role::Skipped("fair-share accounting of the last minutes: rebuilt by the new fleet")),
    ("quotas", Role::Skipped("each live worker's wants: short TTL, rebuilt")),
    ("fleet_counts", Role::Skipped("each live worker's counts: short TTL, rebuilt")),
    ("scheduled_buckets", Role::Control),
    ("leases", Role::Skipped("held by the old fleet's processes")),
    ("generations", Role::Control),
    ("replays", Role::Skipped("keyed by offsets of the old cluster")),
    ("dispatch_frontier", Role::Skipped("keyed by offsets of the old cluster: restore records its own for the records it produces")),
    ("cancellations", Role::Skipped("the recent-cancel feed (short TTL): a cancel is in the job's row")),
    ("backlog", Role::Skipped("keyed by offsets of the old cluster: the spilled jobs are still in the pool topic's copied range (their offsets are uncommitted until they run)")),
    ("backlog_packs", Role::Skipped("keyed by offsets of the old cluster: as backlog")),
    ("backlog_index", Role::Skipped("keyed by offsets of the old cluster: as backlog")),
    ("tenants", Role::Control),
    ("tenant_regions", Role::Control),
    ("region_states", Role::Skipped("the old region's outage flag: a restored region starts up (`fairway region down` again if needed)")),
    ("registry_versions", Role::Skipped("a counter processes poll: a fresh one works (processes read the registry whole at start)")),
    ("tenant_changes", Role::Skipped("the registry's change feed (1 h TTL): the tenants table holds the result")),
    ("worker_stats", Role::Skipped("live workers' snapshots (short TTL)")),
    ("api_keys", Role::Control),
    ("job_owners", Role::Control),
    ("job_events", Role::Skipped("derived: the history recorder rebuilds it from the copied events topic")),
    ("queue_depth", Role::Skipped("front-door counters (counter columns cannot be inserted): they restart at zero")),
    ("outcome_counts", Role::Skipped("10 s outcome buckets (TTL) the breakers read: rebuilt")),
    ("tenant_outcome_counts", Role::Skipped("10 s outcome buckets (TTL): rebuilt")),
    ("run_times", Role::Skipped("no longer written")),
    ("pool_classes", Role::Skipped("no longer written")),
    ("tenant_run_times", Role::Skipped("10 s run-time buckets (TTL): rebuilt")),
    ("tenant_pool_classes", Role::Control),
    ("schedules", Role::Control),
    ("schedule_slots", Role::Control),
    ("debounces", Role::Control),
    ("restores", Role::Skipped("the restore's own bookkeeping on the new cluster")),
    ("tenant_refusals", Role::Skipped("hourly counts of refused submissions (TTL): the new fleet counts its own")),
    ("dependency_breakers", Role::Skipped("the old fleet's view of its dependencies: the new fleet's counts decide afresh")),
    ("schedule_totals", Role::Skipped("a counter (counter columns cannot be inserted): the schedules sweep recounts it")),
    ("tenant_schedules", Role::Control),
    ("tenant_debounces", Role::Control),
    ("debounce_slots", Role::Control),
    ("due_index", Role::Control),
    ("due_buckets", Role::Control),
    ("tenant_outcome_cells", Role::Skipped("10 s outcome buckets (TTL) the breakers read: rebuilt")),
    ("ledger", Role::Control),
    ("ledger_tenants", Role::Control),
    ("ledger_fleet", Role::Control),
    ("tenant_alerts", Role::Control),
    ("tenant_alerts_open", Role::Control),
    ("ledger_positions", Role::Skipped("keyed by offsets of the old results topic: the new leader reads the restored topic from its start, and the restored totals (written at restore time) win over its re-count of the copied results")),
];

/// Tables whose rows are written with a TTL, and a column every write sets: a backup
/// keeps each row's remaining TTL (as [`TTL_KEY`]) and a restore writes the row with it,
/// so restored idempotency windows, job rows and checkpoints still expire.
pub const TTL_COLUMNS: &[(&str, &str)] = &[
    ("jobs", "updated_at"),
    ("finished_jobs", "record"),
    ("finished_packs", "body"),
    ("job_checkpoints", "data"),
    ("job_handoffs", "handoff_count"),
    ("idempotency", "job_id"),
    ("job_owners", "tenant"),
];

/// The key of a row's remaining TTL (seconds) in a backed-up row's JSON.
pub const TTL_KEY: &str = "[ttl]";

/// The TTL column of `table` (see [`TTL_COLUMNS`]).
pub fn ttl_column(table: &str) -> Option<&'static str> {
    TTL_COLUMNS.iter().find(|(t, _)| *t == table).map(|(_, c)| *c)
}

/// A backed-up row split into the row to insert and its remaining TTL (seconds), if any.
pub fn split_ttl(row: &str) -> Result<(String, Option<i32>), String> {
    if !row.contains(TTL_KEY) {
        return Ok((row.to_string(), None));
    }
    let mut v: serde_json::Value = serde_json::from_str(row).map_err(|e| format!("row is not JSON: {e}"))?;
    let ttl = v.as_object_mut().and_then(|o| o.remove(TTL_KEY)).and_then(|t| t.as_i64());
    Ok((v.to_string(), ttl.filter(|t| *t > 0).map(|t| t.min(i32::MAX as i64) as i32)))
}

/// The role of `table`, None when the list above misses it.
pub fn role_of(table: &str) -> Option<Role> {
    TABLES.iter().find(|(t, _)| *t == table).map(|(_, r)| *r)
}

/// Whether a job state last written at `updated_at` belongs to a backup cut at `t0`. A
/// state without a write time (a bare cancel flag) is kept.
pub fn keep_state(updated_at: Option<i64>, t0: i64) -> bool {
    updated_at.is_none_or(|at| at <= t0)
}

/// Whether a result finished at `finished_at` belongs to a backup cut at `t0` that keeps
/// the results of the last `window_ms`.
pub fn keep_result(finished_at: i64, t0: i64, window_ms: i64) -> bool {
    finished_at <= t0 && finished_at >= t0.saturating_sub(window_ms)
}

/// Whether an event (or any record judged by its timestamp) belongs to the window.
pub fn keep_event(timestamp: Option<i64>, t0: i64, window_ms: i64) -> bool {
    timestamp.is_some_and(|ts| ts <= t0 && ts >= t0.saturating_sub(window_ms))
}

/// A finished-record blob cut at `t0`: Some(blob) to keep (possibly re-packed with fewer
/// records), None when nothing of it is kept. `packed`: a pack of records
/// (`core::finished::packs`), else one record.
pub fn cut_finished(blob: &[u8], packed: bool, t0: i64) -> Result<Option<Vec<u8>>, String> {
    use crate::core::finished::{entries, open, packs, FinishedRecord};
    if !packed {
        let (rec, _) = FinishedRecord::decode(blob)?;
        return Ok(keep_state(Some(rec.updated_at), t0).then(|| blob.to_vec()));
    }
    let plain = open(blob)?;
    let all = entries(&plain)?;
    let mut kept = Vec::with_capacity(all.len());
    for (id, rec) in &all {
        let (r, _) = FinishedRecord::decode(rec)?;
        if keep_state(Some(r.updated_at), t0) {
            kept.push((id.to_string(), rec.to_vec()));
        }
    }
    if kept.len() == all.len() {
        return Ok(Some(blob.to_vec()));
    }
    if kept.is_empty() {
        return Ok(None);
    }
    // All of one pack share its bucket and fit in one pack (fewer bytes than before).
    Ok(packs(&kept).into_iter().next().map(|(_, body, _)| body))
}

/// The file beside the manifest holding its keyed digest (HMAC-SHA256, hex) under the
/// operator's backup key: every file's SHA-256 is in the manifest, so the digest binds
/// them all to the key.
pub const MANIFEST_MAC: &str = "manifest.json.hmac";
/// Fewest bytes of a backup key.
pub const MIN_KEY_BYTES: usize = 32;
/// Most bytes of a backup key (a key file is read up to this).
pub const MAX_KEY_BYTES: usize = 4096;

/// The operator's backup key: what signs a backup's manifest and what a restore checks
/// it with. Never shown: its `Debug` and errors name where it came from, not its bytes.
#[derive(Clone)]
pub struct BackupKey(Vec<u8>);

impl std::fmt::Debug for BackupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BackupKey(<{} bytes>)", self.0.len())
    }
}

/// Why a key or a manifest's digest was refused (never with the key's bytes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the backup key from {from} is {len} bytes; it must be {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes (e.g. `openssl rand -hex 32`)")]
    Length { from: String, len: usize },
    #[error("the backup's manifest carries no keyed digest ({MANIFEST_MAC}): it was not signed with a backup key, so it is not trusted; restore only backups taken with one")]
    Unsigned,
    #[error("the backup's manifest does not match its keyed digest: the archive was changed after it was written, or the key is not the one it was taken with")]
    Mismatch,
}

impl BackupKey {
    /// The key from `bytes` (an environment variable's value or a key file's contents,
    /// surrounding whitespace trimmed), named `from` in errors.
    pub fn new(bytes: &[u8], from: &str) -> Result<BackupKey, KeyError> {
        let trimmed = bytes.trim_ascii();
        if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&trimmed.len()) {
            return Err(KeyError::Length { from: from.to_string(), len: trimmed.len() });
        }
        Ok(BackupKey(trimmed.to_vec()))
    }

    fn mac(&self) -> hmac::Hmac<sha2::Sha256> {
        use hmac::Mac;
        hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length")
    }

    /// The keyed digest of a manifest's bytes, as written to [`MANIFEST_MAC`] (hex).
    pub fn sign(&self, manifest: &[u8]) -> String {
        use hmac::Mac;
        let mut m = self.mac();
        m.update(manifest);
        to_hex(&m.finalize().into_bytes())
    }

    /// Checks a manifest's bytes against its digest file's text (None: no digest file),
    /// in constant time.
    pub fn verify(&self, manifest: &[u8], digest: Option<&str>) -> Result<(), KeyError> {
        use hmac::Mac;
        let digest = digest.ok_or(KeyError::Unsigned)?;
        let tag = from_hex(digest.trim()).map_err(|_| KeyError::Mismatch)?;
        let mut m = self.mac();
        m.update(manifest);
        m.verify_slice(&tag).map_err(|_| KeyError::Mismatch)
    }
}

/// Lowercase hex of `bytes` (checksums; blobs in CQL's JSON are `0x` and this).
pub fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Bytes of a hex string (either case; an optional `0x` prefix, as CQL's JSON writes blobs).
pub fn from_hex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.strip_prefix("0x").unwrap_or(s);
    if !s.len().is_multiple_of(2) {
        return Err("a hex blob has an odd number of digits".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| format!("not hex: {:?}", &s[i..i + 2])))
        .collect()
}

/// A table row (CQL's JSON of it) cut at `t0` by the table's role: Some(row) to keep
/// (rewritten when part of it goes), None to leave out. `Skipped` roles keep nothing.
pub fn cut_row(role: Role, row: &str, t0: i64) -> Result<Option<String>, String> {
    match role {
        Role::Control => Ok(Some(row.to_string())),
        Role::Skipped(_) => Ok(None),
        Role::Cut { column } => {
            let v: serde_json::Value = serde_json::from_str(row).map_err(|e| format!("row is not JSON: {e}"))?;
            Ok(keep_state(v.get(column).and_then(serde_json::Value::as_i64), t0).then(|| row.to_string()))
        }
        Role::Finished { column, packed } => {
            let mut v: serde_json::Value = serde_json::from_str(row).map_err(|e| format!("row is not JSON: {e}"))?;
            let Some(blob) = v.get(column).and_then(serde_json::Value::as_str) else { return Ok(None) };
            let blob = from_hex(blob)?;
            match cut_finished(&blob, packed, t0)? {
                None => Ok(None),
                Some(kept) if kept == blob => Ok(Some(row.to_string())),
                Some(kept) => {
                    v[column] = serde_json::Value::String(format!("0x{}", to_hex(&kept)));
                    Ok(Some(v.to_string()))
                }
            }
        }
    }
}

/// One file of a backup, as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub name: String,
    /// Rows (tables) or records (topics) in it.
    pub items: u64,
    pub bytes: u64,
    /// SHA-256 of the file's bytes, lowercase hex.
    pub sha256: String,
}

/// The offsets a topic partition's copy covers: `[from, to)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Range {
    pub from: i64,
    pub to: i64,
}

/// A backup's manifest: what was copied, from where, and the cut.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    /// Unique per backup: what a restore's bookkeeping is keyed by.
    pub backup_id: String,
    /// The cut (ms since the epoch).
    pub t0: i64,
    pub results_window_ms: i64,
    pub topic_prefix: String,
    pub keyspace: String,
    /// Table files, by table.
    pub tables: BTreeMap<String, FileEntry>,
    /// Topic files, by topic then partition, with the offsets they cover.
    pub topics: BTreeMap<String, BTreeMap<i32, (Range, FileEntry)>>,
    /// Consumer groups whose place is carried over, by group, topic and partition: the
    /// offset in the restored partition where the group goes on (what it had consumed at
    /// the cut, counted in copied records).
    #[serde(default)]
    pub consumer_offsets: BTreeMap<String, BTreeMap<String, BTreeMap<i32, i64>>>,
    /// When the backup started and finished (ms): its duration.
    pub started_at: i64,
    pub finished_at: i64,
}

impl Manifest {
    /// Every file's entry (tables, then topic partitions).
    pub fn files(&self) -> impl Iterator<Item = &FileEntry> {
        self.tables.values().chain(self.topics.values().flat_map(|p| p.values().map(|(_, f)| f)))
    }

    /// Checks a manifest read from disk; the error says what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.version != MANIFEST_VERSION {
            return Err(format!(
                "backup manifest version {} is not {MANIFEST_VERSION}: restore it with the fairway release that wrote it",
                self.version
            ));
        }
        Ok(())
    }

    /// Checks everything a restore would write from this manifest, before anything is
    /// written: the backup id; every table one a backup copies (in [`TABLES`], not
    /// skipped) and its file the one a backup names for it ([`table_file`]); every topic
    /// one of `topics` (the topics a backup of this deployment copies) and each partition's
    /// file its [`topic_file`]; every carried group one of `groups`, on a topic of the
    /// manifest, at offsets that are not negative. The file names are then relative paths
    /// of known shapes, with no `..`, root or separator of their own.
    pub fn check_contents(&self, topics: &[String], groups: &[String]) -> Result<(), String> {
        let id_ok = !self.backup_id.is_empty()
            && self.backup_id.len() <= 64
            && self.backup_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !id_ok {
            return Err(format!("backup id {:?} is not 1 to 64 of A-Z a-z 0-9 - _", self.backup_id));
        }
        for (table, f) in &self.tables {
            match role_of(table) {
                Some(Role::Skipped(why)) => {
                    return Err(format!(
                        "table {table:?} is never in a backup ({why}): the archive is not one fairway wrote"
                    ))
                }
                None => {
                    return Err(format!(
                        "table {table:?} is not one a backup copies: the archive is not one fairway wrote"
                    ))
                }
                Some(_) => {}
            }
            if f.name != table_file(table) {
                return Err(format!("table {table}'s file {:?} is not {:?}", f.name, table_file(table)));
            }
        }
        for (topic, parts) in &self.topics {
            if !valid_topic(topic) || !topics.contains(topic) {
                return Err(format!(
                    "topic {topic:?} is not one a backup of this deployment copies ({})",
                    topics.join(", ")
                ));
            }
            for (partition, (range, f)) in parts {
                if !(0..=MAX_PARTITION).contains(partition) || range.from < 0 || range.to < range.from {
                    return Err(format!(
                        "topic {topic} partition {partition} [{}, {}) is not a partition's range",
                        range.from, range.to
                    ));
                }
                if f.name != topic_file(topic, *partition) {
                    return Err(format!(
                        "topic {topic} partition {partition}'s file {:?} is not {:?}",
                        f.name,
                        topic_file(topic, *partition)
                    ));
                }
            }
        }
        for (group, by_topic) in &self.consumer_offsets {
            if !groups.contains(group) {
                return Err(format!(
                    "consumer group {group:?} is not one a restore carries over ({})",
                    groups.join(", ")
                ));
            }
            for (topic, offsets) in by_topic {
                if !self.topics.contains_key(topic) {
                    return Err(format!(
                        "consumer group {group} names topic {topic:?}, which the backup does not hold"
                    ));
                }
                if offsets.iter().any(|(p, o)| !(0..=MAX_PARTITION).contains(p) || *o < 0) {
                    return Err(format!("consumer group {group} has a negative partition or offset on {topic}"));
                }
            }
        }
        Ok(())
    }
}

/// Highest partition number a manifest may name.
pub const MAX_PARTITION: i32 = 100_000;

/// The file holding a table's rows, relative to the backup directory.
pub fn table_file(table: &str) -> String {
    format!("tables/{table}.ndjson")
}

/// The file holding a topic partition's records, relative to the backup directory.
pub fn topic_file(topic: &str, partition: i32) -> String {
    format!("topics/{topic}/{partition}.rec")
}

/// A Kafka topic name: 1 to 249 of `A-Z a-z 0-9 . _ -`, not `.` or `..`.
pub fn valid_topic(name: &str) -> bool {
    (1..=249).contains(&name.len())
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A topic record as a backup keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp: Option<i64>,
    pub headers: Vec<(String, Vec<u8>)>,
}

/// Largest framed record read back (a corrupt length is refused, not allocated).
pub const RECORD_MAX: usize = 64 * 1024 * 1024;

fn put_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        Some(b) => {
            out.extend_from_slice(&(b.len() as u32).to_be_bytes());
            out.extend_from_slice(b);
        }
        None => out.extend_from_slice(&u32::MAX.to_be_bytes()),
    }
}

/// The record framed: its length (u32, big-endian), then key, value (each a u32 length,
/// `u32::MAX` for none, and the bytes), the timestamp (i64, `i64::MIN` for none), the
/// header count (u32) and each header's name and value.
pub fn frame(r: &Record) -> Vec<u8> {
    let mut body = Vec::new();
    put_bytes(&mut body, r.key.as_deref());
    put_bytes(&mut body, r.value.as_deref());
    body.extend_from_slice(&r.timestamp.unwrap_or(i64::MIN).to_be_bytes());
    body.extend_from_slice(&(r.headers.len() as u32).to_be_bytes());
    for (k, v) in &r.headers {
        put_bytes(&mut body, Some(k.as_bytes()));
        put_bytes(&mut body, Some(v));
    }
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("a backup record is truncated: the file is damaged (its checksum says so too)".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn bytes(&mut self) -> Result<Option<Vec<u8>>, String> {
        let n = self.u32()?;
        if n == u32::MAX {
            return Ok(None);
        }
        Ok(Some(self.take(n as usize)?.to_vec()))
    }
}

/// A record's body (what follows its length in [`frame`]) back.
pub fn unframe(body: &[u8]) -> Result<Record, String> {
    let mut c = Cursor(body);
    let key = c.bytes()?;
    let value = c.bytes()?;
    let ts = i64::from_be_bytes(c.take(8)?.try_into().expect("8 bytes"));
    let n = c.u32()?;
    let mut headers = Vec::new();
    for _ in 0..n {
        let k = c.bytes()?.unwrap_or_default();
        let k = String::from_utf8(k).map_err(|_| "a backup record's header name is not UTF-8".to_string())?;
        headers.push((k, c.bytes()?.unwrap_or_default()));
    }
    if !c.0.is_empty() {
        return Err("a backup record has trailing bytes: the file is damaged".into());
    }
    Ok(Record { key, value, timestamp: (ts != i64::MIN).then_some(ts), headers })
}

/// Parses a window such as `24h`, `90m`, `3600s` or `7d` into milliseconds.
pub fn parse_window(s: &str) -> Result<i64, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: i64 = num.parse().map_err(|_| format!("window {s:?}: expected a number and a unit, e.g. 24h"))?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("window {s:?}: unit must be ms, s, m, h or d, e.g. 24h")),
    };
    n.checked_mul(ms).ok_or_else(|| format!("window {s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str) -> FileEntry {
        FileEntry { name: name.into(), items: 1, bytes: 1, sha256: String::new() }
    }

    fn manifest() -> Manifest {
        let mut m = Manifest {
            version: MANIFEST_VERSION,
            backup_id: "b-1".into(),
            t0: 1,
            results_window_ms: 1,
            topic_prefix: "p.".into(),
            keyspace: "ks".into(),
            tables: BTreeMap::new(),
            topics: BTreeMap::new(),
            consumer_offsets: BTreeMap::new(),
            started_at: 0,
            finished_at: 1,
        };
        m.tables.insert("api_keys".into(), entry("tables/api_keys.ndjson"));
        m.topics.insert(
            "p.results".into(),
            BTreeMap::from([(0, (Range { from: 0, to: 1 }, entry("topics/p.results/0.rec")))]),
        );
        m.consumer_offsets
            .insert("p.webhooks".into(), BTreeMap::from([("p.results".into(), BTreeMap::from([(0, 1)]))]));
        m
    }

    #[test]
    fn a_hostile_manifest_is_refused_before_anything_is_written() {
        let (topics, groups) = (vec!["p.results".to_string()], vec!["p.webhooks".to_string()]);
        manifest().check_contents(&topics, &groups).unwrap();
        let refused = |change: &dyn Fn(&mut Manifest), says: &str| {
            let mut m = manifest();
            change(&mut m);
            let e = m.check_contents(&topics, &groups).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        };
        // Tables a backup never holds, or no table at all: never CQL.
        refused(&|m| drop(m.tables.insert("restores".into(), entry("tables/restores.ndjson"))), "never in a backup");
        refused(
            &|m| drop(m.tables.insert("region_states".into(), entry("tables/region_states.ndjson"))),
            "never in a backup",
        );
        refused(
            &|m| drop(m.tables.insert("x JSON ?; DROP KEYSPACE ks; --".into(), entry("t"))),
            "not one a backup copies",
        );
        // Files outside the archive.
        refused(
            &|m| m.tables.get_mut("api_keys").unwrap().name = "../../etc/shadow".into(),
            "is not \"tables/api_keys.ndjson\"",
        );
        refused(&|m| m.tables.get_mut("api_keys").unwrap().name = "/etc/shadow".into(), "is not");
        refused(
            &|m| m.topics.get_mut("p.results").unwrap().get_mut(&0).unwrap().1.name = "topics/../../x".into(),
            "is not \"topics/p.results/0.rec\"",
        );
        // Topics and groups of no backup of this deployment.
        refused(&|m| drop(m.topics.insert("../x".into(), BTreeMap::new())), "not one a backup of this deployment");
        refused(
            &|m| drop(m.topics.insert("other.jobs".into(), BTreeMap::new())),
            "not one a backup of this deployment",
        );
        refused(&|m| drop(m.consumer_offsets.insert("p.workers".into(), BTreeMap::new())), "not one a restore carries");
        refused(
            &|m| drop(m.consumer_offsets.get_mut("p.webhooks").unwrap().insert("p.dlq".into(), BTreeMap::new())),
            "does not hold",
        );
        refused(&|m| m.backup_id = "../x".into(), "backup id");
        refused(
            &|m| m.topics.get_mut("p.results").unwrap().get_mut(&0).unwrap().0 = Range { from: 5, to: 1 },
            "not a partition's range",
        );
        assert!(valid_topic("p.jobs.short") && !valid_topic("..") && !valid_topic("a/b") && !valid_topic(""));
    }
    use crate::core::finished::{entries, open, packs, FinishedRecord};
    use proptest::prelude::*;

    /// Every table the schema creates has a declared role: a table added without a line
    /// here fails this test (and would otherwise be silently left out of backups).
    #[test]
    fn every_schema_table_has_a_backup_role() {
        let missing: Vec<&str> =
            crate::store::TABLES.iter().map(|(t, _)| *t).filter(|t| role_of(t).is_none()).collect();
        assert!(missing.is_empty(), "tables without a backup role in core::dr::TABLES: {missing:?}");
        for (t, _) in TABLES {
            assert!(crate::store::TABLES.iter().any(|(s, _)| s == t), "{t} is declared but not in the schema");
        }
    }

    #[test]
    fn a_row_keeps_its_remaining_ttl_apart() {
        let (row, ttl) = split_ttl(r#"{"tenant": "a", "key": "k", "[ttl]": 3600}"#).unwrap();
        let row: serde_json::Value = serde_json::from_str(&row).unwrap();
        assert_eq!((row, ttl), (serde_json::json!({"key": "k", "tenant": "a"}), Some(3600)));
        let (_, ttl) = split_ttl(r#"{"tenant": "a", "[ttl]": null}"#).unwrap();
        assert_eq!(ttl, None, "a cell without a TTL");
        assert_eq!(split_ttl("{}").unwrap(), ("{}".to_string(), None));
        for (t, _) in TTL_COLUMNS {
            assert!(matches!(role_of(t), Some(r) if !matches!(r, Role::Skipped(_))), "{t} is copied");
        }
    }

    #[test]
    fn windows_parse_with_units_and_refuse_the_rest() {
        assert_eq!(parse_window("24h"), Ok(86_400_000));
        assert_eq!(parse_window("90m"), Ok(5_400_000));
        assert_eq!(parse_window("7d"), Ok(604_800_000));
        assert!(parse_window("24").unwrap_err().contains("unit"));
        assert!(parse_window("h").unwrap_err().contains("number"));
    }

    fn v7_at(ms: u64, rand: u128) -> String {
        let bits = (u128::from(ms) << 80) | (0x7u128 << 76) | (rand & 0x0fff_3fff_ffff_ffff_ffff) | (0b10u128 << 62);
        uuid::Uuid::from_u128(bits).to_string()
    }

    fn record(updated_at: i64) -> Vec<u8> {
        let mut r = FinishedRecord::queued("t", "y", "short", 0, updated_at);
        r.status = "succeeded".into();
        r.updated_at = updated_at;
        r.encode(Some(b"out"))
    }

    #[test]
    fn a_backup_key_is_bounded_and_never_shown() {
        let e = BackupKey::new(b"short\n", "FAIRWAY_BACKUP_KEY").unwrap_err();
        assert_eq!(e, KeyError::Length { from: "FAIRWAY_BACKUP_KEY".into(), len: 5 });
        assert!(!e.to_string().contains("short"), "{e}");
        let k = BackupKey::new(b"  0123456789abcdef0123456789abcdef\n", "a key file").unwrap();
        assert_eq!(format!("{k:?}"), "BackupKey(<32 bytes>)");
        assert!(BackupKey::new(&[b'k'; MAX_KEY_BYTES + 1], "f").is_err());
        let m = b"{\"version\":1}";
        let sig = k.sign(m);
        assert_eq!(sig.len(), 64);
        assert_eq!(k.verify(m, Some(&sig)), Ok(()));
        assert_eq!(k.verify(m, None), Err(KeyError::Unsigned));
        assert_eq!(k.verify(m, Some("zz")), Err(KeyError::Mismatch));
        // HMAC-SHA256: RFC 4231 test case 6 (a 131-byte key).
        let rfc = BackupKey::new(&[0xaa; 131], "rfc").unwrap();
        assert_eq!(
            rfc.sign(b"Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    proptest! {
        /// A manifest changed anywhere, or checked with another key, is refused; the
        /// signed bytes with the signing key pass.
        #[test]
        fn a_keyed_manifest_refuses_any_change_and_any_other_key(
            manifest in proptest::collection::vec(any::<u8>(), 1..400),
            at in any::<prop::sample::Index>(),
            flip in 1u8..=255,
            key in proptest::collection::vec(any::<u8>(), MIN_KEY_BYTES..80),
            other in proptest::collection::vec(any::<u8>(), MIN_KEY_BYTES..80),
        ) {
            let trim = |k: Vec<u8>| { let mut k = k; for b in k.iter_mut() { *b = b'!' + (*b % 90); } k };
            let (key, other) = (trim(key), trim(other));
            let k = BackupKey::new(&key, "k").unwrap();
            let sig = k.sign(&manifest);
            prop_assert_eq!(k.verify(&manifest, Some(&sig)), Ok(()));
            let mut changed = manifest.clone();
            let i = at.index(changed.len());
            changed[i] ^= flip;
            prop_assert_eq!(k.verify(&changed, Some(&sig)), Err(KeyError::Mismatch));
            if other != key {
                let o = BackupKey::new(&other, "o").unwrap();
                prop_assert_eq!(o.verify(&manifest, Some(&sig)), Err(KeyError::Mismatch));
            }
        }
    }

    proptest! {
        /// A record, framed then read back, is the same record.
        #[test]
        fn framed_records_read_back(
            key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
            value in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)),
            timestamp in proptest::option::of(0i64..i64::MAX),
            headers in proptest::collection::vec(("[a-z]{0,8}", proptest::collection::vec(any::<u8>(), 0..20)), 0..4),
        ) {
            let r = Record { key, value, timestamp, headers };
            let framed = frame(&r);
            let len = u32::from_be_bytes(framed[..4].try_into().unwrap()) as usize;
            prop_assert_eq!(len, framed.len() - 4);
            prop_assert_eq!(unframe(&framed[4..]).unwrap(), r);
            // Damage is an error, never a different record.
            prop_assert!(unframe(&framed[4..framed.len() - 1]).is_err());
        }

        /// A pack cut at t0 keeps exactly its records written at or before t0, each
        /// unchanged, and nothing at all when none was.
        #[test]
        fn a_cut_pack_keeps_exactly_the_records_written_before_the_cut(
            times in proptest::collection::vec(0i64..100, 1..30),
            t0 in 0i64..100,
        ) {
            let entries_in: Vec<(String, Vec<u8>)> =
                times.iter().enumerate().map(|(i, at)| (v7_at(1_700_000_000_000, i as u128 * 8), record(*at))).collect();
            let (_, body, held) = packs(&entries_in).into_iter().next().unwrap();
            prop_assume!(held.len() == entries_in.len());
            let cut = cut_finished(&body, true, t0).unwrap();
            let want: Vec<&(String, Vec<u8>)> =
                entries_in.iter().zip(&times).filter(|(_, at)| **at <= t0).map(|(e, _)| e).collect();
            match cut {
                None => prop_assert!(want.is_empty()),
                Some(kept) => {
                    let plain = open(&kept).unwrap();
                    let got = entries(&plain).unwrap();
                    prop_assert_eq!(got.len(), want.len());
                    for ((id, rec), w) in got.iter().zip(want) {
                        prop_assert_eq!(*id, w.0.as_str());
                        prop_assert_eq!(*rec, w.1.as_slice());
                    }
                }
            }
        }

        /// States and results use one rule: a state written at `at` is kept exactly when a
        /// result finished at `at` (inside the window) is, so a kept finished state always
        /// has its result, and a dropped one none (its job runs again).
        #[test]
        fn states_and_results_are_cut_at_the_same_instant(at in 0i64..1000, t0 in 0i64..1000) {
            prop_assert_eq!(keep_state(Some(at), t0), keep_result(at, t0, i64::MAX));
            prop_assert_eq!(keep_state(Some(at), t0), keep_event(Some(at), t0, i64::MAX));
        }
    }

    #[test]
    fn rows_are_cut_by_their_role() {
        let job = |at: i64| format!(r#"{{"job_id": "j", "status": "succeeded", "updated_at": {at}}}"#);
        let cut = Role::Cut { column: "updated_at" };
        assert_eq!(cut_row(cut, &job(5), 5).unwrap(), Some(job(5)));
        assert_eq!(cut_row(cut, &job(6), 5).unwrap(), None, "written after the cut: runs again");
        assert!(cut_row(cut, r#"{"job_id": "j", "updated_at": null}"#, 5).unwrap().is_some());
        assert_eq!(cut_row(Role::Control, "{}", 5).unwrap(), Some("{}".to_string()));
        assert_eq!(cut_row(Role::Skipped("x"), "{}", 5).unwrap(), None);
        let fin = |at: i64| format!(r#"{{"bucket": 1, "job_id": "j", "record": "0x{}"}}"#, to_hex(&record(at)));
        let role = Role::Finished { column: "record", packed: false };
        assert_eq!(cut_row(role, &fin(5), 5).unwrap(), Some(fin(5)));
        assert_eq!(cut_row(role, &fin(6), 5).unwrap(), None);
        assert!(cut_row(role, r#"{"record": "0xzz"}"#, 5).is_err(), "a damaged blob is an error, not a dropped row");
        assert_eq!(from_hex(&to_hex(&[0, 1, 254, 255])).unwrap(), vec![0, 1, 254, 255]);
    }

    #[test]
    fn a_single_record_is_kept_or_dropped_whole() {
        assert_eq!(cut_finished(&record(5), false, 5).unwrap(), Some(record(5)));
        assert_eq!(cut_finished(&record(6), false, 5).unwrap(), None);
        assert!(cut_finished(b"", false, 5).is_err());
        assert!(keep_state(None, 0), "a bare cancel flag has no write time and is kept");
        assert!(!keep_result(10, 100, 50), "older than the window");
    }
}
