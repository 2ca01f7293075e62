//! The spill path's I/O shell (pure bookkeeping in `core::backlog`): a flooding tenant's
//! jobs beyond its buffer are written to the store's per-(partition, tenant) backlog
//! instead of pausing a Kafka partition that other tenants share, and read back in order
//! as the tenant's buffer drains. One `Spiller` per pool loop: a writer task batching
//! spills, and one-shot tasks for reads, index loads (a partition's new owner learns
//! which tenants have spilled rows) and drops of finished buckets. Every result comes
//! back to the pool loop as a [`BacklogEvent`]; the loop owns all state.

use super::durable::with_retries;
use super::route::Pending;
use crate::core::backlog::{bucket_of, ReadPlan};
use crate::seams::BacklogStore;
use crate::store::{BacklogKey, StoreError};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// Per (incarnation, partition, tenant): the offsets of spilled jobs written, and the jobs whose write
/// failed (offset, job), kept in memory.
type WrittenOrNot = (Vec<i64>, Vec<(i64, Pending)>);

/// Most spills one writer round takes from its queue.
const ROUND: usize = 4096;
/// Store writes one round runs at once.
const WRITE_CONCURRENCY: usize = 8;

/// A job to spill: its raw message (read back and decoded again later) and the decoded
/// job, which returns to memory if the write fails.
pub struct SpillReq {
    pub incarnation: u64,
    pub partition: i32,
    pub tenant: String,
    pub offset: i64,
    pub bytes: Vec<u8>,
    pub job: Pending,
}

/// What the spill path reports back to the pool loop.
pub enum BacklogEvent {
    /// Spills of one tenant on one partition: `acked` offsets are durable in the store;
    /// `failed` jobs could not be written (the loop keeps them in memory).
    Spilled { incarnation: u64, partition: i32, tenant: String, acked: Vec<i64>, failed: Vec<(i64, Pending)> },
    /// A planned read came back (`Err` after retries: plan it again later).
    Read {
        incarnation: u64,
        partition: i32,
        tenant: String,
        plan: ReadPlan,
        rows: Result<Vec<(i64, Vec<u8>)>, StoreError>,
    },
    /// The backlog index of a newly owned partition: (tenant, bucket) pairs.
    Loaded { incarnation: u64, partition: i32, entries: Vec<(String, i64)> },
    /// A finished bucket was dropped (or could not be: try again later).
    Dropped { incarnation: u64, partition: i32, tenant: String, bucket: i64, ok: bool },
}

type Report = Arc<dyn Fn(BacklogEvent) + Send + Sync>;

/// What the spill path did so far in this pool loop (no tenant in it): shown in the
/// pool's stats (`spill`) and as metrics, so a partition held back by slow spill writes
/// is visible.
#[derive(Debug, Default)]
pub struct SpillCounters {
    /// Jobs made durable in the store, and the store rows that took them.
    pub jobs_written: AtomicU64,
    pub rows_written: AtomicU64,
    /// Store writes (one per group of rows of a bucket), their summed and longest time.
    pub writes: AtomicU64,
    pub write_ms_total: AtomicU64,
    pub write_ms_max: AtomicU64,
    /// Times a partition paused because its spill writes in flight reached their bound,
    /// and the time partitions spent paused for it.
    pub pauses: AtomicU64,
    pub paused_ms: AtomicU64,
}

impl SpillCounters {
    pub fn json(&self) -> serde_json::Value {
        let (jobs, rows, writes) =
            (self.jobs_written.load(Relaxed), self.rows_written.load(Relaxed), self.writes.load(Relaxed));
        serde_json::json!({
            "jobs_written": jobs, "rows_written": rows, "writes": writes,
            "jobs_per_row": if rows == 0 { 0.0 } else { (jobs as f64 / rows as f64 * 10.0).round() / 10.0 },
            "write_ms_avg": self.write_ms_total.load(Relaxed).checked_div(writes).unwrap_or(0),
            "write_ms_max": self.write_ms_max.load(Relaxed),
            "pauses": self.pauses.load(Relaxed), "paused_ms": self.paused_ms.load(Relaxed),
        })
    }

    /// One store write of `jobs` spilled jobs in `rows` rows, started at `started`.
    fn wrote(&self, pool: &'static str, jobs: usize, rows: usize, started: Instant) {
        let took = started.elapsed();
        let ms = took.as_millis() as u64;
        self.jobs_written.fetch_add(jobs as u64, Relaxed);
        self.rows_written.fetch_add(rows as u64, Relaxed);
        self.writes.fetch_add(1, Relaxed);
        self.write_ms_total.fetch_add(ms, Relaxed);
        self.write_ms_max.fetch_max(ms, Relaxed);
        metrics::counter!(crate::metrics::SPILL_ROWS, "pool" => pool).increment(rows as u64);
        metrics::histogram!(crate::metrics::SPILL_WRITE_SECONDS, "pool" => pool).record(took.as_secs_f64());
    }
}

/// One pool loop's handle on the spill path.
pub struct Spiller {
    stmts: Arc<dyn BacklogStore>,
    topic: Arc<str>,
    writer: mpsc::UnboundedSender<SpillReq>,
    report: Report,
    pub counters: Arc<SpillCounters>,
}

