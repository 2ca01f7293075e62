//! Who owned which partition when, read back from worker logs: the time each partition
//! of a pool had no owner during a window (a rollout, a broker restart). Pure parsing and
//! interval arithmetic; `bench faults` feeds it the logs of its worker processes.
//!
//! A worker's pool loop logs `partitions assigned ... partitions=[0, 1]` with every
//! partition it owns after the event, `partitions revoked ... partitions={1}` with the
//! ones it lost, and `left the consumer group` when it stops (it owns nothing after).

use std::collections::{BTreeMap, BTreeSet};

/// Milliseconds since the Unix epoch.
pub type Ms = i64;

/// One worker process's ownership changes: (time, partitions owned from then on).
pub type Timeline = Vec<(Ms, BTreeSet<i32>)>;

/// A worker log's ownership changes (lines without a timestamp are skipped). The log
/// must be plain text: `bench faults` starts its workers with `NO_COLOR=1`.
pub fn timeline(log: &str) -> Timeline {
    let mut owned = BTreeSet::new();
    let mut out = Vec::new();
    for line in log.lines() {
        let Some(t) = timestamp(line) else { continue };
        if line.contains("partitions assigned") {
            owned = partitions(line);
        } else if line.contains("partitions revoked") {
            for p in partitions(line) {
                owned.remove(&p);
            }
        } else if line.contains("left the consumer group") {
            owned.clear();
        } else {
            continue;
        }
        out.push((t, owned.clone()));
    }
    out
}

/// The RFC 3339 timestamp a line starts with, in ms.
fn timestamp(line: &str) -> Option<Ms> {
    let first = line.split_whitespace().next()?;
    let t = humantime::parse_rfc3339_weak(first.trim_end_matches('Z')).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as Ms)
}

/// The numbers of the `partitions=` list or set of a line.
fn partitions(line: &str) -> BTreeSet<i32> {
    let Some(rest) = line.split("partitions=").nth(1) else { return BTreeSet::new() };
    let close = rest.find([']', '}']).unwrap_or(rest.len());
    rest[..close].split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse().ok()).collect()
}

/// Per partition of `0..partitions`: time in `[from, to)` when no process owned it (total)
/// and its longest single stretch without an owner, in ms.
pub fn unowned(timelines: &[Timeline], partitions: i32, from: Ms, to: Ms) -> BTreeMap<i32, (Ms, Ms)> {
    let mut out = BTreeMap::new();
    for p in 0..partitions {
        // Ownership intervals of p across processes (a process owns until its next change,
        // or until `to` when it made none).
        let mut intervals: Vec<(Ms, Ms)> = Vec::new();
        for tl in timelines {
            for (i, (t, set)) in tl.iter().enumerate() {
                if set.contains(&p) {
                    let end = tl.get(i + 1).map_or(to, |(next, _)| *next);
                    intervals.push((*t, end));
                }
            }
        }
        intervals.sort_unstable();
        let (mut covered_to, mut total, mut longest) = (from, 0, 0);
        for (s, e) in intervals {
            if e <= covered_to {
                continue;
            }
            if s > covered_to && covered_to < to {
                let gap = s.min(to) - covered_to;
                total += gap;
                longest = longest.max(gap);
            }
            covered_to = covered_to.max(e);
        }
        if covered_to < to {
            total += to - covered_to;
            longest = longest.max(to - covered_to);
        }
        out.insert(p, (total, longest));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
2026-11-27T19:20:00.000000Z  INFO fairway::worker::pool: partitions assigned pool=\"short\" partitions=[0, 1, 2]
2026-11-27T19:20:01.000000Z  INFO fairway::worker::pool: partitions revoked pool=\"short\" partitions={2, 1} dropped=0
2026-11-27T19:20:02.500000Z  INFO fairway::worker::pool: left the consumer group; its partitions move to the other members pool=\"short\"
";

    #[test]
    fn a_log_becomes_the_sets_owned_after_each_change() {
        let tl = timeline(LOG);
        let sets: Vec<Vec<i32>> = tl.iter().map(|(_, s)| s.iter().copied().collect()).collect();
        assert_eq!(sets, vec![vec![0, 1, 2], vec![0], vec![]]);
        assert_eq!(tl[1].0 - tl[0].0, 1000);
        assert_eq!(tl[2].0 - tl[1].0, 1500);
    }

    #[test]
    fn gaps_count_only_where_no_process_owned_the_partition() {
        let t0 = timeline(LOG)[0].0;
        let other: Timeline = vec![(t0 + 1500, [1, 2].into()), (t0 + 3000, [0, 1, 2].into())];
        let gaps = unowned(&[timeline(LOG), other], 3, t0, t0 + 5000);
        assert_eq!(gaps[&0], (500, 500), "0: its owner left at 2.5 s, the other took it at 3 s");
        assert_eq!(gaps[&1], (500, 500), "1: revoked at 1 s, taken at 1.5 s");
        assert_eq!(gaps[&2], (500, 500));
        let none = unowned(&[], 1, 0, 100);
        assert_eq!(none[&0], (100, 100), "never owned: the whole window");
    }
}
