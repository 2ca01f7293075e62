//! `fairway rerun`: "rerun all" of a tenant's jobs of one job type (or of every job type
//! of the tenant, or of one job type across tenants) by generation numbers. The
//! decisions are the pure [`crate::core::rerun`]; this module moves records between
//! Kafka and the store, reusing `fairway replay`'s scan and resume points
//! ([`crate::ops::replay`]).
//!
//! # How a run goes
//!
//! 1. **Scan.** The pool topics (the job type's pool, every pool, or `--pool`) are read
//!    from the beginning to the end of what was on them when the rerun started (the
//!    same end rule as `fairway replay`). Every record that decodes and passes the filter
//!    (scope, `submitted_at` range, job ids) is kept, one per job id: the newest
//!    (submission, relayed retries and earlier rerun copies share the topic). Nothing is
//!    written yet, so an interrupted scan costs nothing. The selected records are held
//!    in memory (payload included) until they are produced: split a rerun of many
//!    millions of large jobs with `--since`/`--until`.
//! 2. **Generation.** The new generation `G` is drawn: above the target of every
//!    (tenant, job type) pair the selection covers and above any generation seen on the
//!    records. Each pair's target in `generations` is raised to `G` by LWT
//!    (`IF NOT EXISTS` / `IF generation = <read value>`); when another rerun raced us,
//!    the targets are read again and a higher `G` drawn, so two concurrent reruns never
//!    share a number. `--resume` instead continues the latest rerun at the current target.
//!    A dry run computes `G` and writes nothing.
//! 3. **Produce.** Jobs whose newest record is already at `>= G` (an earlier, interrupted
//!    run of this rerun produced them, or a later rerun did) or whose `not_after` passed
//!    are skipped. For the others, in topic order, the job rows are read (one `IN` query
//!    per chunk): a row already at `>= G` is skipped; a stale cancellation flag is cleared
//!    (see [`crate::core::rerun`]: conditional on the row not having been written since it
//!    was read); then the rerun copy is produced to the pool topic it was read from, keyed
//!    by tenant, at `--rate`. Job rows are **not** reset: the worker's generation rule
//!    runs a higher generation even when the job finished, and makes it wait for a lower
//!    one still running.
//! 4. **Resume points.** After each batch, every produce is awaited and each partition's
//!    resume point (one past the newest-record offset of the last job decided) is saved
//!    in `replays` under the rerun id `rerun-<tenant|*>-<job type|*>-g<G>[-<hash of the
//!    other filters>]`. `--resume` (same scope and filters) continues after them. The
//!    generation rule makes this exact even without them: a copy already produced is the
//!    job's newest record on the next scan, at `G`, so it is skipped.
//!
//! # Delivery
//!
//! As with replays, the one window for a duplicate is a crash after the broker
//! acknowledged a batch and before its resume points were saved; then the copy on the
//! topic is seen by the next scan and skipped, so `--resume` does not produce it again.
//! A plain re-run of the command (without `--resume`) is a new rerun with `G + 1`: every
//! job runs again, which is what pressing "Rerun all" twice means.

use crate::config::Config;
use crate::core::rerun::{
    self as rr, CancelAction, Decision, GenerationMode, Planned, Position, RerunFilter, RowCheck, Seen, Selection,
};
use crate::kafka;
use crate::model::{JobSubmitted, Millis, Pool};
use crate::ops::replay::{
    retrying, Checkpoints, FlushError, InFlight, ReplayError, Scan, ScanRecord, ScanStep, Stopped, PROGRESS_EVERY,
    SAMPLE_ROWS,
};
use crate::store::{JobFacts, ReplayStatements, RerunStatements, Store, StoreError, FACTS_CHUNK};
use crate::{codec, now_ms};
use governor::{Quota, RateLimiter};
use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Attempts at drawing a generation when concurrent reruns keep winning the LWT.
const GENERATION_TRIES: u32 = 16;

/// What to rerun and how.
#[derive(Debug, Clone)]
pub struct RerunOptions {
    pub filter: RerunFilter,
    /// Pool topics to scan; empty: the job type's pool, or every pool without a job type.
    pub pools: Vec<Pool>,
    /// Scan, draw (not write) the generation, count and sample; produce and save nothing.
    pub dry_run: bool,
    /// Jobs produced per second (at least 1).
    pub rate_per_sec: u32,
    /// Stop after this many jobs produced (would be, in a dry run); `--resume` continues.
    pub limit: Option<u64>,
    /// Continue the latest rerun of this scope (its current target generation).
    pub resume: bool,
    /// End of the scan: no record for this long (see `fairway replay`).
    pub idle_timeout: Duration,
    /// Set to stop gracefully: the current batch is finished and its resume points saved.
    pub stop: Option<Arc<AtomicBool>>,
}

