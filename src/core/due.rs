//! Reading the due index (`store::due`) fairly and cheaply, the pure rules: the entries a
//! pass takes on go in **tenant turns** (every tenant's oldest entry before any tenant's
//! second), so one tenant's thousand schedules due at once delay another tenant's fire by
//! one turn, not by a thousand; and the **floor** below which the leader knows nothing due
//! is left, so a read starts there instead of at its bucket's start and skips the
//! tombstones of the entries fired and dropped before it (a bucket of schedules firing
//! every second holds thousands by its minute's end).

use crate::model::Millis;
use std::collections::HashMap;

/// How far behind the leader's clock a writer's may be: an entry written with a due time
/// this long before the leader's last pass is still read (within [`GRACE_EVERY_MS`]).
pub const CLOCK_GRACE_MS: Millis = 10_000;

/// How far back an ordinary pass reads from its last pass's time. Reaching back the whole
/// [`CLOCK_GRACE_MS`] on every pass (4 a second) read the tombstones of ten seconds of
/// fired entries each time: 10,000 per read at 1,000 schedules a second.
pub const SHORT_GRACE_MS: Millis = 1_000;

/// How often a read reaches back [`CLOCK_GRACE_MS`] plus this (so an entry a late clock
/// wrote between two such reads is still covered).
pub const GRACE_EVERY_MS: Millis = 5_000;

/// The items in tenant turns: the first of each tenant (in order of its first
/// appearance), then the second of each, and so on; each tenant's items keep their order.
pub fn tenant_turns<T>(items: Vec<T>, tenant: impl Fn(&T) -> &str) -> Vec<T> {
    let mut queues: Vec<Vec<T>> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for item in items {
        let at = *index.entry(tenant(&item).to_owned()).or_insert_with(|| {
            queues.push(Vec::new());
            queues.len() - 1
        });
        queues[at].push(item);
    }
    let total = queues.iter().map(Vec::len).sum();
    let mut drains: Vec<_> = queues.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::with_capacity(total);
    while out.len() < total {
        out.extend(drains.iter_mut().filter_map(Iterator::next));
    }
    out
}

/// Where the next read of the due index starts: `None` reads every bucket from its
/// start (a new leader, or after an index row may have been written below the floor).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DueFloor {
    from: Option<Millis>,
    /// When the floor last reached back the whole clock grace.
    graced_at: Option<Millis>,
}

/// What a pass at `now` left behind: the oldest due time of an entry it read and left in
/// the index (held back, not matching its row yet), and, when its read stopped at its
/// limit, the due time of the last entry read (the unread ones are due no earlier).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PassLeft {
    pub now: Millis,
    pub oldest_left: Option<Millis>,
    pub read_stopped_at: Option<Millis>,
}

impl DueFloor {
    /// The lowest due time the next read must look at (`None`: from the start).
    pub fn from(&self) -> Option<Millis> {
        self.from
    }

    /// After a pass: nothing due below the oldest entry it left, the point its read
    /// stopped, or its `now` less [`SHORT_GRACE_MS`] remains unread; every
    /// [`GRACE_EVERY_MS`], less [`CLOCK_GRACE_MS`] + [`GRACE_EVERY_MS`] instead.
    pub fn passed(&mut self, left: PassLeft) {
        let full = self.graced_at.is_none_or(|at| left.now - at >= GRACE_EVERY_MS);
        let grace = if full { CLOCK_GRACE_MS + GRACE_EVERY_MS } else { SHORT_GRACE_MS };
        if full {
            self.graced_at = Some(left.now);
        }
        let floor = [left.oldest_left, left.read_stopped_at, Some(left.now - grace)]
            .into_iter()
            .flatten()
            .min()
            .expect("now is always there");
        self.from = Some(floor);
    }

    /// An index row may have been written below the floor (the leader's repair sweep):
    /// the next read starts from the beginning.
    pub fn reset(&mut self) {
        *self = DueFloor::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_tenants_thousand_entries_put_anothers_second() {
        let mut items: Vec<(String, u32)> = (0..1000).map(|i| ("acme".to_string(), i)).collect();
        items.push(("globex".into(), 0));
        let turns = tenant_turns(items, |i| &i.0);
        assert_eq!(turns[0], ("acme".into(), 0));
        assert_eq!(turns[1], ("globex".into(), 0));
        assert_eq!(turns[2], ("acme".into(), 1));
    }

    proptest! {
        #[test]
        fn turns_keep_every_item_and_each_tenants_order(
            items in proptest::collection::vec((0u8..6, any::<u16>()), 0..200)
        ) {
            let tagged: Vec<(String, usize, u16)> =
                items.iter().enumerate().map(|(i, (t, v))| (format!("t{t}"), i, *v)).collect();
            let turns = tenant_turns(tagged.clone(), |i| &i.0);
            let mut sorted = turns.clone();
            sorted.sort_by_key(|i| i.1);
            prop_assert_eq!(&sorted, &tagged, "a permutation");
            for t in 0..6 {
                let name = format!("t{t}");
                let before: Vec<_> = tagged.iter().filter(|i| i.0 == name).collect();
                let after: Vec<_> = turns.iter().filter(|i| i.0 == name).collect();
                prop_assert_eq!(before, after, "each tenant's order kept");
            }
            // The k-th item of any tenant comes before the (k+1)-th of every tenant.
            let mut seen: HashMap<&str, usize> = HashMap::new();
            let mut round_of = Vec::new();
            for i in &turns {
                let k = seen.entry(&i.0).or_default();
                round_of.push(*k);
                *k += 1;
            }
            prop_assert!(round_of.windows(2).all(|w| w[0] <= w[1]), "rounds never go back: {:?}", round_of);
        }

        #[test]
        fn floor_never_passes_what_is_left_or_unread(
            passes in proptest::collection::vec((0i64..100_000, proptest::option::of(0i64..100_000), proptest::option::of(0i64..100_000)), 1..30)
        ) {
            let mut floor = DueFloor::default();
            prop_assert_eq!(floor.from(), None, "a new leader reads everything");
            let mut now = 1_000_000;
            let mut graced: Option<Millis> = None;
            for (step, left, stopped) in passes {
                now += step;
                let left = PassLeft { now, oldest_left: left.map(|l| now - l), read_stopped_at: stopped.map(|s| now - s) };
                floor.passed(left);
                let f = floor.from().expect("set after a pass");
                prop_assert!(f <= now - SHORT_GRACE_MS, "the last moments are read again");
                if f <= now - CLOCK_GRACE_MS - GRACE_EVERY_MS {
                    graced = Some(now);
                }
                let g = graced.expect("the first pass reaches back the whole grace");
                prop_assert!(now - g < GRACE_EVERY_MS || g == now, "a writer's late clock is covered every {} ms", GRACE_EVERY_MS);
                for bound in [left.oldest_left, left.read_stopped_at].into_iter().flatten() {
                    prop_assert!(f <= bound, "floor {} above what was left at {}", f, bound);
                }
                let graces = [Some(now - SHORT_GRACE_MS), Some(now - CLOCK_GRACE_MS - GRACE_EVERY_MS)];
                let lowest_allowed = [left.oldest_left, left.read_stopped_at].into_iter().chain(graces).flatten().min();
                prop_assert!(f >= lowest_allowed.unwrap(), "no lower than it must be");
            }
            floor.reset();
            prop_assert_eq!(floor.from(), None);
        }
    }
}
