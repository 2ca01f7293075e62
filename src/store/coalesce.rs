//! Coalescing of the hot-path statements. Every job costs one state read (the
//! effectively-once check) and one terminal write; issued one by one they cap a worker
//! at the database's single-statement rate. Here concurrent callers' reads are merged
//! into one `IN (...)` query and their writes into one unlogged batch, with a bounded
//! number of requests in flight, so a round trip carries up to `MAX_BATCH` jobs. Finished
//! and queued records (`core::finished`) are written as packs: what arrives within a
//! linger of the first (`Gather`: brief for queued records, whose submitters wait, longer
//! for finished ones) is grouped by pack bucket, one row per bucket. Reads merge a job's
//! row and its finished records (`Lookup`).

use super::{JobRow, StoreError};
use crate::core::finished::{self, FinishedRecord};
use crate::model::Millis;
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

/// Most statements (or keys) merged into one request.
pub const MAX_BATCH: usize = 64;
/// Merged requests in flight at once per coalescer.
const IN_FLIGHT: usize = 8;
/// Writes of packs in flight at once. Few, so that under load records pile up behind
/// them and each write carries many (one row per pack bucket): the database's cost goes
/// with rows and requests more than with records (measured in `docs/performance.md`).
const PACK_IN_FLIGHT: usize = 2;
/// How a write of packs gathers: it takes what waits, then what arrives within `linger`
/// of its first record, up to `max` records. Records of jobs submitted close together
/// share a pack bucket, so a longer gather means fewer and fuller rows: the database's
/// cost goes with requests and rows.
#[derive(Debug, Clone, Copy)]
struct Gather {
    max: usize,
    linger: std::time::Duration,
}

/// Queued records: their submitter waits for the write before it answers, so they
/// gather briefly (four API batches in flight at 20 ms each carry ~50,000 jobs/s).
const QUEUED_GATHER: Gather = Gather { max: 2048, linger: std::time::Duration::from_millis(20) };

/// Finished records: only the jobs' offset commits and their stored state wait for the
/// write (results are out before, and dispatch does not wait on outcomes), so they
/// gather longer. A backlog's jobs finish out of submission order (its partitions start
/// at different times), so one gather touches ~100 buckets: at 20 ms a 60,000-job burst
/// wrote ~4,300 rows of ~14 records, at 80 ms ~1,400 of ~45 (docs/performance.md,
/// 2026-12-05 evening). `max` is half a worker pool's outcomes in flight
/// (`worker::pool`): a full gather is written while the next one fills, so at rates where
/// 80 ms bring more than that, gathers close sooner instead of holding dispatch back.
const FINISHED_GATHER: Gather = Gather { max: FINISHED_GATHER_MAX, linger: std::time::Duration::from_millis(80) };
/// [`FINISHED_GATHER`]'s most records.
pub(crate) const FINISHED_GATHER_MAX: usize = 8192;
/// Most bytes of packs in one batch, each pack counted with [`PACK_ROW_BYTES`] (ScyllaDB
/// and Cassandra warn at 128 KiB by default, counting each row's keys and cell metadata
/// too).
const MAX_BATCH_BYTES: usize = 120 * 1024;
/// What the database counts for one pack row besides its body (bucket, pack number,
/// timestamp, TTL, cell headers; ~50 bytes), with a margin. Without it, batches of many
/// small packs passed 128 KiB and every one drew a warning from the database.
const PACK_ROW_BYTES: usize = 64;
/// Most pack buckets (partitions) in one batch: a batch's packs are of the buckets its
/// records' submission times fall in, so a gather drained from a backlog submitted over
/// minutes spans hundreds of them. ScyllaDB has no warning for that; Cassandra warns per
/// batch past `unlogged_batch_across_partitions_warn_threshold` (10 by default; 128 as
/// `scripts/services` runs it, docs/local-services.md).
const MAX_BATCH_PARTITIONS: usize = 100;
/// Rows per page when a pack bucket is read.
const PACK_PAGE: i32 = 256;

/// Owned values of the `put_state` statement, in its bind order.
#[derive(scylla::SerializeRow)]
#[scylla(flavor = "enforce_order", skip_name_checks)]
pub struct StateValues {
    pub tenant: String,
    pub job_type: String,
    pub pool: String,
    pub status: String,
    pub attempts: i32,
    pub crash_count: i32,
    pub generation: i64,
    pub submitted_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub worker: String,
    pub error: Option<String>,
    pub failure_class: Option<String>,
    pub output: Option<Vec<u8>>,
    pub peak_memory_bytes: Option<i64>,
    pub cpu_ms: Option<i64>,
    pub updated_at: Millis,
    pub job_id: String,
}

