//! Resource limits of `process` jobs and the verdict on how a child ended.
//!
//! A job type's `limits` (memory, CPU time, wall time, open files, output size) fall
//! back to its pool's; what the worker enforces them with (cgroup v2 or rlimits plus a
//! memory watchdog) is the executor's business (`handlers::process`). Here: the limits
//! as configured, and the pure mapping from "how the child ended" to success or a
//! failure class with a reason that names the limit and the peak. Exit codes are the
//! job's word (documented in docs/process-jobs.md): 0 success, 65 permanent (sysexits
//! `EX_DATAERR`), 75 dependency (`EX_TEMPFAIL`), anything else an application error.

use super::retry::DurationMs;
use crate::model::FailureClass;
use serde::{Deserialize, Deserializer, Serialize};

/// Exit code a job uses for "retrying cannot help" (bad input): class `permanent`.
pub const EXIT_PERMANENT: i32 = 65;
/// Exit code a job uses for "a dependency failed": class `dependency`.
pub const EXIT_DEPENDENCY: i32 = 75;

/// A size in bytes, written as a number of bytes or a string with a unit: `"512KiB"`,
/// `"256MiB"`, `"1GiB"` (also `KB`/`MB`/`GB`, decimal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Bytes(pub u64);

impl std::str::FromStr for Bytes {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            other => {
                return Err(format!("size {s:?} has unknown unit {other:?}: use B, KiB, MiB or GiB, e.g. \"256MiB\""))
            }
        };
        let n: u64 =
            num.parse().map_err(|_| format!("size {s:?} is not a whole number with a unit, e.g. \"256MiB\""))?;
        n.checked_mul(mult).map(Bytes).ok_or_else(|| format!("size {s:?} is too large"))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Bytes(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.0;
        for (unit, size) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if b >= size && b.is_multiple_of(size) {
                return write!(f, "{}{unit}", b / size);
            }
        }
        if b >= 1 << 20 {
            return write!(f, "{:.1}MiB", b as f64 / (1u64 << 20) as f64);
        }
        write!(f, "{b}B")
    }
}

/// Limits of one attempt of a `process` job (`[job_types.<t>.limits]`, falling back to
/// `[pools.<p>.limits]`); an absent limit is not enforced (output stays capped at
/// `worker.max_payload_bytes` regardless).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Resident memory of the child (its process group).
    pub memory: Option<Bytes>,
    /// CPU time (user + system) of the child.
    pub cpu_time: Option<DurationMs>,
    /// Wall-clock time of the attempt (beside the job type's `timeout`, which is the
    /// attempt's deadline and fails as `timeout`).
    pub wall_time: Option<DurationMs>,
    /// Open file descriptors of the child (`RLIMIT_NOFILE`; the child sees `EMFILE`).
    pub open_files: Option<u64>,
    /// Bytes the child may write to stdout (its output).
    pub output: Option<Bytes>,
    /// Processes and threads of the attempt's whole tree at once (cgroup `pids.max`;
    /// `RLIMIT_NPROC` of the attempt's uid where cgroups are unavailable).
    pub processes: Option<u64>,
    /// CPU bandwidth of the attempt's whole tree, in cores ([`MIN_CPUS`]..=[`MAX_CPUS`]):
    /// the cgroup's CPU quota per period (`cpu.max`, v1 `cpu.cfs_quota_us`). Past it the
    /// tree is throttled, not killed. Not enforced without a cgroup `cpu` controller (the
    /// worker says so at start-up).
    pub cpus: Option<f64>,
}

/// Fewest cores `cpus` may give (a tenth of a millisecond per 100 ms period is the
/// kernel's smallest quota, 1 ms).
pub const MIN_CPUS: f64 = 0.01;
/// Most cores `cpus` may give.
pub const MAX_CPUS: f64 = 1024.0;
/// The CFS period the quota is given for (µs).
pub const CPU_PERIOD_US: u64 = 100_000;

