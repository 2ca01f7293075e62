//! Micro-benchmarks of the pure cores on the hot path of every job:
//!
//! - `scheduler`: one job's whole life in the fair scheduler (complete the oldest running
//!   job, enqueue a new one, dispatch) with 1000 backlogged tenants, with and without
//!   per-tenant limits (caps, rate limits, enterprise reservations), and with 10,000.
//! - `offsets`: the per-partition commit tracker, started/finished with out-of-order
//!   completion (a sliding window of in-flight jobs, and a whole window finished shuffled).
//! - `codec`: Avro single-object encode/decode of a `JobSubmitted`.
//! - `retry`: the retry decision (retry, dead letter, and with the tenant's budget).
//! - `held`: what the held-work rules cost per tick at 10,000 tenants: the scheduler's
//!   tenants held at their own limits, a worker's held marks, the leader's limit alerts
//!   and alert evaluator, and the quarantined (tenant, job type) pairs.
//! - `early_commit`: what every job's route pays for `worker::early_commit` (its hook,
//!   made as the pool loop makes it, and the task-local scope around the route), beside the
//!   same route future polled bare.
//!
//! `cargo bench --bench cores` (add `-- --quick` for a short run, or a filter such as
//! `-- scheduler`).

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fairway::codec;
use fairway::core::offsets::PartitionOffsets;
use fairway::core::retry::{self, AttemptState, RetryBudget, RetryBudgetConfig, RetryPolicy};
use fairway::core::scheduler::{DispatchId, RateLimit, Scheduler, SchedulerConfig, TenantPolicy, Tier};
use fairway::model::{FailureClass, JobSubmitted, Pool, Priority};
use fairway::worker::early_commit;
use std::collections::VecDeque;

/// Epoch ms of the benchmarks' simulated clock.
const T0: i64 = 1_750_000_000_000;

/// xorshift64*: a deterministic, dependency-free source of shuffles and run times.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ----- scheduler -------------------------------------------------------------------------

/// A short-pool scheduler with `n` tenants (free, free, standard, pro, ...), each with
/// `backlog` jobs queued and every slot busy. With `limits`, every 250th tenant is an
/// enterprise with a reserved slot, every 7th is capped at one running job and every 11th
/// rate limited, like `dispatch_cost_with_1000_tenants` in the scheduler's tests.
/// Closed loop: a finished job's tenant queues a new one, so every tenant stays
/// backlogged with the same depth however long the benchmark runs. The payload is the
/// tenant's index.
struct SchedBench {
    s: Scheduler<u64>,
    names: Vec<String>,
    running: VecDeque<(DispatchId, u64)>,
    now: i64,
    seq: u64,
    rng: Rng,
}

const JOB_TYPES: [&str; 5] = ["resize", "email", "report", "index", "thumb"];

impl SchedBench {
    fn new(n: usize, backlog: usize, limits: bool) -> Self {
        let slots = 64;
        let mut s: Scheduler<u64> =
            Scheduler::new(Pool::Short, SchedulerConfig::for_pool(Pool::Short, slots)).expect("scheduler config");
        let names: Vec<String> = (0..n).map(|i| format!("tenant-{i:04}")).collect();
        for (i, name) in names.iter().enumerate() {
            let mut p = TenantPolicy::tier([Tier::Free, Tier::Free, Tier::Standard, Tier::Pro][i % 4]);
            if limits {
                if i % 250 == 0 {
                    p = TenantPolicy { tier: Tier::Enterprise, reserved_slots: Some(1), ..Default::default() };
                }
                if i % 7 == 0 {
                    p.max_running = Some(1);
                }
                if i % 11 == 0 {
                    p.rate_limit = Some(RateLimit { per_second: 50.0, burst: 2 });
                }
            }
            s.set_tenant(name, p).expect("tenant policy");
        }
        let mut b = SchedBench { s, names, running: VecDeque::new(), now: T0, seq: 0, rng: Rng(0x9e37_79b9_7f4a_7c15) };
        for _ in 0..backlog {
            for i in 0..n {
                b.enqueue(i);
            }
        }
        b.dispatch_all();
        b
    }

