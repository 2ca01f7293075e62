//! The simulated world: the broker, the store, the workers and the event loop that moves
//! data between them on simulated time. Every decision a worker makes is a call into
//! `core` (see the module doc of `sim` for the list and the order); this file only moves
//! records, rows and time.

use super::rng::Rng;
use super::trace::{Dlq, Outcome, Overlap, QuietWait, Result_, RunRec, Trace};
use super::{Config, Kind, Shape};
use crate::core::backlog::{bucket_of, ReadPlan, TenantBacklog};
use crate::core::buffer::{Buffer, BufferBounds};
use crate::core::offsets::PartitionOffsets;
use crate::core::retry::{self, AttemptState, Decision, RetryPolicy};
use crate::core::scheduler::{DispatchId, Scheduler, SchedulerConfig, TenantPolicy, Tier};
use crate::model::{FailureClass, Millis, Pool, Priority};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

/// A record on the pool topic: one copy of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Msg {
    pub job: u32,
    pub attempt: i32,
    pub crash_count: i32,
}

/// A worker process's identity in the group and in job rows (a restart is a new one).
type Member = (usize, u32);

/// Bytes a simulated job counts for in the buffer (`core::buffer` measures heap bytes).
const JOB_BYTES: usize = 512;
/// The heartbeat interval; a running row's heartbeat is fresh for 3 of them (`worker::check`).
pub(super) const HEARTBEAT_MS: Millis = 1_000;
pub(super) const LEASE_MS: Millis = 3 * HEARTBEAT_MS;
/// A run with no heartbeat acknowledged for this long (from the newest acknowledged one's
/// send) fences itself (`worker::liveness::fence_after`).
const FENCE_MS: Millis = 2 * HEARTBEAT_MS;
/// A copy waiting for a job running elsewhere looks again after this (`worker::check::RECHECK`).
const RECHECK_MS: Millis = 1_000;
/// What a store or broker call that cannot be answered takes to fail.
const TIMEOUT_MS: Millis = 1_000;
/// How often a worker's loop fetches and tends its backlogs.
const TICK_MS: Millis = 20;
/// Most records a worker takes in per partition per tick.
const FETCH_MAX: usize = 50;
/// The broker drops a member it has not heard from for this long.
const SESSION_MS: Millis = 6_000;
/// The liveness bound: after the last disruption (a crash, a restart, a cut, a
/// rebalance, a store outage), a live worker that owns partitions with records not yet
/// committed makes progress (takes a record in, ends a job, commits) at least this often.
/// The longest legitimate quiet spell is a not-durable job's third hold (20 s,
/// `worker::pool::again_after`) or a lapsed lease plus a recheck (4 s).
pub(super) const STALL_MS: Millis = 30_000;
/// How often the liveness watch looks.
const WATCH_MS: Millis = 1_000;
/// The pool loop's read chunk (`worker::pool::READ_CHUNK`).
const READ_CHUNK: usize = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Running,
    Retrying,
    Terminal,
}

#[derive(Debug, Clone, Copy)]
struct Row {
    status: Status,
    worker: Member,
    attempts: i32,
    crash_count: i32,
    /// The last heartbeat's stamp (the writer's clock when it sent it), and when it was
    /// really sent.
    hb_at: Millis,
    hb_true: Millis,
}

/// A store call and what it carries.
#[derive(Debug, Clone)]
enum StoreOp {
    ReadRow,
    /// The running mark and its first heartbeat, stamped `at` on the writer's clock when
    /// sent (`sent`, true time), as `exec::mark_running` stamps it.
    MarkRunning {
        attempts: i32,
        crash_count: i32,
        at: Millis,
        sent: Millis,
    },
    /// A heartbeat, stamped when sent (`liveness::heartbeat_loop`).
    Heartbeat {
        at: Millis,
        sent: Millis,
    },
    PutRetrying {
        attempts: i32,
        crash_count: i32,
    },
    PutTerminal,
    /// The row read before a terminal outcome of a run that held the row
    /// (`worker::durable::taken_elsewhere`).
    Fence,
    Spill {
        part: usize,
        tenant: u32,
        offset: i64,
        msg: Msg,
    },
    ReadRows {
        part: usize,
        tenant: u32,
        plan: ReadPlan,
    },
    DropBucket {
        part: usize,
        tenant: u32,
        bucket: i64,
    },
    ListBacklog {
        part: usize,
    },
}

/// A broker produce and what it carries.
#[derive(Debug, Clone, Copy)]
enum Produce {
    Result { ok: bool, class: Option<FailureClass>, attempts: i32 },
    Retry { msg: Msg, not_before: Millis },
    DeadLetter { class: FailureClass, attempts: i32, reason_class: FailureClass },
}

#[derive(Debug)]
enum Ev {
    Submit(u32),
    Deliver {
        part: usize,
        msg: Msg,
    },
    Tick(usize),
    Commit(usize),
    Store {
        w: usize,
        epoch: u32,
        ctx: Ctx,
        op: StoreOp,
        ok: bool,
    },
    Produced {
        w: usize,
        epoch: u32,
        task: u64,
        ok: bool,
    },
    RunEnd {
        w: usize,
        epoch: u32,
        task: u64,
    },
    Heartbeat {
        w: usize,
        epoch: u32,
        task: u64,
    },
    Recheck {
        w: usize,
        epoch: u32,
        task: u64,
    },
    /// A run's fence may fall (`worker::liveness::fence_watch`).
    Fence {
        w: usize,
        epoch: u32,
        task: u64,
    },
    Crash(usize),
    Restart(usize),
    CutStart {
        w: usize,
        broker: bool,
    },
    CutEnd {
        w: usize,
        broker: bool,
    },
    SessionCheck(Member),
    Rebalance,
    /// A job whose outcome was not durable, taken in again on the partition incarnation
    /// it came from (`worker::pool`'s `Event::Again`).
    Again {
        w: usize,
        epoch: u32,
        pend: Pend,
    },
    /// The liveness watch (`STALL_MS`).
    Watch,
    /// A store outage begins (counted in the coverage table; the outage itself is a
    /// time range the store's answers consult).
    OutageStart,
}

/// Which part of a worker a store answer is for.
#[derive(Debug, Clone, Copy)]
enum Ctx {
    Task(u64),
    /// The pool loop, for the partition incarnation that sent the call: an answer to an
    /// older incarnation is ignored, as `pool::on_backlog` ignores it.
    Loop(u64),
}

/// A job waiting in a worker's scheduler (`worker::route::Pending`).
#[derive(Debug, Clone)]
struct Pend {
    msg: Msg,
    part: usize,
    offset: i64,
    incarnation: u64,
    spill: Option<i64>,
    enqueued_true: Millis,
    /// For a quiet tenant's job: the wait bound at its enqueue.
    quiet_bound: Option<Millis>,
}

/// Where a dispatched job is on its route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Check,
    Mark,
    Running,
    /// Settling: the produces and the store write still to do, in order.
    Settle,
    /// A second copy of a job whose route is in flight on this worker (`exec::InFlight`):
    /// its slot given back, it ends as the task it follows ends.
    Follow(u64),
}

#[derive(Debug)]
struct Task {
    pend: Pend,
    did: DispatchId,
    msg: Msg,
    step: Step,
    run: Option<usize>,
    /// Settle's remaining I/O, done front to back; the last answer decides `Durable`.
    todo: Vec<Io>,
    durable: bool,
    ran: bool,
    /// The settle of a handler's return began (the injected bug releases the offset then).
    todo_started: bool,
    checked_true: Millis,
    /// When the newest acknowledged heartbeat of its run was sent (true time).
    last_beat: Option<Millis>,
}

#[derive(Debug, Clone)]
enum Io {
    Produce(Produce),
    Store(StoreOp),
    /// Best effort: a failure does not make the outcome not durable (`settle::fail`'s state write).
    StoreBestEffort(StoreOp),
}

struct Part {
    incarnation: u64,
    offsets: PartitionOffsets,
    position: i64,
    backlogs: BTreeMap<u32, TenantBacklog>,
    loading: bool,
    last_seen: i64,
    /// Per tenant, the highest offset read back from its spilled backlog (for the trace).
    read_upto: BTreeMap<u32, i64>,
    /// Jobs (by offset) whose outcome was not durable here, and how often in a row.
    again_times: BTreeMap<i64, u32>,
}

