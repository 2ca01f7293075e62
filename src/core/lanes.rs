//! Lanes: how one tenant's jobs spread over a pool topic's partitions.
//!
//! A partition is served by one worker of the pool at a time, so a tenant whose jobs all
//! land on one partition can use one worker however large the fleet. A submitter gives
//! each tenant a number of *lanes* from its recent submission rate ([`LaneMeter`]): one
//! for the long tail, more as the tenant submits faster, up to every partition. A job
//! without an ordering key takes the lane its job id picks; the lanes of a tenant sit
//! evenly spaced round the partitions from its *home* (the partition a record keyed by
//! the tenant alone gets), so `k` lanes reach `k` distinct partitions and, under range or
//! round-robin assignment, as many workers as they can.
//!
//! **Order.** Jobs that share an ordering key go to one fixed partition chosen by the
//! key ([`Lane::Ordered`]): it does not depend on the lane count, so a tenant's lanes
//! can grow and shrink without reordering them (it moves only when the topic's partition
//! count changes, as any Kafka key does). Jobs without one keep no order between lanes;
//! on one lane they are read in submission order, as before.
//!
//! **Placement.** [`partition`] is the rule a submitter applies once it knows the topic's
//! partition count; the record's key ([`key`]) names the lane too, so a producer that
//! could not learn the count and lets the client hash the key still keeps an ordering
//! key's jobs together.

use crate::core::FastMap;

use crate::model::Millis;

/// Most lanes a tenant is given (beyond the partition count lanes share partitions).
pub const MAX_LANES: u32 = 1024;

/// Where a job goes among its tenant's partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// The tenant's home partition: one lane.
    Home,
    /// One of `lanes` lanes spread evenly from the home, chosen by `pick` (the job id's
    /// hash).
    Spread { pick: u32, lanes: u32 },
    /// A fixed partition chosen by an ordering key's hash, whatever the lane count.
    Ordered { hash: u32 },
}

impl Lane {
    /// The lane of a job with id `job_id` when its tenant has `lanes` lanes.
    pub fn of_job(job_id: &str, lanes: u32) -> Lane {
        if lanes <= 1 {
            return Lane::Home;
        }
        Lane::Spread { pick: hash(job_id), lanes: lanes.min(MAX_LANES) }
    }

    /// The lane of a job that carries `ordering_key`.
    pub fn ordered(ordering_key: &str) -> Lane {
        Lane::Ordered { hash: hash(ordering_key) }
    }
}

/// A string's 32-bit hash used for placement: CRC-32 (IEEE), the hash librdkafka's
/// default partitioner applies to a record's key.
fn hash(s: &str) -> u32 {
    crc32fast::hash(s.as_bytes())
}

/// The partition of `lane` of `tenant` on a topic of `partitions` partitions (at least
/// one is assumed): the home is where librdkafka's default partitioner puts a record
/// keyed by the tenant, so producers outside fairway that key by tenant share lane 0.
pub fn partition(tenant: &str, lane: Lane, partitions: u32) -> u32 {
    let p = partitions.max(1);
    let home = hash(tenant) % p;
    let step = match lane {
        Lane::Home => 0,
        Lane::Spread { pick, lanes } => {
            let used = lanes.clamp(1, p);
            let index = pick % used;
            // Evenly spaced: lane i of `used` sits i·p/used partitions from the home.
            (u64::from(index) * u64::from(p) / u64::from(used)) as u32
        }
        Lane::Ordered { hash } => hash % p,
    };
    (home + step) % p
}

/// The record key of a job on `lane`: the tenant alone on its home, `tenant#i` on lane
/// `i`, `tenant~hhhhhhhh` for an ordering key's place.
pub fn key(tenant: &str, lane: Lane) -> std::borrow::Cow<'_, str> {
    match lane {
        Lane::Home => tenant.into(),
        Lane::Spread { lanes, .. } if lanes <= 1 => tenant.into(),
        Lane::Spread { pick, lanes } => format!("{tenant}#{}", pick % lanes).into(),
        Lane::Ordered { hash } => format!("{tenant}~{hash:08x}").into(),
    }
}

