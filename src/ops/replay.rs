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
//! A replay covers what was on the topic when it started: each partition up to the high
//! watermark captured at the start (Apache Kafka's watermarks are exact). A partition is
//! finished once the scan has read, or been moved past, the record just below that
//! watermark (control records and compacted gaps count: the consumer's position says
//! so); a partition whose watermark was 0, or whose resume point is already there, is
//! finished at once. Records at or past the watermark were written after the start
//! (possibly dead letters caused by this very replay) and are left for the next run.
//!
//! A bound remains for a broker that stops delivering: when no record arrives for
//! `idle_timeout` (default 3 s; at least 10 s while a partition still has records below
//! its start watermark) the scan ends with a warning naming the partitions left unread
//! (see [`Scan::unread`]) rather than a quiet partial result. Re-running continues from
//! the resume points.
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
use crate::model::{FailureClass, JobSubmitted, Millis};
use crate::store::{ReplayStatements, Store, StoreError};
use crate::submit::Submitter;
use crate::{codec, now_ms};
use governor::{Quota, RateLimiter};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Matches shown in the report's sample table.
pub const SAMPLE_ROWS: usize = 10;
/// Characters of the last error kept in a sample row.
pub const SAMPLE_ERROR_CHARS: usize = 60;
/// How long the next record may take while a partition is known to hold unread records
/// (below its start high watermark).
const UNREAD_WAIT: Duration = Duration::from_secs(10);
/// Longest time between two saves of the resume points.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Progress callbacks at most this often (plus one at the end).
pub(crate) const PROGRESS_EVERY: Duration = Duration::from_millis(100);

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
    /// Stop after reading this many records (matching or not); the next run of the same
    /// replay resumes after them.
    pub max_scanned: Option<u64>,
    /// Replay jobs even past `max_replays`.
    pub force: bool,
    pub max_replays: i32,
    /// Replay id; None: derived from the source and the filter ([`rp::derive_id`]).
    pub id: Option<String>,
    /// End of the scan: no record for this long (see the module documentation).
    pub idle_timeout: Duration,
    /// Set to stop gracefully: the current batch is finished and its resume points saved.
    pub stop: Option<Arc<AtomicBool>>,
    /// Who asked, for the `replayed` event each replayed job gets (its audit):
    /// `tenant acme (key ci)`, `admin key ops`, `cli (user alice)`.
    pub requested_by: String,
}

impl ReplayOptions {
    /// A replay of `source` with the defaults, asked by `requested_by` (see the field).
    pub fn new(source: ReplaySource, requested_by: impl Into<String>) -> ReplayOptions {
        ReplayOptions {
            source,
            filter: ReplayFilter::default(),
            dry_run: false,
            rate_per_sec: 100,
            limit: None,
            max_scanned: None,
            force: false,
            max_replays: rp::DEFAULT_MAX_REPLAYS,
            id: None,
            idle_timeout: Duration::from_secs(3),
            stop: None,
            requested_by: requested_by.into(),
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
    /// Of `scanned`: records not the filter's tenant's, or undecodable (whose tenant is
    /// unknown). A tenant's view leaves them out.
    pub foreign: u64,
    pub partitions: usize,
    pub partitions_done: usize,
    pub elapsed: Duration,
    pub dry_run: bool,
}

/// Records not replayed, by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Another tenant's job, when the filter names a tenant.
    pub other_tenants: u64,
    /// The filter did not match (its tenant apart).
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
        self.other_tenants + self.filter + self.loop_guard + self.undecodable + self.duplicate + self.expired
    }