impl RerunOptions {
    pub fn new(filter: RerunFilter) -> RerunOptions {
        RerunOptions {
            filter,
            pools: Vec::new(),
            dry_run: false,
            rate_per_sec: 100,
            limit: None,
            resume: false,
            idle_timeout: Duration::from_secs(3),
            stop: None,
        }
    }

    /// The pools whose topics this rerun scans.
    pub fn pools(&self, cfg: &Config) -> Vec<Pool> {
        if !self.pools.is_empty() {
            let mut v = self.pools.clone();
            v.sort_unstable();
            v.dedup();
            return v;
        }
        match self.filter.scope.job_type.as_ref().and_then(|j| cfg.job_types.get(j)) {
            // With the pool classifier on, a job type's jobs may be on any pool's topic.
            Some(jt) if !cfg.classifier.enabled => vec![jt.pool],
            _ => Pool::ALL.to_vec(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RerunError {
    #[error("{0}")]
    Scope(String),
    #[error("--rate must be at least 1 job per second")]
    BadRate,
    #[error("{0}")]
    Resume(String),
    #[error(
        "could not draw a generation after {tries} tries: other reruns of the same tenants/job types keep \
         raising it at the same time; try again"
    )]
    GenerationRace { tries: u32 },
    #[error(transparent)]
    Scan(#[from] ReplayError),
    #[error(transparent)]
    Kafka(#[from] kafka::KafkaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "producing the rerun copy of job {job_id} ({topic} partition {partition}) failed: {message}; the resume \
         point stops before it: `fairway rerun` with the same filters and --resume continues from there"
    )]
    Produce { job_id: String, topic: String, partition: i32, message: String },
    #[error(
        "saving the resume point of {topic} partition {partition} failed: {source}; the copies of the last batch \
         were produced (--resume skips them: they are already at the new generation)"
    )]
    Checkpoint { topic: String, partition: i32, source: StoreError },
}

impl From<FlushError> for RerunError {
    fn from(e: FlushError) -> Self {
        match e {
            FlushError::Produce { job_id, topic, partition, message, .. } => {
                RerunError::Produce { job_id, topic, partition, message }
            }
            FlushError::Checkpoint { topic, partition, source } => RerunError::Checkpoint { topic, partition, source },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Scanning,
    Producing,
}

/// A live view of a running rerun.
#[derive(Debug, Clone, PartialEq)]
pub struct RerunProgress {
    pub phase: Phase,
    pub scanned: u64,
    /// Records that passed the filter.
    pub matched: u64,
    /// Distinct jobs selected (newest record each).
    pub selected: u64,
    /// Copies produced and acknowledged (in a dry run: would be produced).
    pub rerun: u64,
    pub partitions: usize,
    pub partitions_done: usize,
    pub elapsed: Duration,
    pub dry_run: bool,
}

/// What the callback of [`run`] is told.
#[derive(Debug, Clone, PartialEq)]
pub enum RerunEvent {
    Progress(RerunProgress),
    /// The generation was drawn (and, unless a dry run, written).
    Generation {
        generation: i64,
        rerun_id: String,
        pairs: Vec<PairGeneration>,
        dry_run: bool,
        resumed: bool,
    },
}

/// One (tenant, job type) pair's target generation before and after the rerun.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairGeneration {
    pub tenant: String,
    pub job_type: String,
    /// None: no row (0).
    pub previous: Option<i64>,
    pub target: i64,
}

/// Records and jobs not rerun, by reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RerunSkipped {
    /// Records outside the filter (other tenants / job types / times / ids).
    pub filter: u64,
    pub undecodable: u64,
    /// Older records of a selected job (only its newest counts).
    pub duplicate: u64,
    /// Jobs whose newest record is already at `>=` the generation.
    pub at_generation: u64,
    /// Jobs whose row already records a run at `>=` the generation.
    pub already_ran: u64,
    /// Jobs whose `not_after` passed.
    pub expired: u64,
    /// Jobs below the resume points (an earlier run of this rerun did them).
    pub done_before: u64,
}

