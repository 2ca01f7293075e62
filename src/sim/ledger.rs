//! The usage ledger over a fleet seed's results topic (`fleet`): the leader of
//! `crate::ledger` simulated after the run, with `core::ledger`'s own rules
//! (`PartitionTally`, `of_result`). Results land on the results topic's partitions in the
//! order the broker acknowledged them, at their `finished_at` (moved so that a window
//! boundary falls inside the run); the leader
//! tallies each one as it lands, writes the changed totals every `ledger::FLUSH` and
//! whenever a window closes (blocking until the store takes it, as the real leader does),
//! then its resume position; it crashes at times drawn from the seed and the next leader
//! starts again from the stored positions. Stored rows keep the longest prefix's totals
//! (a row is written with its prefix's end as its timestamp). The store is down during
//! the run's outages. The per-tenant totals read back from the rows are what the
//! `usage` invariant checks ([`usage_violations`]): every result on the topic counted
//! once, through leader crashes and store outages.

use super::rng::Rng;
use crate::core::ledger::{self, Account, Flush, PartitionTally, Usage};
use crate::model::{JobResult, Millis};
use std::collections::BTreeMap;

/// Partitions of the simulated results topic.
const PARTITIONS: usize = 3;
/// The leader's flush period (`ledger::FLUSH`).
const FLUSH_MS: Millis = 5_000;
/// The leader's loop, in steps of simulated time.
const STEP_MS: Millis = 50;

/// What the ledger counted, per tenant, and what its leader went through.
#[derive(Debug, Default)]
pub struct Tally {
    pub by_tenant: BTreeMap<String, Usage>,
    pub restarts: usize,
    pub windows_closed: usize,
    pub flushes_failed: usize,
}

/// A stored ledger row: the totals of the longest prefix written (its end, `upto`).
type Rows = BTreeMap<(Account, Millis, usize), (i64, Usage)>;

struct Leader {
    alive: bool,
    tallies: Vec<PartitionTally>,
    /// A closed window's totals the store has not taken yet: the leader waits on it.
    blocked: Option<(usize, Flush)>,
}

/// Runs the ledger's leader over the run's results (in the order the broker took them;
/// times from the run's start) and returns what its rows add up to. `outages`: when the
/// store was down (ms from the run's start).
pub fn tally(results: &[JobResult], start: Millis, outages: &[(Millis, Millis)], seed: u64) -> Tally {
    let mut rng = Rng::new(seed.wrapping_mul(0x9E37_79B9).wrapping_add(11));
    let horizon = results.iter().map(|r| r.finished_at - start).max().unwrap_or(0).max(1);
    // Timestamps from an epoch that puts a window boundary inside the run.
    let epoch = ledger::WINDOW_MS * 1_000 - rng.range(0, horizon);
    let mut logs: Vec<Vec<(Millis, JobResult)>> = vec![Vec::new(); PARTITIONS];
    for (i, r) in results.iter().enumerate() {
        let at = (r.finished_at - start).max(0);
        let mut moved = r.clone();
        moved.finished_at = epoch + at;
        moved.submitted_at = epoch + (r.submitted_at - start);
        logs[i % PARTITIONS].push((at, moved));
    }
    // The latest landing of all (a partition's log is in the broker's order, its times
    // not: workers' clocks differ).
    let end = logs.iter().flatten().map(|(at, _)| *at).max().unwrap_or(0);
    let crashes: Vec<(Millis, Millis)> = (0..rng.range(0, 3))
        .map(|_| {
            let at = rng.range(0, end.max(1));
            (at, at + rng.range(1_000, 20_000))
        })
        .collect();
    let down = |at: Millis| outages.iter().any(|&(a, b)| a <= at && at < b);
    let mut rows: Rows = BTreeMap::new();
    let mut positions: Vec<Option<i64>> = vec![None; PARTITIONS];
    let mut out = Tally::default();
    let mut leader = Leader { alive: false, tallies: Vec::new(), blocked: None };
    let mut now = 0;
    // Run until every crash and outage is over and a flush has followed: a leader that
    // crashed during an outage comes back only once the store answers (seed 79664: an
    // outage past the crashes' end kept the leader down at the end, its counts unwritten).
    let calm = crashes.iter().map(|c| c.1).chain(outages.iter().map(|o| o.1)).max().unwrap_or(0);
    let last = end.max(calm) + FLUSH_MS;
    while now <= last {
        let crashed = crashes.iter().any(|&(a, b)| a <= now && now < b);
        if crashed && leader.alive {
            leader = Leader { alive: false, tallies: Vec::new(), blocked: None };
        }
        if !crashed && !leader.alive && !down(now) {
            // A new leader: every partition from its recorded window start.
            out.restarts += 1;
            let tallies = positions.iter().map(|p| PartitionTally::starting_at(p.unwrap_or(0))).collect();
            leader = Leader { alive: true, tallies, blocked: None };
        }
        if leader.alive {
            step(&mut leader, &logs, now, down(now), &mut rows, &mut out);
            if now % FLUSH_MS == 0 {
                flush_all(&mut leader, &mut positions, down(now), &mut rows, &mut out);
            }
        }
        now += STEP_MS;
    }
    // Stopping: the last flush (the store is up by then).
    if leader.alive {
        step(&mut leader, &logs, Millis::MAX, false, &mut rows, &mut out);
        flush_all(&mut leader, &mut positions, false, &mut rows, &mut out);
    }
    out.restarts = out.restarts.saturating_sub(1); // the first leader is not a restart
    for ((acc, _, _), (_, u)) in rows {
        out.by_tenant.entry(acc.tenant).or_default().add(&u);
    }
    out
}