    /// Records not the filter's tenant's, or undecodable (whose tenant is unknown).
    pub fn foreign(&self) -> u64 {
        self.other_tenants + self.undecodable
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
    /// `max_scanned` records read.
    ScanLimit,
    /// The stop flag was set.
    Interrupted,
}

impl Stopped {
    pub fn describe(self) -> &'static str {
        match self {
            Stopped::End => "reached the records written after the replay started",
            Stopped::Idle => "reached the end of the topic",
            Stopped::Limit => "reached --limit",
            Stopped::ScanLimit => "read its limit of records (the same replay again continues after them)",
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
    /// Things worth a look about the run: partitions left unread, read errors.
    pub warnings: Vec<String>,
    /// Things about the shared topic's records: the first undecodable ones and offsets that
    /// went backwards, with where they are (kept apart from `warnings`: a tenant's view
    /// leaves them out, as their tenant is unknown and offsets count every tenant's records).
    pub operator_notes: Vec<String>,
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

/// Runs one replay (see the module documentation); `progress` is called as it goes.
pub async fn run(
    cfg: &Config,
    opts: ReplayOptions,
    mut progress: impl FnMut(&Progress),
) -> Result<ReplayReport, ReplayError> {
    let mut replay = Replay::open(cfg, opts).await?;
    let stopped = replay.decide_all(&mut progress).await?;
    replay.finish(&mut progress).await?;
    Ok(replay.report(stopped))
}

/// One replay under way: what it reads, how it produces, and what it counted so far.
struct Replay {
    opts: ReplayOptions,
    t0: Instant,
    topic: String,
    replay_id: String,
    guard: Guard,
    /// The saved resume points this run starts from: partition -> offset.
    resume: HashMap<i32, i64>,
    scan: Scan,
    /// None in a dry run.
    submitter: Option<Arc<Submitter>>,
    limiter: governor::DefaultDirectRateLimiter,
    /// Produces in flight that make a batch (flushed together).
    batch: usize,
    checkpoints: Checkpoints,
    tally: Tally,
    last_progress: Option<Instant>,
    /// Time until the last record was decided and its batch saved.
    active: Duration,
}

/// What a replay counted and noted so far, for its progress and its report.
#[derive(Default)]
struct Tally {
    scanned: u64,
    matched: u64,
    scheduled: u64,
    skipped: Skipped,
    refused: Vec<String>,
    sample: Vec<SampleRow>,
    operator_notes: Vec<String>,
    undecodable_noted: u32,
    /// Job ids replayed earlier in this run.
    seen: HashSet<String>,
}

impl Replay {
    /// Reads the saved resume points, opens the scan from them and prepares the
    /// submitter (none in a dry run), the rate limit and the resume bookkeeping.
    async fn open(cfg: &Config, opts: ReplayOptions) -> Result<Replay, ReplayError> {
        let t0 = Instant::now();
        let rate = NonZeroU32::new(opts.rate_per_sec).ok_or(ReplayError::BadRate)?;
        let topic = source_topic(cfg, opts.source);
        let replay_id = opts.replay_id();
        let guard = Guard { max_replays: opts.max_replays, force: opts.force };

        let store = Store::open(cfg).await?;
        let stmts = store.replay_statements().await?;
        let resume = stmts.offsets(&replay_id, &topic).await?;
        let scan = Scan::open(cfg, "replay", vec![(topic.clone(), resume.clone())], opts.idle_timeout).await?;

        let submitter = if opts.dry_run {
            None
        } else {
            Some(Arc::new(Submitter::new(Arc::new(cfg.clone()), Some(store.clone()))?))
        };
        let burst = NonZeroU32::new((rate.get() / 50).max(1)).unwrap_or(NonZeroU32::MIN);
        let limiter = RateLimiter::direct(Quota::per_second(rate).allow_burst(burst));
        let batch = (rate.get() as usize).clamp(1, 500);

        let checkpoints = Checkpoints::new(
            replay_id.clone(),
            stmts,
            opts.dry_run,
            resume.iter().map(|(p, o)| ((topic.clone(), *p), *o)),
        );
        Ok(Replay {
            opts,
            t0,
            topic,
            replay_id,
            guard,
            resume,
            scan,
            submitter,
            limiter,
            batch,
            checkpoints,
            tally: Tally::default(),
            last_progress: None,
            active: Duration::ZERO,
        })
    }

    /// Decides record after record, saving the resume points batch by batch, until the
    /// scan ends, `--limit` is reached or the stop flag is set; returns why it stopped.
    async fn decide_all(&mut self, progress: &mut impl FnMut(&Progress)) -> Result<Stopped, ReplayError> {
        loop {
            if let Some(stopped) = self.stop_before_next() {
                return Ok(stopped);
            }
            let rec = match self.scan.next().await {
                ScanStep::Record(rec) => rec,
                ScanStep::Idle => return Ok(Stopped::Idle),
                ScanStep::Tick => {
                    // The topic is quiet (or a record was passed over): serve the periodic
                    // save and the progress callback, then look at the stop flag again.
                    if self.checkpoints.flush_due() {
                        self.checkpoints.flush().await?;
                    }
                    self.progress_if_due(progress);
                    continue;
                }
            };
            self.decide(rec).await;
            if self.checkpoints.in_flight() >= self.batch || self.checkpoints.flush_due() {
                self.checkpoints.flush().await?;
            }
            self.active = self.t0.elapsed();
            self.progress_if_due(progress);
        }
    }

    /// Why the run stops before the next record, if it does: `--limit`, `max_scanned`,
    /// the end of the scan or the stop flag, in that order.
    fn stop_before_next(&self) -> Option<Stopped> {
        if self.opts.limit.is_some_and(|l| self.tally.scheduled >= l) {
            return Some(Stopped::Limit);
        }
        if self.opts.max_scanned.is_some_and(|l| self.tally.scanned >= l) {
            return Some(Stopped::ScanLimit);
        }
        if self.scan.finished() {
            return Some(Stopped::End);
        }
        if self.opts.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
            return Some(Stopped::Interrupted);
        }
        None
    }

    /// Decodes and decides one record, acts on the decision and marks the record decided.
    async fn decide(&mut self, rec: ScanRecord) {
        let (p, offset) = (rec.partition, rec.offset);
        let candidate = candidate(self.opts.source, &rec.payload);
        drop(rec);
        let t = &mut self.tally;
        t.scanned += 1;
        let decision = match &candidate {
            Ok(c) => rp::decide(c, &self.opts.filter, &t.seen, self.guard, &self.topic, now_ms()),
            Err(e) => {
                if t.undecodable_noted < 3 {
                    t.operator_notes.push(format!("partition {p} offset {offset}: undecodable record: {e}"));
                }
                t.undecodable_noted += 1;
                Decision::Undecodable
            }
        };
        if let (Ok(c), true) = (&candidate, decision.matched()) {
            t.matched += 1;
            if t.sample.len() < SAMPLE_ROWS {
                t.sample.push(sample_row(c, &decision));
            }
        }
        self.act(decision, &candidate, p, offset).await;
        self.checkpoints.decided(&self.topic, p, offset);
    }

    /// Counts a decision about the record at (`p`, `offset`); a job to replay is scheduled.
    async fn act(&mut self, decision: Decision, candidate: &Result<Candidate, codec::CodecError>, p: i32, offset: i64) {
        let t = &mut self.tally;
        match decision {
            Decision::Undecodable => {
                t.skipped.undecodable += 1;
                if let Ok(c) = candidate {
                    if c.job.is_none() && t.undecodable_noted < 3 {
                        t.operator_notes.push(format!(
                            "partition {p} offset {offset}: dead letter without a decodable job, only raw bytes \
                             (reason: {}); it cannot be replayed: fix the producer and resubmit",
                            c.reason.as_deref().unwrap_or("")
                        ));
                    }
                    t.undecodable_noted += 1;
                }
            }
            Decision::OtherTenant => t.skipped.other_tenants += 1,
            Decision::Filtered => t.skipped.filter += 1,
            Decision::Duplicate => t.skipped.duplicate += 1,
            Decision::Expired => t.skipped.expired += 1,
            Decision::LoopGuard(_) => {
                t.skipped.loop_guard += 1;
                if let (Ok(Candidate { job: Some(j), .. }), true) = (candidate, t.refused.len() < SAMPLE_ROWS) {
                    t.refused.push(j.job_id.clone());
                }
            }
            Decision::Replay(job) => self.schedule(job, p, offset).await,
        }
    }

    /// Counts a job to replay and, unless dry run, after the rate limit starts resetting
    /// its state row and producing it to its pool topic (awaited at the next flush).
    async fn schedule(&mut self, job: Box<JobSubmitted>, p: i32, offset: i64) {
        self.tally.seen.insert(job.job_id.clone());
        self.tally.scheduled += 1;
        if let Some(sub) = &self.submitter {
            self.limiter.until_ready().await;
            let (sub, stmts, job_id) = (sub.clone(), self.checkpoints.stmts.clone(), job.job_id.clone());
            let audit = (self.opts.requested_by.clone(), self.replay_id.clone());
            let task = tokio::spawn(async move {
                retrying(|| stmts.reset_job(&job.job_id, now_ms())).await.map_err(|e| e.to_string())?;
                // Stamped before the produce: the new run's events all come after it.
                let at = now_ms();
                sub.produce_replay(&job).await.map_err(|e| e.to_string())?;
                sub.replayed(&job, &audit.0, &audit.1, at);
                Ok(())
            });
            self.checkpoints.push(InFlight { topic: self.topic.clone(), partition: p, offset, job_id, task });
        }
    }

    /// Calls `progress` unless it was called less than [`PROGRESS_EVERY`] ago.
    fn progress_if_due(&mut self, progress: &mut impl FnMut(&Progress)) {
        if self.last_progress.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
            self.last_progress = Some(Instant::now());
            progress(&self.progress());
        }
    }