/// One selected job, as shown in the sample table.
#[derive(Debug, Clone, PartialEq)]
pub struct RerunSampleRow {
    pub job_id: String,
    pub tenant: String,
    pub job_type: String,
    pub pool: Pool,
    /// Generation of its newest record.
    pub generation: i64,
    /// Attempt of its newest record.
    pub attempt: i32,
    /// rerun, at generation, already ran, expired, done before; "+ clear cancel" /
    /// "+ cancel pending" when its row has a cancellation flag.
    pub decision: String,
}

/// How the run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RerunEnd {
    /// Every selected job was decided (produced or skipped).
    Done,
    /// Nothing matched: no generation drawn.
    Nothing,
    /// `--limit` jobs produced; `--resume` continues.
    Limit,
    /// The stop flag was set (during the scan: nothing was written).
    Interrupted,
}

#[derive(Debug, Clone)]
pub struct RerunReport {
    /// None when no generation was drawn (nothing selected, or interrupted while scanning).
    pub rerun_id: Option<String>,
    pub generation: Option<i64>,
    pub pairs: Vec<PairGeneration>,
    pub resumed: bool,
    pub topics: Vec<String>,
    pub dry_run: bool,
    pub scanned: u64,
    /// Records that passed the filter.
    pub matched: u64,
    /// Distinct jobs selected.
    pub selected: u64,
    /// Copies produced and acknowledged.
    pub rerun: u64,
    /// Dry run: copies a real run would produce.
    pub would_rerun: u64,
    pub skipped: RerunSkipped,
    /// Stale cancellation flags cleared (dry run: that would be).
    pub cancel_cleared: u64,
    /// Jobs rerun while a cancellation is pending for their current run: the worker will
    /// cancel the copy too (the first [`SAMPLE_ROWS`] ids; `cancel_pending_count` in all).
    pub cancel_pending: Vec<String>,
    pub cancel_pending_count: u64,
    /// The first [`SAMPLE_ROWS`] selected jobs.
    pub sample: Vec<RerunSampleRow>,
    /// Topics and partitions that continued from saved resume points: offset.
    pub resumed_from: BTreeMap<(String, i32), i64>,
    /// Why the scan ended.
    pub scan_ended: Stopped,
    pub ended: RerunEnd,
    pub elapsed: Duration,
    /// Time until the last copy was acknowledged (without the scan's final idle wait).
    pub active: Duration,
    pub warnings: Vec<String>,
}

/// Runs one rerun (see the module documentation); `on_event` is told the progress and,
/// once, the generation.
pub async fn run(
    cfg: &Config,
    opts: RerunOptions,
    on_event: impl FnMut(&RerunEvent),
) -> Result<RerunReport, RerunError> {
    let t0 = Instant::now();
    let scope = &opts.filter.scope;
    scope.validate().map_err(RerunError::Scope)?;
    check_known(cfg, &opts)?;
    let rate = NonZeroU32::new(opts.rate_per_sec).ok_or(RerunError::BadRate)?;
    let topics = PoolTopics::new(cfg, &opts);

    let store = Store::open(cfg).await?;
    let stmts = store.rerun_statements().await?;
    let replay_stmts = store.replay_statements().await?;
    let ctx = Context { cfg, opts: &opts, topics, stmts, rate, t0 };
    let mut report = RerunReport::start(&opts, ctx.topics.names.clone());
    let mut events = Events { on_event, last_progress: None };

    // 1. Scan every pool topic from the beginning: the newest record of each job counts.
    let selection = scan(&ctx, &mut report, &mut events).await?;
    if report.scan_ended == Stopped::Interrupted {
        return Ok(report.ended_early(RerunEnd::Interrupted, t0));
    }

    // 2. Draw the generation (and raise every covered pair's target to it).
    let pairs = rr::pairs_to_raise(scope, selection.pairs());
    if pairs.is_empty() {
        return Ok(report.ended_early(RerunEnd::Nothing, t0));
    }
    let (generation, rerun_id) =
        new_generation(&ctx, &pairs, selection.max_generation(), &mut report, &mut events).await?;

    // 3. Produce the copies, in topic order, saving resume points as batches complete.
    let mut producing = Producing::open(&ctx, replay_stmts, rerun_id, generation, &mut report).await?;
    report.ended = producing.produce(selection.plan(generation, now_ms()), &mut report, &mut events).await?;
    producing.finish(&mut report, &mut events).await?;
    Ok(report)
}

