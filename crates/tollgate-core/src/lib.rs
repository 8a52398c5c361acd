//! Pure rules of tollgate: limits, millitoken math, refill, the item model and write plans.
//!
//! Nothing here performs I/O, reads a clock or draws a random number: every function takes
//! the item image it read, the request, `now` and the configuration, and returns a decision
//! and a write plan.

pub mod aggregate;
pub mod audit;
pub mod bucket;
pub mod bypass;
pub mod calendar;
pub mod cascade;
pub mod error;
pub mod expr;
pub mod grant;
pub mod ids;
pub mod item;
pub mod json_text;
pub mod keys;
pub mod lease;
pub mod limit;
pub mod materialize;
pub mod merge;
pub mod multi;
pub mod mutants;
pub mod name;
pub mod plan;
pub mod refill;
pub mod reset;
pub mod schedule;
pub mod seeding;
pub mod soft;
pub mod spread;
pub mod status;
pub mod units;
pub mod usage;
pub mod value;
pub mod window;
pub mod writes;

#[cfg(test)]
pub(crate) mod test_rng;

pub use error::RuleError;
pub use limit::{Limit, LimitSpec, Refill, MILLI};
pub use status::LimitStatus;
