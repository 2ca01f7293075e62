//! A run's shape drawn from its seed: the fleet, the workload (many tenants with a 100x
//! skew, a flood from one tenant, quiet tenants, some long jobs, failures by class) and
//! the faults (worker crashes, store outages, cuts between a worker and the broker or the
//! store, clock skew, tenants' lane counts changing while their jobs are in flight).

use super::rng::Rng;
use crate::model::Millis;

/// What a job does when run (the world's jobs and `fleet`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ok,
    /// Fails with `app_error` on its first n attempts, then succeeds.
    FailsThenOk(u8),
    /// Fails with `app_error` every time: dead-lettered as `app_error` at the limit.
    AlwaysFails,
    /// Fails `permanent`: dead-lettered at once.
    Permanent,
    /// Kills its worker process every time: dead-lettered as `poison` at the crash limit.
    Crash,
}

#[derive(Debug, Clone, Copy)]
pub struct SpecJob {
    pub tenant: u32,
    pub kind: Kind,
    pub dur: Millis,
    pub submit_at: Millis,
}

/// A cut between one worker and the broker (`broker`) or the store, over `[from, to)`.
#[derive(Debug, Clone, Copy)]
pub struct Cut {
    pub worker: usize,
    pub broker: bool,
    pub from: Millis,
    pub to: Millis,
}

#[derive(Debug, Clone)]
pub struct Shape {
    pub workers: usize,
    pub partitions: usize,
    pub slots: usize,
    /// Tenants `0..tenants`; the last `quiet` of them are quiet tenants, tenant 0 floods.
    pub tenants: usize,
    pub quiet: usize,
    pub tenant_queue_limit: usize,
    pub jobs: Vec<SpecJob>,
    /// Faults and submissions happen before the horizon; the run then drains.
    pub horizon: Millis,
    pub drain: Millis,
    pub commit_ms: Millis,
    /// Chance that a produce is slow (200 ms to 1.5 s).
    pub slow_produce: f64,
    pub outages: Vec<(Millis, Millis)>,
    /// (at, worker): a worker process dies.
    pub crashes: Vec<(Millis, usize)>,
    pub cuts: Vec<Cut>,
    /// Each worker's clock offset (ms), within `max_skew`.
    pub skews: Vec<Millis>,
    pub max_skew: Millis,
    pub max_dur: Millis,
    /// Lane changes (at, tenant, lanes), in time order: from `at` on, the tenant's jobs
    /// are placed on that many lanes by `core::lanes` (as a submitter does when the
    /// tenant's rate moves). Empty: every tenant on its few fixed partitions.
    pub lane_changes: Vec<(Millis, u32, u32)>,
}