/// What every phase of one rerun reads: configuration, options, topics, statements.
struct Context<'a> {
    cfg: &'a Config,
    opts: &'a RerunOptions,
    topics: PoolTopics,
    stmts: RerunStatements,
    /// `--rate`, checked.
    rate: NonZeroU32,
    /// When the run started.
    t0: Instant,
}

impl Context<'_> {
    /// Whether the caller set the stop flag.
    fn stop_requested(&self) -> bool {
        self.opts.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed))
    }

    /// The progress event of the produce phase; `rerun`: copies acknowledged (dry run:
    /// that would be produced).
    fn produce_progress(&self, r: &RerunReport, rerun: u64) -> RerunEvent {
        RerunEvent::Progress(RerunProgress {
            phase: Phase::Producing,
            scanned: r.scanned,
            matched: r.matched,
            selected: r.selected,
            rerun,
            partitions: 0,
            partitions_done: 0,
            elapsed: self.t0.elapsed(),
            dry_run: self.opts.dry_run,
        })
    }

    /// The progress event of the scan phase.
    fn scan_progress(&self, scan: &Scan, r: &RerunReport, selection: &Selection) -> RerunEvent {
        RerunEvent::Progress(RerunProgress {
            phase: Phase::Scanning,
            scanned: r.scanned,
            matched: r.matched,
            selected: selection.len() as u64,
            rerun: 0,
            partitions: scan.partitions(),
            partitions_done: scan.partitions_done(),
            elapsed: self.t0.elapsed(),
            dry_run: self.opts.dry_run,
        })
    }
}

/// The pool topics a rerun scans and produces to.
struct PoolTopics {
    /// In the order of the pools.
    names: Vec<String>,
    topic_of: HashMap<Pool, String>,
    pool_of: HashMap<String, Pool>,
}

impl PoolTopics {
    /// The topics of the pools the options select.
    fn new(cfg: &Config, opts: &RerunOptions) -> PoolTopics {
        let pools = opts.pools(cfg);
        PoolTopics {
            names: pools.iter().map(|p| cfg.pool_topic(*p)).collect(),
            topic_of: pools.iter().map(|p| (*p, cfg.pool_topic(*p))).collect(),
            pool_of: pools.iter().map(|p| (cfg.pool_topic(*p), *p)).collect(),
        }
    }
}

/// The caller's event callback, told progress at most every [`PROGRESS_EVERY`].
struct Events<F> {
    on_event: F,
    last_progress: Option<Instant>,
}

impl<F: FnMut(&RerunEvent)> Events<F> {
    /// Tells the callback `event` now.
    fn tell(&mut self, event: &RerunEvent) {
        (self.on_event)(event);
    }

    /// Tells the callback the progress `make` builds, when [`PROGRESS_EVERY`] has passed
    /// since it was last told (or it never was).
    fn progress_due(&mut self, make: impl FnOnce() -> RerunEvent) {
        if self.last_progress.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
            self.last_progress = Some(Instant::now());
            (self.on_event)(&make());
        }
    }
}

impl RerunReport {
    /// The report before anything was scanned.
    fn start(opts: &RerunOptions, topics: Vec<String>) -> RerunReport {
        RerunReport {
            rerun_id: None,
            generation: None,
            pairs: Vec::new(),
            resumed: opts.resume,
            topics,
            dry_run: opts.dry_run,
            scanned: 0,
            matched: 0,
            selected: 0,
            rerun: 0,
            would_rerun: 0,
            skipped: RerunSkipped::default(),
            cancel_cleared: 0,
            cancel_pending: Vec::new(),
            cancel_pending_count: 0,
            sample: Vec::new(),
            resumed_from: BTreeMap::new(),
            scan_ended: Stopped::End,
            ended: RerunEnd::Done,
            elapsed: Duration::ZERO,
            active: Duration::ZERO,
            warnings: Vec::new(),
        }
    }

    /// The report of a run that ends before producing anything.
    fn ended_early(mut self, ended: RerunEnd, t0: Instant) -> RerunReport {
        self.ended = ended;
        self.elapsed = t0.elapsed();
        self.active = self.elapsed;
        self
    }
}