struct Worker {
    epoch: u32,
    alive: bool,
    skew: Millis,
    sched: Scheduler<Pend>,
    buffer: Buffer,
    parts: BTreeMap<usize, Part>,
    tasks: BTreeMap<u64, Task>,
    cut_broker: bool,
    cut_store: bool,
    /// Last time its partitions, process or store access changed (fairness checks skip
    /// waits that began near one).
    disrupted: Millis,
    /// Last time it took a record in, ended a job or committed (the liveness watch).
    progressed: Millis,
    /// A stall of this worker already reported (one violation per stall).
    stalled: bool,
}

struct Broker {
    logs: Vec<Vec<Msg>>,
    committed: Vec<i64>,
    members: BTreeSet<Member>,
    /// Members whose session the broker keeps although it does not hear from them.
    silent_since: HashMap<Member, Millis>,
    owner: Vec<Option<Member>>,
    rebalance_pending: bool,
}

#[derive(Default)]
struct Store {
    rows: HashMap<u32, Row>,
    backlog: BTreeMap<(usize, u32, i64), BTreeMap<i64, Msg>>,
    outages: Vec<(Millis, Millis)>,
}

pub(super) struct World {
    pub(super) cfg: Config,
    pub(super) shape: Shape,
    rng: Rng,
    now: Millis,
    seq: u64,
    queue: BinaryHeap<Reverse<(Millis, u64)>>,
    events: HashMap<u64, Ev>,
    broker: Broker,
    store: Store,
    workers: Vec<Worker>,
    next_task: u64,
    next_incarnation: u64,
    policy: RetryPolicy,
    bounds: BufferBounds,
    pub(super) trace: Trace,
    active_runs: HashMap<u32, Vec<(usize, Member)>>,
    /// Jobs with a result on the results topic (a duplicate result is not a second job).
    with_result: BTreeSet<u32>,
    /// The last disruption anywhere in the fleet (the liveness watch counts from it).
    disrupted: Millis,
    /// Partitions reported as without a live owner (once each).
    unowned: BTreeSet<usize>,
}

fn sched_config(slots: usize) -> SchedulerConfig {
    let mut c = SchedulerConfig::for_pool(Pool::Short, slots);
    c.default_tenant = TenantPolicy::tier(Tier::Standard);
    c.fast_lanes = 1;
    c
}

/// The retry policy of the simulated job type: short delays, so a run drains in minutes.
pub(super) fn sim_policy() -> RetryPolicy {
    use crate::core::retry::{ClassPolicy, DurationMs, Jitter};
    let app_error = ClassPolicy::schedule(3, vec![DurationMs(500), DurationMs(2_000)], Jitter::Proportional(0.25));
    let mut p = RetryPolicy { app_error, ..Default::default() };
    p.worker_crash.delay = DurationMs(500);
    p
}

impl World {
    pub(super) fn new(cfg: Config, shape: Shape, seed: u64) -> World {
        let workers = (0..shape.workers)
            .map(|_| Worker {
                epoch: 0,
                alive: true,
                skew: 0,
                sched: Scheduler::new(Pool::Short, sched_config(shape.slots)).expect("valid scheduler config"),
                buffer: Buffer::default(),
                parts: BTreeMap::new(),
                tasks: BTreeMap::new(),
                cut_broker: false,
                cut_store: false,
                disrupted: 0,
                progressed: 0,
                stalled: false,
            })
            .collect();
        let parts = shape.partitions;
        let bounds = BufferBounds {
            tenant_jobs: shape.tenant_queue_limit,
            tenant_bytes: 32 << 20,
            total_jobs: 50_000,
            total_bytes: 256 << 20,
            light_jobs: 64,
            light_bytes: 1 << 20,
        };
        let mut w = World {
            cfg,
            rng: Rng::new(seed.wrapping_mul(31).wrapping_add(7)),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            broker: Broker {
                logs: vec![Vec::new(); parts],
                committed: vec![0; parts],
                members: BTreeSet::new(),
                silent_since: HashMap::new(),
                owner: vec![None; parts],
                rebalance_pending: false,
            },
            store: Store { outages: shape.outages.clone(), ..Default::default() },
            workers,
            next_task: 0,
            next_incarnation: 0,
            policy: sim_policy(),
            bounds,
            trace: Trace::default(),
            active_runs: HashMap::new(),
            with_result: BTreeSet::new(),
            disrupted: 0,
            unowned: BTreeSet::new(),
            shape,
        };
        w.setup();
        w
    }

    fn setup(&mut self) {
        for i in 0..self.workers.len() {
            self.workers[i].skew = self.shape.skews[i];
            self.broker.members.insert((i, 0));
            self.at(0, Ev::Tick(i));
            self.at(self.shape.commit_ms, Ev::Commit(i));
        }
        self.at(0, Ev::Rebalance);
        self.broker.rebalance_pending = true;
        self.at(WATCH_MS, Ev::Watch);
        for (a, _) in self.store.outages.clone() {
            self.at(a, Ev::OutageStart);
        }
        let submits: Vec<Millis> = self.shape.jobs.iter().map(|j| j.submit_at).collect();
        for (i, at) in submits.into_iter().enumerate() {
            self.at(at, Ev::Submit(i as u32));
        }
        for f in self.shape.crashes.clone() {
            self.at(f.0, Ev::Crash(f.1));
        }
        for c in self.shape.cuts.clone() {
            self.at(c.from, Ev::CutStart { w: c.worker, broker: c.broker });
            self.at(c.to, Ev::CutEnd { w: c.worker, broker: c.broker });
        }
    }

