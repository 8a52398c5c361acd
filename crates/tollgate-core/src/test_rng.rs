//! The tests' pseudo-random numbers: one xorshift64 step (Marsaglia's 13, 7, 17), so a
//! seed gives the same sequence on every run and every test draws from one formula.

/// Advance `x` one step and return it (never 0 for a seed that is not 0).
pub(crate) fn step(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}
