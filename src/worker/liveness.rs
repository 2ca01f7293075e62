//! Liveness of running jobs: heartbeats (with the cancellation round trip) and the
//! reaper. Heartbeats replace visibility timeouts: a running job is alive while its
//! worker keeps writing its heartbeat row (TTL about three intervals); the reaper (one
//! leader at a time, by LWT lease) re-dispatches jobs whose heartbeat lapsed as worker
//! crashes, which never use up an attempt.
//!
//! A run's heartbeats are its lease: another copy takes the job over once the newest
//! heartbeat it reads is [`lapse`] old (three intervals, on the reader's clock). A run
//! whose heartbeats the store has not acknowledged for [`fence_after`] (two intervals,
//! counted from the send of the newest acknowledged one) stops itself and publishes
//! nothing ([`fence_watch`]), so it has ended before any take-over can start, as long as
//! the workers' clocks differ by less than one interval. Its copy is taken in again and
//! follows whatever the store then shows.

use super::route::Origin;
use super::{RouteContext, Shared};
use crate::model::{FailureClass, Pool};
use crate::{codec, kafka, metrics as m, now_ms};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How old a running job's newest heartbeat must be before another copy takes the job
/// over (`worker::check`): three heartbeat intervals.
pub fn lapse(interval: Duration) -> Duration {
    interval.saturating_mul(3)
}

/// Whether a running row's run counts as alive at `now` (epoch ms): its newest heartbeat
/// or the row's last write (a claim, a mark) is younger than the lapse. The row's write
/// counts because a claim lands before its claimer's first heartbeat: a copy that reads
/// the claimed row in between would else see the old run's lapsed heartbeat and take
/// the job over from a worker that just started it (the fleet simulator's seed 4411:
/// two runs at once for 16 s).
pub fn run_alive(heartbeat_at: Option<i64>, row_written_at: Option<i64>, now: i64, lapse: Duration) -> bool {
    let lapse = i64::try_from(lapse.as_millis()).unwrap_or(i64::MAX);
    [heartbeat_at, row_written_at].into_iter().flatten().any(|at| now.saturating_sub(at) < lapse)
}

/// How long a run goes on without an acknowledged heartbeat before it fences itself:
/// two intervals, one before [`lapse`].
pub fn fence_after(interval: Duration) -> Duration {
    interval.saturating_mul(2)
}

/// Ends (after fencing the run: `JobLive::fence`) once no heartbeat of the run has been
/// acknowledged for [`fence_after`]: a store outage or a cut from the store, or writes so
/// slow that a take-over may read the heartbeat before they land. Armed only once the run
/// wrote its running mark (before that no row exists that a take-over could act on); a
/// run without an acknowledged beat yet is looked at again each `fence_after`.
pub async fn fence_watch(live: &crate::handlers::JobLive, job_id: &str, pool: Pool, interval: Duration) {
    let after = fence_after(interval);
    loop {
        let Some(sent) = live.last_beat() else {
            tokio::time::sleep(after).await;
            continue;
        };
        // An interval too long to add (`pools.<p>.heartbeat_interval` is the operator's):
        // a lease that never lapses is never fenced either.
        let Some(at) = sent.checked_add(after) else { return std::future::pending().await };
        if tokio::time::Instant::now() < at {
            tokio::time::sleep_until(at).await;
            continue;
        }
        metrics::counter!(m::RUNS_FENCED, "pool" => pool.as_str()).increment(1);
        tracing::warn!(
            %job_id, pool = pool.as_str(), unacknowledged = ?after,
            "no heartbeat of this run was acknowledged for two intervals: it stops before another worker may take the job over, and publishes nothing"
        );
        live.fence();
        return;
    }
}