    /// The live view of the run so far.
    fn progress(&self) -> Progress {
        Progress {
            scanned: self.tally.scanned,
            matched: self.tally.matched,
            replayed: if self.opts.dry_run { self.tally.scheduled } else { self.checkpoints.acked },
            skipped: self.tally.skipped.total(),
            foreign: self.tally.skipped.foreign(),
            partitions: self.scan.partitions(),
            partitions_done: self.scan.partitions_done(),
            elapsed: self.t0.elapsed(),
            dry_run: self.opts.dry_run,
        }
    }

    /// Awaits the last produces, saves the last resume points and reports the final progress.
    async fn finish(&mut self, progress: &mut impl FnMut(&Progress)) -> Result<(), ReplayError> {
        let pending = self.checkpoints.in_flight() > 0;
        self.checkpoints.flush().await?;
        if pending {
            self.active = self.t0.elapsed();
        }
        progress(&self.progress());
        Ok(())
    }

    /// The report of the finished run, with the scan's warnings.
    fn report(mut self, stopped: Stopped) -> ReplayReport {
        let t = self.tally;

        ReplayReport {
            replay_id: self.replay_id,
            source: self.opts.source,
            topic: self.topic.clone(),
            dry_run: self.opts.dry_run,
            scanned: t.scanned,
            matched: t.matched,
            replayed: self.checkpoints.acked,
            would_replay: if self.opts.dry_run { t.scheduled } else { 0 },
            skipped: t.skipped,
            refused: t.refused,
            sample: t.sample,
            resumed_from: self.resume.into_iter().collect(),
            next_offsets: self.checkpoints.next_offsets(&self.topic),
            stopped,
            elapsed: self.t0.elapsed(),
            active: self.active,
            warnings: self.scan.take_warnings(),
            operator_notes: t.operator_notes.into_iter().chain(self.scan.take_offset_notes()).collect(),
        }
    }
}

/// A record of `source`'s topic, normalised.
fn candidate(source: ReplaySource, payload: &[u8]) -> Result<Candidate, codec::CodecError> {
    match source {
        ReplaySource::Dlq => codec::decode_dead_letter(payload).map(Candidate::from_dead_letter),
        ReplaySource::Retry(c) => codec::decode_job(payload).map(|j| Candidate::from_retry(j, c)),
    }
}

/// One record found by [`browse`]: where it is and what it holds.
#[derive(Debug, Clone)]
pub struct Listed {
    pub partition: i32,
    pub offset: i64,
    pub candidate: Candidate,
}

/// What [`browse`] found.
#[derive(Debug, Clone)]
pub struct Browsed {
    /// The newest matching records, oldest first.
    pub listed: Vec<Listed>,
    /// Records read.
    pub scanned: u64,
    /// Partitions the broker did not deliver up to their end in time (see
    /// [`Scan::unread`]), as `topic[partition]`: when not empty the listing is partial
    /// and says so.
    pub unread: Vec<String>,
}

/// The newest records of `source` that match `filter`, at most `max`, oldest first. Each
/// partition is read from its end back by its share of `max_scanned` (`max_scanned /
/// partitions`), so a tenant that floods the topic cannot push another tenant's recent
/// records out of view: every partition's newest records are read, whatever came before.
/// Reads only: nothing is produced, no resume point is read or saved (the console's DLQ
/// browser).
pub async fn browse(
    cfg: &Config,
    source: ReplaySource,
    filter: &ReplayFilter,
    max: usize,
    max_scanned: u64,
) -> Result<Browsed, ReplayError> {
    let topic = source_topic(cfg, source);
    let tail = Tail { per_partition: max_scanned / u64::from(cfg.kafka.partitions.max(1) as u32) };
    let mut scan = Scan::open_tails(cfg, "browse", &topic, tail, Duration::from_secs(1)).await?;
    let mut per_partition: HashMap<i32, std::collections::VecDeque<Listed>> = HashMap::new();
    let mut scanned = 0u64;
    let mut unread = Vec::new();
    while !scan.finished() && scanned < max_scanned {
        let rec = match scan.next().await {
            ScanStep::Record(rec) => rec,
            ScanStep::Tick => continue,
            ScanStep::Idle => {
                unread = scan.unread().into_iter().map(|(t, p)| format!("{t}[{p}]")).collect();
                break;
            }
        };
        scanned += 1;
        let Ok(c) = candidate(source, &rec.payload) else { continue };
        if filter.matches(&c) {
            let out = per_partition.entry(rec.partition).or_default();
            out.push_back(Listed { partition: rec.partition, offset: rec.offset, candidate: c });
            if out.len() > max {
                out.pop_front();
            }
        }
    }
    let mut listed: Vec<Listed> = per_partition.into_values().flatten().collect();
    listed.sort_by_key(|l| (l.candidate.at, l.partition, l.offset));
    let skip = listed.len().saturating_sub(max);
    Ok(Browsed { listed: listed.split_off(skip), scanned, unread })
}

/// Where a scan of a partition's newest records starts: this many before its end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tail {
    pub per_partition: u64,
}

