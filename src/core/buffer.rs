//! A worker pool's in-memory job buffer: the jobs and bytes it holds per tenant, and the
//! rules that keep both bounded. A tenant's new job goes to its spilled backlog
//! (`core::backlog`) instead of memory when its own share is full, by count or by bytes,
//! or when the whole buffer is full and the tenant is not a light one; past twice the
//! whole buffer every partition pauses. So a tenant with maximal payloads spills sooner,
//! by its bytes, and cannot fill a worker's memory for the others.
//!
//! Pure: the worker reports jobs as they enter and leave memory, and asks.

use crate::core::FastMap;

/// The bounds of one worker pool's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferBounds {
    /// A tenant's jobs in memory (`worker.tenant_queue_limit`).
    pub tenant_jobs: usize,
    /// A tenant's bytes in memory.
    pub tenant_bytes: usize,
    /// The whole buffer's jobs and bytes: past either, only light tenants stay in memory;
    /// past twice either, every partition pauses.
    pub total_jobs: usize,
    pub total_bytes: usize,
    /// A tenant with fewer jobs than this and fewer bytes than `light_bytes` in memory is
    /// light: its jobs stay in memory while the whole buffer is full.
    pub light_jobs: usize,
    pub light_bytes: usize,
}

/// Jobs and bytes in memory, per tenant and in total.
#[derive(Debug, Clone, Default)]
pub struct Buffer {
    per_tenant: FastMap<String, Held>,
    total: Held,
}

/// What one tenant (or the whole buffer) holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub jobs: usize,
    pub bytes: usize,
}

impl Buffer {
    /// A job of `bytes` of `tenant` entered memory.
    pub fn entered(&mut self, tenant: &str, bytes: usize) {
        let held = match self.per_tenant.get_mut(tenant) {
            Some(held) => held,
            None => self.per_tenant.entry(tenant.to_string()).or_default(),
        };
        held.jobs += 1;
        held.bytes += bytes;
        self.total.jobs += 1;
        self.total.bytes += bytes;
    }

    /// A job reported by [`Buffer::entered`] with the same `bytes` left memory (started,
    /// expired, its partition revoked). A tenant holding nothing is forgotten.
    pub fn left(&mut self, tenant: &str, bytes: usize) {
        if let Some(held) = self.per_tenant.get_mut(tenant) {
            held.jobs = held.jobs.saturating_sub(1);
            held.bytes = held.bytes.saturating_sub(bytes);
            if held.jobs == 0 {
                self.per_tenant.remove(tenant);
            }
        }
        self.total.jobs = self.total.jobs.saturating_sub(1);
        self.total.bytes = self.total.bytes.saturating_sub(bytes);
    }

    pub fn of(&self, tenant: &str) -> Held {
        self.per_tenant.get(tenant).copied().unwrap_or_default()
    }

    pub fn total(&self) -> Held {
        self.total
    }

    /// Whether `tenant`'s new job of `bytes` must go to its spilled backlog rather than
    /// memory (`backlog_active`: rows of the tenant already wait there, so order inside
    /// the tenant keeps it there).
    pub fn must_spill(&self, b: &BufferBounds, tenant: &str, bytes: usize, backlog_active: bool) -> bool {
        let mine = self.of(tenant);
        let own_full = mine.jobs >= b.tenant_jobs || (mine.jobs > 0 && mine.bytes + bytes > b.tenant_bytes);
        let light = mine.jobs < b.light_jobs && mine.bytes < b.light_bytes;
        backlog_active || own_full || (self.full(b) && !light)
    }

    /// The whole buffer is full (by jobs or bytes): only light tenants' jobs stay in memory.
    pub fn full(&self, b: &BufferBounds) -> bool {
        self.total.jobs >= b.total_jobs || self.total.bytes >= b.total_bytes
    }

    /// Past twice the whole buffer: every partition pauses.
    pub fn over(&self, b: &BufferBounds) -> bool {
        self.total.jobs >= 2 * b.total_jobs || self.total.bytes >= 2 * b.total_bytes
    }

    /// How many of `tenant`'s spilled jobs may be read back now, at most `chunk`: none
    /// unless its share has room for at least half a buffer's worth (or `chunk`) by count
    /// and is under half its bytes, and the whole buffer is not full. By bytes, as many as
    /// fit its share's free bytes at `largest_job` each (the largest of its jobs seen;
    /// 0 if none yet: at most `light_jobs`).
    pub fn read_room(&self, b: &BufferBounds, tenant: &str, chunk: usize, largest_job: usize) -> usize {
        let mine = self.of(tenant);
        if mine.bytes >= b.tenant_bytes / 2 || self.full(b) {
            return 0;
        }
        let room = b.tenant_jobs.saturating_sub(mine.jobs).min(chunk).min(b.total_jobs - self.total.jobs);
        if room < (b.tenant_jobs / 2).clamp(1, chunk) {
            return 0;
        }
        let by_bytes = match largest_job {
            0 => b.light_jobs,
            size => ((b.tenant_bytes - mine.bytes) / size).max(1),
        };
        room.min(by_bytes)
    }