    fn enqueue(&mut self, tenant: usize) {
        self.seq += 1;
        let jt = JOB_TYPES[self.seq as usize % JOB_TYPES.len()];
        let prio = Priority::ALL[self.seq as usize % 3];
        self.s.enqueue(&self.names[tenant], jt, prio, tenant as u64, self.now).expect("queue has room");
    }

    fn dispatch_all(&mut self) {
        while let Some(d) = self.s.next(self.now) {
            self.running.push_back((d.id, d.payload));
        }
    }

    /// One job's life: the oldest running job completes (run time 1..300 ms, so the
    /// charge is reconciled), its tenant queues a new job, free slots are filled.
    fn step(&mut self) {
        self.now += 1;
        let tenant = match self.running.pop_front() {
            Some((id, tenant)) => {
                let ran = 1 + self.rng.below(300) as i64;
                black_box(self.s.complete(id, self.now + ran));
                tenant as usize
            }
            None => self.rng.below(self.names.len() as u64) as usize,
        };
        self.enqueue(tenant);
        self.dispatch_all();
    }
}

fn scheduler(c: &mut Criterion) {
    let mut g = c.benchmark_group("scheduler");
    g.throughput(Throughput::Elements(1));
    for (label, n, limits) in
        [("1000_tenants", 1000, false), ("1000_tenants_limits", 1000, true), ("10000_tenants", 10_000, false)]
    {
        let mut b = SchedBench::new(n, 20, limits);
        // Reach a steady state (estimates learned, tags spread) before measuring.
        for _ in 0..50_000 {
            b.step();
        }
        assert!(b.running.len() >= 60, "slots stay busy in steady state ({} running)", b.running.len());
        g.bench_function(format!("enqueue_next_complete/{label}"), |bench| bench.iter(|| b.step()));
    }
    g.finish();
}

// ----- offsets ---------------------------------------------------------------------------

