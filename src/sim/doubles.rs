//! In-memory doubles of the seams a job's route reaches the outside through
//! (`crate::seams`): a store of job rows, heartbeats (expiring on the given clock),
//! hand-off counts and dispatch frontiers, and a broker that keeps what it was sent.
//! Either can be made to refuse every call (an outage), so a test sees what the route
//! does when its outcome cannot be made durable.

use crate::core::tenants::{TenantRecord, TenantSet, Unregistered};
use crate::kafka::KafkaError;
use crate::model::Millis;
use crate::seams::{BacklogStore, Beat, Clock, Io, RouteBroker, RouteStore, SpilledRows, TenantsView};
use crate::store::{BacklogKey, HeartbeatRow, JobRow, RunMark, SeenRow, StateUpdate, StoreError};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A store in memory; heartbeats expire after their TTL on `clock`. Several handles
/// ([`MemStore::view`]) may share one store, each with its own outage switch and answer
/// times, as workers each have their own link to one database.
pub struct MemStore {
    clock: Arc<dyn Clock>,
    down: Arc<AtomicBool>,
    state: Arc<Mutex<MemState>>,
    /// How long each call takes to answer; none: at once.
    latency: Option<Mutex<Latency>>,
}

/// Seeded answer times of a store handle: uniform in `ms`, and with probability
/// `tail.0` anywhere up to `tail.1` ms instead. A call's write lands when it is made;
/// its answer comes after the drawn time, and fails if the handle is down by then (a
/// write that landed but whose acknowledgement was lost).
pub struct Latency {
    rng: super::rng::Rng,
    ms: (i64, i64),
    tail: (f64, i64),
}

impl Latency {
    pub fn new(seed: u64, ms: (i64, i64), tail: (f64, i64)) -> Latency {
        Latency { rng: super::rng::Rng::new(seed), ms, tail }
    }

    fn draw(&mut self) -> u64 {
        let ms = match self.rng.chance(self.tail.0) {
            true => self.rng.range(self.ms.1, self.tail.1),
            false => self.rng.range(self.ms.0, self.ms.1),
        };
        ms.max(0) as u64
    }
}

fn outage() -> StoreError {
    StoreError::Query { what: "memory store", message: "the store is down".into() }
}

#[derive(Default)]
struct MemState {
    jobs: HashMap<String, JobRow>,
    /// A heartbeat and when it expires.
    heartbeats: HashMap<String, (HeartbeatRow, Millis)>,
    /// The reaper's running index: (pool, job id).
    running: HashSet<(String, String)>,
    handoffs: HashMap<(String, i64), i32>,
    frontiers: HashMap<(String, i32), i64>,
    /// Spilled rows by (topic, partition, tenant, bucket), then offset.
    backlog: BTreeMap<BucketId, BTreeMap<i64, Vec<u8>>>,
}

/// A bucket of spilled rows: (topic, partition, tenant, bucket).
type BucketId = (String, i32, String, i64);

fn bucket_id(k: BacklogKey<'_>) -> BucketId {
    (k.topic.into(), k.partition, k.tenant.into(), k.bucket)
}

impl MemStore {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        MemStore { clock, down: Arc::default(), state: Arc::default(), latency: None }
    }

    /// Another handle on the same store, up, answering after `latency`.
    pub fn view(&self, latency: Option<Latency>) -> MemStore {
        MemStore {
            clock: self.clock.clone(),
            down: Arc::default(),
            state: self.state.clone(),
            latency: latency.map(Mutex::new),
        }
    }

    /// While down, every call fails as a store outage does.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// A job's row as stored now.
    pub fn row(&self, job_id: &str) -> Option<JobRow> {
        self.state.lock().expect("mem store").jobs.get(job_id).cloned()
    }

    /// Whether a job is in the reaper's running index of `pool`.
    pub fn in_running_index(&self, pool: &str, job_id: &str) -> bool {
        self.state.lock().expect("mem store").running.contains(&(pool.to_string(), job_id.to_string()))
    }

    /// Runs `f` on the state, or fails as an outage while down.
    fn with<T: Send + 'static>(&self, f: impl FnOnce(&mut MemState, Millis) -> T) -> Io<'_, Result<T, StoreError>> {
        let out = if self.down.load(Ordering::SeqCst) {
            Err(outage())
        } else {
            Ok(f(&mut self.state.lock().expect("mem store"), self.clock.now_ms()))
        };
        let Some(latency) = &self.latency else {
            return Box::pin(std::future::ready(out));
        };
        let wait = std::time::Duration::from_millis(latency.lock().expect("latency").draw());
        let down = self.down.clone();
        Box::pin(async move {
            tokio::time::sleep(wait).await;
            if down.load(Ordering::SeqCst) {
                return Err(outage());
            }
            out
        })
    }
}