/// The cgroup CPU quota for `cpus` cores, in µs per [`CPU_PERIOD_US`] (`cpus` clamped to
/// its bounds; a value that is not a number gives the least).
pub fn cpu_quota_us(cpus: f64) -> u64 {
    let cpus = if cpus.is_nan() { MIN_CPUS } else { cpus.clamp(MIN_CPUS, MAX_CPUS) };
    (cpus * CPU_PERIOD_US as f64).round() as u64
}

/// Limits every `process` job type gets where neither it nor its pool sets one: a job
/// type with no limits must not be able to take the worker's memory or pid space.
pub const PROCESS_DEFAULTS: Limits = Limits {
    memory: Some(Bytes(512 << 20)),
    cpu_time: None,
    wall_time: None,
    open_files: Some(1024),
    output: None,
    processes: Some(128),
    cpus: Some(1.0),
};

/// Longest control line (fd 3) a child may write; past it the attempt is killed as
/// `resource` (the worker must not buffer a line without end).
pub const CONTROL_LINE_MAX: Bytes = Bytes(64 << 10);

/// The rlimits standing in for the tree limits where the worker has no cgroups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fallback {
    /// `RLIMIT_NPROC` of the attempt's own uid (ignored by the kernel for root).
    pub nproc: Option<u64>,
    /// `RLIMIT_AS` per process: the memory limit times `AS_FACTOR` (address space is
    /// not memory: runtimes reserve far more than they touch, so it only stops the wildest).
    pub address_space: Option<u64>,
}

/// Address space allowed per memory byte under `Fallback`.
pub const AS_FACTOR: u64 = 4;

impl Limits {
    /// These limits, each absent one taken from `fallback` (the pool's).
    pub fn or(self, fallback: Limits) -> Limits {
        Limits {
            memory: self.memory.or(fallback.memory),
            cpu_time: self.cpu_time.or(fallback.cpu_time),
            wall_time: self.wall_time.or(fallback.wall_time),
            open_files: self.open_files.or(fallback.open_files),
            output: self.output.or(fallback.output),
            processes: self.processes.or(fallback.processes),
            cpus: self.cpus.or(fallback.cpus),
        }
    }

    /// The rlimits that stand in for the cgroup limits on a worker without cgroups.
    pub fn fallback(&self) -> Fallback {
        Fallback { nproc: self.processes, address_space: self.memory.map(|m| m.0.saturating_mul(AS_FACTOR)) }
    }

    /// The output cap in force: the `output` limit, never above `max_payload_bytes`
    /// (an output must fit in a result record).
    pub fn output_cap(&self, max_payload_bytes: usize) -> u64 {
        self.output.map_or(max_payload_bytes as u64, |b| b.0.min(max_payload_bytes as u64))
    }

    /// A zero limit would kill every attempt at once: refuse it at start-up.
    pub fn validate(&self) -> Result<(), crate::core::invalid::Invalid> {
        let zero = |what: &str| {
            crate::core::invalid::Invalid::err(what, "= 0 would kill every attempt; set a positive limit or remove it")
        };
        match self {
            Limits { memory: Some(Bytes(0)), .. } => zero("memory"),
            Limits { cpu_time: Some(DurationMs(d)), .. } if *d <= 0 => zero("cpu_time"),
            Limits { wall_time: Some(DurationMs(d)), .. } if *d <= 0 => zero("wall_time"),
            Limits { open_files: Some(0), .. } => zero("open_files"),
            Limits { output: Some(Bytes(0)), .. } => zero("output"),
            Limits { processes: Some(0), .. } => zero("processes"),
            Limits { cpus: Some(c), .. } if !(MIN_CPUS..=MAX_CPUS).contains(c) => crate::core::invalid::Invalid::err(
                "cpus",
                format!("= {c} is outside {MIN_CPUS}..={MAX_CPUS} cores; set the cores the attempt may use at once"),
            ),
            _ => Ok(()),
        }
    }
}