/// The number of lanes a submission rate earns: one per `per_lane` jobs a second
/// (rounded up), at least 1 and at most [`MAX_LANES`].
pub fn lanes_for_rate(jobs_per_sec: u64, per_lane: u32) -> u32 {
    let per_lane = u64::from(per_lane.max(1));
    let lanes = jobs_per_sec.div_ceil(per_lane);
    lanes.clamp(1, u64::from(MAX_LANES)) as u32
}

/// A submitter's view of each tenant's recent submission rate, from which its lane
/// count follows: jobs counted in whole-second windows; a tenant's rate is the larger of
/// the current and the previous window's count (a burst spreads at once and keeps its
/// lanes for a second after it ends).
///
/// Bounded: at most `max_tracked` tenants per window. A tenant first seen while a
/// window is full is not counted there and keeps one lane until the next window (counted
/// in `untracked`); memory is at most two windows of `max_tracked` entries.
#[derive(Debug)]
pub struct LaneMeter {
    per_lane: u32,
    max_tracked: usize,
    /// Start of the current window (ms, a multiple of 1,000).
    window: Millis,
    current: FastMap<String, u64>,
    previous: FastMap<String, u64>,
    /// Submissions not counted because the window was full.
    pub untracked: u64,
}

impl LaneMeter {
    /// A meter giving one lane per `per_lane` jobs a second, tracking at most
    /// `max_tracked` tenants per window.
    pub fn new(per_lane: u32, max_tracked: usize) -> Self {
        LaneMeter {
            per_lane: per_lane.max(1),
            max_tracked,
            window: 0,
            current: FastMap::default(),
            previous: FastMap::default(),
            untracked: 0,
        }
    }

    /// Moves the windows on to the one holding `now`.
    fn roll(&mut self, now: Millis) {
        let window = now.div_euclid(1000).saturating_mul(1000);
        if window == self.window {
            return;
        }
        if window == self.window.saturating_add(1000) {
            self.previous = std::mem::take(&mut self.current);
        } else {
            // A clock step back or a quiet gap of more than a window: nothing recent.
            self.previous.clear();
            self.current.clear();
        }
        self.window = window;
    }

    /// Counts `n` submissions of `tenant` at `now`.
    pub fn record(&mut self, tenant: &str, n: u64, now: Millis) {
        self.roll(now);
        if let Some(c) = self.current.get_mut(tenant) {
            *c = c.saturating_add(n);
        } else if self.current.len() < self.max_tracked {
            self.current.insert(tenant.to_string(), n);
        } else {
            self.untracked = self.untracked.saturating_add(n);
        }
    }

    /// The tenant's recent rate (jobs a second).
    pub fn rate(&mut self, tenant: &str, now: Millis) -> u64 {
        self.roll(now);
        let cur = self.current.get(tenant).copied().unwrap_or(0);
        let prev = self.previous.get(tenant).copied().unwrap_or(0);
        cur.max(prev)
    }

    /// The tenant's lane count now.
    pub fn lanes(&mut self, tenant: &str, now: Millis) -> u32 {
        let rate = self.rate(tenant, now);
        lanes_for_rate(rate, self.per_lane)
    }

