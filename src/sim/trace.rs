//! What a run recorded: the ground truth the invariants are checked against (results and
//! dead letters as the broker holds them, every handler run, take-overs, quiet tenants'
//! waits) and the trace hash that shows a seed replays the same run.

use crate::model::{FailureClass, Millis};
use std::collections::HashMap;

/// How a handler run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Running,
    Succeeded,
    /// The handler returned an error (an attempt used).
    Failed,
    /// The worker process died under it (never an attempt).
    Crashed,
    /// It fenced itself: no heartbeat acknowledged for two intervals (never an attempt).
    Fenced,
}

#[derive(Debug, Clone)]
pub struct RunRec {
    pub job: u32,
    pub worker: usize,
    pub attempt: i32,
    pub start: Millis,
    pub end: Option<Millis>,
    /// The last heartbeat of this run the store took (true time).
    pub last_hb_true: Millis,
    pub outcome: Outcome,
}

/// A run of a job starting while another run of it goes on.
#[derive(Debug, Clone, Copy)]
pub struct Overlap {
    pub job: u32,
    /// The worker already running it, and the one starting it now (`at`).
    pub first: usize,
    pub second: usize,
    pub at: Millis,
    /// The first run's last heartbeat, and when its running mark was written.
    pub last_hb: Millis,
    pub marked: Millis,
    /// When the second copy read the job's row.
    pub checked: Millis,
}

/// A result on the results topic.
#[derive(Debug, Clone)]
pub struct Result_ {
    pub job: u32,
    pub ok: bool,
    pub class: Option<FailureClass>,
    pub attempts: i32,
    pub at: Millis,
    pub worker: usize,
    /// When the copy that produced it read the job's row (the effectively-once check).
    pub checked: Millis,
}

/// A dead letter on the DLQ.
#[derive(Debug, Clone)]
pub struct Dlq {
    pub job: u32,
    pub class: FailureClass,
    pub attempts: i32,
    pub reason_class: FailureClass,
}

/// A quiet tenant's job: its wait for a slot and the bound it must meet.
#[derive(Debug, Clone)]
pub struct QuietWait {
    pub job: u32,
    pub worker: usize,
    pub wait: Millis,
    pub bound: Millis,
}

#[derive(Debug, Default)]
pub struct Trace {
    pub events: u64,
    pub hash: u64,
    pub end: Millis,
    pub submitted: usize,
    pub results: Vec<Result_>,
    pub dlq: Vec<Dlq>,
    /// (job, dead-letter class, reason) as decided.
    pub reasons: Vec<(u32, FailureClass, String)>,
    pub runs: Vec<RunRec>,
    /// (job, taken at, the previous run's last heartbeat (true time), from worker, by worker).
    pub takeovers: Vec<(u32, Millis, Millis, usize, usize)>,
    pub overlaps: Vec<Overlap>,
    /// When each job's row first became terminal.
    pub terminal_at: HashMap<u32, Millis>,
    pub quiet: Vec<QuietWait>,
    pub crashes: u64,
    /// Jobs taken in again after an outcome that was not durable (`worker::pool::again_after`).
    pub taken_again: u64,
    /// Outcomes dropped because the job's row showed another run or its end (`worker::durable`).
    pub fenced: u64,
    /// Runs that fenced themselves (no heartbeat acknowledged for two intervals).
    pub runs_fenced: u64,
    /// What the liveness watch saw stalled (`world::STALL_MS`).
    pub stalls: Vec<String>,
    /// (fault, job state): how many times a fault struck while some job was in that state.
    pub coverage: std::collections::BTreeMap<(&'static str, &'static str), u64>,
    pub rebalances: u64,
    pub spilled: usize,
    pub read_back: usize,
    pub not_durable: u64,
    pub open_spill_rows: usize,
    pub notes: Vec<String>,
}

impl Trace {
    /// Folds an event into the trace hash (FNV-style; order matters).
    pub fn hash(&mut self, x: u64) {
        self.hash = (self.hash ^ x).wrapping_mul(0x0000_0100_0000_01B3).rotate_left(5);
    }
}