/// Writes the heartbeats of this pool's running jobs every interval, in batches, and
/// reads back their cancellation flags; aborts jobs that ignore a cancellation for
/// longer than `worker.cancel_grace`.
pub async fn heartbeat_loop(route: Arc<RouteContext>, mut shutdown: watch::Receiver<bool>) {
    let interval = route.cfg.pool(route.pool).heartbeat_interval;
    let ttl = route.heartbeat_ttl_secs();
    let grace = route.cfg.worker.cancel_grace;
    let mut cancel_seen: HashMap<String, tokio::time::Instant> = HashMap::new();
    let mut tick = tokio::time::interval(interval);
    // Age of this worker's newest successful heartbeat write: grows when writes fail.
    let mut last_ok = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        let running: Vec<(String, Arc<crate::handlers::JobLive>)> =
            route.running.lock().map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
        cancel_seen.retain(|id, _| running.iter().any(|(r, _)| r == id));
        if running.is_empty() {
            last_ok = tokio::time::Instant::now();
            metrics::gauge!(m::HEARTBEAT_AGE_SECONDS, "pool" => route.pool.as_str()).set(0.0);
            continue;
        }
        // The fence counts from `sent`, taken before the stamp: never later than what a
        // reader of the stamp counts the lease from.
        let sent = tokio::time::Instant::now();
        let now = route.clock.now_ms();
        for chunk in running.chunks(100) {
            let beats: Vec<(String, f64, String)> = chunk
                .iter()
                .map(|(id, live)| {
                    let (p, msg) = live.progress();
                    (id.clone(), p, msg)
                })
                .collect();
            match route.store.put_heartbeats(&beats, &route.worker_id, now, ttl).await {
                Ok(()) => {
                    last_ok = tokio::time::Instant::now();
                    chunk.iter().for_each(|(_, live)| live.beat_acknowledged(sent));
                    metrics::counter!(m::HEARTBEATS, "pool" => route.pool.as_str()).increment(beats.len() as u64)
                }
                Err(e) => {
                    route.store_refused(route.clock.now_ms());
                    tracing::warn!(pool = route.pool.as_str(), error = %e, "heartbeat write failed")
                }
            }
            let ids: Vec<String> = chunk.iter().map(|(id, _)| id.clone()).collect();
            match route.store.cancel_requested(&ids).await {
                Ok(cancelled) => {
                    for id in cancelled {
                        if let Some((_, live)) = chunk.iter().find(|(r, _)| *r == id) {
                            if !live.is_cancelled() {
                                metrics::counter!(m::CANCELLATIONS, "pool" => route.pool.as_str()).increment(1);
                                live.cancel();
                            }
                            let first = *cancel_seen.entry(id.clone()).or_insert_with(tokio::time::Instant::now);
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
        metrics::gauge!(m::HEARTBEAT_AGE_SECONDS, "pool" => route.pool.as_str()).set(last_ok.elapsed().as_secs_f64());
    }
}

/// How long a heartbeat may be missing before the reaper re-dispatches the job. Longer
/// than a consumer-group session, so a dead worker's jobs are normally taken over by
/// the partition's new owner first; the reaper catches hung workers.
fn reap_after(sh: &Shared, pool: Pool) -> Duration {
    let hb = lapse(sh.route.cfg.pool(pool).heartbeat_interval);
    hb.max(sh.route.cfg.kafka.session_timeout * 2)
}

/// Whether a worker may judge heartbeats lapsed at `now` (epoch ms): only once it has
/// reached the store without a refusal for `limit` since `steady_since` (its start or its
/// last refusal: `RouteContext::store_steady_since`). In a store outage heartbeats are
/// lost like every other write, so right after one every run's heartbeat looks lapsed,
/// while the workers that ran them may be alive and still retrying their terminal states
/// (results already out: `durable::OUTAGE_RETRY`). Judged at once, their jobs ran a
/// second time with a second result (`it_faults`, a rollout during a CQL restart); after
/// `limit` of steady access, a live worker has written its heartbeats and states again.
/// Used by the pre-run take-over (`check`) and the reaper.
pub fn may_judge_lapses(steady_since: i64, now: i64, limit: Duration) -> bool {
    let limit = i64::try_from(limit.as_millis()).unwrap_or(i64::MAX);
    now.saturating_sub(steady_since) >= limit
}

pub async fn reaper_loop(
    sh: Arc<Shared>,
    (store, producer): (crate::store::Store, kafka::Producer),
    mut shutdown: watch::Receiver<bool>,
) {
    const LEASE_SECS: i32 = 15;
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
        }
        match store.lease("reaper", &sh.route.worker_id, LEASE_SECS, now_ms()).await {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                sh.route.store_refused(now_ms());
                tracing::debug!(error = %e, "reaper lease");
                continue;
            }
        }
        for pool in Pool::ALL {
            if let Err(e) = reap_pool(&sh, &store, &producer, pool).await {
                tracing::warn!(pool = pool.as_str(), error = %e, "reaper pass failed");
            }
        }
    }
}

async fn reap_pool(
    sh: &Shared,
    store: &crate::store::Store,
    producer: &kafka::Producer,
    pool: Pool,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let now = now_ms();
    let after = reap_after(sh, pool);
    if !may_judge_lapses(sh.route.store_steady_since(), now, after) {
        tracing::debug!(
            pool = pool.as_str(),
            "reaper waits: it started, or the store refused a call, within the lapse"
        );
        return Ok(());
    }
    let limit = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
    for (job_id, worker, started_at, blob) in store.running_jobs(pool.as_str()).await? {
        if now - started_at < limit {
            continue;
        }
        let hb = store.heartbeat(&job_id).await?;
        if hb.and_then(|h| h.at).is_some_and(|at| now - at < limit) {
            continue;
        }
        // Still running per its state row? (It may have finished and only the index
        // entry is left behind.)
        let row = store.job(&job_id).await?;
        if row.as_ref().is_none_or(|r| r.status.as_deref() != Some("running")) {
            store.delete_running_job(pool.as_str(), &job_id).await?;
            continue;
        }
        let mut job = match codec::decode_job(&blob) {
            Ok(job) => job,
            Err(e) => {
                // Never dropped: dead-lettered with its bytes and the reason (kept in the
                // index for the next round if the dead letter is not acknowledged).
                let origin = Origin {
                    topic: "store:running_index".into(),
                    partition: -1,
                    offset: started_at,
                    submitted: false,
                    taken_again: false,
                };
                if super::durable::dead_letter_undecodable(&sh.route.cfg, producer, blob, &e, &origin).await.is_yes() {
                    store.delete_running_job(pool.as_str(), &job_id).await?;
                }
                continue;
            }
        };
        job.crash_count = job.crash_count.max(row.and_then(|r| r.crash_count).unwrap_or(0) + 1);
        job.not_before = Some(now);
        job.last_failure_class = Some(FailureClass::WorkerCrash);
        job.last_error = Some(format!("heartbeat of worker {worker} lapsed"));
        let bytes = codec::encode_job(&job)?;
        let topic = sh.route.cfg.retry_topic(FailureClass::WorkerCrash);
        kafka::send_with_headers(producer, &topic, &job.tenant, &bytes, &kafka::trace_headers(&job)).await?;
        store.delete_running_job(pool.as_str(), &job_id).await?;
        metrics::counter!(m::REAPED, "pool" => pool.as_str()).increment(1);
        tracing::warn!(%job_id, %worker, pool = pool.as_str(), "heartbeat lapsed; re-dispatched as worker crash");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handlers::JobLive;

    /// No lapse is judged until the worker has reached the store for a whole lapse since its
    /// start or the last refusal, and then it is.
    #[test]
    fn lapses_are_judged_only_after_a_whole_lapse_of_steady_store_access() {
        let limit = Duration::from_secs(20);
        assert!(!may_judge_lapses(1_000, 1_000, limit), "at the refusal itself");
        assert!(!may_judge_lapses(1_000, 20_999, limit), "1 ms short of the lapse");
        assert!(may_judge_lapses(1_000, 21_000, limit), "a whole lapse after");
        assert!(may_judge_lapses(i64::MIN, 0, limit), "no overflow on a far past");
    }

    /// Each acknowledged beat moves the fence two intervals past its send; without one
    /// for two intervals the run is fenced (and aborted), never before.
    #[tokio::test(start_paused = true)]
    async fn the_fence_falls_two_intervals_after_the_newest_acknowledged_beat() {
        let interval = Duration::from_secs(5);
        let live = std::sync::Arc::new(JobLive::default());
        let start = tokio::time::Instant::now();
        live.beat_acknowledged(start);
        let watch = tokio::spawn({
            let live = live.clone();
            async move { fence_watch(&live, "job-1", Pool::Short, interval).await }
        });
        tokio::time::sleep(Duration::from_secs(8)).await;
        live.beat_acknowledged(start + Duration::from_secs(8));
        // An older beat acknowledged late does not move the fence back.
        live.beat_acknowledged(start + Duration::from_secs(3));
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(!live.is_fenced() && !watch.is_finished(), "17 s: 9 s after the newest beat");
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        assert!(live.is_fenced(), "18.1 s: 10.1 s after it");
        assert!(watch.is_finished());
        tokio::time::timeout(Duration::from_millis(1), live.aborted()).await.expect("the run is aborted");
        assert_eq!((lapse(interval), fence_after(interval)), (Duration::from_secs(15), Duration::from_secs(10)));
    }

    /// A run is alive while its heartbeat or its row's last write is younger than the
    /// lapse; a row claimed just now is alive though the old run's heartbeat lapsed.
    #[test]
    fn a_run_is_alive_while_its_heartbeat_or_its_rows_last_write_is_fresh() {
        let lapse = Duration::from_secs(15);
        let now = 100_000;
        assert!(!run_alive(None, None, now, lapse));
        assert!(!run_alive(Some(now - 15_000), Some(now - 20_000), now, lapse), "both lapsed");
        assert!(run_alive(Some(now - 14_999), None, now, lapse), "a fresh heartbeat");
        assert!(run_alive(Some(now - 60_000), Some(now - 50), now, lapse), "claimed just now");
        assert!(run_alive(None, Some(now + 900), now, lapse), "written by a clock ahead");
        assert!(!run_alive(Some(i64::MIN), Some(i64::MIN), now, lapse), "no overflow");
    }

    /// A run without an acknowledged beat (its mark not yet answered) is not fenced.
    #[tokio::test(start_paused = true)]
    async fn a_run_without_an_acknowledged_beat_is_not_fenced() {
        let live = JobLive::default();
        let watch = fence_watch(&live, "job-1", Pool::Short, Duration::from_secs(5));
        assert!(tokio::time::timeout(Duration::from_secs(60), watch).await.is_err());
        assert!(!live.is_fenced());
    }
}