impl From<FlushError> for ReplayError {
    fn from(e: FlushError) -> Self {
        match e {
            FlushError::Produce { job_id, partition, offset, message, .. } => {
                ReplayError::Produce { job_id, partition, offset, message }
            }
            FlushError::Checkpoint { partition, source, .. } => ReplayError::Checkpoint { partition, source },
        }
    }
}

// ---------------------------------------------------------------------------------------
// The scan ("Where the scan ends" above) and the resume points ("Resuming"), shared with
// `fairway rerun` (src/ops/rerun.rs), which reads the pool topics with the same rules.
// ---------------------------------------------------------------------------------------

/// One partition of a scan.
struct ScanPart {
    /// Never hand out records below this (the resume point).
    min: i64,
    /// High watermark at the start.
    hw: i64,
    /// One past the last record the broker delivered here.
    next: i64,
    done: bool,
    warned_backwards: bool,
}

/// One record handed out by [`Scan::next`].
pub(crate) struct ScanRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Broker timestamp (ms), if any.
    pub timestamp: Option<Millis>,
    pub payload: Vec<u8>,
}

pub(crate) enum ScanStep {
    /// The next record to decide.
    Record(ScanRecord),
    /// Nothing to decide yet (a quiet slice of at most 200 ms, or a record passed over):
    /// a chance for periodic work; call `next` again.
    Tick,
    /// No record for the idle timeout: the end of what is on the topics.
    Idle,
}

