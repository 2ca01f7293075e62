//! CPU time of the processes a bench exercises: fairway itself and, where their pid files
//! are visible (the local services started by `scripts/services`), the broker and the CQL
//! database. Read from `/proc/<pid>/stat` (user + system time), so a
//! bench can report CPU seconds per 1,000 jobs for each side.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The processes to watch, by name.
pub struct CpuProbe {
    procs: Vec<(&'static str, u32)>,
    ticks_per_sec: f64,
}

/// CPU seconds used so far, by process name.
pub type CpuSnapshot = BTreeMap<&'static str, f64>;

impl CpuProbe {
    /// fairway (this process) plus the local services whose pid files exist under
    /// `FAIRWAY_SERVICES_DIR` (default `.services` in the working directory).
    pub fn local() -> CpuProbe {
        let dir = std::env::var_os("FAIRWAY_SERVICES_DIR").map(PathBuf::from).unwrap_or_else(|| ".services".into());
        let mut procs = vec![("fairway", std::process::id())];
        for (name, file) in [("broker", "kafka.pid"), ("cql", "cassandra.pid")] {
            let pid = std::fs::read_to_string(dir.join("pids").join(file)).ok().and_then(|s| s.trim().parse().ok());
            if let Some(pid) = pid.filter(|p| cpu_ticks(*p).is_some()) {
                procs.push((name, pid));
            }
        }
        // Linux reports /proc times in USER_HZ, 100 on every mainstream architecture.
        CpuProbe { procs, ticks_per_sec: 100.0 }
    }

    /// Resets the peak resident set (`VmHWM`) of every watched process (`clear_refs` 5;
    /// the services run as this user), so [`CpuProbe::peak_rss_mb`] covers what follows.
    pub fn reset_peak_rss(&self) {
        for (_, pid) in &self.procs {
            let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
        }
    }

    /// Peak resident set (`VmHWM`, MB) of every watched process still running.
    pub fn peak_rss_mb(&self) -> BTreeMap<&'static str, f64> {
        let hwm = |pid: u32| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let kb: f64 = status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()?;
            Some((kb / 1024.0).round())
        };
        self.procs.iter().filter_map(|(name, pid)| hwm(*pid).map(|mb| (*name, mb))).collect()
    }

    pub fn snapshot(&self) -> CpuSnapshot {
        self.procs
            .iter()
            .filter_map(|(name, pid)| cpu_ticks(*pid).map(|t| (*name, t as f64 / self.ticks_per_sec)))
            .collect()
    }
}

/// CPU seconds per 1,000 jobs between two snapshots, by process (3 decimals).
pub fn per_thousand_jobs(before: &CpuSnapshot, after: &CpuSnapshot, jobs: usize) -> BTreeMap<&'static str, f64> {
    after
        .iter()
        .filter_map(|(name, t)| before.get(name).map(|b| (*name, t - b)))
        .map(|(name, used)| (name, (used / jobs.max(1) as f64 * 1000.0 * 1000.0).round() / 1000.0))
        .collect()
}

/// utime + stime of a process, in clock ticks (`None` if it is gone or unreadable).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_ticks(&stat)
}

/// Fields 14 and 15 of `/proc/<pid>/stat`, counted after the command name, which is in
/// parentheses and may itself contain spaces and parentheses.
fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_utime_and_stime_past_an_awkward_name() {
        let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194304 1234 0 0 0 250 75 0 0 20 0 8 0 100 0 0";
        assert_eq!(parse_stat_ticks(stat), Some(325));
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn this_process_is_visible() {
        let probe = CpuProbe::local();
        assert!(probe.snapshot().contains_key("fairway"));
    }

    #[test]
    fn per_thousand() {
        let before: CpuSnapshot = [("fairway", 1.0), ("broker", 2.0)].into_iter().collect();
        let after: CpuSnapshot = [("fairway", 3.0), ("broker", 2.5), ("cql", 9.0)].into_iter().collect();
        let r = per_thousand_jobs(&before, &after, 10_000);
        assert_eq!(r.get("fairway"), Some(&0.2));
        assert_eq!(r.get("broker"), Some(&0.05));
        assert_eq!(r.get("cql"), None);
    }
}