/// Step 1: reads the pool topics to their end (or the stop flag), keeping the newest
/// matching record of each job; counts in the report.
async fn scan<F: FnMut(&RerunEvent)>(
    ctx: &Context<'_>,
    report: &mut RerunReport,
    events: &mut Events<F>,
) -> Result<Selection, RerunError> {
    let sources = ctx.topics.names.iter().map(|t| (t.clone(), HashMap::new())).collect();
    let mut scan = Scan::open(ctx.cfg, "rerun", sources, ctx.opts.idle_timeout).await?;
    let mut selection = Selection::default();
    report.scan_ended = loop {
        if scan.finished() {
            break Stopped::End;
        }
        if ctx.stop_requested() {
            break Stopped::Interrupted;
        }
        let rec = match scan.next().await {
            ScanStep::Record(rec) => rec,
            ScanStep::Idle => break Stopped::Idle,
            ScanStep::Tick => {
                events.progress_due(|| ctx.scan_progress(&scan, report, &selection));
                continue;
            }
        };
        select_record(ctx, rec, &mut selection, report);
        events.progress_due(|| ctx.scan_progress(&scan, report, &selection));
    };
    events.tell(&ctx.scan_progress(&scan, report, &selection));
    report.warnings.extend(scan.take_warnings());
    report.warnings.extend(scan.take_offset_notes());
    drop(scan);
    report.selected = selection.len() as u64;
    report.skipped.duplicate = selection.duplicates;
    Ok(selection)
}

/// Offers one scanned record to the selection, or counts it as skipped (the first three
/// undecodable ones with a warning).
fn select_record(ctx: &Context<'_>, rec: ScanRecord, selection: &mut Selection, report: &mut RerunReport) {
    report.scanned += 1;
    match codec::decode_job(&rec.payload) {
        Ok(job) if ctx.opts.filter.matches(&job) => {
            report.matched += 1;
            let pool = ctx.topics.pool_of.get(&rec.topic).copied().unwrap_or(Pool::Short);
            let pos = Position { pool, partition: rec.partition, offset: rec.offset };
            selection.offer(Seen { pos, timestamp: rec.timestamp, job });
        }
        Ok(_) => report.skipped.filter += 1,
        Err(e) => {
            if report.skipped.undecodable < 3 {
                report.warnings.push(format!(
                    "{} partition {} offset {}: undecodable record (the worker dead-letters it): {e}",
                    rec.topic, rec.partition, rec.offset
                ));
            }
            report.skipped.undecodable += 1;
        }
    }
}

/// Step 2: draws the generation (written unless a dry run), records it in the report and
/// tells the callback; returns it and the rerun id.
async fn new_generation<F: FnMut(&RerunEvent)>(
    ctx: &Context<'_>,
    pairs: &[(String, String)],
    max_seen: Option<i64>,
    report: &mut RerunReport,
    events: &mut Events<F>,
) -> Result<(i64, String), RerunError> {
    let opts = ctx.opts;
    let mode = if opts.resume { GenerationMode::Resume } else { GenerationMode::Bump };
    let (generation, raised) = draw_generation(&ctx.stmts, pairs, mode, max_seen, opts.dry_run).await?;
    let rerun_id = rr::derive_id(&opts.filter.scope, &opts.filter.canonical_extra(), generation);
    report.generation = Some(generation);
    report.rerun_id = Some(rerun_id.clone());
    report.pairs = raised.clone();
    events.tell(&RerunEvent::Generation {
        generation,
        rerun_id: rerun_id.clone(),
        pairs: raised,
        dry_run: opts.dry_run,
        resumed: opts.resume,
    });
    Ok((generation, rerun_id))
}

/// Step 3's state: the resume points, the produces in flight, the rate limit and counts.
struct Producing<'a> {
    ctx: &'a Context<'a>,
    generation: i64,
    /// The saved resume points this run continues from.
    resume: HashMap<(String, i32), i64>,
    ck: Checkpoints,
    /// None in a dry run.
    producer: Option<crate::kafka::Producer>,
    limiter: governor::DefaultDirectRateLimiter,
    /// Jobs decided per batch (one job-row read each).
    chunk_size: usize,
    /// Stale cancellation flags cleared (dry run: that would be).
    cleared: Arc<AtomicU64>,
    /// Copies produced (dry run: that would be).
    scheduled: u64,
    /// Time from the start to the last acknowledged copy.
    last_ack: Duration,
}