/// A limit the executor saw crossed (and killed the child for), with the peak measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LimitHit {
    Memory {
        limit: Bytes,
        peak: Bytes,
    },
    CpuTime {
        limit: DurationMs,
        used: DurationMs,
    },
    WallTime {
        limit: DurationMs,
    },
    Output {
        limit: Bytes,
    },
    /// The tree asked for more processes than `processes` allows (a fork was refused).
    Processes {
        limit: u64,
    },
    /// A control line longer than `CONTROL_LINE_MAX`.
    Control {
        limit: Bytes,
    },
}

impl LimitHit {
    pub fn name(&self) -> &'static str {
        match self {
            LimitHit::Memory { .. } => "memory",
            LimitHit::CpuTime { .. } => "cpu_time",
            LimitHit::WallTime { .. } => "wall_time",
            LimitHit::Output { .. } => "output",
            LimitHit::Processes { .. } => "processes",
            LimitHit::Control { .. } => "control_line",
        }
    }

    fn reason(&self) -> String {
        match self {
            LimitHit::Memory { limit, peak } => format!("memory limit {limit} exceeded (peak {peak})"),
            LimitHit::CpuTime { limit, used } => format!("cpu_time limit {limit} exceeded (used {used})"),
            LimitHit::WallTime { limit } => format!("wall_time limit {limit} exceeded"),
            LimitHit::Output { limit } => format!("output limit {limit} exceeded (more was written to stdout)"),
            LimitHit::Processes { limit } => format!("processes limit {limit} reached (a fork was refused)"),
            LimitHit::Control { limit } => format!("control line longer than {limit} on fd 3"),
        }
    }
}

/// What the attempt's cgroup counted (None where the worker has no cgroups).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TreeCounts {
    /// Processes the kernel's OOM killer ended in the tree (it was over `memory`).
    pub oom_kills: u64,
    /// Forks refused at `processes`.
    pub forks_refused: u64,
}

/// The limit a tree's counters say was crossed, if any (memory first: an OOM kill
/// also ends processes, a refused fork does not).
pub fn tree_hit(limits: &Limits, counts: TreeCounts, peak: Bytes) -> Option<LimitHit> {
    match (limits.memory, limits.processes) {
        (Some(limit), _) if counts.oom_kills > 0 => Some(LimitHit::Memory { limit, peak }),
        (_, Some(limit)) if counts.forks_refused > 0 => Some(LimitHit::Processes { limit }),
        _ => None,
    }
}

/// How a child ended, as the executor observed it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildEnd {
    /// Exit code, or None if a signal ended it.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// The executor killed it for this limit.
    pub hit: Option<LimitHit>,
    /// CPU time it used (user + system), and its CPU limit if any.
    pub cpu_used: DurationMs,
    pub cpu_limit: Option<DurationMs>,
    pub peak_memory: Bytes,
    /// The last lines of its stderr.
    pub stderr_tail: String,
}

/// What an ended child means for the attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Success,
    /// Failed with `class`; `abnormal`: killed or ended by a signal (counts toward the
    /// tenant's recycling cap, `core::recycling`), not a plain non-zero exit.
    Failed {
        class: FailureClass,
        message: String,
        abnormal: bool,
    },
}

/// SIGKILL and SIGXCPU on Linux (kept here so the core needs no libc).
const SIGKILL: i32 = 9;
const SIGXCPU: i32 = 24;