/// A running mark: the row, a first heartbeat and the reaper's entry. True.
fn mark_running(s: &mut MemState, u: &StateUpdate<'_>, now: Millis, ttl_secs: i32, arrived: Millis) -> bool {
    upsert(&mut s.jobs, u, now);
    let b = Beat { job_id: u.job_id, worker: u.worker, at: now, progress: 0.0, message: "", ttl_secs };
    beat(s, &b, arrived);
    s.running.insert((u.pool.to_string(), u.job_id.to_string()));
    true
}

/// Writes an update into a job's row (creating it), as the `jobs` table's upsert does.
fn upsert(jobs: &mut HashMap<String, JobRow>, u: &StateUpdate<'_>, now: Millis) {
    let row =
        jobs.entry(u.job_id.to_string()).or_insert_with(|| JobRow { job_id: u.job_id.into(), ..JobRow::default() });
    row.tenant = Some(u.tenant.into());
    row.job_type = Some(u.job_type.into());
    row.pool = Some(u.pool.into());
    row.status = Some(u.status.into());
    row.attempts = Some(u.attempts);
    row.crash_count = Some(u.crash_count);
    row.generation = Some(u.generation);
    row.submitted_at = Some(u.submitted_at);
    row.started_at = u.started_at.or(row.started_at);
    row.finished_at = u.finished_at;
    row.worker = Some(u.worker.into());
    row.error = u.error.map(Into::into);
    row.failure_class = u.failure_class.map(Into::into);
    row.output = u.output.map(<[u8]>::to_vec);
    row.updated_at = Some(now);
}

/// Writes a heartbeat unless a newer one is stored: the store orders heartbeat writes by
/// their stamp (`store::beat_timestamp`), so a late older beat never replaces a newer one.
/// Writes a heartbeat as the table does: the newer stamp wins, and its TTL counts from
/// the write's arrival (`now`, the store's clock), not from the writer's stamp.
fn beat(state: &mut MemState, b: &Beat<'_>, now: Millis) {
    if state.heartbeats.get(b.job_id).is_some_and(|(hb, _)| hb.at.is_some_and(|at| at > b.at)) {
        return;
    }
    let row = HeartbeatRow {
        job_id: b.job_id.into(),
        worker: Some(b.worker.into()),
        at: Some(b.at),
        progress: Some(b.progress),
        message: Some(b.message.into()),
    };
    state.heartbeats.insert(b.job_id.into(), (row, now + i64::from(b.ttl_secs) * 1000));
}