impl Shape {
    pub fn from_seed(seed: u64) -> Shape {
        let mut r = Rng::new(seed);
        let workers = r.range(2, 4) as usize;
        let partitions = r.range(3, 8) as usize;
        let slots = r.range(3, 8) as usize;
        let quiet = 2;
        let busy = r.range(8, 40) as usize;
        let tenants = busy + quiet;
        let horizon = r.range(20_000, 60_000);
        let mut jobs = Vec::new();
        // Busy tenants: weights falling 100x from tenant 0 to the last busy one.
        let weights: Vec<f64> = (0..busy).map(|i| 100f64.powf(-(i as f64) / (busy.max(2) - 1) as f64)).collect();
        let total: f64 = weights.iter().sum();
        let n = r.range(150, 400);
        for _ in 0..n {
            let mut x = r.unit() * total;
            let mut tenant = 0;
            for (i, w) in weights.iter().enumerate() {
                if x < *w {
                    tenant = i;
                    break;
                }
                x -= w;
            }
            let long = r.chance(0.03);
            let dur = if long { r.range(2_000, 6_000) } else { r.range(5, 150) };
            let kind = draw_kind(&mut r);
            jobs.push(SpecJob { tenant: tenant as u32, kind, dur, submit_at: r.range(0, horizon) });
        }
        // A flood from tenant 0: hundreds of short jobs within a second.
        let flood_at = r.range(0, horizon / 2);
        for _ in 0..r.range(200, 800) {
            let kind = if r.chance(0.97) { Kind::Ok } else { draw_kind(&mut r) };
            jobs.push(SpecJob { tenant: 0, kind, dur: r.range(10, 60), submit_at: flood_at + r.range(0, 1_000) });
        }
        // Quiet tenants: a short job now and then.
        for q in 0..quiet {
            let mut t = r.range(0, 1_000);
            while t < horizon {
                jobs.push(SpecJob { tenant: (busy + q) as u32, kind: Kind::Ok, dur: r.range(5, 20), submit_at: t });
                t += r.range(300, 1_500);
            }
        }
        // A job that kills its worker, sometimes.
        if r.chance(0.3) {
            jobs.push(SpecJob {
                tenant: r.below(busy) as u32,
                kind: Kind::Crash,
                dur: r.range(50, 500),
                submit_at: r.range(0, horizon),
            });
        }
        jobs.sort_by_key(|j| j.submit_at);
        let max_dur = jobs.iter().map(|j| j.dur).max().unwrap_or(0);
        let outages = (0..r.range(0, 2))
            .map(|_| {
                let a = r.range(0, horizon);
                (a, a + r.range(300, 4_000))
            })
            .collect();
        let crashes = (0..r.range(0, 2)).map(|_| (r.range(0, horizon), r.below(workers))).collect();
        let cuts = (0..r.range(0, 2))
            .map(|_| {
                let from = r.range(0, horizon);
                Cut { worker: r.below(workers), broker: r.chance(0.5), from, to: from + r.range(500, 10_000) }
            })
            .collect();
        let max_skew = if r.chance(0.5) { r.range(0, 300) } else { 0 };
        let skews = (0..workers).map(|_| r.range(-max_skew, max_skew)).collect();
        Shape {
            workers,
            partitions,
            slots,
            tenants,
            quiet,
            tenant_queue_limit: r.range(10, 60) as usize,
            jobs,
            horizon,
            drain: 240_000,
            commit_ms: r.range(100, 1_000),
            slow_produce: if r.chance(0.5) { 0.02 } else { 0.0 },
            outages,
            crashes,
            cuts,
            skews,
            max_skew,
            max_dur,
            lane_changes: lane_changes(seed, busy as u32, partitions as u32, horizon),
        }
    }

    /// The tenant's lane count at `at` (None: no lane changes in this run).
    pub fn lanes_at(&self, tenant: u32, at: Millis) -> Option<u32> {
        if self.lane_changes.is_empty() {
            return None;
        }
        let last = self.lane_changes.iter().rfind(|(when, t, _)| *t == tenant && *when <= at);
        Some(last.map_or(1, |(_, _, lanes)| *lanes))
    }

    pub fn is_quiet(&self, tenant: u32) -> bool {
        tenant as usize >= self.tenants - self.quiet
    }

    /// The longest a job can hold a slot outside faults: its run, the check's row read and
    /// running mark, and the settle's produces and state write at their slowest.
    pub fn max_hold(&self) -> Millis {
        self.max_dur + 2 * 400 + 3 * 1_500 + 400
    }
}

/// The lane-change fault, in a third of the seeds, drawn from a stream of its own so the
/// rest of a seed's shape stays as before: the flooder (tenant 0) and a few busy tenants
/// move between one lane and up to every partition several times within the horizon.
fn lane_changes(seed: u64, busy: u32, partitions: u32, horizon: Millis) -> Vec<(Millis, u32, u32)> {
    let mut r = Rng::new(seed ^ 0x1a9e_5c4a_11e5_0001);
    if !r.chance(0.33) {
        return Vec::new();
    }
    let mut changes = Vec::new();
    let others: Vec<u32> = (0..r.range(0, 3)).map(|_| r.below(busy as usize) as u32).collect();
    for tenant in std::iter::once(0).chain(others) {
        for _ in 0..r.range(1, 6) {
            changes.push((r.range(0, horizon), tenant, r.range(1, i64::from(partitions) + 2) as u32));
        }
    }
    changes.sort_unstable();
    changes
}

pub(super) fn draw_kind(r: &mut Rng) -> Kind {
    let x = r.unit();
    if x < 0.86 {
        Kind::Ok
    } else if x < 0.92 {
        Kind::FailsThenOk(r.range(1, 2) as u8)
    } else if x < 0.96 {
        Kind::AlwaysFails
    } else {
        Kind::Permanent
    }
}