type WriteReq = (StateValues, oneshot::Sender<Result<(), StoreError>>);
/// A finished record to pack: (job id, `FinishedRecord::encode`d record).
pub type FinishedValues = (String, Vec<u8>);
type FinishedReq = (FinishedValues, oneshot::Sender<Result<(), StoreError>>);
/// A finished record as a row of its own: (bucket, job id, record).
type FinishedRowReq = ((i64, String, Vec<u8>), oneshot::Sender<Result<(), StoreError>>);
type ReadReq = (String, oneshot::Sender<Result<Option<JobRow>, StoreError>>);

#[derive(Clone)]
pub struct Coalescer {
    writes: mpsc::Sender<WriteReq>,
    finished: mpsc::Sender<FinishedReq>,
    queued: mpsc::Sender<FinishedReq>,
    finished_rows: mpsc::Sender<FinishedRowReq>,
    reads: mpsc::Sender<ReadReq>,
}

/// The write statements a [`Coalescer`] merges.
pub struct Writes {
    /// A `jobs` row.
    pub put_state: PreparedStatement,
    /// A pack of finished records (`finished_packs`).
    pub put_pack: PreparedStatement,
    /// A finished record too large to pack, as its own row (`finished_jobs`).
    pub put_finished_row: PreparedStatement,
}

impl Coalescer {
    pub fn start(session: Arc<Session>, writes: Writes, lookup: Arc<Lookup>) -> Self {
        let (wtx, wrx) = mpsc::channel(4096);
        let (ftx, frx) = mpsc::channel(4096);
        let (qtx, qrx) = mpsc::channel(4096);
        let (btx, brx) = mpsc::channel(4096);
        let (rtx, rrx) = mpsc::channel(4096);
        tokio::spawn(write_loop(session.clone(), writes.put_state, wrx, "put job state"));
        tokio::spawn(write_loop(session.clone(), writes.put_finished_row, brx, "put finished job"));
        tokio::spawn(pack_loop(session.clone(), writes.put_pack.clone(), frx, FINISHED_GATHER));
        tokio::spawn(pack_loop(session, writes.put_pack, qrx, QUEUED_GATHER));
        tokio::spawn(read_loop(lookup, rrx));
        Coalescer { writes: wtx, finished: ftx, queued: qtx, finished_rows: btx, reads: rtx }
    }

    pub async fn put_state(&self, v: StateValues) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        self.writes.send((v, tx)).await.map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }

    /// A finished record of a UUIDv7 job; concurrent ones of one pack bucket share a row
    /// (a pack). One larger than `finished::PACK_ENTRY_MAX` is a row of its own.
    pub async fn put_finished(&self, v: FinishedValues) -> Result<(), StoreError> {
        self.put_record(v, &self.finished).await
    }

    /// A queued record (a submission's): as [`Coalescer::put_finished`], in packs that
    /// gather briefly because the submitter waits for them.
    pub async fn put_queued(&self, v: FinishedValues) -> Result<(), StoreError> {
        self.put_record(v, &self.queued).await
    }

    async fn put_record(&self, v: FinishedValues, packs: &mpsc::Sender<FinishedReq>) -> Result<(), StoreError> {
        let (tx, rx) = oneshot::channel();
        if v.1.len() > finished::PACK_ENTRY_MAX {
            let bucket = finished::bucket(&v.0).ok_or_else(|| not_v7(&v.0))?;
            self.finished_rows.send(((bucket, v.0, v.1), tx)).await.map_err(|_| closed())?;
        } else {
            packs.send((v, tx)).await.map_err(|_| closed())?;
        }
        rx.await.map_err(|_| closed())?
    }

    pub async fn job(&self, job_id: &str) -> Result<Option<JobRow>, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.reads.send((job_id.to_string(), tx)).await.map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }
}

/// Reads a job's state: its `jobs` row and, for UUIDv7 ids, its finished records
/// (`core::finished`: packs, and rows of the per-job layout), merged into one `JobRow`
/// (the newest wins).
pub struct Lookup {
    pub session: Arc<Session>,
    pub get_jobs: PreparedStatement,
    /// Rows of the per-job layout (`finished_jobs`), by bucket and ids.
    pub get_finished: PreparedStatement,
    /// Every pack of a pack bucket.
    pub get_packs: PreparedStatement,
}