/// Reads topics (all partitions at once, one consumer, no group commits) from resume
/// points or the beginning to the end defined in the module documentation.
pub(crate) struct Scan {
    consumer: Arc<kafka::Reader>,
    idle_timeout: Duration,
    parts: BTreeMap<(String, i32), ScanPart>,
    /// When the current wait for a record turns into [`ScanStep::Idle`].
    deadline: Option<Instant>,
    read_errors: u32,
    warnings: Vec<String>,
    /// Warnings naming offsets of the shared topic (an operator's, not a tenant's).
    offset_notes: Vec<String>,
}

impl Scan {
    /// Assigns every partition of each topic, from its resume point (partition -> next
    /// offset) or the beginning, up to each partition's high watermark now.
    pub(crate) async fn open(
        cfg: &Config,
        group_prefix: &str,
        topics: Vec<(String, HashMap<i32, i64>)>,
        idle_timeout: Duration,
    ) -> Result<Scan, ReplayError> {
        Scan::open_from(cfg, group_prefix, topics, None, idle_timeout).await
    }

    /// Assigns every partition of `topic` from `tail` records before its high watermark
    /// now (or its beginning) up to that watermark.
    pub(crate) async fn open_tails(
        cfg: &Config,
        group_prefix: &str,
        topic: &str,
        tail: Tail,
        idle_timeout: Duration,
    ) -> Result<Scan, ReplayError> {
        Scan::open_from(cfg, group_prefix, vec![(topic.to_string(), HashMap::new())], Some(tail), idle_timeout).await
    }