impl RouteStore for MemStore {
    fn job<'a>(&'a self, job_id: &'a str) -> Io<'a, Result<Option<JobRow>, StoreError>> {
        self.with(|s, _| s.jobs.get(job_id).cloned())
    }
    fn heartbeat<'a>(&'a self, job_id: &'a str) -> Io<'a, Result<Option<HeartbeatRow>, StoreError>> {
        self.with(|s, now| s.heartbeats.get(job_id).filter(|(_, expires)| now < *expires).map(|(hb, _)| hb.clone()))
    }
    fn put_heartbeat<'a>(&'a self, b: Beat<'a>) -> Io<'a, Result<(), StoreError>> {
        self.with(|s, now| beat(s, &b, now))
    }
    fn put_heartbeats<'a>(
        &'a self,
        beats: &'a [(String, f64, String)],
        worker: &'a str,
        at: Millis,
        ttl_secs: i32,
    ) -> Io<'a, Result<(), StoreError>> {
        self.with(|s, now| {
            for (job_id, progress, message) in beats {
                beat(s, &Beat { job_id, worker, at, progress: *progress, message, ttl_secs }, now);
            }
        })
    }
    fn cancel_requested<'a>(&'a self, job_ids: &'a [String]) -> Io<'a, Result<Vec<String>, StoreError>> {
        self.with(|s, _| {
            let asked = |id: &&String| s.jobs.get(id.as_str()).is_some_and(|r| r.cancel_requested == Some(true));
            job_ids.iter().filter(asked).cloned().collect()
        })
    }
    fn put_state<'a>(&'a self, u: &'a StateUpdate<'a>, now: Millis) -> Io<'a, Result<(), StoreError>> {
        self.with(|s, _| upsert(&mut s.jobs, u, now))
    }
    fn put_finished<'a>(&'a self, u: &'a StateUpdate<'a>, now: Millis) -> Io<'a, Result<(), StoreError>> {
        self.with(|s, _| upsert(&mut s.jobs, u, now))
    }
    fn put_running_with_heartbeat<'a>(
        &'a self,
        u: &'a StateUpdate<'a>,
        _encoded_job: &'a [u8],
        now: Millis,
        heartbeat_ttl_secs: i32,
    ) -> Io<'a, Result<bool, StoreError>> {
        self.with(|s, arrived| {
            let finished = s.jobs.get(u.job_id).is_some_and(|r| r.is_terminal() && r.generation >= Some(u.generation));
            !finished && mark_running(s, u, now, heartbeat_ttl_secs, arrived)
        })
    }
    fn put_running_as_seen<'a>(
        &'a self,
        u: &'a StateUpdate<'a>,
        _encoded_job: &'a [u8],
        now: Millis,
        heartbeat_ttl_secs: i32,
        seen: SeenRow<'a>,
    ) -> Io<'a, Result<bool, StoreError>> {
        self.with(move |s, arrived| {
            let row = s.jobs.get(u.job_id);
            let (terminal, worker) = (row.is_some_and(JobRow::is_terminal), row.and_then(|r| r.worker.as_deref()));
            let as_read = worker == seen.worker && row.and_then(|r| r.updated_at) == seen.written_at;
            let rerun = row.and_then(|r| r.generation).is_some_and(|g| g < u.generation);
            (!terminal && as_read || rerun) && mark_running(s, u, now, heartbeat_ttl_secs, arrived)
        })
    }
    fn put_state_if_marked<'a>(
        &'a self,
        u: &'a StateUpdate<'a>,
        mark: RunMark<'a>,
        now: Millis,
    ) -> Io<'a, Result<bool, StoreError>> {
        self.with(move |s, _| {
            let marked = s.jobs.get(u.job_id).is_some_and(|r| {
                r.status.as_deref() == Some("running")
                    && r.worker.as_deref() == Some(mark.worker)
                    && r.attempts == Some(mark.attempts)
                    && r.crash_count == Some(mark.crash_count)
            });
            if marked {
                upsert(&mut s.jobs, u, now);
            }
            marked
        })
    }
    fn delete_running_job<'a>(&'a self, pool: &'a str, job_id: &'a str) -> Io<'a, Result<(), StoreError>> {
        self.with(|s, _| {
            s.running.remove(&(pool.to_string(), job_id.to_string()));
        })
    }
    fn claim_hand_off<'a>(&'a self, job_id: &'a str, worker: &'a str, now: Millis) -> Io<'a, Result<bool, StoreError>> {
        self.with(|s, _| match s.jobs.get_mut(job_id) {
            Some(row) if row.status.as_deref() == Some("handed_off") => {
                row.status = Some("running".into());
                row.worker = Some(worker.into());
                row.updated_at = Some(now);
                true
            }
            _ => false,
        })
    }
    fn claim_take_over<'a>(
        &'a self,
        job_id: &'a str,
        from: SeenRow<'a>,
        worker: &'a str,
        now: Millis,
    ) -> Io<'a, Result<bool, StoreError>> {
        self.with(move |s, _| match s.jobs.get_mut(job_id) {
            Some(row)
                if row.status.as_deref() == Some("running")
                    && row.worker.as_deref() == from.worker
                    && row.updated_at == from.written_at =>
            {
                row.worker = Some(worker.into());
                row.updated_at = Some(now);
                true
            }
            _ => false,
        })
    }
    fn mark_handed_off<'a>(
        &'a self,
        job_id: &'a str,
        worker: &'a str,
        now: Millis,
    ) -> Io<'a, Result<bool, StoreError>> {
        self.with(|s, _| match s.jobs.get_mut(job_id) {
            Some(row) if row.status.as_deref() == Some("running") && row.worker.as_deref() == Some(worker) => {
                row.status = Some("handed_off".into());
                row.updated_at = Some(now);
                true
            }
            _ => false,
        })
    }
    fn handoff_count<'a>(&'a self, job_id: &'a str, generation: i64) -> Io<'a, Result<i32, StoreError>> {
        self.with(|s, _| s.handoffs.get(&(job_id.to_string(), generation)).copied().unwrap_or(0))
    }
    fn put_handoff_count<'a>(&'a self, job_id: &'a str, generation: i64, count: i32) -> Io<'a, Result<(), StoreError>> {
        self.with(|s, _| {
            s.handoffs.insert((job_id.to_string(), generation), count);
        })
    }
    fn dispatch_frontier<'a>(&'a self, topic: &'a str, partition: i32) -> Io<'a, Result<Option<i64>, StoreError>> {
        self.with(|s, _| s.frontiers.get(&(topic.to_string(), partition)).copied())
    }
    fn raise_dispatch_frontier<'a>(
        &'a self,
        topic: &'a str,
        partition: i32,
        offset: i64,
    ) -> Io<'a, Result<(), StoreError>> {
        self.with(|s, _| {
            let f = s.frontiers.entry((topic.to_string(), partition)).or_insert(offset);
            *f = (*f).max(offset);
        })
    }
}