impl Lookup {
    /// The states of `ids` (deduplicated by the caller); ids without any are absent.
    pub async fn fetch(&self, ids: Vec<String>) -> Result<HashMap<String, JobRow>, StoreError> {
        let mut by_bucket: HashMap<i64, Vec<String>> = HashMap::new();
        let mut by_pack_bucket: HashMap<i64, Vec<String>> = HashMap::new();
        for id in &ids {
            if let (Some(b), Some(p)) = (finished::bucket(id), finished::pack_bucket(id)) {
                by_bucket.entry(b).or_default().push(id.clone());
                by_pack_bucket.entry(p).or_default().push(id.clone());
            }
        }
        let finished = futures::future::try_join_all(by_bucket.into_iter().map(|(b, ids)| self.finished(b, ids)));
        let packed = futures::future::try_join_all(by_pack_bucket.into_iter().map(|(b, ids)| self.packed(b, ids)));
        let (mut rows, finished, packed) = tokio::try_join!(self.rows(ids), finished, packed)?;
        for (id, record, output) in finished.into_iter().chain(packed).flatten() {
            merge(&mut rows, id, record, output);
        }
        Ok(rows)
    }

    /// The finished records of `ids` in the packs of `bucket` (a job may be in several:
    /// a rerun, or a run repeated after a lost acknowledgement; `merge` keeps the newest).
    async fn packed(&self, bucket: i64, ids: Vec<String>) -> Result<Vec<Finished>, StoreError> {
        use futures::TryStreamExt;
        let err = |message: String| StoreError::Query { what: "get finished packs", message };
        let mut stmt = self.get_packs.clone();
        stmt.set_page_size(PACK_PAGE);
        let pager = self.session.execute_iter(stmt, (bucket,)).await.map_err(|e| err(e.to_string()))?;
        let mut packs = pager.rows_stream::<(Option<Vec<u8>>,)>().map_err(|e| err(e.to_string()))?;
        let wanted: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
        let mut out = Vec::new();
        while let Some((body,)) = packs.try_next().await.map_err(|e| err(e.to_string()))? {
            // A pack this version cannot read is an error, not missing jobs: treating it
            // as absent would run finished jobs again.
            let opened = finished::open(body.as_deref().unwrap_or_default());
            let entries = opened.as_deref().map_err(Clone::clone).and_then(finished::entries);
            let entries = entries.map_err(|e| err(format!("bucket {bucket}: {e}")))?;
            for (id, blob) in entries.into_iter().filter(|(id, _)| wanted.contains(id)) {
                let (record, output) = FinishedRecord::decode(blob).map_err(|e| err(format!("job {id}: {e}")))?;
                out.push((id.to_string(), record, output));
            }
        }
        Ok(out)
    }

    async fn rows(&self, ids: Vec<String>) -> Result<HashMap<String, JobRow>, StoreError> {
        let err = |message: String| StoreError::Query { what: "get jobs", message };
        let res = self.session.execute_unpaged(&self.get_jobs, (ids,)).await.map_err(|e| err(e.to_string()))?;
        let rows = res.into_rows_result().map_err(|e| err(e.to_string()))?;
        let it = rows.rows::<JobRow>().map_err(|e| err(e.to_string()))?;
        let mut out = HashMap::new();
        for r in it {
            let r = r.map_err(|e| err(e.to_string()))?;
            out.insert(r.job_id.clone(), r);
        }
        Ok(out)
    }

    async fn finished(&self, bucket: i64, ids: Vec<String>) -> Result<Vec<Finished>, StoreError> {
        let err = |message: String| StoreError::Query { what: "get finished jobs", message };
        let res =
            self.session.execute_unpaged(&self.get_finished, (bucket, ids)).await.map_err(|e| err(e.to_string()))?;
        let rows = res.into_rows_result().map_err(|e| err(e.to_string()))?;
        let mut out = Vec::new();
        for r in rows.rows::<(String, Vec<u8>)>().map_err(|e| err(e.to_string()))? {
            let (id, blob) = r.map_err(|e| err(e.to_string()))?;
            // A record this version cannot read is an error, not a missing job: treating
            // it as absent would run a finished job again.
            let (record, output) = FinishedRecord::decode(&blob).map_err(|e| err(format!("job {id}: {e}")))?;
            out.push((id, record, output));
        }
        Ok(out)
    }
}

