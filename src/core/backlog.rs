//! Spilled backlogs: the bookkeeping that lets a flooding tenant's excess leave the
//! shared Kafka partition's path. A Kafka partition is a FIFO shared by every tenant that
//! hashes to it; when one tenant's buffer in the worker is full, pausing the partition
//! would stall everyone behind it. Instead the worker *spills* that tenant's further jobs
//! to a per-(partition, tenant) backlog in the store, commits past them once the rows are
//! durable, keeps consuming for everyone else, and reads the rows back in offset order as
//! the tenant's buffer drains, so the flooder keeps its full fair share.
//!
//! This module is the pure part (no I/O): one owner epoch's view of one tenant's backlog
//! on one partition. It decides whether a new message must spill (to keep order inside
//! the tenant), what to read back next, and when a bucket of spilled rows may be deleted.
//!
//! Rows live in buckets of [`BUCKET_SPAN`] offsets (one store partition each). Invariants
//! the worker relies on (unit-tested below):
//! - *No row is skipped*: a read never looks past the lowest spill still in flight, and a
//!   bucket counts as caught up only if no spill reached it while the read was out.
//! - *Order*: while rows wait in the store or in flight, new messages of the tenant spill
//!   too (`is_active`), so they are read back after the older ones.
//! - *At-least-once*: a bucket is deleted only when every row read from it finished with
//!   a durable outcome, no spill can reach it any more (the partition was consumed past
//!   its end) and no read or spill is out.
//!
//! In the store, the spilled jobs of one write to a bucket travel as *packs*: many
//! (offset, job) pairs in one row ([`encode_pack`], [`decode_pack`]), so a flood costs
//! the store one row per write, not one per job.

use std::collections::{BTreeMap, VecDeque};

/// Offsets per bucket: one store partition of spilled rows. After a crash the next owner
/// re-reads the buckets not yet deleted (finished jobs are recognised and skipped), so
/// this also bounds the re-check work per backlog a crash costs beyond the buffer.
pub const BUCKET_SPAN: i64 = 1024;

pub fn bucket_of(offset: i64) -> i64 {
    offset.div_euclid(BUCKET_SPAN)
}

fn bucket_last(bucket: i64) -> i64 {
    (bucket + 1) * BUCKET_SPAN - 1
}

/// Pack format version (first byte of a pack).
const PACK_V1: u8 = 1;

/// Packs spilled jobs `(offset, encoded job)` into one blob: a version byte, then per job
/// its offset (8 bytes) and length (4 bytes, big-endian) and its bytes.
pub fn encode_pack(jobs: &[(i64, &[u8])]) -> Vec<u8> {
    let size = 1 + jobs.iter().map(|(_, j)| 12 + j.len()).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(PACK_V1);
    for (offset, job) in jobs {
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&(job.len() as u32).to_be_bytes());
        out.extend_from_slice(job);
    }
    out
}

/// The jobs of a pack, in the order they were packed; an error names what is wrong.
pub fn decode_pack(pack: &[u8]) -> Result<Vec<(i64, Vec<u8>)>, String> {
    let Some((&version, mut rest)) = pack.split_first() else { return Err("empty backlog pack".into()) };
    if version != PACK_V1 {
        return Err(format!("backlog pack of unknown version {version} (this build reads version {PACK_V1})"));
    }
    let mut jobs = Vec::new();
    while !rest.is_empty() {
        let (head, tail) = rest.split_at_checked(12).ok_or("backlog pack cut inside a job's header")?;
        let offset = i64::from_be_bytes(head[..8].try_into().expect("8 bytes"));
        let len = u32::from_be_bytes(head[8..].try_into().expect("4 bytes")) as usize;
        let (job, tail) = tail.split_at_checked(len).ok_or("backlog pack cut inside a job")?;
        jobs.push((offset, job.to_vec()));
        rest = tail;
    }
    Ok(jobs)
}

