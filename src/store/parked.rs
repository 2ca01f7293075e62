//! Prepared statements of jobs parked outside the pool topics: jobs scheduled for later
//! (the `scheduled_jobs` table and its bucket index) and jobs handed off by a draining
//! worker (their row's status and hand-off counts). Prepared once when the store opens:
//! an unprepared statement with values costs the database a prepare per call.

use super::{prepare_statement, StoreError};
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

pub(super) struct Parked {
    pub index_scheduled_bucket: PreparedStatement,
    pub put_scheduled: PreparedStatement,
    pub scheduled_due: PreparedStatement,
    pub scheduled_buckets: PreparedStatement,
    pub delete_scheduled_bucket: PreparedStatement,
    pub delete_scheduled: PreparedStatement,
    pub claim_hand_off: PreparedStatement,
    pub claim_take_over: PreparedStatement,
    pub put_handoff_count: PreparedStatement,
    pub handoff_count: PreparedStatement,
    pub mark_handed_off: PreparedStatement,
    pub mark_running: PreparedStatement,
    pub mark_running_rerun: PreparedStatement,
    pub mark_running_seen: PreparedStatement,
    pub put_state_if_marked: PreparedStatement,
}

/// The condition of a running mark: the row is not terminal (a row that does not exist,
/// or has no status, passes: `!=` holds against null).
const NOT_TERMINAL: &str =
    "status != 'succeeded' AND status != 'failed' AND status != 'cancelled' AND status != 'expired'";

/// A job's running mark, without its condition: (tenant, job_type, pool, attempts,
/// crash_count, generation, submitted_at, started_at, worker, updated_at, job_id).
fn running_update(ks: &str, ttl: i32) -> String {
    format!(
        "UPDATE {ks}.jobs USING TTL {ttl} SET tenant = ?, job_type = ?, pool = ?, status = 'running', attempts = ?, \
         crash_count = ?, generation = ?, submitted_at = ?, started_at = ?, worker = ?, updated_at = ? WHERE job_id = ?"
    )
}

impl Parked {
    /// Prepares every statement (`ttl`: seconds of a job row's writes).
    pub async fn prepare(session: &Session, ks: &str, ttl: i32) -> Result<Parked, StoreError> {
        let prep = |cql: String, what: &'static str| prepare_statement(session, cql, what, false);
        Ok(Parked {
            index_scheduled_bucket: prep(
                format!("INSERT INTO {ks}.scheduled_buckets (scope, bucket) VALUES (?, ?)"),
                "prepare index scheduled bucket",
            )
            .await?,
            put_scheduled: prep(
                format!(
                    "INSERT INTO {ks}.scheduled_jobs (scope, bucket, execute_at, job_id, job) VALUES (?, ?, ?, ?, ?)"
                ),
                "prepare put scheduled",
            )
            .await?,
            scheduled_due: prep(
                format!(
                    "SELECT execute_at, job_id, job FROM {ks}.scheduled_jobs \
                     WHERE scope = ? AND bucket = ? AND execute_at <= ? LIMIT ?"
                ),
                "prepare read scheduled",
            )
            .await?,
            scheduled_buckets: prep(
                format!(
                    "SELECT bucket FROM {ks}.scheduled_buckets WHERE scope = ? AND bucket >= ? AND bucket <= ? LIMIT ?"
                ),
                "prepare read scheduled buckets",
            )
            .await?,
            delete_scheduled_bucket: prep(
                format!("DELETE FROM {ks}.scheduled_buckets WHERE scope = ? AND bucket = ?"),
                "prepare delete scheduled bucket",
            )
            .await?,
            delete_scheduled: prep(
                format!(
                    "DELETE FROM {ks}.scheduled_jobs WHERE scope = ? AND bucket = ? AND execute_at = ? AND job_id = ?"
                ),
                "prepare delete scheduled",
            )
            .await?,
            claim_hand_off: prep(
                format!(
                    "UPDATE {ks}.jobs USING TTL {ttl} SET status = 'running', worker = ?, updated_at = ? \
                     WHERE job_id = ? IF status = 'handed_off'"
                ),
                "prepare claim hand-off",
            )
            .await?,
            claim_take_over: prep(
                format!(
                    "UPDATE {ks}.jobs USING TTL {ttl} SET worker = ?, updated_at = ? \
                     WHERE job_id = ? IF status = 'running' AND worker = ? AND updated_at = ?"
                ),
                "prepare claim take-over",
            )
            .await?,
            put_handoff_count: prep(
                format!(
                    "INSERT INTO {ks}.job_handoffs (job_id, generation, handoff_count) VALUES (?, ?, ?) USING TTL {ttl}"
                ),
                "prepare put hand-off count",
            )
            .await?,
            handoff_count: prep(
                format!("SELECT handoff_count FROM {ks}.job_handoffs WHERE job_id = ? AND generation = ?"),
                "prepare read hand-off count",
            )
            .await?,
            mark_handed_off: prep(
                format!(
                    "UPDATE {ks}.jobs SET status = 'handed_off', updated_at = ? \
                     WHERE job_id = ? IF worker = ? AND status = 'running'"
                ),
                "prepare mark hand-off",
            )
            .await?,
            mark_running: prep(format!("{} IF {NOT_TERMINAL}", running_update(ks, ttl)), "prepare mark running")
                .await?,
            mark_running_seen: prep(
                format!("{} IF {NOT_TERMINAL} AND worker = ? AND updated_at = ?", running_update(ks, ttl)),
                "prepare mark running (as seen)",
            )
            .await?,
            mark_running_rerun: prep(
                format!("{} IF generation < ?", running_update(ks, ttl)),
                "prepare mark running (rerun)",
            )
            .await?,
            put_state_if_marked: prep(
                format!(
                    "UPDATE {ks}.jobs USING TTL {ttl} SET status = ?, attempts = ?, crash_count = ?, started_at = ?, \
                     finished_at = ?, error = ?, failure_class = ?, updated_at = ? \
                     WHERE job_id = ? IF status = 'running' AND worker = ? AND attempts = ? AND crash_count = ?"
                ),
                "prepare put state if marked",
            )
            .await?,
        })
    }
}