impl Spiller {
    /// Starts the writer task of a pool topic; `report` hands events to the pool loop.
    pub fn start(
        stmts: Arc<dyn BacklogStore>,
        topic: &str,
        pool: &'static str,
        report: impl Fn(BacklogEvent) + Send + Sync + 'static,
    ) -> Self {
        let report: Report = Arc::new(report);
        let topic: Arc<str> = Arc::from(topic);
        let counters = Arc::new(SpillCounters::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = Writer {
            stmts: stmts.clone(),
            topic: topic.clone(),
            report: report.clone(),
            counters: counters.clone(),
            pool,
        };
        tokio::spawn(write_loop(writer, rx));
        Spiller { stmts, topic, writer: tx, report, counters }
    }

    /// Queues a spill (the loop bounds what is in flight by pausing the partition).
    pub fn spill(&self, req: SpillReq) {
        if let Err(mpsc::error::SendError(req)) = self.writer.send(req) {
            // The writer is gone (shutting down): report the job as not spilled.
            (self.report)(BacklogEvent::Spilled {
                incarnation: req.incarnation,
                partition: req.partition,
                tenant: req.tenant,
                acked: vec![],
                failed: vec![(req.offset, req.job)],
            });
        }
    }

    pub fn read(&self, incarnation: u64, partition: i32, tenant: String, plan: ReadPlan) {
        let (stmts, topic, report) = (self.stmts.clone(), self.topic.clone(), self.report.clone());
        tokio::spawn(async move {
            let key = BacklogKey { topic: &topic, partition, tenant: &tenant, bucket: plan.bucket };
            let rows = with_retries(|| stmts.read_rows(key, plan.after, plan.before, plan.limit)).await;
            if let Err(e) = &rows {
                tracing::warn!(partition, %tenant, error = %e, "cannot read spilled jobs back; will try again");
            }
            report(BacklogEvent::Read { incarnation, partition, tenant, plan, rows });
        });
    }

    /// Loads a newly owned partition's backlog index, retrying until the store answers.
    pub fn load(&self, incarnation: u64, partition: i32) {
        let (stmts, topic, report) = (self.stmts.clone(), self.topic.clone(), self.report.clone());
        tokio::spawn(async move {
            let mut delay = std::time::Duration::from_millis(200);
            loop {
                match stmts.list(&topic, partition).await {
                    Ok(entries) => return report(BacklogEvent::Loaded { incarnation, partition, entries }),
                    Err(e) => {
                        tracing::warn!(partition, error = %e, "cannot load the spilled-backlog index; the partition waits");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(std::time::Duration::from_secs(10));
                    }
                }
            }
        });
    }

    pub fn drop_bucket(&self, incarnation: u64, partition: i32, tenant: String, bucket: i64) {
        let (stmts, topic, report) = (self.stmts.clone(), self.topic.clone(), self.report.clone());
        tokio::spawn(async move {
            let key = BacklogKey { topic: &topic, partition, tenant: &tenant, bucket };
            let res = with_retries(|| stmts.drop_bucket(key)).await;
            if let Err(e) = &res {
                tracing::debug!(partition, %tenant, bucket, error = %e, "cannot drop a finished backlog bucket yet");
            }
            report(BacklogEvent::Dropped { incarnation, partition, tenant, bucket, ok: res.is_ok() });
        });
    }
}

/// The writer task's handles.
struct Writer {
    stmts: Arc<dyn BacklogStore>,
    topic: Arc<str>,
    report: Report,
    counters: Arc<SpillCounters>,
    pool: &'static str,
}

/// Writes spills in rounds: everything queued (up to `ROUND`), grouped by store
/// partition, written concurrently, then reported per (partition, tenant) in offset
/// order. Rounds run one after another, so each tenant's acknowledgements come in order.
async fn write_loop(w: Writer, mut rx: mpsc::UnboundedReceiver<SpillReq>) {
    let Writer { stmts, topic, report, counters, pool } = w;
    let mut round = Vec::with_capacity(ROUND);
    while rx.recv_many(&mut round, ROUND).await > 0 {
        type Group = (u64, i32, String, i64);
        let mut groups: BTreeMap<Group, Vec<SpillReq>> = BTreeMap::new();
        for req in round.drain(..) {
            let key = (req.incarnation, req.partition, req.tenant.clone(), bucket_of(req.offset));
            groups.entry(key).or_default().push(req);
        }
        let written: Vec<(Group, Vec<SpillReq>, bool)> = futures::stream::iter(groups)
            .map(|(key, reqs)| {
                let (stmts, topic, counters) = (&stmts, &topic, &counters);
                async move {
                    let rows: Vec<(i64, &[u8])> = reqs.iter().map(|r| (r.offset, r.bytes.as_slice())).collect();
                    let bk = BacklogKey { topic, partition: key.1, tenant: &key.2, bucket: key.3 };
                    let started = Instant::now();
                    let res = with_retries(|| stmts.put_rows(bk, &rows)).await;
                    match &res {
                        Ok(written) => counters.wrote(pool, rows.len(), *written, started),
                        Err(e) => tracing::error!(partition = key.1, tenant = %key.2, error = %e, "cannot spill jobs; keeping them in memory"),
                    }
                    let ok = res.is_ok();
                    (key, reqs, ok)
                }
            })
            .buffered(WRITE_CONCURRENCY)
            .collect()
            .await;
        // One report per (incarnation, partition, tenant), buckets in order.
        let mut per_tenant: BTreeMap<(u64, i32, String), WrittenOrNot> = BTreeMap::new();
        for ((incarnation, partition, tenant, _), reqs, ok) in written {
            let e = per_tenant.entry((incarnation, partition, tenant)).or_default();
            for r in reqs {
                if ok {
                    e.0.push(r.offset);
                } else {
                    e.1.push((r.offset, r.job));
                }
            }
        }
        for ((incarnation, partition, tenant), (acked, failed)) in per_tenant {
            report(BacklogEvent::Spilled { incarnation, partition, tenant, acked, failed });
        }
    }
}
