//! A doubling wait: after the n-th failed try (1-based), `first * 2^(n-1)`, at most
//! `max`, for any n (no overflow). The one schedule behind webhook deliveries'
//! retries (`core::webhooks::Backoff`), a job taken in again after an outcome that was
//! not durable (`worker::pool`) and a start waiting for its database (`store::reach`).

use std::time::Duration;

/// The wait after failed try `tries` (1-based; 0 counts as 1).
pub fn doubling(first: Duration, max: Duration, tries: u32) -> Duration {
    let factor = 1u32.checked_shl(tries.saturating_sub(1)).unwrap_or(u32::MAX);
    first.saturating_mul(factor).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn doubles_from_the_first_wait_up_to_the_cap() {
        let ms = |t| doubling(Duration::from_millis(250), Duration::from_secs(5), t).as_millis();
        assert_eq!((0..=8).map(ms).collect::<Vec<_>>(), [250, 250, 500, 1000, 2000, 4000, 5000, 5000, 5000]);
        assert_eq!(ms(u32::MAX), 5000);
    }

    proptest! {
        /// Never above the cap, never below the first wait (when that is under the cap),
        /// and never shorter for a later try.
        #[test]
        fn capped_monotone_and_never_overflowing(first in 0u64..1_000_000, max in 0u64..10_000_000, t in 0u32..100) {
            let (f, m) = (Duration::from_millis(first), Duration::from_millis(max));
            let (a, b) = (doubling(f, m, t), doubling(f, m, t + 1));
            prop_assert!(a <= m && b <= m && a <= b);
            prop_assert!(a >= f.min(m));
        }
    }
}
