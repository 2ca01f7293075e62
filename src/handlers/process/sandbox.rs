//! The OS side of a `process` job's limits: which enforcement this machine allows, the
//! rlimits set in the child between fork and exec, the control pipe on fd 3, and the
//! memory/CPU readings of a running child from /proc.
//!
//! cgroup v2 needs a delegated subtree with the `memory` and `cpu` controllers; where the
//! worker has none (the common case inside a container) the limits are rlimits
//! (`RLIMIT_CPU`, `RLIMIT_NOFILE`, no core dumps) plus a watchdog that samples the
//! child's resident memory every `WATCH_INTERVAL` and kills its process group past the
//! limit. The mode in force is logged at start-up and shown in `fairway stats`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// How often the watchdog samples a running child (memory, CPU, stop requests).
pub const WATCH_INTERVAL: Duration = Duration::from_millis(50);

/// The file descriptor the child writes its control lines to.
pub const CONTROL_FD: i32 = 3;

/// How this worker enforces `process` limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enforcement {
    /// rlimits + the memory watchdog; `why`: why cgroup v2 is not used.
    Rlimit { why: String },
}

/// Where a delegated cgroup v2 tree would be mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

impl Enforcement {
    /// Looks at this machine once (start-up).
    pub fn detect() -> Enforcement {
        let why = match std::fs::read_to_string(format!("{CGROUP_ROOT}/cgroup.controllers")) {
            Err(_) => format!("{CGROUP_ROOT} is not a cgroup v2 mount (cgroup v1 or hybrid hierarchy)"),
            Ok(c) if !(c.split_whitespace().any(|x| x == "memory") && c.split_whitespace().any(|x| x == "cpu")) => {
                format!("the cgroup v2 tree at {CGROUP_ROOT} does not offer the memory and cpu controllers")
            }
            // Creating and delegating job cgroups is not implemented yet: say so plainly.
            Ok(_) => "cgroup v2 job cgroups are not implemented yet".to_string(),
        };
        Enforcement::Rlimit { why }
    }

    /// This machine's mode, detected once.
    pub fn current() -> &'static Enforcement {
        static CURRENT: std::sync::OnceLock<Enforcement> = std::sync::OnceLock::new();
        CURRENT.get_or_init(Enforcement::detect)
    }

    /// `rlimit` or `cgroup`, for `fairway stats` and the start-up line.
    pub fn name(&self) -> &'static str {
        match self {
            Enforcement::Rlimit { .. } => "rlimit",
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Enforcement::Rlimit { why } => format!(
                "rlimits (cpu_time, open_files) + a memory watchdog sampling every {WATCH_INTERVAL:?}; cgroup v2 not used: {why}"
            ),
        }
    }
}

/// rlimits to set in the child (values prepared before fork: nothing allocates after).
#[derive(Debug, Clone, Copy, Default)]
pub struct ChildLimits {
    /// RLIMIT_CPU soft limit in whole seconds (SIGXCPU), hard one second later (SIGKILL).
    pub cpu_secs: Option<u64>,
    pub open_files: Option<u64>,
}

/// A pipe for the control lines: (read end for the worker, write end for the child).
pub fn control_pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`, which we then own.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Runs in the child between fork and exec: the control pipe on fd 3, the rlimits.
/// Only async-signal-safe calls (dup2, fcntl, setrlimit).
pub fn in_child(control_write: &OwnedFd, limits: ChildLimits) -> std::io::Result<()> {
    let fd = control_write.as_raw_fd();
    let check = |rc: i32| if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) };
    // SAFETY: plain syscalls on descriptors and limits of this (forked) process.
    unsafe {
        if fd == CONTROL_FD {
            check(libc::fcntl(fd, libc::F_SETFD, 0))?;
        } else {
            check(libc::dup2(fd, CONTROL_FD))?;
        }
        let set = |res, soft: u64, hard: u64| {
            let r = libc::rlimit { rlim_cur: soft as libc::rlim_t, rlim_max: hard as libc::rlim_t };
            check(libc::setrlimit(res, &r))
        };
        set(libc::RLIMIT_CORE, 0, 0)?;
        if let Some(s) = limits.cpu_secs {
            set(libc::RLIMIT_CPU, s, s + 1)?;
        }
        if let Some(n) = limits.open_files {
            set(libc::RLIMIT_NOFILE, n, n)?;
        }
    }
    Ok(())
}

/// Sends `signal` to the child's whole process group (it leads its own group).
pub fn signal_group(pgid: u32, signal: i32) {
    // 0 would signal the worker's own process group.
    if pgid == 0 {
        return;
    }
    // SAFETY: kill(2) with a negative pid signals a process group; no memory involved.
    unsafe {
        libc::kill(-(pgid as i32), signal);
    }
}

/// One sample of a running process: resident memory (now and peak) and CPU time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    pub rss_bytes: u64,
    pub hwm_bytes: u64,
    pub cpu_ms: i64,
}

/// Samples `pid` from /proc; None once it is gone.
pub fn sample(pid: u32) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(Sample { rss_bytes: kib("VmRSS:"), hwm_bytes: kib("VmHWM:"), cpu_ms: cpu_ms_of_stat(&stat) })
}

/// utime + stime (fields 14 and 15 of /proc/<pid>/stat, after the parenthesised name).
fn cpu_ms_of_stat(stat: &str) -> i64 {
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    // After the name: field 3 (state) is index 0, so utime (14) is 11 and stime (15) 12.
    (ticks(11) + ticks(12)) * 1000 / hz
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_this_process_and_parses_names_with_spaces() {
        let s = sample(std::process::id()).expect("our own /proc entry");
        assert!(s.rss_bytes > 0 && s.hwm_bytes >= s.rss_bytes, "{s:?}");
        let stat = "42 (a b) c) S 1 1 1 0 -1 0 0 0 0 0 300 200 0 0 20 0 1 0";
        // SAFETY: as above.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        assert_eq!(cpu_ms_of_stat(stat), 500 * 1000 / hz);
    }

    #[test]
    fn this_machine_reports_an_enforcement_with_a_reason() {
        let e = Enforcement::detect();
        assert_eq!(e.name(), "rlimit");
        assert!(e.describe().contains("cgroup v2 not used: "), "{}", e.describe());
    }
}