impl<'a> Producing<'a> {
    /// Reads the rerun's saved resume points (recorded in the report) and prepares the
    /// producer (none in a dry run) and the rate limit.
    async fn open(
        ctx: &'a Context<'a>,
        replay_stmts: ReplayStatements,
        rerun_id: String,
        generation: i64,
        report: &mut RerunReport,
    ) -> Result<Producing<'a>, RerunError> {
        let mut resume: HashMap<(String, i32), i64> = HashMap::new();
        for topic in &ctx.topics.names {
            for (p, o) in replay_stmts.offsets(&rerun_id, topic).await? {
                resume.insert((topic.clone(), p), o);
            }
        }
        report.resumed_from = resume.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let ck = Checkpoints::new(rerun_id, replay_stmts, ctx.opts.dry_run, resume.clone());
        let producer = if ctx.opts.dry_run { None } else { Some(kafka::producer(ctx.cfg)?) };
        let rate = ctx.rate;
        let burst = NonZeroU32::new((rate.get() / 50).max(1)).unwrap_or(NonZeroU32::MIN);
        let limiter = RateLimiter::direct(Quota::per_second(rate).allow_burst(burst));
        let chunk_size = (rate.get() as usize).clamp(1, FACTS_CHUNK);
        let (cleared, scheduled, last_ack) = (Arc::new(AtomicU64::new(0)), 0, ctx.t0.elapsed());
        Ok(Producing { ctx, generation, resume, ck, producer, limiter, chunk_size, cleared, scheduled, last_ack })
    }

    /// Decides the plan batch by batch, flushing after each; returns how it ended.
    async fn produce<F: FnMut(&RerunEvent)>(
        &mut self,
        plan: Vec<Planned>,
        report: &mut RerunReport,
        events: &mut Events<F>,
    ) -> Result<RerunEnd, RerunError> {
        let mut plan = plan.into_iter();
        loop {
            let chunk: Vec<Planned> = plan.by_ref().take(self.chunk_size).collect();
            if chunk.is_empty() {
                return Ok(RerunEnd::Done);
            }
            if let Some(end) = self.produce_chunk(chunk, report).await? {
                return Ok(end);
            }
            self.flush().await?;
            events.progress_due(|| self.ctx.produce_progress(report, self.rerun_count()));
        }
    }

    /// Decides one batch: reads the job rows of its jobs to rerun, then each job in order.
    /// Some(end) when `--limit` or the stop flag ends the run in the middle of it.
    async fn produce_chunk(
        &mut self,
        chunk: Vec<Planned>,
        report: &mut RerunReport,
    ) -> Result<Option<RerunEnd>, RerunError> {
        let ids: Vec<String> = chunk
            .iter()
            .filter(|p| matches!(p.decision, Decision::Rerun(_)) && !self.below_resume(p))
            .map(|p| p.job_id.clone())
            .collect();
        let rows: HashMap<String, JobFacts> =
            if ids.is_empty() { HashMap::new() } else { retrying(|| self.ctx.stmts.job_facts(&ids)).await? };
        for item in chunk {
            let sample = (report.sample.len() < SAMPLE_ROWS).then(|| sample_row(&item));
            let label = if self.below_resume(&item) {
                report.skipped.done_before += 1;
                "done before".to_string()
            } else {
                if matches!(item.decision, Decision::Rerun(_)) {
                    if self.ctx.opts.limit.is_some_and(|l| self.scheduled >= l) {
                        return Ok(Some(RerunEnd::Limit));
                    }
                    if self.ctx.stop_requested() {
                        return Ok(Some(RerunEnd::Interrupted));
                    }
                }
                let row = rows.get(&item.job_id);
                self.decide(item, row, report).await
            };
            if let Some(mut row) = sample {
                row.decision = label;
                report.sample.push(row);
            }
        }
        Ok(None)
    }

    /// Whether the job's newest record lies below its partition's saved resume point.
    fn below_resume(&self, p: &Planned) -> bool {
        let topic = &self.ctx.topics.topic_of[&p.pos.pool];
        self.resume.get(&(topic.clone(), p.pos.partition)).is_some_and(|r| p.pos.offset < *r)
    }

    /// Decides one job past the resume points (skip, or produce its copy) and marks its
    /// record decided; returns the label for the sample table.
    async fn decide(&mut self, item: Planned, row: Option<&JobFacts>, report: &mut RerunReport) -> String {
        let topic = self.ctx.topics.topic_of[&item.pos.pool].clone();
        let (partition, offset) = (item.pos.partition, item.pos.offset);
        let label = match step(item, row, self.generation, report) {
            Step::Skip(label) => label,
            Step::Produce { copy, action, label } => {
                self.scheduled += 1;
                let updated_at = row.and_then(|r| r.updated_at);
                self.send(copy, action, updated_at, &topic, partition, offset).await;
                label
            }
        };
        self.ck.decided(&topic, partition, offset);
        label
    }

    /// Produces one copy in the background, after clearing its row's stale cancellation
    /// flag when `action` says so; a dry run only counts the flag it would clear.
    async fn send(
        &mut self,
        copy: Box<JobSubmitted>,
        action: CancelAction,
        updated_at: Option<Millis>,
        topic: &str,
        partition: i32,
        offset: i64,
    ) {
        let Some(producer) = &self.producer else {
            if action == CancelAction::Clear {
                self.cleared.fetch_add(1, Ordering::Relaxed);
            }
            return;
        };
        self.limiter.until_ready().await;
        let generation = self.generation;
        let (stmts, producer, to, cleared) =
            (self.ctx.stmts.clone(), producer.clone(), topic.to_string(), self.cleared.clone());
        let job_id = copy.job_id.clone();
        let task = tokio::spawn(async move {
            if action == CancelAction::Clear
                && !clear_stale_cancel(&stmts, &copy.job_id, updated_at, generation, &cleared).await?
            {
                return Ok(());
            }
            let bytes = codec::encode_job(&copy).map_err(|e| e.to_string())?;
            kafka::send_with_headers(&producer, &to, &copy.tenant, &bytes, &kafka::trace_headers(&copy))
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        });
        self.ck.push(InFlight { topic: topic.to_string(), partition, offset, job_id, task });
    }

    /// Awaits the produces in flight and saves the resume points; notes when the last
    /// copy was acknowledged.
    async fn flush(&mut self) -> Result<(), RerunError> {
        let pending = self.ck.in_flight() > 0;
        self.ck.flush().await?;
        if pending {
            self.last_ack = self.ctx.t0.elapsed();
        }
        Ok(())
    }

    /// Copies acknowledged so far (dry run: that would be produced).
    fn rerun_count(&self) -> u64 {
        if self.ctx.opts.dry_run {
            self.scheduled
        } else {
            self.ck.acked
        }
    }

    /// Flushes the last batch, tells the final progress and records the counts and times.
    async fn finish<F: FnMut(&RerunEvent)>(
        mut self,
        report: &mut RerunReport,
        events: &mut Events<F>,
    ) -> Result<(), RerunError> {
        self.flush().await?;
        events.tell(&self.ctx.produce_progress(report, self.rerun_count()));
        report.rerun = self.ck.acked;
        report.would_rerun = if self.ctx.opts.dry_run { self.scheduled } else { 0 };
        report.cancel_cleared = self.cleared.load(Ordering::Relaxed);
        report.elapsed = self.ctx.t0.elapsed();
        report.active = self.last_ack;
        Ok(())
    }
}

