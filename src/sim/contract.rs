//! Cases the in-memory store double (`sim::doubles::MemStore`) must answer as the real
//! store does, written once against the seam (`seams::RouteStore`): run on the double by
//! this module's test and on Cassandra by the integration test `it::store_contract`, so
//! the double cannot drift from the store the route ships with.

use crate::model::Millis;
use crate::seams::{Beat, RouteStore};
use crate::store::{RunMark, SeenRow, StateUpdate};

/// What a contract case found wrong.
#[derive(Debug, thiserror::Error)]
pub enum Broken {
    #[error("the store failed: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{case}: expected {expected}, read {read}")]
    Read { case: &'static str, expected: String, read: String },
}

/// Fails the case when `got` is not `want`.
fn expect<T: PartialEq + std::fmt::Debug>(case: &'static str, got: T, want: T) -> Result<(), Broken> {
    if got == want {
        return Ok(());
    }
    Err(Broken::Read { case, expected: format!("{want:?}"), read: format!("{got:?}") })
}

/// One run of a job (`worker`'s, its attempt and crash count) in `status`.
fn run<'a>(job_id: &'a str, status: &'a str, mark: RunMark<'a>, generation: i64, now: Millis) -> StateUpdate<'a> {
    let ended = matches!(status, "succeeded" | "failed" | "cancelled" | "expired");
    StateUpdate {
        job_id,
        tenant: "contract",
        job_type: "echo",
        pool: "short",
        status,
        attempts: mark.attempts,
        crash_count: mark.crash_count,
        generation,
        submitted_at: now - 10_000,
        started_at: Some(now - 5_000),
        finished_at: ended.then_some(now),
        worker: mark.worker,
        error: None,
        failure_class: None,
        output: None,
        usage: None,
    }
}

/// The row's (status, worker, crash count, generation).
async fn row_of(store: &dyn RouteStore, job_id: &str) -> Result<Option<(String, String, i32, i64)>, Broken> {
    let row = store.job(job_id).await?;
    Ok(row.map(|r| {
        let g = r.generation.unwrap_or(0);
        (r.status.unwrap_or_default(), r.worker.unwrap_or_default(), r.crash_count.unwrap_or(0), g)
    }))
}

/// A run taken over cannot write its state: the first running mark lands on a job
/// without a row, a take-over (a crash counted) marks it again, the first run's state
/// write (`put_state_if_marked`) is then refused and the row keeps the take-over's
/// mark, which can write its own. `job_id` must be unused.
pub async fn a_run_taken_over_cannot_write_its_state(
    store: &dyn RouteStore,
    job_id: &str,
    now: Millis,
) -> Result<(), Broken> {
    let first = RunMark { worker: "first", attempts: 1, crash_count: 0 };
    let taker = RunMark { worker: "taker", attempts: 1, crash_count: 1 };
    let marked = store.put_running_with_heartbeat(&run(job_id, "running", first, 0, now), b"job", now, 60).await?;
    expect("the first running mark, on no row", marked, true)?;
    let took = store.put_running_with_heartbeat(&run(job_id, "running", taker, 0, now), b"job", now, 60).await?;
    expect("the take-over's running mark", took, true)?;
    let late = store.put_state_if_marked(&run(job_id, "retrying", first, 0, now), first, now).await?;
    expect("the taken-over run's state write", late, false)?;
    let row = row_of(store, job_id).await?;
    expect("the row after the refused write", row, Some(("running".into(), "taker".into(), 1, 0)))?;
    let own = store.put_state_if_marked(&run(job_id, "retrying", taker, 0, now), taker, now).await?;
    expect("the take-over's own state write", own, true)?;
    let row = row_of(store, job_id).await?;
    expect("the row after it", row, Some(("retrying".into(), "taker".into(), 1, 0)))
}

/// A finished job takes no running mark of its generation (the run is superseded and the
/// row stays finished) but takes a rerun's, of a newer generation. `job_id` must be unused.
pub async fn a_finished_job_takes_no_running_mark_but_a_rerun_does(
    store: &dyn RouteStore,
    job_id: &str,
    now: Millis,
) -> Result<(), Broken> {
    let done = RunMark { worker: "done", attempts: 1, crash_count: 0 };
    store.put_state(&run(job_id, "succeeded", done, 0, now), now).await?;
    let late = RunMark { worker: "late", attempts: 1, crash_count: 0 };
    let marked = store.put_running_with_heartbeat(&run(job_id, "running", late, 0, now), b"job", now, 60).await?;
    expect("a running mark on the finished job", marked, false)?;
    let row = row_of(store, job_id).await?;
    expect("the finished row", row, Some(("succeeded".into(), "done".into(), 0, 0)))?;
    let rerun = store.put_running_with_heartbeat(&run(job_id, "running", late, 1, now), b"job", now, 60).await?;
    expect("a rerun's running mark", rerun, true)?;
    let row = row_of(store, job_id).await?;
    expect("the rerun's row", row, Some(("running".into(), "late".into(), 0, 1)))
}

