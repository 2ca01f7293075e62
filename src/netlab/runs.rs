//! Executions of jobs, read from the sleep handler's run log (`FAIRWAY_RUN_LOG`: lines
//! `start|done <job id> <unix ms> <pid>`, appended by every worker process), and the
//! counts a partition scenario reports from them: jobs run more than once, and jobs run
//! by two worker processes at once (overlaps), with how long they overlapped.
//!
//! Pure: the caller reads the file. A run with no `done` line (its worker was killed or
//! gave up, or the job was cancelled) is taken to end `nominal_ms` after its start, the
//! time the job sleeps.

use std::collections::{HashMap, HashSet};

/// One execution: which process ran it, from when until when (unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub pid: u32,
    pub start: i64,
    pub end: i64,
}

/// What the runs of a set of jobs add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunCounts {
    /// Executions started.
    pub executions: u64,
    /// Jobs started more than once.
    pub run_twice: usize,
    /// Jobs run by two processes at once for any time.
    pub overlapping: usize,
    /// Jobs run by two processes at once for longer than the limit given.
    pub overlapping_beyond: usize,
    /// The longest time a job ran on two processes at once (ms).
    pub longest_overlap_ms: i64,
}

/// The runs of each job in `ids`, from the run log's text.
pub fn parse(text: &str, ids: &HashSet<String>, nominal_ms: i64) -> HashMap<String, Vec<Run>> {
    let mut open: HashMap<(&str, u32), Vec<i64>> = HashMap::new();
    let mut runs: HashMap<String, Vec<Run>> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let [phase, id, at, pid] = f[..] else { continue };
        let (Ok(at), Ok(pid)) = (at.parse::<i64>(), pid.parse::<u32>()) else { continue };
        if !ids.contains(id) {
            continue;
        }
        match phase {
            "start" => open.entry((id, pid)).or_default().push(at),
            "done" => {
                let starts = open.entry((id, pid)).or_default();
                if !starts.is_empty() {
                    let start = starts.remove(0);
                    runs.entry(id.to_string()).or_default().push(Run { pid, start, end: at.max(start) });
                }
            }
            _ => {}
        }
    }
    for ((id, pid), starts) in open {
        for start in starts {
            runs.entry(id.to_string()).or_default().push(Run { pid, start, end: start + nominal_ms });
        }
    }
    runs
}

/// Counts executions, re-runs and overlaps between different processes; an overlap
/// counts as beyond when it is longer than `limit_ms`.
pub fn count(runs: &HashMap<String, Vec<Run>>, limit_ms: i64) -> RunCounts {
    let mut c = RunCounts::default();
    for rs in runs.values() {
        c.executions += rs.len() as u64;
        c.run_twice += usize::from(rs.len() > 1);
        let longest = longest_overlap(rs);
        c.overlapping += usize::from(longest > 0);
        c.overlapping_beyond += usize::from(longest > limit_ms);
        c.longest_overlap_ms = c.longest_overlap_ms.max(longest);
    }
    c
}

/// The longest time two runs of different processes overlapped (ms; 0: never).
fn longest_overlap(rs: &[Run]) -> i64 {
    let mut longest = 0;
    for (i, a) in rs.iter().enumerate() {
        for b in rs[i + 1..].iter().filter(|b| b.pid != a.pid) {
            longest = longest.max(a.end.min(b.end) - a.start.max(b.start));
        }
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> HashSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn runs_pair_starts_with_dones_per_process_and_open_runs_last_the_nominal_time() {
        let text =
            "start a 1000 7\nstart a 1100 8\ndone a 1300 7\nstart b 5000 7\ndone b 5300 7\nstart x 1 7\nbroken line\n";
        let runs = parse(text, &ids(&["a", "b"]), 300);
        let mut a = runs["a"].clone();
        a.sort_by_key(|r| r.start);
        assert_eq!(a, vec![Run { pid: 7, start: 1000, end: 1300 }, Run { pid: 8, start: 1100, end: 1400 }]);
        assert_eq!(runs["b"], vec![Run { pid: 7, start: 5000, end: 5300 }]);
        assert!(!runs.contains_key("x"), "jobs of other runs are not counted");
    }

    #[test]
    fn overlaps_count_only_runs_of_different_processes_at_once() {
        let mut runs = HashMap::new();
        // Run twice by two processes, one after the other: no overlap.
        runs.insert("seq".into(), vec![Run { pid: 1, start: 0, end: 100 }, Run { pid: 2, start: 100, end: 200 }]);
        // Two processes at once for 50 ms.
        runs.insert("short".into(), vec![Run { pid: 1, start: 0, end: 100 }, Run { pid: 2, start: 50, end: 300 }]);
        // Two processes at once for 20 s.
        runs.insert(
            "long".into(),
            vec![Run { pid: 1, start: 0, end: 30_000 }, Run { pid: 2, start: 10_000, end: 40_000 }],
        );
        // The same process twice (a retry) never counts as an overlap.
        runs.insert("retry".into(), vec![Run { pid: 3, start: 0, end: 100 }, Run { pid: 3, start: 50, end: 150 }]);
        runs.insert("once".into(), vec![Run { pid: 1, start: 0, end: 100 }]);
        let c = count(&runs, 15_000);
        assert_eq!(
            c,
            RunCounts {
                executions: 9,
                run_twice: 4,
                overlapping: 2,
                overlapping_beyond: 1,
                longest_overlap_ms: 20_000
            }
        );
    }
}