/// Feeds every record landed by `now`, writing a closed window's totals before going on.
fn step(
    leader: &mut Leader,
    logs: &[Vec<(Millis, JobResult)>],
    now: Millis,
    down: bool,
    rows: &mut Rows,
    out: &mut Tally,
) {
    if let Some((part, f)) = leader.blocked.take() {
        if down {
            leader.blocked = Some((part, f));
            return;
        }
        write(rows, part, &f);
    }
    for (part, log) in logs.iter().enumerate() {
        loop {
            let tally = &mut leader.tallies[part];
            let next = tally.next();
            let Some((_, r)) = log.get(next as usize).filter(|(at, _)| *at <= now) else { break };
            let Some(closed) = tally.observe(next, r.finished_at, Some(r)) else { continue };
            out.windows_closed += 1;
            if down {
                leader.blocked = Some((part, closed));
                return;
            }
            write(rows, part, &closed);
        }
    }
}

/// Writes every partition's changed totals, then its position (`ledger::Leader::flush_all`).
fn flush_all(leader: &mut Leader, positions: &mut [Option<i64>], down: bool, rows: &mut Rows, out: &mut Tally) {
    if leader.blocked.is_some() {
        return; // the real leader is awaiting the closed window's write
    }
    for (part, tally) in leader.tallies.iter_mut().enumerate() {
        if let Some(f) = tally.pending() {
            if down {
                out.flushes_failed += 1;
                tally.unflushed(f);
                continue;
            }
            write(rows, part, &f);
        }
        if !down {
            positions[part] = Some(tally.resume_point().1);
        }
    }
}

/// A flush's rows, each kept only if its prefix is at least as long as the stored one's.
fn write(rows: &mut Rows, part: usize, f: &Flush) {
    for (acc, u) in &f.rows {
        let row = rows.entry((acc.clone(), f.window, part)).or_insert((i64::MIN, Usage::default()));
        if f.upto >= row.0 {
            *row = (f.upto, *u);
        }
    }
}

/// Per tenant, what the ledger counted against the results on the topic: each result
/// counted once (results, successes, failures, attempts).
pub fn usage_violations(results: &[JobResult], ledger: &Tally) -> Vec<String> {
    let mut on_topic: BTreeMap<String, [i64; 4]> = BTreeMap::new();
    for r in results {
        let b = on_topic.entry(r.tenant.clone()).or_default();
        let ok = r.status == crate::model::JobStatus::Succeeded;
        b[0] += 1;
        b[1] += i64::from(ok);
        b[2] += i64::from(!ok);
        b[3] += i64::from(r.attempts.max(0));
    }
    let mut out = Vec::new();
    for (tenant, topic) in &on_topic {
        let c = ledger.by_tenant.get(tenant).copied().unwrap_or_default();
        let got = [c.results, c.succeeded, c.failed, c.attempts];
        if &got != topic {
            out.push(format!(
                "usage: tenant {tenant}: the ledger counted (results, succeeded, failed, attempts) {got:?}, the topic holds {topic:?}"
            ));
        }
    }
    for tenant in ledger.by_tenant.keys().filter(|t| !on_topic.contains_key(*t)) {
        out.push(format!("usage: tenant {tenant}: the ledger counted results it has none of on the topic"));
    }
    out
}
