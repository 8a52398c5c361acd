//! [`AuditIds`]: the ids of audit records, ULIDs increasing within one limiter.

use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// ULIDs from the limiter's clock and a seeded source: unique, and increasing within one
/// limiter even within one millisecond (the random part counts up, as the ULID spec's
/// monotonic generator does).
#[derive(Debug)]
pub(crate) struct AuditIds {
    state: Mutex<(StdRng, u64, u128)>,
}

impl AuditIds {
    pub(crate) fn new(seed: u64) -> Self {
        AuditIds {
            state: Mutex::new((StdRng::seed_from_u64(seed), 0, 0)),
        }
    }

    pub(crate) fn next(&self, now_ms: i64) -> String {
        const RANDOM_BITS: u128 = (1 << 80) - 1;
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (rng, last_ms, last_rand) = &mut *g;
        let ms = u64::try_from(now_ms).unwrap_or(0).max(*last_ms);
        let rand = if ms == *last_ms && *last_rand < RANDOM_BITS {
            *last_rand + 1
        } else {
            // Half the range: room to count up within a millisecond.
            rng.gen::<u128>() & (RANDOM_BITS >> 1)
        };
        debug_assert!(ms > *last_ms || rand > *last_rand, "ids increase");
        *last_ms = ms;
        *last_rand = rand;
        ulid::Ulid::from_parts(ms, rand).to_string()
    }
}