    /// Tenants counted in the current and previous windows.
    pub fn tracked(&self) -> usize {
        self.current.len() + self.previous.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_home_is_where_librdkafka_puts_a_tenant_keyed_record() {
        // librdkafka's consistent partitioner: crc32(key) % partition count.
        for t in ["acme", "globex", "tenant-00042"] {
            assert_eq!(partition(t, Lane::Home, 6), crc32fast::hash(t.as_bytes()) % 6);
            assert_eq!(key(t, Lane::Home), t);
        }
    }

    #[test]
    fn one_lane_is_the_home() {
        assert_eq!(Lane::of_job("j1", 1), Lane::Home);
        assert_eq!(Lane::of_job("j1", 0), Lane::Home);
        assert_eq!(key("acme", Lane::Spread { pick: 7, lanes: 1 }), "acme");
    }

    #[test]
    fn lanes_grow_with_the_rate_and_are_bounded() {
        assert_eq!(lanes_for_rate(0, 50), 1);
        assert_eq!(lanes_for_rate(50, 50), 1);
        assert_eq!(lanes_for_rate(51, 50), 2);
        assert_eq!(lanes_for_rate(u64::MAX, 1), MAX_LANES);
        assert_eq!(lanes_for_rate(10, 0), 10);
    }

    #[test]
    fn the_meter_spreads_a_burst_at_once_and_keeps_it_a_second() {
        let mut m = LaneMeter::new(50, 100);
        assert_eq!(m.lanes("acme", 10_000), 1);
        m.record("acme", 1_000, 10_100);
        assert_eq!(m.lanes("acme", 10_200), 20);
        // The next window still sees the previous one's count.
        assert_eq!(m.lanes("acme", 11_500), 20);
        // Two windows later the burst is forgotten.
        assert_eq!(m.lanes("acme", 12_000), 1);
        // A long gap clears both windows.
        m.record("acme", 1_000, 20_000);
        assert_eq!(m.lanes("acme", 25_000), 1);
    }

    #[test]
    fn the_meter_is_bounded_in_tenants() {
        let mut m = LaneMeter::new(1, 3);
        for t in 0..10 {
            m.record(&format!("t{t}"), 5, 1_000);
        }
        assert_eq!(m.tracked(), 3);
        assert_eq!(m.untracked, 35);
        assert_eq!(m.lanes("t9", 1_000), 1);
        assert_eq!(m.lanes("t0", 1_000), 5);
    }

    #[test]
    fn a_clock_step_back_forgets_rather_than_panics() {
        let mut m = LaneMeter::new(1, 10);
        m.record("a", 5, i64::MAX);
        assert_eq!(m.lanes("a", i64::MIN), 1);
        m.record("a", 5, i64::MIN);
        assert_eq!(m.lanes("a", i64::MIN), 5);
    }

    proptest! {
        #[test]
        fn prop_k_lanes_reach_k_distinct_partitions(tenant in "[a-z0-9-]{1,20}", p in 1u32..=256, lanes in 1u32..=256) {
            let used = lanes.min(p);
            let parts: std::collections::BTreeSet<u32> =
                (0..lanes).map(|pick| partition(&tenant, Lane::Spread { pick, lanes }, p)).collect();
            prop_assert_eq!(parts.len() as u32, used);
            prop_assert!(parts.iter().all(|&x| x < p));
        }

        #[test]
        fn prop_all_lanes_spread_jobs_evenly(tenant in "[a-z0-9-]{1,20}", p in 1u32..=64) {
            // Every partition gets the same number of picks when the lanes cover them all.
            let mut counts = vec![0u32; p as usize];
            for pick in 0..(p * 10) {
                counts[partition(&tenant, Lane::Spread { pick, lanes: MAX_LANES }, p) as usize] += 1;
            }
            prop_assert!(counts.iter().all(|&c| c == 10), "{:?}", counts);
        }

        #[test]
        fn prop_an_ordering_key_ignores_the_lane_count(tenant in "[a-z0-9-]{1,20}", k in "[ -~]{1,40}", p in 1u32..=128) {
            let lane = Lane::ordered(&k);
            let at = partition(&tenant, lane, p);
            prop_assert!(at < p);
            // The lane carries no count: whatever the tenant's lanes, the same place and key.
            prop_assert_eq!(partition(&tenant, Lane::ordered(&k), p), at);
            prop_assert_eq!(key(&tenant, lane), key(&tenant, Lane::ordered(&k)));
        }
    }
}