/// Maps how a child ended to the attempt's outcome.
pub fn verdict(end: &ChildEnd) -> Verdict {
    let tail =
        if end.stderr_tail.trim().is_empty() { String::new() } else { format!("; stderr: {}", end.stderr_tail.trim()) };
    // The kernel enforced RLIMIT_CPU (SIGXCPU at the soft limit, SIGKILL at the hard).
    let cpu_hit = match (end.signal, end.cpu_limit) {
        (Some(SIGXCPU), Some(limit)) => Some(LimitHit::CpuTime { limit, used: end.cpu_used }),
        (Some(SIGKILL), Some(limit)) if end.cpu_used >= limit => Some(LimitHit::CpuTime { limit, used: end.cpu_used }),
        _ => None,
    };
    if let Some(hit) = end.hit.or(cpu_hit) {
        let peak = match hit {
            LimitHit::Memory { .. } => String::new(),
            _ => format!(", peak memory {}", end.peak_memory),
        };
        let message = format!("killed: {}{peak}{tail}", hit.reason());
        return Verdict::Failed { class: FailureClass::Resource, message, abnormal: true };
    }
    match (end.code, end.signal) {
        (Some(0), _) => Verdict::Success,
        (Some(EXIT_PERMANENT), _) => Verdict::Failed {
            class: FailureClass::Permanent,
            message: format!("exit code {EXIT_PERMANENT} (permanent){tail}"),
            abnormal: false,
        },
        (Some(EXIT_DEPENDENCY), _) => Verdict::Failed {
            class: FailureClass::Dependency,
            message: format!("exit code {EXIT_DEPENDENCY} (dependency){tail}"),
            abnormal: false,
        },
        (Some(code), _) => Verdict::Failed {
            class: FailureClass::AppError,
            message: format!("exit code {code}{tail}"),
            abnormal: false,
        },
        (None, sig) => Verdict::Failed {
            class: FailureClass::AppError,
            message: format!("ended by signal {}{tail}", sig.unwrap_or(0)),
            abnormal: true,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quota is cores x the period, within the bounds whatever is asked; a limit out
    /// of them is refused at start-up with the range.
    #[test]
    fn cpus_become_a_bounded_quota_and_bad_ones_are_refused() {
        assert_eq!(cpu_quota_us(1.0), 100_000);
        assert_eq!(cpu_quota_us(0.25), 25_000);
        assert_eq!(cpu_quota_us(0.0), 1_000);
        assert_eq!(cpu_quota_us(f64::NAN), 1_000);
        assert_eq!(cpu_quota_us(f64::INFINITY), 102_400_000);
        for bad in [0.0, 0.001, -1.0, 2048.0, f64::NAN, f64::INFINITY] {
            let l = Limits { cpus: Some(bad), ..Limits::default() };
            assert!(l.validate().is_err(), "{bad}");
        }
        assert!(Limits { cpus: Some(0.5), ..Limits::default() }.validate().is_ok());
        assert_eq!(Limits::default().or(PROCESS_DEFAULTS).cpus, Some(1.0));
    }

    fn end(code: Option<i32>, signal: Option<i32>) -> ChildEnd {
        ChildEnd {
            code,
            signal,
            hit: None,
            cpu_used: DurationMs(10),
            cpu_limit: None,
            peak_memory: Bytes(5 << 20),
            stderr_tail: String::new(),
        }
    }

    #[test]
    fn exit_codes_map_to_classes() {
        assert_eq!(verdict(&end(Some(0), None)), Verdict::Success);
        let class = |c| match verdict(&end(Some(c), None)) {
            Verdict::Failed { class, abnormal: false, .. } => class,
            v => panic!("{v:?}"),
        };
        assert_eq!(class(1), FailureClass::AppError);
        assert_eq!(class(65), FailureClass::Permanent);
        assert_eq!(class(75), FailureClass::Dependency);
        assert!(matches!(
            verdict(&end(None, Some(11))),
            Verdict::Failed { class: FailureClass::AppError, abnormal: true, .. }
        ));
    }

    #[test]
    fn a_limit_kill_is_resource_with_the_limit_and_the_peak() {
        let mut e = end(None, Some(SIGKILL));
        e.hit = Some(LimitHit::Memory { limit: Bytes(64 << 20), peak: Bytes(70 << 20) });
        e.stderr_tail = "allocating\n".into();
        match verdict(&e) {
            Verdict::Failed { class: FailureClass::Resource, message, abnormal: true } => {
                assert!(message.contains("memory limit 64MiB") && message.contains("peak 70MiB"), "{message}");
                assert!(message.ends_with("stderr: allocating"), "{message}");
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn the_kernels_cpu_limit_signals_are_resource() {
        let mut e = end(None, Some(SIGXCPU));
        e.cpu_limit = Some(DurationMs(1_000));
        e.cpu_used = DurationMs(1_000);
        assert!(matches!(verdict(&e), Verdict::Failed { class: FailureClass::Resource, .. }));
        let mut e = end(None, Some(SIGKILL));
        e.cpu_limit = Some(DurationMs(1_000));
        assert!(matches!(verdict(&e), Verdict::Failed { class: FailureClass::AppError, .. }), "under the limit");
    }

    #[test]
    fn tree_counters_name_the_limit_memory_first() {
        let limits = Limits { memory: Some(Bytes(64 << 20)), processes: Some(8), ..Limits::default() };
        let peak = Bytes(64 << 20);
        assert_eq!(tree_hit(&limits, TreeCounts::default(), peak), None);
        let both = TreeCounts { oom_kills: 1, forks_refused: 3 };
        assert_eq!(tree_hit(&limits, both, peak), Some(LimitHit::Memory { limit: Bytes(64 << 20), peak }));
        let forks = TreeCounts { oom_kills: 0, forks_refused: 3 };
        assert_eq!(tree_hit(&limits, forks, peak), Some(LimitHit::Processes { limit: 8 }));
        assert_eq!(tree_hit(&Limits::default(), both, peak), None, "no limit, no hit");
    }

    #[test]
    fn defaults_fill_what_neither_type_nor_pool_sets_and_fallback_rlimits_follow() {
        let l = Limits { memory: Some(Bytes(64 << 20)), ..Limits::default() }.or(PROCESS_DEFAULTS);
        assert_eq!((l.memory, l.processes), (Some(Bytes(64 << 20)), Some(128)));
        assert_eq!(l.fallback(), Fallback { nproc: Some(128), address_space: Some(256 << 20) });
        let m = verdict(&ChildEnd { hit: Some(LimitHit::Control { limit: CONTROL_LINE_MAX }), ..end(None, Some(9)) });
        assert!(
            matches!(m, Verdict::Failed { class: FailureClass::Resource, ref message, .. } if message.contains("64KiB")),
            "{m:?}"
        );
    }

    #[test]
    fn sizes_parse_with_units_and_name_the_fix() {
        assert_eq!("256MiB".parse::<Bytes>().unwrap(), Bytes(256 << 20));
        assert_eq!("1GiB".parse::<Bytes>().unwrap(), Bytes(1 << 30));
        assert_eq!("10MB".parse::<Bytes>().unwrap(), Bytes(10_000_000));
        assert!("5 parsecs".parse::<Bytes>().unwrap_err().contains("MiB"));
        assert_eq!(Bytes(256 << 20).to_string(), "256MiB");
    }

    #[test]
    fn type_limits_fall_back_to_the_pools_and_output_stays_under_the_payload_cap() {
        let pool = Limits { memory: Some(Bytes(1 << 30)), output: Some(Bytes(10)), ..Limits::default() };
        let jt = Limits { memory: Some(Bytes(1 << 20)), ..Limits::default() };
        let l = jt.or(pool);
        assert_eq!(l.memory, Some(Bytes(1 << 20)));
        assert_eq!(l.output_cap(100), 10);
        assert_eq!(Limits::default().output_cap(100), 100);
        assert!(Limits { open_files: Some(0), ..Limits::default() }
            .validate()
            .unwrap_err()
            .to_string()
            .contains("open_files"));
    }
}