    async fn open_from(
        cfg: &Config,
        group_prefix: &str,
        topics: Vec<(String, HashMap<i32, i64>)>,
        tail: Option<Tail>,
        idle_timeout: Duration,
    ) -> Result<Scan, ReplayError> {
        let consumer =
            Arc::new(kafka::reader(cfg, &cfg.group(&format!("{group_prefix}.{}", uuid::Uuid::new_v4())), false)?);
        let mut parts = BTreeMap::new();
        let mut tpl = TopicPartitionList::new();
        for (topic, resume) in &topics {
            let ends = kafka::partition_ends(consumer.clone(), topic.clone())
                .await
                .map_err(|message| ReplayError::Topic { topic: topic.clone(), message })?;
            for (p, hw) in ends {
                let tail_start = tail.map(|t| hw.saturating_sub(t.per_partition.min(i64::MAX as u64) as i64).max(0));
                let from = resume.get(&p).copied().or(tail_start);
                let done = hw == 0 || from.is_some_and(|f| f >= hw);
                if !done {
                    let off = from.map_or(Offset::Beginning, Offset::Offset);
                    tpl.add_partition_offset(topic, p, off)
                        .map_err(|e| ReplayError::Topic { topic: topic.clone(), message: e.to_string() })?;
                }
                let min = from.unwrap_or(0);
                parts.insert((topic.clone(), p), ScanPart { min, hw, next: min, done, warned_backwards: false });
            }
        }
        if tpl.count() > 0 {
            consumer.assign(&tpl).map_err(|e| ReplayError::Topic {
                topic: topics.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>().join(", "),
                message: e.to_string(),
            })?;
        }
        Ok(Scan {
            consumer,
            idle_timeout,
            parts,
            deadline: None,
            read_errors: 0,
            warnings: Vec::new(),
            offset_notes: Vec::new(),
        })
    }