impl BacklogStore for MemStore {
    fn put_rows<'a>(&'a self, key: BacklogKey<'a>, rows: &'a [(i64, &'a [u8])]) -> Io<'a, Result<usize, StoreError>> {
        self.with(move |s, _| {
            let bucket = s.backlog.entry(bucket_id(key)).or_default();
            rows.iter().for_each(|(offset, job)| {
                bucket.insert(*offset, job.to_vec());
            });
            rows.len()
        })
    }
    fn read_rows<'a>(
        &'a self,
        key: BacklogKey<'a>,
        after: i64,
        before: i64,
        limit: usize,
    ) -> Io<'a, Result<SpilledRows, StoreError>> {
        self.with(move |s, _| match s.backlog.get(&bucket_id(key)) {
            Some(rows) if after.saturating_add(1) < before => {
                rows.range(after + 1..before).take(limit).map(|(o, j)| (*o, j.clone())).collect()
            }
            _ => Vec::new(),
        })
    }
    fn list<'a>(&'a self, topic: &'a str, partition: i32) -> Io<'a, Result<Vec<(String, i64)>, StoreError>> {
        self.with(move |s, _| {
            let of = |(t, p, _, _): &&BucketId| t == topic && *p == partition;
            s.backlog.keys().filter(of).map(|(_, _, tenant, bucket)| (tenant.clone(), *bucket)).collect()
        })
    }
    fn drop_bucket<'a>(&'a self, key: BacklogKey<'a>) -> Io<'a, Result<(), StoreError>> {
        self.with(move |s, _| {
            s.backlog.remove(&bucket_id(key));
        })
    }
}

/// A tenants registry that never changes: the tenants given, and the configured rule for
/// the others (`[registry]`).
pub struct FixedTenants {
    set: tokio::sync::watch::Sender<Arc<TenantSet>>,
    cfg: Arc<crate::config::Config>,
}

