//! A discrete-event simulation of a worker pool on a simulated clock, for the tests.

use super::*;

/// An epoch-like start so that time magnitudes are realistic.
pub(super) const T0: Millis = 1_700_000_000_000;

/// splitmix64: small, deterministic, good enough for workloads.
#[derive(Debug, Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi].
    pub(super) fn range(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        lo + (self.next_u64() % ((hi - lo + 1) as u64)) as i64
    }
    pub(super) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The payload of simulated jobs: what the test needs to know, hidden from the scheduler.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SimJob {
    pub tenant: usize,
    pub seq: u64,
    pub dur: Millis,
    pub priority: Priority,
    pub enqueued_at: Millis,
}

/// A tenant of a backlogged run: its policy and its job types' run-time ranges.
#[derive(Debug, Clone)]
pub(super) struct Flow {
    pub name: String,
    pub policy: TenantPolicy,
    /// Job types as inclusive (min, max) run time in ms.
    pub durs: Vec<(Millis, Millis)>,
    /// Job types are named `<type_prefix>-type<i>`: flows with the same prefix share job
    /// type names (and so cost estimates) although their run times differ.
    pub type_prefix: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub(super) struct Outcome {
    /// Slot-ms received in shared slots within [0, horizon] (jobs clipped to the window).
    pub shared_ms: Vec<f64>,
    pub reserved_ms: Vec<f64>,
    /// Longest time between two dispatches of the tenant (or start/end of the run).
    pub max_gap: Vec<Millis>,
    pub dispatches: Vec<u64>,
    /// Times `next` returned None while a shared slot was free (everyone is eligible).
    pub idle_violations: usize,
    /// Largest cost estimate charged.
    pub max_estimate: f64,
    pub events: u64,
}

/// Runs every flow continuously backlogged (a replacement job is queued at each dispatch)
/// for `horizon` ms.
pub(super) fn run_backlogged(cfg: SchedulerConfig, flows: &[Flow], horizon: Millis, seed: u64) -> Outcome {
    let mut rng = Rng::new(seed);
    let mut s: Scheduler<SimJob> = Scheduler::new(Pool::Medium, cfg).expect("valid config");
    for f in flows {
        s.set_tenant(&f.name, f.policy.clone()).expect("valid tenant");
    }
    let n = flows.len();
    let mut out = Outcome {
        shared_ms: vec![0.0; n],
        reserved_ms: vec![0.0; n],
        max_gap: vec![0; n],
        dispatches: vec![0; n],
        ..Default::default()
    };
    let mut last = vec![T0; n];
    let mut seq = 0u64;
    let mut new_job = |tenant: usize, now: Millis, rng: &mut Rng| -> (String, SimJob) {
        let types = &flows[tenant].durs;
        let ty = rng.range(0, types.len() as i64 - 1) as usize;
        let (lo, hi) = types[ty];
        seq += 1;
        let job = SimJob { tenant, seq, dur: rng.range(lo, hi).max(1), priority: Priority::Normal, enqueued_at: now };
        let prefix = flows[tenant].type_prefix.as_deref().unwrap_or(&flows[tenant].name);
        (format!("{prefix}-type{ty}"), job)
    };
    let end = T0 + horizon;
    let mut now = T0;
    for (i, f) in flows.iter().enumerate() {
        for _ in 0..3 {
            let (ty, job) = new_job(i, now, &mut rng);
            s.enqueue(&f.name, &ty, Priority::Normal, job, now).expect("queue has room");
        }
    }
    let mut running: BinaryHeap<Reverse<(Millis, u64, DispatchId)>> = BinaryHeap::new();
    loop {
        while let Some(d) = s.next(now) {
            out.events += 1;
            let i = d.payload.tenant;
            out.dispatches[i] += 1;
            out.max_gap[i] = out.max_gap[i].max(now - last[i]);
            last[i] = now;
            out.max_estimate = out.max_estimate.max(d.estimated_ms);
            let finish = now + d.payload.dur;
            let inside = (finish.min(end) - now) as f64;
            if d.via == Via::Reserved {
                out.reserved_ms[i] += inside;
            } else {
                out.shared_ms[i] += inside;
            }
            running.push(Reverse((finish, d.payload.seq, d.id)));
            let (ty, job) = new_job(i, now, &mut rng);
            s.enqueue(&flows[i].name, &ty, Priority::Normal, job, now).expect("queue has room");
        }
        if s.shared_free() > 0 {
            out.idle_violations += 1;
        }
        let Some(&Reverse((t, _, _))) = running.peek() else { break };
        let wake = s.next_wakeup(now).unwrap_or(Millis::MAX);
        now = t.min(wake);
        if now > end {
            break;
        }
        while let Some(&Reverse((t, _, id))) = running.peek() {
            if t > now {
                break;
            }
            running.pop();
            s.complete(id, t).expect("running job completes once");
        }
    }
    for (gap, last) in out.max_gap.iter_mut().zip(&last) {
        *gap = (*gap).max(end - last);
    }
    out
}