type Finished = (String, FinishedRecord<'static>, Option<Vec<u8>>);

/// Folds a packed record (queued or finished) into the job's state when it wins
/// (`finished::record_wins`); the row's cancellation flag stays (it lives only there).
fn merge(rows: &mut HashMap<String, JobRow>, id: String, record: FinishedRecord<'static>, output: Option<Vec<u8>>) {
    let row = rows.get(&id);
    let terminal = record.is_terminal();
    let current = |r: &JobRow| finished::order_of(r.status.as_deref(), r.generation, r.updated_at);
    if row.is_some_and(|r| !finished::record_wins(current(r), (record.generation, record.updated_at), terminal)) {
        return;
    }
    let cancel_requested = row.and_then(|r| r.cancel_requested);
    let merged = JobRow {
        job_id: id.clone(),
        tenant: Some(record.tenant.into_owned()),
        job_type: Some(record.job_type.into_owned()),
        pool: Some(record.pool.into_owned()),
        status: Some(record.status.into_owned()),
        attempts: Some(record.attempts),
        crash_count: Some(record.crash_count),
        generation: Some(record.generation),
        submitted_at: Some(record.submitted_at),
        started_at: record.started_at,
        finished_at: record.finished_at,
        worker: (!record.worker.is_empty()).then(|| record.worker.into_owned()),
        error: None,
        failure_class: None,
        output,
        cancel_requested,
        updated_at: Some(record.updated_at),
        peak_memory_bytes: record.peak_memory_bytes,
        cpu_ms: record.cpu_ms,
    };
    rows.insert(id, merged);
}

/// The error for a finished record whose job id is not a UUIDv7.
pub(super) fn not_v7(job_id: &str) -> StoreError {
    StoreError::Query {
        what: "put finished job",
        message: format!("job id {job_id:?} is not a UUIDv7: its state belongs in the jobs table"),
    }
}

fn closed() -> StoreError {
    StoreError::Query { what: "coalesced statement", message: "the store's coalescer stopped".into() }
}

/// Waits for a free slot of `permits`, then gathers (at least one request, see
/// [`gather`]): while every slot is busy, requests pile up and the next gather takes them
/// all, so merged requests grow with the load instead of staying as small as the arrival rate.
async fn next_merged<T>(
    rx: &mut mpsc::Receiver<T>,
    permits: &Arc<Semaphore>,
    max: usize,
    linger: std::time::Duration,
) -> Option<(OwnedSemaphorePermit, Vec<T>)> {
    let permit = permits.clone().acquire_owned().await.ok()?;
    Some((permit, gather(rx, max, linger).await?))
}

/// Takes one request, then whatever else arrives within `linger` of it (zero: only what
/// is already waiting), up to `max`.
async fn gather<T>(rx: &mut mpsc::Receiver<T>, max: usize, linger: std::time::Duration) -> Option<Vec<T>> {
    let mut batch = vec![rx.recv().await?];
    let until = tokio::time::Instant::now() + linger;
    while batch.len() < max {
        match rx.try_recv() {
            Ok(r) => batch.push(r),
            Err(mpsc::error::TryRecvError::Disconnected) => break,
            Err(mpsc::error::TryRecvError::Empty) if linger.is_zero() => break,
            Err(mpsc::error::TryRecvError::Empty) => match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(r)) => batch.push(r),
                Ok(None) | Err(_) => break,
            },
        }
    }
    Some(batch)
}

/// Serves merged requests: gathers what is waiting, runs `handle` on it with at most
/// `IN_FLIGHT` merged requests outstanding.
async fn serve<T, F, Fut>(mut rx: mpsc::Receiver<T>, handle: F)
where
    F: Fn(Vec<T>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some((permit, reqs)) = next_merged(&mut rx, &permits, MAX_BATCH, std::time::Duration::ZERO).await {
        let work = handle(reqs);
        tokio::spawn(async move {
            let _permit = permit;
            work.await
        });
    }
}

/// Serves one statement's writes, merged into unlogged batches (`what` names it in errors).
pub(super) async fn write_loop<V>(
    session: Arc<Session>,
    stmt: PreparedStatement,
    rx: mpsc::Receiver<(V, oneshot::Sender<Result<(), StoreError>>)>,
    what: &'static str,
) where
    V: scylla::serialize::row::SerializeRow + Send + Sync + 'static,
{
    serve(rx, |reqs: Vec<(V, oneshot::Sender<Result<(), StoreError>>)>| {
        let (session, stmt) = (session.clone(), stmt.clone());
        async move {
            let (values, replies): (Vec<V>, Vec<_>) = reqs.into_iter().unzip();
            let result = write_rows(&session, &stmt, &values).await;
            let result = result.map_err(|message| StoreError::Query { what, message });
            for reply in replies {
                let _ = reply.send(result.clone());
            }
        }
    })
    .await
}