/// A job is marked handed off only by the worker running it, and of the copies that
/// find it handed off exactly one claims it. `job_id` must be unused.
pub async fn one_claim_of_a_handed_off_job_wins(
    store: &dyn RouteStore,
    job_id: &str,
    now: Millis,
) -> Result<(), Broken> {
    let owner = RunMark { worker: "owner", attempts: 1, crash_count: 0 };
    store.put_running_with_heartbeat(&run(job_id, "running", owner, 0, now), b"job", now, 60).await?;
    expect("a hand-off marked by another worker", store.mark_handed_off(job_id, "other", now).await?, false)?;
    expect("the owner's hand-off", store.mark_handed_off(job_id, "owner", now).await?, true)?;
    expect("the first claim", store.claim_hand_off(job_id, "first", now).await?, true)?;
    expect("a second claim", store.claim_hand_off(job_id, "second", now).await?, false)?;
    let row = row_of(store, job_id).await?;
    expect("the claimed row", row, Some(("running".into(), "first".into(), 0, 0)))
}

/// Of the copies that find a run's heartbeat lapsed, one takes it over: the claim holds
/// only while the row is the one read (running on the lapsed worker, last written then).
/// A row its worker wrote again since (it took its own run over) is not claimed with the
/// older read. `job_id` must be unused.
pub async fn one_take_over_of_a_lapsed_run_wins(
    store: &dyn RouteStore,
    job_id: &str,
    now: Millis,
) -> Result<(), Broken> {
    let seen = |worker, written_at| SeenRow { worker: Some(worker), written_at };
    let claim = |from, worker, at| store.claim_take_over(job_id, from, worker, at);
    expect("a take-over of a job without a row", claim(seen("dead", None), "first", now).await?, false)?;
    let dead = RunMark { worker: "dead", attempts: 1, crash_count: 0 };
    store.put_running_with_heartbeat(&run(job_id, "running", dead, 0, now), b"job", now, 60).await?;
    let written = store.job(job_id).await?.and_then(|r| r.updated_at);
    expect("the mark's write time", written, Some(now))?;
    expect("a take-over from another worker", claim(seen("other", written), "first", now).await?, false)?;
    expect("a take-over of an older write", claim(seen("dead", Some(now - 1)), "first", now).await?, false)?;
    expect("the first take-over", claim(seen("dead", written), "first", now + 1).await?, true)?;
    expect("a second take-over", claim(seen("dead", written), "second", now + 2).await?, false)?;
    let row = row_of(store, job_id).await?;
    expect("the row taken over", row, Some(("running".into(), "first".into(), 0, 0)))?;
    // The new owner's run lapses; it takes its own run over (the row written again), and
    // a copy that read the row before that cannot claim it.
    let before = Some(now + 1);
    expect("its own take-over", claim(seen("first", before), "first", now + 3).await?, true)?;
    expect("a take-over of the row as it was", claim(seen("first", before), "third", now + 4).await?, false)?;
    expect("a take-over of the row as it is", claim(seen("first", Some(now + 3)), "third", now + 5).await?, true)
}

/// Of two runs whose checks read the same row (here: none) and started, one marks the job
/// running; the other finds the row changed and is refused. A run that saw the row as it
/// is marks over it; one that saw the same worker at an earlier write does not. `job_id`
/// must be unused.
pub async fn of_two_runs_that_saw_the_same_row_one_marks(
    store: &dyn RouteStore,
    job_id: &str,
    now: Millis,
) -> Result<(), Broken> {
    let (a, b) =
        (RunMark { worker: "a", attempts: 1, crash_count: 0 }, RunMark { worker: "b", attempts: 1, crash_count: 0 });
    let none = SeenRow { worker: None, written_at: None };
    let mark = |m, at, seen| async move {
        store.put_running_as_seen(&run(job_id, "running", m, 0, at), b"job", at, 60, seen).await
    };
    expect("the first mark over no row", mark(a, now, none).await?, true)?;
    expect("a second mark over the row it did not see", mark(b, now, none).await?, false)?;
    expect("the row", row_of(store, job_id).await?, Some(("running".into(), "a".into(), 0, 0)))?;
    let as_marked = SeenRow { worker: Some("a"), written_at: Some(now) };
    expect("a mark over the row it saw", mark(b, now + 1, as_marked).await?, true)?;
    expect("the row marked again", row_of(store, job_id).await?, Some(("running".into(), "b".into(), 0, 0)))?;
    // Worker a marks again over b's row; b, which read its own mark before that, cannot
    // mark over a row with the worker it saw and a later write.
    let as_b_wrote = SeenRow { worker: Some("b"), written_at: Some(now + 1) };
    expect("a's mark over b's", mark(a, now + 2, as_b_wrote).await?, true)?;
    let earlier = SeenRow { worker: Some("a"), written_at: Some(now) };
    expect("a mark over a's earlier write", mark(b, now + 3, earlier).await?, false)?;
    expect("the row", row_of(store, job_id).await?, Some(("running".into(), "a".into(), 0, 0)))
}