fn offsets(c: &mut Criterion) {
    let mut g = c.benchmark_group("offsets");

    // Steady state: 256 jobs in flight; each step starts the next offset and finishes a
    // random in-flight one (completion order unrelated to offset order).
    g.throughput(Throughput::Elements(1));
    g.bench_function("started_finished/window_256_random_order", |bench| {
        let mut t = PartitionOffsets::new();
        let mut inflight: Vec<i64> = Vec::new();
        let mut next = 0i64;
        let mut rng = Rng(42);
        while inflight.len() < 256 {
            t.started(next).expect("increasing");
            inflight.push(next);
            next += 1;
        }
        bench.iter(|| {
            t.started(next).expect("increasing");
            inflight.push(next);
            next += 1;
            let i = rng.below(inflight.len() as u64) as usize;
            let off = inflight.swap_remove(i);
            black_box(t.finished(off));
        })
    });

    // A whole window: 10 000 offsets started, then finished in a shuffled order.
    let n = 10_000usize;
    let mut order: Vec<i64> = (0..n as i64).collect();
    let mut rng = Rng(7);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("started_finished/10000_shuffled", |bench| {
        bench.iter_batched(
            PartitionOffsets::new,
            |mut t| {
                for o in 0..n as i64 {
                    t.started(o).expect("increasing");
                }
                for &o in &order {
                    black_box(t.finished(o));
                }
                t
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

// ----- codec -----------------------------------------------------------------------------

fn sample_job() -> JobSubmitted {
    JobSubmitted {
        pool: Some(Pool::Short),
        idempotency_key: Some("upload-7f3a9c2e".into()),
        not_after: Some(T0 + 3_600_000),
        ..JobSubmitted::original(
            "0190a5c4-7b1e-7cc2-9a4f-3d2e1f0a9b8c".into(),
            "acme-industries".into(),
            "thumbnail".into(),
            br#"{"bucket":"uploads-eu-west-1","key":"2025/06/14/IMG_20250614_101512.jpg","sizes":[64,256,1024],"format":"webp","quality":82}"#.to_vec(),
            T0,
        )
    }
}

fn codec_bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    g.throughput(Throughput::Elements(1));
    let job = sample_job();
    let bytes = codec::encode_job(&job).expect("encodes");
    assert_eq!(codec::decode_job(&bytes).expect("decodes"), job);
    g.bench_function("encode_job", |b| b.iter(|| codec::encode_job(black_box(&job)).expect("encodes")));
    let mut buf = Vec::with_capacity(bytes.len());
    g.bench_function("encode_job_into_reused_buffer", |b| {
        b.iter(|| {
            buf.clear();
            codec::encode_job_into(black_box(&job), &mut buf).expect("encodes");
        })
    });
    g.bench_function("decode_job", |b| b.iter(|| codec::decode_job(black_box(&bytes)).expect("decodes")));
    g.finish();
}

// ----- retry -----------------------------------------------------------------------------

fn retry_bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("retry");
    g.throughput(Throughput::Elements(1));
    let policy = RetryPolicy::default();
    let first = AttemptState { attempt: 0, crash_count: 0, last_error: Some("HTTP 503 from thumbnailer".into()) };
    let last = AttemptState { attempt: 4, crash_count: 0, last_error: Some("HTTP 503 from thumbnailer".into()) };
    g.bench_function("decide/app_error_retry", |b| {
        b.iter(|| retry::decide(FailureClass::AppError, black_box(&first), &policy, T0, black_box(0.37)))
    });
    g.bench_function("decide/dependency_retry", |b| {
        b.iter(|| retry::decide(FailureClass::Dependency, black_box(&first), &policy, T0, black_box(0.37)))
    });
    g.bench_function("decide/app_error_dead_letter", |b| {
        b.iter(|| retry::decide(FailureClass::AppError, black_box(&last), &policy, T0, black_box(0.37)))
    });
    let mut budget = RetryBudget::new(RetryBudgetConfig::default());
    let mut now = T0;
    g.bench_function("decide_with_budget/app_error", |b| {
        b.iter(|| {
            now += 10;
            budget.record_dispatch("acme", now);
            let failed = retry::Failed { class: FailureClass::AppError, state: &first, policy: &policy };
            retry::decide_with_budget(failed, &mut budget, "acme", now, 0.37)
        })
    });
    g.finish();
}

// ----- lanes -----------------------------------------------------------------------------

/// What placing one submission costs its submitter (`core::lanes`): the meter's count and
/// lane count among 10,000 tenants, and the lane's partition.
fn lanes_bench(c: &mut Criterion) {
    use fairway::core::lanes::{partition, Lane, LaneMeter};
    let mut g = c.benchmark_group("lanes");
    g.throughput(Throughput::Elements(1));
    let tenants: Vec<String> = (0..10_000).map(|i| format!("tenant-{i:05}")).collect();
    let ids: Vec<String> = (0..1_000).map(|i| format!("0190f3c2-7b1e-7c3a-9d4e-{i:012}")).collect();
    let mut meter = LaneMeter::new(50, 20_000);
    let (mut i, mut now) = (0usize, T0);
    g.bench_function("count_and_place/10k_tenants", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            now += 1;
            let tenant = &tenants[i % tenants.len()];
            meter.record(tenant, 1, now);
            let lane = Lane::of_job(&ids[i % ids.len()], meter.lanes(tenant, now));
            partition(black_box(tenant), lane, 12)
        })
    });
    g.finish();
}

// ----- held-work rules at 10,000 tenants -------------------------------------------------

