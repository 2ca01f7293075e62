//! Liveness of running jobs: heartbeats (with the cancellation round trip) and the
//! reaper. Heartbeats replace visibility timeouts: a running job is alive while its
//! worker keeps writing its heartbeat row (TTL about three intervals); the reaper (one
//! leader at a time, by LWT lease) re-dispatches jobs whose heartbeat lapsed as worker
//! crashes, which never use up an attempt.

use super::route::Origin;
use super::Shared;
use crate::model::{FailureClass, Pool};
use crate::{codec, kafka, metrics as m, now_ms};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Writes the heartbeats of this pool's running jobs every interval, in batches, and
/// reads back their cancellation flags; aborts jobs that ignore a cancellation for
/// longer than `worker.cancel_grace`.
pub async fn heartbeat_loop(sh: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let interval = sh.cfg.pool(sh.pool).heartbeat_interval;
    let ttl = sh.heartbeat_ttl_secs();
    let grace = sh.cfg.worker.cancel_grace;
    let mut cancel_seen: HashMap<String, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(interval);
    // Age of this worker's newest successful heartbeat write: grows when writes fail.
    let mut last_ok = Instant::now();
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        let running: Vec<(String, Arc<crate::handlers::JobLive>)> =
            sh.running.lock().map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
        cancel_seen.retain(|id, _| running.iter().any(|(r, _)| r == id));
        if running.is_empty() {
            last_ok = Instant::now();
            metrics::gauge!(m::HEARTBEAT_AGE_SECONDS, "pool" => sh.pool.as_str()).set(0.0);
            continue;
        }
        let now = now_ms();
        for chunk in running.chunks(100) {
            let beats: Vec<(String, f64, String)> = chunk
                .iter()
                .map(|(id, live)| {
                    let (p, msg) = live.progress();
                    (id.clone(), p, msg)
                })
                .collect();
            match sh.store.put_heartbeats(&beats, &sh.worker_id, now, ttl).await {
                Ok(()) => {
                    last_ok = Instant::now();
                    metrics::counter!(m::HEARTBEATS, "pool" => sh.pool.as_str()).increment(beats.len() as u64)
                }
                Err(e) => tracing::warn!(pool = sh.pool.as_str(), error = %e, "heartbeat write failed"),
            }
            let ids: Vec<String> = chunk.iter().map(|(id, _)| id.clone()).collect();
            match sh.store.cancel_requested(&ids).await {
                Ok(cancelled) => {
                    for id in cancelled {
                        if let Some((_, live)) = chunk.iter().find(|(r, _)| *r == id) {
                            if !live.is_cancelled() {
                                metrics::counter!(m::CANCELLATIONS, "pool" => sh.pool.as_str()).increment(1);
                                live.cancel();
                            }
                            let first = *cancel_seen.entry(id.clone()).or_insert_with(Instant::now);
                            if first.elapsed() >= grace {
                                tracing::warn!(job_id = %id, "cancelled job ignored the request past the grace period; aborting");
                                live.abort();
                            }
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cancel flags read failed"),
            }
        }
        metrics::gauge!(m::HEARTBEAT_AGE_SECONDS, "pool" => sh.pool.as_str()).set(last_ok.elapsed().as_secs_f64());
    }
}

/// How long a heartbeat may be missing before the reaper re-dispatches the job. Longer
/// than a consumer-group session, so a dead worker's jobs are normally taken over by
/// the partition's new owner first; the reaper catches hung workers.
fn reap_after(sh: &Shared, pool: Pool) -> Duration {
    let hb = sh.cfg.pool(pool).heartbeat_interval * 3;
    hb.max(sh.cfg.kafka.session_timeout * 2)
}

pub async fn reaper_loop(sh: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    const LEASE_SECS: i32 = 15;
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        match sh.store.lease("reaper", &sh.worker_id, LEASE_SECS, now_ms()).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "reaper lease");
                continue;
            }
        }
        for pool in Pool::ALL {
            if let Err(e) = reap_pool(&sh, pool).await {
                tracing::warn!(pool = pool.as_str(), error = %e, "reaper pass failed");
            }
        }
    }
}

async fn reap_pool(sh: &Shared, pool: Pool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let limit = reap_after(sh, pool).as_millis() as i64;
    let now = now_ms();
    for (job_id, worker, started_at, blob) in sh.store.running_jobs(pool.as_str()).await? {
        if now - started_at < limit {
            continue;
        }
        let hb = sh.store.heartbeat(&job_id).await?;
        if hb.and_then(|h| h.at).is_some_and(|at| now - at < limit) {
            continue;
        }
        // Still running per its state row? (It may have finished and only the index
        // entry is left behind.)
        let row = sh.store.job(&job_id).await?;
        if row.as_ref().is_none_or(|r| r.status.as_deref() != Some("running")) {
            sh.store.delete_running_job(pool.as_str(), &job_id).await?;
            continue;
        }
        let mut job = match codec::decode_job(&blob) {
            Ok(job) => job,
            Err(e) => {
                // Never dropped: dead-lettered with its bytes and the reason (kept in the
                // index for the next round if the dead letter is not acknowledged).
                let origin =
                    Origin { topic: "store:running_index".into(), partition: -1, offset: started_at, submitted: false };
                if super::durable::dead_letter_undecodable(&sh.cfg, &sh.producer, blob, &e, &origin).await.is_yes() {
                    sh.store.delete_running_job(pool.as_str(), &job_id).await?;
                }
                continue;
            }
        };
        job.crash_count = job.crash_count.max(row.and_then(|r| r.crash_count).unwrap_or(0) + 1);
        job.not_before = Some(now);
        job.last_failure_class = Some(FailureClass::WorkerCrash);
        job.last_error = Some(format!("heartbeat of worker {worker} lapsed"));
        let bytes = codec::encode_job(&job)?;
        let topic = sh.cfg.retry_topic(FailureClass::WorkerCrash);
        kafka::send_with_headers(&sh.producer, &topic, &job.tenant, &bytes, &kafka::trace_headers(&job)).await?;
        sh.store.delete_running_job(pool.as_str(), &job_id).await?;
        metrics::counter!(m::REAPED, "pool" => pool.as_str()).increment(1);
        tracing::warn!(%job_id, %worker, pool = pool.as_str(), "heartbeat lapsed; re-dispatched as worker crash");
    }
    Ok(())
}