/// Serves records to pack: what `gather` takes is packed by bucket
/// (`core::finished::packs`) and written in batches of at most `MAX_BATCH_BYTES`,
/// `PACK_IN_FLIGHT` writes at most outstanding. Each caller hears the result of the batch
/// that held its record.
async fn pack_loop(
    session: Arc<Session>,
    stmt: PreparedStatement,
    mut rx: mpsc::Receiver<FinishedReq>,
    gather: Gather,
) {
    let permits = Arc::new(Semaphore::new(PACK_IN_FLIGHT));
    while let Some((first_permit, reqs)) = next_merged(&mut rx, &permits, gather.max, gather.linger).await {
        let (entries, replies): (Vec<FinishedValues>, Vec<_>) = reqs.into_iter().unzip();
        let mut replies: Vec<Option<_>> = replies.into_iter().map(Some).collect();
        let mut first_permit = Some(first_permit);
        for packs in batches_of(finished::packs(&entries)) {
            // The first batch uses the slot the gather waited for; any further one waits.
            let permit = if let Some(p) = first_permit.take() {
                p
            } else if let Ok(p) = permits.clone().acquire_owned().await {
                p
            } else {
                return;
            };
            let mut waiting = Vec::new();
            for (_, _, held) in &packs {
                waiting.extend(held.iter().filter_map(|i| replies[*i].take()));
            }
            let (session, stmt) = (session.clone(), stmt.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let values: Vec<(i64, uuid::Uuid, Vec<u8>)> =
                    packs.into_iter().map(|(b, body, _)| (b, uuid::Uuid::new_v4(), body)).collect();
                let result = write_rows(&session, &stmt, &values).await;
                let result = result.map_err(|message| StoreError::Query { what: "put finished packs", message });
                for reply in waiting {
                    let _ = reply.send(result.clone());
                }
            });
        }
    }
}

/// A pack: (bucket, body, indexes of the records it holds).
type Pack = (i64, Vec<u8>, Vec<usize>);

/// Packs (in bucket order, as `core::finished::packs` gives them) split into batches of
/// at most `MAX_BATCH_BYTES` of bodies and row overheads (a pack larger than that is a
/// batch of its own) and at most `MAX_BATCH_PARTITIONS` buckets; never an empty batch.
fn batches_of(packs: Vec<Pack>) -> Vec<Vec<Pack>> {
    let mut batches: Vec<Vec<Pack>> = Vec::new();
    let (mut bytes, mut buckets) = (0, 0);
    for pack in packs {
        let len = pack.1.len().saturating_add(PACK_ROW_BYTES);
        let same_bucket = batches.last().and_then(|b| b.last()).is_some_and(|last| last.0 == pack.0);
        let fits = bytes + len <= MAX_BATCH_BYTES && (same_bucket || buckets < MAX_BATCH_PARTITIONS);
        match batches.last_mut() {
            Some(batch) if fits => {
                batch.push(pack);
                buckets += usize::from(!same_bucket);
            }
            _ => {
                batches.push(vec![pack]);
                (bytes, buckets) = (0, 1);
            }
        }
        bytes += len;
    }
    batches
}

/// Writes rows of one statement: alone, or as one unlogged batch.
async fn write_rows<V>(session: &Session, stmt: &PreparedStatement, values: &[V]) -> Result<(), String>
where
    V: scylla::serialize::row::SerializeRow,
{
    let result = if values.len() == 1 {
        session.execute_unpaged(stmt, &values[0]).await.map(|_| ())
    } else {
        let mut batch = Batch::new(BatchType::Unlogged);
        for _ in 0..values.len() {
            batch.append_statement(stmt.clone());
        }
        session.batch(&batch, values).await.map(|_| ())
    };
    result.map_err(|e| e.to_string())
}