#[derive(Debug, Default, Clone)]
struct Bucket {
    /// Rows read back into memory in this epoch.
    loaded: u64,
    /// Of those, ended with a durable outcome.
    done: u64,
    /// Every durable row of the bucket has been read (until a new spill reaches it).
    caught_up: bool,
    /// Spills into this bucket not yet acknowledged.
    in_flight: u64,
    /// Spills into this bucket so far (a read seeing a change knows it may have missed rows).
    spills: u64,
    /// Rows acknowledged in this epoch and not yet read back (stats; recovered rows are unknown).
    unread: u64,
    /// A delete of the bucket is out.
    deleting: bool,
    /// The store may hold rows of it (a spill was acknowledged, or it was recovered).
    has_rows: bool,
}

/// A read of spilled rows to perform: rows of `bucket` with `after < offset < before`,
/// at most `limit`, in offset order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadPlan {
    pub bucket: i64,
    pub after: i64,
    pub before: i64,
    pub limit: usize,
    spills_at_plan: u64,
}

/// One tenant's spilled backlog on one partition, as the partition's current owner sees it.
#[derive(Debug, Clone)]
pub struct TenantBacklog {
    buckets: BTreeMap<i64, Bucket>,
    /// Offsets handed to the spill writer, not yet acknowledged, in offset order.
    in_flight: VecDeque<i64>,
    /// Highest offset read back.
    cursor: i64,
    /// Highest offset handed to the spill writer in this epoch (-1: none).
    spilled_up_to: i64,
    /// Highest offset a row in the store may have: the last spilled, or the end of the
    /// last bucket a previous owner left (-1: none).
    rows_up_to: i64,
    reading: bool,
    /// The largest job seen spilled or read back (bytes; 0: none yet): how many jobs a
    /// read may bring back into the tenant's share of memory (`core::buffer`).
    largest_job: usize,
}

impl Default for TenantBacklog {
    /// Nothing spilled or read yet (offset 0 included: the positions start at -1).
    fn default() -> Self {
        TenantBacklog {
            buckets: BTreeMap::new(),
            in_flight: VecDeque::new(),
            cursor: -1,
            spilled_up_to: -1,
            rows_up_to: -1,
            reading: false,
            largest_job: 0,
        }
    }
}

impl TenantBacklog {
    pub fn new() -> Self {
        TenantBacklog::default()
    }

    /// A backlog found in the store's index when the partition was assigned: its buckets
    /// are read from their start.
    pub fn recovered(buckets: impl IntoIterator<Item = i64>) -> Self {
        let mut b = TenantBacklog::new();
        for bucket in buckets {
            b.buckets.entry(bucket).or_default().has_rows = true;
            b.rows_up_to = b.rows_up_to.max(bucket_last(bucket));
        }
        b
    }

    /// Rows wait in the store or in flight: the tenant's new messages must spill too, or
    /// they would overtake older ones.
    pub fn is_active(&self) -> bool {
        !self.in_flight.is_empty() || self.buckets.values().any(|b| !b.caught_up)
    }