/// The sample-table row of a planned job, its decision still to fill in.
fn sample_row(item: &Planned) -> RerunSampleRow {
    RerunSampleRow {
        job_id: item.job_id.clone(),
        tenant: item.newest.tenant.clone(),
        job_type: item.newest.job_type.clone(),
        pool: item.pos.pool,
        generation: item.newest.generation,
        attempt: item.newest.attempt,
        decision: String::new(),
    }
}

/// What the produce phase does with one planned job.
enum Step {
    /// Not produced; the label for the sample table.
    Skip(String),
    /// Produce this copy, after doing `action` about the row's cancellation flag.
    Produce { copy: Box<JobSubmitted>, action: CancelAction, label: String },
}

/// Decides one planned job from the plan and its row (read just before), counting skips
/// and pending cancellations in the report.
fn step(item: Planned, row: Option<&JobFacts>, generation: i64, report: &mut RerunReport) -> Step {
    let label = item.decision.label().to_string();
    let copy = match item.decision {
        Decision::AtGeneration(_) => {
            report.skipped.at_generation += 1;
            return Step::Skip(label);
        }
        Decision::Expired => {
            report.skipped.expired += 1;
            return Step::Skip(label);
        }
        Decision::Rerun(copy) => copy,
    };
    match rr::check_row(row.map(|r| &r.facts), generation) {
        RowCheck::AlreadyRan(_) => {
            report.skipped.already_ran += 1;
            Step::Skip("already ran".into())
        }
        RowCheck::Produce(action) => {
            let label = match action {
                CancelAction::Keep => label,
                CancelAction::Clear => format!("{label} + clear cancel"),
                CancelAction::Pending => {
                    report.cancel_pending_count += 1;
                    if report.cancel_pending.len() < SAMPLE_ROWS {
                        report.cancel_pending.push(item.job_id.clone());
                    }
                    format!("{label} + cancel pending")
                }
            };
            Step::Produce { copy, action, label }
        }
    }
}

