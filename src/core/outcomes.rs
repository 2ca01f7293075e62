//! Outcomes in flight: jobs whose handler returned (their slot is free) while their
//! outcome is still being recorded (the result produced and acknowledged, the state
//! written). Each holds its job and its result in memory until then, so a worker bounds
//! them by count and by bytes, and starts no job while either bound is reached: a slow
//! store then holds new work back instead of piling up outcomes.
//!
//! A job's bytes are its payload plus its output, known once its handler returns. A job
//! starts while the bytes held are below the budget, so at most the budget plus the
//! outcomes of the jobs running at that moment are held (each at most payload plus
//! output).
//!
//! Pure: the worker reports each outcome as it starts waiting and as it ends.

/// The bounds of one worker pool's outcomes in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutcomeBounds {
    /// Most outcomes waiting (or the pool's slots, if more).
    pub count: usize,
    /// Most bytes (payloads and outputs) they hold before no job starts.
    pub bytes: usize,
}

/// What one worker pool's outcomes in flight hold now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcomes {
    count: usize,
    bytes: usize,
}

impl Outcomes {
    /// Whether another job may start, with `slots` slots in the pool.
    pub fn admits(&self, bounds: OutcomeBounds, slots: usize) -> bool {
        self.count < slots.max(bounds.count) && self.bytes < bounds.bytes
    }

    /// A handler returned: its outcome of `bytes` starts waiting.
    pub fn waiting(&mut self, bytes: usize) {
        self.count += 1;
        self.bytes += bytes;
    }

    /// An outcome reported by [`Outcomes::waiting`] with `bytes` was recorded (or given up).
    pub fn ended(&mut self, bytes: usize) {
        self.count = self.count.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
    }

    pub fn count(&self) -> usize {
        self.count
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const B: OutcomeBounds = OutcomeBounds { count: 4, bytes: 1_000 };

    #[test]
    fn the_count_bound_holds_jobs_back() {
        let mut o = Outcomes::default();
        for _ in 0..4 {
            assert!(o.admits(B, 1));
            o.waiting(1);
        }
        assert!(!o.admits(B, 1), "4 outcomes waiting at a bound of 4");
        assert!(o.admits(B, 8), "a pool with more slots than the bound may fill its slots");
        o.ended(1);
        assert!(o.admits(B, 1));
    }

    #[test]
    fn the_byte_bound_holds_jobs_back_whatever_the_count() {
        let mut o = Outcomes::default();
        assert!(o.admits(B, 1));
        o.waiting(600);
        assert!(o.admits(B, 1), "600 of 1,000 bytes held");
        o.waiting(600);
        assert!(!o.admits(B, 100), "1,200 bytes held: no job starts, however many slots");
        o.ended(600);
        assert!(o.admits(B, 1));
        assert_eq!((o.count(), o.bytes()), (1, 600));
    }

    #[test]
    fn an_empty_pool_always_admits_one_job() {
        // Even a job larger than the whole budget runs (it was accepted at the front door).
        let o = Outcomes::default();
        assert!(o.admits(OutcomeBounds { count: 1, bytes: 1 }, 0));
    }

    proptest! {
        /// Whatever order outcomes end in, the held bytes and count return to zero, and
        /// never exceed the bound by more than the jobs admitted while under it.
        #[test]
        fn every_outcome_ending_frees_all(sizes in proptest::collection::vec(0usize..700, 1..40), seed in 0u64..1000) {
            let mut o = Outcomes::default();
            let mut waiting: Vec<usize> = Vec::new();
            for (i, s) in sizes.iter().enumerate() {
                if o.admits(B, 2) {
                    o.waiting(*s);
                    waiting.push(*s);
                    prop_assert!(o.bytes() < B.bytes + 700);
                } else if !waiting.is_empty() {
                    let k = (seed as usize + i) % waiting.len();
                    o.ended(waiting.swap_remove(k));
                }
            }
            for s in waiting.drain(..) {
                o.ended(s);
            }
            prop_assert_eq!((o.count(), o.bytes()), (0, 0));
        }
    }
}
