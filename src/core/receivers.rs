//! Webhook receivers' lanes, the pure accounting: each (tenant, receiver) pair (the
//! result's tenant and its callback URL) has its own queue of results waiting for or in
//! delivery, bounded per lane and in total. A receiver that is down keeps its
//! deliveries in backoff in its lanes; beyond a lane's bound its new results are given
//! up at once (a `webhook_failed` event says so), so it never holds the results of
//! other receivers, and one tenant flooding a receiver (its own or one another tenant's
//! results also go to) fills only its own lane there. Past the total bound the delivery
//! loop stops reading results until deliveries finish. Concurrency per lane and in total
//! is the shell's (`watch::webhooks`), sized by the same settings.

use std::collections::HashMap;

/// The bounds of the lanes (`[webhooks]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneBounds {
    /// Results queued or in delivery per (tenant, receiver) lane
    /// (`webhooks.queue_per_receiver`).
    pub per_receiver: usize,
    /// Results queued or in delivery in total (`webhooks.queue_total`).
    pub total: usize,
}

/// What to do with a result for a receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Queued in its receiver's lane: deliver it, then call [`Lanes::done`].
    Queued,
    /// The receiver's lane is full: give the result up (not counted).
    ReceiverFull,
}

/// A lane: (tenant, receiver URL).
pub type LaneKey = (String, String);

/// The lane of `tenant`'s results to `url`.
pub fn lane(tenant: &str, url: &str) -> LaneKey {
    (tenant.to_string(), url.to_string())
}

/// Results queued or in delivery, per lane and in total.
#[derive(Debug, Clone)]
pub struct Lanes {
    bounds: LaneBounds,
    pending: HashMap<LaneKey, usize>,
    total: usize,
}

impl Lanes {
    pub fn new(bounds: LaneBounds) -> Self {
        Lanes { bounds, pending: HashMap::new(), total: 0 }
    }

    /// Whether the loop may read another result (the total bound has room).
    pub fn accepting(&self) -> bool {
        self.total < self.bounds.total
    }

    /// A result for the lane `key` was read.
    pub fn admit(&mut self, key: &LaneKey) -> Admit {
        let n = self.pending.entry(key.clone()).or_default();
        if *n >= self.bounds.per_receiver {
            return Admit::ReceiverFull;
        }
        *n += 1;
        self.total += 1;
        Admit::Queued
    }

    /// A queued result's delivery ended (delivered, refused, out of attempts or stopped).
    pub fn done(&mut self, key: &LaneKey) {
        if let Some(n) = self.pending.get_mut(key) {
            *n = n.saturating_sub(1);
            self.total = self.total.saturating_sub(1);
            if *n == 0 {
                self.pending.remove(key);
            }
        }
    }

    /// Results queued or in delivery in the lane `key`.
    pub fn pending(&self, key: &LaneKey) -> usize {
        self.pending.get(key).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dead receiver fills its own lane and no more: another receiver's results are
    /// still queued, and the loop keeps reading while the total has room.
    #[test]
    fn a_dead_receiver_fills_only_its_own_lane() {
        let mut l = Lanes::new(LaneBounds { per_receiver: 3, total: 5 });
        let (dead, live) = (lane("a", "http://dead"), lane("a", "http://live"));
        for _ in 0..3 {
            assert_eq!(l.admit(&dead), Admit::Queued);
        }
        assert_eq!(l.admit(&dead), Admit::ReceiverFull);
        assert_eq!(l.pending(&dead), 3);
        assert!(l.accepting(), "the dead receiver's lane is full, the loop is not");
        assert_eq!(l.admit(&live), Admit::Queued);
        assert_eq!(l.admit(&live), Admit::Queued);
        assert!(!l.accepting(), "the total bound stops reading");
        l.done(&live);
        assert!(l.accepting());
        l.done(&dead);
        assert_eq!(l.admit(&dead), Admit::Queued);
        assert_eq!(l.total(), 4);
        for _ in 0..3 {
            l.done(&dead);
        }
        l.done(&live);
        l.done(&lane("a", "http://never-seen"));
        assert_eq!((l.total(), l.pending(&dead)), (0, 0));
    }

    /// Tenant a floods the receiver tenant b's results go to: a's lane there fills, b's
    /// results to the same URL are still queued (per URL they were refused).
    #[test]
    fn one_tenant_flooding_a_receiver_leaves_another_tenants_lane_there_open() {
        let mut l = Lanes::new(LaneBounds { per_receiver: 2, total: 100 });
        let url = "http://b.example/hooks";
        for _ in 0..2 {
            assert_eq!(l.admit(&lane("a", url)), Admit::Queued);
        }
        assert_eq!(l.admit(&lane("a", url)), Admit::ReceiverFull);
        assert_eq!(l.admit(&lane("b", url)), Admit::Queued, "b's lane at the same URL is its own");
        assert_eq!((l.pending(&lane("a", url)), l.pending(&lane("b", url)), l.total()), (2, 1, 3));
    }
}
