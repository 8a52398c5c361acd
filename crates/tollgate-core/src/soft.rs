//! Non-enforcing (soft) limits, ADR-151: the rules that decide which balance terms a write
//! carries and which limits may refuse.
//!
//! Rule "a soft limit records, never refuses": a soft limit's consumption is debited like
//! any other (`tk` may go negative, `tc` counts it) but no write is conditioned on its
//! balance and no refusal names it. The exemption belongs to the soft limit alone: every
//! enforced limit of the same request keeps its balance term. Conservation: a soft limit's
//! debits and refunds are the same `ADD`s as an enforced one's, so when it is enforced again
//! its balance is exactly what was consumed against it (debt included).

use crate::limit::Limit;
use crate::mutants::{self, Mutant};

/// Whether the balance of the limit named `name` is exempt from every admission check
/// (it is soft). A name the limits do not hold is not exempt.
pub fn exempt(limits: &[Limit], name: &str) -> bool {
    if mutants::off(Mutant::SoftScope) {
        // Mutant: one soft limit exempts the whole request.
        return limits.iter().any(Limit::is_soft);
    }
    limits.iter().any(|l| l.name() == name && l.is_soft())
}

/// Whether `limit` refuses `amount` (milli) against `balance` (milli): never when soft.
pub fn short(limits: &[Limit], name: &str, balance: i64, amount: i64) -> bool {
    balance < amount && !exempt(limits, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_soft_limit_is_exempt() {
        let l = vec![
            Limit::per_minute("rpm", 10).unwrap().with_soft(true),
            Limit::per_minute("tpm", 100).unwrap(),
        ];
        assert!(exempt(&l, "rpm"));
        assert!(!exempt(&l, "tpm"));
        assert!(!exempt(&l, "nope"));
        assert!(!short(&l, "rpm", 0, 3000));
        assert!(short(&l, "tpm", 0, 3000));
        assert!(!short(&l, "tpm", 3000, 3000));
    }
}