    /// Tenants with jobs in memory.
    pub fn tenants(&self) -> usize {
        self.per_tenant.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const B: BufferBounds = BufferBounds {
        tenant_jobs: 10,
        tenant_bytes: 1_000,
        total_jobs: 30,
        total_bytes: 2_000,
        light_jobs: 3,
        light_bytes: 100,
    };

    #[test]
    fn a_tenant_spills_past_its_jobs_or_its_bytes() {
        let mut buf = Buffer::default();
        for _ in 0..10 {
            assert!(!buf.must_spill(&B, "a", 1, false));
            buf.entered("a", 1);
        }
        assert!(buf.must_spill(&B, "a", 1, false), "10 jobs: its share is full");
        assert!(!buf.must_spill(&B, "b", 1, false), "another tenant is not affected");
        buf.entered("big", 900);
        assert!(buf.must_spill(&B, "big", 200, false), "900 + 200 bytes is over its 1,000");
        assert!(!buf.must_spill(&B, "big", 100, false));
    }

    #[test]
    fn a_job_larger_than_a_share_still_enters_an_empty_share() {
        // It was accepted at the front door; spilling it would only read it back alone.
        let buf = Buffer::default();
        assert!(!buf.must_spill(&B, "a", 5_000, false));
    }

    #[test]
    fn a_full_buffer_by_bytes_spills_all_but_light_tenants() {
        let mut buf = Buffer::default();
        buf.entered("big1", 999);
        buf.entered("big2", 999);
        buf.entered("big3", 10);
        assert!(buf.full(&B), "2,008 of 2,000 bytes");
        assert!(buf.must_spill(&B, "big1", 1, false));
        assert!(!buf.must_spill(&B, "big3", 1, false), "one small job: light");
        assert!(!buf.must_spill(&B, "new", 1, false), "a tenant with nothing in memory is light");
        assert!(!buf.over(&B));
        buf.entered("x", 2_000);
        assert!(buf.over(&B), "past twice the bytes: every partition pauses");
    }

    #[test]
    fn an_active_backlog_keeps_the_tenant_spilling() {
        let buf = Buffer::default();
        assert!(buf.must_spill(&B, "a", 1, true));
    }

    #[test]
    fn reads_back_wait_for_room_by_count_and_bytes() {
        let mut buf = Buffer::default();
        assert_eq!(buf.read_room(&B, "a", 4, 1), 4);
        for _ in 0..7 {
            buf.entered("a", 1);
        }
        assert_eq!(buf.read_room(&B, "a", 4, 1), 0, "3 of 10 free: under half a share");
        let mut buf = Buffer::default();
        buf.entered("a", 600);
        assert_eq!(buf.read_room(&B, "a", 4, 1), 0, "600 of 1,000 bytes: over half");
    }

    #[test]
    fn reads_back_only_what_fits_the_shares_bytes() {
        let mut buf = Buffer::default();
        buf.entered("a", 100);
        assert_eq!(buf.read_room(&B, "a", 8, 300), 3, "900 bytes free at 300 a job");
        assert_eq!(buf.read_room(&B, "a", 8, 5_000), 1, "one job at least, however large");
        assert_eq!(buf.read_room(&B, "a", 8, 0), 3, "sizes unknown: a light tenant's worth");
    }

    proptest! {
        /// Whatever enters and leaves, the totals are the sums of the tenants', and a
        /// tenant that holds nothing is forgotten.
        #[test]
        fn totals_add_up_and_empty_tenants_go(ops in proptest::collection::vec((0usize..5, 0usize..500, any::<bool>()), 1..200)) {
            let mut buf = Buffer::default();
            let mut held: Vec<(String, usize)> = Vec::new();
            for (t, bytes, enter) in ops {
                if enter || held.is_empty() {
                    let tenant = format!("t{t}");
                    buf.entered(&tenant, bytes);
                    held.push((tenant, bytes));
                } else {
                    let (tenant, bytes) = held.swap_remove(bytes % held.len());
                    buf.left(&tenant, bytes);
                }
                let jobs: usize = (0..5).map(|t| buf.of(&format!("t{t}")).jobs).sum();
                let bytes: usize = (0..5).map(|t| buf.of(&format!("t{t}")).bytes).sum();
                prop_assert_eq!(buf.total(), Held { jobs, bytes });
                prop_assert_eq!(buf.total().jobs, held.len());
            }
            for (tenant, bytes) in held.drain(..) {
                buf.left(&tenant, bytes);
            }
            prop_assert_eq!(buf.tenants(), 0);
            prop_assert_eq!(buf.total(), Held::default());
        }
    }
}
