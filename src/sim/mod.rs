//! A deterministic simulation of a fleet of workers: one thread, simulated time, a
//! simulated broker and store, faults and a workload drawn from one `u64` seed, and the
//! invariants checked after every run (docs/simulation.md). A seed replays exactly: the
//! same seed gives the same trace hash.
//!
//! **Real**: every decision a simulated worker makes is the project's own pure code, in
//! the order the real route makes it (`worker::route`, `worker::pool`, `worker::check`,
//! `worker::settle`):
//! 1. intake (`pool::take_in`): the offset is started in `core::offsets::PartitionOffsets`;
//!    `core::buffer::Buffer::must_spill` (with `core::backlog::TenantBacklog::is_active`)
//!    decides spill or memory; a spill is `TenantBacklog::spill`, its acknowledgement
//!    `acked` and the offset `finished`, its failure `failed` and the job stays in memory;
//! 2. the fair scheduler (`core::scheduler::Scheduler`, deficit fair queueing charged in
//!    slot time): `enqueue`, `next`, `complete` / `release`;
//! 3. a copy of a job and attempt whose route is in flight on the same worker follows it
//!    (`exec::InFlight`): its slot goes back, and it ends as that route ends;
//!    check (`check::check_row`): the job's row settles a finished or stale copy, a copy
//!    of a job running on a live worker (this one too) waits, a lapsed heartbeat (the
//!    lease, 3 heartbeats) is a take-over decided by `core::retry::decide(WorkerCrash)`,
//!    but a later attempt than the running row's runs once that lapsed, not as a crash;
//! 4. run, with heartbeats every second;
//! 5. settle (`settle::settle`, `settle::fail`): `core::retry::decide` and
//!    `dead_letter_class`; result before state (`durable::record_terminal`), dead letter
//!    before result; every write must be acknowledged for the outcome to be durable;
//! 6. commit (`pool`): only a durable end finishes the offset (or the spilled row's
//!    bucket, `TenantBacklog::job_done`); an end reported to an older incarnation of the
//!    partition is ignored; what is committable is committed every `commit_ms`, and on
//!    revocation;
//! 7. spilled backlogs: a new owner loads the backlog index (`TenantBacklog::recovered`)
//!    before consuming; reads are `read_room` + `plan_read` / `read_done`; buckets are
//!    dropped when `deletable`.
//!
//! **Simulated** (only the I/O around those decisions): the broker (partitions, a
//! consumer group with round-robin assignment of moved partitions, committed offsets
//! fenced by ownership, redelivery from the committed offset, produce latency with slow
//! tails, a session timeout), the retry relay (a retry copy reappears on its pool
//! partition at its `not_before`), the store (latency, timeouts, outages; rows, heartbeats,
//! spilled rows), worker processes (crash, restart as a new member), clock skew per worker,
//! and a cut between one worker and the broker or the store.
//!
//! **Deliberate simplifications** (each a place the real route is richer): the running
//! row is written at every start (the real route writes it only for jobs outliving a
//! 250 ms grace), so the simulator is stricter about two runs at once than the real
//! route; the dispatch frontier (`core::frontier`) is not simulated, so every copy reads
//! its row; hand-offs at shutdown, cancellation, expiry, generations, breakers, poison
//! detection, the retry budget, delayed jobs held in the worker, and batched spill
//! writes are not simulated; a store call through an outage is retried until it answers
//! (the real check gives up after `durable::OUTAGE_RETRY`). This worker is simulated
//! beside `src/worker/`, not compiled from it. `fleet` (tests and `--features
//! sim-route`) runs the shipping code instead: the real pool loop as a member of
//! `broker`'s in-memory group, the real route and heartbeat loop, over `doubles`.

#[cfg(any(test, feature = "sim-route"))]
pub mod broker;
mod check;
pub mod contract;
pub mod doubles;
#[cfg(any(test, feature = "sim-route"))]
pub mod fleet;
mod ledger;
mod rng;
mod shape;
mod trace;
mod world;

#[cfg(test)]
mod tests;

pub use check::Violation;
pub use shape::{Kind, Shape, SpecJob};
pub use trace::Trace;

use serde::Serialize;

/// Bugs the simulator can inject, to show that it catches them (tests only).
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Bugs {
    /// Release a job's offset for commit when its handler returns, before its outcome is
    /// durable (the ordering `worker::route` forbids).
    pub commit_before_durable: bool,
    /// Never take in again a job whose outcome was not durable (the worker before
    /// `worker::pool::again_after`: its offset held until a restart).
    pub never_again: bool,
    /// Runs never fence themselves (the worker before `worker::liveness::fence_watch`):
    /// a run whose heartbeat lands after a take-over read the older one goes on beside it.
    pub no_fence: bool,
}