    fn at(&mut self, t: Millis, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((t.max(self.now), self.seq)));
        self.events.insert(self.seq, ev);
    }

    /// Runs until every accepted job has a result (and a little longer, so late
    /// duplicates show) or the time limit.
    pub(super) fn run(&mut self) {
        let limit = self.shape.horizon + self.shape.drain;
        let mut settled_at: Option<Millis> = None;
        while let Some(Reverse((t, seq))) = self.queue.pop() {
            if t > limit {
                break;
            }
            self.now = t;
            self.trace.events += 1;
            let ev = self.events.remove(&seq).expect("queued event");
            self.trace.hash(seq_hash(t, &ev));
            self.handle(ev);
            if self.now >= self.shape.horizon && settled_at.is_none() && self.all_settled() {
                settled_at = Some(self.now);
            }
            if settled_at.is_some_and(|s| self.now > s + 10_000) {
                break;
            }
        }
        self.trace.end = self.now;
        for p in 0..self.shape.partitions {
            let owner = self.broker.owner[p];
            let pos = owner.and_then(|(w, e)| {
                let wk = &self.workers[w];
                (wk.epoch == e && wk.alive).then(|| wk.parts.get(&p).map(|st| (st.position, st.loading)))
            });
            self.trace.notes.push(format!(
                "partition {p}: {} records, committed {}, owner {owner:?} at {pos:?}",
                self.broker.logs[p].len(),
                self.broker.committed[p]
            ));
        }
        for (i, w) in self.workers.iter().enumerate() {
            self.trace.notes.push(format!(
                "worker {i}: epoch {} alive {} cut broker {} store {} tasks {} queued {}",
                w.epoch,
                w.alive,
                w.cut_broker,
                w.cut_store,
                w.tasks.len(),
                w.sched.queued_total()
            ));
        }
        self.trace.notes.push(format!("members {:?}", self.broker.members));
        let with_result: BTreeSet<u32> = self.trace.results.iter().map(|r| r.job).collect();
        for j in 0..self.shape.jobs.len() as u32 {
            if with_result.contains(&j) {
                continue;
            }
            let p = self.partition_of(j);
            let copies: Vec<String> = (self.broker.logs[p].iter().enumerate())
                .filter(|(_, m)| m.job == j)
                .map(|(o, m)| format!("offset {o} attempt {}", m.attempt))
                .collect();
            let spilled: Vec<i64> = (self.store.backlog.iter())
                .filter(|((bp, _, _), _)| *bp == p)
                .flat_map(|(_, rows)| rows.iter().filter(|(_, m)| m.job == j).map(|(o, _)| *o))
                .collect();
            self.trace.notes.push(format!(
                "job {j} without result: partition {p} (committed {}), copies [{}], spilled rows {spilled:?}, row {:?}",
                self.broker.committed[p],
                copies.join(", "),
                self.store.rows.get(&j).map(|r| (r.status, r.attempts))
            ));
        }
        self.trace.open_spill_rows = self.store.backlog.values().map(|r| r.len()).sum();
    }

    /// Notes an event of the watched job (`Config::watch_job`) in the report.
    fn log(&mut self, job: u32, what: impl FnOnce() -> String) {
        if self.cfg.watch_job == Some(job) {
            let line = format!("{} ms: job {job}: {}", self.now, what());
            self.trace.notes.push(line);
        }
    }

    fn all_settled(&self) -> bool {
        self.trace.submitted == self.shape.jobs.len() && self.with_result.len() >= self.trace.submitted
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Submit(j) => self.submit(j),
            Ev::Deliver { part, msg } => self.broker.logs[part].push(msg),
            Ev::Tick(w) => self.tick(w),
            Ev::Commit(w) => {
                self.commit(w);
                self.at(self.now + self.shape.commit_ms, Ev::Commit(w));
            }
            Ev::Store { w, epoch, ctx, op, ok } => {
                if self.workers[w].epoch == epoch && self.workers[w].alive {
                    self.store_answer(w, ctx, op, ok)
                }
            }
            Ev::Produced { w, epoch, task, ok } => {
                if self.workers[w].epoch == epoch && self.workers[w].alive {
                    self.io_done(w, task, ok)
                }
            }
            Ev::RunEnd { w, epoch, task } => {
                if self.running(w, epoch, task) {
                    self.run_end(w, task)
                }
            }
            Ev::Heartbeat { w, epoch, task } => {
                if self.running(w, epoch, task) {
                    let (at, sent) = (self.wnow(w), self.now);
                    self.store_call(w, Ctx::Task(task), StoreOp::Heartbeat { at, sent });
                    self.at(self.now + HEARTBEAT_MS, Ev::Heartbeat { w, epoch, task });
                }
            }
            Ev::Fence { w, epoch, task } => {
                let lapsed = |t: &Task| t.last_beat.is_some_and(|b| b + FENCE_MS <= self.now);
                let fences = !self.cfg.bugs_no_fence();
                if fences && self.running(w, epoch, task) && self.workers[w].tasks.get(&task).is_some_and(lapsed) {
                    self.fence(w, task)
                }
            }
            Ev::Recheck { w, epoch, task } => {
                if self.workers[w].epoch == epoch && self.workers[w].alive && self.workers[w].tasks.contains_key(&task)
                {
                    self.store_call(w, Ctx::Task(task), StoreOp::ReadRow);
                }
            }
            Ev::Crash(w) => self.crash(w),
            Ev::Restart(w) => self.restart(w),
            Ev::CutStart { w, broker } => self.cut(w, broker, true),
            Ev::CutEnd { w, broker } => self.cut(w, broker, false),
            Ev::SessionCheck(m) => self.session_check(m),
            Ev::Rebalance => self.rebalance(),
            Ev::Again { w, epoch, pend } => {
                let wk = &self.workers[w];
                let owned = wk.parts.get(&pend.part).is_some_and(|st| st.incarnation == pend.incarnation);
                if wk.epoch == epoch && wk.alive && owned {
                    self.trace.taken_again += 1;
                    self.log(pend.msg.job, || format!("w{w} takes it in again (outcome was not durable)"));
                    self.enqueue(w, pend);
                    self.dispatch(w);
                }
            }
            Ev::OutageStart => self.cover("store_outage"),
            Ev::Watch => {
                self.watch();
                self.at(self.now + WATCH_MS, Ev::Watch);
            }
        }
    }

    /// The liveness watch: a live worker reaching the broker that owns partitions with
    /// records not yet committed, and has made no progress for `STALL_MS` since the last
    /// disruption anywhere, is stalled (the worst failure of a job system: accepted jobs
    /// that silently never run). So is a partition with such records that no live member
    /// owns for as long.
    fn watch(&mut self) {
        let calm = self.calm_since();
        for w in 0..self.workers.len() {
            let me = self.member(w);
            let wk = &self.workers[w];
            if !wk.alive || wk.cut_broker || wk.cut_store {
                continue;
            }
            // Owned as the broker sees it: a partition the worker's loop does not know it
            // owns is the worst stall of all.
            let waiting: Vec<usize> = (0..self.shape.partitions)
                .filter(|&p| {
                    self.broker.owner[p] == Some(me) && self.broker.committed[p] < self.broker.logs[p].len() as i64
                })
                .collect();
            let since = wk.progressed.max(calm);
            if waiting.is_empty() || self.now - since < STALL_MS {
                self.workers[w].stalled = false;
                continue;
            }
            if !wk.stalled {
                let detail: Vec<String> = (waiting.iter())
                    .map(|&p| match wk.parts.get(&p) {
                        Some(st) => format!(
                            "p{p} (committed {} of {}, position {}, loading {}, committable {:?})",
                            self.broker.committed[p],
                            self.broker.logs[p].len(),
                            st.position,
                            st.loading,
                            st.offsets.committable()
                        ),
                        None => format!(
                            "p{p} (committed {} of {}, assigned by the broker, unknown to the worker's loop)",
                            self.broker.committed[p],
                            self.broker.logs[p].len()
                        ),
                    })
                    .collect();
                let line = format!(
                    "worker {w} made no progress for {} ms (since {since} ms) owning records not committed: {}; tasks {}, queued {}",
                    self.now - since,
                    detail.join(", "),
                    wk.tasks.len(),
                    wk.sched.queued_total()
                );
                self.trace.stalls.push(line);
                self.workers[w].stalled = true;
            }
        }
        let live = self.broker.members.iter().any(|&(w, e)| self.workers[w].alive && self.workers[w].epoch == e);
        if live && self.now - calm >= STALL_MS {
            for p in 0..self.shape.partitions {
                let owned =
                    self.broker.owner[p].is_some_and(|(w, e)| self.workers[w].alive && self.workers[w].epoch == e);
                if !owned && self.broker.committed[p] < self.broker.logs[p].len() as i64 && self.unowned.insert(p) {
                    self.trace.stalls.push(format!(
                        "partition {p} has records not committed and no live owner {} ms after the last disruption",
                        self.now - calm
                    ));
                }
            }
        }
    }

    /// The coverage table (`Trace::coverage`): which job states this fault met, fleet-wide.
    fn cover(&mut self, fault: &'static str) {
        let mut met: BTreeSet<&'static str> = BTreeSet::new();
        for wk in self.workers.iter().filter(|w| w.alive) {
            if wk.sched.queued_total() > 0 {
                met.insert("queued");
            }
            for t in wk.tasks.values() {
                met.insert(match t.step {
                    Step::Check => "checking",
                    Step::Mark => "marking_running",
                    Step::Running => "running",
                    Step::Settle => "settling",
                    Step::Follow(_) => "following",
                });
            }
            if wk.parts.values().any(|st| st.loading) {
                met.insert("backlog_loading");
            }
        }
        if self.store.backlog.values().any(|rows| !rows.is_empty()) {
            met.insert("spilled");
        }
        if self.broker.logs.iter().zip(&self.broker.committed).any(|(l, &c)| (l.len() as i64) > c) {
            met.insert("uncommitted");
        }
        if met.is_empty() {
            met.insert("idle");
        }
        for state in met {
            *self.trace.coverage.entry((fault, state)).or_default() += 1;
        }
    }

    /// The last disruption: a worker's (`Worker::disrupted`), the fleet's, or a store outage's end.
    fn calm_since(&self) -> Millis {
        let outage = self.store.outages.iter().filter(|&&(_, b)| b <= self.now).map(|&(_, b)| b).max().unwrap_or(0);
        let worker = self.workers.iter().map(|w| w.disrupted).max().unwrap_or(0);
        outage.max(worker).max(self.disrupted)
    }

    // ----- the client and the broker -----------------------------------------------------

    fn submit(&mut self, j: u32) {
        let part = self.partition_of(j);
        self.broker.logs[part].push(Msg { job: j, attempt: 0, crash_count: 0 });
        self.trace.submitted += 1;
    }

    fn partition_of(&self, j: u32) -> usize {
        let spec = &self.shape.jobs[j as usize];
        match self.shape.lanes_at(spec.tenant, spec.submit_at) {
            // The lane-change fault: placed as a submitter places it (`core::lanes`).
            Some(lanes) => {
                use crate::core::lanes::{partition, Lane};
                let lane = Lane::of_job(&format!("job-{j}"), lanes);
                partition(&tenant_name(spec.tenant), lane, self.shape.partitions as u32) as usize
            }
            // A tenant's jobs spread over its few partitions (keyed by tenant and a spread).
            None => ((spec.tenant as usize).wrapping_mul(7) + (j as usize % 2)) % self.shape.partitions,
        }
    }

    fn member(&self, w: usize) -> Member {
        (w, self.workers[w].epoch)
    }

    fn produce_latency(&mut self) -> Millis {
        if self.rng.chance(self.shape.slow_produce) {
            self.rng.range(200, 1_500)
        } else {
            self.rng.range(2, 20)
        }
    }

    fn store_latency(&mut self) -> Millis {
        if self.rng.chance(0.02) {
            self.rng.range(50, 400)
        } else {
            self.rng.range(1, 8)
        }
    }

    fn store_down(&self, t: Millis) -> bool {
        self.store.outages.iter().any(|&(a, b)| a <= t && t < b)
    }

    fn schedule_rebalance(&mut self) {
        if !self.broker.rebalance_pending {
            self.broker.rebalance_pending = true;
            let d = self.rng.range(100, 1_500);
            self.at(self.now + d, Ev::Rebalance);
        }
    }

    /// A new assignment: partitions spread round-robin over the members; a partition
    /// that changes owner is revoked from the old one (which commits what it finished
    /// first) and assigned to the new one at the committed offset.
    fn rebalance(&mut self) {
        self.cover("rebalance");
        self.broker.rebalance_pending = false;
        self.disrupted = self.now;
        let members: Vec<Member> = self.broker.members.iter().copied().collect();
        self.trace.rebalances += 1;
        for p in 0..self.shape.partitions {
            let new = if members.is_empty() { None } else { Some(members[p % members.len()]) };
            let old = self.broker.owner[p];
            if old == new {
                continue;
            }
            if let Some((ow, oe)) = old {
                if self.workers[ow].epoch == oe && self.workers[ow].alive {
                    self.revoke(ow, p);
                }
            }
            self.broker.owner[p] = new;
            if let Some((nw, ne)) = new {
                if self.workers[nw].epoch == ne && self.workers[nw].alive {
                    self.assign(nw, p);
                }
            }
        }
    }

    fn revoke(&mut self, w: usize, p: usize) {
        if let Some(j) = self.cfg.watch_job.filter(|&j| self.partition_of(j) == p) {
            self.log(j, || format!("p{p} revoked from w{w}"));
        }
        self.commit_part(w, p);
        let wk = &mut self.workers[w];
        wk.disrupted = self.now;
        wk.parts.remove(&p);
        let drained = wk.sched.drain_where(|pend| pend.part == p);
        for d in drained {
            let tenant = tenant_name(self.shape.jobs[d.msg.job as usize].tenant);
            self.workers[w].buffer.left(&tenant, JOB_BYTES);
        }
    }

    fn assign(&mut self, w: usize, p: usize) {
        if let Some(j) = self.cfg.watch_job.filter(|&j| self.partition_of(j) == p) {
            let at = self.broker.committed[p];
            self.log(j, || format!("p{p} assigned to w{w} at committed {at}"));
        }
        self.next_incarnation += 1;
        let part = Part {
            incarnation: self.next_incarnation,
            offsets: PartitionOffsets::new(),
            position: self.broker.committed[p],
            backlogs: BTreeMap::new(),
            loading: true,
            last_seen: -1,
            read_upto: BTreeMap::new(),
            again_times: BTreeMap::new(),
        };
        self.workers[w].parts.insert(p, part);
        self.workers[w].disrupted = self.now;
        self.store_call(w, Ctx::Loop(self.next_incarnation), StoreOp::ListBacklog { part: p });
    }

    fn commit(&mut self, w: usize) {
        if !self.workers[w].alive {
            return;
        }
        let parts: Vec<usize> = self.workers[w].parts.keys().copied().collect();
        for p in parts {
            self.commit_part(w, p);
        }
    }

    /// Commits a partition's committable offset, if the broker takes it: the worker reaches
    /// the broker and owns the partition in the current assignment.
    fn commit_part(&mut self, w: usize, p: usize) {
        let me = self.member(w);
        let wk = &self.workers[w];
        let Some(at) = wk.parts.get(&p).and_then(|st| st.offsets.committable()) else { return };
        if wk.cut_broker || self.broker.owner[p] != Some(me) {
            return;
        }
        if at > self.broker.committed[p] {
            self.workers[w].progressed = self.now;
        }
        self.broker.committed[p] = at;
    }

    // ----- faults ------------------------------------------------------------------------

    fn crash(&mut self, w: usize) {
        if !self.workers[w].alive {
            return;
        }
        if let Some(j) = self.cfg.watch_job {
            self.log(j, || format!("w{w} crashed"));
        }
        self.cover("crash");
        self.trace.crashes += 1;
        self.disrupted = self.now;
        let me = self.member(w);
        let wk = &mut self.workers[w];
        wk.alive = false;
        for t in wk.tasks.values() {
            if let Some(r) = t.run {
                if self.trace.runs[r].end.is_none() {
                    self.trace.runs[r].end = Some(self.now);
                    self.trace.runs[r].outcome = Outcome::Crashed;
                }
            }
        }
        for runs in self.active_runs.values_mut() {
            runs.retain(|&(_, m)| m != me);
        }
        wk.tasks.clear();
        wk.parts.clear();
        // The broker notices at the session timeout.
        self.broker.silent_since.insert(me, self.now);
        self.at(self.now + SESSION_MS, Ev::SessionCheck(me));
        let back = self.rng.range(500, 5_000);
        self.at(self.now + back, Ev::Restart(w));
    }

    fn restart(&mut self, w: usize) {
        let skew = self.workers[w].skew;
        let wk = &mut self.workers[w];
        wk.epoch += 1;
        wk.alive = true;
        wk.skew = skew;
        wk.sched = Scheduler::new(Pool::Short, sched_config(self.shape.slots)).expect("valid scheduler config");
        wk.buffer = Buffer::default();
        wk.disrupted = self.now;
        let me = self.member(w);
        if !self.workers[w].cut_broker {
            self.broker.members.insert(me);
            self.schedule_rebalance();
        }
        self.at(self.now + TICK_MS, Ev::Tick(w));
        self.at(self.now + self.shape.commit_ms, Ev::Commit(w));
    }

    fn cut(&mut self, w: usize, broker: bool, start: bool) {
        if start {
            self.cover(if broker { "cut_from_broker" } else { "cut_from_store" });
        }
        let wk = &mut self.workers[w];
        wk.disrupted = self.now;
        if !broker {
            wk.cut_store = start;
            return;
        }
        wk.cut_broker = start;
        let alive = wk.alive;
        let me = self.member(w);
        if !alive {
            return; // a dead process's session lapses on its own (`crash`)
        }
        if start {
            self.broker.silent_since.insert(me, self.now);
            self.at(self.now + SESSION_MS, Ev::SessionCheck(me));
        } else {
            self.broker.silent_since.remove(&me);
            if self.workers[w].alive && !self.broker.members.contains(&me) {
                self.broker.members.insert(me);
                self.schedule_rebalance();
            }
        }
    }

    /// The broker drops a member silent for a whole session; the worker, if alive, learns
    /// it lost its partitions (as a client whose session lapsed does).
    fn session_check(&mut self, m: Member) {
        let Some(&since) = self.broker.silent_since.get(&m) else { return };
        if self.now - since < SESSION_MS || !self.broker.members.remove(&m) {
            return;
        }
        self.broker.silent_since.remove(&m);
        // Its partitions are no one's until the next assignment (which hands them to it
        // again, as a fresh assignment, if it rejoins).
        for owner in self.broker.owner.iter_mut().filter(|o| **o == Some(m)) {
            *owner = None;
        }
        let (w, epoch) = m;
        if self.workers[w].epoch == epoch && self.workers[w].alive {
            let parts: Vec<usize> = self.workers[w].parts.keys().copied().collect();
            for p in parts {
                self.revoke(w, p);
            }
        }
        self.schedule_rebalance();
    }

    // ----- a worker's loop ---------------------------------------------------------------

    fn wnow(&self, w: usize) -> Millis {
        self.now + self.workers[w].skew
    }

    fn tick(&mut self, w: usize) {
        if !self.workers[w].alive {
            return;
        }
        self.at(self.now + TICK_MS, Ev::Tick(w));
        if !self.workers[w].cut_broker {
            self.fetch(w);
        }
        self.tend_backlogs(w);
        self.dispatch(w);
    }

    fn fetch(&mut self, w: usize) {
        let parts: Vec<usize> = self.workers[w].parts.keys().copied().collect();
        for p in parts {
            for _ in 0..FETCH_MAX {
                let st = &self.workers[w].parts[&p];
                if st.loading {
                    break;
                }
                let Some(&msg) = self.broker.logs[p].get(st.position as usize) else { break };
                let offset = st.position;
                self.take_in(w, p, offset, msg);
            }
        }
    }

    /// Intake (`pool::take_in`): the offset is tracked, then the job spills if its tenant's
    /// buffer is full or its backlog is active (`core::buffer`, `core::backlog`), else it
    /// is queued for the scheduler.
    fn take_in(&mut self, w: usize, p: usize, offset: i64, msg: Msg) {
        self.log(msg.job, || format!("w{w} took in p{p} o{offset} attempt {}", msg.attempt));
        let tenant_id = self.shape.jobs[msg.job as usize].tenant;
        let tenant = tenant_name(tenant_id);
        let wk = &mut self.workers[w];
        wk.progressed = self.now;
        let st = wk.parts.get_mut(&p).expect("owned partition");
        st.position = offset + 1;
        st.last_seen = st.last_seen.max(offset);
        st.offsets.started(offset).expect("offsets taken in increasing order");
        let incarnation = st.incarnation;
        let active = st.backlogs.get(&tenant_id).is_some_and(|b| b.is_active());
        if wk.buffer.must_spill(&self.bounds, &tenant, JOB_BYTES, active) {
            let b = st.backlogs.entry(tenant_id).or_default();
            if b.spill(offset) {
                b.saw_job(JOB_BYTES);
                if st.read_upto.get(&tenant_id).is_some_and(|&r| r > offset) {
                    self.trace.notes.push(format!(
                        "at {} ms: offset {offset} (job {}) of t{tenant_id} spilled on partition {p} behind the backlog's read position {}",
                        self.now, msg.job, st.read_upto[&tenant_id]
                    ));
                }
                self.trace.spilled += 1;
                self.store_call(w, Ctx::Loop(incarnation), StoreOp::Spill { part: p, tenant: tenant_id, offset, msg });
                return;
            }
        }
        let pend = Pend { msg, part: p, offset, incarnation, spill: None, enqueued_true: self.now, quiet_bound: None };
        self.enqueue(w, pend);
    }

    fn enqueue(&mut self, w: usize, mut pend: Pend) {
        let spec = self.shape.jobs[pend.msg.job as usize];
        let tenant = tenant_name(spec.tenant);
        pend.enqueued_true = self.now;
        if self.shape.is_quiet(spec.tenant) {
            pend.quiet_bound = Some(self.quiet_bound(w));
        }
        let now = self.wnow(w);
        let wk = &mut self.workers[w];
        wk.buffer.entered(&tenant, JOB_BYTES);
        if let Err((_, pend)) = wk.sched.enqueue(&tenant, "sim", Priority::Normal, pend, now) {
            // Queue full: the buffer's bounds keep it from happening; a job refused here
            // would stay uncommitted in the real loop too.
            wk.buffer.left(&tenant, JOB_BYTES);
            self.trace.notes.push(format!("scheduler refused job {} (queue full)", pend.msg.job));
        }
    }

    /// The fairness bound for a quiet tenant's job enqueued now on worker `w`, from
    /// start-time fair queueing: at most one job of every flow backlogged here can be ahead
    /// of a newly active flow's head, and every slot frees within the longest hold of a
    /// job (`Shape::max_hold`). So the wait is at most `(ceil(F / S) + 1) * max_hold`.
    fn quiet_bound(&self, w: usize) -> Millis {
        let wk = &self.workers[w];
        let flows = (0..self.shape.tenants as u32).filter(|&t| wk.sched.queued(&tenant_name(t)) > 0).count();
        let rounds = flows.div_ceil(self.shape.slots.max(1)) as Millis + 1;
        rounds * self.shape.max_hold()
    }

    fn dispatch(&mut self, w: usize) {
        loop {
            let now = self.wnow(w);
            let Some(d) = self.workers[w].sched.next(now) else { return };
            let pend = d.payload;
            self.workers[w].buffer.left(&d.tenant, JOB_BYTES);
            if let Some(bound) = pend.quiet_bound {
                let wait = self.now - pend.enqueued_true;
                let calm = self.workers[w].disrupted < pend.enqueued_true - self.shape.max_hold();
                let outage = self
                    .store
                    .outages
                    .iter()
                    .any(|&(a, b)| a < self.now && b > pend.enqueued_true - self.shape.max_hold());
                if calm && !outage {
                    self.trace.quiet.push(QuietWait { job: pend.msg.job, worker: w, wait, bound });
                }
            }
            self.next_task += 1;
            let id = self.next_task;
            let msg = pend.msg;
            // `exec::InFlight`: a copy of the same job and attempt in flight here leads.
            let leader = self.workers[w]
                .tasks
                .iter()
                .find(|(_, t)| {
                    !matches!(t.step, Step::Follow(_)) && (t.msg.job, t.msg.attempt) == (msg.job, msg.attempt)
                })
                .map(|(&l, _)| l);
            let task = Task {
                pend,
                did: d.id,
                msg,
                step: leader.map_or(Step::Check, Step::Follow),
                run: None,
                todo: Vec::new(),
                durable: true,
                ran: false,
                todo_started: false,
                checked_true: 0,
                last_beat: None,
            };
            self.workers[w].tasks.insert(id, task);
            if let Some(l) = leader {
                self.log(msg.job, || format!("w{w} task {id} follows task {l} (in flight here); its slot goes back"));
                self.workers[w].sched.release(d.id, now);
                continue;
            }
            self.store_call(w, Ctx::Task(id), StoreOp::ReadRow);
        }
    }

    /// Reads spilled rows back for tenants with room (`core::buffer::read_room`,
    /// `TenantBacklog::plan_read`) and drops finished buckets (`TenantBacklog::deletable`).
    fn tend_backlogs(&mut self, w: usize) {
        let mut calls = Vec::new();
        let wk = &mut self.workers[w];
        for (&p, st) in wk.parts.iter_mut() {
            if st.loading {
                continue;
            }
            for (&tenant, b) in st.backlogs.iter_mut() {
                let room = wk.buffer.read_room(&self.bounds, &tenant_name(tenant), READ_CHUNK, b.largest_job());
                if room > 0 {
                    if let Some(plan) = b.plan_read(room) {
                        calls.push((st.incarnation, StoreOp::ReadRows { part: p, tenant, plan }));
                    }
                }
                for bucket in b.deletable(st.last_seen) {
                    calls.push((st.incarnation, StoreOp::DropBucket { part: p, tenant, bucket }));
                }
            }
            st.backlogs.retain(|_, b| !b.is_empty());
        }
        for (incarnation, op) in calls {
            self.store_call(w, Ctx::Loop(incarnation), op);
        }
    }

    // ----- the store ---------------------------------------------------------------------

    /// Sends a store call; it succeeds unless the store is down or the worker is cut off
    /// from it when sent (then it fails after the timeout).
    fn store_call(&mut self, w: usize, ctx: Ctx, op: StoreOp) {
        let ok = !self.store_down(self.now) && !self.workers[w].cut_store;
        let after = if ok { self.store_latency() } else { TIMEOUT_MS };
        let epoch = self.workers[w].epoch;
        self.at(self.now + after, Ev::Store { w, epoch, ctx, op, ok });
    }

    fn store_answer(&mut self, w: usize, ctx: Ctx, op: StoreOp, ok: bool) {
        match ctx {
            Ctx::Loop(incarnation) => self.loop_answer(w, incarnation, op, ok),
            Ctx::Task(task) => {
                if !self.workers[w].tasks.contains_key(&task) {
                    return;
                }
                match op {
                    StoreOp::ReadRow => self.checked(w, task, ok),
                    StoreOp::MarkRunning { attempts, crash_count, at, sent } => {
                        self.marked(w, task, ok, (attempts, crash_count), (at, sent))
                    }
                    StoreOp::Heartbeat { at, sent } => {
                        if ok {
                            self.beat_acknowledged(w, task, sent);
                            let job = self.workers[w].tasks[&task].msg.job;
                            // The heartbeat is the job's, whoever's mark the row shows
                            // (`Store::put_heartbeat`: a row of its own, keyed by job; the
                            // check reads it whatever worker wrote it), and the newest
                            // stamp wins (`store::beat_timestamp`) (seed 16315).
                            if let Some(r) = self.store.rows.get_mut(&job) {
                                if at > r.hb_at {
                                    r.hb_at = at;
                                    r.hb_true = sent;
                                }
                            }
                            if let Some(run) = self.workers[w].tasks[&task].run {
                                self.trace.runs[run].last_hb_true = self.now;
                            }
                        }
                    }
                    StoreOp::PutRetrying { attempts, crash_count } => {
                        let job = self.workers[w].tasks[&task].msg.job;
                        self.log(job, || format!("w{w} task {task} retrying state write: {ok}"));
                        if ok {
                            // Conditional (`Store::put_state_if_marked`): only over this run's own
                            // running mark; a superseded run's write is refused (seed 528).
                            let (run, me) = (self.workers[w].tasks[&task].msg, self.member(w));
                            let row = Row {
                                status: Status::Retrying,
                                worker: me,
                                attempts,
                                crash_count,
                                hb_at: 0,
                                hb_true: 0,
                            };
                            match self.store.rows.get_mut(&run.job) {
                                Some(r)
                                    if r.status == Status::Running
                                        && r.worker == me
                                        && r.attempts == run.attempt
                                        && r.crash_count == run.crash_count =>
                                {
                                    *r = row
                                }
                                _ => self.log(run.job, || format!("w{w} task {task} retrying refused: superseded")),
                            }
                        }
                        self.io_done(w, task, true)
                    }
                    StoreOp::PutTerminal => {
                        let job = self.workers[w].tasks[&task].msg.job;
                        self.log(job, || format!("w{w} task {task} terminal state write: {ok}"));
                        if ok {
                            let (job, me) = (self.workers[w].tasks[&task].msg.job, self.member(w));
                            let r = self.store.rows.entry(job).or_insert(Row {
                                status: Status::Terminal,
                                worker: me,
                                attempts: 0,
                                crash_count: 0,
                                hb_at: 0,
                                hb_true: 0,
                            });
                            r.status = Status::Terminal;
                            self.trace.terminal_at.entry(job).or_insert(self.now);
                        }
                        self.io_done(w, task, ok)
                    }
                    StoreOp::Fence => {
                        let (job, me) = (self.workers[w].tasks[&task].msg.job, self.member(w));
                        // Every simulated run wrote its running mark, so every one is fenced.
                        let row = self.store.rows.get(&job);
                        let ended = row.is_some_and(|r| r.status == Status::Terminal);
                        let elsewhere = row.is_some_and(|r| r.status == Status::Running && r.worker != me);
                        if ok && (ended || elsewhere) {
                            self.trace.fenced += 1;
                            self.log(job, || {
                                format!("w{w} task {task} fenced off: ended {ended}, running elsewhere {elsewhere}")
                            });
                            if let Some(t) = self.workers[w].tasks.get_mut(&task) {
                                t.todo.clear();
                            }
                        }
                        // Running elsewhere: not durable, taken in again to follow that run
                        // (`durable::taken_over`). A read that fails lets the outcome through.
                        self.io_done(w, task, !(ok && elsewhere))
                    }
                    _ => unreachable!("loop calls answer to the loop"),
                }
            }
        }
    }

    /// A loop call's answer, for the partition's state only if it is still the incarnation
    /// that sent it (the store's side of a write happened either way).
    fn loop_answer(&mut self, w: usize, incarnation: u64, op: StoreOp, ok: bool) {
        match op {
            StoreOp::ListBacklog { part } => {
                let Some(st) = self.workers[w].parts.get_mut(&part).filter(|st| st.incarnation == incarnation) else {
                    return;
                };
                if !st.loading {
                    return;
                }
                if !ok {
                    return self.store_call(w, Ctx::Loop(incarnation), StoreOp::ListBacklog { part });
                }
                let mut by_tenant: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
                for (&(p, t, b), rows) in &self.store.backlog {
                    if p == part && !rows.is_empty() {
                        by_tenant.entry(t).or_default().push(b);
                    }
                }
                for (t, buckets) in by_tenant {
                    st.backlogs.insert(t, TenantBacklog::recovered(buckets));
                }
                st.loading = false;
            }
            StoreOp::Spill { part, tenant, offset, msg } => {
                if ok {
                    let rows = self.store.backlog.entry((part, tenant, bucket_of(offset))).or_default();
                    rows.insert(offset, msg);
                }
                let Some(st) = self.workers[w].parts.get_mut(&part).filter(|st| st.incarnation == incarnation) else {
                    return;
                };
                let b = st.backlogs.entry(tenant).or_insert_with(TenantBacklog::new);
                if ok {
                    b.acked(&[offset]);
                    st.offsets.finished(offset);
                } else {
                    b.failed(&[offset]);
                    let pend =
                        Pend { msg, part, offset, incarnation, spill: None, enqueued_true: 0, quiet_bound: None };
                    self.enqueue(w, pend);
                }
            }
            StoreOp::ReadRows { part, tenant, plan } => {
                let rows: Vec<(i64, Msg)> = if ok {
                    let r = self.store.backlog.get(&(part, tenant, plan.bucket));
                    r.map(|r| {
                        r.range(plan.after + 1..plan.before.max(plan.after + 1))
                            .take(plan.limit)
                            .map(|(&o, &m)| (o, m))
                            .collect()
                    })
                    .unwrap_or_default()
                } else {
                    Vec::new()
                };
                let Some(st) = self.workers[w].parts.get_mut(&part).filter(|st| st.incarnation == incarnation) else {
                    return;
                };
                let Some(b) = st.backlogs.get_mut(&tenant) else { return };
                if !ok {
                    return b.read_failed();
                }
                let offsets: Vec<i64> = rows.iter().map(|(o, _)| *o).collect();
                b.read_done(&plan, &offsets);
                if let Some(&last) = offsets.last() {
                    let r = st.read_upto.entry(tenant).or_insert(last);
                    *r = (*r).max(last);
                }
                self.trace.read_back += rows.len();
                for (offset, msg) in rows {
                    let pend = Pend {
                        msg,
                        part,
                        offset,
                        incarnation,
                        spill: Some(plan.bucket),
                        enqueued_true: 0,
                        quiet_bound: None,
                    };
                    self.enqueue(w, pend);
                }
            }
            StoreOp::DropBucket { part, tenant, bucket } => {
                if ok {
                    self.store.backlog.remove(&(part, tenant, bucket));
                }
                let st = self.workers[w].parts.get_mut(&part).filter(|st| st.incarnation == incarnation);
                let Some(b) = st.and_then(|st| st.backlogs.get_mut(&tenant)) else { return };
                if ok {
                    b.deleted(bucket)
                } else {
                    b.delete_failed(bucket)
                }
            }
            _ => unreachable!("task calls answer to their task"),
        }
    }

    // ----- a job's route -----------------------------------------------------------------

    /// The check stage (`worker::check::check_row`): the row settles the copy, makes it
    /// wait for a live worker, lets it take over from a dead one, or lets it run.
    fn checked(&mut self, w: usize, task: u64, ok: bool) {
        if !ok {
            // `through_outage`: held, looked at again (the slot stays taken).
            return self.at(self.now + 200, Ev::Recheck { w, epoch: self.workers[w].epoch, task });
        }
        let me = self.member(w);
        let now = self.wnow(w);
        let t = self.workers[w].tasks.get_mut(&task).expect("task");
        t.checked_true = self.now;
        let msg = t.msg;
        let row = self.store.rows.get(&msg.job).copied();
        let (pend, now_true) = (t.pend.clone(), self.now);
        self.log(msg.job, || {
            format!(
                "w{w} task {task} (p{} o{} inc {} spill {:?}) attempt {} read row {:?}",
                pend.part,
                pend.offset,
                pend.incarnation,
                pend.spill,
                msg.attempt,
                row.map(|r| (r.status, r.worker, r.attempts, now_true - r.hb_true))
            )
        });
        let Some(row) = row else { return self.mark(w, task) };
        if row.status == Status::Terminal {
            return self.end(w, task, true);
        }
        if row.attempts > msg.attempt {
            return self.end(w, task, true); // stale attempt
        }
        if row.status != Status::Running {
            return self.mark(w, task);
        }
        // Running with a fresh heartbeat, here or elsewhere: wait for its end (a copy of a
        // job running here is no longer settled at once: that run's outcome may not be
        // durable, and the copy's commit would lose the job, seed 329).
        let fresh = now - row.hb_at < LEASE_MS;
        if fresh {
            return self.at(self.now + RECHECK_MS, Ev::Recheck { w, epoch: me.1, task });
        }
        if msg.attempt > row.attempts {
            // A later attempt than the running one, which lapsed: that attempt ended (its
            // "retrying" write lost) or a re-run of it died; not a crash of this attempt.
            return self.mark(w, task);
        }
        // Take over from a worker whose heartbeat lapsed: a crash, never an attempt.
        let crashes = msg.crash_count.max(row.crash_count + 1);
        let state = AttemptState { attempt: msg.attempt, crash_count: crashes - 1, last_error: None };
        let jitter = self.rng.unit();
        self.trace.takeovers.push((msg.job, self.now, row.hb_true, row.worker.0, w));
        match retry::decide(FailureClass::WorkerCrash, &state, &self.policy, now, jitter) {
            Decision::DeadLetter { reason } => {
                let class = FailureClass::Poison;
                self.trace.reasons.push((msg.job, class, reason));
                let t = self.workers[w].tasks.get_mut(&task).expect("task");
                t.step = Step::Settle;
                t.todo = vec![
                    Io::Produce(Produce::DeadLetter { class, attempts: msg.attempt, reason_class: class }),
                    Io::Produce(Produce::Result { ok: false, class: Some(class), attempts: msg.attempt }),
                    Io::Store(StoreOp::PutTerminal),
                ];
                self.next_io(w, task);
            }
            Decision::Retry { .. } => {
                self.workers[w].tasks.get_mut(&task).expect("task").msg.crash_count = crashes;
                self.mark(w, task);
            }
        }
    }

    /// Marks the row running here (simplified: the real route writes the running row only
    /// for jobs outliving a 250 ms grace).
    fn mark(&mut self, w: usize, task: u64) {
        let t = self.workers[w].tasks.get_mut(&task).expect("task");
        t.step = Step::Mark;
        let (attempts, crash_count) = (t.msg.attempt, t.msg.crash_count);
        let op = StoreOp::MarkRunning { attempts, crash_count, at: self.wnow(w), sent: self.now };
        self.store_call(w, Ctx::Task(task), op);
    }

    /// Whether `task` of worker `w` (this process, `epoch`) is running its handler.
    fn running(&self, w: usize, epoch: u32, task: u64) -> bool {
        let wk = &self.workers[w];
        wk.epoch == epoch && wk.alive && wk.tasks.get(&task).is_some_and(|t| t.step == Step::Running)
    }

    /// The store acknowledged a heartbeat of `task`'s run sent at `sent`: its fence moves
    /// to two intervals after the newest one.
    fn beat_acknowledged(&mut self, w: usize, task: u64, sent: Millis) {
        let epoch = self.workers[w].epoch;
        let Some(t) = self.workers[w].tasks.get_mut(&task) else { return };
        t.last_beat = Some(t.last_beat.map_or(sent, |b| b.max(sent)));
        self.at(sent + FENCE_MS, Ev::Fence { w, epoch, task });
    }

    /// The run's heartbeats went unacknowledged for `FENCE_MS`: it stops, publishes and
    /// writes nothing, and its copy is not durable (`worker::settle`).
    fn fence(&mut self, w: usize, task: u64) {
        let (job, run) = (self.workers[w].tasks[&task].msg.job, self.workers[w].tasks[&task].run);
        self.log(job, || format!("w{w} task {task} fenced: no heartbeat acknowledged for {FENCE_MS} ms"));
        self.trace.runs_fenced += 1;
        let me = self.member(w);
        if let Some(run) = run {
            self.trace.runs[run].end = Some(self.now);
            self.trace.runs[run].outcome = Outcome::Fenced;
        }
        if let Some(r) = self.active_runs.get_mut(&job) {
            r.retain(|&(_, m)| m != me);
        }
        self.end(w, task, false);
    }

    fn marked(&mut self, w: usize, task: u64, ok: bool, attempt: (i32, i32), stamp: (Millis, Millis)) {
        let ((attempts, crash_count), (at, sent)) = (attempt, stamp);
        let job = self.workers[w].tasks[&task].msg.job;
        self.log(job, || format!("w{w} task {task} marked running attempt {attempts}: {ok}"));
        if !ok {
            // Not durable: the copy is left for redelivery.
            return self.end(w, task, false);
        }
        let me = self.member(w);
        let job = self.workers[w].tasks[&task].msg.job;
        if self.store.rows.get(&job).is_some_and(|r| r.status == Status::Terminal) {
            // Conditional (`Store::put_running_with_heartbeat`): never over a finished job;
            // this copy is superseded and settled without running (seed 2191).
            self.log(job, || format!("w{w} task {task} running mark refused: finished"));
            return self.end(w, task, true);
        }
        // The mark's first heartbeat replaces an older-stamped one only (`beat_timestamp`).
        let (hb_at, hb_true) = match self.store.rows.get(&job) {
            Some(r) if r.hb_at > at => (r.hb_at, r.hb_true),
            _ => (at, sent),
        };
        self.store.rows.insert(job, Row { status: Status::Running, worker: me, attempts, crash_count, hb_at, hb_true });
        self.start_run(w, task);
        self.beat_acknowledged(w, task, sent);
    }

    fn start_run(&mut self, w: usize, task: u64) {
        let me = self.member(w);
        let t = self.workers[w].tasks.get_mut(&task).expect("task");
        t.step = Step::Running;
        t.ran = true;
        let msg = t.msg;
        let t = &self.workers[w].tasks[&task];
        let spec = self.shape.jobs[msg.job as usize];
        // Lease check: anyone else running it now?
        let others: Vec<(usize, Member)> = self.active_runs.get(&msg.job).cloned().unwrap_or_default();
        let checked = t.checked_true;
        for (r, other) in others {
            let (last_hb, marked) = (self.trace.runs[r].last_hb_true, self.trace.runs[r].start);
            self.trace.overlaps.push(Overlap {
                job: msg.job,
                first: other.0,
                second: w,
                at: self.now,
                last_hb,
                marked,
                checked,
            });
        }
        let run = self.trace.runs.len();
        self.trace.runs.push(RunRec {
            job: msg.job,
            worker: w,
            attempt: msg.attempt,
            start: self.now,
            end: None,
            last_hb_true: self.now,
            outcome: Outcome::Running,
        });
        self.active_runs.entry(msg.job).or_default().push((run, me));
        self.workers[w].tasks.get_mut(&task).expect("task").run = Some(run);
        let epoch = me.1;
        self.at(self.now + HEARTBEAT_MS, Ev::Heartbeat { w, epoch, task });
        if spec.kind == Kind::Crash {
            self.at(self.now + spec.dur / 2, Ev::Crash(w));
        } else {
            self.at(self.now + spec.dur, Ev::RunEnd { w, epoch, task });
        }
    }

    /// The handler returned: settle (`worker::settle`) by the job's kind.
    fn run_end(&mut self, w: usize, task: u64) {
        let job = self.workers[w].tasks[&task].msg.job;
        self.log(job, || format!("w{w} task {task} handler returned"));
        let me = self.member(w);
        let now = self.wnow(w);
        let t = self.workers[w].tasks.get_mut(&task).expect("task");
        t.step = Step::Settle;
        let msg = t.msg;
        let run = t.run.expect("a run");
        let spec = self.shape.jobs[msg.job as usize];
        let failure = match spec.kind {
            Kind::Ok => None,
            Kind::FailsThenOk(n) if msg.attempt < n as i32 => Some(FailureClass::AppError),
            Kind::FailsThenOk(_) => None,
            Kind::AlwaysFails => Some(FailureClass::AppError),
            Kind::Permanent => Some(FailureClass::Permanent),
            Kind::Crash => unreachable!("a crashing job never returns"),
        };
        self.trace.runs[run].end = Some(self.now);
        self.trace.runs[run].outcome = if failure.is_some() { Outcome::Failed } else { Outcome::Succeeded };
        if let Some(r) = self.active_runs.get_mut(&msg.job) {
            r.retain(|&(_, m)| m != me);
        }
        let todo = match failure {
            None => vec![
                Io::Store(StoreOp::Fence),
                Io::Produce(Produce::Result { ok: true, class: None, attempts: msg.attempt + 1 }),
                Io::Store(StoreOp::PutTerminal),
            ],
            Some(class) => {
                let state = AttemptState { attempt: msg.attempt, crash_count: msg.crash_count, last_error: None };
                let jitter = self.rng.unit();
                match retry::decide(class, &state, &self.policy, now, jitter) {
                    Decision::Retry { not_before, attempt, crash_count, .. } => {
                        let next = Msg { job: msg.job, attempt, crash_count };
                        // `not_before` is on this worker's clock; the relay releases it then.
                        let release = not_before - self.workers[w].skew;
                        vec![
                            Io::Produce(Produce::Retry { msg: next, not_before: release }),
                            Io::StoreBestEffort(StoreOp::PutRetrying { attempts: attempt, crash_count }),
                        ]
                    }
                    Decision::DeadLetter { reason } => {
                        let dl = retry::dead_letter_class(class);
                        let attempts = msg.attempt + 1;
                        self.trace.reasons.push((msg.job, dl, reason));
                        vec![
                            Io::Produce(Produce::DeadLetter { class: dl, attempts, reason_class: dl }),
                            Io::Store(StoreOp::Fence),
                            Io::Produce(Produce::Result { ok: false, class: Some(dl), attempts }),
                            Io::Store(StoreOp::PutTerminal),
                        ]
                    }
                }
            }
        };
        let t = self.workers[w].tasks.get_mut(&task).expect("task");
        t.todo = todo;
        t.todo_started = true;
        if self.cfg.bugs_commit_before_durable() {
            let pend = t.pend.clone();
            self.release_offset(w, &pend, true);
        }
        self.next_io(w, task);
    }

    /// Does the settle's next I/O, or ends the task when none is left.
    fn next_io(&mut self, w: usize, task: u64) {
        let t = self.workers[w].tasks.get_mut(&task).expect("task");
        if t.todo.is_empty() {
            let durable = t.durable;
            return self.end(w, task, durable);
        }
        let io = t.todo.remove(0);
        let epoch = self.workers[w].epoch;
        match io {
            Io::Store(op) | Io::StoreBestEffort(op) => self.store_call(w, Ctx::Task(task), op),
            Io::Produce(p) => {
                let ok = !self.workers[w].cut_broker;
                let after = if ok { self.produce_latency() } else { TIMEOUT_MS };
                if ok {
                    let t = &self.workers[w].tasks[&task];
                    let (job, checked) = (t.msg.job, t.checked_true);
                    let at = self.now + after;
                    self.produced(w, job, p, at, checked);
                }
                self.at(self.now + after, Ev::Produced { w, epoch, task, ok });
            }
        }
    }

    /// A produce the broker will acknowledge at `at`: its record exists from then (even if
    /// the worker dies before the acknowledgement arrives).
    fn produced(&mut self, w: usize, job: u32, p: Produce, at: Millis, checked: Millis) {
        match p {
            Produce::Result { ok, class, attempts } => {
                self.with_result.insert(job);
                self.trace.results.push(Result_ { job, ok, class, attempts, at, worker: w, checked })
            }
            Produce::DeadLetter { class, attempts, reason_class } => {
                self.trace.dlq.push(Dlq { job, class, attempts, reason_class })
            }
            Produce::Retry { msg, not_before } => {
                self.log(job, || {
                    format!("w{w} retry attempt {} produced, delivered at {}", msg.attempt, not_before.max(at))
                });
                let part = self.partition_of(job);
                self.at(not_before.max(at), Ev::Deliver { part, msg });
            }
        }
    }

    fn io_done(&mut self, w: usize, task: u64, ok: bool) {
        let Some(job) = self.workers[w].tasks.get(&task).map(|t| t.msg.job) else { return };
        self.log(job, || format!("w{w} task {task} settle step done: {ok}"));
        let Some(t) = self.workers[w].tasks.get_mut(&task) else { return };
        if !ok {
            // The outcome is not durable: stop here, the job is redelivered.
            t.durable = false;
            t.todo.clear();
        }
        self.next_io(w, task)
    }

    /// The job's end reaches the pool loop: its slot is freed, and its offset (or spilled
    /// row) released only if the outcome is durable.
    fn end(&mut self, w: usize, task: u64, durable: bool) {
        let Some(t) = self.workers[w].tasks.remove(&task) else { return };
        let current = self.workers[w].parts.get(&t.pend.part).map(|st| st.incarnation);
        self.log(t.msg.job, || {
            format!("w{w} task {task} ended, durable {durable}, partition now at incarnation {current:?}")
        });
        let now = self.wnow(w);
        self.workers[w].progressed = self.now;
        if t.ran {
            self.workers[w].sched.complete(t.did, now);
        } else if !matches!(t.step, Step::Follow(_)) {
            self.workers[w].sched.release(t.did, now);
        }
        if !durable {
            self.trace.not_durable += 1;
        }
        // The injected bug released a settled job's offset already (`run_end`).
        if !(self.cfg.bugs_commit_before_durable() && t.todo_started) {
            self.release_offset(w, &t.pend, durable);
        }
        self.again_if_not_durable(w, &t.pend, durable);
        // Its followers end as it did (`exec::follow`).
        let followers: Vec<u64> =
            self.workers[w].tasks.iter().filter(|(_, f)| f.step == Step::Follow(task)).map(|(&f, _)| f).collect();
        for f in followers {
            self.end(w, f, durable);
        }
        self.dispatch(w);
    }

    /// `pool::on_done`: a job whose outcome was not durable is taken in again after
    /// `pool::again_after` while its partition stays here (a durable end forgets its count).
    fn again_if_not_durable(&mut self, w: usize, pend: &Pend, durable: bool) {
        let epoch = self.workers[w].epoch;
        let Some(st) = self.workers[w].parts.get_mut(&pend.part).filter(|st| st.incarnation == pend.incarnation) else {
            return; // the partition moved: its next owner reads the job again
        };
        if durable {
            st.again_times.remove(&pend.offset);
            return;
        }
        if self.cfg.bugs_never_again() {
            return;
        }
        let times = st.again_times.entry(pend.offset).or_default();
        *times = times.saturating_add(1);
        let after = crate::worker::pool::again_after(*times).as_millis() as Millis;
        self.log(pend.msg.job, || format!("w{w} holds it {after} ms to take it in again"));
        self.at(self.now + after, Ev::Again { w, epoch, pend: pend.clone() });
    }

    /// The pool loop's `Done`: a durable end finishes the offset (or the spilled row's
    /// bucket); an end reported to an older incarnation of the partition is ignored.
    fn release_offset(&mut self, w: usize, pend: &Pend, durable: bool) {
        let (p, offset, incarnation, spill) = (pend.part, pend.offset, pend.incarnation, pend.spill);
        let tenant = self.shape.jobs[pend.msg.job as usize].tenant;
        let Some(st) = self.workers[w].parts.get_mut(&p).filter(|st| st.incarnation == incarnation) else { return };
        if let Some(bucket) = spill {
            if let Some(b) = st.backlogs.get_mut(&tenant) {
                b.job_done(bucket, durable);
            }
            return;
        }
        if durable {
            st.offsets.finished(offset);
        }
    }
}