async fn read_loop(lookup: Arc<Lookup>, rx: mpsc::Receiver<ReadReq>) {
    serve(rx, |reqs: Vec<ReadReq>| {
        let lookup = lookup.clone();
        async move {
            let mut ids: Vec<String> = reqs.iter().map(|(id, _)| id.clone()).collect();
            ids.sort_unstable();
            ids.dedup();
            let rows = lookup.fetch(ids).await;
            for (id, reply) in reqs {
                let _ = reply.send(rows.as_ref().map(|m| m.get(&id).cloned()).map_err(Clone::clone));
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pack(len: usize) -> Pack {
        (0, vec![0; len], vec![])
    }

    #[test]
    fn batches_stay_under_the_byte_limit_and_keep_every_pack_in_order() {
        let third = MAX_BATCH_BYTES / 3 - PACK_ROW_BYTES;
        let sizes = [third, third, third, third, MAX_BATCH_BYTES + 1, 1, 1];
        let batches = batches_of(sizes.iter().map(|n| pack(*n)).collect());
        let lens: Vec<Vec<usize>> = batches.iter().map(|b| b.iter().map(|p| p.1.len()).collect()).collect();
        assert_eq!(lens, vec![vec![third, third, third], vec![third], vec![MAX_BATCH_BYTES + 1], vec![1, 1]]);
        assert!(batches_of(Vec::new()).is_empty(), "no packs, no (empty) batch to write");
    }

    #[test]
    fn many_small_packs_count_their_rows_toward_the_batch_limit() {
        let batches = batches_of((0..5_000).map(|_| pack(400)).collect());
        let counted = |b: &Vec<Pack>| b.iter().map(|p| p.1.len() + PACK_ROW_BYTES).sum::<usize>();
        assert!(batches.iter().all(|b| counted(b) <= MAX_BATCH_BYTES), "rows counted with their overhead");
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 5_000, "every pack in a batch");
        assert_eq!(batches[0].len(), MAX_BATCH_BYTES / (400 + PACK_ROW_BYTES), "full batches, not smaller");
    }

    #[test]
    fn a_batch_spans_at_most_its_partition_bound_and_keeps_a_buckets_packs_together() {
        // 250 buckets of 3 small packs each: bytes alone would fit them in 2 batches.
        let packs: Vec<Pack> = (0..250).flat_map(|b| (0..3).map(move |_| (b, vec![0; 100], vec![]))).collect();
        let batches = batches_of(packs);
        let buckets = |b: &Vec<Pack>| b.iter().map(|p| p.0).collect::<std::collections::BTreeSet<_>>().len();
        assert_eq!(batches.iter().map(buckets).collect::<Vec<_>>(), vec![100, 100, 50]);
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), vec![300, 300, 150], "no bucket split");
        let one_bucket: Vec<Pack> = (0..500).map(|_| (7, vec![0; 100], vec![])).collect();
        assert_eq!(batches_of(one_bucket).len(), 1, "one partition: the byte bound alone");
    }

    /// Sends `n` numbers, `every` apart, starting now.
    fn arrivals(n: usize, every: std::time::Duration) -> mpsc::Receiver<usize> {
        let (tx, rx) = mpsc::channel(n.max(1));
        tokio::spawn(async move {
            for i in 0..n {
                if tx.send(i).await.is_err() {
                    return;
                }
                tokio::time::sleep(every).await;
            }
        });
        rx
    }

    #[tokio::test(start_paused = true)]
    async fn a_gather_takes_what_arrives_within_its_linger_of_the_first_record() {
        let ms = std::time::Duration::from_millis;
        // One record every 7 ms: a finished-record gather (80 ms) takes the first and the
        // eleven within its linger (up to 77 ms), a queued-record gather (20 ms) the first
        // and two.
        for (gather, expect) in [(FINISHED_GATHER, 12), (QUEUED_GATHER, 3)] {
            let mut rx = arrivals(100, ms(7));
            let got = super::gather(&mut rx, gather.max, gather.linger).await.expect("a record");
            assert_eq!(got, (0..expect).collect::<Vec<_>>(), "{gather:?}");
            // What arrives after the linger starts the next gather.
            let next = super::gather(&mut rx, gather.max, gather.linger).await.expect("more records");
            assert_eq!(next.first(), Some(&expect), "{gather:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_gather_stops_at_its_most_records_without_waiting_out_the_linger() {
        let mut rx = arrivals(20_000, std::time::Duration::ZERO);
        let started = tokio::time::Instant::now();
        let got = super::gather(&mut rx, FINISHED_GATHER.max, FINISHED_GATHER.linger).await.expect("records");
        assert_eq!(got.len(), FINISHED_GATHER.max);
        assert!(started.elapsed() < FINISHED_GATHER.linger, "a full gather is written at once");
    }
}