    /// Nothing left to track: no buckets, nothing in flight.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty() && self.in_flight.is_empty()
    }

    /// Jobs of this backlog known to wait outside memory (in flight or acknowledged and
    /// unread in this epoch; rows recovered from a previous owner are not counted).
    pub fn spilled(&self) -> u64 {
        self.in_flight.len() as u64 + self.buckets.values().map(|b| b.unread).sum::<u64>()
    }

    /// Records that `offset` goes to the spill writer; false if the caller must keep the
    /// job in memory instead:
    /// - a read may pass its offset before its row lands, so the row would never be read
    ///   back: the offset is not above every offset this backlog has spilled or read, or a
    ///   read is out and rows may exist above the offset.
    ///   Fresh messages arrive in increasing order and always pass; what is refused is a
    ///   job taken in late (one held until due) or, after a rebalance, a message consumed
    ///   again below rows a previous owner spilled (kept in memory, the effectively-once
    ///   check settles a copy of a job also read back);
    /// - its bucket is being deleted: a write now could race the delete.
    pub fn spill(&mut self, offset: i64) -> bool {
        let passed = offset <= self.cursor.max(self.spilled_up_to);
        if passed || (self.reading && offset <= self.rows_up_to) {
            return false;
        }
        let b = self.buckets.entry(bucket_of(offset)).or_default();
        if b.deleting {
            return false;
        }
        self.spilled_up_to = offset;
        self.rows_up_to = self.rows_up_to.max(offset);
        b.in_flight += 1;
        b.spills += 1;
        b.caught_up = false;
        self.in_flight.push_back(offset);
        true
    }

    /// A job of `bytes` (its `JobSubmitted::heap_bytes`, the buffer's measure) of this
    /// backlog was spilled or read back.
    pub fn saw_job(&mut self, bytes: usize) {
        self.largest_job = self.largest_job.max(bytes);
    }

    /// The largest job seen (0: none yet, e.g. a backlog recovered after a restart).
    pub fn largest_job(&self) -> usize {
        self.largest_job
    }

    fn forget_in_flight(&mut self, offset: i64) -> bool {
        let pos = if self.in_flight.front() == Some(&offset) {
            Some(0)
        } else {
            self.in_flight.iter().position(|&o| o == offset)
        };
        let Some(pos) = pos else { return false };
        self.in_flight.remove(pos);
        if let Some(b) = self.buckets.get_mut(&bucket_of(offset)) {
            b.in_flight = b.in_flight.saturating_sub(1);
        }
        true
    }

    /// The writer made these spills durable.
    pub fn acked(&mut self, offsets: &[i64]) {
        for &o in offsets {
            if self.forget_in_flight(o) {
                if let Some(b) = self.buckets.get_mut(&bucket_of(o)) {
                    b.unread += 1;
                    b.has_rows = true;
                }
            }
        }
    }

    /// The writer could not make these spills durable: the jobs stay in memory instead.
    pub fn failed(&mut self, offsets: &[i64]) {
        for &o in offsets {
            self.forget_in_flight(o);
        }
        self.buckets.retain(|_, b| b.has_rows || b.in_flight > 0);
    }

    /// The next read, if one may go out now with room for `room` jobs in memory.
    pub fn plan_read(&mut self, room: usize) -> Option<ReadPlan> {
        if self.reading || room == 0 {
            return None;
        }
        let before = self.in_flight.front().copied().unwrap_or(i64::MAX);
        let (&bucket, b) = self.buckets.iter().find(|(_, b)| !b.caught_up)?;
        let after = self.cursor.max(bucket * BUCKET_SPAN - 1);
        if !b.has_rows || after + 1 >= before {
            return None; // what follows is still in flight
        }
        self.reading = true;
        Some(ReadPlan { bucket, after, before, limit: room, spills_at_plan: b.spills })
    }

    /// A planned read returned the rows at `offsets` (ascending).
    pub fn read_done(&mut self, plan: &ReadPlan, offsets: &[i64]) {
        self.reading = false;
        if let Some(&last) = offsets.last() {
            self.cursor = self.cursor.max(last);
        }
        let Some(b) = self.buckets.get_mut(&plan.bucket) else { return };
        let n = offsets.len() as u64;
        b.loaded += n;
        b.unread = b.unread.saturating_sub(n);
        let complete = offsets.len() < plan.limit;
        // Caught up only if the read saw the whole bucket: nothing of it was in flight
        // when the read went out, and nothing spilled into it since.
        if complete && plan.before > bucket_last(plan.bucket) && b.spills == plan.spills_at_plan {
            b.caught_up = true;
            b.unread = 0;
        }
    }

    /// A planned read failed; it will be planned again.
    pub fn read_failed(&mut self) {
        self.reading = false;
    }

    /// A job read back from `bucket` ended; `durable` says its outcome is recorded (else
    /// the bucket is kept, and the next owner reads the job again).
    pub fn job_done(&mut self, bucket: i64, durable: bool) {
        if let (Some(b), true) = (self.buckets.get_mut(&bucket), durable) {
            b.done += 1;
        }
    }

    /// Buckets that may be deleted now (each returned once until `delete_failed`): read
    /// to the end, every job from them done, and sealed: consumption passed the bucket's
    /// end (the partition was consumed up to `last_seen`, or a later bucket or row of
    /// this backlog exists), so only a redelivered copy could still reach it.
    pub fn deletable(&mut self, last_seen: i64) -> Vec<i64> {
        let mut out = Vec::new();
        let highest = self.buckets.keys().next_back().copied();
        let cursor = self.cursor;
        // Buckets are read in order: past the first one not caught up, none is.
        for (&bucket, b) in self.buckets.iter_mut() {
            if !b.caught_up {
                break;
            }
            let last = bucket_last(bucket);
            let sealed = last_seen >= last || cursor > last || highest.is_some_and(|h| h > bucket);
            if b.in_flight == 0 && b.done >= b.loaded && !b.deleting && sealed {
                b.deleting = true;
                out.push(bucket);
            }
        }
        out
    }

    pub fn deleted(&mut self, bucket: i64) {
        self.buckets.remove(&bucket);
    }

    pub fn delete_failed(&mut self, bucket: i64) {
        if let Some(b) = self.buckets.get_mut(&bucket) {
            b.deleting = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn spill_read_back_and_delete() {
        let mut t = TenantBacklog::new();
        assert!(!t.is_active());
        for o in [10, 11, 12] {
            assert!(t.spill(o));
        }
        assert!(t.is_active());
        assert_eq!(t.plan_read(100), None, "nothing is durable yet");
        t.acked(&[10, 11, 12]);
        assert_eq!(t.spilled(), 3);
        let p = t.plan_read(100).unwrap();
        assert_eq!((p.bucket, p.after, p.before), (0, -1, i64::MAX));
        assert_eq!(t.plan_read(100), None, "one read at a time");
        t.read_done(&p, &[10, 11, 12]);
        assert!(!t.is_active(), "caught up: new messages go straight to memory");
        assert_eq!(t.spilled(), 0);
        assert!(t.deletable(2000).is_empty(), "jobs not done yet");
        for _ in 0..3 {
            t.job_done(0, true);
        }
        assert!(t.deletable(500).is_empty(), "bucket not sealed: offsets up to 1023 may still spill");
        assert_eq!(t.deletable(1023), vec![0]);
        assert!(t.deletable(1023).is_empty(), "returned once");
        t.deleted(0);
        assert!(t.is_empty());
    }

    #[test]
    fn a_read_never_passes_a_spill_in_flight() {
        let mut t = TenantBacklog::new();
        t.spill(1);
        t.spill(2);
        t.acked(&[1]);
        let p = t.plan_read(10).unwrap();
        assert_eq!(p.before, 2);
        t.read_done(&p, &[1]);
        assert!(t.is_active(), "2 is still in flight");
        t.acked(&[2]);
        let p = t.plan_read(10).unwrap();
        assert_eq!((p.after, p.before), (1, i64::MAX));
        t.read_done(&p, &[2]);
        assert!(!t.is_active());
    }

    #[test]
    fn a_spill_during_a_read_keeps_the_bucket_open() {
        let mut t = TenantBacklog::new();
        t.spill(1);
        t.acked(&[1]);
        let p = t.plan_read(10).unwrap();
        t.spill(5);
        t.acked(&[5]);
        t.read_done(&p, &[1]); // the read ran before 5 landed
        assert!(t.is_active());
        let p = t.plan_read(10).unwrap();
        assert_eq!(p.after, 1);
        t.read_done(&p, &[5]);
        assert!(!t.is_active());
    }

    #[test]
    fn a_full_read_continues_from_its_cursor_across_buckets() {
        let mut t = TenantBacklog::new();
        let offs: Vec<i64> = (1000..1100).collect();
        for &o in &offs {
            t.spill(o);
        }
        t.acked(&offs);
        let p = t.plan_read(24).unwrap();
        assert_eq!(p.bucket, 0);
        t.read_done(&p, &offs[..24]); // 1000..1023: the whole of bucket 0 but the read was full
        let p = t.plan_read(100).unwrap();
        assert_eq!((p.bucket, p.after), (0, 1023));
        t.read_done(&p, &[]);
        let p = t.plan_read(100).unwrap();
        assert_eq!((p.bucket, p.after), (1, 1023));
        t.read_done(&p, &offs[24..]);
        assert!(!t.is_active());
    }

    #[test]
    fn recovered_buckets_are_read_from_their_start() {
        let mut t = TenantBacklog::recovered([3, 5]);
        assert!(t.is_active());
        let p = t.plan_read(10).unwrap();
        assert_eq!((p.bucket, p.after), (3, 3 * BUCKET_SPAN - 1));
        t.read_done(&p, &[3 * BUCKET_SPAN + 7]);
        let p = t.plan_read(10).unwrap();
        assert_eq!((p.bucket, p.after), (5, 5 * BUCKET_SPAN - 1));
    }

    #[test]
    fn a_later_bucket_seals_an_earlier_one_and_a_bucket_being_deleted_takes_no_spill() {
        let mut t = TenantBacklog::recovered([0, 1]);
        let p = t.plan_read(10).unwrap();
        t.read_done(&p, &[5]);
        t.job_done(0, true);
        assert_eq!(t.deletable(-1), vec![0], "bucket 1 exists, so consumption passed bucket 0");
        assert!(!t.spill(7), "a redelivered copy must not be written into a bucket being deleted");
        t.deleted(0);
        assert!(t.spill(8), "once deleted, the bucket may be written again");
        assert!(t.spill(BUCKET_SPAN + 3));
    }

    #[test]
    fn a_new_backlog_takes_offset_zero() {
        assert!(TenantBacklog::default().spill(0));
        assert!(TenantBacklog::new().spill(0));
    }

    #[test]
    fn a_job_taken_in_behind_the_read_stays_in_memory() {
        // A job held until due (taken in long after its offset was consumed) meets a
        // backlog whose read has passed its offset: a row written now is never read back.
        let mut t = TenantBacklog::new();
        for o in [10, 20] {
            assert!(t.spill(o));
        }
        t.acked(&[10, 20]);
        let p = t.plan_read(10).unwrap();
        t.read_done(&p, &[10, 20]);
        assert!(!t.spill(15), "behind the cursor");
        assert!(t.spill(30));
        assert!(!t.spill(25), "behind a spill in flight: a read could pass it before it lands");
        // A previous owner's rows read ahead of this owner's consumption: a message it kept
        // in memory (so no row) consumed again after the read passed it.
        let mut t = TenantBacklog::recovered([0]);
        let p = t.plan_read(10).unwrap();
        t.read_done(&p, &[5, 900]);
        assert!(!t.spill(600), "its row would sit behind the cursor, never read");
        assert!(t.spill(901));
        // The same while the read is still out: it may return rows above the offset.
        let mut t = TenantBacklog::recovered([0]);
        let p = t.plan_read(1).unwrap();
        assert!(!t.spill(0), "the read out may return 339 and pass 0");
        t.read_done(&p, &[339]);
        assert!(t.spill(400), "no read out: the next one stops before 400");
        assert_eq!(t.plan_read(10).unwrap().before, 400);
    }

    #[test]
    fn a_lost_outcome_keeps_the_bucket() {
        let mut t = TenantBacklog::new();
        t.spill(0);
        t.acked(&[0]);
        let p = t.plan_read(10).unwrap();
        t.read_done(&p, &[0]);
        t.job_done(0, false);
        assert!(t.deletable(i64::MAX).is_empty());
    }

    #[test]
    fn a_pack_round_trips_and_a_damaged_one_is_refused() {
        let jobs: Vec<(i64, &[u8])> = vec![(7, b"abc"), (9, b""), (1 << 40, b"xyz!")];
        let pack = encode_pack(&jobs);
        let back = decode_pack(&pack).unwrap();
        assert_eq!(back, jobs.iter().map(|(o, j)| (*o, j.to_vec())).collect::<Vec<_>>());
        assert!(decode_pack(&pack[..pack.len() - 1]).unwrap_err().contains("cut inside a job"));
        assert!(decode_pack(&pack[..5]).unwrap_err().contains("header"));
        assert!(decode_pack(&[9]).unwrap_err().contains("version 9"));
        assert!(decode_pack(&[]).is_err());
        assert_eq!(decode_pack(&encode_pack(&[])).unwrap(), vec![]);
    }

    #[test]
    fn failed_spills_leave_nothing_behind() {
        let mut t = TenantBacklog::new();
        t.spill(0);
        t.spill(1);
        t.failed(&[0, 1]);
        assert!(!t.is_active());
        assert!(t.is_empty());
    }

    /// A backlog beside a model of the store: spills land when acknowledged, a read
    /// returns the rows its plan covers as they were when it went out.
    struct Model {
        t: TenantBacklog,
        store: std::collections::BTreeSet<i64>,
        sent: VecDeque<i64>,
        read: Vec<i64>,
        pending: Option<(ReadPlan, Vec<i64>)>,
    }

    impl Model {
        fn new(t: TenantBacklog, store: std::collections::BTreeSet<i64>) -> Self {
            Model { t, store, sent: VecDeque::new(), read: Vec::new(), pending: None }
        }

        fn rows(&self, p: &ReadPlan) -> Vec<i64> {
            let rows = self.store.range(p.after + 1..p.before).filter(|&&o| bucket_of(o) == p.bucket);
            rows.take(p.limit).copied().collect()
        }

        fn spill(&mut self, offset: i64) -> bool {
            let ok = self.t.spill(offset);
            if ok {
                self.sent.push_back(offset);
            }
            ok
        }

        /// Op 1 acknowledges the `n` oldest spills, 2 sends a read of `n`, 3 returns it.
        fn step(&mut self, op: u8, n: usize) {
            match op {
                1 => {
                    for _ in 0..n.min(self.sent.len()) {
                        let o = self.sent.pop_front().unwrap();
                        self.store.insert(o);
                        self.t.acked(&[o]);
                    }
                }
                2 if self.pending.is_none() => {
                    if let Some(p) = self.t.plan_read(n) {
                        let rows = self.rows(&p); // the read's snapshot
                        self.pending = Some((p, rows));
                    }
                }
                3 => {
                    if let Some((p, rows)) = self.pending.take() {
                        self.t.read_done(&p, &rows);
                        self.read.extend(rows);
                    }
                }
                _ => {}
            }
        }

        /// Everything acknowledged and read to the end.
        fn finish(&mut self) {
            self.step(3, 0);
            self.step(1, usize::MAX);
            let mut guard = 0;
            while let Some(p) = self.t.plan_read(7) {
                let rows = self.rows(&p);
                self.t.read_done(&p, &rows);
                self.read.extend(rows);
                guard += 1;
                assert!(guard < 100_000);
            }
        }
    }

    proptest! {
        /// Whatever the interleaving of spills, acknowledgements, reads and read sizes,
        /// every acknowledged row is read back exactly once, in order, and the backlog
        /// ends inactive once all is read.
        #[test]
        fn every_acked_row_is_read_once_in_order(
            ops in proptest::collection::vec((0u8..4, 1usize..50), 1..200),
            gaps in proptest::collection::vec(1i64..600, 200),
        ) {
            let mut m = Model::new(TenantBacklog::new(), Default::default());
            let (mut next, mut gi) = (0i64, 0);
            for (op, n) in ops {
                if op == 0 {
                    for _ in 0..n.min(5) {
                        next += gaps[gi % gaps.len()];
                        gi += 1;
                        prop_assert!(m.spill(next), "a fresh offset is always taken");
                    }
                }
                m.step(op, n);
            }
            m.finish();
            prop_assert!(!m.t.is_active());
            let all: Vec<i64> = m.store.iter().copied().collect();
            prop_assert_eq!(m.read, all);
        }

        /// Jobs taken in at any offset, in any order (held jobs taken in when due, a
        /// previous owner's rows read ahead of consumption), beside rows recovered from a
        /// previous owner: every offset the backlog accepted is read back, every row is
        /// read once; what it refused stays in the caller's memory.
        #[test]
        fn a_spill_it_accepts_is_never_left_behind_the_read(
            recovered in proptest::collection::btree_set(0i64..3000, 0..20),
            ops in proptest::collection::vec((0u8..4, 0i64..3000, 1usize..50), 1..200),
        ) {
            let buckets: std::collections::BTreeSet<i64> = recovered.iter().map(|&o| bucket_of(o)).collect();
            let mut m = Model::new(TenantBacklog::recovered(buckets), recovered);
            let mut accepted: std::collections::BTreeSet<i64> = Default::default();
            for (op, offset, n) in ops {
                if op == 0 && m.spill(offset) {
                    accepted.insert(offset);
                }
                m.step(op, n);
            }
            m.finish();
            prop_assert!(!m.t.is_active());
            let unique: std::collections::BTreeSet<i64> = m.read.iter().copied().collect();
            prop_assert_eq!(unique.len(), m.read.len(), "a row read twice: {:?}", m.read);
            let missed: Vec<i64> = accepted.difference(&unique).copied().collect();
            prop_assert!(missed.is_empty(), "accepted spills never read back: {:?}", missed);
        }
    }
}