/// How to run one seed.
#[derive(Debug, Clone, Default)]
pub struct Config {
    #[cfg(test)]
    pub bugs: Bugs,
    /// Notes every step of this job in the report (`fairway-sim --seed S --watch-job J`).
    pub watch_job: Option<u32>,
}

impl Config {
    /// This config noting every step of `job` in the report.
    pub fn watch(mut self, job: Option<u32>) -> Config {
        self.watch_job = job;
        self
    }

    fn bugs_commit_before_durable(&self) -> bool {
        #[cfg(test)]
        return self.bugs.commit_before_durable;
        #[cfg(not(test))]
        false
    }

    fn bugs_no_fence(&self) -> bool {
        #[cfg(test)]
        return self.bugs.no_fence;
        #[cfg(not(test))]
        false
    }

    fn bugs_never_again(&self) -> bool {
        #[cfg(test)]
        return self.bugs.never_again;
        #[cfg(not(test))]
        false
    }
}

/// What one seed's run did and what it broke.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub seed: u64,
    /// Same seed, same hash: the run replayed event for event.
    pub trace_hash: String,
    pub workers: usize,
    pub partitions: usize,
    pub tenants: usize,
    pub jobs: usize,
    pub results: usize,
    /// Second results of a job within the documented window (its first outcome's state was
    /// not yet written when the copy read the row).
    pub duplicates_in_window: usize,
    /// Runs of a job overlapping another run of it whose running mark was not yet written
    /// when the second copy read the row (the check's read-then-mark window).
    pub overlaps_in_window: usize,
    pub dead_letters: usize,
    pub runs: usize,
    pub crashes: u64,
    /// Jobs taken in again after an outcome that was not durable.
    pub taken_again: u64,
    /// Outcomes dropped at the fence: the job's row showed another run or its end.
    pub fenced: u64,
    /// Runs that fenced themselves: no heartbeat acknowledged for two intervals
    /// (`worker::liveness::fence_watch`).
    pub runs_fenced: u64,
    pub rebalances: u64,
    pub takeovers: usize,
    pub store_outages: usize,
    pub cuts: usize,
    pub spilled: usize,
    pub read_back: usize,
    pub not_durable: u64,
    pub quiet_checked: usize,
    pub quiet_worst_wait_ms: i64,
    pub simulated_ms: i64,
    pub events: u64,
    /// The usage ledger's leader restarts and windows closed over the run's results.
    pub ledger_restarts: usize,
    pub ledger_windows_closed: usize,
    /// `fault/state` -> how many times the fault struck while a job was in that state.
    pub coverage: std::collections::BTreeMap<String, u64>,
    /// The end state of partitions and workers, and anything odd seen on the way.
    pub notes: Vec<String>,
    pub violations: Vec<Violation>,
}

impl Report {
    /// The one-line command that replays this seed.
    pub fn replay_command(&self) -> String {
        format!("cargo run --bin fairway-sim -- --seed {}", self.seed)
    }
}

/// Runs one seed and checks the invariants.
pub fn run(seed: u64, cfg: &Config) -> Report {
    let shape = Shape::from_seed(seed);
    let mut world = world::World::new(cfg.clone(), shape, seed);
    world.run();
    let usage = ledger::tally(&world.shape, &world.trace, seed);
    let violations = check::violations(&world.shape, &world.trace, &usage);
    let (shape, t) = (&world.shape, &world.trace);
    Report {
        seed,
        trace_hash: format!("{:016x}", t.hash),
        workers: shape.workers,
        partitions: shape.partitions,
        tenants: shape.tenants,
        jobs: shape.jobs.len(),
        results: t.results.len(),
        duplicates_in_window: check::duplicates_in_window(t),
        overlaps_in_window: check::overlaps_in_window(t),
        dead_letters: t.dlq.len(),
        runs: t.runs.len(),
        crashes: t.crashes,
        taken_again: t.taken_again,
        fenced: t.fenced,
        runs_fenced: t.runs_fenced,
        rebalances: t.rebalances,
        takeovers: t.takeovers.len(),
        store_outages: shape.outages.len(),
        cuts: shape.cuts.len(),
        spilled: t.spilled,
        read_back: t.read_back,
        not_durable: t.not_durable,
        quiet_checked: t.quiet.len(),
        quiet_worst_wait_ms: t.quiet.iter().map(|q| q.wait).max().unwrap_or(0),
        simulated_ms: t.end,
        events: t.events,
        ledger_restarts: usage.restarts,
        ledger_windows_closed: usage.windows_closed,
        coverage: t.coverage.iter().map(|((f, s), n)| (format!("{f}/{s}"), *n)).collect(),
        notes: t.notes.clone(),
        violations,
    }
}
