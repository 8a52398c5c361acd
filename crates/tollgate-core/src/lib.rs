//! Pure rules of tollgate: limits, millitoken math, refill, the item model and write plans.
//!
//! Nothing here performs I/O, reads a clock or draws a random number: every function takes
//! the item image it read, the request, `now` and the configuration, and returns a decision
//! and a write plan.

pub mod expr;
pub mod value;