    /// Every partition reached its end (or was empty).
    pub(crate) fn finished(&self) -> bool {
        self.parts.values().all(|p| p.done)
    }
    pub(crate) fn partitions(&self) -> usize {
        self.parts.len()
    }
    pub(crate) fn partitions_done(&self) -> usize {
        self.parts.values().filter(|p| p.done).count()
    }
    /// Read errors and offsets that went backwards, noted so far.
    pub(crate) fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// The warnings that name offsets of the topic, taken.
    pub(crate) fn take_offset_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.offset_notes)
    }

    /// Partitions (topic, partition) not finished and not yet read up to their start high
    /// watermark: records are known to be waiting there. Non-empty after
    /// [`ScanStep::Idle`] means the scan gave up early (the broker did not deliver them
    /// within the wait), so what it read is partial.
    pub(crate) fn unread(&self) -> Vec<(String, i32)> {
        self.parts.iter().filter(|(_, p)| !p.done && p.next < p.hw).map(|(k, _)| k.clone()).collect()
    }

    /// Waits (at most 200 ms) for the next record to decide. On [`ScanStep::Idle`] with
    /// partitions still [`Scan::unread`], a warning naming them is noted.
    pub(crate) async fn next(&mut self) -> ScanStep {
        let behind = self.parts.values().any(|p| !p.done && p.next < p.hw);
        let wait = if behind { self.idle_timeout.max(UNREAD_WAIT) } else { self.idle_timeout };
        let deadline = *self.deadline.get_or_insert_with(|| Instant::now() + wait);
        let now = Instant::now();
        if now >= deadline {
            let unread = self.unread();
            if !unread.is_empty() {
                let names: Vec<String> = unread.iter().map(|(t, p)| format!("{t}[{p}]")).collect();
                self.warnings.push(format!(
                    "no record arrived for {} s while {} still held unread records (below the high watermark taken \
                     at the start): this result is partial; run again (a replay or rerun with the same id continues \
                     where this one stopped)",
                    wait.as_secs(),
                    names.join(", ")
                ));
            }
            return ScanStep::Idle;
        }
        let slice = deadline.saturating_duration_since(now).min(Duration::from_millis(200));
        let msg = match tokio::time::timeout(slice, self.consumer.recv()).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "scan read error");
                self.read_errors += 1;
                if self.read_errors <= 3 {
                    let topics: BTreeMap<&str, ()> = self.parts.keys().map(|(t, _)| (t.as_str(), ())).collect();
                    let names: Vec<&str> = topics.into_keys().collect();
                    self.warnings.push(format!("reading {}: {e}", names.join(", ")));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                return ScanStep::Tick;
            }
            Err(_) => {
                self.finish_read_partitions();
                return ScanStep::Tick;
            }
        };
        self.deadline = None;
        let (topic, p, offset) = (msg.topic().to_string(), msg.partition(), msg.offset());
        let ts = msg.timestamp().to_millis();
        let Some(part) = self.parts.get_mut(&(topic.clone(), p)) else { return ScanStep::Tick };
        part.next = part.next.max(offset + 1);
        if part.done {
            return ScanStep::Tick;
        }
        if offset < part.min {
            // Only after an offset reset (the topic was recreated, or the resume point is
            // past its end): never decide a record twice.
            if !part.warned_backwards {
                part.warned_backwards = true;
                self.offset_notes.push(format!(
                    "{topic} partition {p}: the broker delivered offset {offset}, below the resume point {}; was the \
                     topic recreated? records below the resume point are not replayed (use a new --id to start over)",
                    part.min
                ));
            }
            return ScanStep::Tick;
        }
        if offset >= part.hw {
            // Written after the start: the end of this partition for this run.
            part.done = true;
            self.pause(&topic, p, offset);
            return ScanStep::Tick;
        }
        if offset + 1 >= part.hw {
            // The last record that was there at the start: decided, then this partition ends.
            part.done = true;
            self.pause(&topic, p, offset + 1);
        }
        let payload = msg.payload().unwrap_or_default().to_vec();
        ScanStep::Record(ScanRecord { topic, partition: p, offset, timestamp: ts, payload })
    }
}

impl Scan {
    /// Stops fetching partition `p` of `topic` (its end for this run is reached).
    fn pause(&self, topic: &str, p: i32, at: i64) {
        let mut pause = TopicPartitionList::new();
        if pause.add_partition_offset(topic, p, Offset::Offset(at)).is_ok() {
            let _ = self.consumer.pause(&pause);
        }
    }

    /// Partitions whose position reached their start watermark without a record to show
    /// for it (a transaction's control record, a compacted gap) are finished.
    fn finish_read_partitions(&mut self) {
        let Ok(positions) = self.consumer.position() else { return };
        for ((topic, p), part) in self.parts.iter_mut().filter(|(_, part)| !part.done) {
            let at = positions.find_partition(topic, *p).map(|e| e.offset());
            if let Some(Offset::Offset(at)) = at {
                part.next = part.next.max(at);
                part.done = at >= part.hw;
            }
        }
    }
}

/// Resume bookkeeping of one partition.
#[derive(Default)]
struct Resume {
    /// One past the last record decided here.
    processed: Option<i64>,
    /// Last resume point saved.
    saved: Option<i64>,
    /// First record whose produce failed.
    failed_at: Option<i64>,
}

/// A produce in flight, for the record at (topic, partition, offset).
pub(crate) struct InFlight {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub job_id: String,
    pub task: tokio::task::JoinHandle<Result<(), String>>,
}

