//! How often a `process` child's checkpoints reach the store. A child may write
//! `checkpoint` lines as fast as it likes; each would be a store write of up to
//! `worker.max_payload_bytes`. The latest state wins: at most one write per
//! `CHECKPOINT_EVERY` per job, the one held back written when its turn comes or when
//! the attempt ends.

use crate::model::Millis;

/// Least time between two checkpoint writes of one job.
pub const CHECKPOINT_EVERY: Millis = 1_000;

/// One job's checkpoint writes: when the last went out, and the state held back.
#[derive(Debug, Default)]
pub struct CheckpointPace {
    last_write: Option<Millis>,
    pending: Option<Vec<u8>>,
}

impl CheckpointPace {
    /// A new state from the child: the state to write now, or None (it is held back and
    /// replaces any state held before it).
    pub fn offer(&mut self, now: Millis, state: Vec<u8>) -> Option<Vec<u8>> {
        if self.last_write.is_some_and(|t| now - t < CHECKPOINT_EVERY) {
            self.pending = Some(state);
            return None;
        }
        self.pending = None;
        self.last_write = Some(now);
        Some(state)
    }

    /// The held-back state, once its turn has come.
    pub fn due(&mut self, now: Millis) -> Option<Vec<u8>> {
        if self.last_write.is_some_and(|t| now - t < CHECKPOINT_EVERY) {
            return None;
        }
        let state = self.pending.take()?;
        self.last_write = Some(now);
        Some(state)
    }

    /// The held-back state at the end of the attempt (written whatever the pace).
    pub fn flush(&mut self) -> Option<Vec<u8>> {
        self.pending.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_one_write_per_second_and_the_latest_state_wins() {
        let mut p = CheckpointPace::default();
        assert_eq!(p.offer(0, b"1".to_vec()), Some(b"1".to_vec()), "the first goes out at once");
        for i in 2..100u32 {
            assert_eq!(p.offer(i as i64, i.to_string().into_bytes()), None);
        }
        assert_eq!(p.due(999), None);
        assert_eq!(p.due(1_000), Some(b"99".to_vec()), "the latest held back");
        assert_eq!(p.due(5_000), None, "nothing left");
        assert_eq!(p.offer(1_500, b"x".to_vec()), None);
        assert_eq!(p.flush(), Some(b"x".to_vec()), "the attempt's end writes what is held");
        assert_eq!(p.offer(2_000, b"y".to_vec()), Some(b"y".to_vec()));
    }
}