/// What each held-work rule costs per tick with 10,000 tenants: the worker's stats tick
/// (the scheduler's tenants held at their own limits, a held mark per tenant, the
/// quarantined pairs of 10,000 detectors) and the leader's period (limit alerts of
/// 10,000 (tenant, code) pairs, opening and steady; the alert evaluator of 10,000
/// tenants).
fn held_bench(c: &mut Criterion) {
    use fairway::core::alerts::{Evaluator, Settings};
    use fairway::core::poison::{PoisonConfig, PoisonDetectors};
    use fairway::core::refusals::{Class, HourTotals, LimitAlerts, OwnRefusals};
    use fairway::model::{JobResult, JobStatus};
    const N: usize = 10_000;
    let mut g = c.benchmark_group("held");
    g.throughput(Throughput::Elements(N as u64));
    g.sample_size(20);

    // 64 slots: a few capped tenants are held, and every tenant is walked.
    let b = SchedBench::new(N, 5, true);
    assert!(!b.s.held_at_limits(b.now).is_empty(), "capped tenants with a job running are held");
    g.bench_function("scheduler_held_at_limits/10k_tenants", |bench| bench.iter(|| b.s.held_at_limits(b.now)));

    let names: Vec<String> = (0..N).map(|i| format!("tenant-{i:05}")).collect();
    let mut own = OwnRefusals::default();
    g.bench_function("held_marks/10k_tenants", |bench| {
        bench.iter(|| {
            for t in &names {
                let _ = own.record(t, Class::Paying, "held:max_concurrency:short", 1, T0);
            }
        })
    });

    let hour = T0 - T0.rem_euclid(3_600_000);
    let totals: HourTotals = names.iter().map(|t| ((t.clone(), "held:max_concurrency:short".to_string()), 5)).collect();
    let hours = vec![(hour, totals)];
    g.bench_function("limit_alerts_open/10k_pairs", |bench| {
        bench.iter_batched(
            || LimitAlerts::new(N),
            |mut a| a.step(&hours, 5, T0, |_| Class::Paying),
            BatchSize::LargeInput,
        )
    });
    let mut steady = LimitAlerts::new(N);
    steady.step(&hours, 5, T0, |_| Class::Paying);
    g.bench_function("limit_alerts_steady/10k_pairs", |bench| {
        bench.iter(|| steady.step(&hours, 5, T0 + 1_000, |_| Class::Paying))
    });

    let mut eval = Evaluator::new(N, T0);
    for t in &names {
        let r = JobResult {
            job_id: "j".into(),
            tenant: t.clone(),
            job_type: "echo".into(),
            pool: Pool::Short,
            status: JobStatus::Succeeded,
            output: None,
            error: None,
            failure_class: None,
            attempts: 1,
            generation: 0,
            submitted_at: T0,
            started_at: Some(T0 + 20),
            finished_at: T0 + 30,
            worker_id: "w".into(),
            peak_memory_bytes: None,
            cpu_ms: None,
        };
        eval.observe(&r, T0 + 30);
    }
    assert_eq!(eval.tenants(), N);
    g.bench_function("alert_evaluator_period/10k_tenants", |bench| {
        bench.iter_batched(
            || eval.clone(),
            |mut e| e.evaluate(T0 + 60_000, |_| Settings::default()),
            BatchSize::LargeInput,
        )
    });

    let mut poison = PoisonDetectors::new(PoisonConfig::default());
    for t in &names {
        for _ in 0..25 {
            poison.record_tenant_outcome("parse", t, T0, Some(FailureClass::AppError));
        }
    }
    assert_eq!(poison.quarantined_subjects(T0 + 1).len(), N, "every pair quarantined");
    g.bench_function("quarantined_subjects/10k_pairs", |bench| bench.iter(|| poison.quarantined_subjects(T0 + 1)));
    g.finish();
}

/// The per-job price of `worker::early_commit`: a hook holding a sender and the job's place
/// (as `pool::committable_hook` makes it), the route polled inside its scope, and the
/// `told` read after it; beside the bare route (a ready future) polled alone.
fn early_commit_bench(c: &mut Criterion) {
    use futures::FutureExt;
    let mut g = c.benchmark_group("early_commit");
    g.throughput(Throughput::Elements(1));
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel::<(i32, i64, u64)>();
    g.bench_function("bare_route", |b| b.iter(|| async { black_box(1u8) }.now_or_never()));
    g.bench_function("hook_and_scope_per_job", |b| {
        b.iter(|| {
            let (tx, (partition, offset, incarnation)) = (tx.clone(), black_box((3, 1_234_i64, 7_u64)));
            let hook = early_commit::Hook::new(move || {
                let _ = tx.send((partition, offset, incarnation));
            });
            let ended = early_commit::scope(hook.clone(), async { black_box(1u8) }).now_or_never();
            (ended, hook.told())
        })
    });
    g.finish();
}

criterion_group!(benches, scheduler, offsets, codec_bench, retry_bench, lanes_bench, held_bench, early_commit_bench);
criterion_main!(benches);