/// Why [`Checkpoints::flush`] failed (callers turn it into their own error and advice).
#[derive(Debug)]
pub(crate) enum FlushError {
    Produce { job_id: String, topic: String, partition: i32, offset: i64, message: String },
    Checkpoint { topic: String, partition: i32, source: StoreError },
}

/// Produces in flight and the resume points (`replays` table) of one run, keyed by
/// (topic, partition): a record's resume point moves past it once it is decided and
/// every produce before it was acknowledged.
pub(crate) struct Checkpoints {
    dry_run: bool,
    id: String,
    pub(crate) stmts: ReplayStatements,
    parts: BTreeMap<(String, i32), Resume>,
    inflight: Vec<InFlight>,
    /// Produces acknowledged so far.
    pub(crate) acked: u64,
    last_flush: Instant,
}

impl Checkpoints {
    /// `resume`: the saved resume points this run starts from.
    pub(crate) fn new(
        id: String,
        stmts: ReplayStatements,
        dry_run: bool,
        resume: impl IntoIterator<Item = ((String, i32), i64)>,
    ) -> Checkpoints {
        let parts = resume
            .into_iter()
            .map(|(k, o)| (k, Resume { processed: Some(o), saved: Some(o), failed_at: None }))
            .collect();
        Checkpoints { dry_run, id, stmts, parts, inflight: Vec::new(), acked: 0, last_flush: Instant::now() }
    }

    /// The record at `offset` is decided (whatever the decision).
    pub(crate) fn decided(&mut self, topic: &str, partition: i32, offset: i64) {
        let part = self.parts.entry((topic.to_string(), partition)).or_default();
        part.processed = Some(offset + 1);
    }

    pub(crate) fn push(&mut self, f: InFlight) {
        self.inflight.push(f);
    }
    pub(crate) fn in_flight(&self) -> usize {
        self.inflight.len()
    }
    pub(crate) fn flush_due(&self) -> bool {
        self.last_flush.elapsed() >= FLUSH_EVERY
    }

    /// Resume points after this run (saved unless dry run): partition -> next offset.
    pub(crate) fn next_offsets(&self, topic: &str) -> BTreeMap<i32, i64> {
        self.parts
            .iter()
            .filter(|((t, _), _)| t == topic)
            .filter_map(|((_, p), s)| s.processed.map(|o| (*p, o)))
            .collect()
    }

    /// Awaits every produce in flight, then saves each partition's resume point: one past
    /// the last record decided, or the first failed record. Errors after saving.
    pub(crate) async fn flush(&mut self) -> Result<(), FlushError> {
        self.last_flush = Instant::now();
        let mut first_err: Option<FlushError> = None;
        for f in std::mem::take(&mut self.inflight) {
            let outcome = match f.task.await {
                Ok(r) => r,
                Err(e) => Err(format!("task failed: {e}")),
            };
            match outcome {
                Ok(()) => self.acked += 1,
                Err(message) => {
                    let part = self.parts.entry((f.topic.clone(), f.partition)).or_default();
                    part.failed_at = Some(part.failed_at.map_or(f.offset, |o| o.min(f.offset)));
                    first_err.get_or_insert(FlushError::Produce {
                        job_id: f.job_id,
                        topic: f.topic,
                        partition: f.partition,
                        offset: f.offset,
                        message,
                    });
                }
            }
        }
        if !self.dry_run {
            for ((topic, p), part) in self.parts.iter_mut() {
                let Some(mut next) = part.processed else { continue };
                if let Some(f) = part.failed_at {
                    next = next.min(f);
                    part.processed = Some(next);
                }
                if part.saved == Some(next) {
                    continue;
                }
                let stmts = &self.stmts;
                retrying(|| stmts.put_offset(&self.id, topic, *p, next))
                    .await
                    .map_err(|source| FlushError::Checkpoint { topic: topic.clone(), partition: *p, source })?;
                part.saved = Some(next);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
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

/// A few tries with backoff for a transient store failure.
pub(crate) async fn retrying<T, F, Fut>(mut f: F) -> Result<T, StoreError>
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