/// A partition's dispatch frontier only rises, whatever order the raises land in.
/// `topic` must be unused.
pub async fn the_dispatch_frontier_only_rises(store: &dyn RouteStore, topic: &str) -> Result<(), Broken> {
    expect("an unrecorded frontier", store.dispatch_frontier(topic, 3).await?, None)?;
    store.raise_dispatch_frontier(topic, 3, 10).await?;
    store.raise_dispatch_frontier(topic, 3, 5).await?;
    expect("after a lower raise", store.dispatch_frontier(topic, 3).await?, Some(10))?;
    store.raise_dispatch_frontier(topic, 3, 20).await?;
    expect("after a higher raise", store.dispatch_frontier(topic, 3).await?, Some(20))?;
    expect("another partition", store.dispatch_frontier(topic, 4).await?, None)
}

fn beat<'a>(job_id: &'a str, worker: &'a str, at: Millis) -> Beat<'a> {
    Beat { job_id, worker, at, progress: 0.0, message: "", ttl_secs: 600 }
}

/// A heartbeat that lands after a newer one but was stamped before it (a cut-off worker's
/// write, retried once its link is back) does not replace it: the heartbeat read is the
/// newest stamp's, whatever the order the writes landed in. `job_id` must be unused;
/// `now` is the clock's time (the beats are stamped within a second before it).
pub async fn a_late_older_heartbeat_never_replaces_a_newer_one(
    store: &dyn RouteStore,
    job_id: &str,
    now: Millis,
) -> Result<(), Broken> {
    let (older, newer) = (now - 1_000, now - 500);
    store.put_heartbeat(beat(job_id, "taker", newer)).await?;
    store.put_heartbeat(beat(job_id, "cut-off", older)).await?;
    let read = store.heartbeat(job_id).await?;
    let got = read.as_ref().map(|h| (h.worker.clone().unwrap_or_default(), h.at));
    if got != Some(("taker".to_string(), Some(newer))) {
        return Err(Broken::Read {
            case: "a late older heartbeat",
            expected: format!("the taker's beat at {newer}"),
            read: format!("{got:?}"),
        });
    }
    // A newer beat still replaces it.
    store.put_heartbeat(beat(job_id, "taker", now)).await?;
    let at = store.heartbeat(job_id).await?.and_then(|h| h.at);
    if at != Some(now) {
        return Err(Broken::Read { case: "a newer heartbeat", expected: format!("{now}"), read: format!("{at:?}") });
    }
    Ok(())
}

/// A batch of heartbeats (the heartbeat loop's write) lands for each job, under the same
/// newest-stamp-wins rule as a single beat; jobs without a cancellation request read
/// none.
pub async fn a_batch_of_heartbeats_lands_and_keeps_the_newest(
    store: &dyn RouteStore,
    job_id: &str,
    now: Millis,
) -> Result<(), Broken> {
    let ids = [format!("{job_id}-a"), format!("{job_id}-b")];
    let batch = |at: Millis| ids.iter().map(|id| (id.clone(), 0.5, format!("at {at}"))).collect::<Vec<_>>();
    store.put_heartbeats(&batch(now - 500), "batch", now - 500, 30).await?;
    store.put_heartbeat(beat(&ids[0], "batch", now)).await?;
    store.put_heartbeats(&batch(now - 1_000), "late", now - 1_000, 30).await?;
    for (id, want) in ids.iter().zip([now, now - 500]) {
        let read = store.heartbeat(id).await?;
        let got = read.map(|h| (h.worker.unwrap_or_default(), h.at));
        expect("a batch of heartbeats", got, Some(("batch".to_string(), Some(want))))?;
    }
    expect("no cancellation requested", store.cancel_requested(&ids).await?, Vec::<String>::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seams::{Clock, TokioClock};
    use crate::sim::doubles::MemStore;
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn the_double_keeps_the_newest_heartbeat() {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_790_000_000_000));
        let store = MemStore::new(clock.clone());
        a_late_older_heartbeat_never_replaces_a_newer_one(&store, "job-1", clock.now_ms()).await.unwrap();
        a_batch_of_heartbeats_lands_and_keeps_the_newest(&store, "job-2", clock.now_ms()).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_double_keeps_running_marks_claims_and_frontiers_as_the_store_does() {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::starting_at(1_790_000_000_000));
        let store = MemStore::new(clock.clone());
        let now = clock.now_ms();
        a_run_taken_over_cannot_write_its_state(&store, "job-1", now).await.unwrap();
        a_finished_job_takes_no_running_mark_but_a_rerun_does(&store, "job-2", now).await.unwrap();
        one_claim_of_a_handed_off_job_wins(&store, "job-3", now).await.unwrap();
        one_take_over_of_a_lapsed_run_wins(&store, "job-4", now).await.unwrap();
        of_two_runs_that_saw_the_same_row_one_marks(&store, "job-5", now).await.unwrap();
        the_dispatch_frontier_only_rises(&store, "topic").await.unwrap();
    }
}
