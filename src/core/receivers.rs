//! Webhook receivers' lanes, the pure accounting: each receiver (callback URL) has its
//! own queue of results waiting for or in delivery, bounded per receiver and in total.
//! A receiver that is down keeps its deliveries in backoff in its own lane; beyond its
//! bound its new results are given up at once (a `webhook_failed` event says so), so it
//! never holds the results of other receivers. Past the total bound the delivery loop
//! stops reading results until deliveries finish. Concurrency per receiver and in total
//! is the shell's (`watch::webhooks`), sized by the same settings.

use std::collections::HashMap;

/// The bounds of the lanes (`[webhooks]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneBounds {
    /// Results queued or in delivery per receiver (`webhooks.queue_per_receiver`).
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

/// Results queued or in delivery, per receiver and in total.
#[derive(Debug, Clone)]
pub struct Lanes {
    bounds: LaneBounds,
    pending: HashMap<String, usize>,
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

    /// A result for `receiver` was read.
    pub fn admit(&mut self, receiver: &str) -> Admit {
        let n = self.pending.entry(receiver.to_string()).or_default();
        if *n >= self.bounds.per_receiver {
            return Admit::ReceiverFull;
        }
        *n += 1;
        self.total += 1;
        Admit::Queued
    }

    /// A queued result's delivery ended (delivered, refused, out of attempts or stopped).
    pub fn done(&mut self, receiver: &str) {
        if let Some(n) = self.pending.get_mut(receiver) {
            *n = n.saturating_sub(1);
            self.total = self.total.saturating_sub(1);
            if *n == 0 {
                self.pending.remove(receiver);
            }
        }
    }

    /// Results queued or in delivery for `receiver`.
    pub fn pending(&self, receiver: &str) -> usize {
        self.pending.get(receiver).copied().unwrap_or(0)
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
        for _ in 0..3 {
            assert_eq!(l.admit("http://dead"), Admit::Queued);
        }
        assert_eq!(l.admit("http://dead"), Admit::ReceiverFull);
        assert_eq!(l.pending("http://dead"), 3);
        assert!(l.accepting(), "the dead receiver's lane is full, the loop is not");
        assert_eq!(l.admit("http://live"), Admit::Queued);
        assert_eq!(l.admit("http://live"), Admit::Queued);
        assert!(!l.accepting(), "the total bound stops reading");
        l.done("http://live");
        assert!(l.accepting());
        l.done("http://dead");
        assert_eq!(l.admit("http://dead"), Admit::Queued);
        assert_eq!(l.total(), 4);
        for _ in 0..3 {
            l.done("http://dead");
        }
        l.done("http://live");
        l.done("http://never-seen");
        assert_eq!((l.total(), l.pending("http://dead")), (0, 0));
    }
}
