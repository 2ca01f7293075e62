//! The store as a job's route sees it ([`RouteStore`]) and as the spill path does
//! ([`BacklogStore`]): each call is the method of the same name.

use super::{BacklogKey, BacklogStatements};
use super::{HeartbeatRow, JobRow, RunMark, SeenRow, StateUpdate, Store, StoreError};
use crate::model::Millis;
use crate::seams::{BacklogStore, Beat, Io, RouteStore, SpilledRows};

impl RouteStore for Store {
    fn job<'a>(&'a self, job_id: &'a str) -> Io<'a, Result<Option<JobRow>, StoreError>> {
        Box::pin(Store::job(self, job_id))
    }
    fn heartbeat<'a>(&'a self, job_id: &'a str) -> Io<'a, Result<Option<HeartbeatRow>, StoreError>> {
        Box::pin(Store::heartbeat(self, job_id))
    }
    fn put_heartbeat<'a>(&'a self, b: Beat<'a>) -> Io<'a, Result<(), StoreError>> {
        Box::pin(Store::put_heartbeat(self, b.job_id, b.worker, b.at, b.progress, b.message, b.ttl_secs))
    }
    fn put_heartbeats<'a>(
        &'a self,
        beats: &'a [(String, f64, String)],
        worker: &'a str,
        at: Millis,
        ttl_secs: i32,
    ) -> Io<'a, Result<(), StoreError>> {
        Box::pin(Store::put_heartbeats(self, beats, worker, at, ttl_secs))
    }
    fn cancel_requested<'a>(&'a self, job_ids: &'a [String]) -> Io<'a, Result<Vec<String>, StoreError>> {
        Box::pin(Store::cancel_requested(self, job_ids))
    }
    fn put_state<'a>(&'a self, u: &'a StateUpdate<'a>, now: Millis) -> Io<'a, Result<(), StoreError>> {
        Box::pin(Store::put_state(self, u, now))
    }
    fn put_finished<'a>(&'a self, u: &'a StateUpdate<'a>, now: Millis) -> Io<'a, Result<(), StoreError>> {
        Box::pin(Store::put_finished(self, u, now))
    }
    fn put_running_with_heartbeat<'a>(
        &'a self,
        u: &'a StateUpdate<'a>,
        encoded_job: &'a [u8],
        now: Millis,
        heartbeat_ttl_secs: i32,
    ) -> Io<'a, Result<bool, StoreError>> {
        Box::pin(Store::put_running_with_heartbeat(self, u, encoded_job, now, heartbeat_ttl_secs))
    }
    fn put_running_as_seen<'a>(
        &'a self,
        u: &'a StateUpdate<'a>,
        encoded_job: &'a [u8],
        now: Millis,
        heartbeat_ttl_secs: i32,
        seen: SeenRow<'a>,
    ) -> Io<'a, Result<bool, StoreError>> {
        Box::pin(Store::put_running_as_seen(self, u, encoded_job, now, heartbeat_ttl_secs, seen))
    }
    fn put_state_if_marked<'a>(
        &'a self,
        u: &'a StateUpdate<'a>,
        mark: RunMark<'a>,
        now: Millis,
    ) -> Io<'a, Result<bool, StoreError>> {
        Box::pin(Store::put_state_if_marked(self, u, mark, now))
    }
    fn delete_running_job<'a>(&'a self, pool: &'a str, job_id: &'a str) -> Io<'a, Result<(), StoreError>> {
        Box::pin(Store::delete_running_job(self, pool, job_id))
    }
    fn claim_hand_off<'a>(&'a self, job_id: &'a str, worker: &'a str, now: Millis) -> Io<'a, Result<bool, StoreError>> {
        Box::pin(Store::claim_hand_off(self, job_id, worker, now))
    }
    fn claim_take_over<'a>(
        &'a self,
        job_id: &'a str,
        from: SeenRow<'a>,
        worker: &'a str,
        now: Millis,
    ) -> Io<'a, Result<bool, StoreError>> {
        Box::pin(Store::claim_take_over(self, job_id, from, worker, now))
    }
    fn mark_handed_off<'a>(
        &'a self,
        job_id: &'a str,
        worker: &'a str,
        now: Millis,
    ) -> Io<'a, Result<bool, StoreError>> {
        Box::pin(Store::mark_handed_off(self, job_id, worker, now))
    }
    fn handoff_count<'a>(&'a self, job_id: &'a str, generation: i64) -> Io<'a, Result<i32, StoreError>> {
        Box::pin(Store::handoff_count(self, job_id, generation))
    }
    fn put_handoff_count<'a>(&'a self, job_id: &'a str, generation: i64, count: i32) -> Io<'a, Result<(), StoreError>> {
        Box::pin(Store::put_handoff_count(self, job_id, generation, count))
    }
    fn dispatch_frontier<'a>(&'a self, topic: &'a str, partition: i32) -> Io<'a, Result<Option<i64>, StoreError>> {
        Box::pin(Store::dispatch_frontier(self, topic, partition))
    }
    fn raise_dispatch_frontier<'a>(
        &'a self,
        topic: &'a str,
        partition: i32,
        offset: i64,
    ) -> Io<'a, Result<(), StoreError>> {
        Box::pin(Store::raise_dispatch_frontier(self, topic, partition, offset))
    }
}

impl BacklogStore for BacklogStatements {
    fn put_rows<'a>(&'a self, key: BacklogKey<'a>, rows: &'a [(i64, &'a [u8])]) -> Io<'a, Result<usize, StoreError>> {
        Box::pin(BacklogStatements::put_rows(self, key, rows))
    }
    fn read_rows<'a>(
        &'a self,
        key: BacklogKey<'a>,
        after: i64,
        before: i64,
        limit: usize,
    ) -> Io<'a, Result<SpilledRows, StoreError>> {
        Box::pin(BacklogStatements::read_rows(self, key, after, before, limit))
    }
    fn list<'a>(&'a self, topic: &'a str, partition: i32) -> Io<'a, Result<Vec<(String, i64)>, StoreError>> {
        Box::pin(BacklogStatements::list(self, topic, partition))
    }
    fn drop_bucket<'a>(&'a self, key: BacklogKey<'a>) -> Io<'a, Result<(), StoreError>> {
        Box::pin(BacklogStatements::drop_bucket(self, key))
    }
}