/// Tenants and job types named must be configured (a typo would otherwise raise the
/// target generation of a pair that does not exist and rerun nothing).
fn check_known(cfg: &Config, opts: &RerunOptions) -> Result<(), RerunError> {
    let scope = &opts.filter.scope;
    if let Some(t) = &scope.tenant {
        if !cfg.tenants.contains_key(t) {
            let known: Vec<&str> = cfg.tenants.keys().map(String::as_str).collect();
            return Err(RerunError::Scope(format!("unknown tenant {t:?} (known: {})", known.join(", "))));
        }
    }
    if let Some(j) = &scope.job_type {
        if !cfg.job_types.contains_key(j) {
            let known: Vec<&str> = cfg.job_types.keys().map(String::as_str).collect();
            return Err(RerunError::Scope(format!("unknown job type {j:?} (known: {})", known.join(", "))));
        }
    }
    Ok(())
}

/// Draws the rerun's generation and raises each pair's target to it (see the module
/// documentation); a dry run only reads. Returns the generation and each pair's change.
async fn draw_generation(
    stmts: &RerunStatements,
    pairs: &[(String, String)],
    mode: GenerationMode,
    max_seen: Option<i64>,
    dry_run: bool,
) -> Result<(i64, Vec<PairGeneration>), RerunError> {
    let mut last_err: Option<StoreError> = None;
    for attempt in 0..GENERATION_TRIES {
        if attempt > 0 {
            // Another rerun won an LWT: back off a little (jittered), read again.
            let ms = 20 * u64::from(attempt) + rand::random::<u64>() % 50;
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let mut current = Vec::with_capacity(pairs.len());
        for (t, j) in pairs {
            current.push(retrying(|| stmts.target_generation(t, j)).await?);
        }
        let generation = rr::next_generation(mode, &current, max_seen).map_err(RerunError::Resume)?;
        let changes: Vec<PairGeneration> = pairs
            .iter()
            .zip(&current)
            .map(|((t, j), c)| PairGeneration {
                tenant: t.clone(),
                job_type: j.clone(),
                previous: *c,
                target: c.map_or(generation, |c| c.max(generation)),
            })
            .collect();
        if dry_run {
            return Ok((generation, changes));
        }
        let mut lost = false;
        for ((t, j), c) in pairs.iter().zip(&current) {
            let Some(raise) = rr::raise(*c, generation) else { continue };
            match stmts.raise_generation(t, j, raise).await {
                Ok(true) => {}
                Ok(false) => {
                    lost = true;
                    break;
                }
                Err(e) => {
                    // An LWT that timed out may or may not have applied: read again.
                    tracing::warn!(tenant = %t, job_type = %j, error = %e, "raising the target generation failed");
                    last_err = Some(e);
                    lost = true;
                    break;
                }
            }
        }
        if !lost {
            return Ok((generation, changes));
        }
    }
    Err(last_err.map_or(RerunError::GenerationRace { tries: GENERATION_TRIES }, RerunError::Store))
}

/// Clears a stale cancellation flag (LWT on the row's write time; read again and decided
/// again when the row changed meanwhile). False when the copy is no longer needed: a run
/// at this generation happened in between.
async fn clear_stale_cancel(
    stmts: &RerunStatements,
    job_id: &str,
    updated_at: Option<Millis>,
    generation: i64,
    cleared: &AtomicU64,
) -> Result<bool, String> {
    let mut updated_at = updated_at;
    for _ in 0..3 {
        if retrying(|| stmts.clear_cancel(job_id, updated_at, now_ms())).await.map_err(|e| e.to_string())? {
            cleared.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        let ids = [job_id.to_string()];
        let rows = retrying(|| stmts.job_facts(&ids)).await.map_err(|e| e.to_string())?;
        let row = rows.get(job_id);
        match rr::check_row(row.map(|r| &r.facts), generation) {
            RowCheck::Produce(CancelAction::Clear) => updated_at = row.and_then(|r| r.updated_at),
            RowCheck::AlreadyRan(_) => return Ok(false),
            // The flag went away, or now belongs to a run in progress: leave it.
            RowCheck::Produce(_) => return Ok(true),
        }
    }
    Ok(true)
}