pub(super) fn tenant_name(t: u32) -> String {
    format!("t{t}")
}

fn seq_hash(t: Millis, ev: &Ev) -> u64 {
    let tag: u64 = match ev {
        Ev::Submit(j) => 1 + ((*j as u64) << 8),
        Ev::Deliver { part, msg } => 2 + ((*part as u64) << 8) + ((msg.job as u64) << 16),
        Ev::Tick(w) => 3 + ((*w as u64) << 8),
        Ev::Commit(w) => 4 + ((*w as u64) << 8),
        Ev::Store { w, ok, .. } => 5 + ((*w as u64) << 8) + ((*ok as u64) << 16),
        Ev::Produced { w, task, ok, .. } => 6 + ((*w as u64) << 8) + (task << 16) + ((*ok as u64) << 60),
        Ev::RunEnd { w, task, .. } => 7 + ((*w as u64) << 8) + (task << 16),
        Ev::Heartbeat { w, task, .. } => 8 + ((*w as u64) << 8) + (task << 16),
        Ev::Recheck { w, task, .. } => 9 + ((*w as u64) << 8) + (task << 16),
        Ev::Fence { w, task, .. } => 19 + ((*w as u64) << 8) + (task << 16),
        Ev::Crash(w) => 10 + ((*w as u64) << 8),
        Ev::Restart(w) => 11 + ((*w as u64) << 8),
        Ev::CutStart { w, .. } => 12 + ((*w as u64) << 8),
        Ev::CutEnd { w, .. } => 13 + ((*w as u64) << 8),
        Ev::SessionCheck(m) => 14 + ((m.0 as u64) << 8),
        Ev::Rebalance => 15,
        Ev::Again { w, pend, .. } => 16 + ((*w as u64) << 8) + ((pend.msg.job as u64) << 16),
        Ev::Watch => 17,
        Ev::OutageStart => 18,
    };
    (t as u64).rotate_left(17) ^ tag
}