impl FixedTenants {
    pub fn new(cfg: Arc<crate::config::Config>, tenants: impl IntoIterator<Item = TenantRecord>) -> Self {
        let tenants = tenants.into_iter().map(|t| (t.name.clone(), t)).collect();
        let set = Arc::new(TenantSet { version: 1, tenants });
        FixedTenants { set: tokio::sync::watch::channel(set).0, cfg }
    }

    fn rules(&self) -> Unregistered<'_> {
        self.cfg.registry.unregistered()
    }
}

impl TenantsView for FixedTenants {
    fn current(&self) -> Arc<TenantSet> {
        self.set.borrow().clone()
    }
    fn subscribe(&self) -> tokio::sync::watch::Receiver<Arc<TenantSet>> {
        self.set.subscribe()
    }
    fn accept(&self, tenant: &str) -> Result<TenantRecord, String> {
        use crate::core::tenants::Standing;
        match self.current().standing(tenant, self.rules()) {
            Standing::Known(t) => Ok(t.clone()),
            Standing::Register(t) | Standing::Rowless(t) => Ok(t),
            Standing::Refused(why) => Err(why),
        }
    }
    fn registered_after_all<'a>(&'a self, tenant: &'a str) -> Io<'a, Result<bool, StoreError>> {
        let known = self.current().tenants.contains_key(tenant);
        Box::pin(std::future::ready(Ok(known)))
    }
}

/// A record the broker double was sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    pub topic: String,
    pub key: String,
    pub payload: Vec<u8>,
}

/// A broker in memory: keeps every record it acknowledged. Several handles
/// ([`MemBroker::view`]) may share one broker, each with its own switch, as workers each
/// have their own link to one cluster.
#[derive(Default)]
pub struct MemBroker {
    refusing: AtomicBool,
    sent: Arc<Mutex<Vec<Sent>>>,
}

impl MemBroker {
    /// Another handle on the same broker, accepting.
    pub fn view(&self) -> MemBroker {
        MemBroker { refusing: AtomicBool::new(false), sent: self.sent.clone() }
    }

    /// While refusing, every send fails as a broker that is unreachable does.
    pub fn set_refusing(&self, refusing: bool) {
        self.refusing.store(refusing, Ordering::SeqCst);
    }

    /// How many records were acknowledged, on every topic.
    pub fn sent_count(&self) -> usize {
        self.sent.lock().expect("mem broker").len()
    }

    /// The records acknowledged from the `from`-th on (in order, every topic).
    pub fn sent_since(&self, from: usize) -> Vec<Sent> {
        let sent = self.sent.lock().expect("mem broker");
        sent[from.min(sent.len())..].to_vec()
    }

    /// The records acknowledged on `topic`, in order.
    pub fn sent_to(&self, topic: &str) -> Vec<Sent> {
        self.sent.lock().expect("mem broker").iter().filter(|s| s.topic == topic).cloned().collect()
    }

    fn take(&self, topic: &str, key: &str, payload: &[u8]) -> bool {
        if self.refusing.load(Ordering::SeqCst) {
            return false;
        }
        let s = Sent { topic: topic.into(), key: key.into(), payload: payload.to_vec() };
        self.sent.lock().expect("mem broker").push(s);
        true
    }
}

impl RouteBroker for MemBroker {
    fn send<'a>(
        &'a self,
        topic: &'a str,
        key: &'a str,
        payload: &'a [u8],
        _headers: &'a [(&'a str, &'a str)],
    ) -> Io<'a, Result<(i32, i64), KafkaError>> {
        let out = if self.take(topic, key, payload) {
            Ok((0, self.sent.lock().expect("mem broker").len() as i64 - 1))
        } else {
            Err(KafkaError::ProducerGaveUp("the broker double refuses".into()))
        };
        Box::pin(std::future::ready(out))
    }
    fn send_nowait(&self, topic: &str, key: &str, payload: &[u8]) -> bool {
        self.take(topic, key, payload)
    }
}
