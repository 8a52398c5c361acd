//! Who records an administrative change and how its record is named: principals (their
//! default and their check), the default retention of records, and [`AuditIds`] — the
//! ids of audit records, ULIDs increasing within one limiter. The records themselves are
//! the `audit` module's.

use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;
use tollgate_core::RuleError;

use crate::error::{Error, Result};

/// The principal of a limiter nobody named one for.
pub const DEFAULT_PRINCIPAL: &str = "library";
/// How long records are kept by default (90 days, as upstream).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(90 * 24 * 3600);
/// The longest principal name.
pub const MAX_PRINCIPAL_CHARS: usize = 256;
/// Check a principal name: 1 to [`MAX_PRINCIPAL_CHARS`] characters, no control characters.
pub fn validate_principal(p: &str) -> Result<()> {
    let n = p.chars().count();
    if n == 0 || n > MAX_PRINCIPAL_CHARS || p.chars().any(char::is_control) {
        return Err(Error::Invalid(RuleError::InvalidIdentifier {
            value: p.chars().take(64).collect(),
            reason: "a principal is 1 to 256 characters, none of them control characters",
        }));
    }
    Ok(())
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_increase_within_a_millisecond_and_across() {
        let g = AuditIds::new(7);
        let a = g.next(1_000);
        let b = g.next(1_000);
        let c = g.next(999); // a clock that stepped back keeps the order
        let d = g.next(2_000);
        assert!(a < b && b < c && c < d, "{a} {b} {c} {d}");
        assert_eq!(a.len(), 26);
        let t = |s: &str| ulid::Ulid::from_string(s).unwrap().timestamp_ms();
        assert_eq!((t(&a), t(&c), t(&d)), (1_000, 1_000, 2_000));
    }

    #[test]
    fn principals_are_checked() {
        assert!(validate_principal("alice").is_ok());
        assert!(validate_principal("").is_err());
        assert!(validate_principal("a\nb").is_err());
        assert!(validate_principal(&"x".repeat(257)).is_err());
    }
}
